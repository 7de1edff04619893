// cuda_attention.cu - paged causal attention, one kernel for prefill and
// decode rows alike.
//
// A row at position p attends to keys k0..p of its sequence through the
// block table: k0 = 0, or p - window + 1 on a sliding-window layer
// (cuplan_attn_key0). The keys are cut into partitions of CUPLAN_ATTN_PART
// from k0 on (fixed size, never a fixed count; a windowed row has at most
// ceil(window / CUPLAN_ATTN_PART)). k_attn_part computes, for one (row, kv head,
// partition), for each of the GQA group's query heads: the partition's max
// score m, its sum of exp s and its unnormalised P.V o; K and V are read once
// for the whole group. k_attn_combine folds the partitions in index order:
//   M = max_p m_p, w_p = exp(m_p - M), out = (sum_p w_p o_p) / (sum_p w_p s_p).
// With P.count (RD_CUDA_ATTN_FUSE, on by default) the combine runs in
// k_attn_part: the last of a (row, kv head)'s CTAs to finish (an arrival
// counter, reset by it) combines the group's heads with attn_combine_head,
// the code of k_attn_combine, so the bits are the same and a step has one
// attention kernel per layer instead of two.
// Every sum has an order fixed by the row's own position, the layer's window
// and the constant partition size, so a row's output is the same in a prefill step, a decode step, a
// CUDA graph of any bucket or next to any other rows. The grid's z dimension
// (CTAs per row and kv head) only decides which CTA computes which partition.
#include "kernels/cuda/cuda_internal.h"

