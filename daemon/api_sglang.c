/* api_sglang.c - the control routes RL frameworks call on an SGLang server
 * (slime, AReaL, ROLL), and vLLM's sleep mode on the same mechanism:
 *
 *   GET  /flush_cache                 (POST is in api.c's table; both api_call.c's; slime sends GET)
 *   GET  /get_server_info, /server_info  the server-args fields they read
 *   GET  /get_weight_version          {"weight_version": "<n>"}
 *   POST /release_memory_occupation   {"tags": ["weights", "kv_cache"] | null}
 *   POST /resume_memory_occupation    the same
 *   POST /sleep?level=1&mode=abort    vLLM: release everything (empty 200)
 *   POST /wake_up?tags=weights&tags=kv_cache  vLLM: resume those (none = all)
 *   GET  /is_sleeping                 {"is_sleeping": bool}
 *   GET  /v1/loads?include=&format=   {timestamp, version, ..., loads: [rank 0's load]} (slime polls it
 *                                     until a server is idle), or Prometheus text with format=prometheus
 *   GET  /get_load                    SGLang's older [{dp_rank, num_reqs, num_waiting_reqs, num_tokens}]
 *   POST /update_weights_from_tensor, /update_weights_from_distributed, /init_weights_update_group,
 *        /destroy_weights_update_group  501 naming what rolloutd takes instead (CUDA IPC handles and
 *                                     NCCL groups are not here), in SGLang's {"success": false, "message"}
 *
 * Memory release really frees: the KV pool and the runner's KV buffers
 * (eng_release_kv), and the weights (model_drop_weights), which a resume
 * reads back from their last source: the model file the daemon started on,
 * or the file of the last /update_weights_from_disk. Weights an NNG push
 * brought have no file, so releasing them is refused (the KV cache can still
 * go). As in SGLang a release is refused while requests run or wait; while
 * released, generation calls are refused with 503. The work happens on the
 * engine thread between steps (et_memory); the answer comes when it is done. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "daemon/api_int.h"
#include "daemon/log.h"
#include "base/err.h"
#include "engine/model/model.h"

/* A release or resume waiting for the engine thread. */
struct api_mem {
    struct api_mem *next;
    uint64_t key;
    http_res *h;                /* NULL once the client left */
    int op, tags;
    int vllm;                   /* answer vLLM's way: an empty 200 body */
};

static void ver_str(uint64_t v, char *out, size_t cap) { snprintf(out, cap, "%llu", (unsigned long long)v); }

/* ---- server info ---- */

