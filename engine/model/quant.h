/* quant.h - quantizers from fp32 to ggml block types (the inverse of
 * dequant.c's ggml_dequant_row), used to serve pushed weights in fewer bits
 * (the daemon's serve_dtype). Each is an exact function: its bytes equal the
 * `gguf` package's quantizer (gguf.quants) and ggml's quantize_row_*_ref on
 * the same fp32 input. */
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

#endif
