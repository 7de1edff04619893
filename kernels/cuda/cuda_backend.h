/* cuda_backend.h - the CUDA backend's entries for the registry
 * (kernels/registry.c). cuda_backend.cu defines one of the create functions,
 * by how it is compiled: with nvcc, the "cuda" backend, linked into the
 * plugin librdcuda.so that cuda_plugin.c loads; with g++ and RD_CUDA_EMU, the
 * same code on the host emulator (kernels/cuda/cuemu.h), "cuda-emu", which
 * only the test binaries that ask for it link. */
#ifndef RD_CUDA_BACKEND_H
#define RD_CUDA_BACKEND_H

#include "engine/backend.h"

/* The "cuda" backend on device RD_CUDA_DEVICE (default 0): in the plugin. */
int rd_backend_cuda_create(int n_threads, rd_backend **out);
/* Loads the plugin once ($RD_CUDA_PLUGIN when set, else librdcuda.so next to
 * the program or one folder up) and calls its rd_backend_cuda_create; RD_ENODEV
 * naming what failed when it cannot be loaded. */
int rd_backend_cuda_load(int n_threads, rd_backend **out);
/* The "cuda-emu" backend. */
int rd_backend_cudaemu_create(int n_threads, rd_backend **out);

#endif
