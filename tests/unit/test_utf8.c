/* test_utf8.c - base/utf8 against independent oracles:
 *   - the definition: a byte string is a valid sequence exactly when it is
 *     the canonical encoding of a Unicode scalar value (0..U+10FFFF without
 *     the surrogates). A table of every such encoding, made by a separate
 *     encoder, judges every 1-, 2- and 3-byte string and every 4-byte string
 *     that starts F0..F4 (plus boundary bytes after the other leads);
 *   - glibc's iconv (UTF-8 to UTF-32) on random byte strings: where the first
 *     invalid byte is;
 *   - Python's bytes.decode("utf-8", errors="replace") for utf8_clean (the
 *     maximal-subpart rule), as golden vectors written out by Python 3.11;
 *   - for streaming, the property utf8_stream_end promises: the clean text of
 *     the bytes up to it never changes as more bytes come. */
#include <iconv.h>
#include <stdint.h>

#include "base/utf8.h"
#include "tests/unit/test.h"

/* The canonical encoding of cp (any value below 2^21) into out; its length. */
static size_t ref_encode(uint32_t cp, uint8_t *out)
{
    if (cp < 0x80) {
        out[0] = (uint8_t)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (uint8_t)(0xC0 | cp >> 6);
        out[1] = (uint8_t)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (uint8_t)(0xE0 | cp >> 12);
        out[1] = (uint8_t)(0x80 | (cp >> 6 & 0x3F));
        out[2] = (uint8_t)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (uint8_t)(0xF0 | cp >> 18);
    out[1] = (uint8_t)(0x80 | (cp >> 12 & 0x3F));
    out[2] = (uint8_t)(0x80 | (cp >> 6 & 0x3F));
    out[3] = (uint8_t)(0x80 | (cp & 0x3F));
    return 4;
}

static int is_scalar(uint32_t cp) { return cp <= 0x10FFFF && !(cp >= 0xD800 && cp <= 0xDFFF); }

/* Bitsets of the valid encodings: 2-byte ones by their 16-bit value, 3-byte
 * ones by their 24, 4-byte ones (leads F0..F4) by (lead - F0) << 24 | rest;
 * code_of gives the code point of each. */
static uint8_t valid2[1 << 13], valid3[1 << 21], valid4[5 << 21];

static void set_bit(uint8_t *b, uint32_t i) { b[i >> 3] |= (uint8_t)(1u << (i & 7)); }
static int get_bit(const uint8_t *b, uint32_t i) { return b[i >> 3] >> (i & 7) & 1; }

static void build_tables(void)
{
    for (uint32_t cp = 0x80; cp <= 0x10FFFF; cp++) {
        if (!is_scalar(cp))
            continue;
        uint8_t e[4];
        size_t k = ref_encode(cp, e);
        if (k == 2)
            set_bit(valid2, (uint32_t)e[0] << 8 | e[1]);
        else if (k == 3)
            set_bit(valid3, (uint32_t)e[0] << 16 | (uint32_t)e[1] << 8 | e[2]);
        else
            set_bit(valid4, (uint32_t)(e[0] - 0xF0) << 24 | (uint32_t)e[1] << 16 | (uint32_t)e[2] << 8 | e[3]);
    }
}

/* The oracle's utf8_seq of s[0..n) for n <= 4: the length of the valid
 * encoding s starts with (at most one, the encodings being prefix-free). */
static size_t ref_seq(const uint8_t *s, size_t n)
{
    if (n >= 1 && s[0] < 0x80)
        return 1;
    if (n >= 2 && get_bit(valid2, (uint32_t)s[0] << 8 | s[1]))
        return 2;
    if (n >= 3 && get_bit(valid3, (uint32_t)s[0] << 16 | (uint32_t)s[1] << 8 | s[2]))
        return 3;
    if (n >= 4 && s[0] >= 0xF0 && s[0] <= 0xF4 &&
        get_bit(valid4, (uint32_t)(s[0] - 0xF0) << 24 | (uint32_t)s[1] << 16 | (uint32_t)s[2] << 8 | s[3]))
        return 4;
    return 0;
}

/* utf8_decode agrees with the oracle on s[0..n); the code point it gives
 * encodes back to the same bytes. 0 on a disagreement. */
static int agrees(const uint8_t *s, size_t n)
{
    uint32_t cp = 0xFFFFFFFF;
    size_t k = utf8_decode(s, n, &cp);
    if (k != ref_seq(s, n) || k != utf8_seq(s, n))
        return 0;
    if (k == 0)
        return cp == 0xFFFFFFFF; /* untouched */
    uint8_t e[4];
    return is_scalar(cp) && ref_encode(cp, e) == k && memcmp(e, s, k) == 0;
}

static void test_exhaustive_against_the_definition(void)
{
    uint8_t s[4] = {0};
    CHECK(utf8_seq(s, 0) == 0, "n = 0");
    for (uint32_t v = 0; v < 1u << 24; v++) {
        s[0] = (uint8_t)(v >> 16), s[1] = (uint8_t)(v >> 8), s[2] = (uint8_t)v;
        CHECK(agrees(s, 3), "%02x %02x %02x", s[0], s[1], s[2]);
        if ((v & 0xFF) == 0)
            CHECK(agrees(s, 2) && agrees(s, 1), "%02x %02x", s[0], s[1]);
    }
    /* Every 4-byte string whose lead can open a 4-byte sequence. */
    for (uint32_t v = 0; v < 5u << 24; v++) {
        s[0] = (uint8_t)(0xF0 + (v >> 24)), s[1] = (uint8_t)(v >> 16), s[2] = (uint8_t)(v >> 8), s[3] = (uint8_t)v;
        CHECK(agrees(s, 4), "%02x %02x %02x %02x", s[0], s[1], s[2], s[3]);
    }
    /* Every other lead with boundary bytes after it. */
    static const uint8_t edge[] = {0x00, 0x41, 0x7F, 0x80, 0x8F, 0x90, 0x9F, 0xA0, 0xBF, 0xC0, 0xC2, 0xF4, 0xFF};
    for (uint32_t c = 0; c < 256; c++) {
        if (c >= 0xF0 && c <= 0xF4)
            continue;
        for (size_t a = 0; a < sizeof edge; a++)
            for (size_t b = 0; b < sizeof edge; b++)
                for (size_t d = 0; d < sizeof edge; d++) {
                    s[0] = (uint8_t)c, s[1] = edge[a], s[2] = edge[b], s[3] = edge[d];
                    CHECK(agrees(s, 4), "%02x %02x %02x %02x", s[0], s[1], s[2], s[3]);
                }
    }
}

static void test_lead_len(void)
{
    for (uint32_t c = 0; c < 256; c++) {
        /* The length of the encodings this byte leads, from the oracle's tables. */
        size_t want = 1;
        uint8_t e[4];
        for (uint32_t cp = 0x80; cp <= 0x10FFFF; cp += cp < 0x800 ? 1 : cp < 0x10000 ? 0x40 : 0x1000) {
            size_t k = ref_encode(cp, e);
            if (e[0] == c && is_scalar(cp))
                want = k;
        }
        CHECK(utf8_lead_len((uint8_t)c) == want, "lead %02x: %zu, want %zu", c, utf8_lead_len((uint8_t)c), want);
    }
}

/* Deterministic random bytes, biased toward what makes UTF-8 interesting. */
static uint64_t rng = 0x9E3779B97F4A7C15ull;

static uint32_t next_rand(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)(rng >> 16);
}

