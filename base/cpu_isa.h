/* cpu_isa.h - which vector instructions the CPU kernels run, chosen at run
 * time from what the CPU and the OS support.
 *
 * Why at run time: a binary built with -march=native on an AVX-512 host dies
 * with SIGILL on an AVX2 one (a container image moved between hosts). The
 * default build targets baseline x86-64; the kernels (kernels/cpu/) compile
 * their vector paths with per-function target options and ask cpu_isa_active()
 * which one to take. Every path computes the same operations in the same order
 * (one fused multiply-add chain per output, lanes summed left to right), so the
 * choice changes the speed, never the bits. */
#ifndef RD_BASE_CPU_ISA_H
#define RD_BASE_CPU_ISA_H

/* Ordered: a level implies every lower one. */
typedef enum {
    CPU_ISA_SCALAR = 0,         /* plain C (SSE2, the x86-64 baseline) */
    CPU_ISA_AVX2 = 1,           /* AVX2 + FMA + F16C */
    CPU_ISA_AVX512 = 2,         /* AVX-512F on top of AVX2 */
} cpu_isa;

#define CPU_ISA_COUNT 3

/* The best level this CPU and OS support (OS: the vector state is saved). */
cpu_isa cpu_isa_best(void);

/* The level the kernels use: cpu_isa_best(), or lower where the environment
 * variable RD_CPU_ISA (scalar | avx2 | avx512) asks for less. A request above
 * what the host supports, or a name it does not know, is reported on stderr
 * once and the best level is used. Decided on the first call. */
cpu_isa cpu_isa_active(void);

/* Sets the level while no kernel runs (tests compare the paths in one
 * process). RD_EINVAL where the host lacks it. */
int cpu_isa_set(cpu_isa isa);

/* "scalar", "avx2", "avx512". */
const char *cpu_isa_name(cpu_isa isa);

/* The level a name stands for; RD_EINVAL for anything else. */
int cpu_isa_parse(const char *name, cpu_isa *isa);

#endif
