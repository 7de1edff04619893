/* delta.c - decoding and applying delta tensors, and what a daemon holds as
 * pushed (delta.h). */
#include "engine/update/delta.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "base/crc32c.h"
#include "base/err.h"
#include "base/pool.h"
#include "engine/format/gguf.h"
#include "engine/format/safetensors.h"

/* ---------------------------------------------------------------- the base */


/* Where a staged tensor lives in the model: its group, [rows][cols] (rows 0:
 * a vector) and its first element in the group's buffer. */
static int locate(const model_config *c, const upd_tensor *t, int *g, int64_t *rows, int64_t *cols, int64_t *elem0)
{
    const arch_desc *a = arch_by_name(c->arch, strlen(c->arch));
    if (!a || t->kind < 0 || t->kind >= a->n_tensors)
        return rd_fail(RD_EINVAL, "delta of '%.200s': not a weight of this model", t->name);
    const arch_tensor *at = &a->tensors[t->kind];
    *g = (int)at->group;
    int linear = arch_group_is_linear(at->group);
    *rows = linear ? arch_dim_value(c, at->rows) : 0;
    *cols = arch_dim_value(c, at->cols);
    int64_t r0 = arch_tensor_row0(a, c, at);
    if (linear) {
        int64_t gr, gc;
        arch_group_shape(a, c, at->group, &gr, &gc);
        r0 *= gc;
    }
    *elem0 = r0;
    return 0;
}

/* ---- narrowing the served fp32 values to the pushed dtype, on the pool */

#define NARROW_SLICE (1u << 18) /* elements a task narrows */

typedef struct {
    const float *src;
    uint8_t *dst;
    uint64_t n;
    int dtype;
    int64_t bad;                /* the first element that does not round-trip (any slice's), or -1 */
} narrow_job;

static void narrow_task(void *ctx, int32_t i, int32_t worker)
{
    narrow_job *j = ctx;
    uint64_t off = (uint64_t)i * NARROW_SLICE, n = j->n - off < NARROW_SLICE ? j->n - off : NARROW_SLICE;
    if (j->dtype == UPD_F32) {
        memcpy(j->dst + 4 * off, j->src + off, 4 * n);
        return;
    }
    if (j->dtype == UPD_BF16) {
        /* bf16 is fp32's top half: exact when the low half is zero (a plain loop the compiler vectorizes;
         * NaN and infinity never reach a served weight) */
        uint32_t low = 0;
        for (uint64_t k = off; k < off + n; k++) {
            uint32_t u;
            memcpy(&u, &j->src[k], 4);
            low |= u & 0xFFFFu;
            j->dst[2 * k] = (uint8_t)(u >> 16);
            j->dst[2 * k + 1] = (uint8_t)(u >> 24);
        }
        if (!low)
            return;
    }
    for (uint64_t k = off; k < off + n; k++) {
        float v = j->src[k];
        uint16_t h = j->dtype == UPD_BF16 ? rd_f32_to_bf16(v) : st_f32_to_f16(v);
        float back = j->dtype == UPD_BF16 ? rd_bf16_to_f32(h) : rd_f16_to_f32(h);
        if (memcmp(&back, &v, sizeof v)) {
            __atomic_store_n(&j->bad, (int64_t)k, __ATOMIC_RELAXED);
            return;
        }
        j->dst[2 * k] = (uint8_t)h;
        j->dst[2 * k + 1] = (uint8_t)(h >> 8);
    }
}

/* ---- applying records, on the pool */

typedef struct {
    const upd_stage *s;
    const int32_t *rec_t;       /* [n] the record's tensor */
    const upd_drec *rec;        /* [n] */
    int32_t *rc;                /* [n] each record's result */
    upd_drec_stat *st;          /* [n] what each found */
} apply_job;

static uint32_t exp_of(int dtype) { return dtype == UPD_F32 ? UPD_EXP_F32 : dtype == UPD_F16 ? UPD_EXP_F16 : UPD_EXP_BF16; }

static void apply_task(void *ctx, int32_t i, int32_t worker)
{
    apply_job *j = ctx;
    upd_tensor *t = &j->s->t[j->rec_t[i]];
    j->st[i] = (upd_drec_stat){0};
    j->rc[i] = upd_delta_apply_rec(&j->rec[i], i, t->full, upd_dtype_size(t->dtype), exp_of(t->dtype), t->name, &j->st[i]);
}

/* ---- one group at a time
 *
 * The new bytes of a group's delta tensors are made just before upd_build
 * packs that group (upd_stage.delta_group), in one buffer sized for the
 * largest group: the base read as the backend holds it, the records applied,
 * each tensor's CRC-32C checked, then packed while the bytes are still in
 * cache. A whole model's new bytes never exist at once. */

