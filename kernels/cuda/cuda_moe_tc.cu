// cuda_moe_tc.cu - the MoE experts on tensor cores (RD_CUDA_MOE=tc): each
// routed expert's gate|up (with SwiGLU as its epilogue) and down products
// run through the tensor-core GEMM's CTA (tc_cta, cuda_gemm_tc.cuh), one CTA
// per (column tile, expert, 16 of its routes).
//
// Why: the CUDA-core kernels (cuda_moe.cu) reduce every dot product with a
// warp's shuffles in fp32; at a batch of 256 and top 8 (16 routes for each
// of 128 experts) a layer's 19.3 GFLOP would take about as long as reading
// its experts once even at the fp32 peak. On tensor cores those products
// are a small part of the read, as in the dense layers (docs/GPU.md).
//
// The grid does not depend on the routes, so the op still records into a
// CUDA graph: k_moe_sort writes the list of (expert, row tile) pairs the
// routes make, n_work entries at most (min(n_experts, m k) + ceil(m k / 16)),
// the rest -1, and grid.y is n_work; a CTA whose entry is -1 returns.
//
// Arithmetic: the GEMM's, with the plan cuplan_moe_tc fixes from the
// reduced length alone (the warps' sub-pieces, p = 1): x and the SwiGLU
// output split into bf16 hi and lo, products summed by mma chains from zero
// per sub-piece, the sub-pieces added in order. Every row of an mma depends
// on that row's inputs alone, so a route's bits do not depend on which
// routes share its expert, its tile or its batch. The SwiGLU is k_swiglu's
// expression on the finished pair, and k_moe_combine sums the routes as the
// CUDA-core path does (reading h by each route's place in the order).
// Weights: bf16, or Q8_0 codes with their fp16 scales (the chunk's sum
// times d, tc_chunk_q80), one format for the whole table.
#include "kernels/cuda/cuda_gemm_tc.cuh"

namespace RD_NS {

// blockIdx.x: column tile; blockIdx.y: work entry. EPI TC_SWIGLU: gate|up
// over x's routed rows into act (by place); TC_PLAIN: down over act into h
// (by place).
template <int WF, int EPI>
__global__ void __launch_bounds__(32 * CUPLAN_TC_MAX_WK) k_moe_tc(tc_args g, moe_args m)
{
    RD_PDL_ENTRY(); // the work list, the order and (down) act come from the kernels before
    const int32_t e = m.work[2 * blockIdx.y], rt = m.work[2 * blockIdx.y + 1];
    if (e < 0)
        return; // the whole CTA
    constexpr bool gu = EPI == TC_SWIGLU;
    const int32_t p0 = m.off[e];
    tc_args a = g;
    a.m = m.off[e + 1] - p0;
    const void *w = m.table[(gu ? 0 : m.n_experts) + e];
    if (WF == TC_WF_Q8_0) {
        a.q8 = (const int8_t *)w;
        a.q8d = (const uint16_t *)m.table[(gu ? 2 : 3) * m.n_experts + e];
    } else {
        a.w = (const uint16_t *)w;
    }
    if (gu) {
        a.x = m.x;
        a.xrow = m.xrow + p0;
        a.y = m.act + (int64_t)p0 * m.ffn;
    } else {
        a.x = m.act + (int64_t)p0 * m.ffn;
        a.y = m.h + (int64_t)p0 * m.dim;
    }
    tc_cta<1, 2, WF, EPI, gu>(a, (int32_t)blockIdx.x, 16 * rt, 0, 0);
}

template <int WF> static void moe_tc_run(cudaStream_t s, const moe_args &m)
{
    tc_args g{};
    g.out = 2 * m.ffn;
    g.in = m.dim;
    g.q = m.pl_gu.q, g.p = 1, g.kp = m.pl_gu.kp;
    g.xvec = (uintptr_t)m.x % 16 == 0;
    const dim3 grid_gu((unsigned)((m.ffn + 7) / 8), (unsigned)m.n_work);
    auto kgu = k_moe_tc<WF, TC_SWIGLU>;
    RD_LAUNCH(kgu, grid_gu, dim3((unsigned)(32 * m.pl_gu.wk)), 0, s, g, m);
    g.out = m.dim;
    g.in = m.ffn;
    g.q = m.pl_down.q, g.kp = m.pl_down.kp;
    g.xvec = (uintptr_t)m.act % 16 == 0;
    const dim3 grid_dn((unsigned)((m.dim + CUPLAN_TC_NT - 1) / CUPLAN_TC_NT), (unsigned)m.n_work);
    auto kdn = k_moe_tc<WF, TC_PLAIN>;
    RD_LAUNCH(kdn, grid_dn, dim3((unsigned)(32 * m.pl_down.wk)), 0, s, g, m);
}

void launch_moe_tc(cudaStream_t s, const moe_args &a)
{
    if (a.tc_wf == TC_WF_Q8_0)
        moe_tc_run<TC_WF_Q8_0>(s, a);
    else
        moe_tc_run<TC_WF_BF16>(s, a);
}

}  // namespace RD_NS
