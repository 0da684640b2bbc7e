/* log.c — formats and writes log lines (see log.h). One fprintf per line on an unbuffered
 * stderr keeps lines from different threads whole. Stage: none (a leaf). */
#include "log.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

log_level log_threshold = LOG_INFO;

static const char *const level_names[] = {"debug", "info", "warn", "error"};

int log_parse_level(const char *s, log_level *out)
{
    for (int i = 0; i < 4; i++) {
        if (strcmp(s, level_names[i]) == 0) {
            *out = (log_level)i;
            return 0;
        }
    }
    return -1;
}

void log_set_level(log_level lvl)
{
    log_threshold = lvl;
}

void log_write(log_level lvl, const char *module, const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);

    struct timespec ts = {0, 0};
    struct tm tm;
    char when[32] = "?";
    if (clock_gettime(CLOCK_REALTIME, &ts) == 0 && localtime_r(&ts.tv_sec, &tm))
        strftime(when, sizeof when, "%Y-%m-%d %H:%M:%S", &tm);
    int lv = lvl >= LOG_DEBUG && lvl <= LOG_ERROR ? (int)lvl : LOG_ERROR;
    fprintf(stderr, "%s.%03ld %-5s [%s] %s\n", when, ts.tv_nsec / 1000000, level_names[lv], module,
            msg);
}
