/* tls.c - see tls.h. */
#include "proto/tls.h"

#include <errno.h>
#include <mbedtls/ctr_drbg.h>
#include <mbedtls/entropy.h>
#include <mbedtls/error.h>
#include <mbedtls/pk.h>
#include <mbedtls/ssl.h>
#include <mbedtls/x509_crt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/err.h"

int proto_tls_url(const char *url) { return url && !strncmp(url, "tls+tcp", 7); }

/* A whole PEM file as a NUL-terminated string (at most 1 MiB). */
static int read_pem(const char *what, const char *path, char **out)
{
    *out = NULL;
    if (!path || !*path)
        return rd_fail(RD_EINVAL, "TLS: %s is not set (a PEM file)", what);
    FILE *f = fopen(path, "rb");
    if (!f)
        return rd_fail(RD_EIO, "TLS: %s %s: cannot open (%s)", what, path, strerror(errno));
    char *buf = malloc((1 << 20) + 1);
    size_t n = buf ? fread(buf, 1, 1 << 20, f) : 0;
    int more = buf && fgetc(f) != EOF;
    fclose(f);
    if (!buf)
        return rd_fail(RD_ENOMEM, "TLS: out of memory reading %s", path);
    buf[n] = 0;
    if (more || !strstr(buf, "-----BEGIN ")) {
        free(buf);
        return rd_fail(RD_EFORMAT, "TLS: %s %s is not a PEM file (no \"-----BEGIN\" block, or over 1 MiB)", what,
                       path);
    }
    *out = buf;
    return 0;
}

int proto_tls_server(const char *cert_file, const char *key_file, nng_tls_config **out)
{
    *out = NULL;
    char *cert, *key;
    int rc = read_pem("tls_cert_file", cert_file, &cert);
    if (rc)
        return rc;
    if ((rc = read_pem("tls_key_file", key_file, &key))) {
        free(cert);
        return rc;
    }
    nng_tls_config *cfg = NULL;
    int rv = nng_tls_config_alloc(&cfg, NNG_TLS_MODE_SERVER);
    if (!rv && (rv = nng_tls_config_own_cert(cfg, cert, key, NULL))) {
        nng_tls_config_free(cfg);
        cfg = NULL;
    }
    free(cert);
    memset(key, 0, strlen(key));
    free(key);
    if (rv)
        return rd_fail(RD_EINVAL, "TLS: cannot use certificate %s with key %s: %s", cert_file, key_file,
                       nng_strerror(rv));
    *out = cfg;
    return 0;
}

int proto_tls_client(const char *url, const char *ca_file, nng_tls_config **out)
{
    *out = NULL;
    /* tls+tcp://HOST:PORT or tls+tcp://[V6]:PORT -> HOST */
    const char *h = strstr(url, "://");
    char host[256] = "";
    if (h) {
        h += 3;
        const char *end = *h == '[' ? strchr(h, ']') : strrchr(h, ':');
        if (*h == '[')
            h++;
        size_t n = end ? (size_t)(end - h) : strlen(h);
        if (n < sizeof host)
            memcpy(host, h, n), host[n] = 0;
    }
    if (!host[0])
        return rd_fail(RD_EINVAL, "TLS: no host name in %s", url);
    nng_tls_config *cfg = NULL;
    int rv = nng_tls_config_alloc(&cfg, NNG_TLS_MODE_CLIENT);
    if (!rv && ca_file && *ca_file) {
        if (!(rv = nng_tls_config_ca_file(cfg, ca_file)))
            rv = nng_tls_config_auth_mode(cfg, NNG_TLS_AUTH_MODE_REQUIRED);
    } else if (!rv) {
        rv = NNG_EINVAL; /* without a CA the daemon cannot be verified */
    }
    if (!rv)
        rv = nng_tls_config_server_name(cfg, host);
    if (rv) {
        if (cfg)
            nng_tls_config_free(cfg);
        return rd_fail(RD_EINVAL, "TLS: cannot verify %s%s%s: %s", url, ca_file && *ca_file ? " with CA file " : "",
                       ca_file && *ca_file ? ca_file : " (no CA file: set ROLLOUTD_TLS_CA_FILE)", nng_strerror(rv));
    }
    *out = cfg;
    return 0;
}

struct proto_ssl_server {
    mbedtls_ssl_config conf;
    mbedtls_x509_crt cert;
    mbedtls_pk_context key;
    mbedtls_entropy_context entropy;
    mbedtls_ctr_drbg_context rng;
};

void proto_tls_ssl_free(proto_ssl_server *s)
{
    if (!s)
        return;
    mbedtls_ssl_config_free(&s->conf);
    mbedtls_x509_crt_free(&s->cert);
    mbedtls_pk_free(&s->key);
    mbedtls_ctr_drbg_free(&s->rng);
    mbedtls_entropy_free(&s->entropy);
    free(s);
}

const struct mbedtls_ssl_config *proto_ssl_config(const proto_ssl_server *s) { return &s->conf; }

int proto_tls_ssl_server(const char *cert_file, const char *key_file, proto_ssl_server **out)
{
    *out = NULL;
    char *cert, *key;
    int rc = read_pem("tls_cert_file", cert_file, &cert);
    if (rc)
        return rc;
    if ((rc = read_pem("tls_key_file", key_file, &key))) {
        free(cert);
        return rc;
    }
    proto_ssl_server *s = calloc(1, sizeof *s);
    if (!s) {
        free(cert);
        free(key);
        return rd_fail(RD_ENOMEM, "TLS: out of memory");
    }
    mbedtls_ssl_config_init(&s->conf);
    mbedtls_x509_crt_init(&s->cert);
    mbedtls_pk_init(&s->key);
    mbedtls_entropy_init(&s->entropy);
    mbedtls_ctr_drbg_init(&s->rng);
    static const unsigned char pers[] = "rolloutd https";
    const char *what = "the certificate";
    /* PEM parsing takes the terminating NUL in the length. */
    int mv = mbedtls_x509_crt_parse(&s->cert, (const unsigned char *)cert, strlen(cert) + 1);
    if (!mv) {
        what = "the key";
        mv = mbedtls_pk_parse_key(&s->key, (const unsigned char *)key, strlen(key) + 1, NULL, 0);
    }
    if (!mv) {
        what = "the random generator";
        mv = mbedtls_ctr_drbg_seed(&s->rng, mbedtls_entropy_func, &s->entropy, pers, sizeof pers - 1);
    }
    if (!mv) {
        what = "the server defaults";
        mv = mbedtls_ssl_config_defaults(&s->conf, MBEDTLS_SSL_IS_SERVER, MBEDTLS_SSL_TRANSPORT_STREAM,
                                         MBEDTLS_SSL_PRESET_DEFAULT);
    }
    if (!mv) {
        mbedtls_ssl_conf_rng(&s->conf, mbedtls_ctr_drbg_random, &s->rng);
        mbedtls_ssl_conf_authmode(&s->conf, MBEDTLS_SSL_VERIFY_NONE); /* clients prove a key, not a certificate */
        what = "the certificate with this key";
        mv = mbedtls_ssl_conf_own_cert(&s->conf, &s->cert, &s->key);
    }
    free(cert);
    memset(key, 0, strlen(key));
    free(key);
    if (mv) {
        char err[160];
        mbedtls_strerror(mv, err, sizeof err);
        proto_tls_ssl_free(s);
        return rd_fail(RD_EINVAL, "TLS: %s (%s, %s): %s", what, cert_file, key_file, err);
    }
    *out = s;
    return 0;
}
