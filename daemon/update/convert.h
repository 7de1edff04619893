/* convert.h - the one place the daemon maps the wire's enums (proto/proto.h:
 * PROTO_MODE_*, PROTO_DTYPE_*) to the engine's (engine/update/staging.h:
 * upd_mode, upd_dtype; engine/format/safetensors.h: st_dtype) and back.
 *
 * proto/ and engine/ sit on one floor and include neither the other, so each
 * names the concept for itself. The daemon is above both: it converts here,
 * by name, instead of passing a number across and trusting equal values. The
 * decoder has already refused values outside the wire's enums. */
#ifndef RD_DAEMON_UPDATE_CONVERT_H
#define RD_DAEMON_UPDATE_CONVERT_H

#include <stdint.h>

#include "engine/format/safetensors.h"
#include "engine/update/staging.h"
#include "proto/proto.h"

/* When in-flight sequences meet the new weights (PROTOCOL.md §10.6). */
static inline upd_mode convert_mode(uint8_t wire)
{
    switch (wire) {
    case PROTO_MODE_DRAIN: return UPD_DRAIN;
    case PROTO_MODE_ABORT: return UPD_ABORT;
    default: return UPD_CONTINUE; /* PROTO_MODE_CONTINUE; the decoder refuses others */
    }
}

/* A manifest tensor's dtype; -1 (refused by upd_stage_create) for an unknown one. */
static inline int convert_dtype(uint8_t wire)
{
    switch (wire) {
    case PROTO_DTYPE_F32: return UPD_F32;
    case PROTO_DTYPE_F16: return UPD_F16;
    case PROTO_DTYPE_BF16: return UPD_BF16;
    default: return -1;
    }
}

/* The serve_dtype key (daemon/config.c has refused other values). */
static inline upd_serve convert_serve(const char *serve_dtype)
{
    upd_serve s = UPD_SERVE_AS_PUSHED;
    upd_serve_parse(serve_dtype, &s);
    return s;
}

/* A push's serve_dtype on the wire (UPDATE_BEGIN, version 3): PROTO_SERVE_CONFIG
 * takes the config key's; the result is the PROTO_SERVE_* code it is served as. */
static inline uint8_t convert_serve_code(uint8_t wire, const char *serve_dtype)
{
    if (wire != PROTO_SERVE_CONFIG)
        return wire;
    return (uint8_t)(PROTO_SERVE_AS_PUSHED + convert_serve(serve_dtype));
}

/* PROTO_SERVE_AS_PUSHED.. PROTO_SERVE_MAX are upd_serve + 1 (staging.h). */
static inline upd_serve convert_serve_upd(uint8_t code)
{
    return code >= PROTO_SERVE_AS_PUSHED && code <= PROTO_SERVE_MAX ? (upd_serve)(code - PROTO_SERVE_AS_PUSHED)
                                                                     : UPD_SERVE_AS_PUSHED;
}

/* An exported tensor's dtype as the wire names it (the export writes f32, f16 or bf16). */
static inline uint8_t convert_st_dtype(st_dtype t)
{
    return t == ST_F16 ? PROTO_DTYPE_F16 : t == ST_BF16 ? PROTO_DTYPE_BF16 : PROTO_DTYPE_F32;
}

#endif
