/* tok_base.c - what the tokenizer's files share, below all of them: the
 * vocabulary's lookup (token text -> id), the id list an encode call appends
 * to, and its scratch space (symbols and the merge heap BPE and SPM both use).
 *
 * tokenizer.c loads the vocabulary and dispatches each stretch of text to
 * bpe.c or spm.c, and those two call these helpers; with the helpers in
 * tokenizer.c the files called each other in a circle (tools/check_layers.py,
 * rule calls). Nothing here calls another file of engine/text. */
#include <stdlib.h>
#include <string.h>

#include "base/err.h"
#include "base/utf8.h"
#include "engine/text/tokenizer_int.h"

/* ------------------------------------------------------------------------
 * The vocabulary: token text -> id. */

static uint64_t hash_bytes(const char *s, size_t n)
{
    uint64_t h = 0xcbf29ce484222325ull; /* FNV-1a */
    for (size_t i = 0; i < n; i++) {
        h ^= (uint8_t)s[i];
        h *= 0x100000001b3ull;
    }
    return h ^ (h >> 29);
}

uint32_t tok_pow2_at_least(uint64_t n)
{
    uint32_t c = 16;
    while (c < n)
        c <<= 1;
    return c;
}

/* The slot of the token whose text is s[0..n), or the empty slot where it
 * would go (linear probing; the table is never full). */
static uint32_t vocab_slot_of(const tok_tokenizer *t, const char *s, size_t n)
{
    uint32_t mask = t->vocab_cap - 1;
    for (uint32_t i = (uint32_t)hash_bytes(s, n) & mask;; i = (i + 1) & mask) {
        int32_t id = t->vocab_slot[i];
        if (id < 0 || (t->text_len[id] == n && memcmp(tok_text(t, id), s, n) == 0))
            return i;
    }
}

int32_t tok_vocab_find(const tok_tokenizer *t, const char *s, size_t n)
{
    return t->vocab_slot[vocab_slot_of(t, s, n)];
}

int32_t tok_vocab_insert(tok_tokenizer *t, int32_t id)
{
    uint32_t i = vocab_slot_of(t, tok_text(t, id), t->text_len[id]);
    if (t->vocab_slot[i] >= 0)
        return t->vocab_slot[i];
    t->vocab_slot[i] = id;
    return -1;
}

int tok_kv_equals(gguf_str s, const char *want)
{
    size_t n = strlen(want);
    return s.len == n && memcmp(s.ptr, want, n) == 0;
}

/* ------------------------------------------------------------------------
 * Encoding: the output list and the scratch space. */

int tok_ids_push(tok_ids *o, int32_t id)
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

int tok_ids_finish(tok_ids *o, int32_t **ids, size_t *n_ids)
{
    if (!o->v && (o->v = malloc(sizeof(int32_t))) == NULL)
        return rd_fail(RD_ENOMEM, "tokenizer: out of memory");
    *ids = o->v;
    *n_ids = o->n;
    return 0;
}

int tok_work_init(tok_work *w)
{
    memset(w, 0, sizeof *w);
    w->md = pcre2_match_data_create(1, NULL);
    if (!w->md)
        return rd_fail(RD_ENOMEM, "tokenizer: out of memory for PCRE2 match data");
    return 0;
}

void tok_work_free(tok_work *w)
{
    pcre2_match_data_free(w->md);
    free(w->sym);
    free(w->heap);
    free(w->text);
}

int tok_work_reserve(tok_work *w, size_t n)
{
    if (n <= w->sym_cap)
        return 0;
    size_t cap = n < 256 ? 256 : n;
    /* One block for the five arrays: callers fill them after reserving, so
     * nothing has to survive the move. */
    free(w->sym);
    w->sym_cap = 0;
    w->sym = malloc(5 * sizeof(int32_t) * cap);
    if (!w->sym)
        return rd_fail(RD_ENOMEM, "tokenizer: out of memory for a piece of %zu bytes", n);
    w->tok = w->sym;
    w->next = w->sym + cap;
    w->prev = w->sym + 2 * cap;
    w->sym_off = (uint32_t *)(w->sym + 3 * cap);
    w->sym_len = (uint32_t *)(w->sym + 4 * cap);
    w->sym_cap = cap;
    return 0;
}

int tok_work_text(tok_work *w, size_t n)
{
    if (n <= w->text_cap)
        return 0;
    char *p = realloc(w->text, n);
    if (!p)
        return rd_fail(RD_ENOMEM, "tokenizer: out of memory for a text of %zu bytes", n);
    w->text = p;
    w->text_cap = n;
    return 0;
}

/* a is popped before b: the higher prio, then the leftmost (llama.cpp's
 * llm_bigram_spm::comparator; its BPE queue orders by rank the same way). */
static int pair_before(const tok_pair *a, const tok_pair *b)
{
    return a->prio > b->prio || (a->prio == b->prio && a->left < b->left);
}

int tok_heap_push(tok_work *w, tok_pair p)
{
    if (w->heap_n == w->heap_cap) {
        size_t cap = w->heap_cap ? 2 * w->heap_cap : 256;
        tok_pair *h = realloc(w->heap, sizeof(tok_pair) * cap);
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

tok_pair tok_heap_pop(tok_work *w)
{
    tok_pair top = w->heap[0];
    tok_pair last = w->heap[--w->heap_n];
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

int tok_check_utf8(const char *what, const char *s, size_t len)
{
    size_t bad = utf8_invalid_at((const uint8_t *)s, len);
    if (bad < len)
        return rd_fail(RD_EINVAL, "tokenizer: %s is not valid UTF-8 at byte offset %zu (byte 0x%02x)", what, bad,
                       (uint8_t)s[bad]);
    return 0;
}
