/* api.c - the generation routes (api.h): parse a call, queue its engine
 * requests, collect the finished samples, answer. The JSON shapes of the
 * answers: SGLang's /generate here, vLLM's /v1 schema in api_openai.c. */
#include "daemon/api.h"
#include "daemon/admit.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <mbedtls/base64.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#include "daemon/api_int.h"
#include "daemon/daemon.h"
#include "daemon/log.h"
#include "base/err.h"
#include "base/utf8.h"
#include "engine/text/stopstr.h"
#include "engine/text/tokenizer.h"

/* ---- errors: the JSON error shape naming the field ---- */

/* api_bad is in api_read.c, with the readers. */

static const char *status_what(int status)
{
    switch (status) {
    case 400: return "bad request";
    case 404: return "not found";
    case 501: return "not implemented";
    case 503: return "busy";
    default: return "internal error";
    }
}

void api_answer_error(http_res *h, const api_err *e)
{
    http_respond_error(h, e->status, status_what(e->status), e->detail);
}

/* The /v1 routes answer errors in OpenAI's shape, which the openai package
 * reads ({"error": {"message", "type", "param", "code"}}, as vLLM sends). */
void api_answer_error_v1(http_res *h, const api_err *e)
{
    cJSON *o = cJSON_CreateObject();
    cJSON *x = cJSON_AddObjectToObject(o, "error");
    cJSON_AddStringToObject(x, "message", e->detail);
    cJSON_AddStringToObject(x, "type", e->status == 400 ? "BadRequestError"
                                       : e->status == 503 ? "ServiceUnavailableError" : "InternalServerError");
    cJSON_AddNullToObject(x, "param");
    cJSON_AddNumberToObject(x, "code", e->status);
    api_answer_json(h, e->status, o);
}

void api_answer_json(http_res *h, int status, cJSON *doc)
{
    char *s = doc ? cJSON_PrintUnformatted(doc) : NULL;
    cJSON_Delete(doc);
    if (!s) {
        http_respond_error(h, 500, "internal error", "out of memory building the response");
        return;
    }
    http_respond(h, status, "application/json", s, strlen(s));
    free(s);
}

/* The field and prompt readers are in api_read.c. */

/* ---- calls ---- */

api_call *api_call_new(api *a, http_res *h, api_kind kind)
{
    api_call *c = calloc(1, sizeof *c);
    if (!c)
        return NULL;
    c->a = a;
    c->h = h;
    api_call_init(c, kind, a->d->L.tok);
    c->p.processed = !strcmp(a->d->cfg.logprobs_mode, "processed_logprobs");
    c->created = (int64_t)time(NULL);
    c->serial = ++a->n_calls;
    return c;
}

static void call_free(api_call *c)
{
    for (int i = 0; i < c->n_subs; i++) {
        api_sub *s = &c->subs[i];
        for (int32_t j = 0; s->res && j < s->n; j++)
            eng_result_free(&s->res[j]);
        for (int32_t j = 0; s->st && j < s->n; j++)
            api_stream_free(&s->st[j]);
        free(s->st);
        free(s->res);
        free(s->have);
    }
    api_call_clear(c);
    free(c);
}

void api_call_free(api_call *c) { call_free(c); }

static void link_call(api *a, api_call *c)
{
    c->prev = a->tail;
    c->next = NULL;
    if (a->tail)
        a->tail->next = c;
    else
        a->head = c;
    a->tail = c;
    c->linked = 1;
}

static void unlink_call(api *a, api_call *c)
{
    if (!c->linked)
        return;
    if (c->prev)
        c->prev->next = c->next;
    else
        a->head = c->next;
    if (c->next)
        c->next->prev = c->prev;
    else
        a->tail = c->prev;
    c->linked = 0;
}

static void check_pause_wait(api *a);

/* Every sample is in: answer (or end the stream) and free the call. */
static void call_finish(api *a, api_call *c)
{
    unlink_call(a, c);
    if (c->h) {
        if (c->gone)
            http_release(c->h);
        else if (c->fmt_done)
            c->fmt_done(c);
        else
            http_release(c->h);
        c->h = NULL;
    }
    call_free(c);
    check_pause_wait(a);
}

/* A sample is in (r moved into the call). */
static void take_sample(api *a, api_call *c, api_sub *s, eng_result *r)
{
    int32_t j = r->sample_idx;
    if (j < 0 || j >= s->n || s->have[j]) {
        eng_result_free(r);
        return;
    }
    s->res[j] = *r;
    memset(r, 0, sizeof *r);
    s->have[j] = 1;
    s->n_done++;
    c->n_done++;
    if (s->n_done == s->n) {
        umap_del(&a->keys, s->key);
        a->inflight--;
    }
    if (c->stream && !c->gone && c->fmt_sample)
        c->fmt_sample(c, (int)(s - c->subs), j);
    if (c->n_done == c->n_total)
        call_finish(a, c);
}

/* New tokens of a running sample of a streaming call (r freed here). */
static void take_progress(api_call *c, api_sub *s, eng_result *r)
{
    int32_t j = r->sample_idx;
    if (c->stream && !c->gone && s->st && j >= 0 && j < s->n && !s->have[j] &&
        r->token_offset == s->st[j].n_tok && c->fmt_progress) {
        if (api_stream_push(c->a, &s->st[j], r))
            log_line("HTTP stream %llu: out of memory; its tokens come at the end", (unsigned long long)s->key);
        else
            c->fmt_progress(c, (int)(s - c->subs), j);
    }
    eng_result_free(r);
}

