/* test_safetensors.c - the safetensors reader/writer on hand-built files:
 * every corruption is a clean error naming the tensor or offset, conversions
 * are exact, sharded folders resolve, and the HF config parser refuses what
 * the engine cannot run. */
#include <stdint.h>
#include <unistd.h>

#include "base/err.h"
#include "engine/format/gguf.h"
#include "engine/model/model.h"
#include "engine/format/safetensors.h"
#include "tests/unit/test.h"

/* u64 LE header length + header + data_len bytes of data (pattern). */
static uint8_t *mk(const char *hdr, size_t data_len, size_t *size)
{
    size_t h = strlen(hdr);
    *size = 8 + h + data_len;
    uint8_t *b = malloc(*size);
    for (int i = 0; i < 8; i++)
        b[i] = (uint8_t)((uint64_t)h >> (8 * i));
    memcpy(b + 8, hdr, h);
    for (size_t i = 0; i < data_len; i++)
        b[8 + h + i] = (uint8_t)i;
    return b;
}

/* Parses hdr + data and expects error code `want` with `needle` in the message. */
static int bad(const char *hdr, size_t data_len, int want, const char *needle, char *why, size_t cap)
{
    size_t size;
    uint8_t *b = mk(hdr, data_len, &size);
    st_file *f = (st_file *)1;
    int rc = st_parse(b, size, &f);
    int ok = rc == want && f == NULL && strstr(rd_errmsg(), needle) != NULL;
    snprintf(why, cap, "rc %d (want %d), msg '%s' (want '%s')", rc, want, rd_errmsg(), needle);
    free(b);
    return ok;
}

static char why[1024];
#define BAD(hdr, n, want, needle) CHECK(bad(hdr, n, want, needle, why, sizeof why), "%.200s", why)

static void test_valid_file_reads_back(void)
{
    const char *hdr = "{\"__metadata__\":{\"format\":\"pt\"},"
                      "\"a\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24]},"
                      "\"b\":{\"dtype\":\"BF16\",\"shape\":[4],\"data_offsets\":[24,32]},"
                      "\"c\":{\"dtype\":\"F16\",\"shape\":[],\"data_offsets\":[32,34]},"
                      "\"e\":{\"dtype\":\"F32\",\"shape\":[0,5],\"data_offsets\":[34,34]}}    ";
    size_t size;
    uint8_t *b = mk(hdr, 34, &size);
    uint8_t *data = b + 8 + strlen(hdr);
    float a[6] = {1.5f, -2, 3.25f, 0, 1e-30f, -7};
    memcpy(data, a, 24);
    uint16_t bf[4] = {0x3f80, 0xc000, 0x7f80, 0x0001};   /* 1, -2, inf, tiny subnormal */
    memcpy(data + 24, bf, 8);
    uint16_t h = 0x3c00;                                 /* f16 1.0 */
    memcpy(data + 32, &h, 2);
    st_file *f;
    CHECK_OK(st_parse(b, size, &f));
    CHECK(f->n_tensors == 4, "%zu tensors", f->n_tensors);
    const st_tensor *t = st_find(f, "a");
    CHECK(t && t->dtype == ST_F32 && t->n_dims == 2 && t->shape[0] == 2 && t->shape[1] == 3 && t->n_elems == 6,
          "a parsed");
    float out[6];
    CHECK_OK(st_read_f32(t, out));
    CHECK(!memcmp(out, a, sizeof a), "a values");
    t = st_find(f, "b");
    CHECK_OK(st_read_f32(t, out));
    CHECK(out[0] == 1 && out[1] == -2 && isinf(out[2]) && out[3] == rd_bf16_to_f32(1) && out[3] > 0, "bf16 values");
    t = st_find(f, "c");
    CHECK(t && t->n_dims == 0 && t->n_elems == 1, "scalar");
    CHECK_OK(st_read_f32(t, out));
    CHECK(out[0] == 1.0f, "f16 value %g", out[0]);
    CHECK(st_find(f, "e") && st_find(f, "e")->n_elems == 0, "empty tensor");
    CHECK(st_find(f, "__metadata__") == NULL && st_find(f, "zz") == NULL, "lookups");
    st_close(f);
    free(b);
}

