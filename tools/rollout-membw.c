/* rollout-membw - the memory read bandwidth a decode step can hope for: the
 * roofline of make bench-moe (tools/bench_moe.sh) and bench_decode.sh.
 *   rollout-membw [--threads 2] [--mb 1024] [--reps 7] [--json]
 * Reads a buffer of --mb MiB (touched first, so it is resident; far past the
 * caches) on the CPU backend's thread pool: tasks of 4 MiB claimed from a
 * counter, as the GEMM claims its panels, each summed with 512-bit (256-bit,
 * 128-bit: the kernels' path on this host) loads into independent accumulators. Prints the best of --reps passes in
 * GB/s (10^9 bytes per second of wall time) for 1 thread and for --threads. */
#include <immintrin.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/clock.h"
#include "base/cpu_isa.h"
#include "base/pool.h"
#include "tools/cli.h"

static const char *P = "rollout-membw";

#define CHUNK (4u << 20)

typedef struct {
    const uint8_t *buf;
    uint64_t sink[POOL_MAX_THREADS * 8];
} job;

/* The chunk summed with 512-bit loads (4 accumulators). */
__attribute__((target("avx512f"))) static uint64_t sum_avx512(const uint8_t *p)
{
    __m512i a0 = _mm512_setzero_si512(), a1 = a0, a2 = a0, a3 = a0;
    for (size_t i = 0; i < CHUNK; i += 256) {
        a0 = _mm512_add_epi64(a0, _mm512_load_si512((const void *)(p + i)));
        a1 = _mm512_add_epi64(a1, _mm512_load_si512((const void *)(p + i + 64)));
        a2 = _mm512_add_epi64(a2, _mm512_load_si512((const void *)(p + i + 128)));
        a3 = _mm512_add_epi64(a3, _mm512_load_si512((const void *)(p + i + 192)));
    }
    a0 = _mm512_add_epi64(_mm512_add_epi64(a0, a1), _mm512_add_epi64(a2, a3));
    return (uint64_t)_mm512_reduce_add_epi64(a0);
}

/* The same with 256-bit loads. */
__attribute__((target("avx2"))) static uint64_t sum_avx2(const uint8_t *p)
{
    __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
    for (size_t i = 0; i < CHUNK; i += 128) {
        a0 = _mm256_add_epi64(a0, _mm256_load_si256((const __m256i *)(p + i)));
        a1 = _mm256_add_epi64(a1, _mm256_load_si256((const __m256i *)(p + i + 32)));
        a2 = _mm256_add_epi64(a2, _mm256_load_si256((const __m256i *)(p + i + 64)));
        a3 = _mm256_add_epi64(a3, _mm256_load_si256((const __m256i *)(p + i + 96)));
    }
    a0 = _mm256_add_epi64(_mm256_add_epi64(a0, a1), _mm256_add_epi64(a2, a3));
    uint64_t v[4];
    memcpy(v, &a0, sizeof v);
    return v[0] + v[1] + v[2] + v[3];
}

/* And with 128-bit loads (SSE2, every x86-64). */
static uint64_t sum_sse2(const uint8_t *p)
{
    __m128i a0 = _mm_setzero_si128(), a1 = a0, a2 = a0, a3 = a0;
    for (size_t i = 0; i < CHUNK; i += 64) {
        a0 = _mm_add_epi64(a0, _mm_load_si128((const __m128i *)(p + i)));
        a1 = _mm_add_epi64(a1, _mm_load_si128((const __m128i *)(p + i + 16)));
        a2 = _mm_add_epi64(a2, _mm_load_si128((const __m128i *)(p + i + 32)));
        a3 = _mm_add_epi64(a3, _mm_load_si128((const __m128i *)(p + i + 48)));
    }
    a0 = _mm_add_epi64(_mm_add_epi64(a0, a1), _mm_add_epi64(a2, a3));
    uint64_t v[2];
    memcpy(v, &a0, sizeof v);
    return v[0] + v[1];
}

/* The widest loads the kernels' path uses (base/cpu_isa.h). */
static void read_task(void *ctx, int32_t task, int32_t worker)
{
    job *j = ctx;
    const uint8_t *p = j->buf + (size_t)task * CHUNK;
    cpu_isa isa = cpu_isa_active();
    j->sink[worker * 8] += isa == CPU_ISA_AVX512 ? sum_avx512(p) : isa == CPU_ISA_AVX2 ? sum_avx2(p) : sum_sse2(p);
}

/* Best GB/s of reps passes with n tasks, on the first `threads` pool workers
 * (threads 1: the calling thread alone, tasks run inline in a loop). */
static double pass(job *j, int32_t n, int threads, int reps)
{
    double best = 0;
    for (int r = 0; r < reps; r++) {
        double t = clock_now_s();
        if (threads == 1)
            for (int32_t i = 0; i < n; i++)
                read_task(j, i, 0);
        else
            pool_run(n, read_task, j);
        t = clock_now_s() - t;
        double gbs = (double)n * CHUNK / t / 1e9;
        best = gbs > best ? gbs : best;
    }
    return best;
}

int main(int argc, char **argv)
{
    int threads = 2, reps = 7, json = 0;
    int64_t mb = 1024;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--threads")) threads = (int)cli_int(P, a, cli_value(P, argc, argv, &i), 1, POOL_MAX_THREADS);
        else if (!strcmp(a, "--mb")) mb = cli_int(P, a, cli_value(P, argc, argv, &i), 4, 1 << 20);
        else if (!strcmp(a, "--reps")) reps = (int)cli_int(P, a, cli_value(P, argc, argv, &i), 1, 1000);
        else if (!strcmp(a, "--json")) json = 1;
        else cli_die(P, "unknown flag '%s'%s (see the comment at the top of tools/rollout-membw.c)", a, "");
    }
    const int32_t n = (int32_t)(mb * (1 << 20) / CHUNK);
    job *j = calloc(1, sizeof *j);
    uint8_t *buf = aligned_alloc(64, (size_t)n * CHUNK);
    if (!j || !buf)
        cli_die(P, "out of memory for the buffer%s%s", "", "");
    for (size_t i = 0; i < (size_t)n * CHUNK; i += 8)
        memcpy(buf + i, &(uint64_t){i * 0x9E3779B97F4A7C15ull}, 8);
    j->buf = buf;
    if (pool_init(threads))
        cli_die(P, "cannot start the thread pool%s%s", "", "");
    double one = pass(j, n, 1, reps), all = threads > 1 ? pass(j, n, threads, reps) : one;
    uint64_t sink = 0;
    for (int i = 0; i < POOL_MAX_THREADS; i++)
        sink += j->sink[i * 8];
    if (json)
        printf("{\"bytes\": %lld, \"reps\": %d, \"threads\": %d, \"gb_per_s_1_thread\": %.2f, \"gb_per_s\": %.2f, "
               "\"sink\": %llu}\n", (long long)n * CHUNK, reps, threads, one, all, (unsigned long long)(sink & 1));
    else
        printf("read bandwidth over %lld MiB, best of %d: 1 thread %.1f GB/s, %d threads %.1f GB/s\n", (long long)mb,
               reps, one, threads, all);
    free(buf);
    free(j);
    return 0;
}
