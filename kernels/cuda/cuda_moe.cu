// cuda_moe.cu - mixture-of-experts kernels: the router's softmax top-k
// (moe_route) and the grouped SwiGLU experts (moe_ffn); engine/backend.h
// states what they compute, kernels/cpu/moe.c is the reference.
//
// moe_route: one warp per row. The exps are computed by the lanes, summed by
// lane 0 alone in expert order (the CPU's order, so the sum and every
// probability are the CPU's bits wherever expf agrees), top-k by k rounds of
// a warp argmax with ties to the lower id.
//
// moe_ffn, four kernels, none of which depends on the host knowing the ids
// (so the whole op records into a CUDA graph):
//   1. k_moe_sort: a counting sort of the m*k routes by expert, in one block
//      (thread e counts and then places expert e's routes, in route order),
//      and the list of the experts that have routes, ascending.
//   2. k_moe_gate_up: grid (ffn tile, expert slot): slot j serves the j-th
//      routed expert (min(n_experts, m*k) slots, so a batch-1 call of top-8
//      launches 8 columns of blocks, not one per expert of 128); each block
//      loops over its expert's routes, RT rows per pass, and writes
//      swiglu(gate . x, up . x) for its features. An expert's weights come
//      from DRAM once per call (later passes of a block hit the caches).
//   3. k_moe_down: the same over dim tiles: h[route] = down . act.
//   4. k_moe_combine: y[i] += fmaf over j of w_j h_j, j = 0..k-1 from 0.
// Under RD_CUDA_MOE=tc, 2 and 3 run on tensor cores instead (cuda_moe_tc.cu,
// which says how); the sort then also writes what those kernels index by.
//
// Small batches (fusions on, RD_CUDA_FUSE: moe_args.count set): a batch-1
// layer's experts are ~75 MB of weights (Qwen3-30B-A3B) read in two kernels;
// the sort and the combine are microseconds of work each but a whole launch
// and a dependency each. So
// with at most MOE_SORT_ROUTES routes, 2 and 3 sort the ids themselves in
// every block (moe_slot_sort: the slot's expert, its place and its routes,
// the values k_moe_sort would have written), and with at most
// MOE_COMBINE_ROWS rows, the last block of each dim tile of 3 to finish
// (an arrival counter, reset by it, as attention's combine) does 4 for that
// tile. Every product and sum is the unfused kernels', so the bits are the
// same and the choice, which depends on m, cannot move a row.
//
// Precision: bf16 weights (the backend's), fp32 activations (x and the
// SwiGLU output are never rounded to bf16), fp32 products and sums with fmaf.
// So unlike linear (split hi/lo bf16 inputs by default) the experts do not
// depend on RD_CUDA_ACT.
//
// Batch invariance: every dot product (a feature of gate, up or down for one
// route) is reduced by one warp in an order fixed by its length alone: lane l
// takes the 8-element chunks l, l + 32, ... (8 fmaf each, in order), then the
// tail elements 8 * (len / 8) + l; the lanes meet in the xor butterfly. Which
// block, pass or slot in a pass a route lands in, and whether the loads are
// vectors, change nothing of that, so a row's bits are the same whatever m
// and whichever rows share its experts.
#include "kernels/cuda/cuda_internal.h"

extern "C" {
#include "engine/backend.h"
}