static void test_truncated_and_header_length(void)
{
    uint8_t tiny[5] = {1, 0, 0, 0, 0};
    st_file *f;
    CHECK(st_parse(tiny, sizeof tiny, &f) == RD_EFORMAT && strstr(rd_errmsg(), "8-byte"), "%s", rd_errmsg());
    /* header length beyond the file */
    size_t size;
    uint8_t *b = mk("{}", 0, &size);
    b[0] = 200;
    int rc = st_parse(b, size, &f);
    free(b);
    CHECK(rc == RD_EFORMAT && strstr(rd_errmsg(), "header length 200 runs past"), "%s", rd_errmsg());
    /* huge length (top byte set) must not allocate or wrap */
    b = mk("{}", 0, &size);
    b[7] = 0xff;
    rc = st_parse(b, size, &f);
    free(b);
    CHECK(rc == RD_EFORMAT && strstr(rd_errmsg(), "header length"), "%s", rd_errmsg());
    /* truncated data: tensor says 24 bytes, file holds 20 */
    BAD("{\"a\":{\"dtype\":\"F32\",\"shape\":[6],\"data_offsets\":[0,24]}}", 20, RD_EFORMAT,
        "tensor 'a': data_offsets [0, 24] out of range (data section is 20 bytes)");
}

static void test_offsets_and_sizes(void)
{
    BAD("{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,4]}}", 16, RD_EFORMAT,
        "tensor 'w': data_offsets [8, 4] out of range");
    BAD("{\"w\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[0,12]}}", 16, RD_EFORMAT,
        "tensor 'w': data_offsets [0, 12] hold 12 bytes, expected 16 (4 elements of F32)");
    BAD("{\"w\":{\"dtype\":\"BF16\",\"shape\":[3],\"data_offsets\":[0,12]}}", 16, RD_EFORMAT,
        "expected 6 (3 elements of BF16)");
    BAD("{\"w\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,4]}}", 16, RD_EFORMAT,
        "tensor 'w': shape[0] is not a non-negative integer");
    BAD("{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0]}}", 16, RD_EFORMAT,
        "tensor 'w': \"data_offsets\" must be [begin, end]");
    BAD("{\"w\":{\"dtype\":\"F32\",\"shape\":[1.5],\"data_offsets\":[0,4]}}", 16, RD_EFORMAT, "shape[0]");
    BAD("{\"w\":{\"shape\":[1],\"data_offsets\":[0,4]}}", 16, RD_EFORMAT, "tensor 'w': \"dtype\" missing");
    BAD("{\"w\":{\"dtype\":\"F32\",\"shape\":[4611686018427387904,4],\"data_offsets\":[0,16]}}", 16, RD_EFORMAT,
        "tensor 'w'");
    BAD("{\"w\":7}", 16, RD_EFORMAT, "tensor 'w': header entry is not an object");
}

static void test_overlap(void)
{
    BAD("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
        "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}",
        16, RD_EFORMAT, "tensors 'a' [0, 8] and 'b' [4, 12] overlap");
    /* same range twice, listed in reverse order */
    BAD("{\"b\":{\"dtype\":\"F16\",\"shape\":[2],\"data_offsets\":[8,12]},"
        "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,12]}}",
        16, RD_EFORMAT, "overlap");
}

static void test_dtypes(void)
{
    BAD("{\"w\":{\"dtype\":\"Q4\",\"shape\":[2],\"data_offsets\":[0,8]}}", 16, RD_ENOTSUP,
        "tensor 'w': dtype 'Q4' is unknown");
    /* a defined but non-float dtype parses (a file may carry one), but cannot be read as weights */
    size_t size;
    uint8_t *b = mk("{\"ids\":{\"dtype\":\"I64\",\"shape\":[2],\"data_offsets\":[0,16]}}", 16, &size);
    st_file *f;
    int rc = st_parse(b, size, &f);
    CHECK(rc == 0, "I64 parse: %s", rd_errmsg());
    float out[2];
    rc = st_read_f32(st_find(f, "ids"), out);
    st_close(f);
    free(b);
    CHECK(rc == RD_ENOTSUP && strstr(rd_errmsg(), "tensor 'ids' has dtype I64"), "%s", rd_errmsg());
}

