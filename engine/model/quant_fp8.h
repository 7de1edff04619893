/* quant_fp8.h - FP8 E4M3 weights in blocks of 32 with a power-of-two scale
 * (RD_TYPE_FP8_B32, engine/format/gguf.h): what serve_dtype fp8 serves.
 *
 * A block is 33 bytes: a scale byte s (E8M0: the block's values are
 * multiplied by 2^(s - 127)), then 32 E4M3 codes (OCP FP8 "E4M3FN": sign,
 * 4 exponent bits with bias 7, 3 mantissa bits; no infinities; 0x7f and 0xff
 * are NaN and never written; largest finite 448). OCP MXFP8's block.
 *
 * Why a power-of-two scale: E4M3 is a float, so its relative precision is
 * the same at every scale; a scale only places the block's range. Scaling by
 * a power of two is exact, so a dequantized weight, code value x 2^e, is
 * exact in fp32 and in bf16 (at most 4 significant bits, exponent within
 * range: see the clamp below), and a GEMM may apply the scale before or after
 * its sum without changing the products. */
#ifndef RD_QUANT_FP8_H
#define RD_QUANT_FP8_H

#include <stdint.h>

#define RD_FP8_BLOCK 32         /* elements per block */
#define RD_FP8_BYTES 33         /* bytes per block: scale byte, then 32 E4M3 codes */
#define RD_FP8_MAX 448.0f       /* largest finite E4M3 */
#define RD_FP8_EMIN (-117)      /* block exponents are clamped to [RD_FP8_EMIN, RD_FP8_EMAX] */
#define RD_FP8_EMAX 7

/* The E4M3 code nearest v (finite), ties to the even code, saturated to
 * +-448 (OCP's saturating conversion); -0 keeps its sign. */
uint8_t rd_fp8_e4m3_from_f32(float v);
/* The value of an E4M3 code (NaN for 0x7f / 0xff). */
float rd_fp8_e4m3_to_f32(uint8_t code);

/* Quantizes n fp32 values (n a multiple of 32) into n / 32 blocks at out.
 * Per block: e = the least integer with max|x| <= 448 x 2^e (so no value
 * saturates), at least RD_FP8_EMIN (0 for an all-zero block); codes =
 * rd_fp8_e4m3_from_f32(x x 2^-e). The lower clamp keeps every nonzero
 * dequantized value a normal bf16 (the smallest, 2^-9 x 2^-117, is 2^-126); a
 * block whose max|x| is below 448 x 2^-117 (1.7e-33) loses its smallest
 * values to zero. The upper bound, e <= 7 (max|x| <= 57344, far above any
 * trained weight), lets a GEMM rebuild a weight with one exact multiply (the
 * code's bits times 2^(120 + e), a normal float). RD_EINVAL, naming the
 * element or the block, for NaN or infinity or a block past 57344; out is then
 * partly written. */
int rd_fp8_quant(const float *x, uint64_t n, uint8_t *out);
/* Values of n_blocks blocks (exact: see the top). */
void rd_fp8_dequant(const uint8_t *src, float *out, uint64_t n_blocks);

#endif
