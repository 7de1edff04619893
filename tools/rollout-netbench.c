/* rollout-netbench - the loopback baselines a weight push is compared with.
 *
 *   build/rollout-netbench [--bytes N] [--chunk-mb M] [--window W] [--json]
 *
 * Measures, in one run: (1) raw TCP: one connection on 127.0.0.1, a sender
 * thread write()s N bytes in chunk-sized writes and a receiver thread read()s
 * them into a buffer; (2) NNG req/rep: W contexts each sending chunk-sized
 * requests to a rep socket that answers each with 8 bytes (the shape of the
 * weight-update protocol without the checksums and staging); (3) CRC-32C of
 * the same bytes on one core. Prints MB/s for each (and JSON with --json). */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <nng/nng.h>
#include <nng/protocol/reqrep0/rep.h>
#include <nng/protocol/reqrep0/req.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "base/clock.h"
#include "base/crc32c.h"
#include "tools/cli.h"

static const char *P = "rollout-netbench";

/* ---- raw TCP ---- */

typedef struct {
    int fd;
    uint64_t bytes;
    size_t chunk;
} tcp_arg;

static void *tcp_recv(void *arg)
{
    tcp_arg *a = arg;
    uint8_t *buf = malloc(a->chunk);
    uint64_t got = 0;
    while (buf && got < a->bytes) {
        ssize_t n = read(a->fd, buf, a->chunk);
        if (n <= 0)
            break;
        got += (uint64_t)n;
    }
    free(buf);
    a->bytes = got;
    return NULL;
}

static double bench_tcp(uint64_t bytes, size_t chunk)
{
    int ls = socket(AF_INET, SOCK_STREAM, 0), one = 1;
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t sl = sizeof sa;
    setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(ls, (struct sockaddr *)&sa, sizeof sa) || listen(ls, 1) || getsockname(ls, (struct sockaddr *)&sa, &sl))
        cli_die(P, "cannot listen on loopback%s%s", "", "");
    int cs = socket(AF_INET, SOCK_STREAM, 0);
    if (connect(cs, (struct sockaddr *)&sa, sizeof sa))
        cli_die(P, "cannot connect on loopback%s%s", "", "");
    int as = accept(ls, NULL, NULL);
    setsockopt(cs, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    tcp_arg a = {.fd = as, .bytes = bytes, .chunk = chunk};
    uint8_t *buf = malloc(chunk);
    memset(buf, 0x5a, chunk);
    pthread_t th;
    double t0 = clock_now_s();
    pthread_create(&th, NULL, tcp_recv, &a);
    for (uint64_t sent = 0; sent < bytes;) {
        size_t n = bytes - sent < chunk ? (size_t)(bytes - sent) : chunk;
        ssize_t w = write(cs, buf, n);
        if (w <= 0)
            break;
        sent += (uint64_t)w;
    }
    pthread_join(th, NULL);
    double dt = clock_now_s() - t0;
    close(cs);
    close(as);
    close(ls);
    free(buf);
    return (double)a.bytes / 1e6 / dt;
}

/* ---- NNG req/rep ---- */

typedef struct {
    nng_socket rep;
    atomic_int stop;
} rep_arg;

static void *rep_main(void *arg)
{
    rep_arg *a = arg;
    for (;;) {
        nng_msg *m;
        if (nng_recvmsg(a->rep, &m, 0))
            break;
        nng_msg_realloc(m, 8);
        if (nng_sendmsg(a->rep, m, 0)) {
            nng_msg_free(m);
            break;
        }
    }
    return NULL;
}

typedef struct {
    nng_socket req;
    const uint8_t *data;
    size_t chunk;
    atomic_long *left;          /* chunks still to send */
} req_arg;

static void *req_main(void *arg)
{
    req_arg *a = arg;
    nng_ctx ctx;
    nng_ctx_open(&ctx, a->req);
    nng_aio *aio;
    nng_aio_alloc(&aio, NULL, NULL);
    while (atomic_fetch_sub(a->left, 1) > 0) {
        nng_msg *m;
        nng_msg_alloc(&m, 0);
        nng_msg_append(m, a->data, a->chunk); /* the client copies once, as rd_push does */
        nng_aio_set_msg(aio, m);
        nng_ctx_send(ctx, aio);
        nng_aio_wait(aio);
        if (nng_aio_result(aio)) {
            nng_msg_free(m);
            break;
        }
        nng_ctx_recv(ctx, aio);
        nng_aio_wait(aio);
        if (nng_aio_result(aio))
            break;
        nng_msg_free(nng_aio_get_msg(aio));
    }
    nng_aio_free(aio);
    nng_ctx_close(ctx);
    return NULL;
}

