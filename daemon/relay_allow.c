/* relay_allow.c - see relay_allow.h. */
#include "daemon/relay_allow.h"

#include <arpa/inet.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/err.h"

/* host -> family and bytes; a mapped IPv4 address becomes IPv4 (0 on success). */
static int parse_ip(const char *host, int *family, uint8_t addr[16])
{
    static const uint8_t mapped[12] = {[10] = 0xff, [11] = 0xff};
    memset(addr, 0, 16);
    if (inet_pton(AF_INET, host, addr) == 1) {
        *family = 4;
        return 0;
    }
    if (inet_pton(AF_INET6, host, addr) != 1)
        return -1;
    *family = 6;
    if (!memcmp(addr, mapped, 12)) {
        memmove(addr, addr + 12, 4);
        memset(addr + 4, 0, 12);
        *family = 4;
    }
    return 0;
}

static int is_loopback(int family, const uint8_t a[16])
{
    static const uint8_t lo6[16] = {[15] = 1};
    return family == 4 ? a[0] == 127 : !memcmp(a, lo6, 16);
}

/* One entry (NUL-terminated, trimmed) into l. */
static int parse_entry(const char *t, ra_list *l, const char *spec)
{
    if (l->n == RA_MAX_ENTRIES)
        return rd_fail(RD_EINVAL, "relay_allow \"%.200s\": more than %d entries", spec, RA_MAX_ENTRIES);
    ra_entry *e = &l->e[l->n];
    memset(e, 0, sizeof *e);
    if (!strcmp(t, "loopback")) {
        l->n++;
        return 0;
    }
    char host[64];
    const char *port;
    if (t[0] == '[') {
        const char *close = strchr(t, ']');
        size_t hl = close ? (size_t)(close - t - 1) : 0;
        if (!close || close[1] != ':' || hl == 0 || hl >= sizeof host || !strchr(t, ':'))
            goto bad;
        memcpy(host, t + 1, hl);
        host[hl] = 0;
        port = close + 2;
    } else {
        const char *colon = strrchr(t, ':');
        size_t hl = colon ? (size_t)(colon - t) : 0;
        if (!colon || hl == 0 || hl >= sizeof host || memchr(t, ':', hl))
            goto bad; /* a bare IPv6 address needs its brackets */
        memcpy(host, t, hl);
        host[hl] = 0;
        port = colon + 1;
    }
    if (parse_ip(host, &e->family, e->addr) || (t[0] == '[') != (strchr(host, ':') != NULL))
        goto bad;
    if (strcmp(port, "*")) {
        char *end;
        long p = strtol(port, &end, 10);
        if (end == port || *end || p < 1 || p > 65535)
            goto bad;
        e->port = (uint16_t)p;
    }
    l->n++;
    return 0;
bad:
    return rd_fail(RD_EINVAL, "relay_allow \"%.200s\": entry \"%.80s\"; expected HOST:PORT, HOST:*, [V6]:PORT, "
                   "[V6]:* with a numeric address, \"loopback\" or \"none\"", spec, t);
}

int ra_parse(const char *spec, int listen_loopback, ra_list *out)
{
    memset(out, 0, sizeof *out);
    if (!spec[0]) {
        if (listen_loopback)
            out->n = 1; /* the loopback entry (family 0) */
        return 0;
    }
    size_t len = strlen(spec);
    char *copy = malloc(len + 1);
    if (!copy)
        return rd_fail(RD_ENOMEM, "relay_allow: out of memory");
    memcpy(copy, spec, len + 1);
    int rc = 0, none = 0, entries = 0;
    for (char *p = copy, *next; p && !rc; p = next) {
        next = strchr(p, ',');
        if (next)
            *next++ = 0;
        while (*p == ' ' || *p == '\t')
            p++;
        size_t n = strlen(p);
        while (n && (p[n - 1] == ' ' || p[n - 1] == '\t'))
            p[--n] = 0;
        entries++;
        if (!strcmp(p, "none"))
            none = 1;
        else if (!*p)
            rc = rd_fail(RD_EINVAL, "relay_allow \"%.200s\": an empty entry", spec);
        else
            rc = parse_entry(p, out, spec);
    }
    free(copy);
    if (!rc && none && entries > 1)
        rc = rd_fail(RD_EINVAL, "relay_allow \"%.200s\": \"none\" must stand alone", spec);
    if (rc)
        memset(out, 0, sizeof *out);
    return rc;
}

int ra_url_is_loopback(const char *url)
{
    if (!strncmp(url, "ipc://", 6) || !strncmp(url, "inproc://", 9))
        return 1;
    const char *h = strstr(url, "://");
    if (!h)
        return 0;
    h += 3;
    char host[64];
    const char *end = *h == '[' ? strchr(h, ']') : strrchr(h, ':');
    if (*h == '[')
        h++;
    size_t n = end ? (size_t)(end - h) : strlen(h);
    if (n == 0 || n >= sizeof host)
        return 0;
    memcpy(host, h, n);
    host[n] = 0;
    int family;
    uint8_t a[16];
    return !parse_ip(host, &family, a) && is_loopback(family, a);
}

int ra_allows_url(const ra_list *l, const char *url)
{
    const char *h = strstr(url, "://");
    if (!h)
        return 0;
    h += 3;
    const char *end = *h == '[' ? strchr(h, ']') : strrchr(h, ':');
    const char *colon = end && *end == ']' ? end + 1 : end;
    if (*h == '[')
        h++;
    if (!end || !colon || *colon != ':' || end <= h)
        return 0;
    char host[64], *stop;
    size_t n = (size_t)(end - h);
    if (n >= sizeof host)
        return 0;
    memcpy(host, h, n);
    host[n] = 0;
    long port = strtol(colon + 1, &stop, 10);
    if (stop == colon + 1 || *stop || port < 1 || port > 65535)
        return 0;
    return ra_allows(l, strcmp(host, "localhost") ? host : "127.0.0.1", (uint16_t)port);
}

int ra_allows(const ra_list *l, const char *host, uint16_t port)
{
    int family;
    uint8_t a[16];
    if (parse_ip(host, &family, a))
        return 0;
    for (int i = 0; i < l->n; i++) {
        const ra_entry *e = &l->e[i];
        if (e->family == 0) {
            if (is_loopback(family, a))
                return 1;
            continue;
        }
        if (e->family == family && !memcmp(e->addr, a, family == 4 ? 4 : 16) && (!e->port || e->port == port))
            return 1;
    }
    return 0;
}

void ra_describe(const ra_list *l, char *out, size_t cap)
{
    size_t n = 0;
    out[0] = 0;
    if (l->n == 0) {
        snprintf(out, cap, "none");
        return;
    }
    for (int i = 0; i < l->n && n < cap; i++) {
        const ra_entry *e = &l->e[i];
        char ip[INET6_ADDRSTRLEN] = "", port[8] = "*";
        if (e->family)
            inet_ntop(e->family == 4 ? AF_INET : AF_INET6, e->addr, ip, sizeof ip);
        if (e->port)
            snprintf(port, sizeof port, "%u", e->port);
        if (!e->family)
            n += (size_t)snprintf(out + n, cap - n, "%sloopback", i ? "," : "");
        else
            n += (size_t)snprintf(out + n, cap - n, e->family == 6 ? "%s[%s]:%s" : "%s%s:%s", i ? "," : "", ip,
                                  port);
    }
}
