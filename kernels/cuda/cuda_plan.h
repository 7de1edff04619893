/* cuda_plan.h - host-side planning for the CUDA backend, in plain C so it is
 * compiled into every build and unit-tested on the CPU (tests/unit/
 * test_cuda_host.c): how paged attention splits its work, how much shared
 * memory a launch needs, which cuBLAS candidate to keep, weight conversion.
 * Nothing here touches a device. */
#ifndef RD_CUDA_PLAN_H
#define RD_CUDA_PLAN_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/cuda/cuda_math.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Paged attention works on fixed-size KV partitions: a row's keys
 * [k0 + p*CUPLAN_ATTN_PART, k0 + (p+1)*CUPLAN_ATTN_PART) form partition p
 * whatever the batch, where k0 is the row's first key (0, or with a sliding
 * window its position - window + 1), so the reduction order of a row depends
 * only on its own position and the layer's window. */
#define CUPLAN_ATTN_PART 256
#define CUPLAN_ATTN_THREADS 128     /* threads per partition CTA */
#define CUPLAN_ATTN_MAX_GROUP 16    /* query heads per KV head */
#define CUPLAN_ATTN_MAX_HD 256      /* head_dim, a multiple of 8 */
#define CUPLAN_ATTN_MAX_Z 32        /* CTAs sharing one (row, kv head) */
#define CUPLAN_ATTN_WAVES 4         /* CTAs per SM a split aims for: loads in flight at long contexts */
#define CUPLAN_ATTN_UNROLL 4        /* keys a thread loads before it uses them (scores; P.V: twice as many) */
/* Dynamic shared memory a partition CTA may ask for: a block gets 48 KiB
 * without opting in (cudaFuncSetAttribute), static arrays included, and the
 * kernel's reductions hold two (block_allreduce's, 128 bytes each); 1 KiB
 * is left for them. Only 16 query heads per KV head at head_dim 256 (no
 * known model) need more. */
#define CUPLAN_ATTN_MAX_SMEM (48 * 1024 - 1024)

/* How one partition CTA splits its 128 threads (see cuda_attention.cu). */
typedef struct {
    int32_t tg;                 /* lanes per key in the QK^T phase: pow2 >= head_dim/8, <= 32 */
    int32_t ng;                 /* keys scored at once: threads / tg */
    int32_t dp;                 /* bf16 pairs per head: head_dim / 2 */
    int32_t kl;                 /* key lanes in the PV phase: threads / dp */
    size_t smem;                /* dynamic shared memory bytes */
} cuplan_attn;

/* 0, or RD_ENOTSUP with a message for shapes the kernels do not take. */
int cuplan_attn_check(int32_t n_heads, int32_t n_kv_heads, int32_t head_dim);

/* Computed on the host (launch size) and in the kernel alike. */
RD_HD cuplan_attn cuplan_attn_layout(int32_t group, int32_t head_dim)
{
    cuplan_attn a;
    int32_t vec = head_dim / 8; /* 16-byte loads per key */
    a.tg = 1;
    while (a.tg < vec)
        a.tg *= 2;
    a.ng = CUPLAN_ATTN_THREADS / a.tg;
    a.dp = head_dim / 2;
    a.kl = CUPLAN_ATTN_THREADS / a.dp;
    /* q [group][hd] + scores [group][PART] + P.V partials [kl][group][hd], floats */
    a.smem = sizeof(float) * ((size_t)group * head_dim + (size_t)group * CUPLAN_ATTN_PART +
                              (size_t)a.kl * group * head_dim);
    return a;
}

/* Partitions of a row with ctx keys (>= 1 for ctx >= 1). */
RD_HD int32_t cuplan_attn_parts(int32_t ctx) { return (ctx + CUPLAN_ATTN_PART - 1) / CUPLAN_ATTN_PART; }

/* The first key a query at position pos sees: max(0, pos - window + 1), or 0
 * without a window (window <= 0), as the CPU backend's attention. */
RD_HD int32_t cuplan_attn_key0(int32_t pos, int32_t window)
{
    return window > 0 && pos + 1 > window ? pos + 1 - window : 0;
}

/* Partitions of the row at position pos: its keys key0 .. pos, cut from key0
 * on (a windowed row has at most cuplan_attn_parts(window)). */
RD_HD int32_t cuplan_attn_row_parts(int32_t pos, int32_t window)
{
    return cuplan_attn_parts(pos + 1 - cuplan_attn_key0(pos, window));
}

