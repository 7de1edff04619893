/* serve_hist.c - see serve_hist.h. */
#include "daemon/serve_hist.h"

#include <string.h>

#include "proto/proto.h"
#include "engine/update/staging.h"

void sh_init(sh_hist *h, uint64_t version, uint8_t code)
{
    memset(h, 0, sizeof *h);
    sh_note(h, version, code);
}

void sh_note(sh_hist *h, uint64_t version, uint8_t code)
{
    h->version[h->n % SH_CAP] = version;
    h->code[h->n % SH_CAP] = code;
    h->n++;
}

uint8_t sh_code(const sh_hist *h, uint64_t version)
{
    uint32_t held = h->n < SH_CAP ? h->n : SH_CAP;
    /* newest first: a result's versions are nearly always the last few */
    for (uint32_t i = 0; i < held; i++) {
        uint32_t at = (h->n - 1 - i) % SH_CAP;
        if (h->version[at] == version)
            return h->code[at];
        if (h->version[at] < version)
            return 0; /* versions increase: it was never noted */
    }
    return 0;
}

const char *sh_name(uint8_t code)
{
    return code >= PROTO_SERVE_AS_PUSHED && code <= PROTO_SERVE_MAX ? upd_serve_name((upd_serve)(code - 1)) : "unknown";
}
