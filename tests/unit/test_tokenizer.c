/* test_tokenizer.c - the GPT-2 BPE tokenizer on the real model (env RD_MODEL)
 * and on toy vocabularies written as in-memory GGUF files. The token-by-token
 * comparison with llama.cpp lives in tests/py/test_tokenizer.py. */
#include <pthread.h>
#include <stdint.h>

#include "engine/err.h"
#include "engine/gguf.h"
#include "engine/tokenizer.h"
#include "tests/unit/test.h"

static gguf_file *model_file;
static tok_tokenizer *model_tok;

static int32_t count_id(const int32_t *ids, size_t n, int32_t id)
{
    int32_t c = 0;
    for (size_t i = 0; i < n; i++)
        c += ids[i] == id;
    return c;
}

/* decode(encode(s)) must give s back byte for byte. */
static int roundtrips(const tok_tokenizer *t, const char *s, size_t len, int special)
{
    int32_t *ids = NULL;
    size_t n = 0, back_len = 0;
    char *back = NULL;
    if (tok_encode(t, s, len, special, &ids, &n) != 0)
        return 0;
    int ok = tok_decode(t, ids, n, &back, &back_len) == 0 && back_len == len && memcmp(back, s, len) == 0;
    free(ids);
    free(back);
    return ok;
}

static void test_model_header_values(void)
{
    uint32_t bos, eos;
    CHECK_OK(gguf_get_u32(model_file, "tokenizer.ggml.bos_token_id", &bos));
    CHECK_OK(gguf_get_u32(model_file, "tokenizer.ggml.eos_token_id", &eos));
    CHECK(tok_vocab_size(model_tok) == 49152, "vocab %d", tok_vocab_size(model_tok));
    CHECK(tok_bos(model_tok) == (int32_t)bos && bos == 1, "bos %d, file %u", tok_bos(model_tok), bos);
    CHECK(tok_eos(model_tok) == (int32_t)eos && eos == 2, "eos %d, file %u", tok_eos(model_tok), eos);
    CHECK(tok_add_bos(model_tok) == 0, "add_bos %d (the file says false)", tok_add_bos(model_tok));
    CHECK(strcmp(tok_piece(model_tok, 1), "<|im_start|>") == 0, "piece 1 is %s", tok_piece(model_tok, 1));
    CHECK(strcmp(tok_piece(model_tok, 2), "<|im_end|>") == 0, "piece 2 is %s", tok_piece(model_tok, 2));
    CHECK(tok_piece(model_tok, -1) == NULL && tok_piece(model_tok, 49152) == NULL, "out-of-range piece");
}

static void test_known_ids(void)
{
    /* Checked against llama.cpp; a space is part of the following word. */
    int32_t *ids = NULL;
    size_t n = 0;
    CHECK_OK(tok_encode(model_tok, "Hello world", 11, 0, &ids, &n));
    int ok = n == 2 && ids[0] == 19556 && ids[1] == 905;
    free(ids);
    CHECK(ok, "\"Hello world\" gave %zu ids", n);
}

static void test_roundtrip(void)
{
    static const char *texts[] = {
        "Hello world",
        "I'm sure you're right, it's what we've said and they'll do it.",
        "DON'T SHOUT, IT'S RUDE",
        "In 2024, 1,234,567 people paid $89.99 each.",
        "a  b   c\t\td\n\n\ne   ",
        "   leading and trailing   ",
        "Caf\xc3\xa9 na\xc3\xafve \xe6\x97\xa5\xe6\x9c\xac\xe8\xaa\x9e \xd0\x9f\xd1\x80\xd0\xb8\xd0\xb2\xd0\xb5\xd1\x82",
        "emoji \xf0\x9f\x91\xa8\xe2\x80\x8d\xf0\x9f\x91\xa9\xe2\x80\x8d\xf0\x9f\x91\xa7 zwj",
        "def f(x):\n    return x ** 2\n",
        "<|im_start|>user\nHi<|im_end|>\n",
        "",
    };
    for (size_t i = 0; i < sizeof texts / sizeof texts[0]; i++)
        for (int special = 0; special <= 1; special++)
            CHECK(roundtrips(model_tok, texts[i], strlen(texts[i]), special), "text %zu (special=%d): %s", i,
                  special, rd_errmsg());
    /* NUL bytes are text like any other. */
    CHECK(roundtrips(model_tok, "a\0b\0", 4, 0), "embedded NULs: %s", rd_errmsg());
}

static void test_each_digit_is_a_token(void)
{
    const char *s = "abc 9876543210 x12y 3.14";
    int32_t *ids = NULL;
    size_t n = 0;
    CHECK_OK(tok_encode(model_tok, s, strlen(s), 0, &ids, &n));
    int digits = 0, bad = -1;
    for (size_t i = 0; i < n; i++) {
        char *piece = NULL;
        size_t len = 0;
        if (tok_decode(model_tok, &ids[i], 1, &piece, &len) != 0)
            break;
        for (size_t k = 0; k < len; k++)
            if (piece[k] >= '0' && piece[k] <= '9') {
                digits++;
                if (len != 1)
                    bad = (int)i;
            }
        free(piece);
    }
    free(ids);
    CHECK(bad < 0, "token %d holds a digit and more", bad);
    CHECK(digits == 15, "%d digit tokens, expected 15", digits);
}

