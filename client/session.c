/* session.c — one libattnstat client from attnstat_connect to attnstat_close: it makes the client
 * and wires its parts (the transport hands each frame to the reply handler), and holds the calls
 * that wait for the daemon — hello, status, flush, poll — and the counters, the last error and the
 * version. See include/attnstat.h for the promises.
 *
 * Nothing here waits except hello, status, flush and poll, each up to the time it is given. Each
 * of them moves the link on first (link.c): a lost connection is noticed, and a reconnection takes
 * its next step, inside the calls the caller makes anyway.
 *
 * Stage: the top of libattnstat: calls link.c (hello, reconnection), conn.c, hostring.c,
 * replies.c, gpu_export.c, ring.c and util.c. Nothing calls it. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client_internal.h"
#include "conn.h"
#include "envelope.h"
#include "hostring.h"
#include "link.h"
#include "local.h"
#include "replies.h"
#include "vocab.h"

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
    return attnstat_connect2(opts, 0, out, err);
}

attnstat_code attnstat_connect2(const attnstat_connect_opts *opts, uint32_t flags,
                                attnstat_client **out, attnstat_error *err)
{
    util_clear_error(err);
    if (!out)
        return util_fail_error(err, ATTNSTAT_EINVAL, "attnstat_connect: out is NULL");
    *out = NULL;
    if (flags & ~(uint32_t)ATTNSTAT_CONNECT_BACKGROUND)
        return util_fail_error(err, ATTNSTAT_EINVAL, "attnstat_connect2: unknown flags 0x%x "
                               "(this libattnstat knows ATTNSTAT_CONNECT_BACKGROUND)",
                               (unsigned)(flags & ~(uint32_t)ATTNSTAT_CONNECT_BACKGROUND));
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
    c->background = (flags & ATTNSTAT_CONNECT_BACKGROUND) != 0;
    int e = 0;
    attnstat_code rc = conn_open(c, &e, err);
    if (rc != ATTNSTAT_OK && c->background && link_start_waiting(c, e)) {
        util_clear_error(err); /* not there yet: the library connects when it comes */
        rc = ATTNSTAT_OK;
    }
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
    local_free(c); /* waits for the local computations: they read the caller's memory */
    if (c->hello_done && c->link == LINK_UP && c->fd >= 0 && !c->closed) {
        /* The run ends here (its alerts are resolved): said without waiting, before the close. */
        Attnstat__Goodbye g;
        Attnstat__Envelope env;
        conn_send(c, envelope_goodbye(&env, &g), 0);
    }
    conn_shutdown(c);
    hostring_free(c);
    replies_forget_status(c);
    gpu_free(c->gpu);
    link_free(c);
    free(c);
}

int attnstat_fd(const attnstat_client *c)
{
    return c ? c->fd : -1;
}

/* ---- Hello ------------------------------------------------------------------------------------ */
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
    if (run && strlen(run) > 200)
        return client_fail(c, ATTNSTAT_EINVAL, "run name is %zu bytes long (at most 200)",
                           strlen(run));
    link_advance(c);
    if (c->background) {
        /* An attempt that has a connection already may finish within the connect timeout: the
         * hello is then said on it now, as on any connection. */
        int64_t deadline = util_now_ms() + c->timeout_ms;
        while ((c->link == LINK_CONNECTING || c->link == LINK_REGISTER) &&
               conn_remaining(deadline) > 0)
            link_wait(c, conn_remaining(deadline));
        if (c->link != LINK_UP && c->link != LINK_CLOSED) {
            /* Not connected: kept, and said by the attempt that connects. */
            attnstat_code rc = link_set_hello(c, run, rank, th, config_json, device_uuids,
                                              n_devices);
            if (rc != ATTNSTAT_OK)
                return rc;
            c->hello_sent = 1;
            c->hello_pending = 1;
            return ATTNSTAT_OK;
        }
    }
    if (c->closed || c->link != LINK_UP) {
        char why[400];
        link_describe(c, why, sizeof why);
        return client_fail(c, ATTNSTAT_ECLOSED, "the connection is closed%s%s", why[0] ? ": " : "",
                           why);
    }
    attnstat_code rc = link_set_hello(c, run, rank, th, config_json, device_uuids, n_devices);
    if (rc != ATTNSTAT_OK)
        return rc;
    c->hello_sent = 1;
    return link_establish(c);
}

