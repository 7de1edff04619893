/* transfer.c - live weight updates on the loop thread (PROTOCOL.md §10).
 *
 * One transfer at a time. The loop thread keeps the bookkeeping (which byte
 * ranges are claimed, the window, timeouts); the libuv worker pool does the
 * work that takes time: each chunk's CRC-32C check and copy into the staging
 * area, and at COMMIT the conversion of the staged tensors into new backend
 * weights. The engine thread then swaps pointers at a step boundary
 * (engine_thread.c) and the loop replies to the COMMIT. Decode never waits
 * for bytes in flight. */
#include "daemon/update/transfer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#include <sys/random.h>

#include "base/clock.h"
#include "base/err.h"
#include "daemon/log.h"
#include "daemon/update/convert.h"
#include "daemon/update/relay.h"

struct xfer {
    uint64_t id;                /* xfer_id, random, never 0 */
    uint64_t client_id;
    uint64_t version;
    uint8_t mode;               /* PROTO_MODE_*, as the sender asked (convert_mode for the engine) */
    uint8_t serve;              /* PROTO_SERVE_AS_PUSHED / _Q8_0: the push's serve_dtype, else the config's */
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
    uint64_t t_begin_us, t_last_us, t_commit_us, t_build_us, t_built_us;
    int64_t steps_at_begin;     /* engine steps when the transfer began */
    /* two-phase commit and the chain (§10.11) */
    int building;               /* a build job runs (started by PREPARE or COMMIT) */
    upd_patch *patch;           /* built by PREPARE: COMMIT only swaps it in */
    relay_chunk *log;           /* [n_log] verified chunks in the order they settled: what a relay sends */
    uint32_t n_log, cap_log;
    uint64_t log_bytes;         /* sum of their lens */
    relay *relay;               /* forwarding to the next daemon, or NULL */
    int relays_open;            /* relays not yet closed: each may read st */
    int forwarded;              /* a FORWARD came: st stays until the transfer ends (a reroute resends from it) */
    /* delta pushes (§10.14) */
    uint32_t n_delta;           /* tensors sent as deltas */
    uint64_t tensor_bytes;      /* the tensors' own bytes */
    uint64_t delta_elems, delta_changed; /* elements of the delta tensors; whose bits changed (once applied) */
    upd_held *held_next;        /* built: what is held once this transfer is swapped in */
    int prefaulting;            /* a worker touches the delta's new-bytes mapping (upd_delta_prefault) */
    int32_t prequant;           /* tensors being quantized on workers while the push arrives (upd_prequant) */
    uint32_t n_prequant;        /* tensors quantized that way */
    void *build_waiting;        /* a build_job queued once the prefault and the prequant jobs are done (the
                                   first writes the delta mapping, the others the tensors' blocks) */
    /* a LoRA adapter's push (ADAPTER_BEGIN, §10.15): no weight changes */
    int adapter;                /* 1: the staged tensors are an adapter's */
    char lora_name[LORA_NAME_MAX];
    int32_t lora_rank;
    float lora_alpha;
    int lora_rslora;
    lora_adapter *built;        /* built by PREPARE or COMMIT; not yet handed to the engine thread */
    lh_adapter *lora_bytes;     /* its bytes as pushed (deltas applied): the next push's base once it serves */
};

/* Where a chunk's reply goes: an NNG context, or (lane.send set) the data lane. */
typedef struct {
    br_ctx *ctx;
    lane_answer lane;
} xfer_answer;

typedef struct {
    uv_work_t w;
    xfer_state *s;
    xfer *x;
    xfer_answer sink;           /* where the chunk's reply goes */
    nng_msg *msg;               /* holds the chunk data (NNG path), or NULL */
    int in_place;               /* 1: the data is already in the staging area (data lane): verify only */
    proto_update_chunk c;
    int rc;
    char err[512];
} chunk_job;

typedef struct {
    uv_work_t w;
    xfer_state *s;
    xfer *x;
    upd_patch *patch;
    lora_adapter *adapter;      /* an adapter's push: what it built */
    lh_adapter *lora_bytes;     /* ... and its bytes */
    uint64_t changed;           /* ... elements of its delta tensors whose bits changed */
    int rc;
    char err[512];
} build_job;

typedef struct {
    uv_work_t w;
    rd_backend *be;
    upd_patch *patch;
} free_job;

static uint64_t now_us(void) { return (uint64_t)clock_now_us(); }

static void reply_error(xfer_state *s, br_ctx *x, uint32_t code, uint16_t type, const char *why)
{
    s->env->reply.error(s->env->reply.ctx, x, code, type, why);
}

static void reply_msg(xfer_state *s, br_ctx *x, const proto_msg *m) { s->env->reply.msg(s->env->reply.ctx, x, m); }

static int64_t engine_steps(xfer_state *s)
{
    et_thread *et = s->env->et;
    pthread_mutex_lock(&et->mu);
    int64_t steps = et->stats.steps;
    pthread_mutex_unlock(&et->mu);
    return steps;
}

static void free_patch_later(xfer_state *s, upd_patch *p);
static void start_prefault(xfer_state *s, xfer *x);

static void xfer_free(xfer *x)
{
    lora_free(x->built);
    lh_adapter_free(x->lora_bytes);
    upd_held_free(x->held_next);
    upd_stage_free(x->st);
    free(x->log);
    free(x);
}

/* Frees a transfer that has ended once nothing refers to it any more: no
 * chunk or build job in the pool, no relay reading its staging memory. */
static void xfer_maybe_free(xfer *x)
{
    if (x->dead && x->inflight == 0 && x->prequant == 0 && x->relays_open == 0)
        xfer_free(x);
}

/* The transfer has ended (swapped or aborted): its relay stops. */
static void xfer_end(xfer_state *s, xfer *x)
{
    x->dead = 1;
    if (x->patch) {
        free_patch_later(s, x->patch);
        x->patch = NULL;
    }
    if (x->relay) {
        relay *r = x->relay;
        x->relay = NULL;
        x->relays_open++; /* relay_close may report its close at once: x is freed below, once */
        relay_close(r);
        x->relays_open--;
    }
    xfer_maybe_free(x);
}

static void record_end(xfer_state *s, const xfer *x, int ok, const char *error)
{
    if (x->adapter) { /* the weights' last update stays what it was */
        if (ok)
            s->adapters_ok++;
        else
            s->adapters_failed++;
        return;
    }
    up_last *l = &s->last_update;
    memset(l, 0, sizeof *l);
    l->happened = 1;
    l->ok = ok;
    l->version = x->version;
    l->mode = x->mode;
    l->bytes = x->bytes;
    l->n_tensors = x->n_tensors;
    l->n_delta = x->n_delta;
    l->tensor_bytes = x->tensor_bytes;
    l->delta_elems = x->delta_elems;
    l->delta_changed = x->delta_changed;
    l->n_prequant = x->n_prequant;
    l->staged_us = (x->t_commit_us ? x->t_commit_us : now_us()) - x->t_begin_us;
    l->at_s = (double)(now_us() - *s->env->t_start_us) / 1e6;
    snprintf(l->error, sizeof l->error, "%s", error ? error : "");
    if (ok)
        s->updates_ok++;
    else
        s->updates_failed++;
}

/* Ends the open transfer without swapping; its staging memory goes now, or
 * once the chunks being staged come back. */
static void abort_xfer_code(xfer_state *s, uint32_t code, const char *why)
{
    xfer *x = s->open;
    if (!x)
        return;
    if (x->adapter)
        log_line("LoRA adapter '%s' push of version %llu aborted: %s", x->lora_name, (unsigned long long)x->version,
                 why);
    else
        log_line("weight update to version %llu aborted: %s", (unsigned long long)x->version, why);
    record_end(s, x, 0, why);
    s->last_aborted_xfer = x->id;
    s->last_abort_code = code;
    snprintf(s->last_abort_why, sizeof s->last_abort_why, "%s", why);
    s->open = NULL;
    xfer_end(s, x);
}

