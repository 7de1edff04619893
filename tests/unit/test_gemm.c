/* test_gemm.c - the packed batch-invariant GEMM (kernels/cpu/gemm.h).
 *
 * - equals OpenBLAS cblas_sgemm within a rounding bound, for shapes whose out
 *   is not a multiple of the 16-column panel and for M = 1..70;
 * - row r of the result is bit-identical for every M from 1 to 300, wherever
 *   the row sits in the batch, and for 1 vs 2 threads (batch invariance);
 * - every output is bit-identical to one scalar fmaf chain over k in order
 *   from 0 (so the AVX2 and AVX-512 tilings agree with each other and with
 *   any host), for M = 1..70 and shapes with every tile tail;
 * - accumulate = 1 equals a separate float add of the product;
 * - pack/unpack/row round-trip, and the output outside y[M][out] is never
 *   written (canaries) nor read when accumulate = 0 (y poisoned with NaN).
 * Weights in their file dtype (kernels/cpu/gemm_quant.h), for each of F32,
 * F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K on random blocks
 * (random quants, random finite f16 scales down to subnormals):
 * - every decoded weight (AVX-512 and plain C decoders, row reads) is the
 *   float ggml_dequant_row gives, bit for bit, and lanes past out are +-0;
 * - the GEMM output is memcmp-equal to gemm_forward on the dequantized
 *   weight for M = 1..65, with out odd / not a multiple of the panel and K
 *   at every tail the type allows, with accumulate 0 and 1, and equal to the
 *   scalar fmaf chain; no write past y[M][out]; also before the decode
 *   buffers are reserved (gemm_qreserve: the plain-C fallback);
 * - through the CPU backend, a weight of mixed-dtype parts (a fused q|k|v)
 *   gives the same outputs, row reads and embedding rows as the same weight
 *   loaded with RD_CPU_WEIGHTS=f32, and reports fewer bytes.
 *
 * Threads: the CPU backend runs the GEMM on its worker pool
 * (base/pool.h, sized by the first pool_init). The thread case runs first, while the pool is still unstarted
 * (serial), then starts 2 threads for everything after it. */
#include <cblas.h>
#include <float.h>
#include <stdint.h>

#include "engine/backend.h"
#include "base/err.h"
#include "engine/format/gguf.h"
#include "base/cpu_isa.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/gemm_quant.h"
#include "tests/unit/test.h"

#include "base/pool.h"

static int threads_now(void)
{
    return pool_size();
}

static void use_threads(int n)
{
    if (n > 1)
        pool_init(n); /* the first call fixes the size; unstarted = serial */
}

/* Values in [-1, 1) with a few larger ones, from a fixed LCG. */
static void fill(float *a, size_t n, uint64_t seed)
{
    uint64_t x = seed * 0x9E3779B97F4A7C15ull + 7;
    for (size_t i = 0; i < n; i++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        float v = (float)((double)(x >> 40) / (double)(1ull << 24)) * 2.0f - 1.0f;
        a[i] = (i % 97 == 3) ? v * 8.0f : v;
    }
}

typedef struct {
    int32_t out, in;
} shape;

/* y = x . W^T with OpenBLAS, and the bound sum_k |x_k w_k| per element. */
static void blas_ref(const float *x, const float *w, int32_t m, int32_t out, int32_t in, float *y, float *bound)
{
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, out, in, 1.0f, x, in, w, in, 0.0f, y, out);
    float *ax = malloc(sizeof(float) * (size_t)m * in), *aw = malloc(sizeof(float) * (size_t)out * in);
    for (size_t i = 0; i < (size_t)m * in; i++)
        ax[i] = fabsf(x[i]);
    for (size_t i = 0; i < (size_t)out * in; i++)
        aw[i] = fabsf(w[i]);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, out, in, 1.0f, ax, in, aw, in, 0.0f, bound, out);
    free(ax);
    free(aw);
}

#define CANARY 8

/* Runs gemm_forward into a NaN-poisoned y with canaries after it; returns 0
 * if the canaries survived. */
static int forward_checked(const gemm_weight *g, const float *x, int32_t m, float *y)
{
    size_t n = (size_t)m * g->out;
    for (size_t i = 0; i < n; i++)
        y[i] = NAN;
    for (int i = 0; i < CANARY; i++)
        y[n + i] = 12345.0f + i;
    gemm_forward(g, x, m, y, 0);
    for (int i = 0; i < CANARY; i++)
        if (y[n + i] != 12345.0f + i)
            return -1;
    return 0;
}

