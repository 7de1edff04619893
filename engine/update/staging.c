/* update.c - staging, conversion and swap of a live weight update (update.h). */
#include "engine/update/staging.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "base/crc32c.h"
#include "base/err.h"
#include "engine/format/gguf.h"
#include "engine/format/safetensors.h"
#include "engine/model/quant.h"
#include "engine/model/quant_fp8.h"
#include "base/pool.h"

/* ---------------------------------------------------------------- names */

/* Resolves an HF name through the family's table: the tensor (its index,
 * kind), layer (-1 for model-wide), expert (0 but for experts' tensors),
 * shape [rows][cols] (rows 0: a vector of cols) and its first element
 * inside its group's buffer. */
static int resolve(const model_config *c, const char *name, int *kind, int *layer, int *expert, int64_t *rows,
                   int64_t *cols, int64_t *elem0)
{
    const arch_desc *a = arch_by_name(c->arch, strlen(c->arch));
    const arch_tensor *t;
    int32_t l, e;
    if (!a || arch_resolve_hf(a, c, name, &t, &l, &e))
        return -1;
    *kind = (int)(t - a->tensors);
    *layer = l;
    *expert = e;
    int linear = arch_group_is_linear(t->group);
    *rows = linear ? arch_dim_value(c, t->rows) : 0;
    *cols = arch_dim_value(c, t->cols);
    int64_t at = arch_tensor_row0(a, c, t);
    if (linear) {
        int64_t gr, gc;
        arch_group_shape(a, c, t->group, &gr, &gc);
        at *= gc;
    }
    *elem0 = at;
    return 0;
}

static int group_of(const model_config *c, int kind)
{
    return (int)arch_by_name(c->arch, strlen(c->arch))->tensors[kind].group;
}

uint32_t upd_dtype_size(int dtype) { return dtype == UPD_F32 ? 4 : dtype == UPD_F16 || dtype == UPD_BF16 ? 2 : 0; }
int32_t upd_dtype_ggml(int dtype) { return dtype == UPD_F32 ? GGML_F32 : dtype == UPD_F16 ? GGML_F16 : GGML_BF16; }

/* ---------------------------------------------------------------- stage */

void upd_stage_free(upd_stage *s)
{
    if (!s)
        return;
    for (int32_t i = 0; i < s->n; i++) {
        free(s->t[i].name);
        free(s->t[i].ranges);
        free(s->t[i].q);
    }
    if (s->mem)
        munmap(s->mem, s->mem_bytes);
    if (s->full_mem && s->full_mem_release)
        s->full_mem_release(s->full_mem, s->full_mem_bytes);
    else if (s->full_mem)
        munmap(s->full_mem, s->full_mem_bytes);
    free(s->t);
    free(s);
}

static void shape_str(const upd_spec *sp, char *out, size_t cap)
{
    size_t k = (size_t)snprintf(out, cap, "[");
    for (int i = 0; i < sp->n_dims && k < cap; i++)
        k += (size_t)snprintf(out + k, cap - k, "%s%llu", i ? ", " : "", (unsigned long long)sp->shape[i]);
    if (k < cap)
        snprintf(out + k, cap - k, "]");
}

/* The refusal of a name that resolves to no weight: why, where the name has
 * one of the family's forms (a layer or expert number out of range or not
 * canonical), else the forms expected. */
static int unknown_name(const model_config *c, int32_t i, const char *name)
{
    const arch_desc *a = arch_by_name(c->arch, strlen(c->arch));
    char why[192], expert[128] = "";
    if (a && arch_hf_explain(a, c, name, why, sizeof why) == 0)
        return rd_fail(RD_EINVAL, "update: tensor %d '%.200s' is not a weight of this model: %s", i, name, why);
    for (int32_t k = 0; a && k < a->n_tensors && !*expert; k++)
        if (a->tensors[k].flags & AT_EXPERT) {
            char ex[64];
            arch_hf_name(&a->tensors[k], 0, 0, ex, sizeof ex);
            snprintf(expert, sizeof expert, "; each expert's tensors by its number, such as %s", ex);
        }
    return rd_fail(RD_EINVAL, "update: tensor %d '%.200s' is not a weight of this model (a %s model; expected "
                   "its HF names such as model.layers.0.self_attn.q_proj.weight%s%s)", i, name, c->arch, expert,
                   c->tied_embeddings ? "; lm_head.weight is tied to the embedding" : "");
}

/* Checks one manifest entry that resolved to a weight of [rows][cols]
 * (rows 0: a vector): dtype, shape and nbytes. */
static int check_spec(const upd_spec *sp, int64_t rows, int64_t cols)
{
    char got[128], want[64];
    if (!upd_dtype_size(sp->dtype))
        return rd_fail(RD_EINVAL, "update: tensor '%.200s' has dtype %d; expected f32, f16 or bf16", sp->name,
                       sp->dtype);
    shape_str(sp, got, sizeof got);
    if (rows)
        snprintf(want, sizeof want, "[%lld, %lld]", (long long)rows, (long long)cols);
    else
        snprintf(want, sizeof want, "[%lld]", (long long)cols);
    int ok = rows ? sp->n_dims == 2 && sp->shape[0] == (uint64_t)rows && sp->shape[1] == (uint64_t)cols
                  : sp->n_dims == 1 && sp->shape[0] == (uint64_t)cols;
    if (!ok)
        return rd_fail(RD_EINVAL, "update: tensor '%.200s' has shape %s; the model's is %s", sp->name, got, want);
    uint64_t elems = (uint64_t)(rows ? rows : 1) * (uint64_t)cols;
    if (sp->nbytes != elems * upd_dtype_size(sp->dtype))
        return rd_fail(RD_EINVAL, "update: tensor '%.200s' declares %llu bytes; %s of %s is %llu", sp->name,
                       (unsigned long long)sp->nbytes, got,
                       sp->dtype == UPD_F32 ? "f32" : sp->dtype == UPD_F16 ? "f16" : "bf16",
                       (unsigned long long)(elems * upd_dtype_size(sp->dtype)));
    return 0;
}

static int stage_alloc(const model_config *c, const upd_spec *specs, int32_t n, uint64_t total_bytes,
                       uint64_t max_bytes, upd_stage **out);

