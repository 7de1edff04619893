/* rollout-gpubench - the GPU checks and benchmarks that tests/gpu/run.sh runs.
 *
 *   rollout-gpubench info       [--backend cuda]
 *   rollout-gpubench copybw     [--mib 1024] [--iters 20]
 *   rollout-gpubench parity     MODEL [--prompts 8] [--tokens 32] [--tol 0.05]
 *   rollout-gpubench invariance MODEL [--tokens 32]
 *   rollout-gpubench tis        MODEL --weights fp8|q8_0 [--prompts 8] [--tokens 32]
 *   rollout-gpubench sampler    MODEL
 *   rollout-gpubench engine     MODEL [--batches 1,32] [--tokens 128]
 *   rollout-gpubench bench      MODEL [--batches 1,8,32,128,256]
 *                               [--prompt 128] [--steps 32] [--bw GBPS] [--label NAME] [--kv-fill]
 *   rollout-gpubench gemm       [--synthetic 1b[,qwen3-1.7b,...]] [--shapes OUTxIN,...]
 *                               [--rows 1,8,32,128,256,512] [--variants default,tc,...]
 *                               [--reps N] [--flush-mib 256] [--bw GBPS] [--peak-tflops T]
 *   rollout-gpubench attn       [--synthetic 1b,qwen3-1.7b] [--shapes NH/NKVxHD,...]
 *                               [--ctx 8192,32768] [--batches 1,8] [--reps N] [--flush-mib 256]
 *                               [--bw GBPS]
 *   rollout-gpubench moe        [--synthetic qwen3-30b-a3b] [--rows 1,8,64,256,512]
 *                               [--variants default,moetc,q8tc,q8tc+moetc] [--reps N] [--bw GBPS]
 * MODEL: --model PATH, or --synthetic 1b|qwen3-1.7b|qwen3-0.6b|qwen3-8b|
 * qwen3-30b-a3b|gemma3-270m|tiny|moe-tiny, that shape with random weights
 * built in memory (no tokenizer: prompts are random ids, half of them longer
 * than a sliding window where there is one); --layers N cuts it to N layers
 * (qwen3-30b-a3b: 8 of its 48 unless given), and rooflines count the layers
 * built.
 * Common flags: --backend NAME (default cuda), --json FILE, --threads N (CPU),
 * --weights fp8|q8_0 (the layers' dense linears re-quantized to FP8 or Q8_0
 * blocks after loading, as serve_dtype fp8 / q8_0 holds them; the CUDA
 * backend keeps Q8_0 as Q8_0 under RD_CUDA_Q8=tc, else as bf16), --kv fp8
 * (kv_dtype fp8). gemm, moe and bench write --json after each variant or
 * batch too ("complete": false until the end), so a run that a timeout or a
 * fault ends keeps what it measured before.
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
 * tis: the importance-sampling mismatch (mean K3 KL, |dlogprob|) of the
 *   --weights/--kv load against the plain load on the same backend, on
 *   tokens the plain load sampled (temperature 1), both scored by teacher
 *   forcing (cmd_tis).
 * sampler: the device sampler (runner_sample) against samp_sample on the
 *   same real logits, over temperatures, top-k, top-p, min-p and seeds; per
 *   rule the time of a call of 64 draws and (the median of 15) of one, whose
 *   result must equal the same request's among the 64.
 * engine: decode tokens/s through the whole engine (scheduler, block tables,
 *   CUDA graphs, sampling) for --batches greedy requests of --tokens tokens,
 *   timed from the step after every request has its first token; once with
 *   device sampling and once with RD_HOST_SAMPLING=1, side by side.
 * bench: decode tokens/s at each batch size (prompt tokens prefilled, then
 *   --steps timed decode steps, each a forward pass plus greedy device
 *   sampling, the sampler queued behind the forward as the engine does;
 *   RD_FORWARD_SYNC=1 waits between them), against the memory roofline: bytes a step must read (weights
 *   as the backend stores them + the live KV cache) / copy bandwidth. An MoE
 *   model's counts the attention, norms, routers and head, and per layer
 *   min(n_experts, batch x k) experts (an upper bound of the distinct experts
 *   a step reaches), and beside it the roofline of the distinct experts the
 *   routes of each step did reach. --kv-fill writes each prompt's K/V
 *   directly instead of prefilling it (long contexts: --prompt 8192).
 * gemm: the backend's linear op (linear_load, then linear) per weight shape
 *   (a synthetic model's q|k|v, o, gate|up, down, or --shapes), row count and
 *   variant, each variant a fresh backend created after setting its
 *   environment: default (as started), tc (RD_CUDA_GEMM=tc), simple
 *   (RD_CUDA_GEMM=simple), bf16act (RD_CUDA_ACT=bf16), mixed (RD_CUDA_ACT=
 *   mixed), fp8 (weights as FP8 blocks, linear_load_q), fp8tc (fp8 and
 *   RD_CUDA_FP8=tc), w8a8 (fp8 and RD_CUDA_FP8=w8a8), q8tc (weights as
 *   Q8_0 blocks and RD_CUDA_Q8=tc), q8w8a8 (Q8_0 blocks and RD_CUDA_Q8=
 *   w8a8), tcbf16 (tc and bf16act), or VAR=value; joined by '+'.
 *   The input is an RMSNorm's output (its bf16 copy read, as in a step).
 *   The timed calls take copies of the weight in turn, enough to exceed
 *   --flush-mib MiB (default 256; an H100's L2 holds 50 MB), so each reads
 *   it from DRAM as a decode step does (attn the same with its K/V caches).
 *   Where the backend has graphs the time is per call inside a graph of
 *   calls (a decode step is one: no launch gaps); launched one by one too
 *   (us_stream). The graph's output is checked for invariance as well.
 *   Per point: microseconds per call (warm-up, then --reps calls, default
 *   enough for ~10 ms, between syncs), the weight's bytes as held / time
 *   against the copy bandwidth, 2 x rows x out x in / time against
 *   --peak-tflops (default 989 on an H100 or H200, dense bf16). Batch
 *   invariance: every m-row result must equal, bit for bit, the same rows
 *   computed alone (m = 1 calls); exit 1 if not (RD_GPUBENCH_FAULT=
 *   invariance flips a bit, to test the check).
 * attn: the attention op alone at long context: --batches sequences (default
 *   1, 8) of --ctx tokens each (K/V filled by kv_write), one decode row per
 *   sequence, for a model's head shape (default the 1B's 32/8 x 64 and
 *   Qwen3-1.7B's 16/8 x 128): time per call and the KV bytes read / time
 *   against the copy bandwidth (issue 48's target: >= 0.70). Points that do
 *   not fit the free memory are skipped.
 * moe: the experts op (moe_ffn) alone, one layer of a MoE shape (default
 *   Qwen3-30B-A3B's 128 experts of 768 x 2048, top 8; the experts' weights
 *   4 random sets loaded round-robin), per --rows and variant (as gemm's;
 *   moetc is RD_CUDA_MOE=tc, the experts on tensor cores): time per call
 *   inside a graph of calls that take 16 random route sets in turn, the
 *   bytes of the experts a call's routes touch / time against the copy
 *   bandwidth, 6 x rows x k x ffn x dim / time against the peak; batch
 *   invariance as gemm's (exit 1 if an m-row call's rows differ from them
 *   alone).
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
#include <unistd.h>

#include "base/clock.h"
#include "base/pool.h"
#include "engine/serve/engine.h"
#include "base/err.h"
#include "engine/format/gguf.h"
#include "engine/model/loader.h"
#include "engine/model/quant.h"
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
    const char *weights;        /* NULL, "fp8" or "q8_0" */
    const char *kv;             /* NULL (the backend's), or a kv_dtype */
    const char *ref_kv;         /* parity: the CPU reference's kv_dtype (NULL: bf16 against a device, else its own) */
    const char *noise_kv;       /* parity: NULL (held to --tol), or the kv_dtype of a CPU run that sets the floor */
    const char *variants;       /* gemm: comma-separated variants */
    const char *shapes;         /* gemm: OUTxIN,...; attn: NH/NKVxHD,... */
    int threads;
    int32_t prompts, tokens, prompt_len, steps, mib, iters;
    int32_t layers;             /* --layers: a synthetic model cut to N layers (0: the shape's own) */
    int32_t reps;               /* gemm, attn: timed calls per point (0: as many as fill ~10 ms, 5..1000) */
    int32_t flush_mib;          /* gemm, attn: operand copies taken in turn to exceed this many MiB (0: one) */
    int kv_fill;                /* bench: the prompt's KV written directly, no prefill (--kv-fill) */
    int batches_set;            /* --batches given */
    double tol, bw, peak_tflops;
    int32_t *batches;
    int32_t n_batches;
    int32_t *rows;              /* gemm: --rows */
    int32_t n_rows;
    int32_t *ctxs;              /* attn: --ctx */
    int32_t n_ctxs;
} opts;

/* doc to --json (then freed), through a temporary file renamed over it: a process killed while writing (a
 * stage's timeout) leaves the previous snapshot whole. */
static int write_json(const opts *o, cJSON *doc)
{
    char *txt = cJSON_Print(doc);
    int rc = 0;
    if (o->json && txt) {
        char tmp[4096];
        snprintf(tmp, sizeof tmp, "%s.tmp", o->json);
        FILE *f = fopen(tmp, "w");
        if (!f || fputs(txt, f) < 0 || fputc('\n', f) < 0)
            rc = 1;
        if (f && fclose(f))
            rc = 1;
        if (!rc && rename(tmp, o->json))
            rc = 1;
        if (rc)
            fprintf(stderr, "%s: cannot write %s\n", P, o->json);
    }
    free(txt);
    cJSON_Delete(doc);
    return rc;
}

/* RD_GPUBENCH_FAULT=abort ends the process (as a GPU fault in a kernel under test does) after the first
 * variant (gemm, moe) or batch (bench) and its snapshot: the test suite checks what --json holds then. */
static void fault_abort_point(void)
{
    const char *f = getenv("RD_GPUBENCH_FAULT");
    if (f && !strcmp(f, "abort")) {
        fflush(stdout);
        abort();
    }
}

/* What is measured so far (snap: a copy of the document, then freed), marked "complete": false and written to
 * --json after each variant or batch: a stage cut by its timeout, or a fault that ends the process, keeps what
 * came before it. */
