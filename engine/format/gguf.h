/* gguf.h - GGUF v2/v3 reader.
 *
 * The file is mapped read-only; every count, offset and size is checked against
 * the file size before it is used, so a truncated or corrupt file is an error
 * (RD_EFORMAT, message naming the key or tensor and the byte offset), never a
 * crash. Metadata and tensor data are views into the mapping: valid until
 * gguf_close(). */
#ifndef RD_GGUF_H
#define RD_GGUF_H

#include <stddef.h>
#include <stdint.h>

/* Metadata value types (GGUF spec codes). */
typedef enum {
    GGUF_UINT8 = 0, GGUF_INT8 = 1, GGUF_UINT16 = 2, GGUF_INT16 = 3,
    GGUF_UINT32 = 4, GGUF_INT32 = 5, GGUF_FLOAT32 = 6, GGUF_BOOL = 7,
    GGUF_STRING = 8, GGUF_ARRAY = 9, GGUF_UINT64 = 10, GGUF_INT64 = 11,
    GGUF_FLOAT64 = 12,
} gguf_vtype;

/* Tensor types (ggml codes) the engine can dequantize. */
typedef enum {
    GGML_F32 = 0, GGML_F16 = 1, GGML_Q4_0 = 2, GGML_Q4_1 = 3,
    GGML_Q5_0 = 6, GGML_Q5_1 = 7, GGML_Q8_0 = 8,
    GGML_Q4_K = 12, GGML_Q5_K = 13, GGML_Q6_K = 14,
    GGML_BF16 = 30,
    /* rolloutd's own weight type, never read from a file (ggml_type_layout,
     * which the GGUF reader sizes tensors with, refuses it): FP8 E4M3 in
     * blocks of 32 behind a power-of-two scale byte (E8M0, 2^(byte - 127)),
     * OCP MXFP8's block, 33 bytes. serve_dtype fp8 quantizes pushed weights
     * to it (engine/model/quant_fp8.h). */
    RD_TYPE_FP8_B32 = 64,
} ggml_type;

typedef struct {
    const char *ptr;            /* not NUL-terminated */
    uint64_t len;               /* bytes */
} gguf_str;

typedef struct {
    gguf_str key;
    gguf_vtype type;            /* value type; GGUF_ARRAY for arrays */
    const uint8_t *val;         /* scalar: the value's bytes (string: u64 length, then the bytes);
                                   array: first element. Little-endian, unaligned */
    /* arrays only */
    gguf_vtype arr_type;        /* element type (nested arrays are parsed, not indexed) */
    uint64_t arr_n;             /* element count */
    gguf_str *arr_str;          /* arr_n entries when arr_type == GGUF_STRING, else NULL */
} gguf_kv;

typedef struct {
    gguf_str name;
    uint32_t n_dims;            /* 1..4 */
    uint64_t ne[4];             /* ggml order: ne[0] is the contiguous row length; unused dims are 1 */
    ggml_type type;
    uint64_t offset;            /* bytes from the start of the data section */
    uint64_t nbytes;            /* bytes of data */
    uint64_t n_elems;           /* product of ne */
    const uint8_t *data;        /* into the mapping */
} gguf_tensor;

typedef struct {
    const uint8_t *base;        /* whole file */
    size_t size;                /* bytes */
    int mapped;                 /* 1 if base is an mmap we own */
    uint32_t version;           /* 2 or 3 */
    uint32_t alignment;         /* bytes, power of two (default 32) */
    uint64_t n_kv;
    gguf_kv *kv;                /* n_kv entries, file order */
    uint64_t n_tensors;
    gguf_tensor *tensors;       /* n_tensors entries, file order */
    uint64_t data_offset;       /* bytes from the file start to the data section */
} gguf_file;

/* Maps and parses path. On error *out is NULL and rd_errmsg() says why. */
int gguf_open(const char *path, gguf_file **out);

/* Parses an in-memory file (the buffer must outlive the result; not copied).
 * Used by gguf_open and the fuzz target. */
int gguf_parse(const uint8_t *buf, size_t size, gguf_file **out);

void gguf_close(gguf_file *f);
/* Drops the resident pages of the tensor data (rd_map_drop_pages) once the
 * weights have been copied out; tensor views stay valid. */
void gguf_drop_data_pages(const gguf_file *f);

/* Lookups return NULL when absent. */
const gguf_kv *gguf_find_kv(const gguf_file *f, const char *key);
const gguf_tensor *gguf_find_tensor(const gguf_file *f, const char *name);

/* Typed getters. Integers accept any integer type whose value fits; floats
 * accept FLOAT32/FLOAT64. RD_ENOENT if absent, RD_EFORMAT on a type mismatch
 * or a value that does not fit. */
int gguf_get_u32(const gguf_file *f, const char *key, uint32_t *out);
int gguf_get_i64(const gguf_file *f, const char *key, int64_t *out);
int gguf_get_f32(const gguf_file *f, const char *key, float *out);
int gguf_get_bool(const gguf_file *f, const char *key, int *out);
int gguf_get_str(const gguf_file *f, const char *key, gguf_str *out);

/* Element i of an integer array kv (any integer element type) as int64.
 * RD_EFORMAT if kv is not an integer array, RD_ERANGE if i >= arr_n. */
int gguf_arr_i64(const gguf_kv *kv, uint64_t i, int64_t *out);

/* The ggml types' table (gguf.c). */

/* Bytes of one row of ne0 elements of type t; 0 if t is unsupported or ne0 is
 * not a multiple of its block size. */
size_t ggml_row_bytes(ggml_type t, uint64_t ne0);
const char *ggml_type_name(ggml_type t);   /* ggml's name ("q4_1", "q6_K"), "unknown" if none */

/* Block layout of any ggml type a file may hold, including ones the engine
 * cannot dequantize (the reader sizes every tensor with it): elements and
 * bytes per block. RD_EFORMAT for a code ggml does not define. */
int ggml_type_layout(ggml_type t, uint32_t *blck, uint32_t *bytes);
/* Block layout of a type the engine runs (ggml_dequant_row dequantizes it;
 * rolloutd's FP8 blocks included): 1 with *blck and *bytes set, or 0. */
int ggml_type_runs(ggml_type t, uint32_t *blck, uint32_t *bytes);

/* Dequantization and the half / bfloat16 conversions
 * (engine/model/dequant.c, which calls the table above). */

/* Dequantizes all n_elems of t into out (fp32). */
int gguf_dequant(const gguf_tensor *t, float *out);

/* Dequantizes n elements of a row of type t starting at src (n a multiple of
 * the block size). */
int ggml_dequant_row(ggml_type t, const uint8_t *src, float *out, uint64_t n);

/* IEEE half / bfloat16 conversions shared by the loaders. */
float rd_f16_to_f32(uint16_t h);
float rd_bf16_to_f32(uint16_t b);
uint16_t rd_f32_to_bf16(float f);   /* round to nearest even, NaN stays NaN */

#endif
