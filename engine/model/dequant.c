/* dequant.c - dequantization of ggml tensor types to fp32 for the types the
 * engine runs (F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K,
 * and rolloutd's FP8 blocks), and the half / bfloat16 conversions. The types'
 * block layouts and names are the GGUF reader's (engine/format/gguf.c), which
 * sizes every tensor with them: this file calls it, never the other way.
 *
 * Dequantization is exact: a block's scales are f16 (11 significant bits) and
 * every product below has at most 24 significant bits, so it is exact in
 * fp32, and `product + m` / `product - m` rounds once whether or not the
 * compiler fuses it. Bits per product: q4/q5/q8 blocks d (11) * q (<= 8);
 * Q4_K and Q5_K (d * sc) (11 + 6) * q (4 or 5) = 22 at most, minus an exact
 * dmin * m (17); Q6_K d (11) * sc (int8, |sc| <= 128: 7) * q (|q| <= 32: 5)
 * = 23. Our output therefore matches ggml's dequantize_row_* and gguf-py's
 * dequantizer bit for bit, whatever the order of the multiplications. */
#include "engine/format/gguf.h"
#include "base/err.h"
#include "engine/model/quant_fp8.h"

#include <stdint.h>
#include <string.h>

/* ---------------------------------------------------------------------------
 * Scalar conversions. */

static float bits_f32(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

float rd_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1f;
    uint32_t mant = h & 0x3ff;
    if (exp == 0x1f)             /* inf, or nan with its payload kept */
        return bits_f32(sign | 0x7f800000u | mant << 13);
    if (exp != 0)                /* normal: rebias 15 -> 127 */
        return bits_f32(sign | (exp + 112) << 23 | mant << 13);
    if (mant == 0)
        return bits_f32(sign);
    /* Subnormal half (mant * 2^-24) is a normal float: shift the leading 1
     * up to the implicit bit, lowering the exponent as we go. */
    uint32_t e = 113;
    while (!(mant & 0x400)) {
        mant <<= 1;
        e--;
    }
    return bits_f32(sign | e << 23 | (mant & 0x3ff) << 13);
}

float rd_bf16_to_f32(uint16_t b) { return bits_f32((uint32_t)b << 16); }

uint16_t rd_f32_to_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u)   /* nan: keep the top bits, force quiet */
        return (uint16_t)((u >> 16) | 0x40);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1)) >> 16);
}

static uint16_t le16(const uint8_t *p) { return (uint16_t)(p[0] | p[1] << 8); }

/* ---------------------------------------------------------------------------
 * Rows. In the 4-bit blocks the low nibble of byte j is element j and the
 * high nibble element j+16. */

static void dequant_q8_0(const uint8_t *b, float *y, uint64_t nb)
{
    for (uint64_t i = 0; i < nb; i++, b += 34, y += 32) {
        float d = rd_f16_to_f32(le16(b));
        for (int j = 0; j < 32; j++)
            y[j] = (float)(int8_t)b[2 + j] * d;
    }
}

static void dequant_q4_0(const uint8_t *b, float *y, uint64_t nb)
{
    for (uint64_t i = 0; i < nb; i++, b += 18, y += 32) {
        float d = rd_f16_to_f32(le16(b));
        const uint8_t *qs = b + 2;
        for (int j = 0; j < 16; j++) {
            y[j] = (float)((qs[j] & 0xf) - 8) * d;
            y[j + 16] = (float)((qs[j] >> 4) - 8) * d;
        }
    }
}

static void dequant_q4_1(const uint8_t *b, float *y, uint64_t nb)
{
    for (uint64_t i = 0; i < nb; i++, b += 20, y += 32) {
        float d = rd_f16_to_f32(le16(b));
        float m = rd_f16_to_f32(le16(b + 2));
        const uint8_t *qs = b + 4;
        for (int j = 0; j < 16; j++) {
            y[j] = (float)(qs[j] & 0xf) * d + m;
            y[j + 16] = (float)(qs[j] >> 4) * d + m;
        }
    }
}

static uint32_t le32(const uint8_t *p) { return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24; }

/* Q5_0 and Q5_1: the 4-bit layout plus a u32 of fifth bits, bit j for
 * element j. Q5_0 is {d, qh[4], qs[16]} (22 bytes), q - 16 times d; Q5_1 is
 * {d, m, qh[4], qs[16]} (24 bytes), q times d plus m. */
