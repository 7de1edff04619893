/* api_openai.c - vLLM's OpenAI-compatible routes: /v1/completions,
 * /v1/chat/completions and /v1/models, on the call machinery of api_call.c.
 *
 * Field names and defaults as vLLM's (max_tokens 16 for completions; for chat
 * what the context leaves), plus vLLM's extras: top_k, min_p,
 * stop_token_ids, ignore_eos, return_token_ids, and SGLang's
 * return_routed_experts (each finished choice's routed_experts, as
 * /generate's meta_info has them). The model field is checked as vLLM
 * checks it (api_check_model): absent or empty, the served name
 * (served_model_name, else the file's base name), the file's base name or
 * the model path are served; any other name gets vLLM's 404, so a client
 * that names another model is not answered by this one. Every answer's
 * "model" is the served name. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/utf8.h"
#include "daemon/api_int.h"
#include "base/err.h"
#include "engine/text/tokenizer.h"

static void usage_add(cJSON *o, const api_call *c)
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

static cJSON *envelope(const api_call *c, const char *object)
{
    cJSON *o = cJSON_CreateObject();
    char id[48];
    snprintf(id, sizeof id, "%s-%llu", c->kind == API_CHAT ? "chatcmpl" : "cmpl", (unsigned long long)c->serial);
    cJSON_AddStringToObject(o, "id", id);
    cJSON_AddStringToObject(o, "object", object);
    cJSON_AddNumberToObject(o, "created", (double)c->created);
    cJSON_AddStringToObject(o, "model", c->lora ? c->lora : c->a->d->model_name); /* vLLM answers the adapter's */
    return o;
}

static cJSON *ids_json(const int32_t *ids, int32_t n)
{
    cJSON *a = cJSON_CreateArray();
    for (int32_t k = 0; a && k < n; k++)
        cJSON_AddItemToArray(a, cJSON_CreateNumber(ids[k]));
    return a;
}

/* Completions' logprobs object: tokens, token_logprobs, top_logprobs (the
 * asked alternatives and the sampled token), text_offset. A NaN log-prob (an
 * echoed prompt's first token) is null, its top_logprobs too, as vLLM gives them. */
static cJSON *cmpl_logprobs(api *a, const eng_result *r, size_t off)
{
    cJSON *o = cJSON_CreateObject();
    cJSON *toks = cJSON_AddArrayToObject(o, "tokens");
    cJSON *lps = cJSON_AddArrayToObject(o, "token_logprobs");
    cJSON *tops = cJSON_AddArrayToObject(o, "top_logprobs");
    cJSON *offs = cJSON_AddArrayToObject(o, "text_offset");
    for (int32_t k = 0; k < r->n_tokens; k++) {
        char *t = api_token_text(a, r->token_ids[k]);
        cJSON_AddItemToArray(toks, cJSON_CreateString(t ? t : ""));
        size_t n = 0;
        if (isnan(r->logprobs[k])) {
            cJSON_AddItemToArray(lps, cJSON_CreateNull());
            cJSON_AddItemToArray(tops, cJSON_CreateNull());
            cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)off));
            api_token_bytes(a, r->token_ids[k], &n);
            off += n;
            free(t);
            continue;
        }
        cJSON_AddItemToArray(lps, cJSON_CreateNumber(api_lp_value(r->logprobs[k])));
        cJSON *d = cJSON_CreateObject();
        for (int32_t q = 0; q < r->n_top; q++) {
            if (r->top_ids[(size_t)k * r->n_top + q] < 0)
                continue;
            char *tq = api_token_text(a, r->top_ids[(size_t)k * r->n_top + q]);
            if (tq && !cJSON_GetObjectItemCaseSensitive(d, tq))
                cJSON_AddNumberToObject(d, tq, r->top_logprobs[(size_t)k * r->n_top + q]);
            free(tq);
        }
        if (t && !cJSON_GetObjectItemCaseSensitive(d, t))
            cJSON_AddNumberToObject(d, t, api_lp_value(r->logprobs[k]));
        cJSON_AddItemToArray(tops, d);
        cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)off));
        api_token_bytes(a, r->token_ids[k], &n);
        off += n;
        free(t);
    }
    return o;
}

static cJSON *bytes_json(api *a, int32_t id)
{
    size_t n = 0;
    const char *b = api_token_bytes(a, id, &n);
    cJSON *arr = cJSON_CreateArray();
    for (size_t i = 0; b && i < n; i++)
        cJSON_AddItemToArray(arr, cJSON_CreateNumber((unsigned char)b[i]));
    return arr;
}

