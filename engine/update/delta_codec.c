/* delta_codec.c - the delta stream's records: parsing and applying
 * (delta_codec.h, PROTOCOL.md §10.14). No model, no pool: the fuzzer links it alone. */
#include "engine/update/delta_codec.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zstd.h>

#include "base/err.h"

static uint32_t ld32(const uint8_t *p) { return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24; }
static uint64_t ld64(const uint8_t *p) { return (uint64_t)ld32(p) | (uint64_t)ld32(p + 4) << 32; }

/* Splits w into records, checking each head: kind, reserved bytes, payload
 * inside the stream, ranges whole elements, in order, inside the tensor.
 * *out (malloc'd) gets them when out is not NULL. */
int upd_delta_parse(const uint8_t *w, uint64_t wn, uint64_t tn, uint32_t es, const char *name, upd_drec **out,
                 int32_t *n_out)
{
    int32_t n = 0, cap = 0;
    upd_drec *r = NULL;
    uint64_t at = 0, end_prev = 0;
    while (at < wn) {
        if (wn - at < UPD_DREC_HEAD) {
            free(r);
            return rd_fail(RD_EFORMAT, "delta of '%.200s': %llu bytes left at byte %llu; a record head is %d",
                           name, (unsigned long long)(wn - at), (unsigned long long)at, UPD_DREC_HEAD);
        }
        const uint8_t *h = w + at;
        upd_drec d = {.kind = h[0], .payload = ld32(h + 4), .off = ld64(h + 8), .len = ld64(h + 16),
                  .p = h + UPD_DREC_HEAD};
        const char *bad = NULL;
        if (d.kind != UPD_DREC_RUNS && d.kind != UPD_DREC_XOR_ZSTD && d.kind != UPD_DREC_SPARSE_ZSTD)
            bad = "kind is not 1 (runs), 2 (xor+zstd) or 3 (sparse+zstd)";
        else if (h[1] | h[2] | h[3])
            bad = "reserved bytes are not 0";
        else if (d.payload > wn - at - UPD_DREC_HEAD)
            bad = "its payload runs past the stream";
        else if (d.len == 0 || d.len > UPD_DELTA_MAX_RECORD)
            bad = "out_bytes is not 1..16 MiB";
        else if (d.off % es || d.len % es)
            bad = "its range is not whole elements";
        else if (d.off < end_prev)
            bad = "its range starts before the previous record's end";
        else if (d.off > tn || d.len > tn - d.off)
            bad = "its range runs past the tensor";
        if (bad) {
            free(r);
            return rd_fail(RD_EFORMAT, "delta of '%.200s': record %d at byte %llu (kind %u, payload %u, bytes "
                           "[%llu, +%llu)): %s", name, n, (unsigned long long)at, d.kind, d.payload,
                           (unsigned long long)d.off, (unsigned long long)d.len, bad);
        }
        if (out) {
            if (n == cap) {
                cap = cap ? 2 * cap : 64;
                upd_drec *nr = realloc(r, sizeof *nr * (size_t)cap);
                if (!nr) {
                    free(r);
                    return rd_fail(RD_ENOMEM, "delta of '%.200s': out of memory", name);
                }
                r = nr;
            }
            r[n] = d;
        }
        n++;
        end_prev = d.off + d.len;
        at += UPD_DREC_HEAD + (uint64_t)d.payload;
    }
    if (out)
        *out = r;
    *n_out = n;
    return 0;
}

/* Elements (es bytes: 2 or 4) of the 64-bit word v that are not zero: a
 * lane's top bit ends up set iff any of its bits is. */
