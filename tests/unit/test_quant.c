/* test_quant.c - the Q8_0 quantizer (engine/model/quant.h): halves round
 * away from zero (x * id exactly k + 0.5), zeros, the fp16 scale's bytes,
 * tiny blocks (fp16 d of 0; 1 / d overflowing fp32), huge ones (d overflowing
 * fp16: refused), NaN and infinities refused naming the element, the round
 * trip through ggml_dequant_row within half a step, and re-quantizing a
 * dequantized block giving the same bytes (what a partial push or a weights
 * sync of Q8_0-served weights relies on).
 *
 * Q4_K: every CPU path (4 and 8 lanes) against a scalar second
 * implementation of the same steps on blocks of every kind, the layout of a
 * block whose bytes are known, round trips through ggml_dequant_row, and
 * NaN, infinities, partial blocks and fp16-overflowing scales refused.
 *
 * `test_quant --q8_0 IN OUT` quantizes IN (raw little-endian float32) into
 * OUT (Q8_0 blocks), or prints the error and exits 2: tests/py/test_quant.py
 * compares those bytes with the `gguf` package's. `--q4_k IN OUT` the same
 * into Q4_K blocks, for tests/py/test_quant_q4k.py (against ggml's). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/cpu_isa.h"
#include "base/err.h"
#include "engine/format/gguf.h"
#include "engine/format/safetensors.h"
#include "engine/model/quant.h"
#include "engine/model/quant_fp8.h"
#include "tests/unit/test.h"

static int8_t qat(const uint8_t *blk, int j) { return (int8_t)blk[2 + j]; }
static uint16_t dbits(const uint8_t *blk) { return (uint16_t)(blk[0] | blk[1] << 8); }

/* max |x| = 127 * 2^e makes d = 2^e and id = 2^-e exactly, so x = (k + 0.5) 2^e
 * is an exact tie: it must round away from zero, never to even. */
static void ties_round_away_from_zero(void)
{
    static const int exps[] = {-20, -14, -8, -2, 0, 4, 10, 15};   /* 2^15 * 127: the largest d below inf */
    for (size_t ei = 0; ei < sizeof exps / sizeof exps[0]; ei++) {
        int e = exps[ei];
        float x[32], s = ldexpf(1.0f, e);
        uint8_t b[34];
        x[0] = 127.0f * s;
        for (int j = 1; j < 32; j++) {
            int k = (j * 37) % 126;                       /* 0..125, even and odd */
            x[j] = (j % 2 ? 1.0f : -1.0f) * ((float)k + 0.5f) * s;
        }
        CHECK_OK(ggml_quant_q8_0(x, 32, b));
        CHECK(rd_f16_to_f32(dbits(b)) == s || e < -14, "e %d: d %g", e, rd_f16_to_f32(dbits(b)));
        CHECK(qat(b, 0) == 127, "q0 %d", qat(b, 0));
        for (int j = 1; j < 32; j++) {
            int k = (j * 37) % 126, want = (j % 2 ? 1 : -1) * (k + 1);
            CHECK(qat(b, j) == want, "e %d: x %g rounds to %d, expected %d (halves away from zero)", e,
                  (double)x[j], qat(b, j), want);
        }
    }
}

static void zeros_and_scale_bytes(void)
{
    float x[64] = {0};
    uint8_t b[68];
    memset(b, 0xab, sizeof b);
    x[32] = -127.0f;                                      /* second block: d = 1.0 = fp16 0x3c00 */
    x[33] = 63.5f;                                        /* a tie: 64 */
    x[34] = -0.0f;
    CHECK_OK(ggml_quant_q8_0(x, 64, b));
    for (int i = 0; i < 34; i++)
        CHECK(b[i] == 0, "all-zero block byte %d is %02x", i, b[i]);
    CHECK(dbits(b + 34) == 0x3c00, "d bits %04x", dbits(b + 34));
    CHECK(qat(b + 34, 0) == -127 && qat(b + 34, 1) == 64 && qat(b + 34, 2) == 0, "q %d %d %d", qat(b + 34, 0),
          qat(b + 34, 1), qat(b + 34, 2));
}

