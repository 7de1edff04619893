// cuda_kernels.cu - the row and elementwise kernels of the CUDA backend and
// the fallback GEMM. Each computes what the CPU backend's op computes
// (kernels/cpu/cpu_backend.c); where the CPU order of operations can be kept
// (RoPE, RMSNorm's scaling, SwiGLU's formula) it is kept with round-to-nearest
// intrinsics, so the two backends differ only where bf16 storage or a
// different exp implementation says they must.
#include "kernels/cuda/cuda_internal.h"

#include "kernels/cuda/cuda_fp8_decode.cuh"

namespace RD_NS {

static inline unsigned blocks_for(int64_t n, int threads) { return (unsigned)((n + threads - 1) / threads); }

// ------------------------------------------------------------------ embed

// Row ids[i] of a table: bf16 (w), or Q8_0 (codes w, fp16 scales d per 32:
// code x d, the float ggml_dequant_row gives, an exact product); zeros for
// an id outside [0, vocab); each value then times scale unless it is 1
// (Gemma's sqrt(hidden): one fp32 rounding, as a separate pass over the
// rows would give). With dim a multiple of 8 a thread moves 8
// contiguous values a pass (one 16-byte load of bf16, 8 bytes of codes), so a
// 2048-wide row is one pass of EMBED_THREADS, not a loop of loads that each
// wait for the store before them.
#define EMBED_THREADS 256
template <bool Q8>
__global__ void __launch_bounds__(EMBED_THREADS)
    k_embed(const void *w, const uint16_t *d, int32_t vocab, int32_t dim, const int32_t *ids, float scale, float *out)
{
    RD_PDL_ENTRY();
    const int32_t row = blockIdx.x;
    const int32_t id = ids[row];
    float *o = out + (int64_t)row * dim;
    const bool in_table = id >= 0 && id < vocab;
    if (dim % 8 == 0) {
        for (int32_t j = 8 * (int32_t)threadIdx.x; j < dim; j += 8 * (int32_t)blockDim.x) {
            float f[8] = {};
            const int64_t at = (int64_t)id * dim + j;
            if (in_table && Q8) {
                const uint2 c = *(const uint2 *)((const int8_t *)w + at);
                const float dd = cm_f16_to_f32(d[at / 32]); // (8 values never straddle a block of 32)
RD_UNROLL
                for (int e = 0; e < 8; e++)
                    f[e] = RD_FMUL((float)(int8_t)((e < 4 ? c.x : c.y) >> (8 * (e % 4))), dd);
            } else if (in_table) {
                load_bf16x8((const uint16_t *)w + at, f);
            }
            if (scale != 1.0f && in_table)
RD_UNROLL
                for (int e = 0; e < 8; e++)
                    f[e] = RD_FMUL(f[e], scale);
            *(float4 *)(o + j) = float4{f[0], f[1], f[2], f[3]};
            *(float4 *)(o + j + 4) = float4{f[4], f[5], f[6], f[7]};
        }
        return;
    }
    if (!in_table) {
        for (int32_t j = threadIdx.x; j < dim; j += blockDim.x)
            o[j] = 0.0f;
        return;
    }
    for (int32_t j = threadIdx.x; j < dim; j += blockDim.x) {
        const int64_t at = (int64_t)id * dim + j;
        const float v = Q8 ? RD_FMUL((float)((const int8_t *)w)[at], cm_f16_to_f32(d[at / 32]))
                           : cm_bf16_to_f32(((const uint16_t *)w)[at]);
        o[j] = scale != 1.0f ? RD_FMUL(v, scale) : v;
    }
}

void launch_embed(cudaStream_t s, const uint16_t *w, int32_t vocab, int32_t dim, const int32_t *ids, int32_t m,
                  float scale, float *out)
{
    if (m <= 0)
        return;
    const uint16_t *none = nullptr;
    RD_LAUNCH(k_embed<false>, dim3(m), dim3(EMBED_THREADS), 0, s, (const void *)w, none, vocab, dim, ids, scale, out);
}

void launch_embed_q8(cudaStream_t s, const int8_t *q, const uint16_t *d, int32_t vocab, int32_t dim,
                     const int32_t *ids, int32_t m, float scale, float *out)
{
    if (m <= 0)
        return;
    RD_LAUNCH(k_embed<true>, dim3(m), dim3(EMBED_THREADS), 0, s, (const void *)q, d, vocab, dim, ids, scale, out);
}

// ------------------------------------------------------------------ rmsnorm

// A row per CTA of RMS_THREADS threads, thread j taking elements j,
// j + RMS_THREADS, ... (rms_acc in that order, then block_allreduce). With NV
// > 0 (d <= NV x RMS_THREADS) the thread first loads all of its elements into
// registers, so their loads are in flight together: in the loop (NV 0, wider
// rows, or RD_CUDA_NORM_V0=1) a split sum's write-back kept each load waiting
// for the one before it, a round trip to L2 per element. Same order, same bits.
// add_to (NULL: none): add_to += out as it is written, on the same [m][d]
// (rmsnorm_add: Gemma 3's residual add after a post-norm).
// Element k = row x d + j of the norm's output o: out, its bf16 copy, add_to.
RD_DEV void rms_store(float *out, uint16_t *out_bf, int64_t lo_off, float *add_to, int64_t k, float o)
{
    out[k] = o;
    if (out_bf)
        store_bf(out_bf, k, lo_off, o);
    if (add_to)
        add_to[k] = RD_FADD(add_to[k], o);
}

template <int NV>
__global__ void __launch_bounds__(RMS_THREADS) k_rmsnorm(float *x, const float *w, int32_t d, float eps, float w_off,
                                                         float *out, uint16_t *out_bf, int64_t lo_off, split_sum sp,
                                                         float *add_to)
{
    RD_PDL_ENTRY();
    const int64_t row = blockIdx.x;
    float *xi = x + row * d;
    double ss = 0.0;
    if constexpr (NV > 0) {
        float v[NV];
RD_UNROLL
        for (int i = 0; i < NV; i++) {
            const int32_t j = (int32_t)threadIdx.x + i * RMS_THREADS;
            v[i] = j >= d ? 0.0f : sp.t ? split_value(sp, x, row * d + j) : xi[j];
        }
RD_UNROLL
        for (int i = 0; i < NV; i++) {
            const int32_t j = (int32_t)threadIdx.x + i * RMS_THREADS;
            if (j < d) {
                if (sp.t)
                    xi[j] = v[i];
                ss = rms_acc(ss, v[i]);
            }
        }
        ss = block_allreduce(ss, op_add());
        const float inv = rms_inv(ss, d, eps);
RD_UNROLL
        for (int i = 0; i < NV; i++) {
            const int32_t j = (int32_t)threadIdx.x + i * RMS_THREADS;
            if (j < d)
                rms_store(out, out_bf, lo_off, add_to, row * d + j, rms_apply(v[i], inv, w[j], w_off));
        }
    } else {
        for (int32_t j = threadIdx.x; j < d; j += blockDim.x) {
            if (sp.t) // the thread reads back only what it wrote
                xi[j] = split_value(sp, x, row * d + j);
            ss = rms_acc(ss, xi[j]);
        }
        ss = block_allreduce(ss, op_add());
        const float inv = rms_inv(ss, d, eps);
        for (int32_t j = threadIdx.x; j < d; j += blockDim.x)
            rms_store(out, out_bf, lo_off, add_to, row * d + j, rms_apply(xi[j], inv, w[j], w_off));
    }
}

void launch_rmsnorm(cudaStream_t s, float *x, const float *w, int32_t m, int32_t d, float eps, float w_off,
                    float *out, uint16_t *out_bf, int64_t lo_off, split_sum ss, float *add_to, bool v0)
{
    if (m <= 0)
        return;
    if (!v0 && d <= 8 * RMS_THREADS)
        RD_LAUNCH(k_rmsnorm<8>, dim3(m), dim3(RMS_THREADS), 0, s, x, w, d, eps, w_off, out, out_bf, lo_off, ss, add_to);
    else if (!v0 && d <= 20 * RMS_THREADS)
        RD_LAUNCH(k_rmsnorm<20>, dim3(m), dim3(RMS_THREADS), 0, s, x, w, d, eps, w_off, out, out_bf, lo_off, ss, add_to);
    else
        RD_LAUNCH(k_rmsnorm<0>, dim3(m), dim3(RMS_THREADS), 0, s, x, w, d, eps, w_off, out, out_bf, lo_off, ss, add_to);
}

// ------------------------------------------------------------------ bias

// y[i][j] += b[j] for j < n on each row; with a split sum, every column
// of the rows [m][stride] is completed first and the bias added to that
// rounded value, as the CPU adds it to its GEMM's rounded output.
__global__ void k_add_bias(float *y, int32_t stride, int32_t m, int32_t n, int32_t cols, const float *b,
                           split_sum sp)
{
    RD_PDL_ENTRY();
    const int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (int64_t)m * cols)
        return;
    const int64_t i = idx / cols;
    const int32_t j = (int32_t)(idx % cols);
    const int64_t k = i * stride + j;
    float v = sp.t ? split_value(sp, y, k) : y[k];
    if (j < n)
        v = RD_FADD(v, b[j]);
    y[k] = v;
}