static double bench_nng(uint64_t bytes, size_t chunk, int window)
{
    const char *url = "tcp://127.0.0.1:17999";
    rep_arg ra = {0};
    nng_socket req;
    if (nng_rep0_open(&ra.rep) || nng_socket_set_size(ra.rep, NNG_OPT_RECVMAXSZ, chunk + 1024) ||
        nng_listen(ra.rep, url, NULL, 0) || nng_req0_open(&req) ||
        nng_socket_set_ms(req, NNG_OPT_REQ_RESENDTIME, NNG_DURATION_INFINITE) || nng_dial(req, url, NULL, 0))
        cli_die(P, "cannot set up NNG on %s%s", url, "");
    /* rep0 without contexts serves one request at a time per socket: use
     * `window` raw threads on the socket's default context. */
    pthread_t rt[64], qt[64];
    int nr = window < 64 ? window : 64;
    for (int i = 0; i < 1; i++)
        pthread_create(&rt[i], NULL, rep_main, &ra);
    uint8_t *data = malloc(chunk);
    memset(data, 0xa5, chunk);
    atomic_long left = (long)((bytes + chunk - 1) / chunk);
    long total_chunks = left;
    req_arg qa = {.req = req, .data = data, .chunk = chunk, .left = &left};
    double t0 = clock_now_s();
    for (int i = 0; i < nr; i++)
        pthread_create(&qt[i], NULL, req_main, &qa);
    for (int i = 0; i < nr; i++)
        pthread_join(qt[i], NULL);
    double dt = clock_now_s() - t0;
    nng_close(req);
    nng_close(ra.rep);
    pthread_join(rt[0], NULL);
    free(data);
    return (double)total_chunks * (double)chunk / 1e6 / dt;
}

static double bench_crc(uint64_t bytes, size_t chunk)
{
    uint8_t *buf = malloc(chunk);
    for (size_t i = 0; i < chunk; i++)
        buf[i] = (uint8_t)(i * 131u);
    uint32_t crc = 0;
    double t0 = clock_now_s();
    for (uint64_t done = 0; done < bytes; done += chunk)
        crc = crc32c(crc, buf, chunk);
    double dt = clock_now_s() - t0;
    free(buf);
    if (crc == 0x12345678)
        fputc(' ', stderr); /* keeps the loop from being optimised away */
    return (double)bytes / 1e6 / dt;
}

int main(int argc, char **argv)
{
    uint64_t bytes = 538060032; /* the default model as f32 HF tensors */
    size_t chunk = 16u << 20;
    int window = 4, json = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--bytes")) bytes = (uint64_t)cli_int(P, a, cli_value(P, argc, argv, &i), 1 << 20, 1ll << 40);
        else if (!strcmp(a, "--chunk-mb")) chunk = (size_t)cli_int(P, a, cli_value(P, argc, argv, &i), 1, 1024) << 20;
        else if (!strcmp(a, "--window")) window = (int)cli_int(P, a, cli_value(P, argc, argv, &i), 1, 64);
        else if (!strcmp(a, "--json")) json = 1;
        else cli_die(P, "unknown flag '%s'%s; expected --bytes, --chunk-mb, --window or --json", a, "");
    }
    double tcp = bench_tcp(bytes, chunk);
    double nng = bench_nng(bytes, chunk, window);
    double crc = bench_crc(bytes, chunk);
    if (json)
        printf("{\"bytes\":%llu,\"chunk_bytes\":%zu,\"window\":%d,\"raw_tcp_mb_per_s\":%.1f,"
               "\"nng_reqrep_mb_per_s\":%.1f,\"crc32c_mb_per_s\":%.1f}\n",
               (unsigned long long)bytes, chunk, window, tcp, nng, crc);
    else
        printf("loopback, %llu bytes in %zu-byte chunks:\n  raw TCP          %8.1f MB/s\n"
               "  NNG req/rep (w%d) %7.1f MB/s\n  CRC-32C 1 core   %8.1f MB/s\n",
               (unsigned long long)bytes, chunk, tcp, window, nng, crc);
    return 0;
}