static void test_bad_json(void)
{
    BAD("{\"a\": {\"dtype\": \"F32\",", 16, RD_EFORMAT, "header is not a JSON object");
    BAD("[1,2,3]", 16, RD_EFORMAT, "header is not a JSON object");
    BAD("{} xx", 16, RD_EFORMAT, "trailing bytes after the JSON header at byte 11");
    BAD("{\"__metadata__\":3}", 16, RD_EFORMAT, "__metadata__");
}

static void test_conversions(void)
{
    /* f16: every finite half round-trips through f32 exactly */
    for (uint32_t h = 0; h < 0x10000; h++) {
        if ((h & 0x7c00) == 0x7c00 && (h & 0x3ff))
            continue;   /* NaN payloads */
        float f = rd_f16_to_f32((uint16_t)h);
        CHECK(st_f32_to_f16(f) == h, "half 0x%04x -> %g -> 0x%04x", h, f, st_f32_to_f16(f));
    }
    CHECK(st_f32_to_f16(1.0f + 1.0f / 2048) == 0x3c00, "tie to even (down)");
    CHECK(st_f32_to_f16(1.0f + 3.0f / 2048) == 0x3c02, "tie to even (up)");
    CHECK(st_f32_to_f16(65520.0f) == 0x7c00, "overflow rounds to inf");
    CHECK(st_f32_to_f16(1e-9f) == 0, "underflow to zero");
    uint16_t nan = st_f32_to_f16(NAN);
    CHECK((nan & 0x7c00) == 0x7c00 && (nan & 0x3ff), "NaN stays NaN");
    /* bf16 */
    CHECK(rd_f32_to_bf16(1.0f) == 0x3f80 && rd_bf16_to_f32(0x3f80) == 1.0f, "bf16 1");
    CHECK(rd_bf16_to_f32(rd_f32_to_bf16(-3.140625f)) == -3.140625f, "bf16 exact value");
    st_dtype t;
    CHECK(st_dtype_parse("bf16", &t) == 0 && t == ST_BF16 && st_dtype_parse("F16", &t) == 0 && t == ST_F16 &&
              st_dtype_parse("int8", &t) == RD_EINVAL,
          "dtype names");
}

/* ---- files: writer round trip, st_open errors, sharded folders. */

static const float *g_src[3];
static int fill(void *ctx, size_t i, float *dst)
{
    size_t n = i == 0 ? 6 : i == 1 ? 4 : 3;
    memcpy(dst, g_src[i], n * sizeof(float));
    return 0;
}

static void tmpdir(char *buf, size_t cap)
{
    const char *t = getenv("RD_TMP");
    snprintf(buf, cap, "%s/st_XXXXXX", t && *t ? t : "/tmp");
    if (!mkdtemp(buf))
        buf[0] = 0;
}

static void test_writer_round_trip(void)
{
    char dir[512], path[600];
    tmpdir(dir, sizeof dir);
    CHECK(dir[0], "mkdtemp");
    float a[6] = {1, -2, 3.5f, 1e-3f, 65504, 0.1f}, b[4] = {1, 2.5f, -0.099609375f, 3e38f}, c[3] = {0.5f, -1, 2};
    g_src[0] = a;
    g_src[1] = b;
    g_src[2] = c;
    st_spec sp[3] = {{.name = "x.f32", .dtype = ST_F32, .n_dims = 2, .shape = {2, 3}},
                     {.name = "y.bf16", .dtype = ST_BF16, .n_dims = 1, .shape = {4}},
                     {.name = "z.f16", .dtype = ST_F16, .n_dims = 1, .shape = {3}}};
    snprintf(path, sizeof path, "%s/m.safetensors", dir);
    CHECK_OK(st_write(path, sp, 3, "{\"format\":\"pt\"}", fill, NULL));
    st_file *f;
    CHECK_OK(st_open(path, &f));
    CHECK(((f->tensors[0].data - f->base) % 8) == 0, "data section 8-byte aligned");
    float out[6];
    CHECK_OK(st_read_f32(st_find(f, "x.f32"), out));
    CHECK(!memcmp(out, a, sizeof a), "f32 exact");
    CHECK_OK(st_read_f32(st_find(f, "y.bf16"), out));
    for (int i = 0; i < 4; i++)
        CHECK(out[i] == rd_bf16_to_f32(rd_f32_to_bf16(b[i])), "bf16[%d] %g", i, out[i]);
    CHECK_OK(st_read_f32(st_find(f, "z.f16"), out));
    CHECK(out[0] == 0.5f && out[1] == -1 && out[2] == 2, "f16");
    st_close(f);

    /* a lone file opens as a set too */
    st_set *s;
    CHECK_OK(st_set_open(path, &s));
    CHECK(s->n_files == 1 && st_set_find(s, "z.f16"), "set of one");
    st_set_close(s);

    /* truncate the file on disk: a clean error naming the path and tensor */
    CHECK(truncate(path, 8 + 100) == 0, "truncate");
    int rc = st_open(path, &f);
    CHECK(rc == RD_EFORMAT && f == NULL && strstr(rd_errmsg(), path), "%s", rd_errmsg());
    CHECK(st_open("/nonexistent/m.safetensors", &f) == RD_EIO && strstr(rd_errmsg(), "/nonexistent"), "missing");
    remove(path);
    rmdir(dir);
}

