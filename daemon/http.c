/* http.c - see http.h. Data flow: on_connection -> on_read appends to the
 * connection's pending bytes -> conn_run feeds llhttp, whose callbacks fill
 * the request into a fresh handle -> dispatch picks the route -> the route's
 * answer (now or later) queues uv writes -> conn_done either closes or goes
 * back to conn_run for the next pipelined request. */
#include "daemon/http.h"

#include <arpa/inet.h>
#include <cjson/cJSON.h>
#include <errno.h>
#include <limits.h>
#include <llhttp.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>

#include "daemon/http_tls.h"
#include "daemon/log.h"
#include "daemon/netaddr.h"
#include "base/err.h"

/* What a connection is doing; each state owns the timer in its own way. */
typedef enum {
    C_HEAD,                     /* reading a request line and headers (timer: header timeout) */
    C_BODY,                     /* reading its body (timer: the longest stall) */
    C_SERVING,                  /* a route has the request (no timer) */
    C_IDLE,                     /* keep-alive, between requests (timer: idle timeout) */
    C_LINGER,                   /* the last answer is queued, write side shut; input dropped (timer: linger) */
} conn_state;

enum { R_NONE, R_STREAM, R_DONE }; /* how far the response went */

struct http_res {
    struct http_conn *conn;     /* NULL once the connection is gone or done with this request */
    int refs;                   /* the connection's and the route's */
    int route_holds;            /* handed to a route that has not finished it */
    int resp;                   /* R_* */
    http_close_cb on_close;
    void *close_ud;
    http_req req;               /* pointers into arena and body, set at dispatch */
    http_header hdr[HTTP_MAX_HEADERS];
    uint32_t name_off[HTTP_MAX_HEADERS], value_off[HTTP_MAX_HEADERS]; /* arena offsets */
    int n_hdr;                  /* complete header fields */
    int in_field, in_value;     /* a name / value span is open */
    size_t target_len;          /* bytes of the target (at arena offset 0) */
    size_t used;                /* arena bytes */
    char *body;                 /* malloc'd, NUL-terminated; NULL when none */
    size_t body_len, body_cap;  /* bytes */
    struct http_server *srv;    /* whose body budget body_cap is charged to */
    char arena[HTTP_MAX_HEADER_BYTES]; /* target, then NUL-terminated names and values */
};

typedef struct http_conn {
    uv_tcp_t tcp;
    uv_timer_t timer;
    uv_shutdown_t shut;
    http_server *srv;
    struct http_conn *next, *prev; /* the server's list */
    llhttp_t parser;
    conn_state state;
    uint64_t since_ms;          /* uv_now when the state began (eviction order) */
    http_res *cur;              /* the request being read or served (the connection holds a ref) */
    int keep_alive;             /* the connection may stay open after this request */
    int head_only;              /* HEAD: no body goes out */
    int chunked;                /* the current stream is chunked */
    int fail;                   /* an HTTP status a parser callback asks to answer with, then close */
    int complete;               /* llhttp finished a message and paused after it */
    size_t head_raw;            /* bytes of the current header section llhttp has consumed */
    char *pend;                 /* received, not parsed yet */
    size_t pend_off, pend_len, pend_cap; /* bytes */
    size_t queued;              /* bytes in uv writes not yet completed */
    int reading;                /* uv_read_start is active */
    int refused;                /* answered 503 at the connection limit: close once written */
    int closing;                /* finished: no more parsing or answers (uv_close done or scheduled) */
    int closed;                 /* uv_close called */
    int in_run;                 /* inside conn_run (a synchronous answer must not re-enter it) */
    int kick;                   /* the timer is due at once to parse the next pipelined request */
    int open_handles;           /* tcp + timer; freed when both are closed */
    http_tls *tls;              /* HTTPS: the session (freed with the connection) */
    int tls_checked;            /* HTTPS: the first byte read was looked at */
} http_conn;

typedef struct {
    uv_write_t req;
    http_conn *c;
    size_t len;                 /* bytes of data */
    char data[];
} conn_write;

static void conn_run(http_conn *c);
static void conn_close(http_conn *c);
static void conn_read_start(http_conn *c);
static int authorized(const http_server *s, const http_res *h);
static const http_route *find_route(const http_server *s, const char *method, const char *path, size_t path_len,
                                    int *path_known);

/* ---- small helpers ---- */

static const char *reason(int status)
{
    switch (status) {
    case 200: return "OK";
    case 201: return "Created";
    case 202: return "Accepted";
    case 204: return "No Content";
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 403: return "Forbidden";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 408: return "Request Timeout";
    case 409: return "Conflict";
    case 413: return "Content Too Large";
    case 414: return "URI Too Long";
    case 415: return "Unsupported Media Type";
    case 422: return "Unprocessable Content";
    case 429: return "Too Many Requests";
    case 431: return "Request Header Fields Too Large";
    case 500: return "Internal Server Error";
    case 501: return "Not Implemented";
    case 503: return "Service Unavailable";
    case 504: return "Gateway Timeout";
    default: return status < 300 ? "OK" : status < 500 ? "Client Error" : "Server Error";
    }
}

/* {"error": what, "detail": detail}\n, malloc'd (NULL when out of memory). */
static char *json_error(const char *what, const char *detail)
{
    cJSON *o = cJSON_CreateObject();
    if (!o)
        return NULL;
    cJSON_AddStringToObject(o, "error", what);
    cJSON_AddStringToObject(o, "detail", detail);
    char *t = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    if (!t)
        return NULL;
    size_t n = strlen(t);
    char *r = realloc(t, n + 2);
    if (!r) {
        free(t);
        return NULL;
    }
    r[n] = '\n';
    r[n + 1] = 0;
    return r;
}

/* Header text from a route must not smuggle in lines of its own. */
static int has_crlf(const char *s)
{
    return s && strpbrk(s, "\r\n") != NULL;
}

/* Extra header lines: each "Name: value\r\n", no bare CR or LF. */
static int valid_header_lines(const char *h)
{
    if (!h)
        return 1;
    while (*h) {
        const char *eol = strstr(h, "\r\n");
        if (!eol || eol == h || !memchr(h, ':', (size_t)(eol - h)))
            return 0;
        for (const char *p = h; p < eol; p++)
            if (*p == '\r' || *p == '\n' || *p == 0)
                return 0;
        h = eol + 2;
    }
    return 1;
}

static const char *find_header(const http_res *h, const char *name)
{
    for (int i = 0; i < h->n_hdr; i++)
        if (!strcasecmp(h->arena + h->name_off[i], name))
            return h->arena + h->value_off[i];
    return NULL;
}

