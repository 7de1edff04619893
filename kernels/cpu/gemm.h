/* gemm.h - batch-invariant fp32 GEMM for linear layers: y = x . W^T.
 *
 * Why not OpenBLAS sgemm: its result for one row changes with the number of
 * rows M (measured with 0.3.21: row 0 of a 576x1536 product differs between
 * M=1 and M=13, and between M=16 and M=32), which breaks the contract that a
 * sequence's log-probs do not depend on the batch. Here every output element
 * is one FMA chain over k = 0..in-1 in order, whatever M, tiling or thread
 * count, so results are bit-identical for any batch. OpenBLAS stays the
 * reference the tests and the benchmark compare against. */
#ifndef RD_GEMM_H
#define RD_GEMM_H

#include <stdint.h>

#define GEMM_PANEL 16           /* output columns per packed panel */

typedef struct {
    int32_t out;                /* rows of W (output features) */
    int32_t in;                 /* columns of W (input features) */
    int32_t n_panels;           /* ceil(out / GEMM_PANEL) */
    float *packed;              /* [n_panels][in][GEMM_PANEL]; columns past out are 0 */
} gemm_weight;

/* Packs W[out][in] (row-major). */
int gemm_pack(const float *w, int32_t out, int32_t in, gemm_weight *g);
void gemm_release(gemm_weight *g);
/* Unpacks back to W[out][in]. */
void gemm_unpack(const gemm_weight *g, float *w);
/* Row r of W (in floats) into dst. */
void gemm_row(const gemm_weight *g, int32_t r, float *dst);

/* y[m][out] = x[m][in] . W^T (+ y when accumulate). Uses OpenMP threads over
 * panels. */
void gemm_forward(const gemm_weight *g, const float *x, int32_t m, float *y, int accumulate);

/* One thread's share of gemm_forward: rows [r, r1) of x (rows of in floats)
 * over panels [p0, p0 + np), np <= 4, into y (rows of out floats). The
 * quantized GEMM (gemm_quant.c) runs it over panels it has just decoded. */
void gemm_rows(const gemm_weight *g, const float *x, float *y, int32_t r, int32_t r1, int32_t p0, int32_t np,
               int accumulate);

#endif
