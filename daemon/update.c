/* update.c - live weight updates on the loop thread (PROTOCOL.md §10).
 *
 * One transfer at a time. The loop thread keeps the bookkeeping (which byte
 * ranges are claimed, the window, timeouts); the libuv worker pool does the
 * work that takes time: each chunk's CRC-32C check and copy into the staging
 * area, and at COMMIT the conversion of the staged tensors into new backend
 * weights. The engine thread then swaps pointers at a step boundary
 * (engine_thread.c) and the loop replies to the COMMIT. Decode never waits
 * for bytes in flight. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include "daemon/daemon.h"
#include "daemon/log.h"
#include "engine/err.h"

struct up_xfer {
    uint64_t id;                /* xfer_id, random, never 0 */
    uint64_t client_id;
    uint64_t version;
    int mode;                   /* PROTO_MODE_* */
    uint32_t window;            /* chunks staged at once */
    uint32_t max_chunk;         /* bytes of chunk data */
    uint32_t pipe;              /* NNG pipe id of the UPDATE_BEGIN */
    upd_stage *st;              /* staging area; NULL once built into a patch */
    uint64_t bytes;             /* manifest bytes */
    uint32_t n_tensors;
    int32_t inflight;           /* chunk jobs in the worker pool */
    int dead;                   /* aborted: freed once inflight is 0 */
    int committing;             /* COMMIT accepted: building or swapping */
    br_ctx *commit_ctx;         /* the COMMIT waiting for its reply */
    uint64_t t_begin_us, t_last_us, t_commit_us, t_built_us;
    int64_t steps_at_begin;     /* engine steps when the transfer began */
};

typedef struct {
    uv_work_t w;
    rd_daemon *d;
    up_xfer *x;
    up_sink sink;               /* where the chunk's reply goes */
    nng_msg *msg;               /* holds the chunk data (NNG path), or NULL */
    int in_place;               /* 1: the data is already in the staging area (data lane): verify only */
    proto_update_chunk c;
    int rc;
    char err[512];
} up_chunk_job;

typedef struct {
    uv_work_t w;
    rd_daemon *d;
    up_xfer *x;
    upd_patch *patch;
    int rc;
    char err[512];
} up_build_job;

typedef struct {
    uv_work_t w;
    rd_backend *be;
    upd_patch *patch;
} up_free_job;

static uint64_t now_us(void) { return et_now_us(); }

static int64_t engine_steps(rd_daemon *d)
{
    pthread_mutex_lock(&d->et.mu);
    int64_t s = d->et.stats.steps;
    pthread_mutex_unlock(&d->et.mu);
    return s;
}

static void xfer_free(up_xfer *x)
{
    upd_stage_free(x->st);
    free(x);
}

static void record_end(rd_daemon *d, const up_xfer *x, int ok, const char *error)
{
    up_last *l = &d->last_update;
    memset(l, 0, sizeof *l);
    l->happened = 1;
    l->ok = ok;
    l->version = x->version;
    l->mode = x->mode;
    l->bytes = x->bytes;
    l->n_tensors = x->n_tensors;
    l->staged_us = (x->t_commit_us ? x->t_commit_us : now_us()) - x->t_begin_us;
    l->at_s = (double)(now_us() - d->t_start_us) / 1e6;
    snprintf(l->error, sizeof l->error, "%s", error ? error : "");
    if (ok)
        d->updates_ok++;
    else
        d->updates_failed++;
}

/* Ends the open transfer without swapping; its staging memory goes now, or
 * once the chunks being staged come back. */
static void abort_xfer(rd_daemon *d, const char *why)
{
    up_xfer *x = d->xfer;
    if (!x)
        return;
    log_line("weight update to version %llu aborted: %s", (unsigned long long)x->version, why);
    record_end(d, x, 0, why);
    d->last_aborted_xfer = x->id;
    d->xfer = NULL;
    x->dead = 1;
    if (x->inflight == 0)
        xfer_free(x);
}

/* ---- UPDATE_BEGIN ---- */

