/* rd_push.c - see rd_push.h. The plan, the direct fan-out and the choice
 * between it and the chain (rd_chain.c); the steps both modes take on one
 * daemon are rd_push_job.c's. */
#include "client/rd_push.h"

#include "engine/model/loader.h"
#include "engine/model/model.h"
#include "engine/format/safetensors.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/crc32c.h"
#include "base/err.h"
#include "base/clock.h"
#include "client/rd_client.h"
#include "client/rd_push_priv.h"

#define RDP_CHUNK_TIMEOUT_MS 60000
#define RDP_MAX_RESENDS 100

/* One slot of the window: takes chunks until none are left. */
static void *slot_main(void *arg)
{
    rdp_job *j = arg;
    const rdp_plan *p = j->p;
    rdc_stream *s;
    int rc = rdc_stream_open(j->c, &s);
    if (rc) {
        rdp_fail_job(j, rc, 0, rd_errmsg());
        return NULL;
    }
    for (;;) {
        uint32_t i = atomic_fetch_add(&j->next, 1);
        if (i >= p->n_chunks || atomic_load(&j->failed))
            break;
        const rdp_chunk *ch = &p->chunks[i];
        proto_msg q = {.type = PROTO_UPDATE_CHUNK};
        q.update_chunk = (proto_update_chunk){.xfer_id = j->xfer, .chunk_seq = i, .tensor_index = ch->tensor,
                                              .offset = ch->off, .crc32c = ch->crc, .len = ch->len,
                                              .data = p->tensors[ch->tensor].data + ch->off};
        for (int attempt = 0;; attempt++) {
            proto_msg r;
            atomic_fetch_add(&j->wire, (uint64_t)PROTO_HEADER_BYTES + 32 + ch->len);
            rc = rdc_stream_call(s, &q, PROTO_UPDATE_CHUNK_OK, RDP_CHUNK_TIMEOUT_MS, &r);
            if (rc == 0) {
                proto_msg_free(&r);
                atomic_fetch_add(&j->acked, ch->len);
                break;
            }
            uint32_t code = rdc_stream_error_code(s);
            /* BUSY (window full), a damaged chunk and a lost reply are all safe to resend. */
            int again = rc == RDC_ETIMEDOUT || (rc == RDC_EDAEMON && (code == PROTO_E_BUSY || code == PROTO_E_CHECKSUM));
            if (!again || attempt >= RDP_MAX_RESENDS) {
                rdp_fail_job(j, rc, code, rd_errmsg());
                break;
            }
            atomic_fetch_add(&j->retries, 1);
            if (code == PROTO_E_BUSY)
                nanosleep(&(struct timespec){0, 2000000}, NULL);
        }
    }
    rdc_stream_close(s);
    return NULL;
}

/* One daemon of a direct push, start to end. */
static void *target_main(void *arg)
{
    rdp_job *j = arg;
    rdp_target *t = j->t;
    double t0 = clock_now_s();
    if (!j->c || rdp_begin(j))
        goto out; /* no connection (rdp_push recorded why), or refused (recorded) */
    double t_xfer = clock_now_s();
    if (j->lane_port) {
        rdp_lane_send(j, t->url);
    } else {
        pthread_t slots[1024];
        uint32_t n = j->window < 1024 ? j->window : 1024, started = 0;
        for (uint32_t i = 0; i < n; i++)
            if (pthread_create(&slots[started], NULL, slot_main, j) == 0)
                started++;
        if (started == 0)
            rdp_fail_job(j, RD_ENOMEM, 0, "cannot start a sender thread");
        for (uint32_t i = 0; i < started; i++)
            pthread_join(slots[i], NULL);
    }
    if (atomic_load(&j->failed)) {
        rdp_abort(j);
        goto out;
    }
    t->transfer_seconds = clock_now_s() - t_xfer;
    rdp_commit(j);
out:
    t->bytes_acked = atomic_load(&j->acked);
    t->wire_bytes = atomic_load(&j->wire);
    t->retries = atomic_load(&j->retries);
    t->seconds = clock_now_s() - t0;
    rdc_close(j->c);
    j->c = NULL;
    atomic_store(&j->done, 1);
    return NULL;
}

