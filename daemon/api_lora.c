/* api_lora.c - LoRA adapters over HTTP, in the shapes vLLM's and SGLang's
 * clients read:
 *
 *   POST /v1/load_lora_adapter    {"lora_name", "lora_path", "load_inplace"}  vLLM: 200 and the text
 *                                 "Success: LoRA adapter '<name>' added successfully."; errors in
 *                                 OpenAI's shape (400; 404 for an unknown name on unload)
 *   POST /v1/unload_lora_adapter  {"lora_name"}  "Success: LoRA adapter '<name>' removed successfully."
 *   POST /load_lora_adapter       {"lora_name", "lora_path"}  SGLang (AReaL, and prime-rl's
 *                                 route name): {"success", "error_message", "loaded_adapters": {name: path}};
 *                                 "pinned": true is refused by name
 *   POST /unload_lora_adapter     {"lora_name"}  the same shape
 *
 * lora_path is a PEFT folder on the daemon's machine (engine/model/lora.h
 * says what is served and what is refused). The folder is read and the
 * adapter copied to the backend on the engine thread between steps
 * (et_lora); the answer comes when it is resident. A name already loaded is
 * refused unless load_inplace (vLLM's replace: requests admitted from then
 * on get the new one, running ones finish on the old); each load of a name
 * gets the next version of that name (1, 2, ...), which results and /status
 * show. A full set evicts the least recently used idle adapter; an adapter
 * that requests use is never evicted nor unloaded (400 naming why).
 *
 * Requests name an adapter as "model" on the /v1 routes and /inference/v1/generate
 * (api_check_model), or as /generate's "lora_path" (a name, or one per
 * prompt; api_read.c), checked against the table at admission. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/api_int.h"
#include "daemon/log.h"
#include "base/err.h"

/* A load or unload waiting for the engine thread. */
struct api_lora_op {
    struct api_lora_op *next;
    uint64_t key;
    http_res *h;                /* NULL once the client left */
    int op;                     /* ET_LORA_LOAD / ET_LORA_UNLOAD */
    int vllm;                   /* answer vLLM's way (text; OpenAI-shaped errors) */
    char name[LORA_NAME_MAX];
    char *path;
    uint64_t version;
};

static void answer_error(const struct api_lora_op *o, http_res *h, int status, const char *msg)
{
    api_err e = {0};
    api_bad(&e, status, "%s", msg);
    if (o->vllm) {
        api_answer_error_v1(h, &e);
        return;
    }
    cJSON *doc = cJSON_CreateObject();
    cJSON_AddBoolToObject(doc, "success", 0);
    cJSON_AddStringToObject(doc, "error_message", msg);
    api_answer_json(h, status, doc);
}

static void answer_ok(api *a, const struct api_lora_op *o, http_res *h)
{
    if (o->vllm) {
        char text[300];
        int n = snprintf(text, sizeof text, "Success: LoRA adapter '%s' %s successfully.", o->name,
                         o->op == ET_LORA_LOAD ? "added" : "removed");
        http_respond(h, 200, "text/plain; charset=utf-8", text, (size_t)n);
        return;
    }
    cJSON *doc = cJSON_CreateObject();
    cJSON_AddBoolToObject(doc, "success", 1);
    cJSON_AddStringToObject(doc, "error_message", "");
    cJSON *ad = cJSON_AddObjectToObject(doc, "loaded_adapters");
    const lr_table *t = &a->d->loras;
    for (int32_t i = 0; i < t->n; i++)
        cJSON_AddStringToObject(ad, t->e[i].name, t->e[i].path ? t->e[i].path : "");
    api_answer_json(h, 200, doc);
}

static void on_close(http_res *h, void *ud)
{
    api *a = ud;
    for (struct api_lora_op *o = a->lora_ops; o; o = o->next)
        if (o->h == h) {
            o->h = NULL;
            http_release(h);
        }
}

