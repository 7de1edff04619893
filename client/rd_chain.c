/* rd_chain.c - the chained broadcast of rdp_push (PROTOCOL.md §10.11).
 *
 * Every daemon opens a transfer (UPDATE_BEGIN); daemon k is told to relay
 * what it verifies to daemon k+1 (UPDATE_FORWARD, with k+1's lane key when
 * k+1 has a secret, wrapped so only k can read it, §10.12); one thread sends
 * the chunks to the first daemon's data lane, so this process sends every
 * byte once whatever the number of daemons. This thread polls UPDATE_PREPARE
 * on every daemon until all are READY (verified and built), then commits on
 * all at once (two-phase: no daemon swaps before every one can).
 *
 * A daemon that fails (an ERROR, no answer to a poll, its feed breaks) is out
 * of the chain: the daemon before it relays to the one after it, or, when it
 * was fed by this process, this process feeds the one after it. With
 * RDP_ON_FAILURE_ABORT the update is then aborted everywhere (every daemon
 * keeps its old weights); with RDP_ON_FAILURE_COMMIT the survivors finish and
 * commit. The learner side in Python is tools/python/rolloutd/pool.py
 * (_Chain); this follows it. */
#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#include "base/clock.h"
#include "base/err.h"
#include "proto/auth.h"
#include "client/rd_push_priv.h"

#define CHAIN_POLL_NS 20000000L     /* between two rounds of UPDATE_PREPARE */
#define CHAIN_CALL_MS 3000          /* a daemon that does not answer a poll this fast is taken for dead */
#define CHAIN_STALL_S 60.0          /* no byte verified anywhere for this long: the unfinished are dropped */
#define CHAIN_REFORWARDS 3          /* a relay into one daemon restarted this often: that daemon is dropped */

typedef struct {
    int out;                    /* failed, dropped or never connected: no longer in the chain */
    int next;                   /* the daemon it relays to, or -1 */
    int fed;                    /* a thread of this process sends it the chunks */
    int feeder_started;         /* that thread runs (joined at the end) */
    int reforwards;             /* times the relay into it was restarted after failing */
    int have_st;                /* st is from this round's poll */
    proto_update_prepare_ok st; /* its last UPDATE_PREPARE_OK */
    uint64_t staged;            /* bytes_staged of the last answer (kept across rounds) */
    double t_end;               /* when its COMMIT_OK (or its failure) came */
    pthread_t feeder;
} member;

typedef struct {
    rdp_job *jobs;
    member *m;
    int n;
    const rdp_plan *p;
    const rdp_options *o;
} chain;

static int failed_any(const chain *ch)
{
    for (int k = 0; k < ch->n; k++)
        if (ch->m[k].out)
            return 1;
    return 0;
}

/* rdc_call, repeated when no answer came (every message here is safe to repeat). */
static int call(chain *ch, int k, const proto_msg *q, uint16_t want, int attempts, proto_msg *r)
{
    int rc = RDC_ETIMEDOUT;
    for (int a = 0; a < attempts && rc == RDC_ETIMEDOUT; a++)
        rc = rdc_call(ch->jobs[k].c, q, want, CHAIN_CALL_MS, r);
    return rc;
}

/* The relaying daemon connects to the next one itself and takes only a
 * numeric address (it does not resolve names for a learner). */
static int numeric_host(const char *url, char *out, size_t size)
{
    char host[256];
    if (rdp_url_host(url, host, sizeof host))
        return rd_fail(RD_EINVAL, "chain: cannot take a host from '%s'", url);
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM}, *ai;
    if (getaddrinfo(host, NULL, &hints, &ai))
        return rd_fail(RD_EIO, "chain: cannot resolve %s", host);
    const void *a = ai->ai_family == AF_INET6 ? (const void *)&((struct sockaddr_in6 *)ai->ai_addr)->sin6_addr
                                              : (const void *)&((struct sockaddr_in *)ai->ai_addr)->sin_addr;
    const char *ok = inet_ntop(ai->ai_family, a, out, (socklen_t)size);
    freeaddrinfo(ai);
    return ok ? 0 : rd_fail(RD_EIO, "chain: cannot print the address of %s", host);
}

