/* api_vllm.c - vLLM's RL routes, as SkyRL, prime-rl and TRL's async GRPO call
 * them, on the call machinery of api.c, so the engine path, the seeds, the
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
 * requests get 501 naming the ways rolloutd takes weights. Runs on the loop
 * thread. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "daemon/api_int.h"
#include "daemon/log.h"
#include "base/err.h"
#include "base/utf8.h"
#include "engine/text/tokenizer.h"

struct api_vllm {
    http_res *pause_wait;       /* a /pause?mode=wait, answered once nothing submitted runs */
    int wait_clear;             /* ... after flushing the prefix cache */
};

/* What rolloutd offers instead of NCCL or CUDA IPC (the 501 answers). */
#define NO_COLLECTIVES                                                                                          \
    "rolloutd has no NCCL or CUDA IPC weight transfer; send the weights over its learner socket (the NNG push: " \
    "rolloutctl push-weights, or the Python Client.push_weights), or write them to a directory and POST "      \
    "/update_weights {\"update_info\": {\"path\": DIR}}"

static cJSON *field(cJSON *o, const char *name)
{
    cJSON *v = cJSON_GetObjectItemCaseSensitive(o, name);
    return v && !cJSON_IsNull(v) ? v : NULL;
}

/* ---- query strings (FastAPI Query parameters) ---- */

static int hexval(int c)
{
    return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
}

/* The value of name in q ("a=b&c=d"), percent-decoded into out: 1 found, 0
 * absent, -1 longer than cap - 1 bytes. */
static int query_get(const char *q, const char *name, char *out, size_t cap)
{
    size_t nl = strlen(name);
    for (const char *p = q; p && *p; p = strchr(p, '&') ? strchr(p, '&') + 1 : NULL) {
        if (strncmp(p, name, nl) || (p[nl] != '=' && p[nl] != '&' && p[nl]))
            continue;
        const char *v = p[nl] == '=' ? p + nl + 1 : p + nl;
        size_t n = 0;
        for (; *v && *v != '&'; v++) {
            int c = *v;
            if (c == '+')
                c = ' ';
            else if (c == '%' && hexval(v[1]) >= 0 && hexval(v[2]) >= 0) {
                c = hexval(v[1]) * 16 + hexval(v[2]);
                v += 2;
            }
            if (n + 1 >= cap)
                return -1;
            out[n++] = (char)c;
        }
        out[n] = 0;
        return 1;
    }
    return 0;
}

/* A boolean query parameter as pydantic reads one; keeps *out when absent. */
static void query_bool(const char *q, const char *name, int *out, api_err *e)
{
    char v[16];
    int rc = query_get(q, name, v, sizeof v);
    if (rc == 0)
        return;
    static const char *yes[] = {"true", "1", "yes", "on", "t", "y"}, *no[] = {"false", "0", "no", "off", "f", "n"};
    for (size_t i = 0; rc > 0 && i < sizeof yes / sizeof yes[0]; i++) {
        if (!strcasecmp(v, yes[i])) {
            *out = 1;
            return;
        }
        if (!strcasecmp(v, no[i])) {
            *out = 0;
            return;
        }
    }
    api_bad(e, 400, "query parameter \"%s\": expected true or false", name);
}

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

void api_vllm_check_wait(api *a)
{
    struct api_vllm *v = a->vllm;
    if (!v || !v->pause_wait)
        return;
    for (api_call *c = a->head; c; c = c->next)
        if (c->submitted && c->kind != API_HEALTH)
            return;
    http_res *h = v->pause_wait;
    v->pause_wait = NULL;
    pause_done(a, h, v->wait_clear);
}

static void on_wait_close(http_res *h, void *ud)
{
    api *a = ud;
    if (a->vllm && a->vllm->pause_wait == h) {
        a->vllm->pause_wait = NULL;
        http_release(h);
    }
}