static void start(api *a, http_res *h, const http_req *req, int op, int vllm)
{
    rd_daemon *d = a->d;
    struct api_lora_op probe = {.op = op, .vllm = vllm};
    api_err e = {0};
    cJSON *root = api_parse_body(req, &e);
    if (!root) {
        answer_error(&probe, h, e.status, e.detail);
        return;
    }
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(root, "lora_name");
    const cJSON *path = cJSON_GetObjectItemCaseSensitive(root, "lora_path");
    int inplace = 0, pinned = 0;
    api_bool(root, "load_inplace", &inplace, &e);
    api_bool(root, "pinned", &pinned, &e);
    if (!e.status && pinned)
        /* SGLang's pinned keeps an adapter out of eviction; here only use does (refused, not ignored) */
        api_bad(&e, 400, "field \"pinned\": pinned adapters are not supported (an adapter that requests use is "
                "never evicted; unload others or raise max_loras)");
    if (!e.status && (!cJSON_IsString(name) || !name->valuestring[0] ||
                      strlen(name->valuestring) >= LORA_NAME_MAX))
        api_bad(&e, 400, "field \"lora_name\": expected the adapter's name, 1 to %d bytes", LORA_NAME_MAX - 1);
    else if (!e.status && op == ET_LORA_LOAD && (!cJSON_IsString(path) || !path->valuestring[0]))
        api_bad(&e, 400, "field \"lora_path\": expected the PEFT adapter's folder (adapter_config.json and "
                "adapter_model.safetensors) on the daemon's machine");
    else if (!e.status && d->cfg.max_loras == 0)
        api_bad(&e, 400, "LoRA adapters are not served: the daemon runs with max_loras 0");
    else if (!e.status && !strcmp(name->valuestring, d->model_name))
        api_bad(&e, 400, "field \"lora_name\": '%s' is the base model's name", name->valuestring);
    const lr_entry *known = e.status ? NULL : lr_find(&d->loras, name->valuestring);
    if (!e.status && op == ET_LORA_LOAD && known && !inplace)
        /* vLLM's words (serving_models.py) */
        api_bad(&e, 400, "The lora adapter '%s' has already been loaded. If you want to load the adapter in place, "
                "set 'load_inplace' to True.", name->valuestring);
    if (!e.status && op == ET_LORA_UNLOAD && !known)
        api_bad(&e, 404, "The lora adapter '%s' cannot be found.", name->valuestring);
    struct api_lora_op *o = e.status ? NULL : calloc(1, sizeof *o);
    if (!e.status && (!o || (op == ET_LORA_LOAD && !(o->path = strdup(path->valuestring))))) {
        api_bad(&e, 500, "out of memory");
        if (o)
            free(o);
        o = NULL;
    }
    if (o) {
        o->key = API_KEY_BIT | ++a->next_key;
        o->h = h;
        o->op = op;
        o->vllm = vllm;
        o->version = known ? known->version + 1 : 1;
        snprintf(o->name, sizeof o->name, "%s", name->valuestring);
        if (et_lora(&d->et, o->key, op, o->name, o->path, o->version, inplace)) {
            api_bad(&e, 500, "%s", rd_errmsg());
            free(o->path);
            free(o);
            o = NULL;
        }
    }
    cJSON_Delete(root);
    if (e.status) {
        answer_error(&probe, h, e.status, e.detail);
        return;
    }
    o->next = a->lora_ops;
    a->lora_ops = o;
    http_on_close(h, on_close, a);
    log_line("HTTP LoRA %s '%s'%s%s", op == ET_LORA_LOAD ? "load" : "unload", o->name, o->path ? " from " : "",
             o->path ? o->path : "");
}

void api_on_lora(api *a, uint64_t key, int rc, const char *msg, int32_t rank, int64_t bytes, const char *evicted)
{
    rd_daemon *d = a->d;
    for (struct api_lora_op **po = &a->lora_ops; *po; po = &(*po)->next) {
        struct api_lora_op *o = *po;
        if (o->key != key)
            continue;
        *po = o->next;
        if (!rc && evicted && evicted[0]) {
            lr_remove(&d->loras, evicted);
            log_line("LoRA adapter '%s' evicted (least recently used) for '%s'", evicted, o->name);
        }
        if (!rc && o->op == ET_LORA_LOAD)
            rc = lr_put(&d->loras, o->name, o->path, o->version, rank, bytes);
        else if (!rc)
            lr_remove(&d->loras, o->name);
        if (rc)
            log_line("HTTP LoRA %s '%s' failed: %s", o->op == ET_LORA_LOAD ? "load" : "unload", o->name, msg);
        if (o->h) {
            if (rc)
                answer_error(o, o->h, rc == RD_ENOENT && o->op == ET_LORA_UNLOAD ? 404 : rc == RD_ENOMEM ? 500 : 400,
                             msg);
            else
                answer_ok(a, o, o->h);
        }
        free(o->path);
        free(o);
        return;
    }
}

static void route_load_vllm(http_res *h, const http_req *req, void *ud) { start(ud, h, req, ET_LORA_LOAD, 1); }
static void route_unload_vllm(http_res *h, const http_req *req, void *ud) { start(ud, h, req, ET_LORA_UNLOAD, 1); }
static void route_load_sgl(http_res *h, const http_req *req, void *ud) { start(ud, h, req, ET_LORA_LOAD, 0); }
static void route_unload_sgl(http_res *h, const http_req *req, void *ud) { start(ud, h, req, ET_LORA_UNLOAD, 0); }

int api_lora_routes(api *a, http_route *t)
{
    const http_route r[] = {
        {"POST", "/v1/load_lora_adapter", route_load_vllm, a, 0},
        {"POST", "/v1/unload_lora_adapter", route_unload_vllm, a, 0},
        {"POST", "/load_lora_adapter", route_load_sgl, a, 0},
        {"POST", "/unload_lora_adapter", route_unload_sgl, a, 0},
    };
    int n = (int)(sizeof r / sizeof r[0]);
    for (int i = 0; i < n; i++)
        t[i] = r[i];
    return n;
}

void api_lora_free(api *a)
{
    while (a->lora_ops) {
        struct api_lora_op *o = a->lora_ops;
        a->lora_ops = o->next;
        if (o->h)
            http_release(o->h);
        free(o->path);
        free(o);
    }
}

int api_lora_check(const api *a, const char *name, api_err *e)
{
    if (!name || !name[0] || lr_find(&a->d->loras, name))
        return 0;
    api_bad(e, 400, "LoRA adapter '%.200s' is not loaded (load it with /load_lora_adapter or "
            "/v1/load_lora_adapter; GET /v1/models lists the loaded ones)", name);
    return -1;
}
