/* pipe_auth.h - the learner socket's shared-secret handshake (PROTOCOL.md
 * §14, proto/auth.h), per NNG pipe. The loop's business: it gates every
 * request the loop serves, so it stays beside the loop and outside the
 * weight-update wing (the lane's LANE_AUTH lives in update/lane_server.c). */
#ifndef RD_DAEMON_PIPE_AUTH_H
#define RD_DAEMON_PIPE_AUTH_H

#include <stdint.h>

#include "base/u64map.h"
#include "daemon/host.h"
#include "proto/proto.h"

typedef struct {
    u64map pipes;               /* NNG pipe id -> its handshake state */
    uint64_t failures;          /* wrong proofs */
} pipe_auth;

/* Reads auth_token_file (when set) into *secret. */
int pipe_auth_load(pipe_auth *a, const char *token_file, host_secret *secret);
/* 1 when the connection may send other requests (authenticated, or no secret). */
int pipe_auth_ok(const pipe_auth *a, const host_secret *secret, uint32_t pipe);
/* AUTH_BEGIN and AUTH, answered through r. */
void pipe_auth_on_message(pipe_auth *a, const host_secret *secret, const host_reply *r, br_ctx *x,
                          const proto_msg *m, uint32_t pipe);
void pipe_auth_on_closed(pipe_auth *a, uint32_t pipe);
/* Frees the handshake states and wipes the secret. */
void pipe_auth_free(pipe_auth *a, host_secret *secret);

#endif
