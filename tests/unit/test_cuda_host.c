/* test_cuda_host.c - the CUDA backend's host-side logic, on the CPU: bf16
 * rounding, the device sampler's RNG and ordering against engine/serve/sampler.c,
 * the GELU's tanh against libm's, attention planning (sliding windows too), GEMM candidate choice, graph buckets, KV budget.
 * Reference values are computed here independently (double arithmetic,
 * brute force), never copied from the code under test. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "engine/backend.h"
#include "base/err.h"
#include "engine/model/quant_fp8.h"
#include "engine/model/runner.h"
#include "engine/serve/sampler.h"
#include "kernels/cuda/cuda_math.h"
#include "kernels/cuda/cuda_plan.h"
#include "tests/unit/test.h"

static uint64_t rng = 88172645463325252ull;
static uint64_t next_u64(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

static float bits_f(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static uint32_t f_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

/* Round-to-nearest-even to bf16 by exact comparison in double. */
static uint16_t ref_bf16(float x)
{
    uint32_t u = f_bits(x);
    if (isnan(x))
        return 0;                       /* checked separately */
    uint16_t lo = (uint16_t)(u >> 16);
    if ((u & 0xffffu) == 0)
        return lo;
    uint16_t hi = (uint16_t)(lo + 1);   /* away from zero in magnitude */
    double dx = x, dlo = bits_f((uint32_t)lo << 16);
    double dhi = isinf(bits_f((uint32_t)hi << 16)) ? (x > 0 ? 0x1.0p128 : -0x1.0p128) : bits_f((uint32_t)hi << 16);
    double elo = fabs(dx - dlo), ehi = fabs(dhi - dx);
    if (elo < ehi)
        return lo;
    if (ehi < elo)
        return hi;
    return (lo & 1) ? hi : lo;
}

static void test_bf16_rounding(void)
{
    /* Named cases. */
    CHECK(cm_f32_to_bf16(1.0f) == 0x3f80, "1.0");
    CHECK(cm_f32_to_bf16(bits_f(0x3f808000u)) == 0x3f80, "tie to even (down)");
    CHECK(cm_f32_to_bf16(bits_f(0x3f818000u)) == 0x3f82, "tie to even (up)");
    CHECK(cm_f32_to_bf16(bits_f(0x3f808001u)) == 0x3f81, "just above the tie");
    CHECK(cm_f32_to_bf16(-0.0f) == 0x8000, "-0");
    CHECK(cm_f32_to_bf16(INFINITY) == 0x7f80 && cm_f32_to_bf16(-INFINITY) == 0xff80, "inf");
    CHECK(cm_f32_to_bf16(3.4028235e38f) == 0x7f80, "FLT_MAX rounds to inf");
    uint16_t qn = cm_f32_to_bf16(NAN), nn = cm_f32_to_bf16(bits_f(0xff800001u));
    CHECK((qn & 0x7f80) == 0x7f80 && (qn & 0x7f), "NaN stays NaN (%04x)", qn);
    CHECK((nn & 0x7f80) == 0x7f80 && (nn & 0x7f) && (nn & 0x8000), "signalling -NaN with a low payload stays NaN (%04x)", nn);
    /* Random bit patterns, every exponent (denormals included). */
    for (int i = 0; i < 2000000; i++) {
        uint32_t u = (uint32_t)next_u64();
        float x = bits_f(u);
        if (isnan(x))
            continue;
        uint16_t got = cm_f32_to_bf16(x), want = ref_bf16(x);
        CHECK(got == want, "%08x -> %04x, expected %04x", u, got, want);
    }
    /* bf16 values convert back exactly and round-trip. */
    for (uint32_t h = 0; h < 0x10000; h++) {
        float f = cm_bf16_to_f32((uint16_t)h);
        if (isnan(f))
            continue;
        CHECK(f_bits(f) == h << 16, "bf16 %04x widens to %08x", h, f_bits(f));
        CHECK(cm_f32_to_bf16(f) == h, "bf16 %04x round trip", h);
    }
    float src[5] = {1.0f, -2.5f, 1e-3f, 65504.0f, bits_f(0x3f808000u)};
    uint16_t dst[5];
    float back[5];
    cuplan_to_bf16(src, 5, dst);
    cuplan_from_bf16(dst, 5, back);
    for (int i = 0; i < 5; i++)
        CHECK(dst[i] == ref_bf16(src[i]) && back[i] == bits_f((uint32_t)dst[i] << 16), "array %d", i);
}