void up_on_begin(rd_daemon *d, br_ctx *ctx, const proto_update_begin *b, uint32_t pipe)
{
    char why[600];
    cl_client *c = cl_find(&d->clients, b->client_id);
    if (!c) {
        loop_reply_error(d, ctx, PROTO_E_UNKNOWN_CLIENT, PROTO_UPDATE_BEGIN, "UPDATE_BEGIN from an unknown client_id; HELLO first");
        return;
    }
    c->last_seen_us = now_us();
    if (d->state != D_SERVING) {
        loop_reply_error(d, ctx, PROTO_E_SHUTTING_DOWN, PROTO_UPDATE_BEGIN, "the daemon is shutting down: no weight updates");
        return;
    }
    if (d->xfer) {
        snprintf(why, sizeof why, "a transfer to version %llu is %s; one at a time (UPDATE_ABORT it or wait)",
                 (unsigned long long)d->xfer->version, d->xfer->committing ? "committing" : "open");
        loop_reply_error(d, ctx, PROTO_E_UPDATE_CONFLICT, PROTO_UPDATE_BEGIN, why);
        return;
    }
    if (b->version <= d->weight_version) {
        snprintf(why, sizeof why, "version %llu is not above the serving version %llu; versions only increase",
                 (unsigned long long)b->version, (unsigned long long)d->weight_version);
        loop_reply_error(d, ctx, PROTO_E_STALE_VERSION, PROTO_UPDATE_BEGIN, why);
        return;
    }
    if (b->window == 0 || b->max_chunk_bytes == 0 || b->n_tensors == 0) {
        snprintf(why, sizeof why, "UPDATE_BEGIN has window %u, max_chunk_bytes %u, n_tensors %u; each must be >= 1",
                 b->window, b->max_chunk_bytes, b->n_tensors);
        loop_reply_error(d, ctx, PROTO_E_INVALID_PARAMS, PROTO_UPDATE_BEGIN, why);
        return;
    }
    upd_spec *specs = calloc(b->n_tensors, sizeof *specs);
    if (!specs) {
        loop_reply_error(d, ctx, PROTO_E_BUSY, PROTO_UPDATE_BEGIN, "out of memory for the manifest; retry later");
        return;
    }
    for (uint32_t i = 0; i < b->n_tensors; i++) {
        const proto_tensor *t = &b->tensors[i];
        specs[i] = (upd_spec){.name = t->name.ptr, .dtype = t->dtype, .n_dims = t->n_dims, .nbytes = t->nbytes,
                              .crc32c = t->crc32c};
        memcpy(specs[i].shape, t->shape, sizeof specs[i].shape);
    }
    upd_stage *st;
    int rc = upd_stage_create(&d->L.m->cfg, specs, (int32_t)b->n_tensors, b->total_bytes,
                              (uint64_t)d->cfg.max_staging_bytes, &st);
    free(specs);
    if (rc) {
        loop_reply_error(d, ctx, rc == RD_ENOMEM ? PROTO_E_BUSY : PROTO_E_INVALID_PARAMS, PROTO_UPDATE_BEGIN,
                         rd_errmsg());
        return;
    }
    up_xfer *x = calloc(1, sizeof *x);
    if (!x) {
        upd_stage_free(st);
        loop_reply_error(d, ctx, PROTO_E_BUSY, PROTO_UPDATE_BEGIN, "out of memory; retry later");
        return;
    }
    while (x->id == 0 && getrandom(&x->id, sizeof x->id, 0) != (ssize_t)sizeof x->id)
        x->id = now_us() ^ 0x9e3779b97f4a7c15ull;
    if (x->id == 0)
        x->id = 1;
    x->client_id = b->client_id;
    x->version = b->version;
    x->mode = b->mode;
    x->window = b->window < (uint32_t)d->cfg.update_window ? b->window : (uint32_t)d->cfg.update_window;
    uint64_t room = d->lim.max_message_bytes - 64;
    x->max_chunk = b->max_chunk_bytes < room ? b->max_chunk_bytes : (uint32_t)room;
    x->pipe = pipe;
    x->st = st;
    x->bytes = st->total_bytes;
    x->n_tensors = b->n_tensors;
    x->t_begin_us = x->t_last_us = now_us();
    x->steps_at_begin = engine_steps(d);
    d->xfer = x;
    log_line("weight update to version %llu begun: %u tensors, %llu bytes, mode %s, window %u",
             (unsigned long long)x->version, b->n_tensors, (unsigned long long)st->total_bytes,
             x->mode == PROTO_MODE_DRAIN ? "drain" : x->mode == PROTO_MODE_ABORT ? "abort" : "continue", x->window);
    proto_msg m = {.type = PROTO_UPDATE_BEGIN_OK};
    m.update_begin_ok = (proto_update_begin_ok){.xfer_id = x->id, .window = x->window,
                                                .max_chunk_bytes = x->max_chunk, .staging_bytes = st->total_bytes,
                                                .data_port = d->lane_port};
    loop_reply_msg(d, ctx, &m);
}