namespace RD_NS {

#define AP CUPLAN_ATTN_PART
#define AT CUPLAN_ATTN_THREADS

// K (or V) element d of key j through the block table: bf16, or an FP8
// code times its (token, head) scale (kv_dtype fp8, cuda_kernels.cu's layout).
template <bool F8> struct kv_read;
template <> struct kv_read<false> {
    const uint16_t *base;
    RD_DEV kv_read(const uint16_t *cache, int64_t blk, int32_t kvh, int32_t t, const attn_params &P)
        : base(cache + ((blk * P.n_kv + kvh) * P.block_size + t) * P.head_dim) {}
    RD_DEV void get8(int32_t d, float *f) const { load_bf16x8(base + d, f); }
    RD_DEV void get2(int32_t d, float *f) const
    {
        const uint32_t vv = *(const uint32_t *)(base + d);
        f[0] = cm_u2f(vv << 16), f[1] = cm_u2f(vv & 0xffff0000u);
    }
};
template <> struct kv_read<true> {
    const uint8_t *codes;
    float s;
    RD_DEV kv_read(const uint16_t *cache, int64_t blk, int32_t kvh, int32_t t, const attn_params &P)
    {
        const int32_t nkv = P.n_kv, bs = P.block_size, hd = P.head_dim;
        const uint8_t *b = (const uint8_t *)cache + blk * kv8_block_bytes(nkv, bs, hd);
        codes = b + ((int64_t)kvh * bs + t) * hd;
        s = cm_fp8_scale(b[(int64_t)nkv * bs * hd + (int64_t)kvh * bs + t]);
    }
    RD_DEV void get8(int32_t d, float *f) const
    {
        for (int e = 0; e < 8; e++)
            f[e] = cm_fp8_scaled(codes[d + e], s);
    }
    RD_DEV void get2(int32_t d, float *f) const
    {
        f[0] = cm_fp8_scaled(codes[d], s), f[1] = cm_fp8_scaled(codes[d + 1], s);
    }
};

// Head h of row: its partitions folded in index order (threads tid, tid + nt, ... take
// the dimensions), written to out (and out_bf); zeros for a padding row.
RD_DEV void attn_combine_head(const attn_params &P, int32_t row, int32_t h, int32_t tid, int32_t nt)
{
    const int32_t hd = P.head_dim;
    float *out = P.out + (int64_t)row * P.n_heads * hd + (int64_t)h * hd;
    uint16_t *out_bf = P.out_bf ? P.out_bf + (int64_t)row * P.n_heads * hd + (int64_t)h * hd : nullptr;
    if (P.row_seq[row] < 0) {
        for (int32_t d = tid; d < hd; d += nt) {
            out[d] = 0.0f;
            if (out_bf)
                store_bf(out_bf, d, P.lo_off, 0.0f);
        }
        return;
    }
    const int32_t n_parts = cuplan_attn_row_parts(P.positions[row], P.window);
    if (n_parts > P.parts_cap) {
        for (int32_t d = tid; d < hd; d += nt)
            out[d] = NAN;
        return;
    }
    const int64_t base = ((int64_t)row * P.n_heads + h) * P.parts_cap;
    const float *ms = P.part_ms + base * 2;
    float mx = -INFINITY;
    for (int32_t p = 0; p < n_parts; p++)
        mx = fmaxf(mx, __ldcg(ms + 2 * p));
    float s = 0.0f;
    for (int32_t p = 0; p < n_parts; p++)
        s = fmaf(__ldcg(ms + 2 * p + 1), expf(__ldcg(ms + 2 * p) - mx), s);
    const float *po = P.part_o + base * hd;
    for (int32_t d = tid; d < hd; d += nt) {
        float o = 0.0f;
        for (int32_t p = 0; p < n_parts; p++)
            o = fmaf(__ldcg(po + (int64_t)p * hd + d), expf(__ldcg(ms + 2 * p) - mx), o);
        const float v = o / s;
        out[d] = v;
        if (out_bf)
            store_bf(out_bf, d, P.lo_off, v);
    }
}

// U, UV: keys a thread loads before it uses any of them, in the score phase
// (16 bytes of K each) and the P.V phase (4 bytes of V each); CUPLAN_ATTN_UNROLL
// and twice that, or 1 and 1 under RD_CUDA_ATTN_V0. At long contexts a
// CTA's loads in flight are what bounds its bandwidth. Each key's products
// and sums are the same whatever U and UV.
template <int GMAX, bool F8, int U, int UV>
__global__ void __launch_bounds__(AT) k_attn_part(attn_params P)
{
    RD_PDL_ENTRY();
    const int32_t row = blockIdx.x, kvh = blockIdx.y;
    const int32_t seq = P.row_seq[row];
    const int32_t g = P.n_heads / P.n_kv;
    if (seq < 0) { // padding row: zeros, from the combine kernel or here
        if (P.count && blockIdx.z == 0)
            for (int32_t gi = 0; gi < g; gi++)
                attn_combine_head(P, row, kvh * g + gi, threadIdx.x, AT);
        return;
    }
    const int32_t pos = P.positions[row];
    const int32_t k0 = cuplan_attn_key0(pos, P.window), n = pos + 1 - k0; // keys k0 .. pos
    int32_t n_parts = cuplan_attn_parts(n);
    if (n_parts > P.parts_cap)
        n_parts = P.parts_cap; // never: the host sizes parts_cap; the combine writes NaN then
    if ((int32_t)blockIdx.z >= n_parts)
        return;
    const int32_t hd = P.head_dim, bs = P.block_size, nkv = P.n_kv;
    const cuplan_attn L = cuplan_attn_layout(g, hd);
    const int32_t *table = P.block_tables + (int64_t)seq * *P.table_stride;
    const int32_t tid = threadIdx.x;

    RD_DYN_SMEM(float, smem);
    float *qs = smem;                    // [g][hd]
    float *sc = qs + g * hd;             // [g][AP]
    float *red = sc + g * AP;            // [kl][g][hd]

    const float *qrow = P.q + (int64_t)row * P.q_stride + (int64_t)kvh * g * hd;
    for (int32_t i = tid; i < g * hd; i += AT)
        qs[i] = qrow[i];
    __syncthreads();

    const int32_t grp = tid / L.tg, li = tid % L.tg, d0 = li * 8;
    const bool lane_on = d0 < hd;
    const int32_t dpi = tid % L.dp, kli = tid / L.dp;
    const bool pv_on = kli < L.kl;

    for (int32_t p = blockIdx.z; p < n_parts; p += P.z) {
        const int32_t j0 = k0 + p * AP; // the partition's first key
        const int32_t len = n - p * AP < AP ? n - p * AP : AP;

        // 1. scores: L.tg lanes per key, L.ng keys per round, U rounds' keys loaded first.
        for (int32_t base = 0; base < len; base += U * L.ng) {
            float kf[U][8];
RD_UNROLL
            for (int u = 0; u < U; u++) {
                const int32_t jj = base + u * L.ng + grp;
                for (int e = 0; e < 8; e++)
                    kf[u][e] = 0.0f;
                if (jj < len && lane_on) {
                    const int32_t j = j0 + jj;
                    kv_read<F8>(P.k_cache, table[j / bs], kvh, j % bs, P).get8(d0, kf[u]);
                }
            }
RD_UNROLL
            for (int u = 0; u < U; u++) {
                if (base + u * L.ng >= len)
                    break; // the whole block: base is the same in every thread
                const int32_t jj = base + u * L.ng + grp;
                const bool valid = jj < len;
RD_UNROLL
                for (int gi = 0; gi < GMAX; gi++) {
                    if (gi >= g)
                        break;
                    float part = 0.0f;
                    if (lane_on)
                        for (int e = 0; e < 8; e++)
                            part = fmaf(qs[gi * hd + d0 + e], kf[u][e], part);
                    for (int o = L.tg / 2; o > 0; o >>= 1)
                        part += __shfl_xor_sync(0xffffffffu, part, o);
                    if (valid && li == 0)
                        sc[gi * AP + jj] = part * P.scale;
                }
            }
        }
        __syncthreads();

        // 2. per query head: max, exp, sum.
        for (int32_t gi = 0; gi < g; gi++) {
            float mx = -INFINITY;
            for (int32_t jj = tid; jj < len; jj += AT)
                mx = fmaxf(mx, sc[gi * AP + jj]);
            mx = block_allreduce(mx, op_max());
            float sum = 0.0f;
            for (int32_t jj = tid; jj < len; jj += AT) {
                const float e = expf(sc[gi * AP + jj] - mx);
                sc[gi * AP + jj] = e;
                sum += e;
            }
            sum = block_allreduce(sum, op_add());
            if (tid == 0) {
                float *ms = P.part_ms + (((int64_t)row * P.n_heads + kvh * g + gi) * P.parts_cap + p) * 2;
                ms[0] = mx;
                ms[1] = sum;
            }
        }
        __syncthreads();

        // 3. P.V: thread (kli, dpi) takes keys kli, kli + kl, ... and the value
        //    pair dpi; the kl partial sums then meet in order.
        float acc[GMAX][2];
RD_UNROLL
        for (int gi = 0; gi < GMAX; gi++)
            acc[gi][0] = acc[gi][1] = 0.0f;
        if (pv_on) {
            for (int32_t jb = kli; jb < len; jb += UV * L.kl) {
                float vp[UV][2];
RD_UNROLL
                for (int u = 0; u < UV; u++) {
                    const int32_t j = j0 + jb + u * L.kl;
                    vp[u][0] = vp[u][1] = 0.0f;
                    if (jb + u * L.kl < len)
                        kv_read<F8>(P.v_cache, table[j / bs], kvh, j % bs, P).get2(2 * dpi, vp[u]);
                }
RD_UNROLL
                for (int u = 0; u < UV; u++) {
                    const int32_t jj = jb + u * L.kl; // keys in increasing order, as one at a time
                    if (jj >= len)
                        break;
RD_UNROLL
                    for (int gi = 0; gi < GMAX; gi++) {
                        if (gi >= g)
                            break;
                        const float e = sc[gi * AP + jj];
                        acc[gi][0] = fmaf(e, vp[u][0], acc[gi][0]);
                        acc[gi][1] = fmaf(e, vp[u][1], acc[gi][1]);
                    }
                }
            }
RD_UNROLL
            for (int gi = 0; gi < GMAX; gi++) {
                if (gi >= g)
                    break;
                red[(kli * g + gi) * hd + 2 * dpi] = acc[gi][0];
                red[(kli * g + gi) * hd + 2 * dpi + 1] = acc[gi][1];
            }
        }
        __syncthreads();
        for (int32_t i = tid; i < g * hd; i += AT) {
            const int32_t gi = i / hd, d = i % hd;
            float s = red[gi * hd + d];
            for (int32_t k = 1; k < L.kl; k++)
                s += red[(k * g + gi) * hd + d];
            P.part_o[(((int64_t)row * P.n_heads + kvh * g + gi) * P.parts_cap + p) * hd + d] = s;
        }
        __syncthreads(); // sc and red are reused by the next partition
    }
    if (!P.count)
        return;
    // The CTAs of this (row, kv head) that have partitions: min(z, n_parts).
    const unsigned arrivals = (unsigned)(P.z < n_parts ? P.z : n_parts);
    const int64_t slot = (int64_t)row * nkv + kvh;
    if (!last_to_arrive(&P.count[slot], arrivals))
        return;
    for (int32_t gi = 0; gi < g; gi++)
        attn_combine_head(P, row, kvh * g + gi, tid, AT);
}

__global__ void __launch_bounds__(AT) k_attn_combine(attn_params P)
{
    RD_PDL_ENTRY();
    attn_combine_head(P, blockIdx.x, blockIdx.y, threadIdx.x, blockDim.x);
}

template <int GMAX, int U> static void launch_part_u(cudaStream_t s, const attn_params &p, size_t smem)
{
    if (p.fp8) {
        auto kern = k_attn_part<GMAX, true, U, U == 1 ? 1 : 2 * U>;
        RD_LAUNCH(kern, dim3(p.rows, p.n_kv, p.z), dim3(AT), smem, s, p);
    } else {
        auto kern = k_attn_part<GMAX, false, U, U == 1 ? 1 : 2 * U>;
        RD_LAUNCH(kern, dim3(p.rows, p.n_kv, p.z), dim3(AT), smem, s, p);
    }
}

template <int GMAX> static void launch_part(cudaStream_t s, const attn_params &p, size_t smem)
{
    if (p.unroll == CUPLAN_ATTN_UNROLL)
        launch_part_u<GMAX, CUPLAN_ATTN_UNROLL>(s, p, smem);
    else
        launch_part_u<GMAX, 1>(s, p, smem);
}

void launch_attention(cudaStream_t s, const attn_params &p)
{
    if (p.rows <= 0)
        return;
    const int32_t g = p.n_heads / p.n_kv;
    const size_t smem = cuplan_attn_layout(g, p.head_dim).smem;
    if (g <= 1)
        launch_part<1>(s, p, smem);
    else if (g <= 2)
        launch_part<2>(s, p, smem);
    else if (g <= 4)
        launch_part<4>(s, p, smem);
    else if (g <= 8)
        launch_part<8>(s, p, smem);
    else
        launch_part<16>(s, p, smem);
    if (!p.count)
        RD_LAUNCH(k_attn_combine, dim3(p.rows, p.n_heads), dim3(AT), 0, s, p);
}

}  // namespace RD_NS
