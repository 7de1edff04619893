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
#include "kernels/cuda/cuda_gemm_tc.cuh"

namespace RD_NS {

#define TC_WG_BN 64                     // batch rows a CTA (wgmma's N)
#define TC_WG_BLOCK (TC_WG_BN * 32)     // bytes of one (piece, k-step) B block: BN rows x 16 bf16
// B's K-major, unswizzled layout (PTX ISA, "Shared Memory Matrix Layout"): core matrices of 8 rows x 16
// bytes (8 k), the two along K at LBO, the row groups at SBO.
#define TC_WG_LBO 128
#define TC_WG_SBO 256

#if defined(RD_CUDA_EMU) || defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define TC_WG_HAVE 1
#else
#define TC_WG_HAVE 0 // the host pass, or a device pass without sm_90a's instructions (never launched there:
                     // the backend sets a.wg only on compute capability 9.0)
#endif

RD_DEV uint32_t tc_wg_smem_addr(const void *p)
{
#ifdef RD_CUDA_EMU
    return (uint32_t)((const unsigned char *)p - cuemu::dyn_smem());
#else
    return (uint32_t)__cvta_generic_to_shared(p);
#endif
}

RD_DEV uint64_t tc_wg_desc(uint32_t smem_addr)
{
    return (uint64_t)((smem_addr & 0x3ffffu) >> 4) | (uint64_t)(TC_WG_LBO >> 4) << 16 | (uint64_t)(TC_WG_SBO >> 4) << 32;
}

// Ordinary stores to shared memory that the tensor cores read next.
RD_DEV void tc_wg_fence_proxy()
{
#if TC_WG_HAVE && !defined(RD_CUDA_EMU)
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}

RD_DEV void tc_wg_fence()
{
#if TC_WG_HAVE && !defined(RD_CUDA_EMU)
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#endif
}

RD_DEV void tc_wg_commit()
{
#ifdef RD_CUDA_EMU
    cuemu::wgmma_commit();
#elif TC_WG_HAVE
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#endif
}

RD_DEV void tc_wg_wait0()
{
#ifdef RD_CUDA_EMU
    cuemu::wgmma_wait(0);
#elif TC_WG_HAVE
    asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
#endif
}

// Keeps the compiler from moving accumulator reads or writes across the asynchronous MMA.
RD_DEV void tc_wg_hold(float (&d)[TC_WG_BN / 2])
{
#if TC_WG_HAVE && !defined(RD_CUDA_EMU)
RD_UNROLL
    for (int i = 0; i < TC_WG_BN / 2; i++)
        asm volatile("" : "+f"(d[i])::"memory");
#else
    (void)d;
#endif
}

// Keeps the MMAs' A fragments and descriptors live until their wait: else the compiler may define other
// values in their registers while the MMAs still read them, and ptxas then serializes the MMAs.
template <int NP> RD_DEV void tc_wg_keep(const uint32_t (&fa)[2][4], const uint64_t (&desc)[2][NP])
{
#if TC_WG_HAVE && !defined(RD_CUDA_EMU)
RD_UNROLL
    for (int s2 = 0; s2 < 2; s2++) {
        asm volatile("" ::"r"(fa[s2][0]), "r"(fa[s2][1]), "r"(fa[s2][2]), "r"(fa[s2][3]) : "memory");
RD_UNROLL
        for (int p = 0; p < NP; p++)
            asm volatile("" ::"l"(desc[s2][p]) : "memory");
    }
#else
    (void)fa, (void)desc;
#endif
}

// d += A B: wgmma m64n64k16, f32 += bf16 x bf16, A from registers, B K-major in shared memory.
RD_DEV void tc_wg_mma(float (&d)[TC_WG_BN / 2], const uint32_t (&a)[4], uint64_t desc)
{
#ifdef RD_CUDA_EMU
    cuemu::wgmma_bf16(d, TC_WG_BN, a, desc);
#elif TC_WG_HAVE
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
                 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
                 "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
                 "{%32, %33, %34, %35}, %36, p, 1, 1, 0;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
                   "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]),
                   "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]),
                   "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]),
                   "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(1));
#else
    (void)d, (void)a, (void)desc;
    __trap();
#endif
}

// The weight row that row g + 8 h of warp w's 16 A rows holds in a CTA of WGS warpgroups at weight tile bx:
// plain, row 64 WGS bx + 16 w + 8 h + g; gated, rows g are the gate rows of features 32 WGS bx + 8 w + g and
// rows g + 8 their up rows (a.out: none, zeros).
template <int EPI, int WGS> RD_DEV int32_t tc_wg_wrow(const tc_args &a, int32_t bx, int w, int h, int g)
{
    if (EPI == TC_PLAIN) {
        const int32_t n = 64 * WGS * bx + 16 * w + 8 * h + g;
        return n < a.out ? n : a.out;
    }
    const int32_t F = a.out / 2, f = 32 * WGS * bx + 8 * w + g;
    return f < F ? h * F + f : a.out;
}

// Piece p of x's 8 values [8t, 8t + 8) of batch row n into the (p, k-step) blocks of stage `st`: values 0-1
// and 2-3 are k-step 0's k 2t, 2t + 1 and 2t + 8, 2t + 9; values 4-7 the same k of k-step 1 (tc_frag_a's
// permutation, which the weights' fragments follow).
template <int NP> RD_DEV void tc_wg_put_x(unsigned char *st, int n, int t, const float (&v)[8])
{
    const int row = (n % 8) * 16 + (n / 8) * TC_WG_SBO;
RD_UNROLL
    for (int p = 0; p < NP; p++)
RD_UNROLL
        for (int s2 = 0; s2 < 2; s2++) {
            unsigned char *blk = st + (2 * p + s2) * TC_WG_BLOCK + row;
            *(uint32_t *)(blk + 4 * t) = tc_pack(tc_piece(v[4 * s2], p), tc_piece(v[4 * s2 + 1], p));
            *(uint32_t *)(blk + TC_WG_LBO + 4 * t) = tc_pack(tc_piece(v[4 * s2 + 2], p), tc_piece(v[4 * s2 + 3], p));
        }
}

// One CTA: weight tile blockIdx.x (64 WGS rows; gated: 32 WGS features), batch tile blockIdx.y (TC_WG_BN
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
    const int32_t bx = (int32_t)blockIdx.x, r0 = (int32_t)blockIdx.y * TC_WG_BN;
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
        tc_wg_wait0();
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
    // tot[4 j + i]: weight row (A) g + 8 (i / 2) of the warp's 16, batch row 8 j + 2 t + i % 2.
RD_UNROLL
    for (int j = 0; j < TC_WG_BN / 8; j++)
RD_UNROLL
        for (int i = 0; i < 2; i++) {
            const int32_t r = r0 + 8 * j + 2 * t + i;
            if (EPI == TC_PLAIN) {
                tc_store<false>(a, r, wr0, tot[4 * j + i]);
                tc_store<false>(a, r, wr1, tot[4 * j + i + 2]);
            } else if (wr0 < a.out) { // wr0 is the gate row of feature wr0
                tc_store_glu<EPI>(a, r, wr0, tot[4 * j + i], tot[4 * j + i + 2]);
            }
        }
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

template <int NP, int WF, int WGS> static void tc_wg_launch(cudaStream_t s, const tc_args &a, int epi)
{
    static_assert(NP != 3 || WF == TC_WF_BF16, "the LM head's pieces: a bf16 table, no epilogue");
    // 64 WGS weight rows a CTA (gated: 32 WGS features' gate and up rows)
    const dim3 grid((unsigned)((a.out + 64 * WGS - 1) / (64 * WGS)), (unsigned)((a.m + TC_WG_BN - 1) / TC_WG_BN));
    const dim3 block(128 * WGS);
    const size_t smem = (size_t)2 * 2 * NP * TC_WG_BLOCK;
    if constexpr (NP == 3) {
        auto kern = k_gemm_tc_wg<3, WF, TC_PLAIN, WGS>;
        RD_LAUNCH(kern, grid, block, smem, s, a);
    } else if (epi == TC_SWIGLU) {
        auto kern = k_gemm_tc_wg<NP, WF, TC_SWIGLU, WGS>;
        RD_LAUNCH(kern, grid, block, smem, s, a);
    } else if (epi == TC_GEGLU) {
        auto kern = k_gemm_tc_wg<NP, WF, TC_GEGLU, WGS>;
        RD_LAUNCH(kern, grid, block, smem, s, a);
    } else {
        auto kern = k_gemm_tc_wg<NP, WF, TC_PLAIN, WGS>;
        RD_LAUNCH(kern, grid, block, smem, s, a);
    }
}

template <int NP, int WF> static void tc_wg_groups(cudaStream_t s, const tc_args &a, int epi)
{
    if (a.wg == 4)
        tc_wg_launch<NP, WF, 4>(s, a, epi);
    else if (a.wg == 2)
        tc_wg_launch<NP, WF, 2>(s, a, epi);
    else
        tc_wg_launch<NP, WF, 1>(s, a, epi);
}

void gemm_tc_wg(cudaStream_t s, const tc_args &a, int pieces, int epi)
{
    if (pieces == 3)
        tc_wg_groups<3, TC_WF_BF16>(s, a, TC_PLAIN);
    else if (a.w)
        pieces == 2 ? tc_wg_groups<2, TC_WF_BF16>(s, a, epi) : tc_wg_groups<1, TC_WF_BF16>(s, a, epi);
    else
        pieces == 2 ? tc_wg_groups<2, TC_WF_FP8>(s, a, epi) : tc_wg_groups<1, TC_WF_FP8>(s, a, epi);
}

}  // namespace RD_NS
