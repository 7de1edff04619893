/* update.h - a live weight update on the engine side: the staging area, the
 * conversion into the backend's weight format, and the swap.
 *
 * The three stages run on three threads, which is why they are separate calls:
 *   stage   (daemon loop thread + a worker): upd_stage_create checks the
 *           manifest against the model; each chunk is claimed (upd_chunk_claim,
 *           bookkeeping, loop thread), verified and copied (upd_chunk_fill,
 *           any thread: it touches only its own byte range), then settled
 *           (upd_chunk_settle, loop thread);
 *   build   (a worker): upd_stage_verify checks coverage and the whole-tensor
 *           CRC-32C; upd_build reads the current fused weights where the
 *           manifest covers only part of a group (q of q|k|v, gate of gate|up),
 *           overwrites the staged rows and loads new backend buffers. Decode
 *           goes on meanwhile: nothing the engine reads is written;
 *   apply   (the engine thread, between two steps): upd_apply swaps pointers.
 *           The patch then holds the old buffers, freed by upd_patch_free.
 *
 * Tensors use Hugging Face names, layout and dtypes (f32, f16, bf16), as a
 * learner's state_dict has them (DESIGN.md). */
#ifndef RD_UPDATE_H
#define RD_UPDATE_H

#include <stddef.h>
#include <stdint.h>

#include "engine/model/model.h"
#include "engine/update/serve_dtype.h"

typedef enum { UPD_F32 = 0, UPD_F16 = 1, UPD_BF16 = 2 } upd_dtype; /* = PROTO_DTYPE_* */
/* Bytes per element of a pushed dtype (0: not one), and its ggml type code. */
uint32_t upd_dtype_size(int dtype);
int32_t upd_dtype_ggml(int dtype);
/* 0 if element e of the dtype-typed bytes p is finite, else RD_EINVAL naming
 * the tensor, the element and whether it is NaN or infinite. */
int upd_check_element(const char *name, int dtype, const uint8_t *p, uint64_t e);
/* When in-flight sequences meet the new weights (= PROTO_MODE_*, PROTOCOL.md §10.6). */
typedef enum { UPD_CONTINUE = 0, UPD_DRAIN = 1, UPD_ABORT = 2 } upd_mode;

#define UPD_MAX_DIMS 4
#define UPD_MIN_CHUNK 4096      /* bytes; only a tensor's last chunk may be shorter */

/* One manifest entry as the sender describes it. */
typedef struct {
    const char *name;           /* HF name, NUL-terminated */
    int dtype;                  /* upd_dtype */
    int n_dims;                 /* 1..UPD_MAX_DIMS */
    uint64_t shape[UPD_MAX_DIMS];
    uint64_t nbytes;            /* product of shape x dtype size */
    uint32_t crc32c;            /* of the whole tensor (a delta's: of its new bytes, once applied) */
    int delta;                  /* 1: the chunks carry a delta (engine/update/delta.h), wire_bytes long */
    uint64_t wire_bytes;        /* delta: bytes the chunks carry; else unused (= nbytes) */
} upd_spec;

/* A byte range of a tensor that a chunk claimed. */
typedef struct {
    uint64_t off, len;          /* bytes */
    uint32_t crc32c;            /* of the range's bytes */
    int done;                   /* 1: verified and copied; 0: being staged */
} upd_range;

typedef struct {
    char *name;
    int dtype;
    int n_dims;
    uint64_t shape[UPD_MAX_DIMS];
    uint64_t nbytes;            /* the tensor's bytes */
    uint32_t crc32c;            /* expected, from the manifest (a delta's: of the bytes it decodes to) */
    int kind, layer, expert;    /* which model weight (the family's table; expert 0 but for experts' tensors) */
    int delta;                  /* 1: data holds a delta's wire bytes; decoded into full group by group (delta.h) */
    uint64_t wire;              /* bytes the chunks carry: nbytes, or a delta's wire_bytes */
    uint8_t *data;              /* staging copy [wire] of what the chunks carry, inside upd_stage.mem */
    uint8_t *full;              /* delta: [nbytes] the new bytes while upd_build packs its group (in upd_stage.full_mem) */
    upd_range *ranges;          /* [n_ranges], sorted by off, never overlapping */
    int32_t n_ranges, cap_ranges;
    uint64_t staged;            /* bytes in done ranges */
    /* Quantized while the push is staged (upd_prequant): its blocks, of type
     * q_type, which the COMMIT's build copies instead of quantizing; NULL when
     * not (yet) done or when it failed (the build then quantizes and reports). */
    uint8_t *q;
    int q_type;
} upd_tensor;

