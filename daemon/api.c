/* api.c - the HTTP API's top (api.h): the route table, which lists every
 * route file's routes, the API's life (create, destroy), and SGLang's native
 * routes (/generate, /abort_request, /pause_generation, /continue_generation,
 * /get_model_info, /health_generate). The JSON shapes of the answers:
 * SGLang's /generate here, vLLM's /v1 schema in api_openai.c.
 *
 * Nothing calls this file but the loop: the calls' life (api_call.c) and the
 * answers and body parsing (api_answer.c) that every route shares are below
 * the route files, and the route files never call back up here (make layers
 * checks that no files call each other in a circle). */
#include "daemon/api.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/api_int.h"
#include "daemon/daemon.h"
#include "base/err.h"
#include "base/utf8.h"
#include "engine/text/tokenizer.h"

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

/* The asked ids' [logprob, id, text] at one position (lps: [s->n_want], raw). */
static cJSON *want_list(api_call *c, const api_sub *s, const float *lps)
{
    cJSON *a = cJSON_CreateArray();
    for (int32_t j = 0; a && j < s->n_want; j++)
        cJSON_AddItemToArray(a, lp_triple(c, lps[j], s->want_ids[j]));
    return a;
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
        if (s->n_want > 0 && r->want_logprobs) {
            /* SGLang's token_ids_logprob: per output token, [logprob, id, text] of each asked id in order */
            cJSON *ws = cJSON_AddArrayToObject(mi, "output_token_ids_logprobs");
            for (int32_t k = 0; k < r->n_tokens; k++)
                cJSON_AddItemToArray(ws, want_list(c, s, r->want_logprobs + (size_t)k * r->n_want));
        }
    }
    if (c->score && r->prompt_logprobs) {
        /* SGLang's layout: one entry per prompt position from logprob_start_len on, position 0's log-prob
           null (nothing comes before it); processed under processed_logprobs (samp_score's: temperature and
           truncation, no penalties), the alternatives raw */
        cJSON *in = cJSON_AddArrayToObject(mi, "input_token_logprobs");
        cJSON *tops = c->p.top_n > 0 ? cJSON_AddArrayToObject(mi, "input_top_logprobs") : NULL;
        for (int32_t p = c->score_from; p < r->n_prompt; p++) {
            cJSON *t = lp_triple(c, 0, r->prompt_ids[p]);
            if (p == 0 || isnan(r->prompt_logprobs[p]))
                cJSON_ReplaceItemInArray(t, 0, cJSON_CreateNull());
            else
                cJSON_ReplaceItemInArray(t, 0, cJSON_CreateNumber(api_lp_value(r->prompt_logprobs[p])));
            cJSON_AddItemToArray(in, t);
            if (!tops)
                continue;
            if (p == 0 || !r->prompt_top_ids) {
                cJSON_AddItemToArray(tops, cJSON_CreateNull());
                continue;
            }
            cJSON *alt = cJSON_CreateArray();
            const size_t at = (size_t)p * r->n_prompt_top;
            for (int32_t q = 0; q < r->n_prompt_top; q++)
                if (r->prompt_top_ids[at + q] >= 0)
                    cJSON_AddItemToArray(alt, lp_triple(c, r->prompt_top_logprobs[at + q], r->prompt_top_ids[at + q]));
            cJSON_AddItemToArray(tops, alt);
        }
        cJSON_AddStringToObject(mi, "input_logprob_kind", c->p.processed ? "processed" : "raw");
        if (s->n_want > 0 && r->prompt_want_logprobs) {
            cJSON *ws = cJSON_AddArrayToObject(mi, "input_token_ids_logprobs");
            for (int32_t p = c->score_from; p < r->n_prompt; p++)
                cJSON_AddItemToArray(ws, p == 0 || isnan(r->prompt_want_logprobs[(size_t)p * r->n_want])
                                             ? cJSON_CreateNull()
                                             : want_list(c, s, r->prompt_want_logprobs + (size_t)p * r->n_want));
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
    if (v && r->lora[0]) {
        /* the adapter every token was drawn under, and which load of it (a reload in place is the next) */
        cJSON_AddStringToObject(mi, "lora_path", r->lora);
        cJSON_AddNumberToObject(mi, "lora_version", (double)r->lora_version);
    }
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

static void gen_sample(api_call *c, int si, int j)
{
    cJSON *o = gen_sample_json(c, si, j);
    if (o)
        cJSON_AddNumberToObject(o, "index", sample_index(c, si, j));
    api_send_event(c, o);
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
    api_send_event(c, o);
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

static void route_generate(http_res *h, const http_req *req, void *ud)
{
    api *a = ud;
    api_err e = {0};
    cJSON *root = api_parse_body(req, &e);
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

static void route_abort(http_res *h, const http_req *req, void *ud)
{
    api *a = ud;
    api_err e = {0};
    cJSON *root = api_parse_body(req, &e);
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
    int n = api_abort_rid(a, all ? NULL : rid);
    cJSON_Delete(root);
    cJSON *o = api_ok_doc();
    cJSON_AddNumberToObject(o, "aborted_requests", n);
    api_answer_json(h, 200, o);
}

/* A "wait" pause's answer, once nothing submitted runs. */
static void answer_waited(api *a, http_res *h, int arg)
{
    api_answer_json(h, 200, api_ok_doc());
}

static void route_pause(http_res *h, const http_req *req, void *ud)
{
    api *a = ud;
    api_err e = {0};
    const char *mode = "abort";
    cJSON *root = NULL;
    if (req->body_len) {
        if (!(root = api_parse_body(req, &e))) {
            api_answer_error(h, &e);
            return;
        }
        api_read_pause(root, &mode, &e);
    }
    if (e.status || a->waits[API_WAIT_SGLANG].h) {
        if (!e.status)
            api_bad(&e, 400, "a pause in \"wait\" mode is already waiting");
        cJSON_Delete(root);
        api_answer_error(h, &e);
        return;
    }
    if (!strcmp(mode, "wait")) {
        a->paused = 1;
        api_set_frozen(a, 0); /* wait lets what a keep froze finish */
        cJSON_Delete(root);
        api_wait_begin(a, API_WAIT_SGLANG, h, answer_waited, 0);
        return;
    }
    api_pause_mode(a, mode);
    cJSON_Delete(root);
    api_answer_json(h, 200, api_ok_doc());
}

static void route_continue(http_res *h, const http_req *req, void *ud)
{
    api_resume_held(ud);
    api_answer_json(h, 200, api_ok_doc());
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
    n += api_lora_routes(a, t + n);
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

void api_destroy(api *a)
{
    if (!a)
        return;
    api_calls_release(a);
    api_sglang_free(a);
    api_lora_free(a);
    umap_free(&a->keys);
    free(a);
}
