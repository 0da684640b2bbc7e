/* libclient.c — libattnstat's connection to attnstatd: the non-blocking socket, the hello and ring
 * registration, pushes of host tensors through the shared-memory ring, and the handling of the
 * daemon's replies (see include/attnstat.h for the promises).
 *
 * How a push stays non-blocking: replies already received are processed first (their Releases
 * free ring space), the tensors are copied into a ring block, and the Push frame is written with
 * MSG_DONTWAIT. What the socket does not take goes to a bounded outgoing queue, flushed on every
 * later call. A push that finds no ring block, no in-flight slot or no queue room is dropped and
 * counted: nothing here ever waits except hello, status and flush, which say so.
 *
 * CUDA tensors go through libgpu.c (zero-copy by IPC handle, or staged on the device); the push's
 * in-flight slot keeps what it holds (event, staging block, exported allocations) until the
 * daemon's Release, a non-OK Ack or the loss of the connection, which also call the release
 * callback once for pushes that referenced the caller's memory. */
#include "attnstat.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "frame.h"
#include "libgather.h"
#include "libgpu.h"
#include "libring.h"

#define CLIENT_RING_DEFAULT (64ull << 20)
#define CLIENT_QUEUE_DEFAULT (1ull << 20)
#define CLIENT_TIMEOUT_DEFAULT 5000
#define CLIENT_MAX_INFLIGHT 16384u /* power of two: the in-flight table is indexed by seq */
#define CLIENT_RING_ID 1u
#define CLIENT_READ_CHUNK 65536u
#define CLIENT_READ_FRAME_MAX (64u << 20) /* the daemon's max_frame is at most 64 MiB */

typedef struct {
    uint64_t seq; /* 0: free slot */
    int64_t step;
    uint32_t layer;
    uint8_t held;      /* the daemon reads the caller's memory (zero-copy CUDA) */
    uint8_t released;  /* Release (or its equivalent) handled */
    gpu_hold gh;       /* GPU resources of the push */
} client_inflight;

struct attnstat_client {
    int fd;
    int timeout_ms;
    int closed;            /* connection unusable */
    char why_closed[200];  /* and why */
    int hello_sent, hello_done;
    char sock_path[sizeof(((struct sockaddr_un *)0)->sun_path)];

    frame_reader rd;
    uint32_t max_frame;

    uint8_t *oq;           /* outgoing bytes [oq_start, oq_end) */
    size_t oq_start, oq_end, oq_cap, oq_limit;

    int shm_fd;
    int shm_linked;        /* name still exists in /dev/shm */
    char shm_name[64];
    uint8_t *map;
    uint64_t ring_bytes;
    ring ring;

    client_inflight *inflight; /* [CLIENT_MAX_INFLIGHT] */
    uint64_t next_seq;
    int64_t run_id;

    /* Replies a blocking call is waiting for. */
    int got_hello_reply;
    Attnstat__Envelope *status_env; /* the last StatusReply, owned */
    int wait_error;                 /* an Error arrived while waiting: its code */
    uint64_t wait_error_ref;
    int wait_error_has_ref;

    attnstat_counters st;
    char err[512];

    attnstat_alert_fn alert_fn;
    void *alert_user;
    attnstat_result_fn result_fn;
    void *result_user;
    attnstat_ack_fn ack_fn;
    void *ack_user;
    attnstat_release_fn release_fn;
    void *release_user;

    gpu_state *gpu;          /* made at the first CUDA push */
    int released_all;        /* the connection is lost and every push was released */
};

/* ---- Small helpers ---------------------------------------------------------------------------- */
__attribute__((format(printf, 3, 4))) static attnstat_code client_fail(attnstat_client *c,
                                                                      attnstat_code code,
                                                                      const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->err, sizeof c->err, fmt, ap);
    va_end(ap);
    return code;
}

__attribute__((format(printf, 3, 4))) static attnstat_code err_fail(attnstat_error *err,
                                                                   attnstat_code code,
                                                                   const char *fmt, ...)
{
    if (err) {
        err->code = code;
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err->msg, sizeof err->msg, fmt, ap);
        va_end(ap);
    }
    return code;
}

static int64_t client_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void client_copy_str(char *dst, size_t len, const char *src)
{
    snprintf(dst, len, "%s", src ? src : "");
}

const char *attnstat_strerror(attnstat_code code)
{
    switch (code) {
    case ATTNSTAT_OK: return "OK";
    case ATTNSTAT_DROPPED: return "DROPPED: the ring or the outgoing queue was full; the push was counted and skipped";
    case ATTNSTAT_EINVAL: return "EINVAL: invalid argument";
    case ATTNSTAT_ENOMEM: return "ENOMEM: out of memory";
    case ATTNSTAT_ECONNECT: return "ECONNECT: cannot connect to attnstatd";
    case ATTNSTAT_ECLOSED: return "ECLOSED: the connection to attnstatd is closed";
    case ATTNSTAT_EIO: return "EIO: a system call failed";
    case ATTNSTAT_EPROTO: return "EPROTO: unexpected or malformed message from attnstatd";
    case ATTNSTAT_EREFUSED: return "EREFUSED: attnstatd refused the request";
    case ATTNSTAT_ETIMEDOUT: return "ETIMEDOUT: attnstatd did not answer in time";
    case ATTNSTAT_ESTATE: return "ESTATE: call out of order";
    case ATTNSTAT_ENOTSUP: return "ENOTSUP: not supported by this build";
    }
    return "unknown attnstat code";
}

size_t attnstat_dtype_size(attnstat_dtype dtype)
{
    switch (dtype) {
    case ATTNSTAT_F32: return 4;
    case ATTNSTAT_F16: return 2;
    case ATTNSTAT_BF16: return 2;
    }
    return 0;
}

const char *attnstat_rule_name(int32_t rule)
{
    switch (rule) {
    case ATTNSTAT_RULE_ENTROPY_FLOOR: return "entropy_floor";
    case ATTNSTAT_RULE_ENTROPY_DROP: return "entropy_drop";
    case ATTNSTAT_RULE_LOGIT_CEILING: return "logit_ceiling";
    case ATTNSTAT_RULE_NONFINITE: return "nonfinite";
    }
    return "unknown";
}

const char *attnstat_state_name(int32_t state)
{
    switch (state) {
    case ATTNSTAT_ALERT_RAISED: return "raised";
    case ATTNSTAT_ALERT_CLEARED: return "cleared";
    }
    return "unknown";
}

void attnstat_tensor_init(attnstat_tensor *t, const void *data, attnstat_dtype dtype, int64_t b,
                          int64_t h, int64_t n, int64_t d)
{
    memset(t, 0, sizeof *t);
    t->data = data;
    t->dtype = dtype;
    t->mem = ATTNSTAT_MEM_HOST;
    t->shape[0] = b;
    t->shape[1] = h;
    t->shape[2] = n;
    t->shape[3] = d;
    t->strides[3] = 1;
    t->strides[2] = d;
    t->strides[1] = n * d;
    t->strides[0] = h * n * d;
}

void attnstat_push_opts_init(attnstat_push_opts *o)
{
    memset(o, 0, sizeof *o);
    o->window_left = -1;
    o->window_right = -1;
}

void attnstat_connect_opts_init(attnstat_connect_opts *o)
{
    memset(o, 0, sizeof *o);
}

void attnstat_thresholds_init(attnstat_thresholds *t)
{
    t->entropy_floor = NAN;
    t->entropy_drop = NAN;
    t->ema_alpha = NAN;
    t->logit_ceiling = NAN;
    t->collapse_threshold = NAN;
    t->raise_after = 0;
    t->clear_after = 0;
}

