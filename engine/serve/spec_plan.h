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
#include "engine/serve/spec_draft.h"

/* Drafts for this step. Only in the tail: nothing waiting, every running
 * sequence fits in one step (max_num_seqs), and the rows of all of them
 * with their drafts fit the token budget and logit_rows (the runner's logit
 * rows). A sequence drafts when it is decoding (all but its last token
 * computed, a group already forked) and has room: at most max_draft
 * (<= SEQ_MAX_DRAFT) tokens, never past its max_tokens or max_ctx (a draft
 * that cannot be kept is not drafted), and enough free blocks for them.
 * Returns the tokens drafted (0: the step runs as without speculation), or
 * < 0 when the drafter fails (then nothing is drafted). */
int32_t spec_plan(sched *sc, spec_drafter *d, int32_t max_draft, int32_t max_ctx, int32_t logit_rows);

/* After the draws of a step in which s drafted: adapts how much it drafts
 * next (spec_len: doubled after a step that kept every draft, else the
 * drafts it kept + 1; after one that kept none, a wait of 1, 2, 4 .. 16
 * steps without drafting). Only time depends on it. */
void spec_feedback(seq *s, int32_t max_draft);

/* After the draws of a step in which s drafted and went on (not finished):
 * its KV holds tokens [0, n_tokens - 1) as after a plain decode step;
 * blocks past them go back to the pool. Clears the step's draft state. */
void spec_rollback(sched *sc, seq *s);

/* A sample of a group finished: its generated tokens join its request's
 * done_outs (at most 32 of them), drafts for its siblings still running.
 * Out of memory: not kept (drafts only). */
void spec_keep_output(seq *s);

#endif
