/* lane_server.c - the weight-update data lane (PROTOCOL.md §10.10).
 *
 * A plain TCP stream of UPDATE_CHUNK frames, next to the NNG socket, for the
 * bulk of an update. NNG would copy every chunk into a message on both sides;
 * here the loop thread reads a frame's 48-byte head, claims the chunk's range
 * of the staging area, and has the kernel read the data straight into that
 * range (libuv's alloc callback hands out the staging memory itself). The
 * lane knows no transfer: its sink (lane_server.h; transfer.c is one) claims
 * the range and says where it is. A worker then checks the CRC-32C, and the
 * reply (UPDATE_CHUNK_OK or ERROR, the same frames as on NNG) goes back on
 * the same stream. Reading pauses while the transfer's window of chunks is
 * being checked (the sink's has_room), so a sender can never be more than a
 * window ahead; the sink's room signal resumes it.
 *
 * With a shared secret the daemon opens each connection with an
 * AUTH_CHALLENGE, and the sender's first frame must be a LANE_AUTH proving
 * the lane key of one open transfer (§10.12); the connection may then feed
 * that transfer only. */
#include "daemon/update/lane_server.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "base/clock.h"
#include "base/err.h"
#include "daemon/log.h"
#include "daemon/netaddr.h"
#include "proto/auth.h"
#include "proto/tls.h"

#define LANE_DISCARD 65536      /* bytes: scratch for data that is not staged */
#define LANE_STALL_US 3000000   /* a sender silent this long inside a chunk is cut (its range is freed) */
#define LANE_AUTH_US 5000000    /* a connection that has not sent its LANE_AUTH this long after accept is cut */

typedef struct lane_conn {
    uv_tcp_t tcp;
    struct lane_server *srv;
    struct lane_conn *next, *prev;
    uint8_t head[PROTO_CHUNK_HEAD_BYTES];
    size_t head_got;
    int in_data;                /* reading a chunk's data */
    proto_update_chunk c;       /* the chunk being read */
    void *hold;                 /* the sink's claim while a range is claimed (dest set), else NULL */
    uint8_t *dest;              /* where the data goes; NULL: discard it */
    uint64_t got;               /* data bytes read */
    uint64_t last_read_us;      /* when bytes last came */
    uint64_t t_accept_us;
    uint32_t code;              /* a refusal to send once the data is consumed (0: none) */
    int dup;                    /* ... or a DUPLICATE ack */
    char why[512];
    int paused;                 /* reading stopped for the window */
    int closed;                 /* uv_close called */
    int refs;                   /* chunk jobs that will reply here */
    int authed;                 /* the LANE_AUTH was right (or the daemon has no secret) */
    int proven;                 /* a LANE_AUTH was accepted, or (no secret) a chunk of the open transfer came */
    uint64_t auth_xfer;         /* the one transfer it may feed */
    uint8_t nonce[PROTO_AUTH_BYTES]; /* of the challenge sent */
    uint8_t auth_frame[PROTO_HEADER_BYTES + 8 + PROTO_AUTH_BYTES];
    size_t auth_got;
    uint8_t discard[LANE_DISCARD];
} lane_conn;

struct lane_server {
    const host_env *env;
    lane_sink sink;             /* where chunks go */
    uv_tcp_t listener;
    lane_conn *conns;
    uint16_t port;              /* the bound TCP port */
    int exposed;                /* a non-loopback address without a secret (insecure) */
    uint64_t auth_failures;     /* wrong or missing LANE_AUTHs */
    int n_open;                 /* connections not being closed (max_lane_connections) */
    uint64_t n_evicted;         /* unproven connections closed to admit a new one */
    uint64_t n_refused;         /* new connections answered BUSY: every open one had proven itself */
};

static void conn_free_if_done(lane_conn *c)
{
    if (c->closed == 2 && c->refs == 0)
        free(c);
}

static void on_closed(uv_handle_t *h)
{
    lane_conn *c = h->data;
    lane_server *s = c->srv;
    if (c->prev) c->prev->next = c->next; else if (s) s->conns = c->next;
    if (c->next) c->next->prev = c->prev;
    c->closed = 2;
    conn_free_if_done(c);
}