char *attnstat_default_socket(char *buf, size_t len)
{
    const char *env = getenv("ATTNSTAT_SOCKET");
    const char *xdg = getenv("XDG_RUNTIME_DIR");
    int n;
    if (env && *env)
        n = snprintf(buf, len, "%s", env);
    else if (xdg && *xdg)
        n = snprintf(buf, len, "%s/attnstat/attnstatd.sock", xdg);
    else
        n = snprintf(buf, len, "/run/attnstat/attnstatd.sock");
    return n >= 0 && (size_t)n < len ? buf : NULL;
}

/* ---- Connecting ------------------------------------------------------------------------------- */
attnstat_code attnstat_connect(const char *socket_path, attnstat_client **out, attnstat_error *err)
{
    attnstat_connect_opts o;
    attnstat_connect_opts_init(&o);
    o.socket_path = socket_path;
    return attnstat_connect_ex(&o, out, err);
}

attnstat_code attnstat_connect_ex(const attnstat_connect_opts *opts, attnstat_client **out,
                                  attnstat_error *err)
{
    if (err) {
        err->code = 0;
        err->msg[0] = '\0';
    }
    if (!out)
        return err_fail(err, ATTNSTAT_EINVAL, "attnstat_connect: out is NULL");
    *out = NULL;
    attnstat_connect_opts dflt;
    if (!opts) {
        attnstat_connect_opts_init(&dflt);
        opts = &dflt;
    }
    char path[sizeof(((struct sockaddr_un *)0)->sun_path)];
    if (opts->socket_path) {
        if (strlen(opts->socket_path) >= sizeof path)
            return err_fail(err, ATTNSTAT_EINVAL,
                            "socket path is too long (%zu bytes, at most %zu): %s",
                            strlen(opts->socket_path), sizeof path - 1, opts->socket_path);
        snprintf(path, sizeof path, "%s", opts->socket_path);
    } else if (!attnstat_default_socket(path, sizeof path)) {
        return err_fail(err, ATTNSTAT_EINVAL,
                        "the default socket path is too long: set ATTNSTAT_SOCKET to a shorter one");
    }
    if (opts->ring_bytes != 0 && opts->ring_bytes < 4096)
        return err_fail(err, ATTNSTAT_EINVAL, "ring_bytes %llu is too small (at least 4096)",
                        (unsigned long long)opts->ring_bytes);

    attnstat_client *c = calloc(1, sizeof *c);
    if (!c)
        return err_fail(err, ATTNSTAT_ENOMEM, "out of memory allocating the client");
    c->fd = -1;
    c->shm_fd = -1;
    c->run_id = -1;
    c->next_seq = 1;
    c->timeout_ms = opts->timeout_ms > 0 ? opts->timeout_ms : CLIENT_TIMEOUT_DEFAULT;
    c->ring_bytes = opts->ring_bytes ? opts->ring_bytes : CLIENT_RING_DEFAULT;
    c->oq_limit = opts->queue_bytes ? (size_t)opts->queue_bytes : CLIENT_QUEUE_DEFAULT;
    c->max_frame = FRAME_MAX_DEFAULT;
    snprintf(c->sock_path, sizeof c->sock_path, "%s", path);
    frame_reader_init(&c->rd, FRAME_MAX_DEFAULT);

    c->fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (c->fd < 0) {
        attnstat_code rc = err_fail(err, ATTNSTAT_EIO, "socket(AF_UNIX): %s", strerror(errno));
        attnstat_close(c);
        return rc;
    }
    struct sockaddr_un sa;
    memset(&sa, 0, sizeof sa);
    sa.sun_family = AF_UNIX;
    memcpy(sa.sun_path, path, strlen(path) + 1);
    int r;
    do
        r = connect(c->fd, (struct sockaddr *)&sa, sizeof sa);
    while (r < 0 && errno == EINTR);
    if (r < 0 && errno == EAGAIN) {
        /* The listen backlog is full: wait for room, up to the timeout. */
        int64_t deadline = client_now_ms() + c->timeout_ms;
        while (r < 0 && errno == EAGAIN && client_now_ms() < deadline) {
            struct timespec ts = {0, 10 * 1000 * 1000};
            nanosleep(&ts, NULL);
            r = connect(c->fd, (struct sockaddr *)&sa, sizeof sa);
        }
    }
    if (r < 0) {
        int e = errno;
        attnstat_code rc;
        if (e == ENOENT)
            rc = err_fail(err, ATTNSTAT_ECONNECT,
                          "cannot connect to attnstatd at %s: no such socket (is attnstatd running? "
                          "pass its --socket path or set ATTNSTAT_SOCKET)", path);
        else if (e == ECONNREFUSED)
            rc = err_fail(err, ATTNSTAT_ECONNECT,
                          "cannot connect to attnstatd at %s: connection refused (stale socket: "
                          "attnstatd is not running)", path);
        else if (e == EACCES || e == EPERM)
            rc = err_fail(err, ATTNSTAT_ECONNECT,
                          "cannot connect to attnstatd at %s: permission denied (the socket is "
                          "mode 0660: join the daemon's group, or start it with --allow-group)",
                          path);
        else
            rc = err_fail(err, ATTNSTAT_ECONNECT, "cannot connect to attnstatd at %s: %s", path,
                          strerror(e));
        attnstat_close(c);
        return rc;
    }
    *out = c;
    return ATTNSTAT_OK;
}

/* ---- Outgoing bytes --------------------------------------------------------------------------- */
static void client_mark_closed(attnstat_client *c, const char *why)
{
    if (!c->closed) {
        c->closed = 1;
        snprintf(c->why_closed, sizeof c->why_closed, "%s", why);
        snprintf(c->err, sizeof c->err, "connection to attnstatd at %s lost: %s", c->sock_path, why);
    }
}

/* ATTNSTAT_ECLOSED, with the reason the connection was marked closed kept in c->err. */
static attnstat_code client_closed(attnstat_client *c)
{
    if (!c->err[0])
        snprintf(c->err, sizeof c->err, "connection to attnstatd at %s is closed: %s",
                 c->sock_path, c->why_closed[0] ? c->why_closed : "closed");
    return ATTNSTAT_ECLOSED;
}

static const char *client_errno_text(int e)
{
    if (e == EPIPE || e == ECONNRESET)
        return "attnstatd closed the connection (it stopped, or refused this client: see its log)";
    return strerror(e);
}

static size_t client_oq_len(const attnstat_client *c)
{
    return c->oq_end - c->oq_start;
}

/* Writes as much of the queue as the socket takes now. Returns 0, or -1 when the connection
 * broke. */
static int client_pump_out(attnstat_client *c)
{
    while (!c->closed && c->oq_end > c->oq_start) {
        ssize_t n = send(c->fd, c->oq + c->oq_start, c->oq_end - c->oq_start,
                         MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK)
                return 0;
            client_mark_closed(c, client_errno_text(errno));
            return -1;
        }
        c->oq_start += (size_t)n;
    }
    if (c->oq_start == c->oq_end)
        c->oq_start = c->oq_end = 0;
    return c->closed ? -1 : 0;
}

static int client_oq_append(attnstat_client *c, const uint8_t *p, size_t n)
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

/* Sends one frame: written now as far as the socket takes it, the rest queued. droppable frames
 * (pushes) are refused with ATTNSTAT_DROPPED when the queue is over its bound; control frames are
 * always queued. */