/* Tiny blocks: max|x| = 1e-36 gives an fp32 d of ~7.9e-39 (fp16 0) and a
 * finite 1 / d, so q is computed as usual; 1e-40 makes 1 / d overflow and q
 * is 0. The smallest normal scale and an fp16-subnormal one keep their bits. */
static void tiny_blocks(void)
{
    float x[32] = {0};
    uint8_t b[34];
    x[0] = 1e-36f;
    x[1] = -0.5e-36f;
    CHECK_OK(ggml_quant_q8_0(x, 32, b));
    CHECK(dbits(b) == 0 && qat(b, 0) == 127 && qat(b, 1) == -63, "d %04x q %d %d", dbits(b), qat(b, 0), qat(b, 1));
    x[0] = 1e-40f;
    x[1] = -1e-40f;
    CHECK_OK(ggml_quant_q8_0(x, 32, b));
    for (int i = 0; i < 34; i++)
        CHECK(b[i] == 0, "1e-40 block byte %d is %02x", i, b[i]);
    x[0] = 127.0f * ldexpf(1.0f, -20);                    /* d = 2^-20: fp16 subnormal 0x0010 */
    x[1] = 0;
    CHECK_OK(ggml_quant_q8_0(x, 32, b));
    CHECK(dbits(b) == 0x0010 && qat(b, 0) == 127, "d %04x q %d", dbits(b), qat(b, 0));
}

static void huge_blocks_refused_unless_the_scale_fits(void)
{
    float x[64] = {0};
    uint8_t b[68];
    x[0] = 65504.0f * 127.0f;                             /* d = 65504, fp16's largest */
    CHECK_OK(ggml_quant_q8_0(x, 32, b));
    CHECK(dbits(b) == 0x7bff && qat(b, 0) == 127, "d %04x", dbits(b));
    x[32 + 5] = -8.4e6f;                                  /* d 66142 rounds to fp16 inf */
    int rc = ggml_quant_q8_0(x, 64, b);
    CHECK(rc == RD_EINVAL && strstr(rd_errmsg(), "block 1") && strstr(rd_errmsg(), "overflows fp16"), "rc %d: %s",
          rc, rd_errmsg());
}

static void nonfinite_refused_naming_the_element(void)
{
    const float bad[3] = {NAN, INFINITY, -INFINITY};
    const char *what[3] = {"NaN", "infinite", "infinite"};
    for (int k = 0; k < 3; k++) {
        float x[96];
        uint8_t b[102];
        for (int i = 0; i < 96; i++)
            x[i] = (float)(i % 7) - 3.0f;
        x[70] = bad[k];
        int rc = ggml_quant_q8_0(x, 96, b);
        CHECK(rc == RD_EINVAL && strstr(rd_errmsg(), "element 70 ") && strstr(rd_errmsg(), what[k]), "%d: rc %d: %s",
              k, rc, rd_errmsg());
    }
    float x[33] = {0};
    uint8_t b[68];
    CHECK(ggml_quant_q8_0(x, 33, b) == RD_EINVAL && strstr(rd_errmsg(), "multiple of the block size"), "%s",
          rd_errmsg());
}

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static double unif(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (double)(rng >> 11) / 9007199254740992.0;
}

/* Random blocks at scales 1e-6 .. 1e4: dequantized values within d / 2 plus
 * 127 times the fp16 rounding of d (2^-11 relative, or 2^-25 absolute below
 * fp16's normal range) of x; the block maximum quantizes to +-127; and the
 * dequantized block quantizes back to the same bytes (the same values where
 * d rounded to fp16 0: the q bytes of such a block do not matter). */
