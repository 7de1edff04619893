/* serve_dtype.h - what the pushed linear weights become in the backend (the
 * daemon's serve_dtype), by name. Its own file so that what reads the name (the
 * config, the HTTP readers and their fuzz target) needs none of staging. */
#ifndef RD_SERVE_DTYPE_H
#define RD_SERVE_DTYPE_H

/* What the pushed linear weights become in the backend (the daemon's
 * serve_dtype): kept in their pushed dtype, or quantized while the patch is
 * built (to Q8_0, to Q4_K with Q8_0 where Q4_K cannot go, or to FP8 blocks:
 * engine/model/quant.h, quant_fp8.h; staging.c's serve_type says which groups
 * and why), so the engine runs those GEMMs on them. = PROTO_SERVE_* - 1. */
typedef enum { UPD_SERVE_AS_PUSHED = 0, UPD_SERVE_Q8_0 = 1, UPD_SERVE_Q4_K = 2, UPD_SERVE_FP8 = 3 } upd_serve;
/* "as_pushed", "q8_0", "q4_k", "fp8" ("unknown" for another value). */
const char *upd_serve_name(upd_serve serve);
/* The serve of one of those names; RD_EINVAL (no message) for another. */
int upd_serve_parse(const char *name, upd_serve *out);

#endif
