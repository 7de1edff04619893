/* netaddr.c - see netaddr.h. */
#include "daemon/netaddr.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <string.h>

/* a: network byte order */
static int ipv4_loopback(uint32_t a) { return (ntohl(a) >> 24) == 127; }

static int ipv6_loopback(const uint8_t a[16])
{
    static const uint8_t lo[16] = {[15] = 1};
    static const uint8_t mapped[12] = {[10] = 0xff, [11] = 0xff};
    return !memcmp(a, lo, 16) || (!memcmp(a, mapped, 12) && a[12] == 127);
}

int net_is_loopback(const struct sockaddr *sa)
{
    /* Fields are copied out rather than read through the cast pointer: the
     * caller's storage may be any sockaddr type. */
    if (sa->sa_family == AF_INET) {
        struct sockaddr_in in;
        memcpy(&in, sa, sizeof in);
        return ipv4_loopback(in.sin_addr.s_addr);
    }
    if (sa->sa_family == AF_INET6) {
        struct sockaddr_in6 in6;
        memcpy(&in6, sa, sizeof in6);
        return ipv6_loopback(in6.sin6_addr.s6_addr);
    }
    return 0;
}

int net_nng_is_loopback(const nng_sockaddr *sa)
{
    switch (sa->s_family) {
    case NNG_AF_INET: return ipv4_loopback(sa->s_in.sa_addr); /* network order, as NNG keeps it */
    case NNG_AF_INET6: return ipv6_loopback(sa->s_in6.sa_addr);
    case NNG_AF_IPC:
    case NNG_AF_INPROC: return 1;
    default: return 0;
    }
}
