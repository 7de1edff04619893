/* rd_client.c - the C client of the learner protocol: one req0 socket, one
 * context and one aio per client; every exchange is encode, send, receive
 * with a timeout, decode, and an ERROR reply turned into RDC_EDAEMON. */
#include "client/rd_client.h"

#include <nng/nng.h>
#include <nng/protocol/reqrep0/req.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "base/err.h"
#include "proto/auth.h"
#include "proto/tls.h"

/* NNG's TCP framing counts the req0 header (a 4-byte request id) in the
 * message, so RECVMAXSZ is the frame limit plus a little. */
#define RDC_SP_HEADER_MARGIN 64

struct rdc_client {
    nng_socket sock;
    nng_dialer dialer;
    nng_ctx ctx;                /* one request outstanding at a time */
    nng_aio *aio;               /* no callback: waited on */
    proto_buf buf;              /* encode buffer, reused */
    proto_msg hello;            /* the last HELLO_OK (owns its strings) */
    int have_hello;
    uint64_t client_id;         /* 0 before HELLO */
    uint64_t next_req_id;       /* the next client_req_id to hand out */
    uint64_t last_seq;          /* highest result seq processed (acked by the next FETCH) */
    uint64_t max_msg;           /* bytes: decode limit (64 MiB until HELLO_OK) */
    uint32_t err_code;          /* PROTO_E_* of the last ERROR reply, else 0 */
    char secret[PROTO_AUTH_MAX_SECRET + 1]; /* the shared secret (PROTOCOL.md §14) */
    size_t secret_len;          /* 0: the daemon is not asked to authenticate us */
};

static int nng_fail(int rv, const char *what)
{
    if (rv == NNG_ETIMEDOUT)
        return rd_fail(RDC_ETIMEDOUT, "%s: no reply in time (the request is safe to repeat)", what);
    return rd_fail(RD_EIO, "%s: %s", what, nng_strerror(rv));
}

/* tls+tcp://: verify the daemon against $ROLLOUTD_TLS_CA_FILE (proto/tls.h). */
static int set_tls(nng_dialer dialer, const char *url)
{
    nng_tls_config *cfg;
    int rc = proto_tls_client(url, getenv("ROLLOUTD_TLS_CA_FILE"), &cfg);
    if (rc)
        return rc;
    int rv = nng_dialer_set_ptr(dialer, NNG_OPT_TLS_CONFIG, cfg);
    nng_tls_config_free(cfg); /* the dialer holds its own reference */
    return rv ? nng_fail(rv, "cannot set the TLS configuration") : 0;
}

int rdc_open(const char *url, rdc_client **out)
{
    *out = NULL;
    if (!url || !*url)
        return rd_fail(RD_EINVAL, "rdc_open: empty URL; expected e.g. %s", RDC_DEFAULT_URL);
    rdc_client *c = calloc(1, sizeof *c);
    if (!c)
        return rd_fail(RD_ENOMEM, "rdc_open: out of memory");
    c->next_req_id = 1;
    c->max_msg = PROTO_DEFAULT_MAX_MESSAGE;
    proto_buf_init(&c->buf);
    int rv = nng_req0_open(&c->sock);
    if (rv) {
        free(c);
        return nng_fail(rv, "cannot open a req0 socket");
    }
    int rc = 0;
    if ((rv = nng_socket_set_ms(c->sock, NNG_OPT_REQ_RESENDTIME, NNG_DURATION_INFINITE)))
        rc = nng_fail(rv, "cannot disable req resends");
    else if ((rv = nng_dialer_create(&c->dialer, c->sock, url)))
        rc = rd_fail(RD_EINVAL, "cannot dial '%s': %s (expected e.g. %s)", url, nng_strerror(rv), RDC_DEFAULT_URL);
    else if ((rv = nng_dialer_set_size(c->dialer, NNG_OPT_RECVMAXSZ, PROTO_DEFAULT_MAX_MESSAGE + RDC_SP_HEADER_MARGIN)))
        rc = nng_fail(rv, "cannot set the receive limit");
    else if (proto_tls_url(url) && (rc = set_tls(c->dialer, url)))
        ;
    else if ((rv = nng_dialer_start(c->dialer, 0)))
        rc = rd_fail(RD_EIO, "cannot connect to %s: %s (is rolloutd running there?)", url, nng_strerror(rv));
    else if ((rv = nng_ctx_open(&c->ctx, c->sock)))
        rc = nng_fail(rv, "cannot open a req0 context");
    else if ((rv = nng_ctx_set_ms(c->ctx, NNG_OPT_REQ_RESENDTIME, NNG_DURATION_INFINITE)))
        rc = nng_fail(rv, "cannot disable req resends on the context");
    else if ((rv = nng_aio_alloc(&c->aio, NULL, NULL)))
        rc = nng_fail(rv, "cannot allocate an aio");
    if (!rc && !(rc = rdc_auth_secret(NULL, c->secret, &c->secret_len)) && c->secret_len)
        rc = rdc_auth(c);
    if (rc) {
        if (c->aio)
            nng_aio_free(c->aio);
        nng_close(c->sock);
        proto_buf_free(&c->buf);
        memset(c->secret, 0, sizeof c->secret);
        free(c);
        return rc;
    }
    *out = c;
    return 0;
}

