/* serve_dtype.c - serve_dtype names (serve_dtype.h). */
#include "engine/update/serve_dtype.h"

#include <string.h>

#include "base/err.h"

const char *upd_serve_name(upd_serve serve)
{
    static const char *const names[] = {"as_pushed", "q8_0", "q4_k", "fp8"};
    return (unsigned)serve < sizeof names / sizeof names[0] ? names[serve] : "unknown";
}

int upd_serve_parse(const char *name, upd_serve *out)
{
    for (int i = 0; i <= UPD_SERVE_FP8; i++)
        if (!strcmp(name, upd_serve_name((upd_serve)i))) {
            *out = (upd_serve)i;
            return 0;
        }
    return RD_EINVAL;
}
