/* server.c — attnstatd's event loop (see server.h).
 *
 * Listening: the socket's directory is created when missing; a stale socket file (nobody accepts
 * on it) is removed, a live one is an error; the socket is bound under umask 0117 and then set to
 * 0660 (group set to --allow-group when given). Each accepted peer's pid/uid/gid come from
 * SO_PEERCRED and are logged; a peer of another uid than the daemon's, other than root, is refused
 * with Error(PERMISSION) unless it is in the allowed group (primary or supplementary group).
 *
 * Reading: libuv reads straight into the connection's frame_reader; every complete frame is decoded
 * and handed to the session. A framing error (zero or oversize length, undecodable bytes) is
 * answered with Error(FRAME) and the connection is closed once that Error is written.
 *
 * Writing: every message is one frame_pack()ed buffer owned by its write request until the write
 * callback. Per connection, unsent bytes are counted: over out_queue_bytes, results and alerts to
 * it are dropped (counted) and reading from it pauses until the queue drains to half (so a client
 * that never reads cannot make the daemon buffer without bound); essential replies still queue,
 * and a connection 4x over the cap is closed.
 *
 * Shutdown (SIGINT/SIGTERM): stop accepting and reading; wait for queued pushes to finish, be
 * committed and acknowledged; shut each connection down after its writes drain (or after a grace
 * period); then stop the workers and close every handle in its close callback. uv_run() then
 * returns because nothing is left, and the loop closes cleanly. */
#include "server.h"

#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "log.h"
#include "pipeline.h"
#include "session.h"

#define SERVER_READ_CHUNK (64 * 1024)
#define SERVER_SHUTDOWN_GRACE_MS 10000
#define SERVER_CONN_FLUSH_NS (5ull * 1000000000ull)

typedef struct {
    uv_write_t req;
    conn *c;
    size_t len;
    uint8_t *buf;
} server_wreq;

static void start_teardown(server *s);
static void server_resume_reading(conn *c);

/* ---- connections ---------------------------------------------------------------------------- */

static void conn_closed(uv_handle_t *h)
{
    conn *c = (conn *)h;
    server *s = c->srv;
    frame_reader_free(&c->rd);
    free(c);
    server_maybe_finish(s);
}

void server_close_conn(conn *c, const char *why)
{
    if (c->closing)
        return;
    server *s = c->srv;
    c->closing = 1;
    LOG_INFO("server", "client %llu (pid %d) closed: %s", (unsigned long long)c->id, (int)c->pid, why);
    if (c->prev)
        c->prev->next = c->next;
    else
        s->conns = c->next;
    if (c->next)
        c->next->prev = c->prev;
    c->prev = c->next = NULL;
    s->nconns--;
    session_detach(c->sess);
    c->sess = NULL;
    uv_close((uv_handle_t *)&c->pipe, conn_closed);
}

static void conn_shutdown_done(uv_shutdown_t *req, int status)
{
    conn *c = req->data;
    (void)status;
    server_close_conn(c, "closed after its last reply");
}

/* Closes c once its queued writes are out (Error then close). */
static void conn_close_after_flush(conn *c, const char *why)
{
    if (c->closing || c->shutting)
        return;
    c->shutting = 1;
    if (c->reading) {
        uv_read_stop((uv_stream_t *)&c->pipe);
        c->reading = 0;
    }
    LOG_DEBUG("server", "client %llu: shutting down: %s", (unsigned long long)c->id, why);
    c->shutdown_req.data = c;
    c->flush_since_ns = worker_now_ns();
    int rc = uv_shutdown(&c->shutdown_req, (uv_stream_t *)&c->pipe, conn_shutdown_done);
    if (rc != 0)
        server_close_conn(c, why);
}

static void write_done(uv_write_t *req, int status)
{
    server_wreq *w = (server_wreq *)req;
    conn *c = w->c;
    c->out_bytes -= w->len;
    free(w->buf);
    free(w);
    if (status < 0 && status != UV_ECANCELED && !c->closing) {
        char why[128];
        snprintf(why, sizeof why, "write failed: %s", uv_strerror(status));
        server_close_conn(c, why);
        return;
    }
    if (c->paused && !c->closing && !c->shutting && c->out_bytes < c->srv->cfg->out_queue_bytes / 2) {
        c->paused = 0;
        if (!c->srv->stopping)
            server_resume_reading(c);
    }
}