static void route_server_info(http_res *h, const http_req *req, void *ud)
{
    api *a = ud;
    rd_daemon *d = a->d;
    const eng_stats *st = &d->stats;
    cJSON *o = cJSON_CreateObject();
    char ver[32];
    ver_str(d->weight_version, ver, sizeof ver);
    /* Server args, SGLang's names. */
    cJSON_AddStringToObject(o, "model_path", d->cfg.model);
    cJSON_AddStringToObject(o, "tokenizer_path", d->cfg.model); /* the GGUF file holds the tokenizer */
    cJSON_AddStringToObject(o, "served_model_name", d->model_name);
    cJSON_AddStringToObject(o, "weights_source", a->src_ok ? a->src_path : "");
    cJSON_AddNumberToObject(o, "context_length", d->lim.max_context);
    cJSON_AddNumberToObject(o, "page_size", (double)d->cfg.block_size);
    cJSON_AddNumberToObject(o, "max_running_requests", (double)d->cfg.max_num_seqs);
    cJSON_AddNumberToObject(o, "chunked_prefill_size", (double)d->cfg.max_batch_tokens);
    cJSON_AddNumberToObject(o, "max_prefill_tokens", (double)d->cfg.max_batch_tokens);
    cJSON_AddNumberToObject(o, "tp_size", 1);
    cJSON_AddNumberToObject(o, "dp_size", 1);
    cJSON_AddNumberToObject(o, "pp_size", 1);
    cJSON_AddNumberToObject(o, "ep_size", 1);
    cJSON_AddNumberToObject(o, "nnodes", 1);
    cJSON_AddNumberToObject(o, "node_rank", 0);
    cJSON_AddNumberToObject(o, "num_gpus", !strcmp(d->cfg.backend, "cuda") ? 1 : 0);
    /* What slime's external-engine check compares with what it would launch. */
    cJSON_AddBoolToObject(o, "enable_memory_saver", 1);  /* release/resume work */
    cJSON_AddBoolToObject(o, "enable_return_routed_experts", (d->lim.features & PROTO_FEATURE_ROUTES) != 0);
    cJSON_AddStringToObject(o, "dtype", "auto");
    cJSON_AddStringToObject(o, "kv_cache_dtype", d->cfg.kv_dtype);
    cJSON_AddStringToObject(o, "disaggregation_mode", "null");
    cJSON_AddBoolToObject(o, "encoder_only", 0);
    cJSON_AddBoolToObject(o, "skip_tokenizer_init", d->L.tok == NULL);
    cJSON_AddBoolToObject(o, "enable_metrics", 1);
    cJSON_AddBoolToObject(o, "disable_radix_cache", d->cfg.prefix_cache == 0);
    cJSON_AddBoolToObject(o, "enable_lora", d->cfg.max_loras > 0);
    cJSON_AddNumberToObject(o, "max_loras_per_batch", (double)d->cfg.max_loras);
    cJSON_AddNumberToObject(o, "max_lora_rank", (double)d->cfg.max_lora_rank);
    cJSON_AddStringToObject(o, "device", d->cfg.backend);
    /* Scheduler info. */
    int64_t tokens = (int64_t)d->kv_blocks_total * d->cfg.block_size;
    cJSON_AddNumberToObject(o, "max_total_num_tokens", (double)tokens);
    cJSON_AddNumberToObject(o, "max_req_input_len", d->lim.max_context > 0 ? d->lim.max_context - 1 : 0);
    cJSON_AddStringToObject(o, "weight_version", ver);
    cJSON_AddBoolToObject(o, "memory_released_weights", (a->mem_released & ET_MEM_WEIGHTS) != 0);
    cJSON_AddBoolToObject(o, "memory_released_kv_cache", (a->mem_released & ET_MEM_KV) != 0);
    cJSON_AddStringToObject(o, "version", RD_SERVER_NAME);
    cJSON *is = cJSON_AddArrayToObject(o, "internal_states");
    cJSON *s0 = cJSON_CreateObject();
    cJSON_AddNumberToObject(s0, "max_total_num_tokens", (double)tokens);
    cJSON_AddNumberToObject(s0, "num_running_reqs", st->running);
    cJSON_AddNumberToObject(s0, "num_waiting_reqs", st->waiting);
    cJSON_AddNumberToObject(s0, "kv_blocks_used", st->kv_blocks_used);
    cJSON_AddItemToArray(is, s0);
    api_answer_json(h, 200, o);
}

static void route_weight_version(http_res *h, const http_req *req, void *ud)
{
    api *a = ud;
    char ver[32];
    ver_str(a->d->weight_version, ver, sizeof ver);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "weight_version", ver);
    api_answer_json(h, 200, o);
}

/* ---- memory release ---- */

void api_note_weights_source(api *a, const char *path, uint64_t version)
{
    char *p = path ? strdup(path) : NULL;
    if (path && !p)
        return; /* out of memory: the old source stays, and the version check refuses */
    free(a->src_path);
    a->src_path = p;
    a->src_version = version;
    a->src_ok = p != NULL;
}

static void on_mem_close(http_res *h, void *ud)
{
    api *a = ud;
    for (struct api_mem *m = a->mems; m; m = m->next)
        if (m->h == h) {
            m->h = NULL;
            http_release(h);
        }
}

/* The serving weights can be read back from a file on resume: the file they
 * came from, served as it holds them (a push quantized at COMMIT, serve_dtype
 * q8_0, is not what the file gives back). */
static int weights_from_file(const api *a)
{
    const rd_daemon *d = a->d;
    return a->src_ok && a->src_version == d->weight_version &&
           sh_code(&d->serve, d->weight_version) == PROTO_SERVE_AS_PUSHED;
}

/* Queues a release or resume of tags; answers at once when there is nothing
 * to do or it is refused. */