/* Equal in time independent of where they differ (the loop runs over the key). */
static int ct_equal(const char *a, size_t na, const char *key, size_t nk)
{
    volatile unsigned char diff = (unsigned char)(na != nk);
    for (size_t i = 0; i < nk; i++)
        diff |= (unsigned char)((unsigned char)key[i] ^ (unsigned char)(i < na ? a[i] : 0));
    return diff == 0;
}

/* ---- handles ---- */

static void res_unref(http_res *h)
{
    if (--h->refs > 0)
        return;
    if (h->srv)
        h->srv->body_bytes -= h->body_cap;
    free(h->body);
    free(h);
}

/* ---- writes ---- */

static void conn_set_state(http_conn *c, conn_state st);

static void on_timer(uv_timer_t *t);

/* Closes the connection from the loop, not from inside the caller (a route's
 * call must never run its own on_close). */
static void conn_close_soon(http_conn *c)
{
    if (c->closing)
        return;
    c->closing = 1;
    c->srv->n_conns--;
    if (c->reading)
        uv_read_stop((uv_stream_t *)&c->tcp);
    c->reading = 0;
    uv_timer_start(&c->timer, on_timer, 0, 0);
}

static void on_written(uv_write_t *req, int status)
{
    conn_write *w = (conn_write *)req;
    http_conn *c = w->c;
    c->queued -= w->len;
    free(w);
    /* ECANCELED comes from our own uv_close; anything else means the client is gone. */
    if (status < 0 && !c->closed)
        conn_close(c);
    else if (c->refused && c->queued == 0 && !c->closed)
        conn_close(c);
}

/* Queues a + b + z as one write, as they are (HTTPS: the records). */
static int conn_send_raw(http_conn *c, const char *a, size_t na, const void *b, size_t nb, const char *z, size_t nz)
{
    size_t n = na + nb + nz;
    if (n > UINT_MAX)
        return rd_fail(RD_EINVAL, "http: a write of %zu bytes; expected under 4 GiB", n);
    conn_write *w = malloc(sizeof *w + n);
    if (!w) {
        conn_close_soon(c);
        return rd_fail(RD_ENOMEM, "http: out of memory queueing %zu bytes", n);
    }
    memcpy(w->data, a, na);
    if (nb)
        memcpy(w->data + na, b, nb);
    if (nz)
        memcpy(w->data + na + nb, z, nz);
    w->c = c;
    w->len = n;
    uv_buf_t buf = uv_buf_init(w->data, (unsigned)n);
    int rc = uv_write(&w->req, (uv_stream_t *)&c->tcp, &buf, 1, on_written);
    if (rc) {
        free(w);
        conn_close_soon(c);
        return rd_fail(RD_EIO, "http: write failed: %s", uv_strerror(rc));
    }
    c->queued += n;
    return 0;
}

/* The TLS session's records go out as they are made. */
static int tls_out(void *arg, const unsigned char *data, size_t len)
{
    return conn_send_raw(arg, (const char *)data, len, NULL, 0, NULL, 0);
}

/* Queues a + b + z as one write; over HTTPS, encrypted in one go. */
static int conn_send(http_conn *c, const char *a, size_t na, const void *b, size_t nb, const char *z, size_t nz)
{
    if (!c->tls)
        return conn_send_raw(c, a, na, b, nb, z, nz);
    size_t n = na + nb + nz;
    char *p = malloc(n ? n : 1);
    if (!p) {
        conn_close_soon(c);
        return rd_fail(RD_ENOMEM, "https: out of memory queueing %zu bytes", n);
    }
    memcpy(p, a, na);
    if (nb)
        memcpy(p + na, b, nb);
    if (nz)
        memcpy(p + na + nb, z, nz);
    int rc = http_tls_write(c->tls, p, n);
    free(p);
    if (rc)
        conn_close_soon(c);
    return rc;
}

/* Status line and headers; malloc'd into *out (NUL-terminated), length returned, < 0 on OOM. */
static int build_head(http_conn *c, int status, const char *framing, const char *extra, char **out)
{
    const char *conn_hdr = c->keep_alive ? "keep-alive" : "close";
    size_t cap = 200 + strlen(framing) + (extra ? strlen(extra) : 0);
    char *head = malloc(cap);
    if (!head)
        return rd_fail(RD_ENOMEM, "http: out of memory for response headers");
    int n = snprintf(head, cap, "HTTP/1.1 %d %s\r\n%sConnection: %s\r\nCache-Control: no-store\r\n%s\r\n", status,
                     reason(status), framing, conn_hdr, extra ? extra : "");
    *out = head;
    return n;
}

/* A whole response to the current request (no body for HEAD). */
static int conn_answer(http_conn *c, int status, const char *ctype, const char *extra, const void *body,
                       size_t len)
{
    char framing[400];
    snprintf(framing, sizeof framing, "Content-Type: %.300s\r\nContent-Length: %zu\r\n", ctype, len);
    char *head;
    int hn = build_head(c, status, framing, extra, &head);
    if (hn < 0)
        return hn;
    int rc = conn_send(c, head, (size_t)hn, c->head_only ? NULL : body, c->head_only ? 0 : len, NULL, 0);
    free(head);
    if (c->cur)
        c->cur->resp = R_DONE;
    return rc;
}

static int conn_answer_error(http_conn *c, int status, const char *what, const char *detail, const char *extra)
{
    char *body = json_error(what, detail);
    static const char oom[] = "{\"error\":\"internal error\",\"detail\":\"out of memory\"}\n";
    int rc = body ? conn_answer(c, status, "application/json", extra, body, strlen(body))
                  : conn_answer(c, 500, "application/json", NULL, oom, sizeof oom - 1);
    free(body);
    return rc;
}

/* ---- connection states ---- */

static void conn_set_state(http_conn *c, conn_state st)
{
    http_server *s = c->srv;
    if (c->closing)
        return; /* the timer belongs to the pending close */
    c->kick = 0;
    c->state = st;
    c->since_ms = uv_now(s->loop);
    switch (st) {
    case C_HEAD:
    case C_BODY: uv_timer_start(&c->timer, on_timer, s->cfg.header_timeout_ms, 0); break;
    case C_IDLE: uv_timer_start(&c->timer, on_timer, s->cfg.idle_timeout_ms, 0); break;
    case C_LINGER: uv_timer_start(&c->timer, on_timer, HTTP_LINGER_MS, 0); break;
    case C_SERVING: uv_timer_stop(&c->timer); break;
    }
}