/* ---- UPDATE_CHUNK ---- */

static void sink_reply(rd_daemon *d, const up_sink *k, uint32_t code, const char *why, const proto_update_chunk_ok *ok)
{
    if (k->send) {
        k->send(d, k->arg, code, why, ok);
        return;
    }
    if (code) {
        loop_reply_error(d, k->ctx, code, PROTO_UPDATE_CHUNK, why);
        return;
    }
    proto_msg m = {.type = PROTO_UPDATE_CHUNK_OK};
    m.update_chunk_ok = *ok;
    loop_reply_msg(d, k->ctx, &m);
}

static void chunk_work(uv_work_t *w)
{
    up_chunk_job *j = w->data;
    upd_tensor *t = &j->x->st->t[j->c.tensor_index];
    if (j->in_place)
        j->rc = upd_chunk_check(j->x->st, j->c.tensor_index, j->c.offset, t->data + j->c.offset, j->c.len,
                                j->c.crc32c);
    else
        j->rc = upd_chunk_fill(j->x->st, j->c.tensor_index, j->c.offset, j->c.data, j->c.len, j->c.crc32c);
    if (j->rc)
        snprintf(j->err, sizeof j->err, "%s", rd_errmsg());
}

static void chunk_done(uv_work_t *w, int status)
{
    up_chunk_job *j = w->data;
    rd_daemon *d = j->d;
    up_xfer *x = j->x;
    if (j->msg)
        nng_msg_free(j->msg);
    x->inflight--;
    if (x->dead) {
        sink_reply(d, &j->sink, PROTO_E_UNEXPECTED, "the transfer was aborted while this chunk was staged", NULL);
        if (x->inflight == 0)
            xfer_free(x);
        free(j);
        return;
    }
    int ok = status == 0 && j->rc == 0;
    upd_chunk_settle(x->st, j->c.tensor_index, j->c.offset, ok);
    x->t_last_us = now_us();
    if (!ok) {
        sink_reply(d, &j->sink, j->rc == RD_ECHECKSUM ? PROTO_E_CHECKSUM : PROTO_E_INTERNAL,
                   status ? "the chunk's staging job was cancelled" : j->err, NULL);
    } else {
        proto_update_chunk_ok r = {.xfer_id = x->id, .chunk_seq = j->c.chunk_seq,
                                   .bytes_staged = x->st->staged_bytes, .total_bytes = x->st->total_bytes};
        sink_reply(d, &j->sink, 0, NULL, &r);
    }
    free(j);
    lane_on_room(d);
}

int up_chunk_claim(rd_daemon *d, const proto_update_chunk *c, up_xfer **xo, uint8_t **dest, int *dup, char *why,
                   size_t why_cap)
{
    *xo = NULL;
    *dest = NULL;
    *dup = 0;
    up_xfer *x = d->xfer;
    if (!x || x->id != c->xfer_id || x->committing) {
        snprintf(why, why_cap, "UPDATE_CHUNK for xfer_id %016llx: %s", (unsigned long long)c->xfer_id,
                 x && x->id == c->xfer_id ? "the transfer is committing; no more chunks"
                                          : "no such open transfer (UPDATE_BEGIN first; it may have been aborted)");
        return PROTO_E_UNEXPECTED;
    }
    x->t_last_us = now_us();
    cl_client *cl = cl_find(&d->clients, x->client_id);
    if (cl)
        cl->last_seen_us = x->t_last_us;
    if (c->len > x->max_chunk) {
        snprintf(why, why_cap, "chunk %u has %u bytes of data; the granted max_chunk_bytes is %u", c->chunk_seq,
                 c->len, x->max_chunk);
        return PROTO_E_INVALID_PARAMS;
    }
    int rc = upd_chunk_claim(x->st, c->tensor_index, c->offset, c->len, c->crc32c, dup);
    if (rc) {
        snprintf(why, why_cap, "%s", rd_errmsg());
        return rc == RD_EBUSY ? PROTO_E_BUSY : PROTO_E_INVALID_PARAMS;
    }
    *xo = x;
    if (!*dup) {
        x->inflight++; /* the claimed range is in use until its job settles it */
        *dest = x->st->t[c->tensor_index].data + c->offset;
    }
    return 0;
}

