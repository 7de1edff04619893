/* spec_verify.c - the verify forward (see spec_verify.h): one rd_step whose
 * sequences each run a chunk of rows, every row a logit row. */
#include "engine/serve/spec_verify.h"

#include <stdlib.h>

#include "base/err.h"

int spec_verify_forward(runner *r, const spec_verify_seq *seqs, int32_t n, float *logits_host)
{
    if (!r || !seqs || n <= 0)
        return rd_fail(RD_EINVAL, "spec_verify: need a runner and at least one sequence");
    const int32_t bs = r->attn.block_size;
    int64_t rows = 0;
    int32_t max_blocks = 1;
    for (int32_t i = 0; i < n; i++) {
        const spec_verify_seq *v = &seqs[i];
        if (!v->tokens || !v->blocks || v->n_rows < 1 || v->n_ctx < 0)
            return rd_fail(RD_EINVAL, "spec_verify: sequence %d has no tokens or blocks, or %d rows after %d",
                           i, v->n_rows, v->n_ctx);
        if ((int64_t)v->n_blocks * bs < (int64_t)v->n_ctx + v->n_rows)
            return rd_fail(RD_ERANGE, "spec_verify: sequence %d: %d blocks of %d cannot hold %d + %d tokens", i,
                           v->n_blocks, bs, v->n_ctx, v->n_rows);
        rows += v->n_rows;
        if (v->n_blocks > max_blocks)
            max_blocks = v->n_blocks;
    }
    if (rows > r->max_rows || rows > r->max_logits)
        return rd_fail(RD_ERANGE, "spec_verify: %lld rows exceed the runner's %d rows / %d logit rows",
                       (long long)rows, r->max_rows, r->max_logits);
    const int32_t M = (int32_t)rows;
    int32_t *tok = malloc(sizeof(int32_t) * M), *pos = malloc(sizeof(int32_t) * M);
    int32_t *slot = malloc(sizeof(int32_t) * M), *logit_rows = malloc(sizeof(int32_t) * M);
    int32_t *q_start = malloc(sizeof(int32_t) * (n + 1)), *ctx = malloc(sizeof(int32_t) * n);
    int32_t *tables = calloc((size_t)n * max_blocks, sizeof(int32_t));
    int rc = tok && pos && slot && logit_rows && q_start && ctx && tables
                 ? 0
                 : rd_fail(RD_ENOMEM, "spec_verify: out of memory for %d rows", M);
    if (!rc) {
        int32_t m = 0;
        for (int32_t i = 0; i < n; i++) {
            const spec_verify_seq *v = &seqs[i];
            q_start[i] = m;
            for (int32_t j = 0; j < v->n_rows; j++, m++) {
                const int32_t p = v->n_ctx + j;
                tok[m] = v->tokens[j];
                pos[m] = p;
                slot[m] = v->blocks[p / bs] * bs + p % bs;
                logit_rows[m] = m;
            }
            ctx[i] = v->n_ctx + v->n_rows;
            for (int32_t b = 0; b < v->n_blocks; b++)
                tables[(size_t)i * max_blocks + b] = v->blocks[b];
        }
        q_start[n] = m;
        const rd_step s = {.n_rows = M, .n_seqs = n, .max_blocks = max_blocks, .token_ids = tok,
                           .positions = pos, .slots = slot, .q_start = q_start, .ctx_len = ctx,
                           .block_tables = tables};
        rc = runner_forward(r, &s, logit_rows, M, logits_host);
    }
    free(tok), free(pos), free(slot), free(logit_rows), free(q_start), free(ctx), free(tables);
    return rc;
}
