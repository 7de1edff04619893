/* rd_push_job.c - the steps both push modes take on one daemon (rd_push_priv.h):
 * UPDATE_BEGIN, the chunks on its data lane, UPDATE_COMMIT or UPDATE_ABORT, and
 * recording its first failure. rd_push.c (the direct fan-out, and rdp_push,
 * which picks a mode) and rd_chain.c (the chained broadcast) both call them;
 * they are in a file of their own, below both, so that the two files do not
 * call each other in a circle (tools/check_layers.py, rule calls). */
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "base/err.h"
#include "client/rd_client.h"
#include "client/rd_push_priv.h"

#define RDP_COMMIT_TIMEOUT_MS 600000    /* drain mode waits for running sequences to finish */

void rdp_fail_job(rdp_job *j, int rc, uint32_t code, const char *msg)
{
    pthread_mutex_lock(&j->mu);
    if (!atomic_load(&j->failed)) {
        j->t->rc = rc;
        j->t->err_code = code;
        snprintf(j->t->error, sizeof j->t->error, "%s", msg);
        atomic_store(&j->failed, 1);
    }
    pthread_mutex_unlock(&j->mu);
}

/* Sending stops on a failure, or when the chain has what it needs from us. */
static int halted(rdp_job *j) { return atomic_load(&j->failed) || atomic_load(&j->stop); }

/* Reads the daemon's replies on the data lane until the stream ends. */
static void *lane_reader(void *arg)
{
    rdp_job *j = arg;
    const rdp_plan *p = j->p;
    uint8_t head[PROTO_HEADER_BYTES];
    uint8_t *frame = NULL;
    for (;;) {
        size_t got = 0;
        while (got < sizeof head) {
            ssize_t n = read(j->fd, head + got, sizeof head - got);
            if (n <= 0)
                goto out;
            got += (size_t)n;
        }
        uint32_t body = (uint32_t)head[8] | (uint32_t)head[9] << 8 | (uint32_t)head[10] << 16 | (uint32_t)head[11] << 24;
        if (body > 65536) {
            rdp_fail_job(j, RD_EFORMAT, 0, "data lane: a reply frame over 64 KiB");
            goto out;
        }
        uint8_t *nf = realloc(frame, sizeof head + body);
        if (!nf)
            goto out;
        frame = nf;
        memcpy(frame, head, sizeof head);
        got = 0;
        while (got < body) {
            ssize_t n = read(j->fd, frame + sizeof head + got, body - got);
            if (n <= 0)
                goto out;
            got += (size_t)n;
        }
        proto_msg m;
        if (proto_decode(frame, sizeof head + body, 0, &m)) {
            char why[600];
            snprintf(why, sizeof why, "data lane: a reply does not decode: %s", rd_errmsg());
            rdp_fail_job(j, RD_EFORMAT, 0, why);
            goto out;
        }
        pthread_mutex_lock(&j->mu);
        if (m.type == PROTO_UPDATE_CHUNK_OK && m.update_chunk_ok.chunk_seq < p->n_chunks) {
            atomic_fetch_add(&j->acked, p->chunks[m.update_chunk_ok.chunk_seq].len);
            j->outstanding--;
        } else if (m.type == PROTO_ERROR && m.error.code == PROTO_E_CHECKSUM) {
            /* The message names no chunk: the oldest unanswered one is this one (replies keep order per
             * checksum job completion, so resend conservatively: the daemon answers a resend of a chunk
             * it already staged as a duplicate). */
            j->outstanding--;
            atomic_fetch_add(&j->retries, 1);
        } else if (atomic_load(&j->stop)) {
            /* The chain is done with this sender: what the daemon says now is no failure of its push. */
            j->outstanding = 0;
        } else {
            char why[600];
            snprintf(why, sizeof why, "daemon error %s (%u) on the data lane: %s",
                     m.type == PROTO_ERROR ? proto_err_name(m.error.code) : "?",
                     m.type == PROTO_ERROR ? m.error.code : 0,
                     m.type == PROTO_ERROR && m.error.message.ptr ? m.error.message.ptr : "unexpected reply");
            pthread_mutex_unlock(&j->mu);
            rdp_fail_job(j, RDC_EDAEMON, m.type == PROTO_ERROR ? m.error.code : 0, why);
            pthread_mutex_lock(&j->mu);
        }
        pthread_cond_broadcast(&j->cv);
        pthread_mutex_unlock(&j->mu);
        proto_msg_free(&m);
    }
out:
    free(frame);
    pthread_mutex_lock(&j->mu);
    j->reader_done = 1;
    pthread_cond_broadcast(&j->cv);
    pthread_mutex_unlock(&j->mu);
    return NULL;
}

/* sendmsg with MSG_NOSIGNAL: a daemon that dies mid-push is a failed
 * target, not a SIGPIPE that kills the whole push. */
