/* api_vllm.c - vLLM's RL routes, as SkyRL, prime-rl and TRL's async GRPO call
 * them, on the call machinery of api_call.c, so the engine path, the seeds, the
 * version spans, the Bearer key and SIGTERM draining are those of every
 * other route:
 *
 *   POST /pause?mode=abort|wait|keep&clear_cache=   {"status": "paused"}
 *   POST /resume                                    {"status": "resumed"}
 *   GET  /is_paused                                 {"is_paused": bool}
 *   POST /abort_requests {request_ids}              {"status": "aborted", "aborted": n}
 *   POST /reset_prefix_cache                        200 with an empty body, as vLLM
 *   POST /tokenize   {prompt | messages, ...}       {count, max_model_len, tokens, token_strs}
 *   POST /detokenize {tokens}                       {prompt}
 *   POST /inference/v1/generate {token_ids, sampling_params, stream, request_id}
 *        {request_id, choices: [{index, logprobs: {content}, finish_reason, token_ids}], usage}
 *        (choices[].routed_experts too when asked: prime-rl's router replay)
 *   POST /update_weights {"update_info": {"path": DIR}} (vLLM's disk backend)
 *                        or {"weight_dir": DIR} (prime-rl)
 *   POST /init_weight_transfer_engine, /start_weight_update, /finish_weight_update
 *   GET  /get_world_size                            {"world_size": 1}
 *
 * The pause state is the one /pause_generation sets: a pause in any mode
 * holds new calls until /resume (or /continue_generation). The modes are
 * vLLM's: abort ends the running HTTP calls with what they have
 * (finish_reason "abort"); wait answers once they have finished; keep freezes
 * every sequence where it is, its KV kept, until /resume, and a weight update
 * in between swaps under them (they go on under the new version, their
 * version spans say where). clear_cache (default true, ignored by keep) drops
 * the prefix cache before the answer. The prefix cache is salted with the
 * weight version, so /update_weights needs no reset after it.
 *
 * Log-probs are the raw ones (temperature 1), as on every route. vLLM's
 * /inference/v1/generate lists, per token, "token_id:N" entries, the sampled
 * token first and then the asked alternatives (max(logprobs, 1) of them), as
 * vLLM's dictionary order gives them. Sampling fields this engine does not
 * implement (penalties, min_tokens, prompt_logprobs, ...) are refused by name
 * rather than ignored. NCCL and CUDA IPC weight transfer are not here: those
 * requests get 501 naming the ways rolloutd takes weights.
 *
 * The model field of /inference/v1/generate, /tokenize and /detokenize is
 * checked as on /v1 (api_check_model: vLLM's 404 for a name nothing serves).
 *
 * Routed experts (router replay, a mixture-of-experts model): with
 * enable_return_routed_experts (vLLM's server flag, the way prime-rl asks) or
 * a request's return_routed_experts: true, each finished choice carries
 * routed_experts as prime-rl's vLLM server writes it
 * (prime_rl/inference/vllm/routed_experts.py serialize_routed_experts):
 * {"data": base64 of the ids [positions][layers][top_k], C order, "shape",
 * "start", "dtype"}, uint8 up to 256 experts (uint16 up to 65536, else int32,
 * as the NNG wire narrows them). The positions are the prompt's then the
 * completion's but the last token (it was never run), from vLLM's
 * sampling_params.routed_experts_prompt_start on ("start" says which). Runs
 * on the loop thread. */
#include <cjson/cJSON.h>
#include <mbedtls/base64.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/api_int.h"
#include "base/err.h"
#include "base/utf8.h"
#include "engine/text/tokenizer.h"

/* ---- pause, resume ---- */

static void answer_paused(http_res *h, int32_t n_flushed)
{
    static const char ok[] = "{\"status\":\"paused\"}";
    http_respond(h, 200, "application/json", ok, sizeof ok - 1);
}

static void pause_done(api *a, http_res *h, int clear)
{
    if (clear)
        api_flush_begin(a, h, answer_paused);
    else
        answer_paused(h, 0);
}

