/* cuda_math.h - scalar math shared by the CUDA kernels and the host.
 *
 * Written in the common subset of C11, C++17 and CUDA so one copy serves the
 * device (nvcc), the host-side emulator build (g++) and the C unit tests
 * (tests/unit/test_cuda_host.c checks it against engine/serve/sampler.c). Every
 * function is a pure function of its arguments.
 *
 * bf16 is stored as uint16_t (the top half of an IEEE float); conversions are
 * integer operations, so device, emulator and host round identically.
 * RD_FMUL/RD_FADD/RD_FSUB/RD_FDIV are single IEEE operations in round-to-
 * nearest-even: on the device they are the __f*_rn intrinsics, which nvcc never
 * fuses into an FMA, so a * b - c * d computes exactly what the CPU backend
 * (compiled as ISO C, no contraction) computes. */
#ifndef RD_CUDA_MATH_H
#define RD_CUDA_MATH_H

#include <stdint.h>
#include <string.h>

#if defined(__CUDACC__)
#define RD_HD __host__ __device__ __forceinline__
#else
#define RD_HD static inline
#endif

#if defined(__CUDA_ARCH__)
#define RD_FMUL(a, b) __fmul_rn((a), (b))
#define RD_FADD(a, b) __fadd_rn((a), (b))
#define RD_FSUB(a, b) __fsub_rn((a), (b))
#define RD_FDIV(a, b) __fdiv_rn((a), (b))
#else
#define RD_FMUL(a, b) ((float)(a) * (float)(b))
#define RD_FADD(a, b) ((float)(a) + (float)(b))
#define RD_FSUB(a, b) ((float)(a) - (float)(b))
#define RD_FDIV(a, b) ((float)(a) / (float)(b))
#endif

/* The same in double (tanh's internals). */
#if defined(__CUDA_ARCH__)
#define RD_DMUL(a, b) __dmul_rn((a), (b))
#define RD_DADD(a, b) __dadd_rn((a), (b))
#define RD_DSUB(a, b) __dsub_rn((a), (b))
#define RD_DDIV(a, b) __ddiv_rn((a), (b))
#else
#define RD_DMUL(a, b) ((double)(a) * (double)(b))
#define RD_DADD(a, b) ((double)(a) + (double)(b))
#define RD_DSUB(a, b) ((double)(a) - (double)(b))
#define RD_DDIV(a, b) ((double)(a) / (double)(b))
#endif

RD_HD uint32_t cm_f2u(float f)
{
#if defined(__CUDA_ARCH__)
    return __float_as_uint(f);
#else
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
#endif
}

RD_HD float cm_u2f(uint32_t u)
{
#if defined(__CUDA_ARCH__)
    return __uint_as_float(u);
#else
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
#endif
}

/* ---- bf16 ---- */

/* fp32 -> bf16, round to nearest even; NaN stays a (quiet) NaN with its sign;
 * values past the largest bf16 round to +-inf as IEEE rounding says. */
RD_HD uint16_t cm_f32_to_bf16(float f)
{
    uint32_t u = cm_f2u(f);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((u >> 16) | 0x0040u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

RD_HD float cm_bf16_to_f32(uint16_t h) { return cm_u2f((uint32_t)h << 16); }

/* IEEE half -> fp32, exactly (integer operations; subnormals as man * 2^-24,
 * one exact product): LoRA weights held in the file's f16. */
RD_HD float cm_f16_to_f32(uint16_t h)
{
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (uint32_t)(h >> 10) & 0x1fu, man = h & 0x3ffu;
    if (e == 0x1fu)
        return cm_u2f(sign | 0x7f800000u | man << 13);
    if (e == 0)
        return cm_u2f(sign | cm_f2u(RD_FMUL((float)man, 5.9604644775390625e-08f)));
    return cm_u2f(sign | (e + 112u) << 23 | man << 13);
}

/* fp32 -> IEEE half, round to nearest even (safetensors.c's st_f32_to_f16:
 * overflow to inf, subnormal halves, NaN kept quiet): the rounding of a Q8_0
 * block's scale. */
RD_HD uint16_t cm_f32_to_f16(float f)
{
    const uint32_t x = cm_f2u(f), sign = x >> 16 & 0x8000u, ex = x >> 23 & 0xffu, man = x & 0x7fffffu;
    if (ex == 0xffu)
        return (uint16_t)(sign | 0x7c00u | (man ? 0x200u | (man >> 13) : 0u));
    const int e = (int)ex - 127 + 15;
    if (e >= 31)
        return (uint16_t)(sign | 0x7c00u);
    if (e <= 0) {
        if (e < -10)
            return (uint16_t)sign;
        const uint32_t m = man | 0x800000u, shift = (uint32_t)(14 - e);
        uint32_t h = m >> shift;
        const uint32_t rem = m & ((1u << shift) - 1u), half = 1u << (shift - 1u);
        if (rem > half || (rem == half && (h & 1u)))
            h++;
        return (uint16_t)(sign | h);
    }
    uint32_t h = (uint32_t)e << 10 | man >> 13;
    const uint32_t rem = man & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1u)))
        h++;
    return (uint16_t)(sign | h);
}

