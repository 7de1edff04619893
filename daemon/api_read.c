/* api_read.c - the request readers of the HTTP routes (api.h): a JSON body
 * into the call it asks for (api_call: prompts, sampling, flags) or into a
 * control route's request, and the checks admission makes of a call against
 * the limits before anything is queued (api_admit_check).
 *
 * Nothing here touches the HTTP server, the engine or the rest of the
 * daemon: a reader sees the parsed body, the tokenizer (c->tok) and, for the
 * checks, the limits (adm_limits). That is what lets
 * tests/fuzz/fuzz_http_json.c run every reader without an engine; a route
 * added later keeps its reader in this file (or in another file of readers
 * only) for the same reason, and adds one line to that target's table. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/admit.h"
#include "daemon/api_int.h"
#include "base/err.h"
#include "engine/text/stopstr.h"
#include "engine/text/tokenizer.h"
#include "engine/update/staging.h"

/* api_bad and the field readers (api_num, api_int, api_bool) are in api_field.c. */

/* Token ids: a JSON list of integers in 0..vocab-1 (checked later by
 * proto_check_request against the vocabulary). */
static int read_ids(cJSON *v, const char *name, int32_t **ids, int32_t *n, api_err *e)
{
    int k = cJSON_GetArraySize(v);
    int32_t *out = malloc(sizeof(int32_t) * (size_t)(k > 0 ? k : 1));
    if (!out) {
        api_bad(e, 500, "out of memory");
        return -1;
    }
    int i = 0;
    for (cJSON *x = v->child; x; x = x->next, i++) {
        if (!cJSON_IsNumber(x) || x->valuedouble != floor(x->valuedouble) || x->valuedouble < 0 ||
            x->valuedouble > 2147483647.0) {
            api_bad(e, 400, "field \"%s\"[%d]: expected a token id (an integer >= 0)", name, i);
            free(out);
            return -1;
        }
        out[i] = (int32_t)x->valuedouble;
    }
    *ids = out;
    *n = (int32_t)k;
    return 0;
}

void api_params_init(api_params *p)
{
    memset(p, 0, sizeof *p);
    p->n = 1;
    p->max_tokens = -1;
    p->temperature = 1.0f;
    p->top_p = 1.0f;
    p->repetition_penalty = 1.0f;
    p->skip_special = 1; /* vLLM's and SGLang's default */
}

void api_params_free(api_params *p)
{
    for (int i = 0; i < p->n_stop_strs; i++)
        free(p->stop_strs[i]);
    free(p->stop_ids);
    free(p->bias_ids);
    free(p->bias_vals);
    memset(p, 0, sizeof *p);
}

/* ---- prompts ---- */

int api_add_prompt(api_call *c, int32_t *ids, int32_t n, api_err *e)
{
    api_sub *s = realloc(c->subs, sizeof *s * (size_t)(c->n_subs + 1));
    if (!s) {
        free(ids);
        api_bad(e, 500, "out of memory");
        return -1;
    }
    c->subs = s;
    memset(&s[c->n_subs], 0, sizeof *s);
    s[c->n_subs].prompt = ids;
    s[c->n_subs].n_prompt = n;
    c->n_subs++;
    return 0;
}

int api_add_text(api_call *c, const char *text, const char *field, api_err *e)
{
    int32_t *ids = NULL;
    size_t n = 0;
    if (tok_encode_prompt(c->tok, text, strlen(text), &ids, &n)) {
        api_bad(e, 400, "field \"%s\": cannot tokenize: %s", field, rd_errmsg());
        free(ids);
        return -1;
    }
    return api_add_prompt(c, ids, (int32_t)n, e);
}

/* A prompt field: token ids, a list of them (a batch), a string or a list of
 * strings (tokenized with tok_encode_prompt). */