static void on_handle_closed(uv_handle_t *hd)
{
    http_conn *c = hd->data;
    if (--c->open_handles > 0)
        return;
    http_server *s = c->srv;
    if (c->prev)
        c->prev->next = c->next;
    else
        s->conns = c->next;
    if (c->next)
        c->next->prev = c->prev;
    http_tls_free(c->tls);
    free(c->pend);
    free(c);
    if (!s->listening && !s->conns && s->tls) { /* stopped: the last session is gone */
        proto_tls_ssl_free(s->tls);
        s->tls = NULL;
    }
}

/* Closes now. The route holding the current request hears of it (on_close). */
static void conn_close(http_conn *c)
{
    if (c->closed)
        return;
    if (!c->closing)
        c->srv->n_conns--;
    c->closing = c->closed = 1;
    c->reading = 0;
    http_res *h = c->cur;
    if (h) {
        c->cur = NULL;
        h->conn = NULL;
        if (h->route_holds && h->on_close)
            h->on_close(h, h->close_ud);
        res_unref(h);
    }
    uv_close((uv_handle_t *)&c->tcp, on_handle_closed);
    uv_close((uv_handle_t *)&c->timer, on_handle_closed);
}

static void on_shutdown(uv_shutdown_t *req, int status)
{
    http_conn *c = req->data;
    if (status < 0 && !c->closed)
        conn_close(c);
}

/* After a closing answer: shut the write side once the answer is out, keep
 * reading (and dropping) until EOF or the linger time, then close. Closing
 * with unread input would make the kernel send a reset that can destroy the
 * answer in flight. */
static void conn_linger(http_conn *c)
{
    http_res *h = c->cur;
    if (h) {
        c->cur = NULL;
        h->conn = NULL;
        res_unref(h);
    }
    c->pend_off = c->pend_len = 0;
    conn_set_state(c, C_LINGER);
    if (c->tls)
        http_tls_close_notify(c->tls);
    c->shut.data = c;
    if (uv_shutdown(&c->shut, (uv_stream_t *)&c->tcp, on_shutdown)) {
        conn_close(c);
        return;
    }
    conn_read_start(c);
}

/* The answer to the current request is fully queued. */
static void conn_done(http_conn *c)
{
    http_res *h = c->cur;
    if (!c->keep_alive) {
        conn_linger(c);
        return;
    }
    c->cur = NULL;
    h->conn = NULL;
    res_unref(h);
    conn_set_state(c, C_IDLE);
    /* A pipelined request already waiting is parsed from the loop (inside
     * conn_run its loop goes on), so a route's handler never runs inside
     * another route's http_respond. */
    if (!c->in_run && c->pend_off < c->pend_len) {
        c->kick = 1;
        uv_timer_start(&c->timer, on_timer, 0, 0);
    }
}

/* A parser callback or check set c->fail: answer it and close. */
static void conn_fail(http_conn *c)
{
    int st = c->fail;
    c->keep_alive = 0;
    c->head_only = 0;
    char detail[200];
    const char *what = "bad request", *extra = NULL;
    switch (st) {
    case 401:
        what = "unauthorized";
        snprintf(detail, sizeof detail, "expected Authorization: Bearer <key> (the body was not read)");
        extra = "WWW-Authenticate: Bearer\r\n";
        break;
    case 503:
        what = "busy";
        snprintf(detail, sizeof detail, "the server holds %zu bytes of request bodies (max_http_inflight_body_bytes "
                 "= %zu); retry later", c->srv->body_bytes, c->srv->cfg.max_inflight_body_bytes);
        break;
    case 413:
        what = "payload too large";
        snprintf(detail, sizeof detail, "the request body is over max_http_body_bytes = %zu bytes",
                 c->srv->cfg.max_body_bytes);
        break;
    case 414:
        what = "uri too long";
        snprintf(detail, sizeof detail, "the request target is over %d bytes", HTTP_MAX_TARGET);
        break;
    case 431:
        what = "request header fields too large";
        snprintf(detail, sizeof detail, "the request line and headers must fit %d bytes and %d fields",
                 HTTP_MAX_HEADER_BYTES, HTTP_MAX_HEADERS);
        break;
    case 500:
        what = "internal error";
        snprintf(detail, sizeof detail, "out of memory reading the request");
        break;
    default:
        st = 400;
        snprintf(detail, sizeof detail, "not a valid HTTP/1.x request (llhttp: %.40s: %.80s)",
                 llhttp_errno_name(llhttp_get_errno(&c->parser)),
                 llhttp_get_error_reason(&c->parser) ? llhttp_get_error_reason(&c->parser) : "");
    }
    conn_answer_error(c, st, what, detail, extra);
    if (!c->closing)
        conn_linger(c);
}

/* ---- llhttp callbacks: fill c->cur ---- */

static int arena_put(http_conn *c, const char *at, size_t len)
{
    http_res *h = c->cur;
    if (h->used + len + 1 > sizeof h->arena) {
        c->fail = 431;
        return -1;
    }
    memcpy(h->arena + h->used, at, len);
    h->used += len;
    return 0;
}

static int on_message_begin(llhttp_t *p)
{
    http_conn *c = p->data;
    http_res *h = calloc(1, sizeof *h);
    if (!h) {
        c->fail = 500;
        return -1;
    }
    h->conn = c;
    h->srv = c->srv;
    h->refs = 1;
    c->cur = h;
    c->head_raw = 0;
    if (c->state == C_IDLE)
        conn_set_state(c, C_HEAD);
    return 0;
}

static int on_url(llhttp_t *p, const char *at, size_t len)
{
    http_conn *c = p->data;
    if (c->cur->target_len + len > HTTP_MAX_TARGET) {
        c->fail = 414;
        return -1;
    }
    c->cur->target_len += len;
    return arena_put(c, at, len);
}

static int on_url_complete(llhttp_t *p)
{
    http_conn *c = p->data;
    return arena_put(c, "", 1);
}

static int on_header_field(llhttp_t *p, const char *at, size_t len)
{
    http_conn *c = p->data;
    http_res *h = c->cur;
    if (!h->in_field) {
        if (h->n_hdr == HTTP_MAX_HEADERS) {
            c->fail = 431;
            return -1;
        }
        h->in_field = 1;
        h->name_off[h->n_hdr] = (uint32_t)h->used;
    }
    return arena_put(c, at, len);
}

