// cuemu.h - a host emulation of the CUDA subset the backend uses, so the
// kernels and the backend's host logic run (slowly) on a machine without a
// GPU. Only for tests: build the .cu files with g++ -x c++ -DRD_CUDA_EMU.
//
// Model: a launch runs its blocks one after another on the calling thread;
// each CUDA thread of a block is a fiber with its own stack. __syncthreads
// and warp operations (shuffles, __syncwarp) are barriers at which the fibers
// yield; a barrier releases when every live thread of its scope (block or
// warp) has reached it. The emulator aborts with a message on what CUDA
// leaves undefined and our kernels must never do: a warp operation with a
// lane that has exited, a __syncthreads after some threads returned, threads
// of one warp waiting at different barriers (deadlock), more than 1024
// threads or 48 KiB of dynamic shared memory, cudaMalloc/synchronize during
// stream capture. Device memory is host memory; streams are in-order queues
// executed immediately; graphs record closures and replay them.
#ifndef RD_CUEMU_H
#define RD_CUEMU_H

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>

struct dim3 {
    unsigned x, y, z;
    constexpr dim3(unsigned a = 1, unsigned b = 1, unsigned c = 1) : x(a), y(b), z(c) {}
};
struct cuemu_uint3 {
    unsigned x, y, z;
};
struct uint4 {
    unsigned x, y, z, w;
};
struct uint2 {
    unsigned x, y;
};
struct float4 {
    float x, y, z, w;
};
struct float2 {
    float x, y;
};

namespace cuemu {
struct fiber;
extern fiber *cur;
extern cuemu_uint3 block_idx;
extern dim3 block_dim, grid_dim;
const cuemu_uint3 &thread_idx();
void syncthreads();
// Warp exchange: every live lane of the warp publishes v, then reads lane src's value.
uint64_t warp_exchange(uint64_t v, unsigned src_lane);
unsigned lane_id();
unsigned char *dyn_smem();
struct stream_t;
// name: the kernel's, printed as it runs when CUEMU_TRACE=1 (a step's kernels, in order, graph replays included);
// key: the kernel function (fn_key), whose dynamic shared memory past 48 KiB must have been opted into
// (cudaFuncSetAttribute), as on a GPU.
void launch(dim3 grid, dim3 block, size_t smem, stream_t *s, std::function<void()> body, const char *name = nullptr,
            const void *key = nullptr);
template <class F> const void *fn_key(F *f) { return reinterpret_cast<const void *>(f); }
// cp.async of bytes (4 or 16) from global src to shared dst, src_bytes of them read (the rest zeros): the copy
// lands only when this thread waits for its group (cp_async_wait), and dst reads as NaN bytes (0xff) from
// the issue until then, so a read before the wait, or a copy issued over a stage another warp still reads,
// gives NaN instead of passing by luck.
void cp_async(void *dst, const void *src, unsigned bytes, unsigned src_bytes);
void cp_async_commit();                 // the thread's copies since the last commit become a group
void cp_async_wait(unsigned newest);    // all groups but the newest `newest` have landed
// wgmma.mma_async.sync.aligned.m64nNk16.f32.bf16.bf16 with A from registers (each warp of the warpgroup
// its 16 rows, in mma.sync m16n8k16's A layout) and B from dynamic shared memory through a K-major,
// unswizzled descriptor; d: the thread's N / 2 accumulators (N / 8 blocks of 4, as mma.sync's D). It runs
// when its group is waited for (wgmma_wait): B is read and d written then, so a B overwritten or d read
// before the wait gives other values, as it would on a GPU; A's registers (a) written before then abort.
// Products exact, summed in double, rounded once.
void wgmma_bf16(float *d, unsigned n, const uint32_t (&a)[4], uint64_t desc);
// The tensor cores read shared memory through the async proxy: ordinary stores meant for them (a kernel marks its
// own with smem_async_write) need the writer's fence.proxy.async (fence_proxy_async) before the barrier that
// publishes them, or before its own wgmma; a barrier or a wgmma with such stores unfenced aborts.
void smem_async_write();
void fence_proxy_async();
void wgmma_commit();                    // the thread's wgmma operations since the last commit become a group
void wgmma_wait(unsigned newest);       // all groups but the newest `newest` have run
// Warp all-gather: every live lane of the warp publishes `bytes` (at most 64)
// from mine, then reads all 32 lanes' into all (lane l's at l * bytes).
void warp_allgather(const void *mine, unsigned bytes, void *all);
}  // namespace cuemu

