/* lora.h - the CPU backend's LoRA ops (backend.h lora_load, lora_apply).
 *
 * A handle holds A and B in the file's dtype (f32, f16 or bf16; A's and B's
 * may differ), A in lane order, B transposed: decoding streams every adapter
 * a step uses from memory, so its bytes bound the op, and f16 and bf16 widen
 * to fp32 exactly in the registers where they are used, so every product is
 * the one of the file's values, as an fp32 copy would give. lora_apply
 * groups the rows by adapter (a counting sort over the slots) and runs each
 * adapter's rows together, so its A and B are read from cache for all of
 * them; every row is computed on its own in the order backend.h states
 * (RD_LORA_LANES: the CUDA warp's order, replayed lane by lane), which
 * depends only on the row and its adapter. The AVX2 and AVX-512 paths
 * (base/cpu_isa.h) keep warp lane l in SIMD lane l, A's chunks stored in lane
 * order at load, so each lane's sum is the same fmaf chain: the same bits on
 * every path; on AVX-512 four rows of one adapter share each loaded (and
 * widened) vector of A and B. Why not a GEMM: OpenBLAS's sgemm changes a
 * row's bits with M (gemm.h), and the packed GEMM's order (one FMA chain
 * over in) is not the CUDA kernel's, so the two backends would disagree in
 * the last bits; these products are small (r (in + out) per row against the
 * base's in out). */
#ifndef RD_CPU_LORA_H
#define RD_CPU_LORA_H

#include <stddef.h>
#include <stdint.h>

#include "engine/backend.h"

/* Scratch reused between calls (grown, never shrunk). */
typedef struct {
    int32_t *order;             /* [m] rows grouped by slot, ascending within a slot */
    size_t order_cap;
    float *xp;                  /* [workers][4][rounds * 256] each worker's rows of x in lane order (vector paths) */
    size_t xp_cap;              /* floats */
    int failed;                 /* a call could not get its scratch (out of memory): the backend's sync fails */
} cpu_lora_scratch;

int cpu_lora_load(const rd_lora_w *w, void **handle);
void cpu_lora_free(void *handle);
int64_t cpu_lora_bytes(const void *handle);
void cpu_lora_apply(cpu_lora_scratch *s, const rd_lora_batch *lb, const float *x, const int32_t *slots, int32_t m,
                    float *y, int32_t y_stride, int32_t out_off);
void cpu_lora_scratch_free(cpu_lora_scratch *s);

/* t = w . x over n elements in RD_LORA_LANES' order (exposed for the tests). */
float cpu_lora_dot(const float *w, const float *x, int32_t n);

#endif