int server_send(conn *c, const Attnstat__Envelope *env, int essential)
{
    server *s = c->srv;
    if (c->closing || c->shutting)
        return -1;
    size_t len = 0;
    uint8_t *buf = frame_pack(env, (uint32_t)s->cfg->max_frame, &len);
    if (!buf) {
        LOG_WARN("server", "client %llu: a reply of type %d does not fit in max_frame %llu or memory "
                 "ran out", (unsigned long long)c->id, (int)env->msg_case,
                 (unsigned long long)s->cfg->max_frame);
        return -1;
    }
    uint64_t cap = s->cfg->out_queue_bytes;
    if (!essential && c->out_bytes + len > cap) {
        c->msgs_dropped++;
        s->m.messages_dropped++;
        if (c->msgs_dropped == 1 || c->msgs_dropped % 1000 == 0)
            LOG_WARN("server", "client %llu does not read fast enough: %llu results/alerts dropped",
                     (unsigned long long)c->id, (unsigned long long)c->msgs_dropped);
        free(buf);
        return -1;
    }
    if (c->out_bytes + len > 4 * cap) {
        free(buf);
        server_close_conn(c, "it does not read its socket (outgoing queue over 4x out_queue_bytes)");
        return -1;
    }
    server_wreq *w = malloc(sizeof *w);
    if (!w) {
        free(buf);
        server_close_conn(c, "out of memory queueing a reply");
        return -1;
    }
    w->c = c;
    w->len = len;
    w->buf = buf;
    uv_buf_t b = uv_buf_init((char *)buf, (unsigned)len);
    int rc = uv_write(&w->req, (uv_stream_t *)&c->pipe, &b, 1, write_done);
    if (rc != 0) {
        free(buf);
        free(w);
        char why[128];
        snprintf(why, sizeof why, "write failed: %s", uv_strerror(rc));
        server_close_conn(c, why);
        return -1;
    }
    c->out_bytes += len;
    if (c->out_bytes > cap && c->reading) {
        uv_read_stop((uv_stream_t *)&c->pipe);
        c->reading = 0;
        c->paused = 1;
        LOG_DEBUG("server", "client %llu: %zu bytes unsent: reading paused", (unsigned long long)c->id,
                  c->out_bytes);
    }
    return 0;
}

void server_send_error(conn *c, Attnstat__Code code, const char *msg, int has_ref, uint64_t ref)
{
    Attnstat__Error e = ATTNSTAT__ERROR__INIT;
    e.code = code;
    e.message = (char *)msg;
    e.has_ref = has_ref;
    e.ref = ref;
    Attnstat__Envelope env = ATTNSTAT__ENVELOPE__INIT;
    env.msg_case = ATTNSTAT__ENVELOPE__MSG_ERROR;
    env.error = &e;
    server_send(c, &env, 1);
}

/* ---- reading -------------------------------------------------------------------------------- */

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
    (void)suggested;
    conn *c = (conn *)h;
    size_t avail = 0;
    uint8_t *p = frame_reader_space(&c->rd, SERVER_READ_CHUNK, &avail);
    buf->base = (char *)p;
    buf->len = p ? avail : 0;
}

static void frame_error(conn *c, const char *msg)
{
    c->srv->m.frame_errors++;
    LOG_WARN("server", "client %llu (pid %d): framing error: %s", (unsigned long long)c->id,
             (int)c->pid, msg);
    server_send_error(c, ATTNSTAT__CODE__FRAME, msg, 0, 0);
    conn_close_after_flush(c, "framing error");
}

