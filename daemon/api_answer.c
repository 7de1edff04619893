/* api_answer.c - what every HTTP route answers with, below all of them
 * (api_int.h): errors in SGLang's and OpenAI's shapes, JSON documents, the
 * body as JSON, server-sent events, and a sample's text (cut at a stop string,
 * cleaned to UTF-8), its tokens' texts, version spans and routed experts.
 *
 * No call's life and no route here: the call machinery (api_call.c), the
 * routes (api.c, api_openai.c, api_sglang.c, api_update.c, api_vllm.c,
 * api_manifest.c) and the stream's text (api_stream.c) call this file and it
 * calls none of them, so no two files of the API call each other in a circle
 * (tools/check_layers.py, rule calls). */
#include <cjson/cJSON.h>
#include <mbedtls/base64.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/api_int.h"
#include "daemon/daemon.h"
#include "base/err.h"
#include "base/utf8.h"
#include "engine/text/tokenizer.h"

/* ---- errors and documents ---- */

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

/* SGLang's {"success": true}, for the caller to add to. */
cJSON *api_ok_doc(void)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddBoolToObject(o, "success", 1);
    return o;
}

/* ---- the body, and streams ---- */

cJSON *api_parse_body(const http_req *req, api_err *e) { return api_parse_json(req->body, req->body_len, e); }

void api_send_event(api_call *c, cJSON *doc)
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

void api_send_done(api_call *c)
{
    static const char done[] = "data: [DONE]\n\n";
    http_stream_send(c->h, done, sizeof done - 1);
    http_stream_end(c->h);
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

double api_lp_value(float lp) { return lp > -9999.0f ? (double)lp : -9999.0; }

/* One {"logprob", "rank", "decoded_token"} under the token's id in d, unless the id is there already. */
static void prompt_lp_entry(api_call *c, cJSON *d, int32_t id, float lp, int32_t rank)
{
    char key[16];
    snprintf(key, sizeof key, "%d", id);
    if (cJSON_GetObjectItemCaseSensitive(d, key))
        return;
    cJSON *o = cJSON_AddObjectToObject(d, key);
    cJSON_AddNumberToObject(o, "logprob", api_lp_value(lp));
    cJSON_AddNumberToObject(o, "rank", rank);
    char *t = api_token_text(c->a, id);
    cJSON_AddStringToObject(o, "decoded_token", t ? t : "");
    free(t);
}

cJSON *api_prompt_logprobs_json(api_call *c, const eng_result *r)
{
    cJSON *a = cJSON_CreateArray();
    for (int32_t p = 0; a && p < r->n_prompt; p++) {
        if (p == 0 || !r->prompt_logprobs || isnan(r->prompt_logprobs[p])) {
            cJSON_AddItemToArray(a, cJSON_CreateNull());
            continue;
        }
        cJSON *d = cJSON_CreateObject();
        prompt_lp_entry(c, d, r->prompt_ids[p], r->prompt_logprobs[p], r->prompt_ranks ? r->prompt_ranks[p] : 0);
        for (int32_t q = 0; r->prompt_top_ids && q < r->n_prompt_top && q < c->prompt_lp; q++) {
            int32_t id = r->prompt_top_ids[(size_t)p * r->n_prompt_top + q];
            if (id >= 0)
                prompt_lp_entry(c, d, id, r->prompt_top_logprobs[(size_t)p * r->n_prompt_top + q], q + 1);
        }
        cJSON_AddItemToArray(a, d);
    }
    return a;
}