/* The KV cache's FP8 rounding (cm_fp8_*, device and emulator) is
 * engine/model/quant_fp8.c's: the same code for every bf16 value and a
 * million random floats, the same block exponent as quant_fp8.c's frexpf rule
 * (clamped to [-117, 7]) for every bf16 magnitude, NaN to 0x7f, and the
 * scaled decode equal to the code's value times 2^e. */
static void test_fp8_matches_quant(void)
{
    uint64_t st = 99;
    for (uint32_t i = 0; i < (1u << 16) + (1u << 20); i++) {
        uint32_t u;
        if (i < (1u << 16)) {
            u = i << 16;
        } else {
            st = st * 6364136223846793005ull + 1442695040888963407ull;
            u = (uint32_t)(st >> 32);
        }
        float v;
        memcpy(&v, &u, 4);
        if (isnan(v)) {
            CHECK((cm_fp8_from_f32(v) & 0x7f) == 0x7f, "NaN %08x", u);
            continue;
        }
        CHECK(cm_fp8_from_f32(v) == rd_fp8_e4m3_from_f32(v), "%08x (%g): %02x vs %02x", u, v, cm_fp8_from_f32(v),
              rd_fp8_e4m3_from_f32(v));
        uint32_t a = u & 0x7fffffffu;
        if (i < (1u << 16) && a < 0x7f800000u) {
            int e = 0;
            if (a) {
                int ex;
                float f = frexpf(fabsf(v), &ex);
                e = ex - 9 + (f > 0.875f);
                e = e < -117 ? -117 : e > 7 ? 7 : e;
            }
            CHECK(cm_fp8_block_exp(a) == e, "block exponent of %g: %d vs %d", fabsf(v), cm_fp8_block_exp(a), e);
        }
    }
    for (uint32_t c = 0; c < 256; c++)
        for (int e = -117; e <= 7; e += 31) {
            if ((c & 0x7f) == 0x7f)
                continue;
            float want = ldexpf(rd_fp8_e4m3_to_f32((uint8_t)c), e);
            float got = cm_fp8_scaled(c, cm_fp8_scale((uint32_t)(e + 127)));
            CHECK(memcmp(&want, &got, 4) == 0, "code %02x at 2^%d: %g vs %g", c, e, got, want);
        }
    CHECK(isnan(cm_fp8_scaled(0x38, cm_fp8_scale(0xff))), "scale byte 0xff is NaN");
}

static void test_rng_matches_cpu_sampler(void)
{
    for (int i = 0; i < 20000; i++) {
        uint32_t ctr[4] = {(uint32_t)next_u64(), (uint32_t)next_u64(), (uint32_t)next_u64(), (uint32_t)next_u64()};
        uint32_t key[2] = {(uint32_t)next_u64(), (uint32_t)next_u64()};
        if (i < 4)
            memset(ctr, i & 1 ? 0xff : 0, sizeof ctr), memset(key, i & 2 ? 0xff : 0, sizeof key);
        uint32_t a[4], b[4];
        cm_philox4x32_10(ctr, key, a);
        samp_philox4x32_10(ctr, key, b);
        CHECK(!memcmp(a, b, sizeof a), "philox block %d differs", i);
        uint64_t seed = next_u64();
        uint32_t idx = (uint32_t)next_u64() % 64, pos = (uint32_t)next_u64() % 100000;
        double u1 = cm_uniform(seed, idx, pos), u2 = samp_uniform(seed, idx, pos);
        CHECK(u1 == u2 && u1 >= 0.0 && u1 < 1.0, "uniform(%llu, %u, %u): %.17g vs %.17g",
              (unsigned long long)seed, idx, pos, u1, u2);
    }
}

