/* model.c - Llama config and weights from GGUF (see model.h); the HF
 * safetensors source and export live in model_hf.c. */
#include "engine/model/model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/err.h"

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

int model_rope_divisors(model_config *c)
{
    const int32_t half = c->head_dim / 2;
    if (c->rope_type == ROPE_FREQS)
        return 0;
    if (c->rope_type == ROPE_LINEAR && !(c->rope_factor > 0 && isfinite(c->rope_factor)))
        return rd_fail(RD_EINVAL, "model: linear rope_scaling factor %g; expected a positive number", c->rope_factor);
    if (c->rope_type == ROPE_LLAMA3 &&
        !(c->rope_factor > 0 && isfinite(c->rope_factor) && c->rope_low_freq > 0 &&
          c->rope_high_freq > c->rope_low_freq && isfinite(c->rope_high_freq) && c->rope_orig_ctx > 0))
        return rd_fail(RD_EINVAL, "model: llama3 rope_scaling factor %g, low_freq_factor %g, high_freq_factor %g, "
                       "original_max_position_embeddings %d; expected factor > 0, 0 < low < high, orig > 0",
                       c->rope_factor, c->rope_low_freq, c->rope_high_freq, c->rope_orig_ctx);
    for (int32_t i = 0; i < half; i++) {
        double div = 1.0;
        if (c->rope_type == ROPE_LINEAR) {
            div = c->rope_factor;
        } else if (c->rope_type == ROPE_LLAMA3) {
            /* transformers' _compute_llama3_parameters, as a divisor of the angle
             * (what llama.cpp's converter writes into rope_freqs.weight). */
            const double inv = pow((double)c->rope_theta, -2.0 * i / c->head_dim);
            const double wl = 2.0 * M_PI / inv, orig = c->rope_orig_ctx;
            const double lo = c->rope_low_freq, hi = c->rope_high_freq, f = c->rope_factor;
            if (wl < orig / hi) {
                div = 1.0;
            } else if (wl > orig / lo) {
                div = f;
            } else {
                double sm = (orig / wl - lo) / (hi - lo);
                div = 1.0 / ((1.0 - sm) / f + sm);
            }
        }
        c->rope_div[i] = (float)div;
    }
    return 0;
}

/* RoPE scaling from GGUF: llama.cpp's converter writes Llama 3's as the
 * tensor rope_freqs.weight (per-frequency divisors), linear scaling as keys. */
static int rope_from_gguf(const gguf_file *g, const char *arch, model_config *c)
{
    char key[128];
    gguf_str type = {0};
    snprintf(key, sizeof key, "%s.rope.scaling.type", arch);
    int have_type = gguf_get_str(g, key, &type) == 0;
    float factor = 0.0f, attn = 1.0f;
    snprintf(key, sizeof key, "%s.rope.scaling.factor", arch);
    int have_factor = gguf_get_f32(g, key, &factor) == 0;
    snprintf(key, sizeof key, "%s.rope.scaling.attn_factor", arch);
    if (gguf_get_f32(g, key, &attn) == 0 && attn != 1.0f)
        return rd_fail(RD_ENOTSUP, "model: %s is %g; RoPE attention factors are not supported (expected 1)", key, attn);
    int none = have_type && type.len == 4 && !memcmp(type.ptr, "none", 4);
    int linear = have_type && type.len == 6 && !memcmp(type.ptr, "linear", 6);
    if (have_type && !none && !linear)
        return rd_fail(RD_ENOTSUP, "model: %s.rope.scaling.type is \"%.*s\"; supported are \"none\" and \"linear\" "
                       "(Llama 3 scaling comes as rope_freqs.weight)", arch, (int)(type.len > 32 ? 32 : type.len),
                       type.ptr);
    c->rope_type = ROPE_PLAIN;
    if (have_factor && factor != 1.0f && factor != 0.0f) {
        if (none)
            return rd_fail(RD_ENOTSUP, "model: %s.rope.scaling.type is \"none\" but the factor is %g; expected 1",
                           arch, factor);
        c->rope_type = ROPE_LINEAR;
        c->rope_factor = factor;
    }
    const gguf_tensor *t = gguf_find_tensor(g, "rope_freqs.weight");
    if (!t)
        return model_rope_divisors(c);
    if (c->rope_type != ROPE_PLAIN)
        return rd_fail(RD_ENOTSUP, "model: rope_freqs.weight together with linear RoPE scaling is not supported");
    if (t->n_dims != 1 || (int64_t)t->ne[0] != c->head_dim / 2)
        return rd_fail(RD_EFORMAT, "model: tensor 'rope_freqs.weight' has %u dims, %llu entries; expected a vector "
                       "of head_dim / 2 = %d", t->n_dims, (unsigned long long)t->ne[0], c->head_dim / 2);
    int rc = gguf_dequant(t, c->rope_div);
    if (rc)
        return rd_fail(rc, "model: tensor 'rope_freqs.weight': %s", rd_errmsg());
    for (int32_t i = 0; i < c->head_dim / 2; i++)
        if (!(c->rope_div[i] > 0) || !isfinite(c->rope_div[i]))
            return rd_fail(RD_EFORMAT, "model: rope_freqs.weight[%d] is %g; expected a positive divisor", i,
                           c->rope_div[i]);
    c->rope_type = ROPE_FREQS;
    return 0;
}