static void abort_xfer(xfer_state *s, const char *why) { abort_xfer_code(s, PROTO_E_UNEXPECTED, why); }

void xfer_init(xfer_state *s, const host_env *env)
{
    memset(s, 0, sizeof *s);
    s->env = env;
    atomic_init(&s->weights_busy, 0);
    /* cfg_validate has parsed it once: this cannot fail. */
    ra_parse(env->cfg->relay_allow, ra_url_is_loopback(env->cfg->listen), &s->relay_allow);
    if (env->m && upd_held_create(&env->m->cfg, &s->held))
        s->held = NULL; /* then every delta is refused DTYPE_MISMATCH: full pushes still work */
}

/* ---- UPDATE_BEGIN ---- */

/* What every BEGIN checks first: a known client, a serving daemon, no
 * transfer open. 0, or the request answered. */
static int begin_allowed(xfer_state *s, br_ctx *ctx, uint16_t type, uint64_t client_id)
{
    char why[600];
    cl_client *c = cl_find(s->env->clients, client_id);
    if (!c) {
        snprintf(why, sizeof why, "%s from an unknown client_id; HELLO first", proto_type_name(type));
        reply_error(s, ctx, PROTO_E_UNKNOWN_CLIENT, type, why);
        return -1;
    }
    c->last_seen_us = now_us();
    if (*s->env->state != D_SERVING) {
        reply_error(s, ctx, PROTO_E_SHUTTING_DOWN, type, "the daemon is shutting down: no weight updates");
        return -1;
    }
    if (atomic_load(&s->weights_busy)) {
        reply_error(s, ctx, PROTO_E_UPDATE_CONFLICT, type,
                    "a weights sync is reading the serving weights (a second or so); retry then");
        return -1;
    }
    if (s->open) {
        if (s->open->adapter)
            snprintf(why, sizeof why, "a transfer of LoRA adapter '%s' version %llu is %s; one at a time "
                     "(UPDATE_ABORT it or wait)", s->open->lora_name, (unsigned long long)s->open->version,
                     s->open->committing ? "committing" : "open");
        else
            snprintf(why, sizeof why, "a transfer to version %llu is %s; one at a time (UPDATE_ABORT it or wait)",
                     (unsigned long long)s->open->version, s->open->committing ? "committing" : "open");
        reply_error(s, ctx, PROTO_E_UPDATE_CONFLICT, type, why);
        return -1;
    }
    return 0;
}

/* A new transfer of the staged manifest st (owned from here), its id drawn;
 * NULL when out of memory (st freed). */
static xfer *new_xfer(xfer_state *s, upd_stage *st, uint64_t client_id, uint64_t version, uint32_t window,
                      uint32_t max_chunk, uint32_t pipe)
{
    xfer *x = calloc(1, sizeof *x);
    if (!x) {
        upd_stage_free(st);
        return NULL;
    }
    while (x->id == 0 && getrandom(&x->id, sizeof x->id, 0) != (ssize_t)sizeof x->id)
        x->id = now_us() ^ 0x9e3779b97f4a7c15ull;
    if (x->id == 0)
        x->id = 1;
    x->client_id = client_id;
    x->version = version;
    x->window = window < (uint32_t)s->env->cfg->update_window ? window : (uint32_t)s->env->cfg->update_window;
    uint64_t room = *s->env->max_message_bytes - 64;
    x->max_chunk = max_chunk < room ? max_chunk : (uint32_t)room;
    x->pipe = pipe;
    x->st = st;
    x->bytes = st->total_bytes;
    x->n_tensors = (uint32_t)st->n;
    for (int32_t i = 0; i < st->n; i++)
        x->tensor_bytes += st->t[i].nbytes;
    x->t_begin_us = x->t_last_us = now_us();
    x->steps_at_begin = engine_steps(s);
    return x;
}

static void reply_begin_ok(xfer_state *s, br_ctx *ctx, uint16_t type, const xfer *x)
{
    proto_msg m = {.type = type};
    m.update_begin_ok = (proto_update_begin_ok){.xfer_id = x->id, .window = x->window,
                                                .max_chunk_bytes = x->max_chunk, .staging_bytes = x->bytes,
                                                .data_port = s->lane_port};
    reply_msg(s, ctx, &m);
}

void xfer_on_begin(xfer_state *s, br_ctx *ctx, const proto_update_begin *b, uint32_t pipe)
{
    char why[600];
    if (begin_allowed(s, ctx, PROTO_UPDATE_BEGIN, b->client_id))
        return;
    if (b->version <= *s->env->weight_version) {
        snprintf(why, sizeof why, "version %llu is not above the serving version %llu; versions only increase",
                 (unsigned long long)b->version, (unsigned long long)*s->env->weight_version);
        reply_error(s, ctx, PROTO_E_STALE_VERSION, PROTO_UPDATE_BEGIN, why);
        return;
    }
    if (b->window == 0 || b->max_chunk_bytes == 0 || b->n_tensors == 0) {
        snprintf(why, sizeof why, "UPDATE_BEGIN has window %u, max_chunk_bytes %u, n_tensors %u; each must be >= 1",
                 b->window, b->max_chunk_bytes, b->n_tensors);
        reply_error(s, ctx, PROTO_E_INVALID_PARAMS, PROTO_UPDATE_BEGIN, why);
        return;
    }
    /* A delta applies to the serving version only (§10.14): checked before anything is staged. */
    uint32_t n_delta = 0;
    for (uint32_t i = 0; i < b->n_tensors; i++) {
        const proto_tensor *t = &b->tensors[i];
        if (!(t->flags & PROTO_TENSOR_DELTA))
            continue;
        if (n_delta++ == 0 && t->base_version != *s->env->weight_version) {
            snprintf(why, sizeof why, "delta tensor '%.200s' has base_version %llu; this daemon serves version %llu "
                     "(push it whole, or a delta against %llu)", t->name.ptr, (unsigned long long)t->base_version,
                     (unsigned long long)*s->env->weight_version, (unsigned long long)*s->env->weight_version);
            reply_error(s, ctx, PROTO_E_BASE_MISMATCH, PROTO_UPDATE_BEGIN, why);
            return;
        }
        if (t->base_version != *s->env->weight_version) {
            snprintf(why, sizeof why, "delta tensor '%.200s' has base_version %llu, another delta of this manifest "
                     "%llu; expected one base per transfer", t->name.ptr, (unsigned long long)t->base_version,
                     (unsigned long long)*s->env->weight_version);
            reply_error(s, ctx, PROTO_E_INVALID_PARAMS, PROTO_UPDATE_BEGIN, why);
            return;
        }
    }
    upd_spec *specs = calloc(b->n_tensors, sizeof *specs);
    if (!specs) {
        reply_error(s, ctx, PROTO_E_BUSY, PROTO_UPDATE_BEGIN, "out of memory for the manifest; retry later");
        return;
    }
    for (uint32_t i = 0; i < b->n_tensors; i++) {
        const proto_tensor *t = &b->tensors[i];
        specs[i] = (upd_spec){.name = t->name.ptr, .dtype = convert_dtype(t->dtype), .n_dims = t->n_dims,
                              .nbytes = t->nbytes, .crc32c = t->crc32c,
                              .delta = (t->flags & PROTO_TENSOR_DELTA) != 0, .wire_bytes = t->wire_bytes};
        memcpy(specs[i].shape, t->shape, sizeof specs[i].shape);
    }
    upd_stage *st;
    int rc = upd_stage_create(&s->env->m->cfg, specs, (int32_t)b->n_tensors, b->total_bytes,
                              (uint64_t)s->env->cfg->max_staging_bytes, &st);
    free(specs);
    if (rc) {
        reply_error(s, ctx, rc == RD_ENOMEM ? PROTO_E_BUSY : PROTO_E_INVALID_PARAMS, PROTO_UPDATE_BEGIN,
                    rd_errmsg());
        return;
    }
    if (n_delta) {
        int held = s->held ? upd_held_check(s->held, &s->env->m->cfg, st, why, sizeof why) : UPD_HELD_DTYPE;
        if (!s->held)
            snprintf(why, sizeof why, "this daemon keeps no record of pushed tensors (out of memory at start); push "
                     "whole");
        if (held != UPD_HELD_OK) {
            upd_stage_free(st);
            reply_error(s, ctx, held == UPD_HELD_QUANTIZED ? PROTO_E_BASE_QUANTIZED : PROTO_E_DTYPE_MISMATCH,
                        PROTO_UPDATE_BEGIN, why);
            return;
        }
    }
    xfer *x = new_xfer(s, st, b->client_id, b->version, b->window, b->max_chunk_bytes, pipe);
    if (!x) {
        reply_error(s, ctx, PROTO_E_BUSY, PROTO_UPDATE_BEGIN, "out of memory; retry later");
        return;
    }
    x->mode = b->mode;
    x->serve = convert_serve_code(b->serve_dtype, s->env->cfg->serve_dtype);
    x->n_delta = n_delta;
    for (int32_t i = 0; i < st->n; i++)
        if (st->t[i].delta)
            x->delta_elems += st->t[i].nbytes / proto_dtype_size(b->tensors[i].dtype);
    s->open = x;
    if (n_delta)
        start_prefault(s, x);
    log_line("weight update to version %llu begun: %u tensors (%u deltas against %llu), %llu bytes, mode %s, "
             "window %u, served as %s", (unsigned long long)x->version, b->n_tensors, n_delta,
             (unsigned long long)*s->env->weight_version, (unsigned long long)st->total_bytes,
             x->mode == PROTO_MODE_DRAIN ? "drain" : x->mode == PROTO_MODE_ABORT ? "abort" : "continue", x->window,
             sh_name(x->serve));
    reply_begin_ok(s, ctx, PROTO_UPDATE_BEGIN_OK, x);
}

