/* registry.c - the backends this build has, for rd_backend_create.
 *
 * A table rather than a self-registration at load time: the library is a
 * static archive, and the linker pulls an object out of it only when
 * something refers to it, so each entry's reference to its create function is
 * what brings that backend in (rd_backend_create refers to the table). */
#include "engine/backend.h"

#include <stddef.h>

#include "kernels/cpu/cpu_backend.h"
#include "kernels/cuda/cuda_backend.h"

/* Weak: the emulator build of the CUDA backend is in no archive; a test that
 * links its objects defines it, everywhere else it is NULL (and "cuda-emu" an
 * unknown name). */
int rd_backend_cudaemu_create(int n_threads, rd_backend **out) __attribute__((weak));

const rd_backend_entry rd_backend_registry[] = {
    {"cpu", rd_backend_cpu_create, NULL},
#ifdef RD_HAVE_CUDA
    {"cuda", rd_backend_cuda_load, NULL},   /* build/librdcuda.so, loaded on first use (cuda_plugin.c) */
#else
    {"cuda", NULL, "rebuild with nvcc present and CUDA=1"},
#endif
    {"cuda-emu", rd_backend_cudaemu_create, NULL},
    {NULL, NULL, NULL},
};
