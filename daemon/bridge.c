/* bridge.c - see bridge.h. */
#include "daemon/bridge.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "daemon/log.h"
#include "base/err.h"

static void on_aio(void *arg)
{
    br_ctx *c = arg;
    bridge *b = c->b;
    int rv = nng_aio_result(c->aio);
    if (c->state == BR_SEND) {
        if (rv != 0) {
            /* Not sent (peer gone, socket closing): the message is still ours. */
            nng_msg *m = nng_aio_get_msg(c->aio);
            if (m)
                nng_msg_free(m);
        }
        if (rv == NNG_ECLOSED)
            return;
        c->state = BR_RECV;
        nng_ctx_recv(c->ctx, c->aio);
        return;
    }
    /* BR_RECV */
    if (rv == NNG_ECLOSED || rv == NNG_ECANCELED)
        return;
    if (rv != 0) {
        nng_ctx_recv(c->ctx, c->aio);
        return;
    }
    c->msg = nng_aio_get_msg(c->aio);
    c->state = BR_WORK;
    pthread_mutex_lock(&b->mu);
    c->qnext = NULL;
    if (b->q_tail)
        b->q_tail->qnext = c;
    else
        b->q = c;
    b->q_tail = c;
    pthread_mutex_unlock(&b->mu);
    uv_async_send(b->wake);
}

/* NNG thread: a connection went away. A weight transfer tied to it ends. */
static void on_pipe_rem(nng_pipe p, nng_pipe_ev ev, void *arg)
{
    bridge *b = arg;
    pthread_mutex_lock(&b->mu);
    if (b->n_closed == (int)(sizeof b->closed / sizeof b->closed[0])) {
        memmove(b->closed, b->closed + 1, sizeof b->closed - sizeof b->closed[0]);
        b->n_closed--;
    }
    b->closed[b->n_closed++] = nng_pipe_id(p);
    pthread_mutex_unlock(&b->mu);
    uv_async_send(b->wake);
}

int br_take_closed(bridge *b, uint32_t *out, int max)
{
    pthread_mutex_lock(&b->mu);
    int n = b->n_closed < max ? b->n_closed : max;
    memcpy(out, b->closed, sizeof *out * (size_t)n);
    memmove(b->closed, b->closed + n, sizeof *b->closed * (size_t)(b->n_closed - n));
    b->n_closed -= n;
    pthread_mutex_unlock(&b->mu);
    return n;
}

int br_open(bridge *b, uv_loop_t *loop, const char *url, int n, size_t max_msg, uv_async_t *wake,
            nng_tls_config *tls)
{
    memset(b, 0, sizeof *b);
    b->wake = wake;
    b->max_msg = max_msg;
    pthread_mutex_init(&b->mu, NULL);
    int rv = nng_rep0_open(&b->sock);
    if (rv)
        return rd_fail(RD_EIO, "nng rep0 socket: %s", nng_strerror(rv));
    b->open = 1;
    nng_pipe_notify(b->sock, NNG_PIPE_EV_REM_POST, on_pipe_rem, b);
    if ((rv = nng_listener_create(&b->listener, b->sock, url)) ||
        (rv = nng_listener_set_size(b->listener, NNG_OPT_RECVMAXSZ, max_msg)) ||
        (tls && (rv = nng_listener_set_ptr(b->listener, NNG_OPT_TLS_CONFIG, tls))) ||
        (rv = nng_listener_start(b->listener, 0))) {
        nng_close(b->sock);
        b->open = 0;
        return rd_fail(RD_EIO, "cannot listen on %s: %s", url, nng_strerror(rv));
    }
    b->ctxs = calloc((size_t)n, sizeof *b->ctxs);
    if (!b->ctxs)
        return rd_fail(RD_ENOMEM, "bridge: out of memory");
    b->n = n;
    for (int i = 0; i < n; i++) {
        br_ctx *c = &b->ctxs[i];
        c->b = b;
        uv_timer_init(loop, &c->timer);
        c->timer.data = c;
        if ((rv = nng_aio_alloc(&c->aio, on_aio, c)) || (rv = nng_ctx_open(&c->ctx, b->sock)))
            return rd_fail(RD_EIO, "nng context %d: %s", i, nng_strerror(rv));
    }
    for (int i = 0; i < n; i++) {
        b->ctxs[i].state = BR_RECV;
        nng_ctx_recv(b->ctxs[i].ctx, b->ctxs[i].aio);
    }
    return 0;
}

int br_listen_self(bridge *b)
{
    static int n;
    snprintf(b->self_url, sizeof b->self_url, "inproc://rolloutd-self-%ld-%d", (long)getpid(), n++);
    int rv = nng_listener_create(&b->self, b->sock, b->self_url);
    if (!rv)
        nng_listener_set_size(b->self, NNG_OPT_RECVMAXSZ, b->max_msg); /* not every transport has it */
    if (!rv)
        rv = nng_listener_start(b->self, 0);
    if (rv) {
        rd_fail(RD_EIO, "cannot listen on %s: %s", b->self_url, nng_strerror(rv));
        b->self_url[0] = 0;
        return RD_EIO;
    }
    return 0;
}

br_ctx *br_next(bridge *b)
{
    pthread_mutex_lock(&b->mu);
    br_ctx *c = b->q;
    if (c) {
        b->q = c->qnext;
        if (!b->q)
            b->q_tail = NULL;
    }
    pthread_mutex_unlock(&b->mu);
    return c;
}

int br_reply(br_ctx *c, const uint8_t *frame, size_t len)
{
    if (c->msg) {
        nng_msg_free(c->msg);
        c->msg = NULL;
    }
    c->parked = 0;
    if (!c->b->open)
        return 0;
    nng_msg *m;
    int rv = nng_msg_alloc(&m, len);
    if (rv) {
        /* No memory for the reply: drop it and take the next request; the
         * client times out and repeats the request, which is always safe. */
        log_line("cannot allocate a %zu-byte reply: %s", len, nng_strerror(rv));
        c->state = BR_RECV;
        nng_ctx_recv(c->ctx, c->aio);
        return rd_fail(RD_ENOMEM, "reply: out of memory");
    }
    if (len)
        memcpy(nng_msg_body(m), frame, len);
    c->state = BR_SEND;
    nng_aio_set_msg(c->aio, m);
    nng_ctx_send(c->ctx, c->aio);
    return 0;
}

void br_close(bridge *b)
{
    if (b->open) {
        b->open = 0;
        nng_close(b->sock);
    }
    for (int i = 0; i < b->n; i++)
        if (b->ctxs[i].aio)
            nng_aio_stop(b->ctxs[i].aio);
    for (int i = 0; i < b->n; i++) {
        br_ctx *c = &b->ctxs[i];
        if (c->aio) {
            nng_aio_free(c->aio);
            c->aio = NULL;
        }
        if (c->msg) {
            nng_msg_free(c->msg);
            c->msg = NULL;
        }
    }
    b->q = b->q_tail = NULL;
}