static attnstat_code client_send(attnstat_client *c, const Attnstat__Envelope *env, int droppable)
{
    if (c->closed)
        return ATTNSTAT_ECLOSED;
    if (client_pump_out(c) != 0)
        return ATTNSTAT_ECLOSED;
    size_t len;
    uint8_t *buf = frame_pack(env, c->max_frame, &len);
    if (!buf)
        return client_fail(c, ATTNSTAT_ENOMEM,
                           "cannot encode the message: out of memory, or over the daemon's "
                           "maximum frame of %u bytes", c->max_frame);
    if (droppable && client_oq_len(c) > 0 && client_oq_len(c) + len > c->oq_limit) {
        free(buf);
        return ATTNSTAT_DROPPED;
    }
    size_t off = 0;
    if (client_oq_len(c) == 0) {
        while (off < len) {
            ssize_t n = send(c->fd, buf + off, len - off, MSG_NOSIGNAL | MSG_DONTWAIT);
            if (n < 0) {
                if (errno == EINTR)
                    continue;
                if (errno == EAGAIN || errno == EWOULDBLOCK)
                    break;
                client_mark_closed(c, client_errno_text(errno));
                free(buf);
                return ATTNSTAT_ECLOSED;
            }
            off += (size_t)n;
        }
    }
    if (off < len && client_oq_append(c, buf + off, len - off) != 0) {
        free(buf);
        /* A partly written frame cannot be abandoned without breaking the stream. */
        if (off > 0) {
            client_mark_closed(c, "out of memory queueing the rest of a frame");
            return ATTNSTAT_ECLOSED;
        }
        return client_fail(c, ATTNSTAT_ENOMEM, "out of memory queueing a frame");
    }
    free(buf);
    return ATTNSTAT_OK;
}

/* ---- Incoming messages ------------------------------------------------------------------------ */
static void client_set_last(attnstat_client *c, int code, const char *msg)
{
    c->st.last_code = code;
    client_copy_str(c->st.last_error, sizeof c->st.last_error, msg);
}

static void client_head_result(attnstat_head_result *o, const Attnstat__HeadStats *h)
{
    memset(o, 0, sizeof *o);
    o->head = h->head;
    o->rows = h->rows;
    o->rows_norm = h->rows_norm;
    o->rows_empty = h->rows_empty;
    o->nonfinite_rows = h->nonfinite_rows;
    o->sampled = h->has_sampled && h->sampled;
    o->entropy_mean = h->has_entropy_mean ? h->entropy_mean : NAN;
    o->entropy_std = h->has_entropy_std ? h->entropy_std : NAN;
    o->entropy_min = h->has_entropy_min ? h->entropy_min : NAN;
    o->entropy_max = h->has_entropy_max ? h->entropy_max : NAN;
    o->entropy_norm_mean = h->has_entropy_norm_mean ? h->entropy_norm_mean : NAN;
    o->collapsed_frac = h->has_collapsed_frac ? h->collapsed_frac : NAN;
    o->max_logit = h->has_max_logit ? h->max_logit : NAN;
}

static void client_deliver_results(attnstat_client *c, uint64_t seq, int64_t step, uint32_t layer,
                                   Attnstat__HeadStats **heads, size_t n)
{
    if (!c->result_fn || n == 0)
        return;
    attnstat_head_result *r = calloc(n, sizeof *r);
    if (!r)
        return; /* results are best effort; the counters are still right */
    for (size_t i = 0; i < n; i++)
        client_head_result(&r[i], heads[i]);
    c->result_fn(c->result_user, seq, step, layer, r, n);
    free(r);
}

/* The daemon no longer reads push f's memory: GPU resources back to their pools, and the release
 * callback for pushes that referenced the caller's memory. Once per push. */
static void client_release_slot(attnstat_client *c, client_inflight *f)
{
    if (f->released)
        return;
    f->released = 1;
    if (f->gh.dev >= 0) {
        gpu_release(c->gpu, f->seq, &f->gh);
        f->gh.dev = -1;
    }
    if (f->held) {
        f->held = 0;
        c->st.releases_pending--;
        if (c->release_fn)
            c->release_fn(c->release_user, f->seq);
    }
}

static client_inflight *client_slot(attnstat_client *c, uint64_t seq)
{
    client_inflight *f = c->inflight ? &c->inflight[seq & (CLIENT_MAX_INFLIGHT - 1)] : NULL;
    return f && seq != 0 && f->seq == seq ? f : NULL;
}

static void client_free_seq(attnstat_client *c, uint64_t seq)
{
    client_inflight *f = client_slot(c, seq);
    int counted = ring_release(&c->ring, seq) == 0;
    if (f && !f->released) {
        counted |= f->gh.dev >= 0;
        client_release_slot(c, f);
    }
    if (counted)
        c->st.released++;
}

/* The connection is gone: nothing will be read any more; every push is released (once). */
static void client_release_all(attnstat_client *c)
{
    if (!c->closed || c->released_all || !c->inflight)
        return;
    c->released_all = 1;
    for (uint32_t i = 0; i < CLIENT_MAX_INFLIGHT; i++)
        if (c->inflight[i].seq != 0)
            client_release_slot(c, &c->inflight[i]);
}

static void client_on_ack(attnstat_client *c, const Attnstat__Ack *a)
{
    client_inflight *f = c->inflight ? &c->inflight[a->seq & (CLIENT_MAX_INFLIGHT - 1)] : NULL;
    if (!f || f->seq != a->seq || a->seq == 0) {
        c->st.errors++;
        client_set_last(c, ATTNSTAT__CODE__INTERNAL, "attnstatd acknowledged an unknown push");
        return;
    }
    int64_t step = f->step;
    uint32_t layer = f->layer;
    client_release_slot(c, f); /* a non-OK Ack releases; after a Release this does nothing */
    f->seq = 0;
    c->st.in_flight--;
    /* A non-OK Ack releases without a Release; an OK Ack after its Release frees nothing. */
    ring_release(&c->ring, a->seq);
    if (a->code == ATTNSTAT__CODE__OK) {
        c->st.acked++;
        client_deliver_results(c, a->seq, step, layer, a->heads, a->n_heads);
        return;
    }
    if (a->code == ATTNSTAT__CODE__DROPPED)
        c->st.dropped_daemon++;
    else
        c->st.rejected++;
    char msg[256];
    snprintf(msg, sizeof msg, "push of step %lld layer %u: %s", (long long)step, layer,
             a->message && *a->message ? a->message : "refused by attnstatd");
    client_set_last(c, a->code, msg);
    if (c->ack_fn)
        c->ack_fn(c->ack_user, a->seq, step, layer, a->code, a->message ? a->message : "");
}

static void client_on_alert(attnstat_client *c, const Attnstat__Alert *a)
{
    c->st.alerts++;
    if (!c->alert_fn)
        return;
    attnstat_alert al;
    memset(&al, 0, sizeof al);
    al.run = a->run ? a->run : "";
    al.message = a->message ? a->message : "";
    al.run_id = a->run_id;
    al.rank = a->has_rank ? a->rank : 0;
    al.layer = a->layer;
    al.head = a->head;
    al.step = a->step;
    al.rule = a->rule;
    al.state = a->state;
    al.value = a->has_value ? a->value : NAN;
    al.threshold = a->has_threshold ? a->threshold : NAN;
    al.time_ms = a->has_time_ms ? a->time_ms : 0;
    c->alert_fn(c->alert_user, &al);
}

