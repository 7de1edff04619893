/* test_lora_engine.c - LoRA adapters served by the engine (eng_lora_load,
 * eng_request.lora): many adapters and the base model in one batch.
 *
 * The reference for every request is the request run alone (one request in
 * the engine, nothing else in its steps); the tests then mix requests of up
 * to four adapters and the base model in batches of 1 to 64 rows, under
 * preemption (a KV pool too small for them), with speculative decoding on,
 * and across an adapter replaced while it serves, and demand the same tokens
 * and the same log-prob bits (memcmp) for every row. The prefix cache is
 * checked by its hit counter: a prompt computed under one adapter is never
 * served to another or to the base model. Scoring a rollout's prompt and
 * completion under its adapter gives back the completion's log-prob bits.
 * The arithmetic itself (against a float64 reference of W + s B A) is
 * tests/py/test_lora_forward.py's; this file is about the serving.
 *
 * Built twice: on the CPU backend (with the suite) and on the emulated CUDA
 * backend (build/tests/test_lora_engine_emu, also with the suite: its decode
 * steps run as captured graphs, so an adapter replaced mid-run also checks
 * that a graph never serves the adapter it was captured with). */
#include <stdint.h>

#include "base/err.h"
#include "engine/model/loader.h"
#include "engine/model/lora.h"
#include "engine/serve/engine.h"
#include "tests/unit/engine_helpers.h"
#include "tests/unit/test.h"

#ifndef RD_TEST_BACKEND_DEFAULT
#define RD_TEST_BACKEND_DEFAULT "cpu"
#endif
static const char *test_backend(void)
{
    const char *b = getenv("RD_TEST_BACKEND");
    return b && *b ? b : RD_TEST_BACKEND_DEFAULT;
}

typedef struct {
    const char *model;
    const char *adapters[4];    /* tests/gen_testdata.sh's lora/ folders; NULL past the last */
} family;

static const family FAMILIES[] = {
    {"tiny-f32", {"tiny-f32-r8-attn", "tiny-f32-r64-all", "tiny-f32-r16-mlp", "tiny-f32-r32-qv-rslora"}},
    {"tiny-qwen3", {"tiny-qwen3-r8-attn-rslora", "tiny-qwen3-r64-all", "tiny-qwen3-r16-mlp", "tiny-qwen3-r32-all"}},
    {"tiny-gemma3", {"tiny-gemma3-r8-all", "tiny-gemma3-r32-attn", NULL, NULL}},
    {"tiny-moe-f32", {"tiny-moe-r8-attn", "tiny-moe-r64-attn", NULL, NULL}},
};
#define N_FAMILIES ((int)(sizeof FAMILIES / sizeof FAMILIES[0]))

static int n_adapters(const family *f)
{
    int n = 0;
    while (n < 4 && f->adapters[n])
        n++;
    return n;
}

static int load_model(const family *f, rd_loaded *L)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s.gguf", testdata(), f->model);
    return rd_load(path, test_backend(), test_threads(2), L);
}

static int read_adapter(const rd_loaded *L, const char *name, lora_adapter **a)
{
    char dir[512];
    snprintf(dir, sizeof dir, "%s/lora/%s", testdata(), name);
    return lora_load_peft(dir, &L->m->cfg, LORA_MAX_RANK, a);
}

/* An engine with max_loras slots and every adapter of f loaded under its folder's name, version 1. */
static int make_engine(const rd_loaded *L, const family *f, eng_config cfg, engine **e)
{
    cfg.max_loras = cfg.max_loras ? cfg.max_loras : 4;
    int rc = eng_create(L->m, &cfg, e);
    for (int i = 0; !rc && i < n_adapters(f); i++) {
        lora_adapter *a;
        if ((rc = read_adapter(L, f->adapters[i], &a)))
            break;
        if ((rc = eng_lora_load(*e, a, NULL, 1, 0, NULL, 0)))
            lora_free(a);
    }
    return rc;
}

