/* utf8.h - UTF-8 as RFC 3629 defines it: no overlong forms, no surrogates
 * (U+D800..U+DFFF), nothing past U+10FFFF; the set Python's strict decoder
 * accepts. What the floors above need of it: checking text (the tokenizer,
 * the wire protocol), walking it sequence by sequence, and turning bytes that
 * are not UTF-8 into valid text (JSON answers, streamed pieces) the way a
 * Python detokenizer shows them.
 *
 * Bytes are taken as uint8_t (callers with char cast); every function is
 * pure and thread-safe; n may be 0. */
#ifndef RD_UTF8_H
#define RD_UTF8_H

#include <stddef.h>
#include <stdint.h>

/* Decodes the sequence at s[0..n): its length (1-4) and *cp, or 0 (cp
 * untouched) when s starts with no valid sequence: a byte that opens none, a
 * continuation byte out of range or missing (n too short), an overlong form,
 * a surrogate, past U+10FFFF. */
size_t utf8_decode(const uint8_t *s, size_t n, uint32_t *cp);

/* utf8_decode's length alone. */
size_t utf8_seq(const uint8_t *s, size_t n);

/* Offset of the first byte that starts no valid sequence, or n when all of
 * s[0..n) is UTF-8. */
size_t utf8_invalid_at(const uint8_t *s, size_t n);

/* The bytes at s[0..n) (n > 0, no valid sequence there) that one U+FFFD
 * replaces: Unicode's "maximal subpart" (what Python's errors="replace"
 * does): a lead byte with the continuation bytes that could still have
 * completed it, else one byte. */
size_t utf8_bad_run(const uint8_t *s, size_t n);

/* The length of a complete sequence that lead byte c opens: 2-4, or 1 for
 * ASCII and for a byte that opens none. */
size_t utf8_lead_len(uint8_t c);

/* A malloc'd, NUL-terminated copy of s[0..n) with each utf8_bad_run
 * replaced by U+FFFD; *out_len its bytes. NULL when out of memory. */
char *utf8_clean(const char *s, size_t n, size_t *out_len);

/* Streaming s[0..n), the bytes produced so far, as utf8_clean would show
 * them: the end of the last step of utf8_clean's walk (a valid sequence, or
 * one utf8_bad_run) that starts at from or later, ends at or before limit,
 * and that more bytes after s[n - 1] could not change. A bad run that the
 * end of the bytes cuts short of utf8_lead_len may still become a
 * character, so the walk stops before it. from (<= limit <= n) is itself
 * such a boundary; returns from when no step qualifies. */
size_t utf8_stream_end(const uint8_t *s, size_t n, size_t from, size_t limit);

#endif
