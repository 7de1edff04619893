/* rd_delta.c - the C sender's delta encoder (rd_delta.h). */
#include "client/rd_delta.h"

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

/* SPARSE_ZSTD's content for a record of elems elements with count changed:
 * u32 count, the LEB128 gaps, then the XORs as es byte planes (planes is
 * scratch of es * count bytes). Its length. */
static size_t sparse_raw(const uint8_t *cur, const uint8_t *base, uint64_t elems, uint32_t es, uint64_t count,
                         uint8_t *r, uint8_t *planes)
{
    uint32_t c32 = (uint32_t)count;
    memcpy(r, &c32, 4);
    size_t at = 4;
    uint64_t next = 0, k = 0; /* next: the index after the previous changed element */
    for (uint64_t e = 0; e < elems; e++) {
        if (!differs(cur + e * es, base + e * es, es))
            continue;
        uint64_t gap = e - next;
        do {
            r[at++] = (uint8_t)((gap & 0x7F) | (gap > 0x7F ? 0x80 : 0));
            gap >>= 7;
        } while (gap);
        for (uint32_t b = 0; b < es; b++)
            planes[b * count + k] = cur[e * es + b] ^ base[e * es + b];
        next = e + 1;
        k++;
    }
    memcpy(r + at, planes, es * count);
    return at + es * count;
}

int rdd_encode(const uint8_t *cur, const uint8_t *base, uint64_t n, uint32_t es, uint8_t **out, uint64_t *out_len,
               uint64_t *changed)
{
    *out = NULL, *out_len = 0, *changed = 0;
    if ((es != 2 && es != 4) || n % es)
        return rd_fail(RD_EINVAL, "delta: %llu bytes of %u-byte elements", (unsigned long long)n, es);
    buf b = {0};
    uint8_t *x = NULL, *sp = NULL, *pl = NULL;
    const size_t sparse_max = 4 + (RDD_RECORD_BYTES / es) * (5 + es);
    size_t zcap = ZSTD_compressBound(sparse_max);
    uint8_t *z = malloc(zcap);
    const uint64_t merge = 8 / es - 1; /* unchanged elements cheaper to resend than a new run head */
    int rc = z ? 0 : rd_fail(RD_ENOMEM, "delta: out of memory");
    for (uint64_t off = 0; off < n && !rc; off += RDD_RECORD_BYTES) {
        uint64_t len = n - off < RDD_RECORD_BYTES ? n - off : RDD_RECORD_BYTES, elems = len / es;
        uint64_t at0 = b.len, nchg = 0;
        if ((rc = grow(&b, HEAD + len + 8 * (elems + 1))))
            break;
        uint64_t at = at0 + HEAD, prev_end = 0, e = 0;
        while (e < elems) {
            if (!differs(cur + off + e * es, base + off + e * es, es)) {
                e++;
                continue;
            }
            uint64_t start = e, last = e; /* a run: changed elements and gaps of at most merge */
            nchg++;
            for (e = e + 1; e < elems && e - last <= merge + 1; e++)
                if (differs(cur + off + e * es, base + off + e * es, es))
                    last = e, nchg++;
            uint32_t skip = (uint32_t)(start - prev_end), count = (uint32_t)(last + 1 - start);
            memcpy(b.p + at, &skip, 4);
            memcpy(b.p + at + 4, &count, 4);
            memcpy(b.p + at + 8, cur + off + start * es, (size_t)count * es);
            at += 8 + (uint64_t)count * es;
            prev_end = last + 1;
            e = last + 1;
        }
        if (!nchg)
            continue; /* unchanged: no record */
        *changed += nchg;
        uint64_t runs = at - at0 - HEAD;
        uint8_t kind = 1;
        /* A few runs beat any zstd frame; else the smallest of the runs, the changed elements alone
         * (SPARSE_ZSTD) and, where more than an eighth changed, the XOR of the whole record. */
        if (runs > 64) {
            if ((!sp && !(sp = malloc(sparse_max))) || (!pl && !(pl = malloc(RDD_RECORD_BYTES)))) {
                rc = rd_fail(RD_ENOMEM, "delta: out of memory");
                break;
            }
            size_t sn = sparse_raw(cur + off, base + off, elems, es, nchg, sp, pl);
            size_t zn = ZSTD_compress(z, zcap, sp, sn, 1);
            if (!ZSTD_isError(zn) && zn < runs) {
                memcpy(b.p + at0 + HEAD, z, zn);
                runs = zn;
                kind = 3;
            }
        }
        if (runs > 64 && 8 * nchg > elems) {
            if (!x && !(x = malloc(RDD_RECORD_BYTES))) {
                rc = rd_fail(RD_ENOMEM, "delta: out of memory");
                break;
            }
            for (uint64_t k = 0; k < len; k++)
                x[k] = cur[off + k] ^ base[off + k];
            size_t zn = ZSTD_compress(z, zcap, x, len, 1);
            if (!ZSTD_isError(zn) && zn < runs) {
                memcpy(b.p + at0 + HEAD, z, zn);
                runs = zn;
                kind = 2;
            }
        }
        put_head(b.p + at0, kind, (uint32_t)runs, off, len);
        b.len = at0 + HEAD + runs;
    }
    if (!rc && b.len == 0) { /* unchanged tensor: one empty record (a delta has at least one byte) */
        if (!(rc = grow(&b, HEAD))) {
            put_head(b.p, 1, 0, 0, es);
            b.len = HEAD;
        }
    }
    free(x), free(z), free(sp), free(pl);
    if (rc) {
        free(b.p);
        return rc;
    }
    *out = b.p, *out_len = b.len;
    return 0;
}

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
