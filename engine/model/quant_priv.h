/* quant_priv.h - quant.c's Q4_K lane loop, included by quant.c once per
 * vector width (a template: C has no other way to write one body for two
 * widths). Before each inclusion quant.c defines
 *   Q4K_W     lanes per vector (4: SSE2, the x86-64 baseline; 8: AVX2),
 *   Q4K_ROWS  the name of the function to define,
 *   Q4K_ATTR  its attributes (the target);
 * this file undefines them. See quant.c's Q4_K comment for the steps and
 * why each is what it is.
 *
 * Lane k of group g fits sub-block g * Q4K_W + k; each lane performs its
 * sub-block's operations exactly as ggml does, one fp32 operation at a time
 * in ggml's order (vector arithmetic is lane-wise IEEE, like the scalar
 * instructions ggml runs). Where ggml branches, both sides are computed and
 * a comparison's mask keeps ggml's; the side not taken may compute inf or
 * NaN (a division by a zero D, say), harmlessly: nothing traps, and it is
 * masked off. Helpers are macros: a function taking or returning 32-byte
 * vectors changes the ABI on the baseline build (GCC's -Wpsabi), even when
 * inlined. */

#define Q4K_CAT2(a, b) a##b
#define Q4K_CAT(a, b) Q4K_CAT2(a, b)
#define Q4K_VF Q4K_CAT(q4k_vf, Q4K_W)
#define Q4K_VI Q4K_CAT(q4k_vi, Q4K_W)
#define Q4K_G (8 / Q4K_W)          /* groups of lanes per super-block */

typedef float Q4K_VF __attribute__((vector_size(4 * Q4K_W)));
typedef int32_t Q4K_VI __attribute__((vector_size(4 * Q4K_W)));

#ifndef Q4K_SEL
/* m ? a : b lane by lane, of type t (m: a comparison's all-ones or zero lanes). */
#define Q4K_SEL(t, vi, m, a, b) ((t)(((m) & (vi)(a)) | (~(m) & (vi)(b))))
/* ggml's nearest_int lane by lane, as q4k_nearest. */
#define Q4K_NEAREST(vi, v) (((vi)((v) + 12582912.0f) & 0x007fffff) - 0x00400000)
/* ggml's MAX(0, MIN(15, l)), into l. */
#define Q4K_CLAMP15(vi, l)                                                 \
    do {                                                                   \
        vi c15_ = ((l) - (l)) + 15;                                        \
        (l) = Q4K_SEL(vi, vi, (l) > 15, c15_, (l));                        \
        (l) = Q4K_SEL(vi, vi, (l) < 0, (l) - (l), (l));                    \
    } while (0)
#endif

