/* attention.h - paged causal attention on the CPU backend. */
#ifndef RD_CPU_ATTENTION_H
#define RD_CPU_ATTENTION_H

#include "engine/backend.h"

/* See rd_backend_ops.attention. Each (row, query head) is computed in one
 * fixed order over its context, so prefill rows, decode rows and recomputed
 * rows at the same position give bit-identical outputs. */
void cpu_attention(rd_backend *be, const rd_attn_shape *a, const float *q, int32_t stride,
                   const rd_step_dev *s, const float *k_cache, const float *v_cache, float *out);

#endif