static void on_read(uv_stream_t *st, ssize_t nread, const uv_buf_t *buf)
{
    (void)buf;
    conn *c = (conn *)st;
    if (nread == 0)
        return;
    if (nread < 0) {
        if (nread == UV_EOF && c->sess && c->sess->inflight > 0) {
            /* Half-closed with pushes in flight: answer them, then close. */
            uv_read_stop(st);
            c->reading = 0;
            c->eof = 1;
            return;
        }
        server_close_conn(c, nread == UV_EOF ? "disconnected" : uv_strerror((int)nread));
        return;
    }
    frame_reader_commit(&c->rd, (size_t)nread);
    for (;;) {
        if (c->closing || c->shutting)
            return;
        const uint8_t *payload;
        uint32_t len;
        char err[160];
        int r = frame_reader_next(&c->rd, &payload, &len, err, sizeof err);
        if (r == 0)
            return;
        if (r < 0) {
            frame_error(c, err);
            return;
        }
        Attnstat__Envelope *env = frame_decode(payload, len, NULL);
        if (!env) {
            snprintf(err, sizeof err, "a frame of %u bytes is not a valid Envelope (protobuf decode "
                     "failed)", len);
            frame_reader_consume(&c->rd);
            frame_error(c, err);
            return;
        }
        session_handle(c->sess, env);
        attnstat__envelope__free_unpacked(env, NULL);
        if (!c->closing)
            frame_reader_consume(&c->rd);
    }
}

static void server_resume_reading(conn *c)
{
    if (c->reading || c->closing || c->shutting || c->eof)
        return;
    int rc = uv_read_start((uv_stream_t *)&c->pipe, on_alloc, on_read);
    if (rc != 0) {
        char why[128];
        snprintf(why, sizeof why, "uv_read_start: %s", uv_strerror(rc));
        server_close_conn(c, why);
        return;
    }
    c->reading = 1;
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
static void log_accept_failure(server *s, const char *what, int status)
{
    s->accept_failures++;
    uint64_t now = worker_now_ns();
    if (s->accept_failures > 1 && now - s->accept_logged_ns < 1000000000ull)
        return;
    int fds = status == UV_EMFILE || status == UV_ENFILE;
    LOG_ERROR("server", "%s: %s (%llu failures so far)%s", what, uv_strerror(status),
              (unsigned long long)s->accept_failures,
              fds ? ": out of file descriptors; every registered shm buffer holds one: raise the "
                    "open-file limit (LimitNOFILE in the systemd unit, ulimit -n) or lower "
                    "max_clients / max_buffers"
                  : "");
    s->accept_logged_ns = now;
}

static void on_connection(uv_stream_t *listener, int status)
{
    server *s = listener->data;
    if (status < 0) {
        log_accept_failure(s, "accepting a client failed", status);
        return;
    }
    conn *c = calloc(1, sizeof *c);
    if (!c) {
        LOG_ERROR("server", "out of memory accepting a connection");
        return;
    }
    int rc = uv_pipe_init(s->loop, &c->pipe, 0);
    if (rc != 0) {
        LOG_ERROR("server", "uv_pipe_init: %s", uv_strerror(rc));
        free(c);
        return;
    }
    c->srv = s;
    c->id = ++s->next_conn_id;
    frame_reader_init(&c->rd, (uint32_t)s->cfg->max_frame);
    c->next = s->conns;
    if (s->conns)
        s->conns->prev = c;
    s->conns = c;
    s->nconns++;
    rc = uv_accept(listener, (uv_stream_t *)&c->pipe);
    if (rc != 0) {
        log_accept_failure(s, "uv_accept", rc);
        server_close_conn(c, "accept failed");
        return;
    }
    uv_os_fd_t fd;
    struct ucred cred;
    socklen_t clen = sizeof cred;
    rc = uv_fileno((uv_handle_t *)&c->pipe, &fd);
    if (rc != 0 || getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &clen) != 0) {
        LOG_WARN("server", "client %llu: cannot read SO_PEERCRED (%s): refused",
                 (unsigned long long)c->id, rc ? uv_strerror(rc) : strerror(errno));
        s->m.conns_refused++;
        server_close_conn(c, "no peer credentials");
        return;
    }
    c->pid = cred.pid;
    c->uid = cred.uid;
    c->gid = cred.gid;
    LOG_INFO("server", "client %llu connected: pid %d uid %u gid %u", (unsigned long long)c->id,
             (int)cred.pid, (unsigned)cred.uid, (unsigned)cred.gid);
    s->m.conns_accepted++;

    char msg[256];
    if (cred.uid != s->uid && cred.uid != 0 &&
        !(s->have_allow_gid && peer_in_group(cred.pid, cred.gid, s->allow_gid))) {
        s->m.conns_refused++;
        snprintf(msg, sizeof msg,
                 "uid %u may not use this daemon (it runs as uid %u; allow a group with "
                 "--allow-group)", (unsigned)cred.uid, (unsigned)s->uid);
        LOG_WARN("server", "client %llu refused: %s", (unsigned long long)c->id, msg);
        server_send_error(c, ATTNSTAT__CODE__PERMISSION, msg, 0, 0);
        conn_close_after_flush(c, "refused by policy");
        return;
    }
    if (s->nconns > s->cfg->max_clients) {
        s->m.conns_refused++;
        snprintf(msg, sizeof msg, "too many clients (max_clients %llu): try again later",
                 (unsigned long long)s->cfg->max_clients);
        LOG_WARN("server", "client %llu refused: %s", (unsigned long long)c->id, msg);
        server_send_error(c, ATTNSTAT__CODE__BUSY, msg, 0, 0);
        conn_close_after_flush(c, "too many clients");
        return;
    }
    c->sess = session_new(s, c);
    if (!c->sess) {
        server_close_conn(c, "out of memory");
        return;
    }
    server_resume_reading(c);
}