int api_read_prompts(api_call *c, cJSON *v, const char *field, api_err *e)
{
    if (cJSON_IsString(v))
        return api_add_text(c, v->valuestring, field, e);
    if (!cJSON_IsArray(v) || !v->child) {
        api_bad(e, 400, "field \"%s\": expected a string, a list of strings, a list of token ids or a list of "
                "lists of token ids (not empty)", field);
        return -1;
    }
    if (cJSON_IsNumber(v->child)) {
        int32_t *ids;
        int32_t n;
        if (read_ids(v, field, &ids, &n, e))
            return -1;
        return api_add_prompt(c, ids, n, e);
    }
    int i = 0;
    for (cJSON *x = v->child; x; x = x->next, i++) {
        char name[64];
        snprintf(name, sizeof name, "%s[%d]", field, i);
        if (cJSON_IsString(x)) {
            if (api_add_text(c, x->valuestring, name, e))
                return -1;
        } else if (cJSON_IsArray(x)) {
            int32_t *ids;
            int32_t n;
            if (read_ids(x, name, &ids, &n, e) || api_add_prompt(c, ids, n, e))
                return -1;
        } else {
            api_bad(e, 400, "field \"%s\": expected a string or a list of token ids", name);
            return -1;
        }
    }
    return 0;
}

/* ---- calls and bodies ---- */

void api_call_init(api_call *c, api_kind kind, const tok_tokenizer *tok)
{
    c->kind = kind;
    c->tok = tok;
    c->prompt_lp = -1;
    api_params_init(&c->p);
}

void api_call_clear(api_call *c)
{
    for (int i = 0; i < c->n_subs; i++) {
        free(c->subs[i].prompt);
        free(c->subs[i].rid);
        free(c->subs[i].want_ids);
        free(c->subs[i].lora);
    }
    free(c->subs);
    c->subs = NULL;
    c->n_subs = 0;
    free(c->rid);
    c->rid = NULL;
    free(c->lora);
    c->lora = NULL;
    api_params_free(&c->p);
}

cJSON *api_parse_json(const char *body, size_t len, api_err *e)
{
    cJSON *root = cJSON_ParseWithLength(body, len);
    if (!root) {
        api_bad(e, 400, "the body is not JSON (near byte %ld)",
                cJSON_GetErrorPtr() ? (long)(cJSON_GetErrorPtr() - body) : 0L);
        return NULL;
    }
    if (!cJSON_IsObject(root)) {
        api_bad(e, 400, "the body must be a JSON object");
        cJSON_Delete(root);
        return NULL;
    }
    return root;
}

/* ---- SGLang's /generate ---- */

/* One list of token ids (0..SAMP_MAX_WANT of them) into s's want_ids. */
static void read_want(cJSON *v, const char *where, api_sub *s, api_err *e)
{
    int n = cJSON_GetArraySize(v);
    if (!cJSON_IsArray(v) || n > SAMP_MAX_WANT) {
        api_bad(e, 400, "field \"%s\": expected a list of at most %d token ids", where, SAMP_MAX_WANT);
        return;
    }
    if (n == 0)
        return;
    if (!(s->want_ids = malloc(sizeof(int32_t) * (size_t)n))) {
        api_bad(e, 500, "out of memory");
        return;
    }
    int i = 0;
    for (cJSON *x = v->child; x && !e->status; x = x->next, i++) {
        if (!cJSON_IsNumber(x) || x->valuedouble < 0 || x->valuedouble > INT32_MAX ||
            x->valuedouble != floor(x->valuedouble))
            api_bad(e, 400, "field \"%s\"[%d]: expected a token id", where, i);
        else
            s->want_ids[i] = (int32_t)x->valuedouble;
    }
    s->n_want = n;
}

