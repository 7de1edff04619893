// cuda_gemm_tc_fp8.cu - the tensor-core GEMM's kernels for FP8 weights
// decoded to bf16 in the kernel (RD_CUDA_FP8=tc; cuda_gemm_tc.cuh), x as one
// piece (the two-piece ones are in cuda_gemm_tc_fp8_p2.cu).
#include "kernels/cuda/cuda_gemm_tc.cuh"

namespace RD_NS {

cudaError_t gemm_tc_setup_fp8(int stages)
{
    const cudaError_t e = tcp_setup_all<1, TC_WF_FP8>(stages);
    return e != cudaSuccess ? e : gemm_tc_setup_fp8_p2(stages);
}

void gemm_tc_fp8(cudaStream_t s, const cuplan_tc &pl, const tc_args &a, int pieces, int epi)
{
    if (pieces == 2)
        gemm_tc_fp8_p2(s, pl, a, epi);
    else
        gemm_tc_pieces<1, TC_WF_FP8>(s, pl, a, epi);
}

}  // namespace RD_NS
