/* daemon.h - the daemon's state, owned by the loop thread (main.c builds it,
 * loop.c serves the protocol, the timers and the signals). */
#ifndef RD_DAEMON_DAEMON_H
#define RD_DAEMON_DAEMON_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <uv.h>

#include "daemon/bridge.h"
#include "daemon/clients.h"
#include "daemon/config.h"
#include "daemon/engine_thread.h"
#include "daemon/http.h"
#include "daemon/metrics.h"
#include "engine/model/loader.h"
#include "proto/auth.h"
#include "proto/proto.h"

#define RD_SERVER_NAME "rolloutd 0.1.0"

typedef enum { D_SERVING, D_DRAINING, D_EXITING } d_state;

typedef struct up_xfer up_xfer;
typedef struct relay relay;



typedef struct rd_daemon {
    cfg_daemon cfg;
    rd_loaded L;                /* backend, model, tokenizer */
    engine *eng;                /* run by the engine thread */
    char model_name[256];
    proto_hello_ok lim;         /* model description and limits (HELLO_OK minus the per-client fields) */
    int32_t kv_blocks_total;    /* for admission: a request must fit the whole pool */
    uint64_t weight_version;    /* policy version serving (0 until weight updates, issue 4) */
    uint64_t t_start_us;

    uv_loop_t loop;
    uv_async_t wake;            /* NNG requests and engine results are ready */
    uv_timer_t tick;            /* 1 s: throughput window, client TTL */
    uv_timer_t drain_timer;     /* SIGTERM + drain_s: abort what still runs */
    uv_timer_t grace_timer;     /* then shutdown_grace_s to deliver results */
    uv_signal_t sigint, sigterm;
    bridge br;
    http_server http;
    struct api *api;            /* the HTTP generation routes (api.h), NULL before loop_http_start */
    et_thread et;
    cl_table clients;
    mx_window win;
    eng_stats stats;            /* latest engine snapshot */

    d_state state;
    int drain_expired;          /* the drain time passed: everything unfinished was aborted */
    int grace_started;
    int n_signals;
    int64_t accepted, rejected, errors;
    proto_buf out;              /* encoding scratch for replies */
    /* weight updates (update.c) */
    up_xfer *xfer;              /* the open transfer (staging or committing), or NULL */
    up_last last_update;
    uint64_t updates_ok, updates_failed, update_bytes_total;
    uint64_t last_commit_xfer;  /* a repeated COMMIT of it gets the same reply */
    proto_update_commit_ok last_commit_ok;
    uint64_t last_aborted_xfer; /* a repeated UPDATE_ABORT of it gets ABORT_OK 0 */
    uint32_t last_abort_code;   /* ... and a PREPARE or COMMIT of it this code and reason */
    char last_abort_why[512];
    struct lane_server *lane;   /* the data lane (lane.c), NULL when off */
    uint16_t lane_port;         /* its TCP port, announced in UPDATE_BEGIN_OK */
    int exit_code;
    int exposed;                /* the learner socket or the lane is on a non-loopback address (insecure) */
    /* the shared secret (auth.c; auth_token_file): 0 auth_len = no authentication */
    char auth_secret[PROTO_AUTH_MAX_SECRET + 1];
    size_t auth_len;
    u64map auth_pipes;          /* NNG pipe id -> its handshake state */
    uint64_t auth_failures;     /* wrong proofs */
    /* weights sync (sync.c, §10.13) */
    atomic_int sync_running;    /* a push of this daemon's weights to another runs */
    atomic_int sync_exporting;  /* ... and is still reading the weights: no update may begin */
    atomic_int sync_stop;       /* shutting down: the weights_from asker gives up */
    pthread_t sync_thread, sync_ask_thread;
    int sync_joinable, sync_ask_joinable;
} rd_daemon;

/* loop.c */
void loop_reply_error(rd_daemon *d, br_ctx *x, uint32_t code, uint16_t type, const char *msg);
void loop_reply_msg(rd_daemon *d, br_ctx *x, const proto_msg *m);
void loop_on_wake(uv_async_t *h);
void loop_on_tick(uv_timer_t *t);
void loop_on_signal(uv_signal_t *s, int signum);
void loop_on_fetch_timeout(uv_timer_t *t);
/* Closes NNG, stops the engine thread, then closes every libuv handle so
 * uv_run returns. */
void loop_shutdown(rd_daemon *d);
char *loop_status_json(void *ud);
char *loop_metrics_text(void *ud);
/* The HTTP server with the daemon's route table (/status, /metrics, /health). */
int loop_http_start(rd_daemon *d);

/* auth.c: the learner socket's handshake (PROTOCOL.md §14). */
int auth_load(rd_daemon *d);
/* 1 when the connection may send other requests (authenticated, or no secret). */
int auth_pipe_ok(rd_daemon *d, uint32_t pipe);
/* AUTH_BEGIN and AUTH. */
void auth_on_message(rd_daemon *d, br_ctx *x, const proto_msg *m, uint32_t pipe);
void auth_on_pipe_closed(rd_daemon *d, uint32_t pipe);
void auth_free(rd_daemon *d);

