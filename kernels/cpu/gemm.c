/* gemm.c - packed, batch-invariant fp32 GEMM (see gemm.h).
 *
 * Layout: W is packed in panels of 16 output columns, each panel [in][16], so
 * the inner loop loads 16 consecutive weights per k and broadcasts one x value
 * per row. Every y[r][c] is acc = fma(x[r][k], w[c][k], acc) for k in order,
 * starting from 0: the tile shape (AVX2: 4 rows x 16 columns or 1 row x 64;
 * AVX-512: up to 8 rows x 32 columns or 3 rows x 64; plain C: one row x 16
 * columns) only decides how many chains run side by side, never the order
 * inside one. Which path runs is decided at run time (base/cpu_isa.h); each
 * vector path is compiled with its own target options, the file itself for
 * baseline x86-64. */
#include "kernels/cpu/gemm.h"

#include <immintrin.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/cpu_isa.h"
#include "base/err.h"
#include "base/pool.h"

#define ROW_CHUNK 64            /* rows of x kept hot in L2 while panels stream */

typedef struct {
    const float *w;
    gemm_weight *g;
} pack_job;

/* One panel: zeroed (the first touch of its pages, on the thread that fills
 * it), then its rows transposed in. */
static void pack_panel(void *ctx, int32_t p, int32_t worker)
{
    const pack_job *j = ctx;
    const gemm_weight *g = j->g;
    const int32_t in = g->in, c1 = (p + 1) * GEMM_PANEL < g->out ? (p + 1) * GEMM_PANEL : g->out;
    float *panel = g->packed + (size_t)p * in * GEMM_PANEL;
    memset(panel, 0, sizeof(float) * (size_t)in * GEMM_PANEL);
    for (int32_t c = p * GEMM_PANEL; c < c1; c++) {
        const int lane = c % GEMM_PANEL;
        const float *src = j->w + (size_t)c * in;
        for (int32_t k = 0; k < in; k++)
            panel[(size_t)k * GEMM_PANEL + lane] = src[k];
    }
}

int gemm_pack(const float *w, int32_t out, int32_t in, gemm_weight *g)
{
    if (out <= 0 || in <= 0)
        return rd_fail(RD_EINVAL, "gemm_pack: shape [%d][%d] must be positive", out, in);
    g->out = out;
    g->in = in;
    g->n_panels = (out + GEMM_PANEL - 1) / GEMM_PANEL;
    size_t n = (size_t)g->n_panels * in * GEMM_PANEL;
    g->packed = aligned_alloc(64, ((n * sizeof(float)) + 63) & ~(size_t)63);
    if (!g->packed)
        return rd_fail(RD_ENOMEM, "gemm_pack: cannot allocate %zu bytes", n * sizeof(float));
    /* On the pool: an f32 weight push repacks the whole model at COMMIT. */
    pack_job j = {w, g};
    pool_run(g->n_panels, pack_panel, &j);
    return 0;
}

void gemm_release(gemm_weight *g)
{
    free(g->packed);
    g->packed = NULL;
}

void gemm_row(const gemm_weight *g, int32_t r, float *dst)
{
    const float *panel = g->packed + (size_t)(r / GEMM_PANEL) * g->in * GEMM_PANEL;
    int lane = r % GEMM_PANEL;
    for (int32_t k = 0; k < g->in; k++)
        dst[k] = panel[(size_t)k * GEMM_PANEL + lane];
}

void gemm_unpack(const gemm_weight *g, float *w)
{
    for (int32_t r = 0; r < g->out; r++)
        gemm_row(g, r, w + (size_t)r * g->in);
}

#pragma GCC push_options
#pragma GCC target("avx512f,avx2,fma,f16c")
/* AVX-512: a tile is R rows x NP panels, one 16-lane register per (row,
 * panel), so R * NP chains run side by side (up to 16 of the 32 registers).
 * Each lane is still one output's FMA chain over k in order from 0, the same
 * chain the AVX2 tiles below compute, so both builds give the same bits. */

/* Stores one panel's 16 results for columns [c0, c0+16) of one row, clipped
 * to out. */
