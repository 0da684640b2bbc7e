/* session.c — one libattnstat client from attnstat_connect to attnstat_close: it makes the client
 * and wires its parts (the transport hands each frame to the reply handler), and holds the calls
 * that wait for the daemon — hello with the ring's registration, status, flush, poll — and the
 * counters, the last error and the version. See include/attnstat.h for the promises.
 *
 * Nothing here waits except hello, status, flush and poll, each up to the time it is given.
 *
 * Stage: the top of libattnstat, the only file that knows every other: calls conn.c, push.c
 * (the ring behind hello), replies.c, gpu_export.c, ring.c and util.c. Nothing calls it. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "client_internal.h"
#include "conn.h"
#include "push.h"
#include "replies.h"

#define SESSION_RING_DEFAULT (64ull << 20)
#define SESSION_QUEUE_DEFAULT (1ull << 20)
#define SESSION_TIMEOUT_DEFAULT 5000

/* ---- Connecting and closing ------------------------------------------------------------------- */
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
    util_clear_error(err);
    if (!out)
        return util_fail_error(err, ATTNSTAT_EINVAL, "attnstat_connect: out is NULL");
    *out = NULL;
    attnstat_connect_opts dflt;
    if (!opts) {
        attnstat_connect_opts_init(&dflt);
        opts = &dflt;
    }
    char path[sizeof(((struct sockaddr_un *)0)->sun_path)];
    if (opts->socket_path) {
        if (strlen(opts->socket_path) >= sizeof path)
            return util_fail_error(err, ATTNSTAT_EINVAL,
                                   "socket path is too long (%zu bytes, at most %zu): %s",
                                   strlen(opts->socket_path), sizeof path - 1, opts->socket_path);
        snprintf(path, sizeof path, "%s", opts->socket_path);
    } else if (!attnstat_default_socket(path, sizeof path)) {
        return util_fail_error(err, ATTNSTAT_EINVAL, "the default socket path is too long: set "
                               "ATTNSTAT_SOCKET to a shorter one");
    }
    if (opts->ring_bytes != 0 && opts->ring_bytes < 4096)
        return util_fail_error(err, ATTNSTAT_EINVAL, "ring_bytes %llu is too small (at least 4096)",
                               (unsigned long long)opts->ring_bytes);

    attnstat_client *c = calloc(1, sizeof *c);
    if (!c)
        return util_fail_error(err, ATTNSTAT_ENOMEM, "out of memory allocating the client");
    c->fd = -1;
    c->shm_fd = -1;
    c->run_id = -1;
    c->next_seq = 1;
    c->timeout_ms = opts->timeout_ms > 0 ? opts->timeout_ms : SESSION_TIMEOUT_DEFAULT;
    c->ring_bytes = opts->ring_bytes ? opts->ring_bytes : SESSION_RING_DEFAULT;
    c->oq_limit = opts->queue_bytes ? (size_t)opts->queue_bytes : SESSION_QUEUE_DEFAULT;
    c->max_frame = FRAME_MAX_DEFAULT;
    c->on_frame = replies_on_frame;
    snprintf(c->sock_path, sizeof c->sock_path, "%s", path);
    frame_reader_init(&c->rd, FRAME_MAX_DEFAULT);
    attnstat_code rc = conn_open(c, path, err);
    if (rc != ATTNSTAT_OK) {
        attnstat_close(c);
        return rc;
    }
    *out = c;
    return ATTNSTAT_OK;
}

void attnstat_close(attnstat_client *c)
{
    if (!c)
        return;
    conn_shutdown(c);
    push_free_ring(c);
    replies_forget_status(c);
    gpu_free(c->gpu);
    free(c);
}

int attnstat_fd(const attnstat_client *c)
{
    return c ? c->fd : -1;
}

