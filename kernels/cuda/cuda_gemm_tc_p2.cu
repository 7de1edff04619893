// cuda_gemm_tc_p2.cu - the tensor-core GEMM's kernels for bf16 weights with x
// as two bf16 pieces (hi + lo, the default RD_CUDA_ACT): a file of their own,
// as they take half of cuda_gemm_tc.cu's nvcc time (docs/GPU.md, the build).
#include "kernels/cuda/cuda_gemm_tc.cuh"

namespace RD_NS {

cudaError_t gemm_tc_setup_bf16_p2(int stages) { return tcp_setup_all<2, TC_WF_BF16>(stages); }

void gemm_tc_bf16_p2(cudaStream_t s, const cuplan_tc &pl, const tc_args &a, int epi)
{
    gemm_tc_pieces<2, TC_WF_BF16>(s, pl, a, epi);
}

}  // namespace RD_NS