/* Bytes of group g's buffer for a member of es-byte elements. */
static uint64_t group_bytes(const arch_desc *a, const model_config *c, int g, uint32_t es)
{
    int64_t r, cl;
    arch_group_shape(a, c, (arch_group)g, &r, &cl);
    return (uint64_t)((r ? r : 1) * cl) * es;
}

/* The element size a group's delta members are laid out with: the widest of
 * them (one dtype, the usual case, keeps q|k|v touching: one part, as a load). */
static uint32_t group_es(const model_config *c, const upd_stage *s, int g, int l, int ex)
{
    uint32_t es = 0;
    for (int32_t i = 0; i < s->n; i++) {
        const upd_tensor *t = &s->t[i];
        int tg = 0;
        int64_t r, cl, e0;
        if (t->delta && t->layer == l && t->expert == ex && !locate(c, t, &tg, &r, &cl, &e0) && tg == g &&
            upd_dtype_size(t->dtype) > es)
            es = upd_dtype_size(t->dtype);
    }
    return es;
}

/* The last delta's group buffer, kept for the next (a fresh mapping's pages
 * are faulted in zeroed, and on a VM that cost more than the apply). One
 * buffer: a second transfer at once maps its own. */
static pthread_mutex_t kept_mu = PTHREAD_MUTEX_INITIALIZER;
static void *kept;
static size_t kept_bytes;

static void release_group_buffer(void *p, size_t bytes)
{
    pthread_mutex_lock(&kept_mu);
    void *old = kept;
    size_t old_bytes = kept_bytes;
    if (!old || bytes >= old_bytes) {
        kept = p, kept_bytes = bytes;
        p = old, bytes = old_bytes;
    }
    pthread_mutex_unlock(&kept_mu);
    if (p)
        munmap(p, bytes);
}

static void *take_group_buffer(size_t bytes, size_t *got)
{
    void *p = NULL;
    pthread_mutex_lock(&kept_mu);
    if (kept && kept_bytes >= bytes) {
        p = kept, *got = kept_bytes;
        kept = NULL, kept_bytes = 0;
    }
    pthread_mutex_unlock(&kept_mu);
    return p;
}

int upd_delta_map(const model_config *c, upd_stage *s)
{
    if (s->full_mem)
        return 0;
    const arch_desc *a = arch_by_name(c->arch, strlen(c->arch));
    size_t bytes = 0;
    for (int32_t i = 0; i < s->n && a; i++) {
        const upd_tensor *t = &s->t[i];
        int g = 0;
        int64_t r, cl, e0;
        if (!t->delta || locate(c, t, &g, &r, &cl, &e0))
            continue;
        uint64_t b = group_bytes(a, c, g, upd_dtype_size(t->dtype) > 2 ? 4 : 2);
        if (b > bytes)
            bytes = b;
    }
    if (!bytes)
        return 0;
    bytes = (bytes + 63) & ~(size_t)63;
    size_t got = 0;
    void *p = take_group_buffer(bytes, &got);
    if (!p) {
        p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (p == MAP_FAILED)
            return rd_fail(RD_ENOMEM, "delta: cannot map %zu bytes for a group's new bytes", bytes);
#ifdef MADV_HUGEPAGE
        madvise(p, bytes, MADV_HUGEPAGE); /* as the staging area: 4 KiB page faults cost more than the copy */
#endif
        got = bytes;
    }
    s->full_mem = p;
    s->full_mem_bytes = got;
    s->full_mem_release = release_group_buffer;
    return 0;
}

void upd_delta_prefault(upd_stage *s)
{
    volatile uint8_t *p = s->full_mem;
    for (size_t o = 0; p && o < s->full_mem_bytes; o += 4096)
        p[o] = 0;
}

/* Reads the base of delta tensor t (group g, rows x cols from element elem0
 * of the group) into t->full: the backend's own bytes when it holds them in
 * t's dtype, else fp32 narrowed exactly (a base that does not narrow was not
 * pushed in that dtype: refused). */
