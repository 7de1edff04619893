/* engine.c - the request API and the step (see engine.h): admission, one
 * step (the scheduler's batch -> the runner's forward pass -> draws), results,
 * aborts and the weight version. The rule choosing each step's rows is in
 * sched.c, the block accounting behind it in kv.c.
 *
 * A request with n samples enters as one sequence (sample 0, fork_n = n).
 * Its prompt is prefilled once; the logits of the last prompt token give the
 * first token of every sample, and samples 1..n-1 fork from it sharing the
 * prompt's KV blocks (reference counts; a shared partial block is copied
 * before a sample writes into it). */
#include "engine/serve/engine.h"

#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/clock.h"
#include "base/err.h"
#include "engine/serve/kv.h"
#include "engine/serve/penalty.h"
#include "engine/model/runner.h"
#include "engine/serve/sched.h"
#include "engine/serve/spec_cost.h"
#include "engine/serve/spec_ngram.h"
#include "engine/serve/spec_plan.h"
#include "engine/serve/spec_store.h"
#include "engine/text/tokenizer.h"
#include "base/pool.h"

struct engine {
    model *m;
    eng_config cfg;
    runner run;
    kv_pool *kv;                /* the block manager */
    sched sched;                /* waiting and running queues, and each step's batch */
    int32_t eos;                /* model EOS id, -1 if unknown */
    int32_t eot;                /* the chat format's end-of-turn id when it is not eos, else -1 */
    int64_t next_id;
    uint64_t version;           /* weight version new tokens are sampled under */
    int paused;                 /* eng_pause: nothing is scheduled */
    int32_t n_blocks;           /* the KV pool's size, kept to re-create it (eng_resume_kv) */
    int weights_released;       /* eng_set_weights_released: the model has no weights now */
    seq_list done;              /* finished samples not yet collected */
    eng_stats st;
    /* per-step scratch (host) */
    int32_t *tok, *pos, *slot, *q_start, *ctx_len, *tables, *logit_rows;
    int32_t tables_cap;         /* entries in tables */
    float *logits;              /* [max_num_seqs][vocab] host logits (host sampling only) */
    void *samp_scratch;         /* [samp_workers][samp_stride(vocab)] */
    int samp_workers;           /* host draws run on the CPU pool, one scratch per thread */
    /* this step's token draws: one per sequence that caught up, one per sample of a group
       that forks now; grown as needed */
    int device_sampling;        /* the backend samples on the device: logits never leave it */
    rd_sample_req *sreq;        /* [draws_cap] */
    samp_result *sres;          /* [draws_cap] */
    seq **sseq;                 /* [draws_cap] the sequence each draw extends */
    int32_t *round;             /* [draws_cap] host draws: the draws of the round being made */
    int32_t *edit_at;           /* [draws_cap] each draw's first entry in edits (its count in sreq[].n_edits) */
    int32_t *score_pos;         /* [draws_cap] the prompt position a scoring draw scores, -1 for a real draw */
    int32_t draws_cap;
    /* this step's logit edits (penalty.h), for the draws of requests that ask for them */
    pen_index pen;
    samp_edit *edits;           /* [edits_cap] */
    int32_t n_edits, edits_cap;
    /* Routing replay (MoE models; NULL otherwise): the experts every KV slot's
       token was routed to, kept with the KV so that prefix-cache hits and
       copied blocks carry them. */
    uint16_t *slot_routes;      /* [n_blocks * block_size][n_layers][k] */
    int32_t *step_routes;       /* [n_layers][max_batch_tokens][k] the last step's, from the runner */
    int32_t route_layers, route_k;
    /* Speculative decoding (cfg.spec_max_draft > 0; NULL otherwise) */
    spec_drafter *drafter;
    spec_store *store;          /* recent completions by prompt (cfg.spec_store_bytes > 0; NULL otherwise) */
    spec_cost cost;             /* decode and verify step times by rows: which drafts pay */
    int32_t logit_cap;          /* logit rows a step may ask for: max_num_seqs, plus 4 sequences' drafts */
    int32_t score_chunk;        /* and beyond them, rows that score prompt tokens (ENG_SCORE_CHUNK) */
    /* LoRA adapters (cfg.max_loras > 0; NULL otherwise): the set, and by slot the backend's bytes */
    lora_set *loras;
    int64_t *lora_bytes;        /* [lora_set_slots] */
    int32_t *lora_row;          /* [max_batch_tokens] the step's adapter slot per row, -1: base */
};

/* ---- configuration and lifecycle ---- */

int eng_spec_mode_parse(const char *name, eng_spec_mode *out)
{
    if (name && !strcmp(name, "off"))
        *out = ENG_SPEC_OFF;
    else if (name && !strcmp(name, "ngram"))
        *out = ENG_SPEC_NGRAM;
    else if (name && !strcmp(name, "auto"))
        *out = ENG_SPEC_AUTO;
    else
        return rd_fail(RD_EINVAL, "spec_decode \"%.64s\": expected \"off\" or \"ngram\" (or \"auto\": ngram when "
                       "spec_max_draft > 0)", name ? name : "(null)");
    return 0;
}

const char *eng_spec_mode_name(eng_spec_mode m)
{
    return m == ENG_SPEC_OFF ? "off" : m == ENG_SPEC_NGRAM ? "ngram" : "auto";
}

eng_config eng_default_config(void)
{
    return (eng_config){
        .backend = "cpu",
        .n_threads = 0,
        .kv_cache_bytes = (int64_t)1 << 30,
        .block_size = 16,
        .max_num_seqs = 64,
        .max_batch_tokens = 512,
        .max_waiting = 4096,
        .eos_id = -1,
        .eot_id = -1,
        .prefix_cache = 1,
        .spec_store_bytes = (int64_t)64 << 20,
    };
}

/* Bytes between the workers' sampler scratch areas (each 64-byte aligned:
 * samp_sample needs 8): the sampler's, then a row of edited logits. */
static size_t samp_stride(int32_t vocab)
{
    return (samp_scratch_bytes(vocab) + sizeof(float) * (size_t)vocab + 63) & ~(size_t)63;
}

/* ---- LoRA adapters: the set's slots mirrored in the runner's handle tables ---- */

/* The set frees the adapter in slot: the backend's copies go with it. */
static void lora_slot_freed(void *ctx, int32_t slot, lora_adapter *a)
{
    engine *e = ctx;
    (void)a;
    runner_lora_unbind(&e->run, slot);
    e->lora_bytes[slot] = 0;
}

static int lora_init(engine *e)
{
    int rc = lora_set_new(e->cfg.max_loras, &e->loras);
    if (rc)
        return rc;
    lora_set_on_free(e->loras, lora_slot_freed, e);
    const int32_t slots = lora_set_slots(e->loras);
    e->lora_bytes = calloc((size_t)slots, sizeof(int64_t));
    e->lora_row = malloc(sizeof(int32_t) * (size_t)e->cfg.max_batch_tokens);
    if (!e->lora_bytes || !e->lora_row)
        return rd_fail(RD_ENOMEM, "engine: out of memory for LoRA slots");
    return runner_lora_init(&e->run, slots, e->cfg.max_lora_rank);
}

int eng_lora_load(engine *e, lora_adapter *a, const char *name, uint64_t version, int replace, char *evicted,
                  size_t evicted_cap)
{
    if (evicted && evicted_cap)
        evicted[0] = 0;
    const model_config *c = &e->m->cfg;
    if (!e->loras)
        return rd_fail(RD_ENOTSUP, "lora: this engine serves no LoRA adapters (max_loras is 0)");
    if (!a)
        return rd_fail(RD_EINVAL, "lora: no adapter");
    if (a->rank > e->cfg.max_lora_rank)
        return rd_fail(RD_ERANGE, "lora: adapter '%s' has rank %d; max_lora_rank is %d", name ? name : a->name,
                       a->rank, e->cfg.max_lora_rank);
    if (a->n_layers != c->n_layers || strcmp(a->arch, c->arch))
        return rd_fail(RD_EINVAL, "lora: adapter '%s' was made for a %d-layer %s model; this one is a %d-layer %s",
                       name ? name : a->name, a->n_layers, a->arch, c->n_layers, c->arch);
    /* The backend's copy first: a set that took the adapter (and perhaps retired its predecessor) always
       gets it served. */
    void **h;
    int64_t bytes;
    int rc = runner_lora_prepare(&e->run, a, &h, &bytes);
    if (rc)
        return rc;
    int32_t slot = -1;
    if ((rc = lora_set_add(e->loras, a, name, version, replace, evicted, evicted_cap, &slot))) {
        runner_lora_discard(&e->run, h);
        return rc;
    }
    runner_lora_bind(&e->run, slot, h);
    e->lora_bytes[slot] = bytes;
    return 0;
}

