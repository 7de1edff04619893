/* test_quant.c - the Q8_0 quantizer (engine/model/quant.h): halves round
 * away from zero (x * id exactly k + 0.5), zeros, the fp16 scale's bytes,
 * tiny blocks (fp16 d of 0; 1 / d overflowing fp32), huge ones (d overflowing
 * fp16: refused), NaN and infinities refused naming the element, the round
 * trip through ggml_dequant_row within half a step, and re-quantizing a
 * dequantized block giving the same bytes (what a partial push or a weights
 * sync of Q8_0-served weights relies on).
 *
 * `test_quant --q8_0 IN OUT` quantizes IN (raw little-endian float32) into
 * OUT (Q8_0 blocks), or prints the error and exits 2: tests/py/test_quant.py
 * compares those bytes with the `gguf` package's. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/err.h"
#include "engine/format/gguf.h"
#include "engine/model/quant.h"
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

/* The helper mode for the Python test. */
static int quantize_file(const char *in, const char *out)
{
    FILE *f = fopen(in, "rb");
    if (!f || fseek(f, 0, SEEK_END)) {
        fprintf(stderr, "cannot open %s\n", in);
        return 2;
    }
    long n = ftell(f);
    rewind(f);
    float *x = malloc((size_t)n + 4);
    uint8_t *b = malloc((size_t)n / 128 * 34 + 34);
    if (!x || !b || fread(x, 1, (size_t)n, f) != (size_t)n) {
        fprintf(stderr, "cannot read %s\n", in);
        return 2;
    }
    fclose(f);
    if (ggml_quant_q8_0(x, (uint64_t)n / 4, b)) {
        fprintf(stderr, "error: %s\n", rd_errmsg());
        return 2;
    }
    FILE *o = fopen(out, "wb");
    if (!o || fwrite(b, 34, (size_t)n / 128, o) != (size_t)n / 128 || fclose(o)) {
        fprintf(stderr, "cannot write %s\n", out);
        return 2;
    }
    free(x), free(b);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc == 4 && !strcmp(argv[1], "--q8_0"))
        return quantize_file(argv[2], argv[3]);
    RUN(ties_round_away_from_zero);
    RUN(zeros_and_scale_bytes);
    RUN(tiny_blocks);
    RUN(huge_blocks_refused_unless_the_scale_fits);
    RUN(nonfinite_refused_naming_the_element);
    RUN(round_trip_and_requantize);
    TEST_EXIT();
}