static inline void store_panel(float *yrow, int32_t c0, int32_t out, __m512 a, int accumulate)
{
    int32_t n = out - c0 < 16 ? out - c0 : 16;
    __mmask16 m = (__mmask16)((1u << n) - 1);
    if (accumulate)
        a = _mm512_add_ps(_mm512_maskz_loadu_ps(m, yrow + c0), a);
    _mm512_mask_storeu_ps(yrow + c0, m, a);
}

/* Inlined with constant R and NP so the accumulators live in registers. */
static inline __attribute__((always_inline)) void tile_z(const gemm_weight *g, const float *x, int32_t p0,
                                                         float *y, int accumulate, const int R, const int NP)
{
    const int32_t in = g->in;
    const size_t ps = (size_t)in * GEMM_PANEL;
    const float *w = g->packed + (size_t)p0 * ps;
    __m512 acc[8][4];
#pragma GCC unroll 8
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int j = 0; j < NP; j++)
            acc[r][j] = _mm512_setzero_ps();
    for (int32_t k = 0; k < in; k++) {
        __m512 wv[4];
#pragma GCC unroll 4
        for (int j = 0; j < NP; j++)
            wv[j] = _mm512_load_ps(w + j * ps + (size_t)k * GEMM_PANEL);
#pragma GCC unroll 8
        for (int r = 0; r < R; r++) {
            __m512 v = _mm512_set1_ps(x[(size_t)r * in + k]);
#pragma GCC unroll 4
            for (int j = 0; j < NP; j++)
                acc[r][j] = _mm512_fmadd_ps(v, wv[j], acc[r][j]);
        }
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int j = 0; j < NP; j++)
            store_panel(y + (size_t)r * g->out, (p0 + j) * GEMM_PANEL, g->out, acc[r][j], accumulate);
}

typedef void (*tile_fn)(const gemm_weight *g, const float *x, int32_t p0, float *y, int accumulate);
#define TILE(R, NP) \
    static void tile_##R##x##NP(const gemm_weight *g, const float *x, int32_t p0, float *y, int accumulate) \
    { \
        tile_z(g, x, p0, y, accumulate, R, NP); \
    }
TILE(1, 1) TILE(1, 2) TILE(1, 3) TILE(1, 4)
TILE(2, 1) TILE(2, 2) TILE(2, 3) TILE(2, 4)
TILE(3, 1) TILE(3, 2) TILE(3, 3) TILE(3, 4)
TILE(4, 1) TILE(4, 2) TILE(5, 1) TILE(5, 2) TILE(6, 1) TILE(6, 2)
TILE(7, 1) TILE(7, 2) TILE(8, 1) TILE(8, 2)
#undef TILE
/* [R - 1][NP - 1]; NULL where R * NP would pass 16 chains. */
static const tile_fn tiles[8][4] = {
    {tile_1x1, tile_1x2, tile_1x3, tile_1x4}, {tile_2x1, tile_2x2, tile_2x3, tile_2x4},
    {tile_3x1, tile_3x2, tile_3x3, tile_3x4}, {tile_4x1, tile_4x2, NULL, NULL},
    {tile_5x1, tile_5x2, NULL, NULL},         {tile_6x1, tile_6x2, NULL, NULL},
    {tile_7x1, tile_7x2, NULL, NULL},         {tile_8x1, tile_8x2, NULL, NULL},
};

/* Rows [r, r1) over panels [p0, p0 + np), np <= 4: 8-row tiles over panel
 * pairs, then the rest of the rows; 1-3 rows take all np panels at once so
 * a single decode row still has 4 chains in flight. */
static void rows_avx512(const gemm_weight *g, const float *x, float *y, int32_t r, int32_t r1, int32_t p0,
                        int32_t np, int accumulate)
{
    const int32_t in = g->in, out = g->out;
    while (r < r1) {
        int32_t R = r1 - r < 8 ? r1 - r : 8;
        const float *xr = x + (size_t)r * in;
        float *yr = y + (size_t)r * out;
        if (R <= 3)
            tiles[R - 1][np - 1](g, xr, p0, yr, accumulate);
        else
            for (int32_t p = p0; p < p0 + np; p += 2)
                tiles[R - 1][(p0 + np - p < 2 ? p0 + np - p : 2) - 1](g, xr, p, yr, accumulate);
        r += R;
    }
}
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
/* Stores 16 results for columns [c0, c0+16) of one row, clipped to out. */
static inline void store16(float *yrow, int32_t c0, int32_t out, __m256 a, __m256 b, int accumulate)
{
    float tmp[16];
    _mm256_storeu_ps(tmp, a);
    _mm256_storeu_ps(tmp + 8, b);
    int32_t n = out - c0 < 16 ? out - c0 : 16;
    if (accumulate)
        for (int32_t j = 0; j < n; j++)
            yrow[c0 + j] += tmp[j];
    else
        memcpy(yrow + c0, tmp, (size_t)n * sizeof(float));
}

