/* bridge.h - the NNG side of the learner socket: one rep0 socket, many
 * contexts, each holding one request at a time.
 *
 * NNG callbacks run on NNG's threads: they only put the context on a queue,
 * wake the loop (uv_async_send) and re-arm receives; the loop thread drains the
 * whole queue on each wake (sends coalesce), decodes, and answers with
 * br_reply. A context stays with its request until it is answered, which is how
 * a FETCH long-poll parks (its uv_timer bounds the wait). */
#ifndef RD_DAEMON_BRIDGE_H
#define RD_DAEMON_BRIDGE_H

#include <nng/nng.h>
#include <nng/protocol/reqrep0/rep.h>
#include <nng/supplemental/tls/tls.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "proto/proto.h"

typedef enum { BR_RECV, BR_WORK, BR_SEND } br_state;

typedef struct br_ctx {
    struct bridge *b;
    nng_ctx ctx;
    nng_aio *aio;
    br_state state;
    nng_msg *msg;               /* the request while BR_WORK */
    uint16_t version;           /* the protocol version of the request being served, its reply's (0 = 1) */
    struct br_ctx *qnext;       /* the ready queue */
    uv_timer_t timer;           /* parked FETCH deadline (loop thread) */
    int parked;                 /* a FETCH waits here */
    uint64_t client_id;         /* of the parked FETCH */
    proto_fetch fetch;          /* the parked FETCH */
} br_ctx;

typedef struct bridge {
    nng_socket sock;
    nng_listener listener;
    int open;
    br_ctx *ctxs;               /* [n] */
    int n;
    pthread_mutex_t mu;
    br_ctx *q, *q_tail;         /* received, waiting for the loop */
    uv_async_t *wake;
    size_t max_msg;             /* bytes */
    nng_listener self;          /* br_listen_self's inproc listener (0: none) */
    char self_url[64];          /* its URL, "" when none */
    uint32_t closed[256];       /* ids of pipes that closed, not yet taken (a ring would drop; this drops the oldest) */
    int n_closed;
} bridge;

/* Opens the socket, listens on url with RECVMAXSZ = max_msg (and, for a
 * tls+tcp:// url, the server TLS config tls), starts n contexts. Timers are initialised on loop (the caller's thread). */
int br_open(bridge *b, uv_loop_t *loop, const char *url, int n, size_t max_msg, uv_async_t *wake,
            nng_tls_config *tls);
/* A second listener on an inproc:// URL of this process (self_url), for the
 * daemon's own pushes (/update_weights_from_disk) when the learner socket is
 * TLS: the push then needs no CA to verify the daemon by, and no byte leaves
 * the process. */
int br_listen_self(bridge *b);
/* Pops one received request (loop thread); NULL when none. */
br_ctx *br_next(bridge *b);
/* Sends a reply frame from the context (copied into an nng_msg); the
 * context then waits for its next request. */
int br_reply(br_ctx *c, const uint8_t *frame, size_t len);
/* Takes up to max ids of connections (NNG pipes) that closed since the last
 * call (loop thread); returns how many. */
int br_take_closed(bridge *b, uint32_t *out, int max);
/* Closes the socket and stops every aio (waits for running callbacks); frees
 * requests still queued. After this no callback runs and the async is not
 * touched. Timers are left for the loop's uv_walk. */
void br_close(bridge *b);

#endif