static void test_parse_special(void)
{
    int32_t *on = NULL, *off = NULL;
    size_t n_on = 0, n_off = 0;
    CHECK_OK(tok_encode(model_tok, "<|im_end|>", 10, 1, &on, &n_on));
    CHECK_OK(tok_encode(model_tok, "<|im_end|>", 10, 0, &off, &n_off));
    int ok_on = n_on == 1 && on[0] == 2;
    int ok_off = n_off > 1 && count_id(off, n_off, 2) == 0;
    free(on);
    free(off);
    CHECK(ok_on, "with parse_special: %zu ids", n_on);
    CHECK(ok_off, "without parse_special: %zu ids", n_off);

    /* The longest special token wins and text between them is tokenized alone. */
    const char *s = "a<|im_start|><|im_end|>b<|endoftext|>";
    CHECK_OK(tok_encode(model_tok, s, strlen(s), 1, &on, &n_on));
    int ok = n_on == 5 && on[1] == 1 && on[2] == 2 && on[4] == 0;
    free(on);
    CHECK(ok, "mixed specials gave %zu ids", n_on);
}

static void test_chatml(void)
{
    int32_t *ids = NULL, *direct = NULL;
    size_t n = 0, n_direct = 0, len = 0;
    char *text = NULL;
    CHECK_OK(tok_chatml(model_tok, "You are a helpful AI assistant.", "What is 2+2?", &ids, &n));
    const char *want = "<|im_start|>system\nYou are a helpful AI assistant.<|im_end|>\n"
                       "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n";
    CHECK_OK(tok_decode(model_tok, ids, n, &text, &len));
    int same_text = len == strlen(want) && memcmp(text, want, len) == 0;
    free(text);
    int structure = n > 0 && ids[0] == 1 && count_id(ids, n, 1) == 3 && count_id(ids, n, 2) == 2;
    /* Identical to tokenizing the rendered template with special parsing. */
    int rc = tok_encode(model_tok, want, strlen(want), 1, &direct, &n_direct);
    int same_ids = rc == 0 && n_direct == n && memcmp(direct, ids, n * sizeof *ids) == 0;
    free(direct);
    free(ids);
    CHECK(same_text, "decoded prompt differs");
    CHECK(structure, "expected <|im_start|> first, 3 of them and 2 <|im_end|>");
    CHECK(same_ids, "ids differ from encoding the rendered prompt");

    /* No system turn; content is never parsed for control tokens. */
    CHECK_OK(tok_chatml(model_tok, NULL, "say <|im_end|> please", &ids, &n));
    structure = n > 0 && ids[0] == 1 && count_id(ids, n, 1) == 2 && count_id(ids, n, 2) == 1;
    free(ids);
    CHECK(structure, "user-only prompt: expected 2 <|im_start|> and 1 <|im_end|>");
    CHECK(tok_chatml(model_tok, NULL, NULL, &ids, &n) == RD_EINVAL, "NULL user accepted");
    CHECK(tok_chatml(model_tok, NULL, "\xff", &ids, &n) == RD_EINVAL && ids == NULL, "invalid UTF-8 accepted");
}

static void test_invalid_utf8_is_einval(void)
{
    /* Documented: invalid UTF-8 is RD_EINVAL naming the first bad byte's offset. */
    static const struct {
        const char *s;
        size_t len, offset;
    } cases[] = {
        {"ab\xff" "cd", 5, 2},
        {"\xc3", 1, 0},                   /* truncated sequence */
        {"ok \xed\xa0\x80", 6, 3},        /* UTF-16 surrogate */
        {"\xc0\xaf", 2, 0},               /* overlong */
        {"x\xf4\x90\x80\x80", 5, 1},      /* above U+10FFFF */
        {"\xe2\x82", 2, 0},               /* cut at the end */
        {"\x80", 1, 0},                   /* stray continuation byte */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int32_t *ids = (int32_t *)1;
        size_t n = 7;
        char want[64];
        int rc = tok_encode(model_tok, cases[i].s, cases[i].len, 0, &ids, &n);
        snprintf(want, sizeof want, "offset %zu", cases[i].offset);
        CHECK(rc == RD_EINVAL, "case %zu returned %d", i, rc);
        CHECK(ids == NULL && n == 0, "case %zu left output set", i);
        CHECK(strstr(rd_errmsg(), want) && strstr(rd_errmsg(), "UTF-8"), "case %zu: message \"%s\"", i, rd_errmsg());
    }
    CHECK(roundtrips(model_tok, "fine afterwards", 15, 0), "valid text after errors");
}

static void test_edges(void)
{
    int32_t *ids = NULL;
    size_t n = 9, len = 9;
    char *text = NULL;
    CHECK_OK(tok_encode(model_tok, "", 0, 1, &ids, &n));
    CHECK(ids != NULL && n == 0, "empty text gave %zu ids", n);
    CHECK_OK(tok_decode(model_tok, ids, 0, &text, &len));
    CHECK(text && len == 0 && text[0] == 0, "empty decode");
    free(ids);
    free(text);
    int32_t bad[] = {5, 49152};
    CHECK(tok_decode(model_tok, bad, 2, &text, &len) == RD_EINVAL, "id 49152 accepted");
    CHECK(strstr(rd_errmsg(), "49152") != NULL, "message: %s", rd_errmsg());
    CHECK(tok_encode(model_tok, NULL, 3, 0, &ids, &n) == RD_EINVAL, "NULL text accepted");

    /* A byte the vocabulary lacks (0x04 here) is dropped, as llama.cpp does. */
    CHECK_OK(tok_encode(model_tok, "a\x04" "b", 3, 0, &ids, &n));
    CHECK_OK(tok_decode(model_tok, ids, n, &text, &len));
    int dropped = len == 2 && memcmp(text, "ab", 2) == 0;
    free(ids);
    free(text);
    CHECK(dropped, "0x04 was not dropped");
}

