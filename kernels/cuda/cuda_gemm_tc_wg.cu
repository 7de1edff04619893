// cuda_gemm_tc_wg.cu - the tensor-core GEMM's tile kernel on Hopper's
// warpgroup MMA (wgmma, sm_90a; RD_CUDA_TC_WG=1), for many rows.
//
// Why: from RD_CUDA_TC_BIG_ROWS rows on, the tile kernels issue one
// mma.sync m16n8k16 per warp and k-step; wgmma has a warpgroup (4 warps)
// multiply 64 rows by up to 256 columns in one instruction, asynchronously,
// with B read by the tensor cores straight from shared memory. Same
// arithmetic as the other kernels, so the same bits on the emulator: the
// plan's sub-pieces, each a chain from zero of k16 steps in tc_chunk's order
// (k-step 0 hi, 0 lo, 1 hi, 1 lo per 32-weight chunk) with the same
// permutation of k inside a chunk, folded left to right into the total. Each
// k16 step is the same 16 products summed into the accumulator; whether a
// GPU's wgmma rounds that sum as its mma.sync does is for the device sweep to
// measure (test_gemm_tc_wg and gemm-1b-wg on the device).
//
// Shape: A = W (64 weight rows a CTA, 16 a warp, from registers: each lane
// loads 8 contiguous weights of rows g and g + 8 as the split-K kernel does,
// which is mma.sync's and wgmma's A fragment for k-steps 0 and 1), B = x's
// bf16 pieces (TC_WG_BN rows of the batch), which the CTA writes to shared
// memory in wgmma's K-major, unswizzled layout with the permutation applied;
// D = W rows x batch rows, 32 accumulators a thread, and as many again for
// the folded total. bf16 and FP8 (decoded to bf16 as the loads do) weights,
// pieces 1 or 2, the plain and the gated epilogues; the LM head's three
// exact pieces (hi, mid, lo) on a bf16 table.
#include "kernels/cuda/cuda_gemm_tc_wg.cuh"

