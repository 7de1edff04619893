/* test_cpu_isa.c - the CPU kernels' vector paths give the same bits
 * (base/cpu_isa.h): plain C, AVX2 and AVX-512, each forced in turn with
 * cpu_isa_set, on the same inputs in one process.
 *
 * - paged attention over f32, bf16 and f16 caches (GQA, several sequences,
 *   decode and prefill rows, head sizes with and without an 8-lane tail,
 *   with and without a sliding window): every path's output is memcmp-equal
 *   to the plain C one, and the plain C one is within a rounding bound of a
 *   float64 reference (so the paths agree on attention, not on nothing);
 * - the logits of every tiny model of tests/gen_testdata.sh (each weight
 *   dtype the CPU backend keeps, the mixture of experts, every family) and of
 *   the default model, for prompts of 1, 2, 3 and 9 tokens (the one-row,
 *   small-batch and panel-decoding GEMM paths): memcmp-equal on every path;
 * - LoRA's apply: every path memcmp-equal to plain C, and A and B kept in
 *   f16 and bf16 (either, both, mixed) equal to fp32 copies of the same values;
 * - the level names parse, and a level the host lacks is refused.
 * Paths the host lacks are reported as SKIP lines. test_gemm runs under
 * RD_CPU_ISA=scalar and avx2 too (tests/run.sh): its checks against the
 * scalar fmaf chain then hold on those paths. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "base/cpu_isa.h"
#include "base/err.h"
#include "engine/format/gguf.h"
#include "engine/model/loader.h"
#include "kernels/cpu/attention.h"
#include "tests/unit/engine_helpers.h"
#include "tests/unit/test.h"

static uint64_t lcg(uint64_t *x)
{
    *x = *x * 6364136223846793005ull + 1442695040888963407ull;
    return *x >> 11;
}

/* Uniform in [-1, 1). */
static float unit(uint64_t *x) { return (float)((double)lcg(x) / (double)(1ull << 53)) * 2.0f - 1.0f; }

static uint16_t f32_to_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return (uint16_t)((u + 0x7fff + ((u >> 16) & 1)) >> 16);
}

/* f32 -> f16, rounded to nearest even; the inputs here are normal and < 2. */
static uint16_t f32_to_f16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    uint32_t sign = (u >> 16) & 0x8000, mant = u & 0x7fffff;
    int32_t e = (int32_t)((u >> 23) & 0xff) - 127 + 15;
    if (e <= 0)
        return (uint16_t)sign;
    uint32_t h = (uint32_t)e << 10 | mant >> 13, rest = mant & 0x1fff;
    if (rest > 0x1000 || (rest == 0x1000 && (h & 1)))
        h++;
    return (uint16_t)(sign | h);
}

static float kv_value(const void *cache, int type, size_t i)
{
    if (type == CPU_KV_F32)
        return ((const float *)cache)[i];
    uint16_t h = ((const uint16_t *)cache)[i];
    return type == CPU_KV_F16 ? rd_f16_to_f32(h) : rd_bf16_to_f32(h);
}

/* One attention problem: 3 sequences (a decode row at position 40, a prefill
 * of 7 rows from position 0, a decode row at position 130) over a paged cache
 * whose block tables are shuffled. */
typedef struct {
    rd_attn_shape a;
    int32_t n_rows, n_seqs, max_blocks, n_blocks;
    int32_t positions[16], q_start[4], ctx_len[3], block_tables[3 * 16], slots[16], tok[16];
    float *q;                   /* [n_rows][n_heads * head_dim] */
    void *k, *v;                /* [n_blocks][n_kv][block_size][head_dim] of type */
    int type;
} attn_case;