/* ---- Parallel layout --------------------------------------------------------------------------- */
#define SESSION_LAYOUT_SIZE_MAX (1 << 20)   /* as the daemon's bounds (schema/store_write.c) */
#define SESSION_LAYOUT_OFFSET_MAX (1 << 24)

void attnstat_layout_init(attnstat_layout *l)
{
    if (!l)
        return;
    memset(l, 0, sizeof *l);
    l->size = sizeof *l;
    l->tp_size = l->pp_size = l->dp_size = l->cp_size = 1;
    l->head_offset = -1;
}

attnstat_code attnstat_set_layout(attnstat_client *c, const attnstat_layout *l)
{
    if (!c)
        return ATTNSTAT_EINVAL;
    c->err[0] = '\0';
    if (!l || l->size != sizeof *l)
        return client_fail(c, ATTNSTAT_EINVAL, "attnstat_set_layout: the layout is NULL or was not "
                           "set up by attnstat_layout_init (size %u, expected %zu)",
                           l ? (unsigned)l->size : 0u, sizeof *l);
    const struct {
        const char *name;
        int32_t rank, size;
    } g[] = {{"tp", l->tp_rank, l->tp_size}, {"pp", l->pp_rank, l->pp_size},
             {"dp", l->dp_rank, l->dp_size}, {"cp", l->cp_rank, l->cp_size}};
    for (size_t i = 0; i < sizeof g / sizeof g[0]; i++)
        if (g[i].size < 1 || g[i].size > SESSION_LAYOUT_SIZE_MAX || g[i].rank < 0 ||
            g[i].rank >= g[i].size)
            return client_fail(c, ATTNSTAT_EINVAL, "layout: %s_rank %d of %s_size %d: the size "
                               "must be 1 .. %d and the rank 0 .. size - 1", g[i].name,
                               (int)g[i].rank, g[i].name, (int)g[i].size, SESSION_LAYOUT_SIZE_MAX);
    if (l->layer_offset < 0 || l->layer_offset > SESSION_LAYOUT_OFFSET_MAX)
        return client_fail(c, ATTNSTAT_EINVAL, "layout: layer_offset %d is not in 0 .. %d",
                           (int)l->layer_offset, SESSION_LAYOUT_OFFSET_MAX);
    if (l->head_offset < -1 || l->head_offset > SESSION_LAYOUT_OFFSET_MAX)
        return client_fail(c, ATTNSTAT_EINVAL, "layout: head_offset %d is not in 0 .. %d (or -1: "
                           "tp_rank x the push's heads)", (int)l->head_offset,
                           SESSION_LAYOUT_OFFSET_MAX);
    if (!c->hello_sent)
        return client_fail(c, ATTNSTAT_ESTATE, "attnstat_set_layout comes after attnstat_hello");
    link_advance(c);
    if (!c->hello_done && !c->hello_pending)
        return conn_closed(c);
    if (c->link == LINK_UP && c->hello_done && !(c->features & CLIENT_FEATURE_LAYOUT))
        return client_fail(c, ATTNSTAT_ENOTSUP, "this attnstatd takes no parallel layout (it is "
                           "older than this library): its heads keep their local numbers");
    c->has_layout = 1;
    c->layout = *l;
    if (c->link != LINK_UP || !c->hello_done) /* said with the hello of the connection made */
        return c->link == LINK_CLOSED ? conn_closed(c) : ATTNSTAT_OK;
    attnstat_code rc = link_send_layout(c);
    if (rc != ATTNSTAT_ECLOSED)
        return rc;
    link_advance(c); /* the loss: said again when the link is made again */
    return c->link == LINK_CLOSED ? conn_closed(c) : ATTNSTAT_OK;
}