static void write_snapshot(const opts *o, cJSON *snap)
{
    if (!snap)
        return;
    cJSON_AddBoolToObject(snap, "complete", 0);
    write_json(o, snap);
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

#define SYNTH_NAMES "1b, qwen3-1.7b, qwen3-0.6b, qwen3-8b, qwen3-30b-a3b, gemma3-270m, tiny or moe-tiny"

/* ------------------------------------------------------------------ synthetic models */

typedef struct {
    uint64_t seed;
    float embed_std;            /* the embedding's std (0: 0.02 as every matrix) */
    float router_std;           /* the MoE routers' std (0: 0.02) */
} synth_ctx;

/* One weight: uniform in [-a, a) from the xorshift stream x, rounded to the
 * nearest bf16 value (rd_f32_to_bf16's arithmetic, inlined: no NaN here). */
static inline float synth_val(uint64_t *x, float a)
{
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    /* (x >> 40) / 2^23 - 1 is exact in float: the double expression of before, bit for bit */
    const float f = ((float)(int32_t)(*x >> 40) * (1.0f / 8388608.0f) - 1.0f) * a;
    uint32_t u;
    memcpy(&u, &f, 4);
    u = ((u + 0x7fffu + ((u >> 16) & 1)) >> 16) << 16;
    float r;
    memcpy(&r, &u, 4);
    return r;
}

/* Large tensors are filled in parallel, with the values of the one serial
 * stream: xorshift64 is linear over GF(2), so the state 2^16 steps on is a
 * fixed 64 x 64 bit matrix J times the state (J = M^(2^16), M one step),
 * and each chunk of 2^16 values starts from J^t applied to the seed. */
#define SYNTH_CHUNK_LOG 16
#define SYNTH_CHUNK ((int64_t)1 << SYNTH_CHUNK_LOG)

static uint64_t gf2_apply(const uint64_t *cols, uint64_t v)
{
    uint64_t r = 0;
    for (int i = 0; v; i++, v >>= 1)
        if (v & 1)
            r ^= cols[i];
    return r;
}

static const uint64_t *synth_jump(void)
{
    static uint64_t J[64];
    static int ready;
    if (!ready) {
        for (int i = 0; i < 64; i++) { /* M: one step of e_i */
            uint64_t x = (uint64_t)1 << i;
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            J[i] = x;
        }
        for (int k = 0; k < SYNTH_CHUNK_LOG; k++) { /* squared 16 times: M^(2^16) */
            uint64_t sq[64];
            for (int i = 0; i < 64; i++)
                sq[i] = gf2_apply(J, J[i]);
            memcpy(J, sq, sizeof J);
        }
        ready = 1;
    }
    return J;
}

typedef struct {
    float *dst;
    int64_t n;
    const uint64_t *start; /* [tasks] the stream's state before each chunk */
    float a;
} synth_job;

static void synth_task(void *ctx, int32_t t, int32_t worker)
{
    const synth_job *j = ctx;
    const int64_t i0 = (int64_t)t * SYNTH_CHUNK, i1 = i0 + SYNTH_CHUNK < j->n ? i0 + SYNTH_CHUNK : j->n;
    uint64_t x = j->start[t];
    for (int64_t i = i0; i < i1; i++)
        j->dst[i] = synth_val(&x, j->a);
}

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
     * to bf16, and both then hold the same numbers. An MoE model's embedding
     * and routers get their own std (synth_config_opts says why). */
    float std = 0.02f;
    if (c->embed_std > 0 && strstr(name, "embed_tokens"))
        std = c->embed_std;
    else if (c->router_std > 0 && strstr(name, "mlp.gate.weight"))
        std = c->router_std;
    const float a = std * 1.7320508f;
    uint64_t x = h | 1;
    const int32_t tasks = (int32_t)((n + SYNTH_CHUNK - 1) / SYNTH_CHUNK);
    uint64_t *start = tasks > 1 ? malloc(sizeof(uint64_t) * tasks) : NULL;
    if (start) {
        const uint64_t *J = synth_jump();
        start[0] = x;
        for (int32_t t = 1; t < tasks; t++)
            start[t] = gf2_apply(J, start[t - 1]);
        synth_job j = {dst, n, start, a};
        long cores = sysconf(_SC_NPROCESSORS_ONLN);
        pool_init(cores > 0 ? (int)(cores < POOL_MAX_THREADS ? cores : POOL_MAX_THREADS) : 1);
        pool_run(tasks, synth_task, &j);
        free(start);
        return 0;
    }
    for (int64_t i = 0; i < n; i++)
        dst[i] = synth_val(&x, a);
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
    } else if (!strcmp(which, "qwen3-1.7b") || !strcmp(which, "qwen3-0.6b") || !strcmp(which, "qwen3-8b")) {
        /* Qwen3's shapes: q width 16 x 128 = 2048 (1.7B: = hidden; 0.6B: over
         * hidden 1024), per-head q/k norms, tied embeddings, 151,936 tokens;
         * the 8B: 36 layers of 32 x 128 over 8 KV heads, hidden 4096, FFN
         * 12288, an untied LM head. */
        strcpy(c->arch, "qwen3");
        int big = !strcmp(which, "qwen3-1.7b"), b8 = !strcmp(which, "qwen3-8b");
        c->n_layers = 28, c->dim = big ? 2048 : 1024, c->n_heads = 16, c->n_kv_heads = 8;
        c->ffn_dim = big ? 6144 : 3072, c->vocab = 151936, c->max_ctx = 4096, c->rope_theta = 1000000.0f;
        c->head_dim = 128;
        c->norm_eps = 1e-6f;
        c->tied_embeddings = 1;
        if (b8)
            c->n_layers = 36, c->dim = 4096, c->n_heads = 32, c->ffn_dim = 12288, c->tied_embeddings = 0;
        return 0;
    } else if (!strcmp(which, "qwen3-30b-a3b") || !strcmp(which, "moe-tiny")) {
        /* Qwen3-30B-A3B's shape (its config.json): 48 layers, hidden 2048, 32
         * query heads of 128 over 4 KV heads, q/k norms, 128 experts of FFN
         * 768, 8 used per token, norm_topk_prob, 151,936 tokens, untied head.
         * moe-tiny: the same family at test size. */
        strcpy(c->arch, "qwen3moe");
        if (!strcmp(which, "moe-tiny")) {
            c->n_layers = 2, c->dim = 64, c->n_heads = 4, c->n_kv_heads = 2, c->head_dim = 16, c->ffn_dim = 128;
            c->n_experts = 8, c->n_experts_used = 2, c->expert_ffn_dim = 32, c->vocab = 300, c->max_ctx = 1024;
        } else {
            c->n_layers = 48, c->dim = 2048, c->n_heads = 32, c->n_kv_heads = 4, c->head_dim = 128, c->ffn_dim = 6144;
            c->n_experts = 128, c->n_experts_used = 8, c->expert_ffn_dim = 768, c->vocab = 151936, c->max_ctx = 4096;
        }
        c->rope_theta = 1000000.0f, c->norm_eps = 1e-6f, c->moe_norm_topk = 1;
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

/* synth_config with the command line's cuts: --layers N (the Qwen3-30B-A3B
 * shape defaults to 8 of its 48, to fit a device's memory and a check's
 * time; a roofline counts the layers built), and a context long enough for
 * --prompt + --steps. The MoE shapes' random weights route like a trained
 * model's (tools/gen_moe_model.py measured it): an embedding of std 3 keeps
 * each token's own vector ahead of the attention outputs in the residual
 * stream, and routers of std 2 / sqrt(hidden) spread the router logits by
 * ~2, so B random rows reach about as many distinct experts as uniform top-k
 * routing would; with every matrix at 0.02 a few experts take most rows. */
static int synth_config_opts(const opts *o, const char *which, model_config *c, synth_ctx *sc)
{
    if (synth_config(which, c))
        return rd_fail(RD_EINVAL, "--synthetic expects " SYNTH_NAMES ", not '%s'", which);
    const int32_t full = c->n_layers;
    if (o->layers > 0)
        c->n_layers = o->layers < full ? o->layers : full;
    else if (!strcmp(which, "qwen3-30b-a3b"))
        c->n_layers = 8;
    const int32_t need = o->prompt_len + o->steps + 64;
    if (c->max_ctx < need)
        c->max_ctx = need;
    if (sc) {
        memset(sc, 0, sizeof *sc);
        sc->seed = 12345;
        if (c->n_experts > 0)
            sc->embed_std = 3.0f, sc->router_std = 2.0f / sqrtf((float)c->dim);
    }
    return 0;
}

/* The layers a synthetic shape has in full (for "N of M layers"). */
static int32_t synth_full_layers(const char *which)
{
    model_config c;
    return synth_config(which, &c) ? 0 : c.n_layers;
}

/* One loaded weight [rows][cols] read back, quantized to type (FP8 blocks,
 * engine/model/quant_fp8.h, or Q8_0 with llama.cpp's rounding,
 * engine/model/quant.h) and loaded again in its place. */
static int requant_slot(rd_backend *be, void **slot, int64_t rows, int64_t cols, int32_t type)
{
    const size_t n = (size_t)(rows * cols);
    float *w = malloc(sizeof(float) * n);
    uint8_t *blk = malloc((size_t)rows * ggml_row_bytes(type, (uint64_t)cols));
    void *h = NULL;
    int rc = w && blk ? be->ops->linear_read(be, *slot, w) : RD_ENOMEM;
    if (!rc)
        rc = type == GGML_Q8_0 ? ggml_quant_q8_0(w, n, blk) : rd_fp8_quant(w, n, blk);
    rd_wpart part = {.type = type, .rows = (int32_t)rows, .data = blk};
    if (!rc)
        rc = be->ops->linear_load_q(be, &part, 1, (int32_t)cols, &h);
    free(w), free(blk);
    if (rc)
        return rc == RD_ENOMEM ? rd_fail(rc, "--weights: out of memory") : rc;
    be->ops->linear_free(be, *slot);
    *slot = h;
    return 0;
}

/* --weights fp8 / q8_0: the weights a bf16 push with serve_dtype fp8 / q8_0
 * leaves. FP8: every layer's dense linear. Q8_0 (llama.cpp's choice for a
 * Q8_0 file): every 2-D linear, the token embedding (also the tied head),
 * an untied head and the MoE experts too; the routers stay as loaded. */
static int requant(model *m, int32_t type)
{
    const model_config *c = &m->cfg;
    const int q8 = type == GGML_Q8_0;
    int rc = 0;
    for (int32_t l = -1; l < c->n_layers && !rc; l++)
        for (int g = l < 0 ? 0 : AG_FIRST_LAYER; g < (l < 0 ? AG_FIRST_LAYER : AG_COUNT) && !rc; g++) {
            const arch_group ag = (arch_group)g;
            const int table = ag == AG_EMBED || ag == AG_LM_HEAD, expert = ag == AG_EXP_GATE_UP || ag == AG_EXP_DOWN;
            if (!arch_group_is_linear(ag) || ag == AG_ROUTER || (!q8 && (table || expert)))
                continue;
            int64_t rows, cols;
            arch_group_shape(m->arch, c, ag, &rows, &cols);
            if (cols % 32 || (ag == AG_LM_HEAD && m->lm_head == m->embed))
                continue;
            for (int32_t e = 0; e < (expert ? c->n_experts : 1) && !rc; e++) {
                void **slot = model_weight_slot(m, ag, l, e);
                if (!slot || !*slot)
                    continue;
                const int tied = ag == AG_EMBED && m->lm_head == m->embed;
                rc = requant_slot(m->be, slot, rows, cols, type);
                if (!rc && tied)
                    m->lm_head = m->embed;
            }
        }
    m->weights_gen++;
    return rc;
}

/* --kv and --weights on a loaded model (before any runner). */
static int apply_dtypes(const opts *o, rd_loaded *l)
{
    int rc = o->kv ? rd_backend_set_kv_dtype(l->be, o->kv) : 0;
    if (!rc && o->weights && strcmp(o->weights, "fp8") && strcmp(o->weights, "q8_0"))
        rc = rd_fail(RD_EINVAL, "--weights expects fp8 or q8_0, not '%s'", o->weights);
    if (!rc && o->weights)
        rc = requant(l->m, strcmp(o->weights, "fp8") ? GGML_Q8_0 : RD_TYPE_FP8_B32);
    return rc;
}

static int load_plain(const opts *o, const char *backend, rd_loaded *l)
{
    memset(l, 0, sizeof *l);
    if (!o->synthetic)
        return rd_load(o->model, backend, o->threads, l);
    model_config cfg;
    synth_ctx sc;
    int rc = synth_config_opts(o, o->synthetic, &cfg, &sc);
    if (rc)
        return rc;
    if ((rc = rd_backend_create(backend, o->threads, &l->be)))
        return rc;
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

/* tis: the importance-sampling mismatch of the tested load (--weights fp8 in
 * the process's RD_CUDA_FP8 mode, --kv) against the same backend's plain load
 * (the weights as loaded: bf16 on the GPU). Prompts sampled on the plain load
 * at temperature 1 (seed 1), then each prompt + its tokens scored by teacher
 * forcing on both: per token d = logp_tested - logp_plain, r = exp(d),
 * K3 = r - 1 - d (bench_quant.py's estimate of KL(plain || tested), mean over
 * tokens). The plain load's scores against its own sampled log-probs are the
 * floor (scoring vs decoding on one load). */
static int score_all(model *m, const prompt_t *pr, const eng_result *sampled, int32_t N, float **lp)
{
    eng_request rq[8];
    eng_result res[8];
    int32_t *ids[8] = {0};
    memset(rq, 0, sizeof rq);
    memset(res, 0, sizeof res);
    for (int32_t i = 0; i < N; i++) {
        const int32_t n = pr[i].n + sampled[i].n_tokens;
        ids[i] = malloc(sizeof(int32_t) * (size_t)n);
        memcpy(ids[i], pr[i].ids, sizeof(int32_t) * pr[i].n);
        memcpy(ids[i] + pr[i].n, sampled[i].token_ids, sizeof(int32_t) * sampled[i].n_tokens);
        rq[i].prompt = ids[i];
        rq[i].n_prompt = n;
        rq[i].n = 1;
        rq[i].sp = samp_default();
        rq[i].score_prompt = 1;
        rq[i].score_from = pr[i].n;
        rq[i].ignore_eos = 1;
        rq[i].tag = (uint64_t)i;
    }
    int rc = run_engine(m, rq, N, res);
    for (int32_t i = 0; i < N; i++) {
        if (!rc) {
            lp[i] = malloc(sizeof(float) * (size_t)sampled[i].n_tokens);
            memcpy(lp[i], res[i].prompt_logprobs + pr[i].n, sizeof(float) * (size_t)sampled[i].n_tokens);
        }
        eng_result_free(&res[i]);
        free(ids[i]);
    }
    return rc;
}

static int cmd_tis(const opts *o)
{
    rd_loaded lb, lt;
    if (load_any(o, o->backend, 0, &lb))
        return setup_fail("load (plain)");
    if (load_any(o, o->backend, 1, &lt)) {
        rd_unload(&lb);
        return setup_fail("load (tested)");
    }
    const int32_t N = o->prompts > 8 ? 8 : o->prompts, T = o->tokens;
    prompt_t pr[8];
    eng_request rq[8];
    eng_result rs[8];
    float *lpb[8] = {0}, *lpt[8] = {0};
    memset(rq, 0, sizeof rq);
    memset(rs, 0, sizeof rs);
    int rc = make_prompts(&lb, N, pr);
    for (int32_t i = 0; i < N && !rc; i++) {
        rq[i] = greedy_req(&pr[i], T, (uint64_t)i, 0);
        rq[i].sp.temperature = 1.0f;
        rq[i].sp.seed = 1;
    }
    if (!rc)
        rc = run_engine(lb.m, rq, N, rs);
    if (!rc)
        rc = score_all(lb.m, pr, rs, N, lpb);
    if (!rc)
        rc = score_all(lt.m, pr, rs, N, lpt);
    if (rc) {
        rd_unload(&lb);
        rd_unload(&lt);
        return setup_fail("engine run");
    }
    double k3 = 0, absd = 0, maxd = 0, meand = 0, floor_max = 0;
    int64_t n = 0;
    for (int32_t i = 0; i < N; i++)
        for (int32_t j = 0; j < rs[i].n_tokens; j++) {
            const double d = (double)lpt[i][j] - lpb[i][j], f = fabs((double)lpb[i][j] - rs[i].logprobs[j]);
            k3 += exp(d) - 1.0 - d;
            absd += fabs(d);
            meand += d;
            maxd = fabs(d) > maxd ? fabs(d) : maxd;
            floor_max = f > floor_max ? f : floor_max;
            n++;
        }
    const double nn = n ? (double)n : 1.0;
    const char *mode = getenv("RD_CUDA_FP8"), *q8 = getenv("RD_CUDA_Q8");
    printf("tis%s: %lld tokens (%d prompts, temperature 1) scored on the plain load and on the tested one (weights %s, "
           "RD_CUDA_FP8=%s, RD_CUDA_Q8=%s, kv %s): mean K3 KL %.3e, mean |dlogprob| %.4f, max %.4f, mean dlogprob %+.5f; the plain "
           "load's scores vs its sampled log-probs: max |diff| %.2e\n", o->label ? o->label : "", (long long)n, N,
           o->weights ? o->weights : "as loaded", mode ? mode : "(unset)", q8 ? q8 : "(unset)", o->kv ? o->kv : "default", k3 / nn,
           absd / nn, maxd, meand / nn, floor_max);
    printf("TABLE|tis%s|mean K3 KL %.3e, mean abs dlogprob %.4f, max %.4f over %lld tokens|%s|\n",
           o->label ? o->label : "", k3 / nn, absd / nn, maxd, (long long)n, n ? "measured" : "no tokens");
    cJSON *doc = cJSON_CreateObject();
    cJSON_AddStringToObject(doc, "weights", o->weights ? o->weights : "as loaded");
    cJSON_AddStringToObject(doc, "rd_cuda_fp8", mode ? mode : "");
    cJSON_AddStringToObject(doc, "rd_cuda_q8", q8 ? q8 : "");
    cJSON_AddNumberToObject(doc, "tokens", (double)n);
    cJSON_AddNumberToObject(doc, "mean_k3_kl", k3 / nn);
    cJSON_AddNumberToObject(doc, "mean_abs_dlogprob", absd / nn);
    cJSON_AddNumberToObject(doc, "max_abs_dlogprob", maxd);
    cJSON_AddNumberToObject(doc, "mean_dlogprob", meand / nn);
    cJSON_AddNumberToObject(doc, "plain_score_vs_sample_max", floor_max);
    for (int32_t i = 0; i < N; i++) {
        eng_result_free(&rs[i]);
        free(pr[i].ids);
        free(lpb[i]);
        free(lpt[i]);
    }
    rd_unload(&lb);
    rd_unload(&lt);
    int wj = write_json(o, doc);
    return n ? wj : 1;
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
    int64_t alone_diff = 0;     /* one-draw calls whose result is not the same request's in the call of DRAWS */
    cJSON *per = cJSON_CreateArray();
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
        const double t_call = clock_now_s() - t0;
        t_dev += t_call;
        /* one draw a call, as a batch-1 step's: the median of 15 calls (its first call grows nothing new) */
        double one[15];
        samp_result g1;
        for (int32_t k = 0; k < 15 && !rc; k++) {
            const double t1 = clock_now_s();
            rc = runner_sample(&r, q, 1, &g1);
            one[k] = clock_now_s() - t1;
            alone_diff += !rc && (g1.token != got[0].token || memcmp(&g1.logprob, &got[0].logprob, sizeof(float)) ||
                                  g1.n_top != got[0].n_top);
            for (int32_t j = k; j > 0 && one[j] < one[j - 1]; j--) {
                const double tmp = one[j];
                one[j] = one[j - 1], one[j - 1] = tmp;
            }
        }
        cJSON *e = cJSON_CreateObject();
        cJSON_AddNumberToObject(e, "temperature", ps[pi].t);
        cJSON_AddNumberToObject(e, "top_k", ps[pi].k);
        cJSON_AddNumberToObject(e, "top_p", ps[pi].p);
        cJSON_AddNumberToObject(e, "min_p", ps[pi].minp);
        cJSON_AddNumberToObject(e, "ms_per_call", t_call * 1e3);
        cJSON_AddNumberToObject(e, "ms_one_draw", one[7] * 1e3);
        cJSON_AddItemToArray(per, e);
        printf("  T %.1f top-k %d top-p %.2f min-p %.2f: %.3f ms per call of %d draws, %.3f ms per call of one\n",
               ps[pi].t, ps[pi].k, ps[pi].p, ps[pi].minp, t_call * 1e3, DRAWS, one[7] * 1e3);
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
    if (rc) {
        cJSON_Delete(per);
        return setup_fail("sampling");
    }
    const int pass = equal == total && max_dlp < 1e-4 && alone_diff == 0;
    printf("device sampler %s: %lld/%lld draws pick the CPU sampler's token (and alternatives), max |dlogprob| "
           "%.2g; %lld one-draw calls differ from the same draw among %d; %.2f ms per call of %d draws\n",
           pass ? "PASS" : "FAIL", (long long)equal, (long long)total, max_dlp, (long long)alone_diff, DRAWS,
           t_dev / NP * 1e3, DRAWS);
    printf("TABLE|device sampler|%lld/%lld draws equal to samp_sample, %.2f ms per %d draws|%s|\n", (long long)equal,
           (long long)total, t_dev / NP * 1e3, DRAWS, pass ? "PASS" : "FAIL");
    cJSON *doc = cJSON_CreateObject();
    cJSON_AddBoolToObject(doc, "pass", pass);
    cJSON_AddNumberToObject(doc, "draws", (double)total);
    cJSON_AddNumberToObject(doc, "equal", (double)equal);
    cJSON_AddNumberToObject(doc, "max_dlogprob", max_dlp);
    cJSON_AddNumberToObject(doc, "ms_per_call", t_dev / NP * 1e3);
    cJSON_AddItemToObject(doc, "per_params", per);
    cJSON_AddNumberToObject(doc, "alone_differs", (double)alone_diff);
    const char *sa = getenv("RD_CUDA_SAMPLE");
    cJSON_AddStringToObject(doc, "rd_cuda_sample", sa && *sa ? sa : "tiled");
    int wj = write_json(o, doc);
    return pass ? wj : 1;
}

/* ------------------------------------------------------------------ decode benchmark */

/* K/V of random values in every layer's cache at chunk positions of one
 * sequence's table, written by the backend's kv_write: the layout a prefill
 * leaves, without running the model (a long prompt's prefill would take far
 * longer than the decode steps measured after it; attention reads the same
 * bytes whatever the values). kv holds C rows of K|V (2 nkv hd floats). */
static int kv_fill_rows(rd_backend *be, const rd_attn_shape *a, float *const *kc, float *const *vc, int32_t n_layers,
                        const float *kv_dev, int32_t C, const int32_t *table, int32_t max_blocks, int32_t len)
{
    const int32_t kvw = a->n_kv_heads * a->head_dim, bs = a->block_size;
    int32_t *pos = malloc(sizeof(int32_t) * C), *slot = malloc(sizeof(int32_t) * C), *tok = calloc(C, sizeof(int32_t));
    int rc = pos && slot && tok ? 0 : rd_fail(RD_ENOMEM, "kv fill: out of memory");
    for (int32_t p0 = 0; p0 < len && !rc; p0 += C) {
        const int32_t n = len - p0 < C ? len - p0 : C;
        for (int32_t i = 0; i < n; i++) {
            pos[i] = p0 + i;
            slot[i] = table[(p0 + i) / bs] * bs + (p0 + i) % bs;
        }
        int32_t qs[2] = {0, n}, ctx = p0 + n;
        rd_step st = {n, 1, max_blocks, tok, pos, slot, qs, &ctx, table, NULL};
        rd_step_dev sd;
        rc = be->ops->step_upload(be, &st, &sd);
        for (int32_t l = 0; l < n_layers && !rc; l++)
            be->ops->kv_write(be, a, kv_dev, kv_dev + kvw, 2 * kvw, &sd, kc[l], vc[l]);
        if (!rc)
            rc = be->ops->sync(be); /* the step buffers are the next chunk's */
    }
    free(pos), free(slot), free(tok);
    return rc;
}

/* A device buffer of C rows of random K|V (2 nkv hd floats each, |x| < 1). */
static float *kv_source(rd_backend *be, const rd_attn_shape *a, int32_t C, uint64_t seed)
{
    const size_t n = (size_t)C * 2 * a->n_kv_heads * a->head_dim;
    float *h = malloc(sizeof(float) * n), *d = be->ops->alloc(be, sizeof(float) * n);
    for (size_t i = 0; h && i < n; i++)
        h[i] = (float)((double)(mix(&seed) >> 40) * (1.0 / 16777216.0) * 2.0 - 1.0);
    if (h && d && be->ops->h2d(be, d, h, sizeof(float) * n) == 0) {
        free(h);
        return d;
    }
    free(h);
    if (d)
        be->ops->free(be, d);
    return NULL;
}

/* --kv-fill: sequences [s0, s1) as if prefilled with len tokens (batch_t as prefill_step leaves it). */
static int kv_fill_step(runner *r, batch_t *b, int32_t s0, int32_t s1, int32_t len, uint64_t *rng)
{
    const int32_t C = 1024;
    float *src = kv_source(r->be, &r->attn, C, *rng);
    int rc = src ? 0 : rd_fail(RD_ENOMEM, "kv fill: cannot allocate %d rows", C);
    for (int32_t s = s0; s < s1 && !rc; s++) {
        for (int32_t k = 0; k < b->bps; k++)
            b->tab[k] = s * b->bps + k;
        rc = kv_fill_rows(r->be, &r->attn, r->k_cache, r->v_cache, r->m->cfg.n_layers, src, C, b->tab, b->bps, len);
        b->ctx[s] = len;
        b->next[s] = (int32_t)(mix(rng) % (uint64_t)r->m->cfg.vocab);
    }
    if (src)
        r->be->ops->free(r->be, src);
    return rc;
}

/* Bytes of a loaded linear as the backend holds it (0 for NULL). */
static double lin_bytes(rd_backend *be, const void *h)
{
    return h && be->ops->linear_bytes ? (double)be->ops->linear_bytes(be, h) : 0.0;
}

static int cmd_bench(const opts *o)
{
    rd_loaded l;
    memset(&l, 0, sizeof l);
    model *m = NULL;
    double t_load0 = clock_now_s();
    if (load_any(o, o->backend, 1, &l))
        return setup_fail(o->synthetic ? "building the synthetic model" : "load");
    m = l.m;
    double t_load = clock_now_s() - t_load0;
    const model_config *c = &m->cfg;
    rd_backend *be = l.be;
    char name[160];
    const int32_t full_layers = o->synthetic ? synth_full_layers(o->synthetic) : c->n_layers;
    if (o->synthetic && full_layers != c->n_layers)
        snprintf(name, sizeof name, "%s (%d of %d layers)", o->synthetic, c->n_layers, full_layers);
    else
        snprintf(name, sizeof name, "%s", o->synthetic ? o->synthetic : base_name(o->model));
    double bw = o->bw;
    if (!(bw > 0) && copy_bw(be, o->mib, o->iters, &bw))
        bw = 0;
    /* Weights as stored: bf16 on the device (fp32 panels on the CPU), FP8 blocks with --weights fp8 (33 bytes
     * per 32), Q8_0 with --weights q8_0 (34 per 32; bf16 on a device without RD_CUDA_Q8=tc); the LM head's
     * table bf16 (fp32 on the CPU, or with RD_CUDA_HEAD=fp32). */
    const double elem = !strcmp(be->ops->name, "cpu") ? 4.0 : 2.0;
    const char *q8env = getenv("RD_CUDA_Q8");
    const int q8_held = o->weights && !strcmp(o->weights, "q8_0") &&
                        (!strcmp(be->ops->name, "cpu") || (q8env && (!strcmp(q8env, "tc") || !strcmp(q8env, "w8a8"))));
    const double w_elem = !o->weights ? elem : !strcmp(o->weights, "fp8") ? 33.0 / 32.0 : q8_held ? 34.0 / 32.0 : elem;
    const char *head = getenv("RD_CUDA_HEAD");
    const double head_elem = q8_held ? 34.0 / 32.0 : head && !strcmp(head, "fp32") ? 4.0 : elem;
    const int64_t hd = c->head_dim;
    const int64_t per_layer = ((int64_t)(c->n_heads + 2 * c->n_kv_heads) * hd * c->dim + (int64_t)c->dim * c->n_heads * hd +
                               2 * (int64_t)c->ffn_dim * c->dim + (int64_t)c->dim * c->ffn_dim);
    double weight_bytes = (double)per_layer * c->n_layers * w_elem + (double)c->vocab * c->dim * head_elem;
    /* Mixture of experts: a step reads the attention, norms and router of every layer, the head, and only
     * the experts its rows are routed to: at most min(n_experts, batch * k) per layer (an upper bound of
     * the distinct experts), counted per batch below. The bytes of each linear as the backend holds it. */
    const int moe = c->n_experts > 0;
    double moe_fixed = 0, moe_expert = 0;
    if (moe) {
        for (int32_t li = 0; li < c->n_layers; li++) {
            const model_layer *L = &m->layers[li];
            moe_fixed += lin_bytes(be, L->qkv) + lin_bytes(be, L->o) + lin_bytes(be, L->router) +
                         4.0 * (2 * c->dim + 2 * hd);
        }
        moe_fixed += (double)c->vocab * c->dim * head_elem + 4.0 * c->dim;
        moe_expert = lin_bytes(be, m->layers[0].exp_gate_up[0]) + lin_bytes(be, m->layers[0].exp_down[0]);
        weight_bytes = moe_fixed + moe_expert * c->n_experts * c->n_layers; /* all of them, for the record */
    }
    const double kv_per_token =
        (double)c->n_layers * 2 * (double)rd_backend_kv_block_bytes(be, c->n_kv_heads, 1, (int32_t)hd);
    char desc[4096] = "";
    if (be->ops->describe)
        be->ops->describe(be, desc, sizeof desc);
    printf("model %s: %.3g B params, weights %s %.3f GB, KV %.1f KiB/token; load %.1fs; copy bandwidth "
           "%.1f GB/s\n%s\n", name, m->n_params / 1e9, moe ? "held (all experts)" : "read per step",
           weight_bytes / 1e9, kv_per_token / 1024, t_load, bw, desc);
    if (moe)
        printf("MoE: %d experts of %.2f MB per layer, %d used per token; a step reads %.3f GB of attention, norms, "
               "routers and head plus the experts its rows reach: the roofline counts min(%d, batch x %d) per "
               "layer (an upper bound of the distinct experts); the measured count is from the routes\n",
               c->n_experts, moe_expert / 1e6, c->n_experts_used, moe_fixed / 1e9, c->n_experts, c->n_experts_used);
    if (o->kv_fill)
        printf("--kv-fill: each prompt's %d tokens of K/V written directly (random values), no prefill\n",
               o->prompt_len);
    cJSON *doc = cJSON_CreateObject(), *arr = cJSON_AddArrayToObject(doc, "batches");
    cJSON_AddStringToObject(doc, "model", name);
    if (o->synthetic)
        cJSON_AddStringToObject(doc, "synthetic", o->synthetic);
    cJSON_AddStringToObject(doc, "backend", be->ops->name);
    cJSON_AddStringToObject(doc, "describe", desc);
    if (o->label)
        cJSON_AddStringToObject(doc, "label", o->label);
    cJSON_AddNumberToObject(doc, "params", (double)m->n_params);
    cJSON_AddNumberToObject(doc, "layers", c->n_layers);
    cJSON_AddNumberToObject(doc, "layers_full", full_layers);
    cJSON_AddNumberToObject(doc, "weight_bytes_per_step", moe ? moe_fixed : weight_bytes);
    cJSON_AddNumberToObject(doc, "kv_bytes_per_token", kv_per_token);
    cJSON_AddNumberToObject(doc, "copy_gbps", bw);
    cJSON_AddNumberToObject(doc, "prompt", o->prompt_len);
    cJSON_AddNumberToObject(doc, "steps", o->steps);
    cJSON_AddBoolToObject(doc, "kv_fill", o->kv_fill);
    if (o->weights)
        cJSON_AddStringToObject(doc, "weights", o->weights);
    if (o->kv)
        cJSON_AddStringToObject(doc, "kv_dtype", o->kv);
    if (moe) {
        cJSON *mo = cJSON_AddObjectToObject(doc, "moe");
        cJSON_AddNumberToObject(mo, "experts", c->n_experts);
        cJSON_AddNumberToObject(mo, "experts_used", c->n_experts_used);
        cJSON_AddNumberToObject(mo, "expert_bytes", moe_expert);
        cJSON_AddNumberToObject(mo, "fixed_bytes_per_step", moe_fixed);
        cJSON_AddNumberToObject(mo, "weight_bytes_all_experts", weight_bytes);
        cJSON_AddStringToObject(mo, "roofline", "fixed bytes + layers x min(experts, batch x experts_used) x "
                                                "expert_bytes + KV (an upper bound of the distinct experts)");
    }
    int rc = 0;
    const int32_t k_used = moe ? c->n_experts_used : 0;
    for (int32_t bi = 0; bi < o->n_batches && !rc; bi++) {
        const int32_t B = o->batches[bi], bs = 16, Pl = o->prompt_len, T = o->steps, warm = 3;
        const int32_t bps = (Pl + T + warm + bs) / bs + 1;
        const int32_t chunk_seqs = 512 / Pl > 0 ? 512 / Pl : 1;
        const int32_t max_rows = o->kv_fill ? B : (B < chunk_seqs ? B : chunk_seqs) * Pl;
        runner r;
        batch_t b;
        uint64_t rng = 42 + (uint64_t)B;
        int rrc = runner_init(&r, m, B * bps + 1, bs, max_rows > B ? max_rows : B, B);
        /* As the engine: the step's forward stays queued while the sampler's launch follows it
           (RD_FORWARD_SYNC=1: each forward waits, so "sample" is then the sampler alone). */
        const char *fsync = getenv("RD_FORWARD_SYNC");
        r.async_forward = !(fsync && !strcmp(fsync, "1"));
        if (rrc) {
            printf("batch %d: %s\n", B, rd_errmsg());
            printf("TABLE|decode %s%s|batch %d|setup failed: %s|\n", name, o->label ? o->label : "", B, rd_errmsg());
            continue;
        }
        if (batch_init(&b, B, bps, bs, max_rows > B ? max_rows : B)) {
            runner_free(&r);
            rc = setup_fail("batch buffers");
            break;
        }
        double tp0 = clock_now_s();
        for (int32_t s0 = 0; s0 < B && !rrc; s0 += chunk_seqs) {
            const int32_t s1 = s0 + chunk_seqs < B ? s0 + chunk_seqs : B;
            rrc = o->kv_fill ? kv_fill_step(&r, &b, s0, s1, Pl, &rng) : prefill_step(&r, &b, s0, s1, Pl, &rng, NULL);
        }
        double t_prefill = clock_now_s() - tp0;
        samp_params sp = samp_default();
        sp.temperature = 0.0f;
        rd_sample_req *q = malloc(sizeof(rd_sample_req) * B);
        samp_result *res = malloc(sizeof(samp_result) * B);
        int32_t *routes = moe ? malloc(sizeof(int32_t) * (size_t)c->n_layers * B * k_used) : NULL;
        uint8_t *seen = moe ? malloc((size_t)c->n_experts) : NULL;
        for (int32_t s = 0; s < B; s++)
            q[s] = (rd_sample_req){s, 0, 0, &sp, NULL, 0, 0, 0};
        double t_steps = 0, t_sample = 0, kv_read = 0, distinct = 0;
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
                /* the experts this step's rows reached, per layer (read after the timed part) */
                if (moe && !rrc && !(rrc = runner_routes(&r, B, routes)))
                    for (int32_t li = 0; li < c->n_layers; li++) {
                        memset(seen, 0, (size_t)c->n_experts);
                        for (int32_t j = 0; j < B * k_used; j++) {
                            const int32_t e = routes[(size_t)li * B * k_used + j];
                            if (e >= 0 && e < c->n_experts && !seen[e])
                                seen[e] = 1, distinct++;
                        }
                    }
            }
        }
        free(q);
        free(res);
        free(routes);
        free(seen);
        if (rrc) {
            printf("batch %d: %s\n", B, rd_errmsg());
            printf("TABLE|decode %s%s|batch %d|failed: %s|\n", name, o->label ? o->label : "", B, rd_errmsg());
            rc = 1;
        } else {
            const double bound = moe ? (B * k_used < c->n_experts ? B * k_used : c->n_experts) : 0;
            const double measured = moe ? distinct / T / c->n_layers : 0; /* per layer, mean over the steps */
            const double wb = moe ? moe_fixed + moe_expert * bound * c->n_layers : weight_bytes;
            const double step = t_steps / T, bytes = wb + kv_read / T;
            const double roof = bw > 0 ? bytes / (bw * 1e9) : NAN;
            const double bytes_meas = moe ? moe_fixed + moe_expert * measured * c->n_layers + kv_read / T : bytes;
            const double roof_meas = bw > 0 ? bytes_meas / (bw * 1e9) : NAN;
            const double tps = B / step;
            printf("batch %4d: %9.1f tokens/s, step %7.3f ms (sample%s %.3f ms), roofline %7.3f ms (%.2f GB/step): "
                   "%.2fx; %s %d x %d in %.2fs; graphs %lld replayed, %lld captured\n",
                   B, tps, step * 1e3, r.async_forward ? " with the forward's wait" : "", t_sample / T * 1e3, roof * 1e3, bytes / 1e9, step / roof,
                   o->kv_fill ? "kv fill" : "prefill", B, Pl, t_prefill, (long long)r.graph_replays,
                   (long long)r.graph_captures);
            if (moe)
                printf("            experts per layer: bound %.0f, measured %.1f (mean distinct over %d steps); "
                       "roofline with the measured experts %.3f ms (%.2f GB/step): %.2fx\n",
                       bound, measured, T, roof_meas * 1e3, bytes_meas / 1e9, step / roof_meas);
            if (moe)
                printf("TABLE|decode %s%s|batch %d|%.0f tok/s, %.3f ms/step, %.2fx active-expert roofline (%.3f ms, "
                       "<= %.0f experts/layer), %.2fx with the %.1f measured|\n", name, o->label ? o->label : "", B,
                       tps, step * 1e3, step / roof, roof * 1e3, bound, step / roof_meas, measured);
            else
                printf("TABLE|decode %s%s|batch %d|%.0f tok/s, %.3f ms/step, %.2fx roofline (%.3f ms)|\n", name,
                       o->label ? o->label : "", B, tps, step * 1e3, step / roof, roof * 1e3);
            cJSON *e = cJSON_CreateObject();
            cJSON_AddNumberToObject(e, "batch", B);
            cJSON_AddNumberToObject(e, "tokens_per_s", tps);
            cJSON_AddNumberToObject(e, "step_ms", step * 1e3);
            cJSON_AddNumberToObject(e, "sample_ms", t_sample / T * 1e3);
            cJSON_AddBoolToObject(e, "forward_waits", !r.async_forward);
            cJSON_AddNumberToObject(e, "bytes_per_step", bytes);
            cJSON_AddNumberToObject(e, "roofline_ms", roof * 1e3);
            cJSON_AddNumberToObject(e, "x_roofline", step / roof);
            cJSON_AddNumberToObject(e, o->kv_fill ? "kv_fill_s" : "prefill_s", t_prefill);
            cJSON_AddNumberToObject(e, "graph_replays", (double)r.graph_replays);
            if (moe) {
                cJSON_AddNumberToObject(e, "experts_per_layer_bound", bound);
                cJSON_AddNumberToObject(e, "experts_per_layer_measured", measured);
                cJSON_AddNumberToObject(e, "bytes_per_step_measured", bytes_meas);
                cJSON_AddNumberToObject(e, "roofline_measured_ms", roof_meas * 1e3);
                cJSON_AddNumberToObject(e, "x_roofline_measured", step / roof_meas);
            }
            cJSON_AddItemToArray(arr, e);
            if (o->json)
                write_snapshot(o, cJSON_Duplicate(doc, 1));
            fault_abort_point();
        }
        batch_free(&b);
        runner_free(&r);
    }
    rd_unload(&l);
    cJSON_AddBoolToObject(doc, "complete", 1);
    int wj = write_json(o, doc);
    return rc ? rc : wj;
}

