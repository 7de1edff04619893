/* test_gguf.c - the GGUF reader and dequantization.
 *
 * File cases read the tiny models that tests/gen_testdata.sh writes into
 * $RD_TESTDATA (default build/testdata; brought up to date on each run).
 * Each model comes with the expected values of a few tensors dequantized by
 * the gguf Python package, an implementation independent of ours.
 * Corrupt-file cases build GGUF images in memory and parse them with
 * gguf_parse; each truncated or mutated image is copied into a buffer of
 * exactly its size so that AddressSanitizer catches any read past the end. */
#include "base/err.h"
#include "engine/format/gguf.h"
#include "tests/unit/test.h"

#include <cjson/cJSON.h>
#include <inttypes.h>
#include <stdint.h>
#include <sys/stat.h>

/* ---------------------------------------------------------------------------
 * Helpers: files, the test data directory, a GGUF image builder. */

static const char *testdata(void)
{
    const char *d = getenv("RD_TESTDATA");
    return d && *d ? d : "build/testdata";
}

static int file_exists(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0;
}

static uint8_t *read_file(const char *path, size_t *size)
{
    FILE *fp = fopen(path, "rb");
    if (!fp)
        return NULL;
    fseek(fp, 0, SEEK_END);
    long n = ftell(fp);
    fseek(fp, 0, SEEK_SET);
    uint8_t *p = malloc(n > 0 ? (size_t)n : 1);
    if (p && fread(p, 1, (size_t)n, fp) != (size_t)n) {
        free(p);
        p = NULL;
    }
    fclose(fp);
    *size = (size_t)n;
    return p;
}

static char *model_path(const char *name, char *buf, size_t cap)
{
    snprintf(buf, cap, "%s/%s.gguf", testdata(), name);
    return buf;
}

/* A small integer from the generator's meta.json ("key": 123); -1 if absent. */
static long meta_int(const char *name, const char *key)
{
    char path[512], pat[128];
    size_t n;
    snprintf(path, sizeof path, "%s/%s/meta.json", testdata(), name);
    char *text = (char *)read_file(path, &n);
    if (!text)
        return -1;
    text = realloc(text, n + 1);
    text[n] = 0;
    snprintf(pat, sizeof pat, "\"%s\":", key);
    char *p = strstr(text, pat);
    long v = p ? strtol(p + strlen(pat), NULL, 10) : -1;
    free(text);
    return v;
}

typedef struct {
    uint8_t *p;
    size_t n, cap;
} buf;

static void put(buf *b, const void *src, size_t n)
{
    if (b->n + n > b->cap) {
        b->cap = (b->n + n) * 2 + 64;
        b->p = realloc(b->p, b->cap);
    }
    memcpy(b->p + b->n, src, n);
    b->n += n;
}

static void put_u8(buf *b, uint8_t v) { put(b, &v, 1); }
static void put_u16(buf *b, uint16_t v) { put(b, &v, 2); }   /* tests run little-endian */
static void put_u32(buf *b, uint32_t v) { put(b, &v, 4); }
static void put_u64(buf *b, uint64_t v) { put(b, &v, 8); }
static void put_f32(buf *b, float v) { put(b, &v, 4); }
static void put_f64(buf *b, double v) { put(b, &v, 8); }
static void put_str(buf *b, const char *s)
{
    put_u64(b, strlen(s));
    put(b, s, strlen(s));
}
static void put_key(buf *b, const char *key, uint32_t type)
{
    put_str(b, key);
    put_u32(b, type);
}
static void pad_to(buf *b, size_t align)
{
    while (b->n % align)
        put_u8(b, 0);
}

/* What to break in the built image (all zero = a valid file). */
typedef struct {
    int bad_magic;
    uint32_t version;           /* 0 = 3 */
    uint32_t alignment;         /* 0 = no general.alignment key */
    int alignment_as_u64;       /* store general.alignment with the wrong type */
    uint64_t b_offset;          /* 0 = correct offset of tensor 'b' */
    uint32_t b_dims;            /* 0 = 2 */
    uint64_t str_len;           /* 0 = true length of general.name's value */
    uint64_t arr_count;         /* 0 = true count of the string array */
    int dup_key;
    int dup_tensor;
    int overlap;                /* b placed on top of a */
} corrupt;

/* A valid image: every value type, a string array, a nested array, and two
 * tensors ('a' f32 [8], 'b' q8_0 [32, 2]) with real data. */
static buf build(corrupt c)
{
    buf b = {0};
    uint32_t align = c.alignment ? c.alignment : 32;
    int n_kv = 17 + (c.alignment ? 1 : 0) + (c.dup_key ? 1 : 0);
    put(&b, c.bad_magic ? "GGUG" : "GGUF", 4);
    put_u32(&b, c.version ? c.version : 3);
    put_u64(&b, 2);                      /* tensors */
    put_u64(&b, (uint64_t)n_kv);
    put_key(&b, "general.architecture", GGUF_STRING);
    put_str(&b, "llama");
    if (c.alignment) {
        put_key(&b, "general.alignment", c.alignment_as_u64 ? GGUF_UINT64 : GGUF_UINT32);
        if (c.alignment_as_u64)
            put_u64(&b, c.alignment);
        else
            put_u32(&b, c.alignment);
    }
    put_key(&b, "general.name", GGUF_STRING);
    put_u64(&b, c.str_len ? c.str_len : 4);
    put(&b, "tiny", 4);
    put_key(&b, "t.u8", GGUF_UINT8); put_u8(&b, 200);
    put_key(&b, "t.i8", GGUF_INT8); put_u8(&b, (uint8_t)-5);
    put_key(&b, "t.u16", GGUF_UINT16); put_u16(&b, 60000);
    put_key(&b, "t.i16", GGUF_INT16); put_u16(&b, (uint16_t)-300);
    put_key(&b, "t.u32", GGUF_UINT32); put_u32(&b, 4000000000u);
    put_key(&b, "t.i32", GGUF_INT32); put_u32(&b, (uint32_t)-70000);
    put_key(&b, "t.f32", GGUF_FLOAT32); put_f32(&b, 0.25f);
    put_key(&b, "t.bool", GGUF_BOOL); put_u8(&b, 1);
    put_key(&b, "t.u64", GGUF_UINT64); put_u64(&b, (1ull << 63) + 1);
    put_key(&b, "t.i64", GGUF_INT64); put_u64(&b, (uint64_t)-5000000000ll);
    put_key(&b, "t.f64", GGUF_FLOAT64); put_f64(&b, 1e5);
    put_key(&b, "t.strs", GGUF_ARRAY);
    put_u32(&b, GGUF_STRING);
    put_u64(&b, c.arr_count ? c.arr_count : 3);
    put_str(&b, "x"); put_str(&b, ""); put_str(&b, "zz");
    put_key(&b, "t.ints", GGUF_ARRAY);
    put_u32(&b, GGUF_INT16);
    put_u64(&b, 3);
    put_u16(&b, 1); put_u16(&b, (uint16_t)-2); put_u16(&b, 3);
    /* [[1, 2], ["a"], []] - an array of arrays */
    put_key(&b, "t.nested", GGUF_ARRAY);
    put_u32(&b, GGUF_ARRAY);
    put_u64(&b, 3);
    put_u32(&b, GGUF_UINT32); put_u64(&b, 2); put_u32(&b, 1); put_u32(&b, 2);
    put_u32(&b, GGUF_STRING); put_u64(&b, 1); put_str(&b, "a");
    put_u32(&b, GGUF_FLOAT32); put_u64(&b, 0);
    put_key(&b, "t.after_nested", GGUF_UINT32); put_u32(&b, 77);
    if (c.dup_key) {
        put_key(&b, "t.u8", GGUF_UINT8);
        put_u8(&b, 1);
    }
    /* tensor infos */
    uint64_t a_bytes = 8 * 4, a_pad = (a_bytes + align - 1) / align * align;
    put_str(&b, "a");
    put_u32(&b, 1);
    put_u64(&b, 8);
    put_u32(&b, GGML_F32);
    put_u64(&b, 0);
    put_str(&b, c.dup_tensor ? "a" : "b");
    put_u32(&b, c.b_dims ? c.b_dims : 2);
    put_u64(&b, 32);
    put_u64(&b, 2);
    for (uint32_t d = 2; d < c.b_dims && d < 8; d++)
        put_u64(&b, 1);
    put_u32(&b, GGML_Q8_0);
    put_u64(&b, c.overlap ? 0 : c.b_offset ? c.b_offset : a_pad);
    pad_to(&b, align);
    /* data: a = 0..7, b = two q8_0 blocks with d = 0.5 and qs = j - 16 */
    for (int i = 0; i < 8; i++)
        put_f32(&b, (float)i);
    pad_to(&b, align);
    for (int blk = 0; blk < 2; blk++) {
        put_u16(&b, 0x3800);             /* 0.5 in f16 */
        for (int j = 0; j < 32; j++)
            put_u8(&b, (uint8_t)(int8_t)(j - 16));
    }
    pad_to(&b, align);
    return b;
}

