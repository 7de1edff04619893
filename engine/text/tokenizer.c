/* tokenizer.c - GPT-2 byte-level BPE and SentencePiece-style BPE from GGUF
 * metadata (see tokenizer.h).
 *
 * Encoding a gpt2 vocab runs in four stages, in data-flow order below:
 *   1. validate: the text must be UTF-8 (RFC 3629: no overlongs, surrogates or
 *      code points above U+10FFFF). Anything else is RD_EINVAL naming the byte
 *      offset: PCRE2 in UTF mode cannot match it, and the learner's tokenizer
 *      (Python str) could not have produced it either.
 *   2. special tokens: literal occurrences are cut out, longest token first, the
 *      same order llama.cpp uses; the text between them is tokenized alone.
 *   3. pre-tokenization with PCRE2, one pattern per pre-tokenizer (the table
 *      PRE below): "smollm" first cuts every \p{N} code point into its own
 *      piece, then the GPT-2 pattern splits each remaining piece; "gpt2"
 *      applies the GPT-2 pattern only; "qwen2" and "llama-bpe" apply their own
 *      patterns (llama.cpp's, from src/llama-vocab.cpp). Other names are refused.
 *   4. BPE: each byte of a piece starts as one symbol (its byte-level char);
 *      the adjacent pair with the lowest merge rank, leftmost on ties, merges
 *      until no pair has a rank. With ignore_merges ("llama-bpe") a piece
 *      whose byte-level text is itself a token is that token, merges or not.
 * An SPM vocab ("llama") shares stages 1 and 2 and then runs llama.cpp's
 * llm_tokenizer_spm on each stretch of text (spm_fragment): no pre-tokenizer,
 * no merge list; pairs of adjacent symbols merge by the score of the token
 * they make, found in the same hash table as every other text lookup.
 *
 * The character classes come from the PCRE2 library's Unicode tables. Against
 * llama.cpp's own tables (Debian's PCRE2 10.42 vs llama.cpp in 2025) they
 * differ only for scripts added in Unicode 15 and for U+180E, which PCRE2
 * still counts as whitespace.
 * The tokenizer is read-only after tok_load: encode and decode may run on many
 * threads at once (each call has its own scratch space). */
#include "engine/text/tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/err.h"

/* tokenizer.ggml.token_type values (llama.cpp's llama_token_type). */
enum {
    TYPE_NORMAL = 1,
    TYPE_UNKNOWN = 2,
    TYPE_CONTROL = 3,
    TYPE_USER = 4,
    TYPE_UNUSED = 5,
    TYPE_BYTE = 6,
};

/* The GPT-2 split pattern. The trailing \s+ catches a lone whitespace char
 * before a non-space, which llama.cpp's hand-written matcher also does. */
static const char SPLIT_GPT2[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";
static const char SPLIT_DIGIT[] = "\\p{N}";
/* Llama 3's pattern as llama.cpp writes it: the tokenizer.json original has
 * (?i:'s|'t|...), spelled out as [sS] pairs so that only ASCII letters fold
 * (a caseless 's' would also match U+017F, which llama.cpp's matcher does
 * not). Digits go in runs of at most three; a run of whitespace ending in a
 * newline is a piece of its own. */
static const char SPLIT_LLAMA3[] =
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}|"
    " ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
/* Qwen2's (also Qwen2.5 and Qwen3): Llama 3's with every digit its own piece. */
static const char SPLIT_QWEN2[] =
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}|"
    " ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

/* The pre-tokenizers accepted, with what llama.cpp's llama_vocab::load sets
 * for each (src/llama-vocab.cpp). Its clean_spaces flag (true for gpt2 and
 * llama-bpe) only tidies detokenized text; tok_decode returns the exact
 * bytes for every pre-tokenizer, as llama.cpp's token_to_piece does. */
typedef struct {
    const char *name;       /* tokenizer.ggml.pre */
    const char *isolate;    /* matches become pieces of their own before split runs; NULL = none */
    const char *split;      /* the split pattern */
    int ignore_merges;      /* a piece that is a token is emitted whole (llama.cpp ignore_merges) */
    int add_bos;            /* add_bos when the file has no tokenizer.ggml.add_bos_token */
} pre_kind;

static const pre_kind PRE[] = {
    {"smollm", SPLIT_DIGIT, SPLIT_GPT2, 0, 0},
    {"gpt2", NULL, SPLIT_GPT2, 0, 0},
    {"qwen2", NULL, SPLIT_QWEN2, 0, 0},
    {"llama-bpe", NULL, SPLIT_LLAMA3, 1, 1},
};
#define PRE_NAMES "\"smollm\", \"gpt2\", \"qwen2\" and \"llama-bpe\""

/* One call encodes at most this much. BPE scratch takes a few tens of bytes
 * per byte of the longest piece (a run of spaces can be one piece), so the cap
 * keeps a hostile input to a few GiB; prompts are far smaller. */
#define TOK_MAX_TEXT ((size_t)64 << 20)

struct tok_tokenizer {
    int32_t n_vocab;
    char *text;                 /* all token texts back to back, each NUL-terminated */
    uint32_t *text_off;         /* [n_vocab] offset of token i's text in text */
    uint32_t *text_len;         /* [n_vocab] bytes, without the NUL */
    uint8_t *type;              /* [n_vocab] token type (TYPE_NORMAL where the file has none) */
    uint8_t *raw;               /* decoded bytes of all tokens back to back */
    uint32_t *raw_off;          /* [n_vocab + 1] token i decodes to raw[raw_off[i] .. raw_off[i + 1]) */

    int32_t *vocab_slot;        /* [vocab_cap] open addressing on the text: token id, or -1 if empty */
    uint32_t vocab_cap;         /* power of two, at least twice n_vocab */

    uint64_t *merge_key;        /* [merge_cap] (left id << 32 | right id), MERGE_EMPTY if empty */
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
    const pre_kind *pre;        /* gpt2: the entry of PRE this vocab names; NULL for SPM */
    uint32_t max_text_len;      /* bytes of the longest token text (bounds the ignore_merges lookup) */
    pcre2_code *re_isolate;     /* pre->isolate compiled; NULL when it has none */
    pcre2_code *re_split;       /* pre->split compiled */
};

#define MERGE_EMPTY UINT64_MAX

/* ------------------------------------------------------------------------
 * UTF-8 and the GPT-2 byte-level alphabet. */

/* Length of the valid UTF-8 sequence at s[0..n), or 0 if it is not one. */
static size_t utf8_seq(const uint8_t *s, size_t n)
{
    uint8_t c = s[0];
    if (c < 0x80)
        return 1;
    if (c >= 0xC2 && c <= 0xDF)
        return n >= 2 && (s[1] & 0xC0) == 0x80 ? 2 : 0;
    if (c >= 0xE0 && c <= 0xEF) {
        /* E0 needs A0.. (no overlongs); ED stops at 9F (no surrogates). */
        uint8_t lo = c == 0xE0 ? 0xA0 : 0x80, hi = c == 0xED ? 0x9F : 0xBF;
        return n >= 3 && s[1] >= lo && s[1] <= hi && (s[2] & 0xC0) == 0x80 ? 3 : 0;
    }
    if (c >= 0xF0 && c <= 0xF4) {
        /* F0 needs 90.. (no overlongs); F4 stops at 8F (nothing above U+10FFFF). */
        uint8_t lo = c == 0xF0 ? 0x90 : 0x80, hi = c == 0xF4 ? 0x8F : 0xBF;
        return n >= 4 && s[1] >= lo && s[1] <= hi && (s[2] & 0xC0) == 0x80 && (s[3] & 0xC0) == 0x80 ? 4 : 0;
    }
    return 0;
}

/* Offset of the first byte that does not start a valid UTF-8 sequence, or n. */
static size_t utf8_invalid_at(const uint8_t *s, size_t n)
{
    size_t i = 0;
    while (i < n) {
        if (s[i] < 0x80) {
            i++;
            continue;
        }
        size_t k = utf8_seq(s + i, n - i);
        if (k == 0)
            return i;
        i += k;
    }
    return n;
}

/* GPT-2's bytes_to_unicode: printable Latin-1 bytes stand for themselves; the
 * other 68 bytes (0x00-0x20, 0x7F-0xA0, 0xAD) take code points 256, 257, ...
 * in byte order, so a space becomes U+0120. */
static uint32_t byte_to_cp(int b)
{
    if (b <= 0x20)
        return 256 + (uint32_t)b;
    if (b >= 0x7F && b <= 0xA0)
        return 256 + 33 + (uint32_t)(b - 0x7F);
    if (b == 0xAD)
        return 256 + 67;
    return (uint32_t)b;
}

/* The inverse of byte_to_cp: the byte a code point stands for, or -1. */
static int cp_to_byte(uint32_t cp)
{
    if (cp < 256)
        return cp <= 0x20 || (cp >= 0x7F && cp <= 0xA0) || cp == 0xAD ? -1 : (int)cp;
    if (cp < 256 + 33)
        return (int)(cp - 256);
    if (cp < 256 + 67)
        return 0x7F + (int)(cp - 256 - 33);
    return cp == 256 + 67 ? 0xAD : -1;
}

static size_t utf8_put(uint32_t cp, char *out)
{
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    /* The byte-level alphabet stops at U+0143, so two bytes are enough here. */
    out[0] = (char)(0xC0 | (cp >> 6));
    out[1] = (char)(0x80 | (cp & 0x3F));
    return 2;
}

/* ------------------------------------------------------------------------
 * Hash tables: token text -> id, and (left id, right id) -> merge. */

