/* chat_template.c - the turn formats (ChatML, Llama 3, Gemma) and the
 * prompts tok_chat, tok_chat_msgs and tok_chatml render in them (see
 * tokenizer.h). The turns are written as ids directly: markers as their
 * tokens, the text between them encoded without special parsing, so a message
 * cannot open or close turns. Which markers a vocabulary has and the format
 * they allow are read at load, by tokenizer.c (load_chat): this file sits
 * above tokenizer.c, whose encoder it calls. */
#include "engine/text/tokenizer_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/err.h"

tok_chat_format tok_chat_kind(const tok_tokenizer *t) { return t->chat; }

const char *tok_chat_name(tok_chat_format f)
{
    return f == TOK_CHAT_LLAMA3   ? "llama3"
           : f == TOK_CHAT_CHATML ? "chatml"
           : f == TOK_CHAT_GEMMA  ? "gemma"
                                  : "none";
}

int32_t tok_eot(const tok_tokenizer *t)
{
    return t->chat == TOK_CHAT_LLAMA3   ? t->eot_id
           : t->chat == TOK_CHAT_CHATML ? t->im_end
           : t->chat == TOK_CHAT_GEMMA  ? t->end_turn
                                        : -1;
}

/* Appends the ids of role + sep + content, a stretch of plain text between
 * two markers. The content is never searched for control tokens, so a prompt
 * cannot open or close turns; the ids equal those of the rendered template
 * tokenized with special parsing whenever the content holds no control-token
 * text. */
static int chat_text(const tok_tokenizer *t, tok_work *w, const char *role, const char *sep, const char *content,
                     tok_ids *out)
{
    size_t nr = strlen(role), ns = strlen(sep), nc = strlen(content);
    char *buf = malloc(nr + ns + nc + 1);
    if (!buf)
        return rd_fail(RD_ENOMEM, "tokenizer: out of memory for a chat turn of %zu bytes", nc);
    memcpy(buf, role, nr);
    memcpy(buf + nr, sep, ns);
    memcpy(buf + nr + ns, content, nc);
    int rc = tok_encode_into(t, w, buf, nr + ns + nc, 0, out);
    free(buf);
    return rc;
}

/* One "<|im_start|>{role}\n{content}<|im_end|>\n" turn. */
static int chatml_turn(const tok_tokenizer *t, tok_work *w, const char *role, const char *content, tok_ids *out)
{
    int rc = tok_ids_push(out, t->im_start);
    if (!rc)
        rc = chat_text(t, w, role, "\n", content, out);
    if (!rc)
        rc = tok_ids_push(out, t->im_end);
    if (!rc)
        rc = tok_encode_into(t, w, "\n", 1, 0, out);
    return rc;
}

/* One "<|start_header_id|>{role}<|end_header_id|>\n\n{content}<|eot_id|>"
 * turn; with content NULL only the header and its "\n\n" (the assistant's
 * turn left open). The role sits alone between two markers, so it is a
 * fragment of its own, as in the rendered text. */
static int llama3_turn(const tok_tokenizer *t, tok_work *w, const char *role, const char *content, tok_ids *out)
{
    int rc = tok_ids_push(out, t->start_header);
    if (!rc)
        rc = tok_encode_into(t, w, role, strlen(role), 0, out);
    if (!rc)
        rc = tok_ids_push(out, t->end_header);
    if (!rc)
        rc = chat_text(t, w, "", "\n\n", content ? content : "", out);
    if (!rc && content)
        rc = tok_ids_push(out, t->eot_id);
    return rc;
}

/* One "<start_of_turn>{role}\n{prefix}\n\n{content}<end_of_turn>\n" turn
 * (without "{prefix}\n\n" when prefix is NULL); with content NULL only
 * "<start_of_turn>{role}\n", the model's turn left open. */
static int gemma_turn(const tok_tokenizer *t, tok_work *w, const char *role, const char *prefix,
                      const char *content, tok_ids *out)
{
    int rc = tok_ids_push(out, t->start_turn);
    if (rc)
        return rc;
    if (!content)
        return chat_text(t, w, role, "\n", "", out);
    size_t np = prefix ? strlen(prefix) : 0, nc = strlen(content);
    char *body = malloc(np + 2 + nc + 1);
    if (!body)
        return rd_fail(RD_ENOMEM, "tokenizer: out of memory for a chat turn of %zu bytes", np + nc);
    size_t at = 0;
    if (prefix) {
        memcpy(body, prefix, np);
        memcpy(body + np, "\n\n", 2);
        at = np + 2;
    }
    memcpy(body + at, content, nc + 1);
    rc = chat_text(t, w, role, "\n", body, out);
    free(body);
    if (!rc)
        rc = tok_ids_push(out, t->end_turn);
    if (!rc)
        rc = tok_encode_into(t, w, "\n", 1, 0, out);
    return rc;
}