static void route_pause(http_res *h, const http_req *req, void *ud)
{
    api *a = ud;
    api_err e = {0};
    api_vllm_pause p;
    if (!api_read_vllm_pause(req->query, &p, &e) && (a->waits[API_WAIT_VLLM].h || a->waits[API_WAIT_SGLANG].h))
        api_bad(&e, 400, "a pause in \"wait\" mode is already waiting");
    if (e.status) {
        api_answer_error(h, &e);
        return;
    }
    const char *mode = p.mode;
    int clear = p.clear;
    a->paused = 1; /* new calls are held until /resume */
    if (!strcmp(mode, "keep")) {
        api_set_frozen(a, 1); /* clear_cache is ignored: the frozen sequences keep their KV */
        answer_paused(h, 0);
        return;
    }
    api_set_frozen(a, 0); /* abort ends what a keep froze; wait lets it finish */
    if (!strcmp(mode, "abort")) {
        api_abort_all(a); /* the calls answer with their partial outputs */
        pause_done(a, h, clear);
        return;
    }
    api_wait_begin(a, API_WAIT_VLLM, h, pause_done, clear); /* answered once nothing submitted runs */
}

static void route_resume(http_res *h, const http_req *req, void *ud)
{
    api_resume_held(ud);
    static const char ok[] = "{\"status\":\"resumed\"}";
    http_respond(h, 200, "application/json", ok, sizeof ok - 1);
}

static void route_is_paused(http_res *h, const http_req *req, void *ud)
{
    api *a = ud;
    const char *s = a->paused ? "{\"is_paused\":true}" : "{\"is_paused\":false}";
    http_respond(h, 200, "application/json", s, strlen(s));
}

static void answer_empty(http_res *h, int32_t n_flushed)
{
    http_respond(h, 200, NULL, "", 0);
}

static void route_reset_prefix_cache(http_res *h, const http_req *req, void *ud)
{
    api_err e = {0};
    if (api_read_reset_prefix(req->query, &e)) {
        api_answer_error(h, &e);
        return;
    }
    api_flush_begin(ud, h, answer_empty);
}

/* Aborts calls by their request_id (/inference/v1/generate's field, SGLang's
 * rid), or every HTTP call when request_ids is empty or absent, without
 * pausing; they answer with what they have. "aborted" counts the calls
 * aborted (vLLM counts the ids it was given). */
static void route_abort_requests(http_res *h, const http_req *req, void *ud)
{
    api *a = ud;
    api_err e = {0};
    cJSON *root = api_parse_body(req, &e);
    if (!root) {
        api_answer_error(h, &e);
        return;
    }
    cJSON *ids;
    int n = 0;
    if (!api_read_abort_ids(root, &ids, &e) && !ids) {
        for (api_call *c = a->head; c; c = c->next)
            n += c->kind != API_HEALTH;
        api_abort_all(a);
    }
    for (cJSON *x = ids ? ids->child : NULL; !e.status && x; x = x->next)
        n += api_abort_rid(a, x->valuestring);
    cJSON_Delete(root);
    if (e.status) {
        api_answer_error(h, &e);
        return;
    }
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "status", "aborted");
    cJSON_AddNumberToObject(o, "aborted", n);
    api_answer_json(h, 200, o);
}

/* ---- tokenize, detokenize ---- */

static cJSON *ids_json(const int32_t *ids, int32_t n)
{
    cJSON *a = cJSON_CreateArray();
    for (int32_t k = 0; a && k < n; k++)
        cJSON_AddItemToArray(a, cJSON_CreateNumber(ids[k]));
    return a;
}

static void route_tokenize(http_res *h, const http_req *req, void *ud)
{
    api *a = ud;
    tok_tokenizer *tok = a->d->L.tok;
    api_err e = {0};
    cJSON *root = api_parse_body(req, &e);
    if (!root) {
        api_answer_error_v1(h, &e);
        return;
    }
    if (api_check_model(a, root, h, NULL)) {
        cJSON_Delete(root);
        return;
    }
    api_tokenize_req t;
    api_read_tokenize(root, tok, &t, &e);
    cJSON_Delete(root);
    if (e.status) {
        api_answer_error_v1(h, &e);
        return;
    }
    int32_t *ids = t.ids;
    size_t n = t.n;
    int strs = t.strs;
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "count", (double)n);
    cJSON_AddNumberToObject(o, "max_model_len", a->d->lim.max_context);
    cJSON_AddItemToObject(o, "tokens", ids_json(ids, (int32_t)n));
    if (!strs) {
        cJSON_AddNullToObject(o, "token_strs");
    } else {
        /* the vocabulary's own pieces, as Hugging Face's convert_ids_to_tokens */
        cJSON *ts = cJSON_AddArrayToObject(o, "token_strs");
        for (size_t i = 0; i < n; i++) {
            const char *p = tok_piece(tok, ids[i]);
            size_t len;
            char *clean = utf8_clean(p ? p : "", p ? strlen(p) : 0, &len);
            cJSON_AddItemToArray(ts, cJSON_CreateString(clean ? clean : ""));
            free(clean);
        }
    }
    free(ids);
    api_answer_json(h, 200, o);
}