#define threadIdx (cuemu::thread_idx())
#define blockIdx (cuemu::block_idx)
#define blockDim (cuemu::block_dim)
#define gridDim (cuemu::grid_dim)
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __shared__ static
#define __launch_bounds__(...)
#define __restrict__ __restrict
#define __align__(n) __attribute__((aligned(n)))

inline void __syncthreads() { cuemu::syncthreads(); }
inline void __syncwarp(unsigned mask = 0xffffffffu)
{
    (void)mask;
    (void)cuemu::warp_exchange(0, cuemu::lane_id());
}

template <class T> inline T cuemu_shfl(T v, unsigned src)
{
    static_assert(sizeof(T) <= 8, "shuffle of at most 8 bytes");
    uint64_t b = 0;
    std::memcpy(&b, &v, sizeof v);
    uint64_t r = cuemu::warp_exchange(b, src);
    T out;
    std::memcpy(&out, &r, sizeof out);
    return out;
}
template <class T> inline T __shfl_xor_sync(unsigned mask, T v, int lane_mask, int width = 32)
{
    (void)mask;
    unsigned lane = cuemu::lane_id();
    unsigned src = lane ^ (unsigned)lane_mask;
    if ((src & ~(unsigned)(width - 1)) != (lane & ~(unsigned)(width - 1)))
        src = lane;
    return cuemu_shfl(v, src);
}
template <class T> inline T __shfl_sync(unsigned mask, T v, int src_lane, int width = 32)
{
    (void)mask;
    unsigned lane = cuemu::lane_id();
    unsigned src = (lane & ~(unsigned)(width - 1)) + ((unsigned)src_lane & (unsigned)(width - 1));
    return cuemu_shfl(v, src);
}

// Blocks run one after another and memory is host memory: fences order nothing
// more, and an L2-only load reads what any store wrote.
inline void __threadfence() {}
template <class T> inline T __ldcg(const T *p) { return *p; }

// mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 for one warp: d = A B + d
// with each lane's fragments in the PTX ISA's layout (groupID g = lane / 4,
// t = lane % 4; a[0]: A[g][2t..2t+1], a[1]: A[g+8][2t..], a[2]: A[g][2t+8..],
// a[3]: A[g+8][2t+8..]; b[0]: B[2t..2t+1][g], b[1]: B[2t+8..][g]; d[0..1]:
// D[g][2t..2t+1], d[2..3]: D[g+8][2t..]; the lower k or column in the low 16
// bits). The products are exact; the emulator sums them in double and rounds
// once (a GPU's tensor cores keep fewer bits: only tolerances compare the two).
inline void cuemu_mma_bf16_16816(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2])
{
    struct frag {
        uint32_t a[4], b[2];
    } me, all[32];
    std::memcpy(me.a, a, sizeof me.a);
    std::memcpy(me.b, b, sizeof me.b);
    cuemu::warp_allgather(&me, sizeof me, all);
    float A[16][16], B[16][8];
    auto lo = [](uint32_t v) { uint32_t u = v << 16; float f; std::memcpy(&f, &u, 4); return f; };
    auto hi = [](uint32_t v) { uint32_t u = v & 0xffff0000u; float f; std::memcpy(&f, &u, 4); return f; };
    for (unsigned l = 0; l < 32; l++) {
        const unsigned g = l / 4, t = l % 4;
        const frag &f = all[l];
        A[g][2 * t] = lo(f.a[0]), A[g][2 * t + 1] = hi(f.a[0]);
        A[g + 8][2 * t] = lo(f.a[1]), A[g + 8][2 * t + 1] = hi(f.a[1]);
        A[g][2 * t + 8] = lo(f.a[2]), A[g][2 * t + 9] = hi(f.a[2]);
        A[g + 8][2 * t + 8] = lo(f.a[3]), A[g + 8][2 * t + 9] = hi(f.a[3]);
        B[2 * t][g] = lo(f.b[0]), B[2 * t + 1][g] = hi(f.b[0]);
        B[2 * t + 8][g] = lo(f.b[1]), B[2 * t + 9][g] = hi(f.b[1]);
    }
    const unsigned lane = cuemu::lane_id(), g = lane / 4, t = lane % 4;
    for (int i = 0; i < 4; i++) {
        const unsigned r = g + (i >= 2 ? 8 : 0), c = 2 * t + (i & 1);
        double s = d[i];
        for (int k = 0; k < 16; k++)
            s += (double)A[r][k] * (double)B[k][c];
        d[i] = (float)s;
    }
}

