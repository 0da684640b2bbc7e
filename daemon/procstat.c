/* procstat.c — attnstatd's own process as the kernel describes it (see procstat.h).
 *
 * /proc/self/stat (proc(5)): the command name, field 2, is in parentheses and may itself hold
 * spaces and parentheses, so the fields are counted from the last ')'. Fields 14 and 15 (utime,
 * stime) and 22 (starttime, since boot) are in clock ticks (sysconf(_SC_CLK_TCK)), 23 (vsize) in
 * bytes, 24 (rss) in pages. The start time in Unix seconds is the boot time (/proc/stat's btime
 * line) plus starttime, as the Prometheus client libraries compute it.
 * Stage: a leaf; calls libc only. */
#include "procstat.h"

#include <dirent.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

/* ---- the boot time, once --------------------------------------------------------------------- */
static pthread_once_t boot_once = PTHREAD_ONCE_INIT;
static double boot_time; /* Unix seconds; < 0: could not be read */

static void read_boot_time(void)
{
    boot_time = -1;
    FILE *f = fopen("/proc/stat", "re");
    if (!f)
        return;
    char line[512];
    unsigned long long bt;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "btime %llu", &bt) == 1) {
            boot_time = (double)bt;
            break;
        }
    fclose(f);
}

/* ---- /proc/self/stat ------------------------------------------------------------------------- */
/* Reads fields 14, 15, 22, 23 and 24 into *out. 0, or -1 when the file could not be read or
 * parsed. */
static int read_stat(procstat *out, double *start_ticks)
{
    char buf[4096];
    FILE *f = fopen("/proc/self/stat", "re");
    if (!f)
        return -1;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    const char *p = strrchr(buf, ')');
    if (!p)
        return -1;
    /* p + 2: field 3 (state). Fields 3 .. 13 skipped, then utime and stime (14, 15), 16 .. 21
     * skipped, starttime (22), vsize (23), rss (24). */
    unsigned long long utime, stime, start, vsize;
    long long rss;
    int got = sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu %*d %*d %*d "
                     "%*d %*d %*d %llu %llu %lld", &utime, &stime, &start, &vsize, &rss);
    if (got != 5)
        return -1;
    long tick = sysconf(_SC_CLK_TCK), page = sysconf(_SC_PAGESIZE);
    if (tick <= 0 || page <= 0)
        return -1;
    out->cpu_seconds = (double)(utime + stime) / (double)tick;
    out->virtual_bytes = (double)vsize;
    out->resident_bytes = (double)(rss > 0 ? rss : 0) * (double)page;
    *start_ticks = (double)start / (double)tick;
    return 0;
}

/* ---- descriptors ----------------------------------------------------------------------------- */
/* Entries of /proc/self/fd but the directory's own descriptor; -1 when it cannot be listed. */
static double count_fds(void)
{
    DIR *d = opendir("/proc/self/fd");
    if (!d)
        return -1;
    double n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL)
        if (e->d_name[0] != '.')
            n++;
    closedir(d);
    return n > 0 ? n - 1 : 0; /* the listing's own descriptor was open while it was listed */
}

void procstat_read(procstat *out)
{
    memset(out, 0, sizeof *out);
    double start_ticks = 0;
    out->has_stat = read_stat(out, &start_ticks) == 0;
    if (out->has_stat) {
        pthread_once(&boot_once, read_boot_time);
        if (boot_time >= 0) {
            out->has_start = 1;
            out->start_time = boot_time + start_ticks;
        }
    }
    out->open_fds = count_fds();
    out->has_fds = out->open_fds >= 0;
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0) {
        out->has_max_fds = 1;
        out->max_fds = rl.rlim_cur == RLIM_INFINITY ? INFINITY : (double)rl.rlim_cur;
    }
}
