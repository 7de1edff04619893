/* gguf.c - GGUF v2/v3 reader (see gguf.h).
 *
 * The file is read front to back once: header, key/value pairs, tensor infos,
 * then the data section is located and every tensor's byte range is checked
 * against it. Nothing is trusted: each count or length is compared with the
 * bytes that remain before it is used or allocated, so a corrupt file cannot
 * make us read outside the buffer or allocate more than the file could hold. */
#include "engine/format/gguf.h"
#include "base/err.h"
#include "base/mapfile.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define GGUF_MAX_DIMS 4
#define GGUF_MAX_NAME 64          /* ggml's GGML_MAX_NAME: names must be shorter */
#define GGUF_MAX_NESTING 16       /* arrays of arrays; bounds the recursion */
#define GGUF_DEFAULT_ALIGNMENT 32

/* ---------------------------------------------------------------------------
 * Type table (ggml's type_traits: elements per block, bytes per block). All
 * types a GGUF file may hold are listed so the reader can size every tensor;
 * `runs` marks the ones the engine can dequantize (engine/model/dequant.c,
 * which reads the layouts from here: the table is the reader's, below it). Codes with no entry were
 * removed from ggml (or are newer than this table) and are rejected. q8_1 is
 * 36 bytes as in ggml-common.h (gguf-py 0.19 says 40; no file stores it). */

typedef struct {
    const char *name;
    uint32_t blck;              /* elements per block */
    uint32_t size;              /* bytes per block */
    int runs;                   /* 1 if ggml_dequant_row handles it */
} type_info;

static const type_info types[] = {
    [0] = {"f32", 1, 4, 1},       [1] = {"f16", 1, 2, 1},
    [2] = {"q4_0", 32, 18, 1},    [3] = {"q4_1", 32, 20, 1},
    [6] = {"q5_0", 32, 22, 1},    [7] = {"q5_1", 32, 24, 1},
    [8] = {"q8_0", 32, 34, 1},    [9] = {"q8_1", 32, 36, 0},
    [10] = {"q2_K", 256, 84, 0},  [11] = {"q3_K", 256, 110, 0},
    [12] = {"q4_K", 256, 144, 1}, [13] = {"q5_K", 256, 176, 1},
    [14] = {"q6_K", 256, 210, 1}, [15] = {"q8_K", 256, 292, 0},
    [16] = {"iq2_xxs", 256, 66, 0}, [17] = {"iq2_xs", 256, 74, 0},
    [18] = {"iq3_xxs", 256, 98, 0}, [19] = {"iq1_s", 256, 50, 0},
    [20] = {"iq4_nl", 32, 18, 0},   [21] = {"iq3_s", 256, 110, 0},
    [22] = {"iq2_s", 256, 82, 0},   [23] = {"iq4_xs", 256, 136, 0},
    [24] = {"i8", 1, 1, 0},       [25] = {"i16", 1, 2, 0},
    [26] = {"i32", 1, 4, 0},      [27] = {"i64", 1, 8, 0},
    [28] = {"f64", 1, 8, 0},      [29] = {"iq1_m", 256, 56, 0},
    [30] = {"bf16", 1, 2, 1},
    [34] = {"tq1_0", 256, 54, 0}, [35] = {"tq2_0", 256, 66, 0},
    [39] = {"mxfp4", 32, 17, 0},  [40] = {"nvfp4", 64, 36, 0},
    [41] = {"q1_0", 128, 18, 0},
    [RD_TYPE_FP8_B32] = {"fp8_e4m3", 32, 33, 1},
};

static const type_info *type_lookup(ggml_type t)
{
    if ((unsigned)t >= sizeof types / sizeof types[0] || types[t].name == NULL)
        return NULL;
    return &types[t];
}

const char *ggml_type_name(ggml_type t)
{
    const type_info *ti = type_lookup(t);
    return ti ? ti->name : "unknown";
}

int ggml_type_layout(ggml_type t, uint32_t *blck, uint32_t *bytes)
{
    const type_info *ti = t == RD_TYPE_FP8_B32 ? NULL : type_lookup(t);   /* not a file's type */
    if (!ti)
        return rd_fail(RD_EFORMAT, "ggml: unknown tensor type %d", (int)t);
    *blck = ti->blck;
    *bytes = ti->size;
    return 0;
}

int ggml_type_runs(ggml_type t, uint32_t *blck, uint32_t *bytes)
{
    const type_info *ti = type_lookup(t);
    if (!ti || !ti->runs)
        return 0;
    *blck = ti->blck;
    *bytes = ti->size;
    return 1;
}

