/* http_tls.c - see http_tls.h. mbedTLS reads through recv_cb from the bytes
 * of the one feed call in progress (WANT_READ when they are used up: it
 * keeps a partial record itself until the next feed), and writes through
 * send_cb, which hands every record to the server's writer at once, so a
 * write never waits (WANT_WRITE cannot happen). */
#include "daemon/http_tls.h"

#include <mbedtls/error.h>
#include <mbedtls/net_sockets.h>
#include <mbedtls/ssl.h>
#include <stdlib.h>
#include <string.h>

#include "base/err.h"

struct http_tls {
    mbedtls_ssl_context ssl;
    http_tls_out out;
    void *arg;
    const char *in;             /* the feed's ciphertext, NULL outside a feed */
    size_t in_len, in_off;
    int ready;                  /* the handshake is done */
    int failed;                 /* a fatal error: nothing more goes in or out */
};

static int recv_cb(void *ctx, unsigned char *buf, size_t len)
{
    http_tls *s = ctx;
    if (!s->in || s->in_off == s->in_len)
        return MBEDTLS_ERR_SSL_WANT_READ;
    size_t n = s->in_len - s->in_off;
    if (n > len)
        n = len;
    memcpy(buf, s->in + s->in_off, n);
    s->in_off += n;
    return (int)n;
}

static int send_cb(void *ctx, const unsigned char *buf, size_t len)
{
    http_tls *s = ctx;
    if (s->out(s->arg, buf, len))
        return MBEDTLS_ERR_NET_SEND_FAILED;
    return (int)len;
}

int http_tls_new(const proto_ssl_server *conf, http_tls_out out, void *arg, http_tls **sp)
{
    *sp = NULL;
    http_tls *s = calloc(1, sizeof *s);
    if (!s)
        return rd_fail(RD_ENOMEM, "https: out of memory for a session");
    mbedtls_ssl_init(&s->ssl);
    int mv = mbedtls_ssl_setup(&s->ssl, proto_ssl_config(conf));
    if (mv) {
        mbedtls_ssl_free(&s->ssl);
        free(s);
        return rd_fail(RD_ENOMEM, "https: cannot set up a session (mbedTLS -0x%04x)", (unsigned)-mv);
    }
    s->out = out;
    s->arg = arg;
    mbedtls_ssl_set_bio(&s->ssl, s, send_cb, recv_cb, NULL);
    *sp = s;
    return 0;
}

void http_tls_free(http_tls *s)
{
    if (!s)
        return;
    mbedtls_ssl_free(&s->ssl);
    free(s);
}

static int fail(http_tls *s, const char *what, int mv)
{
    char err[160];
    mbedtls_strerror(mv, err, sizeof err);
    s->failed = 1;
    s->in = NULL;
    return rd_fail(RD_EIO, "https: %s: %s", what, err);
}

int http_tls_feed(http_tls *s, const char *in, size_t len, char *buf, size_t cap, http_tls_plain plain, void *parg)
{
    if (s->failed)
        return rd_fail(RD_EIO, "https: the session has failed");
    s->in = in;
    s->in_len = len;
    s->in_off = 0;
    if (!s->ready) {
        int mv = mbedtls_ssl_handshake(&s->ssl);
        if (mv == MBEDTLS_ERR_SSL_WANT_READ || mv == MBEDTLS_ERR_SSL_WANT_WRITE) {
            s->in = NULL;
            return 0;
        }
        if (mv)
            return fail(s, "the handshake failed", mv);
        s->ready = 1;
    }
    /* Records until the input runs out: ssl_read gives at most one record's
     * plaintext per call, and a record never holds more than 16 KiB. */
    for (;;) {
        int r = mbedtls_ssl_read(&s->ssl, (unsigned char *)buf, cap);
        if (r > 0) {
            if (plain(parg, buf, (size_t)r))
                break;
            continue;
        }
        if (r == MBEDTLS_ERR_SSL_WANT_READ || r == MBEDTLS_ERR_SSL_WANT_WRITE)
            break;
        s->in = NULL;
        if (r == 0 || r == MBEDTLS_ERR_SSL_PEER_CLOSE_NOTIFY)
            return 1;
        return fail(s, "a bad record", r);
    }
    s->in = NULL;
    return 0;
}

int http_tls_write(http_tls *s, const void *data, size_t len)
{
    if (!s->ready || s->failed)
        return rd_fail(RD_EIO, "https: no session to write to");
    const unsigned char *p = data;
    while (len > 0) {
        int r = mbedtls_ssl_write(&s->ssl, p, len);
        if (r <= 0)
            return fail(s, "cannot write", r);
        p += r;
        len -= (size_t)r;
    }
    return 0;
}

int http_tls_ready(const http_tls *s) { return s->ready && !s->failed; }

void http_tls_close_notify(http_tls *s)
{
    if (s->ready && !s->failed)
        mbedtls_ssl_close_notify(&s->ssl);
}