int rdc_auth_secret(const char *path, char *secret, size_t *len)
{
    *len = 0;
    const char *tok = path ? NULL : getenv("ROLLOUTD_AUTH_TOKEN");
    if (tok && *tok) {
        size_t n = strlen(tok);
        if (n > PROTO_AUTH_MAX_SECRET)
            return rd_fail(RD_EINVAL, "ROLLOUTD_AUTH_TOKEN is %zu bytes; at most %d", n, PROTO_AUTH_MAX_SECRET);
        memcpy(secret, tok, n + 1);
        *len = n;
        return 0;
    }
    if (!path)
        path = getenv("ROLLOUTD_AUTH_TOKEN_FILE");
    if (!path || !*path)
        return 0;
    return proto_auth_read_secret(path, secret, len);
}

static int exchange(rdc_client *c, const proto_msg *req, uint16_t want, int timeout_ms, proto_msg *reply);

int rdc_lane_auth(rdc_client *c, int fd, uint64_t xfer_id)
{
    if (c->secret_len == 0)
        return 0;
    uint8_t in[PROTO_HEADER_BYTES + PROTO_AUTH_BYTES];
    for (size_t got = 0; got < sizeof in;) {
        ssize_t n = read(fd, in + got, sizeof in - got);
        if (n <= 0)
            return rd_fail(RD_EIO, "data lane: the daemon closed the connection before its challenge");
        got += (size_t)n;
    }
    proto_msg m;
    if (proto_decode(in, sizeof in, 0, &m) || m.type != PROTO_AUTH_CHALLENGE) {
        proto_msg_free(&m);
        return rd_fail(RD_EFORMAT, "data lane: expected an AUTH_CHALLENGE first");
    }
    proto_msg a = {.type = PROTO_LANE_AUTH};
    a.lane_auth.xfer_id = xfer_id;
    uint8_t key[PROTO_AUTH_BYTES];
    int rc = proto_auth_lane_key((const uint8_t *)c->secret, c->secret_len, xfer_id, key);
    if (!rc)
        rc = proto_auth_lane_proof(key, m.auth.bytes, xfer_id, a.lane_auth.proof);
    proto_msg_free(&m);
    proto_buf b;
    proto_buf_init(&b);
    if (!rc)
        rc = proto_encode(&b, &a);
    for (size_t off = 0; !rc && off < b.len;) {
        ssize_t n = send(fd, b.data + off, b.len - off, MSG_NOSIGNAL); /* a closed lane is an error, not SIGPIPE */
        if (n <= 0)
            rc = rd_fail(RD_EIO, "data lane: cannot send LANE_AUTH");
        else
            off += (size_t)n;
    }
    proto_buf_free(&b);
    return rc;
}

const char *rdc_secret(const rdc_client *c, size_t *len)
{
    *len = c->secret_len;
    return c->secret;
}

int rdc_set_secret(rdc_client *c, const char *secret, size_t len)
{
    if (!secret || len < 1 || len > PROTO_AUTH_MAX_SECRET)
        return rd_fail(RD_EINVAL, "rdc_set_secret: a secret of %zu bytes; expected 1..%d", len, PROTO_AUTH_MAX_SECRET);
    memcpy(c->secret, secret, len);
    c->secret[len] = 0;
    c->secret_len = len;
    return 0;
}

