/* auth.c - the learner socket's shared-secret handshake (PROTOCOL.md §14,
 * proto/auth.h), per NNG pipe: a connection that has not completed AUTH gets
 * UNAUTHORIZED for everything else. State lives in d->auth_pipes (pipe id ->
 * auth_pipe) and goes when the pipe closes. */
#include <stdlib.h>
#include <string.h>

#include "daemon/daemon.h"
#include "daemon/log.h"
#include "base/err.h"
#include "proto/auth.h"

typedef struct {
    int challenged;             /* a daemon nonce is out and unused */
    int authed;
    uint8_t client_nonce[PROTO_AUTH_BYTES], daemon_nonce[PROTO_AUTH_BYTES];
} auth_pipe;

int auth_load(rd_daemon *d)
{
    umap_init(&d->auth_pipes);
    if (!d->cfg.auth_token_file[0])
        return 0;
    return proto_auth_read_secret(d->cfg.auth_token_file, d->auth_secret, &d->auth_len);
}

int auth_pipe_ok(rd_daemon *d, uint32_t pipe)
{
    if (!d->auth_len)
        return 1;
    const auth_pipe *a = umap_get(&d->auth_pipes, pipe);
    return a && a->authed;
}

static void reply_auth(rd_daemon *d, br_ctx *x, uint16_t type, const uint8_t bytes[PROTO_AUTH_BYTES])
{
    proto_msg r = {.type = type};
    memcpy(r.auth.bytes, bytes, PROTO_AUTH_BYTES);
    loop_reply_msg(d, x, &r);
}

void auth_on_message(rd_daemon *d, br_ctx *x, const proto_msg *m, uint32_t pipe)
{
    if (!d->auth_len) {
        loop_reply_error(d, x, PROTO_E_UNEXPECTED, m->type,
                         "this daemon has no auth_token_file: there is nothing to authenticate (HELLO directly)");
        return;
    }
    auth_pipe *a = umap_get(&d->auth_pipes, pipe);
    if (!a) {
        if (!(a = calloc(1, sizeof *a)) || umap_put(&d->auth_pipes, pipe, a)) {
            free(a);
            loop_reply_error(d, x, PROTO_E_INTERNAL, m->type, "auth: out of memory");
            return;
        }
    }
    if (m->type == PROTO_AUTH_BEGIN) {
        memcpy(a->client_nonce, m->auth.bytes, PROTO_AUTH_BYTES);
        if (proto_auth_nonce(a->daemon_nonce)) {
            loop_reply_error(d, x, PROTO_E_INTERNAL, m->type, rd_errmsg());
            return;
        }
        a->challenged = 1;
        a->authed = 0;
        reply_auth(d, x, PROTO_AUTH_CHALLENGE, a->daemon_nonce);
        return;
    }
    /* AUTH: the challenge is spent whatever the outcome, so a proof is tried once. */
    if (!a->challenged) {
        loop_reply_error(d, x, PROTO_E_UNAUTHORIZED, m->type,
                         "AUTH without a challenge on this connection: send AUTH_BEGIN first");
        return;
    }
    a->challenged = 0;
    uint8_t want[PROTO_AUTH_BYTES], ours[PROTO_AUTH_BYTES];
    if (proto_auth_proof((const uint8_t *)d->auth_secret, d->auth_len, 0, a->client_nonce, a->daemon_nonce, want) ||
        proto_auth_proof((const uint8_t *)d->auth_secret, d->auth_len, 1, a->client_nonce, a->daemon_nonce, ours)) {
        loop_reply_error(d, x, PROTO_E_INTERNAL, m->type, rd_errmsg());
        return;
    }
    if (!proto_auth_equal(want, m->auth.bytes)) {
        d->auth_failures++;
        log_line("auth: a wrong proof on connection %u", pipe);
        loop_reply_error(d, x, PROTO_E_UNAUTHORIZED, m->type,
                         "AUTH: the proof does not match this daemon's secret (auth_token_file); start again with "
                         "AUTH_BEGIN");
        return;
    }
    a->authed = 1;
    reply_auth(d, x, PROTO_AUTH_OK, ours);
}

void auth_on_pipe_closed(rd_daemon *d, uint32_t pipe) { free(umap_del(&d->auth_pipes, pipe)); }

void auth_free(rd_daemon *d)
{
    for (size_t i = 0; i < d->auth_pipes.cap; i++)
        if (d->auth_pipes.keys[i])
            free(d->auth_pipes.vals[i]);
    umap_free(&d->auth_pipes);
    memset(d->auth_secret, 0, sizeof d->auth_secret);
}