/* Daemon a relays to daemon b from now on (all it has verified first). */
static int forward(chain *ch, int a, int b)
{
    rdp_job *ja = &ch->jobs[a], *jb = &ch->jobs[b];
    char host[INET6_ADDRSTRLEN];
    int rc = numeric_host(jb->t->url, host, sizeof host);
    if (rc)
        return rc;
    proto_msg q = {.type = PROTO_UPDATE_FORWARD}, r;
    proto_update_forward *f = &q.update_forward;
    f->xfer_id = ja->xfer;
    f->next_xfer_id = jb->xfer;
    f->port = jb->lane_port;
    f->window = ch->o->window < jb->window ? ch->o->window : jb->window;
    f->host = (proto_str){host, (uint32_t)strlen(host)};
    size_t la, lb;
    const char *sa = rdc_secret(ja->c, &la), *sb = rdc_secret(jb->c, &lb);
    if (lb) {
        /* This process proved b's secret on its connection, so b's lane challenges:
         * a proves b's lane key for this one transfer, which only a can unwrap. */
        f->flags = PROTO_FORWARD_AUTH;
        rc = proto_auth_lane_key((const uint8_t *)sb, lb, jb->xfer, f->key);
        if (!rc && la) {
            uint8_t pad[PROTO_AUTH_BYTES];
            rc = proto_auth_wrap_pad((const uint8_t *)sa, la, ja->xfer, jb->xfer, pad);
            for (int i = 0; i < PROTO_AUTH_BYTES; i++)
                f->key[i] ^= pad[i];
            memset(pad, 0, sizeof pad);
        }
    }
    if (!rc)
        rc = call(ch, a, &q, PROTO_UPDATE_FORWARD_OK, 2, &r);
    memset(f->key, 0, sizeof f->key);
    if (rc)
        return rc;
    proto_msg_free(&r);
    ch->m[a].next = b;
    return 0;
}

/* forward()'s rc said daemon a may not relay there (FORBIDDEN: the target is
 * outside a's relay_allow): then this process pushes to that daemon itself. */
static int forbidden(const chain *ch, int a, int rc)
{
    return rc == RDC_EDAEMON && rdc_error_code(ch->jobs[a].c) == PROTO_E_FORBIDDEN;
}

/* Daemon a relays no more (UPDATE_FORWARD with next_xfer_id 0), best effort.
 * Sent when the daemon after a is out and nothing replaces it, and to every
 * relaying daemon before its COMMIT or ABORT, so that no relay to a dead
 * successor is still trying when the transfer ends (older daemons freed such
 * a transfer twice; daemon/update/transfer.c now waits for every relay to
 * close). A relay stopped after every daemon is READY has nothing left to
 * send. */
static void unlink_relay(chain *ch, int a)
{
    proto_msg q = {.type = PROTO_UPDATE_FORWARD}, r;
    q.update_forward.xfer_id = ch->jobs[a].xfer;
    q.update_forward.window = 1; /* the links stay noted: they are the hops reported */
    if (call(ch, a, &q, PROTO_UPDATE_FORWARD_OK, 1, &r) == 0)
        proto_msg_free(&r);
}

static void *feeder_main(void *arg)
{
    rdp_job *j = arg;
    rdp_lane_send(j, j->t->url);
    atomic_store(&j->done, 1);
    return NULL;
}

/* This process sends every chunk to daemon k (in a thread of its own). */
static void feed(chain *ch, int k)
{
    rdp_job *j = &ch->jobs[k];
    ch->m[k].fed = 1;
    atomic_store(&j->done, 0);
    if (pthread_create(&ch->m[k].feeder, NULL, feeder_main, j)) {
        rdp_fail_job(j, RD_ENOMEM, 0, "chain: cannot start the thread that feeds this daemon");
        atomic_store(&j->done, 1); /* the next poll drops it */
        return;
    }
    ch->m[k].feeder_started = 1;
}