// The warp's A [16][32] and B [32][8] of an 8-bit m16n8k32 mma from every
// lane's registers (PTX ISA, the 8-bit m16n8k32 layouts: a[0]: A[g][4t..4t+3],
// a[1]: A[g+8][4t..], a[2]: A[g][4t+16..], a[3]: A[g+8][4t+16..]; b[0]:
// B[4t..4t+3][g], b[1]: B[4t+16..][g]; the lower k in the lower byte), each
// byte read as val(register, byte index).
template <class T, class F>
inline void cuemu_frag8(const uint32_t (&a)[4], const uint32_t (&b)[2], F val, T (&A)[16][32], T (&B)[32][8])
{
    struct frag {
        uint32_t a[4], b[2];
    } me, all[32];
    std::memcpy(me.a, a, sizeof me.a);
    std::memcpy(me.b, b, sizeof me.b);
    cuemu::warp_allgather(&me, sizeof me, all);
    for (unsigned l = 0; l < 32; l++) {
        const unsigned g = l / 4, t = l % 4;
        const frag &f = all[l];
        for (int i = 0; i < 4; i++) {
            A[g][4 * t + i] = val(f.a[0], i), A[g + 8][4 * t + i] = val(f.a[1], i);
            A[g][4 * t + 16 + i] = val(f.a[2], i), A[g + 8][4 * t + 16 + i] = val(f.a[3], i);
            B[4 * t + i][g] = val(f.b[0], i), B[4 * t + 16 + i][g] = val(f.b[1], i);
        }
    }
}

// mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 for one warp: d = A B + d
// with E4M3 codes, four to a register (cuemu_frag8's layout; d as above).
// The products are exact; summed in double and
// rounded once. A NaN code (0x7f, 0xff) makes the sums it reaches NaN.
inline void cuemu_mma_e4m3_16832(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2])
{
    // a code's fields placed in fp32's read as 2^-120 times its value (subnormals included)
    auto val = [](uint32_t reg, int i) {
        const uint32_t c = reg >> (8 * i) & 0xffu;
        if ((c & 0x7fu) == 0x7fu)
            return (double)NAN;
        const uint32_t u = (c & 0x80u) << 24 | (c & 0x7fu) << 20;
        float f;
        std::memcpy(&f, &u, 4);
        return (double)f * 0x1p120;
    };
    double A[16][32], B[32][8];
    cuemu_frag8(a, b, val, A, B);
    const unsigned lane = cuemu::lane_id(), g = lane / 4, t = lane % 4;
    for (int i = 0; i < 4; i++) {
        const unsigned r = g + (i >= 2 ? 8 : 0), c = 2 * t + (i & 1);
        double s = d[i];
        for (int k = 0; k < 32; k++)
            s += A[r][k] * B[k][c];
        d[i] = (float)s;
    }
}

// mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 for one warp: d = A B + d
// with int8 values, four to a register in the 8-bit m16n8k32 layout above;
// the products and the sums are exact integers (wrapping as the hardware's
// two's complement adds would, never reached by 32 products of |x| <= 128).
inline void cuemu_mma_s8_16832(int32_t (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2])
{
    auto val = [](uint32_t reg, int i) { return (int32_t)(int8_t)(reg >> (8 * i) & 0xffu); };
    int32_t A[16][32], B[32][8];
    cuemu_frag8(a, b, val, A, B);
    const unsigned lane = cuemu::lane_id(), g = lane / 4, t = lane % 4;
    for (int i = 0; i < 4; i++) {
        const unsigned r = g + (i >= 2 ? 8 : 0), c = 2 * t + (i & 1);
        int64_t s = d[i];
        for (int k = 0; k < 32; k++)
            s += (int64_t)A[r][k] * B[k][c];
        d[i] = (int32_t)s;
    }
}

inline float __int_as_float(int i)
{
    float f;
    std::memcpy(&f, &i, sizeof f);
    return f;
}
inline int __float_as_int(float f)
{
    int i;
    std::memcpy(&i, &f, sizeof i);
    return i;
}
inline float __expf(float x) { return std::exp(x); }
inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
inline double __longlong_as_double(long long v)
{
    double d;
    std::memcpy(&d, &v, sizeof d);
    return d;
}
inline int atomicAdd(int *p, int v)
{
    int old = *p;
    *p = old + v;
    return old;
}
inline unsigned atomicAdd(unsigned *p, unsigned v)
{
    unsigned old = *p;
    *p = old + v;
    return old;
}
inline unsigned long long atomicAdd(unsigned long long *p, unsigned long long v)
{
    unsigned long long old = *p;
    *p = old + v;
    return old;
}
inline unsigned long long atomicMax(unsigned long long *p, unsigned long long v)
{
    unsigned long long old = *p;
    *p = old > v ? old : v;
    return old;
}

