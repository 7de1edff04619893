/* cpu_isa.c - the run-time choice of the CPU kernels' vector path (cpu_isa.h). */
#include "base/cpu_isa.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/err.h"

static const char *const names[CPU_ISA_COUNT] = {"scalar", "avx2", "avx512"};

/* -1 until decided; then a cpu_isa. Read on every kernel call, so relaxed. */
static atomic_int active = -1;

const char *cpu_isa_name(cpu_isa isa)
{
    return (unsigned)isa < CPU_ISA_COUNT ? names[isa] : "unknown";
}

int cpu_isa_parse(const char *name, cpu_isa *isa)
{
    for (int i = 0; i < CPU_ISA_COUNT; i++)
        if (name && !strcmp(name, names[i])) {
            *isa = (cpu_isa)i;
            return 0;
        }
    return rd_fail(RD_EINVAL, "cpu isa '%s': expected scalar, avx2 or avx512", name ? name : "(null)");
}

cpu_isa cpu_isa_best(void)
{
    /* libgcc's feature bits include the OS check (XGETBV) for the AVX and
     * AVX-512 register state. */
    __builtin_cpu_init();
    int avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
    if (avx2 && __builtin_cpu_supports("avx512f"))
        return CPU_ISA_AVX512;
    return avx2 ? CPU_ISA_AVX2 : CPU_ISA_SCALAR;
}

static cpu_isa decide(void)
{
    cpu_isa best = cpu_isa_best(), want = best;
    const char *env = getenv("RD_CPU_ISA");
    if (env && *env) {
        if (cpu_isa_parse(env, &want) < 0) {
            fprintf(stderr, "rolloutd: RD_CPU_ISA=%s is not scalar, avx2 or avx512; using %s\n", env,
                    cpu_isa_name(best));
            want = best;
        } else if (want > best) {
            fprintf(stderr, "rolloutd: RD_CPU_ISA=%s: this CPU supports up to %s; using %s\n", env,
                    cpu_isa_name(best), cpu_isa_name(best));
            want = best;
        }
    }
    return want;
}

cpu_isa cpu_isa_active(void)
{
    int v = atomic_load_explicit(&active, memory_order_relaxed);
    if (v >= 0)
        return (cpu_isa)v;
    /* Racing first calls decide the same thing; the first store wins. */
    int expected = -1, mine = (int)decide();
    atomic_compare_exchange_strong(&active, &expected, mine);
    return (cpu_isa)atomic_load(&active);
}

int cpu_isa_set(cpu_isa isa)
{
    if ((unsigned)isa >= CPU_ISA_COUNT || isa > cpu_isa_best())
        return rd_fail(RD_EINVAL, "cpu isa %s: this CPU supports up to %s", cpu_isa_name(isa),
                       cpu_isa_name(cpu_isa_best()));
    atomic_store(&active, (int)isa);
    return 0;
}
