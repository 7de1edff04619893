/* runner.c - the forward pass (see runner.h). Data flow per step:
 * embed -> for each layer the family's recipe (runner_layer_decoder: rmsnorm
 * -> qkv -> rope -> kv_write -> attention -> o (+residual) -> rmsnorm ->
 * gate_up -> swiglu -> down (+residual)) -> gather logit rows -> rmsnorm ->
 * lm_head -> host. */
#include "engine/model/runner.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/clock.h"
#include "base/err.h"
#include "engine/format/gguf.h"
#include "engine/serve/sampler.h"

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
    /* A backend without an op the family's layers use cannot run the model. */
    const rd_backend_ops *ops = m->be->ops;
    const char *missing = NULL;
    if (m->layers[0].qkv_bias && !ops->add_bias)
        missing = "add_bias";
    else if (m->layers[0].q_norm && !ops->head_rmsnorm)
        missing = "head_rmsnorm";
    else if (m->layers[0].post_attn_norm && (!ops->rmsnorm_add || !ops->geglu))
        missing = !ops->rmsnorm_add ? "rmsnorm_add" : "geglu";
    else if (c->n_experts > 0 && (!ops->moe_route || !ops->moe_ffn))
        missing = !ops->moe_route ? "moe_route" : "moe_ffn";
    if (missing)
        return rd_fail(RD_ENOTSUP, "runner: the %s backend has no %s op, which %s models need", ops->name, missing,
                       c->arch);
    r->m = m;
    r->be = m->be;
    r->attn = (rd_attn_shape){.n_heads = c->n_heads, .n_kv_heads = c->n_kv_heads, .head_dim = c->head_dim,
                              .block_size = block_size,
                              .scale = (float)(1.0 / sqrt(c->attn_scalar > 0 ? (double)c->attn_scalar
                                                                             : (double)c->head_dim)),
                              .window = 0};
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
    const size_t dense_ffn = c->n_experts > 0 ? 0 : (size_t)c->ffn_dim;   /* a MoE model's FFN is its experts */
    r->gu = balloc(be, rows * 2 * dense_ffn * sizeof(float), &failed);
    r->ff = balloc(be, rows * dense_ffn * sizeof(float), &failed);
    r->tmp = balloc(be, rows * c->dim * sizeof(float), &failed);
    r->sel = balloc(be, (size_t)max_logits * c->dim * sizeof(float), &failed);
    r->logits = balloc(be, (size_t)max_logits * c->vocab * sizeof(float), &failed);
    if (c->n_experts > 0) {
        const size_t k = (size_t)c->n_experts_used;
        r->router = balloc(be, rows * c->n_experts * sizeof(float), &failed);
        r->route_w = balloc(be, rows * k * sizeof(float), &failed);
        r->routes = balloc(be, (size_t)c->n_layers * rows * k * sizeof(int32_t), &failed);
        r->moe = calloc((size_t)c->n_layers, sizeof *r->moe);
        failed |= r->moe == NULL;
        for (int32_t l = 0; r->moe && l < c->n_layers; l++)
            r->moe[l] = (rd_moe){.n_experts = c->n_experts, .ffn = c->expert_ffn_dim, .dim = c->dim,
                                 .gate_up = m->layers[l].exp_gate_up, .down = m->layers[l].exp_down};
    }
    r->logit_rows_dev = balloc(be, (size_t)max_logits * sizeof(int32_t), &failed);
    r->cow_dev = balloc(be, 2 * rows * sizeof(int32_t), &failed);
    if (failed) {
        runner_free(r);
        return rd_fail(RD_ENOMEM, "runner: cannot allocate activations for %d rows", max_rows);
    }
    int kv_rc = runner_kv_alloc(r);
    if (kv_rc) {
        runner_free(r);
        return kv_rc;
    }
    const rd_backend_ops *op = be->ops;
    if (op->lm_head) {
        /* A backend with its own LM head may prepare it on first use (the
         * CUDA backend makes an fp32 copy of the weights): do it now, not
         * inside the first step. */
        op->lm_head(be, m->lm_head, r->sel, 1, r->logits);
        int rc = op->sync(be);
        if (rc) {
            runner_free(r);
            return rc;
        }
    }
    const char *g = getenv("RD_GRAPHS");
    if (op->graph_begin && op->graph_end && op->graph_launch && op->graph_free && !(g && !strcmp(g, "0"))) {
        int32_t cap = max_rows < max_logits ? max_rows : max_logits;
        r->graph_cap = cap < RUNNER_GRAPH_MAX_BATCH ? cap : RUNNER_GRAPH_MAX_BATCH;
        r->pad_host = malloc(4 * (size_t)r->graph_cap * sizeof(int32_t));
        if (!r->pad_host) {
            runner_free(r);
            return rd_fail(RD_ENOMEM, "runner: cannot allocate graph buffers for %d rows", cap);
        }
        r->use_graphs = 1;
    }
    return 0;
}