int rdc_auth(rdc_client *c)
{
    if (!c->secret_len)
        return rd_fail(RD_EINVAL, "rdc_auth: no shared secret (ROLLOUTD_AUTH_TOKEN or ROLLOUTD_AUTH_TOKEN_FILE)");
    proto_msg m = {.type = PROTO_AUTH_BEGIN}, r;
    uint8_t cn[PROTO_AUTH_BYTES], dn[PROTO_AUTH_BYTES], want[PROTO_AUTH_BYTES];
    int rc = proto_auth_nonce(cn);
    if (rc)
        return rc;
    memcpy(m.auth.bytes, cn, PROTO_AUTH_BYTES);
    if ((rc = exchange(c, &m, PROTO_AUTH_CHALLENGE, RDC_TIMEOUT_MS, &r)))
        return rc;
    memcpy(dn, r.auth.bytes, PROTO_AUTH_BYTES);
    proto_msg_free(&r);
    m.type = PROTO_AUTH;
    if ((rc = proto_auth_proof((const uint8_t *)c->secret, c->secret_len, 0, cn, dn, m.auth.bytes)) ||
        (rc = exchange(c, &m, PROTO_AUTH_OK, RDC_TIMEOUT_MS, &r)))
        return rc;
    int same = !proto_auth_proof((const uint8_t *)c->secret, c->secret_len, 1, cn, dn, want) &&
               proto_auth_equal(want, r.auth.bytes);
    proto_msg_free(&r);
    return same ? 0 : rd_fail(RDC_EDAEMON, "AUTH: the daemon's proof is not of our secret (a different daemon?)");
}

void rdc_close(rdc_client *c)
{
    if (!c)
        return;
    if (c->aio)
        nng_aio_free(c->aio);
    nng_close(c->sock);
    proto_msg_free(&c->hello);
    proto_buf_free(&c->buf);
    free(c);
}

/* One exchange on a context: encode req into buf, send, wait timeout_ms for
 * the reply, decode it into reply (type must be want, an ERROR becomes
 * RDC_EDAEMON with *err_code set). */
static int exchange_on(nng_ctx ctx, nng_aio *aio, proto_buf *buf, uint64_t max_msg, uint32_t *err_code,
                       const proto_msg *req, uint16_t want, int timeout_ms, proto_msg *reply)
{
    const char *name = proto_type_name(req->type);
    memset(reply, 0, sizeof *reply);
    *err_code = 0;
    proto_buf_reset(buf);
    int rc = proto_encode(buf, req);
    if (rc)
        return rc;
    if (buf->len > max_msg)
        return rd_fail(RD_ERANGE, "%s is %zu bytes; the daemon accepts at most %llu", name, buf->len,
                       (unsigned long long)max_msg);
    nng_msg *m;
    int rv = nng_msg_alloc(&m, 0);
    if (rv || (rv = nng_msg_append(m, buf->data, buf->len))) {
        if (!rv)
            nng_msg_free(m);
        return rd_fail(RD_ENOMEM, "%s: cannot build the message: %s", name, nng_strerror(rv));
    }
    /* The send waits for a connection when there is none (a daemon that died or restarts): no
     * longer than the whole call may take, so a poll of a dead daemon (rd_chain.c: 3 s) fails
     * in its own time, not after RDC_TIMEOUT_MS. */
    nng_aio_set_msg(aio, m);
    nng_aio_set_timeout(aio, timeout_ms < RDC_TIMEOUT_MS ? timeout_ms : RDC_TIMEOUT_MS);
    nng_ctx_send(ctx, aio);
    nng_aio_wait(aio);
    if ((rv = nng_aio_result(aio))) {
        nng_msg_free(nng_aio_get_msg(aio));
        return nng_fail(rv, name);
    }
    nng_aio_set_timeout(aio, timeout_ms);
    nng_ctx_recv(ctx, aio);
    nng_aio_wait(aio);
    if ((rv = nng_aio_result(aio)))
        return nng_fail(rv, name);
    m = nng_aio_get_msg(aio);
    rc = proto_decode(nng_msg_body(m), nng_msg_len(m), max_msg, reply);
    nng_msg_free(m);
    if (rc)
        return rd_fail(RD_EFORMAT, "the reply to %s does not decode: %s", name, rd_errmsg());
    if (reply->type == PROTO_ERROR) {
        *err_code = reply->error.code;
        rc = rd_fail(RDC_EDAEMON, "daemon error %s (%u) to %s: %s", proto_err_name(reply->error.code),
                     reply->error.code, name, reply->error.message.ptr ? reply->error.message.ptr : "");
        proto_msg_free(reply);
        return rc;
    }
    if (reply->type != want) {
        rc = rd_fail(RD_EFORMAT, "the daemon answered %s with %s; expected %s", name,
                     proto_type_name(reply->type) ? proto_type_name(reply->type) : "an unknown type",
                     proto_type_name(want));
        proto_msg_free(reply);
        return rc;
    }
    return 0;
}

