/* sampler.h - token selection and log-probs from fp32 logits.
 *
 * Randomness comes from a counter-based generator keyed by (seed, sample
 * index, position): the draw for a position does not depend on what else ran
 * before it, so preemption, batching and arrival order cannot change it. */
#ifndef RD_SAMPLER_H
#define RD_SAMPLER_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>

typedef struct {
    float temperature;          /* 0 = greedy (argmax); > 0 scales logits */
    int32_t top_k;              /* 0 = off; keep the k highest */
    float top_p;                /* 1 = off; keep the smallest set with mass >= top_p */
    float min_p;                /* 0 = off; keep p >= min_p * p_max */
    float repetition_penalty;   /* 1 = off; > 0: a seen token's logit x becomes x / r (x > 0) or x * r */
    float frequency_penalty;    /* 0 = off; -2..2: minus this times the token's count in the output */
    float presence_penalty;     /* 0 = off; -2..2: minus this once if the token is in the output */
    uint64_t seed;
    int32_t logprobs_topk;      /* alternatives to report per token (0..20) */
    int processed_logprobs;     /* also report log-prob after temperature/top-k/top-p/min-p */
    int32_t n_want;             /* 0..SAMP_MAX_WANT token ids whose raw log-probs to report at every draw or
                                   score (SGLang's token_ids_logprob) */
    const int32_t *want_ids;    /* [n_want] ids in 0..vocab-1 (repeats allowed), or NULL when n_want is 0 */
} samp_params;

/* Most token ids a request may ask the log-probs of (samp_params.want_ids). */
#define SAMP_MAX_WANT 32

typedef struct {
    int32_t token;
    float logprob;              /* raw: log softmax(logits) at temperature 1 */
    float logprob_processed;    /* after temperature and truncation (renormalised); NAN if not
                                   asked; 0 for greedy (a point mass on the argmax) */
    int32_t n_top;              /* entries used in top_ids/top_logprobs:
                                   min(logprobs_topk, finite logits) */
    int32_t top_ids[20];        /* highest raw log-probs, descending, ties to the lower id */
    float top_logprobs[20];
    int32_t rank;               /* samp_score only (0 otherwise): tokens whose raw logit is >= the token's, itself
                                   included (vLLM's rank: 1 = the most likely) */
    float want_lps[SAMP_MAX_WANT]; /* [p->n_want] raw log-probs of p->want_ids, computed as the sampled token's */
} samp_result;

/* One token's edit before the draw: what vLLM's logits processors and
 * penalties do to its logit, in vLLM's order (vllm/v1/sample/sampler.py):
 * logit_bias, the min-tokens mask, then the repetition penalty (prompt or
 * output), the frequency and the presence penalty (output counts). A
 * request's edits for one draw list each token at most once; tokens not
 * listed keep their logit (every penalty is the identity on them). */
typedef struct {
    int32_t token;              /* 0..vocab-1 */
    int32_t n_out;              /* times it was generated before this position */
    uint8_t seen;               /* 1: in the prompt or generated (the repetition penalty applies) */
    uint8_t mask;               /* 1: -inf (an EOS or stop token before min_tokens are generated) */
    uint16_t pad;
    float bias;                 /* logit_bias, added first; 0 = none */
} samp_edit;

/* The edited logit, in fp32 with each operation rounded (no contraction;
 * the CUDA copy in kernels/cuda/cuda_math.h is the same expression):
 *   x + bias; -inf if masked; x / r or x * r if seen; - f * n_out; - p if n_out > 0.
 * Division, not a multiply by 1/r: vLLM's CUDA kernel divides. */
static inline float samp_edit_logit(float x, const samp_edit *ed, const samp_params *p)
{
    x = x + ed->bias;
    if (ed->mask)
        x = -INFINITY;
    if (ed->seen)
        x = x > 0.0f ? x / p->repetition_penalty : x * p->repetition_penalty;
    x = x - p->frequency_penalty * (float)ed->n_out;
    if (ed->n_out > 0)
        x = x - p->presence_penalty;
    return x;
}

/* proc[vocab] = logits with edits[n_edits] applied (proc may be logits). */
void samp_apply_edits(const samp_params *p, const float *logits, int32_t vocab, const samp_edit *edits,
                      int32_t n_edits, float *proc);

/* Defaults: temperature 1, top_k 0, top_p 1, min_p 0, no penalties, seed 0, no extras. */
samp_params samp_default(void);

/* Checks ranges (temperature finite and >= 0, top_p in (0,1], min_p in [0,1],
 * top_k >= 0, repetition_penalty finite and > 0, frequency and presence
 * penalties in [-2, 2], logprobs_topk in 0..20). */
int samp_validate(const samp_params *p);

/* Uniform double in [0,1) from (seed, sample index, position); a pure function:
 * Philox4x32-10 with key {seed lo, seed hi}, counter {sample_idx, pos, 0, 0},
 * u = ((out[1] << 32 | out[0]) >> 11) * 2^-53 (sampler.c has the details). */
double samp_uniform(uint64_t seed, uint32_t sample_idx, uint32_t pos);

/* The Philox4x32-10 block function (Random123's philox4x32_R(10, ctr, key)),
 * exposed for known-answer tests and for checking the CUDA copy against it. */
void samp_philox4x32_10(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4]);

/* Chooses a token from logits[vocab] (not modified), vocab in 1..2^30.
 * Logits must be finite or -inf (a masked token: never chosen, never listed
 * in top_ids), at least one finite. scratch must hold samp_scratch_bytes(vocab)
 * bytes (about 12 per token; 0 means vocab is out of range), 8-byte aligned as
 * malloc returns; its contents on entry do not matter. No allocation.
 * Deterministic given its inputs. The draw walks the kept tokens in ascending
 * index order (inverse CDF); sampler.c states the exact rules. */
size_t samp_scratch_bytes(int32_t vocab);
int samp_sample(const samp_params *p, const float *logits, int32_t vocab,
                uint32_t sample_idx, uint32_t pos, void *scratch, samp_result *out);
/* The same with the edits applied: proc[vocab] is logits after
 * samp_apply_edits (NULL or logits itself: no edits). The draw, the
 * processed log-prob and greedy's argmax come from proc; the raw log-prob
 * and the alternatives from logits (vLLM's raw_logprobs: before any
 * processing). With proc NULL this is samp_sample, bit for bit. */
int samp_sample_ex(const samp_params *p, const float *logits, const float *proc, int32_t vocab,
                   uint32_t sample_idx, uint32_t pos, void *scratch, samp_result *out);
/* Scoring: the raw log-prob of a given token (and p's alternatives) from
 * logits, by exactly the steps samp_sample takes, so a token scored here has
 * the bits it has when samp_sample draws it from the same logits; and its
 * rank. No draw. With p->processed_logprobs, logprob_processed is what a draw
 * of it with p (no edits) would report: the same kept set and mass, -inf for
 * a token the set drops (greedy: 0 for the argmax, -inf otherwise); else NAN. */
int samp_score(const samp_params *p, const float *logits, int32_t vocab, int32_t token, void *scratch,
               samp_result *out);

#endif
