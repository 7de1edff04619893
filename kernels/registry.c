/* registry.c - the backends this build has, and rd_backend_create, which
 * picks one by name from them.
 *
 * A table rather than a self-registration at load time: the library is a
 * static archive, and the linker pulls an object out of it only when
 * something refers to it, so each entry's reference to its create function is
 * what brings that backend in (whatever calls rd_backend_create pulls this
 * file in). rd_backend_create lives here, with the table, rather than in
 * engine/backend.c: the backends call engine/backend.c, so a call from there
 * to the table closed a circle of files. */
#include "engine/backend.h"

#include <stddef.h>
#include <string.h>

#include "base/err.h"

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

int rd_backend_create(const char *name, int n_threads, rd_backend **out)
{
    *out = NULL;
    if (!name)
        name = "cpu";
    for (const rd_backend_entry *e = rd_backend_registry; e->name; e++) {
        if (strcmp(name, e->name) != 0)
            continue;
        if (e->create)
            return e->create(n_threads, out);
        if (e->absent)
            return rd_fail(RD_ENODEV, "backend '%s' is not built in (%s)", name, e->absent);
        break;
    }
    return rd_fail(RD_EINVAL, "unknown backend '%s' (expected cpu or cuda)", name);
}
