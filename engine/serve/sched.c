/* sched.c - the scheduling rule (see sched.h). */
#include "engine/serve/sched.h"

#include <stdlib.h>

#include "base/err.h"

int sched_init(sched *sc, kv_pool *kv, int32_t max_num_seqs, int32_t max_batch_tokens, int prefix_cache)
{
    kv_stats ks;
    kv_get_stats(kv, &ks);
    *sc = (sched){.kv = kv, .block_size = ks.block_size, .max_num_seqs = max_num_seqs,
                  .max_batch_tokens = max_batch_tokens, .prefix_cache = prefix_cache};
    sc->batch = malloc(sizeof(seq *) * max_num_seqs);
    sc->cow_src = malloc(sizeof(int32_t) * max_num_seqs);
    sc->cow_dst = malloc(sizeof(int32_t) * max_num_seqs);
    if (!sc->batch || !sc->cow_src || !sc->cow_dst) {
        sched_free(sc);
        return rd_fail(RD_ENOMEM, "sched: cannot allocate step buffers for %d sequences", max_num_seqs);
    }
    return 0;
}

void sched_free(sched *sc)
{
    free(sc->batch);
    free(sc->cow_src);
    free(sc->cow_dst);
    sc->batch = NULL;
    sc->cow_src = sc->cow_dst = NULL;
}

void sched_add(sched *sc, seq *s) { seq_list_push_back(&sc->waiting, s); }

void sched_remove(sched *sc, seq *s) { seq_list_remove(s->state == SEQ_WAITING ? &sc->waiting : &sc->running, s); }

/* Reserves the slots of s's next rows tokens, queueing the copy of a shared
 * block this step must make first. */
static int reserve(sched *sc, seq *s, int32_t rows)
{
    int rc = kv_reserve(sc->kv, &s->blocks, s->n_computed, rows, sc->cow_src + sc->n_cow, sc->cow_dst + sc->n_cow);
    if (rc < 0)
        return rc;
    sc->n_cow += rc;
    return 0;
}

/* Takes the longest cached prefix of s's prompt (full blocks, under the
 * serving weight version) into its empty block table. */
static void prefix_lookup(sched *sc, seq *s, uint64_t version)
{
    seq_req *q = s->req;
    s->kv_version = version;
    s->n_published = 0;
    if (!sc->prefix_cache)
        return;
    int hit = kv_prefix_lookup(sc->kv, &q->prefix, q->prompt, q->n_prompt, seq_prefix_salt(q, version), &s->blocks);
    if (hit < 0)
        return; /* out of memory: computed from scratch */
    sc->prefix_query_tokens += (int64_t)q->prefix.n * sc->block_size;
    sc->prefix_hit_tokens += (int64_t)hit * sc->block_size;
    s->n_computed = hit * sc->block_size;
    s->n_published = hit;
}

/* Recompute preemption: drop the KV, keep tokens and log-probs, requeue at the head. */
static void preempt(sched *sc, seq *s)
{
    kv_free_seq(sc->kv, &s->blocks);
    s->n_computed = 0;
    s->n_published = 0;
    s->n_preempt++;
    s->sched_rows = 0;
    s->n_draft = 0;
    s->state = SEQ_WAITING;
    seq_list_remove(&sc->running, s);
    seq_list_push_front(&sc->waiting, s);
    sc->preemptions++;
}

int32_t sched_retract_all(sched *sc)
{
    int32_t n = 0;
    /* From the newest: each goes to the head, so the oldest ends up first. */
    while (sc->running.tail) {
        preempt(sc, sc->running.tail);
        n++;
    }
    return n;
}

/* rows cut so that they hold at most *score_left rows that score a prompt token, which they use up. */
static int32_t score_cap(const seq *s, int32_t rows, int32_t *score_left)
{
    if (s->req->score_from < 0)
        return rows;
    int32_t n = 0, r = 0;
    for (; r < rows; r++) {
        if (seq_scores(s, s->n_computed + r)) {
            if (n == *score_left)
                break;
            n++;
        }
    }
    *score_left -= n;
    return r;
}