static uint64_t hash_bytes(const char *s, size_t n)
{
    uint64_t h = 0xcbf29ce484222325ull; /* FNV-1a */
    for (size_t i = 0; i < n; i++) {
        h ^= (uint8_t)s[i];
        h *= 0x100000001b3ull;
    }
    return h ^ (h >> 29);
}

static uint64_t hash_u64(uint64_t x)
{
    x ^= x >> 33; /* murmur3 finalizer: the ids' low bits alone cluster badly */
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    x ^= x >> 33;
    return x;
}

static uint32_t pow2_at_least(uint64_t n)
{
    uint32_t c = 16;
    while (c < n)
        c <<= 1;
    return c;
}

static const char *tok_text(const tok_tokenizer *t, int32_t id) { return t->text + t->text_off[id]; }

/* Token id of the text s[0..n), or -1. */
static int32_t vocab_find(const tok_tokenizer *t, const char *s, size_t n)
{
    uint32_t mask = t->vocab_cap - 1;
    for (uint32_t i = (uint32_t)hash_bytes(s, n) & mask;; i = (i + 1) & mask) {
        int32_t id = t->vocab_slot[i];
        if (id < 0)
            return -1;
        if (t->text_len[id] == n && memcmp(tok_text(t, id), s, n) == 0)
            return id;
    }
}

/* Inserts id under its text; returns the id already there if the text is taken. */
static int32_t vocab_insert(tok_tokenizer *t, int32_t id)
{
    uint32_t mask = t->vocab_cap - 1;
    const char *s = tok_text(t, id);
    size_t n = t->text_len[id];
    for (uint32_t i = (uint32_t)hash_bytes(s, n) & mask;; i = (i + 1) & mask) {
        int32_t other = t->vocab_slot[i];
        if (other < 0) {
            t->vocab_slot[i] = id;
            return -1;
        }
        if (t->text_len[other] == n && memcmp(tok_text(t, other), s, n) == 0)
            return other;
    }
}

/* Rank and result of merging tokens a and b; 0 if they do not merge. */
static int merge_find(const tok_tokenizer *t, int32_t a, int32_t b, int32_t *rank, int32_t *out)
{
    uint64_t key = (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
    uint32_t mask = t->merge_cap - 1;
    for (uint32_t i = (uint32_t)hash_u64(key) & mask;; i = (i + 1) & mask) {
        if (t->merge_key[i] == MERGE_EMPTY)
            return 0;
        if (t->merge_key[i] == key) {
            *rank = t->merge_rank[i];
            *out = t->merge_out[i];
            return 1;
        }
    }
}

/* Adds a merge unless the pair already has one (the earlier, lower rank wins). */
static void merge_insert(tok_tokenizer *t, int32_t a, int32_t b, int32_t rank, int32_t out)
{
    uint64_t key = (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
    uint32_t mask = t->merge_cap - 1;
    for (uint32_t i = (uint32_t)hash_u64(key) & mask;; i = (i + 1) & mask) {
        if (t->merge_key[i] == key)
            return;
        if (t->merge_key[i] == MERGE_EMPTY) {
            t->merge_key[i] = key;
            t->merge_rank[i] = rank;
            t->merge_out[i] = out;
            t->n_merges++;
            return;
        }
    }
}

/* ------------------------------------------------------------------------
 * Loading. */

static int kv_equals(gguf_str s, const char *want)
{
    size_t n = strlen(want);
    return s.len == n && memcmp(s.ptr, want, n) == 0;
}

static pcre2_code *compile_pattern(const char *pattern, int *err, PCRE2_SIZE *err_at)
{
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)pattern, PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP, err, err_at,
                                   NULL);
    /* JIT is an optional speed-up: pcre2_match uses the interpreter without it. */
    if (re)
        pcre2_jit_compile(re, PCRE2_JIT_COMPLETE);
    return re;
}

/* Model and pre-tokenizer names: only the ones whose behaviour is checked
 * against llama.cpp are accepted, so an unknown vocab fails loudly instead of
 * silently tokenizing differently from the model's training. */
static int load_kind(tok_tokenizer *t, const gguf_file *g)
{
    gguf_str model, pre;
    int rc = gguf_get_str(g, "tokenizer.ggml.model", &model);
    if (rc == RD_ENOENT)
        return rd_fail(RD_ENOTSUP, "tokenizer: the file has no tokenizer.ggml.model; expected \"gpt2\" or \"llama\"");
    if (rc)
        return rc;
    if (kv_equals(model, "llama")) {
        /* SentencePiece-style: llama.cpp gives it no pre-tokenizer and reads
         * no tokenizer.ggml.pre (Gemma 3 files say "default"). */
        t->spm = 1;
        return 0;
    }
    if (!kv_equals(model, "gpt2"))
        return rd_fail(RD_ENOTSUP,
                       "tokenizer: tokenizer.ggml.model is \"%.*s\"; supported are \"gpt2\" (byte-level BPE) and "
                       "\"llama\" (SentencePiece-style BPE)",
                       (int)(model.len > 64 ? 64 : model.len), model.ptr);

    rc = gguf_get_str(g, "tokenizer.ggml.pre", &pre);
    if (rc == RD_ENOENT)
        return rd_fail(RD_ENOTSUP, "tokenizer: the file has no tokenizer.ggml.pre; supported pre-tokenizers are "
                                   PRE_NAMES " (regenerate the GGUF with a current converter)");
    if (rc)
        return rc;
    for (size_t i = 0; i < sizeof PRE / sizeof PRE[0] && !t->pre; i++)
        if (kv_equals(pre, PRE[i].name))
            t->pre = &PRE[i];
    if (!t->pre)
        return rd_fail(RD_ENOTSUP, "tokenizer: pre-tokenizer \"%.*s\" is not supported; supported are " PRE_NAMES,
                       (int)(pre.len > 64 ? 64 : pre.len), pre.ptr);

    int err = 0;
    PCRE2_SIZE err_at = 0;
    t->re_split = compile_pattern(t->pre->split, &err, &err_at);
    if (t->re_split && t->pre->isolate)
        t->re_isolate = compile_pattern(t->pre->isolate, &err, &err_at);
    if (!t->re_split || (t->pre->isolate && !t->re_isolate)) {
        char msg[128];
        pcre2_get_error_message(err, (PCRE2_UCHAR *)msg, sizeof msg);
        return rd_fail(RD_ENOTSUP, "tokenizer: PCRE2 cannot compile the %s split pattern (%s at %zu); "
                                   "it needs Unicode support", t->pre->name, msg, (size_t)err_at);
    }
    return 0;
}

static int load_tokens(tok_tokenizer *t, const gguf_file *g)
{
    const gguf_kv *kv = gguf_find_kv(g, "tokenizer.ggml.tokens");
    if (!kv)
        return rd_fail(RD_EFORMAT, "tokenizer: the file has no tokenizer.ggml.tokens");
    if (kv->type != GGUF_ARRAY || kv->arr_type != GGUF_STRING || !kv->arr_str)
        return rd_fail(RD_EFORMAT, "tokenizer: tokenizer.ggml.tokens must be an array of strings");
    if (kv->arr_n == 0 || kv->arr_n > INT32_MAX / 2)
        return rd_fail(RD_EFORMAT, "tokenizer: tokenizer.ggml.tokens has %llu entries, expected 1..%d",
                       (unsigned long long)kv->arr_n, INT32_MAX / 2);
    int32_t n = (int32_t)kv->arr_n;
    t->n_vocab = n;

    uint64_t total = 0;
    for (int32_t i = 0; i < n; i++)
        total += kv->arr_str[i].len + 1;
    if (total > UINT32_MAX)
        return rd_fail(RD_EFORMAT, "tokenizer: the token texts take %llu bytes, more than 4 GiB",
                       (unsigned long long)total);

    t->text = malloc(total);
    t->text_off = malloc(sizeof(uint32_t) * n);
    t->text_len = malloc(sizeof(uint32_t) * n);
    t->type = malloc(n);
    t->vocab_cap = pow2_at_least(2 * (uint64_t)n);
    t->vocab_slot = malloc(sizeof(int32_t) * t->vocab_cap);
    if (!t->text || !t->text_off || !t->text_len || !t->type || !t->vocab_slot)
        return rd_fail(RD_ENOMEM, "tokenizer: out of memory for %d tokens", n);
    memset(t->vocab_slot, 0xff, sizeof(int32_t) * t->vocab_cap);

    /* Copies, so the tokenizer outlives the mapping of the GGUF file. */
    uint32_t at = 0;
    for (int32_t i = 0; i < n; i++) {
        gguf_str s = kv->arr_str[i];
        t->text_off[i] = at;
        t->text_len[i] = (uint32_t)s.len;
        if (t->text_len[i] > t->max_text_len)
            t->max_text_len = t->text_len[i];
        memcpy(t->text + at, s.ptr, s.len);
        t->text[at + s.len] = 0;
        at += (uint32_t)s.len + 1;
        int32_t other = vocab_insert(t, i);
        if (other >= 0)
            return rd_fail(RD_EFORMAT, "tokenizer: token %d has the same text as token %d (\"%.*s\")", i, other,
                           (int)(s.len > 64 ? 64 : s.len), s.ptr);
    }

    const gguf_kv *types = gguf_find_kv(g, "tokenizer.ggml.token_type");
    if (!types) {
        memset(t->type, TYPE_NORMAL, n);
        return 0;
    }
    if (types->type != GGUF_ARRAY || types->arr_n != (uint64_t)n)
        return rd_fail(RD_EFORMAT, "tokenizer: tokenizer.ggml.token_type must be an array of %d integers", n);
    for (int32_t i = 0; i < n; i++) {
        int64_t v;
        if (types->arr_type == GGUF_INT32) {
            /* The usual element type, read in place: gguf_arr_i64 formats an
             * error context on every call, a quarter of the load time of a
             * 262,144-token vocabulary. */
            int32_t x;
            memcpy(&x, types->val + 4 * (size_t)i, 4);
            v = x;
        } else {
            int rc = gguf_arr_i64(types, i, &v);
            if (rc)
                return rc;
        }
        if (v < TYPE_NORMAL || v > TYPE_BYTE)
            return rd_fail(RD_EFORMAT, "tokenizer: token %d has type %lld, expected 1..6", i, (long long)v);
        t->type[i] = (uint8_t)v;
    }
    return 0;
}