void runner_free(runner *r)
{
    if (!r->be)
        return;
    rd_backend *be = r->be;
    runner_wait(r); /* queued work may still read what is freed below */
    void *bufs[] = {r->x, r->xn, r->qkv, r->att, r->gu, r->ff, r->tmp, r->sel, r->logits, r->logit_rows_dev,
                    r->cow_dev, r->router, r->route_w, r->routes};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        if (bufs[i])
            be->ops->free(be, bufs[i]);
    runner_kv_free(r);
    free(r->moe);
    for (int32_t k = 0; r->lora_lb && be->ops->lora_release && k < r->m->cfg.n_layers * LORA_N_MODULES; k++)
        if (r->lora_lb[k].w)
            be->ops->lora_release(be, &r->lora_lb[k]);
    if (r->lora_rows_dev)
        be->ops->free(be, r->lora_rows_dev);
    free(r->lora_w);
    free(r->lora_lb);
    free(r->lora_used);
    free(r->pad_host);
    memset(r, 0, sizeof *r);
}

/* Captured graphs hold the KV buffers' addresses: they go with them. */
static void drop_graphs(runner *r)
{
    for (int i = 0; i < RUNNER_MAX_GRAPHS; i++) {
        if (r->graphs[i].graph)
            r->be->ops->graph_free(r->be, r->graphs[i].graph);
        memset(&r->graphs[i], 0, sizeof r->graphs[i]);
    }
}

int runner_kv_alloc(runner *r)
{
    if (r->k_cache)
        return 0;
    const model_config *c = &r->m->cfg;
    rd_backend *be = r->be;
    int failed = 0;
    r->k_cache = calloc((size_t)c->n_layers, sizeof(float *));
    r->v_cache = calloc((size_t)c->n_layers, sizeof(float *));
    if (!r->k_cache || !r->v_cache)
        failed = 1;
    size_t layer_bytes =
        (size_t)r->n_blocks * (size_t)rd_backend_kv_block_bytes(be, c->n_kv_heads, r->attn.block_size, c->head_dim);
    for (int32_t l = 0; l < c->n_layers && !failed; l++) {
        r->k_cache[l] = balloc(be, layer_bytes, &failed);
        r->v_cache[l] = balloc(be, layer_bytes, &failed);
    }
    if (failed) {
        runner_kv_free(r);
        return rd_fail(RD_ENOMEM, "runner: cannot allocate KV cache (%d blocks, %zu bytes per layer)", r->n_blocks,
                       2 * layer_bytes);
    }
    return 0;
}

void runner_kv_free(runner *r)
{
    if (!r->be)
        return;
    rd_backend *be = r->be;
    runner_wait(r);
    drop_graphs(r);
    for (int32_t l = 0; r->k_cache && l < r->m->cfg.n_layers; l++) {
        if (r->k_cache[l]) be->ops->free(be, r->k_cache[l]);
        if (r->v_cache && r->v_cache[l]) be->ops->free(be, r->v_cache[l]);
    }
    free(r->k_cache);
    free(r->v_cache);
    r->k_cache = r->v_cache = NULL;
}

