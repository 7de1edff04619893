/* spm.c - SentencePiece-style BPE (tokenizer.ggml.model "llama"; see
 * tokenizer.h): llama.cpp's llm_tokenizer_spm_session on each stretch of
 * text between special tokens. No pre-tokenizer, no merge list: pairs of
 * adjacent symbols merge by the score of the token they make, found in the
 * same hash table as every other text lookup. */
#include "engine/text/tokenizer_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/err.h"
#include "base/utf8.h"

/* U+2581 LOWER ONE EIGHTH BLOCK: SentencePiece's written space. */
static const char SPM_SPACE[] = "\xe2\x96\x81";

/* The score of each token (tokenizer.ggml.scores, float32 or int32 as
 * llama.cpp accepts); every score 0 when the file has none. */
int spm_load_scores(tok_tokenizer *t, const gguf_file *g)
{
    t->score = calloc((size_t)t->n_vocab, sizeof(float));
    if (!t->score)
        return rd_fail(RD_ENOMEM, "tokenizer: out of memory for %d scores", t->n_vocab);
    const gguf_kv *kv = gguf_find_kv(g, "tokenizer.ggml.scores");
    if (!kv)
        return 0;
    if (kv->type != GGUF_ARRAY || (kv->arr_type != GGUF_FLOAT32 && kv->arr_type != GGUF_INT32))
        return rd_fail(RD_EFORMAT, "tokenizer: tokenizer.ggml.scores must be an array of float32 (or int32)");
    if (kv->arr_n < (uint64_t)t->n_vocab)
        return rd_fail(RD_EFORMAT, "tokenizer: tokenizer.ggml.scores has %llu entries for %d tokens",
                       (unsigned long long)kv->arr_n, t->n_vocab);
    /* The array's bytes are in the mapping, little-endian and maybe unaligned. */
    for (int32_t i = 0; i < t->n_vocab; i++) {
        if (kv->arr_type == GGUF_FLOAT32) {
            memcpy(&t->score[i], kv->val + 4 * (size_t)i, 4);
        } else {
            int32_t v;
            memcpy(&v, kv->val + 4 * (size_t)i, 4);
            t->score[i] = (float)v;
        }
    }
    return 0;
}

/* llama.cpp's byte_to_token: "<0xXX>" (upper-case hex), else the byte itself. */
void spm_byte_tokens(tok_tokenizer *t)
{
    for (int b = 0; b < 256; b++) {
        char s[7];
        snprintf(s, sizeof s, "<0x%02X>", b);
        t->byte_tok[b] = tok_vocab_find(t, s, 6);
        if (t->byte_tok[b] < 0) {
            s[0] = (char)b;
            t->byte_tok[b] = tok_vocab_find(t, s, 1);
        }
    }
}

/* llama.cpp's llama_unescape_whitespace. U+2581 is three bytes, a space one:
 * never longer than the text. */
uint32_t spm_decode_text(const uint8_t *s, uint32_t n, uint8_t *out)
{
    uint32_t o = 0;
    for (uint32_t k = 0; k < n;) {
        if (k + 3 <= n && memcmp(s + k, SPM_SPACE, 3) == 0) {
            out[o++] = ' ';
            k += 3;
        } else {
            out[o++] = s[k++];
        }
    }
    return o;
}

/* Queues the merge of symbols left and right (adjacent, in that order) when
 * their concatenation is a token, of any type (llama.cpp's try_add_bigram).
 * Stale once either symbol has changed, which shows in their lengths: a live
 * symbol only grows, by taking in its successor, and one merged away has
 * length 0 (llama.cpp's test compares the total). */
