/* sync.h - WEIGHTS_SYNC (PROTOCOL.md §10.13): push this daemon's serving
 * weights to another daemon, and weights_from: ask a peer for that once
 * serving. Both sides run on threads of their own (they block on the network). */
#ifndef RD_DAEMON_UPDATE_SYNC_H
#define RD_DAEMON_UPDATE_SYNC_H

#include <pthread.h>
#include <stdatomic.h>

#include "daemon/host.h"
#include "daemon/update/transfer.h"

typedef struct {
    const host_env *env;
    xfer_state *xfer;           /* no sync while an update is open; none begins while the export reads */
    atomic_int running;         /* a push of this daemon's weights to another runs */
    atomic_int stop;            /* shutting down: the weights_from asker gives up */
    pthread_t thread, ask_thread;
    int joinable, ask_joinable;
} sync_state;

void sync_init(sync_state *s, const host_env *env, xfer_state *xfer);
/* WEIGHTS_SYNC from a client: start the push, answered through env->reply. */
void sync_on_request(sync_state *s, br_ctx *x, const proto_weights_sync *m);
/* With weights_from set: ask the peer (a thread; 0 when there is nothing to do). */
int sync_start(sync_state *s);
/* Joins the threads (after the loop has ended). */
void sync_stop(sync_state *s);

#endif
