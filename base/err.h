/* err.h - error codes and the per-thread error message.
 *
 * Every library function returns 0 or a negative RD_E* code and never exits.
 * Where it fails it also records a sentence saying what was wrong and what was
 * expected; rd_errmsg() returns it on the same thread. */
#ifndef RD_ERR_H
#define RD_ERR_H

enum {
    RD_OK = 0,
    RD_EINVAL = -1,   /* bad argument or parameter */
    RD_ENOMEM = -2,   /* allocation failed or a budget is exhausted */
    RD_EIO = -3,      /* open/read/mmap failed */
    RD_EFORMAT = -4,  /* corrupt or truncated file, malformed data */
    RD_ERANGE = -5,   /* value outside the allowed range */
    RD_ENOTSUP = -6,  /* valid but not supported (dtype, architecture) */
    RD_ENOENT = -7,   /* key, tensor or request not found */
    RD_EBUSY = -8,    /* no capacity right now; retry later */
    RD_ENODEV = -9,   /* backend device not available */
    RD_ECHECKSUM = -10, /* data does not match its checksum */
};

/* Records the message (printf-style) and returns code, so callers can write
 * `return rd_fail(RD_EINVAL, "n must be >= 1, got %d", n);`. The arguments
 * may include rd_errmsg() itself, to add context to a callee's message
 * (`rd_fail(rc, "loading %s: %s", path, rd_errmsg())`); the result is cut at
 * 511 bytes. */
int rd_fail(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* The last message recorded on this thread ("" if none). */
const char *rd_errmsg(void);

/* A short name for a code ("invalid argument", ...). */
const char *rd_strerror(int code);

#endif
