/* spec_plan.c - drafting before a step and the rollback after (see spec_plan.h). */
#include "engine/serve/spec_plan.h"

#include <stdlib.h>
#include <string.h>

/* Group siblings seen by a drafter at most (the nearest in the running queue). */
#define SPEC_MAX_SIBLINGS 32

/* q's prompt key in the store under version, made once per version. */
static uint64_t store_key(seq_req *q, uint64_t version)
{
    if (!q->store_key || q->store_version != version) {
        q->store_key = spec_store_key(q->prompt, q->n_prompt, version);
        q->store_version = version;
    }
    return q->store_key;
}

/* Decoding: only its last sampled token lacks K/V, and it is one sample. */
static int decoding(const seq *s)
{
    return s->fork_n <= 1 && s->n_tokens > s->req->n_prompt && s->n_computed == s->n_tokens - 1;
}

int32_t spec_plan(sched *sc, spec_drafter *d, const spec_plan_cfg *cfg)
{
    for (seq *s = sc->running.head; s; s = s->next)
        s->n_draft = 0;
    int32_t max_draft = cfg->max_draft;
    const int32_t max_ctx = cfg->max_ctx, logit_rows = cfg->logit_rows;
    if (!d || max_draft <= 0 || sc->waiting.count > 0 || sc->running.count == 0 ||
        sc->running.count > sc->max_num_seqs || sc->running.count > cfg->max_batch)
        return 0;
    if (max_draft > SEQ_MAX_DRAFT)
        max_draft = SEQ_MAX_DRAFT;
    /* What the step needs without drafts: every sequence's rows, one logit row each. */
    int32_t rows = 0;
    for (seq *s = sc->running.head; s; s = s->next)
        rows += s->n_tokens - s->n_computed;
    int32_t budget = sc->max_batch_tokens - rows, logits = logit_rows - sc->running.count;
    kv_stats ks;
    kv_get_stats(sc->kv, &ks);
    int32_t free_blocks = ks.blocks_total - ks.blocks_used;
    const double share = cfg->cost ? spec_cost_row_share(cfg->cost, rows) : 0.0;
    int32_t total = 0;
    for (seq *s = sc->running.head; s && budget > 0 && logits > 0; s = s->next) {
        if (!decoding(s))
            continue;
        if (s->spec_wait > 0) {
            s->spec_wait--;
            continue;
        }
        seq_req *q = s->req;
        int32_t room = s->spec_len > 0 && s->spec_len < max_draft ? s->spec_len : max_draft;
        int32_t left = q->max_tokens - (s->n_tokens - q->n_prompt) - 1; /* tokens after the next draw */
        if (left < room)
            room = left;
        if (max_ctx - s->n_tokens < room)
            room = max_ctx - s->n_tokens; /* rows at positions n_tokens - 1 + room < max_ctx */
        if (room > budget)
            room = budget;
        if (room > logits)
            room = logits;
        if (cfg->cost) {
            if (s->spec_n_drafted == 0) /* no drafts of its own yet: the engine's rate for its kind of draw */
                s->spec_keep_p = (float)spec_cost_keep_p(cfg->cost, s->req->sp.temperature == 0.0f);
            room = spec_cost_depth(share, s->spec_keep_p, room);
        }
        /* Blocks past the one its next token goes into (reserve's fresh blocks). */
        const int32_t bs = sc->block_size;
        int32_t have = s->blocks.n * bs - s->n_computed - 1; /* free slots after its next one */
        int32_t fresh = room > have ? (room - have + bs - 1) / bs : 0;
        if (fresh > free_blocks)
            continue;
        if (room <= 0)
            continue;
        spec_tokens sib[SPEC_MAX_SIBLINGS];
        int32_t n_sib = 0;
        for (seq *o = s->prev; o && o->req == q && n_sib < SPEC_MAX_SIBLINGS; o = o->prev)
            sib[n_sib++] = (spec_tokens){o->tokens, o->n_tokens};
        for (seq *o = s->next; o && o->req == q && n_sib < SPEC_MAX_SIBLINGS; o = o->next)
            sib[n_sib++] = (spec_tokens){o->tokens, o->n_tokens};
        for (int32_t i = 0; i < q->n_done_outs && n_sib < SPEC_MAX_SIBLINGS; i++)
            sib[n_sib++] = (spec_tokens){q->done_outs[i], q->done_lens[i]};
        if (cfg->store) {
            /* Earlier requests' completions of the same prompt, after its own group's (a group's finished
               samples are in both: the copy only costs a scan). */
            int32_t room_src = SPEC_MAX_SIBLINGS - n_sib < SPEC_STORE_SOURCES ? SPEC_MAX_SIBLINGS - n_sib
                                                                                 : SPEC_STORE_SOURCES;
            n_sib += spec_store_get(cfg->store, store_key(q, cfg->version), sib + n_sib, room_src);
        }
        spec_draft_ctx ctx = {{s->tokens, s->n_tokens}, q->n_prompt, sib, n_sib};
        int32_t n = d->draft(d, &ctx, room, s->draft);
        if (n < 0) {
            for (seq *t = sc->running.head; t; t = t->next)
                t->n_draft = 0;
            return n;
        }
        if (n > room)
            n = room;
        s->n_draft = n;
        s->spec_base = s->n_tokens;
        s->spec_rejected = 0;
        if (n > 0) {
            fresh = n > have ? (n - have + bs - 1) / bs : 0;
            free_blocks -= fresh;
            budget -= n;
            logits -= n;
            total += n;
        }
    }
    return total;
}

