/* engine.h - the request API: add requests, step, collect rollouts, abort.
 *
 * Single-threaded: one thread owns an engine (the daemon's engine thread).
 * Each step schedules by vLLM's rule (running first, then waiting, within a
 * token budget and max_num_seqs; chunked prefill falls out), runs one forward
 * pass over all scheduled tokens, samples, and moves finished samples to the
 * completed queue. */
#ifndef RD_ENGINE_H
#define RD_ENGINE_H

#include <stdint.h>

#include "engine/backend.h"
#include "engine/model/lora.h"
#include "engine/model/model.h"
#include "engine/serve/sampler.h"
#include "engine/serve/seq.h"

/* Which drafter speculative decoding uses (spec_plan.h, spec_draft.h). */
typedef enum {
    ENG_SPEC_AUTO = 0,          /* the old rule, for configs without the key: ngram when spec_max_draft > 0 */
    ENG_SPEC_OFF,
    ENG_SPEC_NGRAM,             /* n-gram lookup over the sequence, its group and recent completions */
} eng_spec_mode;

/* Drafted tokens per sequence and step when ngram is asked without a length. */
#define ENG_SPEC_DEFAULT_DRAFT 6
/* Running sequences at most for a step to speculate, when not configured (PERF.md, the 2-core CPU, 96
   tokens: batch 32 lost 0.74x greedy; batch 16 gained 1.16x greedy but lost 0.62x at temperature 1, what
   RL samples at; batch 4 and below gained at both). */
#define ENG_SPEC_DEFAULT_MAX_BATCH 8

/* "off" / "ngram" (and "auto") to the mode; RD_EINVAL naming the choices. */
int eng_spec_mode_parse(const char *name, eng_spec_mode *out);
const char *eng_spec_mode_name(eng_spec_mode m);

typedef struct {
    const char *backend;        /* "cpu" (default) or "cuda" */
    int n_threads;              /* 0 = all cores */
    int64_t kv_cache_bytes;     /* KV pool budget (default 1 GiB) */
    int32_t block_size;         /* tokens per KV block (default 16) */
    int32_t max_num_seqs;       /* sequences per step (default 64) */
    int32_t max_batch_tokens;   /* token budget per step (default 512) */
    int32_t max_waiting;        /* queued requests before add returns RD_EBUSY (default 4096) */
    int32_t eos_id;             /* stops generation unless a request ignores it; -1 = none */
    int32_t eot_id;             /* a second such stop: the chat format's end of turn (tok_eot) where it is
                                   not eos_id (Llama 3 files whose eos is <|end_of_text|>); -1 = none */
    int prefix_cache;           /* 1 (default): reuse cached full prompt blocks */
    const struct tok_tokenizer *tok; /* decodes generated tokens for stop strings; NULL: requests with
                                        stop strings are refused */
    eng_spec_mode spec_decode;  /* speculative decoding's drafter (ENG_SPEC_AUTO, the default: see there);
                                   outputs are bit-identical to it off */
    int32_t spec_max_draft;     /* drafted tokens verified per sequence and step at most, 0..SEQ_MAX_DRAFT;
                                   under ENG_SPEC_NGRAM 0 = ENG_SPEC_DEFAULT_DRAFT, under AUTO 0 = off */
    int32_t spec_max_batch;     /* a step speculates only while at most this many sequences run, 0..4096
                                   (0 = ENG_SPEC_DEFAULT_MAX_BATCH) */
    int64_t spec_store_bytes;   /* bytes of recent completions kept by prompt and weight version for the
                                   drafter (spec_store.h; default 64 MiB, 0 = none) */
    int spec_fixed;             /* 1: drafts sized by spec_len and spec_max_batch alone; 0 (default): also by
                                   what a row costs in this engine's measured step times (spec_cost.h) */
    int32_t max_loras;          /* LoRA adapters resident at once (eng_lora_load); 0 (default): none served */
    int32_t max_lora_rank;      /* the largest adapter rank accepted, 1..LORA_MAX_RANK (0 = ENG_DEFAULT_LORA_RANK) */
} eng_config;