/* ---- ADAPTER_BEGIN (§10.15) ---- */

static st_dtype st_dtype_of(int upd) { return upd == UPD_F16 ? ST_F16 : upd == UPD_BF16 ? ST_BF16 : ST_F32; }

/* The staged tensors as the LoRA loader reads them: their bytes (bytes[i]), or NULL for the manifest alone. */
static st_tensor *adapter_tensors(const upd_stage *st, uint8_t *const *bytes)
{
    st_tensor *t = calloc((size_t)st->n, sizeof *t);
    for (int32_t i = 0; t && i < st->n; i++) {
        const upd_tensor *u = &st->t[i];
        t[i].name = u->name;
        t[i].dtype = st_dtype_of(u->dtype);
        t[i].n_dims = u->n_dims;
        t[i].n_elems = 1;
        for (int d = 0; d < u->n_dims; d++) {
            t[i].shape[d] = (int64_t)u->shape[d];
            t[i].n_elems *= u->shape[d];
        }
        t[i].data = bytes ? bytes[i] : NULL;
    }
    return t;
}

void xfer_on_adapter_begin(xfer_state *s, br_ctx *ctx, const proto_adapter_begin *b, uint32_t pipe)
{
    char why[800];
    const uint16_t T = PROTO_ADAPTER_BEGIN;
    if (begin_allowed(s, ctx, T, b->client_id))
        return;
    const cfg_daemon *cfg = s->env->cfg;
    if (cfg->max_loras <= 0) {
        reply_error(s, ctx, PROTO_E_INVALID_PARAMS, T, "LoRA adapters are not served here (max_loras is 0)");
        return;
    }
    const lr_entry *e = lr_find(s->env->loras, b->name.ptr);
    if (b->version == 0 || (e && b->version <= e->version)) {
        snprintf(why, sizeof why, "adapter '%s' version %llu is not above the resident version %llu; versions "
                 "only increase (and start at 1)", b->name.ptr, (unsigned long long)b->version,
                 (unsigned long long)(e ? e->version : 0));
        reply_error(s, ctx, PROTO_E_STALE_VERSION, T, why);
        return;
    }
    if (b->window == 0 || b->max_chunk_bytes == 0 || b->n_tensors == 0 || b->rank == 0 ||
        b->rank > (uint64_t)cfg->max_lora_rank || !isfinite(b->lora_alpha)) {
        snprintf(why, sizeof why, "ADAPTER_BEGIN has window %u, max_chunk_bytes %u, n_tensors %u, rank %u, "
                 "lora_alpha %g; expected each >= 1, rank at most max_lora_rank %lld and a finite alpha",
                 b->window, b->max_chunk_bytes, b->n_tensors, b->rank, (double)b->lora_alpha,
                 (long long)cfg->max_lora_rank);
        reply_error(s, ctx, PROTO_E_INVALID_PARAMS, T, why);
        return;
    }
    upd_spec *specs = calloc(b->n_tensors, sizeof *specs);
    if (!specs) {
        reply_error(s, ctx, PROTO_E_BUSY, T, "out of memory for the manifest; retry later");
        return;
    }
    uint32_t n_delta = 0;
    uint64_t base_version = 0;
    for (uint32_t i = 0; i < b->n_tensors; i++) {
        const proto_tensor *t = &b->tensors[i];
        const int delta = (t->flags & PROTO_TENSOR_DELTA) != 0;
        if (delta && n_delta++ == 0)
            base_version = t->base_version;
        if (delta && t->base_version != base_version) {
            snprintf(why, sizeof why, "delta tensor '%.200s' has base_version %llu, another delta of this manifest "
                     "%llu; expected one base per transfer", t->name.ptr, (unsigned long long)t->base_version,
                     (unsigned long long)base_version);
            free(specs);
            reply_error(s, ctx, PROTO_E_INVALID_PARAMS, T, why);
            return;
        }
        specs[i] = (upd_spec){.name = t->name.ptr, .dtype = convert_dtype(t->dtype), .n_dims = t->n_dims,
                              .nbytes = t->nbytes, .crc32c = t->crc32c, .delta = delta, .wire_bytes = t->wire_bytes};
        memcpy(specs[i].shape, t->shape, sizeof specs[i].shape);
    }
    upd_stage *st;
    int rc = upd_stage_create(NULL, specs, (int32_t)b->n_tensors, b->total_bytes,
                              (uint64_t)cfg->max_staging_bytes, &st);
    free(specs);
    if (rc) {
        reply_error(s, ctx, rc == RD_ENOMEM ? PROTO_E_BUSY : PROTO_E_INVALID_PARAMS, T, rd_errmsg());
        return;
    }
    if (n_delta) { /* the bases: this daemon's bytes of the adapter as pushed at base_version (§10.15) */
        int held = lh_check(&s->lora_held, b->name.ptr, base_version, st, why, sizeof why);
        if (held != LH_OK) {
            upd_stage_free(st);
            reply_error(s, ctx, held == LH_BASE_MISMATCH ? PROTO_E_BASE_MISMATCH : PROTO_E_DTYPE_MISMATCH, T, why);
            return;
        }
    }
    /* The loader's checks on the manifest now, so nothing is staged for an adapter that cannot load. */
    st_tensor *tens = adapter_tensors(st, NULL);
    rc = tens ? lora_load_tensors(b->name.ptr, (int32_t)b->rank, b->lora_alpha, (b->flags & PROTO_ADAPTER_RSLORA) != 0,
                                  tens, (size_t)st->n, &s->env->m->cfg, (int32_t)cfg->max_lora_rank, NULL)
              : rd_fail(RD_ENOMEM, "out of memory for the manifest; retry later");
    free(tens);
    if (rc) {
        upd_stage_free(st);
        reply_error(s, ctx, rc == RD_ENOMEM ? PROTO_E_BUSY : PROTO_E_INVALID_PARAMS, T, rd_errmsg());
        return;
    }
    xfer *x = new_xfer(s, st, b->client_id, b->version, b->window, b->max_chunk_bytes, pipe);
    if (!x) {
        reply_error(s, ctx, PROTO_E_BUSY, T, "out of memory; retry later");
        return;
    }
    x->adapter = 1;
    x->n_delta = n_delta;
    for (int32_t i = 0; i < st->n; i++)
        if (st->t[i].delta)
            x->delta_elems += st->t[i].nbytes / proto_dtype_size(b->tensors[i].dtype);
    snprintf(x->lora_name, sizeof x->lora_name, "%s", b->name.ptr);
    x->lora_rank = (int32_t)b->rank;
    x->lora_alpha = b->lora_alpha;
    x->lora_rslora = (b->flags & PROTO_ADAPTER_RSLORA) != 0;
    s->open = x;
    log_line("LoRA adapter '%s' push of version %llu begun: rank %d, alpha %g%s, %u tensors (%u deltas against %llu), "
             "%llu bytes, window %u", x->lora_name, (unsigned long long)x->version, x->lora_rank,
             (double)x->lora_alpha, x->lora_rslora ? " (rsLoRA)" : "", b->n_tensors, n_delta,
             (unsigned long long)base_version, (unsigned long long)x->bytes, x->window);
    reply_begin_ok(s, ctx, PROTO_ADAPTER_BEGIN_OK, x);
}