/* SGLang's token_ids_logprob: one list for every prompt, or a list of lists, one per prompt. */
static void read_token_ids_logprob(cJSON *root, api_call *c, api_err *e)
{
    cJSON *v = cJSON_GetObjectItemCaseSensitive(root, "token_ids_logprob");
    if (!v || cJSON_IsNull(v) || e->status)
        return;
    if (!cJSON_IsArray(v)) {
        api_bad(e, 400, "field \"token_ids_logprob\": expected a list of token ids or one such list per prompt");
        return;
    }
    if (v->child && cJSON_IsArray(v->child)) {
        if (cJSON_GetArraySize(v) != c->n_subs) {
            api_bad(e, 400, "field \"token_ids_logprob\": a list of lists needs one per prompt (%d)", c->n_subs);
            return;
        }
        int i = 0;
        for (cJSON *x = v->child; x && !e->status; x = x->next, i++) {
            char where[48];
            snprintf(where, sizeof where, "token_ids_logprob[%d]", i);
            read_want(x, where, &c->subs[i], e);
        }
        return;
    }
    for (int i = 0; i < c->n_subs && !e->status; i++)
        read_want(v, "token_ids_logprob", &c->subs[i], e);
}

/* SGLang's lora_path: the adapter's name (as /load_lora_adapter registered it), or one per prompt (null:
 * the base model). Whether it is loaded is admission's question (api_lora_check). */
static void read_lora_path(cJSON *root, api_call *c, api_err *e)
{
    cJSON *lp = cJSON_GetObjectItemCaseSensitive(root, "lora_path");
    if (!lp || cJSON_IsNull(lp) || e->status)
        return;
    if (cJSON_IsString(lp)) {
        if (lp->valuestring[0] && !(c->lora = strdup(lp->valuestring)))
            api_bad(e, 500, "out of memory");
        return;
    }
    if (!cJSON_IsArray(lp) || cJSON_GetArraySize(lp) != c->n_subs) {
        api_bad(e, 400, "field \"lora_path\": expected an adapter's name, or a list of one per prompt (%d; null for "
                "the base model)", c->n_subs);
        return;
    }
    int i = 0;
    for (cJSON *x = lp->child; x && !e->status; x = x->next, i++) {
        if (cJSON_IsNull(x))
            continue;
        if (!cJSON_IsString(x))
            api_bad(e, 400, "field \"lora_path\"[%d]: expected an adapter's name or null", i);
        else if (x->valuestring[0] && !(c->subs[i].lora = strdup(x->valuestring)))
            api_bad(e, 500, "out of memory");
    }
}