/* Handles one decoded message. Returns 1 when the envelope was kept (not to be freed). */
static int client_handle(attnstat_client *c, Attnstat__Envelope *env)
{
    switch (env->msg_case) {
    case ATTNSTAT__ENVELOPE__MSG_HELLO_REPLY:
        c->got_hello_reply = 1;
        c->run_id = env->hello_reply->run_id;
        if (env->hello_reply->max_frame >= 256 && env->hello_reply->max_frame < c->max_frame)
            c->max_frame = env->hello_reply->max_frame;
        /* Replies (StatusReply, Ack with results) may be as large as the daemon's max_frame:
         * read frames up to that (bounded by the largest max_frame a daemon accepts). */
        if (env->hello_reply->max_frame > c->rd.max_frame)
            c->rd.max_frame = env->hello_reply->max_frame < CLIENT_READ_FRAME_MAX
                                  ? env->hello_reply->max_frame
                                  : CLIENT_READ_FRAME_MAX;
        return 0;
    case ATTNSTAT__ENVELOPE__MSG_RELEASE:
        client_free_seq(c, env->release->seq);
        return 0;
    case ATTNSTAT__ENVELOPE__MSG_ACK:
        client_on_ack(c, env->ack);
        return 0;
    case ATTNSTAT__ENVELOPE__MSG_ALERT:
        client_on_alert(c, env->alert);
        return 0;
    case ATTNSTAT__ENVELOPE__MSG_RESULT:
        client_deliver_results(c, 0, env->result->step, env->result->layer, env->result->heads,
                               env->result->n_heads);
        return 0;
    case ATTNSTAT__ENVELOPE__MSG_STATUS_REPLY:
        if (c->status_env)
            attnstat__envelope__free_unpacked(c->status_env, NULL);
        c->status_env = env;
        return 1;
    case ATTNSTAT__ENVELOPE__MSG_ERROR:
        c->st.errors++;
        client_set_last(c, env->error->code, env->error->message);
        c->wait_error = env->error->code ? (int)env->error->code : -1;
        c->wait_error_has_ref = env->error->has_ref;
        c->wait_error_ref = env->error->ref;
        if (env->error->has_ref)
            gpu_on_refused(c->gpu, env->error->ref, env->error->message);
        return 0;
    default:
        return 0; /* messages meant for the daemon, or from a newer protocol: ignored */
    }
}

/* Reads what the socket has now and handles every complete frame. Returns 0, or -1 when the
 * connection is unusable (closed by the peer, broken framing). */
static int client_pump_in(attnstat_client *c)
{
    if (c->closed)
        return -1;
    for (;;) {
        size_t avail;
        uint8_t *dst = frame_reader_space(&c->rd, CLIENT_READ_CHUNK, &avail);
        if (!dst) {
            client_mark_closed(c, "out of memory buffering the daemon's messages");
            return -1;
        }
        ssize_t n = recv(c->fd, dst, avail, MSG_DONTWAIT);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK)
                break;
            client_mark_closed(c, client_errno_text(errno));
            break;
        }
        if (n == 0) {
            client_mark_closed(c, "attnstatd closed the connection");
            break;
        }
        frame_reader_commit(&c->rd, (size_t)n);
        if ((size_t)n < avail)
            break;
    }
    /* Handle what arrived, even when the peer has gone: its last words may be an Error. */
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
            client_mark_closed(c, msg);
            return -1;
        }
        Attnstat__Envelope *env = frame_decode(payload, len, NULL);
        frame_reader_consume(&c->rd);
        if (!env) {
            c->st.errors++;
            client_set_last(c, ATTNSTAT__CODE__FRAME, "undecodable message from attnstatd");
            continue;
        }
        if (!client_handle(c, env))
            attnstat__envelope__free_unpacked(env, NULL);
    }
    return c->closed ? -1 : 0;
}

/* Waits for the socket (readable, or writable while bytes are queued) for up to timeout_ms
 * (< 0: no limit), then pumps both ways. Returns 0, or -1 when the connection is unusable. */
static int client_wait_once(attnstat_client *c, int timeout_ms)
{
    if (c->closed)
        return -1;
    if (client_pump_out(c) != 0)
        return -1;
    struct pollfd p = {.fd = c->fd, .events = POLLIN};
    if (client_oq_len(c) > 0)
        p.events |= POLLOUT;
    int r = poll(&p, 1, timeout_ms);
    if (r < 0 && errno != EINTR) {
        client_mark_closed(c, strerror(errno));
        return -1;
    }
    if (client_pump_out(c) != 0)
        return -1;
    return client_pump_in(c);
}

static int client_remaining(int64_t deadline)
{
    if (deadline < 0)
        return -1;
    int64_t left = deadline - client_now_ms();
    return left < 0 ? 0 : (int)(left > 1000000 ? 1000000 : left);
}

/* ---- Hello and the ring ----------------------------------------------------------------------- */
static attnstat_code client_make_ring(attnstat_client *c)
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
    if (ftruncate(c->shm_fd, (off_t)c->ring_bytes) != 0)
        return client_fail(c, ATTNSTAT_EIO, "ftruncate(%s, %llu bytes): %s", c->shm_name,
                           (unsigned long long)c->ring_bytes, strerror(errno));
    void *m = mmap(NULL, c->ring_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, c->shm_fd, 0);
    if (m == MAP_FAILED)
        return client_fail(c, ATTNSTAT_EIO, "mmap of the %llu-byte ring %s: %s (lower ring_bytes?)",
                           (unsigned long long)c->ring_bytes, c->shm_name, strerror(errno));
    c->map = m;
    if (ring_init(&c->ring, c->ring_bytes, CLIENT_MAX_INFLIGHT) != 0)
        return client_fail(c, ATTNSTAT_EINVAL, "ring size is 0");
    c->inflight = calloc(CLIENT_MAX_INFLIGHT, sizeof *c->inflight);
    if (!c->inflight)
        return client_fail(c, ATTNSTAT_ENOMEM, "out of memory for the in-flight table");
    c->st.ring_bytes = c->ring_bytes;
    return ATTNSTAT_OK;
}

/* Waits until *flag is set, an Error arrives, the connection breaks or the timeout passes. */
static attnstat_code client_wait_for(attnstat_client *c, const int *flag, const char *what)
{
    int64_t deadline = client_now_ms() + c->timeout_ms;
    while (!*flag) {
        if (c->wait_error)
            return client_fail(c, ATTNSTAT_EREFUSED, "attnstatd refused the %s: %s", what,
                               c->st.last_error);
        if (c->closed)
            return client_fail(c, ATTNSTAT_ECLOSED, "attnstatd closed the connection during the "
                               "%s%s%s", what, c->st.last_error[0] ? ": " : "", c->st.last_error);
        int left = client_remaining(deadline);
        if (left == 0)
            return client_fail(c, ATTNSTAT_ETIMEDOUT,
                               "attnstatd at %s did not answer the %s within %d ms", c->sock_path,
                               what, c->timeout_ms);
        client_wait_once(c, left);
    }
    return ATTNSTAT_OK;
}

static int client_have_status(const attnstat_client *c)
{
    return c->status_env != NULL;
}

attnstat_code attnstat_hello(attnstat_client *c, const char *run, int32_t rank,
                             const attnstat_thresholds *th, const char *config_json)
{
    return attnstat_hello_ex(c, run, rank, th, config_json, NULL, 0);
}