/* Ends the samples of a call that never reached the engine (abort while
 * paused, a failed et_add) with no tokens. Returns 1 when that finished (and
 * freed) the call. */
static int fake_finish(api *a, api_call *c, api_sub *s, finish_reason why)
{
    for (int32_t j = 0; j < s->n; j++) {
        if (s->have[j])
            continue;
        eng_result r = {.tag = s->key, .sample_idx = j, .n_prompt = s->n_prompt, .finish = why, .stop_str = -1};
        r.version_finish = a->d->weight_version;
        int last = c->n_done + 1 == c->n_total;
        take_sample(a, c, s, &r);
        if (last)
            return 1;
    }
    return 0;
}

static int submit_sub(api *a, api_call *c, api_sub *s)
{
    rd_daemon *d = a->d;
    proto_request pr = api_sub_request(c, s);
    eng_request er;
    adm_engine_request(&pr, s->prompt, (uint32_t)s->n_prompt, c->p.seed, &er);
    er.stop_strs = (const char *const *)c->p.stop_strs;
    er.n_stop_strs = c->p.n_stop_strs;
    /* The call's sampling fields past the protocol's first ones: its
     * proto_request carries no sampling tail, so they come from the call
     * (read and checked by its route, daemon/sampling.def). */
    er.sp.repetition_penalty = c->p.repetition_penalty;
    er.sp.frequency_penalty = c->p.frequency_penalty;
    er.sp.presence_penalty = c->p.presence_penalty;
    er.min_tokens = c->p.min_tokens;
    er.sp.processed_logprobs = c->p.processed;
    er.n_bias = c->p.n_bias;
    er.bias_ids = c->p.bias_ids;
    er.bias_vals = c->p.bias_vals;
    er.stream = c->stream && c->fmt_progress;
    er.tag = s->key;
    s->submitted = 1;
    if (et_add(&d->et, s->key, &er)) {
        log_line("HTTP request %llu not queued: %s", (unsigned long long)s->key, rd_errmsg());
        return fake_finish(a, c, s, FINISH_ERROR);
    }
    return 0;
}

/* Sends a call's requests to the engine (at admission, or on continue).
 * Returns 1 when a refusal finished (and freed) the call. */
static int call_submit(api *a, api_call *c)
{
    c->submitted = 1;
    for (int i = 0; i < c->n_subs; i++)
        if (submit_sub(a, c, &c->subs[i]))
            return 1;
    return 0;
}

static void on_client_close(http_res *h, void *ud)
{
    api_call *c = ud;
    api *a = c->a;
    c->gone = 1;
    if (a->exiting || !c->submitted) {
        /* Nothing will come back from the engine for it. */
        http_release(c->h);
        c->h = NULL;
        for (int i = 0; i < c->n_subs; i++)
            if (c->subs[i].n_done < c->subs[i].n && umap_del(&a->keys, c->subs[i].key))
                a->inflight--;
        unlink_call(a, c);
        call_free(c);
        check_pause_wait(a);
        return;
    }
    /* Abort what runs so its KV blocks return; the partial samples still come
     * back and then the call is freed (the handle released). */
    for (int i = 0; i < c->n_subs; i++) {
        api_sub *s = &c->subs[i];
        if (s->n_done < s->n && !s->aborted) {
            s->aborted = 1;
            et_abort(&a->d->et, s->key);
        }
    }
}

/* Checks a call against the limits, then queues it (or holds it while
 * paused). On success the call belongs to the API; on failure e says why and
 * the caller answers and frees. */
int api_admit(api_call *c, api_err *e)
{
    api *a = c->a;
    rd_daemon *d = a->d;
    adm_limits lim = adm_limits_of(d);
    if (d->state != D_SERVING) {
        api_bad(e, 503, "the daemon is shutting down: no new requests");
        return -1;
    }
    if (a->mem_released) {
        api_bad(e, 503, "the engine's memory is released (%s%s%s): /resume_memory_occupation (or /wake_up) first",
                a->mem_released & ET_MEM_WEIGHTS ? "weights" : "", a->mem_released == 3 ? ", " : "",
                a->mem_released & ET_MEM_KV ? "kv_cache" : "");
        return -1;
    }
    if (c->p.n_stop_strs > 0 && !d->L.tok) {
        api_bad(e, 400, "field \"stop\": this model has no tokenizer, so stop strings cannot be matched");
        return -1;
    }
    if (c->return_routes && !(d->lim.features & PROTO_FEATURE_ROUTES)) {
        api_bad(e, 400, "field \"return_routed_experts\": the model (%s) is dense, not a mixture of experts: it has "
                "no routed experts to return", d->L.m->cfg.arch);
        return -1;
    }
    if (api_admit_check(c, &lim, e))
        return -1;
    /* The same bound, and the same words, as an NNG SUBMIT's BUSY. */
    char why[200];
    uint64_t unfinished = d->clients.unfinished + (uint64_t)a->inflight;
    if (adm_queue_room(&lim, unfinished, (uint64_t)c->n_subs, why, sizeof why)) {
        api_bad(e, 503, "%s", why);
        return -1;
    }
    if (!c->p.has_seed)
        c->p.seed = adm_random_seed(c->serial);
    c->p.seed &= ((uint64_t)1 << 53) - 1; /* reported back as a JSON number */
    for (int i = 0; i < c->n_subs; i++) {
        api_sub *s = &c->subs[i];
        s->res = calloc((size_t)s->n, sizeof *s->res);
        s->have = calloc((size_t)s->n, 1);
        if (c->stream)
            s->st = calloc((size_t)s->n, sizeof *s->st);
        s->key = API_KEY_BIT | ++a->next_key;
        if (!s->res || !s->have || (c->stream && !s->st) || umap_put(&a->keys, s->key, c)) {
            api_bad(e, 500, "out of memory");
            for (int k = 0; k <= i; k++)
                umap_del(&a->keys, c->subs[k].key);
            return -1;
        }
    }
    a->inflight += c->n_subs;
    link_call(a, c);
    http_on_close(c->h, on_client_close, c);
    if (c->stream && c->fmt_begin)
        c->fmt_begin(c);
    if (a->paused && c->kind != API_HEALTH)
        return 0; /* counted in inflight; queued until /continue_generation */
    call_submit(a, c);
    return 0;
}