int api_read_generate(cJSON *root, api_call *c, api_err *e)
{
    c->top_field = "top_logprobs_num";
    cJSON *ids = cJSON_GetObjectItemCaseSensitive(root, "input_ids");
    cJSON *text = cJSON_GetObjectItemCaseSensitive(root, "text");
    if (ids && !cJSON_IsNull(ids) && text && !cJSON_IsNull(text)) {
        api_bad(e, 400, "fields \"input_ids\" and \"text\": give one, not both");
    } else if (ids && !cJSON_IsNull(ids)) {
        if (!cJSON_IsArray(ids) || (ids->child && !cJSON_IsNumber(ids->child) && !cJSON_IsArray(ids->child)))
            api_bad(e, 400, "field \"input_ids\": expected a list of token ids or a list of such lists");
        else
            api_read_prompts(c, ids, "input_ids", e);
        c->batch = ids->child && cJSON_IsArray(ids->child);
    } else if (text && !cJSON_IsNull(text)) {
        if (!cJSON_IsString(text) && !cJSON_IsArray(text))
            api_bad(e, 400, "field \"text\": expected a string or a list of strings");
        else
            api_read_prompts(c, text, "text", e);
        c->batch = cJSON_IsArray(text);
    } else {
        api_bad(e, 400, "fields \"input_ids\" / \"text\": one is required");
    }
    cJSON *sp = cJSON_GetObjectItemCaseSensitive(root, "sampling_params");
    if (sp && !cJSON_IsNull(sp) && !cJSON_IsObject(sp))
        api_bad(e, 400, "field \"sampling_params\": expected an object");
    c->p.max_tokens = 128; /* SGLang's default max_new_tokens */
    if (!e->status && sp && cJSON_IsObject(sp)) {
        api_read_fields(sp, SD_SGL, "sampling_params.", &c->p, e);
        if (c->p.skip_special && !c->tok)
            c->p.skip_special = 0; /* no tokenizer: the text is empty anyway */
    }
    api_read_fields(root, SD_SGLT, "", &c->p, e);
    api_bool(root, "return_text_in_logprobs", &c->text_in_logprobs, e);
    int64_t lsl = -1;
    api_int(root, "logprob_start_len", -1, 1 << 30, &lsl, e);
    cJSON *clp = cJSON_GetObjectItemCaseSensitive(root, "custom_logit_processor");
    if (clp && !cJSON_IsNull(clp))
        api_bad(e, 400, "field \"custom_logit_processor\": not supported (it is a pickled Python callable, and "
                "rolloutd runs no Python); daemon/sampling.def lists the sampling fields it implements");
    api_bool(root, "return_logprob", &c->return_logprob, e);
    /* SGLang scores the prompt from logprob_start_len on only when log-probs are returned */
    c->score = c->return_logprob && lsl >= 0;
    c->score_from = (int32_t)(lsl >= 0 ? lsl : 0);
    api_bool(root, "return_routed_experts", &c->return_routes, e);
    int64_t k;
    if (api_int(root, "top_logprobs_num", 0, 1 << 20, &k, e) > 0)
        c->p.top_n = (int32_t)k;
    api_bool(root, "stream", &c->stream, e);
    read_token_ids_logprob(root, c, e);
    if (!e->status && c->stream && c->n_subs > 0 && c->subs[0].n_want > 0)
        api_bad(e, 400, "field \"token_ids_logprob\": not with \"stream\" (the ids' log-probs come in whole answers)");
    read_lora_path(root, c, e);
    cJSON *rid = cJSON_GetObjectItemCaseSensitive(root, "rid");
    if (rid && cJSON_IsString(rid)) {
        c->rid = strdup(rid->valuestring);
    } else if (rid && cJSON_IsArray(rid) && !e->status) {
        if (cJSON_GetArraySize(rid) != c->n_subs)
            api_bad(e, 400, "field \"rid\": a list needs one id per prompt (%d)", c->n_subs);
        int i = 0;
        for (cJSON *x = rid->child; x && !e->status && i < c->n_subs; x = x->next, i++) {
            if (!cJSON_IsString(x))
                api_bad(e, 400, "field \"rid\"[%d]: expected a string", i);
            else
                c->subs[i].rid = strdup(x->valuestring);
        }
    } else if (rid && !cJSON_IsNull(rid)) {
        api_bad(e, 400, "field \"rid\": expected a string or a list of strings");
    }
    return e->status ? -1 : 0;
}

/* ---- vLLM's /v1 routes ---- */

void api_read_prompt_logprobs(cJSON *o, const char *name, api_call *c, api_err *e)
{
    cJSON *v = cJSON_GetObjectItemCaseSensitive(o, name);
    if (!v || cJSON_IsNull(v) || e->status)
        return;
    if (cJSON_IsNumber(v) && v->valuedouble == -1.0) {
        api_bad(e, 400, "field \"%s\" = -1: the whole vocabulary per prompt position is not returned; ask for at "
                "most 20 alternatives", name);
        return;
    }
    int64_t k;
    if (api_int(o, name, 0, 20, &k, e) > 0) {
        c->prompt_lp = (int32_t)k;
        c->score = 1;
        c->score_from = 0;
    }
}

/* The fields both routes share; the prompt is already in. */
static void read_common(api_call *c, cJSON *root, unsigned door, api_err *e)
{
    api_read_fields(root, door, "", &c->p, e);
    api_bool(root, "return_token_ids", &c->return_token_ids, e);
    api_bool(root, "return_routed_experts", &c->return_routes, e);
    api_bool(root, "stream", &c->stream, e);
    cJSON *so = cJSON_GetObjectItemCaseSensitive(root, "stream_options");
    if (so && cJSON_IsObject(so))
        api_bool(so, "include_usage", &c->include_usage, e);
    else if (so && !cJSON_IsNull(so))
        api_bad(e, 400, "field \"stream_options\": expected an object");
    api_read_prompt_logprobs(root, "prompt_logprobs", c, e);
}