/* Parses a copy of the first n bytes in a buffer of exactly n bytes. */
static int parse_exact(const uint8_t *src, size_t n, gguf_file **out)
{
    uint8_t *copy = malloc(n ? n : 1);
    memcpy(copy, src, n);
    int rc = gguf_parse(copy, n, out);
    if (rc == 0)
        (*out)->base = copy;    /* freed by the caller through free_parsed */
    else
        free(copy);
    return rc;
}

static void free_parsed(gguf_file *f)
{
    if (!f)
        return;
    uint8_t *copy = (uint8_t *)f->base;
    gguf_close(f);
    free(copy);
}

/* Reads everything a loader would read: every kv through the getters and
 * every array element, every tensor's data (dequantized when small). Under
 * ASan this proves the views the parser handed out are inside the buffer. */
static void touch_all(const gguf_file *f)
{
    char key[80];
    volatile double sink = 0;
    for (uint64_t i = 0; i < f->n_kv; i++) {
        const gguf_kv *kv = &f->kv[i];
        snprintf(key, sizeof key, "%.*s", (int)(kv->key.len < 70 ? kv->key.len : 70), kv->key.ptr);
        uint32_t u;
        int64_t v;
        float x;
        int bl;
        gguf_str s;
        if (gguf_get_u32(f, key, &u) == 0) sink += u;
        if (gguf_get_i64(f, key, &v) == 0) sink += (double)v;
        if (gguf_get_f32(f, key, &x) == 0) sink += x;
        if (gguf_get_bool(f, key, &bl) == 0) sink += bl;
        if (gguf_get_str(f, key, &s) == 0 && s.len) sink += (uint8_t)s.ptr[s.len - 1];
        if (kv->type == GGUF_ARRAY) {
            for (uint64_t j = 0; j < kv->arr_n && j < 100000; j++) {
                if (gguf_arr_i64(kv, j, &v) == 0) sink += (double)v;
                if (kv->arr_str && kv->arr_str[j].len) sink += (uint8_t)kv->arr_str[j].ptr[kv->arr_str[j].len - 1];
            }
        }
    }
    for (uint64_t i = 0; i < f->n_tensors; i++) {
        const gguf_tensor *t = &f->tensors[i];
        if (t->nbytes)
            sink += t->data[0] + t->data[t->nbytes - 1];
        if (t->n_elems <= (1u << 16) && ggml_row_bytes(t->type, t->n_elems) == t->nbytes) {
            float *y = malloc(t->n_elems * sizeof *y);
            if (y && gguf_dequant(t, y) == 0)
                sink += y[t->n_elems - 1];
            free(y);
        }
    }
    (void)sink;
}

/* ---------------------------------------------------------------------------
 * Scalar conversions and block layouts. */

static void test_f16_all_values(void)
{
    for (uint32_t h = 0; h < 65536; h++) {
        int sign = h >> 15, e = (h >> 10) & 31, m = h & 1023;
        float got = rd_f16_to_f32((uint16_t)h);
        if (e == 31) {
            CHECK(m ? isnan(got) : isinf(got), "h=0x%04x got %g", h, got);
            CHECK(m ? 1 : (signbit(got) != 0) == sign, "h=0x%04x sign", h);
            continue;
        }
        double want = e ? ldexp(1024 + m, e - 25) : ldexp(m, -24);
        if (sign)
            want = -want;
        CHECK(got == (float)want && (signbit(got) != 0) == sign, "h=0x%04x got %.9g want %.9g", h, got, want);
    }
    /* a nan's payload is kept (so it stays a nan of the same kind) */
    float q = rd_f16_to_f32(0x7e01);
    uint32_t bits;
    memcpy(&bits, &q, 4);
    CHECK(bits == (0x7f800000u | (0x201u << 13)), "nan payload: 0x%08x", bits);
}

static void test_bf16_rounding(void)
{
    CHECK(rd_bf16_to_f32(0x3f80) == 1.0f, "1.0");
    CHECK(rd_bf16_to_f32(0xc040) == -3.0f, "-3.0");
    CHECK(rd_f32_to_bf16(1.0f) == 0x3f80, "1.0");
    /* halfway cases go to the even neighbour */
    CHECK(rd_f32_to_bf16(1.0f + 0x1p-8f) == 0x3f80, "1+2^-8 -> 1.0, got 0x%04x", rd_f32_to_bf16(1.0f + 0x1p-8f));
    CHECK(rd_f32_to_bf16(1.0f + 3 * 0x1p-8f) == 0x3f82, "1+3*2^-8 -> up to even");
    CHECK(rd_f32_to_bf16(1.0f + 0x1p-8f + 0x1p-20f) == 0x3f81, "just above half rounds up");
    CHECK(rd_f32_to_bf16(INFINITY) == 0x7f80, "inf");
    CHECK(rd_f32_to_bf16(-INFINITY) == 0xff80, "-inf");
    CHECK(rd_f32_to_bf16(3.4e38f) == 0x7f80, "rounds up to inf");
    /* a nan whose payload sits only in the low 16 bits must not become inf */
    uint32_t nb = 0x7f800001u;
    float n;
    memcpy(&n, &nb, 4);
    uint16_t r = rd_f32_to_bf16(n);
    CHECK(isnan(rd_bf16_to_f32(r)), "nan stays nan, got 0x%04x", r);
    for (uint32_t h = 0; h < 65536; h++) {
        float x = rd_bf16_to_f32((uint16_t)h);
        if (!isnan(x))
            CHECK(rd_f32_to_bf16(x) == h, "round trip 0x%04x", h);
    }
}

static void test_block_layouts(void)
{
    CHECK(ggml_row_bytes(GGML_F32, 64) == 256, "f32");
    CHECK(ggml_row_bytes(GGML_F16, 64) == 128, "f16");
    CHECK(ggml_row_bytes(GGML_BF16, 64) == 128, "bf16");
    CHECK(ggml_row_bytes(GGML_Q8_0, 64) == 68, "q8_0");
    CHECK(ggml_row_bytes(GGML_Q4_0, 64) == 36, "q4_0");
    CHECK(ggml_row_bytes(GGML_Q4_1, 64) == 40, "q4_1");
    CHECK(ggml_row_bytes(GGML_Q4_1, 48) == 0, "not a multiple of the block");
    CHECK(ggml_row_bytes(GGML_Q5_0, 64) == 44, "q5_0");
    CHECK(ggml_row_bytes(GGML_Q5_1, 64) == 48, "q5_1");
    CHECK(ggml_row_bytes(GGML_Q4_K, 512) == 288, "q4_K");
    CHECK(ggml_row_bytes(GGML_Q5_K, 512) == 352, "q5_K");
    CHECK(ggml_row_bytes(GGML_Q6_K, 512) == 420, "q6_K");
    CHECK(ggml_row_bytes(GGML_Q5_0, 48) == 0, "q5_0: not a multiple of 32");
    CHECK(ggml_row_bytes(GGML_Q4_K, 64) == 0 && ggml_row_bytes(GGML_Q5_K, 288) == 0 &&
          ggml_row_bytes(GGML_Q6_K, 128) == 0, "K-quants: not a multiple of 256");
    CHECK(ggml_row_bytes((ggml_type)11, 256) == 0, "q3_K is not run");
    CHECK(strcmp(ggml_type_name((ggml_type)11), "q3_K") == 0, "name %s", ggml_type_name((ggml_type)11));
    CHECK(strcmp(ggml_type_name(GGML_Q6_K), "q6_K") == 0 && strcmp(ggml_type_name(GGML_Q4_K), "q4_K") == 0 &&
          strcmp(ggml_type_name(GGML_Q5_K), "q5_K") == 0 && strcmp(ggml_type_name(GGML_Q5_0), "q5_0") == 0 &&
          strcmp(ggml_type_name(GGML_Q5_1), "q5_1") == 0, "new type names");
    CHECK(strcmp(ggml_type_name(GGML_BF16), "bf16") == 0, "bf16 name");
    CHECK(strcmp(ggml_type_name((ggml_type)4), "unknown") == 0, "removed code 4");
    uint32_t blck, bytes;
    CHECK_OK(ggml_type_layout((ggml_type)11, &blck, &bytes));
    CHECK(blck == 256 && bytes == 110, "q3_K layout %u %u", blck, bytes);
    CHECK(ggml_type_layout((ggml_type)5, &blck, &bytes) == RD_EFORMAT, "removed code 5");
    CHECK(ggml_type_layout((ggml_type)1000, &blck, &bytes) == RD_EFORMAT, "code 1000");
    /* rolloutd's own FP8 blocks have a name and a row size, but no file may hold them. */
    CHECK(ggml_type_layout(RD_TYPE_FP8_B32, &blck, &bytes) == RD_EFORMAT, "fp8 blocks from a file");
    CHECK(ggml_row_bytes(RD_TYPE_FP8_B32, 64) == 66 && strcmp(ggml_type_name(RD_TYPE_FP8_B32), "fp8_e4m3") == 0,
          "fp8 blocks: %zu bytes per 64, name %s", ggml_row_bytes(RD_TYPE_FP8_B32, 64), ggml_type_name(RD_TYPE_FP8_B32));

    float y[256];
    uint8_t blk[210] = {0};
    CHECK(ggml_dequant_row((ggml_type)11, blk, y, 256) == RD_ENOTSUP, "q3_K dequant");
    CHECK(strstr(rd_errmsg(), "q3_K") != NULL, "message names the type: %s", rd_errmsg());
    CHECK(ggml_dequant_row(GGML_Q8_0, blk, y, 16) == RD_EINVAL, "partial block");
    CHECK(ggml_dequant_row(GGML_Q6_K, blk, y, 32) == RD_EINVAL, "partial K block");
    CHECK(strstr(rd_errmsg(), "q6_K block size 256") != NULL, "message: %s", rd_errmsg());
}

