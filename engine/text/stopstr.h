/* stopstr.h - stop strings over a stream of generated tokens.
 *
 * OpenAI and SGLang clients stop on strings; the engine samples ids. Each
 * generated token's bytes (its tok_decode piece: pieces add up exactly over a
 * stream, so nothing is lost at token boundaries) are appended to a window
 * holding the last (longest stop - 1) bytes before them, and every stop string
 * is searched for where it could end inside the new bytes. So a string may
 * span tokens, and the first token that completes one is found at once. Of
 * several strings completed by the same token, the one that starts first
 * wins (the longest at the same start). Matching is on bytes: a stop string
 * is UTF-8 text, and a token that ends inside a multi-byte character leaves
 * its first bytes in the window for the next one. */
#ifndef RD_STOPSTR_H
#define RD_STOPSTR_H

#include <stddef.h>
#include <stdint.h>

#define STOP_MAX_STRS 16        /* stop strings per request */
#define STOP_MAX_LEN 512        /* bytes per stop string */

/* A request's stop strings (owned copies). */
typedef struct {
    int32_t n;
    char *s[STOP_MAX_STRS];
    int32_t len[STOP_MAX_STRS]; /* bytes, 1..STOP_MAX_LEN */
    int32_t max_len;            /* longest, 0 when n is 0 */
} stop_set;

/* One sample's progress through its generated text. */
typedef struct {
    char *win;                  /* the last max_len - 1 bytes scanned, then the token being scanned */
    size_t win_len, win_cap;
    int64_t bytes;              /* generated text so far, in bytes (the window's end) */
    int32_t matched;            /* index of the stop string found, -1 */
    int64_t match_at;           /* byte offset of its first byte in the generated text */
} stop_scan;

/* Copies n strings (NUL-terminated UTF-8, each 1..STOP_MAX_LEN bytes;
 * n <= STOP_MAX_STRS). RD_EINVAL names the one refused. */
int stop_set_init(stop_set *ss, const char *const *strs, int32_t n);
void stop_set_free(stop_set *ss);

void stop_scan_init(stop_scan *sc);
void stop_scan_free(stop_scan *sc);
/* Scans the next token's bytes. Returns 1 when a stop string ends inside
 * them (sc->matched, sc->match_at say which and where), 0 when none does,
 * RD_ENOMEM. After a match further pushes return 1 and change nothing. */
int stop_scan_push(stop_scan *sc, const stop_set *ss, const char *piece, size_t n);
/* Forgets the match the last push found (vLLM's min_tokens: a stop string
 * completed before the minimum length does not end the sample); the next
 * push goes on scanning, and a later match must end in its bytes. */
void stop_scan_forget(stop_scan *sc);

#endif
