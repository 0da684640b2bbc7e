/* store_lock.c — the writer's lock on the database file itself (see store_lock.h). */
#include "store_lock.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

/* pids are below 2^22 (the kernel's largest pid_max). */
#define STORE_LOCK_PID_SPAN (1ll << 22)

static int ofd_lock(int fd, short type, long long start, long long len)
{
    struct flock fl;
    memset(&fl, 0, sizeof fl);
    fl.l_type = type;
    fl.l_whence = SEEK_SET;
    fl.l_start = (off_t)start;
    fl.l_len = (off_t)len;
    return fcntl(fd, F_OFD_SETLK, &fl);
}

/* The pid the holder wrote as a locked byte, or 0. */
static long holder_pid(int fd)
{
    struct flock fl;
    memset(&fl, 0, sizeof fl);
    fl.l_type = F_WRLCK;
    fl.l_whence = SEEK_SET;
    fl.l_start = (off_t)(STORE_LOCK_BASE + 1);
    fl.l_len = (off_t)STORE_LOCK_PID_SPAN;
    if (fcntl(fd, F_OFD_GETLK, &fl) != 0 || fl.l_type == F_UNLCK)
        return 0;
    long long pid = (long long)fl.l_start - (STORE_LOCK_BASE + 1);
    return pid > 0 && pid < STORE_LOCK_PID_SPAN ? (long)pid : 0;
}

int store_lock_take(const char *path, long *holder, char *err, size_t errlen)
{
    if (holder)
        *holder = 0;
    int fd = open(path, O_RDWR | O_CLOEXEC | O_NOCTTY);
    if (fd < 0) {
        snprintf(err, errlen, "cannot open %s to lock it: %s", path, strerror(errno));
        return -1;
    }
    if (ofd_lock(fd, F_WRLCK, STORE_LOCK_BASE, 1) != 0) {
        int e = errno;
        if (e == EAGAIN || e == EACCES) {
            long pid = holder_pid(fd);
            if (holder)
                *holder = pid;
            close(fd);
            snprintf(err, errlen, "%s is locked by another writer (pid %ld)", path, pid);
            return STORE_LOCK_HELD;
        }
        close(fd);
        snprintf(err, errlen, "cannot lock %s: %s", path, strerror(e));
        return e == ENOLCK || e == EINVAL || e == EOPNOTSUPP ? STORE_LOCK_UNSUPPORTED : -1;
    }
    long long pid = (long long)getpid();
    if (pid < STORE_LOCK_PID_SPAN)
        (void)ofd_lock(fd, F_WRLCK, STORE_LOCK_BASE + 1 + pid, 1); /* only names the holder */
    return fd;
}

void store_lock_release(int fd)
{
    if (fd >= 0)
        close(fd); /* the last descriptor of the description: its locks go with it */
}
