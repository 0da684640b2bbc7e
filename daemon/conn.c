/* conn.c — one client connection (see conn.h). Stage: conn; calls proto/ (frame, envelope),
 * counters, util and log, and its handler.
 *
 * States: reading (uv_read_start active), paused (reading stopped because the outgoing queue is
 * over the cap; resumed below half of it), stopped (reading stopped for good: shutdown), eof (the
 * peer half-closed, kept open by the handler), shutting (uv_shutdown pending: the last writes are
 * going out), closing (uv_close called).
 *
 * Writes are gathered: conn_write() appends the frame to the connection's output buffer, and a
 * uv_prepare handle (started while the buffer holds bytes) hands the whole buffer to one uv_write
 * just before the loop polls again. A turn of the loop that answers many pushes of one client
 * (Releases, then a commit's Acks) thus costs one write(2) and one wake-up of the client, not one
 * per message; nothing waits longer than the current turn. Closing or shutting down hands the
 * buffer over first, so a last reply goes out as it did. */
#include "conn.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "envelope.h"
#include "frame.h"
#include "log.h"
#include "util.h"

#define CONN_READ_CHUNK (64 * 1024)

struct conn {
    uv_pipe_t pipe;
    uint64_t id;
    conn_limits lim;
    counters *cnt;
    conn_handler h;
    void *data;
    frame_reader rd;
    pid_t pid;
    uid_t uid;
    gid_t gid;
    size_t out_bytes;        /* queued (gathered or in write requests), not yet written */
    uint8_t *ob;             /* gathered frames, not yet handed to uv_write */
    size_t ob_len, ob_cap;
    uv_prepare_t flusher;    /* active while ob holds bytes */
    int handles;             /* libuv handles not yet closed (pipe, flusher) */
    int reading, paused, stopped, eof, shutting, closing;
    int linger;              /* after the last write: read and drop until the peer closes */
    uint64_t flush_since_ns; /* when shutting began */
    uint64_t opened_ns;      /* when it was accepted */
    uint64_t last_msg_ns;    /* when its last whole message was read (opened_ns before) */
    uint64_t partial_since_ns; /* when the first bytes of the frame being read arrived; 0: none */
    uint64_t msgs_dropped;
    uint64_t bytes_handed;   /* handed to uv_write, ever: what libuv still holds is not written */
    uint64_t tick_written;   /* bytes written at the last tick that saw them move */
    uint64_t stall_since_ns; /* since when nothing waiting was written (write_timeout_ns) */
    uv_shutdown_t shutdown_req;
};

typedef struct {
    uv_write_t req;
    conn *c;
    size_t len;
    uint8_t *buf;
} conn_wreq;

conn *conn_new(uv_loop_t *loop, uint64_t id, const conn_limits *lim, counters *cnt)
{
    conn *c = calloc(1, sizeof *c);
    if (!c) {
        LOG_ERROR("server", "out of memory accepting a connection");
        return NULL;
    }
    int rc = uv_pipe_init(loop, &c->pipe, 0);
    if (rc != 0) {
        LOG_ERROR("server", "uv_pipe_init: %s", uv_strerror(rc));
        free(c);
        return NULL;
    }
    c->pipe.data = c;
    uv_prepare_init(loop, &c->flusher); /* cannot fail */
    c->flusher.data = c;
    c->handles = 2;
    c->id = id;
    c->lim = *lim;
    c->cnt = cnt;
    c->opened_ns = c->last_msg_ns = util_mono_ns();
    frame_reader_init(&c->rd, lim->max_frame);
    return c;
}

uv_stream_t *conn_stream(conn *c)
{
    return (uv_stream_t *)&c->pipe;
}

int conn_adopt(conn *c, int fd)
{
    return uv_pipe_open(&c->pipe, fd);
}

void conn_set_handler(conn *c, const conn_handler *h, void *data)
{
    c->h = *h;
    c->data = data;
}

void *conn_data(const conn *c)
{
    return c->data;
}

void conn_set_peer(conn *c, pid_t pid, uid_t uid, gid_t gid)
{
    c->pid = pid;
    c->uid = uid;
    c->gid = gid;
}

uint64_t conn_id(const conn *c)
{
    return c->id;
}

pid_t conn_pid(const conn *c)
{
    return c->pid;
}

uid_t conn_uid(const conn *c)
{
    return c->uid;
}