static int load_merges(tok_tokenizer *t, const gguf_file *g)
{
    const gguf_kv *kv = gguf_find_kv(g, "tokenizer.ggml.merges");
    if (!kv)
        return rd_fail(RD_EFORMAT, "tokenizer: the file has no tokenizer.ggml.merges (a gpt2 vocab needs them)");
    if (kv->type != GGUF_ARRAY || kv->arr_type != GGUF_STRING || (!kv->arr_str && kv->arr_n > 0))
        return rd_fail(RD_EFORMAT, "tokenizer: tokenizer.ggml.merges must be an array of strings");
    if (kv->arr_n > INT32_MAX / 2)
        return rd_fail(RD_EFORMAT, "tokenizer: %llu merges, expected at most %d", (unsigned long long)kv->arr_n,
                       INT32_MAX / 2);

    t->merge_cap = pow2_at_least(2 * kv->arr_n);
    t->merge_key = malloc(sizeof(uint64_t) * t->merge_cap);
    t->merge_rank = malloc(sizeof(int32_t) * t->merge_cap);
    t->merge_out = malloc(sizeof(int32_t) * t->merge_cap);
    if (!t->merge_key || !t->merge_rank || !t->merge_out)
        return rd_fail(RD_ENOMEM, "tokenizer: out of memory for %llu merges", (unsigned long long)kv->arr_n);
    memset(t->merge_key, 0xff, sizeof(uint64_t) * t->merge_cap);

    char *joined = NULL;
    size_t joined_cap = 0;
    for (uint64_t i = 0; i < kv->arr_n; i++) {
        gguf_str m = kv->arr_str[i];
        /* "left right": the parts are byte-level text, where a real space is
         * written U+0120, so the first space after position 0 separates them. */
        const char *sp = m.len > 1 ? memchr(m.ptr + 1, ' ', m.len - 1) : NULL;
        if (!sp) {
            free(joined);
            return rd_fail(RD_EFORMAT, "tokenizer: merge %llu (\"%.*s\") has no space between its two parts",
                           (unsigned long long)i, (int)(m.len > 64 ? 64 : m.len), m.ptr);
        }
        size_t nl = (size_t)(sp - m.ptr), nr = m.len - nl - 1;
        if (nl + nr > joined_cap) {
            joined_cap = 2 * (nl + nr);
            char *p = realloc(joined, joined_cap);
            if (!p) {
                free(joined);
                return rd_fail(RD_ENOMEM, "tokenizer: out of memory reading merges");
            }
            joined = p;
        }
        memcpy(joined, m.ptr, nl);
        memcpy(joined + nl, sp + 1, nr);
        int32_t a = vocab_find(t, m.ptr, nl), b = vocab_find(t, sp + 1, nr), ab = vocab_find(t, joined, nl + nr);
        /* Hugging Face refuses such a merge at load time, so it never applies. */
        if (a < 0 || b < 0 || ab < 0) {
            t->n_merges_skipped++;
            continue;
        }
        merge_insert(t, a, b, (int32_t)i, ab);
    }
    free(joined);
    return 0;
}

/* SPM: the score of each token (tokenizer.ggml.scores, float32 or int32 as
 * llama.cpp accepts); every score 0 when the file has none. */
static int load_scores(tok_tokenizer *t, const gguf_file *g)
{
    t->score = calloc((size_t)t->n_vocab, sizeof(float));
    if (!t->score)
        return rd_fail(RD_ENOMEM, "tokenizer: out of memory for %d scores", t->n_vocab);
    const gguf_kv *kv = gguf_find_kv(g, "tokenizer.ggml.scores");
    if (!kv)
        return 0;
    if (kv->type != GGUF_ARRAY || (kv->arr_type != GGUF_FLOAT32 && kv->arr_type != GGUF_INT32))
        return rd_fail(RD_EFORMAT, "tokenizer: tokenizer.ggml.scores must be an array of float32 (or int32)");
    if (kv->arr_n < (uint64_t)t->n_vocab)
        return rd_fail(RD_EFORMAT, "tokenizer: tokenizer.ggml.scores has %llu entries for %d tokens",
                       (unsigned long long)kv->arr_n, t->n_vocab);
    /* The array's bytes are in the mapping, little-endian and maybe unaligned. */
    for (int32_t i = 0; i < t->n_vocab; i++) {
        if (kv->arr_type == GGUF_FLOAT32) {
            memcpy(&t->score[i], kv->val + 4 * (size_t)i, 4);
        } else {
            int32_t v;
            memcpy(&v, kv->val + 4 * (size_t)i, 4);
            t->score[i] = (float)v;
        }
    }
    return 0;
}

static int hex_digit(uint8_t c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    return -1;
}

/* The bytes each token decodes to. gpt2: byte-level text mapped back to raw
 * bytes; SPM: U+2581 in a normal token is a space (llama.cpp's
 * llama_unescape_whitespace). Both: <0xXX> byte tokens as their byte; control,
 * user-defined and other special tokens as their literal text. */
static int load_decode_table(tok_tokenizer *t)
{
    uint64_t total = 0;
    for (int32_t i = 0; i < t->n_vocab; i++)
        total += t->text_len[i];
    /* Decoded bytes are never longer than the text (each char is 1-2 bytes -> 1 byte). */
    t->raw = malloc(total ? total : 1);
    t->raw_off = malloc(sizeof(uint32_t) * ((size_t)t->n_vocab + 1));
    if (!t->raw || !t->raw_off)
        return rd_fail(RD_ENOMEM, "tokenizer: out of memory for the decode table");

    uint32_t at = 0;
    for (int32_t i = 0; i < t->n_vocab; i++) {
        const uint8_t *s = (const uint8_t *)tok_text(t, i);
        uint32_t n = t->text_len[i];
        t->raw_off[i] = at;
        int literal = 1;
        if (t->spm && t->type[i] == TYPE_NORMAL) {
            /* U+2581 is three bytes, a space one: never longer than the text. */
            for (uint32_t k = 0; k < n;) {
                if (k + 3 <= n && s[k] == 0xE2 && s[k + 1] == 0x96 && s[k + 2] == 0x81) {
                    t->raw[at++] = ' ';
                    k += 3;
                } else {
                    t->raw[at++] = s[k++];
                }
            }
            literal = 0;
        } else if (t->type[i] == TYPE_NORMAL) {
            /* Byte-level when every char is in the alphabet; else kept as is. */
            uint32_t k = 0, o = at;
            while (k < n) {
                size_t len = utf8_seq(s + k, n - k);
                if (len == 0 || len > 2)
                    break;
                uint32_t cp = len == 1 ? s[k] : (uint32_t)(s[k] & 0x1F) << 6 | (s[k + 1] & 0x3F);
                int b = cp_to_byte(cp);
                if (b < 0)
                    break;
                t->raw[o++] = (uint8_t)b;
                k += (uint32_t)len;
            }
            if (k == n) {
                at = o;
                literal = 0;
            }
        } else if (t->type[i] == TYPE_BYTE && n == 6 && memcmp(s, "<0x", 3) == 0 && s[5] == '>') {
            int hi = hex_digit(s[3]), lo = hex_digit(s[4]);
            if (hi >= 0 && lo >= 0) {
                t->raw[at++] = (uint8_t)(hi << 4 | lo);
                literal = 0;
            }
        }
        if (literal) {
            memcpy(t->raw + at, s, n);
            at += n;
        }
    }
    t->raw_off[t->n_vocab] = at;
    return 0;
}

typedef struct {
    uint32_t len;
    int32_t id;
} special_entry;

static int special_cmp(const void *pa, const void *pb)
{
    const special_entry *a = pa, *b = pb;
    if (a->len != b->len)
        return a->len > b->len ? -1 : 1;
    return (a->id > b->id) - (a->id < b->id);
}

/* Tokens that are matched literally before pre-tokenization. A text that is
 * not UTF-8 is left out: matching it could cut a character in two. */
static int load_specials(tok_tokenizer *t)
{
    special_entry *e = malloc(sizeof(special_entry) * t->n_vocab);
    if (!e)
        return rd_fail(RD_ENOMEM, "tokenizer: out of memory for the special tokens");
    size_t n = 0;
    for (int32_t i = 0; i < t->n_vocab; i++) {
        uint8_t ty = t->type[i];
        uint32_t len = t->text_len[i];
        if ((ty == TYPE_CONTROL || ty == TYPE_USER || ty == TYPE_UNKNOWN) && len > 0 &&
            utf8_invalid_at((const uint8_t *)tok_text(t, i), len) == len)
            e[n++] = (special_entry){len, i};
    }
    qsort(e, n, sizeof *e, special_cmp);
    t->special = malloc(sizeof(int32_t) * (n ? n : 1));
    if (!t->special) {
        free(e);
        return rd_fail(RD_ENOMEM, "tokenizer: out of memory for the special tokens");
    }
    for (size_t i = 0; i < n; i++)
        t->special[i] = e[i].id;
    t->n_special = n;
    free(e);
    return 0;
}

