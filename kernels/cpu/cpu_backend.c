/* cpu_backend.c - the CPU implementation of rd_backend_ops.
 *
 * "Device" memory is host memory. Linear layers use the packed batch-invariant
 * GEMM (gemm.c); the rest are plain C loops parallelised over rows with
 * OpenMP. Every reduction runs in a fixed order inside one row, so a row's
 * result never depends on which other rows share the step. */
#include "kernels/cpu/cpu_backend.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/backend.h"
#include "base/err.h"
#include "kernels/cpu/attention.h"
#include "engine/format/gguf.h"
#include "engine/format/safetensors.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/gemm_quant.h"
#include "kernels/cpu/lora.h"
#include "kernels/cpu/moe.h"
#include "base/pool.h"

static void *cpu_alloc(rd_backend *be, size_t bytes)
{
    void *p = aligned_alloc(64, (bytes + 63) & ~(size_t)63);
    if (p)
        memset(p, 0, bytes);
    return p;
}

static void cpu_free(rd_backend *be, void *p) { free(p); }

static int cpu_copy(rd_backend *be, void *dst, const void *src, size_t bytes)
{
    memcpy(dst, src, bytes);
    return 0;
}


/* A linear layer's weight: fp32 panels (gemm.h), or its file dtypes
 * (gemm_quant.h). The embedding table is a linear too (row lookups). */
typedef struct {
    int native;                 /* 1: q holds it; 0: f does */
    gemm_weight f;
    gemm_qlinear q;
} cpu_lin;

static int cpu_linear_load(rd_backend *be, const float *w, int32_t out, int32_t in, void **handle)
{
    cpu_lin *L = calloc(1, sizeof *L);
    if (!L)
        return rd_fail(RD_ENOMEM, "cpu: cannot allocate a weight handle");
    int rc = gemm_pack(w, out, in, &L->f);
    if (rc) {
        free(L);
        return rc;
    }
    *handle = L;
    return 0;
}

/* RD_CPU_WEIGHTS=f32 widens every weight to fp32 at load (the path before
 * native weights, kept as the oracle the tests compare against); anything
 * else, or unset, keeps file dtypes. */
static int cpu_weights_f32(void)
{
    const char *v = getenv("RD_CPU_WEIGHTS");
    return v && !strcmp(v, "f32");
}

static int cpu_linear_load_q(rd_backend *be, const rd_wpart *parts, int32_t n_parts, int32_t in, void **handle);

/* FP8 blocks (serve_dtype fp8, which the CUDA backend runs) are held here as
 * bf16: a dequantized FP8 weight is exact in bf16 (quant_fp8.h), so the
 * products are those of the FP8 weight, at bf16's speed. The CPU serves fp8
 * to reproduce a GPU's fp8 policy (scoring, tests), not to save bytes. */
static int cpu_load_fp8_as_bf16(rd_backend *be, const rd_wpart *parts, int32_t n_parts, int32_t in, void **handle)
{
    rd_wpart bp[RD_WPART_MAX];
    uint16_t *conv[RD_WPART_MAX] = {0};
    float *row = malloc(sizeof(float) * (size_t)in);
    int rc = row ? 0 : rd_fail(RD_ENOMEM, "cpu: out of memory widening an fp8 weight");
    for (int32_t i = 0; i < n_parts && !rc; i++) {
        bp[i] = parts[i];
        if (parts[i].type != RD_TYPE_FP8_B32)
            continue;
        conv[i] = malloc(sizeof(uint16_t) * (size_t)parts[i].rows * in);
        if (!conv[i]) {
            rc = rd_fail(RD_ENOMEM, "cpu: out of memory widening an fp8 weight of %d rows", parts[i].rows);
            break;
        }
        const size_t rb = ggml_row_bytes(RD_TYPE_FP8_B32, (uint64_t)in);
        for (int32_t r = 0; r < parts[i].rows && !rc; r++) {
            rc = ggml_dequant_row(RD_TYPE_FP8_B32, (const uint8_t *)parts[i].data + (size_t)r * rb, row,
                                  (uint64_t)in);
            for (int32_t k = 0; k < in && !rc; k++)
                conv[i][(size_t)r * in + k] = rd_f32_to_bf16(row[k]);
        }
        bp[i].type = GGML_BF16;
        bp[i].data = conv[i];
    }
    if (!rc)
        rc = cpu_linear_load_q(be, bp, n_parts, in, handle);
    for (int32_t i = 0; i < n_parts; i++)
        free(conv[i]);
    free(row);
    return rc;
}