static void test_order_and_keys(void)
{
    CHECK(cm_logit_order(-0.0f) == cm_logit_order(0.0f), "-0 and +0 order alike");
    CHECK(cm_logit_order(-INFINITY) < cm_logit_order(-3.4e38f), "-inf lowest finite-ordered");
    CHECK(cm_logit_order(INFINITY) > cm_logit_order(3.4e38f), "+inf highest");
    for (int i = 0; i < 200000; i++) {
        float a = bits_f((uint32_t)next_u64()), b = bits_f((uint32_t)next_u64());
        if (isnan(a) || isnan(b))
            continue;
        if (i % 3 == 0)
            b = a; /* equal logits: keys order by index */
        int ord = (a > b) - (a < b);
        int got = (cm_logit_order(a) > cm_logit_order(b)) - (cm_logit_order(a) < cm_logit_order(b));
        CHECK(ord == got, "order of %g vs %g", a, b);
        int32_t ia = (int32_t)(next_u64() % 100000), ib = (int32_t)(next_u64() % 100000);
        if (ia == ib)
            continue;
        uint64_t ka = cm_rank_key(a, ia), kb = cm_rank_key(b, ib);
        int earlier = a > b || (a == b && ia < ib);
        CHECK((ka > kb) == earlier, "rank key of (%g,%d) vs (%g,%d)", a, ia, b, ib);
        CHECK(cm_key_index(ka) == ia, "key index");
    }
}

static void test_exp_nonpos(void)
{
    CHECK(cm_exp_nonpos(0.0f) == 1.0f, "exp(0) = 1 exactly");
    CHECK(cm_exp_nonpos(-INFINITY) == 0.0f, "exp(-inf) = 0");
    CHECK(cm_exp_nonpos(-90.0f) == 0.0f, "below -87 is 0");
    float prev = 1.0f;
    for (float x = 0.0f; x > -87.0f; x -= 0.00173f) {
        float e = cm_exp_nonpos(x);
        double want = exp((double)x);
        CHECK(fabs(e - want) <= want * 2.4e-7, "exp(%g) = %.9g, want %.9g", x, e, want);
        CHECK(e <= prev, "not monotone at %g", x);
        prev = e;
    }
    CHECK(cm_scaled_weight(2.0f, 2.0f, 0.5f) == 1.0f, "weight at the max is 1");
}

/* Distance in ulps between two finite floats (or infinities). */
static int64_t ulp_dist(float a, float b)
{
    int32_t ia, ib;
    memcpy(&ia, &a, 4);
    memcpy(&ib, &b, 4);
    int64_t la = ia < 0 ? (int64_t)INT32_MIN - ia : ia, lb = ib < 0 ? (int64_t)INT32_MIN - ib : ib;
    return la > lb ? la - lb : lb - la;
}

/* cm_tanhf (the GELU's tanh on the device) against the libm the CPU backend
 * uses: every 61st float of either sign. Measured over all 2^31 finite
 * non-negative floats once (2026-12-01, glibc 2.36): identical to
 * (float)tanh((double)x) everywhere, and to tanhf on 97.23%, 1 ulp away on
 * 2.76%, 2 ulps on 0.017%, never more (glibc's tanhf is the 2-ulp one). */
