// cuda_internal.h - launchers shared by the backend's .cu files. Each launcher
// enqueues its kernel(s) on stream s and returns at once; shapes and layouts
// are those of rd_backend_ops (engine/backend.h), activations fp32 row-major,
// weights and the KV cache bf16 (uint16_t). A NULL out_bf means "no bf16 copy";
// lo_off > 0 asks for the hi/lo pair (store_bf in cuda_common.cuh).
#ifndef RD_CUDA_INTERNAL_H
#define RD_CUDA_INTERNAL_H

#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/cuda_plan.h"

namespace RD_NS {

// ---- elementwise and row kernels (cuda_kernels.cu) ----
// A split GEMM's output not yet summed (the backend defers the sum into the
// next kernel that reads it): element k of its destination is
// t[k] + t[n + k], added to the destination's value when acc. t NULL: none.
struct split_sum {
    const float *t;
    int64_t n;
    int acc;
};
// Element k of a split GEMM's destination y: the halves' sum, added to y[k]
// when acc, in the order k_add_split uses, so a fused consumer sees the bits
// the separate kernel would have written.
RD_DEV float split_value(const split_sum &ss, const float *y, int64_t k)
{
    const float p = RD_FADD(ss.t[k], ss.t[ss.n + k]);
    return ss.acc ? RD_FADD(y[k], p) : p;
}
// out[i] = W[ids[i]] x scale (zeros for an id outside [0, vocab): a padding row).
// out[i] = row ids[i] of a Q8_0 table (codes q [vocab][dim], fp16 scales d [vocab][dim / 32]) as
// ggml_dequant_row's floats, x scale; an id outside [0, vocab) gives zeros, as launch_embed.
// scale 1: the rows as they are.
void launch_embed_q8(cudaStream_t s, const int8_t *q, const uint16_t *d, int32_t vocab, int32_t dim,
                     const int32_t *ids, int32_t m, float scale, float *out);
void launch_embed(cudaStream_t s, const uint16_t *w, int32_t vocab, int32_t dim, const int32_t *ids, int32_t m,
                  float scale, float *out);
// RMSNorm's arithmetic, shared by k_rmsnorm and the tensor-core GEMM's
// fused prologue so that both give the same bits: RMS_THREADS threads, thread
// j summing the squares of elements j, j + RMS_THREADS, ... in double with
// rms_acc; each warp's xor butterfly; the warps' sums left to right; rms_inv;
// then rms_apply per element.
#define RMS_THREADS 256
RD_DEV double rms_acc(double ss, float v) { return ss + (double)v * (double)v; }
RD_DEV float rms_inv(double ss, int32_t d, float eps) { return (float)(1.0 / sqrt(ss / (double)d + (double)eps)); }
// w + 0 is not computed: the weight goes in as it is (the sign of a zero kept)
RD_DEV float rms_apply(float x, float inv, float w, float w_off)
{
    return RD_FMUL(RD_FMUL(x, inv), w_off == 0.0f ? w : RD_FADD(w, w_off));
}
// The RMSNorm factor of a row xr[d] (one whole warp calls it): k_rmsnorm's
// sum of squares with lane l standing for virtual thread 32 v + l of each
// virtual warp v. CG: xr read through L2 (other CTAs of the kernel wrote it).
template <bool CG = false> RD_DEV float rms_row_inv(const float *xr, int32_t d, float eps, int lane)
{
    double v[RMS_THREADS / 32];
RD_UNROLL
    for (int w = 0; w < RMS_THREADS / 32; w++) {
        v[w] = 0.0;
        for (int32_t j = 32 * w + lane; j < d; j += RMS_THREADS)
            v[w] = rms_acc(v[w], CG ? __ldcg(xr + j) : xr[j]);
        v[w] = warp_allreduce(v[w], op_add());
    }
    double ss = v[0];
RD_UNROLL
    for (int w = 1; w < RMS_THREADS / 32; w++)
        ss = ss + v[w];
    return rms_inv(ss, d, eps);
}

// RMSNorm per row, the sum of squares in double, as the CPU backend. With
// ss.t, x is first completed from the split sum (and written back).
// add_to (NULL: none): then add_to += out, one fp32 add (rmsnorm_add: Gemma 3's
// residual add after a post-norm, in the same kernel). v0 (RD_CUDA_NORM_V0=1): the
// kernel's loop form at every width (same bits).
void launch_rmsnorm(cudaStream_t s, float *x, const float *w, int32_t m, int32_t d, float eps, float w_off, float *out,
                    uint16_t *out_bf, int64_t lo_off, split_sum ss, float *add_to, bool v0);
// y[i][j] += b[j] for j < n on the rows at y + i * stride (a linear's bias).
// With ss.t, every element of the rows [m][stride] is first completed from
// the split sum (and written back), the bias then added to it.
void launch_add_bias(cudaStream_t s, float *y, int32_t stride, int32_t m, int32_t n, const float *b, split_sum ss);
// RMSNorm in place of each of the n_heads heads of head_dim floats at
// x + row * stride + h * head_dim, heads h < n_first with the weight
// w[head_dim], the others with w2; the arithmetic of launch_rmsnorm. With
// ss.t, every element of the rows [m][stride] is first completed from the
// split sum, heads or not.
void launch_head_rmsnorm(cudaStream_t s, float *x, int32_t stride, int32_t m, int32_t n_heads, int32_t head_dim,
                         const float *w, int32_t n_first, const float *w2, float eps, float w_off, split_sum ss);
// The KV cache a RoPE launch also writes (kc NULL: none): the last n_kv of
// the rotated heads are K, the n_kv * head_dim columns after them V; row i
// goes to slots[i] (skipped when < 0), as launch_kv_write writes them.
struct kv_out {
    const int32_t *slots;
    int32_t n_kv, block_size;
    uint16_t *kc, *vc;
};
// Element d of KV head h at a slot, in the cache layout
// [n_blocks][n_kv][block_size][head_dim] (k_kv_write, k_rope, the tensor-core GEMM's RoPE epilogue).
RD_DEV int64_t kv_dst(const kv_out &kv, int32_t slot, int32_t h, int32_t d, int32_t hd)
{
    const int64_t block = slot / kv.block_size, off = slot % kv.block_size;
    return ((block * kv.n_kv + h) * kv.block_size + off) * hd + d;
}

// One warp's per-head RMSNorm, RoPE and K-cache write for one head of one row:
// k_hnorm_rope's arithmetic, shared with the tensor-core GEMM's epilogue so
// both give the same bits. nv[i] holds the head's element 32 i + lane as the
// caller loaded it; v is where the rotated head goes; cs the row's cos/sin
// pairs; kh the head's index among the K heads (< 0: a Q head); slot < 0 or
// kv.kc NULL: no cache write. head_dim a multiple of 64 (a rotated pair
// (j, j + half) then sits in one lane), at most CUPLAN_ATTN_MAX_HD, or 32 (the
// pair in lanes j and j + 16, which swap values): hnorm_rope_fits. The whole
// warp calls it (shuffles).
static inline bool hnorm_rope_fits(int32_t hd) { return hd == 32 || (hd % 64 == 0 && hd <= CUPLAN_ATTN_MAX_HD); }
RD_DEV void hnorm_rope_head(float (&nv)[CUPLAN_ATTN_MAX_HD / 32], float *v, int32_t hd, int lane, const float *w,
                            float eps, float w_off, const float *cs, const kv_out &kv, int32_t slot, int32_t kh)
{
    double ss = 0.0;
    for (int32_t i = 0; 32 * i + lane < hd; i++)
        ss = rms_acc(ss, nv[i]);
    ss = warp_allreduce(ss, op_add());
    const float inv = rms_inv(ss, hd, eps);
    for (int32_t i = 0; 32 * i + lane < hd; i++)
        nv[i] = rms_apply(nv[i], inv, w[32 * i + lane], w_off);
    if (hd == 32) {
        const float other = __shfl_xor_sync(0xffffffffu, nv[0], 16);
        const int32_t j = lane % 16;
        const float c = cs[2 * j], sn = cs[2 * j + 1], a = lane < 16 ? nv[0] : other, b = lane < 16 ? other : nv[0];
        const float r = lane < 16 ? RD_FSUB(RD_FMUL(a, c), RD_FMUL(b, sn)) : RD_FADD(RD_FMUL(b, c), RD_FMUL(a, sn));
        v[lane] = r;
        if (kv.kc && kh >= 0 && slot >= 0)
            kv.kc[kv_dst(kv, slot, kh, lane, hd)] = cm_f32_to_bf16(r);
        return;
    }
    const int32_t half = hd / 2, hp = half / 32;
    for (int32_t i = 0; i < hp; i++) {
        const int32_t j = 32 * i + lane;
        const float c = cs[2 * j], sn = cs[2 * j + 1], a = nv[i], b = nv[i + hp];
        const float ra = RD_FSUB(RD_FMUL(a, c), RD_FMUL(b, sn));
        const float rb = RD_FADD(RD_FMUL(b, c), RD_FMUL(a, sn));
        v[j] = ra;
        v[j + half] = rb;
        if (kv.kc && kh >= 0 && slot >= 0) {
            kv.kc[kv_dst(kv, slot, kh, j, hd)] = cm_f32_to_bf16(ra);
            kv.kc[kv_dst(kv, slot, kh, j + half, hd)] = cm_f32_to_bf16(rb);
        }
    }
}

// Rotates the first n_heads heads of each row in place. With ss.t, every
// element of the rows [m][stride] is first completed from the split sum.
void launch_rope(cudaStream_t s, float *x, int32_t stride, int32_t m, int32_t n_heads, int32_t head_dim,
                 const int32_t *positions, const float *cos_sin, split_sum ss, kv_out kv);
// launch_head_rmsnorm then launch_rope on the same heads (and the KV write),
// in one kernel with their bits; head_dim as hnorm_rope_fits.
void launch_hnorm_rope(cudaStream_t s, float *x, int32_t stride, int32_t m, int32_t n_heads, int32_t head_dim,
                       const float *w, int32_t n_first, const float *w2, float eps, float w_off, split_sum ss,
                       const int32_t *positions, const float *cos_sin, kv_out kv);
// With ss.t, gu is first completed from the split sum (and written back).
void launch_swiglu(cudaStream_t s, float *gu, int32_t m, int32_t f, float *out, uint16_t *out_bf, int64_t lo_off,
                   split_sum ss);
// out = gelu_tanh(gu[:, :f]) * gu[:, f:] (cm_geglu); otherwise as launch_swiglu.
void launch_geglu(cudaStream_t s, float *gu, int32_t m, int32_t f, float *out, uint16_t *out_bf, int64_t lo_off,
                  split_sum ss);
void launch_gather(cudaStream_t s, const float *x, const int32_t *rows, int32_t n, int32_t d, float *out);
// Rows with slot < 0 (padding) are skipped.
void launch_kv_write(cudaStream_t s, const float *k, const float *v, int32_t stride, const int32_t *slots,
                     int32_t m, int32_t n_kv, int32_t head_dim, int32_t block_size, uint16_t *k_cache,
                     uint16_t *v_cache);
void launch_copy_blocks(cudaStream_t s, uint16_t *k_cache, uint16_t *v_cache, const int32_t *src,
                        const int32_t *dst, int32_t n, int64_t block_elems);
// Bytes of one block of an FP8 cache: codes and a scale byte per (kv head, token).
RD_DEV int64_t kv8_block_bytes(int32_t n_kv, int32_t bs, int32_t hd) { return (int64_t)n_kv * bs * (hd + 1); }
// The FP8 cache (kv_dtype fp8; layout in cuda_kernels.cu): row i's K and V
// heads quantized with a power-of-two scale each, written at slots[i]
// (skipped when < 0).
void launch_kv_write_fp8(cudaStream_t s, const float *k, const float *v, int32_t stride, const int32_t *slots,
                         int32_t m, int32_t n_kv, int32_t head_dim, int32_t block_size, uint8_t *k_cache,
                         uint8_t *v_cache);
// Copies whole blocks of block_bytes (any size) src[i] -> dst[i] in both caches.
void launch_copy_blocks_bytes(cudaStream_t s, void *k_cache, void *v_cache, const int32_t *src, const int32_t *dst,
                              int32_t n, int64_t block_bytes);
void launch_to_bf16(cudaStream_t s, const float *x, int64_t n, uint16_t *out, int64_t lo_off);
// y[i] = t[i] + t[n + i] (+ y[i] first summed when acc): the split GEMM's halves.
void launch_add_split(cudaStream_t s, const float *t, int64_t n, float *y, int acc);
void launch_from_bf16(cudaStream_t s, const uint16_t *x, int64_t n, float *out);
// out[0..n) = hi, out[n..2n) = mid, out[2n..3n) = lo, with hi + mid + lo = x[i]
// exactly: an fp32 GEMM input as three bf16 rows (the LM head).
void launch_to_bf16x3(cudaStream_t s, const float *x, int64_t n, uint16_t *out);
// y[i] = (t[i] + t[n + i]) + t[2n + i]: the three pieces' products.
void launch_add3(cudaStream_t s, const float *t, int64_t n, float *y);
// y[m][out] = x[m][in] . W^T (+ y when acc), fp32 accumulation in a fixed
// order per output element (independent of m): the fallback GEMM and the
// emulator's. x is bf16 or fp32.
void launch_gemm_simple(cudaStream_t s, const uint16_t *w, const uint16_t *x, int32_t m, int32_t out, int32_t in,
                        float *y, int acc);
void launch_gemm_simple(cudaStream_t s, const uint16_t *w, const float *x, int32_t m, int32_t out, int32_t in,
                        float *y, int acc);
// The same for FP8 weights (RD_TYPE_FP8_B32, engine/model/quant_fp8.h) held as
// codes q [out][in] and scale bytes sc [out][in / 32], with fp32 x; in a
// multiple of 32, q 16-byte aligned. See cuda_kernels.cu for the order.
void launch_gemm_fp8(cudaStream_t s, const uint8_t *q, const uint8_t *sc, const float *x, int32_t m, int32_t out,
                     int32_t in, float *y, int acc);

// ---- the MoE router's softmax top-k, one row per warp ----
// moe_route's arithmetic (engine/backend.h) on one row, shared by
// k_moe_route and the tensor-core router GEMM's epilogue: p[E] (shared
// memory) holds the row's logits, element e written by lane e % 32, which is
// the only lane that reads or marks it until the lane-0 sum; sw[k] is shared
// scratch. Writes the row's k ids and weights. The whole warp calls it.
RD_DEV void moe_route_warp(float *p, float *sw, int32_t E, int32_t k, int norm, int lane, int32_t *ids, float *weights)
{
    float mx = -INFINITY;
    for (int32_t e = lane; e < E; e += 32)
        mx = p[e] > mx ? p[e] : mx;
    // The max is the same whatever the order (a -0 / +0 choice changes no
    // difference l - mx), so the butterfly gives the CPU's.
    mx = warp_allreduce(mx, op_max());
    for (int32_t e = lane; e < E; e += 32)
        p[e] = expf(RD_FSUB(p[e], mx));
    __syncwarp();
    float sum = 0.0f;
    if (lane == 0)
        for (int32_t e = 0; e < E; e++)
            sum = RD_FADD(sum, p[e]);
    sum = __shfl_sync(0xffffffffu, sum, 0);
    for (int32_t e = lane; e < E; e += 32)
        p[e] = RD_FDIV(p[e], sum);
    // Each lane now reads and marks only its own experts (e % 32 == lane).
    float wsum = 0.0f;
    for (int32_t j = 0; j < k; j++) {
        // The lane's best: ascending e, strictly greater wins, so a tie keeps
        // the lower id; a taken expert holds -1 (every p is >= 0).
        float bp = -1.0f;
        int32_t be = -1;
        for (int32_t e = lane; e < E; e += 32)
            if (p[e] >= 0.0f && (be < 0 || p[e] > bp))
                bp = p[e], be = e;
        // Larger p, then lower id: a total order, so every lane ends with the
        // maximum, the expert the CPU's ascending scan picks.
        for (int o = 16; o > 0; o >>= 1) {
            const float op = __shfl_xor_sync(0xffffffffu, bp, o);
            const int32_t oe = __shfl_xor_sync(0xffffffffu, be, o);
            if (oe >= 0 && (be < 0 || op > bp || (op == bp && oe < be)))
                bp = op, be = oe;
        }
        if (be < 0)
            bp = NAN; // no expert left with a number (NaN logits): the row is poisoned, not routed
        else if (be % 32 == lane)
            p[be] = -1.0f;
        if (lane == 0) {
            ids[j] = be;
            sw[j] = bp;
        }
        wsum = RD_FADD(wsum, bp);
    }
    if (lane == 0)
        for (int32_t j = 0; j < k; j++)
            weights[j] = norm ? RD_FDIV(sw[j], wsum) : sw[j];
}

// ---- LoRA's pairs (cuda_lora.cu; the tensor-core GEMM's epilogue adds their terms too) ----
enum { LORA_DT_F32 = 0, LORA_DT_F16 = 1, LORA_DT_BF16 = 2 };
// One slot of a lora_apply table (device memory): the adapter's pair for
// this module, or a and b NULL (no adapter: its rows are left alone).
struct lora_dev {
    const void *a;              // A [rank][in], a_dt
    const void *b;              // B [out][rank], b_dt
    float scale;
    int32_t rank;
    int32_t a_dt, b_dt;         // LORA_DT_*
};

template <int DT> RD_DEV float lora_wload(const void *p, int64_t i)
{
    if constexpr (DT == LORA_DT_F32)
        return ((const float *)p)[i];
    else if constexpr (DT == LORA_DT_F16)
        return cm_f16_to_f32(((const uint16_t *)p)[i]);
    else
        return cm_bf16_to_f32(((const uint16_t *)p)[i]);
}

// The expand's term of output j for a row whose A x is t[0..rank): u = B[j] . t with fmaf in k order (backend.h's
// order), then s x u rounded, what lora_apply adds to y[j].
RD_DEV float lora_term(const lora_dev &d, int32_t j, const float *t)
{
    const int64_t b0 = (int64_t)j * d.rank;
    float u = 0.0f;
    if (d.b_dt == LORA_DT_F32)
        for (int32_t k = 0; k < d.rank; k++)
            u = fmaf(lora_wload<LORA_DT_F32>(d.b, b0 + k), t[k], u);
    else if (d.b_dt == LORA_DT_F16)
        for (int32_t k = 0; k < d.rank; k++)
            u = fmaf(lora_wload<LORA_DT_F16>(d.b, b0 + k), t[k], u);
    else
        for (int32_t k = 0; k < d.rank; k++)
            u = fmaf(lora_wload<LORA_DT_BF16>(d.b, b0 + k), t[k], u);
    return RD_FMUL(d.scale, u);
}

// A lora_apply whose expand the pending tensor-core GEMM's epilogue runs (tc_args.lora): its shrink has run
// (t = A x per row), and output column c in [off, off + out) of a row gets y + lora_term.
struct tc_lora {
    const lora_dev *table;      // [n_slots]
    int32_t n_slots, max_rank;
    const float *t;             // [m][max_rank]
    int32_t off, out;           // the columns of the GEMM's output the term lands on
};
#define TC_LORA_MAX 3           // targets one GEMM takes: q, k and v of a q|k|v weight

// ---- the tensor-core GEMM (cuda_gemm_tc.cu) ----
// y[m][out] (= or +=) x[m][in] W^T on tensor cores, in the plan's fixed
// order (cuplan_gemm_tc): fp32 x split into bf16 hi and (split) lo in
// registers; W bf16 (w), FP8 codes and block scales (f8, f8s), or Q8_0
// codes and block scales (q8, q8d); the other pointers NULL.
struct tc_args {
    const uint16_t *w;          // [out][in] bf16, or NULL
    const uint8_t *f8, *f8s;    // FP8 codes [out][in] and scale bytes [out][in / 32]
    const int8_t *q8;           // Q8_0 codes [out][in] (RD_CUDA_Q8=tc)
    const uint16_t *q8d;        // and their blocks' fp16 scales d [out][in / 32]: weight = code x d
    const float *x;             // [m][in]; with xrow, row r is x[xrow[r]] (the MoE experts' routes)
    const int32_t *xrow;        // NULL: row r is x[r]
    const float *nw;            // RMSNorm weight [in] applied to x first (NULL: x as it is), with eps and w_off
    float eps, w_off;
    float *xn;                  // with nw: where the normalized x goes too (the RMSNorm op's output)
    float *y;                   // [m][out]
    float *part;                // [q][m][out] sub-piece sums, when the plan's p > 1
    unsigned *count;            // gemm_tc_counters(m, out) arrival counters, zero before and after a launch (p > 1)
    int32_t m, out, in;
    int acc;                    // 1: y += the product (rounded first)
    const float *bias;          // [out] added to each finished output, as k_add_bias (acc 0; not with a gated epi); NULL: none
    struct {                    // TC_ROPE: RoPE (and the KV write) on the finished q|k|v rows
        int32_t heads, head_dim; // the first heads heads are rotated (k_rope's arithmetic); 0: none
        const int32_t *positions;
        const float *cos_sin;
        kv_out kv;              // kv.kc NULL: no cache write; else K heads (the last kv.n_kv rotated) and V after them
        // the per-head RMSNorm of the rotated heads before the rotation (nw NULL: none; head_dim as
        // hnorm_rope_fits): heads < n_first with nw, the others with nw2, k_hnorm_rope's arithmetic, by the CTA
        // that finishes a head's last column tile last (an arrival counter per row tile and head in fin_count)
        const float *nw, *nw2;
        int32_t n_first;
        float eps, w_off;
    } rope;
    struct {                    // TC_ROUTE, a router's logits [m][out = n_experts]: moe_route's top-k after it, by
                                // the CTA that finishes a row tile's last column tile (an arrival counter per row tile)
        int32_t *ids;           // [m][k]; NULL: no routing
        float *weights;         // [m][k]
        int32_t k;
        int norm;
    } route;
    struct {                    // TC_NORMADD, a projection's rows [m][out] (Gemma 3's o and down): rmsnorm_add on
                                // them, by the CTA that finishes a row tile's last column tile (a counter per row tile)
        const float *w;         // [out] the norm's weight, with eps and w_off (k_rmsnorm's arithmetic)
        float eps, w_off;
        float *out;             // [m][out] the norm's output; NULL: no finishing step
        float *y;               // [m][out] the residual stream: y += out
    } nadd;
    struct {                    // LoRA terms on the finished outputs, in call order, after the bias and before any
                                // other epilogue (the runner's order); n 0: none (never the tile kernel)
        int32_t n;
        tc_lora tg[TC_LORA_MAX];
        const int32_t *slots;   // [m] each row's slot; outside [0, n_slots): none
    } lora;
    unsigned *fin_count;        // set by launch_gemm_tc: the finishing steps' counters after the tile counters:
                                // [row tiles][heads] (rope.nw) or [row tiles] (route.ids, nadd.out)
    int32_t big_rows;           // from this many rows on (and without nw), the tile kernel (0: never)
    int32_t big_tile;           // its tile side: 64 or 128 (RD_CUDA_TC_TILE)
    int stages;                 // bf16 and FP8 weights: the tile kernel's cp.async stages, 2, 3, 4 or 6
                                // (RD_CUDA_TC_PIPE); 0: k_gemm_tc_big (registers, one chunk ahead)
    int wg;                     // 1, 2, 4: from big_rows rows on, the wgmma tile kernel where it fits, with that
                                // many warpgroups a CTA (RD_CUDA_TC_WG on a compute capability 9.0 device;
                                // tc_wg_fits); 0: the mma.sync tile kernels
    int wmajor;                 // the tile kernels' grid: 0, batch tiles fastest (blockIdx.x), so the CTAs that run
                                // together share weight tiles; 1 (RD_CUDA_TC_ORDER=weight), weight tiles fastest
    int prefetch;               // 1 (PDL on): the small kernel asks its weights into L2 before waiting on the kernel before
    int32_t kp, q, p;           // set by launch_gemm_tc from the plan
    int xvec;                   // set by launch_gemm_tc: x 16-byte aligned
};
// Floats of part and counters a launch of a (m, out, big_rows, nw set) needs (0: none).
int64_t gemm_tc_part_floats(const cuplan_tc &pl, const tc_args &a);
int64_t gemm_tc_counters(const cuplan_tc &pl, const tc_args &a);
// epi: TC_PLAIN; or, for a gate|up weight [2F][in] with acc 0, TC_SWIGLU /
// TC_GEGLU: y is then the gated FFN's output [m][F] (k_swiglu's / k_geglu's
// expression), gate|up itself never stored.
// TC_ROPE: q|k|v rows [m][out] with a.rope set: the first heads rotated as
// k_rope rotates them (normalized first as k_head_rmsnorm does when
// a.rope.nw), the K and V heads written to the cache as k_kv_write does (acc
// 0; never the tile kernel).
// TC_ROUTE: a router's logits [m][out = n_experts] with a.route set, then
// moe_route's top-k on them (pieces 1 or 2; never the tile kernel).
// TC_NORMADD: rows [m][out] with a.nadd set, then rmsnorm_add on them (out =
// the norm as k_rmsnorm gives it, y += out; acc 0, pieces 1 or 2, never the
// tile kernel).
enum { TC_PLAIN = 0, TC_SWIGLU = 1, TC_GEGLU = 2, TC_ROPE = 3, TC_ROUTE = 4, TC_NORMADD = 5 };
// pieces: x as bf16 hi (1), hi + lo (2: the split), or hi + mid + lo (3, x
// exactly: the LM head; epi TC_PLAIN, bf16 or Q8_0 weights); or TC_Q8 (FP8
// weights only: x quantized to E4M3 blocks of 32, FP8 tensor cores; W8A8,
// RD_CUDA_FP8=w8a8).
#define TC_Q8 0
// TC_I8: Q8_0 weights only: x quantized to Q8_0 blocks of 32 in the kernel
// (ggml_quant_q8_0's rule), int8 tensor cores (RD_CUDA_Q8=w8a8).
#define TC_I8 4
// The weight formats the kernels are instantiated for.
enum { TC_WF_BF16 = 0, TC_WF_FP8 = 1, TC_WF_Q8_0 = 2 };
void launch_gemm_tc(cudaStream_t s, const cuplan_tc &pl, tc_args a, int pieces, int epi);
// Opts the tile kernel's pipelined forms into the dynamic shared memory `stages` stages take, once, at the
// backend's creation (an attribute of the kernel, never set while a stream captures a graph).
cudaError_t gemm_tc_setup(int stages);
// The same for the wgmma tile kernel's pipelined form (cuda_gemm_tc_wgp.cu; sm_90a code, so only on a compute
// capability 9.0 device).
cudaError_t gemm_tc_wgp_setup(int stages);
// Deterministic pseudo-random bf16 / fp32 values in [-1, 1) (GEMM self-test).
void launch_fill_random(cudaStream_t s, uint16_t *p, int64_t n, uint32_t seed);
void launch_fill_random(cudaStream_t s, float *p, int64_t n, uint32_t seed);
// *count += number of rows r < m where a[r][:] and b[r][:] (n floats each,
// row strides lda / ldb) differ bitwise.
void launch_count_mismatch(cudaStream_t s, const float *a, int64_t lda, const float *b, int64_t ldb, int32_t m,
                           int32_t n, unsigned *count);

// ---- mixture of experts (cuda_moe.cu) ----
// moe_route's semantics (engine/backend.h) over m rows of router logits
// [m][n_experts], one warp per row. With ss.t, the logits are first
// completed from the split sum (and written back).
void launch_moe_route(cudaStream_t s, float *logits, int32_t m, int32_t n_experts, int32_t k, int norm,
                      int32_t *ids, float *weights, split_sum ss);
// table[at + i] = p[i] for i < n (p a host array of device pointers): a
// kernel whose arguments carry the pointers, so an update of the table is
// ordered on the stream and can be recorded in a graph.
void launch_moe_set_table(cudaStream_t s, const void **table, const void *const *p, int32_t at, int32_t n);
// One moe_ffn call: the buffers and shapes its kernels share.
struct moe_args {
    const void *const *table;   // [4 n_experts]: expert e's gate|up [2 ffn][dim] at e, its down [dim][ffn] at
                                // n_experts + e, bf16 or Q8_0 codes; their Q8_0 scales (fp16 [rows][cols / 32])
                                // at 2 n_experts + e and 3 n_experts + e, NULL for a bf16 weight
    int32_t n_experts, ffn, dim;
    int w_aligned;              // every weight 16-byte aligned (vector loads)
    const float *x;             // [m][dim]
    const int32_t *ids;         // [m][k] (ids outside [0, n_experts) route nowhere)
    const float *weights;       // [m][k]
    int32_t m, k;
    float *y;                   // [m][dim], += the weighted sum of the routes
    int32_t *off;               // scratch [n_experts + 1]: expert e's routes are order[off[e] .. off[e + 1])
    int32_t *order;             // scratch [m k]: route indices grouped by expert, rows ascending
    int32_t *active;            // scratch [n_experts]: the experts with routes, ascending, then -1s
    float *act;                 // scratch [m k][ffn]: swiglu(gate_up . x), by place in order
    float *h;                   // scratch [m k][dim]: each route's expert output, by route (tc: by place)
    // The experts on tensor cores (RD_CUDA_MOE=tc; tc_wf >= 0): the GEMM's kernel (cuda_gemm_tc.cuh) run
    // per (expert, 16 routes) from a work list the sort writes. tc_wf < 0: the CUDA-core kernels.
    int tc_wf;                  // TC_WF_BF16 or TC_WF_Q8_0 (every expert of the table), or -1
    cuplan_tc pl_gu, pl_down;   // cuplan_moe_tc(dim), cuplan_moe_tc(ffn)
    int32_t *pos;               // scratch [m k]: each route's place in order (h's row); NULL unless tc
    int32_t *xrow;              // scratch [m k]: the x row of the route at each place (order / k); NULL unless tc
    int32_t *work;              // scratch [n_work][2]: (expert, row tile of 16 of its routes), then -1s; NULL unless tc
    int32_t n_work;             // min(n_experts, m k) + ceil(m k / 16): no more tiles can exist
    // Small batches: the expert kernels sort in-block and the down kernel combines (cuda_moe.cu says
    // when). count: arrival counters, zero between launches, one per column tile of the down kernel
    // (moe_dim_tiles(dim) on CUDA cores, (dim + 15) / 16 on tensor cores), set when the fusions are on
    // (RD_CUDA_FUSE); NULL: the sort and the combine keep their kernels.
    unsigned *count;
};
// Sorts the routes by expert, then runs the gate|up and down products of
// the routed experts (one kernel each, a block per routed expert and output
// tile: min(n_experts, m k) expert slots, so batch 1 launches k), then
// y += sum_j w_j h_j per row (small batches, fuse set: the sort inside the
// expert kernels, the sum inside down's). See cuda_moe.cu for the reduction orders.
void launch_moe_ffn(cudaStream_t s, const moe_args &a);
// The down kernel's tiles along dim: moe_args.count's length.
int32_t moe_dim_tiles(int32_t dim);
// The tensor-core experts' two launches (cuda_moe_tc.cu): after the sort, or (sort) sorting in-block; with
// combine, the down kernel's last CTA of each column tile then sums the routes for its columns.
void launch_moe_tc(cudaStream_t s, const moe_args &a, bool sort, bool combine);
// At most this many routes: the expert kernels sort the ids in every block (cuda_moe.cu, cuda_moe_tc.cu).
#define MOE_SORT_ROUTES 64
// At most this many rows: the down kernel's last blocks combine.
#define MOE_COMBINE_ROWS 32

// Route r's expert, or -1 where its id is outside [0, n_experts) (it routes nowhere, as in k_moe_sort).
RD_DEV int32_t moe_route_expert(const moe_args &a, int32_t r)
{
    const int32_t id = a.ids[r];
    return id >= 0 && id < a.n_experts ? id : -1;
}

// y[i][c] += acc, acc = fmaf(w_j, h[i k + j][c], acc) over j = 0..k-1 from 0
// (a route with an id outside [0, n_experts) adds nothing: its h is unset);
// h's row of route r is pos[r] when pos is set (the tensor-core experts: by
// place), else r. h is read past L1: in the fused combine other blocks wrote it.
RD_DEV void moe_combine_one(const moe_args &a, const int32_t *pos, int64_t i, int64_t c)
{
    float acc = 0.0f;
    for (int32_t j = 0; j < a.k; j++) {
        const int64_t r = i * a.k + j;
        if (moe_route_expert(a, (int32_t)r) >= 0)
            acc = fmaf(a.weights[r], __ldcg(&a.h[(pos ? (int64_t)pos[r] : r) * a.dim + c]), acc);
    }
    const int64_t idx = i * a.dim + c;
    a.y[idx] = RD_FADD(a.y[idx], acc);
}

// ---- LoRA (cuda_lora.cu) ----
// table[i] = p[i] for i < n (p host memory), by kernels whose arguments carry
// the entries, so the write is ordered on the stream and can be recorded.
void launch_lora_set_table(cudaStream_t s, lora_dev *table, const lora_dev *p, int32_t n);
struct lora_args {
    const lora_dev *table;      // [n_slots]
    int32_t n_slots, in, out, max_rank;
    const float *x;             // [m][in]
    const float *nw;            // with nw, x is an RMSNorm's input, normalized as the shrink reads it (the pending
    float eps, w_off;           // GEMM's prologue: its output is not written yet); NULL: x as it is
    const int32_t *slots;       // [m] each row's slot; outside [0, n_slots): none
    int32_t m;
    float *t;                   // scratch [m][max_rank]: A x per row
    float *y;                   // rows y_stride apart; the term lands at out_off
    int32_t y_stride, out_off;
};
// lora_apply (engine/backend.h): a shrink kernel (a warp per row and rank
// index) then an expand kernel (a thread per row and output), both of a
// shape fixed by m, max_rank and out; see cuda_lora.cu for the orders.
void launch_lora_apply(cudaStream_t s, const lora_args &a);
// The shrinks alone (t = A x) of n <= TC_LORA_MAX calls on the same rows (m, x, nw, slots alike), in one launch:
// their expands are the pending tensor-core GEMM's epilogue (tc_args.lora).
void launch_lora_shrinks(cudaStream_t s, const lora_args *a, int n);

// ---- paged attention (cuda_attention.cu) ----
struct attn_params {
    const float *q;             // [rows] at q + row * q_stride: n_heads heads of head_dim
    int32_t q_stride;
    const uint16_t *k_cache, *v_cache; // [n_blocks][n_kv][block_size][head_dim]; bf16, or FP8 blocks when fp8
    int fp8;                    // 1: the caches are kv_dtype fp8's (codes, then scale bytes, per block)
    const int32_t *positions;   // [rows]
    const int32_t *row_seq;     // [rows] sequence of each row; -1 = padding
    const int32_t *block_tables; // [seqs][*table_stride]
    const int32_t *table_stride; // device scalar (read at run time: CUDA graphs)
    int32_t n_heads, n_kv, head_dim, block_size;
    float scale;
    int32_t window;             // sliding window (keys pos - window + 1 .. pos); 0: all
    int32_t rows;
    int32_t z;                  // CTAs per (row, kv head)
    int32_t unroll;             // keys a thread loads before using them: CUPLAN_ATTN_UNROLL, or 1 (RD_CUDA_ATTN_V0)
    int32_t parts_cap;          // partitions stored per (row, head)
    float *part_o;              // [rows][n_heads][parts_cap][head_dim] unnormalised P.V
    float *part_ms;             // [rows][n_heads][parts_cap][2] max score, sum of exp
    float *out;                 // [rows][n_heads * head_dim]
    uint16_t *out_bf;           // same, bf16 (may be NULL)
    int64_t lo_off;             // and the lo halves at out_bf + lo_off (0: none)
    unsigned *count;            // [rows][n_kv] arrival counters, zero before and after: the combine in
                                // k_attn_part (NULL: k_attn_combine)
};
void launch_attention(cudaStream_t s, const attn_params &p);

// ---- sampling (cuda_sample.cu) ----
struct sample_req {
    int32_t row;                // logit row
    int32_t proc_row;           // row of its edited copy in the proc buffer; -1: no edits (proc = raw)
    int32_t edit_off, n_edits;  // its edits: edits[edit_off .. edit_off + n_edits)
    float rep, freq, pres;      // repetition (1 = off), frequency and presence (0 = off) penalties
    float temperature;
    int32_t top_k;
    float top_p, min_p;
    uint32_t seed_lo, seed_hi;
    uint32_t sample_idx, pos;
    int32_t n_top;              // alternatives (0..20)
    int32_t score_token;        // >= 0: no draw: this token's raw log-prob, rank and the alternatives (samp_score)
    int32_t score_proc;         // with score_token: 1 also its processed log-prob (samp_score's, no edits)
    int32_t n_want;             // token ids whose raw log-probs to report (samp_params.want_ids), 0..32
    int32_t want_ids[32];       // [n_want], each in 0..vocab-1 (checked on the host)
    int32_t cut_slot;           // the tiled sampler: its place among the call's draws with a cut (-1: none)
};
// One token's edit: samp_edit's fields (engine/serve/sampler.h).
struct sample_edit {
    int32_t token;              // outside [0, vocab): skipped, as samp_apply_edits does
    int32_t n_out;              // times generated before this position
    uint8_t seen, mask;         // 1: the repetition penalty applies; 1: -inf
    uint16_t pad;
    float bias;                 // added first
};
struct sample_res {
    int32_t token;              // -1: invalid logits (err says why)
    int32_t err;                // 0 ok, 1 NaN or +inf present, 2 all -inf (raw or edited row)
    float logprob, logprob_proc;
    int32_t n_top;
    int32_t top_ids[20];
    float top_lp[20];
    int32_t rank;               // scoring: tokens whose raw logit is >= the token's (samp_score's rank); 0 else
    float want_lp[32];          // [n_want] raw log-probs of want_ids, as the sampled token's
};
#define RD_SAMPLE_THREADS 1024
// The tiled sampler (the default): a request's rows in tiles of SAMP_TILE
// tokens, a CTA of SAMP_TT threads per (request, tile), SAMP_PER contiguous
// tokens a thread. The tiles depend on the vocabulary alone, so every sum's
// order does too (never on the batch).
#define SAMP_TILE 2048
#define SAMP_TT 256
#define SAMP_PER (SAMP_TILE / SAMP_TT)
RD_HD int32_t samp_tiles(int32_t vocab) { return (vocab + SAMP_TILE - 1) / SAMP_TILE; }
// One (request, tile)'s partial results; the last CTA of a request to finish
// folds them in tile order.
struct samp_tile {
    uint64_t best_r, best_p;    // the largest rank key (cm_rank_key, -inf included) of the raw / edited row
    double s_raw;               // sum of exp(x - m_raw) over the raw row's tile
    double kept;                // draws without a top-k/top-p cut: the kept mass over the edited row's tile
    int32_t bad_r, bad_p;       // a NaN or +inf in the raw / edited row's tile
    int32_t rank;               // scoring: tokens whose raw logit is >= the scored token's
    int32_t last_kept;          // draws without a cut: the tile's last kept token (-1: none)
};
// For each of the n requests with edits (proc_row >= 0): proc row proc_row
// [vocab] = its raw logits row with its edits applied (cm_edit_logit, each
// token's edit from the raw value). A request lists each token at most once
// (samp_edit's contract); a repeated token's result is unspecified.
void launch_edit_rows(cudaStream_t s, const float *logits, int32_t vocab, const sample_req *reqs, int32_t n,
                      const sample_edit *edits, float *proc);
// samp_sample_ex per request: the raw log-prob and the alternatives from its
// logits row, the draw (and greedy's argmax, the processed log-prob) from
// its proc row, or from the logits row when proc_row < 0.
void launch_sample(cudaStream_t s, const float *logits, const float *proc, int32_t vocab, const sample_req *reqs,
                   int32_t n, sample_res *res);
// A draw with a cut, in the tiled sampler: the radix search for its cut key,
// a digit of 8 bits a round from the top (k_samp_cut), over the tiles'
// histograms of the keys still in range; the draw after (k_samp_draw).
struct samp_cut {
    uint64_t prefix;            // the key's bits found so far (above shift)
    uint64_t floor;             // the top-p search: keys below are out (the top-k cut; 0: none)
    uint64_t k_cut;             // the result: keep keys >= k_cut (0: no cut)
    double above_mass;          // the in-range-or-above tokens' mass above the digit's range, in the walk's order
    double target;              // the top-p search: top_p x the mass of keys >= floor (< 0: not yet known)
    int64_t above_cnt;          // the top-k search: tokens above the digit's range
    int32_t phase;              // 0: top-k's k-th key; 1: top-p's crossing key; 2: found; 3: rejected row
    int32_t shift;              // this round's digit: key bits shift .. shift + 7
    float m, m_raw, log_s;      // the edited row's max, the raw row's, log of its mass
    int32_t pad;
};
// One histogram bin of a tile (or, folded, of the row) for one round.
struct samp_bin {
    double mass;                // the bin's weights, the tile's tokens in index order
    int32_t cnt, pad;
    uint64_t max_key;           // its largest key (the key itself when cnt is 1)
};
// The same results, the work spread over the vocabulary: tiles [n][samp_tiles(vocab)],
// tops [n][samp_tiles(vocab)][max_top] (max_top = the largest n_top; tops unused at 0),
// counts [n] zero (and left zero). Requests with a top-k or top-p cut (cut_slot >= 0,
// n_cut of them) take cut_rounds rounds of their key search (8 per search: top-k's,
// top-p's; a request with both needs 16), cuts [n], bins [n_cut][samp_tiles(vocab)][256].
void launch_sample_tiled(cudaStream_t s, const float *logits, const float *proc, int32_t vocab,
                         const sample_req *reqs, int32_t n, samp_tile *tiles, uint64_t *tops, int32_t max_top,
                         unsigned *counts, int32_t n_cut, int32_t cut_rounds, samp_cut *cuts, samp_bin *bins,
                         sample_res *res);
// Whether request q draws through a top-k or top-p cut (the tiled sampler's key search, k_samp_cut).
// (Greedy draws and scores without a processed log-prob take no cut.)
RD_HD bool sample_has_cut(const sample_req &q, int32_t vocab)
{
    const bool score_only = q.score_token >= 0 && !q.score_proc;
    return q.temperature != 0.0f && !score_only && ((q.top_k > 0 && q.top_k < vocab) || q.top_p < 1.0f);
}

}  // namespace RD_NS

#endif