/* ---------------------------------------------------------------------------
 * Thread count: runs first (pool unstarted, or OpenMP at 1 thread). */

static void test_thread_invariance(void)
{
    use_threads(1);
    CHECK(threads_now() == 1, "expected 1 thread before starting the pool, have %d", threads_now());
    const shape shapes[] = {{300, 576}, {50, 96}, {1000, 64}};
    const int32_t ms[] = {1, 3, 5, 64, 65, 130, 300};
    float *r1[3][7], *x = malloc(sizeof(float) * 300 * 576), *w = malloc(sizeof(float) * 1000 * 576);
    gemm_weight g[3];
    CHECK(x && w, "oom");
    fill(x, 300 * 576, 1);
    for (int s = 0; s < 3; s++) {
        fill(w, (size_t)shapes[s].out * shapes[s].in, 10 + s);
        CHECK_OK(gemm_pack(w, shapes[s].out, shapes[s].in, &g[s]));
        for (int k = 0; k < 7; k++) {
            r1[s][k] = malloc(sizeof(float) * ((size_t)ms[k] * shapes[s].out + CANARY));
            forward_checked(&g[s], x, ms[k], r1[s][k]);
        }
    }
    use_threads(2);
    int n2 = threads_now();
    int same = 1, canary = 1;
    char why[200] = "";
    float *y = malloc(sizeof(float) * (300 * 1000 + CANARY));
    for (int rep = 0; rep < 3; rep++) /* a few times: the split across threads varies run to run */
        for (int s = 0; s < 3; s++)
            for (int k = 0; k < 7; k++) {
                canary &= forward_checked(&g[s], x, ms[k], y) == 0;
                if (same && memcmp(y, r1[s][k], sizeof(float) * (size_t)ms[k] * shapes[s].out) != 0) {
                    same = 0;
                    snprintf(why, sizeof why, "shape %dx%d M=%d", shapes[s].out, shapes[s].in, ms[k]);
                }
            }
    for (int s = 0; s < 3; s++) {
        gemm_release(&g[s]);
        for (int k = 0; k < 7; k++)
            free(r1[s][k]);
    }
    free(x), free(w), free(y);
    CHECK(n2 == 2, "could not start 2 threads (have %d)", n2);
    CHECK(canary, "gemm_forward wrote past y[M][out]");
    CHECK(same, "1 thread vs 2 threads differ: %s", why);
}

/* ---------------------------------------------------------------------------
 * Against OpenBLAS. */

static void test_matches_openblas(void)
{
    const shape shapes[] = {{16, 32}, {17, 64}, {1, 7}, {33, 5}, {50, 96}, {128, 100}, {300, 576}, {576, 1536}};
    const int n_shapes = sizeof shapes / sizeof shapes[0];
    float *x = malloc(sizeof(float) * 70 * 1536), *w = malloc(sizeof(float) * 576 * 1536);
    float *y = malloc(sizeof(float) * (70 * 576 + CANARY)), *ref = malloc(sizeof(float) * 70 * 576);
    float *bound = malloc(sizeof(float) * 70 * 576);
    CHECK(x && w && y && ref && bound, "oom");
    fill(x, 70 * 1536, 2);
    double worst = 0;
    char why[200] = "";
    int finite = 1, canary = 1;
    for (int s = 0; s < n_shapes; s++) {
        const int32_t out = shapes[s].out, in = shapes[s].in;
        fill(w, (size_t)out * in, 20 + s);
        gemm_weight g;
        CHECK_OK(gemm_pack(w, out, in, &g));
        int big = (int64_t)out * in > 100000;
        for (int32_t m = 1; m <= 70; m++) {
            if (big && !(m <= 5 || m == 8 || m == 13 || m == 16 || m == 31 || m == 64 || m == 65 || m == 70))
                continue;
            canary &= forward_checked(&g, x, m, y) == 0;
            blas_ref(x, w, m, out, in, ref, bound);
            for (size_t i = 0; i < (size_t)m * out; i++) {
                if (!isfinite(y[i]))
                    finite = 0;
                /* fp32 rounding of a length-`in` sum stays far below 1e-5 of sum |x w| */
                double rel = fabs((double)y[i] - ref[i]) / ((double)bound[i] + 1e-30);
                if (!(rel <= worst)) {
                    worst = rel;
                    snprintf(why, sizeof why, "shape %dx%d M=%d element %zu: %.9g vs OpenBLAS %.9g", out, in, m,
                             i, y[i], ref[i]);
                }
            }
        }
        gemm_release(&g);
    }
    free(x), free(w), free(y), free(ref), free(bound);
    CHECK(canary, "gemm_forward wrote past y[M][out]");
    CHECK(finite, "non-finite output: y was read with accumulate = 0 (poisoned with NaN)");
    CHECK(worst <= 1e-5, "error %.3g of sum|x w| (worst: %s)", worst, why);
}