static void test_tanh(void)
{
    uint64_t n = 0, same = 0, same_cr = 0;
    int64_t worst = 0, worst_cr = 0;
    float at = 0;
    for (uint64_t u = 0; u < 0x7f800000u; u += 61) {
        for (int sign = 0; sign < 2; sign++) {
            const float x = bits_f((uint32_t)u | (sign ? 0x80000000u : 0));
            const float t = cm_tanhf(x), g = tanhf(x), c = (float)tanh((double)x);
            const int64_t d = ulp_dist(t, g), dc = ulp_dist(t, c);
            n++;
            same += d == 0;
            same_cr += dc == 0;
            if (d > worst)
                worst = d, at = x;
            worst_cr = dc > worst_cr ? dc : worst_cr;
        }
    }
    printf("# cm_tanhf vs glibc tanhf over %llu floats: %.4f%% identical, at most %lld ulps (at %a); vs "
           "(float)tanh((double)x): %.4f%% identical, at most %lld ulps\n", (unsigned long long)n,
           100.0 * (double)same / (double)n, (long long)worst, at, 100.0 * (double)same_cr / (double)n,
           (long long)worst_cr);
    CHECK(worst <= 2, "cm_tanhf is %lld ulps from tanhf at %a", (long long)worst, at);
    CHECK(worst_cr <= 1 && (double)same_cr >= 0.9999 * (double)n, "cm_tanhf vs the rounded double tanh: %lld ulps, "
          "%llu of %llu identical", (long long)worst_cr, (unsigned long long)same_cr, (unsigned long long)n);
    CHECK((double)same >= 0.95 * (double)n, "only %llu of %llu identical to tanhf", (unsigned long long)same,
          (unsigned long long)n);
    CHECK(isnan(cm_tanhf(NAN)) && cm_tanhf(INFINITY) == 1.0f && cm_tanhf(-INFINITY) == -1.0f, "NaN and infinities");
    CHECK(f_bits(cm_tanhf(0.0f)) == 0 && f_bits(cm_tanhf(-0.0f)) == 0x80000000u, "signed zeros");
    CHECK(cm_tanhf(0x1p-149f) == 0x1p-149f && cm_tanhf(-0x1p-130f) == -0x1p-130f, "subnormals: tanh(x) = x");
    CHECK(cm_tanhf(9.1f) == 1.0f && cm_tanhf(10.0f) == 1.0f && cm_tanhf(-1e30f) == -1.0f && cm_tanhf(9.0f) < 1.0f,
          "saturation");
    /* The GELU as the CPU backend writes it (tanhf) vs cm_geglu: equal where
     * the tanh agrees, else within the tanh's 2 ulps (<= 2^-23 on 1 + t, exact
     * or rounded) times |0.5 g u|, plus the products' rounding. */
    uint64_t gs = 0, gn = 0;
    double gworst = 0;
    for (int i = 0; i < 2000000; i++) {
        const float g = (float)((double)(next_u64() >> 11) * 0x1.0p-53 * 24.0 - 16.0);
        const float u = (float)((double)(next_u64() >> 11) * 0x1.0p-53 * 4.0 - 2.0);
        const float inner = 0.7978845608f * (g + 0.044715f * g * g * g);
        const float cpu = 0.5f * g * (1.0f + tanhf(inner)) * u;
        const float dev = cm_geglu(g, u);
        gn++;
        gs += f_bits(cpu) == f_bits(dev);
        const double scale = fabs(0.5 * g * u) * 0x1.0p-24;
        const double err = fabs((double)cpu - dev) / (scale > 0 ? scale : 1e-45);
        gworst = err > gworst ? err : gworst;
        CHECK(fabs((double)cpu - dev) <= fabs(0.5 * g * u) * 0x1.0p-22 + 4.0 * fabs(cpu) * 0x1.0p-24,
              "gelu(%a) * %a: %a vs the CPU formula's %a", g, u, dev, cpu);
    }
    printf("# cm_geglu vs the CPU's formula (g in [-16, 8), u in [-2, 2)): %.3f%% identical, at most %.2f x "
           "|0.5 g u| 2^-24 apart\n", 100.0 * (double)gs / (double)gn, gworst);
}