static void dequant_q5_0(const uint8_t *b, float *y, uint64_t nb)
{
    for (uint64_t i = 0; i < nb; i++, b += 22, y += 32) {
        float d = rd_f16_to_f32(le16(b));
        uint32_t qh = le32(b + 2);
        const uint8_t *qs = b + 6;
        for (int j = 0; j < 16; j++) {
            int q0 = (qs[j] & 0xf) | (int)((qh >> j) & 1) << 4;
            int q1 = (qs[j] >> 4) | (int)((qh >> (j + 16)) & 1) << 4;
            y[j] = (float)(q0 - 16) * d;
            y[j + 16] = (float)(q1 - 16) * d;
        }
    }
}

static void dequant_q5_1(const uint8_t *b, float *y, uint64_t nb)
{
    for (uint64_t i = 0; i < nb; i++, b += 24, y += 32) {
        float d = rd_f16_to_f32(le16(b));
        float m = rd_f16_to_f32(le16(b + 2));
        uint32_t qh = le32(b + 4);
        const uint8_t *qs = b + 8;
        for (int j = 0; j < 16; j++) {
            int q0 = (qs[j] & 0xf) | (int)((qh >> j) & 1) << 4;
            int q1 = (qs[j] >> 4) | (int)((qh >> (j + 16)) & 1) << 4;
            y[j] = (float)q0 * d + m;
            y[j + 16] = (float)q1 * d + m;
        }
    }
}

/* K-quant super-blocks of 256. Q4_K and Q5_K have eight sub-blocks of 32,
 * each with a 6-bit scale and a 6-bit min packed in 12 bytes (ggml's
 * get_scale_min_k4): sub-blocks 0-3 in the low 6 bits of bytes j and j+4;
 * 4-7 in the nibbles of byte j+4 with their top 2 bits in the high bits of
 * bytes j-4 (scale) and j (min). */
static void scale_min_k4(int j, const uint8_t *q, int *sc, int *m)
{
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (q[j + 4] & 0xf) | (q[j - 4] >> 6) << 4;
        *m = (q[j + 4] >> 4) | (q[j] >> 6) << 4;
    }
}

/* Q4_K: {d, dmin, scales[12], qs[128]} (144 bytes). Each 64 elements share
 * 32 bytes of qs: the low nibbles are sub-block 2c, the high ones 2c+1;
 * y = d*sc * q - dmin*m. */
static void dequant_q4_k(const uint8_t *b, float *y, uint64_t nb)
{
    for (uint64_t i = 0; i < nb; i++, b += 144) {
        float d = rd_f16_to_f32(le16(b));
        float dmin = rd_f16_to_f32(le16(b + 2));
        const uint8_t *scales = b + 4, *qs = b + 16;
        for (int c = 0; c < 4; c++, qs += 32, y += 64) {
            int sc0, m0, sc1, m1;
            scale_min_k4(2 * c, scales, &sc0, &m0);
            scale_min_k4(2 * c + 1, scales, &sc1, &m1);
            float d0 = d * (float)sc0, mn0 = dmin * (float)m0;
            float d1 = d * (float)sc1, mn1 = dmin * (float)m1;
            for (int l = 0; l < 32; l++) {
                y[l] = d0 * (float)(qs[l] & 0xf) - mn0;
                y[l + 32] = d1 * (float)(qs[l] >> 4) - mn1;
            }
        }
    }
}

/* Q5_K: {d, dmin, scales[12], qh[32], qs[128]} (176 bytes): Q4_K plus a
 * fifth bit, for chunk c in bit 2c (low nibble) and 2c+1 (high) of qh[l]. */
static void dequant_q5_k(const uint8_t *b, float *y, uint64_t nb)
{
    for (uint64_t i = 0; i < nb; i++, b += 176) {
        float d = rd_f16_to_f32(le16(b));
        float dmin = rd_f16_to_f32(le16(b + 2));
        const uint8_t *scales = b + 4, *qh = b + 16, *qs = b + 48;
        for (int c = 0; c < 4; c++, qs += 32, y += 64) {
            int sc0, m0, sc1, m1;
            scale_min_k4(2 * c, scales, &sc0, &m0);
            scale_min_k4(2 * c + 1, scales, &sc1, &m1);
            float d0 = d * (float)sc0, mn0 = dmin * (float)m0;
            float d1 = d * (float)sc1, mn1 = dmin * (float)m1;
            for (int l = 0; l < 32; l++) {
                int q0 = (qs[l] & 0xf) | ((qh[l] >> (2 * c)) & 1) << 4;
                int q1 = (qs[l] >> 4) | ((qh[l] >> (2 * c + 1)) & 1) << 4;
                y[l] = d0 * (float)q0 - mn0;
                y[l + 32] = d1 * (float)q1 - mn1;
            }
        }
    }
}

