/* rollout-gemmbench - the linear-layer GEMM alone, on one thread: file-dtype
 * weights (kernels/cpu/gemm_quant.h) next to the same weights widened to
 * fp32 (gemm.h), in CPU time of the calling thread, so other work on a shared
 * machine moves the numbers less than wall time would.
 *   rollout-gemmbench [--type q4_1] [--rows 1,32] [--out 3072] [--in 576]
 * Eight random weights of [out][in] (8 x 3072 x 576 Q4_1 = 8.8 MB, past the
 * caches, as a decode step streams its layers) are multiplied in turn; the
 * best of 7 repetitions is printed per row count: weights per second (one
 * weight times M rows counts M) and the weight bytes streamed per second. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/err.h"
#include "engine/format/gguf.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/gemm_quant.h"
#include "base/pool.h"
#include "tools/cli.h"

static const char *P = "rollout-gemmbench";

#define N_MATS 8

static double cpu_seconds(void)
{
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static int type_by_name(const char *s)
{
    static const int32_t ts[] = {GGML_F32,  GGML_F16,  GGML_BF16, GGML_Q8_0, GGML_Q4_0, GGML_Q4_1,
                                 GGML_Q5_0, GGML_Q5_1, GGML_Q4_K, GGML_Q5_K, GGML_Q6_K};
    for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++)
        if (!strcmp(s, ggml_type_name(ts[i])))
            return ts[i];
    return -1;
}

int main(int argc, char **argv)
{
    const char *tname = "q4_1";
    int32_t *rows = NULL, n_rows = 0, out = 3072, in = 576;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--type")) tname = cli_value(P, argc, argv, &i);
        else if (!strcmp(a, "--rows")) rows = cli_ids(P, a, cli_value(P, argc, argv, &i), &n_rows);
        else if (!strcmp(a, "--out")) out = (int32_t)cli_int(P, a, cli_value(P, argc, argv, &i), 1, 1 << 20);
        else if (!strcmp(a, "--in")) in = (int32_t)cli_int(P, a, cli_value(P, argc, argv, &i), 1, 1 << 20);
        else cli_die(P, "unknown flag '%s'%s (see the comment at the top of rollout-gemmbench.c)", a, "");
    }
    const int type = type_by_name(tname);
    if (type < 0)
        cli_die(P, "unknown --type '%s'%s (f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, q4_K, q5_K, q6_K)", tname, "");
    if (!rows) {
        static int32_t dflt[] = {1, 32};
        rows = malloc(sizeof dflt);
        memcpy(rows, dflt, sizeof dflt);
        n_rows = 2;
    }
    int32_t max_m = 1;
    for (int32_t i = 0; i < n_rows; i++)
        max_m = rows[i] > max_m ? rows[i] : max_m;
    pool_init(1);
    if (gemm_qreserve(in))
        cli_die(P, "%s%s", rd_errmsg(), "");
    size_t rb = ggml_row_bytes(type, (uint64_t)in);
    if (rb == 0)
        cli_die(P, "--in is not a multiple of the %s block%s", tname, "");
    uint32_t blck, bb;
    ggml_type_layout(type, &blck, &bb);
    gemm_qlinear *Q = calloc(N_MATS, sizeof *Q);
    gemm_weight F[N_MATS];
    float *w = malloc(sizeof(float) * (size_t)out * in), *x = malloc(sizeof(float) * (size_t)max_m * in);
    float *y = malloc(sizeof(float) * (size_t)max_m * out);
    uint8_t *raw = malloc(rb * (size_t)out);
    if (!Q || !w || !x || !y || !raw)
        cli_die(P, "out of memory%s%s", "", "");
    uint64_t s = 1;
    for (int i = 0; i < N_MATS; i++) {
        for (size_t j = 0; j < rb * (size_t)out; j++) {
            s = s * 6364136223846793005ull + 1442695040888963407ull;
            raw[j] = (uint8_t)(s >> 33);
        }
        /* Scales of 2^-7 wherever the type has f16 fields: finite weights. */
        const uint16_t h = 0x2000;
        for (size_t b = 0; bb > 4 && b < rb * (size_t)out / bb; b++) {
            memcpy(raw + b * bb + (type == GGML_Q6_K ? 208 : 0), &h, 2);
            if (type == GGML_Q4_1 || type == GGML_Q5_1 || type == GGML_Q4_K || type == GGML_Q5_K)
                memcpy(raw + b * bb + 2, &h, 2);
        }
        if (type == GGML_F16 || type == GGML_BF16)
            for (size_t j = 0; j < (size_t)out * in; j++)
                memcpy(raw + 2 * j, &(uint16_t){type == GGML_F16 ? 0x3000 : 0x3e00}, 2);
        if (type == GGML_F32)
            for (size_t j = 0; j < (size_t)out * in; j++)
                memcpy(raw + 4 * j, &(float){0.25f}, 4);
        Q[i] = (gemm_qlinear){.out = out, .in = in, .n_parts = 1};
        if (gemm_qpack(type, raw, out, in, &Q[i].parts[0]) || ggml_dequant_row(type, raw, w, (uint64_t)out * in) ||
            gemm_pack(w, out, in, &F[i]))
            cli_die(P, "%s%s", rd_errmsg(), "");
        gemm_qlinear_index(&Q[i]);
    }
    for (size_t i = 0; i < (size_t)max_m * in; i++)
        x[i] = (float)(i % 17) * 0.0625f - 0.5f;
    printf("%s [%d][%d] x %d weights, 1 thread, CPU time, best of 7:\n", tname, out, in, N_MATS);
    for (int32_t r = 0; r < n_rows; r++) {
        const int32_t m = rows[r];
        double best[2] = {1e30, 1e30};
        for (int rep = 0; rep < 7; rep++)
            for (int mode = 0; mode < 2; mode++) {
                double t = cpu_seconds();
                for (int i = 0; i < N_MATS; i++) {
                    if (mode == 0)
                        gemm_qforward(&Q[i], x, m, y, 0);
                    else
                        gemm_forward(&F[i], x, m, y, 0);
                }
                t = cpu_seconds() - t;
                best[mode] = t < best[mode] ? t : best[mode];
            }
        const double nw = (double)N_MATS * out * in;
        const double qb = (double)N_MATS * gemm_qbytes(&Q[0].parts[0]), fb = (double)N_MATS * F[0].n_panels * 16.0 * in * 4;
        printf("  M=%-4d %-5s %7.2f Gweights/s %6.1f GB/s | fp32 %7.2f Gweights/s %6.1f GB/s | %.2fx\n", m, tname,
               nw * m / best[0] / 1e9, qb / best[0] / 1e9, nw * m / best[1] / 1e9, fb / best[1] / 1e9,
               best[1] / best[0]);
    }
    for (int i = 0; i < N_MATS; i++) {
        gemm_qrelease(&Q[i].parts[0]);
        gemm_release(&F[i]);
    }
    free(Q), free(w), free(x), free(y), free(raw), free(rows);
    return 0;
}
