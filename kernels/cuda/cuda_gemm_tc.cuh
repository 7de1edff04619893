// cuda_gemm_tc.cuh - the linear layers' GEMM on tensor cores, one kernel for
// every batch size (RD_CUDA_GEMM=tc for bf16 weights, RD_CUDA_FP8=tc for FP8,
// RD_CUDA_FP8=w8a8 for FP8 weights times E4M3 activations, RD_CUDA_Q8=tc for
// GGUF Q8_0 weights): the kernels, as templates. Each weight format
// instantiates its own in its own file, so nvcc compiles them in parallel:
// cuda_gemm_tc.cu (bf16 weights, the LM head, and launch_gemm_tc, which
// picks the file), cuda_gemm_tc_fp8.cu (FP8 weights decoded to bf16),
// cuda_gemm_tc_q8.cu (W8A8), cuda_gemm_tc_q80.cu (Q8_0), cuda_gemm_tc_i8.cu (Q8_0 W8A8);
// the two-piece kernels (x as hi + lo) of bf16, FP8 and Q8_0 weights in a
// file each beside them (cuda_gemm_tc_p2.cu, _fp8_p2.cu, _q80_p2.cu): nvcc's
// longest file bounds the device's build, which runs in its time budget.
//
// Why its own kernel: cuBLASLt, asked for no split-K (batch invariance), runs
// a batch-1 GEMM on a few CTAs (the 1B's down projection on 32 of 132 SMs,
// docs/PERF.md 2026-12-04) and reads the activations as a two-piece bf16 copy
// that a kernel before it writes. Here the fp32 activations are read as they
// are and split into hi = bf16(x) and lo = bf16(x - hi) in registers, the K
// dimension is cut by a plan that depends on the shape alone
// (cuplan_gemm_tc), and the sub-pieces' sums meet in a fixed order, so a
// batch-1 call fills the GPU and a row's bits never depend on the batch.
//
// Arithmetic of one output (row r, column n), for sub-piece i of q: a chain of
// mma.sync m16n8k16 steps (bf16 x bf16 products, fp32 accumulation) from zero
// over its 32-weight chunks in increasing k, each chunk two k-steps, each
// step the hi product then (split activations) the lo product (the LM head:
// hi, mid and lo, x exactly; tc_piece). The q sums are
// then added left to right. The hardware computes each row of an mma from
// that row's inputs alone, so neither the other rows nor the tiling changes
// a bit; the m16 tile count per warp (cuplan_tc_mw) is schedule only.
//
// Within a 32-weight chunk, the mma's logical k positions are a fixed
// permutation of the weights (both A and B use it): lane (g, t) of an n8 tile
// reads the 8 contiguous weights [8t, 8t + 8) of row g with one 16-byte load,
// k-step s taking [8t + 4s, 8t + 4s + 4) as the fragment's logical k
// {2t, 2t + 1, 2t + 8, 2t + 9}. That keeps the weight reads 16 bytes wide.
//
// Gated FFNs (TC_SWIGLU, TC_GEGLU): a gate|up weight's GEMM can end in the
// SwiGLU or GeGLU that reads it (the backend defers the GEMM to see whether
// that op comes next). A CTA then takes the gate rows [f0, f0 + 8) as its
// first n8 tile and the up rows [F + f0, F + f0 + 8) as its second, so each
// finished (gate, up) pair meets in one thread, which writes k_swiglu's
// (k_geglu's) expression of them to out [m][F]; gate|up is never stored.
// Columns only move between CTAs, so every sum is the unfused kernel's.
//
// RoPE as the epilogue (TC_ROPE): a q|k|v GEMM's CTA takes element j of a
// head and element j + head_dim / 2 as its two n8 tiles, so the pair RoPE
// rotates meets in one thread, which writes k_rope's expression of it and the
// K and V cache entries k_kv_write writes (tc_col, tc_store2).
//
// RMSNorm as the prologue (a.nw): for a few rows (the backend decides how
// few) the RMSNorm whose output is this GEMM's input is computed by every
// CTA for its own rows, reading the residual stream: each row's sum of
// squares in k_rmsnorm's order (RMS_THREADS virtual threads, a warp taking
// lane l of all 8 virtual warps: the same butterflies and fold), and x
// normalized with rms_apply as it is loaded. The CTAs of column tile 0 and
// K-slice 0 also write the normalized rows, the unfused op's output, for
// whatever else reads it (LoRA, MoE experts). Bits are those of k_rmsnorm
// then the GEMM.
//
// FP8 weights: the codes are decoded as k_gemm_fp8 decodes them (the code's
// value times its block's power of two, exact) and rounded to bf16, which
// holds them exactly unless the block scale pushes them below bf16's normal
// range (2^-126; no real weight block).
#ifndef RD_CUDA_GEMM_TC_CUH
#define RD_CUDA_GEMM_TC_CUH

#include "kernels/cuda/cuda_internal.h"
#include "kernels/cuda/cuda_fp8_decode.cuh"

namespace RD_NS {


// Two floats as bf16 (nearest even), lo16 in the low half. On the GPU one
// cvt.rn.bf16x2.f32, where cm_f32_to_bf16's integer rounding takes about 6
// operations a value: the tile kernels cut every staged x value into its
// pieces, and those operations would otherwise outnumber the mma steps
// several times. The same bits for every non-NaN float (round to nearest
// even on the bits; a NaN stays a NaN, its payload aside).
RD_DEV uint32_t tc_pack(float lo16, float hi16)
{
#if defined(__CUDA_ARCH__) && !defined(RD_CUDA_EMU)
    uint32_t r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi16), "f"(lo16));
    return r;
#else
    return (uint32_t)cm_f32_to_bf16(lo16) | (uint32_t)cm_f32_to_bf16(hi16) << 16;
#endif
}

// bf16(v) as a float (nearest even; tc_pack's conversion).
RD_DEV float tc_round_bf16(float v)
{
#if defined(__CUDA_ARCH__) && !defined(RD_CUDA_EMU)
    uint16_t h;
    asm("cvt.rn.bf16.f32 %0, %1;\n" : "=h"(h) : "f"(v));
    return cm_bf16_to_f32(h);
#else
    return cm_bf16_to_f32(cm_f32_to_bf16(v));
#endif
}

// Piece p of v before its rounding to bf16: p 0 is v (hi = bf16(v)); p 1 is
// v - hi (the split's lo, as store_bf writes it; the LM head's mid); p 2 is
// what is left after mid (the LM head's lo, as k_to_bf16x3 writes it). The
// subtractions are exact, so hi + mid + lo = v for a normal float.
RD_DEV float tc_piece(float v, int p)
{
    if (p == 0)
        return v;
    const float r = RD_FSUB(v, tc_round_bf16(v));
    return p == 1 ? r : RD_FSUB(r, tc_round_bf16(r));
}

// One warp's d += A B for an m16n8k16 tile (fragment layouts in cuemu.h).
RD_DEV void tc_mma(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1)
{
#ifdef RD_CUDA_EMU
    const uint32_t b[2] = {b0, b1};
    cuemu_mma_bf16_16816(d, a, b);
#else
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
                 "{%8, %9}, {%0, %1, %2, %3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#endif
}

// 8 FP8 codes (v) of a chunk with the chunk's scale byte as four bf16 pairs.
RD_DEV void tc_decode_w8(uint2 v, uint32_t scale_byte, uint32_t (&u)[4])
{
    const float s = cm_fp8_scale(scale_byte);
    float f[8];
    fp8_decode4(v.x, s, f);
    fp8_decode4(v.y, s, f + 4);
RD_UNROLL
    for (int i = 0; i < 4; i++)
        u[i] = tc_pack(f[2 * i], f[2 * i + 1]);
}

// Weights [8t, 8t + 8) of chunk c of row n as four bf16 pairs (zeros past
// the last row).
template <int WF> RD_DEV void tc_load_w(const tc_args &a, int32_t n, int32_t c, int t, uint32_t (&u)[4])
{
    if (n >= a.out) {
        u[0] = u[1] = u[2] = u[3] = 0;
        return;
    }
    if constexpr (WF == TC_WF_BF16) {
        const uint4 v = *(const uint4 *)(a.w + (int64_t)n * a.in + c + 8 * t);
        u[0] = v.x, u[1] = v.y, u[2] = v.z, u[3] = v.w;
        return;
    }
    tc_decode_w8(*(const uint2 *)(a.f8 + (int64_t)n * a.in + c + 8 * t), a.f8s[(int64_t)n * (a.in / 32) + c / 32], u);
}

// x[r][c + 8t .. c + 8t + 8) (zeros past the last row); with a.nw, normalized by inv. XR: row r is
// x[a.xrow[r]] (the MoE experts' routes; a template switch, so the dense kernels carry no indirection).
template <bool XR = false>
RD_DEV void tc_load_x(const tc_args &a, int32_t r, int32_t c, int t, float inv, float (&f)[8])
{
    if (r >= a.m) {
RD_UNROLL
        for (int e = 0; e < 8; e++)
            f[e] = 0.0f;
        return;
    }
    const int32_t xr = XR ? a.xrow[r] : r;
    const float *p = a.x + (int64_t)xr * a.in + c + 8 * t;
    if (a.xvec) {
        load_f32x8(p, f);
    } else {
RD_UNROLL
        for (int e = 0; e < 8; e++)
            f[e] = p[e];
    }
    if (a.nw) {
RD_UNROLL
        for (int e = 0; e < 8; e++)
            f[e] = rms_apply(f[e], inv, a.nw[c + 8 * t + e], a.w_off);
    }
}

// The prologue's factor of x's row r (a.nw set).
RD_DEV float tc_row_inv(const tc_args &a, int32_t r, int lane)
{
    return rms_row_inv(a.x + (int64_t)r * a.in, a.in, a.eps, lane);
}

// A's fragment of k-step s from rows g (xa) and g + 8 (xb), piece p.
RD_DEV void tc_frag_a(const float (&xa)[8], const float (&xb)[8], int s, int p, uint32_t (&f)[4])
{
    float v[8];
RD_UNROLL
    for (int e = 0; e < 4; e++) {
        v[e] = tc_piece(xa[4 * s + e], p);
        v[4 + e] = tc_piece(xb[4 * s + e], p);
    }
    f[0] = tc_pack(v[0], v[1]);             // row g, logical k 2t, 2t + 1
    f[1] = tc_pack(v[4], v[5]);             // row g + 8
    f[2] = tc_pack(v[2], v[3]);             // row g, logical k 2t + 8, 2t + 9
    f[3] = tc_pack(v[6], v[7]);             // row g + 8
}

// One 32-weight chunk at c into the accumulators of MW m16 tiles x 2 n8 tiles.
template <int MW, int NP, bool XR = false>
RD_DEV void tc_chunk(const tc_args &a, int32_t r0, int32_t c, int g, int t, const uint32_t (&w)[2][4],
                     const float (&inv)[MW][2], float (&acc)[MW][2][4])
{
RD_UNROLL
    for (int mt = 0; mt < MW; mt++) {
        float xa[8], xb[8];
        tc_load_x<XR>(a, r0 + 16 * mt + g, c, t, inv[mt][0], xa);
        tc_load_x<XR>(a, r0 + 16 * mt + g + 8, c, t, inv[mt][1], xb);
RD_UNROLL
        for (int s = 0; s < 2; s++) {
            uint32_t fr[NP][4];
RD_UNROLL
            for (int p = 0; p < NP; p++)
                tc_frag_a(xa, xb, s, p, fr[p]);
RD_UNROLL
            for (int j = 0; j < 2; j++)
RD_UNROLL
                for (int p = 0; p < NP; p++)
                    tc_mma(acc[mt][j], fr[p], w[j][2 * s], w[j][2 * s + 1]);
        }
    }
}

