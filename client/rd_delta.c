/* rd_delta.c - the C sender's delta encoder (rd_delta.h). */
#include "client/rd_delta.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <zstd.h>

#include "base/crc32c.h"
#include "base/err.h"

#define HEAD 24

typedef struct {
    uint8_t *p;
    uint64_t len, cap;
} buf;

static int grow(buf *b, uint64_t more)
{
    if (b->len + more <= b->cap)
        return 0;
    uint64_t cap = b->cap ? b->cap : 4096;
    while (cap < b->len + more)
        cap *= 2;
    uint8_t *n = realloc(b->p, cap);
    if (!n)
        return rd_fail(RD_ENOMEM, "delta: out of memory");
    b->p = n, b->cap = cap;
    return 0;
}

static void put_head(uint8_t *h, uint8_t kind, uint32_t payload, uint64_t off, uint64_t len)
{
    memset(h, 0, HEAD);
    h[0] = kind;
    memcpy(h + 4, &payload, 4);
    memcpy(h + 8, &off, 8);
    memcpy(h + 16, &len, 8);
}

static int differs(const uint8_t *a, const uint8_t *b, uint32_t es)
{
    return es == 2 ? memcmp(a, b, 2) != 0 : memcmp(a, b, 4) != 0;
}

/* The first element at or after e (of elems) that differs, or elems: a
 * word at a time, the first differing element of a word by its lowest set
 * bit of the XOR (little-endian: element e's bytes are the low ones). */
static uint64_t next_diff(const uint8_t *a, const uint8_t *b, uint64_t e, uint64_t elems, uint32_t es)
{
    for (; e < elems && (e * es) % 8; e++)
        if (differs(a + e * es, b + e * es, es))
            return e;
    for (; e + 8 / es <= elems; e += 8 / es) {
        uint64_t u, v;
        memcpy(&u, a + e * es, 8);
        memcpy(&v, b + e * es, 8);
        if (u != v)
            return e + (uint64_t)__builtin_ctzll(u ^ v) / (8 * es);
    }
    for (; e < elems; e++)
        if (differs(a + e * es, b + e * es, es))
            return e;
    return elems;
}

/* SPARSE_ZSTD's content for a record's count changed elements (idx, in
 * order): u32 count, the LEB128 gaps, then the XORs as es byte planes
 * (planes is scratch of es * count bytes). Its length. */
static size_t sparse_raw(const uint8_t *cur, const uint8_t *base, const uint32_t *idx, uint64_t count, uint32_t es,
                         uint8_t *r, uint8_t *planes)
{
    uint32_t c32 = (uint32_t)count;
    memcpy(r, &c32, 4);
    size_t at = 4;
    uint64_t next = 0; /* the index after the previous changed element */
    for (uint64_t k = 0; k < count; k++) {
        uint64_t e = idx[k], gap = e - next;
        do {
            r[at++] = (uint8_t)((gap & 0x7F) | (gap > 0x7F ? 0x80 : 0));
            gap >>= 7;
        } while (gap);
        for (uint32_t b = 0; b < es; b++)
            planes[b * count + k] = cur[e * es + b] ^ base[e * es + b];
        next = e + 1;
    }
    memcpy(r + at, planes, es * count);
    return at + es * count;
}

/* A thread's scratch, kept for the thread's life (sized once for the
 * largest record, 2-byte elements) and freed when the thread exits: fresh
 * multi-MiB buffers and a zstd context per call were faulted in and set up
 * again every time, more than the encoding itself. */
typedef struct {
    uint8_t *runs;              /* a record's RUNS payload: len + 8 (elems + 1) bytes at most */
    uint32_t *idx;              /* the record's changed elements, as the runs pass finds them */
    uint8_t *sp, *pl;           /* SPARSE_ZSTD's content, and its planes while they are gathered */
    uint8_t *x;                 /* the XOR of a record */
    uint8_t *zs, *zx;           /* the SPARSE_ZSTD and XOR_ZSTD frames */
    size_t zcap;
    ZSTD_CCtx *cctx;
} enc_scratch;

