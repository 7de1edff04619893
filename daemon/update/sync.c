/* sync.c - a daemon hands its serving weights to another daemon
 * (PROTOCOL.md §10.13), so a node that starts late or restarts rejoins the
 * fleet at the current policy version without the learner sending anything.
 *
 * Two sides, both off the loop thread because they block on the network:
 *   - the peer, on WEIGHTS_SYNC: a thread exports the model's weights as HF
 *     f32 tensors (exact: every dtype the CPU backend holds widens to f32
 *     without rounding, and the native GEMM is bit-identical to the widened
 *     one) and pushes them to the target like a learner would (rd_push.c),
 *     at the peer's version. While the export reads the weights no update
 *     may begin (xfer_on_begin checks weights_busy), so nothing is swapped
 *     and freed under it.
 *   - the target, with weights_from: once serving, a thread asks the peer
 *     for a WEIGHTS_SYNC to this daemon's advertised URL; the push then
 *     arrives through the ordinary update path and is committed there. */
#include "daemon/update/sync.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/err.h"
#include "client/rd_client.h"
#include "client/rd_push.h"
#include "daemon/log.h"
#include "daemon/update/convert.h"

#define SYNC_ASK_TRIES 30           /* the target asks its peer this many times, a second apart */

typedef struct {
    sync_state *s;
    char url[1025];
    uint64_t version;
} sync_job;

static void reply_error(sync_state *s, br_ctx *x, uint32_t code, const char *why)
{
    s->env->reply.error(s->env->reply.ctx, x, code, PROTO_WEIGHTS_SYNC, why);
}

void sync_init(sync_state *s, const host_env *env, xfer_state *xfer)
{
    memset(s, 0, sizeof *s);
    s->env = env;
    s->xfer = xfer;
    atomic_init(&s->running, 0);
    atomic_init(&s->stop, 0);
}

/* The peer's side: export, then push to the target. */
static void *push_main(void *arg)
{
    sync_job *j = arg;
    sync_state *s = j->s;
    const host_secret *sec = s->env->secret;
    model_hf_tensor *mt = NULL;
    size_t n = 0;
    int rc = model_export_mem(s->env->m, ST_F32, &mt, &n);
    atomic_store(&s->xfer->weights_busy, 0);
    rdp_tensor *ts = rc ? NULL : calloc(n, sizeof *ts);
    if (!rc && !ts)
        rc = rd_fail(RD_ENOMEM, "out of memory");
    for (size_t i = 0; !rc && i < n; i++) {
        ts[i] = (rdp_tensor){.name = mt[i].name, .dtype = convert_st_dtype(mt[i].dtype), .n_dims = (uint8_t)mt[i].n_dims,
                             .nbytes = mt[i].nbytes, .data = mt[i].data};
        for (int k = 0; k < mt[i].n_dims; k++)
            ts[i].shape[k] = (uint64_t)mt[i].shape[k];
    }
    rdp_target t = {.url = j->url};
    if (!rc) {
        rdp_options o = {.version = j->version, .mode = PROTO_MODE_CONTINUE, .window = 4, .chunk_bytes = 16u << 20,
                         .client_name = "rolloutd weights sync", .secret = sec->len ? sec->bytes : NULL,
                         .secret_len = sec->len};
        rc = rdp_push(&t, 1, ts, (int)n, &o);
    }
    if (rc)
        log_line("weights sync to %s (version %llu) failed: %s", j->url, (unsigned long long)j->version,
                 t.error[0] ? t.error : rd_errmsg());
    else
        log_line("weights sync to %s: version %llu serving there (%.1f MB in %.2f s)", j->url,
                 (unsigned long long)j->version, (double)t.total_bytes / 1e6, t.seconds);
    free(ts);
    model_hf_tensors_free(mt, n);
    free(j);
    atomic_store(&s->running, 0);
    return NULL;
}