static void conn_close(lane_conn *c, const char *why)
{
    if (c->closed)
        return;
    if (c->in_data && c->dest) {
        /* The stream ended inside a chunk: its range is released, so the same chunk can come again
         * from this sender or another (a chain reroutes around a relay that died mid-chunk). A
         * sender that is gone for good ends the transfer through its NNG connection or
         * update_idle_s. */
        proto_update_chunk ch = c->c;
        const lane_sink *k = &c->srv->sink;
        k->abandon(k->ctx, c->hold, &ch); /* the claim is alive while the range is claimed */
        c->hold = NULL;
        c->dest = NULL;
    }
    c->closed = 1;
    c->srv->n_open--;
    uv_close((uv_handle_t *)&c->tcp, on_closed);
}

typedef struct {
    uv_write_t w;
    lane_conn *c;
    uint8_t *buf;
} lane_write;

static void on_written(uv_write_t *w, int status)
{
    lane_write *lw = (lane_write *)w;
    free(lw->buf);
    free(lw);
}

/* Writes one encoded frame (taking b's memory). */
static void send_frame(lane_conn *c, proto_buf *b)
{
    lane_write *lw = calloc(1, sizeof *lw);
    if (!lw) {
        proto_buf_free(b);
        conn_close(c, "out of memory on the data lane");
        return;
    }
    lw->c = c;
    lw->buf = b->data; /* handed to the write */
    uv_buf_t ub = uv_buf_init((char *)b->data, (unsigned)b->len);
    if (uv_write(&lw->w, (uv_stream_t *)&c->tcp, &ub, 1, on_written)) {
        free(lw->buf);
        free(lw);
        conn_close(c, "the data lane's connection failed");
    }
}

/* Sends one reply frame (UPDATE_CHUNK_OK or ERROR). */
static void send_reply(lane_conn *c, uint32_t code, const char *why, const proto_update_chunk_ok *ok)
{
    if (c->closed)
        return;
    proto_buf b;
    proto_buf_init(&b);
    int rc;
    if (code) {
        rc = proto_encode_error(&b, code, PROTO_UPDATE_CHUNK, why);
    } else {
        proto_msg m = {.type = PROTO_UPDATE_CHUNK_OK};
        m.update_chunk_ok = *ok;
        rc = proto_encode(&b, &m);
    }
    if (rc) {
        proto_buf_free(&b);
        conn_close(c, "cannot build a reply on the data lane");
        return;
    }
    send_frame(c, &b);
}

/* A chunk job finished: its reply goes out on this stream. */
static void job_reply(void *arg, uint32_t code, const char *why, const proto_update_chunk_ok *ok)
{
    lane_conn *c = arg;
    c->refs--;
    send_reply(c, code, why, ok);
    conn_free_if_done(c);
}

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
    lane_conn *c = h->data;
    if (!c->authed) { /* the header first, to refuse anything but a LANE_AUTH before reading on */
        size_t want = c->auth_got < PROTO_HEADER_BYTES ? PROTO_HEADER_BYTES : sizeof c->auth_frame;
        *buf = uv_buf_init((char *)c->auth_frame + c->auth_got, (unsigned)(want - c->auth_got));
        return;
    }
    if (!c->in_data) {
        *buf = uv_buf_init((char *)c->head + c->head_got, (unsigned)(PROTO_CHUNK_HEAD_BYTES - c->head_got));
        return;
    }
    uint64_t left = c->c.len - c->got;
    if (c->dest) {
        *buf = uv_buf_init((char *)c->dest + c->got, (unsigned)(left < (1u << 30) ? left : (1u << 30)));
        return;
    }
    *buf = uv_buf_init((char *)c->discard, (unsigned)(left < LANE_DISCARD ? left : LANE_DISCARD));
}

static void on_read(uv_stream_t *st, ssize_t nread, const uv_buf_t *buf);

/* The sink's room signal: a chunk settled, so the window may have room
 * again (or the transfer ended): paused readers go on. */
static void on_room(void *arg)
{
    lane_server *s = arg;
    for (lane_conn *c = s->conns; c; c = c->next) {
        if (!c->paused || c->closed || !s->sink.has_room(s->sink.ctx))
            continue;
        c->paused = 0;
        if (uv_read_start((uv_stream_t *)&c->tcp, on_alloc, on_read))
            conn_close(c, "cannot resume reading the data lane");
    }
}