#define SPARSE_MAX (4 + (RDD_RECORD_BYTES / 2) * 7)

static pthread_key_t scratch_key;
static pthread_once_t scratch_once = PTHREAD_ONCE_INIT;

static void scratch_free(void *p)
{
    enc_scratch *t = p;
    if (!t)
        return;
    free(t->runs), free(t->idx), free(t->sp), free(t->pl), free(t->x), free(t->zs), free(t->zx);
    ZSTD_freeCCtx(t->cctx);
    free(t);
}

static void scratch_key_init(void) { pthread_key_create(&scratch_key, scratch_free); }

static enc_scratch *scratch(void)
{
    pthread_once(&scratch_once, scratch_key_init);
    enc_scratch *t = pthread_getspecific(scratch_key);
    if (t)
        return t;
    if (!(t = calloc(1, sizeof *t)))
        return NULL;
    t->zcap = ZSTD_compressBound(SPARSE_MAX);
    t->runs = malloc(RDD_RECORD_BYTES + 8 * (RDD_RECORD_BYTES / 2 + 1));
    t->idx = malloc(sizeof(uint32_t) * (RDD_RECORD_BYTES / 2));
    t->sp = malloc(SPARSE_MAX);
    t->pl = malloc(RDD_RECORD_BYTES);
    t->x = malloc(RDD_RECORD_BYTES);
    t->zs = malloc(t->zcap);
    t->zx = malloc(t->zcap);
    t->cctx = ZSTD_createCCtx();
    if (!t->runs || !t->idx || !t->sp || !t->pl || !t->x || !t->zs || !t->zx || !t->cctx ||
        pthread_setspecific(scratch_key, t)) {
        scratch_free(t);
        return NULL;
    }
    return t;
}

int rdd_encode_range(const uint8_t *cur, const uint8_t *base, uint64_t n, uint32_t es, uint64_t off0, uint8_t **out,
                     uint64_t *out_len, uint64_t *changed)
{
    *out = NULL, *out_len = 0, *changed = 0;
    if ((es != 2 && es != 4) || n % es)
        return rd_fail(RD_EINVAL, "delta: %llu bytes of %u-byte elements", (unsigned long long)n, es);
    enc_scratch *t = scratch();
    if (!t)
        return rd_fail(RD_ENOMEM, "delta: out of memory");
    buf b = {0};
    const uint64_t merge = 8 / es - 1; /* unchanged elements cheaper to resend than a new run head */
    int rc = 0;
    for (uint64_t off = 0; off < n && !rc; off += RDD_RECORD_BYTES) {
        uint64_t len = n - off < RDD_RECORD_BYTES ? n - off : RDD_RECORD_BYTES, elems = len / es;
        uint64_t at = 0, prev_end = 0, e = 0, nchg = 0;
        while ((e = next_diff(cur + off, base + off, e, elems, es)) < elems) {
            uint64_t start = e, last = e; /* a run: changed elements and gaps of at most merge */
            t->idx[nchg++] = (uint32_t)e;
            for (e = e + 1; e < elems && e - last <= merge + 1; e++)
                if (differs(cur + off + e * es, base + off + e * es, es))
                    last = e, t->idx[nchg++] = (uint32_t)e;
            uint32_t skip = (uint32_t)(start - prev_end), count = (uint32_t)(last + 1 - start);
            memcpy(t->runs + at, &skip, 4);
            memcpy(t->runs + at + 4, &count, 4);
            memcpy(t->runs + at + 8, cur + off + start * es, (size_t)count * es);
            at += 8 + (uint64_t)count * es;
            prev_end = last + 1;
            e = last + 1;
        }
        if (!nchg)
            continue; /* unchanged: no record */
        *changed += nchg;
        /* A few runs beat any zstd frame; else the smallest of the runs, the changed elements alone
         * (SPARSE_ZSTD) and, where more than an eighth changed, the XOR of the whole record. */
        const uint8_t *payload = t->runs;
        uint64_t bytes = at;
        uint8_t kind = 1;
        if (bytes > 64) {
            size_t sn = sparse_raw(cur + off, base + off, t->idx, nchg, es, t->sp, t->pl);
            size_t zn = ZSTD_compressCCtx(t->cctx, t->zs, t->zcap, t->sp, sn, 1);
            if (!ZSTD_isError(zn) && zn < bytes)
                payload = t->zs, bytes = zn, kind = 3;
        }
        if (bytes > 64 && 8 * nchg > elems) {
            for (uint64_t k = 0; k < len; k++)
                t->x[k] = cur[off + k] ^ base[off + k];
            size_t zn = ZSTD_compressCCtx(t->cctx, t->zx, t->zcap, t->x, len, 1);
            if (!ZSTD_isError(zn) && zn < bytes)
                payload = t->zx, bytes = zn, kind = 2;
        }
        if ((rc = grow(&b, HEAD + bytes)))
            break;
        memcpy(b.p + b.len + HEAD, payload, bytes);
        put_head(b.p + b.len, kind, (uint32_t)bytes, off0 + off, len);
        b.len += HEAD + bytes;
    }
    if (rc) {
        free(b.p);
        return rc;
    }
    *out = b.p, *out_len = b.len;
    return 0;
}

