/* test_stopstr.c - stop strings over a token stream (engine/text/stopstr.h).
 *
 * - against a direct reference (the first token whose text prefix contains a
 *   stop string; the leftmost occurrence, the longest at equal starts) on
 *   20,000 random streams over a small alphabet, so matches span tokens,
 *   overlap and start in the window's oldest byte;
 * - a match inside the very first token, one split over three tokens, a
 *   multi-byte character cut between tokens, a piece longer than any window;
 * - refusals: too many strings, empty and over-long ones, NULL. */
#include "base/err.h"
#include "engine/text/stopstr.h"
#include "tests/unit/test.h"

#include <stdint.h>

static uint64_t rng = 88172645463325252ull;
static uint32_t next_u32(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)(rng >> 11);
}

/* text = concatenated pieces; returns the token index that completes the
 * first match (or -1) and its stop index and offset. */
static int32_t reference(const char *text, const size_t *ends, int32_t n_tok, const stop_set *ss, int32_t *which,
                         int64_t *at)
{
    for (int32_t t = 0; t < n_tok; t++) {
        int32_t best = -1;
        size_t best_at = 0;
        for (int32_t i = 0; i < ss->n; i++) {
            const char *p = memmem(text, ends[t], ss->s[i], (size_t)ss->len[i]);
            if (!p)
                continue;
            size_t o = (size_t)(p - text);
            if (best < 0 || o < best_at || (o == best_at && ss->len[i] > ss->len[best]))
                best = i, best_at = o;
        }
        if (best >= 0) {
            *which = best;
            *at = (int64_t)best_at;
            return t;
        }
    }
    return -1;
}

static void test_random_streams(void)
{
    const char alpha[] = "ab \n";
    char text[4096];
    size_t ends[256];
    int mismatches = 0, matched = 0;
    char why[300] = "";
    for (int iter = 0; iter < 20000; iter++) {
        /* 1-4 stop strings of 1-6 letters */
        char sbuf[4][8];
        const char *strs[4];
        int32_t ns = 1 + (int32_t)(next_u32() % 4);
        for (int32_t i = 0; i < ns; i++) {
            int32_t L = 1 + (int32_t)(next_u32() % 6);
            for (int32_t j = 0; j < L; j++)
                sbuf[i][j] = alpha[next_u32() % 4];
            sbuf[i][L] = 0;
            strs[i] = sbuf[i];
        }
        stop_set ss;
        CHECK_OK(stop_set_init(&ss, strs, ns));
        /* 1-40 pieces of 0-7 bytes */
        int32_t n_tok = 1 + (int32_t)(next_u32() % 40);
        size_t len = 0;
        for (int32_t t = 0; t < n_tok; t++) {
            int32_t L = (int32_t)(next_u32() % 8);
            for (int32_t j = 0; j < L; j++)
                text[len++] = alpha[next_u32() % 4];
            ends[t] = len;
        }
        int32_t want_w = -1;
        int64_t want_at = -1;
        int32_t want_t = reference(text, ends, n_tok, &ss, &want_w, &want_at);
        stop_scan sc;
        stop_scan_init(&sc);
        int32_t got_t = -1;
        for (int32_t t = 0; t < n_tok; t++) {
            size_t b = t ? ends[t - 1] : 0;
            int rc = stop_scan_push(&sc, &ss, text + b, ends[t] - b);
            CHECK(rc >= 0, "push failed: %s", rd_errmsg());
            if (rc == 1) {
                got_t = t;
                break;
            }
        }
        int ok = got_t == want_t && (got_t < 0 || (sc.matched == want_w && sc.match_at == want_at));
        if (!ok && !mismatches++)
            snprintf(why, sizeof why, "stream %d: token %d stop %d at %lld; reference token %d stop %d at %lld", iter,
                     got_t, sc.matched, (long long)sc.match_at, want_t, want_w, (long long)want_at);
        matched += got_t >= 0;
        stop_scan_free(&sc);
        stop_set_free(&ss);
    }
    CHECK(mismatches == 0, "%d mismatches; first: %s", mismatches, why);
    CHECK(matched > 5000 && matched < 19000, "only %d of 20000 streams matched: the test is not exercising both", matched);
}

