/* test_tokenizer.c - the GPT-2 BPE tokenizer on the real model (env RD_MODEL),
 * the SentencePiece-style one (tokenizer.ggml.model "llama") on the Gemma 3
 * file when it is there (env RD_GEMMA_MODEL, else models/gemma-3-270m-q4_k_m.gguf),
 * and both on toy vocabularies written as in-memory GGUF files. The
 * token-by-token comparisons with llama.cpp live in tests/py/test_tokenizer.py
 * and tests/py/test_tokenizer_gemma.py. */
#include <pthread.h>
#include <stdint.h>

#include "base/err.h"
#include "engine/format/gguf.h"
#include "engine/text/tokenizer.h"
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

static void kv_f32s(buf *b, const char *key, const float *v, size_t n)
{
    put_str(b, key);
    put_u32(b, GGUF_ARRAY);
    put_u32(b, GGUF_FLOAT32);
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


/* ------------------------------------------------------------------------
 * SentencePiece-style BPE ("llama") on toy vocabularies. */

#define SPM_MAX 600
#define U2581 "\xe2\x96\x81"

/* An extra token: its text, score and type (0: normal). */
typedef struct {
    const char *text;
    float score;
    int32_t type;
} spm_tok;

/* A toy SPM vocabulary: 0 <unk> (unknown), 1 <s>, 2 </s> (control), then with
 * bytes set the 256 byte tokens <0x00>..<0xFF> at 3 + byte, then the extras
 * (from SPM_X, or from 3 without bytes). Keys: add_space_prefix, bos, eos,
 * add_bos -1 leave the key out; scores 0 float32, 1 int32, 2 absent, 3 one
 * short; pre and chat_template NULL leave the key out. */
typedef struct {
    const spm_tok *extra;
    size_t n_extra;
    int bytes;
    int space_prefix;
    int32_t bos, eos;
    int add_bos;
    int scores;
    const char *pre;
    const char *chat_template;
} spm_spec;

#define SPM_X 259
#define SPM_BYTE(b) (3 + (int32_t)(b))

static int spm_build(const spm_spec *sp, tok_tokenizer **out, buf *file, gguf_file **g)
{
    static char hex[256][7];
    const char *tokens[SPM_MAX];
    float score[SPM_MAX];
    int32_t iscore[SPM_MAX], type[SPM_MAX];
    size_t n = 0;
    const char *base[] = {"<unk>", "<s>", "</s>"};
    const int32_t base_type[] = {2, 3, 3};
    for (int i = 0; i < 3; i++, n++) {
        tokens[n] = base[i];
        score[n] = 0;
        type[n] = base_type[i];
    }
    if (sp->bytes)
        for (int b = 0; b < 256; b++, n++) {
            snprintf(hex[b], sizeof hex[b], "<0x%02X>", b);
            tokens[n] = hex[b];
            score[n] = 0;
            type[n] = 6;
        }
    if (n + sp->n_extra > SPM_MAX)
        return RD_EINVAL;
    for (size_t i = 0; i < sp->n_extra; i++, n++) {
        tokens[n] = sp->extra[i].text;
        score[n] = sp->extra[i].score;
        type[n] = sp->extra[i].type ? sp->extra[i].type : 1;
    }
    for (size_t i = 0; i < n; i++)
        iscore[i] = (int32_t)score[i];
    memset(file, 0, sizeof *file);
    put(file, "GGUF", 4);
    put_u32(file, 3);
    put_u64(file, 0);
    put_u64(file, 3 + (sp->scores != 2) + (sp->space_prefix >= 0) + (sp->bos >= 0) + (sp->eos >= 0) +
                      (sp->add_bos >= 0) + (sp->pre != NULL) + (sp->chat_template != NULL));
    kv_str(file, "tokenizer.ggml.model", "llama");
    if (sp->pre)
        kv_str(file, "tokenizer.ggml.pre", sp->pre);
    kv_strs(file, "tokenizer.ggml.tokens", tokens, n);
    kv_i32s(file, "tokenizer.ggml.token_type", type, n);
    if (sp->scores == 0 || sp->scores == 3)
        kv_f32s(file, "tokenizer.ggml.scores", score, sp->scores == 3 ? n - 1 : n);
    else if (sp->scores == 1)
        kv_i32s(file, "tokenizer.ggml.scores", iscore, n);
    if (sp->space_prefix >= 0)
        kv_bool(file, "tokenizer.ggml.add_space_prefix", sp->space_prefix);
    if (sp->bos >= 0)
        kv_u32(file, "tokenizer.ggml.bos_token_id", (uint32_t)sp->bos);
    if (sp->eos >= 0)
        kv_u32(file, "tokenizer.ggml.eos_token_id", (uint32_t)sp->eos);
    if (sp->add_bos >= 0)
        kv_bool(file, "tokenizer.ggml.add_bos_token", sp->add_bos);
    if (sp->chat_template)
        kv_str(file, "tokenizer.chat_template", sp->chat_template);
    *out = NULL;
    int rc = gguf_parse(file->p, file->n, g);
    if (rc == 0)
        rc = tok_load(*g, out);
    return rc;
}

/* The extras alone, with byte tokens, add_space_prefix as given, the other keys out. */
static int spm_load(const spm_tok *extra, size_t n_extra, int space_prefix, tok_tokenizer **t, buf *f, gguf_file **g)
{
    spm_spec sp = {extra, n_extra, 1, space_prefix, -1, -1, -1, 0, NULL, NULL};
    return spm_build(&sp, t, f, g);
}

static int spm_ids(const tok_tokenizer *t, const char *s, int special, const int32_t *want, size_t n)
{
    return toy_ids_special(t, s, special, want, n);
}

static void test_spm_scores_pick_the_merge(void)
{
    /* 259 a, 260 b, 261 c, 262 ab, 263 bc, 264 abc (the last in one vocab only). */
    tok_tokenizer *t;
    gguf_file *g = NULL;
    buf f;
    spm_tok v[] = {{"a", -10, 0}, {"b", -10, 0}, {"c", -10, 0}, {"ab", -1, 0}, {"bc", -2, 0}, {"abc", -3, 0}};
    CHECK_OK(spm_load(v, 5, 0, &t, &f, &g));
    int ab_first = spm_ids(t, "abc", 0, (int32_t[]){262, 261}, 2);
    toy_free(t, &f, g);
    v[3].score = -2, v[4].score = -1;
    CHECK_OK(spm_load(v, 5, 0, &t, &f, &g));
    int bc_first = spm_ids(t, "abc", 0, (int32_t[]){259, 263}, 2);
    toy_free(t, &f, g);
    /* Equal scores: the left-most pair first (llama.cpp's comparator). */
    v[3].score = v[4].score = -1;
    CHECK_OK(spm_load(v, 5, 0, &t, &f, &g));
    int tie_left = spm_ids(t, "abc", 0, (int32_t[]){262, 261}, 2) &&
                   spm_ids(t, "cabcab", 0, (int32_t[]){261, 262, 261, 262}, 4);
    toy_free(t, &f, g);
    /* A merge makes a symbol that merges on: ab + c = abc, whatever abc's score. */
    v[3].score = -1, v[4].score = -2;
    CHECK_OK(spm_load(v, 6, 0, &t, &f, &g));
    int chain = spm_ids(t, "abc", 0, (int32_t[]){264}, 1) && spm_ids(t, "abcabc", 0, (int32_t[]){264, 264}, 2);
    toy_free(t, &f, g);
    /* Scores as int32 are read as llama.cpp does (cast to float). */
    spm_tok w[] = {{"a", -10, 0}, {"b", -10, 0}, {"c", -10, 0}, {"ab", -2, 0}, {"bc", -1, 0}};
    spm_spec sp = {w, 5, 1, 0, -1, -1, -1, 1, NULL, NULL};
    CHECK_OK(spm_build(&sp, &t, &f, &g));
    int int_scores = spm_ids(t, "abc", 0, (int32_t[]){259, 263}, 2);
    toy_free(t, &f, g);
    /* No scores at all: every pair 0, so merges go left to right. */
    sp.scores = 2;
    CHECK_OK(spm_build(&sp, &t, &f, &g));
    int no_scores = spm_ids(t, "abc", 0, (int32_t[]){262, 261}, 2);
    toy_free(t, &f, g);
    CHECK(ab_first, "the higher-scored ab merges first");
    CHECK(bc_first, "the higher-scored bc merges first");
    CHECK(tie_left, "equal scores: leftmost first");
    CHECK(chain, "ab then abc");
    CHECK(int_scores, "int32 scores");
    CHECK(no_scores, "no scores: all equal");
}

static void test_spm_byte_fallback(void)
{
    /* 259 a, 260 b, 261 c, 262 ab, 263 bc; no token for e-acute, the euro sign or an emoji. */
    tok_tokenizer *t;
    gguf_file *g = NULL;
    buf f;
    spm_tok v[] = {{"a", -10, 0}, {"b", -10, 0}, {"c", -10, 0}, {"ab", -1, 0}, {"bc", -2, 0}};
    CHECK_OK(spm_load(v, 5, 0, &t, &f, &g));
    int acute = spm_ids(t, "a\xc3\xa9" "b", 0, (int32_t[]){259, SPM_BYTE(0xC3), SPM_BYTE(0xA9), 260}, 4);
    /* A character with no token splits the merges: ab on its left, bc on its right. */
    int between = spm_ids(t, "ab\xe2\x82\xac" "bc", 0,
                          (int32_t[]){262, SPM_BYTE(0xE2), SPM_BYTE(0x82), SPM_BYTE(0xAC), 263}, 5);
    int emoji = spm_ids(t, "\xf0\x9f\x98\x80", 0,
                        (int32_t[]){SPM_BYTE(0xF0), SPM_BYTE(0x9F), SPM_BYTE(0x98), SPM_BYTE(0x80)}, 4);
    /* A control character and NUL: their byte tokens, like any other. */
    int nul = toy_ids_special(t, "x", 0, (int32_t[]){SPM_BYTE('x')}, 1);
    int32_t *ids = NULL;
    size_t n = 0, len = 0;
    char *text = NULL;
    int rc = tok_encode(t, "a\0b", 3, 0, &ids, &n);
    int nul_ok = rc == 0 && same_ids(ids, n, (int32_t[]){259, SPM_BYTE(0), 260}, 3);
    /* The byte tokens decode to their bytes, so the text comes back. */
    int back = rc == 0 && tok_decode(t, ids, n, &text, &len) == 0 && len == 3 && memcmp(text, "a\0b", 3) == 0;
    free(ids);
    free(text);
    toy_free(t, &f, g);

    /* Without <0xXX> tokens, llama.cpp's byte_to_token takes the byte itself
     * as a token; with neither, the text cannot be encoded. */
    spm_tok raw[] = {{"a", -10, 0}, {"\xc3", -10, 0}, {"\xa9", -10, 0}};
    spm_spec sp = {raw, 3, 0, 0, -1, -1, -1, 0, NULL, NULL};
    CHECK_OK(spm_build(&sp, &t, &f, &g));
    int raw_bytes = spm_ids(t, "a\xc3\xa9", 0, (int32_t[]){3, 4, 5}, 3);
    rc = tok_encode(t, "a\xe2\x82\xac", 4, 0, &ids, &n);
    int refused = rc == RD_EINVAL && ids == NULL && strstr(rd_errmsg(), "<0xE2>");
    toy_free(t, &f, g);
    CHECK(acute, "e-acute as <0xC3><0xA9>");
    CHECK(between, "euro sign between merges");
    CHECK(emoji, "a 4-byte character as 4 byte tokens");
    CHECK(nul, "x as its byte token");
    CHECK(nul_ok, "NUL as <0x00>");
    CHECK(back, "byte tokens decode to their bytes");
    CHECK(raw_bytes, "the raw byte as a token when <0xXX> is missing");
    CHECK(refused, "no token for a byte: %d %s", rc, rd_errmsg());
}

static void test_spm_left_over_symbols(void)
{
    /* The symbols left when no pair merges any more: each merged symbol is a
     * token (a pair only merges into one), and a single character that is no
     * token goes out as its bytes: llama.cpp's resegment, whose split-back
     * along the merges never applies to a merged symbol for that reason.
     * 259 x, 260 y, 261 xy, 262 xyx (no "yx"): "xyxyx" merges xy, xy, then
     * xy + x -> xyx, leaving xy | xyx. */
    tok_tokenizer *t;
    gguf_file *g = NULL;
    buf f;
    spm_tok v[] = {{"x", -10, 0}, {"y", -10, 0}, {"xy", -1, 0}, {"xyx", -5, 0}};
    CHECK_OK(spm_load(v, 4, 0, &t, &f, &g));
    int left = spm_ids(t, "xyxyx", 0, (int32_t[]){261, 262}, 2);
    /* z has no token: its byte; it also blocks the merges around it. */
    int z = spm_ids(t, "xzyx", 0, (int32_t[]){259, SPM_BYTE('z'), 260, 259}, 4);
    toy_free(t, &f, g);
    CHECK(left, "xyxyx");
    CHECK(z, "xzyx");
}

static void test_spm_space_prefix(void)
{
    /* 259 U+2581, 260 a, 261 b, 262 U+2581a, 263 U+2581b, 264 <t> (control),
     * 265 <u> (user-defined), 266 "x" U+2581 "y" (user-defined). */
    tok_tokenizer *t;
    gguf_file *g = NULL;
    buf f;
    spm_tok v[] = {{U2581, -5, 0},   {"a", -10, 0},   {"b", -10, 0},
                   {U2581 "a", -1, 0}, {U2581 "b", -1, 0}, {"<t>", 0, 3}, {"<u>", 0, 4}, {"x" U2581 "y", 0, 4}};
    CHECK_OK(spm_load(v, 8, 0, &t, &f, &g));
    int off = spm_ids(t, "a b", 0, (int32_t[]){260, 263}, 2) && spm_ids(t, " a", 0, (int32_t[]){262}, 1) &&
              spm_ids(t, "<t>a", 1, (int32_t[]){264, 260}, 2) && spm_ids(t, "a  b", 0, (int32_t[]){260, 259, 263}, 3);
    char *text = NULL;
    size_t len = 0;
    int rc = tok_decode(t, (int32_t[]){262, 263, 259, 264, 265, 266}, 6, &text, &len);
    const char *want = " a b <t><u>x" U2581 "y";
    int decode = rc == 0 && len == strlen(want) && memcmp(text, want, len) == 0;
    free(text);
    int trip = roundtrips(t, "a b  a<u>b", 10, 0) && roundtrips(t, " b<t>a", 6, 1);
    toy_free(t, &f, g);

    /* With add_space_prefix, a space opens the text and each stretch after a
     * special token, control or user-defined; no other stretch. */
    CHECK_OK(spm_load(v, 8, 1, &t, &f, &g));
    int on = spm_ids(t, "a b", 0, (int32_t[]){262, 263}, 2) && spm_ids(t, " a", 0, (int32_t[]){259, 262}, 2) &&
             spm_ids(t, "a<t>b", 1, (int32_t[]){262, 264, 263}, 3) &&
             spm_ids(t, "a<t>b", 0, (int32_t[]){262, SPM_BYTE('<'), SPM_BYTE('t'), SPM_BYTE('>'), 261}, 5) &&
             spm_ids(t, "a<u>b", 0, (int32_t[]){262, 265, 263}, 3) && spm_ids(t, "<u>", 0, (int32_t[]){265}, 1);
    /* Decoding keeps the spaces the encoder added: the bytes are exact. */
    int32_t *ids = NULL;
    size_t n = 0;
    rc = tok_encode(t, "a b", 3, 0, &ids, &n);
    int kept = rc == 0 && tok_decode(t, ids, n, &text, &len) == 0 && len == 4 && memcmp(text, " a b", 4) == 0;
    free(ids);
    free(text);
    toy_free(t, &f, g);
    /* Without the key: llama.cpp's default, true. */
    CHECK_OK(spm_load(v, 8, -1, &t, &f, &g));
    int dflt = spm_ids(t, "a b", 0, (int32_t[]){262, 263}, 2);
    toy_free(t, &f, g);
    CHECK(off, "add_space_prefix false");
    CHECK(decode, "U+2581 decodes to a space in normal tokens only");
    CHECK(trip, "round trips without the prefix");
    CHECK(on, "add_space_prefix true");
    CHECK(kept, "the added space is decoded");
    CHECK(dflt, "add_space_prefix defaults to true");
}

static void test_spm_keys_and_refusals(void)
{
    tok_tokenizer *t;
    gguf_file *g = NULL;
    buf f;
    spm_tok v[] = {{"a", -1, 0}, {"b", -1, 0}};
    /* No bos / eos / add_bos keys: llama.cpp's SPM defaults <s> 1, </s> 2, add_bos. */
    spm_spec sp = {v, 2, 1, 0, -1, -1, -1, 0, NULL, NULL};
    CHECK_OK(spm_build(&sp, &t, &f, &g));
    int dflt = tok_bos(t) == 1 && tok_eos(t) == 2 && tok_add_bos(t) == 1 && tok_vocab_size(t) == SPM_X + 2 &&
               tok_chat_kind(t) == TOK_CHAT_NONE;
    int32_t *ids = NULL;
    size_t n = 0;
    int rc = tok_encode_prompt(t, "ab", 2, &ids, &n);
    int prompt = rc == 0 && same_ids(ids, n, (int32_t[]){1, SPM_X, SPM_X + 1}, 3);
    free(ids);
    rc = tok_encode_prompt(t, "<s>a", 4, &ids, &n);
    int once = rc == 0 && same_ids(ids, n, (int32_t[]){1, SPM_X}, 2);
    free(ids);
    toy_free(t, &f, g);
    /* The file's keys win; any tokenizer.ggml.pre is ignored. */
    spm_spec keyed = {v, 2, 1, 0, 2, 1, 0, 0, "default", NULL};
    CHECK_OK(spm_build(&keyed, &t, &f, &g));
    int keys = tok_bos(t) == 2 && tok_eos(t) == 1 && tok_add_bos(t) == 0;
    rc = tok_encode_prompt(t, "ab", 2, &ids, &n);
    int no_bos = rc == 0 && same_ids(ids, n, (int32_t[]){SPM_X, SPM_X + 1}, 2);
    free(ids);
    toy_free(t, &f, g);
    sp.scores = 3;
    rc = spm_build(&sp, &t, &f, &g);
    toy_free(t, &f, g);
    int short_scores = rc == RD_EFORMAT && strstr(rd_errmsg(), "scores");
    /* Invalid UTF-8 is refused with its offset, as for gpt2. */
    CHECK_OK(spm_build(&keyed, &t, &f, &g));
    rc = tok_encode(t, "ab\xff", 3, 0, &ids, &n);
    int utf8 = rc == RD_EINVAL && strstr(rd_errmsg(), "offset 2");
    rc = tok_encode(t, "", 0, 1, &ids, &n);
    int empty = rc == 0 && n == 0 && ids != NULL;
    free(ids);
    toy_free(t, &f, g);
    CHECK(dflt, "defaults: bos %d eos %d add_bos %d", tok_bos(t), tok_eos(t), tok_add_bos(t));
    CHECK(prompt, "the prompt starts with the default BOS");
    CHECK(once, "a prompt written with <s> keeps one");
    CHECK(keys, "the file's bos, eos and add_bos");
    CHECK(no_bos, "add_bos false");
    CHECK(short_scores, "too few scores: %d %s", rc, rd_errmsg());
    CHECK(utf8, "invalid UTF-8");
    CHECK(empty, "the empty text");
}

/* The SPM algorithm written the slow way: while any adjacent pair's
 * concatenation is a token, merge the pair of highest score, the leftmost on
 * ties; then each symbol is its token or its bytes' tokens. texts[i] and
 * score[i] are token i's; n tokens. */
static long naive_find(const char **texts, size_t n, const char *s, size_t len)
{
    for (size_t id = 0; id < n; id++)
        if (strlen(texts[id]) == len && memcmp(texts[id], s, len) == 0)
            return (long)id;
    return -1;
}

static size_t naive_spm(const char **texts, const float *score, size_t n, const char *s, int32_t *out)
{
    /* Symbols are stretches of s: off[i], len[i]. */
    size_t off[256], len[256], m = 0, total = strlen(s);
    for (size_t at = 0; at < total; m++) {
        size_t k = (uint8_t)s[at] < 0x80 ? 1 : (uint8_t)s[at] < 0xE0 ? 2 : (uint8_t)s[at] < 0xF0 ? 3 : 4;
        off[m] = at;
        len[m] = k;
        at += k;
    }
    for (;;) {
        long best = -1;
        float best_score = 0;
        for (size_t i = 0; i + 1 < m; i++) {
            long id = naive_find(texts, n, s + off[i], len[i] + len[i + 1]);
            if (id >= 0 && (best < 0 || score[id] > best_score)) {
                best = (long)i;
                best_score = score[id];
            }
        }
        if (best < 0)
            break;
        len[best] += len[best + 1];
        for (size_t i = (size_t)best + 1; i + 1 < m; i++) {
            off[i] = off[i + 1];
            len[i] = len[i + 1];
        }
        m--;
    }
    size_t k = 0;
    for (size_t i = 0; i < m; i++) {
        long id = naive_find(texts, n, s + off[i], len[i]);
        if (id >= 0) {
            out[k++] = (int32_t)id;
            continue;
        }
        for (size_t b = 0; b < len[i]; b++)
            out[k++] = SPM_BYTE((uint8_t)s[off[i] + b]);
    }
    return k;
}

static void test_spm_matches_slow_reference(void)
{
    /* Random tokens over a small alphabet (two of them multi-byte), random
     * scores with many ties, random texts: the heap must agree with the slow
     * way on every one. */
    static const char *alpha[] = {"a", "b", "c", "d", U2581, "\xc3\xa9"};
    static char store[200][64];
    spm_tok v[200];
    const char *all[SPM_MAX];
    float score[SPM_MAX];
    uint32_t seed = 12345;
#define RND() (seed = seed * 1103515245u + 12345u, (seed >> 16) & 0x7fff)
    size_t nv = 0;
    for (int i = 0; i < 5; i++) /* every single character but e-acute, which falls back to bytes */
        v[nv++] = (spm_tok){alpha[i], -100, 0};
    while (nv < 200) {
        size_t k = 2 + RND() % 4;
        store[nv][0] = 0;
        for (size_t j = 0; j < k; j++)
            strcat(store[nv], alpha[RND() % 6]);
        int dup = 0;
        for (size_t j = 0; j < nv; j++)
            dup |= strcmp(v[j].text, store[nv]) == 0;
        if (dup)
            continue;
        v[nv] = (spm_tok){store[nv], -(float)(RND() % 8), 0};
        nv++;
    }
    tok_tokenizer *t;
    gguf_file *g = NULL;
    buf f;
    CHECK_OK(spm_load(v, nv, 0, &t, &f, &g));
    size_t n_all = 0;
    for (int32_t id = 0; id < tok_vocab_size(t); id++) {
        all[n_all] = tok_piece(t, id);
        score[n_all++] = id >= SPM_X ? v[id - SPM_X].score : 0;
    }
    int bad = -1;
    for (int it = 0; it < 300 && bad < 0; it++) {
        char text[256] = "", spaced[256];
        size_t k = 1 + RND() % 30;
        for (size_t j = 0; j < k; j++)
            strcat(text, alpha[RND() % 6]);
        /* The tokenizer sees spaces; the vocab and the slow way U+2581. */
        size_t o = 0;
        for (const char *p = text; *p;) {
            if (strncmp(p, U2581, 3) == 0) {
                spaced[o++] = ' ';
                p += 3;
            } else {
                spaced[o++] = *p++;
            }
        }
        spaced[o] = 0;
        int32_t want[256], *ids = NULL;
        size_t nw = naive_spm(all, score, n_all, text, want), n = 0;
        if (tok_encode(t, spaced, o, 0, &ids, &n) != 0 || !same_ids(ids, n, want, nw))
            bad = it;
        free(ids);
    }
#undef RND
    toy_free(t, &f, g);
    CHECK(bad < 0, "text %d differs from the slow way", bad);
}

static void test_spm_gemma_chat(void)
{
    /* Gemma's markers: 259 <start_of_turn>, 260 <end_of_turn> (control); 261
     * "\n" user-defined as in Gemma; letters; BOS 1. */
    static const spm_tok v[] = {{"<start_of_turn>", 0, 3}, {"<end_of_turn>", 0, 3}, {"\n", 0, 4},
                                {"u", -1, 0}, {"s", -1, 0}, {"e", -1, 0}, {"r", -1, 0}, {"m", -1, 0},
                                {"o", -1, 0}, {"d", -1, 0}, {"l", -1, 0}, {"H", -1, 0}, {"i", -1, 0},
                                {"user", -2, 0}, {"us", -3, 0}, {"er", -3, 0}, {U2581, -4, 0}};
    tok_tokenizer *t;
    gguf_file *g = NULL;
    buf f;
    spm_spec sp = {v, sizeof v / sizeof v[0], 1, 0, 1, 2, 1, 0, NULL, NULL};
    CHECK_OK(spm_build(&sp, &t, &f, &g));
    tok_chat_format fmt = tok_chat_kind(t);
    int kind = fmt == TOK_CHAT_GEMMA && strcmp(tok_chat_name(fmt), "gemma") == 0 && tok_eot(t) == 260;
    const int32_t S = SPM_X, E = SPM_X + 1, NL = SPM_X + 2, USER = SPM_X + 13;
    int32_t *ids = NULL, *direct = NULL;
    size_t n = 0, n_direct = 0, len = 0;
    char *text = NULL;
    /* BOS, <start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n */
    const int32_t want[] = {1, S, USER, NL, SPM_X + 11, SPM_X + 12, E, NL, S,
                            SPM_X + 7, SPM_X + 8, SPM_X + 9, SPM_X + 5, SPM_X + 10, NL};
    int rc = tok_chat(t, NULL, "Hi", &ids, &n);
    int user_only = rc == 0 && same_ids(ids, n, want, sizeof want / sizeof want[0]);
    free(ids);
    /* The system message opens the user turn, then "\n\n". */
    const char *rendered = "<s><start_of_turn>user\nBe brief.\n\nHi there<end_of_turn>\n<start_of_turn>model\n";
    rc = tok_chat(t, "Be brief.", "Hi there", &ids, &n);
    int rendered_ok = rc == 0 && tok_decode(t, ids, n, &text, &len) == 0 && len == strlen(rendered) &&
                      memcmp(text, rendered, len) == 0;
    int as_encode = rc == 0 && tok_encode(t, rendered, strlen(rendered), 1, &direct, &n_direct) == 0 &&
                    same_ids(ids, n, direct, n_direct);
    int structure = rc == 0 && ids[0] == 1 && count_id(ids, n, 1) == 1 && count_id(ids, n, S) == 2 &&
                    count_id(ids, n, E) == 1;
    free(ids);
    free(direct);
    free(text);
    /* An empty system message still writes its "\n\n" (as the template does). */
    rc = tok_chat(t, "", "Hi", &ids, &n);
    int empty_sys = rc == 0 && n == sizeof want / sizeof want[0] + 2 && ids[3] == NL && ids[4] == NL && ids[5] == NL;
    free(ids);
    /* The contents are never parsed for control tokens. */
    rc = tok_chat(t, NULL, "<end_of_turn><start_of_turn>", &ids, &n);
    int literal = rc == 0 && count_id(ids, n, E) == 1 && count_id(ids, n, S) == 2;
    free(ids);
    /* Several turns (tok_chat_msgs): the assistant's as "model", the system
     * message in the first user turn only; what the template refuses, refused. */
    const tok_chat_msg conv[] = {{"system", "Be brief."}, {"user", "Hi"}, {"assistant", "Hi there"},
                                 {"user", "Hi"}};
    const char *multi = "<s><start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n<start_of_turn>model\nHi there"
                        "<end_of_turn>\n<start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n";
    rc = tok_chat_msgs(t, conv, 4, &ids, &n);
    int multi_ok = rc == 0 && tok_decode(t, ids, n, &text, &len) == 0 && len == strlen(multi) &&
                   memcmp(text, multi, len) == 0 && tok_encode(t, multi, strlen(multi), 1, &direct, &n_direct) == 0 &&
                   same_ids(ids, n, direct, n_direct);
    free(ids);
    free(direct);
    free(text);
    int32_t *one = NULL;
    size_t n_one = 0;
    int same_as_chat = tok_chat_msgs(t, conv, 2, &ids, &n) == 0 && tok_chat(t, "Be brief.", "Hi", &one, &n_one) == 0 &&
                       same_ids(ids, n, one, n_one);
    free(ids);
    free(one);
    const tok_chat_msg two_users[] = {{"user", "a"}, {"user", "b"}}, late_sys[] = {{"user", "a"}, {"system", "b"}},
                       bad_role[] = {{"tool", "a"}};
    int gemma_rules = tok_chat_msgs(t, two_users, 2, &ids, &n) == RD_EINVAL && strstr(rd_errmsg(), "alternating") &&
                      tok_chat_msgs(t, late_sys, 2, &ids, &n) == RD_EINVAL && strstr(rd_errmsg(), "only first") &&
                      tok_chat_msgs(t, bad_role, 1, &ids, &n) == RD_EINVAL && strstr(rd_errmsg(), "tool") &&
                      tok_chat_msgs(t, conv, 0, &ids, &n) == RD_EINVAL && ids == NULL;
    toy_free(t, &f, g);

    /* Gemma's and ChatML's markers: ChatML (first in the order), unless the
     * template uses Gemma's only. */
    static const spm_tok both[] = {{"<start_of_turn>", 0, 3}, {"<end_of_turn>", 0, 3}, {"<|im_start|>", 0, 3},
                                   {"<|im_end|>", 0, 3}};
    spm_spec sb = {both, 4, 1, 0, -1, -1, -1, 0, NULL, NULL};
    CHECK_OK(spm_build(&sb, &t, &f, &g));
    int chatml_first = tok_chat_kind(t) == TOK_CHAT_CHATML && tok_eot(t) == SPM_X + 3;
    toy_free(t, &f, g);
    sb.chat_template = "{{ bos_token }}{% for m in messages %}<start_of_turn>{{ m.role }}\n{% endfor %}";
    CHECK_OK(spm_build(&sb, &t, &f, &g));
    int tmpl_gemma = tok_chat_kind(t) == TOK_CHAT_GEMMA && tok_eot(t) == SPM_X + 1;
    toy_free(t, &f, g);
    /* Only <start_of_turn>: no format; the message names what Gemma's lacks. */
    spm_spec half = {both, 1, 1, 0, -1, -1, -1, 0, NULL, NULL};
    CHECK_OK(spm_build(&half, &t, &f, &g));
    rc = tok_chat(t, NULL, "x", &ids, &n);
    int refused = rc == RD_ENOTSUP && tok_chat_kind(t) == TOK_CHAT_NONE && strstr(rd_errmsg(), "lacks <end_of_turn>");
    toy_free(t, &f, g);
    CHECK(kind, "chat kind %d", fmt);
    CHECK(user_only, "user-only prompt ids");
    CHECK(rendered_ok, "the prompt decodes to the rendered template");
    CHECK(as_encode, "ids differ from encoding the rendered template with special parsing");
    CHECK(structure, "one BOS first, two <start_of_turn>, one <end_of_turn>");
    CHECK(empty_sys, "an empty system message");
    CHECK(literal, "control-token text in the user message was parsed");
    CHECK(multi_ok, "a multi-turn conversation renders as the template");
    CHECK(same_as_chat, "tok_chat_msgs of system + user is tok_chat");
    CHECK(gemma_rules, "Gemma's turn rules: %s", rd_errmsg());
    CHECK(chatml_first, "Gemma and ChatML markers, no template: ChatML");
    CHECK(tmpl_gemma, "a Gemma template: Gemma");
    CHECK(refused, "half of Gemma's markers: %d %s", rc, rd_errmsg());
}

/* ------------------------------------------------------------------------
 * The real Gemma 3 vocabulary, when the file is there. */

static const char *gemma_path(void)
{
    const char *p = getenv("RD_GEMMA_MODEL");
    return p && *p ? p : "models/gemma-3-270m-q4_k_m.gguf";
}

static void test_gemma_vocab(void)
{
    gguf_file *g = NULL;
    tok_tokenizer *t = NULL;
    CHECK_OK(gguf_open(gemma_path(), &g));
    int rc = tok_load(g, &t);
    gguf_close(g); /* the tokenizer keeps copies */
    CHECK(rc == 0, "tok_load: %s", rd_errmsg());
    int header = tok_vocab_size(t) == 262144 && tok_bos(t) == 2 && tok_eos(t) == 1 && tok_add_bos(t) == 1 &&
                 tok_chat_kind(t) == TOK_CHAT_GEMMA && tok_eot(t) == 106 &&
                 strcmp(tok_piece(t, 105), "<start_of_turn>") == 0;
    /* Checked against llama.cpp (tests/py/test_tokenizer_gemma.py has many more). */
    int hello = spm_ids(t, "Hello world", 0, (int32_t[]){9259, 1902}, 2);
    int rare = spm_ids(t, "\xf0\xa0\x80\x80", 0, (int32_t[]){238 + 0xF0, 238 + 0xA0, 238 + 0x80, 238 + 0x80}, 4);
    int32_t *ids = NULL;
    size_t n = 0;
    rc = tok_chat(t, NULL, "Hi", &ids, &n);
    int chat = rc == 0 && n > 4 && ids[0] == 2 && ids[1] == 105 && count_id(ids, n, 106) == 1;
    free(ids);
    const char *mixed = "Caf\xc3\xa9  \t\n\n<b>x</b> \xe6\x97\xa5\xe6\x9c\xac \xf0\xa0\x80\x80";
    const char *turns = "<start_of_turn>user\nHi<end_of_turn>\n";
    int trip = roundtrips(t, mixed, strlen(mixed), 0) && roundtrips(t, turns, strlen(turns), 1);
    tok_free(t);
    CHECK(header, "vocab / bos / eos / add_bos / chat / eot");
    CHECK(hello, "Hello world");
    CHECK(rare, "U+20000 as its bytes");
    CHECK(chat, "the chat prompt");
    CHECK(trip, "round trips");
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
    RUN(test_spm_scores_pick_the_merge);
    RUN(test_spm_byte_fallback);
    RUN(test_spm_left_over_symbols);
    RUN(test_spm_space_prefix);
    RUN(test_spm_keys_and_refusals);
    RUN(test_spm_matches_slow_reference);
    RUN(test_spm_gemma_chat);
    FILE *gemma = fopen(gemma_path(), "rb");
    if (gemma) {
        fclose(gemma);
        RUN(test_gemma_vocab);
    } else {
        printf("SKIP test_gemma_vocab: %s not found (make model-gemma3, or set RD_GEMMA_MODEL)\n", gemma_path());
    }
    tok_free(model_tok);
    gguf_close(model_file);
    TEST_EXIT();
}
