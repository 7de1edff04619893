/* bpe.c - GPT-2 byte-level BPE (tokenizer.ggml.model "gpt2"; see tokenizer.h).
 *
 * Each stretch of text between special tokens (tokenizer.c cuts them out) is
 *   1. pre-tokenized with PCRE2, one pattern per pre-tokenizer (the table PRE
 *      below): "smollm" first cuts every \p{N} code point into its own piece,
 *      then the GPT-2 pattern splits each remaining piece; "gpt2" applies the
 *      GPT-2 pattern only; "qwen2" and "llama-bpe" apply their own patterns
 *      (llama.cpp's, from src/llama-vocab.cpp). Other names are refused.
 *   2. merged: each byte of a piece starts as one symbol (its byte-level
 *      char); the adjacent pair with the lowest merge rank, leftmost on ties,
 *      merges until no pair has a rank. With ignore_merges ("llama-bpe") a
 *      piece whose byte-level text is itself a token is that token, merges
 *      or not.
 *
 * The character classes come from the PCRE2 library's Unicode tables. Against
 * llama.cpp's own tables (Debian's PCRE2 10.42 vs llama.cpp in 2025) they
 * differ only for scripts added in Unicode 15 and for U+180E, which PCRE2
 * still counts as whitespace. */
#include "engine/text/tokenizer_int.h"

#include <stdlib.h>
#include <string.h>

#include "base/err.h"
#include "base/utf8.h"

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
static const tok_pre PRE[] = {
    {"smollm", SPLIT_DIGIT, SPLIT_GPT2, 0, 0},
    {"gpt2", NULL, SPLIT_GPT2, 0, 0},
    {"qwen2", NULL, SPLIT_QWEN2, 0, 0},
    {"llama-bpe", NULL, SPLIT_LLAMA3, 1, 1},
};
#define PRE_NAMES "\"smollm\", \"gpt2\", \"qwen2\" and \"llama-bpe\""

#define BPE_MERGE_EMPTY UINT64_MAX

/* ------------------------------------------------------------------------
 * The GPT-2 byte-level alphabet. */

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

/* The byte-level char of byte b as UTF-8 into out; returns its length. */
static size_t byte_char(int b, char *out)
{
    uint32_t cp = byte_to_cp(b);
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    /* The byte-level alphabet stops at U+0143, so two bytes are enough here. */
    out[0] = (char)(0xC0 | (cp >> 6));
    out[1] = (char)(0x80 | (cp & 0x3F));
    return 2;
}

int bpe_decode_text(const uint8_t *s, uint32_t n, uint8_t *out, uint32_t *out_len)
{
    uint32_t k = 0, o = 0;
    while (k < n) {
        uint32_t cp = 0;
        size_t len = utf8_decode(s + k, n - k, &cp);
        if (len == 0 || len > 2) /* the alphabet stops at U+0143 */
            return 0;
        int b = cp_to_byte(cp);
        if (b < 0)
            return 0;
        out[o++] = (uint8_t)b;
        k += (uint32_t)len;
    }
    *out_len = o;
    return 1;
}

void bpe_byte_tokens(tok_tokenizer *t)
{
    for (int b = 0; b < 256; b++) {
        char s[2];
        size_t n = byte_char(b, s);
        t->byte_tok[b] = tok_vocab_find(t, s, n);
    }
}

/* ------------------------------------------------------------------------
 * The merge table: (left id, right id) -> rank and merged token. */

static uint64_t hash_u64(uint64_t x)
{
    x ^= x >> 33; /* murmur3 finalizer: the ids' low bits alone cluster badly */
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    x ^= x >> 33;
    return x;
}

