/* tokenizer.h - the tokenizers of GGUF vocabularies, from their metadata.
 *
 * Two algorithms, by tokenizer.ggml.model:
 *
 * "gpt2": GPT-2 byte-level BPE. Reads tokenizer.ggml.{model,pre,tokens,
 * token_type,merges,bos_token_id,eos_token_id,add_bos_token}. Pre-tokenization
 * runs with PCRE2 (UTF + UCP), with llama.cpp's patterns (src/llama-vocab.cpp)
 * for each pre-tokenizer:
 *   "smollm"     every \p{N} is its own piece, then the GPT-2 pattern (SmolLM2);
 *   "gpt2"       the GPT-2 pattern alone;
 *   "qwen2"      Qwen2's pattern, every \p{N} its own piece (Qwen2, Qwen2.5, Qwen3);
 *   "llama-bpe"  Llama 3's pattern, digits in runs of up to three (Llama 3.x);
 *                also ignore_merges (a piece that is itself a token is that
 *                token, whatever the merges would make of it) and add_bos
 *                true unless the file says otherwise, as llama.cpp sets them.
 * Any other pre-tokenizer (or none) is refused with RD_ENOTSUP naming these.
 * Merges are applied lowest rank first, leftmost on ties.
 *
 * "llama": SentencePiece-style BPE by token score, llama.cpp's
 * llm_tokenizer_spm (Llama 2, Gemma 3). Reads tokenizer.ggml.{tokens,scores,
 * token_type,bos_token_id,eos_token_id,add_bos_token,add_space_prefix};
 * tokenizer.ggml.pre is ignored (llama.cpp gives SPM no pre-tokenizer). Each
 * stretch of text between special tokens gets a leading space when
 * add_space_prefix (default true; false in Gemma 3) and it opens the text or
 * follows a special token; every " " becomes U+2581; the UTF-8 characters are
 * merged pairwise, the pair whose concatenation is the token of highest score
 * first (leftmost on ties), as long as any pair is a token; a character left
 * that is no token is written as its bytes, <0xXX> (byte fallback). Without
 * the keys, llama.cpp's SPM defaults apply: bos 1, eos 2, add_bos true.
 *
 * Token types are the file's (tokenizer.ggml.token_type). llama.cpp's load
 * also marks tokens whose text is on its end-of-generation list as control;
 * in Gemma 3 that hits the user-defined "</s>" (212), which llama.cpp then
 * spells out without special parsing where we (as SentencePiece and Hugging
 * Face) take the token. */
#ifndef RD_TOKENIZER_H
#define RD_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#include "engine/format/gguf.h"

typedef struct tok_tokenizer tok_tokenizer;

/* The turn format a vocabulary's markers allow, fixed at load. */
typedef enum {
    TOK_CHAT_NONE = 0,    /* neither set of markers */
    TOK_CHAT_CHATML = 1,  /* <|im_start|>, <|im_end|>: Qwen2/2.5/3, SmolLM2 */
    TOK_CHAT_LLAMA3 = 2,  /* <|start_header_id|>, <|end_header_id|>, <|eot_id|>: Llama 3.x */
    TOK_CHAT_GEMMA = 3,   /* <start_of_turn>, <end_of_turn>: Gemma 2 and 3 */
} tok_chat_format;

int tok_load(const gguf_file *g, tok_tokenizer **out);
void tok_free(tok_tokenizer *t);

int32_t tok_vocab_size(const tok_tokenizer *t);
int32_t tok_bos(const tok_tokenizer *t);   /* -1 if none */
int32_t tok_eos(const tok_tokenizer *t);   /* tokenizer.ggml.eos_token_id; -1 if none */
/* tokenizer.ggml.add_bos_token; without the key, llama.cpp's default: 1 for
 * SPM ("llama") and the llama-bpe pre-tokenizer, else 0. */
int tok_add_bos(const tok_tokenizer *t);

/* Encodes len bytes of UTF-8 text. With parse_special, control tokens
 * written literally in the text ("<|im_start|>") become their ids; otherwise
 * they are tokenized as plain text. User-defined tokens (type 4) are matched
 * either way, as llama.cpp and Hugging Face do. No BOS is added.
 * Text that is not valid UTF-8 is RD_EINVAL, the message naming the byte
 * offset. In a gpt2 vocab a byte the vocabulary has no token for is dropped
 * (as llama.cpp does); in an SPM vocab a character with no token and no byte
 * token for one of its bytes is RD_EINVAL (llama.cpp throws). At most 64 MiB
 * per call. *ids is malloc'd (caller frees); it is
 * never NULL on success, even for 0 ids. Thread-safe. */
int tok_encode(const tok_tokenizer *t, const char *text, size_t len, int parse_special,
               int32_t **ids, size_t *n_ids);

/* A plain-text prompt as the model expects it: tok_encode with parse_special,
 * after the BOS when tok_add_bos says so (as llama.cpp and Hugging Face add
 * it), unless the text already starts with the BOS token's text. */
int tok_encode_prompt(const tok_tokenizer *t, const char *text, size_t len, int32_t **ids, size_t *n_ids);

/* Decodes ids to UTF-8 bytes: the concatenation of llama.cpp's
 * token_to_piece(special = true, lstrip = 0) of each id. gpt2: byte-level
 * pieces mapped back to raw bytes; SPM: U+2581 in a normal token becomes " ",
 * a byte token <0xXX> its byte. Control, user-defined and other special
 * tokens are rendered as their text (also unused ones, which llama.cpp
 * renders as nothing). Generated ids may end inside a UTF-8 sequence, and the
 * bytes are returned as they are. No clean-up of spaces (llama.cpp's
 * clean_spaces) and, with add_space_prefix, no removal of the leading space
 * the encoder added (llama.cpp's detokenize drops one): the bytes are exact,
 * so that the pieces of a stream of ids add up to the decode of all of them.
 * An id outside the vocabulary is RD_EINVAL. *text is malloc'd and
 * NUL-terminated. */
