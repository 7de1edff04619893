/* pipe_auth.c - the learner socket's shared-secret handshake (PROTOCOL.md
 * §14, proto/auth.h), per NNG pipe: a connection that has not completed AUTH
 * gets UNAUTHORIZED for everything else. State lives in a->pipes (pipe id ->
 * auth_pipe) and goes when the pipe closes. */
#include "daemon/pipe_auth.h"

#include <stdlib.h>
#include <string.h>

#include "base/err.h"
#include "daemon/log.h"
#include "proto/auth.h"

typedef struct {
    int challenged;             /* a daemon nonce is out and unused */
    int authed;
    uint8_t client_nonce[PROTO_AUTH_BYTES], daemon_nonce[PROTO_AUTH_BYTES];
} auth_pipe;

int pipe_auth_load(pipe_auth *pa, const char *token_file, host_secret *secret)
{
    umap_init(&pa->pipes);
    if (!token_file[0])
        return 0;
    return proto_auth_read_secret(token_file, secret->bytes, &secret->len);
}

int pipe_auth_ok(const pipe_auth *pa, const host_secret *secret, uint32_t pipe)
{
    if (!secret->len)
        return 1;
    const auth_pipe *a = umap_get(&pa->pipes, pipe);
    return a && a->authed;
}

static void reply_auth(const host_reply *r, br_ctx *x, uint16_t type, const uint8_t bytes[PROTO_AUTH_BYTES])
{
    proto_msg m = {.type = type};
    memcpy(m.auth.bytes, bytes, PROTO_AUTH_BYTES);
    r->msg(r->ctx, x, &m);
}

void pipe_auth_on_message(pipe_auth *pa, const host_secret *secret, const host_reply *r, br_ctx *x,
                          const proto_msg *m, uint32_t pipe)
{
    if (!secret->len) {
        r->error(r->ctx, x, PROTO_E_UNEXPECTED, m->type,
                 "this daemon has no auth_token_file: there is nothing to authenticate (HELLO directly)");
        return;
    }
    auth_pipe *a = umap_get(&pa->pipes, pipe);
    if (!a) {
        if (!(a = calloc(1, sizeof *a)) || umap_put(&pa->pipes, pipe, a)) {
            free(a);
            r->error(r->ctx, x, PROTO_E_INTERNAL, m->type, "auth: out of memory");
            return;
        }
    }
    if (m->type == PROTO_AUTH_BEGIN) {
        memcpy(a->client_nonce, m->auth.bytes, PROTO_AUTH_BYTES);
        if (proto_auth_nonce(a->daemon_nonce)) {
            r->error(r->ctx, x, PROTO_E_INTERNAL, m->type, rd_errmsg());
            return;
        }
        a->challenged = 1;
        a->authed = 0;
        reply_auth(r, x, PROTO_AUTH_CHALLENGE, a->daemon_nonce);
        return;
    }
    /* AUTH: the challenge is spent whatever the outcome, so a proof is tried once. */
    if (!a->challenged) {
        r->error(r->ctx, x, PROTO_E_UNAUTHORIZED, m->type,
                 "AUTH without a challenge on this connection: send AUTH_BEGIN first");
        return;
    }
    a->challenged = 0;
    uint8_t want[PROTO_AUTH_BYTES], ours[PROTO_AUTH_BYTES];
    const uint8_t *key = (const uint8_t *)secret->bytes;
    if (proto_auth_proof(key, secret->len, 0, a->client_nonce, a->daemon_nonce, want) ||
        proto_auth_proof(key, secret->len, 1, a->client_nonce, a->daemon_nonce, ours)) {
        r->error(r->ctx, x, PROTO_E_INTERNAL, m->type, rd_errmsg());
        return;
    }
    if (!proto_auth_equal(want, m->auth.bytes)) {
        pa->failures++;
        log_line("auth: a wrong proof on connection %u", pipe);
        r->error(r->ctx, x, PROTO_E_UNAUTHORIZED, m->type,
                 "AUTH: the proof does not match this daemon's secret (auth_token_file); start again with "
                 "AUTH_BEGIN");
        return;
    }
    a->authed = 1;
    reply_auth(r, x, PROTO_AUTH_OK, ours);
}

void pipe_auth_on_closed(pipe_auth *pa, uint32_t pipe) { free(umap_del(&pa->pipes, pipe)); }

void pipe_auth_free(pipe_auth *pa, host_secret *secret)
{
    for (size_t i = 0; i < pa->pipes.cap; i++)
        if (pa->pipes.keys[i])
            free(pa->pipes.vals[i]);
    umap_free(&pa->pipes);
    memset(secret->bytes, 0, sizeof secret->bytes);
}
