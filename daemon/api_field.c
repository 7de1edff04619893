/* api_field.c - a field's reader, below every request reader (api_read.c,
 * api_read_rl.c, api_sampling.c): the refusal naming the field (api_bad),
 * numbers, integers in a range, booleans. No server, no engine, no other file
 * of the API: the readers call these and each other, and with these in
 * api_read.c, api_read.c and api_sampling.c called each other in a circle
 * (tools/check_layers.py, rule calls). tests/fuzz/fuzz_http_json.c links it
 * with the readers. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "daemon/api_int.h"
#include "base/utf8.h"

/* ---- errors ---- */

void api_bad(api_err *e, int status, const char *fmt, ...)
{
    if (e->status)
        return; /* the first problem is the one reported */
    e->status = status;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->detail, sizeof e->detail, fmt, ap);
    va_end(ap);
    /* The detail goes out in a JSON answer, which must be UTF-8, and it may
     * quote the body's bytes (a field's value, %.40s of one, cut at the end):
     * each byte that starts no valid sequence becomes '?' (found by
     * tests/fuzz/fuzz_http_json.c). */
    size_t n = strlen(e->detail);
    for (size_t i = 0; i < n;) {
        size_t k = utf8_seq((const uint8_t *)e->detail + i, n - i);
        if (k == 0)
            e->detail[i++] = '?';
        else
            i += k;
    }
}

/* ---- field readers: absent fields keep their default ---- */

/* A number field: 0 absent, 1 read, -1 wrong type (reported). */
int api_num(cJSON *o, const char *name, double *out, api_err *e)
{
    cJSON *v = cJSON_GetObjectItemCaseSensitive(o, name);
    if (!v || cJSON_IsNull(v))
        return 0;
    if (!cJSON_IsNumber(v)) {
        api_bad(e, 400, "field \"%s\": expected a number", name);
        return -1;
    }
    *out = v->valuedouble;
    return 1;
}

int api_int(cJSON *o, const char *name, int64_t lo, int64_t hi, int64_t *out, api_err *e)
{
    double x;
    int rc = api_num(o, name, &x, e);
    if (rc <= 0)
        return rc;
    /* Compared as integers: a bound such as INT64_MAX / 2 is not a double,
     * and (double)hi rounds up to one past it (found by fuzz_http_json). */
    if (x != floor(x) || !(x >= -9223372036854775808.0 && x < 9223372036854775808.0) || (int64_t)x < lo ||
        (int64_t)x > hi) {
        api_bad(e, 400, "field \"%s\" = %g: expected an integer in %lld..%lld", name, x, (long long)lo,
                (long long)hi);
        return -1;
    }
    *out = (int64_t)x;
    return 1;
}

int api_bool(cJSON *o, const char *name, int *out, api_err *e)
{
    cJSON *v = cJSON_GetObjectItemCaseSensitive(o, name);
    if (!v || cJSON_IsNull(v))
        return 0;
    if (!cJSON_IsBool(v)) {
        api_bad(e, 400, "field \"%s\": expected true or false", name);
        return -1;
    }
    *out = cJSON_IsTrue(v);
    return 1;
}
