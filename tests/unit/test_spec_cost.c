/* test_spec_cost.c - the step-time model speculation is planned with
 * (engine/serve/spec_cost.h): the fit against the line the observations
 * were drawn from, the row share, and the depth of drafts that pay, worked
 * out here by hand. */
#include <math.h>

#include "engine/serve/spec_cost.h"
#include "tests/unit/test.h"

/* Observations on T = a + b M (ns) at the given row counts, reps each. */
static void feed(spec_cost *c, double a, double b, const int32_t *ms, int n, int reps)
{
    for (int r = 0; r < reps; r++)
        for (int i = 0; i < n; i++)
            spec_cost_observe(c, ms[i], (int64_t)llround(a + b * ms[i]));
}

static void test_unfitted(void)
{
    spec_cost c;
    spec_cost_init(&c);
    CHECK(spec_cost_row_share(&c, 4) < 0, "a fresh model has a share");
    CHECK(spec_cost_depth(spec_cost_row_share(&c, 4), 0.9, 6) == 1, "unfitted: more than one draft to learn from");
    CHECK(spec_cost_depth(spec_cost_row_share(&c, 4), 0.9, 0) == 0, "unfitted: a draft without room");
    const int32_t one[1] = {3};
    feed(&c, 1e6, 1e4, one, 1, 20);
    CHECK(spec_cost_row_share(&c, 3) < 0, "one row count cannot give a slope");
    spec_cost_observe(&c, 0, 5000000);   /* not a step */
    spec_cost_observe(&c, SPEC_COST_MAX_ROWS + 1, 5000000);
    spec_cost_observe(&c, 5, 0);
    CHECK(spec_cost_row_share(&c, 3) < 0, "out-of-range observations were recorded");
}

static void test_fit_line(void)
{
    spec_cost c;
    spec_cost_init(&c);
    const int32_t ms[3] = {1, 5, 9};
    feed(&c, 2e6, 5e4, ms, 3, 3);
    CHECK(c.fitted, "three row counts, not fitted");
    CHECK(fabs(c.a_ns - 2e6) < 1.0 && fabs(c.b_ns - 5e4) < 0.01, "fit a %.3f b %.5f, want 2e6 and 5e4", c.a_ns,
          c.b_ns);
    /* share at 4 rows: 4 b / (a + 4 b) = 2e5 / 2.2e6 */
    const double share = spec_cost_row_share(&c, 4);
    CHECK(fabs(share - 2e5 / 2.2e6) < 1e-9, "share %.9f, want %.9f", share, 2e5 / 2.2e6);
    /* p = 0.5: 0.5, 0.25, 0.125 > 1.25 * 0.0909 = 0.1136; 0.0625 is not: depth 3 */
    CHECK(spec_cost_depth(share, 0.5, 6) == 3, "depth %d at p 0.5", spec_cost_depth(share, 0.5, 6));
    CHECK(spec_cost_depth(share, 0.5, 2) == 2, "depth past the room");
    CHECK(spec_cost_depth(share, 0.05, 6) == 0, "a draft kept 5%% of the time pays at share %.3f", share);
    CHECK(spec_cost_depth(share, 1.0, 6) == 6, "drafts always kept: depth %d", spec_cost_depth(share, 1.0, 6));
    /* 64 rows: 3.2e6 / 5.2e6 = 0.615, with the margin 0.769: p 0.7 gives none, 0.8 one (0.64 is short),
       0.9 two (0.9, 0.81; 0.729 is short), 0.95 five (0.774; 0.735 is short) */
    const double big = spec_cost_row_share(&c, 64);
    CHECK(spec_cost_depth(big, 0.7, 6) == 0 && spec_cost_depth(big, 0.8, 6) == 1 && spec_cost_depth(big, 0.9, 6) == 2 &&
              spec_cost_depth(big, 0.95, 6) == 5,
          "share %.3f: depths %d %d %d %d", big, spec_cost_depth(big, 0.7, 6), spec_cost_depth(big, 0.8, 6),
          spec_cost_depth(big, 0.9, 6), spec_cost_depth(big, 0.95, 6));
    /* Break-even is not enough: p = 0.62 just above the share, under share * margin. */
    CHECK(spec_cost_depth(big, 0.62, 6) == 0, "a draft at break-even was verified");
}

/* The machine gets slower per row: the means follow within a window of steps. */
static void test_drift(void)
{
    spec_cost c;
    spec_cost_init(&c);
    const int32_t ms[2] = {2, 10};
    feed(&c, 1e6, 1e4, ms, 2, 40);
    const double before = spec_cost_row_share(&c, 8);
    feed(&c, 1e6, 1e5, ms, 2, 40);
    const double after = spec_cost_row_share(&c, 8);
    CHECK(fabs(before - 8e4 / 1.08e6) < 1e-6, "share before %.6f", before);
    CHECK(after > 0.4 && after <= 8e5 / 1.8e6 + 1e-9, "share after the drift %.6f (the new line gives %.6f)", after,
          8e5 / 1.8e6);
}

