/* fuzz_relay.c - libFuzzer target for what the data lane server and the
 * relay parse from a peer (PROTOCOL.md §10.10-10.12), all from one input:
 *
 * 1. the input's first 48 bytes (zero-padded) as a chunk head
 *    (proto_lane_decode_head, under the test config's 4 MiB limit): accepted
 *    means body_len = 32 + len within the limit and a canonical head;
 * 2. its first 56 bytes (zero-padded) as the LANE_AUTH a daemon with a secret
 *    reads first: proto_decode of exactly that frame; what decodes as a
 *    LANE_AUTH encodes back to the same 56 bytes, and a frame whose header
 *    says LANE_AUTH with a 40-byte body (what daemon/update/lane_server.c lets through to
 *    the decoder) decodes as nothing else;
 * 3. the whole input as the stream of reply frames a relay reads from the
 *    next daemon, delivered in pieces (sizes from the last byte) into a
 *    buffer of the relay's size: proto_lane_next_frame splits it (every frame
 *    is 16 + body_len bytes, within the bound; a refusal only for a body over
 *    it) and each frame goes to proto_decode: a decoded one re-encodes to
 *    the same bytes, a refused one leaves a wire code and a message. The
 *    bytes split plus what is left equal the bytes delivered. The same
 *    stream is split again under a bound of 0-255 bytes (the input's first
 *    byte), so the bound's edge is reached by inputs libFuzzer makes.
 * Every parser sees an exactly sized heap copy, so AddressSanitizer catches a
 * read past what was received. Build and run (make fuzz):
 *   python3 tests/fuzz/relay_seeds.py SEEDS
 *   build/fuzz/fuzz_relay -runs=10000000 -max_len=4096 -rss_limit_mb=4096 CORPUS SEEDS proto/testdata */
#include "base/err.h"
#include "proto/proto.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define RELAY_MAX_REPLY 65536                   /* daemon/update/relay.c's bound on a reply's body */
#define LANE_LIMIT (4u << 20)                   /* configs/test.json's max_message_bytes */
#define LANE_AUTH_FRAME (PROTO_HEADER_BYTES + 8 + PROTO_AUTH_BYTES)

static uint32_t get32(const uint8_t *p) { return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24; }

static uint8_t *copy(const uint8_t *p, size_t n)
{
    uint8_t *c = malloc(n ? n : 1);
    if (!c)
        abort();
    memcpy(c, p, n);
    return c;
}

/* A decoded frame re-encodes to its bytes (the codec is canonical); a
 * refused one says why. */
static void decode_frame(const uint8_t *f, size_t n, proto_msg *m, int *ok)
{
    uint8_t *c = copy(f, n);
    rd_fail(RD_OK, "%s", "");
    *ok = proto_decode(c, n, 0, m) == 0;
    if (*ok) {
        proto_buf b;
        proto_buf_init(&b);
        if (proto_encode(&b, m) || b.len != n || memcmp(b.data, c, n))
            abort();
        proto_buf_free(&b);
    } else if (m->wire_error == 0 || rd_errmsg()[0] == 0) {
        abort();
    }
    free(c);
}

static void chunk_head(const uint8_t *data, size_t size)
{
    uint8_t *h = calloc(1, PROTO_CHUNK_HEAD_BYTES);
    if (!h)
        abort();
    memcpy(h, data, size < PROTO_CHUNK_HEAD_BYTES ? size : PROTO_CHUNK_HEAD_BYTES);
    proto_update_chunk c;
    uint32_t wire = 0;
    rd_fail(RD_OK, "%s", "");
    if (proto_lane_decode_head(h, LANE_LIMIT, &c, &wire)) {
        if (wire == 0 || rd_errmsg()[0] == 0 || c.data)
            abort();
    } else {
        uint8_t again[PROTO_CHUNK_HEAD_BYTES];
        proto_lane_encode_head(again, &c);
        if (get32(h + 8) != 32 + (uint64_t)c.len || PROTO_HEADER_BYTES + 32 + (uint64_t)c.len > LANE_LIMIT ||
            memcmp(again, h, sizeof again))
            abort();
    }
    free(h);
}

static void lane_auth(const uint8_t *data, size_t size)
{
    uint8_t f[LANE_AUTH_FRAME] = {0};
    memcpy(f, data, size < sizeof f ? size : sizeof f);
    /* daemon/update/lane_server.c reads the header first and decodes only this shape */
    int shaped = !memcmp(f, PROTO_MAGIC, 4) && f[6] == PROTO_LANE_AUTH && f[7] == 0 && get32(f + 8) == 8 + PROTO_AUTH_BYTES;
    proto_msg m;
    int ok;
    decode_frame(f, sizeof f, &m, &ok);
    if (ok && shaped && m.type != PROTO_LANE_AUTH)
        abort();
    if (ok)
        proto_msg_free(&m);
}

static void reply_stream(const uint8_t *data, size_t size, size_t max_body)
{
    uint8_t *rbuf = malloc(PROTO_HEADER_BYTES + max_body); /* the relay's buffer: a header and the largest body */
    if (!rbuf)
        abort();
    size_t cap = PROTO_HEADER_BYTES + max_body;
    size_t piece = size ? 1 + data[size - 1] % 97 : 1, rgot = 0, split = 0;
    for (size_t at = 0; at < size;) {
        size_t n = size - at < piece ? size - at : piece;
        if (n > cap - rgot)
            n = cap - rgot;
        if (n == 0)
            abort(); /* the buffer is full yet holds no whole frame: next_frame let an oversized one wait */
        memcpy(rbuf + rgot, data + at, n);
        rgot += n;
        at += n;
        for (;;) {
            uint8_t *c = copy(rbuf, rgot);
            size_t len;
            rd_fail(RD_OK, "%s", "");
            int whole = proto_lane_next_frame(c, rgot, max_body, &len);
            free(c);
            if (whole < 0) {
                if (rgot < PROTO_HEADER_BYTES || get32(rbuf + 8) <= max_body || rd_errmsg()[0] == 0)
                    abort();
                free(rbuf);
                return; /* the relay fails the connection here */
            }
            if (!whole) {
                if (len != 0 || (rgot >= PROTO_HEADER_BYTES && PROTO_HEADER_BYTES + (size_t)get32(rbuf + 8) <= rgot))
                    abort();
                break;
            }
            if (len != PROTO_HEADER_BYTES + (size_t)get32(rbuf + 8) || len > rgot)
                abort();
            proto_msg m;
            int ok;
            decode_frame(rbuf, len, &m, &ok);
            if (ok)
                proto_msg_free(&m);
            memmove(rbuf, rbuf + len, rgot - len);
            rgot -= len;
            split += len;
        }
    }
    if (split + rgot != size)
        abort();
    free(rbuf);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    chunk_head(data, size);
    lane_auth(data, size);
    reply_stream(data, size, RELAY_MAX_REPLY);
    /* and under a small bound (from the first byte), so inputs of a few KiB reach it */
    reply_stream(data, size, size ? data[0] : 0);
    return 0;
}