static int read_base(const model *m, const upd_tensor *t, int g, int64_t rows, int64_t cols, int64_t elem0)
{
    rd_backend *be = m->be;
    void *const *slot = model_weight_slot((model *)m, (arch_group)g, t->layer, t->expert);
    int rc = rows && be->ops->linear_read_native
                 ? be->ops->linear_read_native(be, *slot, upd_dtype_ggml(t->dtype), (int32_t)(elem0 / cols), (int32_t)rows,
                                               t->full)
                 : RD_ENOTSUP;
    if (rc != RD_ENOTSUP)
        return rc;
    int64_t gr, gc;
    arch_group_shape(arch_by_name(m->cfg.arch, strlen(m->cfg.arch)), &m->cfg, (arch_group)g, &gr, &gc);
    float *buf = malloc(sizeof(float) * (size_t)((gr ? gr : 1) * gc));
    if (!buf)
        return rd_fail(RD_ENOMEM, "delta: out of memory reading the base of '%.200s'", t->name);
    rc = rows ? be->ops->linear_read(be, *slot, buf) : be->ops->d2h(be, buf, *slot, sizeof(float) * (size_t)gc);
    uint64_t n = (uint64_t)((rows ? rows : 1) * cols);
    narrow_job nj = {.src = buf + elem0, .dst = t->full, .n = n, .dtype = t->dtype, .bad = -1};
    if (!rc)
        pool_run((int32_t)((n + NARROW_SLICE - 1) / NARROW_SLICE), narrow_task, &nj);
    free(buf);
    if (!rc && nj.bad >= 0)
        rc = rd_fail(RD_EINVAL, "delta of '%.200s': the served element %lld is not a %s value; the tensor is not "
                     "held as pushed in that dtype", t->name, (long long)nj.bad, t->dtype == UPD_BF16 ? "bf16" : "f16");
    return rc;
}

static int delta_group(const model *m, upd_stage *s, int g, int l, int ex)
{
    const model_config *c = &m->cfg;
    int rc = upd_delta_map(c, s);
    if (rc)
        return rc;
    const uint32_t ges = group_es(c, s, g, l, ex);
    upd_drec *recs = NULL;
    int32_t *rec_t = NULL, k = 0, cap = 0;
    for (int32_t i = 0; i < s->n && !rc; i++) {
        upd_tensor *t = &s->t[i];
        int tg = 0;
        int64_t rows = 0, cols = 0, elem0 = 0;
        if (!t->delta || t->layer != l || t->expert != ex || locate(c, t, &tg, &rows, &cols, &elem0) || tg != g)
            continue;
        if ((uint64_t)elem0 * ges + t->nbytes > s->full_mem_bytes) {
            rc = rd_fail(RD_EINVAL, "delta of '%.200s': its bytes do not fit the group buffer", t->name);
            break;
        }
        t->full = (uint8_t *)s->full_mem + (uint64_t)elem0 * ges;
        if ((rc = read_base(m, t, g, rows, cols, elem0)))
            break;
        upd_drec *r = NULL;
        int32_t nr = 0;
        if ((rc = upd_delta_parse(t->data, t->wire, t->nbytes, upd_dtype_size(t->dtype), t->name, &r, &nr)))
            break;
        if (k + nr > cap) {
            cap = 2 * (k + nr);
            upd_drec *nrec = realloc(recs, sizeof *recs * (size_t)cap);
            int32_t *nt = nrec ? realloc(rec_t, sizeof *rec_t * 2 * (size_t)cap) : NULL;
            if (nrec)
                recs = nrec;
            if (nt)
                rec_t = nt;
            if (!nrec || !nt) {
                free(r);
                rc = rd_fail(RD_ENOMEM, "delta: out of memory");
                break;
            }
        }
        for (int32_t q = 0; q < nr; q++) {
            recs[k] = r[q];
            rec_t[k++] = i;
        }
        free(r);
    }
    upd_drec_stat *st = rc || !k ? NULL : calloc((size_t)k, sizeof *st);
    if (!rc && k && !st)
        rc = rd_fail(RD_ENOMEM, "delta: out of memory");
    if (!rc && k) {
        int32_t *rec_rc = rec_t + cap;
        apply_job aj = {.s = s, .rec_t = rec_t, .rec = recs, .rc = rec_rc, .st = st};
        pool_run(k, apply_task, &aj);
        for (int32_t q = 0; q < k && !rc; q++)
            if (rec_rc[q]) { /* again on this thread, for its message (the tensor is discarded anyway) */
                upd_tensor *t = &s->t[rec_t[q]];
                upd_drec_stat again = {0};
                rc = upd_delta_apply_rec(&recs[q], q, t->full, upd_dtype_size(t->dtype), 0, t->name, &again);
                if (!rc)
                    rc = rd_fail(RD_EFORMAT, "delta of '%.200s': a record failed on the pool", t->name);
            }
        /* Only the values the records wrote can be non-finite: the rest is
         * the served base, checked when it was pushed. Records are in tensor
         * order, so the first flagged one names the tensor's first such element. */
        for (int32_t q = 0; q < k && !rc; q++) {
            const upd_tensor *t = &s->t[rec_t[q]];
            if (st[q].nonfinite)
                rc = upd_check_element(t->name, t->dtype, t->full, st[q].nonfinite - 1);
            s->delta_changed += st[q].changed;
        }
    }
    free(st), free(recs), free(rec_t);
    for (int32_t i = 0; i < s->n && !rc; i++) {
        const upd_tensor *t = &s->t[i];
        int tg = 0;
        int64_t rows, cols, elem0;
        if (!t->delta || t->layer != l || t->expert != ex || locate(c, t, &tg, &rows, &cols, &elem0) || tg != g)
            continue;
        uint32_t got = crc32c(0, t->full, t->nbytes);
        if (got != t->crc32c)
            rc = rd_fail(RD_ECHECKSUM, "commit: delta tensor '%.200s' decodes to bytes of CRC-32C %08x; the manifest "
                         "says %08x (its base is not the sender's, or a chunk was corrupted before its CRC)",
                         t->name, got, t->crc32c);
    }
    return rc;
}