static int cpu_linear_load_q(rd_backend *be, const rd_wpart *parts, int32_t n_parts, int32_t in, void **handle)
{
    *handle = NULL;
    if (n_parts <= 0 || n_parts > GEMMQ_MAX_PARTS || in <= 0)
        return rd_fail(RD_EINVAL, "cpu: linear_load_q with %d parts of %d columns (expected 1..%d parts)", n_parts,
                       in, GEMMQ_MAX_PARTS);
    int32_t out = 0;
    int all_f32 = 1, ok = 1;
    for (int32_t i = 0; i < n_parts; i++) {
        if (parts[i].rows <= 0 || ggml_row_bytes(parts[i].type, (uint64_t)in) == 0)
            return rd_fail(RD_EINVAL, "cpu: weight part %d: %d rows of %d %s elements is not a shape the type allows",
                           i, parts[i].rows, in, ggml_type_name(parts[i].type));
        out += parts[i].rows;
        all_f32 &= parts[i].type == GGML_F32;
        ok &= gemm_qtype_ok(parts[i].type);
    }
    if (all_f32 && n_parts == 1)
        return cpu_linear_load(be, parts[0].data, out, in, handle);   /* already the fp32 GEMM's input */
    for (int32_t i = 0; i < n_parts; i++)
        if (parts[i].type == RD_TYPE_FP8_B32 && !cpu_weights_f32())
            return cpu_load_fp8_as_bf16(be, parts, n_parts, in, handle);
    if (cpu_weights_f32() || all_f32 || !ok) {
        /* fp32 panels: dequantize the parts one after the other (an F32
         * weight is already what the fp32 GEMM wants). */
        float *w = malloc((size_t)out * in * sizeof(float));
        if (!w)
            return rd_fail(RD_ENOMEM, "cpu: cannot allocate a [%d][%d] fp32 weight", out, in);
        int rc = 0;
        size_t at = 0;
        for (int32_t i = 0; i < n_parts && !rc; i++) {
            rc = ggml_dequant_row(parts[i].type, parts[i].data, w + at, (uint64_t)parts[i].rows * in);
            at += (size_t)parts[i].rows * in;
        }
        if (!rc)
            rc = cpu_linear_load(be, w, out, in, handle);
        free(w);
        return rc;
    }
    int rc = gemm_qreserve(in);
    cpu_lin *L = rc ? NULL : calloc(1, sizeof *L);
    if (!L)
        return rc ? rc : rd_fail(RD_ENOMEM, "cpu: cannot allocate a weight handle");
    L->native = 1;
    L->q.out = out;
    L->q.in = in;
    for (int32_t i = 0; i < n_parts; i++) {
        rc = gemm_qpack(parts[i].type, parts[i].data, parts[i].rows, in, &L->q.parts[i]);
        if (rc) {
            for (int32_t j = 0; j < i; j++)
                gemm_qrelease(&L->q.parts[j]);
            free(L);
            return rc;
        }
        L->q.n_parts = i + 1;
    }
    gemm_qlinear_index(&L->q);
    *handle = L;
    return 0;
}

static void cpu_linear_free(rd_backend *be, void *handle)
{
    cpu_lin *L = handle;
    if (!L)
        return;
    if (L->native)
        for (int32_t i = 0; i < L->q.n_parts; i++)
            gemm_qrelease(&L->q.parts[i]);
    else
        gemm_release(&L->f);
    free(L);
}

static int64_t cpu_linear_bytes(rd_backend *be, const void *handle)
{
    const cpu_lin *L = handle;
    if (!L->native)
        return (int64_t)L->f.n_panels * L->f.in * GEMM_PANEL * (int64_t)sizeof(float);
    int64_t n = 0;
    for (int32_t i = 0; i < L->q.n_parts; i++)
        n += (int64_t)gemm_qbytes(&L->q.parts[i]);
    return n;
}