/* Answers a route's refusal and frees the call. */
void api_refuse(api_call *c, const api_err *e)
{
    if (c->kind == API_COMPLETIONS || c->kind == API_CHAT)
        api_answer_error_v1(c->h, e);
    else
        api_answer_error(c->h, e);
    call_free(c);
}

void api_on_result(api *a, eng_result *r)
{
    api_call *c = umap_get(&a->keys, r->tag);
    if (!c) {
        eng_result_free(r);
        return;
    }
    if (r->logprobs_proc) {
        /* logprobs_mode processed_logprobs: the answers' log-probs are the processed ones */
        float *raw = r->logprobs;
        r->logprobs = r->logprobs_proc;
        r->logprobs_proc = raw;
    }
    for (int i = 0; i < c->n_subs; i++)
        if (c->subs[i].key == r->tag) {
            if (r->partial)
                take_progress(c, &c->subs[i], r);
            else
                take_sample(a, c, &c->subs[i], r);
            return;
        }
    eng_result_free(r);
}

/* ---- per-sample text: what the answer shows ---- */

/* JSON strings must be UTF-8, and sampled tokens need not add up to it (a
 * character cut at the end, byte tokens out of order): each invalid stretch
 * becomes U+FFFD (utf8_clean), as a Python detokenizer (vLLM's, SGLang's)
 * shows it. The token ids carry the exact bytes. */
char *api_clean_slice(const char *raw, size_t from, size_t to, size_t *len)
{
    size_t n = to > from ? to - from : 0;
    return utf8_clean(n ? raw + from : "", n, len);
}

int api_sample_view(api *a, const eng_result *r, sample_view *v)
{
    int rc = api_sample_raw(a, r, v);
    if (rc)
        return rc;
    char *clean = utf8_clean(v->text, v->len, &v->len);
    free(v->text);
    v->text = clean;
    return clean ? 0 : RD_ENOMEM;
}

int api_sample_raw(api *a, const eng_result *r, sample_view *v) { return api_sample_text(a, r, v, NULL); }

/* no_stop_trim (SGLang; vLLM's include_stop_str_in_output): the matched stop
 * string and the stop token's text stay in the text. skip_special: control tokens (EOS, <|im_end|>, ...) add
 * no text (the ids keep them). */
int api_sample_text(api *a, const eng_result *r, sample_view *v, const api_params *p)
{
    const int no_stop_trim = p && p->keep_stop, skip_special = p && p->skip_special;
    memset(v, 0, sizeof *v);
    v->matched_id = -1;
    v->finish = r->finish == FINISH_STOP ? "stop" : r->finish == FINISH_LENGTH ? "length" : "abort";
    int32_t n_text = r->n_tokens;
    if (r->finish == FINISH_STOP && r->stop_str < 0 && r->n_tokens > 0) {
        v->matched_id = r->token_ids[r->n_tokens - 1];
        if (!no_stop_trim)
            n_text--; /* EOS or a stop token: its text is not the completion's */
    }
    if (!a->d->L.tok) {
        v->text = strdup("");
        return v->text ? 0 : RD_ENOMEM;
    }
    int rc = tok_decode(a->d->L.tok, r->token_ids, (size_t)n_text, &v->text, &v->len);
    if (rc)
        return rc;
    if (r->finish == FINISH_STOP && r->stop_str >= 0) {
        v->matched_str = r->stop_str; /* index; the caller names the string */
        size_t cut = r->stop_text_offset >= 0 ? (size_t)r->stop_text_offset : v->len;
        if (no_stop_trim && p->keep_stop == API_KEEP_THROUGH && r->stop_str < p->n_stop_strs)
            cut += strlen(p->stop_strs[r->stop_str]); /* vLLM: the text ends with the stop string */
        else if (no_stop_trim)
            cut = v->len; /* SGLang: the whole of the token that completed it */
        if (cut < v->len) {
            v->len = cut;
            v->text[v->len] = 0;
        }
    } else {
        v->matched_str = -1;
    }
    if (skip_special) {
        /* The text is the tokens' bytes back to back: keep those of the
         * non-special tokens, up to where it was cut. */
        size_t at = 0, out = 0;
        for (int32_t k = 0; k < n_text && at < v->len; k++) {
            size_t nb = 0;
            const char *b = tok_token_bytes(a->d->L.tok, r->token_ids[k], &nb);
            if (!b)
                continue;
            size_t take = at + nb <= v->len ? nb : v->len - at;
            if (!tok_is_control(a->d->L.tok, r->token_ids[k])) {
                memmove(v->text + out, v->text + at, take);
                out += take;
            }
            at += take;
        }
        v->len = out;
        v->text[out] = 0;
    }
    return 0;
}