int tok_decode(const tok_tokenizer *t, const int32_t *ids, size_t n_ids, char **text, size_t *len);

/* The bytes tok_decode gives for one id (not NUL-terminated; *len of them),
 * or NULL for an id outside the vocabulary. Valid while t lives. */
const char *tok_token_bytes(const tok_tokenizer *t, int32_t id, size_t *len);

/* 1 if id is a control token (EOS, BOS, chat markers: what Hugging Face's
 * skip_special_tokens drops from decoded text), else 0. */
int tok_is_control(const tok_tokenizer *t, int32_t id);

/* The text of one token as stored in the vocabulary (byte-level form), or NULL. */
const char *tok_piece(const tok_tokenizer *t, int32_t id);

/* The chat format of the vocabulary, by the marker tokens it has: Llama 3
 * (<|start_header_id|>, <|end_header_id|> and <|eot_id|>), ChatML
 * (<|im_start|> and <|im_end|>), Gemma (<start_of_turn> and <end_of_turn>);
 * TOK_CHAT_NONE when it has no complete set. A vocabulary with more than one
 * set takes the one whose markers its tokenizer.chat_template uses, when it
 * uses those of exactly one of them; else the first in the order above. */
tok_chat_format tok_chat_kind(const tok_tokenizer *t);
const char *tok_chat_name(tok_chat_format f);   /* "chatml", "llama3", "gemma" or "none" */

/* The token that ends a turn in the chat format: <|eot_id|> (Llama 3),
 * <|im_end|> (ChatML) or <end_of_turn> (Gemma); -1 for TOK_CHAT_NONE. A
 * generation should stop at it as at tok_eos (the file's eos may be
 * <|end_of_text|> in a Llama 3 Instruct GGUF, <|endoftext|> in a Qwen one,
 * <eos> in Gemma's); for SmolLM2 they are the same token. */
int32_t tok_eot(const tok_tokenizer *t);

/* The prompt for an Instruct model in the vocabulary's chat format, one user
 * turn after an optional system turn (system NULL: no system turn), ending
 * with the assistant's turn opened:
 *   ChatML:  "<|im_start|>system\n{system}<|im_end|>\n<|im_start|>user\n{user}<|im_end|>\n"
 *            "<|im_start|>assistant\n"                 (bit for bit tok_chatml)
 *   Llama 3: "{bos}<|start_header_id|>system<|end_header_id|>\n\n{system}<|eot_id|>"
 *            "<|start_header_id|>user<|end_header_id|>\n\n{user}<|eot_id|>"
 *            "<|start_header_id|>assistant<|end_header_id|>\n\n"
 *            where {bos} is tok_bos (<|begin_of_text|>), omitted when the file
 *            names none. The BOS is part of the prompt: add no other.
 *   Gemma:   "{bos}<start_of_turn>user\n{system}\n\n{user}<end_of_turn>\n"
 *            "<start_of_turn>model\n"
 *            (Gemma has no system turn: Hugging Face's template puts the system
 *            message and "\n\n" at the start of the first user turn; without
 *            one, "{bos}<start_of_turn>user\n{user}<end_of_turn>\n..."). {bos}
 *            as for Llama 3.
 * No default system message is written and the contents are not trimmed.
 * The contents are never parsed for control tokens; otherwise the ids equal
 * tok_encode of the rendered text with parse_special. RD_ENOTSUP for
 * TOK_CHAT_NONE, naming the markers the vocabulary lacks. */
int tok_chat(const tok_tokenizer *t, const char *system, const char *user, int32_t **ids, size_t *n_ids);

/* One message of a conversation: role "system", "user" or "assistant". */
typedef struct {
    const char *role;
    const char *content;        /* UTF-8 */
} tok_chat_msg;

/* A whole conversation in the vocabulary's chat format (several turns, as
 * Hugging Face's templates render them), ending with the assistant's turn
 * opened. Each message is one turn, in order, as tok_chat writes its turns:
 *   ChatML:  "<|im_start|>{role}\n{content}<|im_end|>\n" each, any roles in any order;
 *   Llama 3: {bos}, then "<|start_header_id|>{role}<|end_header_id|>\n\n{content}<|eot_id|>" each;
 *   Gemma:   {bos}, then "<start_of_turn>{user|model}\n{content}<end_of_turn>\n" each, the
 *            assistant's role written "model"; a system message may only come first
 *            and opens the first user turn ("{system}\n\n{content}"); the turns after
 *            it alternate user / assistant from the user's (Hugging Face's Gemma 3
 *            template raises otherwise): RD_EINVAL naming the message.
 * No default system message (SmolLM2's template writes one when the first
 * message is not a system one), no trimming (Llama 3's and Gemma's templates
 * trim contents), contents never parsed for control tokens. RD_EINVAL for an
 * empty conversation or another role; RD_ENOTSUP as tok_chat. */
int tok_chat_msgs(const tok_tokenizer *t, const tok_chat_msg *msgs, size_t n, int32_t **ids, size_t *n_ids);

/* The ChatML prompt whatever tok_chat_kind says (see tok_chat); RD_ENOTSUP if
 * the vocab lacks <|im_start|> or <|im_end|>. Callers want tok_chat. */
int tok_chatml(const tok_tokenizer *t, const char *system, const char *user,
               int32_t **ids, size_t *n_ids);

#endif
