/* http.h - rolloutd's HTTP/1.1 server: one uv_tcp_t listener on the loop
 * thread, requests parsed with llhttp, answered through a route table. The
 * daemon's routes (/status, /metrics, /health, later /generate and
 * /v1/completions) are entries of that table (loop.c builds it); this file
 * knows no route.
 *
 * Connections. Keep-alive by default: a connection is closed after a response
 * only when the client asks (Connection: close, HTTP/1.0 without keep-alive),
 * after an error answer, or when a stream to an HTTP/1.0 client ends. Requests
 * are taken one at a time: the next request on a connection is not parsed
 * until the route has finished the previous one, so pipelined requests (many
 * in one read) are answered in order. Bytes of later requests wait in a
 * per-connection buffer; past HTTP_MAX_PIPELINE bytes the server stops
 * reading until the route answers (then a client that leaves is only noticed
 * when a write fails).
 *
 * Limits. Request line plus headers: HTTP_MAX_HEADER_BYTES (else 431; a
 * request target over HTTP_MAX_TARGET bytes gets 414) and HTTP_MAX_HEADERS
 * fields. Body (Content-Length or chunked, llhttp decodes the chunks):
 * max_body_bytes; a declared Content-Length over it is answered 413 as soon as
 * the headers are in, without reading the body; a chunked body that grows past
 * it gets 413. Bodies are also bounded together: every request body buffer
 * (being read, or held by a route until it finishes the handle) counts toward
 * max_inflight_body_bytes, and a request whose body would take the total past
 * it is answered 503 at once (declared Content-Length: before its body is
 * read; chunked: when it grows past), so many connections sending bodies at
 * once cannot make the server hold more. Anything llhttp refuses gets 400. Every error answer carries
 * Connection: close. After any answer that closes the connection the write
 * side is shut down and the rest of the input is read and dropped for up to
 * HTTP_LINGER_MS, so the client sees the answer instead of a reset.
 *
 * Timeouts. A request's line and headers must arrive within header_timeout_ms
 * of its first byte (a new connection's first request: of the accept); its
 * body may not stall for longer than header_timeout_ms between two reads; a
 * keep-alive connection waiting for its next request is closed after
 * idle_timeout_ms. A request held by its route has no timeout (a generation
 * may run for minutes); EOF from its client then counts as the client leaving
 * (a half-closed client is treated as gone).
 *
 * Connection limit. At most max_conns connections. At the limit a new
 * connection evicts the open connection that has waited longest while not
 * being served (lingering after its last answer, idle between requests, or
 * still sending its request), so half-sent requests cannot lock out /health;
 * when every connection is being served, the new one gets 503 and is closed.
 *
 * Auth. With an api_key, every route without HTTP_ROUTE_PUBLIC, and every
 * unknown path, needs "Authorization: Bearer <key>" (compared in constant
 * time); else 401 with WWW-Authenticate: Bearer. A request with a body and
 * without the key gets its 401 as soon as its headers are in, and the
 * connection is closed, so the body is never read. Without a key http_start
 * refuses an address that is not loopback unless insecure is set.
 *
 * Route API. A route is (method, exact path) -> handler; a GET route also
 * answers HEAD (the handler sees method "HEAD" and answers as for GET; the
 * server sends no body). Unknown paths get 404, a known path with another
 * method 405 with Allow, both with the JSON error shape
 * {"error": "...", "detail": "..."}. The handler gets the parsed request and an
 * opaque handle, and answers at once or later, from any loop-thread callback
 * (an engine result, a timer). A handler is never called from inside another
 * route's http_* call (a pipelined request waiting behind a late answer is
 * parsed on the next loop turn). The answers:
 *   - http_respond / http_respond_error: one whole response;
 *   - http_stream_begin, http_stream_send..., http_stream_end: a streamed
 *     response (Server-Sent Events). Framing: chunked transfer encoding on
 *     HTTP/1.1, so the connection stays usable after the stream; on HTTP/1.0,
 *     Connection: close and the end of the stream closes the connection. Each
 *     http_stream_send is one chunk holding the caller's already formatted
 *     bytes (e.g. "data: {...}\n\n").
 *
 * Handle lifetime. The route owns the handle from the handler call until it
 * finishes it with exactly one of http_respond, http_respond_error,
 * http_stream_end or http_release (each finishes it whatever it returns; the
 * handle and its request must not be touched afterwards). http_release without
 * an answer sends 500 (or cuts a started stream by closing the connection).
 * When the client goes away (EOF, reset, write error, the stream queue limit,
 * http_stop) while the route holds the handle, the callback set with
 * http_on_close runs once, from a loop callback (or http_stop), never from
 * inside one of the route's own http_* calls; from then on respond and send are no-ops that return RD_EIO, and the
 * route still finishes the handle (in the callback or later, e.g. when the
 * engine's abort completes). The callback never runs after the route has
 * finished the handle.
 *
 * Backpressure. Bytes written but not yet taken by the kernel are counted per
 * connection; an http_stream_send that would take them past stream_queue_bytes
 * returns RD_EBUSY and closes the connection (on_close follows), so a stalled
 * reader costs at most that much memory. Streams are plain uv writes on the
 * loop thread: no thread per connection.
 *
 * HTTPS. With tls_cert_file and tls_key_file the server speaks only TLS
 * (mbedTLS, daemon/http_tls.c): every byte read is ciphertext, decrypted
 * before llhttp sees it, and every write (streams included) is encrypted,
 * so everything above holds unchanged (the stream queue bound counts the
 * records' bytes). A connection whose first byte is not a TLS handshake
 * record (0x16) is a plain HTTP client on the wrong port: it gets a plain
 * 400 "this port speaks HTTPS" and is closed; a failed handshake closes the
 * connection. Either way the server goes on serving the others.
 *
 * Threads: everything here runs on the loop thread; nothing is thread-safe. */