static eng_config base_config(void)
{
    eng_config c = eng_default_config();
    c.backend = test_backend();
    c.kv_cache_bytes = 8 << 20;
    c.eos_id = -1;              /* every sample runs to max_tokens: long enough to differ */
    c.spec_store_bytes = 0;
    return c;
}

/* Request i of a mix: its prompt, adapter (one of f's or the base model, in turn), sampling (greedy, or
 * T = 1 with its own seed, some with n = 2). */
#define MAX_PROMPT 64
typedef struct {
    int32_t prompt[MAX_PROMPT];
    eng_request r;
} mix_req;

static void make_tokens(int32_t *p, int32_t n, uint64_t salt, int32_t hi)
{
    uint64_t x = 0x9E3779B97F4A7C15ull * (salt + 1) + 12345;
    for (int32_t i = 0; i < n; i++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        p[i] = (int32_t)((x >> 33) % (uint64_t)hi);
    }
}

static void mix_request(const family *f, int32_t vocab, int i, mix_req *q)
{
    memset(q, 0, sizeof *q);
    const int32_t n = 3 + (i * 7) % 37;
    make_tokens(q->prompt, n, (uint64_t)i, vocab);
    const int na = n_adapters(f);
    q->r.prompt = q->prompt;
    q->r.n_prompt = n;
    q->r.n = i % 4 == 3 ? 2 : 1;
    q->r.max_tokens = 10 + i % 5;
    q->r.sp = samp_default();
    q->r.sp.temperature = i % 2 ? 1.0f : 0.0f;
    q->r.sp.seed = 1000 + (uint64_t)i;
    q->r.lora = i % (na + 1) < na ? f->adapters[i % (na + 1)] : NULL;
    q->r.tag = (uint64_t)i;
}

/* One sample's tokens and log-probs, kept as the reference. */
typedef struct {
    int32_t n;
    int32_t tok[64];
    float lp[64];
    char lora[LORA_NAME_MAX];
} sample_bits;

static void keep(const eng_result *r, sample_bits *b)
{
    b->n = r->n_tokens < 64 ? r->n_tokens : 64;
    memcpy(b->tok, r->token_ids, sizeof(int32_t) * (size_t)b->n);
    memcpy(b->lp, r->logprobs, sizeof(float) * (size_t)b->n);
    snprintf(b->lora, sizeof b->lora, "%s", r->lora);
}

static int same(const eng_result *r, const sample_bits *b)
{
    return r->n_tokens == b->n && !memcmp(r->token_ids, b->tok, sizeof(int32_t) * (size_t)b->n) &&
           !memcmp(r->logprobs, b->lp, sizeof(float) * (size_t)b->n) && !strcmp(r->lora, b->lora);
}

static void free_results(res_set *s)
{
    for (int i = 0; i < s->n; i++)
        eng_result_free(&s->r[i]);
    s->n = 0;
}

/* The emulator runs kernels on one host thread, ~100x slower than the CPU backend: it runs a smaller mix
 * (the first 8 requests, on qwen3 and Gemma 3), which still puts four adapters and the base model in one
 * step and replays captured graphs. */
#ifdef RD_TEST_LIGHT
#define N_MIX 8
#define N_MIXED_FAMILIES 2
static const int MIXED_FAMILY[] = {1, 2};
#else
#define N_MIX 64
#define N_MIXED_FAMILIES N_FAMILIES
static const int MIXED_FAMILY[] = {0, 1, 2, 3};
#endif
static sample_bits alone[N_FAMILIES][N_MIX][2];
static int have_alone[N_FAMILIES];

/* Each request of the mix run by itself (engine e serving nothing else). */
static int run_alone(const family *f, int fi, engine *e, int32_t vocab, char *why, size_t cap)
{
    static res_set out;
    for (int i = 0; i < N_MIX; i++) {
        mix_req q;
        mix_request(f, vocab, i, &q);
        int64_t id;
        int rc = eng_add(e, &q.r, &id);
        if (!rc)
            rc = drive(e, &out);
        if (rc || out.n != q.r.n) {
            snprintf(why, cap, "request %d alone: rc %d, %d results (%s)", i, rc, out.n, rd_errmsg());
            free_results(&out);
            return -1;
        }
        for (int k = 0; k < out.n; k++)
            keep(&out.r[k], &alone[fi][i][out.r[k].sample_idx]);
        free_results(&out);
    }
    have_alone[fi] = 1;
    return 0;
}

