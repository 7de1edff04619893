// cuda_lora.cu - LoRA as an op of its own (backend.h lora_apply): every row
// of a step adds its adapter's s * B (A x) to a linear's output, all the
// adapters of the step in one pair of launches, in the style of Punica's
// SGMV / BGMV and S-LoRA: the adapter of a row is looked up on the device
// (slots[row] into a table of the resident adapters' pointers), so the host
// never reads the rows' adapters and the launch shape depends only on m,
// max_rank and out: the op records into a CUDA graph.
//
//   1. k_lora_shrink, grid (m, max_rank / LORA_WARPS): warp (row, k)
//      computes t[row][k] = A[k] . x[row]; a warp whose k is past its
//      adapter's rank, or whose row has none, returns at once.
//   2. k_lora_expand, grid (m, out / LORA_EXP_THREADS): the block stages its
//      row's t in shared memory; thread j computes u = B[j] . t with fmaf in
//      k order and adds s * u to y[row][out_off + j].
//
// A and B stay in the file's dtype (f32, f16 or bf16) and are widened
// exactly as they are read; x and t stay fp32, every product and sum is
// fp32 (fmaf).
//
// Batch invariance: a dot of the shrink is the warp order of backend.h
// (RD_LORA_LANES: lane l takes the 8-element chunks l, l + 32, ... with fmaf
// in order, then its tail elements, then the xor butterfly), fixed by in
// alone; the expand is one serial chain per output. Neither depends on
// which block or pass a row lands in, on m, or on the other rows'
// adapters, and the CPU backend (kernels/cpu/lora.c) replays the same
// orders, so the two agree bit for bit.
#include "kernels/cuda/cuda_internal.h"

extern "C" {
#include "engine/backend.h"
}