void launch_add_bias(cudaStream_t s, float *y, int32_t stride, int32_t m, int32_t n, const float *b, split_sum ss)
{
    const int32_t cols = ss.t ? stride : n; // the split's columns past n still need their sum
    const int64_t total = (int64_t)m * cols;
    if (total <= 0)
        return;
    RD_LAUNCH(k_add_bias, dim3(blocks_for(total, 256)), dim3(256), 0, s, y, stride, m, n, cols, b, ss);
}

// ------------------------------------------------------------------ head rmsnorm

// One warp per (row, head), HNORM_WARPS heads per block: lane l sums the
// squares of the head's elements l, l + 32, ... in double, the lanes meet in
// the butterfly, and the scaling is k_rmsnorm's. The order depends only on
// head_dim. Blocks with blockIdx.y >= head_blocks complete the rest of the
// row (the columns after the n_heads heads: K and V behind Q) from the split
// sum, so no column of the GEMM's output is left without its sum. Heads from
// n_first on take the weight w2 (Qwen3's q and k norms in one launch).
#define HNORM_WARPS 4

__global__ void __launch_bounds__(32 * HNORM_WARPS)
    k_head_rmsnorm(float *x, int32_t stride, int32_t n_heads, int32_t hd, const float *w, int32_t n_first,
                   const float *w2, float eps, float w_off, int32_t head_blocks, split_sum sp)
{
    RD_PDL_ENTRY();
    const int64_t row = blockIdx.x;
    if ((int32_t)blockIdx.y >= head_blocks) {
        const int64_t c = (int64_t)n_heads * hd + (int64_t)(blockIdx.y - head_blocks) * blockDim.x + threadIdx.x;
        if (c < stride)
            x[row * stride + c] = split_value(sp, x, row * stride + c);
        return;
    }
    const int32_t h = blockIdx.y * HNORM_WARPS + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (h >= n_heads)
        return; // the whole warp: no shuffle below for it
    const int64_t o = row * stride + (int64_t)h * hd;
    float *v = x + o;
    if (h >= n_first)
        w = w2;
    double ss = 0.0;
    for (int32_t j = lane; j < hd; j += 32) {
        if (sp.t) // the lane reads back only what it wrote
            v[j] = split_value(sp, x, o + j);
        ss = rms_acc(ss, v[j]);
    }
    ss = warp_allreduce(ss, op_add());
    const float inv = rms_inv(ss, hd, eps);
    for (int32_t j = lane; j < hd; j += 32)
        v[j] = rms_apply(v[j], inv, w[j], w_off);
}