/* A long, piece-heavy text is encoded identically on several threads at once. */
typedef struct {
    const char *text;
    size_t len;
    int32_t *ids;
    size_t n;
    int rc;
} thread_job;

static void *encode_job(void *arg)
{
    thread_job *j = arg;
    j->rc = tok_encode(model_tok, j->text, j->len, 1, &j->ids, &j->n);
    return NULL;
}

static void test_threads_agree(void)
{
    static const char unit[] = "The 42 quick foxes \xe6\x97\xa5\xe6\x9c\xac <|im_end|> don't   jump!\n";
    size_t reps = 500, ul = sizeof unit - 1;
    char *text = malloc(reps * ul);
    CHECK(text != NULL, "malloc");
    for (size_t i = 0; i < reps; i++)
        memcpy(text + i * ul, unit, ul);
    thread_job jobs[4];
    pthread_t th[4];
    for (int i = 0; i < 4; i++) {
        jobs[i] = (thread_job){text, reps * ul, NULL, 0, -1};
        pthread_create(&th[i], NULL, encode_job, &jobs[i]);
    }
    for (int i = 0; i < 4; i++)
        pthread_join(th[i], NULL);
    int ok = 1;
    for (int i = 0; i < 4; i++)
        ok &= jobs[i].rc == 0 && jobs[i].n == jobs[0].n && memcmp(jobs[i].ids, jobs[0].ids, jobs[0].n * 4) == 0;
    int ends = jobs[0].rc == 0 && count_id(jobs[0].ids, jobs[0].n, 2) == (int32_t)reps;
    for (int i = 0; i < 4; i++)
        free(jobs[i].ids);
    free(text);
    CHECK(ok, "threads disagree");
    CHECK(ends, "expected %zu <|im_end|> ids", reps);
}

/* ------------------------------------------------------------------------
 * Toy vocabularies: a GGUF file written in memory. */

typedef struct {
    uint8_t *p;
    size_t n, cap;
} buf;

static void put(buf *b, const void *src, size_t n)
{
    if (b->n + n > b->cap) {
        b->cap = 2 * (b->n + n) + 256;
        b->p = realloc(b->p, b->cap);
    }
    memcpy(b->p + b->n, src, n);
    b->n += n;
}
static void put_u32(buf *b, uint32_t v) { put(b, &v, 4); }
static void put_u64(buf *b, uint64_t v) { put(b, &v, 8); }
static void put_str(buf *b, const char *s)
{
    put_u64(b, strlen(s));
    put(b, s, strlen(s));
}
static void kv_str(buf *b, const char *key, const char *v)
{
    put_str(b, key);
    put_u32(b, GGUF_STRING);
    put_str(b, v);
}
static void kv_strs(buf *b, const char *key, const char **v, size_t n)
{
    put_str(b, key);
    put_u32(b, GGUF_ARRAY);
    put_u32(b, GGUF_STRING);
    put_u64(b, n);
    for (size_t i = 0; i < n; i++)
        put_str(b, v[i]);
}

static void kv_i32s(buf *b, const char *key, const int32_t *v, size_t n)
{
    put_str(b, key);
    put_u32(b, GGUF_ARRAY);
    put_u32(b, GGUF_INT32);
    put_u64(b, n);
    put(b, v, 4 * n);
}

static void kv_u32(buf *b, const char *key, uint32_t v)
{
    put_str(b, key);
    put_u32(b, GGUF_UINT32);
    put_u32(b, v);
}

static void kv_bool(buf *b, const char *key, int v)
{
    uint8_t x = (uint8_t)(v != 0);
    put_str(b, key);
    put_u32(b, GGUF_BOOL);
    put(b, &x, 1);
}

#define TOY_MAX_EXTRA 32

/* A toy vocabulary: the 256 byte-level chars (in byte order, so a printable
 * ASCII char's id is its byte), then extra tokens from id 256; merges as
 * given. extra_types, if not NULL, gives the extras' token types (the byte
 * chars are normal). bos, eos: -1 leaves the key out; add_bos: -1 leaves it
 * out, else the bool; chat_template: NULL leaves it out. */
typedef struct {
    const char *model, *pre;
    const char **extra;
    const int32_t *extra_types;
    size_t n_extra;
    const char **merges;
    size_t n_merges;
    int32_t bos, eos;
    int add_bos;
    const char *chat_template;
} toy_spec;

