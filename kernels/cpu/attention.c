/* attention.c - paged causal attention over the block-table KV cache.
 *
 * For a row at position p of sequence s and a query head h (kv head
 * h / group): scores over keys 0..p gathered through the block table, a
 * max-subtracted softmax summed in key order, then the weighted sum of values
 * in key order. Work is split over (row, kv head) pairs; the K and V of one kv
 * head are read once for all query heads of its group (GQA). */
#include "kernels/cpu/attention.h"

#include <immintrin.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/pool.h"

/* Dot product of two head vectors, in a fixed order: 8 lanes over strided
 * elements, then the lanes summed left to right, then the tail. */
static inline float dot_hd(const float *a, const float *b, int32_t hd)
{
    __m256 acc = _mm256_setzero_ps();
    int32_t j = 0;
    for (; j + 8 <= hd; j += 8)
        acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + j), _mm256_loadu_ps(b + j), acc);
    float lanes[8];
    _mm256_storeu_ps(lanes, acc);
    float s = 0.0f;
    for (int i = 0; i < 8; i++)
        s += lanes[i];
    for (; j < hd; j++)
        s += a[j] * b[j];
    return s;
}

/* dot_hd of one query against 4 keys at once: the same operations per key,
 * as 4 independent chains so the FMA latency is hidden. */
static inline void dot_hd4(const float *a, const float *const b[4], int32_t hd, float out[4])
{
    __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
    int32_t j = 0;
    for (; j + 8 <= hd; j += 8) {
        __m256 q = _mm256_loadu_ps(a + j);
        for (int t = 0; t < 4; t++)
            acc[t] = _mm256_fmadd_ps(q, _mm256_loadu_ps(b[t] + j), acc[t]);
    }
    for (int t = 0; t < 4; t++) {
        float lanes[8];
        _mm256_storeu_ps(lanes, acc[t]);
        float s = 0.0f;
        for (int i = 0; i < 8; i++)
            s += lanes[i];
        for (int32_t e = j; e < hd; e++)
            s += a[e] * b[t][e];
        out[t] = s;
    }
}

/* acc[d] = fma(p, v[d], acc[d]) for d < hd: independent per d, so the vector
 * width changes nothing in the result. */
static inline void axpy_hd(float p, const float *v, float *acc, int32_t hd)
{
    int32_t d = 0;
#if defined(__AVX512F__)
    __m512 p16 = _mm512_set1_ps(p);
    for (; d + 16 <= hd; d += 16)
        _mm512_storeu_ps(acc + d, _mm512_fmadd_ps(p16, _mm512_loadu_ps(v + d), _mm512_loadu_ps(acc + d)));
#endif
    __m256 p8 = _mm256_set1_ps(p);
    for (; d + 8 <= hd; d += 8)
        _mm256_storeu_ps(acc + d, _mm256_fmadd_ps(p8, _mm256_loadu_ps(v + d), _mm256_loadu_ps(acc + d)));
    for (; d < hd; d++)
        acc[d] = fmaf(p, v[d], acc[d]);
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
    const float *k_cache, *v_cache;
    float *out;
    int32_t max_ctx;            /* longest context in the step */
    float *scratch;             /* [workers][max_ctx * group + head_dim * group] */
} attn_job;

/* One task: one (row, kv head) pair, all query heads of its group. */
static void attn_task(void *ctx, int32_t item, int32_t worker)
{
    const attn_job *J = ctx;
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
        const float *kj[4];
        for (int t = 0; t < 4; t++)
            kj[t] = J->k_cache + (((size_t)table[(j0 + j + t) / bs] * nkv + kvh) * bs + (j0 + j + t) % bs) * hd;
        for (int32_t g = 0; g < group; g++) {
            float d4[4];
            dot_hd4(qrow + (size_t)(kvh * group + g) * hd, kj, hd, d4);
            for (int t = 0; t < 4; t++)
                scores[(size_t)g * n + j + t] = d4[t] * a->scale;
        }
    }
    for (; j < n; j++) {
        size_t off = (((size_t)table[(j0 + j) / bs] * nkv + kvh) * bs + (j0 + j) % bs) * hd;
        const float *kj = J->k_cache + off;
        for (int32_t g = 0; g < group; g++)
            scores[(size_t)g * n + j] = dot_hd(qrow + (size_t)(kvh * group + g) * hd, kj, hd) * a->scale;
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
        const float *vj = J->v_cache + off;
        for (int32_t g = 0; g < group; g++) {
            axpy_hd(scores[(size_t)g * n + j], vj, acc + (size_t)g * hd, hd);
        }
    }
    for (int32_t g = 0; g < group; g++) {
        float *o = J->out + (size_t)row * a->n_heads * hd + (size_t)(kvh * group + g) * hd;
        memcpy(o, acc + (size_t)g * hd, sizeof(float) * hd);
    }
}

void cpu_attention(rd_backend *be, const rd_attn_shape *a, const float *q, int32_t stride,
                   const rd_step_dev *s, const float *k_cache, const float *v_cache, float *out)
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
    attn_job J = {a, q, stride, s, k_cache, v_cache, out, max_ctx, scratch};
    pool_run(s->n_rows * a->n_kv_heads, attn_task, &J);
    free(scratch);
}
