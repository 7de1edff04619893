// cuda_fp8_decode.cuh - FP8 weights (serve_dtype fp8, engine/model/quant_fp8.h)
// decoded to fp32 in registers: k_gemm_fp8 (cuda_kernels.cu) and the
// tensor-core GEMM (cuda_gemm_tc.cu) read the same values.
#ifndef RD_CUDA_FP8_DECODE_CUH
#define RD_CUDA_FP8_DECODE_CUH

#include "kernels/cuda/cuda_common.cuh"

#ifndef RD_CUDA_EMU
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#endif

namespace RD_NS {

// On sm_89 and later the hardware converts a pair of E4M3 codes to fp16 in one
// instruction (exact: every E4M3 value is an fp16), then to fp32 (exact). That
// is the code's value, not cm_fp8_scaled's 2^-120 times it: the multiply by
// 2^-120 is exact (the least E4M3 value, 2^-9, becomes the subnormal 2^-129),
// so the product with s is cm_fp8_scaled's bit for bit (test_cuda_emu's fp8
// cases check it on the device; the first H200 run, 2026-12-04, found the
// missing factor).
RD_DEV void fp8_decode4(uint32_t v, float s, float *f)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
    const __half2_raw lo = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(v & 0xffffu), __NV_E4M3);
    const __half2_raw hi = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(v >> 16), __NV_E4M3);
    const float2 a = __half22float2(__half2(lo)), b = __half22float2(__half2(hi));
    const float k = 0x1p-120f;
    f[0] = RD_FMUL(RD_FMUL(a.x, k), s), f[1] = RD_FMUL(RD_FMUL(a.y, k), s);
    f[2] = RD_FMUL(RD_FMUL(b.x, k), s), f[3] = RD_FMUL(RD_FMUL(b.y, k), s);
#else
RD_UNROLL
    for (int i = 0; i < 4; i++)
        f[i] = cm_fp8_scaled(v >> (8 * i) & 0xffu, s);
#endif
}

}  // namespace RD_NS

#endif