/* update.c: the weight-update messages (PROTOCOL.md §10), loop thread. */
void up_on_begin(rd_daemon *d, br_ctx *x, const proto_update_begin *b, uint32_t pipe);
/* Where a chunk's reply goes: an NNG context, or (send set) the data lane. */
typedef struct {
    br_ctx *ctx;
    void (*send)(rd_daemon *d, void *arg, uint32_t code, const char *why, const proto_update_chunk_ok *ok);
    void *arg;
} up_sink;

/* Takes the request message: the chunk's data points into it. */
void up_on_chunk(rd_daemon *d, br_ctx *x, const proto_update_chunk *c, nng_msg *msg);
void up_on_commit(rd_daemon *d, br_ctx *x, const proto_update_ref *r);
void up_on_abort(rd_daemon *d, br_ctx *x, const proto_update_ref *r);
/* The data lane's path (lane.c): claim a chunk by its head; 0 and *dest =
 * where its bytes go in the staging area (or *dup: already staged), else a
 * PROTO_E_* code with why. Then up_chunk_filled once the bytes are there, or
 * up_chunk_abandon if they never arrive. */
int up_chunk_claim(rd_daemon *d, const proto_update_chunk *c, up_xfer **x, uint8_t **dest, int *dup, char *why,
                   size_t why_cap);
void up_chunk_filled(rd_daemon *d, up_xfer *x, const proto_update_chunk *c, const up_sink *sink);
void up_chunk_abandon(rd_daemon *d, up_xfer *x, const proto_update_chunk *c);
void up_chunk_duplicate(rd_daemon *d, up_xfer *x, const proto_update_chunk *c, const up_sink *sink);
uint64_t up_xfer_id(const up_xfer *x);
int up_xfer_has_room(const up_xfer *x);
/* lane.c: the data lane's TCP server. */
int lane_start(rd_daemon *d);
void lane_stop(rd_daemon *d);
/* A chunk settled: readers paused for the window may go on. */
void lane_on_room(rd_daemon *d);
/* Once a second: a connection stalled inside a chunk is closed, releasing its range. */
void lane_on_tick(rd_daemon *d);

/* The chain (§10.11): PREPARE verifies and builds without swapping; FORWARD
 * starts (or moves) the relay of verified chunks to the next daemon. */
void up_on_prepare(rd_daemon *d, br_ctx *x, const proto_update_ref *r);
void up_on_forward(rd_daemon *d, br_ctx *x, const proto_update_forward *f);
/* A verified chunk as the relay resends it. */
typedef struct {
    uint32_t tensor_index;
    uint32_t len;               /* bytes */
    uint32_t crc32c;
    uint64_t offset;            /* bytes into the tensor */
} up_fchunk;
/* For relay.c: the verified chunks so far (the array may move when more
 * settle), a chunk's bytes in the staging area, whether every byte is here. */
const up_fchunk *up_fwd_log(const up_xfer *x, uint32_t *n);
const uint8_t *up_fwd_data(const up_xfer *x, const up_fchunk *c);
int up_xfer_complete(const up_xfer *x);
/* A relay's connection is closed and it reads nothing any more. */
void up_on_relay_closed(rd_daemon *d, up_xfer *x);

/* sync.c: WEIGHTS_SYNC (push the serving weights to url), and weights_from
 * (ask a peer for that once serving); sync_stop joins the threads. */
void sync_on_request(rd_daemon *d, br_ctx *x, const proto_weights_sync *s);
int sync_start(rd_daemon *d);
void sync_stop(rd_daemon *d);

/* relay.c: one transfer's chunks forwarded to the next daemon's lane. */
int relay_start(rd_daemon *d, up_xfer *x, const char *host, uint16_t port, uint64_t next_xfer_id, uint32_t window,
                const uint8_t *key, relay **out);
/* More verified chunks, or the transfer is complete: send what the window allows. */
void relay_kick(relay *r);
/* Once a second: a pass that ended with refused chunks starts again. */
void relay_tick(relay *r);
/* Stops it; up_on_relay_closed follows once its connection is closed. */
void relay_close(relay *r);
/* PROTO_FWD_*, the next daemon's error code when it failed, bytes it acknowledged. */
void relay_state(const relay *r, uint8_t *state, uint32_t *error, uint64_t *acked_bytes);

/* The engine thread swapped: reply to the COMMIT. */
void up_on_wake(rd_daemon *d);
void up_on_pipe_closed(rd_daemon *d, uint32_t pipe);
void up_on_tick(rd_daemon *d);
void up_on_client_forgotten(rd_daemon *d, uint64_t client_id);
/* Fields for the status snapshot: an update in progress. */
void up_progress(const rd_daemon *d, int *active, uint64_t *version, uint64_t *staged, uint64_t *total,
                 int *committing);

#endif
