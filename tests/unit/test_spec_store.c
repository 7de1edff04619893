/* test_spec_store.c - the store of recent completions (engine/serve/spec_store.h):
 * newest first per key, the version in the key, the byte bound with the
 * oldest entries evicted first (across keys, each key's chain cut at its
 * tail), an entry larger than the bound not kept, and a long random run
 * against a plain array model of the same rules. */
#include <stdint.h>

#include "base/err.h"
#include "engine/serve/spec_store.h"
#include "tests/unit/test.h"

static int32_t toks[128];

static void fill(int32_t base, int32_t n)
{
    for (int32_t i = 0; i < n; i++)
        toks[i] = base + i;
}

static void order_and_keys(void)
{
    const int32_t prompt[3] = {5, 6, 7}, other[3] = {5, 6, 8};
    uint64_t k1 = spec_store_key(prompt, 3, 1), k2 = spec_store_key(prompt, 3, 2), k3 = spec_store_key(other, 3, 1);
    CHECK(k1 && k1 != k2 && k1 != k3 && k1 == spec_store_key(prompt, 3, 1), "keys %llx %llx %llx",
          (unsigned long long)k1, (unsigned long long)k2, (unsigned long long)k3);
    spec_store *s;
    CHECK_OK(spec_store_create(1 << 20, &s));
    fill(100, 4);
    CHECK_OK(spec_store_put(s, k1, toks, 4));
    fill(200, 2);
    CHECK_OK(spec_store_put(s, k1, toks, 2));
    fill(300, 3);
    CHECK_OK(spec_store_put(s, k3, toks, 3));
    spec_tokens got[4];
    int32_t n = spec_store_get(s, k1, got, 4);
    int ok = n == 2 && got[0].n == 2 && got[0].ids[0] == 200 && got[1].n == 4 && got[1].ids[3] == 103;
    int32_t n2 = spec_store_get(s, k2, got, 4), n1 = spec_store_get(s, k1, got, 1);
    const int n1_ok = n1 == 1 && got[0].ids[0] == 200; /* read before the store goes */
    spec_store_stats st;
    spec_store_get_stats(s, &st);
    spec_store_destroy(s);
    CHECK(ok, "k1: %d completions, newest first expected", n);
    CHECK(n2 == 0, "another version's key found %d", n2);
    CHECK(n1_ok, "max 1: %d", n1);
    CHECK(st.entries == 3 && st.bytes == 9 * 4 + 3 * SPEC_STORE_ENTRY_BYTES, "entries %d bytes %lld", st.entries,
          (long long)st.bytes);
}

static void bound_evicts_oldest(void)
{
    /* Room for three 8-token entries (32 + 64 bytes each), not four. */
    const int64_t per = 8 * 4 + SPEC_STORE_ENTRY_BYTES;
    spec_store *s;
    CHECK_OK(spec_store_create(3 * per + per / 2, &s));
    const uint64_t a = 11, b = 22;
    fill(0, 8);
    CHECK_OK(spec_store_put(s, a, toks, 8)); /* a0: evicted first */
    fill(10, 8);
    CHECK_OK(spec_store_put(s, b, toks, 8)); /* b0 */
    fill(20, 8);
    CHECK_OK(spec_store_put(s, a, toks, 8)); /* a1 */
    fill(30, 8);
    CHECK_OK(spec_store_put(s, a, toks, 8)); /* a2: a0 goes */
    spec_tokens got[4];
    int32_t na = spec_store_get(s, a, got, 4);
    int a_ok = na == 2 && got[0].ids[0] == 30 && got[1].ids[0] == 20;
    int32_t nb = spec_store_get(s, b, got, 4);
    fill(40, 8);
    CHECK_OK(spec_store_put(s, a, toks, 8)); /* b0 goes: b has nothing left */
    int32_t nb2 = spec_store_get(s, b, got, 4);
    fill(0, 100);
    int rc = spec_store_put(s, b, toks, 100); /* 400 + 64 bytes > the bound: not kept, nothing evicted */
    spec_store_stats st;
    spec_store_get_stats(s, &st);
    spec_store_destroy(s);
    CHECK(a_ok, "a: %d completions after the first eviction", na);
    CHECK(nb == 1 && nb2 == 0, "b: %d then %d", nb, nb2);
    CHECK(rc == 0 && st.entries == 3 && st.evictions == 2 && st.bytes <= st.max_bytes, "rc %d entries %d ev %lld", rc,
          st.entries, (long long)st.evictions);
}

/* Random puts over 5 keys against a model: an array of (key, first token, n)
 * in insertion order, trimmed from the front to the bound. */
static void random_against_model(void)
{
    enum { N = 3000, CAP = 4096 };
    static uint64_t mk[CAP];
    static int32_t mfirst[CAP], mn[CAP];
    int32_t lo = 0, hi = 0;
    int64_t bytes = 0;
    const int64_t bound = 2000;
    spec_store *s;
    CHECK_OK(spec_store_create(bound, &s));
    uint64_t x = 99;
    char why[200] = "";
    for (int i = 0; i < N && !why[0]; i++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        uint64_t key = 1 + (x >> 40) % 5;
        int32_t n = 1 + (int32_t)((x >> 20) % 64);
        fill(i * 100, n);
        if (spec_store_put(s, key, toks, n)) {
            snprintf(why, sizeof why, "put %d: %s", i, rd_errmsg());
            break;
        }
        int64_t c = (int64_t)n * 4 + SPEC_STORE_ENTRY_BYTES;
        if (c <= bound) {
            while (bytes + c > bound) {
                bytes -= (int64_t)mn[lo] * 4 + SPEC_STORE_ENTRY_BYTES;
                lo++;
            }
            mk[hi] = key, mfirst[hi] = i * 100, mn[hi] = n;
            hi++;
            bytes += c;
        }
        for (uint64_t k = 1; k <= 5 && !why[0]; k++) {
            spec_tokens got[CAP < 64 ? CAP : 64];
            int32_t g = spec_store_get(s, k, got, 64), want = 0;
            for (int32_t j = hi - 1; j >= lo && want < 64; j--) {
                if (mk[j] != k)
                    continue;
                if (want >= g || got[want].n != mn[j] || got[want].ids[0] != mfirst[j])
                    snprintf(why, sizeof why, "after put %d key %llu: completion %d differs", i,
                             (unsigned long long)k, want);
                want++;
            }
            if (!why[0] && want != g)
                snprintf(why, sizeof why, "after put %d key %llu: %d completions, model %d", i, (unsigned long long)k,
                         g, want);
        }
    }
    spec_store_stats st;
    spec_store_get_stats(s, &st);
    spec_store_destroy(s);
    CHECK(!why[0], "%s", why);
    CHECK(st.bytes == bytes && st.entries == hi - lo && st.evictions > 100, "bytes %lld vs %lld, entries %d vs %d",
          (long long)st.bytes, (long long)bytes, st.entries, hi - lo);
}

static void bad_arguments(void)
{
    spec_store *s = NULL;
    CHECK(spec_store_create(0, &s) == RD_EINVAL && !s, "max_bytes 0");
    CHECK_OK(spec_store_create(100, &s));
    fill(0, 2);
    int r1 = spec_store_put(s, 0, toks, 2), r2 = spec_store_put(s, 5, toks, 0);
    spec_store_destroy(s);
    CHECK(r1 == RD_EINVAL && r2 == RD_EINVAL, "%d %d", r1, r2);
}

int main(void)
{
    RUN(order_and_keys);
    RUN(bound_evicts_oldest);
    RUN(random_against_model);
    RUN(bad_arguments);
    TEST_EXIT();
}
