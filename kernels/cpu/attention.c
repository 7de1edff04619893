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

#include "base/pool.h"

/* 8 (16) cache elements of type T at element index i of p, as floats. */
static inline __attribute__((always_inline)) __m256 ld8(const void *p, size_t i, int T)
{
    if (T == CPU_KV_F32)
        return _mm256_loadu_ps((const float *)p + i);
    __m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)p + i));
    if (T == CPU_KV_F16)
        return _mm256_cvtph_ps(h);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}
#if defined(__AVX512F__)
static inline __attribute__((always_inline)) __m512 ld16(const void *p, size_t i, int T)
{
    if (T == CPU_KV_F32)
        return _mm512_loadu_ps((const float *)p + i);
    __m256i h = _mm256_loadu_si256((const __m256i *)((const uint16_t *)p + i));
    if (T == CPU_KV_F16)
        return _mm512_cvtph_ps(h);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}
#endif
static inline __attribute__((always_inline)) float ld1(const void *p, size_t i, int T)
{
    if (T == CPU_KV_F32)
        return ((const float *)p)[i];
    uint16_t h = ((const uint16_t *)p)[i];
    if (T == CPU_KV_F16)
        return _cvtsh_ss(h);
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* Dot product of two head vectors, in a fixed order: 8 lanes over strided
 * elements, then the lanes summed left to right, then the tail. */
static inline __attribute__((always_inline)) float dot_hd(const float *a, const void *b, int32_t hd, int T)
{
    __m256 acc = _mm256_setzero_ps();
    int32_t j = 0;
    for (; j + 8 <= hd; j += 8)
        acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + j), ld8(b, (size_t)j, T), acc);
    float lanes[8];
    _mm256_storeu_ps(lanes, acc);
    float s = 0.0f;
    for (int i = 0; i < 8; i++)
        s += lanes[i];
    for (; j < hd; j++)
        s += a[j] * ld1(b, (size_t)j, T);
    return s;
}

/* dot_hd of one query against 4 keys at once: the same operations per key,
 * as 4 independent chains so the FMA latency is hidden. */
static inline __attribute__((always_inline)) void dot_hd4(const float *a, const void *const b[4], int32_t hd,
                                                         float out[4], int T)
{
    __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
    int32_t j = 0;
    for (; j + 8 <= hd; j += 8) {
        __m256 q = _mm256_loadu_ps(a + j);
        for (int t = 0; t < 4; t++)
            acc[t] = _mm256_fmadd_ps(q, ld8(b[t], (size_t)j, T), acc[t]);
    }
    for (int t = 0; t < 4; t++) {
        float lanes[8];
        _mm256_storeu_ps(lanes, acc[t]);
        float s = 0.0f;
        for (int i = 0; i < 8; i++)
            s += lanes[i];
        for (int32_t e = j; e < hd; e++)
            s += a[e] * ld1(b[t], (size_t)e, T);
        out[t] = s;
    }
}

/* acc[d] = fma(p, v[d], acc[d]) for d < hd: independent per d, so the vector
 * width changes nothing in the result. */
static inline __attribute__((always_inline)) void axpy_hd(float p, const void *v, float *acc, int32_t hd, int T)
{
    int32_t d = 0;
#if defined(__AVX512F__)
    __m512 p16 = _mm512_set1_ps(p);
    for (; d + 16 <= hd; d += 16)
        _mm512_storeu_ps(acc + d, _mm512_fmadd_ps(p16, ld16(v, (size_t)d, T), _mm512_loadu_ps(acc + d)));
#endif
    __m256 p8 = _mm256_set1_ps(p);
    for (; d + 8 <= hd; d += 8)
        _mm256_storeu_ps(acc + d, _mm256_fmadd_ps(p8, ld8(v, (size_t)d, T), _mm256_loadu_ps(acc + d)));
    for (; d < hd; d++)
        acc[d] = fmaf(p, ld1(v, (size_t)d, T), acc[d]);
}

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

/* One task: one (row, kv head) pair, all query heads of its group; T is
 * the cache's element type (a constant in each of the three callers). */
