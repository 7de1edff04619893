/* auth.c - see auth.h. */
#include "proto/auth.h"

#include <errno.h>
#include <mbedtls/md.h>
#include <stdio.h>
#include <string.h>
#include <sys/random.h>

#include "base/err.h"

int proto_auth_nonce(uint8_t out[PROTO_AUTH_BYTES])
{
    size_t got = 0;
    while (got < PROTO_AUTH_BYTES) {
        ssize_t n = getrandom(out + got, PROTO_AUTH_BYTES - got, 0);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return rd_fail(RD_EIO, "auth: getrandom failed (%s)", strerror(errno));
        got += (size_t)n;
    }
    return 0;
}

/* HMAC-SHA256(key, label || parts...) with mbedTLS: every derivation of §14 and §10.12. */
static int hmac_parts(const uint8_t *key, size_t key_len, const char *label, const uint8_t *const *parts,
                      const size_t *lens, int n_parts, uint8_t out[PROTO_AUTH_BYTES])
{
    const mbedtls_md_info_t *md = mbedtls_md_info_from_type(MBEDTLS_MD_SHA256);
    mbedtls_md_context_t ctx;
    mbedtls_md_init(&ctx);
    int rc = md ? mbedtls_md_setup(&ctx, md, 1) : -1;
    if (!rc)
        rc = mbedtls_md_hmac_starts(&ctx, key, key_len);
    if (!rc)
        rc = mbedtls_md_hmac_update(&ctx, (const unsigned char *)label, strlen(label));
    for (int i = 0; i < n_parts && !rc; i++)
        rc = mbedtls_md_hmac_update(&ctx, parts[i], lens[i]);
    if (!rc)
        rc = mbedtls_md_hmac_finish(&ctx, out);
    mbedtls_md_free(&ctx);
    return rc ? rd_fail(RD_EINVAL, "auth: HMAC-SHA256 failed (mbedTLS -0x%04x)", (unsigned)-rc) : 0;
}

int proto_auth_proof(const uint8_t *secret, size_t secret_len, int daemon_side,
                     const uint8_t client_nonce[PROTO_AUTH_BYTES], const uint8_t daemon_nonce[PROTO_AUTH_BYTES],
                     uint8_t out[PROTO_AUTH_BYTES])
{
    const uint8_t *parts[2] = {daemon_side ? client_nonce : daemon_nonce, daemon_side ? daemon_nonce : client_nonce};
    const size_t lens[2] = {PROTO_AUTH_BYTES, PROTO_AUTH_BYTES};
    return hmac_parts((const uint8_t *)secret, secret_len, daemon_side ? "rolloutd auth v1 daemon"
                                                                       : "rolloutd auth v1 client",
                      parts, lens, 2, out);
}

static void le64(uint8_t out[8], uint64_t v)
{
    for (int i = 0; i < 8; i++)
        out[i] = (uint8_t)(v >> (8 * i));
}

int proto_auth_lane_key(const uint8_t *secret, size_t secret_len, uint64_t xfer_id, uint8_t out[PROTO_AUTH_BYTES])
{
    uint8_t x[8];
    le64(x, xfer_id);
    const uint8_t *parts[1] = {x};
    const size_t lens[1] = {8};
    return hmac_parts(secret, secret_len, "rolloutd lane key v1", parts, lens, 1, out);
}

int proto_auth_lane_proof(const uint8_t key[PROTO_AUTH_BYTES], const uint8_t nonce[PROTO_AUTH_BYTES],
                          uint64_t xfer_id, uint8_t out[PROTO_AUTH_BYTES])
{
    uint8_t x[8];
    le64(x, xfer_id);
    const uint8_t *parts[2] = {nonce, x};
    const size_t lens[2] = {PROTO_AUTH_BYTES, 8};
    return hmac_parts(key, PROTO_AUTH_BYTES, "rolloutd lane v1", parts, lens, 2, out);
}

int proto_auth_wrap_pad(const uint8_t *secret, size_t secret_len, uint64_t xfer_id, uint64_t next_xfer_id,
                        uint8_t out[PROTO_AUTH_BYTES])
{
    uint8_t x[8], y[8];
    le64(x, xfer_id);
    le64(y, next_xfer_id);
    const uint8_t *parts[2] = {x, y};
    const size_t lens[2] = {8, 8};
    return hmac_parts(secret, secret_len, "rolloutd key wrap v1", parts, lens, 2, out);
}

int proto_auth_equal(const uint8_t a[PROTO_AUTH_BYTES], const uint8_t b[PROTO_AUTH_BYTES])
{
    volatile uint8_t diff = 0;
    for (int i = 0; i < PROTO_AUTH_BYTES; i++)
        diff |= a[i] ^ b[i];
    return diff == 0;
}

int proto_auth_read_secret(const char *path, char *secret, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return rd_fail(RD_EIO, "auth_token_file %s: cannot open (%s)", path, strerror(errno));
    char buf[PROTO_AUTH_MAX_SECRET + 2];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    int more = fgetc(f) != EOF;
    fclose(f);
    buf[n] = 0;
    size_t a = 0, b = n;
    while (a < b && (buf[a] == ' ' || buf[a] == '\t' || buf[a] == '\r' || buf[a] == '\n'))
        a++;
    while (b > a && (buf[b - 1] == ' ' || buf[b - 1] == '\t' || buf[b - 1] == '\r' || buf[b - 1] == '\n'))
        b--;
    if (more || b - a > PROTO_AUTH_MAX_SECRET)
        return rd_fail(RD_EINVAL, "auth_token_file %s: longer than %d bytes", path, PROTO_AUTH_MAX_SECRET);
    if (b - a < 16)
        return rd_fail(RD_EINVAL, "auth_token_file %s: the secret is %zu bytes; expected at least 16", path, b - a);
    for (size_t i = a; i < b; i++)
        if ((unsigned char)buf[i] <= ' ' || buf[i] == 0x7f)
            return rd_fail(RD_EINVAL, "auth_token_file %s: a space or control character at byte %zu; expected one "
                           "line without them", path, i);
    memcpy(secret, buf + a, b - a);
    secret[b - a] = 0;
    *len = b - a;
    return 0;
}
