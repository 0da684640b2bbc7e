/* link.c — libattnstat's link to attnstatd (see link.h): the phases of client_internal.h's
 * link_phase, moved on by the calls the caller makes.
 *
 * How an attempt goes: DOWN until link_retry_at; a non-blocking connect (CONNECTING while it goes
 * on, which a Unix socket rarely does); on the new connection the kept Hello (HELLO) when a run was
 * established, whose HelloReply brings the registrations (REGISTER): a new host ring (the old name
 * was removed once the old daemon had mapped it, and memory an old daemon may still map is never
 * written again), the GPU path's events, staging rings and exported allocations under their old
 * ids, the Subscribe when the client had subscribed, and a Status. The StatusReply, answered after
 * everything before it was handled, brings the link UP. Each attempt has c->timeout_ms from its
 * connect to its StatusReply. The first hello goes the same way (HELLO, REGISTER), waited for.
 *
 * Which refusals are for good: an Error with PERMISSION, VERSION or BAD_REQUEST (the same hello
 * would get the same answer), EACCES on connect. BUSY (too many clients, too many buffers),
 * INTERNAL (the store failed) and everything else are tried again.
 *
 * Stage: between session.c / push.c and what they drive. Calls conn.c, hostring.c, replies.c,
 * gpu_export.c, util.c and proto/ (the messages). */
#include "link.h"

#include <errno.h>
#include <math.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "wire_vocab.h"
#include "conn.h"
#include "envelope.h"
#include "local.h"
#include "hostring.h"
#include "replies.h"

#define LINK_BACKOFF_MIN_MS 100
#define LINK_BACKOFF_MAX_MS 5000

/* ---- The hello, kept ---------------------------------------------------------------------------*/
void link_free(attnstat_client *c)
{
    free(c->hello_run);
    free(c->hello_config);
    c->hello_run = c->hello_config = NULL;
    for (int32_t i = 0; c->hello_devices && i < c->hello_ndev; i++)
        free(c->hello_devices[i]);
    free(c->hello_devices);
    c->hello_devices = NULL;
    c->hello_ndev = 0;
}

static int link_dup(char **dst, const char *src)
{
    *dst = src ? strdup(src) : NULL;
    return src && !*dst ? -1 : 0;
}

attnstat_code link_set_hello(attnstat_client *c, const char *run, int32_t rank,
                             const attnstat_thresholds *th, const char *config_json,
                             const char *const *device_uuids, int32_t n_devices)
{
    link_free(c);
    c->hello_rank = rank;
    c->hello_has_th = th != NULL;
    if (th)
        c->hello_th = *th;
    int bad = link_dup(&c->hello_run, run) || link_dup(&c->hello_config, config_json);
    if (!bad && n_devices > 0) {
        c->hello_devices = calloc((size_t)n_devices, sizeof *c->hello_devices);
        bad = !c->hello_devices;
        for (int32_t i = 0; !bad && i < n_devices; i++, c->hello_ndev++)
            bad = link_dup(&c->hello_devices[i], device_uuids[i]);
    }
    if (bad) {
        link_free(c);
        return client_fail(c, ATTNSTAT_ENOMEM, "out of memory keeping the hello");
    }
    return ATTNSTAT_OK;
}

void link_thresholds_pb(Attnstat__Thresholds *o, const attnstat_thresholds *th)
{
    attnstat__thresholds__init(o);
    /* Every threshold of vocab.h that the hello carries; unset (NaN, or 0 for a count) is left
     * out: the daemon's value. collapse_threshold is the kernels' parameter, not a row. */
#define LINK_TH_VOCAB_D(f) (!isnan(th->f))
#define LINK_TH_VOCAB_U(f) (th->f != 0)
#define X(name, type, ...)                                                                         \
    WIRE_VOCAB_UNLESS(DAEMON_ONLY, name)(if (LINK_TH_##type(name)) {                             \
        o->has_##name = 1;                                                                         \
        o->name = th->name;                                                                        \
    })
    VOCAB_THRESHOLDS(X)
#undef X
#undef LINK_TH_VOCAB_D
#undef LINK_TH_VOCAB_U
    if (!isnan(th->collapse_threshold)) {
        o->has_collapse_threshold = 1;
        o->collapse_threshold = th->collapse_threshold;
    }
}

