/* runner.c - the forward pass (see runner.h). Data flow per step:
 * embed -> for each layer [rmsnorm -> qkv -> rope -> kv_write -> attention ->
 * o (+residual) -> rmsnorm -> gate_up -> swiglu -> down (+residual)] ->
 * gather logit rows -> rmsnorm -> lm_head -> host. */
#include "engine/runner.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine/err.h"

static void *balloc(rd_backend *be, size_t bytes, int *failed)
{
    void *p = be->ops->alloc(be, bytes ? bytes : 1);
    if (!p)
        *failed = 1;
    return p;
}

int runner_init(runner *r, model *m, int32_t n_blocks, int32_t block_size, int32_t max_rows,
                int32_t max_logits)
{
    memset(r, 0, sizeof *r);
    const model_config *c = &m->cfg;
    if (n_blocks <= 0 || block_size <= 0 || max_rows <= 0 || max_logits <= 0)
        return rd_fail(RD_EINVAL, "runner: blocks %d, block size %d, rows %d, logits %d must be positive",
                       n_blocks, block_size, max_rows, max_logits);
    r->m = m;
    r->be = m->be;
    r->attn = (rd_attn_shape){c->n_heads, c->n_kv_heads, c->head_dim, block_size,
                              (float)(1.0 / sqrt((double)c->head_dim))};
    r->n_blocks = n_blocks;
    r->max_rows = max_rows;
    r->max_logits = max_logits;
    rd_backend *be = r->be;
    int failed = 0;
    size_t rows = (size_t)max_rows;
    size_t qkv_dim = (size_t)(c->n_heads + 2 * c->n_kv_heads) * c->head_dim;
    r->x = balloc(be, rows * c->dim * sizeof(float), &failed);
    r->xn = balloc(be, rows * c->dim * sizeof(float), &failed);
    r->qkv = balloc(be, rows * qkv_dim * sizeof(float), &failed);
    r->att = balloc(be, rows * c->n_heads * c->head_dim * sizeof(float), &failed);
    r->gu = balloc(be, rows * 2 * c->ffn_dim * sizeof(float), &failed);
    r->ff = balloc(be, rows * c->ffn_dim * sizeof(float), &failed);
    r->sel = balloc(be, (size_t)max_logits * c->dim * sizeof(float), &failed);
    r->logits = balloc(be, (size_t)max_logits * c->vocab * sizeof(float), &failed);
    r->logit_rows_dev = balloc(be, (size_t)max_logits * sizeof(int32_t), &failed);
    r->cow_dev = balloc(be, 2 * rows * sizeof(int32_t), &failed);
    r->k_cache = calloc((size_t)c->n_layers, sizeof(float *));
    r->v_cache = calloc((size_t)c->n_layers, sizeof(float *));
    if (!r->k_cache || !r->v_cache)
        failed = 1;
    size_t layer_bytes = (size_t)n_blocks * c->n_kv_heads * block_size * c->head_dim * sizeof(float);
    for (int32_t l = 0; l < c->n_layers && !failed; l++) {
        r->k_cache[l] = balloc(be, layer_bytes, &failed);
        r->v_cache[l] = balloc(be, layer_bytes, &failed);
    }
    if (failed) {
        runner_free(r);
        return rd_fail(RD_ENOMEM, "runner: cannot allocate KV cache (%d blocks, %zu bytes per layer) or "
                       "activations for %d rows", n_blocks, 2 * layer_bytes, max_rows);
    }
    return 0;
}

void runner_free(runner *r)
{
    if (!r->be)
        return;
    rd_backend *be = r->be;
    void *bufs[] = {r->x, r->xn, r->qkv, r->att, r->gu, r->ff, r->sel, r->logits, r->logit_rows_dev, r->cow_dev};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        if (bufs[i])
            be->ops->free(be, bufs[i]);
    for (int32_t l = 0; r->k_cache && l < r->m->cfg.n_layers; l++) {
        if (r->k_cache[l]) be->ops->free(be, r->k_cache[l]);
        if (r->v_cache && r->v_cache[l]) be->ops->free(be, r->v_cache[l]);
    }
    free(r->k_cache);
    free(r->v_cache);
    memset(r, 0, sizeof *r);
}

