/* host.h - what the parts of the daemon below the loop are handed by it:
 * the reply interface (the loop encodes and sends), the shared secret, the
 * daemon's run state, and (for the weight-update wing, daemon/update/) the
 * pieces of the daemon it works with. With these a part never includes
 * daemon.h and never calls a loop_* function by name.
 *
 * The daemon's include order, bottom to top (a file includes headers of its
 * own step or lower ones, never higher):
 *   base/ -> engine/, proto/ (one floor, neither includes the other) -> client/
 *   -> daemon/log, config, netaddr, relay_allow, serve_hist, clients, bridge, metrics, engine_thread, http, http_tls
 *   -> daemon/host.h (this file)
 *   -> daemon/update/convert.h        (wire enums <-> engine enums, the one place)
 *   -> daemon/update/relay, lane_server (know nothing of a transfer: a source, a sink)
 *   -> daemon/update/transfer         (the lane's sink, the relay's source)
 *   -> daemon/update/sync             (reads transfer state, blocks begins)
 *   -> daemon/update/wing             (the wing's state and its door for the loop)
 *   -> daemon/pipe_auth               (the learner socket's handshake)
 *   -> daemon/daemon.h -> daemon/api*.c, loop.c -> main.c */
#ifndef RD_DAEMON_HOST_H
#define RD_DAEMON_HOST_H

#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "daemon/bridge.h"
#include "daemon/clients.h"
#include "daemon/config.h"
#include "daemon/engine_thread.h"
#include "daemon/lora_reg.h"
#include "daemon/serve_hist.h"
#include "engine/model/model.h"
#include "proto/auth.h"
#include "proto/proto.h"

/* The daemon's run state (the loop changes it; the wing only reads it). */
typedef enum { D_SERVING, D_DRAINING, D_EXITING } d_state;

/* How a part answers an NNG request: the loop implements both (loop.c),
 * encoding into its scratch buffer and counting errors; ctx is the daemon. */
typedef struct {
    void (*msg)(void *ctx, br_ctx *x, const proto_msg *m);
    void (*error)(void *ctx, br_ctx *x, uint32_t code, uint16_t type, const char *why);
    void *ctx;
} host_reply;

/* The shared secret (auth_token_file), loaded once at start. One secret
 * serves the learner socket, the lane, relays and HTTP (DESIGN.md). */
typedef struct {
    char bytes[PROTO_AUTH_MAX_SECRET + 1]; /* NUL-terminated */
    size_t len;                 /* bytes; 0 = no authentication */
} host_secret;

/* What the weight-update wing uses of the daemon: pointers into rd_daemon,
 * filled by main.c before anything runs. Loop thread only, except that the
 * weights sync's push thread reads m, cfg and secret (they do not change). */
typedef struct {
    host_reply reply;
    const cfg_daemon *cfg;
    uv_loop_t *loop;            /* worker jobs, TCP handles */
    et_thread *et;              /* the engine thread: its step count, the swap */
    model *m;                   /* the serving model */
    cl_table *clients;          /* senders must be known clients */
    const d_state *state;       /* updates begin only while D_SERVING */
    uint64_t *weight_version;   /* the serving version; the wing sets it when a swap lands */
    sh_hist *serve;             /* what each version is served as; the wing notes each swap */
    const uint64_t *max_message_bytes; /* bytes: HELLO_OK's frame limit */
    const uint64_t *t_start_us; /* monotonic µs at start (up_last.at_s) */
    const host_secret *secret;
    lr_table *loras;            /* the adapters resident in the engine: a pushed one joins it at its COMMIT */
} host_env;

#endif