/* ------------------------------------------------------------------ GEMM microbenchmark */

/* A weight shape of the linear op: y[m][out] = x[m][in] . W^T. */
typedef struct {
    char name[64];
    int32_t out, in;
} gshape;

#define GEMM_MAX_SHAPES 64
#define GEMM_MAX_VARIANTS 32
#define GEMM_MAX_ENV 8

/* A variant: environment variables set before a fresh backend is created
 * (the CUDA backend reads RD_CUDA_* then), and whether the weights load as
 * FP8 blocks (linear_load_q with RD_TYPE_FP8_B32 parts, as serve_dtype fp8). */
typedef struct {
    char name[96];
    int32_t wtype;              /* 0: linear_load from fp32; RD_TYPE_FP8_B32 or GGML_Q8_0: linear_load_q of those blocks */
    int n_env;
    char var[GEMM_MAX_ENV][48], val[GEMM_MAX_ENV][48];
} gvariant;

static int variant_set(gvariant *v, const char *var, const char *val)
{
    for (int i = 0; i < v->n_env; i++)
        if (!strcmp(v->var[i], var)) {
            snprintf(v->val[i], sizeof v->val[i], "%s", val);
            return 0;
        }
    if (v->n_env == GEMM_MAX_ENV || strlen(var) >= sizeof v->var[0] || strlen(val) >= sizeof v->val[0])
        return -1;
    snprintf(v->var[v->n_env], sizeof v->var[0], "%s", var);
    snprintf(v->val[v->n_env], sizeof v->val[0], "%s", val);
    v->n_env++;
    return 0;
}