static void test_attention_plan(void)
{
    CHECK(cuplan_attn_check(9, 3, 64) == 0, "SmolLM2 shape");
    CHECK(cuplan_attn_check(32, 8, 64) == 0, "Llama 3.2 1B shape");
    CHECK(cuplan_attn_check(64, 8, 128) == 0, "Llama 70B shape");
    CHECK(cuplan_attn_check(4, 2, 16) == 0, "tiny test model shape");
    CHECK(cuplan_attn_check(8, 3, 64) == RD_ENOTSUP, "heads not a multiple of kv heads");
    CHECK(cuplan_attn_check(64, 2, 64) == RD_ENOTSUP, "group of 32");
    CHECK(cuplan_attn_check(4, 2, 12) == RD_ENOTSUP, "head_dim 12");
    CHECK(cuplan_attn_check(4, 2, 512) == RD_ENOTSUP, "head_dim 512");
    /* Qwen2.5 0.5B / 7B, Qwen3 0.6B / 4B / 14B / 32B, Gemma 3 270M / 4B */
    CHECK(cuplan_attn_check(14, 2, 64) == 0 && cuplan_attn_check(28, 4, 128) == 0, "Qwen2.5 shapes");
    CHECK(cuplan_attn_check(16, 8, 128) == 0 && cuplan_attn_check(32, 8, 128) == 0 &&
          cuplan_attn_check(40, 8, 128) == 0 && cuplan_attn_check(64, 8, 128) == 0, "Qwen3 shapes");
    CHECK(cuplan_attn_check(4, 1, 256) == 0 && cuplan_attn_check(8, 4, 256) == 0, "Gemma 3 shapes");
    CHECK(cuplan_attn_check(16, 1, 256) == RD_ENOTSUP, "group of 16 at head_dim 256: over 47 KiB of shared memory");
    int accepted = 0;
    for (int32_t hd = 8; hd <= CUPLAN_ATTN_MAX_HD; hd += 8)
        for (int32_t g = 1; g <= CUPLAN_ATTN_MAX_GROUP; g++) {
            cuplan_attn a = cuplan_attn_layout(g, hd);
            CHECK(a.tg >= 1 && a.tg <= 32 && (a.tg & (a.tg - 1)) == 0 && a.tg * 8 >= hd, "tg %d for hd %d", a.tg, hd);
            CHECK(a.ng * a.tg == CUPLAN_ATTN_THREADS, "ng");
            CHECK(a.dp * 2 == hd && a.kl >= 1 && a.kl * a.dp <= CUPLAN_ATTN_THREADS, "pv split for hd %d", hd);
            /* every shape the check accepts launches without a shared-memory opt-in */
            const int ok = cuplan_attn_check(g, 1, hd) == 0;
            CHECK(ok == (a.smem <= CUPLAN_ATTN_MAX_SMEM), "hd %d group %d: %zu bytes of shared memory, check %d", hd,
                  g, a.smem, ok);
            accepted += ok;
        }
    CHECK(accepted == 32 * CUPLAN_ATTN_MAX_GROUP - 1, "%d shapes accepted: only group 16 at hd 256 is refused",
          accepted);
    CHECK(cuplan_attn_parts(1) == 1 && cuplan_attn_parts(CUPLAN_ATTN_PART) == 1 &&
          cuplan_attn_parts(CUPLAN_ATTN_PART + 1) == 2, "parts");
#define ATTN_Z(rows, nkv, parts, sm) cuplan_attn_z(rows, nkv, parts, sm, CUPLAN_ATTN_WAVES, CUPLAN_ATTN_MAX_Z)
    CHECK(ATTN_Z(1, 3, 0, 132) == CUPLAN_ATTN_MAX_Z, "batch 1 spreads");
    CHECK(ATTN_Z(1, 3, 2, 132) == 2, "never more CTAs than partitions");
    CHECK(ATTN_Z(256, 8, 0, 132) == 1, "big batches need no split");
    CHECK(ATTN_Z(0, 0, 0, 0) >= 1 && cuplan_attn_z(1, 1, 0, 132, 0, 0) >= 1, "degenerate input");
    /* the 1B's 8 KV heads at 32768 tokens (128 partitions) on 132 SMs: batch 1 takes the cap (256 CTAs, about 2
     * per SM), batch 8 ceil(4 x 132 / 64) = 9 per (row, kv head); session 30's split (2 waves, at most 16): 16
     * and 5 */
    CHECK(ATTN_Z(1, 8, 128, 132) == 32 && ATTN_Z(8, 8, 128, 132) == 9, "long context: %d, %d", ATTN_Z(1, 8, 128, 132),
          ATTN_Z(8, 8, 128, 132));
    CHECK(cuplan_attn_z(1, 8, 128, 132, 2, 16) == 16 && cuplan_attn_z(8, 8, 128, 132, 2, 16) == 5, "the old split");
    /* sliding windows: keys max(0, pos - W + 1) .. pos, cut from the first */
    CHECK(cuplan_attn_key0(0, 0) == 0 && cuplan_attn_key0(5000, 0) == 0 && cuplan_attn_key0(5000, -3) == 0,
          "no window: from key 0");
    CHECK(cuplan_attn_key0(0, 1) == 0 && cuplan_attn_key0(9, 1) == 9, "window 1: the row's own key");
    CHECK(cuplan_attn_key0(510, 512) == 0 && cuplan_attn_key0(511, 512) == 0 && cuplan_attn_key0(512, 512) == 1 &&
          cuplan_attn_key0(1000, 512) == 489, "window 512");
    for (int32_t pos = 0; pos < 3000; pos += 7)
        for (int32_t w = 1; w < 1100; w += 37) {
            const int32_t n = pos + 1 - cuplan_attn_key0(pos, w);
            CHECK(n == (pos + 1 < w ? pos + 1 : w), "pos %d window %d: %d keys", pos, w, n);
            CHECK(cuplan_attn_row_parts(pos, w) == cuplan_attn_parts(n) &&
                  cuplan_attn_row_parts(pos, w) <= cuplan_attn_parts(w), "pos %d window %d: partitions", pos, w);
        }
    CHECK(cuplan_attn_row_parts(5000, 512) == 2 && cuplan_attn_row_parts(5000, 0) == 20 &&
          cuplan_attn_row_parts(100, 512) == 1, "row partitions");
    CHECK(cuplan_attn_layer_parts(20, 0) == 20 && cuplan_attn_layer_parts(0, 0) == 0, "no window: the step's");
    CHECK(cuplan_attn_layer_parts(20, 512) == 2 && cuplan_attn_layer_parts(1, 512) == 1, "window: at most its own");
    CHECK(cuplan_attn_layer_parts(0, 512) == 2 && cuplan_attn_layer_parts(0, 300) == 2 &&
          cuplan_attn_layer_parts(0, 16) == 1, "capture (unknown contexts): the window bounds it");
    CHECK(ATTN_Z(1, 1, cuplan_attn_layer_parts(0, 512), 132) == 2,
          "Gemma 3 at batch 1 on a window of 512: 2 CTAs per (row, kv head)");
#undef ATTN_Z
}

