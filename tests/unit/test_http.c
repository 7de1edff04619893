/* test_http.c - the HTTP server (daemon/http.c, compiled in) on a libuv loop
 * in a thread of this process, with a route table of its own, driven over
 * loopback sockets from the main thread: keep-alive, HTTP/1.0, pipelining in
 * order with asynchronous answers, Content-Length and chunked bodies, the
 * 413/414/431/400 limits, 404/405/HEAD, slowloris eviction and the header,
 * body and idle timeouts, 256 concurrent SSE streams, on_close on a client
 * leaving, the slow-reader bound, Bearer auth and the bind rule. Responses
 * are parsed with llhttp (HTTP_RESPONSE), not by hand. */
#include "daemon/http.c"
#include "daemon/http_tls.c"
#include "daemon/log.c"
#include "daemon/netaddr.c"

#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "base/clock.h"
#include "tests/unit/test.h"

/* ---- the server side: routes run on the loop thread ---- */

static uv_loop_t L;
static uv_async_t stop_async;
static pthread_t loop_thread;
static http_server SA;  /* general: 64 connections, long timeouts, 2 MiB bodies, 1 MiB stream queue */
static http_server SB;  /* short timeouts: header 300 ms, idle 500 ms */
static http_server SC;  /* Bearer auth */
static http_server SS;  /* 512 connections for the streams */

#define MAX_BODY (2u << 20)
#define QUEUE_BYTES (1u << 20)
#define STREAMS 256

static atomic_int n_on_close;       /* on_close callbacks */
static atomic_int n_eio_after_close; /* sends/responds that returned RD_EIO after on_close */
static atomic_int n_ebusy;          /* stream sends refused by the queue bound */
static atomic_int gate;             /* the gated streams may go on */
static atomic_int active_streams, max_active_streams;
static atomic_int misuse_codes[4];  /* return codes seen by /misuse */

typedef struct {
    uv_timer_t t;
    http_res *h;
    int kind;                   /* J_* */
    int n, i;                   /* events to send, sent */
    int gone;                   /* on_close ran */
    int counted;                /* counted in active_streams */
} job;

enum { J_LATER, J_SSE, J_FOREVER, J_FLOOD };

static void job_freed(uv_handle_t *hd) { free(hd->data); }

static void job_finish(job *j)
{
    if (j->counted)
        atomic_fetch_sub(&active_streams, 1);
    uv_timer_stop(&j->t);
    uv_close((uv_handle_t *)&j->t, job_freed);
}

static void job_on_close(http_res *h, void *ud)
{
    job *j = ud;
    j->gone = 1;
    atomic_fetch_add(&n_on_close, 1);
}

static void job_tick(uv_timer_t *t)
{
    job *j = t->data;
    char ev[64];
    switch (j->kind) {
    case J_LATER: {
        static const char msg[] = "later\n";
        int rc = http_respond(j->h, 200, "text/plain", msg, sizeof msg - 1);
        if (j->gone && rc == RD_EIO)
            atomic_fetch_add(&n_eio_after_close, 1);
        job_finish(j);
        return;
    }
    case J_SSE:
        if (j->gone) {
            http_release(j->h);
            job_finish(j);
            return;
        }
        if (j->i == 1 && !atomic_load(&gate))
            return; /* the first event is out; wait for the test to open the gate */
        if (j->i < j->n) {
            int n = snprintf(ev, sizeof ev, "data: %d\n\n", j->i++);
            http_stream_send(j->h, ev, (size_t)n);
            return;
        }
        http_stream_end(j->h);
        job_finish(j);
        return;
    case J_FOREVER: {
        int n = snprintf(ev, sizeof ev, "data: %d\n\n", j->i++);
        int rc = http_stream_send(j->h, ev, (size_t)n);
        if (j->gone) {
            if (rc == RD_EIO)
                atomic_fetch_add(&n_eio_after_close, 1);
            http_release(j->h);
            job_finish(j);
        }
        return;
    }
    case J_FLOOD: {
        static char blob[65536];
        memset(blob, 'x', sizeof blob - 2);
        for (int k = 0; k < 32 && !j->gone; k++) {
            int rc = http_stream_send(j->h, blob, sizeof blob);
            if (rc == RD_EBUSY)
                atomic_fetch_add(&n_ebusy, 1);
            if (rc)
                break;
        }
        if (j->gone) {
            http_release(j->h);
            job_finish(j);
        }
        return;
    }
    }
}

static job *start_job(http_res *h, int kind, int n, uint64_t every_ms)
{
    job *j = calloc(1, sizeof *j);
    if (!j) {
        http_release(h);
        return NULL;
    }
    j->h = h;
    j->kind = kind;
    j->n = n;
    uv_timer_init(&L, &j->t);
    j->t.data = j;
    http_on_close(h, job_on_close, j);
    uv_timer_start(&j->t, job_tick, every_ms, kind == J_LATER ? 0 : every_ms);
    return j;
}

static void r_hello(http_res *h, const http_req *r, void *ud)
{
    http_respond(h, 200, "text/plain", "hello\n", 6);
}

static void r_echo(http_res *h, const http_req *r, void *ud)
{
    http_respond(h, 200, r->content_type ? r->content_type : "application/octet-stream", r->body, r->body_len);
}

static void r_query(http_res *h, const http_req *r, void *ud)
{
    char out[600];
    int n = snprintf(out, sizeof out, "path=%.200s query=%.200s auth=%s", r->path, r->query,
                     r->authorization ? r->authorization : "-");
    http_respond(h, 200, "text/plain", out, (size_t)n);
}

static void r_later(http_res *h, const http_req *r, void *ud) { start_job(h, J_LATER, 0, 30); }

static void r_sse(http_res *h, const http_req *r, void *ud)
{
    int n = atoi(strstr(r->query, "n=") ? strstr(r->query, "n=") + 2 : "3");
    if (http_stream_begin(h, 200, "X-Stream: yes\r\n")) {
        http_release(h);
        return;
    }
    /* Counted before the first event goes out, which the client waits for. */
    int now = atomic_fetch_add(&active_streams, 1) + 1;
    int seen = atomic_load(&max_active_streams);
    while (now > seen && !atomic_compare_exchange_weak(&max_active_streams, &seen, now))
        ;
    http_stream_send(h, "data: 0\n\n", 9);
    job *j = start_job(h, J_SSE, n, 2);
    if (j) {
        j->i = 1; /* the first event is out */
        j->counted = 1;
    }
}