static inline __attribute__((always_inline)) void attn_item(const attn_job *J, int32_t item, int32_t worker, int T)
{
    const size_t es = T == CPU_KV_F32 ? 4 : 2;
    const rd_attn_shape *a = J->a;
    const rd_step_dev *s = J->s;
    const int32_t hd = a->head_dim, bs = a->block_size, nkv = a->n_kv_heads;
    const int32_t group = a->n_heads / nkv;
    float *scores = J->scratch + (size_t)worker * ((size_t)J->max_ctx * group + (size_t)hd * group);
    float *acc = scores + (size_t)J->max_ctx * group;

    int32_t row = item / nkv, kvh = item % nkv;
    int32_t seq = row_seq(s, row);
    /* Keys j0 .. positions[row]: all of them, or the last `window` (the
     * scores and values below are indexed from j0). */
    int32_t end = s->positions[row] + 1;
    int32_t j0 = a->window > 0 && end > a->window ? end - a->window : 0;
    int32_t n = end - j0;
    const int32_t *table = s->block_tables + (size_t)seq * s->max_blocks;
    const float *qrow = J->q + (size_t)row * J->stride;

    /* scores[g][j] = q_g . k_j * scale, 4 keys at a time */
    int32_t j = 0;
    for (; j + 4 <= n; j += 4) {
        const void *kj[4];
        for (int t = 0; t < 4; t++)
            kj[t] = J->k_cache + (((size_t)table[(j0 + j + t) / bs] * nkv + kvh) * bs + (j0 + j + t) % bs) * hd * es;
        for (int32_t g = 0; g < group; g++) {
            float d4[4];
            dot_hd4(qrow + (size_t)(kvh * group + g) * hd, kj, hd, d4, T);
            for (int t = 0; t < 4; t++)
                scores[(size_t)g * n + j + t] = d4[t] * a->scale;
        }
    }
    for (; j < n; j++) {
        size_t off = (((size_t)table[(j0 + j) / bs] * nkv + kvh) * bs + (j0 + j) % bs) * hd;
        const void *kj = J->k_cache + off * es;
        for (int32_t g = 0; g < group; g++)
            scores[(size_t)g * n + j] = dot_hd(qrow + (size_t)(kvh * group + g) * hd, kj, hd, T) * a->scale;
    }
    /* softmax per query head, summed in key order */
    for (int32_t g = 0; g < group; g++) {
        float *sc = scores + (size_t)g * n;
        float mx = -INFINITY;
        for (int32_t j = 0; j < n; j++)
            mx = sc[j] > mx ? sc[j] : mx;
        float sum = 0.0f;
        for (int32_t j = 0; j < n; j++) {
            sc[j] = expf(sc[j] - mx);
            sum += sc[j];
        }
        float inv = 1.0f / sum;
        for (int32_t j = 0; j < n; j++)
            sc[j] *= inv;
        for (int32_t d = 0; d < hd; d++)
            acc[(size_t)g * hd + d] = 0.0f;
    }
    /* out_g = sum_j p_gj v_j, in key order */
    for (int32_t j = 0; j < n; j++) {
        size_t off = (((size_t)table[(j0 + j) / bs] * nkv + kvh) * bs + (j0 + j) % bs) * hd;
        const void *vj = J->v_cache + off * es;
        for (int32_t g = 0; g < group; g++) {
            axpy_hd(scores[(size_t)g * n + j], vj, acc + (size_t)g * hd, hd, T);
        }
    }
    for (int32_t g = 0; g < group; g++) {
        float *o = J->out + (size_t)row * a->n_heads * hd + (size_t)(kvh * group + g) * hd;
        memcpy(o, acc + (size_t)g * hd, sizeof(float) * hd);
    }
}

static void attn_task_f32(void *ctx, int32_t item, int32_t worker) { attn_item(ctx, item, worker, CPU_KV_F32); }
static void attn_task_bf16(void *ctx, int32_t item, int32_t worker) { attn_item(ctx, item, worker, CPU_KV_BF16); }
static void attn_task_f16(void *ctx, int32_t item, int32_t worker) { attn_item(ctx, item, worker, CPU_KV_F16); }

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
    pool_run(s->n_rows * a->n_kv_heads,
             kv_type == CPU_KV_BF16 ? attn_task_bf16 : kv_type == CPU_KV_F16 ? attn_task_f16 : attn_task_f32, &J);
    free(scratch);
}
