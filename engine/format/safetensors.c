/* safetensors.c - see safetensors.h. */
#include "engine/format/safetensors.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/err.h"
#include "base/mapfile.h"
#include "engine/format/gguf.h"

/* The reference implementation refuses headers over 100 MB; so do we, so a
 * corrupt length cannot make us allocate gigabytes. */
#define ST_MAX_HEADER (100u * 1000u * 1000u)

static const struct {
    const char *name;
    st_dtype t;
    size_t size;
} DTYPES[] = {
    {"F32", ST_F32, 4},  {"F16", ST_F16, 2},   {"BF16", ST_BF16, 2}, {"F64", ST_F64, 8},
    {"I64", ST_I64, 8},  {"I32", ST_I32, 4},   {"I16", ST_I16, 2},   {"I8", ST_I8, 1},
    {"U8", ST_U8, 1},    {"U16", ST_U16, 2},   {"U32", ST_U32, 4},   {"U64", ST_U64, 8},
    {"BOOL", ST_BOOL, 1}, {"F8_E4M3", ST_F8_E4M3, 1}, {"F8_E5M2", ST_F8_E5M2, 1},
};
#define N_DTYPES (sizeof DTYPES / sizeof DTYPES[0])

size_t st_dtype_size(st_dtype t)
{
    for (size_t i = 0; i < N_DTYPES; i++)
        if (DTYPES[i].t == t)
            return DTYPES[i].size;
    return 0;
}

const char *st_dtype_name(st_dtype t)
{
    for (size_t i = 0; i < N_DTYPES; i++)
        if (DTYPES[i].t == t)
            return DTYPES[i].name;
    return "unknown";
}

int st_dtype_parse(const char *s, st_dtype *out)
{
    if (!strcasecmp(s, "f32") || !strcasecmp(s, "float32")) *out = ST_F32;
    else if (!strcasecmp(s, "f16") || !strcasecmp(s, "float16")) *out = ST_F16;
    else if (!strcasecmp(s, "bf16") || !strcasecmp(s, "bfloat16")) *out = ST_BF16;
    else return rd_fail(RD_EINVAL, "safetensors: dtype '%s' is not one of f32, f16, bf16", s);
    return 0;
}

/* ------------------------------------------------------------------ parse */

/* A JSON number that must be a non-negative integer exactly representable in
 * a double (offsets and dims; 2^53 is far beyond any file). */
static int json_u64(const cJSON *j, uint64_t *v)
{
    if (!cJSON_IsNumber(j))
        return -1;
    double d = j->valuedouble;
    if (!(d >= 0) || d > 9007199254740992.0 || d != floor(d))
        return -1;
    *v = (uint64_t)d;
    return 0;
}

static int cmp_begin(const void *a, const void *b)
{
    const st_tensor *x = *(const st_tensor *const *)a, *y = *(const st_tensor *const *)b;
    return x->begin < y->begin ? -1 : x->begin > y->begin ? 1 : (x->end > y->end) - (x->end < y->end);
}