/* ---- listening ------------------------------------------------------------------------------ */

static int mkdir_parents(const char *path, char *err, size_t errlen)
{
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    if (!slash || slash == dir)
        return 0;
    *slash = '\0';
    for (char *p = dir + 1; *p; p++) {
        if (*p != '/')
            continue;
        *p = '\0';
        if (mkdir(dir, 0755) != 0 && errno != EEXIST) {
            snprintf(err, errlen, "cannot create directory %.400s: %s", dir, strerror(errno));
            return -1;
        }
        *p = '/';
    }
    if (mkdir(dir, 0755) != 0 && errno != EEXIST) {
        snprintf(err, errlen, "cannot create directory %.400s: %s", dir, strerror(errno));
        return -1;
    }
    return 0;
}

/* A socket file left by a daemon that died: remove it. A live one: refuse to start. */
static int clear_stale_socket(const char *path, char *err, size_t errlen)
{
    struct stat sb;
    if (lstat(path, &sb) != 0)
        return errno == ENOENT ? 0 : (snprintf(err, errlen, "%s: %s", path, strerror(errno)), -1);
    if (!S_ISSOCK(sb.st_mode)) {
        snprintf(err, errlen, "%s exists and is not a socket: remove it or choose another --socket",
                 path);
        return -1;
    }
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        snprintf(err, errlen, "socket(): %s", strerror(errno));
        return -1;
    }
    struct sockaddr_un addr;
    memset(&addr, 0, sizeof addr);
    addr.sun_family = AF_UNIX;
    snprintf(addr.sun_path, sizeof addr.sun_path, "%s", path);
    int live = connect(fd, (struct sockaddr *)&addr, sizeof addr) == 0;
    close(fd);
    if (live) {
        snprintf(err, errlen, "another attnstatd is listening on %s (stop it, or choose another "
                 "--socket)", path);
        return -1;
    }
    if (unlink(path) != 0) {
        snprintf(err, errlen, "cannot remove the stale socket %s: %s", path, strerror(errno));
        return -1;
    }
    LOG_INFO("server", "removed a stale socket %s", path);
    return 0;
}