int conn_is_open(const conn *c)
{
    return !c->closing && !c->shutting;
}

int conn_half_closed(const conn *c)
{
    return c->eof;
}

uint64_t conn_last_message_ns(const conn *c)
{
    return c->last_msg_ns;
}

/* ---- closing -------------------------------------------------------------------------------- */

static void conn_closed(uv_handle_t *h)
{
    conn *c = h->data;
    if (--c->handles > 0)
        return;
    if (c->h.on_closed)
        c->h.on_closed(c->data);
    frame_reader_free(&c->rd);
    free(c->ob);
    free(c);
}

static int flush_out(conn *c);

void conn_close(conn *c, const char *why)
{
    if (c->closing)
        return;
    flush_out(c); /* a last reply is tried at once, as an unbuffered write would have been */
    c->closing = 1;
    LOG_INFO("server", "client %llu (pid %d) closed: %s", (unsigned long long)c->id, (int)c->pid, why);
    if (c->h.on_close)
        c->h.on_close(c->data, c);
    uv_close((uv_handle_t *)&c->flusher, conn_closed);
    uv_close((uv_handle_t *)&c->pipe, conn_closed);
}

/* Lingering: the peer has our last reply and our end of the stream; what it still sends is read
 * and dropped until it closes (or CONN_FLUSH_NS is over), so that a peer busy writing finds the
 * socket open and reads the reply, instead of an EPIPE with no reason. */
static void linger_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
    static char sink[16384]; /* loop thread only; what lands here is never read */
    (void)h;
    (void)suggested;
    buf->base = sink;
    buf->len = sizeof sink;
}

static void linger_read(uv_stream_t *st, ssize_t nread, const uv_buf_t *buf)
{
    (void)buf;
    if (nread < 0)
        conn_close(st->data, "closed after its last reply");
}

static void shutdown_done(uv_shutdown_t *req, int status)
{
    conn *c = req->data;
    if (c->closing)
        return;
    if (status == 0 && c->linger && !c->eof &&
        uv_read_start((uv_stream_t *)&c->pipe, linger_alloc, linger_read) == 0) {
        c->reading = 0; /* not a reader of frames: the deadline of conn_tick() ends it */
        return;
    }
    conn_close(c, "closed after its last reply");
}

void conn_close_after_flush(conn *c, const char *why)
{
    if (c->closing || c->shutting)
        return;
    c->shutting = 1;
    if (c->reading) {
        uv_read_stop((uv_stream_t *)&c->pipe);
        c->reading = 0;
    }
    LOG_DEBUG("server", "client %llu: shutting down: %s", (unsigned long long)c->id, why);
    if (flush_out(c) != 0) {
        conn_close(c, why);
        return;
    }
    c->shutdown_req.data = c;
    c->flush_since_ns = util_mono_ns();
    int rc = uv_shutdown(&c->shutdown_req, (uv_stream_t *)&c->pipe, shutdown_done);
    if (rc != 0)
        conn_close(c, why);
}

void conn_refuse(conn *c, Attnstat__Code code, const char *msg, const char *why, int linger)
{
    if (c->closing || c->shutting)
        return;
    conn_send_error(c, code, msg, 0, 0);
    c->linger = linger;
    conn_close_after_flush(c, why);
}

static void frame_error(conn *c, const char *msg);

/* 1 when c has had replies waiting for write_timeout_ns of which nothing was written (its peer
 * does not read): then closed, said and counted. */
static int write_stalled(conn *c, uint64_t now_ns, uint64_t write_timeout_ns)
{
    uint64_t waiting = uv_stream_get_write_queue_size((uv_stream_t *)&c->pipe);
    uint64_t written = c->bytes_handed - waiting;
    if (waiting == 0 || written != c->tick_written || !c->stall_since_ns) {
        c->tick_written = written;
        c->stall_since_ns = now_ns;
        return 0;
    }
    if (!write_timeout_ns || now_ns - c->stall_since_ns <= write_timeout_ns)
        return 0;
    char why[200];
    snprintf(why, sizeof why, "it read none of its %llu bytes of replies waiting for %llu ms "
             "(write_timeout_ms %llu): its slot and memory freed",
             (unsigned long long)(waiting + c->ob_len),
             (unsigned long long)((now_ns - c->stall_since_ns) / 1000000ull),
             (unsigned long long)(write_timeout_ns / 1000000ull));
    counters_inc(c->cnt, CNT_CONNS_STALLED);
    LOG_WARN("server", "client %llu (pid %d uid %u): %s", (unsigned long long)c->id, (int)c->pid,
             (unsigned)c->uid, why);
    conn_close(c, why);
    return 1;
}

