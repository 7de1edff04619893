/* lora_held.h - the bytes of the adapters this daemon was pushed, kept as
 * the bases of delta pushes (PROTOCOL.md §10.15): a learner that pushed
 * version v of an adapter may send version v + 1 as deltas against v's
 * bytes, as a weight update's tensors (§10.14). The engine keeps its own
 * copy of an adapter in the backend's layout, so the bytes as pushed are
 * kept here: one copy per name, the last pushed version, at most
 * LH_MAX_ADAPTERS names (the least recently pushed goes first).
 *
 * Loop thread, except lh_build, which a worker runs while the table is
 * only read (one transfer at a time: nothing installs meanwhile). */
#ifndef RD_DAEMON_UPDATE_LORA_HELD_H
#define RD_DAEMON_UPDATE_LORA_HELD_H

#include <stddef.h>
#include <stdint.h>

#include "engine/model/lora.h"
#include "engine/update/staging.h"

#define LH_MAX_ADAPTERS 16

/* One adapter's tensors as pushed: [n] names, dtypes (upd_dtype) and bytes. */
typedef struct {
    char name[LORA_NAME_MAX];
    uint64_t version;
    int32_t n;
    char **names;               /* [n] PEFT names */
    int *dtype;                 /* [n] upd_dtype */
    uint64_t *nbytes;           /* [n] */
    uint8_t **bytes;            /* [n], each its own allocation */
    uint64_t pushed;            /* the table's clock at install: least is least recent */
} lh_adapter;

typedef struct {
    lh_adapter *a[LH_MAX_ADAPTERS];
    int32_t n;
    uint64_t clock;
} lh_table;

void lh_free(lh_table *h);
void lh_adapter_free(lh_adapter *a);

/* What lh_check found. */
enum { LH_OK = 0, LH_BASE_MISMATCH, LH_DTYPE_MISMATCH };

/* For a manifest with delta tensors of adapter name against base_version:
 * LH_BASE_MISMATCH when this daemon holds no pushed bytes of that name at
 * that version, LH_DTYPE_MISMATCH when a delta tensor is not held in its
 * dtype and size; why says which. */
int lh_check(const lh_table *h, const char *name, uint64_t base_version, const upd_stage *st, char *why, size_t cap);

/* The adapter's final bytes from a verified stage: whole tensors copied,
 * delta tensors decoded against the held base (each checked against its
 * crc32c, NaN and infinity refused). *changed: elements of the delta
 * tensors whose bits changed. RD_ECHECKSUM / RD_EFORMAT / RD_EINVAL name the
 * tensor; RD_ENOMEM. */
int lh_build(const lh_table *h, const char *name, uint64_t version, const upd_stage *st, lh_adapter **out,
             uint64_t *changed);

/* Keeps a (owned from here) as name's bytes, replacing what was held. */
void lh_install(lh_table *h, lh_adapter *a);

#endif