namespace RD_NS {

// One CTA: weight tile tc_tile_w (64 WGS rows; gated: 32 WGS features), batch tile tc_tile_b (TC_WG_BN
// rows), WGS warpgroups of 128 threads, each 64 weight rows times the same B: two stages of NP x 2 B blocks
// in dynamic shared memory. More warpgroups read x from L2 fewer times (once a 64 WGS-row weight tile), and
// fill fewer SMs. While chunk ci's MMA runs on stage ci % 2, the threads write chunk ci + 1's pieces to the
// other stage (its last reader, chunk ci - 1's MMA, every warp waited for before the barrier that ended chunk
// ci - 1) and load chunk ci + 1's weights and chunk ci + 2's x into registers; a barrier ends each chunk.
template <int NP, int WF, int EPI, int WGS> __global__ void __launch_bounds__(128 * WGS) k_gemm_tc_wg(tc_args a)
{
    RD_PDL_ENTRY();
    RD_DYN_SMEM(unsigned char, sm);
    const int tid = (int)threadIdx.x, w = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
    const int32_t bx = tc_tile_w(a), r0 = tc_tile_b(a) * TC_WG_BN;
    const int32_t nch = a.in / 32, cpp = a.kp / 32;
    const int32_t wr0 = tc_wg_wrow<EPI, WGS>(a, bx, w, 0, g), wr1 = tc_wg_wrow<EPI, WGS>(a, bx, w, 1, g);
    constexpr int STAGE = 2 * NP * TC_WG_BLOCK;
    // x: this thread's units (batch row xr + 32 i, t = tid % 4) of the next chunk to write, U of them (64 rows x
    // 4 units: 4 warpgroups leave it to their first two); the weights of rows wr0 and wr1 (A rows g and g + 8
    // of the warp) for this chunk (wv) and the next (wn)
    constexpr int U = WGS == 1 ? 2 : 1;
    const int xr = tid / 4 < TC_WG_BN ? tid / 4 : TC_WG_BN, xt = tid % 4;
    const int32_t xg = xr < TC_WG_BN ? r0 + xr : a.m; // the batch row it loads (a.m: none, zeros, no load)
    float xv[U][8];
    uint32_t wv[2][4], wn[2][4];
RD_UNROLL
    for (int i = 0; i < U; i++)
        tc_load_x<false>(a, xg + 32 * i, 0, xt, 1.0f, xv[i]);
    tc_load_w<WF>(a, wr0, 0, t, wv[0]);
    tc_load_w<WF>(a, wr1, 0, t, wv[1]);
    if (xr < TC_WG_BN) {
RD_UNROLL
        for (int i = 0; i < U; i++)
            tc_wg_put_x<NP>(sm, xr + 32 * i, xt, xv[i]);
    }
    if (nch > 1) {
RD_UNROLL
        for (int i = 0; i < U; i++)
            tc_load_x<false>(a, xg + 32 * i, 32, xt, 1.0f, xv[i]);
    }
    tc_wg_fence_proxy();
    __syncthreads();
    float pc[TC_WG_BN / 2] = {}, tot[TC_WG_BN / 2] = {};
    tc_wg_hold(pc); // each accumulator its own register from here (not the zero tot shares, which would be copied
                    // between the MMAs, and ptxas would serialize them)
    for (int32_t ci = 0; ci < nch; ci++) {
        // The MMAs' operands before the fence: ptxas serializes wgmma whose inputs are defined after it.
        const uint32_t base = tc_wg_smem_addr(sm + (ci & 1) * STAGE);
        uint64_t desc[2][NP];
        uint32_t fa[2][4];
RD_UNROLL
        for (int s2 = 0; s2 < 2; s2++) {
            fa[s2][0] = wv[0][2 * s2], fa[s2][1] = wv[1][2 * s2], fa[s2][2] = wv[0][2 * s2 + 1];
            fa[s2][3] = wv[1][2 * s2 + 1];
RD_UNROLL
            for (int p = 0; p < NP; p++)
                desc[s2][p] = tc_wg_desc(base + (2 * p + s2) * TC_WG_BLOCK);
        }
        tc_wg_hold(pc);
        tc_wg_fence();
RD_UNROLL
        for (int s2 = 0; s2 < 2; s2++)
RD_UNROLL
            for (int p = 0; p < NP; p++)
                tc_wg_mma(pc, fa[s2], desc[s2][p]);
        tc_wg_commit();
        { // no branch while the MMA runs (ptxas serializes wgmma around one): past the last chunk, the last
          // chunk's data again, into the stage no MMA reads any more
            const int32_t c1 = ci + 1 < nch ? ci + 1 : ci, c2 = ci + 2 < nch ? ci + 2 : c1;
            tc_load_w<WF>(a, wr0, 32 * c1, t, wn[0]);
            tc_load_w<WF>(a, wr1, 32 * c1, t, wn[1]);
            unsigned char *next = sm + ((ci + 1) & 1) * STAGE;
            if (xr < TC_WG_BN) { // (warps 8-15 of 4 warpgroups write none)
RD_UNROLL
                for (int i = 0; i < U; i++)
                    tc_wg_put_x<NP>(next, xr + 32 * i, xt, xv[i]);
            }
RD_UNROLL
            for (int i = 0; i < U; i++)
                tc_load_x<false>(a, xg + 32 * i, 32 * c2, xt, 1.0f, xv[i]);
        }
        tc_wg_wait<0>();
        tc_wg_keep<NP>(fa, desc);
        tc_wg_hold(pc);
        // A sub-piece ends: fold it into the total, left to right. Selects, not a branch: the branch's merged
        // values made the compiler copy an accumulator between the MMAs, and ptxas then serialized them.
        const bool end = ci % cpp == cpp - 1, first = ci == cpp - 1;
RD_UNROLL
        for (int i = 0; i < TC_WG_BN / 2; i++) {
            const float v = first ? pc[i] : RD_FADD(tot[i], pc[i]);
            tot[i] = end ? v : tot[i];
            pc[i] = end ? 0.0f : pc[i];
        }
        tc_wg_fence_proxy();
        __syncthreads(); // chunk ci + 1's pieces are written, and every warp's MMA on stage ci % 2 has finished
RD_UNROLL
        for (int i = 0; i < 4; i++)
            wv[0][i] = wn[0][i], wv[1][i] = wn[1][i];
    }
    tc_wg_store<EPI>(a, r0, wr0, wr1, t, tot);
}

// Whether the wgmma kernel takes this call (RD_CUDA_TC_WG=1, 2 or 4 on a compute capability 9.0 device sets
// a.wg, its warpgroups a CTA): bf16 or FP8 weights, pieces 1 or 2, the plain or a gated epilogue, x 16-byte
// aligned and not gathered; the tile kernel's rows (tc_use_big).
bool tc_wg_fits(const tc_args &a, int pieces, int epi)
{
    const bool head = pieces == 3 && epi == TC_PLAIN && a.w; // the LM head's three exact pieces, bf16 table
    return a.wg && (pieces == 1 || pieces == 2 || head) && (a.w || a.f8) && !a.q8 && a.xvec && !a.xrow &&
           (epi == TC_PLAIN || epi == TC_SWIGLU || epi == TC_GEGLU) && a.in % 32 == 0 && tc_use_big(a);
}

template <int NP, int WF> static void tc_wg_groups(cudaStream_t s, const tc_args &a, int epi)
{
    static_assert(NP != 3 || WF == TC_WF_BF16, "the LM head's pieces: a bf16 table, no epilogue");
    tc_wg_instance<NP>(a.wg, epi, [&](auto wgs, auto e) {
        auto kern = k_gemm_tc_wg<NP, WF, decltype(e)::value, decltype(wgs)::value>;
        RD_LAUNCH(kern, tc_wg_grid(a, wgs), dim3(128 * wgs), (size_t)2 * 2 * NP * TC_WG_BLOCK, s, a);
    });
}

void gemm_tc_wg(cudaStream_t s, const tc_args &a, int pieces, int epi)
{
    if (a.stages && gemm_tc_wgp(s, a, pieces, epi))
        return;
    if (pieces == 3)
        tc_wg_groups<3, TC_WF_BF16>(s, a, TC_PLAIN);
    else if (a.w)
        pieces == 2 ? tc_wg_groups<2, TC_WF_BF16>(s, a, epi) : tc_wg_groups<1, TC_WF_BF16>(s, a, epi);
    else
        pieces == 2 ? tc_wg_groups<2, TC_WF_FP8>(s, a, epi) : tc_wg_groups<1, TC_WF_FP8>(s, a, epi);
}

}  // namespace RD_NS