static int spm_try_pair(const tok_tokenizer *t, tok_work *w, int32_t left, int32_t right)
{
    if (left < 0 || right < 0)
        return 0;
    uint32_t ll = w->sym_len[left], rl = w->sym_len[right], size = ll + rl;
    if (size > t->max_text_len)
        return 0; /* longer than any token */
    int32_t id = tok_vocab_find(t, w->text + w->sym_off[left], size);
    if (id < 0)
        return 0;
    return tok_heap_push(w, (tok_pair){t->score[id], left, right, (int32_t)ll, (int32_t)rl});
}

/* One stretch of text between special tokens, appending its tokens: a space
 * first when prefix is set, each " " as U+2581, then the merges by score. A
 * symbol left at the end is its token, or else the bytes of its text as byte
 * tokens. (llama.cpp's resegment would first split such a symbol back along
 * the merges that made it, but every merge makes a token, so only a single
 * character that is no token is ever left over: its bytes are all there is.) */
int spm_encode(const tok_tokenizer *t, tok_work *w, const char *s, size_t len, int prefix, tok_ids *out)
{
    /* Each byte is at most 3 bytes escaped and at most one symbol. */
    if (len + (prefix != 0) == 0)
        return 0;
    int rc = tok_work_reserve(w, len + 1);
    if (!rc)
        rc = tok_work_text(w, 3 * (len + 1));
    if (rc)
        return rc;
    size_t n = 0;
    if (prefix) {
        memcpy(w->text, SPM_SPACE, 3);
        n = 3;
    }
    for (size_t i = 0; i < len; i++) {
        if (s[i] == ' ') {
            memcpy(w->text + n, SPM_SPACE, 3);
            n += 3;
        } else {
            w->text[n++] = s[i];
        }
    }
    /* The text is valid UTF-8 (checked by the caller), so each lead byte
     * gives its character's length, as llama.cpp's unicode_len_utf8 does. */
    int32_t m = 0;
    for (size_t at = 0; at < n; m++) {
        size_t k = utf8_seq((const uint8_t *)w->text + at, n - at);
        if (k == 0)
            k = 1; /* not reached for valid UTF-8 */
        w->sym_off[m] = (uint32_t)at;
        w->sym_len[m] = (uint32_t)k;
        w->prev[m] = m - 1;
        at += k;
    }
    for (int32_t i = 0; i < m; i++)
        w->next[i] = i + 1 < m ? i + 1 : -1;

    w->heap_n = 0;
    for (int32_t i = 1; i < m; i++)
        if ((rc = spm_try_pair(t, w, i - 1, i)))
            return rc;
    while (w->heap_n > 0) {
        tok_pair p = tok_heap_pop(w);
        uint32_t ll = w->sym_len[p.left], rl = w->sym_len[p.right];
        if (ll != (uint32_t)p.left_state || rl != (uint32_t)p.right_state)
            continue;
        /* The right symbol joins the left one. */
        w->sym_len[p.left] = ll + rl;
        w->sym_len[p.right] = 0;
        int32_t after = w->next[p.right];
        w->next[p.left] = after;
        if (after >= 0)
            w->prev[after] = p.left;
        if ((rc = spm_try_pair(t, w, w->prev[p.left], p.left)) || (rc = spm_try_pair(t, w, p.left, after)))
            return rc;
    }

    for (int32_t i = 0; i >= 0; i = w->next[i]) {
        const char *sym = w->text + w->sym_off[i];
        uint32_t k = w->sym_len[i];
        int32_t id = tok_vocab_find(t, sym, k);
        if (id >= 0) {
            if ((rc = tok_ids_push(out, id)))
                return rc;
            continue;
        }
        for (uint32_t b = 0; b < k; b++) {
            int32_t bt = t->byte_tok[(uint8_t)sym[b]];
            if (bt < 0)
                return rd_fail(RD_EINVAL, "tokenizer: the vocabulary has no token for the character \"%.*s\" and no "
                                          "byte token <0x%02X> to write it with", (int)k, sym, (uint8_t)sym[b]);
            if ((rc = tok_ids_push(out, bt)))
                return rc;
        }
    }
    return 0;
}