/* One variant from its spec: names joined by '+', each a known name or VAR=value:
 *   default  nothing set             tc       RD_CUDA_GEMM=tc      simple  RD_CUDA_GEMM=simple
 *   bf16act  RD_CUDA_ACT=bf16        mixed    RD_CUDA_ACT=mixed    fp8     weights as FP8 blocks
 *   fp8tc    fp8 + RD_CUDA_FP8=tc    tcbf16   RD_CUDA_GEMM=tc + RD_CUDA_ACT=bf16
 *   w8a8     fp8 + RD_CUDA_FP8=w8a8 (x quantized to E4M3 in the kernel)
 *   q8tc     weights as Q8_0 blocks + RD_CUDA_Q8=tc (held as Q8_0)
 *   q8w8a8   weights as Q8_0 blocks + RD_CUDA_Q8=w8a8 (x quantized to Q8_0, int8 tensor cores)
 *   moetc    RD_CUDA_MOE=tc (moe: the experts on tensor cores)
 *   nofuse   RD_CUDA_FUSE=0 (every fusion off: e.g. moe's small-batch sort and combine in their own kernels)
 * e.g. "fp8+RD_CUDA_FP8=tc" is fp8tc. -1 for an unknown name. */
static int parse_variant(const char *spec, gvariant *v)
{
    memset(v, 0, sizeof *v);
    if (strlen(spec) >= sizeof v->name)
        return -1;
    snprintf(v->name, sizeof v->name, "%s", spec);
    char buf[96];
    snprintf(buf, sizeof buf, "%s", spec);
    int rc = 0;
    for (char *save = NULL, *t = strtok_r(buf, "+", &save); t && !rc; t = strtok_r(NULL, "+", &save)) {
        char *eq = strchr(t, '=');
        if (eq) {
            *eq = 0;
            rc = *t ? variant_set(v, t, eq + 1) : -1;
        } else if (!strcmp(t, "default")) {
        } else if (!strcmp(t, "tc")) {
            rc = variant_set(v, "RD_CUDA_GEMM", "tc");
        } else if (!strcmp(t, "simple")) {
            rc = variant_set(v, "RD_CUDA_GEMM", "simple");
        } else if (!strcmp(t, "bf16act")) {
            rc = variant_set(v, "RD_CUDA_ACT", "bf16");
        } else if (!strcmp(t, "mixed")) {
            rc = variant_set(v, "RD_CUDA_ACT", "mixed");
        } else if (!strcmp(t, "fp8")) {
            v->wtype = RD_TYPE_FP8_B32;
        } else if (!strcmp(t, "fp8tc")) {
            v->wtype = RD_TYPE_FP8_B32;
            rc = variant_set(v, "RD_CUDA_FP8", "tc");
        } else if (!strcmp(t, "w8a8")) {
            v->wtype = RD_TYPE_FP8_B32;
            rc = variant_set(v, "RD_CUDA_FP8", "w8a8");
        } else if (!strcmp(t, "q8tc")) {
            v->wtype = GGML_Q8_0;
            rc = variant_set(v, "RD_CUDA_Q8", "tc");
        } else if (!strcmp(t, "q8w8a8")) {
            v->wtype = GGML_Q8_0;
            rc = variant_set(v, "RD_CUDA_Q8", "w8a8");
        } else if (!strcmp(t, "moetc")) {
            rc = variant_set(v, "RD_CUDA_MOE", "tc");
        } else if (!strcmp(t, "nofuse")) {
            rc = variant_set(v, "RD_CUDA_FUSE", "0");
        } else if (!strcmp(t, "tcbf16")) {
            rc = variant_set(v, "RD_CUDA_GEMM", "tc");
            if (!rc)
                rc = variant_set(v, "RD_CUDA_ACT", "bf16");
        } else {
            rc = -1;
        }
    }
    return rc;
}

/* The process's own values of the variables the variants set, restored
 * before each variant applies its own ("default" is the environment the
 * tool was started with). */
typedef struct {
    int n;
    char var[GEMM_MAX_VARIANTS * GEMM_MAX_ENV][48];
    char *orig[GEMM_MAX_VARIANTS * GEMM_MAX_ENV];
} genv_save;

static void env_save(genv_save *sv, const gvariant *vs, int nv)
{
    memset(sv, 0, sizeof *sv);
    for (int i = 0; i < nv; i++)
        for (int j = 0; j < vs[i].n_env; j++) {
            int k = 0;
            while (k < sv->n && strcmp(sv->var[k], vs[i].var[j]))
                k++;
            if (k < sv->n)
                continue;
            snprintf(sv->var[k], sizeof sv->var[k], "%s", vs[i].var[j]);
            const char *cur = getenv(vs[i].var[j]);
            sv->orig[k] = cur ? strdup(cur) : NULL;
            sv->n++;
        }
}

static void env_apply(const genv_save *sv, const gvariant *v)
{
    for (int k = 0; k < sv->n; k++) {
        if (sv->orig[k])
            setenv(sv->var[k], sv->orig[k], 1);
        else
            unsetenv(sv->var[k]);
    }
    for (int j = 0; v && j < v->n_env; j++)
        setenv(v->var[j], v->val[j], 1);
}

static void env_free(genv_save *sv)
{
    for (int k = 0; k < sv->n; k++)
        free(sv->orig[k]);
}

/* The four linear shapes of a model's layer: q|k|v, o, gate|up, down (an MoE
 * layer's router instead of its FFN, whose experts run in moe_ffn). */
static int model_shapes(const char *which, const model_config *c, gshape *out, int cap, int n)
{
    const int32_t q = c->n_heads * c->head_dim, kv = c->n_kv_heads * c->head_dim;
    const char *names[4] = {"qkv", "o", c->n_experts ? "router" : "gate_up", "down"};
    const int32_t o_[4] = {q + 2 * kv, c->dim, c->n_experts ? c->n_experts : 2 * c->ffn_dim, c->dim};
    const int32_t i_[4] = {c->dim, q, c->dim, c->ffn_dim};
    for (int g = 0; g < (c->n_experts ? 3 : 4) && n < cap; g++, n++) {
        snprintf(out[n].name, sizeof out[n].name, "%s.%s", which, names[g]);
        out[n].out = o_[g], out[n].in = i_[g];
    }
    return n;
}

/* "3072x2048,2048x2048" -> shapes named by their dims; -1 on a bad entry. */
static int parse_shapes(const char *spec, gshape *out, int cap, int n)
{
    const char *p = spec;
    while (*p && n < cap) {
        char *end;
        long a = strtol(p, &end, 10);
        if (end == p || *end != 'x')
            return -1;
        const char *p2 = end + 1;
        long b = strtol(p2, &end, 10);
        if (end == p2 || (*end && *end != ',') || a < 1 || b < 1 || a > 1 << 20 || b > 1 << 20)
            return -1;
        snprintf(out[n].name, sizeof out[n].name, "%ldx%ld", a, b);
        out[n].out = (int32_t)a, out[n].in = (int32_t)b;
        n++;
        p = *end ? end + 1 : end;
    }
    return *p ? -1 : n;
}

/* Dense bf16 tensor-core peak (TFLOP/s) assumed for the device describe() names, or 0 (unknown). */
static double peak_for(const char *desc, const char **why)
{
    if (strstr(desc, "H100") || strstr(desc, "H200")) {
        *why = "989 TFLOP/s: H100/H200 SXM dense bf16 (tensor cores, no sparsity)";
        return 989.0;
    }
    *why = "unknown device: no peak assumed (--peak-tflops to give one)";
    return 0.0;
}

