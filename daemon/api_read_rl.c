/* api_read_rl.c - the request readers of vLLM's and SGLang's RL routes
 * (api_vllm.c, api_sglang.c): query strings and JSON bodies into plain
 * values, with no server and no engine, so tests/fuzz/fuzz_http_json.c runs
 * them as it runs api_read.c's. Each returns 0, or -1 with e set (the first
 * problem found, naming the field or parameter). */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "daemon/api_int.h"
#include "daemon/engine_thread.h"
#include "base/err.h"

static cJSON *field(cJSON *o, const char *name)
{
    cJSON *v = cJSON_GetObjectItemCaseSensitive(o, name);
    return v && !cJSON_IsNull(v) ? v : NULL;
}

static int done(const api_err *e) { return e->status ? -1 : 0; }

/* ---- query strings (FastAPI Query parameters) ---- */

static int hexval(int c)
{
    return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
}

int api_query_get(const char *q, const char *name, char *out, size_t cap)
{
    size_t nl = strlen(name);
    for (const char *p = q; p && *p; p = strchr(p, '&') ? strchr(p, '&') + 1 : NULL) {
        if (strncmp(p, name, nl) || (p[nl] != '=' && p[nl] != '&' && p[nl]))
            continue;
        const char *v = p[nl] == '=' ? p + nl + 1 : p + nl;
        size_t n = 0;
        for (; *v && *v != '&'; v++) {
            int c = (unsigned char)*v;
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

int api_query_bool(const char *q, const char *name, int *out, api_err *e)
{
    char v[16];
    int rc = api_query_get(q, name, v, sizeof v);
    if (rc == 0)
        return 0;
    static const char *yes[] = {"true", "1", "yes", "on", "t", "y"}, *no[] = {"false", "0", "no", "off", "f", "n"};
    for (size_t i = 0; rc > 0 && i < sizeof yes / sizeof yes[0]; i++) {
        if (!strcasecmp(v, yes[i])) {
            *out = 1;
            return 0;
        }
        if (!strcasecmp(v, no[i])) {
            *out = 0;
            return 0;
        }
    }
    api_bad(e, 400, "query parameter \"%s\": expected true or false", name);
    return -1;
}

/* The value of each name=value in a query string, in order, as it stands
 * (not percent-decoded; SGLang's and vLLM's sleep parameters are plain). */
static int query_next(const char **q, char *name, size_t ncap, char *val, size_t vcap)
{
    const char *s = *q;
    if (!s || !*s)
        return 0;
    const char *amp = strchr(s, '&'), *end = amp ? amp : s + strlen(s);
    const char *eq = memchr(s, '=', (size_t)(end - s));
    size_t nl = (size_t)((eq ? eq : end) - s), vl = eq ? (size_t)(end - eq - 1) : 0;
    snprintf(name, ncap, "%.*s", (int)nl, s);
    snprintf(val, vcap, "%.*s", (int)vl, eq ? eq + 1 : "");
    *q = amp ? amp + 1 : end;
    return 1;
}

/* ---- vLLM ---- */

int api_read_vllm_pause(const char *query, api_vllm_pause *p, api_err *e)
{
    char mode[16] = "abort";
    int rc = api_query_get(query, "mode", mode, sizeof mode);
    int wait_old = 0; /* wait_for_inflight_requests: vLLM's older name for mode=wait */
    p->clear = 1;
    api_query_bool(query, "wait_for_inflight_requests", &wait_old, e);
    api_query_bool(query, "clear_cache", &p->clear, e);
    if (rc == 0 && wait_old)
        strcpy(mode, "wait");
    p->mode = !strcmp(mode, "abort") ? "abort" : !strcmp(mode, "wait") ? "wait" : !strcmp(mode, "keep") ? "keep" : NULL;
    if (rc < 0 || !p->mode)
        api_bad(e, 400, "query parameter \"mode\": expected \"abort\", \"wait\" or \"keep\"");
    return done(e);
}

/* reset_running_requests and reset_external are accepted: the flush always
 * covers running requests (their blocks are never served from the cache
 * again), and there is no external cache. */
int api_read_reset_prefix(const char *query, api_err *e)
{
    int x = 0;
    api_query_bool(query, "reset_running_requests", &x, e);
    api_query_bool(query, "reset_external", &x, e);
    return done(e);
}

int api_read_abort_ids(cJSON *root, cJSON **ids, api_err *e)
{
    cJSON *v = field(root, "request_ids");
    *ids = NULL;
    if (v && !cJSON_IsArray(v))
        api_bad(e, 400, "field \"request_ids\": expected a list of strings");
    for (cJSON *x = v ? v->child : NULL; !e->status && x; x = x->next)
        if (!cJSON_IsString(x))
            api_bad(e, 400, "field \"request_ids\": expected a list of strings");
    if (!e->status && v && v->child)
        *ids = v;
    return done(e);
}

int api_read_tokenize(cJSON *root, const tok_tokenizer *tok, api_tokenize_req *t, api_err *e)
{
    t->ids = NULL;
    t->n = 0;
    t->strs = 0;
    api_bool(root, "return_token_strs", &t->strs, e);
    cJSON *prompt = field(root, "prompt"), *msgs = field(root, "messages");
    if (!tok)
        api_bad(e, 400, "this model has no tokenizer");
    else if (prompt && msgs)
        api_bad(e, 400, "fields \"prompt\" and \"messages\": give one, not both");
    if (!e->status && msgs) {
        /* vLLM's defaults for a chat: the assistant's turn opened, the
         * template's own special tokens only. */
        int gen = 1, cont = 0;
        api_bool(root, "add_generation_prompt", &gen, e);
        api_bool(root, "continue_final_message", &cont, e);
        if (!gen || cont)
            api_bad(e, 400, "fields \"add_generation_prompt\" / \"continue_final_message\": only the default "
                    "(the assistant's turn opened after the last message) is rendered");
        if (field(root, "tools") || field(root, "chat_template"))
            api_bad(e, 400, "fields \"tools\" / \"chat_template\": not supported (the model family's chat format "
                    "is rendered)");
        if (!e->status) {
            api_call c;
            memset(&c, 0, sizeof c);
            api_call_init(&c, API_CHAT, tok);
            api_read_messages(&c, root, e);
            if (!e->status && c.n_subs == 1) {
                t->ids = c.subs[0].prompt;
                t->n = (size_t)c.subs[0].n_prompt;
                c.subs[0].prompt = NULL;
            }
            api_call_clear(&c);
        }
    } else if (!e->status && prompt) {
        int special = 1;
        api_bool(root, "add_special_tokens", &special, e);
        const char *s = cJSON_IsString(prompt) ? prompt->valuestring : NULL;
        if (!s)
            api_bad(e, 400, "field \"prompt\": expected a string");
        else if (!e->status && (special ? tok_encode_prompt(tok, s, strlen(s), &t->ids, &t->n)
                                        : tok_encode(tok, s, strlen(s), 1, &t->ids, &t->n)))
            api_bad(e, 400, "field \"prompt\": cannot tokenize: %s", rd_errmsg());
    } else if (!e->status) {
        api_bad(e, 400, "fields \"prompt\" / \"messages\": one is required");
    }
    if (e->status) {
        free(t->ids);
        t->ids = NULL;
        t->n = 0;
    }
    return done(e);
}

int api_read_detokenize(cJSON *root, int has_tok, uint32_t vocab, int32_t **ids, int32_t *n, api_err *e)
{
    cJSON *toks = field(root, "tokens");
    int k = cJSON_IsArray(toks) ? cJSON_GetArraySize(toks) : 0;
    *ids = NULL;
    *n = 0;
    if (!has_tok || vocab == 0) {
        api_bad(e, 400, "this model has no tokenizer");
        return -1;
    }
    if (!cJSON_IsArray(toks)) {
        api_bad(e, 400, "field \"tokens\": expected a list of token ids");
        return -1;
    }
    int32_t *v = malloc(sizeof *v * (size_t)(k > 0 ? k : 1));
    if (!v) {
        api_bad(e, 500, "out of memory");
        return -1;
    }
    int i = 0;
    for (cJSON *x = toks->child; !e->status && x; x = x->next, i++) {
        if (!cJSON_IsNumber(x) || !(x->valuedouble >= 0 && x->valuedouble < (double)vocab) ||
            x->valuedouble != floor(x->valuedouble))
            api_bad(e, 400, "field \"tokens\"[%d]: expected a token id in 0..%u", i, vocab - 1);
        else
            v[i] = (int32_t)x->valuedouble;
    }
    if (e->status) {
        free(v);
        return -1;
    }
    *ids = v;
    *n = k;
    return 0;
}

int api_read_generate_tokens(cJSON *root, api_call *c, api_err *e)
{
    c->top_field = "sampling_params.logprobs";
    cJSON *ids = field(root, "token_ids");
    if (!cJSON_IsArray(ids) || (ids->child && !cJSON_IsNumber(ids->child)))
        api_bad(e, 400, "field \"token_ids\": expected a list of token ids");
    else
        api_read_prompts(c, ids, "token_ids", e);
    cJSON *sp = field(root, "sampling_params");
    if (!cJSON_IsObject(sp))
        api_bad(e, 400, "field \"sampling_params\": required (an object)");
    if (!e->status) {
        /* max_tokens unset: what the context leaves (vLLM's server-side default) */
        api_read_fields(sp, SD_VSP, "sampling_params.", &c->p, e);
        api_read_prompt_logprobs(sp, "prompt_logprobs", c, e);
        int64_t k;
        if (api_int(sp, "logprobs", 0, 1 << 20, &k, e) > 0) {
            c->return_logprob = 1;
            c->p.top_n = (int32_t)k;
        }
    }
    api_bool(root, "stream", &c->stream, e);
    cJSON *so = field(root, "stream_options");
    if (so && cJSON_IsObject(so))
        api_bool(so, "include_usage", &c->include_usage, e);
    else if (so)
        api_bad(e, 400, "field \"stream_options\": expected an object");
    cJSON *rid = field(root, "request_id");
    if (rid && !cJSON_IsString(rid))
        api_bad(e, 400, "field \"request_id\": expected a string");
    else if (rid && !e->status && !(c->rid = strdup(rid->valuestring)))
        api_bad(e, 500, "out of memory");
    int64_t prio = 0;
    if (api_int(root, "priority", INT32_MIN, INT32_MAX, &prio, e) > 0 && prio != 0)
        api_bad(e, 400, "field \"priority\": only 0 (this engine has no priority scheduling)");
    if (field(root, "features"))
        api_bad(e, 400, "field \"features\": multimodal inputs are not supported");
    if (field(root, "kv_transfer_params"))
        api_bad(e, 400, "field \"kv_transfer_params\": disaggregated serving is not supported");
    return done(e);
}

/* A weight_version (a positive integer or its decimal string) in o, if any. */
static void read_version(cJSON *o, int64_t *version, api_err *e)
{
    cJSON *v = field(o, "weight_version");
    if (v && cJSON_IsString(v)) {
        char *end;
        long long x = strtoll(v->valuestring, &end, 10);
        if (*end || x < 1 || x > INT64_MAX / 2 || end == v->valuestring)
            api_bad(e, 400, "field \"weight_version\" = \"%.60s\": expected an integer in 1..%lld (the daemon's "
                    "versions are numbers)", v->valuestring, (long long)(INT64_MAX / 2));
        else
            *version = x;
    } else if (v) {
        api_int(o, "weight_version", 1, INT64_MAX / 2, version, e);
    }
}

int api_read_vllm_update(cJSON *root, uint64_t serving, api_vllm_update *u, api_err *e)
{
    cJSON *info = field(root, "update_info"), *dir = field(root, "weight_dir"), *path = NULL;
    u->path = NULL;
    u->prime = 0;
    u->version = serving < (uint64_t)(INT64_MAX / 2) ? (int64_t)serving + 1 : INT64_MAX / 2;
    if (info && !cJSON_IsObject(info))
        api_bad(e, 400, "field \"update_info\": expected an object");
    else if (info && (path = field(info, "path")))
        ;
    else if (info && (field(info, "names") || field(info, "ipc_handles") || field(info, "shapes")))
        api_bad(e, 501, "field \"update_info\": tensors sent by NCCL or CUDA IPC: " API_NO_COLLECTIVES);
    else if (dir)
        path = dir, u->prime = 1;
    if (!e->status && (!path || !cJSON_IsString(path) || !path->valuestring[0]))
        api_bad(e, 400, "expected {\"update_info\": {\"path\": DIR}} (vLLM's disk backend) or {\"weight_dir\": DIR} "
                "(prime-rl): DIR an HF folder of safetensors (a .gguf or .safetensors file also works)");
    read_version(root, &u->version, e);
    if (info && cJSON_IsObject(info))
        read_version(info, &u->version, e);
    if (!e->status && strlen(path->valuestring) >= CFG_STR)
        api_bad(e, 400, "field \"path\": longer than %d bytes", CFG_STR - 1);
    if (!e->status)
        u->path = path->valuestring;
    return done(e);
}

int api_read_init_transfer(cJSON *root, api_err *e)
{
    cJSON *info = cJSON_GetObjectItemCaseSensitive(root, "init_info");
    if (!info)
        api_bad(e, 400, "Missing 'init_info' in request body");
    else if (!(cJSON_IsObject(info) && !info->child))
        api_bad(e, 501, "init_info: %s", API_NO_COLLECTIVES);
    return done(e);
}

/* ---- SGLang, and vLLM's sleep ---- */

int api_read_mem_tags(cJSON *root, int *tags, api_err *e)
{
    cJSON *t = root ? cJSON_GetObjectItemCaseSensitive(root, "tags") : NULL;
    *tags = ET_MEM_WEIGHTS | ET_MEM_KV;
    if (!t || cJSON_IsNull(t))
        return 0;
    if (!cJSON_IsArray(t)) {
        api_bad(e, 400, "field \"tags\": expected a list of \"weights\", \"kv_cache\" (or null for both)");
        return -1;
    }
    *tags = 0;
    int i = 0;
    for (cJSON *x = t->child; x; x = x->next, i++) {
        if (cJSON_IsString(x) && !strcmp(x->valuestring, "weights"))
            *tags |= ET_MEM_WEIGHTS;
        else if (cJSON_IsString(x) && !strcmp(x->valuestring, "kv_cache"))
            *tags |= ET_MEM_KV;
        else if (cJSON_IsString(x) && !strcmp(x->valuestring, "cuda_graph"))
            ; /* captured graphs go with the KV buffers; nothing of their own to free */
        else {
            api_bad(e, 400, "field \"tags\"[%d]: expected \"weights\", \"kv_cache\" or \"cuda_graph\"", i);
            return -1;
        }
    }
    return 0;
}

int api_read_sleep(const char *query, int *abort_first, api_err *e)
{
    char name[32], val[64];
    *abort_first = 0;
    for (const char *q = query; query_next(&q, name, sizeof name, val, sizeof val);) {
        if (!strcmp(name, "level")) {
            if (strcmp(val, "1") && strcmp(val, "2"))
                api_bad(e, 400, "query \"level\" = \"%s\": expected 1 or 2", val);
        } else if (!strcmp(name, "mode")) {
            if (!strcmp(val, "abort"))
                *abort_first = 1;
            else if (strcmp(val, "wait"))
                api_bad(e, 400, "query \"mode\" = \"%s\": expected \"abort\" or \"wait\"", val);
        }
    }
    return done(e);
}

int api_read_wake_up(const char *query, int *tags, api_err *e)
{
    char name[32], val[64];
    *tags = 0;
    for (const char *q = query; query_next(&q, name, sizeof name, val, sizeof val);) {
        if (strcmp(name, "tags"))
            continue;
        if (!strcmp(val, "weights"))
            *tags |= ET_MEM_WEIGHTS;
        else if (!strcmp(val, "kv_cache"))
            *tags |= ET_MEM_KV;
        else
            api_bad(e, 400, "query \"tags\" = \"%s\": expected \"weights\" or \"kv_cache\"", val);
    }
    if (!*tags)
        *tags = ET_MEM_KV | ET_MEM_WEIGHTS;
    return done(e);
}