void sync_on_request(sync_state *s, br_ctx *ctx, const proto_weights_sync *q)
{
    char why[1200];
    uint64_t version = *s->env->weight_version;
    if (!cl_find(s->env->clients, q->client_id)) {
        reply_error(s, ctx, PROTO_E_UNKNOWN_CLIENT, "WEIGHTS_SYNC from an unknown client_id");
        return;
    }
    if (*s->env->state != D_SERVING) {
        reply_error(s, ctx, PROTO_E_SHUTTING_DOWN, "the daemon is shutting down");
        return;
    }
    if (version == 0) {
        reply_error(s, ctx, PROTO_E_UNEXPECTED,
                    "this daemon serves its model file (version 0): there is no pushed version to hand on");
        return;
    }
    if (xfer_active(s->xfer)) {
        reply_error(s, ctx, PROTO_E_UPDATE_CONFLICT,
                    "a weight update is in progress here; ask again when it has ended");
        return;
    }
    if (strncmp(q->url.ptr, "tcp://", 6) && strncmp(q->url.ptr, "tls+tcp://", 10)) {
        snprintf(why, sizeof why, "WEIGHTS_SYNC url \"%s\": expected tcp://HOST:PORT or tls+tcp://HOST:PORT",
                 q->url.ptr);
        reply_error(s, ctx, PROTO_E_INVALID_PARAMS, why);
        return;
    }
    if (!ra_allows_url(&s->xfer->relay_allow, q->url.ptr)) {
        /* The push dials url as a learner would: bounded like a relay (relay_allow). */
        char allow[400];
        ra_describe(&s->xfer->relay_allow, allow, sizeof allow);
        snprintf(why, sizeof why, "WEIGHTS_SYNC url \"%s\" is not in relay_allow (%s); add its host (numeric, or "
                 "localhost) to relay_allow", q->url.ptr, allow);
        s->xfer->relays_refused++;
        log_line("WEIGHTS_SYNC: refused to push to %s (not in relay_allow: %s)", q->url.ptr, allow);
        reply_error(s, ctx, PROTO_E_FORBIDDEN, why);
        return;
    }
    int idle = 0;
    if (!atomic_compare_exchange_strong(&s->running, &idle, 1)) {
        reply_error(s, ctx, PROTO_E_BUSY, "a weights sync is already running; retry later");
        return;
    }
    sync_job *j = calloc(1, sizeof *j);
    if (j) {
        j->s = s;
        snprintf(j->url, sizeof j->url, "%s", q->url.ptr);
        j->version = version;
        atomic_store(&s->xfer->weights_busy, 1);
    }
    if (s->joinable) {
        pthread_join(s->thread, NULL); /* the previous one has ended (running was 0) */
        s->joinable = 0;
    }
    if (!j || pthread_create(&s->thread, NULL, push_main, j)) {
        free(j);
        atomic_store(&s->xfer->weights_busy, 0);
        atomic_store(&s->running, 0);
        reply_error(s, ctx, PROTO_E_INTERNAL, "cannot start the sync thread");
        return;
    }
    s->joinable = 1;
    log_line("weights sync: pushing version %llu to %s", (unsigned long long)version, q->url.ptr);
    proto_msg m = {.type = PROTO_WEIGHTS_SYNC_OK};
    m.weights_sync_ok.version = version;
    s->env->reply.msg(s->env->reply.ctx, ctx, &m);
}

/* The target's side: ask the peer until it answers. */
static void *ask_main(void *arg)
{
    sync_state *s = arg;
    const cfg_daemon *cfg = s->env->cfg;
    const host_secret *sec = s->env->secret;
    const char *me = cfg->advertise_url[0] ? cfg->advertise_url : cfg->listen;
    for (int attempt = 0; attempt < SYNC_ASK_TRIES && !atomic_load(&s->stop); attempt++) {
        if (attempt)
            sleep(1);
        rdc_client *c = NULL;
        int rc = rdc_open(cfg->weights_from, &c);
        if (!rc && sec->len && !(rc = rdc_set_secret(c, sec->bytes, sec->len)))
            rc = rdc_auth(c);
        if (!rc)
            rc = rdc_hello(c, 0, "rolloutd weights_from");
        proto_msg req = {.type = PROTO_WEIGHTS_SYNC}, rep;
        req.weights_sync.client_id = c ? rdc_client_id(c) : 0;
        req.weights_sync.url = (proto_str){me, (uint32_t)strlen(me)};
        if (!rc)
            rc = rdc_call(c, &req, PROTO_WEIGHTS_SYNC_OK, RDC_TIMEOUT_MS, &rep);
        if (!rc) {
            log_line("weights_from %s: it is pushing version %llu to %s", cfg->weights_from,
                     (unsigned long long)rep.weights_sync_ok.version, me);
            proto_msg_free(&rep);
        } else {
            log_line("weights_from %s: %s%s", cfg->weights_from, rd_errmsg(),
                     attempt + 1 < SYNC_ASK_TRIES ? " (asking again in 1 s)" : " (giving up)");
        }
        uint32_t code = c ? rdc_error_code(c) : 0;
        if (c)
            rdc_close(c);
        /* done, or an answer that asking again will not change */
        if (!rc || (rc == RDC_EDAEMON && code != PROTO_E_BUSY && code != PROTO_E_UPDATE_CONFLICT))
            break;
    }
    return NULL;
}

int sync_start(sync_state *s)
{
    const cfg_daemon *cfg = s->env->cfg;
    if (!cfg->weights_from[0])
        return 0;
    const char *me = cfg->advertise_url[0] ? cfg->advertise_url : cfg->listen;
    const char *host = strstr(me, "://");
    host = host ? host + 3 : me;
    if (!strncmp(host, "0.0.0.0:", 8) || !strncmp(host, "*:", 2) || !strncmp(host, "[::]:", 5))
        return rd_fail(RD_EINVAL, "weights_from: the peer must dial this daemon back, and listen \"%s\" is a "
                       "wildcard address; set advertise_url to the URL it can reach", me);
    if (pthread_create(&s->ask_thread, NULL, ask_main, s))
        return rd_fail(RD_ENOMEM, "weights_from: cannot start a thread");
    s->ask_joinable = 1;
    return 0;
}

void sync_stop(sync_state *s)
{
    atomic_store(&s->stop, 1);
    if (s->ask_joinable)
        pthread_join(s->ask_thread, NULL);
    if (s->joinable)
        pthread_join(s->thread, NULL); /* a push in progress ends within its timeouts */
    s->ask_joinable = s->joinable = 0;
}
