/* lora.c - the CPU backend's LoRA ops; lora.h says how and why. */
#include "kernels/cpu/lora.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <immintrin.h>

#include "base/cpu_isa.h"
#include "base/err.h"
#include "base/pool.h"
#include "engine/format/gguf.h"

/* A's chunks in lane order: the vector paths keep lane l of the warp order in SIMD lane l, so that a
 * round of 32 chunks is one contiguous [8][32] block per element of the chunk (zero past the last chunk,
 * which leaves those lanes' sums as they are: +0 * +0 added to a sum that is never -0). */
#define LANE_BLOCK (RD_LORA_CHUNK * RD_LORA_LANES)

typedef struct {
    int32_t rank, in, out;
    float scale;
    int32_t rounds;             /* rounds of 32 chunks: ceil((in / 8) / 32) */
    float *ap;                  /* [rank][rounds][8][32] A's chunks in lane order */
    float *at;                  /* [rank][8] A's elements past its last whole chunk (in % 8 of them), then 0 */
    float *bt;                  /* [rank][out] B transposed: out is the vector dimension of the expansion */
} cpu_lora;

static int widen(const void *src, int32_t type, size_t n, float *dst)
{
    if (type == GGML_F32) {
        memcpy(dst, src, n * sizeof(float));
        return 0;
    }
    const uint16_t *h = src;
    if (type == GGML_F16)
        for (size_t i = 0; i < n; i++)
            dst[i] = rd_f16_to_f32(h[i]);
    else
        for (size_t i = 0; i < n; i++)
            dst[i] = rd_bf16_to_f32(h[i]);
    return 0;
}

/* 64-byte aligned (the vector paths' aligned loads); aligned_alloc wants a size that is a multiple of it. */
static void *alloc64(size_t bytes) { return aligned_alloc(64, bytes ? (bytes + 63) / 64 * 64 : 64); }

static int type_ok(int32_t t) { return t == GGML_F32 || t == GGML_F16 || t == GGML_BF16; }

int cpu_lora_load(const rd_lora_w *w, void **handle)
{
    *handle = NULL;
    if (!w || w->rank < 1 || w->rank > RD_LORA_MAX_RANK || w->in <= 0 || w->out <= 0 || !w->a || !w->b ||
        !type_ok(w->a_type) || !type_ok(w->b_type) || !isfinite(w->scale))
        return rd_fail(RD_EINVAL, "cpu: lora_load: rank %d (1..%d), [%d] -> [%d], A %s, B %s: not a LoRA pair",
                       w ? w->rank : 0, RD_LORA_MAX_RANK, w ? w->in : 0, w ? w->out : 0,
                       w ? ggml_type_name(w->a_type) : "?", w ? ggml_type_name(w->b_type) : "?");
    cpu_lora *L = calloc(1, sizeof *L);
    const size_t na = (size_t)w->rank * w->in, nb = (size_t)w->out * w->rank;
    const int32_t rounds = (w->in / RD_LORA_CHUNK + RD_LORA_LANES - 1) / RD_LORA_LANES;
    const size_t nap = (size_t)w->rank * rounds * LANE_BLOCK;
    float *a = malloc(na * sizeof(float)), *b = malloc(nb * sizeof(float));
    if (L) {
        L->ap = alloc64(nap * sizeof(float));
        L->at = calloc((size_t)w->rank * RD_LORA_CHUNK, sizeof(float));
        L->bt = malloc(nb * sizeof(float));
    }
    if (!L || !a || !b || !L->ap || !L->at || !L->bt) {
        free(a);
        free(b);
        cpu_lora_free(L);
        return rd_fail(RD_ENOMEM, "cpu: lora_load: out of memory for a rank-%d [%d] -> [%d] pair", w->rank, w->in,
                       w->out);
    }
    L->rank = w->rank;
    L->in = w->in;
    L->out = w->out;
    L->scale = w->scale;
    L->rounds = rounds;
    widen(w->a, w->a_type, na, a);
    widen(w->b, w->b_type, nb, b);
    const int32_t chunks = w->in / RD_LORA_CHUNK, tail = chunks * RD_LORA_CHUNK;
    for (int32_t k = 0; k < w->rank; k++) {
        for (int32_t r = 0; r < rounds; r++)
            for (int32_t e = 0; e < RD_LORA_CHUNK; e++)
                for (int32_t l = 0; l < RD_LORA_LANES; l++) {
                    const int32_t c = r * RD_LORA_LANES + l;
                    L->ap[(((size_t)k * rounds + r) * RD_LORA_CHUNK + e) * RD_LORA_LANES + l] =
                        c < chunks ? a[(size_t)k * w->in + (size_t)c * RD_LORA_CHUNK + e] : 0.0f;
                }
        for (int32_t e = tail; e < w->in; e++)
            L->at[(size_t)k * RD_LORA_CHUNK + (e - tail)] = a[(size_t)k * w->in + e];
    }
    for (int32_t j = 0; j < w->out; j++)
        for (int32_t k = 0; k < w->rank; k++)
            L->bt[(size_t)k * w->out + j] = b[(size_t)j * w->rank + k];
    free(a);
    free(b);
    *handle = L;
    return 0;
}