/* Rank and result of merging tokens a and b; 0 if they do not merge. */
static int merge_find(const tok_tokenizer *t, int32_t a, int32_t b, int32_t *rank, int32_t *out)
{
    uint64_t key = (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
    uint32_t mask = t->merge_cap - 1;
    for (uint32_t i = (uint32_t)hash_u64(key) & mask;; i = (i + 1) & mask) {
        if (t->merge_key[i] == BPE_MERGE_EMPTY)
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
        if (t->merge_key[i] == BPE_MERGE_EMPTY) {
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

static pcre2_code *compile_pattern(const char *pattern, int *err, PCRE2_SIZE *err_at)
{
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)pattern, PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP, err, err_at,
                                   NULL);
    /* JIT is an optional speed-up: pcre2_match uses the interpreter without it. */
    if (re)
        pcre2_jit_compile(re, PCRE2_JIT_COMPLETE);
    return re;
}

/* Only the pre-tokenizers whose behaviour is checked against llama.cpp are
 * accepted, so an unknown vocab fails loudly instead of silently tokenizing
 * differently from the model's training. */
int bpe_load_pre(tok_tokenizer *t, const gguf_file *g)
{
    gguf_str pre;
    int rc = gguf_get_str(g, "tokenizer.ggml.pre", &pre);
    if (rc == RD_ENOENT)
        return rd_fail(RD_ENOTSUP, "tokenizer: the file has no tokenizer.ggml.pre; supported pre-tokenizers are "
                                   PRE_NAMES " (regenerate the GGUF with a current converter)");
    if (rc)
        return rc;
    for (size_t i = 0; i < sizeof PRE / sizeof PRE[0] && !t->pre; i++)
        if (tok_kv_equals(pre, PRE[i].name))
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

int bpe_load_merges(tok_tokenizer *t, const gguf_file *g)
{
    const gguf_kv *kv = gguf_find_kv(g, "tokenizer.ggml.merges");
    if (!kv)
        return rd_fail(RD_EFORMAT, "tokenizer: the file has no tokenizer.ggml.merges (a gpt2 vocab needs them)");
    if (kv->type != GGUF_ARRAY || kv->arr_type != GGUF_STRING || (!kv->arr_str && kv->arr_n > 0))
        return rd_fail(RD_EFORMAT, "tokenizer: tokenizer.ggml.merges must be an array of strings");
    if (kv->arr_n > INT32_MAX / 2)
        return rd_fail(RD_EFORMAT, "tokenizer: %llu merges, expected at most %d", (unsigned long long)kv->arr_n,
                       INT32_MAX / 2);

    t->merge_cap = tok_pow2_at_least(2 * kv->arr_n);
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
        int32_t a = tok_vocab_find(t, m.ptr, nl), b = tok_vocab_find(t, sp + 1, nr);
        int32_t ab = tok_vocab_find(t, joined, nl + nr);
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

void bpe_free(tok_tokenizer *t)
{
    pcre2_code_free(t->re_split);
    pcre2_code_free(t->re_isolate);
    free(t->merge_key);
    free(t->merge_rank);
    free(t->merge_out);
}

/* ------------------------------------------------------------------------
 * Merging one piece. */

/* Queues the merge of symbol left with its successor, if the pair has one.
 * The pair is stale once either symbol holds another token: a symbol's token
 * only grows, and its successor changes only when it merges, so equal tokens
 * mean the same pair. */
static int push_pair(const tok_tokenizer *t, tok_work *w, int32_t left)
{
    if (left < 0 || w->next[left] < 0)
        return 0;
    int32_t right = w->next[left], a = w->tok[left], b = w->tok[right], rank, out;
    if (a < 0 || b < 0 || !merge_find(t, a, b, &rank, &out))
        return 0;
    return tok_heap_push(w, (tok_pair){-(double)rank, left, right, a, b});
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
    int rc = tok_work_text(w, 2 * n);
    if (rc)
        return rc;
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        k += byte_char(p[i], w->text + k);
    *id = tok_vocab_find(t, w->text, k);
    return 0;
}

/* BPE over one piece of raw bytes, appending its tokens. A byte whose
 * byte-level char is not in the vocab is dropped, as llama.cpp and Hugging
 * Face (no unk token in a gpt2 vocab) both do. */
static int bpe_piece(const tok_tokenizer *t, tok_work *w, const uint8_t *p, size_t n, tok_ids *out)
{
    if (n == 0)
        return 0;
    if (n == 1)
        return t->byte_tok[p[0]] >= 0 ? tok_ids_push(out, t->byte_tok[p[0]]) : 0;
    int rc;
    if (t->pre->ignore_merges) {
        int32_t whole;
        if ((rc = piece_token(t, w, p, n, &whole)))
            return rc;
        if (whole >= 0)
            return tok_ids_push(out, whole);
    }
    rc = tok_work_reserve(w, n);
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
        tok_pair e = tok_heap_pop(w);
        int32_t right = w->next[e.left];
        if (w->tok[e.left] != e.left_state || right < 0 || w->tok[right] != e.right_state)
            continue;
        int32_t rank = 0, merged = -1; /* always found: the pair was pushed from this table */
        merge_find(t, e.left_state, e.right_state, &rank, &merged);
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
        if (w->tok[i] >= 0 && (rc = tok_ids_push(out, w->tok[i])))
            return rc;
    return 0;
}

/* ------------------------------------------------------------------------
 * Pre-tokenization. */

static int pcre_fail(int code)
{
    char msg[128];
    pcre2_get_error_message(code, (PCRE2_UCHAR *)msg, sizeof msg);
    return rd_fail(RD_ENOMEM, "tokenizer: the split pattern failed to match (PCRE2: %s)", msg);
}

/* Splits s[0..len) with the pre-tokenizer's pattern and runs BPE on each
 * piece. The subject is exactly this fragment, so (?!\S) at its end sees the
 * end of the text, not the digit or special token that follows it. */
static int split_pieces(const tok_tokenizer *t, tok_work *w, const char *s, size_t len, tok_ids *out)
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

/* For smollm every \p{N} char is a piece, and the GPT-2 pattern runs
 * separately on each stretch between them (llama.cpp applies its regex list
 * in sequence like this). */
int bpe_encode(const tok_tokenizer *t, tok_work *w, const char *s, size_t len, tok_ids *out)
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
