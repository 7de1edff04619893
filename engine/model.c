/* model.c - Llama config and weights from GGUF (see model.h); the HF
 * safetensors source and export live in model_hf.c. */
#include "engine/model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/err.h"

static int get_u32(const gguf_file *g, const char *arch, const char *suffix, uint32_t *v, int required)
{
    char key[128];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    int rc = gguf_get_u32(g, key, v);
    if (rc == RD_ENOENT && !required)
        return RD_ENOENT;
    if (rc)
        return rd_fail(rc, "model: metadata key '%s': %s", key, rd_errmsg());
    return 0;
}

int model_config_from_gguf(const gguf_file *g, model_config *c)
{
    memset(c, 0, sizeof *c);
    gguf_str arch;
    if (gguf_get_str(g, "general.architecture", &arch))
        return rd_fail(RD_EFORMAT, "model: general.architecture missing or not a string");
    if (arch.len != 5 || memcmp(arch.ptr, "llama", 5) != 0)
        return rd_fail(RD_ENOTSUP, "model: architecture '%.*s' is not supported (expected llama)",
                       (int)(arch.len > 30 ? 30 : arch.len), arch.ptr);
    strcpy(c->arch, "llama");

    uint32_t v;
    int rc;
    if ((rc = get_u32(g, "llama", "block_count", &v, 1))) return rc;
    c->n_layers = (int32_t)v;
    if ((rc = get_u32(g, "llama", "embedding_length", &v, 1))) return rc;
    c->dim = (int32_t)v;
    if ((rc = get_u32(g, "llama", "attention.head_count", &v, 1))) return rc;
    c->n_heads = (int32_t)v;
    rc = get_u32(g, "llama", "attention.head_count_kv", &v, 0);
    if (rc && rc != RD_ENOENT) return rc;
    c->n_kv_heads = rc == RD_ENOENT ? c->n_heads : (int32_t)v;
    if ((rc = get_u32(g, "llama", "feed_forward_length", &v, 1))) return rc;
    c->ffn_dim = (int32_t)v;
    if ((rc = get_u32(g, "llama", "context_length", &v, 1))) return rc;
    c->max_ctx = (int32_t)v;

    if (gguf_get_f32(g, "llama.rope.freq_base", &c->rope_theta))
        c->rope_theta = 10000.0f; /* llama.cpp's default when absent */
    if (gguf_get_f32(g, "llama.attention.layer_norm_rms_epsilon", &c->norm_eps))
        return rd_fail(RD_EFORMAT, "model: llama.attention.layer_norm_rms_epsilon missing");

    if (c->n_layers <= 0 || c->n_layers > 512 || c->dim <= 0 || c->n_heads <= 0 || c->n_kv_heads <= 0 ||
        c->ffn_dim <= 0 || c->max_ctx <= 0 || c->dim % c->n_heads || c->n_heads % c->n_kv_heads)
        return rd_fail(RD_EFORMAT,
                       "model: inconsistent shape: layers %d dim %d heads %d kv_heads %d ffn %d ctx %d "
                       "(need dim %% heads == 0 and heads %% kv_heads == 0)",
                       c->n_layers, c->dim, c->n_heads, c->n_kv_heads, c->ffn_dim, c->max_ctx);
    c->head_dim = c->dim / c->n_heads;
    if (c->head_dim % 2)
        return rd_fail(RD_EFORMAT, "model: head_dim %d must be even for RoPE", c->head_dim);
    rc = get_u32(g, "llama", "rope.dimension_count", &v, 0);
    if (rc == 0 && (int32_t)v != c->head_dim)
        return rd_fail(RD_ENOTSUP, "model: llama.rope.dimension_count %u != head_dim %d (partial RoPE unsupported)",
                       v, c->head_dim);

    const gguf_tensor *emb = gguf_find_tensor(g, "token_embd.weight");
    if (!emb || emb->n_dims != 2)
        return rd_fail(RD_EFORMAT, "model: tensor token_embd.weight missing or not 2-D");
    c->vocab = (int32_t)emb->ne[1];
    c->tied_embeddings = gguf_find_tensor(g, "output.weight") == NULL;
    if (!isfinite(c->rope_theta) || c->rope_theta <= 0 || !(c->norm_eps > 0))
        return rd_fail(RD_EFORMAT, "model: rope theta %g / rms eps %g out of range", c->rope_theta, c->norm_eps);
    return 0;
}

