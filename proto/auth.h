/* auth.h - the shared-secret handshake of PROTOCOL.md §14.
 *
 * A connection proves it knows the secret (auth_token_file) before anything
 * else: AUTH_BEGIN carries the client's random nonce, AUTH_CHALLENGE the
 * daemon's (fresh for every challenge, used once), AUTH the client's proof
 * and AUTH_OK the daemon's:
 *   client proof = HMAC-SHA256(secret, "rolloutd auth v1 client" || daemon nonce || client nonce)
 *   daemon proof = HMAC-SHA256(secret, "rolloutd auth v1 daemon" || client nonce || daemon nonce)
 * A captured AUTH is worthless on another connection (the daemon nonce is
 * new for each challenge); the daemon's proof tells the client it reached
 * a holder of the secret. HMAC from mbedTLS; nonces from getrandom(2). */
#ifndef RD_PROTO_AUTH_H
#define RD_PROTO_AUTH_H

#include <stddef.h>
#include <stdint.h>

#include "proto/proto.h"

#define PROTO_AUTH_MAX_SECRET 4096   /* bytes of a secret file's one line */

/* PROTO_AUTH_BYTES random bytes from the kernel. */
int proto_auth_nonce(uint8_t out[PROTO_AUTH_BYTES]);
/* The proof one side sends (daemon_side 0: the client's AUTH, 1: the daemon's
 * AUTH_OK) over the two nonces. */
int proto_auth_proof(const uint8_t *secret, size_t secret_len, int daemon_side,
                     const uint8_t client_nonce[PROTO_AUTH_BYTES], const uint8_t daemon_nonce[PROTO_AUTH_BYTES],
                     uint8_t out[PROTO_AUTH_BYTES]);
/* The data lane's keys (PROTOCOL.md §10.12):
 *   lane key = HMAC-SHA256(secret, "rolloutd lane key v1" || xfer_id)
 *   proof    = HMAC-SHA256(lane key, "rolloutd lane v1" || daemon nonce || xfer_id)
 *   pad      = HMAC-SHA256(secret, "rolloutd key wrap v1" || xfer_id || next_xfer_id)
 * (u64s little-endian). The learner hands a relaying daemon the next
 * daemon's lane key XOR its own pad, so the key is not readable on the way
 * and each daemon needs only its own secret. */
int proto_auth_lane_key(const uint8_t *secret, size_t secret_len, uint64_t xfer_id, uint8_t out[PROTO_AUTH_BYTES]);
int proto_auth_lane_proof(const uint8_t key[PROTO_AUTH_BYTES], const uint8_t nonce[PROTO_AUTH_BYTES],
                          uint64_t xfer_id, uint8_t out[PROTO_AUTH_BYTES]);
int proto_auth_wrap_pad(const uint8_t *secret, size_t secret_len, uint64_t xfer_id, uint64_t next_xfer_id,
                        uint8_t out[PROTO_AUTH_BYTES]);
/* 1 when equal; the time taken does not depend on where they differ. */
int proto_auth_equal(const uint8_t a[PROTO_AUTH_BYTES], const uint8_t b[PROTO_AUTH_BYTES]);
/* A secret file: one line, surrounding whitespace dropped, 16..4096 bytes
 * with no spaces or control characters inside. secret holds
 * PROTO_AUTH_MAX_SECRET + 1 bytes (NUL-terminated). */
int proto_auth_read_secret(const char *path, char *secret, size_t *len);

#endif
