/* seq.h - one sequence (one sample of a request) as the scheduler sees it,
 * and the lists that queue sequences (waiting, running, done). */
#ifndef RD_SEQ_H
#define RD_SEQ_H

#include <stdint.h>

#include "engine/model/lora.h"
#include "engine/serve/kv.h"
#include "engine/serve/sampler.h"
#include "engine/text/stopstr.h"

typedef enum { SEQ_WAITING, SEQ_RUNNING, SEQ_FINISHED } seq_state;
/* FINISH_ERROR: the model produced logits the sampler refuses (NaN/inf),
 * e.g. after bad weights; the sample ends with what it had. */
typedef enum { FINISH_NONE = 0, FINISH_STOP, FINISH_LENGTH, FINISH_ABORT, FINISH_ERROR } finish_reason;

#define SEQ_MAX_STOP 16
/* Most drafted tokens one step verifies for a sequence (spec_max_draft's bound). */
#define SEQ_MAX_DRAFT 16

typedef struct seq_req seq_req;

/* Generated tokens from start on were sampled under weight version (until the
 * next span's start). */
typedef struct {
    int32_t start;              /* index among generated tokens */
    uint64_t version;
} seq_span;

/* What a request asked for; shared by its samples (refcounted). */
struct seq_req {
    int64_t id;                 /* engine request id */
    uint64_t tag;               /* caller's id, passed through */
    int32_t n;                  /* samples */
    int32_t max_tokens;         /* generated tokens per sample */
    samp_params sp;
    int32_t n_stop;
    int32_t stop_ids[SEQ_MAX_STOP];
    stop_set stops;             /* stop strings (matched on the generated text) */
    int32_t min_tokens;         /* stop ids masked and stop strings ignored until this many are generated */
    int32_t n_bias;
    int32_t *bias_ids;          /* [n_bias] logit_bias tokens, distinct */
    float *bias_vals;           /* [n_bias] added to their logits */
    int edits;                  /* pen_wanted: its draws carry logit edits (penalty.h) */
    /* scoring (issue 45): the raw log-prob of each prompt token from score_from on, given the tokens
       before it, computed from the prefill's rows by samp_score (the bits a draw of it would have) */
    int32_t score_from;         /* first prompt position scored (>= 0), or -1: none */
    int32_t score_next;         /* positions below it are scored (a recomputed prefill does not redo them) */
    float *prompt_lps;          /* [n_prompt] raw log-probs; NAN where not scored (position 0 always) */
    int32_t *prompt_top_ids;    /* [n_prompt][sp.logprobs_topk] alternatives, or NULL */
    float *prompt_top_lps;      /* [n_prompt][sp.logprobs_topk], or NULL */
    float *prompt_lps_proc;     /* [n_prompt] processed log-probs (sp.processed_logprobs; samp_score's), or NULL */
    int32_t *prompt_ranks;      /* [n_prompt] the scored tokens' ranks (samp_result.rank); 0 where not scored */
    int32_t *want_ids;          /* [sp.n_want] (sp.want_ids points here), or NULL */
    float *prompt_want_lps;     /* [n_prompt][sp.n_want] scored requests asking want_ids: NAN where not scored */
    int32_t n_prompt;
    int32_t *prompt;            /* [n_prompt] */
    int32_t live;               /* sequences not yet collected */
    int stream;                 /* eng_collect_progress delivers its samples' tokens as they come */
    int return_routes;          /* its results carry the experts each position was routed to */
    kv_prefix prefix;           /* prefix-cache keys of the prompt's full blocks (hashed at the first lookup) */
    /* its LoRA adapter, pinned in loras from eng_add until the request is freed (seq_req_free unpins) */
    lora_set *loras;            /* NULL: the base model */
    int32_t lora_slot;          /* the adapter's slot (runner_lora_set), -1: base */
    uint64_t lora_version;      /* the version it was loaded or pushed as */
    uint64_t lora_uid;          /* lora_pinned.uid: salts its prefix-cache keys (0: base) */
    char lora_name[LORA_NAME_MAX];
    /* speculative decoding: the generated tokens of its samples that finished (stop or length), drafts
       for the ones still running; kept with the request, freed with it */
    int32_t n_done_outs;
    int32_t **done_outs;        /* [n_done_outs][done_lens[i]] */
    int32_t *done_lens;
    uint64_t store_key;         /* its prompt's key in the store of completions (spec_store.h), 0: not made */
    uint64_t store_version;     /* the weight version store_key was made under */
};

