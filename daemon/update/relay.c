/* relay.c - a daemon of a chained broadcast forwards each verified chunk of
 * a transfer to the next daemon's data lane (PROTOCOL.md §10.11).
 *
 * The bytes are sent straight from this daemon's staging area, where they
 * already are, so the relay buffers nothing but chunk descriptors: the
 * source's list of verified chunks (transfer.c's log) is the queue, and
 * `next` is how far the relay has gone through it. At most `window` chunks
 * are unanswered on the connection; each UPDATE_CHUNK_OK from the next
 * daemon frees a slot.
 * A chunk the next daemon refuses with CHECKSUM or BUSY (the error names no
 * chunk) is sent again on a later pass over the log, as the learner's lane
 * sender does. Anything else it refuses ends the relay as failed: the
 * learner sees that in UPDATE_PREPARE_OK and routes around. */
#include "daemon/update/relay.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/clock.h"
#include "base/err.h"
#include "daemon/engine_thread.h"
#include "daemon/log.h"
#include "proto/auth.h"
#include "proto/proto.h"

#define RELAY_RETRY_S 30        /* refused chunks (BUSY, CHECKSUM) are sent again, once a second, this long */
#define RELAY_MAX_REPLY 65536   /* bytes of a reply frame's body (an ERROR's message is far shorter) */

struct relay {
    relay_source src;           /* the verified chunks */
    int counted;                /* src->on_closed is owed once the relay is closed (relay_start succeeded) */
    uv_tcp_t tcp;
    uv_connect_t connect;
    uint64_t next_xfer_id;      /* the next daemon's transfer */
    uint32_t window;            /* chunks unanswered at most */
    int auth;                   /* the next lane challenges: answer with key */
    uint8_t key[PROTO_AUTH_BYTES];
    int sending;                /* connected (and authenticated): chunks may go */
    uint8_t state;              /* PROTO_FWD_* */
    uint32_t error;             /* FAILED: the next daemon's code, 0 for the connection */
    uint8_t *acked;             /* [cap_acked] per log entry: the next daemon has it */
    uint32_t cap_acked;
    uint32_t next;              /* log entries before it were sent (or acked) in this pass */
    uint32_t outstanding;       /* chunks sent and not yet answered */
    uint64_t retry_until_us;    /* refused chunks: keep passing over them until then (0: none refused yet) */
    int waiting;                /* a pass ended with chunks refused: the next starts at relay_tick */
    uint64_t acked_bytes;
    int attached;               /* the transfer still holds it (relay_close not called) */
    int handle_open;            /* tcp is initialised and not yet closed */
    uint8_t rbuf[PROTO_HEADER_BYTES + RELAY_MAX_REPLY];
    size_t rgot;
};

typedef struct {
    uv_write_t w;
    relay *r;
    uint8_t *frame;             /* a whole small frame (LANE_AUTH), or NULL */
    uint8_t head[PROTO_CHUNK_HEAD_BYTES];
} relay_write;

static void free_if_done(relay *r)
{
    if (!r->attached && !r->handle_open) {
        relay_source src = r->src;
        int counted = r->counted;
        free(r->acked);
        free(r);
        if (counted) /* 0: relay_start failed, the source never counted it */
            src.on_closed(src.ctx);
    }
}

static void on_closed(uv_handle_t *h)
{
    relay *r = h->data;
    r->handle_open = 0;
    free_if_done(r);
}

static void close_handle(relay *r)
{
    if (r->handle_open && !uv_is_closing((uv_handle_t *)&r->tcp))
        uv_close((uv_handle_t *)&r->tcp, on_closed);
}

static void fail(relay *r, uint32_t code, const char *why)
{
    if (r->state == PROTO_FWD_FAILED)
        return;
    r->state = PROTO_FWD_FAILED;
    r->error = code;
    r->sending = 0;
    log_line("relay to transfer %016llx failed: %s", (unsigned long long)r->next_xfer_id, why);
    close_handle(r);
}

static void on_written(uv_write_t *w, int status)
{
    relay_write *rw = (relay_write *)w;
    relay *r = rw->r;
    free(rw->frame);
    free(rw);
    if (status < 0 && status != UV_ECANCELED)
        fail(r, 0, uv_strerror(status));
}

