/* spec_ngram.h - the n-gram drafter: prompt lookup over the sequence itself
 * and its group siblings.
 *
 * The last m tokens of the sequence (its suffix) are looked up in the
 * sources, the sequence's own tokens and its siblings' (their prompt is the
 * same; their outputs differ); where they occurred before, what followed is
 * the draft. Rule, in order (spec_ngram.c has the search):
 *   1. the longest match m, min_match <= m <= max_match, with at least one
 *      token after it in its source (in the sequence itself: a match ending
 *      before its last token);
 *   2. among those, the one offering the longest continuation, capped at
 *      max_draft;
 *   3. then the sequence's own tokens before the siblings (in their order);
 *   4. then the most recent occurrence (the latest end position).
 * The draft is the continuation, up to max_draft tokens. No state: the cost
 * is O(tokens * max_match) per source and call. */
#ifndef RD_SPEC_NGRAM_H
#define RD_SPEC_NGRAM_H

#include "engine/serve/spec_draft.h"

typedef struct {
    int32_t min_match;          /* shortest suffix looked up (>= 1; default 2) */
    int32_t max_match;          /* longest (min_match .. 64; default 8) */
} spec_ngram_params;

spec_ngram_params spec_ngram_default(void);
/* A drafter with params p (copied); RD_EINVAL for a range outside the above. */
int spec_ngram_create(const spec_ngram_params *p, spec_drafter **out);

#endif
