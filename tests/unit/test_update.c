/* test_update.c - live weight updates (engine/update/staging.h) and the engine's side
 * of them (engine.h: versions, drain, abort of started sequences).
 *
 * Uses the tiny random models of tests/gen_testdata.sh ($RD_TESTDATA, default
 * build/testdata) on the CPU backend.
 *
 *   1. Staging bookkeeping: manifest errors, chunks out of order, duplicated,
 *      overlapping, too short, corrupt, missing; the whole-tensor CRC.
 *   2. Build + apply, cross-checked against a model built independently: the
 *      tiny model is exported (f32 safetensors), a subset of its tensors is
 *      perturbed and pushed through the stage (bf16, f16, f32), and the live
 *      model's logits must equal bit for bit those of a model loaded
 *      (model_load_hf) from the modified full tensor set written to a fresh
 *      safetensors folder. The bf16/f16 values the reference holds are
 *      converted here, not with the engine's converters.
 *   3. Engine: version spans across eng_set_version, drain (eng_hold_new /
 *      eng_started), and eng_abort_started on single, forked and
 *      started-but-unforked group requests, next to an untouched waiting one. */
#include <dirent.h>
#include <math.h>
#include <stdint.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/crc32c.h"
#include "engine/serve/engine.h"
#include "base/err.h"
#include "engine/model/loader.h"
#include "engine/model/model.h"
#include "engine/model/quant.h"
#include "engine/model/runner.h"
#include "engine/format/safetensors.h"
#include "engine/update/staging.h"
#include "tests/unit/engine_helpers.h"
#include "tests/unit/test.h"

#ifdef RD_TEST_Q8_DEVICE
#pragma GCC diagnostic ignored "-Wunused-function" /* test_update_emu runs one case of this file */
#endif

/* ---------------------------------------------------------------------------
 * Models, temp dirs, small helpers. */

static rd_loaded tiny32;        /* tiny-f32 (tied): staging and engine cases */
static int tiny32_ok;

/* The backend the models load on: the CPU, or (test_update_emu, built with
 * RD_TEST_BACKEND_DEFAULT "cuda-emu") the emulated CUDA backend. */
#ifndef RD_TEST_BACKEND_DEFAULT
#define RD_TEST_BACKEND_DEFAULT "cpu"
#endif

static int load_tiny(const char *name, rd_loaded *l)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s.gguf", testdata(), name);
    int rc = rd_load(path, RD_TEST_BACKEND_DEFAULT, test_threads(0), l);
    if (rc)
        fprintf(stderr, "test_update: cannot load %s: %s\n", path, rd_errmsg());
    return rc == 0;
}

#define NEED(ok, what) CHECK(ok, "%s is not loaded (run tests/gen_testdata.sh %s)", what, testdata())

static char tmp_root[512];

/* A fresh folder under the test's temp root. */
static void tmp_dir(const char *name, char *out, size_t cap)
{
    snprintf(out, cap, "%s/%s", tmp_root, name);
    mkdir(out, 0755);
}

/* Removes a folder's files and the folder (one level, as the tests write). */
static void rm_dir(const char *dir)
{
    DIR *d = opendir(dir);
    if (d) {
        struct dirent *e;
        char p[1024];
        while ((e = readdir(d)))
            if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) {
                snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
                remove(p);
            }
        closedir(d);
    }
    rmdir(dir);
}

static uint64_t rng_next(uint64_t *x)
{
    *x = *x * 6364136223846793005ull + 1442695040888963407ull;
    return *x >> 33;
}

/* Uniform in [-1, 1). */
static float rng_unit(uint64_t *x) { return (float)((double)rng_next(x) / 2147483648.0 * 2.0 - 1.0); }

static void make_prompt(int32_t *p, int32_t n, uint32_t salt, int32_t vocab)
{
    uint64_t x = 0x9E3779B97F4A7C15ull * (salt + 1) + 12345;
    for (int32_t i = 0; i < n; i++)
        p[i] = (int32_t)(rng_next(&x) % (uint64_t)vocab);
}