/* ---- UPDATE_CHUNK ---- */

/* Sends a chunk's reply where it came from (NNG or the lane). */
static void answer(xfer_state *s, const xfer_answer *k, uint32_t code, const char *why, const proto_update_chunk_ok *ok)
{
    if (k->lane.send) {
        k->lane.send(k->lane.arg, code, why, ok);
        return;
    }
    if (code) {
        reply_error(s, k->ctx, code, PROTO_UPDATE_CHUNK, why);
        return;
    }
    proto_msg m = {.type = PROTO_UPDATE_CHUNK_OK};
    m.update_chunk_ok = *ok;
    reply_msg(s, k->ctx, &m);
}

/* Remembers a verified chunk for the relay (the first one, or one sent to
 * reroute around a dead daemon, replays the whole log). */
static int log_chunk(xfer *x, const proto_update_chunk *c)
{
    if (x->n_log == x->cap_log) {
        uint32_t cap = x->cap_log ? 2 * x->cap_log : 256;
        relay_chunk *n = realloc(x->log, (size_t)cap * sizeof *n);
        if (!n)
            return RD_ENOMEM; /* the relay then never sees this chunk: the next daemon's PREPARE shows the gap */
        x->log = n;
        x->cap_log = cap;
    }
    x->log[x->n_log++] = (relay_chunk){.tensor_index = c->tensor_index, .len = c->len, .crc32c = c->crc32c,
                                       .offset = c->offset};
    x->log_bytes += c->len;
    return 0;
}

static void chunk_work(uv_work_t *w)
{
    chunk_job *j = w->data;
    upd_tensor *t = &j->x->st->t[j->c.tensor_index];
    if (j->in_place)
        j->rc = upd_chunk_check(j->x->st, j->c.tensor_index, j->c.offset, t->data + j->c.offset, j->c.len,
                                j->c.crc32c);
    else
        j->rc = upd_chunk_fill(j->x->st, j->c.tensor_index, j->c.offset, j->c.data, j->c.len, j->c.crc32c);
    if (j->rc)
        snprintf(j->err, sizeof j->err, "%s", rd_errmsg());
}

static void start_prequant(xfer_state *s, xfer *x, uint32_t ti);

static void chunk_done(uv_work_t *w, int status)
{
    chunk_job *j = w->data;
    xfer_state *s = j->s;
    xfer *x = j->x;
    if (j->msg)
        nng_msg_free(j->msg);
    x->inflight--;
    if (x->dead) {
        answer(s, &j->sink, PROTO_E_UNEXPECTED, "the transfer was aborted while this chunk was staged", NULL);
        xfer_maybe_free(x);
        free(j);
        return;
    }
    int ok = status == 0 && j->rc == 0;
    upd_chunk_settle(x->st, j->c.tensor_index, j->c.offset, ok);
    if (ok)
        start_prequant(s, x, j->c.tensor_index);
    x->t_last_us = now_us();
    if (ok && log_chunk(x, &j->c) == 0 && x->relay)
        relay_kick(x->relay);
    if (!ok) {
        answer(s, &j->sink, j->rc == RD_ECHECKSUM ? PROTO_E_CHECKSUM : PROTO_E_INTERNAL,
                   status ? "the chunk's staging job was cancelled" : j->err, NULL);
    } else {
        proto_update_chunk_ok r = {.xfer_id = x->id, .chunk_seq = j->c.chunk_seq,
                                   .bytes_staged = x->st->staged_bytes, .total_bytes = x->st->total_bytes};
        answer(s, &j->sink, 0, NULL, &r);
    }
    free(j);
    if (s->room) /* the lane's readers paused for the window may go on */
        s->room(s->room_arg);
}

/* Claims a chunk by its head (the NNG path and the lane's): 0 and *dest =
 * where its bytes go in the staging area (or *dup: already staged), else a
 * PROTO_E_* code with why. Then chunk_queue once the bytes are there, or
 * chunk_abandon if they never arrive. */