static int toy_build(const toy_spec *sp, tok_tokenizer **out, buf *file, gguf_file **g)
{
    static char chars[256][3];
    const char *tokens[256 + TOY_MAX_EXTRA];
    if (sp->n_extra > TOY_MAX_EXTRA)
        return RD_EINVAL;
    for (int b = 0; b < 256; b++) {
        int cp = b <= 0x20 ? 256 + b : b >= 0x7F && b <= 0xA0 ? 256 + 33 + b - 0x7F : b == 0xAD ? 256 + 67 : b;
        if (cp < 0x80) {
            chars[b][0] = (char)cp;
            chars[b][1] = 0;
        } else {
            chars[b][0] = (char)(0xC0 | cp >> 6);
            chars[b][1] = (char)(0x80 | (cp & 0x3F));
            chars[b][2] = 0;
        }
        tokens[b] = chars[b];
    }
    for (size_t i = 0; i < sp->n_extra; i++)
        tokens[256 + i] = sp->extra[i];
    memset(file, 0, sizeof *file);
    put(file, "GGUF", 4);
    put_u32(file, 3);
    put_u64(file, 0);
    put_u64(file, 2 + (sp->model != NULL) + (sp->pre != NULL) + (sp->extra_types != NULL) + (sp->bos >= 0) +
                      (sp->eos >= 0) + (sp->add_bos >= 0) + (sp->chat_template != NULL));
    if (sp->extra_types) {
        int32_t types[256 + TOY_MAX_EXTRA];
        for (size_t i = 0; i < 256 + sp->n_extra; i++)
            types[i] = i < 256 ? 1 : sp->extra_types[i - 256];
        kv_i32s(file, "tokenizer.ggml.token_type", types, 256 + sp->n_extra);
    }
    if (sp->model)
        kv_str(file, "tokenizer.ggml.model", sp->model);
    if (sp->pre)
        kv_str(file, "tokenizer.ggml.pre", sp->pre);
    if (sp->bos >= 0)
        kv_u32(file, "tokenizer.ggml.bos_token_id", (uint32_t)sp->bos);
    if (sp->eos >= 0)
        kv_u32(file, "tokenizer.ggml.eos_token_id", (uint32_t)sp->eos);
    if (sp->add_bos >= 0)
        kv_bool(file, "tokenizer.ggml.add_bos_token", sp->add_bos);
    if (sp->chat_template)
        kv_str(file, "tokenizer.chat_template", sp->chat_template);
    kv_strs(file, "tokenizer.ggml.tokens", tokens, 256 + sp->n_extra);
    kv_strs(file, "tokenizer.ggml.merges", sp->merges, sp->n_merges);
    *out = NULL;
    int rc = gguf_parse(file->p, file->n, g);
    if (rc == 0)
        rc = tok_load(*g, out);
    return rc;
}

static int toy_load_typed(const char *model, const char *pre, const char **extra, const int32_t *extra_types,
                          size_t n_extra, const char **merges, size_t n_merges, tok_tokenizer **out, buf *file,
                          gguf_file **g)
{
    toy_spec sp = {model, pre, extra, extra_types, n_extra, merges, n_merges, -1, -1, -1, NULL};
    return toy_build(&sp, out, file, g);
}

static int toy_load(const char *model, const char *pre, const char **extra, size_t n_extra, const char **merges,
                    size_t n_merges, tok_tokenizer **out, buf *file, gguf_file **g)
{
    return toy_load_typed(model, pre, extra, NULL, n_extra, merges, n_merges, out, file, g);
}

static void toy_free(tok_tokenizer *t, buf *file, gguf_file *g)
{
    tok_free(t);
    gguf_close(g);
    free(file->p);
}

/* Encodes s with the toy vocab and compares with want (n ids). */
static int toy_ids(const tok_tokenizer *t, const char *s, const int32_t *want, size_t n)
{
    int32_t *ids = NULL;
    size_t got = 0;
    int ok = tok_encode(t, s, strlen(s), 0, &ids, &got) == 0 && got == n && memcmp(ids, want, n * 4) == 0;
    free(ids);
    return ok;
}

static void test_toy_merge_order(void)
{
    /* ids: 'a' 97, 'b' 98, 'c' 99; extras from 256. */
    const char *extra[] = {"ab", "bc", "aa"};
    const char *lowest_first[] = {"b c", "a b", "a a"};
    const char *other_order[] = {"a b", "b c", "a a"};
    tok_tokenizer *t;
    gguf_file *g = NULL;
    buf f;
    CHECK_OK(toy_load("gpt2", "gpt2", extra, 3, lowest_first, 3, &t, &f, &g));
    int r1 = toy_ids(t, "abc", (int32_t[]){97, 257}, 2);  /* "b c" has rank 0 */
    int r2 = toy_ids(t, "aaa", (int32_t[]){258, 97}, 2);  /* leftmost pair on a tie */
    int r3 = toy_ids(t, "aaaa", (int32_t[]){258, 258}, 2);
    toy_free(t, &f, g);
    CHECK(r1, "abc with 'b c' first");
    CHECK(r2, "aaa: the leftmost pair merges first");
    CHECK(r3, "aaaa");
    CHECK_OK(toy_load("gpt2", "gpt2", extra, 3, other_order, 3, &t, &f, &g));
    r1 = toy_ids(t, "abc", (int32_t[]){256, 99}, 2);
    toy_free(t, &f, g);
    CHECK(r1, "abc with 'a b' first");
}

static void test_toy_pre_tokenizers(void)
{
    /* '1' 49, '2' 50, '3' 51; "12" 256, "123" 257. */
    const char *extra[] = {"12", "123"};
    const char *merges[] = {"1 2", "12 3"};
    tok_tokenizer *t;
    gguf_file *g = NULL;
    buf f;
    CHECK_OK(toy_load("gpt2", "gpt2", extra, 2, merges, 2, &t, &f, &g));
    int plain = toy_ids(t, "123", (int32_t[]){257}, 1);
    toy_free(t, &f, g);
    CHECK_OK(toy_load("gpt2", "smollm", extra, 2, merges, 2, &t, &f, &g));
    int split = toy_ids(t, "123", (int32_t[]){49, 50, 51}, 3);
    toy_free(t, &f, g);
    CHECK(plain, "gpt2 keeps digit runs together");
    CHECK(split, "smollm splits every digit");
}

