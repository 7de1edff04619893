/* moe.c - routing and grouped experts on the CPU (see moe.h). */
#include "kernels/cpu/moe.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/err.h"

void cpu_moe_route(const float *logits, int32_t m, int32_t n_experts, int32_t k, int norm, int32_t *ids,
                   float *weights)
{
    float p[RD_MOE_MAX_EXPERTS];
    for (int32_t i = 0; i < m; i++) {
        const float *l = logits + (size_t)i * n_experts;
        float mx = l[0];
        for (int32_t e = 1; e < n_experts; e++)
            mx = l[e] > mx ? l[e] : mx;
        float sum = 0.0f;
        for (int32_t e = 0; e < n_experts; e++) {
            p[e] = expf(l[e] - mx);
            sum += p[e];
        }
        for (int32_t e = 0; e < n_experts; e++)
            p[e] = p[e] / sum;
        /* k passes of a max scan: strictly greater wins, so a tie keeps the
         * lower id; a taken expert is marked -1 (every p is >= 0). */
        int32_t *id = ids + (size_t)i * k;
        float *w = weights + (size_t)i * k;
        float wsum = 0.0f;
        for (int32_t j = 0; j < k; j++) {
            int32_t best = -1;
            for (int32_t e = 0; e < n_experts; e++)
                if (p[e] >= 0.0f && (best < 0 || p[e] > p[best]))
                    best = e;
            /* NaN logits (a NaN hidden state): the first expert not taken,
             * with its NaN weight, so the row stays NaN and in range. */
            for (int32_t e = 0; best < 0 && e < n_experts; e++)
                if (p[e] != -1.0f)
                    best = e;
            id[j] = best;
            w[j] = p[best];
            wsum += p[best];
            p[best] = -1.0f;
        }
        if (norm)
            for (int32_t j = 0; j < k; j++)
                w[j] = w[j] / wsum;
    }
}

static int grow(cpu_moe_scratch *s, size_t floats, size_t ints)
{
    if (floats > s->cap) {
        float *b = aligned_alloc(64, (floats * sizeof(float) + 63) & ~(size_t)63);
        if (!b)
            return rd_fail(RD_ENOMEM, "cpu: cannot allocate %zu bytes of MoE scratch", floats * sizeof(float));
        free(s->buf);
        s->buf = b;
        s->cap = floats;
    }
    if (ints > s->order_cap) {
        int32_t *o = malloc(ints * sizeof(int32_t));
        if (!o)
            return rd_fail(RD_ENOMEM, "cpu: cannot allocate the MoE route order");
        free(s->order);
        s->order = o;
        s->order_cap = ints;
    }
    return 0;
}

void cpu_moe_ffn(rd_backend *be, cpu_moe_scratch *s, const rd_moe *moe, const float *x, const int32_t *ids,
                 const float *weights, int32_t m, int32_t k, float *y)
{
    const int32_t d = moe->dim, f = moe->ffn, E = moe->n_experts;
    const size_t routes = (size_t)m * k;
    if (m <= 0)
        return;
    /* h: [routes][d] every route's expert output, in route order; then the
     * per-expert blocks: xs [n][d], gu [n][2f], ff [n][f], hs [n][d]. The
     * blocks are sized for the largest expert, at most m rows (a row routes
     * to an expert once). */
    const size_t h_floats = routes * d, blk = (size_t)m;
    if (grow(s, h_floats + blk * ((size_t)d + 2 * (size_t)f + (size_t)f + (size_t)d), routes)) {
        /* Out of memory: the ops return nothing, so the rows are made NaN,
         * which the sampler refuses: those requests fail, the daemon goes on. */
        for (size_t i = 0; i < (size_t)m * d; i++)
            y[i] = NAN;
        return;
    }
    float *h = s->buf, *xs = h + h_floats, *gu = xs + blk * d, *ff = gu + blk * 2 * f, *hs = ff + blk * f;

    /* Counting sort of the routes by expert (stable: rows in order). */
    int32_t count[RD_MOE_MAX_EXPERTS + 1];
    memset(count, 0, sizeof(int32_t) * (size_t)(E + 1));
    /* An id out of range (never from moe_route) adds nothing, as on CUDA. */
    for (size_t r = 0; r < routes; r++)
        if (ids[r] >= 0 && ids[r] < E)
            count[ids[r] + 1]++;
    for (int32_t e = 0; e < E; e++)
        count[e + 1] += count[e];
    int32_t at[RD_MOE_MAX_EXPERTS];
    memcpy(at, count, sizeof(int32_t) * (size_t)E);
    for (size_t r = 0; r < routes; r++)
        if (ids[r] >= 0 && ids[r] < E)
            s->order[at[ids[r]]++] = (int32_t)r;
        else
            memset(h + r * d, 0, sizeof(float) * (size_t)d);

    const rd_backend_ops *op = be->ops;
    for (int32_t e = 0; e < E; e++) {
        const int32_t n = count[e + 1] - count[e];
        if (n == 0)
            continue;
        const int32_t *rs = s->order + count[e];
        for (int32_t i = 0; i < n; i++)
            memcpy(xs + (size_t)i * d, x + (size_t)(rs[i] / k) * d, sizeof(float) * (size_t)d);
        op->linear(be, moe->gate_up[e], xs, n, gu, 0);
        op->swiglu(be, gu, n, f, ff);
        op->linear(be, moe->down[e], ff, n, hs, 0);
        for (int32_t i = 0; i < n; i++)
            memcpy(h + (size_t)rs[i] * d, hs + (size_t)i * d, sizeof(float) * (size_t)d);
    }

    for (int32_t i = 0; i < m; i++) {
        float *yi = y + (size_t)i * d;
        const float *w = weights + (size_t)i * k;
        for (int32_t c = 0; c < d; c++) {
            float acc = 0.0f;
            for (int32_t j = 0; j < k; j++)
                acc = fmaf(w[j], h[((size_t)i * k + j) * d + c], acc);
            yi[c] += acc;
        }
    }
}

void cpu_moe_scratch_free(cpu_moe_scratch *s)
{
    free(s->buf);
    free(s->order);
    memset(s, 0, sizeof *s);
}