/* ---------------------------------------------------------------------------
 * The contract itself: acc = fmaf(x[k], w[k], acc) for k = 0..in-1. */

static void test_scalar_chain(void)
{
    /* out: 1 panel, a partial one, odd numbers of panels (the 2-panel and
     * 4-panel tiles' tails); in: 1, odd, and longer than a cache line. */
    const shape shapes[] = {{1, 1}, {15, 7}, {16, 33}, {17, 64}, {47, 5}, {49, 129}, {80, 96}, {113, 300}};
    const int n_shapes = sizeof shapes / sizeof shapes[0];
    float *x = malloc(sizeof(float) * 70 * 300), *w = malloc(sizeof(float) * 113 * 300);
    float *y = malloc(sizeof(float) * (70 * 113 + CANARY));
    CHECK(x && w && y, "oom");
    fill(x, 70 * 300, 6);
    int same = 1;
    char why[200] = "";
    for (int s = 0; s < n_shapes && same; s++) {
        const int32_t out = shapes[s].out, in = shapes[s].in;
        fill(w, (size_t)out * in, 60 + s);
        gemm_weight g;
        CHECK_OK(gemm_pack(w, out, in, &g));
        for (int32_t m = 1; m <= 70 && same; m++) {
            forward_checked(&g, x, m, y);
            for (int32_t r = 0; r < m && same; r++)
                for (int32_t c = 0; c < out; c++) {
                    float acc = 0.0f;
                    for (int32_t k = 0; k < in; k++)
                        acc = fmaf(x[(size_t)r * in + k], w[(size_t)c * in + k], acc);
                    if (memcmp(&acc, &y[(size_t)r * out + c], sizeof acc) != 0) {
                        same = 0;
                        snprintf(why, sizeof why, "shape %dx%d M=%d y[%d][%d] = %.9g, chain %.9g", out, in, m, r,
                                 c, y[(size_t)r * out + c], acc);
                        break;
                    }
                }
        }
        gemm_release(&g);
    }
    free(x), free(w), free(y);
    CHECK(same, "not the scalar FMA chain: %s", why);
}

/* ---------------------------------------------------------------------------
 * Batch invariance: row r of the result for every M, at any position. */

static void row_invariance(int32_t out, int32_t in, int all_m, char *why, size_t cap, int *ok)
{
    const int32_t MAXM = 300;
    float *x = malloc(sizeof(float) * (size_t)MAXM * in), *w = malloc(sizeof(float) * (size_t)out * in);
    float *full = malloc(sizeof(float) * ((size_t)MAXM * out + CANARY));
    float *y = malloc(sizeof(float) * ((size_t)MAXM * out + CANARY));
    float *xr = malloc(sizeof(float) * (size_t)MAXM * in);
    gemm_weight g = {0};
    *ok = 0;
    if (!x || !w || !full || !y || !xr) {
        snprintf(why, cap, "out of memory");
        goto out;
    }
    fill(x, (size_t)MAXM * in, 3);
    fill(w, (size_t)out * in, 4);
    if (gemm_pack(w, out, in, &g) || forward_checked(&g, x, MAXM, full)) {
        snprintf(why, cap, "full batch failed");
        goto out;
    }
    /* The plain-C kernels (RD_CPU_ISA=scalar) take ~10x the vector ones'
     * time: there only the row-tile edges and the small batches. */
    const int plain = cpu_isa_active() == CPU_ISA_SCALAR;
    for (int32_t m = 1; m <= MAXM; m++) {
        int edge = m % 64 <= 1 || m % 64 == 63 || m < 10 || m == MAXM;
        int boundary = edge || m % 4 == 0;
        if (!all_m && !(plain ? edge : boundary || m % 7 == 0))
            continue;
        if (forward_checked(&g, x, m, y)) {
            snprintf(why, cap, "%dx%d M=%d wrote past y", out, in, m);
            goto out;
        }
        for (int32_t r = 0; r < m; r++)
            if (memcmp(y + (size_t)r * out, full + (size_t)r * out, sizeof(float) * out) != 0) {
                snprintf(why, cap, "%dx%d: row %d differs between M=%d and M=%d", out, in, r, m, MAXM);
                goto out;
            }
    }
    /* The same rows in reverse order: each row's result follows it. */
    for (int32_t r = 0; r < MAXM; r++)
        memcpy(xr + (size_t)r * in, x + (size_t)(MAXM - 1 - r) * in, sizeof(float) * in);
    if (forward_checked(&g, xr, MAXM, y)) {
        snprintf(why, cap, "reversed batch failed");
        goto out;
    }
    for (int32_t r = 0; r < MAXM; r++)
        if (memcmp(y + (size_t)r * out, full + (size_t)(MAXM - 1 - r) * out, sizeof(float) * out) != 0) {
            snprintf(why, cap, "%dx%d: row %d gives a different result at position %d of the batch", out, in,
                     MAXM - 1 - r, r);
            goto out;
        }
    *ok = 1;
out:
    gemm_release(&g);
    free(x), free(w), free(full), free(y), free(xr);
}