static int attn_make(attn_case *c, int type, int32_t head_dim, int32_t window, uint64_t seed)
{
    memset(c, 0, sizeof *c);
    c->a = (rd_attn_shape){.n_heads = 4, .n_kv_heads = 2, .head_dim = head_dim, .block_size = 16,
                           .scale = 1.0f / sqrtf((float)head_dim), .window = window};
    c->type = type;
    c->n_seqs = 3;
    c->max_blocks = 16;
    c->n_blocks = 3 * 16;
    const int32_t starts[3] = {40, 0, 130}, lens[3] = {1, 7, 1};
    int32_t row = 0;
    for (int s = 0; s < 3; s++) {
        c->q_start[s] = row;
        for (int32_t i = 0; i < lens[s]; i++)
            c->positions[row++] = starts[s] + i;
        c->ctx_len[s] = starts[s] + lens[s];
    }
    c->q_start[3] = c->n_rows = row;
    /* Blocks of sequence s: a permutation, so reads go through the table. */
    for (int s = 0; s < 3; s++)
        for (int b = 0; b < 16; b++)
            c->block_tables[s * 16 + b] = ((b * 7 + s * 5) % 16) * 3 + s;
    uint64_t x = seed;
    const size_t qn = (size_t)c->n_rows * c->a.n_heads * head_dim;
    const size_t kn = (size_t)c->n_blocks * c->a.n_kv_heads * c->a.block_size * head_dim;
    const size_t es = type == CPU_KV_F32 ? 4 : 2;
    c->q = malloc(sizeof(float) * qn);
    c->k = malloc(es * kn);
    c->v = malloc(es * kn);
    if (!c->q || !c->k || !c->v)
        return RD_ENOMEM;
    for (size_t i = 0; i < qn; i++)
        c->q[i] = unit(&x);
    for (size_t i = 0; i < kn; i++) {
        float kv[2] = {unit(&x), unit(&x)};
        void *dst[2] = {c->k, c->v};
        for (int j = 0; j < 2; j++) {
            if (type == CPU_KV_F32)
                ((float *)dst[j])[i] = kv[j];
            else
                ((uint16_t *)dst[j])[i] = type == CPU_KV_F16 ? f32_to_f16(kv[j]) : f32_to_bf16(kv[j]);
        }
    }
    return 0;
}

static void attn_free(attn_case *c)
{
    free(c->q), free(c->k), free(c->v);
}

static void attn_run(const attn_case *c, float *out)
{
    rd_step_dev s = {.n_rows = c->n_rows, .n_seqs = c->n_seqs, .max_blocks = c->max_blocks, .token_ids = c->tok,
                     .positions = c->positions, .slots = c->slots, .q_start = c->q_start, .ctx_len = c->ctx_len,
                     .block_tables = c->block_tables};
    cpu_attention(c->type, &c->a, c->q, c->a.n_heads * c->a.head_dim, &s, c->k, c->v, out);
}

/* Largest |out - float64 attention| over every row and head. */
static double attn_ref_err(const attn_case *c, const float *out)
{
    const rd_attn_shape *a = &c->a;
    const int32_t hd = a->head_dim, nkv = a->n_kv_heads, group = a->n_heads / nkv, bs = a->block_size;
    double worst = 0.0, sc[256], acc[128];
    for (int32_t row = 0; row < c->n_rows; row++) {
        int seq = row >= c->q_start[2] ? 2 : row >= c->q_start[1] ? 1 : 0;
        int32_t end = c->positions[row] + 1, j0 = a->window > 0 && end > a->window ? end - a->window : 0;
        for (int32_t h = 0; h < a->n_heads; h++) {
            const float *q = c->q + ((size_t)row * a->n_heads + h) * hd;
            int32_t kvh = h / group;
            double mx = -INFINITY, sum = 0.0;
            for (int32_t j = j0; j < end; j++) {
                size_t off = (((size_t)c->block_tables[seq * 16 + j / bs] * nkv + kvh) * bs + j % bs) * hd;
                double d = 0.0;
                for (int32_t e = 0; e < hd; e++)
                    d += (double)q[e] * kv_value(c->k, c->type, off + e);
                sc[j - j0] = d * a->scale;
                mx = sc[j - j0] > mx ? sc[j - j0] : mx;
            }
            for (int32_t e = 0; e < hd; e++)
                acc[e] = 0.0;
            for (int32_t j = j0; j < end; j++)
                sum += exp(sc[j - j0] - mx);
            for (int32_t j = j0; j < end; j++) {
                size_t off = (((size_t)c->block_tables[seq * 16 + j / bs] * nkv + kvh) * bs + j % bs) * hd;
                double p = exp(sc[j - j0] - mx) / sum;
                for (int32_t e = 0; e < hd; e++)
                    acc[e] += p * kv_value(c->v, c->type, off + e);
            }
            const float *o = out + ((size_t)row * a->n_heads + h) * hd;
            for (int32_t e = 0; e < hd; e++)
                worst = fmax(worst, fabs((double)o[e] - acc[e]));
        }
    }
    return worst;
}

