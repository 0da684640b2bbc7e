/* log.h — attnstatd's logging: one line per event on stderr, "time level [module] message".
 * Stage: none (a leaf every stage and thread may log through); includes libc only (log.c calls
 * util.c's clock and proto/utf8.c).
 * LOG_*() are level-gated macros: a disabled level costs one comparison and evaluates none of its
 * arguments, and the format string is checked by the compiler like printf's.
 *
 * What a line promises:
 * - The time is RFC 3339 in UTC with milliseconds ("2026-11-22T04:46:39.123Z").
 * - A line is one line: the message's control characters (a newline, an escape sequence in a name
 *   a peer chose), DEL, C1 controls and bytes that are not UTF-8 are written as \xNN, so nothing
 *   a peer sends can forge a line or reach an operator's terminal as a command.
 * - Under systemd (JOURNAL_STREAM names stderr) every line starts with its syslog priority
 *   ("<3>" error, "<4>" warn, "<6>" info, "<7>" debug), which journald takes as the priority.
 * - Repeats are bounded: each call site (its format string) writes at most LOG_BURST lines of info
 *   level or above per LOG_WINDOW_S seconds; the rest are counted, and the site's next line (or
 *   log_flush(), which the loop calls once a second) says "... repeated N more times in S s (not
 *   logged)", with the last of them. Debug lines are not limited.
 *
 * The threshold is the one piece of process-wide state in the daemon (set at start-up and by a
 * SIGHUP reload, read from every thread, atomically): passing a logger through every call would
 * buy nothing. The repeat table is behind a mutex. */
#ifndef ATTNSTAT_LOG_H
#define ATTNSTAT_LOG_H

#include <stddef.h>

typedef enum {
    LOG_DEBUG = 0,
    LOG_INFO = 1,
    LOG_WARN = 2,
    LOG_ERROR = 3,
} log_level;

#define LOG_BURST 50     /* lines one call site writes per window before it is held back */
#define LOG_WINDOW_S 10  /* seconds */

extern log_level log_threshold;

/* Parses "debug", "info", "warn" or "error". Returns 0, or -1 when s names no level. */
int log_parse_level(const char *s, log_level *out);
const char *log_level_name(log_level lvl);
void log_set_level(log_level lvl);
/* Decides once whether stderr is journald's stream (JOURNAL_STREAM's device:inode is stderr's):
 * then lines carry syslog priority prefixes. Called at start-up; returns 1 when they do. */
int log_detect_journal(void);

void log_write(log_level lvl, const char *module, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Writes the "repeated N more times" line of every call site whose window is over with lines held
 * back. Any thread; the loop calls it once a second. */
void log_flush(void);
/* s with control characters, DEL, C1 controls and invalid UTF-8 written as \xNN, cut to fit
 * out[len] (always terminated). For text that goes elsewhere than a log line (an Error). */
void log_escape(char *out, size_t len, const char *s);

#define LOG_AT(lvl, module, ...)                                                                   \
    do {                                                                                           \
        if ((lvl) >= __atomic_load_n(&log_threshold, __ATOMIC_RELAXED))                            \
            log_write((lvl), (module), __VA_ARGS__);                                               \
    } while (0)

#define LOG_DEBUG(module, ...) LOG_AT(LOG_DEBUG, module, __VA_ARGS__)
#define LOG_INFO(module, ...) LOG_AT(LOG_INFO, module, __VA_ARGS__)
#define LOG_WARN(module, ...) LOG_AT(LOG_WARN, module, __VA_ARGS__)
#define LOG_ERROR(module, ...) LOG_AT(LOG_ERROR, module, __VA_ARGS__)

#endif /* ATTNSTAT_LOG_H */