static void cpu_linear_bytes_by_type(rd_backend *be, const void *handle, int64_t *bytes)
{
    const cpu_lin *L = handle;
    if (!L->native) {
        bytes[GGML_F32] += cpu_linear_bytes(be, handle);
        return;
    }
    for (int32_t i = 0; i < L->q.n_parts; i++)
        if (L->q.parts[i].type >= 0 && L->q.parts[i].type < RD_WEIGHT_TYPES)
            bytes[L->q.parts[i].type] += (int64_t)gemm_qbytes(&L->q.parts[i]);
}

static int cpu_linear_read(rd_backend *be, const void *handle, float *w_host)
{
    const cpu_lin *L = handle;
    if (!L->native) {
        gemm_unpack(&L->f, w_host);
        return 0;
    }
    for (int32_t r = 0; r < L->q.out; r++)
        gemm_qlinear_row(&L->q, r, w_host + (size_t)r * L->q.in);
    return 0;
}

static int cpu_linear_read_native(rd_backend *be, const void *handle, int32_t type, int32_t row0, int32_t rows,
                                  void *dst)
{
    const cpu_lin *L = handle;
    const int32_t out = L->native ? L->q.out : L->f.out, in = L->native ? L->q.in : L->f.in;
    if (row0 < 0 || rows <= 0 || row0 + rows > out)
        return rd_fail(RD_EINVAL, "cpu: rows [%d, %d) of a %d-row weight", row0, row0 + rows, out);
    if (!L->native) {           /* fp32 panels: exact for F32 only */
        if (type != GGML_F32)
            return RD_ENOTSUP;
        for (int32_t r = 0; r < rows; r++)
            gemm_row(&L->f, row0 + r, (float *)dst + (size_t)r * in);
        return 0;
    }
    /* Every part the rows touch must hold them in `type`. */
    for (int32_t i = 0; i < L->q.n_parts; i++) {
        int32_t a = L->q.row0[i], b = a + L->q.parts[i].out;
        if (b > row0 && a < row0 + rows && L->q.parts[i].type != type)
            return RD_ENOTSUP;
    }
    const size_t row_bytes = ggml_row_bytes((ggml_type)type, (uint64_t)in);
    for (int32_t i = 0; i < L->q.n_parts; i++) {
        int32_t a = L->q.row0[i], b = a + L->q.parts[i].out;
        int32_t lo = a > row0 ? a : row0, hi = b < row0 + rows ? b : row0 + rows;
        if (lo >= hi)
            continue;
        int rc = gemm_qraw(&L->q.parts[i], lo - a, hi - lo, (uint8_t *)dst + (size_t)(lo - row0) * row_bytes);
        if (rc)
            return rc;
    }
    return 0;
}

static void cpu_linear(rd_backend *be, const void *w, const float *x, int32_t m, float *y, int accumulate)
{
    const cpu_lin *L = w;
    if (L->native)
        gemm_qforward(&L->q, x, m, y, accumulate);
    else
        gemm_forward(&L->f, x, m, y, accumulate);
}

static void cpu_embed(rd_backend *be, const void *w, const int32_t *ids, int32_t m, float scale, float *out)
{
    const cpu_lin *L = w;
    const int32_t in = L->native ? L->q.in : L->f.in;
    for (int32_t i = 0; i < m; i++) {
        float *o = out + (size_t)i * in;
        if (L->native)
            gemm_qlinear_row(&L->q, ids[i], o);
        else
            gemm_row(&L->f, ids[i], o);
        if (scale != 1.0f)
            for (int32_t j = 0; j < in; j++)
                o[j] *= scale;
    }
}

/* One RMSNorm row: the sum of squares in double, then (x * inv) * w, with
 * w + off where off is not 0 (Gemma's 1 + w). out may be x (in place). */
static void rms_row(const float *x, const float *w, int32_t d, float eps, float off, float *out)
{
    double ss = 0.0;
    for (int32_t j = 0; j < d; j++)
        ss += (double)x[j] * x[j];
    float inv = (float)(1.0 / sqrt(ss / d + eps));
    if (off == 0.0f)
        for (int32_t j = 0; j < d; j++)
            out[j] = (x[j] * inv) * w[j];
    else
        for (int32_t j = 0; j < d; j++)
            out[j] = (x[j] * inv) * (w[j] + off);
}

static void cpu_rmsnorm(rd_backend *be, const float *x, const float *w, int32_t m, int32_t d, float eps,
                        float w_offset, float *out)
{
    for (int32_t i = 0; i < m; i++)
        rms_row(x + (size_t)i * d, w, d, eps, w_offset, out + (size_t)i * d);
}