static void r_forever(http_res *h, const http_req *r, void *ud)
{
    http_stream_begin(h, 200, NULL);
    start_job(h, J_FOREVER, 0, 5);
}

static void r_flood(http_res *h, const http_req *r, void *ud)
{
    http_stream_begin(h, 200, "Content-Type: application/octet-stream\r\n");
    start_job(h, J_FLOOD, 0, 1);
}

static void r_drop(http_res *h, const http_req *r, void *ud) { http_release(h); }

static void r_misuse(http_res *h, const http_req *r, void *ud)
{
    atomic_store(&misuse_codes[0], http_stream_send(h, "x", 1));          /* before begin */
    atomic_store(&misuse_codes[1], http_stream_begin(h, 200, "X: a\nY: b\r\n")); /* a bare LF */
    atomic_store(&misuse_codes[2], http_stream_begin(h, 200, NULL));
    atomic_store(&misuse_codes[3], http_stream_begin(h, 200, NULL));      /* twice */
    http_stream_send(h, "data: 1\n\n", 9);
    http_stream_end(h);
}

static const http_route ROUTES[] = {
    {"GET", "/hello", r_hello, NULL, 0},
    {"POST", "/echo", r_echo, NULL, 0},
    {"GET", "/query", r_query, NULL, 0},
    {"GET", "/later", r_later, NULL, 0},
    {"GET", "/sse", r_sse, NULL, 0},
    {"GET", "/forever", r_forever, NULL, 0},
    {"GET", "/flood", r_flood, NULL, 0},
    {"GET", "/drop", r_drop, NULL, 0},
    {"GET", "/misuse", r_misuse, NULL, 0},
    {"GET", "/open", r_hello, NULL, HTTP_ROUTE_PUBLIC},
};
#define N_ROUTES ((int)(sizeof ROUTES / sizeof ROUTES[0]))

static void on_stop(uv_async_t *a)
{
    http_stop(&SA);
    http_stop(&SB);
    http_stop(&SC);
    http_stop(&SS);
    uv_close((uv_handle_t *)a, NULL);
}

static void *loop_main(void *arg)
{
    uv_run(&L, UV_RUN_DEFAULT);
    return NULL;
}

static http_config base_config(void)
{
    http_config c = {
        .listen = "127.0.0.1:0",
        .max_conns = 64,
        .max_body_bytes = MAX_BODY,
        .header_timeout_ms = 60000,
        .idle_timeout_ms = 60000,
        .stream_queue_bytes = QUEUE_BYTES,
    };
    return c;
}

static int start_servers(void)
{
    uv_loop_init(&L);
    uv_async_init(&L, &stop_async, on_stop);
    http_config a = base_config();
    http_config b = base_config();
    b.header_timeout_ms = 300;
    b.idle_timeout_ms = 500;
    http_config c = base_config();
    c.api_key = "s3cret-key";
    http_config s = base_config();
    s.max_conns = 512;
    int rc;
    if ((rc = http_start(&SA, &L, &a, ROUTES, N_ROUTES)) || (rc = http_start(&SB, &L, &b, ROUTES, N_ROUTES)) ||
        (rc = http_start(&SC, &L, &c, ROUTES, N_ROUTES)) || (rc = http_start(&SS, &L, &s, ROUTES, N_ROUTES)))
        return rc;
    return pthread_create(&loop_thread, NULL, loop_main, NULL) ? RD_EIO : 0;
}

/* ---- the client side: blocking sockets, llhttp as the response parser ---- */

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

typedef struct {
    int fd;
    llhttp_t p;
    llhttp_settings_t st;
    char in[65536];             /* received, not parsed */
    size_t off, len;
    int eof;
    /* the response being read */
    int head;                   /* it answers a HEAD */
    int done;
    int status;
    char hdrs[8192];            /* "name: value\n", names lowercased */
    size_t hlen;
    char *body;
    size_t blen, bcap;
    int chunks;                 /* chunk headers seen (the final one included) */
} cl;

static void hput(cl *k, const char *s, size_t n, int lower)
{
    for (size_t i = 0; i < n && k->hlen + 1 < sizeof k->hdrs; i++)
        k->hdrs[k->hlen++] = lower && s[i] >= 'A' && s[i] <= 'Z' ? (char)(s[i] + 32) : s[i];
    k->hdrs[k->hlen] = 0;
}

static int c_field(llhttp_t *p, const char *at, size_t n) { hput(p->data, at, n, 1); return 0; }
static int c_field_done(llhttp_t *p) { hput(p->data, ": ", 2, 0); return 0; }
static int c_value(llhttp_t *p, const char *at, size_t n) { hput(p->data, at, n, 0); return 0; }
static int c_value_done(llhttp_t *p) { hput(p->data, "\n", 1, 0); return 0; }

static int c_headers_done(llhttp_t *p)
{
    cl *k = p->data;
    k->status = p->status_code;
    if (k->status == 100) /* an interim answer: the real one follows */
        return 0;
    return k->head ? 1 : 0;
}

static int c_body(llhttp_t *p, const char *at, size_t n)
{
    cl *k = p->data;
    if (k->blen + n + 1 > k->bcap) {
        k->bcap = (k->blen + n + 1) * 2;
        k->body = realloc(k->body, k->bcap);
    }
    memcpy(k->body + k->blen, at, n);
    k->blen += n;
    k->body[k->blen] = 0;
    return 0;
}

static int c_chunk(llhttp_t *p)
{
    ((cl *)p->data)->chunks++;
    return 0;
}

static int c_done(llhttp_t *p)
{
    cl *k = p->data;
    if (k->status == 100) { /* 100 Continue: keep reading for the final response */
        k->hlen = 0;
        k->hdrs[0] = 0;
        return 0;
    }
    k->done = 1;
    return HPE_PAUSED;
}

static void cl_reset(cl *k, int head)
{
    k->head = head;
    k->done = 0;
    k->status = 0;
    k->hlen = 0;
    k->hdrs[0] = 0;
    k->blen = 0;
    if (k->body)
        k->body[0] = 0;
    k->chunks = 0;
}

