/* mapfile.c - see mapfile.h. */
#include "base/mapfile.h"

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/err.h"

int rd_map_file(const char *what, const char *path, const void **base, size_t *size)
{
    struct stat st;
    *base = NULL;
    *size = 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return rd_fail(RD_EIO, "%s: cannot open '%s': %s", what, path, strerror(errno));
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        int e = errno;
        close(fd);
        return rd_fail(RD_EIO, "%s: '%s' is not a regular file%s%s", what, path, e ? ": " : "", e ? strerror(e) : "");
    }
    if (st.st_size == 0) {
        close(fd);
        return 0;
    }
    void *p = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    int e = errno;
    close(fd); /* the mapping keeps the file alive */
    if (p == MAP_FAILED)
        return rd_fail(RD_EIO, "%s: cannot mmap '%s' (%lld bytes): %s", what, path, (long long)st.st_size, strerror(e));
    *base = p;
    *size = (size_t)st.st_size;
    return 0;
}

void rd_unmap_file(const void *base, size_t size)
{
    if (base)
        munmap((void *)base, size);
}

void rd_map_drop_pages(const void *p, size_t size)
{
    long pg = sysconf(_SC_PAGESIZE);
    if (!p || size == 0 || pg <= 0)
        return;
    uintptr_t a = ((uintptr_t)p + (uintptr_t)pg - 1) & ~((uintptr_t)pg - 1), e = (uintptr_t)p + size;
    if (e > a)
        madvise((void *)a, e - a, MADV_DONTNEED);   /* advice: nothing to do if it fails */
}