/* A token's text for log-prob listings: its bytes when they are valid UTF-8,
 * else "bytes:\xNN..." as vLLM writes a partial character. */
char *api_token_text(api *a, int32_t id)
{
    size_t n = 0;
    const char *b = a->d->L.tok ? tok_token_bytes(a->d->L.tok, id, &n) : NULL;
    if (!b) {
        char *s = malloc(32);
        if (s)
            snprintf(s, 32, "<%d>", id);
        return s;
    }
    if (utf8_invalid_at((const uint8_t *)b, n) == n)
        return strndup(b, n);
    char *s = malloc(6 + 4 * n + 1);
    if (!s)
        return NULL;
    strcpy(s, "bytes:");
    for (size_t i = 0; i < n; i++)
        sprintf(s + 6 + 4 * i, "\\x%02x", (unsigned char)b[i]);
    return s;
}

const char *api_token_bytes(api *a, int32_t id, size_t *n)
{
    *n = 0;
    return a->d->L.tok ? tok_token_bytes(a->d->L.tok, id, n) : NULL;
}

cJSON *api_spans_json(const eng_result *r)
{
    cJSON *spans = cJSON_CreateArray();
    for (int32_t k = 0; spans && k < r->n_spans; k++) {
        cJSON *t = cJSON_CreateArray();
        cJSON_AddItemToArray(t, cJSON_CreateNumber(r->spans[k].start));
        cJSON_AddItemToArray(t, cJSON_CreateNumber(r->spans[k].end));
        cJSON_AddItemToArray(t, cJSON_CreateNumber((double)r->spans[k].version));
        cJSON_AddItemToArray(spans, t);
    }
    return spans;
}

cJSON *api_routes_json(const eng_result *r)
{
    size_t n = r->routes && r->n_routes > 0 ? (size_t)r->n_routes * r->route_layers * r->route_k : 0;
    uint8_t *le = malloc(4 * n + 1);
    size_t cap = 4 * ((4 * n + 2) / 3) + 1, len = 0;
    char *b64 = malloc(cap);
    cJSON *s = NULL;
    if (le && b64) {
        for (size_t i = 0; i < n; i++) {
            uint32_t v = (uint32_t)r->routes[i];
            le[4 * i] = (uint8_t)v, le[4 * i + 1] = (uint8_t)(v >> 8);
            le[4 * i + 2] = (uint8_t)(v >> 16), le[4 * i + 3] = (uint8_t)(v >> 24);
        }
        b64[0] = 0;
        if (n == 0 || mbedtls_base64_encode((unsigned char *)b64, cap, &len, le, 4 * n) == 0)
            s = cJSON_CreateString(b64);
    }
    free(le);
    free(b64);
    return s;
}

/* ---- SGLang's /generate ---- */

static int sample_index(const api_call *c, int si, int j);

/* SGLang's [logprob, token_id, text]: the text only with return_text_in_logprobs. */
static cJSON *lp_triple(api_call *c, double lp, int32_t id)
{
    cJSON *t = cJSON_CreateArray();
    cJSON_AddItemToArray(t, cJSON_CreateNumber(lp));
    cJSON_AddItemToArray(t, cJSON_CreateNumber(id));
    char *text = c->text_in_logprobs ? api_token_text(c->a, id) : NULL;
    cJSON_AddItemToArray(t, text ? cJSON_CreateString(text) : cJSON_CreateNull());
    free(text);
    return t;
}

/* Sample j of prompt si: r its tokens, text its text; v the finished
 * sample's view, or NULL for a running one's progress (a stream's event: no
 * finish reason yet, and the spans come with the last event). */