/* ---- Interventions --------------------------------------------------------------------------- */
/* The bounds of an Intervention (vocab.h), which attnstatd and its store hold it to too. */
#define INTERVENTION_KIND_MAX VOCAB_INTERVENTION_KIND_MAX
#define INTERVENTION_HEADS_MAX VOCAB_INTERVENTION_HEADS_MAX
#define INTERVENTION_INDEX_LIMIT ((int32_t)VOCAB_INTERVENTION_HEAD_LIMIT) /* layers and heads */
#define INTERVENTION_DETAIL_MAX VOCAB_INTERVENTION_DETAIL_MAX
void attnstat_intervention_init(attnstat_intervention *iv)
{
    if (!iv)
        return;
    memset(iv, 0, sizeof *iv);
    iv->size = sizeof *iv;
    iv->layer = -1;
    iv->threshold = NAN;
    iv->measured = NAN;
}

/* The daemon's checks, made here first so that a caller's mistake is an EINVAL naming the field
 * rather than an Error on the socket later. */
static attnstat_code intervention_check(attnstat_client *c, const attnstat_intervention *iv)
{
    if (!iv || iv->size != sizeof *iv)
        return client_fail(c, ATTNSTAT_EINVAL, "attnstat_record_intervention: the intervention is "
                           "NULL or was not set up by attnstat_intervention_init (size %u, "
                           "expected %zu)", iv ? (unsigned)iv->size : 0u, sizeof *iv);
    size_t n = iv->kind ? strlen(iv->kind) : 0;
    if (n < 1 || n > INTERVENTION_KIND_MAX)
        return client_fail(c, ATTNSTAT_EINVAL, "intervention: kind must be 1 .. %d characters "
                           "(it is %zu)", INTERVENTION_KIND_MAX, n);
    if (strspn(iv->kind, VOCAB_INTERVENTION_KIND_CHARS) != n)
        return client_fail(c, ATTNSTAT_EINVAL, "intervention: kind \"%s\" may hold a-z, 0-9, "
                           "'_', '.' and '-' only", iv->kind);
    if (iv->step < 0)
        return client_fail(c, ATTNSTAT_EINVAL, "intervention: step %lld is negative",
                           (long long)iv->step);
    if (iv->layer < -1 || iv->layer >= INTERVENTION_INDEX_LIMIT)
        return client_fail(c, ATTNSTAT_EINVAL, "intervention: layer %d is not in -1 .. %d",
                           (int)iv->layer, INTERVENTION_INDEX_LIMIT - 1);
    if (iv->nheads < 0 || iv->nheads > INTERVENTION_HEADS_MAX || (iv->nheads > 0 && !iv->heads))
        return client_fail(c, ATTNSTAT_EINVAL, "intervention: nheads %d is not in 0 .. %d (with "
                           "heads given when it is not 0)", (int)iv->nheads, INTERVENTION_HEADS_MAX);
    for (int32_t i = 0; i < iv->nheads; i++) {
        if (iv->heads[i] >= (uint32_t)INTERVENTION_INDEX_LIMIT)
            return client_fail(c, ATTNSTAT_EINVAL, "intervention: heads[%d] = %u is not under %d",
                               (int)i, (unsigned)iv->heads[i], INTERVENTION_INDEX_LIMIT);
        if (iv->values && !isfinite(iv->values[i]))
            return client_fail(c, ATTNSTAT_EINVAL, "intervention: values[%d] is not finite",
                               (int)i);
    }
    if (isinf(iv->threshold) || isinf(iv->measured))
        return client_fail(c, ATTNSTAT_EINVAL, "intervention: threshold and measured are finite "
                           "or NaN (none)");
    if (iv->detail && strlen(iv->detail) > INTERVENTION_DETAIL_MAX)
        return client_fail(c, ATTNSTAT_EINVAL, "intervention: detail is %zu bytes (at most %d)",
                           strlen(iv->detail), INTERVENTION_DETAIL_MAX);
    return ATTNSTAT_OK;
}

