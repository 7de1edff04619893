/* cuda_plugin.c - the CUDA backend as a plugin: the .cu objects are linked
 * into librdcuda.so with cuBLASLt and the CUDA runtime, and loaded the first
 * time a program asks for the "cuda" backend.
 *
 * Why: linked into every program, those two libraries' initialisers cost
 * each start ~0.1 s of CPU and ~0.2 s of wall time on machines that never
 * use a GPU (the test suite starts the tools and the daemon hundreds of
 * times), and a program could not start at all where they are absent.
 *
 * The plugin calls a few library functions (errors, the planner, the
 * dequantizers); it finds them in the program, which exports its symbols
 * (-rdynamic). plugin_imports names them so that the linker keeps them in
 * every program that can load the plugin, and a load (RTLD_NOW) resolves
 * everything at once or fails with the missing name. */
#include <dlfcn.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/err.h"
#include "engine/backend.h"
#include "engine/format/gguf.h"
#include "engine/model/quant_fp8.h"
#include "engine/serve/sampler.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/cuda_plan.h"

#define PLUGIN_NAME "librdcuda.so"

__attribute__((used)) static void (*const plugin_imports[])(void) = {
    (void (*)(void))rd_fail,           (void (*)(void))rd_errmsg,
    (void (*)(void))ggml_dequant_row,  (void (*)(void))rd_fp8_dequant,
    (void (*)(void))samp_validate,     (void (*)(void))rd_backend_kv_block_bytes,
    (void (*)(void))cuplan_attn_check, (void (*)(void))cuplan_attn_z,
    (void (*)(void))cuplan_to_bf16,    (void (*)(void))cuplan_from_bf16,
    (void (*)(void))cuplan_pick_gemm,  (void (*)(void))cuplan_gemm_check_sizes,
};

typedef int (*create_fn)(int n_threads, rd_backend **out);

static pthread_once_t load_once = PTHREAD_ONCE_INIT;
static create_fn plugin_create;     /* NULL when no load succeeded */
static char load_error[1024];       /* why, when plugin_create is NULL */

/* $RD_CUDA_PLUGIN when set, else next to the program (build/), else one
 * folder up (the test programs in build/tests and build/emutests). */
static void load_plugin(void)
{
    const char *env = getenv("RD_CUDA_PLUGIN");
    char exe[PATH_MAX], dir[3][PATH_MAX + 32];
    int n = 0;
    if (env && *env)
        snprintf(dir[n++], sizeof dir[0], "%s", env);
    ssize_t len = n ? 0 : readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (len > 0) {
        exe[len] = 0;
        for (int up = 0; up < 2; up++) {
            char *slash = strrchr(exe, '/');
            if (!slash)
                break;
            *slash = 0;
            snprintf(dir[n++], sizeof dir[0], "%s/" PLUGIN_NAME, exe);
        }
    }
    size_t used = 0;
    for (int i = 0; i < n; i++) {
        void *h = dlopen(dir[i], RTLD_NOW | RTLD_LOCAL);
        if (!h) {
            const char *e = dlerror();
            used += (size_t)snprintf(load_error + used, sizeof load_error - used, "%s%.400s", used ? "; " : "",
                                     e ? e : dir[i]);
            if (used >= sizeof load_error)
                used = sizeof load_error - 1;
            continue;
        }
        plugin_create = (create_fn)dlsym(h, "rd_backend_cuda_create");
        if (plugin_create)
            return;
        snprintf(load_error, sizeof load_error, "%.400s has no rd_backend_cuda_create", dir[i]);
        return;
    }
    if (n == 0)
        snprintf(load_error, sizeof load_error, "cannot find the program's folder (/proc/self/exe)");
}

int rd_backend_cuda_load(int n_threads, rd_backend **out)
{
    *out = NULL;
    pthread_once(&load_once, load_plugin);
    if (!plugin_create)
        return rd_fail(RD_ENODEV, "cuda: cannot load the CUDA backend (" PLUGIN_NAME "): %s", load_error);
    return plugin_create(n_threads, out);
}
