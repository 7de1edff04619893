// cuda_gemm_tc.cu - the tensor-core GEMM's entry (launch_gemm_tc) and its
// bf16-weight kernels for x as one piece and the LM head's three
// (cuda_gemm_tc.cuh has them; two pieces: cuda_gemm_tc_p2.cu).
#include "kernels/cuda/cuda_gemm_tc.cuh"

namespace RD_NS {

int64_t gemm_tc_part_floats(const cuplan_tc &pl, const tc_args &a)
{
    return pl.p > 1 && !tc_use_big(a) ? (int64_t)pl.q * a.m * a.out : 0;
}

// The column tiles' counters (p > 1), then the finishing steps' (a.rope.nw's heads, a.route's and a.nadd's row tiles).
static int64_t tile_counters(const cuplan_tc &pl, const tc_args &a)
{
    if (pl.p == 1 || tc_use_big(a))
        return 0;
    const int32_t rows = 16 * cuplan_tc_mw(a.m);
    return (int64_t)((a.out + CUPLAN_TC_NT - 1) / CUPLAN_TC_NT) * ((a.m + rows - 1) / rows);
}

int64_t gemm_tc_counters(const cuplan_tc &pl, const tc_args &a)
{
    const int32_t rows = 16 * cuplan_tc_mw(a.m), row_tiles = (a.m + rows - 1) / rows;
    const int64_t fin = a.rope.nw ? (int64_t)a.rope.heads * row_tiles : a.route.ids || a.nadd.out ? row_tiles : 0;
    return tc_use_big(a) ? 0 : tile_counters(pl, a) + fin;
}

void gemm_tc_bf16(cudaStream_t s, const cuplan_tc &pl, const tc_args &a, int pieces, int epi)
{
    if (pieces == 3)
        gemm_tc_pieces<3, TC_WF_BF16>(s, pl, a, TC_PLAIN);
    else if (pieces == 2)
        gemm_tc_bf16_p2(s, pl, a, epi);
    else
        gemm_tc_pieces<1, TC_WF_BF16>(s, pl, a, epi);
}

cudaError_t gemm_tc_setup(int stages)
{
    const cudaError_t e[] = {tcp_setup_all<1, TC_WF_BF16>(stages), gemm_tc_setup_bf16_p2(stages),
                             tcp_setup_all<3, TC_WF_BF16>(stages), gemm_tc_setup_fp8(stages),
                             gemm_tc_setup_q8(stages), gemm_tc_setup_q80(stages)};
    for (cudaError_t x : e)
        if (x != cudaSuccess)
            return x;
    return cudaSuccess;
}

void launch_gemm_tc(cudaStream_t s, const cuplan_tc &pl, tc_args a, int pieces, int epi)
{
    if (a.m <= 0 || a.out <= 0)
        return;
    a.q = pl.q, a.p = pl.p, a.kp = pl.kp;
    a.xvec = (uintptr_t)a.x % 16 == 0;
    a.fin_count = a.count + tile_counters(pl, a);
    if (tc_wg_fits(a, pieces, epi))
        gemm_tc_wg(s, a, pieces, epi);
    else if (pieces == TC_Q8)
        gemm_tc_q8(s, pl, a, epi);
    else if (a.q8)
        gemm_tc_q80(s, pl, a, pieces, epi);
    else if (a.w == nullptr)
        gemm_tc_fp8(s, pl, a, pieces, epi);
    else
        gemm_tc_bf16(s, pl, a, pieces, epi);
}

}  // namespace RD_NS
