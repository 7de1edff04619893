/* test_native_weights.c - the CPU backend keeps weights in their file dtype
 * (kernels/cpu/gemm_quant.h) and computes the same bits as the fp32-widened
 * path (RD_CPU_WEIGHTS=f32), end to end:
 * - resident memory after loading the default model ($RD_MODEL) with a 16 MiB
 *   KV budget is at most file size x 1.1 + KV pool + 48 MiB (the process:
 *   libraries, thread stacks, RoPE tables, tokenizer, GEMM buffers), and
 *   /status's weights_bytes (model.weights_bytes) is what the backend holds:
 *   at most file size x 1.1 natively, 4 bytes per weight with f32 (the RSS
 *   bound is not checked under AddressSanitizer, whose shadow memory counts);
 * - the default model's prompt logits (prompts of 1, 2, 3, 5, 37 and 70
 *   tokens: the L1 and the panel-buffer paths and a second row chunk) are
 *   memcmp-equal between the two paths, and so are a 32-token greedy run and
 *   a seeded n = 2 run (token ids and log-probs), each alone and inside a
 *   batch of 4, and the batched runs equal the lone ones (batch invariance);
 * - every tiny model of tests/gen_testdata.sh (all 11 dtypes, every family,
 *   untied, GGUF v2) gives memcmp-equal prompt logits on both paths, and so
 *   do HF checkpoints in F16 and BF16 (held in half the bytes of fp32). */
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "engine/serve/engine.h"
#include "base/err.h"
#include "engine/model/loader.h"
#include "engine/model/runner.h"
#include "tests/unit/engine_helpers.h"
#include "tests/unit/test.h"

/* Loads path on the CPU backend, fp32-widened (f32 = 1) or in file dtypes. */
static int load(const char *path, int f32, rd_loaded *l)
{
    if (f32)
        setenv("RD_CPU_WEIGHTS", "f32", 1);
    else
        unsetenv("RD_CPU_WEIGHTS");
    int rc = rd_load(path, "cpu", 0, l);
    unsetenv("RD_CPU_WEIGHTS");
    if (rc)
        fprintf(stderr, "test_native_weights: cannot load %s: %s\n", path, rd_errmsg());
    return rc;
}

static long vm_rss_kb(void)
{
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long kb = -1;
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, "VmRSS:", 6))
            kb = strtol(line + 6, NULL, 10);
    if (f)
        fclose(f);
    return kb;
}

static void make_prompt(int32_t *p, int32_t n, uint32_t salt, int32_t vocab)
{
    uint64_t x = 0x9E3779B97F4A7C15ull * (salt + 1) + 12345;
    for (int32_t i = 0; i < n; i++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        p[i] = (int32_t)((x >> 33) % (uint64_t)vocab);
    }
}

/* Both loads' logits for prompts of each length in lens; 0 when all equal. */
static int compare_logits(model *a, model *b, const int32_t *lens, int n_lens, char *why, size_t cap)
{
    const int32_t vocab = a->cfg.vocab;
    float *la = malloc(sizeof(float) * 70 * vocab), *lb = malloc(sizeof(float) * 70 * vocab);
    int32_t ids[128];
    int bad = !la || !lb;
    for (int i = 0; i < n_lens && !bad; i++) {
        int32_t n = lens[i];
        make_prompt(ids, n, (uint32_t)i, vocab);
        if (seq_logits(a, ids, n, la) || seq_logits(b, ids, n, lb)) {
            snprintf(why, cap, "forward: %s", rd_errmsg());
            bad = 1;
        } else if (memcmp(la, lb, sizeof(float) * n * vocab)) {
            size_t j = 0;
            while (!memcmp(&la[j], &lb[j], 4))
                j++;
            snprintf(why, cap, "prompt of %d: logit [%zu][%zu] %.9g (f32) vs %.9g (native)", n, j / vocab, j % vocab,
                     la[j], lb[j]);
            bad = 1;
        }
    }
    free(la);
    free(lb);
    return bad;
}

