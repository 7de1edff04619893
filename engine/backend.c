/* backend.c - what every backend shares (the KV sizes, the KV budget).
 * Selection by name, rd_backend_create, is kernels/registry.c's, with the
 * table it reads: the backends call this file, so the engine calling the
 * table from here made a circle (tools/check_layers.py, rule calls). */
#include "engine/backend.h"

#include <math.h>
#include <string.h>

#include "base/err.h"

void rd_backend_destroy(rd_backend *be)
{
    if (be)
        be->ops->destroy(be);
}

int32_t rd_backend_kv_elem_bytes(const rd_backend *be)
{
    return be && be->ops->kv_elem_bytes > 0 ? be->ops->kv_elem_bytes : (int32_t)sizeof(float);
}

int64_t rd_backend_kv_block_bytes(const rd_backend *be, int32_t n_kv, int32_t block_size, int32_t head_dim)
{
    return (int64_t)n_kv * block_size * ((int64_t)head_dim * rd_backend_kv_elem_bytes(be) + be->ops->kv_scale_bytes);
}

int rd_backend_set_kv_dtype(rd_backend *be, const char *name)
{
    if (strcmp(name, "auto") && strcmp(name, "f32") && strcmp(name, "bf16") && strcmp(name, "f16") &&
        strcmp(name, "fp8"))
        return rd_fail(RD_EINVAL, "kv_dtype \"%s\"; expected \"auto\", \"f32\", \"bf16\", \"f16\" or \"fp8\"",
                       name);
    return be->ops->set_kv_dtype(be, name);
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