static int parse_entry(const cJSON *e, st_tensor *t, uint64_t data_size)
{
    const char *nm = t->name;
    if (!cJSON_IsObject(e))
        return rd_fail(RD_EFORMAT, "safetensors: tensor '%s': header entry is not an object", nm);
    const cJSON *dt = cJSON_GetObjectItemCaseSensitive(e, "dtype");
    const cJSON *sh = cJSON_GetObjectItemCaseSensitive(e, "shape");
    const cJSON *off = cJSON_GetObjectItemCaseSensitive(e, "data_offsets");
    if (!cJSON_IsString(dt))
        return rd_fail(RD_EFORMAT, "safetensors: tensor '%s': \"dtype\" missing or not a string", nm);
    size_t k = 0;
    while (k < N_DTYPES && strcmp(DTYPES[k].name, dt->valuestring))
        k++;
    if (k == N_DTYPES)
        return rd_fail(RD_ENOTSUP, "safetensors: tensor '%s': dtype '%.32s' is unknown (expected F32, F16 or BF16)",
                       nm, dt->valuestring);
    t->dtype = DTYPES[k].t;
    if (!cJSON_IsArray(sh))
        return rd_fail(RD_EFORMAT, "safetensors: tensor '%s': \"shape\" missing or not an array", nm);
    int nd = cJSON_GetArraySize(sh);
    if (nd > ST_MAX_DIMS)
        return rd_fail(RD_ENOTSUP, "safetensors: tensor '%s': %d dimensions (at most %d)", nm, nd, ST_MAX_DIMS);
    t->n_dims = nd;
    uint64_t n = 1;
    int overflow = 0;
    for (int i = 0; i < nd; i++) {
        uint64_t d;
        if (json_u64(cJSON_GetArrayItem(sh, i), &d))
            return rd_fail(RD_EFORMAT, "safetensors: tensor '%s': shape[%d] is not a non-negative integer", nm, i);
        t->shape[i] = (int64_t)d;
        if (d && n > UINT64_MAX / d / 8)
            overflow = 1;
        n *= d;
    }
    t->n_elems = n;
    if (!cJSON_IsArray(off) || cJSON_GetArraySize(off) != 2 || json_u64(cJSON_GetArrayItem(off, 0), &t->begin) ||
        json_u64(cJSON_GetArrayItem(off, 1), &t->end))
        return rd_fail(RD_EFORMAT, "safetensors: tensor '%s': \"data_offsets\" must be [begin, end] (non-negative integers)",
                       nm);
    if (t->begin > t->end || t->end > data_size)
        return rd_fail(RD_EFORMAT,
                       "safetensors: tensor '%s': data_offsets [%llu, %llu] out of range (data section is %llu bytes)",
                       nm, (unsigned long long)t->begin, (unsigned long long)t->end, (unsigned long long)data_size);
    uint64_t want = n * st_dtype_size(t->dtype);
    if (overflow || t->end - t->begin != want)
        return rd_fail(RD_EFORMAT,
                       "safetensors: tensor '%s': data_offsets [%llu, %llu] hold %llu bytes, expected %llu "
                       "(%llu elements of %s)",
                       nm, (unsigned long long)t->begin, (unsigned long long)t->end,
                       (unsigned long long)(t->end - t->begin), (unsigned long long)want, (unsigned long long)n,
                       st_dtype_name(t->dtype));
    return 0;
}

