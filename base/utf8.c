/* utf8.c - UTF-8 checking, walking and clean-up (see utf8.h). */
#include "base/utf8.h"

#include <stdlib.h>
#include <string.h>

/* The length of a sequence lead byte c opens (2-4), and the range its
 * second byte must be in (RFC 3629 table: E0 needs A0.. and F0 90.. against
 * overlongs, ED stops at 9F against surrogates, F4 at 8F against code points
 * past U+10FFFF); 1 for ASCII and for a byte that opens none (80..C1, F5..FF). */
static size_t lead(uint8_t c, uint8_t *lo, uint8_t *hi)
{
    *lo = 0x80;
    *hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF)
        return 2;
    if (c >= 0xE0 && c <= 0xEF) {
        *lo = c == 0xE0 ? 0xA0 : 0x80;
        *hi = c == 0xED ? 0x9F : 0xBF;
        return 3;
    }
    if (c >= 0xF0 && c <= 0xF4) {
        *lo = c == 0xF0 ? 0x90 : 0x80;
        *hi = c == 0xF4 ? 0x8F : 0xBF;
        return 4;
    }
    return 1;
}

size_t utf8_lead_len(uint8_t c)
{
    uint8_t lo, hi;
    return lead(c, &lo, &hi);
}

size_t utf8_decode(const uint8_t *s, size_t n, uint32_t *cp)
{
    if (n == 0)
        return 0;
    if (s[0] < 0x80) {
        *cp = s[0];
        return 1;
    }
    uint8_t lo, hi;
    size_t k = lead(s[0], &lo, &hi);
    if (k == 1 || n < k || s[1] < lo || s[1] > hi)
        return 0;
    /* The lead byte keeps 7 - k bits. */
    uint32_t v = s[0] & (0x7Fu >> k);
    for (size_t j = 1; j < k; j++) {
        if ((s[j] & 0xC0) != 0x80)
            return 0;
        v = v << 6 | (s[j] & 0x3F);
    }
    *cp = v;
    return k;
}

size_t utf8_seq(const uint8_t *s, size_t n)
{
    uint32_t cp;
    return utf8_decode(s, n, &cp);
}

size_t utf8_invalid_at(const uint8_t *s, size_t n)
{
    size_t i = 0;
    while (i < n) {
        if (s[i] < 0x80) { /* the common case, without a call */
            i++;
            continue;
        }
        size_t k = utf8_seq(s + i, n - i);
        if (k == 0)
            return i;
        i += k;
    }
    return n;
}

size_t utf8_bad_run(const uint8_t *s, size_t n)
{
    uint8_t lo, hi;
    size_t k = lead(s[0], &lo, &hi);
    if (k == 1 || n < 2 || s[1] < lo || s[1] > hi)
        return 1;
    size_t j = 2;
    while (j < k && j < n && (s[j] & 0xC0) == 0x80)
        j++;
    return j;
}

char *utf8_clean(const char *text, size_t n, size_t *out_len)
{
    const uint8_t *s = (const uint8_t *)text;
    /* Each bad run (at least one byte) becomes three. */
    size_t bad = 0;
    for (size_t i = 0; i < n;) {
        size_t k = utf8_seq(s + i, n - i);
        bad += !k;
        i += k ? k : utf8_bad_run(s + i, n - i);
    }
    char *out = malloc(n + 2 * bad + 1), *o = out;
    if (!out)
        return NULL;
    for (size_t i = 0; i < n;) {
        size_t k = utf8_seq(s + i, n - i);
        if (k) {
            memcpy(o, s + i, k);
            o += k;
            i += k;
        } else {
            memcpy(o, "\xef\xbf\xbd", 3);
            o += 3;
            i += utf8_bad_run(s + i, n - i);
        }
    }
    *o = 0;
    *out_len = (size_t)(o - out);
    return out;
}

size_t utf8_stream_end(const uint8_t *s, size_t n, size_t from, size_t limit)
{
    size_t i = from;
    while (i < limit) {
        size_t k = utf8_seq(s + i, n - i);
        if (!k) {
            k = utf8_bad_run(s + i, n - i);
            if (i + k == n && k < utf8_lead_len(s[i]))
                break; /* cut by the end of the bytes so far: it may yet become a character */
        }
        if (i + k > limit)
            break;
        i += k;
    }
    return i;
}
