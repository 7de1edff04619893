/* test_delta.c - the delta stream decoder (engine/update/delta_codec.h,
 * PROTOCOL.md §10.14) on streams built here by hand (RUNS pairs) and with
 * libzstd's own compressor (XOR_ZSTD), checked against the expected bytes
 * computed directly; every malformed head refused naming the record. */
#include "base/err.h"
#include "engine/update/delta_codec.h"
#include "tests/unit/test.h"

#include <zstd.h>

static size_t put_head(uint8_t *p, uint8_t kind, uint32_t payload, uint64_t off, uint64_t len)
{
    memset(p, 0, UPD_DREC_HEAD);
    p[0] = kind;
    memcpy(p + 4, &payload, 4);
    memcpy(p + 8, &off, 8);
    memcpy(p + 16, &len, 8);
    return UPD_DREC_HEAD;
}

static size_t put_run(uint8_t *p, uint32_t skip, uint32_t count, const uint16_t *vals)
{
    memcpy(p, &skip, 4);
    memcpy(p + 4, &count, 4);
    memcpy(p + 8, vals, 2 * (size_t)count);
    return 8 + 2 * (size_t)count;
}

#define N 4096  /* bf16 elements */

static void base_and_new(uint16_t *base, uint16_t *want)
{
    for (int i = 0; i < N; i++)
        base[i] = want[i] = (uint16_t)(i * 2654435761u >> 16);
}

static void test_runs(void)
{
    uint16_t base[N], want[N], t[N];
    base_and_new(base, want);
    uint8_t w[1024];
    /* record 1: elements [0, 1024): runs at 3..4 and 100; record 2: [2048, 4096): a run at 4095 */
    uint16_t v1[2] = {0x1111, 0x2222}, v2[1] = {0x3333}, v3[1] = {0x4444};
    size_t at = UPD_DREC_HEAD, p0 = 0;
    at += put_run(w + at, 3, 2, v1);
    at += put_run(w + at, 100 - 5, 1, v2);
    put_head(w + p0, UPD_DREC_RUNS, (uint32_t)(at - UPD_DREC_HEAD), 0, 2048);
    size_t p1 = at;
    at += UPD_DREC_HEAD;
    at += put_run(w + at, 2047, 1, v3);
    put_head(w + p1, UPD_DREC_RUNS, (uint32_t)(at - p1 - UPD_DREC_HEAD), 4096, 4096);
    want[3] = 0x1111, want[4] = 0x2222, want[100] = 0x3333, want[4095] = 0x4444;
    memcpy(t, base, sizeof t);
    uint64_t changed = 0;
    CHECK_OK(upd_delta_decode(w, at, (uint8_t *)t, sizeof t, 2, "t", &changed));
    CHECK(!memcmp(t, want, sizeof t), "RUNS decode differs");
    CHECK(changed == 4, "changed %llu; expected 4", (unsigned long long)changed);
    /* a run past its record's range */
    memcpy(t, base, sizeof t);
    uint32_t bad = 2048;
    memcpy(w + p1 + UPD_DREC_HEAD, &bad, 4);
    CHECK(upd_delta_decode(w, at, (uint8_t *)t, sizeof t, 2, "t", NULL) == RD_EFORMAT &&
          strstr(rd_errmsg(), "record 1"), "%s", rd_errmsg());
}

static void test_xor_zstd(void)
{
    static uint16_t base[N], want[N], t[N];
    base_and_new(base, want);
    for (int i = 0; i < N; i += 37)
        want[i] ^= (uint16_t)(1u << (i % 16));
    uint8_t x[2 * N];
    for (int i = 0; i < 2 * N; i++)
        x[i] = ((uint8_t *)base)[i] ^ ((uint8_t *)want)[i];
    static uint8_t w[UPD_DREC_HEAD + 2 * N + 1024];
    size_t z = ZSTD_compress(w + UPD_DREC_HEAD, sizeof w - UPD_DREC_HEAD, x, sizeof x, 1);
    CHECK(!ZSTD_isError(z), "zstd: %s", ZSTD_getErrorName(z));
    put_head(w, UPD_DREC_XOR_ZSTD, (uint32_t)z, 0, sizeof x);
    memcpy(t, base, sizeof t);
    uint64_t changed = 0;
    CHECK_OK(upd_delta_decode(w, UPD_DREC_HEAD + z, (uint8_t *)t, sizeof t, 2, "t", &changed));
    CHECK(!memcmp(t, want, sizeof t), "XOR_ZSTD decode differs");
    CHECK(changed == (N + 36) / 37, "changed %llu", (unsigned long long)changed);
    /* the same frame for a longer range: it decompresses to fewer bytes */
    put_head(w, UPD_DREC_XOR_ZSTD, (uint32_t)z, 0, sizeof x - 2);
    CHECK(upd_delta_decode(w, UPD_DREC_HEAD + z, (uint8_t *)t, sizeof t, 2, "t", NULL) == RD_EFORMAT,
          "a frame of another size accepted");
}

static void test_bad_heads(void)
{
    static uint16_t t[N];
    uint8_t w[64];
    struct { uint8_t kind; uint32_t payload; uint64_t off, len; size_t n; int rsv; const char *why; } cases[] = {
        {3, 0, 0, 2, UPD_DREC_HEAD, 0, "kind"},
        {UPD_DREC_RUNS, 0, 0, 2, UPD_DREC_HEAD, 1, "reserved"},
        {UPD_DREC_RUNS, 9, 0, 2, UPD_DREC_HEAD, 0, "payload runs past"},
        {UPD_DREC_RUNS, 0, 0, 0, UPD_DREC_HEAD, 0, "out_bytes"},
        {UPD_DREC_RUNS, 0, 1, 2, UPD_DREC_HEAD, 0, "whole elements"},
        {UPD_DREC_RUNS, 0, 2 * N - 2, 4, UPD_DREC_HEAD, 0, "past the tensor"},
        {UPD_DREC_RUNS, 0, 0, 2, UPD_DREC_HEAD - 1, 0, "record head is"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        put_head(w, cases[i].kind, cases[i].payload, cases[i].off, cases[i].len);
        w[2] = (uint8_t)cases[i].rsv;
        int rc = upd_delta_decode(w, cases[i].n, (uint8_t *)t, sizeof t, 2, "t", NULL);
        CHECK(rc == RD_EFORMAT && strstr(rd_errmsg(), cases[i].why), "case %zu: rc %d: %s", i, rc, rd_errmsg());
    }
    /* out of order: a second record starting before the first one's end */
    put_head(w, UPD_DREC_RUNS, 0, 8, 8);
    put_head(w + UPD_DREC_HEAD, UPD_DREC_RUNS, 0, 4, 2);
    CHECK(upd_delta_decode(w, 2 * UPD_DREC_HEAD, (uint8_t *)t, sizeof t, 2, "t", NULL) == RD_EFORMAT &&
          strstr(rd_errmsg(), "before the previous"), "%s", rd_errmsg());
}

int main(void)
{
    RUN(test_runs);
    RUN(test_xor_zstd);
    RUN(test_bad_heads);
    TEST_EXIT();
}
