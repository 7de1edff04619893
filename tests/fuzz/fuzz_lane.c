/* fuzz_lane.c - libFuzzer target for the data lane's frame head
 * (proto_lane_decode_head, PROTOCOL.md §10.10).
 *
 * The first 48 bytes are a head (shorter inputs are zero-padded, as a reader
 * that has not filled its buffer must never decode), the next 8 the limit the
 * daemon passes (max_message_bytes, 0 = none). A head that decodes must
 * describe a frame within the limit whose body is 32 + len bytes, and encode
 * back to the same 48 bytes (the head is canonical); one that is refused must
 * leave a wire error code and a message. Build and run (make fuzz):
 *   build/fuzz/fuzz_lane -runs=10000000 */
#include "base/err.h"
#include "proto/proto.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    uint8_t head[PROTO_CHUNK_HEAD_BYTES] = {0};
    memcpy(head, data, size < sizeof head ? size : sizeof head);
    uint64_t limit = 0;
    if (size > sizeof head)
        memcpy(&limit, data + sizeof head, size - sizeof head < 8 ? size - sizeof head : 8);
    limit %= (uint64_t)1 << 40;
    proto_update_chunk c;
    uint32_t wire = 0;
    rd_fail(RD_OK, "%s", "");
    if (proto_lane_decode_head(head, (size_t)limit, &c, &wire)) {
        if (wire == 0 || rd_errmsg()[0] == 0)
            abort(); /* a refusal without a code or a message */
        return 0;
    }
    uint32_t body = (uint32_t)head[8] | (uint32_t)head[9] << 8 | (uint32_t)head[10] << 16 | (uint32_t)head[11] << 24;
    if (body != 32 + (uint64_t)c.len)
        abort();
    if (limit && PROTO_HEADER_BYTES + (uint64_t)body > limit)
        abort();
    uint8_t again[PROTO_CHUNK_HEAD_BYTES];
    proto_lane_encode_head(again, &c);
    if (memcmp(again, head, sizeof head))
        abort();
    return 0;
}