/* The first k requests of the mix at once, each sample compared with its run alone. */
static int run_mixed(const family *f, int fi, engine *e, int32_t vocab, int k, char *why, size_t cap)
{
    static res_set out;
    for (int i = 0; i < k; i++) {
        mix_req q;
        mix_request(f, vocab, i, &q);
        int64_t id;
        if (eng_add(e, &q.r, &id)) {
            snprintf(why, cap, "add %d: %s", i, rd_errmsg());
            return -1;
        }
    }
    int rc = drive(e, &out);
    int bad = rc ? 1 : 0;
    if (rc)
        snprintf(why, cap, "drive: %s", rd_errmsg());
    for (int j = 0; j < out.n && !bad; j++) {
        const eng_result *r = &out.r[j];
        if (!same(r, &alone[fi][r->tag][r->sample_idx])) {
            snprintf(why, cap, "%s, %d requests at once: request %llu sample %d (adapter '%s') differs from it "
                     "alone", f->model, k, (unsigned long long)r->tag, r->sample_idx, r->lora);
            bad = 1;
        }
    }
    free_results(&out);
    return bad ? -1 : 0;
}

/* Rows of four adapters and the base model in one step: each bit-identical to itself alone, at 1, 2, 9
 * and 64 requests at once, on every family. */
static void test_mixed_batches_equal_alone(void)
{
    for (int mf = 0; mf < N_MIXED_FAMILIES; mf++) {
        const int fi = MIXED_FAMILY[mf];
        const family *f = &FAMILIES[fi];
        rd_loaded L;
        CHECK_OK(load_model(f, &L));
        engine *e;
        eng_config cfg = base_config();
        cfg.prefix_cache = 0;
        CHECK_OK(make_engine(&L, f, cfg, &e));
        char why[400] = "";
        int rc = run_alone(f, fi, e, L.m->cfg.vocab, why, sizeof why);
        const int ks[] = {1, 2, N_MIX < 9 ? N_MIX : 9, N_MIX};
        for (int j = 0; !rc && j < 4; j++)
            rc = run_mixed(f, fi, e, L.m->cfg.vocab, ks[j], why, sizeof why);
        eng_destroy(e);
        rd_unload(&L);
        CHECK(rc == 0, "%s", why);
    }
}

/* Without its adapter a request gives other tokens or log-probs: the mix's comparisons see adapters. */
static __attribute__((unused)) void test_adapters_change_the_output(void)
{
    for (int mf = 0; mf < N_MIXED_FAMILIES; mf++) {
        const int fi = MIXED_FAMILY[mf];
        const family *f = &FAMILIES[fi];
        CHECK(have_alone[fi], "needs test_mixed_batches_equal_alone first");
        rd_loaded L;
        CHECK_OK(load_model(f, &L));
        engine *e;
        CHECK_OK(make_engine(&L, f, base_config(), &e));
        static res_set out;
        int changed = 0, with = 0;
        for (int i = 0; i < N_MIX && i < 12; i++) {
            mix_req q;
            mix_request(f, L.m->cfg.vocab, i, &q);
            if (!q.r.lora)
                continue;
            with++;
            q.r.lora = NULL;
            int64_t id;
            CHECK_OK(eng_add(e, &q.r, &id));
            CHECK_OK(drive(e, &out));
            changed += memcmp(out.r[0].logprobs, alone[fi][i][0].lp, sizeof(float) * (size_t)alone[fi][i][0].n) != 0;
            free_results(&out);
        }
        eng_destroy(e);
        rd_unload(&L);
        CHECK(changed == with, "%s: %d of %d requests give the same log-probs without their adapter", f->model,
              with - changed, with);
    }
}

/* A KV pool too small for the mix: sequences are preempted and recomputed under their adapters, and
 * every sample still equals itself alone. */