static int start_listening(server *s, char *err, size_t errlen)
{
    const char *path = s->cfg->socket_path;
    struct sockaddr_un probe;
    if (strlen(path) >= sizeof probe.sun_path) {
        snprintf(err, errlen, "socket path %s is longer than %zu bytes", path,
                 sizeof probe.sun_path - 1);
        return -1;
    }
    if (mkdir_parents(path, err, errlen) != 0 || clear_stale_socket(path, err, errlen) != 0)
        return -1;
    int rc = uv_pipe_init(s->loop, &s->listener, 0);
    if (rc != 0) {
        snprintf(err, errlen, "uv_pipe_init: %s", uv_strerror(rc));
        return -1;
    }
    s->listener.data = s;
    s->listening = 1;
    mode_t old = umask(0117);
    rc = uv_pipe_bind(&s->listener, path);
    umask(old);
    if (rc != 0) {
        snprintf(err, errlen, "cannot bind %s: %s", path, uv_strerror(rc));
        return -1;
    }
    if (chmod(path, 0660) != 0) {
        snprintf(err, errlen, "chmod 0660 %s: %s", path, strerror(errno));
        return -1;
    }
    if (s->have_allow_gid && chown(path, (uid_t)-1, s->allow_gid) != 0) {
        snprintf(err, errlen, "cannot give %s to group %s: %s", path, s->cfg->allow_group,
                 strerror(errno));
        return -1;
    }
    rc = uv_listen((uv_stream_t *)&s->listener, 128, on_connection);
    if (rc != 0) {
        snprintf(err, errlen, "listen on %s: %s", path, uv_strerror(rc));
        return -1;
    }
    LOG_INFO("server", "listening on %s (mode 0660)", path);
    return 0;
}

/* ---- shutdown ------------------------------------------------------------------------------- */

static void noop_closed(uv_handle_t *h)
{
    (void)h;
}

static void listener_closed(uv_handle_t *h)
{
    server *s = h->data;
    if (unlink(s->cfg->socket_path) != 0 && errno != ENOENT)
        LOG_WARN("server", "cannot remove %s: %s", s->cfg->socket_path, strerror(errno));
}

static void close_handle(uv_handle_t *h, uv_close_cb cb)
{
    if (!uv_is_closing(h))
        uv_close(h, cb);
}

int server_gpu_find(const server *s, const char *uuid)
{
    if (!uuid)
        return -1;
    for (int i = 0; i < s->ngpus; i++)
        if (strcasecmp(s->gpus[i].uuid, uuid) == 0)
            return i;
    return -1;
}

worker *server_gpu_worker(server *s, int idx, char *err, size_t errlen)
{
    if (idx < 0 || idx >= s->ngpus) {
        snprintf(err, errlen, "no such local device");
        return NULL;
    }
    if (s->gpu_w[idx])
        return s->gpu_w[idx];
    const gpu_devinfo *d = &s->gpus[idx];
    gpu_ctx *g = gpu_ctx_new(d->ordinal, d->uuid);
    if (!g) {
        snprintf(err, errlen, "out of memory for the worker of %s", d->uuid);
        return NULL;
    }
    char werr[256];
    worker *w = worker_pool_add(s->pool, d->uuid, (uint32_t)s->cfg->queue_depth, gpu_compute, g,
                                werr, sizeof werr);
    if (!w) {
        free(g);
        snprintf(err, errlen, "cannot start the worker of %s: %s", d->uuid, werr);
        return NULL;
    }
    gpu_ctx_set_worker(g, w);
    if (worker_run_on(w, gpu_ctx_start, g) != 0)
        LOG_ERROR("gpu", "cannot start the CUDA set-up of %s", d->uuid);
    s->gpu_w[idx] = w;
    s->gpu_c[idx] = g;
    LOG_INFO("gpu", "serving device %d (%s, %s), queue %llu", d->ordinal, d->name, d->uuid,
             (unsigned long long)s->cfg->queue_depth);
    return w;
}

static void start_teardown(server *s)
{
    if (s->torn_down)
        return;
    s->torn_down = 1;
    LOG_INFO("server", "stopping workers and closing");
    for (int i = 0; i < s->ngpus; i++)
        if (s->gpu_w[i] && worker_run_on(s->gpu_w[i], gpu_ctx_stop, s->gpu_c[i]) != 0)
            LOG_WARN("gpu", "cannot stop the CUDA context of %s cleanly", s->gpus[i].uuid);
    worker_pool_close(s->pool); /* delivers whatever finished; the pipeline commits it */
    for (int i = 0; i < s->ngpus; i++) {
        if (s->gpu_c[i] && worker_ctx_abandoned(s->gpu_c[i]))
            LOG_ERROR("gpu", "the worker of %s was left computing: its context is kept",
                      s->gpus[i].uuid);
        else
            free(s->gpu_c[i]);
        s->gpu_c[i] = NULL;
        s->gpu_w[i] = NULL;
    }
    s->pool_closed = 1;
    pipeline_close(s->pipe);
    close_handle((uv_handle_t *)&s->sig_int, noop_closed);
    close_handle((uv_handle_t *)&s->sig_term, noop_closed);
    close_handle((uv_handle_t *)&s->grace_timer, noop_closed);
    close_handle((uv_handle_t *)&s->tick, noop_closed);
    metrics_http_stop(s->metrics_http);
}