int eng_lora_unload(engine *e, const char *name)
{
    if (!e->loras)
        return rd_fail(RD_ENOTSUP, "lora: this engine serves no LoRA adapters (max_loras is 0)");
    return lora_set_remove(e->loras, name);
}

int eng_lora_list(const engine *e, lora_info *out, int32_t cap, int32_t *n)
{
    *n = 0;
    if (!e->loras)
        return 0;
    int rc = lora_set_list(e->loras, out, cap, n);
    for (int32_t i = 0; !rc && i < *n; i++)
        out[i].bytes = (uint64_t)e->lora_bytes[out[i].slot];
    return rc;
}

void eng_lora_limits(const engine *e, int32_t *max_loras, int32_t *max_rank)
{
    *max_loras = e->cfg.max_loras;
    *max_rank = e->cfg.max_lora_rank;
}

/* An engine switch from the environment: unset or empty or "0" is off, "1" on; any other value refuses the
   engine, so a misspelt switch cannot run as the default unnoticed (the backend's RD_CUDA_* do the same). */
static int eng_env_flag(const char *name, bool *on)
{
    const char *v = getenv(name);
    *on = v && !strcmp(v, "1");
    if (v && *v && strcmp(v, "0") && strcmp(v, "1"))
        return rd_fail(RD_EINVAL, "engine: %s=%s is not a value it takes (0 or 1; unset for 0)", name, v);
    return 0;
}

int eng_create(model *m, const eng_config *cfg, engine **out)
{
    *out = NULL;
    const model_config *c = &m->cfg;
    bool host_sampling, forward_sync;
    int env_rc = eng_env_flag("RD_HOST_SAMPLING", &host_sampling);
    if (!env_rc)
        env_rc = eng_env_flag("RD_FORWARD_SYNC", &forward_sync);
    if (env_rc)
        return env_rc;
    if (cfg->block_size < 1 || cfg->block_size > 1024)
        return rd_fail(RD_EINVAL, "engine: block_size %d must be in 1..1024", cfg->block_size);
    if (cfg->max_num_seqs < 1 || cfg->max_num_seqs > 4096)
        return rd_fail(RD_EINVAL, "engine: max_num_seqs %d must be in 1..4096", cfg->max_num_seqs);
    if (cfg->max_batch_tokens < cfg->max_num_seqs || cfg->max_batch_tokens > 65536)
        return rd_fail(RD_EINVAL, "engine: max_batch_tokens %d must be in max_num_seqs (%d)..65536",
                       cfg->max_batch_tokens, cfg->max_num_seqs);
    if (cfg->max_waiting < 1)
        return rd_fail(RD_EINVAL, "engine: max_waiting %d must be >= 1", cfg->max_waiting);
    if (cfg->spec_max_draft < 0 || cfg->spec_max_draft > SEQ_MAX_DRAFT)
        return rd_fail(RD_EINVAL, "engine: spec_max_draft %d must be in 0..%d (0 = off)", cfg->spec_max_draft,
                       SEQ_MAX_DRAFT);
    if (cfg->spec_store_bytes < 0)
        return rd_fail(RD_EINVAL, "engine: spec_store_bytes %lld must be >= 0 (0 = no store)",
                       (long long)cfg->spec_store_bytes);
    if (cfg->spec_max_batch < 0 || cfg->spec_max_batch > 4096)
        return rd_fail(RD_EINVAL, "engine: spec_max_batch %d must be in 0..4096 (0 = %d)", cfg->spec_max_batch,
                       ENG_SPEC_DEFAULT_MAX_BATCH);
    if (cfg->max_loras < 0 || cfg->max_loras > LORA_MAX_LORAS)
        return rd_fail(RD_EINVAL, "engine: max_loras %d must be in 0..%d (0 = no LoRA)", cfg->max_loras,
                       LORA_MAX_LORAS);
    if (cfg->max_lora_rank < 0 || cfg->max_lora_rank > LORA_MAX_RANK)
        return rd_fail(RD_EINVAL, "engine: max_lora_rank %d must be in 0..%d (0 = %d)", cfg->max_lora_rank,
                       LORA_MAX_RANK, ENG_DEFAULT_LORA_RANK);
    if (cfg->spec_decode != ENG_SPEC_AUTO && cfg->spec_decode != ENG_SPEC_OFF && cfg->spec_decode != ENG_SPEC_NGRAM)
        return rd_fail(RD_EINVAL, "engine: spec_decode %d is not a known drafter", (int)cfg->spec_decode);
    int64_t block_bytes = 2 * (int64_t)c->n_layers * rd_backend_kv_block_bytes(m->be, c->n_kv_heads, cfg->block_size,
                                                                                c->head_dim);
    int64_t n_blocks = cfg->kv_cache_bytes / block_bytes;
    if (n_blocks < 1 || n_blocks > INT32_MAX / cfg->block_size)
        return rd_fail(RD_EINVAL, "engine: kv_cache_bytes %lld gives %lld blocks of %lld bytes (need >= 1)",
                       (long long)cfg->kv_cache_bytes, (long long)n_blocks, (long long)block_bytes);

    engine *e = calloc(1, sizeof *e);
    if (!e)
        return rd_fail(RD_ENOMEM, "engine: out of memory");
    e->m = m;
    e->cfg = *cfg;
    spec_cost_init(&e->cost);
    /* One meaning from here on: the mode is OFF or a drafter, and spec_max_draft is 0 exactly when OFF. */
    if (e->cfg.spec_decode == ENG_SPEC_AUTO)
        e->cfg.spec_decode = cfg->spec_max_draft > 0 ? ENG_SPEC_NGRAM : ENG_SPEC_OFF;
    if (e->cfg.spec_decode == ENG_SPEC_OFF)
        e->cfg.spec_max_draft = 0;
    else if (e->cfg.spec_max_draft == 0)
        e->cfg.spec_max_draft = ENG_SPEC_DEFAULT_DRAFT;
    if (e->cfg.spec_max_batch == 0)
        e->cfg.spec_max_batch = ENG_SPEC_DEFAULT_MAX_BATCH;
    if (e->cfg.max_lora_rank == 0)
        e->cfg.max_lora_rank = ENG_DEFAULT_LORA_RANK;
    if (e->cfg.max_loras == 0)
        e->cfg.max_lora_rank = 0;
    cfg = &e->cfg;
    e->eos = cfg->eos_id;
    e->eot = cfg->eot_id != cfg->eos_id ? cfg->eot_id : -1;
    e->next_id = 1;
    e->n_blocks = (int32_t)n_blocks;
    /* eng_destroy takes a partly built engine apart (each free accepts what was never made). */
    /* Verify steps want a logit row per drafted token: room for the tail (4 sequences) to draft fully. */
    e->logit_cap = cfg->max_num_seqs + 4 * cfg->spec_max_draft;
    if (e->logit_cap > cfg->max_batch_tokens)
        e->logit_cap = cfg->max_batch_tokens > cfg->max_num_seqs ? cfg->max_batch_tokens : cfg->max_num_seqs;
    int rc = kv_create((int32_t)n_blocks, cfg->block_size, &e->kv);
    if (!rc)
        rc = sched_init(&e->sched, e->kv, cfg->max_num_seqs, cfg->max_batch_tokens, cfg->prefix_cache);
    e->score_chunk = ENG_SCORE_CHUNK < cfg->max_batch_tokens ? ENG_SCORE_CHUNK : cfg->max_batch_tokens;
    e->sched.score_chunk = e->score_chunk;
    if (!rc)
        rc = runner_init(&e->run, m, (int32_t)n_blocks, cfg->block_size, cfg->max_batch_tokens,
                         e->logit_cap + e->score_chunk);
    if (!rc && cfg->max_loras > 0)
        rc = lora_init(e);
    if (!rc && cfg->spec_max_draft > 0) {
        spec_ngram_params np = spec_ngram_default();
        rc = spec_ngram_create(&np, &e->drafter);
        if (!rc && cfg->spec_store_bytes > 0)
            rc = spec_store_create(cfg->spec_store_bytes, &e->store);
    }
    if (rc) {
        eng_destroy(e);
        return rc;
    }
    int32_t T = cfg->max_batch_tokens, S = cfg->max_num_seqs;
    e->tok = malloc(sizeof(int32_t) * T);
    e->pos = malloc(sizeof(int32_t) * T);
    e->slot = malloc(sizeof(int32_t) * T);
    e->q_start = malloc(sizeof(int32_t) * (S + 1));
    e->ctx_len = malloc(sizeof(int32_t) * S);
    e->logit_rows = malloc(sizeof(int32_t) * (e->logit_cap + e->score_chunk));
    /* A backend that samples keeps the logits on the device (RD_HOST_SAMPLING=1 forces
       the download and samp_sample, to compare the two). */
    e->device_sampling = m->be->ops->sample != NULL && !host_sampling;
    /* RD_FORWARD_SYNC=1: every forward waits for its work (the old way, to time against). */
    e->run.async_forward = e->device_sampling && !forward_sync;
    if (!e->device_sampling) {
        e->logits = malloc(sizeof(float) * (size_t)(e->logit_cap + e->score_chunk) * c->vocab);
        e->samp_workers = pool_size();
        e->samp_scratch = malloc(samp_stride(c->vocab) * (size_t)e->samp_workers);
    }
    if ((rc = pen_index_init(&e->pen, c->vocab))) {
        eng_destroy(e);
        return rc;
    }
    int routes_ok = 1;
    if (c->n_experts > 0) {
        e->route_layers = c->n_layers;
        e->route_k = c->n_experts_used;
        size_t per = (size_t)c->n_layers * c->n_experts_used;
        e->slot_routes = calloc((size_t)n_blocks * cfg->block_size * per, sizeof(uint16_t));
        e->step_routes = malloc((size_t)T * per * sizeof(int32_t));
        routes_ok = e->slot_routes && e->step_routes;
    }
    if (!e->tok || !e->pos || !e->slot || !e->q_start || !e->ctx_len || !e->logit_rows || !routes_ok ||
        (!e->device_sampling && (!e->logits || !e->samp_scratch))) {
        eng_destroy(e);
        return rd_fail(RD_ENOMEM, "engine: cannot allocate step buffers");
    }
    *out = e;
    return 0;
}