static size_t random_text(uint8_t *s, size_t cap)
{
    size_t n = next_rand() % cap, i = 0;
    while (i < n) {
        uint32_t r = next_rand() % 8;
        if (r < 3) {
            s[i++] = (uint8_t)(next_rand() % 0x80);
        } else if (r < 6 && i + 4 <= n) {
            /* a valid character, maybe cut short below */
            uint32_t cp;
            do
                cp = next_rand() % 0x110000;
            while (!is_scalar(cp) || cp < 0x80);
            i += ref_encode(cp, s + i);
        } else {
            static const uint8_t odd[] = {0x80, 0xBF, 0xC0, 0xC1, 0xC2, 0xDF, 0xE0, 0xED, 0xEF, 0xF0, 0xF4, 0xF5, 0xFF};
            s[i++] = r == 6 ? odd[next_rand() % sizeof odd] : (uint8_t)(0x80 + next_rand() % 0x80);
        }
    }
    if (i > 0 && next_rand() % 4 == 0)
        i--; /* cut the last character short, now and then */
    return i;
}

/* iconv's verdict: the offset of the first byte it cannot convert (an
 * invalid sequence, or one the end cuts short), or n. */
static size_t iconv_invalid_at(iconv_t cd, const uint8_t *s, size_t n)
{
    char out[4 * 64 + 16];
    char *ip = (char *)s, *op = out;
    size_t il = n, ol = sizeof out;
    iconv(cd, NULL, NULL, NULL, NULL);
    iconv(cd, &ip, &il, &op, &ol);
    return (size_t)((const uint8_t *)ip - s);
}

