/* admit.c - the checks both front doors apply before a request is queued. */
#include "daemon/admit.h"

#include <stdio.h>
#include <sys/random.h>

#include "base/clock.h"
#include "base/err.h"
#include "daemon/daemon.h"

_Static_assert(PROTO_MAX_BIAS <= ENG_MAX_BIAS, "the protocol allows more logit_bias entries than the engine");
_Static_assert(PROTO_MAX_LORA_NAME < LORA_NAME_MAX, "the protocol allows longer adapter names than the engine");

adm_limits adm_limits_of(const struct rd_daemon *d)
{
    adm_limits l = {.lim = &d->lim, .block_size = d->cfg.block_size, .kv_blocks_total = d->kv_blocks_total,
                    .max_queued_requests = (uint64_t)d->cfg.max_queued_requests};
    const model_config *mc = &d->L.m->cfg;
    if (mc->n_experts > 0) {
        l.route_layers = (uint16_t)mc->n_layers;
        l.route_k = (uint8_t)mc->n_experts_used;
        l.route_width = proto_route_width((uint32_t)mc->n_experts);
    }
    return l;
}

uint64_t adm_result_max_bytes(const adm_limits *l, const proto_request *r, uint32_t n_prompt)
{
    uint64_t bytes = proto_result_max_bytes(r->max_tokens, (r->flags & PROTO_REQ_PROCESSED_LOGPROBS) != 0,
                                            r->logprobs_topk);
    if ((r->flags & PROTO_REQ_RETURN_ROUTES) && l->route_layers)
        bytes += proto_routes_bytes((uint64_t)n_prompt + r->max_tokens - 1, l->route_layers, l->route_k,
                                    l->route_width);
    if (l->lim->version >= 3)
        bytes += PROTO_SERVE_TAIL_BYTES; /* the result's serve_dtype tail (RESULT_SERVE) */
    if (r->flags & PROTO_REQ_SCORE)      /* its prompt's scores (RESULT_SCORES, version 5) */
        bytes += proto_scores_bytes(r->score_from >= 0 && (uint32_t)r->score_from <= n_prompt
                                        ? n_prompt - (uint32_t)r->score_from : 0, r->logprobs_topk);
    if (r->flags & PROTO_REQ_LORA)       /* its adapter's name and version (RESULT_LORA, version 6) */
        bytes += proto_lora_bytes(r->lora.len);
    return bytes;
}

int adm_lora_resident(const struct rd_daemon *d, const proto_request *r, char *msg, size_t cap)
{
    /* proto_check_request has held the name to 1..PROTO_MAX_LORA_NAME bytes without NUL: a C string */
    if (!(r->flags & PROTO_REQ_LORA) || r->lora.len == 0 || lr_find(&d->loras, r->lora.ptr))
        return 0;
    snprintf(msg, cap, "LoRA adapter '%.*s' is not loaded; expected the name of a loaded adapter (POST "
             "/v1/load_lora_adapter loads one, GET /v1/models lists them)", (int)r->lora.len, r->lora.ptr);
    return -1;
}

int adm_fits_message(const adm_limits *l, const proto_request *r, uint32_t n_prompt, char *msg, size_t cap)
{
    uint64_t bytes = adm_result_max_bytes(l, r, n_prompt) + PROTO_RESULTS_OVERHEAD;
    if (bytes <= l->lim->max_message_bytes)
        return 0;
    if (!((r->flags & PROTO_REQ_RETURN_ROUTES) && l->route_layers)) {
        /* only the version-3 serve tail (4 bytes), and a text prompt's scores, past what proto_check_request
           allowed */
        snprintf(msg, cap, "a result of max_tokens = %u with these log-prob options, its serve_dtype tail%s%s can "
                 "take %llu bytes; expected it to fit max_message_bytes = %llu", r->max_tokens,
                 (r->flags & PROTO_REQ_SCORE) ? " and its prompt's scores" : "",
                 (r->flags & PROTO_REQ_LORA) ? " and its adapter's name" : "", (unsigned long long)bytes,
                 (unsigned long long)l->lim->max_message_bytes);
        return -1;
    }
    snprintf(msg, cap, "a result of max_tokens = %u with routed experts (%llu positions x %u layers x %u experts) can "
             "take %llu bytes; expected it to fit max_message_bytes = %llu", r->max_tokens,
             (unsigned long long)n_prompt + r->max_tokens - 1, l->route_layers, l->route_k,
             (unsigned long long)bytes, (unsigned long long)l->lim->max_message_bytes);
    return -1;
}