static int exchange(rdc_client *c, const proto_msg *req, uint16_t want, int timeout_ms, proto_msg *reply)
{
    int rc = exchange_on(c->ctx, c->aio, &c->buf, c->max_msg, &c->err_code, req, want, timeout_ms, reply);
    /* A new connection (NNG redialed) has to prove the secret again; then the
     * request is repeated, which is always safe (PROTOCOL.md §8). */
    if (rc == RDC_EDAEMON && c->err_code == PROTO_E_UNAUTHORIZED && c->secret_len && req->type != PROTO_AUTH &&
        req->type != PROTO_AUTH_BEGIN && !rdc_auth(c))
        rc = exchange_on(c->ctx, c->aio, &c->buf, c->max_msg, &c->err_code, req, want, timeout_ms, reply);
    return rc;
}

int rdc_call(rdc_client *c, const proto_msg *req, uint16_t want, int timeout_ms, proto_msg *reply)
{
    return exchange(c, req, want, timeout_ms, reply);
}

struct rdc_stream {
    rdc_client *c;
    nng_ctx ctx;
    nng_aio *aio;
    proto_buf buf;
    uint32_t err_code;
};

int rdc_stream_open(rdc_client *c, rdc_stream **out)
{
    *out = NULL;
    rdc_stream *s = calloc(1, sizeof *s);
    if (!s)
        return rd_fail(RD_ENOMEM, "rdc_stream_open: out of memory");
    s->c = c;
    proto_buf_init(&s->buf);
    int rv = nng_ctx_open(&s->ctx, c->sock);
    if (!rv && !(rv = nng_ctx_set_ms(s->ctx, NNG_OPT_REQ_RESENDTIME, NNG_DURATION_INFINITE)))
        rv = nng_aio_alloc(&s->aio, NULL, NULL);
    if (rv) {
        rdc_stream_close(s);
        return nng_fail(rv, "cannot open a req0 context");
    }
    *out = s;
    return 0;
}

int rdc_stream_call(rdc_stream *s, const proto_msg *req, uint16_t want, int timeout_ms, proto_msg *reply)
{
    return exchange_on(s->ctx, s->aio, &s->buf, s->c->max_msg, &s->err_code, req, want, timeout_ms, reply);
}

uint32_t rdc_stream_error_code(const rdc_stream *s) { return s->err_code; }

void rdc_stream_close(rdc_stream *s)
{
    if (!s)
        return;
    if (s->aio)
        nng_aio_free(s->aio);
    nng_ctx_close(s->ctx);
    proto_buf_free(&s->buf);
    free(s);
}

int rdc_hello(rdc_client *c, uint64_t client_id, const char *client_name)
{
    proto_msg q = {.type = PROTO_HELLO};
    q.hello.client_id = client_id;
    /* Version 1: this client asks for no routes (version 2's one addition),
     * so it speaks what every daemon does, and its frames stay version 1. */
    q.hello.min_version = PROTO_VERSION_MIN;
    q.hello.max_version = PROTO_VERSION_MIN;
    q.hello.client_name.ptr = client_name;
    q.hello.client_name.len = client_name ? (uint32_t)strlen(client_name) : 0;
    proto_msg r;
    int rc = exchange(c, &q, PROTO_HELLO_OK, RDC_TIMEOUT_MS, &r);
    if (rc)
        return rc;
    proto_msg_free(&c->hello);
    c->hello = r;
    c->have_hello = 1;
    if (r.hello_ok.client_id != client_id) {
        /* A new identity: sequence numbers start over. */
        c->last_seq = 0;
        c->next_req_id = 1;
    }
    c->client_id = r.hello_ok.client_id;
    uint64_t lim = r.hello_ok.max_message_bytes;
    if (lim > PROTO_DEFAULT_MAX_MESSAGE) /* later connections may carry bigger replies */
        nng_dialer_set_size(c->dialer, NNG_OPT_RECVMAXSZ, (size_t)lim + RDC_SP_HEADER_MARGIN);
    if (lim >= PROTO_HEADER_BYTES)
        c->max_msg = lim;
    return 0;
}