attnstat_code attnstat_record_intervention(attnstat_client *c, const attnstat_intervention *iv)
{
    if (!c)
        return ATTNSTAT_EINVAL;
    c->err[0] = '\0';
    attnstat_code rc = intervention_check(c, iv);
    if (rc != ATTNSTAT_OK)
        return rc;
    if (!c->hello_sent)
        return client_fail(c, ATTNSTAT_ESTATE, "attnstat_record_intervention comes after "
                           "attnstat_hello");
    link_advance(c);
    if (c->link == LINK_CLOSED)
        return conn_closed(c);
    if (c->link != LINK_UP || !c->hello_done)
        return client_fail(c, ATTNSTAT_DROPPED, "intervention not recorded: not connected to "
                           "attnstatd (reconnecting)");
    if (!(c->features & CLIENT_FEATURE_INTERVENTIONS))
        return client_fail(c, ATTNSTAT_ENOTSUP, "this attnstatd records no interventions (it is "
                           "older than this library)");
    Attnstat__Intervention m = ATTNSTAT__INTERVENTION__INIT;
    m.kind = (char *)iv->kind;
    m.step = iv->step;
    if (iv->layer >= 0) {
        m.has_layer = 1;
        m.layer = (uint32_t)iv->layer;
    }
    m.n_heads = (size_t)iv->nheads;
    m.heads = (uint32_t *)iv->heads;
    if (iv->values) {
        m.n_values = (size_t)iv->nheads;
        m.values = (double *)iv->values;
    }
    if (!isnan(iv->threshold)) {
        m.has_threshold = 1;
        m.threshold = iv->threshold;
    }
    if (!isnan(iv->measured)) {
        m.has_measured = 1;
        m.measured = iv->measured;
    }
    m.detail = (char *)iv->detail;
    Attnstat__Envelope env = ATTNSTAT__ENVELOPE__INIT;
    env.msg_case = ATTNSTAT__ENVELOPE__MSG_INTERVENTION;
    env.intervention = &m;
    rc = conn_send(c, &env, 1);
    if (rc == ATTNSTAT_ECLOSED) {
        link_advance(c); /* the loss: the library reconnects; this one is not kept */
        return c->link == LINK_CLOSED ? conn_closed(c)
                                      : client_fail(c, ATTNSTAT_DROPPED, "intervention not "
                                                    "recorded: the connection to attnstatd was lost");
    }
    if (rc == ATTNSTAT_DROPPED)
        return client_fail(c, ATTNSTAT_DROPPED, "intervention not recorded: the outgoing queue "
                           "to attnstatd is full");
    return rc;
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
    link_advance(c);
    if (c->link == LINK_CLOSED)
        return conn_closed(c);
    /* Kept: a connection made again subscribes again. Sent now when the link has a connection
     * whose registrations went out already; else it goes with them. */
    c->subscribed = 1;
    c->sub_alerts = alerts != 0;
    c->sub_results = results != 0;
    if (c->link != LINK_UP && c->link != LINK_REGISTER)
        return ATTNSTAT_OK;
    Attnstat__Subscribe s;
    Attnstat__Envelope env;
    attnstat_code rc = conn_send(c, envelope_subscribe(&env, &s, alerts, results), 0);
    if (rc != ATTNSTAT_ECLOSED)
        return rc;
    link_advance(c); /* the loss: subscribed again when the link is made again */
    return c->link == LINK_CLOSED ? conn_closed(c) : ATTNSTAT_OK;
}

attnstat_code attnstat_poll(attnstat_client *c, int timeout_ms)
{
    if (!c)
        return ATTNSTAT_EINVAL;
    if (c->link != LINK_UP || local_busy(c))
        link_advance(c);
    /* Local computations finish on the device, not on the socket: look again every millisecond. */
    link_wait(c, local_busy(c) && (timeout_ms < 0 || timeout_ms > 1) ? 1 : timeout_ms);
    local_progress(c);
    return c->link == LINK_CLOSED ? conn_closed(c) : ATTNSTAT_OK;
}