static cJSON *chat_entry(api *a, int32_t id, float lp)
{
    cJSON *e = cJSON_CreateObject();
    char *t = api_token_text(a, id);
    cJSON_AddStringToObject(e, "token", t ? t : "");
    free(t);
    cJSON_AddNumberToObject(e, "logprob", lp);
    cJSON_AddItemToObject(e, "bytes", bytes_json(a, id));
    return e;
}

/* Chat's logprobs object: {"content": [{token, logprob, bytes, top_logprobs}]}. */
static cJSON *chat_logprobs(api *a, const eng_result *r)
{
    cJSON *o = cJSON_CreateObject();
    cJSON *content = cJSON_AddArrayToObject(o, "content");
    for (int32_t k = 0; k < r->n_tokens; k++) {
        cJSON *e = chat_entry(a, r->token_ids[k], r->logprobs[k]);
        cJSON *tops = cJSON_AddArrayToObject(e, "top_logprobs");
        for (int32_t q = 0; q < r->n_top; q++)
            cJSON_AddItemToArray(tops, chat_entry(a, r->top_ids[(size_t)k * r->n_top + q],
                                                  r->top_logprobs[(size_t)k * r->n_top + q]));
        cJSON_AddItemToArray(content, e);
    }
    return o;
}

/* One choice (sample j of prompt si): r the tokens it lists, lr those its
 * log-probs list (r, or an echo's prompt and completion), text_off the byte
 * offset of lr's first token in the sample's text (completions'
 * text_offset), text its text; v the finished sample's view, or NULL while it
 * runs (a stream's delta: finish_reason null); delta: the streaming form. */
static cJSON *choice_json(api_call *c, int si, int j, const eng_result *r, const eng_result *lr, size_t text_off,
                          const char *text, const sample_view *v, int delta)
{
    api_sub *s = &c->subs[si];
    int index = j;
    for (int k = 0; k < si; k++)
        index += c->subs[k].n;
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "index", index);
    if (c->kind == API_CHAT) {
        cJSON *m = cJSON_AddObjectToObject(o, delta ? "delta" : "message");
        if (!delta)
            cJSON_AddStringToObject(m, "role", "assistant");
        cJSON_AddStringToObject(m, "content", text);
    } else {
        cJSON_AddStringToObject(o, "text", text);
    }
    if (!c->return_logprob)
        cJSON_AddNullToObject(o, "logprobs");
    else
        cJSON_AddItemToObject(o, "logprobs", c->kind == API_CHAT ? chat_logprobs(c->a, r)
                                                                 : cmpl_logprobs(c->a, lr, text_off));
    if (!v) {
        cJSON_AddNullToObject(o, "finish_reason");
        cJSON_AddNullToObject(o, "stop_reason");
    } else {
        cJSON_AddStringToObject(o, "finish_reason", v->finish);
        if (v->matched_str >= 0)
            cJSON_AddStringToObject(o, "stop_reason", c->p.stop_strs[v->matched_str]);
        else if (v->matched_id >= 0 && v->matched_id != c->a->d->lim.eos_id &&
                 (!c->a->d->L.tok || v->matched_id != tok_eot(c->a->d->L.tok)))
            cJSON_AddNumberToObject(o, "stop_reason", v->matched_id); /* vLLM: None for EOS (and end of turn) */
        else
            cJSON_AddNullToObject(o, "stop_reason");
    }
    if (v && c->return_routes) /* the extension field SGLang's /v1 routes return (its /generate layout) */
        cJSON_AddItemToObject(o, "routed_experts", api_routes_json(r));
    if (c->return_token_ids) {
        cJSON_AddItemToObject(o, "token_ids", ids_json(r->token_ids, r->n_tokens));
        if (c->kind != API_CHAT && (!delta || !s->st[j].begun))
            cJSON_AddItemToObject(o, "prompt_token_ids", ids_json(s->prompt, s->n_prompt));
    }
    if (!delta && c->kind != API_CHAT && c->prompt_lp >= 0) /* vLLM's choice field */
        cJSON_AddItemToObject(o, "prompt_logprobs", api_prompt_logprobs_json(c, r));
    if (delta)
        s->st[j].begun = 1;
    return o;
}

/* Tokens [from, n_tokens) of r, its arrays borrowed. */
static eng_result tail_of(const eng_result *r, int32_t from)
{
    eng_result t = *r;
    t.n_tokens = r->n_tokens - from;
    t.token_ids = r->token_ids + from;
    t.logprobs = r->logprobs + from;
    t.logprobs_proc = NULL;
    t.top_ids = r->top_ids ? r->top_ids + (size_t)from * r->n_top : NULL;
    t.top_logprobs = r->top_logprobs ? r->top_logprobs + (size_t)from * r->n_top : NULL;
    if (!t.top_ids || !t.top_logprobs)
        t.n_top = 0;
    return t;
}