static uint64_t nonzero_lanes(uint64_t v, uint32_t es)
{
    const uint64_t lo = es == 2 ? 0x7FFF7FFF7FFF7FFFull : 0x7FFFFFFF7FFFFFFFull;
    const uint64_t top = ((((v & lo) + lo) | v) & ~lo) >> (8 * es - 1); /* 1 at each nonzero lane's bit 0 */
    /* the lanes' bits summed into the top lane by one multiply (no popcount: baseline x86-64 has none) */
    return es == 2 ? (top * 0x0001000100010001ull) >> 48 : (top * 0x0000000100000001ull) >> 32;
}

/* Elements of n bytes (a multiple of es) where a and b differ; a word at a
 * time: this runs over every changed byte of a push. */
static uint64_t count_diff(const uint8_t *a, const uint8_t *b, uint64_t n, uint32_t es)
{
    uint64_t c = 0, k = 0;
    for (; k + 8 <= n; k += 8) {
        uint64_t u, v;
        memcpy(&u, a + k, 8);
        memcpy(&v, b + k, 8);
        c += nonzero_lanes(u ^ v, es);
    }
    for (; k < n; k += es)
        c += memcmp(a + k, b + k, es) != 0;
    return c;
}

/* Non-finite lanes among the es-byte elements of the word v, whose
 * exponent bits are exp (repeated over the lanes): a lane's exponent XOR
 * all ones is zero exactly when it is all ones, found with the borrow trick
 * (the top bit of every lane is 0 after the mask). Not zero: some lane is. */
static uint64_t nonfinite_lanes(uint64_t v, uint32_t es, uint32_t exp)
{
    const uint64_t e = es == 2 ? exp * 0x0001000100010001ull : exp * 0x0000000100000001ull;
    const uint64_t one = es == 2 ? 0x0001000100010001ull : 0x0000000100000001ull;
    const uint64_t top = es == 2 ? 0x8000800080008000ull : 0x8000000080000000ull;
    const uint64_t x = (v & e) ^ e;
    return (x - one) & ~x & top;
}

static int elem_nonfinite(const uint8_t *p, uint32_t es, uint32_t exp)
{
    uint32_t v = 0;
    memcpy(&v, p, es);
    return (v & exp) == exp;
}

/* Element e (of the tensor) was written NaN or infinite: the first one is kept. */
static void note_nonfinite(upd_drec_stat *st, uint64_t e)
{
    if (!st->nonfinite || e + 1 < st->nonfinite)
        st->nonfinite = e + 1;
}

/* A thread's buffer for decompressed records, kept for the thread's life:
 * a fresh 1 MiB malloc per record went back to the kernel and was faulted
 * in (zeroed) again every time, a tenth of an apply. */
static _Thread_local uint8_t *scratch_buf;
static _Thread_local uint64_t scratch_cap;

static uint8_t *scratch(uint64_t n)
{
    if (n > scratch_cap) {
        free(scratch_buf);
        scratch_cap = 0;
        if (!(scratch_buf = malloc(n)))
            return NULL;
        scratch_cap = n;
    }
    return scratch_buf;
}

static int apply_runs(const upd_drec *d, int32_t i, uint8_t *dst, uint32_t es, uint32_t exp, const char *name,
                      upd_drec_stat *st)
{
    uint64_t at = 0, pos = 0, elems = d->len / es;
    while (at < d->payload) {
        if (d->payload - at < 8)
            return rd_fail(RD_EFORMAT, "delta of '%.200s': record %d: a run head needs 8 bytes, %llu left",
                           name, i, (unsigned long long)(d->payload - at));
        uint64_t skip = ld32(d->p + at), count = ld32(d->p + at + 4);
        at += 8;
        if (count == 0 || skip > elems - pos || count > elems - pos - skip)
            return rd_fail(RD_EFORMAT, "delta of '%.200s': record %d: a run of %llu after skipping %llu at "
                           "element %llu of %llu; expected 1 or more inside the range", name, i,
                           (unsigned long long)count, (unsigned long long)skip, (unsigned long long)pos,
                           (unsigned long long)elems);
        if (count * es > d->payload - at)
            return rd_fail(RD_EFORMAT, "delta of '%.200s': record %d: a run of %llu values needs %llu bytes, "
                           "%llu left", name, i, (unsigned long long)count, (unsigned long long)(count * es),
                           (unsigned long long)(d->payload - at));
        pos += skip;
        st->changed += count_diff(dst + pos * es, d->p + at, count * es, es);
        memcpy(dst + pos * es, d->p + at, count * es);
        for (uint64_t k = 0; exp && k < count; k++)
            if (elem_nonfinite(d->p + at + k * es, es, exp)) {
                note_nonfinite(st, d->off / es + pos + k);
                break;
            }
        at += count * es;
        pos += count;
    }
    return 0;
}