static void test_preemption_restores_bits(void)
{
    const int fi = 1;
    const family *f = &FAMILIES[fi];
    CHECK(have_alone[fi], "needs test_mixed_batches_equal_alone first");
    rd_loaded L;
    CHECK_OK(load_model(f, &L));
    eng_config cfg = base_config();
    const model_config *c = &L.m->cfg;
    const int64_t block = 2 * (int64_t)c->n_layers * rd_backend_kv_block_bytes(L.m->be, c->n_kv_heads, 16,
                                                                               c->head_dim);
    cfg.kv_cache_bytes = (N_MIX < 24 ? 6 : 14) * block;
    engine *e;
    CHECK_OK(make_engine(&L, f, cfg, &e));
    static res_set out;
    int samples = 0;
    for (int i = 0; i < N_MIX && i < 24; i++) {
        mix_req q;
        mix_request(f, c->vocab, i, &q);
        int64_t id;
        CHECK_OK(eng_add(e, &q.r, &id));
        samples += q.r.n;
    }
    int rc = drive(e, &out);
    int preempted = 0, bad = -1;
    for (int j = 0; j < out.n; j++) {
        preempted += out.r[j].n_preempt;
        if (bad < 0 && !same(&out.r[j], &alone[fi][out.r[j].tag][out.r[j].sample_idx]))
            bad = j;
    }
    const int n = out.n;
    const uint64_t bad_tag = bad >= 0 ? out.r[bad].tag : 0;
    free_results(&out);
    eng_destroy(e);
    rd_unload(&L);
    CHECK(rc == 0 && n == samples, "rc %d, %d results of %d", rc, n, samples);
    CHECK(preempted > 0, "no preemption: the pool is not small enough for the check");
    CHECK(bad < 0, "request %llu differs from itself alone after preemption", (unsigned long long)bad_tag);
}

/* Prefix cache: one prompt under adapters A, A, B, base, base. Only the second A and the second base
 * find cached blocks; each run equals the same request on a cache-less engine. */
static void test_prefix_cache_salted_by_adapter(void)
{
    const family *f = &FAMILIES[1];
    rd_loaded L;
    CHECK_OK(load_model(f, &L));
    engine *e;
    CHECK_OK(make_engine(&L, f, base_config(), &e));
    int32_t prompt[50];
    make_tokens(prompt, 50, 77, L.m->cfg.vocab);
    const char *order[] = {f->adapters[0], f->adapters[0], f->adapters[1], NULL, NULL, f->adapters[1]};
    const int hit_expected[] = {0, 1, 0, 0, 1, 1};
    static res_set out;
    sample_bits got[6];
    memset(got, 0, sizeof got);
    int64_t hits[6];
    for (int i = 0; i < 6; i++) {
        eng_stats before, after;
        eng_get_stats(e, &before);
        eng_request r = {.prompt = prompt, .n_prompt = 50, .n = 1, .max_tokens = 8, .sp = samp_default(),
                         .lora = order[i]};
        r.sp.temperature = 0;
        int64_t id;
        CHECK_OK(eng_add(e, &r, &id));
        CHECK_OK(drive(e, &out));
        eng_get_stats(e, &after);
        hits[i] = after.prefix_hit_tokens - before.prefix_hit_tokens;
        keep(&out.r[0], &got[i]);
        free_results(&out);
    }
    eng_destroy(e);
    for (int i = 0; i < 6; i++)
        CHECK((hits[i] > 0) == hit_expected[i], "run %d (adapter %s): %lld prompt tokens from the cache, want %s",
              i, order[i] ? order[i] : "none", (long long)hits[i], hit_expected[i] ? "some" : "none");
    /* Each cached run equals its uncached one; A, B and the base model differ. */
    CHECK(!memcmp(got[0].lp, got[1].lp, sizeof got[0].lp) && !memcmp(got[3].lp, got[4].lp, sizeof got[0].lp) &&
              !memcmp(got[2].lp, got[5].lp, sizeof got[0].lp),
          "a prefix-cache hit changed the log-probs");
    CHECK(memcmp(got[0].lp, got[2].lp, sizeof got[0].lp) && memcmp(got[0].lp, got[3].lp, sizeof got[0].lp),
          "adapters A, B and the base model gave the same log-probs");
    rd_unload(&L);
}