static void route_detokenize(http_res *h, const http_req *req, void *ud)
{
    api *a = ud;
    api_err e = {0};
    cJSON *root = api_parse_body(req, &e);
    if (!root) {
        api_answer_error_v1(h, &e);
        return;
    }
    if (api_check_model(a, root, h, NULL)) {
        cJSON_Delete(root);
        return;
    }
    int32_t *ids, k;
    api_read_detokenize(root, a->d->L.tok != NULL, a->d->lim.vocab_size, &ids, &k, &e);
    cJSON_Delete(root);
    char *raw = NULL, *text = NULL;
    size_t len = 0;
    if (!e.status && tok_decode(a->d->L.tok, ids, (size_t)k, &raw, &len))
        api_bad(&e, 400, "field \"tokens\": %s", rd_errmsg());
    if (!e.status && !(text = utf8_clean(raw, len, &len)))
        api_bad(&e, 500, "out of memory");
    free(ids);
    free(raw);
    if (e.status) {
        api_answer_error_v1(h, &e);
        return;
    }
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "prompt", text);
    free(text);
    api_answer_json(h, 200, o);
}

/* ---- /inference/v1/generate: token ids in, token ids and log-probs out ---- */

static const char *finish_name(const eng_result *r)
{
    return r->finish == FINISH_STOP ? "stop" : r->finish == FINISH_LENGTH ? "length" : "abort";
}

static cJSON *lp_entry(int32_t id, float lp)
{
    cJSON *o = cJSON_CreateObject();
    char tok[32];
    snprintf(tok, sizeof tok, "token_id:%d", id);
    cJSON_AddStringToObject(o, "token", tok);
    cJSON_AddNumberToObject(o, "logprob", lp > -9999.0f ? lp : -9999.0); /* vLLM's clamp */
    cJSON_AddNullToObject(o, "bytes");
    return o;
}

/* Tokens [from, to) of r in vLLM's ChatCompletionLogProbs form. */
static cJSON *tokens_logprobs(const api_call *c, const eng_result *r, int32_t from, int32_t to)
{
    cJSON *o = cJSON_CreateObject();
    cJSON *content = cJSON_AddArrayToObject(o, "content");
    int32_t want = c->p.top_n > 1 ? c->p.top_n : 1;
    for (int32_t k = from; k < to; k++) {
        cJSON *e = lp_entry(r->token_ids[k], r->logprobs[k]);
        cJSON *tops = cJSON_AddArrayToObject(e, "top_logprobs");
        cJSON_AddItemToArray(tops, lp_entry(r->token_ids[k], r->logprobs[k]));
        int32_t have = 1;
        for (int32_t q = 0; have < want && r->top_ids && q < r->n_top; q++) {
            int32_t id = r->top_ids[(size_t)k * r->n_top + q];
            if (id == r->token_ids[k])
                continue; /* the sampled token is listed once, first */
            cJSON_AddItemToArray(tops, lp_entry(id, r->top_logprobs[(size_t)k * r->n_top + q]));
            have++;
        }
        cJSON_AddItemToArray(content, e);
    }
    return o;
}

/* A finished sample's routes in prime-rl's compact form, positions [start, n_routes): the ids narrowed to
 * the width the NNG wire gives them (little-endian), base64. NULL when out of memory. */