attnstat_code attnstat_hello_ex(attnstat_client *c, const char *run, int32_t rank,
                                const attnstat_thresholds *th, const char *config_json,
                                const char *const *device_uuids, int32_t n_devices)
{
    if (!c)
        return ATTNSTAT_EINVAL;
    c->err[0] = '\0';
    if (n_devices < 0 || n_devices > 64 || (n_devices > 0 && !device_uuids))
        return client_fail(c, ATTNSTAT_EINVAL, "n_devices is %d: must be 0..64, with device_uuids "
                           "given when > 0", n_devices);
    for (int32_t i = 0; i < n_devices; i++)
        if (!device_uuids[i] || strlen(device_uuids[i]) == 0 || strlen(device_uuids[i]) > 63)
            return client_fail(c, ATTNSTAT_EINVAL, "device_uuids[%d] must be a UUID such as "
                               "\"GPU-xxxxxxxx-...\" (attnstat_cuda_device_uuid)", i);
    if (c->hello_sent)
        return client_fail(c, ATTNSTAT_ESTATE, "attnstat_hello was already called on this client");
    if (c->closed)
        return client_fail(c, ATTNSTAT_ECLOSED, "the connection is closed");
    if (run && strlen(run) > 200)
        return client_fail(c, ATTNSTAT_EINVAL, "run name is %zu bytes long (at most 200)",
                           strlen(run));
    c->hello_sent = 1;

    Attnstat__Thresholds t = ATTNSTAT__THRESHOLDS__INIT;
    if (th) {
#define TH_D(f)                                                                                    \
    if (!isnan(th->f)) {                                                                           \
        t.has_##f = 1;                                                                             \
        t.f = th->f;                                                                               \
    }
        TH_D(entropy_floor) TH_D(entropy_drop) TH_D(ema_alpha) TH_D(logit_ceiling)
        TH_D(collapse_threshold)
#undef TH_D
        if (th->raise_after) {
            t.has_raise_after = 1;
            t.raise_after = th->raise_after;
        }
        if (th->clear_after) {
            t.has_clear_after = 1;
            t.clear_after = th->clear_after;
        }
    }
    char host[256];
    if (gethostname(host, sizeof host) != 0)
        snprintf(host, sizeof host, "unknown");
    host[sizeof host - 1] = '\0';

    Attnstat__Hello h = ATTNSTAT__HELLO__INIT;
    h.protocol_version = FRAME_PROTOCOL_VERSION;
    h.run = (char *)run;
    h.has_rank = 1;
    h.rank = rank;
    h.has_pid = 1;
    h.pid = (int32_t)getpid();
    h.host = host;
    h.thresholds = th ? &t : NULL;
    h.config = (char *)config_json;
    h.n_device_uuids = (size_t)n_devices;
    h.device_uuids = (char **)device_uuids;
    Attnstat__Envelope env = ATTNSTAT__ENVELOPE__INIT;
    env.msg_case = ATTNSTAT__ENVELOPE__MSG_HELLO;
    env.hello = &h;
    c->wait_error = 0;
    attnstat_code rc = client_send(c, &env, 0);
    if (rc != ATTNSTAT_OK)
        return rc == ATTNSTAT_ECLOSED ? client_closed(c) : rc;
    rc = client_wait_for(c, &c->got_hello_reply, "hello");
    if (rc != ATTNSTAT_OK)
        return rc;

    rc = client_make_ring(c);
    if (rc != ATTNSTAT_OK)
        return rc;
    Attnstat__RegisterBuffer rb = ATTNSTAT__REGISTER_BUFFER__INIT;
    rb.id = CLIENT_RING_ID;
    rb.kind = ATTNSTAT__BUFFER_KIND__HOST_SHM;
    rb.size = c->ring_bytes;
    rb.shm_name = c->shm_name;
    env.msg_case = ATTNSTAT__ENVELOPE__MSG_REGISTER_BUFFER;
    env.register_buffer = &rb;
    if ((rc = client_send(c, &env, 0)) != ATTNSTAT_OK)
        return rc;
    /* RegisterBuffer has no reply of its own: a Status behind it answers only after the daemon has
     * handled the registration, so an Error for the ring, if any, arrives first. */
    Attnstat__Status s = ATTNSTAT__STATUS__INIT;
    env.msg_case = ATTNSTAT__ENVELOPE__MSG_STATUS;
    env.status = &s;
    if ((rc = client_send(c, &env, 0)) != ATTNSTAT_OK)
        return rc;
    if (c->status_env) {
        attnstat__envelope__free_unpacked(c->status_env, NULL);
        c->status_env = NULL;
    }
    int64_t deadline = client_now_ms() + c->timeout_ms;
    while (!c->status_env && !c->wait_error && !c->closed) {
        int left = client_remaining(deadline);
        if (left == 0)
            return client_fail(c, ATTNSTAT_ETIMEDOUT,
                               "attnstatd did not confirm the shared-memory ring within %d ms",
                               c->timeout_ms);
        client_wait_once(c, left);
    }
    if (c->wait_error)
        return client_fail(c, ATTNSTAT_EREFUSED,
                           "attnstatd refused the shared-memory ring %s (%llu bytes): %s",
                           c->shm_name, (unsigned long long)c->ring_bytes, c->st.last_error);
    if (!c->status_env)
        return client_closed(c);
    /* The daemon has mapped the ring (it maps at registration, and answered the Status behind it):
     * the name can go now, so a trainer that dies leaves nothing behind in /dev/shm. */
    if (shm_unlink(c->shm_name) == 0)
        c->shm_linked = 0;
    c->hello_done = 1;
    return ATTNSTAT_OK;
}

int64_t attnstat_run_id(const attnstat_client *c)
{
    return c && c->hello_done ? c->run_id : -1;
}

/* ---- Push ------------------------------------------------------------------------------------- */
static attnstat_code client_check_tensor(attnstat_client *c, const attnstat_tensor *t,
                                         const char *name)
{
    if (!t)
        return client_fail(c, ATTNSTAT_EINVAL, "%s is NULL", name);
    if (t->mem != ATTNSTAT_MEM_HOST && t->mem != ATTNSTAT_MEM_CUDA)
        return client_fail(c, ATTNSTAT_EINVAL, "%s has an unknown memory kind %d", name, t->mem);
    if (attnstat_dtype_size((attnstat_dtype)t->dtype) == 0)
        return client_fail(c, ATTNSTAT_EINVAL, "%s has an unknown dtype %d (f32=0, f16=1, bf16=2)",
                           name, t->dtype);
    if (!t->data)
        return client_fail(c, ATTNSTAT_EINVAL, "%s has a NULL data pointer", name);
    static const char dims[] = "BHND";
    for (int i = 0; i < 4; i++) {
        if (t->shape[i] < 1 || t->shape[i] > INT32_MAX)
            return client_fail(c, ATTNSTAT_EINVAL, "%s shape[%d] (%c) is %lld: must be 1..%d", name,
                               i, dims[i], (long long)t->shape[i], INT32_MAX);
        if (t->strides[i] < 0)
            return client_fail(c, ATTNSTAT_EINVAL, "%s strides[%d] (%c) is negative (%lld)", name,
                               i, dims[i], (long long)t->strides[i]);
    }
    if (t->strides[3] != 1)
        return client_fail(c, ATTNSTAT_EINVAL,
                           "%s strides[3] is %lld: the head dimension D must be contiguous (1)",
                           name, (long long)t->strides[3]);
    return ATTNSTAT_OK;
}

