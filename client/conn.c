/* conn.c — libattnstat's transport to attnstatd (see conn.h): connect, the outgoing queue, the
 * framed receive path and the one wait.
 *
 * How a send stays non-blocking: the frame is written with MSG_DONTWAIT behind whatever is queued;
 * what the socket does not take is queued, and the queue is written out on every later call.
 * Sockets are written with MSG_NOSIGNAL: a daemon that went away is an error code, never SIGPIPE.
 *
 * Stage: the transport. Calls util.c, proto/frame.c and c->on_frame (the handler session.c gave
 * it); nothing else of the library. */
#include "conn.h"

#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define CONN_READ_CHUNK 65536u

/* ---- Connecting ------------------------------------------------------------------------------- */
int conn_connect_start(attnstat_client *c, int *e)
{
    c->fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (c->fd < 0) {
        *e = errno;
        return -1;
    }
    struct sockaddr_un sa;
    memset(&sa, 0, sizeof sa);
    sa.sun_family = AF_UNIX;
    memcpy(sa.sun_path, c->sock_path, strlen(c->sock_path) + 1);
    int r = connect(c->fd, (struct sockaddr *)&sa, sizeof sa);
    if (r == 0)
        return conn_connect_done(c, e);
    *e = errno;
    if (*e == EINPROGRESS || *e == EINTR) /* it goes on without us: conn_connect_done says */
        return 1;
    close(c->fd);
    c->fd = -1;
    return -1;
}

int conn_connect_done(attnstat_client *c, int *e)
{
    struct pollfd p = {.fd = c->fd, .events = POLLOUT};
    if (poll(&p, 1, 0) == 0)
        return 1;
    int soerr = 0;
    socklen_t len = sizeof soerr;
    if (getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &soerr, &len) != 0)
        soerr = errno;
    if (soerr != 0) {
        *e = soerr;
        close(c->fd);
        c->fd = -1;
        return -1;
    }
    /* A new connection: nothing of the old one is left to send or to read. */
    c->closed = 0;
    c->why_closed[0] = '\0';
    c->oq_start = c->oq_end = 0;
    frame_reader_free(&c->rd);
    frame_reader_init(&c->rd, FRAME_MAX_DEFAULT);
    c->max_frame = FRAME_MAX_DEFAULT;
    return 0;
}

void conn_connect_why(int e, const char *path, char *buf, size_t len)
{
    if (e == ENOENT)
        snprintf(buf, len, "cannot connect to attnstatd at %s: no such socket (is attnstatd "
                 "running? pass its --socket path or set ATTNSTAT_SOCKET)", path);
    else if (e == ECONNREFUSED)
        snprintf(buf, len, "cannot connect to attnstatd at %s: connection refused (stale socket: "
                 "attnstatd is not running)", path);
    else if (e == EACCES || e == EPERM)
        snprintf(buf, len, "cannot connect to attnstatd at %s: permission denied (the socket is "
                 "mode 0660: join the daemon's group, or start it with --allow-group)", path);
    else if (e == EAGAIN)
        snprintf(buf, len, "cannot connect to attnstatd at %s: its listen backlog is full", path);
    else
        snprintf(buf, len, "cannot connect to attnstatd at %s: %s", path, strerror(e));
}

