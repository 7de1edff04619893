/* clock.h - the one monotonic clock for timings and timeouts. CLOCK_MONOTONIC
 * never steps when the wall clock is set, so differences are durations. */
#ifndef RD_CLOCK_H
#define RD_CLOCK_H

#include <stdint.h>

/* Seconds, for timings printed by the tools and tests. */
double clock_now_s(void);

/* Whole microseconds and nanoseconds, for stamps and sums kept as integers. */
int64_t clock_now_us(void);
int64_t clock_now_ns(void);

#endif