static void test_isa_names(void)
{
    for (int i = 0; i < CPU_ISA_COUNT; i++) {
        cpu_isa got;
        CHECK_OK(cpu_isa_parse(cpu_isa_name((cpu_isa)i), &got));
        CHECK(got == (cpu_isa)i, "%s parsed as %d", cpu_isa_name((cpu_isa)i), (int)got);
    }
    cpu_isa got;
    CHECK(cpu_isa_parse("avx9", &got) == RD_EINVAL, "avx9 accepted");
    CHECK(cpu_isa_parse("", &got) == RD_EINVAL, "an empty name accepted");
    CHECK(cpu_isa_set((cpu_isa)CPU_ISA_COUNT) == RD_EINVAL, "a level past avx512 accepted");
    if (cpu_isa_best() < CPU_ISA_AVX512)
        CHECK(cpu_isa_set(CPU_ISA_AVX512) == RD_EINVAL, "avx512 accepted on a host without it");
    CHECK_OK(cpu_isa_set(cpu_isa_best()));
    CHECK(cpu_isa_active() == cpu_isa_best(), "the set level is not the active one");
}

static void test_attention_paths(void)
{
    const int types[3] = {CPU_KV_F32, CPU_KV_BF16, CPU_KV_F16};
    const int32_t dims[2] = {64, 44};        /* 44: 5 lanes of 8 and a tail of 4 */
    const int32_t windows[2] = {0, 23};
    int compared = 0;
    for (int ti = 0; ti < 3; ti++)
        for (int di = 0; di < 2; di++)
            for (int wi = 0; wi < 2; wi++) {
                attn_case c;
                CHECK_OK(attn_make(&c, types[ti], dims[di], windows[wi], 1000 + ti * 10 + di * 2 + wi));
                size_t n = (size_t)c.n_rows * c.a.n_heads * c.a.head_dim;
                float *ref = malloc(sizeof(float) * n), *got = malloc(sizeof(float) * n);
                CHECK(ref && got, "oom");
                CHECK_OK(cpu_isa_set(CPU_ISA_SCALAR));
                attn_run(&c, ref);
                double err = attn_ref_err(&c, ref);
                int bad = -1;
                for (int isa = CPU_ISA_AVX2; isa <= (int)cpu_isa_best() && bad < 0; isa++) {
                    CHECK_OK(cpu_isa_set((cpu_isa)isa));
                    memset(got, 0xff, sizeof(float) * n);
                    attn_run(&c, got);
                    if (memcmp(ref, got, sizeof(float) * n))
                        bad = isa;
                    compared++;
                }
                size_t at = 0;
                while (bad >= 0 && at < n && !memcmp(&ref[at], &got[at], 4))
                    at++;
                attn_free(&c);
                free(ref);
                free(got);
                CHECK(err < 1e-5, "kv type %d, head_dim %d, window %d: plain C off the float64 reference by %.3g",
                      types[ti], dims[di], windows[wi], err);
                CHECK(bad < 0, "kv type %d, head_dim %d, window %d: %s differs from plain C at element %zu",
                      types[ti], dims[di], windows[wi], cpu_isa_name((cpu_isa)bad), at);
            }
    CHECK_OK(cpu_isa_set(cpu_isa_best()));
    if (!compared)
        printf("SKIP attention_vector_paths: this CPU has no AVX2 (plain C checked against float64 only)\n");
}

/* LoRA's apply (kernels/cpu/lora.c) on every path, against plain C: ranks that are not a multiple of the
 * vector paths' k block, an input with a partial round of 32 chunks and a tail past the last chunk, an
 * output with a partial vector, f16 and bf16 A and B, rows of two adapters and the base model. The
 * plain C path is the CUDA kernel's order (test_lora_op and the emulator check it). */
