/* quant.h - quantizers from fp32 to ggml block types (the inverse of
 * dequant.c's ggml_dequant_row), used to serve pushed weights in fewer bits
 * (the daemon's serve_dtype). Each is an exact function: its bytes equal
 * ggml's quantize_row_*_ref on the same fp32 input (and, for Q8_0, the
 * `gguf` package's quantizer, gguf.quants). */
#ifndef RD_QUANT_H
#define RD_QUANT_H

#include <stdint.h>

#define GGML_Q8_0_BLOCK 32      /* elements per Q8_0 block */
#define GGML_Q8_0_BYTES 34      /* bytes per block: fp16 d, then 32 int8 q */

/* Quantizes n fp32 values (n a multiple of 32) into n / 32 Q8_0 blocks at
 * out (34 bytes each, little-endian d): per block d = max|x| / 127 (fp32,
 * stored rounded to fp16), q = roundf(x * (1 / d)) (halves away from zero,
 * gguf's np_roundf), q = 0 when d = 0. RD_EINVAL, naming the element, when an
 * input is NaN or infinite, or when a block's d overflows fp16 (max|x| >=
 * 65520 * 127: gguf would write an infinite scale, which no weight can mean);
 * out is then partly written. */
int ggml_quant_q8_0(const float *restrict x, uint64_t n, uint8_t *restrict out);

#define GGML_Q4_K_BLOCK 256     /* elements per Q4_K super-block (QK_K) */
#define GGML_Q4_K_BYTES 144     /* bytes: fp16 d, fp16 dmin, 12 of 6-bit scales/mins, 128 of 4-bit q */

/* Quantizes n fp32 values (n a multiple of 256) into n / 256 Q4_K blocks at
 * out (144 bytes each, little-endian d and dmin), the bytes of ggml's
 * quantize_row_q4_K_ref (ggml_quantize_chunk without an importance matrix)
 * on every input it accepts, on every CPU path. RD_EINVAL, naming the
 * element, when an input is NaN or infinite (checked before anything is
 * written), or naming the block when its d or dmin overflows fp16 (ggml
 * would write an infinite scale: a value below about -4.1e6, or a block
 * spanning more than about 6e7); out is then written up to (and partly
 * in) that block.
 * Thread-safe; about 53 M values/s on one AVX2 core.
 *
 * Unlike Q8_0, quantizing a dequantized Q4_K block does not always give its
 * bytes back: the fit runs again on the rounded values and can land on
 * another scale (ggml's too; 0.05% of blocks of normal weights, most
 * blocks whose sub-blocks differ in size by orders of magnitude). */
int ggml_quant_q4_k(const float *restrict x, uint64_t n, uint8_t *restrict out);

#endif