/* Low nibble of byte j is element j, the high nibble element j+16. */
static void test_quant_blocks(void)
{
    uint8_t b[34];
    float y[32];
    b[0] = 0x00; b[1] = 0x40;            /* d = 2.0 */
    for (int j = 0; j < 16; j++)
        b[2 + j] = (uint8_t)(j | (15 - j) << 4);
    CHECK_OK(ggml_dequant_row(GGML_Q4_0, b, y, 32));
    for (int j = 0; j < 16; j++) {
        CHECK(y[j] == (float)(j - 8) * 2, "q4_0 y[%d] = %g", j, y[j]);
        CHECK(y[j + 16] == (float)(7 - j) * 2, "q4_0 y[%d] = %g", j + 16, y[j + 16]);
    }
    b[2] = 0x00; b[3] = 0xbc;            /* q4_1: d = 2.0, m = -1.0 */
    for (int j = 0; j < 16; j++)
        b[4 + j] = (uint8_t)(j | (15 - j) << 4);
    CHECK_OK(ggml_dequant_row(GGML_Q4_1, b, y, 32));
    for (int j = 0; j < 16; j++) {
        CHECK(y[j] == (float)j * 2 - 1, "q4_1 y[%d] = %g", j, y[j]);
        CHECK(y[j + 16] == (float)(15 - j) * 2 - 1, "q4_1 y[%d] = %g", j + 16, y[j + 16]);
    }
    b[0] = 0x00; b[1] = 0x38;            /* q8_0: d = 0.5 */
    for (int j = 0; j < 32; j++)
        b[2 + j] = (uint8_t)(int8_t)(j * 8 - 128);
    CHECK_OK(ggml_dequant_row(GGML_Q8_0, b, y, 32));
    for (int j = 0; j < 32; j++)
        CHECK(y[j] == (float)(j * 8 - 128) * 0.5f, "q8_0 y[%d] = %g", j, y[j]);
}

/* The five-bit blocks: the fifth bit of element j is bit j of the u32 qh. */
static void test_q5_blocks(void)
{
    uint8_t b[24];
    float y[32];
    uint32_t qh = 0xa5c3f00fu;                 /* a mix of set and clear bits in every byte */
    b[0] = 0x00; b[1] = 0x3c;                  /* q5_0: d = 1.0 */
    memcpy(b + 2, &qh, 4);
    for (int j = 0; j < 16; j++)
        b[6 + j] = (uint8_t)(j | (15 - j) << 4);
    CHECK_OK(ggml_dequant_row(GGML_Q5_0, b, y, 32));
    for (int j = 0; j < 16; j++) {
        int h0 = (qh >> j) & 1, h1 = (qh >> (j + 16)) & 1;
        CHECK(y[j] == (float)((j | h0 << 4) - 16), "q5_0 y[%d] = %g", j, y[j]);
        CHECK(y[j + 16] == (float)(((15 - j) | h1 << 4) - 16), "q5_0 y[%d] = %g", j + 16, y[j + 16]);
    }
    b[0] = 0x00; b[1] = 0x38;                  /* q5_1: d = 0.5, m = -4.0 */
    b[2] = 0x00; b[3] = 0xc4;
    memcpy(b + 4, &qh, 4);
    for (int j = 0; j < 16; j++)
        b[8 + j] = (uint8_t)(j | (15 - j) << 4);
    CHECK_OK(ggml_dequant_row(GGML_Q5_1, b, y, 32));
    for (int j = 0; j < 16; j++) {
        int h0 = (qh >> j) & 1, h1 = (qh >> (j + 16)) & 1;
        CHECK(y[j] == (float)(j | h0 << 4) * 0.5f - 4, "q5_1 y[%d] = %g", j, y[j]);
        CHECK(y[j + 16] == (float)((15 - j) | h1 << 4) * 0.5f - 4, "q5_1 y[%d] = %g", j + 16, y[j + 16]);
    }
}

/* K-quant scales and mins of sub-block j, written the way ggml's
 * get_scale_min_k4 reads them (the independent statement of the packing). */
static void pack_scale_min_k4(uint8_t q[12], const int sc[8], const int m[8])
{
    memset(q, 0, 12);
    for (int j = 0; j < 4; j++) {
        q[j] = (uint8_t)(sc[j] | (sc[j + 4] >> 4) << 6);
        q[j + 4] = (uint8_t)(m[j] | (m[j + 4] >> 4) << 6);
        q[j + 8] = (uint8_t)((sc[j + 4] & 15) | (m[j + 4] & 15) << 4);
    }
}

/* Element e of a Q4_K/Q5_K block is in sub-block e/32; within each 64, the
 * first 32 are the low nibbles of 32 bytes, the next 32 the high ones. */
static void test_k_blocks(void)
{
    static const int sc[8] = {1, 63, 17, 32, 5, 48, 63, 30}, mn[8] = {0, 63, 9, 40, 33, 2, 16, 63};
    uint8_t b[210];
    float y[256];
    int q[256];
    for (int e = 0; e < 256; e++)
        q[e] = (e * 7 + e / 32) & 31;          /* 5-bit values; Q4_K takes the low 4 */
    /* q4_K: d = 0.25 (0x3400), dmin = 0.125 (0x3000) */
    b[0] = 0x00; b[1] = 0x34; b[2] = 0x00; b[3] = 0x30;
    pack_scale_min_k4(b + 4, sc, mn);
    for (int c = 0; c < 4; c++)
        for (int l = 0; l < 32; l++)
            b[16 + 32 * c + l] = (uint8_t)((q[64 * c + l] & 15) | (q[64 * c + 32 + l] & 15) << 4);
    CHECK_OK(ggml_dequant_row(GGML_Q4_K, b, y, 256));
    for (int e = 0; e < 256; e++) {
        float want = 0.25f * (float)sc[e / 32] * (float)(q[e] & 15) - 0.125f * (float)mn[e / 32];
        CHECK(y[e] == want, "q4_K y[%d] = %g, want %g", e, y[e], want);
    }
    /* q5_K: the same plus qh: element 64c+l's fifth bit is bit 2c of qh[l], 64c+32+l's bit 2c+1 */
    memset(b + 16, 0, 160);
    for (int c = 0; c < 4; c++)
        for (int l = 0; l < 32; l++) {
            b[16 + l] |= (uint8_t)((q[64 * c + l] >> 4) << (2 * c) | (q[64 * c + 32 + l] >> 4) << (2 * c + 1));
            b[48 + 32 * c + l] = (uint8_t)((q[64 * c + l] & 15) | (q[64 * c + 32 + l] & 15) << 4);
        }
    CHECK_OK(ggml_dequant_row(GGML_Q5_K, b, y, 256));
    for (int e = 0; e < 256; e++) {
        float want = 0.25f * (float)sc[e / 32] * (float)q[e] - 0.125f * (float)mn[e / 32];
        CHECK(y[e] == want, "q5_K y[%d] = %g, want %g", e, y[e], want);
    }
    /* q6_K: sub-blocks of 16 with int8 scales; per 128: ql[l] holds l (low) and
     * l+64 (high), ql[l+32] holds l+32 and l+96, qh[l] the top 2 bits of l,
     * l+32, l+64, l+96 in bits 0-1, 2-3, 4-5, 6-7. d = 2^-10 (0x1400). */
    int q6[256];
    int8_t s6[16];
    for (int e = 0; e < 256; e++)
        q6[e] = (e * 37 + 11) & 63;
    for (int j = 0; j < 16; j++)
        s6[j] = (int8_t)(j == 0 ? -128 : j == 1 ? 127 : j * 13 - 100);
    memset(b, 0, sizeof b);
    for (int h = 0; h < 2; h++)
        for (int l = 0; l < 32; l++) {
            const int *Q = q6 + 128 * h;
            b[64 * h + l] = (uint8_t)((Q[l] & 15) | (Q[l + 64] & 15) << 4);
            b[64 * h + 32 + l] = (uint8_t)((Q[l + 32] & 15) | (Q[l + 96] & 15) << 4);
            b[128 + 32 * h + l] = (uint8_t)(Q[l] >> 4 | (Q[l + 32] >> 4) << 2 | (Q[l + 64] >> 4) << 4 |
                                            (Q[l + 96] >> 4) << 6);
        }
    memcpy(b + 192, s6, 16);
    b[208] = 0x00; b[209] = 0x14;
    CHECK_OK(ggml_dequant_row(GGML_Q6_K, b, y, 256));
    for (int e = 0; e < 256; e++) {
        float want = 0x1p-10f * (float)s6[e / 16] * (float)(q6[e] - 32);
        CHECK(y[e] == want, "q6_K y[%d] = %g, want %g", e, y[e], want);
    }
}

