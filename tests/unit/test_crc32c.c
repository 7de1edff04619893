/* test_crc32c.c - CRC-32C (base/crc32c.h): the catalogue's check values, a
 * bit-by-bit reference on random data at random lengths and unaligned
 * offsets, the hardware and table paths agreeing (long buffers included, so
 * the interleaved streams and their merging run), chaining, and combine for
 * random splits and long runs of zeros. Prints the speed of both paths. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/clock.h"
#include "base/crc32c.h"
#include "tests/unit/test.h"

/* One bit at a time, straight from the definition (reflected, init and
 * final xor 0xFFFFFFFF). */
static uint32_t ref_crc(uint32_t crc, const uint8_t *p, size_t n)
{
    uint32_t c = ~crc;
    for (size_t i = 0; i < n; i++) {
        c ^= p[i];
        for (int k = 0; k < 8; k++)
            c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
    }
    return ~c;
}

static uint64_t rng_state = 0x243F6A8885A308D3ull;
static uint64_t rnd(void)
{
    uint64_t x = rng_state;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    rng_state = x;
    return x * 0x2545F4914F6CDD1Dull;
}

static uint8_t *rnd_bytes(size_t n)
{
    uint8_t *b = malloc(n ? n : 1);
    for (size_t i = 0; i < n; i++)
        b[i] = (uint8_t)(rnd() >> 56);
    return b;
}

/* Every path on one buffer; 0 when all agree with the reference. */
static int all_paths(const uint8_t *p, size_t n, uint32_t seed, uint32_t *want_out)
{
    uint32_t want = ref_crc(seed, p, n);
    *want_out = want;
    if (crc32c(seed, p, n) != want || crc32c_sw(seed, p, n) != want)
        return -1;
    if (crc32c_hw_available() && crc32c_hw(seed, p, n) != want)
        return -1;
    return 0;
}

static void check_values(void)
{
    uint8_t zeros[32], ones[32], inc[32], dec[32];
    memset(zeros, 0, sizeof zeros);
    memset(ones, 0xFF, sizeof ones);
    for (int i = 0; i < 32; i++) {
        inc[i] = (uint8_t)i;
        dec[i] = (uint8_t)(31 - i);
    }
    const struct {
        const char *name;
        const void *data;
        size_t n;
        uint32_t crc;
    } v[] = {
        {"\"123456789\"", "123456789", 9, 0xE3069283u},
        {"32 zero bytes", zeros, 32, 0x8A9136AAu},
        {"32 0xff bytes", ones, 32, 0x62A8AB43u},
        {"00 01 .. 1f (RFC 3720 B.4)", inc, 32, 0x46DD794Eu},
        {"1f 1e .. 00 (RFC 3720 B.4)", dec, 32, 0x113FDB5Cu},
        {"empty", "", 0, 0},
        {"\"a\"", "a", 1, 0xC1D04330u},
    };
    for (size_t i = 0; i < sizeof v / sizeof v[0]; i++) {
        CHECK(crc32c(0, v[i].data, v[i].n) == v[i].crc, "%s: 0x%08x, expected 0x%08x", v[i].name,
              crc32c(0, v[i].data, v[i].n), v[i].crc);
        CHECK(crc32c_sw(0, v[i].data, v[i].n) == v[i].crc, "%s: table path 0x%08x", v[i].name,
              crc32c_sw(0, v[i].data, v[i].n));
        CHECK(ref_crc(0, v[i].data, v[i].n) == v[i].crc, "%s: the test's reference is wrong", v[i].name);
        if (crc32c_hw_available())
            CHECK(crc32c_hw(0, v[i].data, v[i].n) == v[i].crc, "%s: hardware path 0x%08x", v[i].name,
                  crc32c_hw(0, v[i].data, v[i].n));
    }
    CHECK(crc32c(0, NULL, 0) == 0 && crc32c(0x12345678u, NULL, 0) == 0x12345678u, "empty input changes the crc");
}

/* Random lengths 0..5000 at offsets 0..15 from an aligned base, from a random
 * starting crc: every path equals the bit-by-bit reference. */
static void matches_reference(void)
{
    enum { MAXLEN = 5000 };
    uint8_t *buf = rnd_bytes(MAXLEN + 16);
    for (int iter = 0; iter < 3000; iter++) {
        size_t off = rnd() % 16;
        size_t n = iter < 200 ? (size_t)iter : (size_t)(rnd() % (MAXLEN + 1));
        uint32_t seed = iter % 3 ? (uint32_t)rnd() : 0, want;
        CHECK(all_paths(buf + off, n, seed, &want) == 0,
              "length %zu offset %zu seed 0x%08x: crc32c 0x%08x sw 0x%08x hw 0x%08x, reference 0x%08x", n, off,
              seed, crc32c(seed, buf + off, n), crc32c_sw(seed, buf + off, n),
              crc32c_hw_available() ? crc32c_hw(seed, buf + off, n) : 0, want);
    }
    free(buf);
}

/* Long buffers go through the interleaved streams (3 x 8192 and 3 x 256
 * bytes) and their merging: lengths around those block sizes and above. */
static void long_buffers(void)
{
    enum { MAXLEN = 200000 };
    uint8_t *buf = rnd_bytes(MAXLEN + 16);
    static const size_t lens[] = {767, 768, 769, 775, 776, 24575, 24576, 24577, 24583, 24584, 25344, 49152,
                                  49152 + 768 + 7, 100000, MAXLEN};
    for (size_t i = 0; i < sizeof lens / sizeof lens[0]; i++)
        for (size_t off = 0; off < 16; off += 5) {
            uint32_t want;
            CHECK(all_paths(buf + off, lens[i], 0xDEADBEEFu, &want) == 0, "length %zu offset %zu", lens[i], off);
        }
    for (int iter = 0; iter < 30; iter++) {
        size_t n = rnd() % MAXLEN, off = rnd() % 16;
        uint32_t want;
        CHECK(all_paths(buf + off, n, 0, &want) == 0, "length %zu offset %zu", n, off);
    }
    free(buf);
}