static void test_random_against_iconv(void)
{
    iconv_t cd = iconv_open("UTF-32LE", "UTF-8");
    CHECK(cd != (iconv_t)-1, "iconv_open UTF-8 -> UTF-32LE");
    uint8_t s[64];
    int failed = 0;
    size_t n_valid = 0;
    for (int t = 0; t < 200000 && !failed; t++) {
        size_t n = random_text(s, sizeof s);
        size_t want = iconv_invalid_at(cd, s, n), got = utf8_invalid_at(s, n);
        failed = got != want;
        n_valid += got == n;
        if (failed) {
            iconv_close(cd);
            CHECK(0, "random text %d (%zu bytes): utf8_invalid_at %zu, iconv %zu", t, n, got, want);
        }
    }
    iconv_close(cd);
    CHECK(n_valid > 5000 && n_valid < 195000, "the generator made %zu valid texts of 200000", n_valid);
}

static void test_clean_matches_python_replace(void)
{
    /* bytes.decode("utf-8", errors="replace").encode() from Python 3.11. */
    static const struct {
        const char *in;
        size_t n;
        const char *out;
        size_t out_n;
    } gold[] = {
        {"", 0, "", 0},
        {"\x61\x62\x63", 3, "\x61\x62\x63", 3},
        {"\xff", 1, "\xef\xbf\xbd", 3},
        {"\x80", 1, "\xef\xbf\xbd", 3},
        {"\xc0\x80", 2, "\xef\xbf\xbd\xef\xbf\xbd", 6},
        {"\xc1\xbf", 2, "\xef\xbf\xbd\xef\xbf\xbd", 6},
        {"\xc2", 1, "\xef\xbf\xbd", 3},
        {"\xc2\x80", 2, "\xc2\x80", 2},
        {"\xe2\x82", 2, "\xef\xbf\xbd", 3},
        {"\xe2\x82\xac", 3, "\xe2\x82\xac", 3},
        {"\xe2\x82\x78", 3, "\xef\xbf\xbd\x78", 4},
        {"\xe0\x80\x80", 3, "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd", 9},
        {"\xe0\xa0\x80", 3, "\xe0\xa0\x80", 3},
        {"\xed\xa0\x80", 3, "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd", 9},
        {"\xed\x9f\xbf", 3, "\xed\x9f\xbf", 3},
        {"\xf0\x80\x80\x80", 4, "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd", 12},
        {"\xf0\x90\x80", 3, "\xef\xbf\xbd", 3},
        {"\xf0\x90\x80\x80", 4, "\xf0\x90\x80\x80", 4},
        {"\xf4\x8f\xbf\xbf", 4, "\xf4\x8f\xbf\xbf", 4},
        {"\xf4\x90\x80\x80", 4, "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd", 12},
        {"\xf5\x80\x80\x80", 4, "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd", 12},
        {"\xf8\x88\x80\x80\x80", 5, "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd", 15},
        {"\xfe\xff", 2, "\xef\xbf\xbd\xef\xbf\xbd", 6},
        {"\x61\xf0\x9f\x98\x62\xe2\x82\xac\x63", 9, "\x61\xef\xbf\xbd\x62\xe2\x82\xac\x63", 9},
        {"\xf0\x9f\x98\x80\xf0\x9f\x98", 7, "\xf0\x9f\x98\x80\xef\xbf\xbd", 7},
        {"\xc3\xa9\xc3", 3, "\xc3\xa9\xef\xbf\xbd", 5},
        {"\x80\x80\x80", 3, "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd", 9},
        {"\xe1\x80\xe1\x80\x80", 5, "\xef\xbf\xbd\xe1\x80\x80", 6},
        {"\xef\xbf\xbd", 3, "\xef\xbf\xbd", 3},
        {"\xed\xbf\xbf\xee\x80\x80", 6, "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd\xee\x80\x80", 12},
    };
    for (size_t i = 0; i < sizeof gold / sizeof gold[0]; i++) {
        size_t n = 99;
        char *c = utf8_clean(gold[i].in, gold[i].n, &n);
        int ok = c && n == gold[i].out_n && memcmp(c, gold[i].out, n) == 0 && c[n] == 0;
        free(c);
        CHECK(ok, "case %zu: %zu bytes out, want %zu", i, n, gold[i].out_n);
    }
    /* On random text: valid output, the input itself when that is valid. */
    uint8_t s[64];
    for (int t = 0; t < 50000; t++) {
        size_t n = random_text(s, sizeof s), m;
        char *c = utf8_clean((const char *)s, n, &m);
        int ok = c && utf8_invalid_at((const uint8_t *)c, m) == m &&
                 (utf8_invalid_at(s, n) < n || (m == n && memcmp(c, s, n) == 0));
        free(c);
        CHECK(ok, "random text %d", t);
    }
}