/* ---- FP8 E4M3 (the KV cache's kv_dtype fp8; the rounding of engine/model/quant_fp8.c) ---- */

/* The E4M3 code nearest v, ties to the even code, saturated at +-448; NaN
 * gives 0x7f with v's sign. */
RD_HD uint8_t cm_fp8_from_f32(float v)
{
    const uint32_t u = cm_f2u(v);
    const uint8_t sign = (uint8_t)(u >> 24 & 0x80u);
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u)
        return (uint8_t)(sign | 0x7fu);
    if (a >= 0x43e00000u)       /* 448 */
        return (uint8_t)(sign | 0x7eu);
    if (a < 0x3c800000u) {      /* below 2^-6: subnormal codes, steps of 2^-9 (a x 2^9 rounded by 2^23) */
        const float q = RD_FSUB(RD_FADD(RD_FMUL(cm_u2f(a), 512.0f), 8388608.0f), 8388608.0f);
        return (uint8_t)(sign | (uint8_t)q);
    }
    a += 0x7ffffu + (a >> 20 & 1u); /* keep 3 mantissa bits, nearest even; a carry moves the exponent */
    a &= ~0xfffffu;
    return (uint8_t)(sign | (((a >> 23) - 120u) << 3 | (a >> 20 & 7u)));
}

/* The least e in [-117, 7] with max|x| <= 448 x 2^e, from the bits of max|x|
 * (0 for 0); engine/model/quant_fp8.c's block rule with its range clamped. */
RD_HD int cm_fp8_block_exp(uint32_t amax_bits)
{
    if (!amax_bits)
        return 0;
    int e = (int)(amax_bits >> 23) - 135 + ((amax_bits & 0x7fffffu) > 0x600000u);
    return e < -117 ? -117 : e > 7 ? 7 : e;
}

/* The value of code c (0x7f / 0xff read as 480: callers mark NaN by the
 * scale) times s = 2^(120 + e): the code's bits in fp32's fields are 2^-120
 * times its value, subnormals included, and the product is exact. */
RD_HD float cm_fp8_scaled(uint32_t c, float s)
{
    return RD_FMUL(cm_u2f((c & 0x80u) << 24 | (c & 0x7fu) << 20), s);
}

/* s for cm_fp8_scaled from a scale byte e + 127 (0xff: NaN, a non-finite source). */
RD_HD float cm_fp8_scale(uint32_t byte) { return byte == 0xffu ? cm_u2f(0x7fc00000u) : cm_u2f((byte + 120u) << 23); }

/* ---- the sampler's counter-based RNG (engine/serve/sampler.c has the spec) ---- */

RD_HD void cm_philox4x32_10(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4])
{
    uint32_t c0 = ctr[0], c1 = ctr[1], c2 = ctr[2], c3 = ctr[3];
    uint32_t k0 = key[0], k1 = key[1];
    for (int r = 0; r < 10; r++) {
        uint64_t p0 = (uint64_t)0xD2511F53u * c0;
        uint64_t p1 = (uint64_t)0xCD9E8D57u * c2;
        uint32_t n0 = (uint32_t)(p1 >> 32) ^ c1 ^ k0;
        uint32_t n1 = (uint32_t)p1;
        uint32_t n2 = (uint32_t)(p0 >> 32) ^ c3 ^ k1;
        uint32_t n3 = (uint32_t)p0;
        c0 = n0;
        c1 = n1;
        c2 = n2;
        c3 = n3;
        k0 += 0x9E3779B9u;
        k1 += 0xBB67AE85u;
    }
    out[0] = c0;
    out[1] = c1;
    out[2] = c2;
    out[3] = c3;
}

