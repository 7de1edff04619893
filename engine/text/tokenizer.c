/* tokenizer.c - the tokenizers of GGUF vocabularies (see tokenizer.h): the
 * vocabulary and its lookups, special tokens, and the public tok_* API.
 *
 * Encoding runs in three stages, in data-flow order below:
 *   1. validate: the text must be UTF-8 (RFC 3629: no overlongs, surrogates or
 *      code points above U+10FFFF). Anything else is RD_EINVAL naming the byte
 *      offset: PCRE2 in UTF mode cannot match it, and the learner's tokenizer
 *      (Python str) could not have produced it either.
 *   2. special tokens: literal occurrences are cut out, longest token first, the
 *      same order llama.cpp uses; the text between them is tokenized alone.
 *   3. each stretch between them goes to the vocab's algorithm: GPT-2
 *      byte-level BPE (bpe.c, tokenizer.ggml.model "gpt2") or SentencePiece-
 *      style BPE (spm.c, "llama").
 * The chat formats are in chat_template.c.
 * The tokenizer is read-only after tok_load: encode and decode may run on many
 * threads at once (each call has its own scratch space). */
#include "engine/text/tokenizer.h"

#include <stdlib.h>
#include <string.h>

#include "base/err.h"
#include "base/utf8.h"
#include "engine/text/tokenizer_int.h"

/* One call encodes at most this much. BPE scratch takes a few tens of bytes
 * per byte of the longest piece (a run of spaces can be one piece), so the cap
 * keeps a hostile input to a few GiB; prompts are far smaller. */
#define TOK_MAX_TEXT ((size_t)64 << 20)

/* ------------------------------------------------------------------------
 * Loading. The vocabulary's lookup (token text -> id), the id lists and the
 * scratch space bpe.c and spm.c share with this file are in tok_base.c, below
 * all three. */

/* The model name: only the algorithms checked against llama.cpp are
 * accepted, so an unknown vocab fails loudly instead of silently tokenizing
 * differently from the model's training (bpe_load_pre does the same for the
 * gpt2 pre-tokenizers). */
static int load_kind(tok_tokenizer *t, const gguf_file *g)
{
    gguf_str model;
    int rc = gguf_get_str(g, "tokenizer.ggml.model", &model);
    if (rc == RD_ENOENT)
        return rd_fail(RD_ENOTSUP, "tokenizer: the file has no tokenizer.ggml.model; expected \"gpt2\" or \"llama\"");
    if (rc)
        return rc;
    if (tok_kv_equals(model, "llama")) {
        /* SentencePiece-style: llama.cpp gives it no pre-tokenizer and reads
         * no tokenizer.ggml.pre (Gemma 3 files say "default"). */
        t->spm = 1;
        return 0;
    }
    if (!tok_kv_equals(model, "gpt2"))
        return rd_fail(RD_ENOTSUP,
                       "tokenizer: tokenizer.ggml.model is \"%.*s\"; supported are \"gpt2\" (byte-level BPE) and "
                       "\"llama\" (SentencePiece-style BPE)",
                       (int)(model.len > 64 ? 64 : model.len), model.ptr);
    return bpe_load_pre(t, g);
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
    t->vocab_cap = tok_pow2_at_least(2 * (uint64_t)n);
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
        int32_t other = tok_vocab_insert(t, i);
        if (other >= 0)
            return rd_fail(RD_EFORMAT, "tokenizer: token %d has the same text as token %d (\"%.*s\")", i, other,
                           (int)(s.len > 64 ? 64 : s.len), s.ptr);
    }

    const gguf_kv *types = gguf_find_kv(g, "tokenizer.ggml.token_type");
    if (!types) {
        memset(t->type, TOK_TYPE_NORMAL, n);
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
        if (v < TOK_TYPE_NORMAL || v > TOK_TYPE_BYTE)
            return rd_fail(RD_EFORMAT, "tokenizer: token %d has type %lld, expected 1..6", i, (long long)v);
        t->type[i] = (uint8_t)v;
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
        uint32_t len;
        if (t->spm && t->type[i] == TOK_TYPE_NORMAL) {
            at += spm_decode_text(s, n, t->raw + at);
            literal = 0;
        } else if (t->type[i] == TOK_TYPE_NORMAL) {
            /* Byte-level when every char is in the alphabet; else kept as is. */
            if (bpe_decode_text(s, n, t->raw + at, &len)) {
                at += len;
                literal = 0;
            }
        } else if (t->type[i] == TOK_TYPE_BYTE && n == 6 && memcmp(s, "<0x", 3) == 0 && s[5] == '>') {
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
        if ((ty == TOK_TYPE_CONTROL || ty == TOK_TYPE_USER || ty == TOK_TYPE_UNKNOWN) && len > 0 &&
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

/* The chat markers' ids and the turn format they allow (tok_chat_kind). Read
 * here at load: chat_template.c renders the turns above this file (it calls
 * tok_encode_into), so it is not called from here. */
static void load_chat(tok_tokenizer *t, const gguf_file *g)
{
    t->im_start = tok_vocab_find(t, "<|im_start|>", 12);
    t->im_end = tok_vocab_find(t, "<|im_end|>", 10);
    t->start_header = tok_vocab_find(t, "<|start_header_id|>", 19);
    t->end_header = tok_vocab_find(t, "<|end_header_id|>", 17);
    t->eot_id = tok_vocab_find(t, "<|eot_id|>", 10);
    t->start_turn = tok_vocab_find(t, "<start_of_turn>", 15);
    t->end_turn = tok_vocab_find(t, "<end_of_turn>", 13);
    t->chat = chat_format(t, g);
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
        rc = t->spm ? spm_load_scores(t, g) : bpe_load_merges(t, g);
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

    if (t->spm)
        spm_byte_tokens(t);
    else
        bpe_byte_tokens(t);
    load_chat(t, g);
    *out = t;
    return 0;
}

void tok_free(tok_tokenizer *t)
{
    if (!t)
        return;
    bpe_free(t);
    free(t->text);
    free(t->text_off);
    free(t->text_len);
    free(t->type);
    free(t->raw);
    free(t->raw_off);
    free(t->vocab_slot);
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
 * Encoding: special tokens cut out, each stretch between them to bpe.c or
 * spm.c. */

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
        if (!parse_special && t->type[id] != TOK_TYPE_USER)
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

int tok_encode_into(const tok_tokenizer *t, tok_work *w, const char *text, size_t len, int parse_special,
                    tok_ids *out)
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
            rc = tok_ids_push(out, fr.id);
        else if (t->spm)
            rc = spm_encode(t, w, text + fr.off, fr.len, t->add_space_prefix && prev_special, out);
        else
            rc = bpe_encode(t, w, text + fr.off, fr.len, out);
        prev_special = fr.id >= 0;
    }
    free(frags.v);
    return rc;
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
    int rc = tok_check_utf8("text", text, len);
    if (rc)
        return rc;

    tok_work w;
    tok_ids out = {0};
    if ((rc = tok_work_init(&w)) == 0)
        rc = tok_encode_into(t, &w, text, len, parse_special, &out);
    tok_work_free(&w);
    if (rc == 0)
        rc = tok_ids_finish(&out, ids, n_ids);
    if (rc)
        free(out.v);
    return rc;
}

/* ------------------------------------------------------------------------
 * Decoding. */

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

int tok_is_control(const tok_tokenizer *t, int32_t id)
{
    return id >= 0 && id < t->n_vocab && t->type && t->type[id] == TOK_TYPE_CONTROL;
}
