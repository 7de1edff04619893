/* test_sampler.c - the sampler: Philox known answers, distribution fit,
 * truncation supports, log-probs against a double reference, determinism,
 * validation, masked logits. */
#include "base/err.h"
#include "engine/serve/sampler.h"
#include "tests/unit/test.h"

#include <stdint.h>

/* ---- helpers ---- */

static uint64_t mix_state;
static uint64_t splitmix64(void)
{
    uint64_t z = (mix_state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* Box-Muller normal(0, sd) logits: roughly what an LM head produces. */
static void normal_logits(float *x, int n, double sd, uint64_t seed)
{
    mix_state = seed;
    for (int i = 0; i < n; i++) {
        double u1 = ((splitmix64() >> 11) + 1.0) * 0x1.0p-53;
        double u2 = (splitmix64() >> 11) * 0x1.0p-53;
        x[i] = (float)(sd * sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2));
    }
}

/* Double-precision log_softmax(x / t). */
static void ref_log_softmax(const float *x, int n, double t, double *out)
{
    double m = -INFINITY, s = 0.0;
    for (int i = 0; i < n; i++)
        if (x[i] > m)
            m = x[i];
    for (int i = 0; i < n; i++)
        s += exp(((double)x[i] - m) / t);
    for (int i = 0; i < n; i++)
        out[i] = ((double)x[i] - m) / t - log(s);
}

static int sample_or_die(const samp_params *p, const float *x, int n, uint32_t idx,
                         uint32_t pos, void *scratch, samp_result *r)
{
    int rc = samp_sample(p, x, n, idx, pos, scratch, r);
    if (rc) {
        fprintf(stderr, "samp_sample: %s\n", rd_errmsg());
        return -1;
    }
    return r->token;
}

/* Upper critical value of chi-square with df degrees of freedom at level
 * alpha = 0.001, by Wilson-Hilferty: (X/df)^(1/3) is close to normal with
 * mean 1 - 2/(9 df) and variance 2/(9 df), so
 *   crit = df * (1 - 2/(9 df) + z * sqrt(2/(9 df)))^3,  z = Phi^-1(0.999).
 * For df = 15 this gives 37.84 (tables: 37.70), slightly conservative. */
static double chi2_crit_001(int df)
{
    const double z = 3.090232306167813;
    double v = 2.0 / (9.0 * df);
    double c = 1.0 - v + z * sqrt(v);
    return df * c * c * c;
}

static double chi2_stat(const long *obs, const double *prob, int n, long draws)
{
    double x2 = 0.0;
    for (int i = 0; i < n; i++) {
        double e = prob[i] * (double)draws;
        double d = (double)obs[i] - e;
        x2 += d * d / e;
    }
    return x2;
}

/* Draws at positions 0..draws-1 and counts tokens. Returns 0 or -1. */
static int count_draws(const samp_params *p, const float *x, int n, uint32_t idx, long draws,
                       void *scratch, long *counts)
{
    samp_result r;
    for (int i = 0; i < n; i++)
        counts[i] = 0;
    for (long k = 0; k < draws; k++) {
        int t = sample_or_die(p, x, n, idx, (uint32_t)k, scratch, &r);
        if (t < 0 || t >= n)
            return -1;
        counts[t]++;
    }
    return 0;
}

/* ---- RNG ---- */

static void test_philox_known_answers(void)
{
    /* Random123 tests/kat_vectors, philox4x32 10: counter, key, expected. */
    static const uint32_t kat[3][10] = {
        {0, 0, 0, 0, 0, 0, 0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8},
        {0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff,
         0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd},
        {0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344, 0xa4093822, 0x299f31d0,
         0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1},
    };
    for (int v = 0; v < 3; v++) {
        uint32_t out[4];
        samp_philox4x32_10(&kat[v][0], &kat[v][4], out);
        for (int j = 0; j < 4; j++)
            CHECK(out[j] == kat[v][6 + j], "vector %d word %d: got %08x, want %08x", v, j,
                  out[j], kat[v][6 + j]);
    }
    /* samp_uniform is the documented construction on top of the block. */
    uint64_t seed = 0x0123456789abcdefull;
    uint32_t ctr[4] = {7, 42, 0, 0}, key[2] = {0x89abcdef, 0x01234567}, out[4];
    samp_philox4x32_10(ctr, key, out);
    double want = (double)((((uint64_t)out[1] << 32) | out[0]) >> 11) / 9007199254740992.0;
    double got = samp_uniform(seed, 7, 42);
    CHECK(got == want, "samp_uniform %.17g, construction %.17g", got, want);
}

static void test_uniform_range_and_mean(void)
{
    const int n = 100000;
    double sum = 0.0, sum2 = 0.0;
    for (int k = 0; k < n; k++) {
        double u = samp_uniform(99, 0, (uint32_t)k);
        CHECK(u >= 0.0 && u < 1.0, "u = %.17g at pos %d", u, k);
        CHECK(u == samp_uniform(99, 0, (uint32_t)k), "not a pure function at pos %d", k);
        sum += u;
        sum2 += u * u;
    }
    double mean = sum / n, var = sum2 / n - mean * mean;
    CHECK(fabs(mean - 0.5) < 0.01, "mean %.5f", mean);
    CHECK(fabs(var - 1.0 / 12.0) < 0.005, "variance %.5f, want %.5f", var, 1.0 / 12.0);
}

static void test_streams_and_determinism(void)
{
    float x[16];
    normal_logits(x, 16, 1.0, 5);
    void *s1 = malloc(samp_scratch_bytes(16)), *s2 = malloc(samp_scratch_bytes(16));
    CHECK(s1 && s2, "malloc");
    samp_params p = samp_default();
    p.seed = 1234;
    p.processed_logprobs = 1;
    p.logprobs_topk = 5;
    int differ_idx = 0, same_u = 0, differ_seed = 0;
    for (uint32_t pos = 0; pos < 1000; pos++) {
        samp_result a, b, c, d;
        memset(s1, 0x00, samp_scratch_bytes(16));
        memset(s2, 0xAB, samp_scratch_bytes(16)); /* scratch contents must not matter */
        CHECK(sample_or_die(&p, x, 16, 0, pos, s1, &a) >= 0, "sample");
        CHECK(sample_or_die(&p, x, 16, 0, pos, s2, &b) >= 0, "sample");
        CHECK(memcmp(&a, &b, sizeof a) == 0, "same inputs gave different results at pos %u", pos);
        CHECK(sample_or_die(&p, x, 16, 1, pos, s1, &c) >= 0, "sample");
        differ_idx += a.token != c.token;
        same_u += samp_uniform(p.seed, 0, pos) == samp_uniform(p.seed, 1, pos);
        samp_params q = p;
        q.seed = p.seed + 1;
        CHECK(sample_or_die(&q, x, 16, 0, pos, s1, &d) >= 0, "sample");
        differ_seed += a.token != d.token;
    }
    free(s1);
    free(s2);
    /* Independent draws from these 16 tokens differ with probability > 0.8. */
    CHECK(differ_idx > 600, "sample_idx 0 and 1 differ at only %d of 1000 positions", differ_idx);
    CHECK(same_u == 0, "%d positions drew the same u for two sample indices", same_u);
    CHECK(differ_seed > 600, "seeds differ at only %d of 1000 positions", differ_seed);
}

/* ---- distribution ---- */

static const float chisq_logits[16] = {1.0f, 0.5f, -0.3f, 2.0f, 0.0f,  -1.0f, 1.5f, 0.2f,
                                       -0.5f, 0.8f, -2.0f, 1.2f, 0.3f, -0.8f, 0.6f, -1.5f};

static void test_chisq_temperature_1(void)
{
    const int n = 16;
    const long draws = 100000;
    long counts[16];
    double lp[16], prob[16];
    void *s = malloc(samp_scratch_bytes(n));
    CHECK(s, "malloc");
    samp_params p = samp_default();
    p.seed = 2024;
    int rc = count_draws(&p, chisq_logits, n, 3, draws, s, counts);
    free(s);
    CHECK(rc == 0, "draw failed");
    ref_log_softmax(chisq_logits, n, 1.0, lp);
    for (int i = 0; i < n; i++)
        prob[i] = exp(lp[i]);
    double x2 = chi2_stat(counts, prob, n, draws), crit = chi2_crit_001(n - 1);
    CHECK(crit > 37.5 && crit < 38.2, "critical value %.3f", crit);
    CHECK(x2 < crit, "chi-square %.2f >= %.2f (df %d, p < 0.001)", x2, crit, n - 1);
}

static void test_chisq_temperature_07(void)
{
    const int n = 16;
    const long draws = 100000;
    long counts[16];
    double lp[16], prob[16], prob1[16];
    void *s = malloc(samp_scratch_bytes(n));
    CHECK(s, "malloc");
    samp_params p = samp_default();
    p.temperature = 0.7f;
    p.seed = 77;
    int rc = count_draws(&p, chisq_logits, n, 0, draws, s, counts);
    free(s);
    CHECK(rc == 0, "draw failed");
    ref_log_softmax(chisq_logits, n, (double)0.7f, lp);
    for (int i = 0; i < n; i++)
        prob[i] = exp(lp[i]);
    double crit = chi2_crit_001(n - 1);
    double x2 = chi2_stat(counts, prob, n, draws);
    CHECK(x2 < crit, "chi-square %.2f >= %.2f against softmax(x/0.7)", x2, crit);
    /* The test has power: the same draws are far from softmax(x). */
    ref_log_softmax(chisq_logits, n, 1.0, lp);
    for (int i = 0; i < n; i++)
        prob1[i] = exp(lp[i]);
    double x2_wrong = chi2_stat(counts, prob1, n, draws);
    CHECK(x2_wrong > 10 * crit, "draws at T=0.7 fit softmax(x) too well: %.2f", x2_wrong);
}

/* ---- truncation ---- */

/* Draws `draws` times and checks that the set of tokens seen is exactly
 * want[0..nwant), and that each draw's processed log-prob is
 * log(p_t / sum of p over want) with p = softmax(x / t). */
static int support_is(const samp_params *p, const float *x, int n, const int *want, int nwant,
                      long draws, char *why, size_t whylen)
{
    void *s = malloc(samp_scratch_bytes(n));
    double *lp = malloc(sizeof(double) * n);
    long *counts = calloc(n, sizeof(long));
    int ok = s && lp && counts;
    if (!ok)
        snprintf(why, whylen, "malloc");
    ref_log_softmax(x, n, p->temperature, lp);
    double z_kept = 0.0;
    for (int j = 0; ok && j < nwant; j++)
        z_kept += exp(lp[want[j]]);
    for (long k = 0; ok && k < draws; k++) {
        samp_result r;
        int t = sample_or_die(p, x, n, 0, (uint32_t)k, s, &r);
        if (t < 0) {
            snprintf(why, whylen, "sample failed");
            ok = 0;
            break;
        }
        counts[t]++;
        double want_lp = lp[t] - log(z_kept);
        if (p->processed_logprobs && !(fabs(r.logprob_processed - want_lp) < 1e-5)) {
            snprintf(why, whylen, "token %d processed logprob %.7f, want %.7f", t,
                     r.logprob_processed, want_lp);
            ok = 0;
        }
    }
    for (int i = 0; ok && i < n; i++) {
        int in = 0;
        for (int j = 0; j < nwant; j++)
            in |= want[j] == i;
        if (in && counts[i] == 0) {
            snprintf(why, whylen, "token %d should be kept but was never drawn", i);
            ok = 0;
        } else if (!in && counts[i] != 0) {
            snprintf(why, whylen, "token %d should be cut but was drawn %ld times", i, counts[i]);
            ok = 0;
        }
    }
    free(s);
    free(lp);
    free(counts);
    return ok;
}

static void test_top_k_support(void)
{
    /* Top four are 10, 20, 0, 31; tokens 3 and 7 tie for fifth: 3 wins. */
    float x[32];
    for (int i = 0; i < 32; i++)
        x[i] = -0.5f - 0.05f * (float)i;
    x[10] = 3.0f;
    x[20] = 2.5f;
    x[0] = 2.0f;
    x[31] = 1.5f;
    x[3] = 1.0f;
    x[7] = 1.0f;
    samp_params p = samp_default();
    p.top_k = 5;
    p.seed = 3;
    p.processed_logprobs = 1;
    char why[256] = "";
    const int want5[] = {10, 20, 0, 31, 3};
    CHECK(support_is(&p, x, 32, want5, 5, 20000, why, sizeof why), "top_k 5: %s", why);
    p.top_k = 6;
    const int want6[] = {10, 20, 0, 31, 3, 7};
    CHECK(support_is(&p, x, 32, want6, 6, 20000, why, sizeof why), "top_k 6: %s", why);
    p.top_k = 1;
    p.temperature = 5.0f;
    const int want1[] = {10};
    CHECK(support_is(&p, x, 32, want1, 1, 2000, why, sizeof why), "top_k 1: %s", why);
    /* k at or past the vocab is no cut. */
    p.top_k = 32;
    p.temperature = 1.0f;
    int all[32];
    for (int i = 0; i < 32; i++)
        all[i] = i;
    CHECK(support_is(&p, x, 32, all, 32, 60000, why, sizeof why), "top_k 32: %s", why);
}

/* p = {0.05, 0.3, 0.1, 0.02, 0.03, 0.4, 0.08, 0.02}: in rank order
 * 5 (.4), 1 (.3), 2 (.1), 6 (.08), 0 (.05), 4 (.03), 3 (.02), 7 (.02), with
 * cumulative mass .4 .7 .8 .88 .93 .96 .98 1. Tokens 3 and 7 tie exactly. */
static void hand_logits(float *x)
{
    static const double prob[8] = {0.05, 0.3, 0.1, 0.02, 0.03, 0.4, 0.08, 0.02};
    for (int i = 0; i < 8; i++)
        x[i] = (float)log(prob[i]);
}

static void test_top_p_support(void)
{
    float x[8];
    hand_logits(x);
    samp_params p = samp_default();
    p.seed = 11;
    p.processed_logprobs = 1;
    char why[256] = "";
    p.top_p = 0.35f;
    const int w1[] = {5};
    CHECK(support_is(&p, x, 8, w1, 1, 2000, why, sizeof why), "top_p 0.35: %s", why);
    /* .4 < .5 <= .7: the token that crosses top_p (1) is kept. */
    p.top_p = 0.5f;
    const int w2[] = {5, 1};
    CHECK(support_is(&p, x, 8, w2, 2, 20000, why, sizeof why), "top_p 0.5: %s", why);
    p.top_p = 0.75f;
    const int w3[] = {5, 1, 2};
    CHECK(support_is(&p, x, 8, w3, 3, 20000, why, sizeof why), "top_p 0.75: %s", why);
    p.top_p = 0.85f;
    const int w4[] = {5, 1, 2, 6};
    CHECK(support_is(&p, x, 8, w4, 4, 20000, why, sizeof why), "top_p 0.85: %s", why);
    /* .96 < .97 <= .98: 3 crosses; 7 has the same p but ranks after it. */
    p.top_p = 0.97f;
    const int w7[] = {5, 1, 2, 6, 0, 4, 3};
    CHECK(support_is(&p, x, 8, w7, 7, 40000, why, sizeof why), "top_p 0.97: %s", why);
    /* top_k first, then top_p measured on the top-k mass: top 3 hold
     * .4 .3 .1 = .8, so top_p .8 needs .64: 5 (.5) then 1 (.875) crosses. */
    p.top_k = 3;
    p.top_p = 0.8f;
    CHECK(support_is(&p, x, 8, w2, 2, 20000, why, sizeof why), "top_k 3 + top_p 0.8: %s", why);
}

static void test_min_p_support(void)
{
    float x[8];
    hand_logits(x);
    samp_params p = samp_default();
    p.seed = 12;
    p.processed_logprobs = 1;
    char why[256] = "";
    /* Keep p >= min_p * 0.4. */
    p.min_p = 0.45f; /* >= .18 */
    const int w2[] = {5, 1};
    CHECK(support_is(&p, x, 8, w2, 2, 20000, why, sizeof why), "min_p 0.45: %s", why);
    p.min_p = 0.22f; /* >= .088 */
    const int w3[] = {5, 1, 2};
    CHECK(support_is(&p, x, 8, w3, 3, 20000, why, sizeof why), "min_p 0.22: %s", why);
    p.min_p = 0.1f; /* >= .04 */
    const int w5[] = {5, 1, 2, 6, 0};
    CHECK(support_is(&p, x, 8, w5, 5, 20000, why, sizeof why), "min_p 0.1: %s", why);
    /* min_p after top_p: top_p .85 keeps 5 1 2 6, min_p .22 trims 6. */
    p.top_p = 0.85f;
    p.min_p = 0.22f;
    CHECK(support_is(&p, x, 8, w3, 3, 20000, why, sizeof why), "top_p + min_p: %s", why);
    p.top_p = 1.0f;
    p.min_p = 1.0f; /* only the max */
    const int w1[] = {5};
    CHECK(support_is(&p, x, 8, w1, 1, 1000, why, sizeof why), "min_p 1: %s", why);
}

static int cmp_rank(const void *a, const void *b, void *ctx)
{
    const float *x = ctx;
    int i = *(const int *)a, j = *(const int *)b;
    if (x[i] != x[j])
        return x[i] > x[j] ? -1 : 1;
    return i < j ? -1 : 1;
}

/* The fast paths (heap select, bucketed nucleus) against a brute-force
 * reference on a realistic vocab: full sort, masses in double. The processed
 * log-prob pins down the kept mass, so a kept set wrong by even the boundary
 * token (mass ~1e-4 here) shows up. */
static void test_truncation_matches_reference(void)
{
    const int n = 49152;
    float *x = malloc(sizeof(float) * n);
    int *order = malloc(sizeof(int) * n);
    char *kept = malloc(n);
    void *s = malloc(samp_scratch_bytes(n));
    CHECK(x && order && kept && s, "malloc");
    normal_logits(x, n, 3.0, 42);
    x[100] = x[200] = x[300] = 4.0f; /* some exact ties in the body */
    for (int i = 0; i < n; i++)
        order[i] = i;
    qsort_r(order, n, sizeof(int), cmp_rank, x);
    struct { float t; int k; float top_p, min_p; } cfg[] = {
        {1.0f, 0, 0.9f, 0.0f},  {0.7f, 0, 0.9f, 0.0f},  {1.3f, 0, 0.5f, 0.0f},
        {1.0f, 50, 1.0f, 0.0f}, {0.8f, 50, 0.9f, 0.0f}, {1.0f, 0, 0.95f, 0.05f},
        {1.0f, 0, 1.0f, 0.1f},  {2.0f, 1000, 0.99f, 0.0f}, {1.0f, 0, 0.999f, 0.0f},
        {1.0f, 30000, 1.0f, 0.0f}, {0.7f, 20000, 0.999f, 0.001f}, {1.0f, 0, 0.3f, 0.0f},
    };
    const int ncfg = (int)(sizeof cfg / sizeof cfg[0]);
    int failed = 0;
    char why[256] = "";
    for (int c = 0; c < ncfg && !failed; c++) {
        double t = cfg[c].t, m = x[order[0]];
        int lim = cfg[c].k > 0 ? cfg[c].k : n;
        double z = 0.0;
        for (int j = 0; j < lim; j++)
            z += exp(((double)x[order[j]] - m) / t);
        int nkeep = lim;
        if (cfg[c].top_p < 1.0f) {
            double cum = 0.0;
            for (int j = 0; j < lim; j++) {
                cum += exp(((double)x[order[j]] - m) / t);
                if (cum >= (double)cfg[c].top_p * z) {
                    nkeep = j + 1;
                    break;
                }
            }
        }
        while (nkeep > 1 && exp(((double)x[order[nkeep - 1]] - m) / t) < cfg[c].min_p)
            nkeep--;
        memset(kept, 0, n);
        double zk = 0.0;
        for (int j = 0; j < nkeep; j++) {
            kept[order[j]] = 1;
            zk += exp(((double)x[order[j]] - m) / t);
        }
        samp_params p = samp_default();
        p.temperature = cfg[c].t;
        p.top_k = cfg[c].k;
        p.top_p = cfg[c].top_p;
        p.min_p = cfg[c].min_p;
        p.seed = 1000 + c;
        p.processed_logprobs = 1;
        for (uint32_t pos = 0; pos < 100; pos++) {
            samp_result r;
            int tok = sample_or_die(&p, x, n, 0, pos, s, &r);
            if (tok < 0 || !kept[tok]) {
                snprintf(why, sizeof why, "config %d: token %d outside the kept set of %d", c, tok,
                         nkeep);
                failed = 1;
                break;
            }
            double want = ((double)x[tok] - m) / t - log(zk);
            if (!(fabs(r.logprob_processed - want) < 1e-5)) {
                snprintf(why, sizeof why, "config %d (kept %d): processed %.7f, want %.7f", c,
                         nkeep, r.logprob_processed, want);
                failed = 1;
                break;
            }
        }
    }
    free(x);
    free(order);
    free(kept);
    free(s);
    CHECK(!failed, "%s", why);
}

/* samp_score against an independent reference of the kept set (sorted rank order, double masses): each scored
 * token's processed log-prob is the formula for a kept token and -inf for a dropped one, its rank counts the
 * tokens at least as likely, and a drawn token scored gives the draw's bits (raw and processed). */
static void test_score(void)
{
    const int n = 20000;
    float *x = malloc(sizeof(float) * n);
    int *order = malloc(sizeof(int) * n);
    char *kept = malloc(n);
    void *s = malloc(samp_scratch_bytes(n));
    CHECK(x && order && kept && s, "malloc");
    normal_logits(x, n, 3.0, 7);
    x[10] = x[20] = 5.0f; /* a tie */
    for (int i = 0; i < n; i++)
        order[i] = i;
    qsort_r(order, n, sizeof(int), cmp_rank, x);
    struct { float t; int k; float top_p, min_p; } cfg[] = {
        {1.0f, 0, 1.0f, 0.0f},  {0.7f, 0, 0.9f, 0.0f}, {1.0f, 40, 1.0f, 0.0f}, {0.8f, 40, 0.8f, 0.0f},
        {1.0f, 0, 1.0f, 0.05f}, {1.2f, 6000, 0.99f, 0.0f}, {0.0f, 0, 1.0f, 0.0f},
    };
    int failed = 0, dropped = 0;
    char why[256] = "";
    for (int c = 0; c < (int)(sizeof cfg / sizeof cfg[0]) && !failed; c++) {
        double t = cfg[c].t > 0 ? cfg[c].t : 1.0, m = x[order[0]];
        int lim = cfg[c].k > 0 ? cfg[c].k : n, nkeep = lim;
        double z = 0.0, cum = 0.0;
        for (int j = 0; j < lim; j++)
            z += exp(((double)x[order[j]] - m) / t);
        for (int j = 0; cfg[c].top_p < 1.0f && j < lim; j++) {
            cum += exp(((double)x[order[j]] - m) / t);
            if (cum >= (double)cfg[c].top_p * z) {
                nkeep = j + 1;
                break;
            }
        }
        while (nkeep > 1 && exp(((double)x[order[nkeep - 1]] - m) / t) < cfg[c].min_p)
            nkeep--;
        if (cfg[c].t == 0.0f)
            nkeep = 1;
        memset(kept, 0, n);
        double zk = 0.0;
        for (int j = 0; j < nkeep; j++) {
            kept[order[j]] = 1;
            zk += exp(((double)x[order[j]] - m) / t);
        }
        samp_params p = samp_default();
        p.temperature = cfg[c].t;
        p.top_k = cfg[c].k;
        p.top_p = cfg[c].top_p;
        p.min_p = cfg[c].min_p;
        p.seed = 500 + c;
        p.processed_logprobs = 1;
        p.logprobs_topk = 3;
        /* the first ranks, the kept set's edge, the tie, and tokens far down */
        int toks[] = {order[0], order[1], order[nkeep - 1], order[nkeep < n ? nkeep : n - 1], 10, 20, order[n / 2],
                      order[n - 1]};
        for (int q = 0; q < (int)(sizeof toks / sizeof toks[0]) && !failed; q++) {
            samp_result r;
            CHECK_OK(samp_score(&p, x, n, toks[q], s, &r));
            int rank = 0;
            for (int i = 0; i < n; i++)
                rank += x[i] >= x[toks[q]];
            double want = cfg[c].t == 0.0f ? 0.0 : ((double)x[toks[q]] - m) / t - log(zk);
            if (r.rank != rank)
                snprintf(why, sizeof why, "config %d token %d: rank %d, want %d", c, toks[q], r.rank, rank), failed = 1;
            else if (kept[toks[q]] && !(fabs(r.logprob_processed - want) < 1e-5))
                snprintf(why, sizeof why, "config %d token %d (kept): processed %.7f, want %.7f", c, toks[q],
                         r.logprob_processed, want), failed = 1;
            else if (!kept[toks[q]] && r.logprob_processed != -INFINITY)
                snprintf(why, sizeof why, "config %d token %d (dropped): processed %.7f, want -inf", c, toks[q],
                         r.logprob_processed), failed = 1;
            dropped += !kept[toks[q]];
        }
        for (uint32_t pos = 0; pos < 40 && !failed; pos++) {
            samp_result d, r;
            int tok = sample_or_die(&p, x, n, 1, pos, s, &d);
            CHECK_OK(samp_score(&p, x, n, tok, s, &r));
            if (memcmp(&d.logprob, &r.logprob, sizeof(float)) ||
                memcmp(&d.logprob_processed, &r.logprob_processed, sizeof(float)))
                snprintf(why, sizeof why, "config %d pos %u: drawn %.9g / %.9g, scored %.9g / %.9g", c, pos,
                         d.logprob, d.logprob_processed, r.logprob, r.logprob_processed), failed = 1;
        }
    }
    /* token_ids_logprob: each asked id's log-prob has the bits it has as the drawn token or an alternative */
    const int32_t want[4] = {order[0], order[3], 10, order[n - 1]};
    samp_params pw = samp_default();
    pw.seed = 9, pw.logprobs_topk = 5, pw.n_want = 4, pw.want_ids = want;
    for (uint32_t pos = 0; pos < 30 && !failed; pos++) {
        samp_result d;
        sample_or_die(&pw, x, n, 0, pos, s, &d);
        for (int j = 0; j < 4; j++) {
            if (want[j] == d.token && memcmp(&d.want_lps[j], &d.logprob, sizeof(float)))
                snprintf(why, sizeof why, "pos %u: want_lps[%d] %.9g, the draw's %.9g", pos, j, d.want_lps[j],
                         d.logprob), failed = 1;
            for (int q = 0; q < d.n_top; q++)
                if (d.top_ids[q] == want[j] && memcmp(&d.want_lps[j], &d.top_logprobs[q], sizeof(float)))
                    snprintf(why, sizeof why, "pos %u: want_lps[%d] %.9g, the alternative's %.9g", pos, j,
                             d.want_lps[j], d.top_logprobs[q]), failed = 1;
        }
    }
    double lsm[20000];
    ref_log_softmax(x, n, 1.0, lsm);
    samp_result w;
    CHECK_OK(samp_score(&pw, x, n, order[7], s, &w));
    for (int j = 0; j < 4; j++)
        CHECK(fabs(w.want_lps[j] - lsm[want[j]]) < 1e-5, "want %d: %.7f vs the reference %.7f", want[j],
              w.want_lps[j], lsm[want[j]]);
    const int32_t bad = n;
    pw.want_ids = &bad, pw.n_want = 1;
    CHECK(samp_score(&pw, x, n, order[7], s, &w) != 0, "an id outside the vocabulary is refused");
    samp_params raw = samp_default();
    samp_result r;
    CHECK_OK(samp_score(&raw, x, n, order[5], s, &r));
    CHECK(isnan(r.logprob_processed) && r.rank == 6, "raw scoring: processed %g (want NaN), rank %d (want 6)",
          r.logprob_processed, r.rank);
    free(x);
    free(order);
    free(kept);
    free(s);
    CHECK(!failed, "%s", why);
    CHECK(dropped >= 10, "only %d dropped tokens were scored", dropped);
}

/* ---- log-probs ---- */

static void test_raw_logprobs(void)
{
    const int n = 49152;
    float *x = malloc(sizeof(float) * n);
    double *lp = malloc(sizeof(double) * n), *lp7 = malloc(sizeof(double) * n);
    void *s = malloc(samp_scratch_bytes(n));
    CHECK(x && lp && lp7 && s, "malloc");
    normal_logits(x, n, 3.0, 7);
    ref_log_softmax(x, n, 1.0, lp);
    ref_log_softmax(x, n, (double)0.7f, lp7);
    samp_params p = samp_default();
    p.temperature = 0.7f;
    p.seed = 5;
    p.logprobs_topk = 20;
    p.processed_logprobs = 1;
    double worst = 0.0, worst_proc = 0.0, worst_alt = 0.0;
    int bad_order = 0;
    for (uint32_t pos = 0; pos < 20; pos++) {
        samp_result r;
        int t = sample_or_die(&p, x, n, 2, pos, s, &r);
        if (t < 0)
            break;
        worst = fmax(worst, fabs(r.logprob - lp[t]));
        worst_proc = fmax(worst_proc, fabs(r.logprob_processed - lp7[t]));
        if (r.n_top != 20)
            bad_order = 1;
        for (int j = 0; j < r.n_top; j++) {
            worst_alt = fmax(worst_alt, fabs(r.top_logprobs[j] - lp[r.top_ids[j]]));
            if (j > 0 && !(lp[r.top_ids[j - 1]] > lp[r.top_ids[j]]))
                bad_order = 1;
        }
        /* Nothing outside the list beats its last entry. */
        double last = lp[r.top_ids[r.n_top - 1]];
        for (int i = 0; i < n; i++) {
            int listed = 0;
            for (int j = 0; j < r.n_top; j++)
                listed |= r.top_ids[j] == i;
            if (!listed && lp[i] > last)
                bad_order = 1;
        }
    }
    free(x);
    free(lp);
    free(lp7);
    free(s);
    CHECK(worst < 1e-5, "raw logprob off by %.3g", worst);
    CHECK(worst_proc < 1e-5, "processed logprob (T=0.7, no cut) off by %.3g", worst_proc);
    CHECK(worst_alt < 1e-5, "alternative logprob off by %.3g", worst_alt);
    CHECK(!bad_order, "alternatives are not the 20 highest in descending order");
}

/* The alternatives (a heap that skips whole chunks) against a full sort, on
 * several vocabularies, including logits rounded to quarters so that many
 * tokens tie across chunk boundaries. */
static void test_alternatives_match_sort(void)
{
    const int n = 49152;
    float *x = malloc(sizeof(float) * n);
    int *order = malloc(sizeof(int) * n);
    void *s = malloc(samp_scratch_bytes(n));
    CHECK(x && order && s, "malloc");
    int bad = -1, bad_j = 0, got = 0, want = 0;
    for (int v = 0; v < 12 && bad < 0; v++) {
        int len = v % 3 == 0 ? n : 1000 + 3917 * v;
        normal_logits(x, len, v < 6 ? 3.0 : 1.0, 100 + v);
        if (v >= 6)
            for (int i = 0; i < len; i++)
                x[i] = roundf(x[i] * 4.0f) / 4.0f;
        if (v % 4 == 1)
            for (int i = 0; i < len; i += 3)
                x[i] = -INFINITY;
        for (int i = 0; i < len; i++)
            order[i] = i;
        qsort_r(order, len, sizeof(int), cmp_rank, x);
        samp_params p = samp_default();
        p.logprobs_topk = 20;
        p.temperature = 0.0f;
        samp_result r;
        if (sample_or_die(&p, x, len, 0, 0, s, &r) < 0 || r.n_top != 20) {
            bad = v;
            break;
        }
        for (int j = 0; j < 20; j++) {
            if (r.top_ids[j] != order[j]) {
                bad = v, bad_j = j, got = r.top_ids[j], want = order[j];
                break;
            }
        }
    }
    CHECK(bad < 0, "vocab %d: alternative %d is token %d, want %d", bad, bad_j, got, want);
    /* One ulp decides: a later chunk's max barely above the best so far must
     * still be looked at, and an exact tie must not displace the earlier. */
    for (int i = 0; i < 300; i++)
        x[i] = -1.0f;
    x[10] = 5.0f;
    x[200] = nextafterf(5.0f, INFINITY);
    x[250] = 5.0f;
    samp_params p = samp_default();
    p.logprobs_topk = 2;
    p.top_k = 1;
    samp_result r;
    int t = sample_or_die(&p, x, 300, 0, 0, s, &r);
    free(x);
    free(order);
    free(s);
    CHECK(t == 200, "top_k 1 chose %d, want 200", t);
    CHECK(r.n_top == 2 && r.top_ids[0] == 200 && r.top_ids[1] == 10, "alternatives %d: %d %d",
          r.n_top, r.top_ids[0], r.top_ids[1]);
}

static void test_processed_flag_and_alternative_ties(void)
{
    const float x[6] = {1.0f, 3.0f, 3.0f, 2.0f, 3.0f, -INFINITY};
    void *s = malloc(samp_scratch_bytes(6));
    CHECK(s, "malloc");
    samp_params p = samp_default();
    p.logprobs_topk = 6;
    samp_result r;
    int t = sample_or_die(&p, x, 6, 0, 0, s, &r);
    free(s);
    CHECK(t >= 0, "sample");
    CHECK(isnan(r.logprob_processed), "processed logprob not asked for, got %g",
          r.logprob_processed);
    /* Ties go to the lower id; the masked token is not listed. */
    const int want[5] = {1, 2, 4, 3, 0};
    CHECK(r.n_top == 5, "n_top %d, want 5", r.n_top);
    for (int j = 0; j < 5; j++)
        CHECK(r.top_ids[j] == want[j], "top_ids[%d] = %d, want %d", j, r.top_ids[j], want[j]);
}

static void test_greedy(void)
{
    const float x[7] = {0.5f, 2.0f, 1.0f, 2.0f, -3.0f, 2.0f, 1.9999f};
    double lp[7];
    ref_log_softmax(x, 7, 1.0, lp);
    void *s = malloc(samp_scratch_bytes(7));
    CHECK(s, "malloc");
    samp_params p = samp_default();
    p.temperature = 0.0f;
    p.processed_logprobs = 1;
    p.top_k = 3; /* ignored by greedy */
    p.top_p = 0.1f;
    samp_result r;
    int t = 1;
    for (uint32_t pos = 0; pos < 100 && t == 1; pos++) {
        p.seed = pos * 31;
        t = sample_or_die(&p, x, 7, pos, pos, s, &r);
        if (t == 1 && !(r.logprob_processed == 0.0f && fabs(r.logprob - lp[1]) < 1e-6))
            t = -2;
    }
    /* A positive but tiny temperature samples only among the tied maxima
     * (1, 3, 5), each with processed log-prob log(1/3), and never NaNs. */
    p.temperature = 1e-30f;
    p.top_k = 0;
    p.top_p = 1.0f;
    int tiny_ok = 1, seen[7] = {0};
    samp_result q;
    for (uint32_t pos = 0; pos < 300; pos++) {
        int tt = sample_or_die(&p, x, 7, 0, pos, s, &q);
        if (tt < 0 || tt % 2 == 0 || tt > 5 || !(fabs(q.logprob_processed + log(3.0)) < 1e-6))
            tiny_ok = 0;
        else
            seen[tt] = 1;
    }
    free(s);
    CHECK(t == 1, "greedy gave token %d (want 1; -2 = wrong log-probs: processed %g, logprob %g"
          " vs %g)", t, r.logprob_processed, r.logprob, lp[1]);
    /* Ties far apart in a long vocab still go to the lowest index. */
    const int n = 5000;
    float *y = malloc(sizeof(float) * n);
    void *sy = malloc(samp_scratch_bytes(n));
    CHECK(y && sy, "malloc");
    normal_logits(y, n, 1.0, 21);
    y[4321] = y[130] = y[2999] = 9.0f;
    p.temperature = 0.0f;
    int ty = sample_or_die(&p, y, n, 0, 0, sy, &r);
    free(y);
    free(sy);
    CHECK(ty == 130, "greedy over 5000 tokens with tied maxima at 130, 2999, 4321 gave %d", ty);
    CHECK(tiny_ok && seen[1] && seen[3] && seen[5], "temperature 1e-30: token %d processed %g",
          q.token, q.logprob_processed);
}

/* ---- validation and masked logits ---- */

static void test_validation(void)
{
    samp_params d = samp_default();
    CHECK_OK(samp_validate(&d));
    CHECK(d.temperature == 1.0f && d.top_k == 0 && d.top_p == 1.0f && d.min_p == 0.0f &&
              d.seed == 0 && d.logprobs_topk == 0 && d.processed_logprobs == 0,
          "defaults");
    struct { samp_params p; const char *field; } bad[10];
    for (int i = 0; i < 10; i++)
        bad[i].p = d;
    bad[0].p.temperature = NAN, bad[0].field = "temperature";
    bad[1].p.temperature = INFINITY, bad[1].field = "temperature";
    bad[2].p.temperature = -0.5f, bad[2].field = "temperature";
    bad[3].p.top_p = 0.0f, bad[3].field = "top_p";
    bad[4].p.top_p = 1.5f, bad[4].field = "top_p";
    bad[5].p.top_p = NAN, bad[5].field = "top_p";
    bad[6].p.min_p = 1.5f, bad[6].field = "min_p";
    bad[7].p.top_k = -1, bad[7].field = "top_k";
    bad[8].p.logprobs_topk = 21, bad[8].field = "logprobs_topk";
    bad[9].p.logprobs_topk = -1, bad[9].field = "logprobs_topk";
    float x[4] = {0, 1, 2, 3};
    char scratch[64] __attribute__((aligned(8)));
    for (int i = 0; i < 10; i++) {
        rd_fail(0, "%s", "");
        int rc = samp_validate(&bad[i].p);
        CHECK(rc == RD_EINVAL, "case %d (%s) returned %d", i, bad[i].field, rc);
        CHECK(strstr(rd_errmsg(), bad[i].field) != NULL, "case %d message '%s' lacks '%s'", i,
              rd_errmsg(), bad[i].field);
        samp_result r;
        CHECK(samp_sample(&bad[i].p, x, 4, 0, 0, scratch, &r) == RD_EINVAL,
              "samp_sample accepted case %d", i);
    }
    /* Bad logits. */
    samp_result r;
    float nan_x[4] = {0, NAN, 1, 2}, inf_x[4] = {0, 1, INFINITY, 2};
    float masked[4] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY};
    CHECK(samp_sample(&d, nan_x, 4, 0, 0, scratch, &r) == RD_EINVAL, "NaN logit accepted");
    CHECK(strstr(rd_errmsg(), "logits[1]") != NULL, "message '%s'", rd_errmsg());
    CHECK(samp_sample(&d, inf_x, 4, 0, 0, scratch, &r) == RD_EINVAL, "+inf logit accepted");
    CHECK(samp_sample(&d, masked, 4, 0, 0, scratch, &r) == RD_EINVAL, "all -inf accepted");
    CHECK(rd_errmsg()[0] != 0, "empty message");
    CHECK(samp_sample(&d, x, 0, 0, 0, scratch, &r) == RD_EINVAL, "vocab 0 accepted");
    CHECK(samp_sample(&d, x, 4, 0, 0, scratch + 1, &r) == RD_EINVAL, "misaligned scratch");
}

