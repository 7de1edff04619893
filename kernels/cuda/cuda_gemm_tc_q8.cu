// cuda_gemm_tc_q8.cu - the tensor-core GEMM's W8A8 kernels: FP8 weights
// times activations quantized to E4M3 in the kernel, on FP8 tensor cores
// (RD_CUDA_FP8=w8a8; cuda_gemm_tc.cuh).
#include "kernels/cuda/cuda_gemm_tc.cuh"

namespace RD_NS {

cudaError_t gemm_tc_setup_q8(int stages) { return tcp_setup_all<TC_Q8, TC_WF_FP8>(stages); }

void gemm_tc_q8(cudaStream_t s, const cuplan_tc &pl, const tc_args &a, int epi)
{
    gemm_tc_pieces<TC_Q8, TC_WF_FP8>(s, pl, a, epi);
}

}  // namespace RD_NS