static void test_gemm_pick(void)
{
    cuplan_gemm_cand c[4] = {{0, 1e-6, 1e-6, 1e-6}, {1, 5e-6, 9e-6, 2e-5}, {1, 4e-6, 8e-6, 2e-5}, {1, -1, 1e-6, 1e-6}};
    CHECK(cuplan_pick_gemm(c, 4) == 2, "fastest invariant candidate with timings");
    c[2].t_large = 4e-5;
    CHECK(cuplan_pick_gemm(c, 4) == 1, "the large batch counts too");
    c[2].t_large = 2e-5;
    c[2].invariant = 0;
    CHECK(cuplan_pick_gemm(c, 4) == 1, "next one");
    c[1].invariant = 0;
    CHECK(cuplan_pick_gemm(c, 4) == -1, "none qualifies");
    CHECK(cuplan_pick_gemm(c, 0) == -1, "no candidates");
    int32_t sz[32];
    int n = cuplan_gemm_check_sizes(sz, 32);
    int has1 = 0, has64 = 0;
    for (int i = 0; i < n; i++) {
        has1 |= sz[i] == 1;
        has64 |= sz[i] == 64;
        if (i)
            CHECK(sz[i] > sz[i - 1], "ascending");
    }
    CHECK(n >= 8 && has1 && has64 && sz[n - 1] >= 256, "check sizes cover 1, 64 and a large reference");
}

/* The tensor-core GEMM's plan: q sub-pieces of kp weights that tile K
 * exactly in 32-weight chunks, at most 4 warps per CTA with at least 2
 * chunks each, CTAs along K only while a batch-1 call has fewer than two per
 * SM and each warp keeps 4 chunks; the Llama 3.2 1B shapes on an H100's 132
 * SMs as worked out by hand. */