Q4K_ATTR static int Q4K_ROWS(const float *restrict x, uint64_t nb, uint8_t *restrict out, uint64_t *bad,
                             float *big, int *is_min)
{
    for (uint64_t b = 0; b < nb; b++, x += GGML_Q4_K_BLOCK, out += GGML_Q4_K_BYTES) {
        Q4K_VF xt[Q4K_G][32], zero = {0};
        Q4K_VI L[Q4K_G][32];
        float scale[8], min[8], d[8], dm[8];
        for (int g = 0; g < Q4K_G; g++)
            for (int i = 0; i < 32; i++)
                for (int k = 0; k < Q4K_W; k++)
                    xt[g][i][k] = x[32 * (g * Q4K_W + k) + i];

        /* Step 1, per group: weights, then make_qkx2_quants. */
        for (int g = 0; g < Q4K_G; g++) {
            const Q4K_VF *xs = xt[g];
            Q4K_VI *l = L[g], la[32];
            Q4K_VF w[32], sum_x2 = zero, av_x;
            for (int i = 0; i < 32; i++)
                sum_x2 += xs[i] * xs[i];
            sum_x2 = sum_x2 / 32.0f;
            for (int k = 0; k < Q4K_W; k++)
                av_x[k] = sqrtf(sum_x2[k]);
            for (int i = 0; i < 32; i++)
                w[i] = av_x + (Q4K_VF)((Q4K_VI)xs[i] & 0x7fffffff);

            Q4K_VF mn = xs[0], mx = xs[0], sum_w = w[0], sum_x = w[0] * xs[0];
            for (int i = 1; i < 32; i++) {
                mn = Q4K_SEL(Q4K_VF, Q4K_VI, xs[i] < mn, xs[i], mn);
                mx = Q4K_SEL(Q4K_VF, Q4K_VI, xs[i] > mx, xs[i], mx);
                sum_w += w[i];
                sum_x += w[i] * xs[i];
            }
            mn = Q4K_SEL(Q4K_VF, Q4K_VI, mn > 0, zero, mn);
            Q4K_VI flat = mx == mn;
            Q4K_VF flat_min = mn;
            Q4K_VF iscale = 15 / (mx - mn), sc = 1 / iscale, best_error = zero;
            for (int i = 0; i < 32; i++) {
                l[i] = Q4K_NEAREST(Q4K_VI, iscale * (xs[i] - mn));
                Q4K_CLAMP15(Q4K_VI, l[i]);
                Q4K_VF diff = sc * __builtin_convertvector(l[i], Q4K_VF) + mn - xs[i];
                best_error += w[i] * (diff * diff);
            }
            for (int is = 0; is <= 20; is++) {
                iscale = (-1.0f + 0.1f * (float)is + 15) / (mx - mn);
                Q4K_VF sum_l = zero, sum_l2 = zero, sum_xl = zero;
                for (int i = 0; i < 32; i++) {
                    la[i] = Q4K_NEAREST(Q4K_VI, iscale * (xs[i] - mn));
                    Q4K_CLAMP15(Q4K_VI, la[i]);
                    Q4K_VF lf = __builtin_convertvector(la[i], Q4K_VF);
                    sum_l += w[i] * lf;
                    sum_l2 += w[i] * lf * lf;
                    sum_xl += w[i] * lf * xs[i];
                }
                Q4K_VF D = sum_w * sum_l2 - sum_l * sum_l;
                Q4K_VF this_scale = (sum_w * sum_xl - sum_x * sum_l) / D;
                Q4K_VF this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D;
                Q4K_VI pos = this_min > 0;
                this_min = Q4K_SEL(Q4K_VF, Q4K_VI, pos, zero, this_min);
                this_scale = Q4K_SEL(Q4K_VF, Q4K_VI, pos, sum_xl / sum_l2, this_scale);
                Q4K_VF cur_error = zero;
                for (int i = 0; i < 32; i++) {
                    Q4K_VF diff = this_scale * __builtin_convertvector(la[i], Q4K_VF) + this_min - xs[i];
                    cur_error += w[i] * (diff * diff);
                }
                Q4K_VI take = (D > 0) & (cur_error < best_error);
                for (int i = 0; i < 32; i++)
                    l[i] = Q4K_SEL(Q4K_VI, Q4K_VI, take, la[i], l[i]);
                best_error = Q4K_SEL(Q4K_VF, Q4K_VI, take, cur_error, best_error);
                sc = Q4K_SEL(Q4K_VF, Q4K_VI, take, this_scale, sc);
                mn = Q4K_SEL(Q4K_VF, Q4K_VI, take, this_min, mn);
            }
            sc = Q4K_SEL(Q4K_VF, Q4K_VI, flat, zero, sc);
            mn = Q4K_SEL(Q4K_VF, Q4K_VI, flat, flat_min, mn);
            for (int i = 0; i < 32; i++)
                l[i] = Q4K_SEL(Q4K_VI, Q4K_VI, flat, l[i] - l[i], l[i]);
            for (int k = 0; k < Q4K_W; k++) {
                scale[g * Q4K_W + k] = sc[k];
                min[g * Q4K_W + k] = -mn[k];
            }
        }

        /* Step 2. */
        if (q4k_scales(scale, min, out, d, dm, big, is_min)) {
            *bad = b;
            return 1;
        }

        /* Step 3, per group: re-quantize where d_fp16 * sc is not 0. */
        for (int g = 0; g < Q4K_G; g++) {
            Q4K_VF dv, dmv;
            for (int k = 0; k < Q4K_W; k++) {
                dv[k] = d[g * Q4K_W + k];
                dmv[k] = dm[g * Q4K_W + k];
            }
            Q4K_VI keep = dv == 0;
            for (int i = 0; i < 32; i++) {
                Q4K_VI q = Q4K_NEAREST(Q4K_VI, (xt[g][i] + dmv) / dv);
                Q4K_CLAMP15(Q4K_VI, q);
                L[g][i] = Q4K_SEL(Q4K_VI, Q4K_VI, keep, L[g][i], q);
            }
        }
        /* 32 bytes per pair of sub-blocks: 2c in the low nibbles, 2c + 1 in the high. */
        uint8_t *qs = out + 16;
        for (int c = 0; c < 4; c++) {
            int j0 = 2 * c, j1 = 2 * c + 1;
            for (int i = 0; i < 32; i++)
                qs[32 * c + i] = (uint8_t)(L[j0 / Q4K_W][i][j0 % Q4K_W] | L[j1 / Q4K_W][i][j1 % Q4K_W] << 4);
        }
    }
    return 0;
}

#undef Q4K_G
#undef Q4K_VI
#undef Q4K_VF
#undef Q4K_W
#undef Q4K_ROWS
#undef Q4K_ATTR
