/* rd_push.h - push one set of weights to many daemons at once (PROTOCOL.md §10).
 *
 * The tensors are split into chunks and checksummed once (CRC-32C per chunk,
 * combined into each tensor's); then every daemon gets its own connection,
 * UPDATE_BEGIN, a window of chunk requests in flight (one thread per slot of
 * the window) and UPDATE_COMMIT, all daemons concurrently, so the slowest one
 * only sets its own pace. Any failure aborts that daemon's transfer (its old
 * weights keep serving) and is reported for that daemon alone. */
#ifndef RD_PUSH_H
#define RD_PUSH_H

#include <stdint.h>

#include "proto/proto.h"

typedef struct {
    const char *name;           /* HF name */
    uint8_t dtype;              /* PROTO_DTYPE_* */
    uint8_t n_dims;
    uint64_t shape[PROTO_MAX_DIMS];
    uint64_t nbytes;
    const uint8_t *data;        /* [nbytes], little-endian row-major */
} rdp_tensor;

typedef struct {
    uint64_t version;
    uint8_t mode;               /* PROTO_MODE_* */
    uint32_t window;            /* chunks in flight per daemon (default 4) */
    uint32_t chunk_bytes;       /* default 16 MiB */
    const char *client_name;
    int progress;               /* 1: a progress line per daemon on stderr */
    int no_lane;                /* 1: send chunks over NNG even when the daemon offers a data lane */
    const char *secret;         /* the daemons' shared secret (PROTOCOL.md §14), or NULL: the environment's */
    size_t secret_len;
} rdp_options;

/* One daemon's side of a push; url is set by the caller, the rest is filled. */
typedef struct {
    const char *url;
    int rc;                     /* 0 ok, else RD_E* / RDC_E* */
    uint32_t err_code;          /* PROTO_E_* when the daemon refused */
    char error[512];
    uint64_t bytes_acked;       /* chunk data bytes acknowledged */
    uint64_t wire_bytes;        /* request frames sent (the learner's egress to this daemon) */
    uint64_t total_bytes;
    uint32_t retries;           /* chunks resent (BUSY, CHECKSUM) */
    double seconds;             /* connect to COMMIT_OK */
    double transfer_seconds;    /* UPDATE_BEGIN_OK to the last chunk acknowledged */
    proto_update_commit_ok commit;
} rdp_target;

/* Pushes to every target; returns 0 when all succeeded, else the first
 * failing target's rc (each target says its own). */
int rdp_push(rdp_target *targets, int n_targets, const rdp_tensor *tensors, int n_tensors, const rdp_options *o);

/* A weights file as tensors to push: a .gguf (loaded on the CPU and exported
 * as HF tensors in F32) or a .safetensors file / HF folder (mapped; F32, F16
 * and BF16 tensors only). Valid until rdp_source_close. */
typedef struct {
    rdp_tensor *ts;             /* [n] */
    int n;
    void *gguf;                 /* the loaded model (rd_loaded), or NULL */
    void *mt;                   /* its exported tensors */
    size_t n_mt;
    void *ss;                   /* the mapped safetensors (st_set), or NULL */
} rdp_source;

int rdp_source_open(const char *path, rdp_source *out);
void rdp_source_close(rdp_source *s);

#endif
