/* quant.c - fp32 to Q8_0 (quant.h), bit for bit the `gguf` package's
 * gguf.quants.Q8_0.quantize_blocks, itself "bit-exact" with ggml-quants.c's
 * quantize_row_q8_0_ref:
 *
 *     d  = abs(blocks).max(axis=1) / 127           (float32)
 *     id = where(d == 0, 0, 1 / d)                 (float32)
 *     qs = np_roundf(blocks * id)                  (float32 product)
 *     d.astype(float16), qs.astype(int8)
 *
 * np_roundf(n) = sign(n) * (floor(a) + floor(2 (a - floor(a)))), a = |n|: for
 * a finite n that is C's roundf (halves away from zero; a - floor(a) and its
 * double are exact in float32). Every step below is one correctly rounded
 * fp32 operation in the same order, so the bytes agree on every finite
 * input but two edges, which are decided here and said so:
 *   - a block whose d overflows fp16 (max|x| >= 65520 * 127): gguf writes an
 *     infinite scale (every weight of the block inf or NaN); refused instead;
 *   - a block whose 1 / d overflows fp32 (max|x| < 127 / FLT_MAX, ~3.7e-37):
 *     x * id is inf or NaN and NumPy's cast to int8 is undefined by C (it
 *     gives 0 on x86-64, which the Python test checks); here q = 0. The
 *     block's fp16 d is 0 then anyway, so its values are 0 either way. */
#include "engine/model/quant.h"

#include <math.h>
#include <string.h>

#include "base/err.h"
#include "engine/format/safetensors.h"

int ggml_quant_q8_0(const float *restrict x, uint64_t n, uint8_t *restrict out)
{
    if (n % GGML_Q8_0_BLOCK != 0)
        return rd_fail(RD_EINVAL, "q8_0: %llu values is not a multiple of the block size %d",
                       (unsigned long long)n, GGML_Q8_0_BLOCK);
    for (uint64_t b = 0; b < n / GGML_Q8_0_BLOCK; b++, x += GGML_Q8_0_BLOCK, out += GGML_Q8_0_BYTES) {
        /* Plain loops the compiler vectorizes (a call to roundf per value
         * made a push of the default model's 134M weights take 0.65 s). */
        /* max |x| through the bits: for non-negative floats (NaN aside) the
         * unsigned order of the bits is the order of the values, and NaN
         * and inf are the bit patterns from 0x7f800000 up. */
        uint32_t m = 0;
        for (int j = 0; j < GGML_Q8_0_BLOCK; j++) {
            uint32_t u;
            memcpy(&u, &x[j], 4);
            u &= 0x7fffffffu;
            m = u > m ? u : m;
        }
        if (m >= 0x7f800000u)
            for (int j = 0; j < GGML_Q8_0_BLOCK; j++)
                if (!isfinite(x[j]))
                    return rd_fail(RD_EINVAL, "q8_0: element %llu is %s; expected finite values",
                                   (unsigned long long)(b * GGML_Q8_0_BLOCK + (uint64_t)j),
                                   isnan(x[j]) ? "NaN" : "infinite");
        float amax;
        memcpy(&amax, &m, 4);
        float d = amax / 127.0f;
        uint16_t h = st_f32_to_f16(d);
        if ((h & 0x7c00) == 0x7c00)
            return rd_fail(RD_EINVAL, "q8_0: block %llu (elements %llu..%llu) has max |x| = %g, whose scale "
                           "max|x| / 127 overflows fp16; expected max |x| < 8.3e6", (unsigned long long)b,
                           (unsigned long long)(b * GGML_Q8_0_BLOCK),
                           (unsigned long long)(b * GGML_Q8_0_BLOCK + GGML_Q8_0_BLOCK - 1), (double)amax);
        float id = d != 0.0f ? 1.0f / d : 0.0f;
        out[0] = (uint8_t)(h & 0xff);
        out[1] = (uint8_t)(h >> 8);
        if (!isfinite(id)) {    /* 1 / d overflowed: see the top of the file */
            memset(out + 2, 0, GGML_Q8_0_BLOCK);
            continue;
        }
        for (int j = 0; j < GGML_Q8_0_BLOCK; j++) {
            /* roundf(v) for |v| <= 127 (plus an ulp): truncate, then step
             * away from zero when the dropped fraction, exact in fp32, is a
             * half or more. */
            float v = x[j] * id;
            int32_t q = (int32_t)v;
            float f = v - (float)q;
            q += (f >= 0.5f) - (f <= -0.5f);
            out[2 + j] = (uint8_t)(int8_t)q;
        }
    }
    return 0;
}