/* A whole chunk has been read: hand it on, or answer why it was not taken. */
static void chunk_complete(lane_conn *c)
{
    const lane_sink *k = &c->srv->sink;
    lane_answer a = {.send = job_reply, .arg = c};
    proto_update_chunk ch = c->c;
    void *hold = c->hold;
    c->in_data = 0;
    c->head_got = 0;
    c->hold = NULL;
    c->dest = NULL;
    if (c->code) {
        send_reply(c, c->code, c->why, NULL);
    } else if (c->dup) {
        /* No claim was held while the bytes were read: the transfer may have ended meanwhile. */
        if (k->is_open(k->ctx, ch.xfer_id)) {
            c->refs++;
            k->duplicate(k->ctx, &ch, &a);
        } else {
            send_reply(c, PROTO_E_UNEXPECTED, "the transfer ended while this chunk was read", NULL);
        }
    } else {
        c->refs++;
        k->filled(k->ctx, hold, &ch, &a);
    }
    if (!c->closed && !k->has_room(k->ctx)) {
        uv_read_stop((uv_stream_t *)&c->tcp);
        c->paused = 1;
    }
}

/* A head has been read: decode it and claim the chunk's range. */
static int head_complete(lane_conn *c)
{
    lane_server *s = c->srv;
    uint32_t code;
    if (proto_lane_decode_head(c->head, *s->env->max_message_bytes, &c->c, &code)) {
        /* The framing is lost: say why, then close. */
        send_reply(c, code, rd_errmsg(), NULL);
        conn_close(c, "bad frame on the data lane");
        return -1;
    }
    if (s->env->secret->len && c->c.xfer_id != c->auth_xfer) {
        send_reply(c, PROTO_E_UNAUTHORIZED, "this data lane connection authenticated for another transfer", NULL);
        conn_close(c, "a chunk of another transfer on an authenticated lane");
        return -1;
    }
    c->in_data = 1;
    c->got = 0;
    c->code = (uint32_t)s->sink.claim(s->sink.ctx, &c->c, &c->hold, &c->dest, &c->dup, c->why, sizeof c->why);
    if (!c->code)
        c->proven = 1; /* without a secret, a chunk the open transfer takes is the sender's proof */
    if (c->code || c->dup)
        c->hold = NULL; /* only a claimed range (dest) keeps its transfer alive */
    if (c->c.len == 0)
        chunk_complete(c);
    return 0;
}

/* The sender's LANE_AUTH (all of it, or its header so far): 0 while it is
 * read or once it is right, -1 when the connection was refused. */
static int auth_step(lane_conn *c)
{
    lane_server *s = c->srv;
    const host_secret *sec = s->env->secret;
    if (c->auth_got == PROTO_HEADER_BYTES) {
        const uint8_t *h = c->auth_frame;
        uint32_t body = (uint32_t)h[8] | (uint32_t)h[9] << 8 | (uint32_t)h[10] << 16 | (uint32_t)h[11] << 24;
        if (memcmp(h, PROTO_MAGIC, 4) || h[6] != PROTO_LANE_AUTH || h[7] != 0 || body != 8 + PROTO_AUTH_BYTES) {
            s->auth_failures++;
            send_reply(c, PROTO_E_UNAUTHORIZED, "this data lane needs a LANE_AUTH first (PROTOCOL.md section 10.12)",
                       NULL);
            conn_close(c, "no LANE_AUTH on the data lane");
            return -1;
        }
        return 0;
    }
    if (c->auth_got < sizeof c->auth_frame)
        return 0;
    proto_msg m;
    uint8_t key[PROTO_AUTH_BYTES], want[PROTO_AUTH_BYTES];
    int ok = proto_decode(c->auth_frame, sizeof c->auth_frame, 0, &m) == 0 && m.type == PROTO_LANE_AUTH &&
             s->sink.is_open(s->sink.ctx, m.lane_auth.xfer_id) &&
             !proto_auth_lane_key((const uint8_t *)sec->bytes, sec->len, m.lane_auth.xfer_id, key) &&
             !proto_auth_lane_proof(key, c->nonce, m.lane_auth.xfer_id, want) &&
             proto_auth_equal(want, m.lane_auth.proof);
    if (!ok) {
        s->auth_failures++;
        send_reply(c, PROTO_E_UNAUTHORIZED, "LANE_AUTH refused: not the open transfer, or not its lane key", NULL);
        conn_close(c, "a wrong LANE_AUTH on the data lane");
        return -1;
    }
    c->authed = 1;
    c->proven = 1;
    c->auth_xfer = m.lane_auth.xfer_id;
    return 0;
}