static int on_header_field_complete(llhttp_t *p)
{
    http_conn *c = p->data;
    if (!c->cur->in_field) { /* cannot happen: llhttp refuses an empty name */
        c->fail = 400;
        return -1;
    }
    c->cur->in_field = 0;
    return arena_put(c, "", 1);
}

static int on_header_value(llhttp_t *p, const char *at, size_t len)
{
    http_conn *c = p->data;
    http_res *h = c->cur;
    if (!h->in_value) {
        h->in_value = 1;
        h->value_off[h->n_hdr] = (uint32_t)h->used;
    }
    return arena_put(c, at, len);
}

static int on_header_value_complete(llhttp_t *p)
{
    http_conn *c = p->data;
    http_res *h = c->cur;
    if (!h->in_value) /* an empty value: no span came */
        h->value_off[h->n_hdr] = (uint32_t)h->used;
    h->in_value = 0;
    if (arena_put(c, "", 1))
        return -1;
    /* llhttp keeps trailing whitespace in the value; the name is matched as is. */
    char *v = h->arena + h->value_off[h->n_hdr];
    size_t n = strlen(v);
    while (n > 0 && (v[n - 1] == ' ' || v[n - 1] == '\t'))
        v[--n] = 0;
    h->n_hdr++;
    return 0;
}

/* 1 when growing h's body buffer to cap bytes would take the server's bodies
 * past max_inflight_body_bytes (counted as the refusal). */
static int over_budget(http_server *s, const http_res *h, size_t cap)
{
    size_t budget = s->cfg.max_inflight_body_bytes;
    if (!budget || s->body_bytes - h->body_cap + cap <= budget)
        return 0;
    s->n_body_refused++;
    return 1;
}

static void body_charge(http_server *s, http_res *h, size_t cap)
{
    s->body_bytes = s->body_bytes - h->body_cap + cap;
    h->body_cap = cap;
}

static int on_headers_complete(llhttp_t *p)
{
    http_conn *c = p->data;
    http_server *s = c->srv;
    http_res *h = c->cur;
    c->keep_alive = llhttp_should_keep_alive(p) && !p->upgrade;
    c->head_only = p->method == HTTP_HEAD;
    int chunked = (p->flags & F_CHUNKED) != 0;
    if (!chunked && p->content_length > s->cfg.max_body_bytes) {
        /* Answered before the body is read: the client may still be sending it. */
        c->fail = 413;
        return -1;
    }
    if (chunked || p->content_length > 0) {
        /* A body for a route that needs the key, without it: refused before
         * the body is read, so unauthenticated clients cannot make the server
         * hold bodies. */
        if (s->key_len && !authorized(s, h)) {
            int known;
            const http_route *r = find_route(s, llhttp_method_name((llhttp_method_t)p->method), h->arena,
                                             strcspn(h->arena, "?#"), &known);
            if (!r || !(r->flags & HTTP_ROUTE_PUBLIC)) {
                c->fail = 401;
                return -1;
            }
        }
        if (!chunked) {
            if (over_budget(s, h, (size_t)p->content_length + 1)) {
                c->fail = 503;
                return -1;
            }
            h->body = malloc((size_t)p->content_length + 1);
            if (!h->body) {
                c->fail = 500;
                return -1;
            }
            body_charge(s, h, (size_t)p->content_length + 1);
        }
        /* The client waits for this before sending the body (curl does for large bodies). */
        const char *expect = find_header(h, "Expect");
        if (expect && !strcasecmp(expect, "100-continue") && p->http_minor >= 1) {
            static const char cont[] = "HTTP/1.1 100 Continue\r\n\r\n";
            conn_send(c, cont, sizeof cont - 1, NULL, 0, NULL, 0);
        }
        conn_set_state(c, C_BODY);
    }
    return 0;
}

static int on_body(llhttp_t *p, const char *at, size_t len)
{
    http_conn *c = p->data;
    http_res *h = c->cur;
    if (h->body_len + len > c->srv->cfg.max_body_bytes) {
        c->fail = 413;
        return -1;
    }
    if (h->body_len + len + 1 > h->body_cap) {
        size_t cap = h->body_cap ? h->body_cap : 4096;
        while (cap < h->body_len + len + 1)
            cap *= 2;
        if (cap > c->srv->cfg.max_body_bytes + 1)
            cap = c->srv->cfg.max_body_bytes + 1;
        if (over_budget(c->srv, h, cap)) {
            c->fail = 503;
            return -1;
        }
        char *b = realloc(h->body, cap);
        if (!b) {
            c->fail = 500;
            return -1;
        }
        h->body = b;
        body_charge(c->srv, h, cap);
    }
    memcpy(h->body + h->body_len, at, len);
    h->body_len += len;
    return 0;
}

static int on_message_complete(llhttp_t *p)
{
    http_conn *c = p->data;
    c->complete = 1;
    /* Pause here: the next request waits until this one is answered. */
    return HPE_PAUSED;
}

static const llhttp_settings_t *parser_settings(void)
{
    static llhttp_settings_t st;
    static int ready;
    if (!ready) {
        llhttp_settings_init(&st);
        st.on_message_begin = on_message_begin;
        st.on_url = on_url;
        st.on_url_complete = on_url_complete;
        st.on_header_field = on_header_field;
        st.on_header_field_complete = on_header_field_complete;
        st.on_header_value = on_header_value;
        st.on_header_value_complete = on_header_value_complete;
        st.on_headers_complete = on_headers_complete;
        st.on_body = on_body;
        st.on_message_complete = on_message_complete;
        ready = 1;
    }
    return &st;
}

/* ---- routing ---- */

static int method_matches(const char *route_method, const char *method)
{
    return !strcmp(route_method, method) || (!strcmp(method, "HEAD") && !strcmp(route_method, "GET"));
}

/* The path echoed in a message: printable ASCII only, cut at 200 bytes. */
static void safe_path(const char *path, char *out, size_t cap)
{
    size_t j = 0;
    for (const char *p = path; *p && j + 1 < cap && j < 200; p++)
        out[j++] = (*p >= 0x20 && *p < 0x7f) ? *p : '?';
    out[j] = 0;
}

static void answer_not_found(http_conn *c, const char *path)
{
    http_server *s = c->srv;
    char safe[256], detail[1024];
    safe_path(path, safe, sizeof safe);
    int n = snprintf(detail, sizeof detail, "no route %s; expected one of:", safe);
    for (int i = 0; i < s->n_routes && n > 0 && (size_t)n < sizeof detail; i++)
        n += snprintf(detail + n, sizeof detail - (size_t)n, "%s %s %s", i ? "," : "", s->routes[i].method,
                      s->routes[i].path);
    conn_answer_error(c, 404, "not found", detail, NULL);
}