void eng_destroy(engine *e)
{
    if (!e)
        return;
    seq_list *lists[] = {&e->sched.waiting, &e->sched.running, &e->done};
    for (int i = 0; i < 3; i++)
        while (lists[i]->head) {
            seq *s = lists[i]->head;
            seq_list_remove(lists[i], s);
            kv_free_seq(e->kv, &s->blocks);
            seq_destroy(s);
        }
    lora_set_free(e->loras);    /* its hook frees the backend's copies: before the runner goes */
    free(e->lora_bytes);
    free(e->lora_row);
    runner_free(&e->run);
    sched_free(&e->sched);
    kv_destroy(e->kv);
    free(e->tok);
    free(e->pos);
    free(e->slot);
    free(e->q_start);
    free(e->ctx_len);
    free(e->tables);
    free(e->logit_rows);
    free(e->logits);
    free(e->samp_scratch);
    free(e->sreq);
    free(e->sres);
    free(e->sseq);
    free(e->round);
    free(e->edit_at);
    free(e->score_pos);
    free(e->edits);
    pen_index_free(&e->pen);
    free(e->slot_routes);
    free(e->step_routes);
    if (e->drafter)
        e->drafter->destroy(e->drafter);
    spec_store_destroy(e->store);
    free(e);
}

const model *eng_model(const engine *e) { return e->m; }

/* ---- admission ---- */

int eng_add(engine *e, const eng_request *r, int64_t *id)
{
    const model_config *c = &e->m->cfg;
    if (!e->kv || e->weights_released)
        return rd_fail(RD_EBUSY, "request: the engine's memory is released (%s%s%s); resume it first",
                       e->weights_released ? "weights" : "", e->weights_released && !e->kv ? ", " : "",
                       !e->kv ? "kv_cache" : "");
    if (!r->prompt || r->n_prompt < 1)
        return rd_fail(RD_EINVAL, "request: prompt is empty (need at least 1 token)");
    if (r->n_prompt >= c->max_ctx)
        return rd_fail(RD_ERANGE, "request: prompt of %d tokens leaves no room in the context of %d",
                       r->n_prompt, c->max_ctx);
    if (r->n < 1 || r->n > e->cfg.max_num_seqs)
        return rd_fail(RD_EINVAL, "request: n = %d must be in 1..%d (max_num_seqs)", r->n, e->cfg.max_num_seqs);
    if (r->max_tokens < (r->score_prompt ? 0 : 1))
        return rd_fail(RD_EINVAL, "request: max_tokens = %d must be >= 1 (0 only for a request that scores its "
                       "prompt)", r->max_tokens);
    if (r->score_prompt && (r->score_from < 0 || r->score_from > r->n_prompt))
        return rd_fail(RD_EINVAL, "request: score_from = %d must be in 0..%d (the prompt's length)", r->score_from,
                       r->n_prompt);
    if (r->max_tokens == 0 && r->n != 1)
        return rd_fail(RD_EINVAL, "request: a request that only scores its prompt has n = 1 (got %d)", r->n);
    if (r->n_want < 0 || r->n_want > SAMP_MAX_WANT || (r->n_want > 0 && !r->want_ids))
        return rd_fail(RD_EINVAL, "request: %d token ids to report log-probs of (0..%d, with the ids)", r->n_want,
                       SAMP_MAX_WANT);
    for (int32_t i = 0; i < r->n_want; i++)
        if (r->want_ids[i] < 0 || r->want_ids[i] >= c->vocab)
            return rd_fail(RD_ERANGE, "request: token id %d (log-prob asked) is outside the vocabulary 0..%d",
                           r->want_ids[i], c->vocab - 1);
    if (r->n_stop < 0 || r->n_stop > SEQ_MAX_STOP)
        return rd_fail(RD_EINVAL, "request: %d stop ids (at most %d)", r->n_stop, SEQ_MAX_STOP);
    if (r->n_stop > 0 && !r->stop_ids)
        return rd_fail(RD_EINVAL, "request: n_stop is %d but stop_ids is NULL", r->n_stop);
    for (int32_t i = 0; i < r->n_prompt; i++)
        if (r->prompt[i] < 0 || r->prompt[i] >= c->vocab)
            return rd_fail(RD_ERANGE, "request: prompt token %d at index %d is outside the vocabulary 0..%d",
                           r->prompt[i], i, c->vocab - 1);
    for (int32_t i = 0; i < r->n_stop; i++)
        if (r->stop_ids[i] < 0 || r->stop_ids[i] >= c->vocab)
            return rd_fail(RD_ERANGE, "request: stop id %d is outside the vocabulary 0..%d", r->stop_ids[i],
                           c->vocab - 1);
    if (r->n_stop_strs > 0 && !e->cfg.tok)
        return rd_fail(RD_EINVAL, "request: stop strings need a tokenizer; the model was loaded without one");
    if (r->min_tokens < 0 || r->min_tokens > r->max_tokens)
        return rd_fail(RD_EINVAL, "request: min_tokens = %d must be in 0..max_tokens (%d)", r->min_tokens,
                       r->max_tokens);
    if (r->n_bias < 0 || r->n_bias > ENG_MAX_BIAS || (r->n_bias > 0 && (!r->bias_ids || !r->bias_vals)))
        return rd_fail(RD_EINVAL, "request: %d logit_bias entries (0..%d, with ids and values)", r->n_bias,
                       ENG_MAX_BIAS);
    for (int32_t i = 0; i < r->n_bias; i++) {
        if (r->bias_ids[i] < 0 || r->bias_ids[i] >= c->vocab)
            return rd_fail(RD_ERANGE, "request: logit_bias token %d is outside the vocabulary 0..%d", r->bias_ids[i],
                           c->vocab - 1);
        if (!isfinite(r->bias_vals[i]))
            return rd_fail(RD_EINVAL, "request: logit_bias of token %d is not a finite number", r->bias_ids[i]);
        for (int32_t j = 0; j < i; j++)
            if (r->bias_ids[j] == r->bias_ids[i])
                return rd_fail(RD_EINVAL, "request: logit_bias names token %d twice", r->bias_ids[i]);
    }
    if (r->return_routes && !e->slot_routes)
        return rd_fail(RD_EINVAL, "request: routed experts were asked for, but %s is not a mixture-of-experts "
                       "model", c->arch);
    int rc = samp_validate(&r->sp);
    if (rc)
        return rd_fail(rc, "request: %s", rd_errmsg());
    int64_t total = (int64_t)r->n_prompt + r->max_tokens;
    if (total > c->max_ctx)
        total = c->max_ctx;
    int64_t need = (total + e->cfg.block_size - 1) / e->cfg.block_size;
    kv_stats ks;
    kv_get_stats(e->kv, &ks);
    if (need > ks.blocks_total)
        return rd_fail(RD_ERANGE, "request: %lld tokens need %lld KV blocks; the pool has %d",
                       (long long)total, (long long)need, ks.blocks_total);
    if (e->sched.waiting.count >= e->cfg.max_waiting)
        return rd_fail(RD_EBUSY, "request: %d requests already waiting (max_waiting)", e->sched.waiting.count);

    const int with_lora = r->lora && r->lora[0];
    if (with_lora && !e->loras)
        return rd_fail(RD_EINVAL, "request: adapter '%.128s' was asked for, but this engine serves no LoRA adapters "
                       "(max_loras is 0)", r->lora);
    if (with_lora) {
        const lora_adapter *la;
        if ((rc = lora_set_get(e->loras, r->lora, &la, NULL)))
            return rd_fail(rc, "request: %s", rd_errmsg());
    }

    seq_req *q = calloc(1, sizeof *q);
    if (!q)
        return rd_fail(RD_ENOMEM, "request: out of memory");
    q->lora_slot = -1;
    if ((rc = stop_set_init(&q->stops, r->stop_strs, r->n_stop_strs))) {
        free(q);
        return rd_fail(rc, "request: %s", rd_errmsg());
    }
    q->prompt = malloc(sizeof(int32_t) * r->n_prompt);
    if (!q->prompt)
        goto oom;
    memcpy(q->prompt, r->prompt, sizeof(int32_t) * r->n_prompt);
    if (r->n_bias > 0) {
        q->bias_ids = malloc(sizeof(int32_t) * (size_t)r->n_bias);
        q->bias_vals = malloc(sizeof(float) * (size_t)r->n_bias);
        if (!q->bias_ids || !q->bias_vals)
            goto oom;
        memcpy(q->bias_ids, r->bias_ids, sizeof(int32_t) * (size_t)r->n_bias);
        memcpy(q->bias_vals, r->bias_vals, sizeof(float) * (size_t)r->n_bias);
        q->n_bias = r->n_bias;
    }
    q->min_tokens = r->min_tokens;
    if (r->n_want > 0) {
        if (!(q->want_ids = malloc(sizeof(int32_t) * (size_t)r->n_want)))
            goto oom;
        memcpy(q->want_ids, r->want_ids, sizeof(int32_t) * (size_t)r->n_want);
    }
    q->score_from = -1;
    if (r->score_prompt) {
        const int32_t k = r->sp.logprobs_topk;
        q->prompt_lps = malloc(sizeof(float) * (size_t)r->n_prompt);
        q->prompt_ranks = calloc((size_t)r->n_prompt, sizeof(int32_t));
        if (r->sp.processed_logprobs && !(q->prompt_lps_proc = malloc(sizeof(float) * (size_t)r->n_prompt)))
            goto oom;
        if (k > 0) {
            q->prompt_top_ids = malloc(sizeof(int32_t) * (size_t)r->n_prompt * k);
            q->prompt_top_lps = malloc(sizeof(float) * (size_t)r->n_prompt * k);
        }
        if (r->n_want > 0 && !(q->prompt_want_lps = malloc(sizeof(float) * (size_t)r->n_prompt * r->n_want)))
            goto oom;
        if (!q->prompt_lps || !q->prompt_ranks || (k > 0 && (!q->prompt_top_ids || !q->prompt_top_lps)))
            goto oom;
        for (int32_t i = 0; i < r->n_prompt; i++) {
            q->prompt_lps[i] = NAN;
            if (q->prompt_lps_proc)
                q->prompt_lps_proc[i] = NAN;
        }
        for (size_t i = 0; q->prompt_want_lps && i < (size_t)r->n_prompt * r->n_want; i++)
            q->prompt_want_lps[i] = NAN;
        for (size_t i = 0; k > 0 && i < (size_t)r->n_prompt * k; i++) {
            q->prompt_top_ids[i] = -1;
            q->prompt_top_lps[i] = -INFINITY;
        }
        q->score_from = r->score_from;
    }
    q->id = e->next_id++;
    q->tag = r->tag;
    q->n = r->n;
    q->max_tokens = r->max_tokens;
    q->stream = r->stream != 0;
    q->return_routes = r->return_routes != 0;
    q->sp = r->sp;
    q->sp.n_want = r->n_want; /* the request's copy, not the caller's array */
    q->sp.want_ids = q->want_ids;
    q->n_prompt = r->n_prompt;
    q->n_stop = r->n_stop;
    memcpy(q->stop_ids, r->stop_ids ? r->stop_ids : q->stop_ids, sizeof(int32_t) * r->n_stop);
    if (!r->ignore_eos && e->eos >= 0 && q->n_stop < SEQ_MAX_STOP)
        q->stop_ids[q->n_stop++] = e->eos;
    if (!r->ignore_eos && e->eot >= 0 && q->n_stop < SEQ_MAX_STOP)
        q->stop_ids[q->n_stop++] = e->eot;
    q->edits = pen_wanted(q);
    if (with_lora) {
        lora_pinned pin;
        if ((rc = lora_set_pin(e->loras, r->lora, &pin))) { /* looked up above: only INT32_MAX pins fail */
            char msg[300];
            snprintf(msg, sizeof msg, "%s", rd_errmsg());
            seq_req_free(q);
            return rd_fail(rc, "request: %s", msg);
        }
        q->loras = e->loras;
        q->lora_slot = pin.slot;
        q->lora_version = pin.version;
        q->lora_uid = pin.uid;
        snprintf(q->lora_name, sizeof q->lora_name, "%s", pin.a->name);
    }

    seq *s = seq_new(q, 0, (int32_t)total + 1);
    if (!s)
        goto oom;
    memcpy(s->tokens, q->prompt, sizeof(int32_t) * q->n_prompt);
    s->n_tokens = q->n_prompt;
    s->fork_n = q->n;
    s->state = SEQ_WAITING;
    sched_add(&e->sched, s);
    *id = q->id;
    return 0;
oom:
    seq_req_free(q);
    return rd_fail(RD_ENOMEM, "request: out of memory");
}