/* The rank bound when not configured: Tinker's default rank is 32, prime-rl's and SkyRL's examples use
   8 to 64. */
#define ENG_DEFAULT_LORA_RANK 64

/* Prompt positions scored per engine step at most: the logit rows kept for them beside the draws' (128: a
 * scored prefill's steps stay large enough that scoring runs at ~0.8x a plain prefill on SmolLM2, docs/PERF.md,
 * for 128 x vocab floats: 25 MiB at a 49k vocabulary, 77 MiB at Qwen's 152k). */
#define ENG_SCORE_CHUNK 128

/* Most logit_bias entries a request may carry (OpenAI allows 300). */
#define ENG_MAX_BIAS 1024

typedef struct {
    const int32_t *prompt;      /* [n_prompt] token ids */
    int32_t n_prompt;
    int32_t n;                  /* samples (>= 1) */
    int32_t max_tokens;         /* >= 1 */
    samp_params sp;
    const int32_t *stop_ids;    /* [n_stop] extra stop tokens */
    int32_t n_stop;
    int ignore_eos;             /* do not stop at the model's EOS (nor at eot_id) */
    int32_t min_tokens;         /* 0..max_tokens: EOS and stop ids masked (-inf) and stop strings not matched
                                   before this many tokens are generated (vLLM's min_tokens) */
    int32_t n_bias;             /* logit_bias entries, 0..ENG_MAX_BIAS */
    const int32_t *bias_ids;    /* [n_bias] distinct token ids */
    const float *bias_vals;     /* [n_bias] finite, added to the token's logit before the penalties */
    int score_prompt;           /* 1: the raw log-prob of each prompt token from score_from on, given the ones
                                   before it (eng_result.prompt_logprobs); max_tokens may then be 0 (score only,
                                   n 1). Its prompt is computed whole (no prefix-cache hit), ENG_SCORE_CHUNK
                                   scored rows a step */
    int32_t score_from;         /* 0..n_prompt; position 0 has no log-prob (nothing before it) */
    int32_t n_want;             /* 0..SAMP_MAX_WANT token ids whose raw log-probs every generated token (and every
                                   scored prompt position) reports (SGLang's token_ids_logprob) */
    const int32_t *want_ids;    /* [n_want] */
    const char *const *stop_strs; /* [n_stop_strs] UTF-8: a sample stops at the token whose text completes
                                     one (engine/text/stopstr.h); the token is kept */
    int32_t n_stop_strs;
    int stream;                 /* 1: eng_collect_progress hands out its samples' new tokens while they run */
    int return_routes;          /* 1: results carry the experts every position was routed to (MoE models;
                                   RD_EINVAL on a dense one) */
    const char *lora;           /* the LoRA adapter its samples run under (eng_lora_load's name), pinned until
                                   the request's results are collected; NULL or "": the base model */
    uint64_t tag;               /* caller's id, returned with results */
} eng_request;

/* Generated tokens [start, end) were sampled under weight version. */
typedef struct {
    int32_t start, end;
    uint64_t version;
} eng_span;

/* One finished sample, or (partial set) the progress of a running one.
 * Arrays are owned by the result (eng_result_free). */
