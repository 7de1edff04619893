/* attention.c - paged causal attention over the block-table KV cache.
 *
 * For a row at position p of sequence s and a query head h (kv head
 * h / group): scores over keys 0..p gathered through the block table, a
 * max-subtracted softmax summed in key order, then the weighted sum of values
 * in key order. Work is split over (row, kv head) pairs; the K and V of one kv
 * head are read once for all query heads of its group (GQA).
 *
 * The cache holds f32, bf16 or f16 (kv_dtype). A 16-bit element is widened
 * to the float it stands for, exactly, as it is loaded; every operation after
 * that is the f32 path's, in its order. So attention over a 16-bit cache
 * equals attention over an f32 cache holding the rounded values, bit for bit,
 * and an f32 cache runs the same code as before kv_dtype existed. */
#include "kernels/cpu/attention.h"

#include <immintrin.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/cpu_isa.h"
#include "base/pool.h"
#include "engine/format/gguf.h"

/* Row index -> sequence index, by scanning q_start (rows are grouped). */
static int32_t row_seq(const rd_step_dev *s, int32_t row)
{
    int32_t lo = 0, hi = s->n_seqs - 1;
    while (lo < hi) {
        int32_t mid = (lo + hi + 1) / 2;
        if (s->q_start[mid] <= row)
            lo = mid;
        else
            hi = mid - 1;
    }
    return lo;
}

typedef struct {
    const rd_attn_shape *a;
    const float *q;
    int32_t stride;
    const rd_step_dev *s;
    const uint8_t *k_cache, *v_cache;  /* elements of type kv_type */
    int kv_type;                /* CPU_KV_* */
    float *out;
    int32_t max_ctx;            /* longest context in the step */
    float *scratch;             /* [workers][max_ctx * group + head_dim * group] */
} attn_job;

/* The kernel body three times, one copy per vector path (base/cpu_isa.h). */
#define ISA_CAT(a, b) a##_##b
#define ISA_EXPAND(a, b) ISA_CAT(a, b)

#pragma GCC push_options
#pragma GCC target("avx512f,avx2,fma,f16c")
#define ISA_NAME(x) ISA_EXPAND(x, avx512)
#include "kernels/cpu/attention_body.h"
#undef ISA_NAME
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#define ISA_NAME(x) ISA_EXPAND(x, avx2)
#include "kernels/cpu/attention_body.h"
#undef ISA_NAME
#pragma GCC pop_options

#define ISA_NAME(x) ISA_EXPAND(x, scalar)
#include "kernels/cpu/attention_body.h"
#undef ISA_NAME

typedef void (*attn_task)(void *ctx, int32_t item, int32_t worker);

/* [cpu_isa][kv type]: the task for this host's path and this cache. */
static const attn_task attn_tasks[CPU_ISA_COUNT][3] = {
    [CPU_ISA_SCALAR] = {attn_task_f32_scalar, attn_task_bf16_scalar, attn_task_f16_scalar},
    [CPU_ISA_AVX2] = {attn_task_f32_avx2, attn_task_bf16_avx2, attn_task_f16_avx2},
    [CPU_ISA_AVX512] = {attn_task_f32_avx512, attn_task_bf16_avx512, attn_task_f16_avx512},
};

void cpu_attention(int kv_type, const rd_attn_shape *a, const float *q, int32_t stride, const rd_step_dev *s,
                   const void *k_cache, const void *v_cache, float *out)
{
    const int32_t group = a->n_heads / a->n_kv_heads;
    int32_t max_ctx = 1;
    for (int32_t i = 0; i < s->n_rows; i++)
        if (s->positions[i] + 1 > max_ctx)
            max_ctx = s->positions[i] + 1;
    size_t per_worker = (size_t)max_ctx * group + (size_t)a->head_dim * group;
    float *scratch = malloc(sizeof(float) * per_worker * pool_size());
    if (!scratch)
        return; /* out of memory: the caller's step fails on its next allocation */
    attn_job J = {a, q, stride, s, k_cache, v_cache, kv_type, out, max_ctx, scratch};
    const int t = kv_type == CPU_KV_BF16 || kv_type == CPU_KV_F16 ? kv_type : CPU_KV_F32;
    pool_run(s->n_rows * a->n_kv_heads, attn_tasks[cpu_isa_active()][t], &J);
    free(scratch);
}