static cJSON *routes_compact_json(const api_call *c, const eng_result *r)
{
    const model_config *mc = &c->a->d->L.m->cfg;
    uint8_t width = proto_route_width((uint32_t)mc->n_experts);
    int32_t layers = r->routes ? r->route_layers : mc->n_layers, k = r->routes ? r->route_k : mc->n_experts_used;
    int32_t total = r->routes && r->n_routes > 0 ? r->n_routes : 0;
    int32_t from = c->routes_start < total ? c->routes_start : total;
    size_t n = (size_t)(total - from) * (size_t)layers * (size_t)k;
    uint8_t *raw = malloc(width * n + 1);
    size_t cap = 4 * ((width * n + 2) / 3) + 1, len = 0;
    char *b64 = malloc(cap);
    cJSON *o = NULL;
    if (raw && b64) {
        const int32_t *ids = total ? r->routes + (size_t)from * layers * k : NULL;
        for (size_t i = 0; i < n; i++) {
            uint32_t v = (uint32_t)ids[i];
            for (int b = 0; b < width; b++)
                raw[width * i + b] = (uint8_t)(v >> (8 * b));
        }
        b64[0] = 0;
        if (n == 0 || mbedtls_base64_encode((unsigned char *)b64, cap, &len, raw, width * n) == 0) {
            o = cJSON_CreateObject();
            cJSON_AddStringToObject(o, "data", b64);
            cJSON *shape = cJSON_AddArrayToObject(o, "shape");
            cJSON_AddItemToArray(shape, cJSON_CreateNumber(total - from));
            cJSON_AddItemToArray(shape, cJSON_CreateNumber(layers));
            cJSON_AddItemToArray(shape, cJSON_CreateNumber(k));
            cJSON_AddNumberToObject(o, "start", c->routes_start);
            cJSON_AddStringToObject(o, "dtype", width == 1 ? "uint8" : width == 2 ? "uint16" : "int32");
        }
    }
    free(raw);
    free(b64);
    return o;
}

static int choice_index(const api_call *c, int si, int j)
{
    for (int k = 0; k < si; k++)
        j += c->subs[k].n;
    return j;
}

/* One choice: tokens [from, to) of r; final: the finished sample (its finish
 * reason and, as rolloutd's extension, its version spans). */
static cJSON *tokens_choice(const api_call *c, int si, int j, const eng_result *r, int32_t from, int32_t to,
                            int final)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "index", choice_index(c, si, j));
    if (c->return_logprob)
        cJSON_AddItemToObject(o, "logprobs", tokens_logprobs(c, r, from, to));
    else
        cJSON_AddNullToObject(o, "logprobs");
    if (final)
        cJSON_AddStringToObject(o, "finish_reason", finish_name(r));
    else
        cJSON_AddNullToObject(o, "finish_reason");
    cJSON_AddItemToObject(o, "token_ids", ids_json(r->token_ids + from, to - from));
    if (final)
        cJSON_AddItemToObject(o, "version_spans", api_spans_json(r));
    if (final && c->routes_compact) /* prime-rl's vLLM server adds it to the finished choice */
        cJSON_AddItemToObject(o, "routed_experts", routes_compact_json(c, r));
    return o;
}

static cJSON *tokens_envelope(const api_call *c)
{
    cJSON *o = cJSON_CreateObject();
    char id[48];
    snprintf(id, sizeof id, "generate-tokens-%llu", (unsigned long long)c->serial);
    cJSON_AddStringToObject(o, "request_id", c->rid ? c->rid : id);
    return o;
}

static void tokens_usage(cJSON *o, const api_call *c)
{
    int64_t prompt = 0, gen = 0;
    for (int i = 0; i < c->n_subs; i++) {
        prompt += c->subs[i].n_prompt;
        for (int32_t j = 0; j < c->subs[i].n; j++)
            gen += c->subs[i].res[j].n_tokens;
    }
    cJSON *u = cJSON_AddObjectToObject(o, "usage");
    cJSON_AddNumberToObject(u, "prompt_tokens", (double)prompt);
    cJSON_AddNumberToObject(u, "completion_tokens", (double)gen);
    cJSON_AddNumberToObject(u, "total_tokens", (double)(prompt + gen));
}

static void tokens_begin(api_call *c)
{
    http_stream_begin(c->h, 200, NULL);
}

static void tokens_chunk(api_call *c, cJSON *choice)
{
    cJSON *o = tokens_envelope(c);
    cJSON *choices = cJSON_AddArrayToObject(o, "choices");
    cJSON_AddItemToArray(choices, choice);
    api_send_event(c, o);
}