/* Sends the kept Hello (the same one on every connection: the daemon continues the run). */
static attnstat_code link_send_hello(attnstat_client *c)
{
    Attnstat__Thresholds t = ATTNSTAT__THRESHOLDS__INIT;
    if (c->hello_has_th)
        link_thresholds_pb(&t, &c->hello_th);
    char host[256];
    if (gethostname(host, sizeof host) != 0)
        snprintf(host, sizeof host, "unknown");
    host[sizeof host - 1] = '\0';

    Attnstat__Hello h;
    Attnstat__Envelope env;
    envelope_hello(&env, &h, c->hello_run);
    h.has_rank = 1;
    h.rank = c->hello_rank;
    h.has_pid = 1;
    h.pid = (int32_t)getpid();
    h.host = host;
    h.thresholds = c->hello_has_th ? &t : NULL;
    h.config = c->hello_config;
    h.n_device_uuids = (size_t)c->hello_ndev;
    h.device_uuids = c->hello_devices;
    c->wait_error = 0;
    c->got_hello_reply = 0;
    c->link_hello_answered = 0;
    return conn_send(c, &env, 0);
}

attnstat_code link_send_layout(attnstat_client *c)
{
    const attnstat_layout *l = &c->layout;
    Attnstat__ParallelLayout m = ATTNSTAT__PARALLEL_LAYOUT__INIT;
#define LINK_LAYOUT(f)                                                                             \
    m.has_##f = 1;                                                                                 \
    m.f = (uint32_t)l->f;
    LINK_LAYOUT(tp_rank) LINK_LAYOUT(tp_size) LINK_LAYOUT(pp_rank) LINK_LAYOUT(pp_size)
    LINK_LAYOUT(dp_rank) LINK_LAYOUT(dp_size) LINK_LAYOUT(cp_rank) LINK_LAYOUT(cp_size)
    LINK_LAYOUT(layer_offset)
#undef LINK_LAYOUT
    if (l->head_offset >= 0) {
        m.has_head_offset = 1;
        m.head_offset = (uint32_t)l->head_offset;
    }
    Attnstat__Envelope env;
    return conn_send(c, envelope_layout(&env, &m), 0);
}

/* How the GPU path sends its registrations: never dropped. */
static attnstat_code link_emit(void *ctx, const Attnstat__Envelope *env)
{
    return conn_send(ctx, env, 0);
}

/* What a connection needs once its Hello is answered (or at once, without a run): the layout
 * when one was set, the host ring (a run's), the GPU path's registrations, the subscription (on a connection made again), then a
 * Status: RegisterBuffer and Subscribe have no reply of their own, and the daemon answers the
 * Status only after handling them, so an Error for the ring, if any, arrives first. */
static attnstat_code link_send_registrations(attnstat_client *c)
{
    c->wait_error = 0;
    replies_forget_status(c);
    Attnstat__Envelope env;
    attnstat_code rc;
    if (c->hello_sent) {
        /* The layout first: every push of this connection gets its global numbers. A daemon that
         * takes none (an older one came back) keeps the local ones. */
        if (c->has_layout && (c->features & CLIENT_FEATURE_LAYOUT) &&
            (rc = link_send_layout(c)) != ATTNSTAT_OK)
            return rc;
        if ((rc = hostring_make(c)) != ATTNSTAT_OK)
            return rc;
        Attnstat__RegisterBuffer rb;
        envelope_register_shm(&env, &rb, CLIENT_RING_ID, c->shm_name, c->ring_bytes);
        if ((rc = conn_send(c, &env, 0)) != ATTNSTAT_OK)
            return rc;
        if ((rc = gpu_reregister(c->gpu, link_emit, c)) != ATTNSTAT_OK)
            return rc;
    }
    if (c->link_resuming && c->subscribed) {
        Attnstat__Subscribe sub;
        envelope_subscribe(&env, &sub, c->sub_alerts != 0, c->sub_results != 0);
        if ((rc = conn_send(c, &env, 0)) != ATTNSTAT_OK)
            return rc;
    }
    Attnstat__Status s;
    return conn_send(c, envelope_status(&env, &s), 0);
}