/* ---------------------------------------------------------------------------
 * In-memory images: a valid one, every value type, then each corruption. */

static void test_memory_image_all_types(void)
{
    buf b = build((corrupt){0});
    gguf_file *f;
    CHECK_OK(parse_exact(b.p, b.n, &f));
    free(b.p);
    uint32_t u;
    int64_t v;
    float x;
    int bl;
    gguf_str s;
    int ok = 1;
#define EXPECT(cond) do { if (!(cond)) { ok = 0; CHECK(cond, "%s", rd_errmsg()); } } while (0)
    EXPECT(f->version == 3 && f->alignment == 32 && f->n_kv == 17 && f->n_tensors == 2);
    EXPECT(gguf_get_str(f, "general.name", &s) == 0 && s.len == 4 && memcmp(s.ptr, "tiny", 4) == 0);
    EXPECT(gguf_get_u32(f, "t.u8", &u) == 0 && u == 200);
    EXPECT(gguf_get_u32(f, "t.i8", &u) == RD_EFORMAT);        /* -5 does not fit */
    EXPECT(gguf_get_i64(f, "t.i8", &v) == 0 && v == -5);
    EXPECT(gguf_get_u32(f, "t.u16", &u) == 0 && u == 60000);
    EXPECT(gguf_get_i64(f, "t.i16", &v) == 0 && v == -300);
    EXPECT(gguf_get_u32(f, "t.u32", &u) == 0 && u == 4000000000u);
    EXPECT(gguf_get_i64(f, "t.i32", &v) == 0 && v == -70000);
    EXPECT(gguf_get_f32(f, "t.f32", &x) == 0 && x == 0.25f);
    EXPECT(gguf_get_bool(f, "t.bool", &bl) == 0 && bl == 1);
    EXPECT(gguf_get_i64(f, "t.u64", &v) == RD_EFORMAT);       /* 2^63+1 */
    EXPECT(gguf_get_i64(f, "t.i64", &v) == 0 && v == -5000000000ll);
    EXPECT(gguf_get_u32(f, "t.i64", &u) == RD_EFORMAT);
    EXPECT(gguf_get_f32(f, "t.f64", &x) == 0 && x == 1e5f);
    EXPECT(gguf_get_f32(f, "t.u32", &x) == RD_EFORMAT);
    EXPECT(gguf_get_str(f, "t.u32", &s) == RD_EFORMAT && strstr(rd_errmsg(), "t.u32"));
    EXPECT(gguf_get_u32(f, "t.missing", &u) == RD_ENOENT && strstr(rd_errmsg(), "t.missing"));
    EXPECT(gguf_get_u32(f, "t.after_nested", &u) == 0 && u == 77);   /* the nested array was skipped right */
    const gguf_kv *kv = gguf_find_kv(f, "t.strs");
    EXPECT(kv && kv->type == GGUF_ARRAY && kv->arr_type == GGUF_STRING && kv->arr_n == 3 && kv->arr_str);
    if (ok) {
        EXPECT(kv->arr_str[0].len == 1 && kv->arr_str[0].ptr[0] == 'x');
        EXPECT(kv->arr_str[1].len == 0);
        EXPECT(kv->arr_str[2].len == 2 && memcmp(kv->arr_str[2].ptr, "zz", 2) == 0);
        EXPECT(gguf_arr_i64(kv, 0, &v) == RD_EFORMAT);
    }
    kv = gguf_find_kv(f, "t.ints");
    EXPECT(kv && kv->arr_type == GGUF_INT16 && kv->arr_n == 3 && kv->arr_str == NULL);
    if (ok) {
        EXPECT(gguf_arr_i64(kv, 1, &v) == 0 && v == -2);
        EXPECT(gguf_arr_i64(kv, 3, &v) == RD_ERANGE);
    }
    kv = gguf_find_kv(f, "t.nested");
    EXPECT(kv && kv->arr_type == GGUF_ARRAY && kv->arr_n == 3 && kv->arr_str == NULL);
    const gguf_tensor *a = gguf_find_tensor(f, "a"), *t = gguf_find_tensor(f, "b");
    EXPECT(a && t && !gguf_find_tensor(f, "c"));
    if (ok) {
        EXPECT(t->n_dims == 2 && t->ne[0] == 32 && t->ne[1] == 2 && t->ne[2] == 1 && t->n_elems == 64);
        EXPECT(t->type == GGML_Q8_0 && t->nbytes == 68 && t->offset == 32);
        float y[64];
        EXPECT(gguf_dequant(a, y) == 0 && y[7] == 7.0f);
        EXPECT(gguf_dequant(t, y) == 0 && y[0] == -8.0f && y[63] == 7.5f);
    }
#undef EXPECT
    free_parsed(f);
}

/* Expects code and a message that contains each of the given fragments. */
static int fails_with(corrupt c, int code, const char *frag1, const char *frag2, char *why, size_t cap)
{
    buf b = build(c);
    gguf_file *f = NULL;
    int rc = parse_exact(b.p, b.n, &f);
    free(b.p);
    free_parsed(f);
    const char *msg = rd_errmsg();
    if (rc != code || (frag1 && !strstr(msg, frag1)) || (frag2 && !strstr(msg, frag2))) {
        snprintf(why, cap, "rc %d (want %d), message: %s", rc, code, msg);
        return 0;
    }
    return 1;
}

static void test_corrupt_cases(void)
{
    char why[700];
    CHECK(fails_with((corrupt){.bad_magic = 1}, RD_EFORMAT, "magic", "offset 0", why, sizeof why), "%.300s", why);
    CHECK(fails_with((corrupt){.version = 1}, RD_EFORMAT, "version 1", "offset 4", why, sizeof why), "%.300s", why);
    CHECK(fails_with((corrupt){.version = 4}, RD_EFORMAT, "version 4", "offset 4", why, sizeof why), "%.300s", why);
    CHECK(fails_with((corrupt){.version = 0x03000000}, RD_EFORMAT, "big-endian", NULL, why, sizeof why), "%.300s", why);
    CHECK(fails_with((corrupt){.alignment = 48}, RD_EFORMAT, "'general.alignment' at offset", "power of two", why,
                     sizeof why), "%.300s", why);
    CHECK(fails_with((corrupt){.alignment = 64, .alignment_as_u64 = 1}, RD_EFORMAT, "'general.alignment' at offset",
                     "uint32", why, sizeof why), "%.300s", why);
    CHECK(fails_with((corrupt){.b_offset = 1u << 20}, RD_EFORMAT, "tensor 'b' at offset", "past end", why,
                     sizeof why), "%.300s", why);
    CHECK(fails_with((corrupt){.b_offset = 40}, RD_EFORMAT, "tensor 'b' at offset", "alignment", why, sizeof why),
          "%.300s", why);
    CHECK(fails_with((corrupt){.overlap = 1}, RD_EFORMAT, "tensor 'b' at offset", "overlaps tensor 'a'", why,
                     sizeof why), "%.300s", why);
    CHECK(fails_with((corrupt){.b_dims = 5}, RD_EFORMAT, "tensor 'b' at offset", "n_dims 5", why, sizeof why),
          "%.300s", why);
    CHECK(fails_with((corrupt){.str_len = 1ull << 63}, RD_EFORMAT, "key 'general.name' at offset", "past end", why,
                     sizeof why), "%.300s", why);
    CHECK(fails_with((corrupt){.arr_count = 1ull << 60}, RD_EFORMAT, "key 't.strs' at offset", "past end", why,
                     sizeof why), "%.300s", why);
    CHECK(fails_with((corrupt){.dup_key = 1}, RD_EFORMAT, "key 't.u8' at offset", "duplicate key", why, sizeof why),
          "%.300s", why);
    CHECK(fails_with((corrupt){.dup_tensor = 1}, RD_EFORMAT, "tensor 'a' at offset", "duplicate tensor", why,
                     sizeof why), "%.300s", why);
    /* a valid power-of-two alignment other than 32 is honoured */
    buf b = build((corrupt){.alignment = 64});
    gguf_file *f;
    CHECK_OK(parse_exact(b.p, b.n, &f));
    free(b.p);
    int ok = f->alignment == 64 && f->data_offset % 64 == 0 && f->tensors[1].offset == 64;
    free_parsed(f);
    CHECK(ok, "alignment 64 layout");
}

/* Parses b (then frees it); 1 if it failed with RD_EFORMAT and a message
 * containing frag. */
static int rejects(buf *b, const char *frag)
{
    gguf_file *f = NULL;
    int rc = parse_exact(b->p, b->n, &f);
    free_parsed(f);
    free(b->p);
    *b = (buf){0};
    return rc == RD_EFORMAT && strstr(rd_errmsg(), frag) != NULL;
}

static void header(buf *b, uint64_t n_tensors, uint64_t n_kv)
{
    put(b, "GGUF", 4);
    put_u32(b, 3);
    put_u64(b, n_tensors);
    put_u64(b, n_kv);
}

/* Hand-made headers that must fail cleanly: empty input, counts the file
 * cannot hold, a huge count inside a nested array, nesting too deep. */