/* An optional token id key: dflt when absent (-1, or llama.cpp's default
 * where it has one and the vocabulary is large enough), an error when out of
 * range. */
static int load_id(const gguf_file *g, const char *key, int32_t n_vocab, int32_t dflt, int32_t *out)
{
    uint32_t v;
    int rc = gguf_get_u32(g, key, &v);
    if (rc == RD_ENOENT) {
        *out = dflt < n_vocab ? dflt : -1;
        return 0;
    }
    if (rc)
        return rc;
    if (v >= (uint32_t)n_vocab)
        return rd_fail(RD_EFORMAT, "tokenizer: %s = %u, outside the vocabulary of %d tokens", key, v, n_vocab);
    *out = (int32_t)v;
    return 0;
}

/* The turn format from the vocabulary's markers: each format whose markers
 * are all there is a candidate, Llama 3 first, then ChatML, then Gemma. More
 * than one appear in fine-tunes that added ChatML to a Llama 3 vocabulary
 * (Hermes 2 Pro); there the file's own tokenizer.chat_template decides, when
 * it uses the opening marker of exactly one candidate. */
static tok_chat_format chat_format(const tok_tokenizer *t, const gguf_file *g)
{
    static const struct {
        tok_chat_format f;
        const char *marker; /* looked for in the template */
    } order[] = {
        {TOK_CHAT_LLAMA3, "<|start_header_id|>"},
        {TOK_CHAT_CHATML, "<|im_start|>"},
        {TOK_CHAT_GEMMA, "<start_of_turn>"},
    };
    int has[3] = {
        t->start_header >= 0 && t->end_header >= 0 && t->eot_id >= 0,
        t->im_start >= 0 && t->im_end >= 0,
        t->start_turn >= 0 && t->end_turn >= 0,
    };
    int n_has = has[0] + has[1] + has[2], first = -1, used = -1, n_used = 0;
    gguf_str tmpl;
    int have_tmpl = n_has > 1 && gguf_get_str(g, "tokenizer.chat_template", &tmpl) == 0;
    for (int i = 0; i < 3; i++) {
        if (!has[i])
            continue;
        if (first < 0)
            first = i;
        if (have_tmpl && memmem(tmpl.ptr, tmpl.len, order[i].marker, strlen(order[i].marker))) {
            used = i;
            n_used++;
        }
    }
    if (first < 0)
        return TOK_CHAT_NONE;
    return order[n_used == 1 ? used : first].f;
}

int tok_load(const gguf_file *g, tok_tokenizer **out)
{
    if (!out)
        return rd_fail(RD_EINVAL, "tok_load: out is NULL");
    *out = NULL;
    if (!g)
        return rd_fail(RD_EINVAL, "tok_load: the GGUF file is NULL");
    tok_tokenizer *t = calloc(1, sizeof *t);
    if (!t)
        return rd_fail(RD_ENOMEM, "tokenizer: out of memory");

    int rc = load_kind(t, g);
    if (!rc)
        rc = load_tokens(t, g);
    if (!rc)
        rc = t->spm ? load_scores(t, g) : load_merges(t, g);
    if (!rc)
        rc = load_decode_table(t);
    if (!rc)
        rc = load_specials(t);
    /* llama.cpp's SPM defaults: bos 1, eos 2 (Llama 2's <s> and </s>). */
    if (!rc)
        rc = load_id(g, "tokenizer.ggml.bos_token_id", t->n_vocab, t->spm ? 1 : -1, &t->bos);
    if (!rc)
        rc = load_id(g, "tokenizer.ggml.eos_token_id", t->n_vocab, t->spm ? 2 : -1, &t->eos);
    if (!rc) {
        rc = gguf_get_bool(g, "tokenizer.ggml.add_bos_token", &t->add_bos);
        if (rc == RD_ENOENT) {
            t->add_bos = t->spm ? 1 : t->pre->add_bos; /* llama.cpp's default for the model / pre-tokenizer */
            rc = 0;
        }
    }
    if (!rc && t->spm) {
        rc = gguf_get_bool(g, "tokenizer.ggml.add_space_prefix", &t->add_space_prefix);
        if (rc == RD_ENOENT) {
            t->add_space_prefix = 1; /* llama.cpp's default for SPM */
            rc = 0;
        }
    }
    if (rc) {
        tok_free(t);
        return rc;
    }

    for (int b = 0; b < 256; b++) {
        char s[7];
        if (t->spm) {
            /* llama.cpp's byte_to_token: "<0xXX>" (upper-case hex), else the byte itself. */
            snprintf(s, sizeof s, "<0x%02X>", b);
            t->byte_tok[b] = vocab_find(t, s, 6);
            if (t->byte_tok[b] < 0) {
                s[0] = (char)b;
                t->byte_tok[b] = vocab_find(t, s, 1);
            }
            continue;
        }
        size_t n = utf8_put(byte_to_cp(b), s);
        t->byte_tok[b] = vocab_find(t, s, n);
    }
    t->im_start = vocab_find(t, "<|im_start|>", 12);
    t->im_end = vocab_find(t, "<|im_end|>", 10);
    t->start_header = vocab_find(t, "<|start_header_id|>", 19);
    t->end_header = vocab_find(t, "<|end_header_id|>", 17);
    t->eot_id = vocab_find(t, "<|eot_id|>", 10);
    t->start_turn = vocab_find(t, "<start_of_turn>", 15);
    t->end_turn = vocab_find(t, "<end_of_turn>", 13);
    t->chat = chat_format(t, g);
    *out = t;
    return 0;
}

void tok_free(tok_tokenizer *t)
{
    if (!t)
        return;
    pcre2_code_free(t->re_split);
    pcre2_code_free(t->re_isolate);
    free(t->text);
    free(t->text_off);
    free(t->text_len);
    free(t->type);
    free(t->raw);
    free(t->raw_off);
    free(t->vocab_slot);
    free(t->merge_key);
    free(t->merge_rank);
    free(t->merge_out);
    free(t->special);
    free(t->score);
    free(t);
}

int32_t tok_vocab_size(const tok_tokenizer *t) { return t->n_vocab; }
int32_t tok_bos(const tok_tokenizer *t) { return t->bos; }
int32_t tok_eos(const tok_tokenizer *t) { return t->eos; }
int tok_add_bos(const tok_tokenizer *t) { return t->add_bos; }

const char *tok_piece(const tok_tokenizer *t, int32_t id)
{
    if (!t || id < 0 || id >= t->n_vocab)
        return NULL;
    return tok_text(t, id);
}

/* ------------------------------------------------------------------------
 * Encoding: scratch space and the output list. */

typedef struct {
    int32_t *v;
    size_t n, cap;
} id_list;

static int ids_push(id_list *o, int32_t id)
{
    if (o->n == o->cap) {
        size_t cap = o->cap ? 2 * o->cap : 64;
        int32_t *v = realloc(o->v, sizeof(int32_t) * cap);
        if (!v)
            return rd_fail(RD_ENOMEM, "tokenizer: out of memory for %zu token ids", cap);
        o->v = v;
        o->cap = cap;
    }
    o->v[o->n++] = id;
    return 0;
}

/* A candidate merge of a symbol and the one after it. It is stale (and
 * skipped) once either no longer holds the token it held when pushed: a
 * symbol's token only grows, and its successor changes only when it merges, so
 * equal tokens mean the same pair. */
typedef struct {
    int32_t rank;       /* merge rank: lower merges first */
    int32_t left;       /* symbol index = byte offset in the piece */
    int32_t left_tok;   /* token ids of both symbols when pushed */
    int32_t right_tok;
} bpe_pair;

/* SPM: a candidate merge of symbol left with symbol right (its successor when
 * pushed), by the score of the token their concatenation is. Stale once
 * either symbol has changed, which shows in their lengths: a live symbol only
 * grows, by taking in its successor, so the same two live symbols with the
 * same total length are the same pair (llama.cpp's test). */
typedef struct {
    float score;
    int32_t left, right;
    uint32_t size;      /* bytes of the concatenation */
} spm_pair;

typedef struct {
    pcre2_match_data *md;
    /* Symbols of the piece being merged, indexed by byte offset. */
    int32_t *tok;       /* token id; -1 for a byte the vocab lacks; -2 once merged away */
    int32_t *next;      /* index of the next live symbol, -1 at the end */
    int32_t *prev;      /* index of the previous live symbol, -1 at the start */
    size_t sym_cap;
    bpe_pair *heap;     /* min-heap on (rank, left); grows as needed */
    size_t heap_n, heap_cap;
    char *text;         /* gpt2: the piece in byte-level form, for the ignore_merges lookup;
                           SPM: the fragment with its spaces written U+2581 */
    size_t text_cap;
    /* SPM: symbols are UTF-8 characters of text, linked by next and prev. */
    uint32_t *sym_off;  /* byte offset in text */
    uint32_t *sym_len;  /* bytes; 0 once merged into its predecessor */
    size_t spm_cap;
    spm_pair *sheap;    /* max-heap on (score, then lower left) */
    size_t sheap_n, sheap_cap;
} tok_work;

static void work_free(tok_work *w)
{
    pcre2_match_data_free(w->md);
    free(w->tok);
    free(w->next);
    free(w->prev);
    free(w->heap);
    free(w->text);
    free(w->sym_off);
    free(w->sym_len);
    free(w->sheap);
}

