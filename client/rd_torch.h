/* rd_torch.h - rolloutd's forward for a learner (issue 47): a model the
 * learner's process holds, whose weights it sets from its own tensors' data
 * pointers, and whose log-probs are the daemon's, bit for bit, because they
 * are computed by the same code: the engine's scoring path (the bits a
 * sampled token gets, tests/unit/test_engine.c) on the CPU backend.
 * Built as build/librdtorch.so; tools/python/rolloutd/torch.py loads it
 * with ctypes and puts a PyTorch backward around it.
 *
 * For the CUDA backend later: rdt_open would take "cuda"; rdt_set_weights
 * then copies from device pointers (cudaMemcpy device to device into the
 * staging area, or the backend loading from device memory), and the outputs
 * land in device buffers the caller passes. The calls keep their shape.
 *
 * One thread at a time per model; returns 0 or a negative RD_E* code, with
 * rdt_error() saying why. */
#ifndef RD_CLIENT_TORCH_H
#define RD_CLIENT_TORCH_H

#include <stdint.h>

typedef struct rdt_model rdt_model;

/* Loads path (an HF folder, a rolloutd export, a .safetensors or a .gguf)
 * on the CPU backend with n_threads (0: all cores). NULL on failure. */
rdt_model *rdt_open(const char *path, int32_t n_threads);
void rdt_close(rdt_model *m);
/* The last failure's message on this thread. */
const char *rdt_error(void);
int32_t rdt_vocab(const rdt_model *m);

/* Replaces weights from n tensors by HF name: data[i] points at the
 * tensor's contiguous little-endian elements of dtypes[i] (0 f32, 1 f16, 2
 * bf16) and shape shapes[i][0 .. n_dims[i]); served in that dtype, as a
 * push's as_pushed. The rest keep their values. version: the weight version
 * the model then has. The model's own checks apply (names, shapes). */
int rdt_set_weights(rdt_model *m, int32_t n, const char *const *names, const void *const *data,
                    const int32_t *dtypes, const int64_t *shapes, const int32_t *n_dims, uint64_t version);

/* The log-prob of each token given the ones before it, for B sequences:
 * ids holds them back to back, lens[b] tokens each (>= 2); out gets
 * sum(lens[b] - 1) floats, sequence by sequence. */
int rdt_token_logprobs(rdt_model *m, const int32_t *ids, const int32_t *lens, int32_t B, float *out);

/* The fp32 logits of every position of one sequence of n tokens, as the
 * runner computes them in a step: out [n][vocab]. */
int rdt_logits(rdt_model *m, const int32_t *ids, int32_t n, float *out);

#endif