/* ---- Hello and the ring ----------------------------------------------------------------------- */
/* Waits until *flag is set, an Error arrives, the connection breaks or the timeout passes. */
static attnstat_code session_wait_for(attnstat_client *c, const int *flag, const char *what)
{
    int64_t deadline = util_now_ms() + c->timeout_ms;
    while (!*flag) {
        if (c->wait_error)
            return client_fail(c, ATTNSTAT_EREFUSED, "attnstatd refused the %s: %s", what,
                               c->st.last_error);
        if (c->closed)
            return client_fail(c, ATTNSTAT_ECLOSED, "attnstatd closed the connection during the "
                               "%s%s%s", what, c->st.last_error[0] ? ": " : "", c->st.last_error);
        int left = conn_remaining(deadline);
        if (left == 0)
            return client_fail(c, ATTNSTAT_ETIMEDOUT,
                               "attnstatd at %s did not answer the %s within %d ms", c->sock_path,
                               what, c->timeout_ms);
        conn_wait_once(c, left);
    }
    return ATTNSTAT_OK;
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
    attnstat_code rc = conn_send(c, &env, 0);
    if (rc != ATTNSTAT_OK)
        return rc == ATTNSTAT_ECLOSED ? conn_closed(c) : rc;
    rc = session_wait_for(c, &c->got_hello_reply, "hello");
    if (rc != ATTNSTAT_OK)
        return rc;

    rc = push_make_ring(c);
    if (rc != ATTNSTAT_OK)
        return rc;
    Attnstat__RegisterBuffer rb = ATTNSTAT__REGISTER_BUFFER__INIT;
    rb.id = CLIENT_RING_ID;
    rb.kind = ATTNSTAT__BUFFER_KIND__HOST_SHM;
    rb.size = c->ring_bytes;
    rb.shm_name = c->shm_name;
    env.msg_case = ATTNSTAT__ENVELOPE__MSG_REGISTER_BUFFER;
    env.register_buffer = &rb;
    if ((rc = conn_send(c, &env, 0)) != ATTNSTAT_OK)
        return rc;
    /* RegisterBuffer has no reply of its own: a Status behind it answers only after the daemon has
     * handled the registration, so an Error for the ring, if any, arrives first. */
    Attnstat__Status s = ATTNSTAT__STATUS__INIT;
    env.msg_case = ATTNSTAT__ENVELOPE__MSG_STATUS;
    env.status = &s;
    if ((rc = conn_send(c, &env, 0)) != ATTNSTAT_OK)
        return rc;
    replies_forget_status(c);
    int64_t deadline = util_now_ms() + c->timeout_ms;
    while (!c->status_env && !c->wait_error && !c->closed) {
        int left = conn_remaining(deadline);
        if (left == 0)
            return client_fail(c, ATTNSTAT_ETIMEDOUT,
                               "attnstatd did not confirm the shared-memory ring within %d ms",
                               c->timeout_ms);
        conn_wait_once(c, left);
    }
    if (c->wait_error)
        return client_fail(c, ATTNSTAT_EREFUSED,
                           "attnstatd refused the shared-memory ring %s (%llu bytes): %s",
                           c->shm_name, (unsigned long long)c->ring_bytes, c->st.last_error);
    if (!c->status_env)
        return conn_closed(c);
    /* The daemon has mapped the ring (it maps at registration, and answered the Status behind it):
     * the name can go now, so a trainer that dies leaves nothing behind in /dev/shm. */
    push_unlink_ring(c);
    c->hello_done = 1;
    return ATTNSTAT_OK;
}

int64_t attnstat_run_id(const attnstat_client *c)
{
    return c && c->hello_done ? c->run_id : -1;
}

/* ---- Subscribing, polling, flushing ----------------------------------------------------------- */
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
    attnstat_code rc = conn_send(c, &env, 0);
    return rc == ATTNSTAT_ECLOSED ? conn_closed(c) : rc;
}

attnstat_code attnstat_poll(attnstat_client *c, int timeout_ms)
{
    if (!c)
        return ATTNSTAT_EINVAL;
    if (conn_wait_once(c, timeout_ms) != 0) {
        replies_release_all(c);
        return conn_closed(c);
    }
    return ATTNSTAT_OK;
}