namespace RD_NS {

#define LORA_WARPS 8            // rank indices per shrink block
#define LORA_EXP_THREADS 128    // outputs per expand block
#define LORA_TABLE_CHUNK 64     // entries per table launch: 2 KiB of kernel arguments

struct lora_entries {
    lora_dev e[LORA_TABLE_CHUNK];
};

__global__ void k_lora_set_table(lora_dev *table, lora_entries p, int32_t n)
{
    RD_PDL_ENTRY();
    const int32_t i = threadIdx.x;
    if (i < n)
        table[i] = p.e[i];
}

void launch_lora_set_table(cudaStream_t s, lora_dev *table, const lora_dev *p, int32_t n)
{
    for (int32_t c = 0; c < n; c += LORA_TABLE_CHUNK) {
        const int32_t len = n - c < LORA_TABLE_CHUNK ? n - c : LORA_TABLE_CHUNK;
        lora_entries e;
        memset(&e, 0, sizeof e);
        memcpy(e.e, p + c, (size_t)len * sizeof(lora_dev));
        RD_LAUNCH(k_lora_set_table, dim3(1), dim3(LORA_TABLE_CHUNK), 0, s, table + c, e, len);
    }
}

// Element e of x's row: as it is, or with NORM that row's RMSNorm output (inv its factor), the value
// k_rmsnorm (and the tensor-core GEMM's prologue) gives.
template <bool NORM> RD_DEV float shrink_x(const lora_args &a, const float *x, int64_t e, float inv)
{
    return NORM ? rms_apply(x[e], inv, a.nw[e], a.w_off) : x[e];
}

// Lane `lane`'s partial of w[0..n) . x[0..n) (w's elements from index w0).
template <int DT, bool NORM>
RD_DEV float lane_part(const lora_args &a, const void *w, int64_t w0, const float *x, float inv, int32_t lane)
{
    const int32_t n = a.in;
    float acc = 0.0f;
    const int32_t chunks = n / RD_LORA_CHUNK;
    for (int32_t c = lane; c < chunks; c += RD_LORA_LANES)
RD_UNROLL
        for (int t = 0; t < RD_LORA_CHUNK; t++) {
            const int64_t e = (int64_t)c * RD_LORA_CHUNK + t;
            acc = fmaf(shrink_x<NORM>(a, x, e, inv), lora_wload<DT>(w, w0 + e), acc);
        }
    for (int32_t e = chunks * RD_LORA_CHUNK + lane; e < n; e += RD_LORA_LANES)
        acc = fmaf(shrink_x<NORM>(a, x, e, inv), lora_wload<DT>(w, w0 + e), acc);
    return acc;
}

// The shrinks of up to TC_LORA_MAX calls on the same rows of x (the q, k and v of a q|k|v GEMM) in one
// launch: blockIdx.y runs over each call's rank blocks in turn.
struct lora_shrinks {
    lora_args a[TC_LORA_MAX];
    int32_t y0[TC_LORA_MAX + 1]; // call c's blocks are [y0[c], y0[c + 1])
};

template <bool NORM> __global__ void __launch_bounds__(32 * LORA_WARPS) k_lora_shrink(lora_shrinks sh)
{
    RD_PDL_ENTRY();
    int c = 0;
    while (c + 1 < TC_LORA_MAX && (int32_t)blockIdx.y >= sh.y0[c + 1])
        c++;
    const lora_args &a = sh.a[c];
    const int32_t i = blockIdx.x, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int32_t k = ((int32_t)blockIdx.y - sh.y0[c]) * LORA_WARPS + warp;
    const int32_t s = a.slots[i];
    if (s < 0 || s >= a.n_slots)
        return; // the whole block
    const lora_dev d = a.table[s];
    if (!d.a || k >= d.rank)
        return; // the whole warp: no shuffles below for it
    const float *x = a.x + (int64_t)i * a.in;
    const float inv = NORM ? rms_row_inv(x, a.in, a.eps, lane) : 0.0f; // (each warp its own: the same value)
    const int64_t w0 = (int64_t)k * a.in;
    float p;
    if (d.a_dt == LORA_DT_F32)
        p = lane_part<LORA_DT_F32, NORM>(a, d.a, w0, x, inv, lane);
    else if (d.a_dt == LORA_DT_F16)
        p = lane_part<LORA_DT_F16, NORM>(a, d.a, w0, x, inv, lane);
    else
        p = lane_part<LORA_DT_BF16, NORM>(a, d.a, w0, x, inv, lane);
    p = warp_allreduce(p, op_add());
    if (lane == 0)
        a.t[(int64_t)i * a.max_rank + k] = p;
}

__global__ void __launch_bounds__(LORA_EXP_THREADS) k_lora_expand(lora_args a)
{
    RD_PDL_ENTRY();
    __shared__ float s_t[RD_LORA_MAX_RANK];
    const int32_t i = blockIdx.x;
    const int32_t s = a.slots[i];
    if (s < 0 || s >= a.n_slots)
        return; // the whole block
    const lora_dev d = a.table[s];
    if (!d.b || d.rank > a.max_rank)
        return; // the whole block
    for (int32_t k = threadIdx.x; k < d.rank; k += blockDim.x)
        s_t[k] = a.t[(int64_t)i * a.max_rank + k];
    __syncthreads();
    const int32_t j = blockIdx.y * LORA_EXP_THREADS + threadIdx.x;
    if (j >= a.out)
        return;
    float *yj = a.y + (int64_t)i * a.y_stride + a.out_off + j;
    *yj = RD_FADD(*yj, lora_term(d, j, s_t));
}

void launch_lora_shrinks(cudaStream_t s, const lora_args *a, int n)
{
    if (n < 1 || n > TC_LORA_MAX || a[0].m <= 0)
        return;
    lora_shrinks sh;
    memset(&sh, 0, sizeof sh);
    for (int c = 0; c < TC_LORA_MAX; c++) {
        sh.a[c] = a[c < n ? c : n - 1];
        sh.y0[c + 1] = sh.y0[c] + (c < n ? (a[c].max_rank + LORA_WARPS - 1) / LORA_WARPS : 0);
    }
    const dim3 grid((unsigned)a[0].m, (unsigned)sh.y0[TC_LORA_MAX]), block(32 * LORA_WARPS);
    if (a[0].nw)
        RD_LAUNCH(k_lora_shrink<true>, grid, block, 0, s, sh);
    else
        RD_LAUNCH(k_lora_shrink<false>, grid, block, 0, s, sh);
}

void launch_lora_apply(cudaStream_t s, const lora_args &a)
{
    if (a.m <= 0 || a.max_rank <= 0 || a.out <= 0)
        return;
    launch_lora_shrinks(s, &a, 1);
    RD_LAUNCH(k_lora_expand, dim3((unsigned)a.m, (unsigned)((a.out + LORA_EXP_THREADS - 1) / LORA_EXP_THREADS)),
              dim3(LORA_EXP_THREADS), 0, s, a);
}

}  // namespace RD_NS