void cpu_lora_free(void *handle)
{
    cpu_lora *L = handle;
    if (!L)
        return;
    free(L->ap);
    free(L->at);
    free(L->bt);
    free(L);
}

int64_t cpu_lora_bytes(const void *handle)
{
    const cpu_lora *L = handle;
    /* A in lane order (padded to whole rounds) with its tail, B transposed; fp32 */
    return L ? ((int64_t)L->rank * L->rounds * LANE_BLOCK + (int64_t)L->rank * RD_LORA_CHUNK +
                (int64_t)L->out * L->rank) * (int64_t)sizeof(float)
             : 0;
}

/* The xor butterfly as lane 0 sees it (every lane ends with these bits). */
static float lanes_sum(float *p)
{
    for (int32_t o = RD_LORA_LANES / 2; o > 0; o >>= 1)
        for (int32_t l = 0; l < o; l++)
            p[l] = p[l] + p[l + o];
    return p[0];
}

float cpu_lora_dot(const float *w, const float *x, int32_t n)
{
    float p[RD_LORA_LANES] = {0};
    const int32_t chunks = n / RD_LORA_CHUNK, tail = chunks * RD_LORA_CHUNK;
    /* Chunk c is lane c % 32's; each lane meets its chunks in ascending c. */
    for (int32_t c = 0; c < chunks; c++) {
        float *acc = &p[c % RD_LORA_LANES];
        const float *wc = w + (size_t)c * RD_LORA_CHUNK, *xc = x + (size_t)c * RD_LORA_CHUNK;
        for (int32_t t = 0; t < RD_LORA_CHUNK; t++)
            *acc = fmaf(xc[t], wc[t], *acc);
    }
    for (int32_t e = tail; e < n; e++)
        p[(e - tail) % RD_LORA_LANES] = fmaf(x[e], w[e], p[(e - tail) % RD_LORA_LANES]);
    return lanes_sum(p);
}

/* The tail elements (past the last whole chunk; tw holds A's) into the lanes' sums p, then their xor
 * butterfly. */
static float finish_dot(float *p, const float *tw, const float *x, int32_t n)
{
    const int32_t tail = n / RD_LORA_CHUNK * RD_LORA_CHUNK;
    for (int32_t e = tail; e < n; e++)
        p[(e - tail) % RD_LORA_LANES] = fmaf(x[e], tw[e - tail], p[(e - tail) % RD_LORA_LANES]);
    return lanes_sum(p);
}

/* The expansion in plain C for outputs j0 .. out-1: y[j] += s u, u the fmaf chain over k of B[j][k] t[k]
 * (every path's order; the vector paths take it for the outputs past their last whole vector). */
