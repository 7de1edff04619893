/* relay.h - one transfer's verified chunks forwarded to the next daemon's
 * data lane (PROTOCOL.md §10.11). The relay knows nothing of a transfer: it
 * reads the chunks through a relay_source (transfer.c provides one). */
#ifndef RD_DAEMON_UPDATE_RELAY_H
#define RD_DAEMON_UPDATE_RELAY_H

#include <stdint.h>
#include <uv.h>

/* A verified chunk as the relay resends it. */
typedef struct {
    uint32_t tensor_index;
    uint32_t len;               /* bytes */
    uint32_t crc32c;
    uint64_t offset;            /* bytes into the tensor */
} relay_chunk;

/* Where the relay reads what it sends; ctx is the source's. */
typedef struct {
    /* The verified chunks so far, in the order they settled (the array may
     * move when more settle; entry i goes out as chunk_seq i). */
    const relay_chunk *(*chunks)(void *ctx, uint32_t *n);
    /* A chunk's bytes, or NULL when the source's copy is gone. */
    const uint8_t *(*data)(void *ctx, const relay_chunk *c);
    /* 1 when every byte of the transfer is here (no more chunks will come). */
    int (*complete)(void *ctx);
    /* The relay's connection is closed and it reads nothing any more. */
    void (*on_closed)(void *ctx);
    void *ctx;
} relay_source;

typedef struct relay relay;

/* Connects to host:port (a numeric IP) and sends src's chunks to the next
 * daemon's transfer next_xfer_id, window chunks unanswered at most; key set:
 * answer the next lane's challenge with it. src->on_closed follows once the
 * relay is closed (not when relay_start fails). */
int relay_start(uv_loop_t *loop, const relay_source *src, const char *host, uint16_t port, uint64_t next_xfer_id,
                uint32_t window, const uint8_t *key, relay **out);
/* More verified chunks, or the transfer is complete: send what the window allows. */
void relay_kick(relay *r);
/* Once a second: a pass that ended with refused chunks starts again. */
void relay_tick(relay *r);
/* Stops it; src->on_closed follows once its connection is closed. */
void relay_close(relay *r);
/* PROTO_FWD_*, the next daemon's error code when it failed, bytes it acknowledged. */
void relay_state(const relay *r, uint8_t *state, uint32_t *error, uint64_t *acked_bytes);

#endif