static void test_lora_paths(void)
{
    rd_backend *be;
    CHECK_OK(rd_backend_create("cpu", 0, &be));
    const int32_t in = 581, out = 100, m = 17;
    const int32_t ranks[2] = {7, 33};
    uint64_t x = 4242;
    void *h[2] = {NULL, NULL};
    for (int q = 0; q < 2; q++) {
        const int32_t r = ranks[q];
        uint16_t *a = malloc(sizeof(uint16_t) * (size_t)r * in);
        float *b = malloc(sizeof(float) * (size_t)out * r);
        CHECK(a && b, "oom");
        for (size_t i = 0; i < (size_t)r * in; i++)
            a[i] = q ? f32_to_bf16(unit(&x)) : f32_to_f16(unit(&x) * 0.5f);
        for (size_t i = 0; i < (size_t)out * r; i++)
            b[i] = unit(&x);
        rd_lora_w w = {r, in, out, 0.75f + q, q ? GGML_BF16 : GGML_F16, GGML_F32, a, b};
        CHECK_OK(be->ops->lora_load(be, &w, &h[q]));
        free(a);
        free(b);
    }
    rd_lora_batch lb = {.n_slots = 2, .w = h, .in = in, .out = out, .max_rank = 33};
    float *xin = malloc(sizeof(float) * (size_t)m * in), *ref = malloc(sizeof(float) * (size_t)m * (out + 3));
    float *got = malloc(sizeof(float) * (size_t)m * (out + 3));
    CHECK(xin && ref && got, "oom");
    for (size_t i = 0; i < (size_t)m * in; i++)
        xin[i] = unit(&x);
    /* adapter 1's ten rows make groups of four (the AVX-512 path's) and leftovers */
    int32_t slots[17] = {0, 1, -1, 1, 0, 0, -1, 1, 1, 1, 1, 1, 1, 1, -1, 0, 1};
    int compared = 0, bad = -1;
    for (int isa = CPU_ISA_SCALAR; isa <= (int)cpu_isa_best() && bad < 0; isa++) {
        CHECK_OK(cpu_isa_set((cpu_isa)isa));
        float *y = isa == CPU_ISA_SCALAR ? ref : got;
        for (size_t i = 0; i < (size_t)m * (out + 3); i++)
            y[i] = (float)i * 0.001f;
        be->ops->lora_apply(be, &lb, xin, slots, m, y, out + 3, 2);
        if (isa != CPU_ISA_SCALAR) {
            compared++;
            if (memcmp(ref, got, sizeof(float) * (size_t)m * (out + 3)))
                bad = isa;
        }
    }
    CHECK_OK(cpu_isa_set(cpu_isa_best()));
    int changed = 0;
    for (int32_t i = 0; i < m; i++)
        changed += ref[(size_t)i * (out + 3) + 2] != (float)((size_t)i * (out + 3) + 2) * 0.001f;
    for (int q = 0; q < 2; q++)
        be->ops->lora_free(be, h[q]);
    be->ops->destroy(be);
    free(xin);
    free(ref);
    free(got);
    CHECK(changed == 14, "%d rows changed; want the 14 with an adapter", changed);
    CHECK(bad < 0, "%s differs from plain C", bad >= 0 ? cpu_isa_name((cpu_isa)bad) : "");
    if (!compared)
        printf("SKIP lora_vector_paths: this CPU has no AVX2\n");
}

/* A LoRA pair's A or B of n values in dtype t: f16 (some subnormal, which widen to normal fp32), bf16 (some
 * subnormal) or f32; v gets the values widened (rd_f16_to_f32 / rd_bf16_to_f32, not the kernels'
 * conversions). */
static void *lora_values(int32_t t, size_t n, uint64_t *x, float *v)
{
    void *p = malloc(n * (t == GGML_F32 ? sizeof(float) : sizeof(uint16_t)));
    if (!p)
        return NULL;
    for (size_t i = 0; i < n; i++) {
        const float f = unit(x);
        if (t == GGML_F32) {
            ((float *)p)[i] = v[i] = f;
            continue;
        }
        uint16_t h = t == GGML_F16 ? f32_to_f16(f * 0.5f) : f32_to_bf16(f);
        if (i % 29 == 3)        /* a subnormal, with f's sign */
            h = (uint16_t)((f < 0 ? 0x8000u : 0u) | (1u + (uint32_t)(i % (t == GGML_F16 ? 0x3ff : 0x7f))));
        ((uint16_t *)p)[i] = h;
        v[i] = t == GGML_F16 ? rd_f16_to_f32(h) : rd_bf16_to_f32(h);
    }
    return p;
}

/* Bytes the CPU backend holds for a pair: A in lane order (whole rounds of 32 chunks of 8) and its [rank][8]
 * tail in A's dtype, B in B's, each buffer a multiple of 64 bytes. */
