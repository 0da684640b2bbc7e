/* counters.c — the counters of counters.h and the push-rate ring (one-second buckets). Stage: none
 * (a leaf). */
#include "counters.h"

#include <stdio.h>
#include <stdlib.h>

#include "util.h"

struct counters {
    uint64_t v[CNT_N];
    uint64_t start_ns;       /* daemon start, monotonic */
    uint64_t rate_bucket[COUNTERS_RATE_WINDOW];
    uint64_t rate_second[COUNTERS_RATE_WINDOW];
    uint64_t answered[COUNTERS_CODES];
    char answer_msg[COUNTERS_CODES][COUNTERS_MESSAGE_MAX];
    char store_msg[256];
};

counters *counters_new(void)
{
    counters *c = calloc(1, sizeof *c);
    if (c)
        c->start_ns = util_mono_ns();
    return c;
}

void counters_free(counters *c)
{
    free(c);
}

void counters_add(counters *c, counter_id id, uint64_t n)
{
    if ((unsigned)id < CNT_N)
        c->v[id] += n;
}

void counters_inc(counters *c, counter_id id)
{
    counters_add(c, id, 1);
}

uint64_t counters_get(const counters *c, counter_id id)
{
    return (unsigned)id < CNT_N ? c->v[id] : 0;
}

const char *counters_name(counter_id id)
{
    switch (id) {
#define NAME(i, name, help)                                                                        \
    case CNT_##i:                                                                                  \
        return name;
        COUNTERS(NAME)
#undef NAME
    case CNT_N:
        break;
    }
    return NULL;
}

const char *counters_help(counter_id id)
{
    switch (id) {
#define HELP(i, name, help)                                                                        \
    case CNT_##i:                                                                                  \
        return help;
        COUNTERS(HELP)
#undef HELP
    case CNT_N:
        break;
    }
    return NULL;
}

void counters_count_push(counters *c)
{
    c->v[CNT_PUSHES]++;
    uint64_t sec = util_mono_ns() / 1000000000ull;
    int i = (int)(sec % COUNTERS_RATE_WINDOW);
    if (c->rate_second[i] != sec) {
        c->rate_second[i] = sec;
        c->rate_bucket[i] = 0;
    }
    c->rate_bucket[i]++;
}

double counters_push_rate(const counters *c)
{
    uint64_t sec = util_mono_ns() / 1000000000ull, n = 0;
    for (int i = 0; i < COUNTERS_RATE_WINDOW; i++)
        if (c->rate_second[i] + COUNTERS_RATE_WINDOW > sec)
            n += c->rate_bucket[i];
    return (double)n / COUNTERS_RATE_WINDOW;
}

double counters_uptime_s(const counters *c)
{
    return (double)(util_mono_ns() - c->start_ns) / 1e9;
}

void counters_answer(counters *c, int code, const char *msg)
{
    if (code <= 0 || code >= COUNTERS_CODES)
        return;
    c->answered[code]++;
    snprintf(c->answer_msg[code], sizeof c->answer_msg[code], "%s", msg ? msg : "");
}

uint64_t counters_answered(const counters *c, int code)
{
    return code > 0 && code < COUNTERS_CODES ? c->answered[code] : 0;
}

const char *counters_answer_message(const counters *c, int code)
{
    return code > 0 && code < COUNTERS_CODES ? c->answer_msg[code] : "";
}

void counters_store_error(counters *c, const char *msg)
{
    c->v[CNT_STORE_ERRORS]++;
    snprintf(c->store_msg, sizeof c->store_msg, "%s", msg ? msg : "");
}

const char *counters_last_store_error(const counters *c)
{
    return c->store_msg;
}
