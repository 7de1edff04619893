/* fuzz_delta.c - libFuzzer target for the delta stream decoder
 * (upd_delta_decode, engine/update/delta_codec.c, PROTOCOL.md §10.14): what a
 * daemon applies from a delta tensor's chunks, bytes a learner (or a relay
 * before it) chose.
 *
 * The input's first byte picks the element size (2 or 4 by its low bit) and
 * the tensor's size (1 + the next byte, in KiB, whole elements); the rest is
 * the stream, decoded onto a patterned base in an exactly sized heap buffer.
 * Properties: a refusal is RD_EFORMAT (or RD_ENOMEM) with a message; an
 * accepted stream changes only bytes inside its records' ranges (each
 * record's head read back here), its changed count is at most the elements
 * they cover, decoding it again from the base gives the same bytes, and a
 * plain second decoder written here (runs copied element by element, zstd
 * frames XORed byte by byte, sparse frames' gaps read bit by bit) gives the
 * same bytes as well.
 * Build and run (make fuzz):
 *   build/fuzz/fuzz_delta -runs=10000000 -max_len=65536 CORPUS
 * Seeds: python3 tests/fuzz/delta_seeds.py CORPUS */
#include "base/err.h"
#include "engine/update/delta_codec.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <zstd.h>

static uint64_t ld64(const uint8_t *p)
{
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 2)
        return 0;
    uint32_t es = data[0] & 1 ? 4 : 2;
    uint64_t tn = (1 + (uint64_t)data[1]) * 1024;
    const uint8_t *w = data + 2;
    uint64_t wn = size - 2;
    uint8_t *base = malloc(tn), *t = malloc(tn), *t2 = malloc(tn), *wc = malloc(wn ? wn : 1);
    uint8_t *cover = calloc(tn, 1), *ref = malloc(tn), *x = malloc(tn);
    if (!base || !t || !t2 || !wc || !cover || !ref || !x)
        abort();
    memcpy(wc, w, wn); /* exactly sized: a read past the stream is caught */
    for (uint64_t i = 0; i < tn; i++)
        base[i] = (uint8_t)(i * 131 + 7);
    memcpy(t, base, tn);
    uint64_t changed = 0;
    rd_fail(RD_OK, "%s", "");
    int rc = upd_delta_decode(wc, wn, t, tn, es, "fuzz", &changed);
    if (rc) {
        if ((rc != RD_EFORMAT && rc != RD_ENOMEM) || rd_errmsg()[0] == 0)
            abort();
    } else {
        uint64_t at = 0, covered = 0;
        memcpy(ref, base, tn);
        while (at < wn) { /* the decoder accepted it: every head is whole and in range */
            uint32_t payload;
            memcpy(&payload, wc + at + 4, 4);
            uint64_t off = ld64(wc + at + 8), len = ld64(wc + at + 16);
            if (off + len > tn)
                abort();
            memset(cover + off, 1, len);
            covered += len / es;
            const uint8_t *p = wc + at + UPD_DREC_HEAD;
            if (wc[at] == UPD_DREC_RUNS) { /* the reference: element by element */
                uint64_t q = 0, pos = 0;
                while (q < payload) {
                    uint32_t skip, count;
                    memcpy(&skip, p + q, 4);
                    memcpy(&count, p + q + 4, 4);
                    q += 8;
                    pos += skip;
                    for (uint32_t e = 0; e < count; e++, pos++)
                        for (uint32_t b = 0; b < es; b++)
                            ref[off + pos * es + b] = p[q + (uint64_t)e * es + b];
                    q += (uint64_t)count * es;
                }
            } else if (wc[at] == UPD_DREC_XOR_ZSTD) {
                if (ZSTD_decompress(x, len, p, payload) != len)
                    abort();
                for (uint64_t b = 0; b < len; b++)
                    ref[off + b] ^= x[b];
            } else { /* SPARSE_ZSTD: u32 count, LEB128 gaps, byte planes */
                unsigned long long rn = ZSTD_getFrameContentSize(p, payload);
                uint8_t *r = rn <= 4 + (len / es) * (5 + es) ? malloc(rn) : NULL;
                if (!r || ZSTD_decompress(r, rn, p, payload) != rn)
                    abort();
                uint32_t count;
                memcpy(&count, r, 4);
                uint64_t q = 4, pos = 0, planes = rn - (uint64_t)count * es;
                for (uint32_t e = 0; e < count; e++, pos++) {
                    uint64_t gap = 0;
                    for (int sh = 0;; sh += 7) {
                        gap |= (uint64_t)(r[q] & 0x7F) << sh;
                        if (!(r[q++] & 0x80))
                            break;
                    }
                    pos += gap;
                    for (uint32_t b = 0; b < es; b++)
                        ref[off + pos * es + b] ^= r[planes + (uint64_t)b * count + e];
                }
                if (q != planes || pos * es > len)
                    abort();
                free(r);
            }
            at += UPD_DREC_HEAD + (uint64_t)payload;
        }
        if (memcmp(ref, t, tn))
            abort(); /* the decoder and the plain reference disagree */
        for (uint64_t i = 0; i < tn; i++)
            if (!cover[i] && t[i] != base[i])
                abort(); /* a byte outside every record changed */
        if (changed > covered)
            abort();
        memcpy(t2, base, tn);
        if (upd_delta_decode(wc, wn, t2, tn, es, "fuzz", NULL) || memcmp(t, t2, tn))
            abort();
    }
    free(base), free(t), free(t2), free(wc), free(cover), free(ref), free(x);
    return 0;
}