int st_parse(const uint8_t *buf, size_t size, st_file **out)
{
    *out = NULL;
    if (size < 8)
        return rd_fail(RD_EFORMAT, "safetensors: file is %zu bytes, shorter than the 8-byte header length", size);
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--)
        hlen = hlen << 8 | buf[i];
    if (hlen > size - 8)
        return rd_fail(RD_EFORMAT, "safetensors: header length %llu runs past the end of the file (%zu bytes)",
                       (unsigned long long)hlen, size);
    if (hlen > ST_MAX_HEADER || hlen < 2)
        return rd_fail(RD_EFORMAT, "safetensors: header length %llu out of range (2..%u bytes)",
                       (unsigned long long)hlen, ST_MAX_HEADER);
    /* cJSON needs a NUL-terminated copy; ParseWithLengthOpts also rejects
     * trailing garbage other than the spaces writers pad with. */
    char *text = malloc(hlen + 1);
    if (!text)
        return rd_fail(RD_ENOMEM, "safetensors: cannot allocate %llu bytes for the header", (unsigned long long)hlen);
    memcpy(text, buf + 8, hlen);
    text[hlen] = 0;
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithOpts(text, &end, 0);
    if (!root || !cJSON_IsObject(root)) {
        size_t at = root ? 0 : (size_t)(cJSON_GetErrorPtr() - text);
        cJSON_Delete(root);
        free(text);
        return rd_fail(RD_EFORMAT, "safetensors: header is not a JSON object (parse error near byte %zu of %llu)",
                       8 + at, (unsigned long long)hlen);
    }
    for (const char *p = end; p && *p; p++)
        if (*p != ' ' && *p != '\n' && *p != '\t' && *p != '\r') {
            size_t at = 8 + (size_t)(p - text);
            cJSON_Delete(root);
            free(text);
            return rd_fail(RD_EFORMAT, "safetensors: trailing bytes after the JSON header at byte %zu", at);
        }

    st_file *f = calloc(1, sizeof *f);
    int n_items = cJSON_GetArraySize(root);
    if (f)
        f->tensors = calloc((size_t)n_items + 1, sizeof *f->tensors);
    if (!f || !f->tensors) {
        free(f);
        cJSON_Delete(root);
        free(text);
        return rd_fail(RD_ENOMEM, "safetensors: out of memory for %d header entries", n_items);
    }
    f->base = buf;
    f->size = size;
    const uint64_t data_size = size - 8 - hlen;
    const uint8_t *data = buf + 8 + hlen;
    int rc = 0;
    for (const cJSON *e = root->child; e; e = e->next) {
        if (!strcmp(e->string, "__metadata__")) {
            if (!cJSON_IsObject(e)) {
                rc = rd_fail(RD_EFORMAT, "safetensors: \"__metadata__\" is not an object");
                goto done;
            }
            continue;
        }
        st_tensor *t = &f->tensors[f->n_tensors];
        if (!(t->name = strdup(e->string))) {
            rc = rd_fail(RD_ENOMEM, "safetensors: out of memory");
            goto done;
        }
        f->n_tensors++;
        if ((rc = parse_entry(e, t, data_size)))
            goto done;
        t->data = data + t->begin;
    }
    /* Overlap check on the tensors sorted by begin; empty tensors occupy
     * nothing and may sit anywhere. */
    st_tensor **by = malloc(sizeof *by * (f->n_tensors + 1));
    if (!by) {
        rc = rd_fail(RD_ENOMEM, "safetensors: out of memory");
        goto done;
    }
    size_t m = 0;
    for (size_t i = 0; i < f->n_tensors; i++)
        if (f->tensors[i].end > f->tensors[i].begin)
            by[m++] = &f->tensors[i];
    qsort(by, m, sizeof *by, cmp_begin);
    for (size_t i = 1; i < m; i++)
        if (by[i]->begin < by[i - 1]->end) {
            rc = rd_fail(RD_EFORMAT, "safetensors: tensors '%s' [%llu, %llu] and '%s' [%llu, %llu] overlap",
                         by[i - 1]->name, (unsigned long long)by[i - 1]->begin, (unsigned long long)by[i - 1]->end,
                         by[i]->name, (unsigned long long)by[i]->begin, (unsigned long long)by[i]->end);
            break;
        }
    free(by);
done:
    cJSON_Delete(root);
    free(text);
    if (rc) {
        st_close(f);
        return rc;
    }
    *out = f;
    return 0;
}

