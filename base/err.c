/* err.c - per-thread error message (see err.h). */
#include "base/err.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static _Thread_local char rd_msg[512];

int rd_fail(int code, const char *fmt, ...)
{
    /* Formatted into a local buffer first: callers that add context pass the
     * previous message as an argument (rd_fail(rc, "loading x: %s",
     * rd_errmsg())), and vsnprintf into the buffer it reads is undefined. */
    char buf[sizeof rd_msg];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    memcpy(rd_msg, buf, sizeof rd_msg);
    return code;
}

const char *rd_errmsg(void) { return rd_msg; }

const char *rd_strerror(int code)
{
    switch (code) {
    case RD_OK: return "ok";
    case RD_EINVAL: return "invalid argument";
    case RD_ENOMEM: return "out of memory";
    case RD_EIO: return "i/o error";
    case RD_EFORMAT: return "bad format";
    case RD_ERANGE: return "out of range";
    case RD_ENOTSUP: return "not supported";
    case RD_ENOENT: return "not found";
    case RD_EBUSY: return "busy";
    case RD_ENODEV: return "no device";
    case RD_ECHECKSUM: return "checksum mismatch";
    default: return "unknown error";
    }
}