static void route_pause(http_res *h, const http_req *req, void *ud)
{
    api *a = ud;
    api_err e = {0};
    char mode[16] = "abort";
    int rc = query_get(req->query, "mode", mode, sizeof mode);
    int wait_old = 0, clear = 1; /* wait_for_inflight_requests: vLLM's older name for mode=wait */
    query_bool(req->query, "wait_for_inflight_requests", &wait_old, &e);
    query_bool(req->query, "clear_cache", &clear, &e);
    if (rc == 0 && wait_old)
        strcpy(mode, "wait");
    if (rc < 0 || (strcmp(mode, "abort") && strcmp(mode, "wait") && strcmp(mode, "keep")))
        api_bad(&e, 400, "query parameter \"mode\": expected \"abort\", \"wait\" or \"keep\"");
    if (!e.status && (a->vllm->pause_wait || a->pause_wait))
        api_bad(&e, 400, "a pause in \"wait\" mode is already waiting");
    if (e.status) {
        api_answer_error(h, &e);
        return;
    }
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
    a->vllm->pause_wait = h;
    a->vllm->wait_clear = clear;
    http_on_close(h, on_wait_close, a);
    api_vllm_check_wait(a);
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

/* reset_running_requests and reset_external are accepted: the flush always
 * covers running requests (their blocks are never served from the cache
 * again), and there is no external cache. */
static void route_reset_prefix_cache(http_res *h, const http_req *req, void *ud)
{
    api_err e = {0};
    int x = 0;
    query_bool(req->query, "reset_running_requests", &x, &e);
    query_bool(req->query, "reset_external", &x, &e);
    if (e.status) {
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
    cJSON *ids = field(root, "request_ids");
    int n = 0;
    if (ids && !cJSON_IsArray(ids))
        api_bad(&e, 400, "field \"request_ids\": expected a list of strings");
    for (cJSON *x = ids ? ids->child : NULL; !e.status && x; x = x->next)
        if (!cJSON_IsString(x))
            api_bad(&e, 400, "field \"request_ids\": expected a list of strings");
    if (!e.status && (!ids || !ids->child)) {
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
    int32_t *ids = NULL;
    size_t n = 0;
    int strs = 0;
    api_bool(root, "return_token_strs", &strs, &e);
    cJSON *prompt = field(root, "prompt"), *msgs = field(root, "messages");
    if (!tok)
        api_bad(&e, 400, "this model has no tokenizer");
    else if (prompt && msgs)
        api_bad(&e, 400, "fields \"prompt\" and \"messages\": give one, not both");
    if (!e.status && msgs) {
        /* vLLM's defaults for a chat: the assistant's turn opened, the
         * template's own special tokens only. */
        int gen = 1, cont = 0;
        api_bool(root, "add_generation_prompt", &gen, &e);
        api_bool(root, "continue_final_message", &cont, &e);
        if (!gen || cont)
            api_bad(&e, 400, "fields \"add_generation_prompt\" / \"continue_final_message\": only the default "
                    "(the assistant's turn opened after the last message) is rendered");
        if (field(root, "tools") || field(root, "chat_template"))
            api_bad(&e, 400, "fields \"tools\" / \"chat_template\": not supported (the model family's chat format "
                    "is rendered)");
        api_call *c = e.status ? NULL : api_call_new(a, NULL, API_CHAT);
        if (!e.status && !c)
            api_bad(&e, 500, "out of memory");
        if (c) {
            api_read_messages(c, root, &e);
            if (!e.status && c->n_subs == 1) {
                ids = c->subs[0].prompt;
                n = (size_t)c->subs[0].n_prompt;
                c->subs[0].prompt = NULL;
            }
            api_call_free(c);
        }
    } else if (!e.status && prompt) {
        int special = 1;
        api_bool(root, "add_special_tokens", &special, &e);
        if (!cJSON_IsString(prompt))
            api_bad(&e, 400, "field \"prompt\": expected a string");
        else if (!e.status && (special ? tok_encode_prompt(tok, prompt->valuestring, strlen(prompt->valuestring),
                                                           &ids, &n)
                                       : tok_encode(tok, prompt->valuestring, strlen(prompt->valuestring), 1, &ids,
                                                    &n)))
            api_bad(&e, 400, "field \"prompt\": cannot tokenize: %s", rd_errmsg());
    } else if (!e.status) {
        api_bad(&e, 400, "fields \"prompt\" / \"messages\": one is required");
    }
    cJSON_Delete(root);
    if (e.status) {
        free(ids);
        api_answer_error_v1(h, &e);
        return;
    }
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
    cJSON *toks = field(root, "tokens");
    int k = cJSON_IsArray(toks) ? cJSON_GetArraySize(toks) : 0;
    int32_t *ids = malloc(sizeof *ids * (size_t)(k > 0 ? k : 1));
    if (!a->d->L.tok)
        api_bad(&e, 400, "this model has no tokenizer");
    else if (!cJSON_IsArray(toks))
        api_bad(&e, 400, "field \"tokens\": expected a list of token ids");
    else if (!ids)
        api_bad(&e, 500, "out of memory");
    int i = 0;
    for (cJSON *x = toks ? toks->child : NULL; !e.status && x; x = x->next, i++) {
        if (!cJSON_IsNumber(x) || x->valuedouble < 0 || x->valuedouble >= a->d->lim.vocab_size ||
            x->valuedouble != (double)(int32_t)x->valuedouble)
            api_bad(&e, 400, "field \"tokens\"[%d]: expected a token id in 0..%u", i, a->d->lim.vocab_size - 1);
        else
            ids[i] = (int32_t)x->valuedouble;
    }
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
    cJSON_AddNullToObject(o, "prompt_logprobs");
    cJSON_AddNullToObject(o, "kv_transfer_params");
    api_answer_json(c->h, 200, o);
}

/* A vLLM sampling field this engine does not implement: refused unless it
 * holds vLLM's default (def, or null / an empty list when def is NAN). */
static void refuse_unless_default(cJSON *sp, const char *name, double def, api_err *e)
{
    cJSON *v = field(sp, name);
    if (!v || (cJSON_IsNumber(v) && v->valuedouble == def) || (cJSON_IsArray(v) && !v->child) ||
        (cJSON_IsObject(v) && !v->child) || (cJSON_IsBool(v) && !cJSON_IsTrue(v)))
        return;
    api_bad(e, 400, "field \"sampling_params.%s\": not supported by this engine (only its default)", name);
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
    api_call *c = api_call_new(a, h, API_COMPLETIONS);
    if (!c) {
        cJSON_Delete(root);
        http_respond_error(h, 500, "internal error", "out of memory");
        return;
    }
    c->fmt_begin = tokens_begin;
    c->fmt_sample = tokens_sample;
    c->fmt_progress = tokens_progress;
    c->fmt_done = tokens_done;
    c->top_field = "sampling_params.logprobs";
    cJSON *ids = field(root, "token_ids");
    if (!cJSON_IsArray(ids) || (ids->child && !cJSON_IsNumber(ids->child)))
        api_bad(&e, 400, "field \"token_ids\": expected a list of token ids");
    else
        api_read_prompts(c, ids, "token_ids", &e);
    cJSON *sp = field(root, "sampling_params");
    if (!cJSON_IsObject(sp))
        api_bad(&e, 400, "field \"sampling_params\": required (an object)");
    if (!e.status) {
        /* max_tokens unset: what the context leaves (vLLM's server-side default) */
        api_read_sampling(sp, "max_tokens", &c->p, &e);
        int64_t k;
        if (api_int(sp, "logprobs", 0, 1 << 20, &k, &e) > 0) {
            c->return_logprob = 1;
            c->p.top_n = (int32_t)k;
        }
        static const struct { const char *name; double def; } unsupported[] = {
            {"presence_penalty", 0}, {"frequency_penalty", 0}, {"repetition_penalty", 1}, {"min_tokens", 0},
            {"prompt_logprobs", NAN}, {"logit_bias", NAN}, {"bad_words", NAN}, {"allowed_token_ids", NAN},
            {"structured_outputs", NAN}, {"guided_decoding", NAN}, {"logits_processors", NAN},
            {"truncate_prompt_tokens", NAN}, {"include_stop_str_in_output", NAN},
        };
        for (size_t i = 0; i < sizeof unsupported / sizeof unsupported[0]; i++)
            refuse_unless_default(sp, unsupported[i].name, unsupported[i].def, &e);
    }
    api_bool(root, "stream", &c->stream, &e);
    cJSON *so = field(root, "stream_options");
    if (so && cJSON_IsObject(so))
        api_bool(so, "include_usage", &c->include_usage, &e);
    else if (so)
        api_bad(&e, 400, "field \"stream_options\": expected an object");
    cJSON *rid = field(root, "request_id");
    if (rid && !cJSON_IsString(rid))
        api_bad(&e, 400, "field \"request_id\": expected a string");
    else if (rid && !(c->rid = strdup(rid->valuestring)))
        api_bad(&e, 500, "out of memory");
    int64_t prio = 0;
    if (api_int(root, "priority", INT32_MIN, INT32_MAX, &prio, &e) > 0 && prio != 0)
        api_bad(&e, 400, "field \"priority\": only 0 (this engine has no priority scheduling)");
    if (field(root, "features"))
        api_bad(&e, 400, "field \"features\": multimodal inputs are not supported");
    if (field(root, "kv_transfer_params"))
        api_bad(&e, 400, "field \"kv_transfer_params\": disaggregated serving is not supported");
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

/* A weight_version (a positive integer or its decimal string) in o, if any. */
static void read_version(cJSON *o, int64_t *version, api_err *e)
{
    cJSON *v = field(o, "weight_version");
    if (v && cJSON_IsString(v)) {
        char *end;
        long long x = strtoll(v->valuestring, &end, 10);
        if (*end || x < 1 || end == v->valuestring)
            api_bad(e, 400, "field \"weight_version\" = \"%.60s\": expected a positive integer (the daemon's "
                    "versions are numbers)", v->valuestring);
        *version = x;
    } else if (v) {
        api_int(o, "weight_version", 1, INT64_MAX / 2, version, e);
    }
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
    cJSON *info = field(root, "update_info"), *dir = field(root, "weight_dir"), *path = NULL;
    int prime = 0;
    if (info && !cJSON_IsObject(info))
        api_bad(&e, 400, "field \"update_info\": expected an object");
    else if (info && (path = field(info, "path")))
        ;
    else if (info && (field(info, "names") || field(info, "ipc_handles") || field(info, "shapes")))
        api_bad(&e, 501, "field \"update_info\": tensors sent by NCCL or CUDA IPC: " NO_COLLECTIVES);
    else if (dir)
        path = dir, prime = 1;
    if (!e.status && (!path || !cJSON_IsString(path) || !path->valuestring[0]))
        api_bad(&e, 400, "expected {\"update_info\": {\"path\": DIR}} (vLLM's disk backend) or {\"weight_dir\": DIR} "
                "(prime-rl): DIR an HF folder of safetensors (a .gguf or .safetensors file also works)");
    int64_t version = (int64_t)a->d->weight_version + 1;
    read_version(root, &version, &e);
    if (info)
        read_version(info, &version, &e);
    if (e.status || api_update_from_path(a, h, path->valuestring, (uint64_t)version, PROTO_MODE_CONTINUE, 0,
                                         prime ? answer_prime_update : answer_vllm_update, &e))
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
    cJSON *info = root ? cJSON_GetObjectItemCaseSensitive(root, "init_info") : NULL;
    if (root && !info)
        api_bad(&e, 400, "Missing 'init_info' in request body");
    else if (root && !(cJSON_IsObject(info) && !info->child))
        api_bad(&e, 501, "init_info: %s", NO_COLLECTIVES);
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
    if (!a->vllm && !(a->vllm = calloc(1, sizeof *a->vllm))) {
        log_line("HTTP API: out of memory: vLLM's RL routes are not served");
        return 0;
    }
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

void api_vllm_destroy(api *a)
{
    if (!a->vllm)
        return;
    if (a->vllm->pause_wait)
        http_release(a->vllm->pause_wait);
    free(a->vllm);
    a->vllm = NULL;
}