/* 4 rows x 1 panel: 8 independent chains. */
static void tile_4x16(const gemm_weight *g, const float *x, int32_t p, float *y, int accumulate)
{
    const int32_t in = g->in;
    const float *w = g->packed + (size_t)p * in * GEMM_PANEL;
    const float *x0 = x, *x1 = x + in, *x2 = x + 2 * (size_t)in, *x3 = x + 3 * (size_t)in;
    __m256 a0 = _mm256_setzero_ps(), b0 = _mm256_setzero_ps();
    __m256 a1 = _mm256_setzero_ps(), b1 = _mm256_setzero_ps();
    __m256 a2 = _mm256_setzero_ps(), b2 = _mm256_setzero_ps();
    __m256 a3 = _mm256_setzero_ps(), b3 = _mm256_setzero_ps();
    for (int32_t k = 0; k < in; k++, w += GEMM_PANEL) {
        __m256 wl = _mm256_load_ps(w), wh = _mm256_load_ps(w + 8);
        __m256 v;
        v = _mm256_broadcast_ss(x0 + k); a0 = _mm256_fmadd_ps(v, wl, a0); b0 = _mm256_fmadd_ps(v, wh, b0);
        v = _mm256_broadcast_ss(x1 + k); a1 = _mm256_fmadd_ps(v, wl, a1); b1 = _mm256_fmadd_ps(v, wh, b1);
        v = _mm256_broadcast_ss(x2 + k); a2 = _mm256_fmadd_ps(v, wl, a2); b2 = _mm256_fmadd_ps(v, wh, b2);
        v = _mm256_broadcast_ss(x3 + k); a3 = _mm256_fmadd_ps(v, wl, a3); b3 = _mm256_fmadd_ps(v, wh, b3);
    }
    int32_t c0 = p * GEMM_PANEL, out = g->out;
    store16(y, c0, out, a0, b0, accumulate);
    store16(y + out, c0, out, a1, b1, accumulate);
    store16(y + 2 * (size_t)out, c0, out, a2, b2, accumulate);
    store16(y + 3 * (size_t)out, c0, out, a3, b3, accumulate);
}

/* 1 row x up to 4 panels: enough chains to hide FMA latency when M is 1. */
static void tile_1x64(const gemm_weight *g, const float *x, int32_t p0, int32_t np, float *y,
                      int accumulate)
{
    const int32_t in = g->in;
    const size_t ps = (size_t)in * GEMM_PANEL;
    const float *w = g->packed + (size_t)p0 * ps;
    __m256 acc[8];
    for (int i = 0; i < 8; i++)
        acc[i] = _mm256_setzero_ps();
    if (np == 4) {
        for (int32_t k = 0; k < in; k++) {
            __m256 v = _mm256_broadcast_ss(x + k);
            const float *wk = w + (size_t)k * GEMM_PANEL;
            acc[0] = _mm256_fmadd_ps(v, _mm256_load_ps(wk), acc[0]);
            acc[1] = _mm256_fmadd_ps(v, _mm256_load_ps(wk + 8), acc[1]);
            acc[2] = _mm256_fmadd_ps(v, _mm256_load_ps(wk + ps), acc[2]);
            acc[3] = _mm256_fmadd_ps(v, _mm256_load_ps(wk + ps + 8), acc[3]);
            acc[4] = _mm256_fmadd_ps(v, _mm256_load_ps(wk + 2 * ps), acc[4]);
            acc[5] = _mm256_fmadd_ps(v, _mm256_load_ps(wk + 2 * ps + 8), acc[5]);
            acc[6] = _mm256_fmadd_ps(v, _mm256_load_ps(wk + 3 * ps), acc[6]);
            acc[7] = _mm256_fmadd_ps(v, _mm256_load_ps(wk + 3 * ps + 8), acc[7]);
        }
    } else {
        for (int32_t k = 0; k < in; k++) {
            __m256 v = _mm256_broadcast_ss(x + k);
            const float *wk = w + (size_t)k * GEMM_PANEL;
            for (int32_t j = 0; j < np; j++) {
                acc[2 * j] = _mm256_fmadd_ps(v, _mm256_load_ps(wk + j * ps), acc[2 * j]);
                acc[2 * j + 1] = _mm256_fmadd_ps(v, _mm256_load_ps(wk + j * ps + 8), acc[2 * j + 1]);
            }
        }
    }
    for (int32_t j = 0; j < np; j++)
        store16(y, (p0 + j) * GEMM_PANEL, g->out, acc[2 * j], acc[2 * j + 1], accumulate);
}