void server_maybe_finish(server *s)
{
    /* Half-closed clients whose pushes are all answered. */
    for (conn *c = s->conns, *next; c; c = next) {
        next = c->next;
        if (c->eof && !c->shutting && !c->closing && (!c->sess || c->sess->inflight == 0))
            conn_close_after_flush(c, "end of stream");
    }
    if (!s->stopping || s->torn_down)
        return;
    if (!s->draining_done) {
        if (worker_pool_busy(s->pool) > 0)
            return;
        if (pipeline_pending(s->pipe) > 0) {
            pipeline_flush(s->pipe); /* calls back here */
            return;
        }
        s->draining_done = 1;
        LOG_INFO("server", "queued work finished and committed; closing %u connections", s->nconns);
        for (conn *c = s->conns, *next; c; c = next) {
            next = c->next;
            conn_close_after_flush(c, "daemon shutting down");
        }
    }
    if (s->nconns == 0)
        start_teardown(s);
}

static void begin_shutdown(server *s, const char *why)
{
    if (s->stopping)
        return;
    s->stopping = 1;
    LOG_INFO("server", "%s: shutting down (finishing %u queued pushes)", why,
             worker_pool_busy(s->pool));
    if (s->listening) {
        s->listening = 0;
        uv_close((uv_handle_t *)&s->listener, listener_closed);
    }
    for (conn *c = s->conns; c; c = c->next) {
        if (c->reading) {
            uv_read_stop((uv_stream_t *)&c->pipe);
            c->reading = 0;
        }
    }
    server_maybe_finish(s);
}

static void grace_expired(uv_timer_t *t)
{
    server *s = t->data;
    LOG_WARN("server", "shutdown grace of %d ms is over: closing %u connections now",
             SERVER_SHUTDOWN_GRACE_MS, s->nconns);
    s->draining_done = 1;
    while (s->conns)
        server_close_conn(s->conns, "daemon shutting down (grace over)");
    start_teardown(s);
}

static void on_signal(uv_signal_t *h, int signum)
{
    server *s = h->data;
    if (s->stopping) {
        LOG_WARN("server", "signal %d again: still waiting for queued work (grace %d ms)", signum,
                 SERVER_SHUTDOWN_GRACE_MS);
        return;
    }
    int rc = uv_timer_start(&s->grace_timer, grace_expired, SERVER_SHUTDOWN_GRACE_MS, 0);
    if (rc != 0)
        LOG_ERROR("server", "cannot arm the shutdown grace timer: %s", uv_strerror(rc));
    begin_shutdown(s, signum == SIGINT ? "SIGINT" : "SIGTERM");
}

/* Once a second: connections stuck in a flush that never completes are closed. */
static void on_tick(uv_timer_t *t)
{
    server *s = t->data;
    uint64_t now = worker_now_ns();
    for (conn *c = s->conns, *next; c; c = next) {
        next = c->next;
        if (c->shutting && !c->closing && now - c->flush_since_ns > SERVER_CONN_FLUSH_NS)
            server_close_conn(c, "its last replies were not read in time");
    }
}

/* ---- run ------------------------------------------------------------------------------------ */

static void walk_report(uv_handle_t *h, void *arg)
{
    (void)arg;
    LOG_ERROR("server", "handle of type %s still open at exit (closing: %d)",
              uv_handle_type_name(uv_handle_get_type(h)), uv_is_closing(h));
}

/* Every registered shm buffer keeps its fd (the workers fstat it to catch a shrunk segment before
 * reading), so the daemon needs about max_clients x (max_buffers + 1) descriptors: raise the soft
 * limit to the hard one, and say so when even that is short. */
