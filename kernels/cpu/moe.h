/* moe.h - the CPU backend's mixture-of-experts ops (backend.h moe_route,
 * moe_ffn).
 *
 * The experts run through the backend's own linear and swiglu ops: the rows
 * routed to an expert are gathered into one block and multiplied by that
 * expert's weights in one GEMM (its weights decoded once for all of them),
 * and since the GEMM computes every row with the same fixed reduction order
 * whatever M, a row's result does not depend on which rows share its expert. */
#ifndef RD_CPU_MOE_H
#define RD_CPU_MOE_H

#include <stddef.h>
#include <stdint.h>

#include "engine/backend.h"

/* Scratch the experts reuse between calls (grown, never shrunk). */
typedef struct {
    float *buf;                 /* gathered rows, gate|up, swiglu and expert outputs */
    size_t cap;                 /* floats in buf */
    int32_t *order;             /* [m * k] route indices grouped by expert */
    size_t order_cap;           /* int32s in order */
} cpu_moe_scratch;

void cpu_moe_route(const float *logits, int32_t m, int32_t n_experts, int32_t k, int norm, int32_t *ids,
                   float *weights);
void cpu_moe_ffn(rd_backend *be, cpu_moe_scratch *s, const rd_moe *moe, const float *x, const int32_t *ids,
                 const float *weights, int32_t m, int32_t k, float *y);
void cpu_moe_scratch_free(cpu_moe_scratch *s);

#endif
