/* test_cuda_emu.c - the CUDA backend's kernels and host code, run on the CPU
 * through the host emulator (backend "cuda-emu": the same .cu sources built
 * with g++ against kernels/cuda/cuemu.h, which runs every CUDA thread as a
 * fiber and aborts on divergent barriers, shuffles with exited lanes, bad
 * launch shapes and allocations during graph capture).
 *
 * What it checks, against references computed here (double precision on the
 * bf16-rounded inputs) or against the CPU backend and samp_sample:
 *   - the RD_CUDA_* switches: a value one does not take fails the backend's
 *     creation with a message that names it;
 *   - every op: GEMM (and accumulate, and the fp32 LM head), embed, RMSNorm,
 *     RoPE, SwiGLU, gather, KV write, copy-on-write, paged attention over
 *     several partitions with GQA, scrambled block tables, poisoned unused
 *     slots and padding rows (and against the CPU backend at head_dim 128
 *     and 256); Qwen's q|k|v bias and per-head norms against the CPU backend,
 *     on a linear's output in every activation mode (the deferred sum, the
 *     RoPE + KV write fusion after them, graph capture); Gemma 3's ops: the
 *     (1 + w) norms, GeGLU (its tanh against libm's), add and scale, alone,
 *     on a linear's output in every mode and after a deferred RoPE, and the
 *     bf16 copies they write or drop; sliding-window attention;
 *   - mixture of experts: moe_route against the CPU's routes (ties, up to
 *     512 experts, on a split linear's pending output), moe_ffn against the
 *     CPU backend and a double reference on the same bf16 weights, a row
 *     alone / among other rows / unaligned bit for bit, inside graph capture
 *     (a weight swap picked up by the capture; experts first seen in a
 *     capture fail it cleanly), the small-batch fusions (in-block sort, the
 *     combine in the down kernel) against RD_CUDA_FUSE=0 bit for bit. These
 *     cases use no emulator hook and also run on the real backend
 *     (RD_TEST_CUDA_BACKEND=cuda, tests/gpu/run.sh);
 *   - batch invariance: a row's bits do not depend on the other rows;
 *   - the device sampler against samp_sample (same token, log-probs), and
 *     with logit edits (bias, masks, penalties) against samp_sample_ex;
 *   - the runner on the tiny models: logits close to the CPU backend's,
 *     chunked prefill bit-identical to one-step prefill, decode steps through
 *     CUDA graphs (eager, capture, replay, weight swap) bit-identical to
 *     uncaptured decode, device sampling through runner_sample.
 * What it cannot check: real-device timing, cuBLASLt (the emulator uses the
 * fallback GEMM kernel), and anything about the hardware memory model. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/stat.h>

#include "engine/backend.h"
#include "engine/serve/engine.h"
#include "base/err.h"
#include "engine/format/gguf.h"
#include "engine/format/safetensors.h"
#include "engine/model/loader.h"
#include "engine/model/quant.h"
#include "engine/model/quant_fp8.h"
#include "engine/model/lora.h"
#include "engine/model/runner.h"
#include "engine/serve/sampler.h"
#include "kernels/cuda/cuda_math.h"
#include "kernels/cuda/cuda_plan.h"
#include "tests/unit/engine_helpers.h"
#include "tests/unit/test.h"

uint64_t cuemu_launch_count(void);    /* kernels/cuda/cuemu.cc */
uint64_t cuemu_wgmma_count(void);     /* wgmma operations run so far */
uint64_t cuemu_cp_async_count(void);  /* cp.async copies issued so far */
uint64_t cuemu_sync_count(void);
void cuemu_fail_next_malloc(void);
int64_t cuemu_live_allocs(void);

static rd_backend *cpu, *emu, *emu_bf16; /* emu: the default (split activations); emu_bf16: RD_CUDA_ACT=bf16 */

/* The device backend: "cuda-emu", or "cuda" with RD_TEST_CUDA_BACKEND=cuda on
 * a GPU (tests/gpu/run.sh). Kernel counts are the emulator's alone
 * (cuemu_launch_count), so only it checks them. */
static const char *dev_name(void) { return emu->ops->name; }
static int on_emulator(void) { return !strcmp(dev_name(), "cuda-emu"); }
/* SwiGLU on a GPU against the CPU (CUDA's expf, within 2 ulps of exact, against
 * glibc's): the first H200 run measured 3. */
#define SWIGLU_DEVICE_ULPS 4

/* Under AddressSanitizer (make asan) everything runs ~3x slower: the model-
 * level cases run once instead of per model and mode. */
#if defined(__SANITIZE_ADDRESS__)
static const int light = 1;
#else
static const int light = 0;
#endif

static uint64_t rs = 0x853c49e6748fea9bull;
static uint64_t rnd(void)
{
    rs ^= rs << 13;
    rs ^= rs >> 7;
    rs ^= rs << 17;
    return rs;
}
static float frand(void) { return (float)((double)(rnd() >> 11) * 0x1.0p-53 * 2.0 - 1.0); }
static float bf(float x) { return cm_bf16_to_f32(cm_f32_to_bf16(x)); }

/* A value in [-1, 1) from its coordinates, so a sequence gets the same data
 * whatever else is drawn. */
static float hval(uint64_t seed, int64_t a, int64_t b, int64_t c)
{
    uint64_t z = seed * 0x9E3779B97F4A7C15ull + (uint64_t)a * 0xBF58476D1CE4E5B9ull + (uint64_t)b * 0x94D049BB133111EBull +
                 (uint64_t)c * 0xD6E8FEB86659FD93ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return (float)((double)(z >> 11) * 0x1.0p-53 * 2.0 - 1.0);
}

static void *up(rd_backend *be, const void *h, size_t bytes)
{
    void *d = be->ops->alloc(be, bytes);
    if (d && h)
        be->ops->h2d(be, d, h, bytes);
    return d;
}

static int down(rd_backend *be, void *h, const void *d, size_t bytes)
{
    int rc = be->ops->d2h(be, h, d, bytes);
    return rc ? rc : be->ops->sync(be);
}

static uint32_t fbits(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

/* The larger of a running worst error and err; a NaN stays (a plain
 * !(err <= worst) test lets the next finite error replace it). */
static double worse(double worst, double err)
{
    if (isnan(worst) || isnan(err))
        return NAN;
    return err > worst ? err : worst;
}

/* ------------------------------------------------------------------ GEMM */

/* Worst error of an LM head's y[M][out] relative to the summed magnitudes of
 * its terms, against double sums of fp32 x times the bf16 weights. */
static double lm_head_error(const float *w, const float *x, const float *y, int32_t out, int32_t in, int32_t M)
{
    double worst = 0;
    for (int32_t r = 0; r < M; r++)
        for (int32_t o = 0; o < out; o++) {
            double s = 0, mag = 0;
            for (int32_t k = 0; k < in; k++) {
                double t = (double)x[(int64_t)r * in + k] * bf(w[(int64_t)o * in + k]);
                s += t;
                mag += fabs(t);
            }
            double err = fabs(y[(int64_t)r * out + o] - s) / (mag + 1e-30);
            worst = err > worst ? err : worst;
        }
    return worst;
}

static void gemm_case(rd_backend *emu, int32_t out, int32_t in, int32_t M)
{
    const int split = emu != emu_bf16;
    float *w = malloc(sizeof(float) * out * in), *x = malloc(sizeof(float) * M * in);
    float *y = malloc(sizeof(float) * M * out), *y2 = malloc(sizeof(float) * M * out);
    float *y0 = malloc(sizeof(float) * M * out), *ys = malloc(sizeof(float) * M * out);
    float *wr = malloc(sizeof(float) * out * in);
    for (int64_t i = 0; i < (int64_t)out * in; i++)
        w[i] = frand() * 0.5f;
    for (int64_t i = 0; i < (int64_t)M * in; i++)
        x[i] = frand() * 2.0f;
    for (int64_t i = 0; i < (int64_t)M * out; i++)
        y0[i] = frand();
    void *W;
    CHECK_OK(emu->ops->linear_load(emu, w, out, in, &W));
    float *dx = up(emu, x, sizeof(float) * M * in), *dy = up(emu, NULL, sizeof(float) * M * out);
    emu->ops->linear(emu, W, dx, M, dy, 0);
    CHECK_OK(down(emu, y, dy, sizeof(float) * M * out));
    /* double reference on bf16 inputs */
    double worst = 0;
    for (int32_t r = 0; r < M; r++)
        for (int32_t o = 0; o < out; o++) {
            double s = 0, mag = 0;
            for (int32_t k = 0; k < in; k++) {
                float xv = x[(int64_t)r * in + k];
                double t = (double)(split ? xv : bf(xv)) * bf(w[(int64_t)o * in + k]);
                s += t;
                mag += fabs(t);
            }
            double err = fabs(y[(int64_t)r * out + o] - s) / (mag + 1e-30);
            worst = err > worst ? err : worst;
        }
    /* split: x = hi + lo to ~2^-17, products summed in fp32 */
    CHECK(worst < (split ? 2e-5 : 1e-6), "[%d x %d] x %d rows%s: relative error %.3g vs the reference", out, in, M,
          split ? " (split)" : "", worst);
    /* accumulate equals a separate fp32 add of the rounded product */
    emu->ops->h2d(emu, dy, y0, sizeof(float) * M * out);
    emu->ops->linear(emu, W, dx, M, dy, 1);
    CHECK_OK(down(emu, y2, dy, sizeof(float) * M * out));
    for (int64_t i = 0; i < (int64_t)M * out; i++)
        CHECK(fbits(y2[i]) == fbits(y0[i] + y[i]), "accumulate at %lld: %.9g vs %.9g", (long long)i, y2[i],
              y0[i] + y[i]);
    /* batch invariance: any prefix of the rows gives the same bits */
    for (int32_t m = 1; m < M; m++) {
        emu->ops->linear(emu, W, dx, m, dy, 0);
        CHECK_OK(down(emu, ys, dy, sizeof(float) * m * out));
        CHECK(!memcmp(ys, y, sizeof(float) * m * out), "rows of a %d-row GEMM differ from the %d-row one", m, M);
    }
    /* rows placed after other rows: row r of x at position 0 */
    for (int32_t r = 1; r < M; r += 3) {
        emu->ops->linear(emu, W, dx + (size_t)r * in, 1, dy, 0);
        CHECK_OK(down(emu, ys, dy, sizeof(float) * out));
        CHECK(!memcmp(ys, y + (size_t)r * out, sizeof(float) * out), "row %d alone differs", r);
    }
    /* LM head: bf16 weights, fp32 x (three exact bf16 pieces), fp32 sums */
    emu->ops->lm_head(emu, W, dx, M, dy);
    CHECK_OK(down(emu, y2, dy, sizeof(float) * M * out));
    worst = lm_head_error(w, x, y2, out, in, M);
    CHECK(worst < 1e-6, "lm_head [%d x %d]: relative error %.3g", out, in, worst);
    emu->ops->lm_head(emu, W, dx, 1, dy);
    CHECK_OK(down(emu, ys, dy, sizeof(float) * out));
    CHECK(!memcmp(ys, y2, sizeof(float) * out), "lm_head row 0 alone differs");
    /* read back = the bf16 weights */
    CHECK_OK(emu->ops->linear_read(emu, W, wr));
    for (int64_t i = 0; i < (int64_t)out * in; i++)
        CHECK(wr[i] == bf(w[i]), "linear_read %lld", (long long)i);
    /* embedding rows, and zeros for an out-of-range (padding) id */
    int32_t ids[4] = {0, out - 1, -1, out / 2};
    int32_t *dids = up(emu, ids, sizeof ids);
    float *de = up(emu, NULL, sizeof(float) * 4 * in), *e = malloc(sizeof(float) * 4 * in);
    emu->ops->embed(emu, W, dids, 4, 1.0f, de);
    CHECK_OK(down(emu, e, de, sizeof(float) * 4 * in));
    for (int i = 0; i < 4; i++)
        for (int32_t k = 0; k < in; k++)
            CHECK(e[i * in + k] == (ids[i] < 0 ? 0.0f : bf(w[(int64_t)ids[i] * in + k])), "embed row %d", i);
    /* scaled (Gemma's sqrt(hidden)): each value times the scale, rounded once; still zeros for the padding id */
    const float esc = sqrtf((float)in);
    emu->ops->embed(emu, W, dids, 4, esc, de);
    CHECK_OK(down(emu, e, de, sizeof(float) * 4 * in));
    for (int i = 0; i < 4; i++)
        for (int32_t k = 0; k < in; k++)
            CHECK(fbits(e[i * in + k]) == fbits(ids[i] < 0 ? 0.0f : bf(w[(int64_t)ids[i] * in + k]) * esc),
                  "scaled embed row %d column %d", i, k);
    emu->ops->free(emu, dids);
    emu->ops->free(emu, de);
    free(e);
    emu->ops->free(emu, dx);
    emu->ops->free(emu, dy);
    emu->ops->linear_free(emu, W);
    free(w), free(x), free(y), free(y2), free(y0), free(ys), free(wr);
}

static void test_gemm(void)
{
    gemm_case(emu_bf16, 64, 64, 9);
    if (test_case_failed) return;
    gemm_case(emu_bf16, 37, 72, 6);     /* out not a multiple of the tile */
    if (test_case_failed) return;
    gemm_case(emu_bf16, 13, 20, 5);     /* in % 8 != 0: the scalar path */
    if (test_case_failed) return;
    gemm_case(emu_bf16, 300, 128, 11);
    if (test_case_failed) return;
    gemm_case(emu, 64, 64, 9);
    if (test_case_failed) return;
    gemm_case(emu, 37, 72, 6);
    if (test_case_failed) return;
    gemm_case(emu, 13, 20, 5);
}

/* linear_read_native: a weight loaded from bf16 rows gives those bytes back
 * on both backends (any row range, within one part or across two); f16 and
 * f32 rows come back from the CPU, which keeps them, and are RD_ENOTSUP on
 * the device, which holds bf16; a block-quantized part is RD_ENOTSUP on the
 * CPU. A delta push reads its base this way. */
static void test_linear_read_native(void)
{
    enum { OUT = 83, IN = 96, A = 40 };   /* out not a multiple of the 16-lane panels; parts of A and OUT - A rows */
    uint16_t *bf = malloc(sizeof(uint16_t) * OUT * IN), *hf = malloc(sizeof(uint16_t) * OUT * IN);
    uint16_t *got = malloc(sizeof(uint16_t) * OUT * IN);
    float *f32 = malloc(sizeof(float) * OUT * IN), *got32 = malloc(sizeof(float) * OUT * IN);
    uint64_t st = 7;
    for (int i = 0; i < OUT * IN; i++) {
        st = st * 6364136223846793005ull + 1442695040888963407ull;
        float v = ((float)(st >> 40) / (float)(1 << 24) - 0.5f) * 0.2f;
        bf[i] = rd_f32_to_bf16(v);
        hf[i] = st_f32_to_f16(v);
        f32[i] = v;
    }
    rd_backend *bes[2] = {cpu, emu};
    for (int b = 0; b < 2 && !test_case_failed; b++) {
        rd_backend *be = bes[b];
        rd_wpart two[2] = {{.type = GGML_BF16, .rows = A, .data = bf},
                           {.type = GGML_BF16, .rows = OUT - A, .data = bf + (size_t)A * IN}};
        void *W = NULL;
        CHECK_OK(be->ops->linear_load_q(be, two, 2, IN, &W));
        static const int32_t ranges[][2] = {{0, OUT}, {0, 1}, {A, OUT - A}, {A - 3, 9}, {17, 30}, {OUT - 1, 1}};
        for (size_t r = 0; r < sizeof ranges / sizeof ranges[0] && !test_case_failed; r++) {
            int32_t r0 = ranges[r][0], n = ranges[r][1];
            memset(got, 0xAB, sizeof(uint16_t) * OUT * IN);
            CHECK_OK(be->ops->linear_read_native(be, W, GGML_BF16, r0, n, got));
            CHECK(!memcmp(got, bf + (size_t)r0 * IN, sizeof(uint16_t) * n * IN), "%s: bf16 rows [%d, %d) differ",
                  be->ops->name, r0, r0 + n);
        }
        CHECK(be->ops->linear_read_native(be, W, GGML_F16, 0, 1, got) == RD_ENOTSUP, "%s: f16 of bf16 rows",
              be->ops->name);
        CHECK(be->ops->linear_read_native(be, W, GGML_BF16, OUT - 1, 2, got) == RD_EINVAL, "%s: rows past out",
              be->ops->name);
        be->ops->linear_free(be, W);
        rd_wpart h = {.type = GGML_F16, .rows = OUT, .data = hf};
        CHECK_OK(be->ops->linear_load_q(be, &h, 1, IN, &W));
        int rc = be->ops->linear_read_native(be, W, GGML_F16, 5, 20, got);
        if (be == cpu)
            CHECK(rc == 0 && !memcmp(got, hf + 5 * IN, sizeof(uint16_t) * 20 * IN), "cpu: f16 rows differ (rc %d)", rc);
        else
            CHECK(rc == RD_ENOTSUP, "%s: f16 rows of a bf16-held weight: rc %d", be->ops->name, rc);
        be->ops->linear_free(be, W);
        CHECK_OK(be->ops->linear_load(be, f32, OUT, IN, &W));
        rc = be->ops->linear_read_native(be, W, GGML_F32, 3, 50, got32);
        if (be == cpu)
            CHECK(rc == 0 && !memcmp(got32, f32 + 3 * IN, sizeof(float) * 50 * IN), "cpu: f32 rows differ (rc %d)", rc);
        else
            CHECK(rc == RD_ENOTSUP, "%s: f32 rows of a bf16-held weight: rc %d", be->ops->name, rc);
        be->ops->linear_free(be, W);
    }
    /* The CPU keeps a quantized part quantized: its rows have no bf16 bytes. */
    uint8_t *q8 = malloc((size_t)OUT * ggml_row_bytes(GGML_Q8_0, IN));
    CHECK_OK(ggml_quant_q8_0(f32, (uint64_t)OUT * IN, q8));
    rd_wpart mix[2] = {{.type = GGML_Q8_0, .rows = A, .data = q8},
                       {.type = GGML_BF16, .rows = OUT - A, .data = bf + (size_t)A * IN}};
    void *W = NULL;
    CHECK_OK(cpu->ops->linear_load_q(cpu, mix, 2, IN, &W));
    CHECK(cpu->ops->linear_read_native(cpu, W, GGML_BF16, A - 1, 2, got) == RD_ENOTSUP, "cpu: rows of a Q8_0 part");
    CHECK_OK(cpu->ops->linear_read_native(cpu, W, GGML_BF16, A, OUT - A, got));
    CHECK(!memcmp(got, bf + (size_t)A * IN, sizeof(uint16_t) * (OUT - A) * IN), "cpu: the bf16 part's rows differ");
    cpu->ops->linear_free(cpu, W);
    free(q8), free(bf), free(hf), free(got), free(f32), free(got32);
}

/* FP8 weights (serve_dtype fp8): blocks from rd_fp8_quant loaded through
 * linear_load_q on the device (codes and scales, k_gemm_fp8) and on the CPU
 * (held as bf16, exact), against a double reference on the dequantized
 * weights; a row alone, among others and at an unaligned x bit for bit;
 * accumulate; the read-back; the bytes held; and the ops that cannot take an
 * FP8 weight (embedding, LM head) failing cleanly. Runs on the real device
 * too (no emulator hook). */
static void fp8_case(int32_t out, int32_t in, int32_t m)
{
    const size_t n = (size_t)out * in;
    float *w = malloc(sizeof(float) * n), *wd = malloc(sizeof(float) * n);
    uint8_t *blk = malloc(n / RD_FP8_BLOCK * RD_FP8_BYTES);
    float *x = malloc(sizeof(float) * ((size_t)m * in + 1)), *y = malloc(sizeof(float) * (size_t)m * out);
    float *yc = malloc(sizeof(float) * (size_t)m * out), *y1 = malloc(sizeof(float) * out);
    float *yacc = malloc(sizeof(float) * (size_t)m * out), *back = malloc(sizeof(float) * n);
    /* Blocks at scales 1e-4 .. 10 (weights), one all zero, one with an outlier. */
    for (size_t b = 0; b < n / RD_FP8_BLOCK; b++) {
        const float sc = (float)pow(10.0, -4.0 + 5.0 * (double)(rnd() >> 11) * 0x1.0p-53);
        for (int j = 0; j < RD_FP8_BLOCK; j++)
            w[b * RD_FP8_BLOCK + j] = b == 3 ? 0.0f : frand() * sc * (b == 5 && j == 7 ? 40.0f : 1.0f);
    }
    for (size_t i = 0; i < (size_t)m * in + 1; i++)
        x[i] = frand();
    CHECK_OK(rd_fp8_quant(w, n, blk));
    rd_fp8_dequant(blk, wd, n / RD_FP8_BLOCK);
    rd_wpart part = {.type = RD_TYPE_FP8_B32, .rows = out, .data = blk};
    void *W = NULL, *Wc = NULL;
    CHECK_OK(emu->ops->linear_load_q(emu, &part, 1, in, &W));
    CHECK_OK(cpu->ops->linear_load_q(cpu, &part, 1, in, &Wc));
    if (test_case_failed)
        goto done;
    float *dx = up(emu, x, sizeof(float) * ((size_t)m * in + 1)), *dy = up(emu, NULL, sizeof(float) * (size_t)m * out);
    emu->ops->linear(emu, W, dx, m, dy, 0);
    CHECK_OK(down(emu, y, dy, sizeof(float) * (size_t)m * out));
    float *cx = up(cpu, x, sizeof(float) * (size_t)m * in), *cy = up(cpu, NULL, sizeof(float) * (size_t)m * out);
    cpu->ops->linear(cpu, Wc, cx, m, cy, 0);
    CHECK_OK(down(cpu, yc, cy, sizeof(float) * (size_t)m * out));
    double worst = 0.0, worst_c = 0.0;
    for (int32_t r = 0; r < m; r++)
        for (int32_t o = 0; o < out; o++) {
            double ref = 0.0, mag = 0.0;
            for (int32_t k = 0; k < in; k++) {
                ref += (double)wd[(size_t)o * in + k] * x[(size_t)r * in + k];
                mag += fabs((double)wd[(size_t)o * in + k] * x[(size_t)r * in + k]);
            }
            const double tol = mag * in * 0x1p-24 + 1e-30;
            worst = worse(worst, fabs(y[(size_t)r * out + o] - ref) / tol);
            worst_c = worse(worst_c, fabs(yc[(size_t)r * out + o] - ref) / tol);
        }
    CHECK(worst <= 1.0, "fp8 [%d][%d] x %d: the device's products are %.3g of the fp32 bound from the reference",
          out, in, m, worst);
    CHECK(worst_c <= 1.0, "fp8 [%d][%d] x %d: the CPU's products are %.3g of the fp32 bound", out, in, m, worst_c);
    /* Batch invariance, and x's alignment only picks the loads. */
    for (int32_t r = 0; r < m && !test_case_failed; r += m - 1 > 0 ? m - 1 : 1) {
        float *dx1 = up(emu, x + (size_t)r * in, sizeof(float) * in), *dy1 = up(emu, NULL, sizeof(float) * out);
        emu->ops->linear(emu, W, dx1, 1, dy1, 0);
        CHECK_OK(down(emu, y1, dy1, sizeof(float) * out));
        CHECK(!memcmp(y1, y + (size_t)r * out, sizeof(float) * out), "fp8: row %d alone differs from it among %d", r,
              m);
        emu->ops->free(emu, dx1);
        emu->ops->free(emu, dy1);
    }
    {
        float *dxu = up(emu, NULL, sizeof(float) * ((size_t)m * in + 1));
        emu->ops->h2d(emu, dxu + 1, x, sizeof(float) * (size_t)m * in);
        emu->ops->linear(emu, W, dxu + 1, m, dy, 0);
        CHECK_OK(down(emu, yacc, dy, sizeof(float) * (size_t)m * out));
        CHECK(!memcmp(yacc, y, sizeof(float) * (size_t)m * out), "fp8: an unaligned x changes the bits");
        emu->ops->free(emu, dxu);
    }
    /* accumulate: y + the product, the product rounded first. */
    emu->ops->h2d(emu, dy, y, sizeof(float) * (size_t)m * out);
    emu->ops->linear(emu, W, dx, m, dy, 1);
    CHECK_OK(down(emu, yacc, dy, sizeof(float) * (size_t)m * out));
    for (size_t i = 0; i < (size_t)m * out && !test_case_failed; i++)
        CHECK(fbits(yacc[i]) == fbits(y[i] + y[i]), "fp8 accumulate: element %zu %g, expected %g", i, yacc[i],
              y[i] + y[i]);
    /* The read-back is the dequantized weight, exactly; the bytes are FP8's. */
    CHECK_OK(emu->ops->linear_read(emu, W, back));
    CHECK(!memcmp(back, wd, sizeof(float) * n), "fp8: linear_read is not the dequantized weight");
    CHECK(emu->ops->linear_bytes(emu, W) == (int64_t)(n + n / RD_FP8_BLOCK), "fp8: %lld bytes held, expected %zu",
          (long long)emu->ops->linear_bytes(emu, W), n + n / RD_FP8_BLOCK);
    int64_t by[RD_WEIGHT_TYPES] = {0};
    emu->ops->linear_bytes_by_type(emu, W, by);
    CHECK(by[RD_TYPE_FP8_B32] == (int64_t)(n + n / RD_FP8_BLOCK) && by[GGML_BF16] == 0, "fp8: bytes by type");
    CHECK(emu->ops->linear_read_native(emu, W, GGML_BF16, 0, 1, back) == RD_ENOTSUP, "fp8: bf16 rows on the device");
    /* The CPU holds it as bf16: those rows are the dequantized weight. */
    uint16_t *bfr = malloc(sizeof(uint16_t) * n);
    CHECK_OK(cpu->ops->linear_read_native(cpu, Wc, GGML_BF16, 0, out, bfr));
    for (size_t i = 0; i < n && !test_case_failed; i++)
        CHECK(fbits(rd_bf16_to_f32(bfr[i])) == fbits(wd[i]), "cpu fp8 as bf16: element %zu", i);
    free(bfr);
    /* An FP8 weight is no embedding or LM head: the device says so. */
    int32_t ids[1] = {0};
    int32_t *dids = up(emu, ids, sizeof ids);
    emu->ops->embed(emu, W, dids, 1, 1.0f, dy);
    CHECK(emu->ops->sync(emu) != 0 && strstr(rd_errmsg(), "fp8"), "fp8 embed: no error (%s)", rd_errmsg());
    emu->ops->lm_head(emu, W, dx, 1, dy);
    CHECK(emu->ops->sync(emu) != 0 && strstr(rd_errmsg(), "fp8"), "fp8 lm_head: no error (%s)", rd_errmsg());
    CHECK_OK(emu->ops->sync(emu));
    emu->ops->free(emu, dids);
    emu->ops->free(emu, dx), emu->ops->free(emu, dy);
    cpu->ops->free(cpu, cx), cpu->ops->free(cpu, cy);
done:
    if (W)
        emu->ops->linear_free(emu, W);
    if (Wc)
        cpu->ops->linear_free(cpu, Wc);
    free(w), free(wd), free(blk), free(x), free(y), free(yc), free(y1), free(yacc), free(back);
}

static void test_fp8_linear(void)
{
    fp8_case(83, 160, 7);       /* 10 chunks: lanes idle; out not a multiple of the tile */
    if (test_case_failed) return;
    fp8_case(40, 1088, 5);      /* 68 chunks: lanes take more than one */
    if (test_case_failed) return;
    fp8_case(9, 32, 1);         /* one block per row */
}

/* ------------------------------------------------------------------ the tensor-core GEMM */

/* A backend with the given environment variables set while it is created. */
static rd_backend *dev_with(const char *k1, const char *v1, const char *k2, const char *v2)
{
    rd_backend *be = NULL;
    setenv(k1, v1, 1);
    if (k2)
        setenv(k2, v2, 1);
    int rc = rd_backend_create(dev_name(), 1, &be);
    unsetenv(k1);
    if (k2)
        unsetenv(k2);
    return rc ? NULL : be;
}

/* A switch with a value the backend does not take fails its creation with
 * RD_EINVAL and a message naming the switch, the value and what it takes
 * (a misspelt variant must not run as the default); every documented value
 * and an empty one (unset) create. */
static void test_env_switches(void)
{
    static const char *bad[][2] = {{"RD_CUDA_GEMM", "tcc"},     {"RD_CUDA_ACT", "fp16"},  {"RD_CUDA_MOE", "TC"},
                                   {"RD_CUDA_TC_TILE", "96"},   {"RD_CUDA_PDL", "yes"},   {"RD_CUDA_FUSE", "off"},
                                   {"RD_CUDA_NORM_ROWS", "8x"}, {"RD_CUDA_TC_BIG_ROWS", "-1"}, {"RD_CUDA_Q8", "int8"},
                                   {"RD_CUDA_TC_HNORM", "off"}, {"RD_CUDA_NORM_V0", "2"}, {"RD_CUDA_TC_ROUTE", "no"},
                                   {"RD_CUDA_TC_PIPE", "5"},    {"RD_CUDA_SAMPLE", "tiled"}, {"RD_CUDA_TC_NORMADD", "off"},
                                   {"RD_CUDA_TC_LORA", "2"},    {"RD_CUDA_TC_ORDER", "rows"}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        setenv(bad[i][0], bad[i][1], 1);
        rd_backend *be = NULL;
        const int rc = rd_backend_create(dev_name(), 1, &be);
        unsetenv(bad[i][0]);
        char want[96];
        snprintf(want, sizeof want, "%s=%s is not a value it takes", bad[i][0], bad[i][1]);
        CHECK(rc == RD_EINVAL && !be, "%s=%s: creation gave %d (want RD_EINVAL)", bad[i][0], bad[i][1], rc);
        CHECK(strstr(rd_errmsg(), want) != NULL, "%s=%s: the error says \"%s\"", bad[i][0], bad[i][1], rd_errmsg());
        if (be)
            rd_backend_destroy(be);
    }
    static const char *good[][2] = {{"RD_CUDA_GEMM", "tc"},     {"RD_CUDA_GEMM", "simple"}, {"RD_CUDA_ACT", "mixed"},
                                    {"RD_CUDA_TC_TILE", "128"}, {"RD_CUDA_TC_TILE", "64"},  {"RD_CUDA_NORM_ROWS", "0"},
                                    {"RD_CUDA_TC_BIG_ROWS", "24"}, {"RD_CUDA_Q8", "w8a8"}, {"RD_CUDA_FP8", "w8a8"},
                                    {"RD_CUDA_MOE", ""},        {"RD_CUDA_ATTN_V0", "1"},  {"RD_CUDA_HEAD", "fp32"},
                                    {"RD_CUDA_TC_PIPE", "0"},   {"RD_CUDA_TC_PIPE", "6"},  {"RD_CUDA_SAMPLE", "cta"},
                                    {"RD_CUDA_TC_NORMADD", "0"}, {"RD_CUDA_TC_LORA", "0"}, {"RD_CUDA_TC_ORDER", "weight"},
                                    {"RD_CUDA_TC_ORDER", "batch"}};
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
        rd_backend *be = dev_with(good[i][0], good[i][1], NULL, NULL);
        CHECK(be != NULL, "%s=%s: %s", good[i][0], good[i][1], rd_errmsg());
        if (be)
            rd_backend_destroy(be);
    }
}

/* y[m][out] of weight W on be for x (m rows from host x), accumulate or not into y's values. */
static void run_linear(rd_backend *be, void *W, const float *x, int32_t m, int32_t in, int32_t out, int acc,
                       const float *y_in, float *y, int x_shift)
{
    float *dx = up(be, NULL, sizeof(float) * ((size_t)m * in + 4));
    be->ops->h2d(be, dx + x_shift, x, sizeof(float) * (size_t)m * in);
    float *dy = up(be, y_in, sizeof(float) * (size_t)m * out);
    be->ops->linear(be, W, dx + x_shift, m, dy, acc);
    CHECK_OK(down(be, y, dy, sizeof(float) * (size_t)m * out));
    be->ops->free(be, dx);
    be->ops->free(be, dy);
}

/* RD_CUDA_GEMM=tc on one shape: against a double reference of the same
 * products (x's bf16 hi and lo halves, or hi alone, times the bf16 weights),
 * and against fp32 x; every row of an m-row call equal to that row alone and
 * to it among other rows (batch invariance); an unaligned x; accumulate.
 * The plan's three reductions are reached by the shapes (q = 1: stores
 * straight from the mma; p = 1: the warps' sums in shared memory; p > 1:
 * partial sums and the last CTA's fold). */
static void tc_case(rd_backend *be, int split, int32_t out, int32_t in, int32_t m)
{
    const size_t n = (size_t)out * in;
    float *w = malloc(sizeof(float) * n), *x = malloc(sizeof(float) * (size_t)(m + 7) * in);
    float *y = malloc(sizeof(float) * (size_t)(m + 7) * out), *y1 = malloc(sizeof(float) * out);
    float *y2 = malloc(sizeof(float) * (size_t)(m + 7) * out), *y0 = malloc(sizeof(float) * (size_t)m * out);
    for (size_t i = 0; i < n; i++)
        w[i] = frand() * 0.5f;
    for (size_t i = 0; i < (size_t)(m + 7) * in; i++)
        x[i] = frand() * 2.0f;
    for (size_t i = 0; i < (size_t)m * out; i++)
        y0[i] = frand();
    void *W = NULL;
    CHECK_OK(be->ops->linear_load(be, w, out, in, &W));
    run_linear(be, W, x, m, in, out, 0, NULL, y, 0);
    double worst = 0, worst_x = 0;
    for (int32_t r = 0; r < m; r++)
        for (int32_t o = 0; o < out; o++) {
            double s = 0, sx = 0, mag = 0;
            for (int32_t k = 0; k < in; k++) {
                const float xv = x[(size_t)r * in + k], hi = bf(xv), lo = bf(xv - hi);
                const double wv = bf(w[(size_t)o * in + k]);
                s += ((double)hi + (split ? (double)lo : 0.0)) * wv;
                sx += (double)xv * wv;
                mag += fabs((double)xv * wv);
            }
            worst = worse(worst, fabs(y[(size_t)r * out + o] - s) / (mag + 1e-30));
            worst_x = worse(worst_x, fabs(y[(size_t)r * out + o] - sx) / (mag + 1e-30));
        }
    cuplan_tc pl;
    CHECK_OK(cuplan_gemm_tc(out, in, 4, &pl));
    printf("# tc %s [%d x %d] x %d rows (on 4 SMs: %d warps x %d CTAs along K): vs its products %.3g, vs fp32 x %.3g "
           "(relative to the terms' magnitudes)\n", split ? "split" : "bf16", out, in, m, pl.wk, pl.p, worst, worst_x);
    CHECK(worst <= (on_emulator() ? 2e-6 : 3e-5), "tc: %.3g from a double sum of the same products", worst);
    CHECK(worst_x <= (split ? 4e-5 : 8e-3), "tc: %.3g from fp32 x", worst_x);
    /* each row alone, and rows 0..m-1 again as the tail of m + 7 rows */
    for (int32_t r = 0; r < m && !test_case_failed; r++) {
        run_linear(be, W, x + (size_t)r * in, 1, in, out, 0, NULL, y1, 0);
        CHECK(!memcmp(y1, y + (size_t)r * out, sizeof(float) * out), "tc: row %d alone differs from it in %d rows", r, m);
    }
    float *xs = malloc(sizeof(float) * (size_t)(m + 7) * in);
    memcpy(xs, x + (size_t)m * in, sizeof(float) * 7 * in);
    memcpy(xs + (size_t)7 * in, x, sizeof(float) * (size_t)m * in);
    run_linear(be, W, xs, m + 7, in, out, 0, NULL, y2, 0);
    CHECK(!memcmp(y2 + (size_t)7 * out, y, sizeof(float) * (size_t)m * out), "tc: rows differ after 7 others");
    free(xs);
    run_linear(be, W, x, m, in, out, 0, NULL, y2, 1);
    CHECK(!memcmp(y2, y, sizeof(float) * (size_t)m * out), "tc: an unaligned x changes the bits");
    run_linear(be, W, x, m, in, out, 1, y0, y2, 0);
    for (size_t i = 0; i < (size_t)m * out && !test_case_failed; i++)
        CHECK(fbits(y2[i]) == fbits(y0[i] + y[i]), "tc accumulate: element %zu %g, expected %g", i, y2[i], y0[i] + y[i]);
    be->ops->linear_free(be, W);
    free(w), free(x), free(y), free(y1), free(y2), free(y0);
}

/* RD_CUDA_FP8=tc: FP8 blocks through the tensor-core GEMM give the bits of
 * the bf16 weights holding the same (dequantized) values: the decode is
 * exact. */
static void tc_fp8_case(rd_backend *tc8, rd_backend *tc, int32_t out, int32_t in, int32_t m)
{
    const size_t n = (size_t)out * in;
    float *w = malloc(sizeof(float) * n), *wd = malloc(sizeof(float) * n), *x = malloc(sizeof(float) * (size_t)m * in);
    float *y8 = malloc(sizeof(float) * (size_t)m * out), *yb = malloc(sizeof(float) * (size_t)m * out);
    uint8_t *blk = malloc(n / RD_FP8_BLOCK * RD_FP8_BYTES);
    for (size_t b = 0; b < n / RD_FP8_BLOCK; b++) {
        const float sc = (float)pow(10.0, -4.0 + 5.0 * (double)(rnd() >> 11) * 0x1.0p-53);
        for (int j = 0; j < RD_FP8_BLOCK; j++)
            w[b * RD_FP8_BLOCK + j] = b == 3 ? 0.0f : frand() * sc;
    }
    for (size_t i = 0; i < (size_t)m * in; i++)
        x[i] = frand();
    CHECK_OK(rd_fp8_quant(w, n, blk));
    rd_fp8_dequant(blk, wd, n / RD_FP8_BLOCK);
    rd_wpart part = {.type = RD_TYPE_FP8_B32, .rows = out, .data = blk};
    void *W8 = NULL, *Wb = NULL;
    CHECK_OK(tc8->ops->linear_load_q(tc8, &part, 1, in, &W8));
    CHECK_OK(tc->ops->linear_load(tc, wd, out, in, &Wb));
    run_linear(tc8, W8, x, m, in, out, 0, NULL, y8, 0);
    run_linear(tc, Wb, x, m, in, out, 0, NULL, yb, 0);
    CHECK(!memcmp(y8, yb, sizeof(float) * (size_t)m * out), "tc fp8 [%d x %d]: differs from bf16 weights of the same values",
          out, in);
    tc8->ops->linear_free(tc8, W8);
    tc->ops->linear_free(tc, Wb);
    free(w), free(wd), free(x), free(y8), free(yb), free(blk);
}

/* W8A8 (RD_CUDA_FP8=w8a8): the reference quantizes x itself, with
 * quant_fp8.c's E4M3 rounding: per row and 32-value block, the least e in
 * [-117, 120] with max|x| <= 448 x 2^e, codes rd_fp8_e4m3_from_f32(x x 2^-e).
 * *sc gets 2^e (NaN for a non-finite block); q the codes' values. */
static void q8_block(const float *x, float *q, float *sc)
{
    float amax = 0.0f;
    int finite = 1;
    for (int j = 0; j < 32; j++) {
        finite &= isfinite(x[j]) != 0;
        amax = fabsf(x[j]) > amax ? fabsf(x[j]) : amax;
    }
    int e = -117;
    while (e < 120 && amax > 448.0f * ldexpf(1.0f, e))
        e++;
    *sc = finite ? ldexpf(1.0f, e) : NAN;
    for (int j = 0; j < 32; j++)
        q[j] = finite ? rd_fp8_e4m3_to_f32(rd_fp8_e4m3_from_f32(x[j] * ldexpf(1.0f, -e))) : 0.0f;
}

/* FP8 blocks of w [out][in] (rd_fp8_quant) loaded on be (NULL: failed); the
 * codes' values and the blocks' scales into wq / ws when given. */
static void *load_fp8(rd_backend *be, const float *w, int32_t out, int32_t in, float *wq, float *ws)
{
    const size_t n = (size_t)out * in;
    uint8_t *blk = malloc(n / RD_FP8_BLOCK * RD_FP8_BYTES);
    void *W = NULL;
    if (rd_fp8_quant(w, n, blk)) {
        free(blk);
        return NULL;
    }
    for (size_t b = 0; wq && b < n / RD_FP8_BLOCK; b++) {
        ws[b] = ldexpf(1.0f, (int)blk[b * RD_FP8_BYTES] - 127);
        for (int j = 0; j < RD_FP8_BLOCK; j++)
            wq[b * RD_FP8_BLOCK + j] = rd_fp8_e4m3_to_f32(blk[b * RD_FP8_BYTES + 1 + j]);
    }
    rd_wpart part = {.type = RD_TYPE_FP8_B32, .rows = out, .data = blk};
    if (be->ops->linear_load_q(be, &part, 1, in, &W))
        W = NULL;
    free(blk);
    return W;
}

/* W8A8 on one shape: on the emulator the bits of the reference's arithmetic
 * (each chunk's exact sum of code products rounded once, times 2^ea then
 * 2^ew, added in chunk order from zero per sub-piece of the plan on 4 SMs,
 * the sub-pieces left to right); on a GPU within 3e-4 of the terms'
 * magnitudes (its tensor cores keep fewer bits, its plan has more pieces).
 * Within E4M3's rounding of x (2^-4 of the terms) of fp32 x; each row alone
 * and after 7 others bit for bit; a zero block, blocks from 1e-3 to 1e2. */
static void tc_q8_case(rd_backend *be, int32_t out, int32_t in, int32_t m)
{
    const size_t n = (size_t)out * in, nb = (size_t)in / 32;
    float *w = malloc(sizeof(float) * n), *wq = malloc(sizeof(float) * n), *ws = malloc(sizeof(float) * n / 32);
    float *x = malloc(sizeof(float) * (size_t)(m + 7) * in), *xq = malloc(sizeof(float) * (size_t)m * in);
    float *xs = malloc(sizeof(float) * (size_t)m * nb), *y = malloc(sizeof(float) * (size_t)(m + 7) * out);
    float *y1 = malloc(sizeof(float) * out), *y2 = malloc(sizeof(float) * (size_t)(m + 7) * out);
    for (size_t b = 0; b < n / 32; b++) {
        const float sc = (float)pow(10.0, -3.0 + 3.0 * (double)(rnd() >> 11) * 0x1.0p-53);
        for (int j = 0; j < 32; j++)
            w[b * 32 + j] = frand() * sc;
    }
    for (size_t b = 0; b < (size_t)(m + 7) * nb; b++) {
        const float sc = b == 1 ? 0.0f : (float)pow(10.0, -3.0 + 5.0 * (double)(rnd() >> 11) * 0x1.0p-53);
        for (int j = 0; j < 32; j++)
            x[b * 32 + j] = frand() * sc;
    }
    for (size_t b = 0; b < (size_t)m * nb; b++)
        q8_block(x + b * 32, xq + b * 32, xs + b);
    void *W = load_fp8(be, w, out, in, wq, ws);
    CHECK(W != NULL, "w8a8: cannot load the fp8 weight: %s", rd_errmsg());
    run_linear(be, W, x, m, in, out, 0, NULL, y, 0);
    cuplan_tc pl;
    CHECK_OK(cuplan_gemm_tc(out, in, 4, &pl));
    double worst = 0, worst_x = 0;
    size_t differ = 0;
    for (int32_t r = 0; r < m; r++)
        for (int32_t o = 0; o < out; o++) {
            float tot = 0.0f;
            double mag = 0, sx = 0;
            for (int32_t i = 0; i < pl.q; i++) {
                float acc = 0.0f;
                for (int32_t c = i * pl.kp; c < (i + 1) * pl.kp; c += 32) {
                    double d = 0;
                    for (int k = c; k < c + 32; k++)
                        d += (double)xq[(size_t)r * in + k] * wq[(size_t)o * in + k];
                    const float t1 = (float)d * xs[(size_t)r * nb + c / 32], t2 = t1 * ws[((size_t)o * in + c) / 32];
                    acc = acc + t2;
                }
                tot = i == 0 ? acc : tot + acc;
            }
            for (int32_t k = 0; k < in; k++) {
                const size_t xi = (size_t)r * in + k, wi = (size_t)o * in + k;
                const double dq = (double)xq[xi] * xs[(size_t)r * nb + k / 32] * wq[wi] * ws[wi / 32];
                mag += fabs(dq);
                sx += (double)x[xi] * wq[wi] * ws[wi / 32];
            }
            const float got = y[(size_t)r * out + o];
            differ += fbits(got) != fbits(tot);
            worst = worse(worst, fabs(got - (double)tot) / (mag + 1e-30));
            worst_x = worse(worst_x, fabs(got - sx) / (mag + 1e-30));
        }
    printf("# w8a8 [%d x %d] x %d rows (on 4 SMs: q %d, %d warps x %d CTAs): %zu outputs differ from the reference's "
           "bits, worst %.3g; vs fp32 x %.3g (relative to the terms' magnitudes)\n", out, in, m, pl.q, pl.wk, pl.p,
           differ, worst, worst_x);
    if (on_emulator())
        CHECK(differ == 0, "w8a8: %zu outputs are not the reference's bits (worst %.3g)", differ, worst);
    else
        CHECK(worst <= 3e-4, "w8a8: %.3g from the reference", worst);
    CHECK(worst_x <= 0.07 && worst_x > 0, "w8a8: %.3g from fp32 x (E4M3 rounds to 2^-4)", worst_x);
    for (int32_t r = 0; r < m && !test_case_failed; r++) {
        run_linear(be, W, x + (size_t)r * in, 1, in, out, 0, NULL, y1, 0);
        CHECK(!memcmp(y1, y + (size_t)r * out, sizeof(float) * out), "w8a8: row %d alone differs from it in %d rows", r,
              m);
    }
    float *xsh = malloc(sizeof(float) * (size_t)(m + 7) * in);
    memcpy(xsh, x + (size_t)m * in, sizeof(float) * 7 * in);
    memcpy(xsh + (size_t)7 * in, x, sizeof(float) * (size_t)m * in);
    run_linear(be, W, xsh, m + 7, in, out, 0, NULL, y2, 0);
    CHECK(!memcmp(y2 + (size_t)7 * out, y, sizeof(float) * (size_t)m * out), "w8a8: rows differ after 7 others");
    free(xsh);
    be->ops->linear_free(be, W);
    free(w), free(wq), free(ws), free(x), free(xq), free(xs), free(y), free(y1), free(y2);
}

/* W8A8 through an identity weight: each output is one product, so the device
 * returns x's quantized value exactly (the hardware's E4M3 conversion against
 * quant_fp8.c's, bit for bit, on a GPU too): values on every side of the code
 * grid, ties, subnormal codes, a zero row, a NaN (its row's outputs all NaN). */
static void tc_q8_exact_case(rd_backend *be)
{
    const int32_t D = 256, M = 6;
    float *w = calloc((size_t)D * D, sizeof(float)), *x = malloc(sizeof(float) * M * D), *y = malloc(sizeof(float) * M * D);
    for (int32_t i = 0; i < D; i++)
        w[(size_t)i * D + i] = 1.0f;
    for (int32_t i = 0; i < M * D; i++) {
        const int kind = i % 4;
        const float base = ldexpf(1.0f, (int)(rnd() % 24) - 12);
        x[i] = kind == 0 ? frand() * base * 8.0f            /* anywhere */
             : kind == 1 ? base * (1.0f + (float)(2 * (int)(rnd() % 8) + 1) / 16.0f) /* ties between codes */
             : kind == 2 ? frand() * base * 1e-3f            /* subnormal codes of the block */
                         : -base * 1.9375f;
    }
    for (int32_t i = 0; i < D; i++)
        x[3 * D + i] = 0.0f;
    x[4 * D + 77] = NAN;
    void *W = load_fp8(be, w, D, D, NULL, NULL);
    CHECK(W != NULL, "w8a8: cannot load the fp8 weight: %s", rd_errmsg());
    run_linear(be, W, x, M, D, D, 0, NULL, y, 0);
    size_t bad = 0;
    for (int32_t r = 0; r < M; r++)
        for (int32_t b = 0; b < D / 32; b++) {
            float q[32], sc;
            q8_block(x + (size_t)r * D + 32 * b, q, &sc);
            for (int j = 0; j < 32; j++) {
                const float got = y[(size_t)r * D + 32 * b + j];
                const float want = r == 4 ? NAN : q[j] * sc;
                const int ok = isnan(want) ? isnan(got) : fbits(got) == fbits(want) || (got == 0.0f && want == 0.0f);
                if (!ok && bad++ < 5)
                    printf("# w8a8 exact: row %d column %d: x %a, got %a, want %a\n", r, 32 * b + j,
                           x[(size_t)r * D + 32 * b + j], got, want);
            }
        }
    CHECK(bad == 0, "w8a8 exact: %zu outputs are not x's E4M3 value", bad);
    be->ops->linear_free(be, W);
    free(w), free(x), free(y);
}

/* Q8_0 blocks of w [out][in] (ggml_quant_q8_0) loaded on be as a layer's
 * linear (NULL: failed). */
static void *load_q80(rd_backend *be, const float *w, int32_t out, int32_t in)
{
    uint8_t *blk = malloc((size_t)out * ggml_row_bytes(GGML_Q8_0, (uint64_t)in));
    void *W = NULL;
    rd_wpart part = {.type = GGML_Q8_0, .rows = out, .data = blk};
    if (ggml_quant_q8_0(w, (uint64_t)out * in, blk) || be->ops->linear_load_q(be, &part, 1, in, &W))
        W = NULL;
    free(blk);
    return W;
}

/* Weights for the fusion cases: bf16 from fp32, or (tc_wfmt) FP8 blocks (1), Q8_0 blocks (2). */
static int tc_wfmt;
static int load_w(rd_backend *be, const float *w, int32_t out, int32_t in, void **W)
{
    if (!tc_wfmt)
        return be->ops->linear_load(be, w, out, in, W);
    *W = tc_wfmt == 1 ? load_fp8(be, w, out, in, NULL, NULL) : load_q80(be, w, out, in);
    return *W ? 0 : RD_EINVAL;
}

/* The same weights (tc_wfmt's format) on two backends, e.g. the split-K and
 * a tile kernel, or two tile kernels: the same bits; and not all zero, so a
 * kernel that wrote nothing would not pass. */
static void tc_pair_case(rd_backend *a, rd_backend *b, int32_t out, int32_t in, int32_t m)
{
    float *w = malloc(sizeof(float) * out * in), *x = malloc(sizeof(float) * m * in);
    float *ya = malloc(sizeof(float) * m * out), *yb = malloc(sizeof(float) * m * out);
    for (int64_t i = 0; i < (int64_t)out * in; i++)
        w[i] = frand() * 0.2f;
    for (int64_t i = 0; i < (int64_t)m * in; i++)
        x[i] = frand() * (float)(1 + i % 7);
    void *Wa = NULL, *Wb = NULL;
    CHECK(!load_w(a, w, out, in, &Wa) && !load_w(b, w, out, in, &Wb), "cannot load the weights (format %d): %s",
          tc_wfmt, rd_errmsg());
    if (!test_case_failed) {
        run_linear(a, Wa, x, m, in, out, 0, NULL, ya, 0);
        run_linear(b, Wb, x, m, in, out, 0, NULL, yb, 0);
        CHECK(!memcmp(ya, yb, sizeof(float) * m * out), "[%d x %d] x %d, format %d: the two kernels differ", out,
              in, m, tc_wfmt);
        double mag = 0;
        for (int64_t i = 0; i < (int64_t)m * out; i++)
            mag += fabs(ya[i]);
        CHECK(mag > 0, "[%d x %d] x %d: all outputs zero", out, in, m);
    }
    if (Wa) a->ops->linear_free(a, Wa);
    if (Wb) b->ops->linear_free(b, Wb);
    free(w), free(x), free(ya), free(yb);
}

/* A gate|up GEMM ended by SwiGLU / GeGLU (the deferred tensor-core GEMM's
 * gated epilogue) against the same two ops unfused (RD_CUDA_FUSE=0): the
 * same bits, for each of the plan's reductions; F need not be a multiple of
 * the 8 features a CTA takes. */
static void tc_gated_case(rd_backend *tc, rd_backend *nofuse, int32_t F, int32_t in, int32_t m, int geglu)
{
    const int32_t out = 2 * F;
    float *w = malloc(sizeof(float) * out * in), *x = malloc(sizeof(float) * m * in);
    float *y1 = malloc(sizeof(float) * m * F), *y2 = malloc(sizeof(float) * m * F);
    for (int64_t i = 0; i < (int64_t)out * in; i++)
        w[i] = frand() * 0.3f;
    for (int64_t i = 0; i < (int64_t)m * in; i++)
        x[i] = frand() * 2.0f;
    rd_backend *bes[2] = {tc, nofuse};
    float *ys[2] = {y1, y2};
    uint64_t launches[2];
    for (int k = 0; k < 2; k++) {
        rd_backend *be = bes[k];
        void *W = NULL;
        CHECK_OK(load_w(be, w, out, in, &W));
        float *dx = up(be, x, sizeof(float) * m * in), *dgu = up(be, NULL, sizeof(float) * m * out);
        float *dout = up(be, NULL, sizeof(float) * m * F);
        CHECK_OK(be->ops->sync(be));
        uint64_t k0 = cuemu_launch_count();
        be->ops->linear(be, W, dx, m, dgu, 0);
        if (geglu)
            be->ops->geglu(be, dgu, m, F, dout);
        else
            be->ops->swiglu(be, dgu, m, F, dout);
        CHECK_OK(down(be, ys[k], dout, sizeof(float) * m * F));
        launches[k] = cuemu_launch_count() - k0;
        be->ops->free(be, dx), be->ops->free(be, dgu), be->ops->free(be, dout);
        be->ops->linear_free(be, W);
    }
    CHECK(!memcmp(y1, y2, sizeof(float) * m * F), "tc %s [%d x %d] x %d: fused differs from unfused",
          geglu ? "geglu" : "swiglu", F, in, m);
    CHECK(!on_emulator() || (launches[0] == 1 && launches[1] == 2), "tc gated: %llu kernels fused, %llu unfused",
          (unsigned long long)launches[0], (unsigned long long)launches[1]);
    free(w), free(x), free(y1), free(y2);
}

/* An RMSNorm whose output a tensor-core GEMM reads next (its fused
 * prologue, for up to RD_CUDA_NORM_ROWS rows), then optionally SwiGLU: the
 * GEMM's (or SwiGLU's) output and the norm's own output equal the unfused
 * ops' bit for bit, with Gemma's (1 + w) offset too. */
static void tc_norm_case(rd_backend *tc, rd_backend *nofuse, int32_t out, int32_t in, int32_t m, float w_off, int glu)
{
    float *w = malloc(sizeof(float) * out * in), *x = malloc(sizeof(float) * m * in), *nw = malloc(sizeof(float) * in);
    const int32_t yn = glu ? out / 2 : out;
    float *ys[2] = {malloc(sizeof(float) * m * yn), malloc(sizeof(float) * m * yn)};
    float *xns[2] = {malloc(sizeof(float) * m * in), malloc(sizeof(float) * m * in)};
    for (int64_t i = 0; i < (int64_t)out * in; i++)
        w[i] = frand() * 0.3f;
    for (int64_t i = 0; i < (int64_t)m * in; i++)
        x[i] = frand() * 3.0f;
    for (int32_t i = 0; i < in; i++)
        nw[i] = w_off != 0.0f ? frand() * 0.2f : 1.0f + frand() * 0.5f;
    nw[1] = -0.0f;
    rd_backend *bes[2] = {tc, nofuse};
    uint64_t launches[2];
    for (int k = 0; k < 2; k++) {
        rd_backend *be = bes[k];
        void *W = NULL;
        CHECK_OK(load_w(be, w, out, in, &W));
        float *dx = up(be, x, sizeof(float) * m * in), *dnw = up(be, nw, sizeof(float) * in);
        float *dxn = up(be, NULL, sizeof(float) * m * in), *dy = up(be, NULL, sizeof(float) * m * out);
        float *dg = up(be, NULL, sizeof(float) * m * yn);
        CHECK_OK(be->ops->sync(be));
        uint64_t k0 = cuemu_launch_count();
        be->ops->rmsnorm(be, dx, dnw, m, in, 1e-5f, w_off, dxn);
        be->ops->linear(be, W, dxn, m, dy, 0);
        if (glu)
            be->ops->swiglu(be, dy, m, yn, dg);
        CHECK_OK(down(be, ys[k], glu ? dg : dy, sizeof(float) * m * yn));
        CHECK_OK(down(be, xns[k], dxn, sizeof(float) * m * in));
        launches[k] = cuemu_launch_count() - k0;
        be->ops->free(be, dx), be->ops->free(be, dnw), be->ops->free(be, dxn), be->ops->free(be, dy);
        be->ops->free(be, dg);
        be->ops->linear_free(be, W);
    }
    CHECK(!memcmp(xns[0], xns[1], sizeof(float) * m * in), "tc norm [%d x %d] x %d: the norm's output differs", out,
          in, m);
    CHECK(!memcmp(ys[0], ys[1], sizeof(float) * m * yn), "tc norm [%d x %d] x %d (w_off %g%s): fused differs", out, in,
          m, w_off, glu ? ", swiglu" : "");
    const uint64_t want = m <= 8 ? 1 : 2; /* RD_CUDA_NORM_ROWS default: 8; SwiGLU is the GEMM epilogue either way */
    CHECK(!on_emulator() || launches[0] == want, "tc norm: %llu kernels for %d rows, expected %llu",
          (unsigned long long)launches[0], m, (unsigned long long)want);
    free(w), free(x), free(nw), free(ys[0]), free(ys[1]), free(xns[0]), free(xns[1]);
}

/* A q|k|v GEMM, its RoPE and the KV write (Llama's and Qwen2.5-without-bias's
 * order): with the GEMM pending the RoPE and KV write become its epilogue
 * (TC_ROPE: each CTA holds element j of a head and j + head_dim / 2). Its q|k|v
 * rows and both caches equal the unfused kernels' (RD_CUDA_FUSE=0) bit for
 * bit; a padding row (slot -1) writes no cache. With norms (Qwen3's and Gemma
 * 3's q and k norms before the RoPE, norm weights offset by w_off), the norms
 * join the epilogue too: the last CTA to finish a head's column tiles
 * normalizes and rotates it. Then nohn (RD_CUDA_TC_HNORM=0: the GEMM, then
 * k_hnorm_rope) gives the same bits in two kernels. */
static void fill_norm_weights(float *w, int32_t n);
static int32_t dev_sms(rd_backend *be);
static void tc_rope_norm_case(rd_backend *tc, rd_backend *nofuse, rd_backend *nohn, int32_t nh, int32_t nkv,
                              int32_t hd, int32_t IN, int32_t M, int with_bias, int norms, float w_off)
{
    const int32_t S = (nh + 2 * nkv) * hd, BS = 16, MAXB = 4, MAXPOS = 64, half = hd / 2;
    const size_t n = (size_t)M * S, cache = (size_t)M * MAXB * nkv * BS * hd;
    float *w = malloc(sizeof(float) * S * IN), *xin = malloc(sizeof(float) * M * IN);
    float *cs = malloc(sizeof(float) * MAXPOS * hd), *ys[2] = {malloc(sizeof(float) * n), malloc(sizeof(float) * n)};
    uint16_t *kcs[2] = {malloc(2 * cache), malloc(2 * cache)}, *vcs[2] = {malloc(2 * cache), malloc(2 * cache)};
    int32_t *tok = malloc(sizeof(int32_t) * M), *pos = malloc(sizeof(int32_t) * M), *slot = malloc(sizeof(int32_t) * M);
    int32_t *qs = malloc(sizeof(int32_t) * (M + 1)), *ctx = malloc(sizeof(int32_t) * M);
    int32_t *tab = malloc(sizeof(int32_t) * M * MAXB);
    for (int64_t i = 0; i < (int64_t)S * IN; i++)
        w[i] = frand() * 0.5f;
    for (int64_t i = 0; i < (int64_t)M * IN; i++)
        xin[i] = frand() * 2.0f;
    float *bias = malloc(sizeof(float) * S), *qn = malloc(sizeof(float) * hd), *kn = malloc(sizeof(float) * hd);
    for (int32_t i = 0; i < S; i++)
        bias[i] = frand();
    fill_norm_weights(qn, hd);
    fill_norm_weights(kn, hd);
    if (w_off != 0.0f) /* Gemma's weights around 0, applied as 1 + w */
        for (int32_t i = 0; i < hd; i++)
            qn[i] -= 1.0f, kn[i] -= 1.25f;
    for (int32_t t = 0; t < MAXPOS; t++)
        for (int32_t i = 0; i < half; i++) {
            double ang = t * pow(1e4, -2.0 * i / hd);
            cs[(t * half + i) * 2] = (float)cos(ang);
            cs[(t * half + i) * 2 + 1] = (float)sin(ang);
        }
    for (int32_t i = 0; i < M; i++) {
        tok[i] = i, pos[i] = (i * 37 + 3) % MAXPOS, qs[i] = i, ctx[i] = pos[i] + 1;
        for (int32_t b = 0; b < MAXB; b++)
            tab[i * MAXB + b] = i * MAXB + b;
        slot[i] = i == 1 ? -1 : tab[i * MAXB + pos[i] / BS] * BS + pos[i] % BS;
    }
    qs[M] = M;
    rd_step st = {M, M, MAXB, tok, pos, slot, qs, ctx, tab, NULL};
    rd_attn_shape a = {nh, nkv, hd, BS, (float)(1.0 / sqrt((double)hd)), 0};
    rd_backend *bes[3] = {tc, nofuse, nohn};
    uint64_t launches[3];
    float *ys2 = malloc(sizeof(float) * n);
    uint16_t *kc2 = malloc(2 * cache), *vc2 = malloc(2 * cache);
    for (int k = 0; k < (nohn ? 3 : 2); k++) {
        rd_backend *be = bes[k];
        void *W;
        CHECK_OK(load_w(be, w, S, IN, &W));
        rd_step_dev sd;
        CHECK_OK(be->ops->step_upload(be, &st, &sd));
        float *dx = up(be, xin, sizeof(float) * M * IN), *dy = up(be, NULL, sizeof(float) * n);
        float *dcs = up(be, cs, sizeof(float) * MAXPOS * hd), *db = up(be, bias, sizeof(float) * S);
        float *dqn = up(be, qn, sizeof(float) * hd), *dkn = up(be, kn, sizeof(float) * hd);
        uint16_t *zero = calloc(cache, 2);
        void *dk = up(be, zero, 2 * cache), *dv = up(be, zero, 2 * cache);
        free(zero);
        CHECK_OK(be->ops->sync(be));
        uint64_t k0 = cuemu_launch_count();
        be->ops->linear(be, W, dx, M, dy, 0);
        if (with_bias) /* Qwen2's q|k|v bias */
            be->ops->add_bias(be, dy, S, M, S, db);
        if (norms) {
            be->ops->head_rmsnorm(be, dy, S, M, nh, hd, dqn, 1e-6f, w_off);
            be->ops->head_rmsnorm(be, dy + nh * hd, S, M, nkv, hd, dkn, 1e-6f, w_off);
        }
        be->ops->rope(be, dy, S, M, nh + nkv, hd, sd.positions, dcs);
        be->ops->kv_write(be, &a, dy + nh * hd, dy + (nh + nkv) * hd, S, &sd, dk, dv);
        CHECK_OK(be->ops->sync(be));
        launches[k] = cuemu_launch_count() - k0;
        CHECK_OK(down(be, k < 2 ? ys[k] : ys2, dy, sizeof(float) * n));
        CHECK_OK(down(be, k < 2 ? kcs[k] : kc2, dk, 2 * cache));
        CHECK_OK(down(be, k < 2 ? vcs[k] : vc2, dv, 2 * cache));
        be->ops->free(be, dx), be->ops->free(be, dy), be->ops->free(be, dcs), be->ops->free(be, dk);
        be->ops->free(be, dv), be->ops->free(be, db), be->ops->free(be, dqn), be->ops->free(be, dkn);
        be->ops->linear_free(be, W);
    }
    const char *what = norms ? (w_off != 0.0f ? ", q/k norms (1 + w)" : ", q/k norms") : with_bias ? ", bias" : "";
    CHECK(!memcmp(ys[0], ys[1], sizeof(float) * n), "tc rope %d/%d x %d, %d rows%s: q|k|v differ from unfused", nh,
          nkv, hd, M, what);
    CHECK(!memcmp(kcs[0], kcs[1], 2 * cache) && !memcmp(vcs[0], vcs[1], 2 * cache),
          "tc rope %d/%d x %d, %d rows%s: the KV cache differs from unfused", nh, nkv, hd, M, what);
    size_t written = 0;
    for (size_t i = 0; i < cache; i++)
        written += kcs[0][i] != 0;
    CHECK(written > 0, "tc rope: nothing reached the K cache");
    CHECK(!on_emulator() || launches[0] == 1, "tc rope%s: %llu kernels for GEMM%s + RoPE + KV write", what,
          (unsigned long long)launches[0], with_bias ? " + bias" : "");
    if (nohn) {
        CHECK(!memcmp(ys[0], ys2, sizeof(float) * n) && !memcmp(kcs[0], kc2, 2 * cache) &&
                  !memcmp(vcs[0], vc2, 2 * cache),
              "tc rope %d/%d x %d, %d rows%s: the epilogue's norms differ from RD_CUDA_TC_HNORM=0's", nh, nkv, hd, M,
              what);
        CHECK(!on_emulator() || launches[2] == 2, "tc rope%s, RD_CUDA_TC_HNORM=0: %llu kernels (want the GEMM, then "
              "k_hnorm_rope)", what, (unsigned long long)launches[2]);
    }
    free(bias), free(qn), free(kn), free(ys2), free(kc2), free(vc2);
    free(w), free(xin), free(cs), free(ys[0]), free(ys[1]), free(kcs[0]), free(kcs[1]), free(vcs[0]), free(vcs[1]);
    free(tok), free(pos), free(slot), free(qs), free(ctx), free(tab);
}

static void tc_rope_case(rd_backend *tc, rd_backend *nofuse, int32_t nh, int32_t nkv, int32_t hd, int32_t IN,
                         int32_t M, int with_bias)
{
    tc_rope_norm_case(tc, nofuse, NULL, nh, nkv, hd, IN, M, with_bias, 0, 0.0f);
}

/* The q and k norms pending with the q|k|v GEMM, then no RoPE (an op that
 * reads the rows, here a download): the GEMM, then the norms on their own;
 * the unfused kernels' bits. */
static void tc_norm_no_rope_case(rd_backend *tc, rd_backend *nofuse, int32_t nh, int32_t nkv, int32_t hd, int32_t IN,
                                 int32_t M)
{
    const int32_t S = (nh + 2 * nkv) * hd;
    const size_t n = (size_t)M * S;
    float *w = malloc(sizeof(float) * S * IN), *xin = malloc(sizeof(float) * M * IN);
    float *qn = malloc(sizeof(float) * hd), *kn = malloc(sizeof(float) * hd);
    float *ys[2] = {malloc(sizeof(float) * n), malloc(sizeof(float) * n)};
    for (int64_t i = 0; i < (int64_t)S * IN; i++)
        w[i] = frand() * 0.5f;
    for (int64_t i = 0; i < (int64_t)M * IN; i++)
        xin[i] = frand() * 2.0f;
    fill_norm_weights(qn, hd);
    fill_norm_weights(kn, hd);
    rd_backend *bes[2] = {tc, nofuse};
    for (int k = 0; k < 2; k++) {
        rd_backend *be = bes[k];
        void *W;
        CHECK_OK(load_w(be, w, S, IN, &W));
        float *dx = up(be, xin, sizeof(float) * M * IN), *dy = up(be, NULL, sizeof(float) * n);
        float *dqn = up(be, qn, sizeof(float) * hd), *dkn = up(be, kn, sizeof(float) * hd);
        be->ops->linear(be, W, dx, M, dy, 0);
        be->ops->head_rmsnorm(be, dy, S, M, nh, hd, dqn, 1e-6f, 0.0f);
        be->ops->head_rmsnorm(be, dy + nh * hd, S, M, nkv, hd, dkn, 1e-6f, 0.0f);
        CHECK_OK(down(be, ys[k], dy, sizeof(float) * n));
        be->ops->free(be, dx), be->ops->free(be, dy), be->ops->free(be, dqn), be->ops->free(be, dkn);
        be->ops->linear_free(be, W);
    }
    CHECK(!memcmp(ys[0], ys[1], sizeof(float) * n), "tc q/k norms without a RoPE, %d/%d x %d, %d rows: differ from "
          "unfused", nh, nkv, hd, M);
    free(w), free(xin), free(qn), free(kn), free(ys[0]), free(ys[1]);
}

/* Qwen3's and Gemma 3's layer entry in tc mode: the q|k|v GEMM with the q and
 * k norms, RoPE and KV write as its epilogue (one kernel), on each of the
 * plan's reductions, bf16 and Q8_0 weights. */
static void test_gemm_tc_hnorm(void)
{
    rd_backend *tc = dev_with("RD_CUDA_GEMM", "tc", NULL, NULL);
    rd_backend *nofuse = dev_with("RD_CUDA_GEMM", "tc", "RD_CUDA_FUSE", "0");
    rd_backend *nohn = dev_with("RD_CUDA_GEMM", "tc", "RD_CUDA_TC_HNORM", "0");
    setenv("RD_CUDA_Q8", "tc", 1);
    rd_backend *q8 = dev_with("RD_CUDA_GEMM", "tc", NULL, NULL), *q8nf = dev_with("RD_CUDA_GEMM", "tc", "RD_CUDA_FUSE", "0");
    rd_backend *q8nohn = dev_with("RD_CUDA_GEMM", "tc", "RD_CUDA_TC_HNORM", "0");
    unsetenv("RD_CUDA_Q8");
    CHECK(tc && nofuse && nohn && q8 && q8nf && q8nohn, "cannot create the tc backends: %s", rd_errmsg());
    const struct {
        int32_t nh, nkv, hd, in, m;
        int bias;
        float w_off;
        const char *what;
    } cases[] = {
        {4, 2, 128, 1024, 3, 0, 0.0f, "Qwen3's head_dim"},
        {5, 1, 64, 96, 7, 0, 0.0f, "one sub-piece"},
        {2, 1, 256, 512, 20, 0, 1.0f, "Gemma 3's head_dim and 1 + w; 2 m16 tiles"},
        {4, 2, 128, 512, 1, 1, 0.0f, "a q|k|v bias first; one row"},
        {16, 8, 128, 1024, 40, 0, 0.0f, "Qwen3-0.6B's heads; 3 row tiles"},
        {4, 2, 32, 256, 5, 0, 0.0f, "the tiny models' head_dim 32 (lanes j and j + 16 swap)"},
    };
    int reductions[3] = {0, 0, 0}; /* q = 1, p = 1, p > 1 */
    const int32_t sms = on_emulator() ? 4 : dev_sms(tc);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0] && !test_case_failed; i++) {
        const int32_t out = (cases[i].nh + 2 * cases[i].nkv) * cases[i].hd;
        cuplan_tc pl;
        CHECK(cuplan_gemm_tc(out, cases[i].in, sms, &pl) == 0, "plan [%d x %d]", out, cases[i].in);
        reductions[pl.q == 1 ? 0 : pl.p == 1 ? 1 : 2]++;
        tc_rope_norm_case(tc, nofuse, nohn, cases[i].nh, cases[i].nkv, cases[i].hd, cases[i].in, cases[i].m,
                          cases[i].bias, 1, cases[i].w_off);
        if (test_case_failed)
            fprintf(stderr, "  (case: %s)\n", cases[i].what);
    }
    if (!test_case_failed) tc_norm_no_rope_case(tc, nofuse, 4, 2, 128, 512, 3);
    if (on_emulator() && !test_case_failed) {
        /* p > 1 needs fewer column tiles than 2 per SM: with head_dim >= 64, more SMs than the emulator's 4 */
        setenv("CUEMU_SMS", "16", 1);
        rd_backend *tc16 = dev_with("RD_CUDA_GEMM", "tc", NULL, NULL);
        rd_backend *nofuse16 = dev_with("RD_CUDA_GEMM", "tc", "RD_CUDA_FUSE", "0");
        rd_backend *nohn16 = dev_with("RD_CUDA_GEMM", "tc", "RD_CUDA_TC_HNORM", "0");
        unsetenv("CUEMU_SMS");
        cuplan_tc pl;
        CHECK(tc16 && nofuse16 && nohn16 && dev_sms(tc16) == 16, "cannot create the 16-SM emulator backends");
        CHECK(cuplan_gemm_tc(192, 1024, 16, &pl) == 0 && pl.p == 2, "plan [192 x 1024] on 16 SMs: p %d", pl.p);
        if (!test_case_failed) tc_rope_norm_case(tc16, nofuse16, nohn16, 1, 1, 64, 1024, 5, 0, 1, 0.0f);
        if (!test_case_failed) tc_rope_norm_case(tc16, nofuse16, nohn16, 1, 1, 64, 1024, 20, 0, 1, 1.0f);
        reductions[2] += !test_case_failed;
        rd_backend *all16[3] = {tc16, nofuse16, nohn16};
        for (int i = 0; i < 3; i++)
            if (all16[i])
                rd_backend_destroy(all16[i]);
    }
    CHECK(test_case_failed || !on_emulator() || (reductions[0] && reductions[1] && reductions[2]),
          "the cases miss a reduction: q = 1 x%d, p = 1 x%d, p > 1 x%d", reductions[0], reductions[1], reductions[2]);
    tc_wfmt = 2;
    if (!test_case_failed) tc_rope_norm_case(q8, q8nf, q8nohn, 4, 2, 128, 1024, 3, 0, 1, 0.0f);
    if (!test_case_failed) tc_rope_norm_case(q8, q8nf, q8nohn, 2, 1, 256, 512, 9, 0, 1, 1.0f);
    tc_wfmt = 0;
    rd_backend *all[6] = {tc, nofuse, nohn, q8, q8nf, q8nohn};
    for (int i = 0; i < 6; i++)
        if (all[i])
            rd_backend_destroy(all[i]);
}

static void test_gemm_tc(void)
{
    rd_backend *tc = dev_with("RD_CUDA_GEMM", "tc", NULL, NULL);
    rd_backend *tcb = dev_with("RD_CUDA_GEMM", "tc", "RD_CUDA_ACT", "bf16");
    rd_backend *tc8 = dev_with("RD_CUDA_GEMM", "tc", "RD_CUDA_FP8", "tc");
    CHECK(tc && tcb && tc8, "cannot create the tc backends: %s", rd_errmsg());
    /* the plans the cases reach on the emulator's 4 SMs */
    cuplan_tc pl;
    CHECK(cuplan_gemm_tc(24, 1024, 4, &pl) == 0 && pl.p == 2 && pl.q == 8, "plan [24 x 1024]: p %d q %d", pl.p, pl.q);
    CHECK(cuplan_gemm_tc(300, 512, 4, &pl) == 0 && pl.p == 1 && pl.q == 4, "plan [300 x 512]: p %d q %d", pl.p, pl.q);
    CHECK(cuplan_gemm_tc(100, 96, 4, &pl) == 0 && pl.q == 1, "plan [100 x 96]: q %d", pl.q);
    CHECK(cuplan_gemm_tc(100, 100, 4, &pl) == RD_ENOTSUP, "in %% 32 != 0 must be refused");
    if (test_case_failed)
        goto done;
    tc_case(tc, 1, 24, 1024, 5);        /* p = 2: partial sums, the last CTA adds them */
    if (test_case_failed) goto done;
    tc_case(tc, 1, 300, 512, 40);       /* p = 1, 4 warps; 4 m16 tiles per warp; out % 16 != 0 */
    if (test_case_failed) goto done;
    tc_case(tc, 1, 100, 96, 3);         /* q = 1; fewer chunks than the unroll */
    if (test_case_failed) goto done;
    tc_case(tcb, 0, 300, 512, 20);      /* hi only (RD_CUDA_ACT=bf16); 2 m16 tiles per warp */
    if (test_case_failed) goto done;
    tc_case(tcb, 0, 24, 1024, 17);
    if (test_case_failed) goto done;
    tc_fp8_case(tc8, tc, 40, 1024, 6);
    if (test_case_failed) goto done;
    tc_fp8_case(tc8, tc, 83, 160, 18);
    if (test_case_failed) goto done;
    {
        rd_backend *nofuse = dev_with("RD_CUDA_GEMM", "tc", "RD_CUDA_FUSE", "0");
        CHECK(nofuse != NULL, "cannot create the unfused tc backend");
        tc_gated_case(tc, nofuse, 12, 1024, 5, 0);  /* p = 2 */
        if (!test_case_failed) tc_gated_case(tc, nofuse, 150, 512, 40, 0); /* p = 1; F % 8 != 0 */
        if (!test_case_failed) tc_gated_case(tc, nofuse, 37, 96, 3, 1);    /* q = 1, GeGLU */
        if (!test_case_failed) tc_gated_case(tc, nofuse, 12, 1024, 17, 1); /* p = 2, GeGLU, 2 m16 tiles */
        if (!test_case_failed) tc_norm_case(tc, nofuse, 24, 1024, 3, 0.0f, 0);  /* p = 2 */
        if (!test_case_failed) tc_norm_case(tc, nofuse, 300, 512, 8, 1.0f, 0);  /* p = 1, Gemma's offset */
        if (!test_case_failed) tc_norm_case(tc, nofuse, 100, 96, 1, 0.0f, 0);   /* q = 1; in < 256 */
        if (!test_case_failed) tc_norm_case(tc, nofuse, 300, 512, 5, 0.0f, 1);  /* then SwiGLU: one kernel */
        if (!test_case_failed) tc_norm_case(tc, nofuse, 300, 512, 12, 0.0f, 1); /* too many rows: not fused */
        if (!test_case_failed) tc_rope_case(tc, nofuse, 5, 1, 64, 96, 7, 0);   /* q = 1 */
        if (!test_case_failed) tc_rope_case(tc, nofuse, 4, 2, 16, 512, 20, 1); /* p = 1, head_dim 16, a bias */
        if (!test_case_failed) tc_rope_case(tc, nofuse, 2, 1, 16, 1024, 3, 1); /* p = 2, a bias */
        if (!test_case_failed) tc_rope_case(tc, nofuse, 5, 1, 64, 96, 7, 1);   /* q = 1, a bias */
        if (nofuse) rd_backend_destroy(nofuse);
    }
    if (test_case_failed) goto done;
    {
        /* The 64 x 64 tile kernel (from RD_CUDA_TC_BIG_ROWS rows on; 24 here): the same bits as the other
           kernel, which serves the rows alone, the unfused gated op and the FP8 comparison below. */
        rd_backend *big = dev_with("RD_CUDA_GEMM", "tc", "RD_CUDA_TC_BIG_ROWS", "24");
        rd_backend *big8 = NULL, *nofuse = dev_with("RD_CUDA_GEMM", "tc", "RD_CUDA_FUSE", "0");
        setenv("RD_CUDA_FP8", "tc", 1);
        big8 = dev_with("RD_CUDA_GEMM", "tc", "RD_CUDA_TC_BIG_ROWS", "24");
        unsetenv("RD_CUDA_FP8");
        CHECK(big && big8 && nofuse, "cannot create the tile-kernel backends");
        if (!test_case_failed) tc_case(big, 1, 300, 512, 40);  /* q = 4 sub-pieces folded in the warp */
        if (!test_case_failed) tc_case(big, 1, 24, 1024, 30);  /* q = 8; out < 64 */
        if (!test_case_failed) tc_case(big, 1, 100, 96, 25);   /* q = 1, 3 chunks */
        if (!test_case_failed) tc_gated_case(big, nofuse, 150, 512, 40, 0);
        if (!test_case_failed) tc_gated_case(big, nofuse, 37, 96, 30, 1);
        if (!test_case_failed) tc_fp8_case(big8, tc, 83, 160, 33);
        /* the 128 x 128 tile (RD_CUDA_TC_TILE=128: 16 warps, one staged piece each per operand) */
        setenv("RD_CUDA_TC_TILE", "128", 1);
        rd_backend *b128 = dev_with("RD_CUDA_GEMM", "tc", "RD_CUDA_TC_BIG_ROWS", "24");
        unsetenv("RD_CUDA_TC_TILE");
        CHECK(b128 != NULL, "cannot create the 128-tile backend");
        if (!test_case_failed) tc_case(b128, 1, 300, 512, 40);  /* 3 column tiles, the last partial */
        if (!test_case_failed) tc_case(b128, 1, 100, 96, 130);  /* 2 row tiles; q = 1 */
        if (!test_case_failed) tc_gated_case(b128, nofuse, 150, 512, 40, 0);
        if (b128) rd_backend_destroy(b128);
        /* The tile kernel's cp.async stages (RD_CUDA_TC_PIPE, 4 by default as above; the emulator lands a copy
           only at its wait and poisons the stage until then): each depth, and the register-staged kernel (0),
           the same bits as the other kernel, on both tiles; 3 chunks under 6 stages; hi only (one piece). */
        setenv("RD_CUDA_FP8", "tc", 1);
        rd_backend *nf8 = dev_with("RD_CUDA_GEMM", "tc", "RD_CUDA_FUSE", "0");
        unsetenv("RD_CUDA_FP8");
        CHECK(nf8 != NULL, "cannot create the unfused FP8 tc backend: %s", rd_errmsg());
        static const char *pipes[] = {"0", "2", "3", "6"};
        for (size_t i = 0; i < sizeof pipes / sizeof pipes[0] && !test_case_failed; i++) {
            setenv("RD_CUDA_TC_PIPE", pipes[i], 1);
            rd_backend *bp = dev_with("RD_CUDA_GEMM", "tc", "RD_CUDA_TC_BIG_ROWS", "24");
            setenv("RD_CUDA_ACT", "bf16", 1);
            rd_backend *bp1 = dev_with("RD_CUDA_GEMM", "tc", "RD_CUDA_TC_BIG_ROWS", "24");
            unsetenv("RD_CUDA_ACT");
            setenv("RD_CUDA_TC_TILE", "128", 1);
            rd_backend *bp128 = dev_with("RD_CUDA_GEMM", "tc", "RD_CUDA_TC_BIG_ROWS", "24");
            unsetenv("RD_CUDA_TC_TILE");
            setenv("RD_CUDA_FP8", "tc", 1);
            rd_backend *bp8 = dev_with("RD_CUDA_GEMM", "tc", "RD_CUDA_TC_BIG_ROWS", "24");
            unsetenv("RD_CUDA_FP8");
            unsetenv("RD_CUDA_TC_PIPE");
            CHECK(bp && bp128 && bp1 && bp8, "cannot create the RD_CUDA_TC_PIPE=%s backends: %s", pipes[i],
                  rd_errmsg());
            printf("# RD_CUDA_TC_PIPE=%s\n", pipes[i]);
            if (!test_case_failed) tc_case(bp, 1, 300, 512, 40);
            if (!test_case_failed) tc_case(bp, 1, 100, 96, 25);
            if (!test_case_failed) tc_gated_case(bp, nofuse, 150, 512, 40, 0);
            if (!test_case_failed) tc_gated_case(bp, nofuse, 37, 96, 30, 1);
            if (!test_case_failed) tc_case(bp128, 1, 100, 96, 130);
            if (!test_case_failed) tc_case(bp1, 0, 300, 512, 40);
            /* FP8 weights (RD_CUDA_FP8=tc): codes and words of 4 chunks' scale bytes staged, decoded as the
               other kernel decodes them: the bits of bf16 weights of the same values, and of the unfused op */
            if (!test_case_failed) tc_fp8_case(bp8, tc, 83, 512, 40);
            tc_wfmt = 1;
            if (!test_case_failed) tc_gated_case(bp8, nf8, 150, 512, 40, 0);
            tc_wfmt = 0;
            rd_backend *all[4] = {bp, bp128, bp1, bp8};
            for (int j = 0; j < 4; j++)
                if (all[j])
                    rd_backend_destroy(all[j]);
        }
        if (nf8) rd_backend_destroy(nf8);
        if (big) rd_backend_destroy(big);
        if (big8) rd_backend_destroy(big8);
        if (nofuse) rd_backend_destroy(nofuse);
    }
done:
    if (tc) rd_backend_destroy(tc);
    if (tcb) rd_backend_destroy(tcb);
    if (tc8) rd_backend_destroy(tc8);
}

static void lm_head_case(rd_backend *be, int32_t out, int32_t in, int32_t M, double tol);

/* RD_CUDA_TC_WG=1, 2, 4, auto: the tile kernel on Hopper's warpgroup MMA (cuda_gemm_tc_wg.cu; here from 24 rows on),
 * its register-staged form (RD_CUDA_TC_PIPE=0; test_gemm_tc_wgp the pipelined one). Each row the bits of the split-K
 * kernel serving it alone (tc_case), of the register-staged tile kernel (an unaligned x, which the wgmma kernel
 * leaves to it), of the unfused gated op, and FP8 weights those of bf16 weights of the same values: the plan's
 * sub-pieces and k order, whichever MMA. On the emulator the operations run at their wait and read B from shared
 * memory then, so a stage overwritten before its MMA finished shows; A's registers written before it abort. */
static void test_gemm_tc_wg(void)
{
    setenv("RD_CUDA_TC_PIPE", "0", 1);
    setenv("RD_CUDA_TC_WG", "1", 1);
    rd_backend *wg = dev_with("RD_CUDA_GEMM", "tc", "RD_CUDA_TC_BIG_ROWS", "24");
    setenv("RD_CUDA_ACT", "bf16", 1);
    rd_backend *wg1 = dev_with("RD_CUDA_GEMM", "tc", "RD_CUDA_TC_BIG_ROWS", "24");
    unsetenv("RD_CUDA_ACT");
    setenv("RD_CUDA_FP8", "tc", 1);
    rd_backend *wg8 = dev_with("RD_CUDA_GEMM", "tc", "RD_CUDA_TC_BIG_ROWS", "24");
    unsetenv("RD_CUDA_TC_WG");
    rd_backend *nf8 = dev_with("RD_CUDA_GEMM", "tc", "RD_CUDA_FUSE", "0");
    unsetenv("RD_CUDA_FP8");
    rd_backend *tc = dev_with("RD_CUDA_GEMM", "tc", NULL, NULL), *nofuse = dev_with("RD_CUDA_GEMM", "tc", "RD_CUDA_FUSE", "0");
    CHECK(wg && wg1 && wg8 && nf8 && tc && nofuse, "cannot create the wgmma backends: %s", rd_errmsg());
    const uint64_t w0 = on_emulator() ? cuemu_wgmma_count() : 0, c0 = on_emulator() ? cuemu_cp_async_count() : 0;
    if (!test_case_failed) tc_case(wg, 1, 300, 512, 40);   /* 5 weight tiles, the last partial; q = 4 */
    if (!test_case_failed) tc_case(wg, 1, 100, 96, 130);   /* 3 batch tiles, the last partial; q = 1 */
    if (!test_case_failed) tc_case(wg, 1, 24, 1024, 30);   /* q = 8; out < 64 */
    if (!test_case_failed) tc_case(wg1, 0, 300, 512, 40);  /* hi only (RD_CUDA_ACT=bf16) */
    if (!test_case_failed) tc_gated_case(wg, nofuse, 150, 512, 40, 0);
    if (!test_case_failed) tc_gated_case(wg, nofuse, 37, 96, 70, 1);    /* GeGLU; F % 32 != 0 */
    if (!test_case_failed) tc_fp8_case(wg8, tc, 83, 512, 40);
    tc_wfmt = 1;
    if (!test_case_failed) tc_gated_case(wg8, nf8, 150, 512, 40, 0);
    tc_wfmt = 0;
    /* the LM head's three exact pieces of x (130 rows: the tile kernel's), every row the row alone's bits */
    if (!test_case_failed) lm_head_case(wg, 100, 512, 130, on_emulator() ? 1e-6 : 3e-5);
    CHECK(test_case_failed || !on_emulator() || cuemu_wgmma_count() > w0, "RD_CUDA_TC_WG=1: no wgmma operation ran");
    CHECK(test_case_failed || !on_emulator() || cuemu_cp_async_count() == c0,
          "RD_CUDA_TC_PIPE=0: a cp.async copy, so not the register-staged form");
    /* 2 and 4 warpgroups a CTA (128 and 256 weight rows on one staged B): the same bits; 4 leaves the pieces'
       writing to its first two warpgroups */
    /* auto (cuplan_wg_groups): here 1 warpgroup for 300 x 512 at 40 rows, 4 for 1024 x 64 at 24 rows */
    static const char *groups[] = {"2", "4", "auto"};
    for (size_t i = 0; i < 3 && !test_case_failed; i++) {
        setenv("RD_CUDA_TC_WG", groups[i], 1);
        rd_backend *wgn = dev_with("RD_CUDA_GEMM", "tc", "RD_CUDA_TC_BIG_ROWS", "24");
        unsetenv("RD_CUDA_TC_WG");
        CHECK(wgn != NULL, "cannot create the RD_CUDA_TC_WG=%s backend: %s", groups[i], rd_errmsg());
        printf("# RD_CUDA_TC_WG=%s\n", groups[i]);
        if (!test_case_failed) tc_case(wgn, 1, 300, 512, 40);  /* 3 (2 groups) or 2 (4) weight tiles, the last partial */
        if (i == 2) { /* auto: the kernel per call */
            if (!test_case_failed) tc_case(wgn, 1, 1024, 64, 24);
        } else {
            if (!test_case_failed) tc_case(wgn, 1, 100, 96, 130);
            if (!test_case_failed) tc_gated_case(wgn, nofuse, 150, 512, 40, 0);
            if (!test_case_failed) tc_gated_case(wgn, nofuse, 37, 96, 70, 1);
        }
        if (wgn) rd_backend_destroy(wgn);
    }
    unsetenv("RD_CUDA_TC_PIPE");
    rd_backend *all[6] = {wg, wg1, wg8, nf8, tc, nofuse};
    for (int i = 0; i < 6; i++)
        if (all[i])
            rd_backend_destroy(all[i]);
}

/* RD_CUDA_TC_ORDER=weight: the tile kernels' grid with weight tiles fastest (the order before session 39; every
 * other case runs the default, batch tiles fastest): each tile kernel the same bits in both orders (and the first the
 * split-K kernel's rows alone), on a grid of 5 weight tiles x 3 batch tiles (64 tiles; 3 x 2 with the 128 tile). */
static void test_gemm_tc_order(void)
{
    static const char *forms[][4] = {
        {"RD_CUDA_TC_PIPE", "4", NULL, NULL},             {"RD_CUDA_TC_PIPE", "0", NULL, NULL},
        {"RD_CUDA_TC_TILE", "128", NULL, NULL},           {"RD_CUDA_FP8", "w8a8", NULL, NULL},
        {"RD_CUDA_TC_WG", "1", "RD_CUDA_TC_PIPE", "0"},  {"RD_CUDA_TC_WG", "1", NULL, NULL},
        {"RD_CUDA_TC_WG", "4", NULL, NULL}};
    for (size_t i = 0; i < sizeof forms / sizeof forms[0] && !test_case_failed; i++) {
        rd_backend *b[2];
        for (int o = 0; o < 2; o++) {
            setenv(forms[i][0], forms[i][1], 1);
            if (forms[i][2])
                setenv(forms[i][2], forms[i][3], 1);
            if (o)
                setenv("RD_CUDA_TC_ORDER", "weight", 1);
            b[o] = dev_with("RD_CUDA_GEMM", "tc", "RD_CUDA_TC_BIG_ROWS", "24");
            unsetenv("RD_CUDA_TC_ORDER");
            unsetenv(forms[i][0]);
            if (forms[i][2])
                unsetenv(forms[i][2]);
        }
        CHECK(b[0] && b[1], "cannot create the %s=%s backends: %s", forms[i][0], forms[i][1], rd_errmsg());
        if (forms[i][2])
            printf("# %s=%s %s=%s: RD_CUDA_TC_ORDER=weight against batch\n", forms[i][0], forms[i][1], forms[i][2],
                   forms[i][3]);
        else
            printf("# %s=%s: RD_CUDA_TC_ORDER=weight against batch\n", forms[i][0], forms[i][1]);
        const int w8a8 = !strcmp(forms[i][0], "RD_CUDA_FP8");
        tc_wfmt = w8a8;
        if (!test_case_failed) tc_pair_case(b[1], b[0], 300, 512, 130);
        tc_wfmt = 0;
        if (!test_case_failed && i == 0) tc_case(b[1], 1, 300, 512, 130);
        for (int o = 0; o < 2; o++)
            if (b[o])
                rd_backend_destroy(b[o]);
    }
}

/* The wgmma tile kernel's pipelined form (cuda_gemm_tc_wgp.cu; RD_CUDA_TC_WG with RD_CUDA_TC_PIPE 2, 3, 4 (the
 * default) or 6: each thread's operands copied with cp.async that many chunks less one ahead, the MMA waited for
 * one chunk later): test_gemm_tc_wg's bits, where the plan's sub-pieces have an even count of chunks (q = 4 and
 * 8 here; 96 inputs, q = 1 and 3 chunks, stay on the register-staged form, checked there). */
static void test_gemm_tc_wgp(void)
{
    rd_backend *tc = dev_with("RD_CUDA_GEMM", "tc", NULL, NULL), *nofuse = dev_with("RD_CUDA_GEMM", "tc", "RD_CUDA_FUSE", "0");
    setenv("RD_CUDA_FP8", "tc", 1);
    rd_backend *nf8 = dev_with("RD_CUDA_GEMM", "tc", "RD_CUDA_FUSE", "0");
    unsetenv("RD_CUDA_FP8");
    CHECK(tc && nofuse && nf8, "cannot create the reference backends: %s", rd_errmsg());
    static const char *pipes[] = {NULL, "2", "3", "6"};
    for (size_t i = 0; i < 4 && !test_case_failed; i++) {
        setenv("RD_CUDA_TC_WG", "1", 1);
        if (pipes[i])
            setenv("RD_CUDA_TC_PIPE", pipes[i], 1);
        rd_backend *wp = dev_with("RD_CUDA_GEMM", "tc", "RD_CUDA_TC_BIG_ROWS", "24");
        setenv("RD_CUDA_ACT", "bf16", 1);
        rd_backend *wp1 = dev_with("RD_CUDA_GEMM", "tc", "RD_CUDA_TC_BIG_ROWS", "24");
        unsetenv("RD_CUDA_ACT");
        setenv("RD_CUDA_FP8", "tc", 1);
        rd_backend *wp8 = dev_with("RD_CUDA_GEMM", "tc", "RD_CUDA_TC_BIG_ROWS", "24");
        unsetenv("RD_CUDA_FP8");
        unsetenv("RD_CUDA_TC_PIPE");
        unsetenv("RD_CUDA_TC_WG");
        CHECK(wp && wp1 && wp8, "cannot create the RD_CUDA_TC_PIPE=%s wgmma backends: %s", pipes[i] ? pipes[i] : "4",
              rd_errmsg());
        printf("# RD_CUDA_TC_WG=1 RD_CUDA_TC_PIPE=%s\n", pipes[i] ? pipes[i] : "4 (the default)");
        const uint64_t cp = on_emulator() ? cuemu_cp_async_count() : 0;
        if (!test_case_failed) tc_case(wp, 1, 300, 512, 40);
        if (!test_case_failed) tc_case(wp, 1, 24, 1024, 30);
        if (!test_case_failed) tc_case(wp1, 0, 300, 512, 40);
        if (!test_case_failed) tc_gated_case(wp, nofuse, 150, 512, 40, 0);
        if (!test_case_failed) tc_fp8_case(wp8, tc, 83, 512, 40);
        tc_wfmt = 1;
        if (!test_case_failed) tc_gated_case(wp8, nf8, 150, 512, 40, 0);
        tc_wfmt = 0;
        if (!test_case_failed) lm_head_case(wp, 100, 512, 130, on_emulator() ? 1e-6 : 3e-5);
        CHECK(test_case_failed || !on_emulator() || cuemu_cp_async_count() > cp,
              "RD_CUDA_TC_PIPE=%s: no cp.async copy: the pipelined form never ran", pipes[i] ? pipes[i] : "4");
        rd_backend *b[3] = {wp, wp1, wp8};
        for (int j = 0; j < 3; j++)
            if (b[j])
                rd_backend_destroy(b[j]);
    }
    /* 2 and 4 warpgroups a CTA (4: x units with the first two only), auto; GeGLU */
    static const char *groups[] = {"2", "4", "auto"};
    for (size_t i = 0; i < 3 && !test_case_failed; i++) {
        setenv("RD_CUDA_TC_WG", groups[i], 1);
        rd_backend *wgn = dev_with("RD_CUDA_GEMM", "tc", "RD_CUDA_TC_BIG_ROWS", "24");
        unsetenv("RD_CUDA_TC_WG");
        CHECK(wgn != NULL, "cannot create the RD_CUDA_TC_WG=%s backend: %s", groups[i], rd_errmsg());
        printf("# RD_CUDA_TC_WG=%s RD_CUDA_TC_PIPE=4\n", groups[i]);
        const uint64_t cp = on_emulator() ? cuemu_cp_async_count() : 0;
        if (!test_case_failed) tc_case(wgn, 1, 300, 512, 40);
        if (!test_case_failed) tc_gated_case(wgn, nofuse, 150, 512, 40, 0);
        if (!test_case_failed) tc_gated_case(wgn, nofuse, 75, 512, 40, 1);
        CHECK(test_case_failed || !on_emulator() || cuemu_cp_async_count() > cp,
              "RD_CUDA_TC_WG=%s: no cp.async copy: the pipelined form never ran", groups[i]);
        if (wgn) rd_backend_destroy(wgn);
    }
    rd_backend *all[3] = {tc, nofuse, nf8};
    for (int i = 0; i < 3; i++)
        if (all[i])
            rd_backend_destroy(all[i]);
}

/* RD_CUDA_FP8=w8a8: FP8 weights times E4M3-quantized activations on the FP8
 * tensor cores, on the plan's three reductions and the tile kernel; its
 * fusions (gated epilogue, RMSNorm prologue, bias + RoPE + KV write) bit for
 * bit those of the unfused ops in the same mode. */
static void test_gemm_tc_q8(void)
{
    rd_backend *q8 = dev_with("RD_CUDA_GEMM", "tc", "RD_CUDA_FP8", "w8a8");
    setenv("RD_CUDA_FP8", "w8a8", 1);
    rd_backend *nofuse = dev_with("RD_CUDA_GEMM", "tc", "RD_CUDA_FUSE", "0");
    rd_backend *big = dev_with("RD_CUDA_GEMM", "tc", "RD_CUDA_TC_BIG_ROWS", "24");
    unsetenv("RD_CUDA_FP8");
    CHECK(q8 && nofuse && big, "cannot create the w8a8 backends: %s", rd_errmsg());
    if (!test_case_failed) tc_q8_exact_case(q8);
    if (!test_case_failed) tc_q8_case(q8, 24, 1024, 5);    /* p = 2 */
    if (!test_case_failed) tc_q8_case(q8, 300, 512, 40);   /* p = 1, 4 m16 tiles per warp */
    if (!test_case_failed) tc_q8_case(q8, 100, 96, 3);     /* q = 1 */
    if (!test_case_failed) tc_q8_case(big, 300, 512, 40);  /* the tile kernel */
    tc_wfmt = 1;
    if (!test_case_failed) tc_pair_case(q8, big, 83, 160, 33);
    tc_wfmt = 0;
    {
        setenv("RD_CUDA_FP8", "w8a8", 1);
        setenv("RD_CUDA_TC_TILE", "128", 1);
        rd_backend *b128 = dev_with("RD_CUDA_GEMM", "tc", "RD_CUDA_TC_BIG_ROWS", "24");
        unsetenv("RD_CUDA_TC_TILE");
        unsetenv("RD_CUDA_FP8");
        CHECK(b128 != NULL, "cannot create the w8a8 128-tile backend");
        if (!test_case_failed) tc_q8_case(b128, 300, 512, 40);
        tc_wfmt = 1;
        if (!test_case_failed) tc_pair_case(q8, b128, 150, 256, 140);
        tc_wfmt = 0;
        if (b128) rd_backend_destroy(b128);
    }
    /* The tile kernels' forms (RD_CUDA_TC_PIPE: cp.async stages, x quantized by each warp from the staged floats;
       0: register-staged, x quantized once as it is stored; 4, the default, above): the split-K kernel's bits on
       both tiles, with the gated epilogue too. 512 inputs: 16 chunks in words of 4 scale bytes. */
    static const char *pipes[] = {"0", "2", "3", "6"};
    tc_wfmt = 1;
    for (size_t i = 0; i < sizeof pipes / sizeof pipes[0] && !test_case_failed; i++) {
        setenv("RD_CUDA_FP8", "w8a8", 1);
        setenv("RD_CUDA_TC_PIPE", pipes[i], 1);
        rd_backend *bp = dev_with("RD_CUDA_GEMM", "tc", "RD_CUDA_TC_BIG_ROWS", "24");
        setenv("RD_CUDA_TC_TILE", "128", 1);
        rd_backend *bp128 = dev_with("RD_CUDA_GEMM", "tc", "RD_CUDA_TC_BIG_ROWS", "24");
        unsetenv("RD_CUDA_TC_TILE");
        unsetenv("RD_CUDA_TC_PIPE");
        unsetenv("RD_CUDA_FP8");
        CHECK(bp && bp128, "cannot create the w8a8 RD_CUDA_TC_PIPE=%s backends: %s", pipes[i], rd_errmsg());
        printf("# w8a8, RD_CUDA_TC_PIPE=%s\n", pipes[i]);
        if (!test_case_failed) tc_pair_case(q8, bp, 83, 512, 40);
        if (!test_case_failed) tc_pair_case(q8, bp128, 150, 256, 140);
        if (!test_case_failed) tc_gated_case(bp, nofuse, 150, 512, 40, 0);
        if (bp) rd_backend_destroy(bp);
        if (bp128) rd_backend_destroy(bp128);
    }
    if (!test_case_failed) tc_gated_case(q8, nofuse, 12, 1024, 5, 0);
    if (!test_case_failed) tc_gated_case(big, nofuse, 150, 512, 40, 1);
    if (!test_case_failed) tc_norm_case(q8, nofuse, 24, 1024, 3, 0.0f, 0);
    if (!test_case_failed) tc_norm_case(q8, nofuse, 300, 512, 5, 0.0f, 1);
    if (!test_case_failed) tc_rope_case(q8, nofuse, 4, 2, 16, 512, 20, 1);
    if (!test_case_failed) tc_rope_case(q8, nofuse, 5, 1, 64, 96, 7, 0);
    tc_wfmt = 0;
    if (q8) rd_backend_destroy(q8);
    if (nofuse) rd_backend_destroy(nofuse);
    if (big) rd_backend_destroy(big);
}

/* RD_CUDA_Q8=tc: a Q8_0 layer linear kept as codes and fp16 scales on the
 * device. On the emulator every output is the reference's bits: per chunk,
 * from zero, the mma steps of the bf16 path (k-step s takes k 8t + 4s ..
 * + 3 of each lane quarter t; hi then lo, each step's 16 exact products
 * summed and rounded once), then acc + s x d, chunk order within each of the
 * plan's sub-pieces (4 SMs), the sub-pieces left to right; on a GPU within
 * 3e-5 of the terms' magnitudes. Against the CPU's Q8_0 GEMM (fp32 fmaf of x
 * and code x d): within the split's 4e-5, and closer than a bf16 copy of the
 * same weights on the tensor-core GEMM (RD_CUDA_GEMM=tc), which rounds each
 * code x d to 8 bits. Each row alone and after 7 others bit for bit; the
 * read-back is the dequantized weight and the rows' bytes the file's. */
static void tc_q80_case(rd_backend *be, rd_backend *tc, rd_backend *cpu, int32_t out, int32_t in, int32_t m)
{
    const size_t n = (size_t)out * in, nb = n / 32, rb = ggml_row_bytes(GGML_Q8_0, (uint64_t)in);
    float *w = malloc(sizeof(float) * n), *wd = malloc(sizeof(float) * n), *back = malloc(sizeof(float) * n);
    float *x = malloc(sizeof(float) * (size_t)(m + 7) * in), *y = malloc(sizeof(float) * (size_t)(m + 7) * out);
    float *yc = malloc(sizeof(float) * (size_t)m * out), *yb = malloc(sizeof(float) * (size_t)m * out);
    float *y1 = malloc(sizeof(float) * out), *y2 = malloc(sizeof(float) * (size_t)(m + 7) * out);
    float *dsc = malloc(sizeof(float) * nb);
    uint8_t *blk = malloc((size_t)out * rb), *rows = malloc(5 * rb);
    for (size_t b = 0; b < nb; b++) {
        const float sc = (float)pow(10.0, -3.0 + 3.0 * (double)(rnd() >> 11) * 0x1.0p-53);
        for (int j = 0; j < 32; j++)
            w[b * 32 + j] = b == 2 ? 0.0f : frand() * sc;
    }
    for (size_t i = 0; i < (size_t)(m + 7) * in; i++)
        x[i] = frand() * 2.0f;
    CHECK_OK(ggml_quant_q8_0(w, n, blk));
    CHECK_OK(ggml_dequant_row(GGML_Q8_0, blk, wd, n));
    for (size_t b = 0; b < nb; b++) { /* d = the block's value of code 1 (ggml's f16 d, widened) */
        uint8_t one[34];
        float v[32];
        memcpy(one, blk + b * 34, 2);
        memset(one + 2, 1, 32);
        CHECK_OK(ggml_dequant_row(GGML_Q8_0, one, v, 32));
        dsc[b] = v[0];
    }
    rd_wpart part = {.type = GGML_Q8_0, .rows = out, .data = blk};
    void *W = NULL, *Wc = NULL, *Wb = NULL;
    CHECK_OK(be->ops->linear_load_q(be, &part, 1, in, &W));
    CHECK_OK(cpu->ops->linear_load_q(cpu, &part, 1, in, &Wc));
    CHECK_OK(tc->ops->linear_load(tc, wd, out, in, &Wb));
    if (test_case_failed)
        goto done;
    /* held as Q8_0: its bytes, its values, its rows */
    CHECK(be->ops->linear_bytes(be, W) == (int64_t)(n + nb * 2), "q8_0: %lld bytes held, expected %zu",
          (long long)be->ops->linear_bytes(be, W), n + nb * 2);
    int64_t by[RD_WEIGHT_TYPES] = {0};
    be->ops->linear_bytes_by_type(be, W, by);
    CHECK(by[GGML_Q8_0] == (int64_t)(n + nb * 2) && by[GGML_BF16] == 0, "q8_0: bytes by type");
    CHECK_OK(be->ops->linear_read(be, W, back));
    CHECK(!memcmp(back, wd, sizeof(float) * n), "q8_0: linear_read is not the dequantized weight");
    const int32_t r0 = out > 8 ? 3 : 0, nr = out > 8 ? 5 : 1;
    CHECK_OK(be->ops->linear_read_native(be, W, GGML_Q8_0, r0, nr, rows));
    CHECK(!memcmp(rows, blk + (size_t)r0 * rb, (size_t)nr * rb), "q8_0: rows [%d, %d) are not the file's bytes", r0,
          r0 + nr);
    CHECK(be->ops->linear_read_native(be, W, GGML_BF16, 0, 1, back) == RD_ENOTSUP, "q8_0: bf16 rows on the device");

    run_linear(be, W, x, m, in, out, 0, NULL, y, 0);
    run_linear(cpu, Wc, x, m, in, out, 0, NULL, yc, 0);
    run_linear(tc, Wb, x, m, in, out, 0, NULL, yb, 0);
    cuplan_tc pl;
    CHECK_OK(cuplan_gemm_tc(out, in, 4, &pl));
    double worst = 0, worst_c = 0, worst_b = 0;
    size_t differ = 0;
    for (int32_t r = 0; r < m; r++)
        for (int32_t o = 0; o < out; o++) {
            float tot = 0.0f;
            double mag = 0;
            for (int32_t i = 0; i < pl.q; i++) {
                float acc = 0.0f;
                for (int32_t c = i * pl.kp; c < (i + 1) * pl.kp; c += 32) {
                    float d = 0.0f;
                    for (int st = 0; st < 2; st++)
                        for (int p = 0; p < 2; p++) {
                            double sum = d;
                            for (int t = 0; t < 4; t++)
                                for (int e = 0; e < 4; e++) {
                                    const int32_t k = c + 8 * t + 4 * st + e;
                                    const float xv = x[(size_t)r * in + k], hi = bf(xv);
                                    const double code = (double)wd[(size_t)o * in + k] / dsc[((size_t)o * in + k) / 32];
                                    sum += (double)(p ? bf(xv - hi) : hi) * (dsc[((size_t)o * in + k) / 32] ? code : 0);
                                }
                            d = (float)sum;
                        }
                    const float t2 = d * dsc[((size_t)o * in + c) / 32];
                    acc = acc + t2;
                }
                tot = i == 0 ? acc : tot + acc;
            }
            for (int32_t k = 0; k < in; k++)
                mag += fabs((double)x[(size_t)r * in + k] * wd[(size_t)o * in + k]);
            const size_t at = (size_t)r * out + o;
            differ += fbits(y[at]) != fbits(tot);
            worst = worse(worst, fabs(y[at] - (double)tot) / (mag + 1e-30));
            worst_c = worse(worst_c, fabs(y[at] - (double)yc[at]) / (mag + 1e-30));
            worst_b = worse(worst_b, fabs(yb[at] - (double)yc[at]) / (mag + 1e-30));
        }
    printf("# q8_0 [%d x %d] x %d rows (on 4 SMs: q %d, %d warps x %d CTAs): %zu outputs differ from the reference's "
           "bits, worst %.3g; vs the CPU's Q8_0 GEMM %.3g (a bf16 copy of the weights: %.3g), relative to the terms' "
           "magnitudes\n", out, in, m, pl.q, pl.wk, pl.p, differ, worst, worst_c, worst_b);
    if (on_emulator())
        CHECK(differ == 0, "q8_0: %zu outputs are not the reference's bits (worst %.3g)", differ, worst);
    else
        CHECK(worst <= 3e-5, "q8_0: %.3g from the reference", worst);
    CHECK(worst_c <= (on_emulator() ? 4e-5 : 8e-5), "q8_0: %.3g from the CPU's Q8_0 GEMM", worst_c);
    CHECK(worst_b > 4 * worst_c, "q8_0: no closer to the CPU (%.3g) than a bf16 copy (%.3g)", worst_c, worst_b);
    for (int32_t r = 0; r < m && !test_case_failed; r++) {
        run_linear(be, W, x + (size_t)r * in, 1, in, out, 0, NULL, y1, 0);
        CHECK(!memcmp(y1, y + (size_t)r * out, sizeof(float) * out), "q8_0: row %d alone differs from it in %d rows",
              r, m);
    }
    {
        float *xsh = malloc(sizeof(float) * (size_t)(m + 7) * in);
        memcpy(xsh, x + (size_t)m * in, sizeof(float) * 7 * in);
        memcpy(xsh + (size_t)7 * in, x, sizeof(float) * (size_t)m * in);
        run_linear(be, W, xsh, m + 7, in, out, 0, NULL, y2, 0);
        CHECK(!memcmp(y2 + (size_t)7 * out, y, sizeof(float) * (size_t)m * out), "q8_0: rows differ after 7 others");
        free(xsh);
    }
done:
    if (W) be->ops->linear_free(be, W);
    if (Wc) cpu->ops->linear_free(cpu, Wc);
    if (Wb) tc->ops->linear_free(tc, Wb);
    free(w), free(wd), free(back), free(x), free(y), free(yc), free(yb), free(y1), free(y2), free(dsc), free(blk);
    free(rows);
}

/* A Q8_0 table (RD_CUDA_Q8=tc, the embedding and the tied LM head) [V][D]:
 * embed gives ggml_dequant_row's floats (the CPU's rows), bit for bit, and
 * zeros for an id out of range; lm_head, with x as three exact bf16 pieces
 * per chunk and the chunk's sum times d, is within 2e-6 (a GPU: 3e-5) of the terms'
 * magnitudes of the CPU's head over the same Q8_0 table (fp32 products of
 * the file's values), on the split-K kernel and, from 24 rows, the tile
 * kernel; its rows alone equal them in a batch. */
static void q80_table_case(rd_backend *be, rd_backend *cpu, int32_t V, int32_t D, int32_t m)
{
    const size_t n = (size_t)V * D;
    float *w = malloc(sizeof(float) * n), *wd = malloc(sizeof(float) * n), *x = malloc(sizeof(float) * m * D);
    float *e = malloc(sizeof(float) * 4 * D), *y = malloc(sizeof(float) * m * V), *yc = malloc(sizeof(float) * m * V);
    float *y1 = malloc(sizeof(float) * V);
    uint8_t *blk = malloc((size_t)V * ggml_row_bytes(GGML_Q8_0, (uint64_t)D));
    for (size_t i = 0; i < n; i++)
        w[i] = frand() * 0.05f * (1 + (int)(i / 32 % 7));
    for (int32_t i = 0; i < m * D; i++)
        x[i] = frand() * 3.0f;
    CHECK_OK(ggml_quant_q8_0(w, n, blk));
    CHECK_OK(ggml_dequant_row(GGML_Q8_0, blk, wd, n));
    rd_wpart part = {.type = GGML_Q8_0, .rows = V, .data = blk};
    void *W = NULL, *Wc = NULL;
    CHECK_OK(be->ops->linear_load_q(be, &part, 1, D, &W));
    CHECK_OK(cpu->ops->linear_load_q(cpu, &part, 1, D, &Wc));
    int64_t by[RD_WEIGHT_TYPES] = {0};
    if (W)
        be->ops->linear_bytes_by_type(be, W, by);
    CHECK(by[GGML_Q8_0] == (int64_t)(n / 32 * 34), "q8_0 table: not held as Q8_0");
    if (test_case_failed)
        goto done;
    {
        const int32_t ids[4] = {0, V - 1, 3, V}; /* the last out of range: zeros */
        int32_t *dids = up(be, ids, sizeof ids);
        float *de = up(be, NULL, sizeof(float) * 4 * D);
        be->ops->embed(be, W, dids, 4, 1.0f, de);
        CHECK_OK(down(be, e, de, sizeof(float) * 4 * D));
        for (int i = 0; i < 3; i++)
            CHECK(!memcmp(e + (size_t)i * D, wd + (size_t)ids[i] * D, sizeof(float) * D),
                  "q8_0 embed: row %d is not the dequantized row", ids[i]);
        for (int32_t j = 0; j < D; j++)
            CHECK(e[3 * D + j] == 0.0f, "q8_0 embed: an id out of range gave %g", e[3 * D + j]);
        /* scaled: the CPU's embed with the same scale, bit for bit */
        float *ec = malloc(sizeof(float) * 4 * D);
        be->ops->embed(be, W, dids, 4, 45.25f, de);
        CHECK_OK(down(be, e, de, sizeof(float) * 4 * D));
        cpu->ops->embed(cpu, Wc, ids, 3, 45.25f, ec);
        CHECK(!memcmp(e, ec, sizeof(float) * 3 * D), "q8_0 embed x 45.25: not the CPU's rows");
        for (int32_t j = 0; j < D && !test_case_failed; j++)
            CHECK(fbits(e[j]) == fbits(wd[j] * 45.25f), "q8_0 embed x 45.25: column %d", j);
        free(ec);
        be->ops->free(be, dids), be->ops->free(be, de);
    }
    {
        float *dx = up(be, x, sizeof(float) * m * D), *dy = up(be, NULL, sizeof(float) * m * V);
        be->ops->lm_head(be, W, dx, m, dy);
        CHECK_OK(down(be, y, dy, sizeof(float) * m * V));
        be->ops->lm_head(be, W, dx + (size_t)(m - 1) * D, 1, dy);
        CHECK_OK(down(be, y1, dy, sizeof(float) * V));
        CHECK(!memcmp(y1, y + (size_t)(m - 1) * V, sizeof(float) * V), "q8_0 head: the last row alone differs");
        be->ops->free(be, dx), be->ops->free(be, dy);
        float *cx = up(cpu, x, sizeof(float) * m * D), *cy = up(cpu, NULL, sizeof(float) * m * V);
        cpu->ops->linear(cpu, Wc, cx, m, cy, 0); /* the CPU has no lm_head op: its head is the linear */
        CHECK_OK(down(cpu, yc, cy, sizeof(float) * m * V));
        cpu->ops->free(cpu, cx), cpu->ops->free(cpu, cy);
        double worst = 0;
        for (int32_t r = 0; r < m; r++)
            for (int32_t v = 0; v < V; v++) {
                double mag = 0;
                for (int32_t k = 0; k < D; k++)
                    mag += fabs((double)x[(size_t)r * D + k] * wd[(size_t)v * D + k]);
                worst = worse(worst, fabs(y[(size_t)r * V + v] - (double)yc[(size_t)r * V + v]) / (mag + 1e-30));
            }
        printf("# q8_0 table [%d x %d], %d rows: the head vs the CPU's over the same table %.3g of the terms' "
               "magnitudes\n", V, D, m, worst);
        CHECK(worst <= (on_emulator() ? 2e-6 : 3e-5), "q8_0 head: %.3g from the CPU's", worst);
    }
done:
    if (W) be->ops->linear_free(be, W);
    if (Wc) cpu->ops->linear_free(cpu, Wc);
    free(w), free(wd), free(x), free(e), free(y), free(yc), free(y1), free(blk);
}

/* The device's SM count as the backend describes itself ("..., N SMs, ..."): the tensor-core GEMM's plans
 * depend on it. */
static int32_t dev_sms(rd_backend *be)
{
    char buf[4096] = "";
    int32_t n = 0;
    if (be->ops->describe && be->ops->describe(be, buf, sizeof buf) >= 0)
        for (const char *p = strstr(buf, " SMs"); p && p > buf; p--)
            if (p[-1] == ' ') {
                n = atoi(p);
                break;
            }
    return n > 0 ? n : 1;
}

/* A Q8_0 block's codes and scale (ggml's f16 d, widened), as quant.c wrote them. */
static void q80_unpack(const uint8_t *blk, int32_t *codes, float *d)
{
    uint8_t one[34];
    float v[32];
    memcpy(one, blk, 2);
    memset(one + 2, 1, 32);
    ggml_dequant_row(GGML_Q8_0, one, v, 32);
    *d = v[0];
    for (int j = 0; j < 32; j++)
        codes[j] = (int8_t)blk[2 + j];
}

/* RD_CUDA_Q8=w8a8: Q8_0 weights times x quantized to Q8_0 in the kernel, on
 * int8 tensor cores. The reference quantizes x itself with quant.c's
 * ggml_quant_q8_0 (per row and 32-value block): per chunk the exact integer
 * sum s of code products, acc + s x (dx x dw) in chunk order per sub-piece of
 * the plan (4 SMs), the sub-pieces left to right. Integer sums leave the
 * hardware nothing to round, so the device must give these bits too (its own
 * plan: on a GPU the case recomputes with the device's SM count), ties of
 * the rounding included. Within x's Q8_0 rounding bound (about d / 2 a
 * value) of fp32 x; rows alone and after 7 others bit for bit. */
static void tc_i8_case(rd_backend *be, int32_t out, int32_t in, int32_t m, int32_t n_sm)
{
    const size_t n = (size_t)out * in, nb = (size_t)in / 32, rb = ggml_row_bytes(GGML_Q8_0, (uint64_t)in);
    float *w = malloc(sizeof(float) * n), *wd = malloc(sizeof(float) * n);
    float *x = malloc(sizeof(float) * (size_t)(m + 7) * in), *y = malloc(sizeof(float) * (size_t)(m + 7) * out);
    float *y1 = malloc(sizeof(float) * out), *y2 = malloc(sizeof(float) * (size_t)(m + 7) * out);
    uint8_t *wb = malloc((size_t)out * rb), *xb = malloc((size_t)m * rb);
    int32_t *wc = malloc(sizeof(int32_t) * n), *xc = malloc(sizeof(int32_t) * (size_t)m * in);
    float *wdd = malloc(sizeof(float) * n / 32), *xd = malloc(sizeof(float) * (size_t)m * nb);
    for (size_t b = 0; b < n / 32; b++) {
        const float sc = (float)pow(10.0, -3.0 + 3.0 * (double)(rnd() >> 11) * 0x1.0p-53);
        for (int j = 0; j < 32; j++)
            w[b * 32 + j] = frand() * sc;
    }
    for (size_t b = 0; b < (size_t)(m + 7) * nb; b++) {
        const float sc = b == 1 ? 0.0f : (float)pow(10.0, -3.0 + 5.0 * (double)(rnd() >> 11) * 0x1.0p-53);
        for (int j = 0; j < 32; j++)
            x[b * 32 + j] = frand() * sc;
    }
    /* row 0's first block: d = 1 exactly and codes at ties (+-0.5, +-1.5, ...: roundf goes away from zero) */
    x[0] = 127.0f;
    for (int j = 1; j < 32; j++)
        x[j] = (j % 2 ? 1.0f : -1.0f) * ((float)(j / 2) + 0.5f);
    CHECK_OK(ggml_quant_q8_0(w, n, wb));
    CHECK_OK(ggml_dequant_row(GGML_Q8_0, wb, wd, n));
    CHECK_OK(ggml_quant_q8_0(x, (uint64_t)m * in, xb));
    for (size_t b = 0; b < n / 32; b++)
        q80_unpack(wb + b * 34, wc + b * 32, &wdd[b]);
    for (size_t b = 0; b < (size_t)m * nb; b++)
        q80_unpack(xb + b * 34, xc + b * 32, &xd[b]);
    rd_wpart part = {.type = GGML_Q8_0, .rows = out, .data = wb};
    void *W = NULL;
    CHECK_OK(be->ops->linear_load_q(be, &part, 1, in, &W));
    if (test_case_failed)
        goto done;
    run_linear(be, W, x, m, in, out, 0, NULL, y, 0);
    cuplan_tc pl;
    CHECK_OK(cuplan_gemm_tc(out, in, n_sm, &pl));
    size_t differ = 0, beyond = 0;
    double worst_x = 0;
    for (int32_t r = 0; r < m; r++)
        for (int32_t o = 0; o < out; o++) {
            float tot = 0.0f;
            for (int32_t i = 0; i < pl.q; i++) {
                float acc = 0.0f;
                for (int32_t c = i * pl.kp; c < (i + 1) * pl.kp; c += 32) {
                    int32_t sum = 0;
                    for (int k = c; k < c + 32; k++)
                        sum += xc[(size_t)r * in + k] * wc[(size_t)o * in + k];
                    const float sc = xd[(size_t)r * nb + c / 32] * wdd[((size_t)o * in + c) / 32];
                    const float t = (float)sum * sc;
                    acc = acc + t;
                }
                tot = i == 0 ? acc : tot + acc;
            }
            /* qerr: the codes round x / d32 to within 1/2, and d16 (fp16) is within 2^-11 of d32, so
               |x - code d16| <= d (1/2 + 127 x 2^-11) */
            double sx = 0, mag = 0, qerr = 0;
            for (int32_t k = 0; k < in; k++) {
                sx += (double)x[(size_t)r * in + k] * wd[(size_t)o * in + k];
                mag += fabs((double)x[(size_t)r * in + k] * wd[(size_t)o * in + k]);
                qerr += xd[(size_t)r * nb + k / 32] * 0.5625 * fabs((double)wd[(size_t)o * in + k]);
            }
            const float got = y[(size_t)r * out + o];
            differ += fbits(got) != fbits(tot);
            beyond += fabs(got - sx) > qerr + 1e-5 * mag;
            worst_x = worse(worst_x, fabs(got - sx) / (mag + 1e-30));
        }
    printf("# q8_0 w8a8 [%d x %d] x %d rows (plan on %d SMs: q %d, %d warps x %d CTAs): %zu outputs differ from the "
           "reference's bits; vs fp32 x %.3g (relative to the terms' magnitudes)\n", out, in, m, n_sm, pl.q, pl.wk,
           pl.p, differ, worst_x);
    CHECK(differ == 0, "q8_0 w8a8: %zu outputs are not the reference's bits", differ);
    /* against fp32 x: within the sum of x's rounding bounds times |w|, plus fp32 sums; row 0's tie block
       (values 0.5 to 15.5 at d = 1) errs by 6% of itself */
    CHECK(beyond == 0 && worst_x > 0, "q8_0 w8a8: %zu outputs past x's Q8_0 rounding bound from fp32 x (worst %.3g "
          "of the terms)", beyond, worst_x);
    for (int32_t r = 0; r < m && !test_case_failed; r++) {
        run_linear(be, W, x + (size_t)r * in, 1, in, out, 0, NULL, y1, 0);
        CHECK(!memcmp(y1, y + (size_t)r * out, sizeof(float) * out), "q8_0 w8a8: row %d alone differs", r);
    }
    {
        float *xsh = malloc(sizeof(float) * (size_t)(m + 7) * in);
        memcpy(xsh, x + (size_t)m * in, sizeof(float) * 7 * in);
        memcpy(xsh + (size_t)7 * in, x, sizeof(float) * (size_t)m * in);
        run_linear(be, W, xsh, m + 7, in, out, 0, NULL, y2, 0);
        CHECK(!memcmp(y2 + (size_t)7 * out, y, sizeof(float) * (size_t)m * out), "q8_0 w8a8: rows differ after 7 others");
        free(xsh);
    }
done:
    if (W) be->ops->linear_free(be, W);
    free(w), free(wd), free(x), free(y), free(y1), free(y2), free(wb), free(xb), free(wc), free(xc), free(wdd), free(xd);
}

/* RD_CUDA_Q8=tc: the plan's three reductions, both activation modes, the
 * tile kernel on both tiles, the fusions (gated epilogue, RMSNorm prologue,
 * bias + RoPE + KV write) bit for bit those of the unfused ops, and the
 * tables (embedding, LM head). */
static void test_gemm_tc_q80(void)
{
    setenv("RD_CUDA_Q8", "tc", 1);
    rd_backend *q8 = dev_with("RD_CUDA_GEMM", "tc", NULL, NULL), *q8b = dev_with("RD_CUDA_ACT", "bf16", NULL, NULL);
    rd_backend *nofuse = dev_with("RD_CUDA_GEMM", "tc", "RD_CUDA_FUSE", "0");
    rd_backend *big = dev_with("RD_CUDA_GEMM", "tc", "RD_CUDA_TC_BIG_ROWS", "24");
    setenv("RD_CUDA_TC_TILE", "128", 1);
    rd_backend *b128 = dev_with("RD_CUDA_GEMM", "tc", "RD_CUDA_TC_BIG_ROWS", "24");
    unsetenv("RD_CUDA_TC_TILE");
    unsetenv("RD_CUDA_Q8");
    rd_backend *tc = dev_with("RD_CUDA_GEMM", "tc", NULL, NULL), *cpu = NULL;
    CHECK_OK(rd_backend_create("cpu", 1, &cpu));
    CHECK(q8 && q8b && nofuse && big && b128 && tc && cpu, "cannot create the q8_0 backends: %s", rd_errmsg());
    if (!test_case_failed) tc_q80_case(q8, tc, cpu, 24, 1024, 5);    /* p = 2 */
    if (!test_case_failed) tc_q80_case(q8, tc, cpu, 300, 512, 40);   /* p = 1, 4 m16 tiles per warp */
    if (!test_case_failed) tc_q80_case(q8, tc, cpu, 100, 96, 3);     /* q = 1 */
    if (!test_case_failed) tc_q80_case(big, tc, cpu, 300, 512, 40);  /* the 64 tile */
    if (!test_case_failed) tc_q80_case(b128, tc, cpu, 150, 256, 140); /* the 128 tile, 2 row tiles */
    if (!test_case_failed) q80_table_case(q8, cpu, 300, 256, 5);
    if (!test_case_failed) q80_table_case(big, cpu, 200, 512, 30);       /* the head on the 64 tile */
    if (!test_case_failed) {
        /* RD_CUDA_ACT=bf16 (hi only), without RD_CUDA_GEMM=tc: Q8_0 still takes the tensor-core GEMM */
        float *w = malloc(sizeof(float) * 64 * 256), *x = malloc(sizeof(float) * 3 * 256);
        float *y = malloc(sizeof(float) * 3 * 64), *y1 = malloc(sizeof(float) * 64);
        for (int i = 0; i < 64 * 256; i++)
            w[i] = frand() * 0.1f;
        for (int i = 0; i < 3 * 256; i++)
            x[i] = frand();
        void *W = load_q80(q8b, w, 64, 256);
        CHECK(W != NULL, "q8_0 with RD_CUDA_ACT=bf16: %s", rd_errmsg());
        if (W) {
            int64_t by[RD_WEIGHT_TYPES] = {0};
            q8b->ops->linear_bytes_by_type(q8b, W, by);
            CHECK(by[GGML_Q8_0] > 0, "q8_0 with RD_CUDA_ACT=bf16: not held as Q8_0");
            run_linear(q8b, W, x, 3, 256, 64, 0, NULL, y, 0);
            run_linear(q8b, W, x + 2 * 256, 1, 256, 64, 0, NULL, y1, 0);
            CHECK(!memcmp(y1, y + 2 * 64, sizeof(float) * 64), "q8_0 bf16 activations: row 2 alone differs");
            q8b->ops->linear_free(q8b, W);
        }
        /* without RD_CUDA_Q8=tc the device widens Q8_0 to bf16, as before */
        uint8_t *blk = malloc(64 * ggml_row_bytes(GGML_Q8_0, 256));
        CHECK_OK(ggml_quant_q8_0(w, 64 * 256, blk));
        rd_wpart part = {.type = GGML_Q8_0, .rows = 64, .data = blk};
        int64_t by[RD_WEIGHT_TYPES] = {0};
        CHECK_OK(tc->ops->linear_load_q(tc, &part, 1, 256, &W));
        tc->ops->linear_bytes_by_type(tc, W, by);
        CHECK(by[GGML_BF16] == 64 * 256 * 2 && by[GGML_Q8_0] == 0, "q8_0 without RD_CUDA_Q8: not held as bf16");
        tc->ops->linear_free(tc, W);
        free(blk), free(w), free(x), free(y), free(y1);
    }
    tc_wfmt = 2;
    if (!test_case_failed) tc_gated_case(q8, nofuse, 12, 1024, 5, 0);
    if (!test_case_failed) tc_gated_case(big, nofuse, 150, 512, 40, 1);
    if (!test_case_failed) tc_norm_case(q8, nofuse, 24, 1024, 3, 0.0f, 0);
    if (!test_case_failed) tc_norm_case(q8, nofuse, 300, 512, 5, 0.0f, 1);
    if (!test_case_failed) tc_rope_case(q8, nofuse, 4, 2, 16, 512, 20, 1);
    if (!test_case_failed) tc_rope_case(q8, nofuse, 5, 1, 64, 96, 7, 0);
    tc_wfmt = 0;
    rd_backend *all[5] = {q8b, big, b128, tc};
    for (int i = 0; i < 5; i++)
        if (all[i])
            rd_backend_destroy(all[i]);
    if (test_case_failed)
        goto done;
    /* RD_CUDA_Q8=w8a8: x quantized to Q8_0 too, int8 tensor cores */
    setenv("RD_CUDA_Q8", "w8a8", 1);
    rd_backend *i8 = dev_with("RD_CUDA_GEMM", "tc", NULL, NULL), *i8nf = dev_with("RD_CUDA_GEMM", "tc", "RD_CUDA_FUSE", "0");
    rd_backend *i8big = dev_with("RD_CUDA_GEMM", "tc", "RD_CUDA_TC_BIG_ROWS", "24");
    setenv("RD_CUDA_TC_TILE", "128", 1);
    rd_backend *i8b128 = dev_with("RD_CUDA_GEMM", "tc", "RD_CUDA_TC_BIG_ROWS", "24");
    unsetenv("RD_CUDA_TC_TILE");
    unsetenv("RD_CUDA_Q8");
    CHECK(i8 && i8nf && i8big && i8b128, "cannot create the q8_0 w8a8 backends: %s", rd_errmsg());
    const int32_t sms = on_emulator() ? 4 : dev_sms(i8);
    if (!test_case_failed) tc_i8_case(i8, 24, 1024, 5, sms);     /* p = 2 on 4 SMs */
    if (!test_case_failed) tc_i8_case(i8, 300, 512, 40, sms);    /* p = 1, 4 m16 tiles per warp */
    if (!test_case_failed) tc_i8_case(i8, 100, 96, 3, sms);      /* q = 1 */
    if (!test_case_failed) tc_i8_case(i8big, 300, 512, 40, sms); /* the 64 tile */
    if (!test_case_failed) tc_i8_case(i8b128, 150, 256, 140, sms); /* the 128 tile */
    tc_wfmt = 2;
    /* The tile kernels' forms (RD_CUDA_TC_PIPE; 4, the default, above): codes and 8 bytes of 4 chunks' fp16
       scales staged by cp.async, or register-staged (0). Weight-only Q8_0 (its LM head's three pieces too, on 0)
       and W8A8: the split-K kernel's bits on both tiles and with the gated epilogue. */
    static const char *pipes[] = {"0", "2", "3", "6"};
    for (size_t i = 0; i < sizeof pipes / sizeof pipes[0] && !test_case_failed; i++) {
        rd_backend *bp[4] = {NULL, NULL, NULL, NULL}; /* Q8_0 64 tile, 128 tile; W8A8 64 tile, 128 tile */
        setenv("RD_CUDA_TC_PIPE", pipes[i], 1);
        for (int f = 0; f < 2; f++) {
            setenv("RD_CUDA_Q8", f ? "w8a8" : "tc", 1);
            bp[2 * f] = dev_with("RD_CUDA_GEMM", "tc", "RD_CUDA_TC_BIG_ROWS", "24");
            bp[2 * f + 1] = dev_with("RD_CUDA_GEMM", "tc", "RD_CUDA_TC_TILE", "128");
        }
        unsetenv("RD_CUDA_Q8");
        unsetenv("RD_CUDA_TC_PIPE");
        CHECK(bp[0] && bp[1] && bp[2] && bp[3], "cannot create the q8_0 RD_CUDA_TC_PIPE=%s backends: %s", pipes[i],
              rd_errmsg());
        printf("# q8_0, RD_CUDA_TC_PIPE=%s\n", pipes[i]);
        if (!test_case_failed) tc_pair_case(q8, bp[0], 83, 512, 40);
        if (!test_case_failed) tc_pair_case(q8, bp[1], 150, 256, 140);
        if (!test_case_failed) tc_gated_case(bp[0], nofuse, 150, 512, 40, 1);
        if (!test_case_failed && !strcmp(pipes[i], "0")) q80_table_case(bp[0], cpu, 200, 512, 30);
        if (!test_case_failed) tc_pair_case(i8, bp[2], 83, 512, 40);
        if (!test_case_failed) tc_pair_case(i8, bp[3], 150, 256, 140);
        if (!test_case_failed) tc_gated_case(bp[2], i8nf, 150, 512, 40, 0);
        for (int j = 0; j < 4; j++)
            if (bp[j])
                rd_backend_destroy(bp[j]);
    }
    if (!test_case_failed) tc_gated_case(i8, i8nf, 12, 1024, 5, 0);
    if (!test_case_failed) tc_gated_case(i8big, i8nf, 150, 512, 40, 1);
    if (!test_case_failed) tc_norm_case(i8, i8nf, 300, 512, 5, 0.0f, 1);
    if (!test_case_failed) tc_rope_case(i8, i8nf, 4, 2, 16, 512, 20, 1);
    tc_wfmt = 0;
    rd_backend *all8[4] = {i8, i8nf, i8big, i8b128};
    for (int i = 0; i < 4; i++)
        if (all8[i])
            rd_backend_destroy(all8[i]);
done:;
    rd_backend *rest[3] = {q8, nofuse, cpu};
    for (int i = 0; i < 3; i++)
        if (rest[i])
            rd_backend_destroy(rest[i]);
}

/* y[m][out] from a fresh linear layer of weights w on backend be. */
static void linear_bits(rd_backend *be, const float *w, int32_t out, int32_t in, const float *x, int32_t m, float *y)
{
    void *W;
    CHECK_OK(be->ops->linear_load(be, w, out, in, &W));
    float *dx = up(be, x, sizeof(float) * m * in), *dy = up(be, NULL, sizeof(float) * m * out);
    be->ops->linear(be, W, dx, m, dy, 0);
    CHECK_OK(down(be, y, dy, sizeof(float) * m * out));
    be->ops->free(be, dx);
    be->ops->free(be, dy);
    be->ops->linear_free(be, W);
}

/* RD_CUDA_ACT=mixed: a contracting GEMM (in > out) gets the split's bits, any
 * other the plain bf16 GEMM's. */
static void test_mixed_activations(void)
{
    rd_backend *mixed;
    setenv("RD_CUDA_ACT", "mixed", 1);
    int rc = rd_backend_create(dev_name(), 1, &mixed);
    unsetenv("RD_CUDA_ACT");
    CHECK_OK(rc);
    const int32_t a = 24, b = 72, M = 5;
    float *w = malloc(sizeof(float) * a * b), *x = malloc(sizeof(float) * M * b);
    float *y_mixed = malloc(sizeof(float) * M * b), *y_ref = malloc(sizeof(float) * M * b);
    for (int64_t i = 0; i < (int64_t)a * b; i++)
        w[i] = frand() * 0.5f;
    for (int64_t i = 0; i < (int64_t)M * b; i++)
        x[i] = frand() * 2.0f;
    /* [a][b], in = b > out = a: contracting */
    linear_bits(mixed, w, a, b, x, M, y_mixed);
    linear_bits(emu, w, a, b, x, M, y_ref);
    CHECK(!memcmp(y_mixed, y_ref, sizeof(float) * M * a), "mixed: a contracting GEMM differs from the split one");
    linear_bits(emu_bf16, w, a, b, x, M, y_ref);
    CHECK(memcmp(y_mixed, y_ref, sizeof(float) * M * a) != 0, "mixed: the split made no difference (test too weak)");
    /* [b][a], in = a < out = b: plain bf16 */
    linear_bits(mixed, w, b, a, x, M, y_mixed);
    linear_bits(emu_bf16, w, b, a, x, M, y_ref);
    CHECK(!memcmp(y_mixed, y_ref, sizeof(float) * M * b), "mixed: an expanding GEMM differs from the bf16 one");
    free(w), free(x), free(y_mixed), free(y_ref);
    rd_backend_destroy(mixed);
}

/* The step's end in tc mode: the final RMSNorm (up to RD_CUDA_NORM_ROWS rows)
 * as the LM head's prologue, one kernel; the logits and the norm's output
 * bit for bit those of the norm run first (RD_CUDA_FUSE=0), bf16 or Q8_0
 * (tc_wfmt) tables; more rows than that, the norm on its own. */
static void tc_head_norm_case(rd_backend *tc, rd_backend *nofuse, int32_t V, int32_t dim, int32_t M, float w_off)
{
    float *w = malloc(sizeof(float) * V * dim), *x = malloc(sizeof(float) * M * dim), *nw = malloc(sizeof(float) * dim);
    float *ys[2] = {malloc(sizeof(float) * M * V), malloc(sizeof(float) * M * V)};
    float *xns[2] = {malloc(sizeof(float) * M * dim), malloc(sizeof(float) * M * dim)};
    for (int64_t i = 0; i < (int64_t)V * dim; i++)
        w[i] = frand() * 0.5f;
    for (int64_t i = 0; i < (int64_t)M * dim; i++)
        x[i] = frand() * 3.0f;
    fill_norm_weights(nw, dim);
    rd_backend *bes[2] = {tc, nofuse};
    uint64_t launches[2];
    for (int k = 0; k < 2; k++) {
        rd_backend *be = bes[k];
        void *W;
        CHECK_OK(load_w(be, w, V, dim, &W));
        float *dx = up(be, x, sizeof(float) * M * dim), *dn = up(be, nw, sizeof(float) * dim);
        float *dxn = up(be, NULL, sizeof(float) * M * dim), *dy = up(be, NULL, sizeof(float) * M * V);
        CHECK_OK(be->ops->sync(be));
        const uint64_t k0 = cuemu_launch_count();
        be->ops->rmsnorm(be, dx, dn, M, dim, 1e-6f, w_off, dxn);
        be->ops->lm_head(be, W, dxn, M, dy);
        CHECK_OK(be->ops->sync(be));
        launches[k] = cuemu_launch_count() - k0;
        CHECK_OK(down(be, ys[k], dy, sizeof(float) * M * V));
        CHECK_OK(down(be, xns[k], dxn, sizeof(float) * M * dim));
        be->ops->free(be, dx), be->ops->free(be, dn), be->ops->free(be, dxn), be->ops->free(be, dy);
        be->ops->linear_free(be, W);
    }
    CHECK(!memcmp(ys[0], ys[1], sizeof(float) * M * V) && !memcmp(xns[0], xns[1], sizeof(float) * M * dim),
          "tc head [%d x %d], %d rows: the norm as its prologue differs from the norm first", V, dim, M);
    const uint64_t want = M <= 8 ? 1 : 2;
    CHECK(!on_emulator() || (launches[0] == want && launches[1] == 2),
          "tc head [%d x %d], %d rows: %llu kernels (want %llu), %llu unfused", V, dim, M,
          (unsigned long long)launches[0], (unsigned long long)want, (unsigned long long)launches[1]);
    free(w), free(x), free(nw), free(ys[0]), free(ys[1]), free(xns[0]), free(xns[1]);
}

/* The LM head over more rows than one chunk (128): every row equals the row
 * alone, and all are within fp32 rounding of the exact sum. */
static void lm_head_case(rd_backend *be, int32_t out, int32_t in, int32_t M, double tol)
{
    float *w = malloc(sizeof(float) * out * in), *x = malloc(sizeof(float) * M * in);
    float *y = malloc(sizeof(float) * M * out), *ys = malloc(sizeof(float) * out);
    for (int64_t i = 0; i < (int64_t)out * in; i++)
        w[i] = frand() * 0.5f;
    for (int64_t i = 0; i < (int64_t)M * in; i++)
        x[i] = frand() * 3.0f;
    void *W;
    CHECK_OK(be->ops->linear_load(be, w, out, in, &W));
    float *dx = up(be, x, sizeof(float) * M * in), *dy = up(be, NULL, sizeof(float) * M * out);
    be->ops->lm_head(be, W, dx, M, dy);
    CHECK_OK(down(be, y, dy, sizeof(float) * M * out));
    double worst = lm_head_error(w, x, y, out, in, M);
    CHECK(worst < tol, "lm_head [%d x %d] over %d rows: relative error %.3g", out, in, M, worst);
    const int32_t rows[] = {0, 127, 128, 255, 256, 299};
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        if (rows[i] >= M)
            continue;
        be->ops->lm_head(be, W, dx + (size_t)rows[i] * in, 1, dy);
        CHECK_OK(down(be, ys, dy, sizeof(float) * out));
        CHECK(!memcmp(ys, y + (size_t)rows[i] * out, sizeof(float) * out), "lm_head row %d alone differs", rows[i]);
    }
    be->ops->free(be, dx);
    be->ops->free(be, dy);
    be->ops->linear_free(be, W);
    free(w), free(x), free(y), free(ys);
}

/* The LM head over more rows than one chunk (128): every row equals the row
 * alone, and all are within fp32 rounding of the exact sum. With
 * RD_CUDA_GEMM=tc the head is the tensor-core GEMM with x in three exact
 * bf16 pieces: 300 rows go to its 64 x 64 tile kernel, a row alone to the
 * other, with the same bits. */
static void test_lm_head_chunks(void)
{
    lm_head_case(emu, 37, 40, 300, 1e-6);
    if (test_case_failed)
        return;
    rd_backend *tc = dev_with("RD_CUDA_GEMM", "tc", NULL, NULL);
    CHECK(tc != NULL, "cannot create the tc backend: %s", rd_errmsg());
    lm_head_case(tc, 37, 64, 300, on_emulator() ? 1e-6 : 3e-5);
    if (!test_case_failed)
        lm_head_case(tc, 300, 512, 20, on_emulator() ? 1e-6 : 3e-5);
    if (!test_case_failed) /* 16 chunks through the tile kernel's 4 cp.async stages */
        lm_head_case(tc, 100, 512, 130, on_emulator() ? 1e-6 : 3e-5);
    {
        rd_backend *regs = dev_with("RD_CUDA_GEMM", "tc", "RD_CUDA_TC_PIPE", "0");
        CHECK(regs != NULL, "cannot create the RD_CUDA_TC_PIPE=0 backend: %s", rd_errmsg());
        if (!test_case_failed) /* the register-staged tile kernel */
            lm_head_case(regs, 100, 512, 130, on_emulator() ? 1e-6 : 3e-5);
        if (regs)
            rd_backend_destroy(regs);
    }
    rd_backend *nofuse = dev_with("RD_CUDA_GEMM", "tc", "RD_CUDA_FUSE", "0");
    CHECK(nofuse != NULL, "cannot create the unfused tc backend: %s", rd_errmsg());
    if (!test_case_failed) tc_head_norm_case(tc, nofuse, 300, 512, 1, 0.0f);
    if (!test_case_failed) tc_head_norm_case(tc, nofuse, 300, 512, 8, 1.0f);  /* Gemma's 1 + w */
    if (!test_case_failed) tc_head_norm_case(tc, nofuse, 37, 64, 9, 0.0f);    /* past RD_CUDA_NORM_ROWS */
    setenv("RD_CUDA_Q8", "tc", 1);
    rd_backend *q8 = dev_with("RD_CUDA_GEMM", "tc", NULL, NULL), *q8nf = dev_with("RD_CUDA_GEMM", "tc", "RD_CUDA_FUSE", "0");
    unsetenv("RD_CUDA_Q8");
    CHECK(q8 && q8nf, "cannot create the Q8_0 tc backends: %s", rd_errmsg());
    tc_wfmt = 2;
    if (!test_case_failed) tc_head_norm_case(q8, q8nf, 300, 512, 3, 0.0f);
    tc_wfmt = 0;
    rd_backend *all[4] = {tc, nofuse, q8, q8nf};
    for (int i = 0; i < 4; i++)
        if (all[i])
            rd_backend_destroy(all[i]);
}

/* ------------------------------------------------------------------ row ops vs the CPU backend */

/* Largest distance in ulps between a[i] and b[i] (finite floats). */
static int64_t max_ulps(const float *a, const float *b, size_t n)
{
    int64_t worst = 0;
    for (size_t i = 0; i < n; i++) {
        int32_t ia, ib;
        memcpy(&ia, &a[i], 4);
        memcpy(&ib, &b[i], 4);
        /* sign-magnitude to a line ordered like the floats */
        int64_t la = ia < 0 ? (int64_t)INT32_MIN - ia : ia, lb = ib < 0 ? (int64_t)INT32_MIN - ib : ib;
        int64_t d = la > lb ? la - lb : lb - la;
        worst = d > worst ? d : worst;
    }
    return worst;
}

/* RMSNorm at the widths that pick each form of k_rmsnorm (registers up to
 * 2048 and 5120, the loop past that): alone, within 1 ulp of the CPU; and
 * completing a split GEMM's deferred sum with the residual add (the linear
 * accumulating into x, as the o and down projections do), x and the output
 * bit for bit those of the loop form (RD_CUDA_NORM_V0=1). */
static void test_rmsnorm_widths(void)
{
    rd_backend *v0 = dev_with("RD_CUDA_NORM_V0", "1", NULL, NULL);
    CHECK(v0 != NULL, "cannot create the RD_CUDA_NORM_V0 backend: %s", rd_errmsg());
    const int32_t widths[] = {96, 2048, 2049, 4096, 5120, 5121, 8192}, M = 3, IN = 32;
    for (size_t wi = 0; wi < sizeof widths / sizeof widths[0] && !test_case_failed; wi++) {
        const int32_t D = widths[wi];
        const size_t n = (size_t)M * D;
        float *x = malloc(sizeof(float) * n), *w = malloc(sizeof(float) * D), *lw = malloc(sizeof(float) * D * IN);
        float *xin = malloc(sizeof(float) * M * IN), *got[3], *xs[2];
        for (size_t i = 0; i < n; i++)
            x[i] = frand() * 3;
        for (int32_t i = 0; i < D; i++)
            w[i] = frand();
        for (int32_t i = 0; i < D * IN; i++)
            lw[i] = frand() * 0.25f;
        for (int32_t i = 0; i < M * IN; i++)
            xin[i] = frand();
        rd_backend *bes[3] = {cpu, emu, v0};
        for (int k = 0; k < 3; k++) {
            rd_backend *be = bes[k];
            got[k] = malloc(sizeof(float) * n * 2);
            float *dx = up(be, x, sizeof(float) * n), *dw = up(be, w, sizeof(float) * D), *dout = up(be, NULL, sizeof(float) * n);
            be->ops->rmsnorm(be, dx, dw, M, D, 1e-5f, 0.0f, dout);
            CHECK_OK(down(be, got[k], dout, sizeof(float) * n));
            if (k > 0) { /* x += linear(xin), its split sum completed by the norm */
                void *W;
                float *dxin = up(be, xin, sizeof(float) * M * IN);
                CHECK_OK(be->ops->linear_load(be, lw, D, IN, &W));
                be->ops->linear(be, W, dxin, M, dx, 1);
                be->ops->rmsnorm(be, dx, dw, M, D, 1e-5f, 1.0f, dout);
                CHECK_OK(down(be, got[k] + n, dout, sizeof(float) * n));
                xs[k - 1] = malloc(sizeof(float) * n);
                CHECK_OK(down(be, xs[k - 1], dx, sizeof(float) * n));
                be->ops->linear_free(be, W);
                be->ops->free(be, dxin);
            }
            be->ops->free(be, dx), be->ops->free(be, dw), be->ops->free(be, dout);
        }
        const int64_t ulps = max_ulps(got[0], got[1], n);
        CHECK(ulps <= 1, "rmsnorm, width %d: %lld ulps from the CPU (double sums, another order)", D, (long long)ulps);
        CHECK(!memcmp(got[1], got[2], sizeof(float) * n * 2) && !memcmp(xs[0], xs[1], sizeof(float) * n),
              "rmsnorm, width %d: the register form differs from the loop form (RD_CUDA_NORM_V0=1)", D);
        for (int k = 0; k < 3; k++)
            free(got[k]);
        free(xs[0]), free(xs[1]), free(x), free(w), free(lw), free(xin);
    }
    if (v0)
        rd_backend_destroy(v0);
}

static void test_row_ops(void)
{
    const int32_t M = 7, D = 96, F = 40, NH = 5, HD = 16, STRIDE = NH * HD + 8, MAXPOS = 50;
    float *x = malloc(sizeof(float) * M * D), *w = malloc(sizeof(float) * D);
    float *a = malloc(sizeof(float) * M * STRIDE * 2), *b = malloc(sizeof(float) * M * STRIDE * 2);
    float *cs = malloc(sizeof(float) * MAXPOS * HD);
    int32_t pos[7] = {0, 1, 49, 3, 17, 17, 2}, rows[5] = {6, 0, 3, 3, 1};
    for (int i = 0; i < M * D; i++)
        x[i] = frand() * 3;
    for (int i = 0; i < D; i++)
        w[i] = frand();
    for (int p = 0; p < MAXPOS; p++)
        for (int i = 0; i < HD / 2; i++) {
            double ang = p * pow(10000.0, -2.0 * i / HD);
            cs[(p * HD / 2 + i) * 2] = (float)cos(ang);
            cs[(p * HD / 2 + i) * 2 + 1] = (float)sin(ang);
        }
    rd_backend *bes[2] = {cpu, emu};
    float *res[2][4];
    for (int k = 0; k < 2; k++) {
        rd_backend *be = bes[k];
        float *dx = up(be, x, sizeof(float) * M * D), *dw = up(be, w, sizeof(float) * D);
        float *dout = up(be, NULL, sizeof(float) * M * STRIDE * 2);
        int32_t *dpos = up(be, pos, sizeof pos), *drows = up(be, rows, sizeof rows);
        float *dcs = up(be, cs, sizeof(float) * MAXPOS * HD);
        for (int j = 0; j < 4; j++)
            res[k][j] = malloc(sizeof(float) * M * STRIDE * 2);
        be->ops->rmsnorm(be, dx, dw, M, D, 1e-5f, 0.0f, dout);
        down(be, res[k][0], dout, sizeof(float) * M * D);
        be->ops->h2d(be, dout, x, sizeof(float) * M * D);
        be->ops->rope(be, dout, STRIDE, M, NH, HD, dpos, dcs);
        down(be, res[k][1], dout, sizeof(float) * M * D);
        be->ops->swiglu(be, dx, M, F, dout); /* gu = x as [M][2F] (2F <= D) */
        down(be, res[k][2], dout, sizeof(float) * M * F);
        be->ops->gather_rows(be, dx, drows, 5, D, dout);
        down(be, res[k][3], dout, sizeof(float) * 5 * D);
        be->ops->free(be, dx), be->ops->free(be, dw), be->ops->free(be, dout);
        be->ops->free(be, dpos), be->ops->free(be, drows), be->ops->free(be, dcs);
    }
    int ulps = 0;
    for (int i = 0; i < M * D; i++) {
        int64_t d = (int64_t)fbits(res[0][0][i]) - (int64_t)fbits(res[1][0][i]);
        ulps = llabs(d) > ulps ? (int)llabs(d) : ulps;
    }
    CHECK(ulps <= 1, "rmsnorm differs from the CPU by %d ulps (double sums, another order)", ulps);
    CHECK(!memcmp(res[0][1], res[1][1], sizeof(float) * M * D), "rope is not bit-identical to the CPU");
    /* SwiGLU calls expf: the emulator's is glibc's, as the CPU's (bit-identical);
     * CUDA's is within 2 ulps of the exact value, which moves silu(g) * u by a
     * few ulps */
    if (on_emulator())
        CHECK(!memcmp(res[0][2], res[1][2], sizeof(float) * M * F), "swiglu is not bit-identical to the CPU");
    else
        CHECK(max_ulps(res[0][2], res[1][2], (size_t)M * F) <= SWIGLU_DEVICE_ULPS,
              "swiglu differs from the CPU by %lld ulps", (long long)max_ulps(res[0][2], res[1][2], (size_t)M * F));
    CHECK(!memcmp(res[0][3], res[1][3], sizeof(float) * 5 * D), "gather_rows");
    for (int k = 0; k < 2; k++)
        for (int j = 0; j < 4; j++)
            free(res[k][j]);
    free(x), free(w), free(a), free(b), free(cs);
}

/* ------------------------------------------------------------------ Qwen's ops: q|k|v bias, per-head RMSNorm */


/* q|k|v rows as the runner lays them out: nh query heads, then nkv K heads
 * and nkv V heads of hd floats, then pad columns (0 in the runner; here also
 * > 0, so that a stride wider than the heads is covered). */
typedef struct {
    int32_t hd, nh, nkv, m, pad;
} qkv_shape;
static const qkv_shape qkv_shapes[] = {
    {64, 5, 1, 7, 0}, {128, 4, 2, 5, 8}, {256, 3, 1, 3, 0}, {128, 16, 8, 3, 0}, /* Qwen3-0.6B's heads */
    {32, 4, 2, 3, 0} /* the tiny models' head_dim */
};
#define N_QKV_SHAPES (sizeof qkv_shapes / sizeof qkv_shapes[0])
static int32_t qkv_stride(const qkv_shape *q) { return (q->nh + 2 * q->nkv) * q->hd + q->pad; }

/* The per-head norm weights of a Qwen3 checkpoint are near 1. */
static void fill_norm_weights(float *w, int32_t n)
{
    for (int32_t i = 0; i < n; i++)
        w[i] = 1.0f + 0.5f * frand();
}

/* On rows [m][S] of be: add_bias(nb columns) when nb > 0, then the norms on
 * the Q heads and the K heads when qn (Qwen2: bias only; Qwen3: norms only). */
static void qkv_ops(rd_backend *be, const qkv_shape *q, float *dx, int32_t nb, const float *db, const float *dqn,
                    const float *dkn, int k_first)
{
    const int32_t S = qkv_stride(q);
    if (nb > 0)
        be->ops->add_bias(be, dx, S, q->m, nb, db);
    if (!dqn)
        return;
    if (k_first) /* K first: while the split sum is deferred, x is not its destination */
        be->ops->head_rmsnorm(be, dx + q->nh * q->hd, S, q->m, q->nkv, q->hd, dkn, 1e-6f, 0.0f);
    be->ops->head_rmsnorm(be, dx, S, q->m, q->nh, q->hd, dqn, 1e-6f, 0.0f);
    if (!k_first)
        be->ops->head_rmsnorm(be, dx + q->nh * q->hd, S, q->m, q->nkv, q->hd, dkn, 1e-6f, 0.0f);
}

/* add_bias and head_rmsnorm on the emulated backend vs the CPU backend on the
 * same rows: the bias bit for bit (one fp32 add), the norms within 1 ulp
 * (double sums in another order; on these rows bit for bit too). Columns the
 * ops do not cover (V, padding, the bias's last 5) come back unchanged. */
static void test_qwen_ops(void)
{
    rd_backend *bes[2] = {cpu, emu};
    int64_t worst = 0;
    for (size_t si = 0; si < N_QKV_SHAPES; si++) {
        const qkv_shape *q = &qkv_shapes[si];
        const int32_t S = qkv_stride(q), nb = S - 5;
        const size_t n = (size_t)q->m * S;
        float *x = malloc(sizeof(float) * n), *bias = malloc(sizeof(float) * S);
        float *qn = malloc(sizeof(float) * q->hd), *kn = malloc(sizeof(float) * q->hd);
        for (size_t i = 0; i < n; i++)
            x[i] = frand() * 3;
        for (int32_t i = 0; i < S; i++)
            bias[i] = frand();
        fill_norm_weights(qn, q->hd);
        fill_norm_weights(kn, q->hd);
        float *res[2][2];
        for (int k = 0; k < 2; k++) {
            rd_backend *be = bes[k];
            float *dx = up(be, x, sizeof(float) * n), *db = up(be, bias, sizeof(float) * S);
            float *dqn = up(be, qn, sizeof(float) * q->hd), *dkn = up(be, kn, sizeof(float) * q->hd);
            res[k][0] = malloc(sizeof(float) * n);
            res[k][1] = malloc(sizeof(float) * n);
            qkv_ops(be, q, dx, nb, db, NULL, NULL, 0);
            CHECK_OK(down(be, res[k][0], dx, sizeof(float) * n));
            be->ops->h2d(be, dx, x, sizeof(float) * n);
            qkv_ops(be, q, dx, 0, NULL, dqn, dkn, 0);
            CHECK_OK(down(be, res[k][1], dx, sizeof(float) * n));
            be->ops->free(be, dx), be->ops->free(be, db), be->ops->free(be, dqn), be->ops->free(be, dkn);
        }
        CHECK(!memcmp(res[0][0], res[1][0], sizeof(float) * n), "hd %d: add_bias differs from the CPU", q->hd);
        int64_t ulps = max_ulps(res[0][1], res[1][1], n);
        CHECK(ulps <= 1, "hd %d, %d+%d heads, stride %d: head_rmsnorm differs from the CPU by %lld ulps", q->hd, q->nh,
              q->nkv, S, (long long)ulps);
        worst = ulps > worst ? ulps : worst;
        int changed = 0;
        for (size_t i = 0; i < n; i++)
            changed += res[1][1][i] != x[i];
        CHECK(changed > (int)(n / 2), "head_rmsnorm changed only %d of %zu values", changed, n);
        for (int k = 0; k < 2; k++)
            free(res[k][0]), free(res[k][1]);
        free(x), free(bias), free(qn), free(kn);
    }
    printf("# head_rmsnorm, emulated CUDA vs CPU: at most %lld ulps (hd 64, 128, 256)\n", (long long)worst);
}

/* An op that changes a buffer in place drops the bf16 copy an earlier op
 * (RMSNorm) left of it: a GEMM reading the buffer next sees the new values. */
static void test_qwen_ops_drop_shadows(void)
{
    const qkv_shape *q = &qkv_shapes[1];
    const int32_t S = qkv_stride(q), M = q->m, OUT = 24;
    const size_t n = (size_t)M * S;
    float *x = malloc(sizeof(float) * n), *nw = malloc(sizeof(float) * S), *bias = malloc(sizeof(float) * S);
    float *hw = malloc(sizeof(float) * q->hd), *w = malloc(sizeof(float) * OUT * S), *mid = malloc(sizeof(float) * n);
    float *got = malloc(sizeof(float) * M * OUT), *want = malloc(sizeof(float) * M * OUT);
    for (size_t i = 0; i < n; i++)
        x[i] = frand() * 3;
    for (int32_t i = 0; i < S; i++)
        nw[i] = 1.0f + 0.5f * frand(), bias[i] = frand();
    fill_norm_weights(hw, q->hd);
    for (int32_t i = 0; i < OUT * S; i++)
        w[i] = frand() * 0.5f;
    float *dx = up(emu, x, sizeof(float) * n), *dy = up(emu, NULL, sizeof(float) * n), *dm = up(emu, NULL, sizeof(float) * n);
    float *dnw = up(emu, nw, sizeof(float) * S), *db = up(emu, bias, sizeof(float) * S);
    float *dhw = up(emu, hw, sizeof(float) * q->hd), *dout = up(emu, NULL, sizeof(float) * M * OUT);
    void *W;
    CHECK_OK(emu->ops->linear_load(emu, w, OUT, S, &W));
    for (int op = 0; op < 2; op++) {
        emu->ops->rmsnorm(emu, dx, dnw, M, S, 1e-5f, 0.0f, dy); /* dy gets a bf16 copy */
        if (op == 0)
            emu->ops->add_bias(emu, dy, S, M, S, db);
        else
            emu->ops->head_rmsnorm(emu, dy + q->hd, S, M, 2, q->hd, dhw, 1e-6f, 0.0f);
        emu->ops->linear(emu, W, dy, M, dout, 0);
        CHECK_OK(down(emu, got, dout, sizeof(float) * M * OUT));
        CHECK_OK(down(emu, mid, dy, sizeof(float) * n));
        emu->ops->h2d(emu, dm, mid, sizeof(float) * n); /* the same values in a buffer with no copy */
        emu->ops->linear(emu, W, dm, M, dout, 0);
        CHECK_OK(down(emu, want, dout, sizeof(float) * M * OUT));
        CHECK(!memcmp(got, want, sizeof(float) * M * OUT), "a GEMM after %s read a stale bf16 copy of its input",
              op == 0 ? "add_bias" : "head_rmsnorm");
    }
    emu->ops->linear_free(emu, W);
    emu->ops->free(emu, dx), emu->ops->free(emu, dy), emu->ops->free(emu, dm), emu->ops->free(emu, dnw);
    emu->ops->free(emu, db), emu->ops->free(emu, dhw), emu->ops->free(emu, dout);
    free(x), free(nw), free(bias), free(hw), free(w), free(mid), free(got), free(want);
}

static double geglu_compare(const float *gu, int32_t m, int32_t f, const float *cpu_out, const float *dev_out,
                            double *worst_units, int *ok, char *why, size_t cap);

/* RoPE is deferred (to run with the KV write); an op that reads the rotated
 * rows next must still see them rotated: RMSNorm, SwiGLU, add_bias,
 * head_rmsnorm, GeGLU and rmsnorm_add (the rows as x) right after a RoPE on
 * their input give the CPU's result. */
static void test_rope_then_row_op(void)
{
    const int32_t M = 5, NH = 4, HD = 64, S = NH * HD, MAXPOS = 40, F = S / 2;
    const size_t n = (size_t)M * S;
    float *x = malloc(sizeof(float) * n), *w = malloc(sizeof(float) * S), *cs = malloc(sizeof(float) * MAXPOS * HD);
    int32_t pos[5] = {0, 3, 39, 17, 8};
    for (size_t i = 0; i < n; i++)
        x[i] = frand() * 3;
    for (int32_t i = 0; i < S; i++)
        w[i] = 1.0f + 0.5f * frand();
    for (int32_t p = 0; p < MAXPOS; p++)
        for (int32_t i = 0; i < HD / 2; i++) {
            double ang = p * pow(1e4, -2.0 * i / HD);
            cs[(p * HD / 2 + i) * 2] = (float)cos(ang);
            cs[(p * HD / 2 + i) * 2 + 1] = (float)sin(ang);
        }
    const char *what[6] = {"rmsnorm", "swiglu", "add_bias", "head_rmsnorm", "geglu", "rmsnorm_add"};
    float *res[2][6], *rot[2];
    rd_backend *bes[2] = {cpu, emu};
    for (int k = 0; k < 2; k++) {
        rd_backend *be = bes[k];
        float *dx = up(be, x, sizeof(float) * n), *dw = up(be, w, sizeof(float) * S), *dout = up(be, NULL, sizeof(float) * n);
        float *dcs = up(be, cs, sizeof(float) * MAXPOS * HD);
        int32_t *dpos = up(be, pos, sizeof pos);
        float *dz = up(be, x, sizeof(float) * n);
        for (int op = 0; op < 6; op++) {
            res[k][op] = malloc(sizeof(float) * n);
            be->ops->h2d(be, dx, x, sizeof(float) * n);
            be->ops->h2d(be, dout, x + 1, sizeof(float) * (n - 1));
            be->ops->rope(be, dx, S, M, NH, HD, dpos, dcs);
            float *from = dout;
            size_t nr = n;
            if (op == 0)
                be->ops->rmsnorm(be, dx, dw, M, S, 1e-5f, 0.0f, dout);
            else if (op == 1)
                be->ops->swiglu(be, dx, M, F, dout), nr = (size_t)M * F;
            else if (op == 2)
                be->ops->add_bias(be, dx, S, M, S, dw), from = dx;
            else if (op == 3)
                be->ops->head_rmsnorm(be, dx, S, M, NH, HD, dw, 1e-6f, 0.0f), from = dx;
            else if (op == 4) {
                be->ops->geglu(be, dx, M, F, dout), nr = (size_t)M * F;
                rot[k] = malloc(sizeof(float) * n);
                CHECK_OK(down(be, rot[k], dx, sizeof(float) * n));
            }
            else {
                be->ops->h2d(be, dz, x, sizeof(float) * n);
                be->ops->rmsnorm_add(be, dx, dw, M, S, 1e-5f, 0.0f, dout, dz), from = dz;
            }
            CHECK_OK(down(be, res[k][op], from, sizeof(float) * nr));
            if (nr < n)
                memset(res[k][op] + nr, 0, sizeof(float) * (n - nr));
        }
        be->ops->free(be, dx), be->ops->free(be, dw), be->ops->free(be, dout), be->ops->free(be, dcs);
        be->ops->free(be, dpos), be->ops->free(be, dz);
    }
    for (int op = 0; op < 6; op++) {
        if (op == 4) { /* geglu: the CPU's tanhf and the device's differ by up to 2 ulps */
            double worst = 0;
            int ok;
            char why[300];
            CHECK(!memcmp(rot[0], rot[1], sizeof(float) * n), "rope then geglu: the rotated rows differ");
            geglu_compare(rot[0], M, F, res[0][op], res[1][op], &worst, &ok, why, sizeof why);
            CHECK(ok, "rope then geglu: %s (did the op run before the RoPE?)", why);
            continue;
        }
        if (op == 5) { /* x + the norm: the norm's 1 ulp, in the sum's units where x cancels it */
            double worst = 0;
            for (size_t i = 0; i < n; i++)
                worst = worse(worst, fabs((double)res[0][op][i] - res[1][op][i]) / (fabs(res[0][op][i] - x[i]) + 1e-30));
            CHECK(worst <= 0x1.0p-22, "rope then rmsnorm_add differs from the CPU by %.3g of the norm (did the op run "
                  "before the RoPE?)", worst);
            continue;
        }
        int64_t ulps = max_ulps(res[0][op], res[1][op], n);
        const int64_t tol = op == 1 && !on_emulator() ? SWIGLU_DEVICE_ULPS : 1; /* swiglu: CUDA's expf */
        CHECK(ulps <= tol, "rope then %s differs from the CPU by %lld ulps (did the op run before the RoPE?)", what[op],
              (long long)ulps);
    }
    for (int k = 0; k < 2; k++) {
        free(rot[k]);
        for (int op = 0; op < 6; op++)
            free(res[k][op]);
    }
    free(x), free(w), free(cs);
}

/* The ops on a linear layer's output, as the runner calls them, in one
 * activation mode. With split activations the GEMM's sum is still deferred
 * when the op runs, and the op completes it; whatever the mode, the result is
 * the CPU ops' on the product this backend computes alone (downloaded first). */
static void qwen_chain_case(rd_backend *be, const char *mode, const qkv_shape *q, int32_t in)
{
    const int32_t S = qkv_stride(q), M = q->m;
    const size_t n = (size_t)M * S;
    float *w = malloc(sizeof(float) * S * in), *xin = malloc(sizeof(float) * M * in), *bias = malloc(sizeof(float) * S);
    float *qn = malloc(sizeof(float) * q->hd), *kn = malloc(sizeof(float) * q->hd);
    float *p = malloc(sizeof(float) * n), *want = malloc(sizeof(float) * n), *got = malloc(sizeof(float) * n);
    float *poison = malloc(sizeof(float) * n);
    for (size_t i = 0; i < n; i++)
        poison[i] = NAN;
    for (int64_t i = 0; i < (int64_t)S * in; i++)
        w[i] = frand() * 0.5f;
    for (int64_t i = 0; i < (int64_t)M * in; i++)
        xin[i] = frand() * 2.0f;
    for (int32_t i = 0; i < S; i++)
        bias[i] = frand();
    fill_norm_weights(qn, q->hd);
    fill_norm_weights(kn, q->hd);
    void *W;
    CHECK_OK(be->ops->linear_load(be, w, S, in, &W));
    float *dx = up(be, xin, sizeof(float) * M * in), *dy = up(be, NULL, sizeof(float) * n);
    float *db = up(be, bias, sizeof(float) * S), *dqn = up(be, qn, sizeof(float) * q->hd);
    float *dkn = up(be, kn, sizeof(float) * q->hd);
    be->ops->linear(be, W, dx, M, dy, 0);
    CHECK_OK(down(be, p, dy, sizeof(float) * n)); /* the product alone: d2h completes any deferred sum */
    float *cp = up(cpu, p, sizeof(float) * n), *cb = up(cpu, bias, sizeof(float) * S);
    float *cqn = up(cpu, qn, sizeof(float) * q->hd), *ckn = up(cpu, kn, sizeof(float) * q->hd);
    /* (nb, norms, K first): Qwen2 (bias over all columns), Qwen3 (norms), a
       bias over Q|K only then the norms, and the norms K first. */
    const struct {
        int32_t nb;
        int norms, k_first;
        const char *what;
    } chains[] = {{S, 0, 0, "bias"}, {0, 1, 0, "q/k norms"}, {(q->nh + q->nkv) * q->hd, 1, 0, "q|k bias, norms"},
                  {0, 1, 1, "norms, K first"}};
    for (size_t c = 0; c < sizeof chains / sizeof chains[0]; c++) {
        cpu->ops->h2d(cpu, cp, p, sizeof(float) * n);
        qkv_ops(cpu, q, cp, chains[c].nb, cb, chains[c].norms ? cqn : NULL, ckn, chains[c].k_first);
        CHECK_OK(down(cpu, want, cp, sizeof(float) * n));
        be->ops->h2d(be, dy, poison, sizeof(float) * n); /* a column the sum misses shows */
        be->ops->linear(be, W, dx, M, dy, 0);
        qkv_ops(be, q, dy, chains[c].nb, db, chains[c].norms ? dqn : NULL, dkn, chains[c].k_first);
        CHECK_OK(down(be, got, dy, sizeof(float) * n));
        int64_t ulps = max_ulps(want, got, n);
        CHECK(chains[c].norms ? ulps <= 1 : ulps == 0,
              "%s, hd %d, %d+%d heads, stride %d: linear then %s differs from the CPU ops on its product by %lld ulps",
              mode, q->hd, q->nh, q->nkv, S, chains[c].what, (long long)ulps);
    }
    cpu->ops->free(cpu, cp), cpu->ops->free(cpu, cb), cpu->ops->free(cpu, cqn), cpu->ops->free(cpu, ckn);
    be->ops->free(be, dx), be->ops->free(be, dy), be->ops->free(be, db), be->ops->free(be, dqn), be->ops->free(be, dkn);
    be->ops->linear_free(be, W);
    free(w), free(xin), free(bias), free(qn), free(kn), free(p), free(want), free(got), free(poison);
}

/* A layer's entry, Qwen2 (bias) or Qwen3 (q/k norms): linear(q|k|v), the
 * ops, RoPE over the Q and K heads, KV write. The result is the CPU ops' on
 * this backend's product (rows within 1 ulp, the cache the bf16 of the
 * CPU's); `kernels` is the number of launches the sequence must take (an
 * op that settled the deferred sum or RoPE instead of taking it adds one);
 * with graphs, a captured replay gives the eager bits. */
static void qwen_entry_case(rd_backend *be, const char *mode, const qkv_shape *q, int qwen3, int64_t kernels,
                            int graphs)
{
    const int32_t S = qkv_stride(q), M = q->m, IN = 48, BS = 16, MAXB = 4, MAXPOS = 64, half = q->hd / 2;
    const size_t n = (size_t)M * S, cache = (size_t)M * MAXB * q->nkv * BS * q->hd;
    float *w = malloc(sizeof(float) * S * IN), *xin = malloc(sizeof(float) * M * IN), *bias = malloc(sizeof(float) * S);
    float *qn = malloc(sizeof(float) * q->hd), *kn = malloc(sizeof(float) * q->hd);
    float *cs = malloc(sizeof(float) * MAXPOS * q->hd), *p = malloc(sizeof(float) * n);
    float *want = malloc(sizeof(float) * n), *got = malloc(sizeof(float) * n), *got2 = malloc(sizeof(float) * n);
    float *ckc = malloc(sizeof(float) * cache), *cvc = malloc(sizeof(float) * cache);
    uint16_t *kc = malloc(2 * cache), *vc = malloc(2 * cache), *kc2 = malloc(2 * cache), *vc2 = malloc(2 * cache);
    int32_t *tok = malloc(sizeof(int32_t) * M), *pos = malloc(sizeof(int32_t) * M), *slot = malloc(sizeof(int32_t) * M);
    int32_t *qs = malloc(sizeof(int32_t) * (M + 1)), *ctx = malloc(sizeof(int32_t) * M);
    int32_t *tab = malloc(sizeof(int32_t) * M * MAXB);
    for (int64_t i = 0; i < (int64_t)S * IN; i++)
        w[i] = frand() * 0.5f;
    for (int64_t i = 0; i < (int64_t)M * IN; i++)
        xin[i] = frand() * 2.0f;
    for (int32_t i = 0; i < S; i++)
        bias[i] = frand();
    fill_norm_weights(qn, q->hd);
    fill_norm_weights(kn, q->hd);
    for (int32_t t = 0; t < MAXPOS; t++)
        for (int32_t i = 0; i < half; i++) {
            double ang = t * pow(1e6, -2.0 * i / q->hd);
            cs[(t * half + i) * 2] = (float)cos(ang);
            cs[(t * half + i) * 2 + 1] = (float)sin(ang);
        }
    /* one row per sequence, each at its own position and block */
    for (int32_t i = 0; i < M; i++) {
        tok[i] = i;
        pos[i] = (i * 37 + 3) % MAXPOS;
        qs[i] = i;
        ctx[i] = pos[i] + 1;
        for (int32_t b = 0; b < MAXB; b++)
            tab[i * MAXB + b] = i * MAXB + b;
        slot[i] = tab[i * MAXB + pos[i] / BS] * BS + pos[i] % BS;
    }
    qs[M] = M;
    rd_step st = {M, M, MAXB, tok, pos, slot, qs, ctx, tab, NULL};
    rd_attn_shape a = {q->nh, q->nkv, q->hd, BS, (float)(1.0 / sqrt((double)q->hd)), 0};
    const int32_t nb = qwen3 ? 0 : S;
    void *W;
    CHECK_OK(be->ops->linear_load(be, w, S, IN, &W));
    float *dx = up(be, xin, sizeof(float) * M * IN), *dy = up(be, NULL, sizeof(float) * n);
    float *db = up(be, bias, sizeof(float) * S), *dqn = up(be, qn, sizeof(float) * q->hd);
    float *dkn = up(be, kn, sizeof(float) * q->hd), *dcs = up(be, cs, sizeof(float) * MAXPOS * q->hd);
    float *dk = up(be, NULL, 2 * cache), *dv = up(be, NULL, 2 * cache);
    be->ops->linear(be, W, dx, M, dy, 0);
    CHECK_OK(down(be, p, dy, sizeof(float) * n));
    /* the CPU ops on that product */
    {
        rd_step_dev cd;
        CHECK_OK(cpu->ops->step_upload(cpu, &st, &cd));
        float *cp = up(cpu, p, sizeof(float) * n), *cb = up(cpu, bias, sizeof(float) * S);
        float *cqn = up(cpu, qn, sizeof(float) * q->hd), *ckn = up(cpu, kn, sizeof(float) * q->hd);
        float *ccs = up(cpu, cs, sizeof(float) * MAXPOS * q->hd);
        float *ck = up(cpu, NULL, sizeof(float) * cache), *cv = up(cpu, NULL, sizeof(float) * cache);
        qkv_ops(cpu, q, cp, nb, cb, qwen3 ? cqn : NULL, ckn, 0);
        cpu->ops->rope(cpu, cp, S, M, q->nh + q->nkv, q->hd, cd.positions, ccs);
        cpu->ops->kv_write(cpu, &a, cp + q->nh * q->hd, cp + (q->nh + q->nkv) * q->hd, S, &cd, ck, cv);
        CHECK_OK(down(cpu, want, cp, sizeof(float) * n));
        CHECK_OK(down(cpu, ckc, ck, sizeof(float) * cache));
        CHECK_OK(down(cpu, cvc, cv, sizeof(float) * cache));
        cpu->ops->free(cpu, cp), cpu->ops->free(cpu, cb), cpu->ops->free(cpu, cqn), cpu->ops->free(cpu, ckn);
        cpu->ops->free(cpu, ccs), cpu->ops->free(cpu, ck), cpu->ops->free(cpu, cv);
    }
    rd_step_dev sd;
    CHECK_OK(be->ops->step_upload(be, &st, &sd));
    for (size_t i = 0; i < n; i++)
        got[i] = NAN;
    be->ops->h2d(be, dy, got, sizeof(float) * n); /* a column the sum misses shows */
    CHECK_OK(be->ops->sync(be)); /* the emulator counts kernels as they run, at a sync */
    uint64_t k0 = cuemu_launch_count();
    be->ops->linear(be, W, dx, M, dy, 0);
    qkv_ops(be, q, dy, nb, db, qwen3 ? dqn : NULL, dkn, 0);
    be->ops->rope(be, dy, S, M, q->nh + q->nkv, q->hd, sd.positions, dcs);
    be->ops->kv_write(be, &a, dy + q->nh * q->hd, dy + (q->nh + q->nkv) * q->hd, S, &sd, dk, dv);
    CHECK_OK(be->ops->sync(be));
    const uint64_t launched = cuemu_launch_count() - k0;
    CHECK_OK(down(be, got, dy, sizeof(float) * n));
    CHECK_OK(down(be, kc, dk, 2 * cache));
    CHECK_OK(down(be, vc, dv, 2 * cache));
    const char *fam = qwen3 ? "Qwen3 (q/k norms)" : "Qwen2 (bias)";
    int64_t ulps = max_ulps(want, got, n);
    CHECK(ulps <= 1, "%s, %s, hd %d: q|k|v rows after RoPE differ from the CPU by %lld ulps", mode, fam, q->hd,
          (long long)ulps);
    size_t bad = 0;
    for (size_t i = 0; i < cache; i++)
        bad += kc[i] != cm_f32_to_bf16(ckc[i]) || vc[i] != cm_f32_to_bf16(cvc[i]);
    CHECK(bad == 0, "%s, %s, hd %d: %zu KV cache values differ from the CPU's", mode, fam, q->hd, bad);
    CHECK(!on_emulator() || launched == (uint64_t)kernels, "%s, %s, hd %d: %llu kernels after the linear (want %lld)", mode, fam,
          q->hd, (unsigned long long)launched, (long long)kernels);
    if (graphs) {
        void *g;
        CHECK_OK(be->ops->graph_begin(be));
        be->ops->linear(be, W, dx, M, dy, 0);
        qkv_ops(be, q, dy, nb, db, qwen3 ? dqn : NULL, dkn, 0);
        be->ops->rope(be, dy, S, M, q->nh + q->nkv, q->hd, sd.positions, dcs);
        be->ops->kv_write(be, &a, dy + q->nh * q->hd, dy + (q->nh + q->nkv) * q->hd, S, &sd, dk, dv);
        CHECK_OK(be->ops->graph_end(be, &g));
        for (size_t i = 0; i < n; i++)
            got2[i] = NAN;
        memset(kc2, 0xff, 2 * cache);
        be->ops->h2d(be, dy, got2, sizeof(float) * n);
        be->ops->h2d(be, dk, kc2, 2 * cache);
        be->ops->h2d(be, dv, kc2, 2 * cache);
        CHECK_OK(be->ops->graph_launch(be, g));
        CHECK_OK(down(be, got2, dy, sizeof(float) * n));
        CHECK_OK(down(be, kc2, dk, 2 * cache));
        CHECK_OK(down(be, vc2, dv, 2 * cache));
        be->ops->graph_free(be, g);
        /* unwritten cache slots hold the poison: compare the written ones */
        bad = 0;
        for (int32_t i = 0; i < M; i++)
            for (int32_t h = 0; h < q->nkv; h++) {
                size_t at = (((size_t)(slot[i] / BS) * q->nkv + h) * BS + slot[i] % BS) * q->hd;
                bad += memcmp(kc + at, kc2 + at, 2 * q->hd) != 0 || memcmp(vc + at, vc2 + at, 2 * q->hd) != 0;
            }
        CHECK(!memcmp(got, got2, sizeof(float) * n) && bad == 0,
              "%s, %s, hd %d: a graph replay differs from the eager run (%zu KV heads)", mode, fam, q->hd, bad);
    }
    be->ops->free(be, dx), be->ops->free(be, dy), be->ops->free(be, db), be->ops->free(be, dqn);
    be->ops->free(be, dkn), be->ops->free(be, dcs), be->ops->free(be, dk), be->ops->free(be, dv);
    be->ops->linear_free(be, W);
    free(w), free(xin), free(bias), free(qn), free(kn), free(cs), free(p), free(want), free(got), free(got2);
    free(ckc), free(cvc), free(kc), free(vc), free(kc2), free(vc2);
    free(tok), free(pos), free(slot), free(qs), free(ctx), free(tab);
}

/* Every activation mode: split (the default), bf16, mixed, and RD_CUDA_FUSE=0. */
static void test_qwen_ops_after_linear(void)
{
    rd_backend *mixed = NULL, *nofuse = NULL;
    setenv("RD_CUDA_ACT", "mixed", 1);
    int rc = rd_backend_create(dev_name(), 1, &mixed);
    unsetenv("RD_CUDA_ACT");
    CHECK_OK(rc);
    setenv("RD_CUDA_FUSE", "0", 1);
    rc = rd_backend_create(dev_name(), 1, &nofuse);
    unsetenv("RD_CUDA_FUSE");
    CHECK_OK(rc);
    struct {
        rd_backend *be;
        const char *name;
        int fused;
    } modes[] = {{emu, "split", 1}, {emu_bf16, "bf16", 1}, {mixed, "mixed", 1}, {nofuse, "RD_CUDA_FUSE=0", 0}};
    for (size_t mi = 0; mi < sizeof modes / sizeof modes[0]; mi++) {
        for (size_t si = 0; si < N_QKV_SHAPES; si++) {
            const qkv_shape *q = &qkv_shapes[si];
            /* mixed differs from bf16 only on a contracting GEMM: the first shape's */
            if ((modes[mi].be == mixed && si > 0) || (light && si == 3))
                continue;
            /* in > out for the first shape: a contracting GEMM, split in the mixed mode too */
            qwen_chain_case(modes[mi].be, modes[mi].name, q, si == 0 ? qkv_stride(q) + 8 : 40);
            if (test_case_failed)
                return;
            for (int qwen3 = 0; qwen3 <= 1; qwen3++) {
                /* kernels: the linear's conversion and GEMM (and its sum when not fused:
                   else the next op completes it), the ops (bias: 1; norms: 2, one launch
                   when fused), then RoPE with the KV write inside it, or (not fused, or
                   rows wider than q|k|v) RoPE and KV write. Fused with head_dim a
                   multiple of 64 or 32, the norms, RoPE and the KV write are one kernel. */
                const int fused = modes[mi].fused;
                int64_t k = 2 + !fused;
                if (qwen3 && fused && (q->hd % 64 == 0 || q->hd == 32))
                    k += q->pad == 0 ? 1 : 2;
                else
                    k += (qwen3 ? 2 - fused : 1) + (fused && q->pad == 0 ? 1 : 2);
                qwen_entry_case(modes[mi].be, modes[mi].name, q, qwen3, k, mi == 0);
                if (test_case_failed)
                    return;
            }
        }
    }
    rd_backend_destroy(mixed);
    rd_backend_destroy(nofuse);
}

/* ------------------------------------------------------------------ Gemma 3's ops */

/* Bits of a[i] vs b[i] where the CPU keeps the sign of a zero weight. */
static size_t bit_diffs(const float *a, const float *b, size_t n)
{
    size_t d = 0;
    for (size_t i = 0; i < n; i++)
        d += fbits(a[i]) != fbits(b[i]);
    return d;
}

/* Gemma's norm weights are stored as w and applied as (1 + w): small values
 * around 0, with a few edge cases (a signed zero, -1 so that 1 + w = 0). */
static void fill_gemma_norm(float *w, int32_t n)
{
    for (int32_t i = 0; i < n; i++)
        w[i] = 0.5f * frand();
    w[0] = -0.0f;
    if (n > 3)
        w[3] = -1.0f, w[2] = 0.0f;
}

/* rmsnorm and head_rmsnorm with w_offset 1 (Gemma's 1 + w) and 0 (the weight
 * as it is: a -0 weight keeps its sign) against the CPU backend: Gemma 3
 * 270m's hidden 640 and an odd width 97; per-head norms on 4 query and 1 key
 * heads of 256 in q|k|v rows (V after them untouched), and on 5 + 1 heads of
 * 64 with a padded stride. Within 1 ulp (double sums in another order), zero
 * weights bit for bit, and against a double reference. */
static void test_norm_offsets(void)
{
    rd_backend *bes[2] = {cpu, emu};
    const int32_t M = 5, dims[2] = {640, 97};
    int64_t worst = 0;
    for (int di = 0; di < 2; di++) {
        const int32_t D = dims[di];
        const size_t n = (size_t)M * D;
        float *x = malloc(sizeof(float) * n), *w = malloc(sizeof(float) * D), *res[2][2];
        for (size_t i = 0; i < n; i++)
            x[i] = frand() * 3;
        fill_gemma_norm(w, D);
        for (int k = 0; k < 2; k++) {
            rd_backend *be = bes[k];
            float *dx = up(be, x, sizeof(float) * n), *dw = up(be, w, sizeof(float) * D), *dout = up(be, NULL, sizeof(float) * n);
            for (int off = 0; off < 2; off++) {
                res[k][off] = malloc(sizeof(float) * n);
                be->ops->rmsnorm(be, dx, dw, M, D, 1e-6f, (float)off, dout);
                CHECK_OK(down(be, res[k][off], dout, sizeof(float) * n));
            }
            be->ops->free(be, dx), be->ops->free(be, dw), be->ops->free(be, dout);
        }
        for (int off = 0; off < 2; off++) {
            int64_t ulps = max_ulps(res[0][off], res[1][off], n);
            worst = ulps > worst ? ulps : worst;
            CHECK(ulps <= 1, "rmsnorm d %d w_offset %d: %lld ulps from the CPU", D, off, (long long)ulps);
            size_t zdiff = 0;
            for (int32_t r = 0; r < M; r++)
                for (int32_t j = 0; j < D; j++)
                    if (w[j] == 0.0f || w[j] == -1.0f)
                        zdiff += fbits(res[0][off][r * D + j]) != fbits(res[1][off][r * D + j]);
            CHECK(zdiff == 0, "rmsnorm d %d w_offset %d: %zu outputs of zero (or -1) weights differ in sign", D, off,
                  zdiff);
            double rel = 0;
            for (int32_t r = 0; r < M; r++) {
                double ss = 0;
                for (int32_t j = 0; j < D; j++)
                    ss += (double)x[r * D + j] * x[r * D + j];
                const double inv = 1.0 / sqrt(ss / D + 1e-6);
                for (int32_t j = 0; j < D; j++) {
                    const double want = x[r * D + j] * inv * ((double)w[j] + off);
                    const double e = fabs(res[1][off][r * D + j] - want) / (fabs(x[r * D + j] * inv) + 1e-30);
                    rel = e > rel ? e : rel;
                }
            }
            CHECK(rel < 1e-6, "rmsnorm d %d w_offset %d: %.3g from the double reference", D, off, rel);
        }
        CHECK(bit_diffs(res[1][0], res[1][1], n) > n / 2, "d %d: w_offset 1 changed only %zu of %zu outputs", D,
              bit_diffs(res[1][0], res[1][1], n), n);
        for (int k = 0; k < 2; k++)
            free(res[k][0]), free(res[k][1]);
        free(x), free(w);
    }
    const qkv_shape shapes[2] = {{256, 4, 1, 3, 0}, {64, 5, 1, 4, 8}};
    for (int si = 0; si < 2; si++) {
        const qkv_shape *q = &shapes[si];
        const int32_t S = qkv_stride(q);
        const size_t n = (size_t)q->m * S;
        float *x = malloc(sizeof(float) * n), *qn = malloc(sizeof(float) * q->hd), *kn = malloc(sizeof(float) * q->hd);
        float *res[2][2];
        for (size_t i = 0; i < n; i++)
            x[i] = frand() * 3;
        fill_gemma_norm(qn, q->hd);
        fill_gemma_norm(kn, q->hd);
        for (int k = 0; k < 2; k++) {
            rd_backend *be = bes[k];
            float *dx = up(be, x, sizeof(float) * n), *dqn = up(be, qn, sizeof(float) * q->hd);
            float *dkn = up(be, kn, sizeof(float) * q->hd);
            for (int off = 0; off < 2; off++) {
                res[k][off] = malloc(sizeof(float) * n);
                be->ops->h2d(be, dx, x, sizeof(float) * n);
                be->ops->head_rmsnorm(be, dx, S, q->m, q->nh, q->hd, dqn, 1e-6f, (float)off);
                be->ops->head_rmsnorm(be, dx + q->nh * q->hd, S, q->m, q->nkv, q->hd, dkn, 1e-6f, (float)off);
                CHECK_OK(down(be, res[k][off], dx, sizeof(float) * n));
            }
            be->ops->free(be, dx), be->ops->free(be, dqn), be->ops->free(be, dkn);
        }
        for (int off = 0; off < 2; off++) {
            int64_t ulps = max_ulps(res[0][off], res[1][off], n);
            worst = ulps > worst ? ulps : worst;
            CHECK(ulps <= 1, "head_rmsnorm hd %d w_offset %d: %lld ulps from the CPU", q->hd, off, (long long)ulps);
            size_t zdiff = 0, vchanged = 0;
            for (int32_t r = 0; r < q->m; r++)
                for (int32_t c = 0; c < S; c++) {
                    const size_t i = (size_t)r * S + c;
                    if (c >= (q->nh + q->nkv) * q->hd) {
                        vchanged += fbits(res[1][off][i]) != fbits(x[i]);
                        continue;
                    }
                    const float wv = c < q->nh * q->hd ? qn[c % q->hd] : kn[c % q->hd];
                    if (wv == 0.0f || wv == -1.0f)
                        zdiff += fbits(res[0][off][i]) != fbits(res[1][off][i]);
                }
            CHECK(zdiff == 0 && vchanged == 0, "head_rmsnorm hd %d w_offset %d: %zu zero-weight signs differ, %zu V or "
                  "pad columns changed", q->hd, off, zdiff, vchanged);
        }
        CHECK(bit_diffs(res[1][0], res[1][1], n) > n / 3, "head_rmsnorm hd %d: w_offset 1 changed too little", q->hd);
        for (int k = 0; k < 2; k++)
            free(res[k][0]), free(res[k][1]);
        free(x), free(qn), free(kn);
    }
    printf("# rmsnorm and head_rmsnorm with w_offset 0 and 1, emulated CUDA vs CPU: at most %lld ulps\n",
           (long long)worst);
}

/* geglu(g, u) of the emulated backend vs the CPU backend's (tanhf): every
 * element either the same bits, or within the tanh's 2 ulps (<= 2^-23 on
 * 1 + t) times |0.5 g u| plus the products' rounding; and always the bits of
 * cm_geglu computed here (the kernel's expression). Returns the share of
 * identical elements. */
static double geglu_compare(const float *gu, int32_t m, int32_t f, const float *cpu_out, const float *dev_out,
                            double *worst_units, int *ok, char *why, size_t cap)
{
    size_t same = 0;
    *ok = 1;
    for (int32_t r = 0; r < m && *ok; r++)
        for (int32_t c = 0; c < f; c++) {
            const float g = gu[(size_t)r * 2 * f + c], u = gu[(size_t)r * 2 * f + f + c];
            const size_t i = (size_t)r * f + c;
            const float ref = cm_geglu(g, u), a = cpu_out[i], b = dev_out[i];
            if (isnan(ref) ? !isnan(b) : fbits(ref) != fbits(b)) {
                snprintf(why, cap, "row %d col %d: geglu(%a, %a) = %a, the kernel's expression gives %a", r, c, g, u, b,
                         ref);
                *ok = 0;
                break;
            }
            if ((isnan(a) && isnan(b)) || fbits(a) == fbits(b)) {
                same++;
                continue;
            }
            const double lim = fabs(0.5 * g * u) * 0x1.0p-22 + 4.0 * fabs(a) * 0x1.0p-24;
            const double d = fabs((double)a - b);
            if (!(d <= lim)) {
                snprintf(why, cap, "row %d col %d: geglu(%a, %a) = %a vs the CPU's %a", r, c, g, u, b, a);
                *ok = 0;
                break;
            }
            const double units = d / (fabs(0.5 * g * u) * 0x1.0p-24);
            *worst_units = units > *worst_units ? units : *worst_units;
        }
    return (double)same / ((double)m * f);
}

/* geglu on plain buffers (no deferred sum) vs the CPU backend, odd sizes:
 * g in [-8, 8) and special values (+-inf, NaN, +-1e20, -0, a subnormal). */
static void test_gemma_elementwise(void)
{
    const int32_t M = 7, F = 333;
    const size_t ngu = (size_t)M * 2 * F, n = (size_t)M * F;
    float *gu = malloc(sizeof(float) * ngu);
    for (size_t i = 0; i < ngu; i++)
        gu[i] = frand() * 8.0f;
    const float special[] = {INFINITY, -INFINITY, NAN, 1e20f, -1e20f, -0.0f, 0x1p-140f, -3.5f, -9.5f, 12.0f};
    for (size_t k = 0; k < sizeof special / sizeof special[0]; k++)
        gu[k * 5] = special[k], gu[F + k * 7] = special[k]; /* gates of row 0, ups of row 0 */
    float *res[2];
    rd_backend *bes[2] = {cpu, emu};
    for (int k = 0; k < 2; k++) {
        rd_backend *be = bes[k];
        float *dgu = up(be, gu, sizeof(float) * ngu), *dout = up(be, NULL, sizeof(float) * n);
        res[k] = malloc(sizeof(float) * n);
        be->ops->geglu(be, dgu, M, F, dout);
        CHECK_OK(down(be, res[k], dout, sizeof(float) * n));
        be->ops->free(be, dgu), be->ops->free(be, dout);
    }
    double worst = 0;
    int ok;
    char why[300];
    const double same = geglu_compare(gu, M, F, res[0], res[1], &worst, &ok, why, sizeof why);
    CHECK(ok, "geglu: %s", why);
    printf("# geglu, emulated CUDA vs CPU (tanhf): %.2f%% bit-identical, the rest within %.2f x |0.5 g u| 2^-24\n",
           100.0 * same, worst);
    CHECK(same > 0.9, "geglu: only %.1f%% identical to the CPU", 100.0 * same);
    free(res[0]), free(res[1]), free(gu);
}

/* Gemma's ops on a linear layer's output as the runner calls them, in one
 * activation mode: rmsnorm (+1) of the o/down projection's output, geglu of
 * gate|up, rmsnorm_add (the post-norm and the residual add: rmsnorm's bits,
 * then the add's). With split activations
 * the GEMM's sum is still deferred when the op runs and the op completes it
 * (one kernel: `kernels` checks that nothing was launched apart); whatever the
 * mode, the result is the CPU ops' on the product computed alone (geglu: the
 * kernel's expression exactly, the CPU within the tanh's rounding), and the
 * product itself is left completed in the linear's output. */
static void gemma_chain_case(rd_backend *be, const char *mode, int fused)
{
    const int32_t M = 5, F = 37, OUT = 2 * F, IN = 80; /* in > out: contracting (split in the mixed mode too) */
    const size_t n = (size_t)M * OUT;
    float *w = malloc(sizeof(float) * OUT * IN), *xin = malloc(sizeof(float) * M * IN), *nw = malloc(sizeof(float) * OUT);
    float *z = malloc(sizeof(float) * n), *p = malloc(sizeof(float) * n), *want = malloc(sizeof(float) * n);
    float *got = malloc(sizeof(float) * n), *got2 = malloc(sizeof(float) * n), *poison = malloc(sizeof(float) * n);
    for (int64_t i = 0; i < (int64_t)OUT * IN; i++)
        w[i] = frand() * 0.5f;
    for (int64_t i = 0; i < (int64_t)M * IN; i++)
        xin[i] = frand() * 2.0f;
    for (size_t i = 0; i < n; i++)
        z[i] = frand() * 4.0f, poison[i] = NAN;
    fill_gemma_norm(nw, OUT);
    void *W;
    CHECK_OK(be->ops->linear_load(be, w, OUT, IN, &W));
    float *dx = up(be, xin, sizeof(float) * M * IN), *dy = up(be, NULL, sizeof(float) * n);
    float *dz = up(be, z, sizeof(float) * n), *dnw = up(be, nw, sizeof(float) * OUT), *dout = up(be, NULL, sizeof(float) * n);
    be->ops->linear(be, W, dx, M, dy, 0);
    CHECK_OK(down(be, p, dy, sizeof(float) * n)); /* the product alone */
    float *cp = up(cpu, p, sizeof(float) * n), *cz = up(cpu, z, sizeof(float) * n), *cnw = up(cpu, nw, sizeof(float) * OUT);
    float *cout = up(cpu, NULL, sizeof(float) * n);
    const char *what[3] = {"rmsnorm(+1)", "geglu", "rmsnorm_add"};
    float *norm0 = malloc(sizeof(float) * n); /* op 0's device result: rmsnorm_add's norm must be its bits */
    for (int op = 0; op < 3; op++) {
        size_t nr = op == 1 ? (size_t)M * F : n;
        /* the CPU on the product */
        cpu->ops->h2d(cpu, cp, p, sizeof(float) * n);
        cpu->ops->h2d(cpu, cz, z, sizeof(float) * n);
        const float *cres = cout;
        if (op == 0)
            cpu->ops->rmsnorm(cpu, cp, cnw, M, OUT, 1e-6f, 1.0f, cout);
        else if (op == 1)
            cpu->ops->geglu(cpu, cp, M, F, cout);
        else
            cpu->ops->rmsnorm_add(cpu, cp, cnw, M, OUT, 1e-6f, 1.0f, cout, cz), cres = cz;
        CHECK_OK(down(cpu, want, cres, sizeof(float) * nr));
        /* the backend on the linear's fresh output */
        be->ops->h2d(be, dy, poison, sizeof(float) * n); /* a column the sum misses shows */
        be->ops->h2d(be, dz, z, sizeof(float) * n);
        CHECK_OK(be->ops->sync(be));
        const uint64_t k0 = cuemu_launch_count();
        be->ops->linear(be, W, dx, M, dy, 0);
        const float *res = dout;
        if (op == 0)
            be->ops->rmsnorm(be, dy, dnw, M, OUT, 1e-6f, 1.0f, dout);
        else if (op == 1)
            be->ops->geglu(be, dy, M, F, dout);
        else
            be->ops->rmsnorm_add(be, dy, dnw, M, OUT, 1e-6f, 1.0f, dout, dz), res = dz;
        CHECK_OK(be->ops->sync(be));
        const uint64_t launched = cuemu_launch_count() - k0;
        CHECK_OK(down(be, got, res, sizeof(float) * nr));
        CHECK_OK(down(be, got2, dy, sizeof(float) * n));
        if (op == 1) {
            double worst = 0;
            int ok;
            char why[300];
            geglu_compare(p, M, F, want, got, &worst, &ok, why, sizeof why);
            CHECK(ok, "%s: linear then geglu: %s", mode, why);
        } else if (op == 2) {
            /* the norm is op 0's bits, the sum z + norm rounded once; the CPU's within its norm's 1 ulp */
            float *nrm = malloc(sizeof(float) * n);
            CHECK_OK(down(be, nrm, dout, sizeof(float) * n));
            CHECK(!memcmp(nrm, norm0, sizeof(float) * n), "%s: rmsnorm_add's norm differs from rmsnorm's", mode);
            size_t bad = 0;
            for (size_t i = 0; i < n; i++) {
                bad += fbits(got[i]) != fbits(z[i] + norm0[i]);
                const double tol = ldexp(fabs(norm0[i]), -23) + ldexp(fabs(want[i]), -24);
                CHECK(fabs((double)got[i] - want[i]) <= tol, "%s: rmsnorm_add at %zu: %a vs the CPU's %a", mode,
                      i, got[i], want[i]);
            }
            CHECK(bad == 0, "%s: rmsnorm_add: %zu sums are not z + the norm", mode, bad);
            free(nrm);
        } else {
            int64_t ulps = max_ulps(want, got, nr);
            CHECK(op == 0 ? ulps <= 1 : bit_diffs(want, got, nr) == 0,
                  "%s: linear then %s differs from the CPU op on its product (%lld ulps)", mode, what[op],
                  (long long)ulps);
            if (op == 0)
                memcpy(norm0, got, sizeof(float) * n);
        }
        /* the product is completed in place */
        CHECK(!memcmp(got2, p, sizeof(float) * n), "%s: after linear then %s the linear's output is not the product",
              mode, what[op]);
        /* the linear's conversion and GEMM, the op; the sum alone when not fused */
        CHECK(!on_emulator() || launched == (uint64_t)(3 + !fused), "%s: linear then %s took %llu kernels (want %d)", mode, what[op],
              (unsigned long long)launched, 3 + !fused);
    }
    cpu->ops->free(cpu, cp), cpu->ops->free(cpu, cz), cpu->ops->free(cpu, cnw), cpu->ops->free(cpu, cout);
    be->ops->free(be, dx), be->ops->free(be, dy), be->ops->free(be, dz), be->ops->free(be, dnw), be->ops->free(be, dout);
    be->ops->linear_free(be, W);
    free(w), free(xin), free(nw), free(z), free(p), free(want), free(got), free(got2), free(poison), free(norm0);
}

static void test_gemma_ops_after_linear(void)
{
    rd_backend *mixed = NULL, *nofuse = NULL;
    setenv("RD_CUDA_ACT", "mixed", 1);
    int rc = rd_backend_create(dev_name(), 1, &mixed);
    unsetenv("RD_CUDA_ACT");
    CHECK_OK(rc);
    setenv("RD_CUDA_FUSE", "0", 1);
    rc = rd_backend_create(dev_name(), 1, &nofuse);
    unsetenv("RD_CUDA_FUSE");
    CHECK_OK(rc);
    gemma_chain_case(emu, "split", 1);
    if (!test_case_failed)
        gemma_chain_case(emu_bf16, "bf16", 1);
    if (!test_case_failed)
        gemma_chain_case(mixed, "mixed", 1);
    if (!test_case_failed)
        gemma_chain_case(nofuse, "RD_CUDA_FUSE=0", 0);
    rd_backend_destroy(mixed);
    rd_backend_destroy(nofuse);
}

/* bf16 copies: rmsnorm_add drops the copy an earlier RMSNorm left of the
 * buffer it changes, as y and as out (a GEMM reading it next sees the new
 * values), and geglu's copy of its output serves the down projection (no
 * conversion kernel) with the bits of a fresh conversion. */
static void test_gemma_shadows(void)
{
    const int32_t M = 4, S = 48, OUT = 24, F = S / 2;
    const size_t n = (size_t)M * S;
    float *x = malloc(sizeof(float) * n), *nw = malloc(sizeof(float) * S), *z = malloc(sizeof(float) * n);
    float *w = malloc(sizeof(float) * OUT * S), *wd = malloc(sizeof(float) * OUT * F), *mid = malloc(sizeof(float) * n);
    float *got = malloc(sizeof(float) * M * OUT), *want = malloc(sizeof(float) * M * OUT);
    for (size_t i = 0; i < n; i++)
        x[i] = frand() * 3, z[i] = frand();
    fill_gemma_norm(nw, S);
    for (int32_t i = 0; i < OUT * S; i++)
        w[i] = frand() * 0.5f;
    for (int32_t i = 0; i < OUT * F; i++)
        wd[i] = frand() * 0.5f;
    float *dx = up(emu, x, sizeof(float) * n), *dy = up(emu, NULL, sizeof(float) * n), *dm = up(emu, NULL, sizeof(float) * n);
    float *dz = up(emu, z, sizeof(float) * n), *dnw = up(emu, nw, sizeof(float) * S);
    float *dout = up(emu, NULL, sizeof(float) * M * OUT);
    void *W, *Wd;
    CHECK_OK(emu->ops->linear_load(emu, w, OUT, S, &W));
    CHECK_OK(emu->ops->linear_load(emu, wd, OUT, F, &Wd));
    const char *what[2] = {"rmsnorm_add(y)", "rmsnorm_add(out)"};
    for (int op = 0; op < 2; op++) {
        emu->ops->rmsnorm(emu, dx, dnw, M, S, 1e-6f, 1.0f, dy); /* dy gets a bf16 copy */
        float *target = dy;
        if (op == 0)
            emu->ops->rmsnorm_add(emu, dz, dnw, M, S, 1e-6f, 1.0f, dm, dy);
        else
            emu->ops->rmsnorm_add(emu, dz, dnw, M, S, 1e-6f, 1.0f, dy, dm);
        emu->ops->linear(emu, W, target, M, dout, 0);
        CHECK_OK(down(emu, got, dout, sizeof(float) * M * OUT));
        CHECK_OK(down(emu, mid, target, sizeof(float) * n));
        emu->ops->h2d(emu, dm, mid, sizeof(float) * n); /* the same values in a buffer with no copy */
        emu->ops->linear(emu, W, dm, M, dout, 0);
        CHECK_OK(down(emu, want, dout, sizeof(float) * M * OUT));
        CHECK(!memcmp(got, want, sizeof(float) * M * OUT), "a GEMM after %s read a stale bf16 copy of its input",
              what[op]);
    }
    /* geglu's copy: gu = x as [M][2F] */
    emu->ops->geglu(emu, dx, M, F, dy);
    CHECK_OK(emu->ops->sync(emu));
    const uint64_t k0 = cuemu_launch_count();
    emu->ops->linear(emu, Wd, dy, M, dout, 0);
    CHECK_OK(down(emu, got, dout, sizeof(float) * M * OUT));
    const uint64_t launched = cuemu_launch_count() - k0;
    CHECK(!on_emulator() || launched == 2, "the down projection after geglu took %llu kernels (want the GEMM and its sum)",
          (unsigned long long)launched);
    CHECK_OK(down(emu, mid, dy, sizeof(float) * M * F));
    emu->ops->h2d(emu, dm, mid, sizeof(float) * M * F);
    emu->ops->linear(emu, Wd, dm, M, dout, 0);
    CHECK_OK(down(emu, want, dout, sizeof(float) * M * OUT));
    CHECK(!memcmp(got, want, sizeof(float) * M * OUT), "geglu's bf16 copy differs from converting its output");
    emu->ops->linear_free(emu, W);
    emu->ops->linear_free(emu, Wd);
    emu->ops->free(emu, dx), emu->ops->free(emu, dy), emu->ops->free(emu, dm), emu->ops->free(emu, dz);
    emu->ops->free(emu, dnw), emu->ops->free(emu, dout);
    free(x), free(nw), free(z), free(w), free(wd), free(mid), free(got), free(want);
}

/* ------------------------------------------------------------------ attention */

typedef struct {
    int32_t ctx;                /* tokens in cache after the step */
    int32_t new_rows;           /* rows computed in the step (the last ones) */
} seq_spec;

/* Options of attn_case_opt: a sliding window (0: none); the data key of each
 * sequence (its values are drawn from its key, so a sequence gets the same
 * data alone or among others; NULL: its index); and poisoning (NaN) of the
 * cached keys no row of the step may see (before every row's window). */
typedef struct {
    int32_t window;
    const int32_t *keys;
    int poison_outside;
} attn_opts;

/* Runs kv_write + attention for seqs on the emulated backend and checks every
 * row against a double reference over bf16 K/V; returns the output. */
static float *attn_case_opt(int32_t nh, int32_t nkv, int32_t hd, int32_t bs, const seq_spec *sp, int32_t ns,
                            int32_t pad_rows, uint64_t seed, const attn_opts *opt, double *worst_out, int *ok)
{
    const int32_t W = opt ? opt->window : 0;
    *ok = 0;
    rs = seed;
    int32_t M = pad_rows, maxb = 1, total_blocks = 0;
    for (int32_t s = 0; s < ns; s++) {
        M += sp[s].new_rows;
        int32_t nb = (sp[s].ctx + bs - 1) / bs;
        maxb = nb > maxb ? nb : maxb;
        total_blocks += nb;
    }
    const int32_t n_blocks = total_blocks + 3, qdim = (nh + 2 * nkv) * hd;
    const size_t cache_elems = (size_t)n_blocks * nkv * bs * hd;
    /* scrambled block ids */
    int32_t *perm = malloc(sizeof(int32_t) * n_blocks);
    for (int32_t i = 0; i < n_blocks; i++)
        perm[i] = i;
    for (int32_t i = n_blocks - 1; i > 0; i--) {
        int32_t j = (int32_t)(rnd() % (uint64_t)(i + 1)), t = perm[i];
        perm[i] = perm[j], perm[j] = t;
    }
    int32_t *tables = calloc((size_t)ns * maxb, sizeof(int32_t));
    int32_t *tok = malloc(sizeof(int32_t) * M), *pos = malloc(sizeof(int32_t) * M), *slot = malloc(sizeof(int32_t) * M);
    int32_t *qs = malloc(sizeof(int32_t) * (ns + 1)), *ctx = malloc(sizeof(int32_t) * ns);
    uint16_t *kc = malloc(2 * cache_elems), *vc = malloc(2 * cache_elems);
    float *kv_all = malloc(sizeof(float) * 2 * (size_t)n_blocks * bs * nkv * hd); /* [block*bs+off][k|v][nkv][hd] */
    float *q = malloc(sizeof(float) * M * qdim), *out = malloc(sizeof(float) * M * nh * hd);
    for (size_t i = 0; i < cache_elems; i++)
        kc[i] = vc[i] = 0xffc0; /* NaN: reading an unwritten slot poisons the row */
    int32_t next_block = 0, row = 0;
    for (int32_t s = 0; s < ns; s++) {
        int32_t nb = (sp[s].ctx + bs - 1) / bs;
        const int32_t key = opt && opt->keys ? opt->keys[s] : s;
        /* the first key any of its rows sees (its first new row's window) */
        const int32_t seen = opt && opt->poison_outside ? cuplan_attn_key0(sp[s].ctx - sp[s].new_rows, W) : 0;
        for (int32_t b = 0; b < nb; b++)
            tables[s * maxb + b] = perm[next_block++];
        qs[s] = row;
        ctx[s] = sp[s].ctx;
        for (int32_t p = 0; p < sp[s].ctx; p++) {
            int32_t sl = tables[s * maxb + p / bs] * bs + p % bs;
            float *kvp = kv_all + (size_t)sl * 2 * nkv * hd;
            for (int32_t i = 0; i < 2 * nkv * hd; i++)
                kvp[i] = hval(seed, key, p, i);
            if (p < seen)
                continue; /* out of every row's window: stays NaN in the cache */
            if (p < sp[s].ctx - sp[s].new_rows) { /* already cached: place it directly */
                for (int32_t h = 0; h < nkv; h++)
                    for (int32_t d = 0; d < hd; d++) {
                        size_t at = (((size_t)(sl / bs) * nkv + h) * bs + sl % bs) * hd + d;
                        kc[at] = cm_f32_to_bf16(kvp[h * hd + d]);
                        vc[at] = cm_f32_to_bf16(kvp[nkv * hd + h * hd + d]);
                    }
            } else { /* computed this step: through kv_write from q rows */
                tok[row] = 1;
                pos[row] = p;
                slot[row] = sl;
                float *qr = q + (size_t)row * qdim;
                for (int32_t i = 0; i < nh * hd; i++)
                    qr[i] = hval(seed + 1, key, p, i);
                memcpy(qr + nh * hd, kvp, sizeof(float) * 2 * nkv * hd);
                row++;
            }
        }
    }
    qs[ns] = row;
    for (; row < M; row++) { /* padding */
        tok[row] = -1, pos[row] = 0, slot[row] = -1;
        for (int32_t i = 0; i < qdim; i++)
            q[(size_t)row * qdim + i] = frand();
    }
    float *dq = up(emu, q, sizeof(float) * M * qdim), *dout = up(emu, NULL, sizeof(float) * M * nh * hd);
    float *dk = up(emu, kc, 2 * cache_elems), *dv = up(emu, vc, 2 * cache_elems);
    rd_step st = {M, ns, maxb, tok, pos, slot, qs, ctx, tables, NULL};
    rd_step_dev sd;
    rd_attn_shape a = {nh, nkv, hd, bs, (float)(1.0 / sqrt((double)hd)), W};
    int rc = emu->ops->step_upload(emu, &st, &sd);
    if (!rc) {
        emu->ops->kv_write(emu, &a, dq + nh * hd, dq + (nh + nkv) * hd, qdim, &sd, dk, dv);
        emu->ops->attention(emu, &a, dq, qdim, &sd, dk, dv, dout);
        rc = down(emu, out, dout, sizeof(float) * M * nh * hd);
    }
    double worst = 0;
    int good = rc == 0;
    const int32_t g = nh / nkv;
    for (int32_t r = 0; good && r < M; r++) {
        const float *o = out + (size_t)r * nh * hd;
        if (r >= qs[ns]) {
            for (int32_t i = 0; i < nh * hd; i++)
                good &= o[i] == 0.0f;
            continue;
        }
        int32_t s = 0;
        while (qs[s + 1] <= r)
            s++;
        /* keys j0 .. pos[r]: the last W with a window */
        const int32_t j0 = W > 0 && pos[r] + 1 > W ? pos[r] + 1 - W : 0, n = pos[r] + 1;
        double *sc = malloc(sizeof(double) * n);
        for (int32_t h = 0; h < nh; h++) {
            const int32_t kh = h / g;
            double mx = -INFINITY, sum = 0;
            for (int32_t j = j0; j < n; j++) {
                int32_t sl = tables[s * maxb + j / bs] * bs + j % bs;
                const float *kvp = kv_all + (size_t)sl * 2 * nkv * hd;
                double d = 0;
                for (int32_t e = 0; e < hd; e++)
                    d += (double)q[(size_t)r * qdim + h * hd + e] * bf(kvp[kh * hd + e]);
                sc[j] = d * a.scale;
                mx = sc[j] > mx ? sc[j] : mx;
            }
            for (int32_t j = j0; j < n; j++)
                sum += (sc[j] = exp(sc[j] - mx));
            for (int32_t e = 0; e < hd; e++) {
                double acc = 0;
                for (int32_t j = j0; j < n; j++) {
                    int32_t sl = tables[s * maxb + j / bs] * bs + j % bs;
                    acc += sc[j] / sum * bf(kv_all[(size_t)sl * 2 * nkv * hd + nkv * hd + kh * hd + e]);
                }
                double err = fabs(o[h * hd + e] - acc);
                worst = worse(worst, err);
            }
        }
        free(sc);
    }
    /* The rows' K/V went into the cache as bf16 at their slots. */
    uint16_t *kc2 = malloc(2 * cache_elems);
    if (good && !down(emu, kc2, dk, 2 * cache_elems)) {
        for (int32_t r = 0; r < qs[ns]; r++)
            for (int32_t h = 0; h < nkv; h++)
                for (int32_t d = 0; d < hd; d++) {
                    size_t at = (((size_t)(slot[r] / bs) * nkv + h) * bs + slot[r] % bs) * hd + d;
                    good &= kc2[at] == cm_f32_to_bf16(q[(size_t)r * qdim + nh * hd + h * hd + d]);
                }
    }
    free(kc2);
    emu->ops->free(emu, dq), emu->ops->free(emu, dout), emu->ops->free(emu, dk), emu->ops->free(emu, dv);
    free(perm), free(tables), free(tok), free(pos), free(slot), free(qs), free(ctx), free(kc), free(vc), free(kv_all),
        free(q);
    *worst_out = worst;
    *ok = good;
    if (!good) {
        free(out);
        return NULL;
    }
    return out;
}

static float *attn_case(int32_t nh, int32_t nkv, int32_t hd, int32_t bs, const seq_spec *sp, int32_t ns,
                        int32_t pad_rows, uint64_t seed, double *worst_out, int *ok)
{
    return attn_case_opt(nh, nkv, hd, bs, sp, ns, pad_rows, seed, NULL, worst_out, ok);
}

static void test_attention(void)
{
    struct {
        int32_t nh, nkv, hd, bs;
    } shapes[] = {{4, 2, 16, 16}, {9, 3, 64, 16}, {8, 1, 32, 5}, {4, 4, 128, 16}, {16, 1, 8, 7}};
    const seq_spec seqs[] = {{600, 3}, {37, 37}, {257, 1}, {1, 1}, {256, 2}, {513, 1}};
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        double worst;
        int ok;
        float *o = attn_case(shapes[i].nh, shapes[i].nkv, shapes[i].hd, shapes[i].bs, seqs, 6, 2, 1000 + i, &worst,
                             &ok);
        CHECK(ok, "shape %zu: failed, non-finite or non-zero padding output (%s)", i, rd_errmsg());
        CHECK(worst < 2e-5, "shape %zu (heads %d/%d, hd %d, block %d): max error %.3g vs the double reference", i,
              shapes[i].nh, shapes[i].nkv, shapes[i].hd, shapes[i].bs, worst);
        /* Batch invariance: sequence 2 (257 tokens, 1 row) alone, with
         * another seed for everything else, gives the same bits. The
         * reference values of its row depend only on its own K/V. */
        const int32_t nhd = shapes[i].nh * shapes[i].hd;
        /* its row index in the big step: 3 + 37 */
        float want[2048];
        memcpy(want, o + (size_t)40 * nhd, sizeof(float) * nhd);
        free(o);
        /* Rebuild the same sequence alone: attn_case draws the same values
         * for it only if it is drawn in the same order, so run the full set
         * with sequence order kept and padding changed instead. */
        float *o2 = attn_case(shapes[i].nh, shapes[i].nkv, shapes[i].hd, shapes[i].bs, seqs, 6, 7, 1000 + i, &worst,
                              &ok);
        CHECK(ok && o2, "shape %zu with more padding failed", i);
        int same = !memcmp(want, o2 + (size_t)40 * nhd, sizeof(float) * nhd);
        free(o2);
        CHECK(same, "shape %zu: a row's output changed with the batch's padding", i);
    }
}

/* The combine inside the partition kernel (the last CTA of a row and KV head
 * folds the partitions; the default) against k_attn_combine
 * (RD_CUDA_ATTN_FUSE=0): the same bits, with several partitions and CTAs per
 * row, padding rows, a sliding window and the fp8 cache's reads. And against
 * session 30's schedule (RD_CUDA_ATTN_V0=1: other CTA counts per row, keys
 * loaded one at a time): the same bits. */
static void test_attention_combine_fused(void)
{
    rd_backend *sep = dev_with("RD_CUDA_ATTN_FUSE", "0", NULL, NULL), *fused = emu;
    rd_backend *v0 = dev_with("RD_CUDA_ATTN_V0", "1", NULL, NULL);
    CHECK(sep != NULL && v0 != NULL, "cannot create a backend with RD_CUDA_ATTN_FUSE=0 or RD_CUDA_ATTN_V0=1: %s",
          rd_errmsg());
    struct {
        int32_t nh, nkv, hd, bs, window;
    } cases[] = {{9, 3, 64, 16, 0}, {16, 1, 8, 7, 0}, {8, 2, 32, 16, 300}, {4, 4, 128, 16, 0}};
    const seq_spec many[] = {{600, 3}, {37, 37}, {257, 1}, {1, 1}, {1100, 2}, {513, 1}};
    const seq_spec one[] = {{1100, 1}}; /* one decode row: several CTAs share its partitions */
    for (size_t i = 0; i < sizeof cases / sizeof cases[0] && !test_case_failed; i++)
      for (int single = 0; single < 2 && !test_case_failed; single++) {
        const seq_spec *seqs = single ? one : many;
        const int32_t ns = single ? 1 : 6, pad = single ? 0 : 3;
        const attn_opts opt = {cases[i].window, NULL, 0};
        double w1, w2;
        int ok1, ok2;
        emu = fused;
        float *o1 = attn_case_opt(cases[i].nh, cases[i].nkv, cases[i].hd, cases[i].bs, seqs, ns, pad, 77 + i, &opt, &w1, &ok1);
        emu = sep;
        float *o2 = attn_case_opt(cases[i].nh, cases[i].nkv, cases[i].hd, cases[i].bs, seqs, ns, pad, 77 + i, &opt, &w2, &ok2);
        emu = fused;
        int32_t M = pad;
        for (int32_t k = 0; k < ns; k++)
            M += seqs[k].new_rows;
        CHECK(ok1 && ok2 && o1 && o2, "case %zu failed (%s)", i, rd_errmsg());
        if (o1 && o2)
            CHECK(!memcmp(o1, o2, sizeof(float) * (size_t)M * cases[i].nh * cases[i].hd),
                  "case %zu%s: the fused combine differs from k_attn_combine", i, single ? " (one row)" : "");
        /* session 30's schedule: fewer CTAs per (row, kv head), one key per load */
        double w3;
        int ok3;
        emu = v0;
        float *o3 = attn_case_opt(cases[i].nh, cases[i].nkv, cases[i].hd, cases[i].bs, seqs, ns, pad, 77 + i, &opt, &w3, &ok3);
        emu = fused;
        CHECK(ok3 && o3, "case %zu (RD_CUDA_ATTN_V0) failed (%s)", i, rd_errmsg());
        if (o1 && o3)
            CHECK(!memcmp(o1, o3, sizeof(float) * (size_t)M * cases[i].nh * cases[i].hd),
                  "case %zu%s: RD_CUDA_ATTN_V0's schedule differs", i, single ? " (one row)" : "");
        free(o1), free(o2), free(o3);
      }
    emu = fused;
    if (sep)
        rd_backend_destroy(sep);
    if (v0)
        rd_backend_destroy(v0);
}

/* Same sequence alone vs among others (values drawn per sequence). */
static void test_attention_alone_vs_batched(void)
{
    const int32_t nh = 9, nkv = 3, hd = 64, bs = 16;
    const seq_spec solo[] = {{300, 1}};
    const seq_spec many[] = {{300, 1}, {40, 40}, {700, 2}, {1, 1}};
    double w1, w2;
    int ok1, ok2;
    float *a = attn_case(nh, nkv, hd, bs, solo, 1, 0, 77, &w1, &ok1);
    float *b = attn_case(nh, nkv, hd, bs, many, 4, 5, 77, &w2, &ok2);
    CHECK(ok1 && ok2 && a && b, "cases failed");
    int same = !memcmp(a, b, sizeof(float) * nh * hd);
    free(a), free(b);
    CHECK(same, "the first sequence's row differs alone vs in a batch of 4 with padding");
    CHECK(w1 < 2e-5 && w2 < 2e-5, "errors %.3g %.3g", w1, w2);
}

/* Sliding windows (Gemma 3: 512 on five layers of six): a row at position p
 * sees keys p-W+1 .. p. For Gemma 3 270m's heads (4 query heads on 1 KV head
 * of 256) and 8/2 heads of 128, windows 1, 7, 16, 512 and 300 (two
 * partitions, the second partial), over prefill rows (from position 0, and
 * the last 3 of 600) and decode rows (at 300, 512 and 0), contexts shorter
 * and longer than the window: every row against the double reference with
 * the keys before all windows NaN in the cache (reading one poisons the row);
 * then each sequence alone, a decode row at the position of a prefill row,
 * and (W >= context) the same row without a window: bit-identical. */
static void test_attention_window(void)
{
    const struct {
        int32_t nh, nkv, hd, bs;
    } shapes[] = {{4, 1, 256, 16}, {8, 2, 128, 16}};
    const int32_t windows[] = {1, 7, 16, 512, 300};
    const seq_spec seqs[] = {{600, 3}, {37, 37}, {5, 5}, {513, 1}, {300, 1}, {1, 1}};
    const int32_t keys[] = {0, 1, 2, 3, 4, 5};
    const int32_t ns = 6, pad = 2;
    int32_t first_row[7] = {0};
    for (int32_t s = 0; s < ns; s++)
        first_row[s + 1] = first_row[s] + seqs[s].new_rows;
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        double shape_worst = 0;
        for (size_t wi = 0; wi < sizeof windows / sizeof windows[0]; wi++) {
            const int32_t nh = shapes[si].nh, nkv = shapes[si].nkv, hd = shapes[si].hd, bs = shapes[si].bs;
            const int32_t W = windows[wi], nhd = nh * hd;
            const uint64_t seed = 500 + si;
            attn_opts o = {W, keys, 1};
            double worst;
            int ok;
            float *all = attn_case_opt(nh, nkv, hd, bs, seqs, ns, pad, seed, &o, &worst, &ok);
            CHECK(ok && all, "heads %d/%d hd %d W %d: failed or non-zero padding (%s)", nh, nkv, hd, W, rd_errmsg());
            CHECK(worst < 2e-5, "heads %d/%d hd %d W %d: max error %.3g vs the double reference (NaN: a key outside "
                  "the window was read)", nh, nkv, hd, W, worst);
            shape_worst = worse(shape_worst, worst);
            /* each sequence alone (no padding, NaN outside its windows) */
            for (int32_t s = 0; s < ns; s++) {
                if (light && s != 0 && s != 3)
                    continue;
                attn_opts os = {W, &keys[s], 1};
                float *one = attn_case_opt(nh, nkv, hd, bs, &seqs[s], 1, 0, seed, &os, &worst, &ok);
                CHECK(ok && one, "W %d: sequence %d alone failed", W, s);
                int same = !memcmp(one, all + (size_t)first_row[s] * nhd, sizeof(float) * seqs[s].new_rows * nhd);
                free(one);
                CHECK(same, "heads %d/%d hd %d W %d: sequence %d (context %d, %d rows) alone differs from the batch",
                      nh, nkv, hd, W, s, seqs[s].ctx, seqs[s].new_rows);
            }
            /* a decode row at 599 = the last prefill row of sequence 0 */
            const seq_spec dec = {600, 1};
            float *one = attn_case_opt(nh, nkv, hd, bs, &dec, 1, 3, seed, &o, &worst, &ok);
            CHECK(ok && one, "W %d: decode row failed", W);
            int same = !memcmp(one, all + (size_t)(first_row[1] - 1) * nhd, sizeof(float) * nhd);
            free(one);
            CHECK(same, "heads %d/%d hd %d W %d: a decode row at 599 differs from the prefill row at 599", nh, nkv, hd,
                  W);
            /* W >= the context (300 keys): the same bits as no window */
            if (W >= 300) {
                attn_opts on = {0, &keys[4], 0};
                one = attn_case_opt(nh, nkv, hd, bs, &seqs[4], 1, 0, seed, &on, &worst, &ok);
                CHECK(ok && one, "no window: failed");
                same = !memcmp(one, all + (size_t)first_row[4] * nhd, sizeof(float) * nhd);
                free(one);
                CHECK(same, "heads %d/%d hd %d: W %d over a context of 300 differs from no window", nh, nkv, hd, W);
            }
            free(all);
        }
        printf("# attention %d/%d heads, hd %d, windows 1, 7, 16, 512, 300: max |error| %.3g vs the double "
               "reference; alone = batched, decode = prefill, W >= context = no window, bit for bit\n",
               shapes[si].nh, shapes[si].nkv, shapes[si].hd, shape_worst);
    }
}

/* Paged attention on the emulated backend vs the CPU backend, for the head
 * sizes of Qwen3 (128) and Gemma 3 (256): the whole context goes through
 * kv_write in one step (K and V rounded to bf16 first, so the CPU's fp32
 * cache and the device's bf16 one hold the same values), then the last rows
 * of each sequence attend in a second step, their q rows strided as in q|k|v.
 * The two backends differ only in summation order and partitioning. */
static rd_backend *cpu_kvbf16;  /* the CPU backend with kv_dtype bf16 */

static rd_backend *emu_fp8;     /* the emulated backend with kv_dtype fp8 */

/* One (token, kv head) vector of hd values as the fp8 cache holds it, by
 * quant_fp8.c's host functions (the device's are cuda_math.h's): the least
 * e in [-117, 7] with max|x| <= 448 x 2^e, codes of x / 2^e; scale byte
 * e + 127, or 0xff for a non-finite vector. Writes codes[hd], returns the
 * scale byte; vals (may be NULL) gets the values the cache means. */
static uint8_t fp8_head_ref(const float *x, int32_t hd, uint8_t *codes, float *vals)
{
    float amax = 0.0f;
    int finite = 1;
    for (int32_t d = 0; d < hd; d++) {
        finite &= isfinite(x[d]) != 0;
        amax = fabsf(x[d]) > amax ? fabsf(x[d]) : amax;
    }
    if (!finite) {
        for (int32_t d = 0; d < hd; d++) {
            codes[d] = 0;
            if (vals)
                vals[d] = NAN;
        }
        return 0xff;
    }
    int e = 0;
    if (amax > 0.0f) {
        int ex;
        float f = frexpf(amax, &ex);
        e = ex - 9 + (f > 0.875f);
        e = e < -117 ? -117 : e > 7 ? 7 : e;
    }
    for (int32_t d = 0; d < hd; d++) {
        codes[d] = rd_fp8_e4m3_from_f32(ldexpf(x[d], -e));
        if (vals)
            vals[d] = ldexpf(rd_fp8_e4m3_to_f32(codes[d]), e);
    }
    return (uint8_t)(e + 127);
}

/* raw: K/V of any float, stored by each backend as bf16 (the CPU with
 * kv_dtype bf16); else values already bf16, so the f32 CPU cache holds them.
 * raw 2: the device is emu_fp8 and gets the raw values; the CPU (f32 cache)
 * gets them rounded per (token, head) as the fp8 cache rounds them. */
static void attn_vs_cpu_case_kv(int32_t nh, int32_t nkv, int32_t hd, int32_t window, int raw, double *worst_out)
{
    const int32_t bs = 16, ns = 4;
    const seq_spec sp[4] = {{300, 2}, {37, 37}, {1, 1}, {513, 1}}; /* 2 and 3 partitions of 256 keys */
    const int32_t qdim = (nh + 2 * nkv) * hd;
    int32_t ma = 0, mb = 0, maxb = 0, n_blocks = 0;
    for (int32_t s = 0; s < ns; s++) {
        ma += sp[s].ctx;
        mb += sp[s].new_rows;
        int32_t nbk = (sp[s].ctx + bs - 1) / bs;
        maxb = nbk > maxb ? nbk : maxb;
        n_blocks += nbk;
    }
    int32_t *tables = calloc((size_t)ns * maxb, sizeof(int32_t));
    int32_t *tok = malloc(sizeof(int32_t) * ma), *pos = malloc(sizeof(int32_t) * ma), *slot = malloc(sizeof(int32_t) * ma);
    int32_t qs_a[5], qs_b[5], ctx[4];
    float *kv = malloc(sizeof(float) * ma * qdim), *q = malloc(sizeof(float) * mb * qdim);
    int32_t next = 0, ra = 0, rb = 0;
    for (int32_t s = 0; s < ns; s++) {
        int32_t nbk = (sp[s].ctx + bs - 1) / bs;
        for (int32_t b = 0; b < nbk; b++) /* blocks in reverse order: the tables matter */
            tables[s * maxb + b] = n_blocks - 1 - next++;
        ctx[s] = sp[s].ctx;
        qs_a[s] = ra;
        qs_b[s] = rb;
        for (int32_t t = 0; t < sp[s].ctx; t++, ra++) {
            tok[ra] = 1;
            pos[ra] = t;
            slot[ra] = tables[s * maxb + t / bs] * bs + t % bs;
            for (int32_t i = 0; i < qdim; i++)
                kv[(size_t)ra * qdim + i] = raw ? hval(7, s, t, i) * 1.37f : bf(hval(7, s, t, i));
            if (t >= sp[s].ctx - sp[s].new_rows) {
                for (int32_t i = 0; i < qdim; i++)
                    q[(size_t)rb * qdim + i] = i < nh * hd ? hval(8, s, t, i) : NAN; /* K|V columns: unread */
                rb++;
            }
        }
    }
    qs_a[ns] = ra;
    qs_b[ns] = rb;
    /* step B: the rows of step A at the last new_rows positions of each sequence */
    int32_t *pos_b = malloc(sizeof(int32_t) * mb), *slot_b = malloc(sizeof(int32_t) * mb);
    for (int32_t s = 0, r = 0; s < ns; s++)
        for (int32_t t = sp[s].ctx - sp[s].new_rows; t < sp[s].ctx; t++, r++) {
            pos_b[r] = t;
            slot_b[r] = tables[s * maxb + t / bs] * bs + t % bs;
        }
    rd_step st_a = {ma, ns, maxb, tok, pos, slot, qs_a, ctx, tables, NULL};
    rd_step st_b = {mb, ns, maxb, tok, pos_b, slot_b, qs_b, ctx, tables, NULL};
    rd_attn_shape a = {nh, nkv, hd, bs, (float)(1.0 / sqrt((double)hd)), window};
    const size_t no = (size_t)mb * nh * hd;
    float *out[2];
    rd_backend *bes[2] = {raw == 1 ? cpu_kvbf16 : cpu, raw == 2 ? emu_fp8 : emu};
    float *kv_cpu = kv;
    if (raw == 2) {
        kv_cpu = malloc(sizeof(float) * ma * qdim);
        memcpy(kv_cpu, kv, sizeof(float) * ma * qdim);
        uint8_t codes[512];
        for (int32_t r = 0; r < ma; r++)
            for (int32_t h = 0; h < 2 * nkv; h++) {
                float *x = kv_cpu + (size_t)r * qdim + (size_t)(nh + h) * hd;
                fp8_head_ref(x, hd, codes, x);
            }
    }
    for (int k = 0; k < 2; k++) {
        rd_backend *be = bes[k];
        const size_t cache = (size_t)n_blocks * (size_t)rd_backend_kv_block_bytes(be, nkv, bs, hd);
        float *dkv = up(be, k ? kv : kv_cpu, sizeof(float) * ma * qdim), *dq = up(be, q, sizeof(float) * mb * qdim);
        float *dk = up(be, NULL, cache), *dv = up(be, NULL, cache), *dout = up(be, NULL, sizeof(float) * no);
        rd_step_dev sd;
        out[k] = malloc(sizeof(float) * no);
        CHECK_OK(be->ops->step_upload(be, &st_a, &sd));
        be->ops->kv_write(be, &a, dkv + nh * hd, dkv + (nh + nkv) * hd, qdim, &sd, dk, dv);
        CHECK_OK(be->ops->sync(be));
        CHECK_OK(be->ops->step_upload(be, &st_b, &sd));
        be->ops->attention(be, &a, dq, qdim, &sd, dk, dv, dout);
        CHECK_OK(down(be, out[k], dout, sizeof(float) * no));
        be->ops->free(be, dkv), be->ops->free(be, dq), be->ops->free(be, dk), be->ops->free(be, dv);
        be->ops->free(be, dout);
    }
    double worst = 0;
    for (size_t i = 0; i < no; i++) {
        double d = fabs((double)out[0][i] - out[1][i]);
        worst = worse(worst, d);
    }
    *worst_out = worst;
    free(out[0]), free(out[1]);
    if (kv_cpu != kv)
        free(kv_cpu);
    free(tables), free(tok), free(pos), free(slot), free(kv), free(q), free(pos_b), free(slot_b);
}

static void attn_vs_cpu_case(int32_t nh, int32_t nkv, int32_t hd, int32_t window, double *worst_out)
{
    attn_vs_cpu_case_kv(nh, nkv, hd, window, 0, worst_out);
}

/* kv_dtype: the CPU backend's bf16 cache rounds K/V as the CUDA backend's
 * does, so the two agree on values that are not bf16 to begin with; CUDA
 * takes "bf16" and "auto" and refuses the types it does not store. */
static void test_attention_vs_cpu_kv_bf16(void)
{
    CHECK(rd_backend_kv_elem_bytes(cpu_kvbf16) == 2 && rd_backend_kv_elem_bytes(emu) == 2, "element bytes");
    CHECK(rd_backend_set_kv_dtype(emu, "bf16") == 0 && rd_backend_set_kv_dtype(emu, "auto") == 0, "%s",
          rd_errmsg());
    CHECK(rd_backend_set_kv_dtype(emu, "f32") == RD_ENOTSUP && strstr(rd_errmsg(), "bf16"), "%s", rd_errmsg());
    CHECK(rd_backend_set_kv_dtype(emu, "f16") == RD_ENOTSUP, "f16 on CUDA");
    const struct {
        int32_t nh, nkv, hd, window;
    } shapes[] = {{8, 2, 128, 0}, {6, 1, 128, 0}, {4, 1, 256, 7}, {8, 2, 128, 512}};
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        double worst = 0, worst_f32cpu = 0;
        attn_vs_cpu_case_kv(shapes[i].nh, shapes[i].nkv, shapes[i].hd, shapes[i].window, 1, &worst);
        if (test_case_failed)
            return;
        /* The same inputs against the f32 CPU cache differ by the rounding. */
        rd_backend *keep = cpu_kvbf16;
        cpu_kvbf16 = cpu;
        attn_vs_cpu_case_kv(shapes[i].nh, shapes[i].nkv, shapes[i].hd, shapes[i].window, 1, &worst_f32cpu);
        cpu_kvbf16 = keep;
        if (test_case_failed)
            return;
        printf("# attention %d/%d heads, hd %d, window %d, unrounded K/V: emulated CUDA vs CPU kv bf16 max |diff| "
               "%.3g (vs CPU kv f32 %.3g)\n", shapes[i].nh, shapes[i].nkv, shapes[i].hd, shapes[i].window, worst,
               worst_f32cpu);
        CHECK(worst < 1e-5 && worst_f32cpu > 1e-4, "heads %d/%d, hd %d: %.3g vs the bf16 CPU cache, %.3g vs f32",
              shapes[i].nh, shapes[i].nkv, shapes[i].hd, worst, worst_f32cpu);
    }
}

/* kv_dtype fp8 on the device: the cache's bytes (codes and scale bytes, in
 * the block layout of cuda_kernels.cu) equal quant_fp8.c's rounding of each
 * (token, kv head) vector, through the fused-RoPE path's replacement (a
 * pending RoPE settles first) and with a NaN head, a zero head, tiny and
 * saturating values; copy_blocks copies whole FP8 blocks; and attention over
 * the FP8 cache equals the CPU's over an f32 cache holding the same values
 * (rounded on the host) up to summation order, for Qwen3's and Gemma 3's head
 * sizes. The CPU refuses fp8. */
static void test_kv_fp8(void)
{
    CHECK(rd_backend_kv_elem_bytes(emu_fp8) == 1 && emu_fp8->ops->kv_scale_bytes == 1 &&
          rd_backend_kv_block_bytes(emu_fp8, 2, 16, 64) == 2 * 16 * 65 && emu->ops->kv_scale_bytes == 0,
          "fp8 element and block bytes");
    enum { NKV = 3, HD = 40, BS = 8, NB = 3, M = 5 };   /* hd not a multiple of 32: lanes with two and one */
    const int32_t stride = 3 * NKV * HD;
    float *x = malloc(sizeof(float) * M * stride);
    for (int32_t r = 0; r < M; r++)
        for (int32_t c = 0; c < stride; c++)
            x[r * stride + c] = hval(31, r, c, 0) * (r == 1 ? 1e-36f : r == 2 ? 3e5f : 2.5f);
    for (int32_t d = 0; d < HD; d++)
        x[3 * stride + 2 * NKV * HD + d] = 0.0f;        /* row 3: V head 0 all zero */
    x[4 * stride + NKV * HD + HD + 7] = NAN;            /* row 4: K head 1 has a NaN */
    int32_t slots[M] = {3, 17, 0, 9, 22}, tok[M] = {1, 1, 1, 1, 1}, pos[M] = {0, 1, 2, 3, 4};
    int32_t qs[2] = {0, M}, ctx[1] = {M}, tab[NB] = {0, 1, 2};
    rd_step st = {M, 1, NB, tok, pos, slots, qs, ctx, tab, NULL};
    rd_attn_shape a = {NKV, NKV, HD, BS, 1.0f, 0};
    const int64_t bb = rd_backend_kv_block_bytes(emu_fp8, NKV, BS, HD);
    uint8_t *kc = malloc((size_t)(NB * bb)), *vc = malloc((size_t)(NB * bb));
    float *dx = up(emu_fp8, x, sizeof(float) * M * stride);
    uint8_t *dk = up(emu_fp8, NULL, (size_t)(NB * bb)), *dv = up(emu_fp8, NULL, (size_t)(NB * bb));
    rd_step_dev sd;
    CHECK_OK(emu_fp8->ops->step_upload(emu_fp8, &st, &sd));
    emu_fp8->ops->kv_write(emu_fp8, &a, dx + NKV * HD, dx + 2 * NKV * HD, stride, &sd, (float *)dk, (float *)dv);
    CHECK_OK(down(emu_fp8, kc, dk, (size_t)(NB * bb)));
    CHECK_OK(down(emu_fp8, vc, dv, (size_t)(NB * bb)));
    uint8_t want[HD];
    for (int32_t r = 0; r < M && !test_case_failed; r++)
        for (int32_t kvv = 0; kvv < 2; kvv++)
            for (int32_t h = 0; h < NKV; h++) {
                const uint8_t *cache = kvv ? vc : kc;
                const int32_t blk = slots[r] / BS, t = slots[r] % BS;
                uint8_t sb = fp8_head_ref(x + r * stride + (1 + kvv) * NKV * HD + h * HD, HD, want, NULL);
                const uint8_t *got = cache + blk * bb + ((int64_t)h * BS + t) * HD;
                const uint8_t gsb = cache[blk * bb + (int64_t)NKV * BS * HD + h * BS + t];
                CHECK(gsb == sb && !memcmp(got, want, HD), "row %d %s head %d: scale byte %u (want %u), codes %s",
                      r, kvv ? "V" : "K", h, gsb, sb, memcmp(got, want, HD) ? "differ" : "equal");
            }
    CHECK(kc[(slots[4] / BS) * bb + (int64_t)NKV * BS * HD + 1 * BS + slots[4] % BS] == 0xff, "the NaN head's scale");
    CHECK(kc[(slots[1] / BS) * bb + (int64_t)NKV * BS * HD + slots[1] % BS] == 127 - 117, "the tiny head's clamp");
    CHECK(vc[(slots[3] / BS) * bb + (int64_t)NKV * BS * HD + slots[3] % BS] == 127, "the zero head's scale");
    /* copy_blocks: block 2 onto block 0 (an FP8 block is not a multiple of 16 bytes here). */
    int32_t src[1] = {2}, dst[1] = {0};
    int32_t *dsrc = up(emu_fp8, src, sizeof src), *ddst = up(emu_fp8, dst, sizeof dst);
    emu_fp8->ops->copy_blocks(emu_fp8, &a, (float *)dk, (float *)dv, dsrc, ddst, 1);
    uint8_t *kc2 = malloc((size_t)(NB * bb)), *vc2 = malloc((size_t)(NB * bb));
    CHECK_OK(down(emu_fp8, kc2, dk, (size_t)(NB * bb)));
    CHECK_OK(down(emu_fp8, vc2, dv, (size_t)(NB * bb)));
    CHECK(bb % 16 != 0 && !memcmp(kc2, kc + 2 * bb, (size_t)bb) && !memcmp(vc2, vc + 2 * bb, (size_t)bb) &&
          !memcmp(kc2 + bb, kc + bb, (size_t)(2 * bb)), "copy_blocks of fp8 blocks");
    emu_fp8->ops->free(emu_fp8, dx), emu_fp8->ops->free(emu_fp8, dk), emu_fp8->ops->free(emu_fp8, dv);
    emu_fp8->ops->free(emu_fp8, dsrc), emu_fp8->ops->free(emu_fp8, ddst);
    free(x), free(kc), free(vc), free(kc2), free(vc2);
    if (test_case_failed)
        return;
    const struct {
        int32_t nh, nkv, hd, window;
    } shapes[] = {{8, 2, 128, 0}, {4, 1, 256, 7}, {6, 2, 64, 0}};
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        double worst = 0;
        attn_vs_cpu_case_kv(shapes[i].nh, shapes[i].nkv, shapes[i].hd, shapes[i].window, 2, &worst);
        if (test_case_failed)
            return;
        printf("# attention %d/%d heads, hd %d, window %d: emulated CUDA, fp8 cache, vs CPU on the same values: "
               "max |diff| %.3g\n", shapes[i].nh, shapes[i].nkv, shapes[i].hd, shapes[i].window, worst);
        CHECK(worst < 1e-5, "heads %d/%d, hd %d: %.3g", shapes[i].nh, shapes[i].nkv, shapes[i].hd, worst);
    }
}

static void test_attention_vs_cpu(void)
{
    const struct {
        int32_t nh, nkv, hd;
    } shapes[] = {{8, 2, 128} /* Qwen3-4B's group of 4 */, {16, 1, 128}, {8, 2, 256}, {8, 1, 256}, {6, 1, 128}};
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        double worst = 0;
        attn_vs_cpu_case(shapes[i].nh, shapes[i].nkv, shapes[i].hd, 0, &worst);
        if (test_case_failed)
            return;
        printf("# attention %d/%d heads, hd %d: emulated CUDA vs CPU max |diff| %.3g\n", shapes[i].nh, shapes[i].nkv,
               shapes[i].hd, worst);
        CHECK(worst < 1e-5, "heads %d/%d, hd %d: attention differs from the CPU by %.3g", shapes[i].nh, shapes[i].nkv,
              shapes[i].hd, worst);
    }
    /* sliding windows: Gemma 3 270m's heads and 8/2 of 128 */
    const int32_t windows[] = {1, 7, 16, 512};
    for (int si = 0; si < 2; si++)
        for (size_t wi = 0; wi < sizeof windows / sizeof windows[0]; wi++) {
            const int32_t nh = si ? 8 : 4, nkv = si ? 2 : 1, hd = si ? 128 : 256;
            double worst = 0;
            attn_vs_cpu_case(nh, nkv, hd, windows[wi], &worst);
            if (test_case_failed)
                return;
            printf("# attention %d/%d heads, hd %d, window %d: emulated CUDA vs CPU max |diff| %.3g\n", nh, nkv, hd,
                   windows[wi], worst);
            CHECK(worst < 1e-5, "heads %d/%d, hd %d, window %d: attention differs from the CPU by %.3g", nh, nkv, hd,
                  windows[wi], worst);
        }
}

/* ------------------------------------------------------------------ Gemma 3's layer */

/* Gemma 3 270m's attention (4 query heads, 1 KV head of 256, scale 1/16) on
 * a narrow model: hidden 64, FFN 96, 2 layers, the first local (window 8,
 * RoPE base 1e4) and the second global (base 1e6), both read by the ops in
 * the order the runner calls them. */
#define GL_H 64
#define GL_NH 4
#define GL_NKV 1
#define GL_HD 256
#define GL_S ((GL_NH + 2 * GL_NKV) * GL_HD)
#define GL_F 96
#define GL_V 40
#define GL_BS 16
#define GL_L 2
#define GL_POS 32
#define GL_BLOCKS 6
#define GL_ROWS 32

typedef struct {
    float *w[4];                /* qkv [S][H], o [H][NH*HD], gate|up [2F][H], down [H][F] */
    float *norm[6];             /* attn, q, k, post_attn, ffn, post_ffw */
    float *cs;                  /* RoPE table [GL_POS][HD/2][2] */
    int32_t window;
} gl_host_layer;

typedef struct {
    rd_backend *be;
    void *embed, *w[GL_L][4];
    float *norm[GL_L][6], *cs[GL_L], *kc[GL_L], *vc[GL_L];
    float *x, *xn, *qkv, *att, *tmp, *normed, *gu, *act;
} gl_model;

static const int32_t gl_dims[4][2] = {{GL_S, GL_H}, {GL_H, GL_NH * GL_HD}, {2 * GL_F, GL_H}, {GL_H, GL_F}};
static const int32_t gl_norm_n[6] = {GL_H, GL_HD, GL_HD, GL_H, GL_H, GL_H};

static int gl_load(rd_backend *be, const float *emb, const gl_host_layer *hl, gl_model *m)
{
    memset(m, 0, sizeof *m);
    m->be = be;
    int rc = be->ops->linear_load(be, emb, GL_V, GL_H, &m->embed);
    const size_t cache = (size_t)GL_BLOCKS * GL_NKV * GL_BS * GL_HD * rd_backend_kv_elem_bytes(be);
    for (int l = 0; l < GL_L && !rc; l++) {
        for (int k = 0; k < 4 && !rc; k++)
            rc = be->ops->linear_load(be, hl[l].w[k], gl_dims[k][0], gl_dims[k][1], &m->w[l][k]);
        for (int k = 0; k < 6; k++)
            m->norm[l][k] = up(be, hl[l].norm[k], sizeof(float) * gl_norm_n[k]);
        m->cs[l] = up(be, hl[l].cs, sizeof(float) * GL_POS * GL_HD);
        m->kc[l] = up(be, NULL, cache);
        m->vc[l] = up(be, NULL, cache);
    }
    m->x = up(be, NULL, sizeof(float) * GL_ROWS * GL_H);
    m->xn = up(be, NULL, sizeof(float) * GL_ROWS * GL_H);
    m->qkv = up(be, NULL, sizeof(float) * GL_ROWS * GL_S);
    m->att = up(be, NULL, sizeof(float) * GL_ROWS * GL_NH * GL_HD);
    m->tmp = up(be, NULL, sizeof(float) * GL_ROWS * GL_H);
    m->normed = up(be, NULL, sizeof(float) * GL_ROWS * GL_H);
    m->gu = up(be, NULL, sizeof(float) * GL_ROWS * 2 * GL_F);
    m->act = up(be, NULL, sizeof(float) * GL_ROWS * GL_F);
    return rc;
}

static void gl_free(gl_model *m)
{
    rd_backend *be = m->be;
    be->ops->linear_free(be, m->embed);
    for (int l = 0; l < GL_L; l++) {
        for (int k = 0; k < 4; k++)
            be->ops->linear_free(be, m->w[l][k]);
        for (int k = 0; k < 6; k++)
            be->ops->free(be, m->norm[l][k]);
        be->ops->free(be, m->cs[l]), be->ops->free(be, m->kc[l]), be->ops->free(be, m->vc[l]);
    }
    float *bufs[8] = {m->x, m->xn, m->qkv, m->att, m->tmp, m->normed, m->gu, m->act};
    for (int i = 0; i < 8; i++)
        be->ops->free(be, bufs[i]);
}

/* The step's forward pass up to the last layer's output (in m->x), as the
 * Gemma 3 runner calls the ops. */
static void gl_forward(gl_model *m, const rd_step_dev *sd, const int32_t *windows)
{
    rd_backend *be = m->be;
    const rd_backend_ops *o = be->ops;
    const int32_t M = sd->n_rows;
    const float eps = 1e-6f;
    o->embed(be, m->embed, sd->token_ids, M, sqrtf((float)GL_H), m->x);
    for (int l = 0; l < GL_L; l++) {
        rd_attn_shape a = {GL_NH, GL_NKV, GL_HD, GL_BS, 1.0f / 16.0f, windows[l]};
        o->rmsnorm(be, m->x, m->norm[l][0], M, GL_H, eps, 1.0f, m->xn);
        o->linear(be, m->w[l][0], m->xn, M, m->qkv, 0);
        o->head_rmsnorm(be, m->qkv, GL_S, M, GL_NH, GL_HD, m->norm[l][1], eps, 1.0f);
        o->head_rmsnorm(be, m->qkv + GL_NH * GL_HD, GL_S, M, GL_NKV, GL_HD, m->norm[l][2], eps, 1.0f);
        o->rope(be, m->qkv, GL_S, M, GL_NH + GL_NKV, GL_HD, sd->positions, m->cs[l]);
        o->kv_write(be, &a, m->qkv + GL_NH * GL_HD, m->qkv + (GL_NH + GL_NKV) * GL_HD, GL_S, sd, m->kc[l], m->vc[l]);
        o->attention(be, &a, m->qkv, GL_S, sd, m->kc[l], m->vc[l], m->att);
        o->linear(be, m->w[l][1], m->att, M, m->tmp, 0);
        o->rmsnorm_add(be, m->tmp, m->norm[l][3], M, GL_H, eps, 1.0f, m->normed, m->x);
        o->rmsnorm(be, m->x, m->norm[l][4], M, GL_H, eps, 1.0f, m->xn);
        o->linear(be, m->w[l][2], m->xn, M, m->gu, 0);
        o->geglu(be, m->gu, M, GL_F, m->act);
        o->linear(be, m->w[l][3], m->act, M, m->tmp, 0);
        o->rmsnorm_add(be, m->tmp, m->norm[l][5], M, GL_H, eps, 1.0f, m->normed, m->x);
    }
}

/* Two steps of two sequences: a prefill (11 and 20 tokens from position 0)
 * and a decode row each (at 11 and 20), on backend be. out_a/out_b get the
 * last layer's output of each step; *kernels the launches of the decode step
 * (emulated backends); with graphs, the decode step is then captured and
 * replayed and must give the eager bits. */
static void gl_run(rd_backend *be, const float *emb, const gl_host_layer *hl, float *out_a, float *out_b,
                   uint64_t *kernels, int graphs)
{
    static const int32_t lens[2] = {11, 20}, tab[2][2] = {{4, 1}, {0, 5}};
    int32_t tok[GL_ROWS], pos[GL_ROWS], slot[GL_ROWS], qs[3], ctx[2], windows[GL_L];
    for (int l = 0; l < GL_L; l++)
        windows[l] = hl[l].window;
    gl_model m;
    CHECK_OK(gl_load(be, emb, hl, &m));
    /* step A: prefill */
    int32_t M = 0;
    for (int s = 0; s < 2; s++) {
        qs[s] = M;
        ctx[s] = lens[s];
        for (int32_t p = 0; p < lens[s]; p++, M++) {
            tok[M] = (int32_t)((s * 17 + p * 7 + 3) % GL_V);
            pos[M] = p;
            slot[M] = tab[s][p / GL_BS] * GL_BS + p % GL_BS;
        }
    }
    qs[2] = M;
    rd_step st = {M, 2, 2, tok, pos, slot, qs, ctx, &tab[0][0], NULL};
    rd_step_dev sd;
    CHECK_OK(be->ops->step_upload(be, &st, &sd));
    gl_forward(&m, &sd, windows);
    CHECK_OK(down(be, out_a, m.x, sizeof(float) * M * GL_H));
    /* step B: a decode row each */
    for (int s = 0; s < 2; s++) {
        tok[s] = (int32_t)((s * 5 + 11) % GL_V);
        pos[s] = lens[s];
        slot[s] = tab[s][lens[s] / GL_BS] * GL_BS + lens[s] % GL_BS;
        qs[s] = s;
        ctx[s] = lens[s] + 1;
    }
    qs[2] = 2;
    rd_step sb = {2, 2, 2, tok, pos, slot, qs, ctx, &tab[0][0], NULL};
    CHECK_OK(be->ops->step_upload(be, &sb, &sd));
    CHECK_OK(be->ops->sync(be));
    const uint64_t k0 = cuemu_launch_count();
    gl_forward(&m, &sd, windows);
    CHECK_OK(be->ops->sync(be));
    *kernels = cuemu_launch_count() - k0;
    CHECK_OK(down(be, out_b, m.x, sizeof(float) * 2 * GL_H));
    if (graphs) {
        void *g;
        float got[2 * GL_H];
        CHECK_OK(be->ops->graph_begin(be));
        gl_forward(&m, &sd, windows);
        CHECK_OK(be->ops->graph_end(be, &g));
        for (int i = 0; i < 2 * GL_H; i++)
            got[i] = NAN;
        be->ops->h2d(be, m.x, got, sizeof got);
        CHECK_OK(be->ops->graph_launch(be, g));
        CHECK_OK(down(be, got, m.x, sizeof got));
        be->ops->graph_free(be, g);
        CHECK(!memcmp(got, out_b, sizeof got), "a graph replay of the decode step differs from the eager step");
    }
    gl_free(&m);
}

/* Gemma 3's layer recipe on the emulated backend against the CPU backend
 * (which gets the same bf16-rounded weights): split activations within 1e-2
 * of the CPU (relative to the largest output), bf16 within 3e-2 (measured:
 * 4.0e-3 and 8.7e-3, mostly the bf16 KV cache: with |q| = |k| = 16 after
 * the per-head norms of 256, a key's rounding moves its score by ~0.03; a
 * CPU given bf16 K and V is within 6e-4 of the split run); the fused
 * split sums and RoPE + KV write bit-identical to RD_CUDA_FUSE=0; a captured
 * decode step replays the eager bits; a decode step is the embedding (with
 * its scale) and per layer 11 kernels (the RMSNorm, the four GEMMs, the q/k
 * norms with RoPE and the KV write, attention, the two post-norms with their
 * adds, the FFN norm, GeGLU), 18 with RD_CUDA_FUSE=0, 5 in tc mode (the
 * q|k|v GEMM with its prologue and head norms, attention, o with the post-
 * attention norm and add, gate|up with its prologue and GeGLU, down with the
 * post-FFN norm and add). */
static void test_gemma_layer(void)
{
    float *emb = malloc(sizeof(float) * GL_V * GL_H);
    gl_host_layer hl[GL_L];
    for (int32_t i = 0; i < GL_V * GL_H; i++)
        emb[i] = bf(frand() * 0.1f);
    for (int l = 0; l < GL_L; l++) {
        for (int k = 0; k < 4; k++) {
            const int32_t n = gl_dims[k][0] * gl_dims[k][1];
            const float sc = 1.5f / sqrtf((float)gl_dims[k][1]);
            hl[l].w[k] = malloc(sizeof(float) * n);
            for (int32_t i = 0; i < n; i++)
                hl[l].w[k][i] = bf(frand() * sc);
        }
        for (int k = 0; k < 6; k++) {
            hl[l].norm[k] = malloc(sizeof(float) * gl_norm_n[k]);
            fill_gemma_norm(hl[l].norm[k], gl_norm_n[k]);
        }
        hl[l].window = l == 0 ? 8 : 0;
        const double base = l == 0 ? 1e4 : 1e6;
        hl[l].cs = malloc(sizeof(float) * GL_POS * GL_HD);
        for (int32_t p = 0; p < GL_POS; p++)
            for (int32_t i = 0; i < GL_HD / 2; i++) {
                double ang = p * pow(base, -2.0 * i / GL_HD);
                hl[l].cs[(p * GL_HD / 2 + i) * 2] = (float)cos(ang);
                hl[l].cs[(p * GL_HD / 2 + i) * 2 + 1] = (float)sin(ang);
            }
    }
    rd_backend *nofuse = NULL;
    setenv("RD_CUDA_FUSE", "0", 1);
    int rc = rd_backend_create(dev_name(), 1, &nofuse);
    unsetenv("RD_CUDA_FUSE");
    CHECK_OK(rc);
    /* tc: the q|k|v GEMM with its norm, the q/k norms, RoPE and KV write; attention; o; the post-attention
       norm with the residual add; gate|up with the FFN norm and GeGLU; down; the post-FFN norm with the add */
    rd_backend *tc = dev_with("RD_CUDA_GEMM", "tc", NULL, NULL), *tcnf = dev_with("RD_CUDA_GEMM", "tc", "RD_CUDA_FUSE", "0");
    CHECK(tc && tcnf, "cannot create the tc backends: %s", rd_errmsg());
    struct {
        rd_backend *be;
        const char *name;
        double tol;
        int graphs;
        uint64_t want_kernels; /* 0: not counted */
    } runs[6] = {{cpu, "cpu", 0, 0, 0}, {emu, "split", 1e-2, 1, 1 + 11 * GL_L},
                 {nofuse, "RD_CUDA_FUSE=0", 1e-2, 0, 1 + 18 * GL_L}, {emu_bf16, "bf16", 3e-2, 1, 1 + 11 * GL_L},
                 {tc, "tc", 1e-2, 1, 1 + 5 * GL_L}, {tcnf, "tc RD_CUDA_FUSE=0", 1e-2, 0, 0}};
    const size_t na = (size_t)31 * GL_H, nb = (size_t)2 * GL_H;
    float *xa[6], *xb[6];
    for (int r = 0; r < 6; r++) {
        xa[r] = malloc(sizeof(float) * na);
        xb[r] = malloc(sizeof(float) * nb);
        uint64_t kernels = 0;
        gl_run(runs[r].be, emb, hl, xa[r], xb[r], &kernels, runs[r].graphs);
        if (test_case_failed)
            break;
        if (r == 0)
            continue;
        double worst = 0, mag = 0;
        for (size_t i = 0; i < na + nb; i++) {
            const float c = i < na ? xa[0][i] : xb[0][i - na], e = i < na ? xa[r][i] : xb[r][i - na];
            worst = worse(worst, fabs((double)c - e));
            mag = fabs(c) > mag ? fabs(c) : mag;
        }
        printf("# Gemma 3 layers (%s): prefill and decode outputs vs the CPU: max |diff| %.3g (max |x| %.3g); a decode "
               "step is %llu kernels (%d layers)\n", runs[r].name, worst, mag, (unsigned long long)kernels, GL_L);
        CHECK(worst <= runs[r].tol * mag, "%s: the layers differ from the CPU by %.3g (max |x| %.3g)", runs[r].name,
              worst, mag);
        CHECK(!on_emulator() || !runs[r].want_kernels || kernels == runs[r].want_kernels,
              "%s: a decode step took %llu kernels (want %llu)", runs[r].name, (unsigned long long)kernels,
              (unsigned long long)runs[r].want_kernels);
    }
    if (!test_case_failed)
        CHECK(!memcmp(xa[1], xa[2], sizeof(float) * na) && !memcmp(xb[1], xb[2], sizeof(float) * nb),
              "the fused split sums and RoPE + KV write differ from RD_CUDA_FUSE=0");
    if (!test_case_failed)
        CHECK(!memcmp(xa[4], xa[5], sizeof(float) * na) && !memcmp(xb[4], xb[5], sizeof(float) * nb),
              "tc: the fused norms, epilogues and norm + add differ from RD_CUDA_FUSE=0");
    for (int r = 0; r < 6; r++)
        free(xa[r]), free(xb[r]);
    rd_backend_destroy(nofuse);
    if (tc)
        rd_backend_destroy(tc);
    if (tcnf)
        rd_backend_destroy(tcnf);
    for (int l = 0; l < GL_L; l++) {
        for (int k = 0; k < 4; k++)
            free(hl[l].w[k]);
        for (int k = 0; k < 6; k++)
            free(hl[l].norm[k]);
        free(hl[l].cs);
    }
    free(emb);
}

static void test_copy_blocks(void)
{
    rd_attn_shape a = {4, 2, 16, 8, 0.25f, 0};
    const int32_t nb = 6;
    const size_t per = (size_t)a.n_kv_heads * a.block_size * a.head_dim, n = per * nb;
    uint16_t *k = malloc(2 * n), *v = malloc(2 * n), *k2 = malloc(2 * n), *v2 = malloc(2 * n);
    for (size_t i = 0; i < n; i++)
        k[i] = (uint16_t)rnd(), v[i] = (uint16_t)rnd();
    int32_t src[2] = {1, 4}, dst[2] = {3, 0};
    float *dk = up(emu, k, 2 * n), *dv = up(emu, v, 2 * n);
    int32_t *ds = up(emu, src, sizeof src), *dd = up(emu, dst, sizeof dst);
    emu->ops->copy_blocks(emu, &a, dk, dv, ds, dd, 2);
    CHECK_OK(down(emu, k2, dk, 2 * n));
    CHECK_OK(down(emu, v2, dv, 2 * n));
    for (int i = 0; i < 2; i++) {
        memcpy(k + dst[i] * per, k + src[i] * per, 2 * per);
        memcpy(v + dst[i] * per, v + src[i] * per, 2 * per);
    }
    int same = !memcmp(k, k2, 2 * n) && !memcmp(v, v2, 2 * n);
    emu->ops->free(emu, dk), emu->ops->free(emu, dv), emu->ops->free(emu, ds), emu->ops->free(emu, dd);
    free(k), free(v), free(k2), free(v2);
    CHECK(same, "copy_blocks");
}

/* ------------------------------------------------------------------ sampler */

static int sample_cmp(const samp_params *sp, const float *logits, int32_t V, uint32_t idx, uint32_t pos,
                      char *why, size_t cap)
{
    void *scratch = malloc(samp_scratch_bytes(V));
    samp_result want, got;
    int rc_cpu = samp_sample(sp, logits, V, idx, pos, scratch, &want);
    free(scratch);
    float *dl = up(emu, logits, sizeof(float) * V);
    rd_sample_req q = {0, idx, pos, sp, NULL, 0, 0, 0};
    int rc = emu->ops->sample(emu, dl, V, &q, 1, &got);
    emu->ops->free(emu, dl);
    if (rc) {
        snprintf(why, cap, "device sample failed: %s", rd_errmsg());
        return 0;
    }
    if (rc_cpu) {
        if (got.token != -1) {
            snprintf(why, cap, "CPU rejects the logits (%d) but the device chose %d", rc_cpu, got.token);
            return 0;
        }
        return 1;
    }
    if (got.token != want.token) {
        snprintf(why, cap, "T %g k %d p %g minp %g seed %llu idx %u pos %u: token %d vs CPU %d", sp->temperature,
                 sp->top_k, sp->top_p, sp->min_p, (unsigned long long)sp->seed, idx, pos, got.token, want.token);
        return 0;
    }
    if (fabsf(got.logprob - want.logprob) > 2e-6f * (1.0f + fabsf(want.logprob))) {
        snprintf(why, cap, "logprob %.9g vs CPU %.9g", got.logprob, want.logprob);
        return 0;
    }
    if (sp->processed_logprobs &&
        !(fabsf(got.logprob_processed - want.logprob_processed) <= 1e-5f * (1.0f + fabsf(want.logprob_processed)))) {
        snprintf(why, cap, "processed logprob %.9g vs CPU %.9g", got.logprob_processed, want.logprob_processed);
        return 0;
    }
    if (got.n_top != want.n_top) {
        snprintf(why, cap, "n_top %d vs %d", got.n_top, want.n_top);
        return 0;
    }
    for (int j = 0; j < want.n_top; j++)
        if (got.top_ids[j] != want.top_ids[j] ||
            fabsf(got.top_logprobs[j] - want.top_logprobs[j]) > 2e-6f * (1.0f + fabsf(want.top_logprobs[j]))) {
            snprintf(why, cap, "alternative %d: %d %.9g vs %d %.9g", j, got.top_ids[j], got.top_logprobs[j],
                     want.top_ids[j], want.top_logprobs[j]);
            return 0;
        }
    return 1;
}

static void test_sampler(void)
{
    const int32_t vocabs[] = {1, 3, 1000, 4099};
    char why[300];
    for (size_t vi = 0; vi < sizeof vocabs / sizeof vocabs[0]; vi++) {
        const int32_t V = vocabs[vi];
        float *l = malloc(sizeof(float) * V);
        for (int dist = 0; dist < 4; dist++) {
            for (int32_t i = 0; i < V; i++) {
                float x = frand() * 4.0f;
                if (dist == 1)
                    x = roundf(x * 2.0f) / 2.0f;            /* many ties */
                if (dist == 2 && i % 7 == 3 && V > 1)
                    x = -INFINITY;                          /* masked tokens */
                if (dist == 3)
                    x = i == V / 2 ? 12.0f : frand() - 8.0f; /* peaked */
                l[i] = x;
            }
            struct {
                float t;
                int32_t k;
                float p, minp;
                int lp;
            } ps[] = {{0, 0, 1, 0, 5},    {1, 0, 1, 0, 0},     {0.7f, 0, 1, 0, 3}, {1, 5, 1, 0, 0},
                      {1.3f, 50, 1, 0, 0}, {1, 0, 0.9f, 0, 2}, {0.8f, 0, 0.5f, 0, 0}, {1, 20, 0.8f, 0, 0},
                      {1, 0, 1, 0.05f, 0}, {0.5f, 7, 0.95f, 0.1f, 20}, {1, 1, 1, 0, 0}, {2.0f, 0, 0.999f, 0, 0}};
            for (size_t pi = 0; pi < sizeof ps / sizeof ps[0]; pi++) {
                samp_params sp = samp_default();
                sp.temperature = ps[pi].t;
                sp.top_k = ps[pi].k;
                sp.top_p = ps[pi].p;
                sp.min_p = ps[pi].minp;
                sp.logprobs_topk = ps[pi].lp;
                sp.processed_logprobs = 1;
                const int search = ps[pi].p < 1.0f || ps[pi].k > 0; /* key searches: 8-16 rounds of launches */
                if (search && V > 1000 && light)
                    continue;
                int draws = search ? 2 : 5;
                for (int d = 0; d < draws; d++) {
                    sp.seed = rnd();
                    uint32_t idx = (uint32_t)(rnd() % 8), pos = (uint32_t)(rnd() % 5000);
                    int ok = sample_cmp(&sp, l, V, idx, pos, why, sizeof why);
                    CHECK(ok, "vocab %d dist %d params %zu: %s", V, dist, pi, why);
                }
            }
        }
        free(l);
    }
    /* rejected logits */
    float bad[5] = {0, 1, NAN, 2, 3}, inf[3] = {0, INFINITY, 1}, masked[3] = {-INFINITY, -INFINITY, -INFINITY};
    samp_params sp = samp_default();
    CHECK(sample_cmp(&sp, bad, 5, 0, 0, why, sizeof why), "NaN: %s", why);
    CHECK(sample_cmp(&sp, inf, 3, 0, 0, why, sizeof why), "+inf: %s", why);
    CHECK(sample_cmp(&sp, masked, 3, 0, 0, why, sizeof why), "all masked: %s", why);
}

/* Many draws at temperature 1: the device picks the CPU's token every time. */
static void test_sampler_many_draws(void)
{
    const int32_t V = 2000;
    float *l = malloc(sizeof(float) * V);
    for (int32_t i = 0; i < V; i++)
        l[i] = frand() * 2.0f;
    const int32_t N = 64;
    float *dl = up(emu, l, sizeof(float) * V);
    samp_params sp = samp_default();
    sp.seed = 4242;
    rd_sample_req q[64];
    samp_result got[64];
    for (int32_t i = 0; i < N; i++)
        q[i] = (rd_sample_req){0, (uint32_t)(i % 4), (uint32_t)(i * 13), &sp, NULL, 0, 0, 0};
    CHECK_OK(emu->ops->sample(emu, dl, V, q, N, got));
    void *scratch = malloc(samp_scratch_bytes(V));
    int mism = 0;
    for (int32_t i = 0; i < N; i++) {
        samp_result want;
        samp_sample(&sp, l, V, q[i].sample_idx, q[i].pos, scratch, &want);
        mism += want.token != got[i].token;
    }
    free(scratch);
    free(l);
    emu->ops->free(emu, dl);
    CHECK(mism == 0, "%d of %d draws differ from the CPU sampler", mism, N);
}

/* The tiled sampler over rows of several tiles (20000 tokens: 9 whole tiles of 2048 and one of 1568), many
 * requests in one call: greedy with 20 alternatives, temperatures with and without min-p, top-k and top-p cuts
 * (drawn by the one-CTA kernel after the tiles, in the same call), scores with and without the processed log-prob,
 * wanted log-probs. Each result is samp_sample's / samp_score's (token, rank and alternative ids equal, log-probs
 * within sample_cmp's tolerance), and bit for bit the same request's result when it is sampled alone (the sums'
 * order depends on the vocabulary, never on the batch). The call runs twice (the arrival counters start from zero
 * again). With RD_CUDA_SAMPLE=cta the same requests go through the one-CTA kernel. */
static int lp_near(float got, float want, float tol)
{
    return got == want || fabsf(got - want) <= tol * (1.0f + fabsf(want)); /* equal covers -inf (masked) */
}

static void sampler_tiled_case(rd_backend *be, const char *label)
{
    const int32_t V = 20000, R = 3, N = 36;
    float *l = malloc(sizeof(float) * (size_t)R * V);
    for (int32_t r = 0; r < R; r++)
        for (int32_t i = 0; i < V; i++) {
            float x = frand() * 3.0f;
            if (r == 1)
                x = roundf(x * 4.0f) / 4.0f;        /* ties across tiles */
            if (r == 2 && i % 5 == 1)
                x = -INFINITY;                      /* masked */
            if (r == 2 && i == V - 3)
                x = 9.0f;                           /* the max in the last, short tile */
            l[(size_t)r * V + i] = x;
        }
    float *dl = up(be, l, sizeof(float) * (size_t)R * V);
    samp_params sp[9];
    for (int k = 0; k < 9; k++) {
        sp[k] = samp_default();
        sp[k].seed = 500 + (uint64_t)k;
        sp[k].processed_logprobs = 1;
    }
    static const int32_t want_ids[3] = {0, 19999, 4096};
    sp[0].temperature = 0, sp[0].logprobs_topk = 20, sp[0].n_want = 3, sp[0].want_ids = want_ids;
    sp[1].logprobs_topk = 2;
    sp[2].temperature = 0.6f, sp[2].min_p = 0.2f;
    sp[3].temperature = 1.4f, sp[3].logprobs_topk = 5;
    sp[4].top_k = 40, sp[4].logprobs_topk = 1;
    sp[5].top_p = 0.85f, sp[5].temperature = 0.9f;
    sp[6].temperature = 0.8f, sp[6].n_want = 2, sp[6].want_ids = want_ids + 1;
    sp[7].top_k = 100, sp[7].top_p = 0.7f, sp[7].temperature = 1.1f, sp[7].min_p = 0.01f; /* both searches */
    sp[8].top_k = 17000, sp[8].top_p = 0.95f; /* row 2 has 16000 finite tokens: no top-k cut there */
    rd_sample_req q[36];
    for (int32_t i = 0; i < N; i++) {
        q[i] = (rd_sample_req){i % R, (uint32_t)(i % 4), (uint32_t)(7 * i + 1), &sp[i % 9], NULL, 0, 0, 0};
        if (i >= 27) { /* scores: of token i * 701, and with(out) the processed log-prob */
            q[i].score = 1;
            q[i].score_token = (i * 701) % V;
            q[i].sp = &sp[i % 3 == 0 ? 7 : i % 2 ? 2 : 1]; /* sp[7]: with both cuts */
        }
    }
    samp_result got[36], again[36], alone;
    CHECK_OK(be->ops->sample(be, dl, V, q, N, got));
    CHECK_OK(be->ops->sample(be, dl, V, q, N, again));
    void *scratch = malloc(samp_scratch_bytes(V));
    int cut_draws = 0;
    for (int32_t i = 0; i < N && !test_case_failed; i++) {
        const float *x = l + (size_t)q[i].row * V;
        samp_result want;
        if (q[i].score)
            CHECK_OK(samp_score(q[i].sp, x, V, q[i].score_token, scratch, &want));
        else
            CHECK_OK(samp_sample(q[i].sp, x, V, q[i].sample_idx, q[i].pos, scratch, &want));
        const samp_result *g = &got[i];
        cut_draws += !q[i].score && (q[i].sp->top_k > 0 || q[i].sp->top_p < 1.0f);
        CHECK(g->token == want.token, "%s request %d: token %d vs the CPU's %d", label, i, g->token, want.token);
        CHECK(lp_near(g->logprob, want.logprob, 2e-6f), "%s request %d: log-prob %.9g vs %.9g", label, i, g->logprob,
              want.logprob);
        if (isfinite(want.logprob_processed))
            CHECK(fabsf(g->logprob_processed - want.logprob_processed) <=
                      1e-5f * (1.0f + fabsf(want.logprob_processed)),
                  "%s request %d: processed %.9g vs %.9g", label, i, g->logprob_processed, want.logprob_processed);
        else
            CHECK(isnan(want.logprob_processed) ? isnan(g->logprob_processed)
                                                : g->logprob_processed == want.logprob_processed,
                  "%s request %d: processed %.9g vs %.9g", label, i, g->logprob_processed, want.logprob_processed);
        CHECK(g->n_top == want.n_top, "%s request %d: %d alternatives vs %d", label, i, g->n_top, want.n_top);
        for (int32_t j = 0; j < want.n_top; j++)
            CHECK(g->top_ids[j] == want.top_ids[j] && lp_near(g->top_logprobs[j], want.top_logprobs[j], 2e-6f),
                  "%s request %d alternative %d: %d %.9g vs %d %.9g", label, i, j, g->top_ids[j], g->top_logprobs[j],
                  want.top_ids[j], want.top_logprobs[j]);
        if (q[i].score)
            CHECK(g->rank == want.rank, "%s request %d: rank %d vs %d", label, i, g->rank, want.rank);
        for (int32_t j = 0; j < q[i].sp->n_want; j++)
            CHECK(lp_near(g->want_lps[j], want.want_lps[j], 2e-6f),
                  "%s request %d want %d: %.9g vs %.9g", label, i, j, g->want_lps[j], want.want_lps[j]);
        /* the batch does not matter: the call again, and the request alone */
        CHECK_OK(be->ops->sample(be, dl, V, &q[i], 1, &alone));
        const int same_alone = alone.token == g->token && fbits(alone.logprob) == fbits(g->logprob) &&
                               !memcmp(&alone.logprob_processed, &g->logprob_processed, sizeof(float)) &&
                               alone.n_top == g->n_top && alone.rank == g->rank &&
                               !memcmp(alone.top_ids, g->top_ids, sizeof(int32_t) * (size_t)g->n_top) &&
                               !memcmp(alone.top_logprobs, g->top_logprobs, sizeof(float) * (size_t)g->n_top) &&
                               !memcmp(alone.want_lps, g->want_lps, sizeof(float) * (size_t)q[i].sp->n_want);
        CHECK(same_alone && !memcmp(&again[i], g, sizeof *g),
              "%s request %d: alone or again, another result (token %d vs %d, log-prob %.9g vs %.9g)", label, i,
              alone.token, g->token, alone.logprob, g->logprob);
    }
    CHECK(cut_draws == 12, "%d draws through a cut", cut_draws);
    free(scratch);
    free(l);
    be->ops->free(be, dl);
}

static void test_sampler_tiled(void)
{
    sampler_tiled_case(emu, "tiled");
    if (test_case_failed)
        return;
    rd_backend *cta = dev_with("RD_CUDA_SAMPLE", "cta", NULL, NULL);
    CHECK(cta != NULL, "RD_CUDA_SAMPLE=cta: %s", rd_errmsg());
    char desc[4096];
    CHECK_OK(cta->ops->describe(cta, desc, sizeof desc));
    CHECK(strstr(desc, "RD_CUDA_SAMPLE=cta") != NULL, "the one-CTA sampler's backend says: %.200s", desc);
    sampler_tiled_case(cta, "one CTA");
    rd_backend_destroy(cta);
}

/* Scoring requests (score set, issue 45): the device gives a scored token the raw log-prob and the
 * alternatives a draw of it has, bit for bit (the same kernel's steps), and samp_score's within
 * sample_cmp's tolerance; with score set nothing is drawn (the token is the one asked). */
static void test_sampler_score(void)
{
    const int32_t V = 3000, N = 24;
    float *l = malloc(sizeof(float) * V * 2);
    for (int32_t i = 0; i < 2 * V; i++)
        l[i] = frand() * 3.0f;
    float *dl = up(emu, l, sizeof(float) * V * 2);
    samp_params sp[4] = {samp_default(), samp_default(), samp_default(), samp_default()};
    sp[0].temperature = 0, sp[0].logprobs_topk = 3, sp[0].processed_logprobs = 1;
    sp[1].seed = 77, sp[1].logprobs_topk = 5;
    sp[2].temperature = 0.7f, sp[2].top_p = 0.8f, sp[2].seed = 78, sp[2].processed_logprobs = 1;
    sp[3].temperature = 1.1f, sp[3].top_k = 30, sp[3].min_p = 0.02f, sp[3].seed = 79, sp[3].processed_logprobs = 1;
    const int32_t asked[3] = {5, 2999, 1234};
    sp[1].n_want = 3, sp[1].want_ids = asked;
    rd_sample_req q[24], qs[24];
    samp_result drawn[24], scored[24];
    for (int32_t i = 0; i < N; i++)
        q[i] = (rd_sample_req){i % 2, (uint32_t)i, (uint32_t)(5 * i), &sp[i % 4], NULL, 0, 0, 0};
    CHECK_OK(emu->ops->sample(emu, dl, V, q, N, drawn));
    for (int32_t i = 0; i < N; i++) {
        qs[i] = q[i];
        qs[i].score = 1;
        /* odd requests score another token than the one drawn: any token can be scored */
        qs[i].score_token = i % 4 == 3 ? (drawn[i].token + 17) % V : drawn[i].token;
    }
    CHECK_OK(emu->ops->sample(emu, dl, V, qs, N, scored));
    void *scratch = malloc(samp_scratch_bytes(V));
    for (int32_t i = 0; i < N; i++) {
        samp_result want;
        CHECK_OK(samp_score(qs[i].sp, l + (size_t)(i % 2) * V, V, qs[i].score_token, scratch, &want));
        CHECK(scored[i].token == qs[i].score_token, "request %d: token %d, asked %d", i, scored[i].token,
              qs[i].score_token);
        CHECK(fabsf(scored[i].logprob - want.logprob) <= 2e-6f * (1.0f + fabsf(want.logprob)),
              "request %d: device %.9g vs samp_score %.9g", i, scored[i].logprob, want.logprob);
        CHECK(scored[i].n_top == want.n_top, "request %d: %d alternatives vs %d", i, scored[i].n_top, want.n_top);
        for (int32_t j = 0; j < want.n_top; j++)
            CHECK(scored[i].top_ids[j] == want.top_ids[j], "request %d alternative %d", i, j);
        CHECK(scored[i].rank == want.rank, "request %d: rank %d vs samp_score's %d", i, scored[i].rank, want.rank);
        for (int32_t j = 0; j < qs[i].sp->n_want; j++) {
            CHECK(fabsf(scored[i].want_lps[j] - want.want_lps[j]) <= 2e-6f * (1.0f + fabsf(want.want_lps[j])),
                  "request %d: want %d: device %.9g vs samp_score %.9g", i, j, scored[i].want_lps[j],
                  want.want_lps[j]);
            CHECK(!memcmp(&scored[i].want_lps[j], &drawn[i].want_lps[j], sizeof(float)),
                  "request %d: want %d scored %.9g, drawn %.9g", i, j, scored[i].want_lps[j], drawn[i].want_lps[j]);
        }
        if (isnan(want.logprob_processed) || isinf(want.logprob_processed))
            CHECK(!memcmp(&scored[i].logprob_processed, &want.logprob_processed, sizeof(float)) ||
                      (isnan(want.logprob_processed) && isnan(scored[i].logprob_processed)),
                  "request %d: processed %.9g vs samp_score's %.9g", i, scored[i].logprob_processed,
                  want.logprob_processed);
        else
            CHECK(fabsf(scored[i].logprob_processed - want.logprob_processed) <=
                      2e-6f * (1.0f + fabsf(want.logprob_processed)),
                  "request %d: processed %.9g vs samp_score's %.9g", i, scored[i].logprob_processed,
                  want.logprob_processed);
        if (qs[i].score_token == drawn[i].token && qs[i].sp->processed_logprobs)
            CHECK(!memcmp(&scored[i].logprob_processed, &drawn[i].logprob_processed, sizeof(float)),
                  "request %d: processed scored %.9g, drawn %.9g: not the same bits", i,
                  scored[i].logprob_processed, drawn[i].logprob_processed);
        if (qs[i].score_token == drawn[i].token)
            CHECK(!memcmp(&scored[i].logprob, &drawn[i].logprob, sizeof(float)) &&
                      !memcmp(scored[i].top_logprobs, drawn[i].top_logprobs, sizeof(float) * (size_t)want.n_top),
                  "request %d: scored %.9g, drawn %.9g: not the same bits", i, scored[i].logprob, drawn[i].logprob);
    }
    free(scratch);
    free(l);
    emu->ops->free(emu, dl);
}

/* ------------------------------------------------------------------ sampler: logit edits */

/* One sample call of n requests over r rows of v logits, each request with
 * random logit edits (or none), against samp_apply_edits + samp_sample_ex
 * on the CPU: the same token, the raw log-prob and the alternatives bit for
 * bit (both come from the raw row, as samp_sample's), the processed log-prob
 * within sample_cmp's tolerance. *changed counts the edited requests whose
 * token differs from samp_sample's on the raw row (the edits mattered). */
static void edits_batch(int32_t V, int32_t R, int32_t N, int search, int *changed)
{
    struct {
        float t;
        int32_t k;
        float p, minp;
        int lp;
    } ps[] = {{0, 0, 1, 0, 5},       {1, 0, 1, 0, 3},         {0.7f, 0, 1, 0.05f, 0},  {0, 0, 1, 0, 0},
              {1.3f, 0, 1, 0, 2},    {1, 5, 1, 0, 2},         {0.8f, 0, 0.9f, 0, 0},   {1.2f, 40, 0.8f, 0.02f, 4}};
    const int n_ps = search ? 8 : 5;
    const float reps[] = {1.0f, 1.25f, 0.8f, 2.0f, 0.5f};
    float *l = malloc(sizeof(float) * (size_t)R * V);
    for (int32_t r = 0; r < R; r++)
        for (int32_t i = 0; i < V; i++) {
            float x = frand() * 4.0f;                 /* both signs */
            if (r % 3 == 1)
                x = roundf(x * 2.0f) / 2.0f;          /* ties, zeros */
            if (r % 3 == 2 && i % 11 == 5)
                x = -INFINITY;                        /* already masked */
            l[(size_t)r * V + i] = x;
        }
    samp_params *sp = malloc(sizeof *sp * N);
    samp_edit **ed = malloc(sizeof *ed * N);
    rd_sample_req *q = malloc(sizeof *q * N);
    samp_result *got = malloc(sizeof *got * N);
    uint8_t *used = malloc((size_t)V);
    for (int32_t i = 0; i < N; i++) {
        const int pi = i % n_ps;
        sp[i] = samp_default();
        sp[i].temperature = ps[pi].t;
        sp[i].top_k = ps[pi].k;
        sp[i].top_p = ps[pi].p;
        sp[i].min_p = ps[pi].minp;
        sp[i].logprobs_topk = ps[pi].lp;
        sp[i].processed_logprobs = 1;
        sp[i].seed = rnd();
        sp[i].repetition_penalty = reps[rnd() % 5];
        sp[i].frequency_penalty = rnd() % 3 ? frand() * 2.0f : 0.0f;
        sp[i].presence_penalty = rnd() % 3 ? frand() * 2.0f : 0.0f;
        const int32_t row = i % R;
        const float *x = l + (size_t)row * V;
        /* every fourth request has no edits (it must be samp_sample's draw);
         * the others edit up to 64 distinct tokens, often the argmax */
        int32_t n_ed = i % 4 == 3 ? 0 : 1 + (int32_t)(rnd() % (V < 64 ? (uint64_t)V : 64));
        ed[i] = n_ed ? malloc(sizeof(samp_edit) * n_ed) : NULL;
        memset(used, 0, (size_t)V);
        int32_t amax = 0;
        for (int32_t j = 1; j < V; j++)
            amax = x[j] > x[amax] ? j : amax;
        for (int32_t j = 0; j < n_ed; j++) {
            int32_t tok = j == 0 && rnd() % 2 ? amax : (int32_t)(rnd() % (uint64_t)V);
            while (used[tok])
                tok = (tok + 1) % V;
            used[tok] = 1;
            samp_edit *e = &ed[i][j];
            memset(e, 0, sizeof *e);
            e->token = tok;
            e->bias = rnd() % 2 ? frand() * 6.0f : 0.0f;
            e->mask = rnd() % 8 == 0;
            e->seen = rnd() % 2;
            e->n_out = rnd() % 3 ? 0 : (int32_t)(rnd() % 4);
        }
        q[i] = (rd_sample_req){row, (uint32_t)(rnd() % 8), (uint32_t)(rnd() % 5000), &sp[i], ed[i], n_ed, 0, 0};
    }
    float *dl = up(emu, l, sizeof(float) * (size_t)R * V);
    int rc = emu->ops->sample(emu, dl, V, q, N, got);
    emu->ops->free(emu, dl);
    CHECK_OK(rc);
    void *scratch = malloc(samp_scratch_bytes(V));
    float *proc = malloc(sizeof(float) * V);
    for (int32_t i = 0; i < N; i++) {
        const float *x = l + (size_t)q[i].row * V;
        samp_result want, plain;
        samp_apply_edits(&sp[i], x, V, ed[i], q[i].n_edits, proc);
        int rc_cpu = samp_sample_ex(&sp[i], x, q[i].n_edits ? proc : NULL, V, q[i].sample_idx, q[i].pos, scratch,
                                    &want);
        CHECK_OK(samp_sample(&sp[i], x, V, q[i].sample_idx, q[i].pos, scratch, &plain));
        const samp_result *g = &got[i];
        CHECK(!rc_cpu, "vocab %d request %d: the CPU rejects its edited row: %s", V, i, rd_errmsg());
        *changed += q[i].n_edits && plain.token != want.token;
        CHECK(g->token == want.token, "vocab %d request %d (T %g k %d p %g minp %g, %d edits): token %d vs CPU %d", V,
              i, sp[i].temperature, sp[i].top_k, sp[i].top_p, sp[i].min_p, q[i].n_edits, g->token, want.token);
        CHECK(fbits(g->logprob) == fbits(want.logprob), "vocab %d request %d: raw logprob %.9g vs CPU %.9g", V, i,
              g->logprob, want.logprob);
        CHECK(fabsf(g->logprob_processed - want.logprob_processed) <= 1e-5f * (1.0f + fabsf(want.logprob_processed)),
              "vocab %d request %d: processed logprob %.9g vs CPU %.9g", V, i, g->logprob_processed,
              want.logprob_processed);
        CHECK(g->n_top == want.n_top, "vocab %d request %d: n_top %d vs %d", V, i, g->n_top, want.n_top);
        for (int j = 0; j < want.n_top; j++)
            CHECK(g->top_ids[j] == want.top_ids[j] && fbits(g->top_logprobs[j]) == fbits(want.top_logprobs[j]),
                  "vocab %d request %d alternative %d: %d %.9g vs CPU %d %.9g", V, i, j, g->top_ids[j],
                  g->top_logprobs[j], want.top_ids[j], want.top_logprobs[j]);
    }
    for (int32_t i = 0; i < N; i++)
        free(ed[i]);
    free(scratch), free(proc), free(used), free(l), free(sp), free(ed), free(q), free(got);
}

static void test_sampler_edits(void)
{
    /* the device's edited logit is samp_edit_logit's, bit for bit (host side
     * of cuda_math.h; the device build is the same expression) */
    const float xs[] = {0.0f, -0.0f, 1.5f, -1.5f, 3e38f, -3e38f, 1e-40f, -INFINITY};
    for (int k = 0; k < 20000; k++) {
        samp_params p = samp_default();
        p.repetition_penalty = k % 7 == 0 ? 1e-30f : (float)(0.05 + (rnd() % 1000) * 0.004);
        p.frequency_penalty = frand() * 2.0f;
        p.presence_penalty = frand() * 2.0f;
        samp_edit e = {(int32_t)(rnd() % 100), (int32_t)(rnd() % 5), (uint8_t)(rnd() % 2), (uint8_t)(rnd() % 9 == 0), 0,
                       rnd() % 2 ? frand() * 100.0f : 0.0f};
        const float x = k < 8 ? xs[k] : frand() * 50.0f;
        const float a = samp_edit_logit(x, &e, &p);
        const float b = cm_edit_logit(x, e.bias, e.mask, e.seen, e.n_out, p.repetition_penalty, p.frequency_penalty,
                                      p.presence_penalty);
        CHECK(fbits(a) == fbits(b), "x %.9g bias %g mask %d seen %d n_out %d: %.9g vs samp_edit_logit %.9g", x, e.bias,
              e.mask, e.seen, e.n_out, b, a);
    }
    int changed = 0;
    edits_batch(7, 3, 8, 1, &changed);       /* tiny vocab: edits cover most of it */
    if (test_case_failed)
        return;
    edits_batch(1000, 4, 24, 1, &changed);   /* every rule: greedy, top-k, top-p, min-p */
    if (test_case_failed)
        return;
    edits_batch(9000, 3, 10, 0, &changed);   /* past one edit CTA's span (8192), a larger proc buffer */
    if (test_case_failed)
        return;
    edits_batch(1000, 2, 5, 0, &changed);    /* the buffers again, smaller */
    if (test_case_failed)
        return;
    printf("# device logit edits: %d edited requests drew another token than without their edits\n", changed);
    CHECK(changed >= 5, "only %d edited requests drew another token: the edits hardly matter", changed);

    /* an edit that leaves no finite logit, or makes one +inf: the CPU rejects
     * the processed row, the device returns -1 for that request alone */
    float l[5] = {0.5f, -1.0f, 2.0f, 0.0f, 1.0f};
    samp_params sp = samp_default();
    samp_edit all[5], inf = {2, 0, 0, 0, 0, INFINITY}, one = {2, 0, 0, 1, 0, 0};
    for (int32_t i = 0; i < 5; i++)
        all[i] = (samp_edit){i, 0, 0, 1, 0, 0};
    rd_sample_req q[3] = {{0, 0, 0, &sp, all, 5, 0, 0}, {0, 0, 1, &sp, &inf, 1, 0, 0}, {0, 0, 2, &sp, &one, 1, 0, 0}};
    samp_result got[3], want;
    float proc[5];
    void *scratch = malloc(samp_scratch_bytes(5));
    float *dl = up(emu, l, sizeof l);
    int rc = emu->ops->sample(emu, dl, 5, q, 3, got);
    emu->ops->free(emu, dl);
    for (int i = 0; i < 2; i++) {
        samp_apply_edits(&sp, l, 5, q[i].edits, q[i].n_edits, proc);
        CHECK(samp_sample_ex(&sp, l, proc, 5, 0, q[i].pos, scratch, &want) != 0, "the CPU accepts edited row %d", i);
    }
    samp_apply_edits(&sp, l, 5, &one, 1, proc);
    CHECK_OK(samp_sample_ex(&sp, l, proc, 5, 0, 2, scratch, &want));
    free(scratch);
    CHECK_OK(rc);
    CHECK(got[0].token == -1 && got[1].token == -1, "rejected edited rows drew %d and %d", got[0].token,
          got[1].token);
    CHECK(got[2].token == want.token && want.token != 2 && fbits(got[2].logprob) == fbits(want.logprob),
          "the request beside them: %d (%.9g) vs CPU %d (%.9g)", got[2].token, got[2].logprob, want.token,
          want.logprob);
}

/* ------------------------------------------------------------------ the runner on tiny models */

typedef struct {
    rd_loaded l;
    int ok;
} model_slot;

static int load_model(const char *name, const char *backend, rd_loaded *l)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s.gguf", testdata(), name);
    struct stat sb;
    if (stat(path, &sb) != 0)
        return 0;
    return rd_load(path, backend, 2, l) == 0;
}

/* Prefills nseq sequences (lens[]), logits for every row, into out; sequence s's rows under LoRA slot
 * seq_lora[s] (NULL: no adapters). */
static int prefill_lora(runner *r, const int32_t *const *toks, const int32_t *lens, int32_t nseq,
                        const int32_t *base_block, int32_t from, const int32_t *seq_lora, float *out)
{
    const int32_t bs = r->attn.block_size;
    int32_t M = 0, maxb = 1;
    for (int32_t s = 0; s < nseq; s++) {
        M += lens[s] - from;
        maxb = (lens[s] + bs - 1) / bs > maxb ? (lens[s] + bs - 1) / bs : maxb;
    }
    int32_t tok[256], pos[256], slot[256], rows[256], qs[17], ctx[16], tab[16 * 32], lora[256];
    int32_t m = 0;
    for (int32_t s = 0; s < nseq; s++) {
        qs[s] = m;
        ctx[s] = lens[s];
        for (int32_t b = 0; b < maxb; b++)
            tab[s * maxb + b] = base_block[s] + b;
        for (int32_t p = from; p < lens[s]; p++, m++) {
            tok[m] = toks[s][p];
            pos[m] = p;
            slot[m] = (base_block[s] + p / bs) * bs + p % bs;
            rows[m] = m;
            lora[m] = seq_lora ? seq_lora[s] : -1;
        }
    }
    qs[nseq] = m;
    rd_step st = {M, nseq, maxb, tok, pos, slot, qs, ctx, tab, seq_lora ? lora : NULL};
    return runner_forward(r, &st, rows, M, out);
}

static int prefill(runner *r, const int32_t *const *toks, const int32_t *lens, int32_t nseq, const int32_t *base_block,
                   int32_t from, float *out)
{
    return prefill_lora(r, toks, lens, nseq, base_block, from, NULL, out);
}

/* One decode step of nb sequences (blocks of 16, sequence s's table base[s] ..
 * base[s] + 3), each appending tok[s] at its position cur[s], which it
 * advances; the arrays are the step's storage. */
static rd_step decode_step(int32_t nb, const int32_t *tok, int32_t *cur, const int32_t *base, int32_t *pos,
                           int32_t *slot, int32_t *qs, int32_t *ctx, int32_t *tab)
{
    for (int32_t s = 0; s < nb; s++) {
        pos[s] = cur[s];
        slot[s] = (base[s] + cur[s] / 16) * 16 + cur[s] % 16;
        qs[s] = s;
        ctx[s] = cur[s] + 1;
        for (int b = 0; b < 4; b++)
            tab[s * 4 + b] = base[s] + b;
        cur[s]++;
    }
    qs[nb] = nb;
    return (rd_step){nb, nb, 4, tok, pos, slot, qs, ctx, tab, NULL};
}

static void runner_case(const char *name, int split)
{
    /* The prompts come from a stream seeded by the case alone: the cases before it (which ones run, what
       they draw) must not decide whether its rows have the clear margins the argmax check needs. */
    rs = 0x853c49e6748fea9bull ^ (uint64_t)split;
    for (const char *p = name; *p; p++)
        rs = (rs ^ (uint8_t)*p) * 0x100000001b3ull;
    (void)rnd();
    rd_loaded lc, le, lnf;
    if (!split)
        setenv("RD_CUDA_ACT", "bf16", 1);
    int okc = load_model(name, "cpu", &lc), oke = okc && load_model(name, dev_name(), &le);
    setenv("RD_CUDA_FUSE", "0", 1); /* the split GEMMs' sums as kernels of their own */
    int oknf = oke && load_model(name, dev_name(), &lnf);
    unsetenv("RD_CUDA_FUSE");
    unsetenv("RD_CUDA_ACT");
    CHECK(okc && oke && oknf, "cannot load %s (run tests/gen_testdata.sh): %s", name, rd_errmsg());
    const model_config *c = &lc.m->cfg;
    const int32_t V = c->vocab, NS = 3;
    int32_t lens[3] = {14, 5, 23}, base[3] = {0, 4, 8}, t0[40], t1[40], t2[40];
    for (int i = 0; i < 40; i++)
        t0[i] = (int32_t)(rnd() % V), t1[i] = (int32_t)(rnd() % V), t2[i] = (int32_t)(rnd() % V);
    const int32_t *toks[3] = {t0, t1, t2};
    runner rcpu, re, rg, rnf;
    setenv("RD_GRAPHS", "0", 1);
    CHECK_OK(runner_init(&rcpu, lc.m, 16, 16, 64, 64));
    CHECK_OK(runner_init(&re, le.m, 16, 16, 64, 64));
    CHECK_OK(runner_init(&rnf, lnf.m, 16, 16, 64, 64));
    unsetenv("RD_GRAPHS");
    CHECK_OK(runner_init(&rg, le.m, 16, 16, 64, 64));
    CHECK(!rcpu.use_graphs && !re.use_graphs && rg.use_graphs, "graph switch");
    float *lcpu = malloc(sizeof(float) * 64 * V), *lemu = malloc(sizeof(float) * 64 * V);
    float *lgr = malloc(sizeof(float) * 64 * V), *tmp = malloc(sizeof(float) * 64 * V);
    /* prefill: CPU vs emulated CUDA */
    CHECK_OK(prefill(&rcpu, toks, lens, NS, base, 0, lcpu));
    CHECK_OK(prefill(&re, toks, lens, NS, base, 0, lemu));
    CHECK_OK(prefill(&rg, toks, lens, NS, base, 0, lgr));
    const int32_t M = 14 + 5 + 23;
    double worst = 0, scale = 0;
    int agree = 0;
    int clear = 0; /* rows whose CPU top-2 gap is wide enough that bf16 cannot swap them */
    for (int32_t r = 0; r < M; r++) {
        int32_t ac = 0, ae = 0;
        for (int32_t t = 0; t < V; t++) {
            double d = fabs(lcpu[r * V + t] - lemu[r * V + t]);
            worst = d > worst ? d : worst;
            scale = fabs(lcpu[r * V + t]) > scale ? fabs(lcpu[r * V + t]) : scale;
            if (lcpu[r * V + t] > lcpu[r * V + ac]) ac = t;
            if (lemu[r * V + t] > lemu[r * V + ae]) ae = t;
        }
        float second = -INFINITY;
        for (int32_t t = 0; t < V; t++)
            if (t != ac && lcpu[r * V + t] > second)
                second = lcpu[r * V + t];
        int wide = lcpu[r * V + ac] - second > 0.3f;
        clear += wide;
        agree += ac == ae || !wide;
    }
    printf("# %s%s: prefill logits, emulated CUDA vs CPU: max |diff| %.4g (max |logit| %.3g), argmax agrees on %d/%d "
           "rows (or is a near tie; %d with a clear margin)\n", name, split ? " (split activations)" : " (bf16 activations)",
           worst, scale, agree, M, clear);
    CHECK(worst <= 0.02 * (scale > 1 ? scale : 1), "%s: logits differ from the CPU by %.4g", name, worst);
    CHECK(agree == M && clear >= M / 2, "%s: argmax differs on %d rows with a clear CPU margin (%d clear rows)", name,
          M - agree, clear);
    CHECK(!memcmp(lemu, lgr, sizeof(float) * M * V), "prefill with and without graphs enabled differ");
    /* The split sums folded into RMSNorm, RoPE and SwiGLU, and the KV write into RoPE,
       give the bits of separate kernels. */
    CHECK_OK(prefill(&rnf, toks, lens, NS, base, 0, tmp));
    CHECK(!memcmp(lemu, tmp, sizeof(float) * M * V), "prefill with fused split sums differs from unfused");

    /* chunked prefill = one-step prefill, bitwise */
    int32_t from_lens[3] = {9, 3, 17};
    runner rch;
    setenv("RD_GRAPHS", "0", 1);
    CHECK_OK(runner_init(&rch, le.m, 16, 16, 64, 64));
    unsetenv("RD_GRAPHS");
    CHECK_OK(prefill(&rch, toks, from_lens, NS, base, 0, tmp));
    CHECK_OK(prefill(&rch, toks, lens, NS, base, 0, tmp)); /* recompute all rows over the cache */
    CHECK(!memcmp(tmp, lemu, sizeof(float) * M * V), "prefill over a warm cache differs");
    runner_free(&rch);

    /* decode: eager (re) vs graphs (rg), 6 steps, batch 3 then 2 then 3 */
    int32_t cur[3] = {lens[0], lens[1], lens[2]};
    for (int step = 0; step < 8; step++) {
        int32_t nb = step >= 3 && step < 5 ? 2 : 3;
        int32_t tok[3], pos[3], slot[3], rows[3] = {0, 1, 2}, qs[4], ctx[3], tab[3 * 4];
        for (int32_t s = 0; s < nb; s++)
            tok[s] = (int32_t)(rnd() % V);
        rd_step st = decode_step(nb, tok, cur, base, pos, slot, qs, ctx, tab);
        if (step == 6)
            le.m->weights_gen++; /* as after a weight swap: graphs are captured again */
        uint64_t k0 = cuemu_launch_count();
        CHECK_OK(runner_forward(&re, &st, rows, nb, lemu));
        if (step == 0) {
            /* Kernels per decode step: what a CUDA graph replays, and at batch 1 the
               step's cost floor (launch latency). 9 per layer (the split GEMMs'
               sums folded into the next kernel, the KV write into RoPE, attention's
               combine into its partition kernel) plus 6 for
               the embedding and head and 1 for the last layer's sum: a change that
               adds kernels fails here. */
            uint64_t k = cuemu_launch_count() - k0;
            const int32_t L = c->n_layers;
            /* Qwen2's bias is one kernel more per layer, Qwen3's q and k norms one (both heads' norms in one). */
            /* Gemma 3's layer is 12 (11 when head_dim is a multiple of 64: the q/k norms, RoPE and the KV
               write in one kernel): each post-norm adds its output to the residual stream (rmsnorm_add). */
            const int32_t per_layer = lc.m->layers[0].post_attn_norm ? 12
                                      : 9 + (lc.m->layers[0].qkv_bias ? 1 : 0) + (lc.m->layers[0].q_norm ? 1 : 0);
            printf("# %s%s: a decode step is %llu kernels (%d layers)\n", name, split ? "" : " (bf16 activations)",
                   (unsigned long long)k, L);
            CHECK(!on_emulator() || k <= (uint64_t)(per_layer * L + 7), "a decode step launches %llu kernels for %d layers",
                  (unsigned long long)k, L);
        }
        CHECK_OK(runner_forward(&rg, &st, rows, nb, lgr));
        CHECK(!memcmp(lemu, lgr, sizeof(float) * nb * V), "decode step %d: graph path differs from eager", step);
        CHECK_OK(runner_forward(&rnf, &st, rows, nb, tmp));
        CHECK(!memcmp(lemu, tmp, sizeof(float) * nb * V), "decode step %d: fused split sums differ", step);
        CHECK_OK(runner_forward(&rcpu, &st, rows, nb, lcpu));
        /* device sampling through the runner = samp_sample on the logits */
        samp_params sp = samp_default();
        sp.seed = 99 + step;
        sp.logprobs_topk = 3;
        rd_sample_req q[3];
        samp_result got[3], want;
        for (int32_t s = 0; s < nb; s++)
            q[s] = (rd_sample_req){s, (uint32_t)s, (uint32_t)pos[s], &sp, NULL, 0, 0, 0};
        CHECK_OK(runner_sample(&rg, q, nb, got));
        void *scratch = malloc(samp_scratch_bytes(V));
        for (int32_t s = 0; s < nb; s++) {
            samp_sample(&sp, lgr + (size_t)s * V, V, q[s].sample_idx, q[s].pos, scratch, &want);
            CHECK(want.token == got[s].token && fabsf(want.logprob - got[s].logprob) < 1e-5f,
                  "runner_sample row %d: %d (%g) vs %d (%g)", s, got[s].token, got[s].logprob, want.token,
                  want.logprob);
        }
        free(scratch);
        /* The same step again with its logits left on the device and async_forward: the
           forward returns with its work queued (no wait), the draw waits once and gives the
           same results. The step rewrites its K/V slots with the same values. */
        rg.async_forward = 1;
        const uint64_t w0 = cuemu_sync_count();
        CHECK_OK(runner_forward(&rg, &st, rows, nb, NULL));
        CHECK(rg.pending && (!on_emulator() || cuemu_sync_count() == w0),
              "async forward: pending %d, %llu waits (want none)", rg.pending,
              (unsigned long long)(cuemu_sync_count() - w0));
        samp_result again[3];
        CHECK_OK(runner_sample(&rg, q, nb, again));
        CHECK(!rg.pending && (!on_emulator() || cuemu_sync_count() == w0 + 1),
              "async forward + draw: pending %d, %llu waits (want 1)", rg.pending,
              (unsigned long long)(cuemu_sync_count() - w0));
        for (int32_t s = 0; s < nb; s++)
            CHECK(again[s].token == got[s].token && again[s].logprob == got[s].logprob,
                  "async forward row %d: %d (%g) vs %d (%g)", s, again[s].token, again[s].logprob, got[s].token,
                  got[s].logprob);
        CHECK_OK(runner_wait(&rg)); /* nothing queued: a no-op */
        rg.async_forward = 0;
    }
    printf("# %s: graph decode: %lld uncaptured, %lld captured, %lld replayed\n", name, (long long)rg.graph_eager,
           (long long)rg.graph_captures, (long long)rg.graph_replays);
    CHECK(rg.graph_captures >= 3 && rg.graph_replays >= 2 && rg.graph_eager >= 3, "graph counters %lld/%lld/%lld",
          (long long)rg.graph_eager, (long long)rg.graph_captures, (long long)rg.graph_replays);
    runner_free(&rcpu);
    runner_free(&re);
    runner_free(&rg);
    runner_free(&rnf);
    free(lcpu), free(lemu), free(lgr), free(tmp);
    rd_unload(&lc);
    rd_unload(&le);
    rd_unload(&lnf);
}

static void test_runner_tiny(void)
{
    runner_case("tiny-f32", 1);
    if (test_case_failed || light)
        return;
    runner_case("tiny-untied", 1);
}

/* RD_CUDA_GEMM=tc through the runner: the tiny models against the CPU, graphs
 * and eager decode bit-identical, no more kernels per step than the default. */
static void test_runner_tc(void)
{
    setenv("RD_CUDA_GEMM", "tc", 1);
    runner_case("tiny-f32", 1);
    if (!test_case_failed && !light)
        runner_case("tiny-qwen3", 1);
    if (!test_case_failed && !light)
        runner_case("tiny-qwen2", 1); /* the q|k|v bias with the RoPE in the GEMM's epilogue */
    if (!test_case_failed && !light)
        runner_case("tiny-gemma3", 1); /* the q/k norms (1 + w) with the RoPE in the GEMM's epilogue */
    unsetenv("RD_CUDA_GEMM");
}

/* LoRA through the runner in tc mode: a model with an adapter on every module it serves, rows of it and of
 * the base model in one step; the prefill's and 4 decode steps' logits bit for bit those of RD_CUDA_FUSE=0 and
 * RD_CUDA_TC_LORA=0 (Gemma 3: the terms before the q/k norms, the RoPE and the KV write of the q|k|v GEMM's
 * epilogue, before the GeGLU of gate|up's, before the post-norms with their adds; Llama: onto the residual);
 * a decode step 9 kernels a layer (23 with RD_CUDA_TC_LORA=0 on Gemma 3); and the adapter moves its rows'
 * logits. */
static void runner_tc_lora_case(const char *model, const char *adapter)
{
    static const char *vars[3][2] = {{NULL, NULL}, {"RD_CUDA_FUSE", "0"}, {"RD_CUDA_TC_LORA", "0"}};
    rd_loaded l[3];
    runner r[3];
    int ok = 1;
    for (int bi = 0; bi < 3; bi++) {
        setenv("RD_CUDA_GEMM", "tc", 1);
        if (vars[bi][0])
            setenv(vars[bi][0], vars[bi][1], 1);
        ok = ok && load_model(model, dev_name(), &l[bi]);
        unsetenv("RD_CUDA_GEMM");
        if (vars[bi][0])
            unsetenv(vars[bi][0]);
    }
    CHECK(ok, "cannot load %s: %s", model, rd_errmsg());
    char dir[512];
    snprintf(dir, sizeof dir, "%s/lora/%s", testdata(), adapter);
    const int32_t V = l[0].m->cfg.vocab, NS = 3, seq_lora[3] = {0, -1, 0};
    int32_t lens[3] = {9, 5, 12}, base[3] = {0, 4, 8}, t[3][40];
    for (int s = 0; s < NS; s++)
        for (int i = 0; i < 40; i++)
            t[s][i] = (int32_t)((hval(71, s, i, 0) + 1) * 0.5 * V) % V;
    const int32_t *toks[3] = {t[0], t[1], t[2]};
    float *lg[3], *base_lg = malloc(sizeof(float) * 64 * V);
    uint64_t kernels[3] = {0, 0, 0};
    for (int bi = 0; bi < 3; bi++) {
        lg[bi] = malloc(sizeof(float) * 64 * V);
        setenv("RD_GRAPHS", "0", 1);
        CHECK_OK(runner_init(&r[bi], l[bi].m, 16, 16, 64, 64));
        unsetenv("RD_GRAPHS");
        CHECK_OK(runner_lora_init(&r[bi], 2, 64));
        lora_adapter *a;
        void **h;
        int64_t bytes;
        CHECK_OK(lora_load_peft(dir, &l[bi].m->cfg, 64, &a));
        CHECK_OK(runner_lora_prepare(&r[bi], a, &h, &bytes));
        runner_lora_bind(&r[bi], 0, h);
        lora_free(a);
        if (bi == 0) { /* the same prompts on the base model alone, for the adapter's effect */
            CHECK_OK(prefill(&r[0], toks, lens, NS, base, 0, base_lg));
        }
        CHECK_OK(prefill_lora(&r[bi], toks, lens, NS, base, 0, seq_lora, lg[bi]));
    }
    const int32_t M = 9 + 5 + 12;
    for (int bi = 1; bi < 3; bi++)
        CHECK(!memcmp(lg[0], lg[bi], sizeof(float) * M * V), "%s + %s: prefill logits differ from %s", model, adapter,
              bi == 1 ? "RD_CUDA_FUSE=0" : "RD_CUDA_TC_LORA=0");
    int32_t moved = 0;
    for (int32_t i = 0; i < M * V; i++)
        moved += lg[0][i] != base_lg[i];
    CHECK(moved > 9 * V / 2, "%s + %s: the adapter moved %d of the prefill's logits", model, adapter, moved);
    int32_t cur[3][3] = {{9, 5, 12}, {9, 5, 12}, {9, 5, 12}};
    for (int step = 0; step < 4; step++) {
        int32_t tok[3], lora[3] = {0, -1, 0}, rows[3] = {0, 1, 2};
        for (int s = 0; s < 3; s++)
            tok[s] = (int32_t)((hval(72, s, step, 0) + 1) * 0.5 * V) % V;
        for (int bi = 0; bi < 3; bi++) {
            int32_t pos[3], slot[3], qs[4], ctx[3], tab[3 * 4];
            rd_step st = decode_step(3, tok, cur[bi], base, pos, slot, qs, ctx, tab);
            st.lora_slots = lora;
            const uint64_t k0 = cuemu_launch_count();
            CHECK_OK(runner_forward(&r[bi], &st, rows, 3, lg[bi]));
            kernels[bi] = cuemu_launch_count() - k0;
        }
        for (int bi = 1; bi < 3; bi++)
            CHECK(!memcmp(lg[0], lg[bi], sizeof(float) * 3 * V), "%s + %s: decode step %d differs from %s", model,
                  adapter, step, bi == 1 ? "RD_CUDA_FUSE=0" : "RD_CUDA_TC_LORA=0");
    }
    printf("# %s + %s (tc): a decode step with adapter rows is %llu kernels (RD_CUDA_TC_LORA=0: %llu, "
           "RD_CUDA_FUSE=0: %llu; %d layers)\n", model, adapter, (unsigned long long)kernels[0],
           (unsigned long long)kernels[2], (unsigned long long)kernels[1], l[0].m->cfg.n_layers);
    /* per layer: the q|k|v shrinks, q|k|v, attention, o's shrink, o, gate|up's shrinks, gate|up, down's shrink,
       down; then the embedding and the head */
    const uint64_t want = 9 * (uint64_t)l[0].m->cfg.n_layers + 2;
    CHECK(!on_emulator() || (kernels[0] == want && kernels[2] > kernels[0]),
          "%s: %llu kernels with the terms fused (want %llu), %llu without", model, (unsigned long long)kernels[0],
          (unsigned long long)want, (unsigned long long)kernels[2]);
    for (int bi = 0; bi < 3; bi++) {
        runner_lora_unbind(&r[bi], 0);
        runner_free(&r[bi]);
        rd_unload(&l[bi]);
        free(lg[bi]);
    }
    free(base_lg);
}

static void test_runner_tc_lora(void)
{
    runner_tc_lora_case("tiny-gemma3", "tiny-gemma3-r8-all");
    if (!test_case_failed)
        runner_tc_lora_case("tiny-f32", "tiny-f32-r64-all");
}

/* Prefill logits [42][vocab] of three fixed-length random prompts (the same
 * tokens for every model loaded with this vocabulary), graphs off, into a
 * new buffer *lg. */
static void prefill_logits(rd_loaded *l, float **lg)
{
    const int32_t V = l->m->cfg.vocab;
    int32_t lens[3] = {14, 5, 23}, base[3] = {0, 4, 8}, t[3][40];
    for (int s = 0; s < 3; s++)
        for (int i = 0; i < 40; i++)
            t[s][i] = (int32_t)((hval(93, s, i, 0) + 1) * 0.5 * V) % V;
    const int32_t *toks[3] = {t[0], t[1], t[2]};
    *lg = calloc((size_t)64 * V, sizeof(float));
    runner r;
    setenv("RD_GRAPHS", "0", 1);
    int rc = runner_init(&r, l->m, 16, 16, 64, 64);
    unsetenv("RD_GRAPHS");
    CHECK_OK(rc);
    CHECK_OK(prefill(&r, toks, lens, 3, base, 0, *lg));
    runner_free(&r);
}

/* Largest |a - b| and |a| over n values. */
static void max_diff(const float *a, const float *b, int64_t n, double *d, double *scale)
{
    *d = 0, *scale = 0;
    for (int64_t i = 0; i < n; i++) {
        *d = worse(*d, fabs(a[i] - b[i]));
        *scale = worse(*scale, fabs(a[i]));
    }
}

/* RD_CUDA_Q8=tc through the loader and the runner: a Q8_0 file's linears
 * and its embedding (also the tied head) held as Q8_0 on the device; prefill
 * logits nearer the CPU's (which computes with the file's exact values) than
 * a bf16 copy of the weights gets; then the runner's contracts (runner_case:
 * graphs, fusions, chunked prefill, decode); then Qwen3-MoE from a Q8_0 file,
 * its experts held as Q8_0 too, its logits no further from the CPU's than a
 * bf16 copy's. */
static void test_runner_q80(void)
{
    rd_loaded lc, lq, lb;
    setenv("RD_CUDA_Q8", "tc", 1);
    int okc = load_model("tiny-q8_0", "cpu", &lc), okq = okc && load_model("tiny-q8_0", dev_name(), &lq);
    unsetenv("RD_CUDA_Q8");
    int okb = okq && load_model("tiny-q8_0", dev_name(), &lb);
    CHECK(okc && okq && okb, "cannot load tiny-q8_0 (run tests/gen_testdata.sh): %s", rd_errmsg());
    const model_config *c = &lc.m->cfg;
    const int64_t q = (int64_t)c->n_heads * c->head_dim, kv = (int64_t)c->n_kv_heads * c->head_dim;
    const int64_t per_layer = (q + 2 * kv) * c->dim + c->dim * q + 2 * c->ffn_dim * c->dim + c->dim * c->ffn_dim;
    const int64_t want_q8 = (c->n_layers * per_layer + (int64_t)c->vocab * c->dim) / 32 * 34;
    CHECK(lq.m->weights_bytes_by_type[GGML_Q8_0] == want_q8 && lq.m->weights_bytes_by_type[GGML_BF16] == 0,
          "q8_0 holdings: %lld Q8_0 bytes (expected %lld), %lld bf16 (expected 0)",
          (long long)lq.m->weights_bytes_by_type[GGML_Q8_0], (long long)want_q8,
          (long long)lq.m->weights_bytes_by_type[GGML_BF16]);
    CHECK(lb.m->weights_bytes_by_type[GGML_Q8_0] == 0, "without RD_CUDA_Q8 the device holds Q8_0 bytes");
    const int64_t n = (int64_t)(14 + 5 + 23) * c->vocab;
    float *lgc, *lgq, *lgb;
    prefill_logits(&lc, &lgc), prefill_logits(&lq, &lgq), prefill_logits(&lb, &lgb);
    double dq, db, sc;
    max_diff(lgc, lgq, n, &dq, &sc);
    max_diff(lgc, lgb, n, &db, &sc);
    printf("# tiny-q8_0 prefill logits against the CPU: Q8_0 held (RD_CUDA_Q8=tc) max |diff| %.3g, a bf16 copy %.3g\n",
           dq, db);
    CHECK(dq < db, "q8_0 held: logits %.3g from the CPU's, a bf16 copy %.3g", dq, db);
    free(lgc), free(lgq), free(lgb);
    rd_unload(&lc), rd_unload(&lq), rd_unload(&lb);
    if (test_case_failed)
        return;
    setenv("RD_CUDA_Q8", "tc", 1);
    runner_case("tiny-q8_0", 1);
    int okm = load_model("tiny-moe-q8_0", dev_name(), &lq);
    unsetenv("RD_CUDA_Q8");
    okm = okm && load_model("tiny-moe-q8_0", "cpu", &lc) && load_model("tiny-moe-q8_0", dev_name(), &lb);
    CHECK(okm, "cannot load tiny-moe-q8_0 (run tests/gen_testdata.sh): %s", rd_errmsg());
    if (!okm)
        return;
    const model_config *mc = &lc.m->cfg;
    const int64_t experts = (int64_t)mc->n_layers * mc->n_experts * 3 * mc->expert_ffn_dim * mc->dim / 32 * 34;
    CHECK(lq.m->weights_bytes_by_type[GGML_Q8_0] >= experts, "tiny-moe-q8_0: %lld Q8_0 bytes held, the experts "
          "alone are %lld", (long long)lq.m->weights_bytes_by_type[GGML_Q8_0], (long long)experts);
    prefill_logits(&lc, &lgc), prefill_logits(&lq, &lgq), prefill_logits(&lb, &lgb);
    max_diff(lgc, lgq, (int64_t)(14 + 5 + 23) * mc->vocab, &dq, &sc);
    max_diff(lgc, lgb, (int64_t)(14 + 5 + 23) * mc->vocab, &db, &sc);
    /* a routing near-tie that the device breaks the other way moves a row's logits far (tiny-moe-bf16 on
       these prompts: 0.61 from the CPU); Q8_0 held must be no further than a bf16 copy */
    printf("# tiny-moe-q8_0 (RD_CUDA_Q8=tc, %lld Q8_0 bytes held, %lld bf16) prefill logits against the CPU: max "
           "|diff| %.3g, a bf16 copy %.3g (max |logit| %.3g)\n", (long long)lq.m->weights_bytes_by_type[GGML_Q8_0],
           (long long)lq.m->weights_bytes_by_type[GGML_BF16], dq, db, sc);
    CHECK(dq <= db, "tiny-moe-q8_0: logits %.3g from the CPU's, a bf16 copy %.3g", dq, db);
    free(lgc), free(lgq), free(lgb);
    rd_unload(&lc), rd_unload(&lq), rd_unload(&lb);
}

/* RD_CUDA_MOE=tc through the runner: tiny-moe-bf16 (64-wide, experts of 32:
 * the tensor-core experts serve it) prefills three prompts; its logits are
 * not the CUDA-core experts' bits (the path ran), and on the rows where the
 * CUDA-core experts follow the CPU (no routing near-tie broken the other
 * way) within the runner cases' 0.02 of the largest logit; the last prompt
 * alone gives its rows of the three-prompt call bit for bit. gemm "tc": with
 * RD_CUDA_GEMM=tc too, whose RMSNorm prologue on the router writes the
 * normalized rows the experts read. */
static void runner_moe_tc_case(const char *gemm)
{
    rd_loaded lc, lb, lt;
    int ok = load_model("tiny-moe-bf16", "cpu", &lc) && load_model("tiny-moe-bf16", dev_name(), &lb);
    setenv("RD_CUDA_MOE", "tc", 1);
    if (gemm)
        setenv("RD_CUDA_GEMM", gemm, 1);
    ok = ok && load_model("tiny-moe-bf16", dev_name(), &lt);
    unsetenv("RD_CUDA_MOE");
    unsetenv("RD_CUDA_GEMM");
    CHECK(ok, "cannot load tiny-moe-bf16 (run tests/gen_testdata.sh): %s", rd_errmsg());
    if (!ok)
        return;
    const int32_t V = lc.m->cfg.vocab;
    const int64_t n = (int64_t)(14 + 5 + 23) * V;
    float *lgc, *lgb, *lgt;
    prefill_logits(&lc, &lgc), prefill_logits(&lb, &lgb), prefill_logits(&lt, &lgt);
    double dt, db, sc;
    max_diff(lgc, lgt, n, &dt, &sc);
    max_diff(lgc, lgb, n, &db, &sc);
    int32_t close_b = 0, close_both = 0;
    double worst_t = 0;
    for (int32_t row = 0; row < 14 + 5 + 23; row++) {
        double rb, rt, rs;
        max_diff(lgc + (size_t)row * V, lgb + (size_t)row * V, V, &rb, &rs);
        max_diff(lgc + (size_t)row * V, lgt + (size_t)row * V, V, &rt, &rs);
        if (rb > 0.02 * sc)
            continue;
        close_b++;
        close_both += rt <= 0.02 * sc;
        worst_t = worse(worst_t, rt);
    }
    printf("# tiny-moe-bf16 prefill logits against the CPU: tensor-core experts (RD_CUDA_MOE=tc%s) max |diff| %.3g, "
           "CUDA-core experts %.3g (max |logit| %.3g); on the %d of 42 rows the CUDA-core experts follow, the "
           "tensor-core ones are within %.3g\n", gemm ? ", RD_CUDA_GEMM=tc" : "", dt, db, sc, close_b, worst_t);
    CHECK(memcmp(lgt, lgb, sizeof(float) * n) != 0, "RD_CUDA_MOE=tc gave the CUDA-core experts' logits");
    CHECK(close_b >= 21, "only %d of 42 rows follow the CPU with the CUDA-core experts (test too weak)", close_b);
    CHECK(close_both == close_b, "tensor-core experts: %d of those %d rows are further than 0.02 x %.3g",
          close_b - close_both, close_b, sc);
    /* the third prompt alone: its rows of the three-prompt call */
    int32_t t[40];
    for (int i = 0; i < 40; i++)
        t[i] = (int32_t)((hval(93, 2, i, 0) + 1) * 0.5 * V) % V;
    const int32_t *toks[1] = {t};
    int32_t lens[1] = {23}, base[1] = {8};
    float *one = calloc((size_t)23 * V, sizeof(float));
    runner r;
    setenv("RD_GRAPHS", "0", 1);
    int rc = runner_init(&r, lt.m, 16, 16, 64, 64);
    unsetenv("RD_GRAPHS");
    CHECK_OK(rc);
    if (!rc) {
        CHECK_OK(prefill(&r, toks, lens, 1, base, 0, one));
        CHECK(!memcmp(one, lgt + (size_t)(14 + 5) * V, sizeof(float) * 23 * V),
              "the third prompt alone differs from its rows among three prompts");
        runner_free(&r);
    }
    free(lgc), free(lgb), free(lgt), free(one);
    rd_unload(&lc), rd_unload(&lb), rd_unload(&lt);
}

/* The small-batch MoE fusions through the runner: tiny-moe-bf16 (16
 * experts, top 4) decoding at batch 1 and 3 (4 and 12 routes: sorted
 * in-block, the combine in the down kernel), and a 26-row prefill (104
 * routes: the sort's kernel, the combine in the down kernel), give
 * RD_CUDA_FUSE=0's logits bit for bit, and a decode step launches at least
 * two kernels fewer per MoE layer (the sort and the combine; the other
 * fusions only remove more). */
static void test_runner_moe_fused(void)
{
    rd_loaded lf, ln;
    int ok = load_model("tiny-moe-bf16", dev_name(), &lf);
    setenv("RD_CUDA_FUSE", "0", 1);
    ok = ok && load_model("tiny-moe-bf16", dev_name(), &ln);
    unsetenv("RD_CUDA_FUSE");
    CHECK(ok, "cannot load tiny-moe-bf16 (run tests/gen_testdata.sh): %s", rd_errmsg());
    if (!ok)
        return;
    const model_config *c = &lf.m->cfg;
    const int32_t V = c->vocab, NS = 3;
    int32_t moe_layers = 0;
    for (int32_t l = 0; l < c->n_layers; l++)
        moe_layers += lf.m->layers[l].router != NULL;
    CHECK(moe_layers > 0, "tiny-moe-bf16 has no MoE layer");
    int32_t lens[3] = {9, 5, 12}, base[3] = {0, 4, 8}, t0[16], t1[16], t2[16];
    for (int i = 0; i < 16; i++)
        t0[i] = (int32_t)(rnd() % V), t1[i] = (int32_t)(rnd() % V), t2[i] = (int32_t)(rnd() % V);
    const int32_t *toks[3] = {t0, t1, t2};
    runner rf, rn;
    setenv("RD_GRAPHS", "0", 1);
    CHECK_OK(runner_init(&rf, lf.m, 16, 16, 64, 64));
    CHECK_OK(runner_init(&rn, ln.m, 16, 16, 64, 64));
    unsetenv("RD_GRAPHS");
    float *a = malloc(sizeof(float) * 32 * V), *b = malloc(sizeof(float) * 32 * V);
    CHECK_OK(prefill(&rf, toks, lens, NS, base, 0, a));
    CHECK_OK(prefill(&rn, toks, lens, NS, base, 0, b));
    CHECK(!memcmp(a, b, sizeof(float) * 26 * V), "prefill (26 rows): the fused kernels' logits differ");
    int32_t cur[3] = {lens[0], lens[1], lens[2]}, cur2[3] = {lens[0], lens[1], lens[2]};
    for (int step = 0; step < 4 && !test_case_failed; step++) {
        const int32_t nb = step < 2 ? 1 : 3;
        int32_t tok[3], pos[3], slot[3], rows[3] = {0, 1, 2}, qs[4], ctx[3], tab[12];
        for (int32_t s = 0; s < nb; s++)
            tok[s] = (int32_t)(rnd() % V);
        rd_step st = decode_step(nb, tok, cur, base, pos, slot, qs, ctx, tab);
        uint64_t k0 = cuemu_launch_count();
        CHECK_OK(runner_forward(&rf, &st, rows, nb, a));
        const uint64_t kf = cuemu_launch_count() - k0;
        st = decode_step(nb, tok, cur2, base, pos, slot, qs, ctx, tab);
        k0 = cuemu_launch_count();
        CHECK_OK(runner_forward(&rn, &st, rows, nb, b));
        const uint64_t kn = cuemu_launch_count() - k0;
        CHECK(!memcmp(a, b, sizeof(float) * nb * V), "decode step %d (batch %d): the fused kernels' logits differ",
              step, nb);
        if (step == 0)
            printf("# tiny-moe-bf16: a batch-1 decode step is %llu kernels (%d MoE layers), %llu with RD_CUDA_FUSE=0\n",
                   (unsigned long long)kf, moe_layers, (unsigned long long)kn);
        if (on_emulator())
            CHECK(kf + 2 * (uint64_t)moe_layers <= kn, "batch %d: %llu kernels a step, %llu with RD_CUDA_FUSE=0 (want "
                  "at least 2 per MoE layer fewer)", nb, (unsigned long long)kf, (unsigned long long)kn);
    }
    runner_free(&rf);
    runner_free(&rn);
    rd_unload(&lf);
    rd_unload(&ln);
    free(a), free(b);
}

static void test_runner_moe_tc(void)
{
    runner_moe_tc_case(NULL);
    if (!test_case_failed)
        runner_moe_tc_case("tc");
}

/* Every family's layer recipe on the emulated backend against the CPU: the
 * Qwen2 bias, the Qwen3 per-head norms over a q width (4 x 32) wider than
 * hidden, the Llama 3 scaled RoPE table, Gemma 3's window of 8 (prompts of
 * 5..23 tokens and decode past them) and local RoPE base. */
static void test_runner_families(void)
{
    runner_case("tiny-qwen2", 1);
    if (test_case_failed)
        return;
    runner_case("tiny-qwen3", 1);
    if (test_case_failed)
        return;
    runner_case("tiny-gemma3", 1);
    if (test_case_failed || light)
        return;
    runner_case("tiny-llama3", 1);
    if (test_case_failed)
        return;
    runner_case("tiny-qwen3", 0);
}

/* kv_dtype fp8 through the runner (tiny-f32 on the emulator): prefill logits
 * near the CPU's (f32 cache), the argmax where the CPU's margin is clear;
 * chunked prefill over the warm fp8 cache equal to one-step prefill; decode
 * steps through CUDA graphs equal to eager ones, bit for bit. */
static void test_runner_kv_fp8(void)
{
    rd_loaded lc, le;
    int okc = load_model("tiny-f32", "cpu", &lc), oke = okc && load_model("tiny-f32", dev_name(), &le);
    CHECK(okc && oke, "cannot load tiny-f32 (run tests/gen_testdata.sh): %s", rd_errmsg());
    CHECK_OK(rd_backend_set_kv_dtype(le.m->be, "fp8"));
    const int32_t V = lc.m->cfg.vocab, NS = 3;
    int32_t lens[3] = {14, 5, 23}, base[3] = {0, 4, 8}, t0[40], t1[40], t2[40];
    for (int i = 0; i < 40; i++) /* from coordinates: the same tokens whichever cases ran before */
        t0[i] = (int32_t)((hval(81, 0, i, 0) + 1) * 0.5 * V) % V, t1[i] = (int32_t)((hval(81, 1, i, 0) + 1) * 0.5 * V) % V,
        t2[i] = (int32_t)((hval(81, 2, i, 0) + 1) * 0.5 * V) % V;
    const int32_t *toks[3] = {t0, t1, t2};
    runner rcpu, re, rg, rch;
    setenv("RD_GRAPHS", "0", 1);
    CHECK_OK(runner_init(&rcpu, lc.m, 16, 16, 64, 64));
    CHECK_OK(runner_init(&re, le.m, 16, 16, 64, 64));
    CHECK_OK(runner_init(&rch, le.m, 16, 16, 64, 64));
    unsetenv("RD_GRAPHS");
    CHECK_OK(runner_init(&rg, le.m, 16, 16, 64, 64));
    const int32_t M = 14 + 5 + 23;
    float *lcpu = malloc(sizeof(float) * 64 * V), *lemu = malloc(sizeof(float) * 64 * V);
    float *lgr = malloc(sizeof(float) * 64 * V), *tmp = malloc(sizeof(float) * 64 * V);
    CHECK_OK(prefill(&rcpu, toks, lens, NS, base, 0, lcpu));
    CHECK_OK(prefill(&re, toks, lens, NS, base, 0, lemu));
    CHECK_OK(prefill(&rg, toks, lens, NS, base, 0, lgr));
    double worst = 0, scale = 0;
    int agree = 0, clear = 0;
    for (int32_t r = 0; r < M; r++) {
        int32_t ac = 0, ae = 0;
        for (int32_t t = 0; t < V; t++) {
            worst = worse(worst, fabs(lcpu[r * V + t] - lemu[r * V + t]));
            scale = fabs(lcpu[r * V + t]) > scale ? fabs(lcpu[r * V + t]) : scale;
            ac = lcpu[r * V + t] > lcpu[r * V + ac] ? t : ac;
            ae = lemu[r * V + t] > lemu[r * V + ae] ? t : ae;
        }
        float second = -INFINITY;
        for (int32_t t = 0; t < V; t++)
            if (t != ac && lcpu[r * V + t] > second)
                second = lcpu[r * V + t];
        int wide = lcpu[r * V + ac] - second > 0.5f;
        clear += wide;
        agree += ac == ae || !wide;
    }
    /* The same on a bf16 cache, for scale: E4M3 keeps 3 mantissa bits to bf16's 7. */
    rd_loaded lb;
    CHECK(load_model("tiny-f32", dev_name(), &lb), "cannot load tiny-f32 again: %s", rd_errmsg());
    runner rb;
    CHECK_OK(runner_init(&rb, lb.m, 16, 16, 64, 64));
    CHECK_OK(prefill(&rb, toks, lens, NS, base, 0, tmp));
    double worst_bf16 = 0;
    for (int32_t i = 0; i < M * V; i++)
        worst_bf16 = worse(worst_bf16, fabs(lcpu[i] - tmp[i]));
    runner_free(&rb);
    rd_unload(&lb);
    printf("# tiny-f32, kv fp8: prefill logits, emulated CUDA vs CPU (f32 cache): max |diff| %.4g (bf16 cache %.4g; "
           "max |logit| %.3g), argmax agrees on %d/%d rows (or is a near tie)\n", worst, worst_bf16, scale, agree, M);
    CHECK(worst <= 0.1 * (scale > 1 ? scale : 1) && worst > worst_bf16 && agree == M && clear >= M / 4,
          "kv fp8: logits %.4g from the CPU's (bf16 cache %.4g), argmax %d/%d (%d clear)", worst, worst_bf16, agree,
          M, clear);
    CHECK(!memcmp(lemu, lgr, sizeof(float) * M * V), "kv fp8: prefill with and without graphs enabled differ");
    int32_t from_lens[3] = {9, 3, 17};
    CHECK_OK(prefill(&rch, toks, from_lens, NS, base, 0, tmp));
    CHECK_OK(prefill(&rch, toks, lens, NS, base, 0, tmp));
    CHECK(!memcmp(tmp, lemu, sizeof(float) * M * V), "kv fp8: prefill over a warm cache differs");
    int32_t cur[3] = {lens[0], lens[1], lens[2]};
    for (int step = 0; step < 5 && !test_case_failed; step++) {
        int32_t nb = step == 2 ? 2 : 3;
        int32_t tok[3], pos[3], slot[3], rows[3] = {0, 1, 2}, qs[4], ctx[3], tab[3 * 4];
        for (int32_t s = 0; s < nb; s++)
            tok[s] = (int32_t)((hval(82, step, s, 0) + 1) * 0.5 * V) % V;
        rd_step st = decode_step(nb, tok, cur, base, pos, slot, qs, ctx, tab);
        CHECK_OK(runner_forward(&re, &st, rows, nb, lemu));
        CHECK_OK(runner_forward(&rg, &st, rows, nb, lgr));
        CHECK(!memcmp(lemu, lgr, sizeof(float) * nb * V), "kv fp8: decode step %d: graph path differs from eager",
              step);
    }
    CHECK(rg.graph_captures >= 1 && rg.graph_replays >= 1, "kv fp8: graph counters %lld/%lld",
          (long long)rg.graph_captures, (long long)rg.graph_replays);
    runner_free(&rcpu), runner_free(&re), runner_free(&rg), runner_free(&rch);
    free(lcpu), free(lemu), free(lgr), free(tmp);
    rd_unload(&lc);
    rd_unload(&le);
}

static void test_runner_tiny_bf16(void)
{
    runner_case(light ? "tiny-untied" : "tiny-f32", 0);
}

/* ------------------------------------------------------------------ LoRA */

/* One random LoRA pair in dtype t (GGML_F32 / F16 / BF16): the bytes
 * lora_load takes, and their fp32 values (what the file means). */
typedef struct {
    rd_lora_w w;
    void *a, *b;                /* file bytes */
    float *af, *bf;             /* their values */
} lora_host;

static void lora_host_make(lora_host *h, int32_t rank, int32_t in, int32_t out, int32_t t, float scale)
{
    const size_t na = (size_t)rank * in, nb = (size_t)out * rank, es = t == GGML_F32 ? 4 : 2;
    h->a = malloc(na * es), h->b = malloc(nb * es);
    h->af = malloc(na * sizeof(float)), h->bf = malloc(nb * sizeof(float));
    for (size_t n = 0; n < na + nb; n++) {
        const int is_a = n < na;
        const size_t i = is_a ? n : n - na;
        float v = frand() * (is_a ? 0.3f : 0.2f);
        void *dst = is_a ? h->a : h->b;
        if (t == GGML_F16) {
            uint16_t c = st_f32_to_f16(v);
            ((uint16_t *)dst)[i] = c;
            v = rd_f16_to_f32(c);
        } else if (t == GGML_BF16) {
            uint16_t c = cm_f32_to_bf16(v);
            ((uint16_t *)dst)[i] = c;
            v = cm_bf16_to_f32(c);
        } else {
            ((float *)dst)[i] = v;
        }
        (is_a ? h->af : h->bf)[i] = v;
    }
    h->w = (rd_lora_w){rank, in, out, scale, t, t, h->a, h->b};
}

static void lora_host_free(lora_host *h) { free(h->a), free(h->b), free(h->af), free(h->bf); }

/* y (m rows of ys floats) after lora_apply on be, from y0. */
static int lora_on(rd_backend *be, const rd_lora_batch *lb, const float *x, const int32_t *slots, int32_t m,
                   const float *y0, int32_t ys, int32_t off, float *y)
{
    float *dx = up(be, x, sizeof(float) * m * lb->in), *dy = up(be, y0, sizeof(float) * m * ys);
    int32_t *ds = up(be, slots, sizeof(int32_t) * m);
    be->ops->lora_apply(be, lb, dx, ds, m, dy, ys, off);
    int rc = down(be, y, dy, sizeof(float) * m * ys);
    be->ops->free(be, dx), be->ops->free(be, dy), be->ops->free(be, ds);
    return rc;
}

/* lora_apply against the CPU backend: adapters of rank 8 (f32), 16 (f16)
 * and 64 (bf16), a slot whose adapter leaves the module alone (NULL), rows
 * with slot -1 and one past the table; the module's term at an offset of a
 * wider output (a fused q|k|v's v). Both backends follow backend.h's order,
 * so every row must be bit-identical between them, within 1e-5 of a double
 * reference, bit-identical to itself computed alone, and untouched where
 * it has no adapter. Two widths: 75 (no full warp of chunks, a tail) and
 * 300 (more chunks than lanes, a tail). */
static void test_lora_vs_cpu(void)
{
    static const int32_t ins[2] = {75, 300};
    enum { OUT = 40, YS = 100, OFF = 37, M = 13, NS = 5 };
    static const int32_t ranks[3] = {8, 16, 64}, types[3] = {GGML_F32, GGML_F16, GGML_BF16};
    static const int32_t slots[M] = {2, -1, 0, 1, 3, 2, 7, 0, -1, 2, 1, 4, 0};
    for (int ii = 0; ii < 2; ii++) {
        const int32_t in = ins[ii];
        lora_host h[3];
        void *hc[NS] = {0}, *hd[NS] = {0};
        for (int a = 0; a < 3; a++) {
            lora_host_make(&h[a], ranks[a], in, OUT, types[a], 2.0f / (float)(a + 1));
            CHECK_OK(cpu->ops->lora_load(cpu, &h[a].w, &hc[a]));
            CHECK_OK(emu->ops->lora_load(emu, &h[a].w, &hd[a]));
        }
        hc[4] = hc[1], hd[4] = hd[1]; /* two slots may share an adapter's pair */
        CHECK(emu->ops->lora_bytes(emu, hd[2]) == (int64_t)(64 * in + OUT * 64) * 2, "bf16 kept as bf16: %lld bytes",
              (long long)emu->ops->lora_bytes(emu, hd[2]));
        const rd_lora_batch lc = {NS, hc, in, OUT, 64}, ld = {NS, hd, in, OUT, 64};
        float *x = malloc(sizeof(float) * M * in), *y0 = malloc(sizeof(float) * M * YS);
        float *yc = malloc(sizeof(float) * M * YS), *yd = malloc(sizeof(float) * M * YS);
        float *y1 = malloc(sizeof(float) * YS);
        for (int32_t i = 0; i < M * in; i++)
            x[i] = frand();
        for (int32_t i = 0; i < M * YS; i++)
            y0[i] = frand();
        CHECK_OK(lora_on(cpu, &lc, x, slots, M, y0, YS, OFF, yc));
        CHECK_OK(lora_on(emu, &ld, x, slots, M, y0, YS, OFF, yd));
        for (int32_t i = 0; i < M; i++) {
            const int32_t s = slots[i];
            const lora_host *L = s >= 0 && s < NS && s != 3 ? &h[s == 4 ? 1 : s] : NULL;
            for (int32_t j = 0; j < YS; j++) {
                const size_t e = (size_t)i * YS + j;
                CHECK(fbits(yc[e]) == fbits(yd[e]), "in %d row %d (slot %d) col %d: cpu %.9g, %s %.9g", in, i, s, j,
                      yc[e], dev_name(), yd[e]);
                if (!L || j < OFF || j >= OFF + OUT) {
                    CHECK(fbits(yc[e]) == fbits(y0[e]), "in %d row %d (slot %d) col %d changed", in, i, s, j);
                    continue;
                }
                double u = 0.0;
                for (int32_t k = 0; k < L->w.rank; k++) {
                    double t = 0.0;
                    for (int32_t c = 0; c < in; c++)
                        t += (double)L->af[(size_t)k * in + c] * x[(size_t)i * in + c];
                    u += (double)L->bf[(size_t)(j - OFF) * L->w.rank + k] * t;
                }
                const double want = y0[e] + (double)L->w.scale * u;
                CHECK(fabs(yc[e] - want) <= 1e-5 * (fabs(want) + fabs((double)L->w.scale * u) + 1e-3),
                      "in %d row %d col %d: %.9g vs the double reference %.9g", in, i, j, yc[e], want);
            }
            /* the row alone, on each backend */
            CHECK_OK(lora_on(cpu, &lc, x + (size_t)i * in, &slots[i], 1, y0 + (size_t)i * YS, YS, OFF, y1));
            CHECK(!memcmp(y1, yc + (size_t)i * YS, sizeof(float) * YS), "in %d row %d: alone != in the batch (cpu)",
                  in, i);
            CHECK_OK(lora_on(emu, &ld, x + (size_t)i * in, &slots[i], 1, y0 + (size_t)i * YS, YS, OFF, y1));
            CHECK(!memcmp(y1, yd + (size_t)i * YS, sizeof(float) * YS), "in %d row %d: alone != in the batch (%s)",
                  in, i, dev_name());
        }
        emu->ops->lora_release(emu, &ld);
        for (int a = 0; a < 3; a++) {
            cpu->ops->lora_free(cpu, hc[a]);
            emu->ops->lora_free(emu, hd[a]);
            lora_host_free(&h[a]);
        }
        free(x), free(y0), free(yc), free(yd), free(y1);
    }
}

/* LoRA in tc mode: a linear whose output lora_apply then adds adapters' terms to (each call one module's
 * columns) takes those terms in its epilogue, the calls' shrinks in one launch before it (on its input as its
 * RMSNorm prologue will normalize it): the GEMM's output, and what reads it next, bit for bit those of RD_CUDA_FUSE=0 and
 * RD_CUDA_TC_LORA=0 (the GEMM, then the shrink and expand of each call), and, without a gated or norm step
 * after it, of the CPU backend's lora_apply run in order on the device's plain GEMM output. Modes: 0 q|k|v (3
 * calls, q 64 + k 32 + v 32 columns); 1 the same with the RMSNorm prologue; 2 gate|up then SwiGLU (2 calls);
 * 3 Gemma's o then rmsnorm_add; 4 Llama's o onto the residual (accumulate). Adapters of rank 8 (f32), 16
 * (f16), 64 (bf16) per module, a slot whose adapter leaves the module alone, rows with no adapter. */
enum { TL_IN = 128, TL_NS = 5 };
static int tc_trio(rd_backend *bes[3], int sms, const char *off);
static void tc_trio_free(rd_backend *bes[3]);
static void tc_lora_case(rd_backend *const bes[3], int mode, int32_t M)
{
    static const int32_t ranks[3] = {8, 16, 64}, types[3] = {GGML_F32, GGML_F16, GGML_BF16};
    const int32_t n_t = mode <= 1 ? 3 : mode == 2 ? 2 : 1;
    const int32_t widths[3] = {mode <= 1 ? 64 : mode == 2 ? 48 : 64, mode <= 1 ? 32 : 48, 32};
    int32_t offs[3], OUT = 0;
    for (int32_t t = 0; t < n_t; t++)
        offs[t] = OUT, OUT += widths[t];
    const int norm = mode == 1, acc = mode == 4;
    const int32_t NO = mode == 2 ? OUT / 2 : OUT; /* the follow-up's width */
    lora_host h[3][3];
    for (int32_t t = 0; t < n_t; t++)
        for (int k = 0; k < 3; k++)
            lora_host_make(&h[t][k], ranks[k], TL_IN, widths[t], types[k], 1.5f / (float)(k + 1));
    int32_t *slots = malloc(sizeof(int32_t) * M);
    float *w = malloc(sizeof(float) * OUT * TL_IN), *x = malloc(sizeof(float) * M * TL_IN);
    float *nw = malloc(sizeof(float) * (TL_IN > OUT ? TL_IN : OUT)), *y0 = malloc(sizeof(float) * M * OUT);
    float *res[3], *fol[3], *plain = malloc(sizeof(float) * M * OUT), *xn = malloc(sizeof(float) * M * TL_IN);
    float *plain0 = malloc(sizeof(float) * M * OUT);
    static const int32_t pattern[7] = {2, -1, 0, 1, 3, 4, 0};
    for (int32_t i = 0; i < M; i++)
        slots[i] = pattern[i % 7];
    for (int32_t i = 0; i < OUT * TL_IN; i++)
        w[i] = bf(frand() * 0.2f);
    for (int32_t i = 0; i < M * TL_IN; i++)
        x[i] = frand() * 2.0f;
    for (int32_t i = 0; i < M * OUT; i++)
        y0[i] = frand();
    fill_norm_weights(nw, TL_IN > OUT ? TL_IN : OUT);
    uint64_t launched[3];
    for (int bi = 0; bi < 3 && !test_case_failed; bi++) {
        rd_backend *be = bes[bi];
        res[bi] = malloc(sizeof(float) * M * OUT), fol[bi] = malloc(sizeof(float) * M * NO);
        void *W, *hd[3][TL_NS];
        rd_lora_batch lb[3];
        CHECK_OK(be->ops->linear_load(be, w, OUT, TL_IN, &W));
        for (int32_t t = 0; t < n_t; t++) {
            for (int k = 0; k < 3; k++)
                CHECK_OK(be->ops->lora_load(be, &h[t][k].w, &hd[t][k]));
            hd[t][3] = NULL, hd[t][4] = hd[t][1]; /* a slot the module has no adapter in; two slots sharing one */
            lb[t] = (rd_lora_batch){TL_NS, hd[t], TL_IN, widths[t], 64};
        }
        float *dx = up(be, x, sizeof(float) * M * TL_IN), *dxn = up(be, NULL, sizeof(float) * M * TL_IN);
        float *dnw = up(be, nw, sizeof(float) * (TL_IN > OUT ? TL_IN : OUT)), *dy = up(be, y0, sizeof(float) * M * OUT);
        float *dout = up(be, NULL, sizeof(float) * M * NO), *dres = up(be, y0, sizeof(float) * M * NO);
        int32_t *ds = up(be, slots, sizeof(int32_t) * M);
        const float *xin = norm ? dxn : dx;
        if (bi == 0) { /* the plain GEMM (and the prologue's output) for the CPU's reference */
            if (norm)
                be->ops->rmsnorm(be, dx, dnw, M, TL_IN, 1e-6f, 0.0f, dxn);
            be->ops->linear(be, W, xin, M, dy, acc);
            CHECK_OK(down(be, plain, dy, sizeof(float) * M * OUT));
            CHECK_OK(down(be, xn, xin, sizeof(float) * M * TL_IN));
            be->ops->h2d(be, dy, y0, sizeof(float) * M * OUT);
        }
        for (int rep = 0; rep < 2; rep++) { /* the second time with the scratch grown */
            be->ops->h2d(be, dy, y0, sizeof(float) * M * OUT);
            be->ops->h2d(be, dres, y0, sizeof(float) * M * NO);
            CHECK_OK(be->ops->sync(be));
            const uint64_t k0 = cuemu_launch_count();
            if (norm)
                be->ops->rmsnorm(be, dx, dnw, M, TL_IN, 1e-6f, 0.0f, dxn);
            be->ops->linear(be, W, xin, M, dy, acc);
            for (int32_t t = 0; t < n_t; t++)
                be->ops->lora_apply(be, &lb[t], xin, ds, M, dy, OUT, offs[t]);
            if (mode == 2)
                be->ops->swiglu(be, dy, M, OUT / 2, dout);
            else if (mode == 3)
                be->ops->rmsnorm_add(be, dy, dnw, M, OUT, 1e-6f, 1.0f, dout, dres);
            CHECK_OK(be->ops->sync(be));
            launched[bi] = cuemu_launch_count() - k0;
        }
        if (mode != 2)
            CHECK_OK(down(be, res[bi], dy, sizeof(float) * M * OUT));
        CHECK_OK(down(be, fol[bi], mode == 3 ? dres : dout, sizeof(float) * M * NO));
        be->ops->free(be, dx), be->ops->free(be, dxn), be->ops->free(be, dnw), be->ops->free(be, dy);
        be->ops->free(be, dout), be->ops->free(be, dres), be->ops->free(be, ds);
        for (int32_t t = 0; t < n_t; t++) {
            be->ops->lora_release(be, &lb[t]);
            for (int k = 0; k < 3; k++)
                be->ops->lora_free(be, hd[t][k]);
        }
        be->ops->linear_free(be, W);
    }
    static const char *modes[5] = {"q|k|v", "q|k|v after an RMSNorm", "gate|up, SwiGLU", "o, rmsnorm_add",
                                   "o onto the residual"};
    for (int bi = 1; bi < 3 && !test_case_failed; bi++)
        CHECK((mode == 2 || !memcmp(res[0], res[bi], sizeof(float) * M * OUT)) &&
                  (mode != 2 && mode != 3 ? 1 : !memcmp(fol[0], fol[bi], sizeof(float) * M * NO)),
              "tc LoRA, %s, %d rows: differs from %s", modes[mode], M, bi == 1 ? "RD_CUDA_FUSE=0" : "RD_CUDA_TC_LORA=0");
    if (!test_case_failed && mode != 2 && mode != 3) {
        /* the CPU's lora_apply, call by call, on the device's plain GEMM output */
        memcpy(plain0, plain, sizeof(float) * M * OUT);
        void *hc[3][TL_NS];
        rd_lora_batch lc[3];
        for (int32_t t = 0; t < n_t && !test_case_failed; t++) {
            for (int k = 0; k < 3; k++)
                CHECK_OK(cpu->ops->lora_load(cpu, &h[t][k].w, &hc[t][k]));
            hc[t][3] = NULL, hc[t][4] = hc[t][1];
            lc[t] = (rd_lora_batch){TL_NS, hc[t], TL_IN, widths[t], 64};
            CHECK_OK(lora_on(cpu, &lc[t], xn, slots, M, plain, OUT, offs[t], plain));
            for (int k = 0; k < 3; k++)
                cpu->ops->lora_free(cpu, hc[t][k]);
        }
        CHECK(test_case_failed || !memcmp(plain, res[0], sizeof(float) * M * OUT),
              "tc LoRA, %s, %d rows: not the CPU's lora_apply on the plain GEMM's output", modes[mode], M);
        int32_t changed = 0;
        for (int32_t i = 0; i < M * OUT; i++)
            changed += plain0[i] != res[0][i];
        CHECK(changed > M * OUT / 4, "tc LoRA, %s: the terms changed %d of %d outputs", modes[mode], changed, M * OUT);
    }
    /* kernels: the calls' shrinks in one launch, and the GEMM (with the follow-up in its epilogue up to
       RD_CUDA_NORM_ROWS rows); from RD_CUDA_TC_BIG_ROWS rows as RD_CUDA_TC_LORA=0 */
    const int small = M <= 8;
    const uint64_t want = M >= 128 ? launched[2] : (uint64_t)(2 + (norm && !small) + (mode == 3 && !small));
    CHECK(test_case_failed || !on_emulator() || (launched[0] == want && (M >= 128 || launched[2] > launched[0])),
          "tc LoRA, %s, %d rows: %llu kernels (want %llu; RD_CUDA_TC_LORA=0: %llu)", modes[mode], M,
          (unsigned long long)launched[0], (unsigned long long)want, (unsigned long long)launched[2]);
    for (int bi = 0; bi < 3; bi++)
        free(res[bi]), free(fol[bi]);
    for (int32_t t = 0; t < n_t; t++)
        for (int k = 0; k < 3; k++)
            lora_host_free(&h[t][k]);
    free(slots), free(w), free(x), free(nw), free(y0), free(plain), free(plain0), free(xn);
}

static void test_gemm_tc_lora(void)
{
    rd_backend *bes[3];
    CHECK(tc_trio(bes, 4, "RD_CUDA_TC_LORA"), "cannot create the tc backends: %s", rd_errmsg());
    static const int32_t rows[4] = {1, 5, 20, 130};
    for (int mode = 0; mode < 5 && !test_case_failed; mode++)
        for (int ri = 0; ri < 4 && !test_case_failed; ri++) {
            if (rows[ri] == 130 && mode != 0)
                continue;
            tc_lora_case(bes, mode, rows[ri]);
        }
    tc_trio_free(bes);
}

/* lora_apply on the CUDA backend after the linear it belongs to (the
 * linear's deferred split sum must be in y before the term is added), and
 * in a graph: a replay reads the slots as they are at replay; after a slot
 * changes adapter, one lora_apply outside capture makes the old graph use
 * the new one (backend.h). */
static void test_lora_graph(void)
{
    enum { IN = 64, OUT = 48, M = 6 };
    rd_backend *be = emu;
    float *w = malloc(sizeof(float) * OUT * IN), *x = malloc(sizeof(float) * M * IN);
    for (int32_t i = 0; i < OUT * IN; i++)
        w[i] = frand() * 0.3f;
    for (int32_t i = 0; i < M * IN; i++)
        x[i] = frand();
    lora_host h[3];
    void *hd[2] = {0}, *extra = NULL, *W = NULL;
    lora_host_make(&h[0], 8, IN, OUT, GGML_BF16, 2.0f);
    lora_host_make(&h[1], 16, IN, OUT, GGML_F16, 1.0f);
    lora_host_make(&h[2], 16, IN, OUT, GGML_F32, 0.5f);
    CHECK_OK(be->ops->lora_load(be, &h[0].w, &hd[0]));
    CHECK_OK(be->ops->lora_load(be, &h[1].w, &hd[1]));
    CHECK_OK(be->ops->lora_load(be, &h[2].w, &extra));
    CHECK_OK(be->ops->linear_load(be, w, OUT, IN, &W));
    const rd_lora_batch lb = {2, hd, IN, OUT, 16};
    const size_t yb = sizeof(float) * M * OUT;
    int32_t s1[M] = {0, 1, -1, 1, 0, 0}, s2[M] = {1, -1, 0, 0, 1, -1};
    float *dx = up(be, x, sizeof(float) * M * IN), *dy = up(be, NULL, yb), *dbase = up(be, NULL, yb);
    int32_t *ds = up(be, s1, sizeof s1);
    float *base = malloc(yb), *want = malloc(yb), *got = malloc(yb);
    /* the linear's output alone, then the term added to a fresh copy of it */
    be->ops->linear(be, W, dx, M, dbase, 0);
    CHECK_OK(down(be, base, dbase, yb));
#define LORA_WANT(sl)                                                         \
    do {                                                                      \
        CHECK_OK(be->ops->h2d(be, ds, (sl), sizeof s1));                      \
        CHECK_OK(be->ops->h2d(be, dy, base, yb));                             \
        be->ops->lora_apply(be, &lb, dx, ds, M, dy, OUT, 0);                  \
        CHECK_OK(down(be, want, dy, yb));                                     \
    } while (0)
    LORA_WANT(s1);
    CHECK(memcmp(want, base, yb) != 0, "the adapters changed nothing (test too weak)");
    /* the linear straight into y and the term after it: the same bits */
    be->ops->linear(be, W, dx, M, dy, 0);
    be->ops->lora_apply(be, &lb, dx, ds, M, dy, OUT, 0);
    CHECK_OK(down(be, got, dy, yb));
    CHECK(!memcmp(got, want, yb), "lora_apply after the linear differs from lora_apply on its finished output");
    /* captured, replayed with other slots */
    void *g;
    CHECK_OK(be->ops->graph_begin(be));
    be->ops->linear(be, W, dx, M, dy, 0);
    be->ops->lora_apply(be, &lb, dx, ds, M, dy, OUT, 0);
    CHECK_OK(be->ops->graph_end(be, &g));
    CHECK_OK(be->ops->h2d(be, ds, s2, sizeof s2));
    CHECK_OK(be->ops->graph_launch(be, g));
    CHECK_OK(down(be, got, dy, yb));
    LORA_WANT(s2);
    CHECK(!memcmp(got, want, yb), "a replay with other slots differs from the eager run");
    /* slot 1 now another adapter: one uncaptured call, then the old graph uses it */
    void *orig1 = hd[1];
    hd[1] = extra;
    LORA_WANT(s2);
    CHECK_OK(be->ops->graph_launch(be, g));
    CHECK_OK(down(be, got, dy, yb));
    CHECK(!memcmp(got, want, yb), "after a slot's adapter changed, the graph's replay differs from the eager run");
    be->ops->graph_free(be, g);
#undef LORA_WANT
    be->ops->lora_release(be, &lb);
    be->ops->linear_free(be, W);
    be->ops->lora_free(be, hd[0]);
    be->ops->lora_free(be, extra);
    be->ops->lora_free(be, orig1);
    be->ops->free(be, dx), be->ops->free(be, dy), be->ops->free(be, dbase), be->ops->free(be, ds);
    for (int a = 0; a < 3; a++)
        lora_host_free(&h[a]);
    free(w), free(x), free(base), free(want), free(got);
}

/* ------------------------------------------------------------------ mixture of experts */


/* Routes of m rows of logits [m][E] on be: ids and weights [m][k]. */
static int moe_route_on(rd_backend *be, const float *logits, int32_t m, int32_t E, int32_t k, int norm, int32_t *ids,
                        float *w)
{
    float *dl = up(be, logits, sizeof(float) * m * E), *dw = up(be, NULL, sizeof(float) * m * k);
    int32_t *di = up(be, NULL, sizeof(int32_t) * m * k);
    be->ops->moe_route(be, dl, m, E, k, norm, di, dw);
    int rc = down(be, ids, di, sizeof(int32_t) * m * k);
    if (!rc)
        rc = down(be, w, dw, sizeof(float) * m * k);
    be->ops->free(be, dl), be->ops->free(be, dw), be->ops->free(be, di);
    return rc;
}

/* ids equal and weights within 1e-6 relative. */
static void moe_route_compare(const char *what, const int32_t *ids_a, const float *w_a, const int32_t *ids_b,
                              const float *w_b, int32_t m, int32_t k)
{
    for (int32_t i = 0; i < m * k; i++) {
        CHECK(ids_a[i] == ids_b[i], "%s: row %d route %d: expert %d vs the CPU's %d", what, i / k, i % k, ids_b[i],
              ids_a[i]);
        CHECK(fabsf(w_a[i] - w_b[i]) <= 1e-6f * fabsf(w_a[i]), "%s: row %d route %d: weight %.9g vs the CPU's %.9g",
              what, i / k, i % k, w_b[i], w_a[i]);
    }
}

/* moe_route against the CPU backend: random logits, a row of all-equal
 * logits (ids 0..k-1), a row of equal pairs (ties to the lower id), with and
 * without renormalisation, from 5 experts to the bounds (512, top 32). */
static void test_moe_route(void)
{
    static const int32_t shapes[][3] = {{8, 2, 37}, {8, 4, 37}, {5, 3, 20}, {40, 5, 9}, {128, 8, 33}, {512, 32, 3}};
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        const int32_t E = shapes[si][0], k = shapes[si][1], m = shapes[si][2];
        float *l = malloc(sizeof(float) * m * E), *wc = malloc(sizeof(float) * m * k), *wd = malloc(sizeof(float) * m * k);
        int32_t *ic = malloc(sizeof(int32_t) * m * k), *id = malloc(sizeof(int32_t) * m * k);
        for (int32_t i = 0; i < m * E; i++)
            l[i] = frand() * 3.0f;
        for (int32_t e = 0; e < E; e++) {
            l[e] = 0.5f;                      /* row 0: all equal */
            l[E + e] = (float)((E - 1 - e) / 2); /* row 1: equal pairs, descending */
        }
        for (int norm = 0; norm <= 1; norm++) {
            CHECK_OK(moe_route_on(cpu, l, m, E, k, norm, ic, wc));
            CHECK_OK(moe_route_on(emu, l, m, E, k, norm, id, wd));
            char what[64];
            snprintf(what, sizeof what, "%d experts, top %d, norm %d", E, k, norm);
            moe_route_compare(what, ic, wc, id, wd, m, k);
            if (test_case_failed)
                return;
            for (int32_t j = 0; j < k; j++)
                CHECK(id[j] == j && id[k + j] == j, "%s: tie rows: route %d goes to %d and %d", what, j, id[j],
                      id[k + j]);
        }
        free(l), free(wc), free(wd), free(ic), free(id);
    }
}

/* moe_route on the output of the router linear: in the split mode the
 * linear's deferred sum is completed inside the routing kernel (no extra
 * kernel), which writes the logits back as the sum would have; the routes
 * are those the CPU computes from those logits. */
static void test_moe_route_after_linear(void)
{
    const int32_t E = 40, D = 64, M = 9, K = 4;
    float *w = malloc(sizeof(float) * E * D), *x = malloc(sizeof(float) * M * D);
    float *l1 = malloc(sizeof(float) * M * E), *l2 = malloc(sizeof(float) * M * E);
    float *wd = malloc(sizeof(float) * M * K), *wc = malloc(sizeof(float) * M * K);
    int32_t *id = malloc(sizeof(int32_t) * M * K), *ic = malloc(sizeof(int32_t) * M * K);
    for (int32_t i = 0; i < E * D; i++)
        w[i] = frand() * 0.5f;
    for (int32_t i = 0; i < M * D; i++)
        x[i] = frand() * 2.0f;
    rd_backend *bes[2] = {emu, emu_bf16};
    for (int bi = 0; bi < 2; bi++) {
        rd_backend *be = bes[bi];
        const char *mode = bi ? "bf16 activations" : "split activations";
        void *W;
        CHECK_OK(be->ops->linear_load(be, w, E, D, &W));
        float *dx = up(be, x, sizeof(float) * M * D), *dl = up(be, NULL, sizeof(float) * M * E);
        float *dw = up(be, NULL, sizeof(float) * M * K);
        int32_t *di = up(be, NULL, sizeof(int32_t) * M * K);
        CHECK_OK(be->ops->sync(be));
        const uint64_t k0 = cuemu_launch_count(); /* (the emulator counts kernels as they run) */
        be->ops->linear(be, W, dx, M, dl, 0);
        be->ops->moe_route(be, dl, M, E, K, 1, di, dw);
        CHECK_OK(be->ops->sync(be));
        const uint64_t launched = cuemu_launch_count() - k0;
        CHECK_OK(down(be, l1, dl, sizeof(float) * M * E));
        CHECK_OK(down(be, id, di, sizeof(int32_t) * M * K));
        CHECK_OK(down(be, wd, dw, sizeof(float) * M * K));
        if (on_emulator())
            CHECK(launched == 3, "%s: a linear and moe_route launched %llu kernels (want 3: x to bf16, the GEMM, "
                  "the routing with the split's sum inside it)", mode, (unsigned long long)launched);
        be->ops->linear(be, W, dx, M, dl, 0);
        CHECK_OK(down(be, l2, dl, sizeof(float) * M * E));
        CHECK(!memcmp(l1, l2, sizeof(float) * M * E), "%s: the logits moe_route completed differ from the linear's",
              mode);
        CHECK_OK(moe_route_on(cpu, l1, M, E, K, 1, ic, wc));
        moe_route_compare(mode, ic, wc, id, wd, M, K);
        if (test_case_failed)
            return;
        be->ops->free(be, dx), be->ops->free(be, dl), be->ops->free(be, dw), be->ops->free(be, di);
        be->ops->linear_free(be, W);
    }
    free(w), free(x), free(l1), free(l2), free(wd), free(wc), free(id), free(ic);
}

/* The three tc backends a finishing step's case compares: fused, RD_CUDA_FUSE=0, and the step's own switch
 * `off` at 0; on an emulator of sms SMs (a device ignores CUEMU_SMS). False if one cannot be created. */
static int tc_trio(rd_backend *bes[3], int sms, const char *off)
{
    char n[16];
    snprintf(n, sizeof n, "%d", sms);
    setenv("CUEMU_SMS", n, 1);
    bes[0] = dev_with("RD_CUDA_GEMM", "tc", NULL, NULL);
    bes[1] = dev_with("RD_CUDA_GEMM", "tc", "RD_CUDA_FUSE", "0");
    bes[2] = dev_with("RD_CUDA_GEMM", "tc", off, "0");
    unsetenv("CUEMU_SMS");
    return bes[0] && bes[1] && bes[2];
}

static void tc_trio_free(rd_backend *bes[3])
{
    for (int i = 0; i < 3; i++)
        if (bes[i])
            rd_backend_destroy(bes[i]);
}

/* Tensor-core mode: the router's GEMM (with the FFN norm as its prologue)
 * then moe_route, the routing as the GEMM's finishing step (the last CTA of
 * each row tile to finish routes its rows): one kernel, the ids, weights and
 * logits bit for bit those of RD_CUDA_FUSE=0 and RD_CUDA_TC_ROUTE=0 (the
 * GEMM, then k_moe_route), and the CPU's routing on those logits. Experts 128
 * (Qwen3-MoE), 40 (a last column tile of 8) and 512 (the most: one row at a
 * time in the scratch); top 8 normalized, top 2 not; 1 to 40 rows; p > 1 on
 * a 16-SM emulator. */
static void moe_route_tc_case(rd_backend *const bes[3], int32_t E, int32_t D, int32_t M, int32_t K, int norm)
{
    float *w = malloc(sizeof(float) * E * D), *x = malloc(sizeof(float) * M * D), *nw = malloc(sizeof(float) * D);
    float *l[3], *wt[3];
    int32_t *id[3];
    for (int32_t i = 0; i < E * D; i++)
        w[i] = frand() * 0.5f;
    for (int32_t i = 0; i < M * D; i++)
        x[i] = frand() * 2.0f;
    fill_norm_weights(nw, D);
    uint64_t launched[3];
    for (int bi = 0; bi < 3; bi++) {
        rd_backend *be = bes[bi];
        l[bi] = malloc(sizeof(float) * M * E), wt[bi] = malloc(sizeof(float) * M * K);
        id[bi] = malloc(sizeof(int32_t) * M * K);
        void *W;
        CHECK_OK(be->ops->linear_load(be, w, E, D, &W));
        float *dx = up(be, x, sizeof(float) * M * D), *dn = up(be, nw, sizeof(float) * D);
        float *dxn = up(be, NULL, sizeof(float) * M * D), *dl = up(be, NULL, sizeof(float) * M * E);
        float *dw = up(be, NULL, sizeof(float) * M * K);
        int32_t *di = up(be, NULL, sizeof(int32_t) * M * K);
        float *poison = malloc(sizeof(float) * M * E);
        for (int32_t i = 0; i < M * E; i++)
            poison[i] = NAN;
        for (int rep = 0; rep < 2; rep++) { /* twice: the counters are back at zero */
            be->ops->h2d(be, dl, poison, sizeof(float) * M * E); /* a routing before all its logits shows */
            CHECK_OK(be->ops->sync(be));
            const uint64_t k0 = cuemu_launch_count();
            be->ops->rmsnorm(be, dx, dn, M, D, 1e-6f, 0.0f, dxn);
            be->ops->linear(be, W, dxn, M, dl, 0);
            be->ops->moe_route(be, dl, M, E, K, norm, di, dw);
            CHECK_OK(be->ops->sync(be));
            launched[bi] = cuemu_launch_count() - k0;
        }
        free(poison);
        CHECK_OK(down(be, l[bi], dl, sizeof(float) * M * E));
        CHECK_OK(down(be, id[bi], di, sizeof(int32_t) * M * K));
        CHECK_OK(down(be, wt[bi], dw, sizeof(float) * M * K));
        be->ops->free(be, dx), be->ops->free(be, dn), be->ops->free(be, dxn), be->ops->free(be, dl);
        be->ops->free(be, dw), be->ops->free(be, di);
        be->ops->linear_free(be, W);
    }
    for (int bi = 1; bi < 3; bi++)
        CHECK(!memcmp(l[0], l[bi], sizeof(float) * M * E) && !memcmp(id[0], id[bi], sizeof(int32_t) * M * K) &&
                  !memcmp(wt[0], wt[bi], sizeof(float) * M * K),
              "tc route, %d experts, top %d, %d rows: differs from %s", E, K, M,
              bi == 1 ? "RD_CUDA_FUSE=0" : "RD_CUDA_TC_ROUTE=0");
    CHECK(!on_emulator() || (launched[0] == (M <= 8 ? 1 : 2) && launched[2] == launched[0] + 1),
          "tc route, %d experts, %d rows: %llu kernels (RD_CUDA_TC_ROUTE=0: %llu)", E, M, (unsigned long long)launched[0],
          (unsigned long long)launched[2]);
    int32_t *ic = malloc(sizeof(int32_t) * M * K);
    float *wc = malloc(sizeof(float) * M * K);
    CHECK_OK(moe_route_on(cpu, l[0], M, E, K, norm, ic, wc));
    moe_route_compare("tc route", ic, wc, id[0], wt[0], M, K);
    free(ic), free(wc);
    for (int bi = 0; bi < 3; bi++)
        free(l[bi]), free(wt[bi]), free(id[bi]);
    free(w), free(x), free(nw);
}

static void test_moe_route_tc(void)
{
    int reductions[3] = {0, 0, 0}; /* q = 1, p = 1, p > 1 */
    for (int sms = 4; sms <= 16 && !test_case_failed; sms += 12) {
        rd_backend *bes[3];
        CHECK(tc_trio(bes, sms, "RD_CUDA_TC_ROUTE"), "cannot create the tc backends: %s", rd_errmsg());
        const int32_t real_sms = on_emulator() ? sms : dev_sms(bes[0]);
        const struct {
            int32_t E, D, M, K, norm, all_sms;
        } cases[] = {{128, 1024, 1, 8, 1, 1}, {40, 1024, 5, 2, 0, 1}, {40, 96, 3, 2, 1, 0},
                     {128, 64, 40, 8, 1, 0} /* 3 row tiles; no prologue */, {512, 32, 3, 8, 1, 0}};
        for (size_t i = 0; i < sizeof cases / sizeof cases[0] && !test_case_failed; i++) {
            if (sms != 4 && !cases[i].all_sms)
                continue;
            cuplan_tc pl;
            CHECK(cuplan_gemm_tc(cases[i].E, cases[i].D, real_sms, &pl) == 0, "plan");
            reductions[pl.q == 1 ? 0 : pl.p == 1 ? 1 : 2]++;
            moe_route_tc_case(bes, cases[i].E, cases[i].D, cases[i].M, cases[i].K, cases[i].norm);
        }
        tc_trio_free(bes);
    }
    CHECK(test_case_failed || !on_emulator() || (reductions[0] && reductions[1] && reductions[2]),
          "the cases miss a reduction: q = 1 x%d, p = 1 x%d, p > 1 x%d", reductions[0], reductions[1], reductions[2]);
}

/* Tensor-core mode, Gemma 3's post-norms: a projection (optionally with an
 * RMSNorm prologue) then rmsnorm_add on its output, the norm and the residual
 * add as the projection's finishing step (the last CTA of each row tile to
 * finish runs them on its rows): one kernel up to RD_CUDA_NORM_ROWS rows; the
 * projection's rows, the norm's output and the residual bit for bit those of
 * RD_CUDA_FUSE=0 and RD_CUDA_TC_NORMADD=0 (the GEMM, then k_rmsnorm with the
 * add); and against the host: out within 4e-7 relative of the norm of the
 * projection's rows computed here in double, y exactly y0 + out. Weights in
 * tc_wfmt's format; fused: whether the backends fuse it (W8A8 does not). */
static void tc_normadd_case(rd_backend *const bes[3], int32_t D, int32_t IN, int32_t M, float w_off, int prologue,
                            int fused)
{
    float *w = malloc(sizeof(float) * D * IN), *x = malloc(sizeof(float) * M * IN), *pw = malloc(sizeof(float) * IN);
    float *nw = malloc(sizeof(float) * D), *y0 = malloc(sizeof(float) * M * D);
    float *l[3], *o[3], *y[3];
    for (int64_t i = 0; i < (int64_t)D * IN; i++)
        w[i] = frand() * 0.3f;
    for (int32_t i = 0; i < M * IN; i++)
        x[i] = frand() * 2.0f;
    for (int32_t i = 0; i < M * D; i++)
        y0[i] = frand() * 4.0f;
    fill_norm_weights(pw, IN);
    if (w_off != 0.0f)
        fill_gemma_norm(nw, D);
    else
        fill_norm_weights(nw, D);
    uint64_t launched[3];
    for (int bi = 0; bi < 3; bi++) {
        rd_backend *be = bes[bi];
        l[bi] = malloc(sizeof(float) * M * D), o[bi] = malloc(sizeof(float) * M * D), y[bi] = malloc(sizeof(float) * M * D);
        void *W;
        CHECK_OK(load_w(be, w, D, IN, &W));
        if (test_case_failed)
            break;
        float *dx = up(be, x, sizeof(float) * M * IN), *dpw = up(be, pw, sizeof(float) * IN);
        float *dxn = up(be, NULL, sizeof(float) * M * IN), *dl = up(be, NULL, sizeof(float) * M * D);
        float *dnw = up(be, nw, sizeof(float) * D), *dout = up(be, NULL, sizeof(float) * M * D);
        float *dy = up(be, NULL, sizeof(float) * M * D);
        float *poison = malloc(sizeof(float) * M * D);
        for (int32_t i = 0; i < M * D; i++)
            poison[i] = NAN;
        for (int rep = 0; rep < 2; rep++) { /* twice: the counters are back at zero */
            be->ops->h2d(be, dl, poison, sizeof(float) * M * D); /* a norm before all its row shows */
            be->ops->h2d(be, dy, y0, sizeof(float) * M * D);
            CHECK_OK(be->ops->sync(be));
            const uint64_t k0 = cuemu_launch_count();
            if (prologue)
                be->ops->rmsnorm(be, dx, dpw, M, IN, 1e-6f, 0.0f, dxn);
            be->ops->linear(be, W, prologue ? dxn : dx, M, dl, 0);
            be->ops->rmsnorm_add(be, dl, dnw, M, D, 1e-6f, w_off, dout, dy);
            CHECK_OK(be->ops->sync(be));
            launched[bi] = cuemu_launch_count() - k0;
        }
        free(poison);
        CHECK_OK(down(be, l[bi], dl, sizeof(float) * M * D));
        CHECK_OK(down(be, o[bi], dout, sizeof(float) * M * D));
        CHECK_OK(down(be, y[bi], dy, sizeof(float) * M * D));
        be->ops->free(be, dx), be->ops->free(be, dpw), be->ops->free(be, dxn), be->ops->free(be, dl);
        be->ops->free(be, dnw), be->ops->free(be, dout), be->ops->free(be, dy);
        be->ops->linear_free(be, W);
    }
    const size_t nb = sizeof(float) * M * D;
    for (int bi = 1; bi < 3 && !test_case_failed; bi++)
        CHECK(!memcmp(l[0], l[bi], nb) && !memcmp(o[0], o[bi], nb) && !memcmp(y[0], y[bi], nb),
              "tc norm + add, [%d x %d] x %d rows (format %d): differs from %s", D, IN, M, tc_wfmt,
              bi == 1 ? "RD_CUDA_FUSE=0" : "RD_CUDA_TC_NORMADD=0");
    const int small = M <= 8; /* RD_CUDA_NORM_ROWS's default: the prologue and the finishing step */
    const uint64_t want = fused && small ? 1 : (uint64_t)(2 + (prologue && !small));
    CHECK(!on_emulator() || test_case_failed || (launched[0] == want && launched[2] == (uint64_t)(2 + (prologue && !small))),
          "tc norm + add, [%d x %d] x %d rows%s: %llu kernels (want %llu; RD_CUDA_TC_NORMADD=0: %llu)", D, IN, M,
          prologue ? ", with a prologue" : "", (unsigned long long)launched[0], (unsigned long long)want,
          (unsigned long long)launched[2]);
    double worst = 0;
    for (int32_t r = 0; r < M && !test_case_failed; r++) {
        double ss = 0;
        for (int32_t j = 0; j < D; j++)
            ss += (double)l[0][r * D + j] * l[0][r * D + j];
        const double inv = 1.0 / sqrt(ss / D + 1e-6);
        for (int32_t j = 0; j < D; j++) {
            const int64_t k = (int64_t)r * D + j;
            const double ref = (double)l[0][k] * inv * ((double)nw[j] + w_off);
            const double scale = fabs((double)l[0][k] * inv * ((double)nw[j] + w_off)) + 1e-30;
            worst = worse(worst, fabs(o[0][k] - ref) / scale);
            CHECK(y[0][k] == y0[k] + o[0][k], "tc norm + add: y[%d][%d] = %.9g is not y0 + out = %.9g + %.9g", r, j,
                  y[0][k], y0[k], o[0][k]);
            if (test_case_failed)
                break;
        }
    }
    CHECK(test_case_failed || worst <= 4e-7, "tc norm + add, [%d x %d] x %d rows: out is %.3g (relative) from the "
          "host's norm", D, IN, M, worst);
    for (int bi = 0; bi < 3; bi++)
        free(l[bi]), free(o[bi]), free(y[bi]);
    free(w), free(x), free(pw), free(nw), free(y0);
}

/* tc_normadd_case on each of the plan's reductions (a 4- and a 16-SM
 * emulator), Gemma 3 1B's o projection and 270M's down projection, widths
 * that leave a part-filled column tile and are no multiple of 256, one to 8
 * rows (and 9 and 20: past the bound, the two kernels), with and without a
 * prologue; Q8_0 and decoded-FP8 weights; W8A8 FP8 (not fused). */
static void test_gemm_tc_normadd(void)
{
    int reductions[3] = {0, 0, 0}; /* q = 1, p = 1, p > 1 */
    for (int sms = 4; sms <= 16 && !test_case_failed; sms += 12) {
        rd_backend *bes[3];
        CHECK(tc_trio(bes, sms, "RD_CUDA_TC_NORMADD"), "cannot create the tc backends: %s", rd_errmsg());
        const int32_t real_sms = on_emulator() ? sms : dev_sms(bes[0]);
        const struct {
            int32_t D, IN, M;
            float w_off;
            int prologue, all_sms;
        } cases[] = {{1152, 1024, 1, 1.0f, 0, 1} /* Gemma 3 1B's o */, {640, 2048, 5, 1.0f, 0, 1} /* 270M's down */,
                     {200, 96, 8, 0.0f, 1, 1}, {72, 64, 3, 1.0f, 1, 0}, {200, 96, 9, 1.0f, 1, 0},
                     {1152, 256, 20, 1.0f, 0, 0}, {192, 1024, 5, 0.0f, 1, 1} /* p > 1 on 16 SMs */,
                     {64, 128, 3, 1.0f, 0, 1} /* tiny-gemma3 */};
        for (size_t i = 0; i < sizeof cases / sizeof cases[0] && !test_case_failed; i++) {
            if (sms != 4 && !cases[i].all_sms)
                continue;
            cuplan_tc pl;
            CHECK(cuplan_gemm_tc(cases[i].D, cases[i].IN, real_sms, &pl) == 0, "plan");
            reductions[pl.q == 1 ? 0 : pl.p == 1 ? 1 : 2]++;
            tc_normadd_case(bes, cases[i].D, cases[i].IN, cases[i].M, cases[i].w_off, cases[i].prologue, 1);
        }
        tc_trio_free(bes);
    }
    CHECK(test_case_failed || !on_emulator() || (reductions[0] && reductions[1] && reductions[2]),
          "the cases miss a reduction: q = 1 x%d, p = 1 x%d, p > 1 x%d", reductions[0], reductions[1], reductions[2]);
    static const struct {
        const char *var, *val;
        int wfmt, fused;
    } fmts[] = {{"RD_CUDA_Q8", "tc", 2, 1}, {"RD_CUDA_FP8", "tc", 1, 1}, {"RD_CUDA_FP8", "w8a8", 1, 0}};
    for (size_t f = 0; f < sizeof fmts / sizeof fmts[0] && !test_case_failed; f++) {
        setenv(fmts[f].var, fmts[f].val, 1);
        rd_backend *bes[3];
        const int ok = tc_trio(bes, 4, "RD_CUDA_TC_NORMADD");
        unsetenv(fmts[f].var);
        CHECK(ok, "cannot create the %s=%s backends: %s", fmts[f].var, fmts[f].val, rd_errmsg());
        tc_wfmt = fmts[f].wfmt;
        if (!test_case_failed)
            tc_normadd_case(bes, 640, 1024, 3, 1.0f, 1, fmts[f].fused);
        tc_wfmt = 0;
        tc_trio_free(bes);
    }
}

/* One layer's experts on one backend: E SwiGLU experts loaded from host
 * weights gu [E][2f][d] and dn [E][d][f]. */
typedef struct {
    void **gu, **dn;
    rd_moe moe;
} moe_dev;

/* qgu/qdn non-NULL: the experts as those Q8_0 blocks (RD_CUDA_Q8=tc backends), else from gu/dn. */
static int moe_dev_load_as(rd_backend *be, const float *gu, const float *dn, const uint8_t *qgu, const uint8_t *qdn,
                           int32_t E, int32_t f, int32_t d, moe_dev *md)
{
    const size_t ngu = (size_t)2 * f * d, ndn = (size_t)d * f;
    md->gu = calloc((size_t)E, sizeof(void *));
    md->dn = calloc((size_t)E, sizeof(void *));
    md->moe = (rd_moe){.n_experts = E, .ffn = f, .dim = d, .gate_up = md->gu, .down = md->dn};
    if (!md->gu || !md->dn)
        return RD_ENOMEM;
    for (int32_t e = 0; e < E; e++) {
        rd_wpart pg = {.type = GGML_Q8_0, .rows = 2 * f, .data = qgu ? qgu + (size_t)e * ngu / 32 * 34 : NULL};
        rd_wpart pd = {.type = GGML_Q8_0, .rows = d, .data = qdn ? qdn + (size_t)e * ndn / 32 * 34 : NULL};
        int rc = qgu ? be->ops->linear_load_q(be, &pg, 1, d, &md->gu[e])
                     : be->ops->linear_load(be, gu + (size_t)e * ngu, 2 * f, d, &md->gu[e]);
        if (!rc)
            rc = qdn ? be->ops->linear_load_q(be, &pd, 1, f, &md->dn[e])
                     : be->ops->linear_load(be, dn + (size_t)e * ndn, d, f, &md->dn[e]);
        if (rc)
            return rc;
    }
    return 0;
}

static int moe_dev_load(rd_backend *be, const float *gu, const float *dn, int32_t E, int32_t f, int32_t d,
                        moe_dev *md)
{
    return moe_dev_load_as(be, gu, dn, NULL, NULL, E, f, d, md);
}

/* Frees md's handles and arrays without telling the backend (test_moe_release). */
static void moe_dev_drop(rd_backend *be, moe_dev *md)
{
    for (int32_t e = 0; md->gu && e < md->moe.n_experts; e++) {
        be->ops->linear_free(be, md->gu[e]);
        be->ops->linear_free(be, md->dn[e]);
    }
    free(md->gu), free(md->dn);
    memset(md, 0, sizeof *md);
}

/* As a model frees its experts: the backend's state for them first. */
static void moe_dev_free(rd_backend *be, moe_dev *md)
{
    if (md->gu && be->ops->moe_release)
        be->ops->moe_release(be, &md->moe);
    moe_dev_drop(be, md);
}

/* y = y0 + moe_ffn(x) for m rows on be, x placed x_off floats into its
 * buffer (x_off 1: not 16-byte aligned, the kernels' scalar loads). */
static int moe_ffn_on(rd_backend *be, const rd_moe *moe, const float *x, int32_t x_off, const int32_t *ids,
                      const float *w, int32_t m, int32_t k, const float *y0, float *y)
{
    const size_t xb = sizeof(float) * m * moe->dim, rb = (size_t)m * k * 4;
    float *dx = up(be, NULL, xb + sizeof(float) * x_off), *dy = up(be, y0, xb), *dw = up(be, w, rb);
    int32_t *di = up(be, ids, rb);
    int rc = be->ops->h2d(be, dx + x_off, x, xb);
    if (!rc) {
        be->ops->moe_ffn(be, moe, dx + x_off, di, dw, m, k, dy);
        rc = down(be, y, dy, xb);
    }
    be->ops->free(be, dx), be->ops->free(be, dy), be->ops->free(be, dw), be->ops->free(be, di);
    return rc;
}

/* A MoE case's host data: bf16-exact weights (so that the CPU backend, which
 * keeps fp32 weights, computes with the same ones), rows x and residual y0,
 * routes from random logits by the CPU's moe_route. */
typedef struct {
    int32_t E, f, d, k, m;
    float *gu, *dn, *x, *y0, *w;
    int32_t *ids;
} moe_case;

static int moe_case_make(moe_case *c, int32_t E, int32_t f, int32_t d, int32_t k, int32_t m)
{
    *c = (moe_case){.E = E, .f = f, .d = d, .k = k, .m = m};
    c->gu = malloc(sizeof(float) * E * 2 * f * d);
    c->dn = malloc(sizeof(float) * E * d * f);
    c->x = malloc(sizeof(float) * m * d);
    c->y0 = malloc(sizeof(float) * m * d);
    c->w = malloc(sizeof(float) * m * k);
    c->ids = malloc(sizeof(int32_t) * m * k);
    float *l = malloc(sizeof(float) * m * E);
    if (!c->gu || !c->dn || !c->x || !c->y0 || !c->w || !c->ids || !l) {
        free(l);
        return RD_ENOMEM;
    }
    for (int64_t i = 0; i < (int64_t)E * 2 * f * d; i++)
        c->gu[i] = bf(frand() * 0.3f);
    for (int64_t i = 0; i < (int64_t)E * d * f; i++)
        c->dn[i] = bf(frand() * 0.3f);
    for (int32_t i = 0; i < m * d; i++) {
        c->x[i] = frand() * 2.0f;
        c->y0[i] = frand();
    }
    for (int32_t i = 0; i < m * E; i++)
        l[i] = frand() * 3.0f;
    int rc = moe_route_on(cpu, l, m, E, k, 1, c->ids, c->w);
    free(l);
    return rc;
}

static void moe_case_free(moe_case *c)
{
    free(c->gu), free(c->dn), free(c->x), free(c->y0), free(c->w), free(c->ids);
    memset(c, 0, sizeof *c);
}

/* The double-precision result of c on its (bf16-exact) weights, and per
 * element the scale of its rounding errors: |y0| plus, over the routes, the
 * weight times the sum over the down products of |down| (|act| + the
 * magnitude the gate and up sums carry through the SwiGLU). */
static void moe_reference(const moe_case *c, double *yref, double *mag)
{
    const int32_t d = c->d, f = c->f;
    double *act = malloc(sizeof(double) * f), *amag = malloc(sizeof(double) * f);
    for (int32_t i = 0; i < c->m; i++) {
        for (int32_t t = 0; t < d; t++) {
            yref[(size_t)i * d + t] = c->y0[(size_t)i * d + t];
            mag[(size_t)i * d + t] = fabs(c->y0[(size_t)i * d + t]);
        }
        for (int32_t j = 0; j < c->k; j++) {
            const int32_t e = c->ids[i * c->k + j];
            const double wj = c->w[i * c->k + j];
            const float *xi = c->x + (size_t)i * d, *gu = c->gu + (size_t)e * 2 * f * d, *dn = c->dn + (size_t)e * d * f;
            for (int32_t o = 0; o < f; o++) {
                double g = 0, u = 0, gm = 0, um = 0;
                for (int32_t t = 0; t < d; t++) {
                    g += (double)xi[t] * gu[(size_t)o * d + t];
                    u += (double)xi[t] * gu[(size_t)(f + o) * d + t];
                    gm += fabs((double)xi[t] * gu[(size_t)o * d + t]);
                    um += fabs((double)xi[t] * gu[(size_t)(f + o) * d + t]);
                }
                const double s = 1.0 / (1.0 + exp(-g));
                act[o] = g * s * u;
                amag[o] = fabs(act[o]) + fabs(s * (1.0 + g * (1.0 - s)) * u) * gm + fabs(g * s) * um;
            }
            for (int32_t t = 0; t < d; t++) {
                double h = 0, hm = 0;
                for (int32_t o = 0; o < f; o++) {
                    h += act[o] * dn[(size_t)t * f + o];
                    hm += amag[o] * fabs(dn[(size_t)t * f + o]);
                }
                yref[(size_t)i * d + t] += wj * h;
                mag[(size_t)i * d + t] += fabs(wj) * hm;
            }
        }
    }
    free(act), free(amag);
}

/* Worst |y - yref| / mag over the case's outputs. */
static double moe_error(const moe_case *c, const float *y, const double *yref, const double *mag)
{
    double worst = 0;
    for (size_t i = 0; i < (size_t)c->m * c->d; i++)
        worst = worse(worst, fabs(y[i] - yref[i]) / (mag[i] + 1e-30));
    return worst;
}

/* moe_ffn on the device backend and the CPU backend against a double
 * reference on the same bf16 weights: fp32 sums in either order stay within
 * 1e-5 of the error scale (the GEMM tests' bound for split inputs is 2e-5).
 * Shapes: 8 experts of dim 64, ffn 32 at top 2 and 4; dim 50, ffn 27 (not
 * multiples of the 8-feature tile nor of the 8-element chunk: the tails and
 * the scalar loads); 128 experts at top 8 (Qwen3-MoE's routing). Every case
 * hits every expert (the first three) and shares experts between rows. */
static void test_moe_ffn(void)
{
    /* the last two: fewer routes than experts (the kernels launch a slot per route, not per expert) */
    static const int32_t shapes[][5] = {{8, 32, 64, 2, 33}, {8, 32, 64, 4, 33}, {5, 27, 50, 3, 21}, {128, 16, 64, 8, 24},
                                        {128, 16, 64, 8, 3}, {128, 16, 64, 8, 1}};
    double worst_dev = 0, worst_cpu = 0;
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        moe_case c;
        CHECK_OK(moe_case_make(&c, shapes[si][0], shapes[si][1], shapes[si][2], shapes[si][3], shapes[si][4]));
        int hits[128] = {0}, shared = 0;
        for (int32_t r = 0; r < c.m * c.k; r++)
            hits[c.ids[r]]++;
        for (int32_t e = 0; e < c.E; e++) {
            CHECK(c.E > 8 || hits[e] > 0, "case %zu: expert %d is never routed to (test too weak)", si, e);
            shared += hits[e] > 1;
        }
        CHECK(shared > 0 || c.m * c.k < c.E, "case %zu: no expert serves two rows (test too weak)", si);
        moe_dev mc, md;
        CHECK_OK(moe_dev_load(cpu, c.gu, c.dn, c.E, c.f, c.d, &mc));
        CHECK_OK(moe_dev_load(emu, c.gu, c.dn, c.E, c.f, c.d, &md));
        const size_t n = (size_t)c.m * c.d;
        float *yc = malloc(sizeof(float) * n), *yd = malloc(sizeof(float) * n);
        double *yref = malloc(sizeof(double) * n), *mag = malloc(sizeof(double) * n);
        CHECK_OK(moe_ffn_on(cpu, &mc.moe, c.x, 0, c.ids, c.w, c.m, c.k, c.y0, yc));
        CHECK_OK(moe_ffn_on(emu, &md.moe, c.x, 0, c.ids, c.w, c.m, c.k, c.y0, yd));
        moe_reference(&c, yref, mag);
        const double ed = moe_error(&c, yd, yref, mag), ec = moe_error(&c, yc, yref, mag);
        CHECK(ed < 1e-5, "%d experts, ffn %d, dim %d, top %d: device error %.3g vs the reference", c.E, c.f, c.d, c.k,
              ed);
        CHECK(ec < 1e-5, "%d experts, ffn %d, dim %d, top %d: CPU error %.3g vs the reference", c.E, c.f, c.d, c.k, ec);
        size_t changed = 0;
        for (size_t i = 0; i < n; i++)
            changed += yd[i] != c.y0[i];
        CHECK(changed > n / 2, "only %zu of %zu outputs changed", changed, n);
        worst_dev = worse(worst_dev, ed);
        worst_cpu = worse(worst_cpu, ec);
        moe_dev_free(cpu, &mc);
        moe_dev_free(emu, &md);
        free(yc), free(yd), free(yref), free(mag);
        moe_case_free(&c);
    }
    printf("# moe_ffn vs a double reference: device %.3g, CPU %.3g (relative to the error scale)\n", worst_dev,
           worst_cpu);
}

/* Experts as Q8_0 blocks (RD_CUDA_Q8=tc: the device keeps codes and fp16
 * scales; moe_ffn decodes code x d exactly): against a double reference on
 * the dequantized weights within the bf16 test's 1e-5 of the error scale,
 * as the CPU backend holding the same Q8_0 experts is; a bf16 copy of those
 * weights (the device without RD_CUDA_Q8) is more than 10 times further.
 * Each row alone equals it in the batch; half the experts Q8_0 and half bf16
 * in one layer serve each with its own format. */
static void moe_q8_case(rd_backend *q8, int32_t E, int32_t f, int32_t d, int32_t k, int32_t m)
{
    moe_case c;
    CHECK_OK(moe_case_make(&c, E, f, d, k, m));
    const size_t ngu = (size_t)2 * f * d, ndn = (size_t)d * f, n = (size_t)m * d;
    uint8_t *qgu = malloc((size_t)E * ngu / 32 * 34), *qdn = malloc((size_t)E * ndn / 32 * 34);
    CHECK_OK(ggml_quant_q8_0(c.gu, E * ngu, qgu));
    CHECK_OK(ggml_quant_q8_0(c.dn, E * ndn, qdn));
    CHECK_OK(ggml_dequant_row(GGML_Q8_0, qgu, c.gu, E * ngu)); /* the reference's weights: the Q8_0 values */
    CHECK_OK(ggml_dequant_row(GGML_Q8_0, qdn, c.dn, E * ndn));
    moe_dev mq = {0}, mc = {0}, mb = {0}, mx = {0};
    rd_backend *bes[3] = {q8, cpu, q8};
    moe_dev *mds[3] = {&mq, &mc, &mx};
    for (int b = 0; b < 3 && !test_case_failed; b++) {
        moe_dev *md = mds[b];
        rd_backend *be = bes[b];
        md->gu = calloc((size_t)E, sizeof(void *));
        md->dn = calloc((size_t)E, sizeof(void *));
        md->moe = (rd_moe){.n_experts = E, .ffn = f, .dim = d, .gate_up = md->gu, .down = md->dn};
        for (int32_t e = 0; e < E; e++) {
            rd_wpart pg = {.type = GGML_Q8_0, .rows = 2 * f, .data = qgu + (size_t)e * ngu / 32 * 34};
            rd_wpart pd = {.type = GGML_Q8_0, .rows = d, .data = qdn + (size_t)e * ndn / 32 * 34};
            if (b == 2 && e % 2) { /* mixed: odd experts from bf16 copies of the same values */
                CHECK_OK(be->ops->linear_load(be, c.gu + (size_t)e * ngu, 2 * f, d, &md->gu[e]));
                CHECK_OK(be->ops->linear_load(be, c.dn + (size_t)e * ndn, d, f, &md->dn[e]));
            } else {
                CHECK_OK(be->ops->linear_load_q(be, &pg, 1, d, &md->gu[e]));
                CHECK_OK(be->ops->linear_load_q(be, &pd, 1, f, &md->dn[e]));
            }
        }
    }
    CHECK_OK(moe_dev_load(emu, c.gu, c.dn, E, f, d, &mb));
    int64_t by[RD_WEIGHT_TYPES] = {0};
    if (!test_case_failed)
        q8->ops->linear_bytes_by_type(q8, mq.gu[0], by);
    CHECK(by[GGML_Q8_0] == (int64_t)(ngu / 32 * 34), "q8_0 expert: not held as Q8_0");
    float *yq = malloc(sizeof(float) * n), *yc = malloc(sizeof(float) * n), *yb = malloc(sizeof(float) * n);
    float *yx = malloc(sizeof(float) * n), *y1 = malloc(sizeof(float) * d), *yxr = malloc(sizeof(float) * n);
    double *yref = malloc(sizeof(double) * n), *mag = malloc(sizeof(double) * n);
    if (!test_case_failed) {
        CHECK_OK(moe_ffn_on(q8, &mq.moe, c.x, 0, c.ids, c.w, m, k, c.y0, yq));
        CHECK_OK(moe_ffn_on(cpu, &mc.moe, c.x, 0, c.ids, c.w, m, k, c.y0, yc));
        CHECK_OK(moe_ffn_on(emu, &mb.moe, c.x, 0, c.ids, c.w, m, k, c.y0, yb));
        CHECK_OK(moe_ffn_on(q8, &mx.moe, c.x, 0, c.ids, c.w, m, k, c.y0, yx));
        CHECK_OK(moe_ffn_on(q8, &mq.moe, c.x + (size_t)(m - 1) * d, 1, c.ids + (m - 1) * k, c.w + (m - 1) * k, 1, k,
                            c.y0 + (size_t)(m - 1) * d, y1));
        CHECK(!memcmp(y1, yq + (size_t)(m - 1) * d, sizeof(float) * d), "q8_0 experts: the last row alone differs");
        moe_reference(&c, yref, mag);
        const double eq = moe_error(&c, yq, yref, mag), ec = moe_error(&c, yc, yref, mag);
        const double eb = moe_error(&c, yb, yref, mag);
        /* mixed: the reference with the odd experts' weights rounded to bf16 */
        for (int32_t e = 1; e < E; e += 2) {
            for (size_t i = 0; i < ngu; i++)
                c.gu[(size_t)e * ngu + i] = bf(c.gu[(size_t)e * ngu + i]);
            for (size_t i = 0; i < ndn; i++)
                c.dn[(size_t)e * ndn + i] = bf(c.dn[(size_t)e * ndn + i]);
        }
        double *xref = malloc(sizeof(double) * n), *xmag = malloc(sizeof(double) * n);
        moe_reference(&c, xref, xmag);
        const double ex = moe_error(&c, yx, xref, xmag);
        free(xref), free(xmag);
        printf("# moe_ffn, %d Q8_0 experts (ffn %d, dim %d, top %d, %d rows) vs a double reference on their values: "
               "device %.3g, CPU %.3g, a bf16 copy %.3g; half Q8_0, half bf16: %.3g\n", E, f, d, k, m, eq, ec, eb, ex);
        CHECK(eq < 1e-5 && ec < 1e-5, "q8_0 experts: device %.3g, CPU %.3g from the reference", eq, ec);
        CHECK(eb > 10 * eq, "q8_0 experts: a bf16 copy (%.3g) is no further than Q8_0 held (%.3g)", eb, eq);
        CHECK(ex < 1e-5, "mixed experts: %.3g from the reference", ex);
    }
    moe_dev_free(q8, &mq), moe_dev_free(cpu, &mc), moe_dev_free(emu, &mb), moe_dev_free(q8, &mx);
    free(yq), free(yc), free(yb), free(yx), free(y1), free(yxr), free(yref), free(mag), free(qgu), free(qdn);
    moe_case_free(&c);
}

static void test_moe_ffn_q8(void)
{
    setenv("RD_CUDA_Q8", "tc", 1);
    rd_backend *q8 = NULL;
    CHECK_OK(rd_backend_create(dev_name(), 1, &q8));
    unsetenv("RD_CUDA_Q8");
    if (!test_case_failed) moe_q8_case(q8, 8, 32, 64, 2, 33);
    if (!test_case_failed) moe_q8_case(q8, 128, 32, 64, 8, 3); /* fewer routes than experts */
    if (q8) rd_backend_destroy(q8);
}

/* moe_release: a layer's experts loaded, used once (which writes their
 * device table) and freed, six times over, as a daemon does when its weights
 * are released and resumed each training step. On the emulator the live
 * device allocations must come back to the same count after each of the five
 * cycles that release, and the last cycle, which does not, must leave exactly
 * one more (the table: so the check sees it), which a release after its
 * arrays are freed takes back. Every cycle's output equals
 * the first's bit for bit: a fresh table at arrays that may sit where the
 * freed ones did serves the right experts. */
static void test_moe_release(void)
{
    CHECK(emu->ops->moe_release != NULL, "%s has no moe_release", dev_name());
    if (!emu->ops->moe_release)
        return;
    moe_case c;
    CHECK_OK(moe_case_make(&c, 8, 32, 64, 2, 9));
    const size_t n = (size_t)c.m * c.d;
    float *y0 = malloc(sizeof(float) * n), *y = malloc(sizeof(float) * n);
    int64_t base = 0;
    for (int cycle = 0; cycle < 6; cycle++) {
        moe_dev md;
        CHECK_OK(moe_dev_load(emu, c.gu, c.dn, c.E, c.f, c.d, &md));
        CHECK_OK(moe_ffn_on(emu, &md.moe, c.x, 0, c.ids, c.w, c.m, c.k, c.y0, cycle ? y : y0));
        if (cycle)
            CHECK(!memcmp(y, y0, sizeof(float) * n), "cycle %d: moe_ffn after %d release cycles differs", cycle, cycle);
        const int release = cycle != 5;
        const rd_moe keys = md.moe; /* the table is found by the arrays' addresses alone */
        if (release)
            moe_dev_free(emu, &md);
        else
            moe_dev_drop(emu, &md);
        const int64_t live = cuemu_live_allocs();
        if (!release) {
            /* released late, after the arrays were freed: no stale table is left for later cases */
            emu->ops->moe_release(emu, &keys);
            if (on_emulator()) {
                CHECK(live == base + 1, "cycle %d (no release): %lld allocations live, want the first cycle's "
                      "%lld + 1 (the table)", cycle, (long long)live, (long long)base);
                CHECK(cuemu_live_allocs() == base, "the late release left %lld allocations live, want %lld",
                      (long long)cuemu_live_allocs(), (long long)base);
            }
        } else if (cycle == 0) {
            base = live; /* the first call also grew moe_ffn's scratch, which stays */
        } else if (on_emulator()) {
            CHECK(live == base, "cycle %d: %lld device allocations live after release, %lld after the first cycle",
                  cycle, (long long)live, (long long)base);
        }
    }
    free(y0), free(y);
    moe_case_free(&c);
}

/* The same through the model: tiny-moe-bf16 on the device, its weights
 * dropped and read back three times (what /release_memory_occupation and
 * /resume_memory_occupation do), the runner rebound: each prefill's logits
 * equal the first's bit for bit and, on the emulator, the live device
 * allocations stay where the first prefill left them (model.c frees the
 * experts' tables with their handle arrays). */
static void test_moe_model_release(void)
{
    rd_loaded le;
    if (!load_model("tiny-moe-bf16", dev_name(), &le)) {
        CHECK(0, "cannot load tiny-moe-bf16 (run tests/gen_testdata.sh): %s", rd_errmsg());
        return;
    }
    const int32_t V = le.m->cfg.vocab, NS = 2;
    int32_t lens[2] = {11, 6}, base[2] = {0, 4}, t0[16], t1[16];
    for (int i = 0; i < 16; i++)
        t0[i] = (int32_t)(rnd() % V), t1[i] = (int32_t)(rnd() % V);
    const int32_t *toks[2] = {t0, t1};
    const size_t lb = sizeof(float) * 17 * V;
    float *first = malloc(lb), *again = malloc(lb);
    runner r;
    CHECK_OK(runner_init(&r, le.m, 16, 16, 64, 64));
    CHECK_OK(prefill(&r, toks, lens, NS, base, 0, first));
    const int64_t live0 = on_emulator() ? cuemu_live_allocs() : 0;
    char path[512];
    snprintf(path, sizeof path, "%s/tiny-moe-bf16.gguf", testdata());
    for (int cycle = 1; cycle <= 3 && !test_case_failed; cycle++) {
        model_drop_weights(le.m);
        model *fresh;
        CHECK_OK(rd_read_weights(&le, path, 1, &fresh));
        CHECK_OK(model_adopt(le.m, fresh));
        runner_rebind(&r);
        CHECK_OK(prefill(&r, toks, lens, NS, base, 0, again));
        CHECK(!memcmp(first, again, lb), "cycle %d: the logits after the weights came back differ", cycle);
        if (on_emulator())
            CHECK(cuemu_live_allocs() == live0, "cycle %d: %lld device allocations live, %lld before the first drop",
                  cycle, (long long)cuemu_live_allocs(), (long long)live0);
    }
    runner_free(&r);
    rd_unload(&le);
    free(first), free(again);
}

/* A row's bits on the device backend do not depend on its batch: row r of a
 * 33-row batch equals the row alone (m = 1, its experts serving no other
 * row), the row inside 5 rows of other data, the row from an x that is not
 * 16-byte aligned (scalar loads), and the batch under RD_CUDA_ACT=bf16 (the
 * experts take fp32 activations in every mode). Also the kernels per call. */
static void test_moe_batch_invariance(void)
{
    static const int32_t shapes[][5] = {{8, 32, 64, 4, 33}, {5, 27, 50, 3, 33}};
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        const int32_t E = shapes[si][0], f = shapes[si][1], d = shapes[si][2], k = shapes[si][3], M = shapes[si][4];
        moe_case c, o;
        CHECK_OK(moe_case_make(&c, E, f, d, k, M));
        CHECK_OK(moe_case_make(&o, E, f, d, k, 5)); /* the neighbours: other rows, other routes */
        moe_dev md, mb;
        CHECK_OK(moe_dev_load(emu, c.gu, c.dn, E, f, d, &md));
        CHECK_OK(moe_dev_load(emu_bf16, c.gu, c.dn, E, f, d, &mb));
        float *y = malloc(sizeof(float) * M * d), *yb = malloc(sizeof(float) * M * d), *y1 = malloc(sizeof(float) * 5 * d);
        const uint64_t k0 = cuemu_launch_count();
        CHECK_OK(moe_ffn_on(emu, &md.moe, c.x, 0, c.ids, c.w, M, k, c.y0, y));
        const uint64_t first = cuemu_launch_count() - k0;
        CHECK_OK(moe_ffn_on(emu, &md.moe, c.x, 0, c.ids, c.w, M, k, c.y0, yb));
        const uint64_t second = cuemu_launch_count() - k0 - first;
        if (on_emulator())
            CHECK(first == 5 && second == 4, "moe_ffn launched %llu kernels, then %llu (want 5 with the expert "
                  "table, then 4)", (unsigned long long)first, (unsigned long long)second);
        CHECK(!memcmp(y, yb, sizeof(float) * M * d), "moe_ffn twice on the same rows differs");
        CHECK_OK(moe_ffn_on(emu_bf16, &mb.moe, c.x, 0, c.ids, c.w, M, k, c.y0, yb));
        CHECK(!memcmp(y, yb, sizeof(float) * M * d), "moe_ffn under RD_CUDA_ACT=bf16 differs from the default");
        const int32_t rows[] = {0, 7, M - 1};
        for (size_t ri = 0; ri < sizeof rows / sizeof rows[0]; ri++) {
            const int32_t r = rows[ri];
            const float *yr = y + (size_t)r * d;
            CHECK_OK(moe_ffn_on(emu, &md.moe, c.x + (size_t)r * d, 0, c.ids + r * k, c.w + r * k, 1, k,
                                c.y0 + (size_t)r * d, y1));
            CHECK(!memcmp(y1, yr, sizeof(float) * d), "shape %zu: row %d alone differs from the row in %d", si, r, M);
            CHECK_OK(moe_ffn_on(emu, &md.moe, c.x + (size_t)r * d, 1, c.ids + r * k, c.w + r * k, 1, k,
                                c.y0 + (size_t)r * d, y1));
            CHECK(!memcmp(y1, yr, sizeof(float) * d), "shape %zu: row %d from an unaligned x differs", si, r);
            /* row r at place 2 of 5 rows of other data */
            memcpy(o.x + 2 * d, c.x + (size_t)r * d, sizeof(float) * d);
            memcpy(o.y0 + 2 * d, c.y0 + (size_t)r * d, sizeof(float) * d);
            memcpy(o.ids + 2 * k, c.ids + r * k, sizeof(int32_t) * k);
            memcpy(o.w + 2 * k, c.w + r * k, sizeof(float) * k);
            CHECK_OK(moe_ffn_on(emu, &md.moe, o.x, 0, o.ids, o.w, 5, k, o.y0, y1));
            CHECK(!memcmp(y1 + 2 * d, yr, sizeof(float) * d), "shape %zu: row %d among 5 other rows differs", si, r);
        }
        moe_dev_free(emu, &md);
        moe_dev_free(emu_bf16, &mb);
        free(y), free(yb), free(y1);
        moe_case_free(&c);
        moe_case_free(&o);
    }
}

/* Small batches: up to 64 routes the expert kernels sort the ids in-block
 * (no k_moe_sort), up to 32 rows the down kernel's last blocks combine (no
 * k_moe_combine). Against RD_CUDA_FUSE=0 (the four kernels), bit for bit:
 * batch 1 to 40 rows at Qwen3-MoE's routing (128 experts, top 8) across
 * both limits, dims that are not multiples of the 8-feature tile (a last
 * tile of 2), an unaligned x (scalar loads), routes to ids outside [0, E)
 * (they route nowhere), two experts' routes in one row, bf16 and Q8_0
 * experts, and each call twice (the arrival counters are reset). Also the
 * kernels per call, and the error against the double reference. */
static void test_moe_small_fused(void)
{
    static const int32_t shapes[][5] = {{128, 32, 64, 8, 1}, {128, 32, 64, 8, 3}, {128, 32, 64, 8, 8},
                                        {128, 32, 64, 8, 9}, {128, 32, 64, 8, 40}, {5, 27, 50, 3, 2},
                                        {8, 32, 64, 2, 7}};
    rd_backend *nofuse = dev_with("RD_CUDA_FUSE", "0", NULL, NULL);
    rd_backend *q8 = dev_with("RD_CUDA_Q8", "tc", NULL, NULL), *q8nf = dev_with("RD_CUDA_Q8", "tc", "RD_CUDA_FUSE", "0");
    CHECK(nofuse && q8 && q8nf, "cannot create the RD_CUDA_FUSE=0 / RD_CUDA_Q8=tc backends: %s", rd_errmsg());
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0] && !test_case_failed; si++) {
        const int32_t E = shapes[si][0], f = shapes[si][1], d = shapes[si][2], k = shapes[si][3], m = shapes[si][4];
        const int32_t routes = m * k;
        moe_case c;
        CHECK_OK(moe_case_make(&c, E, f, d, k, m));
        if (si == 2) { /* nowhere: an id past the experts and a negative one; row 1 routes twice to one expert */
            c.ids[3] = E;
            c.ids[k + 5] = -1;
            c.ids[2 * k + 1] = c.ids[2 * k];
        }
        const size_t n = (size_t)m * d;
        float *yf = malloc(sizeof(float) * n), *yn = malloc(sizeof(float) * n);
        double *yref = malloc(sizeof(double) * n), *mag = malloc(sizeof(double) * n);
        moe_dev mf, mn;
        CHECK_OK(moe_dev_load(emu, c.gu, c.dn, E, f, d, &mf));
        CHECK_OK(moe_dev_load(nofuse, c.gu, c.dn, E, f, d, &mn));
        const int want = (routes <= 64 ? 0 : 1) + 1 + 1 + (m <= 32 ? 0 : 1);
        for (int x_off = 0; x_off <= 1 && !test_case_failed; x_off++) {
            CHECK_OK(moe_ffn_on(nofuse, &mn.moe, c.x, x_off, c.ids, c.w, m, k, c.y0, yn));
            for (int rep = 0; rep < 2; rep++) {
                const uint64_t k0 = cuemu_launch_count();
                CHECK_OK(moe_ffn_on(emu, &mf.moe, c.x, x_off, c.ids, c.w, m, k, c.y0, yf));
                const uint64_t got = cuemu_launch_count() - k0;
                if (on_emulator() && (rep || x_off))
                    CHECK(got == (uint64_t)want, "%d experts, top %d, %d rows: moe_ffn launched %llu kernels, "
                          "want %d", E, k, m, (unsigned long long)got, want);
                CHECK(!memcmp(yf, yn, sizeof(float) * n), "%d experts (ffn %d, dim %d), top %d, %d rows, x offset "
                      "%d, call %d: the fused kernels differ from RD_CUDA_FUSE=0", E, f, d, k, m, x_off, rep + 1);
            }
        }
        if (si != 2) {
            moe_reference(&c, yref, mag);
            const double err = moe_error(&c, yf, yref, mag);
            CHECK(err < 1e-5, "shape %zu: %.3g from the double reference", si, err);
        }
        moe_dev_free(emu, &mf);
        moe_dev_free(nofuse, &mn);
        if (f % 32 == 0 && d % 32 == 0 && !test_case_failed) {
            const size_t ngu = (size_t)E * 2 * f * d, ndn = (size_t)E * d * f;
            uint8_t *qgu = malloc(ngu / 32 * 34), *qdn = malloc(ndn / 32 * 34);
            CHECK_OK(ggml_quant_q8_0(c.gu, ngu, qgu));
            CHECK_OK(ggml_quant_q8_0(c.dn, ndn, qdn));
            moe_dev qf, qn;
            CHECK_OK(moe_dev_load_as(q8, NULL, NULL, qgu, qdn, E, f, d, &qf));
            CHECK_OK(moe_dev_load_as(q8nf, NULL, NULL, qgu, qdn, E, f, d, &qn));
            CHECK_OK(moe_ffn_on(q8, &qf.moe, c.x, 0, c.ids, c.w, m, k, c.y0, yf));
            CHECK_OK(moe_ffn_on(q8nf, &qn.moe, c.x, 0, c.ids, c.w, m, k, c.y0, yn));
            CHECK(!memcmp(yf, yn, sizeof(float) * n), "Q8_0 experts, %d rows: the fused kernels differ from "
                  "RD_CUDA_FUSE=0", m);
            moe_dev_free(q8, &qf);
            moe_dev_free(q8nf, &qn);
            free(qgu), free(qdn);
        }
        free(yf), free(yn), free(yref), free(mag);
        moe_case_free(&c);
    }
    if (nofuse) rd_backend_destroy(nofuse);
    if (q8) rd_backend_destroy(q8);
    if (q8nf) rd_backend_destroy(q8nf);
}

/* The tensor-core experts (RD_CUDA_MOE=tc) at small batches: up to
 * MOE_SORT_ROUTES routes (and no more than a block of either plan has
 * threads: 40 routes on ffn 32's one warp take the sort kernel) each CTA
 * finds its work entry and its routes from the ids, and up
 * to 32 rows the down kernel's last CTA of each column tile sums the routes:
 * 2 launches at batch 1 where there were 4. Bit for bit RD_CUDA_FUSE=0 (the
 * sort and combine kernels), each call twice (the arrival counters reset),
 * bf16 and Q8_0 experts, an id past the experts, a negative one and a row
 * routed twice to one expert; within 4e-5 of the double reference. */
static void test_moe_small_fused_tc(void)
{
    static const int32_t shapes[][5] = {{16, 128, 256, 8, 1}, {16, 128, 256, 8, 3}, {16, 128, 256, 8, 8},
                                        {16, 128, 256, 8, 9}, {8, 32, 64, 2, 7},     {128, 32, 64, 8, 40},
                                        {4, 64, 128, 2, 33},    {8, 32, 64, 8, 5}};
    rd_backend *be[4] = {NULL, NULL, NULL, NULL}; /* bf16 fused, unfused; Q8_0 fused, unfused */
    for (int i = 0; i < 4; i++) {
        setenv("RD_CUDA_MOE", "tc", 1);
        if (i >= 2)
            setenv("RD_CUDA_Q8", "tc", 1);
        be[i] = dev_with("RD_CUDA_FUSE", i % 2 ? "0" : "1", NULL, NULL);
        unsetenv("RD_CUDA_MOE");
        unsetenv("RD_CUDA_Q8");
    }
    CHECK(be[0] && be[1] && be[2] && be[3], "cannot create the RD_CUDA_MOE=tc backends: %s", rd_errmsg());
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0] && !test_case_failed; si++) {
        const int32_t E = shapes[si][0], f = shapes[si][1], d = shapes[si][2], k = shapes[si][3], m = shapes[si][4];
        const int32_t routes = m * k;
        cuplan_tc pg, pd;
        CHECK_OK(cuplan_moe_tc(d, &pg));
        CHECK_OK(cuplan_moe_tc(f, &pd));
        const int sort = routes <= 64 && routes <= 32 * pg.wk && routes <= 32 * pd.wk;
        const int want = (sort ? 0 : 1) + 2 + (m <= 32 ? 0 : 1);
        moe_case c;
        CHECK_OK(moe_case_make(&c, E, f, d, k, m));
        if (si == 1) { /* nowhere: an id past the experts and a negative one; row 2 routes twice to one expert */
            c.ids[3] = E;
            c.ids[k + 5] = -1;
            c.ids[2 * k + 1] = c.ids[2 * k];
        }
        const size_t n = (size_t)m * d, ngu = (size_t)E * 2 * f * d, ndn = (size_t)E * d * f;
        float *yf = malloc(sizeof(float) * n), *yn = malloc(sizeof(float) * n);
        double *yref = malloc(sizeof(double) * n), *mag = malloc(sizeof(double) * n);
        uint8_t *qgu = malloc(ngu / 32 * 34), *qdn = malloc(ndn / 32 * 34);
        CHECK_OK(ggml_quant_q8_0(c.gu, ngu, qgu));
        CHECK_OK(ggml_quant_q8_0(c.dn, ndn, qdn));
        for (int q = 0; q < 2 && !test_case_failed; q++) {
            moe_dev mf, mn;
            CHECK_OK(moe_dev_load_as(be[2 * q], q ? NULL : c.gu, q ? NULL : c.dn, q ? qgu : NULL, q ? qdn : NULL, E,
                                     f, d, &mf));
            CHECK_OK(moe_dev_load_as(be[2 * q + 1], q ? NULL : c.gu, q ? NULL : c.dn, q ? qgu : NULL,
                                     q ? qdn : NULL, E, f, d, &mn));
            CHECK_OK(moe_ffn_on(be[2 * q + 1], &mn.moe, c.x, 0, c.ids, c.w, m, k, c.y0, yn));
            for (int rep = 0; rep < 2 && !test_case_failed; rep++) {
                const uint64_t k0 = cuemu_launch_count();
                CHECK_OK(moe_ffn_on(be[2 * q], &mf.moe, c.x, 0, c.ids, c.w, m, k, c.y0, yf));
                const uint64_t got = cuemu_launch_count() - k0;
                if (on_emulator() && rep)
                    CHECK(got == (uint64_t)want, "tc%s: %d experts, top %d, %d rows: moe_ffn launched %llu kernels, "
                          "want %d", q ? " Q8_0" : "", E, k, m, (unsigned long long)got, want);
                CHECK(!memcmp(yf, yn, sizeof(float) * n), "tc%s: %d experts (ffn %d, dim %d), top %d, %d rows, call "
                      "%d: the fused kernels differ from RD_CUDA_FUSE=0", q ? " Q8_0" : "", E, f, d, k, m, rep + 1);
            }
            if (si != 1 && q == 0) {
                moe_reference(&c, yref, mag);
                const double err = moe_error(&c, yf, yref, mag);
                CHECK(err < 4e-5, "tc, shape %zu: %.3g from the double reference", si, err);
            }
            moe_dev_free(be[2 * q], &mf);
            moe_dev_free(be[2 * q + 1], &mn);
        }
        printf("# moe_ffn, RD_CUDA_MOE=tc, %d experts (ffn %d, dim %d), top %d, %d rows: %d launches (sort %s, "
               "combine %s), bit for bit RD_CUDA_FUSE=0\n", E, f, d, k, m, want, sort ? "in-block" : "kernel",
               m <= 32 ? "in down" : "kernel");
        free(yf), free(yn), free(yref), free(mag), free(qgu), free(qdn);
        moe_case_free(&c);
    }
    for (int i = 0; i < 4; i++)
        if (be[i])
            rd_backend_destroy(be[i]);
}

/* moe_route and moe_ffn inside a graph capture: the replay equals the eager
 * run, and reads the buffers' contents at launch (new rows, same graph); a
 * handle replaced between the eager run and the capture (a weight swap) is
 * picked up inside the capture; experts first seen during a capture fail it
 * cleanly, and the backend goes on. */
static void moe_graph_case(rd_backend *be)
{
    enum { E = 8, f = 32, d = 64, k = 2, M = 5 };
    moe_case c;
    CHECK_OK(moe_case_make(&c, E, f, d, k, M));
    float *l = malloc(sizeof(float) * M * E), *l2 = malloc(sizeof(float) * M * E), *x2 = malloc(sizeof(float) * M * d);
    for (int32_t i = 0; i < M * E; i++) {
        l[i] = frand() * 3.0f;
        l2[i] = frand() * 3.0f;
    }
    for (int32_t i = 0; i < M * d; i++)
        x2[i] = frand() * 2.0f;
    moe_dev md;
    CHECK_OK(moe_dev_load(be, c.gu, c.dn, E, f, d, &md));
    const size_t xb = sizeof(float) * M * d, rb = (size_t)M * k * 4;
    float *dl = up(be, l, sizeof(float) * M * E), *dx = up(be, c.x, xb), *dy = up(be, c.y0, xb);
    float *dw = up(be, NULL, rb);
    int32_t *di = up(be, NULL, rb);
    float *want = malloc(xb), *got = malloc(xb), *pre = malloc(xb), *gneg = malloc(sizeof(float) * 2 * f * d);
    int32_t ids_want[M * k], ids_got[M * k], zeros[M * k];
    memset(zeros, 0, sizeof zeros);
    void *g;
    /* y = y0 + the experts of x routed by l, eagerly, then captured and replayed */
#define MOE_STEP() (be->ops->moe_route(be, dl, M, E, k, 1, di, dw), be->ops->moe_ffn(be, &md.moe, dx, di, dw, M, k, dy))
    MOE_STEP();
    CHECK_OK(down(be, want, dy, xb));
    CHECK_OK(down(be, ids_want, di, rb));
    CHECK_OK(be->ops->h2d(be, dy, c.y0, xb));
    CHECK_OK(be->ops->graph_begin(be));
    MOE_STEP();
    CHECK_OK(be->ops->graph_end(be, &g));
    CHECK_OK(be->ops->h2d(be, di, zeros, rb)); /* the replay must route again */
    CHECK_OK(be->ops->graph_launch(be, g));
    CHECK_OK(down(be, got, dy, xb));
    CHECK_OK(down(be, ids_got, di, rb));
    CHECK(!memcmp(ids_got, ids_want, rb), "the graph's routes differ from the eager ones");
    CHECK(!memcmp(got, want, xb), "the graph's experts differ from the eager run");
    /* new logits and rows, the same graph: equal to an eager run on them */
    CHECK_OK(be->ops->h2d(be, dl, l2, sizeof(float) * M * E));
    CHECK_OK(be->ops->h2d(be, dx, x2, xb));
    CHECK_OK(be->ops->h2d(be, dy, c.y0, xb));
    CHECK_OK(be->ops->graph_launch(be, g));
    CHECK_OK(down(be, got, dy, xb));
    CHECK_OK(be->ops->h2d(be, dy, c.y0, xb));
    MOE_STEP();
    CHECK_OK(down(be, pre, dy, xb));
    CHECK(!memcmp(got, pre, xb), "a replay on new rows differs from the eager run on them");
    be->ops->graph_free(be, g);
    /* A weight swap: every expert's gate|up handle replaced by one of the
     * negated weights (silu(-g) (-u) != silu(g) u), then a capture with no
     * eager call between: the capture itself must pick up the new handles. */
    for (int32_t e = 0; e < E; e++) {
        for (int32_t i = 0; i < 2 * f * d; i++)
            gneg[i] = -c.gu[(size_t)e * 2 * f * d + i];
        void *old = md.gu[e];
        CHECK_OK(be->ops->linear_load(be, gneg, 2 * f, d, &md.gu[e]));
        be->ops->linear_free(be, old);
    }
    CHECK_OK(be->ops->h2d(be, dy, c.y0, xb));
    CHECK_OK(be->ops->graph_begin(be));
    MOE_STEP();
    CHECK_OK(be->ops->graph_end(be, &g));
    CHECK_OK(be->ops->graph_launch(be, g));
    CHECK_OK(down(be, got, dy, xb));
    be->ops->graph_free(be, g);
    CHECK_OK(be->ops->h2d(be, dy, c.y0, xb));
    MOE_STEP();
    CHECK_OK(down(be, want, dy, xb));
    CHECK(!memcmp(got, want, xb), "after a weight swap, the graph's experts differ from the eager run");
    CHECK(memcmp(want, pre, xb) != 0, "the weight swap changed no output (test too weak)");
    /* experts never called outside a capture: the capture fails with a message, and the backend goes on.
     * The backend finds an expert table by the address of the moe's handle arrays; arrays calloc'd here
     * can land where an earlier case's freed ones were, whose table is still kept (and would be found
     * and rewritten, which a capture may do), so the handles are copied into static arrays that no call
     * has seen. */
    moe_dev fresh;
    CHECK_OK(moe_dev_load(be, c.gu, c.dn, E, f, d, &fresh));
    static void *fresh_gu[E], *fresh_dn[E];
    memcpy(fresh_gu, fresh.gu, sizeof fresh_gu);
    memcpy(fresh_dn, fresh.dn, sizeof fresh_dn);
    rd_moe unseen = fresh.moe;
    unseen.gate_up = fresh_gu;
    unseen.down = fresh_dn;
    CHECK_OK(be->ops->h2d(be, dy, c.y0, xb));
    CHECK_OK(be->ops->graph_begin(be));
    be->ops->moe_ffn(be, &unseen, dx, di, dw, M, k, dy);
    int rc = be->ops->graph_end(be, &g);
    CHECK(rc < 0 && strstr(rd_errmsg(), "graph capture"), "a capture with experts first seen in it: %d (%s)", rc,
          rd_errmsg());
    be->ops->moe_ffn(be, &unseen, dx, di, dw, M, k, dy);
    CHECK_OK(down(be, got, dy, xb));
    CHECK(memcmp(got, c.y0, xb) != 0, "moe_ffn after the failed capture changed nothing");
#undef MOE_STEP
    moe_dev_free(be, &fresh);
    moe_dev_free(be, &md);
    be->ops->free(be, dl), be->ops->free(be, dx), be->ops->free(be, dy), be->ops->free(be, dw), be->ops->free(be, di);
    free(l), free(l2), free(x2), free(want), free(got), free(pre), free(gneg);
    moe_case_free(&c);
}

static void test_moe_graph(void) { moe_graph_case(emu); }

/* The same with the four kernels (RD_CUDA_FUSE=0); test_moe_graph runs the fused ones (10 routes). */
static void test_moe_graph_nofuse(void)
{
    rd_backend *nofuse = dev_with("RD_CUDA_FUSE", "0", NULL, NULL);
    CHECK(nofuse != NULL, "cannot create an RD_CUDA_FUSE=0 backend: %s", rd_errmsg());
    if (nofuse) {
        moe_graph_case(nofuse);
        rd_backend_destroy(nofuse);
    }
}

/* ------------------------------------------------------------------ the experts on tensor cores */

/* One expert call's routes recomputed through the backend's dense ops: for
 * each expert, its routes' rows of x stacked, the gate|up linear, swiglu,
 * the down linear (the tensor-core GEMM under RD_CUDA_GEMM=tc, or Q8_0's),
 * then y = y0 + fmaf over j of w_j h_j from 0, as k_moe_combine sums. */
static void moe_dense_on(rd_backend *be, const moe_dev *md, const moe_case *c, float *y)
{
    const int32_t d = c->d, f = c->f, R = c->m * c->k;
    float *h = calloc((size_t)R * d, sizeof(float)), *xs = malloc(sizeof(float) * (size_t)R * d);
    float *hs = malloc(sizeof(float) * (size_t)R * d);
    int32_t *rs = malloc(sizeof(int32_t) * R);
    for (int32_t e = 0; e < c->E && !test_case_failed; e++) {
        int32_t n = 0;
        for (int32_t r = 0; r < R; r++)
            if (c->ids[r] == e) {
                rs[n] = r;
                memcpy(xs + (size_t)n * d, c->x + (size_t)(r / c->k) * d, sizeof(float) * d);
                n++;
            }
        if (!n)
            continue;
        float *dx = up(be, xs, sizeof(float) * (size_t)n * d), *dg = up(be, NULL, sizeof(float) * (size_t)n * 2 * f);
        float *da = up(be, NULL, sizeof(float) * (size_t)n * f), *dh = up(be, NULL, sizeof(float) * (size_t)n * d);
        be->ops->linear(be, md->gu[e], dx, n, dg, 0);
        be->ops->swiglu(be, dg, n, f, da);
        be->ops->linear(be, md->dn[e], da, n, dh, 0);
        CHECK_OK(down(be, hs, dh, sizeof(float) * (size_t)n * d));
        for (int32_t i = 0; i < n; i++)
            memcpy(h + (size_t)rs[i] * d, hs + (size_t)i * d, sizeof(float) * d);
        be->ops->free(be, dx), be->ops->free(be, dg), be->ops->free(be, da), be->ops->free(be, dh);
    }
    for (int32_t i = 0; i < c->m; i++)
        for (int32_t t = 0; t < d; t++) {
            float acc = 0.0f;
            for (int32_t j = 0; j < c->k; j++)
                acc = fmaf(c->w[i * c->k + j], h[(size_t)(i * c->k + j) * d + t], acc);
            y[(size_t)i * d + t] = c->y0[(size_t)i * d + t] + acc;
        }
    free(h), free(xs), free(hs), free(rs);
}

/* RD_CUDA_MOE=tc on one shape. With dim and ffn multiples of 32 (tc_able):
 * within 4e-5 of the double reference's error scale (x and the SwiGLU
 * output enter as two bf16 pieces: the dense tensor-core GEMM's bound
 * against fp32 x); bit for bit the dense GEMM's arithmetic on the same
 * routes (moe_dense_on, whose plans are the experts' own: checked); not the
 * CUDA-core kernels' bits (so the tensor-core path did run); every row alone,
 * from an unaligned x and among 5 rows of other data equal to itself in the
 * batch. Otherwise the call falls back to the CUDA-core kernels: the default
 * backend's bits. q8: the experts as Q8_0 blocks (the dense ops then run
 * Q8_0's tensor-core GEMM). */
static void moe_tc_case(rd_backend *tc, int q8, int32_t E, int32_t f, int32_t d, int32_t k, int32_t m)
{
    moe_case c, o;
    CHECK_OK(moe_case_make(&c, E, f, d, k, m));
    CHECK_OK(moe_case_make(&o, E, f, d, k, 5));
    const int tc_able = d % 32 == 0 && f % 32 == 0;
    const size_t n = (size_t)m * d, ngu = (size_t)2 * f * d, ndn = (size_t)d * f;
    uint8_t *qgu = NULL, *qdn = NULL;
    moe_dev mt = {0}, mb = {0};
    if (q8) {
        qgu = malloc((size_t)E * ngu / 32 * 34), qdn = malloc((size_t)E * ndn / 32 * 34);
        CHECK_OK(ggml_quant_q8_0(c.gu, E * ngu, qgu));
        CHECK_OK(ggml_quant_q8_0(c.dn, E * ndn, qdn));
        CHECK_OK(ggml_dequant_row(GGML_Q8_0, qgu, c.gu, E * ngu)); /* the reference's weights */
        CHECK_OK(ggml_dequant_row(GGML_Q8_0, qdn, c.dn, E * ndn));
        mt.gu = calloc((size_t)E, sizeof(void *));
        mt.dn = calloc((size_t)E, sizeof(void *));
        mt.moe = (rd_moe){.n_experts = E, .ffn = f, .dim = d, .gate_up = mt.gu, .down = mt.dn};
        for (int32_t e = 0; e < E && !test_case_failed; e++) {
            rd_wpart pg = {.type = GGML_Q8_0, .rows = 2 * f, .data = qgu + (size_t)e * ngu / 32 * 34};
            rd_wpart pd = {.type = GGML_Q8_0, .rows = d, .data = qdn + (size_t)e * ndn / 32 * 34};
            CHECK_OK(tc->ops->linear_load_q(tc, &pg, 1, d, &mt.gu[e]));
            CHECK_OK(tc->ops->linear_load_q(tc, &pd, 1, f, &mt.dn[e]));
        }
    } else {
        CHECK_OK(moe_dev_load(tc, c.gu, c.dn, E, f, d, &mt));
    }
    CHECK_OK(moe_dev_load(emu, c.gu, c.dn, E, f, d, &mb));
    float *y = malloc(sizeof(float) * n), *yb = malloc(sizeof(float) * n), *yd = malloc(sizeof(float) * n);
    float *y1 = malloc(sizeof(float) * 5 * d);
    double *yref = malloc(sizeof(double) * n), *mag = malloc(sizeof(double) * n);
    if (test_case_failed)
        goto done;
    CHECK_OK(moe_ffn_on(tc, &mt.moe, c.x, 0, c.ids, c.w, m, k, c.y0, y));
    CHECK_OK(moe_ffn_on(emu, &mb.moe, c.x, 0, c.ids, c.w, m, k, c.y0, yb));
    moe_reference(&c, yref, mag);
    const double et = moe_error(&c, y, yref, mag), eb = moe_error(&c, yb, yref, mag);
    printf("# moe_ffn, RD_CUDA_MOE=tc%s, %d experts (ffn %d, dim %d, top %d, %d rows): %.3g from the double "
           "reference (CUDA cores: %.3g)%s\n", q8 ? ", Q8_0" : "", E, f, d, k, m, et, eb,
           tc_able ? "" : "; dims not multiples of 32: the CUDA-core kernels");
    if (!tc_able) {
        CHECK(!memcmp(y, yb, sizeof(float) * n), "the fallback differs from the CUDA-core kernels' bits");
        goto done;
    }
    CHECK(et < 4e-5, "tensor-core experts: %.3g from the reference", et);
    CHECK(memcmp(y, yb, sizeof(float) * n) != 0, "the tensor-core experts gave the CUDA-core bits (did they run?)");
    cuplan_tc pg, pd, dg, dd;
    CHECK_OK(cuplan_moe_tc(d, &pg));
    CHECK_OK(cuplan_moe_tc(f, &pd));
    CHECK_OK(cuplan_gemm_tc(2 * f, d, 132, &dg));
    CHECK_OK(cuplan_gemm_tc(d, f, 132, &dd));
    CHECK(pg.q == dg.q && pd.q == dd.q, "the dense plans (%d, %d sub-pieces) are not the experts' (%d, %d): pick "
          "smaller dims", dg.q, dd.q, pg.q, pd.q);
    moe_dense_on(tc, &mt, &c, yd);
    size_t diff = 0;
    for (size_t i = 0; i < n; i++)
        diff += fbits(y[i]) != fbits(yd[i]);
    CHECK(diff == 0, "%zu of %zu outputs differ from the dense GEMM's on the same routes", diff, n);
    const int32_t rows[] = {0, m / 2, m - 1};
    for (size_t ri = 0; ri < sizeof rows / sizeof rows[0] && !test_case_failed; ri++) {
        const int32_t r = rows[ri];
        const float *yr = y + (size_t)r * d;
        for (int shift = 0; shift < 2; shift++) {
            CHECK_OK(moe_ffn_on(tc, &mt.moe, c.x + (size_t)r * d, shift, c.ids + r * k, c.w + r * k, 1, k,
                                c.y0 + (size_t)r * d, y1));
            CHECK(!memcmp(y1, yr, sizeof(float) * d), "row %d alone%s differs from it in %d rows", r,
                  shift ? " (unaligned x)" : "", m);
        }
        memcpy(o.x + 2 * d, c.x + (size_t)r * d, sizeof(float) * d);
        memcpy(o.y0 + 2 * d, c.y0 + (size_t)r * d, sizeof(float) * d);
        memcpy(o.ids + 2 * k, c.ids + r * k, sizeof(int32_t) * k);
        memcpy(o.w + 2 * k, c.w + r * k, sizeof(float) * k);
        CHECK_OK(moe_ffn_on(tc, &mt.moe, o.x, 0, o.ids, o.w, 5, k, o.y0, y1));
        CHECK(!memcmp(y1 + 2 * d, yr, sizeof(float) * d), "row %d among 5 other rows differs", r);
    }
done:
    moe_dev_free(tc, &mt);
    moe_dev_free(emu, &mb);
    free(y), free(yb), free(yd), free(y1), free(yref), free(mag), free(qgu), free(qdn);
    moe_case_free(&c);
    moe_case_free(&o);
}

/* The shapes: 8 experts at top 2 over 33 rows (each expert 4-14 routes: one
 * row tile), 8 at top 4 over 40 (20 on average: two tiles, the second
 * partial), 128 at top 8 over 3 rows and 1 (fewer routes than experts),
 * dims 64 and 128 (one and two warps' sub-pieces); a dim of 50 falls back.
 * Q8_0 experts at two shapes; the graph case on the tensor-core experts. */
static void test_moe_ffn_tc(void)
{
    rd_backend *tc = dev_with("RD_CUDA_MOE", "tc", "RD_CUDA_GEMM", "tc");
    rd_backend *tq = dev_with("RD_CUDA_MOE", "tc", "RD_CUDA_Q8", "tc");
    CHECK(tc && tq, "backends: %s", rd_errmsg());
    if (!test_case_failed) moe_tc_case(tc, 0, 8, 32, 64, 2, 33);
    if (!test_case_failed) moe_tc_case(tc, 0, 8, 64, 128, 4, 40);
    if (!test_case_failed) moe_tc_case(tc, 0, 128, 32, 64, 8, 3);
    if (!test_case_failed) moe_tc_case(tc, 0, 128, 32, 64, 8, 1);
    if (!test_case_failed) moe_tc_case(tc, 0, 5, 27, 50, 3, 21);
    if (!test_case_failed) moe_tc_case(tq, 1, 8, 32, 64, 2, 33);
    if (!test_case_failed) moe_tc_case(tq, 1, 8, 64, 128, 4, 40);
    if (!test_case_failed) moe_graph_case(tc);
    if (tc) rd_backend_destroy(tc);
    if (tq) rd_backend_destroy(tq);
}

/* ------------------------------------------------------------------ the engine, device vs host sampling */

typedef struct {
    int n;
    eng_result r[32];
} run_results;

/* Runs a fixed mix of requests to completion on an engine over m; results by (tag, sample). */
static int run_mix(model *m, run_results *out, int *device)
{
    eng_config cfg = eng_default_config();
    cfg.kv_cache_bytes = 64 * model_kv_bytes_per_token(&m->cfg) / 4 * rd_backend_kv_elem_bytes(m->be) * 16;
    cfg.max_num_seqs = 16;
    cfg.max_batch_tokens = 64;
    engine *e;
    int rc = eng_create(m, &cfg, &e);
    if (rc)
        return rc;
    const int32_t V = m->cfg.vocab;
    int32_t prompts[4][20];
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 20; j++)
            prompts[i][j] = (int32_t)((i * 7919 + j * 104729 + 13) % V);
    /* greedy; a group of 4 forked samples at t=0.9, top-p 0.9, alternatives and processed
       log-probs; top-k 5 with min-p; t=1.3 with a stop token */
    eng_request q[4];
    for (int i = 0; i < 4; i++) {
        memset(&q[i], 0, sizeof q[i]);
        q[i].prompt = prompts[i];
        q[i].n_prompt = 9 + 3 * i;
        q[i].n = i == 1 ? 4 : 1;
        q[i].max_tokens = 12;
        q[i].sp = samp_default();
        q[i].sp.seed = 1000 + (uint64_t)i;
        q[i].tag = (uint64_t)i;
        q[i].ignore_eos = 1;
    }
    /* and logit edits (issue 44) through the engine: penalties and a bias on the greedy request, each
       forked sample's own output counts, min_tokens masking the stop token */
    q[0].sp.temperature = 0;
    q[0].sp.repetition_penalty = 1.3f, q[0].sp.frequency_penalty = 0.5f;
    const int32_t bias_ids[2] = {3, 11};
    const float bias_vals[2] = {1.5f, -4.0f};
    q[0].n_bias = 2, q[0].bias_ids = bias_ids, q[0].bias_vals = bias_vals;
    q[1].sp.temperature = 0.9f, q[1].sp.top_p = 0.9f, q[1].sp.logprobs_topk = 3, q[1].sp.processed_logprobs = 1;
    q[1].sp.presence_penalty = 0.4f, q[1].sp.frequency_penalty = 0.2f;
    q[2].sp.top_k = 5, q[2].sp.min_p = 0.05f;
    int32_t stop = 7;
    q[3].sp.temperature = 1.3f, q[3].stop_ids = &stop, q[3].n_stop = 1, q[3].min_tokens = 4;
    for (int i = 0; i < 4 && !rc; i++) {
        int64_t id;
        rc = eng_add(e, &q[i], &id);
    }
    while (!rc && eng_busy(e)) {
        int st = eng_step(e);
        rc = st < 0 ? st : 0;
        int got = eng_collect(e, out->r + out->n, 32 - out->n);
        out->n += got;
    }
    eng_stats s;
    eng_get_stats(e, &s);
    *device = s.device_sampling;
    eng_destroy(e);
    return rc;
}

static const eng_result *find_result(const run_results *rr, uint64_t tag, int32_t sample)
{
    for (int i = 0; i < rr->n; i++)
        if (rr->r[i].tag == tag && rr->r[i].sample_idx == sample)
            return &rr->r[i];
    return NULL;
}

/* The engine draws tokens on the device (one runner_sample per step over every
 * sequence and every forked sample, logit edits included); the same requests with RD_HOST_SAMPLING=1
 * (logits downloaded, samp_sample per row) give the same tokens, log-probs
 * and alternatives. */
static void test_engine_device_sampling(void)
{
    rd_loaded l;
    CHECK(load_model("tiny-f32", dev_name(), &l), "cannot load tiny-f32 (run tests/gen_testdata.sh): %s", rd_errmsg());
    run_results dev = {0}, host = {0}, waits = {0};
    int dev_on = 0, host_on = 1, waits_on = 0;
    CHECK_OK(run_mix(l.m, &dev, &dev_on));
    setenv("RD_HOST_SAMPLING", "1", 1);
    CHECK_OK(run_mix(l.m, &host, &host_on));
    unsetenv("RD_HOST_SAMPLING");
    /* each forward waiting for its work before the draw (the engine's old order) draws the same */
    setenv("RD_FORWARD_SYNC", "1", 1);
    CHECK_OK(run_mix(l.m, &waits, &waits_on));
    unsetenv("RD_FORWARD_SYNC");
    CHECK(dev_on == 1 && host_on == 0 && waits_on == 1, "sampling place: device run %d, host run %d", dev_on,
          host_on);
    /* a value the switches do not take refuses the engine, naming it; "0" is the default */
    static const char *sw[][2] = {{"RD_FORWARD_SYNC", "yes"}, {"RD_HOST_SAMPLING", "true"}, {"RD_FORWARD_SYNC", "10"}};
    for (int i = 0; i < 3; i++) {
        run_results none = {0};
        int on = -1;
        char want[64];
        snprintf(want, sizeof want, "%s=%s", sw[i][0], sw[i][1]);
        setenv(sw[i][0], sw[i][1], 1);
        const int rc = run_mix(l.m, &none, &on);
        unsetenv(sw[i][0]);
        CHECK(rc == RD_EINVAL && strstr(rd_errmsg(), want), "%s: engine created (rc %d, \"%s\")", want, rc,
              rd_errmsg());
    }
    {
        run_results zero = {0};
        int on = 0;
        setenv("RD_FORWARD_SYNC", "0", 1);
        setenv("RD_HOST_SAMPLING", "0", 1);
        CHECK_OK(run_mix(l.m, &zero, &on));
        unsetenv("RD_FORWARD_SYNC");
        unsetenv("RD_HOST_SAMPLING");
        CHECK(on == 1 && zero.n == 7, "RD_FORWARD_SYNC=0 RD_HOST_SAMPLING=0: device sampling %d, %d results", on,
              zero.n);
        for (int i = 0; i < zero.n; i++)
            eng_result_free(&zero.r[i]);
    }
    CHECK(dev.n == 7 && host.n == 7 && waits.n == 7, "results: %d on the device, %d on the host (want 7)", dev.n,
          host.n);
    for (int i = 0; i < waits.n; i++) {
        const eng_result *w = &waits.r[i], *d = find_result(&dev, w->tag, w->sample_idx);
        CHECK(d && d->n_tokens == w->n_tokens &&
                  !memcmp(d->token_ids, w->token_ids, sizeof(int32_t) * (size_t)w->n_tokens) &&
                  !memcmp(d->logprobs, w->logprobs, sizeof(float) * (size_t)w->n_tokens),
              "request %llu sample %d: the queued forward drew otherwise than the waiting one",
              (unsigned long long)w->tag, w->sample_idx);
    }
    int tokens = 0, distinct_group = 0;
    for (int i = 0; i < host.n; i++) {
        const eng_result *h = &host.r[i], *d = find_result(&dev, h->tag, h->sample_idx);
        CHECK(d != NULL, "request %llu sample %d missing from the device run", (unsigned long long)h->tag,
              h->sample_idx);
        CHECK(d->n_tokens == h->n_tokens && d->finish == h->finish && d->n_top == h->n_top,
              "request %llu sample %d: %d tokens (finish %d) vs %d (finish %d)", (unsigned long long)h->tag,
              h->sample_idx, d->n_tokens, d->finish, h->n_tokens, h->finish);
        for (int32_t t = 0; t < h->n_tokens; t++) {
            CHECK(d->token_ids[t] == h->token_ids[t], "request %llu sample %d token %d: %d vs %d",
                  (unsigned long long)h->tag, h->sample_idx, t, d->token_ids[t], h->token_ids[t]);
            CHECK(fabsf(d->logprobs[t] - h->logprobs[t]) <= 1e-5f, "log-prob %g vs %g", d->logprobs[t],
                  h->logprobs[t]);
            if (h->logprobs_proc)
                CHECK(d->logprobs_proc && fabsf(d->logprobs_proc[t] - h->logprobs_proc[t]) <= 1e-5f,
                      "processed log-prob %g vs %g", d->logprobs_proc ? d->logprobs_proc[t] : NAN,
                      h->logprobs_proc[t]);
            for (int32_t k = 0; k < h->n_top; k++)
                CHECK(d->top_ids[t * h->n_top + k] == h->top_ids[t * h->n_top + k], "alternative %d differs", k);
            tokens++;
        }
        if (h->tag == 1 && h->sample_idx > 0)
            distinct_group += memcmp(h->token_ids, find_result(&host, 1, 0)->token_ids,
                                     sizeof(int32_t) * (size_t)(h->n_tokens < 3 ? h->n_tokens : 3)) != 0;
    }
    printf("# engine on cuda-emu: %d tokens drawn on the device equal the host sampler's\n", tokens);
    CHECK(distinct_group >= 1, "the forked samples all drew the same first tokens");
    for (int i = 0; i < dev.n; i++)
        eng_result_free(&dev.r[i]);
    for (int i = 0; i < host.n; i++)
        eng_result_free(&host.r[i]);
    for (int i = 0; i < waits.n; i++)
        eng_result_free(&waits.r[i]);
    rd_unload(&l);
}

/* A draw that fails on the device (here: its buffers cannot grow) ends the
 * samples it was for with FINISH_ERROR and what they had; none is left
 * waiting, and the engine serves the next request. */
static void test_engine_draw_failure(void)
{
    rd_loaded l;
    CHECK(load_model("tiny-f32", "cuda-emu", &l), "cannot load tiny-f32: %s", rd_errmsg());
    eng_config cfg = eng_default_config();
    cfg.kv_cache_bytes = 64 * model_kv_bytes_per_token(&l.m->cfg) / 4 * rd_backend_kv_elem_bytes(l.m->be) * 16;
    cfg.max_num_seqs = 128;
    cfg.max_batch_tokens = 128;
    engine *e;
    CHECK_OK(eng_create(l.m, &cfg, &e));
    int32_t prompt[12];
    for (int i = 0; i < 12; i++)
        prompt[i] = 5 + 3 * i;
    eng_request q;
    memset(&q, 0, sizeof q);
    q.prompt = prompt, q.n_prompt = 12, q.n = 1, q.max_tokens = 2, q.sp = samp_default(), q.ignore_eos = 1;
    int64_t id;
    eng_result r[128];
    int got = 0;
    /* warm-up: the same prompt once, so the next prefill allocates nothing before the draw */
    CHECK_OK(eng_add(e, &q, &id));
    while (eng_busy(e))
        CHECK(eng_step(e) >= 0, "warm-up step: %s", rd_errmsg());
    got = eng_collect(e, r, 128);
    CHECK(got == 1 && r[0].finish == FINISH_LENGTH, "warm-up: %d results", got);
    eng_result_free(&r[0]);
    /* 100 forked samples need more draw buffers than the warm-up made: that allocation fails */
    q.n = 100;
    CHECK_OK(eng_add(e, &q, &id));
    cuemu_fail_next_malloc();
    int rc = eng_step(e);
    CHECK(rc < 0, "the step with the failing draw returned %d", rc);
    CHECK(!eng_busy(e), "samples are still waiting after the failed draw");
    got = eng_collect(e, r, 128);
    CHECK(got == 100, "%d results after the failed draw (want 100)", got);
    for (int i = 0; i < got; i++) {
        CHECK(r[i].finish == FINISH_ERROR && r[i].n_tokens == 0, "sample %d: finish %d, %d tokens", r[i].sample_idx,
              r[i].finish, r[i].n_tokens);
        eng_result_free(&r[i]);
    }
    /* and the engine goes on */
    q.n = 2;
    CHECK_OK(eng_add(e, &q, &id));
    while (eng_busy(e))
        CHECK(eng_step(e) >= 0, "step after the failure: %s", rd_errmsg());
    got = eng_collect(e, r, 128);
    CHECK(got == 2 && r[0].finish == FINISH_LENGTH && r[0].n_tokens == 2, "after the failure: %d results", got);
    for (int i = 0; i < got; i++)
        eng_result_free(&r[i]);
    eng_destroy(e);
    rd_unload(&l);
}

static void ensure_testdata(void)
{
    char cmd[600];
    snprintf(cmd, sizeof cmd, "tests/gen_testdata.sh '%s' >/dev/null", testdata());
    if (system(cmd) != 0)
        fprintf(stderr, "test_cuda_emu: %s failed\n", cmd);
}

/* RD_TEST_ONLY=name,name,...: run only those cases (when working on one). */
static int selected(const char *name)
{
    const char *only = getenv("RD_TEST_ONLY");
    if (!only || !*only)
        return 1;
    const size_t n = strlen(name);
    for (const char *p = only; *p;) {
        const char *e = strchr(p, ',');
        size_t len = e ? (size_t)(e - p) : strlen(p);
        if (len == n && !strncmp(p, name, n))
            return 1;
        p += len + (e ? 1 : 0);
    }
    return 0;
}
#define RUN_SEL(fn)          \
    do {                     \
        if (selected(#fn))   \
            RUN(fn);         \
    } while (0)

int main(void)
{
    /* RD_TEST_CUDA_BACKEND=cuda: the cases that name no emulator hook (the
     * MoE ones; tests/gpu/run.sh picks them with RD_TEST_ONLY) on the real
     * backend instead of the emulator. */
    const char *dev = getenv("RD_TEST_CUDA_BACKEND");
    if (!dev || !*dev)
        dev = "cuda-emu";
    int rc = rd_backend_create("cpu", 2, &cpu);
    if (!rc)
        rc = rd_backend_create("cpu", 2, &cpu_kvbf16);
    if (!rc)
        rc = rd_backend_set_kv_dtype(cpu_kvbf16, "bf16");
    if (!rc)
        rc = rd_backend_create(dev, 1, &emu);
    setenv("RD_CUDA_ACT", "bf16", 1);
    if (!rc)
        rc = rd_backend_create(dev, 1, &emu_bf16);
    unsetenv("RD_CUDA_ACT");
    if (!rc)
        rc = rd_backend_create(dev, 1, &emu_fp8);
    if (!rc)
        rc = rd_backend_set_kv_dtype(emu_fp8, "fp8");
    if (rc) {
        printf("FAIL setup: %s\n", rd_errmsg());
        return 1;
    }
    ensure_testdata();
    RUN_SEL(test_env_switches);
    RUN_SEL(test_gemm);
    RUN_SEL(test_linear_read_native);
    RUN_SEL(test_fp8_linear);
    RUN_SEL(test_gemm_tc);
    RUN_SEL(test_gemm_tc_hnorm);
    RUN_SEL(test_rmsnorm_widths);
    RUN_SEL(test_moe_route_tc);
    RUN_SEL(test_gemm_tc_normadd);
    RUN_SEL(test_gemm_tc_wg);
    RUN_SEL(test_gemm_tc_wgp);
    RUN_SEL(test_gemm_tc_order);
    RUN_SEL(test_gemm_tc_q8);
    RUN_SEL(test_gemm_tc_q80);
    RUN_SEL(test_runner_q80);
    RUN_SEL(test_moe_ffn_q8);
    RUN_SEL(test_lm_head_chunks);
    RUN_SEL(test_mixed_activations);
    RUN_SEL(test_row_ops);
    RUN_SEL(test_qwen_ops);
    RUN_SEL(test_qwen_ops_drop_shadows);
    RUN_SEL(test_qwen_ops_after_linear);
    RUN_SEL(test_rope_then_row_op);
    RUN_SEL(test_norm_offsets);
    RUN_SEL(test_gemma_elementwise);
    RUN_SEL(test_gemma_ops_after_linear);
    RUN_SEL(test_gemma_shadows);
    RUN_SEL(test_attention);
    RUN_SEL(test_attention_combine_fused);
    RUN_SEL(test_attention_alone_vs_batched);
    RUN_SEL(test_attention_window);
    RUN_SEL(test_attention_vs_cpu);
    RUN_SEL(test_attention_vs_cpu_kv_bf16);
    RUN_SEL(test_kv_fp8);
    RUN_SEL(test_gemma_layer);
    RUN_SEL(test_copy_blocks);
    RUN_SEL(test_moe_route);
    RUN_SEL(test_moe_route_after_linear);
    RUN_SEL(test_moe_ffn);
    RUN_SEL(test_moe_batch_invariance);
    RUN_SEL(test_moe_release);
    RUN_SEL(test_moe_model_release);
    RUN_SEL(test_moe_graph);
    RUN_SEL(test_moe_graph_nofuse);
    RUN_SEL(test_moe_small_fused);
    RUN_SEL(test_moe_small_fused_tc);
    RUN_SEL(test_moe_ffn_tc);
    RUN_SEL(test_runner_moe_tc);
    RUN_SEL(test_runner_moe_fused);
    RUN_SEL(test_lora_vs_cpu);
    RUN_SEL(test_gemm_tc_lora);
    RUN_SEL(test_lora_graph);
    RUN_SEL(test_sampler);
    RUN_SEL(test_sampler_many_draws);
    RUN_SEL(test_sampler_score);
    RUN_SEL(test_sampler_edits);
    RUN_SEL(test_sampler_tiled);
    RUN_SEL(test_runner_tiny);
    RUN_SEL(test_runner_tc);
    RUN_SEL(test_runner_tc_lora);
    RUN_SEL(test_runner_tiny_bf16);
    RUN_SEL(test_runner_kv_fp8);
    RUN_SEL(test_runner_families);
    RUN_SEL(test_engine_device_sampling);
    RUN_SEL(test_engine_draw_failure);
    rd_backend_destroy(emu_bf16);
    rd_backend_destroy(emu_fp8);
    rd_backend_destroy(emu);
    rd_backend_destroy(cpu);
    rd_backend_destroy(cpu_kvbf16);
    TEST_EXIT();
}