/* Which markers of a format the vocabulary lacks, for the error message. */
static void missing_markers(const tok_tokenizer *t, tok_chat_format f, char *msg, size_t cap)
{
    const char *name[3];
    int32_t id[3];
    int n = f == TOK_CHAT_LLAMA3 ? 3 : 2;
    if (f == TOK_CHAT_LLAMA3) {
        name[0] = "<|start_header_id|>", name[1] = "<|end_header_id|>", name[2] = "<|eot_id|>";
        id[0] = t->start_header, id[1] = t->end_header, id[2] = t->eot_id;
    } else if (f == TOK_CHAT_GEMMA) {
        name[0] = "<start_of_turn>", name[1] = "<end_of_turn>";
        id[0] = t->start_turn, id[1] = t->end_turn;
    } else {
        name[0] = "<|im_start|>", name[1] = "<|im_end|>";
        id[0] = t->im_start, id[1] = t->im_end;
    }
    size_t at = 0;
    msg[0] = 0;
    for (int i = 0; i < n && at < cap; i++)
        if (id[i] < 0)
            at += (size_t)snprintf(msg + at, cap - at, "%s%s", at ? ", " : "", name[i]);
}

/* Checks a conversation against what format f can render (tok_chat_msgs). */
static int check_msgs(tok_chat_format f, const char *fn, const tok_chat_msg *msgs, size_t n)
{
    if (n == 0)
        return rd_fail(RD_EINVAL, "%s: the conversation has no messages", fn);
    int turn = 0; /* Gemma: turns after the system message, which must alternate user / assistant */
    for (size_t i = 0; i < n; i++) {
        const char *r = msgs[i].role, *c = msgs[i].content;
        if (!r || !c)
            return rd_fail(RD_EINVAL, "%s: message %zu has a NULL role or content", fn, i);
        int sys = !strcmp(r, "system"), user = !strcmp(r, "user"), asst = !strcmp(r, "assistant");
        if (!sys && !user && !asst)
            return rd_fail(RD_EINVAL, "%s: message %zu has role \"%.40s\"; expected system, user or assistant", fn,
                           i, r);
        int rc = tok_check_utf8(sys ? "a system message" : user ? "a user message" : "an assistant message", c,
                            strlen(c));
        if (rc)
            return rc;
        if (f != TOK_CHAT_GEMMA)
            continue;
        /* Hugging Face's Gemma 3 template: one system message, first, that opens the
           first user turn; then user and model turns alternate from the user's. */
        if (sys && i != 0)
            return rd_fail(RD_EINVAL, "%s: message %zu: Gemma's template takes a system message only first", fn, i);
        if (!sys && (user != (turn % 2 == 0)))
            return rd_fail(RD_EINVAL, "%s: message %zu: Gemma's template needs user and assistant turns "
                                      "alternating, starting with the user's (\"%s\" here)", fn, i, r);
        turn += !sys;
    }
    return 0;
}

/* The prompt in format f: every message's turn in order, then the
 * assistant's turn opened for the model to write. */