typedef struct seq {
    seq_req *req;
    int32_t sample_idx;         /* 0..n-1 */
    int32_t fork_n;             /* > 1: prefill once, then fork into samples sample_idx..fork_n-1 */
    seq_state state;
    finish_reason finish;
    int32_t n_tokens;           /* prompt + generated */
    int32_t cap;                /* capacity of tokens[] */
    int32_t *tokens;            /* [cap] */
    int32_t n_computed;         /* tokens whose K/V are in the cache */
    kv_table blocks;            /* the KV blocks holding tokens [0, n_computed) and the slots reserved after */
    int32_t n_published;        /* leading prompt blocks already in the prefix cache */
    uint64_t kv_version;        /* weight version its KV was computed under (from n_computed 0) */
    /* per generated token */
    float *logprobs;            /* [cap] raw log-prob (temperature 1) */
    float *logprobs_proc;       /* [cap] processed log-prob, or NULL */
    int32_t *top_ids;           /* [cap][sp.logprobs_topk], or NULL */
    float *top_lps;             /* [cap][sp.logprobs_topk], or NULL */
    float *want_lps;            /* [cap][sp.n_want] the request's want_ids' raw log-probs, or NULL */
    seq_span *spans;            /* [n_spans], starts increasing */
    int32_t n_spans, spans_cap;
    uint64_t version_finish;    /* weight version when it finished */
    int32_t n_preempt;          /* times preempted */
    int32_t sched_rows;         /* rows given this step */
    int32_t score_rows;         /* of those, rows whose logits score a prompt token (seq_scores) */
    /* speculative decoding (spec_plan.h): this step's drafts, reset after it */
    int32_t n_draft;            /* drafted tokens verified this step after its last token (0: none) */
    int32_t draft[SEQ_MAX_DRAFT];
    int32_t spec_base;          /* n_tokens when they were drafted: draft[j] is a guess of token spec_base + j */
    int spec_rejected;          /* a draw this step differed from its draft: later draws are dropped */
    int32_t spec_len;           /* drafts it may get next (0: spec_max_draft); adapts to what it keeps */
    int32_t spec_wait;          /* steps to decode plainly before drafting again (after drafts all missed) */
    int32_t spec_backoff;       /* the last wait: doubles while drafts keep missing */
    float spec_rate;            /* running acceptance rate (drafts kept / drafted, 0..1; starts at 1) */
    float spec_keep_p;          /* running chance a draft is kept once those before it were (0..1; starts at
                                   the engine-wide rate of its kind of draw, spec_cost_keep_p) */
    /* its tally for the result (eng_result.spec_*): only time depends on it */
    int32_t spec_n_drafted;     /* drafted tokens verified for it */
    int32_t spec_n_accepted;    /* of those, drawn as drafted */
    int32_t spec_n_steps;       /* decode steps that drew its tokens, plain or verifying */
    int64_t t_first_us;         /* CLOCK_MONOTONIC us when the first token was sampled (0 = none yet) */
    stop_scan scan;             /* the generated text against req->stops */
    int32_t n_streamed;         /* generated tokens eng_collect_progress has handed out */
    int32_t n_routes;           /* positions in routes (set when it finishes, req->return_routes) */
    int32_t *routes;            /* [n_routes][n_layers][k] expert ids, or NULL */
    struct seq *next;           /* list link (waiting, running or done) */
    struct seq *prev;
} seq;

/* A doubly linked queue of sequences through seq.next/prev; a sequence is on
 * at most one. */
typedef struct {
    seq *head, *tail;           /* NULL when empty */
    int32_t count;              /* sequences on it */
} seq_list;

/* Whether the logits of s's row at position p score a prompt token (p + 1): its request scores from
 * score_from on, p + 1 is in the prompt and not scored yet. */
static inline int seq_scores(const seq *s, int32_t p)
{
    const seq_req *q = s->req;
    return q->score_from >= 0 && p + 1 >= q->score_from && p + 1 < q->n_prompt && p + 1 >= q->score_next;
}

/* The salt of a request's prefix-cache keys under weight version: the version for the base model, and
 * for an adapter a mix of it with the adapter's uid, so that KV computed under one adapter (or the base)
 * never serves another. */
static inline uint64_t seq_prefix_salt(const seq_req *q, uint64_t version)
{
    if (q->lora_uid == 0)
        return version;
    uint64_t z = version ^ (q->lora_uid * 0x9E3779B97F4A7C15ull) ^ 0xC0FFEE5A17ull; /* splitmix64's finalizer */
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

void seq_list_remove(seq_list *l, seq *s);
void seq_list_push_back(seq_list *l, seq *s);
void seq_list_push_front(seq_list *l, seq *s);
void seq_list_insert_after(seq_list *l, seq *at, seq *s);

/* A sequence of request r (one more reference to it) with room for cap
 * tokens and their log-probs; NULL when memory runs out (r untouched). */
seq *seq_new(seq_req *r, int32_t sample_idx, int32_t cap);
/* Frees a request and everything it owns (calloc'd fields it never set are fine); seq_destroy calls it
 * with the last sequence, eng_add when a request fails before it has one. */
void seq_req_free(seq_req *r);
/* Frees s and, with its last sequence, the request. Its block table must be
 * empty already (kv_free_seq): freeing blocks needs the pool. */
void seq_destroy(seq *s);
/* Started: it was running, or it is a forked sample or has generated tokens
 * (a preempted one). A group parent whose prefill never ran has not. */
int seq_started(const seq *s);

#endif
