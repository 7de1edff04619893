/* http_tls.h - one HTTPS connection's TLS session (mbedTLS) for the HTTP
 * server (http.c), driven by the loop's reads and writes: no socket of its
 * own. Ciphertext read from the connection goes in with http_tls_feed, which
 * hands the plaintext on; plaintext to send goes in with http_tls_write, and
 * the records come out through the session's out callback (the server
 * queues them as uv writes). The server configuration (certificate, key,
 * random generator) is proto_tls_ssl_server's (proto/tls.h).
 * Loop thread only. */
#ifndef RD_DAEMON_HTTP_TLS_H
#define RD_DAEMON_HTTP_TLS_H

#include <stddef.h>

#include "proto/tls.h"

typedef struct http_tls http_tls;

/* Queues len bytes of records on the connection: 0, or < 0 when it cannot. */
typedef int (*http_tls_out)(void *arg, const unsigned char *data, size_t len);
/* Takes len bytes of plaintext: 0 to go on, nonzero to stop (the connection is closing). */
typedef int (*http_tls_plain)(void *arg, const char *data, size_t len);

/* A server session on conf; records go to out(arg, ...). */
int http_tls_new(const proto_ssl_server *conf, http_tls_out out, void *arg, http_tls **s);
void http_tls_free(http_tls *s);

/* Ciphertext in (the handshake, then records): each piece of plaintext goes
 * to plain(parg, ...), through buf (cap bytes, at least 16 KiB), until the
 * input is used up or plain says stop. 0; 1 when the client ended the
 * session (close_notify, as EOF); RD_EIO when it failed (the handshake or a
 * bad record: close the connection; rd_errmsg says why). */
int http_tls_feed(http_tls *s, const char *in, size_t len, char *buf, size_t cap, http_tls_plain plain, void *parg);
/* Encrypts all of data into records (out). RD_EIO when the session cannot
 * send (not established, or failed). */
int http_tls_write(http_tls *s, const void *data, size_t len);
/* 1 once the handshake is done. */
int http_tls_ready(const http_tls *s);
/* The close_notify alert, best effort (before the write side is shut). */
void http_tls_close_notify(http_tls *s);

#endif
