/* delta_codec.h - the records of a delta stream (PROTOCOL.md §10.14):
 * parsing the heads and applying one record to a tensor's bytes. Only the C
 * library and libzstd: the daemon's apply (delta.h) and the fuzzer use it.
 * The layout is delta.h's comment. */
#ifndef RD_UPDATE_DELTA_CODEC_H
#define RD_UPDATE_DELTA_CODEC_H

#include <stdint.h>

enum { UPD_DREC_RUNS = 1, UPD_DREC_XOR_ZSTD = 2, UPD_DREC_SPARSE_ZSTD = 3 };
#define UPD_DREC_HEAD 24
#define UPD_DELTA_MAX_RECORD (16u << 20) /* bytes of a tensor one record may cover */

/* Applies a delta stream (wire bytes w[0..wn)) to t[0..tn) in place: t holds
 * the base on entry and the new bytes on success. es is the element size;
 * *changed (may be NULL) gets the elements whose bits changed.
 * Records are checked before any is applied (bounds, order, kinds, run
 * lengths); a zstd frame of another size fails. RD_EFORMAT names the record
 * and what was wrong; t may then be partly written (the caller discards it). */
int upd_delta_decode(const uint8_t *w, uint64_t wn, uint8_t *t, uint64_t tn, uint32_t es, const char *name,
                     uint64_t *changed);

/* One record, as parsed. */
typedef struct {
    uint8_t kind;               /* UPD_DREC_* */
    uint32_t payload;           /* bytes after the head */
    uint64_t off, len;          /* the tensor's bytes it covers */
    const uint8_t *p;           /* the payload (inside the stream) */
} upd_drec;

/* Splits w[0..wn) into records, checking each head: kind, reserved bytes,
 * payload inside the stream, ranges whole elements (es bytes), in order,
 * inside a tensor of tn bytes. *n_out gets their count and, when out is not
 * NULL, *out a malloc'd array of them (free it). RD_EFORMAT names the record. */
int upd_delta_parse(const uint8_t *w, uint64_t wn, uint64_t tn, uint32_t es, const char *name, upd_drec **out,
                    int32_t *n_out);
/* What applying records found. */
typedef struct {
    uint64_t changed;           /* elements whose bits changed */
    uint64_t nonfinite;         /* 1 + the first element (of the tensor) the records made NaN or infinite; 0: none */
} upd_drec_stat;

/* The exponent bits of a dtype's elements, for upd_delta_apply_rec's check:
 * an element whose exponent is all ones is NaN or infinite. */
#define UPD_EXP_BF16 0x7F80u
#define UPD_EXP_F16 0x7C00u
#define UPD_EXP_F32 0x7F800000u

/* Applies record d (number i, for messages) to t in place, checking its
 * runs or zstd frame; st->changed += the elements whose bits it changed.
 * exp (UPD_EXP_*; 0: no check): the new values it writes are checked for
 * NaN and infinity (only those: the base it leaves is a served weight, which
 * was checked when it was pushed), st->nonfinite set at the first. */
int upd_delta_apply_rec(const upd_drec *d, int32_t i, uint8_t *t, uint32_t es, uint32_t exp, const char *name,
                        upd_drec_stat *st);

#endif