static void test_masked_logits(void)
{
    /* Every other token masked, plus a masked one that would dominate. */
    const int n = 64;
    float x[64];
    normal_logits(x, n, 1.0, 9);
    for (int i = 0; i < n; i += 2)
        x[i] = -INFINITY;
    void *s = malloc(samp_scratch_bytes(n));
    CHECK(s, "malloc");
    struct { float t; int k; float top_p, min_p; } cfg[] = {
        {1.0f, 0, 1.0f, 0.0f}, {5.0f, 0, 1.0f, 0.0f},  {50.0f, 0, 0.99f, 0.0f},
        {1.0f, 60, 1.0f, 0.0f}, {3.0f, 0, 1.0f, 0.01f}, {0.0f, 0, 1.0f, 0.0f},
    };
    int bad = -1;
    samp_result r;
    for (int c = 0; c < 6 && bad < 0; c++) {
        samp_params p = samp_default();
        p.temperature = cfg[c].t;
        p.top_k = cfg[c].k;
        p.top_p = cfg[c].top_p;
        p.min_p = cfg[c].min_p;
        p.logprobs_topk = 20;
        for (uint32_t pos = 0; pos < 5000 && bad < 0; pos++) {
            int t = sample_or_die(&p, x, n, 0, pos, s, &r);
            if (t < 0 || t % 2 == 0 || !isfinite(r.logprob))
                bad = c;
            for (int j = 0; j < r.n_top; j++)
                if (r.top_ids[j] % 2 == 0)
                    bad = c;
        }
    }
    CHECK(bad < 0, "config %d drew or listed a masked token (%d)", bad, r.token);

    /* All masked but one: that token, with log-prob 0, on every path. */
    for (int i = 0; i < n; i++)
        x[i] = -INFINITY;
    x[37] = -5.0f;
    struct { float t; int k; float top_p; } one[] = {
        {1.0f, 0, 1.0f}, {0.0f, 0, 1.0f}, {0.5f, 3, 1.0f}, {2.0f, 0, 0.5f}, {1.0f, 10, 0.9f},
    };
    for (int c = 0; c < 5; c++) {
        samp_params p = samp_default();
        p.temperature = one[c].t;
        p.top_k = one[c].k;
        p.top_p = one[c].top_p;
        p.processed_logprobs = 1;
        p.logprobs_topk = 5;
        for (uint32_t pos = 0; pos < 50; pos++) {
            int t = sample_or_die(&p, x, n, 0, pos, s, &r);
            CHECK(t == 37 && r.logprob == 0.0f && r.logprob_processed == 0.0f,
                  "config %d: token %d logprob %g processed %g", c, t, r.logprob,
                  r.logprob_processed);
            CHECK(r.n_top == 1 && r.top_ids[0] == 37 && r.top_logprobs[0] == 0.0f,
                  "config %d: alternatives n_top %d", c, r.n_top);
        }
    }
    free(s);
}