static int chunk_claim(xfer_state *s, const proto_update_chunk *c, xfer **xo, uint8_t **dest, int *dup, char *why,
                       size_t why_cap)
{
    *xo = NULL;
    *dest = NULL;
    *dup = 0;
    xfer *x = s->open;
    if (!x || x->id != c->xfer_id || x->committing || !x->st) {
        snprintf(why, why_cap, "UPDATE_CHUNK for xfer_id %016llx: %s", (unsigned long long)c->xfer_id,
                 x && x->id == c->xfer_id ? "the transfer is committing or built; no more chunks"
                                          : "no such open transfer (UPDATE_BEGIN first; it may have been aborted)");
        return PROTO_E_UNEXPECTED;
    }
    x->t_last_us = now_us();
    cl_client *cl = cl_find(s->env->clients, x->client_id);
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

static void chunk_duplicate(xfer_state *s, xfer *x, const proto_update_chunk *c, const xfer_answer *sink)
{
    proto_update_chunk_ok r = {.xfer_id = x->id, .chunk_seq = c->chunk_seq, .flags = PROTO_CHUNK_OK_DUPLICATE,
                               .bytes_staged = x->st->staged_bytes, .total_bytes = x->st->total_bytes};
    answer(s, sink, 0, NULL, &r);
}

/* Queues the check (and for NNG the copy) of a claimed chunk; the reply goes
 * to sink when it is done. */
static void chunk_queue(xfer_state *s, xfer *x, const proto_update_chunk *c, nng_msg *msg, int in_place,
                        const xfer_answer *sink)
{
    chunk_job *j = calloc(1, sizeof *j);
    if (j) {
        j->w.data = j;
        j->s = s;
        j->x = x;
        j->sink = *sink;
        j->msg = msg;
        j->in_place = in_place;
        j->c = *c;
    }
    if (!j || uv_queue_work(s->env->loop, &j->w, chunk_work, chunk_done)) {
        x->inflight--;
        upd_chunk_settle(x->st, c->tensor_index, c->offset, 0);
        if (msg)
            nng_msg_free(msg);
        free(j);
        answer(s, sink, PROTO_E_INTERNAL, "cannot queue the chunk's staging job", NULL);
    }
}

static void chunk_abandon(xfer_state *s, xfer *x, const proto_update_chunk *c)
{
    x->inflight--;
    if (x->dead) {
        xfer_maybe_free(x);
        return;
    }
    upd_chunk_settle(x->st, c->tensor_index, c->offset, 0);
}

void xfer_on_chunk(xfer_state *s, br_ctx *ctx, const proto_update_chunk *c, nng_msg *msg)
{
    char why[600];
    xfer_answer sink = {.ctx = ctx};
    xfer *x;
    uint8_t *dest;
    int dup;
    uint32_t code = chunk_claim(s, c, &x, &dest, &dup, why, sizeof why);
    if (code) {
        nng_msg_free(msg);
        answer(s, &sink, code, why, NULL);
        return;
    }
    if (dup) {
        nng_msg_free(msg);
        chunk_duplicate(s, x, c, &sink);
        return;
    }
    if ((uint32_t)x->inflight > x->window) {
        snprintf(why, sizeof why, "%d chunks are being staged (the window is %u); resend chunk %u after a reply",
                 x->inflight - 1, x->window, c->chunk_seq);
        chunk_abandon(s, x, c);
        nng_msg_free(msg);
        answer(s, &sink, PROTO_E_BUSY, why, NULL);
        return;
    }
    chunk_queue(s, x, c, msg, 0, &sink);
}

/* ---- the data lane's sink (lane_server.h): sink_* ---- */

static int sink_claim(void *ctx, const proto_update_chunk *c, void **hold, uint8_t **dest, int *dup, char *why,
                      size_t why_cap)
{
    xfer *x;
    int code = chunk_claim(ctx, c, &x, dest, dup, why, why_cap);
    *hold = x; /* alive while the range is claimed: chunk_claim counted it in inflight */
    return code;
}

static void sink_filled(void *ctx, void *hold, const proto_update_chunk *c, const lane_answer *a)
{
    xfer_answer sink = {.lane = *a};
    chunk_queue(ctx, hold, c, NULL, 1, &sink);
}

static void sink_abandon(void *ctx, void *hold, const proto_update_chunk *c) { chunk_abandon(ctx, hold, c); }

static int sink_is_open(void *ctx, uint64_t xfer_id)
{
    const xfer_state *s = ctx;
    return s->open && s->open->id == xfer_id;
}

static void sink_duplicate(void *ctx, const proto_update_chunk *c, const lane_answer *a)
{
    xfer_state *s = ctx;
    xfer_answer sink = {.lane = *a};
    chunk_duplicate(s, s->open, c, &sink);
}

static int sink_has_room(void *ctx)
{
    const xfer_state *s = ctx;
    return !s->open || (uint32_t)s->open->inflight < s->open->window;
}

static void sink_watch_room(void *ctx, void (*room)(void *arg), void *arg)
{
    xfer_state *s = ctx;
    s->room = room;
    s->room_arg = arg;
}

lane_sink xfer_lane_sink(xfer_state *s)
{
    return (lane_sink){.claim = sink_claim, .filled = sink_filled, .abandon = sink_abandon, .is_open = sink_is_open,
                       .duplicate = sink_duplicate, .has_room = sink_has_room, .watch_room = sink_watch_room,
                       .ctx = s};
}

/* ---- UPDATE_COMMIT ---- */

static void free_work(uv_work_t *w)
{
    free_job *j = w->data;
    upd_patch_free(j->be, j->patch);
}

static void free_done(uv_work_t *w, int status) { free(w->data); }

/* Frees the replaced weights off the loop thread (large munmaps). */
static void free_patch_later(xfer_state *s, upd_patch *p)
{
    free_job *j = calloc(1, sizeof *j);
    if (j) {
        j->w.data = j;
        j->be = s->env->m->be;
        j->patch = p;
    }
    if (!j || uv_queue_work(s->env->loop, &j->w, free_work, free_done)) {
        upd_patch_free(s->env->m->be, p);
        free(j);
    }
}

static void build_work(uv_work_t *w)
{
    build_job *j = w->data;
    const xfer *x = j->x;
    if (x->adapter) {
        /* Its final bytes first (deltas applied against the held base, checked), then the adapter from them. */
        j->rc = lh_build(&j->s->lora_held, x->lora_name, x->version, x->st, &j->lora_bytes, &j->changed);
        st_tensor *t = j->rc ? NULL : adapter_tensors(x->st, j->lora_bytes->bytes);
        if (!j->rc)
            j->rc = t ? lora_load_tensors(x->lora_name, x->lora_rank, x->lora_alpha, x->lora_rslora, t,
                                          (size_t)x->st->n, &j->s->env->m->cfg,
                                          (int32_t)j->s->env->cfg->max_lora_rank, &j->adapter)
                      : rd_fail(RD_ENOMEM, "out of memory building the adapter");
        free(t);
        if (j->rc)
            snprintf(j->err, sizeof j->err, "%s", rd_errmsg());
        return;
    }
    /* Deltas are applied to the served bytes first, on the pool (the model is only read). */
    j->rc = j->x->n_delta ? upd_delta_apply(j->s->env->m, j->x->st) : 0;
    /* A serve_dtype other than as_pushed quantizes here, on this worker thread, off the engine's. */
    if (!j->rc)
        j->rc = upd_build(j->s->env->m, j->x->st, convert_serve_upd(j->x->serve), &j->patch);
    if (j->rc)
        snprintf(j->err, sizeof j->err, "%s", rd_errmsg());
}

/* Hands a built adapter to the engine thread, which loads it under its name
 * between two steps; xfer_on_lora answers the COMMIT then. */
static void swap_in_adapter(xfer_state *s, xfer *x)
{
    lora_adapter *a = x->built;
    x->built = NULL;
    if (et_lora_put(s->env->et, XFER_LORA_KEY, x->lora_name, a, x->version)) {
        lora_free(a);
        br_ctx *ctx = x->commit_ctx;
        x->committing = 0;
        abort_xfer_code(s, PROTO_E_INTERNAL, "out of memory queueing the adapter's load");
        reply_error(s, ctx, PROTO_E_INTERNAL, PROTO_UPDATE_COMMIT, "out of memory queueing the adapter's load");
    }
}

/* Hands a built patch to the engine thread, which swaps it in at a step
 * boundary; xfer_on_wake answers the COMMIT then. */
static void swap_in(xfer_state *s, xfer *x, upd_patch *patch)
{
    if (et_apply_update(s->env->et, s->env->m, patch, x->version, convert_mode(x->mode))) {
        upd_patch_free(s->env->m->be, patch);
        br_ctx *ctx = x->commit_ctx;
        x->committing = 0;
        abort_xfer_code(s, PROTO_E_INTERNAL, "out of memory queueing the swap");
        reply_error(s, ctx, PROTO_E_INTERNAL, PROTO_UPDATE_COMMIT, "out of memory queueing the swap");
    }
}

static void build_done(uv_work_t *w, int status)
{
    build_job *j = w->data;
    xfer_state *s = j->s;
    xfer *x = j->x;
    upd_patch *patch = j->patch;
    lora_adapter *adapter = j->adapter;
    lh_adapter *lora_bytes = j->lora_bytes;
    uint64_t changed = j->changed;
    int rc = status ? RD_EINVAL : j->rc;
    char why[600];
    snprintf(why, sizeof why, "%s", status ? "the conversion job was cancelled" : j->err);
    free(j);
    x->inflight--;
    x->building = 0;
    if (x->dead) { /* aborted while building (a PREPARE's build: no COMMIT waits) */
        if (patch)
            free_patch_later(s, patch);
        lora_free(adapter);
        lh_adapter_free(lora_bytes);
        xfer_maybe_free(x);
        return;
    }
    uint32_t code = rc == RD_EINVAL || rc == RD_EFORMAT ? PROTO_E_INVALID_PARAMS
                  : rc == RD_ECHECKSUM ? PROTO_E_CHECKSUM : PROTO_E_INTERNAL;
    upd_held_free(x->held_next);
    x->held_next = NULL;
    if (!rc && s->held && !x->adapter && upd_held_copy(s->held, &x->held_next) == 0)
        upd_held_note(x->held_next, &s->env->m->cfg, x->st, convert_serve_upd(x->serve));
    if (!rc)
        x->delta_changed = x->st->delta_changed;
    if (rc) {
        br_ctx *ctx = x->commit_ctx;
        x->committing = 0;
        abort_xfer_code(s, code, why);
        if (ctx)
            reply_error(s, ctx, code, PROTO_UPDATE_COMMIT, why);
        return;
    }
    x->t_built_us = now_us();
    /* The staging copy is no longer needed (the patch holds the weights),
     * unless a relay may still have to send it to a rerouted successor. */
    if (!x->forwarded) {
        upd_stage_free(x->st);
        x->st = NULL;
    }
    if (x->adapter) {
        x->built = adapter;
        x->lora_bytes = lora_bytes;
        x->delta_changed = changed;
        if (x->commit_ctx)
            swap_in_adapter(s, x);
        return; /* else prepared: the COMMIT hands it over */
    }
    if (x->commit_ctx)
        swap_in(s, x, patch);
    else
        x->patch = patch; /* prepared: the COMMIT swaps it in */
}

/* Every byte of the manifest verified here and no chunk in flight. */
static int staged_all(const xfer *x)
{
    return x->st && x->st->pending == 0 && x->st->staged_bytes == x->st->total_bytes;
}

/* Verifies the staged tensors and queues their conversion. 0, or a PROTO_E_*
 * code with the transfer aborted and why filled. */
static uint32_t start_build(xfer_state *s, xfer *x, char *why, size_t why_cap)
{
    int rc = upd_stage_verify(x->st);
    if (rc) {
        uint32_t code = rc == RD_ECHECKSUM ? PROTO_E_CHECKSUM : PROTO_E_INVALID_PARAMS;
        snprintf(why, why_cap, "%s", rd_errmsg());
        abort_xfer_code(s, code, why);
        return code;
    }
    build_job *j = calloc(1, sizeof *j);
    if (!j) {
        snprintf(why, why_cap, "out of memory; repeat the request");
        return PROTO_E_BUSY;
    }
    j->w.data = j;
    j->s = s;
    j->x = x;
    x->building = 1;
    x->t_build_us = now_us();
    x->inflight++; /* the job reads st: an abort meanwhile must not free it */
    if (x->prefaulting || x->prequant) { /* prefault_done or the last prequant_done queues it */
        x->build_waiting = j;
        return 0;
    }
    if (uv_queue_work(s->env->loop, &j->w, build_work, build_done)) {
        free(j);
        x->building = 0;
        x->inflight--;
        snprintf(why, why_cap, "cannot queue the conversion job");
        return PROTO_E_INTERNAL;
    }
    return 0;
}

/* ---- a delta's new-bytes mapping, touched while the chunks arrive ---- */

typedef struct {
    uv_work_t w;
    xfer_state *s;
    xfer *x;
} prefault_job;

static void prefault_work(uv_work_t *w)
{
    prefault_job *j = w->data;
    upd_delta_prefault(j->x->st);
}

static void queue_waiting_build(xfer_state *s, xfer *x);

static void prefault_done(uv_work_t *w, int status)
{
    prefault_job *j = w->data;
    xfer_state *s = j->s;
    xfer *x = j->x;
    free(j);
    x->inflight--;
    x->prefaulting = 0;
    queue_waiting_build(s, x);
}

/* The build a COMMIT or PREPARE queued while workers still wrote what it
 * reads (the delta mapping, prequantized blocks), once they all have. */
static void queue_waiting_build(xfer_state *s, xfer *x)
{
    if (x->prefaulting || x->prequant) {
        xfer_maybe_free(x);
        return;
    }
    build_job *b = x->build_waiting;
    x->build_waiting = NULL;
    if (b && uv_queue_work(s->env->loop, &b->w, build_work, build_done)) {
        free(b);
        x->inflight--;
        x->building = 0;
        br_ctx *ctx = x->commit_ctx;
        x->committing = 0;
        abort_xfer_code(s, PROTO_E_INTERNAL, "cannot queue the conversion job");
        if (ctx)
            reply_error(s, ctx, PROTO_E_INTERNAL, PROTO_UPDATE_COMMIT, "cannot queue the conversion job");
        return;
    }
    xfer_maybe_free(x);
}

/* ---- quantization while the push arrives (serve_dtype other than as_pushed) ---- */

typedef struct {
    uv_work_t w;
    xfer_state *s;
    xfer *x;
    uint32_t ti;
    int made;
} prequant_job;

static void prequant_work(uv_work_t *w)
{
    prequant_job *j = w->data;
    j->made = upd_prequant(&j->s->env->m->cfg, &j->x->st->t[j->ti], convert_serve_upd(j->x->serve));
}

static void prequant_done(uv_work_t *w, int status)
{
    prequant_job *j = w->data;
    xfer_state *s = j->s;
    xfer *x = j->x;
    x->n_prequant += status == 0 && j->made;
    free(j);
    x->prequant--;
    queue_waiting_build(s, x);
}

/* Tensor ti has just been staged whole: when the push's serve_dtype
 * quantizes it, a worker does so now (upd_prequant), not the COMMIT's build.
 * Off for a COMMIT already waiting (its build is queued) and without a stage. */
static void start_prequant(xfer_state *s, xfer *x, uint32_t ti)
{
    upd_tensor *t = x->st ? &x->st->t[ti] : NULL;
    if (!t || t->staged != t->wire || t->delta || x->building || x->dead || x->adapter ||
        convert_serve_upd(x->serve) == UPD_SERVE_AS_PUSHED || !upd_kind_quantized(&s->env->m->cfg, t->kind,
                                                                                  convert_serve_upd(x->serve)))
        return;
    prequant_job *j = calloc(1, sizeof *j);
    if (!j)
        return;
    j->w.data = j;
    j->s = s;
    j->x = x;
    j->ti = ti;
    x->prequant++;
    if (uv_queue_work(s->env->loop, &j->w, prequant_work, prequant_done)) {
        free(j);
        x->prequant--;
    }
}

/* Maps the delta's new-bytes memory and touches it on a worker (its zeroing by the
 * kernel is then off the build's path); without the mapping the build maps it itself. */
static void start_prefault(xfer_state *s, xfer *x)
{
    prefault_job *j = calloc(1, sizeof *j);
    if (!j || upd_delta_map(&s->env->m->cfg, x->st)) {
        free(j);
        return;
    }
    j->w.data = j;
    j->s = s;
    j->x = x;
    x->inflight++;
    x->prefaulting = 1;
    if (uv_queue_work(s->env->loop, &j->w, prefault_work, prefault_done)) {
        free(j);
        x->inflight--;
        x->prefaulting = 0;
    }
}

/* The reply to a request naming a transfer that is not open: the reason the
 * last one was aborted, when it is that one. */
static void reply_not_open(xfer_state *s, br_ctx *ctx, uint16_t type, uint64_t xfer_id)
{
    char why[800];
    if (xfer_id != 0 && xfer_id == s->last_aborted_xfer) {
        snprintf(why, sizeof why, "%s for xfer_id %016llx: the transfer was aborted: %s", proto_type_name(type),
                 (unsigned long long)xfer_id, s->last_abort_why);
        reply_error(s, ctx, s->last_abort_code ? s->last_abort_code : PROTO_E_UNEXPECTED, type, why);
        return;
    }
    snprintf(why, sizeof why, "%s for xfer_id %016llx: no such open transfer (UPDATE_BEGIN first, or the transfer "
             "was aborted)", proto_type_name(type), (unsigned long long)xfer_id);
    reply_error(s, ctx, PROTO_E_UNEXPECTED, type, why);
}

void xfer_on_commit(xfer_state *s, br_ctx *ctx, const proto_update_ref *r)
{
    char why[600];
    if (r->xfer_id != 0 && r->xfer_id == s->last_commit_xfer) {
        proto_msg m = {.type = PROTO_UPDATE_COMMIT_OK};
        m.update_commit_ok = s->last_commit_ok;
        reply_msg(s, ctx, &m);
        return;
    }
    xfer *x = s->open;
    if (!x || x->id != r->xfer_id) {
        reply_not_open(s, ctx, PROTO_UPDATE_COMMIT, r->xfer_id);
        return;
    }
    if (x->committing) {
        reply_error(s, ctx, PROTO_E_BUSY, PROTO_UPDATE_COMMIT,
                    "this transfer is already committing; repeat the COMMIT later for its result");
        return;
    }
    if (x->built) { /* an adapter prepared: only its load is left */
        x->committing = 1;
        x->commit_ctx = ctx;
        x->t_commit_us = now_us();
        swap_in_adapter(s, x);
        return;
    }
    if (x->patch) { /* prepared (§10.11): only the swap is left */
        upd_patch *p = x->patch;
        x->patch = NULL;
        x->committing = 1;
        x->commit_ctx = ctx;
        x->t_commit_us = now_us();
        swap_in(s, x, p);
        return;
    }
    if (!x->building) {
        uint32_t code = start_build(s, x, why, sizeof why);
        if (code) {
            reply_error(s, ctx, code, PROTO_UPDATE_COMMIT, why);
            return;
        }
    }
    /* The build (this COMMIT's or a PREPARE's) swaps when it is done. */
    x->committing = 1;
    x->commit_ctx = ctx;
    x->t_commit_us = now_us();
}

/* ---- UPDATE_PREPARE and UPDATE_FORWARD: the chain (§10.11) ---- */

static void fill_prepare_ok(const xfer *x, proto_update_prepare_ok *ok)
{
    memset(ok, 0, sizeof *ok);
    ok->xfer_id = x->id;
    ok->state = x->patch || x->built || x->committing ? PROTO_PREP_READY : x->building ? PROTO_PREP_BUILDING
                                                                          : PROTO_PREP_STAGING;
    ok->bytes_staged = x->st ? x->st->staged_bytes : x->bytes;
    ok->total_bytes = x->bytes;
    if (x->relay)
        relay_state(x->relay, &ok->forward, &ok->forward_error, &ok->forwarded_bytes);
}

void xfer_on_prepare(xfer_state *s, br_ctx *ctx, const proto_update_ref *r)
{
    char why[600];
    xfer *x = s->open;
    if (!x || x->id != r->xfer_id) {
        if (r->xfer_id != 0 && r->xfer_id == s->last_commit_xfer) {
            reply_error(s, ctx, PROTO_E_UNEXPECTED, PROTO_UPDATE_PREPARE,
                        "UPDATE_PREPARE: this transfer is committed and serving already");
            return;
        }
        reply_not_open(s, ctx, PROTO_UPDATE_PREPARE, r->xfer_id);
        return;
    }
    x->t_last_us = now_us();
    if (!x->building && !x->patch && !x->built && !x->committing && staged_all(x)) {
        uint32_t code = start_build(s, x, why, sizeof why);
        if (code) {
            reply_error(s, ctx, code, PROTO_UPDATE_PREPARE, why);
            return;
        }
    }
    proto_msg m = {.type = PROTO_UPDATE_PREPARE_OK};
    fill_prepare_ok(x, &m.update_prepare_ok);
    reply_msg(s, ctx, &m);
}

/* ---- the relays' source (relay.h): the log of verified chunks ---- */

static const relay_chunk *src_chunks(void *ctx, uint32_t *n)
{
    const xfer *x = ctx;
    *n = x->n_log;
    return x->log;
}

static const uint8_t *src_data(void *ctx, const relay_chunk *c)
{
    const xfer *x = ctx;
    return x->st ? x->st->t[c->tensor_index].data + c->offset : NULL;
}

static int src_complete(void *ctx)
{
    const xfer *x = ctx;
    return x->st && staged_all(x);
}

/* A relay's connection is closed: it reads the staging memory no more. */
static void src_closed(void *ctx)
{
    xfer *x = ctx;
    x->relays_open--;
    xfer_maybe_free(x);
}

void xfer_on_forward(xfer_state *s, br_ctx *ctx, const proto_update_forward *f)
{
    char why[600];
    xfer *x = s->open;
    if (!x || x->id != f->xfer_id) {
        reply_not_open(s, ctx, PROTO_UPDATE_FORWARD, f->xfer_id);
        return;
    }
    x->t_last_us = now_us();
    if (f->next_xfer_id == 0) { /* stop forwarding */
        if (x->relay)
            relay_close(x->relay);
        x->relay = NULL;
        proto_msg m = {.type = PROTO_UPDATE_FORWARD_OK};
        m.update_forward_ok.xfer_id = x->id;
        reply_msg(s, ctx, &m);
        return;
    }
    if (x->committing || !x->st) {
        reply_error(s, ctx, PROTO_E_UNEXPECTED, PROTO_UPDATE_FORWARD,
                    "UPDATE_FORWARD: the transfer is committing or its staging copy is gone (built without a "
                    "forward); forward from another daemon or the learner");
        return;
    }
    if (f->port == 0 || f->window == 0 || f->host.len == 0) {
        snprintf(why, sizeof why, "UPDATE_FORWARD: port %u, window %u, host \"%s\"; expected a lane port, a window "
                 ">= 1 and the next daemon's numeric IP", f->port, f->window, f->host.ptr);
        reply_error(s, ctx, PROTO_E_INVALID_PARAMS, PROTO_UPDATE_FORWARD, why);
        return;
    }
    if (!ra_allows(&s->relay_allow, f->host.ptr, f->port)) {
        /* UPDATE_BEGIN names no chain, so the list is what bounds where a learner can make this daemon dial. */
        char allow[400];
        ra_describe(&s->relay_allow, allow, sizeof allow);
        snprintf(why, sizeof why, "UPDATE_FORWARD: %s port %u is not in relay_allow (%s); push to that daemon "
                 "directly, or add it to relay_allow", f->host.ptr, f->port, allow);
        s->relays_refused++;
        log_line("weight update to version %llu: refused to relay to %s:%u (not in relay_allow: %s)",
                 (unsigned long long)x->version, f->host.ptr, f->port, allow);
        reply_error(s, ctx, PROTO_E_FORBIDDEN, PROTO_UPDATE_FORWARD, why);
        return;
    }
    uint8_t key[PROTO_AUTH_BYTES];
    int auth = (f->flags & PROTO_FORWARD_AUTH) != 0;
    if (auth) {
        memcpy(key, f->key, sizeof key);
        uint8_t pad[PROTO_AUTH_BYTES];
        const host_secret *sec = s->env->secret;
        if (sec->len) { /* the key travels wrapped in this daemon's pad (§10.12) */
            if (proto_auth_wrap_pad((const uint8_t *)sec->bytes, sec->len, x->id, f->next_xfer_id, pad)) {
                reply_error(s, ctx, PROTO_E_INTERNAL, PROTO_UPDATE_FORWARD, rd_errmsg());
                return;
            }
            for (int i = 0; i < PROTO_AUTH_BYTES; i++)
                key[i] ^= pad[i];
        }
    }
    relay *r;
    uint32_t window = f->window < 64 ? f->window : 64;
    relay_source src = {.chunks = src_chunks, .data = src_data, .complete = src_complete, .on_closed = src_closed,
                        .ctx = x};
    if (relay_start(s->env->loop, &src, f->host.ptr, f->port, f->next_xfer_id, window, auth ? key : NULL, &r)) {
        reply_error(s, ctx, PROTO_E_INVALID_PARAMS, PROTO_UPDATE_FORWARD, rd_errmsg());
        return;
    }
    if (x->relay) /* a reroute: the new successor gets everything from the start */
        relay_close(x->relay);
    x->relay = r;
    x->relays_open++;
    x->forwarded = 1;
    log_line("weight update to version %llu: forwarding to %s:%u (transfer %016llx), %llu bytes staged so far",
             (unsigned long long)x->version, f->host.ptr, f->port, (unsigned long long)f->next_xfer_id,
             (unsigned long long)x->log_bytes);
    proto_msg m = {.type = PROTO_UPDATE_FORWARD_OK};
    m.update_forward_ok = (proto_update_forward_ok){.xfer_id = x->id, .queued_bytes = x->log_bytes};
    reply_msg(s, ctx, &m);
    relay_kick(r);
}

void xfer_on_wake(xfer_state *s)
{
    et_swapped w;
    if (!et_take_swapped(s->env->et, &w))
        return;
    *s->env->weight_version = w.version;
    if (w.old)
        free_patch_later(s, w.old);
    xfer *x = s->open;
    sh_note(s->env->serve, w.version,
            x && x->version == w.version ? x->serve : convert_serve_code(PROTO_SERVE_CONFIG, s->env->cfg->serve_dtype));
    if (!x || !x->committing || x->version != w.version) {
        log_line("weight swap to version %llu with no committing transfer", (unsigned long long)w.version);
        if (s->held)
            upd_held_clear(s->held); /* not from a transfer here: nothing is known to be held as pushed */
        return;
    }
    proto_update_commit_ok ok = {
        .version = w.version,
        .stall_us = w.stall_us,
        .wait_us = w.t_applied_us > x->t_commit_us ? w.t_applied_us - x->t_commit_us : 0,
        .staged_us = x->t_commit_us - x->t_begin_us,
        .n_aborted = (uint32_t)w.n_aborted,
    };
    if (x->held_next) { /* these tensors are now held as pushed */
        upd_held_free(s->held);
        s->held = x->held_next;
        x->held_next = NULL;
    } else if (s->held) {
        upd_held_clear(s->held); /* no record of this swap (out of memory): no delta until a full push */
    }
    record_end(s, x, 1, NULL);
    up_last *l = &s->last_update;
    l->build_us = x->t_built_us - x->t_build_us; /* a PREPARE's build may end before the COMMIT */
    l->wait_us = ok.wait_us;
    l->stall_us = ok.stall_us;
    l->n_aborted = w.n_aborted;
    int64_t steps = engine_steps(s) - x->steps_at_begin;
    l->steps_during = steps > 0 ? (uint64_t)steps : 0;
    s->update_bytes_total += x->bytes;
    s->last_commit_xfer = x->id;
    s->last_commit_ok = ok;
    log_line("weight update: version %llu serving (%llu bytes; staged %.3f s, built %.3f s, swap wait %.3f ms, "
             "stall %llu us, %d samples aborted)", (unsigned long long)w.version, (unsigned long long)x->bytes,
             (double)ok.staged_us / 1e6, (double)l->build_us / 1e6, (double)ok.wait_us / 1e3,
             (unsigned long long)ok.stall_us, w.n_aborted);
    proto_msg m = {.type = PROTO_UPDATE_COMMIT_OK};
    m.update_commit_ok = ok;
    br_ctx *ctx = x->commit_ctx;
    s->open = NULL;
    xfer_end(s, x);
    reply_msg(s, ctx, &m);
}

void xfer_on_lora(xfer_state *s, int rc, const char *msg, int32_t rank, int64_t bytes, const char *evicted)
{
    xfer *x = s->open;
    if (!x || !x->adapter || !x->committing) { /* cannot happen: a committing transfer is never aborted */
        log_line("LoRA adapter load answered with no adapter push committing (%s)", rc ? msg : "loaded");
        return;
    }
    br_ctx *ctx = x->commit_ctx;
    if (rc) {
        uint32_t code = rc == RD_EBUSY ? PROTO_E_BUSY : rc == RD_ENOMEM ? PROTO_E_INTERNAL : PROTO_E_INVALID_PARAMS;
        x->committing = 0;
        abort_xfer_code(s, code, msg);
        reply_error(s, ctx, code, PROTO_UPDATE_COMMIT, msg);
        return;
    }
    if (evicted && evicted[0]) {
        lr_remove(s->env->loras, evicted);
        log_line("LoRA adapter '%s' evicted (least recently used) for '%s'", evicted, x->lora_name);
    }
    if (x->lora_bytes) { /* the next push of it may be deltas against these bytes */
        lh_install(&s->lora_held, x->lora_bytes);
        x->lora_bytes = NULL;
    }
    if (lr_put(s->env->loras, x->lora_name, NULL, x->version, rank, bytes))
        log_line("LoRA adapter '%s': out of memory recording it; requests naming it are refused until it is "
                 "loaded again", x->lora_name);
    const uint64_t now = now_us();
    proto_update_commit_ok ok = {.version = x->version, .wait_us = now - x->t_commit_us,
                                 .staged_us = x->t_commit_us - x->t_begin_us};
    record_end(s, x, 1, NULL);
    s->last_commit_xfer = x->id;
    s->last_commit_ok = ok;
    log_line("LoRA adapter '%s' version %llu serving (pushed: %llu bytes, %u deltas changing %llu of %llu elements; "
             "staged %.3f s, built %.3f s, load %.3f ms)", x->lora_name, (unsigned long long)x->version,
             (unsigned long long)x->bytes, x->n_delta, (unsigned long long)x->delta_changed,
             (unsigned long long)x->delta_elems,
             (double)ok.staged_us / 1e6, (double)(x->t_built_us - x->t_build_us) / 1e6, (double)ok.wait_us / 1e3);
    proto_msg m = {.type = PROTO_UPDATE_COMMIT_OK};
    m.update_commit_ok = ok;
    s->open = NULL;
    xfer_end(s, x);
    reply_msg(s, ctx, &m);
}

/* ---- UPDATE_ABORT and the ways a transfer dies on its own ---- */

void xfer_on_abort(xfer_state *s, br_ctx *ctx, const proto_update_ref *r)
{
    char why[300];
    proto_msg m = {.type = PROTO_UPDATE_ABORT_OK};
    if (r->xfer_id != 0 && r->xfer_id == s->last_aborted_xfer) {
        reply_msg(s, ctx, &m);
        return;
    }
    xfer *x = s->open;
    if (!x || x->id != r->xfer_id) {
        snprintf(why, sizeof why, "UPDATE_ABORT for xfer_id %016llx: no such open transfer",
                 (unsigned long long)r->xfer_id);
        reply_error(s, ctx, PROTO_E_UNEXPECTED, PROTO_UPDATE_ABORT, why);
        return;
    }
    if (x->committing) {
        reply_error(s, ctx, PROTO_E_UPDATE_CONFLICT, PROTO_UPDATE_ABORT,
                    "the transfer is committing; it can no longer be aborted");
        return;
    }
    m.update_abort_ok.bytes_freed = x->bytes;
    abort_xfer(s, "UPDATE_ABORT from the sender");
    reply_msg(s, ctx, &m);
}

void xfer_on_pipe_closed(xfer_state *s, uint32_t pipe)
{
    if (s->open && !s->open->committing && s->open->pipe == pipe)
        abort_xfer(s, "the sender's connection closed mid-transfer");
}

void xfer_on_tick(xfer_state *s)
{
    if (s->open && s->open->relay)
        relay_tick(s->open->relay);
    xfer *x = s->open;
    if (x && !x->committing && now_us() - x->t_last_us > (uint64_t)s->env->cfg->update_idle_s * 1000000u)
        abort_xfer(s, "no message of the transfer for update_idle_s");
}

void xfer_on_client_forgotten(xfer_state *s, uint64_t client_id)
{
    if (s->open && !s->open->committing && s->open->client_id == client_id)
        abort_xfer(s, "the sending client was forgotten");
}

int xfer_active(const xfer_state *s) { return s->open != NULL; }

void xfer_progress(const xfer_state *s, int *active, uint64_t *version, uint64_t *staged, uint64_t *total,
                   int *committing)
{
    const xfer *x = s->open;
    *active = x != NULL;
    *version = x ? x->version : 0;
    *staged = x && x->st ? x->st->staged_bytes : x ? x->bytes : 0;
    *total = x ? x->bytes : 0;
    *committing = x ? x->committing : 0;
}
