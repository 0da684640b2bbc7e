/* util.h — libattnstat's smallest shared pieces (internal to the library): the one error formatter
 * of the client layer, a monotonic clock in milliseconds and a bounded string copy. util.c also
 * defines the public functions that need no client: attnstat_strerror, dtype sizes, rule and state
 * names, the *_init functions and the default socket path.
 *
 * Stage: the bottom of libattnstat. Includes attnstat.h and libc only; calls nothing of ours, so
 * every other file of the library may call it. */
#ifndef ATTNSTAT_UTIL_H
#define ATTNSTAT_UTIL_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include "attnstat.h"

/* Writes the message (printf format) into buf[0..len) and returns code, so that a failing path
 * reads `return util_fail(buf, len, ATTNSTAT_EINVAL, "...", ...)`. The only place the client
 * layer formats an error; the forms below and client_fail (client_internal.h) go through it. */
attnstat_code util_fail(char *buf, size_t len, attnstat_code code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
attnstat_code util_vfail(char *buf, size_t len, attnstat_code code, const char *fmt, va_list ap)
    __attribute__((format(printf, 4, 0)));

/* The same for calls that have no client yet: fills err (code and message) when err is not NULL. */
attnstat_code util_fail_error(attnstat_error *err, attnstat_code code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Clears err (when not NULL): the call succeeded. */
void util_clear_error(attnstat_error *err);

/* CLOCK_MONOTONIC in milliseconds. */
int64_t util_now_ms(void);

/* Copies src (NULL: "") into dst[0..len), cut to fit and NUL-terminated. */
void util_copy_str(char *dst, size_t len, const char *src);

#endif /* ATTNSTAT_UTIL_H */