void launch_head_rmsnorm(cudaStream_t s, float *x, int32_t stride, int32_t m, int32_t n_heads, int32_t head_dim,
                         const float *w, int32_t n_first, const float *w2, float eps, float w_off, split_sum ss)
{
    if (m <= 0 || n_heads <= 0 || head_dim <= 0)
        return;
    const int32_t head_blocks = (n_heads + HNORM_WARPS - 1) / HNORM_WARPS;
    const int64_t tail = ss.t ? (int64_t)stride - (int64_t)n_heads * head_dim : 0;
    const int32_t tail_blocks = tail > 0 ? (int32_t)blocks_for(tail, 32 * HNORM_WARPS) : 0;
    RD_LAUNCH(k_head_rmsnorm, dim3(m, head_blocks + tail_blocks), dim3(32 * HNORM_WARPS), 0, s, x, stride, n_heads,
              head_dim, w, n_first, w2, eps, w_off, head_blocks, ss);
}

// ------------------------------------------------------------------ rope


// Column c after the n_heads rotated heads of row i (V of a q|k|v row):
// completed from the split sum (and written back), copied to the V cache.
RD_DEV void rope_tail(float *x, int32_t stride, int32_t n_heads, int32_t hd, int64_t i, int32_t c, const split_sum &sp,
                      const kv_out &kv)
{
    const int64_t k = i * stride + (int64_t)n_heads * hd + c;
    const float v = sp.t ? split_value(sp, x, k) : x[k];
    if (sp.t)
        x[k] = v;
    if (kv.kc && kv.slots[i] >= 0)
        kv.vc[kv_dst(kv, kv.slots[i], c / hd, c % hd, hd)] = cm_f32_to_bf16(v);
}

// Threads [0, m * n_heads * half) rotate a pair each; the threads after them
// complete the rows' remaining columns (V of a qkv row) from a split sum
// and/or copy them to the V cache. With a KV cache, a pair of a K head is
// written there too, rotated: RoPE and the KV write in one kernel.

__global__ void k_rope(float *x, int32_t stride, int32_t m, int32_t n_heads, int32_t half, const int32_t *positions,
                       const float *cos_sin, split_sum sp, kv_out kv)
{
    RD_PDL_ENTRY();
    const int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    const int64_t n_rot = (int64_t)m * n_heads * half;
    const int32_t hd = 2 * half;
    if (idx >= n_rot) {
        const int32_t tail = stride - n_heads * hd;
        if ((!sp.t && !kv.kc) || tail <= 0 || idx - n_rot >= (int64_t)m * tail)
            return;
        const int64_t r = idx - n_rot;
        rope_tail(x, stride, n_heads, hd, r / tail, (int32_t)(r % tail), sp, kv);
        return;
    }
    const int32_t j = (int32_t)(idx % half);
    const int32_t h = (int32_t)((idx / half) % n_heads);
    const int64_t i = idx / ((int64_t)half * n_heads);
    const float *cs = cos_sin + (int64_t)positions[i] * half * 2;
    const int64_t o = i * stride + (int64_t)h * hd;
    float *v = x + o;
    const float c = cs[2 * j], sn = cs[2 * j + 1];
    const float a = sp.t ? split_value(sp, x, o + j) : v[j];
    const float b = sp.t ? split_value(sp, x, o + j + half) : v[j + half];
    const float ra = RD_FSUB(RD_FMUL(a, c), RD_FMUL(b, sn));
    const float rb = RD_FADD(RD_FMUL(b, c), RD_FMUL(a, sn));
    v[j] = ra;
    v[j + half] = rb;
    const int32_t kh = h - (n_heads - kv.n_kv);
    if (kv.kc && kh >= 0 && kv.slots[i] >= 0) {
        kv.kc[kv_dst(kv, kv.slots[i], kh, j, hd)] = cm_f32_to_bf16(ra);
        kv.kc[kv_dst(kv, kv.slots[i], kh, j + half, hd)] = cm_f32_to_bf16(rb);
    }
}

