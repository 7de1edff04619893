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
 *
 * Threads: the CPU backend runs the GEMM on its worker pool
 * (kernels/cpu/pool.h, sized by the first pool_init) or, without one, on
 * OpenMP. The thread case runs first, while the pool is still unstarted
 * (serial), then starts 2 threads for everything after it. */
#include <cblas.h>
#include <float.h>
#include <omp.h>
#include <stdint.h>

#include "engine/err.h"
#include "kernels/cpu/gemm.h"
#include "tests/unit/test.h"

#if defined(__has_include)
#if __has_include("kernels/cpu/pool.h")
#include "kernels/cpu/pool.h"
#define HAVE_POOL 1
#endif
#endif

static int threads_now(void)
{
#ifdef HAVE_POOL
    return pool_size();
#else
    return omp_get_max_threads();
#endif
}

static void use_threads(int n)
{
#ifdef HAVE_POOL
    if (n > 1)
        pool_init(n); /* the first call fixes the size; unstarted = serial */
#else
    omp_set_num_threads(n);
#endif
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
    for (int32_t m = 1; m <= MAXM; m++) {
        int boundary = m % 64 <= 1 || m % 64 == 63 || m % 4 == 0 || m < 10 || m == MAXM;
        if (!all_m && !(boundary || m % 7 == 0))
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

int main(void)
{
    RUN(test_thread_invariance); /* first: needs the serial (unstarted) state */
    RUN(test_pack_roundtrip);
    RUN(test_matches_openblas);
    RUN(test_scalar_chain);
    RUN(test_row_invariance);
    RUN(test_accumulate);
    TEST_EXIT();
}