/* Daemon k is out: the one before it (or this process) feeds the one after it. */
static void drop(chain *ch, int k, int rc, uint32_t code, const char *why)
{
    member *m = ch->m;
    if (m[k].out)
        return;
    m[k].out = 1;
    m[k].t_end = clock_now_s();
    rdp_fail_job(&ch->jobs[k], rc, code, why);
    if (m[k].fed)
        rdp_stop_feeding(&ch->jobs[k]);
    int succ = m[k].next;
    m[k].next = -1;
    while (succ >= 0 && m[succ].out)
        succ = m[succ].next;
    int prev = -1;
    for (int a = 0; a < ch->n; a++)
        if (m[a].next == k) {
            prev = a;
            m[a].next = -1;
        }
    int relays = prev >= 0 && !m[prev].out;
    /* A failing UPDATE_FORWARD means prev cannot relay (its staging is gone, or it
     * is gone too; the next poll says which): then this process feeds succ. */
    if (relays && succ >= 0 && forward(ch, prev, succ) == 0)
        return;
    if (relays)
        unlink_relay(ch, prev);
    if (succ >= 0 && !m[succ].fed)
        feed(ch, succ);
}

/* Daemons the chunks passed before reaching k (0: fed by this process). */
static int hop(const chain *ch, int k)
{
    if (ch->m[k].out)
        return -1;
    int h = 0;
    for (int steps = 0; steps < ch->n && !ch->m[k].fed; steps++) {
        int prev = -1;
        for (int a = 0; a < ch->n; a++)
            if (ch->m[a].next == k)
                prev = a;
        if (prev < 0)
            break;
        k = prev;
        h++;
    }
    return h;
}

static void print_progress(const chain *ch, double t0, int final)
{
    double dt = clock_now_s() - t0;
    uint64_t tot = ch->p->total;
    fputc('\r', stderr);
    for (int k = 0; k < ch->n; k++) {
        const char *sep = k ? " | " : "";
        if (ch->m[k].out)
            fprintf(stderr, "%s%s out", sep, ch->jobs[k].t->url);
        else
            fprintf(stderr, "%s%s %5.1f%% %.0f MB/s", sep, ch->jobs[k].t->url,
                    tot ? 100.0 * (double)ch->m[k].staged / (double)tot : 100.0,
                    dt > 0 ? (double)ch->m[k].staged / 1e6 / dt : 0.0);
    }
    fputs(final ? "\n" : "   ", stderr);
    fflush(stderr);
}

/* Polls UPDATE_PREPARE on the daemons still in the chain until every one
 * is READY, routing around the ones that fail. */