/* Bytes of r's first n tokens (where token n starts in the sample's bytes). */
static size_t bytes_before(api *a, const eng_result *r, int32_t n)
{
    size_t off = 0;
    for (int32_t k = 0; k < n; k++) {
        size_t b = 0;
        api_token_bytes(a, r->token_ids[k], &b);
        off += b;
    }
    return off;
}

static void send_chunk(api_call *c, cJSON *choice)
{
    cJSON *o = envelope(c, c->kind == API_CHAT ? "chat.completion.chunk" : "text_completion");
    cJSON *choices = cJSON_AddArrayToObject(o, "choices");
    cJSON_AddItemToArray(choices, choice);
    api_send_event(c, o);
}

/* The stream opens; chat sends each choice's role first, as vLLM does
 * ({"role": "assistant", "content": ""}, the prompt's ids with the first). */
static void v1_begin(api_call *c)
{
    http_stream_begin(c->h, 200, NULL);
    if (c->kind != API_CHAT)
        return;
    int index = 0;
    for (int i = 0; i < c->n_subs; i++)
        for (int32_t j = 0; j < c->subs[i].n; j++, index++) {
            cJSON *o = envelope(c, "chat.completion.chunk");
            cJSON *choices = cJSON_AddArrayToObject(o, "choices");
            cJSON *ch = cJSON_CreateObject();
            cJSON_AddNumberToObject(ch, "index", index);
            cJSON *m = cJSON_AddObjectToObject(ch, "delta");
            cJSON_AddStringToObject(m, "role", "assistant");
            cJSON_AddStringToObject(m, "content", "");
            cJSON_AddNullToObject(ch, "logprobs");
            cJSON_AddNullToObject(ch, "finish_reason");
            cJSON_AddItemToArray(choices, ch);
            if (c->return_token_ids && index == 0)
                cJSON_AddItemToObject(o, "prompt_token_ids", ids_json(c->subs[0].prompt, c->subs[0].n_prompt));
            api_send_event(c, o);
        }
}

/* New tokens of a running sample: one delta chunk with the text that can no
 * longer change (api_stream_safe) and the tokens not sent yet. */
static void v1_progress(api_call *c, int si, int j)
{
    api_stream *st = &c->subs[si].st[j];
    size_t safe = api_stream_safe(st, &c->p), n;
    int any_tokens = st->n_tok > st->tok_sent && (c->return_token_ids || c->return_logprob);
    if (safe == st->text_sent && !any_tokens)
        return; /* nothing to show yet: what came goes with the next chunk */
    size_t shown_len = safe;
    char *shown = c->p.skip_special ? api_stream_shown(c->a, st, safe, &shown_len) : st->raw;
    char *text = shown ? api_clean_slice(shown, st->shown_sent, shown_len, &n) : NULL;
    if (shown != st->raw)
        free(shown);
    if (!text)
        return;
    st->shown_sent = shown_len;
    eng_result like = {.sample_idx = j, .finish = FINISH_NONE, .stop_str = -1};
    eng_result all = api_stream_view(st, &like);
    eng_result rest = tail_of(&all, st->tok_sent);
    send_chunk(c, choice_json(c, si, j, &rest, &rest, bytes_before(c->a, &all, st->tok_sent), text, NULL, 1));
    free(text);
    st->text_sent = safe;
    st->tok_sent = st->n_tok;
}

/* A sample finished: in a stream, the last delta (the rest of its text and
 * tokens) with the finish reason. */
static void v1_sample(api_call *c, int si, int j)
{
    api_sub *s = &c->subs[si];
    const eng_result *r = &s->res[j];
    api_stream *st = &s->st[j];
    sample_view v;
    if (api_sample_text(c->a, r, &v, &c->p))
        return;
    size_t n;
    char *text = api_clean_slice(v.text, st->shown_sent < v.len ? st->shown_sent : v.len, v.len, &n);
    free(v.text);
    if (!text)
        return;
    int32_t from = st->tok_sent < r->n_tokens ? st->tok_sent : r->n_tokens;
    eng_result rest = tail_of(r, from);
    send_chunk(c, choice_json(c, si, j, &rest, &rest, bytes_before(c->a, r, from), text, &v, 1));
    free(text);
}

/* /v1/completions' echo: the prompt's text before the completion's, and with logprobs the prompt's tokens and
 * log-probs (null at position 0) before the completion's, as vLLM (and lm-evaluation-harness's parser) has them. */