/* Rows [0, m) of a batched result against the same rows computed alone:
 * the number of rows whose out floats differ in any bit. */
static int32_t rows_differ(const float *batched, const float *alone, int32_t m, int32_t out)
{
    int32_t bad = 0;
    for (int32_t i = 0; i < m; i++)
        bad += memcmp(batched + (size_t)i * out, alone + (size_t)i * out, sizeof(float) * (size_t)out) != 0;
    return bad;
}

/* RD_GPUBENCH_FAULT=invariance flips one bit of the first batched result
 * compared: the check (and its exit status) checked by the test suite. */
static int fault_invariance(void)
{
    const char *f = getenv("RD_GPUBENCH_FAULT");
    return f && !strcmp(f, "invariance");
}

/* Timed calls of fn: warm-up calls, one synced call to size the count (reps,
 * or enough to fill ~10 ms, 5..1000), then that many between two syncs.
 * Seconds per call, or < 0 on a backend error. */
typedef void (*call_fn)(void *ctx);
static double time_calls(rd_backend *be, call_fn fn, void *ctx, int32_t reps, int32_t *reps_out)
{
    for (int i = 0; i < 3; i++)
        fn(ctx);
    if (be->ops->sync(be))
        return -1;
    double t0 = clock_now_s();
    fn(ctx);
    if (be->ops->sync(be))
        return -1;
    double one = clock_now_s() - t0;
    int32_t n = reps > 0 ? reps : (int32_t)(0.010 / (one > 1e-7 ? one : 1e-7));
    if (reps <= 0)
        n = n < 5 ? 5 : n > 1000 ? 1000 : n;
    t0 = clock_now_s();
    for (int32_t i = 0; i < n; i++)
        fn(ctx);
    if (be->ops->sync(be))
        return -1;
    *reps_out = n;
    return (clock_now_s() - t0) / n;
}

/* Copies of an operand the timed calls take in turn, so that together they
 * exceed the device's last-level cache (--flush-mib, default 256 MiB; an
 * H100's or H200's L2 is 50 MB): each call then reads its operand from DRAM,
 * as a decode step reads each weight once, instead of the L2 that holds
 * what the call before it read. */
#define MAX_COPIES 64
static int32_t copies_for(const opts *o, double bytes)
{
    const double want = (double)o->flush_mib * 1048576.0;
    int32_t k = bytes > 0 && want > bytes ? (int32_t)ceil(want / bytes) : 1;
    return k < 1 ? 1 : k > MAX_COPIES ? MAX_COPIES : k;
}

/* The same calls captured as one backend graph of n calls (a decode step
 * runs as a graph: no launch costs between kernels), after pre (NULL: none)
 * inside the graph too; one untimed launch, then `launches` timed between
 * syncs. Seconds per call; -2 where the backend has no graphs, -1 if the
 * capture or a launch fails (then the stream's time stands alone). */
static double time_graph(rd_backend *be, call_fn pre, call_fn fn, void *ctx, int32_t n, int32_t launches)
{
    if (!be->ops->graph_begin || !be->ops->graph_end || !be->ops->graph_launch || !be->ops->graph_free)
        return -2;
    void *g = NULL;
    if (be->ops->graph_begin(be))
        return -1;
    if (pre)
        pre(ctx);
    for (int32_t i = 0; i < n; i++)
        fn(ctx);
    int rc = be->ops->graph_end(be, &g);
    if (!rc && !g)
        rc = -1;
    if (!rc)
        rc = be->ops->graph_launch(be, g);
    if (!rc)
        rc = be->ops->sync(be);
    double t0 = clock_now_s();
    for (int32_t i = 0; i < launches && !rc; i++)
        rc = be->ops->graph_launch(be, g);
    if (!rc)
        rc = be->ops->sync(be);
    const double t = clock_now_s() - t0;
    if (g)
        be->ops->graph_free(be, g);
    return rc ? -1 : t / ((double)launches * n);
}

typedef struct {
    rd_backend *be;
    void *const *w;             /* [copies] the same weight */
    int32_t copies, next;
    const float *xsrc, *ones;   /* the RMSNorm that makes x (in a graph, its first node) */
    int32_t in;
    float *x, *y;
    int32_t m;
} gemm_call;

static void gemm_call_fn(void *ctx)
{
    gemm_call *g = ctx;
    g->be->ops->linear(g->be, g->w[g->next], g->x, g->m, g->y, 0);
    g->next = (g->next + 1) % g->copies;
}

static void gemm_pre_fn(void *ctx)
{
    gemm_call *g = ctx;
    g->be->ops->rmsnorm(g->be, g->xsrc, g->ones, g->m, g->in, 1e-5f, 0.0f, g->x);
}

typedef struct {
    double us, us_stream, gbps, tflops, wbytes;
    int32_t reps, bad_rows;
    int done, graph;
} gres;

/* A point's cell in the side-by-side table: time, GB/s, fraction of the copy bandwidth bw, TFLOP/s ("-": not
 * measured). */
static void gres_cell(const gres *g, double bw, char *cell, size_t cap)
{
    if (!g->done)
        snprintf(cell, cap, "-");
    else
        snprintf(cell, cap, "%.1f us %.0f GB/s %.2fx %.1f TF", g->us, g->gbps, bw > 0 ? g->gbps / bw : 0.0, g->tflops);
}

/* A run of variants (gemm, moe): what each is measured against (the first backend's description, the
 * copy bandwidth and the peak), the JSON document's variants and points, and the verdicts. */
typedef struct {
    const opts *o;
    const char *what;           /* "gemm" or "moe": the command, in printed lines */
    double bw, peak;            /* GB/s and TFLOP/s: given, or measured / assumed on the first backend */
    const char *peak_why;
    char desc0[4096];           /* the first backend's describe() */
    const char *be_name;
    cJSON *doc, *jv, *jr;       /* the document, its "variants" and "results" arrays */
    int setup_err, all_invariant;
} vrun;

static void vrun_init(vrun *r, const opts *o, const char *what)
{
    memset(r, 0, sizeof *r);
    r->o = o, r->what = what, r->bw = o->bw, r->peak = o->peak_tflops;
    r->peak_why = "given by --peak-tflops";
    r->be_name = o->backend;
    r->doc = cJSON_CreateObject();
    r->jv = cJSON_AddArrayToObject(r->doc, "variants");
    r->jr = cJSON_AddArrayToObject(r->doc, "results");
    r->all_invariant = 1;
}

/* Variant v's JSON entry (*jvar), then its backend, created under its environment (env_apply first), with
 * its description in desc; NULL if it cannot be made (the error recorded). The first variant's backend
 * measures the copy bandwidth and names the peak where the command line did not. */
static rd_backend *vrun_open(vrun *r, const gvariant *v, int first, cJSON **jvar, char *desc, size_t cap)
{
    *jvar = cJSON_CreateObject();
    cJSON_AddStringToObject(*jvar, "name", v->name);
    cJSON_AddBoolToObject(*jvar, "fp8", v->wtype == RD_TYPE_FP8_B32);
    cJSON_AddBoolToObject(*jvar, "q8_0", v->wtype == GGML_Q8_0);
    cJSON *je = cJSON_AddObjectToObject(*jvar, "env");
    for (int j = 0; j < v->n_env; j++)
        cJSON_AddStringToObject(je, v->var[j], v->val[j]);
    cJSON_AddItemToArray(r->jv, *jvar);
    rd_backend *be = NULL;
    desc[0] = 0;
    if (rd_backend_create(r->o->backend, r->o->threads, &be)) {
        printf("variant %s: backend: %s\n", v->name, rd_errmsg());
        printf("TABLE|%s invariance|%s|no backend: %.120s|ERROR|\n", r->what, v->name, rd_errmsg());
        cJSON_AddStringToObject(*jvar, "error", rd_errmsg());
        r->setup_err = 1;
        return NULL;
    }
    r->be_name = be->ops->name;
    if (be->ops->describe)
        be->ops->describe(be, desc, cap);
    if (first) {
        snprintf(r->desc0, sizeof r->desc0, "%s", desc);
        if (!(r->bw > 0) && copy_bw(be, r->o->mib, r->o->iters, &r->bw))
            r->bw = 0;
        if (!(r->peak > 0))
            r->peak = peak_for(desc, &r->peak_why);
        printf("%s on %s: %s\ncopy bandwidth %.1f GB/s; peak %s\n", r->what, be->ops->name, desc, r->bw, r->peak_why);
    }
    return be;
}

/* Point g's measurements into e (which already says what was measured), added to the results. */
static void vrun_point(vrun *r, cJSON *e, const gres *g)
{
    cJSON_AddNumberToObject(e, "us", g->us);
    cJSON_AddNumberToObject(e, "us_stream", g->us_stream);
    cJSON_AddBoolToObject(e, "graph", g->graph);
    cJSON_AddNumberToObject(e, "reps", g->reps);
    cJSON_AddNumberToObject(e, "gbps", g->gbps);
    if (r->bw > 0)
        cJSON_AddNumberToObject(e, "x_copy", g->gbps / r->bw);
    cJSON_AddNumberToObject(e, "tflops", g->tflops);
    if (r->peak > 0)
        cJSON_AddNumberToObject(e, "x_peak", g->tflops / r->peak);
    cJSON_AddBoolToObject(e, "invariant", g->bad_rows == 0);
    cJSON_AddNumberToObject(e, "rows_differing", g->bad_rows);
    cJSON_AddItemToArray(r->jr, e);
}

/* The document's references and verdicts so far (vrun_finish's, and each snapshot's). */
static void vrun_fill(const vrun *r, cJSON *doc)
{
    cJSON_AddStringToObject(doc, "backend", r->be_name);
    cJSON_AddStringToObject(doc, "describe", r->desc0);
    cJSON_AddNumberToObject(doc, "copy_gbps", r->bw);
    cJSON_AddNumberToObject(doc, "peak_tflops", r->peak);
    cJSON_AddStringToObject(doc, "peak_assumption", r->peak_why);
    cJSON_AddBoolToObject(doc, "invariant", r->all_invariant);
    cJSON_AddBoolToObject(doc, "pass", r->all_invariant && !r->setup_err);
}

/* Variant v's verdicts: rc its error (0: none, rd_errmsg() says it), var_bad the rows of m-row calls that
 * differ from them alone over what `checked` names; its entry and TABLE line. */
static void vrun_close(vrun *r, const gvariant *v, cJSON *jvar, const char *desc, int rc, int32_t var_bad,
                       const char *checked)
{
    char err[256] = "";
    if (rc) {
        snprintf(err, sizeof err, "%s", rd_errmsg());
        printf("variant %s: %s\n", v->name, err);
        cJSON_AddStringToObject(jvar, "error", err);
        r->setup_err = 1;
    }
    cJSON_AddStringToObject(jvar, "describe", desc);
    cJSON_AddBoolToObject(jvar, "invariant", var_bad == 0);
    cJSON_AddNumberToObject(jvar, "rows_differing", var_bad);
    r->all_invariant &= var_bad == 0;
    if (rc && !var_bad)
        printf("TABLE|%s invariance|%s|stopped: %.120s|ERROR|\n", r->what, v->name, err);
    else
        printf("TABLE|%s invariance|%s|%s: %s|%s|\n", r->what, v->name, checked,
               var_bad ? "rows differ" : "bit-identical", var_bad ? "FAIL" : "PASS");
    if (r->o->json) {
        cJSON *snap = cJSON_Duplicate(r->doc, 1);
        if (snap)
            vrun_fill(r, snap);
        write_snapshot(r->o, snap);
    }
    fault_abort_point();
}

/* The document's references and verdicts, written to --json. The exit status: 1 if a variant was not batch
 * invariant, 3 if one stopped, else write_json's. */
static int vrun_finish(vrun *r)
{
    printf("%s batch invariance %s%s\n", r->what, r->all_invariant ? "PASS" : "FAIL",
           r->setup_err ? " where measured; a variant stopped (see above): exit 3" : "");
    vrun_fill(r, r->doc);
    cJSON_AddBoolToObject(r->doc, "complete", 1);
    int wj = write_json(r->o, r->doc);
    return !r->all_invariant ? 1 : r->setup_err ? 3 : wj;
}

/* Random bf16-valued floats of std 0.02 (weights) or uniform in [-1, 1) (inputs). */
static void fill_random(float *x, size_t n, uint64_t seed, float scale)
{
    for (size_t i = 0; i < n; i++)
        x[i] = rd_bf16_to_f32(rd_f32_to_bf16((float)((double)(mix(&seed) >> 40) * (1.0 / 16777216.0) * 2.0 - 1.0) *
                                             scale));
}