static attnstat_code client_check_push(attnstat_client *c, const attnstat_push_opts *o,
                                       const attnstat_tensor *q, const attnstat_tensor *k,
                                       const attnstat_tensor *v)
{
    attnstat_code rc;
    if (!o)
        return client_fail(c, ATTNSTAT_EINVAL, "push options are NULL");
    if ((rc = client_check_tensor(c, q, "q")) || (rc = client_check_tensor(c, k, "k")))
        return rc;
    if (v && (rc = client_check_tensor(c, v, "v")))
        return rc;
    if (k->mem != q->mem || (v && v->mem != q->mem))
        return client_fail(c, ATTNSTAT_ENOTSUP,
                           "q is %s memory but %s is %s memory: the tensors of one push must be all "
                           "in CUDA memory or all in host memory",
                           q->mem == ATTNSTAT_MEM_CUDA ? "CUDA" : "host", k->mem != q->mem ? "k" : "v",
                           q->mem == ATTNSTAT_MEM_CUDA ? "host" : "CUDA");
    if (q->dtype != k->dtype)
        return client_fail(c, ATTNSTAT_EINVAL, "q and k have different dtypes (%d and %d)",
                           q->dtype, k->dtype);
    if (q->shape[0] != k->shape[0])
        return client_fail(c, ATTNSTAT_EINVAL, "q and k batch sizes differ (%lld and %lld)",
                           (long long)q->shape[0], (long long)k->shape[0]);
    if (q->shape[3] != k->shape[3])
        return client_fail(c, ATTNSTAT_EINVAL, "q and k head dimensions differ (%lld and %lld)",
                           (long long)q->shape[3], (long long)k->shape[3]);
    if (q->shape[1] % k->shape[1] != 0)
        return client_fail(c, ATTNSTAT_EINVAL,
                           "q heads (%lld) are not a multiple of k heads (%lld)",
                           (long long)q->shape[1], (long long)k->shape[1]);
    if (v && (v->shape[0] != k->shape[0] || v->shape[1] != k->shape[1] ||
              v->shape[2] != k->shape[2]))
        return client_fail(c, ATTNSTAT_EINVAL, "v's B, H and N must equal k's");
    if (o->causal != 0 && o->causal != 1)
        return client_fail(c, ATTNSTAT_EINVAL, "causal is %d: must be 0 or 1", o->causal);
    if (o->causal && o->window_right > 0)
        return client_fail(c, ATTNSTAT_EINVAL,
                           "causal with window_right %d > 0 contradicts itself", o->window_right);
    if (!isfinite(o->scale) || o->scale < 0 || !isfinite(o->softcap) || o->softcap < 0)
        return client_fail(c, ATTNSTAT_EINVAL, "scale and softcap must be finite and >= 0");
    if (o->sample_every > 1 && o->sample_rows > 0)
        return client_fail(c, ATTNSTAT_EINVAL, "sample_every and sample_rows are exclusive");
    if (!o->cu_seqlens_q != !o->cu_seqlens_k)
        return client_fail(c, ATTNSTAT_EINVAL, "cu_seqlens_q and cu_seqlens_k go together");
    if (o->cu_seqlens_q) {
        if (o->n_seqs < 1 || o->n_seqs > 1000000)
            return client_fail(c, ATTNSTAT_EINVAL, "n_seqs is %d: must be 1..1000000", o->n_seqs);
        if (q->shape[0] != 1)
            return client_fail(c, ATTNSTAT_EINVAL, "packed sequences need batch 1 (q has %lld)",
                               (long long)q->shape[0]);
        const int32_t *cu[2] = {o->cu_seqlens_q, o->cu_seqlens_k};
        const int64_t total[2] = {q->shape[2], k->shape[2]};
        for (int s = 0; s < 2; s++) {
            if (cu[s][0] != 0 || cu[s][o->n_seqs] != total[s])
                return client_fail(c, ATTNSTAT_EINVAL,
                                   "cu_seqlens_%c must start at 0 and end at %lld (N of %c)",
                                   s ? 'k' : 'q', (long long)total[s], s ? 'k' : 'q');
            for (int32_t i = 0; i < o->n_seqs; i++)
                if (cu[s][i + 1] < cu[s][i])
                    return client_fail(c, ATTNSTAT_EINVAL, "cu_seqlens_%c decreases at %d",
                                       s ? 'k' : 'q', i + 1);
        }
    }
    return ATTNSTAT_OK;
}

static void client_tensor_ref(Attnstat__TensorRef *r, uint64_t *shape, uint64_t *strides,
                              const attnstat_tensor *t, const gather_plan *plan, uint64_t off)
{
    attnstat__tensor_ref__init(r);
    r->buffer_id = CLIENT_RING_ID;
    r->offset = off;
    r->dtype = (Attnstat__Dtype)t->dtype;
    for (int i = 0; i < 4; i++) {
        shape[i] = (uint64_t)t->shape[i];
        strides[i] = (uint64_t)plan->strides[i];
    }
    r->n_shape = 4;
    r->shape = shape;
    r->n_strides = 4;
    r->strides = strides;
}

static attnstat_code client_drop(attnstat_client *c, int ring_full)
{
    c->st.dropped_local++;
    if (ring_full)
        c->st.dropped_ring++;
    else
        c->st.dropped_queue++;
    snprintf(c->err, sizeof c->err, "push dropped: %s",
             ring_full ? "no room in the shared-memory ring (the daemon has not released earlier "
                         "pushes yet)"
                       : "the outgoing queue is full (the daemon is not reading)");
    return ATTNSTAT_DROPPED;
}

static uint64_t client_align(uint64_t n)
{
    return (n + RING_ALIGN - 1) / RING_ALIGN * RING_ALIGN;
}

/* The Push fields that come from the options. */
static void client_fill_push(Attnstat__Push *p, const attnstat_push_opts *o, uint64_t seq)
{
    p->seq = seq;
    p->step = o->step;
    p->layer = o->layer;
    p->has_causal = o->causal != 0;
    p->causal = o->causal != 0;
    p->has_window_left = o->window_left >= 0;
    p->window_left = o->window_left;
    p->has_window_right = o->window_right >= 0;
    p->window_right = o->window_right;
    p->has_softcap = o->softcap != 0;
    p->softcap = o->softcap;
    p->has_scale = o->scale != 0;
    p->scale = o->scale;
    if (o->cu_seqlens_q) {
        p->n_cu_seqlens_q = p->n_cu_seqlens_k = (size_t)o->n_seqs + 1;
        p->cu_seqlens_q = (int32_t *)o->cu_seqlens_q;
        p->cu_seqlens_k = (int32_t *)o->cu_seqlens_k;
    }
    p->has_sample_every = o->sample_every > 1;
    p->sample_every = o->sample_every;
    p->has_sample_rows = o->sample_rows > 0;
    p->sample_rows = o->sample_rows;
    p->has_sample_seed = o->sample_rows > 0;
    p->sample_seed = o->sample_seed;
    p->has_want_results = o->want_results != 0;
    p->want_results = o->want_results != 0;
}

static attnstat_code client_emit(void *ctx, const Attnstat__Envelope *env)
{
    return client_send(ctx, env, 0);
}

static attnstat_code client_push_cuda(attnstat_client *c, const attnstat_push_opts *o,
                                      const attnstat_tensor *const *ts, int nt, uint64_t seq,
                                      client_inflight *slot, uint64_t *seq_out);

attnstat_code attnstat_push(attnstat_client *c, const attnstat_push_opts *o,
                            const attnstat_tensor *q, const attnstat_tensor *k,
                            const attnstat_tensor *v)
{
    return attnstat_push_ex(c, o, q, k, v, NULL);
}

