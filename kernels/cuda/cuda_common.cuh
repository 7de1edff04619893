// cuda_common.cuh - what every .cu file of the backend includes: the CUDA
// runtime (or its host emulation when RD_CUDA_EMU is defined, see cuemu.h),
// the launch and shared-memory macros that read the same in both, and the
// fixed-order warp/block reductions.
//
// Reductions: a warp reduces by an xor butterfly (offsets 16, 8, 4, 2, 1); a
// block folds its warps' results left to right. Both orders depend only on
// the block size (a constant per kernel), never on the data, the grid or the
// batch, and every thread ends with the same bits (a + b == b + a in IEEE).
#ifndef RD_CUDA_COMMON_CUH
#define RD_CUDA_COMMON_CUH

#include <stdint.h>

#ifdef RD_CUDA_EMU
#include "kernels/cuda/cuemu.h"
#define RD_NS rdcu_emu
// kern(args) runs once per emulated thread; arguments are copied, as for a launch.
#define RD_LAUNCH(kern, grid, block, smem, stream, ...) \
    cuemu::launch((grid), (block), (smem), (stream), [=]() { kern(__VA_ARGS__); }, #kern, cuemu::fn_key(kern))
#define RD_DYN_SMEM(T, name) T *name = (T *)cuemu::dyn_smem()
#define RD_UNROLL
#define RD_PDL_ENTRY() ((void)0)
#define RD_PDL_LAUNCH() ((void)0)
#define RD_PDL_WAIT() ((void)0)
#else
#include <cuda_runtime.h>
#define RD_NS rdcu
namespace rdcu {
// Programmatic dependent launch (RD_CUDA_PDL=1, process-wide): every kernel
// is launched with programmatic stream serialization, so it can be scheduled
// while the kernel before it drains; each kernel's first statement,
// RD_PDL_ENTRY, lets its own dependents launch and then waits until the
// kernel before it has completed and its writes are visible. Off: plain launches.
extern bool rd_pdl;
template <typename... K, typename... A>
inline void rd_launch(void (*kern)(K...), dim3 grid, dim3 block, size_t smem, cudaStream_t s, A... args)
{
    if (!rd_pdl) {
        kern<<<grid, block, smem, s>>>(args...);
        return;
    }
    cudaLaunchAttribute at[1];
    at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[0].val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid, cfg.blockDim = block, cfg.dynamicSmemBytes = smem, cfg.stream = s;
    cfg.attrs = at, cfg.numAttrs = 1;
    cudaLaunchKernelEx(&cfg, kern, (K)args...);
}
}  // namespace rdcu
#define RD_LAUNCH(kern, grid, block, smem, stream, ...) rdcu::rd_launch(kern, (grid), (block), (smem), (stream), __VA_ARGS__)
// RD_PDL_ENTRY is RD_PDL_LAUNCH then RD_PDL_WAIT; a kernel may do work that
// does not read what the kernel before it writes (the weights) in between.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define RD_PDL_ENTRY() asm volatile("griddepcontrol.launch_dependents;\n\tgriddepcontrol.wait;\n" ::: "memory")
#define RD_PDL_LAUNCH() asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory")
#define RD_PDL_WAIT() asm volatile("griddepcontrol.wait;\n" ::: "memory")
#else
#define RD_PDL_ENTRY() ((void)0)
#define RD_PDL_LAUNCH() ((void)0)
#define RD_PDL_WAIT() ((void)0)
#endif
#define RD_DYN_SMEM(T, name)                                        \
    extern __shared__ __align__(16) unsigned char rd_dyn_smem_[]; \
    T *name = (T *)rd_dyn_smem_
#define RD_UNROLL _Pragma("unroll")
#endif

#include "kernels/cuda/cuda_math.h"

#define RD_DEV __device__ __forceinline__
// A device function compiled once per file (static: each file its own copy) and called: for code many kernels reach only on a rare path (LoRA's
// terms in the GEMM's epilogues), which inlined into each of them multiplied ptxas's time by 7.
// RD_GRID_CONST: a kernel parameter such a function may take by reference without a copy to local memory.
#ifdef RD_CUDA_EMU
#define RD_DEV_CALL static __attribute__((noinline))
#define RD_GRID_CONST
#else
#define RD_DEV_CALL static __device__ __noinline__
#define RD_GRID_CONST __grid_constant__
#endif

namespace RD_NS {

struct op_add {
    template <class T> RD_DEV T operator()(T a, T b) const { return a + b; }
};
struct op_max {
    template <class T> RD_DEV T operator()(T a, T b) const { return a > b ? a : b; }
};
struct op_min {
    template <class T> RD_DEV T operator()(T a, T b) const { return a < b ? a : b; }
};

// All 32 lanes must call it.
template <class T, class Op> RD_DEV T warp_allreduce(T v, Op op)
{
RD_UNROLL
    for (int o = 16; o > 0; o >>= 1)
        v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// Every thread of the block must call it (blockDim.x a multiple of 32).
template <class T, class Op> RD_DEV T block_allreduce(T v, Op op)
{
    __shared__ T red[32];
    v = warp_allreduce(v, op);
    const int nw = (int)(blockDim.x + 31) / 32;
    __syncthreads(); // a previous call's readers are done with red
    if (threadIdx.x % 32 == 0)
        red[threadIdx.x / 32] = v;
    __syncthreads();
    T r = red[0];
    for (int w = 1; w < nw; w++)
        r = op(r, red[w]);
    return r;
}

// The last of n CTAs to arrive at *cnt (which it resets) gets true; the
// others false. The callers' stores before it are visible to that CTA
// (__threadfence, then its reads through L2). The whole CTA calls it.
RD_DEV bool last_to_arrive(unsigned *cnt, unsigned n)
{
    __shared__ int last;
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) {
        last = atomicAdd(cnt, 1u) == n - 1;
        if (last)
            *cnt = 0; // every arrival has counted: the next launch starts from zero
    }
    __syncthreads();
    if (last)
        __threadfence();
    return last;
}

// 8 bf16 (16 bytes, 16-byte aligned) to floats.
RD_DEV void load_bf16x8(const uint16_t *p, float *f)
{
    uint4 u = *(const uint4 *)p;
    f[0] = cm_u2f(u.x << 16), f[1] = cm_u2f(u.x & 0xffff0000u);
    f[2] = cm_u2f(u.y << 16), f[3] = cm_u2f(u.y & 0xffff0000u);
    f[4] = cm_u2f(u.z << 16), f[5] = cm_u2f(u.z & 0xffff0000u);
    f[6] = cm_u2f(u.w << 16), f[7] = cm_u2f(u.w & 0xffff0000u);
}

// 8 floats (32 bytes, 16-byte aligned).
RD_DEV void load_f32x8(const float *p, float *f)
{
    float4 a = *(const float4 *)p, b = *(const float4 *)(p + 4);
    f[0] = a.x, f[1] = a.y, f[2] = a.z, f[3] = a.w;
    f[4] = b.x, f[5] = b.y, f[6] = b.z, f[7] = b.w;
}

// The bf16 copy of an activation for a GEMM: hi = bf16(v) at p[i]; with
// lo_off > 0 also lo = bf16(v - hi) at p[lo_off + i] (v ~ hi + lo to ~16 bits).
RD_DEV void store_bf(uint16_t *p, int64_t i, int64_t lo_off, float v)
{
    const uint16_t hi = cm_f32_to_bf16(v);
    p[i] = hi;
    if (lo_off)
        p[lo_off + i] = cm_f32_to_bf16(v - cm_bf16_to_f32(hi));
}

// cp.async (sm_80+): B bytes from global src to shared dst without passing
// through registers, so a kernel can have several stages of loads in flight;
// with valid false nothing is read and dst gets zeros. They land as a group:
// cp_async_commit closes this thread's group, cp_async_wait<N> waits until all
// of this thread's groups but the newest N have landed (then __syncthreads
// before reading another thread's copies). The emulator lands them only at
// the wait and poisons dst until then (cuemu.h).
template <int B> RD_DEV void cp_async(void *dst, const void *src, bool valid)
{
    static_assert(B == 4 || B == 8 || B == 16, "cp.async moves 16 bytes (.cg), 8 or 4 (.ca) here");
#ifdef RD_CUDA_EMU
    cuemu::cp_async(dst, src, B, valid ? B : 0);
#else
    const unsigned sa = (unsigned)__cvta_generic_to_shared(dst);
    if constexpr (B == 16)
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(sa), "l"(src), "r"(valid ? 16 : 0) : "memory");
    else if constexpr (B == 8)
        asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;\n" ::"r"(sa), "l"(src), "r"(valid ? 8 : 0) : "memory");
    else
        asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(sa), "l"(src), "r"(valid ? 4 : 0) : "memory");
#endif
}

RD_DEV void cp_async_commit()
{
#ifdef RD_CUDA_EMU
    cuemu::cp_async_commit();
#else
    asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}

template <int N> RD_DEV void cp_async_wait()
{
#ifdef RD_CUDA_EMU
    cuemu::cp_async_wait(N);
#else
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
#endif
}

// A ring of `stages` cp.async groups (RD_CUDA_TC_PIPE: 2, 3, 4 or 6), one committed per chunk: all but the
// newest stages - 2 have landed.
RD_DEV void cp_async_wait_ring(int stages)
{
    if (stages == 2)
        cp_async_wait<0>();
    else if (stages == 3)
        cp_async_wait<1>();
    else if (stages == 4)
        cp_async_wait<2>();
    else
        cp_async_wait<4>();
}

RD_DEV void load_x8(const uint16_t *p, float *f) { load_bf16x8(p, f); }
RD_DEV void load_x8(const float *p, float *f) { load_f32x8(p, f); }
RD_DEV float load_x1(const uint16_t *p) { return cm_bf16_to_f32(*p); }
RD_DEV float load_x1(const float *p) { return *p; }

}  // namespace RD_NS

#endif
