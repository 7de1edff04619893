// cuda_gemm_tc_wgp.cu - the wgmma tile kernel with its loads several chunks
// ahead (RD_CUDA_TC_WG with RD_CUDA_TC_PIPE = S, 2 to 6; sm_90a).
//
// Why: k_gemm_tc_wg (cuda_gemm_tc_wg.cu) loads chunk ci + 1's weights into
// registers while chunk ci's MMA runs, so every chunk waits out a round trip
// to L2 or memory behind 2 to 6 wgmma steps of tensor work, and it drains the
// MMA pipe (wait 0) every chunk before its barrier. Here each thread copies
// its own operands with cp.async S - 1 chunks ahead into a ring of its own in
// shared memory: its two weight rows' 8 values (bf16 16 bytes, FP8 8 bytes
// and the word of scale bytes that holds the chunk's) and its x units (32
// bytes each). A thread reads only what it copied, after its own wait, so no
// barrier guards the ring. B's pieces are written one chunk ahead into one of
// three stages, and chunk ci's MMA is waited for after chunk ci + 1's
// operands are made (wait 1: A's fragments in two register sets, chunks taken
// in pairs), except at a sub-piece's end, where the fold reads the sums
// (wait 0). The MMAs, their order, the folds and the epilogue are
// k_gemm_tc_wg's: the same bits.
#include "kernels/cuda/cuda_gemm_tc_wg.cuh"