static int cmd_gemm(const opts *o)
{
    gshape sh[GEMM_MAX_SHAPES];
    int ns = 0;
    if (o->synthetic) {
        char buf[256];
        snprintf(buf, sizeof buf, "%s", o->synthetic);
        for (char *save = NULL, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
            model_config c;
            if (synth_config(t, &c)) {
                fprintf(stderr, "%s gemm: --synthetic expects a list of " SYNTH_NAMES ", not '%s'\n", P, t);
                return 2;
            }
            ns = model_shapes(t, &c, sh, GEMM_MAX_SHAPES, ns);
        }
    }
    if (o->shapes && (ns = parse_shapes(o->shapes, sh, GEMM_MAX_SHAPES, ns)) < 0) {
        fprintf(stderr, "%s gemm: --shapes expects OUTxIN,... (e.g. 3072x2048,2048x8192), got '%s'\n", P, o->shapes);
        return 2;
    }
    if (ns == 0) { /* the 1B's */
        model_config c;
        synth_config("1b", &c);
        ns = model_shapes("1b", &c, sh, GEMM_MAX_SHAPES, 0);
    }
    int32_t def_rows[] = {1, 8, 32, 128, 256, 512};
    const int32_t *rows = o->rows ? o->rows : def_rows, nr = o->rows ? o->n_rows : 6;
    int32_t maxm = 0;
    for (int32_t i = 0; i < nr; i++)
        maxm = rows[i] > maxm ? rows[i] : maxm;
    gvariant vs[GEMM_MAX_VARIANTS];
    int nv = 0;
    {
        char buf[512];
        snprintf(buf, sizeof buf, "%s", o->variants ? o->variants : "default");
        for (char *save = NULL, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
            if (nv == GEMM_MAX_VARIANTS || parse_variant(t, &vs[nv])) {
                fprintf(stderr, "%s gemm: bad variant '%s' (at most %d of: default, tc, simple, bf16act, mixed, "
                                "fp8, fp8tc, w8a8, q8tc, q8w8a8, tcbf16, VAR=value, joined by '+')\n", P, t, GEMM_MAX_VARIANTS);
                return 2;
            }
            nv++;
        }
    }
    genv_save sv;
    env_save(&sv, vs, nv);
    gres *res = calloc((size_t)nv * ns * nr, sizeof *res);
    float **wh = calloc(ns, sizeof *wh);  /* host weights, made once per shape */
    uint8_t **wq = calloc(ns, sizeof *wq); /* their FP8 or Q8_0 blocks, when a variant asks */
    int32_t *wq_type = calloc(ns, sizeof *wq_type); /* which of the two wq[s] holds */
    size_t maxo = 0, maxi = 0;
    for (int s = 0; s < ns; s++) {
        maxo = (size_t)sh[s].out > maxo ? (size_t)sh[s].out : maxo;
        maxi = (size_t)sh[s].in > maxi ? (size_t)sh[s].in : maxi;
    }
    float *xh = malloc(sizeof(float) * maxm * maxi), *alone = malloc(sizeof(float) * maxm * maxo),
          *got = malloc(sizeof(float) * maxm * maxo);
    if (!res || !wh || !wq || !wq_type || !xh || !alone || !got) {
        fprintf(stderr, "%s gemm: out of host memory\n", P);
        return 3;
    }
    fill_random(xh, (size_t)maxm * maxi, 99, 1.0f);
    vrun run;
    vrun_init(&run, o, "gemm");
    cJSON *jrows = cJSON_AddArrayToObject(run.doc, "rows"); /* (first: the snapshots after each variant too) */
    for (int32_t i = 0; i < nr; i++)
        cJSON_AddItemToArray(jrows, cJSON_CreateNumber(rows[i]));
    cJSON *jsh = cJSON_AddArrayToObject(run.doc, "shapes");
    for (int s = 0; s < ns; s++) {
        cJSON *e = cJSON_CreateObject();
        cJSON_AddStringToObject(e, "name", sh[s].name);
        cJSON_AddNumberToObject(e, "out", sh[s].out);
        cJSON_AddNumberToObject(e, "in", sh[s].in);
        cJSON_AddItemToArray(jsh, e);
    }
    for (int vi = 0; vi < nv; vi++) {
        const gvariant *v = &vs[vi];
        env_apply(&sv, v);
        cJSON *jvar;
        char desc[4096];
        rd_backend *be = vrun_open(&run, v, vi == 0, &jvar, desc, sizeof desc);
        if (!be)
            continue;
        if (vi == 0) {
            printf("(us: per call inside a backend graph of calls where the backend has graphs, as a decode step "
                   "runs them; the JSON's us_stream: launched one by one)\n");
            printf("(TFLOP/s counts 2 x rows x out x in per call: the split fp32 input of the default doubles what "
                   "a kernel computes. The input is an RMSNorm's output, whose bf16 copy the CUDA backend's linear "
                   "reads, as in a decode step; the default's split sum, which a step defers into the next kernel, "
                   "runs as a kernel of its own between calls here)\n");
        }
        /* The input as a decode step has it: the output of an RMSNorm (of random rows, weight 1), for which
         * the CUDA backend keeps a bf16 copy that its linear reads instead of converting x. */
        float *xsrc = be->ops->alloc(be, sizeof(float) * maxm * maxi), *x = be->ops->alloc(be, sizeof(float) * maxm * maxi);
        float *y = be->ops->alloc(be, sizeof(float) * maxm * maxo), *ones = be->ops->alloc(be, sizeof(float) * maxi);
        int rc = xsrc && x && y && ones ? be->ops->h2d(be, xsrc, xh, sizeof(float) * maxm * maxi)
                                        : rd_fail(RD_ENOMEM, "device buffers");
        float *ones_h = rc ? NULL : malloc(sizeof(float) * maxi);
        for (size_t i = 0; ones_h && i < maxi; i++)
            ones_h[i] = 1.0f;
        if (!rc)
            rc = ones_h ? be->ops->h2d(be, ones, ones_h, sizeof(float) * maxi) : rd_fail(RD_ENOMEM, "host buffer");
        free(ones_h);
        int32_t var_bad = 0;
        for (int s = 0; s < ns && !rc; s++) {
            const size_t n = (size_t)sh[s].out * sh[s].in;
            if (!wh[s]) {
                wh[s] = malloc(sizeof(float) * n);
                if (!wh[s]) {
                    rc = rd_fail(RD_ENOMEM, "host weights");
                    break;
                }
                fill_random(wh[s], n, 1000 + (uint64_t)s, 0.02f * 1.7320508f);
            }
            if (v->wtype && sh[s].in % 32) {
                printf("variant %s, %s: in %d is not a multiple of 32: no blocks\n", v->name, sh[s].name, sh[s].in);
                continue;
            }
            if (v->wtype && wq_type[s] != v->wtype) {
                free(wq[s]);
                wq_type[s] = v->wtype;
                if (!(wq[s] = malloc((size_t)sh[s].out * ggml_row_bytes(v->wtype, (uint64_t)sh[s].in))) ||
                    (v->wtype == GGML_Q8_0 ? ggml_quant_q8_0(wh[s], n, wq[s]) : rd_fp8_quant(wh[s], n, wq[s]))) {
                    rc = rd_fail(RD_ENOMEM, "weight blocks");
                    break;
                }
            }
            void *hs[MAX_COPIES] = {0};
            int32_t copies = 1;
            double wbytes = 0;
            for (int32_t k = 0; k < copies; k++) {
                if (v->wtype) {
                    rd_wpart part = {.type = v->wtype, .rows = sh[s].out, .data = wq[s]};
                    rc = be->ops->linear_load_q ? be->ops->linear_load_q(be, &part, 1, sh[s].in, &hs[k])
                                                : rd_fail(RD_ENOTSUP, "backend %s has no linear_load_q", be->ops->name);
                } else {
                    rc = be->ops->linear_load(be, wh[s], sh[s].out, sh[s].in, &hs[k]);
                }
                if (rc && k > 0) { /* out of memory for more copies: time with those there are */
                    rc = 0;
                    copies = k;
                    break;
                }
                if (rc)
                    break;
                if (k == 0) {
                    wbytes = lin_bytes(be, hs[0]);
                    copies = copies_for(o, wbytes);
                }
            }
            if (rc)
                break;
            void *h = hs[0];
            const int32_t out = sh[s].out, in = sh[s].in;
            /* the rows alone: m = 1 calls, then one copy back (first one call per copy, so that whatever a
             * backend prepares on a weight's first use is not timed) */
            be->ops->rmsnorm(be, xsrc, ones, maxm, in, 1e-5f, 0.0f, x);
            for (int32_t k = 1; k < copies; k++)
                be->ops->linear(be, hs[k], x, 1, y, 0);
            for (int32_t i = 0; i < maxm; i++)
                be->ops->linear(be, h, x + (size_t)i * in, 1, y + (size_t)i * out, 0);
            rc = be->ops->d2h(be, alone, y, sizeof(float) * (size_t)maxm * out);
            if (!rc)
                rc = be->ops->sync(be);
            for (int32_t ri = 0; ri < nr && !rc; ri++) {
                const int32_t m = rows[ri];
                be->ops->rmsnorm(be, xsrc, ones, m, in, 1e-5f, 0.0f, x); /* the same rows, and an m-row bf16 copy */
                gemm_call gc = {be, hs, copies, 0, xsrc, ones, in, x, y, m};
                gres *g = &res[((size_t)vi * ns + s) * nr + ri];
                const double t_stream = time_calls(be, gemm_call_fn, &gc, o->reps, &g->reps);
                if (t_stream < 0) {
                    rc = RD_EINVAL;
                    break;
                }
                if ((rc = be->ops->d2h(be, got, y, sizeof(float) * (size_t)m * out)) || (rc = be->ops->sync(be)))
                    break;
                if (fault_invariance() && vi == 0 && s == 0 && ri == nr - 1) {
                    uint32_t bits;
                    memcpy(&bits, got, 4);
                    bits ^= 1;
                    memcpy(got, &bits, 4);
                }
                g->bad_rows = rows_differ(got, alone, m, out);
                /* then as a graph of as many calls (at least one per copy), its output checked as well */
                gc.next = 0;
                const int32_t n_graph = g->reps > copies ? g->reps : copies;
                const double t_graph = time_graph(be, gemm_pre_fn, gemm_call_fn, &gc, n_graph, 3);
                if (t_graph >= 0) {
                    if ((rc = be->ops->d2h(be, got, y, sizeof(float) * (size_t)m * out)) || (rc = be->ops->sync(be)))
                        break;
                    const int32_t bad = rows_differ(got, alone, m, out);
                    g->bad_rows = bad > g->bad_rows ? bad : g->bad_rows;
                } else if (t_graph == -1) {
                    printf("variant %s, %s, %d rows: no graph timing (%s)\n", v->name, sh[s].name, m, rd_errmsg());
                }
                const double t = t_graph >= 0 ? t_graph : t_stream;
                g->us_stream = t_stream * 1e6;
                g->graph = t_graph >= 0;
                g->us = t * 1e6;
                g->wbytes = wbytes;
                g->gbps = wbytes / t / 1e9;
                g->tflops = 2.0 * m * (double)out * in / t / 1e12;
                g->done = 1;
                var_bad += g->bad_rows;
                cJSON *e = cJSON_CreateObject();
                cJSON_AddStringToObject(e, "shape", sh[s].name);
                cJSON_AddNumberToObject(e, "out", out);
                cJSON_AddNumberToObject(e, "in", in);
                cJSON_AddNumberToObject(e, "rows", m);
                cJSON_AddStringToObject(e, "variant", v->name);
                cJSON_AddNumberToObject(e, "weight_bytes", wbytes);
                cJSON_AddNumberToObject(e, "copies", copies);
                vrun_point(&run, e, g);
            }
            for (int32_t k = 0; k < copies; k++)
                be->ops->linear_free(be, hs[k]);
        }
        /* after the calls: the backend names each shape's GEMM choice once it has made it */
        if (be->ops->describe)
            be->ops->describe(be, desc, sizeof desc);
        printf("variant %s: %s\n", v->name, desc);
        char checked[96];
        snprintf(checked, sizeof checked, "rows of %d..%d-row calls vs alone, %d shapes", rows[0], maxm, ns);
        vrun_close(&run, v, jvar, desc, rc, var_bad, checked);
        if (var_bad)
            printf("variant %-12s batch invariance FAIL: %d rows of m-row calls differ from the same rows computed "
                   "alone (m = 1)\n", v->name, var_bad);
        else if (!rc)
            printf("variant %-12s batch invariance PASS: the rows of every m-row call equal, bit for bit, the same "
                   "rows computed alone (m = 1)\n", v->name);
        if (xsrc) be->ops->free(be, xsrc);
        if (x) be->ops->free(be, x);
        if (y) be->ops->free(be, y);
        if (ones) be->ops->free(be, ones);
        rd_backend_destroy(be);
    }
    env_apply(&sv, NULL);
    /* side by side: one line per (shape, rows), the variants across */
    printf("\n%-22s %5s", "shape", "rows");
    for (int vi = 0; vi < nv; vi++)
        printf(" | %-28s", vs[vi].name);
    printf("\n");
    for (int s = 0; s < ns; s++)
        for (int32_t ri = 0; ri < nr; ri++) {
            char cells[4096];
            int k = 0;
            cells[0] = 0;
            printf("%-22s %5d", sh[s].name, rows[ri]);
            for (int vi = 0; vi < nv; vi++) {
                const gres *g = &res[((size_t)vi * ns + s) * nr + ri];
                char cell[160];
                gres_cell(g, run.bw, cell, sizeof cell);
                printf(" | %-28s", cell);
                if (g->done && k < (int)sizeof cells) /* the table's cell: time and fraction of the copy bandwidth */
                    k += snprintf(cells + k, sizeof cells - k, "%s%s %.1fus %.2fx", vi ? "; " : "", vs[vi].name,
                                  g->us, run.bw > 0 ? g->gbps / run.bw : 0.0);
            }
            printf("\n");
            if (ri != 0 && ri != nr - 1) /* run.sh's final table: the fewest and the most rows (all in the JSON) */
                continue;
            char dims[32];
            snprintf(dims, sizeof dims, "%dx%d", sh[s].out, sh[s].in);
            printf("TABLE|gemm %s%s%s|rows %d|%s|\n", sh[s].name, strcmp(sh[s].name, dims) ? " " : "",
                   strcmp(sh[s].name, dims) ? dims : "", rows[ri], cells);
        }
    printf("(GB/s: the weight's bytes as the backend holds them / time; x: of the copy bandwidth %.1f GB/s; "
           "TF: TFLOP/s%s)\n", run.bw, run.peak > 0 ? ", against the peak above" : "");
    for (int s = 0; s < ns; s++)
        free(wh[s]), free(wq[s]);
    free(wh), free(wq), free(wq_type), free(xh), free(alone), free(got), free(res);
    env_free(&sv);
    return vrun_finish(&run);
}

/* ------------------------------------------------------------------ MoE experts */

#define MOE_SETS 16         /* route sets the timed calls take in turn */
#define MOE_HOST_EXPERTS 4  /* distinct host weights, loaded round-robin into the layer's experts */

typedef struct {
    rd_backend *be;
    const rd_moe *moe;
    const float *x;
    int32_t *const *ids;    /* [MOE_SETS] device [m][k] */
    float *const *w;        /* [MOE_SETS] device [m][k] */
    int32_t m, k, next;
    float *y;
} moe_call;

static void moe_call_fn(void *ctx)
{
    moe_call *c = ctx;
    c->be->ops->moe_ffn(c->be, c->moe, c->x, c->ids[c->next], c->w[c->next], c->m, c->k, c->y);
    c->next = (c->next + 1) % MOE_SETS;
}

/* m rows' routes: k distinct experts each, uniform (a trained router's are
 * not, so this touches as many experts as a batch can), and positive
 * weights that sum to 1. Returns the distinct experts touched. */
static int32_t moe_routes(int32_t m, int32_t k, int32_t E, uint64_t seed, int32_t *ids, float *w, uint8_t *seen)
{
    memset(seen, 0, (size_t)E);
    int32_t touched = 0;
    for (int32_t i = 0; i < m; i++) {
        float sum = 0.0f;
        for (int32_t j = 0; j < k; j++) {
            int32_t e, dup;
            do {
                e = (int32_t)(mix(&seed) % (uint64_t)E);
                dup = 0;
                for (int32_t q = 0; q < j; q++)
                    dup |= ids[i * k + q] == e;
            } while (dup);
            ids[i * k + j] = e;
            touched += !seen[e];
            seen[e] = 1;
            w[i * k + j] = 0.5f + (float)(mix(&seed) >> 40) / 16777216.0f;
            sum += w[i * k + j];
        }
        for (int32_t j = 0; j < k; j++)
            w[i * k + j] /= sum;
    }
    return touched;
}

/* moe_ffn alone, one layer of a MoE shape (default Qwen3-30B-A3B's: 128
 * experts of 768 x 2048, top 8), per row count and variant: time per call
 * (in a graph of calls, route sets taken in turn so that a small batch's
 * experts change from call to call, as from layer to layer), the bytes of
 * the experts the routes touch / time against the copy bandwidth, and
 * 6 m k ffn dim / time against the peak. Every m-row call's rows must equal
 * the same rows computed alone. */
