/* procstat.h — what the kernel says of attnstatd's own process (Linux /proc/self), for the
 * process_* series every Prometheus client library exports: CPU time, resident and virtual
 * memory, the start time, descriptors open and their limit.
 * Stage: none (a leaf the metrics stage reads); includes libc only.
 *
 * What it promises
 *   - Cheap enough for every scrape: one read of /proc/self/stat, a listing of /proc/self/fd and
 *     a getrlimit; the boot time (/proc/stat) is read once per process and kept.
 *   - Never fails as a whole: each value that could not be read (no /proc, a kernel that words a
 *     file otherwise) has its flag cleared, and is left out of the scrape rather than written
 *     as 0. */
#ifndef ATTNSTAT_PROCSTAT_H
#define ATTNSTAT_PROCSTAT_H

#include <stdint.h>

typedef struct {
    int has_stat;               /* the next four were read (/proc/self/stat) */
    double cpu_seconds;         /* user + system CPU time (utime + stime) */
    double resident_bytes;      /* resident set size */
    double virtual_bytes;       /* virtual memory size */
    int has_start;              /* start_time was computed (it needs /proc/stat's btime too) */
    double start_time;          /* when the process started, Unix time in seconds */
    int has_fds;                /* open_fds was counted (/proc/self/fd) */
    double open_fds;            /* descriptors open, the one used to count them left out */
    int has_max_fds;            /* max_fds was read (getrlimit) */
    double max_fds;             /* RLIMIT_NOFILE's soft limit (+Inf: unlimited) */
} procstat;

/* Fills *out with what can be read now (see the top). Safe from any thread (the boot time is
 * read under pthread_once). */
void procstat_read(procstat *out);

#endif /* ATTNSTAT_PROCSTAT_H */