/* The most partitions a row of a layer with this window can have in a step
 * whose rows have at most step_parts without a window (0: unknown, as when a
 * CUDA graph is captured for later, longer contexts; a window still bounds
 * it). For cuplan_attn_z. */
RD_HD int32_t cuplan_attn_layer_parts(int32_t step_parts, int32_t window)
{
    if (window <= 0)
        return step_parts;
    const int32_t w = cuplan_attn_parts(window);
    return step_parts > 0 && step_parts < w ? step_parts : w;
}

/* CTAs per (row, kv head): enough for `waves` CTAs per SM, at most the
 * partitions there are (max_parts; 0 = unknown, as when a CUDA graph is
 * captured for later, longer contexts) and max_z. Only the schedule depends
 * on it, never a result: each partition is computed alone. The backend asks
 * for CUPLAN_ATTN_WAVES and CUPLAN_ATTN_MAX_Z (RD_CUDA_ATTN_V0=1: 2 and 16,
 * session 30's split). */
int32_t cuplan_attn_z(int32_t rows, int32_t n_kv_heads, int32_t max_parts, int32_t n_sm, int32_t waves,
                      int32_t max_z);

/* fp32 -> bf16 (round to nearest even) for n values; host loop. */
void cuplan_to_bf16(const float *src, size_t n, uint16_t *dst);
void cuplan_from_bf16(const uint16_t *src, size_t n, float *dst);

/* GEMM algorithm choice. A candidate qualifies when its results for every
 * tested batch size equal, row for row and bit for bit, its results at the
 * largest one (batch invariance); among those the one with the least total
 * time over a small, a moderate and a large batch wins. Returns the index of
 * the winner or -1 if none qualifies. */
typedef struct {
    int invariant;              /* 1: passed the bitwise check */
    double t_small, t_mid, t_large; /* seconds for M = 1, 64 and 256 */
} cuplan_gemm_cand;
int cuplan_pick_gemm(const cuplan_gemm_cand *c, int n);

/* Batch sizes the GEMM invariance check runs, ascending; the last is the
 * reference. Returns the count written to out (at most cap). */
int cuplan_gemm_check_sizes(int32_t *out, int cap);

/* The tensor-core GEMM (cuda_gemm_tc.cu; RD_CUDA_GEMM=tc, RD_CUDA_FP8=tc).
 * An output's arithmetic is fixed by the plan, which depends on the shape
 * and the device's SM count only, never on the rows: K is cut into q equal
 * sub-pieces of kp weights (a multiple of 32), each summed from zero by a
 * chain of mma k-steps in increasing k, and the q partial sums are added
 * left to right. The schedule spreads the sub-pieces over wk warps of a CTA
 * and p CTAs (q = wk * p), so a batch-1 GEMM fills the GPU without a split
 * count that follows the batch. */
#define CUPLAN_TC_NT 16             /* output columns per CTA */
#define CUPLAN_TC_MAX_WK 4          /* warps per CTA */
typedef struct {
    int32_t wk;                 /* warps per CTA along K, one sub-piece each */
    int32_t p;                  /* CTAs along K */
    int32_t q;                  /* sub-pieces: wk * p */
    int32_t kp;                 /* weights per sub-piece: in / q, a multiple of 32 */
} cuplan_tc;
/* 0, or RD_ENOTSUP when in is not a positive multiple of 32 (the caller
 * keeps its other GEMM for that shape). */
int cuplan_gemm_tc(int32_t out, int32_t in, int32_t n_sm, cuplan_tc *pl);
/* The MoE experts on tensor cores (RD_CUDA_MOE=tc): the same sub-pieces as
 * a GEMM over in, taken by the warps of one CTA alone (p = 1), so an
 * expert's sums meet in shared memory and no partial sums need scratch sized
 * by the routes. Depends on in alone. 0, or RD_ENOTSUP as cuplan_gemm_tc. */
int cuplan_moe_tc(int32_t in, cuplan_tc *pl);
/* m16 tiles per warp for a call of m rows: the schedule only (1, 2 or 4). */
int32_t cuplan_tc_mw(int32_t m);
/* RD_CUDA_TC_WG=auto: the wgmma tile kernel's warpgroups a CTA for a weight of out rows times m rows, the
 * most (4, then 2) whose grid of 64 x warpgroups weight rows by 64 batch rows still has a CTA for every SM,
 * else 1. More warpgroups read x from L2 fewer times; fewer CTAs fill fewer SMs. The schedule only. */
int cuplan_wg_groups(int32_t out, int32_t m, int32_t n_sm);

#ifdef __cplusplus
}
#endif

#endif