/* Splits every tensor into chunks and checksums them, once for all daemons. */
static int make_plan(rdp_plan *p, const rdp_tensor *ts, int n, const rdp_options *o)
{
    memset(p, 0, sizeof *p);
    p->tensors = ts;
    p->n_tensors = n;
    p->o = o;
    if (n < 1)
        return rd_fail(RD_EINVAL, "push: no tensors to push");
    uint64_t n_chunks = 0;
    for (int i = 0; i < n; i++) {
        if (!ts[i].nbytes)
            return rd_fail(RD_EINVAL, "push: tensor '%s' is empty", ts[i].name);
        n_chunks += (ts[i].nbytes + o->chunk_bytes - 1) / o->chunk_bytes;
        p->total += ts[i].nbytes;
    }
    if (n_chunks > UINT32_MAX)
        return rd_fail(RD_ERANGE, "push: %llu chunks; use larger chunks", (unsigned long long)n_chunks);
    p->manifest = calloc((size_t)n, sizeof *p->manifest);
    p->chunks = calloc(n_chunks ? (size_t)n_chunks : 1, sizeof *p->chunks);
    if (!p->manifest || !p->chunks)
        return rd_fail(RD_ENOMEM, "push: out of memory for the plan");
    for (int i = 0; i < n; i++) {
        const rdp_tensor *t = &ts[i];
        uint32_t crc = 0;
        for (uint64_t off = 0; off < t->nbytes; off += o->chunk_bytes) {
            uint64_t len = t->nbytes - off < o->chunk_bytes ? t->nbytes - off : o->chunk_bytes;
            rdp_chunk *c = &p->chunks[p->n_chunks++];
            *c = (rdp_chunk){.tensor = (uint32_t)i, .off = off, .len = (uint32_t)len};
            c->crc = crc32c(0, t->data + off, (size_t)len);
            crc = crc32c_combine(crc, c->crc, len);
        }
        proto_tensor *m = &p->manifest[i];
        m->name = (proto_str){t->name, (uint32_t)strlen(t->name)};
        m->dtype = t->dtype;
        m->n_dims = t->n_dims;
        memcpy(m->shape, t->shape, sizeof m->shape);
        m->nbytes = t->nbytes;
        m->crc32c = crc;
        if (t->flags & PROTO_TENSOR_DELTA) { /* the chunks carry the stream; the manifest says the new bytes */
            m->flags = PROTO_TENSOR_DELTA;
            m->nbytes = t->full_bytes;
            m->crc32c = t->full_crc;
            m->wire_bytes = t->nbytes;
            m->base_version = t->base_version;
            p->any_delta = 1;
        }
    }
    return 0;
}

static void print_progress(rdp_job *jobs, int n, double t0, int final)
{
    double dt = clock_now_s() - t0;
    fputc('\r', stderr);
    for (int i = 0; i < n; i++) {
        uint64_t a = atomic_load(&jobs[i].acked), tot = jobs[i].p->total;
        fprintf(stderr, "%s%s %5.1f%% %.0f/%.0f MB %.0f MB/s", i ? " | " : "", jobs[i].t->url,
                tot ? 100.0 * (double)a / (double)tot : 100.0, (double)a / 1e6, (double)tot / 1e6,
                dt > 0 ? (double)a / 1e6 / dt : 0.0);
    }
    fputs(final ? "\n" : "   ", stderr);
    fflush(stderr);
}

static void push_direct(rdp_job *jobs, int n_targets, const rdp_options *o, double t0)
{
    for (int i = 0; i < n_targets; i++) {
        rdp_job *j = &jobs[i];
        j->t->fanout = RDP_FANOUT_DIRECT;
        j->t->hop = 0;
        if (pthread_create(&j->thread, NULL, target_main, j)) {
            rdp_fail_job(j, RD_ENOMEM, 0, "cannot start a push thread");
            rdc_close(j->c);
            j->c = NULL;
            atomic_store(&j->done, 1);
            j->thread = 0;
        }
    }
    if (o->progress) {
        for (;;) {
            int running = 0;
            for (int i = 0; i < n_targets; i++)
                running += jobs[i].thread && !atomic_load(&jobs[i].done);
            if (!running)
                break;
            print_progress(jobs, n_targets, t0, 0);
            nanosleep(&(struct timespec){0, 250000000}, NULL);
        }
    }
    for (int i = 0; i < n_targets; i++)
        if (jobs[i].thread)
            pthread_join(jobs[i].thread, NULL);
    if (o->progress)
        print_progress(jobs, n_targets, t0, 1);
}

