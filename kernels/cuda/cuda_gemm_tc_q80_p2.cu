// cuda_gemm_tc_q80_p2.cu - the tensor-core GEMM's kernels for Q8_0 weights
// kept as Q8_0 (RD_CUDA_Q8=tc) with x as two bf16 pieces: a file of their own,
// apart from cuda_gemm_tc_q80.cu's one- and three-piece kernels, so nvcc
// builds them in parallel.
#include "kernels/cuda/cuda_gemm_tc.cuh"

namespace RD_NS {

cudaError_t gemm_tc_setup_q80_p2(int stages) { return tcp_setup_all<2, TC_WF_Q8_0>(stages); }

void gemm_tc_q80_p2(cudaStream_t s, const cuplan_tc &pl, const tc_args &a, int epi)
{
    gemm_tc_pieces<2, TC_WF_Q8_0>(s, pl, a, epi);
}

}  // namespace RD_NS