size_t ggml_row_bytes(ggml_type t, uint64_t ne0)
{
    const type_info *ti = type_lookup(t);
    if (!ti || !ti->runs || ne0 % ti->blck != 0 || ne0 / ti->blck > SIZE_MAX / ti->size)
        return 0;
    return (size_t)(ne0 / ti->blck) * ti->size;
}

/* ---------------------------------------------------------------------------
 * Reading bytes. The cursor never moves past size; every read names what it
 * was reading so that the error says which key or tensor was cut short. */

typedef struct {
    const uint8_t *buf;
    size_t size;                /* bytes in buf */
    size_t pos;                 /* next byte to read */
    char where[128];            /* "key 'llama.block_count'", "tensor #3", ... */
} gguf_reader;

static uint32_t le32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint64_t le64(const uint8_t *p) { return (uint64_t)le32(p) | (uint64_t)le32(p + 4) << 32; }

/* Writes "kind 'name'" into buf. Names come from the file: print at most 64
 * bytes and only printable ASCII, so a corrupt name cannot garble a message. */
static void describe(char *buf, size_t cap, const char *kind, gguf_str name)
{
    char clean[72];
    size_t n = name.len < 64 ? (size_t)name.len : 64;
    for (size_t i = 0; i < n; i++) {
        char c = name.ptr[i];
        clean[i] = (c >= 0x20 && c < 0x7f) ? c : '?';
    }
    clean[n] = 0;
    snprintf(buf, cap, "%s '%s%s'", kind, clean, name.len > 64 ? "..." : "");
}

static void set_where(gguf_reader *r, const char *kind, gguf_str name)
{
    describe(r->where, sizeof r->where, kind, name);
}

static size_t remaining(const gguf_reader *r) { return r->size - r->pos; }

static int take(gguf_reader *r, uint64_t n, const char *what, const uint8_t **out)
{
    if (n > remaining(r))
        return rd_fail(RD_EFORMAT,
                       "gguf: %s at offset %zu: %s (%" PRIu64 " bytes) runs past end of file (size %zu)",
                       r->where, r->pos, what, n, r->size);
    *out = r->buf + r->pos;
    r->pos += (size_t)n;
    return 0;
}

static int read_u32(gguf_reader *r, const char *what, uint32_t *out)
{
    const uint8_t *p = NULL;
    int rc = take(r, 4, what, &p);
    if (rc)
        return rc;
    *out = le32(p);
    return 0;
}

static int read_u64(gguf_reader *r, const char *what, uint64_t *out)
{
    const uint8_t *p = NULL;
    int rc = take(r, 8, what, &p);
    if (rc)
        return rc;
    *out = le64(p);
    return 0;
}

static int read_str(gguf_reader *r, const char *what, gguf_str *out)
{
    size_t at = r->pos;
    uint64_t len;
    int rc = read_u64(r, what, &len);
    if (rc)
        return rc;
    if (len > remaining(r))
        return rd_fail(RD_EFORMAT,
                       "gguf: %s at offset %zu: %s length %" PRIu64 " runs past end of file (size %zu)",
                       r->where, at, what, len, r->size);
    out->ptr = (const char *)(r->buf + r->pos);
    out->len = len;
    r->pos += (size_t)len;
    return 0;
}

/* ---------------------------------------------------------------------------
 * Value types. */

static const char *vtype_name(uint32_t t)
{
    static const char *names[] = {"uint8", "int8", "uint16", "int16", "uint32", "int32", "float32",
                                  "bool", "string", "array", "uint64", "int64", "float64"};
    return t < sizeof names / sizeof names[0] ? names[t] : "unknown";
}

/* Bytes of a fixed-size value; 0 for strings and arrays (variable size). */
static size_t vtype_size(uint32_t t)
{
    switch (t) {
    case GGUF_UINT8: case GGUF_INT8: case GGUF_BOOL: return 1;
    case GGUF_UINT16: case GGUF_INT16: return 2;
    case GGUF_UINT32: case GGUF_INT32: case GGUF_FLOAT32: return 4;
    case GGUF_UINT64: case GGUF_INT64: case GGUF_FLOAT64: return 8;
    default: return 0;
    }
}

static int vtype_known(uint32_t t) { return t <= GGUF_FLOAT64; }

/* ---------------------------------------------------------------------------
 * Name sets: duplicate keys and tensor names are found with a small open
 * addressing table of indices (linear probing), so a file with many tensors
 * is not quadratic. */