static int send_chunk(relay *r, uint32_t i, const relay_chunk *c)
{
    const uint8_t *data = r->src.data(r->src.ctx, c);
    relay_write *rw = data ? calloc(1, sizeof *rw) : NULL;
    if (!rw) {
        fail(r, PROTO_E_INTERNAL, data ? "out of memory" : "the staging copy is gone");
        return -1;
    }
    rw->r = r;
    proto_update_chunk h = {.xfer_id = r->next_xfer_id, .chunk_seq = i, .tensor_index = c->tensor_index,
                            .offset = c->offset, .crc32c = c->crc32c, .len = c->len};
    proto_lane_encode_head(rw->head, &h);
    uv_buf_t bufs[2] = {uv_buf_init((char *)rw->head, sizeof rw->head), uv_buf_init((char *)data, c->len)};
    int rc = uv_write(&rw->w, (uv_stream_t *)&r->tcp, bufs, 2, on_written);
    if (rc) {
        free(rw);
        fail(r, 0, uv_strerror(rc));
        return -1;
    }
    r->outstanding++;
    return 0;
}

/* Sends log entries while the window has room; finishes when the transfer
 * is complete here and the next daemon acknowledged every entry. */
static void pump(relay *r)
{
    if (!r->sending || r->state != PROTO_FWD_SENDING)
        return;
    uint32_t n;
    const relay_chunk *log = r->src.chunks(r->src.ctx, &n);
    if (n > r->cap_acked) {
        uint32_t cap = r->cap_acked ? r->cap_acked : 256;
        while (cap < n)
            cap *= 2;
        uint8_t *a = realloc(r->acked, cap);
        if (!a) {
            fail(r, PROTO_E_INTERNAL, "out of memory");
            return;
        }
        memset(a + r->cap_acked, 0, cap - r->cap_acked);
        r->acked = a;
        r->cap_acked = cap;
    }
    while (r->outstanding < r->window && r->next < n) {
        uint32_t i = r->next++;
        if (!r->acked[i] && send_chunk(r, i, &log[i]))
            return;
    }
    if (r->next < n || r->outstanding > 0 || !r->src.complete(r->src.ctx))
        return;
    uint64_t missing = 0;
    for (uint32_t i = 0; i < n; i++)
        missing += !r->acked[i];
    if (missing == 0) {
        r->state = PROTO_FWD_DONE; /* the connection stays until the transfer ends: the next daemon sees no EOF */
        return;
    }
    /* BUSY usually means another connection still holds the range (a relay that stalled inside
     * the chunk, until the next daemon's lane times it out): try again a second later. */
    uint64_t now = (uint64_t)clock_now_us();
    if (!r->retry_until_us)
        r->retry_until_us = now + RELAY_RETRY_S * 1000000ull;
    if (now > r->retry_until_us) {
        fail(r, PROTO_E_CHECKSUM, "chunks still refused (BUSY or CHECKSUM) after 30 s of passes");
        return;
    }
    r->waiting = 1;
}

void relay_tick(relay *r)
{
    if (!r->waiting)
        return;
    r->waiting = 0;
    r->next = 0;
    pump(r);
}

static void on_reply(relay *r, const proto_msg *m)
{
    uint32_t n;
    r->src.chunks(r->src.ctx, &n);
    if (m->type == PROTO_AUTH_CHALLENGE && r->auth && !r->sending) {
        proto_msg a = {.type = PROTO_LANE_AUTH};
        a.lane_auth.xfer_id = r->next_xfer_id;
        proto_buf b;
        proto_buf_init(&b);
        relay_write *rw = calloc(1, sizeof *rw);
        if (!rw || proto_auth_lane_proof(r->key, m->auth.bytes, r->next_xfer_id, a.lane_auth.proof) ||
            proto_encode(&b, &a)) {
            free(rw);
            proto_buf_free(&b);
            fail(r, PROTO_E_INTERNAL, "cannot answer the next lane's challenge");
            return;
        }
        rw->r = r;
        rw->frame = b.data;
        uv_buf_t ub = uv_buf_init((char *)b.data, (unsigned)b.len);
        if (uv_write(&rw->w, (uv_stream_t *)&r->tcp, &ub, 1, on_written)) {
            free(rw->frame);
            free(rw);
            fail(r, 0, "cannot write to the next lane");
            return;
        }
        r->sending = 1;
        pump(r);
        return;
    }
    if (m->type == PROTO_UPDATE_CHUNK_OK && r->sending && m->update_chunk_ok.xfer_id == r->next_xfer_id &&
        m->update_chunk_ok.chunk_seq < n && r->outstanding > 0) {
        uint32_t i = m->update_chunk_ok.chunk_seq;
        const relay_chunk *log = r->src.chunks(r->src.ctx, &n);
        r->outstanding--;
        if (!r->acked[i]) {
            r->acked[i] = 1;
            r->acked_bytes += log[i].len;
        }
        pump(r);
        return;
    }
    if (m->type == PROTO_ERROR && r->sending && r->outstanding > 0 &&
        (m->error.code == PROTO_E_CHECKSUM || m->error.code == PROTO_E_BUSY)) {
        r->outstanding--; /* that chunk stays unacknowledged: a later pass sends it again */
        pump(r);
        return;
    }
    char why[600];
    if (m->type == PROTO_ERROR)
        snprintf(why, sizeof why, "the next daemon answered %s: %.*s", proto_err_name(m->error.code),
                 (int)m->error.message.len, m->error.message.ptr);
    else
        snprintf(why, sizeof why, "the next daemon sent an unexpected %s", proto_type_name(m->type));
    fail(r, m->type == PROTO_ERROR ? m->error.code : PROTO_E_UNEXPECTED, why);
}

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
    relay *r = h->data;
    *buf = uv_buf_init((char *)r->rbuf + r->rgot, (unsigned)(sizeof r->rbuf - r->rgot));
}