static void test_gemm_tc_plan(void)
{
    static const int32_t shapes[][2] = {{3072, 2048}, {2048, 2048}, {16384, 2048}, {2048, 8192}, {24, 1024},
                                        {300, 512}, {100, 96}, {7, 32}, {151936, 2048}, {128, 2048}};
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
        for (int sm = 1; sm <= 264; sm += 131) {
            cuplan_tc p;
            const int32_t out = shapes[i][0], in = shapes[i][1];
            CHECK(cuplan_gemm_tc(out, in, sm, &p) == 0, "[%d x %d] refused", out, in);
            CHECK(p.q == p.wk * p.p && p.q * p.kp == in && p.kp % 32 == 0, "[%d x %d]: q %d kp %d", out, in, p.q, p.kp);
            CHECK(p.wk >= 1 && p.wk <= CUPLAN_TC_MAX_WK && p.p >= 1, "[%d x %d]: wk %d p %d", out, in, p.wk, p.p);
            CHECK(p.p == 1 || p.kp / 32 >= 4, "[%d x %d]: a split warp keeps %d chunks", out, in, p.kp / 32);
            const int64_t tiles = (out + CUPLAN_TC_NT - 1) / CUPLAN_TC_NT;
            CHECK(p.p == 1 || tiles * p.p / 2 < 2 * sm, "[%d x %d] on %d SMs: %d CTAs along K is more than needed", out,
                  in, sm, p.p);
        }
    cuplan_tc p;
    CHECK(cuplan_gemm_tc(2048, 8192, 132, &p) == 0 && p.wk == 4 && p.p == 4 && p.kp == 512, "down: %d x %d, kp %d",
          p.wk, p.p, p.kp);
    CHECK(cuplan_gemm_tc(16384, 2048, 132, &p) == 0 && p.wk == 4 && p.p == 1, "gate|up: %d x %d", p.wk, p.p);
    CHECK(cuplan_gemm_tc(3072, 2048, 132, &p) == 0 && p.p == 2 && p.kp == 256, "q|k|v: p %d kp %d", p.p, p.kp);
    CHECK(cuplan_gemm_tc(100, 100, 132, &p) == RD_ENOTSUP && cuplan_gemm_tc(0, 64, 132, &p) == RD_ENOTSUP,
          "in %% 32 != 0 and empty shapes are refused");
    CHECK(cuplan_tc_mw(1) == 1 && cuplan_tc_mw(16) == 1 && cuplan_tc_mw(17) == 2 && cuplan_tc_mw(33) == 4,
          "m16 tiles per warp");
    /* RD_CUDA_TC_WG=auto on the 1B's shapes at 256 rows (4 batch tiles) on 132 SMs, by hand: gate|up's 16384
       rows give 64 CTAs of 4 warpgroups a batch tile (256 in all); o's and down's 2048 and q|k|v's 3072 fill
       the SMs only with 1 (128 and 192 CTAs; 2 warpgroups: 64 and 96) */
    CHECK(cuplan_wg_groups(16384, 256, 132) == 4 && cuplan_wg_groups(2048, 256, 132) == 1 &&
              cuplan_wg_groups(3072, 256, 132) == 1, "warpgroups at 256 rows: %d %d %d",
          cuplan_wg_groups(16384, 256, 132), cuplan_wg_groups(2048, 256, 132), cuplan_wg_groups(3072, 256, 132));
    CHECK(cuplan_wg_groups(3072, 512, 132) == 2 && cuplan_wg_groups(2048, 128, 132) == 1 &&
              cuplan_wg_groups(1024, 40, 4) == 4 && cuplan_wg_groups(300, 40, 4) == 1 && cuplan_wg_groups(300, 130, 4) == 4,
          "warpgroups: %d %d %d %d %d", cuplan_wg_groups(3072, 512, 132), cuplan_wg_groups(2048, 128, 132),
          cuplan_wg_groups(1024, 40, 4), cuplan_wg_groups(300, 40, 4), cuplan_wg_groups(300, 130, 4));
    /* The MoE experts' plan: the warps' split of the GEMM's plan for that length, one CTA along K whatever
     * the SMs; Qwen3-30B-A3B's gate|up (in 2048) and down (in 768) by hand. */
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        cuplan_tc m, g;
        const int32_t in = shapes[i][1];
        CHECK(cuplan_moe_tc(in, &m) == 0 && cuplan_gemm_tc(shapes[i][0], in, 132, &g) == 0, "in %d refused", in);
        CHECK(m.p == 1 && m.wk == g.wk && m.q == m.wk && m.q * m.kp == in, "moe, in %d: wk %d p %d q %d kp %d", in,
              m.wk, m.p, m.q, m.kp);
    }
    CHECK(cuplan_moe_tc(2048, &p) == 0 && p.wk == 4 && p.kp == 512, "moe gate|up: %d warps, kp %d", p.wk, p.kp);
    CHECK(cuplan_moe_tc(768, &p) == 0 && p.wk == 4 && p.kp == 192, "moe down: %d warps, kp %d", p.wk, p.kp);
    CHECK(cuplan_moe_tc(50, &p) == RD_ENOTSUP && cuplan_moe_tc(0, &p) == RD_ENOTSUP, "moe: in %% 32 != 0 refused");
}