/* Noise that tilts the line: rows never look cheaper than free, and a
 * negative fixed part is no fit at all. */
static void test_clamps(void)
{
    spec_cost c;
    spec_cost_init(&c);
    spec_cost_observe(&c, 1, 3000000);
    spec_cost_observe(&c, 8, 2000000); /* slower at fewer rows */
    CHECK(c.fitted && c.b_ns == 0 && c.a_ns > 0, "a falling line: a %.1f b %.1f", c.a_ns, c.b_ns);
    CHECK(spec_cost_row_share(&c, 8) == 0 && spec_cost_depth(0, 0.3, 5) == 5, "free rows: every draft pays");
    spec_cost_init(&c);
    spec_cost_observe(&c, 2, 1000000);
    spec_cost_observe(&c, 4, 3000000); /* the line crosses zero before 1 row: no machine does that */
    CHECK(!c.fitted && spec_cost_row_share(&c, 4) < 0, "a negative intercept was taken as a fit");
    CHECK(spec_cost_depth(1.0, 0.99, 5) == 0, "a share of 1: a draft pays");
}

/* The engine-wide keep rate a new sampled sequence starts from. */
static void test_keep_rate(void)
{
    spec_cost c;
    spec_cost_init(&c);
    CHECK(spec_cost_keep_p(&c, 0) == 1.0, "no drafts yet: rate %.3f, want 1", spec_cost_keep_p(&c, 0));
    spec_cost_keep(&c, 0, 3, 4);
    CHECK(fabs(spec_cost_keep_p(&c, 0) - 0.75) < 1e-12, "3 of 4: rate %.6f", spec_cost_keep_p(&c, 0));
    spec_cost_keep(&c, 0, 0, 0); /* nothing compared: nothing learned */
    CHECK(fabs(spec_cost_keep_p(&c, 0) - 0.75) < 1e-12, "an empty step moved the rate to %.6f", spec_cost_keep_p(&c, 0));
    spec_cost_keep(&c, 0, 0, 4);
    const double k4 = pow(1.0 - 1.0 / 256.0, 4), want = 3 * k4 / (4 * k4 + 4);
    CHECK(fabs(spec_cost_keep_p(&c, 0) - want) < 1e-12, "then 0 of 4: rate %.9f, want %.9f", spec_cost_keep_p(&c, 0), want);
    /* A phase of easy drafts, then one of hard ones: the rate follows within a few hundred positions. */
    for (int i = 0; i < 500; i++)
        spec_cost_keep(&c, 0, 4, 4);
    CHECK(spec_cost_keep_p(&c, 0) > 0.99, "after 2000 kept: %.4f", spec_cost_keep_p(&c, 0));
    for (int i = 0; i < 1000; i++)
        spec_cost_keep(&c, 0, 1, 2);
    CHECK(fabs(spec_cost_keep_p(&c, 0) - 0.5) < 0.01, "after 2000 at half: %.4f", spec_cost_keep_p(&c, 0));
}

/* Greedy and sampled sequences keep their own rates: greedy evaluations beside a
 * temperature-1 round leave its rate alone, and the other way round. */
static void test_keep_rate_by_draw(void)
{
    spec_cost c;
    spec_cost_init(&c);
    for (int i = 0; i < 100; i++) {
        spec_cost_keep(&c, 1, 6, 6); /* greedy: every draft kept */
        spec_cost_keep(&c, 0, 1, 3); /* sampled: one in three */
    }
    CHECK(fabs(spec_cost_keep_p(&c, 1) - 1.0) < 1e-12, "greedy rate %.6f, want 1", spec_cost_keep_p(&c, 1));
    CHECK(fabs(spec_cost_keep_p(&c, 0) - 1.0 / 3.0) < 1e-12, "sampled rate %.6f, want 1/3", spec_cost_keep_p(&c, 0));
    spec_cost_init(&c);
    spec_cost_keep(&c, 1, 0, 5);
    CHECK(spec_cost_keep_p(&c, 0) == 1.0 && spec_cost_keep_p(&c, 1) == 0.0, "greedy misses moved the sampled rate: "
          "%.3f / %.3f", spec_cost_keep_p(&c, 0), spec_cost_keep_p(&c, 1));
}

int main(void)
{
    RUN(test_unfitted);
    RUN(test_fit_line);
    RUN(test_drift);
    RUN(test_clamps);
    RUN(test_keep_rate);
    RUN(test_keep_rate_by_draw);
    TEST_EXIT();
}