uint64_t up_xfer_id(const up_xfer *x) { return x->id; }
int up_xfer_has_room(const up_xfer *x) { return (uint32_t)x->inflight < x->window; }

void up_chunk_duplicate(rd_daemon *d, up_xfer *x, const proto_update_chunk *c, const up_sink *sink)
{
    proto_update_chunk_ok r = {.xfer_id = x->id, .chunk_seq = c->chunk_seq, .flags = PROTO_CHUNK_OK_DUPLICATE,
                               .bytes_staged = x->st->staged_bytes, .total_bytes = x->st->total_bytes};
    sink_reply(d, sink, 0, NULL, &r);
}

/* Queues the check (and for NNG the copy) of a claimed chunk; the reply goes
 * to sink when it is done. */
static void chunk_queue(rd_daemon *d, up_xfer *x, const proto_update_chunk *c, nng_msg *msg, int in_place,
                        const up_sink *sink)
{
    up_chunk_job *j = calloc(1, sizeof *j);
    if (j) {
        j->w.data = j;
        j->d = d;
        j->x = x;
        j->sink = *sink;
        j->msg = msg;
        j->in_place = in_place;
        j->c = *c;
    }
    if (!j || uv_queue_work(&d->loop, &j->w, chunk_work, chunk_done)) {
        x->inflight--;
        upd_chunk_settle(x->st, c->tensor_index, c->offset, 0);
        if (msg)
            nng_msg_free(msg);
        free(j);
        sink_reply(d, sink, PROTO_E_INTERNAL, "cannot queue the chunk's staging job", NULL);
    }
}

void up_chunk_filled(rd_daemon *d, up_xfer *x, const proto_update_chunk *c, const up_sink *sink)
{
    chunk_queue(d, x, c, NULL, 1, sink);
}

void up_chunk_abandon(rd_daemon *d, up_xfer *x, const proto_update_chunk *c)
{
    x->inflight--;
    if (x->dead) {
        if (x->inflight == 0)
            xfer_free(x);
        return;
    }
    upd_chunk_settle(x->st, c->tensor_index, c->offset, 0);
}

void up_on_chunk(rd_daemon *d, br_ctx *ctx, const proto_update_chunk *c, nng_msg *msg)
{
    char why[600];
    up_sink sink = {.ctx = ctx};
    up_xfer *x;
    uint8_t *dest;
    int dup;
    uint32_t code = up_chunk_claim(d, c, &x, &dest, &dup, why, sizeof why);
    if (code) {
        nng_msg_free(msg);
        sink_reply(d, &sink, code, why, NULL);
        return;
    }
    if (dup) {
        nng_msg_free(msg);
        up_chunk_duplicate(d, x, c, &sink);
        return;
    }
    if ((uint32_t)x->inflight > x->window) {
        snprintf(why, sizeof why, "%d chunks are being staged (the window is %u); resend chunk %u after a reply",
                 x->inflight - 1, x->window, c->chunk_seq);
        up_chunk_abandon(d, x, c);
        nng_msg_free(msg);
        sink_reply(d, &sink, PROTO_E_BUSY, why, NULL);
        return;
    }
    chunk_queue(d, x, c, msg, 0, &sink);
}

/* ---- UPDATE_COMMIT ---- */

static void free_work(uv_work_t *w)
{
    up_free_job *j = w->data;
    upd_patch_free(j->be, j->patch);
}

static void free_done(uv_work_t *w, int status) { free(w->data); }

/* Frees the replaced weights off the loop thread (large munmaps). */
static void free_patch_later(rd_daemon *d, upd_patch *p)
{
    up_free_job *j = calloc(1, sizeof *j);
    if (j) {
        j->w.data = j;
        j->be = d->L.m->be;
        j->patch = p;
    }
    if (!j || uv_queue_work(&d->loop, &j->w, free_work, free_done)) {
        upd_patch_free(d->L.m->be, p);
        free(j);
    }
}