void conn_tick(conn *c, uint64_t now_ns, uint64_t frame_timeout_ns, uint64_t write_timeout_ns)
{
    if (c->closing)
        return;
    if (!c->shutting && write_stalled(c, now_ns, write_timeout_ns))
        return;
    if (c->shutting) {
        if (now_ns - c->flush_since_ns > CONN_FLUSH_NS)
            conn_close(c, c->linger ? "it did not close its end after our last reply"
                                    : "its last replies were not read in time");
        return;
    }
    if (c->reading && c->partial_since_ns && frame_timeout_ns &&
        now_ns - c->partial_since_ns > frame_timeout_ns) {
        char msg[200];
        snprintf(msg, sizeof msg, "a frame begun %llu ms ago is still incomplete (%zu bytes "
                 "buffered; frame_timeout_ms %llu): closing",
                 (unsigned long long)((now_ns - c->partial_since_ns) / 1000000ull),
                 c->rd.end - c->rd.start, (unsigned long long)(frame_timeout_ns / 1000000ull));
        frame_error(c, msg);
    }
}

/* ---- writing -------------------------------------------------------------------------------- */

static void write_done(uv_write_t *req, int status)
{
    conn_wreq *w = (conn_wreq *)req;
    conn *c = w->c;
    c->out_bytes -= w->len;
    free(w->buf);
    free(w);
    if (status < 0 && status != UV_ECANCELED && !c->closing) {
        char why[128];
        snprintf(why, sizeof why, "write failed: %s", uv_strerror(status));
        conn_close(c, why);
        return;
    }
    if (c->paused && !c->closing && !c->shutting && c->out_bytes < c->lim.out_queue_bytes / 2) {
        c->paused = 0;
        conn_read_start(c);
    }
}

/* The gathered frames go to one write request (uv_write writes at once what the socket takes).
 * 0, or a libuv error (the bytes are dropped; the caller closes the connection). */
static int flush_out(conn *c)
{
    if (uv_is_active((uv_handle_t *)&c->flusher))
        uv_prepare_stop(&c->flusher);
    if (c->ob_len == 0)
        return 0;
    conn_wreq *w = malloc(sizeof *w);
    if (!w) {
        c->out_bytes -= c->ob_len;
        c->ob_len = 0;
        return UV_ENOMEM;
    }
    w->c = c;
    w->len = c->ob_len;
    w->buf = c->ob;
    c->ob = NULL;
    c->ob_len = c->ob_cap = 0;
    uv_buf_t b = uv_buf_init((char *)w->buf, (unsigned)w->len);
    int rc = uv_write(&w->req, (uv_stream_t *)&c->pipe, &b, 1, write_done);
    if (rc != 0) {
        c->out_bytes -= w->len;
        free(w->buf);
        free(w);
        return rc;
    }
    c->bytes_handed += w->len;
    return 0;
}

/* The loop is about to poll: what this turn gathered goes out. */
static void on_flush(uv_prepare_t *h)
{
    conn *c = h->data;
    int rc = flush_out(c);
    if (rc != 0 && !c->closing) {
        char why[128];
        snprintf(why, sizeof why, "write failed: %s", uv_strerror(rc));
        conn_close(c, why);
    }
}

