/* test_delta.c - the delta stream decoder (engine/update/delta_codec.h,
 * PROTOCOL.md §10.14) on streams built here by hand (RUNS pairs) and with
 * libzstd's own compressor (XOR_ZSTD, SPARSE_ZSTD: its content written
 * here from the protocol's description), checked against the expected bytes
 * computed directly; every malformed head refused naming the record. */
#include "base/err.h"
#include "client/rd_delta.h"
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
        {4, 0, 0, 2, UPD_DREC_HEAD, 0, "kind"},
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

/* A SPARSE_ZSTD record's content: u32 count, LEB128 gaps, byte planes of the XORs. */
static size_t sparse_raw(uint8_t *r, const uint32_t *idx, const uint16_t *x, uint32_t count)
{
    size_t at = 0;
    memcpy(r, &count, 4);
    at = 4;
    for (uint32_t k = 0, prev = 0; k < count; k++) {
        uint32_t gap = idx[k] - (k ? prev + 1 : 0);
        prev = idx[k];
        do {
            r[at++] = (uint8_t)((gap & 0x7F) | (gap > 0x7F ? 0x80 : 0));
            gap >>= 7;
        } while (gap);
    }
    for (uint32_t k = 0; k < count; k++)
        r[at + k] = (uint8_t)x[k];
    for (uint32_t k = 0; k < count; k++)
        r[at + count + k] = (uint8_t)(x[k] >> 8);
    return at + 2 * (size_t)count;
}

static size_t sparse_record(uint8_t *w, size_t cap, const uint8_t *raw, size_t rn, uint64_t off, uint64_t len)
{
    size_t z = ZSTD_compress(w + UPD_DREC_HEAD, cap - UPD_DREC_HEAD, raw, rn, 1);
    if (ZSTD_isError(z))
        return 0; /* the caller's decode of an empty stream then fails its CHECK */
    put_head(w, UPD_DREC_SPARSE_ZSTD, (uint32_t)z, off, len);
    return UPD_DREC_HEAD + z;
}

static void test_sparse_zstd(void)
{
    static uint16_t base[N], want[N], t[N];
    static uint8_t raw[4 + 7 * N], w[UPD_DREC_HEAD + 8 * N];
    base_and_new(base, want);
    /* gaps of 0 (adjacent), of one and two varint bytes (200, 3000), and the range's last element;
     * one XOR of 0 (listed, not a change) */
    uint32_t idx[] = {0, 1, 2, 203, 3204, 3205, 4095};
    uint16_t x[] = {0x0001, 0x8000, 0x0100, 0x00FF, 0x0000, 0x7F7F, 0x1234};
    const uint32_t count = sizeof idx / sizeof *idx;
    for (uint32_t k = 0; k < count; k++)
        want[idx[k]] ^= x[k];
    size_t rn = sparse_raw(raw, idx, x, count);
    size_t wn = sparse_record(w, sizeof w, raw, rn, 0, sizeof t);
    memcpy(t, base, sizeof t);
    uint64_t changed = 0;
    CHECK_OK(upd_delta_decode(w, wn, (uint8_t *)t, sizeof t, 2, "t", &changed));
    CHECK(!memcmp(t, want, sizeof t), "SPARSE_ZSTD decode differs");
    CHECK(changed == count - 1, "changed %llu; expected %u", (unsigned long long)changed, count - 1);

    /* the check for NaN and infinity sees the values written, and only those */
    upd_drec d = {.kind = UPD_DREC_SPARSE_ZSTD, .payload = (uint32_t)(wn - UPD_DREC_HEAD), .off = 0,
                  .len = sizeof t, .p = w + UPD_DREC_HEAD};
    upd_drec_stat st = {0};
    memcpy(t, base, sizeof t);
    t[3000] = 0x7F80; /* an infinity in the base, which no record writes: not the record's */
    CHECK_OK(upd_delta_apply_rec(&d, 0, (uint8_t *)t, 2, UPD_EXP_BF16, "t", &st));
    CHECK(st.nonfinite == 0, "the base's infinity blamed on the record (%llu)", (unsigned long long)st.nonfinite);
    memcpy(t, base, sizeof t);
    t[3205] = 0x7F80 ^ 0x7F7F; /* element 3205 becomes 0x7F80, +infinity, after the XOR */
    st = (upd_drec_stat){0};
    CHECK_OK(upd_delta_apply_rec(&d, 0, (uint8_t *)t, 2, UPD_EXP_BF16, "t", &st));
    CHECK(st.nonfinite == 3205 + 1, "nonfinite %llu; expected element 3205", (unsigned long long)st.nonfinite);

    /* malformed contents, each refused naming what is wrong */
    const char *bad[] = {
        "changed elements in a range", /* count above the range's elements */
        "gap runs past the range",     /* the last element one past the range */
        "bad or cut varint",           /* a varint that never ends */
        "bytes of gaps",               /* a gap byte left over */
    };
    for (size_t c = 0; c < sizeof bad / sizeof *bad; c++) {
        size_t n = sparse_raw(raw, idx, x, count);
        if (c == 0) {
            uint32_t big = N + 1;
            memcpy(raw, &big, 4);
        } else if (c == 1) {
            uint32_t idx2[sizeof idx / sizeof *idx];
            memcpy(idx2, idx, sizeof idx);
            idx2[count - 1] = N; /* one past the range */
            n = sparse_raw(raw, idx2, x, count);
        } else if (c == 2) {
            for (size_t k = 4; k < n - 2 * count; k++)
                raw[k] = 0x80;
        } else {
            memmove(raw + n - 2 * count + 1, raw + n - 2 * count, 2 * count);
            raw[n - 2 * count] = 0;
            n++;
        }
        wn = sparse_record(w, sizeof w, raw, n, 0, sizeof t);
        memcpy(t, base, sizeof t);
        int rc = upd_delta_decode(w, wn, (uint8_t *)t, sizeof t, 2, "t", NULL);
        CHECK(rc == RD_EFORMAT && strstr(rd_errmsg(), bad[c]), "case %zu: rc %d: %s", c, rc, rd_errmsg());
    }
    /* a frame that does not state its size */
    ZSTD_CCtx *cc = ZSTD_createCCtx();
    ZSTD_CCtx_setParameter(cc, ZSTD_c_contentSizeFlag, 0);
    rn = sparse_raw(raw, idx, x, count);
    ZSTD_inBuffer in = {raw, rn, 0};
    ZSTD_outBuffer out = {w + UPD_DREC_HEAD, sizeof w - UPD_DREC_HEAD, 0};
    CHECK(ZSTD_compressStream2(cc, &out, &in, ZSTD_e_end) == 0, "streaming compress");
    ZSTD_freeCCtx(cc);
    put_head(w, UPD_DREC_SPARSE_ZSTD, (uint32_t)out.pos, 0, sizeof t);
    CHECK(upd_delta_decode(w, UPD_DREC_HEAD + out.pos, (uint8_t *)t, sizeof t, 2, "t", NULL) == RD_EFORMAT &&
          strstr(rd_errmsg(), "no size stated"), "%s", rd_errmsg());
}