static void build_work(uv_work_t *w)
{
    up_build_job *j = w->data;
    j->rc = upd_build(j->d->L.m, j->x->st, &j->patch);
    if (j->rc)
        snprintf(j->err, sizeof j->err, "%s", rd_errmsg());
}

static void build_done(uv_work_t *w, int status)
{
    up_build_job *j = w->data;
    rd_daemon *d = j->d;
    up_xfer *x = j->x;
    upd_patch *patch = j->patch;
    int rc = status ? RD_EINVAL : j->rc;
    char why[600];
    snprintf(why, sizeof why, "%s", status ? "the conversion job was cancelled" : j->err);
    free(j);
    if (rc) {
        br_ctx *ctx = x->commit_ctx;
        x->committing = 0;
        abort_xfer(d, why);
        loop_reply_error(d, ctx, rc == RD_EINVAL ? PROTO_E_INVALID_PARAMS : PROTO_E_INTERNAL, PROTO_UPDATE_COMMIT,
                         why);
        return;
    }
    x->t_built_us = now_us();
    /* The staging copy is no longer needed: the patch holds the weights now. */
    upd_stage_free(x->st);
    x->st = NULL;
    if (et_swap_weights(&d->et, d->L.m, patch, x->version, x->mode)) {
        upd_patch_free(d->L.m->be, patch);
        br_ctx *ctx = x->commit_ctx;
        x->committing = 0;
        abort_xfer(d, "out of memory queueing the swap");
        loop_reply_error(d, ctx, PROTO_E_INTERNAL, PROTO_UPDATE_COMMIT, "out of memory queueing the swap");
    }
}

void up_on_commit(rd_daemon *d, br_ctx *ctx, const proto_update_ref *r)
{
    char why[600];
    if (r->xfer_id != 0 && r->xfer_id == d->last_commit_xfer) {
        proto_msg m = {.type = PROTO_UPDATE_COMMIT_OK};
        m.update_commit_ok = d->last_commit_ok;
        loop_reply_msg(d, ctx, &m);
        return;
    }
    up_xfer *x = d->xfer;
    if (!x || x->id != r->xfer_id) {
        snprintf(why, sizeof why, "UPDATE_COMMIT for xfer_id %016llx: no such open transfer (commit without "
                 "UPDATE_BEGIN, or the transfer was aborted)", (unsigned long long)r->xfer_id);
        loop_reply_error(d, ctx, PROTO_E_UNEXPECTED, PROTO_UPDATE_COMMIT, why);
        return;
    }
    if (x->committing) {
        loop_reply_error(d, ctx, PROTO_E_BUSY, PROTO_UPDATE_COMMIT,
                         "this transfer is already committing; repeat the COMMIT later for its result");
        return;
    }
    int rc = upd_stage_verify(x->st);
    if (rc) {
        snprintf(why, sizeof why, "%s", rd_errmsg());
        abort_xfer(d, why);
        loop_reply_error(d, ctx, rc == RD_ECHECKSUM ? PROTO_E_CHECKSUM : PROTO_E_INVALID_PARAMS, PROTO_UPDATE_COMMIT,
                         why);
        return;
    }
    up_build_job *j = calloc(1, sizeof *j);
    if (!j) {
        loop_reply_error(d, ctx, PROTO_E_BUSY, PROTO_UPDATE_COMMIT, "out of memory; repeat the COMMIT");
        return;
    }
    x->committing = 1;
    x->commit_ctx = ctx;
    x->t_commit_us = now_us();
    j->w.data = j;
    j->d = d;
    j->x = x;
    if (uv_queue_work(&d->loop, &j->w, build_work, build_done)) {
        free(j);
        x->committing = 0;
        loop_reply_error(d, ctx, PROTO_E_INTERNAL, PROTO_UPDATE_COMMIT, "cannot queue the conversion job");
    }
}