int conn_write(conn *c, const Attnstat__Envelope *env, int essential)
{
    if (c->closing || c->shutting)
        return -1;
    size_t len = 0;
    uint8_t *buf = frame_pack(env, c->lim.max_frame, &len);
    if (!buf) {
        LOG_WARN("server", "client %llu: a reply of type %d does not fit in max_frame %llu or memory "
                 "ran out", (unsigned long long)c->id, (int)env->msg_case,
                 (unsigned long long)c->lim.max_frame);
        return -1;
    }
    uint64_t cap = c->lim.out_queue_bytes;
    if (!essential && c->out_bytes + len > c->lim.sub_queue_bytes) {
        c->msgs_dropped++;
        counters_inc(c->cnt, CNT_MESSAGES_DROPPED);
        if (c->msgs_dropped == 1 || c->msgs_dropped % 1000 == 0)
            LOG_WARN("server", "client %llu does not read fast enough: %llu results/alerts dropped "
                     "(%zu bytes unsent, sub_queue_bytes %llu)", (unsigned long long)c->id,
                     (unsigned long long)c->msgs_dropped, c->out_bytes,
                     (unsigned long long)c->lim.sub_queue_bytes);
        free(buf);
        return -1;
    }
    if (c->out_bytes + len > 4 * cap) {
        free(buf);
        conn_close(c, "it does not read its socket (outgoing queue over 4x out_queue_bytes)");
        return -1;
    }
    if (c->ob_len + len > c->ob_cap) {
        size_t ncap = c->ob_cap ? c->ob_cap : 4096;
        while (ncap < c->ob_len + len)
            ncap *= 2;
        uint8_t *nb = realloc(c->ob, ncap);
        if (!nb) {
            free(buf);
            conn_close(c, "out of memory queueing a reply");
            return -1;
        }
        c->ob = nb;
        c->ob_cap = ncap;
    }
    memcpy(c->ob + c->ob_len, buf, len);
    free(buf);
    c->ob_len += len;
    if (!uv_is_active((uv_handle_t *)&c->flusher))
        uv_prepare_start(&c->flusher, on_flush);
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

void conn_send_error(conn *c, Attnstat__Code code, const char *msg, int has_ref, uint64_t ref)
{
    Attnstat__Error e;
    Attnstat__Envelope env;
    conn_write(c, envelope_error(&env, &e, code, msg, has_ref, ref), 1);
}

/* ---- reading -------------------------------------------------------------------------------- */

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
    (void)suggested;
    conn *c = h->data;
    size_t avail = 0;
    uint8_t *p = frame_reader_space(&c->rd, CONN_READ_CHUNK, &avail);
    buf->base = (char *)p;
    buf->len = p ? avail : 0;
}

static void frame_error(conn *c, const char *msg)
{
    counters_inc(c->cnt, CNT_FRAME_ERRORS);
    LOG_WARN("server", "client %llu (pid %d): framing error: %s", (unsigned long long)c->id,
             (int)c->pid, msg);
    conn_refuse(c, ATTNSTAT__CODE__FRAME, msg, "framing error", 1);
}

static void on_read(uv_stream_t *st, ssize_t nread, const uv_buf_t *buf)
{
    (void)buf;
    conn *c = st->data;
    if (nread == 0)
        return;
    if (nread < 0) {
        if (nread == UV_EOF && c->h.on_eof && c->h.on_eof(c->data, c)) {
            /* Half-closed with work to answer: the handler closes it once that is done. */
            uv_read_stop(st);
            c->reading = 0;
            c->eof = 1;
            return;
        }
        conn_close(c, nread == UV_EOF ? "disconnected" : uv_strerror((int)nread));
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
        if (r == 0) {
            /* Bytes of a frame not yet whole: the clock of frame_timeout_ms runs from the first. */
            if (c->rd.end == c->rd.start)
                c->partial_since_ns = 0;
            else if (!c->partial_since_ns)
                c->partial_since_ns = util_mono_ns();
            return;
        }
        if (r < 0) {
            frame_error(c, err);
            return;
        }
        Attnstat__Envelope *env = frame_decode_ex(payload, len, NULL, err, sizeof err);
        if (!env) { /* not protobuf, or a string with a NUL: err says which */
            frame_reader_consume(&c->rd);
            frame_error(c, err);
            return;
        }
        c->partial_since_ns = 0;
        c->last_msg_ns = util_mono_ns();
        if (c->h.on_message)
            c->h.on_message(c->data, c, env);
        attnstat__envelope__free_unpacked(env, NULL);
        if (!c->closing)
            frame_reader_consume(&c->rd);
    }
}

int conn_read_start(conn *c)
{
    if (c->reading || c->closing || c->shutting || c->eof || c->stopped)
        return 0;
    int rc = uv_read_start((uv_stream_t *)&c->pipe, on_alloc, on_read);
    if (rc != 0) {
        char why[128];
        snprintf(why, sizeof why, "uv_read_start: %s", uv_strerror(rc));
        conn_close(c, why);
        return -1;
    }
    c->reading = 1;
    return 0;
}

void conn_read_stop(conn *c)
{
    c->stopped = 1;
    if (c->reading) {
        uv_read_stop((uv_stream_t *)&c->pipe);
        c->reading = 0;
    }
}
