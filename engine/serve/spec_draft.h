/* spec_draft.h - the drafter interface of speculative decoding.
 *
 * A drafter guesses the tokens that follow a sequence. Its guesses cost only
 * time: the verifier (spec_verify.h) runs them and the sampler keeps a draft
 * token only where its own draw, made exactly as without speculation, equals
 * it. So a drafter may be wrong, slow to learn or stateful; it cannot change
 * an output. The n-gram drafter (spec_ngram.h) is the first; a draft model or
 * an MTP head is another implementation of the same struct, and the engine
 * calls nothing else. */
#ifndef RD_SPEC_DRAFT_H
#define RD_SPEC_DRAFT_H

#include <stdint.h>

/* A run of token ids. */
typedef struct {
    const int32_t *ids;         /* [n] */
    int32_t n;
} spec_tokens;

/* What a drafter sees of one sequence. */
typedef struct {
    spec_tokens self;           /* the sequence so far: prompt, then generated tokens */
    int32_t n_prompt;           /* of which the prompt */
    const spec_tokens *siblings;/* [n_siblings] the other samples of its group (same prompt), so far */
    int32_t n_siblings;
} spec_draft_ctx;

typedef struct spec_drafter spec_drafter;
struct spec_drafter {
    const char *name;
    /* Writes up to max_draft (>= 1) guesses of the tokens after ctx->self
     * into out[], most likely continuation first; returns how many (0: no
     * guess), or < 0 on an error. */
    int32_t (*draft)(spec_drafter *d, const spec_draft_ctx *ctx, int32_t max_draft, int32_t *out);
    void (*destroy)(spec_drafter *d);
};

#endif