int model_config_from_gguf(const gguf_file *g, model_config *c)
{
    memset(c, 0, sizeof *c);
    gguf_str arch;
    if (gguf_get_str(g, "general.architecture", &arch))
        return rd_fail(RD_EFORMAT, "model: general.architecture missing or not a string");
    const arch_desc *a = arch_by_name(arch.ptr, arch.len);
    if (!a)
        return rd_fail(RD_ENOTSUP, "model: architecture '%.*s' is not supported (supported: %s)",
                       (int)(arch.len > 30 ? 30 : arch.len), arch.ptr, arch_names());
    snprintf(c->arch, sizeof c->arch, "%s", a->name);
    const char *an = a->name;

    uint32_t v;
    int rc;
    if ((rc = get_u32(g, an, "block_count", &v, 1))) return rc;
    c->n_layers = (int32_t)v;
    if ((rc = get_u32(g, an, "embedding_length", &v, 1))) return rc;
    c->dim = (int32_t)v;
    if ((rc = get_u32(g, an, "attention.head_count", &v, 1))) return rc;
    c->n_heads = (int32_t)v;
    rc = get_u32(g, an, "attention.head_count_kv", &v, 0);
    if (rc && rc != RD_ENOENT) return rc;
    c->n_kv_heads = rc == RD_ENOENT ? c->n_heads : (int32_t)v;
    if ((rc = get_u32(g, an, "feed_forward_length", &v, 1))) return rc;
    c->ffn_dim = (int32_t)v;
    if ((rc = get_u32(g, an, "context_length", &v, 1))) return rc;
    c->max_ctx = (int32_t)v;

    char key[128];
    snprintf(key, sizeof key, "%s.rope.freq_base", an);
    if (gguf_get_f32(g, key, &c->rope_theta))
        c->rope_theta = 10000.0f; /* llama.cpp's default when absent */
    snprintf(key, sizeof key, "%s.attention.layer_norm_rms_epsilon", an);
    if (gguf_get_f32(g, key, &c->norm_eps))
        return rd_fail(RD_EFORMAT, "model: %s missing", key);

    if (c->n_layers <= 0 || c->n_layers > 512 || c->dim <= 0 || c->n_heads <= 0 || c->n_kv_heads <= 0 ||
        c->ffn_dim <= 0 || c->max_ctx <= 0 || c->n_heads % c->n_kv_heads)
        return rd_fail(RD_EFORMAT,
                       "model: inconsistent shape: layers %d dim %d heads %d kv_heads %d ffn %d ctx %d "
                       "(need heads %% kv_heads == 0)",
                       c->n_layers, c->dim, c->n_heads, c->n_kv_heads, c->ffn_dim, c->max_ctx);
    /* head_dim: attention.key_length where given (Qwen3), else dim / heads. */
    rc = get_u32(g, an, "attention.key_length", &v, 0);
    if (rc && rc != RD_ENOENT) return rc;
    if (rc == 0) {
        c->head_dim = (int32_t)v;
        uint32_t vl;
        rc = get_u32(g, an, "attention.value_length", &vl, 0);
        if (rc && rc != RD_ENOENT) return rc;
        if (rc == 0 && vl != v)
            return rd_fail(RD_ENOTSUP, "model: %s.attention.value_length %u != key_length %u (expected equal)", an,
                           vl, v);
    } else {
        if (c->dim % c->n_heads)
            return rd_fail(RD_EFORMAT, "model: embedding_length %d is not a multiple of head_count %d and "
                           "%s.attention.key_length is absent: no head_dim", c->dim, c->n_heads, an);
        c->head_dim = c->dim / c->n_heads;
    }
    if (c->head_dim <= 0 || c->head_dim % 2 || c->head_dim > MODEL_MAX_HEAD_DIM)
        return rd_fail(RD_EFORMAT, "model: head_dim %d; expected an even number up to %d", c->head_dim,
                       MODEL_MAX_HEAD_DIM);
    rc = get_u32(g, an, "rope.dimension_count", &v, 0);
    if (rc == 0 && (int32_t)v != c->head_dim)
        return rd_fail(RD_ENOTSUP, "model: %s.rope.dimension_count %u != head_dim %d (partial RoPE unsupported)", an,
                       v, c->head_dim);

    const gguf_tensor *emb = gguf_find_tensor(g, "token_embd.weight");
    if (!emb || emb->n_dims != 2)
        return rd_fail(RD_EFORMAT, "model: tensor token_embd.weight missing or not 2-D");
    c->vocab = (int32_t)emb->ne[1];
    c->tied_embeddings = gguf_find_tensor(g, "output.weight") == NULL;
    if (!isfinite(c->rope_theta) || c->rope_theta <= 0 || !(c->norm_eps > 0))
        return rd_fail(RD_EFORMAT, "model: rope theta %g / rms eps %g out of range", c->rope_theta, c->norm_eps);
    if ((rc = rope_from_gguf(g, an, c)))
        return rc;
    return a->check_gguf ? a->check_gguf(g, c) : 0;
}