static void test_corrupt_counts(void)
{
    gguf_file *f = (gguf_file *)1;
    buf b = {0};
    CHECK(gguf_parse((const uint8_t *)"", 0, &f) == RD_EFORMAT && f == NULL, "empty");
    header(&b, 1ull << 62, 0);
    CHECK(rejects(&b, "tensor count"), "%s", rd_errmsg());
    header(&b, 0, UINT64_MAX);
    CHECK(rejects(&b, "kv count"), "%s", rd_errmsg());
    header(&b, 0, 1);
    put_key(&b, "n", GGUF_ARRAY);
    put_u32(&b, GGUF_ARRAY);
    put_u64(&b, 1);
    put_u32(&b, GGUF_UINT64);
    put_u64(&b, 1ull << 61);              /* inner count: 2^64 bytes if trusted */
    CHECK(rejects(&b, "key 'n' at offset"), "%s", rd_errmsg());
    header(&b, 0, 1);
    put_key(&b, "deep", GGUF_ARRAY);
    for (int i = 0; i < 40; i++) {
        put_u32(&b, GGUF_ARRAY);
        put_u64(&b, 1);
    }
    CHECK(rejects(&b, "nested"), "%s", rd_errmsg());
    header(&b, 0, 1);
    put_key(&b, "t", 13);
    put_u32(&b, 0);
    CHECK(rejects(&b, "unknown value type 13"), "%s", rd_errmsg());
    header(&b, 0, 1);
    put_key(&b, "", GGUF_UINT32);
    put_u32(&b, 0);
    CHECK(rejects(&b, "empty key"), "%s", rd_errmsg());
    header(&b, 1, 0);                     /* unknown tensor type, dims that overflow */
    put_str(&b, "w");
    put_u32(&b, 1);
    put_u64(&b, 32);
    put_u32(&b, 4);
    put_u64(&b, 0);
    CHECK(rejects(&b, "tensor 'w' at offset"), "%s", rd_errmsg());
    header(&b, 1, 0);
    put_str(&b, "w");
    put_u32(&b, 2);
    put_u64(&b, 1ull << 40);
    put_u64(&b, 1ull << 40);
    put_u32(&b, GGML_F32);
    put_u64(&b, 0);
    CHECK(rejects(&b, "int64"), "%s", rd_errmsg());
    header(&b, 1, 0);
    put_str(&b, "w");
    put_u32(&b, 1);
    put_u64(&b, 48);
    put_u32(&b, GGML_Q4_0);
    put_u64(&b, 0);
    CHECK(rejects(&b, "not a multiple of the q4_0 block size"), "%s", rd_errmsg());
}

/* One tensor 'w' [ne0, ne1] of type t followed by data_bytes bytes of data. */
static buf one_tensor(ggml_type t, uint64_t ne0, uint64_t ne1, size_t data_bytes)
{
    buf b = {0};
    header(&b, 1, 0);
    put_str(&b, "w");
    put_u32(&b, 2);
    put_u64(&b, ne0);
    put_u64(&b, ne1);
    put_u32(&b, t);
    put_u64(&b, 0);
    pad_to(&b, 32);
    for (size_t i = 0; i < data_bytes; i++)
        put_u8(&b, (uint8_t)(i * 131 + 7));   /* any bytes are valid blocks */
    return b;
}

/* The new types: exact sizes parse and dequantize; one byte short is an
 * error naming the tensor; a row that is not a whole number of blocks (32
 * for q5_0/q5_1, 256 for the K-quants) is an error naming the type. */
static void test_new_types_bounds(void)
{
    static const struct { ggml_type t; uint32_t blck, bytes; uint64_t bad_ne0; } ty[] = {
        {GGML_Q5_0, 32, 22, 48}, {GGML_Q5_1, 32, 24, 16}, {GGML_Q4_K, 256, 144, 128},
        {GGML_Q5_K, 256, 176, 32}, {GGML_Q6_K, 256, 210, 320},
    };
    for (size_t i = 0; i < sizeof ty / sizeof ty[0]; i++) {
        const char *name = ggml_type_name(ty[i].t);
        uint64_t ne0 = 2 * ty[i].blck, ne1 = 3;
        size_t need = (size_t)(ne0 / ty[i].blck * ne1) * ty[i].bytes;
        buf b = one_tensor(ty[i].t, ne0, ne1, need);
        gguf_file *f = NULL;
        CHECK(parse_exact(b.p, b.n, &f) == 0, "%s: %s", name, rd_errmsg());
        free(b.p);
        const gguf_tensor *t = &f->tensors[0];
        uint64_t nbytes = t->nbytes;
        int ok = t->type == ty[i].t && nbytes == need && ggml_row_bytes(t->type, ne0) * ne1 == need;
        float *y = malloc(ne0 * ne1 * sizeof *y);
        int rc = gguf_dequant(t, y);
        int finite = 1;
        for (uint64_t j = 0; rc == 0 && j < ne0 * ne1; j++)
            finite &= isfinite(y[j]) != 0;   /* these bytes make no inf/nan scales */
        free(y);
        free_parsed(f);
        CHECK(ok && rc == 0 && finite, "%s: nbytes %" PRIu64 " (want %zu), dequant rc %d finite %d: %s", name,
              nbytes, need, rc, finite, rd_errmsg());
        b = one_tensor(ty[i].t, ne0, ne1, need - 1);
        CHECK(rejects(&b, "tensor 'w' at offset"), "%s short: %s", name, rd_errmsg());
        CHECK(strstr(rd_errmsg(), "past end of file"), "%s short: %s", name, rd_errmsg());
        b = one_tensor(ty[i].t, ty[i].bad_ne0, 1, 4096);
        char frag[64];
        snprintf(frag, sizeof frag, "not a multiple of the %s block size %u", name, ty[i].blck);
        CHECK(rejects(&b, frag), "%s ne0 %" PRIu64 ": %s", name, ty[i].bad_ne0, rd_errmsg());
        CHECK(strstr(rd_errmsg(), "tensor 'w'"), "%s: %s", name, rd_errmsg());
    }
}

/* ---------------------------------------------------------------------------
 * The generated tiny models. */

