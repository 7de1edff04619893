/* api_update.c - POST /update_weights_from_disk (SGLang's route).
 *
 * The daemon pushes the file to itself over its own learner socket, with the
 * same client code rolloutctl push-weights uses (rdp_source_open, rdp_push),
 * so the update goes through exactly the staging, checksums, checks and
 * step-boundary swap of an NNG push (update/transfer.c), and a bad file leaves the old
 * weights serving. The reading and pushing run on a libuv worker thread; the
 * loop thread keeps serving (it is the push's server). The answer comes when
 * the new version is serving, or says why not. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/api_int.h"
#include "daemon/log.h"
#include "base/err.h"
#include "client/rd_push.h"

typedef struct {
    uv_work_t w;
    http_res *h;                /* NULL once the client left or the daemon is exiting */
    rd_daemon *d;
    char path[CFG_STR];
    char url[CFG_STR + 16];     /* the daemon's own learner socket, dialled on loopback */
    uint64_t version;
    uint8_t mode;               /* PROTO_MODE_* */
    uint8_t serve_dtype;        /* PROTO_SERVE_* (0: the daemon's config) */
    int rc;
    char error[600];
    uint32_t n_aborted;
    void (*answer)(http_res *h, const api_update_result *r);
    int flush_cache;            /* SGLang's flush_cache (default true): drop the prefix cache once it serves */
    int keep_pause;             /* SGLang's keep_pause: stay paused (in place) after the update */
} upd_job;

static void upd_work(uv_work_t *w)
{
    upd_job *j = w->data;
    rdp_source src;
    if ((j->rc = rdp_source_open(j->path, &src))) {
        snprintf(j->error, sizeof j->error, "model_path: %s", rd_errmsg());
        return;
    }
    rdp_options o = {.version = j->version, .mode = j->mode, .serve_dtype = j->serve_dtype, .window = 4,
                     .chunk_bytes = 16u << 20,
                     .client_name = "update_weights_from_disk", .secret = j->d->secret.len ? j->d->secret.bytes : NULL,
                     .secret_len = j->d->secret.len};
    rdp_target t = {.url = j->url};
    j->rc = rdp_push(&t, 1, src.ts, src.n, &o);
    if (j->rc)
        snprintf(j->error, sizeof j->error, "%s", t.error);
    j->n_aborted = t.commit.n_aborted;
    rdp_source_close(&src);
}

/* SGLang's answer to /update_weights_from_disk. */
static void answer_sglang(http_res *h, const api_update_result *r)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddBoolToObject(o, "success", r->rc == 0);
    char ver[32];
    snprintf(ver, sizeof ver, "%llu", (unsigned long long)r->version);
    cJSON_AddStringToObject(o, "message", r->rc ? r->error : "weights updated");
    cJSON_AddStringToObject(o, "weight_version", ver);
    cJSON_AddNumberToObject(o, "num_aborted_samples", r->n_aborted);
    api_answer_json(h, r->rc ? 400 : 200, o);
}

static void upd_done(uv_work_t *w, int status)
{
    upd_job *j = w->data;
    api *a = j->d->api;
    if (j->rc == 0 && a) {
        /* A memory release can read these weights back from this file. */
        api_note_weights_source(a, j->path, j->d->weight_version);
        /* Entries of the old version never hit again (the cache is salted
         * with the version); flushing returns their blocks now. */
        if (j->flush_cache && et_flush_cache(&j->d->et, API_KEY_BIT | ++a->next_key))
            log_line("HTTP update_weights_from_disk: flush: %s", rd_errmsg());
        if (j->keep_pause)
            api_pause_mode(a, "in_place");
    }
    if (j->h) {
        api_update_result r = {.rc = j->rc, .error = j->error, .version = j->d->weight_version,
                               .n_aborted = j->n_aborted};
        j->answer(j->h, &r);
    }
    free(j);
}

static void upd_close(http_res *h, void *ud)
{
    upd_job *j = ud;
    /* The push goes on (it cannot be cut halfway safely); nobody hears the end. */
    http_release(h);
    j->h = NULL;
}

/* The learner URL with a wildcard host replaced by loopback. */
static void own_url(const char *listen, char *out, size_t cap)
{
    const char *wild[] = {"tcp://0.0.0.0:", "tcp://*:", "tcp://[::]:"};
    for (size_t i = 0; i < sizeof wild / sizeof wild[0]; i++) {
        size_t n = strlen(wild[i]);
        if (!strncmp(listen, wild[i], n)) {
            snprintf(out, cap, "tcp://127.0.0.1:%s", listen + n);
            return;
        }
    }
    snprintf(out, cap, "%s", listen);
}

void api_route_update_disk(http_res *h, const http_req *req, void *ud)
{
    api *a = ud;
    rd_daemon *d = a->d;
    api_err e = {0};
    cJSON *root = api_parse_body(req, &e);
    if (!root) {
        api_answer_error(h, &e);
        return;
    }
    api_update_req u;
    if (api_read_update_disk(root, d->weight_version, &u, &e) ||
        api_update_from_path(a, h, u.path, (uint64_t)u.version, u.mode,
                             (u.flush_cache ? API_UPD_FLUSH_CACHE : 0) | (u.keep_pause ? API_UPD_KEEP_PAUSE : 0) |
                                 API_UPD_SERVE(u.serve_dtype),
                             answer_sglang, &e)) {
        cJSON_Delete(root);
        api_answer_error(h, &e);
        return;
    }
    cJSON_Delete(root);
}

int api_update_from_path(api *a, http_res *h, const char *path, uint64_t version, uint8_t mode, int flags,
                         void (*answer)(http_res *h, const api_update_result *r), api_err *e)
{
    rd_daemon *d = a->d;
    if (!e->status && strlen(path) >= CFG_STR)
        api_bad(e, 400, "the path is longer than %d bytes", CFG_STR - 1);
    if (!e->status && d->state != D_SERVING)
        api_bad(e, 503, "the daemon is shutting down: no weight updates");
    if (!e->status && (a->mem_released & ET_MEM_WEIGHTS))
        api_bad(e, 400, "the weights are released: /resume_memory_occupation (or /wake_up) first");
    if (!e->status && d->cfg.max_staging_bytes <= 0)
        api_bad(e, 400, "weight updates are off (max_staging_bytes is 0)");
    upd_job *j = e->status ? NULL : calloc(1, sizeof *j);
    if (!e->status && !j)
        api_bad(e, 500, "out of memory");
    if (e->status)
        return -1;
    j->h = h;
    j->d = d;
    j->version = version;
    j->mode = mode;
    j->answer = answer;
    j->flush_cache = !!(flags & API_UPD_FLUSH_CACHE);
    j->keep_pause = !!(flags & API_UPD_KEEP_PAUSE);
    j->serve_dtype = API_UPD_SERVE_OF(flags);
    snprintf(j->path, sizeof j->path, "%s", path);
    own_url(d->br.self_url[0] ? d->br.self_url : d->cfg.listen, j->url, sizeof j->url); /* TLS: inproc */
    j->w.data = j;
    http_on_close(h, upd_close, j);
    int rc = uv_queue_work(&d->loop, &j->w, upd_work, upd_done);
    if (rc) {
        j->h = NULL;
        free(j);
        http_respond_error(h, 500, "internal error", uv_strerror(rc));
        return 0; /* answered */
    }
    log_line("HTTP weight update from %s as version %llu", j->path, (unsigned long long)j->version);
    return 0;
}