// The per-head RMSNorm, RoPE and the KV write in one kernel (Qwen3's and
// Gemma 3's q/k norms before the rotation): one warp per (row, head) does
// k_head_rmsnorm's arithmetic, then rotates the normalized pairs (j, j + half)
// with k_rope's expression (hnorm_rope_head: both held by lane j % 32 when
// half is a multiple of 32; at head_dim 32 lanes j and j + 16 swap them). Blocks from head_blocks on complete and copy the columns after the
// heads (V) as k_rope's tail threads do. The bits of the three kernels.
__global__ void __launch_bounds__(32 * HNORM_WARPS)
    k_hnorm_rope(float *x, int32_t stride, int32_t n_heads, int32_t hd, const float *w, int32_t n_first,
                 const float *w2, float eps, float w_off, int32_t head_blocks, split_sum sp, const int32_t *positions,
                 const float *cos_sin, kv_out kv)
{
    RD_PDL_ENTRY();
    const int64_t row = blockIdx.x;
    if ((int32_t)blockIdx.y >= head_blocks) {
        const int32_t tail = stride - n_heads * hd;
        const int32_t c = (int32_t)(blockIdx.y - head_blocks) * (int32_t)blockDim.x + (int32_t)threadIdx.x;
        if (c < tail)
            rope_tail(x, stride, n_heads, hd, row, c, sp, kv);
        return;
    }
    const int32_t h = blockIdx.y * HNORM_WARPS + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (h >= n_heads)
        return; // the whole warp: no shuffle below for it
    const int64_t o = row * stride + (int64_t)h * hd;
    float *v = x + o;
    if (h >= n_first)
        w = w2;
    float nv[CUPLAN_ATTN_MAX_HD / 32];
    for (int32_t i = 0; 32 * i + lane < hd; i++) {
        const int32_t j = 32 * i + lane;
        nv[i] = sp.t ? split_value(sp, x, o + j) : v[j];
    }
    hnorm_rope_head(nv, v, hd, lane, w, eps, w_off, cos_sin + (int64_t)positions[row] * hd, kv, kv.kc ? kv.slots[row] : -1,
                    h - (n_heads - kv.n_kv));
}

void launch_hnorm_rope(cudaStream_t s, float *x, int32_t stride, int32_t m, int32_t n_heads, int32_t head_dim,
                       const float *w, int32_t n_first, const float *w2, float eps, float w_off, split_sum ss,
                       const int32_t *positions, const float *cos_sin, kv_out kv)
{
    if (m <= 0 || n_heads <= 0)
        return;
    const int32_t head_blocks = (n_heads + HNORM_WARPS - 1) / HNORM_WARPS;
    const int64_t tail = ss.t || kv.kc ? (int64_t)stride - (int64_t)n_heads * head_dim : 0;
    const int32_t tail_blocks = tail > 0 ? (int32_t)blocks_for(tail, 32 * HNORM_WARPS) : 0;
    RD_LAUNCH(k_hnorm_rope, dim3(m, head_blocks + tail_blocks), dim3(32 * HNORM_WARPS), 0, s, x, stride, n_heads,
              head_dim, w, n_first, w2, eps, w_off, head_blocks, ss, positions, cos_sin, kv);
}

void launch_rope(cudaStream_t s, float *x, int32_t stride, int32_t m, int32_t n_heads, int32_t head_dim,
                 const int32_t *positions, const float *cos_sin, split_sum ss, kv_out kv)
{
    int64_t total = (int64_t)m * n_heads * (head_dim / 2);
    if (ss.t || kv.kc)
        total += (int64_t)m * (stride - n_heads * (head_dim / 2) * 2);
    if (total <= 0)
        return;
    RD_LAUNCH(k_rope, dim3(blocks_for(total, 256)), dim3(256), 0, s, x, stride, m, n_heads, head_dim / 2, positions,
              cos_sin, ss, kv);
}

// ------------------------------------------------------------------ swiglu

__global__ void k_swiglu(float *gu, int32_t m, int32_t f, float *out, uint16_t *out_bf, int64_t lo_off,
                         split_sum sp)
{
    RD_PDL_ENTRY();
    const int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (int64_t)m * f)
        return;
    const int64_t i = idx / f;
    const int32_t c = (int32_t)(idx % f);
    const int64_t kg = i * 2 * f + c, ku = kg + f;
    if (sp.t) {
        gu[kg] = split_value(sp, gu, kg);
        gu[ku] = split_value(sp, gu, ku);
    }
    const float g = gu[kg], u = gu[ku];
    const float v = RD_FMUL(RD_FDIV(g, RD_FADD(1.0f, expf(-g))), u);
    out[idx] = v;
    if (out_bf)
        store_bf(out_bf, idx, lo_off, v);
}

void launch_swiglu(cudaStream_t s, float *gu, int32_t m, int32_t f, float *out, uint16_t *out_bf, int64_t lo_off,
                   split_sum ss)
{
    const int64_t total = (int64_t)m * f;
    if (total <= 0)
        return;
    RD_LAUNCH(k_swiglu, dim3(blocks_for(total, 256)), dim3(256), 0, s, gu, m, f, out, out_bf, lo_off, ss);
}

// ------------------------------------------------------------------ geglu

// Gemma's gated FFN: gelu_tanh(g) * u, the CPU's expression (cm_geglu) with
// cm_tanhf for tanhf; otherwise as k_swiglu.
__global__ void k_geglu(float *gu, int32_t m, int32_t f, float *out, uint16_t *out_bf, int64_t lo_off, split_sum sp)
{
    RD_PDL_ENTRY();
    const int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (int64_t)m * f)
        return;
    const int64_t i = idx / f;
    const int32_t c = (int32_t)(idx % f);
    const int64_t kg = i * 2 * f + c, ku = kg + f;
    if (sp.t) {
        gu[kg] = split_value(sp, gu, kg);
        gu[ku] = split_value(sp, gu, ku);
    }
    const float v = cm_geglu(gu[kg], gu[ku]);
    out[idx] = v;
    if (out_bf)
        store_bf(out_bf, idx, lo_off, v);
}

void launch_geglu(cudaStream_t s, float *gu, int32_t m, int32_t f, float *out, uint16_t *out_bf, int64_t lo_off,
                  split_sum ss)
{
    const int64_t total = (int64_t)m * f;
    if (total <= 0)
        return;
    RD_LAUNCH(k_geglu, dim3(blocks_for(total, 256)), dim3(256), 0, s, gu, m, f, out, out_bf, lo_off, ss);
}

