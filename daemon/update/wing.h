/* wing.h - the weight-update wing (daemon/update/): transfers, the data
 * lane, relays and weights sync around one state of their own, and the one
 * door the loop uses. The loop hands it a host_env (daemon/host.h) and feeds
 * it the update requests, the wake, the tick and the closed pipes; the wing
 * answers through env.reply and never calls the loop by name.
 *
 * Inside the wing, bottom to top: relay and lane_server (no transfer in
 * sight: a relay_source, a lane_sink), transfer (the sink and the source),
 * sync (reads the transfer state), wing (wires them). */
#ifndef RD_DAEMON_UPDATE_WING_H
#define RD_DAEMON_UPDATE_WING_H

#include <stdint.h>

#include "daemon/host.h"
#include "daemon/metrics.h"
#include "daemon/update/lane_server.h"
#include "daemon/update/sync.h"
#include "daemon/update/transfer.h"

typedef struct {
    host_env env;               /* what the wing uses of the daemon */
    xfer_state xfer;            /* transfers: the open one, the last one's outcome */
    lane_server *lane;          /* the data lane, NULL when off */
    sync_state sync;            /* WEIGHTS_SYNC and weights_from */
} wing;

/* Before anything else runs: env's pointers must outlive the wing. */
void wing_init(wing *w, const host_env *env);
/* The data lane (its port goes into UPDATE_BEGIN_OK). */
int wing_start_lane(wing *w);
/* weights_from: ask the peer for its weights once serving. */
int wing_start_sync(wing *w);

/* 1 when m is the wing's (UPDATE_BEGIN, COMMIT, ABORT, PREPARE, FORWARD,
 * WEIGHTS_SYNC): it has been answered (now or later); 0: not the wing's. */
int wing_on_message(wing *w, br_ctx *x, const proto_msg *m, uint32_t pipe);
/* UPDATE_CHUNK over NNG: takes the request message (the data points into it). */
void wing_on_chunk(wing *w, br_ctx *x, const proto_update_chunk *c, nng_msg *msg);
/* The loop woke: a swap may have landed (the serving version moves on). */
void wing_on_wake(wing *w);
/* The engine thread's answer to a pushed adapter's load (an et_done with lora set and tag XFER_LORA_KEY). */
void wing_on_lora(wing *w, int rc, const char *msg, int32_t rank, int64_t bytes, const char *evicted);
/* Once a second: the lane's stalled connections, relay retries, idle transfers. */
void wing_on_tick(wing *w);
void wing_on_pipe_closed(wing *w, uint32_t pipe);
void wing_on_client_forgotten(wing *w, uint64_t client_id);
/* The update fields of the status snapshot. */
void wing_snapshot(const wing *w, mx_snapshot *s);
/* 1 when the lane faces the network without a secret (insecure). */
int wing_exposed(const wing *w);
/* Shutdown on the loop thread: the lane closes. */
void wing_stop(wing *w);
/* After the loop has ended: the sync threads are joined, the lane freed. */
void wing_free(wing *w);

#endif
