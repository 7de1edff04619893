/* quant_fp8.c - FP8 E4M3 blocks (quant_fp8.h). */
#include "engine/model/quant_fp8.h"

#include <math.h>
#include <string.h>

#include "base/err.h"

static uint32_t f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static float bits_f32(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

uint8_t rd_fp8_e4m3_from_f32(float v)
{
    const uint32_t u = f32_bits(v);
    const uint8_t sign = (uint8_t)(u >> 24 & 0x80);
    const float a = fabsf(v);
    if (a >= RD_FP8_MAX)
        return sign | 0x7e;
    if (a < 0x1p-6f) {
        /* Subnormal codes step by 2^-9: a x 2^9 (exact) rounded to an
         * integer by adding 2^23 (ties to even in the default rounding
         * mode); 8 is 2^-6, the first normal code, which is code 8. */
        const float q = (a * 0x1p9f + 0x1p23f) - 0x1p23f;
        return sign | (uint8_t)q;
    }
    /* Normal: keep 3 of fp32's 23 mantissa bits, rounding the 20 dropped to
     * nearest even; a carry moves into the exponent, which is right. */
    uint32_t r = f32_bits(a);
    r += 0x7ffffu + (r >> 20 & 1);
    r &= ~0xfffffu;
    const int32_t e = (int32_t)(r >> 23) - 127;  /* -6 .. 8 (a < 448 rounds to at most 448) */
    return sign | (uint8_t)((e + 7) << 3 | (r >> 20 & 7));
}

float rd_fp8_e4m3_to_f32(uint8_t code)
{
    if ((code & 0x7f) == 0x7f)
        return NAN;
    /* The code's exponent and mantissa placed in fp32's fields read as
     * 2^-120 times the value (bias 7 vs 127), subnormals included; the
     * product by 2^120 is exact. */
    return bits_f32((uint32_t)(code & 0x80) << 24 | (uint32_t)(code & 0x7f) << 20) * 0x1p120f;
}

int rd_fp8_quant(const float *restrict x, uint64_t n, uint8_t *restrict out)
{
    if (n % RD_FP8_BLOCK != 0)
        return rd_fail(RD_EINVAL, "fp8: %llu values is not a multiple of the block size %d", (unsigned long long)n,
                       RD_FP8_BLOCK);
    for (uint64_t b = 0; b < n / RD_FP8_BLOCK; b++, x += RD_FP8_BLOCK, out += RD_FP8_BYTES) {
        uint32_t m = 0;         /* max |x| through the bits, as quant.c's Q8_0 */
        for (int j = 0; j < RD_FP8_BLOCK; j++) {
            uint32_t a = f32_bits(x[j]) & 0x7fffffffu;
            m = a > m ? a : m;
        }
        if (m >= 0x7f800000u)
            for (int j = 0; j < RD_FP8_BLOCK; j++)
                if (!isfinite(x[j]))
                    return rd_fail(RD_EINVAL, "fp8: element %llu is %s; expected finite values",
                                   (unsigned long long)(b * RD_FP8_BLOCK + (uint64_t)j),
                                   isnan(x[j]) ? "NaN" : "infinite");
        int e = 0;
        if (m) {
            /* amax = f x 2^ex, f in [0.5, 1): 448 x 2^(ex - 9) = 0.875 x 2^ex
             * covers it when f <= 0.875, else 2^(ex - 8) is the least. */
            int ex;
            const float f = frexpf(bits_f32(m), &ex);
            e = ex - 9 + (f > 0.875f);
            e = e < RD_FP8_EMIN ? RD_FP8_EMIN : e;
            if (e > RD_FP8_EMAX)
                return rd_fail(RD_EINVAL, "fp8: block %llu (elements %llu..%llu) has max |x| = %g; expected at most "
                               "%g (448 x 2^%d)", (unsigned long long)b, (unsigned long long)(b * RD_FP8_BLOCK),
                               (unsigned long long)(b * RD_FP8_BLOCK + RD_FP8_BLOCK - 1), (double)bits_f32(m),
                               (double)(RD_FP8_MAX * (1 << RD_FP8_EMAX)), RD_FP8_EMAX);
        }
        out[0] = (uint8_t)(e + 127);
        const float inv = bits_f32((uint32_t)(127 - e) << 23); /* 2^-e, a normal float for e in the clamp */
        for (int j = 0; j < RD_FP8_BLOCK; j++)
            out[1 + j] = rd_fp8_e4m3_from_f32(x[j] * inv);
    }
    return 0;
}

void rd_fp8_dequant(const uint8_t *restrict src, float *restrict out, uint64_t n_blocks)
{
    for (uint64_t b = 0; b < n_blocks; b++, src += RD_FP8_BYTES, out += RD_FP8_BLOCK) {
        const float s = bits_f32((uint32_t)src[0] << 23); /* 2^(byte - 127); bytes 1..254 written */
        for (int j = 0; j < RD_FP8_BLOCK; j++)
            out[j] = rd_fp8_e4m3_to_f32(src[1 + j]) * s;
    }
}