/* The text of a message's content: a string, or a list of text parts. */
static char *content_text(cJSON *m, int i, api_err *e)
{
    cJSON *v = cJSON_GetObjectItemCaseSensitive(m, "content");
    if (v && cJSON_IsString(v))
        return strdup(v->valuestring);
    if (!v || !cJSON_IsArray(v)) {
        api_bad(e, 400, "field \"messages\"[%d].content: expected a string or a list of text parts", i);
        return NULL;
    }
    size_t len = 0;
    for (cJSON *p = v->child; p; p = p->next) {
        cJSON *t = cJSON_GetObjectItemCaseSensitive(p, "type"), *x = cJSON_GetObjectItemCaseSensitive(p, "text");
        if (!cJSON_IsString(t) || strcmp(t->valuestring, "text") || !cJSON_IsString(x)) {
            api_bad(e, 400, "field \"messages\"[%d].content: only {\"type\": \"text\", \"text\": ...} parts can be "
                    "rendered", i);
            return NULL;
        }
        len += strlen(x->valuestring);
    }
    char *s = malloc(len + 1);
    if (!s) {
        api_bad(e, 500, "out of memory");
        return NULL;
    }
    s[0] = 0;
    for (cJSON *p = v->child; p; p = p->next)
        strcat(s, cJSON_GetObjectItemCaseSensitive(p, "text")->valuestring);
    return s;
}

/* messages: a conversation of system (or developer), user and assistant
 * turns, rendered by tok_chat_msgs in the model family's chat format; other
 * roles (tool, function) are refused by name rather than rendered in a way
 * the model's template does not. */
#define API_MAX_MESSAGES 1024

void api_read_messages(api_call *c, cJSON *root, api_err *e)
{
    cJSON *ms = cJSON_GetObjectItemCaseSensitive(root, "messages");
    if (!ms || !cJSON_IsArray(ms) || !ms->child) {
        api_bad(e, 400, "field \"messages\": expected a non-empty list of messages");
        return;
    }
    int n = cJSON_GetArraySize(ms);
    if (n > API_MAX_MESSAGES) {
        api_bad(e, 400, "field \"messages\": %d messages; at most %d", n, API_MAX_MESSAGES);
        return;
    }
    tok_chat_msg *msgs = calloc((size_t)n, sizeof *msgs);
    if (!msgs) {
        api_bad(e, 500, "out of memory");
        return;
    }
    int i = 0;
    for (cJSON *m = ms->child; m && !e->status; m = m->next, i++) {
        cJSON *role = cJSON_GetObjectItemCaseSensitive(m, "role");
        if (!cJSON_IsObject(m) || !cJSON_IsString(role)) {
            api_bad(e, 400, "field \"messages\"[%d]: expected an object with a \"role\" string", i);
            break;
        }
        const char *r = role->valuestring;
        if (!strcmp(r, "system") || !strcmp(r, "developer"))
            msgs[i].role = "system";
        else if (!strcmp(r, "user") || !strcmp(r, "assistant"))
            msgs[i].role = !strcmp(r, "user") ? "user" : "assistant";
        else
            api_bad(e, 400, "field \"messages\"[%d]: role \"%.40s\" cannot be rendered; expected system, "
                    "developer, user or assistant", i, r);
        if (!e->status)
            msgs[i].content = content_text(m, i, e);
    }
    if (!e->status) {
        int32_t *ids = NULL;
        size_t k = 0;
        if (!c->tok || tok_chat_msgs(c->tok, msgs, (size_t)n, &ids, &k)) {
            api_bad(e, 400, "field \"messages\": this conversation cannot be rendered in the model's chat "
                    "format: %s", c->tok ? rd_errmsg() : "no tokenizer");
            free(ids);
        } else {
            api_add_prompt(c, ids, (int32_t)k, e);
        }
    }
    for (int j = 0; j < n; j++)
        free((char *)msgs[j].content);
    free(msgs);
}