static void expand_from(const cpu_lora *L, const float *t, float *y, int32_t j0)
{
    for (int32_t j = j0; j < L->out; j++) {
        float u = 0.0f;
        for (int32_t k = 0; k < L->rank; k++)
            u = fmaf(L->bt[(size_t)k * L->out + j], t[k], u);
        y[j] = y[j] + L->scale * u;
    }
}

/* x's chunks in lane order, as cpu_lora.ap holds A's: xp [rounds][8][32]. */
static void permute_x(const float *x, int32_t in, int32_t rounds, float *xp)
{
    const int32_t chunks = in / RD_LORA_CHUNK;
    for (int32_t r = 0; r < rounds; r++)
        for (int32_t e = 0; e < RD_LORA_CHUNK; e++)
            for (int32_t l = 0; l < RD_LORA_LANES; l++) {
                const int32_t c = r * RD_LORA_LANES + l;
                xp[((size_t)r * RD_LORA_CHUNK + e) * RD_LORA_LANES + l] =
                    c < chunks ? x[(size_t)c * RD_LORA_CHUNK + e] : 0.0f;
            }
}

/* The vector paths: SIMD lane l is warp lane l, so each lane's sum is the same chain of fmaf as in
 * cpu_lora_dot (an FMA instruction rounds once, as fmaf does); the expansion keeps out in the vector
 * (one fmaf chain over k per output, as lora_row). Several k (shrink) or output blocks (expand) run
 * side by side so the chains' latencies overlap. */