attnstat_code attnstat_push_ex(attnstat_client *c, const attnstat_push_opts *o,
                               const attnstat_tensor *q, const attnstat_tensor *k,
                               const attnstat_tensor *v, uint64_t *seq_out)
{
    if (seq_out)
        *seq_out = 0;
    if (!c)
        return ATTNSTAT_EINVAL;
    c->err[0] = '\0';
    attnstat_code rc = client_check_push(c, o, q, k, v);
    if (rc != ATTNSTAT_OK)
        return rc;
    int cuda = q->mem == ATTNSTAT_MEM_CUDA;
    if (cuda) {
        if (!c->gpu && gpu_built())
            c->gpu = gpu_new();
        if ((rc = gpu_available(c->gpu, c->err, sizeof c->err)) != ATTNSTAT_OK)
            return rc;
    }
    if (!c->hello_done)
        return client_fail(c, ATTNSTAT_ESTATE, "push before a successful attnstat_hello");
    c->st.pushed++;
    if (!c->closed) {
        client_pump_in(c);  /* Releases free ring space */
        client_pump_out(c);
    }
    if (c->closed) {
        c->st.dropped_local++;
        client_release_all(c);
        return client_closed(c);
    }
    /* Cheap early test: a queue already over its bound drops before any copy. */
    if (client_oq_len(c) + 1024 > c->oq_limit && client_oq_len(c) > 0)
        return client_drop(c, 0);
    uint64_t seq = c->next_seq;
    client_inflight *slot = &c->inflight[seq & (CLIENT_MAX_INFLIGHT - 1)];
    if (slot->seq != 0)
        return client_drop(c, 0); /* CLIENT_MAX_INFLIGHT pushes unacknowledged */
    /* From here on the push owns seq whatever happens: a push that fails after allocating ring
     * space (host or staged device ring) must never leave its seq to the next push, or two blocks
     * would share it and a Release would find the wrong one. */
    c->next_seq++;

    const attnstat_tensor *ts[3] = {q, k, v};
    if (cuda)
        return client_push_cuda(c, o, ts, v ? 3 : 2, seq, slot, seq_out);
    gather_plan plans[3];
    uint64_t offs[3] = {0, 0, 0}, total = 0;
    int nt = v ? 3 : 2;
    for (int i = 0; i < nt; i++) {
        size_t es = attnstat_dtype_size((attnstat_dtype)ts[i]->dtype);
        if (gather_make_plan(ts[i]->shape, ts[i]->strides, es, &plans[i]) != 0 ||
            plans[i].bytes > c->ring_bytes)
            return client_fail(c, ATTNSTAT_EINVAL,
                               "%s is too large for the %llu-byte ring (raise ring_bytes or "
                               "sample fewer rows)", i == 0 ? "q" : i == 1 ? "k" : "v",
                               (unsigned long long)c->ring_bytes);
        offs[i] = total;
        total += client_align(plans[i].bytes);
    }
    if (total > c->ring_bytes)
        return client_fail(c, ATTNSTAT_EINVAL,
                           "q, k and v need %llu bytes, more than the %llu-byte ring (raise "
                           "ring_bytes)", (unsigned long long)total,
                           (unsigned long long)c->ring_bytes);
    uint64_t base;
    int ar = ring_alloc(&c->ring, total, seq, &base);
    if (ar == 1)
        return client_drop(c, 1);
    if (ar < 0)
        return client_fail(c, ATTNSTAT_ENOMEM, "out of memory for ring bookkeeping");
    for (int i = 0; i < nt; i++) {
        offs[i] += base;
        gather_copy(c->map + offs[i], ts[i]->data, ts[i]->shape, ts[i]->strides,
                    attnstat_dtype_size((attnstat_dtype)ts[i]->dtype), &plans[i]);
    }

    Attnstat__TensorRef refs[3];
    uint64_t shapes[3][4], strides[3][4];
    for (int i = 0; i < nt; i++)
        client_tensor_ref(&refs[i], shapes[i], strides[i], ts[i], &plans[i], offs[i]);
    Attnstat__Push p = ATTNSTAT__PUSH__INIT;
    client_fill_push(&p, o, seq);
    p.q = &refs[0];
    p.k = &refs[1];
    p.v = v ? &refs[2] : NULL;
    Attnstat__Envelope env = ATTNSTAT__ENVELOPE__INIT;
    env.msg_case = ATTNSTAT__ENVELOPE__MSG_PUSH;
    env.push = &p;

    rc = client_send(c, &env, 1);
    if (rc != ATTNSTAT_OK) {
        if (ring_abort_last(&c->ring, seq) != 0) /* its space is free again at once */
            ring_release(&c->ring, seq);
        if (rc == ATTNSTAT_DROPPED)
            return client_drop(c, 0);
        c->st.dropped_local++;
        if (rc == ATTNSTAT_ECLOSED)
            return client_closed(c);
        return rc;
    }
    slot->seq = seq;
    slot->step = o->step;
    slot->layer = o->layer;
    slot->held = 0;
    slot->released = 0;
    slot->gh.dev = -1;
    c->st.sent++;
    c->st.in_flight++;
    return ATTNSTAT_OK;
}

/* A push of CUDA tensors: libgpu resolves them (zero-copy or staged) and records the event; the
 * Push names the buffers and the event. */
static attnstat_code client_push_cuda(attnstat_client *c, const attnstat_push_opts *o,
                                      const attnstat_tensor *const *ts, int nt, uint64_t seq,
                                      client_inflight *slot, uint64_t *seq_out)
{
    gpu_loc loc[3];
    gpu_hold gh;
    uint32_t event_id = 0;
    int zero_copy = 0;
    attnstat_code rc = gpu_prepare(c->gpu, ts, nt, o->cuda_stream, seq, client_emit, c, loc,
                                   &event_id, &gh, &zero_copy, &c->st, c->err, sizeof c->err);
    if (rc != ATTNSTAT_OK) {
        if (rc == ATTNSTAT_DROPPED || rc == ATTNSTAT_ECLOSED)
            c->st.dropped_local++;
        if (rc == ATTNSTAT_ECLOSED) {
            client_release_all(c);
            return client_closed(c);
        }
        return rc;
    }
    Attnstat__TensorRef refs[3];
    uint64_t shapes[3][4], strides[3][4];
    for (int i = 0; i < nt; i++) {
        attnstat__tensor_ref__init(&refs[i]);
        refs[i].buffer_id = loc[i].buffer_id;
        refs[i].offset = loc[i].offset;
        refs[i].dtype = (Attnstat__Dtype)ts[i]->dtype;
        for (int j = 0; j < 4; j++) {
            shapes[i][j] = (uint64_t)ts[i]->shape[j];
            strides[i][j] = (uint64_t)ts[i]->strides[j];
        }
        refs[i].n_shape = refs[i].n_strides = 4;
        refs[i].shape = shapes[i];
        refs[i].strides = strides[i];
    }
    Attnstat__Push p = ATTNSTAT__PUSH__INIT;
    client_fill_push(&p, o, seq);
    p.q = &refs[0];
    p.k = &refs[1];
    p.v = nt > 2 ? &refs[2] : NULL;
    p.has_event_id = 1;
    p.event_id = event_id;
    Attnstat__Envelope env = ATTNSTAT__ENVELOPE__INIT;
    env.msg_case = ATTNSTAT__ENVELOPE__MSG_PUSH;
    env.push = &p;
    rc = client_send(c, &env, 1);
    if (rc != ATTNSTAT_OK) {
        gpu_release(c->gpu, seq, &gh);
        if (zero_copy)
            c->st.cuda_zero_copy--;
        else
            c->st.cuda_staged--;
        if (rc == ATTNSTAT_DROPPED)
            return client_drop(c, 0);
        c->st.dropped_local++;
        if (rc == ATTNSTAT_ECLOSED) {
            client_release_all(c);
            return client_closed(c);
        }
        return rc;
    }
    slot->seq = seq;
    slot->step = o->step;
    slot->layer = o->layer;
    slot->held = (uint8_t)(zero_copy != 0);
    slot->released = 0;
    slot->gh = gh;
    c->st.sent++;
    c->st.in_flight++;
    if (zero_copy) {
        c->st.releases_pending++;
        if (seq_out)
            *seq_out = seq;
    }
    return ATTNSTAT_OK;
}

/* ---- Polling, flushing, status ---------------------------------------------------------------- */
void attnstat_set_alert_callback(attnstat_client *c, attnstat_alert_fn fn, void *user)
{
    if (c) {
        c->alert_fn = fn;
        c->alert_user = user;
    }
}

void attnstat_set_result_callback(attnstat_client *c, attnstat_result_fn fn, void *user)
{
    if (c) {
        c->result_fn = fn;
        c->result_user = user;
    }
}

void attnstat_set_ack_callback(attnstat_client *c, attnstat_ack_fn fn, void *user)
{
    if (c) {
        c->ack_fn = fn;
        c->ack_user = user;
    }
}