static void test_row_invariance(void)
{
    CHECK(threads_now() == 2, "running on %d threads, expected 2", threads_now());
    char why[200] = "";
    int ok;
    row_invariance(50, 96, 1, why, sizeof why, &ok);
    CHECK(ok, "%s", why);
    row_invariance(17, 33, 1, why, sizeof why, &ok);
    CHECK(ok, "%s", why);
    row_invariance(300, 576, 0, why, sizeof why, &ok);
    CHECK(ok, "%s", why);
}

/* ---------------------------------------------------------------------------
 * accumulate = 1 equals a separate add; pack round trip; errors. */

static void test_accumulate(void)
{
    const shape shapes[] = {{17, 64}, {300, 576}, {5, 3}};
    const int32_t ms[] = {1, 3, 4, 5, 64, 65, 70};
    float *x = malloc(sizeof(float) * 70 * 576), *w = malloc(sizeof(float) * 300 * 576);
    float *y0 = malloc(sizeof(float) * 70 * 300), *acc = malloc(sizeof(float) * (70 * 300 + CANARY));
    float *prod = malloc(sizeof(float) * (70 * 300 + CANARY));
    CHECK(x && w && y0 && acc && prod, "oom");
    fill(x, 70 * 576, 5);
    int same = 1, canary = 1;
    char why[200] = "";
    for (int s = 0; s < 3 && same; s++) {
        const int32_t out = shapes[s].out, in = shapes[s].in;
        fill(w, (size_t)out * in, 30 + s);
        gemm_weight g;
        CHECK_OK(gemm_pack(w, out, in, &g));
        for (int k = 0; k < 7 && same; k++) {
            const int32_t m = ms[k];
            const size_t n = (size_t)m * out;
            fill(y0, n, 40 + k);
            memcpy(acc, y0, sizeof(float) * n);
            for (int i = 0; i < CANARY; i++)
                acc[n + i] = -777.0f;
            gemm_forward(&g, x, m, acc, 1);
            for (int i = 0; i < CANARY; i++)
                canary &= acc[n + i] == -777.0f;
            forward_checked(&g, x, m, prod);
            for (size_t i = 0; i < n; i++) {
                float want = y0[i] + prod[i];
                if (memcmp(&acc[i], &want, sizeof(float)) != 0) {
                    same = 0;
                    snprintf(why, sizeof why, "shape %dx%d M=%d element %zu: %.9g vs %.9g + %.9g = %.9g", out, in,
                             m, i, acc[i], y0[i], prod[i], want);
                    break;
                }
            }
        }
        gemm_release(&g);
    }
    free(x), free(w), free(y0), free(acc), free(prod);
    CHECK(canary, "accumulate wrote past y[M][out]");
    CHECK(same, "accumulate differs from a separate add: %s", why);
}