static int cmd_moe(const opts *o)
{
    const char *which = o->synthetic ? o->synthetic : "qwen3-30b-a3b";
    model_config c;
    if (synth_config(which, &c) || c.n_experts <= 0) {
        fprintf(stderr, "%s moe: --synthetic expects a MoE shape (qwen3-30b-a3b, moe-tiny), not '%s'\n", P, which);
        return 2;
    }
    const int32_t E = c.n_experts, k = c.n_experts_used, f = c.expert_ffn_dim, d = c.dim;
    int32_t def_rows[] = {1, 8, 64, 256, 512};
    const int32_t *rows = o->rows ? o->rows : def_rows, nr = o->rows ? o->n_rows : 5;
    int32_t maxm = 0;
    for (int32_t i = 0; i < nr; i++)
        maxm = rows[i] > maxm ? rows[i] : maxm;
    gvariant vs[GEMM_MAX_VARIANTS];
    int nv = 0;
    {
        char buf[512];
        snprintf(buf, sizeof buf, "%s", o->variants ? o->variants : "default,moetc");
        for (char *save = NULL, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
            if (nv == GEMM_MAX_VARIANTS || parse_variant(t, &vs[nv]) || vs[nv].wtype == RD_TYPE_FP8_B32) {
                fprintf(stderr, "%s moe: bad variant '%s' (at most %d of: default, moetc, q8tc, tc, VAR=value, "
                                "joined by '+'; experts take no FP8)\n", P, t, GEMM_MAX_VARIANTS);
                return 2;
            }
            nv++;
        }
    }
    genv_save sv;
    env_save(&sv, vs, nv);
    const size_t ngu = (size_t)2 * f * d, ndn = (size_t)d * f, nx = (size_t)maxm * d;
    float *gu = malloc(sizeof(float) * ngu * MOE_HOST_EXPERTS), *dn = malloc(sizeof(float) * ndn * MOE_HOST_EXPERTS);
    uint8_t *qgu = NULL, *qdn = NULL;
    float *xh = malloc(sizeof(float) * nx), *zeros = calloc(nx, sizeof(float)), *alone = malloc(sizeof(float) * nx);
    float *got = malloc(sizeof(float) * nx), *wh = malloc(sizeof(float) * MOE_SETS * maxm * k);
    int32_t *idh = malloc(sizeof(int32_t) * MOE_SETS * maxm * k);
    uint8_t *seen = malloc((size_t)E);
    gres *res = calloc((size_t)nv * nr, sizeof *res);
    if (!gu || !dn || !xh || !zeros || !alone || !got || !wh || !idh || !seen || !res) {
        fprintf(stderr, "%s moe: out of host memory\n", P);
        return 3;
    }
    fill_random(gu, ngu * MOE_HOST_EXPERTS, 2000, 0.02f * 1.7320508f);
    fill_random(dn, ndn * MOE_HOST_EXPERTS, 3000, 0.02f * 1.7320508f);
    fill_random(xh, nx, 99, 1.0f);
    vrun run;
    vrun_init(&run, o, "moe");
    cJSON *js = cJSON_AddObjectToObject(run.doc, "moe_shape"); /* (first: the snapshots after each variant too) */
    cJSON_AddStringToObject(js, "name", which);
    cJSON_AddNumberToObject(js, "experts", E);
    cJSON_AddNumberToObject(js, "k", k);
    cJSON_AddNumberToObject(js, "ffn", f);
    cJSON_AddNumberToObject(js, "dim", d);
    for (int vi = 0; vi < nv; vi++) {
        const gvariant *v = &vs[vi];
        env_apply(&sv, v);
        cJSON *jvar;
        char desc[4096];
        rd_backend *be = vrun_open(&run, v, vi == 0, &jvar, desc, sizeof desc);
        if (!be)
            continue;
        if (vi == 0) {
            printf("%s's experts: %d of [%d x %d] gate|up and [%d x %d] down, top %d\n", which, E, 2 * f, d, d, f, k);
        }
        int rc = be->ops->moe_ffn ? 0 : rd_fail(RD_ENOTSUP, "backend %s has no moe_ffn", be->ops->name);
        if (!rc && v->wtype == GGML_Q8_0 && !qgu) {
            qgu = malloc(ngu * MOE_HOST_EXPERTS / 32 * 34), qdn = malloc(ndn * MOE_HOST_EXPERTS / 32 * 34);
            rc = qgu && qdn ? 0 : rd_fail(RD_ENOMEM, "host Q8_0 blocks");
            if (!rc)
                rc = ggml_quant_q8_0(gu, ngu * MOE_HOST_EXPERTS, qgu);
            if (!rc)
                rc = ggml_quant_q8_0(dn, ndn * MOE_HOST_EXPERTS, qdn);
        }
        void **hgu = calloc((size_t)E, sizeof(void *)), **hdn = calloc((size_t)E, sizeof(void *));
        if (!rc && (!hgu || !hdn))
            rc = rd_fail(RD_ENOMEM, "handle arrays");
        for (int32_t e = 0; e < E && !rc; e++) {
            const int32_t s = e % MOE_HOST_EXPERTS;
            if (v->wtype == GGML_Q8_0) {
                rd_wpart pg = {.type = GGML_Q8_0, .rows = 2 * f, .data = qgu + ngu * s / 32 * 34};
                rd_wpart pd = {.type = GGML_Q8_0, .rows = d, .data = qdn + ndn * s / 32 * 34};
                rc = be->ops->linear_load_q ? be->ops->linear_load_q(be, &pg, 1, d, &hgu[e])
                                            : rd_fail(RD_ENOTSUP, "backend %s has no linear_load_q", be->ops->name);
                if (!rc)
                    rc = be->ops->linear_load_q(be, &pd, 1, f, &hdn[e]);
            } else {
                rc = be->ops->linear_load(be, gu + ngu * s, 2 * f, d, &hgu[e]);
                if (!rc)
                    rc = be->ops->linear_load(be, dn + ndn * s, d, f, &hdn[e]);
            }
        }
        const rd_moe moe = {.n_experts = E, .ffn = f, .dim = d, .gate_up = hgu, .down = hdn};
        const double expert_bytes = rc ? 0 : lin_bytes(be, hgu[0]) + lin_bytes(be, hdn[0]);
        float *x = rc ? NULL : be->ops->alloc(be, sizeof(float) * nx), *y = rc ? NULL : be->ops->alloc(be, sizeof(float) * nx);
        int32_t *dids[MOE_SETS] = {0};
        float *dw[MOE_SETS] = {0};
        for (int q = 0; q < MOE_SETS && !rc; q++) {
            dids[q] = be->ops->alloc(be, sizeof(int32_t) * maxm * k);
            dw[q] = be->ops->alloc(be, sizeof(float) * maxm * k);
            if (!dids[q] || !dw[q])
                rc = rd_fail(RD_ENOMEM, "device routes");
        }
        if (!rc)
            rc = x && y ? be->ops->h2d(be, x, xh, sizeof(float) * nx) : rd_fail(RD_ENOMEM, "device buffers");
        int32_t var_bad = 0;
        for (int32_t ri = 0; ri < nr && !rc; ri++) {
            const int32_t m = rows[ri];
            const size_t nr_k = (size_t)m * k;
            double touched = 0;
            for (int q = 0; q < MOE_SETS && !rc; q++) {
                touched += moe_routes(m, k, E, 7000 + 131 * (uint64_t)q + (uint64_t)m, idh + q * nr_k, wh + q * nr_k,
                                      seen);
                rc = be->ops->h2d(be, dids[q], idh + q * nr_k, sizeof(int32_t) * nr_k);
                if (!rc)
                    rc = be->ops->h2d(be, dw[q], wh + q * nr_k, sizeof(float) * nr_k);
            }
            touched /= MOE_SETS;
            /* the rows alone (route set 0), then all m at once */
            if (!rc)
                rc = be->ops->h2d(be, y, zeros, sizeof(float) * (size_t)m * d);
            for (int32_t i = 0; i < m && !rc; i++)
                be->ops->moe_ffn(be, &moe, x + (size_t)i * d, dids[0] + (size_t)i * k, dw[0] + (size_t)i * k, 1, k,
                                 y + (size_t)i * d);
            if (!rc)
                rc = be->ops->d2h(be, alone, y, sizeof(float) * (size_t)m * d);
            if (!rc)
                rc = be->ops->h2d(be, y, zeros, sizeof(float) * (size_t)m * d);
            if (!rc)
                be->ops->moe_ffn(be, &moe, x, dids[0], dw[0], m, k, y);
            if (!rc && !(rc = be->ops->d2h(be, got, y, sizeof(float) * (size_t)m * d)))
                rc = be->ops->sync(be);
            if (rc)
                break;
            if (fault_invariance() && vi == 0 && ri == nr - 1) {
                uint32_t bits;
                memcpy(&bits, got, 4);
                bits ^= 1;
                memcpy(got, &bits, 4);
            }
            gres *g = &res[(size_t)vi * nr + ri];
            g->bad_rows = rows_differ(got, alone, m, d);
            moe_call mc = {be, &moe, x, dids, dw, m, k, 0, y};
            const double t_stream = time_calls(be, moe_call_fn, &mc, o->reps, &g->reps);
            if (t_stream < 0) {
                rc = RD_EINVAL;
                break;
            }
            mc.next = 0;
            const int32_t n_graph = g->reps > MOE_SETS ? g->reps : MOE_SETS;
            const double t_graph = time_graph(be, NULL, moe_call_fn, &mc, n_graph, 3);
            if (t_graph == -1)
                printf("variant %s, %d rows: no graph timing (%s)\n", v->name, m, rd_errmsg());
            const double t = t_graph >= 0 ? t_graph : t_stream;
            g->us_stream = t_stream * 1e6;
            g->graph = t_graph >= 0;
            g->us = t * 1e6;
            g->wbytes = touched * expert_bytes;
            g->gbps = g->wbytes / t / 1e9;
            g->tflops = 6.0 * m * k * (double)f * d / t / 1e12;
            g->done = 1;
            var_bad += g->bad_rows;
            cJSON *e = cJSON_CreateObject();
            cJSON_AddNumberToObject(e, "rows", m);
            cJSON_AddStringToObject(e, "variant", v->name);
            cJSON_AddNumberToObject(e, "experts_touched", touched);
            cJSON_AddNumberToObject(e, "expert_bytes", expert_bytes);
            cJSON_AddNumberToObject(e, "active_bytes", g->wbytes);
            vrun_point(&run, e, g);
        }
        char checked[96];
        snprintf(checked, sizeof checked, "rows of %d..%d-row calls vs alone", rows[0], maxm);
        vrun_close(&run, v, jvar, desc, rc, var_bad, checked);
        for (int q = 0; q < MOE_SETS; q++) {
            if (dids[q]) be->ops->free(be, dids[q]);
            if (dw[q]) be->ops->free(be, dw[q]);
        }
        if (x) be->ops->free(be, x);
        if (y) be->ops->free(be, y);
        if (hgu && hdn && be->ops->moe_release)
            be->ops->moe_release(be, &moe);
        for (int32_t e = 0; e < E; e++) {
            if (hgu && hgu[e]) be->ops->linear_free(be, hgu[e]);
            if (hdn && hdn[e]) be->ops->linear_free(be, hdn[e]);
        }
        free(hgu), free(hdn);
        rd_backend_destroy(be);
    }
    env_apply(&sv, NULL);
    printf("\n%5s", "rows");
    for (int vi = 0; vi < nv; vi++)
        printf(" | %-34s", vs[vi].name);
    printf("\n");
    for (int32_t ri = 0; ri < nr; ri++) {
        char cells[2048];
        int n = 0;
        cells[0] = 0;
        printf("%5d", rows[ri]);
        for (int vi = 0; vi < nv; vi++) {
            const gres *g = &res[(size_t)vi * nr + ri];
            char cell[160];
            gres_cell(g, run.bw, cell, sizeof cell);
            printf(" | %-34s", cell);
            if (g->done && n < (int)sizeof cells)
                n += snprintf(cells + n, sizeof cells - n, "%s%s %.1fus %.2fx %.1fTF", vi ? "; " : "", vs[vi].name, g->us,
                              run.bw > 0 ? g->gbps / run.bw : 0.0, g->tflops);
        }
        printf("\n");
        printf("TABLE|moe %s|rows %d|%s|\n", which, rows[ri], cells);
    }
    printf("(GB/s: the bytes of the experts the routes touch, as the backend holds them / time; x: of the copy "
           "bandwidth %.1f GB/s; TF: 6 x rows x k x ffn x dim / time)\n", run.bw);
    free(gu), free(dn), free(qgu), free(qdn), free(xh), free(zeros), free(alone), free(got), free(wh), free(idh);
    free(seen), free(res);
    env_free(&sv);
    return vrun_finish(&run);
}

/* ------------------------------------------------------------------ attention at long context */

typedef struct {
    rd_backend *be;
    const rd_attn_shape *a;
    const float *q;
    int32_t stride;
    const rd_step_dev *sd;
    float *const *k, *const *v; /* [copies] caches of the same K/V */
    int32_t copies, next;
    float *out;
} attn_call;

static void attn_call_fn(void *ctx)
{
    attn_call *c = ctx;
    c->be->ops->attention(c->be, c->a, c->q, c->stride, c->sd, c->k[c->next], c->v[c->next], c->out);
    c->next = (c->next + 1) % c->copies;
}

typedef struct {
    char name[64];
    int32_t nh, nkv, hd;
} ashape;