static cl *cl_open(int port)
{
    cl *k = calloc(1, sizeof *k);
    k->fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(k->fd, (struct sockaddr *)&a, sizeof a)) {
        close(k->fd);
        free(k);
        return NULL;
    }
    int one = 1;
    setsockopt(k->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    llhttp_settings_init(&k->st);
    k->st.on_header_field = c_field;
    k->st.on_header_field_complete = c_field_done;
    k->st.on_header_value = c_value;
    k->st.on_header_value_complete = c_value_done;
    k->st.on_headers_complete = c_headers_done;
    k->st.on_body = c_body;
    k->st.on_chunk_header = c_chunk;
    k->st.on_message_complete = c_done;
    llhttp_init(&k->p, HTTP_RESPONSE, &k->st);
    k->p.data = k;
    cl_reset(k, 0);
    return k;
}

static void cl_close(cl *k)
{
    if (!k)
        return;
    close(k->fd);
    free(k->body);
    free(k);
}

static int cl_send(cl *k, const char *s, size_t n)
{
    while (n > 0) {
        ssize_t w = send(k->fd, s, n, MSG_NOSIGNAL);
        if (w <= 0)
            return -1;
        s += w;
        n -= (size_t)w;
    }
    return 0;
}

static int cl_sends(cl *k, const char *s) { return cl_send(k, s, strlen(s)); }

/* Parses what is buffered: 1 when a response completed, 0 when more is
 * needed, -1 on a parse error. */
static int cl_parse(cl *k)
{
    if (k->off == k->len)
        return k->done;
    const char *d = k->in + k->off;
    llhttp_errno_t e = llhttp_execute(&k->p, d, k->len - k->off);
    if (e == HPE_PAUSED) {
        k->off += (size_t)(llhttp_get_error_pos(&k->p) - d);
        llhttp_resume(&k->p);
        return 1;
    }
    if (e != HPE_OK)
        return -1;
    k->off = k->len = 0;
    return k->done;
}

/* One read within ms: 1 bytes came, 0 timeout, -1 EOF or error. */
static int cl_pump(cl *k, int ms)
{
    if (k->eof)
        return -1;
    struct pollfd pf = {k->fd, POLLIN, 0};
    if (poll(&pf, 1, ms) <= 0)
        return 0;
    if (k->off > 0) {
        memmove(k->in, k->in + k->off, k->len - k->off);
        k->len -= k->off;
        k->off = 0;
    }
    ssize_t n = recv(k->fd, k->in + k->len, sizeof k->in - k->len, 0);
    if (n <= 0) {
        k->eof = 1;
        if (!k->done && llhttp_finish(&k->p) == HPE_OK && k->status)
            k->done = 1; /* a body framed by the close */
        return -1;
    }
    k->len += (size_t)n;
    return 1;
}

/* The next response (head: it answers a HEAD): its status, or -1. */
static int cl_read(cl *k, int head, int ms)
{
    cl_reset(k, head);
    double end = clock_now_s() + ms / 1e3;
    for (;;) {
        int r = cl_parse(k);
        if (r < 0)
            return -1;
        if (r > 0)
            return k->status;
        int left = (int)((end - clock_now_s()) * 1e3);
        if (left <= 0)
            return -1;
        if (cl_pump(k, left) < 0)
            return k->done ? k->status : -1;
    }
}

/* 1 when the server closes the connection within ms (EOF or reset). */
static int cl_closed_within(cl *k, int ms)
{
    double end = clock_now_s() + ms / 1e3;
    while (clock_now_s() < end) {
        if (k->eof)
            return 1;
        int left = (int)((end - clock_now_s()) * 1e3);
        struct pollfd pf = {k->fd, POLLIN, 0};
        if (poll(&pf, 1, left > 0 ? left : 1) <= 0)
            continue;
        char tmp[4096];
        ssize_t n = recv(k->fd, tmp, sizeof tmp, 0);
        if (n <= 0) {
            k->eof = 1;
            return 1;
        }
    }
    return 0;
}

static int hdr(const cl *k, const char *line) { return strstr(k->hdrs, line) != NULL; }

/* GET path on a fresh connection to port: the status (body in *k). */
static int get_once(int port, const char *path, cl **out)
{
    cl *k = cl_open(port);
    if (!k)
        return -1;
    char req[512];
    snprintf(req, sizeof req, "GET %s HTTP/1.1\r\nHost: t\r\n\r\n", path);
    int st = cl_sends(k, req) ? -1 : cl_read(k, 0, 5000);
    if (out)
        *out = k;
    else
        cl_close(k);
    return st;
}

static int wait_atomic_at_least(atomic_int *v, int want, int ms)
{
    double end = clock_now_s() + ms / 1e3;
    while (atomic_load(v) < want && clock_now_s() < end)
        sleep_ms(5);
    return atomic_load(v) >= want;
}

/* ---- cases ---- */

static void keep_alive_http10_and_close(void)
{
    cl *k = cl_open(SA.port);
    CHECK(k, "connect");
    for (int i = 0; i < 1000; i++) {
        CHECK(!cl_sends(k, "GET /hello HTTP/1.1\r\nHost: t\r\n\r\n"), "send %d", i);
        int st = cl_read(k, 0, 5000);
        CHECK(st == 200 && k->blen == 6 && !memcmp(k->body, "hello\n", 6), "request %d: %d", i, st);
        CHECK(hdr(k, "connection: keep-alive") && hdr(k, "content-length: 6"), "%.300s", k->hdrs);
    }
    /* Connection: close is honoured: the answer says so and the server closes. */
    CHECK(!cl_sends(k, "GET /hello HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n"), "send");
    CHECK(cl_read(k, 0, 5000) == 200 && hdr(k, "connection: close"), "%.300s", k->hdrs);
    CHECK(cl_closed_within(k, 5000), "still open after Connection: close");
    cl_close(k);
    /* HTTP/1.0 closes by default... */
    k = cl_open(SA.port);
    CHECK(!cl_sends(k, "GET /hello HTTP/1.0\r\n\r\n"), "send");
    CHECK(cl_read(k, 0, 5000) == 200 && hdr(k, "connection: close"), "%.300s", k->hdrs);
    CHECK(cl_closed_within(k, 5000), "HTTP/1.0 left open");
    cl_close(k);
    /* ... and stays with keep-alive. */
    k = cl_open(SA.port);
    for (int i = 0; i < 3; i++) {
        CHECK(!cl_sends(k, "GET /hello HTTP/1.0\r\nConnection: keep-alive\r\n\r\n"), "send");
        CHECK(cl_read(k, 0, 5000) == 200 && hdr(k, "connection: keep-alive"), "%d: %.300s", i, k->hdrs);
    }
    cl_close(k);
}

