/* cuda_plan.c - see cuda_plan.h. */
#include "kernels/cuda/cuda_plan.h"

#include "base/err.h"
#include "kernels/cuda/cuda_math.h"

int cuplan_attn_check(int32_t n_heads, int32_t n_kv_heads, int32_t head_dim)
{
    if (n_kv_heads <= 0 || n_heads <= 0 || n_heads % n_kv_heads)
        return rd_fail(RD_ENOTSUP, "cuda: %d heads / %d kv heads: need a whole number of query heads per kv head",
                       n_heads, n_kv_heads);
    if (n_heads / n_kv_heads > CUPLAN_ATTN_MAX_GROUP)
        return rd_fail(RD_ENOTSUP, "cuda: %d query heads per kv head; the attention kernel takes at most %d",
                       n_heads / n_kv_heads, CUPLAN_ATTN_MAX_GROUP);
    if (head_dim <= 0 || head_dim % 8 || head_dim > CUPLAN_ATTN_MAX_HD)
        return rd_fail(RD_ENOTSUP, "cuda: head_dim %d; the attention kernel takes multiples of 8 up to %d",
                       head_dim, CUPLAN_ATTN_MAX_HD);
    const size_t smem = cuplan_attn_layout(n_heads / n_kv_heads, head_dim).smem;
    if (smem > CUPLAN_ATTN_MAX_SMEM)
        return rd_fail(RD_ENOTSUP, "cuda: %d query heads per kv head at head_dim %d need %zu bytes of shared memory; "
                       "the attention kernel has %d", n_heads / n_kv_heads, head_dim, smem, CUPLAN_ATTN_MAX_SMEM);
    return 0;
}

int32_t cuplan_attn_z(int32_t rows, int32_t n_kv_heads, int32_t max_parts, int32_t n_sm, int32_t waves,
                      int32_t max_z)
{
    int64_t base = (int64_t)(rows > 0 ? rows : 1) * (n_kv_heads > 0 ? n_kv_heads : 1);
    int64_t want = (int64_t)(waves > 0 ? waves : 1) * (n_sm > 0 ? n_sm : 1);
    int64_t z = (want + base - 1) / base;
    if (z > max_z)
        z = max_z;
    if (max_parts > 0 && z > max_parts)
        z = max_parts;
    return z < 1 ? 1 : (int32_t)z;
}

void cuplan_to_bf16(const float *src, size_t n, uint16_t *dst)
{
    for (size_t i = 0; i < n; i++)
        dst[i] = cm_f32_to_bf16(src[i]);
}

void cuplan_from_bf16(const uint16_t *src, size_t n, float *dst)
{
    for (size_t i = 0; i < n; i++)
        dst[i] = cm_bf16_to_f32(src[i]);
}

int cuplan_pick_gemm(const cuplan_gemm_cand *c, int n)
{
    int best = -1;
    for (int i = 0; i < n; i++) {
        if (!c[i].invariant || !(c[i].t_small >= 0) || !(c[i].t_mid >= 0) || !(c[i].t_large >= 0))
            continue;
        if (best < 0 || c[i].t_small + c[i].t_mid + c[i].t_large < c[best].t_small + c[best].t_mid + c[best].t_large)
            best = i;
    }
    return best;
}

int cuplan_gemm_check_sizes(int32_t *out, int cap)
{
    static const int32_t sizes[] = {1, 2, 3, 5, 8, 13, 16, 24, 31, 32, 64, 100, 128, 200, 256, 512};
    int n = (int)(sizeof sizes / sizeof sizes[0]);
    if (n > cap)
        n = cap;
    for (int i = 0; i < n; i++)
        out[i] = sizes[i];
    return n;
}

/* Warps along K for a reduced length of `chunks` chunks of 32 weights: each warp takes at least 2 chunks,
 * so its loads overlap. */
static int32_t tc_warps(int32_t chunks)
{
    int32_t wk = 1;
    while (wk < CUPLAN_TC_MAX_WK && chunks % (2 * wk) == 0 && chunks / (2 * wk) >= 2)
        wk *= 2;
    return wk;
}

int cuplan_gemm_tc(int32_t out, int32_t in, int32_t n_sm, cuplan_tc *pl)
{
    if (out <= 0 || in <= 0 || in % 32)
        return RD_ENOTSUP;
    const int32_t chunks = in / 32, tiles = (out + CUPLAN_TC_NT - 1) / CUPLAN_TC_NT;
    const int32_t wk = tc_warps(chunks);
    /* CTAs along K until a batch-1 call has two per SM, each warp keeping
     * at least 4 chunks. */
    int32_t p = 1;
    const int64_t want = 2 * (int64_t)(n_sm > 0 ? n_sm : 1);
    while ((int64_t)tiles * p < want && chunks % (wk * p * 2) == 0 && chunks / (wk * p * 2) >= 4)
        p *= 2;
    pl->wk = wk;
    pl->p = p;
    pl->q = wk * p;
    pl->kp = in / pl->q;
    return 0;
}

int cuplan_moe_tc(int32_t in, cuplan_tc *pl)
{
    if (in <= 0 || in % 32)
        return RD_ENOTSUP;
    pl->wk = tc_warps(in / 32);
    pl->p = 1;
    pl->q = pl->wk;
    pl->kp = in / pl->q;
    return 0;
}

int32_t cuplan_tc_mw(int32_t m) { return m <= 16 ? 1 : m <= 32 ? 2 : 4; }

int cuplan_wg_groups(int32_t out, int32_t m, int32_t n_sm)
{
    const int64_t batch_tiles = ((int64_t)m + 63) / 64;
    for (int wgs = 4; wgs > 1; wgs /= 2)
        if (((int64_t)out + 64 * wgs - 1) / (64 * wgs) * batch_tiles >= n_sm)
            return wgs;
    return 1;
}
