/* test.h - a minimal test harness shared by the unit tests.
 *
 * Each test binary runs its cases with RUN(fn); a case fails on the first
 * CHECK that does not hold. Output is one "PASS name" or "FAIL name: why" line
 * per case, which tests/run.sh counts; the exit status is non-zero if any
 * case failed. */
#ifndef RD_TEST_H
#define RD_TEST_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static int test_failed_cases;
static int test_case_failed;
static char test_why[512];

#define CHECK(cond, ...)                                                          \
    do {                                                                          \
        if (!(cond)) {                                                            \
            int n_ = snprintf(test_why, sizeof test_why, "%s:%d: %s: ", __FILE__, \
                              __LINE__, #cond);                                   \
            if (n_ > 0 && (size_t)n_ < sizeof test_why)                           \
                snprintf(test_why + n_, sizeof test_why - n_, __VA_ARGS__);       \
            test_case_failed = 1;                                                 \
            return;                                                               \
        }                                                                         \
    } while (0)

#define CHECK_OK(expr)                                                            \
    do {                                                                          \
        int rc_ = (expr);                                                         \
        CHECK(rc_ == 0, "returned %d (%s)", rc_, rd_errmsg());                    \
    } while (0)

/* Wall seconds since an arbitrary start: each PASS line says what its case took,
 * so the suite's slow cases can be found (tests/run.sh prints each file's total). */
static inline double test_now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

#define RUN(fn)                                                                   \
    do {                                                                          \
        test_case_failed = 0;                                                     \
        test_why[0] = 0;                                                          \
        const double t0_ = test_now_s();                                          \
        fn();                                                                     \
        if (test_case_failed) {                                                   \
            test_failed_cases++;                                                  \
            printf("FAIL %s: %s\n", #fn, test_why);                               \
        } else {                                                                  \
            printf("PASS %s (%.1f s)\n", #fn, test_now_s() - t0_);                \
        }                                                                         \
        fflush(stdout);                                                           \
    } while (0)

#define TEST_EXIT() return test_failed_cases ? 1 : 0

#endif