static void pipelined_requests_answered_in_order(void)
{
    cl *k = cl_open(SA.port);
    CHECK(k, "connect");
    /* One write: an asynchronous answer first, then synchronous ones, a body, HEAD and a 404. */
    static const char batch[] = "GET /later HTTP/1.1\r\nHost: t\r\n\r\n"
                                "GET /hello HTTP/1.1\r\nHost: t\r\n\r\n"
                                "POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 3\r\n\r\nabc"
                                "GET /later HTTP/1.1\r\nHost: t\r\n\r\n"
                                "HEAD /hello HTTP/1.1\r\nHost: t\r\n\r\n"
                                "GET /nope HTTP/1.1\r\nHost: t\r\n\r\n"
                                "GET /query?x=1 HTTP/1.1\r\nHost: t\r\n\r\n";
    CHECK(!cl_send(k, batch, sizeof batch - 1), "send");
    CHECK(cl_read(k, 0, 5000) == 200 && !strcmp(k->body, "later\n"), "1st: %.300s", k->body ? k->body : "");
    CHECK(cl_read(k, 0, 5000) == 200 && !strcmp(k->body, "hello\n"), "2nd: %.300s", k->body);
    CHECK(cl_read(k, 0, 5000) == 200 && !strcmp(k->body, "abc"), "3rd: %.300s", k->body);
    CHECK(cl_read(k, 0, 5000) == 200 && !strcmp(k->body, "later\n"), "4th: %.300s", k->body);
    CHECK(cl_read(k, 1, 5000) == 200 && k->blen == 0 && hdr(k, "content-length: 6"), "HEAD: %.300s", k->hdrs);
    CHECK(cl_read(k, 0, 5000) == 404 && strstr(k->body, "\"error\":\"not found\""), "5th: %.300s", k->body);
    CHECK(cl_read(k, 0, 5000) == 200 && strstr(k->body, "path=/query query=x=1"), "6th: %.300s", k->body);
    /* 1000 behind an asynchronous one in one write (about 35 KB). */
    size_t cap = 40 * 1024 + 64, n = 0;
    char *big = malloc(cap);
    n += (size_t)snprintf(big + n, cap - n, "GET /later HTTP/1.1\r\nHost: t\r\n\r\n");
    for (int i = 0; i < 1000; i++)
        n += (size_t)snprintf(big + n, cap - n, "GET /query?i=%d HTTP/1.1\r\n\r\n", i);
    int rc = cl_send(k, big, n);
    free(big);
    CHECK(!rc, "send");
    CHECK(cl_read(k, 0, 5000) == 200 && !strcmp(k->body, "later\n"), "later: %.300s", k->body);
    for (int i = 0; i < 1000; i++) {
        char want[64];
        snprintf(want, sizeof want, "query=i=%d auth", i);
        CHECK(cl_read(k, 0, 5000) == 200 && strstr(k->body, want), "%d: %.300s", i, k->body);
    }
    cl_close(k);
}

static void bodies_by_length_and_chunked(void)
{
    cl *k = cl_open(SA.port);
    CHECK(k, "connect");
    CHECK(!cl_sends(k, "POST /echo HTTP/1.1\r\nHost: t\r\nContent-Type: text/x-a\r\nContent-Length: 5\r\n\r\nhello"),
          "send");
    CHECK(cl_read(k, 0, 5000) == 200 && !strcmp(k->body, "hello") && hdr(k, "content-type: text/x-a"), "%.300s",
          k->hdrs);
    /* Chunked, in pieces with pauses between them; chunk extensions and trailers allowed. */
    const char *parts[] = {"POST /echo HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n", "3\r\nabc\r\n",
                           "4;ext=1\r\nde", "fg\r\n", "0\r\nX-Trailer: 1\r\n\r\n"};
    for (int i = 0; i < 5; i++) {
        CHECK(!cl_sends(k, parts[i]), "send");
        sleep_ms(20);
    }
    CHECK(cl_read(k, 0, 5000) == 200 && !strcmp(k->body, "abcdefg"), "chunked: %.300s", k->body);
    /* A body just under the limit, by length and chunked. */
    size_t n = MAX_BODY;
    char *big = malloc(n);
    for (size_t i = 0; i < n; i++)
        big[i] = (char)('a' + i % 26);
    char head[200];
    snprintf(head, sizeof head, "POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: %zu\r\n\r\n", n);
    CHECK(!cl_sends(k, head) && !cl_send(k, big, n), "send");
    int st = cl_read(k, 0, 10000);
    CHECK(st == 200 && k->blen == n && !memcmp(k->body, big, n), "%d %zu", st, k->blen);
    CHECK(!cl_sends(k, "POST /echo HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n"), "send");
    for (size_t off = 0; off < n; off += 65536) {
        char sz[32];
        snprintf(sz, sizeof sz, "%x\r\n", 65536);
        CHECK(!cl_sends(k, sz) && !cl_send(k, big + off, 65536) && !cl_sends(k, "\r\n"), "send");
    }
    CHECK(!cl_sends(k, "0\r\n\r\n"), "send");
    st = cl_read(k, 0, 10000);
    CHECK(st == 200 && k->blen == n && !memcmp(k->body, big, n), "chunked big: %d %zu", st, k->blen);
    free(big);
    /* Expect: 100-continue gets the interim answer before the body is sent. */
    CHECK(!cl_sends(k, "POST /echo HTTP/1.1\r\nHost: t\r\nExpect: 100-continue\r\nContent-Length: 2\r\n\r\n"), "send");
    CHECK(cl_pump(k, 5000) == 1 && memmem(k->in + k->off, k->len - k->off, "HTTP/1.1 100 Continue\r\n\r\n", 25),
          "no 100 Continue");
    CHECK(!cl_sends(k, "ok"), "send");
    CHECK(cl_read(k, 0, 5000) == 200 && !strcmp(k->body, "ok"), "after 100: %d %.300s", k->status, k->body);
    cl_close(k);
}

