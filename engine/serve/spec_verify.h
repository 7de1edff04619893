/* spec_verify.h - the verify forward of speculative decoding.
 *
 * A sequence with K/V for its first n_ctx tokens runs its next n_rows
 * tokens (the last sampled token, then the drafted ones) in one forward
 * against the paged KV, like a prefill chunk, and gets logits at every one
 * of those positions. The runner computes each row with an order fixed by
 * that row alone (backend.h's determinism contract: GEMM rows independent of
 * M, attention per query over keys 0..pos in the same partitions whether the
 * step is a prefill, a decode or a mix), so row j's logits equal, bit for
 * bit, those of the j-th of n_rows single-token decode steps; the sampler
 * then draws from them exactly as without speculation. tests/unit/test_spec.c
 * holds the runner to that.
 *
 * Rejected rows leave their K/V in slots past the accepted context. Nothing
 * reads them (a row attends to positions <= its own, and ctx_len bounds the
 * context), and the next step overwrites them: rolling back is only moving
 * the sequence's n_computed back, and giving back blocks it no longer needs. */
#ifndef RD_SPEC_VERIFY_H
#define RD_SPEC_VERIFY_H

#include <stdint.h>

#include "engine/model/runner.h"

/* One sequence's part of a verify step. */
typedef struct {
    const int32_t *tokens;      /* [n_rows] the tokens at positions n_ctx .. n_ctx + n_rows - 1 */
    int32_t n_ctx;              /* tokens whose K/V are in the cache already (>= 0) */
    int32_t n_rows;             /* rows to run (>= 1): 1 + drafted tokens */
    const int32_t *blocks;      /* [n_blocks] block table: its slots cover n_ctx + n_rows tokens */
    int32_t n_blocks;
} spec_verify_seq;

/* Runs the rows of seqs[0..n) in one forward (sequence order, positions
 * ascending), writing their K/V, and fills logits_host with one row of the
 * vocabulary per row, in that order (sum of n_rows rows; logits_host NULL:
 * they stay in the backend for runner_sample, logit row = the same index).
 * RD_EINVAL for a bad shape, RD_ERANGE when the rows exceed the runner's
 * max_rows or max_logits, or a block table is short. */
int spec_verify_forward(runner *r, const spec_verify_seq *seqs, int32_t n, float *logits_host);

#endif