const proto_hello_ok *rdc_info(const rdc_client *c) { return c->have_hello ? &c->hello.hello_ok : NULL; }
uint64_t rdc_client_id(const rdc_client *c) { return c->client_id; }
uint64_t rdc_next_req_id(rdc_client *c) { return c->next_req_id++; }
uint64_t rdc_last_seq(const rdc_client *c) { return c->last_seq; }
void rdc_set_last_seq(rdc_client *c, uint64_t seq) { c->last_seq = seq; }
uint32_t rdc_error_code(const rdc_client *c) { return c->err_code; }

const char *rdc_strerror(int rc)
{
    if (rc == RDC_EDAEMON)
        return "daemon error";
    if (rc == RDC_ETIMEDOUT)
        return "timed out";
    return rd_strerror(rc);
}

int rdc_submit(rdc_client *c, const proto_request *reqs, uint32_t n, proto_msg *reply)
{
    proto_msg q = {.type = PROTO_SUBMIT};
    q.submit.client_id = c->client_id;
    q.submit.n_requests = n;
    q.submit.requests = reqs;
    int rc = exchange(c, &q, PROTO_SUBMIT_OK, RDC_TIMEOUT_MS, reply);
    if (rc)
        return rc;
    if (reply->submit_ok.n_items != n) {
        proto_msg_free(reply);
        return rd_fail(RD_EFORMAT, "SUBMIT_OK has %u items for %u requests; expected one per request",
                       reply->submit_ok.n_items, n);
    }
    return 0;
}

int rdc_fetch(rdc_client *c, uint32_t max_results, uint32_t wait_ms, proto_msg *reply)
{
    proto_msg q = {.type = PROTO_FETCH};
    q.fetch.client_id = c->client_id;
    q.fetch.ack_seq = c->last_seq;
    q.fetch.max_results = max_results;
    q.fetch.wait_ms = wait_ms;
    q.fetch.max_bytes = 0;
    return exchange(c, &q, PROTO_RESULTS, (int)wait_ms + RDC_FETCH_MARGIN_MS, reply);
}

int rdc_fetch_new(rdc_client *c, uint32_t max_results, uint32_t wait_ms, proto_msg *reply, uint32_t *first)
{
    int rc = rdc_fetch(c, max_results, wait_ms, reply);
    if (rc)
        return rc;
    const proto_results *rs = &reply->results;
    uint32_t i = 0;
    while (i < rs->n_results && rs->results[i].seq <= c->last_seq)
        i++;
    *first = i;
    if (rs->n_results > 0 && rs->results[rs->n_results - 1].seq > c->last_seq)
        c->last_seq = rs->results[rs->n_results - 1].seq;
    return 0;
}

int rdc_abort(rdc_client *c, uint64_t client_req_id, int all, proto_abort_ok *out)
{
    proto_msg q = {.type = PROTO_ABORT};
    q.abort_req.client_id = c->client_id;
    q.abort_req.client_req_id = all ? 0 : client_req_id;
    q.abort_req.flags = all ? PROTO_ABORT_ALL : 0;
    proto_msg r;
    int rc = exchange(c, &q, PROTO_ABORT_OK, RDC_TIMEOUT_MS, &r);
    if (rc)
        return rc;
    if (out)
        *out = r.abort_ok;
    proto_msg_free(&r);
    return 0;
}

int rdc_status(rdc_client *c, char **json)
{
    *json = NULL;
    proto_msg q = {.type = PROTO_STATUS};
    proto_msg r;
    int rc = exchange(c, &q, PROTO_STATUS_OK, RDC_TIMEOUT_MS, &r);
    if (rc)
        return rc;
    char *s = malloc((size_t)r.status_ok.json.len + 1);
    if (!s) {
        proto_msg_free(&r);
        return rd_fail(RD_ENOMEM, "STATUS: out of memory for a %u-byte document", r.status_ok.json.len);
    }
    if (r.status_ok.json.len)
        memcpy(s, r.status_ok.json.ptr, r.status_ok.json.len);
    s[r.status_ok.json.len] = 0;
    proto_msg_free(&r);
    *json = s;
    return 0;
}