typedef struct {
    int partial;                /* 1: eng_collect_progress's tokens [token_offset, token_offset + n_tokens)
                                   of a sample still running; the finish fields are unset */
    int32_t token_offset;       /* partial: index of token_ids[0] among the sample's generated tokens */
    int64_t req_id;
    uint64_t tag;
    int32_t sample_idx;
    int32_t n_prompt;
    int32_t *prompt_ids;        /* [n_prompt] */
    int32_t n_tokens;           /* generated tokens (a stop token is included) */
    int32_t *token_ids;         /* [n_tokens] */
    float *logprobs;            /* [n_tokens] raw log-probs (fp32, temperature 1) */
    float *logprobs_proc;       /* [n_tokens] processed log-probs, or NULL */
    int32_t n_top;              /* alternatives per token (0 if not asked) */
    int32_t *top_ids;           /* [n_tokens][n_top] */
    float *top_logprobs;        /* [n_tokens][n_top] */
    float *prompt_logprobs;     /* [n_prompt] scored requests: raw log-prob of each prompt token from score_from
                                   on (the bits a draw of it from the same logits has), NAN before it and at 0;
                                   NULL otherwise */
    int32_t n_prompt_top;       /* alternatives per scored prompt position (the engine gives n_top) */
    int32_t *prompt_top_ids;    /* [n_prompt][n_prompt_top] their alternatives (-1 / -inf where none), or NULL */
    float *prompt_top_logprobs; /* [n_prompt][n_prompt_top] */
    float *prompt_logprobs_proc;/* [n_prompt] scored requests with sp.processed_logprobs: each scored token's
                                   processed log-prob (samp_score: the request's temperature and truncation, no
                                   penalties or bias), NAN where not scored; NULL otherwise */
    int32_t *prompt_ranks;      /* [n_prompt] scored requests: each scored token's rank (1 = the most likely;
                                   samp_result.rank), 0 where not scored; NULL otherwise */
    int32_t n_want;             /* the request's want_ids (0: none) */
    float *want_logprobs;       /* [n_tokens][n_want] their raw log-probs at each generated token, or NULL */
    float *prompt_want_logprobs;/* [n_prompt][n_want] the same at each scored prompt position (NAN elsewhere),
                                   or NULL */
    finish_reason finish;
    int32_t stop_str;           /* index into the request's stop_strs that ended it, or -1 */
    int64_t stop_text_offset;   /* with stop_str: bytes of generated text (tok_decode of token_ids) before
                                   the match, where a client's text is cut */
    int32_t n_preempt;
    /* Speculative decoding (an engine with a drafter; 0 without): drafted tokens verified for it, those
       drawn as drafted (accepted; each is one of token_ids), and its decode steps, plain or verifying
       (SGLang's spec_verify_ct: n_tokens / spec_steps is the mean tokens a step gave it, the first token,
       drawn from the prefill, included) */
    int32_t spec_drafted, spec_accepted, spec_steps;
    int64_t t_first_token_us;   /* CLOCK_MONOTONIC microseconds at the first sampled token (0 = none) */
    uint64_t version_finish;    /* weight version when the sample finished */
    char lora[LORA_NAME_MAX];   /* the adapter every token was drawn under ("": the base model) */
    uint64_t lora_version;      /* its version (0 with none) */
    int32_t n_spans;            /* 0 when n_tokens is 0 */
    eng_span *spans;            /* [n_spans] tiling [0, n_tokens), versions increasing */
    /* Routing replay (eng_request.return_routes; final results only): for
     * every position that ran through the model, prompt then generated
     * (n_prompt + n_tokens - 1 of them: the last sampled token never ran;
     * n_prompt for a request that only scores its prompt, whose every position ran),
     * each layer's top-k experts, highest routing weight first. */
    int32_t n_routes;           /* positions; 0 when not asked */
    int32_t route_layers;       /* n_layers */
    int32_t route_k;            /* experts per token (n_experts_used) */
    int32_t *routes;            /* [n_routes][route_layers][route_k] expert ids, or NULL */
} eng_result;