int eng_busy(const engine *e) { return e->sched.waiting.count + e->sched.running.count > 0; }

/* ---- step ---- */

static int ensure_tables(engine *e, int32_t n_seqs, int32_t max_blocks)
{
    int32_t need = n_seqs * max_blocks;
    if (need <= e->tables_cap)
        return 0;
    int32_t *t = realloc(e->tables, sizeof(int32_t) * need);
    if (!t)
        return rd_fail(RD_ENOMEM, "engine: cannot grow block tables to %d entries", need);
    e->tables = t;
    e->tables_cap = need;
    return 0;
}

/* The routes of s's computed positions, read from its slots before its
 * blocks go back (out of memory: the result carries none, n_routes 0). */
static void take_routes(engine *e, seq *s)
{
    const int32_t bs = e->cfg.block_size, n = s->n_computed;
    const size_t per = (size_t)e->route_layers * e->route_k;
    if (!s->req->return_routes || !e->slot_routes || n <= 0 || !(s->routes = malloc(sizeof(int32_t) * n * per)))
        return;
    for (int32_t p = 0; p < n; p++) {
        const uint16_t *src = e->slot_routes + ((size_t)s->blocks.ids[p / bs] * bs + p % bs) * per;
        for (size_t i = 0; i < per; i++)
            s->routes[(size_t)p * per + i] = src[i];
    }
    s->n_routes = n;
}

/* After a forward: every row's routes into its slot (the runner's are
 * [n_layers][M][k], the slots' [slot][n_layers][k]). */
static int store_routes(engine *e, int32_t M)
{
    int rc = runner_routes(&e->run, M, e->step_routes);
    if (rc)
        return rc;
    const int32_t L = e->route_layers, k = e->route_k;
    for (int32_t row = 0; row < M; row++) {
        uint16_t *dst = e->slot_routes + (size_t)e->slot[row] * L * k;
        for (int32_t l = 0; l < L; l++)
            for (int32_t j = 0; j < k; j++)
                dst[l * k + j] = (uint16_t)e->step_routes[((size_t)l * M + row) * k + j];
    }
    return 0;
}

/* A copied block (copy-on-write) takes its source's routes with its KV. */
static void copy_routes(engine *e, const int32_t *src, const int32_t *dst, int32_t n)
{
    const size_t block = (size_t)e->cfg.block_size * e->route_layers * e->route_k;
    for (int32_t i = 0; i < n; i++)
        memcpy(e->slot_routes + (size_t)dst[i] * block, e->slot_routes + (size_t)src[i] * block,
               block * sizeof(uint16_t));
}

static void finish(engine *e, seq *s, finish_reason why)
{
    if (e->drafter && (why == FINISH_STOP || why == FINISH_LENGTH))
        spec_keep_output(s, e->store, e->version); /* drafts for its group's samples, and later requests */
    s->version_finish = e->version;
    take_routes(e, s);
    kv_free_seq(e->kv, &s->blocks);
    sched_remove(&e->sched, s);
    s->finish = why;
    s->state = SEQ_FINISHED;
    seq_list_push_back(&e->done, s);
    if (why == FINISH_ABORT || why == FINISH_ERROR)
        e->st.aborted++;
    else
        e->st.completed++;
}