static void echo_choice(api_call *c, cJSON *choices, int si, int j, const sample_view *v)
{
    api_sub *s = &c->subs[si];
    const eng_result *r = &s->res[j];
    eng_result pr = {.token_ids = s->prompt, .n_tokens = s->n_prompt, .finish = FINISH_LENGTH, .stop_str = -1};
    sample_view pv;
    if (api_sample_text(c->a, &pr, &pv, &c->p))
        return;
    const int32_t n = s->n_prompt + r->n_tokens, k = c->p.top_n;
    size_t tn;
    char *text = malloc(pv.len + v->len + 1), *clean = NULL;
    eng_result both = *r;
    both.n_tokens = n;
    both.n_top = k;
    both.token_ids = malloc(sizeof(int32_t) * (size_t)n);
    both.logprobs = malloc(sizeof(float) * (size_t)n);
    both.top_ids = malloc(sizeof(int32_t) * ((size_t)n * k + 1));
    both.top_logprobs = malloc(sizeof(float) * ((size_t)n * k + 1));
    if (text && both.token_ids && both.logprobs && both.top_ids && both.top_logprobs) {
        memcpy(text, pv.text, pv.len);
        memcpy(text + pv.len, v->text, v->len);
        clean = utf8_clean(text, pv.len + v->len, &tn);
        for (int32_t p = 0; p < n; p++) {
            const int out = p >= s->n_prompt;
            const int32_t t = out ? p - s->n_prompt : p;
            both.token_ids[p] = out ? r->token_ids[t] : s->prompt[t];
            both.logprobs[p] = out ? r->logprobs[t] : r->prompt_logprobs && p > 0 ? r->prompt_logprobs[t] : NAN;
            const int32_t stride = out ? r->n_top : r->n_prompt_top;
            const int32_t *ids = out ? r->top_ids : r->prompt_top_ids;
            const float *lps = out ? r->top_logprobs : r->prompt_top_logprobs;
            for (int32_t q = 0; q < k; q++) {
                const int have = ids && lps && q < stride && ids[(size_t)t * stride + q] >= 0;
                both.top_ids[(size_t)p * k + q] = have ? ids[(size_t)t * stride + q] : -1;
                both.top_logprobs[(size_t)p * k + q] = have ? lps[(size_t)t * stride + q] : -INFINITY;
            }
        }
    }
    if (clean)
        cJSON_AddItemToArray(choices, choice_json(c, si, j, r, &both, 0, clean, v, 0));
    free(clean);
    free(text);
    free(pv.text);
    free(both.token_ids);
    free(both.logprobs);
    free(both.top_ids);
    free(both.top_logprobs);
}

static void v1_done(api_call *c)
{
    if (c->stream) {
        if (c->include_usage) {
            cJSON *o = envelope(c, c->kind == API_CHAT ? "chat.completion.chunk" : "text_completion");
            cJSON_AddArrayToObject(o, "choices");
            usage_add(o, c);
            api_send_event(c, o);
        }
        api_send_done(c);
        return;
    }
    cJSON *o = envelope(c, c->kind == API_CHAT ? "chat.completion" : "text_completion");
    cJSON *choices = cJSON_AddArrayToObject(o, "choices");
    for (int i = 0; i < c->n_subs; i++)
        for (int32_t j = 0; j < c->subs[i].n; j++) {
            const eng_result *r = &c->subs[i].res[j];
            sample_view v;
            if (api_sample_text(c->a, r, &v, &c->p))
                continue;
            size_t n;
            char *clean = utf8_clean(v.text, v.len, &n);
            free(v.text);
            if (!clean)
                continue;
            v.text = clean;
            v.len = n;
            if (c->echo)
                echo_choice(c, choices, i, j, &v);
            else
                cJSON_AddItemToArray(choices, choice_json(c, i, j, r, r, 0, v.text, &v, 0));
            free(v.text);
        }
    usage_add(o, c);
    if (c->kind == API_CHAT && c->prompt_lp >= 0 && c->n_subs > 0 && c->subs[0].n > 0) /* vLLM's top-level field */
        cJSON_AddItemToObject(o, "prompt_logprobs", api_prompt_logprobs_json(c, &c->subs[0].res[0]));
    if (c->kind == API_CHAT && c->return_token_ids)
        cJSON_AddItemToObject(o, "prompt_token_ids", ids_json(c->subs[0].prompt, c->subs[0].n_prompt));
    api_answer_json(c->h, 200, o);
}

/* The /v1 answer shapes, both routes. */
static void v1_formats(api_call *c)
{
    c->fmt_begin = v1_begin;
    c->fmt_sample = v1_sample;
    c->fmt_progress = v1_progress;
    c->fmt_done = v1_done;
}