static void round_trip_and_requantize(void)
{
    enum { N = 32 * 512 };
    float *x = malloc(sizeof(float) * N), *y = malloc(sizeof(float) * N);
    uint8_t *b = malloc(34 * (N / 32)), *b2 = malloc(34 * (N / 32));
    CHECK(x && y && b && b2, "out of memory");
    for (int i = 0; i < N; i++)
        x[i] = (float)((unif() * 2 - 1) * pow(10.0, (double)((i / 32) % 11) - 6.0));
    CHECK_OK(ggml_quant_q8_0(x, N, b));
    CHECK_OK(ggml_dequant_row(GGML_Q8_0, b, y, N));
    for (int blk = 0; blk < N / 32; blk++) {
        float amax = 0, d = rd_f16_to_f32(dbits(b + 34 * blk));
        int has127 = 0;
        for (int j = 0; j < 32; j++)
            amax = fmaxf(amax, fabsf(x[blk * 32 + j]));
        for (int j = 0; j < 32; j++) {
            int i = blk * 32 + j;
            double d32 = amax / 127.0, tol = d32 / 2 + 127 * fmax(d32 / 2048, ldexp(1.0, -25)) + 1e-30;
            CHECK(fabs((double)y[i] - x[i]) <= tol, "element %d: %g -> %g (d %g)", i, (double)x[i], (double)y[i],
                  (double)d);
            has127 |= abs(qat(b + 34 * blk, j)) == 127;
        }
        CHECK(has127, "block %d: no q of +-127", blk);
    }
    CHECK_OK(ggml_quant_q8_0(y, N, b2));
    int zero_d = 0;
    for (int blk = 0; blk < N / 32; blk++) {
        const uint8_t *p = b + 34 * blk, *p2 = b2 + 34 * blk;
        if (dbits(p) == 0) {
            zero_d++;
            for (int i = 0; i < 34; i++)
                CHECK(p2[i] == 0, "block %d (fp16 d 0) re-quantized to byte %d = %02x", blk, i, p2[i]);
            continue;
        }
        CHECK(memcmp(p, p2, 34) == 0, "re-quantizing dequantized block %d changed its bytes", blk);
    }
    CHECK(zero_d > 0 && zero_d < N / 32 / 2, "%d blocks with fp16 d 0 (the 1e-6 scale should give some)", zero_d);
    free(x), free(y), free(b), free(b2);
}

/* ---------------------------------------------------------------------------
 * Q4_K. oracle_q4_k is a second implementation of quant.c's three steps,
 * scalar and written straight (one sub-block at a time, scales and mins
 * kept as numbers rather than read back from their packed bytes), with the
 * same fp32 operations in the same order: the library's vector paths are
 * held to it in-process (and under ASan); tests/py/test_quant_q4k.py holds
 * the library to ggml itself. */

typedef struct {
    float scale, neg_min;       /* the fit: x ~ scale * q - neg_min */
    uint8_t q[32];
} fit32;

/* ggml's nearest_int: the low mantissa bits of v + 1.5 * 2^23. */
static int32_t nearest_bits(float v)
{
    float t = v + 12582912.0f;
    int32_t i;
    memcpy(&i, &t, 4);
    return (i & 0x7fffff) - 0x400000;
}

static uint8_t clamp15(int32_t l)
{
    return (uint8_t)(l < 0 ? 0 : l > 15 ? 15 : l);
}

static float weighted_error(const float *x, const float *w, const uint8_t *q, float s, float m)
{
    float e = 0;
    for (int i = 0; i < 32; i++) {
        float r = s * (float)q[i] + m - x[i];
        e += w[i] * (r * r);
    }
    return e;
}

/* Step 1 for one sub-block. */
static fit32 oracle_fit(const float *x)
{
    float w[32], ss = 0;
    for (int i = 0; i < 32; i++)
        ss += x[i] * x[i];
    float base = sqrtf(ss / 32);
    for (int i = 0; i < 32; i++)
        w[i] = base + fabsf(x[i]);
    float lo = x[0], hi = x[0], sw = w[0], swx = w[0] * x[0];
    for (int i = 1; i < 32; i++) {
        lo = x[i] < lo ? x[i] : lo;
        hi = x[i] > hi ? x[i] : hi;
        sw += w[i];
        swx += w[i] * x[i];
    }
    lo = lo > 0 ? 0 : lo;
    fit32 f;
    memset(&f, 0, sizeof f);
    if (hi == lo) {
        f.neg_min = -lo;
        return f;
    }
    float m = lo, inv = 15 / (hi - lo);
    f.scale = 1 / inv;
    for (int i = 0; i < 32; i++)
        f.q[i] = clamp15(nearest_bits(inv * (x[i] - m)));
    float best = weighted_error(x, w, f.q, f.scale, m);
    for (int t = 0; t <= 20; t++) {
        uint8_t q[32];
        float inv_t = (-1.0f + 0.1f * (float)t + 15) / (hi - m);
        float swl = 0, swll = 0, swlx = 0;
        for (int i = 0; i < 32; i++) {
            q[i] = clamp15(nearest_bits(inv_t * (x[i] - m)));
            float l = (float)q[i];
            swl += w[i] * l;
            swll += w[i] * l * l;
            swlx += w[i] * l * x[i];
        }
        float det = sw * swll - swl * swl;
        if (!(det > 0))
            continue;
        float s = (sw * swlx - swx * swl) / det, mm = (swll * swx - swl * swlx) / det;
        if (mm > 0) {
            mm = 0;
            s = swlx / swll;
        }
        float e = weighted_error(x, w, q, s, mm);
        if (e < best) {
            best = e;
            f.scale = s;
            m = mm;
            memcpy(f.q, q, 32);
        }
    }
    f.neg_min = -m;
    return f;
}

