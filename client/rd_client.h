/* rd_client.h - the C client of the rolloutd learner protocol (proto/PROTOCOL.md).
 *
 * One rdc_client is one req0 socket dialed to a daemon, one client identity
 * (client_id from HELLO) and one NNG context. It is used by one thread at a
 * time; a program that wants parallel traffic opens one client per thread
 * (rolloutctl bench does).
 *
 *   rdc_client *c;
 *   rdc_open("tcp://127.0.0.1:7070", &c);     dial, resends off, RECVMAXSZ set
 *   rdc_hello(c, 0, "my-learner");           new client (or a client_id to resume)
 *   rdc_run(c, reqs, n, &samples, &n_samples) submit, fetch until all done, ack
 *   rdc_bye(c, 0, NULL); rdc_close(c);
 *
 * Every function returns 0 or a negative code: RD_E* from base/err.h for
 * local failures (RD_EIO: the transport failed, RD_EFORMAT: the daemon's reply
 * did not decode or was not the expected type), RDC_ETIMEDOUT when no reply
 * came in time (the request is safe to repeat, PROTOCOL.md §8) and
 * RDC_EDAEMON when the daemon answered ERROR: rdc_error_code() is then the
 * PROTO_E_* code and rd_errmsg() reads "daemon error NAME (code): message". */
#ifndef RD_CLIENT_H
#define RD_CLIENT_H

#include <stddef.h>
#include <stdint.h>

#include "proto/proto.h"

#define RDC_EDAEMON (-100)          /* the daemon replied ERROR (rdc_error_code says which) */
#define RDC_ETIMEDOUT (-101)        /* no reply within the timeout; the request may be repeated */

#define RDC_DEFAULT_URL "tcp://127.0.0.1:7070"
#define RDC_TIMEOUT_MS 30000        /* reply timeout of every request but FETCH */
#define RDC_FETCH_MARGIN_MS 10000   /* FETCH waits wait_ms plus this for its reply */

typedef struct rdc_client rdc_client;

/* Dials url (blocking: a daemon that is not listening is RD_EIO, "connection
 * refused"). Sets NNG_OPT_REQ_RESENDTIME to infinite (no silent resends of a
 * long FETCH or a large SUBMIT) and NNG_OPT_RECVMAXSZ on the dialer to the
 * default 64 MiB until HELLO_OK announces max_message_bytes. */
int rdc_open(const char *url, rdc_client **out);
/* With $ROLLOUTD_AUTH_TOKEN (the secret) or $ROLLOUTD_AUTH_TOKEN_FILE (a
 * file holding it) set, rdc_open also proves the shared secret
 * (PROTOCOL.md §14) and does so again whenever a request meets UNAUTHORIZED
 * on a new connection. rdc_auth runs that handshake now; rdc_auth_secret
 * reads the secret from path, or (path NULL) from the environment (*len 0:
 * none given). */
int rdc_auth(rdc_client *c);
/* Sets the secret rdc_auth proves (instead of the environment's). */
int rdc_set_secret(rdc_client *c, const char *secret, size_t len);
int rdc_auth_secret(const char *path, char *secret, size_t *len);
/* On a fresh data lane connection fd (PROTOCOL.md §10.12): with a secret,
 * reads the daemon's AUTH_CHALLENGE and answers with the LANE_AUTH of
 * transfer xfer_id; without one, does nothing. */
int rdc_lane_auth(rdc_client *c, int fd, uint64_t xfer_id);
/* The secret this client proves (*len 0: none), for what else is keyed by
 * it: the lane key a chained push hands a relaying daemon (§10.12). */
const char *rdc_secret(const rdc_client *c, size_t *len);

/* Closes the socket and frees everything (does not send BYE). Safe on NULL. */
void rdc_close(rdc_client *c);

/* HELLO: client_id 0 makes a new client, else resumes that one (its held
 * results and in-flight requests were kept; UNKNOWN_CLIENT if the daemon
 * forgot it). On success rdc_info() holds the daemon's HELLO_OK. A resumed
 * client keeps its last processed seq (rdc_last_seq), so results it already
 * processed are skipped. */
int rdc_hello(rdc_client *c, uint64_t client_id, const char *client_name);

/* The HELLO_OK of the last successful hello (NULL before one). */
const proto_hello_ok *rdc_info(const rdc_client *c);
uint64_t rdc_client_id(const rdc_client *c);

/* The per-client counter for client_req_ids: 1, 2, 3, ... */
uint64_t rdc_next_req_id(rdc_client *c);