namespace RD_NS {

#define TC_WGP_BSTAGES 3 // B stages: chunk ci's read by the MMA in flight, ci - 1's maybe, ci + 1's being written
#define TC_WGP_SMEM_MAX (227 * 1024) // dynamic shared memory a CTA may opt into (H100, H200)

// A thread's 16-byte slots in one ring stage: its weight rows g and g + 8 (FP8: codes in the first 8 bytes), FP8's
// scale words (rows g and g + 8 at bytes 0 and 4), then 2 per x unit.
template <int WF, int WGS> RD_HD constexpr int tc_wgp_slots() { return 2 + (WF == TC_WF_FP8) + 2 * (WGS == 1 ? 2 : 1); }

template <int NP, int WF, int WGS> RD_HD constexpr size_t tc_wgp_smem(int stages)
{
    return (size_t)TC_WGP_BSTAGES * 2 * NP * TC_WG_BLOCK + (size_t)stages * tc_wgp_slots<WF, WGS>() * 128 * WGS * 16;
}

// One CTA: k_gemm_tc_wg's tiles and threads. Shared memory: the B stages, then the ring, [stage][slot][thread] of 16
// bytes (a warp's slot is 512 contiguous bytes: no bank conflicts).
template <int NP, int WF, int EPI, int WGS> __global__ void __launch_bounds__(128 * WGS) k_gemm_tc_wgp(tc_args a)
{
    RD_PDL_ENTRY();
    RD_DYN_SMEM(unsigned char, sm);
    constexpr int NT = 128 * WGS, SL = tc_wgp_slots<WF, WGS>(), XS = 2 + (WF == TC_WF_FP8); // x's first slot
    constexpr int U = WGS == 1 ? 2 : 1, BSTAGE = 2 * NP * TC_WG_BLOCK;
    const int S = a.stages;
    const int tid = (int)threadIdx.x, w = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
    const int32_t bx = tc_tile_w(a), r0 = tc_tile_b(a) * TC_WG_BN;
    const int32_t nch = a.in / 32, cpp = a.kp / 32;
    const int32_t wr[2] = {tc_wg_wrow<EPI, WGS>(a, bx, w, 0, g), tc_wg_wrow<EPI, WGS>(a, bx, w, 1, g)};
    const int xr = tid / 4 < TC_WG_BN ? tid / 4 : TC_WG_BN, xt = tid % 4; // x units: batch rows xr + 32 i
    unsigned char *const ring = sm + TC_WGP_BSTAGES * BSTAGE;
    auto slot = [&](int st, int s) { return ring + ((size_t)(st * SL + s) * NT + tid) * 16; };

    // The copies of chunk ci into ring stage st (none past the last chunk: no group is left unwaited for).
    auto issue = [&](int32_t ci, int st) {
        if (ci >= nch)
            return;
RD_UNROLL
        for (int h = 0; h < 2; h++) {
            const bool ok = wr[h] < a.out;
            const int64_t row = (int64_t)(ok ? wr[h] : 0);
            if constexpr (WF == TC_WF_BF16) {
                cp_async<16>(slot(st, h), a.w + row * a.in + 32 * ci + 8 * t, ok);
            } else {
                cp_async<8>(slot(st, h), a.f8 + row * a.in + 32 * ci + 8 * t, ok);
                cp_async<4>(slot(st, 2) + 4 * h, a.f8s + row * (a.in / 32) + (ci & ~3), ok);
            }
        }
        if (xr < TC_WG_BN) {
RD_UNROLL
            for (int i = 0; i < U; i++) {
                const bool ok = r0 + xr + 32 * i < a.m;
                const float *src = a.x + (int64_t)(ok ? r0 + xr + 32 * i : 0) * a.in + 32 * ci + 8 * xt;
                cp_async<16>(slot(st, XS + 2 * i), src, ok);
                cp_async<16>(slot(st, XS + 2 * i + 1), src + 4, ok);
            }
        }
    };
    // Chunk ci's A fragments (k-steps 0 and 1) from ring stage st, as k_gemm_tc_wg makes them from its loads.
    auto frags = [&](int32_t ci, int st, uint32_t(&fa)[2][4]) {
        uint32_t wv[2][4];
RD_UNROLL
        for (int h = 0; h < 2; h++) {
            if constexpr (WF == TC_WF_BF16) {
                const uint4 v = *(const uint4 *)slot(st, h);
                wv[h][0] = v.x, wv[h][1] = v.y, wv[h][2] = v.z, wv[h][3] = v.w;
            } else {
                const uint32_t word = *(const uint32_t *)(slot(st, 2) + 4 * h);
                tc_decode_w8(*(const uint2 *)slot(st, h), word >> (8 * (ci & 3)) & 0xffu, wv[h]);
            }
        }
RD_UNROLL
        for (int s2 = 0; s2 < 2; s2++) {
            fa[s2][0] = wv[0][2 * s2], fa[s2][1] = wv[1][2 * s2], fa[s2][2] = wv[0][2 * s2 + 1];
            fa[s2][3] = wv[1][2 * s2 + 1];
        }
    };
    // x's units of ring stage st as B's pieces in B stage bs.
    auto put = [&](int st, int bs) {
        if (xr < TC_WG_BN) {
RD_UNROLL
            for (int i = 0; i < U; i++) {
                const float4 lo = *(const float4 *)slot(st, XS + 2 * i), hi = *(const float4 *)slot(st, XS + 2 * i + 1);
                const float v[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
                tc_wg_put_x<NP>(sm + bs * BSTAGE, xr + 32 * i, xt, v);
            }
        }
    };

    for (int s = 0; s < S - 1; s++) {
        issue(s, s);
        cp_async_commit(); // one group per chunk, empty ones included, so the ring's count holds
    }
    uint32_t fa0[2][4], fa1[2][4];
    cp_async_wait_ring(S); // chunk 0's copies
    frags(0, 0, fa0);
    put(0, 0);
    tc_wg_fence_proxy();
    __syncthreads();
    float pc[TC_WG_BN / 2] = {}, tot[TC_WG_BN / 2] = {};
    tc_wg_hold(pc);
    int rs = 0, bs = 0; // chunk ci's ring stage and B stage
    // Chunk ci: its MMA (fragments fc), then chunk ci + 1's operands (into fn, whose MMA, chunk ci - 1's, has
    // run by then) while it runs. No access to pc in here, and no branch that joins values of pc: ptxas makes a
    // step wait for the MMA in flight at either.
    auto step = [&](int32_t ci, uint32_t(&fc)[2][4], uint32_t(&fn)[2][4]) {
        const int rn = rs + 1 == S ? 0 : rs + 1, bn = bs + 1 == TC_WGP_BSTAGES ? 0 : bs + 1;
        // the refill: chunk ci + S - 1 into the ring stage of chunk ci - 1 (read in step ci - 2)
        issue(ci + S - 1, rs == 0 ? S - 1 : rs - 1);
        cp_async_commit();
        const uint32_t base = tc_wg_smem_addr(sm + bs * BSTAGE);
        uint64_t desc[2][NP];
RD_UNROLL
        for (int s2 = 0; s2 < 2; s2++)
RD_UNROLL
            for (int p = 0; p < NP; p++)
                desc[s2][p] = tc_wg_desc(base + (2 * p + s2) * TC_WG_BLOCK);
        tc_wg_fence();
RD_UNROLL
        for (int s2 = 0; s2 < 2; s2++)
RD_UNROLL
            for (int p = 0; p < NP; p++)
                tc_wg_mma(pc, fc[s2], desc[s2][p]);
        tc_wg_commit();
        tc_wg_wait<1>();
        tc_wg_keep_a(fn); // (chunk ci - 1's fragments: live until its MMA has run)
        cp_async_wait_ring(S);    // chunk ci + 1's copies (past the last chunk: stale bytes nothing reads)
        frags(ci + 1, rn, fn);
        put(rn, bn);
        tc_wg_fence_proxy();
        __syncthreads(); // chunk ci + 1's pieces are written; every warpgroup's MMA of chunk ci - 1 has run
        rs = rn, bs = bn;
    };
    for (int32_t c0 = 0; c0 < nch; c0 += cpp) { // sub-pieces of cpp chunks, cpp even (tc_wgp_fits)
        for (int32_t ci = c0; ci < c0 + cpp; ci += 2) {
            step(ci, fa0, fa1);
            step(ci + 1, fa1, fa0);
        }
        tc_wg_wait<0>(); // the sub-piece's sums, folded into the total left to right
        tc_wg_keep_a(fa1);
        tc_wg_hold(pc);
RD_UNROLL
        for (int i = 0; i < TC_WG_BN / 2; i++) {
            tot[i] = c0 == 0 ? pc[i] : RD_FADD(tot[i], pc[i]);
            pc[i] = 0.0f;
        }
    }
    tc_wg_store<EPI>(a, r0, wr[0], wr[1], t, tot);
}

// Whether the pipelined form takes a call that tc_wg_fits: sub-pieces of an even count of chunks (chunks taken in
// pairs), FP8's scale rows in whole words and codes 8-byte aligned, and its shared memory within a CTA's limit.
template <int NP, int WF, int WGS> static bool tc_wgp_fits(const tc_args &a)
{
    if (a.stages < 2 || a.stages == 5 || a.stages > 6 || a.kp % 64 || tc_wgp_smem<NP, WF, WGS>(a.stages) > TC_WGP_SMEM_MAX)
        return false;
    if constexpr (WF == TC_WF_FP8)
        return a.in / 32 % 4 == 0 && (uintptr_t)a.f8s % 4 == 0 && (uintptr_t)a.f8 % 8 == 0;
    return true;
}

template <int NP, int WF, int EPI, int WGS> static cudaError_t tc_wgp_setup(int stages)
{
    const size_t bytes = tc_wgp_smem<NP, WF, WGS>(stages);
    if (bytes > TC_WGP_SMEM_MAX)
        return cudaSuccess; // (never launched: tc_wgp_fits)
    return cudaFuncSetAttribute(k_gemm_tc_wgp<NP, WF, EPI, WGS>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes);
}

template <int NP, int WF, int WGS> static cudaError_t tc_wgp_setup_epis(int stages)
{
    if constexpr (NP == 3) {
        return tc_wgp_setup<3, WF, TC_PLAIN, WGS>(stages);
    } else {
        const cudaError_t e[] = {tc_wgp_setup<NP, WF, TC_PLAIN, WGS>(stages), tc_wgp_setup<NP, WF, TC_SWIGLU, WGS>(stages),
                                 tc_wgp_setup<NP, WF, TC_GEGLU, WGS>(stages)};
        for (cudaError_t x : e)
            if (x != cudaSuccess)
                return x;
        return cudaSuccess;
    }
}

template <int NP, int WF> static cudaError_t tc_wgp_setup_groups(int stages)
{
    const cudaError_t e[] = {tc_wgp_setup_epis<NP, WF, 1>(stages), tc_wgp_setup_epis<NP, WF, 2>(stages),
                             tc_wgp_setup_epis<NP, WF, 4>(stages)};
    for (cudaError_t x : e)
        if (x != cudaSuccess)
            return x;
    return cudaSuccess;
}

cudaError_t gemm_tc_wgp_setup(int stages)
{
    const cudaError_t e[] = {tc_wgp_setup_groups<1, TC_WF_BF16>(stages), tc_wgp_setup_groups<2, TC_WF_BF16>(stages),
                             tc_wgp_setup_groups<3, TC_WF_BF16>(stages), tc_wgp_setup_groups<1, TC_WF_FP8>(stages),
                             tc_wgp_setup_groups<2, TC_WF_FP8>(stages)};
    for (cudaError_t x : e)
        if (x != cudaSuccess)
            return x;
    return cudaSuccess;
}

template <int NP, int WF> static bool tc_wgp_groups(cudaStream_t s, const tc_args &a, int epi)
{
    bool took = false;
    tc_wg_instance<NP>(a.wg, epi, [&](auto wgs, auto e) {
        constexpr int WGS = decltype(wgs)::value;
        if (!tc_wgp_fits<NP, WF, WGS>(a))
            return;
        auto kern = k_gemm_tc_wgp<NP, WF, decltype(e)::value, WGS>;
        const size_t smem = tc_wgp_smem<NP, WF, WGS>(a.stages); // (opted into by gemm_tc_wgp_setup)
        RD_LAUNCH(kern, tc_wg_grid(a, WGS), dim3(128 * WGS), smem, s, a);
        took = true;
    });
    return took;
}

bool gemm_tc_wgp(cudaStream_t s, const tc_args &a, int pieces, int epi)
{
    if (pieces == 3)
        return tc_wgp_groups<3, TC_WF_BF16>(s, a, TC_PLAIN);
    if (a.w)
        return pieces == 2 ? tc_wgp_groups<2, TC_WF_BF16>(s, a, epi) : tc_wgp_groups<1, TC_WF_BF16>(s, a, epi);
    return pieces == 2 ? tc_wgp_groups<2, TC_WF_FP8>(s, a, epi) : tc_wgp_groups<1, TC_WF_FP8>(s, a, epi);
}

}  // namespace RD_NS