// ------------------------------------------------------------------ gather

__global__ void k_gather(const float *x, const int32_t *rows, int32_t n, int32_t d, float *out)
{
    RD_PDL_ENTRY();
    const int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (int64_t)n * d)
        return;
    const int64_t i = idx / d;
    out[idx] = x[(int64_t)rows[i] * d + idx % d];
}

void launch_gather(cudaStream_t s, const float *x, const int32_t *rows, int32_t n, int32_t d, float *out)
{
    const int64_t total = (int64_t)n * d;
    if (total <= 0)
        return;
    RD_LAUNCH(k_gather, dim3(blocks_for(total, 256)), dim3(256), 0, s, x, rows, n, d, out);
}

// ------------------------------------------------------------------ KV cache

__global__ void k_kv_write(const float *k, const float *v, int32_t stride, int32_t m, int32_t hd, kv_out kv)
{
    RD_PDL_ENTRY();
    const int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (int64_t)m * kv.n_kv * hd)
        return;
    const int32_t d = (int32_t)(idx % hd);
    const int32_t h = (int32_t)((idx / hd) % kv.n_kv);
    const int64_t i = idx / ((int64_t)hd * kv.n_kv);
    const int32_t slot = kv.slots[i];
    if (slot < 0)
        return;
    const int64_t dst = kv_dst(kv, slot, h, d, hd);
    const int64_t src = i * stride + (int64_t)h * hd + d;
    kv.kc[dst] = cm_f32_to_bf16(k[src]);
    kv.vc[dst] = cm_f32_to_bf16(v[src]);
}

void launch_kv_write(cudaStream_t s, const float *k, const float *v, int32_t stride, const int32_t *slots,
                     int32_t m, int32_t n_kv, int32_t head_dim, int32_t block_size, uint16_t *k_cache,
                     uint16_t *v_cache)
{
    const int64_t total = (int64_t)m * n_kv * head_dim;
    if (total <= 0)
        return;
    RD_LAUNCH(k_kv_write, dim3(blocks_for(total, 256)), dim3(256), 0, s, k, v, stride, m, head_dim,
              kv_out{slots, n_kv, block_size, k_cache, v_cache});
}

// FP8 cache (kv_dtype fp8): a block of one layer is its codes
// [n_kv][block_size][head_dim] (E4M3), then its scale bytes [n_kv][block_size]:
// token t of head h is scaled by 2^(byte - 127), the least power of two that
// keeps its head_dim values within 448 (cm_fp8_block_exp), 0xff when one of
// them is NaN or infinite (the whole vector reads as NaN, as a bf16 cache's
// non-finite value poisons the scores). One warp per (row, kv head, K or V).
__global__ void k_kv_write_fp8(const float *k, const float *v, int32_t stride, int32_t m, int32_t n_kv, int32_t hd,
                               int32_t bs, const int32_t *slots, uint8_t *kc, uint8_t *vc)
{
    RD_PDL_ENTRY();
    const int64_t w = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) / 32;
    const int32_t lane = threadIdx.x % 32;
    if (w >= (int64_t)m * n_kv * 2)
        return; // the whole warp
    const int32_t which = (int32_t)(w % 2), h = (int32_t)(w / 2 % n_kv);
    const int64_t i = w / 2 / n_kv;
    const int32_t slot = slots[i];
    if (slot < 0)
        return; // the whole warp: padding
    const float *src = (which ? v : k) + i * stride + (int64_t)h * hd;
    uint32_t mx = 0;
    for (int32_t d = lane; d < hd; d += 32) {
        const uint32_t a = cm_f2u(src[d]) & 0x7fffffffu;
        mx = a > mx ? a : mx;
    }
    mx = warp_allreduce(mx, op_max());
    const int32_t blk = slot / bs, t = slot % bs;
    uint8_t *base = (which ? vc : kc) + (int64_t)blk * kv8_block_bytes(n_kv, bs, hd);
    uint8_t *codes = base + ((int64_t)h * bs + t) * hd;
    if (mx >= 0x7f800000u) {
        for (int32_t d = lane; d < hd; d += 32)
            codes[d] = 0;
        if (lane == 0)
            base[(int64_t)n_kv * bs * hd + (int64_t)h * bs + t] = 0xff;
        return;
    }
    const int e = cm_fp8_block_exp(mx);
    const float inv = cm_u2f((uint32_t)(127 - e) << 23); // 2^-e: exact scaling
    for (int32_t d = lane; d < hd; d += 32)
        codes[d] = cm_fp8_from_f32(RD_FMUL(src[d], inv));
    if (lane == 0)
        base[(int64_t)n_kv * bs * hd + (int64_t)h * bs + t] = (uint8_t)(e + 127);
}

void launch_kv_write_fp8(cudaStream_t s, const float *k, const float *v, int32_t stride, const int32_t *slots,
                         int32_t m, int32_t n_kv, int32_t head_dim, int32_t block_size, uint8_t *k_cache,
                         uint8_t *v_cache)
{
    const int64_t threads = (int64_t)m * n_kv * 2 * 32;
    if (threads <= 0)
        return;
    RD_LAUNCH(k_kv_write_fp8, dim3(blocks_for(threads, 256)), dim3(256), 0, s, k, v, stride, m, n_kv, head_dim,
              block_size, slots, k_cache, v_cache);
}

