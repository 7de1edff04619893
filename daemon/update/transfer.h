/* transfer.h - live weight updates on the loop thread (PROTOCOL.md §10):
 * UPDATE_BEGIN .. COMMIT / ABORT, the two-phase PREPARE and the FORWARD of
 * a chain (§10.11). One transfer at a time. It is the data lane's sink
 * (xfer_lane_sink) and the source each relay reads (relay.h). */
#ifndef RD_DAEMON_UPDATE_TRANSFER_H
#define RD_DAEMON_UPDATE_TRANSFER_H

#include <stdatomic.h>
#include <stdint.h>

#include "daemon/host.h"
#include "daemon/metrics.h"
#include "daemon/relay_allow.h"
#include "daemon/update/lane_server.h"
#include "daemon/update/lora_held.h"
#include "engine/update/delta.h"
#include "proto/proto.h"

typedef struct xfer xfer;

/* Every transfer's bookkeeping, and what outlives a transfer (for repeated
 * requests and the status). */
typedef struct {
    const host_env *env;
    xfer *open;                 /* the open transfer (staging or committing), or NULL */
    up_last last_update;
    uint64_t updates_ok, updates_failed;
    uint64_t update_bytes_total; /* bytes swapped in, all updates */
    uint64_t last_commit_xfer;  /* a repeated COMMIT of it gets the same reply */
    proto_update_commit_ok last_commit_ok;
    uint64_t last_aborted_xfer; /* a repeated UPDATE_ABORT of it gets ABORT_OK 0 */
    uint32_t last_abort_code;   /* ... and a PREPARE or COMMIT of it this code and reason */
    char last_abort_why[512];
    uint16_t lane_port;         /* the data lane's TCP port, announced in UPDATE_BEGIN_OK (0: no lane) */
    /* A weights sync is reading the serving weights (sync.c, another thread
     * clears it): no update may begin, so nothing is swapped and freed under it. */
    atomic_int weights_busy;
    ra_list relay_allow;        /* where UPDATE_FORWARD may send (relay_allow, parsed at init) */
    uint64_t relays_refused;    /* UPDATE_FORWARDs refused FORBIDDEN */
    upd_held *held;             /* which weights are held as pushed, in which dtype (deltas need it), or NULL */
    uint64_t adapters_ok, adapters_failed; /* LoRA adapter pushes (ADAPTER_BEGIN) that served, that failed */
    lh_table lora_held;         /* the pushed adapters' bytes: their deltas' bases */
    void (*room)(void *arg);    /* the lane's room signal (lane_sink.watch_room), or NULL */
    void *room_arg;
} xfer_state;

void xfer_init(xfer_state *s, const host_env *env);

/* The engine key of a pushed adapter's load (et_lora_put): its answer comes back to xfer_on_lora. Apart
 * from the HTTP keys (bit 63) and the NNG clients' (which no adapter load answers). */
#define XFER_LORA_KEY (1ull << 62)

/* The NNG requests; each is answered through env->reply (now or later). */
void xfer_on_begin(xfer_state *s, br_ctx *x, const proto_update_begin *b, uint32_t pipe);
/* A LoRA adapter's transfer (§10.15): staged, relayed, prepared and committed as a weight update's, built
 * into an adapter instead of weights, and swapped in under its name by the engine thread. */
void xfer_on_adapter_begin(xfer_state *s, br_ctx *x, const proto_adapter_begin *b, uint32_t pipe);
/* Takes the request message: the chunk's data points into it. */
void xfer_on_chunk(xfer_state *s, br_ctx *x, const proto_update_chunk *c, nng_msg *msg);
void xfer_on_commit(xfer_state *s, br_ctx *x, const proto_update_ref *r);
void xfer_on_abort(xfer_state *s, br_ctx *x, const proto_update_ref *r);
/* PREPARE verifies and builds without swapping; FORWARD starts (or moves)
 * the relay of verified chunks to the next daemon. */
void xfer_on_prepare(xfer_state *s, br_ctx *x, const proto_update_ref *r);
void xfer_on_forward(xfer_state *s, br_ctx *x, const proto_update_forward *f);

/* The data lane's sink: chunks read from the lane go into the open transfer. */
lane_sink xfer_lane_sink(xfer_state *s);

/* The engine thread swapped: the serving version moves on and the COMMIT is answered. */
void xfer_on_wake(xfer_state *s);
/* The engine thread loaded the committing adapter (rc 0: rank, the backend's bytes, the idle adapter it
 * evicted or "") or refused it (rc, msg): the COMMIT is answered. */
void xfer_on_lora(xfer_state *s, int rc, const char *msg, int32_t rank, int64_t bytes, const char *evicted);
void xfer_on_pipe_closed(xfer_state *s, uint32_t pipe);
/* Once a second: relays retry, an idle transfer is aborted (update_idle_s). */
void xfer_on_tick(xfer_state *s);
void xfer_on_client_forgotten(xfer_state *s, uint64_t client_id);
/* 1 when a transfer is open. */
int xfer_active(const xfer_state *s);
/* Fields for the status snapshot: an update in progress. */
void xfer_progress(const xfer_state *s, int *active, uint64_t *version, uint64_t *staged, uint64_t *total,
                   int *committing);

#endif