/* The C sender's encoder (client/rd_delta.c, rolloutctl push-weights --base) against this decoder:
 * tensors of 2- and 4-byte elements, a few records long, changed at densities from none to all;
 * each stream decodes to the new bytes with the exact changed count, and the record kinds it picks
 * follow the density (runs when very sparse, the sparse frame at a few percent, the XOR frame
 * when most elements changed). */
static void test_c_encoder(void)
{
    static const double dens[] = {0.0, 0.00001, 0.03, 0.5, 1.0};
    int seen[4] = {0};
    uint64_t st = 12345;
    for (uint32_t es = 2; es <= 4; es += 2)
        for (size_t di = 0; di < sizeof dens / sizeof *dens; di++) {
            const uint64_t n = 3 * RDD_RECORD_BYTES + 6 * es; /* three records and a short one */
            uint8_t *base = malloc(n), *cur = malloc(n), *t = malloc(n);
            CHECK(base && cur && t, "oom");
            uint64_t want = 0;
            for (uint64_t i = 0; i < n; i++)
                base[i] = (uint8_t)((st = st * 6364136223846793005ull + 1442695040888963407ull) >> 56);
            memcpy(cur, base, n);
            for (uint64_t e = 0; e < n / es; e++) {
                st = st * 6364136223846793005ull + 1442695040888963407ull;
                if ((double)(st >> 11) / 9007199254740992.0 < dens[di]) {
                    cur[e * es + (st >> 8) % es] ^= (uint8_t)(1u << ((st >> 4) % 8)); /* a bit of one byte */
                    want++;
                }
            }
            uint8_t *w = NULL;
            uint64_t wn = 0, changed = 0, got = 0;
            CHECK_OK(rdd_encode(cur, base, n, es, &w, &wn, &changed));
            memcpy(t, base, n);
            int rc = upd_delta_decode(w, wn, t, n, es, "t", &got);
            CHECK(rc == 0 && !memcmp(t, cur, n), "es %u density %g: the stream does not decode to the new bytes: %s",
                  es, dens[di], rd_errmsg());
            CHECK(changed == want && got == want, "es %u density %g: changed %llu / decoded %llu; expected %llu", es,
                  dens[di], (unsigned long long)changed, (unsigned long long)got, (unsigned long long)want);
            for (uint64_t at = 0; at + UPD_DREC_HEAD <= wn;) {
                uint32_t payload;
                memcpy(&payload, w + at + 4, 4);
                if (w[at] >= 1 && w[at] <= 3)
                    seen[w[at]] = 1;
                at += UPD_DREC_HEAD + payload;
            }
            free(w), free(base), free(cur), free(t);
        }
    CHECK(seen[1] && seen[2] && seen[3], "kinds chosen: runs %d, xor %d, sparse %d", seen[1], seen[2], seen[3]);
}

int main(void)
{
    RUN(test_runs);
    RUN(test_xor_zstd);
    RUN(test_sparse_zstd);
    RUN(test_c_encoder);
    RUN(test_bad_heads);
    TEST_EXIT();
}
