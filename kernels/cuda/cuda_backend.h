/* cuda_backend.h - the CUDA backend's entries for the registry
 * (kernels/registry.c). cuda_backend.cu defines one of them, by how it is
 * compiled: with nvcc, the "cuda" backend; with g++ and RD_CUDA_EMU, the same
 * code on the host emulator (kernels/cuda/cuemu.h), "cuda-emu", which only
 * the test binaries that ask for it link. */
#ifndef RD_CUDA_BACKEND_H
#define RD_CUDA_BACKEND_H

#include "engine/backend.h"

/* The "cuda" backend on device RD_CUDA_DEVICE (default 0). */
int rd_backend_cuda_create(int n_threads, rd_backend **out);
/* The "cuda-emu" backend. */
int rd_backend_cudaemu_create(int n_threads, rd_backend **out);

#endif