/* ---------------------------------------------------------------------------
 * Memory. Runs first, in a fresh process. */

static void test_rss_after_load(void)
{
    const char *path = real_model_path();
    struct stat st;
    CHECK(stat(path, &st) == 0, "%s missing (make model)", path);
    /* What the process held before loading (the libraries: in a CUDA build
     * the CUDA runtime and cuBLASLt alone are ~150 MB) is not the model's. */
    const long base = vm_rss_kb();
    rd_loaded l;
    CHECK_OK(load(path, 0, &l));
    eng_config c = eng_default_config();
    c.kv_cache_bytes = 16 << 20;
    engine *e;
    CHECK_OK(eng_create(l.m, &c, &e));
    eng_stats s;
    eng_get_stats(e, &s);
    const int64_t kv = (int64_t)s.kv_blocks_total * c.block_size * model_kv_bytes_per_token(&l.m->cfg);
    const long rss = vm_rss_kb() - base;
    /* The logit rows kept for scoring prompts (ENG_SCORE_CHUNK of them, allocated zeroed with the engine) are
       the engine's by design, as the KV pool is. */
    const int64_t score_rows = (int64_t)ENG_SCORE_CHUNK * l.m->cfg.vocab * (int64_t)sizeof(float);
    const int64_t file = st.st_size, fixed = 48 << 20, held = l.m->weights_bytes;
    const int64_t limit = file + file / 10 + kv + score_rows + fixed;
    eng_destroy(e);
    rd_unload(&l);
    fprintf(stderr, "test_native_weights: file %lld B, weights held %lld B, KV %lld B, VmRSS %ld kB over the %ld kB "
            "before loading (limit %lld kB)\n", (long long)file, (long long)held, (long long)kv, rss, base,
            (long long)(limit / 1024));
    CHECK(held > 0 && held <= file + file / 10, "weights_bytes %lld for a %lld-byte file", (long long)held,
          (long long)file);
#if defined(__SANITIZE_ADDRESS__)
    /* Shadow memory and redzones are not the process's own footprint. */
    (void)rss;
#else
    CHECK(rss > 0 && rss * 1024 <= limit,
          "VmRSS grew %ld kB in loading > file x 1.1 + KV + the scoring rows' logits + 48 MiB = %lld kB", rss,
          (long long)(limit / 1024));
#endif
}

/* ---------------------------------------------------------------------------
 * The default model, both paths. */

static rd_loaded real_f32, real_nat;
static int real_ok;

static void test_real_logits(void)
{
    CHECK(real_ok, "the default model is not loaded");
    CHECK(real_f32.m->weights_bytes >= 4 * real_f32.m->n_params &&
              real_nat.m->weights_bytes * 4 < real_f32.m->weights_bytes,
          "weights_bytes f32 %lld, native %lld, %lld parameters", (long long)real_f32.m->weights_bytes,
          (long long)real_nat.m->weights_bytes, (long long)real_f32.m->n_params);
    const int32_t lens[] = {1, 2, 3, 5, 37, 70};
    char why[256] = "";
    CHECK(!compare_logits(real_f32.m, real_nat.m, lens, 6, why, sizeof why), "%s", why);
}

/* Under AddressSanitizer the default model's 4 generations took 65 s of the suite: 8 tokens there
 * (the same code paths: prefill, decode, sampling, batching); the plain build generates 32. */
#if defined(__SANITIZE_ADDRESS__)
#define GEN_TOKENS 8
#else
#define GEN_TOKENS 32
#endif

typedef struct {
    int32_t n_tokens;
    int32_t ids[GEN_TOKENS];
    float lp[GEN_TOKENS];
} gen_out;

/* Runs n_req requests at once: request 0 greedy, 1 seeded with n = 2 (two
 * results), the rest greedy on other prompts; fills out[] by (request, sample). */