int api_read_completions(cJSON *root, api_call *c, api_err *e)
{
    cJSON *prompt = cJSON_GetObjectItemCaseSensitive(root, "prompt");
    if (!prompt || cJSON_IsNull(prompt))
        api_bad(e, 400, "field \"prompt\": required");
    else
        api_read_prompts(c, prompt, "prompt", e);
    c->p.max_tokens = 16; /* vLLM's default */
    read_common(c, root, SD_CMPL, e);
    int64_t k;
    c->top_field = "logprobs";
    if (api_int(root, "logprobs", 0, 1 << 20, &k, e) > 0) {
        c->return_logprob = 1;
        c->p.top_n = (int32_t)k;
    }
    api_bool(root, "echo", &c->echo, e);
    if (c->echo && c->stream)
        api_bad(e, 400, "field \"echo\": not with \"stream\" (the prompt is repeated in whole answers only)");
    if (c->echo && c->return_logprob && c->prompt_lp < 0) {
        /* vLLM: echo with logprobs scores the prompt with as many alternatives (lm-evaluation-harness's
           log-likelihood call) */
        c->prompt_lp = c->p.top_n;
        c->score = 1;
        c->score_from = 0;
    }
    return e->status ? -1 : 0;
}

int api_read_chat(cJSON *root, api_call *c, api_err *e)
{
    api_read_messages(c, root, e);
    int64_t k;
    read_common(c, root, SD_CHAT, e);
    int echo = 0;
    api_bool(root, "echo", &echo, e);
    if (echo)
        api_bad(e, 400, "field \"echo\": not supported on chat (the last message is not repeated in the answer); "
                "/v1/completions takes echo");
    api_bool(root, "logprobs", &c->return_logprob, e);
    c->top_field = "top_logprobs";
    if (api_int(root, "top_logprobs", 0, 1 << 20, &k, e) > 0) {
        if (!c->return_logprob)
            api_bad(e, 400, "field \"top_logprobs\": needs \"logprobs\": true");
        c->p.top_n = (int32_t)k;
    }
    return e->status ? -1 : 0;
}

/* ---- control routes ---- */

int api_read_abort(cJSON *root, int *all, const char **rid, api_err *e)
{
    *all = 0;
    *rid = NULL;
    api_bool(root, "abort_all", all, e);
    cJSON *r = cJSON_GetObjectItemCaseSensitive(root, "rid");
    if (!e->status && !*all && !(r && cJSON_IsString(r)))
        api_bad(e, 400, "field \"rid\": expected the request's rid (a string), or \"abort_all\": true");
    if (r && cJSON_IsString(r))
        *rid = r->valuestring;
    return e->status ? -1 : 0;
}

int api_read_pause(cJSON *root, const char **mode, api_err *e)
{
    static const char *const modes[] = {"abort", "wait", "keep", "in_place", "retract"};
    *mode = modes[0];
    cJSON *m = root ? cJSON_GetObjectItemCaseSensitive(root, "mode") : NULL;
    if (m && !cJSON_IsNull(m)) {
        int found = 0;
        for (size_t i = 0; cJSON_IsString(m) && i < sizeof modes / sizeof modes[0]; i++)
            if (!strcmp(m->valuestring, modes[i])) {
                *mode = modes[i];
                found = 1;
            }
        if (!found)
            api_bad(e, 400, "field \"mode\": expected \"abort\", \"retract\", \"in_place\", \"wait\" or "
                    "\"keep\"");
    }
    return e->status ? -1 : 0;
}

