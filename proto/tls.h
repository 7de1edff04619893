/* tls.h - TLS configurations for NNG's tls+tcp:// transport (the learner
 * socket; PROTOCOL.md §1). The daemon presents a certificate and key (PEM
 * files, loaded with its own code so a bad file is an error naming it); a
 * client verifies the daemon against a CA file and the URL's host name.
 * TLS here encrypts and authenticates the daemon; clients are authenticated
 * by the shared secret (§14), not by certificates. */
#ifndef RD_PROTO_TLS_H
#define RD_PROTO_TLS_H

#include <nng/nng.h>
#include <nng/supplemental/tls/tls.h>

/* 1 for a tls+tcp:// (or tls+tcp4/6) URL. */
int proto_tls_url(const char *url);
/* Server side: cert_file holds the certificate (chain), key_file its key. */
int proto_tls_server(const char *cert_file, const char *key_file, nng_tls_config **out);
/* Client side: the daemon's certificate must chain to ca_file and name the
 * host of url. */
int proto_tls_client(const char *url, const char *ca_file, nng_tls_config **out);

#endif