/* ---- The phases of an attempt ------------------------------------------------------------------*/
/* An Error code (proto's enum Code) that the same request would get again. */
static int link_refusal_final(int32_t code)
{
    return code == ATTNSTAT__CODE__PERMISSION || code == ATTNSTAT__CODE__VERSION ||
           code == ATTNSTAT__CODE__BAD_REQUEST;
}

/* ECLOSED, with what conn.c knows of why in c->err. */
static attnstat_code link_closed_error(attnstat_client *c)
{
    return client_fail(c, ATTNSTAT_ECLOSED, "connection to attnstatd at %s lost: %s", c->sock_path,
                       c->why_closed[0] ? c->why_closed : "closed");
}

/* Moves HELLO and REGISTER on as their answers arrive. Returns 0 while waiting, 1 once UP, -1 when
 * this attempt failed: *code and c->err say why, *final is 1 when the daemon refused for good. */
static int link_step(attnstat_client *c, attnstat_code *code, int *final)
{
    *final = 0;
    if (c->link == LINK_HELLO) {
        if (!c->got_hello_reply) {
            if (c->wait_error) {
                *final = link_refusal_final(c->st.last_code);
                *code = client_fail(c, ATTNSTAT_EREFUSED, "attnstatd refused the hello: %s",
                                    c->st.last_error);
                return -1;
            }
            if (!c->closed)
                return 0;
            *code = client_fail(c, ATTNSTAT_ECLOSED, "attnstatd closed the connection during the "
                                "hello%s%s", c->st.last_error[0] ? ": " : "", c->st.last_error);
            return -1;
        }
        c->link_hello_answered = 1;
        attnstat_code rc = link_send_registrations(c);
        if (rc != ATTNSTAT_OK) {
            *code = rc == ATTNSTAT_ECLOSED ? link_closed_error(c) : rc;
            return -1;
        }
        c->link = LINK_REGISTER;
    }
    if (c->link == LINK_REGISTER) {
        /* An Error naming a GPU registration only marks its device (replies.c): not ours here. */
        if (c->wait_error && (!c->wait_error_has_ref || c->wait_error_ref == CLIENT_RING_ID)) {
            *final = link_refusal_final(c->st.last_code);
            if (c->hello_sent)
                *code = client_fail(c, ATTNSTAT_EREFUSED,
                                    "attnstatd refused the shared-memory ring %s (%llu bytes): %s",
                                    c->shm_name, (unsigned long long)c->ring_bytes,
                                    c->st.last_error);
            else
                *code = client_fail(c, ATTNSTAT_EREFUSED, "attnstatd refused the subscription: "
                                    "%s", c->st.last_error);
            return -1;
        }
        if (c->status_env) {
            replies_forget_status(c);
            /* The daemon has mapped the ring (it maps at registration, and answered the Status
             * behind it): the name can go now, so a process that dies leaves nothing in /dev/shm. */
            hostring_unlink(c);
            if (c->hello_sent && c->link_hello_answered) { /* the run is established */
                c->hello_done = 1;
                c->hello_pending = 0;
            }
            c->link = LINK_UP;
            return 1;
        }
        if (c->closed) {
            *code = link_closed_error(c);
            return -1;
        }
    }
    return 0;
}

attnstat_code link_establish(attnstat_client *c)
{
    attnstat_code rc = link_send_hello(c);
    if (rc != ATTNSTAT_OK) {
        if (rc != ATTNSTAT_ECLOSED)
            return rc;
        c->link = LINK_CLOSED;
        return conn_closed(c);
    }
    link_phase at = c->link = LINK_HELLO;
    int64_t deadline = util_now_ms() + c->timeout_ms;
    for (;;) {
        int final;
        int r = link_step(c, &rc, &final);
        if (r > 0)
            return ATTNSTAT_OK;
        if (r < 0) {
            c->link = c->closed ? LINK_CLOSED : LINK_UP;
            return rc;
        }
        if (c->link != at) { /* each answer has its own timeout */
            at = c->link;
            deadline = util_now_ms() + c->timeout_ms;
        }
        int left = conn_remaining(deadline);
        if (left == 0) {
            c->link = LINK_UP;
            if (at == LINK_HELLO)
                return client_fail(c, ATTNSTAT_ETIMEDOUT, "attnstatd at %s did not answer the "
                                   "hello within %d ms", c->sock_path, c->timeout_ms);
            return client_fail(c, ATTNSTAT_ETIMEDOUT, "attnstatd did not confirm the "
                               "shared-memory ring within %d ms", c->timeout_ms);
        }
        conn_wait_once(c, left);
    }
}