static void test_pack_roundtrip(void)
{
    const shape shapes[] = {{1, 1}, {17, 5}, {33, 70}, {16, 16}};
    for (int s = 0; s < 4; s++) {
        const int32_t out = shapes[s].out, in = shapes[s].in;
        float *w = malloc(sizeof(float) * out * in), *back = malloc(sizeof(float) * out * in);
        float *row = malloc(sizeof(float) * in);
        CHECK(w && back && row, "oom");
        fill(w, (size_t)out * in, 50 + s);
        gemm_weight g;
        int rc = gemm_pack(w, out, in, &g);
        int ok = rc == 0 && g.out == out && g.in == in && g.n_panels == (out + GEMM_PANEL - 1) / GEMM_PANEL;
        if (ok) {
            gemm_unpack(&g, back);
            ok = memcmp(w, back, sizeof(float) * out * in) == 0;
            for (int32_t r = 0; ok && r < out; r++) {
                gemm_row(&g, r, row);
                ok = memcmp(row, w + (size_t)r * in, sizeof(float) * in) == 0;
            }
            gemm_release(&g);
        }
        free(w), free(back), free(row);
        CHECK(ok, "shape %dx%d: pack/unpack/row round trip (rc %d)", out, in, rc);
    }
    gemm_weight g;
    rd_fail(RD_OK, "%s", "");
    CHECK(gemm_pack(NULL, 0, 4, &g) == RD_EINVAL && rd_errmsg()[0], "out = 0 accepted");
    rd_fail(RD_OK, "%s", "");
    CHECK(gemm_pack(NULL, 4, -1, &g) == RD_EINVAL && rd_errmsg()[0], "in = -1 accepted");
}

/* ---------------------------------------------------------------------------
 * Weights in their file dtype. */

static const int32_t qtypes[] = {GGML_F32,  GGML_F16,  GGML_BF16, GGML_Q8_0, GGML_Q4_0, GGML_Q4_1,
                                 GGML_Q5_0, GGML_Q5_1, GGML_Q4_K, GGML_Q5_K, GGML_Q6_K};
#define N_QTYPES ((int)(sizeof qtypes / sizeof qtypes[0]))

static uint64_t lcg(uint64_t *x)
{
    *x = *x * 6364136223846793005ull + 1442695040888963407ull;
    return *x >> 17;
}

/* A finite f16 with a random exponent (subnormals included). */
static uint16_t rand_f16(uint64_t *x)
{
    uint16_t h = (uint16_t)lcg(x);
    if (((h >> 10) & 0x1f) == 0x1f)
        h ^= 0x4000;
    return h;
}

/* Random raw GGUF bytes of [out][in] type t with finite scales; *w gets the
 * dequantized fp32 weight (ggml_dequant_row, the oracle). NULL on oom. */
static uint8_t *rand_raw(int32_t t, int32_t out, int32_t in, uint64_t seed, float **w)
{
    size_t rb = ggml_row_bytes(t, (uint64_t)in), n = rb * (size_t)out;
    uint8_t *raw = malloc(n ? n : 1);
    *w = malloc(sizeof(float) * (size_t)out * in);
    if (!raw || !*w)
        return NULL;
    uint64_t x = seed * 0x9E3779B97F4A7C15ull + 3;
    for (size_t i = 0; i < n; i++)
        raw[i] = (uint8_t)lcg(&x);
    uint32_t blck, bb;
    ggml_type_layout(t, &blck, &bb);
    int f16_at[2] = {-1, -1};
    switch (t) {
    case GGML_Q8_0: case GGML_Q4_0: case GGML_Q5_0: f16_at[0] = 0; break;
    case GGML_Q4_1: case GGML_Q5_1: case GGML_Q4_K: case GGML_Q5_K: f16_at[0] = 0, f16_at[1] = 2; break;
    case GGML_Q6_K: f16_at[0] = 208; break;
    }
    for (size_t b = 0; b < n / bb; b++) {
        uint8_t *blk = raw + b * bb;
        if (t == GGML_F32) {
            float v;
            fill(&v, 1, seed * 1000003u + b);
            memcpy(blk, &v, 4);
        } else if (t == GGML_F16) {
            uint16_t h = rand_f16(&x);
            memcpy(blk, &h, 2);
        } else if (t == GGML_BF16) {
            uint16_t h = (uint16_t)lcg(&x);
            if (((h >> 7) & 0xff) == 0xff)
                h ^= 0x4000;
            memcpy(blk, &h, 2);
        }
        for (int j = 0; j < 2; j++)
            if (f16_at[j] >= 0) {
                uint16_t h = rand_f16(&x);
                memcpy(blk + f16_at[j], &h, 2);
            }
    }
    if (ggml_dequant_row(t, raw, *w, (uint64_t)out * in))
        return NULL;
    return raw;
}

/* The shapes a type allows, with every tail: K-quants K % 256 == 0, 32-blocks
 * K % 32 == 0, F types any K; out odd, below, at and past a panel. */
