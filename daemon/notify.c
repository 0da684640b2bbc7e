/* notify.c — the service manager's notification datagram (see notify.h).
 * Stage: none (a leaf); calls libc only. */
#include "notify.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

int notify_send(const char *state, char *err, size_t errlen)
{
    const char *name = getenv("NOTIFY_SOCKET");
    if (!name || !name[0])
        return 0;
    struct sockaddr_un sa;
    memset(&sa, 0, sizeof sa);
    sa.sun_family = AF_UNIX;
    size_t n = strlen(name);
    if ((name[0] != '/' && name[0] != '@') || n >= sizeof sa.sun_path) {
        snprintf(err, errlen, "NOTIFY_SOCKET '%s' is not a Unix socket path or @name of at most "
                 "%zu bytes: the service manager was not told the daemon's state", name,
                 sizeof sa.sun_path - 1);
        return -1;
    }
    memcpy(sa.sun_path, name, n);
    if (name[0] == '@')
        sa.sun_path[0] = '\0'; /* the abstract namespace */
    socklen_t len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + n);
    int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        snprintf(err, errlen, "notifying the service manager: socket: %s", strerror(errno));
        return -1;
    }
    ssize_t sent = sendto(fd, state, strlen(state), MSG_NOSIGNAL, (struct sockaddr *)&sa, len);
    int e = errno;
    close(fd);
    if (sent < 0) {
        snprintf(err, errlen, "notifying the service manager at %s: %s", name, strerror(e));
        return -1;
    }
    return 1;
}