/* ---- Losing the connection and making it again ------------------------------------------------*/
static uint64_t link_random(attnstat_client *c)
{
    if (c->link_jitter == 0) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        c->link_jitter = (uint64_t)(uintptr_t)c ^ ((uint64_t)getpid() << 32) ^
                         (uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 20);
    }
    uint64_t z = (c->link_jitter += 0x9e3779b97f4a7c15ull); /* splitmix64 */
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* DOWN until the next attempt: the current delay with jitter (somewhere in [d/2, d], so that the
 * clients of one daemon do not all come back at the same moment), and a longer one after it. */
static void link_schedule(attnstat_client *c)
{
    int d = c->link_backoff_ms;
    int wait = d / 2 + (int)(link_random(c) % (uint64_t)(d / 2 + 1));
    c->link_retry_at = util_now_ms() + wait;
    c->link_backoff_ms = d >= LINK_BACKOFF_MAX_MS / 2 ? LINK_BACKOFF_MAX_MS : d * 2;
    c->link = LINK_DOWN;
}

/* The attempt under way failed (why: what went wrong): its connection and ring are let go, and
 * the next attempt scheduled, or none when the daemon refused for good. */
static void link_attempt_failed(attnstat_client *c, const char *why, int final)
{
    util_copy_str(c->link_retry_why, sizeof c->link_retry_why, why);
    hostring_free(c);
    conn_reset(c);
    replies_forget_status(c);
    if (!final) {
        link_schedule(c);
        return;
    }
    util_fail(c->link_lost_why, sizeof c->link_lost_why, ATTNSTAT_ECLOSED,
              "attnstatd refused this client when it %s: %s",
              c->link_first ? "connected" : "reconnected", why);
    c->link = LINK_CLOSED;
}

void link_lost(attnstat_client *c)
{
    if (c->link != LINK_UP)
        return;
    replies_abandon_all(c);
    if (c->hello_sent && !c->hello_done && !c->hello_pending) { /* the hello failed before */
        c->link = LINK_CLOSED;
        return;
    }
    util_copy_str(c->link_lost_why, sizeof c->link_lost_why,
                  c->why_closed[0] ? c->why_closed : "the connection was closed");
    c->link_retry_why[0] = '\0';
    c->st.disconnects++;
    c->link_dropped_mark = c->st.dropped_disconnected;
    c->link_attempts = 0;
    c->link_backoff_ms = LINK_BACKOFF_MIN_MS;
    c->link_resuming = 1;
    hostring_free(c);
    conn_reset(c);
    replies_forget_status(c);
    link_schedule(c);
}

/* A new connection: the Hello of the run to resume (or of a background client's hello kept
 * meanwhile), or at once the registrations of a client without a run (its subscription). */
static void link_connected(attnstat_client *c)
{
    c->link_deadline = util_now_ms() + c->timeout_ms;
    c->link_hello_answered = 0;
    attnstat_code rc;
    if (c->hello_done || c->hello_pending) {
        c->link = LINK_HELLO;
        rc = link_send_hello(c);
    } else {
        c->link = LINK_REGISTER;
        rc = link_send_registrations(c);
    }
    if (rc != ATTNSTAT_OK)
        link_attempt_failed(c, rc == ATTNSTAT_ECLOSED ? "the connection broke at once" : c->err, 0);
}