static void write_text(const char *path, const char *s)
{
    FILE *fp = fopen(path, "w");
    if (fp) {
        fputs(s, fp);
        fclose(fp);
    }
}

static void test_sharded_folder(void)
{
    char dir[512], p1[600], p2[600], idx[600];
    tmpdir(dir, sizeof dir);
    CHECK(dir[0], "mkdtemp");
    float a[6] = {1, 2, 3, 4, 5, 6}, b[4] = {7, 8, 9, 10}, c[3] = {11, 12, 13};
    g_src[0] = a;
    g_src[1] = b;
    g_src[2] = c;
    st_spec s1[1] = {{.name = "w1", .dtype = ST_F32, .n_dims = 2, .shape = {2, 3}}};
    st_spec s2[1] = {{.name = "w2", .dtype = ST_F32, .n_dims = 1, .shape = {6}}};   /* reads g_src[0] */
    snprintf(p1, sizeof p1, "%s/model-00001-of-00002.safetensors", dir);
    snprintf(p2, sizeof p2, "%s/model-00002-of-00002.safetensors", dir);
    snprintf(idx, sizeof idx, "%s/model.safetensors.index.json", dir);
    CHECK_OK(st_write(p1, s1, 1, NULL, fill, NULL));
    CHECK_OK(st_write(p2, s2, 1, NULL, fill, NULL));
    write_text(idx, "{\"metadata\":{\"total_size\":48},\"weight_map\":{\"w1\":\"model-00001-of-00002.safetensors\","
                    "\"w2\":\"model-00002-of-00002.safetensors\"}}");
    st_set *s;
    CHECK_OK(st_set_open(dir, &s));
    CHECK(s->n_files == 2 && st_set_find(s, "w1") && st_set_find(s, "w2") && !st_set_find(s, "w3"), "two shards");
    st_set_close(s);

    /* the index names a tensor its shard does not hold */
    write_text(idx, "{\"weight_map\":{\"w1\":\"model-00002-of-00002.safetensors\"}}");
    int rc = st_set_open(dir, &s);
    CHECK(rc == RD_EFORMAT && strstr(rd_errmsg(), "maps tensor 'w1'"), "%s", rd_errmsg());
    /* a shard outside the folder */
    write_text(idx, "{\"weight_map\":{\"w1\":\"../x.safetensors\"}}");
    rc = st_set_open(dir, &s);
    CHECK(rc == RD_EFORMAT && strstr(rd_errmsg(), "weight_map['w1']"), "%s", rd_errmsg());
    /* the same name in two shards */
    st_spec s3[1] = {{.name = "w1", .dtype = ST_F32, .n_dims = 1, .shape = {6}}};
    CHECK_OK(st_write(p2, s3, 1, NULL, fill, NULL));
    write_text(idx, "{\"weight_map\":{\"w1\":\"model-00001-of-00002.safetensors\",\"x\":"
                    "\"model-00002-of-00002.safetensors\"}}");
    rc = st_set_open(dir, &s);
    CHECK(rc == RD_EFORMAT && (strstr(rd_errmsg(), "two shards") || strstr(rd_errmsg(), "maps tensor 'x'")), "%s",
          rd_errmsg());
    remove(idx);
    rc = st_set_open(dir, &s);
    CHECK(rc == RD_ENOENT && strstr(rd_errmsg(), "model.safetensors"), "%s", rd_errmsg());
    remove(p1);
    remove(p2);
    rmdir(dir);
}

