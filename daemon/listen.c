/* listen.c — the Unix socket and the accept policy (see listen.h). Stage: listen; calls conn,
 * counters, util and log. */
#include "listen.h"

#include <errno.h>
#include <grp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "log.h"
#include "util.h"

struct listener {
    uv_loop_t *loop;
    uv_pipe_t pipe;
    const cfg *cfg;
    counters *cnt;
    listen_hooks hooks;
    void *data;
    conn_limits lim;
    uid_t uid;               /* the daemon's */
    int have_allow_gid;
    gid_t allow_gid;
    int listening;
    uint64_t next_conn_id;
    uint64_t accept_failures;    /* accept errors (EMFILE...), logged at most once a second */
    uint64_t accept_logged_ns;
};

listener *listen_new(uv_loop_t *loop, const cfg *c, counters *cnt, const listen_hooks *hooks,
                     void *data, char *err, size_t errlen)
{
    listener *l = calloc(1, sizeof *l);
    if (!l) {
        util_err(err, errlen, "out of memory");
        return NULL;
    }
    l->loop = loop;
    l->cfg = c;
    l->cnt = cnt;
    l->hooks = *hooks;
    l->data = data;
    l->lim.max_frame = (uint32_t)c->max_frame;
    l->lim.out_queue_bytes = c->out_queue_bytes;
    l->lim.sub_queue_bytes = c->sub_queue_bytes;
    l->uid = getuid();
    if (c->allow_group && c->allow_group[0]) {
        struct group gr, *res = NULL;
        char buf[4096];
        int grc = getgrnam_r(c->allow_group, &gr, buf, sizeof buf, &res);
        if (grc != 0 || !res) {
            util_err(err, errlen, "--allow-group %s: no such group%s%s", c->allow_group,
                     grc ? ": " : "", grc ? strerror(grc) : "");
            free(l);
            return NULL;
        }
        l->have_allow_gid = 1;
        l->allow_gid = gr.gr_gid;
    }
    return l;
}

/* ---- accepting ------------------------------------------------------------------------------ */

/* Is pid (with primary group gid) a member of group want? Reads /proc/PID/status's Groups line. */
static int peer_in_group(pid_t pid, gid_t gid, gid_t want)
{
    if (gid == want)
        return 1;
    char path[64], line[4096];
    snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return 0;
    int found = 0;
    while (!found && fgets(line, sizeof line, f)) {
        if (strncmp(line, "Groups:", 7) != 0)
            continue;
        char *p = line + 7, *end;
        for (;;) {
            unsigned long g = strtoul(p, &end, 10);
            if (end == p)
                break;
            if ((gid_t)g == want)
                found = 1;
            p = end;
        }
        break;
    }
    fclose(f);
    return found;
}

/* Accept failures come in bursts (libuv retries at every loop turn): logged at most once a
 * second, with how many were not logged. */
static void log_accept_failure(listener *l, const char *what, int status)
{
    l->accept_failures++;
    uint64_t now = util_mono_ns();
    if (l->accept_failures > 1 && now - l->accept_logged_ns < 1000000000ull)
        return;
    int fds = status == UV_EMFILE || status == UV_ENFILE;
    LOG_ERROR("server", "%s: %s (%llu failures so far)%s", what, uv_strerror(status),
              (unsigned long long)l->accept_failures,
              fds ? ": out of file descriptors; every registered shm buffer holds one: raise the "
                    "open-file limit (LimitNOFILE in the systemd unit, ulimit -n) or lower "
                    "max_clients / max_buffers"
                  : "");
    l->accept_logged_ns = now;
}

/* Refused connections still open (their reason going out), at most: past it a refusal closes at
 * once, its Error queued (a flood of refused connections cannot hold descriptors). */
#define LISTEN_MAX_LINGERING 64

/* Error(code, msg) to a peer the policy refuses; closed once it is written and the peer closed
 * its end (or CONN_FLUSH_NS passed), so that it reads the reason. */