int st_open(const char *path, st_file **out)
{
    const void *base;
    size_t size;
    *out = NULL;
    int rc = rd_map_file("safetensors", path, &base, &size);
    if (rc)
        return rc;
    if (size < 8) {
        rd_unmap_file(base, size);
        return rd_fail(RD_EFORMAT, "safetensors: '%s' is %zu bytes, shorter than the 8-byte header length", path, size);
    }
    st_file *f;
    rc = st_parse(base, size, &f);
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

void st_close(st_file *f)
{
    if (!f)
        return;
    for (size_t i = 0; f->tensors && i < f->n_tensors; i++)
        free(f->tensors[i].name);
    free(f->tensors);
    if (f->mapped)
        rd_unmap_file(f->base, f->size);
    free(f);
}

const st_tensor *st_find(const st_file *f, const char *name)
{
    for (size_t i = 0; i < f->n_tensors; i++)
        if (!strcmp(f->tensors[i].name, name))
            return &f->tensors[i];
    return NULL;
}

/* ------------------------------------------------------------ conversion */

int st_read_f32(const st_tensor *t, float *out)
{
    const uint8_t *p = t->data;
    switch (t->dtype) {
    case ST_F32:
        memcpy(out, p, t->n_elems * 4);   /* unaligned-safe; file is little-endian like us */
        return 0;
    case ST_F16:
        for (uint64_t i = 0; i < t->n_elems; i++)
            out[i] = rd_f16_to_f32((uint16_t)(p[2 * i] | p[2 * i + 1] << 8));
        return 0;
    case ST_BF16:
        for (uint64_t i = 0; i < t->n_elems; i++)
            out[i] = rd_bf16_to_f32((uint16_t)(p[2 * i] | p[2 * i + 1] << 8));
        return 0;
    default:
        return rd_fail(RD_ENOTSUP, "safetensors: tensor '%s' has dtype %s; only F32, F16 and BF16 can be loaded",
                       t->name, st_dtype_name(t->dtype));
    }
}

uint16_t st_f32_to_f16(float f)
{
    uint32_t x;
    memcpy(&x, &f, 4);
    uint16_t sign = (uint16_t)(x >> 16 & 0x8000);
    uint32_t ex = x >> 23 & 0xff, man = x & 0x7fffff;
    if (ex == 0xff)                                  /* inf / NaN (keep NaN quiet) */
        return sign | 0x7c00 | (man ? 0x200 | (man >> 13) : 0);
    int e = (int)ex - 127 + 15;
    if (e >= 31)
        return sign | 0x7c00;                        /* overflow -> inf */
    if (e <= 0) {                                    /* subnormal half, or zero */
        if (e < -10)
            return sign;
        man |= 0x800000;
        int shift = 14 - e;                          /* 14..24 */
        uint32_t h = man >> shift, rem = man & ((1u << shift) - 1), halfway = 1u << (shift - 1);
        if (rem > halfway || (rem == halfway && (h & 1)))
            h++;
        return sign | (uint16_t)h;                   /* a carry into the exponent is correct */
    }
    uint32_t h = (uint32_t)e << 10 | man >> 13, rem = man & 0x1fff;
    if (rem > 0x1000 || (rem == 0x1000 && (h & 1)))
        h++;                                         /* may carry to inf: correct rounding */
    return sign | (uint16_t)h;
}

/* ------------------------------------------------------------------- sets */

static int set_add(st_set *s, const char *path)
{
    st_file **nf = realloc(s->files, sizeof *nf * (s->n_files + 1));
    if (!nf)
        return rd_fail(RD_ENOMEM, "safetensors: out of memory");
    s->files = nf;
    int rc = st_open(path, &s->files[s->n_files]);
    if (rc)
        return rc;
    s->n_files++;
    return 0;
}

static char *read_text(const char *path, size_t *len)
{
    FILE *fp = fopen(path, "rb");
    if (!fp)
        return NULL;
    char *buf = NULL;
    size_t cap = 0, n = 0;
    for (;;) {
        if (n + 4096 + 1 > cap) {
            char *nb = realloc(buf, cap = cap * 2 + 8192);
            if (!nb) {
                free(buf);
                fclose(fp);
                return NULL;
            }
            buf = nb;
        }
        size_t got = fread(buf + n, 1, cap - n - 1, fp);
        n += got;
        if (got == 0)
            break;
    }
    fclose(fp);
    buf[n] = 0;
    if (len)
        *len = n;
    return buf;
}

/* Shards named by the index's weight_map, each opened once. */
static int open_index(st_set *s, const char *dir, const char *index_path)
{
    char *text = read_text(index_path, NULL);
    if (!text)
        return rd_fail(RD_EIO, "safetensors: cannot read '%s': %s", index_path, strerror(errno));
    cJSON *root = cJSON_Parse(text);
    free(text);
    const cJSON *wm = root ? cJSON_GetObjectItemCaseSensitive(root, "weight_map") : NULL;
    if (!cJSON_IsObject(wm)) {
        cJSON_Delete(root);
        return rd_fail(RD_EFORMAT, "safetensors: '%s' is not JSON with a \"weight_map\" object", index_path);
    }
    int rc = 0;
    char **names = NULL;   /* shard file names, parallel to s->files */
    for (const cJSON *e = wm->child; e && !rc; e = e->next) {
        if (!cJSON_IsString(e) || !*e->valuestring || strchr(e->valuestring, '/')) {
            rc = rd_fail(RD_EFORMAT, "safetensors: %s: weight_map['%s'] must be a file name in the folder",
                         index_path, e->string);
            break;
        }
        size_t k = 0;
        while (k < s->n_files && strcmp(names[k], e->valuestring))
            k++;
        if (k == s->n_files) {
            char path[4096];
            snprintf(path, sizeof path, "%s/%s", dir, e->valuestring);
            char **nn = realloc(names, sizeof *nn * (s->n_files + 1));
            if (!nn) {
                rc = rd_fail(RD_ENOMEM, "safetensors: out of memory");
                break;
            }
            names = nn;
            if ((names[s->n_files] = strdup(e->valuestring)) == NULL) {
                rc = rd_fail(RD_ENOMEM, "safetensors: out of memory");
                break;
            }
            if ((rc = set_add(s, path))) {
                free(names[s->n_files]);
                break;
            }
        }
        if (!st_find(s->files[k], e->string))
            rc = rd_fail(RD_EFORMAT, "safetensors: %s maps tensor '%s' to '%s', which does not hold it", index_path,
                         e->string, e->valuestring);
    }
    for (size_t i = 0; i < s->n_files; i++)
        free(names[i]);
    free(names);
    cJSON_Delete(root);
    return rc;
}

int st_set_open(const char *path, st_set **out)
{
    *out = NULL;
    st_set *s = calloc(1, sizeof *s);
    if (!s)
        return rd_fail(RD_ENOMEM, "safetensors: out of memory");
    struct stat sb;
    int rc;
    if (stat(path, &sb) != 0) {
        rc = rd_fail(RD_EIO, "safetensors: cannot open '%s': %s", path, strerror(errno));
    } else if (S_ISDIR(sb.st_mode)) {
        char p[4096];
        snprintf(p, sizeof p, "%s/model.safetensors.index.json", path);
        if (access(p, F_OK) == 0) {
            rc = open_index(s, path, p);
        } else {
            snprintf(p, sizeof p, "%s/model.safetensors", path);
            rc = access(p, F_OK) == 0
                     ? set_add(s, p)
                     : rd_fail(RD_ENOENT, "safetensors: folder '%s' has neither model.safetensors.index.json nor "
                                          "model.safetensors", path);
        }
    } else {
        rc = set_add(s, path);
    }
    /* A name in two shards would make the result depend on lookup order. */
    for (size_t a = 0; !rc && a < s->n_files; a++)
        for (size_t i = 0; !rc && i < s->files[a]->n_tensors; i++)
            for (size_t b = a + 1; !rc && b < s->n_files; b++)
                if (st_find(s->files[b], s->files[a]->tensors[i].name))
                    rc = rd_fail(RD_EFORMAT, "safetensors: tensor '%s' appears in two shards of '%s'",
                                 s->files[a]->tensors[i].name, path);
    if (rc) {
        st_set_close(s);
        return rc;
    }
    *out = s;
    return 0;
}

void st_set_close(st_set *s)
{
    if (!s)
        return;
    for (size_t i = 0; i < s->n_files; i++)
        st_close(s->files[i]);
    free(s->files);
    free(s);
}

const st_tensor *st_set_find(const st_set *s, const char *name)
{
    for (size_t i = 0; i < s->n_files; i++) {
        const st_tensor *t = st_find(s->files[i], name);
        if (t)
            return t;
    }
    return NULL;
}

/* ----------------------------------------------------------------- writer */

int st_write(const char *path, const st_spec *specs, size_t n, const char *metadata_json, st_fill_fn fill,
             void *ctx)
{
    cJSON *root = cJSON_CreateObject();
    int rc = 0;
    uint64_t off = 0, max_elems = 0;
    if (!root)
        return rd_fail(RD_ENOMEM, "safetensors: out of memory");
    if (metadata_json) {
        cJSON *md = cJSON_Parse(metadata_json);
        if (!cJSON_IsObject(md)) {
            cJSON_Delete(md);
            cJSON_Delete(root);
            return rd_fail(RD_EINVAL, "safetensors: metadata must be a JSON object");
        }
        cJSON_AddItemToObject(root, "__metadata__", md);
    }
    for (size_t i = 0; i < n; i++) {
        const st_spec *sp = &specs[i];
        if (sp->dtype != ST_F32 && sp->dtype != ST_F16 && sp->dtype != ST_BF16) {
            cJSON_Delete(root);
            return rd_fail(RD_EINVAL, "safetensors: cannot write tensor '%s' as %s (F32, F16 or BF16)", sp->name,
                           st_dtype_name(sp->dtype));
        }
        uint64_t ne = 1;
        for (int d = 0; d < sp->n_dims; d++)
            ne *= (uint64_t)sp->shape[d];
        max_elems = ne > max_elems ? ne : max_elems;
        uint64_t bytes = ne * st_dtype_size(sp->dtype);
        cJSON *e = cJSON_CreateObject();
        cJSON *shape = cJSON_CreateArray();
        cJSON *offs = cJSON_CreateArray();
        cJSON_AddStringToObject(e, "dtype", st_dtype_name(sp->dtype));
        for (int d = 0; d < sp->n_dims; d++)
            cJSON_AddItemToArray(shape, cJSON_CreateNumber((double)sp->shape[d]));
        cJSON_AddItemToObject(e, "shape", shape);
        cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)off));
        cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)(off + bytes)));
        cJSON_AddItemToObject(e, "data_offsets", offs);
        cJSON_AddItemToObject(root, sp->name, e);
        off += bytes;
    }
    char *hdr = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    if (!hdr)
        return rd_fail(RD_ENOMEM, "safetensors: cannot print the header");
    /* Pad with spaces so the data starts 8-byte aligned, as HF's writer does
     * (lets readers use the mapping directly as float arrays). */
    size_t hlen = strlen(hdr), padded = (hlen + 7) & ~(size_t)7;
    float *buf = malloc(sizeof(float) * (max_elems ? max_elems : 1));
    uint16_t *h = malloc(sizeof(uint16_t) * (max_elems ? max_elems : 1));
    FILE *fp = fopen(path, "wb");
    if (!buf || !h || !fp) {
        rc = !buf || !h ? rd_fail(RD_ENOMEM, "safetensors: cannot allocate %llu floats", (unsigned long long)max_elems)
                  : rd_fail(RD_EIO, "safetensors: cannot create '%s': %s", path, strerror(errno));
        goto out;
    }
    uint8_t len8[8];
    for (int i = 0; i < 8; i++)
        len8[i] = (uint8_t)((uint64_t)padded >> (8 * i));
    int ok = fwrite(len8, 1, 8, fp) == 8 && fwrite(hdr, 1, hlen, fp) == hlen;
    for (size_t i = hlen; ok && i < padded; i++)
        ok = fputc(' ', fp) != EOF;
    for (size_t i = 0; ok && i < n; i++) {
        const st_spec *sp = &specs[i];
        uint64_t ne = 1;
        for (int d = 0; d < sp->n_dims; d++)
            ne *= (uint64_t)sp->shape[d];
        if ((rc = fill(ctx, i, buf)))
            goto out;
        if (sp->dtype == ST_F32) {
            ok = fwrite(buf, 4, ne, fp) == ne;
        } else {
            for (uint64_t k = 0; k < ne; k++)
                h[k] = sp->dtype == ST_BF16 ? rd_f32_to_bf16(buf[k]) : st_f32_to_f16(buf[k]);
            ok = fwrite(h, 2, ne, fp) == ne;
        }
    }
    if (!ok)
        rc = rd_fail(RD_EIO, "safetensors: writing '%s' failed: %s", path, strerror(errno));
out:
    if (fp && fclose(fp) && !rc)
        rc = rd_fail(RD_EIO, "safetensors: closing '%s' failed: %s", path, strerror(errno));
    free(buf);
    free(h);
    free(hdr);
    return rc;
}