static void answer_wrong_method(http_conn *c, const char *method, const char *path)
{
    http_server *s = c->srv;
    char allow[256] = "Allow: ", list[200] = "";
    size_t n = 0;
    for (int i = 0; i < s->n_routes; i++) {
        if (strcmp(s->routes[i].path, path))
            continue;
        int get = !strcmp(s->routes[i].method, "GET");
        n += (size_t)snprintf(list + n, n < sizeof list ? sizeof list - n : 0, "%s%s%s", n ? ", " : "",
                              s->routes[i].method, get ? ", HEAD" : "");
        if (n >= sizeof list)
            break;
    }
    snprintf(allow + 7, sizeof allow - 7, "%s\r\n", list);
    char safe[256], detail[600];
    safe_path(path, safe, sizeof safe);
    snprintf(detail, sizeof detail, "%.20s %s: this path serves %s", method, safe, list);
    conn_answer_error(c, 405, "method not allowed", detail, allow);
}

/* The route for (method, path[0..path_len)); *path_known: some route has the path. */
static const http_route *find_route(const http_server *s, const char *method, const char *path, size_t path_len,
                                    int *path_known)
{
    *path_known = 0;
    for (int i = 0; i < s->n_routes; i++) {
        const char *rp = s->routes[i].path;
        if (strlen(rp) != path_len || memcmp(rp, path, path_len))
            continue;
        *path_known = 1;
        if (method_matches(s->routes[i].method, method))
            return &s->routes[i];
    }
    return NULL;
}

static int authorized(const http_server *s, const http_res *h)
{
    if (!s->key_len)
        return 1;
    const char *a = find_header(h, "Authorization");
    if (!a || strncasecmp(a, "Bearer ", 7))
        return 0;
    const char *tok = a + 7;
    while (*tok == ' ')
        tok++;
    return ct_equal(tok, strlen(tok), s->key, s->key_len);
}

/* The request is complete: fill its fields and hand it to its route. */
static void dispatch(http_conn *c)
{
    http_server *s = c->srv;
    http_res *h = c->cur;
    http_req *r = &h->req;
    conn_set_state(c, C_SERVING);
    s->n_requests++;
    for (int i = 0; i < h->n_hdr; i++) {
        h->hdr[i].name = h->arena + h->name_off[i];
        h->hdr[i].value = h->arena + h->value_off[i];
    }
    r->method = llhttp_method_name((llhttp_method_t)llhttp_get_method(&c->parser));
    r->target = h->arena;
    r->http_minor = llhttp_get_http_minor(&c->parser);
    r->headers = h->hdr;
    r->n_headers = h->n_hdr;
    r->authorization = find_header(h, "Authorization");
    r->content_type = find_header(h, "Content-Type");
    r->body = h->body ? h->body : "";
    r->body_len = h->body_len;
    if (h->body)
        h->body[h->body_len] = 0;
    /* The path is the target cut at '?' (or '#'): copied after the target in the arena when there is
     * room, else the target is cut in place (the arena always has a byte for the NUL it already holds). */
    size_t plen = strcspn(h->arena, "?#");
    const char *q = h->arena[plen] == '?' ? h->arena + plen + 1 : "";
    if (h->used + plen + 1 <= sizeof h->arena) {
        char *path = h->arena + h->used;
        memcpy(path, h->arena, plen);
        path[plen] = 0;
        h->used += plen + 1;
        r->path = path;
        r->query = q;
    } else {
        h->arena[plen] = 0;
        r->path = h->arena;
        r->query = "";
    }
    int path_known;
    const http_route *route = find_route(s, r->method, r->path, strlen(r->path), &path_known);
    if (!(route && (route->flags & HTTP_ROUTE_PUBLIC)) && !authorized(s, h)) {
        conn_answer_error(c, 401, "unauthorized",
                          r->authorization ? "the Bearer key does not match" : "expected Authorization: Bearer <key>",
                          "WWW-Authenticate: Bearer\r\n");
    } else if (!route) {
        if (path_known)
            answer_wrong_method(c, r->method, r->path);
        else
            answer_not_found(c, r->path);
    } else {
        h->route_holds = 1;
        h->refs++;
        route->fn(h, r, route->ud); /* h may be freed when this returns */
        return;
    }
    if (!c->closing)
        conn_done(c);
}

/* ---- the parse loop ---- */

/* Feeds pending bytes to llhttp until a request completes (it pauses after
 * it) or they run out. */
static void conn_parse(http_conn *c)
{
    const char *data = c->pend + c->pend_off;
    size_t n = c->pend_len - c->pend_off;
    llhttp_errno_t err = llhttp_execute(&c->parser, data, n);
    size_t used = n;
    if (c->complete && (err == HPE_PAUSED || err == HPE_PAUSED_UPGRADE)) {
        used = (size_t)(llhttp_get_error_pos(&c->parser) - data);
        if (err == HPE_PAUSED)
            llhttp_resume(&c->parser);
        else
            c->keep_alive = 0; /* never reached (upgrades get keep_alive 0 at their headers) */
    } else if (err != HPE_OK) {
        if (!c->fail)
            c->fail = 400;
        return;
    }
    c->pend_off += used;
    /* A call that ends inside a header section spent all its bytes on it
     * (the parser stops at each message end), so this counts whitespace
     * padding the callbacks never see. */
    if (c->state == C_HEAD && !c->complete) {
        c->head_raw += used;
        if (c->head_raw > 2 * (size_t)HTTP_MAX_HEADER_BYTES)
            c->fail = 431;
    }
}

/* Parses and serves what the connection holds, request by request, until
 * it needs more bytes or a route is answering. */
static void conn_run(http_conn *c)
{
    if (c->in_run)
        return;
    c->in_run = 1;
    while (!c->closing && c->state != C_SERVING && c->state != C_LINGER && c->pend_off < c->pend_len) {
        conn_parse(c);
        if (c->fail) {
            conn_fail(c);
            break;
        }
        if (c->complete) {
            c->complete = 0;
            dispatch(c);
        }
    }
    c->in_run = 0;
    if (c->closing)
        return;
    /* Drop what was parsed; shrink a buffer a large pipeline left behind. */
    if (c->pend_off == c->pend_len) {
        c->pend_off = c->pend_len = 0;
        if (c->pend_cap > 2 * HTTP_READ_BYTES) {
            free(c->pend);
            c->pend = NULL;
            c->pend_cap = 0;
        }
    }
    if (!c->reading && c->pend_len - c->pend_off < HTTP_MAX_PIPELINE)
        conn_read_start(c);
}