static void refuse(listener *l, conn *c, Attnstat__Code code, const char *msg, const char *why,
                   uint32_t lingering)
{
    counters_inc(l->cnt, CNT_CONNS_REFUSED);
    LOG_WARN("server", "client %llu refused: %s", (unsigned long long)conn_id(c), msg);
    conn_refuse(c, code, msg, why, lingering < LISTEN_MAX_LINGERING);
}

static void on_connection(uv_stream_t *server, int status)
{
    listener *l = server->data;
    if (status < 0) {
        log_accept_failure(l, "accepting a client failed", status);
        return;
    }
    conn *c = conn_new(l->loop, ++l->next_conn_id, &l->lim, l->cnt);
    if (!c)
        return;
    int rc = uv_accept(server, conn_stream(c));
    if (rc != 0) {
        log_accept_failure(l, "uv_accept", rc);
        conn_close(c, "accept failed");
        return;
    }
    l->hooks.added(l->data, c);
    if (!conn_is_open(c))
        return; /* the owner could not take it */
    uv_os_fd_t fd;
    struct ucred cred;
    socklen_t clen = sizeof cred;
    rc = uv_fileno((uv_handle_t *)conn_stream(c), &fd);
    if (rc != 0 || getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &clen) != 0) {
        LOG_WARN("server", "client %llu: cannot read SO_PEERCRED (%s): refused",
                 (unsigned long long)conn_id(c), rc ? uv_strerror(rc) : strerror(errno));
        counters_inc(l->cnt, CNT_CONNS_REFUSED);
        conn_close(c, "no peer credentials");
        return;
    }
    conn_set_peer(c, cred.pid, cred.uid, cred.gid);
    LOG_INFO("server", "client %llu connected: pid %d uid %u gid %u", (unsigned long long)conn_id(c),
             (int)cred.pid, (unsigned)cred.uid, (unsigned)cred.gid);
    counters_inc(l->cnt, CNT_CONNS_ACCEPTED);

    char msg[400];
    listen_counts n = {0, 0, 0, 0};
    l->hooks.count(l->data, cred.uid, &n);
    if (cred.uid != l->uid && cred.uid != 0 &&
        !(l->have_allow_gid && peer_in_group(cred.pid, cred.gid, l->allow_gid))) {
        snprintf(msg, sizeof msg,
                 "uid %u may not use this daemon (it runs as uid %u; allow a group with "
                 "--allow-group)", (unsigned)cred.uid, (unsigned)l->uid);
        refuse(l, c, ATTNSTAT__CODE__PERMISSION, msg, "refused by policy", n.lingering);
        return;
    }
    const cfg *cf = l->cfg;
    if (n.admitted >= cf->max_clients) {
        snprintf(msg, sizeof msg, "too many clients (max_clients %llu): try again later",
                 (unsigned long long)cf->max_clients);
        refuse(l, c, ATTNSTAT__CODE__BUSY, msg, "too many clients", n.lingering);
        return;
    }
    uint64_t of_uid_max = cf->max_clients_per_uid + cf->status_clients_per_uid;
    if (n.of_uid >= of_uid_max) {
        snprintf(msg, sizeof msg, "uid %u has %u connections open, the most one uid may hold "
                 "(max_clients_per_uid %llu + status_clients_per_uid %llu): close one, or raise "
                 "the settings", (unsigned)cred.uid, n.of_uid,
                 (unsigned long long)cf->max_clients_per_uid,
                 (unsigned long long)cf->status_clients_per_uid);
        refuse(l, c, ATTNSTAT__CODE__BUSY, msg, "too many clients of one uid", n.lingering);
        return;
    }
    /* The last reserved_clients slots: root's and the daemon's uid's; other uids' connections
     * take at most half of them, for status and commands only. */
    int privileged = cred.uid == 0 || cred.uid == l->uid;
    uint64_t general = cf->max_clients > cf->reserved_clients
                           ? cf->max_clients - cf->reserved_clients : 0;
    int reserve = !privileged && n.admitted >= general;
    if (reserve && n.reserve >= cf->reserved_clients / 2) {
        snprintf(msg, sizeof msg, "too many clients: every slot is taken but the last %llu "
                 "(reserved_clients), kept for root, uid %u and status commands, and the share "
                 "of them other uids may use is taken: try again later",
                 (unsigned long long)cf->reserved_clients, (unsigned)l->uid);
        refuse(l, c, ATTNSTAT__CODE__BUSY, msg, "too many clients (reserve)", n.lingering);
        return;
    }
    if (reserve)
        LOG_INFO("server", "client %llu (uid %u) admitted into the reserved slots: status and "
                 "commands only", (unsigned long long)conn_id(c), (unsigned)cred.uid);
    l->hooks.admitted(l->data, c, reserve);
}