static void mem_start(api *a, http_res *h, int op, int tags, int vllm, int check_busy)
{
    rd_daemon *d = a->d;
    api_err e = {0};
    if (op == ET_MEM_RELEASE) {
        tags &= ~a->mem_released; /* what is already released stays so */
        if ((tags & ET_MEM_WEIGHTS) && !weights_from_file(a))
            api_bad(&e, 400, "cannot release the weights: the serving version %llu came over an NNG push or was "
                    "quantized at COMMIT (serve_dtype %s), so there is no file to read them back from on resume "
                    "(release \"kv_cache\" only, or load a file with /update_weights_from_disk first)",
                    (unsigned long long)d->weight_version, sh_name(sh_code(&d->serve, d->weight_version)));
        else if (tags && check_busy && (a->inflight > 0 || d->clients.unfinished > 0))
            api_bad(&e, 400, "cannot release memory while requests run or wait (%lld HTTP, %llu NNG): SGLang's "
                    "rule; abort them (/abort_request, /pause_generation) or let them finish first",
                    (long long)a->inflight, (unsigned long long)d->clients.unfinished);
    } else {
        tags &= a->mem_released;
    }
    if (!e.status && !tags) {
        if (vllm)
            http_respond(h, 200, "application/json", "", 0);
        else {
            cJSON *o = cJSON_CreateObject();
            cJSON_AddBoolToObject(o, "success", 1);
            cJSON_AddStringToObject(o, "message", "nothing to do");
            api_answer_json(h, 200, o);
        }
        return;
    }
    struct api_mem *m = e.status ? NULL : calloc(1, sizeof *m);
    if (!e.status && !m)
        api_bad(&e, 500, "out of memory");
    if (!e.status) {
        m->key = API_KEY_BIT | ++a->next_key;
        m->h = h;
        m->op = op;
        m->tags = tags;
        m->vllm = vllm;
        const char *path = a->src_path ? a->src_path : d->cfg.model;
        if (et_memory(&d->et, m->key, op, tags, &d->L, path, !strcmp(path, d->cfg.model))) {
            free(m);
            api_bad(&e, 500, "%s", rd_errmsg());
        }
    }
    if (e.status) {
        api_answer_error(h, &e);
        return;
    }
    m->next = a->mems;
    a->mems = m;
    http_on_close(h, on_mem_close, a);
    log_line("HTTP %s memory:%s%s", op == ET_MEM_RELEASE ? "release" : "resume",
             tags & ET_MEM_WEIGHTS ? " weights" : "", tags & ET_MEM_KV ? " kv_cache" : "");
}

void api_on_memory(api *a, uint64_t key, int rc, const char *msg)
{
    for (struct api_mem **pm = &a->mems; *pm; pm = &(*pm)->next) {
        struct api_mem *m = *pm;
        if (m->key != key)
            continue;
        *pm = m->next;
        if (!rc) {
            if (m->op == ET_MEM_RELEASE)
                a->mem_released |= m->tags;
            else
                a->mem_released &= ~m->tags;
        } else if (m->op == ET_MEM_RESUME && (m->tags & ET_MEM_WEIGHTS)) {
            log_line("HTTP resume memory failed: %s", msg);
        }
        if (m->h) {
            if (rc) {
                api_err e = {0};
                api_bad(&e, rc == RD_EBUSY ? 400 : 500, "%s", msg);
                api_answer_error(m->h, &e);
            } else if (m->vllm) {
                http_respond(m->h, 200, "application/json", "", 0);
            } else {
                cJSON *o = cJSON_CreateObject();
                cJSON_AddBoolToObject(o, "success", 1);
                cJSON_AddStringToObject(o, "message", m->op == ET_MEM_RELEASE ? "memory released" : "memory resumed");
                api_answer_json(m->h, 200, o);
            }
        }
        free(m);
        return;
    }
}

static void route_release(http_res *h, const http_req *req, void *ud)
{
    api *a = ud;
    api_err e = {0};
    cJSON *root = req->body_len ? api_parse_body(req, &e) : NULL;
    int tags = 0;
    if (!e.status)
        api_read_mem_tags(root, &tags, &e);
    cJSON_Delete(root);
    if (e.status) {
        api_answer_error(h, &e);
        return;
    }
    mem_start(a, h, !strcmp(req->path, "/release_memory_occupation") ? ET_MEM_RELEASE : ET_MEM_RESUME, tags, 0, 1);
}

/* vLLM's POST /sleep?level=1|2&mode=abort|wait: level 1 and 2 both free the
 * weights and the KV cache here (there is no host copy to offload to; a
 * wake-up reads the weights back from their file). mode=abort first aborts
 * what runs (partial results go back to their callers); without it a sleep
 * is refused while requests run. */
static void route_sleep(http_res *h, const http_req *req, void *ud)
{
    api *a = ud;
    api_err e = {0};
    int abort_first;
    api_read_sleep(req->query, &abort_first, &e);
    if (e.status) {
        api_answer_error(h, &e);
        return;
    }
    /* Weights an NNG push brought stay (no file to read them back from); the KV cache goes. */
    int tags = ET_MEM_KV | ET_MEM_WEIGHTS;
    if (!weights_from_file(a))
        tags = ET_MEM_KV;
    if (abort_first) {
        /* The aborts reach the engine thread before the release does (one
         * queue), so the engine is idle by then; the HTTP counts catch up
         * when the partial results come back. */
        api_abort_all(a);
        mem_start(a, h, ET_MEM_RELEASE, tags, 1, 0); /* the engine thread checks it is idle */
        return;
    }
    mem_start(a, h, ET_MEM_RELEASE, tags, 1, 1);
}

