/* fuzz_gguf.c - libFuzzer target for the GGUF reader (`make fuzz`).
 *
 * Parses the input; if it parses, reads everything a loader would: every kv
 * through the typed getters and every array element, every tensor's first
 * and last byte, and dequantizes the small tensors. AddressSanitizer then
 * proves that no view the parser handed out points outside the input.
 * A failed parse must leave a message. Seed it with the tiny models:
 *   build/fuzz/fuzz_gguf -max_total_time=60 CORPUS_DIR */
#include "base/err.h"
#include "engine/format/gguf.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static volatile double sink;

static void touch_kvs(const gguf_file *f)
{
    char key[80];
    for (uint64_t i = 0; i < f->n_kv; i++) {
        const gguf_kv *kv = &f->kv[i];
        int n = kv->key.len < 70 ? (int)kv->key.len : 70;
        snprintf(key, sizeof key, "%.*s", n, kv->key.ptr);
        uint32_t u;
        int64_t v;
        float x;
        int b;
        gguf_str s;
        if (gguf_get_u32(f, key, &u) == 0) sink += u;
        if (gguf_get_i64(f, key, &v) == 0) sink += (double)v;
        if (gguf_get_f32(f, key, &x) == 0) sink += x;
        if (gguf_get_bool(f, key, &b) == 0) sink += b;
        if (gguf_get_str(f, key, &s) == 0 && s.len) sink += (uint8_t)s.ptr[0] + (uint8_t)s.ptr[s.len - 1];
        if (kv->type != GGUF_ARRAY)
            continue;
        for (uint64_t j = 0; j < kv->arr_n; j++) {
            if (gguf_arr_i64(kv, j, &v) == 0) sink += (double)v;
            if (kv->arr_str && kv->arr_str[j].len)
                sink += (uint8_t)kv->arr_str[j].ptr[0] + (uint8_t)kv->arr_str[j].ptr[kv->arr_str[j].len - 1];
        }
    }
}

static void touch_tensors(const gguf_file *f)
{
    for (uint64_t i = 0; i < f->n_tensors; i++) {
        const gguf_tensor *t = &f->tensors[i];
        if (gguf_find_tensor(f, "token_embd.weight") == t) sink += 1;
        sink += t->data[0] + t->data[t->nbytes - 1];
        if (t->n_elems > (1u << 16) || ggml_row_bytes(t->type, t->n_elems) == 0)
            continue;
        float *y = malloc(t->n_elems * sizeof *y);
        if (y && gguf_dequant(t, y) == 0)
            sink += y[0] + y[t->n_elems - 1];
        free(y);
    }
}

/* The input as whole blocks of each runnable type (at most 16 KiB of it). */
static void touch_raw_blocks(const uint8_t *data, size_t size)
{
    static const ggml_type types[] = {GGML_F32, GGML_F16, GGML_BF16, GGML_Q4_0, GGML_Q4_1, GGML_Q5_0,
                                      GGML_Q5_1, GGML_Q8_0, GGML_Q4_K, GGML_Q5_K, GGML_Q6_K};
    static float y[16384];
    if (size > 16384)
        size = 16384;
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) {
        uint32_t blck, bytes;
        if (ggml_type_layout(types[i], &blck, &bytes) != 0)
            abort();
        uint64_t n = (uint64_t)(size / bytes) * blck;
        if (n == 0 || n > sizeof y / sizeof y[0])
            continue;
        if (ggml_row_bytes(types[i], n) != size / bytes * bytes || ggml_dequant_row(types[i], data, y, n) != 0)
            abort();   /* a runnable type must size and decode whole blocks */
        sink += y[0] + y[n - 1];
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    touch_raw_blocks(data, size);
    gguf_file *f = NULL;
    int rc = gguf_parse(data, size, &f);
    if (rc != 0) {
        if (rc > 0 || f != NULL || rd_errmsg()[0] == 0)
            abort();   /* an error must be negative, leave nothing, and say why */
        return 0;
    }
    touch_kvs(f);
    touch_tensors(f);
    gguf_close(f);
    return 0;
}
