/* rollout-tokenize - the engine's tokenizer on the command line, for tests and
 * for checking prompts by hand.
 *
 *   rollout-tokenize --model PATH [--special]   < hex lines  > id lines
 *   rollout-tokenize --model PATH --decode      < id lines   > hex lines
 *
 * Each input line is one request. Encoding reads the text as hex (so any bytes,
 * newlines included, fit on a line) and prints the ids comma-separated;
 * decoding reads comma-separated ids and prints the bytes as hex. An empty line
 * is the empty text or the empty id list. A request that fails prints
 * "error: <why>" on its line and the tool goes on; the exit status is then 1.
 * Bad flags exit with status 2. */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/err.h"
#include "engine/gguf.h"
#include "engine/tokenizer.h"

static void usage(FILE *f)
{
    fprintf(f, "usage: rollout-tokenize --model PATH [--special] [--decode]\n"
               "  stdin: one request per line; stdout: one result per line\n"
               "  encode (default): hex-encoded UTF-8 text in, comma-separated token ids out\n"
               "  --special         text like <|im_start|> becomes its control token\n"
               "  --decode          comma-separated token ids in, hex-encoded bytes out\n");
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

static int encode_line(const tok_tokenizer *t, char *line, size_t n, int special)
{
    size_t len = 0, n_ids = 0;
    int32_t *ids = NULL;
    int rc = unhex(line, n, &len);
    if (!rc)
        rc = tok_encode(t, line, len, special, &ids, &n_ids);
    if (rc)
        return rc;
    for (size_t i = 0; i < n_ids; i++)
        printf(i ? ",%d" : "%d", ids[i]);
    putchar('\n');
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
    const char *model = NULL;
    int special = 0, decode = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--model") == 0) {
            if (i + 1 >= argc) {
                fprintf(stderr, "rollout-tokenize: --model needs a path\n");
                return 2;
            }
            model = argv[++i];
        } else if (strcmp(argv[i], "--special") == 0) {
            special = 1;
        } else if (strcmp(argv[i], "--decode") == 0) {
            decode = 1;
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
    if (special && decode) {
        fprintf(stderr, "rollout-tokenize: --special applies to encoding; decoding always writes control "
                        "tokens as their text\n");
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

    char *line = NULL;
    size_t cap = 0;
    ssize_t n;
    int failed = 0;
    while ((n = getline(&line, &cap, stdin)) >= 0) {
        while (n > 0 && (line[n - 1] == '\n' || line[n - 1] == '\r'))
            line[--n] = 0;
        rc = decode ? decode_line(t, line) : encode_line(t, line, (size_t)n, special);
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