static cJSON *gen_json(api_call *c, int si, int j, const eng_result *r, const sample_view *v, const char *text)
{
    api_sub *s = &c->subs[si];
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "text", text);
    cJSON *ids = cJSON_AddArrayToObject(o, "output_ids");
    for (int32_t k = 0; k < r->n_tokens; k++)
        cJSON_AddItemToArray(ids, cJSON_CreateNumber(r->token_ids[k]));
    cJSON *mi = cJSON_AddObjectToObject(o, "meta_info");
    /* SGLang's ids: one rid for a batch or n > 1 becomes rid_<k> per sample
     * (k counts the call's samples), a list gives each prompt's, with _<j>
     * per sample when n > 1. */
    char id[600];
    if (s->rid && s->n > 1)
        snprintf(id, sizeof id, "%s_%d", s->rid, j);
    else if (s->rid)
        snprintf(id, sizeof id, "%s", s->rid);
    else if (c->rid && (c->batch || c->p.n > 1))
        snprintf(id, sizeof id, "%s_%d", c->rid, sample_index(c, si, j));
    else if (c->rid)
        snprintf(id, sizeof id, "%s", c->rid);
    else
        snprintf(id, sizeof id, "gen-%llu-%d", (unsigned long long)(s->key & ~API_KEY_BIT), j);
    cJSON_AddStringToObject(mi, "id", id);
    if (!v) {
        cJSON_AddNullToObject(mi, "finish_reason");
    } else {
        cJSON *fr = cJSON_AddObjectToObject(mi, "finish_reason");
        cJSON_AddStringToObject(fr, "type", v->finish);
        if (v->matched_str >= 0)
            cJSON_AddStringToObject(fr, "matched", c->p.stop_strs[v->matched_str]);
        else if (v->matched_id >= 0)
            cJSON_AddNumberToObject(fr, "matched", v->matched_id);
        else
            cJSON_AddNullToObject(fr, "matched");
        if (r->finish == FINISH_ERROR)
            cJSON_AddStringToObject(fr, "message", "the engine refused or failed the request (see the daemon log)");
    }
    cJSON_AddNumberToObject(mi, "prompt_tokens", s->n_prompt);
    cJSON_AddNumberToObject(mi, "completion_tokens", r->n_tokens);
    char seed[32]; /* printed whole: cJSON would round a 16-digit number to 15 digits */
    snprintf(seed, sizeof seed, "%llu", (unsigned long long)c->p.seed);
    cJSON_AddRawToObject(mi, "seed", seed);
    if (c->return_logprob) {
        cJSON_AddStringToObject(mi, "logprob_kind", c->p.processed ? "processed" : "raw");
        cJSON_AddStringToObject(mi, "logprobs_mode", c->p.processed ? "processed_logprobs" : "raw_logprobs");
        cJSON *lps = cJSON_AddArrayToObject(mi, "output_token_logprobs");
        for (int32_t k = 0; k < r->n_tokens; k++)
            cJSON_AddItemToArray(lps, lp_triple(c, r->logprobs[k], r->token_ids[k]));
        if (c->p.top_n > 0) {
            cJSON *tops = cJSON_AddArrayToObject(mi, "output_top_logprobs");
            for (int32_t k = 0; k < r->n_tokens; k++) {
                cJSON *t = cJSON_CreateArray();
                for (int32_t q = 0; q < r->n_top; q++)
                    cJSON_AddItemToArray(t, lp_triple(c, r->top_logprobs[(size_t)k * r->n_top + q],
                                                      r->top_ids[(size_t)k * r->n_top + q]));
                cJSON_AddItemToArray(tops, t);
            }
        }
    }
    char ver[32];
    snprintf(ver, sizeof ver, "%llu", (unsigned long long)(v ? r->version_finish : c->a->d->weight_version));
    cJSON_AddStringToObject(mi, "weight_version", ver);
    /* which policy produced the tokens (issue 26): the serve_dtype of that version */
    cJSON_AddStringToObject(mi, "serve_dtype",
                            sh_name(sh_code(&c->a->d->serve, v ? r->version_finish : c->a->d->weight_version)));
    if (v)
        cJSON_AddItemToObject(mi, "version_spans", api_spans_json(r));
    if (v && c->a->d->stats.spec_decode != ENG_SPEC_OFF) {
        /* SGLang's names and meanings (its meta_info with speculative decoding on); the accept length is
         * its completion_tokens / spec_verify_ct */
        cJSON_AddNumberToObject(mi, "spec_verify_ct", r->spec_steps);
        cJSON_AddNumberToObject(mi, "spec_accept_token_num", r->spec_accepted);
        cJSON_AddNumberToObject(mi, "spec_draft_token_num", r->spec_drafted);
        cJSON_AddNumberToObject(mi, "spec_accept_rate",
                                r->spec_drafted > 0 ? (double)r->spec_accepted / r->spec_drafted : 0.0);
        cJSON_AddNumberToObject(mi, "spec_accept_length",
                                r->spec_steps > 0 ? (double)r->n_tokens / r->spec_steps : 0.0);
    }
    if (v && c->return_routes)
        cJSON_AddItemToObject(mi, "routed_experts", api_routes_json(r));
    return o;
}

static cJSON *gen_sample_json(api_call *c, int si, int j)
{
    const eng_result *r = &c->subs[si].res[j];
    sample_view v;
    if (api_sample_text(c->a, r, &v, &c->p))
        return NULL;
    size_t n;
    char *clean = utf8_clean(v.text, v.len, &n);
    free(v.text);
    if (!clean)
        return NULL;
    v.text = clean;
    v.len = n;
    cJSON *o = gen_json(c, si, j, r, &v, v.text);
    free(v.text);
    return o;
}

/* The index of sample j of prompt si among the call's samples. */
static int sample_index(const api_call *c, int si, int j)
{
    int index = j;
    for (int k = 0; k < si; k++)
        index += c->subs[k].n;
    return index;
}

static void gen_begin(api_call *c)
{
    http_stream_begin(c->h, 200, NULL);
}

static void send_event(api_call *c, cJSON *doc)
{
    char *s = doc ? cJSON_PrintUnformatted(doc) : NULL;
    cJSON_Delete(doc);
    if (!s)
        return;
    size_t n = strlen(s);
    char *ev = malloc(n + 9);
    if (ev) {
        memcpy(ev, "data: ", 6);
        memcpy(ev + 6, s, n);
        memcpy(ev + 6 + n, "\n\n", 2);
        http_stream_send(c->h, ev, n + 8);
        free(ev);
    }
    free(s);
}

void api_send_event(api_call *c, cJSON *doc) { send_event(c, doc); }

void api_send_done(api_call *c)
{
    static const char done[] = "data: [DONE]\n\n";
    http_stream_send(c->h, done, sizeof done - 1);
    http_stream_end(c->h);
}

static void gen_sample(api_call *c, int si, int j)
{
    cJSON *o = gen_sample_json(c, si, j);
    if (o)
        cJSON_AddNumberToObject(o, "index", sample_index(c, si, j));
    send_event(c, o);
}