static int push_all(stop_scan *sc, const stop_set *ss, const char *const *pieces, int n)
{
    for (int i = 0; i < n; i++)
        if (stop_scan_push(sc, ss, pieces[i], strlen(pieces[i])) == 1)
            return i;
    return -1;
}

static void test_cases(void)
{
    stop_set ss;
    stop_scan sc;
    const char *s1[] = {"</answer>", "\n\n"};
    CHECK_OK(stop_set_init(&ss, s1, 2));

    /* inside the very first token */
    const char *p1[] = {"x</answer>y", "z"};
    stop_scan_init(&sc);
    CHECK(push_all(&sc, &ss, p1, 2) == 0 && sc.matched == 0 && sc.match_at == 1, "first token: token?, at %lld",
          (long long)sc.match_at);
    CHECK(stop_scan_push(&sc, &ss, "more", 4) == 1 && sc.match_at == 1, "a push after the match changed it");
    stop_scan_free(&sc);

    /* over three tokens, after text longer than any window */
    const char *p2[] = {"The answer is 42 and a long run of words before it ", "</an", "sw", "er> tail"};
    stop_scan_init(&sc);
    CHECK(push_all(&sc, &ss, p2, 4) == 3 && sc.matched == 0 && sc.match_at == (int64_t)strlen(p2[0]),
          "split over tokens: at %lld", (long long)sc.match_at);
    stop_scan_free(&sc);

    /* the earlier of two completed by one token */
    const char *p3[] = {"a\n", "\n</answer>"};
    stop_scan_init(&sc);
    CHECK(push_all(&sc, &ss, p3, 2) == 1 && sc.matched == 1 && sc.match_at == 1, "earliest: stop %d at %lld",
          sc.matched, (long long)sc.match_at);
    stop_scan_free(&sc);
    stop_set_free(&ss);

    /* a multi-byte character cut between tokens: U+00E9 is C3 A9 */
    const char *s2[] = {"caf\xc3\xa9!"};
    CHECK_OK(stop_set_init(&ss, s2, 1));
    const char *p4[] = {"un caf\xc3", "\xa9", "!"};
    stop_scan_init(&sc);
    CHECK(push_all(&sc, &ss, p4, 3) == 2 && sc.match_at == 3, "cut character: at %lld", (long long)sc.match_at);
    stop_scan_free(&sc);
    stop_set_free(&ss);

    /* no stop strings: nothing matches, bytes are counted */
    CHECK_OK(stop_set_init(&ss, NULL, 0));
    stop_scan_init(&sc);
    CHECK(stop_scan_push(&sc, &ss, "abc", 3) == 0 && sc.bytes == 3 && sc.matched == -1, "empty set");
    stop_scan_free(&sc);
    stop_set_free(&ss);
}

static void test_refusals(void)
{
    stop_set ss;
    const char *many[STOP_MAX_STRS + 1];
    for (int i = 0; i <= STOP_MAX_STRS; i++)
        many[i] = "x";
    CHECK(stop_set_init(&ss, many, STOP_MAX_STRS + 1) == RD_EINVAL && strstr(rd_errmsg(), "at most"), "too many");
    const char *empty[] = {"ok", ""};
    CHECK(stop_set_init(&ss, empty, 2) == RD_EINVAL && strstr(rd_errmsg(), "stop string 1"), "empty: %s", rd_errmsg());
    CHECK(ss.n == 0, "a refused set keeps strings");
    char big[STOP_MAX_LEN + 2];
    memset(big, 'a', sizeof big - 1);
    big[sizeof big - 1] = 0;
    const char *longs[] = {big};
    CHECK(stop_set_init(&ss, longs, 1) == RD_EINVAL, "over-long accepted");
    CHECK(stop_set_init(&ss, NULL, 2) == RD_EINVAL, "NULL array accepted");
    const char *nul[] = {NULL};
    CHECK(stop_set_init(&ss, nul, 1) == RD_EINVAL, "NULL string accepted");
}

int main(void)
{
    RUN(test_random_streams);
    RUN(test_cases);
    RUN(test_refusals);
    TEST_EXIT();
}
