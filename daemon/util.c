/* util.c — the helpers of util.h. Stage: none (a leaf); calls proto/utf8.c. */
#include "util.h"

#include "utf8.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

int util_err(char *err, size_t errlen, const char *fmt, ...)
{
    if (err && errlen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, errlen, fmt, ap);
        va_end(ap);
    }
    return -1;
}

uint64_t util_mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

uint64_t util_wall_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000ull + (uint64_t)ts.tv_nsec / 1000000ull;
}

int util_printable(const char *s, size_t max, char *why, size_t whylen)
{
    size_t n = strlen(s);
    if (n == 0 || n > max) {
        if (why && whylen)
            snprintf(why, whylen, n ? "it is %zu bytes" : "it is empty", n);
        return 0;
    }
    const unsigned char *p = (const unsigned char *)s;
    for (size_t i = 0; i < n;) {
        uint32_t cp = 0;
        int l = utf8_next(p + i, n - i, &cp);
        if (l == 0 || utf8_is_hidden(cp)) {
            if (!why || !whylen)
                return 0;
            if (l == 0)
                snprintf(why, whylen, "byte %zu (0x%02x) is not UTF-8", i, p[i]);
            else
                snprintf(why, whylen, "U+%04X at byte %zu is a %s character", (unsigned)cp, i,
                         utf8_is_control(cp) ? "control" : "format (invisible, it reorders or "
                         "splits text)");
            return 0;
        }
        i += (size_t)l;
    }
    return 1;
}

static int make_dir(const char *dir, char *err, size_t errlen)
{
    if (mkdir(dir, 0755) != 0 && errno != EEXIST)
        return util_err(err, errlen, "cannot create directory %.400s: %s", dir, strerror(errno));
    return 0;
}

int util_mkdir_parents(const char *path, char *err, size_t errlen)
{
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    if (!slash || slash == dir)
        return 0;
    *slash = '\0';
    for (char *p = dir + 1; *p; p++) {
        if (*p != '/')
            continue;
        *p = '\0';
        if (make_dir(dir, err, errlen) != 0)
            return -1;
        *p = '/';
    }
    return make_dir(dir, err, errlen);
}