typedef struct {
    uint32_t *slot;             /* index+1 of a name, 0 = empty */
    size_t cap;                 /* slots, a power of two */
} name_set;

static uint64_t name_hash(gguf_str s)
{
    uint64_t h = 1469598103934665603ull;   /* FNV-1a */
    for (uint64_t i = 0; i < s.len; i++)
        h = (h ^ (uint8_t)s.ptr[i]) * 1099511628211ull;
    return h;
}

static int str_eq(gguf_str a, gguf_str b) { return a.len == b.len && memcmp(a.ptr, b.ptr, a.len) == 0; }

static int name_set_init(name_set *s, uint64_t n)
{
    s->cap = 16;
    while (s->cap < 2 * n)
        s->cap *= 2;
    s->slot = calloc(s->cap, sizeof *s->slot);
    if (!s->slot)
        return rd_fail(RD_ENOMEM, "gguf: out of memory for a table of %" PRIu64 " names", n);
    return 0;
}

/* Adds name number idx (get(ctx, i) fetches name i); returns the index of an
 * earlier equal name, or -1 if it is new. */
static int64_t name_set_add(name_set *s, gguf_str name, uint32_t idx,
                            gguf_str (*get)(const void *, uint32_t), const void *ctx)
{
    size_t mask = s->cap - 1;
    for (size_t h = (size_t)name_hash(name) & mask;; h = (h + 1) & mask) {
        if (s->slot[h] == 0) {
            s->slot[h] = idx + 1;
            return -1;
        }
        if (str_eq(get(ctx, s->slot[h] - 1), name))
            return (int64_t)s->slot[h] - 1;
    }
}

static gguf_str kv_name(const void *ctx, uint32_t i) { return ((const gguf_kv *)ctx)[i].key; }
static gguf_str tensor_name(const void *ctx, uint32_t i) { return ((const gguf_tensor *)ctx)[i].name; }

/* ---------------------------------------------------------------------------
 * Key/value pairs. */

/* Reads one array (element type, count, elements) at r->pos. At the top level
 * (kv != NULL) it fills the kv's array fields and indexes string elements;
 * nested arrays are only walked, to find where they end. */
static int parse_array(gguf_reader *r, int depth, gguf_kv *kv)
{
    size_t at = r->pos;
    uint32_t et;
    uint64_t n;
    int rc;
    if (depth >= GGUF_MAX_NESTING)
        return rd_fail(RD_EFORMAT, "gguf: %s at offset %zu: arrays nested deeper than %d",
                       r->where, at, GGUF_MAX_NESTING);
    if ((rc = read_u32(r, "array element type", &et)) || (rc = read_u64(r, "array count", &n)))
        return rc;
    if (!vtype_known(et))
        return rd_fail(RD_EFORMAT, "gguf: %s at offset %zu: unknown array element type %" PRIu32
                       " (expected 0..12)", r->where, at, et);

    /* The smallest element decides how many could fit in what is left; a
     * count beyond that is corrupt, and is caught before anything is sized
     * from it. Strings need at least their 8-byte length, nested arrays 12. */
    size_t min_elem = et == GGUF_STRING ? 8 : et == GGUF_ARRAY ? 12 : vtype_size(et);
    if (n > remaining(r) / min_elem)
        return rd_fail(RD_EFORMAT,
                       "gguf: %s at offset %zu: array of %" PRIu64 " %s elements runs past end of file "
                       "(size %zu)", r->where, at, n, vtype_name(et), r->size);
    if (kv) {
        kv->arr_type = (gguf_vtype)et;
        kv->arr_n = n;
        kv->val = r->buf + r->pos;
    }

    if (et == GGUF_STRING) {
        gguf_str *strs = NULL;
        if (kv && n > 0) {
            strs = calloc((size_t)n, sizeof *strs);
            if (!strs)
                return rd_fail(RD_ENOMEM, "gguf: %s: out of memory for %" PRIu64 " strings", r->where, n);
            kv->arr_str = strs;    /* owned by the kv from here on, freed with the file */
        }
        for (uint64_t i = 0; i < n; i++) {
            gguf_str s;
            if ((rc = read_str(r, "array string", &s)))
                return rc;
            if (strs)
                strs[i] = s;
        }
        return 0;
    }
    if (et == GGUF_ARRAY) {
        for (uint64_t i = 0; i < n; i++)
            if ((rc = parse_array(r, depth + 1, NULL)))
                return rc;
        return 0;
    }
    const uint8_t *p = NULL;
    return take(r, n * min_elem, "array data", &p);
}