int api_check_model(api *a, cJSON *root, http_res *h, const char **lora)
{
    const char *names[] = {a->d->model_name, a->d->model_base, a->d->cfg.model};
    api_err e = {0};
    if (lora)
        *lora = NULL;
    /* A resident LoRA adapter's name serves that adapter (vLLM's LoRA requests) */
    const cJSON *m = cJSON_GetObjectItemCaseSensitive(root, "model");
    const lr_entry *ad = cJSON_IsString(m) ? lr_find(&a->d->loras, m->valuestring) : NULL;
    if (ad) {
        if (lora)
            *lora = ad->name;
        return 0;
    }
    if (!api_read_model(root, names, (int)(sizeof names / sizeof names[0]), &e))
        return 0;
    if (e.status != 404) {
        api_answer_error_v1(h, &e);
        return -1;
    }
    /* vLLM's create_error_response(err_type="NotFoundError", status_code=404, param="model") */
    cJSON *o = cJSON_CreateObject();
    cJSON *x = cJSON_AddObjectToObject(o, "error");
    cJSON_AddStringToObject(x, "message", e.detail);
    cJSON_AddStringToObject(x, "type", "NotFoundError");
    cJSON_AddStringToObject(x, "param", "model");
    cJSON_AddNumberToObject(x, "code", 404);
    api_answer_json(h, 404, o);
    return -1;
}

static api_call *start(http_res *h, const http_req *req, api *a, api_kind kind, cJSON **root)
{
    api_err e = {0};
    *root = api_parse_body(req, &e);
    if (!*root) {
        api_answer_error_v1(h, &e);
        return NULL;
    }
    const char *lora;
    if (api_check_model(a, *root, h, &lora)) {
        cJSON_Delete(*root);
        return NULL;
    }
    api_call *c = api_call_new(a, h, kind);
    if (!c) {
        cJSON_Delete(*root);
        http_respond_error(h, 500, "internal error", "out of memory");
        return NULL;
    }
    if (lora && !(c->lora = strdup(lora))) {
        cJSON_Delete(*root);
        api_bad(&e, 500, "out of memory");
        api_refuse(c, &e);
        return NULL;
    }
    return c;
}

void api_route_completions(http_res *h, const http_req *req, void *ud)
{
    cJSON *root;
    api_call *c = start(h, req, ud, API_COMPLETIONS, &root);
    if (!c)
        return;
    api_err e = {0};
    api_read_completions(root, c, &e);
    v1_formats(c);
    cJSON_Delete(root);
    if (e.status || api_admit(c, &e))
        api_refuse(c, &e);
}

void api_route_chat(http_res *h, const http_req *req, void *ud)
{
    cJSON *root;
    api_call *c = start(h, req, ud, API_CHAT, &root);
    if (!c)
        return;
    api_err e = {0};
    api_read_chat(root, c, &e);
    v1_formats(c);
    cJSON_Delete(root);
    if (e.status || api_admit(c, &e))
        api_refuse(c, &e);
}

void api_route_models(http_res *h, const http_req *req, void *ud)
{
    api *a = ud;
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "object", "list");
    cJSON *data = cJSON_AddArrayToObject(o, "data");
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "id", a->d->model_name);
    cJSON_AddStringToObject(m, "object", "model");
    cJSON_AddNumberToObject(m, "created", (double)time(NULL));
    cJSON_AddStringToObject(m, "owned_by", "rolloutd");
    cJSON_AddStringToObject(m, "root", a->d->cfg.model);
    cJSON_AddNumberToObject(m, "max_model_len", a->d->lim.max_context);
    cJSON_AddNullToObject(m, "parent");
    cJSON_AddItemToArray(data, m);
    /* vLLM lists each LoRA adapter with its folder as root and the base model as parent */
    const lr_table *t = &a->d->loras;
    for (int32_t i = 0; i < t->n; i++) {
        cJSON *x = cJSON_CreateObject();
        cJSON_AddStringToObject(x, "id", t->e[i].name);
        cJSON_AddStringToObject(x, "object", "model");
        cJSON_AddNumberToObject(x, "created", (double)time(NULL));
        cJSON_AddStringToObject(x, "owned_by", "rolloutd");
        cJSON_AddStringToObject(x, "root", t->e[i].path ? t->e[i].path : t->e[i].name);
        cJSON_AddStringToObject(x, "parent", a->d->model_name);
        cJSON_AddNumberToObject(x, "max_model_len", a->d->lim.max_context);
        cJSON_AddItemToArray(data, x);
    }
    api_answer_json(h, 200, o);
}