/* Steps 2 and 3 for one super-block into its 144 bytes (d and dmin finite). */
static void oracle_q4_k(const float *x, uint8_t *blk)
{
    fit32 f[8];
    float smax = 0, mmax = 0;
    for (int j = 0; j < 8; j++) {
        f[j] = oracle_fit(x + 32 * j);
        smax = f[j].scale > smax ? f[j].scale : smax;
        mmax = f[j].neg_min > mmax ? f[j].neg_min : mmax;
    }
    float ks = smax > 0 ? 63.0f / smax : 0.0f, km = mmax > 0 ? 63.0f / mmax : 0.0f;
    uint8_t s6[8], m6[8];
    for (int j = 0; j < 8; j++) {
        uint8_t a = (uint8_t)nearest_bits(ks * f[j].scale), c = (uint8_t)nearest_bits(km * f[j].neg_min);
        s6[j] = a < 63 ? a : 63;
        m6[j] = c < 63 ? c : 63;
    }
    uint16_t hd = st_f32_to_f16(smax / 63.0f), hm = st_f32_to_f16(mmax / 63.0f);
    blk[0] = (uint8_t)hd, blk[1] = (uint8_t)(hd >> 8), blk[2] = (uint8_t)hm, blk[3] = (uint8_t)(hm >> 8);
    for (int k = 0; k < 4; k++) {       /* k < 4 whole in bytes k and 4 + k; k + 4 split */
        blk[4 + k] = (uint8_t)(s6[k] | (s6[k + 4] >> 4) << 6);
        blk[8 + k] = (uint8_t)(m6[k] | (m6[k + 4] >> 4) << 6);
        blk[12 + k] = (uint8_t)((s6[k + 4] & 15) | (m6[k + 4] & 15) << 4);
    }
    for (int j = 0; j < 8; j++) {
        float d = rd_f16_to_f32(hd) * (float)s6[j], dm = rd_f16_to_f32(hm) * (float)m6[j];
        if (d != 0)
            for (int i = 0; i < 32; i++)
                f[j].q[i] = clamp15(nearest_bits((x[32 * j + i] + dm) / d));
    }
    for (int c = 0; c < 4; c++)
        for (int i = 0; i < 32; i++)
            blk[16 + 32 * c + i] = (uint8_t)(f[2 * c].q[i] | f[2 * c + 1].q[i] << 4);
}

static double normal(void)
{
    double u = unif(), v = unif();
    return sqrt(-2 * log(u + 1e-300)) * cos(6.283185307179586 * v);
}

/* NB blocks of every kind the Python test sends ggml, smaller: normal at
 * scales 1e-30..1e6 (subnormal sums, fp16-zero d), one-signed, constant,
 * zero, outliers, sub-blocks of very different sizes, exact ties of
 * nearest_int, tiny maxima (63 / max overflowing fp32), bf16-rounded. */