/* A chain needs every daemon's relay (HELLO_OK feature bit 1) and data lane:
 * a tcp:// URL (TLS turns the lane off) and chunks allowed on it. */
static int chain_possible(const rdp_job *jobs, int n, const rdp_options *o)
{
    if (o->no_lane)
        return 0;
    for (int i = 0; i < n; i++) {
        char host[256];
        if (rdp_url_host(jobs[i].t->url, host, sizeof host))
            return 0;
        if (jobs[i].c && !(rdc_info(jobs[i].c)->features & PROTO_FEATURE_RELAY))
            return 0;
    }
    return 1;
}

int rdp_push(rdp_target *targets, int n_targets, const rdp_tensor *tensors, int n_tensors, const rdp_options *o_in)
{
    rdp_options o = *o_in;
    if (!o.window)
        o.window = 4;
    if (!o.chunk_bytes)
        o.chunk_bytes = 16u << 20;
    if (o.chunk_bytes < 4096)
        return rd_fail(RD_EINVAL, "push: chunk size %u; expected at least 4096 bytes", o.chunk_bytes);
    if (o.fanout < RDP_FANOUT_AUTO || o.fanout > RDP_FANOUT_DIRECT)
        return rd_fail(RD_EINVAL, "push: fanout %d; expected RDP_FANOUT_AUTO, _CHAIN or _DIRECT", o.fanout);
    if (o.on_failure != RDP_ON_FAILURE_ABORT && o.on_failure != RDP_ON_FAILURE_COMMIT)
        return rd_fail(RD_EINVAL, "push: on_failure %d; expected RDP_ON_FAILURE_ABORT or _COMMIT", o.on_failure);
    rdp_plan p;
    memset(&p, 0, sizeof p);
    rdp_job *jobs = calloc((size_t)n_targets, sizeof *jobs);
    if (!jobs)
        return rd_fail(RD_ENOMEM, "push: out of memory");
    double t0 = clock_now_s();
    /* Connect first: chunks must fit the smallest max_message_bytes announced. */
    for (int i = 0; i < n_targets; i++) {
        rdp_job *j = &jobs[i];
        j->p = &p;
        j->t = &targets[i];
        j->t->rc = 0;
        j->t->err_code = 0;
        j->t->error[0] = 0;
        j->t->fanout = RDP_FANOUT_DIRECT;
        j->fd = -1;
        pthread_mutex_init(&j->mu, NULL);
        pthread_cond_init(&j->cv, NULL);
        int rc = rdc_open(j->t->url, &j->c);
        if (!rc && o.secret_len && !(rc = rdc_set_secret(j->c, o.secret, o.secret_len)))
            rc = rdc_auth(j->c);
        if (!rc)
            rc = rdc_hello(j->c, 0, o.client_name ? o.client_name : "rd_push");
        if (rc) {
            rdp_fail_job(j, rc, j->c ? rdc_error_code(j->c) : 0, rd_errmsg());
            rdc_close(j->c);
            j->c = NULL;
            continue;
        }
        uint64_t room = rdc_info(j->c)->max_message_bytes - 64;
        if (o.chunk_bytes > room)
            o.chunk_bytes = (uint32_t)room;
    }
    int rc = make_plan(&p, tensors, n_tensors, &o);
    int planned = rc == 0;
    if (planned) {
        for (int i = 0; i < n_targets; i++)
            targets[i].total_bytes = p.total;
        int chain = o.fanout == RDP_FANOUT_CHAIN || (o.fanout == RDP_FANOUT_AUTO && n_targets >= 2);
        /* rdp_chain answers 1 when a daemon turned out to offer no lane: then directly. */
        if (!chain || !chain_possible(jobs, n_targets, &o) || rdp_chain(jobs, n_targets, &p, t0) > 0)
            push_direct(jobs, n_targets, &o, t0);
        for (int i = 0; i < n_targets; i++)
            if (!rc && targets[i].rc)
                rc = targets[i].rc;
    }
    for (int i = 0; i < n_targets; i++) {
        rdc_close(jobs[i].c);
        pthread_mutex_destroy(&jobs[i].mu);
        pthread_cond_destroy(&jobs[i].cv);
    }
    free(jobs);
    free(p.manifest);
    free(p.chunks);
    if (rc && planned)
        rd_fail(rc, "push failed on at least one daemon");
    return rc;
}