/* Logit edits (issue 44): samp_apply_edits writes vLLM's definitions (checked here against the
 * formulas written out by hand, in double where every step is exact), and samp_sample_ex draws from
 * the edited row while the raw log-prob and the alternatives stay those of the raw row; with no
 * edited row it is samp_sample bit for bit. */
static void test_edits(void)
{
    const int n = 300;
    float x[300], proc[300];
    normal_logits(x, n, 2.0, 31);
    x[5] = 0.0f;
    samp_params p = samp_default();
    p.repetition_penalty = 1.25f, p.frequency_penalty = 0.5f, p.presence_penalty = 0.75f;
    samp_edit ed[6];
    memset(ed, 0, sizeof ed);
    ed[0] = (samp_edit){.token = 3, .seen = 1};                 /* prompt only: repetition */
    ed[1] = (samp_edit){.token = 7, .seen = 1, .n_out = 3};     /* output: all three */
    ed[2] = (samp_edit){.token = 11, .bias = 4.0f};             /* bias alone */
    ed[3] = (samp_edit){.token = 13, .mask = 1, .seen = 1};     /* masked stays -inf */
    ed[4] = (samp_edit){.token = 5, .seen = 1};                 /* a zero logit: multiplied, stays 0 */
    ed[5] = (samp_edit){.token = 299, .bias = -2.5f, .seen = 1, .n_out = 1};
    samp_apply_edits(&p, x, n, ed, 6, proc);
    for (int i = 0; i < n; i++) {
        double want = x[i];
        for (int j = 0; j < 6; j++) {
            if (ed[j].token != i)
                continue;
            float v = x[i] + ed[j].bias;
            if (ed[j].mask)
                v = -INFINITY;
            if (ed[j].seen)
                v = v > 0 ? v / 1.25f : v * 1.25f;
            v = v - 0.5f * (float)ed[j].n_out;
            if (ed[j].n_out)
                v = v - 0.75f;
            want = v;
        }
        CHECK(proc[i] == (float)want || (isinf(proc[i]) && isinf(want)), "token %d: %g, want %g", i, proc[i], want);
    }
    CHECK(isinf(proc[13]) && proc[13] < 0 && proc[5] == 0.0f, "mask %g, zero %g", proc[13], proc[5]);

    void *s = malloc(samp_scratch_bytes(n));
    CHECK(s, "malloc");
    samp_result a, b;
    /* No edited row: samp_sample, bit for bit, for greedy and sampled draws. */
    for (int c = 0; c < 2; c++) {
        samp_params q = samp_default();
        q.temperature = c ? 0.8f : 0.0f, q.top_k = 50, q.logprobs_topk = 5, q.processed_logprobs = 1;
        for (uint32_t pos = 0; pos < 50; pos++) {
            CHECK(samp_sample(&q, x, n, 1, pos, s, &a) == 0 && samp_sample_ex(&q, x, NULL, n, 1, pos, s, &b) == 0,
                  "sample: %s", rd_errmsg());
            CHECK(!memcmp(&a, &b, sizeof a), "samp_sample_ex without edits differs at %u", pos);
        }
    }
    /* Greedy on the edited row: the argmax moves to the biased token; its raw log-prob is the raw row's. */
    float y[300];
    memcpy(y, x, sizeof y);
    int top = 0;
    for (int i = 1; i < n; i++)
        top = x[i] > x[top] ? i : top;
    samp_edit push = {.token = 42, .bias = 100.0f};
    samp_apply_edits(&p, x, n, &push, 1, y);
    samp_params g = samp_default();
    g.temperature = 0, g.logprobs_topk = 3, g.processed_logprobs = 1;
    CHECK(samp_sample_ex(&g, x, y, n, 0, 0, s, &b) == 0 && samp_sample(&g, x, n, 0, 0, s, &a) == 0, "greedy");
    double raw[300];
    ref_log_softmax(x, n, 1.0, raw);
    CHECK(b.token == 42 && a.token == top, "greedy on the edited row: %d (raw argmax %d)", b.token, top);
    CHECK(fabs(b.logprob - raw[42]) < 1e-5 && b.logprob_processed == 0.0f, "raw log-prob %g, want %g", b.logprob,
          raw[42]);
    CHECK(b.n_top == 3 && b.top_ids[0] == top && !memcmp(b.top_ids, a.top_ids, sizeof a.top_ids),
          "alternatives come from the raw row");
    /* Sampled: a masked token is never drawn, and the processed log-prob is the edited row's. */
    samp_params t = samp_default();
    t.temperature = 1.0f, t.processed_logprobs = 1;
    samp_edit ban = {.token = top, .mask = 1};
    samp_apply_edits(&t, x, n, &ban, 1, y);
    double lp_edit[300];
    ref_log_softmax(y, n, 1.0, lp_edit);
    for (uint32_t pos = 0; pos < 2000; pos++) {
        CHECK(samp_sample_ex(&t, x, y, n, 2, pos, s, &b) == 0, "draw: %s", rd_errmsg());
        CHECK(b.token != top, "drew the masked token at %u", pos);
        CHECK(fabs(b.logprob_processed - lp_edit[b.token]) < 1e-5 && fabs(b.logprob - raw[b.token]) < 1e-5,
              "token %d: processed %g want %g, raw %g want %g", b.token, b.logprob_processed, lp_edit[b.token],
              b.logprob, raw[b.token]);
    }
    /* Penalty ranges. */
    samp_params bad = samp_default();
    bad.repetition_penalty = 0.0f;
    CHECK(samp_validate(&bad) == RD_EINVAL && strstr(rd_errmsg(), "repetition_penalty"), "rep 0 accepted");
    bad = samp_default(), bad.frequency_penalty = 2.5f;
    CHECK(samp_validate(&bad) == RD_EINVAL && strstr(rd_errmsg(), "frequency_penalty"), "freq 2.5 accepted");
    bad = samp_default(), bad.presence_penalty = NAN;
    CHECK(samp_validate(&bad) == RD_EINVAL && strstr(rd_errmsg(), "presence_penalty"), "presence NaN accepted");
    free(s);
}

int main(void)
{
    RUN(test_philox_known_answers);
    RUN(test_uniform_range_and_mean);
    RUN(test_streams_and_determinism);
    RUN(test_chisq_temperature_1);
    RUN(test_chisq_temperature_07);
    RUN(test_top_k_support);
    RUN(test_top_p_support);
    RUN(test_min_p_support);
    RUN(test_truncation_matches_reference);
    RUN(test_raw_logprobs);
    RUN(test_alternatives_match_sort);
    RUN(test_processed_flag_and_alternative_ties);
    RUN(test_greedy);
    RUN(test_validation);
    RUN(test_masked_logits);
    RUN(test_edits);
    RUN(test_score);
    TEST_EXIT();
}