#pragma GCC push_options
#pragma GCC target("avx512f,avx2,fma")
static void row_avx512(const cpu_lora *L, const float *x, float *xp, float *y)
{
    float t[RD_LORA_MAX_RANK], p[4][RD_LORA_LANES];
    const int32_t R = L->rounds, rank = L->rank, out = L->out;
    const size_t per_k = (size_t)R * LANE_BLOCK;
    permute_x(x, L->in, R, xp);
    /* Named accumulators: GCC keeps an indexed array of vectors on the stack. Four k at a time (a
     * missing one repeats the last k and is dropped). */
    for (int32_t k = 0; k < rank; k += 4) {
        const int32_t nk = rank - k < 4 ? rank - k : 4;
        const float *a0 = L->ap + (size_t)k * per_k;
        const float *a1 = a0 + (nk > 1 ? per_k : 0), *a2 = a0 + (nk > 2 ? 2 * per_k : 0);
        const float *a3 = a0 + (nk > 3 ? 3 * per_k : 0);
        __m512 c0a = _mm512_setzero_ps(), c0b = c0a, c1a = c0a, c1b = c0a, c2a = c0a, c2b = c0a, c3a = c0a,
               c3b = c0a;
        for (size_t i = 0; i < per_k; i += RD_LORA_LANES) {
            const __m512 x0 = _mm512_load_ps(xp + i), x1 = _mm512_load_ps(xp + i + 16);
            c0a = _mm512_fmadd_ps(x0, _mm512_load_ps(a0 + i), c0a);
            c0b = _mm512_fmadd_ps(x1, _mm512_load_ps(a0 + i + 16), c0b);
            c1a = _mm512_fmadd_ps(x0, _mm512_load_ps(a1 + i), c1a);
            c1b = _mm512_fmadd_ps(x1, _mm512_load_ps(a1 + i + 16), c1b);
            c2a = _mm512_fmadd_ps(x0, _mm512_load_ps(a2 + i), c2a);
            c2b = _mm512_fmadd_ps(x1, _mm512_load_ps(a2 + i + 16), c2b);
            c3a = _mm512_fmadd_ps(x0, _mm512_load_ps(a3 + i), c3a);
            c3b = _mm512_fmadd_ps(x1, _mm512_load_ps(a3 + i + 16), c3b);
        }
        const __m512 ca[4] = {c0a, c1a, c2a, c3a}, cb[4] = {c0b, c1b, c2b, c3b};
        for (int32_t q = 0; q < nk; q++) {
            _mm512_storeu_ps(p[q], ca[q]);
            _mm512_storeu_ps(p[q] + 16, cb[q]);
            t[k + q] = finish_dot(p[q], L->at + (size_t)(k + q) * RD_LORA_CHUNK, x, L->in);
        }
    }
    const __m512 s = _mm512_set1_ps(L->scale);
    int32_t j = 0;
    for (; j + 64 <= out; j += 64) {
        __m512 u0 = _mm512_setzero_ps(), u1 = u0, u2 = u0, u3 = u0;
        for (int32_t kk = 0; kk < rank; kk++) {
            const float *b = L->bt + (size_t)kk * out + j;
            const __m512 tk = _mm512_set1_ps(t[kk]);
            u0 = _mm512_fmadd_ps(_mm512_loadu_ps(b), tk, u0);
            u1 = _mm512_fmadd_ps(_mm512_loadu_ps(b + 16), tk, u1);
            u2 = _mm512_fmadd_ps(_mm512_loadu_ps(b + 32), tk, u2);
            u3 = _mm512_fmadd_ps(_mm512_loadu_ps(b + 48), tk, u3);
        }
        _mm512_storeu_ps(y + j, _mm512_add_ps(_mm512_loadu_ps(y + j), _mm512_mul_ps(s, u0)));
        _mm512_storeu_ps(y + j + 16, _mm512_add_ps(_mm512_loadu_ps(y + j + 16), _mm512_mul_ps(s, u1)));
        _mm512_storeu_ps(y + j + 32, _mm512_add_ps(_mm512_loadu_ps(y + j + 32), _mm512_mul_ps(s, u2)));
        _mm512_storeu_ps(y + j + 48, _mm512_add_ps(_mm512_loadu_ps(y + j + 48), _mm512_mul_ps(s, u3)));
    }
    for (; j + 16 <= out; j += 16) {
        __m512 u = _mm512_setzero_ps();
        for (int32_t kk = 0; kk < rank; kk++)
            u = _mm512_fmadd_ps(_mm512_loadu_ps(L->bt + (size_t)kk * out + j), _mm512_set1_ps(t[kk]), u);
        _mm512_storeu_ps(y + j, _mm512_add_ps(_mm512_loadu_ps(y + j), _mm512_mul_ps(s, u)));
    }
    expand_from(L, t, y, j);
}
/* Four rows of one adapter at once: each A and B vector loaded once serves the four (the base GEMM's reuse),
 * each row's sums the same fmaf chains as row_avx512's. xp holds four rows' x in lane order. */