// Whole blocks of block_bytes, a byte per thread (block_bytes not a multiple of 16).
__global__ void k_copy_blocks_bytes(uint8_t *kc, uint8_t *vc, const int32_t *src, const int32_t *dst,
                                    int64_t block_bytes)
{
    RD_PDL_ENTRY();
    const int32_t i = blockIdx.y;
    const int64_t j = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= block_bytes)
        return;
    kc[(int64_t)dst[i] * block_bytes + j] = kc[(int64_t)src[i] * block_bytes + j];
    vc[(int64_t)dst[i] * block_bytes + j] = vc[(int64_t)src[i] * block_bytes + j];
}

void launch_copy_blocks_bytes(cudaStream_t s, void *k_cache, void *v_cache, const int32_t *src, const int32_t *dst,
                              int32_t n, int64_t block_bytes)
{
    if (n <= 0)
        return;
    if (block_bytes % 16 == 0) {
        launch_copy_blocks(s, (uint16_t *)k_cache, (uint16_t *)v_cache, src, dst, n, block_bytes / 2);
        return;
    }
    RD_LAUNCH(k_copy_blocks_bytes, dim3(blocks_for(block_bytes, 256), n), dim3(256), 0, s, (uint8_t *)k_cache,
              (uint8_t *)v_cache, src, dst, block_bytes);
}

// Copies 8 bf16 (one uint4) per thread; block_elems is a multiple of 8.
__global__ void k_copy_blocks(uint16_t *kc, uint16_t *vc, const int32_t *src, const int32_t *dst, int64_t vecs)
{
    RD_PDL_ENTRY();
    const int32_t i = blockIdx.y;
    const int64_t j = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= vecs)
        return;
    const int64_t from = (int64_t)src[i] * vecs + j, to = (int64_t)dst[i] * vecs + j;
    ((uint4 *)kc)[to] = ((const uint4 *)kc)[from];
    ((uint4 *)vc)[to] = ((const uint4 *)vc)[from];
}

void launch_copy_blocks(cudaStream_t s, uint16_t *k_cache, uint16_t *v_cache, const int32_t *src,
                        const int32_t *dst, int32_t n, int64_t block_elems)
{
    if (n <= 0)
        return;
    const int64_t vecs = block_elems / 8;
    RD_LAUNCH(k_copy_blocks, dim3(blocks_for(vecs, 256), n), dim3(256), 0, s, k_cache, v_cache, src, dst, vecs);
}

// ------------------------------------------------------------------ conversions

__global__ void k_to_bf16(const float *x, int64_t n, uint16_t *out, int64_t lo_off)
{
    RD_PDL_ENTRY();
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        store_bf(out, i, lo_off, x[i]);
}

__global__ void k_add_split(const float *t, int64_t n, float *y, int acc)
{
    RD_PDL_ENTRY();
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n)
        return;
    const float p = RD_FADD(t[i], t[n + i]);
    y[i] = acc ? RD_FADD(y[i], p) : p;
}

void launch_add_split(cudaStream_t s, const float *t, int64_t n, float *y, int acc)
{
    if (n > 0)
        RD_LAUNCH(k_add_split, dim3(blocks_for(n, 256)), dim3(256), 0, s, t, n, y, acc);
}

// x = hi + mid + lo exactly (bf16 has fp32's exponent range; each residual
// is exact in fp32 and holds at most the bits the next piece can).
__global__ void k_to_bf16x3(const float *x, int64_t n, uint16_t *out)
{
    RD_PDL_ENTRY();
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n)
        return;
    const float v = x[i];
    const uint16_t hi = cm_f32_to_bf16(v);
    const float r = RD_FSUB(v, cm_bf16_to_f32(hi));
    const uint16_t mid = cm_f32_to_bf16(r);
    out[i] = hi;
    out[n + i] = mid;
    out[2 * n + i] = cm_f32_to_bf16(RD_FSUB(r, cm_bf16_to_f32(mid)));
}

__global__ void k_add3(const float *t, int64_t n, float *y)
{
    RD_PDL_ENTRY();
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        y[i] = RD_FADD(RD_FADD(t[i], t[n + i]), t[2 * n + i]);
}

void launch_to_bf16x3(cudaStream_t s, const float *x, int64_t n, uint16_t *out)
{
    if (n > 0)
        RD_LAUNCH(k_to_bf16x3, dim3(blocks_for(n, 256)), dim3(256), 0, s, x, n, out);
}

void launch_add3(cudaStream_t s, const float *t, int64_t n, float *y)
{
    if (n > 0)
        RD_LAUNCH(k_add3, dim3(blocks_for(n, 256)), dim3(256), 0, s, t, n, y);
}

__global__ void k_from_bf16(const uint16_t *x, int64_t n, float *out)
{
    RD_PDL_ENTRY();
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        out[i] = cm_bf16_to_f32(x[i]);
}

void launch_to_bf16(cudaStream_t s, const float *x, int64_t n, uint16_t *out, int64_t lo_off)
{
    if (n > 0)
        RD_LAUNCH(k_to_bf16, dim3(blocks_for(n, 256)), dim3(256), 0, s, x, n, out, lo_off);
}

void launch_from_bf16(cudaStream_t s, const uint16_t *x, int64_t n, float *out)
{
    if (n > 0)
        RD_LAUNCH(k_from_bf16, dim3(blocks_for(n, 256)), dim3(256), 0, s, x, n, out);
}

// ------------------------------------------------------------------ fallback GEMM
//
// y[r][o] = sum_k x[r][k] W[o][k]. A warp owns GEMM_GO output features and a
// CTA GEMM_RT rows. Lane l accumulates the 8-element chunks l, l+32, l+64, ...
// (8 fmaf each, in order), then the scalar tail k = 8*chunks + l, + 32, ...;
// the 32 lane sums meet in the warp butterfly. That order depends only on
// `in`, so a row's result is the same whatever m or the row's place in it.