static int parse_kv(gguf_reader *r, uint64_t i, gguf_kv *kv)
{
    snprintf(r->where, sizeof r->where, "kv #%" PRIu64, i);
    size_t at = r->pos;
    uint32_t type;
    int rc;
    if ((rc = read_str(r, "key", &kv->key)))
        return rc;
    if (kv->key.len == 0)
        return rd_fail(RD_EFORMAT, "gguf: %s at offset %zu: empty key", r->where, at);
    set_where(r, "key", kv->key);
    at = r->pos;
    if ((rc = read_u32(r, "value type", &type)))
        return rc;
    if (!vtype_known(type))
        return rd_fail(RD_EFORMAT, "gguf: %s at offset %zu: unknown value type %" PRIu32 " (expected 0..12)",
                       r->where, at, type);
    kv->type = (gguf_vtype)type;
    if (type == GGUF_ARRAY)
        return parse_array(r, 0, kv);
    if (type == GGUF_STRING) {
        kv->val = r->buf + r->pos;   /* points at the string's length field */
        gguf_str s;
        return read_str(r, "string value", &s);
    }
    return take(r, vtype_size(type), "value", &kv->val);
}

/* general.alignment must be a uint32 power of two (as ggml requires). */
static int apply_alignment(gguf_file *f)
{
    const gguf_kv *kv = gguf_find_kv(f, "general.alignment");
    f->alignment = GGUF_DEFAULT_ALIGNMENT;
    if (!kv)
        return 0;
    size_t at = (size_t)((const uint8_t *)kv->key.ptr - 8 - f->base);
    if (kv->type != GGUF_UINT32)
        return rd_fail(RD_EFORMAT, "gguf: key 'general.alignment' at offset %zu: type %s, expected uint32",
                       at, vtype_name(kv->type));
    uint32_t a = le32(kv->val);
    if (a == 0 || (a & (a - 1)) != 0)
        return rd_fail(RD_EFORMAT, "gguf: key 'general.alignment' at offset %zu: %" PRIu32
                       " is not a power of two", at, a);
    f->alignment = a;
    return 0;
}

/* ---------------------------------------------------------------------------
 * Tensor infos. Sizes come from the type's block layout (all ggml types, so
 * a file with types we cannot dequantize still opens and the loader can say
 * which tensor it cannot use). */

static int parse_tensor_info(gguf_reader *r, const gguf_file *f, uint64_t i, gguf_tensor *t)
{
    snprintf(r->where, sizeof r->where, "tensor #%" PRIu64, i);
    size_t at = r->pos;
    uint32_t type;
    int rc;
    if ((rc = read_str(r, "name", &t->name)))
        return rc;
    if (t->name.len == 0 || t->name.len >= GGUF_MAX_NAME)
        return rd_fail(RD_EFORMAT, "gguf: %s at offset %zu: name length %" PRIu64 ", expected 1..%d",
                       r->where, at, t->name.len, GGUF_MAX_NAME - 1);
    set_where(r, "tensor", t->name);
    at = r->pos;
    if ((rc = read_u32(r, "n_dims", &t->n_dims)))
        return rc;
    if (t->n_dims < 1 || t->n_dims > GGUF_MAX_DIMS)
        return rd_fail(RD_EFORMAT, "gguf: %s at offset %zu: n_dims %" PRIu32 ", expected 1..%d",
                       r->where, at, t->n_dims, GGUF_MAX_DIMS);
    t->n_elems = 1;
    for (int d = 0; d < GGUF_MAX_DIMS; d++)
        t->ne[d] = 1;
    for (uint32_t d = 0; d < t->n_dims; d++) {
        at = r->pos;
        if ((rc = read_u64(r, "dimension", &t->ne[d])))
            return rc;
        /* ggml keeps element counts in int64; a product past that is corrupt. */
        if (t->ne[d] == 0 || t->ne[d] > (uint64_t)INT64_MAX / t->n_elems)
            return rd_fail(RD_EFORMAT, "gguf: %s at offset %zu: dimension %" PRIu32 " is %" PRIu64
                           " (must be >= 1, and the element count must fit in int64)",
                           r->where, at, d, t->ne[d]);
        t->n_elems *= t->ne[d];
    }
    at = r->pos;
    if ((rc = read_u32(r, "type", &type)))
        return rc;
    uint32_t blck = 1, bsize = 1; /* set by ggml_type_layout (GCC, inlining it, cannot tell rd_fail is non-zero) */
    if (ggml_type_layout((ggml_type)type, &blck, &bsize) != 0)
        return rd_fail(RD_EFORMAT, "gguf: %s at offset %zu: unknown ggml type %" PRIu32, r->where, at, type);
    t->type = (ggml_type)type;
    if (t->ne[0] % blck != 0)
        return rd_fail(RD_EFORMAT, "gguf: %s at offset %zu: ne[0] = %" PRIu64
                       " is not a multiple of the %s block size %" PRIu32,
                       r->where, at, t->ne[0], ggml_type_name(t->type), blck);
    uint64_t n_blocks = t->n_elems / blck;
    if (n_blocks > UINT64_MAX / bsize)
        return rd_fail(RD_EFORMAT, "gguf: %s at offset %zu: %" PRIu64 " elements of %s overflow a byte count",
                       r->where, at, t->n_elems, ggml_type_name(t->type));
    t->nbytes = n_blocks * bsize;
    at = r->pos;
    if ((rc = read_u64(r, "data offset", &t->offset)))
        return rc;
    if (t->offset % f->alignment != 0)
        return rd_fail(RD_EFORMAT, "gguf: %s at offset %zu: data offset %" PRIu64
                       " is not a multiple of the alignment %" PRIu32, r->where, at, t->offset, f->alignment);
    return 0;
}

