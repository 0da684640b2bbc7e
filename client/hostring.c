/* hostring.c — libattnstat's host ring (see hostring.h): a POSIX shared-memory segment with a name
 * nobody else uses, mapped here and by the daemon, and the bookkeeping over it.
 *
 * Stage: below link.c and session.c. Calls ring.c and util.c (client_fail). */
#include "hostring.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static attnstat_code hostring_fail(attnstat_client *c, attnstat_code code)
{
    hostring_free(c);
    return code;
}

/* The ring is created 0600: only this uid reads it. A daemon of another uid (the packaged service
 * runs as attnstat, and admits the users of its group) reads it through its own group: the
 * segment is given the daemon's primary group (SO_PEERCRED of the connected socket), which this
 * process may do only as a member of that group, and made 0640. Nobody else sees the tensors. */
static attnstat_code hostring_share(attnstat_client *c)
{
    struct ucred cred;
    socklen_t len = sizeof cred;
    if (c->fd < 0 || getsockopt(c->fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0)
        return ATTNSTAT_OK; /* not connected to a daemon we can ask: the mode stays 0600 */
    if (cred.uid == geteuid() || cred.uid == 0)
        return ATTNSTAT_OK;
    if (fchown(c->shm_fd, (uid_t)-1, cred.gid) != 0)
        return client_fail(c, ATTNSTAT_EREFUSED,
                           "attnstatd runs as uid %u, gid %u, and reads the host ring through its "
                           "group; uid %u may not give %s to gid %u (%s): add this user to that "
                           "group (usermod -aG GROUP USER, then log in again), or run the daemon "
                           "as this user", (unsigned)cred.uid, (unsigned)cred.gid,
                           (unsigned)geteuid(), c->shm_name, (unsigned)cred.gid, strerror(errno));
    if (fchmod(c->shm_fd, 0640) != 0)
        return client_fail(c, ATTNSTAT_EIO, "fchmod(%s, 0640): %s", c->shm_name, strerror(errno));
    return ATTNSTAT_OK;
}

attnstat_code hostring_make(attnstat_client *c)
{
    /* A name nobody else uses: pid, the client's address and the clock; O_EXCL catches the rest. */
    for (int attempt = 0; attempt < 8; attempt++) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        snprintf(c->shm_name, sizeof c->shm_name, "/attnstat-%ld-%lx%lx", (long)getpid(),
                 (unsigned long)((uintptr_t)c >> 4 & 0xffff),
                 (unsigned long)((unsigned long)ts.tv_nsec ^ (unsigned long)attempt));
        c->shm_fd = shm_open(c->shm_name, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
        if (c->shm_fd >= 0 || errno != EEXIST)
            break;
    }
    if (c->shm_fd < 0)
        return client_fail(c, ATTNSTAT_EIO, "shm_open(%s): %s (is /dev/shm mounted and writable?)",
                           c->shm_name, strerror(errno));
    c->shm_linked = 1;
    attnstat_code rc = hostring_share(c);
    if (rc != ATTNSTAT_OK)
        return hostring_fail(c, rc);
    if (ftruncate(c->shm_fd, (off_t)c->ring_bytes) != 0)
        return hostring_fail(c, client_fail(c, ATTNSTAT_EIO, "ftruncate(%s, %llu bytes): %s",
                                            c->shm_name, (unsigned long long)c->ring_bytes,
                                            strerror(errno)));
    void *m = mmap(NULL, c->ring_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, c->shm_fd, 0);
    if (m == MAP_FAILED)
        return hostring_fail(c, client_fail(c, ATTNSTAT_EIO, "mmap of the %llu-byte ring %s: %s "
                                            "(lower ring_bytes?)",
                                            (unsigned long long)c->ring_bytes, c->shm_name,
                                            strerror(errno)));
    c->map = m;
    if (ring_init(&c->ring, c->ring_bytes, CLIENT_MAX_INFLIGHT) != 0)
        return hostring_fail(c, client_fail(c, ATTNSTAT_EINVAL, "ring size is 0"));
    c->inflight = calloc(CLIENT_MAX_INFLIGHT, sizeof *c->inflight);
    if (!c->inflight)
        return hostring_fail(c, client_fail(c, ATTNSTAT_ENOMEM,
                                            "out of memory for the in-flight table"));
    c->st.ring_bytes = c->ring_bytes;
    return ATTNSTAT_OK;
}

void hostring_unlink(attnstat_client *c)
{
    if (c->shm_linked && shm_unlink(c->shm_name) == 0)
        c->shm_linked = 0;
}

void hostring_free(attnstat_client *c)
{
    if (c->map)
        munmap(c->map, c->ring_bytes);
    c->map = NULL;
    if (c->shm_fd >= 0)
        close(c->shm_fd);
    c->shm_fd = -1;
    if (c->shm_linked)
        shm_unlink(c->shm_name);
    c->shm_linked = 0;
    ring_destroy(&c->ring);
    free(c->inflight);
    c->inflight = NULL;
}
