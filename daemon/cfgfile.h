/* cfgfile.h — a config file's bytes, read with bounds: at most CFGFILE_MAX bytes, and (for a
 * reload) a regular file only, opened without blocking. Nothing else: no parsing (config.c), no
 * logging, no global state, so that it may run on any thread (the SIGHUP reload reads on one of
 * its own: reload.h). Stage: start-up and the reload; calls nothing of ours. */
#ifndef ATTNSTAT_CFGFILE_H
#define ATTNSTAT_CFGFILE_H

#include <stddef.h>

/* The largest config file read (a full one, every setting with a comment, is a few KiB). */
#define CFGFILE_MAX (1024 * 1024)

/* Reads the file at path into *text (NUL-terminated, its length in *len; free it). regular_only:
 * refuse anything but a regular file (a FIFO, a device, a socket, a directory), opened with
 * O_NONBLOCK so that a FIFO with no writer cannot hold the caller. 0, or -1 with err naming the
 * file and the cause (missing, permission, not a regular file and what it is, over CFGFILE_MAX,
 * a NUL byte in it). */
int cfgfile_read(const char *path, int regular_only, char **text, size_t *len, char *err,
                 size_t errlen);

#endif /* ATTNSTAT_CFGFILE_H */