static int work_reserve(tok_work *w, size_t n)
{
    if (n <= w->sym_cap)
        return 0;
    size_t cap = n < 256 ? 256 : n;
    int32_t *tok = realloc(w->tok, sizeof(int32_t) * cap);
    if (tok)
        w->tok = tok;
    int32_t *next = realloc(w->next, sizeof(int32_t) * cap);
    if (next)
        w->next = next;
    int32_t *prev = realloc(w->prev, sizeof(int32_t) * cap);
    if (prev)
        w->prev = prev;
    if (!tok || !next || !prev)
        return rd_fail(RD_ENOMEM, "tokenizer: out of memory for a piece of %zu bytes", n);
    w->sym_cap = cap;
    return 0;
}

static int pair_before(const bpe_pair *a, const bpe_pair *b)
{
    return a->rank < b->rank || (a->rank == b->rank && a->left < b->left);
}

static int heap_push(tok_work *w, bpe_pair p)
{
    if (w->heap_n == w->heap_cap) {
        size_t cap = w->heap_cap ? 2 * w->heap_cap : 256;
        bpe_pair *h = realloc(w->heap, sizeof(bpe_pair) * cap);
        if (!h)
            return rd_fail(RD_ENOMEM, "tokenizer: out of memory for %zu merge candidates", cap);
        w->heap = h;
        w->heap_cap = cap;
    }
    size_t i = w->heap_n++;
    while (i > 0) {
        size_t up = (i - 1) / 2;
        if (!pair_before(&p, &w->heap[up]))
            break;
        w->heap[i] = w->heap[up];
        i = up;
    }
    w->heap[i] = p;
    return 0;
}

static bpe_pair heap_pop(tok_work *w)
{
    bpe_pair top = w->heap[0];
    bpe_pair last = w->heap[--w->heap_n];
    size_t i = 0, n = w->heap_n;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n)
            break;
        if (c + 1 < n && pair_before(&w->heap[c + 1], &w->heap[c]))
            c++;
        if (!pair_before(&w->heap[c], &last))
            break;
        w->heap[i] = w->heap[c];
        i = c;
    }
    w->heap[i] = last;
    return top;
}

/* Queues the merge of symbol left with its successor, if the pair has one. */
static int push_pair(const tok_tokenizer *t, tok_work *w, int32_t left)
{
    if (left < 0 || w->next[left] < 0)
        return 0;
    int32_t a = w->tok[left], b = w->tok[w->next[left]], rank, out;
    if (a < 0 || b < 0 || !merge_find(t, a, b, &rank, &out))
        return 0;
    return heap_push(w, (bpe_pair){rank, left, a, b});
}

/* *id = the token whose text is the byte-level form of p[0..n), or -1. For
 * ignore_merges: llama.cpp looks the whole piece up among all its tokens
 * (any type) before merging, as Hugging Face's BPE does with that option. */
static int piece_token(const tok_tokenizer *t, tok_work *w, const uint8_t *p, size_t n, int32_t *id)
{
    *id = -1;
    /* Each byte becomes 1 or 2 bytes of text, so a longer piece cannot be a token. */
    if (n > t->max_text_len)
        return 0;
    if (2 * n > w->text_cap) {
        char *s = realloc(w->text, 2 * n);
        if (!s)
            return rd_fail(RD_ENOMEM, "tokenizer: out of memory for a piece of %zu bytes", n);
        w->text = s;
        w->text_cap = 2 * n;
    }
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        k += utf8_put(byte_to_cp(p[i]), w->text + k);
    *id = vocab_find(t, w->text, k);
    return 0;
}

/* BPE over one piece of raw bytes, appending its tokens. A byte whose
 * byte-level char is not in the vocab is dropped, as llama.cpp and Hugging
 * Face (no unk token in a gpt2 vocab) both do. */
static int bpe_piece(const tok_tokenizer *t, tok_work *w, const uint8_t *p, size_t n, id_list *out)
{
    if (n == 0)
        return 0;
    if (n == 1)
        return t->byte_tok[p[0]] >= 0 ? ids_push(out, t->byte_tok[p[0]]) : 0;
    int rc;
    if (t->pre->ignore_merges) {
        int32_t whole;
        if ((rc = piece_token(t, w, p, n, &whole)))
            return rc;
        if (whole >= 0)
            return ids_push(out, whole);
    }
    rc = work_reserve(w, n);
    if (rc)
        return rc;
    int32_t m = (int32_t)n;
    for (int32_t i = 0; i < m; i++) {
        w->tok[i] = t->byte_tok[p[i]];
        w->next[i] = i + 1 < m ? i + 1 : -1;
        w->prev[i] = i - 1;
    }
    w->heap_n = 0;
    for (int32_t i = 0; i + 1 < m; i++)
        if ((rc = push_pair(t, w, i)))
            return rc;

    while (w->heap_n > 0) {
        bpe_pair e = heap_pop(w);
        int32_t right = w->next[e.left];
        if (w->tok[e.left] != e.left_tok || right < 0 || w->tok[right] != e.right_tok)
            continue;
        int32_t rank = 0, merged = -1; /* always found: the pair was pushed from this table */
        merge_find(t, e.left_tok, e.right_tok, &rank, &merged);
        w->tok[e.left] = merged;
        w->tok[right] = -2;
        int32_t after = w->next[right];
        w->next[e.left] = after;
        if (after >= 0)
            w->prev[after] = e.left;
        if ((rc = push_pair(t, w, w->prev[e.left])) || (rc = push_pair(t, w, e.left)))
            return rc;
    }

    /* Symbol 0 is never merged away (only right symbols are), so the chain starts there. */
    for (int32_t i = 0; i >= 0; i = w->next[i])
        if (w->tok[i] >= 0 && (rc = ids_push(out, w->tok[i])))
            return rc;
    return 0;
}

static int pcre_fail(int code)
{
    char msg[128];
    pcre2_get_error_message(code, (PCRE2_UCHAR *)msg, sizeof msg);
    return rd_fail(RD_ENOMEM, "tokenizer: the split pattern failed to match (PCRE2: %s)", msg);
}

/* Splits s[0..len) with the pre-tokenizer's pattern and runs BPE on each
 * piece. The subject is exactly this fragment, so (?!\S) at its end sees the
 * end of the text, not the digit or special token that follows it. */
static int split_pieces(const tok_tokenizer *t, tok_work *w, const char *s, size_t len, id_list *out)
{
    size_t at = 0;
    int rc;
    while (at < len) {
        int m = pcre2_match(t->re_split, (PCRE2_SPTR)s, len, at, PCRE2_NO_UTF_CHECK, w->md, NULL);
        if (m == PCRE2_ERROR_NOMATCH)
            return bpe_piece(t, w, (const uint8_t *)s + at, len - at, out);
        if (m < 0)
            return pcre_fail(m);
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(w->md);
        size_t start = ov[0], end = ov[1];
        /* Unmatched text between matches is a piece of its own (llama.cpp does
         * the same); with the trailing \s+ every char matches, so it is rare. */
        if (start > at && (rc = bpe_piece(t, w, (const uint8_t *)s + at, start - at, out)))
            return rc;
        if (end <= start) /* no alternative can match empty; never loop forever */
            end = start + utf8_seq((const uint8_t *)s + start, len - start);
        if ((rc = bpe_piece(t, w, (const uint8_t *)s + start, end - start, out)))
            return rc;
        at = end;
    }
    return 0;
}

/* Pre-tokenizes one fragment without special tokens. For smollm every \p{N}
 * char is a piece, and the GPT-2 pattern runs separately on each stretch
 * between them (llama.cpp applies its regex list in sequence like this). */
static int encode_fragment(const tok_tokenizer *t, tok_work *w, const char *s, size_t len, id_list *out)
{
    if (!t->re_isolate)
        return split_pieces(t, w, s, len, out);
    size_t at = 0;
    int rc;
    while (at < len) {
        int m = pcre2_match(t->re_isolate, (PCRE2_SPTR)s, len, at, PCRE2_NO_UTF_CHECK, w->md, NULL);
        if (m == PCRE2_ERROR_NOMATCH)
            return split_pieces(t, w, s + at, len - at, out);
        if (m < 0)
            return pcre_fail(m);
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(w->md);
        size_t start = ov[0], end = ov[1];
        if (start > at && (rc = split_pieces(t, w, s + at, start - at, out)))
            return rc;
        if ((rc = bpe_piece(t, w, (const uint8_t *)s + start, end - start, out)))
            return rc;
        at = end;
    }
    return 0;
}


/* ------------------------------------------------------------------------
 * SPM (tokenizer.ggml.model "llama"): llama.cpp's llm_tokenizer_spm_session. */

static int spm_reserve(tok_work *w, size_t n_sym, size_t n_text)
{
    int rc = work_reserve(w, n_sym);
    if (rc)
        return rc;
    if (n_sym > w->spm_cap) {
        size_t cap = n_sym < 256 ? 256 : n_sym;
        uint32_t *off = realloc(w->sym_off, sizeof(uint32_t) * cap);
        if (off)
            w->sym_off = off;
        uint32_t *len = realloc(w->sym_len, sizeof(uint32_t) * cap);
        if (len)
            w->sym_len = len;
        if (!off || !len)
            return rd_fail(RD_ENOMEM, "tokenizer: out of memory for a text of %zu characters", n_sym);
        w->spm_cap = cap;
    }
    if (n_text > w->text_cap) {
        char *p = realloc(w->text, n_text);
        if (!p)
            return rd_fail(RD_ENOMEM, "tokenizer: out of memory for a text of %zu bytes", n_text);
        w->text = p;
        w->text_cap = n_text;
    }
    return 0;
}