static void limits_answer_413_414_431_400(void)
{
    /* A declared body over the limit: 413 before any body byte is sent, then close. */
    cl *k = cl_open(SA.port);
    CHECK(k, "connect");
    CHECK(!cl_sends(k, "POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 1000000000000\r\n\r\n"), "send");
    CHECK(cl_read(k, 0, 5000) == 413 && strstr(k->body, "max_http_body_bytes") && hdr(k, "connection: close"),
          "%d %.300s", k->status, k->body ? k->body : "");
    CHECK(cl_closed_within(k, 5000), "left open after 413");
    cl_close(k);
    /* A chunked body that grows past it: 413 and close. */
    k = cl_open(SA.port);
    CHECK(!cl_sends(k, "POST /echo HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n"), "send");
    char *blob = malloc(1 << 20);
    memset(blob, 'z', 1 << 20);
    int st = -1;
    for (int i = 0; i < 4 && st < 0; i++) {
        if (cl_sends(k, "100000\r\n") || cl_send(k, blob, 1 << 20) || cl_sends(k, "\r\n"))
            break; /* the server may already have closed */
    }
    free(blob);
    st = cl_read(k, 0, 5000);
    CHECK(st == 413, "chunked over the limit: %d", st);
    CHECK(cl_closed_within(k, 5000), "left open after chunked 413");
    cl_close(k);
    /* Headers over the bound: 431. */
    k = cl_open(SA.port);
    char *hbig = malloc(20000 + 100);
    int n = sprintf(hbig, "GET /hello HTTP/1.1\r\nX-Big: ");
    memset(hbig + n, 'h', 20000);
    n += 20000;
    n += sprintf(hbig + n, "\r\n\r\n");
    CHECK(!cl_send(k, hbig, (size_t)n), "send");
    free(hbig);
    CHECK(cl_read(k, 0, 5000) == 431 && cl_closed_within(k, 5000), "big header: %d", k->status);
    cl_close(k);
    /* Too many fields: 431. */
    k = cl_open(SA.port);
    char many[4096];
    n = sprintf(many, "GET /hello HTTP/1.1\r\n");
    for (int i = 0; i < HTTP_MAX_HEADERS + 1; i++)
        n += sprintf(many + n, "X-%d: v\r\n", i);
    n += sprintf(many + n, "\r\n");
    CHECK(!cl_send(k, many, (size_t)n), "send");
    CHECK(cl_read(k, 0, 5000) == 431, "many headers: %d", k->status);
    cl_close(k);
    /* Whitespace padding the parser never reports still counts. */
    k = cl_open(SA.port);
    CHECK(!cl_sends(k, "GET /hello HTTP/1.1\r\nX-Pad:"), "send");
    char spaces[8192];
    memset(spaces, ' ', sizeof spaces);
    for (int i = 0; i < 8 && !cl_send(k, spaces, sizeof spaces); i++)
        ;
    CHECK(cl_read(k, 0, 5000) == 431, "padding: %d", k->status);
    cl_close(k);
    /* A target over HTTP_MAX_TARGET: 414. */
    k = cl_open(SA.port);
    char *t = malloc(HTTP_MAX_TARGET + 100);
    n = sprintf(t, "GET /");
    memset(t + n, 'a', HTTP_MAX_TARGET);
    n += HTTP_MAX_TARGET;
    n += sprintf(t + n, " HTTP/1.1\r\n\r\n");
    CHECK(!cl_send(k, t, (size_t)n), "send");
    free(t);
    CHECK(cl_read(k, 0, 5000) == 414, "long target: %d", k->status);
    cl_close(k);
    /* Garbage: 400 and close; Content-Length with chunked: 400. */
    static const char g0[] = "\x00\x01garbage\r\n\r\n";
    const struct {
        const char *text;
        size_t len;
    } bad[] = {{g0, sizeof g0 - 1},
               {"GET / HTTP/1.1\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n", 0},
               {"GET /hello HTTP/9.9\r\n\r\n", 0},
               {"GET /hello HTTP/1.1\r\nBad Header\r\n\r\n", 0}};
    for (int i = 0; i < 4; i++) {
        k = cl_open(SA.port);
        CHECK(!cl_send(k, bad[i].text, bad[i].len ? bad[i].len : strlen(bad[i].text)), "send");
        int s = cl_read(k, 0, 5000);
        CHECK(s == 400 && strstr(k->body, "bad request") && cl_closed_within(k, 5000), "bad %d: %d", i, s);
        cl_close(k);
    }
    /* The server still answers. */
    CHECK(get_once(SA.port, "/hello", NULL) == 200, "after the abuse");
}

static void routing_404_405_head_query_500(void)
{
    cl *k = NULL;
    CHECK(get_once(SA.port, "/nope", &k) == 404, "404");
    CHECK(hdr(k, "content-type: application/json") && strstr(k->body, "\"error\":\"not found\"") &&
              strstr(k->body, "GET /hello"), "%.300s", k->body);
    /* A known path, another method: 405 with Allow. */
    CHECK(!cl_sends(k, "POST /hello HTTP/1.1\r\nContent-Length: 0\r\n\r\n"), "send");
    CHECK(cl_read(k, 0, 5000) == 405 && hdr(k, "allow: GET, HEAD") && strstr(k->body, "method not allowed"), "%.300s",
          k->hdrs);
    CHECK(!cl_sends(k, "DELETE /echo HTTP/1.1\r\n\r\n"), "send");
    CHECK(cl_read(k, 0, 5000) == 405 && hdr(k, "allow: POST\n"), "%.300s", k->hdrs);
    /* HEAD: the length of the GET, no body (the next answer parses cleanly). */
    CHECK(!cl_sends(k, "HEAD /hello HTTP/1.1\r\n\r\nGET /hello HTTP/1.1\r\n\r\n"), "send");
    CHECK(cl_read(k, 1, 5000) == 200 && k->blen == 0 && hdr(k, "content-length: 6"), "HEAD %.300s", k->hdrs);
    CHECK(cl_read(k, 0, 5000) == 200 && !strcmp(k->body, "hello\n"), "after HEAD");
    /* Path and query split; a route that gives up answers 500. */
    CHECK(!cl_sends(k, "GET /query?a=1&b=%20 HTTP/1.1\r\n\r\nGET /drop HTTP/1.1\r\n\r\nGET /hello HTTP/1.1\r\n\r\n"),
          "send");
    CHECK(cl_read(k, 0, 5000) == 200 && strstr(k->body, "path=/query query=a=1&b=%20"), "%.300s", k->body);
    CHECK(cl_read(k, 0, 5000) == 500 && strstr(k->body, "without an answer"), "drop: %d", k->status);
    CHECK(cl_read(k, 0, 5000) == 200, "after 500");
    cl_close(k);
}