void attnstat_set_release_callback(attnstat_client *c, attnstat_release_fn fn, void *user)
{
    if (c) {
        c->release_fn = fn;
        c->release_user = user;
    }
}

const char *attnstat_version(void)
{
    return gpu_built() ? ATTNSTAT_VERSION "+cuda" : ATTNSTAT_VERSION;
}

attnstat_code attnstat_cuda_device_uuid(int32_t device, char *buf, size_t len, attnstat_error *err)
{
    char msg[256];
    if (!buf)
        return err_fail(err, ATTNSTAT_EINVAL, "attnstat_cuda_device_uuid: buf is NULL");
    attnstat_code rc = gpu_device_uuid(device, buf, len, msg, sizeof msg);
    if (rc != ATTNSTAT_OK)
        return err_fail(err, rc, "%s", msg);
    if (err) {
        err->code = 0;
        err->msg[0] = '\0';
    }
    return ATTNSTAT_OK;
}

attnstat_code attnstat_subscribe(attnstat_client *c, int alerts, int results)
{
    if (!c)
        return ATTNSTAT_EINVAL;
    c->err[0] = '\0';
    Attnstat__Subscribe s = ATTNSTAT__SUBSCRIBE__INIT;
    s.has_alerts = 1;
    s.alerts = alerts != 0;
    s.has_results = 1;
    s.results = results != 0;
    Attnstat__Envelope env = ATTNSTAT__ENVELOPE__INIT;
    env.msg_case = ATTNSTAT__ENVELOPE__MSG_SUBSCRIBE;
    env.subscribe = &s;
    attnstat_code rc = client_send(c, &env, 0);
    return rc == ATTNSTAT_ECLOSED ? client_closed(c) : rc;
}

attnstat_code attnstat_poll(attnstat_client *c, int timeout_ms)
{
    if (!c)
        return ATTNSTAT_EINVAL;
    if (client_wait_once(c, timeout_ms) != 0) {
        client_release_all(c);
        return client_closed(c);
    }
    return ATTNSTAT_OK;
}

attnstat_code attnstat_flush(attnstat_client *c, int timeout_ms)
{
    if (!c)
        return ATTNSTAT_EINVAL;
    int64_t deadline = timeout_ms < 0 ? -1 : client_now_ms() + timeout_ms;
    for (;;) {
        if (c->closed) {
            client_pump_in(c);
            client_release_all(c);
        {
            char why[sizeof c->err];
            snprintf(why, sizeof why, "%s", c->err[0] ? c->err : "connection closed");
            return client_fail(c, ATTNSTAT_ECLOSED, "%llu pushes unacknowledged: %s",
                               (unsigned long long)c->st.in_flight, why);
        }
        }
        if (c->st.in_flight == 0 && client_oq_len(c) == 0)
            return ATTNSTAT_OK;
        int left = client_remaining(deadline);
        if (left == 0)
            return client_fail(c, ATTNSTAT_ETIMEDOUT,
                               "%llu pushes still unacknowledged after %d ms",
                               (unsigned long long)c->st.in_flight, timeout_ms);
        client_wait_once(c, left);
    }
}

void attnstat_stats(const attnstat_client *c, attnstat_counters *out)
{
    if (!c || !out)
        return;
    *out = c->st;
    out->ring_used = c->inflight ? ring_used(&c->ring) : 0;
    out->queue_bytes = client_oq_len(c);
    out->cuda_buffers = gpu_buffers(c->gpu);
}

attnstat_code attnstat_status(attnstat_client *c, attnstat_daemon_status *out, int timeout_ms)
{
    if (!c || !out)
        return c ? client_fail(c, ATTNSTAT_EINVAL, "status output is NULL") : ATTNSTAT_EINVAL;
    c->err[0] = '\0';
    if (c->status_env) {
        attnstat__envelope__free_unpacked(c->status_env, NULL);
        c->status_env = NULL;
    }
    Attnstat__Status s = ATTNSTAT__STATUS__INIT;
    Attnstat__Envelope env = ATTNSTAT__ENVELOPE__INIT;
    env.msg_case = ATTNSTAT__ENVELOPE__MSG_STATUS;
    env.status = &s;
    attnstat_code rc = client_send(c, &env, 0);
    if (rc != ATTNSTAT_OK)
        return rc == ATTNSTAT_ECLOSED ? client_closed(c) : rc;
    int saved = c->timeout_ms;
    if (timeout_ms > 0)
        c->timeout_ms = timeout_ms;
    c->wait_error = 0;
    rc = ATTNSTAT_OK;
    int64_t deadline = client_now_ms() + c->timeout_ms;
    while (!client_have_status(c)) {
        if (c->closed) {
            client_release_all(c);
            rc = client_closed(c);
            break;
        }
        int left = client_remaining(deadline);
        if (left == 0) {
            rc = client_fail(c, ATTNSTAT_ETIMEDOUT, "attnstatd did not answer Status within %d ms",
                             c->timeout_ms);
            break;
        }
        client_wait_once(c, left);
    }
    c->timeout_ms = saved;
    if (rc != ATTNSTAT_OK)
        return rc;
    const Attnstat__StatusReply *r = c->status_env->status_reply;
    memset(out, 0, sizeof *out);
    client_copy_str(out->daemon_version, sizeof out->daemon_version, r->daemon_version);
    client_copy_str(out->db_path, sizeof out->db_path, r->db_path);
    out->uptime_s = r->uptime_s;
    out->push_rate = r->push_rate;
    out->clients = r->clients;
    out->alerts_active = r->alerts_active;
    out->pushes = r->pushes;
    out->pushes_done = r->pushes_done;
    out->dropped = r->dropped;
    out->rejected = r->rejected;
    out->samples_stored = r->samples_stored;
    for (size_t i = 0; i < r->n_workers && i < ATTNSTAT_STATUS_MAX_WORKERS; i++) {
        const Attnstat__WorkerStatus *w = r->workers[i];
        attnstat_worker_status *o = &out->workers[out->n_workers++];
        client_copy_str(o->name, sizeof o->name, w->name);
        o->queue_depth = w->queue_depth;
        o->queue_capacity = w->queue_capacity;
        o->processed = w->processed;
        o->dropped = w->dropped;
        o->busy_frac = w->has_busy_frac ? w->busy_frac : 0;
    }
    for (size_t i = 0; i < r->n_client_list && i < ATTNSTAT_STATUS_MAX_CLIENTS; i++) {
        const Attnstat__ClientStatus *cs = r->client_list[i];
        attnstat_client_status *o = &out->client_list[out->n_client_list++];
        o->id = cs->id;
        client_copy_str(o->run, sizeof o->run, cs->run);
        o->rank = cs->rank;
        o->pid = cs->pid;
        o->uid = cs->uid;
        o->pushes = cs->pushes;
        o->dropped = cs->dropped;
        o->rejected = cs->rejected;
    }
    return ATTNSTAT_OK;
}

const char *attnstat_last_error(const attnstat_client *c)
{
    return c ? c->err : "no client";
}

int attnstat_fd(const attnstat_client *c)
{
    return c ? c->fd : -1;
}

void attnstat_close(attnstat_client *c)
{
    if (!c)
        return;
    if (c->fd >= 0) {
        if (!c->closed)
            client_pump_out(c);
        close(c->fd);
    }
    if (c->map)
        munmap(c->map, c->ring_bytes);
    if (c->shm_fd >= 0)
        close(c->shm_fd);
    if (c->shm_linked)
        shm_unlink(c->shm_name);
    if (c->status_env)
        attnstat__envelope__free_unpacked(c->status_env, NULL);
    ring_destroy(&c->ring);
    gpu_free(c->gpu);
    frame_reader_free(&c->rd);
    free(c->oq);
    free(c->inflight);
    free(c);
}
