/* lane.c - the head of an UPDATE_CHUNK frame on its own, for the data lane
 * (PROTOCOL.md §10.10): the reader learns where the data goes before it
 * reads it, and the writer sends the data from the tensor's memory as is.
 * Also where one frame ends in a stream of them (the relay's replies). */
#include <string.h>

#include "base/err.h"
#include "proto/proto.h"

static void put16(uint8_t *p, uint16_t v) { p[0] = (uint8_t)v, p[1] = (uint8_t)(v >> 8); }
static void put32(uint8_t *p, uint32_t v) { for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i)); }
static void put64(uint8_t *p, uint64_t v) { for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i)); }
static uint16_t get16(const uint8_t *p) { return (uint16_t)(p[0] | p[1] << 8); }
static uint32_t get32(const uint8_t *p) { uint32_t v = 0; for (int i = 3; i >= 0; i--) v = v << 8 | p[i]; return v; }
static uint64_t get64(const uint8_t *p) { uint64_t v = 0; for (int i = 7; i >= 0; i--) v = v << 8 | p[i]; return v; }

void proto_lane_encode_head(uint8_t out[PROTO_CHUNK_HEAD_BYTES], const proto_update_chunk *c)
{
    memcpy(out, PROTO_MAGIC, 4);
    put16(out + 4, PROTO_VERSION_MIN); /* UPDATE_CHUNK is the same in every version */
    put16(out + 6, PROTO_UPDATE_CHUNK);
    put32(out + 8, 32 + c->len);
    put32(out + 12, 0);
    uint8_t *b = out + PROTO_HEADER_BYTES;
    put64(b, c->xfer_id);
    put32(b + 8, c->chunk_seq);
    put32(b + 12, c->tensor_index);
    put64(b + 16, c->offset);
    put32(b + 24, c->crc32c);
    put32(b + 28, c->len);
}

int proto_lane_decode_head(const uint8_t in[PROTO_CHUNK_HEAD_BYTES], size_t max_len, proto_update_chunk *c,
                           uint32_t *wire_error)
{
    memset(c, 0, sizeof *c);
    if (memcmp(in, PROTO_MAGIC, 4)) {
        *wire_error = PROTO_E_BAD_MAGIC;
        return rd_fail(RD_EFORMAT, "data lane: the frame does not start with \"RLDP\"");
    }
    if (get16(in + 4) < PROTO_VERSION_MIN || get16(in + 4) > PROTO_VERSION) {
        *wire_error = PROTO_E_UNSUPPORTED_VERSION;
        return rd_fail(RD_EFORMAT, "data lane: protocol version %u; expected %d to %d", get16(in + 4),
                       PROTO_VERSION_MIN, PROTO_VERSION);
    }
    if (get16(in + 6) != PROTO_UPDATE_CHUNK) {
        *wire_error = PROTO_E_UNEXPECTED;
        return rd_fail(RD_EFORMAT, "data lane: message type 0x%02x; only UPDATE_CHUNK (0x11) travels here",
                       get16(in + 6));
    }
    uint32_t body = get32(in + 8);
    if (get32(in + 12) != 0) {
        *wire_error = PROTO_E_MALFORMED;
        return rd_fail(RD_EFORMAT, "data lane: header flags are %08x; expected 0", get32(in + 12));
    }
    const uint8_t *b = in + PROTO_HEADER_BYTES;
    c->xfer_id = get64(b);
    c->chunk_seq = get32(b + 8);
    c->tensor_index = get32(b + 12);
    c->offset = get64(b + 16);
    c->crc32c = get32(b + 24);
    c->len = get32(b + 28);
    if (max_len && (uint64_t)PROTO_HEADER_BYTES + body > max_len) {
        *wire_error = PROTO_E_TOO_LARGE;
        return rd_fail(RD_EFORMAT, "data lane: a %llu-byte frame; the limit is %zu",
                       (unsigned long long)PROTO_HEADER_BYTES + body, max_len);
    }
    if (body < 32 || body - 32 != c->len) {
        *wire_error = PROTO_E_MALFORMED;
        return rd_fail(RD_EFORMAT, "data lane: body_len %u does not equal 32 + the chunk's len %u", body, c->len);
    }
    return 0;
}

int proto_lane_next_frame(const uint8_t *buf, size_t len, size_t max_body, size_t *frame_len)
{
    *frame_len = 0;
    if (len < PROTO_HEADER_BYTES)
        return 0;
    uint32_t body = get32(buf + 8);
    /* Checked before waiting for the body: a reader's buffer holds at most
     * max_body after the header, so a longer one would never complete. */
    if (body > max_body)
        return rd_fail(RD_EFORMAT, "a frame with a %u-byte body; the limit here is %zu", body, max_body);
    if (len - PROTO_HEADER_BYTES < body)
        return 0;
    *frame_len = PROTO_HEADER_BYTES + (size_t)body;
    return 1;
}