int link_start_waiting(attnstat_client *c, int e)
{
    const char *yet = e == ENOENT         ? "no socket yet"
                      : e == ECONNREFUSED ? "nothing listens on the socket yet"
                      : e == EAGAIN       ? "its listen backlog is full"
                      : e == ETIMEDOUT    ? "the connect timed out"
                                          : NULL;
    if (!yet)
        return 0;
    char why[400];
    conn_connect_why(e, c->sock_path, why, sizeof why);
    util_copy_str(c->link_retry_why, sizeof c->link_retry_why, why);
    snprintf(c->link_lost_why, sizeof c->link_lost_why, "not connected yet: waiting for "
             "attnstatd to start (%s)", yet);
    conn_reset(c);
    util_copy_str(c->why_closed, sizeof c->why_closed, "not connected yet");
    c->err[0] = '\0';
    c->link_first = 1;
    c->link_resuming = 1; /* its first connection subscribes, as a connection made again does */
    c->link_attempts = 1;
    c->link_dropped_mark = c->st.dropped_disconnected;
    c->link_backoff_ms = LINK_BACKOFF_MIN_MS;
    link_schedule(c);
    return 1;
}

static void link_connect_failed(attnstat_client *c, int e)
{
    char why[400];
    conn_connect_why(e, c->sock_path, why, sizeof why);
    link_attempt_failed(c, why, e == EACCES || e == EPERM);
}

/* One step of an attempt (the link DOWN, CONNECTING, HELLO or REGISTER). */
static void link_attempt_step(attnstat_client *c)
{
    if (c->link == LINK_DOWN) {
        if (util_now_ms() < c->link_retry_at)
            return;
        c->link_attempts++;
        int e = 0, r = conn_connect_start(c, &e);
        if (r < 0)
            link_connect_failed(c, e);
        else if (r > 0) {
            c->link = LINK_CONNECTING;
            c->link_deadline = util_now_ms() + c->timeout_ms;
        } else {
            link_connected(c);
        }
    } else if (c->link == LINK_CONNECTING) {
        int e = 0, r = conn_connect_done(c, &e);
        if (r < 0)
            link_connect_failed(c, e);
        else if (r == 0)
            link_connected(c);
        else if (util_now_ms() >= c->link_deadline)
            link_connect_failed(c, ETIMEDOUT);
    }
    if (c->link != LINK_HELLO && c->link != LINK_REGISTER)
        return;
    if (!c->closed) {
        conn_pump_in(c);
        conn_pump_out(c);
    }
    attnstat_code code;
    int final;
    int r = link_step(c, &code, &final);
    if (r < 0) {
        link_attempt_failed(c, final ? c->st.last_error : c->err, final);
    } else if (r > 0) {
        if (c->link_first) /* a background client's first connection: nothing was lost */
            c->link_first = 0;
        else
            c->st.reconnects++;
        c->link_resuming = 0;
        c->link_attempts = 0;
        c->link_backoff_ms = LINK_BACKOFF_MIN_MS;
        c->link_retry_why[0] = '\0';
    } else if (util_now_ms() >= c->link_deadline) {
        char why[200];
        snprintf(why, sizeof why, "attnstatd took the connection but did not answer within %d ms",
                 c->timeout_ms);
        link_attempt_failed(c, why, 0);
    }
}

void link_advance(attnstat_client *c)
{
    if (c->link == LINK_UP) {
        if (!c->closed) {
            conn_pump_in(c); /* Releases free ring space */
            local_progress(c); /* local mode: the results computed since */
            conn_pump_out(c);
        }
        if (c->closed) {
            link_lost(c);
        } else if (c->hello_pending) {
            /* A background client that connected without a run, then was given its hello:
             * said now, as on a new connection (not a reconnection). */
            c->link_first = 1;
            link_connected(c);
        }
        return;
    }
    local_progress(c); /* not up: finished local computations release their tensors */
    if (c->link == LINK_CLOSED)
        return;
    /* What an attempt writes into c->err is the attempt's, not the caller's (whose call may well
     * succeed): kept in link_retry_why, and c->err put back. */
    char saved[sizeof c->err];
    memcpy(saved, c->err, sizeof saved);
    link_attempt_step(c);
    memcpy(c->err, saved, sizeof saved);
}