int32_t sched_step(sched *sc, uint64_t version)
{
    int32_t score_left = sc->score_chunk;
    int32_t budget = sc->max_batch_tokens, n_batch = 0;
    int preempted = 0;
    sc->n_cow = 0;

    for (seq *s = sc->running.head; s && budget > 0 && n_batch < sc->max_num_seqs;) {
        seq *next = s->next;
        /* Drafts (spec_plan) ride behind the tokens it must compute, in what the budget leaves. */
        int32_t rows = s->n_tokens - s->n_computed + s->n_draft;
        if (rows > budget) {
            rows = budget;
            int32_t left = rows - (s->n_tokens - s->n_computed);
            s->n_draft = left > 0 ? left : 0;
        }
        if (s->req->score_from >= 0 && s->n_computed < s->req->n_prompt) {
            rows = score_cap(s, rows, &score_left); /* a prefill that scores: no drafts ride behind it */
            s->n_draft = 0;
            if (rows == 0) {
                s = next;
                continue;
            }
        }
        int self = 0;
        while (reserve(sc, s, rows) != 0) {
            if (s->n_draft > 0) {
                /* Blocks are short: the drafts go before anybody is preempted for them. */
                rows -= s->n_draft;
                s->n_draft = 0;
                continue;
            }
            seq *victim = sc->running.tail;
            preempted = 1;
            if (victim == s) {
                self = 1;
                preempt(sc, s);
                break;
            }
            if (victim == next)
                next = NULL; /* the loop would have reached it; it is gone now */
            preempt(sc, victim);
        }
        if (self)
            break;
        s->sched_rows = rows;
        budget -= rows;
        sc->batch[n_batch++] = s;
        s = next;
    }

    /* Nothing new starts in a step that had to preempt: the blocks are short. */
    if (preempted)
        return n_batch;
    int32_t slots = 0; /* sequences the running ones will be once forked */
    for (seq *s = sc->running.head; s; s = s->next)
        slots += s->fork_n;
    for (seq *s = sc->waiting.head; s && budget > 0 && n_batch < sc->max_num_seqs;) {
        seq *next = s->next;
        if (slots > 0 && slots + s->fork_n > sc->max_num_seqs)
            break;
        if (sc->hold_new && !seq_started(s))
            break; /* FCFS: nothing behind a held request overtakes it */
        /* A prompt that is scored is computed whole: a cached block would skip rows whose logits it needs. */
        if (s->blocks.n == 0 && s->n_computed == 0 && s->req->score_from < 0)
            prefix_lookup(sc, s, version);
        int32_t rows = s->n_tokens - s->n_computed;
        if (rows > budget)
            rows = budget;
        rows = score_cap(s, rows, &score_left);
        if (rows == 0)
            break; /* FCFS: the scoring budget is spent this step */
        if (reserve(sc, s, rows) != 0) {
            /* Waiting sequences hold no blocks (only running ones can be preempted). */
            kv_free_seq(sc->kv, &s->blocks);
            s->n_computed = 0;
            s->n_published = 0;
            break;
        }
        seq_list_remove(&sc->waiting, s);
        seq_list_push_back(&sc->running, s);
        s->state = SEQ_RUNNING;
        slots += s->fork_n;
        s->sched_rows = rows;
        budget -= rows;
        sc->batch[n_batch++] = s;
        s = next;
    }
    return n_batch;
}

void sched_commit(sched *sc, seq *s, uint64_t version)
{
    kv_written(sc->kv, &s->blocks, s->n_computed, s->sched_rows);
    s->n_computed += s->sched_rows;
    s->sched_rows = 0;
    /* A swap mid-prefill leaves mixed KV that nobody should reuse. */
    if (sc->prefix_cache && s->kv_version == version)
        kv_prefix_publish(sc->kv, &s->req->prefix, s->req->prompt, &s->blocks, s->n_computed,
                          seq_prefix_salt(s->req, version), &s->n_published);
}