/* A running sample's progress, in SGLang's cumulative form: the text, ids and
 * log-probs so far (the text without a tail a stop string could still claim,
 * and without control tokens' text under skip_special_tokens, so that each
 * event's text is a prefix of the final one's; no_stop_trim changes only the
 * end, which the final event carries). */
static void gen_progress(api_call *c, int si, int j)
{
    api_stream *st = &c->subs[si].st[j];
    size_t safe = api_stream_safe(st, &c->p), n;
    char *text;
    if (c->p.skip_special) {
        size_t flen = 0;
        char *f = api_stream_shown(c->a, st, safe, &flen);
        text = f ? api_clean_slice(f, 0, flen, &n) : NULL;
        free(f);
    } else {
        text = api_clean_slice(st->raw, 0, safe, &n);
    }
    if (!text)
        return;
    st->text_sent = safe;
    eng_result like = {.sample_idx = j, .finish = FINISH_NONE, .stop_str = -1};
    eng_result view = api_stream_view(st, &like);
    cJSON *o = gen_json(c, si, j, &view, NULL, text);
    free(text);
    if (o)
        cJSON_AddNumberToObject(o, "index", sample_index(c, si, j));
    send_event(c, o);
}

static void gen_done(api_call *c)
{
    if (c->stream) {
        api_send_done(c);
        return;
    }
    cJSON *doc = NULL;
    if (c->batch || c->p.n > 1) {
        doc = cJSON_CreateArray();
        for (int i = 0; doc && i < c->n_subs; i++)
            for (int32_t j = 0; j < c->subs[i].n; j++)
                cJSON_AddItemToArray(doc, gen_sample_json(c, i, j));
    } else {
        doc = gen_sample_json(c, 0, 0);
    }
    api_answer_json(c->h, 200, doc);
}

static cJSON *parse_body(const http_req *req, api_err *e) { return api_parse_json(req->body, req->body_len, e); }

cJSON *api_parse_body(const http_req *req, api_err *e) { return parse_body(req, e); }

static void route_generate(http_res *h, const http_req *req, void *ud)
{
    api *a = ud;
    api_err e = {0};
    cJSON *root = parse_body(req, &e);
    if (!root) {
        api_answer_error(h, &e);
        return;
    }
    api_call *c = api_call_new(a, h, API_GENERATE);
    if (!c) {
        cJSON_Delete(root);
        http_respond_error(h, 500, "internal error", "out of memory");
        return;
    }
    c->fmt_begin = gen_begin;
    c->fmt_sample = gen_sample;
    c->fmt_progress = gen_progress;
    c->fmt_done = gen_done;
    api_read_generate(root, c, &e);
    cJSON_Delete(root);
    if (e.status || api_admit(c, &e)) {
        api_refuse(c, &e);
        return;
    }
}

/* ---- control routes ---- */

/* SGLang's scheduler aborts every request whose rid starts with the one
 * asked for, so "abc" also reaches the samples "abc_0", "abc_1" of a call. */
static int rid_matches(const api_call *c, const char *rid)
{
    size_t n = strlen(rid);
    if (c->rid && !strncmp(c->rid, rid, n))
        return 1;
    for (int i = 0; i < c->n_subs; i++)
        if (c->subs[i].rid && !strncmp(c->subs[i].rid, rid, n))
            return 1;
    return 0;
}

/* Aborts one call: running samples end with what they have; a call still
 * held by a pause ends at once with no tokens. Returns 1 if anything was
 * aborted. The call may be freed on return. */
static int abort_call(api *a, api_call *c)
{
    if (!c->submitted) {
        for (int i = 0; i < c->n_subs; i++)
            if (fake_finish(a, c, &c->subs[i], FINISH_ABORT))
                break;
        return 1;
    }
    int any = 0;
    for (int i = 0; i < c->n_subs; i++) {
        api_sub *s = &c->subs[i];
        if (s->n_done < s->n && !s->aborted) {
            s->aborted = 1;
            et_abort(&a->d->et, s->key);
            any = 1;
        }
    }
    return any;
}

static int abort_matching(api *a, const char *rid)
{
    int n = 0;
    for (api_call *c = a->head, *nx; c; c = nx) {
        nx = c->next;
        if (c->kind == API_HEALTH)
            continue;
        if ((!rid || rid_matches(c, rid)) && abort_call(a, c))
            n++;
    }
    return n;
}

void api_abort_all(api *a) { abort_matching(a, NULL); }

int api_abort_rid(api *a, const char *rid) { return abort_matching(a, rid); }

static cJSON *ok_doc(void)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddBoolToObject(o, "success", 1);
    return o;
}

static void route_abort(http_res *h, const http_req *req, void *ud)
{
    api *a = ud;
    api_err e = {0};
    cJSON *root = parse_body(req, &e);
    if (!root) {
        api_answer_error(h, &e);
        return;
    }
    int all;
    const char *rid;
    if (api_read_abort(root, &all, &rid, &e)) {
        cJSON_Delete(root);
        api_answer_error(h, &e);
        return;
    }
    int n = abort_matching(a, all ? NULL : rid);
    cJSON_Delete(root);
    cJSON *o = ok_doc();
    cJSON_AddNumberToObject(o, "aborted_requests", n);
    api_answer_json(h, 200, o);
}