namespace RD_NS {

static inline unsigned blocks_for(int64_t n, int threads) { return (unsigned)((n + threads - 1) / threads); }

// ------------------------------------------------------------------ routing

#define ROUTE_WARPS 4

__global__ void __launch_bounds__(32 * ROUTE_WARPS)
    k_moe_route(float *logits, int32_t m, int32_t E, int32_t k, int norm, int32_t *ids, float *weights, split_sum sp)
{
    RD_PDL_ENTRY();
    __shared__ float s_p[ROUTE_WARPS][RD_MOE_MAX_EXPERTS];
    __shared__ float s_w[ROUTE_WARPS][RD_MOE_MAX_K];
    const int32_t warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int64_t i = (int64_t)blockIdx.x * ROUTE_WARPS + warp;
    if (i >= m)
        return; // the whole warp
    float *l = logits + i * E;
    for (int32_t e = lane; e < E; e += 32) {
        float v = l[e];
        if (sp.t) { // the lane writes back only what it read
            v = split_value(sp, logits, i * E + e);
            l[e] = v;
        }
        s_p[warp][e] = v;
    }
    moe_route_warp(s_p[warp], s_w[warp], E, k, norm, lane, ids + i * k, weights + i * k);
}

void launch_moe_route(cudaStream_t s, float *logits, int32_t m, int32_t n_experts, int32_t k, int norm,
                      int32_t *ids, float *weights, split_sum ss)
{
    if (m <= 0)
        return;
    RD_LAUNCH(k_moe_route, dim3(blocks_for(m, ROUTE_WARPS)), dim3(32 * ROUTE_WARPS), 0, s, logits, m, n_experts, k,
              norm, ids, weights, ss);
}

// ------------------------------------------------------------------ the expert table

#define MOE_TABLE_CHUNK 256     // pointers per launch: 2 KiB of kernel arguments

struct moe_ptrs {
    const void *p[MOE_TABLE_CHUNK];
};

__global__ void k_moe_set_table(const void **table, moe_ptrs ptrs, int32_t at, int32_t n)
{
    RD_PDL_ENTRY();
    const int32_t i = threadIdx.x;
    if (i < n)
        table[at + i] = ptrs.p[i];
}

void launch_moe_set_table(cudaStream_t s, const void **table, const void *const *p, int32_t at, int32_t n)
{
    for (int32_t c = 0; c < n; c += MOE_TABLE_CHUNK) {
        const int32_t len = n - c < MOE_TABLE_CHUNK ? n - c : MOE_TABLE_CHUNK;
        moe_ptrs ptrs;
        memset(&ptrs, 0, sizeof ptrs);
        memcpy(ptrs.p, p + c, (size_t)len * sizeof(p[0]));
        RD_LAUNCH(k_moe_set_table, dim3(1), dim3(MOE_TABLE_CHUNK), 0, s, table, ptrs, at + c, len);
    }
}

// ------------------------------------------------------------------ grouping

// One block of >= n_experts threads (a multiple of 32). Thread e scans the
// routes twice: to count expert e's, then (after the prefix sum) to place
// them in route order. Each thread reads every id (the same address across
// the warp: one broadcast load); m * k is at most a few thousand in decode.
// With work (the tensor-core experts), also each route's place in order,
// the x row of the route at each place, and the list of (expert, row tile
// of 16) the experts' routes make.
__global__ void k_moe_sort(const int32_t *ids, int32_t routes, int32_t k, int32_t E, int32_t *off, int32_t *order,
                           int32_t *active, int32_t *pos, int32_t *xrow, int32_t *work, int32_t n_work)
{
    RD_PDL_ENTRY();
    __shared__ int32_t s_off[RD_MOE_MAX_EXPERTS + 1];
    const int32_t e = threadIdx.x;
    int32_t n = 0;
    if (e < E)
        for (int32_t r = 0; r < routes; r++)
            n += ids[r] == e;
    if (e < E)
        s_off[e + 1] = n;
    __syncthreads();
    if (e == 0) {
        s_off[0] = 0;
        int32_t na = 0;
        for (int32_t x = 0; x < E; x++) {
            if (s_off[x + 1] > 0)
                active[na++] = x;
            s_off[x + 1] += s_off[x];
        }
        for (; na < E; na++)
            active[na] = -1;
        if (work) {
            int32_t nw = 0;
            for (int32_t x = 0; x < E; x++)
                for (int32_t r = s_off[x]; r < s_off[x + 1]; r += 16, nw++) {
                    work[2 * nw] = x;
                    work[2 * nw + 1] = (r - s_off[x]) / 16;
                }
            for (; nw < n_work; nw++)
                work[2 * nw] = -1, work[2 * nw + 1] = 0;
        }
    }
    __syncthreads();
    for (int32_t x = e; x <= E; x += blockDim.x)
        off[x] = s_off[x];
    if (e < E) {
        int32_t at = s_off[e];
        for (int32_t r = 0; r < routes; r++)
            if (ids[r] == e) {
                if (pos)
                    pos[r] = at, xrow[at] = r / k;
                order[at++] = r;
            }
    }
}

// ------------------------------------------------------------------ the experts

#define MOE_WARPS 4             // warps per block
#define MOE_GO 2                // output features per warp
#define MOE_RT 8                // routes per pass
static_assert(MOE_SORT_ROUTES <= 32 * MOE_WARPS, "the in-block sort gives each route a thread");

// One expert slot of a call: the slot's expert (-1: fewer routed experts than
// slots), its routes' first place p0 in the grouped order, their count n and
// their route indices in route order (order[0..n)).
struct moe_slot {
    int32_t e, p0, n;
    const int32_t *order;
};

// The slot's expert and routes as k_moe_sort writes them.
RD_DEV moe_slot moe_slot_sorted(const moe_args &a, int32_t slot)
{
    moe_slot s;
    s.e = a.active[slot];
    s.p0 = s.e < 0 ? 0 : a.off[s.e];
    s.n = s.e < 0 ? 0 : a.off[s.e + 1] - s.p0;
    s.order = a.order + s.p0;
    return s;
}

// The same from the ids alone, by the whole block (m k <= MOE_SORT_ROUTES <=
// blockDim.x; call before any thread returns): thread t holds route t's id.
// The slot-th smallest distinct valid id is the slot's expert; its place is
// the count of valid routes with a smaller id (k_moe_sort's prefix sum), its
// routes those with its id, ascending.
RD_DEV moe_slot moe_slot_sort(const moe_args &a, int32_t slot)
{
    __shared__ int32_t s_id[MOE_SORT_ROUTES], s_first[MOE_SORT_ROUTES], s_order[MOE_SORT_ROUTES];
    __shared__ int32_t s_e, s_p0, s_n;
    const int32_t t = threadIdx.x, routes = a.m * a.k;
    const int32_t id = t < routes ? moe_route_expert(a, t) : -1;
    if (t < routes)
        s_id[t] = id;
    if (t == 0)
        s_e = -1, s_p0 = 0, s_n = 0;
    __syncthreads();
    bool first = id >= 0;
    for (int32_t u = 0; u < t && first; u++)
        first = s_id[u] != id;
    if (t < routes)
        s_first[t] = first;
    __syncthreads();
    if (first) {
        int32_t rank = 0, below = 0, n = 0;
        for (int32_t u = 0; u < routes; u++) {
            const int32_t v = s_id[u];
            rank += s_first[u] && v >= 0 && v < id;
            below += v >= 0 && v < id;
            n += v == id;
        }
        if (rank == slot)
            s_e = id, s_p0 = below, s_n = n;
    }
    __syncthreads();
    if (id >= 0 && id == s_e) {
        int32_t at = 0;
        for (int32_t u = 0; u < t; u++)
            at += s_id[u] == id;
        s_order[at] = t;
    }
    __syncthreads();
    moe_slot s;
    s.e = s_e;
    s.p0 = s_p0;
    s.n = s_n;
    s.order = s_order;
    return s;
}

template <bool SORT> RD_DEV moe_slot moe_slot_of(const moe_args &a, int32_t slot)
{
    return SORT ? moe_slot_sort(a, slot) : moe_slot_sorted(a, slot);
}

// Weight i of an expert's row: bf16 (w), or Q8_0 (codes w, fp16 scales d
// per 32: code x d, the exact float ggml_dequant_row gives).
template <bool Q8> RD_DEV float moe_w(const void *w, const uint16_t *d, int64_t i)
{
    if (Q8)
        return RD_FMUL((float)((const int8_t *)w)[i], cm_f16_to_f32(d[i / 32]));
    return cm_bf16_to_f32(((const uint16_t *)w)[i]);
}

// Lane `lane`'s partial dot products of NW weight rows w[] (Q8: codes, with
// scale rows d[]) with nx (<= MOE_RT) input rows x[], each of len elements,
// added into a[r][g]: the chunks c = lane, lane + 32, ... of 8 elements (8
// fmaf in order), then the tail elements 8 * (len / 8) + lane. VEC only
// picks 16-byte loads (weights and x aligned, len % 8 == 0); the arithmetic
// is the same either way, and the same for both weight formats given the
// same weight values.
template <int NW, bool VEC, bool Q8>
RD_DEV void lane_dots(const void *const (&w)[NW], const uint16_t *const (&d)[NW], const float *const (&x)[MOE_RT],
                      int32_t nx, int32_t len, int32_t lane, float (&a)[MOE_RT][NW])
{
    const int32_t chunks = len / 8;
    for (int32_t c = lane; c < chunks; c += 32) {
        float wv[NW][8];
RD_UNROLL
        for (int g = 0; g < NW; g++) {
            if (VEC && !Q8) {
                load_bf16x8((const uint16_t *)w[g] + (int64_t)c * 8, wv[g]);
            } else if (VEC) { // 8 codes (8 bytes), one block's scale
                const uint2 v = *(const uint2 *)((const int8_t *)w[g] + (int64_t)c * 8);
                const float s = cm_f16_to_f32(d[g][c / 4]);
RD_UNROLL
                for (int t = 0; t < 8; t++)
                    wv[g][t] = RD_FMUL((float)(int8_t)((t < 4 ? v.x : v.y) >> (8 * (t % 4))), s);
            } else {
RD_UNROLL
                for (int t = 0; t < 8; t++)
                    wv[g][t] = moe_w<Q8>(w[g], d[g], (int64_t)c * 8 + t);
            }
        }
RD_UNROLL
        for (int r = 0; r < MOE_RT; r++) {
            if (r >= nx)
                break;
            float xv[8];
            if (VEC) {
                load_f32x8(x[r] + (int64_t)c * 8, xv);
            } else {
RD_UNROLL
                for (int t = 0; t < 8; t++)
                    xv[t] = x[r][(int64_t)c * 8 + t];
            }
RD_UNROLL
            for (int g = 0; g < NW; g++)
RD_UNROLL
                for (int t = 0; t < 8; t++)
                    a[r][g] = fmaf(xv[t], wv[g][t], a[r][g]);
        }
    }
    for (int32_t t = chunks * 8 + lane; t < len; t += 32) {
        float wt[NW];
RD_UNROLL
        for (int g = 0; g < NW; g++)
            wt[g] = moe_w<Q8>(w[g], d[g], t);
RD_UNROLL
        for (int r = 0; r < MOE_RT; r++) {
            if (r >= nx)
                break;
            const float xt = x[r][t];
RD_UNROLL
            for (int g = 0; g < NW; g++)
                a[r][g] = fmaf(xt, wt[g], a[r][g]);
        }
    }
}

// act[p][o] = silu(gate_o . x) * (up_o . x) for the routes p of expert
// blockIdx.y, features o of this block's tile. The SwiGLU is k_swiglu's
// expression.
template <bool VEC, bool SORT>
__global__ void __launch_bounds__(32 * MOE_WARPS) k_moe_gate_up(moe_args a)
{
    RD_PDL_ENTRY();
    const moe_slot sl = moe_slot_of<SORT>(a, blockIdx.y);
    const int32_t e = sl.e, p0 = sl.p0, n = sl.n;
    if (e < 0)
        return; // the whole block: fewer experts routed than slots
    const int32_t warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int32_t o0 = (blockIdx.x * MOE_WARPS + warp) * MOE_GO;
    if (n == 0 || o0 >= a.ffn)
        return; // the whole warp: no shuffles below for it
    const void *wgu = a.table[e];
    const uint16_t *dgu = (const uint16_t *)a.table[2 * a.n_experts + e]; // Q8_0 scales, or NULL: bf16
    const int64_t es = dgu ? 1 : 2;                                       // bytes a weight
    const void *w[2 * MOE_GO];      // gate rows, then the matching up rows
    const uint16_t *d[2 * MOE_GO];  // their scale rows (Q8_0)
RD_UNROLL
    for (int g = 0; g < MOE_GO; g++) {
        const int32_t o = o0 + g < a.ffn ? o0 + g : a.ffn - 1; // past the end: a copy, not stored
        w[g] = (const char *)wgu + (int64_t)o * a.dim * es;
        w[MOE_GO + g] = (const char *)wgu + (int64_t)(a.ffn + o) * a.dim * es;
        d[g] = dgu + (int64_t)o * (a.dim / 32);
        d[MOE_GO + g] = dgu + (int64_t)(a.ffn + o) * (a.dim / 32);
    }
    for (int32_t q = 0; q < n; q += MOE_RT) {
        const int32_t nx = n - q < MOE_RT ? n - q : MOE_RT;
        const float *x[MOE_RT];
RD_UNROLL
        for (int r = 0; r < MOE_RT; r++)
            x[r] = a.x + (int64_t)(sl.order[q + (r < nx ? r : nx - 1)] / a.k) * a.dim;
        float acc[MOE_RT][2 * MOE_GO];
RD_UNROLL
        for (int r = 0; r < MOE_RT; r++)
RD_UNROLL
            for (int g = 0; g < 2 * MOE_GO; g++)
                acc[r][g] = 0.0f;
        if (dgu)
            lane_dots<2 * MOE_GO, VEC, true>(w, d, x, nx, a.dim, lane, acc);
        else
            lane_dots<2 * MOE_GO, VEC, false>(w, d, x, nx, a.dim, lane, acc);
RD_UNROLL
        for (int r = 0; r < MOE_RT; r++)
RD_UNROLL
            for (int g = 0; g < MOE_GO; g++) {
                const float gs = warp_allreduce(acc[r][g], op_add());
                const float us = warp_allreduce(acc[r][MOE_GO + g], op_add());
                if (lane == 0 && r < nx && o0 + g < a.ffn)
                    a.act[(int64_t)(p0 + q + r) * a.ffn + o0 + g] =
                        RD_FMUL(RD_FDIV(gs, RD_FADD(1.0f, expf(-gs))), us);
            }
    }
}

// h[route][c] = down_c . act[p] for the routes of slot sl's expert, features
// c0 .. c0 + MOE_GO - 1, by one warp.
template <bool VEC> RD_DEV void moe_down_warp(const moe_args &a, const moe_slot &sl, int32_t c0, int32_t lane)
{
    const int32_t e = sl.e, p0 = sl.p0, n = sl.n;
    const void *wd = a.table[a.n_experts + e];
    const uint16_t *dd = (const uint16_t *)a.table[3 * a.n_experts + e]; // Q8_0 scales, or NULL: bf16
    const int64_t es = dd ? 1 : 2;
    const void *w[MOE_GO];
    const uint16_t *d[MOE_GO];
RD_UNROLL
    for (int g = 0; g < MOE_GO; g++) {
        const int64_t row = c0 + g < a.dim ? c0 + g : a.dim - 1;
        w[g] = (const char *)wd + row * a.ffn * es;
        d[g] = dd + row * (a.ffn / 32);
    }
    for (int32_t q = 0; q < n; q += MOE_RT) {
        const int32_t nx = n - q < MOE_RT ? n - q : MOE_RT;
        const float *x[MOE_RT];
RD_UNROLL
        for (int r = 0; r < MOE_RT; r++)
            x[r] = a.act + (int64_t)(p0 + q + (r < nx ? r : nx - 1)) * a.ffn;
        float acc[MOE_RT][MOE_GO];
RD_UNROLL
        for (int r = 0; r < MOE_RT; r++)
RD_UNROLL
            for (int g = 0; g < MOE_GO; g++)
                acc[r][g] = 0.0f;
        if (dd)
            lane_dots<MOE_GO, VEC, true>(w, d, x, nx, a.ffn, lane, acc);
        else
            lane_dots<MOE_GO, VEC, false>(w, d, x, nx, a.ffn, lane, acc);
RD_UNROLL
        for (int r = 0; r < MOE_RT; r++)
RD_UNROLL
            for (int g = 0; g < MOE_GO; g++) {
                const float v = warp_allreduce(acc[r][g], op_add());
                if (lane == 0 && r < nx && c0 + g < a.dim)
                    a.h[(int64_t)sl.order[q + r] * a.dim + c0 + g] = v;
            }
    }
}

// The down products of slot blockIdx.y's expert for dim tile blockIdx.x;
// with COMBINE, the tile's last block to arrive (of gridDim.y, one per slot)
// then combines the tile's features for every row.
template <bool VEC, bool SORT, bool COMBINE>
__global__ void __launch_bounds__(32 * MOE_WARPS) k_moe_down(moe_args a)
{
    RD_PDL_ENTRY();
    const moe_slot sl = moe_slot_of<SORT>(a, blockIdx.y);
    const int32_t warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int32_t per = MOE_WARPS * MOE_GO, c0 = blockIdx.x * per + warp * MOE_GO;
    if (sl.e >= 0 && sl.n > 0 && c0 < a.dim) // the whole warp, or none of it
        moe_down_warp<VEC>(a, sl, c0, lane);
    if (!COMBINE || !last_to_arrive(&a.count[blockIdx.x], gridDim.y))
        return;
    const int32_t t0 = blockIdx.x * per, nc = a.dim - t0 < per ? a.dim - t0 : per;
    for (int32_t idx = threadIdx.x; idx < a.m * nc; idx += blockDim.x)
        moe_combine_one(a, a.pos, idx / nc, t0 + idx % nc);
}

__global__ void k_moe_combine(moe_args a)
{
    RD_PDL_ENTRY();
    const int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (int64_t)a.m * a.dim)
        return;
    moe_combine_one(a, a.pos, idx / a.dim, idx % a.dim);
}