/* Speculative decoding with adapters: the drafts are verified under each row's adapter, so the samples
 * equal the plain engine's bit for bit. */
static void test_speculation_with_adapters(void)
{
    const int fi = 1;
    const family *f = &FAMILIES[fi];
    CHECK(have_alone[fi], "needs test_mixed_batches_equal_alone first");
    rd_loaded L;
    CHECK_OK(load_model(f, &L));
    eng_config cfg = base_config();
    cfg.spec_decode = ENG_SPEC_NGRAM;
    cfg.spec_max_draft = 4;
    cfg.spec_max_batch = 64;
    cfg.spec_fixed = 1;
    engine *e;
    CHECK_OK(make_engine(&L, f, cfg, &e));
    char why[400] = "";
    int rc = run_mixed(f, fi, e, L.m->cfg.vocab, N_MIX < 16 ? N_MIX : 16, why, sizeof why);
    eng_stats st;
    eng_get_stats(e, &st);
    eng_destroy(e);
    rd_unload(&L);
    CHECK(rc == 0, "%s", why);
    CHECK(st.spec_drafted > 0, "nothing was drafted: the check shows nothing");
}

/* Scoring a rollout's prompt + completion under its adapter gives back the completion's log-probs, bit
 * for bit; under another adapter it does not. */
static void test_scoring_per_adapter(void)
{
    const int fi = 1;
    const family *f = &FAMILIES[fi];
    CHECK(have_alone[fi], "needs test_mixed_batches_equal_alone first");
    rd_loaded L;
    CHECK_OK(load_model(f, &L));
    engine *e;
    CHECK_OK(make_engine(&L, f, base_config(), &e));
    static res_set out;
    int checked = 0;
    for (int i = 0; i < 8; i++) {
        mix_req q;
        mix_request(f, L.m->cfg.vocab, i, &q);
        const sample_bits *b = &alone[fi][i][0];
        int32_t full[MAX_PROMPT + 64];
        memcpy(full, q.prompt, sizeof(int32_t) * (size_t)q.r.n_prompt);
        memcpy(full + q.r.n_prompt, b->tok, sizeof(int32_t) * (size_t)b->n);
        for (int other = 0; other < 2; other++) {
            eng_request r = {.prompt = full, .n_prompt = q.r.n_prompt + b->n, .n = 1, .max_tokens = 0,
                             .sp = samp_default(), .score_prompt = 1, .score_from = q.r.n_prompt,
                             .lora = other ? (q.r.lora == f->adapters[0] ? f->adapters[1] : f->adapters[0])
                                           : q.r.lora};
            int64_t id;
            CHECK_OK(eng_add(e, &r, &id));
            CHECK_OK(drive(e, &out));
            const int eq = !memcmp(out.r[0].prompt_logprobs + q.r.n_prompt, b->lp, sizeof(float) * (size_t)b->n);
            free_results(&out);
            CHECK(eq == !other, "request %d scored under %s: log-probs %s the rollout's", i,
                  other ? "another adapter" : "its adapter", eq ? "equal" : "differ from");
        }
        checked++;
    }
    eng_destroy(e);
    rd_unload(&L);
    CHECK(checked == 8, "scored %d", checked);
}

/* An adapter replaced under its name while a request runs on it: that request finishes on the old one
 * (its version in the result), requests admitted after get the new one, and the old one is freed when
 * its request is collected. The emulated CUDA backend replays captured decode graphs meanwhile. */
