/* gemm_quant.h - the batch-invariant GEMM on weights kept in their file
 * dtype (F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K).
 *
 * A weight is never widened to fp32 in memory: it is repacked, at the same
 * size give or take a few percent, into panels of 16 output columns (as
 * gemm.h's fp32 panels) and blocks along K, so that one k of one block
 * decodes to a 16-lane vector. The GEMM decodes a single row's weights
 * straight into registers, 2-8 rows' a chunk of 32 k at a time into an L1
 * buffer, and larger batches' whole panels into a per-thread buffer of fp32
 * panels that gemm.c's tiles then run over: every decoded weight is the
 * float engine/model/dequant.c produces (exact products, one rounding), and every
 * output is acc = fmaf(x[k], w[c][k], acc) for k in order from 0, so results
 * are bit-identical to dequantizing at load and calling gemm_forward, for
 * every dtype, batch size and thread count. */
#ifndef RD_GEMM_QUANT_H
#define RD_GEMM_QUANT_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/cpu/gemm.h"

#define GEMMQ_CHUNK 32          /* k decoded per step; every block size is a multiple */

/* One block of rows of a weight in one dtype, packed. Panel-block layouts
 * (16 lanes = 16 output columns; f16 scales as in the file):
 *   F32  [32 k][16] f32                  F16, BF16 [32 k][16] u16
 *   Q8_0 d[16] f16, q[32 k][16] i8
 *   Q4_0 d[16], q[16 k-pairs][16] u8 (low nibble k = 2i, high 2i + 1)
 *   Q4_1 d[16], m[16], q pairs           Q5_0 d[16], hi[32 k] u16 (bit = lane), q pairs
 *   Q5_1 d, m, hi, q pairs
 *   Q4_K d[16], dmin[16], sc[8][16] u8, mn[8][16] u8, q pairs [128][16]
 *   Q5_K as Q4_K with hi[256 k] u16 before the pairs
 *   Q6_K d[16], sc[16][16] i8, low nibble pairs [128][16], hi[64 k-quads][16] (2 bits each)
 * Lanes past `out` are zero; K of F32/F16/BF16 is padded to the block with 0.
 * Panel-blocks are stored by groups of 4 panels (the GEMM's work item), the
 * group's panels interleaved per block: [group][block][panel][pblk]. */
typedef struct {
    int32_t type;               /* ggml_type (engine/format/gguf.h) */
    int32_t out;                /* rows of W (output features) in this part */
    int32_t in;                 /* columns of W (input features) */
    int32_t n_panels;           /* ceil(out / GEMM_PANEL) */
    int32_t blk;                /* k per block: 32, or 256 for K-quants */
    int32_t n_blocks;           /* ceil(in / blk) */
    size_t pblk;                /* bytes of one panel-block */
    uint8_t *data;              /* [n_panels / 4][n_blocks][4][pblk] (the last group may hold fewer panels) */
} gemm_qpart;

/* A linear layer as parts stacked along out (a fused q|k|v may mix dtypes). */
#define GEMMQ_MAX_PARTS 4
typedef struct {
    int32_t out, in;            /* whole W */
    int32_t n_parts;
    int32_t row0[GEMMQ_MAX_PARTS];  /* first output row of each part */
    int32_t task0[GEMMQ_MAX_PARTS + 1]; /* prefix sums of each part's 4-panel groups */
    gemm_qpart parts[GEMMQ_MAX_PARTS];
} gemm_qlinear;

/* 1 if gemm_qpack takes type t. */
int gemm_qtype_ok(int32_t type);

/* Packs W[out][in] of ggml type `type` from raw row-major GGUF bytes
 * (out * ggml_row_bytes(type, in) bytes). RD_EINVAL when in is not a multiple
 * of the type's block, RD_ENOTSUP for a type it does not take. */
int gemm_qpack(int32_t type, const void *raw, int32_t out, int32_t in, gemm_qpart *q);
void gemm_qrelease(gemm_qpart *q);
size_t gemm_qbytes(const gemm_qpart *q);

/* Decodes lanes 0..15 of panel p for k in [k0, k0 + nk) (k0 a multiple of
 * GEMMQ_CHUNK, nk <= GEMMQ_CHUNK) into dst[nk][16], each weight the float
 * ggml_dequant_row gives. */
void gemm_qdecode(const gemm_qpart *q, int32_t p, int32_t k0, int32_t nk, float *dst);
/* The same, plain C (the reference the AVX-512 decoder is tested against). */
void gemm_qdecode_scalar(const gemm_qpart *q, int32_t p, int32_t k0, int32_t nk, float *dst);
/* Row r of W (in floats) into dst. */
void gemm_qrow(const gemm_qpart *q, int32_t r, float *dst);

/* Rows [r0, r0 + nr) of a part in its dtype, row-major: the bytes gemm_qpack
 * was given (nr x ggml_row_bytes(type, in)), on the pool's threads. The pack
 * keeps every bit of a block, so this is exact for every type. */
int gemm_qraw(const gemm_qpart *q, int32_t r0, int32_t nr, void *dst);

/* y[m][out] = x[m][in] . W^T (+ y when accumulate), on the pool's threads;
 * bit-identical to gemm_forward on the dequantized W. */
void gemm_qforward(const gemm_qlinear *L, const float *x, int32_t m, float *y, int accumulate);
/* Sizes the per-thread decode buffers of the larger batches for rows of
 * `in` (the pool's threads; call it while no GEMM runs, e.g. at load). A
 * GEMM whose in is wider than the buffers falls back to plain C. */
int gemm_qreserve(int32_t in);
/* Row r of the whole W. */
void gemm_qlinear_row(const gemm_qlinear *L, int32_t r, float *dst);
/* Sets row0 and task0 from the parts' shapes. */
void gemm_qlinear_index(gemm_qlinear *L);

#endif
