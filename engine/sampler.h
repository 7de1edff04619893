/* sampler.h - token selection and log-probs from fp32 logits.
 *
 * Randomness comes from a counter-based generator keyed by (seed, sample
 * index, position): the draw for a position does not depend on what else ran
 * before it, so preemption, batching and arrival order cannot change it. */
#ifndef RD_SAMPLER_H
#define RD_SAMPLER_H

#include <stdint.h>

typedef struct {
    float temperature;          /* 0 = greedy (argmax); > 0 scales logits */
    int32_t top_k;              /* 0 = off; keep the k highest */
    float top_p;                /* 1 = off; keep the smallest set with mass >= top_p */
    float min_p;                /* 0 = off; keep p >= min_p * p_max */
    uint64_t seed;
    int32_t logprobs_topk;      /* alternatives to report per token (0..20) */
    int processed_logprobs;     /* also report log-prob after temperature/top-k/top-p/min-p */
} samp_params;

typedef struct {
    int32_t token;
    float logprob;              /* raw: log softmax(logits) at temperature 1 */
    float logprob_processed;    /* after temperature and truncation (renormalised); NAN if not asked */
    int32_t n_top;              /* entries used in top_ids/top_logprobs */
    int32_t top_ids[20];        /* highest raw log-probs, descending */
    float top_logprobs[20];
} samp_result;

/* Defaults: temperature 1, top_k 0, top_p 1, min_p 0, seed 0, no extras. */
samp_params samp_default(void);

/* Checks ranges (temperature finite and >= 0, top_p in (0,1], min_p in [0,1],
 * top_k >= 0, logprobs_topk in 0..20). */
int samp_validate(const samp_params *p);

/* Uniform double in [0,1) from (seed, sample index, position); a pure function. */
double samp_uniform(uint64_t seed, uint32_t sample_idx, uint32_t pos);

/* Chooses a token from logits[vocab] (not modified). scratch must hold
 * 2*vocab floats + vocab ints (samp_scratch_bytes). Deterministic given its inputs. */
size_t samp_scratch_bytes(int32_t vocab);
int samp_sample(const samp_params *p, const float *logits, int32_t vocab,
                uint32_t sample_idx, uint32_t pos, void *scratch, samp_result *out);

#endif