int adm_check(const adm_limits *l, const proto_request *r, char *msg, size_t cap)
{
    if (proto_check_request(r, l->lim) == 0)
        return 0;
    snprintf(msg, cap, "%s", rd_errmsg());
    return -1;
}

int adm_fits_kv(const adm_limits *l, uint64_t n_prompt, uint64_t max_tokens, char *msg, size_t cap)
{
    uint64_t total = n_prompt + max_tokens;
    uint64_t need = (total + (uint64_t)l->block_size - 1) / (uint64_t)l->block_size;
    if (need <= (uint64_t)l->kv_blocks_total)
        return 0;
    snprintf(msg, cap, "%llu tokens need %llu KV blocks; the pool has %d (kv_cache_bytes)", (unsigned long long)total,
             (unsigned long long)need, l->kv_blocks_total);
    return -1;
}

int adm_queue_room(const adm_limits *l, uint64_t unfinished, uint64_t adding, char *msg, size_t cap)
{
    if (unfinished + adding <= l->max_queued_requests)
        return 0;
    snprintf(msg, cap, "%llu requests queued or running (max_queued_requests); fetch results and resubmit",
             (unsigned long long)unfinished);
    return -1;
}

uint64_t adm_random_seed(uint64_t salt)
{
    uint64_t seed;
    if (getrandom(&seed, sizeof seed, 0) == (ssize_t)sizeof seed)
        return seed;
    return (uint64_t)clock_now_us() ^ (salt << 32);
}

void adm_engine_request(const proto_request *r, const int32_t *prompt, uint32_t n_prompt, uint64_t seed,
                        eng_request *er)
{
    *er = (eng_request){
        .prompt = prompt,
        .n_prompt = (int32_t)n_prompt,
        .n = (int32_t)r->n,
        .max_tokens = (int32_t)r->max_tokens,
        .stop_ids = r->stop_ids,
        .n_stop = (int32_t)r->n_stop,
        .ignore_eos = (r->flags & PROTO_REQ_IGNORE_EOS) != 0,
        .return_routes = (r->flags & PROTO_REQ_RETURN_ROUTES) != 0,
        /* prompt scoring (version 5): scalars, which et_add's copy of the request carries */
        .score_prompt = (r->flags & PROTO_REQ_SCORE) != 0,
        .score_from = (r->flags & PROTO_REQ_SCORE) ? r->score_from : 0,
        /* the adapter (version 6): a NUL-terminated name in r (decoded strings are), which et_add copies */
        .lora = (r->flags & PROTO_REQ_LORA) && r->lora.len ? r->lora.ptr : NULL,
    };
    er->sp = samp_default();
    er->sp.temperature = r->temperature;
    er->sp.top_p = r->top_p;
    er->sp.top_k = r->top_k;
    er->sp.min_p = r->min_p;
    er->sp.seed = seed;
    er->sp.logprobs_topk = (int32_t)r->logprobs_topk;
    er->sp.processed_logprobs = (r->flags & PROTO_REQ_PROCESSED_LOGPROBS) != 0;
    /* The sampling tail (version 4). The bias arrays point into r, as the
     * prompt and stop ids do: et_add copies them before the door frees r. */
    const proto_sampling *s = (r->flags & PROTO_REQ_SAMPLING) ? r->sampling : NULL;
    if (s) {
        er->sp.repetition_penalty = s->repetition_penalty;
        er->sp.frequency_penalty = s->frequency_penalty;
        er->sp.presence_penalty = s->presence_penalty;
        er->min_tokens = (int32_t)s->min_tokens;
        er->n_bias = (int32_t)s->n_bias;
        er->bias_ids = s->bias_ids;
        er->bias_vals = s->bias_vals;
    }
}
