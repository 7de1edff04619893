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

// A work entry: expert e's row tile rt of 16 routes, its routes at places p0 .. p0 + n (e < 0: none).
struct moe_tc_entry {
    int32_t e, rt, p0, n;
};

// Small batches (m k <= MOE_SORT_ROUTES routes, at most one a thread): work
// entry y as k_moe_sort lists it (the experts with routes ascending, each as
// ceil(n / 16) row tiles of its routes in route order), from the ids alone,
// by the whole block before any thread returns. Also each route's place in
// the grouped order (pos, for the combine) and the x row at each of the
// entry's expert's places (xrow, by the place's index within the expert).
RD_DEV moe_tc_entry moe_tc_entry_sort(const moe_args &a, int32_t y, int32_t *pos, int32_t *xrow)
{
    __shared__ int32_t s_id[MOE_SORT_ROUTES], s_n[MOE_SORT_ROUTES];
    __shared__ moe_tc_entry s_ent;
    const int32_t t = threadIdx.x, routes = a.m * a.k;
    const int32_t id = t < routes ? moe_route_expert(a, t) : -1;
    if (t < routes)
        s_id[t] = id;
    if (t == 0)
        s_ent = moe_tc_entry{-1, 0, 0, 0};
    __syncthreads();
    // at: this route's index among its expert's (route order); a first route of its expert counts them
    int32_t at = 0, n = 0;
    for (int32_t u = 0; u < t && u < routes; u++)
        at += id >= 0 && s_id[u] == id;
    if (id >= 0 && at == 0)
        for (int32_t u = t; u < routes; u++)
            n += s_id[u] == id;
    if (t < routes)
        s_n[t] = n; // nonzero at each expert's first route only
    __syncthreads();
    int32_t below = 0, tiles = 0; // routes and row tiles of the experts with smaller ids
    if (id >= 0)
        for (int32_t u = 0; u < routes; u++)
            if (s_n[u] > 0 && s_id[u] < id)
                below += s_n[u], tiles += (s_n[u] + 15) / 16;
    if (t < routes)
        pos[t] = id >= 0 ? below + at : -1;
    if (n > 0 && y >= tiles && y < tiles + (n + 15) / 16)
        s_ent = moe_tc_entry{id, y - tiles, below, n};
    __syncthreads();
    if (id >= 0 && id == s_ent.e)
        xrow[at] = t / a.k;
    __syncthreads();
    return s_ent;
}

// Work entry y as k_moe_sort wrote it.
RD_DEV moe_tc_entry moe_tc_entry_sorted(const moe_args &a, int32_t y)
{
    const int32_t e = a.work[2 * y];
    if (e < 0)
        return moe_tc_entry{-1, 0, 0, 0};
    return moe_tc_entry{e, a.work[2 * y + 1], a.off[e], a.off[e + 1] - a.off[e]};
}