static int write_all(int fd, struct iovec *iov, int n)
{
    while (n > 0) {
        struct msghdr mh = {.msg_iov = iov, .msg_iovlen = (size_t)n};
        ssize_t w = sendmsg(fd, &mh, MSG_NOSIGNAL);
        if (w < 0)
            return -1;
        while (n > 0 && (size_t)w >= iov->iov_len) {
            w -= (ssize_t)iov->iov_len;
            iov++;
            n--;
        }
        if (n > 0) {
            iov->iov_base = (char *)iov->iov_base + w;
            iov->iov_len -= (size_t)w;
        }
    }
    return 0;
}

int rdp_url_host(const char *url, char *host, size_t size)
{
    const char *h = strncmp(url, "tcp://", 6) ? NULL : url + 6;
    const char *colon = h ? strrchr(h, ':') : NULL;
    if (!h || !colon || colon == h || (size_t)(colon - h) >= size)
        return -1;
    /* [::1]:7070: the address inside the brackets */
    if (h[0] == '[' && colon[-1] == ']') {
        memcpy(host, h + 1, (size_t)(colon - h) - 2);
        host[colon - h - 2] = 0;
    } else {
        memcpy(host, h, (size_t)(colon - h));
        host[colon - h] = 0;
    }
    return 0;
}

void rdp_stop_feeding(rdp_job *j)
{
    pthread_mutex_lock(&j->mu);
    atomic_store(&j->stop, 1);
    if (j->fd >= 0)
        shutdown(j->fd, SHUT_RDWR); /* unblocks the writer and the reader; lane_send closes it */
    pthread_cond_broadcast(&j->cv);
    pthread_mutex_unlock(&j->mu);
}

static int lane_connect(rdp_job *j, const char *url)
{
    char host[256], port[16];
    if (rdp_url_host(url, host, sizeof host))
        return rd_fail(RD_EINVAL, "data lane: cannot take a host from '%s'", url);
    snprintf(port, sizeof port, "%u", j->lane_port);
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM}, *ai;
    if (getaddrinfo(host, port, &hints, &ai))
        return rd_fail(RD_EIO, "data lane: cannot resolve %s", host);
    int fd = socket(ai->ai_family, SOCK_STREAM, 0);
    int one = 1;
    if (fd < 0 || connect(fd, ai->ai_addr, ai->ai_addrlen)) {
        freeaddrinfo(ai);
        if (fd >= 0)
            close(fd);
        return rd_fail(RD_EIO, "data lane: cannot connect to %s:%s", host, port);
    }
    freeaddrinfo(ai);
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    pthread_mutex_lock(&j->mu);
    j->fd = fd;
    int stopped = atomic_load(&j->stop);
    pthread_mutex_unlock(&j->mu);
    return stopped ? 1 : 0;
}

static void lane_close(rdp_job *j)
{
    pthread_mutex_lock(&j->mu);
    close(j->fd);
    j->fd = -1;
    pthread_mutex_unlock(&j->mu);
}

/* Sends every chunk on the data lane: a head and the tensor's bytes as they
 * are (no copy), at most a window unanswered. CRC mismatches are resent. */
void rdp_lane_send(rdp_job *j, const char *url)
{
    const rdp_plan *p = j->p;
    int rc = lane_connect(j, url);
    if (rc) {
        if (rc < 0)
            rdp_fail_job(j, rc, 0, rd_errmsg());
        else
            lane_close(j);
        return;
    }
    if ((rc = rdc_lane_auth(j->c, j->fd, j->xfer))) {
        if (!atomic_load(&j->stop))
            rdp_fail_job(j, rc, 0, rd_errmsg());
        lane_close(j);
        return;
    }
    pthread_t reader;
    if (pthread_create(&reader, NULL, lane_reader, j)) {
        lane_close(j);
        rdp_fail_job(j, RD_ENOMEM, 0, "data lane: cannot start the reply reader");
        return;
    }
    uint32_t window = j->window ? j->window : 1;
    uint64_t sent_bytes = 0;
    /* Pass 1 sends everything; while bytes are missing (a checksum failure), pass again:
     * chunks already staged come back as duplicates and cost only their bytes. */
    for (int pass = 0; pass < 4 && !halted(j); pass++) {
        uint32_t retries_before = atomic_load(&j->retries);
        for (uint32_t i = 0; i < p->n_chunks && !halted(j); i++) {
            const rdp_chunk *ch = &p->chunks[i];
            pthread_mutex_lock(&j->mu);
            while (j->outstanding >= window && !j->reader_done && !halted(j))
                pthread_cond_wait(&j->cv, &j->mu);
            int stop = j->reader_done || halted(j);
            if (!stop)
                j->outstanding++;
            pthread_mutex_unlock(&j->mu);
            if (stop)
                break;
            proto_update_chunk c = {.xfer_id = j->xfer, .chunk_seq = i, .tensor_index = ch->tensor, .offset = ch->off,
                                    .crc32c = ch->crc, .len = ch->len};
            uint8_t head[PROTO_CHUNK_HEAD_BYTES];
            proto_lane_encode_head(head, &c);
            struct iovec iov[2] = {{head, sizeof head}, {(void *)(p->tensors[ch->tensor].data + ch->off), ch->len}};
            if (write_all(j->fd, iov, 2)) {
                if (!atomic_load(&j->stop))
                    rdp_fail_job(j, RD_EIO, 0, "data lane: the connection broke while sending");
                break;
            }
            sent_bytes += sizeof head + ch->len;
        }
        pthread_mutex_lock(&j->mu);
        while (j->outstanding > 0 && !j->reader_done && !halted(j))
            pthread_cond_wait(&j->cv, &j->mu);
        pthread_mutex_unlock(&j->mu);
        if (atomic_load(&j->retries) == retries_before)
            break;
        atomic_store(&j->acked, 0); /* the next pass counts every chunk again (duplicates included) */
    }
    atomic_fetch_add(&j->wire, sent_bytes);
    pthread_mutex_lock(&j->mu);
    shutdown(j->fd, SHUT_WR);
    pthread_mutex_unlock(&j->mu);
    pthread_join(reader, NULL);
    lane_close(j);
    if (!halted(j) && atomic_load(&j->acked) < p->total)
        rdp_fail_job(j, RD_EIO, 0, "data lane: the daemon closed the stream before answering every chunk");
}