/* AVX2: 4-row x 1-panel tiles, then single rows over all np panels. */
static void rows_avx2(const gemm_weight *g, const float *x, float *y, int32_t r, int32_t r1, int32_t p0,
                      int32_t np, int accumulate)
{
    const int32_t in = g->in, out = g->out;
    for (; r + 4 <= r1; r += 4)
        for (int32_t p = p0; p < p0 + np; p++)
            tile_4x16(g, x + (size_t)r * in, p, y + (size_t)r * out, accumulate);
    for (; r < r1; r++)
        tile_1x64(g, x + (size_t)r * in, p0, np, y + (size_t)r * out, accumulate);
}
#pragma GCC pop_options

/* Plain C: one row x one panel at a time, the 16 chains of the panel's
 * columns side by side; fmaf rounds once, as the vector FMA lanes do. */
static void rows_scalar(const gemm_weight *g, const float *x, float *y, int32_t r, int32_t r1, int32_t p0,
                        int32_t np, int accumulate)
{
    const int32_t in = g->in, out = g->out;
    for (; r < r1; r++) {
        const float *xr = x + (size_t)r * in;
        float *yr = y + (size_t)r * out;
        for (int32_t p = p0; p < p0 + np; p++) {
            const float *w = g->packed + (size_t)p * in * GEMM_PANEL;
            float acc[GEMM_PANEL] = {0};
            for (int32_t k = 0; k < in; k++, w += GEMM_PANEL) {
                const float v = xr[k];
                for (int l = 0; l < GEMM_PANEL; l++)
                    acc[l] = fmaf(v, w[l], acc[l]);
            }
            const int32_t c0 = p * GEMM_PANEL, n = out - c0 < GEMM_PANEL ? out - c0 : GEMM_PANEL;
            for (int32_t l = 0; l < n; l++)
                yr[c0 + l] = accumulate ? yr[c0 + l] + acc[l] : acc[l];
        }
    }
}

void gemm_rows(const gemm_weight *g, const float *x, float *y, int32_t r, int32_t r1, int32_t p0, int32_t np,
               int accumulate)
{
    switch (cpu_isa_active()) {
    case CPU_ISA_AVX512: rows_avx512(g, x, y, r, r1, p0, np, accumulate); return;
    case CPU_ISA_AVX2: rows_avx2(g, x, y, r, r1, p0, np, accumulate); return;
    default: rows_scalar(g, x, y, r, r1, p0, np, accumulate); return;
    }
}

typedef struct {
    const gemm_weight *g;
    const float *x;
    float *y;
    int32_t r0, r1;             /* rows of this chunk */
    int accumulate;
} gemm_job;

/* One task: a group of 4 panels over the chunk's rows. */
static void gemm_task(void *ctx, int32_t grp, int32_t worker)
{
    const gemm_job *j = ctx;
    int32_t p0 = grp * 4;
    int32_t np = j->g->n_panels - p0 < 4 ? j->g->n_panels - p0 : 4;
    gemm_rows(j->g, j->x, j->y, j->r0, j->r1, p0, np, j->accumulate);
}

void gemm_forward(const gemm_weight *g, const float *x, int32_t m, float *y, int accumulate)
{
    /* Work items are groups of 4 panels so single rows get 8 chains. */
    const int32_t n_groups = (g->n_panels + 3) / 4;
    for (int32_t r0 = 0; r0 < m; r0 += ROW_CHUNK) {
        gemm_job j = {g, x, y, r0, r0 + ROW_CHUNK < m ? r0 + ROW_CHUNK : m, accumulate};
        pool_run(n_groups, gemm_task, &j);
    }
}