static const char *dtypes[] = {"f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "q4_k", "q5_k", "q6_k"};
static const ggml_type dtype_codes[] = {GGML_F32, GGML_F16, GGML_BF16, GGML_Q8_0, GGML_Q4_0, GGML_Q4_1,
                                        GGML_Q5_0, GGML_Q5_1, GGML_Q4_K, GGML_Q5_K, GGML_Q6_K};
#define N_DTYPES (sizeof dtypes / sizeof dtypes[0])

static int have_testdata;

/* Brings the test data up to date (tests/gen_testdata.sh does nothing when
 * it already is, and regenerates when the generator changed). */
static void ensure_testdata(void)
{
    char path[512];
    if (file_exists("tests/gen_testdata.sh")) {
        char cmd[600];
        snprintf(cmd, sizeof cmd, "tests/gen_testdata.sh '%s' >/dev/null", testdata());
        if (system(cmd) != 0)
            fprintf(stderr, "test_gguf: %s failed\n", cmd);
    }
    have_testdata = file_exists(model_path("tiny-q4_1", path, sizeof path));
}

#define NEED_TESTDATA()                                                                   \
    do {                                                                                  \
        if (!have_testdata) {                                                             \
            CHECK(have_testdata, "no test data in %s (run tests/gen_testdata.sh %s)",     \
                  testdata(), testdata());                                                \
        }                                                                                 \
    } while (0)

static void check_model(const char *name, ggml_type wtype, uint32_t version, int tied, char *why, size_t cap,
                        int *ok)
{
    char path[512];
    gguf_file *f;
    *ok = 0;
    if (gguf_open(model_path(name, path, sizeof path), &f) != 0) {
        snprintf(why, cap, "open: %s", rd_errmsg());
        return;
    }
    long layers = meta_int(name, "layers"), dim = meta_int(name, "dim"), heads = meta_int(name, "heads");
    long kvh = meta_int(name, "kv_heads"), ffn = meta_int(name, "ffn"), vocab = meta_int(name, "vocab");
    long ctx = meta_int(name, "ctx");
    uint32_t u;
    float x;
    gguf_str s;
    const gguf_tensor *t;
    const gguf_kv *kv;
#define REQ(cond, ...) do { if (!(cond)) { snprintf(why, cap, __VA_ARGS__); goto out; } } while (0)
    REQ(layers > 0 && dim > 0 && heads > 0 && kvh > 0 && ffn > 0 && vocab > 0 && ctx > 0, "meta.json incomplete");
    REQ(f->version == version, "version %u", f->version);
    REQ(gguf_get_str(f, "general.architecture", &s) == 0 && s.len == 5 && !memcmp(s.ptr, "llama", 5), "arch");
    REQ(gguf_get_u32(f, "llama.block_count", &u) == 0 && u == layers, "block_count %u", u);
    REQ(gguf_get_u32(f, "llama.embedding_length", &u) == 0 && u == dim, "embedding_length %u", u);
    REQ(gguf_get_u32(f, "llama.feed_forward_length", &u) == 0 && u == ffn, "ffn %u", u);
    REQ(gguf_get_u32(f, "llama.attention.head_count", &u) == 0 && u == heads, "heads %u", u);
    REQ(gguf_get_u32(f, "llama.attention.head_count_kv", &u) == 0 && u == kvh, "kv heads %u", u);
    REQ(gguf_get_u32(f, "llama.context_length", &u) == 0 && u == ctx, "ctx %u", u);
    REQ(gguf_get_u32(f, "llama.rope.dimension_count", &u) == 0 && u == dim / heads, "rope dims %u", u);
    REQ(gguf_get_u32(f, "llama.vocab_size", &u) == 0 && u == vocab, "vocab_size %u", u);
    REQ(gguf_get_f32(f, "llama.rope.freq_base", &x) == 0 && x == (float)meta_int(name, "rope_theta"), "theta %g", x);
    REQ(gguf_get_f32(f, "llama.attention.layer_norm_rms_epsilon", &x) == 0 && x > 0 && x < 1e-3, "eps %g", x);
    REQ(gguf_get_str(f, "tokenizer.ggml.model", &s) == 0 && s.len == 4 && !memcmp(s.ptr, "gpt2", 4), "tok model");
    REQ(gguf_get_str(f, "tokenizer.ggml.pre", &s) == 0 && s.len == 6 && !memcmp(s.ptr, "smollm", 6), "tok pre");
    kv = gguf_find_kv(f, "tokenizer.ggml.tokens");
    REQ(kv && kv->arr_type == GGUF_STRING && kv->arr_n == (uint64_t)vocab && kv->arr_str, "tokens");
    REQ(kv->arr_str[0].len == 13 && !memcmp(kv->arr_str[0].ptr, "<|endoftext|>", 13), "token 0");
    kv = gguf_find_kv(f, "tokenizer.ggml.token_type");
    int64_t tt;
    REQ(kv && kv->arr_n == (uint64_t)vocab && gguf_arr_i64(kv, 1, &tt) == 0 && tt == 3, "token_type");
    REQ(gguf_get_u32(f, "tokenizer.ggml.bos_token_id", &u) == 0 && u == 1, "bos");
    REQ(gguf_get_u32(f, "tokenizer.ggml.eos_token_id", &u) == 0 && u == 2, "eos");
    kv = gguf_find_kv(f, "tokenizer.ggml.merges");
    REQ(kv && kv->arr_type == GGUF_STRING && kv->arr_n > 0, "merges");

    long hd = dim / heads;
    REQ((t = gguf_find_tensor(f, "token_embd.weight")) && t->type == wtype && t->n_dims == 2 && t->ne[0] == (uint64_t)dim &&
        t->ne[1] == (uint64_t)vocab, "token_embd");
    REQ((t = gguf_find_tensor(f, "output_norm.weight")) && t->type == GGML_F32 && t->n_dims == 1 && t->ne[0] == (uint64_t)dim,
        "output_norm");
    REQ((gguf_find_tensor(f, "output.weight") == NULL) == tied, "output.weight presence (tied=%d)", tied);
    for (long l = 0; l < layers; l++) {
        struct { const char *n; long ne0, ne1; ggml_type ty; } w[] = {
            {"attn_norm", dim, 0, GGML_F32}, {"ffn_norm", dim, 0, GGML_F32},
            {"attn_q", dim, dim, wtype}, {"attn_k", dim, kvh * hd, wtype}, {"attn_v", dim, kvh * hd, wtype},
            {"attn_output", dim, dim, wtype}, {"ffn_gate", dim, ffn, wtype}, {"ffn_up", dim, ffn, wtype},
            {"ffn_down", ffn, dim, wtype},
        };
        for (size_t i = 0; i < sizeof w / sizeof w[0]; i++) {
            char tn[64];
            snprintf(tn, sizeof tn, "blk.%ld.%s.weight", l, w[i].n);
            t = gguf_find_tensor(f, tn);
            REQ(t, "%s missing", tn);
            REQ(t->type == w[i].ty && t->ne[0] == (uint64_t)w[i].ne0 &&
                (w[i].ne1 ? t->n_dims == 2 && t->ne[1] == (uint64_t)w[i].ne1 : t->n_dims == 1),
                "%s: type %s dims %u [%" PRIu64 ", %" PRIu64 "]", tn, ggml_type_name(t->type), t->n_dims,
                t->ne[0], t->ne[1]);
        }
    }
    REQ(f->n_tensors == (uint64_t)(2 + 9 * layers + (tied ? 0 : 1)), "n_tensors %" PRIu64, f->n_tensors);
    *ok = 1;
out:
#undef REQ
    gguf_close(f);
}

static void test_models_open(void)
{
    char why[600] = "";
    int ok;
    NEED_TESTDATA();
    for (size_t i = 0; i < N_DTYPES; i++) {
        char name[64];
        snprintf(name, sizeof name, "tiny-%s", dtypes[i]);
        check_model(name, dtype_codes[i], 3, 1, why, sizeof why, &ok);
        CHECK(ok, "%s: %.300s", name, why);
    }
}

static void test_model_v2(void)
{
    char why[600] = "";
    int ok;
    NEED_TESTDATA();
    check_model("tiny-v2", GGML_Q8_0, 2, 1, why, sizeof why, &ok);
    CHECK(ok, "tiny-v2: %.300s", why);
}

static void test_model_untied(void)
{
    char why[600] = "";
    int ok;
    NEED_TESTDATA();
    check_model("tiny-untied", GGML_Q4_0, 3, 0, why, sizeof why, &ok);
    CHECK(ok, "tiny-untied: %.300s", why);
}

/* Our dequantizer against the gguf package's, tensor by tensor. Both compute
 * q*d (+m) in fp32 from the same f16 scales, and each product is exact, so
 * the results must match bit for bit. */
static void compare_expected(const char *name, char *why, size_t cap, int *n_checked)
{
    static const char *tensors[] = {
        "token_embd.weight", "output.weight", "output_norm.weight", "blk.0.attn_norm.weight",
        "blk.0.attn_q.weight", "blk.0.attn_k.weight", "blk.0.attn_v.weight", "blk.0.ffn_down.weight",
        "blk.1.ffn_gate.weight",
    };
    char path[512];
    gguf_file *f;
    *n_checked = 0;
    if (gguf_open(model_path(name, path, sizeof path), &f) != 0) {
        snprintf(why, cap, "open: %s", rd_errmsg());
        return;
    }
    for (size_t i = 0; i < sizeof tensors / sizeof tensors[0]; i++) {
        size_t n;
        snprintf(path, sizeof path, "%s/%s/%s.f32", testdata(), name, tensors[i]);
        float *want = (float *)read_file(path, &n);
        const gguf_tensor *t = gguf_find_tensor(f, tensors[i]);
        if (!want || !t) {
            free(want);
            continue;   /* not every model has every tensor; the count below says how many were seen */
        }
        float *got = malloc(t->n_elems * sizeof *got);
        int rc = gguf_dequant(t, got);
        int bad = rc != 0 || n != t->n_elems * 4 || memcmp(got, want, n) != 0;
        if (bad) {
            uint64_t j = 0;
            while (rc == 0 && n == t->n_elems * 4 && j < t->n_elems && got[j] == want[j])
                j++;
            snprintf(why, cap, "%s %s: rc %d (%s), %zu vs %" PRIu64 " values, first difference at %" PRIu64
                     ": %.9g vs %.9g", name, tensors[i], rc, rc ? rd_errmsg() : "", n / 4, t->n_elems, j,
                     j < t->n_elems && rc == 0 ? got[j] : 0.0, j < n / 4 ? want[j] : 0.0);
        }
        free(got);
        free(want);
        if (bad)
            goto out;
        (*n_checked)++;
    }
out:
    gguf_close(f);
}

static void test_dequant_matches_gguf_py(void)
{
    NEED_TESTDATA();
    const char *names[] = {"tiny-f32", "tiny-f16", "tiny-bf16", "tiny-q8_0", "tiny-q4_0", "tiny-q4_1",
                           "tiny-q5_0", "tiny-q5_1", "tiny-q4_k", "tiny-q5_k", "tiny-q6_k", "tiny-v2",
                           "tiny-untied"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        char why[700] = "";
        int n;
        compare_expected(names[i], why, sizeof why, &n);
        CHECK(why[0] == 0, "%.300s", why);
        CHECK(n >= 5, "%s: only %d expected tensors found", names[i], n);
    }
}

/* Every prefix that cuts into the header, metadata or tensor infos, and a
 * sample of prefixes cutting into the data, must fail with a message. */
static void test_truncation(void)
{
    NEED_TESTDATA();
    char path[512];
    size_t size;
    uint8_t *full = read_file(model_path("tiny-q4_1", path, sizeof path), &size);
    CHECK(full, "read %.300s", path);
    gguf_file *f;
    int rc = gguf_parse(full, size, &f);
    CHECK(rc == 0, "full file: %s", rd_errmsg());
    uint64_t data_end = 0;    /* end of the last tensor's bytes: any shorter prefix is truncated */
    for (uint64_t i = 0; i < f->n_tensors; i++)
        if (f->data_offset + f->tensors[i].offset + f->tensors[i].nbytes > data_end)
            data_end = f->data_offset + f->tensors[i].offset + f->tensors[i].nbytes;
    size_t meta_end = (size_t)f->data_offset;
    gguf_close(f);
    int bad = 0;
    size_t bad_at = 0;
    for (size_t n = 0; n < data_end; n += n < meta_end ? 1 : 997) {
        gguf_file *g = NULL;
        rc = parse_exact(full, n, &g);
        if (rc >= 0 || rd_errmsg()[0] == 0 || g != NULL) {
            bad = 1;
            bad_at = n;
            free_parsed(g);
            break;
        }
    }
    free(full);
    CHECK(!bad, "prefix of %zu bytes (of %" PRIu64 "): rc %d, message '%s'", bad_at, data_end, rc, rd_errmsg());
}

/* Flipping bits anywhere before the tensor data must give 0 or an error,
 * never a crash; whatever parses must be safe to read in full. */
static void test_bit_flips(void)
{
    NEED_TESTDATA();
    char path[512];
    size_t size;
    uint8_t *full = read_file(model_path("tiny-q8_0", path, sizeof path), &size);
    CHECK(full, "read %.300s", path);
    gguf_file *f;
    CHECK_OK(gguf_parse(full, size, &f));
    size_t region = (size_t)f->data_offset;
    gguf_close(f);
    uint64_t s = 0x9e3779b97f4a7c15ull;   /* xorshift64*, fixed seed */
    int parsed = 0, rejected = 0, bad = 0;
    for (int i = 0; i < 4000 && !bad; i++) {
        s ^= s >> 12;
        s ^= s << 25;
        s ^= s >> 27;
        uint64_t r = s * 2685821657736338717ull;
        size_t bit = (size_t)(r % (region * 8));
        /* Half the flips hit the first 512 bytes: header, counts, the first kvs. */
        if (i % 2 == 0 && region > 512)
            bit = (size_t)(r % (512 * 8));
        full[bit / 8] ^= (uint8_t)(1u << (bit % 8));
        gguf_file *g = NULL;
        int rc = parse_exact(full, size, &g);
        if (rc == 0) {
            touch_all(g);
            parsed++;
        } else if (rc < 0 && rd_errmsg()[0]) {
            rejected++;
        } else {
            bad = 1;
        }
        free_parsed(g);
        full[bit / 8] ^= (uint8_t)(1u << (bit % 8));
    }
    free(full);
    CHECK(!bad, "a flip gave a positive code or no message");
    CHECK(parsed > 0 && rejected > 0, "parsed %d rejected %d", parsed, rejected);
}

/* ---------------------------------------------------------------------------
 * The real model (SmolLM2-135M-Instruct Q4_1, pinned by sha256 in
 * tools/fetch_model.sh), when present. The spot values were computed with
 * the gguf package's GGUFReader + gguf.quants.dequantize. */

static const char *real_model(void)
{
    const char *m = getenv("RD_MODEL");
    return m && *m ? m : "models/SmolLM2-135M-Instruct.Q4_1.gguf";
}

static void test_real_model(void)
{
    gguf_file *f;
    CHECK_OK(gguf_open(real_model(), &f));
    uint32_t u;
    float x;
    int ok = 0;
    char why[300] = "";
    const gguf_kv *kv;
#define REQ(cond, ...) do { if (!(cond)) { snprintf(why, sizeof why, __VA_ARGS__); goto out; } } while (0)
    REQ(f->version == 3 && f->alignment == 32 && f->n_tensors == 272, "v%u align %u %" PRIu64 " tensors",
        f->version, f->alignment, f->n_tensors);
    REQ(gguf_get_u32(f, "llama.block_count", &u) == 0 && u == 30, "block_count");
    REQ(gguf_get_u32(f, "llama.embedding_length", &u) == 0 && u == 576, "embedding_length");
    REQ(gguf_get_u32(f, "llama.attention.head_count_kv", &u) == 0 && u == 3, "head_count_kv");
    REQ(gguf_get_f32(f, "llama.rope.freq_base", &x) == 0 && x == 100000.0f, "freq_base");
    kv = gguf_find_kv(f, "tokenizer.ggml.tokens");
    REQ(kv && kv->arr_type == GGUF_STRING && kv->arr_n == 49152, "tokens");
    kv = gguf_find_kv(f, "tokenizer.ggml.merges");
    REQ(kv && kv->arr_type == GGUF_STRING && kv->arr_n == 48900, "merges");
    kv = gguf_find_kv(f, "tokenizer.ggml.token_type");
    REQ(kv && kv->arr_type == GGUF_INT32 && kv->arr_n == 49152, "token_type");
    for (uint64_t i = 0; i < f->n_tensors; i++) {
        const gguf_tensor *t = &f->tensors[i];
        ggml_type want = t->n_dims == 1 ? GGML_F32 : GGML_Q4_1;
        if (t->name.len == 17 && memcmp(t->name.ptr, "token_embd.weight", 17) == 0)
            want = GGML_Q8_0;
        REQ(t->type == want, "%.*s is %s", (int)t->name.len, t->name.ptr, ggml_type_name(t->type));
    }
    struct { const char *name; uint64_t row; float v0, v1, v17, vlast; double sum; } spot[] = {
        {"token_embd.weight", 1, -0.0238037109f, -0.0158691406f, 0.793457031f, -0.128437042f, 0.35922718048095703},
        {"token_embd.weight", 49151, 0.011505127f, 0.00575256348f, 0.500473022f, -0.0417022705f, -0.46622085571289062},
        {"blk.0.attn_q.weight", 100, -0.226196289f, -0.0988769531f, 0.346740723f, 0.465087891f, -2.812408447265625},
        {"blk.29.ffn_down.weight", 575, -0.229187012f, -0.0391235352f, -0.32421875f, 0.056640625f, -5.229949951171875},
        {"output_norm.weight", 0, 1.7578125f, 1.8203125f, -1.2578125f, 1.984375f, 1038.33203125},
    };
    float row[1536];   /* the values are dyadic with few bits, so these double sums are exact in any order */
    for (size_t i = 0; i < sizeof spot / sizeof spot[0]; i++) {
        const gguf_tensor *t = gguf_find_tensor(f, spot[i].name);
        REQ(t && t->ne[0] <= 1536, "%s", spot[i].name);
        size_t rb = ggml_row_bytes(t->type, t->ne[0]);
        REQ(ggml_dequant_row(t->type, t->data + rb * spot[i].row, row, t->ne[0]) == 0, "%s", rd_errmsg());
        double sum = 0;
        for (uint64_t j = 0; j < t->ne[0]; j++)
            sum += row[j];
        REQ(row[0] == spot[i].v0 && row[1] == spot[i].v1 && row[17] == spot[i].v17 &&
            row[t->ne[0] - 1] == spot[i].vlast && sum == spot[i].sum,
            "%s row %" PRIu64 ": %.9g %.9g %.9g %.9g sum %.17g", spot[i].name, spot[i].row, row[0], row[1],
            row[17], row[t->ne[0] - 1], sum);
    }
    ok = 1;
out:
#undef REQ
    gguf_close(f);
    CHECK(ok, "%s", why);
}

/* ---------------------------------------------------------------------------
 * Gemma 3 270M Q4_K_M (tools/fetch_gemma3.sh, pinned by sha256), when present:
 * the reader opens it and dequantizes every tensor bit for bit as the gguf
 * package does. This is the GGUF layer only (tests/py/test_gemma3.py runs the
 * model against llama.cpp). tests/py/gguf_digests.py writes the package's values as one
 * exact fingerprint per tensor (sum of bits(y[i]) * (2i+1) mod 2^64) into
 * $RD_TESTDATA, once per model file. */

static const char *gemma3_model(void)
{
    const char *m = getenv("RD_GEMMA3_MODEL");
    return m && *m ? m : "models/gemma-3-270m-q4_k_m.gguf";
}

static int newer(const char *a, const char *b)   /* a exists and is not older than b */
{
    struct stat sa, sb;
    return stat(a, &sa) == 0 && (stat(b, &sb) != 0 || sa.st_mtime >= sb.st_mtime);
}

/* Fingerprint of n values (see gguf_digests.py), continuing from *acc at element `start`. */
static void digest_values(const float *y, uint64_t n, uint64_t start, uint64_t *acc)
{
    for (uint64_t i = 0; i < n; i++) {
        uint32_t bits;
        memcpy(&bits, &y[i], 4);
        *acc += (uint64_t)bits * (2 * (start + i) + 1);
    }
}

static int json_u32_at(const cJSON *arr, int i, uint32_t *out)
{
    const cJSON *v = cJSON_GetArrayItem(arr, i);
    if (!cJSON_IsNumber(v))
        return 0;
    *out = (uint32_t)v->valuedouble;
    return 1;
}

static void test_gemma3_file(void)
{
    const char *model = gemma3_model();
    char digests[400], cmd[2400];
    snprintf(digests, sizeof digests, "%s/gemma-3-270m-q4_k_m.digests.json", testdata());
    if (!newer(digests, model) || !newer(digests, "tests/py/gguf_digests.py")) {
        const char *py = getenv("PYTHON");
        snprintf(cmd, sizeof cmd, "mkdir -p '%s' && %s tests/py/gguf_digests.py '%s' '%s.tmp' >/dev/null && mv '%s.tmp' '%s'",
                 testdata(), py && *py ? py : "python3", model, digests, digests, digests);
        CHECK(system(cmd) == 0, "%.300s failed", cmd);
    }
    size_t jn;
    char *text = (char *)read_file(digests, &jn);
    CHECK(text, "read %.200s", digests);
    text = realloc(text, jn + 1);
    text[jn] = 0;
    cJSON *want = cJSON_Parse(text);
    free(text);
    CHECK(cJSON_IsArray(want), "%.200s: not a JSON array", digests);

    gguf_file *f;
    int rc = gguf_open(model, &f);
    if (rc) {
        cJSON_Delete(want);
        CHECK_OK(rc);
    }
    char why[400] = "";
    int ok = 0;
    float *y = NULL;
    uint32_t u;
    float x;
    gguf_str s;
#define REQ(cond, ...) do { if (!(cond)) { snprintf(why, sizeof why, __VA_ARGS__); goto out; } } while (0)
    REQ(f->version == 3 && f->n_tensors == 236, "v%u, %" PRIu64 " tensors", f->version, f->n_tensors);
    REQ(gguf_get_str(f, "general.architecture", &s) == 0 && s.len == 6 && !memcmp(s.ptr, "gemma3", 6), "arch");
    REQ(gguf_get_u32(f, "gemma3.block_count", &u) == 0 && u == 18, "block_count");
    REQ(gguf_get_u32(f, "gemma3.embedding_length", &u) == 0 && u == 640, "embedding_length");
    REQ(gguf_get_u32(f, "gemma3.feed_forward_length", &u) == 0 && u == 2048, "ffn");
    REQ(gguf_get_u32(f, "gemma3.attention.head_count", &u) == 0 && u == 4, "heads");
    REQ(gguf_get_u32(f, "gemma3.attention.head_count_kv", &u) == 0 && u == 1, "kv heads");
    REQ(gguf_get_u32(f, "gemma3.attention.key_length", &u) == 0 && u == 256, "key_length");
    REQ(gguf_get_u32(f, "gemma3.attention.sliding_window", &u) == 0 && u == 512, "sliding_window");
    REQ(gguf_get_u32(f, "gemma3.context_length", &u) == 0 && u == 32768, "context_length");
    REQ(gguf_get_f32(f, "gemma3.rope.freq_base", &x) == 0 && x == 1e6f, "freq_base");
    REQ(gguf_find_tensor(f, "output.weight") == NULL, "output.weight (the output is tied)");

    /* Type census: F32 norms, Q5_0 for rows of 640 (not a multiple of 256),
     * Q4_K / Q6_K for rows of 1024 and 2048, Q8_0 for token_embd and some attn_v. */
    static const struct { ggml_type t; int n; } census[] = {
        {GGML_F32, 109}, {GGML_Q5_0, 81}, {GGML_Q4_K, 27}, {GGML_Q8_0, 10}, {GGML_Q6_K, 9},
    };
    int counted = 0;
    for (size_t c = 0; c < sizeof census / sizeof census[0]; c++) {
        int n = 0;
        for (uint64_t i = 0; i < f->n_tensors; i++)
            n += f->tensors[i].type == census[c].t;
        REQ(n == census[c].n, "%d %s tensors, expected %d", n, ggml_type_name(census[c].t), census[c].n);
        counted += n;
    }
    REQ(counted == 236, "tensors of other types: %d", 236 - counted);
    REQ(cJSON_GetArraySize(want) == 236, "%.200s holds %d tensors", digests, cJSON_GetArraySize(want));

    uint64_t total = 0;
    const size_t whole_max = (size_t)1 << 22;     /* dequantize whole tensors up to this, larger ones by rows */
    y = malloc(whole_max * sizeof *y);
    REQ(y, "out of memory");
    for (uint64_t i = 0; i < f->n_tensors; i++) {
        const gguf_tensor *t = &f->tensors[i];
        const cJSON *w = cJSON_GetArrayItem(want, (int)i);
        const cJSON *name = cJSON_GetObjectItem(w, "name"), *type = cJSON_GetObjectItem(w, "type");
        const cJSON *ne = cJSON_GetObjectItem(w, "ne"), *dg = cJSON_GetObjectItem(w, "digest");
        const cJSON *head = cJSON_GetObjectItem(w, "head"), *tail = cJSON_GetObjectItem(w, "tail");
        REQ(cJSON_IsString(name) && cJSON_IsNumber(type) && cJSON_IsArray(ne) && cJSON_IsString(dg) &&
            cJSON_IsArray(head) && cJSON_IsArray(tail), "%.200s: entry %" PRIu64 " malformed", digests, i);
        REQ(strlen(name->valuestring) == t->name.len && !memcmp(name->valuestring, t->name.ptr, t->name.len) &&
            type->valueint == (int)t->type && cJSON_GetArraySize(ne) == (int)t->n_dims,
            "tensor %" PRIu64 " '%.*s' %s: the gguf package says '%s' type %d", i, (int)t->name.len, t->name.ptr,
            ggml_type_name(t->type), name->valuestring, type->valueint);
        for (uint32_t d = 0; d < t->n_dims; d++)
            REQ((uint64_t)cJSON_GetArrayItem(ne, (int)d)->valuedouble == t->ne[d], "%s: ne[%u]", name->valuestring, d);
        uint64_t acc = 0, ne0 = t->ne[0], rows = t->n_elems / ne0;
        uint32_t h[4], tl[4], hw = 0, tw = 0;
        if (t->n_elems <= whole_max) {
            REQ(gguf_dequant(t, y) == 0, "%s: %s", name->valuestring, rd_errmsg());
            digest_values(y, t->n_elems, 0, &acc);
            for (int k = 0; k < 4; k++) {
                memcpy(&h[k], &y[k], 4);
                memcpy(&tl[k], &y[t->n_elems - 4 + k], 4);
            }
        } else {
            size_t rb = ggml_row_bytes(t->type, ne0);
            REQ(rb && rb * rows == t->nbytes && ne0 <= whole_max, "%s: row bytes %zu", name->valuestring, rb);
            for (uint64_t r = 0; r < rows; r++) {
                REQ(ggml_dequant_row(t->type, t->data + rb * r, y, ne0) == 0, "%s: %s", name->valuestring,
                    rd_errmsg());
                digest_values(y, ne0, r * ne0, &acc);
                if (r == 0)
                    memcpy(h, y, sizeof h);
            }
            memcpy(tl, y + ne0 - 4, sizeof tl);
        }
        for (int k = 0; k < 4; k++) {
            REQ(json_u32_at(head, k, &hw) && json_u32_at(tail, k, &tw), "%s: head/tail malformed", name->valuestring);
            REQ(hw == h[k], "%s (%s): value %d is bits 0x%08x, the gguf package's 0x%08x", name->valuestring,
                ggml_type_name(t->type), k, h[k], hw);
            REQ(tw == tl[k], "%s (%s): value %d from the end is bits 0x%08x, the gguf package's 0x%08x",
                name->valuestring, ggml_type_name(t->type), 4 - k, tl[k], tw);
        }
        char got[24];
        snprintf(got, sizeof got, "%" PRIu64, acc);
        REQ(strcmp(got, dg->valuestring) == 0, "%s (%s, %" PRIu64 " values): fingerprint %s, the gguf package %s",
            name->valuestring, ggml_type_name(t->type), t->n_elems, got, dg->valuestring);
        total += t->n_elems;
    }
    printf("# gemma-3-270m-q4_k_m: 236 tensors, %" PRIu64 " values, every one as the gguf package reads it\n", total);
    ok = 1;
out:
#undef REQ
    free(y);
    gguf_close(f);
    cJSON_Delete(want);
    CHECK(ok, "%s", why);
}

static void test_open_errors(void)
{
    gguf_file *f = (gguf_file *)1;
    CHECK(gguf_open("/nonexistent/x.gguf", &f) == RD_EIO && f == NULL, "missing file");
    CHECK(strstr(rd_errmsg(), "/nonexistent/x.gguf") != NULL, "message names the path: %s", rd_errmsg());
    CHECK(gguf_open("/", &f) == RD_EIO, "a directory");
}

int main(void)
{
    RUN(test_f16_all_values);
    RUN(test_bf16_rounding);
    RUN(test_block_layouts);
    RUN(test_quant_blocks);
    RUN(test_q5_blocks);
    RUN(test_k_blocks);
    RUN(test_memory_image_all_types);
    RUN(test_corrupt_cases);
    RUN(test_corrupt_counts);
    RUN(test_new_types_bounds);
    RUN(test_open_errors);
    if (file_exists(real_model()))
        RUN(test_real_model);
    else
        printf("SKIP test_real_model: %s not found (make model)\n", real_model());
    if (file_exists(gemma3_model()))
        RUN(test_gemma3_file);
    else
        printf("SKIP test_gemma3_file: %s not found (make model-gemma3)\n", gemma3_model());
    ensure_testdata();
    RUN(test_models_open);
    RUN(test_model_v2);
    RUN(test_model_untied);
    RUN(test_dequant_matches_gguf_py);
    RUN(test_truncation);
    RUN(test_bit_flips);
    TEST_EXIT();
}
