/* lora_held.c - see lora_held.h: the pushed adapters' bytes, the bases of their deltas. */
#include "daemon/update/lora_held.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/crc32c.h"
#include "base/err.h"
#include "engine/update/delta_codec.h"

void lh_adapter_free(lh_adapter *a)
{
    if (!a)
        return;
    for (int32_t i = 0; i < a->n; i++) {
        free(a->names ? a->names[i] : NULL);
        free(a->bytes ? a->bytes[i] : NULL);
    }
    free(a->names);
    free(a->dtype);
    free(a->nbytes);
    free(a->bytes);
    free(a);
}

void lh_free(lh_table *h)
{
    for (int32_t i = 0; i < h->n; i++)
        lh_adapter_free(h->a[i]);
    memset(h, 0, sizeof *h);
}

static const lh_adapter *find(const lh_table *h, const char *name)
{
    for (int32_t i = 0; i < h->n; i++)
        if (!strcmp(h->a[i]->name, name))
            return h->a[i];
    return NULL;
}

/* Index of tensor name in a, or -1. */
static int32_t tensor_of(const lh_adapter *a, const char *name)
{
    for (int32_t i = 0; i < a->n; i++)
        if (!strcmp(a->names[i], name))
            return i;
    return -1;
}

int lh_check(const lh_table *h, const char *name, uint64_t base_version, const upd_stage *st, char *why, size_t cap)
{
    const lh_adapter *a = find(h, name);
    if (!a || a->version != base_version) {
        if (a)
            snprintf(why, cap, "adapter '%s': deltas against version %llu; this daemon holds the bytes of version "
                     "%llu as pushed (push it whole, or a delta against %llu)", name,
                     (unsigned long long)base_version, (unsigned long long)a->version,
                     (unsigned long long)a->version);
        else
            snprintf(why, cap, "adapter '%s': deltas against version %llu; this daemon holds no pushed bytes of it "
                     "(loaded from a folder, evicted, or never pushed here): push it whole", name,
                     (unsigned long long)base_version);
        return LH_BASE_MISMATCH;
    }
    for (int32_t i = 0; i < st->n; i++) {
        const upd_tensor *t = &st->t[i];
        if (!t->delta)
            continue;
        int32_t k = tensor_of(a, t->name);
        if (k < 0 || a->dtype[k] != t->dtype || a->nbytes[k] != t->nbytes) {
            snprintf(why, cap, "adapter '%s': delta tensor '%.200s' %s in version %llu (push it whole)", name,
                     t->name, k < 0 ? "was not pushed" : "was pushed in another dtype or shape",
                     (unsigned long long)base_version);
            return LH_DTYPE_MISMATCH;
        }
    }
    return LH_OK;
}

/* RD_EINVAL naming the first NaN or infinity of a tensor's bytes, else 0. */
static int check_finite(const char *name, int dtype, const uint8_t *p, uint64_t nbytes)
{
    const uint32_t es = upd_dtype_size(dtype);
    for (uint64_t e = 0; e < nbytes / es; e++) {
        uint32_t v = 0;
        memcpy(&v, p + e * es, es);
        uint32_t mask = dtype == UPD_F32 ? UPD_EXP_F32 : dtype == UPD_F16 ? UPD_EXP_F16 : UPD_EXP_BF16;
        if ((v & mask) == mask)
            return upd_check_element(name, dtype, p, e);
    }
    return 0;
}

int lh_build(const lh_table *h, const char *name, uint64_t version, const upd_stage *st, lh_adapter **out,
             uint64_t *changed)
{
    *out = NULL;
    *changed = 0;
    const lh_adapter *base = find(h, name);
    lh_adapter *a = calloc(1, sizeof *a);
    if (a) {
        a->names = calloc((size_t)st->n, sizeof *a->names);
        a->dtype = calloc((size_t)st->n, sizeof *a->dtype);
        a->nbytes = calloc((size_t)st->n, sizeof *a->nbytes);
        a->bytes = calloc((size_t)st->n, sizeof *a->bytes);
    }
    if (!a || !a->names || !a->dtype || !a->nbytes || !a->bytes) {
        lh_adapter_free(a);
        return rd_fail(RD_ENOMEM, "adapter '%s': out of memory for its bytes", name);
    }
    snprintf(a->name, sizeof a->name, "%s", name);
    a->version = version;
    a->n = st->n;
    int rc = 0;
    for (int32_t i = 0; i < st->n && !rc; i++) {
        const upd_tensor *t = &st->t[i];
        a->dtype[i] = t->dtype;
        a->nbytes[i] = t->nbytes;
        if (!(a->names[i] = strdup(t->name)) || !(a->bytes[i] = malloc(t->nbytes ? t->nbytes : 1))) {
            rc = rd_fail(RD_ENOMEM, "adapter '%s': out of memory for its bytes", name);
            break;
        }
        if (!t->delta) {
            memcpy(a->bytes[i], t->data, t->nbytes);
        } else {
            /* lh_check found the base at BEGIN; nothing installs while this transfer is open. */
            int32_t k = base ? tensor_of(base, t->name) : -1;
            if (k < 0 || base->nbytes[k] != t->nbytes) {
                rc = rd_fail(RD_EINVAL, "adapter '%s': the base of delta tensor '%.200s' is gone", name, t->name);
                break;
            }
            memcpy(a->bytes[i], base->bytes[k], t->nbytes);
            uint64_t ch = 0;
            rc = upd_delta_decode(t->data, t->wire, a->bytes[i], t->nbytes, upd_dtype_size(t->dtype), t->name, &ch);
            if (rc)
                break;
            *changed += ch;
            uint32_t crc = crc32c(0, a->bytes[i], t->nbytes);
            if (crc != t->crc32c) {
                rc = rd_fail(RD_ECHECKSUM, "adapter '%s': tensor '%.200s' has CRC-32C %08x once its delta is "
                             "applied; the manifest says %08x", name, t->name, crc, t->crc32c);
                break;
            }
        }
        rc = check_finite(t->name, t->dtype, a->bytes[i], t->nbytes);
    }
    if (rc) {
        lh_adapter_free(a);
        return rc;
    }
    *out = a;
    return 0;
}

void lh_install(lh_table *h, lh_adapter *a)
{
    a->pushed = ++h->clock;
    for (int32_t i = 0; i < h->n; i++)
        if (!strcmp(h->a[i]->name, a->name)) {
            lh_adapter_free(h->a[i]);
            h->a[i] = a;
            return;
        }
    if (h->n == LH_MAX_ADAPTERS) { /* the least recently pushed makes room */
        int32_t old = 0;
        for (int32_t i = 1; i < h->n; i++)
            if (h->a[i]->pushed < h->a[old]->pushed)
                old = i;
        lh_adapter_free(h->a[old]);
        h->a[old] = h->a[--h->n];
    }
    h->a[h->n++] = a;
}
