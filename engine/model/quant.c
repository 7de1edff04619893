/* quant.c - fp32 to Q8_0 and Q4_K (quant.h). Q4_K: see its section below.
 *
 * Q8_0, bit for bit the `gguf` package's
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

#include "base/cpu_isa.h"
#include "base/err.h"
#include "engine/format/gguf.h"
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

/* ---------------------------------------------------------------------------
 * Q4_K (quant.h): a port of ggml's quantize_row_q4_K_ref. Per super-block
 * of 256 values, eight sub-blocks of 32:
 *
 *   1. each sub-block fits a scale and a min by make_qkx2_quants(32, 15, x,
 *      w, L, &min, Laux, -1, 0.1, 20, false), weights w = av_x + |x| with
 *      av_x = sqrt(sum x^2 / 32): min clamped to <= 0; L = nearest((x - min)
 *      * 15 / (max - min)) clamped to 0..15; then 21 trial scales (14 + 0.1 is)
 *      / (max - min), each refitted by weighted least squares (scale, min)
 *      from the L it gives (or min 0 and scale sum w l x / sum w l^2 where
 *      the fit's min is above 0) and kept where its weighted squared error
 *      is below the best so far; a flat sub-block (max == min) gets scale 0,
 *      min -min, L 0;
 *   2. d = max scale / 63, dmin = max min / 63 (fp32, stored as fp16); each
 *      sub-block's 6-bit scale and min are nearest(63 / max * value), packed
 *      as ggml's get_scale_min_k4 reads them;
 *   3. L = nearest((x + dmin_fp16 * m) / (d_fp16 * sc)) clamped to 0..15,
 *      except in a sub-block whose d_fp16 * sc is 0, which keeps the fit's L
 *      (ggml's `if (!d) continue`); 4-bit L packed in pairs of sub-blocks.
 *
 * nearest is ggml's nearest_int (add 1.5 * 2^23, read the mantissa bits):
 * ties to even, and for values out of its range the same bits ggml gets.
 * Every step is one correctly rounded fp32 operation in ggml's order and
 * grouping (w * l * l is (w * l) * l; diff = s * l + min - x; error +=
 * w * diff^2), without fused multiply-adds: our build is -std=c11, which
 * does not contract, and the libggml-base.so we test against does not
 * either (llama-cpp-python's: ggml's GGML_FMA / -march flags reach only
 * ggml-cpu, and its quantize_row_q4_K_ref is baseline SSE code with no
 * FMA). It matters: the same C compiled with contraction (gnu11, -march=
 * native) differs from ggml's bytes on 5.6% of blocks of normal weights
 * (a sum's last bit picks another trial); tests/py/test_quant_q4k.py
 * would name the first such block.
 *
 * Edge cases, decided: NaN or infinite inputs are refused naming the
 * element (ggml would write garbage scales); a block whose d or dmin
 * overflows fp16 (a min below about -4.1e6, or a span over about 6e7) is
 * refused naming the block (ggml writes an infinite scale, which no weight
 * can mean). Everything else, zero and constant blocks, fp16-subnormal and
 * fp16-zero scales, 63 / max overflowing fp32 (max < 1.9e-37), is ggml's
 * result bit for bit.
 *
 * Speed: the eight sub-blocks are fitted in the lanes of a vector (GCC
 * vector extensions, see quant_priv.h): 8 lanes on the AVX2 path, 4 (two
 * passes) on baseline SSE2. Each lane does its sub-block's operations in
 * ggml's order; where ggml branches (a better trial, a min above 0, a flat
 * sub-block, a zero d) the lanes compute both sides and keep ggml's, so
 * the path changes the speed, never the bytes. One thread: about 53 M
 * values/s on AVX2, 32 M on SSE2, ggml's scalar code 12 M (a Xeon with
 * AVX-512; normal weights); subnormal inputs (|x| < ~1e-19, whose squares
 * are subnormal) are several times slower, in ggml too. */

/* ggml's nearest_int for one value (quant_priv.h has the vector form). */
static inline int32_t q4k_nearest(float f)
{
    float v = f + 12582912.0f;
    int32_t i;
    memcpy(&i, &v, 4);
    return (i & 0x007fffff) - 0x00400000;
}

/* Step 2 for the eight fits (scale[j], min[j]; min is ggml's the_min, the
 * negated min): writes out's d, dmin and scales and each sub-block's
 * d_fp16 * sc and dmin_fp16 * m. 1 (nothing written but the scales), with
 * *big and *is_min saying which, when d or dmin overflows fp16. */