static int qshapes(int32_t t, shape *sh)
{
    uint32_t blck, bb;
    ggml_type_layout(t, &blck, &bb);
    int n = 0;
    if (blck == 1) {
        const shape f[] = {{1, 1}, {31, 7}, {50, 33}, {17, 100}, {16, 64}};
        for (int i = 0; i < 5; i++) sh[n++] = f[i];
    } else if (blck == 32) {
        const shape q[] = {{1, 32}, {33, 64}, {75, 96}, {16, 160}};
        for (int i = 0; i < 4; i++) sh[n++] = q[i];
    } else {
        const shape k[] = {{5, 256}, {47, 512}, {16, 256}};
        for (int i = 0; i < 3; i++) sh[n++] = k[i];
    }
    return n;
}

static void test_quant_decode(void)
{
    int ok = 1;
    char why[240] = "";
    for (int ti = 0; ti < N_QTYPES && ok; ti++) {
        const int32_t t = qtypes[ti];
        shape sh[8];
        int ns = qshapes(t, sh);
        for (int s = 0; s < ns && ok; s++) {
            const int32_t out = sh[s].out, in = sh[s].in;
            float *w;
            uint8_t *raw = rand_raw(t, out, in, 100 + ti * 10 + s, &w);
            CHECK(raw, "oom / dequant: %s", rd_errmsg());
            gemm_qpart q;
            CHECK_OK(gemm_qpack(t, raw, out, in, &q));
            float a[GEMMQ_CHUNK * GEMM_PANEL], b[GEMMQ_CHUNK * GEMM_PANEL];
            for (int32_t p = 0; p < q.n_panels && ok; p++)
                for (int32_t k0 = 0; k0 < in && ok; k0 += GEMMQ_CHUNK) {
                    int32_t nk = in - k0 < GEMMQ_CHUNK ? in - k0 : GEMMQ_CHUNK;
                    gemm_qdecode(&q, p, k0, nk, a);
                    gemm_qdecode_scalar(&q, p, k0, nk, b);
                    for (int32_t kk = 0; kk < nk && ok; kk++)
                        for (int l = 0; l < GEMM_PANEL && ok; l++) {
                            int32_t c = p * GEMM_PANEL + l;
                            float va = a[kk * GEMM_PANEL + l], vb = b[kk * GEMM_PANEL + l];
                            /* Lanes past out hold zero codes and scales: +-0, never read back. */
                            float want = c < out ? w[(size_t)c * in + k0 + kk] : va;
                            if (memcmp(&va, &want, 4) || memcmp(&vb, &want, 4) || (c >= out && va != 0.0f)) {
                                ok = 0;
                                snprintf(why, sizeof why, "%s [%d][%d] w[%d][%d]: decode %.9g, scalar %.9g, dequant %.9g",
                                         ggml_type_name(t), out, in, c, k0 + kk, va, vb, want);
                            }
                        }
                }
            float *row = malloc(sizeof(float) * in);
            for (int32_t r = 0; r < out && ok; r++) {
                gemm_qrow(&q, r, row);
                if (memcmp(row, w + (size_t)r * in, sizeof(float) * in)) {
                    ok = 0;
                    snprintf(why, sizeof why, "%s [%d][%d]: row %d differs", ggml_type_name(t), out, in, r);
                }
            }
            free(row);
            /* The pack keeps every bit: rows read back as the bytes packed, whole and from a middle row. */
            const size_t rb = ggml_row_bytes(t, (uint64_t)in);
            uint8_t *back = malloc(rb * (size_t)out);
            const int32_t r0 = out / 3;
            if (ok && (!back || gemm_qraw(&q, 0, out, back) || memcmp(back, raw, rb * (size_t)out) ||
                       gemm_qraw(&q, r0, out - r0, back) || memcmp(back, raw + rb * (size_t)r0, rb * (size_t)(out - r0)))) {
                ok = 0;
                snprintf(why, sizeof why, "%s [%d][%d]: gemm_qraw does not give back the packed bytes",
                         ggml_type_name(t), out, in);
            }
            free(back);
            gemm_qrelease(&q);
            free(raw);
            free(w);
        }
    }
    CHECK(ok, "%s", why);
    gemm_qpart q;
    uint8_t z[144] = {0};
    CHECK(gemm_qpack(GGML_Q4_K, z, 1, 32, &q) == RD_EINVAL && strstr(rd_errmsg(), "multiple"), "K %% 256 accepted");
    CHECK(gemm_qpack(GGML_Q4_0, z, 1, 40, &q) == RD_EINVAL, "K %% 32 accepted");
    CHECK(gemm_qpack(11, z, 1, 256, &q) == RD_ENOTSUP, "q3_K accepted");
}