int rdd_encode(const uint8_t *cur, const uint8_t *base, uint64_t n, uint32_t es, uint8_t **out, uint64_t *out_len,
               uint64_t *changed)
{
    int rc = rdd_encode_range(cur, base, n, es, 0, out, out_len, changed);
    if (!rc && *out_len == 0) { /* unchanged tensor: one empty record (a delta has at least one byte) */
        free(*out);
        if (!(*out = malloc(HEAD)))
            return rd_fail(RD_ENOMEM, "delta: out of memory");
        put_head(*out, 1, 0, 0, es);
        *out_len = HEAD;
    }
    return rc;
}

void rdd_stream_free(uint8_t *p) { free(p); }

int rdd_make(const rdp_tensor *cur, int n, const rdp_tensor *base, int n_base, uint64_t base_version, rdd_set *out)
{
    memset(out, 0, sizeof *out);
    out->ts = calloc((size_t)(n ? n : 1), sizeof *out->ts);
    out->bufs = calloc((size_t)(n ? n : 1), sizeof *out->bufs);
    out->n = n;
    if (!out->ts || !out->bufs) {
        rdd_free(out);
        return rd_fail(RD_ENOMEM, "delta: out of memory");
    }
    for (int i = 0; i < n; i++) {
        const rdp_tensor *t = &cur[i], *b = NULL;
        out->ts[i] = *t;
        out->tensor_bytes += t->nbytes;
        for (int k = 0; k < n_base && !b; k++)
            if (!strcmp(base[k].name, t->name) && base[k].dtype == t->dtype && base[k].nbytes == t->nbytes)
                b = &base[k];
        if (!b || t->dtype > 2) {
            out->wire_bytes += t->nbytes;
            continue;
        }
        uint32_t es = t->dtype == PROTO_DTYPE_F32 ? 4 : 2;
        uint64_t len, changed;
        int rc = rdd_encode(t->data, b->data, t->nbytes, es, &out->bufs[i], &len, &changed);
        if (rc) {
            rdd_free(out);
            return rc;
        }
        rdp_tensor *d = &out->ts[i];
        d->flags = PROTO_TENSOR_DELTA;
        d->full_bytes = t->nbytes;
        d->full_crc = crc32c(0, t->data, t->nbytes);
        d->base_version = base_version;
        d->data = out->bufs[i];
        d->nbytes = len;
        out->n_delta++;
        out->elems += t->nbytes / es;
        out->changed += changed;
        out->wire_bytes += len;
    }
    return 0;
}

void rdd_free(rdd_set *s)
{
    for (int i = 0; s->bufs && i < s->n; i++)
        free(s->bufs[i]);
    free(s->bufs);
    free(s->ts);
    memset(s, 0, sizeof *s);
}