static void on_read(uv_stream_t *st, ssize_t nread, const uv_buf_t *buf)
{
    relay *r = st->data;
    if (nread < 0) {
        if (r->state == PROTO_FWD_SENDING)
            fail(r, 0, nread == UV_EOF ? "the next daemon closed its lane" : uv_strerror((int)nread));
        else
            close_handle(r);
        return;
    }
    r->rgot += (size_t)nread;
    while (r->state == PROTO_FWD_SENDING) {
        size_t len;
        int whole = proto_lane_next_frame(r->rbuf, r->rgot, RELAY_MAX_REPLY, &len);
        if (whole < 0) {
            fail(r, PROTO_E_TOO_LARGE, "the next daemon sent an oversized reply");
            return;
        }
        if (!whole)
            return;
        proto_msg m;
        if (proto_decode(r->rbuf, len, 0, &m)) {
            fail(r, PROTO_E_MALFORMED, rd_errmsg());
            return;
        }
        on_reply(r, &m);
        proto_msg_free(&m);
        memmove(r->rbuf, r->rbuf + len, r->rgot - len);
        r->rgot -= len;
    }
}

static void on_connect(uv_connect_t *c, int status)
{
    relay *r = c->data;
    if (r->state != PROTO_FWD_SENDING)
        return;
    if (status < 0) {
        fail(r, 0, uv_strerror(status));
        return;
    }
    uv_tcp_nodelay(&r->tcp, 1);
    if (uv_read_start((uv_stream_t *)&r->tcp, on_alloc, on_read)) {
        fail(r, 0, "cannot read the next lane");
        return;
    }
    if (!r->auth) {
        r->sending = 1;
        pump(r);
    } /* else the next lane's AUTH_CHALLENGE comes first (on_reply) */
}

int relay_start(uv_loop_t *loop, const relay_source *src, const char *host, uint16_t port, uint64_t next_xfer_id,
                uint32_t window, const uint8_t *key, relay **out)
{
    struct sockaddr_storage addr;
    int rc = strchr(host, ':') ? uv_ip6_addr(host, port, (struct sockaddr_in6 *)&addr)
                               : uv_ip4_addr(host, port, (struct sockaddr_in *)&addr);
    if (rc)
        return rd_fail(RD_EINVAL, "UPDATE_FORWARD: host \"%s\" is not a numeric IP address", host);
    relay *r = calloc(1, sizeof *r);
    if (!r)
        return rd_fail(RD_ENOMEM, "UPDATE_FORWARD: out of memory");
    r->src = *src;
    r->counted = 1;
    r->next_xfer_id = next_xfer_id;
    r->window = window;
    r->auth = key != NULL;
    if (key)
        memcpy(r->key, key, sizeof r->key);
    r->state = PROTO_FWD_SENDING;
    r->attached = 1;
    uv_tcp_init(loop, &r->tcp);
    r->tcp.data = r;
    r->handle_open = 1;
    r->connect.data = r;
    if ((rc = uv_tcp_connect(&r->connect, &r->tcp, (const struct sockaddr *)&addr, on_connect))) {
        r->attached = 0;
        r->counted = 0; /* the source never counted it */
        close_handle(r); /* frees r once closed */
        return rd_fail(RD_EINVAL, "UPDATE_FORWARD: cannot connect to %s:%u: %s", host, port, uv_strerror(rc));
    }
    *out = r;
    return 0;
}

void relay_kick(relay *r) { pump(r); }

void relay_close(relay *r)
{
    r->attached = 0;
    if (r->state == PROTO_FWD_SENDING)
        r->state = PROTO_FWD_FAILED;
    r->sending = 0;
    close_handle(r);
    free_if_done(r);
}

void relay_state(const relay *r, uint8_t *state, uint32_t *error, uint64_t *acked_bytes)
{
    *state = r->state;
    *error = r->error;
    *acked_bytes = r->acked_bytes;
}
