/* rollout-tokenize - the engine's tokenizer on the command line, for tests and
 * for checking prompts by hand.
 *
 *   rollout-tokenize --model PATH [--special]   < hex lines  > id lines
 *   rollout-tokenize --model PATH --prompt      < hex lines  > id lines
 *   rollout-tokenize --model PATH --chat        < [hex:]hex lines > id lines
 *   rollout-tokenize --model PATH --decode      < id lines   > hex lines
 *   rollout-tokenize --model PATH --info        > "key value" lines
 *
 * Each input line is one request. Encoding reads the text as hex (so any bytes,
 * newlines included, fit on a line) and prints the ids comma-separated;
 * --prompt encodes as a plain-text prompt (tok_encode_prompt: BOS when the
 * vocab asks for it, special tokens parsed); --chat reads "USER" or
 * "SYSTEM:USER" (each hex) and prints the chat prompt's ids (tok_chat);
 * decoding reads comma-separated ids and prints the bytes as hex. An empty line
 * is the empty text or the empty id list. A request that fails prints
 * "error: <why>" on its line and the tool goes on; the exit status is then 1.
 * --info prints the vocabulary's size, bos, eos, eot, add_bos and chat format.
 * Bad flags exit with status 2. */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/err.h"
#include "engine/format/gguf.h"
#include "engine/text/tokenizer.h"

static void usage(FILE *f)
{
    fprintf(f, "usage: rollout-tokenize --model PATH [--special | --prompt | --chat | --decode | --info]\n"
               "  stdin: one request per line; stdout: one result per line\n"
               "  encode (default): hex-encoded UTF-8 text in, comma-separated token ids out\n"
               "  --special         text like <|im_start|> becomes its control token\n"
               "  --prompt          as a plain-text prompt: --special, after the BOS if the vocab adds one\n"
               "  --chat            USER or SYSTEM:USER (hex) in, the chat prompt's ids out\n"
               "  --decode          comma-separated token ids in, hex-encoded bytes out\n"
               "  --info            print vocab, bos, eos, eot, add_bos and chat (no input)\n");
}