static int apply_xor(const upd_drec *d, int32_t i, uint8_t *dst, uint32_t es, uint32_t exp, const char *name,
                     upd_drec_stat *st)
{
    uint8_t *x = scratch(d->len);
    if (!x)
        return rd_fail(RD_ENOMEM, "delta of '%.200s': out of memory for record %d", name, i);
    size_t got = ZSTD_decompress(x, d->len, d->p, d->payload);
    if (ZSTD_isError(got) || got != d->len)
        return rd_fail(RD_EFORMAT, "delta of '%.200s': record %d: the zstd frame %s%s; expected %llu bytes", name, i,
                       ZSTD_isError(got) ? "fails: " : "decompresses to fewer bytes",
                       ZSTD_isError(got) ? ZSTD_getErrorName(got) : "", (unsigned long long)d->len);
    /* dst ^= x a word at a time; a mostly-zero stream skips most stores */
    uint64_t c = 0, k = 0;
    for (; k + 8 <= d->len; k += 8) {
        uint64_t v, w;
        memcpy(&v, x + k, 8);
        if (!v)
            continue;
        memcpy(&w, dst + k, 8);
        w ^= v;
        memcpy(dst + k, &w, 8);
        c += nonzero_lanes(v, es);
        if (exp && nonfinite_lanes(w, es, exp)) /* rare: which lane, among those the XOR wrote */
            for (uint32_t b = 0; b < 8; b += es)
                if (memcmp(x + k + b, "\0\0\0\0", es) && elem_nonfinite(dst + k + b, es, exp)) {
                    note_nonfinite(st, (d->off + k + b) / es);
                    break;
                }
    }
    for (; k < d->len; k += es) {
        int nz = 0;
        for (uint32_t b = 0; b < es; b++) {
            nz |= x[k + b];
            dst[k + b] ^= x[k + b];
        }
        c += nz != 0;
        if (nz && exp && elem_nonfinite(dst + k, es, exp))
            note_nonfinite(st, (d->off + k) / es);
    }
    st->changed += c;
    return 0;
}

/* LEB128 of at most 5 bytes (a u32) from p[*at..n); -1 if it is longer or cut. */
static int64_t varint(const uint8_t *p, uint64_t n, uint64_t *at)
{
    uint64_t v = 0;
    for (int s = 0; s < 35 && *at < n; s += 7) {
        uint8_t b = p[(*at)++];
        v |= (uint64_t)(b & 0x7F) << s;
        if (!(b & 0x80))
            return v <= UINT32_MAX ? (int64_t)v : -1;
    }
    return -1;
}

/* SPARSE_ZSTD: the frame holds u32 count, count varint gaps, then the XORs
 * as es byte planes (plane b: byte b of every changed element). */
