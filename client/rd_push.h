/* rd_push.h - push one set of weights to many daemons at once (PROTOCOL.md §10).
 *
 * The tensors are split into chunks and checksummed once (CRC-32C per chunk,
 * combined into each tensor's); then the daemons get them in one of two ways
 * (§10.8):
 *
 * - direct: every daemon gets its own connection, UPDATE_BEGIN, a window of
 *   chunks in flight (over its data lane, or one thread per slot of the
 *   window over NNG) and UPDATE_COMMIT, all daemons concurrently, so the
 *   slowest one only sets its own pace. Any failure aborts that daemon's
 *   transfer (its old weights keep serving) and is reported for it alone.
 * - chain (§10.11): UPDATE_BEGIN on every daemon, UPDATE_FORWARD from each to
 *   the next, the chunks to the first daemon only (this process sends every
 *   byte once), UPDATE_PREPARE polled on all until every daemon has verified
 *   and built the update, then UPDATE_COMMIT on all (two-phase). A daemon
 *   that stops answering or fails is routed around (its predecessor relays to
 *   its successor, or this process feeds the successor); the update is then
 *   aborted everywhere, or (RDP_ON_FAILURE_COMMIT) committed on the rest. */
#ifndef RD_PUSH_H
#define RD_PUSH_H

#include <stdint.h>

#include "proto/proto.h"

/* rdp_options.fanout and rdp_target.fanout */
enum { RDP_FANOUT_AUTO = 0, RDP_FANOUT_CHAIN = 1, RDP_FANOUT_DIRECT = 2 };
/* rdp_options.on_failure (a chain's; a direct push commits where it can anyway) */
enum { RDP_ON_FAILURE_ABORT = 0, RDP_ON_FAILURE_COMMIT = 1 };

/* A chain member whose update was aborted because another daemon failed. */
#define RDP_EABORTED (-102)

typedef struct {
    const char *name;           /* HF name */
    uint8_t dtype;              /* PROTO_DTYPE_* */
    uint8_t n_dims;
    uint64_t shape[PROTO_MAX_DIMS];
    uint64_t nbytes;
    const uint8_t *data;        /* [nbytes], little-endian row-major (a delta's: its stream) */
    /* A delta (PROTOCOL.md §10.14; rd_delta.h makes them): flags PROTO_TENSOR_DELTA, data/nbytes
     * the delta stream, full_bytes and full_crc the tensor's new bytes; 0 for a whole tensor. */
    uint16_t flags;
    uint64_t full_bytes;
    uint32_t full_crc;
    uint64_t base_version;
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
    int fanout;                 /* RDP_FANOUT_*: AUTO is a chain for 2 or more daemons when every one announces
                                 * PROTO_FEATURE_RELAY and offers a data lane (tcp:// without TLS), else direct */
    int on_failure;             /* RDP_ON_FAILURE_*: what a chain does when a daemon fails */
} rdp_options;

/* One daemon's side of a push; url is set by the caller, the rest is filled. */
typedef struct {
    const char *url;
    int rc;                     /* 0 ok, else RD_E* / RDC_E* */
    uint32_t err_code;          /* PROTO_E_* when the daemon refused */
    char error[512];
    uint64_t bytes_acked;       /* chunk data bytes acknowledged (chain: verified on the daemon) */
    uint64_t wire_bytes;        /* chunk frames sent (this process's egress to this daemon; chain: 0 when relayed) */
    uint64_t total_bytes;
    uint32_t retries;           /* chunks resent (BUSY, CHECKSUM) */
    double seconds;             /* connect to COMMIT_OK */
    double transfer_seconds;    /* UPDATE_BEGIN_OK to the last chunk acknowledged (chain: first chunk to all READY) */
    proto_update_commit_ok commit;
    int fanout;                 /* RDP_FANOUT_CHAIN or RDP_FANOUT_DIRECT: how this push went */
    int hop;                    /* chain: daemons the chunks passed before this one (0: fed by this process) */
} rdp_target;

/* Pushes to every target; returns 0 when all succeeded, else the first
 * failing target's rc (each target says its own; in a chain aborted on
 * failure the others say RDP_EABORTED). */
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
