// cuda_gemm_tc_wg.cuh - what the two wgmma tile kernels share (cuda_gemm_tc_wg.cu,
// registers one chunk ahead; cuda_gemm_tc_wgp.cu, cp.async several chunks
// ahead): the instructions, B's layout in shared memory, the weight rows a
// warp holds, and the epilogue.
#ifndef RD_CUDA_GEMM_TC_WG_CUH
#define RD_CUDA_GEMM_TC_WG_CUH

#include <type_traits>

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
#ifdef RD_CUDA_EMU
    cuemu::fence_proxy_async();
#elif TC_WG_HAVE
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

// All but the newest N groups have run (0: all, before the accumulators are read; 1: the one before the newest).
template <int N> RD_DEV void tc_wg_wait()
{
#ifdef RD_CUDA_EMU
    cuemu::wgmma_wait(N);
#elif TC_WG_HAVE
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
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

// Keeps the MMAs' A fragments live until their wait: else the compiler may define other values in their
// registers while the MMAs still read them, and ptxas then serializes the MMAs.
RD_DEV void tc_wg_keep_a(const uint32_t (&fa)[2][4])
{
#if TC_WG_HAVE && !defined(RD_CUDA_EMU)
RD_UNROLL
    for (int s2 = 0; s2 < 2; s2++)
        asm volatile("" ::"r"(fa[s2][0]), "r"(fa[s2][1]), "r"(fa[s2][2]), "r"(fa[s2][3]) : "memory");
#else
    (void)fa;
#endif
}

// The same for the fragments and the B descriptors of a chunk's MMAs.
template <int NP> RD_DEV void tc_wg_keep(const uint32_t (&fa)[2][4], const uint64_t (&desc)[2][NP])
{
    tc_wg_keep_a(fa);
#if TC_WG_HAVE && !defined(RD_CUDA_EMU)
RD_UNROLL
    for (int s2 = 0; s2 < 2; s2++)
RD_UNROLL
        for (int p = 0; p < NP; p++)
            asm volatile("" ::"l"(desc[s2][p]) : "memory");
#else
    (void)desc;
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
#ifdef RD_CUDA_EMU
    cuemu::smem_async_write(); // (stores the tensor cores read: fenced before the barrier, checked)
#endif
}

// The instance a call takes: f(WGS, EPI), both std::integral_constant, for a.wg warpgroups a CTA and the
// epilogue epi (NP 3, the LM head's pieces: plain). Both forms' launchers pick their kernel through it.
template <int NP, class F> static void tc_wg_instance(int wg, int epi, F &&f)
{
    auto by_epi = [&](auto wgs) {
        if constexpr (NP == 3)
            f(wgs, std::integral_constant<int, TC_PLAIN>());
        else if (epi == TC_SWIGLU)
            f(wgs, std::integral_constant<int, TC_SWIGLU>());
        else if (epi == TC_GEGLU)
            f(wgs, std::integral_constant<int, TC_GEGLU>());
        else
            f(wgs, std::integral_constant<int, TC_PLAIN>());
    };
    if (wg == 4)
        by_epi(std::integral_constant<int, 4>());
    else if (wg == 2)
        by_epi(std::integral_constant<int, 2>());
    else
        by_epi(std::integral_constant<int, 1>());
}

// A CTA's grid: 64 WGS weight rows (gated: 32 WGS features' gate and up rows) by TC_WG_BN batch rows.
static inline dim3 tc_wg_grid(const tc_args &a, int wgs)
{
    return tc_tile_grid(a, (a.out + 64 * wgs - 1) / (64 * wgs), (a.m + TC_WG_BN - 1) / TC_WG_BN);
}

// tot[4 j + i]: weight row (A) g + 8 (i / 2) of the warp's 16 (wr0, wr1), batch row r0 + 8 j + 2 t + i % 2.
template <int EPI> RD_DEV void tc_wg_store(const tc_args &a, int32_t r0, int32_t wr0, int32_t wr1, int t,
                                           const float (&tot)[TC_WG_BN / 2])
{
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

}  // namespace RD_NS

#endif