// ---- runtime API subset ----
typedef int cudaError_t;
enum {
    cudaSuccess = 0,
    cudaErrorInvalidValue = 1,
    cudaErrorMemoryAllocation = 2,
    cudaErrorNoDevice = 100,
    cudaErrorInvalidConfiguration = 9,
    cudaErrorStreamCaptureUnsupported = 900,
    cudaErrorStreamCaptureInvalidated = 901,
    cudaErrorIllegalState = 401,
};
typedef cuemu::stream_t *cudaStream_t;
struct cuemu_graph;
struct cuemu_graph_exec;
typedef cuemu_graph *cudaGraph_t;
typedef cuemu_graph_exec *cudaGraphExec_t;
struct cuemu_event;
typedef cuemu_event *cudaEvent_t;
enum cudaMemcpyKind {
    cudaMemcpyHostToHost = 0,
    cudaMemcpyHostToDevice = 1,
    cudaMemcpyDeviceToHost = 2,
    cudaMemcpyDeviceToDevice = 3,
    cudaMemcpyDefault = 4
};
enum cudaStreamCaptureMode { cudaStreamCaptureModeGlobal = 0, cudaStreamCaptureModeThreadLocal = 1,
                             cudaStreamCaptureModeRelaxed = 2 };
enum cudaStreamCaptureStatus { cudaStreamCaptureStatusNone = 0, cudaStreamCaptureStatusActive = 1,
                               cudaStreamCaptureStatusInvalidated = 2 };
#define cudaStreamNonBlocking 0x1u
#define cudaHostAllocDefault 0u

struct cudaDeviceProp {
    char name[256];
    size_t totalGlobalMem;
    int multiProcessorCount;
    int major, minor;
    size_t sharedMemPerBlock;
};

const char *cudaGetErrorString(cudaError_t e);
cudaError_t cudaGetLastError();
cudaError_t cudaPeekAtLastError();
cudaError_t cudaGetDeviceCount(int *n);
cudaError_t cudaSetDevice(int d);
cudaError_t cudaGetDevice(int *d);
cudaError_t cudaGetDeviceProperties(cudaDeviceProp *p, int d);
cudaError_t cudaMemGetInfo(size_t *free_b, size_t *total_b);
cudaError_t cudaDeviceSynchronize();
cudaError_t cudaMalloc(void **p, size_t bytes);
cudaError_t cudaFree(void *p);
cudaError_t cudaMallocHost(void **p, size_t bytes);
cudaError_t cudaFreeHost(void *p);
cudaError_t cudaMemcpy(void *dst, const void *src, size_t bytes, cudaMemcpyKind k);
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes, cudaMemcpyKind k, cudaStream_t s);
cudaError_t cudaMemsetAsync(void *dst, int v, size_t bytes, cudaStream_t s);
cudaError_t cudaMemset(void *dst, int v, size_t bytes);
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned flags);
cudaError_t cudaStreamDestroy(cudaStream_t s);
cudaError_t cudaStreamSynchronize(cudaStream_t s);
cudaError_t cudaStreamBeginCapture(cudaStream_t s, cudaStreamCaptureMode mode);
cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t *g);
cudaError_t cudaStreamIsCapturing(cudaStream_t s, cudaStreamCaptureStatus *st);
cudaError_t cudaGraphInstantiate(cudaGraphExec_t *e, cudaGraph_t g, unsigned long long flags);
cudaError_t cudaGraphLaunch(cudaGraphExec_t e, cudaStream_t s);
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t e);
cudaError_t cudaGraphDestroy(cudaGraph_t g);
cudaError_t cudaEventCreate(cudaEvent_t *e);
cudaError_t cudaEventDestroy(cudaEvent_t e);
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s);
cudaError_t cudaEventSynchronize(cudaEvent_t e);
cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t a, cudaEvent_t b);

// Dynamic shared memory past the default 48 KiB, up to an H100's 227 KiB, is opted into per kernel.
enum cudaFuncAttribute { cudaFuncAttributeMaxDynamicSharedMemorySize = 8 };
namespace cuemu {
cudaError_t func_set_smem(const void *key, int bytes);
}
template <class F> inline cudaError_t cudaFuncSetAttribute(F *f, cudaFuncAttribute attr, int v)
{
    return attr == cudaFuncAttributeMaxDynamicSharedMemorySize ? cuemu::func_set_smem(cuemu::fn_key(f), v)
                                                                : cudaErrorInvalidValue;
}

namespace cuemu {
// Test hooks: launches run so far; make the next cudaMalloc fail (for error paths).
uint64_t launches();
uint64_t syncs();
void fail_next_malloc();
}  // namespace cuemu

#endif