int rdp_begin(rdp_job *j)
{
    const rdp_plan *p = j->p;
    const rdp_options *o = p->o;
    if (!(rdc_info(j->c)->features & PROTO_FEATURE_WEIGHT_UPDATE)) {
        rdp_fail_job(j, RD_ENOTSUP, 0, "the daemon does not take weight updates (HELLO_OK feature bit 0 is off)");
        return RD_ENOTSUP;
    }
    proto_msg q = {.type = PROTO_UPDATE_BEGIN, .version = p->any_delta ? 3 : 0}, r;
    q.update_begin = (proto_update_begin){.client_id = rdc_client_id(j->c), .version = o->version, .mode = o->mode,
                                          .window = o->window, .max_chunk_bytes = o->chunk_bytes,
                                          .total_bytes = p->total, .n_tensors = (uint32_t)p->n_tensors,
                                          .tensors = p->manifest, .serve_dtype = o->serve_dtype};
    if (o->serve_dtype)
        q.version = 3; /* serve_dtype is a version-3 field (the reply comes in the same version) */
    int rc = rdc_call(j->c, &q, PROTO_UPDATE_BEGIN_OK, 60000, &r);
    if (rc) {
        rdp_fail_job(j, rc, rdc_error_code(j->c), rd_errmsg());
        return rc;
    }
    j->xfer = r.update_begin_ok.xfer_id;
    j->window = r.update_begin_ok.window;
    j->max_chunk = r.update_begin_ok.max_chunk_bytes;
    j->lane_port = o->no_lane ? 0 : r.update_begin_ok.data_port;
    proto_msg_free(&r);
    if (j->max_chunk < o->chunk_bytes) {
        char why[200];
        snprintf(why, sizeof why, "the daemon grants chunks of %u bytes; this push was planned with %u (use a smaller "
                 "chunk size)", j->max_chunk, o->chunk_bytes);
        rdp_fail_job(j, RD_ERANGE, 0, why);
        rdp_abort(j);
        return RD_ERANGE;
    }
    return 0;
}

void rdp_abort(rdp_job *j)
{
    proto_msg a = {.type = PROTO_UPDATE_ABORT}, r;
    a.update_abort.xfer_id = j->xfer;
    if (j->xfer && rdc_call(j->c, &a, PROTO_UPDATE_ABORT_OK, 10000, &r) == 0)
        proto_msg_free(&r);
}

int rdp_commit(rdp_job *j)
{
    proto_msg cm = {.type = PROTO_UPDATE_COMMIT}, r;
    cm.update_commit.xfer_id = j->xfer;
    int rc;
    for (int attempt = 0;; attempt++) {
        rc = rdc_call(j->c, &cm, PROTO_UPDATE_COMMIT_OK, RDP_COMMIT_TIMEOUT_MS, &r);
        /* A repeated COMMIT gets the same reply (the daemon remembers it); BUSY: still committing. */
        int again = rc == RDC_ETIMEDOUT || (rc == RDC_EDAEMON && rdc_error_code(j->c) == PROTO_E_BUSY);
        if (!again || attempt >= 100)
            break;
        nanosleep(&(struct timespec){0, 50000000}, NULL);
    }
    if (rc) {
        rdp_fail_job(j, rc, rdc_error_code(j->c), rd_errmsg());
        return rc;
    }
    j->t->commit = r.update_commit_ok;
    proto_msg_free(&r);
    proto_msg bye = {.type = PROTO_BYE};
    bye.bye.client_id = rdc_client_id(j->c);
    bye.bye.flags = PROTO_BYE_DISCARD;
    if (rdc_call(j->c, &bye, PROTO_BYE_OK, 5000, &r) == 0)
        proto_msg_free(&r);
    return 0;
}
