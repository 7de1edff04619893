/* api_stream.c - a streamed sample's progress: the tokens the engine hands
 * out while the sample runs (eng_collect_progress), their bytes, and which of
 * those bytes may already go out as text.
 *
 * Text goes out only where it can no longer change: a stop string may still
 * be completed by later tokens, and the answer's text is cut where it starts,
 * so the longest tail of the bytes that is a proper prefix of some stop string
 * is held back; and a character whose bytes are not all there yet (or an
 * invalid stretch later bytes could extend) is held back too, so that the
 * pieces sent, each cleaned to UTF-8, add up to the whole answer's clean text.
 * Token ids and log-probs need no holding back: the learner trains on every
 * sampled token, the one that completes a stop string included. */
#include <stdlib.h>
#include <string.h>

#include "daemon/api_int.h"
#include "base/err.h"
#include "base/utf8.h"
#include "engine/text/tokenizer.h"

static int grow(void **p, size_t elem, int32_t cap)
{
    void *q = realloc(*p, elem * (size_t)cap);
    if (!q)
        return RD_ENOMEM;
    *p = q;
    return 0;
}

int api_stream_push(api *a, api_stream *st, const eng_result *r)
{
    int32_t need = st->n_tok + r->n_tokens;
    if (need > st->cap) {
        int32_t cap = st->cap ? st->cap : 64;
        while (cap < need)
            cap *= 2;
        int32_t k = r->n_top;
        if (grow((void **)&st->ids, sizeof(int32_t), cap) || grow((void **)&st->lps, sizeof(float), cap) ||
            (k > 0 && (grow((void **)&st->top_ids, sizeof(int32_t) * (size_t)k, cap) ||
                       grow((void **)&st->top_lps, sizeof(float) * (size_t)k, cap))))
            return RD_ENOMEM;
        st->cap = cap;
    }
    st->n_top = r->n_top;
    memcpy(st->ids + st->n_tok, r->token_ids, sizeof(int32_t) * (size_t)r->n_tokens);
    memcpy(st->lps + st->n_tok, r->logprobs, sizeof(float) * (size_t)r->n_tokens);
    if (r->n_top > 0 && r->top_ids && r->top_logprobs) {
        memcpy(st->top_ids + (size_t)st->n_tok * r->n_top, r->top_ids,
               sizeof(int32_t) * (size_t)r->n_tokens * r->n_top);
        memcpy(st->top_lps + (size_t)st->n_tok * r->n_top, r->top_logprobs,
               sizeof(float) * (size_t)r->n_tokens * r->n_top);
    }
    st->n_tok = need;
    for (int32_t i = 0; i < r->n_tokens; i++) {
        size_t n = 0;
        const char *b = api_token_bytes(a, r->token_ids[i], &n);
        if (!b || !n)
            continue;
        if (st->raw_len + n + 1 > st->raw_cap) {
            size_t cap = st->raw_cap ? st->raw_cap : 256;
            while (cap < st->raw_len + n + 1)
                cap *= 2;
            char *q = realloc(st->raw, cap);
            if (!q)
                return RD_ENOMEM;
            st->raw = q;
            st->raw_cap = cap;
        }
        memcpy(st->raw + st->raw_len, b, n);
        st->raw_len += n;
    }
    return 0;
}

size_t api_stream_safe(const api_stream *st, const api_params *p)
{
    const char *raw = st->raw;
    size_t len = st->raw_len, limit = len;
    /* The longest tail that a stop string starts with (a whole one would have
       finished the sample). */
    for (int32_t i = 0; i < p->n_stop_strs; i++) {
        size_t L = strlen(p->stop_strs[i]);
        for (size_t k = L - 1 < len ? L - 1 : len; k > 0; k--)
            if (len - k < limit && !memcmp(raw + len - k, p->stop_strs[i], k)) {
                limit = len - k;
                break;
            }
    }
    /* The last boundary of utf8_clean's left-to-right walk before limit
       whose elements are all closed: more bytes could not change them. */
    return utf8_stream_end((const uint8_t *)raw, len, st->text_sent, limit);
}

eng_result api_stream_view(const api_stream *st, const eng_result *like)
{
    eng_result v = *like;
    v.n_tokens = st->n_tok;
    v.token_ids = st->ids;
    v.logprobs = st->lps;
    v.logprobs_proc = NULL;
    v.n_top = st->top_ids ? st->n_top : 0;
    v.top_ids = st->top_ids;
    v.top_logprobs = st->top_lps;
    v.n_spans = 0;
    v.spans = NULL;
    return v;
}

void api_stream_free(api_stream *st)
{
    free(st->ids);
    free(st->lps);
    free(st->top_ids);
    free(st->top_lps);
    free(st->raw);
    memset(st, 0, sizeof *st);
}

/* Bytes [0, safe) of st's text without those of control tokens (skip_special_tokens), malloc'd:
 * st->raw is the tokens' bytes back to back, so the final text (api_sample_text) starts with it. */
char *api_stream_shown(api *a, const api_stream *st, size_t safe, size_t *len)
{
    char *out = malloc(safe + 1);
    if (!out)
        return NULL;
    size_t at = 0, n = 0;
    for (int32_t k = 0; k < st->n_tok && at < safe; k++) {
        size_t nb = 0;
        if (!tok_token_bytes(a->d->L.tok, st->ids[k], &nb))
            continue;
        size_t take = at + nb <= safe ? nb : safe - at;
        if (!tok_is_control(a->d->L.tok, st->ids[k])) {
            memcpy(out + n, st->raw + at, take);
            n += take;
        }
        at += take;
    }
    *len = n;
    return out;
}
