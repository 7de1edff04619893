/* spec_plan.h - when and what to speculate, and the rollback after.
 *
 * Before a step, spec_plan gives running sequences that are decoding drafts
 * (seq.n_draft, seq.draft) from a drafter; the scheduler then gives each one
 * 1 + n_draft rows (sched_step trims drafts first when the budget or the
 * blocks are short) and the engine asks for a logit row at each. After the
 * draws, the engine keeps a sequence's tokens up to the first draw that
 * differs from its draft (that draw included), and spec_rollback gives back
 * the KV past them. */
#ifndef RD_SPEC_PLAN_H
#define RD_SPEC_PLAN_H

#include <stdint.h>

#include "engine/serve/sched.h"
#include "engine/serve/spec_cost.h"
#include "engine/serve/spec_draft.h"
#include "engine/serve/spec_store.h"

/* Completions of the same prompt from the store a sequence drafts from at
 * most (the newest): each is scanned whole at every draft. */
#define SPEC_STORE_SOURCES 8

/* Below this acceptance rate (drafts kept / drafted, a running average over
 * its verify steps) a sequence stops drafting for a while (spec_feedback):
 * a rejected draft costs a row of the forward and buys nothing. */
#define SPEC_MIN_RATE 0.25f

typedef struct {
    int32_t max_draft;          /* drafted tokens per sequence at most (<= SEQ_MAX_DRAFT) */
    int32_t max_batch;          /* speculate only while at most this many sequences run (the tail) */
    int32_t max_ctx;            /* the model's context, tokens */
    int32_t logit_rows;         /* logit rows the runner gives a step */
    const spec_store *store;    /* earlier completions by prompt (NULL: none) */
    uint64_t version;           /* the weight version serving: the store's salt */
    const spec_cost *cost;      /* the engine's step times (NULL: drafts are sized by spec_len alone) */
} spec_plan_cfg;

/* Drafts for this step. Only in the tail: nothing waiting, at most
 * max_batch sequences running (past that the forward is busy with their
 * rows already, and a verify row costs about what a decode row does: on the
 * 2-core CPU batch 32 ran 0.74x with drafts, batch 16 at temperature 1
 * 0.62x, PERF.md), and the rows of all
 * of them with their drafts fit the token budget and logit_rows. A sequence
 * drafts when it is decoding (all but its last token computed, a group
 * already forked), is not waiting out a backoff (spec_feedback), and has
 * room: at most max_draft tokens (or its adapted spec_len), never past its
 * max_tokens or max_ctx (a draft that cannot be kept is not drafted), and
 * enough free blocks for them; and with a cost model, at most the drafts
 * that pay at this step's rows (spec_cost_depth of its spec_keep_p, which
 * starts at the engine-wide keep rate: none when even the first would
 * not). Returns the tokens drafted (0: the step runs
 * as without speculation), or < 0 when the drafter fails (then nothing is
 * drafted). */
int32_t spec_plan(sched *sc, spec_drafter *d, const spec_plan_cfg *cfg);

/* After the draws of a step in which s drafted: adapts how much it drafts
 * next (spec_len: doubled after a step that kept every draft, else the
 * drafts it kept + 1) and whether (after a step that kept none, or while its
 * running acceptance rate spec_rate is under SPEC_MIN_RATE, a wait of 1, 2,
 * 4 .. 16 steps without drafting), and its keep rate spec_keep_p (and the
 * engine-wide one in cost, when not NULL). Only time depends on it. */
void spec_feedback(seq *s, int32_t max_draft, spec_cost *cost);

/* After the draws of a step in which s drafted and went on (not finished):
 * its KV holds tokens [0, n_tokens - 1) as after a plain decode step;
 * blocks past them go back to the pool. Clears the step's draft state. */
void spec_rollback(sched *sc, seq *s);

/* A sample of a group finished: its generated tokens join its request's
 * done_outs (at most 32 of them), drafts for its siblings still running;
 * and with a store, they are kept there under its prompt and version for
 * later requests of the same prompt. Out of memory: not kept (drafts only). */
void spec_keep_output(seq *s, spec_store *store, uint64_t version);

#endif