static int chat_render(const tok_tokenizer *t, tok_chat_format f, const char *fn, const tok_chat_msg *msgs,
                       size_t n, int32_t **ids, size_t *n_ids)
{
    if (!ids || !n_ids)
        return rd_fail(RD_EINVAL, "%s: ids and n_ids must not be NULL", fn);
    *ids = NULL;
    *n_ids = 0;
    if (!t || (n && !msgs))
        return rd_fail(RD_EINVAL, "%s: the tokenizer and the messages must not be NULL", fn);
    if (f == TOK_CHAT_NONE) {
        char l3[96], cm[64], gm[64];
        missing_markers(t, TOK_CHAT_LLAMA3, l3, sizeof l3);
        missing_markers(t, TOK_CHAT_CHATML, cm, sizeof cm);
        missing_markers(t, TOK_CHAT_GEMMA, gm, sizeof gm);
        return rd_fail(RD_ENOTSUP, "%s: the vocabulary has no chat format: Llama 3's needs <|start_header_id|>, "
                                   "<|end_header_id|> and <|eot_id|> (it lacks %s); ChatML's needs <|im_start|> and "
                                   "<|im_end|> (it lacks %s); Gemma's needs <start_of_turn> and <end_of_turn> "
                                   "(it lacks %s)", fn, l3, cm, gm);
    }
    if (f == TOK_CHAT_CHATML && (t->im_start < 0 || t->im_end < 0)) /* only tok_chatml asks for it regardless */
        return rd_fail(RD_ENOTSUP, "%s: the vocabulary has no <|im_start|> or <|im_end|> token, "
                                   "so it cannot write a ChatML prompt", fn);
    int rc = check_msgs(f, fn, msgs, n);
    if (rc)
        return rc;

    tok_work w;
    tok_ids out = {0};
    rc = tok_work_init(&w);
    if (f == TOK_CHAT_CHATML) {
        for (size_t i = 0; i < n && !rc; i++)
            rc = chatml_turn(t, &w, msgs[i].role, msgs[i].content, &out);
        if (!rc)
            rc = tok_ids_push(&out, t->im_start);
        if (!rc)
            rc = tok_encode_into(t, &w, "assistant\n", 10, 0, &out);
    } else if (f == TOK_CHAT_GEMMA) {
        /* Hugging Face's Gemma 3 template: bos_token, then the turns; the
         * system message opens the first user turn, followed by "\n\n"; the
         * assistant's role is "model". */
        if (!rc && t->bos >= 0)
            rc = tok_ids_push(&out, t->bos);
        const char *system = n > 0 && !strcmp(msgs[0].role, "system") ? msgs[0].content : NULL;
        for (size_t i = system ? 1 : 0, first = 1; i < n && !rc; i++, first = 0) {
            int user = !strcmp(msgs[i].role, "user");
            rc = gemma_turn(t, &w, user ? "user" : "model", first ? system : NULL, msgs[i].content, &out);
        }
        if (!rc)
            rc = gemma_turn(t, &w, "model", NULL, NULL, &out);
    } else {
        /* The template's bos_token opens the conversation (<|begin_of_text|>
         * in Llama 3 files); callers add no other BOS. */
        if (!rc && t->bos >= 0)
            rc = tok_ids_push(&out, t->bos);
        for (size_t i = 0; i < n && !rc; i++)
            rc = llama3_turn(t, &w, msgs[i].role, msgs[i].content, &out);
        if (!rc)
            rc = llama3_turn(t, &w, "assistant", NULL, &out);
    }
    tok_work_free(&w);
    if (!rc)
        rc = tok_ids_finish(&out, ids, n_ids);
    if (rc)
        free(out.v);
    return rc;
}

/* The one-turn prompt: a system turn when system is not NULL, the user's. */
static int chat_prompt(const tok_tokenizer *t, tok_chat_format f, const char *fn, const char *system,
                       const char *user, int32_t **ids, size_t *n_ids)
{
    if (!user) {
        if (ids && n_ids) {
            *ids = NULL;
            *n_ids = 0;
        }
        return rd_fail(RD_EINVAL, "%s: the tokenizer and user must not be NULL", fn);
    }
    tok_chat_msg m[2] = {{"system", system}, {"user", user}};
    return system ? chat_render(t, f, fn, m, 2, ids, n_ids) : chat_render(t, f, fn, m + 1, 1, ids, n_ids);
}

int tok_chat_msgs(const tok_tokenizer *t, const tok_chat_msg *msgs, size_t n, int32_t **ids, size_t *n_ids)
{
    return chat_render(t, t ? t->chat : TOK_CHAT_NONE, "tok_chat_msgs", msgs, n, ids, n_ids);
}

int tok_chatml(const tok_tokenizer *t, const char *system, const char *user, int32_t **ids, size_t *n_ids)
{
    return chat_prompt(t, TOK_CHAT_CHATML, "tok_chatml", system, user, ids, n_ids);
}

int tok_chat(const tok_tokenizer *t, const char *system, const char *user, int32_t **ids, size_t *n_ids)
{
    return chat_prompt(t, t ? t->chat : TOK_CHAT_NONE, "tok_chat", system, user, ids, n_ids);
}