/* ---- libuv callbacks ---- */

static void on_alloc(uv_handle_t *hd, size_t suggested, uv_buf_t *buf)
{
    http_conn *c = hd->data;
    *buf = uv_buf_init(c->srv->rbuf, sizeof c->srv->rbuf);
}

static int pend_append(http_conn *c, const char *data, size_t n)
{
    if (c->pend_off > 0 && c->pend_off == c->pend_len)
        c->pend_off = c->pend_len = 0;
    if (c->pend_len + n > c->pend_cap) {
        if (c->pend_off > 0) { /* move the unparsed tail to the front first */
            memmove(c->pend, c->pend + c->pend_off, c->pend_len - c->pend_off);
            c->pend_len -= c->pend_off;
            c->pend_off = 0;
        }
        size_t cap = c->pend_cap ? c->pend_cap : 4096;
        while (cap < c->pend_len + n)
            cap *= 2;
        if (cap != c->pend_cap) {
            char *p = realloc(c->pend, cap);
            if (!p)
                return RD_ENOMEM;
            c->pend = p;
            c->pend_cap = cap;
        }
    }
    memcpy(c->pend + c->pend_len, data, n);
    c->pend_len += n;
    return 0;
}

/* Request bytes (as read, or decrypted): parsed and served. Nonzero once
 * the connection is closing (nothing more for it). */
static int on_plain(void *arg, const char *data, size_t n)
{
    http_conn *c = arg;
    if (c->closing)
        return 1;
    if (c->state == C_LINGER)
        return 0; /* dropped */
    if (pend_append(c, data, n)) {
        conn_close(c);
        return 1;
    }
    if (c->state == C_SERVING) {
        /* Pipelined: kept for later; past the bound, stop reading (TCP pushes back). */
        if (c->reading && c->pend_len - c->pend_off >= HTTP_MAX_PIPELINE) {
            uv_read_stop((uv_stream_t *)&c->tcp);
            c->reading = 0;
        }
        return 0;
    }
    conn_run(c);
    if (!c->closing && c->state == C_BODY)
        uv_timer_start(&c->timer, on_timer, c->srv->cfg.header_timeout_ms, 0); /* the body moved */
    return c->closing;
}

/* A plain HTTP request on the HTTPS port: answered in plain text, so the
 * client reads why, and closed. */
static void plain_on_https(http_conn *c)
{
    c->srv->n_tls_plain++;
    http_tls_free(c->tls);
    c->tls = NULL;
    c->keep_alive = 0;
    c->head_only = 0;
    conn_answer_error(c, 400, "bad request", "this port speaks HTTPS: connect with https:// (TLS)", NULL);
    if (!c->closing)
        conn_linger(c);
}

static void on_read(uv_stream_t *st, ssize_t n, const uv_buf_t *buf)
{
    http_conn *c = st->data;
    if (c->closing)
        return;
    if (n < 0) {
        /* EOF or an error. While a route serves the request, this is the
         * client leaving (a half-closed client is treated as gone). */
        conn_close(c);
        return;
    }
    if (n == 0)
        return;
    if (c->state == C_LINGER)
        return; /* dropped */
    if (!c->tls) {
        on_plain(c, buf->base, (size_t)n);
        return;
    }
    if (!c->tls_checked) {
        c->tls_checked = 1;
        if ((unsigned char)buf->base[0] != 0x16) { /* not a TLS handshake record */
            plain_on_https(c);
            return;
        }
    }
    http_server *s = c->srv;
    int rc = http_tls_feed(c->tls, buf->base, (size_t)n, s->tbuf, sizeof s->tbuf, on_plain, c);
    if (rc && !c->closed) {
        if (rc < 0)
            s->n_tls_failed++;
        conn_close(c); /* a failed session, or the client's close_notify (its EOF) */
    }
}

static void conn_read_start(http_conn *c)
{
    if (!c->reading && !c->closing && !uv_read_start((uv_stream_t *)&c->tcp, on_alloc, on_read))
        c->reading = 1;
}

static void on_timer(uv_timer_t *t)
{
    http_conn *c = t->data;
    if (c->closing) { /* conn_close_soon */
        conn_close(c);
        return;
    }
    if (c->kick && c->state == C_IDLE) {
        c->kick = 0;
        uv_timer_start(&c->timer, on_timer, c->srv->cfg.idle_timeout_ms, 0);
        conn_run(c);
        return;
    }
    switch (c->state) {
    case C_HEAD:
    case C_BODY: c->srv->n_timeouts++; conn_close(c); break;
    case C_IDLE:
    case C_LINGER: conn_close(c); break;
    case C_SERVING: break;
    }
}

/* At the limit: the open connection that has waited longest while not being
 * served (lingering first, then idle or still sending a request). */
static http_conn *pick_victim(http_server *s, http_conn *except)
{
    http_conn *best = NULL;
    int best_rank = 0;
    for (http_conn *c = s->conns; c; c = c->next) {
        if (c == except || c->closing || c->refused || c->state == C_SERVING)
            continue;
        int rank = c->state == C_LINGER ? 2 : 1;
        /* The list is newest first: on a tie the later (older) one wins. */
        if (!best || rank > best_rank || (rank == best_rank && c->since_ms <= best->since_ms)) {
            best = c;
            best_rank = rank;
        }
    }
    return best;
}

static void on_connection(uv_stream_t *server, int status)
{
    http_server *s = server->data;
    if (status < 0) {
        log_line("http: accept: %s", uv_strerror(status));
        return;
    }
    http_conn *c = calloc(1, sizeof *c);
    if (!c)
        return; /* out of memory: libuv reports the pending connection again */
    c->srv = s;
    uv_tcp_init(s->loop, &c->tcp);
    uv_timer_init(s->loop, &c->timer);
    c->tcp.data = c->timer.data = c;
    c->open_handles = 2;
    c->next = s->conns;
    if (s->conns)
        s->conns->prev = c;
    s->conns = c;
    s->n_conns++;
    if (uv_accept(server, (uv_stream_t *)&c->tcp)) {
        conn_close(c);
        return;
    }
    llhttp_init(&c->parser, HTTP_REQUEST, parser_settings());
    c->parser.data = c;
    if (s->tls && http_tls_new(s->tls, tls_out, c, &c->tls)) {
        conn_close(c);
        return;
    }
    uv_tcp_nodelay(&c->tcp, 1); /* small SSE chunks must not wait for an ACK */
    uv_tcp_keepalive(&c->tcp, 1, 60); /* a peer that vanished during a long generation */
    if (s->n_conns > s->cfg.max_conns) {
        http_conn *v = pick_victim(s, c);
        if (v) {
            s->n_evicted++;
            conn_close(v);
        } else {
            /* Every connection is being served: say so and close. */
            c->refused = 1;
            c->keep_alive = 0;
            conn_answer_error(c, 503, "service unavailable", "the server is at http_max_connections", NULL);
            if (!c->closing)
                conn_set_state(c, C_LINGER);
            return;
        }
    }
    conn_set_state(c, C_HEAD);
    conn_read_start(c);
    if (!c->reading)
        conn_close(c);
}