/* Appends a sampled token; finishes the sequence on a stop id or a limit. */
static void append_token(engine *e, seq *s, const samp_result *r)
{
    const seq_req *q = s->req;
    int32_t g = s->n_tokens - q->n_prompt; /* index among generated tokens */
    s->tokens[s->n_tokens++] = r->token;
    s->logprobs[g] = r->logprob;
    if (s->logprobs_proc)
        s->logprobs_proc[g] = r->logprob_processed;
    int32_t k = q->sp.logprobs_topk;
    for (int32_t j = 0; j < k; j++) {
        s->top_ids[(size_t)g * k + j] = j < r->n_top ? r->top_ids[j] : -1;
        s->top_lps[(size_t)g * k + j] = j < r->n_top ? r->top_logprobs[j] : -INFINITY;
    }
    for (int32_t j = 0; s->want_lps && j < q->sp.n_want; j++)
        s->want_lps[(size_t)g * q->sp.n_want + j] = r->want_lps[j];
    e->st.generated_tokens++;
    if (s->n_spans == 0 || s->spans[s->n_spans - 1].version != e->version) {
        if (s->n_spans == s->spans_cap) {
            int32_t nc = s->spans_cap ? 2 * s->spans_cap : 2;
            seq_span *ns = realloc(s->spans, sizeof *ns * (size_t)nc);
            if (!ns) {
                finish(e, s, FINISH_ERROR); /* the token is kept; its version could not be recorded */
                return;
            }
            s->spans = ns;
            s->spans_cap = nc;
        }
        s->spans[s->n_spans++] = (seq_span){.start = g, .version = e->version};
    }
    if (g == 0)
        s->t_first_us = clock_now_us();
    for (int32_t i = 0; i < q->n_stop; i++)
        if (r->token == q->stop_ids[i]) {
            finish(e, s, FINISH_STOP);
            return;
        }
    if (q->stops.n > 0) {
        size_t len;
        const char *bytes = tok_token_bytes(e->cfg.tok, r->token, &len);
        int m = stop_scan_push(&s->scan, &q->stops, bytes, len);
        if (m > 0 && g + 1 <= q->min_tokens) {
            stop_scan_forget(&s->scan); /* vLLM matches stop strings only past min_tokens */
            m = 0;
        }
        if (m != 0) {
            finish(e, s, m > 0 ? FINISH_STOP : FINISH_ERROR);
            return;
        }
    }
    if (g + 1 >= q->max_tokens || s->n_tokens >= e->m->cfg.max_ctx)
        finish(e, s, FINISH_LENGTH);
}

static int ensure_draws(engine *e, int32_t n)
{
    if (n <= e->draws_cap)
        return 0;
    int32_t cap = e->draws_cap ? e->draws_cap : 64;
    while (cap < n)
        cap *= 2;
    rd_sample_req *q = realloc(e->sreq, sizeof *q * (size_t)cap);
    if (q)
        e->sreq = q;
    samp_result *r = realloc(e->sres, sizeof *r * (size_t)cap);
    if (r)
        e->sres = r;
    seq **ss = realloc(e->sseq, sizeof *ss * (size_t)cap);
    if (ss)
        e->sseq = ss;
    int32_t *rd = realloc(e->round, sizeof *rd * (size_t)cap);
    if (rd)
        e->round = rd;
    int32_t *ea = realloc(e->edit_at, sizeof *ea * (size_t)cap);
    if (ea)
        e->edit_at = ea;
    int32_t *sp = realloc(e->score_pos, sizeof *sp * (size_t)cap);
    if (sp)
        e->score_pos = sp;
    if (!q || !r || !ss || !rd || !ea || !sp)
        return rd_fail(RD_ENOMEM, "engine: cannot grow the step's draws to %d", n);
    e->draws_cap = cap;
    return 0;
}

/* Queues a draw for s from logit row `row`: the RNG counter is (sample index,
 * position of the token to be drawn), as on every backend. */
static int add_draw_at(engine *e, int32_t *n, seq *s, int32_t row, int32_t pos)
{
    int rc = ensure_draws(e, *n + 1);
    if (rc)
        return rc;
    e->sreq[*n] = (rd_sample_req){
        .row = row, .sample_idx = (uint32_t)s->sample_idx, .pos = (uint32_t)pos, .sp = &s->req->sp};
    e->edit_at[*n] = e->n_edits;
    e->score_pos[*n] = -1;
    if (s->req->edits && (rc = pen_build(&e->pen, s, pos, &e->edits, &e->n_edits, &e->edits_cap)))
        return rc;
    e->sreq[*n].n_edits = e->n_edits - e->edit_at[*n];
    e->sseq[(*n)++] = s;
    return 0;
}

/* Queues the scoring of prompt token pos of s from logit row `row` (position pos - 1's). */
static int add_score(engine *e, int32_t *n, seq *s, int32_t row, int32_t pos)
{
    int rc = ensure_draws(e, *n + 1);
    if (rc)
        return rc;
    e->sreq[*n] = (rd_sample_req){.row = row, .sample_idx = (uint32_t)s->sample_idx, .pos = (uint32_t)pos,
                                  .sp = &s->req->sp, .score = 1, .score_token = s->req->prompt[pos]};
    e->edit_at[*n] = e->n_edits;
    e->score_pos[*n] = pos;
    e->sseq[(*n)++] = s;
    return 0;
}

static int add_draw(engine *e, int32_t *n, seq *s, int32_t row) { return add_draw_at(e, n, s, row, s->n_tokens); }

/* A prefilled group parent becomes fork_n samples sharing its blocks; each
 * queues a draw of its first token from the parent's logit row. */
static int fork_group(engine *e, seq *parent, int32_t row, int32_t *n_draws)
{
    int32_t n = parent->fork_n;
    parent->fork_n = 1;
    int rc = add_draw(e, n_draws, parent, row);
    seq *at = parent;
    for (int32_t i = 1; i < n && !rc; i++) {
        seq *c = seq_new(parent->req, parent->sample_idx + i, parent->cap);
        if (!c)
            return rd_fail(RD_ENOMEM, "engine: cannot fork sample %d", i);
        memcpy(c->tokens, parent->tokens, sizeof(int32_t) * parent->n_tokens);
        c->n_tokens = parent->n_tokens;
        c->n_computed = parent->n_computed;
        c->n_published = parent->n_published;
        c->kv_version = parent->kv_version;
        if ((rc = kv_fork(e->kv, &parent->blocks, &c->blocks))) {
            seq_destroy(c);
            return rc;
        }
        c->state = SEQ_RUNNING;
        /* Next to its parent: the running queue stays in admission order, so
           preemption still takes the newest request first. */
        seq_list_insert_after(&e->sched.running, at, c);
        at = c;
        rc = add_draw(e, n_draws, c, row);
    }
    return rc;
}

/* One host draw; rows are independent, so which thread runs it changes nothing. */
static void draw_task(void *ctx, int32_t k, int32_t worker)
{
    engine *e = ctx;
    const int32_t vocab = e->m->cfg.vocab;
    const int32_t i = e->round[k];
    const rd_sample_req *q = &e->sreq[i];
    char *scratch = (char *)e->samp_scratch + samp_stride(vocab) * (size_t)worker;
    const float *raw = e->logits + (size_t)q->row * vocab;
    if (q->score) {
        if (samp_score(q->sp, raw, vocab, q->score_token, scratch, &e->sres[i]))
            e->sres[i].token = -1;
        return;
    }
    float *proc = NULL;
    if (q->n_edits > 0) {
        proc = (float *)(scratch + ((samp_scratch_bytes(vocab) + 63) & ~(size_t)63));
        samp_apply_edits(q->sp, raw, vocab, q->edits, q->n_edits, proc);
    }
    if (samp_sample_ex(q->sp, raw, proc, vocab, q->sample_idx, q->pos, scratch, &e->sres[i]))
        e->sres[i].token = -1;
}

/* Appends draw i's token to its sequence. A drafting sequence keeps a draw
 * only while every earlier one was its draft: after a finish or a differing
 * draw, the later rows were fed wrong tokens. */
/* A scoring draw's log-prob (and alternatives) into its request's prompt arrays. */
static void take_score(engine *e, int32_t i)
{
    seq_req *q = e->sseq[i]->req;
    const int32_t pos = e->score_pos[i], k = q->sp.logprobs_topk;
    const samp_result *r = &e->sres[i];
    if (r->token < 0)
        return; /* logits the sampler refuses: the position stays unscored (NAN) */
    q->prompt_lps[pos] = r->logprob;
    q->prompt_ranks[pos] = r->rank;
    for (int32_t j = 0; q->prompt_want_lps && j < q->sp.n_want; j++)
        q->prompt_want_lps[(size_t)pos * q->sp.n_want + j] = r->want_lps[j];
    if (q->prompt_lps_proc)
        q->prompt_lps_proc[pos] = r->logprob_processed;
    for (int32_t j = 0; j < k && q->prompt_top_ids; j++) {
        q->prompt_top_ids[(size_t)pos * k + j] = j < r->n_top ? r->top_ids[j] : -1;
        q->prompt_top_lps[(size_t)pos * k + j] = j < r->n_top ? r->top_logprobs[j] : -INFINITY;
    }
    if (pos + 1 > q->score_next)
        q->score_next = pos + 1;
}