int rdc_bye(rdc_client *c, int discard, proto_bye_ok *out)
{
    proto_msg q = {.type = PROTO_BYE};
    q.bye.client_id = c->client_id;
    q.bye.flags = discard ? PROTO_BYE_DISCARD : 0;
    proto_msg r;
    int rc = exchange(c, &q, PROTO_BYE_OK, RDC_TIMEOUT_MS, &r);
    if (rc)
        return rc;
    if (out)
        *out = r.bye_ok;
    proto_msg_free(&r);
    return 0;
}

/* ---- owned results ---- */

/* Copies bytes of src to *p and advances it; NULL when there is nothing. */
static void *take(uint8_t **p, const void *src, size_t bytes)
{
    if (!src || !bytes)
        return NULL;
    void *dst = *p;
    memcpy(dst, src, bytes);
    *p += bytes;
    return dst;
}

int rdc_sample_copy(const proto_result *src, uint32_t req_index, rdc_sample *dst)
{
    memset(dst, 0, sizeof *dst);
    size_t n = src->n_tokens, k = src->top_k;
    int proc = src->logprobs_processed != NULL;
    size_t bytes = n * 4 * (2 + (size_t)proc) + n * k * 8 + (size_t)src->n_spans * sizeof(proto_span);
    uint8_t *mem = malloc(bytes ? bytes : 1);
    if (!mem)
        return rd_fail(RD_ENOMEM, "out of memory copying a %zu-token result", n);
    dst->req_index = req_index;
    dst->r = *src;
    dst->mem = mem;
    /* spans first: 8-byte aligned at the start of the block */
    proto_span *sp = (proto_span *)mem;
    if (src->n_spans)
        memcpy(sp, src->spans, src->n_spans * sizeof *sp);
    dst->r.spans = sp;
    uint8_t *p = mem + (size_t)src->n_spans * sizeof *sp;
    dst->r.token_ids = take(&p, src->token_ids, n * 4);
    dst->r.logprobs = take(&p, src->logprobs, n * 4);
    dst->r.logprobs_processed = take(&p, src->logprobs_processed, n * 4);
    dst->r.top_ids = take(&p, src->top_ids, n * k * 4);
    dst->r.top_logprobs = take(&p, src->top_logprobs, n * k * 4);
    return 0;
}

void rdc_sample_free(rdc_sample *s)
{
    if (!s)
        return;
    free(s->mem);
    memset(s, 0, sizeof *s);
}

void rdc_samples_free(rdc_sample *s, size_t n)
{
    if (!s)
        return;
    for (size_t i = 0; i < n; i++)
        rdc_sample_free(&s[i]);
    free(s);
}

const char *rdc_finish_name(uint8_t finish)
{
    switch (finish) {
    case PROTO_FINISH_STOP: return "stop";
    case PROTO_FINISH_LENGTH: return "length";
    case PROTO_FINISH_ABORT: return "abort";
    case PROTO_FINISH_ERROR: return "error";
    default: return "none";
    }
}

/* ---- running a batch to completion ---- */

#define RDC_RUN_TRIES 5         /* consecutive timeouts before rdc_run gives up */
#define RDC_RUN_WAIT_MS 1000    /* FETCH long-poll */

/* Encoded bytes of one request inside SUBMIT. */
static uint64_t request_bytes(const proto_request *q)
{
    return 56 + 4ull * q->n_stop + 4ull * q->n_prompt + q->text.len;
}

/* SUBMIT with retries of timed-out exchanges (repeats are DUPLICATE, §8). */
static int submit_retry(rdc_client *c, const proto_request *reqs, uint32_t n, proto_msg *reply)
{
    int rc = RDC_ETIMEDOUT;
    for (int t = 0; t < RDC_RUN_TRIES && rc == RDC_ETIMEDOUT; t++)
        rc = rdc_submit(c, reqs, n, reply);
    return rc;
}

