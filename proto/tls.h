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

/* The same server side for a stream the caller drives itself (the HTTPS
 * API, daemon/http_tls.c): an mbedTLS server configuration holding the
 * certificate, the key and a seeded random generator. TLS 1.2 (what the
 * packaged mbedTLS 2.28 serves), no client certificates. */
typedef struct proto_ssl_server proto_ssl_server;
struct mbedtls_ssl_config;
int proto_tls_ssl_server(const char *cert_file, const char *key_file, proto_ssl_server **out);
/* For mbedtls_ssl_setup; valid until proto_tls_ssl_free. */
const struct mbedtls_ssl_config *proto_ssl_config(const proto_ssl_server *s);
void proto_tls_ssl_free(proto_ssl_server *s);

#endif
