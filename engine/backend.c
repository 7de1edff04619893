/* backend.c - backend selection by name. */
#include "engine/backend.h"

#include <string.h>

#include "engine/err.h"

int rd_backend_cpu_create(int n_threads, rd_backend **out);
#ifdef RD_HAVE_CUDA
int rd_backend_cuda_create(int n_threads, rd_backend **out);
#endif

int rd_backend_create(const char *name, int n_threads, rd_backend **out)
{
    *out = NULL;
    if (!name || strcmp(name, "cpu") == 0)
        return rd_backend_cpu_create(n_threads, out);
    if (strcmp(name, "cuda") == 0) {
#ifdef RD_HAVE_CUDA
        return rd_backend_cuda_create(n_threads, out);
#else
        return rd_fail(RD_ENODEV, "backend 'cuda' is not built in (rebuild with nvcc present and CUDA=1)");
#endif
    }
    return rd_fail(RD_EINVAL, "unknown backend '%s' (expected cpu or cuda)", name);
}

void rd_backend_destroy(rd_backend *be)
{
    if (be)
        be->ops->destroy(be);
}
