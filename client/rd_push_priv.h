/* rd_push_priv.h - what rd_push.c (direct fan-out) and rd_chain.c (chained
 * broadcast) share: the plan of chunks, one daemon's push state and the steps
 * both modes take on a daemon (rd_push_job.c, below both). Not part of the
 * client's API. */
#ifndef RD_PUSH_PRIV_H
#define RD_PUSH_PRIV_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "client/rd_client.h"
#include "client/rd_push.h"

typedef struct {
    uint32_t tensor;
    uint64_t off;
    uint32_t len;
    uint32_t crc;
} rdp_chunk;

/* The shared, read-only plan. */
typedef struct {
    const rdp_tensor *tensors;
    int n_tensors;
    proto_tensor *manifest;     /* [n_tensors] */
    rdp_chunk *chunks;
    uint32_t n_chunks;
    uint64_t total;
    int any_delta;              /* a tensor is a delta: UPDATE_BEGIN goes in protocol version 3 */
    const rdp_options *o;
} rdp_plan;

/* One daemon's push. */
typedef struct {
    const rdp_plan *p;
    rdp_target *t;
    rdc_client *c;
    uint64_t xfer;
    uint32_t window, max_chunk;
    atomic_uint next;           /* next chunk to send */
    atomic_int failed;
    atomic_int stop;            /* the chain needs no more chunks from this process (not a failure) */
    _Atomic uint64_t acked, wire;
    atomic_uint retries;
    atomic_int done;            /* the target thread has finished */
    uint16_t lane_port;         /* the daemon's data lane (0: none) */
    /* data lane state (rdp_lane_send / lane_reader) */
    int fd;                     /* -1 when not connected; set and closed under mu (rdp_stop_feeding) */
    pthread_cond_t cv;
    uint32_t outstanding;       /* chunks written and not answered */
    int reader_done;
    pthread_mutex_t mu;         /* t->error, fd, outstanding */
    pthread_t thread;
} rdp_job;

/* rd_push_job.c: the steps on one daemon. */

/* Records the first failure of a daemon's push (later ones are consequences). */
void rdp_fail_job(rdp_job *j, int rc, uint32_t code, const char *msg);
/* UPDATE_BEGIN: sets xfer, window, max_chunk, lane_port; a failure is recorded. */
int rdp_begin(rdp_job *j);
/* Sends every chunk of the plan on the daemon's data lane; failures are recorded in j. */
void rdp_lane_send(rdp_job *j, const char *url);
/* Makes a running rdp_lane_send return soon (it breaks its connection). */
void rdp_stop_feeding(rdp_job *j);
/* UPDATE_COMMIT (repeated while BUSY or unanswered), then BYE; a failure is recorded. */
int rdp_commit(rdp_job *j);
/* UPDATE_ABORT, best effort (the transfer also ends when the connection closes). */
void rdp_abort(rdp_job *j);
/* The host part of a tcp:// URL, or -1. */
int rdp_url_host(const char *url, char *host, size_t size);

/* The chained broadcast over jobs[0..n) (rd_chain.c), t0 the push's start:
 * 0 when every daemon serves the update, a negative code when one failed
 * (each target says how), or 1 when a daemon offers no data lane (TLS),
 * having aborted every transfer: the caller then pushes directly. */
int rdp_chain(rdp_job *jobs, int n, const rdp_plan *p, double t0);

#endif
