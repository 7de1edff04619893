/* serve_hist.h - which serve_dtype each recent weight version was served as
 * (issue 26: a result says which policy produced it, and a push may choose
 * its own serve_dtype). The wing notes every swap; results and HTTP replies
 * look their versions up. Loop thread only.
 *
 * A ring of the last SH_CAP versions: a sample can span several pushes, but
 * not SH_CAP of them in practice; an older version looks up as 0
 * (PROTO_SERVE_*: "unknown"). */
#ifndef RD_DAEMON_SERVE_HIST_H
#define RD_DAEMON_SERVE_HIST_H

#include <stdint.h>

#define SH_CAP 256

typedef struct {
    uint64_t version[SH_CAP];   /* weight versions, in the order swapped in */
    uint8_t code[SH_CAP];       /* their PROTO_SERVE_AS_PUSHED / _Q8_0 */
    uint32_t n;                 /* entries noted, ever (the ring holds the last min(n, SH_CAP)) */
} sh_hist;

/* Starts with the weights loaded at start: version, served as code. */
void sh_init(sh_hist *h, uint64_t version, uint8_t code);
/* A swap to version, served as code (versions only increase). */
void sh_note(sh_hist *h, uint64_t version, uint8_t code);
/* The code version was served as, or 0 when the ring no longer holds it. */
uint8_t sh_code(const sh_hist *h, uint64_t version);
/* "as_pushed", "q8_0", "q4_k", "fp8" or "unknown" for a code. */
const char *sh_name(uint8_t code);

#endif