static void take_draw(engine *e, int32_t i)
{
    if (e->score_pos[i] >= 0) {
        take_score(e, i);
        return;
    }
    seq *s = e->sseq[i];
    int32_t j = -1; /* a drafting sequence's draw: of token spec_base + j */
    if (s->n_draft > 0) {
        if (s->state == SEQ_FINISHED || s->spec_rejected)
            return;
        j = (int32_t)e->sreq[i].pos - s->spec_base;
        s->n_computed = s->n_tokens; /* K/V up to this row's input are right: routes, a finish */
    }
    if (e->sres[i].token < 0) {
        finish(e, s, FINISH_ERROR);
        return;
    }
    append_token(e, s, &e->sres[i]);
    if (j >= 0 && j < s->n_draft) {
        if (e->sres[i].token == s->draft[j]) {
            e->st.spec_accepted++;
            s->spec_n_accepted++;
        } else
            s->spec_rejected = 1;
    }
}

/* Which round draw i belongs to: its index among its sequence's draws (0 for a
 * sequence that did not draft). */
static int32_t draw_round(const engine *e, int32_t i)
{
    const seq *s = e->sseq[i];
    if (e->score_pos[i] >= 0)
        return 0;
    return s->n_draft > 0 ? (int32_t)e->sreq[i].pos - s->spec_base : 0;
}

/* Draws every queued token, on the device when the backend samples there,
 * then appends them; a row the sampler rejects finishes its sequence. On the
 * host the draws go in rounds: round r holds each sequence's r-th draw, made
 * only while its earlier draws all matched their drafts, since a draw after a
 * rejected draft is thrown away and a full-vocabulary draw (temperature,
 * top-p) costs about as much as a decode row of a small model. Each draw is
 * still the one it would be (same logits, same counter): only which are made
 * changes. The device draws all at once: one launch, and its draws are cheap. */
static int draw_tokens(engine *e, int32_t n)
{
    if (n == 0)
        return 0;
    /* The edit list is complete (no more reallocation): point each draw at its entries. */
    for (int32_t i = 0; i < n; i++)
        e->sreq[i].edits = e->sreq[i].n_edits > 0 ? e->edits + e->edit_at[i] : NULL;
    if (e->device_sampling) {
        int rc = runner_sample(&e->run, e->sreq, n, e->sres);
        if (rc) {
            /* Their logits are gone: they end (with what they have) rather than wait forever. */
            for (int32_t i = 0; i < n; i++)
                if (e->sseq[i]->state != SEQ_FINISHED) /* a drafting sequence has several draws */
                    finish(e, e->sseq[i], FINISH_ERROR);
            return rc;
        }
        for (int32_t i = 0; i < n; i++)
            take_draw(e, i);
        return 0;
    }
    for (int32_t r = 0;; r++) {
        int32_t k = 0, later = 0;
        for (int32_t i = 0; i < n; i++) {
            const int32_t ri = draw_round(e, i);
            const seq *s = e->sseq[i];
            if (ri > r)
                later = 1;
            if (ri == r && (r == 0 || (s->state != SEQ_FINISHED && !s->spec_rejected)))
                e->round[k++] = i;
        }
        if (k > 1 && e->samp_workers > 1 && pool_size() <= e->samp_workers)
            pool_run(k, draw_task, e);
        else
            for (int32_t q = 0; q < k; q++)
                draw_task(e, q, 0);
        for (int32_t q = 0; q < k; q++)
            take_draw(e, e->round[q]);
        if (!later)
            return 0;
    }
}

static int step_once(engine *e)
{
    if (e->paused || !e->kv || e->weights_released)
        return 0;
    /* With a drafter, steps are timed whole for spec_cost: drafting, forward, draws and rollback. */
    const int64_t t_begin = e->drafter ? clock_now_ns() : 0;
    const spec_plan_cfg pc = {.max_draft = e->cfg.spec_max_draft, .max_batch = e->cfg.spec_max_batch,
                              .max_ctx = e->m->cfg.max_ctx, .logit_rows = e->logit_cap, .store = e->store,
                              .version = e->version, .cost = e->cfg.spec_fixed ? NULL : &e->cost};
    if (e->drafter && spec_plan(&e->sched, e->drafter, &pc) < 0)
        return rd_fail(RD_EINVAL, "engine: the %s drafter failed: %s", e->drafter->name, rd_errmsg());
    int32_t n_sched = sched_step(&e->sched, e->version);
    seq **batch = e->sched.batch;
    if (n_sched == 0)
        return 0;
    const int32_t bs = e->cfg.block_size;
    int32_t max_blocks = 1;
    for (int32_t i = 0; i < n_sched; i++)
        if (batch[i]->blocks.n > max_blocks)
            max_blocks = batch[i]->blocks.n;
    int rc = ensure_tables(e, n_sched, max_blocks);
    if (rc)
        return rc;

    /* Rows in sequence order; a sequence that catches up gets a logit row, and
       one with drafts (past its last token) a logit row at each of them too:
       the verify forward (spec_verify.h), row for row the decode arithmetic. */
    int32_t M = 0, n_logits = 0;
    for (int32_t i = 0; i < n_sched; i++) {
        seq *s = batch[i];
        e->q_start[i] = M;
        s->score_rows = 0;
        for (int32_t j = 0; j < s->sched_rows; j++, M++) {
            int32_t p = s->n_computed + j;
            e->tok[M] = p < s->n_tokens ? s->tokens[p] : s->draft[p - s->n_tokens];
            if (e->lora_row)
                e->lora_row[M] = s->req->lora_slot;
            e->pos[M] = p;
            e->slot[M] = s->blocks.ids[p / bs] * bs + p % bs;
            if (p >= s->n_tokens - 1 && s->n_computed + s->sched_rows >= s->n_tokens) {
                if (s->req->max_tokens > 0) /* a request that only scores draws nothing */
                    e->logit_rows[n_logits++] = M;
            } else if (seq_scores(s, p)) {
                e->logit_rows[n_logits++] = M; /* scores prompt token p + 1 */
                s->score_rows++;
            }
        }
        e->ctx_len[i] = s->n_computed + s->sched_rows;
        memcpy(e->tables + (size_t)i * max_blocks, s->blocks.ids, sizeof(int32_t) * s->blocks.n);
    }
    e->q_start[n_sched] = M;

    if ((rc = runner_copy_blocks(&e->run, e->sched.cow_src, e->sched.cow_dst, e->sched.n_cow)))
        return rc;
    if (e->slot_routes)
        copy_routes(e, e->sched.cow_src, e->sched.cow_dst, e->sched.n_cow);
    rd_step step = {
        .n_rows = M, .n_seqs = n_sched, .max_blocks = max_blocks, .token_ids = e->tok, .positions = e->pos,
        .slots = e->slot, .q_start = e->q_start, .ctx_len = e->ctx_len, .block_tables = e->tables,
        .lora_slots = e->lora_row,
    };
    /* Only decode and verify steps (every row a logit row: no prompt rows) go into spec_cost. */
    const int timed = t_begin && n_logits == M;
    if ((rc = runner_forward(&e->run, &step, e->logit_rows, n_logits, e->device_sampling ? NULL : e->logits)))
        return rc;
    if (e->slot_routes && (rc = store_routes(e, M)))
        return rc;

    e->st.steps++;
    e->st.rows_total += M;
    e->st.seqs_total += n_sched;
    int32_t li = 0, n_draws = 0, n_spec = 0;
    e->n_edits = 0;
    for (int32_t i = 0; i < n_sched; i++) {
        seq *s = batch[i];
        int32_t prompt_rows = s->req->n_prompt - s->n_computed; /* recomputed ones included */
        if (prompt_rows > 0)
            e->st.prompt_tokens += prompt_rows < s->sched_rows ? prompt_rows : s->sched_rows;
        /* Its scoring rows come first among its logit rows (positions before its last). */
        for (int32_t j = 0, p = s->n_computed; j < s->score_rows && !rc; p++)
            if (seq_scores(s, p)) {
                rc = add_score(e, &n_draws, s, li++, p + 1);
                j++;
            }
        if (rc)
            return rc;
        sched_commit(&e->sched, s, e->version);
        if (s->n_computed < s->n_tokens)
            continue;
        if (s->req->max_tokens == 0) {
            finish(e, s, FINISH_LENGTH); /* scored, nothing to generate */
            continue;
        }
        if (e->drafter && s->n_tokens > s->req->n_prompt)
            s->spec_n_steps++; /* a decode step draws for it (a group's first tokens come from the prefill) */
        if (s->n_draft > 0) {
            /* The last token's row, then one per draft: draws of tokens n_tokens .. n_tokens + n_draft. */
            for (int32_t j = 0; j <= s->n_draft && !rc; j++)
                rc = add_draw_at(e, &n_draws, s, li + j, s->n_tokens + j);
            if (rc)
                return rc;
            li += 1 + s->n_draft;
            e->st.spec_drafted += s->n_draft;
            s->spec_n_drafted += s->n_draft;
            n_spec++;
            continue;
        }
        /* A group parent forks now; each sample draws its first token from the parent's row. */
        if ((rc = s->fork_n > 1 ? fork_group(e, s, li, &n_draws) : add_draw(e, &n_draws, s, li)))
            return rc;
        li++;
    }
    int64_t t0 = clock_now_ns();
    rc = draw_tokens(e, n_draws);
    const int64_t t1 = clock_now_ns();
    e->st.ns_sample += t1 - t0;
    if (n_spec > 0) {
        e->st.spec_steps++;
        /* The KV of rejected drafts goes; a finished sequence gave back all of it. */
        for (int32_t i = 0; i < n_sched; i++)
            if (batch[i]->n_draft > 0) {
                spec_feedback(batch[i], e->cfg.spec_max_draft, &e->cost);
                if (batch[i]->state == SEQ_FINISHED) {
                    batch[i]->n_draft = 0;
                    batch[i]->spec_rejected = 0;
                } else {
                    spec_rollback(&e->sched, batch[i]);
                }
            }
    }
    if (rc)
        return rc;
    if (timed)
        spec_cost_observe(&e->cost, M, clock_now_ns() - t_begin);
    return M;
}

