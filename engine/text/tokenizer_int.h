/* tokenizer_int.h - what the tokenizer's files share (private to engine/text).
 *
 * chat_template.c  the turn formats (ChatML, Llama 3, Gemma) and tok_chat*
 * tokenizer.c   loading the vocabulary, special tokens and chat markers, the
 *               public tok_* API (encode dispatches each stretch of text to
 *               bpe.c or spm.c)
 * bpe.c         GPT-2 byte-level BPE: pre-tokenizers (PCRE2), merges
 * spm.c         SentencePiece-style BPE by token score
 * tok_base.c    what they all use: the vocabulary's lookup, the id list, the
 *               scratch space and merge heap
 * Top to bottom: each file calls only files listed below it (make layers
 * checks that no files call each other in a circle).
 *
 * The tokenizer is read-only after tok_load; each encode call has its own
 * tok_work scratch space. */
#ifndef RD_TOKENIZER_INT_H
#define RD_TOKENIZER_INT_H

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <stddef.h>
#include <stdint.h>

#include "engine/format/gguf.h"
#include "engine/text/tokenizer.h"

/* tokenizer.ggml.token_type values (llama.cpp's llama_token_type). */
enum {
    TOK_TYPE_NORMAL = 1,
    TOK_TYPE_UNKNOWN = 2,
    TOK_TYPE_CONTROL = 3,
    TOK_TYPE_USER = 4,
    TOK_TYPE_UNUSED = 5,
    TOK_TYPE_BYTE = 6,
};

/* A gpt2 pre-tokenizer (bpe.c's table), with what llama.cpp's
 * llama_vocab::load sets for it. */
typedef struct {
    const char *name;       /* tokenizer.ggml.pre */
    const char *isolate;    /* matches become pieces of their own before split runs; NULL = none */
    const char *split;      /* the split pattern */
    int ignore_merges;      /* a piece that is a token is emitted whole (llama.cpp ignore_merges) */
    int add_bos;            /* add_bos when the file has no tokenizer.ggml.add_bos_token */
} tok_pre;

struct tok_tokenizer {
    int32_t n_vocab;
    char *text;                 /* all token texts back to back, each NUL-terminated */
    uint32_t *text_off;         /* [n_vocab] offset of token i's text in text */
    uint32_t *text_len;         /* [n_vocab] bytes, without the NUL */
    uint8_t *type;              /* [n_vocab] token type (TOK_TYPE_NORMAL where the file has none) */
    uint8_t *raw;               /* decoded bytes of all tokens back to back */
    uint32_t *raw_off;          /* [n_vocab + 1] token i decodes to raw[raw_off[i] .. raw_off[i + 1]) */

    int32_t *vocab_slot;        /* [vocab_cap] open addressing on the text: token id, or -1 if empty */
    uint32_t vocab_cap;         /* power of two, at least twice n_vocab */

    uint64_t *merge_key;        /* [merge_cap] gpt2: (left id << 32 | right id), BPE_MERGE_EMPTY if empty */
    int32_t *merge_rank;        /* [merge_cap] index in tokenizer.ggml.merges (lower merges first) */
    int32_t *merge_out;         /* [merge_cap] id of the merged token */
    uint32_t merge_cap;         /* power of two */
    int32_t n_merges;           /* merges kept */
    int32_t n_merges_skipped;   /* merges naming a text that is not a token (they can never apply) */

    int32_t byte_tok[256];      /* gpt2: token of each raw byte's byte-level char; SPM: <0xXX>, else the
                                   byte itself as a token (llama.cpp's byte_to_token); -1 if none */

    int spm;                    /* tokenizer.ggml.model "llama": SentencePiece-style (else gpt2) */
    float *score;               /* [n_vocab] SPM: tokenizer.ggml.scores (0 where the file has none) */
    int add_space_prefix;       /* SPM: tokenizer.ggml.add_space_prefix, default 1 */

    int32_t *special;           /* [n_special] control, unknown and user-defined ids, longest text first */
    size_t n_special;

    int32_t bos, eos;           /* ids, -1 if the file names none */
    int32_t im_start, im_end;   /* ids of <|im_start|> and <|im_end|>, -1 if absent */
    int32_t start_header;       /* ids of Llama 3's <|start_header_id|>, */
    int32_t end_header;         /* <|end_header_id|> */
    int32_t eot_id;             /* and <|eot_id|>; -1 if absent */
    int32_t start_turn;         /* Gemma's <start_of_turn> */
    int32_t end_turn;           /* and <end_of_turn>; -1 if absent */
    tok_chat_format chat;       /* the turn format the markers allow (Llama 3 first) */
    int add_bos;                /* tokenizer.ggml.add_bos_token, else llama.cpp's default */
    const tok_pre *pre;         /* gpt2: the pre-tokenizer this vocab names; NULL for SPM */
    uint32_t max_text_len;      /* bytes of the longest token text (bounds whole-symbol lookups) */
    pcre2_code *re_isolate;     /* pre->isolate compiled; NULL when it has none */
    pcre2_code *re_split;       /* pre->split compiled */
};