#define GEMM_RT 4
#define GEMM_GO 2
#define GEMM_WARPS 4

// The end of both GEMM kernels: each lane's sums meet in the warp butterfly;
// lane 0 writes (or adds, the product rounded first) the rows and outputs
// that exist.
RD_DEV void gemm_store(float (&a)[GEMM_RT][GEMM_GO], int32_t lane, int32_t r0, int32_t o0, int32_t m, int32_t out,
                       float *y, int acc)
{
RD_UNROLL
    for (int r = 0; r < GEMM_RT; r++)
RD_UNROLL
        for (int g = 0; g < GEMM_GO; g++) {
            const float v = warp_allreduce(a[r][g], op_add());
            if (lane == 0 && r0 + r < m && o0 + g < out) {
                float *dst = y + (int64_t)(r0 + r) * out + o0 + g;
                *dst = acc ? RD_FADD(*dst, v) : v;
            }
        }
}

template <typename XT, bool VEC>
__global__ void __launch_bounds__(32 * GEMM_WARPS)
    k_gemm_simple(const uint16_t *w, const XT *x, int32_t m, int32_t out, int32_t in, float *y, int acc)
{
    RD_PDL_ENTRY();
    const int32_t warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int32_t o0 = (blockIdx.x * GEMM_WARPS + warp) * GEMM_GO;
    const int32_t r0 = blockIdx.y * GEMM_RT;
    if (o0 >= out)
        return; // the whole warp: no shuffles below for it
    float a[GEMM_RT][GEMM_GO] = {};
    const int32_t chunks = VEC ? in / 8 : 0;
    for (int32_t c = lane; c < chunks; c += 32) {
        float wv[GEMM_GO][8];
RD_UNROLL
        for (int g = 0; g < GEMM_GO; g++) {
            if (o0 + g < out)
                load_bf16x8(w + (int64_t)(o0 + g) * in + (int64_t)c * 8, wv[g]);
            else
                for (int e = 0; e < 8; e++)
                    wv[g][e] = 0.0f;
        }
RD_UNROLL
        for (int r = 0; r < GEMM_RT; r++) {
            if (r0 + r >= m)
                break;
            float xv[8];
            load_x8(x + (int64_t)(r0 + r) * in + (int64_t)c * 8, xv);
RD_UNROLL
            for (int g = 0; g < GEMM_GO; g++)
RD_UNROLL
                for (int e = 0; e < 8; e++)
                    a[r][g] = fmaf(xv[e], wv[g][e], a[r][g]);
        }
    }
    for (int32_t k = chunks * 8 + lane; k < in; k += 32) {
        float wk[GEMM_GO];
RD_UNROLL
        for (int g = 0; g < GEMM_GO; g++)
            wk[g] = o0 + g < out ? cm_bf16_to_f32(w[(int64_t)(o0 + g) * in + k]) : 0.0f;
RD_UNROLL
        for (int r = 0; r < GEMM_RT; r++) {
            if (r0 + r >= m)
                break;
            const float xk = load_x1(x + (int64_t)(r0 + r) * in + k);
RD_UNROLL
            for (int g = 0; g < GEMM_GO; g++)
                a[r][g] = fmaf(xk, wk[g], a[r][g]);
        }
    }
    gemm_store(a, lane, r0, o0, m, out, y, acc);
}

template <typename XT>
static void gemm_simple(cudaStream_t s, const uint16_t *w, const XT *x, int32_t m, int32_t out, int32_t in, float *y,
                        int acc)
{
    if (m <= 0 || out <= 0)
        return;
    const dim3 grid(blocks_for(out, GEMM_WARPS * GEMM_GO), blocks_for(m, GEMM_RT));
    const bool vec = in % 8 == 0 && (uintptr_t)w % 16 == 0 && (uintptr_t)x % 16 == 0;
    if (vec) {
        auto kern = k_gemm_simple<XT, true>;
        RD_LAUNCH(kern, grid, dim3(32 * GEMM_WARPS), 0, s, w, x, m, out, in, y, acc);
    } else {
        auto kern = k_gemm_simple<XT, false>;
        RD_LAUNCH(kern, grid, dim3(32 * GEMM_WARPS), 0, s, w, x, m, out, in, y, acc);
    }
}

void launch_gemm_simple(cudaStream_t s, const uint16_t *w, const uint16_t *x, int32_t m, int32_t out, int32_t in,
                        float *y, int acc)
{
    gemm_simple(s, w, x, m, out, in, y, acc);
}

void launch_gemm_simple(cudaStream_t s, const uint16_t *w, const float *x, int32_t m, int32_t out, int32_t in,
                        float *y, int acc)
{
    gemm_simple(s, w, x, m, out, in, y, acc);
}

// ------------------------------------------------------------------ FP8 GEMM
//
// y[r][o] = sum_k x[r][k] W[o][k] for FP8 weights (serve_dtype fp8,
// engine/model/quant_fp8.h): codes q [out][in] (E4M3) and scale bytes
// sc [out][in / 32] (block b of row o is scaled by 2^(sc - 127), e <= 7).
// W[o][k] is rebuilt exactly, as the code's bits placed in fp32's fields
// (2^-120 times the code's value, subnormals included) times 2^(120 + e),
// a normal float: one multiply. fp32 x, fp32 fmaf sums. The layout of
// k_gemm_simple: a warp owns GEMM_GO outputs and a CTA GEMM_RT rows; lane l
// takes the 16-element chunks l, l + 32, ... (16 fmaf each, in order), then
// the warp butterfly. That order depends only on `in`, so a row's result is
// the same whatever m (batch invariance); x's alignment only picks its loads.

