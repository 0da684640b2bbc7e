/* log.h — attnstatd's logging: one line per event on stderr, "time level [module] message".
 * Stage: none (a leaf every stage and thread may log through); includes nothing of ours.
 * LOG_*() are level-gated macros: a disabled level costs one comparison and evaluates none of its
 * arguments, and the format string is checked by the compiler like printf's.
 *
 * The threshold is the one piece of process-wide state in the daemon (set once at start-up from
 * the config, read from every thread): passing a logger through every call would buy nothing. */
#ifndef ATTNSTAT_LOG_H
#define ATTNSTAT_LOG_H

typedef enum {
    LOG_DEBUG = 0,
    LOG_INFO = 1,
    LOG_WARN = 2,
    LOG_ERROR = 3,
} log_level;

extern log_level log_threshold;

/* Parses "debug", "info", "warn" or "error". Returns 0, or -1 when s names no level. */
int log_parse_level(const char *s, log_level *out);
void log_set_level(log_level lvl);

void log_write(log_level lvl, const char *module, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#define LOG_AT(lvl, module, ...)                                                                   \
    do {                                                                                           \
        if ((lvl) >= log_threshold)                                                                \
            log_write((lvl), (module), __VA_ARGS__);                                               \
    } while (0)

#define LOG_DEBUG(module, ...) LOG_AT(LOG_DEBUG, module, __VA_ARGS__)
#define LOG_INFO(module, ...) LOG_AT(LOG_INFO, module, __VA_ARGS__)
#define LOG_WARN(module, ...) LOG_AT(LOG_WARN, module, __VA_ARGS__)
#define LOG_ERROR(module, ...) LOG_AT(LOG_ERROR, module, __VA_ARGS__)

#endif /* ATTNSTAT_LOG_H */
