/* test_lora_op.c - the CPU backend's LoRA op (backend.h lora_apply) on the
 * adapters tests/gen_testdata.sh writes (tools/gen_lora.py, read with
 * lora_load_peft): every (layer, module) pair of an all-linear rank-64 f32
 * adapter and a rank-8 rsLoRA f16 one on tiny-qwen3, mixed with rows of no
 * adapter, against a double-precision s * B (A x) within 1e-5 relative;
 * rows without an adapter untouched; each row's bits the same alone, in
 * batches of 1..M, and with the rows in another order. */
#include <stdint.h>
#include <unistd.h>

#include "base/err.h"
#include "engine/backend.h"
#include "engine/format/gguf.h"
#include "engine/format/safetensors.h"
#include "engine/model/lora.h"
#include "engine/model/model.h"
#include "kernels/cpu/cpu_backend.h"
#include "tests/unit/test.h"

static const char *testdata(void)
{
    const char *d = getenv("RD_TESTDATA");
    return d && *d ? d : "build/testdata";
}

static uint64_t rs = 0x9e3779b97f4a7c15ull;
static float frand(void)
{
    rs ^= rs << 13, rs ^= rs >> 7, rs ^= rs << 17;
    return (float)((double)(rs >> 11) * 0x1.0p-53 * 2.0 - 1.0);
}

static int ggml_of(st_dtype d) { return d == ST_F32 ? GGML_F32 : d == ST_F16 ? GGML_F16 : GGML_BF16; }

static rd_lora_w pair_w(const lora_adapter *a, const lora_pair *p, lora_module m)
{
    return (rd_lora_w){a->rank, a->in[m], a->out[m], a->scale, ggml_of(p->a_dtype), ggml_of(p->b_dtype), p->a, p->b};
}

/* y0 + s B (A x) in double for one row. */
static double ref(const lora_adapter *ad, const lora_pair *p, lora_module m, const float *x, int32_t j, float y0)
{
    const int32_t r = ad->rank, in = ad->in[m], out = ad->out[m];
    float *A = malloc(sizeof(float) * r * in), *B = malloc(sizeof(float) * out * r);
    lora_to_f32(p->a, p->a_dtype, (size_t)r * in, A);
    lora_to_f32(p->b, p->b_dtype, (size_t)out * r, B);
    double u = 0.0;
    for (int32_t k = 0; k < r; k++) {
        double t = 0.0;
        for (int32_t i = 0; i < in; i++)
            t += (double)A[(size_t)k * in + i] * x[i];
        u += (double)B[(size_t)j * r + k] * t;
    }
    free(A), free(B);
    return y0 + (double)ad->scale * u;
}

static void test_peft_adapters_vs_double(void)
{
    char path[1200];
    snprintf(path, sizeof path, "%.500s/tiny-qwen3.gguf", testdata());
    gguf_file *g;
    model_config c;
    CHECK(gguf_open(path, &g) == 0, "cannot open %.200s (run tests/gen_testdata.sh): %s", path, rd_errmsg());
    int rc = model_config_from_gguf(g, &c);
    gguf_close(g);
    CHECK_OK(rc);
    lora_adapter *ad[2] = {NULL, NULL};
    static const char *names[2] = {"tiny-qwen3-r64-all", "tiny-qwen3-r8-attn-rslora"};
    for (int a = 0; a < 2; a++) {
        snprintf(path, sizeof path, "%.500s/lora/%s", testdata(), names[a]);
        CHECK_OK(lora_load_peft(path, &c, 64, &ad[a]));
    }
    rd_backend *be;
    CHECK_OK(rd_backend_create("cpu", 2, &be));
    enum { M = 9, PAD = 5 };
    static const int32_t slots[M] = {0, -1, 1, 0, 1, -1, 0, 1, 2}; /* slot 2: past the table */
    static const int32_t perm[M] = {4, 8, 0, 2, 7, 1, 6, 3, 5};
    int pairs = 0;
    for (int32_t l = 0; l < c.n_layers; l++)
        for (int m = 0; m < LORA_N_MODULES; m++) {
            const lora_pair *p[2] = {lora_pair_at(ad[0], l, (lora_module)m), lora_pair_at(ad[1], l, (lora_module)m)};
            if (!p[0]->a)
                continue;
            const int32_t in = ad[0]->in[m], out = ad[0]->out[m], ys = out + 2 * PAD;
            void *h[2] = {NULL, NULL};
            for (int a = 0; a < 2; a++)
                if (p[a]->a) {
                    rd_lora_w w = pair_w(ad[a], p[a], (lora_module)m);
                    CHECK_OK(be->ops->lora_load(be, &w, &h[a]));
                }
            const rd_lora_batch lb = {2, h, in, out, 64};
            float *x = malloc(sizeof(float) * M * in), *y0 = malloc(sizeof(float) * M * ys);
            float *y = malloc(sizeof(float) * M * ys), *y1 = malloc(sizeof(float) * M * ys);
            float *xp = malloc(sizeof(float) * M * in);
            int32_t sp[M];
            for (int32_t i = 0; i < M * in; i++)
                x[i] = frand();
            for (int32_t i = 0; i < M * ys; i++)
                y0[i] = frand();
            memcpy(y, y0, sizeof(float) * M * ys);
            be->ops->lora_apply(be, &lb, x, slots, M, y, ys, PAD);
            for (int32_t i = 0; i < M; i++) {
                const int s = slots[i];
                const int has = (s == 0 || s == 1) && h[s];
                for (int32_t j = 0; j < ys; j++) {
                    const size_t e = (size_t)i * ys + j;
                    if (!has || j < PAD || j >= PAD + out) {
                        CHECK(y[e] == y0[e], "layer %d %s row %d col %d changed", l, lora_module_name(m), i, j);
                        continue;
                    }
                    const double want = ref(ad[s], p[s], (lora_module)m, x + (size_t)i * in, j - PAD, y0[e]);
                    const double term = want - y0[e];
                    CHECK(fabs(y[e] - want) <= 1e-5 * (fabs(want) > fabs(term) ? fabs(want) : fabs(term)) + 1e-7,
                          "layer %d %s row %d (adapter %d) col %d: %.9g vs %.9g", l, lora_module_name(m), i, s, j,
                          y[e], want);
                }
            }
            /* batches 1..M of the leading rows, and the rows permuted: the same bits per row */
            for (int32_t n = 1; n <= M; n++) {
                memcpy(y1, y0, sizeof(float) * n * ys);
                be->ops->lora_apply(be, &lb, x, slots, n, y1, ys, PAD);
                CHECK(!memcmp(y1, y, sizeof(float) * n * ys), "layer %d %s: a batch of %d rows differs", l,
                      lora_module_name(m), n);
            }
            for (int32_t i = 0; i < M; i++) {
                memcpy(xp + (size_t)i * in, x + (size_t)perm[i] * in, sizeof(float) * in);
                memcpy(y1 + (size_t)i * ys, y0 + (size_t)perm[i] * ys, sizeof(float) * ys);
                sp[i] = slots[perm[i]];
            }
            be->ops->lora_apply(be, &lb, xp, sp, M, y1, ys, PAD);
            for (int32_t i = 0; i < M; i++)
                CHECK(!memcmp(y1 + (size_t)i * ys, y + (size_t)perm[i] * ys, sizeof(float) * ys),
                      "layer %d %s: row %d differs with the rows in another order", l, lora_module_name(m), perm[i]);
            for (int a = 0; a < 2; a++)
                be->ops->lora_free(be, h[a]);
            free(x), free(y0), free(y), free(y1), free(xp);
            pairs++;
        }
    CHECK(pairs == c.n_layers * 7, "%d pairs checked, want every module of %d layers", pairs, c.n_layers);
    rd_backend_destroy(be);
    lora_free(ad[0]);
    lora_free(ad[1]);
}