/* ---- the route API ---- */

int http_connected(const http_res *h)
{
    return h->conn && !h->conn->closing;
}

void http_on_close(http_res *h, http_close_cb cb, void *ud)
{
    h->on_close = cb;
    h->close_ud = ud;
}

/* The route lets go of h; the connection moves on if it is still there. */
static void route_drop(http_res *h)
{
    http_conn *c = h->conn;
    h->route_holds = 0;
    if (c && !c->closing) {
        if (h->resp == R_NONE) {
            conn_answer_error(c, 500, "internal error", "the route ended without an answer", NULL);
        } else if (h->resp == R_STREAM) {
            /* The stream cannot be ended cleanly: the client sees it cut. */
            conn_close(c);
        }
        if (!c->closing)
            conn_done(c);
    }
    res_unref(h);
}

int http_respond(http_res *h, int status, const char *content_type, const void *body, size_t len)
{
    int rc;
    if (h->resp != R_NONE)
        rc = rd_fail(RD_EINVAL, "http_respond after a stream was begun");
    else if (has_crlf(content_type))
        rc = rd_fail(RD_EINVAL, "http_respond: the content type holds CR or LF");
    else if (!http_connected(h))
        rc = rd_fail(RD_EIO, "http_respond: the client is gone");
    else
        rc = conn_answer(h->conn, status, content_type ? content_type : "application/octet-stream", NULL, body,
                         len);
    /* A refused call (bad arguments) leaves resp R_NONE: route_drop answers 500. */
    route_drop(h);
    return rc;
}

int http_respond_error(http_res *h, int status, const char *what, const char *detail)
{
    char *body = json_error(what, detail);
    if (!body) {
        http_release(h);
        return rd_fail(RD_ENOMEM, "http_respond_error: out of memory");
    }
    int rc = http_respond(h, status, "application/json", body, strlen(body));
    free(body);
    return rc;
}

int http_stream_begin(http_res *h, int status, const char *headers)
{
    if (!h->route_holds || h->resp != R_NONE)
        return rd_fail(RD_EINVAL, "http_stream_begin: a response was already begun");
    if (!valid_header_lines(headers))
        return rd_fail(RD_EINVAL, "http_stream_begin: headers must be lines \"Name: value\\r\\n\"");
    if (!http_connected(h))
        return rd_fail(RD_EIO, "http_stream_begin: the client is gone");
    http_conn *c = h->conn;
    /* HTTP/1.0 has no chunked encoding: the end of the stream is the end of the connection. */
    c->chunked = h->req.http_minor >= 1;
    if (!c->chunked)
        c->keep_alive = 0;
    int has_ctype = 0;
    for (const char *p = headers; p && *p; p = strstr(p, "\r\n") + 2)
        if (!strncasecmp(p, "Content-Type:", 13))
            has_ctype = 1;
    char framing[128];
    snprintf(framing, sizeof framing, "%s%s", has_ctype ? "" : "Content-Type: text/event-stream\r\n",
             c->chunked ? "Transfer-Encoding: chunked\r\n" : "");
    char *head;
    int hn = build_head(c, status, framing, headers, &head);
    if (hn < 0)
        return hn;
    int rc = conn_send(c, head, (size_t)hn, NULL, 0, NULL, 0);
    free(head);
    h->resp = R_STREAM;
    return rc;
}

int http_stream_send(http_res *h, const void *data, size_t len)
{
    if (!h->route_holds || h->resp != R_STREAM)
        return rd_fail(RD_EINVAL, "http_stream_send without http_stream_begin");
    if (!http_connected(h))
        return rd_fail(RD_EIO, "http_stream_send: the client is gone");
    http_conn *c = h->conn;
    if (len == 0 || c->head_only)
        return 0; /* an empty chunk would end a chunked body */
    size_t limit = c->srv->cfg.stream_queue_bytes;
    if (c->queued + len > limit) {
        log_line("http: a stream client is %zu bytes behind (http_stream_queue_bytes = %zu); closing it",
                 c->queued, limit);
        conn_close_soon(c);
        return rd_fail(RD_EBUSY, "http_stream_send: the client is %zu bytes behind; the stream is closed", c->queued);
    }
    if (!c->chunked)
        return conn_send(c, data, len, NULL, 0, NULL, 0);
    char size[24];
    int sn = snprintf(size, sizeof size, "%zx\r\n", len);
    return conn_send(c, size, (size_t)sn, data, len, "\r\n", 2);
}

int http_stream_end(http_res *h)
{
    int rc = 0;
    if (!h->route_holds || h->resp != R_STREAM) {
        rc = rd_fail(RD_EINVAL, "http_stream_end without http_stream_begin");
    } else if (!http_connected(h)) {
        rc = rd_fail(RD_EIO, "http_stream_end: the client is gone");
        h->resp = R_DONE;
    } else {
        http_conn *c = h->conn;
        if (c->chunked && !c->head_only)
            rc = conn_send(c, "0\r\n\r\n", 5, NULL, 0, NULL, 0);
        h->resp = R_DONE;
    }
    route_drop(h);
    return rc;
}

void http_release(http_res *h)
{
    route_drop(h);
}

/* ---- start and stop ---- */