typedef struct {
    int64_t steps;              /* forward passes */
    int64_t prompt_tokens;      /* prompt rows computed (incl. recompute) */
    int64_t generated_tokens;   /* tokens sampled */
    int64_t preemptions;
    int64_t rows_total;         /* sum of rows over steps */
    int64_t seqs_total;         /* sum of running sequences over decode steps */
    int32_t running, waiting;   /* sequences now */
    int32_t kv_blocks_total, kv_blocks_used, kv_peak_blocks;
    int32_t kv_blocks_cached;   /* prefix-cache blocks nobody holds (counted free; eng_flush_cache drops them) */
    int paused;                 /* eng_pause holds every sequence */
    int kv_released;            /* eng_release_kv: no KV pool now (blocks_total 0) */
    int weights_released;       /* eng_set_weights_released */
    double kv_waste_at_peak;    /* fraction of slots unused in the used blocks at peak */
    int64_t completed, aborted; /* samples */
    int64_t prefix_query_tokens;/* prompt tokens looked up in the prefix cache */
    int64_t prefix_hit_tokens;  /* of those, served from it (not recomputed) */
    int device_sampling;        /* 1: tokens are drawn on the device (logits stay there) */
    /* Wall time of steps by phase, nanoseconds summed over steps: the layers,
     * the head (final norm, LM head, logits out) and drawing the tokens
     * (log-softmax, top-k/p, log-probs, alternatives). See runner.h for what
     * the first two mean on an asynchronous backend. */
    int64_t ns_layers, ns_head, ns_sample;
    /* Speculative decoding (spec_max_draft > 0): tokens drafted and verified, and of those the ones
       drawn as drafted (kept); steps that verified any */
    int64_t spec_drafted, spec_accepted, spec_steps;
    eng_spec_mode spec_decode;  /* as resolved: ENG_SPEC_OFF or a drafter */
    int32_t spec_max_draft;     /* drafted tokens per sequence and step at most (0 when off) */
    int32_t spec_max_batch;     /* running sequences at most for a step to speculate */
    int64_t spec_store_bytes, spec_store_max_bytes; /* the store of completions: charged now, its bound */
    int32_t spec_store_entries; /* completions in it */
    int spec_fixed;             /* drafts sized by the batch bound and spec_len alone (eng_config.spec_fixed) */
    int spec_cost_fitted;       /* the step-time fit below exists (spec_cost.h) */
    double spec_step_ns, spec_row_ns; /* decode step time = spec_step_ns + spec_row_ns * rows, measured */
} eng_stats;

typedef struct engine engine;

eng_config eng_default_config(void);
/* Creates an engine over a loaded model (not owned). */
int eng_create(model *m, const eng_config *cfg, engine **out);
void eng_destroy(engine *e);

/* Validates and queues a request; *id is its engine id. Errors (RD_EINVAL /
 * RD_ERANGE with a message) leave the engine untouched; RD_EBUSY when the
 * waiting queue is full. */
int eng_add(engine *e, const eng_request *r, int64_t *id);
/* Runs one step. Returns the number of rows computed (0 when idle) or < 0. */
int eng_step(engine *e);
/* 1 if any request is waiting or running. */
int eng_busy(const engine *e);
/* Moves up to max finished samples into out; returns how many. */
int eng_collect(engine *e, eng_result *out, int max);
void eng_result_free(eng_result *r);
/* Progress of streaming requests (eng_request.stream): for each of their
 * samples that sampled tokens since its last delivery, one partial result
 * with those tokens (ids, log-probs, alternatives), up to max; returns how
 * many. Called once per step, it batches what each step added; a sample's
 * final eng_collect result still holds all its tokens. Requests that did not
 * ask for it cost nothing here and are never touched. */
int eng_collect_progress(engine *e, eng_result *out, int max);
/* Forgets every prefix-cache entry: cached blocks nobody holds become plain
 * free blocks, and blocks in use are unpublished (their sequences keep their
 * KV; nothing computed before the flush is reused after it). Returns the
 * blocks unpublished. */
int32_t eng_flush_cache(engine *e);
/* Pause (1) freezes every sequence where it is, KV kept: eng_step schedules
 * nothing until eng_pause(e, 0). Requests are still added, aborted and
 * collected, and weights may be swapped in between (the frozen sequences
 * then go on under the new version, on their old KV). */