void spec_feedback(seq *s, int32_t max_draft, spec_cost *cost)
{
    const int32_t kept = s->n_tokens - s->spec_base - 1; /* drafts drawn as drafted */
    if (kept >= s->n_draft) {
        s->spec_len = 2 * s->n_draft < max_draft ? 2 * s->n_draft : max_draft;
    } else {
        s->spec_len = kept + 1;
    }
    /* Positions tried: those kept and the first miss (drafts after it were never compared). */
    const int32_t hits = kept < 0 ? 0 : kept < s->n_draft ? kept : s->n_draft, tries = hits + (hits < s->n_draft);
    /* A running average with weight 1/4 on the last step: one bad step does not stop it. */
    s->spec_rate += ((float)hits / (float)s->n_draft - s->spec_rate) * 0.25f;
    if (tries > 0)
        s->spec_keep_p += ((float)hits / (float)tries - s->spec_keep_p) * 0.25f;
    if (cost)
        spec_cost_keep(cost, s->req->sp.temperature == 0.0f, hits, tries);
    if (kept <= 0 || s->spec_rate < SPEC_MIN_RATE) {
        s->spec_backoff = s->spec_backoff > 0 ? (2 * s->spec_backoff < 16 ? 2 * s->spec_backoff : 16) : 1;
        s->spec_wait = s->spec_backoff;
    } else {
        s->spec_backoff = 0;
    }
}

void spec_keep_output(seq *s, spec_store *store, uint64_t version)
{
    seq_req *q = s->req;
    const int32_t n = s->n_tokens - q->n_prompt;
    if (store && n >= 2)
        (void)spec_store_put(store, store_key(q, version), s->tokens + q->n_prompt, n); /* out of memory: not kept */
    if (q->n < 2 || n < 2 || q->n_done_outs >= SPEC_MAX_SIBLINGS)
        return;
    if (!q->done_outs) {
        q->done_outs = calloc(SPEC_MAX_SIBLINGS, sizeof *q->done_outs);
        q->done_lens = calloc(SPEC_MAX_SIBLINGS, sizeof *q->done_lens);
        if (!q->done_outs || !q->done_lens) {
            free(q->done_outs);
            free(q->done_lens);
            q->done_outs = NULL;
            q->done_lens = NULL;
            return;
        }
    }
    int32_t *copy = malloc(sizeof(int32_t) * (size_t)n);
    if (!copy)
        return;
    memcpy(copy, s->tokens + q->n_prompt, sizeof(int32_t) * (size_t)n);
    q->done_outs[q->n_done_outs] = copy;
    q->done_lens[q->n_done_outs++] = n;
}

void spec_rollback(sched *sc, seq *s)
{
    s->n_computed = s->n_tokens - 1;
    kv_truncate(sc->kv, &s->blocks, s->n_computed);
    s->n_draft = 0;
    s->spec_rejected = 0;
}