typedef struct {
    uint64_t begin, end;        /* byte range in the data section */
    uint64_t idx;               /* tensor index */
} span;

static int span_cmp(const void *a, const void *b)
{
    const span *x = a, *y = b;
    return x->begin < y->begin ? -1 : x->begin > y->begin ? 1 : 0;
}

/* Every tensor's data must lie inside the file and no two may share bytes.
 * (ggml additionally wants them packed in order; we do not rely on that.) */
static int check_tensor_data(gguf_file *f, const size_t *info_at)
{
    uint64_t data_size = f->size - f->data_offset;
    for (uint64_t i = 0; i < f->n_tensors; i++) {
        gguf_tensor *t = &f->tensors[i];
        if (t->offset > data_size || t->nbytes > data_size - t->offset) {
            char what[128];
            describe(what, sizeof what, "tensor", t->name);
            return rd_fail(RD_EFORMAT, "gguf: %s at offset %zu: data (offset %" PRIu64 ", %" PRIu64
                           " bytes) runs past end of file (data section holds %" PRIu64 " bytes from offset %"
                           PRIu64 ")",
                           what, info_at[i], t->offset, t->nbytes, data_size, f->data_offset);
        }
        t->data = f->base + f->data_offset + t->offset;
    }
    if (f->n_tensors < 2)
        return 0;
    span *s = malloc((size_t)f->n_tensors * sizeof *s);
    if (!s)
        return rd_fail(RD_ENOMEM, "gguf: out of memory checking %" PRIu64 " tensors", f->n_tensors);
    for (uint64_t i = 0; i < f->n_tensors; i++)
        s[i] = (span){f->tensors[i].offset, f->tensors[i].offset + f->tensors[i].nbytes, i};
    qsort(s, (size_t)f->n_tensors, sizeof *s, span_cmp);
    int rc = 0;
    for (uint64_t i = 1; i < f->n_tensors && rc == 0; i++) {
        if (s[i].begin < s[i - 1].end) {
            char a[128], b[128];
            describe(a, sizeof a, "tensor", f->tensors[s[i].idx].name);
            describe(b, sizeof b, "tensor", f->tensors[s[i - 1].idx].name);
            rc = rd_fail(RD_EFORMAT, "gguf: %s at offset %zu: data [%" PRIu64 ", %" PRIu64
                         ") overlaps %s [%" PRIu64 ", %" PRIu64 ")", a, info_at[s[i].idx],
                         s[i].begin, s[i].end, b, s[i - 1].begin, s[i - 1].end);
        }
    }
    free(s);
    return rc;
}

/* ---------------------------------------------------------------------------
 * The whole file. */