int runner_copy_blocks(runner *r, const int32_t *src, const int32_t *dst, int32_t n)
{
    if (n <= 0)
        return 0;
    if (n > r->max_rows)
        return rd_fail(RD_ERANGE, "runner: %d block copies in one step exceed %d", n, r->max_rows);
    rd_backend *be = r->be;
    int rc = be->ops->h2d(be, r->cow_dev, src, (size_t)n * sizeof(int32_t));
    if (!rc)
        rc = be->ops->h2d(be, r->cow_dev + r->max_rows, dst, (size_t)n * sizeof(int32_t));
    if (rc)
        return rc;
    for (int32_t l = 0; l < r->m->cfg.n_layers; l++)
        be->ops->copy_blocks(be, &r->attn, r->k_cache[l], r->v_cache[l], r->cow_dev, r->cow_dev + r->max_rows, n);
    return 0;
}

int runner_forward(runner *r, const rd_step *s, const int32_t *logit_rows, int32_t n_logits, float *logits_host)
{
    const model *m = r->m;
    const model_config *c = &m->cfg;
    rd_backend *be = r->be;
    const rd_backend_ops *op = be->ops;
    const int32_t M = s->n_rows;
    if (M <= 0 || M > r->max_rows || n_logits < 0 || n_logits > r->max_logits)
        return rd_fail(RD_ERANGE, "runner: step of %d rows / %d logits exceeds %d / %d", M, n_logits,
                       r->max_rows, r->max_logits);
    for (int32_t i = 0; i < M; i++)
        if (s->positions[i] < 0 || s->positions[i] >= c->max_ctx)
            return rd_fail(RD_ERANGE, "runner: position %d outside the context of %d", s->positions[i], c->max_ctx);

    rd_step_dev sd;
    int rc = op->step_upload(be, s, &sd);
    if (rc)
        return rc;
    const int32_t hd = c->head_dim, nh = c->n_heads, nkv = c->n_kv_heads;
    const int32_t qkv_dim = (nh + 2 * nkv) * hd;

    op->embed(be, m->embed, sd.token_ids, M, r->x);
    for (int32_t l = 0; l < c->n_layers; l++) {
        const model_layer *L = &m->layers[l];
        op->rmsnorm(be, r->x, L->attn_norm, M, c->dim, c->norm_eps, r->xn);
        op->linear(be, L->qkv, r->xn, M, r->qkv, 0);
        op->rope(be, r->qkv, qkv_dim, M, nh, hd, sd.positions, m->rope);
        op->rope(be, r->qkv + nh * hd, qkv_dim, M, nkv, hd, sd.positions, m->rope);
        op->kv_write(be, &r->attn, r->qkv + nh * hd, r->qkv + (nh + nkv) * hd, qkv_dim, &sd,
                     r->k_cache[l], r->v_cache[l]);
        op->attention(be, &r->attn, r->qkv, qkv_dim, &sd, r->k_cache[l], r->v_cache[l], r->att);
        op->linear(be, L->o, r->att, M, r->x, 1);
        op->rmsnorm(be, r->x, L->ffn_norm, M, c->dim, c->norm_eps, r->xn);
        op->linear(be, L->gate_up, r->xn, M, r->gu, 0);
        op->swiglu(be, r->gu, M, c->ffn_dim, r->ff);
        op->linear(be, L->down, r->ff, M, r->x, 1);
    }
    if (n_logits == 0)
        return op->sync(be);
    if ((rc = op->h2d(be, r->logit_rows_dev, logit_rows, (size_t)n_logits * sizeof(int32_t))))
        return rc;
    op->gather_rows(be, r->x, r->logit_rows_dev, n_logits, c->dim, r->xn);
    op->rmsnorm(be, r->xn, m->out_norm, n_logits, c->dim, c->norm_eps, r->sel);
    op->linear(be, m->lm_head, r->sel, n_logits, r->logits, 0);
    rc = op->d2h(be, logits_host, r->logits, (size_t)n_logits * c->vocab * sizeof(float));
    if (!rc)
        rc = op->sync(be);
    return rc;
}
