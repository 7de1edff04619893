/* spec_ngram.c - the n-gram drafter (see spec_ngram.h). */
#include "engine/serve/spec_ngram.h"

#include <stdlib.h>

#include "base/err.h"

typedef struct {
    spec_drafter base;          /* first: a spec_drafter * is a spec_ngram * */
    spec_ngram_params p;
} spec_ngram;

spec_ngram_params spec_ngram_default(void) { return (spec_ngram_params){.min_match = 2, .max_match = 8}; }

/* The best match so far: its length, continuation, source rank and end. */
typedef struct {
    int32_t len;                /* suffix tokens matched (0: none yet) */
    int32_t cont;               /* continuation tokens offered, capped at max_draft */
    int32_t rank;               /* 0 = the sequence itself, 1 + i = sibling i */
    int32_t end;                /* index in src of the match's last token */
    const int32_t *src;
} ngram_best;

/* Rule 1-4 of spec_ngram.h as one order: a beats b. */
static int better(const ngram_best *a, const ngram_best *b)
{
    if (a->len != b->len)
        return a->len > b->len;
    if (a->cont != b->cont)
        return a->cont > b->cont;
    if (a->rank != b->rank)
        return a->rank < b->rank;
    return a->end > b->end;
}

/* Every end position j in src[0..limit) that has a continuation in
 * src[0..n_src): the suffix tokens it matches, backwards from j. */
static void scan(const spec_ngram *g, const int32_t *src, int32_t n_src, int32_t limit, int32_t rank,
                 const spec_tokens *self, int32_t max_draft, ngram_best *best)
{
    const int32_t *suf = self->ids + self->n - 1; /* suf[-k] is the suffix's k-th token from the end */
    const int32_t max_m = g->p.max_match < self->n ? g->p.max_match : self->n;
    for (int32_t j = 0; j < limit; j++) {
        if (src[j] != suf[0])
            continue;
        int32_t m = 1;
        while (m < max_m && m <= j && src[j - m] == suf[-m])
            m++;
        if (m < g->p.min_match)
            continue;
        int32_t cont = n_src - 1 - j;
        ngram_best c = {m, cont < max_draft ? cont : max_draft, rank, j, src};
        if (best->len == 0 || better(&c, best))
            *best = c;
    }
}

static int32_t ngram_draft(spec_drafter *d, const spec_draft_ctx *ctx, int32_t max_draft, int32_t *out)
{
    const spec_ngram *g = (const spec_ngram *)d;
    if (!ctx || !out || max_draft < 1)
        return rd_fail(RD_EINVAL, "spec_ngram: need a context, an output and max_draft >= 1");
    const spec_tokens *self = &ctx->self;
    if (self->n < g->p.min_match)
        return 0;
    ngram_best best = {0};
    /* In itself: matches ending before its last token (that one is the suffix). */
    scan(g, self->ids, self->n, self->n - 1, 0, self, max_draft, &best);
    for (int32_t i = 0; i < ctx->n_siblings; i++) {
        const spec_tokens *s = &ctx->siblings[i];
        if (s->n > 1)
            scan(g, s->ids, s->n, s->n - 1, 1 + i, self, max_draft, &best);
    }
    if (best.len == 0)
        return 0;
    for (int32_t i = 0; i < best.cont; i++)
        out[i] = best.src[best.end + 1 + i];
    return best.cont;
}

static void ngram_destroy(spec_drafter *d) { free(d); }

int spec_ngram_create(const spec_ngram_params *p, spec_drafter **out)
{
    *out = NULL;
    if (!p || p->min_match < 1 || p->max_match < p->min_match || p->max_match > 64)
        return rd_fail(RD_EINVAL, "spec_ngram: match lengths %d..%d must satisfy 1 <= min <= max <= 64",
                       p ? p->min_match : 0, p ? p->max_match : 0);
    spec_ngram *g = calloc(1, sizeof *g);
    if (!g)
        return rd_fail(RD_ENOMEM, "spec_ngram: out of memory");
    g->base = (spec_drafter){.name = "ngram", .draft = ngram_draft, .destroy = ngram_destroy};
    g->p = *p;
    *out = &g->base;
    return 0;
}