/* ---- a weights file as tensors (the daemon's /update_weights_from_disk) ---- */

static uint8_t wire_dtype(st_dtype t)
{
    return t == ST_F32 ? PROTO_DTYPE_F32 : t == ST_BF16 ? PROTO_DTYPE_BF16 : PROTO_DTYPE_F16;
}

static int source_gguf(const char *path, rdp_source *s)
{
    rd_loaded *L = calloc(1, sizeof *L);
    if (!L)
        return rd_fail(RD_ENOMEM, "out of memory");
    s->gguf = L;
    model_hf_tensor *mt = NULL;
    int rc = rd_load(path, "cpu", 1, L);
    if (rc || (rc = model_export_mem(L->m, ST_F32, &mt, &s->n_mt)))
        return rd_fail(rc, "%s: %s", path, rd_errmsg());
    s->mt = mt;
    if (!(s->ts = calloc(s->n_mt ? s->n_mt : 1, sizeof *s->ts)))
        return rd_fail(RD_ENOMEM, "out of memory");
    for (size_t i = 0; i < s->n_mt; i++) {
        const model_hf_tensor *t = &mt[i];
        s->ts[s->n++] = (rdp_tensor){.name = t->name, .dtype = wire_dtype(t->dtype), .n_dims = (uint8_t)t->n_dims,
                                     .nbytes = t->nbytes, .data = t->data,
                                     .shape = {(uint64_t)t->shape[0], (uint64_t)t->shape[1]}};
    }
    return 0;
}

static int source_st(const char *path, rdp_source *s)
{
    st_set *ss = NULL;
    int rc = st_set_open(path, &ss);
    if (rc)
        return rc;
    s->ss = ss;
    size_t total = 0;
    for (size_t f = 0; f < ss->n_files; f++)
        total += ss->files[f]->n_tensors;
    if (!(s->ts = calloc(total ? total : 1, sizeof *s->ts)))
        return rd_fail(RD_ENOMEM, "out of memory");
    for (size_t f = 0; f < ss->n_files; f++)
        for (size_t k = 0; k < ss->files[f]->n_tensors; k++) {
            const st_tensor *t = &ss->files[f]->tensors[k];
            if (t->dtype != ST_F32 && t->dtype != ST_F16 && t->dtype != ST_BF16)
                return rd_fail(RD_ENOTSUP, "tensor '%s' is %s; weights are pushed as F32, F16 or BF16", t->name,
                               st_dtype_name(t->dtype));
            if (t->n_dims < 1 || t->n_dims > PROTO_MAX_DIMS)
                return rd_fail(RD_ENOTSUP, "tensor '%s' has %d dimensions; expected 1..%d", t->name, t->n_dims,
                               PROTO_MAX_DIMS);
            rdp_tensor *r = &s->ts[s->n++];
            *r = (rdp_tensor){.name = t->name, .dtype = wire_dtype(t->dtype), .n_dims = (uint8_t)t->n_dims,
                              .nbytes = t->end - t->begin, .data = t->data};
            for (int d = 0; d < t->n_dims; d++)
                r->shape[d] = (uint64_t)t->shape[d];
        }
    return 0;
}

int rdp_source_open(const char *path, rdp_source *s)
{
    memset(s, 0, sizeof *s);
    size_t len = strlen(path);
    int rc = len > 5 && !strcmp(path + len - 5, ".gguf") ? source_gguf(path, s) : source_st(path, s);
    if (rc)
        rdp_source_close(s);
    return rc;
}

void rdp_source_close(rdp_source *s)
{
    free(s->ts);
    model_hf_tensors_free(s->mt, s->n_mt);
    st_set_close(s->ss);
    if (s->gguf) {
        rd_unload(s->gguf);
        free(s->gguf);
    }
    memset(s, 0, sizeof *s);
}
