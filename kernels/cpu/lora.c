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
    int32_t a_type, b_type;     /* the file's dtypes (GGML_F32, F16, BF16), in which ap and at hold A, bt B */
    void *ap;                   /* [rank][rounds][8][32] A's chunks in lane order */
    void *at;                   /* [rank][8] A's elements past its last whole chunk (in % 8 of them), then 0 */
    void *bt;                   /* [rank][out] B transposed: out is the vector dimension of the expansion */
} cpu_lora;

/* A and B stay in the file's dtype: the op streams them from memory every step (an adapter does not fit
 * in cache), so their bytes bound it, and f16 and bf16 widen to fp32 exactly where they are used: the
 * same products, the same bits as fp32 copies would give. */
static size_t type_size(int32_t t) { return t == GGML_F32 ? sizeof(float) : sizeof(uint16_t); }

/* Element i of ap, at or bt (of dtype t), widened: bf16 is an fp32's top half, f16 widens exactly. */
static inline __attribute__((always_inline)) float elem(const void *p, int32_t t, size_t i)
{
    if (t == GGML_F32)
        return ((const float *)p)[i];
    const uint16_t h = ((const uint16_t *)p)[i];
    if (t == GGML_F16)
        return rd_f16_to_f32(h);
    const uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* Element si of src to element di of dst, both of es bytes (the file's bits, unchanged). */
static void put(void *dst, size_t di, const void *src, size_t si, size_t es)
{
    if (es == sizeof(float))
        memcpy((char *)dst + di * sizeof(float), (const char *)src + si * sizeof(float), sizeof(float));
    else
        memcpy((char *)dst + di * sizeof(uint16_t), (const char *)src + si * sizeof(uint16_t), sizeof(uint16_t));
}

/* 64-byte aligned (the vector paths' loads of whole rounds); aligned_alloc wants a size that is a multiple
 * of it, which is also what a buffer holds (cpu_lora_bytes). */
static size_t size64(size_t bytes) { return bytes ? (bytes + 63) / 64 * 64 : 64; }
static void *alloc64(size_t bytes) { return aligned_alloc(64, size64(bytes)); }

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
    const int32_t rounds = (w->in / RD_LORA_CHUNK + RD_LORA_LANES - 1) / RD_LORA_LANES;
    const size_t ea = type_size(w->a_type), eb = type_size(w->b_type);
    const size_t nap = (size_t)w->rank * rounds * LANE_BLOCK, nat = (size_t)w->rank * RD_LORA_CHUNK;
    const size_t nbt = (size_t)w->out * w->rank;
    if (L) {
        L->ap = alloc64(nap * ea);
        L->at = alloc64(nat * ea);
        L->bt = alloc64(nbt * eb);
    }
    if (!L || !L->ap || !L->at || !L->bt) {
        cpu_lora_free(L);
        return rd_fail(RD_ENOMEM, "cpu: lora_load: out of memory for a rank-%d [%d] -> [%d] pair", w->rank, w->in,
                       w->out);
    }
    L->rank = w->rank;
    L->in = w->in;
    L->out = w->out;
    L->scale = w->scale;
    L->rounds = rounds;
    L->a_type = w->a_type;
    L->b_type = w->b_type;
    /* All-zero bits are +0 in each dtype: the lanes past the last chunk and the tail's padding. */
    memset(L->ap, 0, nap * ea);
    memset(L->at, 0, nat * ea);
    const int32_t chunks = w->in / RD_LORA_CHUNK, tail = chunks * RD_LORA_CHUNK;
    for (int32_t k = 0; k < w->rank; k++) {
        for (int32_t r = 0; r < rounds; r++)
            for (int32_t e = 0; e < RD_LORA_CHUNK; e++)
                for (int32_t l = 0; l < RD_LORA_LANES; l++) {
                    const int32_t c = r * RD_LORA_LANES + l;
                    if (c < chunks)
                        put(L->ap, (((size_t)k * rounds + r) * RD_LORA_CHUNK + e) * RD_LORA_LANES + l, w->a,
                            (size_t)k * w->in + (size_t)c * RD_LORA_CHUNK + e, ea);
                }
        for (int32_t e = tail; e < w->in; e++)
            put(L->at, (size_t)k * RD_LORA_CHUNK + (e - tail), w->a, (size_t)k * w->in + e, ea);
    }
    for (int32_t j = 0; j < w->out; j++)
        for (int32_t k = 0; k < w->rank; k++)
            put(L->bt, (size_t)k * w->out + j, w->b, (size_t)j * w->rank + k, eb);
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
    if (!L)
        return 0;
    /* the three buffers as allocated: A in lane order (padded to whole rounds) and its tail in A's dtype,
     * B transposed in B's */
    const size_t ea = type_size(L->a_type), eb = type_size(L->b_type);
    return (int64_t)(size64((size_t)L->rank * L->rounds * LANE_BLOCK * ea) +
                     size64((size_t)L->rank * RD_LORA_CHUNK * ea) + size64((size_t)L->out * L->rank * eb));
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

/* Row k's tail elements (past the last whole chunk, held in L->at) into the lanes' sums p, then their xor
 * butterfly. */
static float finish_dot(const cpu_lora *L, int32_t k, float *p, const float *x)
{
    const int32_t n = L->in, tail = n / RD_LORA_CHUNK * RD_LORA_CHUNK;
    for (int32_t e = tail; e < n; e++)
        p[(e - tail) % RD_LORA_LANES] = fmaf(x[e], elem(L->at, L->a_type, (size_t)k * RD_LORA_CHUNK + (e - tail)),
                                             p[(e - tail) % RD_LORA_LANES]);
    return lanes_sum(p);
}

/* The expansion in plain C for outputs j0 .. out-1: y[j] += s u, u the fmaf chain over k of B[j][k] t[k]
 * (every path's order; the vector paths take it for the outputs past their last whole vector). */
static void expand_from(const cpu_lora *L, const float *t, float *y, int32_t j0)
{
    for (int32_t j = j0; j < L->out; j++) {
        float u = 0.0f;
        for (int32_t k = 0; k < L->rank; k++)
            u = fmaf(elem(L->bt, L->b_type, (size_t)k * L->out + j), t[k], u);
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
 * side by side so the chains' latencies overlap. Each phase is written once for a dtype T, a constant
 * where it is inlined (one copy per dtype, the loads' branches folded): an f16 or bf16 vector widens
 * exactly in the register, so every FMA gets the operands, in the order, of the fp32 copy. */
/* The vector paths prefetch each stream of A and B they walk, PF_A elements of a row of ap and PF_B of a
 * row of bt ahead of their loads. Widening f16 and bf16 takes instructions that fp32's loads (folded into
 * the FMAs) did not, so fewer of the loads fit in the out-of-order window and fewer cache misses overlap;
 * the hardware prefetchers did not make up for it (docs/PERF.md, 2026-12-06 "bf16-resident A/B"). A
 * prefetch changes no value, and one past a buffer's end does not fault. */
#define PF_A 1024   /* 2 KB in f16 and bf16, 4 KB in fp32 */
#define PF_B 64     /* the next block of outputs or two */

/* The lines of n elements of p (dtype T) from element i. */
static inline __attribute__((always_inline)) void prefetch(const void *p, size_t i, size_t n, int32_t T)
{
    const size_t es = T == GGML_F32 ? sizeof(float) : sizeof(uint16_t);
    for (size_t b = 0; b < n * es; b += 64)
        _mm_prefetch((const char *)p + i * es + b, _MM_HINT_T0);
}

#pragma GCC push_options
#pragma GCC target("avx2")
/* permute_x on the vector paths: each 8 chunks of a round (8 floats each) are an 8x8 transpose, chunk i's
 * element e to xp[r][e][l0 + i]; the chunks past the last whole 8 (and the zero lanes past the last chunk)
 * as permute_x. Only moves values: the same bits. */
static void permute_x_avx2(const float *x, int32_t in, int32_t rounds, float *xp)
{
    const int32_t chunks = in / RD_LORA_CHUNK, blocks = chunks / 8;
    for (int32_t b = 0; b < blocks; b++) {
        const int32_t r = b / (RD_LORA_LANES / 8), l0 = b % (RD_LORA_LANES / 8) * 8;
        const float *c = x + (size_t)b * 8 * RD_LORA_CHUNK;
        float *d = xp + (size_t)r * LANE_BLOCK + l0;
        /* rows i and i + 4 share a register: lo 128 bits element 0-3 of chunk i, hi of chunk i + 4 */
#define LORA_LD2(i, h) _mm256_insertf128_ps(_mm256_castps128_ps256(_mm_loadu_ps(c + (i) * 8 + (h))), \
                                            _mm_loadu_ps(c + ((i) + 4) * 8 + (h)), 1)
        const __m256 r0 = LORA_LD2(0, 0), r1 = LORA_LD2(1, 0), r2 = LORA_LD2(2, 0), r3 = LORA_LD2(3, 0);
        const __m256 r4 = LORA_LD2(0, 4), r5 = LORA_LD2(1, 4), r6 = LORA_LD2(2, 4), r7 = LORA_LD2(3, 4);
#undef LORA_LD2
        /* r0..r3: elements 0-3 of chunks (0,4), (1,5), (2,6), (3,7); r4..r7: elements 4-7 */
        const __m256 t0 = _mm256_unpacklo_ps(r0, r1), t1 = _mm256_unpackhi_ps(r0, r1);
        const __m256 t2 = _mm256_unpacklo_ps(r2, r3), t3 = _mm256_unpackhi_ps(r2, r3);
        const __m256 t4 = _mm256_unpacklo_ps(r4, r5), t5 = _mm256_unpackhi_ps(r4, r5);
        const __m256 t6 = _mm256_unpacklo_ps(r6, r7), t7 = _mm256_unpackhi_ps(r6, r7);
        _mm256_storeu_ps(d + 0 * RD_LORA_LANES, _mm256_shuffle_ps(t0, t2, 0x44));
        _mm256_storeu_ps(d + 1 * RD_LORA_LANES, _mm256_shuffle_ps(t0, t2, 0xee));
        _mm256_storeu_ps(d + 2 * RD_LORA_LANES, _mm256_shuffle_ps(t1, t3, 0x44));
        _mm256_storeu_ps(d + 3 * RD_LORA_LANES, _mm256_shuffle_ps(t1, t3, 0xee));
        _mm256_storeu_ps(d + 4 * RD_LORA_LANES, _mm256_shuffle_ps(t4, t6, 0x44));
        _mm256_storeu_ps(d + 5 * RD_LORA_LANES, _mm256_shuffle_ps(t4, t6, 0xee));
        _mm256_storeu_ps(d + 6 * RD_LORA_LANES, _mm256_shuffle_ps(t5, t7, 0x44));
        _mm256_storeu_ps(d + 7 * RD_LORA_LANES, _mm256_shuffle_ps(t5, t7, 0xee));
    }
    for (int32_t c = blocks * 8; c < rounds * RD_LORA_LANES; c++) {
        const int32_t r = c / RD_LORA_LANES, l = c % RD_LORA_LANES;
        for (int32_t e = 0; e < RD_LORA_CHUNK; e++)
            xp[((size_t)r * RD_LORA_CHUNK + e) * RD_LORA_LANES + l] =
                c < chunks ? x[(size_t)c * RD_LORA_CHUNK + e] : 0.0f;
    }
}
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx512f,avx2,fma")
/* 16 elements of ap or bt (dtype T) from element i, as fp32. */
static inline __attribute__((always_inline)) __m512 ld16(const void *p, size_t i, int32_t T)
{
    if (T == GGML_F32)
        return _mm512_loadu_ps((const float *)p + i);
    const __m256i h = _mm256_loadu_si256((const __m256i *)((const uint16_t *)p + i));
    if (T == GGML_F16)
        return _mm512_cvtph_ps(h);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

/* finish_dot on lanes 0-15 (lo) and 16-31 (hi) in registers: lanes_sum's butterfly as vector adds of
 * halves, each lane l < o adding p[l] + p[l + o] (first operand p[l]), the scalar order; a tail (in % 8
 * elements) goes through finish_dot's own loop. */
static inline __attribute__((always_inline)) float finish_avx512(const cpu_lora *L, int32_t k, __m512 lo,
                                                                  __m512 hi, const float *x)
{
    if (L->in % RD_LORA_CHUNK) {
        float p[RD_LORA_LANES];
        _mm512_storeu_ps(p, lo);
        _mm512_storeu_ps(p + 16, hi);
        return finish_dot(L, k, p, x);
    }
    const __m512 v16 = _mm512_add_ps(lo, hi);
    const __m256 v8 = _mm256_add_ps(_mm512_castps512_ps256(v16),
                                    _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v16), 1)));
    const __m128 v4 = _mm_add_ps(_mm256_castps256_ps128(v8), _mm256_extractf128_ps(v8, 1));
    const __m128 v2 = _mm_add_ps(v4, _mm_movehl_ps(v4, v4));
    return _mm_cvtss_f32(_mm_add_ss(v2, _mm_shuffle_ps(v2, v2, 1)));
}

/* t = A x for one row (xp: x in lane order). */
static inline __attribute__((always_inline)) void shrink1_avx512(const cpu_lora *L, const float *x, const float *xp,
                                                                  float *t, int32_t T)
{
    const int32_t rank = L->rank;
    const size_t per_k = (size_t)L->rounds * LANE_BLOCK;
    /* Named accumulators: GCC keeps an indexed array of vectors on the stack. Four k at a time (a
     * missing one repeats the last k and is dropped). */
    for (int32_t k = 0; k < rank; k += 4) {
        const int32_t nk = rank - k < 4 ? rank - k : 4;
        const size_t a0 = (size_t)k * per_k;
        const size_t a1 = a0 + (nk > 1 ? per_k : 0), a2 = a0 + (nk > 2 ? 2 * per_k : 0);
        const size_t a3 = a0 + (nk > 3 ? 3 * per_k : 0);
        __m512 c0a = _mm512_setzero_ps(), c0b = c0a, c1a = c0a, c1b = c0a, c2a = c0a, c2b = c0a, c3a = c0a,
               c3b = c0a;
        for (size_t i = 0; i < per_k; i += RD_LORA_LANES) {
            const __m512 x0 = _mm512_load_ps(xp + i), x1 = _mm512_load_ps(xp + i + 16);
            prefetch(L->ap, a0 + i + PF_A, RD_LORA_LANES, T);
            prefetch(L->ap, a1 + i + PF_A, RD_LORA_LANES, T);
            prefetch(L->ap, a2 + i + PF_A, RD_LORA_LANES, T);
            prefetch(L->ap, a3 + i + PF_A, RD_LORA_LANES, T);
            c0a = _mm512_fmadd_ps(x0, ld16(L->ap, a0 + i, T), c0a);
            c0b = _mm512_fmadd_ps(x1, ld16(L->ap, a0 + i + 16, T), c0b);
            c1a = _mm512_fmadd_ps(x0, ld16(L->ap, a1 + i, T), c1a);
            c1b = _mm512_fmadd_ps(x1, ld16(L->ap, a1 + i + 16, T), c1b);
            c2a = _mm512_fmadd_ps(x0, ld16(L->ap, a2 + i, T), c2a);
            c2b = _mm512_fmadd_ps(x1, ld16(L->ap, a2 + i + 16, T), c2b);
            c3a = _mm512_fmadd_ps(x0, ld16(L->ap, a3 + i, T), c3a);
            c3b = _mm512_fmadd_ps(x1, ld16(L->ap, a3 + i + 16, T), c3b);
        }
        t[k] = finish_avx512(L, k, c0a, c0b, x);
        if (nk > 1)
            t[k + 1] = finish_avx512(L, k + 1, c1a, c1b, x);
        if (nk > 2)
            t[k + 2] = finish_avx512(L, k + 2, c2a, c2b, x);
        if (nk > 3)
            t[k + 3] = finish_avx512(L, k + 3, c3a, c3b, x);
    }
}

/* y += s B t for one row over the outputs in whole vectors; returns the first output left (expand_from's). */
static inline __attribute__((always_inline)) int32_t expand1_avx512(const cpu_lora *L, const float *t, float *y,
                                                                     int32_t T)
{
    const int32_t rank = L->rank, out = L->out;
    const __m512 s = _mm512_set1_ps(L->scale);
    int32_t j = 0;
    for (; j + 64 <= out; j += 64) {
        __m512 u0 = _mm512_setzero_ps(), u1 = u0, u2 = u0, u3 = u0;
        for (int32_t kk = 0; kk < rank; kk++) {
            const size_t b = (size_t)kk * out + j;
            const __m512 tk = _mm512_set1_ps(t[kk]);
            prefetch(L->bt, b + PF_B, 64, T);
            u0 = _mm512_fmadd_ps(ld16(L->bt, b, T), tk, u0);
            u1 = _mm512_fmadd_ps(ld16(L->bt, b + 16, T), tk, u1);
            u2 = _mm512_fmadd_ps(ld16(L->bt, b + 32, T), tk, u2);
            u3 = _mm512_fmadd_ps(ld16(L->bt, b + 48, T), tk, u3);
        }
        _mm512_storeu_ps(y + j, _mm512_add_ps(_mm512_loadu_ps(y + j), _mm512_mul_ps(s, u0)));
        _mm512_storeu_ps(y + j + 16, _mm512_add_ps(_mm512_loadu_ps(y + j + 16), _mm512_mul_ps(s, u1)));
        _mm512_storeu_ps(y + j + 32, _mm512_add_ps(_mm512_loadu_ps(y + j + 32), _mm512_mul_ps(s, u2)));
        _mm512_storeu_ps(y + j + 48, _mm512_add_ps(_mm512_loadu_ps(y + j + 48), _mm512_mul_ps(s, u3)));
    }
    for (; j + 16 <= out; j += 16) {
        __m512 u = _mm512_setzero_ps();
        for (int32_t kk = 0; kk < rank; kk++)
            u = _mm512_fmadd_ps(ld16(L->bt, (size_t)kk * out + j, T), _mm512_set1_ps(t[kk]), u);
        _mm512_storeu_ps(y + j, _mm512_add_ps(_mm512_loadu_ps(y + j), _mm512_mul_ps(s, u)));
    }
    return j;
}

static void row_avx512(const cpu_lora *L, const float *x, float *xp, float *y)
{
    float t[RD_LORA_MAX_RANK];
    permute_x_avx2(x, L->in, L->rounds, xp);
    if (L->a_type == GGML_BF16)
        shrink1_avx512(L, x, xp, t, GGML_BF16);
    else if (L->a_type == GGML_F16)
        shrink1_avx512(L, x, xp, t, GGML_F16);
    else
        shrink1_avx512(L, x, xp, t, GGML_F32);
    int32_t j;
    if (L->b_type == GGML_BF16)
        j = expand1_avx512(L, t, y, GGML_BF16);
    else if (L->b_type == GGML_F16)
        j = expand1_avx512(L, t, y, GGML_F16);
    else
        j = expand1_avx512(L, t, y, GGML_F32);
    expand_from(L, t, y, j);
}

/* Four rows of one adapter at once: each A and B vector loaded (and widened) once serves the four (the base
 * GEMM's reuse), each row's sums the same fmaf chains as row_avx512's. xp holds four rows' x in lane order. */
static inline __attribute__((always_inline)) void shrink4_avx512(const cpu_lora *L, const float *const *x,
                                                                  const float *xp, float t[4][RD_LORA_MAX_RANK],
                                                                  int32_t T)
{
    const int32_t rank = L->rank;
    const size_t per_k = (size_t)L->rounds * LANE_BLOCK;
    for (int32_t k = 0; k < rank; k += 2) {
        const int32_t nk = rank - k < 2 ? rank - k : 2;
        const size_t a0 = (size_t)k * per_k, a1 = nk > 1 ? a0 + per_k : a0;
        const float *x0p = xp, *x1p = xp + per_k, *x2p = xp + 2 * per_k, *x3p = xp + 3 * per_k;
        /* Named accumulators (an indexed array of vectors stays on the stack): [k][row] halves a and b. */
        __m512 z = _mm512_setzero_ps();
        __m512 k0r0a = z, k0r0b = z, k0r1a = z, k0r1b = z, k0r2a = z, k0r2b = z, k0r3a = z, k0r3b = z;
        __m512 k1r0a = z, k1r0b = z, k1r1a = z, k1r1b = z, k1r2a = z, k1r2b = z, k1r3a = z, k1r3b = z;
        for (size_t i = 0; i < per_k; i += RD_LORA_LANES) {
            prefetch(L->ap, a0 + i + PF_A, RD_LORA_LANES, T);
            prefetch(L->ap, a1 + i + PF_A, RD_LORA_LANES, T);
            const __m512 w0a = ld16(L->ap, a0 + i, T), w0b = ld16(L->ap, a0 + i + 16, T);
            const __m512 w1a = ld16(L->ap, a1 + i, T), w1b = ld16(L->ap, a1 + i + 16, T);
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
        t[0][k] = finish_avx512(L, k, k0r0a, k0r0b, x[0]);
        t[1][k] = finish_avx512(L, k, k0r1a, k0r1b, x[1]);
        t[2][k] = finish_avx512(L, k, k0r2a, k0r2b, x[2]);
        t[3][k] = finish_avx512(L, k, k0r3a, k0r3b, x[3]);
        if (nk > 1) {
            t[0][k + 1] = finish_avx512(L, k + 1, k1r0a, k1r0b, x[0]);
            t[1][k + 1] = finish_avx512(L, k + 1, k1r1a, k1r1b, x[1]);
            t[2][k + 1] = finish_avx512(L, k + 1, k1r2a, k1r2b, x[2]);
            t[3][k + 1] = finish_avx512(L, k + 1, k1r3a, k1r3b, x[3]);
        }
    }
}

static inline __attribute__((always_inline)) int32_t expand4_avx512(const cpu_lora *L,
                                                                     float t[4][RD_LORA_MAX_RANK], float *const *y,
                                                                     int32_t T)
{
    const int32_t rank = L->rank, out = L->out;
    const __m512 s = _mm512_set1_ps(L->scale);
    int32_t j = 0;
    for (; j + 32 <= out; j += 32) {
        __m512 z = _mm512_setzero_ps(), u0a = z, u0b = z, u1a = z, u1b = z, u2a = z, u2b = z, u3a = z, u3b = z;
        for (int32_t kk = 0; kk < rank; kk++) {
            const size_t b = (size_t)kk * out + j;
            prefetch(L->bt, b + PF_B, 32, T);
            const __m512 b0 = ld16(L->bt, b, T), b1 = ld16(L->bt, b + 16, T);
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
    return j;
}

static void rows4_avx512(const cpu_lora *L, const float *const *x, float *xp, float *const *y)
{
    float t[4][RD_LORA_MAX_RANK];
    const size_t per_k = (size_t)L->rounds * LANE_BLOCK;
    for (int32_t r = 0; r < 4; r++)
        permute_x_avx2(x[r], L->in, L->rounds, xp + (size_t)r * per_k);
    if (L->a_type == GGML_BF16)
        shrink4_avx512(L, x, xp, t, GGML_BF16);
    else if (L->a_type == GGML_F16)
        shrink4_avx512(L, x, xp, t, GGML_F16);
    else
        shrink4_avx512(L, x, xp, t, GGML_F32);
    int32_t j;
    if (L->b_type == GGML_BF16)
        j = expand4_avx512(L, t, y, GGML_BF16);
    else if (L->b_type == GGML_F16)
        j = expand4_avx512(L, t, y, GGML_F16);
    else
        j = expand4_avx512(L, t, y, GGML_F32);
    for (int32_t r = 0; r < 4; r++)
        expand_from(L, t[r], y[r], j);
}
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
/* 8 elements of ap or bt (dtype T) from element i, as fp32 (F16C: CPU_ISA_AVX2 implies it). */
static inline __attribute__((always_inline)) __m256 ld8(const void *p, size_t i, int32_t T)
{
    if (T == GGML_F32)
        return _mm256_loadu_ps((const float *)p + i);
    const __m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)p + i));
    if (T == GGML_F16)
        return _mm256_cvtph_ps(h);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

/* finish_avx512 for lanes 0-7, 8-15, 16-23, 24-31 in c0..c3. */
static inline __attribute__((always_inline)) float finish_avx2(const cpu_lora *L, int32_t k, __m256 c0, __m256 c1,
                                                                __m256 c2, __m256 c3, const float *x)
{
    if (L->in % RD_LORA_CHUNK) {
        float p[RD_LORA_LANES];
        _mm256_storeu_ps(p, c0);
        _mm256_storeu_ps(p + 8, c1);
        _mm256_storeu_ps(p + 16, c2);
        _mm256_storeu_ps(p + 24, c3);
        return finish_dot(L, k, p, x);
    }
    const __m256 v8 = _mm256_add_ps(c0, c2), w8 = _mm256_add_ps(c1, c3);   /* o = 16 */
    const __m256 u8 = _mm256_add_ps(v8, w8);                               /* o = 8 */
    const __m128 v4 = _mm_add_ps(_mm256_castps256_ps128(u8), _mm256_extractf128_ps(u8, 1));
    const __m128 v2 = _mm_add_ps(v4, _mm_movehl_ps(v4, v4));
    return _mm_cvtss_f32(_mm_add_ss(v2, _mm_shuffle_ps(v2, v2, 1)));
}

static inline __attribute__((always_inline)) void shrink1_avx2(const cpu_lora *L, const float *x, const float *xp,
                                                                float *t, int32_t T)
{
    const int32_t rank = L->rank;
    const size_t per_k = (size_t)L->rounds * LANE_BLOCK;
    for (int32_t k = 0; k < rank; k += 2) {
        const int32_t nk = rank - k < 2 ? rank - k : 2;
        const size_t a0 = (size_t)k * per_k, a1 = nk > 1 ? a0 + per_k : a0;
        /* Named accumulators (an indexed array of vectors stays on the stack). */
        __m256 z = _mm256_setzero_ps(), c00 = z, c01 = z, c02 = z, c03 = z, c10 = z, c11 = z, c12 = z, c13 = z;
        for (size_t i = 0; i < per_k; i += RD_LORA_LANES) {
            const __m256 x0 = _mm256_load_ps(xp + i), x1 = _mm256_load_ps(xp + i + 8);
            const __m256 x2 = _mm256_load_ps(xp + i + 16), x3 = _mm256_load_ps(xp + i + 24);
            prefetch(L->ap, a0 + i + PF_A, RD_LORA_LANES, T);
            prefetch(L->ap, a1 + i + PF_A, RD_LORA_LANES, T);
            c00 = _mm256_fmadd_ps(x0, ld8(L->ap, a0 + i, T), c00);
            c01 = _mm256_fmadd_ps(x1, ld8(L->ap, a0 + i + 8, T), c01);
            c02 = _mm256_fmadd_ps(x2, ld8(L->ap, a0 + i + 16, T), c02);
            c03 = _mm256_fmadd_ps(x3, ld8(L->ap, a0 + i + 24, T), c03);
            c10 = _mm256_fmadd_ps(x0, ld8(L->ap, a1 + i, T), c10);
            c11 = _mm256_fmadd_ps(x1, ld8(L->ap, a1 + i + 8, T), c11);
            c12 = _mm256_fmadd_ps(x2, ld8(L->ap, a1 + i + 16, T), c12);
            c13 = _mm256_fmadd_ps(x3, ld8(L->ap, a1 + i + 24, T), c13);
        }
        t[k] = finish_avx2(L, k, c00, c01, c02, c03, x);
        if (nk > 1)
            t[k + 1] = finish_avx2(L, k + 1, c10, c11, c12, c13, x);
    }
}

static inline __attribute__((always_inline)) int32_t expand1_avx2(const cpu_lora *L, const float *t, float *y,
                                                                   int32_t T)
{
    const int32_t rank = L->rank, out = L->out;
    const __m256 s = _mm256_set1_ps(L->scale);
    int32_t j = 0;
    for (; j + 32 <= out; j += 32) {
        __m256 u0 = _mm256_setzero_ps(), u1 = u0, u2 = u0, u3 = u0;
        for (int32_t kk = 0; kk < rank; kk++) {
            const size_t b = (size_t)kk * out + j;
            const __m256 tk = _mm256_set1_ps(t[kk]);
            prefetch(L->bt, b + PF_B, 32, T);
            u0 = _mm256_fmadd_ps(ld8(L->bt, b, T), tk, u0);
            u1 = _mm256_fmadd_ps(ld8(L->bt, b + 8, T), tk, u1);
            u2 = _mm256_fmadd_ps(ld8(L->bt, b + 16, T), tk, u2);
            u3 = _mm256_fmadd_ps(ld8(L->bt, b + 24, T), tk, u3);
        }
        _mm256_storeu_ps(y + j, _mm256_add_ps(_mm256_loadu_ps(y + j), _mm256_mul_ps(s, u0)));
        _mm256_storeu_ps(y + j + 8, _mm256_add_ps(_mm256_loadu_ps(y + j + 8), _mm256_mul_ps(s, u1)));
        _mm256_storeu_ps(y + j + 16, _mm256_add_ps(_mm256_loadu_ps(y + j + 16), _mm256_mul_ps(s, u2)));
        _mm256_storeu_ps(y + j + 24, _mm256_add_ps(_mm256_loadu_ps(y + j + 24), _mm256_mul_ps(s, u3)));
    }
    for (; j + 8 <= out; j += 8) {
        __m256 u = _mm256_setzero_ps();
        for (int32_t kk = 0; kk < rank; kk++)
            u = _mm256_fmadd_ps(ld8(L->bt, (size_t)kk * out + j, T), _mm256_set1_ps(t[kk]), u);
        _mm256_storeu_ps(y + j, _mm256_add_ps(_mm256_loadu_ps(y + j), _mm256_mul_ps(s, u)));
    }
    return j;
}

static void row_avx2(const cpu_lora *L, const float *x, float *xp, float *y)
{
    float t[RD_LORA_MAX_RANK];
    permute_x_avx2(x, L->in, L->rounds, xp);
    if (L->a_type == GGML_BF16)
        shrink1_avx2(L, x, xp, t, GGML_BF16);
    else if (L->a_type == GGML_F16)
        shrink1_avx2(L, x, xp, t, GGML_F16);
    else
        shrink1_avx2(L, x, xp, t, GGML_F32);
    int32_t j;
    if (L->b_type == GGML_BF16)
        j = expand1_avx2(L, t, y, GGML_BF16);
    else if (L->b_type == GGML_F16)
        j = expand1_avx2(L, t, y, GGML_F16);
    else
        j = expand1_avx2(L, t, y, GGML_F32);
    expand_from(L, t, y, j);
}
#pragma GCC pop_options

/* t = A x in plain C, each lane's fmaf chain over A in lane order (the order cpu_lora_dot walks a row of A
 * in); one copy per dtype T, as the vector paths. */
static inline __attribute__((always_inline)) void shrink1_c(const cpu_lora *L, const float *x, const float *xp,
                                                             float *t, int32_t T)
{
    float p[RD_LORA_LANES];
    const size_t per_k = (size_t)L->rounds * LANE_BLOCK;
    for (int32_t k = 0; k < L->rank; k++) {
        const size_t a = (size_t)k * per_k;
        memset(p, 0, sizeof p);
        for (size_t i = 0; i < per_k; i++)
            p[i % RD_LORA_LANES] = fmaf(xp[i], elem(L->ap, T, a + i), p[i % RD_LORA_LANES]);
        t[k] = finish_dot(L, k, p, x);
    }
}

/* One row in plain C: y[out_off + j] += s (B (A x))[j]. */
static void lora_row(const cpu_lora *L, const float *x, float *xp, float *y)
{
    float t[RD_LORA_MAX_RANK];
    permute_x(x, L->in, L->rounds, xp);
    if (L->a_type == GGML_BF16)
        shrink1_c(L, x, xp, t, GGML_BF16);
    else if (L->a_type == GGML_F16)
        shrink1_c(L, x, xp, t, GGML_F16);
    else
        shrink1_c(L, x, xp, t, GGML_F32);
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
