/* util.c — libattnstat's shared small pieces (see util.h): the error formatter, the clock, and the
 * public functions that need no client (codes, dtype sizes, rule and state names, the defaults of
 * the option structs, the default socket path).
 *
 * Stage: the bottom of libattnstat. Calls libc and proto/names only. */
#include "util.h"

#include "wire_vocab.h"
#include "names.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ---- Errors ----------------------------------------------------------------------------------- */
attnstat_code util_vfail(char *buf, size_t len, attnstat_code code, const char *fmt, va_list ap)
{
    if (buf && len > 0)
        vsnprintf(buf, len, fmt, ap);
    return code;
}

attnstat_code util_fail(char *buf, size_t len, attnstat_code code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    util_vfail(buf, len, code, fmt, ap);
    va_end(ap);
    return code;
}

attnstat_code util_fail_error(attnstat_error *err, attnstat_code code, const char *fmt, ...)
{
    if (err) {
        err->code = code;
        va_list ap;
        va_start(ap, fmt);
        util_vfail(err->msg, sizeof err->msg, code, fmt, ap);
        va_end(ap);
    }
    return code;
}

void util_clear_error(attnstat_error *err)
{
    if (err) {
        err->code = 0;
        err->msg[0] = '\0';
    }
}

int64_t util_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

void util_copy_str(char *dst, size_t len, const char *src)
{
    snprintf(dst, len, "%s", src ? src : "");
}

/* ---- Codes and names -------------------------------------------------------------------------- */
const char *attnstat_strerror(attnstat_code code)
{
    switch (code) {
    case ATTNSTAT_OK: return "OK";
    case ATTNSTAT_DROPPED: return "DROPPED: the ring or the outgoing queue was full; the push was counted and skipped";
    case ATTNSTAT_EINVAL: return "EINVAL: invalid argument";
    case ATTNSTAT_ENOMEM: return "ENOMEM: out of memory";
    case ATTNSTAT_ECONNECT: return "ECONNECT: cannot connect to attnstatd";
    case ATTNSTAT_ECLOSED: return "ECLOSED: the connection to attnstatd is closed";
    case ATTNSTAT_EIO: return "EIO: a system call failed";
    case ATTNSTAT_EPROTO: return "EPROTO: unexpected or malformed message from attnstatd";
    case ATTNSTAT_EREFUSED: return "EREFUSED: attnstatd refused the request";
    case ATTNSTAT_ETIMEDOUT: return "ETIMEDOUT: attnstatd did not answer in time";
    case ATTNSTAT_ESTATE: return "ESTATE: call out of order";
    case ATTNSTAT_ENOTSUP: return "ENOTSUP: not supported by this build";
    case ATTNSTAT_ELOST: return "ELOST: pushes were abandoned when the connection to attnstatd was lost; they will never be acknowledged";
    }
    return "unknown attnstat code";
}

size_t attnstat_dtype_size(attnstat_dtype dtype)
{
    switch (dtype) {
    case ATTNSTAT_F32: return 4;
    case ATTNSTAT_F16: return 2;
    case ATTNSTAT_BF16: return 2;
    case ATTNSTAT_BOOL: return 1;
    case ATTNSTAT_I32: return 4;
    }
    return 0;
}

const char *attnstat_proto_code_name(int32_t code)
{
    return names_code(code);
}

const char *attnstat_rule_name(int32_t rule)
{
    return names_alert_rule(rule); /* proto/names.h's list: "unknown" for a value not in it */
}

const char *attnstat_state_name(int32_t state)
{
    switch (state) {
    case ATTNSTAT_ALERT_RAISED: return "raised";
    case ATTNSTAT_ALERT_CLEARED: return "cleared";
    case ATTNSTAT_ALERT_RESOLVED: return "resolved";
    }
    return "unknown";
}

/* ---- Defaults of the option structs ----------------------------------------------------------- */
void attnstat_tensor_init(attnstat_tensor *t, const void *data, attnstat_dtype dtype, int64_t b,
                          int64_t h, int64_t n, int64_t d)
{
    memset(t, 0, sizeof *t);
    t->data = data;
    t->dtype = dtype;
    t->mem = ATTNSTAT_MEM_HOST;
    t->shape[0] = b;
    t->shape[1] = h;
    t->shape[2] = n;
    t->shape[3] = d;
    t->strides[3] = 1;
    t->strides[2] = d;
    t->strides[1] = n * d;
    t->strides[0] = h * n * d;
}

void attnstat_push_opts_init(attnstat_push_opts *o)
{
    memset(o, 0, sizeof *o);
    o->window_left = -1;
    o->window_right = -1;
}

void attnstat_connect_opts_init(attnstat_connect_opts *o)
{
    memset(o, 0, sizeof *o);
}

void attnstat_thresholds_init(attnstat_thresholds *t)
{
    /* Unset: NaN for a double, 0 for a count (vocab.h's rows the hello carries). */
#define UTIL_TH_UNSET_VOCAB_D NAN
#define UTIL_TH_UNSET_VOCAB_U 0
#define X(name, type, ...) WIRE_VOCAB_UNLESS(DAEMON_ONLY, name)(t->name = UTIL_TH_UNSET_##type;)
    VOCAB_THRESHOLDS(X)
#undef X
#undef UTIL_TH_UNSET_VOCAB_D
#undef UTIL_TH_UNSET_VOCAB_U
    t->collapse_threshold = NAN; /* the kernels' parameter, not an alert threshold */
}

char *attnstat_default_socket(char *buf, size_t len)
{
    const char *env = getenv("ATTNSTAT_SOCKET");
    const char *xdg = getenv("XDG_RUNTIME_DIR");
    int n;
    if (env && *env)
        n = snprintf(buf, len, "%s", env);
    else if (xdg && *xdg)
        n = snprintf(buf, len, "%s/attnstat/attnstatd.sock", xdg);
    else
        n = snprintf(buf, len, "/run/attnstat/attnstatd.sock");
    return n >= 0 && (size_t)n < len ? buf : NULL;
}