int http_read_key(const char *path, char *key, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return rd_fail(RD_EIO, "api_key_file %s: cannot open (%s)", path, strerror(errno));
    struct stat st;
    if (fstat(fileno(f), &st) == 0 && (st.st_mode & 077))
        log_line("warning: api_key_file %s is readable by group or others (chmod 600 it)", path);
    char buf[HTTP_MAX_KEY + 2];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    int more = n == sizeof buf - 1 && fgetc(f) != EOF;
    fclose(f);
    buf[n] = 0;
    size_t a = 0;
    while (a < n && (buf[a] == ' ' || buf[a] == '\t' || buf[a] == '\r' || buf[a] == '\n'))
        a++;
    while (n > a && (buf[n - 1] == ' ' || buf[n - 1] == '\t' || buf[n - 1] == '\r' || buf[n - 1] == '\n'))
        n--;
    if (more || n - a > HTTP_MAX_KEY)
        return rd_fail(RD_EINVAL, "api_key_file %s: the key is over %d bytes; expected one line", path, HTTP_MAX_KEY);
    if (n == a)
        return rd_fail(RD_EINVAL, "api_key_file %s: empty; expected one line holding the key", path);
    for (size_t i = a; i < n; i++)
        if ((unsigned char)buf[i] <= 0x20 || buf[i] == 0x7f)
            return rd_fail(RD_EINVAL, "api_key_file %s: the key holds a space or control character; expected one "
                           "token on one line", path);
    memcpy(key, buf + a, n - a);
    key[n - a] = 0;
    *len = n - a;
    return 0;
}

int http_start(http_server *s, uv_loop_t *loop, const http_config *cfg, const http_route *routes, int n_routes)
{
    memset(s, 0, sizeof *s);
    s->loop = loop;
    s->cfg = *cfg;
    snprintf(s->listen, sizeof s->listen, "%s", cfg->listen);
    s->cfg.listen = s->listen;
    if (cfg->api_key && cfg->api_key[0]) {
        s->key_len = strlen(cfg->api_key);
        if (s->key_len > HTTP_MAX_KEY)
            return rd_fail(RD_EINVAL, "http: the api key is over %d bytes", HTTP_MAX_KEY);
        memcpy(s->key, cfg->api_key, s->key_len + 1);
    }
    s->cfg.api_key = s->key;
    /* One body of the largest size must always fit (its buffer holds a NUL too). */
    if (s->cfg.max_inflight_body_bytes && s->cfg.max_inflight_body_bytes < s->cfg.max_body_bytes + 1)
        s->cfg.max_inflight_body_bytes = s->cfg.max_body_bytes + 1;
    if (cfg->max_conns < 1 || cfg->header_timeout_ms == 0 || cfg->idle_timeout_ms == 0 || cfg->stream_queue_bytes == 0)
        return rd_fail(RD_EINVAL, "http: max_conns, the timeouts and the stream queue bound must be positive");
    /* HOST:PORT with a numeric host; IPv6 as [::1]:PORT or bare. */
    char host[256];
    const char *colon = strrchr(s->listen, ':');
    size_t hl = colon ? (size_t)(colon - s->listen) : 0;
    if (!colon || hl == 0 || hl >= sizeof host)
        return rd_fail(RD_EINVAL, "http_listen \"%s\": expected HOST:PORT", s->listen);
    memcpy(host, s->listen, hl);
    host[hl] = 0;
    if (host[0] == '[' && host[hl - 1] == ']') {
        memmove(host, host + 1, hl - 2);
        host[hl - 2] = 0;
    }
    char *end;
    long port = strtol(colon + 1, &end, 10);
    if (end == colon + 1 || *end || port < 0 || port > 65535)
        return rd_fail(RD_EINVAL, "http_listen \"%s\": the port is not a number in 0..65535", s->listen);
    struct sockaddr_storage addr;
    int rc = strchr(host, ':') ? uv_ip6_addr(host, (int)port, (struct sockaddr_in6 *)&addr)
                               : uv_ip4_addr(host, (int)port, (struct sockaddr_in *)&addr);
    if (rc)
        return rd_fail(RD_EINVAL, "http_listen \"%s\": %s is not a numeric IP address", s->listen, host);
    s->loopback = net_is_loopback((const struct sockaddr *)&addr);
    if (!s->loopback && !s->key_len && !cfg->insecure)
        return rd_fail(RD_EINVAL, "http_listen \"%s\" is not a loopback address and no api key is set: set "
                       "api_key_file (a file holding the Bearer key), or http_insecure to serve without auth "
                       "on purpose", s->listen);
    if (cfg->tls_cert_file && cfg->tls_cert_file[0] &&
        (rc = proto_tls_ssl_server(cfg->tls_cert_file, cfg->tls_key_file, &s->tls)))
        return rd_fail(rc, "http_tls_cert_file: %s", rd_errmsg());
    s->routes = malloc(sizeof *routes * (size_t)(n_routes > 0 ? n_routes : 1));
    if (!s->routes) {
        proto_tls_ssl_free(s->tls);
        s->tls = NULL;
        return rd_fail(RD_ENOMEM, "http: out of memory for the route table");
    }
    if (n_routes > 0)
        memcpy(s->routes, routes, sizeof *routes * (size_t)n_routes);
    s->n_routes = n_routes;
    uv_tcp_init(loop, &s->listener);
    s->listener.data = s;
    if ((rc = uv_tcp_bind(&s->listener, (const struct sockaddr *)&addr, 0)) ||
        (rc = uv_listen((uv_stream_t *)&s->listener, 511, on_connection))) {
        uv_close((uv_handle_t *)&s->listener, NULL);
        free(s->routes);
        s->routes = NULL;
        proto_tls_ssl_free(s->tls);
        s->tls = NULL;
        return rd_fail(RD_EIO, "http server: cannot listen on %s: %s", s->listen, uv_strerror(rc));
    }
    struct sockaddr_storage bound;
    int blen = sizeof bound;
    if (!uv_tcp_getsockname(&s->listener, (struct sockaddr *)&bound, &blen))
        s->port = ntohs(bound.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&bound)->sin6_port
                                                    : ((struct sockaddr_in *)&bound)->sin_port);
    s->listening = 1;
    return 0;
}

void http_stop(http_server *s)
{
    if (s->listening && !uv_is_closing((uv_handle_t *)&s->listener))
        uv_close((uv_handle_t *)&s->listener, NULL);
    s->listening = 0;
    /* Open connections are closed here, with the callback that frees them
     * (a later uv_walk would close them without it). conn_close unlinks
     * nothing, so the walk is safe. */
    for (http_conn *c = s->conns; c; c = c->next)
        conn_close(c);
    if (!s->conns && s->tls) { /* else the last connection's close callback frees it */
        proto_tls_ssl_free(s->tls);
        s->tls = NULL;
    }
    free(s->routes);
    s->routes = NULL;
    s->n_routes = 0;
}
