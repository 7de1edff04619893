/* cli.h - flag value parsing for the command-line tools: every value is
 * checked, and a bad one names the flag and what was expected. */
#ifndef RD_CLI_H
#define RD_CLI_H

#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/utf8.h"

static inline void cli_die(const char *prog, const char *fmt, const char *a, const char *b)
{
    fprintf(stderr, "%s: ", prog);
    fprintf(stderr, fmt, a, b);
    fprintf(stderr, "\n");
    exit(2);
}

/* argv[*i] is the flag; returns its value argv[++*i]. */
static inline const char *cli_value(const char *prog, int argc, char **argv, int *i)
{
    if (*i + 1 >= argc)
        cli_die(prog, "flag %s needs a value%s", argv[*i], "");
    return argv[++*i];
}

static inline long long cli_int(const char *prog, const char *flag, const char *v, long long lo, long long hi)
{
    char *end;
    errno = 0;
    long long x = strtoll(v, &end, 10);
    if (errno || end == v || *end || x < lo || x > hi) {
        char want[96];
        snprintf(want, sizeof want, "an integer in %lld..%lld", lo, hi);
        fprintf(stderr, "%s: %s expects %s, got '%s'\n", prog, flag, want, v);
        exit(2);
    }
    return x;
}

static inline double cli_float(const char *prog, const char *flag, const char *v, double lo, double hi)
{
    char *end;
    errno = 0;
    double x = strtod(v, &end);
    if (errno || end == v || *end || !isfinite(x) || x < lo || x > hi) {
        fprintf(stderr, "%s: %s expects a number in %g..%g, got '%s'\n", prog, flag, lo, hi, v);
        exit(2);
    }
    return x;
}

/* "1,2,3" -> malloc'd ids; every id an integer >= 0. */
static inline int32_t *cli_ids(const char *prog, const char *flag, const char *v, int32_t *n)
{
    size_t cap = 16, k = 0;
    int32_t *ids = malloc(cap * sizeof *ids);
    const char *p = v;
    while (*p) {
        char *end;
        errno = 0;
        long x = strtol(p, &end, 10);
        if (errno || end == p || x < 0 || x > INT32_MAX || (*end && *end != ',')) {
            fprintf(stderr, "%s: %s expects comma-separated token ids (integers >= 0), got '%s'\n", prog, flag, v);
            exit(2);
        }
        if (k == cap)
            ids = realloc(ids, (cap *= 2) * sizeof *ids);
        ids[k++] = (int32_t)x;
        p = *end ? end + 1 : end;
    }
    if (k == 0) {
        fprintf(stderr, "%s: %s is empty (expected comma-separated token ids)\n", prog, flag);
        exit(2);
    }
    *n = (int32_t)k;
    return ids;
}

/* Decoded text can end inside a UTF-8 character (byte-level tokens) and
 * JSON needs valid UTF-8: returns a malloc'd copy of s[0..len) with every
 * byte that starts no valid sequence (utf8_seq) replaced by U+FFFD, one per
 * byte (the daemon's answers use utf8_clean, one per maximal subpart). */
static inline char *cli_utf8_clean(const char *s, size_t len)
{
    char *out = malloc(len * 3 + 1), *o = out;
    if (!out)
        return NULL;
    const uint8_t *p = (const uint8_t *)s, *end = p + len;
    while (p < end) {
        size_t n = utf8_seq(p, (size_t)(end - p));
        if (n) {
            memcpy(o, p, n);
            o += n;
            p += n;
        } else {
            memcpy(o, "\xef\xbf\xbd", 3);
            o += 3;
            p++;
        }
    }
    *o = 0;
    return out;
}

#endif