/* Q6_K: {ql[128], qh[64], scales[16] int8, d} (210 bytes), sixteen
 * sub-blocks of 16 with a signed 8-bit scale. Per half of 128: ql[l] holds
 * elements l (low nibble) and l+64 (high), ql[l+32] elements l+32 and l+96,
 * and qh[l] their top two bits in bit pairs 0, 2, 4, 6 for l, l+32, l+64,
 * l+96; y = d * sc * (q - 32). */
static void dequant_q6_k(const uint8_t *b, float *y, uint64_t nb)
{
    for (uint64_t i = 0; i < nb; i++, b += 210) {
        float d = rd_f16_to_f32(le16(b + 208));
        const uint8_t *ql = b, *qh = b + 128;
        const int8_t *sc = (const int8_t *)(b + 192);
        for (int h = 0; h < 2; h++, ql += 64, qh += 32, sc += 8, y += 128) {
            for (int l = 0; l < 32; l++) {
                int is = l / 16;
                int q1 = ((ql[l] & 0xf) | ((qh[l] >> 0) & 3) << 4) - 32;
                int q2 = ((ql[l + 32] & 0xf) | ((qh[l] >> 2) & 3) << 4) - 32;
                int q3 = ((ql[l] >> 4) | ((qh[l] >> 4) & 3) << 4) - 32;
                int q4 = ((ql[l + 32] >> 4) | ((qh[l] >> 6) & 3) << 4) - 32;
                y[l] = d * (float)sc[is] * (float)q1;
                y[l + 32] = d * (float)sc[is + 2] * (float)q2;
                y[l + 64] = d * (float)sc[is + 4] * (float)q3;
                y[l + 96] = d * (float)sc[is + 6] * (float)q4;
            }
        }
    }
}

int ggml_dequant_row(ggml_type t, const uint8_t *src, float *out, uint64_t n)
{
    uint32_t blck, bytes;
    if (!ggml_type_runs(t, &blck, &bytes))
        return rd_fail(RD_ENOTSUP, "dequant: tensor type %s (%d) is not supported "
                       "(supported: f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, q4_K, q5_K, q6_K)", ggml_type_name(t), (int)t);
    if (n % blck != 0)
        return rd_fail(RD_EINVAL, "dequant: %llu elements is not a multiple of the %s block size %u",
                       (unsigned long long)n, ggml_type_name(t), blck);
    switch (t) {
    case GGML_F32:
        memcpy(out, src, n * 4);   /* src may be unaligned */
        break;
    case GGML_F16:
        for (uint64_t i = 0; i < n; i++)
            out[i] = rd_f16_to_f32(le16(src + 2 * i));
        break;
    case GGML_BF16:
        for (uint64_t i = 0; i < n; i++)
            out[i] = rd_bf16_to_f32(le16(src + 2 * i));
        break;
    case GGML_Q8_0: dequant_q8_0(src, out, n / 32); break;
    case GGML_Q4_0: dequant_q4_0(src, out, n / 32); break;
    case GGML_Q4_1: dequant_q4_1(src, out, n / 32); break;
    case GGML_Q5_0: dequant_q5_0(src, out, n / 32); break;
    case GGML_Q5_1: dequant_q5_1(src, out, n / 32); break;
    case GGML_Q4_K: dequant_q4_k(src, out, n / 256); break;
    case GGML_Q5_K: dequant_q5_k(src, out, n / 256); break;
    case GGML_Q6_K: dequant_q6_k(src, out, n / 256); break;
    case RD_TYPE_FP8_B32: rd_fp8_dequant(src, out, n / 32); break;
    }
    return 0;
}

/* The blocks of a tensor run on from row to row, so the whole tensor is one
 * long row. */
int gguf_dequant(const gguf_tensor *t, float *out)
{
    size_t bytes = ggml_row_bytes(t->type, t->n_elems);
    if (bytes == 0 && t->n_elems != 0)
        return ggml_dequant_row(t->type, t->data, out, t->n_elems);   /* records why */
    if (bytes != t->nbytes)
        return rd_fail(RD_EINVAL, "dequant: tensor '%.*s' holds %llu bytes, expected %zu for %llu %s elements",
                       (int)(t->name.len < 64 ? t->name.len : 64), t->name.ptr,
                       (unsigned long long)t->nbytes, bytes, (unsigned long long)t->n_elems,
                       ggml_type_name(t->type));
    return ggml_dequant_row(t->type, t->data, out, t->n_elems);
}