void eng_pause(engine *e, int pause);
/* SGLang's retract: every running sequence goes back to the waiting queue,
 * its KV dropped and its tokens kept (the scheduler's preemption), and is
 * recomputed when it is scheduled again (with the weights serving then).
 * Returns how many. Pair with eng_pause so they wait. */
int32_t eng_retract(engine *e);
/* Memory release (SGLang's release_memory_occupation, vLLM's sleep), idle
 * engine only (RD_EBUSY otherwise): eng_release_kv frees the KV pool and
 * the runner's KV buffers (the prefix cache goes with them); eng_resume_kv
 * makes them again, the same size. eng_set_weights_released(e, 1) marks the
 * model's weights gone (the caller frees them, model_drop_weights); (e, 0)
 * after the caller gave them back (model_adopt) re-reads the runner's
 * pointers. While either is released, eng_add answers RD_EBUSY and eng_step
 * runs nothing. */
int eng_release_kv(engine *e);
int eng_resume_kv(engine *e);
int eng_set_weights_released(engine *e, int released);
int eng_paused(const engine *e);
/* Aborts a request: its samples finish with FINISH_ABORT and what they had
 * generated. RD_ENOENT if unknown or already finished. */
int eng_abort(engine *e, int64_t id);
void eng_get_stats(const engine *e, eng_stats *s);

/* ---- weight updates (the swap itself is upd_apply on the model, between steps) */

/* The version tokens sampled from now on carry (after a swap). */
void eng_set_version(engine *e, uint64_t version);
uint64_t eng_version(const engine *e);
/* Drain mode: while held, requests that have not started stay queued;
 * started ones (running, or preempted with tokens) still run. */
void eng_hold_new(engine *e, int hold);
/* Sequences started and not finished: running, or waiting with generated
 * tokens (preempted). A drain is over when this is 0. */
int32_t eng_started(const engine *e);
/* Abort mode: finishes every started sequence with FINISH_ABORT and what it
 * has; returns how many samples that ended. */
int32_t eng_abort_started(engine *e);
const model *eng_model(const engine *e);

/* ---- LoRA adapters (eng_config.max_loras > 0; engine/model/lora.h) ----
 * A request names its adapter (eng_request.lora); one step serves rows of
 * different adapters and of the base model, each row's bits its own
 * (backend.h, lora_apply). KV computed under an adapter is cached apart
 * (seq_prefix_salt). */

/* Makes adapter a (checked against this model: lora_load_peft, or a
 * pushed one) resident as name at version, copying it to the backend.
 * replace: an adapter resident under name is superseded (requests admitted
 * from now on get the new one; running ones finish on the old, freed
 * after them); without it a resident name is RD_EINVAL. A full set evicts
 * its least recently used idle adapter (its name into evicted, "" when
 * none); RD_EBUSY when all are in use. RD_ENOTSUP without max_loras,
 * RD_ERANGE for a rank over max_lora_rank, RD_EINVAL for an adapter made
 * for another model. On success the engine owns a; on failure the caller
 * still does. */
int eng_lora_load(engine *e, lora_adapter *a, const char *name, uint64_t version, int replace, char *evicted,
                  size_t evicted_cap);
/* Frees adapter name: RD_ENOENT if not resident, RD_EBUSY while requests use it. */
int eng_lora_unload(engine *e, const char *name);
/* The resident adapters, in the order loaded (lora_set_list); bytes are the
 * backend's (ops.lora_bytes). *n 0 without max_loras. */
int eng_lora_list(const engine *e, lora_info *out, int32_t cap, int32_t *n);
/* max_loras and max_lora_rank as configured (0, 0 without LoRA). */
void eng_lora_limits(const engine *e, int32_t *max_loras, int32_t *max_rank);

#endif