static int toy_ids_special(const tok_tokenizer *t, const char *s, int special, const int32_t *want, size_t n)
{
    int32_t *ids = NULL;
    size_t got = 0;
    int ok = tok_encode(t, s, strlen(s), special, &ids, &got) == 0 && got == n && memcmp(ids, want, n * 4) == 0;
    free(ids);
    return ok;
}

static void test_toy_user_defined_always_matched(void)
{
    /* "<u>" 256 is user-defined (type 4), "<c>" 257 control (type 3). */
    const char *extra[] = {"<u>", "<c>"};
    const int32_t types[] = {4, 3};
    const char *none[] = {"x"};
    tok_tokenizer *t;
    gguf_file *g = NULL;
    buf f;
    CHECK_OK(toy_load_typed("gpt2", "gpt2", extra, types, 2, none, 0, &t, &f, &g));
    int off = toy_ids_special(t, "x<u>y<c>", 0, (int32_t[]){120, 256, 121, 60, 99, 62}, 6);
    int on = toy_ids_special(t, "x<u>y<c>", 1, (int32_t[]){120, 256, 121, 257}, 4);
    char *text = NULL;
    size_t len = 0;
    int rc = tok_decode(t, (int32_t[]){257, 256}, 2, &text, &len);
    int literal = rc == 0 && len == 6 && memcmp(text, "<c><u>", 6) == 0;
    free(text);
    toy_free(t, &f, g);
    CHECK(off, "without parse_special: only the user-defined token is matched");
    CHECK(on, "with parse_special: both are matched");
    CHECK(literal, "special tokens decode to their text");
}

static void test_toy_refusals(void)
{
    const char *none[] = {"x"};
    tok_tokenizer *t;
    gguf_file *g = NULL;
    buf f;
    int rc = toy_load("bert", "gpt2", none, 0, none, 0, &t, &f, &g);
    toy_free(t, &f, g);
    CHECK(rc == RD_ENOTSUP && strstr(rd_errmsg(), "\"bert\"") && strstr(rd_errmsg(), "\"gpt2\"") &&
              strstr(rd_errmsg(), "\"llama\""),
          "model bert: %d %s", rc, rd_errmsg());
    /* An unknown pre-tokenizer is refused by name, the message listing the supported ones. */
    rc = toy_load("gpt2", "deepseek-llm", none, 0, none, 0, &t, &f, &g);
    toy_free(t, &f, g);
    const char *m = rd_errmsg();
    CHECK(rc == RD_ENOTSUP && strstr(m, "\"deepseek-llm\"") && strstr(m, "\"qwen2\"") && strstr(m, "\"llama-bpe\"") &&
              strstr(m, "\"smollm\"") && strstr(m, "\"gpt2\""),
          "pre deepseek-llm: %d %s", rc, m);
    rc = toy_load("gpt2", NULL, none, 0, none, 0, &t, &f, &g);
    toy_free(t, &f, g);
    CHECK(rc == RD_ENOTSUP && strstr(rd_errmsg(), "tokenizer.ggml.pre"), "no pre: %d %s", rc, rd_errmsg());
    rc = toy_load(NULL, "gpt2", none, 0, none, 0, &t, &f, &g);
    toy_free(t, &f, g);
    CHECK(rc == RD_ENOTSUP && strstr(rd_errmsg(), "tokenizer.ggml.model"), "no model: %d %s", rc, rd_errmsg());
    const char *bad_merge[] = {"ab"};
    rc = toy_load("gpt2", "gpt2", none, 0, bad_merge, 1, &t, &f, &g);
    toy_free(t, &f, g);
    CHECK(rc == RD_EFORMAT && strstr(rd_errmsg(), "merge 0"), "merge without a space: %d %s", rc, rd_errmsg());
    const char *dup[] = {"a"};
    rc = toy_load("gpt2", "gpt2", dup, 1, none, 0, &t, &f, &g);
    toy_free(t, &f, g);
    CHECK(rc == RD_EFORMAT && strstr(rd_errmsg(), "same text"), "duplicate token: %d %s", rc, rd_errmsg());
}

/* ------------------------------------------------------------------------
 * Pre-tokenizers qwen2 and llama-bpe, and the chat formats, on toy
 * vocabularies (the comparison with llama.cpp on the real vocabulary is in
 * tests/py/test_tokenizer.py). */

static void test_toy_digit_groups(void)
{
    /* 256 "12", 257 "123", 258 "45", 259 "456", 260 "78". */
    const char *extra[] = {"12", "123", "45", "456", "78"};
    const char *merges[] = {"1 2", "12 3", "4 5", "45 6", "7 8"};
    tok_tokenizer *t;
    gguf_file *g = NULL;
    buf f;
    CHECK_OK(toy_load("gpt2", "llama-bpe", extra, 5, merges, 5, &t, &f, &g));
    int l8 = toy_ids(t, "12345678", (int32_t[]){257, 259, 260}, 3);      /* 123|456|78 */
    int l7 = toy_ids(t, "1234567", (int32_t[]){257, 259, 55}, 3);        /* 123|456|7 */
    int l4 = toy_ids(t, "x1245", (int32_t[]){120, 256, 52, 53}, 4);     /* x|124|5: "45" spans two pieces */
    toy_free(t, &f, g);
    CHECK_OK(toy_load("gpt2", "qwen2", extra, 5, merges, 5, &t, &f, &g));
    int q8 = toy_ids(t, "12345678", (int32_t[]){49, 50, 51, 52, 53, 54, 55, 56}, 8);
    toy_free(t, &f, g);
    CHECK(l8, "llama-bpe: 12345678 in runs of three");
    CHECK(l7, "llama-bpe: 1234567");
    CHECK(l4, "llama-bpe: x1245 is x, 124, 5");
    CHECK(q8, "qwen2: every digit its own piece");
}