/* ---- binding -------------------------------------------------------------------------------- */

/* A socket file left by a daemon that died: remove it. A live one: refuse to start. */
static int clear_stale_socket(const char *path, char *err, size_t errlen)
{
    struct stat sb;
    if (lstat(path, &sb) != 0)
        return errno == ENOENT ? 0 : util_err(err, errlen, "%s: %s", path, strerror(errno));
    if (!S_ISSOCK(sb.st_mode))
        return util_err(err, errlen, "%s exists and is not a socket: remove it or choose another "
                        "--socket", path);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return util_err(err, errlen, "socket(): %s", strerror(errno));
    struct sockaddr_un addr;
    memset(&addr, 0, sizeof addr);
    addr.sun_family = AF_UNIX;
    snprintf(addr.sun_path, sizeof addr.sun_path, "%s", path);
    int live = connect(fd, (struct sockaddr *)&addr, sizeof addr) == 0;
    close(fd);
    if (live)
        return util_err(err, errlen, "another attnstatd is listening on %s (stop it, or choose "
                        "another --socket)", path);
    if (unlink(path) != 0)
        return util_err(err, errlen, "cannot remove the stale socket %s: %s", path, strerror(errno));
    LOG_INFO("server", "removed a stale socket %s", path);
    return 0;
}

int listen_start(listener *l, char *err, size_t errlen)
{
    const char *path = l->cfg->socket_path;
    struct sockaddr_un probe;
    if (strlen(path) >= sizeof probe.sun_path)
        return util_err(err, errlen, "socket path %s is longer than %zu bytes", path,
                        sizeof probe.sun_path - 1);
    if (util_mkdir_parents(path, err, errlen) != 0 || clear_stale_socket(path, err, errlen) != 0)
        return -1;
    int rc = uv_pipe_init(l->loop, &l->pipe, 0);
    if (rc != 0)
        return util_err(err, errlen, "uv_pipe_init: %s", uv_strerror(rc));
    l->pipe.data = l;
    l->listening = 1;
    mode_t old = umask(0117);
    rc = uv_pipe_bind(&l->pipe, path);
    umask(old);
    if (rc != 0)
        return util_err(err, errlen, "cannot bind %s: %s", path, uv_strerror(rc));
    if (chmod(path, 0660) != 0)
        return util_err(err, errlen, "chmod 0660 %s: %s", path, strerror(errno));
    if (l->have_allow_gid && chown(path, (uid_t)-1, l->allow_gid) != 0)
        return util_err(err, errlen, "cannot give %s to group %s: %s", path, l->cfg->allow_group,
                        strerror(errno));
    rc = uv_listen((uv_stream_t *)&l->pipe, 128, on_connection);
    if (rc != 0)
        return util_err(err, errlen, "listen on %s: %s", path, uv_strerror(rc));
    LOG_INFO("server", "listening on %s (mode 0660)", path);
    return 0;
}

static void listener_closed(uv_handle_t *h)
{
    listener *l = h->data;
    if (unlink(l->cfg->socket_path) != 0 && errno != ENOENT)
        LOG_WARN("server", "cannot remove %s: %s", l->cfg->socket_path, strerror(errno));
    free(l);
}

void listen_close(listener *l)
{
    if (!l)
        return;
    if (!l->listening) {
        free(l);
        return;
    }
    l->listening = 0;
    uv_close((uv_handle_t *)&l->pipe, listener_closed);
}
