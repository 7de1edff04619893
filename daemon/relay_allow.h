/* relay_allow.h - where an UPDATE_FORWARD may make this daemon connect
 * (relay_allow; PROTOCOL.md §10.11). UPDATE_BEGIN carries no list of the
 * chain's daemons, so an authenticated learner could otherwise point the
 * relay at any host and port the daemon can reach; this list is the bound.
 *
 * The text is comma-separated entries (spaces around them ignored):
 *   HOST:PORT, HOST:*       a numeric IPv4 address, one port or any
 *   [V6]:PORT, [V6]:*       a numeric IPv6 address in brackets
 *   loopback                127.0.0.0/8 and ::1, any port
 *   none                    nothing (alone)
 * "" is the default: loopback while the learner socket is on loopback (a
 * fleet on one host), else nothing. An IPv4-mapped IPv6 host is matched as
 * its IPv4 address. */
#ifndef RD_DAEMON_RELAY_ALLOW_H
#define RD_DAEMON_RELAY_ALLOW_H

#include <stddef.h>
#include <stdint.h>

#define RA_MAX_ENTRIES 64

typedef struct {
    int family;                 /* 4 or 6; 0: the loopback entry */
    uint8_t addr[16];           /* 4 or 16 bytes, network order */
    uint16_t port;              /* 0 = any port */
} ra_entry;

typedef struct {
    ra_entry e[RA_MAX_ENTRIES];
    int n;
} ra_list;

/* Parses spec; "" takes the default, loopback when listen_loopback.
 * RD_EINVAL naming the bad entry. */
int ra_parse(const char *spec, int listen_loopback, ra_list *out);
/* 1 when a learner URL (tcp://HOST:PORT, tls+tcp://..., ipc://, inproc://)
 * stays on this host: a loopback numeric address, or ipc/inproc. A name or
 * a wildcard is not loopback. */
int ra_url_is_loopback(const char *url);
/* 1 when host (numeric IPv4 or IPv6, as UPDATE_FORWARD names it) and port
 * are in the list. */
int ra_allows(const ra_list *l, const char *host, uint16_t port);
/* The same for a learner URL (tcp://HOST:PORT, tls+tcp://HOST:PORT, [V6]
 * in brackets) a WEIGHTS_SYNC asks this daemon to push to; "localhost" is
 * taken as 127.0.0.1, any other name is not in the list. */
int ra_allows_url(const ra_list *l, const char *url);
/* The list as text for a message ("none" when empty). */
void ra_describe(const ra_list *l, char *out, size_t cap);

#endif