int rdc_run(rdc_client *c, const proto_request *reqs, uint32_t n_reqs, rdc_sample **out, size_t *n_out)
{
    *out = NULL;
    *n_out = 0;
    if (!c->have_hello)
        return rd_fail(RD_EINVAL, "rdc_run: no HELLO yet; call rdc_hello first");
    const proto_hello_ok *info = &c->hello.hello_ok;
    size_t total = 0;
    for (uint32_t i = 0; i < n_reqs; i++)
        total += reqs[i].n;
    proto_request *q = malloc((n_reqs ? n_reqs : 1) * sizeof *q);
    uint32_t *left = calloc(n_reqs ? n_reqs : 1, sizeof *left); /* samples still to arrive */
    uint8_t *accepted = calloc(n_reqs ? n_reqs : 1, 1);
    rdc_sample *res = calloc(total ? total : 1, sizeof *res);
    if (!q || !left || !accepted || !res) {
        free(q), free(left), free(accepted), free(res);
        return rd_fail(RD_ENOMEM, "rdc_run: out of memory for %u requests", n_reqs);
    }
    uint64_t base = c->next_req_id;
    c->next_req_id += n_reqs;
    for (uint32_t i = 0; i < n_reqs; i++) {
        q[i] = reqs[i];
        q[i].client_req_id = base + i;
        left[i] = reqs[i].n;
    }
    uint32_t per_submit = info->max_requests_per_submit ? info->max_requests_per_submit : 64;
    uint32_t next = 0;      /* first request not accepted yet */
    size_t got = 0;
    int rc = 0, timeouts = 0;
    proto_msg reply;
    while (got < total) {
        if (next < n_reqs) {
            /* A piece within max_requests_per_submit and max_message_bytes. */
            uint32_t k = 0;
            uint64_t bytes = PROTO_HEADER_BYTES + 12;
            while (next + k < n_reqs && k < per_submit &&
                   (k == 0 || bytes + request_bytes(&q[next + k]) <= c->max_msg))
                bytes += request_bytes(&q[next + k++]);
            if ((rc = submit_retry(c, q + next, k, &reply)))
                break;
            int bad = -1;
            uint32_t n_ok = 0;
            for (uint32_t i = 0; i < k; i++) {
                const proto_submit_item *it = &reply.submit_ok.items[i];
                if (it->status == 0) {
                    accepted[next + i] = 1;
                    n_ok = i + 1;
                } else if (it->status != PROTO_E_BUSY && bad < 0) {
                    bad = (int)i;
                    c->err_code = it->status;
                    rc = rd_fail(RDC_EDAEMON, "request %u refused: %s (%u): %s", next + i, proto_err_name(it->status),
                                 it->status, it->message.ptr ? it->message.ptr : "");
                }
            }
            proto_msg_free(&reply);
            if (bad >= 0) {
                /* Abort what was accepted; the daemon delivers their partial results to this client. */
                uint32_t code = c->err_code;
                char msg[512];
                snprintf(msg, sizeof msg, "%s", rd_errmsg());
                for (uint32_t i = 0; i < n_reqs; i++)
                    if (accepted[i] && left[i] > 0)
                        rdc_abort(c, q[i].client_req_id, 0, NULL);
                c->err_code = code;
                rc = rd_fail(RDC_EDAEMON, "%s", msg);
                break;
            }
            next += n_ok; /* BUSY ones are a suffix: resubmitted after the next fetch */
        }
        uint32_t first;
        rc = rdc_fetch_new(c, 256, RDC_RUN_WAIT_MS, &reply, &first);
        if (rc == RDC_ETIMEDOUT && ++timeouts < RDC_RUN_TRIES) {
            rc = 0;
            continue;
        }
        if (rc)
            break;
        timeouts = 0;
        for (uint32_t i = first; i < reply.results.n_results && !rc; i++) {
            const proto_result *r = &reply.results.results[i];
            if (r->client_req_id < base || r->client_req_id >= base + n_reqs)
                continue; /* another request of this client: acked, dropped */
            uint32_t idx = (uint32_t)(r->client_req_id - base);
            if (!accepted[idx] || left[idx] == 0) {
                rc = rd_fail(RD_EFORMAT, "the daemon sent sample %u of request %u (client_req_id %llu) beyond the %u "
                             "asked for", r->sample_idx, idx, (unsigned long long)r->client_req_id, q[idx].n);
                break;
            }
            if ((rc = rdc_sample_copy(r, idx, &res[got])))
                break;
            got++;
            left[idx]--;
        }
        proto_msg_free(&reply);
        if (rc)
            break;
    }
    free(q);
    free(left);
    free(accepted);
    if (!rc) { /* acknowledge the last results now, so the daemon can drop them */
        rc = rdc_fetch(c, 0, 0, &reply);
        if (!rc)
            proto_msg_free(&reply);
    }
    if (rc) {
        rdc_samples_free(res, got);
        return rc;
    }
    *out = res;
    *n_out = got;
    return 0;
}