/* y = x . W^T of a packed file-dtype weight, poisoned and guarded as forward_checked. */
static int qforward_checked(const gemm_qlinear *L, const float *x, int32_t m, float *y, int accumulate)
{
    size_t n = (size_t)m * L->out;
    if (!accumulate)
        for (size_t i = 0; i < n; i++)
            y[i] = NAN;
    for (int i = 0; i < CANARY; i++)
        y[n + i] = 12345.0f + i;
    gemm_qforward(L, x, m, y, accumulate);
    for (int i = 0; i < CANARY; i++)
        if (y[n + i] != 12345.0f + i)
            return -1;
    return 0;
}

static void test_quant_gemm(void)
{
    const int32_t MAXM = 65;
    float *x = malloc(sizeof(float) * MAXM * 512), *y = malloc(sizeof(float) * (MAXM * 75 + CANARY));
    float *ref = malloc(sizeof(float) * (MAXM * 75 + CANARY)), *res = malloc(sizeof(float) * MAXM * 75);
    CHECK(x && y && ref && res, "oom");
    fill(x, (size_t)MAXM * 512, 9);
    fill(res, (size_t)MAXM * 75, 10);
    int ok = 1;
    char why[240] = "";
    /* Phase 0: before gemm_qreserve (the plain-C path of batches past 8
     * rows), two types; phase 1: every type with the decode buffers. */
    for (int phase = 0; phase < 2 && ok; phase++)
    for (int ti = 0; ti < N_QTYPES && ok; ti++) {
        const int32_t t = qtypes[ti];
        if (phase == 0 && t != GGML_Q4_1 && t != GGML_Q6_K)
            continue;
        if (phase == 1 && ti == 0)
            CHECK_OK(gemm_qreserve(512));
        shape sh[8];
        int ns = qshapes(t, sh);
        for (int s = 0; s < ns && ok; s++) {
            const int32_t out = sh[s].out, in = sh[s].in;
            float *w;
            uint8_t *raw = rand_raw(t, out, in, 200 + ti * 10 + s, &w);
            CHECK(raw, "oom / dequant: %s", rd_errmsg());
            gemm_qlinear L = {.out = out, .in = in, .n_parts = 1};
            CHECK_OK(gemm_qpack(t, raw, out, in, &L.parts[0]));
            gemm_qlinear_index(&L);
            gemm_weight g;
            CHECK_OK(gemm_pack(w, out, in, &g));
            for (int32_t m = 1; m <= MAXM && ok; m++)
                for (int acc = 0; acc < 2 && ok; acc++) {
                    if (acc && m % 8 != 1 && m != 4)
                        continue;
                    size_t n = (size_t)m * out;
                    if (acc) {
                        memcpy(y, res, n * sizeof(float));
                        memcpy(ref, res, n * sizeof(float));
                    }
                    gemm_forward(&g, x, m, ref, acc);
                    if (qforward_checked(&L, x, m, y, acc)) {
                        ok = 0;
                        snprintf(why, sizeof why, "%s [%d][%d] M=%d: wrote past y", ggml_type_name(t), out, in, m);
                        break;
                    }
                    for (size_t i = 0; i < n && ok; i++)
                        if (memcmp(&y[i], &ref[i], 4)) {
                            ok = 0;
                            snprintf(why, sizeof why, "%s [%d][%d] M=%d acc=%d: y[%zu][%zu] = %.9g, fp32 GEMM %.9g",
                                     ggml_type_name(t), out, in, m, acc, i / out, i % out, y[i], ref[i]);
                        }
                    /* And the scalar chain itself, for a few M. */
                    if (!acc && (m == 1 || m == 3 || m == 4 || m == MAXM))
                        for (int32_t r = 0; r < m && ok; r++)
                            for (int32_t c = 0; c < out && ok; c++) {
                                float a = 0.0f;
                                for (int32_t k = 0; k < in; k++)
                                    a = fmaf(x[(size_t)r * in + k], w[(size_t)c * in + k], a);
                                if (memcmp(&a, &y[(size_t)r * out + c], 4)) {
                                    ok = 0;
                                    snprintf(why, sizeof why, "%s [%d][%d] M=%d: y[%d][%d] = %.9g, chain %.9g",
                                             ggml_type_name(t), out, in, m, r, c, y[(size_t)r * out + c], a);
                                }
                            }
                }
            gemm_release(&g);
            gemm_qrelease(&L.parts[0]);
            free(raw);
            free(w);
        }
    }
    free(x), free(y), free(ref), free(res);
    CHECK(ok, "%s", why);
}

