/* sched.h - the scheduling rule (vLLM's), over the KV block manager.
 *
 * Each sequence has n_computed (tokens whose K/V are in the cache) and
 * n_tokens; a step gives each one the rows that make it catch up, running
 * sequences first (oldest first), then waiting ones (first come, first
 * served), within a token budget and max_num_seqs. A prompt longer than the
 * budget left is computed over several steps: chunked prefill falls out of
 * the rule. When blocks run out, the newest running sequence is preempted:
 * its KV is dropped (recomputed later, bit-identically), its tokens and
 * log-probs kept, and it is requeued at the head of the waiting queue. */
#ifndef RD_SCHED_H
#define RD_SCHED_H

#include <stdint.h>

#include "engine/serve/kv.h"
#include "engine/serve/seq.h"

typedef struct {
    kv_pool *kv;                /* the block manager (the engine's) */
    int32_t block_size;         /* tokens per KV block (the pool's) */
    int32_t max_num_seqs;       /* sequences per step; a group not yet forked counts as its n samples */
    int32_t max_batch_tokens;   /* token budget per step: rows of the forward pass */
    int prefix_cache;           /* 1: a waiting prompt first takes its cached prefix blocks */
    int hold_new;               /* drain: requests that have not started stay queued */
    int32_t score_chunk;        /* rows a step may spend scoring prompt tokens (seq_scores): the logit rows kept
                                   for them, so a long prompt is scored a chunk per step, never all at once */
    seq_list waiting;           /* first come first served; preempted sequences at the head */
    seq_list running;           /* in admission order (forks next to their parent): the tail is the newest */
    /* what the last sched_step decided */
    seq **batch;                /* [max_num_seqs] scheduled sequences in row order, each with its sched_rows */
    int32_t *cow_src, *cow_dst; /* [max_num_seqs] block copies to make before the forward pass (at most
                                   one per scheduled sequence) */
    int32_t n_cow;
    /* counters since sched_init */
    int64_t preemptions;
    int64_t prefix_query_tokens;/* prompt tokens looked up in the prefix cache */
    int64_t prefix_hit_tokens;  /* of those, found there (not computed) */
} sched;

int sched_init(sched *sc, kv_pool *kv, int32_t max_num_seqs, int32_t max_batch_tokens, int prefix_cache);
/* Frees the buffers; the sequences still queued are the caller's to free. */
void sched_free(sched *sc);

/* Queues a new sequence (state SEQ_WAITING) at the tail. */
void sched_add(sched *sc, seq *s);
/* Takes s off the queue its state says it is on (waiting or running). */
void sched_remove(sched *sc, seq *s);

/* Preempts every running sequence (its KV dropped, its tokens kept, back to
 * the head of the waiting queue in admission order); returns how many. */
int32_t sched_retract_all(sched *sc);
/* Chooses this step's sequences and their rows and reserves their slots
 * (version: the serving weight version, the prefix cache's salt). Returns
 * how many sequences are in sc->batch; 0 when nothing can run. */
int32_t sched_step(sched *sc, uint64_t version);
/* After the forward pass: s's sched_rows rows are computed. Marks their
 * slots, advances n_computed and publishes the full prompt blocks it
 * completed, if all its KV is from the serving weights (version). */
void sched_commit(sched *sc, seq *s, uint64_t version);

#endif