/* samp_uniform: a double in [0,1) with 53 random bits, exact in double. */
RD_HD double cm_uniform(uint64_t seed, uint32_t sample_idx, uint32_t pos)
{
    const uint32_t ctr[4] = {sample_idx, pos, 0u, 0u};
    const uint32_t key[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)};
    uint32_t out[4];
    cm_philox4x32_10(ctr, key, out);
    uint64_t bits = ((uint64_t)out[1] << 32 | out[0]) >> 11;
    return (double)bits * (1.0 / 9007199254740992.0); /* 2^-53 */
}

/* ---- the sampler's ordering and weights (bit-exact copies of sampler.c) ---- */

/* An int32 whose signed order is the float order; -0 maps to +0. */
RD_HD int32_t cm_logit_order(float x)
{
    uint32_t u = cm_f2u(x);
    if (u == 0x80000000u)
        u = 0;
    return (u & 0x80000000u) ? (int32_t)(u ^ 0x7fffffffu) : (int32_t)u;
}

/* Rank key: larger = earlier in rank order (logit descending, ties to the
 * lower index). */
RD_HD uint64_t cm_rank_key(float x, int32_t i)
{
    return ((uint64_t)((uint32_t)cm_logit_order(x) ^ 0x80000000u) << 32) | (uint64_t)(0xffffffffu - (uint32_t)i);
}

RD_HD int32_t cm_key_index(uint64_t k) { return (int32_t)(0xffffffffu - (uint32_t)k); }

/* exp(x) for x <= 0 (and -inf) as sampler.c's exp_nonpos: Cephes' expf with
 * plain IEEE operations; x < -87 and -inf give exactly 0, exp(0) = 1. */
RD_HD float cm_exp_nonpos(float x)
{
    uint32_t ux = cm_f2u(x);
    uint32_t under = (uint32_t)0 - (uint32_t)(ux > 0xC2AE0000u);
    ux = (ux & ~under) | (0xC2AE0000u & under);
    float xc = cm_u2f(ux);
    float n = RD_FSUB(RD_FADD(RD_FMUL(xc, 1.44269504088896341f), 12582912.0f), 12582912.0f);
    float r = RD_FSUB(RD_FSUB(xc, RD_FMUL(n, 0.693359375f)), RD_FMUL(n, -2.12194440e-4f));
    float y = 1.9875691500e-4f;
    y = RD_FADD(RD_FMUL(y, r), 1.3981999507e-3f);
    y = RD_FADD(RD_FMUL(y, r), 8.3334519073e-3f);
    y = RD_FADD(RD_FMUL(y, r), 4.1665795894e-2f);
    y = RD_FADD(RD_FMUL(y, r), 1.6666665459e-1f);
    y = RD_FADD(RD_FMUL(y, r), 5.0000001201e-1f);
    y = RD_FADD(RD_FADD(RD_FMUL(y, RD_FMUL(r, r)), r), 1.0f);
    uint32_t scale_bits = (uint32_t)((int32_t)n + 127) << 23;
    float res = RD_FMUL(y, cm_u2f(scale_bits));
    return cm_u2f(cm_f2u(res) & ~under);
}

/* p_i / p_max = exp((x_i - m) / t), division as sampler.c does it. */
RD_HD float cm_scaled_weight(float x, float m, float t) { return cm_exp_nonpos(RD_FDIV(RD_FSUB(x, m), t)); }

/* samp_edit_logit (engine/serve/sampler.h), the same expression with each
 * operation rounded: x + bias; -inf if masked; x / rep (x > 0) or x * rep if
 * seen; - freq * n_out; - pres if n_out > 0. -inf from its bits, so no
 * math header is needed here. */
RD_HD float cm_edit_logit(float x, float bias, int mask, int seen, int32_t n_out, float rep, float freq, float pres)
{
    x = RD_FADD(x, bias);
    if (mask)
        x = cm_u2f(0xff800000u);
    if (seen)
        x = x > 0.0f ? RD_FDIV(x, rep) : RD_FMUL(x, rep);
    x = RD_FSUB(x, RD_FMUL(freq, (float)n_out));
    if (n_out > 0)
        x = RD_FSUB(x, pres);
    return x;
}