/* a is popped before b: higher score, then the left-most (llama.cpp's
 * llm_bigram_spm::comparator). */
static int spm_before(const spm_pair *a, const spm_pair *b)
{
    return a->score > b->score || (a->score == b->score && a->left < b->left);
}

static int spm_push(tok_work *w, spm_pair p)
{
    if (w->sheap_n == w->sheap_cap) {
        size_t cap = w->sheap_cap ? 2 * w->sheap_cap : 256;
        spm_pair *h = realloc(w->sheap, sizeof(spm_pair) * cap);
        if (!h)
            return rd_fail(RD_ENOMEM, "tokenizer: out of memory for %zu merge candidates", cap);
        w->sheap = h;
        w->sheap_cap = cap;
    }
    size_t i = w->sheap_n++;
    while (i > 0) {
        size_t up = (i - 1) / 2;
        if (!spm_before(&p, &w->sheap[up]))
            break;
        w->sheap[i] = w->sheap[up];
        i = up;
    }
    w->sheap[i] = p;
    return 0;
}

static spm_pair spm_pop(tok_work *w)
{
    spm_pair top = w->sheap[0];
    spm_pair last = w->sheap[--w->sheap_n];
    size_t i = 0, n = w->sheap_n;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n)
            break;
        if (c + 1 < n && spm_before(&w->sheap[c + 1], &w->sheap[c]))
            c++;
        if (!spm_before(&w->sheap[c], &last))
            break;
        w->sheap[i] = w->sheap[c];
        i = c;
    }
    w->sheap[i] = last;
    return top;
}

/* Queues the merge of symbols left and right (adjacent, in that order) when
 * their concatenation is a token, of any type (llama.cpp's try_add_bigram). */
static int spm_try_pair(const tok_tokenizer *t, tok_work *w, int32_t left, int32_t right)
{
    if (left < 0 || right < 0)
        return 0;
    uint32_t size = w->sym_len[left] + w->sym_len[right];
    if (size > t->max_text_len)
        return 0; /* longer than any token */
    int32_t id = vocab_find(t, w->text + w->sym_off[left], size);
    if (id < 0)
        return 0;
    return spm_push(w, (spm_pair){t->score[id], left, right, size});
}

/* One stretch of text between special tokens, appending its tokens: a space
 * first when prefix is set, each " " as U+2581, then the merges by score. A
 * symbol left at the end is its token, or else the bytes of its text as byte
 * tokens. (llama.cpp's resegment would first split such a symbol back along
 * the merges that made it, but every merge makes a token, so only a single
 * character that is no token is ever left over: its bytes are all there is.) */
static int spm_fragment(const tok_tokenizer *t, tok_work *w, const char *s, size_t len, int prefix, id_list *out)
{
    /* Each byte is at most 3 bytes escaped and at most one symbol. */
    if (len + (prefix != 0) == 0)
        return 0;
    int rc = spm_reserve(w, len + 1, 3 * (len + 1));
    if (rc)
        return rc;
    size_t n = 0;
    if (prefix) {
        memcpy(w->text, "\xe2\x96\x81", 3);
        n = 3;
    }
    for (size_t i = 0; i < len; i++) {
        if (s[i] == ' ') {
            memcpy(w->text + n, "\xe2\x96\x81", 3);
            n += 3;
        } else {
            w->text[n++] = s[i];
        }
    }
    /* The text is valid UTF-8 (checked by the caller), so each lead byte
     * gives its character's length, as llama.cpp's unicode_len_utf8 does. */
    int32_t m = 0;
    for (size_t at = 0; at < n; m++) {
        size_t k = utf8_seq((const uint8_t *)w->text + at, n - at);
        if (k == 0)
            k = 1; /* not reached for valid UTF-8 */
        w->sym_off[m] = (uint32_t)at;
        w->sym_len[m] = (uint32_t)k;
        w->prev[m] = m - 1;
        at += k;
    }
    for (int32_t i = 0; i < m; i++)
        w->next[i] = i + 1 < m ? i + 1 : -1;

    w->sheap_n = 0;
    for (int32_t i = 1; i < m; i++)
        if ((rc = spm_try_pair(t, w, i - 1, i)))
            return rc;
    while (w->sheap_n > 0) {
        spm_pair p = spm_pop(w);
        uint32_t ll = w->sym_len[p.left], rl = w->sym_len[p.right];
        if (ll == 0 || rl == 0 || ll + rl != p.size)
            continue;
        /* The right symbol joins the left one. */
        w->sym_len[p.left] = ll + rl;
        w->sym_len[p.right] = 0;
        int32_t after = w->next[p.right];
        w->next[p.left] = after;
        if (after >= 0)
            w->prev[after] = p.left;
        if ((rc = spm_try_pair(t, w, w->prev[p.left], p.left)) || (rc = spm_try_pair(t, w, p.left, after)))
            return rc;
    }

    for (int32_t i = 0; i >= 0; i = w->next[i]) {
        const char *sym = w->text + w->sym_off[i];
        uint32_t k = w->sym_len[i];
        int32_t id = vocab_find(t, sym, k);
        if (id >= 0) {
            if ((rc = ids_push(out, id)))
                return rc;
            continue;
        }
        for (uint32_t b = 0; b < k; b++) {
            int32_t bt = t->byte_tok[(uint8_t)sym[b]];
            if (bt < 0)
                return rd_fail(RD_EINVAL, "tokenizer: the vocabulary has no token for the character \"%.*s\" and no "
                                          "byte token <0x%02X> to write it with", (int)k, sym, (uint8_t)sym[b]);
            if ((rc = ids_push(out, bt)))
                return rc;
        }
    }
    return 0;
}

/* A stretch of the text: raw text to pre-tokenize (id -1) or one special token. */
typedef struct {
    size_t off, len;    /* bytes */
    int32_t id;
} fragment;

typedef struct {
    fragment *v;
    size_t n, cap;
} fragment_list;

static int frags_push(fragment_list *l, size_t off, size_t len, int32_t id)
{
    if (l->n == l->cap) {
        size_t cap = l->cap ? 2 * l->cap : 16;
        fragment *v = realloc(l->v, sizeof(fragment) * cap);
        if (!v)
            return rd_fail(RD_ENOMEM, "tokenizer: out of memory splitting special tokens");
        l->v = v;
        l->cap = cap;
    }
    l->v[l->n++] = (fragment){off, len, id};
    return 0;
}

/* A quick test of whether a special token can occur in a text, for vocabs
 * with thousands of them (Gemma 3: 6,414, most <unusedN>), where a memmem of
 * each over the whole text would cost more than tokenizing it: every pair of
 * adjacent bytes of the text, and a hash of every four, as bitsets. A token
 * whose first pair, first four or last four bytes are not among them cannot
 * occur; one that passes is looked for with memmem as before. */
#define GRAM_WORDS 1024 /* 65,536 bits each */
#define GRAM_MIN_SPECIALS 64
#define GRAM_MIN_TEXT 64

typedef struct {
    uint64_t pair[GRAM_WORDS];
    uint64_t quad[GRAM_WORDS];
} gram_filter;

static uint32_t gram_pair(const char *p) { return (uint32_t)(uint8_t)p[0] << 8 | (uint8_t)p[1]; }

static uint32_t gram_quad(const char *p)
{
    uint32_t x;
    memcpy(&x, p, 4);
    return (x * 0x9E3779B1u) >> 16;
}

static void gram_fill(gram_filter *f, const char *s, size_t n)
{
    memset(f, 0, sizeof *f);
    for (size_t i = 0; i + 1 < n; i++) {
        uint32_t b = gram_pair(s + i);
        f->pair[b >> 6] |= 1ull << (b & 63);
    }
    for (size_t i = 0; i + 3 < n; i++) {
        uint32_t b = gram_quad(s + i);
        f->quad[b >> 6] |= 1ull << (b & 63);
    }
}

/* 0 when st[0..sn) cannot occur in the text f was filled from. */
static int gram_may_hold(const gram_filter *f, const char *st, size_t sn)
{
    if (sn < 2)
        return 1;
    uint32_t b = gram_pair(st), e = gram_pair(st + sn - 2);
    if (!(f->pair[b >> 6] >> (b & 63) & 1) || !(f->pair[e >> 6] >> (e & 63) & 1))
        return 0;
    if (sn < 4)
        return 1;
    b = gram_quad(st), e = gram_quad(st + sn - 4);
    return (f->quad[b >> 6] >> (b & 63) & 1) && (f->quad[e >> 6] >> (e & 63) & 1);
}

/* Cuts special tokens out of the text, one token at a time, longest first:
 * every occurrence of a longer token is taken before shorter ones are looked
 * for (llama.cpp's order). Control and unknown tokens count only with
 * parse_special; user-defined ones always do, as in llama.cpp and Hugging Face. */