static int parse_header(gguf_reader *r, gguf_file *f)
{
    const uint8_t *magic = NULL;
    int rc;
    snprintf(r->where, sizeof r->where, "header");
    if ((rc = take(r, 4, "magic", &magic)))
        return rc;
    if (memcmp(magic, "GGUF", 4) != 0)
        return rd_fail(RD_EFORMAT, "gguf: header at offset 0: bad magic %02x %02x %02x %02x, expected \"GGUF\"",
                       magic[0], magic[1], magic[2], magic[3]);
    if ((rc = read_u32(r, "version", &f->version)))
        return rc;
    if (f->version == 1)
        return rd_fail(RD_EFORMAT, "gguf: header at offset 4: version 1 is no longer supported (expected 2 or 3)");
    if (f->version != 2 && f->version != 3) {
        /* A byte-swapped small number means a big-endian file. */
        if ((f->version & 0xffff) == 0 && f->version != 0)
            return rd_fail(RD_EFORMAT, "gguf: header at offset 4: version 0x%08" PRIx32
                           " looks like a big-endian file (only little-endian is supported)", f->version);
        return rd_fail(RD_EFORMAT, "gguf: header at offset 4: version %" PRIu32 " not supported (expected 2 or 3)",
                       f->version);
    }
    if ((rc = read_u64(r, "tensor count", &f->n_tensors)) || (rc = read_u64(r, "kv count", &f->n_kv)))
        return rc;
    /* Lower bounds on an entry's size: a kv is an 8-byte key length, a 1-byte
     * key, a 4-byte type and at least 1 byte of value; a tensor info is an
     * 8-byte name length, a 1-byte name, n_dims, one dim, type and offset.
     * (Indices are also kept in 32 bits; no real file comes near.) */
    if (f->n_kv > remaining(r) / 14 || f->n_kv > INT32_MAX)
        return rd_fail(RD_EFORMAT, "gguf: header at offset 16: kv count %" PRIu64
                       " cannot fit in the %zu bytes left (file size %zu)", f->n_kv, remaining(r), r->size);
    if (f->n_tensors > remaining(r) / 33 || f->n_tensors > INT32_MAX)
        return rd_fail(RD_EFORMAT, "gguf: header at offset 8: tensor count %" PRIu64
                       " cannot fit in the %zu bytes left (file size %zu)", f->n_tensors, remaining(r), r->size);
    return 0;
}

static int parse_kvs(gguf_reader *r, gguf_file *f)
{
    name_set seen;
    int rc;
    if (f->n_kv == 0)
        return 0;
    f->kv = calloc((size_t)f->n_kv, sizeof *f->kv);
    if (!f->kv)
        return rd_fail(RD_ENOMEM, "gguf: out of memory for %" PRIu64 " kvs", f->n_kv);
    if ((rc = name_set_init(&seen, f->n_kv)))
        return rc;
    for (uint64_t i = 0; i < f->n_kv && rc == 0; i++) {
        size_t at = r->pos;
        if ((rc = parse_kv(r, i, &f->kv[i])))
            break;
        int64_t prev = name_set_add(&seen, f->kv[i].key, (uint32_t)i, kv_name, f->kv);
        if (prev >= 0)
            rc = rd_fail(RD_EFORMAT, "gguf: %s at offset %zu: duplicate key (first at offset %zu)", r->where,
                         at, (size_t)((const uint8_t *)f->kv[prev].key.ptr - 8 - r->buf));
    }
    free(seen.slot);
    return rc;
}

static int parse_tensor_infos(gguf_reader *r, gguf_file *f, size_t *info_at)
{
    name_set seen;
    int rc;
    if (f->n_tensors == 0)
        return 0;
    f->tensors = calloc((size_t)f->n_tensors, sizeof *f->tensors);
    if (!f->tensors)
        return rd_fail(RD_ENOMEM, "gguf: out of memory for %" PRIu64 " tensors", f->n_tensors);
    if ((rc = name_set_init(&seen, f->n_tensors)))
        return rc;
    for (uint64_t i = 0; i < f->n_tensors && rc == 0; i++) {
        info_at[i] = r->pos;
        if ((rc = parse_tensor_info(r, f, i, &f->tensors[i])))
            break;
        int64_t prev = name_set_add(&seen, f->tensors[i].name, (uint32_t)i, tensor_name, f->tensors);
        if (prev >= 0)
            rc = rd_fail(RD_EFORMAT, "gguf: %s at offset %zu: duplicate tensor name (first at offset %zu)",
                         r->where, info_at[i], info_at[prev]);
    }
    free(seen.slot);
    return rc;
}