static int64_t lora_resident(int32_t r, int32_t in, int32_t out, int32_t at, int32_t bt)
{
    const int64_t ea = at == GGML_F32 ? 4 : 2, eb = bt == GGML_F32 ? 4 : 2;
    const int64_t rounds = (in / 8 + 31) / 32;
#define UP64(b) (((b) + 63) / 64 * 64)
    return UP64(r * rounds * 256 * ea) + UP64(r * 8 * ea) + UP64((int64_t)out * r * eb);
#undef UP64
}

/* One shape of test_lora_dtypes: 8 adapters, every pairing of A's and B's dtypes with an f16 or bf16 one,
 * loaded as they are and as fp32 copies of the same (widened) values; on each path both batches' outputs
 * must be the fp32 ones' on plain C, bit for bit. 0, or 1 with why. */
static int lora_dtype_case(rd_backend *be, int32_t in, int32_t out, char *why, size_t cap)
{
    enum { NA = 8, PER = 13, M = (NA + 1) * PER };
    static const int32_t ranks[NA] = {7, 33, 6, 5, 10, 3, 9, 1};
    static const int32_t at[NA] = {GGML_BF16, GGML_F16, GGML_BF16, GGML_F16, GGML_F32, GGML_BF16, GGML_F16, GGML_F32};
    static const int32_t bt[NA] = {GGML_BF16, GGML_F16, GGML_F16, GGML_BF16, GGML_BF16, GGML_F32, GGML_F32, GGML_F16};
    const int32_t ys = out + 3;
    uint64_t x = 99u + (uint64_t)in * 1000u + (uint64_t)out;
    void *h16[NA] = {NULL}, *h32[NA] = {NULL};
    float *xin = malloc(sizeof(float) * (size_t)M * in), *ref = malloc(sizeof(float) * (size_t)M * ys);
    float *y16 = malloc(sizeof(float) * (size_t)M * ys), *y32 = malloc(sizeof(float) * (size_t)M * ys);
    int bad = !xin || !ref || !y16 || !y32;
    if (bad)
        snprintf(why, cap, "oom");
    for (int q = 0; q < NA && !bad; q++) {
        const int32_t r = ranks[q];
        float *av = malloc(sizeof(float) * (size_t)r * in), *bv = malloc(sizeof(float) * (size_t)out * r);
        void *a = av ? lora_values(at[q], (size_t)r * in, &x, av) : NULL;
        void *b = bv ? lora_values(bt[q], (size_t)out * r, &x, bv) : NULL;
        if (!a || !b) {
            snprintf(why, cap, "oom");
            bad = 1;
        } else {
            const float s = 0.5f + 0.25f * (float)q;
            rd_lora_w w = {r, in, out, s, at[q], bt[q], a, b}, w32 = {r, in, out, s, GGML_F32, GGML_F32, av, bv};
            if (be->ops->lora_load(be, &w, &h16[q]) || be->ops->lora_load(be, &w32, &h32[q])) {
                snprintf(why, cap, "[%d] -> [%d], adapter %d: lora_load: %s", in, out, q, rd_errmsg());
                bad = 1;
            } else if (be->ops->lora_bytes(be, h16[q]) != lora_resident(r, in, out, at[q], bt[q]) ||
                       be->ops->lora_bytes(be, h32[q]) != lora_resident(r, in, out, GGML_F32, GGML_F32)) {
                snprintf(why, cap, "[%d] -> [%d], adapter %d: lora_bytes %lld and %lld (fp32 copy), want %lld and %lld",
                         in, out, q, (long long)be->ops->lora_bytes(be, h16[q]),
                         (long long)be->ops->lora_bytes(be, h32[q]),
                         (long long)lora_resident(r, in, out, at[q], bt[q]),
                         (long long)lora_resident(r, in, out, GGML_F32, GGML_F32));
                bad = 1;
            }
        }
        free(a);
        free(b);
        free(av);
        free(bv);
    }
    /* Each adapter's 13 rows and 13 of the base model, interleaved: grouped by adapter, they make groups
     * of four (rows4_avx512) and single rows, depending on where a task's rows start. */
    int32_t slots[M];
    for (int32_t i = 0; i < M; i++)
        slots[i] = (i * 5) % (NA + 1) - 1;
    for (size_t i = 0; i < (size_t)M * in && !bad; i++)
        xin[i] = unit(&x);
    rd_lora_batch l16 = {.n_slots = NA, .w = h16, .in = in, .out = out, .max_rank = 33};
    rd_lora_batch l32 = {.n_slots = NA, .w = h32, .in = in, .out = out, .max_rank = 33};
    for (int isa = CPU_ISA_SCALAR; isa <= (int)cpu_isa_best() && !bad; isa++) {
        cpu_isa_set((cpu_isa)isa);
        float *a32 = isa == CPU_ISA_SCALAR ? ref : y32;
        for (size_t i = 0; i < (size_t)M * ys; i++)
            a32[i] = y16[i] = (float)i * 0.001f;
        be->ops->lora_apply(be, &l32, xin, slots, M, a32, ys, 2);
        be->ops->lora_apply(be, &l16, xin, slots, M, y16, ys, 2);
        /* and the first three rows alone: few enough multiply-adds to run on the calling thread */
        float *y3 = y16 + (size_t)(M - 3) * ys;
        for (size_t i = 0; i < (size_t)3 * ys; i++)
            y3[i] = (float)i * 0.001f;
        be->ops->lora_apply(be, &l16, xin, slots, 3, y3, ys, 2);
        const char *what = memcmp(ref, a32, sizeof(float) * (size_t)M * ys) ? "the fp32 copies"
                           : memcmp(ref, y16, sizeof(float) * (size_t)(M - 3) * ys) ? "the file's dtypes"
                           : memcmp(ref, y3, sizeof(float) * (size_t)3 * ys) ? "the file's dtypes, rows 0-2 alone"
                                                                             : NULL;
        if (what) {
            snprintf(why, cap, "[%d] -> [%d]: %s on %s differ from the fp32 copies on plain C", in, out, what,
                     cpu_isa_name((cpu_isa)isa));
            bad = 1;
        }
    }
    cpu_isa_set(cpu_isa_best());
    /* the adapters' rows changed (most of their outputs), the base model's rows not at all */
    int changed = 0, base = 0;
    for (int32_t i = 0; i < M && !bad; i++)
        for (int32_t j = 0; j < ys; j++) {
            const int c = ref[(size_t)i * ys + j] != (float)((size_t)i * ys + j) * 0.001f;
            changed += c && slots[i] >= 0;
            base += c && slots[i] < 0;
        }
    if (!bad && (changed < NA * PER * out / 2 || base)) {
        snprintf(why, cap, "[%d] -> [%d]: %d outputs of the %d adapter rows changed (want most), %d of the base's",
                 in, out, changed, NA * PER, base);
        bad = 1;
    }
    for (int q = 0; q < NA; q++) {
        be->ops->lora_free(be, h16[q]);
        be->ops->lora_free(be, h32[q]);
    }
    free(xin);
    free(ref);
    free(y16);
    free(y32);
    return bad;
}

