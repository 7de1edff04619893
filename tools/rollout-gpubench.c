/* rollout-gpubench - the GPU checks and benchmarks that tests/gpu/run.sh runs.
 *
 *   rollout-gpubench info       [--backend cuda]
 *   rollout-gpubench copybw     [--mib 1024] [--iters 20]
 *   rollout-gpubench parity     MODEL [--prompts 8] [--tokens 32] [--tol 0.05]
 *   rollout-gpubench invariance MODEL [--tokens 32]
 *   rollout-gpubench sampler    MODEL
 *   rollout-gpubench engine     MODEL [--batches 1,32] [--tokens 128]
 *   rollout-gpubench bench      MODEL [--batches 1,8,32,128,256]
 *                               [--prompt 128] [--steps 32] [--bw GBPS] [--label NAME]
 * MODEL: --model PATH, or --synthetic 1b|qwen3-1.7b|qwen3-0.6b|gemma3-270m|tiny,
 * that shape with random weights built in memory (no tokenizer: prompts are
 * random ids, half of them longer than a sliding window where there is one).
 * Common flags: --backend NAME (default cuda), --json FILE, --threads N (CPU),
 * --weights fp8 (the layers' dense linears re-quantized to FP8 blocks after
 * loading, as serve_dtype fp8 holds them), --kv fp8 (kv_dtype fp8).
 *
 * parity: greedy rollouts of 8 fixed prompts on the CPU backend and on the
 *   tested backend through the engine; tokens must match (a divergence where
 *   the CPU's two best tokens are within 2*tol nats counts as a near tie and
 *   ends the comparison of that prompt) and the chosen tokens' raw log-probs
 *   must agree within tol. The CPU reference stores its KV cache as the
 *   device does, bf16 (--ref-kv f32|bf16|f16 to choose): what is compared is
 *   the kernels' arithmetic, not the cache's precision, which alone moves
 *   Gemma 3's random-weight shape by up to 0.35 nats (CPU f32 vs CPU bf16).
 *   --noise-kv DTYPE: on a shape that sensitive no fixed tol separates a
 *   kernel bug from noise; the CPU runs a third time with only its cache's
 *   dtype changed, and the tested backend passes if it follows the
 *   reference's tokens (equal prefixes, summed over the prompts) at least as
 *   far as that run does.
 * invariance: the same 8 seeded sampled rollouts alone, together with 40
 *   other requests (other batch sizes, chunked prefill, other graph buckets)
 *   and with CUDA graphs off: tokens and log-probs bit-identical.
 * sampler: the device sampler (runner_sample) against samp_sample on the
 *   same real logits, over temperatures, top-k, top-p, min-p and seeds.
 * engine: decode tokens/s through the whole engine (scheduler, block tables,
 *   CUDA graphs, sampling) for --batches greedy requests of --tokens tokens,
 *   timed from the step after every request has its first token; once with
 *   device sampling and once with RD_HOST_SAMPLING=1, side by side.
 * bench: decode tokens/s at each batch size (prompt tokens prefilled, then
 *   --steps timed decode steps, each a forward pass plus greedy device
 *   sampling), against the memory roofline: bytes a step must read (weights
 *   as the backend stores them + the live KV cache) / copy bandwidth.
 *
 * Each prints a summary, "TABLE|..." lines for run.sh's final table, and the
 * JSON document to --json. Exit 0 pass, 1 a check failed, 2 usage, 3 setup
 * (no device, no model, out of memory). */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/clock.h"
#include "engine/serve/engine.h"
#include "base/err.h"
#include "engine/format/gguf.h"
#include "engine/model/loader.h"
#include "engine/model/quant_fp8.h"
#include "engine/model/runner.h"
#include "tools/cli.h"

static const char *P = "rollout-gpubench";

