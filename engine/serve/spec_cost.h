/* spec_cost.h - whether a drafted token pays, from the engine's own step times.
 *
 * A decode step's time grows with its rows: T(M) ~ a + b M, where a is what
 * every step pays once (reading the weights, launching the kernels) and b is
 * a row's share (its arithmetic, its LM head row, its draw). spec_cost keeps a
 * running mean of the measured time of decode and verify steps (steps with no
 * prompt rows) for each row count M up to SPEC_COST_MAX_ROWS, and fits a and
 * b to those means by least squares.
 *
 * A step of B sequences makes about B tokens in a + b B. A draft at depth j
 * of a sequence whose drafts are each kept with probability p adds a row
 * (b) and yields p^j tokens on average, so it pays when
 *     p^j > b B / (a + b B)        (the row share of a B-row step).
 * A draft is verified only when it is expected to return SPEC_COST_MARGIN
 * times its row: the fit is of means over a noisy machine, and a draft that
 * only breaks even buys nothing and risks a loss.
 * On a model whose step is mostly the weights' bytes the share is small at
 * batch 1 and drafts pay; where rows are what a step costs (larger batches, a
 * 262,144-row head, a temperature-1 draw per row on the CPU) the share nears
 * 1 and few drafts do. Only time depends on it: speculation never changes
 * what is sampled. */
#ifndef RD_SPEC_COST_H
#define RD_SPEC_COST_H

#include <stdint.h>

#define SPEC_COST_MAX_ROWS 128
#define SPEC_COST_MARGIN 1.25   /* a draft's expected tokens over its row's share, at least */

typedef struct {
    double t_ns[SPEC_COST_MAX_ROWS + 1]; /* running mean time of a step of M rows, ns */
    int32_t n[SPEC_COST_MAX_ROWS + 1];   /* steps measured at M rows (counts up to SPEC_COST_WINDOW) */
    double a_ns, b_ns;                   /* the last fit: T(M) = a + b M, both >= 0 */
    int fitted;                          /* 1: a and b come from at least two row counts (and a >= 0) */
    double keep_hits[2], keep_tries[2];  /* drafts kept / positions compared, decayed; [1]: greedy sequences,
                                            [0]: sampled ones (a greedy draw keeps far more drafts) */
} spec_cost;

void spec_cost_init(spec_cost *c);

/* A decode or verify step of rows rows took ns (steps with prompt rows, or
 * more rows than SPEC_COST_MAX_ROWS, are not recorded). */
void spec_cost_observe(spec_cost *c, int32_t rows, int64_t ns);

/* b rows / (a + b rows), in 0..1; -1 until the fit has two row counts. */
double spec_cost_row_share(const spec_cost *c, int32_t rows);

/* The drafts worth verifying for a sequence whose drafts are kept with
 * probability p each, in a step whose row share is share: the largest j <=
 * room with p^j > SPEC_COST_MARGIN * share. With no fit yet (share < 0), at
 * most 1: a step of a new row count for the fit, at the least cost. */
int32_t spec_cost_depth(double share, double p, int32_t room);

/* A verify step compared tries drafted positions of a greedy (greedy = 1) or
 * sampled (0) sequence and kept hits of them: the engine-wide keep rate of
 * that kind of sequence, which a new one starts from, so the first drafts of
 * a temperature-1 sample are not sized as if every draft were kept, nor by
 * the greedy evaluations running beside it. */
void spec_cost_keep(spec_cost *c, int greedy, int32_t hits, int32_t tries);

/* That rate for greedy (1) or sampled (0) sequences, hits / tries over
 * roughly their last 256 positions compared; 1 before any (drafting is how
 * it is learned). */
double spec_cost_keep_p(const spec_cost *c, int greedy);

#endif