// The LoRA terms (a.lora) on output column c of row r, added to its value v in call order: what k_lora_expand
// adds to the stored output, each call whose columns hold c. Called, not inlined (RD_DEV_CALL): inlined at
// every store of every kernel it multiplied ptxas's time by 7. a is the kernel's __grid_constant__ parameter
// (RD_GRID_CONST), so passing it by reference copies nothing.
RD_DEV_CALL float tc_lora_add(const tc_args &a, int32_t r, int32_t c, float v)
{
    const int32_t s = a.lora.slots[r];
    for (int32_t i = 0; i < a.lora.n; i++) {
        const tc_lora &g = a.lora.tg[i];
        if (c < g.off || c >= g.off + g.out || s < 0 || s >= g.n_slots)
            continue;
        const lora_dev d = g.table[s];
        if (d.b && d.rank <= g.max_rank)
            v = RD_FADD(v, lora_term(d, c - g.off, g.t + (int64_t)r * g.max_rank));
    }
    return v;
}

// Whether a split-K CTA of pieces NP and epilogue EPI can carry LoRA's terms (not the LM head's three pieces,
// not a router, not the MoE experts' rows, XR).
#define TC_LORA_OK(NP, EPI, XR) ((NP) != 3 && (EPI) != TC_ROUTE && !(XR))

// LORA false: a kernel that never takes LoRA's terms (the tile kernels, the LM head, the router) leaves their
// code out.
template <bool LORA = true> RD_DEV void tc_store(const tc_args &a, int32_t r, int32_t n, float v)
{
    if (r >= a.m || n >= a.out)
        return;
    if (a.bias) // k_add_bias's sum, on the rounded output (acc is 0 then)
        v = RD_FADD(v, a.bias[n]);
    float *dst = a.y + (int64_t)r * a.out + n;
    v = a.acc ? RD_FADD(*dst, v) : v;
    if constexpr (LORA)
        v = a.lora.n ? tc_lora_add(a, r, n, v) : v;
    *dst = v;
}

// A gated FFN's output for feature f of row r from its finished gate and up.
template <int EPI> RD_DEV void tc_store_glu(const tc_args &a, int32_t r, int32_t f, float g, float u)
{
    if (r >= a.m || f >= a.out / 2)
        return;
    a.y[(int64_t)r * (a.out / 2) + f] =
        EPI == TC_SWIGLU ? RD_FMUL(RD_FDIV(g, RD_FADD(1.0f, expf(-g))), u) : cm_geglu(g, u);
}

// A CTA's columns come in 8 pairs (c, column of n8 tile 0, column of n8
// tile 1), and each pair meets in one thread at the end:
//   TC_PLAIN: columns n0 + c and n0 + 8 + c;
//   TC_SWIGLU / TC_GEGLU: gate f0 + c and up F + f0 + c of feature f0 + c (f0 = 8 x the tile);
//   TC_ROPE: in the first rope_heads heads, element j of a head and j + head_dim / 2, the
//   pair RoPE rotates (a head takes head_dim / 16 tiles); past them (V), as TC_PLAIN.
// a.out: no column.
template <int EPI> RD_DEV int32_t tc_col(const tc_args &a, int32_t tile, int j, int c)
{
    if (EPI == TC_SWIGLU || EPI == TC_GEGLU) {
        const int32_t F = a.out / 2, f = 8 * tile + c;
        return f < F ? j * F + f : a.out;
    }
    if (EPI == TC_ROPE) {
        const int32_t per_head = a.rope.head_dim / 16, rot_tiles = a.rope.heads * per_head;
        if (tile < rot_tiles) {
            const int32_t h = tile / per_head, e = 8 * (tile % per_head) + c;
            return h * a.rope.head_dim + e + j * (a.rope.head_dim / 2);
        }
        const int32_t n = a.rope.heads * a.rope.head_dim + 16 * (tile - rot_tiles) + 8 * j + c;
        return n < a.out ? n : a.out;
    }
    const int32_t n = 16 * tile + 8 * j + c;
    return n < a.out ? n : a.out;
}

// Pair c of row r finished (v0: n8 tile 0's column, v1: tile 1's): the epilogue.
template <int EPI, bool LORA = true>
RD_DEV void tc_store2(const tc_args &a, int32_t r, int32_t tile, int c, float v0, float v1)
{
    if (r >= a.m)
        return;
    if (EPI == TC_SWIGLU || EPI == TC_GEGLU) {
        const int32_t f = 8 * tile + c;
        if constexpr (LORA)
            if (a.lora.n && f < a.out / 2) // the gate's and the up's adapters before the gate
                v0 = tc_lora_add(a, r, f, v0), v1 = tc_lora_add(a, r, a.out / 2 + f, v1);
        tc_store_glu<EPI>(a, r, f, v0, v1);
        return;
    }
    const int32_t c0 = tc_col<EPI>(a, tile, 0, c), c1 = tc_col<EPI>(a, tile, 1, c);
    if (EPI == TC_ROPE) {
        const int32_t hd = a.rope.head_dim, half = hd / 2, slot = a.rope.kv.kc ? a.rope.kv.slots[r] : -1;
        float *y = a.y + (int64_t)r * a.out;
        if (a.bias) { // Qwen2's q|k|v bias first, as k_add_bias adds it
            v0 = c0 < a.out ? RD_FADD(v0, a.bias[c0]) : v0;
            v1 = c1 < a.out ? RD_FADD(v1, a.bias[c1]) : v1;
        }
        if constexpr (LORA)
            if (a.lora.n) { // then the adapters of q, k and v, before the norms and the rotation
                v0 = c0 < a.out ? tc_lora_add(a, r, c0, v0) : v0;
                v1 = c1 < a.out ? tc_lora_add(a, r, c1, v1) : v1;
            }
        if (c0 < a.rope.heads * hd && a.rope.nw) { // the head's norm first: tc_finish rotates it
            y[c0] = v0;
            y[c1] = v1;
            return;
        }
        if (c0 < a.rope.heads * hd) { // k_rope's expression on the finished pair
            const int32_t h = c0 / hd, e = c0 % hd;
            const float *cs = a.rope.cos_sin + (int64_t)a.rope.positions[r] * half * 2;
            const float cc = cs[2 * e], sn = cs[2 * e + 1];
            const float ra = RD_FSUB(RD_FMUL(v0, cc), RD_FMUL(v1, sn));
            const float rb = RD_FADD(RD_FMUL(v1, cc), RD_FMUL(v0, sn));
            y[c0] = ra;
            y[c1] = rb;
            const int32_t kh = h - (a.rope.heads - a.rope.kv.n_kv);
            if (slot >= 0 && kh >= 0) {
                a.rope.kv.kc[kv_dst(a.rope.kv, slot, kh, e, hd)] = cm_f32_to_bf16(ra);
                a.rope.kv.kc[kv_dst(a.rope.kv, slot, kh, e + half, hd)] = cm_f32_to_bf16(rb);
            }
            return;
        }
        const int32_t cs2[2] = {c0, c1};
        const float vs[2] = {v0, v1};
        for (int j = 0; j < 2; j++) {
            if (cs2[j] >= a.out)
                continue;
            y[cs2[j]] = vs[j];
            if (slot >= 0) {
                const int32_t vc = cs2[j] - a.rope.heads * hd;
                a.rope.kv.vc[kv_dst(a.rope.kv, slot, vc / hd, vc % hd, hd)] = cm_f32_to_bf16(vs[j]);
            }
        }
        return;
    }
    tc_store<LORA>(a, r, c0, v0);
    tc_store<LORA>(a, r, c1, v1);
}

// ------------------------------------------------------------------ W8A8
//
// RD_CUDA_FP8=w8a8 (pieces TC_Q8): FP8 weights times activations quantized
// to E4M3 as the kernel loads them, on the FP8 tensor cores (mma.sync
// m16n8k32 e4m3: one instruction per 32-weight chunk and n8 tile, against
// two k-steps times the pieces of the bf16 path). A row's 32 values of a
// chunk share a power-of-two scale 2^ea, the least with max|x| <= 448 x 2^ea
// (quant_fp8.h's block rule; ea in [-117, 120]), so no value saturates and
// the scale is exact; codes = E4M3(x x 2^-ea), nearest even. A chunk's mma
// runs from zero on codes alone and its sum d becomes (d x 2^ea) x 2^ew (the
// weight block's scale), both exact products, added to the sub-piece's sum
// in chunk order; sub-pieces meet as in the bf16 path. Every value a row's
// output depends on comes from that row, so batch invariance holds. A
// non-finite x makes its block's scale NaN, and its outputs NaN.
//
// Fragments: lane (g, t) holds codes [8t, 8t + 8) of a chunk's row (one
// 8-byte load of the weights); the first four are the mma's k 4t..4t + 3,
// the last four k 4t + 16..4t + 19, for A and B alike.

// One warp's d = A B + d for an m16n8k32 tile of E4M3 codes (layouts in cuemu.h).
RD_DEV void tc_mma8(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1)
{
#ifdef RD_CUDA_EMU
    const uint32_t b[2] = {b0, b1};
    cuemu_mma_e4m3_16832(d, a, b);
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
    asm volatile("mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
                 "{%8, %9}, {%0, %1, %2, %3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#else
    (void)d, (void)a, (void)b0, (void)b1;
    __trap(); // the build targets sm_90: never reached
#endif
}

// The scale exponent ea of a block from the bits of its max |x|, as 2^ea
// (NaN for a non-finite block), and 2^-ea.
RD_DEV void tc_q8_scale(uint32_t amax_bits, float &s, float &inv)
{
    if (amax_bits >= 0x7f800000u) {
        s = cm_u2f(0x7fc00000u), inv = 1.0f;
        return;
    }
    int e = amax_bits ? (int)(amax_bits >> 23) - 135 + ((amax_bits & 0x7fffffu) > 0x600000u) : 0;
    e = e < -117 ? -117 : e > 120 ? 120 : e;
    s = cm_u2f((uint32_t)(e + 127) << 23), inv = cm_u2f((uint32_t)(127 - e) << 23);
}

// Four E4M3 codes of v[0..3] x inv (exact), nearest even, v[0] in the low byte.
RD_DEV uint32_t tc_q8_codes4(const float *v, float inv)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
    // cvt.rn.satfinite.e4m3x2.f32: nearest even, as cm_fp8_from_f32 (no value here reaches 448's saturation)
    const uint32_t lo = __nv_cvt_float2_to_fp8x2(make_float2(RD_FMUL(v[0], inv), RD_FMUL(v[1], inv)), __NV_SATFINITE,
                                                  __NV_E4M3);
    const uint32_t hi = __nv_cvt_float2_to_fp8x2(make_float2(RD_FMUL(v[2], inv), RD_FMUL(v[3], inv)), __NV_SATFINITE,
                                                  __NV_E4M3);
    return (lo & 0xffffu) | hi << 16;
#else
    uint32_t u = 0;
RD_UNROLL
    for (int i = 0; i < 4; i++)
        u |= (uint32_t)cm_fp8_from_f32(RD_FMUL(v[i], inv)) << (8 * i);
    return u;
#endif
}