static int q4k_scales(const float *scale, const float *min, uint8_t *out, float *d, float *dm, float *big,
                      int *is_min)
{
    float max_scale = 0, max_min = 0;
    for (int j = 0; j < 8; j++) {
        if (scale[j] > max_scale)
            max_scale = scale[j];
        if (min[j] > max_min)
            max_min = min[j];
    }
    float inv_scale = max_scale > 0 ? 63.0f / max_scale : 0.0f;
    float inv_min = max_min > 0 ? 63.0f / max_min : 0.0f;
    uint8_t *sc = out + 4;
    memset(sc, 0, 12);
    for (int j = 0; j < 8; j++) {
        /* ggml: uint8_t ls = nearest_int(..): the int's low byte, then at most 63 */
        uint8_t ls = (uint8_t)q4k_nearest(inv_scale * scale[j]), lm = (uint8_t)q4k_nearest(inv_min * min[j]);
        ls = ls < 63 ? ls : 63;
        lm = lm < 63 ? lm : 63;
        if (j < 4) {
            sc[j] = ls;
            sc[j + 4] = lm;
        } else {
            sc[j + 4] = (uint8_t)((ls & 0xf) | (lm & 0xf) << 4);
            sc[j - 4] |= (uint8_t)((ls >> 4) << 6);
            sc[j] |= (uint8_t)((lm >> 4) << 6);
        }
    }
    uint16_t hd = st_f32_to_f16(max_scale / 63.0f), hm = st_f32_to_f16(max_min / 63.0f);
    if ((hd & 0x7c00) == 0x7c00 || (hm & 0x7c00) == 0x7c00) {
        *is_min = (hd & 0x7c00) != 0x7c00;
        *big = *is_min ? max_min / 63.0f : max_scale / 63.0f;
        return 1;
    }
    out[0] = (uint8_t)(hd & 0xff);
    out[1] = (uint8_t)(hd >> 8);
    out[2] = (uint8_t)(hm & 0xff);
    out[3] = (uint8_t)(hm >> 8);
    float fd = rd_f16_to_f32(hd), fdm = rd_f16_to_f32(hm);
    for (int j = 0; j < 8; j++) {    /* get_scale_min_k4 */
        int s = j < 4 ? sc[j] & 63 : (sc[j + 4] & 0xf) | (sc[j - 4] >> 6) << 4;
        int m = j < 4 ? sc[j + 4] & 63 : (sc[j + 4] >> 4) | (sc[j] >> 6) << 4;
        d[j] = fd * (float)s;
        dm[j] = fdm * (float)m;
    }
    return 0;
}

/* The lane loop, twice: 4 lanes for baseline x86-64, 8 under AVX2. */
#define Q4K_W 4
#define Q4K_ROWS q4k_rows_sse2
#define Q4K_ATTR
#include "engine/model/quant_priv.h"
#define Q4K_W 8
#define Q4K_ROWS q4k_rows_avx2
#define Q4K_ATTR __attribute__((target("avx2")))
#include "engine/model/quant_priv.h"

int ggml_quant_q4_k(const float *restrict x, uint64_t n, uint8_t *restrict out)
{
    if (n % GGML_Q4_K_BLOCK != 0)
        return rd_fail(RD_EINVAL, "q4_k: %llu values is not a multiple of the block size %d",
                       (unsigned long long)n, GGML_Q4_K_BLOCK);
    /* Non-finite inputs first, a word at a time (as ggml_quant_q8_0). */
    for (uint64_t i0 = 0; i0 < n; i0 += GGML_Q4_K_BLOCK) {
        uint32_t m = 0;
        for (int j = 0; j < GGML_Q4_K_BLOCK; j++) {
            uint32_t u;
            memcpy(&u, &x[i0 + (uint64_t)j], 4);
            u &= 0x7fffffffu;
            m = u > m ? u : m;
        }
        if (m >= 0x7f800000u)
            for (uint64_t i = i0; i < i0 + GGML_Q4_K_BLOCK; i++)
                if (!isfinite(x[i]))
                    return rd_fail(RD_EINVAL, "q4_k: element %llu is %s; expected finite values",
                                   (unsigned long long)i, isnan(x[i]) ? "NaN" : "infinite");
    }
    uint64_t bad = 0;
    float big = 0;
    int is_min = 0;
    uint64_t nb = n / GGML_Q4_K_BLOCK;
    int rc = cpu_isa_active() >= CPU_ISA_AVX2 ? q4k_rows_avx2(x, nb, out, &bad, &big, &is_min)
                                              : q4k_rows_sse2(x, nb, out, &bad, &big, &is_min);
    if (rc)
        return rd_fail(RD_EINVAL, "q4_k: block %llu (elements %llu..%llu) has %s %g, which overflows fp16; "
                       "expected values of at least -4e6 (and spans below 6e7)", (unsigned long long)bad,
                       (unsigned long long)(bad * GGML_Q4_K_BLOCK),
                       (unsigned long long)(bad * GGML_Q4_K_BLOCK + GGML_Q4_K_BLOCK - 1),
                       is_min ? "a min scale dmin of" : "a scale d of", (double)big);
    return 0;
}
