/* delta.h - exact delta weight updates on the engine side (PROTOCOL.md §10.14).
 *
 * A delta tensor's chunks carry a delta stream instead of the tensor's bytes:
 * records, each covering a byte range of the new tensor, in increasing order
 * and never overlapping; bytes no record covers keep the base's value. A
 * record is a 24-byte head
 *     u8 kind (UPD_DREC_RUNS | UPD_DREC_XOR_ZSTD | UPD_DREC_SPARSE_ZSTD), u8[3] reserved = 0,
 *     u32 payload bytes, u64 out_offset, u64 out_bytes
 * (offset and length in bytes of the tensor, whole elements, out_bytes
 * 1..UPD_DELTA_MAX_RECORD) and its payload:
 *   RUNS      (u32 skip, u32 count, count values) pairs: skip unchanged
 *             elements from the end of the previous run (the record's start
 *             for the first), then count new values; every run inside the range;
 *   XOR_ZSTD  one zstd frame that decompresses to exactly out_bytes bytes,
 *             the XOR of the new range with the base's;
 *   SPARSE_ZSTD one zstd frame (its size stated) of the changed elements
 *             alone: u32 count, count LEB128 gaps between their indices,
 *             then their XORs with the base as byte planes.
 * The base is what the daemon serves for the tensor at base_version, in the
 * delta's dtype; the daemon only accepts a delta where it holds that tensor in
 * that dtype from an earlier push (upd_held) and not quantized. After applying,
 * the new bytes' CRC-32C must be the manifest's: else the transfer is refused.
 *
 * The sender picks the smaller encoding per record (tools/python/rolloutd/delta.py);
 * the records themselves are delta_codec.h's. */
#ifndef RD_UPDATE_DELTA_H
#define RD_UPDATE_DELTA_H

#include <stddef.h>
#include <stdint.h>

#include "engine/model/model.h"
#include "engine/update/delta_codec.h"
#include "engine/update/staging.h"

/* Checks every delta tensor's stream and place in the model, and arms
 * s->delta_group, which upd_build calls for each group with delta tensors
 * just before packing it: the group's base read from the model (the bytes
 * the backend holds, or fp32 narrowed exactly to the delta's dtype: it was
 * pushed in that dtype, so the round trip is exact; an inexact one fails),
 * the records applied on the pool (a value they write that is NaN or
 * infinite: RD_EINVAL naming the element) and each tensor's new bytes
 * checked against its manifest CRC-32C (RD_ECHECKSUM names it). s->delta_changed
 * gets the elements whose bits changed. The model is only read: decode goes on. */
int upd_delta_apply(const model *m, upd_stage *s);

/* Maps the buffer a group's new bytes are made in (sized for the largest
 * group with a delta tensor; once: the build maps it itself otherwise), and
 * touches every page of it: the daemon does this on a worker while the
 * chunks arrive, so the kernel's zeroing is off the build's path. */
int upd_delta_map(const model_config *c, upd_stage *s);
void upd_delta_prefault(upd_stage *s);

/* Which tensors a daemon holds as pushed: for each weight of the model, the
 * dtype of its last committed push, and whether it is served quantized. */
typedef struct upd_held upd_held;

int upd_held_create(const model_config *c, upd_held **out);
void upd_held_free(upd_held *h);
/* A copy (a transfer notes into it; the swap makes it the daemon's). */
int upd_held_copy(const upd_held *h, upd_held **out);
/* The tensors of s were swapped in: each is now held in its dtype (quantized
 * when serve quantizes its kind). */
void upd_held_note(upd_held *h, const model_config *c, const upd_stage *s, upd_serve serve);
/* The weights were replaced from elsewhere (a file): nothing is held as pushed. */
void upd_held_clear(upd_held *h);

enum { UPD_HELD_OK = 0, UPD_HELD_DTYPE = 1, UPD_HELD_QUANTIZED = 2 };
/* Checks every delta tensor of s against what is held: UPD_HELD_OK, or the
 * first refusal's kind with why (cap bytes) naming the tensor. */
int upd_held_check(const upd_held *h, const model_config *c, const upd_stage *s, char *why, size_t cap);

#endif