int gguf_parse(const uint8_t *buf, size_t size, gguf_file **out)
{
    gguf_reader r = {.buf = buf, .size = size, .pos = 0};
    size_t *info_at = NULL;       /* file offset of each tensor info, for messages */
    int rc;
    *out = NULL;
    if (!buf || size == 0)
        return rd_fail(RD_EFORMAT, "gguf: empty input (size 0)");
    gguf_file *f = calloc(1, sizeof *f);
    if (!f)
        return rd_fail(RD_ENOMEM, "gguf: out of memory");
    f->base = buf;
    f->size = size;

    if ((rc = parse_header(&r, f)) || (rc = parse_kvs(&r, f)) || (rc = apply_alignment(f)))
        goto fail;
    if (f->n_tensors > 0 && !(info_at = malloc((size_t)f->n_tensors * sizeof *info_at))) {
        rc = rd_fail(RD_ENOMEM, "gguf: out of memory for %" PRIu64 " tensors", f->n_tensors);
        goto fail;
    }
    if ((rc = parse_tensor_infos(&r, f, info_at)))
        goto fail;

    /* The data section starts at the next multiple of the alignment. A file
     * without tensors may end right after its infos. */
    f->data_offset = r.pos + (f->alignment - r.pos % f->alignment) % f->alignment;
    if (f->data_offset > size) {
        if (f->n_tensors > 0) {
            rc = rd_fail(RD_EFORMAT, "gguf: data section at offset %" PRIu64 " (end of tensor infos %zu, "
                         "alignment %" PRIu32 ") is past end of file (size %zu)",
                         f->data_offset, r.pos, f->alignment, size);
            goto fail;
        }
        f->data_offset = size;
    }
    if ((rc = check_tensor_data(f, info_at)))
        goto fail;
    free(info_at);
    *out = f;
    return 0;

fail:
    free(info_at);
    gguf_close(f);
    return rc;
}

int gguf_open(const char *path, gguf_file **out)
{
    const void *base;
    size_t size;
    *out = NULL;
    int rc = rd_map_file("gguf", path, &base, &size);
    if (rc)
        return rc;
    if (size == 0)
        return rd_fail(RD_EFORMAT, "gguf: '%s' is empty (size 0)", path);

    gguf_file *f;
    rc = gguf_parse(base, size, &f);
    if (rc) {
        char msg[512];
        snprintf(msg, sizeof msg, "%s", rd_errmsg());
        rd_unmap_file(base, size);
        return rd_fail(rc, "%s: %s", path, msg);
    }
    f->mapped = 1;
    *out = f;
    return 0;
}

void gguf_drop_data_pages(const gguf_file *f)
{
    if (f && f->mapped && f->data_offset < f->size)
        rd_map_drop_pages(f->base + f->data_offset, f->size - f->data_offset);
}

void gguf_close(gguf_file *f)
{
    if (!f)
        return;
    for (uint64_t i = 0; f->kv && i < f->n_kv; i++)
        free(f->kv[i].arr_str);
    free(f->kv);
    free(f->tensors);
    if (f->mapped)
        rd_unmap_file(f->base, f->size);
    free(f);
}

/* ---------------------------------------------------------------------------
 * Lookups and typed getters. */

static int name_is(gguf_str s, const char *name)
{
    size_t n = strlen(name);
    return s.len == n && memcmp(s.ptr, name, n) == 0;
}

const gguf_kv *gguf_find_kv(const gguf_file *f, const char *key)
{
    for (uint64_t i = 0; i < f->n_kv; i++)
        if (name_is(f->kv[i].key, key))
            return &f->kv[i];
    return NULL;
}

const gguf_tensor *gguf_find_tensor(const gguf_file *f, const char *name)
{
    for (uint64_t i = 0; i < f->n_tensors; i++)
        if (name_is(f->tensors[i].name, name))
            return &f->tensors[i];
    return NULL;
}

/* Reads an integer of any width. Sets *big for a uint64 above INT64_MAX
 * (value then in *u); returns -1 if t is not an integer type. */
static int int_value(gguf_vtype t, const uint8_t *p, int64_t *v, uint64_t *u, int *big)
{
    *big = 0;
    switch (t) {
    case GGUF_UINT8: *v = p[0]; return 0;
    case GGUF_INT8: *v = (int8_t)p[0]; return 0;
    case GGUF_UINT16: *v = (uint16_t)(p[0] | p[1] << 8); return 0;
    case GGUF_INT16: *v = (int16_t)(uint16_t)(p[0] | p[1] << 8); return 0;
    case GGUF_UINT32: *v = le32(p); return 0;
    case GGUF_INT32: *v = (int32_t)le32(p); return 0;
    case GGUF_INT64: *v = (int64_t)le64(p); return 0;
    case GGUF_UINT64:
        *u = le64(p);
        if (*u > (uint64_t)INT64_MAX)
            *big = 1;
        else
            *v = (int64_t)*u;
        return 0;
    default: return -1;
    }
}