// blockIdx.x: column tile; blockIdx.y: work entry. EPI TC_SWIGLU: gate|up
// over x's routed rows into act (by place); TC_PLAIN: down over act into h
// (by place). SORT: the entry from the ids (moe_tc_entry_sort); COMBINE
// (down): the last CTA of each column tile to finish (an arrival counter,
// reset by it) then sums the routes for the tile's columns, k_moe_combine's
// code and order.
template <int WF, int EPI, bool SORT, bool COMBINE>
__global__ void __launch_bounds__(32 * CUPLAN_TC_MAX_WK) k_moe_tc(tc_args g, moe_args m)
{
    RD_PDL_ENTRY(); // the work list, the order and (down) act come from the kernels before
    constexpr bool gu = EPI == TC_SWIGLU;
    __shared__ int32_t s_pos[MOE_SORT_ROUTES], s_xrow[MOE_SORT_ROUTES];
    const moe_tc_entry w = SORT ? moe_tc_entry_sort(m, (int32_t)blockIdx.y, s_pos, s_xrow)
                                : moe_tc_entry_sorted(m, (int32_t)blockIdx.y);
    if (w.e >= 0) { // the whole CTA, or none of it
        tc_args a = g;
        a.m = w.n;
        const void *wt = m.table[(gu ? 0 : m.n_experts) + w.e];
        if (WF == TC_WF_Q8_0) {
            a.q8 = (const int8_t *)wt;
            a.q8d = (const uint16_t *)m.table[(gu ? 2 : 3) * m.n_experts + w.e];
        } else {
            a.w = (const uint16_t *)wt;
        }
        if (gu) {
            a.x = m.x;
            a.xrow = SORT ? s_xrow : m.xrow + w.p0;
            a.y = m.act + (int64_t)w.p0 * m.ffn;
        } else {
            a.x = m.act + (int64_t)w.p0 * m.ffn;
            a.y = m.h + (int64_t)w.p0 * m.dim;
        }
        tc_cta<1, 2, WF, EPI, gu>(a, (int32_t)blockIdx.x, 16 * w.rt, 0, 0);
    }
    if constexpr (COMBINE) {
        if (!last_to_arrive(&m.count[blockIdx.x], gridDim.y)) // (it resets the counter)
            return;
        const int32_t c0 = (int32_t)blockIdx.x * CUPLAN_TC_NT;
        const int32_t nc = m.dim - c0 < CUPLAN_TC_NT ? m.dim - c0 : CUPLAN_TC_NT;
        for (int32_t idx = threadIdx.x; idx < m.m * nc; idx += blockDim.x)
            moe_combine_one(m, SORT ? s_pos : m.pos, idx / nc, c0 + idx % nc);
    }
}

template <int WF, int EPI, bool SORT>
static void moe_tc_launch(cudaStream_t s, dim3 grid, unsigned threads, const tc_args &g, const moe_args &m,
                          bool combine)
{
    if (combine) {
        auto kern = k_moe_tc<WF, EPI, SORT, true>;
        RD_LAUNCH(kern, grid, dim3(threads), 0, s, g, m);
    } else {
        auto kern = k_moe_tc<WF, EPI, SORT, false>;
        RD_LAUNCH(kern, grid, dim3(threads), 0, s, g, m);
    }
}

template <int WF> static void moe_tc_run(cudaStream_t s, const moe_args &m, bool sort, bool combine)
{
    tc_args g{};
    g.out = 2 * m.ffn;
    g.in = m.dim;
    g.q = m.pl_gu.q, g.p = 1, g.kp = m.pl_gu.kp;
    g.xvec = (uintptr_t)m.x % 16 == 0;
    const dim3 grid_gu((unsigned)((m.ffn + 7) / 8), (unsigned)m.n_work);
    if (sort)
        moe_tc_launch<WF, TC_SWIGLU, true>(s, grid_gu, (unsigned)(32 * m.pl_gu.wk), g, m, false);
    else
        moe_tc_launch<WF, TC_SWIGLU, false>(s, grid_gu, (unsigned)(32 * m.pl_gu.wk), g, m, false);
    g.out = m.dim;
    g.in = m.ffn;
    g.q = m.pl_down.q, g.kp = m.pl_down.kp;
    g.xvec = (uintptr_t)m.act % 16 == 0;
    const dim3 grid_dn((unsigned)((m.dim + CUPLAN_TC_NT - 1) / CUPLAN_TC_NT), (unsigned)m.n_work);
    if (sort)
        moe_tc_launch<WF, TC_PLAIN, true>(s, grid_dn, (unsigned)(32 * m.pl_down.wk), g, m, combine);
    else
        moe_tc_launch<WF, TC_PLAIN, false>(s, grid_dn, (unsigned)(32 * m.pl_down.wk), g, m, combine);
}

void launch_moe_tc(cudaStream_t s, const moe_args &a, bool sort, bool combine)
{
    if (a.tc_wf == TC_WF_Q8_0)
        moe_tc_run<TC_WF_Q8_0>(s, a, sort, combine);
    else
        moe_tc_run<TC_WF_BF16>(s, a, sort, combine);
}

}  // namespace RD_NS
