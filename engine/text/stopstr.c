/* stopstr.c - see stopstr.h. */
#include "engine/text/stopstr.h"

#include <stdlib.h>
#include <string.h>

#include "base/err.h"

int stop_set_init(stop_set *ss, const char *const *strs, int32_t n)
{
    memset(ss, 0, sizeof *ss);
    if (n < 0 || n > STOP_MAX_STRS)
        return rd_fail(RD_EINVAL, "stop strings: %d given; expected at most %d", n, STOP_MAX_STRS);
    if (n > 0 && !strs)
        return rd_fail(RD_EINVAL, "stop strings: %d given but the array is NULL", n);
    for (int32_t i = 0; i < n; i++) {
        size_t len = strs[i] ? strlen(strs[i]) : 0;
        if (len < 1 || len > STOP_MAX_LEN) {
            stop_set_free(ss);
            return rd_fail(RD_EINVAL, "stop string %d is %zu bytes long; expected 1..%d", i, len, STOP_MAX_LEN);
        }
        ss->s[i] = malloc(len + 1);
        if (!ss->s[i]) {
            stop_set_free(ss);
            return rd_fail(RD_ENOMEM, "stop strings: out of memory");
        }
        memcpy(ss->s[i], strs[i], len + 1);
        ss->len[i] = (int32_t)len;
        ss->n = i + 1;
        if ((int32_t)len > ss->max_len)
            ss->max_len = (int32_t)len;
    }
    return 0;
}

void stop_set_free(stop_set *ss)
{
    for (int32_t i = 0; i < ss->n; i++)
        free(ss->s[i]);
    memset(ss, 0, sizeof *ss);
}

void stop_scan_init(stop_scan *sc)
{
    memset(sc, 0, sizeof *sc);
    sc->matched = -1;
}

void stop_scan_free(stop_scan *sc)
{
    free(sc->win);
    stop_scan_init(sc);
}

int stop_scan_push(stop_scan *sc, const stop_set *ss, const char *piece, size_t n)
{
    if (sc->matched >= 0)
        return 1;
    if (ss->n == 0 || n == 0) {
        sc->bytes += (int64_t)n;
        return 0;
    }
    if (sc->win_len + n > sc->win_cap) {
        size_t cap = sc->win_cap ? sc->win_cap : 64;
        while (cap < sc->win_len + n)
            cap *= 2;
        char *w = realloc(sc->win, cap);
        if (!w)
            return rd_fail(RD_ENOMEM, "stop strings: out of memory for a %zu-byte window", cap);
        sc->win = w;
        sc->win_cap = cap;
    }
    size_t old = sc->win_len;
    memcpy(sc->win + old, piece, n);
    sc->win_len += n;
    sc->bytes += (int64_t)n;

    /* Earlier bytes held no match, so one must end in the new bytes: for a
     * string of length L start no earlier than old - (L - 1). */
    int32_t best = -1;
    size_t best_at = 0;
    for (int32_t i = 0; i < ss->n; i++) {
        size_t L = (size_t)ss->len[i];
        if (L > sc->win_len)
            continue;
        size_t from = old + 1 > L ? old + 1 - L : 0;
        for (size_t at = from; at + L <= sc->win_len; at++) {
            if (best >= 0 && (at > best_at || (at == best_at && L <= (size_t)ss->len[best])))
                break;
            if (!memcmp(sc->win + at, ss->s[i], L)) {
                best = i;
                best_at = at;
                break;
            }
        }
    }
    if (best >= 0) {
        sc->matched = best;
        sc->match_at = sc->bytes - (int64_t)(sc->win_len - best_at);
        return 1;
    }
    /* Keep the bytes a later match could start in. */
    size_t keep = (size_t)ss->max_len - 1;
    if (sc->win_len > keep) {
        memmove(sc->win, sc->win + sc->win_len - keep, keep);
        sc->win_len = keep;
    }
    return 0;
}

void stop_scan_forget(stop_scan *sc) { sc->matched = -1; }