static void wait_prepared(chain *ch, double t0)
{
    member *m = ch->m;
    int n = ch->n;
    uint64_t last = UINT64_MAX;
    double t_last = clock_now_s(), t_print = 0;
    for (;;) {
        if (failed_any(ch) && ch->o->on_failure == RDP_ON_FAILURE_ABORT)
            return; /* aborted everywhere by the caller */
        for (int k = 0; k < n; k++) {
            m[k].have_st = 0;
            if (m[k].out)
                continue;
            proto_msg q = {.type = PROTO_UPDATE_PREPARE}, r;
            q.update_prepare.xfer_id = ch->jobs[k].xfer;
            int rc = call(ch, k, &q, PROTO_UPDATE_PREPARE_OK, 2, &r);
            if (rc) { /* rd_errmsg names the request */
                drop(ch, k, rc, rdc_error_code(ch->jobs[k].c), rd_errmsg());
                continue;
            }
            m[k].st = r.update_prepare_ok;
            m[k].have_st = 1;
            m[k].staged = m[k].st.bytes_staged;
            proto_msg_free(&r);
        }
        /* A feed that ended in a failure (its connection broke, the daemon refused a chunk). */
        for (int k = 0; k < n; k++) {
            rdp_job *j = &ch->jobs[k];
            if (m[k].fed && !m[k].out && atomic_load(&j->done) && atomic_load(&j->failed))
                drop(ch, k, j->t->rc, j->t->err_code, j->t->error);
        }
        int alive = 0, ready = 0;
        for (int k = 0; k < n; k++)
            if (!m[k].out) {
                alive++;
                ready += m[k].have_st && m[k].st.state == PROTO_PREP_READY;
            }
        if (alive == 0 || ready == alive)
            return;
        /* A relay that failed while the next daemon still answers: start it again (it resends only
         * what the next one lacks); one that keeps failing drops the next daemon. */
        for (int a = 0; a < n; a++) {
            int b = m[a].next;
            if (m[a].out || b < 0 || m[b].out || !m[a].have_st || m[a].st.forward != PROTO_FWD_FAILED)
                continue;
            int rc = ++m[b].reforwards > CHAIN_REFORWARDS ? RD_EIO : forward(ch, a, b);
            if (rc && forbidden(ch, a, rc)) {
                m[a].next = -1;
                unlink_relay(ch, a);
                if (!m[b].fed)
                    feed(ch, b);
            } else if (rc) {
                char why[600];
                snprintf(why, sizeof why, "%s cannot relay to it (its relay failed with code %u)",
                         ch->jobs[a].t->url, m[a].st.forward_error);
                drop(ch, b, RD_EIO, m[a].st.forward_error, why);
            }
        }
        uint64_t done = 0;
        for (int k = 0; k < n; k++)
            done += m[k].have_st ? m[k].st.bytes_staged : 0;
        double now = clock_now_s();
        if (done != last) {
            last = done;
            t_last = now;
        } else if (now - t_last > CHAIN_STALL_S) {
            for (int k = 0; k < n; k++)
                if (!m[k].out && !(m[k].have_st && m[k].st.state == PROTO_PREP_READY))
                    drop(ch, k, RDC_ETIMEDOUT, 0, "no progress of the chained push in 60 s");
            t_last = now;
        }
        if (ch->o->progress && now - t_print >= 0.25) {
            print_progress(ch, t0, 0);
            t_print = now;
        }
        nanosleep(&(struct timespec){0, CHAIN_POLL_NS}, NULL);
    }
}

/* The feeds are over: every daemon has what it needs, or the push ends. */
static void stop_feeders(chain *ch)
{
    for (int k = 0; k < ch->n; k++) {
        if (!ch->m[k].feeder_started)
            continue;
        if (!atomic_load(&ch->jobs[k].done))
            rdp_stop_feeding(&ch->jobs[k]);
        pthread_join(ch->m[k].feeder, NULL);
        ch->m[k].feeder_started = 0;
    }
}

typedef struct {
    rdp_job *j;
    member *m;
    pthread_t thread;
    int started;
} committer;

static void *commit_main(void *arg)
{
    committer *c = arg;
    rdp_commit(c->j);
    c->m->t_end = clock_now_s();
    return NULL;
}

/* Every READY daemon swaps now: all COMMITs at once, so the fleet changes
 * version within about one decode step. */
static void commit_all(chain *ch)
{
    committer *cs = calloc((size_t)ch->n, sizeof *cs);
    for (int k = 0; k < ch->n; k++) {
        if (ch->m[k].out)
            continue;
        if (cs) {
            cs[k] = (committer){.j = &ch->jobs[k], .m = &ch->m[k]};
            cs[k].started = pthread_create(&cs[k].thread, NULL, commit_main, &cs[k]) == 0;
        }
        if (!cs || !cs[k].started) { /* no thread: commit from here */
            rdp_commit(&ch->jobs[k]);
            ch->m[k].t_end = clock_now_s();
        }
    }
    for (int k = 0; cs && k < ch->n; k++)
        if (cs[k].started)
            pthread_join(cs[k].thread, NULL);
    free(cs);
}

