/* log.c — formats and writes log lines (see log.h): RFC 3339 UTC times, escaped messages, journald
 * priorities, and the bound on repeated lines. One fprintf per line on an unbuffered stderr keeps
 * lines from different threads whole. Stage: none (a leaf); calls util (the clock) and proto/utf8.c. */
#include "log.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "utf8.h"
#include "util.h"

log_level log_threshold = LOG_INFO;

static const char *const level_names[] = {"debug", "info", "warn", "error"};
static const char *const journal_prio[] = {"<7>", "<6>", "<4>", "<3>"};
static int journal;          /* stderr is journald's: priority prefixes */

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

const char *log_level_name(log_level lvl)
{
    return lvl >= LOG_DEBUG && lvl <= LOG_ERROR ? level_names[lvl] : "?";
}

void log_set_level(log_level lvl)
{
    __atomic_store_n(&log_threshold, lvl, __ATOMIC_RELAXED);
}

int log_detect_journal(void)
{
    const char *js = getenv("JOURNAL_STREAM");
    unsigned long long dev, ino;
    struct stat sb;
    journal = js && sscanf(js, "%llu:%llu", &dev, &ino) == 2 && fstat(2, &sb) == 0 &&
              (unsigned long long)sb.st_dev == dev && (unsigned long long)sb.st_ino == ino;
    return journal;
}

void log_escape(char *out, size_t len, const char *s)
{
    utf8_escape(out, len, s);
}

/* ---- repeats -------------------------------------------------------------------------------- */

#define LOG_SITES 128

typedef struct {
    const char *fmt;         /* the call site; NULL: a free slot */
    const char *module;
    log_level lvl;
    uint64_t window_ns;      /* when the site's window began */
    uint32_t written;        /* lines written in the window */
    uint64_t held;           /* lines held back in the window */
    char last[512];          /* the last one held back */
} log_site;

static pthread_mutex_t sites_mu = PTHREAD_MUTEX_INITIALIZER;
static log_site sites[LOG_SITES];

static void now_rfc3339(char *when, size_t len)
{
    struct timespec ts = {0, 0};
    struct tm tm;
    char sec[32] = "?";
    if (clock_gettime(CLOCK_REALTIME, &ts) == 0 && gmtime_r(&ts.tv_sec, &tm))
        strftime(sec, sizeof sec, "%Y-%m-%dT%H:%M:%S", &tm);
    snprintf(when, len, "%s.%03ldZ", sec, ts.tv_nsec / 1000000);
}

static void emit(log_level lvl, const char *module, const char *msg, const char *tail)
{
    char when[48];
    now_rfc3339(when, sizeof when);
    int lv = lvl >= LOG_DEBUG && lvl <= LOG_ERROR ? (int)lvl : LOG_ERROR;
    fprintf(stderr, "%s%s %-5s [%s] %s%s\n", journal ? journal_prio[lv] : "", when,
            level_names[lv], module, msg, tail);
}

/* The held-back summary of s (its window is over, or the site writes again), under sites_mu. */
static void emit_held(log_site *s, uint64_t now)
{
    if (s->held == 0)
        return;
    char tail[128];
    snprintf(tail, sizeof tail, " [repeated %llu more times in %llu s (not logged)]",
             (unsigned long long)s->held,
             (unsigned long long)((now - s->window_ns) / 1000000000ull));
    emit(s->lvl, s->module, s->last, tail);
    s->held = 0;
}

/* 1 when the line of call site fmt is to be written; else it was counted (its text kept). */
static int admit(log_level lvl, const char *module, const char *fmt, const char *msg)
{
    const uint64_t window = (uint64_t)LOG_WINDOW_S * 1000000000ull;
    uint64_t now = util_mono_ns();
    size_t h = (size_t)(((uintptr_t)fmt >> 3) * 0x9E3779B97F4A7C15ull % LOG_SITES);
    pthread_mutex_lock(&sites_mu);
    log_site *s = NULL;
    for (size_t k = 0; k < LOG_SITES; k++) {
        log_site *c = &sites[(h + k) % LOG_SITES];
        if (c->fmt == fmt || c->fmt == NULL) {
            s = c;
            break;
        }
    }
    int ok = 1;
    if (!s) {
        /* The table is full: every site past it is written (the table holds many more sites than
         * a daemon has lines that repeat). */
    } else {
        if (!s->fmt) {
            s->fmt = fmt;
            s->module = module;
            s->lvl = lvl;
            s->window_ns = now;
        }
        if (now - s->window_ns >= window) {
            emit_held(s, now);
            s->window_ns = now;
            s->written = 0;
        }
        if (s->written < LOG_BURST) {
            s->written++;
        } else {
            s->held++;
            s->lvl = lvl;
            snprintf(s->last, sizeof s->last, "%.*s", (int)sizeof s->last - 1, msg);
            ok = 0;
        }
    }
    pthread_mutex_unlock(&sites_mu);
    return ok;
}

void log_flush(void)
{
    const uint64_t window = (uint64_t)LOG_WINDOW_S * 1000000000ull;
    uint64_t now = util_mono_ns();
    pthread_mutex_lock(&sites_mu);
    for (size_t k = 0; k < LOG_SITES; k++) {
        log_site *s = &sites[k];
        if (s->fmt && s->held && now - s->window_ns >= window) {
            emit_held(s, now);
            s->window_ns = now;
            s->written = 0;
        }
    }
    pthread_mutex_unlock(&sites_mu);
}

void log_write(log_level lvl, const char *module, const char *fmt, ...)
{
    char raw[1024], msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(raw, sizeof raw, fmt, ap);
    va_end(ap);
    log_escape(msg, sizeof msg, raw);
    if (lvl > LOG_DEBUG && !admit(lvl, module, fmt, msg))
        return;
    emit(lvl, module, msg, "");
}