static void q4k_blocks(float *x, int nb)
{
    for (int b = 0; b < nb; b++) {
        float *y = x + 256 * b;
        int kind = b % 9;
        double s = pow(10.0, unif() * 36 - 30);
        for (int i = 0; i < 256; i++) {
            double v = normal();
            switch (kind) {
            case 0: y[i] = (float)(v * s); break;
            case 1: y[i] = (float)(fabs(v) * s + s / 100); break;
            case 2: y[i] = (float)(-fabs(v) * 0.02 - 1e-4); break;
            case 3: y[i] = (float)((b / 9) % 4 == 0 ? 0.0 : pow(-1.0, b / 9) * s * (1 + i / 32) / 8); break;
            case 4: y[i] = (float)(v * 0.02 * (i == b % 256 ? 1000 : 1)); break;
            case 5: y[i] = (float)(v * pow(10.0, -6.0 * (double)((b * 7 + i / 32) % 8) / 7) + ((i / 32) % 3 - 1) * 0.5); break;
            case 6: y[i] = (i % 32 == 0) ? 0.0f : (i % 32 == 1) ? 15.0f : (float)((int)(unif() * 15) + 0.5); break;
            case 7: y[i] = (float)(v * pow(10.0, -37 - 8 * unif())); break;
            default: {
                float f = (float)(v * 0.02);
                uint32_t u;
                memcpy(&u, &f, 4);
                u = (u + 0x7fff + (u >> 16 & 1)) >> 16 << 16;
                memcpy(&y[i], &u, 4);
            }
            }
        }
        if (kind == 0 || kind == 1) {              /* keep d and dmin finite in fp16 */
            float amax = 0;
            for (int i = 0; i < 256; i++)
                amax = fmaxf(amax, fabsf(y[i]));
            if (amax > 3e6f)
                for (int i = 0; i < 256; i++)
                    y[i] *= 3e6f / amax;
        }
    }
}

static void q4k_every_path_matches_the_scalar_oracle(void)
{
    enum { NB = 2700 };
    float *x = malloc(sizeof(float) * 256 * NB);
    uint8_t *want = malloc(144 * NB), *got = malloc(144 * NB);
    CHECK(x && want && got, "out of memory");
    q4k_blocks(x, NB);
    for (int b = 0; b < NB; b++)
        oracle_q4_k(x + 256 * b, want + 144 * b);
    cpu_isa was = cpu_isa_active();
    for (int isa = CPU_ISA_SCALAR; isa <= (int)cpu_isa_best(); isa++) {
        CHECK_OK(cpu_isa_set((cpu_isa)isa));
        memset(got, 0xab, 144 * NB);
        int rc = ggml_quant_q4_k(x, 256 * NB, got);
        cpu_isa_set(was);
        CHECK(rc == 0, "%s: %s", cpu_isa_name((cpu_isa)isa), rd_errmsg());
        for (int b = 0; b < NB; b++)
            CHECK(memcmp(got + 144 * b, want + 144 * b, 144) == 0, "%s: block %d (kind %d) differs from the oracle",
                  cpu_isa_name((cpu_isa)isa), b, b % 9);
    }
    free(x), free(want), free(got);
}

/* Every sub-block the values 0..15 in some order: the fit is exact (scale
 * 1, min 0), so every byte is known: d = fp16(1 / 63), dmin 0, 6-bit
 * scales 63 (low 6 bits of bytes 0-3, and for sub-blocks 4-7 the low
 * nibbles of bytes 8-11 and the top two bits of bytes 0-3), mins 0, and
 * q the values, sub-block 2c in the low nibbles of qs[32c..], 2c + 1 high. */
static void q4k_layout_of_an_exact_block(void)
{
    float x[256];
    uint8_t b[144];
    for (int i = 0; i < 256; i++)
        x[i] = (float)((i * 7 + i / 32) % 16);
    CHECK_OK(ggml_quant_q4_k(x, 256, b));
    uint16_t d = (uint16_t)(b[0] | b[1] << 8), dmin = (uint16_t)(b[2] | b[3] << 8);
    CHECK(d == st_f32_to_f16(1.0f / 63.0f) && dmin == 0, "d %04x dmin %04x", d, dmin);
    static const uint8_t sc[12] = {0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0, 0x0f, 0x0f, 0x0f, 0x0f};
    CHECK(memcmp(b + 4, sc, 12) == 0, "scales %02x %02x .. %02x", b[4], b[5], b[15]);
    for (int c = 0; c < 4; c++)
        for (int l = 0; l < 32; l++) {
            int lo = (int)x[64 * c + l], hi = (int)x[64 * c + 32 + l];
            CHECK(b[16 + 32 * c + l] == (lo | hi << 4), "qs[%d] = %02x, expected %x|%x", 32 * c + l,
                  b[16 + 32 * c + l], hi, lo);
        }
    float y[256];
    CHECK_OK(ggml_dequant_row(GGML_Q4_K, b, y, 256));
    for (int i = 0; i < 256; i++)
        CHECK(fabsf(y[i] - x[i]) <= x[i] * 0x1p-10f, "element %d: %g -> %g", i, (double)x[i], (double)y[i]);
}