int64_t model_kv_bytes_per_token(const model_config *c)
{
    return (int64_t)c->n_layers * 2 * c->n_kv_heads * c->head_dim * (int64_t)sizeof(float);
}

/* Dequantizes tensor `name`, checking it is [rows][cols] in HF terms (GGUF ne = {cols, rows}). */
static int load_matrix(const gguf_file *g, const char *name, int64_t rows, int64_t cols, float *dst)
{
    const gguf_tensor *t = gguf_find_tensor(g, name);
    if (!t)
        return rd_fail(RD_EFORMAT, "model: tensor '%s' missing", name);
    int64_t want_dims = rows == 1 ? 1 : 2;
    if ((int64_t)t->n_dims != want_dims || (int64_t)t->ne[0] != cols || (int64_t)t->ne[1] != rows)
        return rd_fail(RD_EFORMAT, "model: tensor '%s' has shape [%llu, %llu] (ggml order), expected [%lld, %lld]",
                       name, (unsigned long long)t->ne[0], (unsigned long long)t->ne[1], (long long)cols,
                       (long long)rows);
    int rc = gguf_dequant(t, dst);
    if (rc)
        return rd_fail(rc, "model: tensor '%s': %s", name, rd_errmsg());
    return 0;
}

/* llama.cpp stores Q/K rows of each head interleaved (pair i at rows 2i, 2i+1)
 * for its NORMAL RoPE; HF keeps the two halves apart (rotate-half). */
static void unpermute_rows(float *w, int32_t n_heads, int32_t hd, int32_t cols, float *tmp)
{
    const int32_t half = hd / 2;
    for (int32_t h = 0; h < n_heads; h++) {
        float *head = w + (size_t)h * hd * cols;
        memcpy(tmp, head, sizeof(float) * (size_t)hd * cols);
        for (int32_t i = 0; i < half; i++)
            for (int32_t j = 0; j < 2; j++)
                memcpy(head + (size_t)(j * half + i) * cols, tmp + (size_t)(2 * i + j) * cols,
                       sizeof(float) * cols);
    }
}

static int upload_vector(rd_backend *be, const float *src, int32_t n, float **dst)
{
    *dst = be->ops->alloc(be, sizeof(float) * (size_t)n);
    if (!*dst)
        return rd_fail(RD_ENOMEM, "model: backend alloc of %d floats failed", n);
    return be->ops->h2d(be, *dst, src, sizeof(float) * (size_t)n);
}

/* cos/sin of pos * theta^(-2i/hd), computed in double so every backend gets
 * the same table. */
static int build_rope(model *m)
{
    const model_config *c = &m->cfg;
    int32_t half = c->head_dim / 2;
    size_t n = (size_t)c->max_ctx * half * 2;
    float *t = malloc(n * sizeof(float));
    if (!t)
        return rd_fail(RD_ENOMEM, "model: cannot allocate RoPE table");
    for (int32_t p = 0; p < c->max_ctx; p++)
        for (int32_t i = 0; i < half; i++) {
            double inv = pow((double)c->rope_theta, -2.0 * i / c->head_dim);
            double ang = p * inv;
            t[((size_t)p * half + i) * 2] = (float)cos(ang);
            t[((size_t)p * half + i) * 2 + 1] = (float)sin(ang);
        }
    m->rope = m->be->ops->alloc(m->be, n * sizeof(float));
    int rc = m->rope ? m->be->ops->h2d(m->be, m->rope, t, n * sizeof(float))
                     : rd_fail(RD_ENOMEM, "model: backend alloc for RoPE table failed");
    free(t);
    return rc;
}

/* GGUF as a source of HF-named fp32 tensors: the name is mapped to
 * llama.cpp's, the tensor dequantized, and Q/K rows un-permuted, so
 * model_build sees exactly what an HF checkpoint would hold. */
typedef struct {
    const gguf_file *g;
    const model_config *cfg;
    float *tmp;                 /* [head_dim][dim] scratch for unpermute_rows */
} gguf_source;