static int split_specials(const tok_tokenizer *t, const char *text, size_t len, int parse_special,
                          fragment_list *frags)
{
    fragment_list tmp = {0};
    int rc = 0;
    frags->n = 0;
    if (len > 0 && (rc = frags_push(frags, 0, len, -1)))
        return rc;
    gram_filter *gf = NULL;
    if (t->n_special >= GRAM_MIN_SPECIALS && len >= GRAM_MIN_TEXT) {
        gf = malloc(sizeof *gf); /* without it (out of memory), every token is looked for */
        if (gf)
            gram_fill(gf, text, len);
    }
    for (size_t k = 0; k < t->n_special && rc == 0; k++) {
        int32_t id = t->special[k];
        if (!parse_special && t->type[id] != TYPE_USER)
            continue;
        const char *st = tok_text(t, id);
        size_t sn = t->text_len[id];
        if (sn > len || (gf && !gram_may_hold(gf, st, sn)) || !memmem(text, len, st, sn))
            continue; /* the common case: one scan, no rebuild */
        tmp.n = 0;
        for (size_t f = 0; f < frags->n && rc == 0; f++) {
            fragment fr = frags->v[f];
            if (fr.id >= 0) {
                rc = frags_push(&tmp, fr.off, fr.len, fr.id);
                continue;
            }
            size_t at = fr.off, end = fr.off + fr.len;
            const char *hit;
            while (rc == 0 && (hit = memmem(text + at, end - at, st, sn))) {
                size_t h = (size_t)(hit - text);
                if (h > at)
                    rc = frags_push(&tmp, at, h - at, -1);
                if (rc == 0)
                    rc = frags_push(&tmp, h, sn, id);
                at = h + sn;
            }
            if (rc == 0 && at < end)
                rc = frags_push(&tmp, at, end - at, -1);
        }
        fragment_list swap = *frags;
        *frags = tmp;
        tmp = swap;
    }
    free(gf);
    free(tmp.v);
    return rc;
}

static int check_utf8(const char *what, const char *s, size_t len)
{
    size_t bad = utf8_invalid_at((const uint8_t *)s, len);
    if (bad < len)
        return rd_fail(RD_EINVAL, "tokenizer: %s is not valid UTF-8 at byte offset %zu (byte 0x%02x)", what, bad,
                       (uint8_t)s[bad]);
    return 0;
}

/* Encodes already-validated text, appending to out. */
static int encode_into(const tok_tokenizer *t, tok_work *w, const char *text, size_t len, int parse_special,
                       id_list *out)
{
    fragment_list frags = {0};
    int rc = split_specials(t, text, len, parse_special, &frags);
    /* SPM: a stretch of text gets the space prefix at the start and after a
     * special token (llama.cpp's is_prev_special); there is never one right
     * after another. */
    int prev_special = 1;
    for (size_t f = 0; f < frags.n && rc == 0; f++) {
        fragment fr = frags.v[f];
        if (fr.id >= 0)
            rc = ids_push(out, fr.id);
        else if (t->spm)
            rc = spm_fragment(t, w, text + fr.off, fr.len, t->add_space_prefix && prev_special, out);
        else
            rc = encode_fragment(t, w, text + fr.off, fr.len, out);
        prev_special = fr.id >= 0;
    }
    free(frags.v);
    return rc;
}

static int work_init(const tok_tokenizer *t, tok_work *w)
{
    memset(w, 0, sizeof *w);
    w->md = pcre2_match_data_create(1, NULL);
    if (!w->md)
        return rd_fail(RD_ENOMEM, "tokenizer: out of memory for PCRE2 match data");
    return 0;
}

/* Hands the list to the caller: never NULL, even when empty. */
static int ids_finish(id_list *o, int32_t **ids, size_t *n_ids)
{
    if (!o->v && (o->v = malloc(sizeof(int32_t))) == NULL)
        return rd_fail(RD_ENOMEM, "tokenizer: out of memory");
    *ids = o->v;
    *n_ids = o->n;
    return 0;
}

int tok_encode(const tok_tokenizer *t, const char *text, size_t len, int parse_special,
               int32_t **ids, size_t *n_ids)
{
    if (!ids || !n_ids)
        return rd_fail(RD_EINVAL, "tok_encode: ids and n_ids must not be NULL");
    *ids = NULL;
    *n_ids = 0;
    if (!t)
        return rd_fail(RD_EINVAL, "tok_encode: the tokenizer is NULL");
    if (!text && len > 0)
        return rd_fail(RD_EINVAL, "tok_encode: text is NULL but len is %zu", len);
    if (len > TOK_MAX_TEXT)
        return rd_fail(RD_ERANGE, "tok_encode: text of %zu bytes, at most %zu per call (split it)", len,
                       TOK_MAX_TEXT);
    int rc = check_utf8("text", text, len);
    if (rc)
        return rc;

    tok_work w;
    id_list out = {0};
    if ((rc = work_init(t, &w)) == 0)
        rc = encode_into(t, &w, text, len, parse_special, &out);
    work_free(&w);
    if (rc == 0)
        rc = ids_finish(&out, ids, n_ids);
    if (rc)
        free(out.v);
    return rc;
}

/* ------------------------------------------------------------------------
 * Decoding and the chat prompt. */

const char *tok_token_bytes(const tok_tokenizer *t, int32_t id, size_t *len)
{
    *len = 0;
    if (!t || id < 0 || id >= t->n_vocab)
        return NULL;
    *len = t->raw_off[id + 1] - t->raw_off[id];
    return (const char *)t->raw + t->raw_off[id];
}

int tok_decode(const tok_tokenizer *t, const int32_t *ids, size_t n_ids, char **text, size_t *len)
{
    if (!text || !len)
        return rd_fail(RD_EINVAL, "tok_decode: text and len must not be NULL");
    *text = NULL;
    *len = 0;
    if (!t)
        return rd_fail(RD_EINVAL, "tok_decode: the tokenizer is NULL");
    if (!ids && n_ids > 0)
        return rd_fail(RD_EINVAL, "tok_decode: ids is NULL but n_ids is %zu", n_ids);
    size_t total = 0;
    for (size_t i = 0; i < n_ids; i++) {
        if (ids[i] < 0 || ids[i] >= t->n_vocab)
            return rd_fail(RD_EINVAL, "tok_decode: id %d at position %zu is outside the vocabulary [0, %d)", ids[i],
                           i, t->n_vocab);
        total += t->raw_off[ids[i] + 1] - t->raw_off[ids[i]];
    }
    char *s = malloc(total + 1);
    if (!s)
        return rd_fail(RD_ENOMEM, "tok_decode: out of memory for %zu bytes", total);
    size_t at = 0;
    for (size_t i = 0; i < n_ids; i++) {
        uint32_t a = t->raw_off[ids[i]], b = t->raw_off[ids[i] + 1];
        memcpy(s + at, t->raw + a, b - a);
        at += b - a;
    }
    s[at] = 0;
    *text = s;
    *len = at;
    return 0;
}

/* Appends the ids of role + sep + content, a stretch of plain text between
 * two markers. The content is never searched for control tokens, so a prompt
 * cannot open or close turns; the ids equal those of the rendered template
 * tokenized with special parsing whenever the content holds no control-token
 * text. */
static int chat_text(const tok_tokenizer *t, tok_work *w, const char *role, const char *sep, const char *content,
                     id_list *out)
{
    size_t nr = strlen(role), ns = strlen(sep), nc = strlen(content);
    char *buf = malloc(nr + ns + nc + 1);
    if (!buf)
        return rd_fail(RD_ENOMEM, "tokenizer: out of memory for a chat turn of %zu bytes", nc);
    memcpy(buf, role, nr);
    memcpy(buf + nr, sep, ns);
    memcpy(buf + nr + ns, content, nc);
    int rc = encode_into(t, w, buf, nr + ns + nc, 0, out);
    free(buf);
    return rc;
}

/* One "<|im_start|>{role}\n{content}<|im_end|>\n" turn. */
static int chatml_turn(const tok_tokenizer *t, tok_work *w, const char *role, const char *content, id_list *out)
{
    int rc = ids_push(out, t->im_start);
    if (!rc)
        rc = chat_text(t, w, role, "\n", content, out);
    if (!rc)
        rc = ids_push(out, t->im_end);
    if (!rc)
        rc = encode_into(t, w, "\n", 1, 0, out);
    return rc;
}

/* One "<|start_header_id|>{role}<|end_header_id|>\n\n{content}<|eot_id|>"
 * turn; with content NULL only the header and its "\n\n" (the assistant's
 * turn left open). The role sits alone between two markers, so it is a
 * fragment of its own, as in the rendered text. */
static int llama3_turn(const tok_tokenizer *t, tok_work *w, const char *role, const char *content, id_list *out)
{
    int rc = ids_push(out, t->start_header);
    if (!rc)
        rc = encode_into(t, w, role, strlen(role), 0, out);
    if (!rc)
        rc = ids_push(out, t->end_header);
    if (!rc)
        rc = chat_text(t, w, "", "\n\n", content ? content : "", out);
    if (!rc && content)
        rc = ids_push(out, t->eot_id);
    return rc;
}

/* One "<start_of_turn>{role}\n{prefix}\n\n{content}<end_of_turn>\n" turn
 * (without "{prefix}\n\n" when prefix is NULL); with content NULL only
 * "<start_of_turn>{role}\n", the model's turn left open. */
static int gemma_turn(const tok_tokenizer *t, tok_work *w, const char *role, const char *prefix,
                      const char *content, id_list *out)
{
    int rc = ids_push(out, t->start_turn);
    if (rc)
        return rc;
    if (!content)
        return chat_text(t, w, role, "\n", "", out);
    size_t np = prefix ? strlen(prefix) : 0, nc = strlen(content);
    char *body = malloc(np + 2 + nc + 1);
    if (!body)
        return rd_fail(RD_ENOMEM, "tokenizer: out of memory for a chat turn of %zu bytes", np + nc);
    size_t at = 0;
    if (prefix) {
        memcpy(body, prefix, np);
        memcpy(body + np, "\n\n", 2);
        at = np + 2;
    }
    memcpy(body + at, content, nc + 1);
    rc = chat_text(t, w, role, "\n", body, out);
    free(body);
    if (!rc)
        rc = ids_push(out, t->end_turn);
    if (!rc)
        rc = encode_into(t, w, "\n", 1, 0, out);
    return rc;
}