/* crc32c(crc32c(0, a), b) is the crc of a || b, for any split. */
static void chaining(void)
{
    enum { N = 70000 };
    uint8_t *buf = rnd_bytes(N);
    uint32_t whole = crc32c(0, buf, N);
    CHECK(whole == ref_crc(0, buf, N), "whole buffer");
    for (int iter = 0; iter < 200; iter++) {
        size_t a = rnd() % (N + 1);
        uint32_t c = crc32c(crc32c(0, buf, a), buf + a, N - a);
        CHECK(c == whole, "split at %zu: 0x%08x != 0x%08x", a, c, whole);
        c = crc32c_sw(crc32c_hw_available() ? crc32c_hw(0, buf, a) : crc32c(0, buf, a), buf + a, N - a);
        CHECK(c == whole, "split at %zu, hardware then table: 0x%08x != 0x%08x", a, c, whole);
    }
    /* many small pieces */
    uint32_t c = 0;
    size_t at = 0;
    while (at < N) {
        size_t k = rnd() % 50;
        if (k > N - at)
            k = N - at;
        c = crc32c(c, buf + at, k);
        at += k;
    }
    CHECK(c == whole, "small pieces: 0x%08x != 0x%08x", c, whole);
    free(buf);
}

static void combine(void)
{
    enum { N = 20000 };
    uint8_t *buf = rnd_bytes(N);
    for (int iter = 0; iter < 2000; iter++) {
        size_t a = iter < 20 ? (size_t)iter : rnd() % (N + 1);
        size_t n = a + rnd() % (N - a + 1);
        uint32_t ca = crc32c(0, buf, a), cb = crc32c(0, buf + a, n - a), cab = crc32c(0, buf, n);
        uint32_t got = crc32c_combine(ca, cb, n - a);
        CHECK(got == cab, "A = %zu bytes, B = %zu bytes: combine 0x%08x, crc of A||B 0x%08x", a, n - a, got, cab);
    }
    /* a tensor's crc from its chunks in a random order of ranges */
    uint32_t c = 0;
    for (size_t at = 0; at < N; at += 1000)
        c = crc32c_combine(c, crc32c(0, buf + at, 1000), 1000);
    CHECK(c == crc32c(0, buf, N), "chunked combine");
    CHECK(crc32c_combine(0x12345678u, 0, 0) == 0x12345678u, "empty B");
    CHECK(crc32c_combine(0, 0xE3069283u, 9) == 0xE3069283u, "empty A");
    free(buf);
    /* long runs of zeros: 16 MiB directly against doubling with combine */
    size_t big = (size_t)16 << 20;
    uint8_t *z = calloc(big, 1);
    CHECK(z, "calloc");
    uint32_t direct = crc32c(0, z, big);
    uint32_t dbl = crc32c(0, z, 1);
    for (size_t len = 1; len < big; len *= 2)
        dbl = crc32c_combine(dbl, dbl, len);
    free(z);
    CHECK(dbl == direct, "16 MiB of zeros: doubling 0x%08x, direct 0x%08x", dbl, direct);
    /* lengths past 4 GiB (no data): shifting by len equals shifting by
     * len / 2 and then by the rest (combine with an empty B only shifts) */
    uint64_t len = (uint64_t)5 << 32 | 12345;
    uint32_t one = crc32c_combine(0xCAFEBABEu, 0x01234567u, len);
    uint32_t two = crc32c_combine(crc32c_combine(0xCAFEBABEu, 0, len / 2), 0x01234567u, len - len / 2);
    CHECK(one == two, "long combine: 0x%08x != 0x%08x", one, two);
}

/* GB/s of one path over n bytes, best of 3 runs of reps passes. */
static double gbs(uint32_t (*fn)(uint32_t, const void *, size_t), const uint8_t *buf, size_t n, int reps)
{
    double best = 0;
    volatile uint32_t sink = 0;
    for (int k = 0; k < 3; k++) {
        double t0 = clock_now_s();
        for (int r = 0; r < reps; r++)
            sink ^= fn(sink, buf, n);
        double g = (double)n * reps / (clock_now_s() - t0) / 1e9;
        best = g > best ? g : best;
    }
    return best;
}

/* Informational (not asserted): GB/s of both paths, in cache (256 KiB) and
 * from memory (32 MiB). */
static void speed(void)
{
    size_t n = (size_t)32 << 20, small = (size_t)256 << 10;
    uint8_t *buf = rnd_bytes(n);
    CHECK(buf, "malloc");
    char hw[96] = "n/a";
    if (crc32c_hw_available())
        snprintf(hw, sizeof hw, "%.2f GB/s in cache, %.2f GB/s from memory", gbs(crc32c_hw, buf, small, 128),
                 gbs(crc32c_hw, buf, n, 1));
    printf("# crc32c speed: hardware (SSE4.2, 3 streams) %s; table (slicing-by-8) %.2f GB/s in cache, %.2f GB/s "
           "from memory\n", hw, gbs(crc32c_sw, buf, small, 16), gbs(crc32c_sw, buf, n, 1));
    free(buf);
}

int main(void)
{
    printf("# crc32c: hardware path %s\n", crc32c_hw_available() ? "available (SSE4.2)" : "not available");
    RUN(check_values);
    RUN(matches_reference);
    RUN(long_buffers);
    RUN(chaining);
    RUN(combine);
    RUN(speed);
    TEST_EXIT();
}
