/* test_err.c - the per-thread error message (base/err.h).
 *
 * - a message may be built from the previous one (rd_fail(rc, "ctx: %s",
 *   rd_errmsg())), once or several times over, and reads as the
 *   concatenation;
 * - a long one is cut at 511 bytes and stays NUL-terminated, with the
 *   previous message's start intact after the prefix;
 * - the code is returned unchanged and the message is per thread. */
#include <pthread.h>

#include "base/err.h"
#include "tests/unit/test.h"

static void test_context_from_previous(void)
{
    CHECK(rd_fail(RD_EIO, "cannot read %s at %d", "model.gguf", 7) == RD_EIO, "code");
    CHECK(rd_fail(RD_EFORMAT, "tensor blk.3: %s", rd_errmsg()) == RD_EFORMAT, "code");
    rd_fail(RD_EFORMAT, "loading: %s", rd_errmsg());
    CHECK(!strcmp(rd_errmsg(), "loading: tensor blk.3: cannot read model.gguf at 7"), "got '%s'", rd_errmsg());
    /* the previous message twice in one format */
    rd_fail(RD_EINVAL, "ab");
    rd_fail(RD_EINVAL, "%s|%s", rd_errmsg(), rd_errmsg());
    CHECK(!strcmp(rd_errmsg(), "ab|ab"), "got '%s'", rd_errmsg());
}

static void test_long_is_cut(void)
{
    char inner[600];
    for (int i = 0; i < 599; i++)
        inner[i] = (char)('a' + i % 26);
    inner[599] = 0;
    rd_fail(RD_EINVAL, "%s", inner);
    CHECK(strlen(rd_errmsg()) == 511, "length %zu, expected 511", strlen(rd_errmsg()));
    rd_fail(RD_EINVAL, "ctx: %s", rd_errmsg());
    const char *m = rd_errmsg();
    CHECK(strlen(m) == 511, "length %zu, expected 511", strlen(m));
    CHECK(!strncmp(m, "ctx: ", 5) && !strncmp(m + 5, inner, 506), "the previous message is not intact after the prefix");
}

static void *other_thread(void *arg)
{
    rd_fail(RD_ENOENT, "other thread");
    *(int *)arg = !strcmp(rd_errmsg(), "other thread");
    return NULL;
}

static void test_per_thread(void)
{
    rd_fail(RD_EINVAL, "main thread");
    int ok = 0;
    pthread_t t;
    CHECK(pthread_create(&t, NULL, other_thread, &ok) == 0, "pthread_create");
    pthread_join(t, NULL);
    CHECK(ok, "the other thread did not see its own message");
    CHECK(!strcmp(rd_errmsg(), "main thread"), "main thread's message became '%s'", rd_errmsg());
}

int main(void)
{
    RUN(test_context_from_previous);
    RUN(test_long_is_cut);
    RUN(test_per_thread);
    TEST_EXIT();
}