static int hex_value(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

/* Decodes n hex digits in place into n / 2 bytes. */
static int unhex(char *s, size_t n, size_t *out_len)
{
    if (n % 2)
        return rd_fail(RD_EINVAL, "the line has %zu hex digits, expected an even number", n);
    for (size_t i = 0; i < n; i += 2) {
        int hi = hex_value(s[i]), lo = hex_value(s[i + 1]);
        if (hi < 0 || lo < 0)
            return rd_fail(RD_EINVAL, "character %zu of the line is not a hex digit", hi < 0 ? i + 1 : i + 2);
        s[i / 2] = (char)(hi << 4 | lo);
    }
    *out_len = n / 2;
    return 0;
}

/* Parses "12,5,0" (no spaces needed, spaces allowed) into a malloc'd array. */
static int parse_ids(const char *s, int32_t **ids, size_t *n)
{
    size_t cap = 1;
    for (const char *p = s; *p; p++)
        cap += *p == ',';
    int32_t *v = malloc(sizeof(int32_t) * cap);
    if (!v)
        return rd_fail(RD_ENOMEM, "out of memory");
    size_t k = 0;
    const char *p = s;
    while (*p == ' ')
        p++;
    while (*p) {
        char *end;
        errno = 0;
        long x = strtol(p, &end, 10);
        if (end == p || errno || x < INT32_MIN || x > INT32_MAX) {
            free(v);
            return rd_fail(RD_EINVAL, "id %zu (\"%.20s\") is not a 32-bit integer", k + 1, p);
        }
        v[k++] = (int32_t)x;
        p = end;
        while (*p == ' ')
            p++;
        if (*p == ',') {
            p++;
            while (*p == ' ')
                p++;
            if (!*p) {
                free(v);
                return rd_fail(RD_EINVAL, "the line ends with a comma");
            }
        } else if (*p) {
            free(v);
            return rd_fail(RD_EINVAL, "expected ',' after id %zu, found '%c'", k, *p);
        }
    }
    *ids = v;
    *n = k;
    return 0;
}

enum { MODE_ENCODE, MODE_SPECIAL, MODE_PROMPT, MODE_CHAT, MODE_DECODE, MODE_INFO };

static void print_ids(const int32_t *ids, size_t n_ids)
{
    for (size_t i = 0; i < n_ids; i++)
        printf(i ? ",%d" : "%d", ids[i]);
    putchar('\n');
}

static int encode_line(const tok_tokenizer *t, char *line, size_t n, int mode)
{
    size_t len = 0, n_ids = 0;
    int32_t *ids = NULL;
    int rc = unhex(line, n, &len);
    if (!rc)
        rc = mode == MODE_PROMPT ? tok_encode_prompt(t, line, len, &ids, &n_ids)
                                 : tok_encode(t, line, len, mode == MODE_SPECIAL, &ids, &n_ids);
    if (rc)
        return rc;
    print_ids(ids, n_ids);
    free(ids);
    return 0;
}

/* "USER" or "SYSTEM:USER", each hex; the messages are C strings, so a NUL in
 * one is refused rather than cutting it short. */
static int chat_line(const tok_tokenizer *t, char *line, size_t n)
{
    char *colon = memchr(line, ':', n);
    char *system = NULL, *user = line;
    size_t len = 0, sys_len = 0, n_ids = 0;
    int rc = 0;
    if (colon) {
        *colon = 0;
        system = line;
        user = colon + 1;
        rc = unhex(system, (size_t)(colon - line), &sys_len);
        system[sys_len] = 0;
    }
    if (!rc)
        rc = unhex(user, n - (size_t)(user - line), &len);
    if (rc)
        return rc;
    user[len] = 0;
    if (strlen(user) != len || (system && strlen(system) != sys_len))
        return rd_fail(RD_EINVAL, "a chat message holds a NUL byte");
    int32_t *ids = NULL;
    if ((rc = tok_chat(t, system, user, &ids, &n_ids)))
        return rc;
    print_ids(ids, n_ids);
    free(ids);
    return 0;
}

static int decode_line(const tok_tokenizer *t, const char *line)
{
    int32_t *ids = NULL;
    size_t n_ids = 0, len = 0;
    char *text = NULL;
    int rc = parse_ids(line, &ids, &n_ids);
    if (rc)
        return rc;
    rc = tok_decode(t, ids, n_ids, &text, &len);
    free(ids);
    if (rc)
        return rc;
    for (size_t i = 0; i < len; i++)
        printf("%02x", (unsigned char)text[i]);
    putchar('\n');
    free(text);
    return 0;
}

int main(int argc, char **argv)
{
    static const char *const mode_flag[] = {"", "--special", "--prompt", "--chat", "--decode", "--info"}; /* [MODE_*] */
    const char *model = NULL;
    int mode = MODE_ENCODE;
    for (int i = 1; i < argc; i++) {
        int m = -1;
        for (int k = 1; k < (int)(sizeof mode_flag / sizeof mode_flag[0]); k++)
            if (strcmp(argv[i], mode_flag[k]) == 0)
                m = k;
        if (m > 0) {
            if (mode != MODE_ENCODE && mode != m) {
                fprintf(stderr, "rollout-tokenize: %s and %s do not go together (one mode per run; --special "
                                "applies to encoding, decoding always writes control tokens as their text)\n",
                        mode_flag[mode], argv[i]);
                return 2;
            }
            mode = m;
        } else if (strcmp(argv[i], "--model") == 0) {
            if (i + 1 >= argc) {
                fprintf(stderr, "rollout-tokenize: --model needs a path\n");
                return 2;
            }
            model = argv[++i];
        } else if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            usage(stdout);
            return 0;
        } else {
            fprintf(stderr, "rollout-tokenize: unknown argument '%s'\n", argv[i]);
            usage(stderr);
            return 2;
        }
    }
    if (!model) {
        fprintf(stderr, "rollout-tokenize: --model PATH is required\n");
        usage(stderr);
        return 2;
    }

    gguf_file *g = NULL;
    tok_tokenizer *t = NULL;
    int rc = gguf_open(model, &g);
    if (rc) {
        fprintf(stderr, "rollout-tokenize: %s: %s\n", model, rd_errmsg());
        return 1;
    }
    rc = tok_load(g, &t);
    gguf_close(g);
    if (rc) {
        fprintf(stderr, "rollout-tokenize: %s: %s\n", model, rd_errmsg());
        return 1;
    }

    if (mode == MODE_INFO) {
        printf("vocab %d\nbos %d\neos %d\neot %d\nadd_bos %d\nchat %s\n", tok_vocab_size(t), tok_bos(t), tok_eos(t),
               tok_eot(t), tok_add_bos(t), tok_chat_name(tok_chat_kind(t)));
        tok_free(t);
        return 0;
    }

    char *line = NULL;
    size_t cap = 0;
    ssize_t n;
    int failed = 0;
    while ((n = getline(&line, &cap, stdin)) >= 0) {
        while (n > 0 && (line[n - 1] == '\n' || line[n - 1] == '\r'))
            line[--n] = 0;
        rc = mode == MODE_DECODE ? decode_line(t, line)
             : mode == MODE_CHAT ? chat_line(t, line, (size_t)n)
                                 : encode_line(t, line, (size_t)n, mode);
        if (rc) {
            printf("error: %s\n", rd_errmsg());
            failed = 1;
        }
        fflush(stdout);
    }
    free(line);
    tok_free(t);
    return failed;
}