static void test_toy_ignore_merges(void)
{
    /* 256 "ab", 257 "bc", 258 "abc": no merge makes "abc", and "b c" comes first. */
    const char *extra[] = {"ab", "bc", "abc"};
    const char *merges[] = {"b c", "a b"};
    tok_tokenizer *t;
    gguf_file *g = NULL;
    buf f;
    CHECK_OK(toy_load("gpt2", "qwen2", extra, 3, merges, 2, &t, &f, &g));
    int q = toy_ids(t, "abc", (int32_t[]){97, 257}, 2);
    toy_free(t, &f, g);
    CHECK_OK(toy_load("gpt2", "llama-bpe", extra, 3, merges, 2, &t, &f, &g));
    int whole = toy_ids(t, "abc", (int32_t[]){258}, 1);
    int two = toy_ids(t, "abc abc", (int32_t[]){258, 32, 97, 257}, 4);  /* " abc" is not a token: merged */
    int longer = toy_ids(t, "abcd", (int32_t[]){97, 257, 100}, 3);
    toy_free(t, &f, g);
    CHECK(q, "qwen2 merges abc into a, bc");
    CHECK(whole, "llama-bpe: a piece that is a token is that token");
    CHECK(two, "llama-bpe: abc abc");
    CHECK(longer, "llama-bpe: abcd is merged as usual");
}

static void test_toy_contractions_and_newlines(void)
{
    /* 256 "'S" (merge "' S"); 257 "ĊĊ" (two newlines, merge "Ċ Ċ"); 258 "!Ċ". */
    const char *extra[] = {"'S", "\xc4\x8a\xc4\x8a", "!\xc4\x8a"};
    const char *merges[] = {"' S", "\xc4\x8a \xc4\x8a", "! \xc4\x8a"};
    tok_tokenizer *t;
    gguf_file *g = NULL;
    buf f;
    CHECK_OK(toy_load("gpt2", "llama-bpe", extra, 3, merges, 3, &t, &f, &g));
    int upper = toy_ids(t, "IT'S", (int32_t[]){73, 84, 256}, 3);     /* 'S is a contraction either case */
    int nl = toy_ids(t, "a\n\nb", (int32_t[]){97, 257, 98}, 3);       /* the newline run is one piece */
    int bang = toy_ids(t, "!\nx", (int32_t[]){258, 120}, 2);          /* punctuation takes the newlines after it */
    toy_free(t, &f, g);
    CHECK_OK(toy_load("gpt2", "gpt2", extra, 3, merges, 3, &t, &f, &g));
    int gpt2 = toy_ids(t, "IT'S", (int32_t[]){73, 84, 39, 83}, 4);    /* gpt2's 's is lower case only */
    toy_free(t, &f, g);
    CHECK(upper, "llama-bpe: IT'S");
    CHECK(nl, "llama-bpe: a\\n\\nb");
    CHECK(bang, "llama-bpe: !\\nx");
    CHECK(gpt2, "gpt2: IT'S");
}

/* A toy Llama 3 vocabulary: 256 <|begin_of_text|>, 257 <|end_of_text|>,
 * 258 <|start_header_id|>, 259 <|end_header_id|>, 260 <|eot_id|> (control),
 * 261 "ĊĊ" (merge "Ċ Ċ"); plus ChatML's markers 262, 263 when chatml is set.
 * BOS 256, EOS eos; add_bos and chat_template as in toy_spec. */
static int toy_llama3(int chatml, int32_t eos, int add_bos, const char *chat_template, tok_tokenizer **t, buf *f,
                      gguf_file **g)
{
    static const char *extra[] = {"<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>",
                                  "<|end_header_id|>", "<|eot_id|>", "\xc4\x8a\xc4\x8a", "<|im_start|>",
                                  "<|im_end|>"};
    static const int32_t types[] = {3, 3, 3, 3, 3, 1, 3, 3};
    static const char *merges[] = {"\xc4\x8a \xc4\x8a"};
    toy_spec sp = {"gpt2", "llama-bpe", extra, types, chatml ? 8 : 6, merges, 1, 256, eos, add_bos, chat_template};
    return toy_build(&sp, t, f, g);
}

/* ids equal to want[0..n) */
static int same_ids(const int32_t *ids, size_t n_ids, const int32_t *want, size_t n)
{
    return n_ids == n && memcmp(ids, want, n * sizeof *ids) == 0;
}