int api_read_update_disk(cJSON *root, uint64_t serving, api_update_req *u, api_err *e)
{
    memset(u, 0, sizeof *u);
    cJSON *path = cJSON_GetObjectItemCaseSensitive(root, "model_path");
    if (!cJSON_IsString(path) || !path->valuestring[0] || strlen(path->valuestring) >= CFG_STR)
        api_bad(e, 400, "field \"model_path\": expected a .gguf file, a .safetensors file or an HF folder");
    else
        snprintf(u->path, sizeof u->path, "%s", path->valuestring);
    int64_t version = (int64_t)serving + 1;
    api_int(root, "version", 1, INT64_MAX / 2, &version, e);
    cJSON *wv = cJSON_GetObjectItemCaseSensitive(root, "weight_version"); /* SGLang's name, a string */
    if (wv && cJSON_IsString(wv)) {
        char *end;
        long long v = strtoll(wv->valuestring, &end, 10);
        if (*end || v < 1 || v > INT64_MAX / 2) /* the bound of the numeric forms (strtoll saturates) */
            api_bad(e, 400, "field \"weight_version\" = \"%s\": expected a positive integer up to %lld (the "
                    "daemon's versions are numbers)", wv->valuestring, (long long)(INT64_MAX / 2));
        version = v;
    } else if (wv && !cJSON_IsNull(wv)) {
        api_int(root, "weight_version", 1, INT64_MAX / 2, &version, e);
    }
    uint8_t mode = PROTO_MODE_CONTINUE;
    int abort_all = 0;
    u->flush_cache = 1; /* SGLang's default */
    api_bool(root, "flush_cache", &u->flush_cache, e);
    api_bool(root, "keep_pause", &u->keep_pause, e);
    cJSON *lf = cJSON_GetObjectItemCaseSensitive(root, "load_format");
    if (lf && !cJSON_IsNull(lf) && !(cJSON_IsString(lf) && (!strcmp(lf->valuestring, "auto") ||
                                                            !strcmp(lf->valuestring, "safetensors") ||
                                                            !strcmp(lf->valuestring, "gguf"))))
        api_bad(e, 400, "field \"load_format\": expected null, \"auto\", \"safetensors\" or \"gguf\" (the format "
                "is read from the file)");
    api_bool(root, "abort_all_requests", &abort_all, e);
    if (abort_all)
        mode = PROTO_MODE_ABORT;
    cJSON *m = cJSON_GetObjectItemCaseSensitive(root, "mode");
    if (m && !cJSON_IsNull(m)) {
        if (cJSON_IsString(m) && !strcmp(m->valuestring, "continue"))
            mode = PROTO_MODE_CONTINUE;
        else if (cJSON_IsString(m) && !strcmp(m->valuestring, "drain"))
            mode = PROTO_MODE_DRAIN;
        else if (cJSON_IsString(m) && !strcmp(m->valuestring, "abort"))
            mode = PROTO_MODE_ABORT;
        else
            api_bad(e, 400, "field \"mode\": expected \"continue\", \"drain\" or \"abort\"");
    }
    cJSON *sd = cJSON_GetObjectItemCaseSensitive(root, "serve_dtype"); /* rolloutd's (issue 26) */
    if (sd && !cJSON_IsNull(sd)) {
        upd_serve sv;
        if (cJSON_IsString(sd) && !upd_serve_parse(sd->valuestring, &sv))
            u->serve_dtype = (uint8_t)(PROTO_SERVE_AS_PUSHED + sv);
        else
            api_bad(e, 400, "field \"serve_dtype\": expected null (the daemon's serve_dtype), \"as_pushed\", "
                    "\"q8_0\", \"q4_k\" or \"fp8\"");
    }
    u->version = version;
    u->mode = mode;
    return e->status ? -1 : 0;
}

/* ---- the checks before the engine ---- */

/* A sub-request in the protocol's form, which admission checks and turns
 * into the engine request (admit.h), as for an NNG SUBMIT. */
proto_request api_sub_request(const api_call *c, const api_sub *s)
{
    return (proto_request){
        .n = (uint32_t)s->n,
        .max_tokens = (uint32_t)(s->max_tokens > 0 ? s->max_tokens : 1), /* 0 (score only) is the door's; the
                                                                             engine request gets it back */
        .temperature = c->p.temperature,
        .top_p = c->p.top_p,
        .top_k = c->p.top_k,
        .min_p = c->p.min_p,
        .seed = c->p.seed,
        .logprobs_topk = (uint32_t)(c->prompt_lp > c->p.top_n ? c->prompt_lp : c->p.top_n),
        .flags = PROTO_REQ_HAS_SEED | (c->p.ignore_eos ? PROTO_REQ_IGNORE_EOS : 0) |
                 (c->return_routes ? PROTO_REQ_RETURN_ROUTES : 0),
        .n_stop = (uint32_t)c->p.n_stop_ids,
        .stop_ids = c->p.stop_ids,
        .n_prompt = (uint32_t)s->n_prompt,
        .prompt = s->prompt,
    };
}

