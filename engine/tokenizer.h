/* tokenizer.h - GPT-2 byte-level BPE from GGUF metadata.
 *
 * Reads tokenizer.ggml.{model,pre,tokens,token_type,merges,bos_token_id,
 * eos_token_id,...}. Pre-tokenization runs with PCRE2 (UTF + UCP): for the
 * "smollm" pre-tokenizer every digit is its own piece, then the GPT-2 split
 * pattern applies; "gpt2" applies the GPT-2 pattern alone; any other
 * pre-tokenizer (or none) is refused with RD_ENOTSUP. Merges are applied
 * lowest rank first, leftmost on ties. */
#ifndef RD_TOKENIZER_H
#define RD_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#include "gguf.h"

typedef struct tok_tokenizer tok_tokenizer;

int tok_load(const gguf_file *g, tok_tokenizer **out);
void tok_free(tok_tokenizer *t);

int32_t tok_vocab_size(const tok_tokenizer *t);
int32_t tok_bos(const tok_tokenizer *t);   /* -1 if none */
int32_t tok_eos(const tok_tokenizer *t);   /* -1 if none */
int tok_add_bos(const tok_tokenizer *t);   /* tokenizer.ggml.add_bos_token (default 0) */

/* Encodes len bytes of UTF-8 text. With parse_special, control tokens
 * written literally in the text ("<|im_start|>") become their ids; otherwise
 * they are tokenized as plain text. User-defined tokens (type 4) are matched
 * either way, as llama.cpp and Hugging Face do. No BOS is added.
 * Text that is not valid UTF-8 is RD_EINVAL, the message naming the byte
 * offset. A byte the vocabulary has no token for is dropped (as llama.cpp
 * does). At most 64 MiB per call. *ids is malloc'd (caller frees); it is
 * never NULL on success, even for 0 ids. Thread-safe. */
int tok_encode(const tok_tokenizer *t, const char *text, size_t len, int parse_special,
               int32_t **ids, size_t *n_ids);

/* Decodes ids to UTF-8 bytes (byte-level pieces mapped back to raw bytes;
 * control tokens rendered as their text; generated ids may end inside a UTF-8
 * sequence, and the bytes are returned as they are). An id outside the
 * vocabulary is RD_EINVAL. *text is malloc'd and NUL-terminated. */
int tok_decode(const tok_tokenizer *t, const int32_t *ids, size_t n_ids, char **text, size_t *len);

/* The text of one token as stored in the vocabulary (byte-level form), or NULL. */
const char *tok_piece(const tok_tokenizer *t, int32_t id);

/* ChatML prompt for an Instruct model:
 * "<|im_start|>system\n{system}<|im_end|>\n<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n"
 * system may be NULL (the system turn is then omitted). The contents are
 * never parsed for control tokens; otherwise the ids equal tok_encode of the
 * rendered text with parse_special. RD_ENOTSUP if the vocab lacks the markers. */
int tok_chatml(const tok_tokenizer *t, const char *system, const char *user,
               int32_t **ids, size_t *n_ids);

#endif
