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
    CHECK(spec_cost_depth(spec_cost_row_share(&c, 4), 0.1, 6) == 6, "unfitted: the room is not the depth");
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
    /* p = 0.5: 0.5, 0.25, 0.125 > 0.0909; 0.0625 is not: depth 3 */
    CHECK(spec_cost_depth(share, 0.5, 6) == 3, "depth %d at p 0.5", spec_cost_depth(share, 0.5, 6));
    CHECK(spec_cost_depth(share, 0.5, 2) == 2, "depth past the room");
    CHECK(spec_cost_depth(share, 0.05, 6) == 0, "a draft kept 5%% of the time pays at share %.3f", share);
    CHECK(spec_cost_depth(share, 1.0, 6) == 6, "drafts always kept: depth %d", spec_cost_depth(share, 1.0, 6));
    /* 64 rows: 3.2e6 / 5.2e6 = 0.615: only a draft kept more often than that */
    const double big = spec_cost_row_share(&c, 64);
    CHECK(spec_cost_depth(big, 0.6, 6) == 0 && spec_cost_depth(big, 0.7, 6) == 1 && spec_cost_depth(big, 0.9, 6) == 4,
          "share %.3f: depths %d %d %d", big, spec_cost_depth(big, 0.6, 6), spec_cost_depth(big, 0.7, 6),
          spec_cost_depth(big, 0.9, 6));
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

int main(void)
{
    RUN(test_unfitted);
    RUN(test_fit_line);
    RUN(test_drift);
    RUN(test_clamps);
    TEST_EXIT();
}