int api_admit_check(api_call *c, const adm_limits *lim, api_err *e)
{
    if (c->p.top_n > (int32_t)lim->lim->max_logprobs_topk) {
        api_bad(e, 400, "field \"%s\" = %d: expected at most %u alternatives per token", c->top_field, c->p.top_n,
                lim->lim->max_logprobs_topk);
        return -1;
    }
    if (c->prompt_lp > (int32_t)lim->lim->max_logprobs_topk) {
        api_bad(e, 400, "field \"%s\" = %d: expected at most %u alternatives per token",
                c->echo ? "logprobs" : "prompt_logprobs", c->prompt_lp, lim->lim->max_logprobs_topk);
        return -1;
    }
    if (c->prompt_lp >= 0 && c->stream) {
        api_bad(e, 400, "field \"prompt_logprobs\": not with \"stream\" (prompt log-probs come in whole answers)");
        return -1;
    }
    c->n_total = 0;
    for (int i = 0; i < c->n_subs; i++) {
        api_sub *s = &c->subs[i];
        s->n = c->p.n;
        s->max_tokens = c->p.max_tokens;
        if (s->max_tokens < 0) {
            /* Unset: as much as the context leaves, within the daemon's cap
             * (callers set their defaults before admission where the schema has one). */
            int64_t room = (int64_t)lim->lim->max_context - s->n_prompt;
            s->max_tokens = (int32_t)(room < (int64_t)lim->lim->max_tokens ? room : (int64_t)lim->lim->max_tokens);
            if (s->max_tokens < 1)
                s->max_tokens = 1;
        }
        if (s->n_prompt == 0) {
            api_bad(e, 400, "prompt %d is empty (no tokens); expected at least 1", i);
            return -1;
        }
        if (s->max_tokens == 0 && !c->score) {
            api_bad(e, 400, "field \"%s\" = 0: only a request that scores its prompt generates nothing (/generate "
                    "with return_logprob and logprob_start_len >= 0; prompt_logprobs; echo with logprobs)",
                    c->kind == API_GENERATE ? "max_new_tokens" : "max_tokens");
            return -1;
        }
        if (c->score && c->score_from > s->n_prompt) {
            api_bad(e, 400, "field \"logprob_start_len\" = %d: expected at most the prompt's %d tokens", c->score_from,
                    s->n_prompt);
            return -1;
        }
        if (s->max_tokens == 0 && s->n != 1) {
            api_bad(e, 400, "field \"n\" = %d: a request that only scores its prompt has one sample", s->n);
            return -1;
        }
        if (c->p.min_tokens > s->max_tokens) {
            api_bad(e, 400, "field \"%s\" = %d: expected at most the tokens to generate (%d)",
                    c->kind == API_GENERATE ? "min_new_tokens" : "min_tokens", c->p.min_tokens, s->max_tokens);
            return -1;
        }
        for (int32_t j = 0; j < s->n_want; j++)
            if ((uint32_t)s->want_ids[j] >= lim->lim->vocab_size) {
                api_bad(e, 400, "field \"token_ids_logprob\": token id %d is outside the vocabulary 0..%u",
                        s->want_ids[j], lim->lim->vocab_size - 1);
                return -1;
            }
        proto_request pr = api_sub_request(c, s);
        char why[600];
        if (adm_check(lim, &pr, why, sizeof why) ||
            adm_fits_kv(lim, (uint64_t)s->n_prompt, (uint64_t)s->max_tokens, why, sizeof why)) {
            api_bad(e, 400, "prompt %d: %s", i, why);
            return -1;
        }
        c->n_total += s->n;
    }
    return 0;
}