/* One step. Under device sampling the forward returns with its work queued
 * (runner.async_forward), so the bookkeeping between it and the draw runs
 * beside the GPU; the step still ends with the device idle on every path,
 * so a weight swap or a KV release between steps never races a forward. */
int eng_step(engine *e)
{
    const int rc = step_once(e);
    const int wrc = runner_wait(&e->run);
    return rc < 0 ? rc : wrc ? wrc : rc;
}

/* ---- results ---- */

/* Finishes s with FINISH_ABORT; returns the samples that ended. */
static int32_t abort_seq(engine *e, seq *s)
{
    /* An unforked group parent stands for all its samples. */
    int32_t n = 1;
    for (int32_t i = 1; i < s->fork_n; i++) {
        seq *c = seq_new(s->req, s->sample_idx + i, 1);
        if (!c)
            continue; /* out of memory: the sample is lost rather than the engine */
        c->n_tokens = s->req->n_prompt;
        c->finish = FINISH_ABORT;
        c->version_finish = e->version;
        c->state = SEQ_FINISHED;
        seq_list_push_back(&e->done, c);
        e->st.aborted++;
        n++;
    }
    s->fork_n = 1;
    finish(e, s, FINISH_ABORT);
    return n;
}

int eng_abort(engine *e, int64_t id)
{
    int found = 0;
    seq_list *lists[] = {&e->sched.waiting, &e->sched.running};
    for (int li = 0; li < 2; li++) {
        for (seq *s = lists[li]->head; s;) {
            seq *next = s->next;
            if (s->req->id == id) {
                found = 1;
                abort_seq(e, s);
            }
            s = next;
        }
    }
    return found ? 0 : rd_fail(RD_ENOENT, "abort: request %lld is not waiting or running", (long long)id);
}

/* ---- weight updates ---- */

void eng_set_version(engine *e, uint64_t version) { e->version = version; }
void eng_pause(engine *e, int pause) { e->paused = pause != 0; }
int eng_paused(const engine *e) { return e->paused; }
int32_t eng_flush_cache(engine *e) { return e->kv ? kv_prefix_flush(e->kv) : 0; }
int32_t eng_retract(engine *e) { return sched_retract_all(&e->sched); }

int eng_release_kv(engine *e)
{
    if (eng_busy(e))
        return rd_fail(RD_EBUSY, "the engine has %d running and %d waiting sequences: the KV cache is in use",
                       e->sched.running.count, e->sched.waiting.count);
    if (!e->kv)
        return 0;
    runner_kv_free(&e->run);
    kv_destroy(e->kv);
    e->kv = e->sched.kv = NULL;
    free(e->slot_routes);
    e->slot_routes = NULL;
    return 0;
}

int eng_resume_kv(engine *e)
{
    if (e->kv)
        return 0;
    const model_config *c = &e->m->cfg;
    kv_pool *kv;
    int rc = kv_create(e->n_blocks, e->cfg.block_size, &kv);
    if (rc)
        return rc;
    if ((rc = runner_kv_alloc(&e->run))) {
        kv_destroy(kv);
        return rc;
    }
    if (c->n_experts > 0) {
        size_t per = (size_t)c->n_layers * c->n_experts_used;
        e->slot_routes = calloc((size_t)e->n_blocks * e->cfg.block_size * per, sizeof(uint16_t));
        if (!e->slot_routes) {
            runner_kv_free(&e->run);
            kv_destroy(kv);
            return rd_fail(RD_ENOMEM, "engine: cannot allocate the routes of the KV slots");
        }
    }
    e->kv = e->sched.kv = kv;
    return 0;
}

int eng_set_weights_released(engine *e, int released)
{
    if (released && eng_busy(e))
        return rd_fail(RD_EBUSY, "the engine has %d running and %d waiting sequences: the weights are in use",
                       e->sched.running.count, e->sched.waiting.count);
    e->weights_released = released != 0;
    if (!released)
        runner_rebind(&e->run);
    return 0;
}
uint64_t eng_version(const engine *e) { return e->version; }
void eng_hold_new(engine *e, int hold) { e->sched.hold_new = hold != 0; }

int32_t eng_started(const engine *e)
{
    int32_t n = e->sched.running.count;
    for (const seq *s = e->sched.waiting.head; s; s = s->next)
        n += seq_started(s);
    return n;
}

int32_t eng_abort_started(engine *e)
{
    int32_t n = 0;
    seq_list *lists[] = {&e->sched.waiting, &e->sched.running};
    for (int li = 0; li < 2; li++) {
        for (seq *s = lists[li]->head; s;) {
            seq *next = s->next;
            if (s->state == SEQ_RUNNING || seq_started(s))
                n += abort_seq(e, s);
            s = next;
        }
    }
    return n;
}

