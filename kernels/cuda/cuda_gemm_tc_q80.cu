// cuda_gemm_tc_q80.cu - the tensor-core GEMM's kernels for GGUF Q8_0
// weights kept as they are (RD_CUDA_Q8=tc; cuda_gemm_tc.cuh): int8 codes
// as bf16 weights, each 32-weight chunk's sum times its block's scale; x as
// one piece or the LM head's three (two pieces: cuda_gemm_tc_q80_p2.cu).
// RD_CUDA_Q8=w8a8's (x quantized to Q8_0 too) are in cuda_gemm_tc_i8.cu.
#include "kernels/cuda/cuda_gemm_tc.cuh"

namespace RD_NS {

cudaError_t gemm_tc_setup_q80(int stages)
{
    const cudaError_t e[] = {tcp_setup_all<1, TC_WF_Q8_0>(stages), gemm_tc_setup_q80_p2(stages),
                             tcp_setup_all<3, TC_WF_Q8_0>(stages), gemm_tc_setup_i8(stages)};
    for (cudaError_t x : e)
        if (x != cudaSuccess)
            return x;
    return cudaSuccess;
}

void gemm_tc_q80(cudaStream_t s, const cuplan_tc &pl, const tc_args &a, int pieces, int epi)
{
    if (pieces == TC_I8) // W8A8 on int8 tensor cores
        gemm_tc_i8(s, pl, a, epi);
    else if (pieces == 3) // a Q8_0 LM head
        gemm_tc_pieces<3, TC_WF_Q8_0>(s, pl, a, TC_PLAIN);
    else if (pieces == 2)
        gemm_tc_q80_p2(s, pl, a, epi);
    else
        gemm_tc_pieces<1, TC_WF_Q8_0>(s, pl, a, epi);
}

}  // namespace RD_NS
