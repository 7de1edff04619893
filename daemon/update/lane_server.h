/* lane_server.h - the weight-update data lane's TCP server (PROTOCOL.md
 * §10.10, §10.12). The lane reads UPDATE_CHUNK frames straight into staging
 * memory and hands each chunk to a lane_sink (transfer.c provides one); it
 * knows nothing of a transfer beyond what the sink tells it, and the sink
 * tells it when the window has room again. */
#ifndef RD_DAEMON_UPDATE_LANE_SERVER_H
#define RD_DAEMON_UPDATE_LANE_SERVER_H

#include <stddef.h>
#include <stdint.h>

#include "daemon/host.h"
#include "proto/proto.h"

/* Where the sink sends a chunk's reply: back on the lane connection it came on. */
typedef struct {
    void (*send)(void *arg, uint32_t code, const char *why, const proto_update_chunk_ok *ok);
    void *arg;
} lane_answer;

/* What the lane does with chunks; every call on the loop thread, ctx the sink's. */
typedef struct {
    /* Claims a chunk by its head: 0 and *dest = where its bytes go (or *dup:
     * already staged, nothing claimed), *hold = what to pass back while the
     * range is claimed; else a PROTO_E_* code with why. Then filled once the
     * bytes are there, or abandon if they never arrive. */
    int (*claim)(void *ctx, const proto_update_chunk *c, void **hold, uint8_t **dest, int *dup, char *why,
                 size_t why_cap);
    /* The claimed range holds the bytes: check them; the reply goes to a. */
    void (*filled)(void *ctx, void *hold, const proto_update_chunk *c, const lane_answer *a);
    /* The claimed range's bytes will not come: release it. */
    void (*abandon)(void *ctx, void *hold, const proto_update_chunk *c);
    /* 1 when xfer_id names the open transfer. */
    int (*is_open)(void *ctx, uint64_t xfer_id);
    /* A chunk of the open transfer that was already staged: the DUPLICATE ack goes to a. */
    void (*duplicate)(void *ctx, const proto_update_chunk *c, const lane_answer *a);
    /* 1 unless the open transfer's window is full (1 with none open). */
    int (*has_room)(void *ctx);
    /* The room signal: the sink calls room(arg) each time a chunk settles,
     * so readers paused for the window go on. lane_start registers it. */
    void (*watch_room)(void *ctx, void (*room)(void *arg), void *arg);
    void *ctx;
} lane_sink;

typedef struct lane_server lane_server;

/* Listens on update_listen (or the learner socket's host); *out stays NULL
 * when the lane is off. On a listen failure *out is set too (lane_free it). */
int lane_start(const host_env *env, const lane_sink *sink, lane_server **out);
/* Its TCP port, announced in UPDATE_BEGIN_OK. */
uint16_t lane_port(const lane_server *s);
/* 1 when it listens on a non-loopback address without a secret (insecure). */
int lane_exposed(const lane_server *s);
/* Connections open now, evicted and refused since start (max_lane_connections); s may be NULL. */
void lane_counts(const lane_server *s, int *open, uint64_t *evicted, uint64_t *refused);
/* Once a second: a connection stalled inside a chunk, or silent before its
 * LANE_AUTH, is closed (its range released). */
void lane_on_tick(lane_server *s);
/* Closes the listener and every connection (shutdown). */
void lane_stop(lane_server *s);
/* After the loop has ended. */
void lane_free(lane_server *s);

#endif
