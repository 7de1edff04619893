/* mapfile.h - read-only mapping of a whole model file (GGUF, safetensors). */
#ifndef RD_MAPFILE_H
#define RD_MAPFILE_H

#include <stddef.h>

/* Maps path read-only into *base (*size bytes). An empty regular file gives
 * *base = NULL, *size = 0 and success, so the caller can say what it needed.
 * Messages start with `what` ("gguf", "safetensors"). */
int rd_map_file(const char *what, const char *path, const void **base, size_t *size);
void rd_unmap_file(const void *base, size_t size);
/* Gives back the resident pages of [p, p + size) inside a mapping from
 * rd_map_file (whole pages only; the range stays mapped and reads fault the
 * pages in again from the file). For weights copied out at load, so the
 * process does not hold the file twice. */
void rd_map_drop_pages(const void *p, size_t size);

#endif