static void on_read(uv_stream_t *st, ssize_t nread, const uv_buf_t *buf)
{
    lane_conn *c = st->data;
    c->last_read_us = (uint64_t)clock_now_us();
    if (nread < 0) {
        conn_close(c, nread == UV_EOF ? "the sender closed the data lane mid-chunk"
                                      : "the data lane's connection failed mid-chunk");
        return;
    }
    if (!c->authed) {
        c->auth_got += (size_t)nread;
        auth_step(c);
        return;
    }
    if (!c->in_data) {
        c->head_got += (size_t)nread;
        if (c->head_got == PROTO_CHUNK_HEAD_BYTES)
            head_complete(c);
        return;
    }
    c->got += (uint64_t)nread;
    if (c->got == c->c.len)
        chunk_complete(c);
}

/* At max_lane_connections: the oldest connection that has not proven
 * itself makes room (a flood of silent connections cannot lock out a
 * sender); when every other one has, the newcomer is answered BUSY. 1 when
 * c was refused. */
static int admit(lane_server *s, lane_conn *c)
{
    lane_conn *victim = NULL;
    for (lane_conn *o = s->conns; o; o = o->next) /* newest first: the last match is the oldest */
        if (o != c && !o->closed && !o->proven)
            victim = o;
    if (victim) {
        s->n_evicted++;
        conn_close(victim, "evicted at max_lane_connections");
        return 0;
    }
    s->n_refused++;
    char why[160];
    snprintf(why, sizeof why, "the data lane holds %d connections of senders (max_lane_connections); retry later",
             s->n_open - 1);
    send_reply(c, PROTO_E_BUSY, why, NULL);
    conn_close(c, "refused at max_lane_connections");
    return 1;
}

static void on_connection(uv_stream_t *server, int status)
{
    lane_server *s = server->data;
    if (status < 0)
        return;
    lane_conn *c = calloc(1, sizeof *c);
    if (!c)
        return;
    c->srv = s;
    uv_tcp_init(server->loop, &c->tcp);
    c->tcp.data = c;
    /* Linked before the accept, so on_closed unlinks it on every path. */
    c->next = s->conns;
    if (s->conns)
        s->conns->prev = c;
    s->conns = c;
    s->n_open++;
    if (uv_accept(server, (uv_stream_t *)&c->tcp)) {
        conn_close(c, "accept failed");
        return;
    }
    uv_tcp_nodelay(&c->tcp, 1);
    c->authed = s->env->secret->len == 0;
    c->t_accept_us = c->last_read_us = (uint64_t)clock_now_us();
    if (s->n_open > s->env->cfg->max_lane_connections && admit(s, c))
        return;
    if (!c->authed) {
        proto_buf b;
        proto_buf_init(&b);
        proto_msg m = {.type = PROTO_AUTH_CHALLENGE};
        if (proto_auth_nonce(c->nonce) || (memcpy(m.auth.bytes, c->nonce, PROTO_AUTH_BYTES), proto_encode(&b, &m))) {
            proto_buf_free(&b);
            conn_close(c, "cannot challenge the data lane's sender");
            return;
        }
        send_frame(c, &b);
    }
    if (uv_read_start((uv_stream_t *)&c->tcp, on_alloc, on_read))
        conn_close(c, "cannot read the data lane");
}

/* HOST for the lane: update_listen's, or the learner socket's (tcp://HOST:PORT). */
static int lane_addr(const cfg_daemon *cfg, struct sockaddr_storage *addr)
{
    char host[256] = "";
    int port = 0;
    const char *spec = cfg->update_listen;
    if (spec[0]) {
        const char *colon = strrchr(spec, ':');
        size_t hl = colon ? (size_t)(colon - spec) : 0;
        if (!colon || hl == 0 || hl >= sizeof host)
            return rd_fail(RD_EINVAL, "update_listen \"%s\": expected HOST:PORT (or \"\" or \"off\")", spec);
        memcpy(host, spec, hl);
        port = atoi(colon + 1);
    } else {
        const char *u = cfg->listen;
        if (strncmp(u, "tcp://", 6))
            return rd_fail(RD_EINVAL, "the data lane needs a tcp:// learner socket (listen is \"%s\"); set update_listen",
                           u);
        u += 6;
        const char *colon = strrchr(u, ':');
        size_t hl = colon ? (size_t)(colon - u) : 0;
        if (!colon || hl == 0 || hl >= sizeof host)
            return rd_fail(RD_EINVAL, "listen \"%s\": expected tcp://HOST:PORT", cfg->listen);
        memcpy(host, u, hl);
    }
    if (!strcmp(host, "*"))
        strcpy(host, "0.0.0.0");
    int rc = strchr(host, ':') ? uv_ip6_addr(host, port, (struct sockaddr_in6 *)addr)
                               : uv_ip4_addr(host, port, (struct sockaddr_in *)addr);
    if (rc)
        return rd_fail(RD_EINVAL, "data lane: %s is not a numeric IP address", host);
    return 0;
}