static void raise_fd_limit(const cfg *c)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0) {
        LOG_WARN("server", "getrlimit(RLIMIT_NOFILE): %s", strerror(errno));
        return;
    }
    rlim_t old = rl.rlim_cur;
    if (rl.rlim_cur != rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        if (setrlimit(RLIMIT_NOFILE, &rl) != 0) {
            LOG_WARN("server", "cannot raise the open-file limit from %llu to %llu: %s",
                     (unsigned long long)old, (unsigned long long)rl.rlim_max, strerror(errno));
            rl.rlim_cur = old;
        }
    }
    unsigned long long need = (unsigned long long)c->max_clients * (c->max_buffers + 1) + 64;
    if (rl.rlim_cur != RLIM_INFINITY && (unsigned long long)rl.rlim_cur < need)
        LOG_WARN("server", "open-file limit %llu is under the %llu that max_clients %llu x "
                 "(max_buffers %llu + 1) may need: registrations past it will be refused (raise "
                 "LimitNOFILE / ulimit -Hn, or lower max_clients / max_buffers)",
                 (unsigned long long)rl.rlim_cur, need, (unsigned long long)c->max_clients,
                 (unsigned long long)c->max_buffers);
    else
        LOG_INFO("server", "open-file limit %llu (was %llu)", (unsigned long long)rl.rlim_cur,
                 (unsigned long long)old);
}