#ifndef RD_DAEMON_HTTP_H
#define RD_DAEMON_HTTP_H

#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#define HTTP_MAX_HEADER_BYTES 16384 /* request line + header names and values, bytes */
#define HTTP_MAX_TARGET 8192        /* request target, bytes */
#define HTTP_MAX_HEADERS 64         /* header fields per request */
#define HTTP_MAX_PIPELINE 262144    /* bytes of later requests buffered while one is served */
#define HTTP_MAX_KEY 4096           /* api key, bytes */
#define HTTP_LINGER_MS 2000         /* reading and dropping input after a closing answer, ms */
#define HTTP_READ_BYTES 65536       /* the server's read buffer, bytes */

typedef struct {
    const char *name;           /* as sent (compare case-insensitively) */
    const char *value;          /* without surrounding whitespace */
} http_header;

/* A parsed request. Valid until the route finishes the handle. */
typedef struct {
    const char *method;         /* "GET", "HEAD", "POST", ... */
    const char *target;         /* as sent: "/v1/completions?stream=1" */
    const char *path;           /* the target before '?' (not percent-decoded) */
    const char *query;          /* after '?', "" when none */
    int http_minor;             /* HTTP/1.<minor>: 0 or 1 */
    const http_header *headers; /* in arrival order */
    int n_headers;
    const char *authorization;  /* the Authorization value, NULL when absent */
    const char *content_type;   /* the Content-Type value, NULL when absent */
    const char *body;           /* decoded body, NUL-terminated; "" when none */
    size_t body_len;            /* bytes, the NUL not counted */
} http_req;

typedef struct http_res http_res;   /* one request's response handle (opaque) */

typedef void (*http_handler)(http_res *h, const http_req *req, void *ud);
typedef void (*http_close_cb)(http_res *h, void *ud);

#define HTTP_ROUTE_PUBLIC 1         /* served without the api key (/health) */

typedef struct {
    const char *method;         /* "GET" (answers HEAD too), "POST", ... */
    const char *path;           /* matched exactly against req.path */
    http_handler fn;
    void *ud;
    int flags;                  /* HTTP_ROUTE_* */
} http_route;

typedef struct {
    const char *listen;         /* HOST:PORT, HOST a numeric IPv4 or IPv6 address ([::1]:7071); port 0 = any */
    int max_conns;              /* open connections */
    size_t max_body_bytes;      /* decoded request body, bytes */
    size_t max_inflight_body_bytes; /* request bodies held at once over all connections, bytes (read or
                                   held by a route); 0 = no bound; at least max_body_bytes */
    uint64_t header_timeout_ms; /* request line + headers; also the longest body stall */
    uint64_t idle_timeout_ms;   /* keep-alive wait for the next request */
    size_t stream_queue_bytes;  /* bytes queued to one client before its stream is cut */
    const char *api_key;        /* Bearer key; NULL or "" = none */
    int insecure;               /* 1: allow a non-loopback address without a key */
    const char *tls_cert_file;  /* PEM certificate (chain): serve HTTPS; NULL or "" = plain HTTP */
    const char *tls_key_file;   /* its PEM key */
} http_config;