static int generate(model *m, int n_req, gen_out *out)
{
    eng_config c = eng_default_config();
    c.kv_cache_bytes = 64 << 20;
    engine *e;
    int rc = eng_create(m, &c, &e);
    if (rc)
        return rc;
    int32_t prompts[4][24];
    int64_t ids[4];
    for (int i = 0; i < n_req && !rc; i++) {
        make_prompt(prompts[i], 24, 100 + (uint32_t)i, m->cfg.vocab);
        eng_request r;
        memset(&r, 0, sizeof r);
        r.prompt = prompts[i];
        r.n_prompt = 24;
        r.n = i == 1 ? 2 : 1;
        r.max_tokens = GEN_TOKENS;
        r.ignore_eos = 1;
        r.sp = samp_default();
        r.sp.temperature = i == 1 ? 0.8f : 0.0f;
        r.sp.top_p = i == 1 ? 0.95f : 1.0f;
        r.sp.seed = 42;
        r.tag = (uint64_t)i;
        rc = eng_add(e, &r, &ids[i]);
    }
    eng_result res[8];
    int n_res = 0;
    while (!rc && eng_busy(e)) {
        rc = eng_step(e) < 0 ? -1 : 0;
        int k;
        while ((k = eng_collect(e, res + n_res, 8 - n_res)) > 0)
            n_res += k;
    }
    for (int i = 0; i < n_res; i++) {
        int slot = (int)res[i].tag == 0 ? 0 : (int)res[i].tag == 1 ? 1 + res[i].sample_idx : (int)res[i].tag + 1;
        out[slot].n_tokens = res[i].n_tokens;
        memcpy(out[slot].ids, res[i].token_ids, sizeof(int32_t) * (res[i].n_tokens < GEN_TOKENS ? res[i].n_tokens : GEN_TOKENS));
        memcpy(out[slot].lp, res[i].logprobs, sizeof(float) * (res[i].n_tokens < GEN_TOKENS ? res[i].n_tokens : GEN_TOKENS));
        eng_result_free(&res[i]);
    }
    eng_destroy(e);
    return rc;
}

static void test_real_generate(void)
{
    CHECK(real_ok, "the default model is not loaded");
    gen_out f_alone[5], n_alone[5], f_batch[5], n_batch[5];
    memset(f_alone, 0, sizeof f_alone), memset(n_alone, 0, sizeof n_alone);
    memset(f_batch, 0, sizeof f_batch), memset(n_batch, 0, sizeof n_batch);
    CHECK_OK(generate(real_f32.m, 2, f_alone));
    CHECK_OK(generate(real_nat.m, 2, n_alone));
    CHECK_OK(generate(real_f32.m, 4, f_batch));
    CHECK_OK(generate(real_nat.m, 4, n_batch));
    for (int s = 0; s < 3; s++) {
        CHECK(n_alone[s].n_tokens == GEN_TOKENS, "sample %d: %d tokens", s, n_alone[s].n_tokens);
        CHECK(!memcmp(&f_alone[s], &n_alone[s], sizeof(gen_out)), "sample %d alone: f32 and native runs differ", s);
        CHECK(!memcmp(&n_alone[s], &n_batch[s], sizeof(gen_out)), "sample %d: native alone and in a batch of 4 differ",
              s);
    }
    CHECK(memcmp(n_alone[1].ids, n_alone[2].ids, sizeof n_alone[1].ids), "the two seeded samples are identical");
    CHECK(!memcmp(f_batch, n_batch, sizeof f_batch), "batch of 4: f32 and native runs differ");
}

/* ---------------------------------------------------------------------------
 * Every tiny model: each dtype, family and layout. */