void up_on_wake(rd_daemon *d)
{
    et_swapped s;
    if (!et_take_swapped(&d->et, &s))
        return;
    d->weight_version = s.version;
    if (s.old)
        free_patch_later(d, s.old);
    up_xfer *x = d->xfer;
    if (!x || !x->committing || x->version != s.version) {
        log_line("weight swap to version %llu with no committing transfer", (unsigned long long)s.version);
        return;
    }
    proto_update_commit_ok ok = {
        .version = s.version,
        .stall_us = s.stall_us,
        .wait_us = s.t_applied_us > x->t_commit_us ? s.t_applied_us - x->t_commit_us : 0,
        .staged_us = x->t_commit_us - x->t_begin_us,
        .n_aborted = (uint32_t)s.n_aborted,
    };
    record_end(d, x, 1, NULL);
    up_last *l = &d->last_update;
    l->build_us = x->t_built_us - x->t_commit_us;
    l->wait_us = ok.wait_us;
    l->stall_us = ok.stall_us;
    l->n_aborted = s.n_aborted;
    int64_t steps = engine_steps(d) - x->steps_at_begin;
    l->steps_during = steps > 0 ? (uint64_t)steps : 0;
    d->update_bytes_total += x->bytes;
    d->last_commit_xfer = x->id;
    d->last_commit_ok = ok;
    log_line("weight update: version %llu serving (%llu bytes; staged %.3f s, built %.3f s, swap wait %.3f ms, "
             "stall %llu us, %d samples aborted)", (unsigned long long)s.version, (unsigned long long)x->bytes,
             (double)ok.staged_us / 1e6, (double)l->build_us / 1e6, (double)ok.wait_us / 1e3,
             (unsigned long long)ok.stall_us, s.n_aborted);
    proto_msg m = {.type = PROTO_UPDATE_COMMIT_OK};
    m.update_commit_ok = ok;
    br_ctx *ctx = x->commit_ctx;
    d->xfer = NULL;
    xfer_free(x);
    loop_reply_msg(d, ctx, &m);
}

/* ---- UPDATE_ABORT and the ways a transfer dies on its own ---- */

void up_on_abort(rd_daemon *d, br_ctx *ctx, const proto_update_ref *r)
{
    char why[300];
    proto_msg m = {.type = PROTO_UPDATE_ABORT_OK};
    if (r->xfer_id != 0 && r->xfer_id == d->last_aborted_xfer) {
        loop_reply_msg(d, ctx, &m);
        return;
    }
    up_xfer *x = d->xfer;
    if (!x || x->id != r->xfer_id) {
        snprintf(why, sizeof why, "UPDATE_ABORT for xfer_id %016llx: no such open transfer",
                 (unsigned long long)r->xfer_id);
        loop_reply_error(d, ctx, PROTO_E_UNEXPECTED, PROTO_UPDATE_ABORT, why);
        return;
    }
    if (x->committing) {
        loop_reply_error(d, ctx, PROTO_E_UPDATE_CONFLICT, PROTO_UPDATE_ABORT,
                         "the transfer is committing; it can no longer be aborted");
        return;
    }
    m.update_abort_ok.bytes_freed = x->bytes;
    abort_xfer(d, "UPDATE_ABORT from the sender");
    loop_reply_msg(d, ctx, &m);
}

void up_on_pipe_closed(rd_daemon *d, uint32_t pipe)
{
    if (d->xfer && !d->xfer->committing && d->xfer->pipe == pipe)
        abort_xfer(d, "the sender's connection closed mid-transfer");
}

void up_on_tick(rd_daemon *d)
{
    up_xfer *x = d->xfer;
    if (x && !x->committing && now_us() - x->t_last_us > (uint64_t)d->cfg.update_idle_s * 1000000u)
        abort_xfer(d, "no message of the transfer for update_idle_s");
}

void up_on_client_forgotten(rd_daemon *d, uint64_t client_id)
{
    if (d->xfer && !d->xfer->committing && d->xfer->client_id == client_id)
        abort_xfer(d, "the sending client was forgotten");
}

void up_progress(const rd_daemon *d, int *active, uint64_t *version, uint64_t *staged, uint64_t *total,
                 int *committing)
{
    const up_xfer *x = d->xfer;
    *active = x != NULL;
    *version = x ? x->version : 0;
    *staged = x && x->st ? x->st->staged_bytes : x ? x->bytes : 0;
    *total = x ? x->bytes : 0;
    *committing = x ? x->committing : 0;
}

void up_on_lane_broken(rd_daemon *d, uint64_t xfer_id, const char *why)
{
    if (d->xfer && d->xfer->id == xfer_id && !d->xfer->committing)
        abort_xfer(d, why);
}