/* A pause in "wait" mode answers once no submitted HTTP call runs. */
static void check_pause_wait(api *a)
{
    api_vllm_check_wait(a); /* vLLM's /pause?mode=wait answers the same way */
    if (!a->pause_wait)
        return;
    for (api_call *c = a->head; c; c = c->next)
        if (c->submitted && c->kind != API_HEALTH)
            return;
    http_res *h = a->pause_wait;
    a->pause_wait = NULL;
    api_answer_json(h, 200, ok_doc());
}

static void on_pause_close(http_res *h, void *ud)
{
    api *a = ud;
    if (a->pause_wait == h) {
        a->pause_wait = NULL;
        http_release(h);
    }
}

/* Freezes or unfreezes the engine (pause mode keep), once per change. */
static void set_frozen(api *a, int frozen)
{
    if (a->frozen == frozen)
        return;
    if (et_pause(&a->d->et, frozen)) {
        log_line("HTTP pause: %s", rd_errmsg());
        return;
    }
    a->frozen = frozen;
}

void api_set_frozen(api *a, int frozen) { set_frozen(a, frozen); }

static void route_pause(http_res *h, const http_req *req, void *ud)
{
    api *a = ud;
    api_err e = {0};
    const char *mode = "abort";
    cJSON *root = NULL;
    if (req->body_len) {
        if (!(root = parse_body(req, &e))) {
            api_answer_error(h, &e);
            return;
        }
        api_read_pause(root, &mode, &e);
    }
    if (e.status || a->pause_wait) {
        if (!e.status)
            api_bad(&e, 400, "a pause in \"wait\" mode is already waiting");
        cJSON_Delete(root);
        api_answer_error(h, &e);
        return;
    }
    if (!strcmp(mode, "wait")) {
        a->paused = 1;
        set_frozen(a, 0); /* wait lets what a keep froze finish */
        cJSON_Delete(root);
        a->pause_wait = h;
        http_on_close(h, on_pause_close, a);
        check_pause_wait(a);
        return;
    }
    api_pause_mode(a, mode);
    cJSON_Delete(root);
    api_answer_json(h, 200, ok_doc());
}

/* SGLang's modes (new calls wait until /continue_generation in each):
 *   abort: every HTTP request ends now with what it has (finish "abort");
 *   retract: every running sequence goes back to the queue, its KV dropped
 *     and its tokens kept (the scheduler's preemption); on continue it is
 *     recomputed, under the weights serving then, and goes on;
 *   in_place (vLLM's keep): every sequence freezes where it is, its KV kept
 *     (a weight update may swap in between: it goes on under the new version). */
void api_pause_mode(api *a, const char *mode)
{
    a->paused = 1;
    if (!strcmp(mode, "abort")) {
        set_frozen(a, 0); /* abort ends what a keep froze */
        abort_matching(a, NULL);
    } else if (!strcmp(mode, "retract")) {
        if (et_retract(&a->d->et))
            log_line("HTTP pause: %s", rd_errmsg());
        else
            a->frozen = 1;
    } else {
        set_frozen(a, 1);
    }
}

void api_resume_held(api *a)
{
    a->paused = 0;
    set_frozen(a, 0);
    for (api_call *c = a->head, *nx; c; c = nx) {
        nx = c->next;
        if (!c->submitted)
            call_submit(a, c); /* may free c; nx was read before */
    }
}

static void route_continue(http_res *h, const http_req *req, void *ud)
{
    api_resume_held(ud);
    api_answer_json(h, 200, ok_doc());
}

static void route_model_info(http_res *h, const http_req *req, void *ud)
{
    api *a = ud;
    rd_daemon *d = a->d;
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "model_path", d->cfg.model);
    cJSON_AddStringToObject(o, "tokenizer_path", d->cfg.model); /* the GGUF file holds the tokenizer */
    cJSON_AddBoolToObject(o, "is_generation", 1);
    char ver[32];
    snprintf(ver, sizeof ver, "%llu", (unsigned long long)d->weight_version);
    cJSON_AddStringToObject(o, "weight_version", ver);
    cJSON_AddStringToObject(o, "model_name", d->model_name);
    cJSON_AddNumberToObject(o, "max_context", d->lim.max_context);
    cJSON_AddNumberToObject(o, "vocab_size", d->lim.vocab_size);
    cJSON_AddNumberToObject(o, "eos_token_id", d->lim.eos_id);
    cJSON_AddStringToObject(o, "chat_format", d->L.tok ? tok_chat_name(tok_chat_kind(d->L.tok)) : "none");
    const int processed = !strcmp(d->cfg.logprobs_mode, "processed_logprobs");
    cJSON_AddStringToObject(o, "logprob_kind", processed ? "processed" : "raw");
    cJSON_AddStringToObject(o, "logprobs_mode", d->cfg.logprobs_mode);
    api_answer_json(h, 200, o);
}

static void health_done(api_call *c)
{
    const eng_result *r = &c->subs[0].res[0];
    if (r->finish == FINISH_ERROR || r->n_tokens < 1) {
        http_respond_error(c->h, 503, "unhealthy", "the 1-token generation did not produce a token");
        return;
    }
    static const char ok[] = "{\"status\":\"ok\"}\n";
    http_respond(c->h, 200, "application/json", ok, sizeof ok - 1);
}