static void cpu_add_bias(rd_backend *be, float *y, int32_t stride, int32_t m, int32_t n, const float *b)
{
    for (int32_t i = 0; i < m; i++) {
        float *yi = y + (size_t)i * stride;
        for (int32_t j = 0; j < n; j++)
            yi[j] += b[j];
    }
}

/* The same arithmetic as cpu_rmsnorm, one head at a time, in place. */
static void cpu_head_rmsnorm(rd_backend *be, float *x, int32_t stride, int32_t m, int32_t n_heads,
                             int32_t head_dim, const float *w, float eps, float w_offset)
{
    for (int32_t i = 0; i < m; i++)
        for (int32_t h = 0; h < n_heads; h++) {
            float *v = x + (size_t)i * stride + (size_t)h * head_dim;
            rms_row(v, w, head_dim, eps, w_offset, v);
        }
}

static void cpu_rmsnorm_add(rd_backend *be, const float *x, const float *w, int32_t m, int32_t d, float eps,
                            float w_offset, float *out, float *y)
{
    cpu_rmsnorm(be, x, w, m, d, eps, w_offset, out);
    for (int64_t i = 0; i < (int64_t)m * d; i++)
        y[i] += out[i];
}

static void cpu_rope(rd_backend *be, float *x, int32_t stride, int32_t m, int32_t n_heads, int32_t head_dim,
                     const int32_t *positions, const float *cos_sin)
{
    const int32_t half = head_dim / 2;
    for (int32_t i = 0; i < m; i++) {
        const float *cs = cos_sin + (size_t)positions[i] * half * 2;
        for (int32_t h = 0; h < n_heads; h++) {
            float *v = x + (size_t)i * stride + (size_t)h * head_dim;
            for (int32_t j = 0; j < half; j++) {
                float c = cs[2 * j], s = cs[2 * j + 1];
                float a = v[j], b = v[j + half];
                v[j] = a * c - b * s;
                v[j + half] = b * c + a * s;
            }
        }
    }
}

typedef struct {
    const float *gu;
    int32_t m, f;
    float *out;
} swiglu_job;

static void swiglu_task(void *ctx, int32_t t, int32_t worker)
{
    const swiglu_job *j = ctx;
    int32_t r1 = (t + 1) * 8 < j->m ? (t + 1) * 8 : j->m;
    for (int32_t i = t * 8; i < r1; i++) {
        const float *g = j->gu + (size_t)i * 2 * j->f, *u = g + j->f;
        float *o = j->out + (size_t)i * j->f;
        for (int32_t c = 0; c < j->f; c++)
            o[c] = g[c] / (1.0f + expf(-g[c])) * u[c];
    }
}

/* The one elementwise op with real cost (an exp per element): 8 rows a task. */
static void cpu_swiglu(rd_backend *be, const float *gu, int32_t m, int32_t f, float *out)
{
    swiglu_job j = {gu, m, f, out};
    pool_run((m + 7) / 8, swiglu_task, &j);
}

static void geglu_task(void *ctx, int32_t t, int32_t worker)
{
    const swiglu_job *j = ctx;
    int32_t r1 = (t + 1) * 8 < j->m ? (t + 1) * 8 : j->m;
    for (int32_t i = t * 8; i < r1; i++) {
        const float *g = j->gu + (size_t)i * 2 * j->f, *u = g + j->f;
        float *o = j->out + (size_t)i * j->f;
        for (int32_t c = 0; c < j->f; c++) {
            float x = g[c];
            float inner = 0.7978845608f * (x + 0.044715f * x * x * x);
            o[c] = 0.5f * x * (1.0f + tanhf(inner)) * u[c];
        }
    }
}

static void cpu_geglu(rd_backend *be, const float *gu, int32_t m, int32_t f, float *out)
{
    swiglu_job j = {gu, m, f, out};
    pool_run((m + 7) / 8, geglu_task, &j);
}

static void cpu_gather_rows(rd_backend *be, const float *x, const int32_t *rows, int32_t n, int32_t d,
                            float *out)
{
    for (int32_t i = 0; i < n; i++)
        memcpy(out + (size_t)i * d, x + (size_t)rows[i] * d, (size_t)d * sizeof(float));
}

/* The CPU backend: its ops table is its own copy, because kv_dtype changes
 * kv_elem_bytes per instance. */