/* A stream's new tokens of a running sample: one delta chunk (none when no
 * token is new, as vLLM skips empty deltas). */
static void tokens_progress(api_call *c, int si, int j)
{
    api_stream *st = &c->subs[si].st[j];
    if (st->n_tok <= st->tok_sent)
        return;
    eng_result like = {.sample_idx = j, .finish = FINISH_NONE, .stop_str = -1};
    eng_result all = api_stream_view(st, &like);
    tokens_chunk(c, tokens_choice(c, si, j, &all, st->tok_sent, st->n_tok, 0));
    st->tok_sent = st->n_tok;
}

/* The finished sample in a stream: the tokens not sent yet and the finish reason. */
static void tokens_sample(api_call *c, int si, int j)
{
    const eng_result *r = &c->subs[si].res[j];
    api_stream *st = &c->subs[si].st[j];
    int32_t from = st->tok_sent < r->n_tokens ? st->tok_sent : r->n_tokens;
    tokens_chunk(c, tokens_choice(c, si, j, r, from, r->n_tokens, 1));
}

static void tokens_done(api_call *c)
{
    if (c->stream) {
        if (c->include_usage) {
            cJSON *o = tokens_envelope(c);
            cJSON_AddArrayToObject(o, "choices");
            tokens_usage(o, c);
            api_send_event(c, o);
        }
        api_send_done(c);
        return;
    }
    cJSON *o = tokens_envelope(c);
    cJSON *choices = cJSON_AddArrayToObject(o, "choices");
    for (int i = 0; i < c->n_subs; i++)
        for (int32_t j = 0; j < c->subs[i].n; j++) {
            const eng_result *r = &c->subs[i].res[j];
            cJSON_AddItemToArray(choices, tokens_choice(c, i, j, r, 0, r->n_tokens, 1));
        }
    tokens_usage(o, c);
    if (c->prompt_lp >= 0 && c->n_subs > 0 && c->subs[0].n > 0) /* vLLM's layout: first null, then a dict each */
        cJSON_AddItemToObject(o, "prompt_logprobs", api_prompt_logprobs_json(c, &c->subs[0].res[0]));
    else
        cJSON_AddNullToObject(o, "prompt_logprobs");
    cJSON_AddNullToObject(o, "kv_transfer_params");
    api_answer_json(c->h, 200, o);
}

static void route_generate_tokens(http_res *h, const http_req *req, void *ud)
{
    api *a = ud;
    api_err e = {0};
    cJSON *root = api_parse_body(req, &e);
    if (!root) {
        api_answer_error_v1(h, &e);
        return;
    }
    const char *lora;
    if (api_check_model(a, root, h, &lora)) {
        cJSON_Delete(root);
        return;
    }
    api_call *c = api_call_new(a, h, API_COMPLETIONS);
    if (!c) {
        cJSON_Delete(root);
        http_respond_error(h, 500, "internal error", "out of memory");
        return;
    }
    if (lora && !(c->lora = strdup(lora)))
        api_bad(&e, 500, "out of memory");
    c->fmt_begin = tokens_begin;
    c->fmt_sample = tokens_sample;
    c->fmt_progress = tokens_progress;
    c->fmt_done = tokens_done;
    api_read_generate_tokens(root, c, &e);
    api_routes_ask ra;
    if (!e.status && !api_read_routes_ask(root, &ra, &e) && (ra.ask || a->d->cfg.enable_return_routed_experts)) {
        /* the engine records the routes (a dense model is refused at admission, naming the field) */
        c->return_routes = 1;
        c->routes_compact = 1;
        c->routes_start = ra.start;
        for (int i = 0; i < c->n_subs; i++)
            if (ra.start > 0 && ra.start >= c->subs[i].n_prompt) /* vLLM asserts it too */
                api_bad(&e, 400, "field \"sampling_params.routed_experts_prompt_start\" = %d: expected below the "
                        "prompt's %d tokens", ra.start, c->subs[i].n_prompt);
    }
    cJSON_Delete(root);
    if (e.status || api_admit(c, &e))
        api_refuse(c, &e);
}

/* ---- weights ---- */

