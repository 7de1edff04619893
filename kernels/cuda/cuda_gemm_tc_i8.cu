// cuda_gemm_tc_i8.cu - the tensor-core GEMM's Q8_0 W8A8 kernels: Q8_0 weights
// times x quantized to Q8_0 blocks in the kernel, on int8 tensor cores
// (RD_CUDA_Q8=w8a8; cuda_gemm_tc.cuh). A file of their own so that nvcc
// builds them beside the weight-only Q8_0 kernels (cuda_gemm_tc_q80.cu),
// not after them: the longest file bounds a parallel build.
#include "kernels/cuda/cuda_gemm_tc.cuh"

namespace RD_NS {

cudaError_t gemm_tc_setup_i8(int stages) { return tcp_setup_all<TC_I8, TC_WF_Q8_0>(stages); }

void gemm_tc_i8(cudaStream_t s, const cuplan_tc &pl, const tc_args &a, int epi)
{
    gemm_tc_pieces<TC_I8, TC_WF_Q8_0>(s, pl, a, epi);
}

}  // namespace RD_NS
