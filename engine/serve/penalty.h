/* penalty.h - the edits one draw applies to its logits (samp_edit, sampler.h):
 * logit_bias, min_tokens' mask of the stop tokens, and the repetition,
 * frequency and presence penalties, built from the sequence's own tokens at the
 * position being drawn.
 *
 * Built afresh for every draw rather than kept as running counts: a
 * sequence's tokens are all there is to know, so the n samples of a request
 * (each its own tokens), a preempted and recomputed sequence (its tokens kept)
 * and a draft position (the drafts before it counted as generated, as they
 * would be once accepted) get exactly the edits a plain decode step would give
 * them. The cost is one pass over the prompt (repetition penalty) and the
 * output per draw, paid only by requests that ask for an edit. */
#ifndef RD_PENALTY_H
#define RD_PENALTY_H

#include <stdint.h>

#include "engine/serve/sampler.h"
#include "engine/serve/seq.h"

/* A token -> list position index over the vocabulary, all -1 between builds. */
typedef struct {
    int32_t vocab;
    int32_t *slot;              /* [vocab] */
} pen_index;

int pen_index_init(pen_index *ix, int32_t vocab);
void pen_index_free(pen_index *ix);

/* Whether draws of q's sequences carry edits (a penalty, a bias or min_tokens). */
int pen_wanted(const seq_req *q);

/* Appends the edits of s's draw of the token at position pos to (*list)[*n..],
 * growing *list (capacity *cap) as needed. pos >= s->n_tokens: the drafts
 * s->draft[0 .. pos - s->n_tokens) count as generated. 0 or RD_ENOMEM. */
int pen_build(pen_index *ix, const seq *s, int32_t pos, samp_edit **list, int32_t *n, int32_t *cap);

#endif