template <bool VEC> static void launch_gate_up(cudaStream_t s, const moe_args &a, dim3 grid, bool sort)
{
    if (sort)
        RD_LAUNCH((k_moe_gate_up<VEC, true>), grid, dim3(32 * MOE_WARPS), 0, s, a);
    else
        RD_LAUNCH((k_moe_gate_up<VEC, false>), grid, dim3(32 * MOE_WARPS), 0, s, a);
}

template <bool VEC> static void launch_down(cudaStream_t s, const moe_args &a, dim3 grid, bool sort, bool combine)
{
    if (sort && combine)
        RD_LAUNCH((k_moe_down<VEC, true, true>), grid, dim3(32 * MOE_WARPS), 0, s, a);
    else if (sort)
        RD_LAUNCH((k_moe_down<VEC, true, false>), grid, dim3(32 * MOE_WARPS), 0, s, a);
    else if (combine)
        RD_LAUNCH((k_moe_down<VEC, false, true>), grid, dim3(32 * MOE_WARPS), 0, s, a);
    else
        RD_LAUNCH((k_moe_down<VEC, false, false>), grid, dim3(32 * MOE_WARPS), 0, s, a);
}

void launch_moe_ffn(cudaStream_t s, const moe_args &a)
{
    if (a.m <= 0)
        return;
    const int32_t routes = a.m * a.k;
    const bool tc = a.tc_wf >= 0;
    // (the tensor-core kernels' blocks, 32 x the plan's warps, must give each route a thread)
    const bool sort = a.count && routes <= MOE_SORT_ROUTES &&
                      (!tc || (routes <= 32 * a.pl_gu.wk && routes <= 32 * a.pl_down.wk));
    const bool combine = a.count && a.m <= MOE_COMBINE_ROWS;
    if (!sort) {
        const unsigned sort_threads = (unsigned)((a.n_experts + 31) / 32 * 32);
        RD_LAUNCH(k_moe_sort, dim3(1), dim3(sort_threads), 0, s, a.ids, routes, a.k, a.n_experts, a.off, a.order,
                  a.active, a.pos, a.xrow, a.work, a.n_work);
    }
    if (tc) {
        launch_moe_tc(s, a, sort, combine);
        if (!combine)
            RD_LAUNCH(k_moe_combine, dim3(blocks_for((int64_t)a.m * a.dim, 256)), dim3(256), 0, s, a);
        return;
    }
    const int per_block = MOE_WARPS * MOE_GO;
    // x rows are 16-byte aligned when x is and dim % 8 == 0; act's rows when ffn % 8 == 0.
    const bool vec_gu = a.w_aligned && a.dim % 8 == 0 && (uintptr_t)a.x % 16 == 0;
    const bool vec_down = a.w_aligned && a.ffn % 8 == 0 && (uintptr_t)a.act % 16 == 0;
    // expert slots: no more than the routes can reach (the grid depends on m, never on the ids)
    const unsigned slots = (unsigned)(routes < a.n_experts ? routes : a.n_experts);
    const dim3 g_gu(blocks_for(a.ffn, per_block), slots), g_down(moe_dim_tiles(a.dim), slots);
    if (vec_gu)
        launch_gate_up<true>(s, a, g_gu, sort);
    else
        launch_gate_up<false>(s, a, g_gu, sort);
    if (vec_down)
        launch_down<true>(s, a, g_down, sort, combine);
    else
        launch_down<false>(s, a, g_down, sort, combine);
    if (!combine)
        RD_LAUNCH(k_moe_combine, dim3(blocks_for((int64_t)a.m * a.dim, 256)), dim3(256), 0, s, a);
}

int32_t moe_dim_tiles(int32_t dim) { return (int32_t)blocks_for(dim, MOE_WARPS * MOE_GO); }

}  // namespace RD_NS