static void route_wake_up(http_res *h, const http_req *req, void *ud)
{
    api *a = ud;
    api_err e = {0};
    int tags;
    api_read_wake_up(req->query, &tags, &e);
    if (e.status) {
        api_answer_error(h, &e);
        return;
    }
    mem_start(a, h, ET_MEM_RESUME, tags, 1, 1);
}

static void route_is_sleeping(http_res *h, const http_req *req, void *ud)
{
    api *a = ud;
    cJSON *o = cJSON_CreateObject();
    cJSON_AddBoolToObject(o, "is_sleeping", a->mem_released != 0);
    api_answer_json(h, 200, o);
}

/* ---- loads ---- */

static double unix_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void answer_text(http_res *h, char *doc, const char *ctype)
{
    if (!doc) {
        http_respond_error(h, 500, "internal error", "out of memory building the load report");
        return;
    }
    http_respond(h, 200, ctype, doc, strlen(doc));
    free(doc);
}

static void route_loads(http_res *h, const http_req *req, void *ud)
{
    api *a = ud;
    api_err e = {0};
    api_loads_req q;
    if (api_read_loads(req->query, &q, &e)) {
        api_answer_error(h, &e);
        return;
    }
    mx_snapshot s;
    snapshot_take(a->d, &s);
    if (q.prometheus)
        answer_text(h, mx_loads_prometheus(&s, q.sections, unix_now()), "text/plain; version=0.0.4; charset=utf-8");
    else
        answer_text(h, mx_loads_json(&s, q.sections, unix_now()), "application/json");
}

static void route_get_load(http_res *h, const http_req *req, void *ud)
{
    api *a = ud;
    mx_snapshot s;
    snapshot_take(a->d, &s);
    answer_text(h, mx_get_load_json(&s, unix_now()), "application/json");
}

/* ---- weight transfers rolloutd does not take ---- */

/* SGLang's tensor (CUDA IPC handles) and distributed (an NCCL group the trainer joins) updates: 501 in
 * SGLang's answer shape, so a client reading "success" sees the failure and one reading "detail" the
 * ways rolloutd takes weights (API_NO_COLLECTIVES, and SGLang's own disk route). */
static void route_no_collectives(http_res *h, const http_req *req, void *ud)
{
    char msg[900];
    snprintf(msg, sizeof msg, "%s: weights sent as CUDA IPC handles or over an NCCL group: " API_NO_COLLECTIVES
             " (or SGLang's POST /update_weights_from_disk {\"model_path\": DIR})", req->path);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddBoolToObject(o, "success", 0);
    cJSON_AddStringToObject(o, "message", msg);
    cJSON_AddStringToObject(o, "error", "not implemented");
    cJSON_AddStringToObject(o, "detail", msg);
    api_answer_json(h, 501, o);
}

int api_sglang_routes(api *a, http_route *t)
{
    const http_route r[] = {
        {"GET", "/flush_cache", api_route_flush_cache, a, 0},
        {"GET", "/get_server_info", route_server_info, a, 0},
        {"GET", "/server_info", route_server_info, a, 0},
        {"GET", "/get_weight_version", route_weight_version, a, 0},
        {"POST", "/release_memory_occupation", route_release, a, 0},
        {"POST", "/resume_memory_occupation", route_release, a, 0},
        {"POST", "/sleep", route_sleep, a, 0},
        {"POST", "/wake_up", route_wake_up, a, 0},
        {"GET", "/is_sleeping", route_is_sleeping, a, 0},
        {"GET", "/v1/loads", route_loads, a, 0},
        {"GET", "/get_load", route_get_load, a, 0},
        {"POST", "/update_weights_from_tensor", route_no_collectives, a, 0},
        {"POST", "/update_weights_from_distributed", route_no_collectives, a, 0},
        {"POST", "/init_weights_update_group", route_no_collectives, a, 0},
        {"POST", "/destroy_weights_update_group", route_no_collectives, a, 0},
    };
    int n = (int)(sizeof r / sizeof r[0]);
    for (int i = 0; i < n; i++)
        t[i] = r[i];
    return n;
}

void api_sglang_free(api *a)
{
    while (a->mems) {
        struct api_mem *m = a->mems;
        a->mems = m->next;
        if (m->h)
            http_release(m->h);
        free(m);
    }
    free(a->src_path);
    a->src_path = NULL;
}