int upd_stage_create(const model_config *c, const upd_spec *specs, int32_t n, uint64_t total_bytes,
                     uint64_t max_bytes, upd_stage **out)
{
    *out = NULL;
    if (n < 1)
        return rd_fail(RD_EINVAL, "update: the manifest has no tensors; expected at least 1");
    /* A name twice is the same (tensor, layer, expert): names resolve one to
     * one (numbers canonical), so a table of first uses finds it in O(n);
     * comparing names pairwise took seconds on the loop thread for a MoE
     * manifest (Qwen3-30B-A3B: 18,867 tensors). */
    if (!c)
        return stage_alloc(NULL, specs, n, total_bytes, max_bytes, out);
    const arch_desc *a = arch_by_name(c->arch, strlen(c->arch));
    const int32_t units = c->n_experts > 1 ? c->n_experts : 1;
    int32_t *seen = calloc((size_t)(a ? a->n_tensors : 1) * (size_t)(c->n_layers + 1) * (size_t)units,
                           sizeof *seen);
    if (!seen)
        return rd_fail(RD_ENOMEM, "update: out of memory for the manifest");
    int rc = 0;
    for (int32_t i = 0; i < n && !rc; i++) {
        const upd_spec *sp = &specs[i];
        int kind, layer, expert;
        int64_t rows, cols, row0;
        if (resolve(c, sp->name, &kind, &layer, &expert, &rows, &cols, &row0)) {
            rc = unknown_name(c, i, sp->name);
            break;
        }
        int32_t *first = &seen[(kind * (c->n_layers + 1) + layer + 1) * units + expert];
        if (*first) {
            rc = rd_fail(RD_EINVAL, "update: tensor '%.200s' appears twice in the manifest (%d and %d)", sp->name,
                         *first - 1, i);
            break;
        }
        *first = i + 1;
        rc = check_spec(sp, rows, cols);
    }
    free(seen);
    return rc ? rc : stage_alloc(c, specs, n, total_bytes, max_bytes, out);
}

/* The tensors' nbytes against their shapes (a manifest no model checks:
 * c NULL), the sum, and the staging memory. */