static void rows4_avx512(const cpu_lora *L, const float *const *x, float *xp, float *const *y)
{
    float t[4][RD_LORA_MAX_RANK], p[RD_LORA_LANES];
    const int32_t R = L->rounds, rank = L->rank, out = L->out;
    const size_t per_k = (size_t)R * LANE_BLOCK;
    for (int32_t r = 0; r < 4; r++)
        permute_x(x[r], L->in, R, xp + (size_t)r * per_k);
    for (int32_t k = 0; k < rank; k += 2) {
        const int32_t nk = rank - k < 2 ? rank - k : 2;
        const float *a0 = L->ap + (size_t)k * per_k, *a1 = nk > 1 ? a0 + per_k : a0;
        const float *x0p = xp, *x1p = xp + per_k, *x2p = xp + 2 * per_k, *x3p = xp + 3 * per_k;
        /* Named accumulators (an indexed array of vectors stays on the stack): [k][row] halves a and b. */
        __m512 z = _mm512_setzero_ps();
        __m512 k0r0a = z, k0r0b = z, k0r1a = z, k0r1b = z, k0r2a = z, k0r2b = z, k0r3a = z, k0r3b = z;
        __m512 k1r0a = z, k1r0b = z, k1r1a = z, k1r1b = z, k1r2a = z, k1r2b = z, k1r3a = z, k1r3b = z;
        for (size_t i = 0; i < per_k; i += RD_LORA_LANES) {
            const __m512 w0a = _mm512_load_ps(a0 + i), w0b = _mm512_load_ps(a0 + i + 16);
            const __m512 w1a = _mm512_load_ps(a1 + i), w1b = _mm512_load_ps(a1 + i + 16);
#define LORA_ROW4(R)                                                                      \
    do {                                                                                  \
        const __m512 xa = _mm512_load_ps(x##R##p + i), xb = _mm512_load_ps(x##R##p + i + 16); \
        k0r##R##a = _mm512_fmadd_ps(xa, w0a, k0r##R##a);                                  \
        k0r##R##b = _mm512_fmadd_ps(xb, w0b, k0r##R##b);                                  \
        k1r##R##a = _mm512_fmadd_ps(xa, w1a, k1r##R##a);                                  \
        k1r##R##b = _mm512_fmadd_ps(xb, w1b, k1r##R##b);                                  \
    } while (0)
            LORA_ROW4(0);
            LORA_ROW4(1);
            LORA_ROW4(2);
            LORA_ROW4(3);
#undef LORA_ROW4
        }
        const __m512 sa[2][4] = {{k0r0a, k0r1a, k0r2a, k0r3a}, {k1r0a, k1r1a, k1r2a, k1r3a}};
        const __m512 sb[2][4] = {{k0r0b, k0r1b, k0r2b, k0r3b}, {k1r0b, k1r1b, k1r2b, k1r3b}};
        for (int32_t q = 0; q < nk; q++)
            for (int32_t r = 0; r < 4; r++) {
                _mm512_storeu_ps(p, sa[q][r]);
                _mm512_storeu_ps(p + 16, sb[q][r]);
                t[r][k + q] = finish_dot(p, L->at + (size_t)(k + q) * RD_LORA_CHUNK, x[r], L->in);
            }
    }
    const __m512 s = _mm512_set1_ps(L->scale);
    int32_t j = 0;
    for (; j + 32 <= out; j += 32) {
        __m512 z = _mm512_setzero_ps(), u0a = z, u0b = z, u1a = z, u1b = z, u2a = z, u2b = z, u3a = z, u3b = z;
        for (int32_t kk = 0; kk < rank; kk++) {
            const float *b = L->bt + (size_t)kk * out + j;
            const __m512 b0 = _mm512_loadu_ps(b), b1 = _mm512_loadu_ps(b + 16);
            __m512 tk = _mm512_set1_ps(t[0][kk]);
            u0a = _mm512_fmadd_ps(b0, tk, u0a);
            u0b = _mm512_fmadd_ps(b1, tk, u0b);
            tk = _mm512_set1_ps(t[1][kk]);
            u1a = _mm512_fmadd_ps(b0, tk, u1a);
            u1b = _mm512_fmadd_ps(b1, tk, u1b);
            tk = _mm512_set1_ps(t[2][kk]);
            u2a = _mm512_fmadd_ps(b0, tk, u2a);
            u2b = _mm512_fmadd_ps(b1, tk, u2b);
            tk = _mm512_set1_ps(t[3][kk]);
            u3a = _mm512_fmadd_ps(b0, tk, u3a);
            u3b = _mm512_fmadd_ps(b1, tk, u3b);
        }
        const __m512 ua[4] = {u0a, u1a, u2a, u3a}, ub[4] = {u0b, u1b, u2b, u3b};
        for (int32_t r = 0; r < 4; r++) {
            _mm512_storeu_ps(y[r] + j, _mm512_add_ps(_mm512_loadu_ps(y[r] + j), _mm512_mul_ps(s, ua[r])));
            _mm512_storeu_ps(y[r] + j + 16,
                             _mm512_add_ps(_mm512_loadu_ps(y[r] + j + 16), _mm512_mul_ps(s, ub[r])));
        }
    }
    for (int32_t r = 0; r < 4; r++)
        expand_from(L, t[r], y[r], j);
}
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx2,fma")
static void row_avx2(const cpu_lora *L, const float *x, float *xp, float *y)
{
    float t[RD_LORA_MAX_RANK], p[2][RD_LORA_LANES];
    const int32_t R = L->rounds, rank = L->rank, out = L->out;
    const size_t per_k = (size_t)R * LANE_BLOCK;
    permute_x(x, L->in, R, xp);
    for (int32_t k = 0; k < rank; k += 2) {
        const int32_t nk = rank - k < 2 ? rank - k : 2;
        const float *a0 = L->ap + (size_t)k * per_k, *a1 = nk > 1 ? a0 + per_k : a0;
        /* Named accumulators (an indexed array of vectors stays on the stack). */
        __m256 z = _mm256_setzero_ps(), c00 = z, c01 = z, c02 = z, c03 = z, c10 = z, c11 = z, c12 = z, c13 = z;
        for (size_t i = 0; i < per_k; i += RD_LORA_LANES) {
            const __m256 x0 = _mm256_load_ps(xp + i), x1 = _mm256_load_ps(xp + i + 8);
            const __m256 x2 = _mm256_load_ps(xp + i + 16), x3 = _mm256_load_ps(xp + i + 24);
            c00 = _mm256_fmadd_ps(x0, _mm256_load_ps(a0 + i), c00);
            c01 = _mm256_fmadd_ps(x1, _mm256_load_ps(a0 + i + 8), c01);
            c02 = _mm256_fmadd_ps(x2, _mm256_load_ps(a0 + i + 16), c02);
            c03 = _mm256_fmadd_ps(x3, _mm256_load_ps(a0 + i + 24), c03);
            c10 = _mm256_fmadd_ps(x0, _mm256_load_ps(a1 + i), c10);
            c11 = _mm256_fmadd_ps(x1, _mm256_load_ps(a1 + i + 8), c11);
            c12 = _mm256_fmadd_ps(x2, _mm256_load_ps(a1 + i + 16), c12);
            c13 = _mm256_fmadd_ps(x3, _mm256_load_ps(a1 + i + 24), c13);
        }
        const __m256 c[2][4] = {{c00, c01, c02, c03}, {c10, c11, c12, c13}};
        for (int32_t q = 0; q < nk; q++) {
            for (int32_t v = 0; v < 4; v++)
                _mm256_storeu_ps(p[q] + 8 * v, c[q][v]);
            t[k + q] = finish_dot(p[q], L->at + (size_t)(k + q) * RD_LORA_CHUNK, x, L->in);
        }
    }
    const __m256 s = _mm256_set1_ps(L->scale);
    int32_t j = 0;
    for (; j + 32 <= out; j += 32) {
        __m256 u0 = _mm256_setzero_ps(), u1 = u0, u2 = u0, u3 = u0;
        for (int32_t kk = 0; kk < rank; kk++) {
            const float *b = L->bt + (size_t)kk * out + j;
            const __m256 tk = _mm256_set1_ps(t[kk]);
            u0 = _mm256_fmadd_ps(_mm256_loadu_ps(b), tk, u0);
            u1 = _mm256_fmadd_ps(_mm256_loadu_ps(b + 8), tk, u1);
            u2 = _mm256_fmadd_ps(_mm256_loadu_ps(b + 16), tk, u2);
            u3 = _mm256_fmadd_ps(_mm256_loadu_ps(b + 24), tk, u3);
        }
        _mm256_storeu_ps(y + j, _mm256_add_ps(_mm256_loadu_ps(y + j), _mm256_mul_ps(s, u0)));
        _mm256_storeu_ps(y + j + 8, _mm256_add_ps(_mm256_loadu_ps(y + j + 8), _mm256_mul_ps(s, u1)));
        _mm256_storeu_ps(y + j + 16, _mm256_add_ps(_mm256_loadu_ps(y + j + 16), _mm256_mul_ps(s, u2)));
        _mm256_storeu_ps(y + j + 24, _mm256_add_ps(_mm256_loadu_ps(y + j + 24), _mm256_mul_ps(s, u3)));
    }
    for (; j + 8 <= out; j += 8) {
        __m256 u = _mm256_setzero_ps();
        for (int32_t kk = 0; kk < rank; kk++)
            u = _mm256_fmadd_ps(_mm256_loadu_ps(L->bt + (size_t)kk * out + j), _mm256_set1_ps(t[kk]), u);
        _mm256_storeu_ps(y + j, _mm256_add_ps(_mm256_loadu_ps(y + j), _mm256_mul_ps(s, u)));
    }
    expand_from(L, t, y, j);
}
#pragma GCC pop_options

/* One row in plain C: y[out_off + j] += s (B (A x))[j], each lane's fmaf chain over A in lane order (the
 * order cpu_lora_dot walks a row of A in). */
static void lora_row(const cpu_lora *L, const float *x, float *xp, float *y)
{
    float t[RD_LORA_MAX_RANK], p[RD_LORA_LANES];
    const size_t per_k = (size_t)L->rounds * LANE_BLOCK;
    permute_x(x, L->in, L->rounds, xp);
    for (int32_t k = 0; k < L->rank; k++) {
        const float *a = L->ap + (size_t)k * per_k;
        memset(p, 0, sizeof p);
        for (size_t i = 0; i < per_k; i++)
            p[i % RD_LORA_LANES] = fmaf(xp[i], a[i], p[i % RD_LORA_LANES]);
        t[k] = finish_dot(p, L->at + (size_t)k * RD_LORA_CHUNK, x, L->in);
    }
    expand_from(L, t, y, 0);
}

typedef struct {
    const rd_lora_batch *lb;
    const float *x;
    const int32_t *slots, *order;   /* order NULL: rows in index order */
    int32_t n;                      /* rows in order (or m) */
    float *y;
    int32_t y_stride, out_off;
    cpu_isa isa;                    /* the path: scalar, or a vector one with xp */
    float *xp;                      /* [workers][xp_stride] rows of x in lane order (vector paths) */
    size_t xp_stride;               /* floats: four rows' */
} lora_job;

#define ROWS_PER_TASK 8   /* two groups of four rows of one adapter (rows4_avx512) */
#define LORA_INLINE_WORK (1 << 17)  /* multiply-adds below which lora_apply does not use the pool */

static const cpu_lora *slot_lora(const rd_lora_batch *lb, int32_t a)
{
    if (a < 0 || a >= lb->n_slots)
        return NULL;
    const cpu_lora *L = lb->w[a];
    /* A handle of another shape is the caller's error; it adds nothing. */
    return L && L->in == lb->in && L->out == lb->out && L->rank <= lb->max_rank ? L : NULL;
}

static void lora_task(void *ctx, int32_t task, int32_t worker)
{
    const lora_job *j = ctx;
    const int32_t r1 = (task + 1) * ROWS_PER_TASK < j->n ? (task + 1) * ROWS_PER_TASK : j->n;
    for (int32_t p = task * ROWS_PER_TASK; p < r1; p++) {
        const int32_t i = j->order ? j->order[p] : p;
        const cpu_lora *L = slot_lora(j->lb, j->slots[i]);
        if (!L)
            continue;
        if (j->isa == CPU_ISA_AVX512 && p + 4 <= r1) {
            /* four rows of this adapter next to each other (rows are grouped by slot): one pass over it */
            const int32_t i1 = j->order ? j->order[p + 1] : p + 1, i2 = j->order ? j->order[p + 2] : p + 2;
            const int32_t i3 = j->order ? j->order[p + 3] : p + 3;
            if (slot_lora(j->lb, j->slots[i1]) == L && slot_lora(j->lb, j->slots[i2]) == L &&
                slot_lora(j->lb, j->slots[i3]) == L) {
                const int32_t rows[4] = {i, i1, i2, i3};
                const float *xs[4];
                float *ys[4];
                for (int32_t r = 0; r < 4; r++) {
                    xs[r] = j->x + (size_t)rows[r] * j->lb->in;
                    ys[r] = j->y + (size_t)rows[r] * j->y_stride + j->out_off;
                }
                rows4_avx512(L, xs, j->xp + (size_t)worker * j->xp_stride, ys);
                p += 3;
                continue;
            }
        }
        const float *x = j->x + (size_t)i * j->lb->in;
        float *y = j->y + (size_t)i * j->y_stride + j->out_off;
        float *xp = j->xp + (size_t)worker * j->xp_stride;
        if (j->isa == CPU_ISA_AVX512)
            row_avx512(L, x, xp, y);
        else if (j->isa == CPU_ISA_AVX2)
            row_avx2(L, x, xp, y);
        else
            lora_row(L, x, xp, y);
    }
}

void cpu_lora_apply(cpu_lora_scratch *s, const rd_lora_batch *lb, const float *x, const int32_t *slots, int32_t m,
                    float *y, int32_t y_stride, int32_t out_off)
{
    if (m <= 0 || !lb || lb->n_slots <= 0 || lb->n_slots > RD_LORA_MAX_SLOTS || lb->out <= 0 ||
        out_off < 0 || out_off + lb->out > y_stride)
        return;
    lora_job j = {lb, x, slots, NULL, m, y, y_stride, out_off, cpu_isa_active(), NULL, 0};
    /* Rows of x in lane order, four per worker (rows4_avx512). */
    const int32_t rounds = (lb->in / RD_LORA_CHUNK + RD_LORA_LANES - 1) / RD_LORA_LANES;
    j.xp_stride = 4 * (size_t)(rounds > 0 ? rounds : 1) * LANE_BLOCK;
    const size_t need = j.xp_stride * (size_t)pool_size();
    if (s->xp_cap < need) {
        free(s->xp);
        s->xp = alloc64(need * sizeof(float));
        s->xp_cap = s->xp ? need : 0;
    }
    j.xp = s->xp;
    if (!j.xp) {
        s->failed = 1; /* the step must not go on without these rows' terms: sync reports it */
        return;
    }
    /* Rows grouped by slot (a counting sort; rows without an adapter
     * dropped), so an adapter's A and B stay in cache across its rows. If
     * the scratch cannot grow, rows go in index order: the same bits. */
    if (s->order_cap < (size_t)m) {
        int32_t *o = realloc(s->order, (size_t)m * sizeof(int32_t));
        if (o) {
            s->order = o;
            s->order_cap = (size_t)m;
        }
    }
    if (s->order_cap >= (size_t)m) {
        int32_t count[RD_LORA_MAX_SLOTS + 1] = {0};
        for (int32_t i = 0; i < m; i++)
            if (slot_lora(lb, slots[i]))
                count[slots[i] + 1]++;
        for (int32_t a = 0; a < lb->n_slots; a++)
            count[a + 1] += count[a];
        j.n = count[lb->n_slots];
        for (int32_t i = 0; i < m; i++)
            if (slot_lora(lb, slots[i]))
                s->order[count[slots[i]]++] = i;
        j.order = s->order;
    }
    /* A step's few rows run on this thread: a pool dispatch per module and layer would cost more than
     * the work (the bits are a row's own either way). */
    const int32_t tasks = (j.n + ROWS_PER_TASK - 1) / ROWS_PER_TASK;
    if ((int64_t)j.n * lb->max_rank * (lb->in + lb->out) <= LORA_INLINE_WORK)
        for (int32_t t = 0; t < tasks; t++)
            lora_task(&j, t, 0);
    else if (tasks > 0)
        pool_run(tasks, lora_task, &j);
}

void cpu_lora_scratch_free(cpu_lora_scratch *s)
{
    free(s->order);
    free(s->xp);
    memset(s, 0, sizeof *s);
}