// The bits of max |x| over a row's 32 values of a chunk, 8 per lane of a
// quad (all lanes of the warp call it): for non-negative floats the unsigned
// order of the bits is the order of the values; NaN and inf sort above.
RD_DEV uint32_t tc_quad_amax(const float (&v)[8])
{
    uint32_t m = 0;
RD_UNROLL
    for (int e = 0; e < 8; e++) {
        const uint32_t b = cm_f2u(v[e]) & 0x7fffffffu;
        m = b > m ? b : m;
    }
    uint32_t o = __shfl_xor_sync(0xffffffffu, m, 1);
    m = o > m ? o : m;
    o = __shfl_xor_sync(0xffffffffu, m, 2);
    return o > m ? o : m;
}

// Quantizes a lane's 8 values of a chunk's row; the 4 lanes of a quad hold
// the row's 32 (all lanes of the warp call it). Codes c[0] (values 0-3), c[1]
// (4-7); s = the block's scale 2^ea.
RD_DEV void tc_q8_quad(const float (&v)[8], uint32_t (&c)[2], float &s)
{
    const uint32_t m = tc_quad_amax(v);
    float inv;
    tc_q8_scale(m, s, inv);
    c[0] = tc_q8_codes4(v, inv);
    c[1] = tc_q8_codes4(v + 4, inv);
}

// ------------------------------------------------------------------ Q8_0 W8A8
//
// RD_CUDA_Q8=w8a8 (pieces TC_I8): Q8_0 weights times activations quantized
// to Q8_0 as the kernel loads them, on the int8 tensor cores (mma.sync
// m16n8k32 s8: one instruction per chunk and n8 tile, integer products and
// sums, exact). A row's 32 values of a chunk become ggml_quant_q8_0's block:
// d = max|x| / 127, codes roundf(x / d) (computed as x x (1 / d), as
// quant.c does), the scale d rounded to fp16. The chunk's integer sum s is
// then added as acc + s x (dx x dw) (llama.cpp's vec_dot_q8_0_q8_0 per
// block), in chunk order, the sub-pieces as the bf16 path. The arithmetic
// has no hardware-dependent rounding: a device gives the emulator's bits. A
// non-finite x makes its block's scale NaN, and its outputs NaN.

