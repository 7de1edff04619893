/* netaddr.h - which of the daemon's sockets face a network.
 *
 * DESIGN.md: loopback by default. The learner socket and the data lane have
 * no authentication yet, so either may bind a non-loopback address only when
 * the operator starts the daemon with insecure = 1, which /status shows; the
 * HTTP server has its own rule (an api key, or http_insecure; http.h). */
#ifndef RD_DAEMON_NETADDR_H
#define RD_DAEMON_NETADDR_H

#include <nng/nng.h>
#include <sys/socket.h>

/* 1 for 127.0.0.0/8, ::1 and ::ffff:127.x.y.z. */
int net_is_loopback(const struct sockaddr *sa);
/* The same for a bound NNG listener's address; ipc and inproc are local (1). */
int net_nng_is_loopback(const nng_sockaddr *sa);

#endif