void link_wait(attnstat_client *c, int timeout_ms)
{
    int64_t now = util_now_ms();
    int until = -1; /* ms until the link's own next event, -1: none */
    if (c->link == LINK_CLOSED)
        return;
    if (c->link == LINK_DOWN)
        until = c->link_retry_at > now ? (int)(c->link_retry_at - now) : 0;
    else if (c->link != LINK_UP)
        until = c->link_deadline > now ? (int)(c->link_deadline - now) : 0;
    int ms = timeout_ms < 0 ? until : until < 0 || timeout_ms < until ? timeout_ms : until;
    if (c->link == LINK_DOWN) {
        if (ms > 0)
            poll(NULL, 0, ms); /* a signal ends it early */
    } else if (c->link == LINK_CONNECTING) {
        struct pollfd p = {.fd = c->fd, .events = POLLOUT};
        poll(&p, 1, ms);
    } else if (!c->closed) {
        conn_wait_once(c, ms);
    }
    link_advance(c);
}

int link_ready(attnstat_client *c)
{
    link_advance(c);
    return c->link == LINK_UP && c->hello_done;
}

/* ---- Saying what happened ----------------------------------------------------------------------*/
void link_describe(const attnstat_client *c, char *buf, size_t len)
{
    if (c->link == LINK_UP) {
        util_copy_str(buf, len, "");
        return;
    }
    if (c->link == LINK_CLOSED) {
        snprintf(buf, len, "the connection to attnstatd at %s is closed for good: %s", c->sock_path,
                 c->link_lost_why[0] ? c->link_lost_why
                                     : c->why_closed[0] ? c->why_closed : "closed");
        return;
    }
    unsigned long long dropped = c->st.dropped_disconnected - c->link_dropped_mark;
    char how[400];
    if (c->link_first) {
        if (c->link == LINK_DOWN) {
            int64_t in = c->link_retry_at - util_now_ms();
            snprintf(how, sizeof how, "next attempt in %lld ms; the last one: %.300s",
                     (long long)(in > 0 ? in : 0), c->link_retry_why);
        } else {
            snprintf(how, sizeof how, "attempt %u under way", c->link_attempts);
        }
        snprintf(buf, len, "not connected to attnstatd at %s yet (started in the background, "
                 "before the daemon); connecting when it comes, %llu pushes dropped so far (%s)",
                 c->sock_path, dropped, how);
        return;
    }
    if (c->link == LINK_DOWN) {
        int64_t in = c->link_retry_at - util_now_ms();
        snprintf(how, sizeof how, "next attempt in %lld ms%s%.300s", (long long)(in > 0 ? in : 0),
                 c->link_retry_why[0] ? "; the last one: " : "", c->link_retry_why);
    } else {
        snprintf(how, sizeof how, "attempt %u under way", c->link_attempts);
    }
    snprintf(buf, len, "connection to attnstatd at %s lost (%.200s); reconnecting, %llu pushes "
             "dropped so far (%s)", c->sock_path, c->link_lost_why, dropped, how);
}

attnstat_code link_drop(attnstat_client *c)
{
    c->st.dropped_local++;
    c->st.dropped_disconnected++;
    char why[sizeof c->err];
    link_describe(c, why, sizeof why);
    return client_fail(c, c->link == LINK_CLOSED ? ATTNSTAT_ECLOSED : ATTNSTAT_DROPPED,
                       "push dropped: %s", why);
}

int32_t attnstat_link_state(const attnstat_client *c, char *why, size_t len)
{
    if (why && len)
        why[0] = '\0';
    if (!c) {
        if (why)
            util_copy_str(why, len, "no client");
        return ATTNSTAT_LINK_CLOSED;
    }
    if (c->link == LINK_UP)
        return ATTNSTAT_LINK_UP;
    if (why)
        util_copy_str(why, len, c->link_lost_why[0] ? c->link_lost_why
                                : c->why_closed[0] ? c->why_closed : "not connected");
    return c->link == LINK_CLOSED ? ATTNSTAT_LINK_CLOSED : ATTNSTAT_LINK_RECONNECTING;
}