static void test_replace_while_running(void)
{
    const int fi = 1;
    const family *f = &FAMILIES[fi];
    CHECK(have_alone[fi], "needs test_mixed_batches_equal_alone first");
    rd_loaded L;
    CHECK_OK(load_model(f, &L));
    eng_config cfg = base_config();
    cfg.max_loras = 2;
    engine *e;
    CHECK_OK(eng_create(L.m, &cfg, &e));
    lora_adapter *a, *b;
    CHECK_OK(read_adapter(&L, f->adapters[0], &a));
    CHECK_OK(eng_lora_load(e, a, "policy", 1, 0, NULL, 0));
    /* Requests 0 (greedy) and 5 (T = 1) of the mix, run under "policy" = adapters[0]; mix_request gives
       request i adapter i % 5, so 0 and 5 are adapters[0]'s. */
    mix_req q0, q5;
    mix_request(f, L.m->cfg.vocab, 0, &q0);
    mix_request(f, L.m->cfg.vocab, 5, &q5);
    CHECK(q0.r.lora == f->adapters[0] && q5.r.lora == f->adapters[0], "the mix changed");
    q0.r.lora = "policy";
    int64_t id0, id5;
    CHECK_OK(eng_add(e, &q0.r, &id0));
    for (int s = 0; s < 4; s++)
        CHECK(eng_step(e) > 0, "step %d computed nothing", s);
    /* Replace with adapters[1] at version 2, while request 0 decodes. */
    CHECK_OK(read_adapter(&L, f->adapters[1], &b));
    CHECK(eng_lora_unload(e, "policy") == RD_EBUSY, "unloading an adapter in use was not refused");
    CHECK_OK(eng_lora_load(e, b, "policy", 2, 1, NULL, 0));
    /* mix request 1 is adapters[1]'s: run it as "policy" v2. */
    mix_req q1;
    mix_request(f, L.m->cfg.vocab, 1, &q1);
    CHECK(q1.r.lora == f->adapters[1], "the mix changed");
    q1.r.lora = "policy";
    CHECK_OK(eng_add(e, &q1.r, &id5));
    static res_set out;
    CHECK_OK(drive(e, &out));
    CHECK(out.n == 2, "%d results", out.n);
    for (int j = 0; j < 2; j++) {
        const eng_result *r = &out.r[j];
        const int first = r->req_id == id0;
        const sample_bits *want = &alone[fi][first ? 0 : 1][0];
        CHECK(r->lora_version == (first ? 1u : 2u) && !strcmp(r->lora, "policy"), "request %s: version %llu",
              first ? "before" : "after", (unsigned long long)r->lora_version);
        CHECK(r->n_tokens == want->n && !memcmp(r->token_ids, want->tok, sizeof(int32_t) * (size_t)want->n) &&
                  !memcmp(r->logprobs, want->lp, sizeof(float) * (size_t)want->n),
              "the request admitted %s the replace does not equal its adapter alone", first ? "before" : "after");
    }
    free_results(&out);
    lora_info info[4];
    int32_t n;
    CHECK_OK(eng_lora_list(e, info, 4, &n));
    CHECK(n == 1 && info[0].version == 2 && info[0].pins == 0 && info[0].bytes > 0, "listing: %d adapters", n);
    CHECK_OK(eng_lora_unload(e, "policy"));
    CHECK_OK(eng_lora_list(e, info, 4, &n));
    CHECK(n == 0, "%d adapters after the unload", n);
    eng_destroy(e);
    rd_unload(&L);
}

