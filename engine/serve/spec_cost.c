/* spec_cost.c - the step-time model speculation is planned with (see spec_cost.h). */
#include "engine/serve/spec_cost.h"

#include <math.h>
#include <string.h>

/* A row count's mean weighs its last SPEC_COST_WINDOW steps about equally:
 * the machine's load drifts, and an old mean should not outvote it. */
#define SPEC_COST_WINDOW 16

void spec_cost_init(spec_cost *c)
{
    memset(c, 0, sizeof *c);
}

/* Weighted least squares of t_ns[M] = a + b M over the measured M, weights
 * n[M]. Noise can tilt a fit of few points: b < 0 is taken as 0 (rows look
 * free), a < 0 as no fit (every step has a fixed part). */
static void refit(spec_cost *c)
{
    double sw = 0, sm = 0, st = 0, smm = 0, smt = 0;
    int32_t counts = 0;
    for (int32_t m = 1; m <= SPEC_COST_MAX_ROWS; m++) {
        if (!c->n[m])
            continue;
        const double w = c->n[m], t = c->t_ns[m];
        sw += w, sm += w * m, st += w * t, smm += w * m * m, smt += w * m * t;
        counts++;
    }
    const double det = sw * smm - sm * sm;
    if (counts < 2 || det <= 0) {
        c->fitted = 0;
        return;
    }
    double b = (sw * smt - sm * st) / det, a = (st - b * sm) / sw;
    if (b < 0) { /* flat or noisy: every row is free, as far as the data says */
        b = 0;
        a = st / sw;
    }
    if (a < 0) { /* no step costs less than its rows: noise, not a machine; no judgement yet */
        c->fitted = 0;
        return;
    }
    c->a_ns = a, c->b_ns = b, c->fitted = 1;
}

void spec_cost_observe(spec_cost *c, int32_t rows, int64_t ns)
{
    if (rows < 1 || rows > SPEC_COST_MAX_ROWS || ns <= 0)
        return;
    if (c->n[rows] < SPEC_COST_WINDOW)
        c->n[rows]++;
    c->t_ns[rows] += ((double)ns - c->t_ns[rows]) / c->n[rows];
    refit(c);
}

double spec_cost_row_share(const spec_cost *c, int32_t rows)
{
    if (!c->fitted)
        return -1.0;
    const double br = c->b_ns * rows, t = c->a_ns + br;
    return t > 0 ? br / t : 1.0;
}

int32_t spec_cost_depth(double share, double p, int32_t room)
{
    if (share < 0) /* no fit yet: one draft, enough to time a step of more rows (and cheap if it is lost) */
        return room < 1 ? room : 1;
    int32_t j = 0;
    double pj = p;
    while (j < room && pj > SPEC_COST_MARGIN * share) {
        j++;
        pj *= p;
    }
    return j;
}

/* Each update weighs the old totals by 1 - 1/256 per position. */
#define SPEC_KEEP_DECAY (1.0 / 256.0)

void spec_cost_keep(spec_cost *c, int greedy, int32_t hits, int32_t tries)
{
    if (tries <= 0)
        return;
    const double keep = pow(1.0 - SPEC_KEEP_DECAY, tries);
    const int k = greedy != 0;
    c->keep_hits[k] = c->keep_hits[k] * keep + hits;
    c->keep_tries[k] = c->keep_tries[k] * keep + tries;
}

double spec_cost_keep_p(const spec_cost *c, int greedy)
{
    const int k = greedy != 0;
    return c->keep_tries[k] > 0 ? c->keep_hits[k] / c->keep_tries[k] : 1.0;
}