/* A and B kept in their file dtype (f16, bf16; A's and B's may differ) give the bits of fp32 copies of the
 * same values on every path: an input with a partial round and a tail (581), one under a single round
 * (13), one of whole rounds (512); outputs past the last whole vector of every path (100, 80) and under
 * one vector (7); ranks not a multiple of the k blocks (2, 4); rank 1. lora_bytes is the buffers'. */
static void test_lora_dtypes(void)
{
    rd_backend *be;
    CHECK_OK(rd_backend_create("cpu", 0, &be));
    /* 584: whole chunks only (the vector paths' butterfly in registers), 73 of them: nine 8x8 transposes
     * of x and one chunk past them in a partial round */
    static const int32_t shapes[4][2] = {{581, 100}, {13, 7}, {512, 80}, {584, 40}};
    char why[400] = "";
    int bad = 0;
    for (int i = 0; i < 4 && !bad; i++)
        bad = lora_dtype_case(be, shapes[i][0], shapes[i][1], why, sizeof why);
    be->ops->destroy(be);
    CHECK(!bad, "%s", why);
    if (cpu_isa_best() < CPU_ISA_AVX2)
        printf("SKIP lora_dtypes_vector_paths: this CPU has no AVX2\n");
}

/* Logits of prompts of each length on every path, against plain C. */
static int model_paths(const char *path, const int32_t *lens, int n_lens, char *why, size_t cap)
{
    rd_loaded l;
    if (rd_load(path, "cpu", 0, &l)) {
        snprintf(why, cap, "%s: %s (run tests/gen_testdata.sh / make model)", path, rd_errmsg());
        return 1;
    }
    const int32_t vocab = l.m->cfg.vocab;
    int32_t maxn = 0, ids[64];
    for (int i = 0; i < n_lens; i++)
        maxn = lens[i] > maxn ? lens[i] : maxn;
    float *ref = malloc(sizeof(float) * maxn * vocab), *got = malloc(sizeof(float) * maxn * vocab);
    int bad = !ref || !got;
    uint64_t x = 77;
    for (int i = 0; i < n_lens && !bad; i++) {
        const int32_t n = lens[i];
        for (int32_t t = 0; t < n; t++)
            ids[t] = (int32_t)(lcg(&x) % (uint64_t)vocab);
        cpu_isa_set(CPU_ISA_SCALAR);
        if (seq_logits(l.m, ids, n, ref)) {
            snprintf(why, cap, "%s: forward: %s", path, rd_errmsg());
            bad = 1;
        }
        for (int isa = CPU_ISA_AVX2; isa <= (int)cpu_isa_best() && !bad; isa++) {
            cpu_isa_set((cpu_isa)isa);
            if (seq_logits(l.m, ids, n, got)) {
                snprintf(why, cap, "%s: forward: %s", path, rd_errmsg());
                bad = 1;
            } else if (memcmp(ref, got, sizeof(float) * n * vocab)) {
                size_t j = 0;
                while (!memcmp(&ref[j], &got[j], 4))
                    j++;
                snprintf(why, cap, "%s, %d tokens: logit [%zu][%zu] %.9g (plain C) vs %.9g (%s)", path, n,
                         j / vocab, j % vocab, ref[j], got[j], cpu_isa_name((cpu_isa)isa));
                bad = 1;
            }
        }
    }
    cpu_isa_set(cpu_isa_best());
    free(ref);
    free(got);
    rd_unload(&l);
    return bad;
}