/* What a flush that has nothing left to wait for says: OK, or ELOST when pushes sent since the
 * previous flush were abandoned with a lost connection. */
static attnstat_code session_flush_result(attnstat_client *c)
{
    unsigned long long lost = c->st.abandoned - c->flush_abandoned;
    c->flush_abandoned = c->st.abandoned;
    if (lost == 0)
        return ATTNSTAT_OK;
    const char *now = c->link == LINK_UP ? "reconnected since: the run goes on"
                      : c->link == LINK_CLOSED ? "the connection is closed for good"
                                               : "reconnecting";
    return client_fail(c, ATTNSTAT_ELOST, "%llu pushes sent since the last flush will never be "
                       "acknowledged: they were in flight when the connection to attnstatd at %s "
                       "was lost (%s); %s", lost, c->sock_path, c->link_lost_why, now);
}

attnstat_code attnstat_flush(attnstat_client *c, int timeout_ms)
{
    if (!c)
        return ATTNSTAT_EINVAL;
    int64_t deadline = timeout_ms < 0 ? -1 : util_now_ms() + timeout_ms;
    for (;;) {
        link_advance(c);
        if (c->link == LINK_CLOSED && c->hello_sent && !c->hello_done) {
            /* the hello failed: this client never had a run */
            char why[sizeof c->err];
            snprintf(why, sizeof why, "%s", c->err[0] ? c->err : "connection closed");
            return client_fail(c, ATTNSTAT_ECLOSED, "%llu pushes unacknowledged: %s",
                               (unsigned long long)c->st.in_flight, why);
        }
        /* Not up: what was in flight was abandoned with the connection; nothing to wait for. */
        if (c->link != LINK_UP || (c->st.in_flight == 0 && conn_queued(c) == 0))
            return session_flush_result(c);
        int left = conn_remaining(deadline);
        if (left == 0)
            return client_fail(c, ATTNSTAT_ETIMEDOUT,
                               "%llu pushes still unacknowledged after %d ms",
                               (unsigned long long)c->st.in_flight, timeout_ms);
        conn_wait_once(c, local_busy(c) && (left < 0 || left > 1) ? 1 : left);
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
/* ECLOSED for a call that needs the link up: why it is not. */
static attnstat_code session_not_up(attnstat_client *c)
{
    if (c->link == LINK_CLOSED)
        return conn_closed(c);
    char why[400];
    link_describe(c, why, sizeof why);
    return client_fail(c, ATTNSTAT_ECLOSED, "not connected: %s", why);
}

attnstat_code attnstat_status(attnstat_client *c, attnstat_daemon_status *out, int timeout_ms)
{
    if (!c || !out)
        return c ? client_fail(c, ATTNSTAT_EINVAL, "status output is NULL") : ATTNSTAT_EINVAL;
    c->err[0] = '\0';
    int saved = c->timeout_ms;
    if (timeout_ms > 0)
        c->timeout_ms = timeout_ms;
    int64_t deadline = util_now_ms() + c->timeout_ms;
    /* A reconnection that has a connection already may finish within the time given. */
    link_advance(c);
    while ((c->link == LINK_CONNECTING || c->link == LINK_HELLO || c->link == LINK_REGISTER) &&
           conn_remaining(deadline) > 0)
        link_wait(c, conn_remaining(deadline));
    attnstat_code rc = ATTNSTAT_OK;
    if (c->link != LINK_UP)
        rc = session_not_up(c);
    if (rc == ATTNSTAT_OK) {
        replies_forget_status(c);
        Attnstat__Status s;
        Attnstat__Envelope env;
        rc = conn_send(c, envelope_status(&env, &s), 0);
        c->wait_error = 0;
    }
    while (rc == ATTNSTAT_OK && !c->status_env) {
        if (c->closed) {
            rc = ATTNSTAT_ECLOSED;
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
    if (rc == ATTNSTAT_ECLOSED && c->link == LINK_UP) {
        conn_closed(c);
        link_advance(c); /* the loss: pushes in flight abandoned, a reconnection scheduled */
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