typedef struct {
    rd_backend be;              /* first: the rd_backend * callers hold */
    rd_backend_ops ops;
    int kv_type;                /* CPU_KV_*: what the KV cache stores */
    cpu_moe_scratch moe;        /* the experts' buffers, reused between steps */
    cpu_lora_scratch lora;      /* lora_apply's row order, reused between calls */
} cpu_be;

static int kv_type_of(const rd_backend *be) { return ((const cpu_be *)be)->kv_type; }

/* Ops run when called; the one that can fail without a return value (lora_apply's scratch) says so here. */
static int cpu_sync(rd_backend *be)
{
    cpu_lora_scratch *l = &((cpu_be *)be)->lora;
    if (!l->failed)
        return 0;
    l->failed = 0;
    return rd_fail(RD_ENOMEM, "cpu: lora_apply: out of memory for its scratch; the step's LoRA terms are missing");
}

/* n floats into the cache's type: f32 as they are, bf16 and f16 rounded to
 * nearest even (what attention then widens back exactly). */
static void kv_store(int t, void *dst, const float *src, int32_t n)
{
    if (t == CPU_KV_F32) {
        memcpy(dst, src, (size_t)n * sizeof(float));
        return;
    }
    uint16_t *d = dst;
    for (int32_t i = 0; i < n; i++)
        d[i] = t == CPU_KV_BF16 ? rd_f32_to_bf16(src[i]) : st_f32_to_f16(src[i]);
}

static void cpu_kv_write(rd_backend *be, const rd_attn_shape *a, const float *k, const float *v,
                         int32_t stride, const rd_step_dev *s, float *k_cache, float *v_cache)
{
    const int32_t hd = a->head_dim, bs = a->block_size;
    const int t = kv_type_of(be);
    const size_t es = t == CPU_KV_F32 ? 4 : 2;
    for (int32_t i = 0; i < s->n_rows; i++) {
        int32_t block = s->slots[i] / bs, off = s->slots[i] % bs;
        for (int32_t h = 0; h < a->n_kv_heads; h++) {
            size_t dst = (((size_t)block * a->n_kv_heads + h) * bs + off) * hd * es;
            kv_store(t, (uint8_t *)k_cache + dst, k + (size_t)i * stride + (size_t)h * hd, hd);
            kv_store(t, (uint8_t *)v_cache + dst, v + (size_t)i * stride + (size_t)h * hd, hd);
        }
    }
}

static void cpu_attention_op(rd_backend *be, const rd_attn_shape *a, const float *q, int32_t stride,
                             const rd_step_dev *s, const float *k_cache, const float *v_cache, float *out)
{
    cpu_attention(kv_type_of(be), a, q, stride, s, k_cache, v_cache, out);
}

static void cpu_copy_blocks(rd_backend *be, const rd_attn_shape *a, float *k_cache, float *v_cache,
                            const int32_t *src, const int32_t *dst, int32_t n)
{
    size_t per_block = (size_t)a->n_kv_heads * a->block_size * a->head_dim * (kv_type_of(be) == CPU_KV_F32 ? 4 : 2);
    uint8_t *kc = (uint8_t *)k_cache, *vc = (uint8_t *)v_cache;
    for (int32_t i = 0; i < n; i++) {
        memcpy(kc + (size_t)dst[i] * per_block, kc + (size_t)src[i] * per_block, per_block);
        memcpy(vc + (size_t)dst[i] * per_block, vc + (size_t)src[i] * per_block, per_block);
    }
}

static int cpu_step_upload(rd_backend *be, const rd_step *h, rd_step_dev *d)
{
    /* Host memory is device memory: the views alias the caller's arrays. */
    d->n_rows = h->n_rows;
    d->n_seqs = h->n_seqs;
    d->max_blocks = h->max_blocks;
    d->token_ids = h->token_ids;
    d->positions = h->positions;
    d->slots = h->slots;
    d->q_start = h->q_start;
    d->ctx_len = h->ctx_len;
    d->block_tables = h->block_tables;
    return 0;
}

static void cpu_moe_route_op(rd_backend *be, const float *logits, int32_t m, int32_t n_experts, int32_t k, int norm,
                             int32_t *ids, float *weights)
{
    cpu_moe_route(logits, m, n_experts, k, norm, ids, weights);
}