typedef struct http_server {
    uv_loop_t *loop;
    uv_tcp_t listener;
    http_config cfg;            /* listen and api_key point into the copies below */
    char listen[256];
    char key[HTTP_MAX_KEY + 1];
    size_t key_len;             /* 0: no auth */
    http_route *routes;         /* copied from http_start's table */
    int n_routes;
    int port;                   /* the bound port (listen with port 0 picks one) */
    int loopback;               /* the address is loopback */
    int listening;
    int n_conns;                /* open connections (not those being closed) */
    struct http_conn *conns;    /* every connection until its close callback */
    uint64_t n_requests;        /* requests parsed and routed */
    uint64_t n_evicted;         /* connections closed to admit a new one */
    uint64_t n_timeouts;        /* connections closed by the header or body timeout */
    size_t body_bytes;          /* request body buffers allocated now, bytes (max_inflight_body_bytes) */
    uint64_t n_body_refused;    /* requests answered 503 because the body budget was spent */
    struct proto_ssl_server *tls; /* HTTPS: the server's TLS configuration (proto/tls.h), NULL for HTTP */
    uint64_t n_tls_failed;      /* connections closed by a failed handshake or a bad record */
    uint64_t n_tls_plain;       /* plain HTTP requests to the HTTPS port (answered 400) */
    char rbuf[HTTP_READ_BYTES]; /* every read lands here (the loop runs one read at a time) */
    char tbuf[HTTP_READ_BYTES]; /* HTTPS: the plaintext of each record read */
} http_server;

/* Binds cfg->listen and listens. RD_EINVAL for a bad address or a
 * non-loopback one without a key (unless cfg->insecure); RD_EIO when the
 * address cannot be bound. The route table is copied (its ud pointers must
 * stay valid). */
int http_start(http_server *s, uv_loop_t *loop, const http_config *cfg, const http_route *routes, int n_routes);
/* Stops accepting and closes every connection (on_close runs for handles
 * routes still hold). The memory goes in the close callbacks: run the loop. */
void http_stop(http_server *s);

/* Reads an api key file: one line, surrounding whitespace dropped, no spaces
 * or control characters inside, 1..HTTP_MAX_KEY bytes. key must hold
 * HTTP_MAX_KEY + 1 bytes. */
int http_read_key(const char *path, char *key, size_t *len);

/* 1 while the client is still there. */
int http_connected(const http_res *h);
/* The callback for the client going away (see the header comment). */
void http_on_close(http_res *h, http_close_cb cb, void *ud);

/* A whole response: body (len bytes, copied) with Content-Type content_type
 * (NULL: application/octet-stream). Finishes the handle. RD_EIO when the client is gone, RD_EINVAL when a
 * stream was begun or content_type holds CR or LF. */
int http_respond(http_res *h, int status, const char *content_type, const void *body, size_t len);
/* The JSON error shape {"error": what, "detail": detail}. Finishes the handle. */
int http_respond_error(http_res *h, int status, const char *what, const char *detail);

/* Starts a streamed response. headers: extra header lines, each ending in
 * "\r\n" (NULL for none); Content-Type is text/event-stream unless headers
 * give one; the framing headers (Transfer-Encoding or Connection) and
 * Cache-Control: no-store are the server's. */
int http_stream_begin(http_res *h, int status, const char *headers);
/* Queues len bytes as one chunk (len 0 sends nothing). RD_EIO when the client
 * is gone; RD_EBUSY when the queue limit was hit (the connection is being
 * closed); RD_EINVAL without http_stream_begin. */
int http_stream_send(http_res *h, const void *data, size_t len);
/* Ends the stream. Finishes the handle. */
int http_stream_end(http_res *h);
/* Finishes the handle without (further) answer: 500 when nothing was sent,
 * the connection closed when a stream was begun. */
void http_release(http_res *h);

#endif