static int apply_sparse(const upd_drec *d, int32_t i, uint8_t *dst, uint32_t es, uint32_t exp, const char *name,
                        upd_drec_stat *st)
{
    const uint64_t elems = d->len / es, most = 4 + elems * (5 + es);
    unsigned long long want = ZSTD_getFrameContentSize(d->p, d->payload);
    if (want == ZSTD_CONTENTSIZE_ERROR || want == ZSTD_CONTENTSIZE_UNKNOWN || want < 4 + 1 + es || want > most)
        return rd_fail(RD_EFORMAT, "delta of '%.200s': record %d: a sparse frame must state its size, 4 + 1 + %u "
                       "to %llu bytes (%s)", name, i, es, (unsigned long long)most,
                       want == ZSTD_CONTENTSIZE_ERROR ? "not a zstd frame"
                       : want == ZSTD_CONTENTSIZE_UNKNOWN ? "no size stated" : "out of range");
    uint8_t *x = scratch(want);
    if (!x)
        return rd_fail(RD_ENOMEM, "delta of '%.200s': out of memory for record %d", name, i);
    size_t got = ZSTD_decompress(x, want, d->p, d->payload);
    if (ZSTD_isError(got) || got != want)
        return rd_fail(RD_EFORMAT, "delta of '%.200s': record %d: the sparse zstd frame %s%s; expected %llu bytes",
                       name, i, ZSTD_isError(got) ? "fails: " : "decompresses to fewer bytes",
                       ZSTD_isError(got) ? ZSTD_getErrorName(got) : "", want);
    const uint64_t count = ld32(x);
    if (count == 0 || count > elems || count * es > want - 4)
        return rd_fail(RD_EFORMAT, "delta of '%.200s': record %d: %llu changed elements in a range of %llu, a "
                       "frame of %llu bytes", name, i, (unsigned long long)count, (unsigned long long)elems, want);
    const uint64_t vend = want - count * es; /* the gaps end where the planes start */
    const uint8_t *plane = x + vend;
    uint64_t at = 4, pos = 0;
    for (uint64_t k = 0; k < count; k++) {
        int64_t gap = varint(x, vend, &at);
        if (gap < 0 || (uint64_t)gap >= elems - pos)
            return rd_fail(RD_EFORMAT, "delta of '%.200s': record %d: changed element %llu of %llu: %s", name, i,
                           (unsigned long long)k, (unsigned long long)count,
                           gap < 0 ? "a bad or cut varint gap" : "its gap runs past the range");
        pos += (uint64_t)gap;
        uint8_t *e = dst + pos * es;
        int nz = 0;
        for (uint32_t b = 0; b < es; b++) {
            uint8_t v = plane[(uint64_t)b * count + k];
            nz |= v;
            e[b] ^= v;
        }
        st->changed += nz != 0;
        if (nz && exp && elem_nonfinite(e, es, exp))
            note_nonfinite(st, d->off / es + pos);
        pos++;
    }
    if (at != vend)
        return rd_fail(RD_EFORMAT, "delta of '%.200s': record %d: %llu bytes of gaps for %llu changed elements, %llu "
                       "read", name, i, (unsigned long long)(vend - 4), (unsigned long long)count,
                       (unsigned long long)(at - 4));
    return 0;
}

int upd_delta_apply_rec(const upd_drec *d, int32_t i, uint8_t *t, uint32_t es, uint32_t exp, const char *name,
                        upd_drec_stat *st)
{
    return d->kind == UPD_DREC_RUNS ? apply_runs(d, i, t + d->off, es, exp, name, st)
         : d->kind == UPD_DREC_XOR_ZSTD ? apply_xor(d, i, t + d->off, es, exp, name, st)
                                        : apply_sparse(d, i, t + d->off, es, exp, name, st);
}

int upd_delta_decode(const uint8_t *w, uint64_t wn, uint8_t *t, uint64_t tn, uint32_t es, const char *name,
                     uint64_t *changed)
{
    upd_drec *r = NULL;
    int32_t n = 0;
    upd_drec_stat st = {0};
    int rc = upd_delta_parse(w, wn, tn, es, name, &r, &n);
    for (int32_t i = 0; !rc && i < n; i++)
        rc = upd_delta_apply_rec(&r[i], i, t, es, 0, name, &st);
    if (changed)
        *changed = st.changed;
    free(r);
    return rc;
}
