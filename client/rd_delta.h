/* rd_delta.h - delta tensors for a push (PROTOCOL.md §10.14): the sender's
 * encoder in C, the same records as tools/python/rolloutd/delta.py (per
 * 1 MiB of the tensor, the smallest of (skip, count, values) runs, the
 * changed elements alone (SPARSE_ZSTD) and, where more than an eighth of it
 * changed, the XOR with the base compressed with zstd). rolloutctl
 * push-weights --base uses it. */
#ifndef RD_DELTA_H
#define RD_DELTA_H

#include <stdint.h>

#include "client/rd_push.h"

#define RDD_RECORD_BYTES (1u << 20)

/* Encodes the delta from base[0..n) to cur[0..n) (elements of es bytes, 2
 * or 4) into *out (malloc'd, *out_len bytes; free it); *changed gets the
 * elements whose bits differ. 0 or RD_ENOMEM / RD_EINVAL. */
int rdd_encode(const uint8_t *cur, const uint8_t *base, uint64_t n, uint32_t es, uint8_t **out, uint64_t *out_len,
               uint64_t *changed);
/* The records of bytes [0, n) of a tensor that start at its byte off0
 * (their heads say off0 + their offset), none where nothing changed (*out
 * may be NULL, *out_len 0): a part of a tensor, for encoders that split one
 * across threads (n a multiple of RDD_RECORD_BYTES except at the end). */
int rdd_encode_range(const uint8_t *cur, const uint8_t *base, uint64_t n, uint32_t es, uint64_t off0, uint8_t **out,
                     uint64_t *out_len, uint64_t *changed);
/* Frees a stream rdd_encode* returned (for callers outside C: ctypes). */
void rdd_stream_free(uint8_t *p);

/* For each of the n tensors of cur: a delta against the tensor of base with
 * the same name, dtype and size (at base_version), else the tensor as it is.
 * out[n] (calloc'd) points into cur or into the streams (bufs[n], NULL where
 * whole). Stats: the delta tensors, their elements and how many changed. */
typedef struct {
    rdp_tensor *ts;             /* [n] */
    uint8_t **bufs;             /* [n] the streams, or NULL */
    int n;
    int n_delta;
    uint64_t elems, changed, wire_bytes, tensor_bytes;
} rdd_set;

int rdd_make(const rdp_tensor *cur, int n, const rdp_tensor *base, int n_base, uint64_t base_version, rdd_set *out);
void rdd_free(rdd_set *s);

#endif