static void test_toy_llama3_chat(void)
{
    tok_tokenizer *t;
    gguf_file *g = NULL;
    buf f;
    CHECK_OK(toy_llama3(0, 257, -1, NULL, &t, &f, &g));
    tok_chat_format fmt = tok_chat_kind(t);
    int kind = fmt == TOK_CHAT_LLAMA3 && strcmp(tok_chat_name(fmt), "llama3") == 0;
    int stops = tok_eot(t) == 260 && tok_eos(t) == 257 && tok_bos(t) == 256;
    int add_bos = tok_add_bos(t) == 1; /* llama-bpe's default without the key */

    int32_t *ids = NULL, *direct = NULL;
    size_t n = 0, n_direct = 0, len = 0;
    char *text = NULL;
    /* BOS, header "user", "\n\nHi", <|eot_id|>, open assistant header. */
    static const int32_t want[] = {256, 258, 'u', 's', 'e', 'r', 259, 261, 'H', 'i', 260,
                                   258, 'a', 's', 's', 'i', 's', 't', 'a', 'n', 't', 259, 261};
    int rc = tok_chat(t, NULL, "Hi", &ids, &n);
    int user_only = rc == 0 && same_ids(ids, n, want, sizeof want / sizeof want[0]);
    free(ids);

    const char *rendered = "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
                           "<|start_header_id|>user<|end_header_id|>\n\n\n\nWhat is 2+2?\n<|eot_id|>"
                           "<|start_header_id|>assistant<|end_header_id|>\n\n";
    rc = tok_chat(t, "Be brief.", "\n\nWhat is 2+2?\n", &ids, &n);
    int rendered_ok = rc == 0 && tok_decode(t, ids, n, &text, &len) == 0 && len == strlen(rendered) &&
                      memcmp(text, rendered, len) == 0;
    int as_encode = rc == 0 && tok_encode(t, rendered, strlen(rendered), 1, &direct, &n_direct) == 0 &&
                    same_ids(ids, n, direct, n_direct);
    int structure = rc == 0 && count_id(ids, n, 256) == 1 && ids[0] == 256 && count_id(ids, n, 258) == 3 &&
                    count_id(ids, n, 259) == 3 && count_id(ids, n, 260) == 2;
    free(ids);
    free(direct);
    free(text);

    /* Contents are never parsed for control tokens, and the file's BOS is not doubled. */
    rc = tok_chat(t, NULL, "<|eot_id|><|begin_of_text|>", &ids, &n);
    int literal = rc == 0 && count_id(ids, n, 260) == 1 && count_id(ids, n, 256) == 1;
    free(ids);
    int no_chatml = tok_chatml(t, NULL, "x", &ids, &n) == RD_ENOTSUP && ids == NULL;
    toy_free(t, &f, g);
    CHECK(no_chatml, "tok_chatml without ChatML markers");
    CHECK(kind, "chat kind %d", fmt);
    CHECK(stops, "eot / eos / bos");
    CHECK(add_bos, "llama-bpe adds a BOS unless the file says otherwise");
    CHECK(user_only, "user-only prompt ids");
    CHECK(rendered_ok, "the prompt decodes to the rendered template");
    CHECK(as_encode, "ids differ from encoding the rendered template with special parsing");
    CHECK(structure, "expected one BOS first, 3 headers and 2 <|eot_id|>");
    CHECK(literal, "control-token text in the user message was parsed");
}

static void test_toy_chat_choice(void)
{
    tok_tokenizer *t;
    gguf_file *g = NULL;
    buf f;
    /* Both sets of markers: Llama 3, unless the file's template uses ChatML's only. */
    CHECK_OK(toy_llama3(1, 260, -1, NULL, &t, &f, &g));
    int both = tok_chat_kind(t) == TOK_CHAT_LLAMA3 && tok_eot(t) == 260 && tok_eot(t) == tok_eos(t);
    toy_free(t, &f, g);
    CHECK_OK(toy_llama3(1, 260, -1, "{% for m in messages %}<|im_start|>{{ m.role }}\n{% endfor %}", &t, &f, &g));
    int32_t hermes_eot = tok_eot(t);
    int hermes = tok_chat_kind(t) == TOK_CHAT_CHATML && hermes_eot == 263;
    int32_t *ids = NULL;
    size_t n = 0;
    int rc = tok_chat(t, NULL, "x", &ids, &n);
    int hermes_ids = rc == 0 && n > 0 && ids[0] == 262 && count_id(ids, n, 256) == 0;
    free(ids);
    toy_free(t, &f, g);
    CHECK_OK(toy_llama3(1, 260, -1, "<|im_start|> or <|start_header_id|>", &t, &f, &g));
    int tmpl_llama3 = tok_chat_kind(t) == TOK_CHAT_LLAMA3;
    toy_free(t, &f, g);

    /* Only ChatML's; only part of Llama 3's (no <|eot_id|>) and no ChatML: none. */
    const char *cm[] = {"<|im_start|>", "<|im_end|>"};
    const int32_t ctl[] = {3, 3, 3};
    const char *none[] = {"x"};
    CHECK_OK(toy_load_typed("gpt2", "qwen2", cm, ctl, 2, none, 0, &t, &f, &g));
    int chatml = tok_chat_kind(t) == TOK_CHAT_CHATML && tok_eot(t) == 257 && tok_add_bos(t) == 0;
    rc = tok_chat(t, "s", "u", &ids, &n);
    int32_t *ml = NULL;
    size_t n_ml = 0;
    int same_as_chatml = rc == 0 && tok_chatml(t, "s", "u", &ml, &n_ml) == 0 && same_ids(ids, n, ml, n_ml);
    free(ids);
    free(ml);
    toy_free(t, &f, g);
    const char *partial[] = {"<|start_header_id|>", "<|end_header_id|>", "<|im_start|>"};
    CHECK_OK(toy_load_typed("gpt2", "llama-bpe", partial, ctl, 3, none, 0, &t, &f, &g));
    int kind_none = tok_chat_kind(t) == TOK_CHAT_NONE && tok_eot(t) == -1 &&
                    strcmp(tok_chat_name(TOK_CHAT_NONE), "none") == 0;
    ids = (int32_t *)1;
    rc = tok_chat(t, NULL, "x", &ids, &n);
    const char *msg = rd_errmsg();
    int refused = rc == RD_ENOTSUP && ids == NULL && n == 0 && strstr(msg, "lacks <|eot_id|>") &&
                  strstr(msg, "lacks <|im_end|>") && !strstr(msg, "lacks <|im_start|>");
    toy_free(t, &f, g);
    CHECK(both, "both marker sets, no template: Llama 3");
    CHECK(hermes, "both sets, a ChatML template: ChatML (eot %d)", hermes_eot);
    CHECK(hermes_ids, "the ChatML prompt of a vocabulary with both sets");
    CHECK(tmpl_llama3, "a template naming both: Llama 3");
    CHECK(chatml, "ChatML markers only");
    CHECK(same_as_chatml, "tok_chat and tok_chatml differ on a ChatML vocabulary");
    CHECK(kind_none, "no complete marker set: none");
    CHECK(refused, "tok_chat without a format: %d \"%s\"", rc, msg);
}