static inline const char *tok_text(const tok_tokenizer *t, int32_t id) { return t->text + t->text_off[id]; }

/* tok_base.c: the vocabulary's lookup, the id list and the scratch space. */

/* Token id of the text s[0..n), or -1. */
int32_t tok_vocab_find(const tok_tokenizer *t, const char *s, size_t n);
/* Inserts id under its text (at load); returns the id already there if the text is taken, else -1. */
int32_t tok_vocab_insert(tok_tokenizer *t, int32_t id);
/* 1 when the GGUF string s is want. */
int tok_kv_equals(gguf_str s, const char *want);
/* The smallest power of two >= n, at least 16 (hash table sizes). */
uint32_t tok_pow2_at_least(uint64_t n);

/* The ids an encode call appends to. */
typedef struct {
    int32_t *v;
    size_t n, cap;
} tok_ids;

int tok_ids_push(tok_ids *o, int32_t id);
/* Hands the list to the caller: never NULL, even when empty. */
int tok_ids_finish(tok_ids *o, int32_t **ids, size_t *n_ids);

/* A candidate merge of symbol left with symbol right, its successor when
 * pushed. BPE and SPM both merge the best pair first: prio is -rank for BPE
 * (the lowest merge rank first) and the merged token's score for SPM (the
 * highest first); ties go to the leftmost pair. The pair is stale (skipped
 * when popped) once either symbol has changed: left_state and right_state are
 * what the two symbols were when it was pushed (BPE: their token ids; SPM:
 * their lengths in bytes). Both fit a double exactly (an int32 rank, a float
 * score), so the order is the one each algorithm defines. */
typedef struct {
    double prio;
    int32_t left, right;        /* symbol indices */
    int32_t left_state, right_state;
} tok_pair;

/* Scratch space of one encode call. */
typedef struct {
    pcre2_match_data *md;
    /* Symbols of the piece being merged (BPE: one per byte offset of the
     * piece; SPM: one per UTF-8 character of text), [sym_cap] each, all in
     * the one allocation sym. */
    int32_t *sym;
    int32_t *tok;       /* BPE: token id; -1 for a byte the vocab lacks; -2 once merged away */
    int32_t *next;      /* index of the next live symbol, -1 at the end */
    int32_t *prev;      /* index of the previous live symbol, -1 at the start */
    uint32_t *sym_off;  /* SPM: byte offset in text */
    uint32_t *sym_len;  /* SPM: bytes; 0 once merged into its predecessor */
    size_t sym_cap;
    tok_pair *heap;     /* max-heap on (prio, then lower left); grows as needed */
    size_t heap_n, heap_cap;
    char *text;         /* BPE: the piece in byte-level form, for the ignore_merges lookup;
                           SPM: the fragment with its spaces written U+2581 */
    size_t text_cap;
} tok_work;

int tok_work_init(tok_work *w);
void tok_work_free(tok_work *w);
/* Room for n symbols; the symbol arrays' contents are not kept. */
int tok_work_reserve(tok_work *w, size_t n);
/* Room for n bytes in text. */
int tok_work_text(tok_work *w, size_t n);
int tok_heap_push(tok_work *w, tok_pair p);
tok_pair tok_heap_pop(tok_work *w);   /* heap_n > 0 */

/* RD_EINVAL naming what and the byte offset unless s[0..len) is UTF-8. */
int tok_check_utf8(const char *what, const char *s, size_t len);

/* tokenizer.c: encodes already-validated UTF-8 text, appending to out:
 * special tokens cut out (control and unknown ones only with parse_special),
 * each stretch between them tokenized by the vocab's algorithm. */
int tok_encode_into(const tok_tokenizer *t, tok_work *w, const char *text, size_t len, int parse_special,
                    tok_ids *out);

/* bpe.c: GPT-2 byte-level BPE. */
int bpe_load_pre(tok_tokenizer *t, const gguf_file *g);     /* tokenizer.ggml.pre and its patterns */
int bpe_load_merges(tok_tokenizer *t, const gguf_file *g);  /* after the tokens */
void bpe_free(tok_tokenizer *t);
void bpe_byte_tokens(tok_tokenizer *t);
/* The raw bytes of a normal token's byte-level text s[0..n) into out (room
 * for n bytes): 1 and *out_len, or 0 when a char is outside the alphabet. */
int bpe_decode_text(const uint8_t *s, uint32_t n, uint8_t *out, uint32_t *out_len);
/* One stretch of text without special tokens: pre-tokenized, then BPE. */
int bpe_encode(const tok_tokenizer *t, tok_work *w, const char *s, size_t len, tok_ids *out);

/* spm.c: SentencePiece-style BPE. */
int spm_load_scores(tok_tokenizer *t, const gguf_file *g);
void spm_byte_tokens(tok_tokenizer *t);
/* A normal token's text with U+2581 as a space, into out (room for n bytes); returns the bytes. */
uint32_t spm_decode_text(const uint8_t *s, uint32_t n, uint8_t *out);
/* One stretch of text without special tokens; prefix: write a space first. */
int spm_encode(const tok_tokenizer *t, tok_work *w, const char *s, size_t len, int prefix, tok_ids *out);

#endif
