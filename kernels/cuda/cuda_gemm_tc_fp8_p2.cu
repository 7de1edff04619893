// cuda_gemm_tc_fp8_p2.cu - the tensor-core GEMM's kernels for FP8 weights
// decoded to bf16 (RD_CUDA_FP8=tc) with x as two bf16 pieces: a file of their
// own, apart from cuda_gemm_tc_fp8.cu's one-piece kernels, so nvcc builds the
// two in parallel.
#include "kernels/cuda/cuda_gemm_tc.cuh"

namespace RD_NS {

cudaError_t gemm_tc_setup_fp8_p2(int stages) { return tcp_setup_all<2, TC_WF_FP8>(stages); }

void gemm_tc_fp8_p2(cudaStream_t s, const cuplan_tc &pl, const tc_args &a, int epi)
{
    gemm_tc_pieces<2, TC_WF_FP8>(s, pl, a, epi);
}

}  // namespace RD_NS