int rdp_chain(rdp_job *jobs, int n, const rdp_plan *p, double t0)
{
    chain ch = {.jobs = jobs, .n = n, .p = p, .o = p->o, .m = calloc((size_t)n, sizeof(member))};
    member *m = ch.m;
    if (!m)
        return 1; /* the direct push needs far less here; let it try */
    for (int k = 0; k < n; k++) {
        m[k].next = -1;
        m[k].out = jobs[k].c == NULL; /* not connected: rdp_push recorded why */
    }
    for (int k = 0; k < n; k++)
        if (!m[k].out && rdp_begin(&jobs[k]))
            m[k].out = 1;
    int lane = 1;
    for (int k = 0; k < n; k++)
        lane &= m[k].out || jobs[k].lane_port != 0;
    if (!lane) {
        /* A daemon without a data lane cannot be relayed to: abort and push directly,
         * which begins again on every connected daemon. */
        for (int k = 0; k < n; k++) {
            rdp_job *j = &jobs[k];
            if (!j->c)
                continue;
            if (!m[k].out)
                rdp_abort(j);
            j->xfer = 0;
            atomic_store(&j->failed, 0);
            j->t->rc = 0;
            j->t->err_code = 0;
            j->t->error[0] = 0;
        }
        free(m);
        return 1;
    }
    double t1 = clock_now_s(), t2 = t1;
    if (failed_any(&ch) && ch.o->on_failure == RDP_ON_FAILURE_ABORT)
        goto abort_all;
    /* The links in the targets' order, over the ones that began. Each link is
     * noted before it is made, so a daemon that cannot relay is routed around
     * like one that failed later. */
    for (int a = 0, b; a < n; a = b) {
        for (; a < n && m[a].out; a++)
            ;
        for (b = a + 1; b < n && m[b].out; b++)
            ;
        if (a >= n || b >= n)
            break;
        m[a].next = b;
        int rc = forward(&ch, a, b);
        if (rc && forbidden(&ch, a, rc)) {
            m[a].next = -1; /* b is fed directly by this process (below); the chain goes on from b */
            if (ch.o->progress)
                fprintf(stderr, "chain: %s may not relay to %s (FORBIDDEN, relay_allow): pushing to it directly\n",
                        jobs[a].t->url, jobs[b].t->url);
        } else if (rc) {
            drop(&ch, a, rc, rdc_error_code(jobs[a].c), rd_errmsg());
        }
    }
    if (failed_any(&ch) && ch.o->on_failure == RDP_ON_FAILURE_ABORT)
        goto abort_all;
    /* Feed the head of the chain (and whatever has no relay into it). */
    for (int k = 0; k < n; k++) {
        int has_prev = 0;
        for (int a = 0; a < n; a++)
            has_prev |= m[a].next == k;
        if (!m[k].out && !m[k].fed && !has_prev)
            feed(&ch, k);
    }
    t1 = clock_now_s();
    wait_prepared(&ch, t0);
    t2 = clock_now_s();
    if (failed_any(&ch) && ch.o->on_failure == RDP_ON_FAILURE_ABORT)
        goto abort_all;
    stop_feeders(&ch);
    for (int k = 0; k < n; k++)
        if (!m[k].out && m[k].next >= 0)
            unlink_relay(&ch, k);
    commit_all(&ch);
    goto report;
abort_all:
    stop_feeders(&ch);
    for (int k = 0; k < n; k++)
        if (!m[k].out && m[k].next >= 0)
            unlink_relay(&ch, k);
    for (int k = 0; k < n; k++) {
        if (m[k].out)
            continue;
        rdp_abort(&jobs[k]);
        rdp_fail_job(&jobs[k], RDP_EABORTED, 0, "aborted: another daemon of the chain failed");
        m[k].t_end = clock_now_s();
    }
report:
    if (ch.o->progress)
        print_progress(&ch, t0, 1);
    int rc = 0;
    for (int k = 0; k < n; k++) {
        rdp_target *t = jobs[k].t;
        t->fanout = RDP_FANOUT_CHAIN;
        t->hop = hop(&ch, k);
        t->bytes_acked = m[k].staged;
        t->wire_bytes = atomic_load(&jobs[k].wire);
        t->retries = atomic_load(&jobs[k].retries);
        t->transfer_seconds = t2 - t1;
        t->seconds = (m[k].t_end ? m[k].t_end : clock_now_s()) - t0;
        if (!rc && t->rc)
            rc = t->rc;
    }
    free(m);
    return rc;
}