/* A fused weight of mixed dtypes through the CPU backend, native vs RD_CPU_WEIGHTS=f32. */
static void test_quant_backend_parts(void)
{
    rd_backend *be;
    CHECK_OK(rd_backend_create("cpu", 0, &be));
    const int32_t in = 256, rows[3] = {40, 24, 7}, types[3] = {GGML_Q5_0, GGML_Q8_0, GGML_Q6_K};
    const int32_t out = 71, MAXM = 65;
    uint8_t *raw[3];
    float *w[3];
    rd_wpart parts[3];
    for (int i = 0; i < 3; i++) {
        raw[i] = rand_raw(types[i], rows[i], in, 300 + i, &w[i]);
        CHECK(raw[i], "oom");
        parts[i] = (rd_wpart){.type = types[i], .rows = rows[i], .data = raw[i]};
    }
    void *hq, *hf;
    unsetenv("RD_CPU_WEIGHTS");
    CHECK_OK(be->ops->linear_load_q(be, parts, 3, in, &hq));
    setenv("RD_CPU_WEIGHTS", "f32", 1);
    CHECK_OK(be->ops->linear_load_q(be, parts, 3, in, &hf));
    unsetenv("RD_CPU_WEIGHTS");
    int64_t bq = be->ops->linear_bytes(be, hq), bf = be->ops->linear_bytes(be, hf);
    CHECK(bf == (int64_t)5 * 16 * in * 4 && bq < bf / 3, "bytes native %lld, f32 %lld", (long long)bq, (long long)bf);
    float *x = malloc(sizeof(float) * MAXM * in), *y0 = malloc(sizeof(float) * MAXM * out);
    float *y1 = malloc(sizeof(float) * MAXM * out), *r0 = malloc(sizeof(float) * out * in);
    float *r1 = malloc(sizeof(float) * out * in);
    CHECK(x && y0 && y1 && r0 && r1, "oom");
    fill(x, (size_t)MAXM * in, 11);
    for (int32_t m = 1; m <= MAXM; m++)
        for (int acc = 0; acc < 2; acc++) {
            fill(y0, (size_t)m * out, 12);
            fill(y1, (size_t)m * out, 12);
            be->ops->linear(be, hq, x, m, y0, acc);
            be->ops->linear(be, hf, x, m, y1, acc);
            CHECK(!memcmp(y0, y1, sizeof(float) * m * out), "M=%d acc=%d: native and f32 outputs differ", m, acc);
        }
    CHECK_OK(be->ops->linear_read(be, hq, r0));
    CHECK_OK(be->ops->linear_read(be, hf, r1));
    CHECK(!memcmp(r0, r1, sizeof(float) * out * in), "linear_read differs");
    CHECK(!memcmp(r0, w[0], sizeof(float) * 40 * in) && !memcmp(r0 + 40 * in, w[1], sizeof(float) * 24 * in) &&
              !memcmp(r0 + 64 * in, w[2], sizeof(float) * 7 * in),
          "linear_read is not the dequantized parts");
    int32_t ids[4] = {70, 0, 39, 40};
    be->ops->embed(be, hq, ids, 4, 1.0f, y0);
    be->ops->embed(be, hf, ids, 4, 1.0f, y1);
    CHECK(!memcmp(y0, y1, sizeof(float) * 4 * in), "embedding rows differ");
    /* scaled (Gemma's sqrt(hidden)): the rows times the scale, each value rounded once */
    be->ops->embed(be, hq, ids, 4, 11.3137f, y1);
    for (int64_t i = 0; i < (int64_t)4 * in; i++)
        CHECK(y1[i] == y0[i] * 11.3137f, "scaled embedding value %lld", (long long)i);
    rd_wpart bad = {.type = GGML_Q4_K, .rows = 3, .data = raw[0]};
    void *h;
    CHECK(be->ops->linear_load_q(be, &bad, 1, 96, &h) == RD_EINVAL, "Q4_K with K = 96 accepted");
    be->ops->linear_free(be, hq);
    be->ops->linear_free(be, hf);
    for (int i = 0; i < 3; i++)
        free(raw[i]), free(w[i]);
    free(x), free(y0), free(y1), free(r0), free(r1);
    rd_backend_destroy(be);
}

int main(void)
{
    RUN(test_thread_invariance); /* first: needs the serial (unstarted) state */
    RUN(test_pack_roundtrip);
    RUN(test_matches_openblas);
    RUN(test_scalar_chain);
    RUN(test_row_invariance);
    RUN(test_accumulate);
    RUN(test_quant_decode);
    RUN(test_quant_gemm);
    RUN(test_quant_backend_parts);
    TEST_EXIT();
}
