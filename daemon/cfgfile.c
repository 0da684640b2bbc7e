/* cfgfile.c — a config file's bytes, read with bounds (see cfgfile.h). */
#include "cfgfile.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static const char *kind_of(mode_t m)
{
    if (S_ISFIFO(m))
        return "a FIFO";
    if (S_ISDIR(m))
        return "a directory";
    if (S_ISCHR(m))
        return "a character device";
    if (S_ISBLK(m))
        return "a block device";
    if (S_ISSOCK(m))
        return "a socket";
    return "not a regular file";
}

int cfgfile_read(const char *path, int regular_only, char **text, size_t *len, char *err,
                 size_t errlen)
{
    *text = NULL;
    *len = 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY | (regular_only ? O_NONBLOCK : 0));
    if (fd < 0) {
        snprintf(err, errlen, "config file %s: %s", path, strerror(errno));
        return -1;
    }
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        snprintf(err, errlen, "config file %s: %s", path, strerror(errno));
        close(fd);
        return -1;
    }
    if (regular_only && !S_ISREG(sb.st_mode)) {
        snprintf(err, errlen, "config file %s is %s, not a regular file: not read (it could hold "
                 "the daemon)", path, kind_of(sb.st_mode));
        close(fd);
        return -1;
    }
    if (S_ISREG(sb.st_mode) && sb.st_size > CFGFILE_MAX) {
        snprintf(err, errlen, "config file %s is %lld bytes, more than the %d bytes a config file "
                 "may be", path, (long long)sb.st_size, CFGFILE_MAX);
        close(fd);
        return -1;
    }
    char *buf = malloc((size_t)CFGFILE_MAX + 2);
    if (!buf) {
        snprintf(err, errlen, "config file %s: out of memory", path);
        close(fd);
        return -1;
    }
    size_t n = 0;
    for (;;) {
        ssize_t r = read(fd, buf + n, (size_t)CFGFILE_MAX + 1 - n);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0) {
            snprintf(err, errlen, "config file %s: %s", path, strerror(errno));
            free(buf);
            close(fd);
            return -1;
        }
        if (r == 0)
            break;
        n += (size_t)r;
        if (n > CFGFILE_MAX) {
            snprintf(err, errlen, "config file %s is more than the %d bytes a config file may be",
                     path, CFGFILE_MAX);
            free(buf);
            close(fd);
            return -1;
        }
    }
    close(fd);
    if (memchr(buf, '\0', n)) {
        snprintf(err, errlen, "config file %s holds a NUL byte: not a text file", path);
        free(buf);
        return -1;
    }
    buf[n] = '\0';
    *text = buf;
    *len = n;
    return 0;
}