static int stage_alloc(const model_config *c, const upd_spec *specs, int32_t n, uint64_t total_bytes,
                       uint64_t max_bytes, upd_stage **out)
{
    uint64_t sum = 0;
    for (int32_t i = 0; i < n; i++) {
        const upd_spec *sp = &specs[i];
        if (!c) {
            uint64_t elems = 1, bytes = 0;
            int over = 0;
            for (int d = 0; d < sp->n_dims && d < UPD_MAX_DIMS; d++)
                over |= __builtin_mul_overflow(elems, sp->shape[d], &elems);
            over |= __builtin_mul_overflow(elems, (uint64_t)upd_dtype_size(sp->dtype), &bytes);
            if (!upd_dtype_size(sp->dtype) || sp->n_dims < 1 || over || sp->nbytes != bytes)
                return rd_fail(RD_EINVAL, "update: tensor '%.200s' declares %llu bytes; its shape and dtype make "
                               "%llu", sp->name, (unsigned long long)sp->nbytes,
                               (unsigned long long)(elems * upd_dtype_size(sp->dtype)));
            for (int32_t k = 0; k < i; k++)
                if (!strcmp(specs[k].name, sp->name))
                    return rd_fail(RD_EINVAL, "update: tensor '%.200s' appears twice in the manifest (%d and %d)",
                                   sp->name, k, i);
        }
        if (sp->delta && sp->wire_bytes == 0)
            return rd_fail(RD_EINVAL, "update: delta tensor '%.200s' has wire_bytes 0; expected >= 1", sp->name);
        sum += sp->delta ? sp->wire_bytes : sp->nbytes;
    }
    if (sum != total_bytes)
        return rd_fail(RD_EINVAL, "update: total_bytes is %llu; the tensors add up to %llu",
                       (unsigned long long)total_bytes, (unsigned long long)sum);
    if (sum > max_bytes)
        return rd_fail(RD_EINVAL, "update: %llu bytes to stage; this daemon stages at most %llu (max_staging_bytes)",
                       (unsigned long long)sum, (unsigned long long)max_bytes);

    upd_stage *s = calloc(1, sizeof *s);
    if (!s || !(s->t = calloc((size_t)n, sizeof *s->t))) {
        free(s);
        return rd_fail(RD_ENOMEM, "update: out of memory for the manifest");
    }
    s->n = n;
    s->total_bytes = sum;
    /* One anonymous mapping for all tensors, on huge pages where the kernel
     * allows: the first touch of 4 KiB pages (a fault each, 130k for 500 MB)
     * would otherwise cost more than the copy into them. */
    size_t bytes = 0;
    for (int32_t i = 0; i < n; i++)
        bytes += ((specs[i].delta ? specs[i].wire_bytes : specs[i].nbytes) + 63) & ~(uint64_t)63;
    s->mem_bytes = bytes ? bytes : 64;
    s->mem = mmap(NULL, s->mem_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (s->mem == MAP_FAILED) {
        s->mem = NULL;
        upd_stage_free(s);
        return rd_fail(RD_ENOMEM, "update: cannot map %llu bytes of staging memory", (unsigned long long)sum);
    }
#ifdef MADV_HUGEPAGE
    madvise(s->mem, s->mem_bytes, MADV_HUGEPAGE);
#endif
    size_t at = 0;
    for (int32_t i = 0; i < n; i++) {
        const upd_spec *sp = &specs[i];
        upd_tensor *t = &s->t[i];
        int64_t rows, cols, row0;
        t->kind = t->layer = -1;
        if (c)
            resolve(c, sp->name, &t->kind, &t->layer, &t->expert, &rows, &cols, &row0);
        t->name = strdup(sp->name);
        t->dtype = sp->dtype;
        t->n_dims = sp->n_dims;
        memcpy(t->shape, sp->shape, sizeof t->shape);
        t->nbytes = sp->nbytes;
        t->crc32c = sp->crc32c;
        t->delta = sp->delta != 0;
        t->wire = t->delta ? sp->wire_bytes : sp->nbytes;
        t->data = (uint8_t *)s->mem + at;
        at += (t->wire + 63) & ~(uint64_t)63;
        if (!t->name) {
            upd_stage_free(s);
            return rd_fail(RD_ENOMEM, "update: cannot allocate %llu bytes of staging memory",
                           (unsigned long long)sum);
        }
    }
    *out = s;
    return 0;
}

/* Index of the first range with off >= x. */
static int32_t lower_bound(const upd_tensor *t, uint64_t x)
{
    int32_t lo = 0, hi = t->n_ranges;
    while (lo < hi) {
        int32_t mid = lo + (hi - lo) / 2;
        if (t->ranges[mid].off < x)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

int upd_chunk_claim(upd_stage *s, uint32_t ti, uint64_t off, uint32_t len, uint32_t crc, int *dup)
{
    *dup = 0;
    if (ti >= (uint32_t)s->n)
        return rd_fail(RD_EINVAL, "chunk: tensor_index %u; the manifest has %d tensors", ti, s->n);
    upd_tensor *t = &s->t[ti];
    if (len == 0 || off > t->wire || len > t->wire - off)
        return rd_fail(RD_EINVAL, "chunk: bytes [%llu, %llu) of '%.200s'; the tensor%s has %llu bytes (expected a "
                       "non-empty range inside it)", (unsigned long long)off, (unsigned long long)(off + len),
                       t->name, t->delta ? "'s delta" : "", (unsigned long long)t->wire);
    /* Bounds the bookkeeping: only a tensor's last chunk may be tiny. */
    if (len < UPD_MIN_CHUNK && off + len != t->wire)
        return rd_fail(RD_EINVAL, "chunk: %u bytes at %llu of '%.200s'; chunks must be at least %d bytes unless "
                       "they end the tensor", len, (unsigned long long)off, t->name, UPD_MIN_CHUNK);
    int32_t i = lower_bound(t, off);
    if (i < t->n_ranges) {
        const upd_range *r = &t->ranges[i];
        if (r->off == off && r->len == len && r->crc32c == crc) {
            if (r->done) {
                *dup = 1;
                return 0;
            }
            /* A resend (after a timeout) while the first copy is still being checked. */
            return rd_fail(RD_EBUSY, "chunk: bytes [%llu, %llu) of '%.200s' are being staged from an earlier copy; "
                           "resend after its reply", (unsigned long long)off, (unsigned long long)(off + len), t->name);
        }
        if (r->off < off + len)
            return rd_fail(RD_EINVAL, "chunk: bytes [%llu, %llu) of '%.200s' overlap a chunk %s at [%llu, %llu) "
                           "with other data; expected each byte sent once (a resend must repeat the same chunk)",
                           (unsigned long long)off, (unsigned long long)(off + len), t->name,
                           r->done ? "staged" : "being staged", (unsigned long long)r->off,
                           (unsigned long long)(r->off + r->len));
    }
    if (i > 0) {
        const upd_range *r = &t->ranges[i - 1];
        if (r->off + r->len > off)
            return rd_fail(RD_EINVAL, "chunk: bytes [%llu, %llu) of '%.200s' overlap a chunk at [%llu, %llu)",
                           (unsigned long long)off, (unsigned long long)(off + len), t->name,
                           (unsigned long long)r->off, (unsigned long long)(r->off + r->len));
    }
    if (t->n_ranges == t->cap_ranges) {
        int32_t nc = t->cap_ranges ? t->cap_ranges * 2 : 16;
        upd_range *nr = realloc(t->ranges, sizeof *nr * (size_t)nc);
        if (!nr)
            return rd_fail(RD_ENOMEM, "chunk: out of memory");
        t->ranges = nr;
        t->cap_ranges = nc;
    }
    memmove(t->ranges + i + 1, t->ranges + i, sizeof *t->ranges * (size_t)(t->n_ranges - i));
    t->ranges[i] = (upd_range){.off = off, .len = len, .crc32c = crc, .done = 0};
    t->n_ranges++;
    s->pending++;
    return 0;
}

int upd_chunk_fill(upd_stage *s, uint32_t ti, uint64_t off, const void *data, uint32_t len, uint32_t crc)
{
    upd_tensor *t = &s->t[ti];
    uint32_t got = crc32c(0, data, len);
    if (got != crc)
        return rd_fail(RD_ECHECKSUM, "chunk: bytes [%llu, %llu) of '%.200s' have CRC-32C %08x; the chunk says %08x "
                       "(resend it)", (unsigned long long)off, (unsigned long long)(off + len), t->name, got, crc);
    memcpy(t->data + off, data, len);
    return 0;
}

int upd_chunk_check(upd_stage *s, uint32_t ti, uint64_t off, const void *data, uint32_t len, uint32_t crc)
{
    uint32_t got = crc32c(0, data, len);
    if (got != crc)
        return rd_fail(RD_ECHECKSUM, "chunk: bytes [%llu, %llu) of '%.200s' have CRC-32C %08x; the chunk says %08x "
                       "(resend it)", (unsigned long long)off, (unsigned long long)(off + len), s->t[ti].name, got, crc);
    return 0;
}

void upd_chunk_settle(upd_stage *s, uint32_t ti, uint64_t off, int ok)
{
    upd_tensor *t = &s->t[ti];
    int32_t i = lower_bound(t, off);
    if (i >= t->n_ranges || t->ranges[i].off != off || t->ranges[i].done)
        return;
    s->pending--;
    if (ok) {
        t->ranges[i].done = 1;
        t->staged += t->ranges[i].len;
        s->staged_bytes += t->ranges[i].len;
        return;
    }
    memmove(t->ranges + i, t->ranges + i + 1, sizeof *t->ranges * (size_t)(t->n_ranges - i - 1));
    t->n_ranges--;
}

int upd_stage_verify(const upd_stage *s)
{
    if (s->pending)
        return rd_fail(RD_EINVAL, "commit: %d chunks are still being staged; expected every chunk acknowledged first",
                       s->pending);
    for (int32_t i = 0; i < s->n; i++) {
        const upd_tensor *t = &s->t[i];
        uint64_t at = 0;
        uint32_t crc = 0;
        for (int32_t k = 0; k < t->n_ranges; k++) {
            const upd_range *r = &t->ranges[k];
            if (r->off != at)
                break;
            crc = crc32c_combine(crc, r->crc32c, r->len);
            at += r->len;
        }
        if (at != t->wire)
            return rd_fail(RD_EINVAL, "commit: tensor '%.200s' is missing bytes from offset %llu (%llu of %llu "
                           "staged); expected every byte of every manifest tensor", t->name,
                           (unsigned long long)at, (unsigned long long)t->staged, (unsigned long long)t->wire);
        if (!t->delta && crc != t->crc32c)
            return rd_fail(RD_ECHECKSUM, "commit: tensor '%.200s' has CRC-32C %08x; the manifest says %08x", t->name,
                           crc, t->crc32c);
    }
    return 0;
}

/* ---------------------------------------------------------------- build */

/* The tensor's new bytes [nbytes]: the staged copy, or a delta's once applied. */
static const uint8_t *vals(const upd_tensor *t) { return t->delta ? t->full : t->data; }

typedef struct {
    int group, layer, expert;
    int is_linear;              /* 1: a linear handle; 0: a backend vector */
    void *ptr;                  /* the new buffer until applied, then the old one */
    uint64_t bytes;
} upd_entry;

struct upd_patch {
    upd_entry *e;               /* [n] */
    int32_t n;
    int applied;
};

/* Rows and columns of a group's buffer (rows 0: a vector). */
static void group_shape(const model_config *c, int group, int64_t *rows, int64_t *cols)
{
    arch_group_shape(arch_by_name(c->arch, strlen(c->arch)), c, (arch_group)group, rows, cols);
    if (!arch_group_is_linear((arch_group)group))
        *rows = 0;
}

/* Converts a staged tensor to fp32 (check_finite has refused non-finite
 * values; this second look costs nothing on the fp32 path). */
static int to_f32(const upd_tensor *t, float *dst, uint64_t n)
{
    for (uint64_t i = 0; i < n; i++) {
        float v;
        if (t->dtype == UPD_F32) {
            memcpy(&v, vals(t) + 4 * i, 4);
        } else {
            uint16_t h;
            memcpy(&h, vals(t) + 2 * i, 2);
            v = t->dtype == UPD_BF16 ? rd_bf16_to_f32(h) : rd_f16_to_f32(h);
        }
        if (!isfinite(v))
            return rd_fail(RD_EINVAL, "commit: tensor '%.200s' element %llu is %s; expected finite weights",
                           t->name, (unsigned long long)i, isnan(v) ? "NaN" : "infinite");
        dst[i] = v;
    }
    return 0;
}

void upd_patch_free(rd_backend *be, upd_patch *p)
{
    if (!p)
        return;
    for (int32_t i = 0; i < p->n; i++) {
        if (!p->e[i].ptr)
            continue;
        if (p->e[i].is_linear)
            be->ops->linear_free(be, p->e[i].ptr);
        else
            be->ops->free(be, p->e[i].ptr);
    }
    free(p->e);
    free(p);
}

uint64_t upd_patch_bytes(const upd_patch *p)
{
    uint64_t b = 0;
    for (int32_t i = 0; p && i < p->n; i++)
        b += p->e[i].bytes;
    return b;
}

/* ---- non-finite check, on the pool: every staged byte is read once. */

#define FIN_SLICE (1u << 20)    /* bytes a task checks */

typedef struct {
    const upd_stage *s;
    int32_t *first;             /* [n_slices]: its tensor, or -1 when the slice is fine */
    int32_t n_slices;
    const int32_t *slice_t;     /* [n_slices] tensor index */
    const uint64_t *slice_off;  /* [n_slices] byte offset in it */
} fin_job;

/* 1 if any element of n bytes at p of this dtype is NaN or infinite (the
 * exponent all ones). Eight bytes at a time: a lane's exponent bits XOR the
 * all-ones exponent are zero exactly when it is all ones, and a zero lane is
 * found with the borrow trick (the top bit of every lane of x is 0). */
static int has_nonfinite(int dtype, const uint8_t *p, uint64_t n)
{
    const uint64_t e = dtype == UPD_F32 ? 0x7f8000007f800000ull
                     : dtype == UPD_BF16 ? 0x7f807f807f807f80ull : 0x7c007c007c007c00ull;
    const uint64_t one = dtype == UPD_F32 ? 0x0000000100000001ull : 0x0001000100010001ull;
    const uint64_t top = dtype == UPD_F32 ? 0x8000000080000000ull : 0x8000800080008000ull;
    uint64_t bad = 0, i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t v;
        memcpy(&v, p + i, 8);
        uint64_t x = (v & e) ^ e;
        bad |= (x - one) & ~x & top;
    }
    const uint32_t es = dtype == UPD_F32 ? 4 : 2, e1 = es == 4 ? (uint32_t)e : (uint16_t)e;
    for (; i + es <= n; i += es) {
        uint32_t v = 0;
        memcpy(&v, p + i, es);
        bad |= (v & e1) == e1;
    }
    return bad != 0;
}

static void fin_task(void *ctx, int32_t i, int32_t worker)
{
    fin_job *j = ctx;
    const upd_tensor *t = &j->s->t[j->slice_t[i]];
    uint64_t off = j->slice_off[i], n = t->nbytes - off < FIN_SLICE ? t->nbytes - off : FIN_SLICE;
    j->first[i] = has_nonfinite(t->dtype, vals(t) + off, n) ? j->slice_t[i] : -1;
}

int upd_check_element(const char *name, int dtype, const uint8_t *p, uint64_t e)
{
    float v;
    if (dtype == UPD_F32) {
        memcpy(&v, p + 4 * e, 4);
    } else {
        uint16_t h;
        memcpy(&h, p + 2 * e, 2);
        v = dtype == UPD_BF16 ? rd_bf16_to_f32(h) : rd_f16_to_f32(h);
    }
    if (isfinite(v))
        return 0;
    return rd_fail(RD_EINVAL, "commit: tensor '%.200s' element %llu is %s; expected finite weights", name,
                   (unsigned long long)e, isnan(v) ? "NaN" : "infinite");
}

/* Refuses non-finite values: a NaN weight would make every sequence fail,
 * so it never reaches the model. The error names the first such element.
 * Checks the tensors with sel[i] set. */
static int check_finite(const upd_stage *s, const uint8_t *sel)
{
    int32_t n = 0;
    for (int32_t i = 0; i < s->n; i++)
        n += sel[i] ? (int32_t)((s->t[i].nbytes + FIN_SLICE - 1) / FIN_SLICE) : 0;
    if (!n)
        return 0;
    int32_t *first = malloc(sizeof(int32_t) * 2 * (size_t)(n ? n : 1));
    uint64_t *off = malloc(sizeof(uint64_t) * (size_t)(n ? n : 1));
    if (!first || !off) {
        free(first), free(off);
        return rd_fail(RD_ENOMEM, "commit: out of memory checking the update");
    }
    int32_t *slice_t = first + n, k = 0;
    for (int32_t i = 0; i < s->n; i++)
        for (uint64_t o = 0; sel[i] && o < s->t[i].nbytes; o += FIN_SLICE) {
            slice_t[k] = i;
            off[k++] = o;
        }
    fin_job j = {.s = s, .first = first, .n_slices = n, .slice_t = slice_t, .slice_off = off};
    pool_run(n, fin_task, &j);
    int rc = 0;
    for (int32_t i = 0; i < n && !rc; i++) {
        if (first[i] < 0)
            continue;
        const upd_tensor *t = &s->t[first[i]];
        uint32_t es = upd_dtype_size(t->dtype);
        for (uint64_t e = off[i] / es; e < t->nbytes / es && !rc; e++)
            rc = upd_check_element(t->name, t->dtype, vals(t), e);
    }
    free(first), free(off);
    return rc;
}

/* Narrows n fp32 values to dtype (bf16 or f16) into dst when every one
 * survives the round trip exactly; 0 if not (dst then holds garbage). */
static int narrow_exact(const float *src, uint64_t n, int dtype, uint16_t *dst)
{
    for (uint64_t i = 0; i < n; i++) {
        uint16_t h = dtype == UPD_BF16 ? rd_f32_to_bf16(src[i]) : st_f32_to_f16(src[i]);
        float back = dtype == UPD_BF16 ? rd_bf16_to_f32(h) : rd_f16_to_f32(h);
        if (memcmp(&back, &src[i], sizeof back))
            return 0;
        dst[i] = h;
    }
    return 1;
}

/* Builds linear group g (layer l) in the pushed dtypes: one rd_wpart per
 * member (HF rows as staged: the bytes are what linear_load_q takes), with
 * members the stage does not cover read back from the model (fp32, or the
 * pushed neighbour's 16-bit dtype when that is exact: a partial bf16 push
 * onto bf16 weights stays bf16). Adjacent members of one dtype whose bytes
 * are contiguous become one part, as a load of the same tensors makes.
 * 1 (not an error) when the group's members are not stacked in table order:
 * the caller takes the fp32 path. */
static int build_group_native(const model *m, const upd_stage *s, int g, int l, int ex, float *buf,
                              uint16_t *nbuf, void **out)
{
    const model_config *c = &m->cfg;
    const arch_desc *a = arch_by_name(c->arch, strlen(c->arch));
    rd_backend *be = m->be;
    int64_t rows, cols;
    arch_group_shape(a, c, (arch_group)g, &rows, &cols);
    struct { int staged; int dtype; int64_t row0, rows; const uint8_t *data; } mem[RD_WPART_MAX];
    int n_mem = 0, have_old = 0, any_staged = 0;
    int64_t next = 0;
    for (int32_t i = 0; i < a->n_tensors; i++) {
        const arch_tensor *t = &a->tensors[i];
        if ((int)t->group != g)
            continue;
        int64_t at = arch_tensor_row0(a, c, t), tr = arch_dim_value(c, t->rows), tc = arch_dim_value(c, t->cols);
        if (at != next || tc != cols || n_mem == RD_WPART_MAX)
            return 1;
        next = at + tr;
        const upd_tensor *st = NULL;
        for (int32_t j = 0; j < s->n && !st; j++)
            if (s->t[j].kind == i && s->t[j].layer == l && s->t[j].expert == ex)
                st = &s->t[j];
        mem[n_mem].staged = st != NULL;
        mem[n_mem].dtype = st ? st->dtype : UPD_F32;
        mem[n_mem].row0 = at;
        mem[n_mem].rows = tr;
        mem[n_mem].data = st ? vals(st) : NULL;
        any_staged |= st != NULL;
        n_mem++;
    }
    if (next != rows || !any_staged)
        return 1;
    uint16_t *nat = nbuf;
    for (int i = 0; i < n_mem; i++) {
        if (mem[i].staged)
            continue;
        if (!have_old) {
            int rc = be->ops->linear_read(be, *model_weight_slot((model *)m, (arch_group)g, l, ex), buf);
            if (rc)
                return rc;
            have_old = 1;
        }
        const float *src = buf + mem[i].row0 * cols;
        uint64_t n = (uint64_t)(mem[i].rows * cols);
        int want = i > 0 && mem[i - 1].staged ? mem[i - 1].dtype
                 : i + 1 < n_mem && mem[i + 1].staged ? mem[i + 1].dtype : UPD_F32;
        if (want != UPD_F32 && narrow_exact(src, n, want, nat)) {
            mem[i].dtype = want;
            mem[i].data = (const uint8_t *)nat;
            nat += n;
        } else {
            mem[i].data = (const uint8_t *)src;
        }
    }
    rd_wpart parts[RD_WPART_MAX];
    int32_t n_parts = 0;
    for (int i = 0; i < n_mem; i++) {
        rd_wpart *last = n_parts ? &parts[n_parts - 1] : NULL;
        if (last && last->type == upd_dtype_ggml(mem[i].dtype) &&
            (const uint8_t *)last->data + (size_t)last->rows * cols * upd_dtype_size(mem[i].dtype) == mem[i].data) {
            last->rows += (int32_t)mem[i].rows;
            continue;
        }
        parts[n_parts++] = (rd_wpart){.type = upd_dtype_ggml(mem[i].dtype), .rows = (int32_t)mem[i].rows,
                                      .data = mem[i].data};
    }
    return be->ops->linear_load_q(be, parts, n_parts, (int32_t)cols, out);
}

/* The type a linear group is served in under serve, or -1: as pushed.
 *
 * q8_0: llama.cpp's choice for a Q8_0 file (llama-quant.cpp with
 * LLAMA_FTYPE_MOSTLY_Q8_0, convert_hf_to_gguf.py --outtype q8_0): every 2-D
 * linear weight, the token embedding and the LM head included (Q8_0 is the
 * one type llama.cpp leaves output.weight in rather than raising it to Q6_K,
 * and token_embd follows the file type), so a Q8_0 GGUF of the same weights
 * serves the same bits.
 *
 * q4_k: Q4_K for the layers' linears whose rows are whole 256-element
 * blocks; Q8_0 for the embedding, the LM head (the log-probs' last product:
 * llama.cpp's Q4_K files raise it to Q6_K, which has no quantizer here) and
 * rows that are not whole 256-blocks (llama.cpp falls back to Q5_0 there;
 * SmolLM2's and Gemma 3 270M's hidden sizes, 576 and 640, are such rows).
 *
 * fp8: FP8 blocks (engine/model/quant_fp8.h) for the layers' dense linears,
 * run by the CUDA backend's FP8 GEMM; the embedding and the LM head stay as
 * pushed (vLLM's and verl's FP8 rollouts keep them bf16: the head's products
 * are the log-probs themselves), and so do MoE experts (the CUDA moe_ffn
 * reads bf16 weights).
 *
 * Never quantized: norms and biases (vectors, fp32), the MoE router
 * (ffn_gate_inp: llama.cpp never quantizes it, the converter keeps it f32:
 * the top-k choice is that sensitive), and rows not in whole blocks of the
 * type (they stay as pushed). */
static int serve_type(upd_serve serve, int g, int64_t cols)
{
    if (serve == UPD_SERVE_AS_PUSHED || !arch_group_is_linear((arch_group)g) || g == AG_ROUTER)
        return -1;
    const int outer = g == AG_EMBED || g == AG_LM_HEAD;
    switch (serve) {
    case UPD_SERVE_Q8_0:
        return cols % GGML_Q8_0_BLOCK == 0 ? GGML_Q8_0 : -1;
    case UPD_SERVE_Q4_K:
        if (!outer && cols % GGML_Q4_K_BLOCK == 0)
            return GGML_Q4_K;
        return cols % GGML_Q8_0_BLOCK == 0 ? GGML_Q8_0 : -1;
    case UPD_SERVE_FP8:
        return !outer && !arch_group_per_expert((arch_group)g) && cols % RD_FP8_BLOCK == 0 ? RD_TYPE_FP8_B32 : -1;
    default:
        return -1;
    }
}

/* A quantizer of n values (n a whole number of its blocks) into bytes. */
typedef int (*quant_fn)(const float *x, uint64_t n, uint8_t *out);

static quant_fn quantizer(int type)
{
    return type == GGML_Q8_0 ? ggml_quant_q8_0 : type == GGML_Q4_K ? ggml_quant_q4_k : rd_fp8_quant;
}

/* ---- Quantization on the pool: a group of the default model is up to 28M
 * values (the embedding), ~0.1 s on one core in Q8_0. Slices and tiles are
 * whole blocks of every type (32 or 256 values). */

#define Q8_SLICE (1u << 16)     /* values a task quantizes */

typedef struct {
    const upd_tensor *t;        /* the staged values to quantize; NULL: x's */
    float *x;                   /* [n] fp32 (when t is NULL) */
    uint8_t *q;                 /* [n / blck] blocks */
    uint64_t n;
    int type;                   /* GGML_Q8_0, GGML_Q4_K or RD_TYPE_FP8_B32 */
    quant_fn quant;
    size_t blck, bytes;         /* the type's values and bytes per block */
    int failed;                 /* set (atomically) when a slice could not be quantized */
} q8_job;

#define Q8_TILE 2048            /* values widened at a time into a task's stack (8 KiB: stays in L1) */

static void q8_task(void *ctx, int32_t i, int32_t worker)
{
    q8_job *j = ctx;
    uint64_t off = (uint64_t)i * Q8_SLICE, n = j->n - off < Q8_SLICE ? j->n - off : Q8_SLICE;
    uint8_t *q = j->q + off / j->blck * j->bytes;
    if (!j->t) {
        if (j->quant(j->x + off, n, q))
            __atomic_store_n(&j->failed, 1, __ATOMIC_RELAXED);
        return;
    }
    /* Staged 16-bit values are widened tile by tile, not into the group's
     * fp32 buffer: writing 4 bytes per weight to memory and reading them back
     * cost more than the quantization. check_finite has already refused
     * non-finite values. */
    float tile[Q8_TILE];
    for (uint64_t t0 = off; t0 < off + n; t0 += Q8_TILE) {
        uint64_t tn = off + n - t0 < Q8_TILE ? off + n - t0 : Q8_TILE;
        const float *src = tile;
        if (j->t->dtype == UPD_F32) {
            memcpy(tile, vals(j->t) + 4 * t0, 4 * tn);
        } else if (j->t->dtype == UPD_BF16) {
            /* bf16 is fp32's top half: a shift, inlined (a call per value was a tenth of the build). */
            const uint8_t *p = vals(j->t) + 2 * t0;
            for (uint64_t k = 0; k < tn; k++) {
                uint32_t u = (uint32_t)(p[2 * k] | p[2 * k + 1] << 8) << 16;
                memcpy(&tile[k], &u, 4);
            }
        } else {
            const uint8_t *p = vals(j->t) + 2 * t0;
            for (uint64_t k = 0; k < tn; k++)
                tile[k] = rd_f16_to_f32((uint16_t)(p[2 * k] | p[2 * k + 1] << 8));
        }
        if (j->quant(src, tn, q + (t0 - off) / j->blck * j->bytes)) {
            __atomic_store_n(&j->failed, 1, __ATOMIC_RELAXED);
            return;
        }
    }
}

/* Quantizes n values (n a whole number of blocks) to type into q: x's, or
 * t's when t is given (x is then scratch for the error path). The error (the
 * tasks' messages stay on their threads) is the first bad value's, found
 * again on this thread. */
static int quant_par(int type, const upd_tensor *t, float *x, uint64_t n, uint8_t *q)
{
    const size_t blck = type == GGML_Q4_K ? GGML_Q4_K_BLOCK : GGML_Q8_0_BLOCK; /* FP8's is 32 too */
    const size_t bytes = type == GGML_Q4_K ? GGML_Q4_K_BYTES : type == GGML_Q8_0 ? GGML_Q8_0_BYTES : RD_FP8_BYTES;
    q8_job j = {.t = t, .x = x, .q = q, .n = n, .type = type, .quant = quantizer(type), .blck = blck, .bytes = bytes};
    pool_run((int32_t)((n + Q8_SLICE - 1) / Q8_SLICE), q8_task, &j);
    if (!j.failed)
        return 0;
    int rc = t ? to_f32(t, x, n) : 0;
    if (!rc)
        rc = j.quant(x, n, q);
    return rc ? rc : rd_fail(RD_EINVAL, "%s: a slice failed to quantize and then did not", ggml_type_name((ggml_type)type));
}

int upd_prequant(const model_config *c, upd_tensor *t, upd_serve serve)
{
    int64_t rows, cols;
    const int g = group_of(c, t->kind);
    group_shape(c, g, &rows, &cols);
    const int type = rows && !t->delta && !t->q ? serve_type(serve, g, cols) : -1;
    if (type < 0 || t->staged != t->wire)
        return 0;
    const uint64_t n = t->nbytes / upd_dtype_size(t->dtype);
    const size_t bytes = (size_t)(n / (uint64_t)cols) * ggml_row_bytes((ggml_type)type, (uint64_t)cols);
    uint8_t *q = malloc(bytes ? bytes : 1);
    if (!q)
        return 0;
    const size_t blck = type == GGML_Q4_K ? GGML_Q4_K_BLOCK : GGML_Q8_0_BLOCK;
    q8_job j = {.t = t, .q = q, .n = n, .type = type, .quant = quantizer(type), .blck = blck,
                .bytes = ggml_row_bytes((ggml_type)type, blck)};
    for (int32_t i = 0; i < (int32_t)((n + Q8_SLICE - 1) / Q8_SLICE) && !j.failed; i++)
        q8_task(&j, i, 0);
    if (j.failed) {
        free(q);
        return 0;
    }
    t->q = q;
    t->q_type = type;
    return 1;
}

/* Builds linear group g (layer l, expert ex) as one part of type: the rows
 * the stage does not cover keep their served blocks when the backend holds
 * them in that type (linear_read_native; Q4_K's fit does not always give a
 * block back from its own values), else they are read back as fp32 and
 * quantized; then each staged member is quantized over its own rows, so an
 * error names the pushed tensor. buf is fp32 scratch for a group, qbuf
 * receives its blocks. */
static int build_group_quant(const model *m, const upd_stage *s, int type, const char *serve, int g, int l, int ex,
                             float *buf, uint8_t *qbuf, void **out)
{
    const model_config *c = &m->cfg;
    rd_backend *be = m->be;
    int64_t rows, cols;
    group_shape(c, g, &rows, &cols);
    const uint64_t elems = (uint64_t)(rows * cols);
    uint64_t covered = 0;
    const char *member = "";    /* a staged member's name, for the error below */
    for (int32_t j = 0; j < s->n; j++)
        if (group_of(c, s->t[j].kind) == g && s->t[j].layer == l && s->t[j].expert == ex) {
            covered += s->t[j].nbytes / upd_dtype_size(s->t[j].dtype);
            member = s->t[j].name;
        }
    int rc;
    if (covered < elems) {
        const void *served = *model_weight_slot((model *)m, (arch_group)g, l, ex);
        rc = be->ops->linear_read_native ? be->ops->linear_read_native(be, served, type, 0, (int32_t)rows, qbuf)
                                         : RD_ENOTSUP;
        if (rc == RD_ENOTSUP) {
            if ((rc = be->ops->linear_read(be, served, buf)))
                return rc;
            if ((rc = quant_par(type, NULL, buf, elems, qbuf)))
                return rd_fail(rc, "commit: re-quantizing the served rows fused with '%.200s': %s", member,
                               rd_errmsg());
        } else if (rc) {
            return rc;
        }
    }
    for (int32_t j = 0; j < s->n; j++) {
        const upd_tensor *t = &s->t[j];
        if (group_of(c, t->kind) != g || t->layer != l || t->expert != ex)
            continue;
        int kind, layer, expert;
        int64_t tr, tc, elem0;
        resolve(c, t->name, &kind, &layer, &expert, &tr, &tc, &elem0);
        /* elem0 is a whole number of rows, so of blocks: the member's blocks start there. */
        uint8_t *dst = qbuf + (uint64_t)elem0 / (uint64_t)cols * ggml_row_bytes((ggml_type)type, (uint64_t)cols);
        if (t->q && t->q_type == type) { /* quantized while the push was staged: the same function's bytes */
            memcpy(dst, t->q, (size_t)tr * ggml_row_bytes((ggml_type)type, (uint64_t)cols));
            continue;
        }
        if ((rc = quant_par(type, t, buf + elem0, (uint64_t)(tr * tc), dst)))
            return rd_fail(rc, "commit: tensor '%.200s' cannot be served as %s: %s", t->name, serve, rd_errmsg());
    }
    rd_wpart part = {.type = type, .rows = (int32_t)rows, .data = qbuf};
    return be->ops->linear_load_q(be, &part, 1, (int32_t)cols, out);
}

int upd_kind_quantized(const model_config *c, int kind, upd_serve serve)
{
    int64_t rows, cols;
    int g = group_of(c, kind);
    group_shape(c, g, &rows, &cols);
    return rows && serve_type(serve, g, cols) >= 0;
}

int upd_build(const model *m, const upd_stage *s, upd_serve serve, upd_patch **out)
{
    *out = NULL;
    const model_config *c = &m->cfg;
    rd_backend *be = m->be;
    uint8_t *sel = malloc((size_t)(s->n ? s->n : 1));
    if (!sel)
        return rd_fail(RD_ENOMEM, "commit: out of memory converting the update");
    for (int32_t i = 0; i < s->n; i++) {
        if (s->t[i].delta && !s->delta_group) {
            free(sel);
            return rd_fail(RD_EINVAL, "commit: delta tensor '%.200s' was not prepared (upd_delta_apply first)",
                           s->t[i].name);
        }
        sel[i] = !s->t[i].delta;  /* a delta tensor's new values are checked as its records apply (delta.c) */
    }
    int rc = check_finite(s, sel);
    if (rc) {
        free(sel);
        return rc;
    }
    /* The groups touched, in model order; each once. */
    const int32_t units = c->n_experts > 1 ? c->n_experts : 1;
    int32_t n_slots = AG_COUNT * (c->n_layers + 1) * units;
    uint8_t *touched = calloc((size_t)n_slots, 1);
    upd_patch *p = calloc(1, sizeof *p);
    int64_t big = 0;
    for (int g = 0; g < AG_COUNT; g++) {
        int64_t r, cl;
        group_shape(c, g, &r, &cl);
        if ((r ? r : 1) * cl > big)
            big = (r ? r : 1) * cl;
    }
    float *buf = malloc(sizeof(float) * (size_t)big);
    uint16_t *nbuf = be->ops->linear_load_q ? malloc(sizeof(uint16_t) * (size_t)big) : NULL;
    const int q8 = serve != UPD_SERVE_AS_PUSHED && be->ops->linear_load_q;
    /* The largest bytes per value of the three types: Q8_0's 34 / 32. */
    uint8_t *qbuf = q8 ? malloc((size_t)big / GGML_Q8_0_BLOCK * GGML_Q8_0_BYTES + GGML_Q8_0_BYTES) : NULL;
    if (serve != UPD_SERVE_AS_PUSHED && !be->ops->linear_load_q) {
        free(touched), free(buf), free(nbuf), free(p), free(sel);
        return rd_fail(RD_ENOTSUP, "commit: serve_dtype %s needs a backend that holds quantized weights "
                       "(linear_load_q); %s has none", upd_serve_name(serve), be->ops->name);
    }
    if (!touched || !p || !buf || (be->ops->linear_load_q && !nbuf) || (q8 && !qbuf) ||
        !(p->e = calloc((size_t)s->n, sizeof *p->e))) {
        free(sel);
        free(touched);
        free(buf);
        free(nbuf);
        free(qbuf);
        upd_patch_free(be, p);
        return rd_fail(RD_ENOMEM, "commit: out of memory converting the update");
    }
    for (int32_t i = 0; i < s->n && !rc; i++) {
        const upd_tensor *t0 = &s->t[i];
        int g = group_of(c, t0->kind), l = t0->layer, ex = t0->expert;
        int32_t key = (g * (c->n_layers + 1) + (l + 1)) * units + ex;
        if (touched[key])
            continue;
        touched[key] = 1;
        /* The group's delta tensors get their new bytes now (delta.h); the
         * values their records write are checked for NaN and infinity there. */
        int any_delta = 0;
        for (int32_t j = i; j < s->n; j++) {
            const upd_tensor *t = &s->t[j];
            any_delta |= t->delta && group_of(c, t->kind) == g && t->layer == l && t->expert == ex;
        }
        if (any_delta && (rc = s->delta_group(m, (upd_stage *)s, g, l, ex)))
            break;
        int64_t rows, cols;
        group_shape(c, g, &rows, &cols);
        int64_t elems = (rows ? rows : 1) * cols;
        upd_entry *e = &p->e[p->n];
        e->group = g;
        e->layer = l;
        e->expert = ex;
        e->is_linear = rows != 0;
        const int qtype = rows && q8 ? serve_type(serve, g, cols) : -1;
        if (qtype >= 0) {
            if ((rc = build_group_quant(m, s, qtype, upd_serve_name(serve), g, l, ex, buf, qbuf, &e->ptr)))
                break;
            e->bytes = be->ops->linear_bytes ? (uint64_t)be->ops->linear_bytes(be, e->ptr)
                                             : sizeof(float) * (uint64_t)elems;
            p->n++;
            continue;
        }
        if (rows && be->ops->linear_load_q) {
            rc = build_group_native(m, s, g, l, ex, buf, nbuf, &e->ptr);
            if (rc < 0)
                break;
            if (rc == 0) {
                e->bytes = be->ops->linear_bytes ? (uint64_t)be->ops->linear_bytes(be, e->ptr)
                                                 : sizeof(float) * (uint64_t)elems;
                p->n++;
                continue;
            }
            rc = 0;             /* 1: the fp32 path below */
        }
        /* fp32: rows of the group the stage covers; read the rest from the model. */
        int64_t covered = 0;
        for (int32_t j = i; j < s->n; j++)
            if (group_of(c, s->t[j].kind) == g && s->t[j].layer == l && s->t[j].expert == ex)
                covered += (int64_t)(s->t[j].nbytes / upd_dtype_size(s->t[j].dtype));
        void **slot = model_weight_slot((model *)m, (arch_group)g, l, ex);
        if (covered < elems) {
            if (rows && (rc = be->ops->linear_read(be, *slot, buf)))
                break;
            if (!rows && (rc = be->ops->d2h(be, buf, *slot, sizeof(float) * (size_t)cols)))
                break;
        }
        for (int32_t j = i; j < s->n && !rc; j++) {
            const upd_tensor *t = &s->t[j];
            if (group_of(c, t->kind) != g || t->layer != l || t->expert != ex)
                continue;
            int kind, layer, expert;
            int64_t tr, tc, elem0;
            resolve(c, t->name, &kind, &layer, &expert, &tr, &tc, &elem0);
            rc = to_f32(t, buf + elem0, (uint64_t)((tr ? tr : 1) * tc));
        }
        if (rc)
            break;
        e->bytes = sizeof(float) * (uint64_t)elems;
        if (rows) {
            rc = be->ops->linear_load(be, buf, (int32_t)rows, (int32_t)cols, &e->ptr);
            if (!rc && be->ops->linear_bytes)
                e->bytes = (uint64_t)be->ops->linear_bytes(be, e->ptr);
        } else {
            e->ptr = be->ops->alloc(be, sizeof(float) * (size_t)cols);
            rc = e->ptr ? be->ops->h2d(be, e->ptr, buf, sizeof(float) * (size_t)cols)
                        : rd_fail(RD_ENOMEM, "commit: cannot allocate a %lld-float vector", (long long)cols);
        }
        if (e->ptr)
            p->n++;
    }
    if (!rc)
        rc = be->ops->sync(be);
    free(sel);
    free(touched);
    free(buf);
    free(nbuf);
    free(qbuf);
    if (rc) {
        upd_patch_free(be, p);
        return rc;
    }
    *out = p;
    return 0;
}

void upd_apply(model *m, upd_patch *p)
{
    if (p->applied)
        return;
    for (int32_t i = 0; i < p->n; i++) {
        void **slot = model_weight_slot(m, (arch_group)p->e[i].group, p->e[i].layer, p->e[i].expert);
        void *old = *slot;
        *slot = p->e[i].ptr;
        p->e[i].ptr = old;
    }
    if (m->cfg.tied_embeddings)
        m->lm_head = m->embed;
    m->weights_gen++;
    model_count_bytes(m);       /* a pushed weight holds its pushed dtype, not the one it replaced */
    p->applied = 1;
}