static void cpu_moe_ffn_op(rd_backend *be, const rd_moe *moe, const float *x, const int32_t *ids,
                           const float *weights, int32_t m, int32_t k, float *y)
{
    cpu_moe_ffn(be, &((cpu_be *)be)->moe, moe, x, ids, weights, m, k, y);
}

static int cpu_lora_load_op(rd_backend *be, const rd_lora_w *w, void **handle) { return cpu_lora_load(w, handle); }
static void cpu_lora_free_op(rd_backend *be, void *handle) { cpu_lora_free(handle); }
static int64_t cpu_lora_bytes_op(rd_backend *be, const void *handle) { return cpu_lora_bytes(handle); }

static void cpu_lora_apply_op(rd_backend *be, const rd_lora_batch *lb, const float *x, const int32_t *slots,
                              int32_t m, float *y, int32_t y_stride, int32_t out_off)
{
    cpu_lora_apply(&((cpu_be *)be)->lora, lb, x, slots, m, y, y_stride, out_off);
}

static void cpu_destroy(rd_backend *be)
{
    cpu_lora_scratch_free(&((cpu_be *)be)->lora);
    cpu_moe_scratch_free(&((cpu_be *)be)->moe);
    free((cpu_be *)be);
}

/* kv_dtype: "auto" and "f32" store floats as they are; "bf16" and "f16" round
 * to nearest even, and attention widens them back exactly. */
static int cpu_set_kv_dtype(rd_backend *be, const char *name)
{
    cpu_be *cb = (cpu_be *)be;
    if (!strcmp(name, "fp8"))
        return rd_fail(RD_ENOTSUP, "kv_dtype \"fp8\": the cpu backend stores the KV cache as f32, bf16 or f16 (fp8 "
                       "is the cuda backend's)");
    cb->kv_type = !strcmp(name, "bf16") ? CPU_KV_BF16 : !strcmp(name, "f16") ? CPU_KV_F16 : CPU_KV_F32;
    cb->ops.kv_elem_bytes = cb->kv_type == CPU_KV_F32 ? 0 : 2;
    return 0;
}

static const rd_backend_ops cpu_ops = {
    .name = "cpu",
    .alloc = cpu_alloc,
    .free = cpu_free,
    .h2d = cpu_copy,
    .d2h = cpu_copy,
    .sync = cpu_sync,
    .linear_load = cpu_linear_load,
    .linear_free = cpu_linear_free,
    .linear_read = cpu_linear_read,
    .linear_read_native = cpu_linear_read_native,
    .linear_load_q = cpu_linear_load_q,
    .linear_bytes = cpu_linear_bytes,
    .linear_bytes_by_type = cpu_linear_bytes_by_type,
    .linear = cpu_linear,
    .embed = cpu_embed,
    .rmsnorm = cpu_rmsnorm,
    .add_bias = cpu_add_bias,
    .head_rmsnorm = cpu_head_rmsnorm,
    .rope = cpu_rope,
    .swiglu = cpu_swiglu,
    .geglu = cpu_geglu,
    .rmsnorm_add = cpu_rmsnorm_add,
    .gather_rows = cpu_gather_rows,
    .moe_route = cpu_moe_route_op,
    .moe_ffn = cpu_moe_ffn_op,
    .lora_load = cpu_lora_load_op,
    .lora_free = cpu_lora_free_op,
    .lora_bytes = cpu_lora_bytes_op,
    .lora_apply = cpu_lora_apply_op,
    .kv_write = cpu_kv_write,
    .attention = cpu_attention_op,
    .copy_blocks = cpu_copy_blocks,
    .step_upload = cpu_step_upload,
    .destroy = cpu_destroy,
    .set_kv_dtype = cpu_set_kv_dtype,
};

int rd_backend_cpu_create(int n_threads, rd_backend **out)
{
    cpu_be *cb = calloc(1, sizeof *cb);
    if (!cb)
        return rd_fail(RD_ENOMEM, "cpu backend: out of memory");
    cb->ops = cpu_ops;
    cb->kv_type = CPU_KV_F32;
    rd_backend *be = &cb->be;
    be->ops = &cb->ops;
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    pool_init(n_threads > 0 ? n_threads : (int)(cores > 0 ? cores : 1));
    be->n_threads = pool_size();
    *out = be;
    return 0;
}
