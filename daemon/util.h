/* util.h — the few helpers every stage of attnstatd uses, written once: the one way to write an
 * error message a caller asked for, the two clocks, and making a file's parent directories.
 * Stage: none (a leaf); includes libc only. Safe from any thread. */
#ifndef ATTNSTAT_UTIL_H
#define ATTNSTAT_UTIL_H

#include <stddef.h>
#include <stdint.h>

/* Formats a message into err[errlen] (nothing when err is NULL or errlen 0). Returns -1, so that
 * an error path reads `return util_err(err, errlen, "...", ...);`. */
int util_err(char *err, size_t errlen, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* Monotonic nanoseconds (durations, deadlines). */
uint64_t util_mono_ns(void);
/* Unix time in milliseconds (what samples and alerts are stamped with). */
uint64_t util_wall_ms(void);

/* Text an operator may see as it is: well-formed UTF-8 of 1..max bytes with no control character
 * (C0, DEL, C1) and no format character (U+200B, U+202E, U+2028...: utf8_is_hidden in
 * proto/utf8.h). Returns 1, or 0 with why (when not NULL) saying what is wrong and where. */
int util_printable(const char *s, size_t max, char *why, size_t whylen);

/* Creates the missing directories above path (mode 0755), as mkdir -p on its dirname. Returns 0,
 * or -1 with err naming the directory that could not be made. */
int util_mkdir_parents(const char *path, char *err, size_t errlen);

#endif /* ATTNSTAT_UTIL_H */