static void test_graph_buckets(void)
{
    const int32_t caps[] = {1, 3, 7, 8, 50, 64, 100, 256, 512, 4096};
    for (size_t ci = 0; ci < sizeof caps / sizeof caps[0]; ci++) {
        int32_t cap = caps[ci], eff = cap < 256 ? cap : 256, prev = 0;
        for (int32_t m = 1; m <= 600; m++) {
            int32_t b = runner_graph_bucket(m, cap);
            if (m > eff) {
                CHECK(b == 0, "m %d over cap %d gets bucket %d", m, cap, b);
                continue;
            }
            int allowed = b == 1 || b == 2 || b == 4 || (b % 8 == 0 && b <= 256) || b == eff;
            CHECK(b >= m && b <= eff && allowed, "m %d cap %d -> bucket %d", m, cap, b);
            CHECK(b >= prev, "buckets grow with m");
            /* smallest allowed value >= m */
            for (int32_t c = m; c < b; c++)
                CHECK(!(c == 1 || c == 2 || c == 4 || (c >= 8 && c % 8 == 0) || c == eff), "m %d: %d < bucket %d fits", m, c, b);
            prev = b;
        }
    }
    CHECK(runner_graph_bucket(0, 64) == 0 && runner_graph_bucket(-1, 64) == 0, "no rows");
}

static void test_kv_budget(void)
{
    const int64_t G = (int64_t)1 << 30;
    CHECK(rd_kv_budget_bytes(100 * G, 0.9, 0) == 90 * G, "90%% of free");
    CHECK(rd_kv_budget_bytes(100 * G, 0.9, 2 * G) == 88 * G, "minus the reserve");
    CHECK(rd_kv_budget_bytes(1 * G, 0.5, 2 * G) == 0, "never negative");
    CHECK(rd_kv_budget_bytes(10 * G, 1.5, 0) == 10 * G, "util clamped to 1");
    CHECK(rd_kv_budget_bytes(10 * G, 0.0, 0) == 0 && rd_kv_budget_bytes(10 * G, NAN, 0) == 0, "util 0 or NaN");
    CHECK(rd_kv_budget_bytes(-5, 0.5, 0) == 0, "no free memory");
    CHECK(rd_kv_budget_bytes(1001, 0.5, 0) == 500, "rounded down");
    rd_backend *cpu;
    CHECK_OK(rd_backend_create("cpu", 1, &cpu));
    int64_t b = -1;
    int rc = rd_backend_kv_budget(cpu, 0.9, 0, &b);
    rd_backend_destroy(cpu);
    CHECK(rc == RD_ENOTSUP && b == 0, "the CPU backend has no device memory (rc %d)", rc);
    CHECK(rd_backend_kv_elem_bytes(NULL) == 4, "fp32 by default");
}

static void test_cuda_backend_creation(void)
{
    /* Without a device (or without the CUDA build) asking for CUDA is a
     * clear RD_ENODEV; with one it works. Either way no crash. */
    rd_backend *be = NULL;
    int rc = rd_backend_create("cuda", 1, &be);
    if (rc == 0) {
        CHECK(be && !strcmp(be->ops->name, "cuda") && rd_backend_kv_elem_bytes(be) == 2, "cuda backend");
        rd_backend_destroy(be);
    } else {
        CHECK(rc == RD_ENODEV && !be, "rc %d", rc);
        CHECK(strstr(rd_errmsg(), "cuda") != NULL, "message names the backend: %s", rd_errmsg());
#ifdef RD_HAVE_CUDA
        /* Built with CUDA: the plugin loaded (every symbol it needs resolved), and what failed is the device. */
        CHECK(!strstr(rd_errmsg(), "cannot load"), "the plugin did not load: %s", rd_errmsg());
#endif
    }
    CHECK(rd_backend_create("cuda-emu-missing", 1, &be) == RD_EINVAL, "unknown name");
}

int main(void)
{
    RUN(test_bf16_rounding);
    RUN(test_fp8_matches_quant);
    RUN(test_rng_matches_cpu_sampler);
    RUN(test_order_and_keys);
    RUN(test_exp_nonpos);
    RUN(test_tanh);
    RUN(test_attention_plan);
    RUN(test_gemm_pick);
    RUN(test_gemm_tc_plan);
    RUN(test_graph_buckets);
    RUN(test_kv_budget);
    RUN(test_cuda_backend_creation);
    TEST_EXIT();
}