static void test_tiny_models(void)
{
    static const char *names[] = {"tiny-f32",   "tiny-f16",    "tiny-bf16",  "tiny-q8_0",  "tiny-q4_0",
                                  "tiny-q4_1",  "tiny-q5_0",   "tiny-q5_1",  "tiny-q4_k",  "tiny-q5_k",
                                  "tiny-q6_k",  "tiny-v2",     "tiny-untied", "tiny-qwen2", "tiny-qwen3",
                                  "tiny-gemma3", "tiny-llama3"};
    const int32_t lens[] = {1, 3, 9, 70};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        char path[256], why[200] = "";
        snprintf(path, sizeof path, "%s/%s.gguf", testdata(), names[i]);
        rd_loaded a, b;
        CHECK(load(path, 1, &a) == 0, "%.200s: %.200s (run tests/gen_testdata.sh)", path, rd_errmsg());
        CHECK(load(path, 0, &b) == 0, "%.200s: %.200s", path, rd_errmsg());
        int bad = compare_logits(a.m, b.m, lens, 4, why, sizeof why);
        int64_t wa = a.m->weights_bytes, wb = b.m->weights_bytes;
        rd_unload(&a);
        rd_unload(&b);
        CHECK(!bad, "%s: %s", names[i], why);
        CHECK(wb <= wa, "%s: native weights %lld bytes, f32 %lld", names[i], (long long)wb, (long long)wa);
    }
}

/* An HF checkpoint in F16 and in BF16 (exported from tiny-q8_0) keeps its
 * dtype natively: half the bytes of fp32, the same logits. */
static void test_hf_half_checkpoints(void)
{
    char path[256], dir[] = "/tmp/rd_native_XXXXXX", why[200] = "";
    snprintf(path, sizeof path, "%s/tiny-q8_0.gguf", testdata());
    CHECK(mkdtemp(dir), "mkdtemp");
    rd_loaded src;
    CHECK(load(path, 1, &src) == 0, "%.200s: %.200s", path, rd_errmsg());
    const st_dtype dts[2] = {ST_F16, ST_BF16};
    const int32_t lens[] = {1, 3, 9};
    int bad = 0;
    for (int i = 0; i < 2 && !bad; i++) {
        char sub[300];
        snprintf(sub, sizeof sub, "%s/%s", dir, i ? "bf16" : "f16");
        bad = mkdir(sub, 0700) || model_export_hf(src.m, sub, dts[i]);
        if (bad) {
            snprintf(why, sizeof why, "export %.60s: %.100s", sub, rd_errmsg());
            break;
        }
        rd_loaded a, b;
        if (load(sub, 1, &a) || load(sub, 0, &b)) {
            snprintf(why, sizeof why, "load %.60s: %.100s", sub, rd_errmsg());
            bad = 1;
            break;
        }
        bad = compare_logits(a.m, b.m, lens, 3, why, sizeof why);
        if (!bad && !(b.m->weights_bytes * 3 < a.m->weights_bytes * 2)) {
            snprintf(why, sizeof why, "%.60s: native %lld bytes, f32 %lld", sub, (long long)b.m->weights_bytes,
                     (long long)a.m->weights_bytes);
            bad = 1;
        }
        rd_unload(&a);
        rd_unload(&b);
        char f[400];
        snprintf(f, sizeof f, "%s/config.json", sub);
        unlink(f);
        snprintf(f, sizeof f, "%s/model.safetensors", sub);
        unlink(f);
        rmdir(sub);
    }
    rmdir(dir);
    rd_unload(&src);
    CHECK(!bad, "%s", why);
}

int main(void)
{
    RUN(test_rss_after_load);   /* first: a process that has loaded nothing else */
    real_ok = load(real_model_path(), 1, &real_f32) == 0 && load(real_model_path(), 0, &real_nat) == 0;
    RUN(test_real_logits);
    RUN(test_real_generate);
    if (real_ok) {
        rd_unload(&real_f32);
        rd_unload(&real_nat);
    }
    RUN(test_tiny_models);
    RUN(test_hf_half_checkpoints);
    TEST_EXIT();
}