/* ---- GELU (tanh form), Gemma's gated FFN ---- */

/* expm1(y) for |y| <= ln2/2 + a little: Taylor to degree 13 (the next term
 * is < 2e-17 relative), Horner in double. */
RD_HD double cm_expm1_small(double y)
{
    double p = 0x1.6124613a86d09p-33;   /* 1/13! */
    p = RD_DADD(RD_DMUL(p, y), 0x1.1eed8eff8d898p-29);
    p = RD_DADD(RD_DMUL(p, y), 0x1.ae64567f544e4p-26);
    p = RD_DADD(RD_DMUL(p, y), 0x1.27e4fb7789f5cp-22);
    p = RD_DADD(RD_DMUL(p, y), 0x1.71de3a556c734p-19);
    p = RD_DADD(RD_DMUL(p, y), 0x1.a01a01a01a01ap-16);
    p = RD_DADD(RD_DMUL(p, y), 0x1.a01a01a01a01ap-13);
    p = RD_DADD(RD_DMUL(p, y), 0x1.6c16c16c16c17p-10);
    p = RD_DADD(RD_DMUL(p, y), 0x1.1111111111111p-7);
    p = RD_DADD(RD_DMUL(p, y), 0x1.5555555555555p-5);
    p = RD_DADD(RD_DMUL(p, y), 0x1.5555555555555p-3);
    p = RD_DADD(RD_DMUL(p, y), 0.5);
    p = RD_DADD(RD_DMUL(p, y), 1.0);
    return RD_DMUL(p, y);
}

/* tanh of a float, computed in double with plain IEEE operations (so the
 * device, the emulator and the host give the same bits) and rounded once to
 * float: tanh(a) = e / (e + 2) with e = expm1(2a), relative error ~1e-15
 * before the rounding, so the result is the correctly rounded tanh except
 * within ~1e-15 of a rounding boundary. Against glibc 2.36's tanhf (the CPU
 * backend's) it is measured in tests/unit/test_cuda_host.c. */
RD_HD float cm_tanhf(float x)
{
    const uint32_t ux = cm_f2u(x), ua = ux & 0x7fffffffu;
    if (ua > 0x7f800000u)
        return RD_FADD(x, x); /* NaN */
    float r = 1.0f;           /* |x| >= 10 (and inf): tanh rounds to 1 past 9.011 */
    if (ua < 0x41200000u) {
        const double y = 2.0 * (double)cm_u2f(ua); /* exact */
        double em1;
        if (y < 0.34657359027997264) {
            em1 = cm_expm1_small(y);
        } else {
            /* y = k ln2 + t, |t| <= ln2/2, k <= 29; ln2's high part has 32
             * bits, so k * LN2_HI is exact */
            const double kd = RD_DSUB(RD_DADD(RD_DMUL(y, 0x1.71547652b82fep+0), 0x1.8p52), 0x1.8p52);
            const double t = RD_DSUB(RD_DSUB(y, RD_DMUL(kd, 0x1.62e42feep-1)), RD_DMUL(kd, 0x1.a39ef35793c76p-33));
            const double two_k = (double)(1u << (int)kd);
            em1 = RD_DSUB(RD_DMUL(RD_DADD(cm_expm1_small(t), 1.0), two_k), 1.0);
        }
        r = (float)RD_DDIV(em1, RD_DADD(em1, 2.0));
    }
    return cm_u2f(cm_f2u(r) | (ux & 0x80000000u));
}

/* gelu_tanh(g) * u as the CPU backend writes it (kernels/cpu/cpu_backend.c,
 * geglu_task): 0.5 g (1 + tanh(0.7978845608 (g + 0.044715 g^3))) u, left to
 * right, with cm_tanhf for tanhf. */
RD_HD float cm_geglu(float g, float u)
{
    const float inner = RD_FMUL(0.7978845608f, RD_FADD(g, RD_FMUL(RD_FMUL(RD_FMUL(0.044715f, g), g), g)));
    return RD_FMUL(RD_FMUL(RD_FMUL(0.5f, g), RD_FADD(1.0f, cm_tanhf(inner))), u);
}

#endif