int server_run(const cfg *c)
{
    char err[600];
    server *s = calloc(1, sizeof *s);
    if (!s) {
        LOG_ERROR("server", "out of memory");
        return 1;
    }
    s->cfg = c;
    s->uid = getuid();
    raise_fd_limit(c);
    metrics_init(&s->m);
    int exit_code = 1;
    /* The loop is on the heap, not on this stack: when shutdown leaves a worker thread behind (see
     * worker_pool_close), the loop is deliberately kept, neither closed nor freed, so that its
     * memory and wake-up descriptor stay valid for as long as that thread can exist. The thread
     * is built never to touch it once abandoned; keeping the loop makes that a second line of
     * defence rather than the only one, while shutdown still commits and closes the store and
     * returns normally (an _exit would skip the exit handlers and flushing of everything else). */
    uv_loop_t *loopp = malloc(sizeof *loopp);
    if (!loopp) {
        LOG_ERROR("server", "out of memory for the event loop");
        free(s);
        return 1;
    }
    int rc = uv_loop_init(loopp);
    if (rc != 0) {
        LOG_ERROR("server", "uv_loop_init: %s", uv_strerror(rc));
        free(loopp);
        free(s);
        return 1;
    }
    s->loop = loopp;

    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = SIG_IGN;
    if (sigaction(SIGPIPE, &sa, NULL) != 0)
        LOG_WARN("server", "cannot ignore SIGPIPE: %s", strerror(errno));

    if (c->allow_group && c->allow_group[0]) {
        struct group gr, *res = NULL;
        char buf[4096];
        int grc = getgrnam_r(c->allow_group, &gr, buf, sizeof buf, &res);
        if (grc != 0 || !res) {
            LOG_ERROR("server", "--allow-group %s: no such group%s%s", c->allow_group,
                      grc ? ": " : "", grc ? strerror(grc) : "");
            goto out_loop;
        }
        s->have_allow_gid = 1;
        s->allow_gid = gr.gr_gid;
    }

    if (mkdir_parents(c->db_path, err, sizeof err) != 0) {
        LOG_ERROR("server", "database: %s", err);
        goto out_loop;
    }
    store_error se = {0, ""};
    s->db = store_open(c->db_path, 0, &se);
    if (!s->db) {
        LOG_ERROR("server", "cannot open the database %s: %s", c->db_path, se.msg);
        goto out_loop;
    }
    LOG_INFO("server", "database %s (schema version %d)", c->db_path, store_schema_version());

    s->pool = worker_pool_create(loopp, pipeline_job_done, s, err, sizeof err);
    if (!s->pool) {
        LOG_ERROR("server", "workers: %s", err);
        goto out_store;
    }
    s->pipe = pipeline_new(s, err, sizeof err);
    if (!s->pipe) {
        LOG_ERROR("server", "pipeline: %s", err);
        worker_pool_close(s->pool);
        uv_run(loopp, UV_RUN_DEFAULT);
        goto out_store;
    }
    s->cpu = worker_pool_add(s->pool, "cpu", (uint32_t)c->queue_depth, NULL, NULL, err, sizeof err);
    s->ngpus = gpu_enumerate(s->gpus, GPU_MAX_LOCAL, s->gpu_why, sizeof s->gpu_why);
    if (s->ngpus == 0)
        LOG_INFO("gpu", "no GPU workers: %s; CUDA_IPC buffers are refused (host tensors work)",
                 s->gpu_why);
    for (int i = 0; i < s->ngpus; i++)
        LOG_INFO("gpu", "device %d: %s, compute capability %d.%d, %s", s->gpus[i].ordinal,
                 s->gpus[i].name, s->gpus[i].cc_major, s->gpus[i].cc_minor, s->gpus[i].uuid);

    uv_signal_init(loopp, &s->sig_int);
    uv_signal_init(loopp, &s->sig_term);
    uv_timer_init(loopp, &s->grace_timer);
    uv_timer_init(loopp, &s->tick);
    s->sig_int.data = s->sig_term.data = s;
    s->grace_timer.data = s->tick.data = s;
    if (!s->cpu) {
        LOG_ERROR("server", "workers: %s", err);
        goto out_teardown;
    }
    if ((rc = uv_signal_start(&s->sig_int, on_signal, SIGINT)) != 0 ||
        (rc = uv_signal_start(&s->sig_term, on_signal, SIGTERM)) != 0 ||
        (rc = uv_timer_start(&s->tick, on_tick, 1000, 1000)) != 0) {
        LOG_ERROR("server", "signal/timer setup: %s", uv_strerror(rc));
        goto out_teardown;
    }
    uv_unref((uv_handle_t *)&s->tick);
    if (start_listening(s, err, sizeof err) != 0) {
        LOG_ERROR("server", "%s", err);
        goto out_teardown;
    }
    if (c->metrics_port) {
        s->metrics_http = metrics_http_start(loopp, (int)c->metrics_port, c->metrics_timeout_ms,
                                             pipeline_render_metrics, s, err, sizeof err);
        if (!s->metrics_http) {
            LOG_ERROR("server", "%s", err);
            goto out_teardown;
        }
        LOG_INFO("server", "metrics on http://127.0.0.1:%llu/metrics",
                 (unsigned long long)c->metrics_port);
    }
    LOG_INFO("server", "attnstatd %s ready (pid %d, cpu worker queue %llu, max_frame %llu)",
             ATTNSTAT_DAEMON_VERSION, (int)getpid(), (unsigned long long)c->queue_depth,
             (unsigned long long)c->max_frame);
    exit_code = 0;
    uv_run(loopp, UV_RUN_DEFAULT);
    goto out_store;

out_teardown:
    s->stopping = 1;
    s->draining_done = 1;
    if (s->listening) {
        s->listening = 0;
        uv_close((uv_handle_t *)&s->listener, listener_closed);
    }
    start_teardown(s);
    uv_run(loopp, UV_RUN_DEFAULT);
out_store:
    if (s->db) {
        store_error ce = {0, ""};
        if (store_commit(s->db, &ce) != STORE_OK) {
            LOG_ERROR("server", "final commit: %s", ce.msg);
            exit_code = 1;
        }
        store_close(s->db);
    }
out_loop:
    if (worker_any_abandoned()) {
        LOG_WARN("server", "a worker thread was left behind: the event loop is kept open until "
                 "the process exits");
    } else {
        rc = uv_loop_close(loopp);
        if (rc != 0) {
            LOG_ERROR("server", "the event loop did not close cleanly: %s", uv_strerror(rc));
            uv_walk(loopp, walk_report, NULL);
            exit_code = 1;
        }
        free(loopp);
    }
    if (exit_code == 0)
        LOG_INFO("server", "stopped cleanly");
    free(s);
    return exit_code;
}