/* Through ggml_dequant_row: a zero block is all zero bytes; a constant
 * block comes back within fp16's rounding (negative: dmin * 63; positive:
 * d * 63 * 15; 2^-11 relative, or 2^-25 absolute per unit where d or dmin
 * is fp16-subnormal); random weights within a twelfth of their block's span
 * (not a bound Q4_K promises: 6-bit scales and a least-squares fit can
 * clip a sub-block's extremes; ggml's own worst here is about 1/16) and an
 * RMS error under 9% of the standard deviation (ggml: 7.1%). */
static void q4k_round_trip(void)
{
    float x[256], y[256];
    uint8_t b[144];
    memset(x, 0, sizeof x);
    memset(b, 0xab, sizeof b);
    CHECK_OK(ggml_quant_q4_k(x, 256, b));
    for (int i = 0; i < 144; i++)
        CHECK(b[i] == 0, "zero block byte %d is %02x", i, b[i]);
    static const float consts[] = {-1.0f, -0.02f, -3.5e6f, 1.0f, 0.02f, 65504.0f * 30, 1e-3f};
    for (size_t k = 0; k < sizeof consts / sizeof consts[0]; k++) {
        for (int i = 0; i < 256; i++)
            x[i] = consts[k];
        CHECK_OK(ggml_quant_q4_k(x, 256, b));
        CHECK_OK(ggml_dequant_row(GGML_Q4_K, b, y, 256));
        for (int i = 0; i < 256; i++)
            CHECK(fabsf(y[i] - x[i]) <= fabsf(x[i]) * 0x1p-10f + 1000 * 0x1p-25f, "constant %g -> %g", (double)x[i],
                  (double)y[i]);
    }
    enum { NB = 400 };
    float *xs = malloc(sizeof(float) * 256 * NB), *ys = malloc(sizeof(float) * 256 * NB);
    uint8_t *q = malloc(144 * NB);
    CHECK(xs && ys && q, "out of memory");
    for (int i = 0; i < 256 * NB; i++)
        xs[i] = (float)(normal() * pow(10.0, (double)(i / 256 % 7) - 2));     /* 0.01 .. 1e4: d a normal fp16 */
    CHECK_OK(ggml_quant_q4_k(xs, 256 * NB, q));
    CHECK_OK(ggml_dequant_row(GGML_Q4_K, q, ys, 256 * NB));
    for (int blk = 0; blk < NB; blk++) {
        const float *xb = xs + 256 * blk, *yb = ys + 256 * blk;
        double lo = 0, hi = 0, se = 0, sx = 0;
        for (int i = 0; i < 256; i++) {
            lo = fmin(lo, xb[i]), hi = fmax(hi, xb[i]);
            se += ((double)yb[i] - xb[i]) * ((double)yb[i] - xb[i]);
            sx += (double)xb[i] * xb[i];
        }
        for (int i = 0; i < 256; i++)
            CHECK(fabs((double)yb[i] - xb[i]) <= (hi - lo) / 12, "block %d element %d: %g -> %g (span %g)", blk, i,
                  (double)xb[i], (double)yb[i], hi - lo);
        CHECK(sqrt(se / sx) < 0.09, "block %d: RMS error %.3f of the RMS value", blk, sqrt(se / sx));
    }
    free(xs), free(ys), free(q);
}

