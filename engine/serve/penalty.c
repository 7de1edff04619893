/* penalty.c - a draw's logit edits from its sequence's tokens (penalty.h). */
#include "engine/serve/penalty.h"

#include <stdlib.h>
#include <string.h>

#include "base/err.h"

int pen_index_init(pen_index *ix, int32_t vocab)
{
    ix->vocab = vocab;
    ix->slot = malloc(sizeof(int32_t) * (size_t)vocab);
    if (!ix->slot)
        return rd_fail(RD_ENOMEM, "penalties: cannot allocate a %d-token index", vocab);
    memset(ix->slot, 0xff, sizeof(int32_t) * (size_t)vocab);
    return 0;
}

void pen_index_free(pen_index *ix)
{
    free(ix->slot);
    ix->slot = NULL;
}

int pen_wanted(const seq_req *q)
{
    return q->sp.repetition_penalty != 1.0f || q->sp.frequency_penalty != 0.0f || q->sp.presence_penalty != 0.0f ||
           q->n_bias > 0 || q->min_tokens > 0;
}

typedef struct {
    pen_index *ix;
    samp_edit **list;
    int32_t *n, *cap;
    int32_t base;               /* this draw's first entry in *list */
} builder;

/* The entry of token t in this draw's list, added zeroed when new; NULL when memory runs out. */
static samp_edit *entry(builder *b, int32_t t)
{
    int32_t at = b->ix->slot[t];
    if (at >= 0)
        return &(*b->list)[at];
    if (*b->n == *b->cap) {
        int32_t nc = *b->cap ? 2 * *b->cap : 1024;
        samp_edit *nl = realloc(*b->list, sizeof *nl * (size_t)nc);
        if (!nl)
            return NULL;
        *b->list = nl;
        *b->cap = nc;
    }
    samp_edit *ed = &(*b->list)[*b->n];
    memset(ed, 0, sizeof *ed);
    ed->token = t;
    b->ix->slot[t] = (*b->n)++;
    return ed;
}

static int count_generated(builder *b, int32_t t)
{
    samp_edit *ed = entry(b, t);
    if (!ed)
        return -1;
    ed->seen = 1;
    ed->n_out++;
    return 0;
}

int pen_build(pen_index *ix, const seq *s, int32_t pos, samp_edit **list, int32_t *n, int32_t *cap)
{
    const seq_req *q = s->req;
    builder b = {ix, list, n, cap, *n};
    int bad = 0;
    if (q->sp.repetition_penalty != 1.0f)
        for (int32_t i = 0; i < q->n_prompt && !bad; i++) {
            samp_edit *ed = entry(&b, s->tokens[i]);
            bad = !ed;
            if (ed)
                ed->seen = 1;
        }
    if (q->sp.repetition_penalty != 1.0f || q->sp.frequency_penalty != 0.0f || q->sp.presence_penalty != 0.0f) {
        const int32_t n_tok = pos < s->n_tokens ? pos : s->n_tokens;
        for (int32_t i = q->n_prompt; i < n_tok && !bad; i++)
            bad = count_generated(&b, s->tokens[i]);
        for (int32_t j = 0; j < pos - s->n_tokens && j < s->n_draft && !bad; j++)
            bad = count_generated(&b, s->draft[j]);
    }
    for (int32_t i = 0; i < q->n_bias && !bad; i++) {
        samp_edit *ed = entry(&b, q->bias_ids[i]);
        bad = !ed;
        if (ed)
            ed->bias = q->bias_vals[i];
    }
    if (pos - q->n_prompt < q->min_tokens)
        for (int32_t i = 0; i < q->n_stop && !bad; i++) {
            samp_edit *ed = entry(&b, q->stop_ids[i]);
            bad = !ed;
            if (ed)
                ed->mask = 1;
        }
    for (int32_t i = b.base; i < *n; i++)
        ix->slot[(*list)[i].token] = -1;
    if (bad) {
        *n = b.base;
        return rd_fail(RD_ENOMEM, "penalties: cannot grow the edit list past %d entries", *cap);
    }
    return 0;
}