static void route_api_refuses_misuse(void)
{
    cl *k = NULL;
    CHECK(get_once(SA.port, "/misuse", &k) == 200, "misuse");
    CHECK(atomic_load(&misuse_codes[0]) == RD_EINVAL, "send before begin: %d", atomic_load(&misuse_codes[0]));
    CHECK(atomic_load(&misuse_codes[1]) == RD_EINVAL, "bare LF header: %d", atomic_load(&misuse_codes[1]));
    CHECK(atomic_load(&misuse_codes[2]) == 0, "begin: %d", atomic_load(&misuse_codes[2]));
    CHECK(atomic_load(&misuse_codes[3]) == RD_EINVAL, "begin twice: %d", atomic_load(&misuse_codes[3]));
    CHECK(!strcmp(k->body, "data: 1\n\n") && hdr(k, "transfer-encoding: chunked") &&
              hdr(k, "content-type: text/event-stream"), "%.150s / %.150s", k->hdrs, k->body);
    cl_close(k);
}

static void slowloris_is_evicted_and_timed_out(void)
{
    enum { HALF = 150 };
    /* SA: 64 connections and a 60 s header timeout, so only eviction can make room. */
    cl *half[HALF];
    for (int i = 0; i < HALF; i++) {
        half[i] = cl_open(SA.port);
        CHECK(half[i], "connect %d", i);
        CHECK(!cl_sends(half[i], "GET /hello HTTP/1.1\r\nHost: t\r\nX-Slow: "), "send %d", i);
    }
    sleep_ms(100);
    double t0 = clock_now_s();
    CHECK(get_once(SA.port, "/hello", NULL) == 200, "/hello behind %d half requests", HALF);
    CHECK(clock_now_s() - t0 < 30, "took %.1f s", clock_now_s() - t0);
    CHECK(SA.n_conns <= 64, "%d open", SA.n_conns);
    sleep_ms(100);
    int closed = 0;
    for (int i = 0; i < HALF; i++)
        closed += cl_closed_within(half[i], 20);
    CHECK(closed >= HALF - 64, "only %d of %d half requests evicted", closed, HALF);
    for (int i = 0; i < HALF; i++)
        cl_close(half[i]);
    CHECK(SA.n_evicted >= HALF - 64, "%llu evicted", (unsigned long long)SA.n_evicted);

    /* SB: header timeout 300 ms. Half headers, a silent connection and a stalled body are closed. */
    cl *h[20];
    for (int i = 0; i < 20; i++) {
        h[i] = cl_open(SB.port);
        CHECK(h[i], "connect");
        if (i == 0)
            continue; /* says nothing at all */
        if (i == 1)
            cl_sends(h[i], "POST /echo HTTP/1.1\r\nContent-Length: 10\r\n\r\nabc"); /* the body stalls */
        else
            cl_sends(h[i], "GET /hello HTTP/1.1\r\nHost: t\r\n");
    }
    for (int i = 0; i < 20; i++)
        CHECK(cl_closed_within(h[i], 10000), "connection %d still open past the header timeout", i);
    for (int i = 0; i < 20; i++)
        cl_close(h[i]);
    CHECK(SB.n_timeouts >= 20, "%llu timeouts", (unsigned long long)SB.n_timeouts);
    /* A header trickled byte by byte does not reset the timeout. */
    cl *k = cl_open(SB.port);
    const char *req = "GET /hello HTTP/1.1\r\nHost: t\r\nX-Slow: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\r\n\r\n";
    int got_closed = 0;
    for (const char *p = req; *p && !got_closed; p++) {
        if (cl_send(k, p, 1))
            got_closed = 1;
        else
            got_closed = cl_closed_within(k, 40);
    }
    CHECK(got_closed || cl_closed_within(k, 5000), "a trickled header outlived the timeout");
    cl_close(k);
    CHECK(get_once(SB.port, "/hello", NULL) == 200, "SB still answers");
}

static void idle_keep_alive_is_closed(void)
{
    cl *k = cl_open(SB.port);
    CHECK(k, "connect");
    double t0 = clock_now_s();
    CHECK(!cl_sends(k, "GET /hello HTTP/1.1\r\n\r\n") && cl_read(k, 0, 5000) == 200, "first");
    /* Still usable right away (the idle timeout is 500 ms, the header timeout 300 ms: idle uses its own). */
    sleep_ms(350);
    CHECK(!cl_sends(k, "GET /hello HTTP/1.1\r\n\r\n") && cl_read(k, 0, 5000) == 200, "second after 350 ms");
    double t1 = clock_now_s();
    CHECK(cl_closed_within(k, 10000), "idle connection never closed");
    CHECK(clock_now_s() - t1 >= 0.45, "closed after %.3f s; expected the 500 ms idle timeout", clock_now_s() - t1);
    (void)t0;
    cl_close(k);
}