/* bf16 and f16 by hand (not the engine's converters). */
static uint16_t f32_to_bf16_rne(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

static float bf16_bits_to_f32(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* f16 bits of v = k / 1024 with |k| < 2048 (exact in f16: 11 significant bits). */
static uint16_t f16_of_k1024(int32_t k)
{
    if (k == 0)
        return 0;
    uint16_t sign = k < 0 ? 0x8000 : 0;
    uint32_t a = (uint32_t)(k < 0 ? -k : k);
    int e = 0; /* a = 1.m x 2^e */
    while ((a >> (e + 1)) != 0)
        e++;
    uint32_t mant = (a << (10 - e)) & 0x3ffu;
    int32_t be = e - 10 + 15; /* value = a x 2^-10 >= 2^-10: always a normal f16 */
    return (uint16_t)(sign | (uint32_t)be << 10 | mant);
}

/* ---------------------------------------------------------------------------
 * Engine helpers. */

static void res_clear(res_set *s)
{
    for (int i = 0; i < s->n; i++)
        eng_result_free(&s->r[i]);
    s->n = 0;
}

static int steps(engine *e, int n, res_set *out)
{
    for (int i = 0; i < n; i++) {
        int rc = eng_step(e);
        if (rc < 0)
            return rc;
        collect(e, out);
    }
    return 0;
}

/* Results of run_alone: each run is a fresh engine (ids restart at 0), so
 * they are found by the request's tag. */
static const eng_result *res_find_tag(const res_set *s, uint64_t tag, int32_t sample)
{
    for (int i = 0; i < s->n; i++)
        if (s->r[i].tag == tag && s->r[i].sample_idx == sample)
            return &s->r[i];
    return NULL;
}

static int res_count(const res_set *s, int64_t req)
{
    int n = 0;
    for (int i = 0; i < s->n; i++)
        n += s->r[i].req_id == req;
    return n;
}

static uint64_t next_tag = 1;

static eng_request greedy_req(const int32_t *prompt, int32_t n_prompt, int32_t n, int32_t max_tokens)
{
    eng_request r;
    memset(&r, 0, sizeof r);
    r.prompt = prompt;
    r.n_prompt = n_prompt;
    r.n = n;
    r.max_tokens = max_tokens;
    r.sp = samp_default();
    r.sp.temperature = 0;
    r.ignore_eos = 1;
    r.tag = next_tag++;
    return r;
}

static eng_config cfg_for(const model *m, int64_t blocks, int32_t max_batch_tokens, int32_t max_num_seqs)
{
    eng_config c = eng_default_config();
    c.kv_cache_bytes = blocks * model_kv_bytes_per_token(&m->cfg) * 16;
    c.block_size = 16;
    c.max_batch_tokens = max_batch_tokens;
    c.max_num_seqs = max_num_seqs;
    return c;
}

/* Runs one request alone in a fresh engine; results into out (appended). */
static int run_alone(model *m, const eng_request *r, res_set *out, int64_t *id)
{
    eng_config cfg = cfg_for(m, 64, 512, 64);
    engine *e;
    int rc = eng_create(m, &cfg, &e);
    if (rc)
        return rc;
    rc = eng_add(e, r, id);
    if (!rc)
        rc = drive(e, out);
    eng_destroy(e);
    return rc;
}

/* a's tokens and log-probs (bit-identical) are a prefix of b's; full: same length too. */
static int prefix_of(const eng_result *a, const eng_result *b, int full, char *why, size_t cap)
{
    if (!a || !b) {
        snprintf(why, cap, "missing result (%p, %p)", (const void *)a, (const void *)b);
        return 0;
    }
    if (a->n_tokens > b->n_tokens || (full && a->n_tokens != b->n_tokens)) {
        snprintf(why, cap, "%d tokens vs %d", a->n_tokens, b->n_tokens);
        return 0;
    }
    for (int32_t i = 0; i < a->n_tokens; i++)
        if (a->token_ids[i] != b->token_ids[i] || memcmp(&a->logprobs[i], &b->logprobs[i], sizeof(float))) {
            snprintf(why, cap, "token %d: id %d vs %d, logprob %.9g vs %.9g", i, a->token_ids[i], b->token_ids[i],
                     a->logprobs[i], b->logprobs[i]);
            return 0;
        }
    return 1;
}

/* Spans equal the expected list {start, end, version}... */
static int spans_are(const eng_result *r, int32_t n, const eng_span *want, char *why, size_t cap)
{
    if (r->n_spans != n) {
        snprintf(why, cap, "req %lld sample %d: %d spans, expected %d", (long long)r->req_id, r->sample_idx,
                 r->n_spans, n);
        return 0;
    }
    for (int32_t i = 0; i < n; i++)
        if (r->spans[i].start != want[i].start || r->spans[i].end != want[i].end ||
            r->spans[i].version != want[i].version) {
            snprintf(why, cap, "req %lld sample %d span %d: [%d, %d) v%llu, expected [%d, %d) v%llu",
                     (long long)r->req_id, r->sample_idx, i, r->spans[i].start, r->spans[i].end,
                     (unsigned long long)r->spans[i].version, want[i].start, want[i].end,
                     (unsigned long long)want[i].version);
            return 0;
        }
    return 1;
}

/* ---------------------------------------------------------------------------
 * 1. Staging bookkeeping. */

static const char *Q0 = "model.layers.0.self_attn.q_proj.weight";
static const char *K0 = "model.layers.0.self_attn.k_proj.weight";
static const char *NORM = "model.norm.weight";
static const char *EMBED = "model.embed_tokens.weight";

static uint32_t dsize(int dtype) { return dtype == UPD_F32 ? 4 : 2; }

static upd_spec spec2(const char *name, int dtype, uint64_t r, uint64_t c)
{
    upd_spec s = {.name = name, .dtype = dtype, .n_dims = 2, .shape = {r, c}};
    s.nbytes = r * c * dsize(dtype);
    return s;
}

static upd_spec spec1(const char *name, int dtype, uint64_t n)
{
    upd_spec s = {.name = name, .dtype = dtype, .n_dims = 1, .shape = {n}};
    s.nbytes = n * dsize(dtype);
    return s;
}

static uint64_t sum_bytes(const upd_spec *s, int n)
{
    uint64_t t = 0;
    for (int i = 0; i < n; i++)
        t += s[i].nbytes;
    return t;
}

/* Expects upd_stage_create to fail with code and a message holding needle (and needle2 if set). */
static int create_fails(const model_config *c, const upd_spec *s, int n, uint64_t total, uint64_t max, int code,
                        const char *needle, const char *needle2, char *why, size_t cap)
{
    upd_stage *st = (upd_stage *)1;
    int rc = upd_stage_create(c, s, n, total, max, &st);
    int ok = rc == code && st == NULL && strstr(rd_errmsg(), needle) && (!needle2 || strstr(rd_errmsg(), needle2));
    snprintf(why, cap, "rc %d (want %d), msg '%s' (want '%s'%s%s)", rc, code, rd_errmsg(), needle,
             needle2 ? " and " : "", needle2 ? needle2 : "");
    if (rc == 0)
        upd_stage_free(st);
    return ok;
}

static char why[1024];
#define CREATE_FAILS(s, n, total, max, code, needle, needle2) \
    CHECK(create_fails(c, s, n, total, max, code, needle, needle2, why, sizeof why), "%.300s", why)

static void test_manifest_errors(void)
{
    NEED(tiny32_ok, "tiny-f32");
    const model_config *c = &tiny32.m->cfg;
    CHECK(c->tied_embeddings, "tiny-f32 is expected to be tied");
    const uint64_t d = (uint64_t)c->dim, hd = (uint64_t)c->head_dim;
    const uint64_t qr = (uint64_t)c->n_heads * hd, kr = (uint64_t)c->n_kv_heads * hd;
    upd_spec ok[3] = {spec2(Q0, UPD_F32, qr, d), spec1(NORM, UPD_BF16, d), spec2(K0, UPD_F16, kr, d)};
    const uint64_t total = sum_bytes(ok, 3);

    /* The valid manifest stages. */
    upd_stage *st = NULL;
    CHECK_OK(upd_stage_create(c, ok, 3, total, total, &st));
    CHECK(st && st->n == 3 && st->total_bytes == total && st->staged_bytes == 0 && st->pending == 0, "stage fields");
    CHECK(!strcmp(st->t[1].name, NORM) && st->t[1].nbytes == 2 * d && st->t[1].dtype == UPD_BF16, "tensor 1");
    upd_stage_free(st);

    /* Unknown names, each named in the message. */
    const char *unknown[] = {
        "model.layers.2.self_attn.q_proj.weight",   /* layer out of range (2 layers) */
        "model.layers.-1.self_attn.q_proj.weight",
        "model.layers.00.self_attn.q_proj.weight",  /* not canonical */
        "model.layers.0.self_attn.q_proj.bias",
        "model.layers.0.self_attn.q_proj.weightx",
        "model.layers.0.",
        "layers.0.self_attn.q_proj.weight",
        "model.embed_tokens",
        "",
    };
    for (size_t i = 0; i < sizeof unknown / sizeof unknown[0]; i++) {
        upd_spec s[2] = {ok[1], spec2(unknown[i], UPD_F32, qr, d)};
        CREATE_FAILS(s, 2, sum_bytes(s, 2), 1 << 30, RD_EINVAL, *unknown[i] ? unknown[i] : "''",
                     "not a weight of this model");
    }
    /* lm_head.weight on a tied model. */
    {
        upd_spec s[1] = {spec2("lm_head.weight", UPD_F32, (uint64_t)c->vocab, d)};
        CREATE_FAILS(s, 1, s[0].nbytes, 1 << 30, RD_EINVAL, "lm_head.weight", "tied");
    }
    /* A name twice. */
    {
        upd_spec s[3] = {ok[0], ok[1], ok[0]};
        CREATE_FAILS(s, 3, sum_bytes(s, 3), 1 << 30, RD_EINVAL, Q0, "twice");
    }
    /* Wrong shapes: transposed k, a 2-D vector, a 1-D matrix, 3 dims. */
    {
        upd_spec s[2] = {ok[0], spec2(K0, UPD_F32, d, kr)};
        CREATE_FAILS(s, 2, sum_bytes(s, 2), 1 << 30, RD_EINVAL, K0, "[32, 64]");
        s[1] = spec2(NORM, UPD_F32, 1, d);
        CREATE_FAILS(s, 2, sum_bytes(s, 2), 1 << 30, RD_EINVAL, NORM, "[64]");
        s[1] = spec1(K0, UPD_F32, kr * d);
        CREATE_FAILS(s, 2, sum_bytes(s, 2), 1 << 30, RD_EINVAL, K0, "shape");
        s[1] = spec2(K0, UPD_F32, kr, d);
        s[1].n_dims = 3;
        s[1].shape[2] = 1;
        CREATE_FAILS(s, 2, sum_bytes(s, 2), 1 << 30, RD_EINVAL, K0, "shape");
    }
    /* Wrong nbytes (f32 size declared for a bf16 tensor; one byte short). */
    {
        upd_spec s[2] = {ok[0], ok[1]};
        s[1].nbytes = 4 * d;
        CREATE_FAILS(s, 2, sum_bytes(s, 2), 1 << 30, RD_EINVAL, NORM, "bytes");
        s[1] = ok[1];
        s[0].nbytes--;
        CREATE_FAILS(s, 2, sum_bytes(s, 2), 1 << 30, RD_EINVAL, Q0, "bytes");
    }
    /* An unknown dtype. */
    {
        upd_spec s[1] = {ok[1]};
        s[0].dtype = 7;
        CREATE_FAILS(s, 1, s[0].nbytes, 1 << 30, RD_EINVAL, NORM, "dtype");
    }
    /* total_bytes and the staging limit (whole-manifest errors: no single tensor). */
    CREATE_FAILS(ok, 3, total + 1, 1 << 30, RD_EINVAL, "total_bytes", NULL);
    CREATE_FAILS(ok, 3, total - 2, 1 << 30, RD_EINVAL, "total_bytes", NULL);
    CREATE_FAILS(ok, 3, total, total - 1, RD_EINVAL, "max_staging_bytes", NULL);
    CREATE_FAILS(ok, 0, 0, 1 << 30, RD_EINVAL, "no tensors", NULL);
}

/* A Qwen3-30B-A3B-shaped manifest (48 layers, 128 experts: 18,867 tensors,
 * tiny widths): it stages (no false duplicate among the per-expert names),
 * a name repeated at its end is found with both indices, and expert or
 * layer numbers out of range or not canonical are refused saying so. */
static void test_manifest_moe(void)
{
    model_config cfg;
    memset(&cfg, 0, sizeof cfg);
    snprintf(cfg.arch, sizeof cfg.arch, "qwen3moe");
    cfg.n_layers = 48, cfg.dim = 8, cfg.n_heads = 2, cfg.n_kv_heads = 1, cfg.head_dim = 4, cfg.ffn_dim = 8;
    cfg.vocab = 16, cfg.max_ctx = 64, cfg.n_experts = 128, cfg.n_experts_used = 8, cfg.expert_ffn_dim = 4;
    const model_config *c = &cfg;
    const arch_desc *a = arch_by_name("qwen3moe", 8);
    int cap = 20000, n = 0;
    upd_spec *s = calloc((size_t)cap + 1, sizeof *s);
    char (*names)[96] = calloc((size_t)cap, sizeof *names);
    CHECK(s && names, "oom");
    for (int l = -1; s && names && l < c->n_layers; l++)
        for (int i = 0; i < a->n_tensors; i++) {
            const arch_tensor *t = &a->tensors[i];
            if (arch_group_per_layer(t->group) != (l >= 0) || !arch_tensor_present(c, t))
                continue;
            for (int e = 0; e < arch_group_units(c, t->group) && n < cap; e++, n++) {
                arch_hf_name(t, l, e, names[n], sizeof names[n]);
                uint64_t r = (uint64_t)arch_dim_value(c, t->rows), k = (uint64_t)arch_dim_value(c, t->cols);
                s[n] = arch_group_is_linear(t->group) ? spec2(names[n], UPD_F32, r, k) : spec1(names[n], UPD_F32, k);
            }
        }
    CHECK(n == 3 + 48 * (9 + 3 * 128), "%d tensors", n);
    upd_stage *st = NULL;
    CHECK_OK(upd_stage_create(c, s, n, sum_bytes(s, n), 1ull << 40, &st));
    CHECK(st && st->n == n && st->t[n - 1].expert == 0 && st->t[n - 2].layer == 47, "stage");
    int last_down = -1;
    for (int i = 0; st && i < n; i++)
        if (!strcmp(st->t[i].name, "model.layers.47.mlp.experts.127.down_proj.weight")) {
            last_down = i;
            CHECK(st->t[i].layer == 47 && st->t[i].expert == 127, "the last expert's place");
        }
    CHECK(last_down >= 0, "the last expert's down_proj is staged");
    upd_stage_free(st);
    if (last_down >= 0) {
        char want[64];
        snprintf(want, sizeof want, "(%d and %d)", last_down, n);
        s[n] = s[last_down];
        CREATE_FAILS(s, n + 1, sum_bytes(s, n + 1), 1ull << 40, RD_EINVAL, s[last_down].name, want);
    }
    const uint64_t F = 4, D = 8;
    struct { const char *name, *why; } bad[] = {
        {"model.layers.0.mlp.experts.128.up_proj.weight", "expert 128 is out of range (the model has 128 experts"},
        {"model.layers.0.mlp.experts.99999999999.up_proj.weight", "out of range"},
        {"model.layers.0.mlp.experts.03.up_proj.weight", "'03' is not written canonically (expected '3'"},
        {"model.layers.0.mlp.experts.00.up_proj.weight", "(expected '0'"},
        {"model.layers.48.mlp.experts.3.up_proj.weight", "layer 48 is out of range (the model has 48 layers"},
        {"model.layers.07.mlp.experts.3.up_proj.weight", "layer number '07'"},
        {"model.layers.0.mlp.experts.gate_up_proj", "model.layers.0.mlp.experts.0.gate_proj.weight"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        upd_spec b[2] = {s[0], spec2(bad[i].name, UPD_F32, F, D)};
        CREATE_FAILS(b, 2, sum_bytes(b, 2), 1ull << 40, RD_EINVAL, bad[i].name, bad[i].why);
        CHECK(strstr(rd_errmsg(), "not a weight of this model"), "%s", rd_errmsg());
    }
    free(s);
    free(names);
}

/* Claims, fills and settles one chunk of src; returns the first error. */
static int send_data(upd_stage *s, uint32_t ti, const uint8_t *src, uint64_t off, uint32_t len, int *dup)
{
    uint32_t crc = crc32c(0, src + off, len);
    int rc = upd_chunk_claim(s, ti, off, len, crc, dup);
    if (rc || *dup)
        return rc;
    rc = upd_chunk_fill(s, ti, off, src + off, len, crc);
    upd_chunk_settle(s, ti, off, rc == 0);
    return rc;
}

static void fill_bytes(uint8_t *p, size_t n, uint64_t seed)
{
    for (size_t i = 0; i < n; i++)
        p[i] = (uint8_t)rng_next(&seed);
}

static void chunk_cases(upd_stage *s, uint8_t **src)
{
    int dup = -1;
    const uint64_t qn = s->t[0].nbytes;     /* q f32: 16384 */
    const uint64_t en = s->t[3].nbytes;     /* embed f32: 76800 */
    CHECK(qn == 16384 && en == 76800 && s->t[1].nbytes == 256 && s->t[2].nbytes == 4096, "tensor sizes");

    /* q out of order: the tail (4384 bytes, ends the tensor), then the head, then the middle. */
    CHECK_OK(send_data(s, 0, src[0], 12000, 4384, &dup));
    CHECK(dup == 0, "first send is not a dup");
    CHECK_OK(send_data(s, 0, src[0], 0, 6000, &dup));
    CHECK(s->pending == 0 && s->staged_bytes == 4384 + 6000, "staged %llu pending %d",
          (unsigned long long)s->staged_bytes, s->pending);
    /* The same chunk again (same range, same crc): a dup, nothing changes. */
    CHECK_OK(send_data(s, 0, src[0], 0, 6000, &dup));
    CHECK(dup == 1 && s->pending == 0 && s->staged_bytes == 10384, "dup %d pending %d", dup, s->pending);
    /* The same range with other data: refused. */
    uint8_t *other = malloc(6000);
    CHECK(other, "malloc");
    memcpy(other, src[0], 6000);
    other[100] ^= 1;
    int rc = upd_chunk_claim(s, 0, 0, 6000, crc32c(0, other, 6000), &dup);
    free(other);
    CHECK(rc == RD_EINVAL && dup == 0 && strstr(rd_errmsg(), Q0) && strstr(rd_errmsg(), "overlap"), "rc %d: %s", rc,
          rd_errmsg());
    /* Overlapping ranges (same bytes, other boundaries), from either side. */
    rc = upd_chunk_claim(s, 0, 4000, 4096, crc32c(0, src[0] + 4000, 4096), &dup);
    CHECK(rc == RD_EINVAL && strstr(rd_errmsg(), Q0), "overlap left: rc %d: %s", rc, rd_errmsg());
    rc = upd_chunk_claim(s, 0, 8000, 4096, crc32c(0, src[0] + 8000, 4096), &dup);
    CHECK(rc == RD_EINVAL && strstr(rd_errmsg(), Q0), "overlap right: rc %d: %s", rc, rd_errmsg());
    rc = upd_chunk_claim(s, 0, 6000, 6001, crc32c(0, src[0] + 6000, 6001), &dup);
    CHECK(rc == RD_EINVAL && strstr(rd_errmsg(), Q0), "overlap by one byte: rc %d: %s", rc, rd_errmsg());
    /* Short chunk not at the end; a range outside the tensor; a bad index; empty. */
    rc = upd_chunk_claim(s, 0, 6000, 1000, crc32c(0, src[0] + 6000, 1000), &dup);
    CHECK(rc == RD_EINVAL && strstr(rd_errmsg(), Q0) && strstr(rd_errmsg(), "4096"), "short: rc %d: %s", rc,
          rd_errmsg());
    rc = upd_chunk_claim(s, 2, 4000, 4096, 0, &dup);
    CHECK(rc == RD_EINVAL && strstr(rd_errmsg(), K0), "past the end: rc %d: %s", rc, rd_errmsg());
    rc = upd_chunk_claim(s, 2, UINT64_MAX - 10, 4096, 0, &dup);
    CHECK(rc == RD_EINVAL && strstr(rd_errmsg(), K0), "huge offset: rc %d: %s", rc, rd_errmsg());
    rc = upd_chunk_claim(s, 4, 0, 4096, 0, &dup);
    CHECK(rc == RD_EINVAL && strstr(rd_errmsg(), "tensor_index 4"), "bad index: rc %d: %s", rc, rd_errmsg());
    rc = upd_chunk_claim(s, 2, 4096, 0, 0, &dup);
    CHECK(rc == RD_EINVAL, "empty chunk: rc %d", rc);
    CHECK(s->pending == 0 && s->t[0].n_ranges == 2, "refused claims left no trace (pending %d, ranges %d)",
          s->pending, s->t[0].n_ranges);
    /* The middle of q. */
    CHECK_OK(send_data(s, 0, src[0], 6000, 6000, &dup));

    /* k (bf16 4096 bytes): a corrupt chunk fails the fill, is released, and can be resent. */
    uint32_t crc = crc32c(0, src[2], 4096);
    CHECK_OK(upd_chunk_claim(s, 2, 0, 4096, crc ^ 0x10u, &dup));
    CHECK(dup == 0 && s->pending == 1, "pending %d", s->pending);
    /* While it is being staged: the same chunk again (a resend) is BUSY, other data over it is refused,
     * and verify says pending. */
    rc = upd_chunk_claim(s, 2, 0, 4096, crc ^ 0x10u, &dup);
    CHECK(rc == RD_EBUSY && dup == 0 && strstr(rd_errmsg(), "being staged"), "resend while staged: rc %d: %s", rc,
          rd_errmsg());
    rc = upd_chunk_claim(s, 2, 0, 4096, crc, &dup);
    CHECK(rc == RD_EINVAL && dup == 0 && strstr(rd_errmsg(), "being staged"), "other data while staged: rc %d: %s",
          rc, rd_errmsg());
    rc = upd_stage_verify(s);
    CHECK(rc == RD_EINVAL && strstr(rd_errmsg(), "still being staged"), "verify while pending: rc %d: %s", rc,
          rd_errmsg());
    rc = upd_chunk_fill(s, 2, 0, src[2], 4096, crc ^ 0x10u);
    CHECK(rc == RD_ECHECKSUM && strstr(rd_errmsg(), K0), "bad crc: rc %d: %s", rc, rd_errmsg());
    upd_chunk_settle(s, 2, 0, 0);
    CHECK(s->pending == 0 && s->t[2].n_ranges == 0 && s->t[2].staged == 0, "released: pending %d ranges %d",
          s->pending, s->t[2].n_ranges);
    /* Settling a range again (or one never claimed) changes nothing. */
    upd_chunk_settle(s, 2, 0, 1);
    upd_chunk_settle(s, 0, 6000, 1);
    CHECK(s->pending == 0 && s->t[2].n_ranges == 0 && s->staged_bytes == 16384, "stray settles: pending %d",
          s->pending);
    /* Data that does not match its claimed crc (the crc of other bytes). */
    CHECK_OK(upd_chunk_claim(s, 2, 0, 4096, crc, &dup));
    uint8_t *bad = malloc(4096);
    CHECK(bad, "malloc");
    memcpy(bad, src[2], 4096);
    bad[4095] ^= 0x80;
    rc = upd_chunk_fill(s, 2, 0, bad, 4096, crc);
    free(bad);
    CHECK(rc == RD_ECHECKSUM, "corrupt data: rc %d", rc);
    upd_chunk_settle(s, 2, 0, 0);
    CHECK_OK(send_data(s, 2, src[2], 0, 4096, &dup));
    CHECK(dup == 0 && s->t[2].staged == 4096, "resent");

    /* embed: 19 chunks (18 x 4096 + 3072) in a scrambled order, so the range
     * list grows past its first allocation and inserts land everywhere. */
    int32_t order[19];
    for (int32_t i = 0; i < 19; i++)
        order[i] = i;
    uint64_t x = 99;
    for (int32_t i = 18; i > 0; i--) {
        int32_t j = (int32_t)(rng_next(&x) % (uint64_t)(i + 1)), t = order[i];
        order[i] = order[j];
        order[j] = t;
    }
    for (int32_t i = 0; i < 19; i++) {
        uint64_t off = (uint64_t)order[i] * 4096;
        uint32_t len = order[i] == 18 ? 3072 : 4096;
        CHECK_OK(send_data(s, 3, src[3], off, len, &dup));
        /* and every chunk resent right away is a dup */
        CHECK_OK(send_data(s, 3, src[3], off, len, &dup));
        CHECK(dup == 1, "embed chunk %d resent: dup %d", order[i], dup);
    }
    CHECK(s->t[3].n_ranges == 19 && s->t[3].staged == en, "embed ranges %d", s->t[3].n_ranges);
    for (int32_t i = 1; i < s->t[3].n_ranges; i++)
        CHECK(s->t[3].ranges[i].off == s->t[3].ranges[i - 1].off + s->t[3].ranges[i - 1].len, "ranges sorted");

    /* norm still missing: verify names it and the offset. */
    rc = upd_stage_verify(s);
    CHECK(rc == RD_EINVAL && strstr(rd_errmsg(), NORM) && strstr(rd_errmsg(), "offset 0"), "missing: rc %d: %s",
          rc, rd_errmsg());
    /* norm: 256 bytes, one short chunk that ends the tensor. */
    CHECK_OK(send_data(s, 1, src[1], 0, 256, &dup));
    CHECK_OK(upd_stage_verify(s));
    CHECK(s->staged_bytes == s->total_bytes && s->pending == 0, "staged %llu of %llu",
          (unsigned long long)s->staged_bytes, (unsigned long long)s->total_bytes);
    for (int i = 0; i < 4; i++)
        CHECK(!memcmp(s->t[i].data, src[i], s->t[i].nbytes), "tensor %d staged bytes differ", i);
}

static void test_chunks(void)
{
    NEED(tiny32_ok, "tiny-f32");
    const model_config *c = &tiny32.m->cfg;
    const uint64_t d = (uint64_t)c->dim, hd = (uint64_t)c->head_dim;
    upd_spec sp[4] = {spec2(Q0, UPD_F32, (uint64_t)c->n_heads * hd, d), spec1(NORM, UPD_F32, d),
                      spec2(K0, UPD_BF16, (uint64_t)c->n_kv_heads * hd, d),
                      spec2(EMBED, UPD_F32, (uint64_t)c->vocab, d)};
    uint8_t *src[4] = {0};
    for (int i = 0; i < 4; i++) {
        src[i] = malloc(sp[i].nbytes);
        if (src[i]) {
            fill_bytes(src[i], sp[i].nbytes, 1000 + (uint64_t)i);
            sp[i].crc32c = crc32c(0, src[i], sp[i].nbytes);
        }
    }
    upd_stage *s = NULL;
    int rc = src[0] && src[1] && src[2] && src[3] ? upd_stage_create(c, sp, 4, sum_bytes(sp, 4), 1 << 30, &s)
                                                 : RD_ENOMEM;
    if (rc == 0)
        chunk_cases(s, src);
    upd_stage_free(s);
    int failed = test_case_failed;

    /* A gap in the middle of a tensor: verify names it and where. */
    upd_stage *g = NULL;
    int rc2 = -1, rc3 = -1, rc4 = -1;
    char msg2[512] = "", msg3[512] = "", msg4[512] = "";
    if (rc == 0 && upd_stage_create(c, sp, 1, sp[0].nbytes, 1 << 30, &g) == 0) {
        int dup;
        send_data(g, 0, src[0], 0, 6000, &dup);
        send_data(g, 0, src[0], 12000, 4384, &dup);
        rc2 = upd_stage_verify(g);
        snprintf(msg2, sizeof msg2, "%s", rd_errmsg());
        upd_stage_free(g);
    }
    /* A wrong manifest crc (every chunk itself right): RD_ECHECKSUM naming the tensor. */
    upd_spec wrong[2] = {sp[2], sp[1]};
    wrong[1].crc32c ^= 0x1234u;
    if (rc == 0 && upd_stage_create(c, wrong, 2, wrong[0].nbytes + wrong[1].nbytes, 1 << 30, &g) == 0) {
        int dup;
        send_data(g, 0, src[2], 0, 4096, &dup);
        send_data(g, 1, src[1], 0, 256, &dup);
        rc3 = upd_stage_verify(g);
        snprintf(msg3, sizeof msg3, "%s", rd_errmsg());
        upd_stage_free(g);
    }
    /* A stage freed with chunks still claimed (a connection lost mid-update) leaks nothing. */
    if (rc == 0 && upd_stage_create(c, sp, 4, sum_bytes(sp, 4), 1 << 30, &g) == 0) {
        int dup;
        for (uint64_t off = 0; off < 8 * 4096; off += 4096)
            upd_chunk_claim(g, 3, off, 4096, 0, &dup);
        rc4 = upd_stage_verify(g);
        snprintf(msg4, sizeof msg4, "%s", rd_errmsg());
        upd_stage_free(g);
    }
    for (int i = 0; i < 4; i++)
        free(src[i]);
    if (failed)
        return;
    CHECK_OK(rc);
    CHECK(rc2 == RD_EINVAL && strstr(msg2, Q0) && strstr(msg2, "offset 6000"), "gap: rc %d: %.300s", rc2, msg2);
    CHECK(rc3 == RD_ECHECKSUM && strstr(msg3, NORM), "manifest crc: rc %d: %.300s", rc3, msg3);
    CHECK(rc4 == RD_EINVAL && strstr(msg4, "8 chunks"), "pending at free: rc %d: %.300s", rc4, msg4);
}

/* ---------------------------------------------------------------------------
 * 2. Build and apply, against a model built from the modified tensor set. */

typedef struct {
    char name[96];
    int n_dims;
    int64_t shape[2];
    int64_t n;                  /* elements */
    float *v;                   /* [n] fp32: the values the model should hold */
} htensor;

typedef struct {
    int n;
    htensor t[64];
} hset;

static void hset_free(hset *h)
{
    for (int i = 0; i < h->n; i++)
        free(h->t[i].v);
    h->n = 0;
}

static htensor *hset_find(hset *h, const char *name)
{
    for (int i = 0; i < h->n; i++)
        if (!strcmp(h->t[i].name, name))
            return &h->t[i];
    return NULL;
}

/* Every tensor of m as HF fp32: exported with model_export_hf, read back
 * with the safetensors reader. */
static int hset_from_model(const model *m, const char *dir, hset *h)
{
    memset(h, 0, sizeof *h);
    int rc = model_export_hf(m, dir, ST_F32);
    if (rc)
        return rc;
    st_set *s;
    if ((rc = st_set_open(dir, &s)))
        return rc;
    const st_file *f = s->files[0];
    for (size_t i = 0; i < f->n_tensors && !rc; i++) {
        const st_tensor *t = &f->tensors[i];
        if (h->n == 64 || t->n_dims < 1 || t->n_dims > 2 || t->dtype != ST_F32) {
            rc = rd_fail(RD_EFORMAT, "export: unexpected tensor '%s'", t->name);
            break;
        }
        htensor *o = &h->t[h->n++];
        snprintf(o->name, sizeof o->name, "%s", t->name);
        o->n_dims = t->n_dims;
        o->shape[0] = t->shape[0];
        o->shape[1] = t->n_dims == 2 ? t->shape[1] : 0;
        o->n = (int64_t)t->n_elems;
        o->v = malloc(sizeof(float) * (size_t)o->n);
        rc = o->v ? st_read_f32(t, o->v) : RD_ENOMEM;
    }
    st_set_close(s);
    if (rc)
        hset_free(h);
    return rc;
}

static int hset_fill(void *ctx, size_t i, float *dst)
{
    const hset *h = ctx;
    memcpy(dst, h->t[i].v, sizeof(float) * (size_t)h->t[i].n);
    return 0;
}

/* Writes h as an HF folder (config.json + model.safetensors, f32) and loads it. */
static int hset_load(const hset *h, const model_config *c, rd_backend *be, const char *dir, model **out)
{
    *out = NULL;
    st_spec sp[64];
    for (int i = 0; i < h->n; i++) {
        memset(&sp[i], 0, sizeof sp[i]);
        sp[i].name = h->t[i].name;
        sp[i].dtype = ST_F32;
        sp[i].n_dims = h->t[i].n_dims;
        sp[i].shape[0] = h->t[i].shape[0];
        sp[i].shape[1] = h->t[i].shape[1];
    }
    char path[1024];
    char *json = NULL;
    int rc = model_config_to_hf_json(c, "float32", &json);
    if (rc)
        return rc;
    snprintf(path, sizeof path, "%s/config.json", dir);
    FILE *fp = fopen(path, "w");
    if (!fp || fputs(json, fp) == EOF || fclose(fp)) {
        free(json);
        return rd_fail(RD_EIO, "cannot write %s", path);
    }
    free(json);
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    if ((rc = st_write(path, sp, (size_t)h->n, NULL, hset_fill, (void *)h)))
        return rc;
    return model_load_hf(dir, be, out);
}

/* One tensor pushed through the stage. */
typedef struct {
    const char *name;
    int dtype;
    int n_dims;
    uint64_t shape[2];
    const uint8_t *data;
    uint64_t nbytes;
} push_t;

/* Stages the tensors (chunks of chunk bytes, all tensors' chunks in a
 * scrambled order), verifies and builds a patch (not applied). */
static int push(const model *m, const push_t *p, int n, uint32_t chunk, uint64_t seed, upd_patch **out)
{
    *out = NULL;
    upd_spec sp[32];
    uint64_t total = 0;
    int32_t n_chunks = 0;
    for (int i = 0; i < n; i++) {
        sp[i] = (upd_spec){.name = p[i].name, .dtype = p[i].dtype, .n_dims = p[i].n_dims,
                           .shape = {p[i].shape[0], p[i].shape[1]}, .nbytes = p[i].nbytes,
                           .crc32c = crc32c(0, p[i].data, p[i].nbytes)};
        total += p[i].nbytes;
        n_chunks += (int32_t)((p[i].nbytes + chunk - 1) / chunk);
    }
    upd_stage *s;
    int rc = upd_stage_create(&m->cfg, sp, n, total, total, &s);
    if (rc)
        return rc;
    struct ck { uint32_t ti; uint64_t off; uint32_t len; } *ck = malloc(sizeof *ck * (size_t)n_chunks);
    if (!ck) {
        upd_stage_free(s);
        return RD_ENOMEM;
    }
    int32_t k = 0;
    for (int i = 0; i < n; i++)
        for (uint64_t off = 0; off < p[i].nbytes; off += chunk)
            ck[k++] = (struct ck){(uint32_t)i, off, (uint32_t)(p[i].nbytes - off < chunk ? p[i].nbytes - off : chunk)};
    uint64_t x = seed;
    for (int32_t i = k - 1; i > 0; i--) {
        int32_t j = (int32_t)(rng_next(&x) % (uint64_t)(i + 1));
        struct ck t = ck[i];
        ck[i] = ck[j];
        ck[j] = t;
    }
    for (int32_t i = 0; i < k && !rc; i++) {
        int dup;
        rc = send_data(s, ck[i].ti, p[ck[i].ti].data, ck[i].off, ck[i].len, &dup);
        if (!rc && dup)
            rc = rd_fail(RD_EINVAL, "push: unexpected dup");
    }
    free(ck);
    if (!rc)
        rc = upd_stage_verify(s);
    if (!rc)
        rc = upd_build(m, s, UPD_SERVE_AS_PUSHED, out);
    upd_stage_free(s);
    return rc;
}

#define NP 40   /* prompt tokens for the logits comparisons */

/* Compares m's logits and a greedy rollout with ref's; bit for bit. */
static int same_outputs(model *m, model *ref, const int32_t *prompt, float *lm, float *lr, char *w, size_t cap)
{
    const int32_t V = m->cfg.vocab;
    int rc = seq_logits(m, prompt, NP, lm);
    if (!rc)
        rc = seq_logits(ref, prompt, NP, lr);
    if (rc) {
        snprintf(w, cap, "logits: %s", rd_errmsg());
        return 0;
    }
    for (int64_t i = 0; i < (int64_t)NP * V; i++)
        if (memcmp(&lm[i], &lr[i], sizeof(float))) {
            snprintf(w, cap, "logit row %lld col %lld: %.9g vs reference %.9g", (long long)(i / V),
                     (long long)(i % V), lm[i], lr[i]);
            return 0;
        }
    res_set *a = calloc(1, sizeof *a), *b = calloc(1, sizeof *b);
    int64_t ia, ib;
    eng_request r = greedy_req(prompt, 12, 1, 16);
    int ok = a && b && run_alone(m, &r, a, &ia) == 0 && run_alone(ref, &r, b, &ib) == 0;
    if (!ok)
        snprintf(w, cap, "greedy runs failed: %s", rd_errmsg());
    else
        ok = prefix_of(res_find(a, ia, 0), res_find(b, ib, 0), 1, w, cap);
    if (a)
        res_clear(a);
    if (b)
        res_clear(b);
    free(a), free(b);
    return ok;
}

/* Perturbs t in place by up to scale (relative to 1), deterministic. */
static void perturb(htensor *t, float scale, uint64_t seed)
{
    for (int64_t i = 0; i < t->n; i++)
        t->v[i] += scale * rng_unit(&seed);
}

/* Packs t->v as dtype (rounding bf16 to nearest even, and writing the rounded
 * value back into t->v, which is what the model must then hold). */
static uint8_t *pack_as(htensor *t, int dtype)
{
    uint8_t *b = malloc((size_t)t->n * dsize(dtype));
    if (!b)
        return NULL;
    for (int64_t i = 0; i < t->n; i++) {
        if (dtype == UPD_F32) {
            memcpy(b + 4 * i, &t->v[i], 4);
        } else if (dtype == UPD_BF16) {
            uint16_t h = f32_to_bf16_rne(t->v[i]);
            t->v[i] = bf16_bits_to_f32(h);
            memcpy(b + 2 * i, &h, 2);
        } else { /* f16: t->v must hold k/1024 values, |k| < 2048 */
            int32_t k = (int32_t)lrintf(t->v[i] * 1024.0f);
            uint16_t h = f16_of_k1024(k);
            memcpy(b + 2 * i, &h, 2);
        }
    }
    return b;
}

static push_t push_of(const htensor *t, int dtype, const uint8_t *data)
{
    push_t p = {.name = t->name, .dtype = dtype, .n_dims = t->n_dims,
                .shape = {(uint64_t)t->shape[0], (uint64_t)t->shape[1]}, .data = data,
                .nbytes = (uint64_t)t->n * dsize(dtype)};
    return p;
}

/* The whole build/apply case on one loaded model (live), with ref_dir for
 * the reference folders. Lengthy on purpose: every step depends on the last. */
static void build_apply_case(rd_loaded *live, const char *tag)
{
    model *m = live->m;
    const int32_t V = m->cfg.vocab;
    char dir_x[600], dir_r[600], sub[64];
    snprintf(sub, sizeof sub, "%s-export", tag);
    tmp_dir(sub, dir_x, sizeof dir_x);
    snprintf(sub, sizeof sub, "%s-ref", tag);
    tmp_dir(sub, dir_r, sizeof dir_r);

    int32_t prompt[NP];
    make_prompt(prompt, NP, 7, V);
    float *l0 = malloc(sizeof(float) * NP * V), *lm = malloc(sizeof(float) * NP * V);
    float *lr = malloc(sizeof(float) * NP * V);
    hset h = {0};
    model *ref = NULL;
    upd_patch *p = NULL;
    uint8_t *bufs[8] = {0};
    char w[600] = "";

    int rc = l0 && lm && lr ? seq_logits(m, prompt, NP, l0) : RD_ENOMEM;
    if (!rc)
        rc = hset_from_model(m, dir_x, &h);
    rm_dir(dir_x);
    if (rc)
        goto out;
    if (h.n != 9 * m->cfg.n_layers + 2 + !m->cfg.tied_embeddings) {
        rc = rd_fail(RD_EFORMAT, "export has %d tensors", h.n);
        goto out;
    }

    /* (a) Every tensor pushed unmodified (f32): a swap of every buffer, same outputs. */
    {
        push_t all[32];
        for (int i = 0; i < h.n; i++)
            all[i] = push_of(&h.t[i], UPD_F32, (const uint8_t *)h.t[i].v);
        uint64_t gen = m->weights_gen;
        void *qkv0 = m->layers[0].qkv, *emb0 = m->embed;
        float *norm0 = m->out_norm;
        if ((rc = push(m, all, h.n, 5000, 1, &p)))
            goto out;
        if (upd_patch_bytes(p) == 0) {
            rc = rd_fail(RD_EINVAL, "(a) patch holds 0 bytes");
            goto out;
        }
        /* Built, not applied: the model is as it was. */
        if (m->weights_gen != gen || m->layers[0].qkv != qkv0 || m->embed != emb0) {
            rc = rd_fail(RD_EINVAL, "(a) upd_build changed the model");
            goto out;
        }
        upd_apply(m, p);
        upd_apply(m, p); /* a second apply does nothing */
        if (m->weights_gen != gen + 1) {
            rc = rd_fail(RD_EINVAL, "(a) weights_gen %llu, expected %llu", (unsigned long long)m->weights_gen,
                         (unsigned long long)(gen + 1));
            goto out;
        }
        if (m->layers[0].qkv == qkv0 || m->embed == emb0 || m->out_norm == norm0 ||
            (m->cfg.tied_embeddings && m->lm_head != m->embed)) {
            rc = rd_fail(RD_EINVAL, "(a) the buffers were not swapped (or lm_head not re-tied)");
            goto out;
        }
        upd_patch_free(m->be, p); /* frees the old buffers (ASan: no leak, no double free) */
        p = NULL;
        if ((rc = seq_logits(m, prompt, NP, lm)))
            goto out;
        if (memcmp(l0, lm, sizeof(float) * NP * V)) {
            rc = rd_fail(RD_EINVAL, "(a) logits changed after pushing the unmodified weights");
            goto out;
        }
    }

    /* (b) bf16: layer 0's q_proj (part of the fused q|k|v) and model.norm.weight. */
    {
        htensor *q = hset_find(&h, Q0), *nm = hset_find(&h, NORM);
        perturb(q, 0.05f, 11);
        perturb(nm, 0.2f, 12);
        bufs[0] = pack_as(q, UPD_BF16);
        bufs[1] = pack_as(nm, UPD_BF16);
        if (!bufs[0] || !bufs[1]) {
            rc = RD_ENOMEM;
            goto out;
        }
        push_t ps[2] = {push_of(nm, UPD_BF16, bufs[1]), push_of(q, UPD_BF16, bufs[0])};
        uint64_t gen = m->weights_gen;
        if ((rc = push(m, ps, 2, 4096, 2, &p)))
            goto out;
        /* Still the old outputs until applied. */
        if ((rc = seq_logits(m, prompt, NP, lm)))
            goto out;
        if (memcmp(l0, lm, sizeof(float) * NP * V)) {
            rc = rd_fail(RD_EINVAL, "(b) logits changed by upd_build alone");
            goto out;
        }
        upd_apply(m, p);
        upd_patch_free(m->be, p);
        p = NULL;
        if (m->weights_gen != gen + 1) {
            rc = rd_fail(RD_EINVAL, "(b) weights_gen not bumped");
            goto out;
        }
        if ((rc = hset_load(&h, &m->cfg, m->be, dir_r, &ref)))
            goto out;
        if (!same_outputs(m, ref, prompt, lm, lr, w, sizeof w)) {
            rc = rd_fail(RD_EINVAL, "(b) bf16 q_proj + norm: %s", w);
            goto out;
        }
        if (!memcmp(l0, lm, sizeof(float) * NP * V)) {
            rc = rd_fail(RD_EINVAL, "(b) the update did not change the logits");
            goto out;
        }
        model_free(ref);
        ref = NULL;
        rm_dir(dir_r);
        tmp_dir(sub, dir_r, sizeof dir_r);
    }

    /* (c) f32: layer 1's gate and up (a whole fused group), layer 0's v_proj
     * (q|k|v again, q now holding (b)'s values), o_proj, a layer norm, and the
     * embedding (the LM head too when tied); lm_head when untied. */
    {
        const char *names[] = {"model.layers.1.mlp.up_proj.weight", "model.layers.1.mlp.gate_proj.weight",
                               "model.layers.0.self_attn.v_proj.weight", "model.layers.0.self_attn.o_proj.weight",
                               "model.layers.1.post_attention_layernorm.weight", EMBED, "lm_head.weight"};
        int n = m->cfg.tied_embeddings ? 6 : 7;
        push_t ps[8];
        for (int i = 0; i < n; i++) {
            htensor *t = hset_find(&h, names[i]);
            if (!t) {
                rc = rd_fail(RD_ENOENT, "(c) %s not exported", names[i]);
                goto out;
            }
            perturb(t, i == 4 ? 0.3f : 0.04f, 20 + (uint64_t)i);
            ps[i] = push_of(t, UPD_F32, (const uint8_t *)t->v);
        }
        if ((rc = push(m, ps, n, 4096 * 3, 3, &p)))
            goto out;
        upd_apply(m, p);
        upd_patch_free(m->be, p);
        p = NULL;
        if ((rc = hset_load(&h, &m->cfg, m->be, dir_r, &ref)))
            goto out;
        if (!same_outputs(m, ref, prompt, lm, lr, w, sizeof w)) {
            rc = rd_fail(RD_EINVAL, "(c) f32 gate/up/v/o/norm/embed: %s", w);
            goto out;
        }
        model_free(ref);
        ref = NULL;
        rm_dir(dir_r);
        tmp_dir(sub, dir_r, sizeof dir_r);
    }

    /* (d) f16: layer 1's down_proj and k_proj, values k/1024 (exact in f16). */
    {
        const char *names[] = {"model.layers.1.mlp.down_proj.weight", "model.layers.1.self_attn.k_proj.weight"};
        push_t ps[2];
        for (int i = 0; i < 2; i++) {
            htensor *t = hset_find(&h, names[i]);
            uint64_t x = 40 + (uint64_t)i;
            for (int64_t j = 0; j < t->n; j++)
                t->v[j] = (float)((int32_t)(rng_next(&x) % 401) - 200) / 1024.0f;
            t->v[0] = 3.0f / 1024;
            t->v[1] = -2047.0f / 1024;
            bufs[2 + i] = pack_as(t, UPD_F16);
            if (!bufs[2 + i]) {
                rc = RD_ENOMEM;
                goto out;
            }
            ps[i] = push_of(t, UPD_F16, bufs[2 + i]);
        }
        /* An independent look at the encoding: 3/1024 = 0x1a00, -2047/1024 = 0xbfff. */
        uint16_t h0, h1;
        memcpy(&h0, bufs[2], 2);
        memcpy(&h1, bufs[2] + 2, 2);
        if (h0 != 0x1a00 || h1 != 0xbfff) {
            rc = rd_fail(RD_EINVAL, "test f16 encoder: %04x %04x", h0, h1);
            goto out;
        }
        if ((rc = push(m, ps, 2, 4096, 4, &p)))
            goto out;
        upd_apply(m, p);
        upd_patch_free(m->be, p);
        p = NULL;
        if ((rc = hset_load(&h, &m->cfg, m->be, dir_r, &ref)))
            goto out;
        if (!same_outputs(m, ref, prompt, lm, lr, w, sizeof w)) {
            rc = rd_fail(RD_EINVAL, "(d) f16 down/k: %s", w);
            goto out;
        }
        model_free(ref);
        ref = NULL;
        rm_dir(dir_r);
    }

    /* (e) Non-finite values: upd_build fails naming the tensor, the model is untouched. */
    {
        if ((rc = seq_logits(m, prompt, NP, l0)))
            goto out;
        htensor *q = hset_find(&h, Q0), *nm = hset_find(&h, NORM);
        const struct { int dtype, where; float bad; uint16_t bits; const char *what; } cases[] = {
            {UPD_F32, 1000, NAN, 0, "NaN"},
            {UPD_F32, 0, INFINITY, 0, "infinite"},
            {UPD_BF16, 4095, 0, 0x7fc0, "NaN"},
            {UPD_BF16, 17, 0, 0xff80, "infinite"},
            {UPD_F16, 5, 0, 0x7e00, "NaN"},
        };
        for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
            uint64_t gen = m->weights_gen;
            void *qkv = m->layers[0].qkv;
            float *onorm = m->out_norm;
            uint8_t *good = malloc((size_t)nm->n * 4);
            uint8_t *badb = malloc((size_t)q->n * 4);
            if (!good || !badb) {
                free(good), free(badb);
                rc = RD_ENOMEM;
                goto out;
            }
            memcpy(good, nm->v, (size_t)nm->n * 4);
            int dt = cases[ci].dtype;
            for (int64_t j = 0; j < q->n; j++) { /* q's current values (f16: zeros); the build fails anyway */
                if (dt == UPD_F32) {
                    memcpy(badb + 4 * j, &q->v[j], 4);
                } else {
                    uint16_t hb = dt == UPD_BF16 ? f32_to_bf16_rne(q->v[j]) : 0;
                    memcpy(badb + 2 * j, &hb, 2);
                }
            }
            if (dt == UPD_F32)
                memcpy(badb + 4 * cases[ci].where, &cases[ci].bad, 4);
            else
                memcpy(badb + 2 * cases[ci].where, &cases[ci].bits, 2);
            /* A valid tensor first, so one group is built before the bad one fails. */
            push_t ps[2] = {push_of(nm, UPD_F32, good), push_of(q, dt, badb)};
            upd_patch *bp = (upd_patch *)1;
            int brc = push(m, ps, 2, 4096, 5, &bp);
            char msg[512];
            snprintf(msg, sizeof msg, "%s", rd_errmsg());
            free(good), free(badb);
            char at[32];
            snprintf(at, sizeof at, "element %d", cases[ci].where);
            if (brc != RD_EINVAL || bp != NULL || !strstr(msg, Q0) || !strstr(msg, cases[ci].what) ||
                !strstr(msg, at)) {
                if (brc == 0)
                    upd_patch_free(m->be, bp);
                rc = rd_fail(RD_EINVAL, "(e) case %zu: rc %d, patch %p, msg '%s'", ci, brc, (void *)bp, msg);
                goto out;
            }
            if (m->weights_gen != gen || m->layers[0].qkv != qkv || m->out_norm != onorm) {
                rc = rd_fail(RD_EINVAL, "(e) case %zu: the model changed", ci);
                goto out;
            }
        }
        if ((rc = seq_logits(m, prompt, NP, lm)))
            goto out;
        if (memcmp(l0, lm, sizeof(float) * NP * V)) {
            rc = rd_fail(RD_EINVAL, "(e) logits changed after failed builds");
            goto out;
        }
    }

    /* (f) A patch built but never applied frees its new buffers (ASan). */
    {
        htensor *nm = hset_find(&h, NORM);
        push_t ps[1] = {push_of(nm, UPD_F32, (const uint8_t *)nm->v)};
        uint64_t gen = m->weights_gen;
        if ((rc = push(m, ps, 1, 4096, 6, &p)))
            goto out;
        upd_patch_free(m->be, p);
        p = NULL;
        if (m->weights_gen != gen) {
            rc = rd_fail(RD_EINVAL, "(f) weights_gen changed without apply");
            goto out;
        }
    }

out:
    snprintf(w, sizeof w, "%s", rd_errmsg());
    if (p)
        upd_patch_free(m->be, p);
    model_free(ref);
    rm_dir(dir_r);
    hset_free(&h);
    for (int i = 0; i < 8; i++)
        free(bufs[i]);
    free(l0), free(lm), free(lr);
    CHECK(rc == 0, "%s: rc %d: %.300s", tag, rc, w);
}

static void test_build_apply_tied(void)
{
    rd_loaded live;
    CHECK(load_tiny("tiny-f32", &live), "tiny-f32 not loadable");
    build_apply_case(&live, "tied");
    rd_unload(&live);
}

static void test_build_apply_untied(void)
{
    rd_loaded live;
    CHECK(load_tiny("tiny-untied", &live), "tiny-untied not loadable");
    int untied = !live.m->cfg.tied_embeddings;
    if (untied)
        build_apply_case(&live, "untied");
    rd_unload(&live);
    CHECK(untied, "tiny-untied is tied");
}

/* ---------------------------------------------------------------------------
 * 3. Engine: versions, drain, abort of started sequences. */

static void test_version_spans(void)
{
    NEED(tiny32_ok, "tiny-f32");
    model *m = tiny32.m;
    const int32_t V = m->cfg.vocab;
    int32_t pa[10], pb[7], pg[9], ps[5], pd[6];
    make_prompt(pa, 10, 1, V), make_prompt(pb, 7, 2, V), make_prompt(pg, 9, 3, V);
    make_prompt(ps, 5, 4, V), make_prompt(pd, 6, 5, V);
    eng_request ra = greedy_req(pa, 10, 1, 12), rb = greedy_req(pb, 7, 1, 12), rg = greedy_req(pg, 9, 3, 12);
    eng_request rs = greedy_req(ps, 5, 1, 2), rd = greedy_req(pd, 6, 1, 5);
    res_set *got = calloc(1, sizeof *got), *alone = calloc(1, sizeof *alone);
    engine *e = NULL;
    eng_config cfg = cfg_for(m, 64, 512, 64);
    int64_t ia, ib, ig, is, id, xa, xd;
    int rc = got && alone ? eng_create(m, &cfg, &e) : RD_ENOMEM;
    uint64_t v_start = e ? eng_version(e) : 99;
    if (!rc) rc = eng_add(e, &ra, &ia);
    if (!rc) rc = eng_add(e, &rb, &ib);
    if (!rc) rc = eng_add(e, &rg, &ig);
    if (!rc) rc = eng_add(e, &rs, &is);
    if (!rc) rc = steps(e, 4, got);   /* every prompt in step 1: 4 tokens each (S: 2, done) */
    if (!rc) {
        eng_set_version(e, 7);        /* a continue-mode swap between steps */
        rc = eng_add(e, &rd, &id);
    }
    uint64_t v_after = e ? eng_version(e) : 0;
    if (!rc) rc = steps(e, 3, got);   /* A, B, G: tokens 4..6; D: 0..2 */
    if (!rc) eng_set_version(e, 9);
    if (!rc) rc = drive(e, got);
    if (!rc) rc = run_alone(m, &ra, alone, &xa);
    if (!rc) rc = run_alone(m, &rd, alone, &xd);
    eng_stats st;
    if (e)
        eng_get_stats(e, &st);
    eng_destroy(e);
    char w[400] = "";
    int ok = 1;
    if (!rc) {
        const eng_span span3[3] = {{0, 4, 0}, {4, 7, 7}, {7, 12, 9}};
        const eng_span span_s[1] = {{0, 2, 0}};
        const eng_span span_d[2] = {{0, 3, 7}, {3, 5, 9}};
        const eng_result *r;
        int64_t three[] = {ia, ib};
        for (int i = 0; ok && i < 2; i++) {
            r = res_find(got, three[i], 0);
            ok = r && r->n_tokens == 12 && r->finish == FINISH_LENGTH && r->version_finish == 9 &&
                 spans_are(r, 3, span3, w, sizeof w);
        }
        for (int32_t k = 0; ok && k < 3; k++) {
            r = res_find(got, ig, k);
            ok = r && r->n_tokens == 12 && r->version_finish == 9 && spans_are(r, 3, span3, w, sizeof w);
        }
        r = res_find(got, is, 0);
        ok = ok && r && r->n_tokens == 2 && r->version_finish == 0 && spans_are(r, 1, span_s, w, sizeof w);
        r = res_find(got, id, 0);
        ok = ok && r && r->n_tokens == 5 && r->version_finish == 9 && spans_are(r, 2, span_d, w, sizeof w);
        /* A version is a label: sampling is unchanged (the weights did not change). */
        ok = ok && prefix_of(res_find(got, ia, 0), res_find_tag(alone, ra.tag, 0), 1, w, sizeof w) &&
             prefix_of(res_find(got, id, 0), res_find_tag(alone, rd.tag, 0), 1, w, sizeof w);
        if (!ok && !w[0])
            snprintf(w, sizeof w, "a result is missing or has the wrong length/finish/version_finish");
    }
    int n_got = got ? got->n : 0;
    if (got)
        res_clear(got);
    if (alone)
        res_clear(alone);
    free(got), free(alone);
    CHECK_OK(rc);
    CHECK(v_start == 0 && v_after == 7, "eng_version %llu then %llu", (unsigned long long)v_start,
          (unsigned long long)v_after);
    CHECK(n_got == 7, "%d results, expected 7", n_got);
    CHECK(ok, "%s", w);
    CHECK(st.kv_blocks_used == 0, "%d KV blocks left", st.kv_blocks_used);
}

static void test_drain(void)
{
    NEED(tiny32_ok, "tiny-f32");
    model *m = tiny32.m;
    const int32_t V = m->cfg.vocab;
    int32_t pa[20], pb[20], pc[8];
    make_prompt(pa, 20, 11, V), make_prompt(pb, 20, 12, V), make_prompt(pc, 8, 13, V);
    /* A and B need 4 blocks each by the end; the pool holds 5, so one is
     * preempted (recompute) while the other grows. C comes while held. */
    eng_request ra = greedy_req(pa, 20, 1, 40), rb = greedy_req(pb, 20, 1, 40), rc_ = greedy_req(pc, 8, 1, 10);
    res_set *got = calloc(1, sizeof *got), *alone = calloc(1, sizeof *alone);
    eng_config cfg = cfg_for(m, 5, 512, 64);
    engine *e = NULL;
    int64_t ia, ib, ic, xa, xb, xc;
    int rc = got && alone ? eng_create(m, &cfg, &e) : RD_ENOMEM;
    if (!rc) rc = eng_add(e, &ra, &ia);
    if (!rc) rc = eng_add(e, &rb, &ib);
    eng_stats st = {0};
    int32_t started_at_hold = -1, started_before = -1;
    int held_steps = 0, c_ran = 0, idle_zero = -1, started_after_add = -1;
    for (int i = 0; !rc && i < 100; i++) {
        if ((rc = steps(e, 1, got)))
            break;
        eng_get_stats(e, &st);
        if (st.preemptions > 0)
            break;
    }
    eng_stats at_hold = st;
    if (!rc) {
        started_before = eng_started(e);
        eng_hold_new(e, 1);
        rc = eng_add(e, &rc_, &ic);
        started_at_hold = eng_started(e);
        started_after_add = started_at_hold;
    }
    /* Drain: started ones (the preempted one too) run to the end; C waits. */
    while (!rc && eng_started(e) > 0 && held_steps < 500) {
        int n = eng_step(e);
        if (n < 0) {
            rc = n;
            break;
        }
        collect(e, got);
        held_steps++;
    }
    if (!rc) {
        c_ran = res_count(got, ic);
        eng_get_stats(e, &st);
        idle_zero = eng_step(e); /* held and nothing started: computes nothing */
    }
    int n_before_release = got ? got->n : 0;
    eng_stats drained = st;
    if (!rc) {
        eng_hold_new(e, 0);
        rc = drive(e, got);
    }
    if (!rc) rc = run_alone(m, &ra, alone, &xa);
    if (!rc) rc = run_alone(m, &rb, alone, &xb);
    if (!rc) rc = run_alone(m, &rc_, alone, &xc);
    eng_stats end = {0};
    if (e)
        eng_get_stats(e, &end);
    eng_destroy(e);
    char w[400] = "";
    int ok = !rc && prefix_of(res_find(got, ia, 0), res_find_tag(alone, ra.tag, 0), 1, w, sizeof w) &&
             prefix_of(res_find(got, ib, 0), res_find_tag(alone, rb.tag, 0), 1, w, sizeof w) &&
             prefix_of(res_find(got, ic, 0), res_find_tag(alone, rc_.tag, 0), 1, w, sizeof w);
    if (got)
        res_clear(got);
    if (alone)
        res_clear(alone);
    free(got), free(alone);
    CHECK_OK(rc);
    CHECK(at_hold.preemptions > 0 && at_hold.waiting == 1 && at_hold.running == 1,
          "setup: preemptions %lld, waiting %d, running %d", (long long)at_hold.preemptions, at_hold.waiting,
          at_hold.running);
    CHECK(started_before == 2 && started_after_add == 2, "eng_started %d before C, %d after (expected 2: one "
          "running, one preempted with tokens; C not started)", started_before, started_after_add);
    CHECK(held_steps < 500, "the drain did not end (eng_started stays %d)", started_at_hold);
    CHECK(c_ran == 0 && n_before_release == 2, "while held: %d results of C, %d results in all", c_ran,
          n_before_release);
    CHECK(drained.waiting == 1 && drained.running == 0 && drained.kv_blocks_used == 0,
          "drained: waiting %d running %d blocks %d", drained.waiting, drained.running, drained.kv_blocks_used);
    CHECK(idle_zero == 0, "a held step computed %d rows", idle_zero);
    CHECK(ok, "rollouts differ from uninterrupted runs: %s", w);
    CHECK(end.kv_blocks_used == 0 && end.waiting == 0 && end.running == 0, "end state");
}

static void test_abort_started(void)
{
    NEED(tiny32_ok, "tiny-f32");
    model *m = tiny32.m;
    const int32_t V = m->cfg.vocab;
    int32_t p1[8], pg1[8], pg2[60], pw[6];
    make_prompt(p1, 8, 21, V), make_prompt(pg1, 8, 22, V), make_prompt(pg2, 60, 23, V), make_prompt(pw, 6, 24, V);
    eng_request r1 = greedy_req(p1, 8, 1, 20), g1 = greedy_req(pg1, 8, 4, 20), g2 = greedy_req(pg2, 60, 4, 20);
    eng_request rw = greedy_req(pw, 6, 1, 9);
    /* 24 tokens a step: step 1 prefills R1 and G1 (G1 forks) and the first 8
     * of G2's 60; G2's prefill takes the rest of the budget after that, so W
     * waits, never started. */
    res_set *got = calloc(1, sizeof *got), *alone = calloc(1, sizeof *alone);
    eng_config cfg = cfg_for(m, 64, 24, 16);
    engine *e = NULL;
    int64_t i1, ig1, ig2, iw, x1, xg1, xw;
    int rc = got && alone ? eng_create(m, &cfg, &e) : RD_ENOMEM;
    if (!rc) rc = eng_add(e, &r1, &i1);
    if (!rc) rc = eng_add(e, &g1, &ig1);
    if (!rc) rc = eng_add(e, &g2, &ig2);
    if (!rc) rc = eng_add(e, &rw, &iw);
    if (!rc) rc = steps(e, 3, got);
    eng_stats before = {0}, after = {0}, end = {0};
    int32_t started = -1, n_abort = -1, started_after = -1, n_early = -1;
    if (!rc) {
        n_early = got->n;
        eng_get_stats(e, &before);
        started = eng_started(e);
        eng_set_version(e, 5);
        n_abort = eng_abort_started(e);
        collect(e, got);
        eng_get_stats(e, &after);
        started_after = eng_started(e);
    }
    int n_aborted_results = got ? got->n : 0;
    if (!rc) rc = drive(e, got);
    if (e)
        eng_get_stats(e, &end);
    eng_destroy(e);
    if (!rc) rc = run_alone(m, &r1, alone, &x1);
    if (!rc) rc = run_alone(m, &g1, alone, &xg1);
    if (!rc) rc = run_alone(m, &rw, alone, &xw);

    char w[400] = "";
    int ok = !rc;
    if (ok) {
        const eng_span sp3[1] = {{0, 3, 0}};
        const eng_result *r = res_find(got, i1, 0);
        ok = r && r->finish == FINISH_ABORT && r->n_tokens == 3 && r->version_finish == 5 &&
             spans_are(r, 1, sp3, w, sizeof w) && prefix_of(r, res_find_tag(alone, r1.tag, 0), 0, w, sizeof w);
        for (int32_t k = 0; ok && k < 4; k++) {
            r = res_find(got, ig1, k);
            ok = r && r->finish == FINISH_ABORT && r->n_tokens == 3 && spans_are(r, 1, sp3, w, sizeof w) &&
                 prefix_of(r, res_find_tag(alone, g1.tag, k), 0, w, sizeof w);
        }
        for (int32_t k = 0; ok && k < 4; k++) {
            r = res_find(got, ig2, k);
            ok = r && r->finish == FINISH_ABORT && r->n_tokens == 0 && r->n_spans == 0 && r->version_finish == 5 &&
                 r->n_prompt == 60 && r->prompt_ids && !memcmp(r->prompt_ids, pg2, sizeof pg2);
            if (!ok && !w[0])
                snprintf(w, sizeof w, "G2 sample %d: %s", k, r ? "wrong fields" : "missing");
        }
        r = res_find(got, iw, 0);
        ok = ok && r && r->finish == FINISH_LENGTH && r->n_tokens == 9 &&
             prefix_of(r, res_find_tag(alone, rw.tag, 0), 1, w, sizeof w);
        if (!ok && !w[0])
            snprintf(w, sizeof w, "a result is missing or has wrong fields");
        ok = ok && res_count(got, i1) == 1 && res_count(got, ig1) == 4 && res_count(got, ig2) == 4 &&
             res_count(got, iw) == 1;
    }
    if (got)
        res_clear(got);
    if (alone)
        res_clear(alone);
    free(got), free(alone);
    CHECK_OK(rc);
    CHECK(n_early == 0, "%d results before the abort", n_early);
    CHECK(before.running == 6 && before.waiting == 1 && started == 6,
          "before: running %d (R1, G1 x4, G2 mid-prefill), waiting %d (W), started %d", before.running,
          before.waiting, started);
    CHECK(n_abort == 9, "eng_abort_started returned %d, expected 1 + 4 + 4", n_abort);
    CHECK(n_aborted_results == 9, "%d results after the abort", n_aborted_results);
    CHECK(after.running == 0 && after.waiting == 1 && started_after == 0 && after.kv_blocks_used == 0,
          "after: running %d waiting %d started %d blocks %d", after.running, after.waiting, started_after,
          after.kv_blocks_used);
    CHECK(ok, "%s", w);
    CHECK(end.kv_blocks_used == 0 && end.aborted == 9 && end.completed == 1, "end: blocks %d aborted %lld "
          "completed %lld", end.kv_blocks_used, (long long)end.aborted, (long long)end.completed);
}

/* Abort with a preempted (waiting, has tokens) sequence and nothing else. */
static void test_abort_preempted(void)
{
    NEED(tiny32_ok, "tiny-f32");
    model *m = tiny32.m;
    const int32_t V = m->cfg.vocab;
    int32_t pa[20], pb[20];
    make_prompt(pa, 20, 31, V), make_prompt(pb, 20, 32, V);
    eng_request ra = greedy_req(pa, 20, 1, 40), rb = greedy_req(pb, 20, 1, 40);
    res_set *got = calloc(1, sizeof *got), *alone = calloc(1, sizeof *alone);
    eng_config cfg = cfg_for(m, 5, 512, 64);
    engine *e = NULL;
    int64_t ia, ib, xa, xb;
    int rc = got && alone ? eng_create(m, &cfg, &e) : RD_ENOMEM;
    if (!rc) rc = eng_add(e, &ra, &ia);
    if (!rc) rc = eng_add(e, &rb, &ib);
    eng_stats st = {0};
    for (int i = 0; !rc && i < 100; i++) {
        if ((rc = steps(e, 1, got)))
            break;
        eng_get_stats(e, &st);
        if (st.preemptions > 0)
            break;
    }
    int32_t n = -1, started = -1;
    if (!rc) {
        started = eng_started(e);
        n = eng_abort_started(e);
        collect(e, got);
        eng_get_stats(e, &st);
    }
    eng_destroy(e);
    if (!rc) rc = run_alone(m, &ra, alone, &xa);
    if (!rc) rc = run_alone(m, &rb, alone, &xb);
    char w[400] = "";
    const eng_result *a = got ? res_find(got, ia, 0) : NULL, *b = got ? res_find(got, ib, 0) : NULL;
    int ok = !rc && a && b && a->finish == FINISH_ABORT && b->finish == FINISH_ABORT && a->n_tokens > 0 &&
             b->n_tokens > 0 && prefix_of(a, res_find_tag(alone, ra.tag, 0), 0, w, sizeof w) &&
             prefix_of(b, res_find_tag(alone, rb.tag, 0), 0, w, sizeof w);
    if (got)
        res_clear(got);
    if (alone)
        res_clear(alone);
    free(got), free(alone);
    CHECK_OK(rc);
    CHECK(started == 2 && n == 2, "started %d, aborted %d (expected 2, 2)", started, n);
    CHECK(st.running == 0 && st.waiting == 0 && st.kv_blocks_used == 0, "after: running %d waiting %d blocks %d",
          st.running, st.waiting, st.kv_blocks_used);
    CHECK(ok, "aborted results: %s", w[0] ? w : "missing, wrong finish or no tokens");
}

/* The three modes around a real swap on a live engine (the daemon's order:
 * build while decoding, apply between steps, set the version):
 *   continue: running requests keep going on the new weights; tokens before
 *             the swap equal the old model's, a request added afterwards is
 *             the reference (new weights) model's, bit for bit;
 *   drain:    held request C runs entirely on the new weights;
 *   abort:    started ones end with the old tokens, the waiting one runs on
 *             the new weights.
 * The old buffers are freed right after each apply while the engine goes on
 * (ASan: the runner must not keep pointers to them). */
static void test_swap_modes(void)
{
    rd_loaded live;
    CHECK(load_tiny("tiny-f32", &live), "tiny-f32 not loadable");
    model *m = live.m;
    const int32_t V = m->cfg.vocab;
    char dir_x[600], dir_r[600], w[400] = "";
    tmp_dir("modes-export", dir_x, sizeof dir_x);
    tmp_dir("modes-ref", dir_r, sizeof dir_r);
    hset h = {0};
    model *ref = NULL;
    engine *e = NULL;
    upd_patch *p = NULL;
    res_set *got = calloc(1, sizeof *got), *alone = calloc(1, sizeof *alone);
    int32_t pa[10], pb[7], pc[9], pd[12];
    make_prompt(pa, 10, 41, V), make_prompt(pb, 7, 42, V), make_prompt(pc, 9, 43, V), make_prompt(pd, 12, 44, V);
    eng_request ra = greedy_req(pa, 10, 1, 14), rb = greedy_req(pb, 7, 2, 14), rc_ = greedy_req(pc, 9, 1, 8);
    eng_request rd = greedy_req(pd, 12, 1, 8);
    eng_config cfg = cfg_for(m, 64, 512, 64);
    int64_t ia, ib, ic, id;
    const char *step_name = "setup";
    int rc = got && alone ? hset_from_model(m, dir_x, &h) : RD_ENOMEM;
    rm_dir(dir_x);
    if (!rc) rc = eng_create(m, &cfg, &e);
    if (rc) goto out;

    /* ---- continue */
    step_name = "continue";
    int64_t x;
    if ((rc = run_alone(m, &ra, alone, &x)) || (rc = run_alone(m, &rb, alone, &x))) /* old weights, uninterrupted */
        goto out;
    if ((rc = eng_add(e, &ra, &ia)) || (rc = eng_add(e, &rb, &ib)) || (rc = steps(e, 3, got)))
        goto out;
    {
        htensor *q = hset_find(&h, Q0), *nm = hset_find(&h, NORM);
        perturb(q, 0.05f, 51);
        perturb(nm, 0.2f, 52);
        push_t ps[2] = {push_of(q, UPD_F32, (const uint8_t *)q->v), push_of(nm, UPD_F32, (const uint8_t *)nm->v)};
        if ((rc = push(m, ps, 2, 4096, 7, &p)))
            goto out;
    }
    if ((rc = steps(e, 2, got))) /* decode goes on while the patch waits */
        goto out;
    upd_apply(m, p);
    eng_set_version(e, 1);
    upd_patch_free(m->be, p);
    p = NULL;
    if ((rc = eng_add(e, &rd, &id)) || (rc = drive(e, got)))
        goto out;
    if ((rc = hset_load(&h, &m->cfg, m->be, dir_r, &ref)) || (rc = run_alone(ref, &rd, alone, &x)))
        goto out;
    {
        const eng_span s2[2] = {{0, 5, 0}, {5, 14, 1}}, s1[1] = {{0, 8, 1}};
        int ok = 1, changed = 0;
        for (int32_t k = 0; ok && k < 3; k++) {
            const eng_result *r = res_find(got, k == 0 ? ia : ib, k == 0 ? 0 : k - 1);
            const eng_result *old = res_find_tag(alone, k == 0 ? ra.tag : rb.tag, k == 0 ? 0 : k - 1);
            ok = r && old && r->n_tokens == 14 && old->n_tokens == 14 && r->version_finish == 1 &&
                 spans_are(r, 2, s2, w, sizeof w) && !memcmp(r->token_ids, old->token_ids, 5 * sizeof(int32_t)) &&
                 !memcmp(r->logprobs, old->logprobs, 5 * sizeof(float));
            if (!ok && !w[0])
                snprintf(w, sizeof w, "sample %d: the 5 tokens before the swap differ from the old model's", k);
            for (int32_t i = 5; ok && i < 14; i++)
                changed |= r->token_ids[i] != old->token_ids[i] || r->logprobs[i] != old->logprobs[i];
        }
        if (ok && !changed)
            snprintf(w, sizeof w, "tokens after the swap equal the old model's: the new weights were not used");
        ok = ok && changed && spans_are(res_find(got, id, 0), 1, s1, w, sizeof w) &&
             prefix_of(res_find(got, id, 0), res_find_tag(alone, rd.tag, 0), 1, w, sizeof w);
        if (!ok) {
            rc = rd_fail(RD_EINVAL, "%s", w[0] ? w : "results missing or wrong");
            goto out;
        }
    }
    model_free(ref);
    ref = NULL;
    rm_dir(dir_r);
    tmp_dir("modes-ref", dir_r, sizeof dir_r);
    res_clear(got);
    res_clear(alone);

    /* ---- drain */
    step_name = "drain";
    eng_set_version(e, 1);
    if ((rc = eng_add(e, &ra, &ia)) || (rc = steps(e, 2, got)))
        goto out;
    eng_hold_new(e, 1);
    if ((rc = eng_add(e, &rc_, &ic)))
        goto out;
    {
        htensor *g = hset_find(&h, "model.layers.1.mlp.gate_proj.weight");
        perturb(g, 0.05f, 61);
        push_t ps[1] = {push_of(g, UPD_F32, (const uint8_t *)g->v)};
        if ((rc = push(m, ps, 1, 4096, 8, &p)))
            goto out;
    }
    for (int i = 0; eng_started(e) > 0; i++) {
        if (i > 100) {
            rc = rd_fail(RD_EINVAL, "the drain did not end");
            goto out;
        }
        if ((rc = steps(e, 1, got)))
            goto out;
    }
    if (res_find(got, ic, 0)) {
        rc = rd_fail(RD_EINVAL, "the held request ran during the drain");
        goto out;
    }
    upd_apply(m, p);
    eng_set_version(e, 2);
    upd_patch_free(m->be, p);
    p = NULL;
    eng_hold_new(e, 0);
    if ((rc = drive(e, got)) || (rc = hset_load(&h, &m->cfg, m->be, dir_r, &ref)) ||
        (rc = run_alone(ref, &rc_, alone, &x)))
        goto out;
    {
        const eng_span s1[1] = {{0, 8, 2}}, sa[1] = {{0, 14, 1}};
        const eng_result *c = res_find(got, ic, 0), *a = res_find(got, ia, 0);
        int ok = c && a && spans_are(c, 1, s1, w, sizeof w) && spans_are(a, 1, sa, w, sizeof w) &&
                 a->version_finish == 1 && c->version_finish == 2 &&
                 prefix_of(c, res_find_tag(alone, rc_.tag, 0), 1, w, sizeof w);
        if (!ok) {
            rc = rd_fail(RD_EINVAL, "%s", w[0] ? w : "results missing or wrong");
            goto out;
        }
    }
    model_free(ref);
    ref = NULL;
    rm_dir(dir_r);
    tmp_dir("modes-ref", dir_r, sizeof dir_r);
    res_clear(got);
    res_clear(alone);

    /* ---- abort */
    step_name = "abort";
    if ((rc = run_alone(m, &ra, alone, &x)) || (rc = run_alone(m, &rb, alone, &x))) /* old (v2) weights */
        goto out;
    if ((rc = eng_add(e, &ra, &ia)) || (rc = eng_add(e, &rb, &ib)) || (rc = steps(e, 4, got)))
        goto out;
    eng_hold_new(e, 1);
    if ((rc = eng_add(e, &rc_, &ic)))
        goto out;
    {
        htensor *o = hset_find(&h, "model.layers.0.self_attn.o_proj.weight");
        perturb(o, 0.05f, 71);
        push_t ps[1] = {push_of(o, UPD_BF16, NULL)};
        uint8_t *b = pack_as(o, UPD_BF16);
        ps[0].data = b;
        rc = b ? push(m, ps, 1, 4096, 9, &p) : RD_ENOMEM;
        free(b);
        if (rc)
            goto out;
    }
    int32_t n_ab = eng_abort_started(e);
    upd_apply(m, p);
    eng_set_version(e, 3);
    upd_patch_free(m->be, p);
    p = NULL;
    eng_hold_new(e, 0);
    if ((rc = drive(e, got)) || (rc = hset_load(&h, &m->cfg, m->be, dir_r, &ref)) ||
        (rc = run_alone(ref, &rc_, alone, &x)))
        goto out;
    {
        const eng_span s4[1] = {{0, 4, 2}}, s1[1] = {{0, 8, 3}};
        int ok = n_ab == 3;
        for (int32_t k = 0; ok && k < 3; k++) {
            const eng_result *r = res_find(got, k == 0 ? ia : ib, k == 0 ? 0 : k - 1);
            ok = r && r->finish == FINISH_ABORT && spans_are(r, 1, s4, w, sizeof w) &&
                 prefix_of(r, res_find_tag(alone, k == 0 ? ra.tag : rb.tag, k == 0 ? 0 : k - 1), 0, w, sizeof w);
        }
        const eng_result *c = res_find(got, ic, 0);
        ok = ok && c && c->finish == FINISH_LENGTH && spans_are(c, 1, s1, w, sizeof w) &&
             prefix_of(c, res_find_tag(alone, rc_.tag, 0), 1, w, sizeof w);
        if (!ok) {
            rc = rd_fail(RD_EINVAL, "aborted %d: %s", n_ab, w[0] ? w : "results missing or wrong");
            goto out;
        }
    }
    step_name = "end";
    eng_stats st;
    eng_get_stats(e, &st);
    if (st.kv_blocks_used != 0 || m->weights_gen != 3)
        rc = rd_fail(RD_EINVAL, "blocks %d, weights_gen %llu", st.kv_blocks_used, (unsigned long long)m->weights_gen);

out:
    snprintf(w, sizeof w, "%s", rd_errmsg());
    if (p)
        upd_patch_free(m->be, p);
    eng_destroy(e);
    model_free(ref);
    rm_dir(dir_r);
    hset_free(&h);
    if (got)
        res_clear(got);
    if (alone)
        res_clear(alone);
    free(got), free(alone);
    rd_unload(&live);
    CHECK(rc == 0, "%s: rc %d: %.300s", step_name, rc, w);
}

/* ---------------------------------------------------------------------------*/

static void ensure_testdata(void)
{
    if (file_exists("tests/gen_testdata.sh")) {
        char cmd[600];
        snprintf(cmd, sizeof cmd, "tests/gen_testdata.sh '%s' >/dev/null", testdata());
        if (system(cmd) != 0)
            fprintf(stderr, "test_update: %s failed\n", cmd);
    }
}

/* Stages every tensor of the bf16 export f (one chunk per tensor; `bad`
 * >= 0 puts the bf16 value badval, e.g. a NaN, at element 7 of that tensor)
 * and builds a patch served as serve. */
static int push_export(const model *m, const st_file *f, int bad, uint16_t badval, upd_serve serve,
                       upd_patch **out)
{
    *out = NULL;
    const int n = (int)f->n_tensors;
    upd_spec *sp = calloc((size_t)n, sizeof *sp);
    uint8_t *badbuf = NULL;
    if (!sp)
        return RD_ENOMEM;
    uint64_t total = 0;
    for (int i = 0; i < n; i++) {
        const st_tensor *t = &f->tensors[i];
        const uint8_t *d = t->data;
        if (i == bad) {
            if (!(badbuf = malloc(t->end - t->begin))) {
                free(sp);
                return RD_ENOMEM;
            }
            memcpy(badbuf, t->data, t->end - t->begin);
            memcpy(badbuf + 14, &badval, 2);
            d = badbuf;
        }
        sp[i] = (upd_spec){.name = t->name, .dtype = t->dtype == ST_BF16 ? UPD_BF16 : -1, .n_dims = t->n_dims,
                           .shape = {(uint64_t)t->shape[0], t->n_dims == 2 ? (uint64_t)t->shape[1] : 0},
                           .nbytes = t->end - t->begin, .crc32c = crc32c(0, d, t->end - t->begin)};
        total += sp[i].nbytes;
    }
    upd_stage *s;
    int rc = upd_stage_create(&m->cfg, sp, n, total, total, &s);
    for (int i = 0; i < n && !rc; i++) {
        int dup;
        rc = send_data(s, (uint32_t)i, i == bad ? badbuf : f->tensors[i].data, 0, (uint32_t)sp[i].nbytes, &dup);
    }
    if (!rc)
        rc = upd_stage_verify(s);
    if (!rc)
        rc = upd_build(m, s, serve, out);
    if (s)
        upd_stage_free(s);
    free(sp);
    free(badbuf);
    return rc;
}

/* A bf16 push of every weight onto the Q4_1-loaded default model
 * serves bf16 weights, bit-identical (prompt logits and a greedy run) to the
 * model loaded from the same bf16 tensors as an HF folder, and holds their
 * bytes (the Q4_1 ones freed); a push that fails keeps the Q4_1 weights,
 * bytes and outputs as they were. */
static void test_bf16_push_real_model(void)
{
    const char *path = getenv("RD_MODEL");
    path = path && *path ? path : "models/SmolLM2-135M-Instruct.Q4_1.gguf";
    rd_loaded live;
    CHECK(rd_load(path, "cpu", test_threads(0), &live) == 0, "cannot load %s: %s", path, rd_errmsg());
    model *m = live.m, *ref = NULL;
    const int32_t V = m->cfg.vocab;
    int32_t prompt[NP];
    make_prompt(prompt, NP, 9, V);
    char dir[600], w[600] = "";
    tmp_dir("real-bf16", dir, sizeof dir);
    float *l0 = malloc(sizeof(float) * NP * V), *lm = malloc(sizeof(float) * NP * V);
    float *lr = malloc(sizeof(float) * NP * V);
    st_file *f = NULL;
    upd_patch *p = NULL;
    char path_st[700];
    snprintf(path_st, sizeof path_st, "%s/model.safetensors", dir);
    const int64_t w0 = m->weights_bytes;
    void *qkv0 = m->layers[0].qkv;
    int rc = l0 && lm && lr ? seq_logits(m, prompt, NP, l0) : RD_ENOMEM;
    if (!rc)
        rc = model_export_hf(m, dir, ST_BF16);
    if (!rc)
        rc = st_open(path_st, &f);
    if (rc)
        goto out;
    if (f->n_tensors != (size_t)(9 * m->cfg.n_layers + 2)) {
        rc = rd_fail(RD_EFORMAT, "the bf16 export has %zu tensors", f->n_tensors);
        goto out;
    }
    /* (1) A NaN in the last tensor: the build fails, nothing changes. */
    int brc = push_export(m, f, (int)f->n_tensors - 1, 0x7fc0, UPD_SERVE_AS_PUSHED, &p);
    if (brc != RD_EINVAL || p || !strstr(rd_errmsg(), "NaN") || !strstr(rd_errmsg(), f->tensors[f->n_tensors - 1].name)) {
        rc = rd_fail(RD_EINVAL, "(1) a NaN push: rc %d, patch %p: %s", brc, (void *)p, rd_errmsg());
        goto out;
    }
    if ((rc = seq_logits(m, prompt, NP, lm)))
        goto out;
    if (m->weights_bytes != w0 || m->layers[0].qkv != qkv0 || memcmp(l0, lm, sizeof(float) * NP * V)) {
        rc = rd_fail(RD_EINVAL, "(1) a failed push changed the model: %lld bytes (was %lld)",
                     (long long)m->weights_bytes, (long long)w0);
        goto out;
    }
    /* (2) The good push. */
    if ((rc = push_export(m, f, -1, 0, UPD_SERVE_AS_PUSHED, &p)))
        goto out;
    upd_apply(m, p);
    upd_patch_free(m->be, p);   /* the Q4_1 buffers (ASan: freed once, not leaked) */
    p = NULL;
    if ((rc = model_load_hf(dir, m->be, &ref)))
        goto out;
    printf("  weights_bytes: Q4_1 %lld, after the bf16 push %lld, loaded from bf16 %lld (%lld parameters)\n",
           (long long)w0, (long long)m->weights_bytes, (long long)ref->weights_bytes, (long long)m->n_params);
    if (m->weights_bytes != ref->weights_bytes || m->weights_bytes < 2 * m->n_params ||
        m->weights_bytes > 2 * m->n_params + m->n_params / 50 || w0 * 2 > m->weights_bytes) {
        rc = rd_fail(RD_EINVAL, "weights_bytes %lld after the push; %lld loaded from bf16, %lld before, %lld "
                     "parameters", (long long)m->weights_bytes, (long long)ref->weights_bytes, (long long)w0,
                     (long long)m->n_params);
        goto out;
    }
    if (!same_outputs(m, ref, prompt, lm, lr, w, sizeof w)) {
        rc = rd_fail(RD_EINVAL, "(2) bf16 push vs bf16 load: %s", w);
        goto out;
    }
    if (!memcmp(l0, lm, sizeof(float) * NP * V)) {
        rc = rd_fail(RD_EINVAL, "(2) the bf16 push left the Q4_1 logits (nothing swapped?)");
        goto out;
    }
out:
    snprintf(w, sizeof w, "%s", rd_errmsg());
    if (p)
        upd_patch_free(m->be, p);
    model_free(ref);
    if (f)
        st_close(f);
    rm_dir(dir);
    free(l0), free(lm), free(lr);
    rd_unload(&live);
    CHECK(rc == 0, "rc %d: %.400s", rc, w);
}

/* 1 when linear slot (g, l) of m reads back exactly as ggml_dequant_row of
 * ggml_quant_q8_0 of ref's values (ref: the same model served as loaded). */
static int reads_as_q8_0_of(model *m, model *ref, int g, int32_t l, float *a, float *b, uint8_t *q, char *w,
                            size_t cap)
{
    int64_t rows, cols;
    arch_group_shape(m->arch, &m->cfg, (arch_group)g, &rows, &cols);
    void **sm = model_weight_slot(m, (arch_group)g, l, 0), **sr = model_weight_slot(ref, (arch_group)g, l, 0);
    uint64_t n = (uint64_t)(rows * cols);
    int rc = m->be->ops->linear_read(m->be, *sr, a);
    if (!rc)
        rc = ggml_quant_q8_0(a, n, q);
    if (!rc)
        rc = ggml_dequant_row(GGML_Q8_0, q, a, n);
    if (!rc)
        rc = m->be->ops->linear_read(m->be, *sm, b);
    if (rc) {
        snprintf(w, cap, "group %d layer %d: %s", g, l, rd_errmsg());
        return 0;
    }
    for (uint64_t i = 0; i < n; i++)
        if (memcmp(&a[i], &b[i], 4)) {
            snprintf(w, cap, "group %d layer %d element %llu: %.9g served, %.9g from Q8_0", g, l,
                     (unsigned long long)i, b[i], a[i]);
            return 0;
        }
    /* the CPU packs 16-row panels; CUDA (RD_CUDA_Q8=tc) holds the rows as they are */
    const int cpu = !strcmp(m->be->ops->name, "cpu");
    int64_t bytes = m->be->ops->linear_bytes(m->be, *sm), want = (cpu ? (rows + 15) / 16 * 16 : rows) * cols / 32 * 34;
    if (bytes != want) {
        snprintf(w, cap, "group %d layer %d holds %lld bytes; Q8_0 as %s holds it is %lld", g, l, (long long)bytes,
                 m->be->ops->name, (long long)want);
        return 0;
    }
    return 1;
}

/* serve_dtype q8_0 (UPD_SERVE_Q8_0) on the tiny bf16 model: a 1e7 weight (its
 * block's scale overflows fp16) refuses the build naming the tensor, model
 * untouched, where as_pushed builds it; a NaN is refused too; then a push of
 * the model's own bf16 export leaves every linear weight (the tied embedding,
 * q|k|v, o, gate|up, down) reading back as the Q8_0 round trip of its bf16
 * values, bit for bit, at 34 bytes per 32 weights (in 16-row panels on the
 * CPU), the norms as they were, and the outputs changed (bf16 -> Q8_0). In
 * test_update_emu the same on the emulated CUDA backend with RD_CUDA_Q8=tc:
 * the pushed blocks held as Q8_0 on the device and served from there. */
static void test_q8_0_push_tiny(void)
{
    rd_loaded live, orig;
    CHECK(load_tiny("tiny-bf16", &live), "tiny-bf16");
    if (!load_tiny("tiny-bf16", &orig)) {
        rd_unload(&live);
        CHECK(0, "tiny-bf16 (second copy)");
    }
    model *m = live.m, *ref = orig.m;
    const int32_t V = m->cfg.vocab;
    int32_t prompt[NP];
    make_prompt(prompt, NP, 26, V);
    char dir[600], w[600] = "", path_st[700];
    tmp_dir("q8-tiny", dir, sizeof dir);
    snprintf(path_st, sizeof path_st, "%s/model.safetensors", dir);
    int64_t big = (int64_t)V * m->cfg.dim * 4;
    float *l0 = malloc(sizeof(float) * NP * V), *lm = malloc(sizeof(float) * NP * V);
    float *a = malloc(sizeof(float) * (size_t)big), *b = malloc(sizeof(float) * (size_t)big);
    uint8_t *q = malloc((size_t)big / 32 * 34 + 34);
    st_file *f = NULL;
    upd_patch *p = NULL;
    const int64_t w0 = m->weights_bytes;
    int rc = l0 && lm && a && b && q ? seq_logits(m, prompt, NP, l0) : RD_ENOMEM;
    if (!rc)
        rc = model_export_hf(m, dir, ST_BF16);
    if (!rc)
        rc = st_open(path_st, &f);
    if (rc)
        goto out;
    int kt = -1;                /* k_proj of layer 0: fused with q and v */
    for (size_t i = 0; i < f->n_tensors; i++)
        if (!strcmp(f->tensors[i].name, "model.layers.0.self_attn.k_proj.weight"))
            kt = (int)i;
    if (kt < 0) {
        rc = rd_fail(RD_EINVAL, "no k_proj in the export");
        goto out;
    }
    /* (1) 1e7 (bf16 0x4b19): refused as q8_0 naming the tensor; built as pushed. */
    int brc = push_export(m, f, kt, 0x4b19, UPD_SERVE_Q8_0, &p);
    if (brc != RD_EINVAL || p || !strstr(rd_errmsg(), "overflows fp16") || !strstr(rd_errmsg(), f->tensors[kt].name)) {
        rc = rd_fail(RD_EINVAL, "(1) a 1e7 q8_0 push: rc %d, patch %p: %s", brc, (void *)p, rd_errmsg());
        goto out;
    }
    if ((rc = push_export(m, f, kt, 0x4b19, UPD_SERVE_AS_PUSHED, &p)))
        goto out;
    upd_patch_free(m->be, p);   /* never applied */
    p = NULL;
    brc = push_export(m, f, kt, 0x7fc0, UPD_SERVE_Q8_0, &p);
    if (brc != RD_EINVAL || p || !strstr(rd_errmsg(), "NaN")) {
        rc = rd_fail(RD_EINVAL, "(1) a NaN q8_0 push: rc %d: %s", brc, rd_errmsg());
        goto out;
    }
    if ((rc = seq_logits(m, prompt, NP, lm)))
        goto out;
    if (m->weights_bytes != w0 || memcmp(l0, lm, sizeof(float) * NP * V)) {
        rc = rd_fail(RD_EINVAL, "(1) a refused build changed the model");
        goto out;
    }
    /* (2) The push, served as Q8_0. */
    if ((rc = push_export(m, f, -1, 0, UPD_SERVE_Q8_0, &p)))
        goto out;
    upd_apply(m, p);
    for (int32_t l = -1; l < m->cfg.n_layers; l++)
        for (int g = l < 0 ? 0 : AG_FIRST_LAYER; g < (l < 0 ? AG_FIRST_LAYER : AG_COUNT); g++) {
            void **slot = model_weight_slot(m, (arch_group)g, l, 0);
            if (!slot || !*slot || (g == AG_LM_HEAD && m->lm_head == m->embed))
                continue;
            int64_t rows, cols;
            arch_group_shape(m->arch, &m->cfg, (arch_group)g, &rows, &cols);
            if (arch_group_is_linear((arch_group)g)) {
                if (!reads_as_q8_0_of(m, ref, g, l, a, b, q, w, sizeof w)) {
                    rc = rd_fail(RD_EINVAL, "(2) %s", w);
                    goto out;
                }
                continue;
            }
            void **sr = model_weight_slot(ref, (arch_group)g, l, 0);
            if ((rc = m->be->ops->d2h(m->be, a, *slot, sizeof(float) * (size_t)cols)) ||
                (rc = m->be->ops->d2h(m->be, b, *sr, sizeof(float) * (size_t)cols)))
                goto out;
            for (int64_t i = 0; i < cols; i++)   /* the export rounded the fp32 norms to bf16 */
                b[i] = rd_bf16_to_f32(rd_f32_to_bf16(b[i]));
            if (memcmp(a, b, sizeof(float) * (size_t)cols)) {
                rc = rd_fail(RD_EINVAL, "(2) vector group %d layer %d changed", g, l);
                goto out;
            }
        }
    if ((rc = seq_logits(m, prompt, NP, lm)))
        goto out;
    if (!memcmp(l0, lm, sizeof(float) * NP * V) || m->weights_bytes >= w0) {
        rc = rd_fail(RD_EINVAL, "(2) the q8_0 push left the bf16 logits or bytes (%lld, was %lld)",
                     (long long)m->weights_bytes, (long long)w0);
        goto out;
    }
out:
    snprintf(w, sizeof w, "%s", rd_errmsg());
    if (p)
        upd_patch_free(m->be, p);
    if (f)
        st_close(f);
    rm_dir(dir);
    free(l0), free(lm), free(a), free(b), free(q);
    rd_unload(&orig);
    rd_unload(&live);
    CHECK(rc == 0, "rc %d: %.400s", rc, w);
}

int main(void)
{
    ensure_testdata();
    const char *base = getenv("RD_TMP");
    snprintf(tmp_root, sizeof tmp_root, "%s/test_update.XXXXXX", base && *base ? base : "/tmp");
    if (!mkdtemp(tmp_root)) {
        printf("FAIL setup: cannot create a temp folder %s\n", tmp_root);
        return 1;
    }
#ifdef RD_TEST_Q8_DEVICE
    /* test_update_emu: the quantized push onto the device's own Q8_0 (RD_CUDA_Q8=tc) */
    setenv("RD_CUDA_Q8", "tc", 1);
    RUN(test_q8_0_push_tiny);
    rm_dir(tmp_root);
    TEST_EXIT();
#else
    tiny32_ok = load_tiny("tiny-f32", &tiny32);

    RUN(test_manifest_errors);
    RUN(test_manifest_moe);
    RUN(test_chunks);
    RUN(test_build_apply_tied);
    RUN(test_build_apply_untied);
    RUN(test_version_spans);
    RUN(test_drain);
    RUN(test_abort_started);
    RUN(test_abort_preempted);
    RUN(test_swap_modes);
    RUN(test_q8_0_push_tiny);
    RUN(test_bf16_push_real_model);

    if (tiny32_ok)
        rd_unload(&tiny32);
    rm_dir(tmp_root);
    TEST_EXIT();
#endif
}