template <bool XVEC>
__global__ void __launch_bounds__(32 * GEMM_WARPS)
    k_gemm_fp8(const uint8_t *q, const uint8_t *sc, const float *x, int32_t m, int32_t out, int32_t in, float *y,
               int acc)
{
    RD_PDL_ENTRY();
    const int32_t warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int32_t o0 = (blockIdx.x * GEMM_WARPS + warp) * GEMM_GO;
    const int32_t r0 = blockIdx.y * GEMM_RT;
    if (o0 >= out)
        return; // the whole warp
    float a[GEMM_RT][GEMM_GO] = {};
    const int32_t chunks = in / 16, nb = in / 32;
    for (int32_t c = lane; c < chunks; c += 32) {
        float wv[GEMM_GO][16];
RD_UNROLL
        for (int g = 0; g < GEMM_GO; g++) {
            if (o0 + g < out) {
                const uint4 u = *(const uint4 *)(q + (int64_t)(o0 + g) * in + (int64_t)c * 16);
                const float s = cm_fp8_scale(sc[(int64_t)(o0 + g) * nb + c / 2]);
                fp8_decode4(u.x, s, wv[g]);
                fp8_decode4(u.y, s, wv[g] + 4);
                fp8_decode4(u.z, s, wv[g] + 8);
                fp8_decode4(u.w, s, wv[g] + 12);
            } else {
                for (int e = 0; e < 16; e++)
                    wv[g][e] = 0.0f;
            }
        }
RD_UNROLL
        for (int r = 0; r < GEMM_RT; r++) {
            if (r0 + r >= m)
                break;
            const float *xr = x + (int64_t)(r0 + r) * in + (int64_t)c * 16;
            float xv[16];
            if (XVEC) {
                load_f32x8(xr, xv);
                load_f32x8(xr + 8, xv + 8);
            } else {
                for (int e = 0; e < 16; e++)
                    xv[e] = xr[e];
            }
RD_UNROLL
            for (int g = 0; g < GEMM_GO; g++)
RD_UNROLL
                for (int e = 0; e < 16; e++)
                    a[r][g] = fmaf(xv[e], wv[g][e], a[r][g]);
        }
    }
    gemm_store(a, lane, r0, o0, m, out, y, acc);
}

void launch_gemm_fp8(cudaStream_t s, const uint8_t *q, const uint8_t *sc, const float *x, int32_t m, int32_t out,
                     int32_t in, float *y, int acc)
{
    if (m <= 0 || out <= 0)
        return;
    const dim3 grid(blocks_for(out, GEMM_WARPS * GEMM_GO), blocks_for(m, GEMM_RT));
    if ((uintptr_t)x % 16 == 0) {
        auto kern = k_gemm_fp8<true>;
        RD_LAUNCH(kern, grid, dim3(32 * GEMM_WARPS), 0, s, q, sc, x, m, out, in, y, acc);
    } else {
        auto kern = k_gemm_fp8<false>;
        RD_LAUNCH(kern, grid, dim3(32 * GEMM_WARPS), 0, s, q, sc, x, m, out, in, y, acc);
    }
}

// ------------------------------------------------------------------ self-test helpers

RD_DEV float hash_unit(uint64_t i, uint32_t seed)
{
    uint64_t z = i * 0x9E3779B97F4A7C15ull + seed;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return (float)((double)(z >> 40) * (1.0 / 8388608.0) - 1.0); // [-1, 1)
}

__global__ void k_fill_bf16(uint16_t *p, int64_t n, uint32_t seed)
{
    RD_PDL_ENTRY();
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        p[i] = cm_f32_to_bf16(hash_unit((uint64_t)i, seed));
}

__global__ void k_fill_f32(float *p, int64_t n, uint32_t seed)
{
    RD_PDL_ENTRY();
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        p[i] = hash_unit((uint64_t)i, seed);
}

void launch_fill_random(cudaStream_t s, uint16_t *p, int64_t n, uint32_t seed)
{
    if (n > 0)
        RD_LAUNCH(k_fill_bf16, dim3(blocks_for(n, 256)), dim3(256), 0, s, p, n, seed);
}

void launch_fill_random(cudaStream_t s, float *p, int64_t n, uint32_t seed)
{
    if (n > 0)
        RD_LAUNCH(k_fill_f32, dim3(blocks_for(n, 256)), dim3(256), 0, s, p, n, seed);
}

__global__ void k_count_mismatch(const float *a, int64_t lda, const float *b, int64_t ldb, int32_t n,
                                 unsigned *count)
{
    RD_PDL_ENTRY();
    const int64_t r = blockIdx.x;
    int bad = 0;
    for (int32_t j = threadIdx.x; j < n; j += blockDim.x)
        bad |= cm_f2u(a[r * lda + j]) != cm_f2u(b[r * ldb + j]);
    bad = block_allreduce(bad, op_max());
    if (threadIdx.x == 0 && bad)
        atomicAdd(count, 1u);
}

void launch_count_mismatch(cudaStream_t s, const float *a, int64_t lda, const float *b, int64_t ldb, int32_t m,
                           int32_t n, unsigned *count)
{
    if (m > 0)
        RD_LAUNCH(k_count_mismatch, dim3(m), dim3(256), 0, s, a, lda, b, ldb, n, count);
}

}  // namespace RD_NS