static void test_hf_config(void)
{
    const char *base = "{\"architectures\":[\"LlamaForCausalLM\"],\"hidden_size\":64,\"intermediate_size\":128,"
                       "\"num_attention_heads\":4,\"num_key_value_heads\":2,\"num_hidden_layers\":2,"
                       "\"vocab_size\":300,\"max_position_embeddings\":256,\"rms_norm_eps\":1e-05,"
                       "\"rope_theta\":10000.0,\"tie_word_embeddings\":true%s}";
    char j[1024];
    model_config c;
    snprintf(j, sizeof j, base, "");
    CHECK_OK(model_config_from_hf_json(j, &c));
    CHECK(c.dim == 64 && c.head_dim == 16 && c.n_kv_heads == 2 && c.tied_embeddings && c.norm_eps == 1e-5f &&
              c.rope_theta == 10000.0f && c.max_ctx == 256,
          "fields");
    /* the exported text parses back to the same config */
    char *text;
    CHECK_OK(model_config_to_hf_json(&c, "float32", &text));
    model_config c2;
    int rc = model_config_from_hf_json(text, &c2);
    free(text);
    CHECK(rc == 0 && !memcmp(&c, &c2, sizeof c), "config round trip");
    /* linear scaling: every divisor is the factor */
    snprintf(j, sizeof j, base, ",\"rope_scaling\":{\"type\":\"linear\",\"factor\":2}");
    CHECK_OK(model_config_from_hf_json(j, &c));
    CHECK(c.rope_type == ROPE_LINEAR && c.rope_div[0] == 2.0f && c.rope_div[7] == 2.0f, "linear divisors");
    /* a type the engine does not implement is an error naming it, never plain RoPE */
    snprintf(j, sizeof j, base, ",\"rope_scaling\":{\"rope_type\":\"yarn\",\"factor\":4}");
    CHECK(model_config_from_hf_json(j, &c) == RD_ENOTSUP && strstr(rd_errmsg(), "yarn"), "%s", rd_errmsg());
    snprintf(j, sizeof j, base, ",\"rope_scaling\":{\"rope_type\":\"llama3\",\"factor\":8}");
    CHECK(model_config_from_hf_json(j, &c) == RD_EFORMAT && strstr(rd_errmsg(), "low_freq_factor"), "%s",
          rd_errmsg());
    snprintf(j, sizeof j, base, ",\"rope_scaling\":null");
    CHECK_OK(model_config_from_hf_json(j, &c));
    CHECK(model_config_from_hf_json("{\"architectures\":[\"MistralForCausalLM\"]}", &c) == RD_ENOTSUP &&
              strstr(rd_errmsg(), "MistralForCausalLM"),
          "%s", rd_errmsg());
    CHECK(model_config_from_hf_json("{\"architectures\":[\"LlamaForCausalLM\"],\"hidden_size\":64}", &c) ==
                  RD_EFORMAT &&
              strstr(rd_errmsg(), "intermediate_size"),
          "%s", rd_errmsg());
    /* an explicit head_dim sets the q width (4 x 32 = 128 over hidden 64) */
    snprintf(j, sizeof j, base, ",\"head_dim\":32");
    CHECK_OK(model_config_from_hf_json(j, &c));
    CHECK(c.head_dim == 32 && c.dim == 64, "explicit head_dim");
    snprintf(j, sizeof j, base, ",\"head_dim\":7");
    CHECK(model_config_from_hf_json(j, &c) == RD_EFORMAT && strstr(rd_errmsg(), "head_dim"), "%s", rd_errmsg());
    snprintf(j, sizeof j, base, ",\"attention_bias\":true");
    CHECK(model_config_from_hf_json(j, &c) == RD_ENOTSUP && strstr(rd_errmsg(), "attention_bias"), "%s",
          rd_errmsg());
}