int64_t model_kv_bytes_per_token(const model_config *c)
{
    return (int64_t)c->n_layers * 2 * c->n_kv_heads * c->head_dim * (int64_t)sizeof(float);
}

/* A GGUF tensor holding [rows][cols] in HF terms (GGUF ne = {cols, rows}),
 * or for an AT_EXPERT tensor every expert's (ne = {cols, rows, n_experts}):
 * the bytes of expert e's slice. NULL with *why set when it is not that shape. */
static const uint8_t *tensor_slice(const gguf_tensor *t, int64_t rows, int64_t cols, int32_t n_experts, int32_t e,
                                   size_t *nbytes)
{
    uint32_t dims = n_experts ? 3 : rows == 1 ? 1 : 2;
    if (t->n_dims != dims || (int64_t)t->ne[0] != cols || (dims > 1 && (int64_t)t->ne[1] != rows) ||
        (dims == 3 && (int64_t)t->ne[2] != n_experts))
        return NULL;
    *nbytes = n_experts ? t->nbytes / (uint64_t)n_experts : t->nbytes;
    return t->data + (size_t)e * *nbytes;
}

/* Dequantizes tensor `name` (expert e's slice of it when n_experts > 0),
 * checking its shape. */
static int load_matrix(const gguf_file *g, const char *name, int64_t rows, int64_t cols, int32_t n_experts,
                       int32_t e, float *dst)
{
    const gguf_tensor *t = gguf_find_tensor(g, name);
    if (!t)
        return rd_fail(RD_EFORMAT, "model: tensor '%s' missing", name);
    size_t nb;
    const uint8_t *src = tensor_slice(t, rows, cols, n_experts, e, &nb);
    if (!src && n_experts)
        return rd_fail(RD_EFORMAT, "model: tensor '%s' has shape [%llu, %llu, %llu] (ggml order), expected [%lld, "
                       "%lld, %d]", name, (unsigned long long)t->ne[0], (unsigned long long)t->ne[1],
                       (unsigned long long)t->ne[2], (long long)cols, (long long)rows, n_experts);
    if (!src)
        return rd_fail(RD_EFORMAT, "model: tensor '%s' has shape [%llu, %llu] (ggml order), expected [%lld, %lld]",
                       name, (unsigned long long)t->ne[0], (unsigned long long)t->ne[1], (long long)cols,
                       (long long)rows);
    int rc = n_experts ? ggml_dequant_row(t->type, src, dst, (uint64_t)(rows * cols)) : gguf_dequant(t, dst);
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

/* unpermute_rows on rows of row_bytes file bytes (a quantized row holds
 * whole blocks of one output feature, so rows move as they are). */
static void unpermute_raw(uint8_t *w, int32_t n_heads, int32_t hd, size_t row_bytes, uint8_t *tmp)
{
    const int32_t half = hd / 2;
    for (int32_t h = 0; h < n_heads; h++) {
        uint8_t *head = w + (size_t)h * hd * row_bytes;
        memcpy(tmp, head, row_bytes * (size_t)hd);
        for (int32_t i = 0; i < half; i++)
            for (int32_t j = 0; j < 2; j++)
                memcpy(head + (size_t)(j * half + i) * row_bytes, tmp + (size_t)(2 * i + j) * row_bytes, row_bytes);
    }
}

static int upload_vector(rd_backend *be, const float *src, int32_t n, float **dst)
{
    *dst = be->ops->alloc(be, sizeof(float) * (size_t)n);
    if (!*dst)
        return rd_fail(RD_ENOMEM, "model: backend alloc of %d floats failed", n);
    return be->ops->h2d(be, *dst, src, sizeof(float) * (size_t)n);
}

/* cos/sin of pos * theta^(-2i/hd) / div[i] (div NULL: 1), computed in
 * double so every backend gets the same table. */
static int build_rope_table(model *m, double theta, const float *div, float **out)
{
    const model_config *c = &m->cfg;
    int32_t half = c->head_dim / 2;
    size_t n = (size_t)c->max_ctx * half * 2;
    float *t = malloc(n * sizeof(float));
    double *inv = malloc((size_t)half * sizeof(double)); /* a pair's frequency, the same at every position */
    if (!t || !inv) {
        free(t);
        free(inv);
        return rd_fail(RD_ENOMEM, "model: cannot allocate RoPE table");
    }
    for (int32_t i = 0; i < half; i++)
        inv[i] = pow(theta, -2.0 * i / c->head_dim) / (div ? (double)div[i] : 1.0);
    for (int32_t p = 0; p < c->max_ctx; p++)
        for (int32_t i = 0; i < half; i++) {
            double ang = p * inv[i];
            t[((size_t)p * half + i) * 2] = (float)cos(ang);
            t[((size_t)p * half + i) * 2 + 1] = (float)sin(ang);
        }
    *out = m->be->ops->alloc(m->be, n * sizeof(float));
    int rc = *out ? m->be->ops->h2d(m->be, *out, t, n * sizeof(float))
                  : rd_fail(RD_ENOMEM, "model: backend alloc for RoPE table failed");
    free(t);
    free(inv);
    return rc;
}

/* The global table (with the scaling divisors) and, for a model with
 * sliding-window layers, the local one at its own base without scaling. */
static int build_rope(model *m)
{
    const model_config *c = &m->cfg;
    int rc = build_rope_table(m, c->rope_theta, c->rope_div, &m->rope);
    if (!rc && c->sliding_window > 0)
        rc = build_rope_table(m, c->rope_local_theta, NULL, &m->rope_local);
    return rc;
}

/* GGUF as a source of HF-named fp32 tensors: the name is mapped to
 * llama.cpp's through the family's table, the tensor dequantized, and Q/K
 * rows un-permuted where the family's converter permutes them, so
 * model_build sees exactly what an HF checkpoint would hold. */
typedef struct {
    const gguf_file *g;
    const model_config *cfg;
    const arch_desc *arch;
    float *tmp;                 /* [head_dim][dim] scratch for unpermute_rows */
} gguf_source;

static int gguf_fetch(void *ctx, const char *hf, int64_t rows, int64_t cols, float *dst)
{
    gguf_source *src = ctx;
    const arch_tensor *t;
    int32_t layer, expert;
    if (arch_resolve_hf(src->arch, src->cfg, hf, &t, &layer, &expert))
        return rd_fail(RD_EINVAL, "model: no GGUF tensor for '%s'", hf);
    char name[128];
    arch_gguf_name(t, layer, name, sizeof name);
    int rc = load_matrix(src->g, name, rows, cols, (t->flags & AT_EXPERT) ? src->cfg->n_experts : 0, expert, dst);
    if (rc)
        return rc;
    if (t->flags & (AT_PERMUTE_Q | AT_PERMUTE_K))
        unpermute_rows(dst, (t->flags & AT_PERMUTE_Q) ? src->cfg->n_heads : src->cfg->n_kv_heads,
                       src->cfg->head_dim, (int32_t)cols, src->tmp);
    /* The one place Gemma's norm convention is converted: llama.cpp's
     * converter stores 1 + w, the model holds HF's w (the norm ops add 1). */
    if (t->flags & AT_NORM_1P)
        for (int64_t i = 0; i < rows * cols; i++)
            dst[i] -= 1.0f;
    return 0;
}

/* The same tensor as its file bytes (row-major, HF row order), for
 * backends that keep file dtypes. 1 (not an error) when it cannot come raw
 * (a conversion other than a row permutation): the caller fetches fp32. */
static int gguf_fetch_raw(void *ctx, const char *hf, int64_t rows, int64_t cols, int32_t *type, uint8_t *dst,
                          size_t cap, size_t *nbytes)
{
    gguf_source *src = ctx;
    const arch_tensor *t;
    int32_t layer, expert;
    if (arch_resolve_hf(src->arch, src->cfg, hf, &t, &layer, &expert))
        return rd_fail(RD_EINVAL, "model: no GGUF tensor for '%s'", hf);
    if (t->flags & AT_NORM_1P)
        return 1;
    char name[128];
    arch_gguf_name(t, layer, name, sizeof name);
    const gguf_tensor *g = gguf_find_tensor(src->g, name);
    size_t nb = 0;
    const uint8_t *data =
        g && rows > 1 ? tensor_slice(g, rows, cols, (t->flags & AT_EXPERT) ? src->cfg->n_experts : 0, expert, &nb)
                      : NULL;
    if (!data)
        return 1;               /* load_matrix says what is wrong */
    size_t row_bytes = ggml_row_bytes(g->type, (uint64_t)cols);
    if (row_bytes == 0 || row_bytes * (size_t)rows != nb || nb > cap)
        return 1;
    memcpy(dst, data, nb);
    if (t->flags & (AT_PERMUTE_Q | AT_PERMUTE_K))
        unpermute_raw(dst, (t->flags & AT_PERMUTE_Q) ? src->cfg->n_heads : src->cfg->n_kv_heads, src->cfg->head_dim,
                      row_bytes, (uint8_t *)src->tmp);
    *type = (int32_t)g->type;
    *nbytes = nb;
    return 0;
}

void **model_weight_slot(model *m, arch_group g, int32_t layer, int32_t expert)
{
    model_layer *L = arch_group_per_layer(g) ? &m->layers[layer] : NULL;
    switch (g) {
    case AG_EMBED: return &m->embed;
    case AG_LM_HEAD: return &m->lm_head;
    case AG_OUT_NORM: return (void **)&m->out_norm;
    case AG_QKV: return &L->qkv;
    case AG_QKV_BIAS: return (void **)&L->qkv_bias;
    case AG_O: return &L->o;
    case AG_GATE_UP: return &L->gate_up;
    case AG_DOWN: return &L->down;
    case AG_ATTN_NORM: return (void **)&L->attn_norm;
    case AG_FFN_NORM: return (void **)&L->ffn_norm;
    case AG_Q_NORM: return (void **)&L->q_norm;
    case AG_K_NORM: return (void **)&L->k_norm;
    case AG_POST_ATTN_NORM: return (void **)&L->post_attn_norm;
    case AG_POST_FFN_NORM: return (void **)&L->post_ffn_norm;
    case AG_ROUTER: return &L->router;
    case AG_EXP_GATE_UP: return L->exp_gate_up ? &L->exp_gate_up[expert] : NULL;
    case AG_EXP_DOWN: return L->exp_down ? &L->exp_down[expert] : NULL;
    case AG_COUNT: break;
    }
    return NULL;
}

/* Loads linear group g (layer l) from its members' file bytes, packed one
 * after the other into buf (cap bytes): consecutive members of one dtype
 * become one part. 1 when some member cannot come raw (the caller takes the
 * fp32 path), else 0 or an error. */
static int load_group_raw(model *m, arch_group g, int32_t l, int32_t e, uint8_t *buf, size_t cap,
                          model_fetch_raw_fn fetch_raw, void *ctx)
{
    const model_config *c = &m->cfg;
    const arch_desc *a = m->arch;
    rd_backend *be = m->be;
    int64_t rows, cols;
    arch_group_shape(a, c, g, &rows, &cols);
    rd_wpart parts[RD_WPART_MAX];
    int32_t n_parts = 0;
    size_t used = 0;
    int64_t next_row = 0;
    for (int32_t i = 0; i < a->n_tensors; i++) {
        const arch_tensor *t = &a->tensors[i];
        if (t->group != g)
            continue;
        char name[128];
        arch_hf_name(t, l, e, name, sizeof name);
        int64_t at = arch_tensor_row0(a, c, t);
        int64_t tr = arch_dim_value(c, t->rows), tc = arch_dim_value(c, t->cols);
        if (at != next_row || tc != cols)
            return 1;           /* members not stacked in table order: the fp32 path places them */
        int32_t type;
        size_t nb;
        int rc = fetch_raw(ctx, name, tr, tc, &type, buf + used, cap - used, &nb);
        if (rc)
            return rc;
        if (n_parts > 0 && parts[n_parts - 1].type == type) {
            parts[n_parts - 1].rows += (int32_t)tr;
        } else {
            if (n_parts == RD_WPART_MAX)
                return 1;
            parts[n_parts++] = (rd_wpart){.type = type, .rows = (int32_t)tr, .data = buf + used};
        }
        used += (nb + 63) & ~(size_t)63;
        if (used > cap)
            return 1;
        next_row = at + tr;
    }
    if (next_row != rows)
        return 1;
    return be->ops->linear_load_q(be, parts, n_parts, (int32_t)cols, model_weight_slot(m, g, l, e));
}

/* Fetches every member of group g (layer l, expert e) into buf at its
 * place in the fused layout and loads the group into the backend. */
static int load_group(model *m, arch_group g, int32_t l, int32_t e, float *buf, size_t buf_floats,
                      model_fetch_fn fetch, model_fetch_raw_fn fetch_raw, void *ctx)
{
    const model_config *c = &m->cfg;
    const arch_desc *a = m->arch;
    rd_backend *be = m->be;
    int64_t rows, cols;
    arch_group_shape(a, c, g, &rows, &cols);
    if (rows == 0 || (g == AG_LM_HEAD && c->tied_embeddings))
        return 0;
    const int linear = arch_group_is_linear(g);
    if (linear && fetch_raw && be->ops->linear_load_q) {
        int rc = load_group_raw(m, g, l, e, (uint8_t *)buf, buf_floats * sizeof(float), fetch_raw, ctx);
        if (rc <= 0)
            return rc;
    }
    for (int32_t i = 0; i < a->n_tensors; i++) {
        const arch_tensor *t = &a->tensors[i];
        if (t->group != g)
            continue;
        char name[128];
        arch_hf_name(t, l, e, name, sizeof name);
        int64_t at = arch_tensor_row0(a, c, t);
        int64_t tr = arch_dim_value(c, t->rows), tc = arch_dim_value(c, t->cols);
        int rc = fetch(ctx, name, linear ? tr : 1, tc, linear ? buf + at * cols : buf + at);
        if (rc == RD_EFORMAT && strstr(rd_errmsg(), "has shape") && (t->rows == AD_Q || t->rows == AD_KV || t->cols == AD_Q || t->cols == AD_KV ||
                                 t->cols == AD_HEAD)) {
            /* A shape that follows from head_dim: say where the expectation comes from. */
            char msg[512];
            snprintf(msg, sizeof msg, "%s", rd_errmsg());
            return rd_fail(rc, "%s (from %d heads, %d kv heads, head_dim %d)", msg, c->n_heads, c->n_kv_heads,
                           c->head_dim);
        }
        if (rc)
            return rc;
    }
    void **slot = model_weight_slot(m, g, l, e);
    if (linear)
        return be->ops->linear_load(be, buf, (int32_t)rows, (int32_t)cols, slot);
    return upload_vector(be, buf, (int32_t)cols, (float **)slot);
}

int model_build(const model_config *cfg, rd_backend *be, model_fetch_fn fetch, void *ctx, model **out)
{
    return model_build_raw(cfg, be, fetch, NULL, ctx, out);
}

int model_build_raw(const model_config *cfg, rd_backend *be, model_fetch_fn fetch, model_fetch_raw_fn fetch_raw,
                    void *ctx, model **out)
{
    *out = NULL;
    const arch_desc *a = arch_by_name(cfg->arch, strlen(cfg->arch));
    if (!a)
        return rd_fail(RD_ENOTSUP, "model: architecture '%.31s' is not supported (supported: %s)", cfg->arch,
                       arch_names());
    model *m = calloc(1, sizeof *m);
    if (!m)
        return rd_fail(RD_ENOMEM, "model: out of memory");
    m->be = be;
    m->cfg = *cfg;
    m->arch = a;
    const model_config *c = &m->cfg;
    /* The divisors follow the scaling parameters (a config built by hand
     * need not fill them); only given ones (ROPE_FREQS) are kept. */
    int rc = c->head_dim > 0 && c->head_dim % 2 == 0 && c->head_dim <= MODEL_MAX_HEAD_DIM
                 ? model_rope_divisors(&m->cfg)
                 : rd_fail(RD_EINVAL, "model: head_dim %d; expected an even number up to %d", c->head_dim,
                           MODEL_MAX_HEAD_DIM);
    if (rc) {
        free(m);
        return rc;
    }
    m->layers = calloc((size_t)c->n_layers, sizeof *m->layers);
    int experts_ok = 1;
    for (int32_t l = 0; m->layers && l < c->n_layers && c->n_experts > 0; l++) {
        m->layers[l].exp_gate_up = calloc((size_t)c->n_experts, sizeof(void *));
        m->layers[l].exp_down = calloc((size_t)c->n_experts, sizeof(void *));
        experts_ok &= m->layers[l].exp_gate_up && m->layers[l].exp_down;
    }

    /* One host buffer big enough for the largest group (fused or embedding). */
    size_t big = 0;
    for (int g = 0; g < AG_COUNT; g++) {
        int64_t rows, cols;
        arch_group_shape(a, c, (arch_group)g, &rows, &cols);
        if ((size_t)(rows * cols) > big)
            big = (size_t)(rows * cols);
    }
    float *buf = malloc(big * sizeof(float));
    if (!m->layers || !buf || !experts_ok) {
        rc = rd_fail(RD_ENOMEM, "model: cannot allocate %zu bytes of load buffers", big * sizeof(float));
        goto fail;
    }
    for (int g = 0; g < AG_FIRST_LAYER; g++)
        if ((rc = load_group(m, (arch_group)g, -1, 0, buf, big, fetch, fetch_raw, ctx))) goto fail;
    if (c->tied_embeddings)
        m->lm_head = m->embed;
    for (int32_t l = 0; l < c->n_layers; l++)
        for (int g = AG_FIRST_LAYER; g < AG_COUNT; g++)
            for (int32_t e = 0; e < arch_group_units(c, (arch_group)g); e++)
                if ((rc = load_group(m, (arch_group)g, l, e, buf, big, fetch, fetch_raw, ctx))) goto fail;
    if ((rc = build_rope(m))) goto fail;

    for (int32_t i = 0; i < a->n_tensors; i++) {
        const arch_tensor *t = &a->tensors[i];
        if (arch_tensor_present(c, t))
            m->n_params += arch_dim_value(c, t->rows) * arch_dim_value(c, t->cols) *
                           (arch_group_per_layer(t->group) ? c->n_layers : 1) * arch_group_units(c, t->group);
    }
    free(buf);
    model_count_bytes(m);
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
    gguf_source src = {.g = g, .cfg = &cfg, .arch = arch_by_name(cfg.arch, strlen(cfg.arch)),
                       .tmp = malloc((size_t)cfg.head_dim * cfg.dim * sizeof(float))};
    if (!src.tmp)
        return rd_fail(RD_ENOMEM, "model: out of memory");
    rc = model_build_raw(&cfg, be, gguf_fetch, gguf_fetch_raw, &src, out);
    free(src.tmp);
    return rc;
}

void model_count_bytes(model *m)
{
    const model_config *c = &m->cfg;
    rd_backend *be = m->be;
    int64_t n = 0, by[RD_WEIGHT_TYPES] = {0};
    const int typed = be->ops->linear_bytes_by_type != NULL;
    for (int32_t l = -1; l < c->n_layers; l++)
        for (int g = l < 0 ? 0 : AG_FIRST_LAYER; g < (l < 0 ? AG_FIRST_LAYER : AG_COUNT); g++)
        for (int32_t e = 0; e < (l < 0 ? 1 : arch_group_units(c, (arch_group)g)); e++) {
            void **slot = model_weight_slot(m, (arch_group)g, l, e);
            if (!slot || !*slot || (g == AG_LM_HEAD && m->lm_head == m->embed))
                continue;
            int64_t rows, cols;
            arch_group_shape(m->arch, c, (arch_group)g, &rows, &cols);
            if (arch_group_is_linear((arch_group)g)) {
                n += be->ops->linear_bytes ? be->ops->linear_bytes(be, *slot)
                                           : rows * cols * (int64_t)sizeof(float);
                if (typed)
                    be->ops->linear_bytes_by_type(be, *slot, by);
            } else {
                n += cols * (int64_t)sizeof(float);
                by[GGML_F32] += cols * (int64_t)sizeof(float);
            }
        }
    __atomic_store_n(&m->weights_bytes, n, __ATOMIC_RELAXED);   /* /status reads it from the loop thread */
    for (int t = 0; t < RD_WEIGHT_TYPES; t++)   /* a reader between two stores sees a mix of two counts, at worst */
        __atomic_store_n(&m->weights_bytes_by_type[t], typed ? by[t] : 0, __ATOMIC_RELAXED);
}

static void free_slot(model *m, arch_group g, int32_t l, int32_t e)
{
    void **slot = model_weight_slot(m, g, l, e);
    if (!slot || !*slot)
        return;
    if (arch_group_is_linear(g))
        m->be->ops->linear_free(m->be, *slot);
    else
        m->be->ops->free(m->be, *slot);
    *slot = NULL;
}

/* Frees every weight buffer and the layer table; the struct, its config and
 * its backend stay. */
static void free_weights(model *m)
{
    rd_backend *be = m->be;
    for (int32_t l = 0; m->layers && l < m->cfg.n_layers; l++) {
        for (int g = AG_FIRST_LAYER; g < AG_COUNT; g++)
            for (int32_t e = 0; e < arch_group_units(&m->cfg, (arch_group)g); e++)
                free_slot(m, (arch_group)g, l, e);
        if (m->layers[l].exp_gate_up && be->ops->moe_release) {
            const rd_moe moe = {.n_experts = m->cfg.n_experts, .ffn = m->cfg.expert_ffn_dim, .dim = m->cfg.dim,
                                .gate_up = m->layers[l].exp_gate_up, .down = m->layers[l].exp_down};
            be->ops->moe_release(be, &moe);
        }
        free(m->layers[l].exp_gate_up);
        free(m->layers[l].exp_down);
    }
    free(m->layers);
    m->layers = NULL;
    if (m->lm_head == m->embed)
        m->lm_head = NULL;
    for (int g = 0; g < AG_FIRST_LAYER; g++)
        free_slot(m, (arch_group)g, -1, 0);
    if (m->rope)
        be->ops->free(be, m->rope);
    if (m->rope_local)
        be->ops->free(be, m->rope_local);
    m->rope = m->rope_local = NULL;
    m->embed = m->lm_head = m->out_norm = NULL;
    m->weights_bytes = 0;
}

void model_free(model *m)
{
    if (!m)
        return;
    free_weights(m);
    free(m);
}

void model_drop_weights(model *m)
{
    free_weights(m);
    m->weights_gen++;
}

int model_adopt(model *m, model *src)
{
    const model_config *a = &m->cfg, *b = &src->cfg;
    if (strcmp(a->arch, b->arch) || a->n_layers != b->n_layers || a->dim != b->dim || a->vocab != b->vocab ||
        a->n_heads != b->n_heads || a->n_kv_heads != b->n_kv_heads || a->head_dim != b->head_dim ||
        a->ffn_dim != b->ffn_dim || a->n_experts != b->n_experts || a->max_ctx != b->max_ctx || m->be != src->be)
        return rd_fail(RD_EINVAL, "the weights read back are of another shape (%s, %d layers, dim %d) than the "
                       "model serving (%s, %d layers, dim %d)", b->arch, b->n_layers, b->dim, a->arch, a->n_layers,
                       a->dim);
    uint64_t gen = m->weights_gen;
    free_weights(m);
    *m = *src;
    m->weights_gen = gen + 1;
    free(src);
    return 0;
}