static uint64_t mix(uint64_t *s)
{
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

typedef struct {
    const char *backend;
    const char *model;
    const char *synthetic;
    const char *json;
    const char *label;
    const char *weights;        /* NULL, or "fp8" */
    const char *kv;             /* NULL (the backend's), or a kv_dtype */
    const char *ref_kv;         /* parity: the CPU reference's kv_dtype (NULL: bf16 against a device, else its own) */
    const char *noise_kv;       /* parity: NULL (held to --tol), or the kv_dtype of a CPU run that sets the floor */
    int threads;
    int32_t prompts, tokens, prompt_len, steps, mib, iters;
    double tol, bw;
    int32_t *batches;
    int32_t n_batches;
} opts;

static int write_json(const opts *o, cJSON *doc)
{
    char *txt = cJSON_Print(doc);
    int rc = 0;
    if (o->json && txt) {
        FILE *f = fopen(o->json, "w");
        if (!f || fputs(txt, f) < 0 || fputc('\n', f) < 0)
            rc = 1;
        if (f)
            fclose(f);
        if (rc)
            fprintf(stderr, "%s: cannot write %s\n", P, o->json);
    }
    free(txt);
    cJSON_Delete(doc);
    return rc;
}

/* The file name of a path (the model's label in tables). */
static const char *base_name(const char *path)
{
    const char *slash = strrchr(path, '/');
    return slash ? slash + 1 : path;
}

static int setup_fail(const char *what)
{
    fprintf(stderr, "%s: %s: %s\n", P, what, rd_errmsg());
    return 3;
}

/* ------------------------------------------------------------------ info, copy bandwidth */

static int cmd_info(const opts *o)
{
    rd_backend *be;
    if (rd_backend_create(o->backend, o->threads, &be))
        return setup_fail("backend");
    char desc[2048] = "";
    if (be->ops->describe)
        be->ops->describe(be, desc, sizeof desc);
    size_t fr = 0, tot = 0;
    if (be->ops->mem_info)
        be->ops->mem_info(be, &fr, &tot);
    printf("backend %s: %s\nmemory: %.2f GiB free of %.2f GiB\n", be->ops->name, desc, fr / 1073741824.0,
           tot / 1073741824.0);
    cJSON *d = cJSON_CreateObject();
    cJSON_AddStringToObject(d, "backend", be->ops->name);
    cJSON_AddStringToObject(d, "describe", desc);
    cJSON_AddNumberToObject(d, "mem_free", (double)fr);
    cJSON_AddNumberToObject(d, "mem_total", (double)tot);
    rd_backend_destroy(be);
    return write_json(o, d);
}

/* Device-to-device copy bandwidth in GB/s, counting read + write bytes. */
static int copy_bw(rd_backend *be, int32_t mib, int32_t iters, double *gbps)
{
    *gbps = 0;
    size_t bytes = (size_t)mib << 20;
    if (!be->ops->d2d && strcmp(be->ops->name, "cpu"))
        return rd_fail(RD_ENOTSUP, "backend %s has no d2d copy", be->ops->name);
    if (!be->ops->d2d) { /* the CPU backend: its memory is host memory */
        char *a = malloc(bytes), *b = malloc(bytes);
        if (!a || !b) {
            free(a), free(b);
            return rd_fail(RD_ENOMEM, "cannot allocate 2 x %d MiB", mib);
        }
        memset(a, 1, bytes), memset(b, 2, bytes);
        double t0 = clock_now_s();
        for (int i = 0; i < iters; i++)
            memcpy(i & 1 ? a : b, i & 1 ? b : a, bytes);
        double t = clock_now_s() - t0;
        *gbps = t > 0 ? 2.0 * bytes * iters / t / 1e9 : 0;
        free(a), free(b);
        return 0;
    }
    void *a = be->ops->alloc(be, bytes), *b = be->ops->alloc(be, bytes);
    int rc = a && b ? 0 : rd_fail(RD_ENOMEM, "cannot allocate 2 x %d MiB", mib);
    for (int i = 0; !rc && i < 3; i++)
        rc = be->ops->d2d(be, b, a, bytes);
    if (!rc)
        rc = be->ops->sync(be);
    double t0 = clock_now_s();
    for (int i = 0; !rc && i < iters; i++)
        rc = be->ops->d2d(be, i & 1 ? a : b, i & 1 ? b : a, bytes);
    if (!rc)
        rc = be->ops->sync(be);
    double t = clock_now_s() - t0;
    if (!rc && t > 0)
        *gbps = 2.0 * bytes * iters / t / 1e9;
    if (a) be->ops->free(be, a);
    if (b) be->ops->free(be, b);
    return rc;
}

static int cmd_copybw(const opts *o)
{
    rd_backend *be;
    if (rd_backend_create(o->backend, o->threads, &be))
        return setup_fail("backend");
    double gbps;
    int rc = copy_bw(be, o->mib, o->iters, &gbps);
    rd_backend_destroy(be);
    if (rc)
        return setup_fail("copy bandwidth");
    printf("copy bandwidth: %.1f GB/s (read + write, %d x %d MiB)\n", gbps, o->iters, o->mib);
    printf("TABLE|copy|d2d bandwidth|%.1f GB/s|\n", gbps);
    cJSON *d = cJSON_CreateObject();
    cJSON_AddNumberToObject(d, "copy_gbps", gbps);
    cJSON_AddNumberToObject(d, "mib", o->mib);
    cJSON_AddNumberToObject(d, "iters", o->iters);
    return write_json(o, d);
}

/* ------------------------------------------------------------------ engine runs */

static const char *PROMPTS[8] = {
    "The capital of France is",
    "Write a short poem about the sea.",
    "def fibonacci(n):",
    "Question: What is 17 times 23? Answer:",
    "Once upon a time, in a small village,",
    "The three laws of thermodynamics are",
    "Translate to German: Good morning, how are you?",
    "List the planets of the solar system in order:",
};

typedef struct {
    int32_t n;
    int32_t *ids;
} prompt_t;

#define SYNTH_NAMES "1b, qwen3-1.7b, qwen3-0.6b, gemma3-270m or tiny"

/* ------------------------------------------------------------------ synthetic models */

typedef struct {
    uint64_t seed;
} synth_ctx;

static int synth_fetch(void *ctx, const char *name, int64_t rows, int64_t cols, float *dst)
{
    const synth_ctx *c = ctx;
    uint64_t h = 1469598103934665603ull ^ c->seed;
    for (const char *p = name; *p; p++)
        h = (h ^ (unsigned char)*p) * 1099511628211ull;
    int64_t n = rows * cols;
    if (rows == 1 && strstr(name, "norm")) {
        for (int64_t i = 0; i < n; i++)
            dst[i] = 1.0f;
        return 0;
    }
    /* uniform with std 0.02, as a freshly initialised Llama, rounded to bf16
     * values: the CPU backend keeps these fp32 weights, a device rounds them
     * to bf16, and both then hold the same numbers */
    const float a = 0.02f * 1.7320508f;
    uint64_t x = h | 1;
    for (int64_t i = 0; i < n; i++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        dst[i] = rd_bf16_to_f32(rd_f32_to_bf16((float)((double)(x >> 40) * (1.0 / 16777216.0) * 2.0 - 1.0) * a));
    }
    return 0;
}

static int synth_config(const char *which, model_config *c)
{
    memset(c, 0, sizeof *c);
    strcpy(c->arch, "llama");
    if (!strcmp(which, "1b")) { /* Llama 3.2 1B's shape: 1.24 B parameters */
        c->n_layers = 16, c->dim = 2048, c->n_heads = 32, c->n_kv_heads = 8, c->ffn_dim = 8192;
        c->vocab = 128256, c->max_ctx = 4096, c->rope_theta = 500000.0f;
    } else if (!strcmp(which, "tiny")) {
        c->n_layers = 2, c->dim = 64, c->n_heads = 4, c->n_kv_heads = 2, c->ffn_dim = 128;
        c->vocab = 300, c->max_ctx = 1024, c->rope_theta = 10000.0f;
    } else if (!strcmp(which, "qwen3-1.7b") || !strcmp(which, "qwen3-0.6b")) {
        /* Qwen3's shapes: q width 16 x 128 = 2048 (1.7B: = hidden; 0.6B: over
         * hidden 1024), per-head q/k norms, tied embeddings, 151,936 tokens. */
        strcpy(c->arch, "qwen3");
        int big = !strcmp(which, "qwen3-1.7b");
        c->n_layers = 28, c->dim = big ? 2048 : 1024, c->n_heads = 16, c->n_kv_heads = 8;
        c->ffn_dim = big ? 6144 : 3072, c->vocab = 151936, c->max_ctx = 4096, c->rope_theta = 1000000.0f;
        c->head_dim = 128;
        c->norm_eps = 1e-6f;
        c->tied_embeddings = 1;
        return 0;
    } else if (!strcmp(which, "gemma3-270m")) {
        /* Gemma 3 270M's shape: 18 layers of 4 heads x 256 over 1 KV head,
         * a 512-token window on 5 of every 6 layers, 262,144 tokens. */
        strcpy(c->arch, "gemma3");
        c->n_layers = 18, c->dim = 640, c->n_heads = 4, c->n_kv_heads = 1, c->head_dim = 256;
        c->ffn_dim = 2048, c->vocab = 262144, c->max_ctx = 4096, c->rope_theta = 1000000.0f;
        c->norm_eps = 1e-6f;
        c->tied_embeddings = 1;
        c->sliding_window = 512, c->swa_period = 6, c->rope_local_theta = 10000.0f;
        c->attn_scalar = 256.0f, c->embed_scale = sqrtf(640.0f);
        return 0;
    } else {
        return -1;
    }
    c->head_dim = c->dim / c->n_heads;
    c->norm_eps = 1e-5f;
    c->tied_embeddings = 1;
    return 0;
}

/* --weights fp8: every layer's dense linear read back and re-quantized to
 * FP8 blocks (engine/model/quant_fp8.h), the handle replaced: the weights a
 * bf16 push with serve_dtype fp8 leaves. */
static int requant_fp8(model *m)
{
    const model_config *c = &m->cfg;
    rd_backend *be = m->be;
    const arch_group gs[4] = {AG_QKV, AG_O, AG_GATE_UP, AG_DOWN};
    const int32_t q = c->n_heads * c->head_dim, kv = c->n_kv_heads * c->head_dim;
    const int32_t rows[4] = {q + 2 * kv, c->dim, 2 * c->ffn_dim, c->dim}, cols[4] = {c->dim, q, c->dim, c->ffn_dim};
    for (int32_t l = 0; l < c->n_layers; l++)
        for (int g = 0; g < 4; g++) {
            void **slot = model_weight_slot(m, gs[g], l, 0);
            if (!slot || !*slot || cols[g] % RD_FP8_BLOCK)
                continue;
            const size_t n = (size_t)rows[g] * cols[g];
            float *w = malloc(sizeof(float) * n);
            uint8_t *blk = malloc(n / RD_FP8_BLOCK * RD_FP8_BYTES);
            void *h = NULL;
            int rc = w && blk ? be->ops->linear_read(be, *slot, w) : RD_ENOMEM;
            if (!rc)
                rc = rd_fp8_quant(w, n, blk);
            rd_wpart part = {.type = RD_TYPE_FP8_B32, .rows = rows[g], .data = blk};
            if (!rc)
                rc = be->ops->linear_load_q(be, &part, 1, cols[g], &h);
            free(w), free(blk);
            if (rc)
                return rc == RD_ENOMEM ? rd_fail(rc, "--weights fp8: out of memory") : rc;
            be->ops->linear_free(be, *slot);
            *slot = h;
        }
    m->weights_gen++;
    return 0;
}

/* --kv and --weights on a loaded model (before any runner). */
static int apply_dtypes(const opts *o, rd_loaded *l)
{
    int rc = o->kv ? rd_backend_set_kv_dtype(l->be, o->kv) : 0;
    if (!rc && o->weights && strcmp(o->weights, "fp8"))
        rc = rd_fail(RD_EINVAL, "--weights expects fp8, not '%s'", o->weights);
    if (!rc && o->weights)
        rc = requant_fp8(l->m);
    return rc;
}

static int load_plain(const opts *o, const char *backend, rd_loaded *l)
{
    memset(l, 0, sizeof *l);
    if (!o->synthetic)
        return rd_load(o->model, backend, o->threads, l);
    model_config cfg;
    if (synth_config(o->synthetic, &cfg))
        return rd_fail(RD_EINVAL, "--synthetic expects " SYNTH_NAMES ", not '%s'", o->synthetic);
    int rc = rd_backend_create(backend, o->threads, &l->be);
    if (rc)
        return rc;
    synth_ctx sc = {12345};
    if ((rc = model_build(&cfg, l->be, synth_fetch, &sc, &l->m))) {
        rd_backend_destroy(l->be);
        l->be = NULL;
    }
    return rc;
}

/* --model PATH, or with --synthetic NAME that shape with random weights (no
 * tokenizer: prompts are random ids); --kv and --weights apply to the tested
 * backend's load (tested 1), never to parity's CPU reference. */
static int load_any(const opts *o, const char *backend, int tested, rd_loaded *l)
{
    int rc = load_plain(o, backend, l);
    if (!rc && tested && (rc = apply_dtypes(o, l)))
        rd_unload(l);
    return rc;
}

static int make_prompts(const rd_loaded *l, int32_t n, prompt_t *out)
{
    uint64_t s = 7;
    for (int32_t i = 0; i < n; i++) {
        const char *txt = PROMPTS[i % 8];
        if (l->tok) {
            int32_t *ids;
            size_t ni;
            if (tok_encode(l->tok, txt, strlen(txt), 0, &ids, &ni))
                return -1;
            out[i].ids = ids;
            out[i].n = (int32_t)ni;
        } else {
            /* Random ids; with a sliding window, every other prompt is longer
             * than it so the windowed attention path runs. */
            int32_t w = l->m->cfg.sliding_window;
            out[i].n = w > 0 && i % 2 ? w + 88 + 8 * i : 8 + i;
            out[i].ids = malloc(sizeof(int32_t) * out[i].n);
            for (int32_t j = 0; j < out[i].n; j++)
                out[i].ids[j] = (int32_t)(mix(&s) % (uint64_t)l->m->cfg.vocab);
        }
    }
    return 0;
}

/* Runs requests through a fresh engine until done; results indexed by tag. */
static int run_engine(model *m, const eng_request *reqs, int32_t n, eng_result *res)
{
    eng_config cfg = eng_default_config();
    cfg.max_num_seqs = 64;
    cfg.max_batch_tokens = 512;
    cfg.kv_cache_bytes = (int64_t)256 << 20;
    engine *e;
    int rc = eng_create(m, &cfg, &e);
    if (rc)
        return rc;
    for (int32_t i = 0; i < n && !rc; i++) {
        int64_t id;
        rc = eng_add(e, &reqs[i], &id);
    }
    int32_t got = 0;
    while (!rc && eng_busy(e)) {
        int st = eng_step(e);
        if (st < 0)
            rc = st;
        eng_result r;
        while (eng_collect(e, &r, 1) == 1) {
            if (r.tag < (uint64_t)n && got < n) {
                res[r.tag] = r;
                got++;
            } else {
                eng_result_free(&r);
            }
        }
    }
    eng_destroy(e);
    if (!rc && got != n)
        rc = rd_fail(RD_EINVAL, "engine returned %d of %d results", got, n);
    return rc;
}

static eng_request greedy_req(const prompt_t *p, int32_t max_tokens, uint64_t tag, int topk)
{
    eng_request r;
    memset(&r, 0, sizeof r);
    r.prompt = p->ids;
    r.n_prompt = p->n;
    r.n = 1;
    r.max_tokens = max_tokens;
    r.sp = samp_default();
    r.sp.temperature = 0.0f;
    r.sp.logprobs_topk = topk;
    r.ignore_eos = 1;
    r.tag = tag;
    return r;
}

/* How far a run follows the reference: per prompt, the tokens equal before
 * the first divergence (a near tie: the reference's two best within 2*tol
 * nats and the other run took the second) and the chosen tokens' |dlogprob|
 * over them. */
typedef struct {
    int32_t equal_prompts, near_ties, hard, compared, over;
    double max_d, sum_d;
} parity_stats;

static void compare_runs(const opts *o, const char *name, const eng_result *ref, const eng_result *got, int32_t N,
                         cJSON *arr, parity_stats *st)
{
    memset(st, 0, sizeof *st);
    for (int32_t i = 0; i < N; i++) {
        const eng_result *a = &ref[i], *b = &got[i];
        int32_t n = a->n_tokens < b->n_tokens ? a->n_tokens : b->n_tokens, j = 0;
        double pmax = 0;
        for (; j < n && a->token_ids[j] == b->token_ids[j]; j++) {
            double d = fabs((double)a->logprobs[j] - b->logprobs[j]);
            pmax = d > pmax ? d : pmax;
            st->sum_d += d;
            st->over += d > o->tol;
            st->compared++;
        }
        st->max_d = pmax > st->max_d ? pmax : st->max_d;
        const char *status = "equal";
        double gap = NAN;
        if (j < n || a->n_tokens != b->n_tokens) {
            if (j < n && a->n_top >= 2) {
                gap = (double)a->top_logprobs[(size_t)j * a->n_top] - a->top_logprobs[(size_t)j * a->n_top + 1];
                if (b->token_ids[j] == a->top_ids[(size_t)j * a->n_top + 1] && gap <= 2 * o->tol) {
                    status = "near-tie";
                    st->near_ties++;
                } else {
                    status = "MISMATCH";
                    st->hard++;
                }
            } else {
                status = "MISMATCH";
                st->hard++;
            }
        } else {
            st->equal_prompts++;
        }
        printf("%sprompt %d: %-8s %d/%d tokens equal, max |dlogprob| %.4f\n", name, i, status, j, n, pmax);
        if (!isnan(gap))
            printf("          at token %d: cpu %d, %s %d; cpu top-2 gap %.4f nats\n", j, a->token_ids[j], name,
                   b->token_ids[j], gap);
        if (!arr)
            continue;
        cJSON *p = cJSON_CreateObject();
        cJSON_AddStringToObject(p, "status", status);
        cJSON_AddNumberToObject(p, "equal_tokens", j);
        cJSON_AddNumberToObject(p, "tokens", n);
        cJSON_AddNumberToObject(p, "max_dlogprob", pmax);
        if (!isnan(gap))
            cJSON_AddNumberToObject(p, "cpu_top2_gap", gap);
        cJSON_AddItemToArray(arr, p);
    }
}

static int cmd_parity(const opts *o)
{
    rd_loaded lc, lg, ln = {0};
    const char *ref_kv = o->ref_kv ? o->ref_kv : strcmp(o->backend, "cpu") ? "bf16" : NULL;
    if (load_any(o, "cpu", 0, &lc))
        return setup_fail("load (cpu)");
    if (ref_kv && rd_backend_set_kv_dtype(lc.be, ref_kv)) {
        rd_unload(&lc);
        return setup_fail("--ref-kv");
    }
    if (load_any(o, o->backend, 1, &lg)) {
        rd_unload(&lc);
        return setup_fail("load");
    }
    /* --noise-kv: the CPU again with only its cache's dtype changed, the
     * noise floor the tested backend is held to instead of tol */
    if (o->noise_kv && (load_any(o, "cpu", 0, &ln) || rd_backend_set_kv_dtype(ln.be, o->noise_kv))) {
        rd_unload(&lc);
        rd_unload(&lg);
        rd_unload(&ln);
        return setup_fail("--noise-kv");
    }
    const int32_t N = o->prompts > 8 ? 8 : o->prompts, T = o->tokens;
    prompt_t pr[8];
    eng_request rq[8];
    eng_result rcpu[8], rg[8], rn[8];
    memset(rcpu, 0, sizeof rcpu);
    memset(rg, 0, sizeof rg);
    memset(rn, 0, sizeof rn);
    if (make_prompts(&lc, N, pr))
        return setup_fail("tokenize");
    for (int32_t i = 0; i < N; i++)
        rq[i] = greedy_req(&pr[i], T, (uint64_t)i, 2);
    double t0 = clock_now_s();
    int rc = run_engine(lc.m, rq, N, rcpu);
    double t1 = clock_now_s();
    if (!rc)
        rc = run_engine(lg.m, rq, N, rg);
    double t2 = clock_now_s();
    if (!rc && o->noise_kv)
        rc = run_engine(ln.m, rq, N, rn);
    if (rc) {
        rd_unload(&lc);
        rd_unload(&lg);
        rd_unload(&ln);
        return setup_fail("engine run");
    }
    cJSON *doc = cJSON_CreateObject(), *arr = cJSON_AddArrayToObject(doc, "prompts");
    parity_stats g, nf;
    compare_runs(o, o->backend, rcpu, rg, N, arr, &g);
    const double g_mean = g.compared ? g.sum_d / g.compared : 0.0;
    int pass = g.hard == 0 && g.max_d <= o->tol;
    char crit[160];
    snprintf(crit, sizeof crit, "tol %.3g", o->tol);
    if (o->noise_kv) {
        char name[48];
        snprintf(name, sizeof name, "cpu kv %s: ", o->noise_kv);
        compare_runs(o, name, rcpu, rn, N, NULL, &nf);
        /* Held to the floor: it follows the reference at least as many tokens
         * as the CPU does with only its cache's dtype changed. */
        pass = g.compared >= nf.compared;
        snprintf(crit, sizeof crit, "noise floor: the cpu with kv %s follows %d tokens, |dlogprob| max %.4f mean %.5f",
                 o->noise_kv, nf.compared, nf.max_d, nf.compared ? nf.sum_d / nf.compared : 0.0);
        cJSON *f = cJSON_AddObjectToObject(doc, "noise_floor");
        cJSON_AddStringToObject(f, "kv_dtype", o->noise_kv);
        cJSON_AddNumberToObject(f, "tokens_compared", nf.compared);
        cJSON_AddNumberToObject(f, "equal_prompts", nf.equal_prompts);
        cJSON_AddNumberToObject(f, "max_dlogprob", nf.max_d);
        cJSON_AddNumberToObject(f, "mean_dlogprob", nf.compared ? nf.sum_d / nf.compared : 0.0);
    }
    printf("parity %s: %d/%d prompts equal, %d near-tie divergences, %d mismatches; chosen-token log-prob "
           "|diff| max %.4f mean %.5f over %d tokens (%d over %.3g); cpu %.1fs (kv %s), %s %.1fs; %s\n",
           pass ? "PASS" : "FAIL", g.equal_prompts, N, g.near_ties, g.hard, g.max_d, g_mean, g.compared, g.over, o->tol,
           t1 - t0, ref_kv ? ref_kv : "f32", o->backend, t2 - t1, crit);
    printf("TABLE|parity%s|%d/%d prompts equal, %d near ties, %d tokens followed, max dlogprob %.4f (%s)|%s|\n",
           o->label ? o->label : "", g.equal_prompts, N, g.near_ties, g.compared, g.max_d,
           o->noise_kv ? "vs the noise floor" : crit, pass ? "PASS" : "FAIL");
    cJSON_AddBoolToObject(doc, "pass", pass);
    cJSON_AddNumberToObject(doc, "tol", o->tol);
    cJSON_AddStringToObject(doc, "cpu_kv_dtype", ref_kv ? ref_kv : "f32");
    cJSON_AddNumberToObject(doc, "equal_prompts", g.equal_prompts);
    cJSON_AddNumberToObject(doc, "near_ties", g.near_ties);
    cJSON_AddNumberToObject(doc, "mismatches", g.hard);
    cJSON_AddNumberToObject(doc, "max_dlogprob", g.max_d);
    cJSON_AddNumberToObject(doc, "mean_dlogprob", g_mean);
    cJSON_AddNumberToObject(doc, "tokens_compared", g.compared);
    cJSON_AddNumberToObject(doc, "tokens_over_tol", g.over);
    for (int32_t i = 0; i < N; i++) {
        eng_result_free(&rcpu[i]);
        eng_result_free(&rg[i]);
        eng_result_free(&rn[i]);
        free(pr[i].ids);
    }
    rd_unload(&lc);
    rd_unload(&lg);
    rd_unload(&ln);
    int wj = write_json(o, doc);
    return pass ? wj : 1;
}

static int same_result(const eng_result *a, const eng_result *b)
{
    return a->n_tokens == b->n_tokens && !memcmp(a->token_ids, b->token_ids, sizeof(int32_t) * a->n_tokens) &&
           !memcmp(a->logprobs, b->logprobs, sizeof(float) * a->n_tokens);
}

static int cmd_invariance(const opts *o)
{
    rd_loaded l;
    if (load_any(o, o->backend, 1, &l))
        return setup_fail("load");
    const int32_t N = 8, F = 40, T = o->tokens;
    prompt_t pr[8], fill[40];
    if (make_prompts(&l, N, pr))
        return setup_fail("tokenize");
    uint64_t s = 99;
    for (int32_t i = 0; i < F; i++) {
        fill[i].n = 5 + (int32_t)(mix(&s) % 300);
        fill[i].ids = malloc(sizeof(int32_t) * fill[i].n);
        for (int32_t j = 0; j < fill[i].n; j++)
            fill[i].ids[j] = (int32_t)(mix(&s) % (uint64_t)l.m->cfg.vocab);
    }
    eng_request rq[48];
    for (int32_t i = 0; i < N + F; i++) {
        rq[i] = greedy_req(i < N ? &pr[i] : &fill[i - N], i < N ? T : 4 + (int32_t)(mix(&s) % 40), (uint64_t)i, 0);
        rq[i].sp.temperature = 0.8f;
        rq[i].sp.top_p = 0.95f;
        rq[i].sp.seed = 1000 + (uint64_t)i;
    }
    eng_result alone[8], mixed[48], nograph[8];
    memset(alone, 0, sizeof alone), memset(mixed, 0, sizeof mixed), memset(nograph, 0, sizeof nograph);
    int rc = 0;
    double t0 = clock_now_s();
    for (int32_t i = 0; i < N && !rc; i++) {
        eng_request one = rq[i];
        one.tag = 0;
        rc = run_engine(l.m, &one, 1, &alone[i]);
    }
    if (!rc)
        rc = run_engine(l.m, rq, N + F, mixed);
    if (!rc) {
        setenv("RD_GRAPHS", "0", 1);
        rc = run_engine(l.m, rq, N, nograph);
        unsetenv("RD_GRAPHS");
    }
    double t1 = clock_now_s();
    if (rc) {
        rd_unload(&l);
        return setup_fail("engine run");
    }
    int32_t eq_mixed = 0, eq_nograph = 0;
    for (int32_t i = 0; i < N; i++) {
        int a = same_result(&alone[i], &mixed[i]), b = same_result(&alone[i], &nograph[i]);
        eq_mixed += a;
        eq_nograph += b;
        if (!a || !b)
            printf("prompt %d: alone vs batched %s, alone vs no graphs %s\n", i, a ? "equal" : "DIFFER",
                   b ? "equal" : "DIFFER");
    }
    const int pass = eq_mixed == N && eq_nograph == N;
    printf("batch invariance %s: %d/%d rollouts bit-identical alone vs among %d requests, %d/%d with graphs off "
           "(%.1fs)\n", pass ? "PASS" : "FAIL", eq_mixed, N, N + F, eq_nograph, N, t1 - t0);
    printf("TABLE|batch invariance|%d/%d bit-identical in a batch of %d, %d/%d without graphs|%s|\n", eq_mixed, N,
           N + F, eq_nograph, N, pass ? "PASS" : "FAIL");
    cJSON *doc = cJSON_CreateObject();
    cJSON_AddBoolToObject(doc, "pass", pass);
    cJSON_AddNumberToObject(doc, "equal_batched", eq_mixed);
    cJSON_AddNumberToObject(doc, "equal_nographs", eq_nograph);
    cJSON_AddNumberToObject(doc, "requests", N);
    for (int32_t i = 0; i < N + F; i++) {
        if (i < N) {
            eng_result_free(&alone[i]);
            eng_result_free(&nograph[i]);
            free(pr[i].ids);
        } else {
            free(fill[i - N].ids);
        }
        eng_result_free(&mixed[i]);
    }
    rd_unload(&l);
    int wj = write_json(o, doc);
    return pass ? wj : 1;
}

/* ------------------------------------------------------------------ runner-level helpers */

typedef struct {
    int32_t B, bps, bs;         /* sequences, blocks per sequence, block size */
    int32_t *ctx;               /* [B] tokens in cache */
    int32_t *next;              /* [B] next input token */
    int32_t *tok, *pos, *slot, *rows, *qs, *ctxl, *tab;
} batch_t;

static int batch_init(batch_t *b, int32_t B, int32_t bps, int32_t bs, int32_t max_rows)
{
    memset(b, 0, sizeof *b);
    b->B = B, b->bps = bps, b->bs = bs;
    int32_t R = max_rows > B ? max_rows : B;
    b->ctx = calloc(B, sizeof(int32_t));
    b->next = calloc(B, sizeof(int32_t));
    b->tok = malloc(sizeof(int32_t) * R);
    b->pos = malloc(sizeof(int32_t) * R);
    b->slot = malloc(sizeof(int32_t) * R);
    b->rows = malloc(sizeof(int32_t) * R);
    b->qs = malloc(sizeof(int32_t) * (B + 1));
    b->ctxl = malloc(sizeof(int32_t) * B);
    b->tab = malloc(sizeof(int32_t) * (size_t)B * bps);
    return b->ctx && b->next && b->tok && b->pos && b->slot && b->rows && b->qs && b->ctxl && b->tab ? 0 : -1;
}

static void batch_free(batch_t *b)
{
    free(b->ctx), free(b->next), free(b->tok), free(b->pos), free(b->slot), free(b->rows), free(b->qs),
        free(b->ctxl), free(b->tab);
}

/* Prefills sequences [s0, s1) with prompts of len tokens each in one step. */
static int prefill_step(runner *r, batch_t *b, int32_t s0, int32_t s1, int32_t len, uint64_t *rng, float *logits)
{
    int32_t m = 0, ns = s1 - s0;
    for (int32_t s = s0; s < s1; s++) {
        b->qs[s - s0] = m;
        for (int32_t p = 0; p < len; p++, m++) {
            b->tok[m] = (int32_t)(mix(rng) % (uint64_t)r->m->cfg.vocab);
            b->pos[m] = p;
            b->slot[m] = (s * b->bps + p / b->bs) * b->bs + p % b->bs;
        }
        b->rows[s - s0] = m - 1;
        b->ctxl[s - s0] = len;
        b->ctx[s] = len;
        b->next[s] = (int32_t)(mix(rng) % (uint64_t)r->m->cfg.vocab);
        for (int32_t k = 0; k < b->bps; k++)
            b->tab[(s - s0) * b->bps + k] = s * b->bps + k;
    }
    b->qs[ns] = m;
    rd_step st = {m, ns, b->bps, b->tok, b->pos, b->slot, b->qs, b->ctxl, b->tab, NULL};
    return runner_forward(r, &st, b->rows, ns, logits);
}

/* One decode step for all B sequences: logits stay on the device. */
static int decode_step(runner *r, batch_t *b)
{
    for (int32_t s = 0; s < b->B; s++) {
        b->tok[s] = b->next[s];
        b->pos[s] = b->ctx[s];
        b->slot[s] = (s * b->bps + b->ctx[s] / b->bs) * b->bs + b->ctx[s] % b->bs;
        b->rows[s] = s;
        b->qs[s] = s;
        b->ctxl[s] = b->ctx[s] + 1;
        for (int32_t k = 0; k < b->bps; k++)
            b->tab[s * b->bps + k] = s * b->bps + k;
        b->ctx[s]++;
    }
    b->qs[b->B] = b->B;
    rd_step st = {b->B, b->B, b->bps, b->tok, b->pos, b->slot, b->qs, b->ctxl, b->tab, NULL};
    return runner_forward(r, &st, b->rows, b->B, NULL);
}

static int cmd_sampler(const opts *o)
{
    rd_loaded l;
    if (load_any(o, o->backend, 1, &l))
        return setup_fail("load");
    const int32_t B = 8, V = l.m->cfg.vocab, len = 24;
    runner r;
    batch_t b;
    float *logits = malloc(sizeof(float) * (size_t)B * V);
    void *scratch = malloc(samp_scratch_bytes(V));
    uint64_t rng = 5;
    if (!logits || !scratch || batch_init(&b, B, 4, 16, B * len) || runner_init(&r, l.m, B * 4 + 1, 16, B * len, B))
        return setup_fail("setup");
    int rc = prefill_step(&r, &b, 0, B, len, &rng, logits);
    if (rc)
        return setup_fail("prefill");
    struct {
        float t;
        int32_t k;
        float p, minp;
    } ps[] = {{0, 0, 1, 0},     {1, 0, 1, 0},    {0.7f, 0, 1, 0},   {1.2f, 0, 1, 0},  {1, 50, 1, 0},
              {1, 0, 0.9f, 0},  {0.8f, 40, 0.95f, 0}, {1, 0, 1, 0.05f}, {0.6f, 0, 0.5f, 0.1f}, {1, 1, 1, 0}};
    const int32_t NP = (int32_t)(sizeof ps / sizeof ps[0]), DRAWS = 64;
    int64_t total = 0, equal = 0;
    double max_dlp = 0;
    rd_sample_req *q = malloc(sizeof(rd_sample_req) * DRAWS);
    samp_result *got = malloc(sizeof(samp_result) * DRAWS);
    samp_params sp;
    double t_dev = 0;
    for (int32_t pi = 0; pi < NP && !rc; pi++) {
        sp = samp_default();
        sp.temperature = ps[pi].t;
        sp.top_k = ps[pi].k;
        sp.top_p = ps[pi].p;
        sp.min_p = ps[pi].minp;
        sp.seed = 777 + (uint64_t)pi;
        sp.logprobs_topk = 5;
        for (int32_t d = 0; d < DRAWS; d++)
            q[d] = (rd_sample_req){d % B, (uint32_t)(d / B), (uint32_t)(100 + d), &sp, NULL, 0, 0, 0};
        double t0 = clock_now_s();
        rc = runner_sample(&r, q, DRAWS, got);
        t_dev += clock_now_s() - t0;
        for (int32_t d = 0; d < DRAWS && !rc; d++) {
            samp_result want;
            if (samp_sample(&sp, logits + (size_t)q[d].row * V, V, q[d].sample_idx, q[d].pos, scratch, &want)) {
                rc = -1;
                break;
            }
            total++;
            equal += want.token == got[d].token;
            int top_ok = want.n_top == got[d].n_top;
            for (int32_t j = 0; top_ok && j < want.n_top; j++)
                top_ok = want.top_ids[j] == got[d].top_ids[j];
            equal -= want.token == got[d].token && !top_ok;
            double dl = fabs((double)want.logprob - got[d].logprob);
            max_dlp = dl > max_dlp ? dl : max_dlp;
        }
    }
    runner_free(&r);
    batch_free(&b);
    free(logits), free(scratch), free(q), free(got);
    rd_unload(&l);
    if (rc)
        return setup_fail("sampling");
    const int pass = equal == total && max_dlp < 1e-4;
    printf("device sampler %s: %lld/%lld draws pick the CPU sampler's token (and alternatives), max |dlogprob| "
           "%.2g; %.2f ms per call of %d draws\n", pass ? "PASS" : "FAIL", (long long)equal, (long long)total,
           max_dlp, t_dev / NP * 1e3, DRAWS);
    printf("TABLE|device sampler|%lld/%lld draws equal to samp_sample, %.2f ms per %d draws|%s|\n", (long long)equal,
           (long long)total, t_dev / NP * 1e3, DRAWS, pass ? "PASS" : "FAIL");
    cJSON *doc = cJSON_CreateObject();
    cJSON_AddBoolToObject(doc, "pass", pass);
    cJSON_AddNumberToObject(doc, "draws", (double)total);
    cJSON_AddNumberToObject(doc, "equal", (double)equal);
    cJSON_AddNumberToObject(doc, "max_dlogprob", max_dlp);
    cJSON_AddNumberToObject(doc, "ms_per_call", t_dev / NP * 1e3);
    int wj = write_json(o, doc);
    return pass ? wj : 1;
}

/* ------------------------------------------------------------------ decode benchmark */

static int cmd_bench(const opts *o)
{
    rd_loaded l;
    memset(&l, 0, sizeof l);
    model *m = NULL;
    const char *name;
    double t_load0 = clock_now_s();
    if (load_any(o, o->backend, 1, &l))
        return setup_fail(o->synthetic ? "building the synthetic model" : "load");
    name = o->synthetic ? o->synthetic : base_name(o->model);
    m = l.m;
    double t_load = clock_now_s() - t_load0;
    const model_config *c = &m->cfg;
    rd_backend *be = l.be;
    double bw = o->bw;
    if (!(bw > 0) && copy_bw(be, o->mib, o->iters, &bw))
        bw = 0;
    /* Weights as stored: bf16 on the device (fp32 panels on the CPU), FP8 blocks with --weights fp8 (33 bytes
     * per 32); the LM head's table bf16 (fp32 on the CPU, or with RD_CUDA_HEAD=fp32). */
    const double elem = !strcmp(be->ops->name, "cpu") ? 4.0 : 2.0, w_elem = o->weights ? 33.0 / 32.0 : elem;
    const char *head = getenv("RD_CUDA_HEAD");
    const double head_elem = head && !strcmp(head, "fp32") ? 4.0 : elem;
    const int64_t hd = c->head_dim;
    const int64_t per_layer = ((int64_t)(c->n_heads + 2 * c->n_kv_heads) * hd * c->dim + (int64_t)c->dim * c->n_heads * hd +
                               2 * (int64_t)c->ffn_dim * c->dim + (int64_t)c->dim * c->ffn_dim);
    const double weight_bytes = (double)per_layer * c->n_layers * w_elem + (double)c->vocab * c->dim * head_elem;
    const double kv_per_token =
        (double)c->n_layers * 2 * (double)rd_backend_kv_block_bytes(be, c->n_kv_heads, 1, (int32_t)hd);
    char desc[4096] = "";
    if (be->ops->describe)
        be->ops->describe(be, desc, sizeof desc);
    printf("model %s: %.3g B params, weights read per step %.3f GB, KV %.1f KiB/token; load %.1fs; copy bandwidth "
           "%.1f GB/s\n%s\n", name, m->n_params / 1e9, weight_bytes / 1e9, kv_per_token / 1024, t_load, bw, desc);
    cJSON *doc = cJSON_CreateObject(), *arr = cJSON_AddArrayToObject(doc, "batches");
    cJSON_AddStringToObject(doc, "model", name);
    cJSON_AddStringToObject(doc, "backend", be->ops->name);
    cJSON_AddStringToObject(doc, "describe", desc);
    cJSON_AddNumberToObject(doc, "params", (double)m->n_params);
    cJSON_AddNumberToObject(doc, "weight_bytes_per_step", weight_bytes);
    cJSON_AddNumberToObject(doc, "kv_bytes_per_token", kv_per_token);
    cJSON_AddNumberToObject(doc, "copy_gbps", bw);
    cJSON_AddNumberToObject(doc, "prompt", o->prompt_len);
    cJSON_AddNumberToObject(doc, "steps", o->steps);
    int rc = 0;
    for (int32_t bi = 0; bi < o->n_batches && !rc; bi++) {
        const int32_t B = o->batches[bi], bs = 16, Pl = o->prompt_len, T = o->steps, warm = 3;
        const int32_t bps = (Pl + T + warm + bs) / bs + 1;
        const int32_t chunk_seqs = 512 / Pl > 0 ? 512 / Pl : 1, max_rows = (B < chunk_seqs ? B : chunk_seqs) * Pl;
        runner r;
        batch_t b;
        uint64_t rng = 42 + (uint64_t)B;
        int rrc = runner_init(&r, m, B * bps + 1, bs, max_rows > B ? max_rows : B, B);
        if (rrc) {
            printf("batch %d: %s\n", B, rd_errmsg());
            printf("TABLE|decode %s|batch %d|setup failed: %s|\n", name, B, rd_errmsg());
            continue;
        }
        if (batch_init(&b, B, bps, bs, max_rows > B ? max_rows : B)) {
            runner_free(&r);
            rc = setup_fail("batch buffers");
            break;
        }
        double tp0 = clock_now_s();
        for (int32_t s0 = 0; s0 < B && !rrc; s0 += chunk_seqs)
            rrc = prefill_step(&r, &b, s0, s0 + chunk_seqs < B ? s0 + chunk_seqs : B, Pl, &rng, NULL);
        double t_prefill = clock_now_s() - tp0;
        samp_params sp = samp_default();
        sp.temperature = 0.0f;
        rd_sample_req *q = malloc(sizeof(rd_sample_req) * B);
        samp_result *res = malloc(sizeof(samp_result) * B);
        for (int32_t s = 0; s < B; s++)
            q[s] = (rd_sample_req){s, 0, 0, &sp, NULL, 0, 0, 0};
        double t_steps = 0, t_sample = 0, kv_read = 0;
        for (int32_t it = 0; it < warm + T && !rrc; it++) {
            double ctx_sum = 0;
            for (int32_t s = 0; s < B; s++)
                ctx_sum += b.ctx[s] + 1;
            double t0 = clock_now_s();
            rrc = decode_step(&r, &b);
            double t1 = clock_now_s();
            if (!rrc)
                rrc = runner_sample(&r, q, B, res);
            double t2 = clock_now_s();
            for (int32_t s = 0; s < B && !rrc; s++)
                b.next[s] = res[s].token >= 0 ? res[s].token : 0;
            if (it >= warm) {
                t_steps += t2 - t0;
                t_sample += t2 - t1;
                kv_read += ctx_sum * kv_per_token;
            }
        }
        free(q);
        free(res);
        if (rrc) {
            printf("batch %d: %s\n", B, rd_errmsg());
            printf("TABLE|decode %s|batch %d|failed: %s|\n", name, B, rd_errmsg());
            rc = 1;
        } else {
            const double step = t_steps / T, bytes = weight_bytes + kv_read / T;
            const double roof = bw > 0 ? bytes / (bw * 1e9) : NAN;
            const double tps = B / step;
            printf("batch %4d: %9.1f tokens/s, step %7.3f ms (sample %.3f ms), roofline %7.3f ms (%.2f GB/step): "
                   "%.2fx; prefill %d x %d in %.2fs; graphs %lld replayed, %lld captured\n",
                   B, tps, step * 1e3, t_sample / T * 1e3, roof * 1e3, bytes / 1e9, step / roof, B, Pl, t_prefill,
                   (long long)r.graph_replays, (long long)r.graph_captures);
            printf("TABLE|decode %s%s|batch %d|%.0f tok/s, %.3f ms/step, %.2fx roofline (%.3f ms)|\n", name,
                   o->label ? o->label : "", B, tps, step * 1e3, step / roof, roof * 1e3);
            cJSON *e = cJSON_CreateObject();
            cJSON_AddNumberToObject(e, "batch", B);
            cJSON_AddNumberToObject(e, "tokens_per_s", tps);
            cJSON_AddNumberToObject(e, "step_ms", step * 1e3);
            cJSON_AddNumberToObject(e, "sample_ms", t_sample / T * 1e3);
            cJSON_AddNumberToObject(e, "bytes_per_step", bytes);
            cJSON_AddNumberToObject(e, "roofline_ms", roof * 1e3);
            cJSON_AddNumberToObject(e, "x_roofline", step / roof);
            cJSON_AddNumberToObject(e, "prefill_s", t_prefill);
            cJSON_AddNumberToObject(e, "graph_replays", (double)r.graph_replays);
            cJSON_AddItemToArray(arr, e);
        }
        batch_free(&b);
        runner_free(&r);
    }
    rd_unload(&l);
    int wj = write_json(o, doc);
    return rc ? rc : wj;
}

/* ------------------------------------------------------------------ engine throughput */

typedef struct {
    double tokens_per_s, step_ms;
    int64_t tokens, steps;
    int device_sampling;
} engine_run;

/* B greedy requests of T tokens; decode timed once every request has its first token. */
static int engine_decode(model *m, const prompt_t *pr, int32_t B, int32_t T, engine_run *out)
{
    eng_config cfg = eng_default_config();
    cfg.max_num_seqs = B;
    cfg.max_batch_tokens = B > 512 ? B : 512;
    int64_t ctx = 0;
    for (int32_t i = 0; i < B; i++)
        ctx += pr[i % 8].n + T + 16;
    cfg.kv_cache_bytes = ctx * model_kv_bytes_per_token(&m->cfg) / 4 * rd_backend_kv_elem_bytes(m->be) + (64 << 20);
    engine *e;
    int rc = eng_create(m, &cfg, &e);
    if (rc)
        return rc;
    for (int32_t i = 0; i < B && !rc; i++) {
        eng_request r = greedy_req(&pr[i % 8], T, (uint64_t)i, 0);
        int64_t id;
        rc = eng_add(e, &r, &id);
    }
    eng_stats st;
    double t0 = 0;
    int64_t tok0 = 0, steps = 0;
    eng_result res;
    while (!rc && eng_busy(e)) {
        int n = eng_step(e);
        if (n < 0)
            rc = n;
        while (eng_collect(e, &res, 1) == 1)
            eng_result_free(&res);
        if (t0 > 0) {
            steps++;
            continue;
        }
        eng_get_stats(e, &st); /* only until the timed part starts */
        if (st.generated_tokens >= B) {
            t0 = clock_now_s();
            tok0 = st.generated_tokens;
        }
    }
    double dt = clock_now_s() - t0;
    eng_get_stats(e, &st);
    eng_destroy(e);
    if (rc)
        return rc;
    out->tokens = st.generated_tokens - tok0;
    out->steps = steps;
    out->tokens_per_s = dt > 0 ? out->tokens / dt : 0;
    out->step_ms = steps > 0 ? dt / steps * 1e3 : 0;
    out->device_sampling = st.device_sampling;
    return 0;
}

static int cmd_engine(const opts *o)
{
    rd_loaded l;
    if (load_any(o, o->backend, 1, &l))
        return setup_fail("load");
    prompt_t pr[8];
    if (make_prompts(&l, 8, pr)) {
        rd_unload(&l);
        return setup_fail("tokenize");
    }
    const char *name = base_name(o->model);
    cJSON *doc = cJSON_CreateObject(), *arr = cJSON_AddArrayToObject(doc, "runs");
    cJSON_AddStringToObject(doc, "model", name);
    cJSON_AddStringToObject(doc, "backend", l.be->ops->name);
    cJSON_AddNumberToObject(doc, "tokens", o->tokens);
    int rc = 0;
    for (int32_t bi = 0; bi < o->n_batches && !rc; bi++) {
        const int32_t B = o->batches[bi];
        engine_run run[2];
        int n_runs = 1;
        rc = engine_decode(l.m, pr, B, o->tokens, &run[0]);
        if (!rc && run[0].device_sampling) { /* the same on the host, to price the device sampler */
            setenv("RD_HOST_SAMPLING", "1", 1);
            rc = engine_decode(l.m, pr, B, o->tokens, &run[1]);
            unsetenv("RD_HOST_SAMPLING");
            n_runs = 2;
        }
        if (rc) {
            printf("batch %d: %s\n", B, rd_errmsg());
            printf("TABLE|engine %s|batch %d|failed: %s|\n", name, B, rd_errmsg());
            break;
        }
        for (int k = 0; k < n_runs; k++) {
            const char *where = run[k].device_sampling ? "device" : "host";
            printf("batch %4d, %s sampling: %9.1f tokens/s, %.3f ms/step (%lld tokens, %lld steps)\n", B, where,
                   run[k].tokens_per_s, run[k].step_ms, (long long)run[k].tokens, (long long)run[k].steps);
            cJSON *e = cJSON_CreateObject();
            cJSON_AddNumberToObject(e, "batch", B);
            cJSON_AddStringToObject(e, "sampling", where);
            cJSON_AddNumberToObject(e, "tokens_per_s", run[k].tokens_per_s);
            cJSON_AddNumberToObject(e, "step_ms", run[k].step_ms);
            cJSON_AddNumberToObject(e, "tokens", (double)run[k].tokens);
            cJSON_AddItemToArray(arr, e);
        }
        if (n_runs == 2)
            printf("TABLE|engine %s%s|batch %d|%.0f tok/s (device sampling), %.0f tok/s (host sampling): %.2fx|\n",
                   name, o->label ? o->label : "", B, run[0].tokens_per_s, run[1].tokens_per_s,
                   run[1].tokens_per_s > 0 ? run[0].tokens_per_s / run[1].tokens_per_s : 0);
        else
            printf("TABLE|engine %s%s|batch %d|%.0f tok/s (host sampling)|\n", name, o->label ? o->label : "", B,
                   run[0].tokens_per_s);
    }
    for (int i = 0; i < 8; i++)
        free(pr[i].ids);
    rd_unload(&l);
    int wj = write_json(o, doc);
    return rc ? setup_fail("engine run") : wj;
}

/* ------------------------------------------------------------------ main */

static void usage(void)
{
    fprintf(stderr, "usage: %s info|copybw|parity|invariance|sampler|engine|bench [flags] (see the source header)\n", P);
    exit(2);
}

int main(int argc, char **argv)
{
    if (argc < 2)
        usage();
    const char *cmd = argv[1];
    opts o = {.backend = "cuda", .threads = 0, .prompts = 8, .tokens = 32, .prompt_len = 128, .steps = 32,
              .mib = 1024, .iters = 20, .tol = 0.05, .bw = 0};
    int32_t def_batches[] = {1, 8, 32, 128, 256};
    o.batches = def_batches;
    o.n_batches = 5;
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--backend")) o.backend = cli_value(P, argc, argv, &i);
        else if (!strcmp(a, "--model")) o.model = cli_value(P, argc, argv, &i);
        else if (!strcmp(a, "--synthetic")) o.synthetic = cli_value(P, argc, argv, &i);
        else if (!strcmp(a, "--json")) o.json = cli_value(P, argc, argv, &i);
        else if (!strcmp(a, "--label")) o.label = cli_value(P, argc, argv, &i);
        else if (!strcmp(a, "--weights")) o.weights = cli_value(P, argc, argv, &i);
        else if (!strcmp(a, "--kv")) o.kv = cli_value(P, argc, argv, &i);
        else if (!strcmp(a, "--ref-kv")) o.ref_kv = cli_value(P, argc, argv, &i);
        else if (!strcmp(a, "--noise-kv")) o.noise_kv = cli_value(P, argc, argv, &i);
        else if (!strcmp(a, "--threads")) o.threads = (int)cli_int(P, a, cli_value(P, argc, argv, &i), 0, 1024);
        else if (!strcmp(a, "--prompts")) o.prompts = (int32_t)cli_int(P, a, cli_value(P, argc, argv, &i), 1, 8);
        else if (!strcmp(a, "--tokens")) o.tokens = (int32_t)cli_int(P, a, cli_value(P, argc, argv, &i), 1, 4096);
        else if (!strcmp(a, "--prompt")) o.prompt_len = (int32_t)cli_int(P, a, cli_value(P, argc, argv, &i), 1, 4096);
        else if (!strcmp(a, "--steps")) o.steps = (int32_t)cli_int(P, a, cli_value(P, argc, argv, &i), 1, 100000);
        else if (!strcmp(a, "--mib")) o.mib = (int32_t)cli_int(P, a, cli_value(P, argc, argv, &i), 1, 65536);
        else if (!strcmp(a, "--iters")) o.iters = (int32_t)cli_int(P, a, cli_value(P, argc, argv, &i), 1, 100000);
        else if (!strcmp(a, "--tol")) o.tol = cli_float(P, a, cli_value(P, argc, argv, &i), 0, 100);
        else if (!strcmp(a, "--bw")) o.bw = cli_float(P, a, cli_value(P, argc, argv, &i), 0, 1e6);
        else if (!strcmp(a, "--batches")) o.batches = cli_ids(P, a, cli_value(P, argc, argv, &i), &o.n_batches);
        else {
            fprintf(stderr, "%s: unknown flag %s\n", P, a);
            usage();
        }
    }
    for (int32_t i = 0; i < o.n_batches; i++)
        if (o.batches[i] < 1 || o.batches[i] > 4096) {
            fprintf(stderr, "%s: --batches entries must be in 1..4096\n", P);
            return 2;
        }
    int need_model = !strcmp(cmd, "parity") || !strcmp(cmd, "invariance") || !strcmp(cmd, "sampler") ||
                     !strcmp(cmd, "engine") || !strcmp(cmd, "bench");
    if (need_model && !o.model && !o.synthetic) {
        fprintf(stderr, "%s %s: --model PATH or --synthetic NAME is required\n", P, cmd);
        return 2;
    }
    if (!strcmp(cmd, "info")) return cmd_info(&o);
    if (!strcmp(cmd, "copybw")) return cmd_copybw(&o);
    if (!strcmp(cmd, "parity")) return cmd_parity(&o);
    if (!strcmp(cmd, "invariance")) return cmd_invariance(&o);
    if (!strcmp(cmd, "sampler")) return cmd_sampler(&o);
    if (!strcmp(cmd, "engine")) return cmd_engine(&o);
    if (!strcmp(cmd, "bench")) return cmd_bench(&o);
    usage();
    return 2;
}