static void route_health_generate(http_res *h, const http_req *req, void *ud)
{
    api *a = ud;
    api_err e = {0};
    if (a->frozen) {
        http_respond_error(h, 503, "busy", "generation is paused in \"keep\" mode; /continue_generation resumes it");
        return;
    }
    api_call *c = api_call_new(a, h, API_HEALTH);
    if (!c) {
        http_respond_error(h, 500, "internal error", "out of memory");
        return;
    }
    c->fmt_done = health_done;
    int32_t *ids = malloc(sizeof *ids);
    int32_t bos = a->d->L.tok ? tok_bos(a->d->L.tok) : -1;
    if (ids)
        ids[0] = bos >= 0 ? bos : 0;
    if (!ids) {
        api_bad(&e, 500, "out of memory");
    } else if (!api_add_prompt(c, ids, 1, &e)) {
        c->p.max_tokens = 1;
        c->p.temperature = 0.0f;
        c->p.ignore_eos = 1;
        c->p.has_seed = 1;
    }
    if (e.status || api_admit(c, &e))
        api_refuse(c, &e);
}

/* A /flush_cache call waiting for the engine thread's answer. */
struct api_flush {
    struct api_flush *next;
    uint64_t key;
    http_res *h;                /* NULL once the client left */
    void (*answer)(http_res *h, int32_t n_flushed); /* NULL: SGLang's answer */
};

static void on_flush_close(http_res *h, void *ud)
{
    api *a = ud;
    for (struct api_flush *f = a->flushes; f; f = f->next)
        if (f->h == h) {
            f->h = NULL;
            http_release(h);
        }
}

/* SGLang refuses a flush while requests run; here it always succeeds, at the
 * next step boundary: cached blocks nobody holds become free, blocks in use
 * keep their KV but are never served from the cache again (eng_flush_cache),
 * so a pause (any mode), flush, weight update sequence is safe too. */
void api_flush_begin(api *a, http_res *h, void (*answer)(http_res *h, int32_t n_flushed))
{
    struct api_flush *f = calloc(1, sizeof *f);
    if (!f) {
        http_respond_error(h, 500, "internal error", "out of memory");
        return;
    }
    f->key = API_KEY_BIT | ++a->next_key;
    f->h = h;
    f->answer = answer;
    if (et_flush_cache(&a->d->et, f->key)) {
        free(f);
        http_respond_error(h, 500, "internal error", rd_errmsg());
        return;
    }
    f->next = a->flushes;
    a->flushes = f;
    http_on_close(h, on_flush_close, a);
}

void api_route_flush_cache(http_res *h, const http_req *req, void *ud) { api_flush_begin(ud, h, NULL); }

void api_on_flushed(api *a, uint64_t key, int32_t n_flushed)
{
    for (struct api_flush **pf = &a->flushes; *pf; pf = &(*pf)->next) {
        struct api_flush *f = *pf;
        if (f->key != key)
            continue;
        *pf = f->next;
        if (f->h && f->answer) {
            f->answer(f->h, n_flushed);
        } else if (f->h) {
            cJSON *o = ok_doc();
            cJSON_AddStringToObject(o, "message", "Cache flushed.");
            cJSON_AddNumberToObject(o, "flushed_blocks", n_flushed);
            api_answer_json(f->h, 200, o);
        }
        free(f);
        return;
    }
}

/* ---- the table ---- */

int api_routes(api *a, http_route *t)
{
    const http_route r[] = {
        {"POST", "/generate", route_generate, a, 0},
        {"POST", "/abort_request", route_abort, a, 0},
        {"POST", "/pause_generation", route_pause, a, 0},
        {"POST", "/continue_generation", route_continue, a, 0},
        {"GET", "/get_model_info", route_model_info, a, 0},
        {"GET", "/health_generate", route_health_generate, a, 0},
        {"POST", "/flush_cache", api_route_flush_cache, a, 0},
        {"POST", "/update_weights_from_disk", api_route_update_disk, a, 0},
        {"GET", "/v1/models", api_route_models, a, 0},
        {"POST", "/v1/completions", api_route_completions, a, 0},
        {"POST", "/v1/chat/completions", api_route_chat, a, 0},
    };
    int n = (int)(sizeof r / sizeof r[0]);
    for (int i = 0; i < n; i++)
        t[i] = r[i];
    n += api_vllm_routes(a, t + n);
    n += api_sglang_routes(a, t + n);
    n += api_manifest_routes(a, t + n);
    return n;
}

int api_create(void *dv, api **out)
{
    api *a = calloc(1, sizeof *a);
    if (!a)
        return rd_fail(RD_ENOMEM, "HTTP API: out of memory");
    a->d = dv;
    umap_init(&a->keys);
    api_note_weights_source(a, a->d->cfg.model, a->d->weight_version);
    *out = a;
    return 0;
}

int api_unfinished(const api *a)
{
    int n = 0;
    for (const api_call *c = a->head; c; c = c->next)
        n++;
    return n;
}

void api_drain(api *a) { set_frozen(a, 0); }

void api_shutdown(api *a)
{
    a->exiting = 1;
}

void api_destroy(api *a)
{
    if (!a)
        return;
    while (a->head) {
        api_call *c = a->head;
        unlink_call(a, c);
        if (c->h)
            http_release(c->h);
        call_free(c);
    }
    while (a->flushes) {
        struct api_flush *f = a->flushes;
        a->flushes = f->next;
        if (f->h)
            http_release(f->h);
        free(f);
    }
    api_vllm_destroy(a);
    api_sglang_free(a);
    umap_free(&a->keys);
    free(a);
}