/* The refusals: each a clear error, the engine still serving. */
static void test_refusals(void)
{
    const family *f = &FAMILIES[1];
    rd_loaded L, other;
    CHECK_OK(load_model(f, &L));
    CHECK_OK(load_model(&FAMILIES[0], &other));
    eng_config cfg = base_config();
    cfg.max_loras = 2;
    cfg.max_lora_rank = 16;
    engine *e, *plain;
    CHECK_OK(eng_create(L.m, &cfg, &e));
    eng_config pc = base_config();
    CHECK_OK(eng_create(L.m, &pc, &plain));
    lora_adapter *r8, *r64, *wrong, *r8b, *r8c;
    CHECK_OK(read_adapter(&L, "tiny-qwen3-r8-attn-rslora", &r8));
    CHECK_OK(read_adapter(&L, "tiny-qwen3-r64-all", &r64));
    CHECK_OK(read_adapter(&other, "tiny-f32-r8-attn", &wrong));
    int rc = eng_lora_load(plain, r8, "x", 1, 0, NULL, 0);
    CHECK(rc == RD_ENOTSUP && strstr(rd_errmsg(), "max_loras is 0"), "rc %d: %s", rc, rd_errmsg());
    rc = eng_lora_load(e, r64, "big", 1, 0, NULL, 0);
    CHECK(rc == RD_ERANGE && strstr(rd_errmsg(), "rank 64; max_lora_rank is 16"), "rc %d: %s", rc, rd_errmsg());
    rc = eng_lora_load(e, wrong, "llama's", 1, 0, NULL, 0);
    CHECK(rc == RD_EINVAL && strstr(rd_errmsg(), "made for a 2-layer llama model"), "rc %d: %s", rc, rd_errmsg());
    lora_free(r64);
    lora_free(wrong);
    CHECK_OK(eng_lora_load(e, r8, "a", 1, 0, NULL, 0));
    CHECK_OK(read_adapter(&L, "tiny-qwen3-r8-attn-rslora", &r8b));
    rc = eng_lora_load(e, r8b, "a", 1, 0, NULL, 0);
    CHECK(rc == RD_EINVAL && strstr(rd_errmsg(), "'a' is already loaded"), "rc %d: %s", rc, rd_errmsg());
    CHECK_OK(eng_lora_load(e, r8b, "b", 1, 0, NULL, 0));
    int32_t prompt[4] = {1, 2, 3, 4};
    eng_request r = {.prompt = prompt, .n_prompt = 4, .n = 1, .max_tokens = 4, .sp = samp_default(), .lora = "nope"};
    int64_t id;
    rc = eng_add(e, &r, &id);
    CHECK(rc == RD_ENOENT && strstr(rd_errmsg(), "no adapter named 'nope' is loaded"), "rc %d: %s", rc,
          rd_errmsg());
    rc = eng_add(plain, &(eng_request){.prompt = prompt, .n_prompt = 4, .n = 1, .max_tokens = 4,
                                       .sp = samp_default(), .lora = "a"}, &id);
    CHECK(rc == RD_EINVAL && strstr(rd_errmsg(), "serves no LoRA adapters"), "rc %d: %s", rc, rd_errmsg());
    /* Both slots pinned by queued requests: a third adapter is refused, nothing evicted. */
    r.lora = "a";
    CHECK_OK(eng_add(e, &r, &id));
    r.lora = "b";
    CHECK_OK(eng_add(e, &r, &id));
    CHECK_OK(read_adapter(&L, "tiny-qwen3-r8-attn-rslora", &r8c));
    char ev[LORA_NAME_MAX];
    rc = eng_lora_load(e, r8c, "c", 1, 0, ev, sizeof ev);
    CHECK(rc == RD_EBUSY && ev[0] == 0, "rc %d: %s", rc, rd_errmsg());
    CHECK(eng_lora_unload(e, "a") == RD_EBUSY, "unload of a pinned adapter");
    CHECK(eng_lora_unload(e, "zzz") == RD_ENOENT, "unload of an absent adapter");
    static res_set out;
    CHECK_OK(drive(e, &out));
    CHECK(out.n == 2 && out.r[0].n_tokens == 4 && out.r[1].n_tokens == 4, "the queued requests did not finish");
    free_results(&out);
    /* Idle now: the least recently used ("a") is evicted for "c". */
    CHECK_OK(eng_lora_load(e, r8c, "c", 1, 0, ev, sizeof ev));
    CHECK(!strcmp(ev, "a"), "evicted '%s'", ev);
    eng_destroy(e);
    eng_destroy(plain);
    rd_unload(&L);
    rd_unload(&other);
}

int main(void)
{
    RUN(test_mixed_batches_equal_alone);
#ifndef RD_TEST_LIGHT
    RUN(test_adapters_change_the_output); /* backend-agnostic: the CPU build shows it */
#endif
    RUN(test_preemption_restores_bits);
    RUN(test_prefix_cache_salted_by_adapter);
    RUN(test_speculation_with_adapters);
    RUN(test_scoring_per_adapter);
    RUN(test_replace_while_running);
    RUN(test_refusals);
    return test_failed_cases ? 1 : 0;
}