static const struct {
    const char *hf, *gg;
    int permute;                /* 1: q (n_heads), 2: k (n_kv_heads) */
} LAYER_NAMES[] = {
    {"self_attn.q_proj.weight", "attn_q.weight", 1},
    {"self_attn.k_proj.weight", "attn_k.weight", 2},
    {"self_attn.v_proj.weight", "attn_v.weight", 0},
    {"self_attn.o_proj.weight", "attn_output.weight", 0},
    {"mlp.gate_proj.weight", "ffn_gate.weight", 0},
    {"mlp.up_proj.weight", "ffn_up.weight", 0},
    {"mlp.down_proj.weight", "ffn_down.weight", 0},
    {"input_layernorm.weight", "attn_norm.weight", 0},
    {"post_attention_layernorm.weight", "ffn_norm.weight", 0},
};

static int gguf_fetch(void *ctx, const char *hf, int64_t rows, int64_t cols, float *dst)
{
    gguf_source *src = ctx;
    char name[128];
    int permute = 0, layer, n = 0;
    if (!strcmp(hf, "model.embed_tokens.weight")) {
        snprintf(name, sizeof name, "token_embd.weight");
    } else if (!strcmp(hf, "lm_head.weight")) {
        snprintf(name, sizeof name, "output.weight");
    } else if (!strcmp(hf, "model.norm.weight")) {
        snprintf(name, sizeof name, "output_norm.weight");
    } else if (sscanf(hf, "model.layers.%d.%n", &layer, &n) == 1 && n > 0) {
        size_t k = 0, nk = sizeof LAYER_NAMES / sizeof LAYER_NAMES[0];
        while (k < nk && strcmp(hf + n, LAYER_NAMES[k].hf))
            k++;
        if (k == nk)
            return rd_fail(RD_EINVAL, "model: no GGUF tensor for '%s'", hf);
        snprintf(name, sizeof name, "blk.%d.%s", layer, LAYER_NAMES[k].gg);
        permute = LAYER_NAMES[k].permute;
    } else {
        return rd_fail(RD_EINVAL, "model: no GGUF tensor for '%s'", hf);
    }
    int rc = load_matrix(src->g, name, rows, cols, dst);
    if (rc)
        return rc;
    if (permute)
        unpermute_rows(dst, permute == 1 ? src->cfg->n_heads : src->cfg->n_kv_heads, src->cfg->head_dim,
                       (int32_t)cols, src->tmp);
    return 0;
}

static int load_layer(model *m, int32_t l, float *buf, model_fetch_fn fetch, void *ctx)
{
    const model_config *c = &m->cfg;
    rd_backend *be = m->be;
    const int32_t d = c->dim, hd = c->head_dim, nh = c->n_heads, nkv = c->n_kv_heads, f = c->ffn_dim;
    model_layer *L = &m->layers[l];
    char name[96];
    int rc;

#define TNAME(s) (snprintf(name, sizeof name, "model.layers.%d." s, l), name)
    /* fused QKV: rows q (nh hd), k (nkv hd), v (nkv hd) */
    float *q = buf, *k = q + (size_t)nh * hd * d, *v = k + (size_t)nkv * hd * d;
    if ((rc = fetch(ctx, TNAME("self_attn.q_proj.weight"), (int64_t)nh * hd, d, q))) return rc;
    if ((rc = fetch(ctx, TNAME("self_attn.k_proj.weight"), (int64_t)nkv * hd, d, k))) return rc;
    if ((rc = fetch(ctx, TNAME("self_attn.v_proj.weight"), (int64_t)nkv * hd, d, v))) return rc;
    if ((rc = be->ops->linear_load(be, buf, (nh + 2 * nkv) * hd, d, &L->qkv))) return rc;

    if ((rc = fetch(ctx, TNAME("self_attn.o_proj.weight"), d, (int64_t)nh * hd, buf))) return rc;
    if ((rc = be->ops->linear_load(be, buf, d, nh * hd, &L->o))) return rc;

    if ((rc = fetch(ctx, TNAME("mlp.gate_proj.weight"), f, d, buf))) return rc;
    if ((rc = fetch(ctx, TNAME("mlp.up_proj.weight"), f, d, buf + (size_t)f * d))) return rc;
    if ((rc = be->ops->linear_load(be, buf, 2 * f, d, &L->gate_up))) return rc;

    if ((rc = fetch(ctx, TNAME("mlp.down_proj.weight"), d, f, buf))) return rc;
    if ((rc = be->ops->linear_load(be, buf, d, f, &L->down))) return rc;

    if ((rc = fetch(ctx, TNAME("input_layernorm.weight"), 1, d, buf))) return rc;
    if ((rc = upload_vector(be, buf, d, &L->attn_norm))) return rc;
    if ((rc = fetch(ctx, TNAME("post_attention_layernorm.weight"), 1, d, buf))) return rc;
    if ((rc = upload_vector(be, buf, d, &L->ffn_norm))) return rc;
#undef TNAME
    return 0;
}

