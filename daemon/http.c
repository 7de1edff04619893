/* http.c - see http.h. */
#include "daemon/http.h"

#include <llhttp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/log.h"
#include "engine/err.h"

typedef struct http_conn {
    uv_tcp_t tcp;
    uv_timer_t timer;
    http_server *srv;
    struct http_conn *next, *prev; /* the server's open connections */
    llhttp_t parser;
    llhttp_settings_t settings;
    char url[1024];
    size_t url_len;
    int url_too_long;
    int complete;               /* a whole request was parsed */
    int responded;
    size_t bytes_in;
    int open_handles;           /* freed when both handles are closed */
    char rbuf[4096];
} http_conn;

typedef struct {
    uv_write_t req;
    http_conn *conn;
    char *data;                 /* header + body */
} http_write;

static char *dup_text(const char *s)
{
    size_t n = strlen(s);
    char *d = malloc(n + 1);
    if (d)
        memcpy(d, s, n + 1);
    return d;
}

static char *json_error(const char *what, const char *detail)
{
    char buf[1400];
    /* what and detail are ours (no quotes) except the path, which is escaped by the caller. */
    snprintf(buf, sizeof buf, "{\"error\":\"%s\",\"detail\":\"%s\"}\n", what, detail);
    return dup_text(buf);
}

void http_route(const http_routes *r, const char *method, const char *url, int *status, const char **ctype,
                char **body)
{
    /* The path without a query string. */
    char path[1024];
    size_t k = 0;
    for (const char *p = url; *p && *p != '?' && *p != '#' && k < sizeof path - 1; p++)
        path[k++] = *p;
    path[k] = 0;
    *ctype = "application/json";
    int known = !strcmp(path, "/status") || !strcmp(path, "/metrics") || !strcmp(path, "/health");
    if (known && strcmp(method, "GET") && strcmp(method, "HEAD")) {
        *status = 405;
        *body = json_error("method not allowed", "only GET (or HEAD) is served");
        return;
    }
    if (!strcmp(path, "/status")) {
        *status = 200;
        *body = r->status_json(r->ud);
    } else if (!strcmp(path, "/metrics")) {
        *status = 200;
        *ctype = "text/plain; version=0.0.4; charset=utf-8";
        *body = r->metrics_text(r->ud);
    } else if (!strcmp(path, "/health")) {
        *status = 200;
        *body = dup_text("{\"status\":\"ok\"}\n");
    } else {
        /* Echo the path JSON-escaped (only safe characters kept). */
        char safe[200];
        size_t j = 0;
        for (const char *p = path; *p && j < sizeof safe - 1; p++)
            safe[j++] = (*p >= 0x20 && *p < 0x7f && *p != '"' && *p != '\\') ? *p : '?';
        safe[j] = 0;
        char detail[400];
        snprintf(detail, sizeof detail, "no route %s; expected GET /status, /metrics or /health", safe);
        *status = !strcmp(method, "GET") || !strcmp(method, "HEAD") ? 404 : 405;
        *body = json_error(*status == 404 ? "not found" : "method not allowed", detail);
    }
    if (!*body) {
        *status = 500;
        *ctype = "application/json";
        *body = NULL; /* the writer sends an empty body */
    }
}

static void on_handle_closed(uv_handle_t *h)
{
    http_conn *c = h->data;
    if (--c->open_handles == 0) {
        http_server *s = c->srv;
        if (c->prev)
            c->prev->next = c->next;
        else
            s->conns = c->next;
        if (c->next)
            c->next->prev = c->prev;
        s->n_conns--;
        free(c);
    }
}

static void conn_close(http_conn *c)
{
    if (!uv_is_closing((uv_handle_t *)&c->tcp))
        uv_close((uv_handle_t *)&c->tcp, on_handle_closed);
    if (!uv_is_closing((uv_handle_t *)&c->timer))
        uv_close((uv_handle_t *)&c->timer, on_handle_closed);
}

static void on_written(uv_write_t *req, int status)
{
    http_write *w = (http_write *)req;
    conn_close(w->conn);
    free(w->data);
    free(w);
}

static const char *reason(int status)
{
    switch (status) {
    case 200: return "OK";
    case 400: return "Bad Request";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 414: return "URI Too Long";
    case 431: return "Request Header Fields Too Large";
    default: return "Internal Server Error";
    }
}

static void respond(http_conn *c, int status, const char *ctype, char *body, int head_only)
{
    c->responded = 1;
    uv_read_stop((uv_stream_t *)&c->tcp);
    size_t blen = body ? strlen(body) : 0;
    char head[512];
    int hn = snprintf(head, sizeof head,
                      "HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\nConnection: close\r\n"
                      "Cache-Control: no-store\r\n\r\n",
                      status, reason(status), ctype, blen);
    http_write *w = calloc(1, sizeof *w);
    size_t total = (size_t)hn + (head_only ? 0 : blen);
    char *data = w ? malloc(total) : NULL;
    if (!w || !data) {
        free(w);
        free(body);
        conn_close(c);
        return;
    }
    memcpy(data, head, (size_t)hn);
    if (!head_only && blen)
        memcpy(data + hn, body, blen);
    free(body);
    w->conn = c;
    w->data = data;
    uv_buf_t buf = uv_buf_init(data, (unsigned)total);
    if (uv_write(&w->req, (uv_stream_t *)&c->tcp, &buf, 1, on_written)) {
        free(data);
        free(w);
        conn_close(c);
    }
}