attnstat_code attnstat_flush(attnstat_client *c, int timeout_ms)
{
    if (!c)
        return ATTNSTAT_EINVAL;
    int64_t deadline = timeout_ms < 0 ? -1 : util_now_ms() + timeout_ms;
    for (;;) {
        if (c->closed) {
            conn_pump_in(c);
            replies_release_all(c);
            char why[sizeof c->err];
            snprintf(why, sizeof why, "%s", c->err[0] ? c->err : "connection closed");
            return client_fail(c, ATTNSTAT_ECLOSED, "%llu pushes unacknowledged: %s",
                               (unsigned long long)c->st.in_flight, why);
        }
        if (c->st.in_flight == 0 && conn_queued(c) == 0)
            return ATTNSTAT_OK;
        int left = conn_remaining(deadline);
        if (left == 0)
            return client_fail(c, ATTNSTAT_ETIMEDOUT,
                               "%llu pushes still unacknowledged after %d ms",
                               (unsigned long long)c->st.in_flight, timeout_ms);
        conn_wait_once(c, left);
    }
}

void attnstat_stats(const attnstat_client *c, attnstat_counters *out)
{
    if (!c || !out)
        return;
    *out = c->st;
    out->ring_used = c->inflight ? ring_used(&c->ring) : 0;
    out->queue_bytes = conn_queued(c);
    out->cuda_buffers = gpu_buffers(c->gpu);
}

/* ---- Status ----------------------------------------------------------------------------------- */
attnstat_code attnstat_status(attnstat_client *c, attnstat_daemon_status *out, int timeout_ms)
{
    if (!c || !out)
        return c ? client_fail(c, ATTNSTAT_EINVAL, "status output is NULL") : ATTNSTAT_EINVAL;
    c->err[0] = '\0';
    replies_forget_status(c);
    Attnstat__Status s = ATTNSTAT__STATUS__INIT;
    Attnstat__Envelope env = ATTNSTAT__ENVELOPE__INIT;
    env.msg_case = ATTNSTAT__ENVELOPE__MSG_STATUS;
    env.status = &s;
    attnstat_code rc = conn_send(c, &env, 0);
    if (rc != ATTNSTAT_OK)
        return rc == ATTNSTAT_ECLOSED ? conn_closed(c) : rc;
    int saved = c->timeout_ms;
    if (timeout_ms > 0)
        c->timeout_ms = timeout_ms;
    c->wait_error = 0;
    rc = ATTNSTAT_OK;
    int64_t deadline = util_now_ms() + c->timeout_ms;
    while (!c->status_env) {
        if (c->closed) {
            replies_release_all(c);
            rc = conn_closed(c);
            break;
        }
        int left = conn_remaining(deadline);
        if (left == 0) {
            rc = client_fail(c, ATTNSTAT_ETIMEDOUT, "attnstatd did not answer Status within %d ms",
                             c->timeout_ms);
            break;
        }
        conn_wait_once(c, left);
    }
    c->timeout_ms = saved;
    if (rc != ATTNSTAT_OK)
        return rc;
    replies_status_out(c, out);
    return ATTNSTAT_OK;
}

const char *attnstat_last_error(const attnstat_client *c)
{
    return c ? c->err : "no client";
}

/* ---- Version and devices ---------------------------------------------------------------------- */
const char *attnstat_version(void)
{
    return gpu_built() ? ATTNSTAT_VERSION "+cuda" : ATTNSTAT_VERSION;
}

attnstat_code attnstat_cuda_device_uuid(int32_t device, char *buf, size_t len, attnstat_error *err)
{
    char msg[256];
    if (!buf)
        return util_fail_error(err, ATTNSTAT_EINVAL, "attnstat_cuda_device_uuid: buf is NULL");
    attnstat_code rc = gpu_device_uuid(device, buf, len, msg, sizeof msg);
    if (rc != ATTNSTAT_OK)
        return util_fail_error(err, rc, "%s", msg);
    util_clear_error(err);
    return ATTNSTAT_OK;
}