static void streams_256_at_once(void)
{
    atomic_store(&gate, 0);
    atomic_store(&max_active_streams, 0);
    cl *k[STREAMS];
    for (int i = 0; i < STREAMS; i++) {
        k[i] = cl_open(SS.port);
        CHECK(k[i], "connect %d", i);
        CHECK(!cl_sends(k[i], "GET /sse?n=20 HTTP/1.1\r\nHost: t\r\n\r\n"), "send %d", i);
        cl_reset(k[i], 0);
    }
    /* Every stream sends its first event and then waits: all are open at once. */
    for (int i = 0; i < STREAMS; i++) {
        double end = clock_now_s() + 20;
        while (!(k[i]->body && strstr(k[i]->body, "data: 0\n\n")) && clock_now_s() < end) {
            if (cl_pump(k[i], 100) < 0)
                break;
            CHECK(cl_parse(k[i]) >= 0, "parse %d", i);
        }
        CHECK(k[i]->body && strstr(k[i]->body, "data: 0\n\n"), "stream %d: no first event", i);
        CHECK(k[i]->status == 200 && hdr(k[i], "content-type: text/event-stream") && hdr(k[i], "x-stream: yes") &&
                  hdr(k[i], "transfer-encoding: chunked"), "%.300s", k[i]->hdrs);
    }
    CHECK(atomic_load(&max_active_streams) == STREAMS, "%d concurrent", atomic_load(&max_active_streams));
    atomic_store(&gate, 1);
    /* Then all 20 events each, in order, and the terminating chunk. */
    struct pollfd pf[STREAMS];
    int left = STREAMS;
    double end = clock_now_s() + 60;
    while (left > 0 && clock_now_s() < end) {
        for (int i = 0; i < STREAMS; i++)
            pf[i] = (struct pollfd){k[i]->done ? -1 : k[i]->fd, POLLIN, 0};
        poll(pf, STREAMS, 200);
        for (int i = 0; i < STREAMS; i++) {
            if (k[i]->done || !(pf[i].revents & (POLLIN | POLLHUP | POLLERR)))
                continue;
            cl_pump(k[i], 0);
            CHECK(cl_parse(k[i]) >= 0, "parse %d", i);
            if (k[i]->done)
                left--;
        }
    }
    CHECK(left == 0, "%d streams unfinished", left);
    for (int i = 0; i < STREAMS; i++) {
        char *p = k[i]->body;
        for (int e = 0; e < 20; e++) {
            char want[32];
            snprintf(want, sizeof want, "data: %d\n\n", e);
            CHECK(!strncmp(p, want, strlen(want)), "stream %d event %d: %.40s", i, e, p);
            p += strlen(want);
        }
        CHECK(*p == 0, "stream %d: extra bytes", i);
        CHECK(k[i]->chunks == 21, "stream %d: %d chunks", i, k[i]->chunks);
    }
    /* The connections are reusable after a stream. */
    for (int i = 0; i < 4; i++)
        CHECK(!cl_sends(k[i], "GET /hello HTTP/1.1\r\n\r\n") && cl_read(k[i], 0, 5000) == 200, "reuse %d", i);
    for (int i = 0; i < STREAMS; i++)
        cl_close(k[i]);
    for (int i = 0; i < 100 && atomic_load(&active_streams) > 0; i++)
        sleep_ms(10);
    CHECK(atomic_load(&active_streams) == 0, "%d still active", atomic_load(&active_streams));
}

static void http10_stream_closes_at_the_end(void)
{
    cl *k = cl_open(SA.port);
    atomic_store(&gate, 1);
    CHECK(!cl_sends(k, "GET /sse?n=3 HTTP/1.0\r\n\r\n"), "send");
    int st = cl_read(k, 0, 5000);
    CHECK(st == 200 && !strcmp(k->body, "data: 0\n\ndata: 1\n\ndata: 2\n\n") && k->eof, "%d %.300s", st, k->body);
    CHECK(hdr(k, "connection: close") && !hdr(k, "transfer-encoding"), "%.300s", k->hdrs);
    cl_close(k);
}

static void client_leaving_fires_on_close(void)
{
    int before = atomic_load(&n_on_close), eio = atomic_load(&n_eio_after_close);
    cl *k = cl_open(SA.port);
    CHECK(!cl_sends(k, "GET /forever HTTP/1.1\r\n\r\n"), "send");
    cl_reset(k, 0);
    double end = clock_now_s() + 5;
    while (!(k->body && strstr(k->body, "data: 3\n\n")) && clock_now_s() < end && cl_pump(k, 100) >= 0)
        cl_parse(k);
    CHECK(k->body && strstr(k->body, "data: 3\n\n"), "no events");
    cl_close(k);
    CHECK(wait_atomic_at_least(&n_on_close, before + 1, 5000), "on_close did not run for a stream");
    CHECK(wait_atomic_at_least(&n_eio_after_close, eio + 1, 5000), "a send after on_close did not return RD_EIO");
    /* A client that leaves while its (non-streamed) answer is pending. */
    k = cl_open(SA.port);
    CHECK(!cl_sends(k, "GET /later HTTP/1.1\r\n\r\n"), "send");
    sleep_ms(5);
    cl_close(k);
    CHECK(wait_atomic_at_least(&n_on_close, before + 2, 5000), "on_close did not run for a pending answer");
    CHECK(wait_atomic_at_least(&n_eio_after_close, eio + 2, 5000), "http_respond after on_close");
    CHECK(get_once(SA.port, "/hello", NULL) == 200, "still serving");
}

static void slow_reader_is_cut_at_the_queue_bound(void)
{
    int before = atomic_load(&n_on_close);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    int small = 4096;
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &small, sizeof small);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)SA.port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    CHECK(!connect(fd, (struct sockaddr *)&a, sizeof a), "connect");
    static const char req[] = "GET /flood HTTP/1.1\r\n\r\n";
    CHECK(send(fd, req, sizeof req - 1, 0) == (ssize_t)(sizeof req - 1), "send");
    /* Never read: the server must give up on this client rather than queue without bound. */
    CHECK(wait_atomic_at_least(&n_ebusy, 1, 20000), "no RD_EBUSY from a stalled reader");
    CHECK(wait_atomic_at_least(&n_on_close, before + 1, 5000), "on_close did not follow the cut");
    close(fd);
    CHECK(get_once(SA.port, "/hello", NULL) == 200, "still serving");
}