/* lora_load refuses what is not a LoRA pair. */
static void test_load_refusals(void)
{
    rd_backend *be;
    CHECK_OK(rd_backend_create("cpu", 1, &be));
    float a[8] = {0}, b[8] = {0};
    void *h = NULL;
    rd_lora_w w = {2, 4, 4, 1.0f, GGML_F32, GGML_F32, a, b};
    CHECK_OK(be->ops->lora_load(be, &w, &h));
    /* fp32: A in lane order (no whole chunk at in = 4: all of it is the [rank][8] tail), B transposed; three
     * buffers, each allocated as a multiple of 64 bytes (an empty one too) */
    CHECK(be->ops->lora_bytes(be, h) == 64 + 64 + 64, "%lld bytes", (long long)be->ops->lora_bytes(be, h));
    be->ops->lora_free(be, h);
    w.in = 520; /* 65 chunks: three rounds of 32 in lane order, 8 x 32 floats each per rank */
    float a2[2 * 520] = {0};
    w.a = a2;
    CHECK_OK(be->ops->lora_load(be, &w, &h));
    CHECK(be->ops->lora_bytes(be, h) == 4 * 2 * 3 * 256 + 64 + 64, "%lld bytes",
          (long long)be->ops->lora_bytes(be, h));
    be->ops->lora_free(be, h);
    /* bf16 A and f16 B stay 16-bit: half of A's lane-order bytes */
    rd_lora_w w16 = w;
    w16.a_type = GGML_BF16;
    w16.b_type = GGML_F16;
    CHECK_OK(be->ops->lora_load(be, &w16, &h));
    CHECK(be->ops->lora_bytes(be, h) == 2 * 2 * 3 * 256 + 64 + 64, "%lld bytes",
          (long long)be->ops->lora_bytes(be, h));
    be->ops->lora_free(be, h);
    w.in = 4;
    w.a = a;
    rd_lora_w bad[4] = {w, w, w, w};
    bad[0].rank = 0;
    bad[1].a_type = GGML_Q8_0;
    bad[2].b = NULL;
    bad[3].rank = RD_LORA_MAX_RANK + 1;
    for (int i = 0; i < 4; i++) {
        h = (void *)1;
        CHECK(be->ops->lora_load(be, &bad[i], &h) == RD_EINVAL && h == NULL, "case %d: %s", i, rd_errmsg());
    }
    rd_backend_destroy(be);
}

static void ensure_testdata(void)
{
    if (access("tests/gen_testdata.sh", X_OK) == 0) {
        char cmd[700];
        snprintf(cmd, sizeof cmd, "tests/gen_testdata.sh '%.500s' >/dev/null", testdata());
        if (system(cmd) != 0)
            fprintf(stderr, "test_lora_op: %s failed\n", cmd);
    }
}

int main(void)
{
    ensure_testdata();
    RUN(test_peft_adapters_vs_double);
    RUN(test_load_refusals);
    TEST_EXIT();
}