void runner_rebind(runner *r)
{
    const model_config *c = &r->m->cfg;
    runner_wait(r);
    drop_graphs(r);
    for (int32_t l = 0; r->moe && l < c->n_layers; l++) {
        r->moe[l].gate_up = r->m->layers[l].exp_gate_up;
        r->moe[l].down = r->m->layers[l].exp_down;
    }
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

/* A module's input and output features, 0 where the family's layers do not run it through the runner
 * (a MoE model's FFN is its experts). */
static void lora_dims(const model_config *c, lora_module m, int32_t *in, int32_t *out)
{
    const int32_t q = c->n_heads * c->head_dim, kv = c->n_kv_heads * c->head_dim;
    const int32_t ffn = c->n_experts > 0 ? 0 : c->ffn_dim;
    switch (m) {
    case LORA_Q: *in = c->dim; *out = q; break;
    case LORA_K:
    case LORA_V: *in = c->dim; *out = kv; break;
    case LORA_O: *in = q; *out = c->dim; break;
    case LORA_GATE:
    case LORA_UP: *in = ffn ? c->dim : 0; *out = ffn; break;
    case LORA_DOWN: *in = ffn; *out = ffn ? c->dim : 0; break;
    default: *in = *out = 0; break;
    }
}

int runner_lora_init(runner *r, int32_t n_slots, int32_t max_rank)
{
    const model_config *c = &r->m->cfg;
    if (r->lora_n_slots)
        return rd_fail(RD_EINVAL, "runner: LoRA slots are already made");
    if (n_slots < 1 || n_slots > RD_LORA_MAX_SLOTS || max_rank < 1 || max_rank > RD_LORA_MAX_RANK)
        return rd_fail(RD_EINVAL, "runner: %d LoRA slots of rank %d (1..%d slots, rank 1..%d)", n_slots, max_rank,
                       RD_LORA_MAX_SLOTS, RD_LORA_MAX_RANK);
    if (!r->be->ops->lora_apply || !r->be->ops->lora_load)
        return rd_fail(RD_ENOTSUP, "runner: the %s backend has no LoRA ops", r->be->ops->name);
    const size_t n_lb = (size_t)c->n_layers * LORA_N_MODULES;
    int failed = 0;
    r->lora_w = calloc(n_lb * (size_t)n_slots, sizeof(void *));
    r->lora_lb = calloc(n_lb, sizeof *r->lora_lb);
    r->lora_used = calloc(n_lb, sizeof(int32_t));
    r->lora_rows_dev = balloc(r->be, (size_t)r->max_rows * sizeof(int32_t), &failed);
    if (failed || !r->lora_w || !r->lora_lb || !r->lora_used) {
        free(r->lora_w);
        free(r->lora_lb);
        free(r->lora_used);
        if (r->lora_rows_dev)
            r->be->ops->free(r->be, r->lora_rows_dev);
        r->lora_w = NULL;
        r->lora_lb = NULL;
        r->lora_used = NULL;
        r->lora_rows_dev = NULL;
        return rd_fail(RD_ENOMEM, "runner: cannot allocate %d LoRA slots", n_slots);
    }
    for (size_t k = 0; k < n_lb; k++) {
        int32_t in, out;
        lora_dims(c, (lora_module)(k % LORA_N_MODULES), &in, &out);
        r->lora_lb[k] = (rd_lora_batch){.n_slots = n_slots, .w = r->lora_w + k * (size_t)n_slots, .in = in,
                                        .out = out, .max_rank = max_rank};
    }
    r->lora_n_slots = n_slots;
    r->lora_max_rank = max_rank;
    return 0;
}

int runner_lora_set(runner *r, int32_t slot, int32_t layer, lora_module m, void *handle)
{
    const model_config *c = &r->m->cfg;
    if (slot < 0 || slot >= r->lora_n_slots || layer < 0 || layer >= c->n_layers || m < 0 || m >= LORA_N_MODULES)
        return rd_fail(RD_EINVAL, "runner: LoRA slot %d, layer %d, module %d out of range (%d slots, %d layers)",
                       slot, layer, (int)m, r->lora_n_slots, c->n_layers);
    const size_t k = (size_t)layer * LORA_N_MODULES + m;
    if (handle && r->lora_lb[k].out == 0)
        return rd_fail(RD_EINVAL, "runner: %s layers run no %s of their own (LoRA on it is not served)", c->arch,
                       lora_module_name(m));
    void **w = &r->lora_w[k * (size_t)r->lora_n_slots + slot];
    r->lora_used[k] += (handle != NULL) - (*w != NULL);
    *w = handle;
    r->lora_gen++;
    return 0;
}

static int ggml_of_st(st_dtype d) { return d == ST_F32 ? GGML_F32 : d == ST_F16 ? GGML_F16 : GGML_BF16; }

int runner_lora_prepare(runner *r, const lora_adapter *a, void ***handles, int64_t *bytes)
{
    const model_config *c = &r->m->cfg;
    rd_backend *be = r->be;
    *handles = NULL;
    *bytes = 0;
    if (!r->lora_n_slots)
        return rd_fail(RD_EINVAL, "runner: no LoRA slots (runner_lora_init)");
    if (a->n_layers != c->n_layers)
        return rd_fail(RD_EINVAL, "lora: adapter '%s' has %d layers; the model %d", a->name, a->n_layers,
                       c->n_layers);
    if (a->rank > r->lora_max_rank)
        return rd_fail(RD_ERANGE, "lora: adapter '%s' has rank %d; the limit is %d", a->name, a->rank,
                       r->lora_max_rank);
    const size_t n_pairs = (size_t)c->n_layers * LORA_N_MODULES;
    void **h = calloc(n_pairs, sizeof(void *));
    if (!h)
        return rd_fail(RD_ENOMEM, "lora: out of memory");
    int rc = 0;
    int64_t total = 0;
    for (size_t k = 0; k < n_pairs && !rc; k++) {
        const lora_module m = (lora_module)(k % LORA_N_MODULES);
        const lora_pair *p = lora_pair_at(a, (int32_t)(k / LORA_N_MODULES), m);
        if (!p || !p->a)
            continue;
        const rd_lora_batch *lb = &r->lora_lb[k];
        if (lb->out == 0 || lb->in != a->in[m] || lb->out != a->out[m]) {
            rc = rd_fail(RD_EINVAL, "lora: adapter '%s' has %s [%d -> %d] in layer %d; the model runs [%d -> %d]",
                         a->name, lora_module_name(m), a->in[m], a->out[m], (int)(k / LORA_N_MODULES), lb->in,
                         lb->out);
            break;
        }
        const rd_lora_w w = {.rank = a->rank, .in = a->in[m], .out = a->out[m], .scale = a->scale,
                             .a_type = ggml_of_st(p->a_dtype), .b_type = ggml_of_st(p->b_dtype), .a = p->a,
                             .b = p->b};
        rc = be->ops->lora_load(be, &w, &h[k]);
        if (!rc)
            total += be->ops->lora_bytes(be, h[k]);
    }
    if (rc) {
        runner_lora_discard(r, h);
        return rc;
    }
    *handles = h;
    *bytes = total;
    return 0;
}

void runner_lora_discard(runner *r, void **handles)
{
    for (size_t k = 0; handles && k < (size_t)r->m->cfg.n_layers * LORA_N_MODULES; k++)
        if (handles[k])
            r->be->ops->lora_free(r->be, handles[k]);
    free(handles);
}

void runner_lora_bind(runner *r, int32_t slot, void **handles)
{
    for (size_t k = 0; k < (size_t)r->m->cfg.n_layers * LORA_N_MODULES; k++)
        if (handles[k])
            runner_lora_set(r, slot, (int32_t)(k / LORA_N_MODULES), (lora_module)(k % LORA_N_MODULES), handles[k]);
    free(handles);
}

void runner_lora_unbind(runner *r, int32_t slot)
{
    if (slot < 0 || slot >= r->lora_n_slots)
        return;
    runner_wait(r); /* a queued forward may still read the handles freed below */
    for (size_t k = 0; k < (size_t)r->m->cfg.n_layers * LORA_N_MODULES; k++) {
        void *h = r->lora_w[k * (size_t)r->lora_n_slots + slot];
        if (h) {
            runner_lora_set(r, slot, (int32_t)(k / LORA_N_MODULES), (lora_module)(k % LORA_N_MODULES), NULL);
            r->be->ops->lora_free(r->be, h);
        }
    }
}

/* Adds the LoRA terms of module mod of layer l for the rows that have them, x the module's input [M][in]
 * and its output at y + off (rows y_stride apart), after the module's linear wrote it. */
static void lora_add(runner *r, int32_t l, lora_module mod, const float *x, int32_t M, float *y, int32_t y_stride,
                     int32_t off)
{
    if (!r->lora_step)
        return;
    const size_t k = (size_t)l * LORA_N_MODULES + mod;
    if (r->lora_used[k] > 0)
        r->be->ops->lora_apply(r->be, &r->lora_lb[k], x, r->lora_rows_dev, M, y, y_stride, off);
}

/* The pre-norm attention sublayer (Llama, Qwen2, Qwen3, Qwen3-MoE), x +=
 * o(attention(rope(norms(q|k|v(rmsnorm(x)))))), then xn = rmsnorm(x) for
 * the FFN: the q|k|v bias and per-head q/k norms where the layer has them. */
static void attention_sublayer(runner *r, const rd_step_dev *sd, int32_t M, int32_t l)
{
    const model *m = r->m;
    const model_config *c = &m->cfg;
    rd_backend *be = r->be;
    const rd_backend_ops *op = be->ops;
    const int32_t hd = c->head_dim, nh = c->n_heads, nkv = c->n_kv_heads;
    const int32_t qkv_dim = (nh + 2 * nkv) * hd;
    const model_layer *L = &m->layers[l];

    op->rmsnorm(be, r->x, L->attn_norm, M, c->dim, c->norm_eps, 0.0f, r->xn);
    op->linear(be, L->qkv, r->xn, M, r->qkv, 0);
    if (L->qkv_bias)
        op->add_bias(be, r->qkv, qkv_dim, M, qkv_dim, L->qkv_bias);
    lora_add(r, l, LORA_Q, r->xn, M, r->qkv, qkv_dim, 0);
    lora_add(r, l, LORA_K, r->xn, M, r->qkv, qkv_dim, nh * hd);
    lora_add(r, l, LORA_V, r->xn, M, r->qkv, qkv_dim, (nh + nkv) * hd);
    if (L->q_norm) {
        op->head_rmsnorm(be, r->qkv, qkv_dim, M, nh, hd, L->q_norm, c->norm_eps, 0.0f);
        op->head_rmsnorm(be, r->qkv + nh * hd, qkv_dim, M, nkv, hd, L->k_norm, c->norm_eps, 0.0f);
    }
    /* q and k heads are adjacent in a qkv row: one call rotates both */
    op->rope(be, r->qkv, qkv_dim, M, nh + nkv, hd, sd->positions, m->rope);
    op->kv_write(be, &r->attn, r->qkv + nh * hd, r->qkv + (nh + nkv) * hd, qkv_dim, sd, r->k_cache[l],
                 r->v_cache[l]);
    op->attention(be, &r->attn, r->qkv, qkv_dim, sd, r->k_cache[l], r->v_cache[l], r->att);
    op->linear(be, L->o, r->att, M, r->x, 1);
    /* Onto the residual sum: a row's bits still depend on its own adapter alone */
    lora_add(r, l, LORA_O, r->att, M, r->x, c->dim, 0);
    op->rmsnorm(be, r->x, L->ffn_norm, M, c->dim, c->norm_eps, 0.0f, r->xn);
}

void runner_layer_decoder(runner *r, const rd_step_dev *sd, int32_t M, int32_t l)
{
    const model_config *c = &r->m->cfg;
    rd_backend *be = r->be;
    const rd_backend_ops *op = be->ops;
    const model_layer *L = &r->m->layers[l];

    attention_sublayer(r, sd, M, l);
    op->linear(be, L->gate_up, r->xn, M, r->gu, 0);
    lora_add(r, l, LORA_GATE, r->xn, M, r->gu, 2 * c->ffn_dim, 0);
    lora_add(r, l, LORA_UP, r->xn, M, r->gu, 2 * c->ffn_dim, c->ffn_dim);
    op->swiglu(be, r->gu, M, c->ffn_dim, r->ff);
    op->linear(be, L->down, r->ff, M, r->x, 1);
    lora_add(r, l, LORA_DOWN, r->ff, M, r->x, c->dim, 0);
}

void runner_layer_moe(runner *r, const rd_step_dev *sd, int32_t M, int32_t l)
{
    const model_config *c = &r->m->cfg;
    rd_backend *be = r->be;
    const rd_backend_ops *op = be->ops;
    const int32_t k = c->n_experts_used;
    const model_layer *L = &r->m->layers[l];
    int32_t *routes = r->routes + (size_t)l * r->max_rows * k;

    attention_sublayer(r, sd, M, l);
    op->linear(be, L->router, r->xn, M, r->router, 0);
    op->moe_route(be, r->router, M, c->n_experts, k, c->moe_norm_topk, routes, r->route_w);
    /* The handles are read at the call: after a weight swap the array holds the new ones. */
    op->moe_ffn(be, &r->moe[l], r->xn, routes, r->route_w, M, k, r->x);
}

int runner_routes(runner *r, int32_t n, int32_t *dst)
{
    const model_config *c = &r->m->cfg;
    rd_backend *be = r->be;
    if (!r->routes)
        return rd_fail(RD_EINVAL, "runner: a %s model routes no experts", c->arch);
    if (n < 0 || n > r->max_rows)
        return rd_fail(RD_ERANGE, "runner: routes of %d rows; a step holds at most %d", n, r->max_rows);
    const size_t k = (size_t)c->n_experts_used, row_bytes = (size_t)n * k * sizeof(int32_t);
    int rc = 0;
    for (int32_t l = 0; l < c->n_layers && !rc; l++)
        rc = be->ops->d2h(be, dst + (size_t)l * n * k, r->routes + (size_t)l * r->max_rows * k, row_bytes);
    return rc ? rc : be->ops->sync(be);
}

void runner_layer_gemma3(runner *r, const rd_step_dev *sd, int32_t M, int32_t l)
{
    const model *m = r->m;
    const model_config *c = &m->cfg;
    rd_backend *be = r->be;
    const rd_backend_ops *op = be->ops;
    const int32_t hd = c->head_dim, nh = c->n_heads, nkv = c->n_kv_heads, d = c->dim;
    const int32_t qkv_dim = (nh + 2 * nkv) * hd;
    const float eps = c->norm_eps, one = m->arch->norm_offset;
    const model_layer *L = &m->layers[l];
    const int local = arch_layer_is_local(c, l);
    rd_attn_shape a = r->attn;
    a.window = local ? c->sliding_window : 0;

    op->rmsnorm(be, r->x, L->attn_norm, M, d, eps, one, r->xn);
    op->linear(be, L->qkv, r->xn, M, r->qkv, 0);
    lora_add(r, l, LORA_Q, r->xn, M, r->qkv, qkv_dim, 0);
    lora_add(r, l, LORA_K, r->xn, M, r->qkv, qkv_dim, nh * hd);
    lora_add(r, l, LORA_V, r->xn, M, r->qkv, qkv_dim, (nh + nkv) * hd);
    op->head_rmsnorm(be, r->qkv, qkv_dim, M, nh, hd, L->q_norm, eps, one);
    op->head_rmsnorm(be, r->qkv + nh * hd, qkv_dim, M, nkv, hd, L->k_norm, eps, one);
    op->rope(be, r->qkv, qkv_dim, M, nh + nkv, hd, sd->positions, local ? m->rope_local : m->rope);
    op->kv_write(be, &a, r->qkv + nh * hd, r->qkv + (nh + nkv) * hd, qkv_dim, sd, r->k_cache[l], r->v_cache[l]);
    op->attention(be, &a, r->qkv, qkv_dim, sd, r->k_cache[l], r->v_cache[l], r->att);
    op->linear(be, L->o, r->att, M, r->tmp, 0);
    lora_add(r, l, LORA_O, r->att, M, r->tmp, d, 0);
    op->rmsnorm_add(be, r->tmp, L->post_attn_norm, M, d, eps, one, r->xn, r->x);
    op->rmsnorm(be, r->x, L->ffn_norm, M, d, eps, one, r->xn);
    op->linear(be, L->gate_up, r->xn, M, r->gu, 0);
    lora_add(r, l, LORA_GATE, r->xn, M, r->gu, 2 * c->ffn_dim, 0);
    lora_add(r, l, LORA_UP, r->xn, M, r->gu, 2 * c->ffn_dim, c->ffn_dim);
    op->geglu(be, r->gu, M, c->ffn_dim, r->ff);
    op->linear(be, L->down, r->ff, M, r->tmp, 0);
    lora_add(r, l, LORA_DOWN, r->ff, M, r->tmp, d, 0);
    op->rmsnorm_add(be, r->tmp, L->post_ffn_norm, M, d, eps, one, r->xn, r->x);
}

/* embed (scaled where the family scales it) -> the family's layer recipe
 * for each layer (step metadata already uploaded). */
static void enqueue_body(runner *r, const rd_step_dev *sd, int32_t M)
{
    const model *m = r->m;
    rd_backend *be = r->be;
    be->ops->embed(be, m->embed, sd->token_ids, M, m->cfg.embed_scale != 0.0f ? m->cfg.embed_scale : 1.0f, r->x);
    for (int32_t l = 0; l < m->cfg.n_layers; l++)
        m->arch->layer(r, sd, M, l);
}

/* gather the logit rows -> final norm -> LM head (fp32 where the backend has one).
 * rows_dev NULL: the logit rows are rows 0..n-1 of the step, in order (a
 * decode step), and the norm reads them where they are: no gather. */
static void enqueue_head(runner *r, const int32_t *rows_dev, int32_t n)
{
    const model *m = r->m;
    const model_config *c = &m->cfg;
    rd_backend *be = r->be;
    const rd_backend_ops *op = be->ops;
    const float *rows = r->x;
    if (rows_dev) {
        op->gather_rows(be, r->x, rows_dev, n, c->dim, r->xn);
        rows = r->xn;
    }
    op->rmsnorm(be, rows, m->out_norm, n, c->dim, c->norm_eps, m->arch->norm_offset, r->sel);
    if (op->lm_head)
        op->lm_head(be, m->lm_head, r->sel, n, r->logits);
    else
        op->linear(be, m->lm_head, r->sel, n, r->logits, 0);
}

int32_t runner_graph_bucket(int32_t m, int32_t cap)
{
    if (cap > RUNNER_GRAPH_MAX_BATCH)
        cap = RUNNER_GRAPH_MAX_BATCH;
    if (m <= 0 || m > cap)
        return 0;
    int32_t b = m <= 4 ? (m <= 1 ? 1 : m <= 2 ? 2 : 4) : (m + 7) / 8 * 8;
    return b < cap ? b : cap;
}

/* A decode step the graph path takes: one row per sequence, every row a
 * logit row in order, and a bucket that fits. */
static int graph_eligible(const runner *r, const rd_step *s, const int32_t *logit_rows, int32_t n_logits)
{
    if (!r->use_graphs || s->n_rows != s->n_seqs || n_logits != s->n_rows ||
        runner_graph_bucket(s->n_rows, r->graph_cap) == 0)
        return 0;
    for (int32_t i = 0; i < n_logits; i++)
        if (logit_rows[i] != i || s->q_start[i] != i)
            return 0;
    return s->q_start[n_logits] == n_logits;
}

static runner_graph *graph_slot(runner *r, int32_t bucket, int lora)
{
    for (int i = 0; i < RUNNER_MAX_GRAPHS; i++)
        if (r->graphs[i].bucket == bucket && r->graphs[i].lora == lora)
            return &r->graphs[i];
    for (int i = 0; i < RUNNER_MAX_GRAPHS; i++)
        if (r->graphs[i].bucket == 0) {
            r->graphs[i].bucket = bucket;
            r->graphs[i].lora = lora;
            return &r->graphs[i];
        }
    return NULL;
}

/* The end of a forward: wait for it, unless the caller takes the logits
 * on the backend and asked not to (async_forward). */
static int forward_done(runner *r, const float *logits_host)
{
    if (r->async_forward && !logits_host) {
        r->pending = 1;
        return 0;
    }
    r->pending = 0;
    return r->be->ops->sync(r->be);
}

int runner_wait(runner *r)
{
    if (!r->pending)
        return 0;
    r->pending = 0;
    return r->be->ops->sync(r->be);
}

static int forward_graph(runner *r, const rd_step *s, float *logits_host)
{
    rd_backend *be = r->be;
    const rd_backend_ops *op = be->ops;
    const int32_t M = s->n_rows, B = runner_graph_bucket(M, r->graph_cap);
    runner_graph *g = graph_slot(r, B, r->lora_step);
    if (!g)
        return rd_fail(RD_ERANGE, "runner: no graph slot for bucket %d", B);

    /* The step padded to B rows: padding rows have token -1, position 0,
     * slot -1 and no sequence (rows past q_start[n_seqs]). */
    int32_t *tok = r->pad_host, *pos = tok + r->graph_cap, *slot = pos + r->graph_cap;
    int32_t *lora = slot + r->graph_cap;
    memcpy(tok, s->token_ids, sizeof(int32_t) * M);
    memcpy(pos, s->positions, sizeof(int32_t) * M);
    memcpy(slot, s->slots, sizeof(int32_t) * M);
    if (r->lora_step)
        memcpy(lora, s->lora_slots, sizeof(int32_t) * M);
    for (int32_t i = M; i < B; i++) {
        tok[i] = -1;
        pos[i] = 0;
        slot[i] = -1;
        lora[i] = -1;
    }
    rd_step padded = *s;
    padded.n_rows = B;
    padded.token_ids = tok;
    padded.positions = pos;
    padded.slots = slot;
    rd_step_dev sd;
    int rc = op->step_upload(be, &padded, &sd);
    if (!rc && r->lora_step)
        rc = op->h2d(be, r->lora_rows_dev, lora, sizeof(int32_t) * (size_t)B);
    if (rc)
        return rc;

    if (g->graph && (g->weights_gen != r->m->weights_gen || (g->lora && g->lora_gen != r->lora_gen))) {
        op->graph_free(be, g->graph);
        g->graph = NULL;
        g->seen = 0;
    }
    int ran = 0;
    if (g->graph) {
        rc = op->graph_launch(be, g->graph);
        if (rc == RD_GRAPH_STALE) {
            op->graph_free(be, g->graph);
            g->graph = NULL;
        } else if (rc) {
            return rc;
        } else {
            ran = 1;
            r->graph_replays++;
        }
    } else if (g->seen) {
        rc = op->graph_begin(be);
        if (!rc) {
            enqueue_body(r, &sd, B);
            enqueue_head(r, NULL, B);
            rc = op->graph_end(be, &g->graph);
        }
        if (!rc) {
            g->weights_gen = r->m->weights_gen;
            g->lora_gen = r->lora_gen;
            r->graph_captures++;
            rc = op->graph_launch(be, g->graph);
            if (rc)
                return rc;
            ran = 1;
        } else {
            /* The capture failed: decode uncaptured from now on. */
            g->graph = NULL;
            r->use_graphs = 0;
        }
    }
    if (!ran) {
        enqueue_body(r, &sd, B);
        enqueue_head(r, NULL, B);
        g->seen = 1;
        r->graph_eager++;
    }
    r->last_logits = M;
    if (logits_host &&
        (rc = op->d2h(be, logits_host, r->logits, (size_t)M * r->m->cfg.vocab * sizeof(float))))
        return rc;
    return forward_done(r, logits_host);
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
    r->last_logits = 0;
    r->lora_step = 0;
    for (int32_t i = 0; s->lora_slots && i < M; i++) {
        if (s->lora_slots[i] < -1 || s->lora_slots[i] >= r->lora_n_slots)
            return rd_fail(RD_ERANGE, "runner: row %d names LoRA slot %d; the runner has %d", i, s->lora_slots[i],
                           r->lora_n_slots);
        r->lora_step |= s->lora_slots[i] >= 0;
    }
    int64_t t0 = clock_now_ns();
    if (graph_eligible(r, s, logit_rows, n_logits)) {
        int rc = forward_graph(r, s, logits_host);
        r->ns_layers += clock_now_ns() - t0;
        return rc;
    }

    rd_step_dev sd;
    int rc = op->step_upload(be, s, &sd);
    if (!rc && r->lora_step)
        rc = op->h2d(be, r->lora_rows_dev, s->lora_slots, sizeof(int32_t) * (size_t)M);
    if (rc)
        return rc;
    enqueue_body(r, &sd, M);
    if (n_logits == 0) {
        r->pending = 0;
        rc = op->sync(be);
        r->ns_layers += clock_now_ns() - t0;
        return rc;
    }
    int64_t t1 = clock_now_ns();
    r->ns_layers += t1 - t0;
    if ((rc = op->h2d(be, r->logit_rows_dev, logit_rows, (size_t)n_logits * sizeof(int32_t))))
        return rc;
    int identity = n_logits == M;
    for (int32_t i = 0; identity && i < n_logits; i++)
        identity = logit_rows[i] == i;
    enqueue_head(r, identity ? NULL : r->logit_rows_dev, n_logits);
    r->last_logits = n_logits;
    rc = logits_host ? op->d2h(be, logits_host, r->logits, (size_t)n_logits * c->vocab * sizeof(float)) : 0;
    if (!rc)
        rc = forward_done(r, logits_host);
    r->ns_head += clock_now_ns() - t1;
    return rc;
}

int runner_sample(runner *r, const rd_sample_req *reqs, int32_t n, samp_result *out)
{
    rd_backend *be = r->be;
    const int32_t vocab = r->m->cfg.vocab;
    for (int32_t i = 0; i < n; i++)
        if (reqs[i].row < 0 || reqs[i].row >= r->last_logits || !reqs[i].sp)
            return rd_fail(RD_ERANGE, "runner_sample: request %d asks for logit row %d; the last step left %d",
                           i, reqs[i].row, r->last_logits);
    /* Both paths wait for the step's queued work once they succeed (the
     * device sampler reads its results back; the host one copies logits). */
    if (be->ops->sample) {
        int rc = be->ops->sample(be, r->logits, vocab, reqs, n, out);
        if (!rc)
            r->pending = 0;
        return rc;
    }
    float *row = malloc(sizeof(float) * (size_t)vocab * 2), *proc = row ? row + vocab : NULL;
    void *scratch = malloc(samp_scratch_bytes(vocab));
    int rc = row && scratch ? 0 : rd_fail(RD_ENOMEM, "runner_sample: out of memory");
    for (int32_t i = 0; i < n && !rc; i++) {
        rc = be->ops->d2h(be, row, r->logits + (size_t)reqs[i].row * vocab, sizeof(float) * (size_t)vocab);
        if (!rc)
            rc = be->ops->sync(be);
        if (!rc && reqs[i].score) {
            if (samp_score(reqs[i].sp, row, vocab, reqs[i].score_token, scratch, &out[i])) {
                memset(&out[i], 0, sizeof out[i]);
                out[i].token = -1;
            }
            continue;
        }
        if (!rc && reqs[i].n_edits > 0)
            samp_apply_edits(reqs[i].sp, row, vocab, reqs[i].edits, reqs[i].n_edits, proc);
        if (!rc && samp_sample_ex(reqs[i].sp, row, reqs[i].n_edits > 0 ? proc : NULL, vocab, reqs[i].sample_idx,
                                  reqs[i].pos, scratch, &out[i])) {
            memset(&out[i], 0, sizeof out[i]);
            out[i].token = -1;
        }
    }
    free(row);
    free(scratch);
    return rc;
}
