/* safetensors.h - safetensors reader and writer (the format HF learners save).
 *
 * File layout: u64 little-endian header length N, N bytes of JSON
 *   {"name": {"dtype": "F32", "shape": [r, c], "data_offsets": [begin, end]}, ...,
 *    "__metadata__": {"k": "v"}}
 * then the data; offsets are relative to the first byte after the header.
 *
 * The file is mapped read-only and every length, offset and size is checked
 * against the file before use (RD_EFORMAT, message naming the tensor and what
 * was expected), so a truncated or corrupt file is an error, never a crash.
 * Tensor data are views into the mapping, valid until st_close().
 *
 * An HF folder (config.json + model.safetensors, or shards listed in
 * model.safetensors.index.json's weight_map) opens as an st_set. */
#ifndef RD_SAFETENSORS_H
#define RD_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

/* Every dtype the format defines, so any valid file can be sized and
 * validated; only F32/F16/BF16 can be read as floats (st_read_f32). */
typedef enum {
    ST_F32, ST_F16, ST_BF16, ST_F64, ST_I64, ST_I32, ST_I16, ST_I8, ST_U8,
    ST_U16, ST_U32, ST_U64, ST_BOOL, ST_F8_E4M3, ST_F8_E5M2,
} st_dtype;

#define ST_MAX_DIMS 8

typedef struct {
    char *name;                 /* NUL-terminated, owned */
    st_dtype dtype;
    int n_dims;                 /* 0 (scalar) .. ST_MAX_DIMS */
    int64_t shape[ST_MAX_DIMS];
    uint64_t n_elems;
    uint64_t begin, end;        /* byte offsets into the data section */
    const uint8_t *data;        /* into the mapping */
} st_tensor;

typedef struct {
    const uint8_t *base;        /* whole file */
    size_t size;
    int mapped;                 /* 1 if base is an mmap we own */
    size_t n_tensors;
    st_tensor *tensors;         /* header order */
} st_file;

/* Maps and parses path. On error *out is NULL and rd_errmsg() says why. */
int st_open(const char *path, st_file **out);
/* Parses an in-memory file (not copied; the buffer must outlive the result). */
int st_parse(const uint8_t *buf, size_t size, st_file **out);
void st_close(st_file *f);

const st_tensor *st_find(const st_file *f, const char *name);   /* NULL if absent */

size_t st_dtype_size(st_dtype t);            /* bytes per element */
const char *st_dtype_name(st_dtype t);       /* "F32", ... */
/* Parses a dtype name ("f32"/"F32", "bf16", "f16"); RD_EINVAL otherwise. */
int st_dtype_parse(const char *s, st_dtype *out);

/* Converts all n_elems of t to fp32. RD_ENOTSUP (naming the tensor) for
 * dtypes other than F32/F16/BF16. */
int st_read_f32(const st_tensor *t, float *out);

uint16_t st_f32_to_f16(float f);             /* round to nearest even; overflow -> inf */

/* A model's tensors across one or more files. */
typedef struct {
    size_t n_files;
    st_file **files;
} st_set;

/* path: a .safetensors file, or a folder holding model.safetensors.index.json
 * (shards named by its weight_map) or model.safetensors. A name present in
 * two shards, or a weight_map entry missing from its shard, is RD_EFORMAT. */
int st_set_open(const char *path, st_set **out);
void st_set_close(st_set *s);
const st_tensor *st_set_find(const st_set *s, const char *name);

/* Writer: tensors are described up front (so the header can be written
 * first) and their data is produced one at a time by fill(), in order, as
 * fp32 [n_elems]; the writer converts to dtype. Streaming this way keeps
 * export memory at one tensor instead of the whole model. */
typedef struct {
    const char *name;
    st_dtype dtype;             /* F32, F16 or BF16 */
    int n_dims;
    int64_t shape[ST_MAX_DIMS];
} st_spec;

typedef int (*st_fill_fn)(void *ctx, size_t index, float *dst);

/* metadata: a JSON object of string values for "__metadata__", or NULL. */
int st_write(const char *path, const st_spec *specs, size_t n, const char *metadata_json,
             st_fill_fn fill, void *ctx);

#endif