static void q4k_refusals_name_the_element_or_block(void)
{
    static float x[3 * 256];
    uint8_t b[3 * 144];
    const float bad[3] = {NAN, INFINITY, -INFINITY};
    const char *what[3] = {"NaN", "infinite", "infinite"};
    for (int k = 0; k < 3; k++) {
        for (int i = 0; i < 3 * 256; i++)
            x[i] = (float)(i % 7) - 3.0f;
        x[530] = bad[k];
        int rc = ggml_quant_q4_k(x, 3 * 256, b);
        CHECK(rc == RD_EINVAL && strstr(rd_errmsg(), "element 530 ") && strstr(rd_errmsg(), what[k]), "%d: rc %d: %s",
              k, rc, rd_errmsg());
    }
    CHECK(ggml_quant_q4_k(x, 300, b) == RD_EINVAL && strstr(rd_errmsg(), "multiple of the block size 256"), "%s",
          rd_errmsg());
    /* dmin = -min / 63 past fp16 (a min below about -63 * 65520 = -4.13e6); d = scale / 63 past it (a
     * span above about 15 * 63 * 65520 = 6.2e7); +-3e38 overflow both, and d is named. */
    static const float big[4] = {-4.2e6f, -3.0e38f, 6.5e7f, 3.0e38f};
    static const char *const word[4] = {"dmin", "overflows", "scale d", "scale d"};
    for (int k = 0; k < 4; k++) {
        for (int i = 0; i < 3 * 256; i++)
            x[i] = (float)(i % 7) - 3.0f;
        x[256 + 77] = big[k];
        int rc = ggml_quant_q4_k(x, 3 * 256, b);
        CHECK(rc == RD_EINVAL && strstr(rd_errmsg(), "block 1 ") && strstr(rd_errmsg(), "overflows fp16") &&
                  strstr(rd_errmsg(), word[k]), "%g: rc %d: %s", (double)big[k], rc, rd_errmsg());
    }
    x[256 + 77] = -4.0e6f;                          /* dmin 63492: fits */
    CHECK_OK(ggml_quant_q4_k(x, 3 * 256, b));
}

/* The helper modes for the Python tests: IN (raw little-endian float32)
 * quantized by q into OUT, blocks of blk values in bytes bytes each. */
static int quantize_file(const char *in, const char *out, int (*q)(const float *, uint64_t, uint8_t *), size_t blk,
                         size_t bytes)
{
    FILE *f = fopen(in, "rb");
    if (!f || fseek(f, 0, SEEK_END)) {
        fprintf(stderr, "cannot open %s\n", in);
        return 2;
    }
    long n = ftell(f);
    rewind(f);
    size_t nb = (size_t)n / 4 / blk;
    float *x = malloc((size_t)n + 4);
    uint8_t *b = malloc(nb * bytes + bytes);
    if (!x || !b || fread(x, 1, (size_t)n, f) != (size_t)n) {
        fprintf(stderr, "cannot read %s\n", in);
        return 2;
    }
    fclose(f);
    if (q(x, (uint64_t)n / 4, b)) {
        fprintf(stderr, "error: %s\n", rd_errmsg());
        return 2;
    }
    FILE *o = fopen(out, "wb");
    if (!o || fwrite(b, bytes, nb, o) != nb || fclose(o)) {
        fprintf(stderr, "cannot write %s\n", out);
        return 2;
    }
    free(x), free(b);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc == 4 && !strcmp(argv[1], "--q8_0"))
        return quantize_file(argv[2], argv[3], ggml_quant_q8_0, GGML_Q8_0_BLOCK, GGML_Q8_0_BYTES);
    if (argc == 4 && !strcmp(argv[1], "--q4_k"))
        return quantize_file(argv[2], argv[3], ggml_quant_q4_k, GGML_Q4_K_BLOCK, GGML_Q4_K_BYTES);
    if (argc == 4 && !strcmp(argv[1], "--fp8"))
        return quantize_file(argv[2], argv[3], rd_fp8_quant, RD_FP8_BLOCK, RD_FP8_BYTES);
    RUN(ties_round_away_from_zero);
    RUN(zeros_and_scale_bytes);
    RUN(tiny_blocks);
    RUN(huge_blocks_refused_unless_the_scale_fits);
    RUN(nonfinite_refused_naming_the_element);
    RUN(round_trip_and_requantize);
    RUN(q4k_every_path_matches_the_scalar_oracle);
    RUN(q4k_layout_of_an_exact_block);
    RUN(q4k_round_trip);
    RUN(q4k_refusals_name_the_element_or_block);
    TEST_EXIT();
}