/* The highest result seq processed (acked by the next fetch) and setting it,
 * for a client that resumes with state it kept itself. */
uint64_t rdc_last_seq(const rdc_client *c);
void rdc_set_last_seq(rdc_client *c, uint64_t seq);

/* Any request: encode req, wait timeout_ms for the reply, which must be of
 * type want (ERROR → RDC_EDAEMON). The caller frees reply with proto_msg_free. */
int rdc_call(rdc_client *c, const proto_msg *req, uint16_t want, int timeout_ms, proto_msg *reply);

/* A stream is one more req0 context on the client's socket, for requests in
 * parallel (weight chunks in a window). Use each stream from one thread. */
typedef struct rdc_stream rdc_stream;
int rdc_stream_open(rdc_client *c, rdc_stream **out);
int rdc_stream_call(rdc_stream *s, const proto_msg *req, uint16_t want, int timeout_ms, proto_msg *reply);
uint32_t rdc_stream_error_code(const rdc_stream *s);
void rdc_stream_close(rdc_stream *s);

/* The PROTO_E_* code of the last ERROR reply (0 if the last call got none). */
uint32_t rdc_error_code(const rdc_client *c);

/* "daemon error" for RDC_EDAEMON, "timed out" for RDC_ETIMEDOUT, else rd_strerror. */
const char *rdc_strerror(int rc);

/* SUBMIT n requests (their client_req_ids set by the caller, e.g. from
 * rdc_next_req_id). On success reply->submit_ok has one item per request
 * (status 0, INVALID_PARAMS or BUSY); the caller frees it with proto_msg_free. */
int rdc_submit(rdc_client *c, const proto_request *reqs, uint32_t n, proto_msg *reply);

/* FETCH with ack = rdc_last_seq(c): waits up to wait_ms for results. On
 * success reply->results holds them (possibly repeats of processed ones:
 * skip seq <= rdc_last_seq, then rdc_set_last_seq; rdc_fetch_new does both).
 * The caller frees reply with proto_msg_free. */
int rdc_fetch(rdc_client *c, uint32_t max_results, uint32_t wait_ms, proto_msg *reply);

/* rdc_fetch, then: *first is the index in reply->results.results of the first
 * result not processed before, and last_seq moves to the highest seq in the
 * reply (the caller processes results [*first, n_results) now). */
int rdc_fetch_new(rdc_client *c, uint32_t max_results, uint32_t wait_ms, proto_msg *reply, uint32_t *first);

/* ABORT one request (client_req_id), or all of this client's (all = 1,
 * client_req_id ignored). out may be NULL. The aborted samples arrive later
 * as results with finish = abort. */
int rdc_abort(rdc_client *c, uint64_t client_req_id, int all, proto_abort_ok *out);

/* STATUS: *json is a malloc'd NUL-terminated copy of the /status document. */
int rdc_status(rdc_client *c, char **json);

/* BYE (discard = 1: abort and drop everything now). out may be NULL. */
int rdc_bye(rdc_client *c, int discard, proto_bye_ok *out);

/* One finished sample, owning its arrays. */
typedef struct {
    uint32_t req_index;         /* index into the requests given to rdc_run */
    proto_result r;             /* fields as received; arrays point into mem */
    void *mem;                  /* one allocation holding r's arrays */
} rdc_sample;

/* Deep-copies a received result (its arrays live in a proto_msg's arena). */
int rdc_sample_copy(const proto_result *src, uint32_t req_index, rdc_sample *dst);
void rdc_sample_free(rdc_sample *s);
void rdc_samples_free(rdc_sample *s, size_t n);

/* Runs n_reqs requests to completion: gives each a fresh client_req_id (the
 * caller's ids are ignored), submits them in pieces of at most
 * max_requests_per_submit (resubmitting BUSY ones after fetching), fetches
 * and acks until every sample has arrived (retrying timed-out exchanges) and
 * returns them in *out (malloc'd, *n_out = the sum of n over the requests),
 * in arrival order. Results of other requests of this client that arrive
 * meanwhile are acked and dropped. A request refused with INVALID_PARAMS
 * fails the call (RDC_EDAEMON, rdc_error_code() = INVALID_PARAMS, the message
 * names the request index) after aborting the ones already accepted. */
int rdc_run(rdc_client *c, const proto_request *reqs, uint32_t n_reqs, rdc_sample **out, size_t *n_out);

/* "stop", "length", "abort", "error" or "none". */
const char *rdc_finish_name(uint8_t finish);

#endif