int lane_start(const host_env *env, const lane_sink *sink, lane_server **out)
{
    const cfg_daemon *cfg = env->cfg;
    *out = NULL;
    if (!strcmp(cfg->update_listen, "off") || cfg->max_staging_bytes == 0)
        return 0;
    if (proto_tls_url(cfg->listen)) { /* a plain TCP lane would carry the weights in the clear */
        log_line("data lane off: the learner socket is TLS and the lane is plain TCP");
        return 0;
    }
    struct sockaddr_storage addr;
    int rc = lane_addr(cfg, &addr);
    if (rc)
        return rc;
    int exposed = 0;
    if (!net_is_loopback((const struct sockaddr *)&addr) && !env->secret->len) {
        if (!cfg->insecure)
            return rd_fail(RD_EINVAL, "the data lane would listen on a non-loopback address without a "
                           "secret: set auth_token_file, or update_listen to a loopback HOST:PORT or \"off\", or insecure = 1");
        exposed = 1;
    }
    lane_server *s = calloc(1, sizeof *s);
    if (!s)
        return rd_fail(RD_ENOMEM, "data lane: out of memory");
    s->env = env;
    s->sink = *sink;
    s->exposed = exposed;
    uv_tcp_init(env->loop, &s->listener);
    s->listener.data = s;
    if ((rc = uv_tcp_bind(&s->listener, (const struct sockaddr *)&addr, 0)) ||
        (rc = uv_listen((uv_stream_t *)&s->listener, SOMAXCONN, on_connection))) {
        uv_close((uv_handle_t *)&s->listener, NULL);
        *out = s; /* freed by lane_free once the loop has ended */
        return rd_fail(RD_EIO, "data lane: cannot listen: %s", uv_strerror(rc));
    }
    struct sockaddr_storage got;
    int len = sizeof got;
    uv_tcp_getsockname(&s->listener, (struct sockaddr *)&got, &len);
    s->port = ntohs(got.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&got)->sin6_port
                                              : ((struct sockaddr_in *)&got)->sin_port);
    sink->watch_room(sink->ctx, on_room, s);
    *out = s;
    return 0;
}

uint16_t lane_port(const lane_server *s) { return s->port; }
int lane_exposed(const lane_server *s) { return s->exposed; }

void lane_counts(const lane_server *s, int *open, uint64_t *evicted, uint64_t *refused)
{
    *open = s ? s->n_open : 0;
    *evicted = s ? s->n_evicted : 0;
    *refused = s ? s->n_refused : 0;
}

void lane_on_tick(lane_server *s)
{
    if (!s)
        return;
    uint64_t now = (uint64_t)clock_now_us();
    for (lane_conn *c = s->conns, *next; c; c = next) {
        next = c->next;
        /* Only inside a chunk: between chunks a sender may pause, and a paused reader is ours. */
        if (!c->closed && c->in_data && c->dest && !c->paused && now - c->last_read_us > LANE_STALL_US)
            conn_close(c, "the sender stalled inside a chunk");
        else if (!c->closed && !c->authed && now - c->t_accept_us > LANE_AUTH_US) {
            s->auth_failures++; /* a slot held without proving anything */
            conn_close(c, "no LANE_AUTH in time");
        }
    }
}

void lane_stop(lane_server *s)
{
    if (!s)
        return;
    if (!uv_is_closing((uv_handle_t *)&s->listener))
        uv_close((uv_handle_t *)&s->listener, NULL);
    for (lane_conn *c = s->conns; c; c = c->next)
        conn_close(c, "the daemon is shutting down");
    /* Connections unlink themselves as they close; s stays until exit (lane_free). */
}

void lane_free(lane_server *s) { free(s); }
