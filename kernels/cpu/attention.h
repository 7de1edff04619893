/* attention.h - paged causal attention on the CPU backend. */
#ifndef RD_CPU_ATTENTION_H
#define RD_CPU_ATTENTION_H

#include "engine/backend.h"

/* Element types of the KV cache (kv_dtype). */
enum { CPU_KV_F32 = 0, CPU_KV_BF16 = 1, CPU_KV_F16 = 2 };

/* ops.attention over a cache of kv_type elements (CPU_KV_*). Each (row,
 * query head) is computed in one fixed order over its context, so prefill
 * rows, decode rows and recomputed rows at the same position give
 * bit-identical outputs. */
void cpu_attention(int kv_type, const rd_attn_shape *a, const float *q, int32_t stride, const rd_step_dev *s,
                   const void *k_cache, const void *v_cache, float *out);

#endif