/* Which markers of a format the vocabulary lacks, for the error message. */
static void missing_markers(const tok_tokenizer *t, tok_chat_format f, char *msg, size_t cap)
{
    const char *name[3];
    int32_t id[3];
    int n = f == TOK_CHAT_LLAMA3 ? 3 : 2;
    if (f == TOK_CHAT_LLAMA3) {
        name[0] = "<|start_header_id|>", name[1] = "<|end_header_id|>", name[2] = "<|eot_id|>";
        id[0] = t->start_header, id[1] = t->end_header, id[2] = t->eot_id;
    } else if (f == TOK_CHAT_GEMMA) {
        name[0] = "<start_of_turn>", name[1] = "<end_of_turn>";
        id[0] = t->start_turn, id[1] = t->end_turn;
    } else {
        name[0] = "<|im_start|>", name[1] = "<|im_end|>";
        id[0] = t->im_start, id[1] = t->im_end;
    }
    size_t at = 0;
    msg[0] = 0;
    for (int i = 0; i < n && at < cap; i++)
        if (id[i] < 0)
            at += (size_t)snprintf(msg + at, cap - at, "%s%s", at ? ", " : "", name[i]);
}

/* Checks a conversation against what format f can render (tok_chat_msgs). */
static int check_msgs(tok_chat_format f, const char *fn, const tok_chat_msg *msgs, size_t n)
{
    if (n == 0)
        return rd_fail(RD_EINVAL, "%s: the conversation has no messages", fn);
    int turn = 0; /* Gemma: turns after the system message, which must alternate user / assistant */
    for (size_t i = 0; i < n; i++) {
        const char *r = msgs[i].role, *c = msgs[i].content;
        if (!r || !c)
            return rd_fail(RD_EINVAL, "%s: message %zu has a NULL role or content", fn, i);
        int sys = !strcmp(r, "system"), user = !strcmp(r, "user"), asst = !strcmp(r, "assistant");
        if (!sys && !user && !asst)
            return rd_fail(RD_EINVAL, "%s: message %zu has role \"%.40s\"; expected system, user or assistant", fn,
                           i, r);
        int rc = check_utf8(sys ? "a system message" : user ? "a user message" : "an assistant message", c,
                            strlen(c));
        if (rc)
            return rc;
        if (f != TOK_CHAT_GEMMA)
            continue;
        /* Hugging Face's Gemma 3 template: one system message, first, that opens the
           first user turn; then user and model turns alternate from the user's. */
        if (sys && i != 0)
            return rd_fail(RD_EINVAL, "%s: message %zu: Gemma's template takes a system message only first", fn, i);
        if (!sys && (user != (turn % 2 == 0)))
            return rd_fail(RD_EINVAL, "%s: message %zu: Gemma's template needs user and assistant turns "
                                      "alternating, starting with the user's (\"%s\" here)", fn, i, r);
        turn += !sys;
    }
    return 0;
}

/* The prompt in format f: every message's turn in order, then the
 * assistant's turn opened for the model to write. */
static int chat_render(const tok_tokenizer *t, tok_chat_format f, const char *fn, const tok_chat_msg *msgs,
                       size_t n, int32_t **ids, size_t *n_ids)
{
    if (!ids || !n_ids)
        return rd_fail(RD_EINVAL, "%s: ids and n_ids must not be NULL", fn);
    *ids = NULL;
    *n_ids = 0;
    if (!t || (n && !msgs))
        return rd_fail(RD_EINVAL, "%s: the tokenizer and the messages must not be NULL", fn);
    if (f == TOK_CHAT_NONE) {
        char l3[96], cm[64], gm[64];
        missing_markers(t, TOK_CHAT_LLAMA3, l3, sizeof l3);
        missing_markers(t, TOK_CHAT_CHATML, cm, sizeof cm);
        missing_markers(t, TOK_CHAT_GEMMA, gm, sizeof gm);
        return rd_fail(RD_ENOTSUP, "%s: the vocabulary has no chat format: Llama 3's needs <|start_header_id|>, "
                                   "<|end_header_id|> and <|eot_id|> (it lacks %s); ChatML's needs <|im_start|> and "
                                   "<|im_end|> (it lacks %s); Gemma's needs <start_of_turn> and <end_of_turn> "
                                   "(it lacks %s)", fn, l3, cm, gm);
    }
    if (f == TOK_CHAT_CHATML && (t->im_start < 0 || t->im_end < 0)) /* only tok_chatml asks for it regardless */
        return rd_fail(RD_ENOTSUP, "%s: the vocabulary has no <|im_start|> or <|im_end|> token, "
                                   "so it cannot write a ChatML prompt", fn);
    int rc = check_msgs(f, fn, msgs, n);
    if (rc)
        return rc;

    tok_work w;
    id_list out = {0};
    rc = work_init(t, &w);
    if (f == TOK_CHAT_CHATML) {
        for (size_t i = 0; i < n && !rc; i++)
            rc = chatml_turn(t, &w, msgs[i].role, msgs[i].content, &out);
        if (!rc)
            rc = ids_push(&out, t->im_start);
        if (!rc)
            rc = encode_into(t, &w, "assistant\n", 10, 0, &out);
    } else if (f == TOK_CHAT_GEMMA) {
        /* Hugging Face's Gemma 3 template: bos_token, then the turns; the
         * system message opens the first user turn, followed by "\n\n"; the
         * assistant's role is "model". */
        if (!rc && t->bos >= 0)
            rc = ids_push(&out, t->bos);
        const char *system = n > 0 && !strcmp(msgs[0].role, "system") ? msgs[0].content : NULL;
        for (size_t i = system ? 1 : 0, first = 1; i < n && !rc; i++, first = 0) {
            int user = !strcmp(msgs[i].role, "user");
            rc = gemma_turn(t, &w, user ? "user" : "model", first ? system : NULL, msgs[i].content, &out);
        }
        if (!rc)
            rc = gemma_turn(t, &w, "model", NULL, NULL, &out);
    } else {
        /* The template's bos_token opens the conversation (<|begin_of_text|>
         * in Llama 3 files); callers add no other BOS. */
        if (!rc && t->bos >= 0)
            rc = ids_push(&out, t->bos);
        for (size_t i = 0; i < n && !rc; i++)
            rc = llama3_turn(t, &w, msgs[i].role, msgs[i].content, &out);
        if (!rc)
            rc = llama3_turn(t, &w, "assistant", NULL, &out);
    }
    work_free(&w);
    if (!rc)
        rc = ids_finish(&out, ids, n_ids);
    if (rc)
        free(out.v);
    return rc;
}

/* The one-turn prompt: a system turn when system is not NULL, the user's. */
static int chat_prompt(const tok_tokenizer *t, tok_chat_format f, const char *fn, const char *system,
                       const char *user, int32_t **ids, size_t *n_ids)
{
    if (!user) {
        if (ids && n_ids) {
            *ids = NULL;
            *n_ids = 0;
        }
        return rd_fail(RD_EINVAL, "%s: the tokenizer and user must not be NULL", fn);
    }
    tok_chat_msg m[2] = {{"system", system}, {"user", user}};
    return system ? chat_render(t, f, fn, m, 2, ids, n_ids) : chat_render(t, f, fn, m + 1, 1, ids, n_ids);
}

int tok_chat_msgs(const tok_tokenizer *t, const tok_chat_msg *msgs, size_t n, int32_t **ids, size_t *n_ids)
{
    return chat_render(t, t ? t->chat : TOK_CHAT_NONE, "tok_chat_msgs", msgs, n, ids, n_ids);
}

int tok_chatml(const tok_tokenizer *t, const char *system, const char *user, int32_t **ids, size_t *n_ids)
{
    return chat_prompt(t, TOK_CHAT_CHATML, "tok_chatml", system, user, ids, n_ids);
}

int tok_chat(const tok_tokenizer *t, const char *system, const char *user, int32_t **ids, size_t *n_ids)
{
    return chat_prompt(t, t ? t->chat : TOK_CHAT_NONE, "tok_chat", system, user, ids, n_ids);
}

tok_chat_format tok_chat_kind(const tok_tokenizer *t) { return t->chat; }

const char *tok_chat_name(tok_chat_format f)
{
    return f == TOK_CHAT_LLAMA3   ? "llama3"
           : f == TOK_CHAT_CHATML ? "chatml"
           : f == TOK_CHAT_GEMMA  ? "gemma"
                                  : "none";
}

int32_t tok_eot(const tok_tokenizer *t)
{
    return t->chat == TOK_CHAT_LLAMA3   ? t->eot_id
           : t->chat == TOK_CHAT_CHATML ? t->im_end
           : t->chat == TOK_CHAT_GEMMA  ? t->end_turn
                                        : -1;
}

int tok_encode_prompt(const tok_tokenizer *t, const char *text, size_t len, int32_t **ids, size_t *n_ids)
{
    int rc = tok_encode(t, text, len, 1, ids, n_ids);
    /* A text that starts with the BOS token's own text keeps a single BOS. */
    if (rc || !t->add_bos || t->bos < 0 || (*n_ids > 0 && (*ids)[0] == t->bos))
        return rc;
    int32_t *v = realloc(*ids, sizeof(int32_t) * (*n_ids + 1));
    if (!v) {
        rc = rd_fail(RD_ENOMEM, "tok_encode_prompt: out of memory for %zu ids", *n_ids + 1);
        free(*ids);
        *ids = NULL;
        *n_ids = 0;
        return rc;
    }
    memmove(v + 1, v, sizeof(int32_t) * *n_ids);
    v[0] = t->bos;
    *ids = v;
    *n_ids += 1;
    return 0;
}