int model_build(const model_config *cfg, rd_backend *be, model_fetch_fn fetch, void *ctx, model **out)
{
    *out = NULL;
    model *m = calloc(1, sizeof *m);
    if (!m)
        return rd_fail(RD_ENOMEM, "model: out of memory");
    m->be = be;
    m->cfg = *cfg;
    const model_config *c = &m->cfg;
    int rc;
    m->layers = calloc((size_t)c->n_layers, sizeof *m->layers);

    /* One host buffer big enough for the largest matrix (fused or embedding). */
    size_t qkv = (size_t)(c->n_heads + 2 * c->n_kv_heads) * c->head_dim * c->dim;
    size_t gu = (size_t)2 * c->ffn_dim * c->dim;
    size_t emb = (size_t)c->vocab * c->dim;
    size_t big = qkv > gu ? qkv : gu;
    big = big > emb ? big : emb;
    float *buf = malloc(big * sizeof(float));
    if (!m->layers || !buf) {
        rc = rd_fail(RD_ENOMEM, "model: cannot allocate %zu bytes of load buffers", big * sizeof(float));
        goto fail;
    }

    if ((rc = fetch(ctx, "model.embed_tokens.weight", c->vocab, c->dim, buf))) goto fail;
    if ((rc = be->ops->linear_load(be, buf, c->vocab, c->dim, &m->embed))) goto fail;
    if (c->tied_embeddings) {
        m->lm_head = m->embed;
    } else {
        if ((rc = fetch(ctx, "lm_head.weight", c->vocab, c->dim, buf))) goto fail;
        if ((rc = be->ops->linear_load(be, buf, c->vocab, c->dim, &m->lm_head))) goto fail;
    }
    if ((rc = fetch(ctx, "model.norm.weight", 1, c->dim, buf))) goto fail;
    if ((rc = upload_vector(be, buf, c->dim, &m->out_norm))) goto fail;
    for (int32_t l = 0; l < c->n_layers; l++)
        if ((rc = load_layer(m, l, buf, fetch, ctx))) goto fail;
    if ((rc = build_rope(m))) goto fail;

    int64_t per_layer = (int64_t)qkv + (int64_t)c->dim * c->n_heads * c->head_dim + (int64_t)gu +
                        (int64_t)c->dim * c->ffn_dim + 2 * c->dim;
    m->n_params = per_layer * c->n_layers + (int64_t)emb * (c->tied_embeddings ? 1 : 2) + c->dim;
    free(buf);
    *out = m;
    return 0;
fail:
    free(buf);
    model_free(m);
    return rc;
}

int model_load_gguf(const gguf_file *g, rd_backend *be, model **out)
{
    *out = NULL;
    model_config cfg;
    int rc = model_config_from_gguf(g, &cfg);
    if (rc)
        return rc;
    gguf_source src = {.g = g, .cfg = &cfg, .tmp = malloc((size_t)cfg.head_dim * cfg.dim * sizeof(float))};
    if (!src.tmp)
        return rd_fail(RD_ENOMEM, "model: out of memory");
    rc = model_build(&cfg, be, gguf_fetch, &src, out);
    free(src.tmp);
    return rc;
}

void model_free(model *m)
{
    if (!m)
        return;
    rd_backend *be = m->be;
    if (m->layers) {
        for (int32_t l = 0; l < m->cfg.n_layers; l++) {
            model_layer *L = &m->layers[l];
            be->ops->linear_free(be, L->qkv);
            be->ops->linear_free(be, L->o);
            be->ops->linear_free(be, L->gate_up);
            be->ops->linear_free(be, L->down);
            be->ops->free(be, L->attn_norm);
            be->ops->free(be, L->ffn_norm);
        }
        free(m->layers);
    }
    if (m->lm_head != m->embed)
        be->ops->linear_free(be, m->lm_head);
    be->ops->linear_free(be, m->embed);
    be->ops->free(be, m->out_norm);
    be->ops->free(be, m->rope);
    free(m);
}