static void respond_error(http_conn *c, int status, const char *what, const char *detail)
{
    respond(c, status, "application/json", json_error(what, detail), 0);
}

static int on_url(llhttp_t *p, const char *at, size_t len)
{
    http_conn *c = p->data;
    if (c->url_len + len >= sizeof c->url) {
        c->url_too_long = 1;
        return 0;
    }
    memcpy(c->url + c->url_len, at, len);
    c->url_len += len;
    c->url[c->url_len] = 0;
    return 0;
}

static int on_message_complete(llhttp_t *p)
{
    http_conn *c = p->data;
    c->complete = 1;
    /* Stop here: one request per connection, anything after it is ignored. */
    return HPE_PAUSED;
}

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
    http_conn *c = h->data;
    *buf = uv_buf_init(c->rbuf, sizeof c->rbuf);
}

static void on_read(uv_stream_t *s, ssize_t n, const uv_buf_t *buf)
{
    http_conn *c = s->data;
    if (c->responded)
        return;
    if (n < 0) {
        conn_close(c); /* EOF or error before a complete request */
        return;
    }
    if (n == 0)
        return;
    c->bytes_in += (size_t)n;
    llhttp_errno_t err = llhttp_execute(&c->parser, buf->base, (size_t)n);
    if (c->complete) {
        const char *method = llhttp_method_name(llhttp_get_method(&c->parser));
        if (c->url_too_long) {
            respond_error(c, 414, "uri too long", "the request target is over 1023 bytes");
            return;
        }
        int status;
        const char *ctype;
        char *body = NULL;
        http_route(&c->srv->routes, method, c->url, &status, &ctype, &body);
        respond(c, status, ctype, body, !strcmp(method, "HEAD"));
        return;
    }
    if (err != HPE_OK) {
        respond_error(c, 400, "bad request", "not a valid HTTP/1.x request");
        return;
    }
    if (c->bytes_in > HTTP_MAX_REQUEST)
        respond_error(c, 431, "request too large", "request line and headers must fit 16384 bytes");
}

static void on_idle(uv_timer_t *t)
{
    http_conn *c = t->data;
    if (!c->responded)
        conn_close(c);
}

static void on_connection(uv_stream_t *server, int status)
{
    http_server *s = server->data;
    if (status < 0)
        return;
    http_conn *c = calloc(1, sizeof *c);
    if (!c)
        return;
    c->srv = s;
    uv_tcp_init(s->loop, &c->tcp);
    uv_timer_init(s->loop, &c->timer);
    c->tcp.data = c->timer.data = c;
    c->open_handles = 2;
    s->n_conns++;
    c->next = s->conns;
    if (s->conns)
        s->conns->prev = c;
    s->conns = c;
    if (uv_accept(server, (uv_stream_t *)&c->tcp)) {
        conn_close(c);
        return;
    }
    if (s->n_conns > s->max_conns) {
        /* Over the limit: refuse by closing, so a flood cannot exhaust memory or fds. */
        conn_close(c);
        return;
    }
    llhttp_settings_init(&c->settings);
    c->settings.on_url = on_url;
    c->settings.on_message_complete = on_message_complete;
    llhttp_init(&c->parser, HTTP_REQUEST, &c->settings);
    c->parser.data = c;
    uv_timer_start(&c->timer, on_idle, HTTP_IDLE_MS, 0);
    if (uv_read_start((uv_stream_t *)&c->tcp, on_alloc, on_read))
        conn_close(c);
}

int http_start(http_server *s, uv_loop_t *loop, const char *host_port, int max_conns, const http_routes *routes)
{
    memset(s, 0, sizeof *s);
    s->loop = loop;
    s->routes = *routes;
    s->max_conns = max_conns;
    char host[256];
    const char *colon = strrchr(host_port, ':');
    size_t hl = colon ? (size_t)(colon - host_port) : 0;
    if (!colon || hl == 0 || hl >= sizeof host)
        return rd_fail(RD_EINVAL, "status_listen \"%s\": expected HOST:PORT", host_port);
    memcpy(host, host_port, hl);
    host[hl] = 0;
    int port = atoi(colon + 1);
    struct sockaddr_storage addr;
    int rc = strchr(host, ':') ? uv_ip6_addr(host, port, (struct sockaddr_in6 *)&addr)
                               : uv_ip4_addr(host, port, (struct sockaddr_in *)&addr);
    if (rc)
        return rd_fail(RD_EINVAL, "status_listen \"%s\": %s is not a numeric IP address", host_port, host);
    uv_tcp_init(loop, &s->listener);
    s->listener.data = s;
    if ((rc = uv_tcp_bind(&s->listener, (const struct sockaddr *)&addr, 0)) ||
        (rc = uv_listen((uv_stream_t *)&s->listener, 128, on_connection))) {
        uv_close((uv_handle_t *)&s->listener, NULL);
        return rd_fail(RD_EIO, "status server: cannot listen on %s: %s", host_port, uv_strerror(rc));
    }
    s->listening = 1;
    return 0;
}

void http_stop(http_server *s)
{
    if (s->listening && !uv_is_closing((uv_handle_t *)&s->listener))
        uv_close((uv_handle_t *)&s->listener, NULL);
    s->listening = 0;
    /* Open connections are closed here, with the callback that frees them
     * (a later uv_walk would close them without it). */
    for (struct http_conn *c = s->conns; c; c = c->next)
        conn_close(c);
}