static void test_stream_end(void)
{
    static const struct {
        const char *s;
        size_t n, from, limit, want;
    } gold[] = {
        {"a\xe2\x82", 3, 0, 3, 1},     /* a cut character waits */
        {"a\xe2\x82\xac", 4, 0, 4, 4},
        {"a\xe2", 2, 0, 2, 1},
        {"\xe2\x28", 2, 0, 2, 2},      /* E2 then '(' can never be one: a bad run of its own */
        {"\xff", 1, 0, 1, 1},
        {"ab\xc3\xa9", 4, 0, 3, 2},    /* the limit cuts the character */
        {"ab\xc3\xa9", 4, 2, 4, 4},
        {"\xf0\x9f\x98", 3, 0, 3, 0},
        {"\xed\xa0", 2, 0, 2, 2},      /* ED A0 is no prefix of a character: two settled runs */
    };
    for (size_t i = 0; i < sizeof gold / sizeof gold[0]; i++) {
        size_t got = utf8_stream_end((const uint8_t *)gold[i].s, gold[i].n, gold[i].from, gold[i].limit);
        CHECK(got == gold[i].want, "case %zu: %zu, want %zu", i, got, gold[i].want);
    }
    /* The promise: the clean text up to the end it gives for the first n
     * bytes is a prefix of the clean text of all of them, for every n. */
    uint8_t s[48];
    for (int t = 0; t < 20000; t++) {
        size_t total = random_text(s, sizeof s), all_n;
        char *all = utf8_clean((const char *)s, total, &all_n);
        CHECK(all, "out of memory");
        size_t prev = 0;
        for (size_t n = 0; n <= total; n++) {
            size_t e = utf8_stream_end(s, n, prev, n), part_n;
            char *part = utf8_clean((const char *)s, e, &part_n);
            int ok = part && e >= prev && e <= n && part_n <= all_n && memcmp(part, all, part_n) == 0;
            free(part);
            if (!ok)
                free(all);
            CHECK(ok, "random text %d, %zu of %zu bytes: end %zu after %zu", t, n, total, e, prev);
            prev = e;
        }
        /* With every byte there, only a character the end cuts is held back. */
        int settled = prev == total || utf8_lead_len(s[prev]) > total - prev;
        free(all);
        CHECK(settled, "random text %d: end %zu of %zu", t, prev, total);
    }
}

int main(void)
{
    build_tables();
    RUN(test_exhaustive_against_the_definition);
    RUN(test_lead_len);
    RUN(test_random_against_iconv);
    RUN(test_clean_matches_python_replace);
    RUN(test_stream_end);
    TEST_EXIT();
}