static void test_encode_prompt_bos(void)
{
    tok_tokenizer *t;
    gguf_file *g = NULL;
    buf f;
    int32_t *ids = NULL;
    size_t n = 0;
    CHECK_OK(toy_llama3(0, 257, -1, NULL, &t, &f, &g));
    int rc = tok_encode_prompt(t, "Hi", 2, &ids, &n);
    int bos = rc == 0 && same_ids(ids, n, (int32_t[]){256, 'H', 'i'}, 3);
    free(ids);
    rc = tok_encode_prompt(t, "<|begin_of_text|>Hi<|eot_id|>", 29, &ids, &n);
    int once = rc == 0 && same_ids(ids, n, (int32_t[]){256, 'H', 'i', 260}, 4);
    free(ids);
    rc = tok_encode_prompt(t, "", 0, &ids, &n);
    int empty = rc == 0 && same_ids(ids, n, (int32_t[]){256}, 1);
    free(ids);
    toy_free(t, &f, g);
    CHECK_OK(toy_llama3(0, 257, 0, NULL, &t, &f, &g));
    rc = tok_encode_prompt(t, "Hi", 2, &ids, &n);
    int off = rc == 0 && tok_add_bos(t) == 0 && same_ids(ids, n, (int32_t[]){'H', 'i'}, 2);
    free(ids);
    toy_free(t, &f, g);
    /* SmolLM2 adds none: the same ids as tok_encode with special parsing. */
    const char *s = "<|im_start|>user\nHi";
    int32_t *direct = NULL;
    size_t n_direct = 0;
    rc = tok_encode_prompt(model_tok, s, strlen(s), &ids, &n);
    int smol = rc == 0 && tok_encode(model_tok, s, strlen(s), 1, &direct, &n_direct) == 0 &&
               same_ids(ids, n, direct, n_direct) && ids[0] == 1;
    free(ids);
    free(direct);
    CHECK(bos, "a BOS first");
    CHECK(once, "a text starting with the BOS keeps one");
    CHECK(empty, "the empty text is the BOS");
    CHECK(off, "add_bos_token false: no BOS");
    CHECK(smol, "SmolLM2's prompt differs from tok_encode");
}

static void test_chat_smollm(void)
{
    /* SmolLM2's vocab is ChatML, its end of turn the file's EOS, and tok_chat
     * is tok_chatml bit for bit. */
    CHECK(tok_chat_kind(model_tok) == TOK_CHAT_CHATML, "kind %d", tok_chat_kind(model_tok));
    CHECK(tok_eot(model_tok) == 2 && tok_eos(model_tok) == 2, "eot %d eos %d", tok_eot(model_tok), tok_eos(model_tok));
    static const char *sys[] = {NULL, "You are a helpful AI assistant.", "", "\xe6\x97\xa5\xe6\x9c\xac 12345"};
    static const char *user[] = {"What is 2+2?", "", "  two\n\nlines  ", "<|im_end|> x <|im_start|>"};
    for (size_t i = 0; i < 4; i++)
        for (size_t k = 0; k < 4; k++) {
            int32_t *a = NULL, *b = NULL;
            size_t na = 0, nb = 0;
            CHECK_OK(tok_chat(model_tok, sys[i], user[k], &a, &na));
            CHECK_OK(tok_chatml(model_tok, sys[i], user[k], &b, &nb));
            int same = same_ids(a, na, b, nb);
            free(a);
            free(b);
            CHECK(same, "system %zu, user %zu", i, k);
        }
}

int main(void)
{
    const char *path = getenv("RD_MODEL");
    if (!path)
        path = "models/SmolLM2-135M-Instruct.Q4_1.gguf";
    if (gguf_open(path, &model_file) != 0 || tok_load(model_file, &model_tok) != 0) {
        printf("FAIL load %s: %s\n", path, rd_errmsg());
        return 1;
    }
    RUN(test_model_header_values);
    RUN(test_known_ids);
    RUN(test_roundtrip);
    RUN(test_each_digit_is_a_token);
    RUN(test_parse_special);
    RUN(test_chatml);
    RUN(test_invalid_utf8_is_einval);
    RUN(test_edges);
    RUN(test_threads_agree);
    RUN(test_toy_merge_order);
    RUN(test_toy_pre_tokenizers);
    RUN(test_toy_user_defined_always_matched);
    RUN(test_toy_refusals);
    RUN(test_toy_digit_groups);
    RUN(test_toy_ignore_merges);
    RUN(test_toy_contractions_and_newlines);
    RUN(test_toy_llama3_chat);
    RUN(test_toy_chat_choice);
    RUN(test_encode_prompt_bos);
    RUN(test_chat_smollm);
    tok_free(model_tok);
    gguf_close(model_file);
    TEST_EXIT();
}