// One warp's d += A B for an m16n8k32 tile of int8 values (layouts in cuemu.h).
RD_DEV void tc_mma_s8(int32_t (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1)
{
#ifdef RD_CUDA_EMU
    const uint32_t b[2] = {b0, b1};
    cuemu_mma_s8_16832(d, a, b);
#else
    asm volatile("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
                 "{%8, %9}, {%0, %1, %2, %3};\n"
                 : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#endif
}

// Four int8 codes of v[0..3] x id, quant.c's roundf (half away from zero), v[0] in the low byte.
RD_DEV uint32_t tc_i8_codes4(const float *v, float id)
{
    uint32_t u = 0;
RD_UNROLL
    for (int i = 0; i < 4; i++) {
        const float x = RD_FMUL(v[i], id);
        int32_t q = (int32_t)x;
        const float f = RD_FSUB(x, (float)q);
        q += (f >= 0.5f) - (f <= -0.5f);
        u |= (uint32_t)(uint8_t)(int8_t)q << (8 * i);
    }
    return u;
}

// tc_q8_quad for Q8_0 blocks: codes c[0] (values 0-3), c[1] (4-7) of a
// lane's 8 values, s = the block's fp16 scale as a float (all lanes call it).
RD_DEV void tc_i8_quad(const float (&v)[8], uint32_t (&c)[2], float &s)
{
    const uint32_t m = tc_quad_amax(v);
    if (m >= 0x7f800000u) {
        s = cm_u2f(0x7fc00000u), c[0] = c[1] = 0;
        return;
    }
    const float d = RD_FDIV(cm_u2f(m), 127.0f), id = d != 0.0f ? RD_FDIV(1.0f, d) : 0.0f;
    s = cm_f16_to_f32(cm_f32_to_f16(d));
    if (cm_f2u(id) >= 0x7f800000u) { // 1 / d overflowed (a subnormal d): quant.c's zero codes
        c[0] = c[1] = 0;
        return;
    }
    c[0] = tc_i8_codes4(v, id);
    c[1] = tc_i8_codes4(v + 4, id);
}

// The scale 2^ew of a weight block from its byte ew + 127 (0xff: NaN, a non-finite source).
RD_DEV float tc_w8_scale(uint32_t byte) { return byte == 0xffu ? cm_u2f(0x7fc00000u) : cm_u2f(byte << 23); }

// A chunk's sum d of one output, scaled and added to the running sum: FP8
// (d x 2^ea) x 2^ew, both exact; Q8_0 (I8) d x (dx x dw), llama.cpp's order.
template <bool I8> RD_DEV float tc_q8_add(float acc, float d, float sa, float sw)
{
    return I8 ? RD_FADD(acc, RD_FMUL(d, RD_FMUL(sa, sw))) : RD_FADD(acc, RD_FMUL(RD_FMUL(d, sa), sw));
}

// An m16n8 tile's chunk sums d (rows g, g + 8 with scales sa, sb; columns
// 2t, 2t + 1 with scales sw[0], sw[1]) added into acc.
template <bool I8> RD_DEV void tc_q8_add4(float (&acc)[4], const float (&d)[4], float sa, float sb, const float (&sw)[2])
{
    acc[0] = tc_q8_add<I8>(acc[0], d[0], sa, sw[0]);
    acc[1] = tc_q8_add<I8>(acc[1], d[1], sa, sw[1]);
    acc[2] = tc_q8_add<I8>(acc[2], d[2], sb, sw[0]);
    acc[3] = tc_q8_add<I8>(acc[3], d[3], sb, sw[1]);
}

// One chunk's mma from zero, as floats: E4M3 codes (fp32 sums) or int8 (I8: an exact integer sum, exact as a
// float: at most 32 x 128 x 127 in magnitude).
template <bool I8> RD_DEV void tc_mma8_chunk(float (&d)[4], const uint32_t (&fr)[4], uint32_t b0, uint32_t b1)
{
    if constexpr (I8) {
        int32_t di[4] = {0, 0, 0, 0};
        tc_mma_s8(di, fr, b0, b1);
RD_UNROLL
        for (int i = 0; i < 4; i++)
            d[i] = (float)di[i];
    } else {
        d[0] = d[1] = d[2] = d[3] = 0.0f;
        tc_mma8(d, fr, b0, b1);
    }
}

// A row quad's 32 values of a chunk quantized: E4M3 blocks (W8A8 on FP8) or Q8_0 (I8).
template <bool I8> RD_DEV void tc_quant_quad(const float (&v)[8], uint32_t (&c)[2], float &s)
{
    if constexpr (I8)
        tc_i8_quad(v, c, s);
    else
        tc_q8_quad(v, c, s);
}

// The A fragment of an m16 tile's chunk from rows g (xa) and g + 8 (xb), each quantized by its quad:
// codes [8t, 8t + 8) of each row in mma order, and the rows' block scales sa, sb.
template <bool I8>
RD_DEV void tc_quant_frag(const float (&xa)[8], const float (&xb)[8], uint32_t (&fr)[4], float &sa, float &sb)
{
    uint32_t ca[2], cb[2];
    tc_quant_quad<I8>(xa, ca, sa);
    tc_quant_quad<I8>(xb, cb, sb);
    fr[0] = ca[0], fr[1] = cb[0], fr[2] = ca[1], fr[3] = cb[1];
}

// W8A8 codes [8t, 8t + 8) of chunk c of row n (u[0], u[1]) and the block's
// scale's bits (u[2]); zeros past the last row.
RD_DEV void tc_load_w8(const tc_args &a, int32_t n, int32_t c, int t, uint32_t (&u)[4])
{
    u[3] = 0;
    if (n >= a.out) {
        u[0] = u[1] = u[2] = 0;
        return;
    }
    const uint2 v = *(const uint2 *)(a.f8 + (int64_t)n * a.in + c + 8 * t);
    u[0] = v.x, u[1] = v.y;
    u[2] = cm_f2u(tc_w8_scale(a.f8s[(int64_t)n * (a.in / 32) + c / 32]));
}

// The weight scales of this lane's output columns 2t and 2t + 1 of each n8
// tile (rows held by lanes 8t and 8t + 4), from the bits each lane loaded in w[j][2].
RD_DEV void tc_col_scales(const uint32_t (&w)[2][4], int t, float (&sw)[2][2])
{
RD_UNROLL
    for (int j = 0; j < 2; j++) {
        sw[j][0] = cm_u2f(__shfl_sync(0xffffffffu, w[j][2], 8 * t));
        sw[j][1] = cm_u2f(__shfl_sync(0xffffffffu, w[j][2], 8 * t + 4));
    }
}

// tc_chunk for W8A8: w[j] from tc_load_w8 (FP8) or tc_load_q80 (I8: Q8_0).
template <int MW, bool I8>
RD_DEV void tc_chunk_q8(const tc_args &a, int32_t r0, int32_t c, int g, int t, const uint32_t (&w)[2][4],
                        const float (&inv)[MW][2], float (&acc)[MW][2][4])
{
    float sw[2][2];
    tc_col_scales(w, t, sw);
RD_UNROLL
    for (int mt = 0; mt < MW; mt++) {
        float xa[8], xb[8];
        tc_load_x(a, r0 + 16 * mt + g, c, t, inv[mt][0], xa);
        tc_load_x(a, r0 + 16 * mt + g + 8, c, t, inv[mt][1], xb);
        uint32_t fr[4];
        float sa, sb;
        tc_quant_frag<I8>(xa, xb, fr, sa, sb);
RD_UNROLL
        for (int j = 0; j < 2; j++) {
            float d[4];
            tc_mma8_chunk<I8>(d, fr, w[j][0], w[j][1]);
            tc_q8_add4<I8>(acc[mt][j], d, sa, sb, sw[j]);
        }
    }
}

// ------------------------------------------------------------------ Q8_0 weights
//
// RD_CUDA_Q8=tc: a GGUF Q8_0 linear stays Q8_0 on the device, int8 codes
// [out][in] and an fp16 scale d per 32 weights (1.06 bytes a weight, as in
// the file). The weights are then the file's values, code x d, which a bf16
// copy rounds to 8 bits. A code is exact in bf16 (|code| <= 128: 8
// significant bits), so a chunk's mma steps take the codes as bf16 weights
// and x's pieces as the bf16 path does (hi, then lo), from zero: s, the
// chunk's sum of code x piece products. Then acc += s x d (each rounded
// once): d is no power of two, so code x d is no bf16 and the scale cannot
// go into the weights. The chunk order, sub-pieces and folds are the bf16
// path's, so a row's bits depend on nothing else in the batch.

// Codes [8t, 8t + 8) of chunk c of row n, four to a word, the lower k in the
// lower byte (u[0], u[1]), and the block's d as float bits (u[2]); zeros
// past the last row.
RD_DEV void tc_load_q80(const tc_args &a, int32_t n, int32_t c, int t, uint32_t (&u)[4])
{
    u[3] = 0;
    if (n >= a.out) {
        u[0] = u[1] = u[2] = 0;
        return;
    }
    const uint2 v = *(const uint2 *)(a.q8 + (int64_t)n * a.in + c + 8 * t);
    u[0] = v.x, u[1] = v.y;
    u[2] = cm_f2u(cm_f16_to_f32(a.q8d[(int64_t)n * (a.in / 32) + c / 32]));
}

// Codes 2h and 2h + 1 of a word of four as a bf16 pair, the lower k in the
// low half (exact: the float of an int8 has its low 16 bits zero).
RD_DEV uint32_t tc_q80_pair(uint32_t codes, int h)
{
    const float lo = (float)(int8_t)(codes >> (16 * h)), hi = (float)(int8_t)(codes >> (16 * h + 8));
    return cm_f2u(lo) >> 16 | (cm_f2u(hi) & 0xffff0000u);
}

// An m16n8 tile's chunk sums d scaled by their columns' d (sw[0]: column 2t,
// sw[1]: 2t + 1) and added into acc.
RD_DEV void tc_q80_add4(float (&acc)[4], const float (&d)[4], const float (&sw)[2])
{
RD_UNROLL
    for (int i = 0; i < 4; i++)
        acc[i] = RD_FADD(acc[i], RD_FMUL(d[i], sw[i & 1]));
}

// tc_chunk for Q8_0 weights: w[j] from tc_load_q80.
template <int MW, int NP, bool XR = false>
RD_DEV void tc_chunk_q80(const tc_args &a, int32_t r0, int32_t c, int g, int t, const uint32_t (&w)[2][4],
                         const float (&inv)[MW][2], float (&acc)[MW][2][4])
{
    float sw[2][2];
    tc_col_scales(w, t, sw);
    uint32_t b[2][4];   // n8 tile j's bf16 pairs, as tc_load_w gives them: k-step s takes b[j][2s], b[j][2s + 1]
RD_UNROLL
    for (int j = 0; j < 2; j++)
RD_UNROLL
        for (int i = 0; i < 4; i++)
            b[j][i] = tc_q80_pair(w[j][i / 2], i % 2);
RD_UNROLL
    for (int mt = 0; mt < MW; mt++) {
        float xa[8], xb[8];
        tc_load_x<XR>(a, r0 + 16 * mt + g, c, t, inv[mt][0], xa);
        tc_load_x<XR>(a, r0 + 16 * mt + g + 8, c, t, inv[mt][1], xb);
        float d[2][4] = {};
RD_UNROLL
        for (int s = 0; s < 2; s++) {
            uint32_t fr[NP][4];
RD_UNROLL
            for (int p = 0; p < NP; p++)
                tc_frag_a(xa, xb, s, p, fr[p]);
RD_UNROLL
            for (int j = 0; j < 2; j++)
RD_UNROLL
                for (int p = 0; p < NP; p++)
                    tc_mma(d[j], fr[p], b[j][2 * s], b[j][2 * s + 1]);
        }
RD_UNROLL
        for (int j = 0; j < 2; j++)
            tc_q80_add4(acc[mt][j], d[j], sw[j]);
    }
}

// A chunk's weights for the pieces' path (TC_Q8: tc_load_w8's; Q8_0, TC_I8 too: tc_load_q80's).
template <int NP, int WF> RD_DEV void tc_load_wp(const tc_args &a, int32_t n, int32_t c, int t, uint32_t (&u)[4])
{
    if constexpr (NP == TC_Q8)
        tc_load_w8(a, n, c, t, u);
    else if constexpr (WF == TC_WF_Q8_0)
        tc_load_q80(a, n, c, t, u);
    else
        tc_load_w<WF>(a, n, c, t, u);
}

template <int MW, int NP, int WF, bool XR>
RD_DEV void tc_chunk_p(const tc_args &a, int32_t r0, int32_t c, int g, int t, const uint32_t (&w)[2][4],
                       const float (&inv)[MW][2], float (&acc)[MW][2][4])
{
    if constexpr (NP == TC_Q8 || NP == TC_I8)
        tc_chunk_q8<MW, NP == TC_I8>(a, r0, c, g, t, w, inv, acc);
    else if constexpr (WF == TC_WF_Q8_0)
        tc_chunk_q80<MW, NP, XR>(a, r0, c, g, t, w, inv, acc);
    else
        tc_chunk<MW, NP, XR>(a, r0, c, g, t, w, inv, acc);
}

#define TC_UNROLL 4 // chunks whose weights are loaded before any of them is used

// With PDL (a.prefetch), the lines of the warp's weight rows over its
// sub-piece [k0, k1) are asked into L2 before the kernel waits for the one
// before it: the weights never depend on that kernel, so a batch-1 GEMM's
// DRAM reads start while the previous kernel drains. A prefetch moves no
// value, so the bits are the same with or without it.
template <int WF>
RD_DEV void tc_prefetch_w(const tc_args &a, const int32_t (&wrow)[2], int32_t k0, int32_t k1, int t)
{
#if defined(__CUDA_ARCH__)
    constexpr int32_t eb = WF == TC_WF_BF16 ? 2 : 1, per_line = 128 / eb; // weight bytes; weights per 128-byte line
RD_UNROLL
    for (int j = 0; j < 2; j++) {
        if (wrow[j] >= a.out)
            continue;
        const char *row = WF == TC_WF_FP8   ? (const char *)(a.f8 + (int64_t)wrow[j] * a.in)
                        : WF == TC_WF_Q8_0 ? (const char *)(a.q8 + (int64_t)wrow[j] * a.in)
                                           : (const char *)(a.w + (int64_t)wrow[j] * a.in);
        for (int32_t c = k0 + per_line * t; c < k1; c += 4 * per_line)
            asm volatile("prefetch.global.L2 [%0];\n" ::"l"(row + (int64_t)c * eb));
    }
#else
    (void)a, (void)wrow, (void)k0, (void)k1, (void)t;
#endif
}

// A finishing step after the CTA stored its part of rows [r0, r0 + 16 MW):
// - TC_ROPE with the per-head norm (a.rope.nw): column tile `tile` of a head
//   holds 16 of its head_dim sums, stored as they are. The last of the head's
//   head_dim / 16 CTAs to arrive (a counter per row tile and head) normalizes,
//   rotates and caches the head in those rows: k_hnorm_rope's warp code
//   (hnorm_rope_head) on the finished values, a warp per row.
// - TC_ROUTE, a router's logits (a.route): the last of the row tile's
//   column tiles to arrive routes its rows, moe_route_warp on each row's
//   logits staged in smem (the CTA's reduction scratch, smem_floats of it),
//   as many warps at once as rows of E + k floats fit.
// - TC_NORMADD (a.nadd): the last of the row tile's column tiles to arrive
//   runs rmsnorm_add on its rows, a warp per row: the factor as tc_row_inv
//   takes it (k_rmsnorm's order), then out = rms_apply per element and
//   y += out, k_rmsnorm's expressions.
template <int MW, int EPI> RD_DEV void tc_finish(const tc_args &a, int32_t tile, int32_t r0, float *smem, int smem_floats)
{
    const int warp = (int)threadIdx.x / 32, lane = (int)threadIdx.x % 32, wk = (int)blockDim.x / 32;
    const int32_t rt = r0 / (16 * MW);
    if constexpr (EPI == TC_ROPE) {
        const int32_t hd = a.rope.head_dim, h = tile / (hd / 16);
        if (!a.rope.nw || h >= a.rope.heads) // (the whole CTA: V's tiles, or no norm)
            return;
        if (!last_to_arrive(a.fin_count + (int64_t)rt * a.rope.heads + h, (unsigned)(hd / 16)))
            return;
        const float *w = h < a.rope.n_first ? a.rope.nw : a.rope.nw2;
        const kv_out &kv = a.rope.kv;
        for (int rr = warp; rr < 16 * MW && r0 + rr < a.m; rr += wk) { // whole warps
            const int32_t r = r0 + rr;
            float *v = a.y + (int64_t)r * a.out + (int64_t)h * hd;
            float nv[CUPLAN_ATTN_MAX_HD / 32];
            for (int32_t i = 0; 32 * i + lane < hd; i++)
                nv[i] = __ldcg(v + 32 * i + lane); // other CTAs' sums: from L2
            hnorm_rope_head(nv, v, hd, lane, w, a.rope.eps, a.rope.w_off,
                            a.rope.cos_sin + (int64_t)a.rope.positions[r] * hd, kv, kv.kc ? kv.slots[r] : -1,
                            h - (a.rope.heads - kv.n_kv));
        }
    } else if constexpr (EPI == TC_ROUTE) {
        if (!last_to_arrive(a.fin_count + rt, (unsigned)((a.out + CUPLAN_TC_NT - 1) / CUPLAN_TC_NT)))
            return;
        const int32_t E = a.out, k = a.route.k, per = E + k;
        const int nw = smem_floats / per < wk ? smem_floats / per : wk; // at least 1: E + k <= smem_floats
        if (warp < nw)
            for (int rr = warp; rr < 16 * MW && r0 + rr < a.m; rr += nw) { // whole warps
                const int32_t r = r0 + rr;
                float *p = smem + warp * per;
                for (int32_t e = lane; e < E; e += 32)
                    p[e] = __ldcg(a.y + (int64_t)r * E + e);
                moe_route_warp(p, p + E, E, k, a.route.norm, lane, a.route.ids + (int64_t)r * k,
                               a.route.weights + (int64_t)r * k);
                __syncwarp(); // (p is the next row's)
            }
    } else if constexpr (EPI == TC_NORMADD) {
        if (!last_to_arrive(a.fin_count + rt, (unsigned)((a.out + CUPLAN_TC_NT - 1) / CUPLAN_TC_NT)))
            return;
        for (int rr = warp; rr < 16 * MW && r0 + rr < a.m; rr += wk) { // whole warps
            const int64_t at = (int64_t)(r0 + rr) * a.out;
            const float inv = rms_row_inv<true>(a.y + at, a.out, a.nadd.eps, lane);
            for (int32_t j = lane; j < a.out; j += 32) {
                const float o = rms_apply(__ldcg(a.y + at + j), inv, a.nadd.w[j], a.nadd.w_off);
                a.nadd.out[at + j] = o;
                a.nadd.y[at + j] = RD_FADD(a.nadd.y[at + j], o);
            }
        }
    }
}

// One CTA of 32 wk threads: column tile `tile` (8 pairs of columns, tc_col)
// of rows [r0, r0 + 16 MW), K-slice kz of the plan's p; `slot` is its arrival
// counter (p > 1). k_gemm_tc's grid gives these; the MoE experts' kernel
// (cuda_moe_tc.cu) gives its own from a work list.
template <int MW, int NP, int WF, int EPI, bool XR = false>
RD_DEV void tc_cta(const tc_args &a, int32_t tile, int32_t r0, int32_t kz, unsigned slot)
{
    __shared__ float red[CUPLAN_TC_MAX_WK][16 * MW][CUPLAN_TC_NT];
    __shared__ float inv_s[16 * MW];
    const int warp = (int)threadIdx.x / 32, lane = (int)threadIdx.x % 32, g = lane / 4, t = lane % 4;
    const int wk = (int)blockDim.x / 32;
    const int32_t qi = kz * wk + warp; // this warp's sub-piece
    const int32_t k0 = qi * a.kp, k1 = k0 + a.kp;
    // the weight row (= output column) of this lane in n8 tile j
    int32_t wrow[2];
RD_UNROLL
    for (int j = 0; j < 2; j++)
        wrow[j] = tc_col<EPI>(a, tile, j, g);
    if (a.prefetch)
        tc_prefetch_w<WF>(a, wrow, k0, k1, t);
    RD_PDL_WAIT(); // from here on, what the kernel before wrote: x, the residual, the scratch

    float inv[MW][2] = {};
    if (a.nw) {
        for (int rr = warp; rr < 16 * MW; rr += wk) // whole warps: rr is the same in every lane
            if (r0 + rr < a.m) {
                const float v = tc_row_inv(a, r0 + rr, lane);
                if (lane == 0)
                    inv_s[rr] = v;
            }
        __syncthreads();
        if (tile == 0 && kz == 0)
            for (int rr = 0; rr < 16 * MW && r0 + rr < a.m; rr++) {
                const float *xr = a.x + (int64_t)(r0 + rr) * a.in;
                for (int32_t j = (int32_t)threadIdx.x; j < a.in; j += (int32_t)blockDim.x)
                    a.xn[(int64_t)(r0 + rr) * a.in + j] = rms_apply(xr[j], inv_s[rr], a.nw[j], a.w_off);
            }
RD_UNROLL
        for (int mt = 0; mt < MW; mt++)
RD_UNROLL
            for (int h = 0; h < 2; h++)
                inv[mt][h] = r0 + 16 * mt + 8 * h + g < a.m ? inv_s[16 * mt + 8 * h + g] : 0.0f;
    }
    float acc[MW][2][4];
RD_UNROLL
    for (int mt = 0; mt < MW; mt++)
RD_UNROLL
        for (int j = 0; j < 2; j++)
RD_UNROLL
            for (int i = 0; i < 4; i++)
                acc[mt][j][i] = 0.0f;
    int32_t c = k0;
    for (; c + 32 * TC_UNROLL <= k1; c += 32 * TC_UNROLL) {
        uint32_t w[TC_UNROLL][2][4];
RD_UNROLL
        for (int u = 0; u < TC_UNROLL; u++)
RD_UNROLL
            for (int j = 0; j < 2; j++)
                tc_load_wp<NP, WF>(a, wrow[j], c + 32 * u, t, w[u][j]);
RD_UNROLL
        for (int u = 0; u < TC_UNROLL; u++)
            tc_chunk_p<MW, NP, WF, XR>(a, r0, c + 32 * u, g, t, w[u], inv, acc);
    }
    for (; c < k1; c += 32) {
        uint32_t w[2][4];
RD_UNROLL
        for (int j = 0; j < 2; j++)
            tc_load_wp<NP, WF>(a, wrow[j], c, t, w[j]);
        tc_chunk_p<MW, NP, WF, XR>(a, r0, c, g, t, w, inv, acc);
    }

    // acc[mt][j][i] is row r0 + 16 mt + g (+ 8 for i >= 2) of pair 2 t + (i & 1), n8 tile j.
    // (With LoRA's terms, q = 1 takes the shared-memory path below, one warp adding nothing: the same values,
    // and the terms' calls in one loop rather than at each of these unrolled stores.)
    constexpr bool LORA = TC_LORA_OK(NP, EPI, XR);
    if (a.q == 1 && !(LORA && a.lora.n)) {
RD_UNROLL
        for (int mt = 0; mt < MW; mt++)
RD_UNROLL
            for (int i = 0; i < 4; i++)
                tc_store2<EPI, false>(a, r0 + 16 * mt + g + (i >= 2 ? 8 : 0), tile, 2 * t + (i & 1), acc[mt][0][i],
                                      acc[mt][1][i]);
        tc_finish<MW, EPI>(a, tile, r0, &red[0][0][0], (int)(sizeof red / sizeof(float)));
        return;
    }
    const int pairs = 16 * MW * 8;
    if (a.p == 1) {
        // The warps' sums meet in shared memory, added in warp (= sub-piece) order.
RD_UNROLL
        for (int mt = 0; mt < MW; mt++)
RD_UNROLL
            for (int j = 0; j < 2; j++)
RD_UNROLL
                for (int i = 0; i < 4; i++)
                    red[warp][16 * mt + g + (i >= 2 ? 8 : 0)][8 * j + 2 * t + (i & 1)] = acc[mt][j][i];
        __syncthreads();
        for (int e = (int)threadIdx.x; e < pairs; e += (int)blockDim.x) {
            const int rr = e / 8, cc = e % 8;
            float v0 = red[0][rr][cc], v1 = red[0][rr][8 + cc];
            for (int w = 1; w < wk; w++)
                v0 = RD_FADD(v0, red[w][rr][cc]), v1 = RD_FADD(v1, red[w][rr][8 + cc]);
            tc_store2<EPI, LORA>(a, r0 + rr, tile, cc, v0, v1);
        }
        tc_finish<MW, EPI>(a, tile, r0, &red[0][0][0], (int)(sizeof red / sizeof(float)));
        return;
    }
    // p CTAs share the tile: each writes its warps' sums to part[qi][row][column];
    // the CTA that arrives last (last_to_arrive, which resets the counter) adds all q of them in order.
RD_UNROLL
    for (int mt = 0; mt < MW; mt++)
RD_UNROLL
        for (int j = 0; j < 2; j++)
RD_UNROLL
            for (int i = 0; i < 4; i++) {
                const int32_t r = r0 + 16 * mt + g + (i >= 2 ? 8 : 0), n = tc_col<EPI>(a, tile, j, 2 * t + (i & 1));
                if (r < a.m && n < a.out)
                    a.part[((int64_t)qi * a.m + r) * a.out + n] = acc[mt][j][i];
            }
    if (!last_to_arrive(&a.count[slot], (unsigned)a.p))
        return;
    const int64_t stride = (int64_t)a.m * a.out;
    for (int e = (int)threadIdx.x; e < pairs; e += (int)blockDim.x) {
        const int32_t r = r0 + e / 8, cc = e % 8;
        if (r >= a.m)
            continue;
        float v[2] = {0.0f, 0.0f};
        for (int j = 0; j < 2; j++) {
            const int32_t n = tc_col<EPI>(a, tile, j, cc);
            if (n >= a.out)
                continue;
            const int64_t at = (int64_t)r * a.out + n;
            v[j] = __ldcg(a.part + at);
            for (int32_t i = 1; i < a.q; i++)
                v[j] = RD_FADD(v[j], __ldcg(a.part + i * stride + at));
        }
        tc_store2<EPI, LORA>(a, r, tile, cc, v[0], v[1]);
    }
    tc_finish<MW, EPI>(a, tile, r0, &red[0][0][0], (int)(sizeof red / sizeof(float)));
}

// grid (column tiles, row tiles of 16 MW, p); block 32 wk.
// (minBlocks 1: without it ptxas held some instantiations to 128 registers and spilled up to 56 bytes.)
template <int MW, int NP, int WF, int EPI>
__global__ void __launch_bounds__(32 * CUPLAN_TC_MAX_WK, 1) k_gemm_tc(const RD_GRID_CONST tc_args a)
{
    RD_PDL_LAUNCH();
    tc_cta<MW, NP, WF, EPI>(a, (int32_t)blockIdx.x, (int32_t)blockIdx.y * 16 * MW, (int32_t)blockIdx.z,
                            blockIdx.y * gridDim.x + blockIdx.x);
}

// ------------------------------------------------------------------ many rows
//
// From a.big_rows rows on, one CTA computes a square tile over the whole of
// K: WS x WS warps of 32 x 32 outputs each, 64 x 64 (WS 2, 128 threads) or
// 128 x 128 (WS 4, 512 threads; RD_CUDA_TC_TILE=128), staging 32-weight
// chunks of x (as bf16 hi and lo) and W in shared memory (double-buffered,
// the next chunk's global loads in flight while the current one is
// multiplied), so W is read once per 32 WS rows and x once per 32 WS
// columns: the 128 tile does half the 64 tile's L2 traffic per FLOP. The LM
// head's three pieces take the 64 tile (the 128 tile's staging would pass 48
// KB of shared memory). The arithmetic is the plan's, unchanged: each warp keeps a
// sub-piece's chain from zero in pc and folds it into tot left to right at
// the sub-piece's end, the value the other kernel's shared-memory or
// partial-sum fold gives; the mma order within a chunk and the permutation of
// k are those of tc_chunk. Gated epilogues: a warp's n8 tiles 0-1 are 16
// gate rows and tiles 2-3 the matching up rows.

#define TCB_THREADS(WS) (32 * (WS) * (WS))

// The weight row staged at shared row rr of column tile n0 (a.out: none).
template <int EPI> RD_DEV int32_t tcb_wrow(const tc_args &a, int32_t n0, int rr)
{
    if (EPI == TC_PLAIN)
        return n0 + rr < a.out ? n0 + rr : a.out;
    const int32_t F = a.out / 2, f = n0 / 2 + 16 * (rr / 32) + 8 * ((rr % 32 / 8) % 2) + rr % 8;
    return f < F ? (rr % 32 >= 16 ? F : 0) + f : a.out;
}

// After chunk ci: if a sub-piece (cpp chunks) ends, fold its chain pc into
// tot left to right (the first is tot) and start the next from zero.
RD_DEV void tcb_fold(int32_t ci, int32_t cpp, float (&tot)[2][4][4], float (&pc)[2][4][4])
{
    if (ci % cpp != cpp - 1)
        return;
RD_UNROLL
    for (int mt = 0; mt < 2; mt++)
RD_UNROLL
        for (int j = 0; j < 4; j++)
RD_UNROLL
            for (int i = 0; i < 4; i++) {
                tot[mt][j][i] = ci == cpp - 1 ? pc[mt][j][i] : RD_FADD(tot[mt][j][i], pc[mt][j][i]);
                pc[mt][j][i] = 0.0f;
            }
}

// A tile kernel warp's finished 32 x 32 outputs (n8 tiles 0-1 gate, 2-3 up for a gated epi).
template <int EPI>
RD_DEV void tcb_store(const tc_args &a, int32_t r0, int32_t n0, int wm, int wn, int g, int t, const float (&tot)[2][4][4])
{
RD_UNROLL
    for (int mt = 0; mt < 2; mt++)
RD_UNROLL
        for (int i = 0; i < 4; i++) {
            const int32_t r = r0 + 32 * wm + 16 * mt + g + (i >= 2 ? 8 : 0);
            if (EPI != TC_PLAIN) {
RD_UNROLL
                for (int j = 0; j < 2; j++)
                    tc_store_glu<EPI>(a, r, n0 / 2 + 16 * wn + 8 * j + 2 * t + (i & 1), tot[mt][j][i],
                                      tot[mt][j + 2][i]);
            } else {
RD_UNROLL
                for (int j = 0; j < 4; j++)
                    tc_store<false>(a, r, n0 + 32 * wn + 8 * j + 2 * t + (i & 1), tot[mt][j][i]);
            }
        }
}

// A staged chunk's mma steps for a warp's 32 x 32 outputs, tc_chunk's order: k-step s2, then the m16 tile,
// the n8 tile and the piece. bw[j]: weights [8t, 8t + 8) of row g of n8 tile j; ax[p][mt][h]: piece p of
// x [8t, 8t + 8) of row 16 mt + 8 h + g.
template <int NP> RD_DEV void tcb_mma(const uint4 (&bw)[4], const uint4 (&ax)[NP][2][2], float (&d)[2][4][4])
{
RD_UNROLL
    for (int s2 = 0; s2 < 2; s2++) {
RD_UNROLL
        for (int mt = 0; mt < 2; mt++) {
            uint32_t fr[NP][4];
RD_UNROLL
            for (int p = 0; p < NP; p++) {
                fr[p][0] = s2 ? ax[p][mt][0].z : ax[p][mt][0].x, fr[p][1] = s2 ? ax[p][mt][1].z : ax[p][mt][1].x;
                fr[p][2] = s2 ? ax[p][mt][0].w : ax[p][mt][0].y, fr[p][3] = s2 ? ax[p][mt][1].w : ax[p][mt][1].y;
            }
RD_UNROLL
            for (int j = 0; j < 4; j++) {
                const uint32_t b0 = s2 ? bw[j].z : bw[j].x, b1 = s2 ? bw[j].w : bw[j].y;
RD_UNROLL
                for (int p = 0; p < NP; p++)
                    tc_mma(d[mt][j], fr[p], b0, b1);
            }
        }
    }
}

// The tile kernels' grid and a CTA's tiles in it (a.wmajor). Why batch tiles fastest: CTAs start in
// blockIdx order, so the CTAs resident together then take a few weight tiles, each with all of its batch tiles,
// and read each weight tile from memory once, the other batch tiles' reads hitting L2. Weight tiles fastest,
// a wave takes every weight tile for one or two batch tiles, and a weight larger than L2 (the 1B's gate|up,
// 64 MB, at 256 rows) is read from memory again for the next ones. x, the smaller operand at decode sizes,
// is what stays in L2 then.
static inline dim3 tc_tile_grid(const tc_args &a, int32_t w_tiles, int32_t b_tiles)
{
    return a.wmajor ? dim3((unsigned)w_tiles, (unsigned)b_tiles) : dim3((unsigned)b_tiles, (unsigned)w_tiles);
}
RD_DEV int32_t tc_tile_w(const tc_args &a) { return (int32_t)(a.wmajor ? blockIdx.x : blockIdx.y); }
RD_DEV int32_t tc_tile_b(const tc_args &a) { return (int32_t)(a.wmajor ? blockIdx.y : blockIdx.x); }

// x's 8 values as piece p's four bf16 pairs, in the order of a fragment's uint4 (tc_frag_a).
RD_DEV uint4 tcb_pack_piece(const float (&v)[8], int p)
{
    return uint4{tc_pack(tc_piece(v[0], p), tc_piece(v[1], p)), tc_pack(tc_piece(v[2], p), tc_piece(v[3], p)),
                 tc_pack(tc_piece(v[4], p), tc_piece(v[5], p)), tc_pack(tc_piece(v[6], p), tc_piece(v[7], p))};
}

template <int WS, int NP, int WF, int EPI>
__global__ void __launch_bounds__(TCB_THREADS(WS)) k_gemm_tc_big(tc_args a)
{
    RD_PDL_ENTRY();
    constexpr int BT = 32 * WS, NS = 4 / WS; // tile side; 8-value pieces each thread stages per operand
    // A row's 32 weights (or x values) as 4 uint4 of 8 bf16: uint4 t is what lane t of a fragment reads.
    __shared__ uint4 xp[NP][2][BT][4]; // x's pieces (tc_piece)
    __shared__ uint4 ws[2][BT][4];
    // Q8_0 weights stage as codes (uint2 t: codes [8t, 8t + 8)) and a scale per row, in ws's space
    uint2(*const wq)[BT][4] = reinterpret_cast<uint2(*)[BT][4]>(&ws[0][0][0]);
    float(*const wsc)[BT] = reinterpret_cast<float(*)[BT]>(&wq[2][0][0]);
    const int tid = (int)threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
    const int wm = warp / WS, wn = warp % WS; // the warp's 32 x 32 tile
    const int32_t r0 = tc_tile_b(a) * BT, n0 = tc_tile_w(a) * BT;
    const int32_t nch = a.in / 32, cpp = a.kp / 32;

    // Staging: thread tid moves the 8-value pieces tid + i x threads (row / 4, piece % 4) of x and of W.
    float xr[NS][8];
    uint32_t wr[NS][4];
    auto gload = [&](int32_t c) {
RD_UNROLL
        for (int i = 0; i < NS; i++) {
            const int idx = tid + TCB_THREADS(WS) * i, rr = idx / 4, seg = idx % 4;
            tc_load_x(a, r0 + rr, c, seg, 0.0f, xr[i]);
            if constexpr (WF == TC_WF_Q8_0)
                tc_load_q80(a, tcb_wrow<EPI>(a, n0, rr), c, seg, wr[i]);
            else
                tc_load_w<WF>(a, tcb_wrow<EPI>(a, n0, rr), c, seg, wr[i]);
        }
    };
    auto sstore = [&](int buf) {
RD_UNROLL
        for (int i = 0; i < NS; i++) {
            const int idx = tid + TCB_THREADS(WS) * i, rr = idx / 4, seg = idx % 4;
RD_UNROLL
            for (int p = 0; p < NP; p++)
                xp[p][buf][rr][seg] = tcb_pack_piece(xr[i], p);
            if constexpr (WF == TC_WF_Q8_0) {
                wq[buf][rr][seg] = uint2{wr[i][0], wr[i][1]};
                if (seg == 0)
                    wsc[buf][rr] = cm_u2f(wr[i][2]);
            } else {
                ws[buf][rr][seg] = uint4{wr[i][0], wr[i][1], wr[i][2], wr[i][3]};
            }
        }
    };

    float tot[2][4][4] = {}, pc[2][4][4] = {};
    gload(0);
    sstore(0);
    __syncthreads();
    for (int32_t ci = 0; ci < nch; ci++) {
        const int buf = ci & 1;
        if (ci + 1 < nch)
            gload(32 * (ci + 1));
        uint4 bw[4], ax[NP][2][2];
        float sw[4][2];          // Q8_0: the scales of columns 2t, 2t + 1 of each n8 tile
        float dq[2][4][4] = {};  // Q8_0: this chunk's sums, from zero
RD_UNROLL
        for (int j = 0; j < 4; j++) {
            const int wr0 = 32 * wn + 8 * j;
            if constexpr (WF == TC_WF_Q8_0) {
                const uint2 cw = wq[buf][wr0 + g][t];
                bw[j] = uint4{tc_q80_pair(cw.x, 0), tc_q80_pair(cw.x, 1), tc_q80_pair(cw.y, 0), tc_q80_pair(cw.y, 1)};
                sw[j][0] = wsc[buf][wr0 + 2 * t], sw[j][1] = wsc[buf][wr0 + 2 * t + 1];
            } else {
                bw[j] = ws[buf][wr0 + g][t];
            }
        }
RD_UNROLL
        for (int mt = 0; mt < 2; mt++)
RD_UNROLL
            for (int h = 0; h < 2; h++) {
                const int rr = 32 * wm + 16 * mt + 8 * h + g;
RD_UNROLL
                for (int p = 0; p < NP; p++)
                    ax[p][mt][h] = xp[p][buf][rr][t];
            }
        if constexpr (WF == TC_WF_Q8_0)
            tcb_mma<NP>(bw, ax, dq);
        else
            tcb_mma<NP>(bw, ax, pc);
        if constexpr (WF == TC_WF_Q8_0) {
RD_UNROLL
            for (int mt = 0; mt < 2; mt++)
RD_UNROLL
                for (int j = 0; j < 4; j++)
                    tc_q80_add4(pc[mt][j], dq[mt][j], sw[j]);
        }
        tcb_fold(ci, cpp, tot, pc);
        if (ci + 1 < nch)
            sstore(buf ^ 1);
        __syncthreads();
    }
    tcb_store<EPI>(a, r0, n0, wm, wn, g, t, tot);
}

// The tile kernel with its loads in flight several chunks ahead (any weight
// format and pieces, x 16-byte aligned; a.stages of RD_CUDA_TC_PIPE).
// k_gemm_tc_big stages through registers one chunk ahead, so each chunk's
// global loads wait out a round trip to L2 or memory behind one chunk of mma
// work: at 256 rows the 1B's GEMMs have one 64 x 64 tile per SM (4 warps),
// with nothing else to hide that wait. Here cp.async copies chunk
// ci + stages - 1 into its shared-memory stage while chunk ci is multiplied,
// x as the fp32 it is and W as stored: bf16; FP8 codes with the 4-byte word
// of scale bytes that holds the chunk's (chunks ci & ~3 to ci | 3 of the row;
// rows of in / 32 bytes, a multiple of 4); Q8_0 codes with the 8 bytes of
// fp16 scales that hold the chunk's. Each warp makes its operands from the
// stage as the other kernels make theirs: x's pieces cut in registers (the
// GPU's cvt.rn.bf16x2.f32), or for W8A8 (TC_Q8, TC_I8) its rows' 32 values
// quantized by the quad of lanes that reads them (tc_quant_quad, as
// k_gemm_tc_big_q8's staging threads do; the warps of a row tile each
// quantize its rows, which costs ALU where the other kernel costs a trip
// through shared memory); the weights decoded as tc_load_w / tc_load_q80 /
// tc_load_w8 decode them. The mma steps, the chunk scaling, the sub-piece
// folds and the epilogue are those of k_gemm_tc_big and k_gemm_tc_big_q8:
// the same bits.
#define TCP_XS 36 // floats per staged x row: 32 and 4 of padding, so a fragment's rows g and g + 1 use other banks

// A row's bytes of W in a stage: its 32 weights (bf16 64; FP8 and Q8_0 codes 32), then the scales of its
// chunks (ci & ~3) .. (ci | 3) (FP8 a word of 4 bytes; Q8_0 4 fp16).
RD_HD constexpr int tcp_w_bytes(int wf) { return wf == TC_WF_BF16 ? 64 : 32; }
RD_HD constexpr int tcp_s_bytes(int wf) { return wf == TC_WF_FP8 ? 4 : wf == TC_WF_Q8_0 ? 8 : 0; }
// A stage's bytes: x's rows, W's rows, the scale rows.
RD_HD constexpr size_t tcp_stage_bytes(int ws, int wf) { return (size_t)32 * ws * (TCP_XS * 4 + tcp_w_bytes(wf) + tcp_s_bytes(wf)); }

template <int WS, int NP, int WF, int EPI>
__global__ void __launch_bounds__(TCB_THREADS(WS), 1) k_gemm_tc_pipe(tc_args a)
{
    RD_PDL_ENTRY();
    constexpr bool Q8 = NP == TC_Q8 || NP == TC_I8, I8 = NP == TC_I8; // W8A8: x quantized (I8: Q8_0 blocks)
    constexpr int BT = 32 * WS, NT = TCB_THREADS(WS);
    constexpr int WB = tcp_w_bytes(WF), SB = tcp_s_bytes(WF);
    // 16-byte copies a chunk (x: 8 a row; W: WB / 16 a row), then the scale copies (1 a row)
    constexpr int XC = 8 * BT, WC = WB / 16 * BT, NC = XC + WC + (SB ? BT : 0);
    constexpr int CP = (NC + NT - 1) / NT; // copies per thread and chunk (the last round partial with scales)
    constexpr int XB = BT * TCP_XS * 4, SO = XB + BT * WB; // the offsets of W's rows and of the scale rows
    RD_DYN_SMEM(unsigned char, sm);
    const int S = a.stages;
    const int tid = (int)threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
    const int wm = warp / WS, wn = warp % WS; // the warp's 32 x 32 tile
    const int32_t r0 = tc_tile_b(a) * BT, n0 = tc_tile_w(a) * BT;
    const int32_t nch = a.in / 32, cpp = a.kp / 32;
    // Stage s: x rows [BT][TCP_XS] floats; W rows [BT] x WB bytes (uint4 t of a bf16 row, uint2 t of a code
    // row: its weights [8t, 8t + 8)); the scale rows [BT] x SB bytes.
    const size_t stage = tcp_stage_bytes(WS, WF);
    // Copy c of a chunk (c = tid + NT i): its source at chunk 0, the bytes a chunk moves it, and its place.
    const unsigned char *src[CP];
    int32_t step[CP], dst[CP];
    bool ok[CP];
RD_UNROLL
    for (int i = 0; i < CP; i++) {
        const int c = tid + NT * i;
        if (c < XC) {
            const int rr = c / 8, seg = c % 8;
            ok[i] = r0 + rr < a.m;
            src[i] = (const unsigned char *)(a.x + (int64_t)(ok[i] ? r0 + rr : 0) * a.in + 4 * seg);
            step[i] = 128, dst[i] = (rr * TCP_XS + 4 * seg) * 4;
        } else if (c < XC + WC) {
            const int wc = c - XC, per = WB / 16, rr = wc / per, seg = wc % per;
            const int32_t n = tcb_wrow<EPI>(a, n0, rr), nr = n < a.out ? n : 0;
            ok[i] = n < a.out;
            src[i] = WF == TC_WF_BF16 ? (const unsigned char *)(a.w + (int64_t)nr * a.in + 8 * seg)
                     : WF == TC_WF_FP8 ? (const unsigned char *)(a.f8 + (int64_t)nr * a.in + 16 * seg)
                                       : (const unsigned char *)(a.q8 + (int64_t)nr * a.in + 16 * seg);
            step[i] = WB, dst[i] = XB + 16 * wc;
        } else {
            const int rr = c - XC - WC;
            const int32_t n = c < NC ? tcb_wrow<EPI>(a, n0, rr) : a.out, nr = n < a.out ? n : 0;
            ok[i] = n < a.out;
            src[i] = WF == TC_WF_FP8 ? a.f8s + (int64_t)nr * (a.in / 32)
                                     : (const unsigned char *)(a.q8d + (int64_t)nr * (a.in / 32));
            step[i] = 0, dst[i] = SO + SB * rr;
        }
    }
    auto issue = [&](int32_t ci, int st) {
        unsigned char *base = sm + (size_t)st * stage;
RD_UNROLL
        for (int i = 0; i < CP; i++) {
            const int c = tid + NT * i;
            if (c < XC + WC)
                cp_async<16>(base + dst[i], src[i] + (int64_t)step[i] * ci, ok[i]);
            else if (c < NC) // the scales of chunks (ci & ~3) .. (ci | 3)
                cp_async<SB ? SB : 4>(base + dst[i], src[i] + (int64_t)(SB / 4) * (ci & ~3), ok[i]);
        }
    };
    // The scale of weight row `row` (in the tile) for chunk ci: FP8 2^ew as tc_load_w decodes it (bf16 path) or
    // as tc_load_w8 (W8A8); Q8_0 its d.
    auto wscale = [&](const unsigned char *base, int row, int32_t ci) -> float {
        if constexpr (WF == TC_WF_FP8) {
            const uint32_t byte = ((const uint32_t *)(base + SO))[row] >> (8 * (ci & 3)) & 0xffu;
            return Q8 ? tc_w8_scale(byte) : cm_fp8_scale(byte);
        } else {
            return cm_f16_to_f32(((const uint16_t *)(base + SO))[row * 4 + (ci & 3)]);
        }
    };

    for (int s = 0; s < S - 1; s++) {
        if (s < nch)
            issue(s, s);
        cp_async_commit(); // one group per chunk, empty ones included, so the count in wait holds
    }
    float tot[2][4][4] = {}, pc[2][4][4] = {};
    int rd = 0, wr = S - 1; // the stages of chunk ci and of chunk ci + S - 1 (= ci - 1's)
    for (int32_t ci = 0; ci < nch; ci++) {
        cp_async_wait_ring(S); // (all but the newest S - 2 groups: chunk ci's among them)
        __syncthreads(); // chunk ci has landed for every thread, and every warp is done with chunk ci - 1's stage
        if (ci + S - 1 < nch)
            issue(ci + S - 1, wr);
        cp_async_commit();
        const unsigned char *base = sm + (size_t)rd * stage;
        const float *xs = (const float *)base;
        rd = rd + 1 == S ? 0 : rd + 1;
        wr = wr + 1 == S ? 0 : wr + 1;
        if constexpr (Q8) {
            uint2 bw[4];
            float sw[4][2];
RD_UNROLL
            for (int j = 0; j < 4; j++) {
                const int wr0 = 32 * wn + 8 * j;
                bw[j] = ((const uint2 *)(base + XB))[(wr0 + g) * 4 + t];
                sw[j][0] = wscale(base, wr0 + 2 * t, ci), sw[j][1] = wscale(base, wr0 + 2 * t + 1, ci);
            }
RD_UNROLL
            for (int mt = 0; mt < 2; mt++) {
                const int ra = 32 * wm + 16 * mt + g;
                float va[8], vb[8];
                load_f32x8(xs + ra * TCP_XS + 8 * t, va);
                load_f32x8(xs + (ra + 8) * TCP_XS + 8 * t, vb);
                uint32_t fr[4];
                float sa, sb;
                tc_quant_frag<I8>(va, vb, fr, sa, sb);
RD_UNROLL
                for (int j = 0; j < 4; j++) {
                    float d[4];
                    tc_mma8_chunk<I8>(d, fr, bw[j].x, bw[j].y);
                    tc_q8_add4<I8>(pc[mt][j], d, sa, sb, sw[j]);
                }
            }
        } else {
            uint4 bw[4], ax[NP][2][2];
            float sw[4][2]; // Q8_0: the scales of columns 2t, 2t + 1 of each n8 tile
RD_UNROLL
            for (int j = 0; j < 4; j++) {
                const int row = 32 * wn + 8 * j + g;
                if constexpr (WF == TC_WF_FP8) {
                    const uint2 v = ((const uint2 *)(base + XB))[row * 4 + t];
                    const float sc = wscale(base, row, ci);
                    float f[8];
                    fp8_decode4(v.x, sc, f);
                    fp8_decode4(v.y, sc, f + 4);
                    bw[j] = uint4{tc_pack(f[0], f[1]), tc_pack(f[2], f[3]), tc_pack(f[4], f[5]), tc_pack(f[6], f[7])};
                } else if constexpr (WF == TC_WF_Q8_0) {
                    const uint2 cw = ((const uint2 *)(base + XB))[row * 4 + t];
                    bw[j] = uint4{tc_q80_pair(cw.x, 0), tc_q80_pair(cw.x, 1), tc_q80_pair(cw.y, 0), tc_q80_pair(cw.y, 1)};
                    sw[j][0] = wscale(base, row - g + 2 * t, ci), sw[j][1] = wscale(base, row - g + 2 * t + 1, ci);
                } else {
                    bw[j] = ((const uint4 *)(base + XB))[row * 4 + t];
                }
            }
RD_UNROLL
            for (int mt = 0; mt < 2; mt++)
RD_UNROLL
                for (int h = 0; h < 2; h++) {
                    float v[8];
                    load_f32x8(xs + (32 * wm + 16 * mt + 8 * h + g) * TCP_XS + 8 * t, v);
RD_UNROLL
                    for (int p = 0; p < NP; p++)
                        ax[p][mt][h] = tcb_pack_piece(v, p);
                }
            if constexpr (WF == TC_WF_Q8_0) { // each chunk's sums from zero, then times their columns' d
                float dq[2][4][4] = {};
                tcb_mma<NP>(bw, ax, dq);
RD_UNROLL
                for (int mt = 0; mt < 2; mt++)
RD_UNROLL
                    for (int j = 0; j < 4; j++)
                        tc_q80_add4(pc[mt][j], dq[mt][j], sw[j]);
            } else {
                tcb_mma<NP>(bw, ax, pc);
            }
        }
        tcb_fold(ci, cpp, tot, pc);
    }
    tcb_store<EPI>(a, r0, n0, wm, wn, g, t, tot);
}

// The tile kernel for W8A8: the same tiles, staging and sub-piece folds,
// with x staged as E4M3 (I8: Q8_0) codes and a scale per (row, chunk),
// quantized by the quad of threads that loads a row's 32 values
// (tc_quant_quad), and W as codes and scales; the chunk arithmetic is
// tc_chunk_q8's.
template <int WS, int EPI, bool I8>
__global__ void __launch_bounds__(TCB_THREADS(WS)) k_gemm_tc_big_q8(tc_args a)
{
    RD_PDL_ENTRY();
    constexpr int BT = 32 * WS, NS = 4 / WS;
    __shared__ uint2 xq[2][BT][4]; // a row's 32 codes: uint2 t is what lane t of a fragment reads
    __shared__ uint2 wq[2][BT][4];
    __shared__ float xs[2][BT], wsc[2][BT];
    const int tid = (int)threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
    const int wm = warp / WS, wn = warp % WS;
    const int32_t r0 = tc_tile_b(a) * BT, n0 = tc_tile_w(a) * BT;
    const int32_t nch = a.in / 32, cpp = a.kp / 32;

    // thread tid moves segment tid % 4 of rows (tid + i x threads) / 4: a row's quad is 4 neighbouring lanes
    float xr[NS][8];
    uint32_t wr[NS][4];
    auto gload = [&](int32_t c) {
RD_UNROLL
        for (int i = 0; i < NS; i++) {
            const int idx = tid + TCB_THREADS(WS) * i, rr = idx / 4, seg = idx % 4;
            tc_load_x(a, r0 + rr, c, seg, 0.0f, xr[i]);
            if constexpr (I8)
                tc_load_q80(a, tcb_wrow<EPI>(a, n0, rr), c, seg, wr[i]);
            else
                tc_load_w8(a, tcb_wrow<EPI>(a, n0, rr), c, seg, wr[i]);
        }
    };
    auto sstore = [&](int buf) {
RD_UNROLL
        for (int i = 0; i < NS; i++) {
            const int idx = tid + TCB_THREADS(WS) * i, rr = idx / 4, seg = idx % 4;
            uint32_t cq[2];
            float sa;
            tc_quant_quad<I8>(xr[i], cq, sa);
            xq[buf][rr][seg] = uint2{cq[0], cq[1]};
            wq[buf][rr][seg] = uint2{wr[i][0], wr[i][1]};
            if (seg == 0)
                xs[buf][rr] = sa, wsc[buf][rr] = cm_u2f(wr[i][2]);
        }
    };

    float tot[2][4][4] = {}, pc[2][4][4] = {};
    gload(0);
    sstore(0);
    __syncthreads();
    for (int32_t ci = 0; ci < nch; ci++) {
        const int buf = ci & 1;
        if (ci + 1 < nch)
            gload(32 * (ci + 1));
        uint2 bw[4];
        float sw[4][2];
RD_UNROLL
        for (int j = 0; j < 4; j++) {
            bw[j] = wq[buf][32 * wn + 8 * j + g][t];
            sw[j][0] = wsc[buf][32 * wn + 8 * j + 2 * t], sw[j][1] = wsc[buf][32 * wn + 8 * j + 2 * t + 1];
        }
RD_UNROLL
        for (int mt = 0; mt < 2; mt++) {
            const int ra = 32 * wm + 16 * mt + g;
            const uint2 xa = xq[buf][ra][t], xb = xq[buf][ra + 8][t];
            const float sa = xs[buf][ra], sb = xs[buf][ra + 8];
            const uint32_t fr[4] = {xa.x, xb.x, xa.y, xb.y};
RD_UNROLL
            for (int j = 0; j < 4; j++) {
                float d[4];
                tc_mma8_chunk<I8>(d, fr, bw[j].x, bw[j].y);
                tc_q8_add4<I8>(pc[mt][j], d, sa, sb, sw[j]);
            }
        }
        tcb_fold(ci, cpp, tot, pc);
        if (ci + 1 < nch)
            sstore(buf ^ 1);
        __syncthreads();
    }
    tcb_store<EPI>(a, r0, n0, wm, wn, g, t, tot);
}

// ------------------------------------------------------------------ launching

template <int MW, int NP, int WF>
static void gemm_tc_launch(cudaStream_t s, const tc_args &a, dim3 grid, dim3 block, int epi)
{
    if constexpr (NP == 3) { // the LM head's three pieces: bf16 or Q8_0 weights, no epilogue
        auto kern = k_gemm_tc<MW, 3, WF, TC_PLAIN>;
        RD_LAUNCH(kern, grid, block, 0, s, a);
    } else if (epi == TC_SWIGLU) {
        auto kern = k_gemm_tc<MW, NP, WF, TC_SWIGLU>;
        RD_LAUNCH(kern, grid, block, 0, s, a);
    } else if (epi == TC_GEGLU) {
        auto kern = k_gemm_tc<MW, NP, WF, TC_GEGLU>;
        RD_LAUNCH(kern, grid, block, 0, s, a);
    } else if (epi == TC_ROPE) {
        auto kern = k_gemm_tc<MW, NP, WF, TC_ROPE>;
        RD_LAUNCH(kern, grid, block, 0, s, a);
    } else if (epi == TC_ROUTE) {
        if constexpr (NP == 1 || NP == 2) { // (W8A8 routers route after the GEMM: the backend asks only for these)
            auto kern = k_gemm_tc<MW, NP, WF, TC_ROUTE>;
            RD_LAUNCH(kern, grid, block, 0, s, a);
        }
    } else if (epi == TC_NORMADD) {
        if constexpr (NP == 1 || NP == 2) { // (as TC_ROUTE: W8A8's projections are followed by k_rmsnorm)
            auto kern = k_gemm_tc<MW, NP, WF, TC_NORMADD>;
            RD_LAUNCH(kern, grid, block, 0, s, a);
        }
    } else {
        auto kern = k_gemm_tc<MW, NP, WF, TC_PLAIN>;
        RD_LAUNCH(kern, grid, block, 0, s, a);
    }
}

template <int WS, int NP, int WF> static void gemm_tc_big(cudaStream_t s, const tc_args &a, int epi)
{
    constexpr int BT = 32 * WS;
    const dim3 grid = tc_tile_grid(a, (a.out + BT - 1) / BT, (a.m + BT - 1) / BT), block(TCB_THREADS(WS));
    if constexpr (NP == 3) {
        auto kern = k_gemm_tc_big<WS, 3, WF, TC_PLAIN>;
        RD_LAUNCH(kern, grid, block, 0, s, a);
    } else if constexpr (NP == TC_Q8 || NP == TC_I8) {
        constexpr bool I8 = NP == TC_I8;
        if (epi == TC_SWIGLU) {
            auto kern = k_gemm_tc_big_q8<WS, TC_SWIGLU, I8>;
            RD_LAUNCH(kern, grid, block, 0, s, a);
        } else if (epi == TC_GEGLU) {
            auto kern = k_gemm_tc_big_q8<WS, TC_GEGLU, I8>;
            RD_LAUNCH(kern, grid, block, 0, s, a);
        } else {
            auto kern = k_gemm_tc_big_q8<WS, TC_PLAIN, I8>;
            RD_LAUNCH(kern, grid, block, 0, s, a);
        }
    } else if (epi == TC_SWIGLU) {
        auto kern = k_gemm_tc_big<WS, NP, WF, TC_SWIGLU>;
        RD_LAUNCH(kern, grid, block, 0, s, a);
    } else if (epi == TC_GEGLU) {
        auto kern = k_gemm_tc_big<WS, NP, WF, TC_GEGLU>;
        RD_LAUNCH(kern, grid, block, 0, s, a);
    } else {
        auto kern = k_gemm_tc_big<WS, NP, WF, TC_PLAIN>;
        RD_LAUNCH(kern, grid, block, 0, s, a);
    }
}

template <int WS, int NP, int WF, int EPI> static void tcp_launch(cudaStream_t s, const tc_args &a)
{
    constexpr int BT = 32 * WS;
    const dim3 grid = tc_tile_grid(a, (a.out + BT - 1) / BT, (a.m + BT - 1) / BT), block(TCB_THREADS(WS));
    auto kern = k_gemm_tc_pipe<WS, NP, WF, EPI>;
    RD_LAUNCH(kern, grid, block, (size_t)a.stages * tcp_stage_bytes(WS, WF), s, a); // (gemm_tc_setup opted in)
}

// Past 48 KB of dynamic shared memory a kernel opts in.
template <int WS, int NP, int WF, int EPI> static cudaError_t tcp_setup(int stages)
{
    return cudaFuncSetAttribute(k_gemm_tc_pipe<WS, NP, WF, EPI>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                (int)((size_t)stages * tcp_stage_bytes(WS, WF)));
}

// The pipelined kernels of pieces NP and weight format WF, each opted in (its own file's instances: a
// kernel's attribute belongs to the copy in the file that launches it).
template <int NP, int WF> static cudaError_t tcp_setup_all(int stages)
{
    if constexpr (NP == 3) { // the LM head's three pieces, on the 64 tile
        return tcp_setup<2, 3, WF, TC_PLAIN>(stages);
    } else {
        const cudaError_t e[] = {tcp_setup<2, NP, WF, TC_PLAIN>(stages),  tcp_setup<2, NP, WF, TC_SWIGLU>(stages),
                                 tcp_setup<2, NP, WF, TC_GEGLU>(stages),  tcp_setup<4, NP, WF, TC_PLAIN>(stages),
                                 tcp_setup<4, NP, WF, TC_SWIGLU>(stages), tcp_setup<4, NP, WF, TC_GEGLU>(stages)};
        for (cudaError_t x : e)
            if (x != cudaSuccess)
                return x;
        return cudaSuccess;
    }
}

template <int WS, int NP, int WF> static void gemm_tc_pipe(cudaStream_t s, const tc_args &a, int epi)
{
    if constexpr (NP == 3)
        tcp_launch<WS, 3, WF, TC_PLAIN>(s, a);
    else if (epi == TC_SWIGLU)
        tcp_launch<WS, NP, WF, TC_SWIGLU>(s, a);
    else if (epi == TC_GEGLU)
        tcp_launch<WS, NP, WF, TC_GEGLU>(s, a);
    else
        tcp_launch<WS, NP, WF, TC_PLAIN>(s, a);
}

// The pipelined tile kernel takes weights whose rows of chunk scales come in whole 4-chunk copies (FP8: a
// word; Q8_0: 8 bytes), and x 16-byte aligned.
template <int WF> static bool tcp_fits(const tc_args &a)
{
    if (!a.stages || !a.xvec || a.xrow)
        return false;
    if constexpr (WF == TC_WF_FP8)
        return a.in / 32 % 4 == 0 && (uintptr_t)a.f8s % 4 == 0 && (uintptr_t)a.f8 % 16 == 0;
    else if constexpr (WF == TC_WF_Q8_0)
        return a.in / 32 % 4 == 0 && (uintptr_t)a.q8d % 8 == 0 && (uintptr_t)a.q8 % 16 == 0;
    return true;
}

// A tile kernel call: pipelined where the operands allow it, else register-staged.
template <int WS, int NP, int WF> static void gemm_tc_tile(cudaStream_t s, const tc_args &a, int epi)
{
    if (tcp_fits<WF>(a))
        gemm_tc_pipe<WS, NP, WF>(s, a, epi);
    else
        gemm_tc_big<WS, NP, WF>(s, a, epi);
}

static inline bool tc_use_big(const tc_args &a)
{
    return a.big_rows > 0 && a.m >= a.big_rows && !a.nw && !a.rope.heads && !a.route.ids && !a.nadd.out && !a.lora.n;
}

// One call with pieces NP (TC_Q8, TC_I8: W8A8) and a weight format WF: the tile
// kernel from a.big_rows rows on (the LM head's pieces on the 64 tile),
// else the split-K kernel with the plan's grid.
template <int NP, int WF> static void gemm_tc_pieces(cudaStream_t s, const cuplan_tc &pl, const tc_args &a, int epi)
{
    if (tc_use_big(a)) {
        if constexpr (NP == 3)
            gemm_tc_tile<2, 3, WF>(s, a, epi);
        else if (a.big_tile == 128)
            gemm_tc_tile<4, NP, WF>(s, a, epi);
        else
            gemm_tc_tile<2, NP, WF>(s, a, epi);
        return;
    }
    const int32_t mw = cuplan_tc_mw(a.m);
    const dim3 grid((unsigned)((a.out + CUPLAN_TC_NT - 1) / CUPLAN_TC_NT), (unsigned)((a.m + 16 * mw - 1) / (16 * mw)),
                    (unsigned)pl.p);
    const dim3 block((unsigned)(32 * pl.wk));
    if (mw == 1)
        gemm_tc_launch<1, NP, WF>(s, a, grid, block, epi);
    else if (mw == 2)
        gemm_tc_launch<2, NP, WF>(s, a, grid, block, epi);
    else
        gemm_tc_launch<4, NP, WF>(s, a, grid, block, epi);
}

// The per-format files' entries (a set up by launch_gemm_tc).
void gemm_tc_bf16(cudaStream_t s, const cuplan_tc &pl, const tc_args &a, int pieces, int epi);
void gemm_tc_fp8(cudaStream_t s, const cuplan_tc &pl, const tc_args &a, int pieces, int epi);
cudaError_t gemm_tc_setup_fp8(int stages);
cudaError_t gemm_tc_setup_q8(int stages);
cudaError_t gemm_tc_setup_q80(int stages);
cudaError_t gemm_tc_setup_i8(int stages);
void gemm_tc_i8(cudaStream_t s, const cuplan_tc &pl, const tc_args &a, int epi);
void gemm_tc_q8(cudaStream_t s, const cuplan_tc &pl, const tc_args &a, int epi);
void gemm_tc_q80(cudaStream_t s, const cuplan_tc &pl, const tc_args &a, int pieces, int epi);
// Their two-piece kernels, each format's in a file of its own.
cudaError_t gemm_tc_setup_bf16_p2(int stages);
cudaError_t gemm_tc_setup_fp8_p2(int stages);
cudaError_t gemm_tc_setup_q80_p2(int stages);
void gemm_tc_bf16_p2(cudaStream_t s, const cuplan_tc &pl, const tc_args &a, int epi);
void gemm_tc_fp8_p2(cudaStream_t s, const cuplan_tc &pl, const tc_args &a, int epi);
void gemm_tc_q80_p2(cudaStream_t s, const cuplan_tc &pl, const tc_args &a, int epi);
// The wgmma tile kernel (cuda_gemm_tc_wg.cu, sm_90a): whether it takes a call, and the call.
bool tc_wg_fits(const tc_args &a, int pieces, int epi);
void gemm_tc_wg(cudaStream_t s, const tc_args &a, int pieces, int epi);
// Its pipelined form (cuda_gemm_tc_wgp.cu): the call if its operands allow it (else false, nothing launched).
bool gemm_tc_wgp(cudaStream_t s, const tc_args &a, int pieces, int epi);

}  // namespace RD_NS

#endif