/* The families' own rules and the round trip of each family's config. */
static void test_hf_config_families(void)
{
    const char *base = "{\"architectures\":[\"%s\"],\"hidden_size\":64,\"intermediate_size\":128,"
                       "\"num_attention_heads\":4,\"num_key_value_heads\":2,\"num_hidden_layers\":2,"
                       "\"vocab_size\":300,\"max_position_embeddings\":4096,\"rms_norm_eps\":1e-06,"
                       "\"rope_theta\":500000.0,\"tie_word_embeddings\":false%s}";
    char j[1024];
    model_config c, c2;
    snprintf(j, sizeof j, base, "Qwen2ForCausalLM", ",\"use_sliding_window\":false");
    CHECK_OK(model_config_from_hf_json(j, &c));
    CHECK(!strcmp(c.arch, "qwen2"), "qwen2 arch %s", c.arch);
    snprintf(j, sizeof j, base, "Qwen2ForCausalLM", ",\"use_sliding_window\":true");
    CHECK(model_config_from_hf_json(j, &c) == RD_ENOTSUP && strstr(rd_errmsg(), "use_sliding_window"), "%s",
          rd_errmsg());
    snprintf(j, sizeof j, base, "Qwen3ForCausalLM", ",\"head_dim\":32,\"attention_bias\":false");
    CHECK_OK(model_config_from_hf_json(j, &c));
    CHECK(!strcmp(c.arch, "qwen3") && c.head_dim == 32, "qwen3 %s hd %d", c.arch, c.head_dim);
    snprintf(j, sizeof j, base, "Qwen3ForCausalLM", ",\"attention_bias\":true");
    CHECK(model_config_from_hf_json(j, &c) == RD_ENOTSUP && strstr(rd_errmsg(), "attention_bias"), "%s",
          rd_errmsg());

    /* Llama 3: the divisors follow transformers' rule: 1 above the high
     * frequency cut, the factor below the low one, smooth in between. */
    snprintf(j, sizeof j, base, "LlamaForCausalLM",
             ",\"rope_scaling\":{\"rope_type\":\"llama3\",\"factor\":8.0,\"low_freq_factor\":1.0,"
             "\"high_freq_factor\":4.0,\"original_max_position_embeddings\":64}");
    CHECK_OK(model_config_from_hf_json(j, &c));
    CHECK(c.rope_type == ROPE_LLAMA3 && c.rope_div[0] == 1.0f && c.rope_div[7] == 8.0f, "llama3 ends %g %g",
          c.rope_div[0], c.rope_div[7]);
    int smooth = 0;
    for (int i = 0; i < 8; i++) {
        double inv = pow(500000.0, -2.0 * i / 16), wl = 2 * M_PI / inv;
        if (wl >= 64 / 4.0 && wl <= 64 / 1.0) {
            double s = (64 / wl - 1.0) / 3.0, want = 1.0 / ((1 - s) / 8.0 + s);
            CHECK(fabs(c.rope_div[i] - want) < 1e-6 * want, "smooth divisor %d: %g vs %g", i, c.rope_div[i], want);
            smooth++;
        }
    }
    CHECK(smooth > 0, "no divisor in the smooth region: the case checks nothing");
    const char *fams[] = {"LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM"};
    for (int f = 0; f < 3; f++) {
        snprintf(j, sizeof j, base, fams[f], f == 0 ? ",\"rope_scaling\":{\"rope_type\":\"llama3\",\"factor\":8.0,"
                                                      "\"low_freq_factor\":1.0,\"high_freq_factor\":4.0,"
                                                      "\"original_max_position_embeddings\":64}"
                                                    : f == 2 ? ",\"head_dim\":32" : "");
        CHECK_OK(model_config_from_hf_json(j, &c));
        char *text;
        CHECK_OK(model_config_to_hf_json(&c, "bfloat16", &text));
        int rc = model_config_from_hf_json(text, &c2);
        CHECK(rc == 0 && !memcmp(&c, &c2, sizeof c), "%s config round trip: %s", fams[f], text);
        CHECK(strstr(text, fams[f]) != NULL, "%s: exported class", fams[f]);
        free(text);
    }
}

int main(void)
{
    RUN(test_valid_file_reads_back);
    RUN(test_truncated_and_header_length);
    RUN(test_offsets_and_sizes);
    RUN(test_overlap);
    RUN(test_dtypes);
    RUN(test_bad_json);
    RUN(test_conversions);
    RUN(test_writer_round_trip);
    RUN(test_sharded_folder);
    RUN(test_hf_config);
    RUN(test_hf_config_families);
    TEST_EXIT();
}
