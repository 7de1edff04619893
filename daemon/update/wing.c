/* wing.c - see wing.h: the wiring of transfers, the lane, relays and sync,
 * and the dispatch of the loop's update requests to them. */
#include "daemon/update/wing.h"

#include <string.h>

void wing_init(wing *w, const host_env *env)
{
    memset(w, 0, sizeof *w);
    w->env = *env;
    xfer_init(&w->xfer, &w->env);
    sync_init(&w->sync, &w->env, &w->xfer);
}

int wing_start_lane(wing *w)
{
    lane_sink sink = xfer_lane_sink(&w->xfer);
    int rc = lane_start(&w->env, &sink, &w->lane);
    if (!rc && w->lane)
        w->xfer.lane_port = lane_port(w->lane);
    return rc;
}

int wing_start_sync(wing *w) { return sync_start(&w->sync); }

int wing_on_message(wing *w, br_ctx *x, const proto_msg *m, uint32_t pipe)
{
    switch (m->type) {
    case PROTO_UPDATE_BEGIN: xfer_on_begin(&w->xfer, x, &m->update_begin, pipe); return 1;
    case PROTO_ADAPTER_BEGIN: xfer_on_adapter_begin(&w->xfer, x, &m->adapter_begin, pipe); return 1;
    case PROTO_UPDATE_COMMIT: xfer_on_commit(&w->xfer, x, &m->update_commit); return 1;
    case PROTO_UPDATE_ABORT: xfer_on_abort(&w->xfer, x, &m->update_abort); return 1;
    case PROTO_UPDATE_PREPARE: xfer_on_prepare(&w->xfer, x, &m->update_prepare); return 1;
    case PROTO_UPDATE_FORWARD: xfer_on_forward(&w->xfer, x, &m->update_forward); return 1;
    case PROTO_WEIGHTS_SYNC: sync_on_request(&w->sync, x, &m->weights_sync); return 1;
    default: return 0;
    }
}

void wing_on_chunk(wing *w, br_ctx *x, const proto_update_chunk *c, nng_msg *msg)
{
    xfer_on_chunk(&w->xfer, x, c, msg);
}

void wing_on_wake(wing *w) { xfer_on_wake(&w->xfer); }

void wing_on_lora(wing *w, int rc, const char *msg, int32_t rank, int64_t bytes, const char *evicted)
{
    xfer_on_lora(&w->xfer, rc, msg, rank, bytes, evicted);
}

void wing_on_tick(wing *w)
{
    lane_on_tick(w->lane);
    xfer_on_tick(&w->xfer);
}

void wing_on_pipe_closed(wing *w, uint32_t pipe) { xfer_on_pipe_closed(&w->xfer, pipe); }

void wing_on_client_forgotten(wing *w, uint64_t client_id) { xfer_on_client_forgotten(&w->xfer, client_id); }

void wing_snapshot(const wing *w, mx_snapshot *s)
{
    xfer_progress(&w->xfer, &s->update_active, &s->update_version, &s->update_staged, &s->update_total,
                  &s->update_committing);
    s->last_update = &w->xfer.last_update;
    s->updates_ok = w->xfer.updates_ok;
    s->updates_failed = w->xfer.updates_failed;
    s->update_bytes_total = w->xfer.update_bytes_total;
    s->lora_pushes_ok = w->xfer.adapters_ok;
    s->lora_pushes_failed = w->xfer.adapters_failed;
    lane_counts(w->lane, &s->lane_connections, &s->lane_evicted, &s->lane_refused);
    s->relays_refused = w->xfer.relays_refused;
}

int wing_exposed(const wing *w) { return w->lane && lane_exposed(w->lane); }

void wing_stop(wing *w) { lane_stop(w->lane); }

void wing_free(wing *w)
{
    sync_stop(&w->sync);
    lane_free(w->lane);
    w->lane = NULL;
    upd_held_free(w->xfer.held);
    w->xfer.held = NULL;
    lh_free(&w->xfer.lora_held);
}
