/* http.h - the status server: GET /status, /metrics, /health on a uv_tcp_t,
 * parsed with llhttp.
 *
 * One request per connection: every response carries Connection: close and
 * the connection is closed once it is written (status scrapers open one
 * connection per scrape; this keeps the server stateless). A connection that
 * sends more than HTTP_MAX_REQUEST bytes before a complete request, sends
 * something llhttp refuses, or stays silent for HTTP_IDLE_MS is answered 400 /
 * 431 or closed; none of it blocks the loop. */
#ifndef RD_DAEMON_HTTP_H
#define RD_DAEMON_HTTP_H

#include <uv.h>

#define HTTP_MAX_REQUEST 16384      /* bytes of request line + headers */
#define HTTP_IDLE_MS 10000          /* a connection must complete its request within this */

/* What the routes return: malloc'd documents (NULL when out of memory). */
typedef struct {
    char *(*status_json)(void *ud);
    char *(*metrics_text)(void *ud);
    void *ud;
} http_routes;

typedef struct {
    uv_tcp_t listener;
    uv_loop_t *loop;
    http_routes routes;
    int max_conns;
    int n_conns;
    struct http_conn *conns;    /* open connections (freed in their close callbacks) */
    int listening;
} http_server;

/* Binds host:port and listens. */
int http_start(http_server *s, uv_loop_t *loop, const char *host_port, int max_conns, const http_routes *routes);
/* Stops accepting and closes every connection (at shutdown). */
void http_stop(http_server *s);

/* The routing decision alone (unit-testable): method is llhttp's name ("GET"),
 * url the request target. Sets *status, *ctype and a malloc'd *body. */
void http_route(const http_routes *r, const char *method, const char *url, int *status, const char **ctype,
                char **body);

#endif
