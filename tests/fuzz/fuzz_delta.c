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
 * they cover, and decoding it again from the base gives the same bytes.
 * Build and run (make fuzz):
 *   build/fuzz/fuzz_delta -runs=10000000 -max_len=65536 CORPUS
 * Seeds: python3 tests/fuzz/delta_seeds.py CORPUS */
#include "base/err.h"
#include "engine/update/delta_codec.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

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
    uint8_t *cover = calloc(tn, 1);
    if (!base || !t || !t2 || !wc || !cover)
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
        while (at < wn) { /* the decoder accepted it: every head is whole and in range */
            uint32_t payload;
            memcpy(&payload, wc + at + 4, 4);
            uint64_t off = ld64(wc + at + 8), len = ld64(wc + at + 16);
            if (off + len > tn)
                abort();
            memset(cover + off, 1, len);
            covered += len / es;
            at += UPD_DREC_HEAD + (uint64_t)payload;
        }
        for (uint64_t i = 0; i < tn; i++)
            if (!cover[i] && t[i] != base[i])
                abort(); /* a byte outside every record changed */
        if (changed > covered)
            abort();
        memcpy(t2, base, tn);
        if (upd_delta_decode(wc, wn, t2, tn, es, "fuzz", NULL) || memcmp(t, t2, tn))
            abort();
    }
    free(base), free(t), free(t2), free(wc), free(cover);
    return 0;
}