static void answer_vllm_update(http_res *h, const api_update_result *r)
{
    cJSON *o = cJSON_CreateObject();
    if (r->rc) {
        cJSON_AddStringToObject(o, "error", r->error);
    } else {
        cJSON_AddStringToObject(o, "message", "Weights updated");
        cJSON_AddNumberToObject(o, "weight_version", (double)r->version);
    }
    api_answer_json(h, r->rc ? 400 : 200, o);
}

static void answer_prime_update(http_res *h, const api_update_result *r)
{
    cJSON *o = cJSON_CreateObject();
    if (r->rc) {
        cJSON_AddStringToObject(o, "error", r->error);
    } else {
        cJSON_AddStringToObject(o, "status", "ok");
        cJSON_AddNumberToObject(o, "weight_version", (double)r->version);
    }
    api_answer_json(h, r->rc ? 400 : 200, o);
}

/* The new weights from a directory (an HF folder of safetensors; a .gguf or
 * .safetensors file too), pushed to the daemon itself as the NNG push does
 * (api_update.c): in-flight and frozen sequences go on under the new version. */
static void route_update_weights(http_res *h, const http_req *req, void *ud)
{
    api *a = ud;
    api_err e = {0};
    cJSON *root = api_parse_body(req, &e);
    if (!root) {
        api_answer_error(h, &e);
        return;
    }
    api_vllm_update u;
    if (api_read_vllm_update(root, a->d->weight_version, &u, &e) ||
        api_update_from_path(a, h, u.path, (uint64_t)u.version, PROTO_MODE_CONTINUE, 0,
                             u.prime ? answer_prime_update : answer_vllm_update, &e))
        api_answer_error(h, &e);
    cJSON_Delete(root);
}

/* vLLM's four-phase transfer. The disk flow (init with an empty init_info,
 * start, /update_weights with a path, finish) works; a rendezvous for NCCL
 * (master_address, master_port, rank_offset, world_size) or any other
 * transport is 501. start and finish need no state here: the update itself
 * is one step. */
static void route_init_transfer(http_res *h, const http_req *req, void *ud)
{
    api_err e = {0};
    cJSON *root = api_parse_body(req, &e);
    if (root)
        api_read_init_transfer(root, &e);
    cJSON_Delete(root);
    if (e.status) {
        api_answer_error(h, &e);
        return;
    }
    static const char ok[] = "{\"message\":\"Weight transfer initialized\"}";
    http_respond(h, 200, "application/json", ok, sizeof ok - 1);
}

static void route_start_update(http_res *h, const http_req *req, void *ud)
{
    static const char ok[] = "{\"message\":\"Weight update started\"}";
    http_respond(h, 200, "application/json", ok, sizeof ok - 1);
}

static void route_finish_update(http_res *h, const http_req *req, void *ud)
{
    static const char ok[] = "{\"message\":\"Weight update finished\"}";
    http_respond(h, 200, "application/json", ok, sizeof ok - 1);
}

/* One engine, no tensor, pipeline or data parallelism. */
static void route_world_size(http_res *h, const http_req *req, void *ud)
{
    static const char ok[] = "{\"world_size\":1}";
    http_respond(h, 200, "application/json", ok, sizeof ok - 1);
}

/* ---- the table ---- */

int api_vllm_routes(api *a, http_route *t)
{
    const http_route r[] = {
        {"POST", "/pause", route_pause, a, 0},
        {"POST", "/resume", route_resume, a, 0},
        {"GET", "/is_paused", route_is_paused, a, 0},
        {"POST", "/abort_requests", route_abort_requests, a, 0},
        {"POST", "/reset_prefix_cache", route_reset_prefix_cache, a, 0},
        {"POST", "/tokenize", route_tokenize, a, 0},
        {"POST", "/detokenize", route_detokenize, a, 0},
        {"POST", "/inference/v1/generate", route_generate_tokens, a, 0},
        {"POST", "/update_weights", route_update_weights, a, 0},
        {"POST", "/init_weight_transfer_engine", route_init_transfer, a, 0},
        {"POST", "/start_weight_update", route_start_update, a, 0},
        {"POST", "/finish_weight_update", route_finish_update, a, 0},
        {"GET", "/get_world_size", route_world_size, a, 0},
    };
    int n = (int)(sizeof r / sizeof r[0]);
    for (int i = 0; i < n; i++)
        t[i] = r[i];
    return n;
}