int upd_delta_apply(const model *m, upd_stage *s)
{
    s->delta_changed = 0;
    for (int32_t i = 0; i < s->n; i++) {
        upd_tensor *t = &s->t[i];
        if (!t->delta)
            continue;
        int32_t n;
        int g = 0;
        int64_t rows, cols, elem0;
        if (upd_delta_parse(t->data, t->wire, t->nbytes, upd_dtype_size(t->dtype), t->name, NULL, &n))
            return RD_EFORMAT;
        int rc = locate(&m->cfg, t, &g, &rows, &cols, &elem0);
        if (rc)
            return rc;
        t->full = NULL;
    }
    s->delta_group = delta_group;
    return 0;
}

/* ---------------------------------------------------------------- held */

struct upd_held {
    uint8_t *v;                 /* [n] per weight: 0 = not from a push, else 1 + dtype, | 0x80 quantized */
    size_t n;
    int32_t layers1, units;     /* n_layers + 1, experts (1 for dense) */
};

#define HELD_Q 0x80u

static size_t held_key(const upd_held *h, const upd_tensor *t)
{
    return ((size_t)t->kind * (size_t)h->layers1 + (size_t)(t->layer + 1)) * (size_t)h->units + (size_t)t->expert;
}

int upd_held_create(const model_config *c, upd_held **out)
{
    const arch_desc *a = arch_by_name(c->arch, strlen(c->arch));
    upd_held *h = calloc(1, sizeof *h);
    if (!h)
        return rd_fail(RD_ENOMEM, "held: out of memory");
    h->layers1 = c->n_layers + 1;
    h->units = c->n_experts > 1 ? c->n_experts : 1;
    h->n = (size_t)(a ? a->n_tensors : 1) * (size_t)h->layers1 * (size_t)h->units;
    if (!(h->v = calloc(h->n, 1))) {
        free(h);
        return rd_fail(RD_ENOMEM, "held: out of memory");
    }
    *out = h;
    return 0;
}

void upd_held_free(upd_held *h)
{
    if (!h)
        return;
    free(h->v);
    free(h);
}

int upd_held_copy(const upd_held *h, upd_held **out)
{
    upd_held *c = malloc(sizeof *c);
    if (!c || !(c->v = malloc(h->n))) {
        free(c);
        return rd_fail(RD_ENOMEM, "held: out of memory");
    }
    memcpy(c->v, h->v, h->n);
    c->n = h->n, c->layers1 = h->layers1, c->units = h->units;
    *out = c;
    return 0;
}

void upd_held_note(upd_held *h, const model_config *c, const upd_stage *s, upd_serve serve)
{
    for (int32_t i = 0; i < s->n; i++) {
        const upd_tensor *t = &s->t[i];
        size_t k = held_key(h, t);
        if (k < h->n)
            h->v[k] = (uint8_t)(1 + t->dtype) | (upd_kind_quantized(c, t->kind, serve) ? HELD_Q : 0);
    }
}

void upd_held_clear(upd_held *h) { memset(h->v, 0, h->n); }

static const char *dname(int d) { return d == UPD_F32 ? "f32" : d == UPD_F16 ? "f16" : "bf16"; }

int upd_held_check(const upd_held *h, const model_config *c, const upd_stage *s, char *why, size_t cap)
{
    for (int32_t i = 0; i < s->n; i++) {
        const upd_tensor *t = &s->t[i];
        if (!t->delta)
            continue;
        size_t k = held_key(h, t);
        uint8_t v = k < h->n ? h->v[k] : 0;
        if (v & HELD_Q) {
            snprintf(why, cap, "delta tensor '%.200s': this daemon serves it quantized (serve_dtype q8_0), so it "
                     "holds no exact %s base; push it whole", t->name, dname(t->dtype));
            return UPD_HELD_QUANTIZED;
        }
        if (v == 0) {
            snprintf(why, cap, "delta tensor '%.200s': this daemon holds it as loaded from its file, not from a "
                     "push; push it whole first", t->name);
            return UPD_HELD_DTYPE;
        }
        if (v - 1 != t->dtype) {
            snprintf(why, cap, "delta tensor '%.200s' is %s; this daemon holds it in %s from its last push; push it "
                     "whole", t->name, dname(t->dtype), dname(v - 1));
            return UPD_HELD_DTYPE;
        }
    }
    (void)c;
    return UPD_HELD_OK;
}
