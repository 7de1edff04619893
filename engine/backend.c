/* backend.c - backend selection by name. */
#include "engine/backend.h"

#include <math.h>
#include <string.h>

#include "base/err.h"

int rd_backend_cpu_create(int n_threads, rd_backend **out);
int rd_backend_cpu_set_kv_dtype(rd_backend *be, int elem_bytes, int is_f16);
#ifdef RD_HAVE_CUDA
int rd_backend_cuda_create(int n_threads, rd_backend **out);
#endif
/* The CUDA backend built for the host emulator (tests only): linked into the
 * test binaries that ask for it, absent (NULL) everywhere else. */
int rd_backend_cudaemu_create(int n_threads, rd_backend **out) __attribute__((weak));

int rd_backend_create(const char *name, int n_threads, rd_backend **out)
{
    *out = NULL;
    if (!name || strcmp(name, "cpu") == 0)
        return rd_backend_cpu_create(n_threads, out);
    if (strcmp(name, "cuda-emu") == 0 && rd_backend_cudaemu_create)
        return rd_backend_cudaemu_create(n_threads, out);
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

int32_t rd_backend_kv_elem_bytes(const rd_backend *be)
{
    return be && be->ops->kv_elem_bytes > 0 ? be->ops->kv_elem_bytes : (int32_t)sizeof(float);
}

int rd_backend_set_kv_dtype(rd_backend *be, const char *name)
{
    int f32 = !strcmp(name, "f32"), bf16 = !strcmp(name, "bf16"), f16 = !strcmp(name, "f16");
    if (!f32 && !bf16 && !f16 && strcmp(name, "auto"))
        return rd_fail(RD_EINVAL, "kv_dtype \"%s\"; expected \"auto\", \"f32\", \"bf16\" or \"f16\"", name);
    if (!strcmp(be->ops->name, "cpu"))
        return rd_backend_cpu_set_kv_dtype(be, bf16 || f16 ? 2 : 4, f16);
    /* CUDA (and its emulator) store bf16 and nothing else. */
    if (f32 || f16)
        return rd_fail(RD_ENOTSUP, "kv_dtype \"%s\": the %s backend stores the KV cache as bf16 (use \"bf16\" or "
                       "\"auto\")", name, be->ops->name);
    return 0;
}

int64_t rd_kv_budget_bytes(int64_t free_bytes, double util, int64_t reserve_bytes)
{
    if (!(util > 0.0) || free_bytes <= 0)
        return 0;
    if (util > 1.0)
        util = 1.0;
    double b = floor((double)free_bytes * util) - (double)reserve_bytes;
    return b > 0 ? (int64_t)b : 0;
}

int rd_backend_kv_budget(rd_backend *be, double util, int64_t reserve_bytes, int64_t *bytes)
{
    *bytes = 0;
    if (!(util > 0.0 && util <= 1.0))
        return rd_fail(RD_EINVAL, "gpu_memory_utilization must be in (0, 1], got %g", util);
    if (!be->ops->mem_info)
        return rd_fail(RD_ENOTSUP, "backend '%s' has no device memory to size the KV pool from; give a byte budget",
                       be->ops->name);
    size_t free_b = 0, total_b = 0;
    int rc = be->ops->mem_info(be, &free_b, &total_b);
    if (rc)
        return rc;
    *bytes = rd_kv_budget_bytes((int64_t)free_b, util, reserve_bytes);
    return 0;
}