static int find_kv(const gguf_file *f, const char *key, const gguf_kv **kv)
{
    *kv = gguf_find_kv(f, key);
    if (!*kv)
        return rd_fail(RD_ENOENT, "gguf: key '%s' not found", key);
    return 0;
}

static int get_int(const gguf_file *f, const char *key, int64_t lo, int64_t hi, const char *want, int64_t *out)
{
    const gguf_kv *kv;
    int64_t v = 0;
    uint64_t u = 0;
    int big, rc;
    if ((rc = find_kv(f, key, &kv)))
        return rc;
    if (kv->type == GGUF_ARRAY || int_value(kv->type, kv->val, &v, &u, &big) != 0)
        return rd_fail(RD_EFORMAT, "gguf: key '%s': type %s, expected an integer", key, vtype_name(kv->type));
    if (big)
        return rd_fail(RD_EFORMAT, "gguf: key '%s': value %" PRIu64 " does not fit in %s", key, u, want);
    if (v < lo || v > hi)
        return rd_fail(RD_EFORMAT, "gguf: key '%s': value %" PRId64 " does not fit in %s", key, v, want);
    *out = v;
    return 0;
}

int gguf_get_u32(const gguf_file *f, const char *key, uint32_t *out)
{
    int64_t v;
    int rc = get_int(f, key, 0, UINT32_MAX, "uint32", &v);
    if (rc == 0)
        *out = (uint32_t)v;
    return rc;
}

int gguf_get_i64(const gguf_file *f, const char *key, int64_t *out)
{
    return get_int(f, key, INT64_MIN, INT64_MAX, "int64", out);
}

int gguf_get_f32(const gguf_file *f, const char *key, float *out)
{
    const gguf_kv *kv;
    int rc;
    if ((rc = find_kv(f, key, &kv)))
        return rc;
    if (kv->type == GGUF_FLOAT32) {
        uint32_t b = le32(kv->val);
        memcpy(out, &b, 4);
        return 0;
    }
    if (kv->type == GGUF_FLOAT64) {
        uint64_t b = le64(kv->val);
        double d;
        memcpy(&d, &b, 8);
        *out = (float)d;
        return 0;
    }
    return rd_fail(RD_EFORMAT, "gguf: key '%s': type %s, expected float32 or float64", key, vtype_name(kv->type));
}

int gguf_get_bool(const gguf_file *f, const char *key, int *out)
{
    const gguf_kv *kv;
    int rc;
    if ((rc = find_kv(f, key, &kv)))
        return rc;
    if (kv->type != GGUF_BOOL)
        return rd_fail(RD_EFORMAT, "gguf: key '%s': type %s, expected bool", key, vtype_name(kv->type));
    *out = kv->val[0] != 0;
    return 0;
}

int gguf_get_str(const gguf_file *f, const char *key, gguf_str *out)
{
    const gguf_kv *kv;
    int rc;
    if ((rc = find_kv(f, key, &kv)))
        return rc;
    if (kv->type != GGUF_STRING)
        return rd_fail(RD_EFORMAT, "gguf: key '%s': type %s, expected string", key, vtype_name(kv->type));
    out->len = le64(kv->val);
    out->ptr = (const char *)kv->val + 8;
    return 0;
}

int gguf_arr_i64(const gguf_kv *kv, uint64_t i, int64_t *out)
{
    char what[128];
    int64_t v = 0;
    uint64_t u = 0;
    int big;
    describe(what, sizeof what, "key", kv->key);
    if (kv->type != GGUF_ARRAY)
        return rd_fail(RD_EFORMAT, "gguf: %s: type %s, expected an array", what, vtype_name(kv->type));
    size_t es = vtype_size(kv->arr_type);
    if (es == 0 || kv->arr_type == GGUF_FLOAT32 || kv->arr_type == GGUF_FLOAT64 || kv->arr_type == GGUF_BOOL)
        return rd_fail(RD_EFORMAT, "gguf: %s: array of %s, expected an integer array", what,
                       vtype_name(kv->arr_type));
    if (i >= kv->arr_n)
        return rd_fail(RD_ERANGE, "gguf: %s: index %" PRIu64 " out of range (array has %" PRIu64 " elements)",
                       what, i, kv->arr_n);
    int_value(kv->arr_type, kv->val + i * es, &v, &u, &big);
    if (big)
        return rd_fail(RD_EFORMAT, "gguf: %s: element %" PRIu64 " = %" PRIu64 " does not fit in int64",
                       what, i, u);
    *out = v;
    return 0;
}
