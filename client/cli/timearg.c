/* timearg.c — times on the attnstat CLI's command line and the steps they select (see timearg.h).
 *
 * Stage: a leaf of the CLI's commands. Calls libc, the store's read half (store_time_steps,
 * store_get_run) and out.c. */
#include "timearg.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "out.h"
#include "store_read.h"

/* n decimal digits at *p. */
static int timearg_digits(const char **p, int n, int *out)
{
    int v = 0;
    for (int i = 0; i < n; i++, (*p)++) {
        if (**p < '0' || **p > '9')
            return -1;
        v = v * 10 + (**p - '0');
    }
    *out = v;
    return 0;
}

/* Days since 1970-01-01 of a date of the proleptic Gregorian calendar. */
static int64_t timearg_days(int64_t y, int m, int d)
{
    y -= m <= 2;
    int64_t era = (y >= 0 ? y : y - 399) / 400;
    int64_t yoe = y - era * 400;
    int64_t doy = (153 * (m + (m > 2 ? -3 : 9)) + 2) / 5 + d - 1;
    return era * 146097 + yoe * 365 + yoe / 4 - yoe / 100 + doy - 719468;
}

/* '90s', '10m', '2h', '3d' (after an optional '-'): now_ms minus that. 1 when s is one, 0 when s
 * is not of that form, -1 when it is but out of range. */
static int timearg_ago(const char *s, int64_t now_ms, int64_t *out)
{
    static const struct {
        char unit;
        int64_t ms;
    } ago[] = {{'s', 1000}, {'m', 60000}, {'h', 3600000}, {'d', 86400000}};
    if (*s == '-')
        s++;
    size_t len = strlen(s);
    if (len < 2 || s[0] < '0' || s[0] > '9' || strspn(s, "0123456789") != len - 1)
        return 0;
    for (size_t i = 0; i < sizeof ago / sizeof ago[0]; i++) {
        if (s[len - 1] != ago[i].unit)
            continue;
        errno = 0;
        long long n = strtoll(s, NULL, 10);
        if (errno || n > INT64_MAX / ago[i].ms / 2)
            return -1;
        *out = now_ms - n * ago[i].ms;
        return 1;
    }
    return -1;
}

int timearg_parse(const char *s, int64_t now_ms, int64_t *out)
{
    if (!strcmp(s, "now")) {
        *out = now_ms;
        return 0;
    }
    int ago = timearg_ago(s, now_ms, out);
    if (ago)
        return ago > 0 ? 0 : -1;
    const char *p = s;
    int y, mo, d, h = 0, mi = 0, sec = 0, ms = 0, off = 0;
    if (timearg_digits(&p, 4, &y) || *p++ != '-' || timearg_digits(&p, 2, &mo) || *p++ != '-' ||
        timearg_digits(&p, 2, &d))
        return -1;
    static const int mdays[12] = {31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
    int leap = (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
    if (mo < 1 || mo > 12 || d < 1 || d > mdays[mo - 1] || (mo == 2 && d == 29 && !leap))
        return -1;
    if (*p == 'T' || *p == 't' || *p == ' ') {
        p++;
        if (timearg_digits(&p, 2, &h) || *p++ != ':' || timearg_digits(&p, 2, &mi) || h > 23 ||
            mi > 59)
            return -1;
        if (*p == ':') {
            p++;
            if (timearg_digits(&p, 2, &sec) || sec > 60)
                return -1;
            if (*p == '.') {
                p++;
                int digits = 0;
                for (; *p >= '0' && *p <= '9'; p++, digits++)
                    if (digits < 3)
                        ms = ms * 10 + (*p - '0');
                if (!digits)
                    return -1;
                for (; digits < 3; digits++)
                    ms *= 10;
            }
        }
        if (*p == 'Z' || *p == 'z') {
            p++;
        } else if (*p == '+' || *p == '-') {
            int sign = *p++ == '-' ? -1 : 1, oh, om;
            if (timearg_digits(&p, 2, &oh) || *p++ != ':' || timearg_digits(&p, 2, &om) ||
                oh > 23 || om > 59)
                return -1;
            off = sign * (oh * 60 + om);
        }
    }
    if (*p)
        return -1;
    /* a leap second (:60) reads as the second before it */
    int64_t t = timearg_days(y, mo, d) * 86400 + h * 3600 + mi * 60 + (sec > 59 ? 59 : sec);
    *out = (t - (int64_t)off * 60) * 1000 + ms;
    return 0;
}

/* store_get_run() callback: the times of the run's first Hello and newest sample. */
static int timearg_run_times(void *ctx, const store_run *r)
{
    int64_t *t = ctx;
    t[0] = r->started_ms;
    t[1] = r->last_time_ms;
    return 0;
}

int timearg_steps(store *st, int64_t run_id, const char *run, const cli_args *a, int64_t *from,
                  int64_t *to)
{
    *from = a->from;
    *to = a->to;
    if (a->since_set && a->until_set && a->since_ms > a->until_ms) {
        char s[32], u[32];
        out_time(s, sizeof s, a->since_ms);
        out_time(u, sizeof u, a->until_ms);
        fprintf(stderr, "attnstat: --since %s is after --until %s\n", s, u);
        return CLI_EXIT_USAGE;
    }
    if (!a->since_set && !a->until_set)
        return CLI_EXIT_OK;
    int64_t f = INT64_MIN, t = INT64_MAX;
    store_error err;
    store_status s = store_time_steps(st, run_id, a->since_set ? a->since_ms : INT64_MIN,
                                      a->until_set ? a->until_ms : INT64_MAX, &f, &t, &err);
    if (s == STORE_NOTFOUND) {
        char since[32] = "its start", until[32] = "now", first[32], last[32];
        int64_t times[2] = {0, 0};
        if (a->since_set)
            out_time(since, sizeof since, a->since_ms);
        if (a->until_set)
            out_time(until, sizeof until, a->until_ms);
        store_get_run(st, run_id, timearg_run_times, times, &err);
        out_time(first, sizeof first, times[0]);
        out_time(last, sizeof last, times[1]);
        if (times[1])
            fprintf(stderr, "attnstat: run '%s' stored no sample from %s to %s (it started %s; "
                    "its newest sample was stored %s)\n", run, since, until, first, last);
        else
            fprintf(stderr, "attnstat: run '%s' has no samples yet\n", run);
        return CLI_EXIT_FAIL;
    }
    if (s != STORE_OK) {
        fprintf(stderr, "attnstat: cannot place run '%s' in time: %s\n", run, out_safe(err.msg));
        return CLI_EXIT_FAIL;
    }
    *from = f > *from ? f : *from;
    *to = t < *to ? t : *to;
    if (*from > *to) {
        fprintf(stderr, "attnstat: none of the steps run '%s' stored in that time is within "
                "--from/--to\n", run);
        return CLI_EXIT_FAIL;
    }
    return CLI_EXIT_OK;
}