static void bearer_auth(void)
{
    cl *k = cl_open(SC.port);
    CHECK(k, "connect");
    const struct {
        const char *req;
        int status;
    } cases[] = {
        {"GET /hello HTTP/1.1\r\n\r\n", 401},
        {"GET /hello HTTP/1.1\r\nAuthorization: Bearer wrong\r\n\r\n", 401},
        {"GET /hello HTTP/1.1\r\nAuthorization: Bearer s3cret\r\n\r\n", 401},
        {"GET /hello HTTP/1.1\r\nAuthorization: Bearer s3cret-keyX\r\n\r\n", 401},
        {"GET /hello HTTP/1.1\r\nAuthorization: Basic s3cret-key\r\n\r\n", 401},
        {"GET /hello HTTP/1.1\r\nAuthorization: Bearer s3cret-key\r\n\r\n", 200},
        {"GET /hello HTTP/1.1\r\nAuthorization: bearer  s3cret-key \r\n\r\n", 200},
        {"GET /open HTTP/1.1\r\n\r\n", 200},
        {"GET /nope HTTP/1.1\r\n\r\n", 401},
        {"GET /nope HTTP/1.1\r\nAuthorization: Bearer s3cret-key\r\n\r\n", 404},
        {"POST /hello HTTP/1.1\r\nContent-Length: 0\r\n\r\n", 401},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        CHECK(!cl_sends(k, cases[i].req), "send");
        int st = cl_read(k, 0, 5000);
        CHECK(st == cases[i].status, "case %zu: %d, expected %d", i, st, cases[i].status);
        if (st == 401)
            CHECK(hdr(k, "www-authenticate: Bearer") && strstr(k->body, "\"error\":\"unauthorized\""), "%.150s %.150s",
                  k->hdrs, k->body);
    }
    cl_close(k);
    /* A body without the key is refused before it is read, and the connection closed. */
    k = cl_open(SC.port);
    CHECK(!cl_sends(k, "POST /echo HTTP/1.1\r\nContent-Length: 1000000\r\n\r\n"), "send");
    CHECK(cl_read(k, 0, 5000) == 401 && hdr(k, "www-authenticate: Bearer") && hdr(k, "connection: close"), "%d %.200s",
          k->status, k->hdrs);
    CHECK(cl_closed_within(k, 5000), "left open after an early 401");
    cl_close(k);
    k = cl_open(SC.port);
    CHECK(!cl_sends(k, "POST /echo HTTP/1.1\r\nAuthorization: Bearer s3cret-key\r\nContent-Length: 4\r\n\r\nbody"), "send");
    CHECK(cl_read(k, 0, 5000) == 200 && !strcmp(k->body, "body"), "%d", k->status);
    cl_close(k);
}

static void bind_rule_and_addresses(void)
{
    uv_loop_t l;
    uv_loop_init(&l);
    static http_server s;
    http_config c = base_config();
    c.listen = "0.0.0.0:0";
    int rc = http_start(&s, &l, &c, ROUTES, N_ROUTES);
    CHECK(rc == RD_EINVAL && strstr(rd_errmsg(), "api_key_file") && strstr(rd_errmsg(), "http_insecure"), "%d %.300s",
          rc, rd_errmsg());
    c.insecure = 1;
    CHECK_OK(http_start(&s, &l, &c, ROUTES, N_ROUTES));
    CHECK(!s.loopback && s.port > 0, "%d %d", s.loopback, s.port);
    http_stop(&s);
    uv_run(&l, UV_RUN_DEFAULT);
    c.insecure = 0;
    c.api_key = "k";
    CHECK_OK(http_start(&s, &l, &c, ROUTES, N_ROUTES));
    http_stop(&s);
    uv_run(&l, UV_RUN_DEFAULT);
    c.api_key = NULL;
    const char *loop_ok[] = {"127.0.0.1:0", "127.1.2.3:0"};
    for (int i = 0; i < 2; i++) {
        c.listen = loop_ok[i];
        CHECK_OK(http_start(&s, &l, &c, ROUTES, N_ROUTES));
        CHECK(s.loopback, "%.300s", loop_ok[i]);
        http_stop(&s);
        uv_run(&l, UV_RUN_DEFAULT);
    }
    c.listen = "[::1]:0"; /* IPv6 loopback, where the host has it */
    rc = http_start(&s, &l, &c, ROUTES, N_ROUTES);
    CHECK(rc == 0 || rc == RD_EIO, "%d %.300s", rc, rd_errmsg());
    if (rc == 0) {
        CHECK(s.loopback, "::1");
        http_stop(&s);
    }
    uv_run(&l, UV_RUN_DEFAULT);
    const char *bad[] = {"localhost:7071", "127.0.0.1", "127.0.0.1:x", "127.0.0.1:70000", ":80"};
    for (int i = 0; i < 5; i++) {
        c.listen = bad[i];
        CHECK(http_start(&s, &l, &c, ROUTES, N_ROUTES) == RD_EINVAL, "%.300s accepted", bad[i]);
    }
    CHECK(uv_loop_close(&l) == 0, "handles left open");
}

static void key_file_rules(void)
{
    char path[64];
    snprintf(path, sizeof path, "/tmp/test_http_key.%d", (int)getpid());
    char key[HTTP_MAX_KEY + 1];
    size_t n;
    const struct {
        const char *text;
        int rc;
        const char *key;
    } cases[] = {
        {"  abc-123_=\n", 0, "abc-123_="}, {"", RD_EINVAL, NULL}, {"\n \n", RD_EINVAL, NULL},
        {"a b\n", RD_EINVAL, NULL},       {"k\x01y", RD_EINVAL, NULL},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        FILE *f = fopen(path, "w");
        CHECK(f, "write %.300s", path);
        fputs(cases[i].text, f);
        fclose(f);
        chmod(path, 0600);
        int rc = http_read_key(path, key, &n);
        CHECK(rc == cases[i].rc, "case %zu: %d (%.300s)", i, rc, rd_errmsg());
        if (!rc)
            CHECK(!strcmp(key, cases[i].key) && n == strlen(cases[i].key), "%.300s", key);
        else
            CHECK(strstr(rd_errmsg(), "api_key_file"), "%.300s", rd_errmsg());
    }
    remove(path);
    CHECK(http_read_key("/nonexistent/key", key, &n) == RD_EIO && strstr(rd_errmsg(), "/nonexistent/key"), "%.300s",
          rd_errmsg());
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    alarm(600); /* a hang fails the run instead of stalling it */
    RUN(bind_rule_and_addresses);
    RUN(key_file_rules);
    int rc = start_servers();
    if (rc) {
        printf("FAIL start_servers: %.300s\n", rd_errmsg());
        return 1;
    }
    RUN(keep_alive_http10_and_close);
    RUN(pipelined_requests_answered_in_order);
    RUN(bodies_by_length_and_chunked);
    RUN(limits_answer_413_414_431_400);
    RUN(routing_404_405_head_query_500);
    RUN(route_api_refuses_misuse);
    RUN(slowloris_is_evicted_and_timed_out);
    RUN(idle_keep_alive_is_closed);
    RUN(streams_256_at_once);
    RUN(http10_stream_closes_at_the_end);
    RUN(client_leaving_fires_on_close);
    RUN(slow_reader_is_cut_at_the_queue_bound);
    RUN(bearer_auth);
    uv_async_send(&stop_async);
    pthread_join(loop_thread, NULL);
    if (uv_loop_close(&L)) {
        printf("FAIL loop_closes: handles left open after http_stop\n");
        test_failed_cases++;
    } else {
        printf("PASS loop_closes\n");
    }
    TEST_EXIT();
}