typedef struct upd_stage {
    upd_tensor *t;              /* [n] */
    int32_t n;
    uint64_t total_bytes;       /* sum of wire (what the chunks carry) */
    uint64_t staged_bytes;      /* verified bytes */
    int32_t pending;            /* chunks claimed but not settled */
    void *mem;                  /* one mapping holding every tensor's data */
    size_t mem_bytes;
    void *full_mem;             /* the buffer one group's delta tensors are decoded into (delta.h), or NULL */
    size_t full_mem_bytes;
    void (*full_mem_release)(void *p, size_t bytes); /* how upd_stage_free lets it go (NULL: munmap) */
    uint64_t delta_changed;     /* elements of the delta tensors whose bits changed (upd_delta_apply) */
    /* Set by upd_delta_apply: makes the new bytes (t->full) of the delta
     * tensors of group g, layer l, expert ex; upd_build calls it per group. */
    int (*delta_group)(const model *m, struct upd_stage *s, int g, int l, int ex);
} upd_stage;

/* Checks the manifest against the model (every name known, no name twice,
 * shapes equal the model's, nbytes consistent, total_bytes the sum, at most
 * max_bytes) and allocates the staging memory. RD_EINVAL names the tensor and
 * what was expected; RD_ENOMEM when the memory is not there. c NULL: tensors
 * that are no weight of the model (a LoRA adapter's, which its loader
 * checks): only no name twice, nbytes, the sum and max_bytes; their kind
 * and layer are -1 and upd_build does not take such a stage. */
int upd_stage_create(const model_config *c, const upd_spec *specs, int32_t n, uint64_t total_bytes,
                     uint64_t max_bytes, upd_stage **out);
void upd_stage_free(upd_stage *s);

/* Claims [off, off+len) of tensor ti for a chunk with checksum crc.
 * 0: claimed (fill, then settle it). *dup = 1 instead when exactly this range
 * with this crc is already staged: nothing to do. RD_EBUSY: the same chunk is
 * still being staged (a resend). RD_EINVAL: out of the tensor or overlapping
 * another range. */
int upd_chunk_claim(upd_stage *s, uint32_t ti, uint64_t off, uint32_t len, uint32_t crc, int *dup);
/* Verifies data against crc and copies it into the claimed range. Safe on any
 * thread while other ranges are filled. RD_ECHECKSUM when it does not match. */
int upd_chunk_fill(upd_stage *s, uint32_t ti, uint64_t off, const void *data, uint32_t len, uint32_t crc);
/* Verifies bytes already written into the claimed range (a reader that put
 * them there directly). RD_ECHECKSUM when they do not match. */
int upd_chunk_check(upd_stage *s, uint32_t ti, uint64_t off, const void *data, uint32_t len, uint32_t crc);
/* Marks the claimed range staged (ok) or releases it (the chunk may be resent). */
void upd_chunk_settle(upd_stage *s, uint32_t ti, uint64_t off, int ok);

/* Every tensor covered byte for byte and its CRC-32C (combined from the
 * verified chunks) equal to the manifest's (a delta's wire bytes have only
 * their chunks' CRCs: its manifest CRC is checked once it is applied).
 * RD_EINVAL names the tensor and the first gap; RD_ECHECKSUM names the tensor. */
int upd_stage_verify(const upd_stage *s);

/* New backend weights for every model weight the stage touches. */
typedef struct upd_patch upd_patch;

/* Builds the patch on the caller's thread from the staged bytes and, for
 * fused weights only partly covered, the model's current values. The model is
 * only read. With a serve other than UPD_SERVE_AS_PUSHED every linear group
 * the stage touches that the serve quantizes (staging.c's serve_type) is
 * quantized whole, its members the stage does not cover re-quantized from the
 * values they serve; a tensor with NaN or infinity, or a block the type
 * cannot scale (Q8_0: max |x| >= 65520 * 127; FP8: > 57344), fails the build
 * with RD_EINVAL naming it. */
int upd_build(const model *m, const upd_stage *s, upd_serve serve, upd_patch **out);
/* 1 when a tensor of this kind (the family's table index) is held quantized
 * once pushed under serve. */
int upd_kind_quantized(const model_config *c, int kind, upd_serve serve);
/* Quantizes tensor t (all its bytes staged, not a delta) as upd_build will
 * under serve, into t->q, on the calling thread alone (no pool: a transfer's
 * worker while the engine decodes): the build then copies those blocks, so a
 * push's quantization runs while the rest of it arrives, not at COMMIT. 1 when
 * t->q was made; 0 when t is not quantized under serve or the values do not
 * quantize (the build quantizes them again and names what is wrong). */
int upd_prequant(const model_config *c, upd_tensor *t, upd_serve serve);
/* Swaps the patch's buffers into the model (engine thread, between steps). */
void upd_apply(model *m, upd_patch *p);
/* Frees the patch's buffers: the new ones if never applied, else the old. */
void upd_patch_free(rd_backend *be, upd_patch *p);
/* Backend bytes the patch holds. */
uint64_t upd_patch_bytes(const upd_patch *p);

#endif