static void test_tiny_model_paths(void)
{
    static const char *names[] = {"tiny-f32",  "tiny-f16",  "tiny-bf16",  "tiny-q8_0",    "tiny-q4_0",
                                  "tiny-q4_1", "tiny-q5_0", "tiny-q5_1",  "tiny-q4_k",    "tiny-q5_k",
                                  "tiny-q6_k", "tiny-qwen2", "tiny-qwen3", "tiny-gemma3", "tiny-llama3",
                                  "tiny-moe-q4_k_m", "tiny-moe-q8_0", "tiny-moe-bf16"};
    const int32_t lens[] = {1, 2, 3, 9, 40};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        char path[256], why[400] = "";
        snprintf(path, sizeof path, "%s/%s.gguf", testdata(), names[i]);
        CHECK(!model_paths(path, lens, 5, why, sizeof why), "%s", why);
    }
}

static void test_default_model_paths(void)
{
    /* Under AddressSanitizer the plain C path on the default model took 253 s of the suite on an
     * AVX-512 host (every fmaf a libm call, ~3x slower again): one row length there; the plain build
     * compares all four, and ASan's tiny models cover the code. */
#if defined(__SANITIZE_ADDRESS__)
    const int32_t lens[] = {1};
#else
    const int32_t lens[] = {1, 2, 3, 9};
#endif
    const int n = (int)(sizeof lens / sizeof lens[0]);
    char why[400] = "";
    CHECK(file_exists(real_model_path()), "%s missing (make model)", real_model_path());
    CHECK(!model_paths(real_model_path(), lens, n, why, sizeof why), "%s", why);
}

int main(void)
{
    printf("# host: best %s\n", cpu_isa_name(cpu_isa_best()));
    if (cpu_isa_best() < CPU_ISA_AVX512)
        printf("SKIP avx512_paths: this CPU has no AVX-512 (compared: plain C%s)\n",
               cpu_isa_best() >= CPU_ISA_AVX2 ? " and AVX2" : " only");
    RUN(test_isa_names);
    RUN(test_attention_paths);
    RUN(test_lora_paths);
    RUN(test_lora_dtypes);
    RUN(test_tiny_model_paths);
    RUN(test_default_model_paths);
    TEST_EXIT();
}