int eng_collect(engine *e, eng_result *out, int max)
{
    int n = 0;
    while (n < max && e->done.head) {
        seq *s = e->done.head;
        seq_list_remove(&e->done, s);
        const seq_req *q = s->req;
        eng_result *r = &out[n++];
        memset(r, 0, sizeof *r);
        int32_t g = s->n_tokens - q->n_prompt;
        if (g < 0)
            g = 0;
        r->req_id = q->id;
        r->tag = q->tag;
        r->sample_idx = s->sample_idx;
        r->n_prompt = q->n_prompt;
        r->prompt_ids = malloc(sizeof(int32_t) * q->n_prompt);
        if (r->prompt_ids)
            memcpy(r->prompt_ids, q->prompt, sizeof(int32_t) * q->n_prompt);
        r->n_tokens = g;
        r->token_ids = malloc(sizeof(int32_t) * (g + 1));
        r->logprobs = malloc(sizeof(float) * (g + 1));
        if (r->token_ids && g)
            memcpy(r->token_ids, s->tokens + q->n_prompt, sizeof(int32_t) * g);
        if (r->logprobs && g)
            memcpy(r->logprobs, s->logprobs, sizeof(float) * g);
        if (s->logprobs_proc) {
            r->logprobs_proc = malloc(sizeof(float) * (g + 1));
            if (r->logprobs_proc && g)
                memcpy(r->logprobs_proc, s->logprobs_proc, sizeof(float) * g);
        }
        int32_t k = q->sp.logprobs_topk;
        if (k > 0 && s->top_ids) {
            r->n_top = k;
            r->top_ids = malloc(sizeof(int32_t) * ((size_t)g * k + 1));
            r->top_logprobs = malloc(sizeof(float) * ((size_t)g * k + 1));
            if (r->top_ids && g)
                memcpy(r->top_ids, s->top_ids, sizeof(int32_t) * (size_t)g * k);
            if (r->top_logprobs && g)
                memcpy(r->top_logprobs, s->top_lps, sizeof(float) * (size_t)g * k);
        }
        r->n_want = q->sp.n_want;
        if (s->want_lps && (r->want_logprobs = malloc(sizeof(float) * ((size_t)g * q->sp.n_want + 1))) && g)
            memcpy(r->want_logprobs, s->want_lps, sizeof(float) * (size_t)g * q->sp.n_want);
        if (q->prompt_lps) {
            /* scored prompt positions: every sample of the request carries them */
            r->prompt_logprobs = malloc(sizeof(float) * (size_t)q->n_prompt);
            if (r->prompt_logprobs)
                memcpy(r->prompt_logprobs, q->prompt_lps, sizeof(float) * (size_t)q->n_prompt);
            r->prompt_ranks = malloc(sizeof(int32_t) * (size_t)q->n_prompt);
            if (r->prompt_ranks)
                memcpy(r->prompt_ranks, q->prompt_ranks, sizeof(int32_t) * (size_t)q->n_prompt);
            if (q->prompt_lps_proc && (r->prompt_logprobs_proc = malloc(sizeof(float) * (size_t)q->n_prompt)))
                memcpy(r->prompt_logprobs_proc, q->prompt_lps_proc, sizeof(float) * (size_t)q->n_prompt);
            const size_t nw = (size_t)q->n_prompt * q->sp.n_want;
            if (q->prompt_want_lps && (r->prompt_want_logprobs = malloc(sizeof(float) * nw)))
                memcpy(r->prompt_want_logprobs, q->prompt_want_lps, sizeof(float) * nw);
            r->n_top = k;
            r->n_prompt_top = k;
            if (k > 0 && q->prompt_top_ids) {
                r->prompt_top_ids = malloc(sizeof(int32_t) * (size_t)q->n_prompt * k);
                r->prompt_top_logprobs = malloc(sizeof(float) * (size_t)q->n_prompt * k);
                if (r->prompt_top_ids)
                    memcpy(r->prompt_top_ids, q->prompt_top_ids, sizeof(int32_t) * (size_t)q->n_prompt * k);
                if (r->prompt_top_logprobs)
                    memcpy(r->prompt_top_logprobs, q->prompt_top_lps, sizeof(float) * (size_t)q->n_prompt * k);
            }
        }
        r->finish = s->finish;
        r->stop_str = s->scan.matched;
        r->stop_text_offset = s->scan.matched >= 0 ? s->scan.match_at : 0;
        r->version_finish = s->version_finish;
        snprintf(r->lora, sizeof r->lora, "%s", q->lora_name);
        r->lora_version = q->lora_version;
        if (g > 0 && s->n_spans > 0) {
            r->spans = malloc(sizeof *r->spans * (size_t)s->n_spans);
            if (r->spans) {
                r->n_spans = s->n_spans;
                for (int32_t i = 0; i < s->n_spans; i++)
                    r->spans[i] = (eng_span){.start = s->spans[i].start,
                                             .end = i + 1 < s->n_spans ? s->spans[i + 1].start : g,
                                             .version = s->spans[i].version};
            }
        }
        r->n_preempt = s->n_preempt;
        r->spec_drafted = s->spec_n_drafted;
        r->spec_accepted = s->spec_n_accepted;
        r->spec_steps = s->spec_n_steps;
        r->t_first_token_us = s->t_first_us;
        if (s->routes) {
            r->n_routes = s->n_routes;
            r->route_layers = e->route_layers;
            r->route_k = e->route_k;
            r->routes = s->routes;
            s->routes = NULL;
        }
        seq_destroy(s);
    }
    return n;
}

/* Copies generated tokens [from, to) of s (ids, log-probs, alternatives)
 * into a zeroed r; 0 or RD_ENOMEM (r then holds what was allocated). */
static int copy_tokens(const seq *s, int32_t from, int32_t to, eng_result *r)
{
    const seq_req *q = s->req;
    int32_t g = to - from, k = q->sp.logprobs_topk;
    r->n_tokens = g;
    r->token_ids = malloc(sizeof(int32_t) * (size_t)(g + 1));
    r->logprobs = malloc(sizeof(float) * (size_t)(g + 1));
    if (!r->token_ids || !r->logprobs)
        return RD_ENOMEM;
    memcpy(r->token_ids, s->tokens + q->n_prompt + from, sizeof(int32_t) * (size_t)g);
    memcpy(r->logprobs, s->logprobs + from, sizeof(float) * (size_t)g);
    if (s->logprobs_proc) {
        if (!(r->logprobs_proc = malloc(sizeof(float) * (size_t)(g + 1))))
            return RD_ENOMEM;
        memcpy(r->logprobs_proc, s->logprobs_proc + from, sizeof(float) * (size_t)g);
    }
    if (k > 0 && s->top_ids) {
        r->n_top = k;
        r->top_ids = malloc(sizeof(int32_t) * ((size_t)g * k + 1));
        r->top_logprobs = malloc(sizeof(float) * ((size_t)g * k + 1));
        if (!r->top_ids || !r->top_logprobs)
            return RD_ENOMEM;
        memcpy(r->top_ids, s->top_ids + (size_t)from * k, sizeof(int32_t) * (size_t)g * k);
        memcpy(r->top_logprobs, s->top_lps + (size_t)from * k, sizeof(float) * (size_t)g * k);
    }
    if (s->want_lps) {
        const int32_t w = q->sp.n_want;
        r->n_want = w;
        if (!(r->want_logprobs = malloc(sizeof(float) * ((size_t)g * w + 1))))
            return RD_ENOMEM;
        memcpy(r->want_logprobs, s->want_lps + (size_t)from * w, sizeof(float) * (size_t)g * w);
    }
    return 0;
}

int eng_collect_progress(engine *e, eng_result *out, int max)
{
    int n = 0;
    /* Running sequences, and preempted ones (they keep their tokens, and may
       have sampled some since the last delivery). */
    seq_list *lists[] = {&e->sched.running, &e->sched.waiting};
    for (int li = 0; li < 2; li++)
        for (seq *s = lists[li]->head; s && n < max; s = s->next) {
            const seq_req *q = s->req;
            int32_t g = s->n_tokens - q->n_prompt;
            if (!q->stream || g <= s->n_streamed)
                continue;
            eng_result *r = &out[n];
            memset(r, 0, sizeof *r);
            if (copy_tokens(s, s->n_streamed, g, r)) {
                eng_result_free(r); /* out of memory: the tokens come with the final result instead */
                continue;
            }
            r->partial = 1;
            r->token_offset = s->n_streamed;
            r->req_id = q->id;
            r->tag = q->tag;
            r->sample_idx = s->sample_idx;
            r->n_prompt = q->n_prompt;
            r->finish = FINISH_NONE;
            r->stop_str = -1;
            s->n_streamed = g;
            n++;
        }
    return n;
}

void eng_result_free(eng_result *r)
{
    free(r->prompt_ids);
    free(r->token_ids);
    free(r->logprobs);
    free(r->logprobs_proc);
    free(r->top_ids);
    free(r->top_logprobs);
    free(r->spans);
    free(r->routes);
    free(r->prompt_logprobs);
    free(r->prompt_top_ids);
    free(r->prompt_top_logprobs);
    free(r->prompt_logprobs_proc);
    free(r->prompt_ranks);
    free(r->want_logprobs);
    free(r->prompt_want_logprobs);
    memset(r, 0, sizeof *r);
}

void eng_get_stats(const engine *e, eng_stats *s)
{
    *s = e->st;
    s->running = e->sched.running.count;
    s->waiting = e->sched.waiting.count;
    s->preemptions = e->sched.preemptions;
    s->prefix_query_tokens = e->sched.prefix_query_tokens;
    s->prefix_hit_tokens = e->sched.prefix_hit_tokens;
    kv_stats ks = {0};
    if (e->kv)
        kv_get_stats(e->kv, &ks);
    s->kv_released = e->kv == NULL;
    s->weights_released = e->weights_released;
    s->kv_blocks_total = ks.blocks_total;
    s->kv_blocks_used = ks.blocks_used;
    s->kv_blocks_cached = ks.blocks_cached;
    s->paused = e->paused;
    s->kv_peak_blocks = ks.peak_used;
    s->kv_waste_at_peak = ks.waste_at_peak;
    s->device_sampling = e->device_sampling;
    s->spec_decode = e->cfg.spec_decode;
    s->spec_max_draft = e->cfg.spec_max_draft;
    s->spec_max_batch = e->cfg.spec_max_batch;
    s->spec_fixed = e->cfg.spec_fixed;
    s->spec_cost_fitted = e->cost.fitted;
    s->spec_step_ns = e->cost.fitted ? e->cost.a_ns : 0;
    s->spec_row_ns = e->cost.fitted ? e->cost.b_ns : 0;
    spec_store_stats ss;
    spec_store_get_stats(e->store, &ss);
    s->spec_store_bytes = ss.bytes;
    s->spec_store_max_bytes = ss.max_bytes;
    s->spec_store_entries = ss.entries;
    s->ns_layers = e->run.ns_layers;
    s->ns_head = e->run.ns_head;
}