attnstat_code conn_open(attnstat_client *c, int *e_out, attnstat_error *err)
{
    /* The listen backlog may be full (EAGAIN): wait for room, up to the timeout. */
    int64_t deadline = util_now_ms() + c->timeout_ms;
    int e = 0, r;
    *e_out = 0;
    while ((r = conn_connect_start(c, &e)) < 0 && e == EAGAIN && util_now_ms() < deadline) {
        struct timespec ts = {0, 10 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    while (r == 1 && util_now_ms() < deadline) { /* under way: wait for it, up to the timeout */
        struct pollfd p = {.fd = c->fd, .events = POLLOUT};
        poll(&p, 1, conn_remaining(deadline));
        r = conn_connect_done(c, &e);
    }
    if (r == 0)
        return ATTNSTAT_OK;
    if (r == 1) {
        close(c->fd);
        c->fd = -1;
        e = ETIMEDOUT;
    }
    char why[400];
    conn_connect_why(e, c->sock_path, why, sizeof why);
    *e_out = e;
    return util_fail_error(err, ATTNSTAT_ECONNECT, "%s", why);
}

void conn_reset(attnstat_client *c)
{
    if (c->fd >= 0)
        close(c->fd);
    c->fd = -1;
    c->closed = 1;
    c->oq_start = c->oq_end = 0;
}

void conn_shutdown(attnstat_client *c)
{
    if (c->fd >= 0) {
        if (!c->closed)
            conn_pump_out(c);
        close(c->fd);
        c->fd = -1;
    }
    frame_reader_free(&c->rd);
    free(c->oq);
    c->oq = NULL;
}

/* ---- Closed connections ----------------------------------------------------------------------- */
void conn_mark_closed(attnstat_client *c, const char *why)
{
    if (!c->closed && c->last_conn_error[0]) {
        /* The daemon's last words were an Error about this connection (a refusal: too many
         * clients, permission, no Hello in time): the reason it ended. */
        char with[sizeof c->why_closed];
        snprintf(with, sizeof with, "attnstatd closed it after saying: %.150s", c->last_conn_error);
        c->last_conn_error[0] = '\0';
        conn_mark_closed(c, with);
        return;
    }
    if (!c->closed) {
        c->closed = 1;
        snprintf(c->why_closed, sizeof c->why_closed, "%s", why);
        snprintf(c->err, sizeof c->err, "connection to attnstatd at %s lost: %s", c->sock_path, why);
    }
}

attnstat_code conn_closed(attnstat_client *c)
{
    if (!c->err[0])
        snprintf(c->err, sizeof c->err, "connection to attnstatd at %s is closed: %s",
                 c->sock_path, c->why_closed[0] ? c->why_closed : "closed");
    return ATTNSTAT_ECLOSED;
}

static const char *conn_errno_text(int e)
{
    if (e == EPIPE || e == ECONNRESET)
        return "attnstatd closed the connection (it stopped, or refused this client: see its log)";
    return strerror(e);
}

/* ---- Outgoing bytes --------------------------------------------------------------------------- */
size_t conn_queued(const attnstat_client *c)
{
    return c->oq_end - c->oq_start;
}

int conn_pump_out(attnstat_client *c)
{
    while (!c->closed && c->oq_end > c->oq_start) {
        ssize_t n = send(c->fd, c->oq + c->oq_start, c->oq_end - c->oq_start,
                         MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK)
                return 0;
            conn_mark_closed(c, conn_errno_text(errno));
            return -1;
        }
        c->oq_start += (size_t)n;
    }
    if (c->oq_start == c->oq_end)
        c->oq_start = c->oq_end = 0;
    return c->closed ? -1 : 0;
}

static int conn_queue_append(attnstat_client *c, const uint8_t *p, size_t n)
{
    if (c->oq_start > 0 && c->oq_cap - c->oq_end < n) {
        memmove(c->oq, c->oq + c->oq_start, c->oq_end - c->oq_start);
        c->oq_end -= c->oq_start;
        c->oq_start = 0;
    }
    if (c->oq_cap - c->oq_end < n) {
        size_t cap = c->oq_cap ? c->oq_cap : 4096;
        while (cap - c->oq_end < n)
            cap *= 2;
        uint8_t *nb = realloc(c->oq, cap);
        if (!nb)
            return -1;
        c->oq = nb;
        c->oq_cap = cap;
    }
    memcpy(c->oq + c->oq_end, p, n);
    c->oq_end += n;
    return 0;
}

attnstat_code conn_send(attnstat_client *c, const Attnstat__Envelope *env, int droppable)
{
    if (c->closed)
        return ATTNSTAT_ECLOSED;
    if (conn_pump_out(c) != 0)
        return ATTNSTAT_ECLOSED;
    size_t len;
    uint8_t *buf = frame_pack(env, c->max_frame, &len);
    if (!buf)
        return client_fail(c, ATTNSTAT_ENOMEM,
                           "cannot encode the message: out of memory, or over the daemon's "
                           "maximum frame of %u bytes", c->max_frame);
    if (droppable && conn_queued(c) > 0 && conn_queued(c) + len > c->oq_limit) {
        free(buf);
        return ATTNSTAT_DROPPED;
    }
    size_t off = 0;
    if (conn_queued(c) == 0) {
        while (off < len) {
            ssize_t n = send(c->fd, buf + off, len - off, MSG_NOSIGNAL | MSG_DONTWAIT);
            if (n < 0) {
                if (errno == EINTR)
                    continue;
                if (errno == EAGAIN || errno == EWOULDBLOCK)
                    break;
                conn_mark_closed(c, conn_errno_text(errno));
                free(buf);
                return ATTNSTAT_ECLOSED;
            }
            off += (size_t)n;
        }
    }
    if (off < len && conn_queue_append(c, buf + off, len - off) != 0) {
        free(buf);
        /* A partly written frame cannot be abandoned without breaking the stream. */
        if (off > 0) {
            conn_mark_closed(c, "out of memory queueing the rest of a frame");
            return ATTNSTAT_ECLOSED;
        }
        return client_fail(c, ATTNSTAT_ENOMEM, "out of memory queueing a frame");
    }
    free(buf);
    return ATTNSTAT_OK;
}

/* ---- Incoming frames -------------------------------------------------------------------------- */
int conn_pump_in(attnstat_client *c)
{
    if (c->closed)
        return -1;
    for (;;) {
        size_t avail;
        uint8_t *dst = frame_reader_space(&c->rd, CONN_READ_CHUNK, &avail);
        if (!dst) {
            conn_mark_closed(c, "out of memory buffering the daemon's messages");
            return -1;
        }
        ssize_t n = recv(c->fd, dst, avail, MSG_DONTWAIT);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK)
                break;
            conn_mark_closed(c, conn_errno_text(errno));
            break;
        }
        if (n == 0) {
            conn_mark_closed(c, "attnstatd closed the connection");
            break;
        }
        frame_reader_commit(&c->rd, (size_t)n);
        if ((size_t)n < avail)
            break;
    }
    /* Hand on what arrived, even when the peer has gone: its last words may be an Error. */
    for (;;) {
        const uint8_t *payload;
        uint32_t len;
        char why[128];
        int r = frame_reader_next(&c->rd, &payload, &len, why, sizeof why);
        if (r == 0)
            break;
        if (r < 0) {
            char msg[200];
            snprintf(msg, sizeof msg, "bad frame from attnstatd: %s", why);
            conn_mark_closed(c, msg);
            return -1;
        }
        c->on_frame(c, payload, len);
        frame_reader_consume(&c->rd);
    }
    return c->closed ? -1 : 0;
}

int conn_wait_once(attnstat_client *c, int timeout_ms)
{
    if (c->closed)
        return -1;
    if (conn_pump_out(c) != 0)
        return -1;
    struct pollfd p = {.fd = c->fd, .events = POLLIN};
    if (conn_queued(c) > 0)
        p.events |= POLLOUT;
    int r = poll(&p, 1, timeout_ms);
    if (r < 0 && errno != EINTR) {
        conn_mark_closed(c, strerror(errno));
        return -1;
    }
    if (conn_pump_out(c) != 0)
        return -1;
    return conn_pump_in(c);
}

int conn_remaining(int64_t deadline)
{
    if (deadline < 0)
        return -1;
    int64_t left = deadline - util_now_ms();
    return left < 0 ? 0 : (int)(left > 1000000 ? 1000000 : left);
}