static int cmd_attn(const opts *o)
{
    ashape as[16];
    int na = 0;
    const char *syn = o->synthetic ? o->synthetic : o->shapes ? NULL : "1b,qwen3-1.7b";
    if (syn) {
        char buf[256];
        snprintf(buf, sizeof buf, "%s", syn);
        for (char *save = NULL, *t = strtok_r(buf, ",", &save); t && na < 16; t = strtok_r(NULL, ",", &save)) {
            model_config c;
            if (synth_config(t, &c)) {
                fprintf(stderr, "%s attn: --synthetic expects a list of " SYNTH_NAMES ", not '%s'\n", P, t);
                return 2;
            }
            snprintf(as[na].name, sizeof as[na].name, "%s", t);
            as[na].nh = c.n_heads, as[na].nkv = c.n_kv_heads, as[na].hd = c.head_dim;
            na++;
        }
    }
    for (const char *p = o->shapes; p && *p && na < 16;) { /* NH/NKVxHD */
        int nh, nkv, hd, used = 0;
        if (sscanf(p, "%d/%dx%d%n", &nh, &nkv, &hd, &used) != 3 || nh < 1 || nkv < 1 || nh % nkv || hd < 2 ||
            hd % 2 || hd > MODEL_MAX_HEAD_DIM || (p[used] && p[used] != ',')) {
            fprintf(stderr, "%s attn: --shapes expects NH/NKVxHD,... (e.g. 32/8x64), got '%s'\n", P, o->shapes);
            return 2;
        }
        snprintf(as[na].name, sizeof as[na].name, "%d/%dx%d", nh, nkv, hd);
        as[na].nh = nh, as[na].nkv = nkv, as[na].hd = hd;
        na++;
        p += used + (p[used] == ',');
    }
    int32_t def_ctx[] = {8192, 32768}, def_b[] = {1, 8};
    const int32_t *ctxs = o->ctxs ? o->ctxs : def_ctx, nc = o->ctxs ? o->n_ctxs : 2;
    const int32_t *bs_ = o->batches_set ? o->batches : def_b, nb = o->batches_set ? o->n_batches : 2;
    rd_backend *be;
    if (rd_backend_create(o->backend, o->threads, &be))
        return setup_fail("backend");
    char desc[4096] = "";
    if (be->ops->describe)
        be->ops->describe(be, desc, sizeof desc);
    double bw = o->bw;
    if (!(bw > 0) && copy_bw(be, o->mib, o->iters, &bw))
        bw = 0;
    printf("attention on %s: %s\ncopy bandwidth %.1f GB/s; KV bytes read per call = batch x context x kv heads x "
           "head_dim x 2 (K and V) x element bytes (+ scale bytes); the target is >= 0.70 of the copy bandwidth\n",
           be->ops->name, desc, bw);
    cJSON *doc = cJSON_CreateObject(), *arr = cJSON_AddArrayToObject(doc, "results");
    cJSON_AddStringToObject(doc, "backend", be->ops->name);
    cJSON_AddStringToObject(doc, "describe", desc);
    cJSON_AddNumberToObject(doc, "copy_gbps", bw);
    cJSON_AddNumberToObject(doc, "target_x_copy", 0.70);
    const int32_t bs = 16;
    int rc = 0;
    for (int ai = 0; ai < na && !rc; ai++)
        for (int32_t ci = 0; ci < nc && !rc; ci++)
            for (int32_t bi = 0; bi < nb && !rc; bi++) {
                const int32_t nh = as[ai].nh, nkv = as[ai].nkv, hd = as[ai].hd, ctx = ctxs[ci], B = bs_[bi];
                if (ctx < 1) {
                    continue;
                }
                rd_attn_shape a = {nh, nkv, hd, bs, (float)(1.0 / sqrt((double)hd)), 0};
                const int32_t bps = (ctx + bs - 1) / bs;
                const double blk = (double)rd_backend_kv_block_bytes(be, nkv, bs, hd);
                const double cache = blk * bps * B; /* one of K, V */
                const double kv_bytes = 2.0 * B * (double)ctx * rd_backend_kv_block_bytes(be, nkv, 1, hd);
                size_t fr = 0, tot = 0;
                const char *skip = NULL;
                if (be->ops->mem_info && !be->ops->mem_info(be, &fr, &tot) && 2 * cache + (256 << 20) > 0.9 * fr)
                    skip = "does not fit the free device memory";
                else if (!strcmp(be->ops->name, "cpu") && 2 * cache > 8.0 * (1 << 30))
                    skip = "over 8 GiB of host memory";
                char label[160];
                snprintf(label, sizeof label, "attention %.60s (%d/%d heads of %d)", as[ai].name, nh, nkv, hd);
                if (skip) {
                    printf("%s, context %d, batch %d: skipped, %.2f GiB of KV %s\n", label, ctx, B,
                           2 * cache / 1073741824.0, skip);
                    printf("TABLE|%s|ctx %d batch %d|skipped: %.2f GiB of KV %s|\n", label, ctx, B,
                           2 * cache / 1073741824.0, skip);
                    continue;
                }
                float *kc[MAX_COPIES] = {0}, *vc[MAX_COPIES] = {0};
                int32_t copies = copies_for(o, 2 * cache);
                kc[0] = be->ops->alloc(be, (size_t)cache), vc[0] = be->ops->alloc(be, (size_t)cache);
                for (int32_t k = 1; k < copies; k++) /* fewer if memory runs out */
                    if (!(kc[k] = be->ops->alloc(be, (size_t)cache)) || !(vc[k] = be->ops->alloc(be, (size_t)cache))) {
                        if (kc[k]) be->ops->free(be, kc[k]);
                        kc[k] = NULL;
                        copies = k;
                        break;
                    }
                float *q = be->ops->alloc(be, sizeof(float) * (size_t)B * nh * hd);
                float *out = be->ops->alloc(be, sizeof(float) * (size_t)B * nh * hd);
                const int32_t C = ctx < 1024 ? ctx : 1024;
                float *src = kv_source(be, &a, C, 7 + (uint64_t)ctx);
                int32_t *tab = malloc(sizeof(int32_t) * (size_t)B * bps);
                float *qh = malloc(sizeof(float) * (size_t)B * nh * hd);
                if (!kc[0] || !vc[0] || !q || !out || !src || !tab || !qh) {
                    printf("%s, context %d, batch %d: out of memory\n", label, ctx, B);
                    printf("TABLE|%s|ctx %d batch %d|skipped: out of memory|\n", label, ctx, B);
                } else {
                    for (int32_t i = 0; i < B * bps; i++)
                        tab[i] = i;
                    fill_random(qh, (size_t)B * nh * hd, 11, 1.0f);
                    rc = be->ops->h2d(be, q, qh, sizeof(float) * (size_t)B * nh * hd);
                    double tf0 = clock_now_s();
                    for (int32_t s = 0; s < B && !rc; s++)
                        rc = kv_fill_rows(be, &a, kc, vc, copies, src, C, tab + (size_t)s * bps, bps, ctx);
                    double t_fill = clock_now_s() - tf0;
                    /* the decode step: one row per sequence at the context's last position */
                    int32_t *pos = malloc(sizeof(int32_t) * B), *slot = malloc(sizeof(int32_t) * B),
                            *tok = calloc(B, sizeof(int32_t)), *qs = malloc(sizeof(int32_t) * (B + 1)),
                            *cl = malloc(sizeof(int32_t) * B);
                    for (int32_t s = 0; s < B; s++) {
                        pos[s] = ctx - 1;
                        slot[s] = tab[(size_t)s * bps + (ctx - 1) / bs] * bs + (ctx - 1) % bs;
                        qs[s] = s;
                        cl[s] = ctx;
                    }
                    qs[B] = B;
                    rd_step st = {B, B, bps, tok, pos, slot, qs, cl, tab, NULL};
                    rd_step_dev sd;
                    if (!rc)
                        rc = be->ops->step_upload(be, &st, &sd);
                    attn_call ac = {be, &a, q, nh * hd, &sd, kc, vc, copies, 0, out};
                    int32_t reps = 0;
                    const double t_stream = rc ? -1 : time_calls(be, attn_call_fn, &ac, o->reps, &reps);
                    /* and as a graph of as many calls (a decode step's attention runs inside one) */
                    ac.next = 0;
                    const double t_graph =
                        t_stream < 0 ? -2 : time_graph(be, NULL, attn_call_fn, &ac, reps > copies ? reps : copies, 3);
                    if (t_graph == -1)
                        printf("%s, context %d, batch %d: no graph timing (%s)\n", label, ctx, B, rd_errmsg());
                    const double t = t_graph >= 0 ? t_graph : t_stream;
                    free(pos), free(slot), free(tok), free(qs), free(cl);
                    /* what it computed must at least be numbers (a kernel that skips work is fast too) */
                    int32_t nonfinite = 0;
                    if (t >= 0 && !be->ops->d2h(be, qh, out, sizeof(float) * (size_t)B * nh * hd) && !be->ops->sync(be))
                        for (size_t i = 0; i < (size_t)B * nh * hd; i++)
                            nonfinite += !isfinite(qh[i]);
                    if (nonfinite) {
                        printf("%s, context %d, batch %d: %d outputs are not finite\n", label, ctx, B, nonfinite);
                        printf("TABLE|%s|ctx %d batch %d|FAIL: %d outputs not finite|\n", label, ctx, B, nonfinite);
                        rc = 1;
                    } else if (t < 0) {
                        printf("%s, context %d, batch %d: %s\n", label, ctx, B, rd_errmsg());
                        printf("TABLE|%s|ctx %d batch %d|failed: %s|\n", label, ctx, B, rd_errmsg());
                        rc = 1;
                    } else {
                        const double gbps = kv_bytes / t / 1e9, x = bw > 0 ? gbps / bw : 0;
                        printf("%s, context %6d, batch %3d: %9.1f us per call%s, KV %.1f MB read at %.0f GB/s: "
                               "%.2f of copy (%.1f us launched one by one; fill %.2fs, %d reps over %d copies)\n",
                               label, ctx, B, t * 1e6, t_graph >= 0 ? " in a graph" : "", kv_bytes / 1e6, gbps, x,
                               t_stream * 1e6, t_fill, reps, copies);
                        printf("TABLE|%s|ctx %d batch %d|%.1f us, %.0f GB/s, %.2f of copy bandwidth (target 0.70)|\n",
                               label, ctx, B, t * 1e6, gbps, x);
                        cJSON *e = cJSON_CreateObject();
                        cJSON_AddStringToObject(e, "shape", as[ai].name);
                        cJSON_AddNumberToObject(e, "n_heads", nh);
                        cJSON_AddNumberToObject(e, "n_kv_heads", nkv);
                        cJSON_AddNumberToObject(e, "head_dim", hd);
                        cJSON_AddNumberToObject(e, "ctx", ctx);
                        cJSON_AddNumberToObject(e, "batch", B);
                        cJSON_AddNumberToObject(e, "us", t * 1e6);
                        cJSON_AddNumberToObject(e, "us_stream", t_stream * 1e6);
                        cJSON_AddBoolToObject(e, "graph", t_graph >= 0);
                        cJSON_AddNumberToObject(e, "reps", reps);
                        cJSON_AddNumberToObject(e, "kv_bytes", kv_bytes);
                        cJSON_AddNumberToObject(e, "copies", copies);
                        cJSON_AddNumberToObject(e, "gbps", gbps);
                        cJSON_AddNumberToObject(e, "x_copy", x);
                        cJSON_AddItemToArray(arr, e);
                    }
                }
                for (int32_t k = 0; k < MAX_COPIES; k++) {
                    if (kc[k]) be->ops->free(be, kc[k]);
                    if (vc[k]) be->ops->free(be, vc[k]);
                }
                if (q) be->ops->free(be, q);
                if (out) be->ops->free(be, out);
                if (src) be->ops->free(be, src);
                free(tab), free(qh);
            }
    rd_backend_destroy(be);
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
    fprintf(stderr, "usage: %s info|copybw|parity|invariance|tis|sampler|engine|bench|gemm|attn|moe [flags] (see the source header)\n", P);
    exit(2);
}

int main(int argc, char **argv)
{
    if (argc < 2)
        usage();
    const char *cmd = argv[1];
    opts o = {.backend = "cuda", .threads = 0, .prompts = 8, .tokens = 32, .prompt_len = 128, .steps = 32,
              .mib = 1024, .iters = 20, .tol = 0.05, .bw = 0, .flush_mib = 256};
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
        else if (!strcmp(a, "--prompt")) o.prompt_len = (int32_t)cli_int(P, a, cli_value(P, argc, argv, &i), 1, 262144);
        else if (!strcmp(a, "--steps")) o.steps = (int32_t)cli_int(P, a, cli_value(P, argc, argv, &i), 1, 100000);
        else if (!strcmp(a, "--mib")) o.mib = (int32_t)cli_int(P, a, cli_value(P, argc, argv, &i), 1, 65536);
        else if (!strcmp(a, "--iters")) o.iters = (int32_t)cli_int(P, a, cli_value(P, argc, argv, &i), 1, 100000);
        else if (!strcmp(a, "--tol")) o.tol = cli_float(P, a, cli_value(P, argc, argv, &i), 0, 100);
        else if (!strcmp(a, "--bw")) o.bw = cli_float(P, a, cli_value(P, argc, argv, &i), 0, 1e6);
        else if (!strcmp(a, "--batches")) {
            o.batches = cli_ids(P, a, cli_value(P, argc, argv, &i), &o.n_batches);
            o.batches_set = 1;
        }
        else if (!strcmp(a, "--rows")) o.rows = cli_ids(P, a, cli_value(P, argc, argv, &i), &o.n_rows);
        else if (!strcmp(a, "--ctx")) o.ctxs = cli_ids(P, a, cli_value(P, argc, argv, &i), &o.n_ctxs);
        else if (!strcmp(a, "--variants")) o.variants = cli_value(P, argc, argv, &i);
        else if (!strcmp(a, "--shapes")) o.shapes = cli_value(P, argc, argv, &i);
        else if (!strcmp(a, "--layers")) o.layers = (int32_t)cli_int(P, a, cli_value(P, argc, argv, &i), 1, 512);
        else if (!strcmp(a, "--reps")) o.reps = (int32_t)cli_int(P, a, cli_value(P, argc, argv, &i), 1, 100000);
        else if (!strcmp(a, "--flush-mib")) o.flush_mib = (int32_t)cli_int(P, a, cli_value(P, argc, argv, &i), 0, 65536);
        else if (!strcmp(a, "--peak-tflops")) o.peak_tflops = cli_float(P, a, cli_value(P, argc, argv, &i), 0, 1e6);
        else if (!strcmp(a, "--kv-fill")) o.kv_fill = 1;
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
    for (int32_t i = 0; i < o.n_rows; i++)
        if (o.rows[i] < 1 || o.rows[i] > 4096) {
            fprintf(stderr, "%s: --rows entries must be in 1..4096\n", P);
            return 2;
        }
    for (int32_t i = 0; i < o.n_ctxs; i++)
        if (o.ctxs[i] < 1 || o.ctxs[i] > (1 << 22)) {
            fprintf(stderr, "%s: --ctx entries must be in 1..%d\n", P, 1 << 22);
            return 2;
        }
    int need_model = !strcmp(cmd, "parity") || !strcmp(cmd, "invariance") || !strcmp(cmd, "tis") || !strcmp(cmd, "sampler") ||
                     !strcmp(cmd, "engine") || !strcmp(cmd, "bench");
    if (need_model && !o.model && !o.synthetic) {
        fprintf(stderr, "%s %s: --model PATH or --synthetic NAME is required\n", P, cmd);
        return 2;
    }
    int rc = -1;
    if (!strcmp(cmd, "info")) rc = cmd_info(&o);
    else if (!strcmp(cmd, "copybw")) rc = cmd_copybw(&o);
    else if (!strcmp(cmd, "parity")) rc = cmd_parity(&o);
    else if (!strcmp(cmd, "invariance")) rc = cmd_invariance(&o);
    else if (!strcmp(cmd, "tis")) rc = cmd_tis(&o);
    else if (!strcmp(cmd, "sampler")) rc = cmd_sampler(&o);
    else if (!strcmp(cmd, "engine")) rc = cmd_engine(&o);
    else if (!strcmp(cmd, "bench")) rc = cmd_bench(&o);
    else if (!strcmp(cmd, "gemm")) rc = cmd_gemm(&o);
    else if (!strcmp(cmd, "attn")) rc = cmd_attn(&o);
    else if (!strcmp(cmd, "moe")) rc = cmd_moe(&o);
    if (o.batches_set)
        free(o.batches);
    free(o.rows);
    free(o.ctxs);
    if (rc < 0)
        usage();
    return rc;
}
