/* test_client_link.c — libattnstat's reconnection, against a scripted peer: a thread of this test
 * that listens on a Unix socket, speaks the wire protocol as attnstatd would, and plays a daemon
 * that restarts (each accepted connection follows the next entry of the test's script; the test
 * tells it when to hang up). Checked:
 *   - on a new connection the client says the same Hello (run, rank, thresholds, config, devices),
 *     registers a new host ring (another name; both names gone from /dev/shm once confirmed),
 *     subscribes again, and pushes land byte for byte in the new ring; the pushes in flight at the
 *     loss are abandoned and flush reports them once (ELOST), the gap's pushes are dropped;
 *   - a client without a run (a monitor) subscribes again and gets alerts;
 *   - a refusal for good (protocol version) is not retried: the link is closed, pushes and poll
 *     say why, flush does not fail; a connection lost during the first hello is not retried;
 *   - "too many clients" is retried, with delays that double (lower bounds only: a loaded machine
 *     makes them longer, never shorter);
 *   - a background client (ATTNSTAT_CONNECT_BACKGROUND) made before its daemon listens: hello,
 *     layout and subscription kept, pushes dropped and counted, then everything said on the first
 *     connection and pushes landing, not counted as a reconnection; refused for good when its
 *     daemon comes and refuses it; an ordinary client when the daemon is there.
 * Random tensor data; the seed is printed (ATTNSTAT_TEST_SEED repeats a run). Waits are for
 * conditions with generous deadlines; the only fixed waits check that nothing happens. */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "attnstat.h"
#include "client_peer.h"
#include "client_testutil.h"
#include "frame.h"

enum { MAX_CONNS = 8, DEADLINE_MS = 120000 };

static uint64_t g_seed;

static int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* ---- The peer ----------------------------------------------------------------------------------*/
typedef enum {
    ACT_SERVE,   /* answer Hello and Status, map the ring, Release and Ack every push */
    ACT_SILENT,  /* the same, but pushes get no answer */
    ACT_VERSION, /* answer the Hello with Error(VERSION), and hang up */
    ACT_BUSY,    /* Error(BUSY) as soon as connected, and hang up */
    ACT_HANGUP,  /* answer the Hello, and hang up */
} act;

/* One connection, as the peer saw it. */
typedef struct {
    int64_t accepted_ms;
    int hellos, rings, subscribes, statuses, pushes, mismatches;
    char run[64], config[128], shm[64], dev[2][64];
    int32_t rank;
    int ndev, has_ceiling, sub_alerts, sub_results;
    double ceiling;
    uint32_t raise_after;
    int layouts, layout_first;  /* Layout messages; 1: the first came before the ring */
    uint32_t tp_rank, tp_size, layer_offset;
} seen;

typedef struct {
    char path[108];
    int lfd, ctl[2]; /* ctl: 'h' hang up now, 'a' send an alert, 'q' quit */
    pthread_t th;
    act script[MAX_CONNS]; /* connection i follows script[i]; past the end, the last entry */
    int nscript;
    const attnstat_tensor *expect[2];
    pthread_mutex_t mu;
    int conns;
    seen s[MAX_CONNS];
} lpeer;

static void lpeer_reply(int fd, Attnstat__Envelope__MsgCase kind, void *msg)
{
    Attnstat__Envelope out = ATTNSTAT__ENVELOPE__INIT;
    out.msg_case = kind;
    switch (kind) {
    case ATTNSTAT__ENVELOPE__MSG_HELLO_REPLY: out.hello_reply = msg; break;
    case ATTNSTAT__ENVELOPE__MSG_ERROR: out.error = msg; break;
    case ATTNSTAT__ENVELOPE__MSG_STATUS_REPLY: out.status_reply = msg; break;
    case ATTNSTAT__ENVELOPE__MSG_RELEASE: out.release = msg; break;
    case ATTNSTAT__ENVELOPE__MSG_ACK: out.ack = msg; break;
    case ATTNSTAT__ENVELOPE__MSG_ALERT: out.alert = msg; break;
    default: return;
    }
    peer_send(fd, &out);
}

static void lpeer_error(int fd, Attnstat__Code code, const char *msg)
{
    Attnstat__Error e = ATTNSTAT__ERROR__INIT;
    e.code = code;
    e.message = (char *)msg;
    lpeer_reply(fd, ATTNSTAT__ENVELOPE__MSG_ERROR, &e);
}

/* Records what one message says in s (under the lock). */
static void lpeer_note(lpeer *p, seen *s, const Attnstat__Envelope *env)
{
    pthread_mutex_lock(&p->mu);
    if (env->msg_case == ATTNSTAT__ENVELOPE__MSG_HELLO) {
        const Attnstat__Hello *h = env->hello;
        s->hellos++;
        snprintf(s->run, sizeof s->run, "%s", h->run ? h->run : "");
        snprintf(s->config, sizeof s->config, "%s", h->config ? h->config : "");
        s->rank = h->rank;
        s->ndev = (int)h->n_device_uuids;
        for (size_t i = 0; i < h->n_device_uuids && i < 2; i++)
            snprintf(s->dev[i], sizeof s->dev[i], "%s", h->device_uuids[i]);
        s->has_ceiling = h->thresholds && h->thresholds->has_logit_ceiling;
        s->ceiling = s->has_ceiling ? h->thresholds->logit_ceiling : 0;
        s->raise_after = h->thresholds ? h->thresholds->raise_after : 0;
    } else if (env->msg_case == ATTNSTAT__ENVELOPE__MSG_LAYOUT) {
        if (s->layouts++ == 0)
            s->layout_first = s->rings == 0;
        s->tp_rank = env->layout->tp_rank;
        s->tp_size = env->layout->tp_size;
        s->layer_offset = env->layout->layer_offset;
    } else if (env->msg_case == ATTNSTAT__ENVELOPE__MSG_REGISTER_BUFFER) {
        s->rings++;
        snprintf(s->shm, sizeof s->shm, "%s", env->register_buffer->shm_name);
    } else if (env->msg_case == ATTNSTAT__ENVELOPE__MSG_SUBSCRIBE) {
        s->subscribes++;
        s->sub_alerts = env->subscribe->alerts;
        s->sub_results = env->subscribe->results;
    } else if (env->msg_case == ATTNSTAT__ENVELOPE__MSG_STATUS) {
        s->statuses++;
    }
    pthread_mutex_unlock(&p->mu);
}

/* One connection the peer serves. */
typedef struct {
    lpeer *p;
    seen *s;
    int fd;
    act a;
    uint8_t *map;
    uint64_t map_size;
} lconn;

/* One push: compared with what the test expects (in the ring mapped), answered unless silent. */
static void lpeer_push(lconn *k, const Attnstat__Push *pu)
{
    lpeer *p = k->p;
    int bad = 0;
    if (p->expect[0])
        bad = !k->map || peer_compare(k->map, k->map_size, pu->q, p->expect[0]) ||
              peer_compare(k->map, k->map_size, pu->k, p->expect[1]);
    pthread_mutex_lock(&p->mu);
    k->s->pushes++;
    k->s->mismatches += bad;
    pthread_mutex_unlock(&p->mu);
    if (k->a == ACT_SILENT)
        return;
    Attnstat__Release rl = ATTNSTAT__RELEASE__INIT;
    rl.seq = pu->seq;
    lpeer_reply(k->fd, ATTNSTAT__ENVELOPE__MSG_RELEASE, &rl);
    Attnstat__Ack ak = ATTNSTAT__ACK__INIT;
    ak.seq = pu->seq;
    ak.code = ATTNSTAT__CODE__OK;
    lpeer_reply(k->fd, ATTNSTAT__ENVELOPE__MSG_ACK, &ak);
}

/* Handles one message (peer_read's handler); returns -1 when the connection is to be hung up. */
static int lpeer_message(void *ctx, const Attnstat__Envelope *env)
{
    lconn *k = ctx;
    lpeer_note(k->p, k->s, env);
    if (env->msg_case == ATTNSTAT__ENVELOPE__MSG_HELLO) {
        if (k->a == ACT_VERSION) {
            lpeer_error(k->fd, ATTNSTAT__CODE__VERSION, "protocol version 1 is not supported: "
                        "this daemon speaks version 9");
            return -1;
        }
        Attnstat__HelloReply hr = ATTNSTAT__HELLO_REPLY__INIT;
        hr.protocol_version = 1;
        hr.run_id = 42;
        hr.max_frame = FRAME_MAX_DEFAULT;
        static char *features[] = {"layout"};
        hr.n_features = 1;
        hr.features = features;
        lpeer_reply(k->fd, ATTNSTAT__ENVELOPE__MSG_HELLO_REPLY, &hr);
        return k->a == ACT_HANGUP ? -1 : 0;
    }
    if (env->msg_case == ATTNSTAT__ENVELOPE__MSG_REGISTER_BUFFER && !k->map) {
        peer_map(env->register_buffer, &k->map, &k->map_size);
    } else if (env->msg_case == ATTNSTAT__ENVELOPE__MSG_STATUS) {
        Attnstat__StatusReply sr = ATTNSTAT__STATUS_REPLY__INIT;
        sr.daemon_version = "scripted";
        lpeer_reply(k->fd, ATTNSTAT__ENVELOPE__MSG_STATUS_REPLY, &sr);
    } else if (env->msg_case == ATTNSTAT__ENVELOPE__MSG_PUSH) {
        lpeer_push(k, env->push);
    }
    return 0;
}

/* Serves one connection by action a until it is hung up; returns 1 when told to quit. */
static int lpeer_serve(lpeer *p, int fd, seen *s, act a)
{
    if (a == ACT_BUSY) {
        lpeer_error(fd, ATTNSTAT__CODE__BUSY, "too many clients (max_clients 1): try again later");
        return 0;
    }
    lconn k = {p, s, fd, a, NULL, 0};
    frame_reader rd;
    frame_reader_init(&rd, FRAME_MAX_DEFAULT);
    int quit = 0;
    for (;;) {
        struct pollfd pf[2] = {{.fd = fd, .events = POLLIN}, {.fd = p->ctl[0], .events = POLLIN}};
        if (poll(pf, 2, -1) < 0)
            continue;
        if (pf[1].revents) {
            char cmd = 0;
            if (read(p->ctl[0], &cmd, 1) == 1 && cmd == 'a') {
                Attnstat__Alert al = ATTNSTAT__ALERT__INIT;
                al.run = "watched";
                al.rule = ATTNSTAT__ALERT_RULE__LOGIT_CEILING;
                al.state = ATTNSTAT__ALERT_STATE__RAISED;
                lpeer_reply(fd, ATTNSTAT__ENVELOPE__MSG_ALERT, &al);
            }
            quit = cmd == 'q';
            if (cmd == 'q' || cmd == 'h')
                break;
            continue;
        }
        if (peer_read(fd, &rd, lpeer_message, &k) != 0)
            break;
    }
    if (k.map)
        munmap(k.map, k.map_size);
    frame_reader_free(&rd);
    return quit;
}

static void *lpeer_main(void *arg)
{
    lpeer *p = arg;
    for (;;) {
        struct pollfd pf[2] = {{.fd = p->lfd, .events = POLLIN},
                               {.fd = p->ctl[0], .events = POLLIN}};
        if (poll(pf, 2, -1) < 0)
            continue;
        if (pf[1].revents) {
            char cmd = 0;
            if (read(p->ctl[0], &cmd, 1) == 1 && cmd == 'q')
                return NULL;
            continue; /* nothing to hang up */
        }
        int fd = accept(p->lfd, NULL, NULL);
        if (fd < 0)
            continue;
        pthread_mutex_lock(&p->mu);
        int i = p->conns < MAX_CONNS ? p->conns : MAX_CONNS - 1;
        p->conns++;
        p->s[i].accepted_ms = now_ms();
        pthread_mutex_unlock(&p->mu);
        int quit = lpeer_serve(p, fd, &p->s[i], p->script[i < p->nscript ? i : p->nscript - 1]);
        close(fd);
        if (quit)
            return NULL;
    }
}

static void lpeer_start(lpeer *p, const act *script, int n)
{
    memset(p, 0, sizeof *p);
    snprintf(p->path, sizeof p->path, "/tmp/attnstat-link-%d.sock", (int)getpid());
    memcpy(p->script, script, (size_t)n * sizeof *script);
    p->nscript = n;
    pthread_mutex_init(&p->mu, NULL);
    p->lfd = peer_listen(p->path);
    ck_assert_int_ge(p->lfd, 0);
    ck_assert_int_eq(pipe(p->ctl), 0);
    ck_assert_int_eq(pthread_create(&p->th, NULL, lpeer_main, p), 0);
}

static void lpeer_cmd(lpeer *p, char cmd)
{
    ck_assert_int_eq(write(p->ctl[1], &cmd, 1), 1);
}

static void lpeer_stop(lpeer *p)
{
    lpeer_cmd(p, 'q');
    pthread_join(p->th, NULL);
    close(p->lfd);
    close(p->ctl[0]);
    close(p->ctl[1]);
    unlink(p->path);
    pthread_mutex_destroy(&p->mu);
}

static seen lpeer_seen(lpeer *p, int i)
{
    pthread_mutex_lock(&p->mu);
    seen s = p->s[i];
    pthread_mutex_unlock(&p->mu);
    return s;
}

static int lpeer_conns(lpeer *p)
{
    pthread_mutex_lock(&p->mu);
    int n = p->conns;
    pthread_mutex_unlock(&p->mu);
    return n;
}

/* ---- The client's side -------------------------------------------------------------------------*/
static attnstat_client *lpeer_client(const lpeer *p)
{
    attnstat_connect_opts o;
    attnstat_connect_opts_init(&o);
    o.socket_path = p->path;
    o.ring_bytes = 1 << 20;
    o.timeout_ms = 30000;
    attnstat_client *c = NULL;
    attnstat_error err;
    ck_assert_msg(attnstat_connect_ex(&o, &c, &err) == ATTNSTAT_OK, "connect: %s", err.msg);
    return c;
}

/* Polls c until its counters satisfy what (a check of st), or fails after the deadline. */
#define POLL_UNTIL(c, st, cond, what)                                                              \
    do {                                                                                           \
        int64_t until_ = now_ms() + DEADLINE_MS;                                                   \
        for (;;) {                                                                                 \
            attnstat_stats((c), &(st));                                                            \
            if (cond)                                                                              \
                break;                                                                             \
            ck_assert_msg(now_ms() < until_, "%s: not within %d ms (%s)", (what), DEADLINE_MS,    \
                          attnstat_last_error(c));                                                 \
            attnstat_poll((c), 20);                                                                \
        }                                                                                          \
    } while (0)

typedef struct {
    uint16_t mem[2 * 8 * 16];
    attnstat_tensor q, k;
} tensors;

/* Random bf16 q [1, 2, 8, 16] and k [1, 1, 8, 16] over one buffer (never all zeros). */
static void tensors_make(tensors *t, uint64_t *rng)
{
    do
        fill_random(t->mem, sizeof t->mem, rng);
    while (!t->mem[0] && !t->mem[1]);
    for (size_t i = 0; i < sizeof t->mem / 2; i++)
        t->mem[i] &= 0xbfff; /* finite bf16 values */
    attnstat_tensor_init(&t->q, t->mem, ATTNSTAT_BF16, 1, 2, 8, 16);
    attnstat_tensor_init(&t->k, t->mem, ATTNSTAT_BF16, 1, 1, 8, 16);
}

static attnstat_code push_step(attnstat_client *c, tensors *t, int64_t step)
{
    attnstat_push_opts o;
    attnstat_push_opts_init(&o);
    o.step = step;
    return attnstat_push(c, &o, &t->q, &t->k, NULL);
}

static int shm_exists(const char *name)
{
    int fd = shm_open(name, O_RDONLY, 0);
    if (fd >= 0)
        close(fd);
    return fd >= 0 || errno != ENOENT;
}

/* ---- The tests ---------------------------------------------------------------------------------*/
START_TEST(test_resume_says_the_same_hello_again)
{
    uint64_t rng = g_seed ^ 0x1111;
    lpeer p;
    lpeer_start(&p, (const act[]){ACT_SILENT, ACT_SERVE}, 2);
    attnstat_client *c = lpeer_client(&p);
    attnstat_thresholds th;
    attnstat_thresholds_init(&th);
    th.logit_ceiling = 7.5;
    th.raise_after = 3;
    const char *devs[2] = {"GPU-11111111-2222-3333-4444-555555555555",
                           "GPU-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee"};
    ck_assert_int_eq(attnstat_hello_ex(c, "resume", 3, &th, "{\"lr\": 0.1}", devs, 2),
                     ATTNSTAT_OK);
    attnstat_layout lay;
    attnstat_layout_init(&lay);
    lay.tp_rank = 3;
    lay.tp_size = 8;
    lay.layer_offset = 12;
    ck_assert_int_eq(attnstat_set_layout(c, &lay), ATTNSTAT_OK);
    ck_assert_int_eq(attnstat_subscribe(c, 1, 0), ATTNSTAT_OK);
    tensors t;
    tensors_make(&t, &rng);
    for (int i = 0; i < 3; i++)
        ck_assert_int_eq(push_step(c, &t, i), ATTNSTAT_OK); /* never answered: in flight */
    attnstat_counters st;
    int64_t until = now_ms() + DEADLINE_MS;
    while (lpeer_seen(&p, 0).pushes < 3) {
        ck_assert_msg(now_ms() < until, "the peer did not get the pushes");
        attnstat_poll(c, 20);
    }

    /* The daemon goes away: the next push notices; what was in flight is abandoned. */
    lpeer_cmd(&p, 'h');
    int sent_late = 0;
    attnstat_code rc;
    until = now_ms() + DEADLINE_MS;
    while ((rc = push_step(c, &t, 10)) == ATTNSTAT_OK) { /* until the hang-up arrives */
        ck_assert_msg(now_ms() < until, "the hang-up was never noticed");
        sent_late++;
        attnstat_poll(c, 20);
    }
    ck_assert_int_eq(rc, ATTNSTAT_DROPPED);
    ck_assert_msg(strstr(attnstat_last_error(c), "reconnecting, 1 pushes dropped so far"), "%s",
                  attnstat_last_error(c));
    attnstat_stats(c, &st);
    ck_assert_uint_eq(st.abandoned, 3 + (uint64_t)sent_late);
    ck_assert_uint_eq(st.in_flight, 0);
    ck_assert_uint_eq(st.dropped_disconnected, 1);
    ck_assert_uint_eq(st.disconnects, 1);
    ck_assert_int_eq(attnstat_flush(c, 1000), ATTNSTAT_ELOST);
    char want[64];
    snprintf(want, sizeof want, "%d pushes sent since the last flush", 3 + sent_late);
    ck_assert_msg(strstr(attnstat_last_error(c), want), "%s", attnstat_last_error(c));
    ck_assert_int_eq(attnstat_flush(c, 1000), ATTNSTAT_OK); /* said once */

    /* The new connection: the same hello, a new ring, the subscription again. */
    POLL_UNTIL(c, st, st.reconnects == 1, "reconnected");
    ck_assert_int_eq(attnstat_link_state(c, NULL, 0), ATTNSTAT_LINK_UP);
    seen a = lpeer_seen(&p, 0), b = lpeer_seen(&p, 1);
    ck_assert_int_eq(b.hellos, 1);
    ck_assert_str_eq(b.run, "resume");
    ck_assert_int_eq(b.rank, 3);
    ck_assert_str_eq(b.config, "{\"lr\": 0.1}");
    ck_assert(b.has_ceiling && b.ceiling == 7.5 && b.raise_after == 3);
    ck_assert_int_eq(b.ndev, 2);
    ck_assert_str_eq(b.dev[0], devs[0]);
    ck_assert_str_eq(b.dev[1], devs[1]);
    ck_assert_int_eq(b.rings, 1);
    /* the layout said again, before the ring: no push of the new connection goes without it */
    ck_assert_int_eq(a.layouts, 1);
    ck_assert_int_eq(b.layouts, 1);
    ck_assert_int_eq(b.layout_first, 1);
    ck_assert(b.tp_rank == 3 && b.tp_size == 8 && b.layer_offset == 12);
    ck_assert_str_ne(b.shm, a.shm);
    ck_assert_msg(!shm_exists(a.shm) && !shm_exists(b.shm), "a ring's name is left in /dev/shm");
    ck_assert_int_eq(a.subscribes, 1);
    ck_assert_int_eq(b.subscribes, 1);
    ck_assert(b.sub_alerts == 1 && b.sub_results == 0);
    ck_assert_int_eq(attnstat_run_id(c), 42);

    /* Pushes go out again, into the new ring byte for byte. */
    tensors_make(&t, &rng);
    p.expect[1] = &t.k; /* read by the peer only once a push arrives */
    p.expect[0] = &t.q;
    ck_assert_int_eq(push_step(c, &t, 11), ATTNSTAT_OK);
    ck_assert_int_eq(attnstat_flush(c, DEADLINE_MS), ATTNSTAT_OK);
    b = lpeer_seen(&p, 1);
    ck_assert_int_eq(b.pushes, 1);
    ck_assert_int_eq(b.mismatches, 0);
    attnstat_stats(c, &st);
    ck_assert_uint_eq(st.acked, 1);
    ck_assert_uint_eq(st.sent, st.acked + st.abandoned);
    attnstat_close(c);
    lpeer_stop(&p);
}
END_TEST

typedef struct {
    int n;
    char run[32];
} alert_seen;

static void on_alert(void *user, const attnstat_alert *al)
{
    alert_seen *a = user;
    a->n++;
    snprintf(a->run, sizeof a->run, "%s", al->run);
}

START_TEST(test_monitor_subscribes_again)
{
    lpeer p;
    lpeer_start(&p, (const act[]){ACT_SERVE}, 1);
    attnstat_client *c = lpeer_client(&p);
    alert_seen got = {0, ""};
    attnstat_set_alert_callback(c, on_alert, &got);
    ck_assert_int_eq(attnstat_subscribe(c, 1, 1), ATTNSTAT_OK);
    int64_t until = now_ms() + DEADLINE_MS;
    while (lpeer_seen(&p, 0).subscribes < 1) {
        ck_assert_msg(now_ms() < until, "the peer did not get the Subscribe");
        attnstat_poll(c, 20);
    }
    lpeer_cmd(&p, 'h');
    attnstat_counters st;
    POLL_UNTIL(c, st, st.reconnects == 1, "reconnected");
    seen b = lpeer_seen(&p, 1);
    ck_assert_int_eq(b.hellos + b.rings, 0); /* no run: no hello, no ring */
    ck_assert_int_eq(b.subscribes, 1);
    ck_assert(b.sub_alerts == 1 && b.sub_results == 1);
    ck_assert_int_eq(st.disconnects, 1);
    lpeer_cmd(&p, 'a');
    until = now_ms() + DEADLINE_MS;
    while (got.n < 1) {
        ck_assert_msg(now_ms() < until, "the alert did not arrive");
        ck_assert_int_eq(attnstat_poll(c, 20), ATTNSTAT_OK);
    }
    ck_assert_str_eq(got.run, "watched");
    attnstat_close(c);
    lpeer_stop(&p);
}
END_TEST

/* Polls c (tolerating ECLOSED) for ms of wall time: long enough for several attempts, were any
 * made. */
static void poll_for(attnstat_client *c, int ms)
{
    int64_t until = now_ms() + ms;
    while (now_ms() < until)
        attnstat_poll(c, 20);
}

START_TEST(test_refusal_is_not_retried)
{
    uint64_t rng = g_seed ^ 0x2222;
    lpeer p;
    lpeer_start(&p, (const act[]){ACT_SERVE, ACT_VERSION, ACT_SERVE}, 3);
    attnstat_client *c = lpeer_client(&p);
    ck_assert_int_eq(attnstat_hello(c, "refused-later", 0, NULL, NULL), ATTNSTAT_OK);
    lpeer_cmd(&p, 'h');
    int64_t until = now_ms() + DEADLINE_MS;
    char why[256];
    while (attnstat_link_state(c, why, sizeof why) != ATTNSTAT_LINK_CLOSED) {
        ck_assert_msg(now_ms() < until, "the refusal did not close the link: %s", why);
        attnstat_poll(c, 20);
    }
    ck_assert_msg(strstr(why, "refused") && strstr(why, "protocol version"), "%s", why);
    tensors t;
    tensors_make(&t, &rng);
    ck_assert_int_eq(push_step(c, &t, 0), ATTNSTAT_ECLOSED);
    ck_assert_msg(strstr(attnstat_last_error(c), "protocol version"), "%s",
                  attnstat_last_error(c));
    ck_assert_int_eq(attnstat_poll(c, 0), ATTNSTAT_ECLOSED);
    ck_assert_int_eq(attnstat_flush(c, 1000), ATTNSTAT_OK); /* nothing was in flight */
    poll_for(c, 1500);
    ck_assert_int_eq(lpeer_conns(&p), 2); /* never asked again */
    attnstat_close(c);
    lpeer_stop(&p);
}
END_TEST

START_TEST(test_lost_during_first_hello_is_not_retried)
{
    lpeer p;
    lpeer_start(&p, (const act[]){ACT_HANGUP, ACT_SERVE}, 2);
    attnstat_client *c = lpeer_client(&p);
    ck_assert_int_eq(attnstat_hello(c, "never", 0, NULL, NULL), ATTNSTAT_ECLOSED);
    ck_assert_int_eq(attnstat_link_state(c, NULL, 0), ATTNSTAT_LINK_CLOSED);
    poll_for(c, 1500);
    ck_assert_int_eq(lpeer_conns(&p), 1);
    ck_assert_int_eq(attnstat_flush(c, 0), ATTNSTAT_ECLOSED);
    attnstat_close(c);
    lpeer_stop(&p);
}
END_TEST

START_TEST(test_busy_is_retried_with_growing_delays)
{
    lpeer p;
    lpeer_start(&p, (const act[]){ACT_SERVE, ACT_BUSY, ACT_BUSY, ACT_SERVE}, 4);
    attnstat_client *c = lpeer_client(&p);
    ck_assert_int_eq(attnstat_hello(c, "busy", 0, NULL, NULL), ATTNSTAT_OK);
    lpeer_cmd(&p, 'h');
    attnstat_counters st;
    POLL_UNTIL(c, st, st.reconnects == 1, "reconnected after two refusals for want of room");
    ck_assert_int_eq(lpeer_conns(&p), 4);
    int64_t t1 = lpeer_seen(&p, 1).accepted_ms, t2 = lpeer_seen(&p, 2).accepted_ms,
            t3 = lpeer_seen(&p, 3).accepted_ms;
    /* An attempt is made only after the one before failed, at least half its delay later: the
     * delays (100, 200, 400 ms before jitter) give at least 100 and 200 ms here. */
    ck_assert_msg(t2 - t1 >= 100 && t3 - t2 >= 200, "attempts %lld and %lld ms apart",
                  (long long)(t2 - t1), (long long)(t3 - t2));
    ck_assert_int_eq(lpeer_seen(&p, 3).hellos, 1);
    attnstat_close(c);
    lpeer_stop(&p);
}
END_TEST

/* ---- A client that starts before its daemon (ATTNSTAT_CONNECT_BACKGROUND) --------------------*/
/* A background client on the path the peer will listen on (nothing listens there yet). */
static attnstat_client *background_client(const char *path)
{
    attnstat_connect_opts o;
    attnstat_connect_opts_init(&o);
    o.socket_path = path;
    o.ring_bytes = 1 << 20;
    o.timeout_ms = 30000;
    attnstat_client *c = NULL;
    attnstat_error err;
    ck_assert_msg(attnstat_connect2(&o, ATTNSTAT_CONNECT_BACKGROUND, &c, &err) == ATTNSTAT_OK,
                  "connect2: %s", err.msg);
    ck_assert_ptr_nonnull(c);
    ck_assert_str_eq(err.msg, "");
    return c;
}

/* The socket of a peer not started yet (lpeer_start's name), with no stale file. */
static void future_path(char *buf, size_t len)
{
    snprintf(buf, len, "/tmp/attnstat-link-%d.sock", (int)getpid());
    unlink(buf);
}

START_TEST(test_background_client_starts_before_its_daemon)
{
    uint64_t rng = g_seed ^ 0x4444;
    char path[108];
    future_path(path, sizeof path);
    /* without the flag: refused, as always; an unknown flag is refused by name */
    attnstat_connect_opts o;
    attnstat_connect_opts_init(&o);
    o.socket_path = path;
    attnstat_client *c = NULL;
    attnstat_error err;
    ck_assert_int_eq(attnstat_connect2(&o, 0, &c, &err), ATTNSTAT_ECONNECT);
    ck_assert_msg(strstr(err.msg, "no such socket"), "%s", err.msg);
    ck_assert_ptr_null(c);
    ck_assert_int_eq(attnstat_connect2(&o, 2, &c, &err), ATTNSTAT_EINVAL);
    ck_assert_msg(strstr(err.msg, "unknown flags 0x2"), "%s", err.msg);

    c = background_client(path);
    char why[256];
    ck_assert_int_eq(attnstat_link_state(c, why, sizeof why), ATTNSTAT_LINK_RECONNECTING);
    ck_assert_msg(strstr(why, "not connected yet") && strstr(why, "no socket yet"), "%s", why);
    ck_assert_int_eq(attnstat_subscribe(c, 1, 0), ATTNSTAT_OK);
    attnstat_thresholds th;
    attnstat_thresholds_init(&th);
    th.logit_ceiling = 9.5;
    int64_t t0 = now_ms();
    ck_assert_int_eq(attnstat_hello(c, "early", 5, &th, "{\"k8s\": 1}"), ATTNSTAT_OK);
    ck_assert_msg(now_ms() - t0 < 10000, "hello waited %lld ms for a daemon that is not there",
                  (long long)(now_ms() - t0));
    ck_assert_int_eq(attnstat_hello(c, "early", 5, NULL, NULL), ATTNSTAT_ESTATE);
    ck_assert_int_eq(attnstat_run_id(c), -1);
    attnstat_layout lay;
    attnstat_layout_init(&lay);
    lay.tp_rank = 1;
    lay.tp_size = 2;
    ck_assert_int_eq(attnstat_set_layout(c, &lay), ATTNSTAT_OK);
    tensors t;
    tensors_make(&t, &rng);
    for (int i = 0; i < 4; i++)
        ck_assert_int_eq(push_step(c, &t, i), ATTNSTAT_DROPPED);
    ck_assert_msg(strstr(attnstat_last_error(c), "not connected to attnstatd") &&
                      strstr(attnstat_last_error(c), "4 pushes dropped"), "%s",
                  attnstat_last_error(c));
    attnstat_counters st;
    attnstat_stats(c, &st);
    ck_assert_int_eq(st.pushed, 4);
    ck_assert_int_eq(st.dropped_local, 4);
    ck_assert_int_eq(st.dropped_disconnected, 4);
    ck_assert_int_eq(st.sent, 0);
    ck_assert_int_eq(attnstat_flush(c, 1000), ATTNSTAT_OK); /* nothing was sent */
    ck_assert_int_eq(attnstat_poll(c, 0), ATTNSTAT_OK);

    /* The daemon comes: the kept hello, layout, ring and subscription are said on its first
     * connection, and pushes land. */
    lpeer p;
    lpeer_start(&p, (const act[]){ACT_SERVE}, 1);
    ck_assert_str_eq(p.path, path);
    int64_t until = now_ms() + DEADLINE_MS;
    while (attnstat_link_state(c, why, sizeof why) != ATTNSTAT_LINK_UP) {
        ck_assert_msg(now_ms() < until, "not connected when the daemon came: %s", why);
        ck_assert_int_eq(attnstat_poll(c, 20), ATTNSTAT_OK);
    }
    ck_assert_int_eq(attnstat_run_id(c), 42);
    seen s = lpeer_seen(&p, 0);
    ck_assert_int_eq(s.hellos, 1);
    ck_assert_str_eq(s.run, "early");
    ck_assert_int_eq(s.rank, 5);
    ck_assert_str_eq(s.config, "{\"k8s\": 1}");
    ck_assert_msg(s.has_ceiling && s.ceiling == 9.5, "ceiling %g", s.ceiling);
    ck_assert_int_eq(s.rings, 1);
    ck_assert_int_eq(s.subscribes, 1);
    ck_assert_int_eq(s.sub_alerts, 1);
    ck_assert_msg(s.layouts == 1 && s.layout_first && s.tp_rank == 1 && s.tp_size == 2,
                  "layouts %d (first %d), tp %u/%u", s.layouts, s.layout_first, s.tp_rank,
                  s.tp_size);
    p.expect[0] = &t.q;
    p.expect[1] = &t.k;
    for (int i = 10; i < 13; i++)
        ck_assert_int_eq(push_step(c, &t, i), ATTNSTAT_OK);
    ck_assert_int_eq(attnstat_flush(c, DEADLINE_MS), ATTNSTAT_OK);
    s = lpeer_seen(&p, 0);
    ck_assert_int_eq(s.pushes, 3);
    ck_assert_int_eq(s.mismatches, 0);
    attnstat_stats(c, &st);
    ck_assert_int_eq(st.acked, 3);
    ck_assert_int_eq(st.dropped_disconnected, 4);
    ck_assert_int_eq(st.reconnects, 0); /* its first connection: nothing was lost */
    ck_assert_int_eq(st.disconnects, 0);
    ck_assert_int_eq(lpeer_conns(&p), 1);
    attnstat_close(c);
    lpeer_stop(&p);
}
END_TEST

START_TEST(test_background_client_refused_when_its_daemon_comes)
{
    uint64_t rng = g_seed ^ 0x5555;
    char path[108], why[256];
    future_path(path, sizeof path);
    attnstat_client *c = background_client(path);
    ck_assert_int_eq(attnstat_hello(c, "too-new", 0, NULL, NULL), ATTNSTAT_OK);
    lpeer p;
    lpeer_start(&p, (const act[]){ACT_VERSION, ACT_SERVE}, 2);
    int64_t until = now_ms() + DEADLINE_MS;
    while (attnstat_link_state(c, why, sizeof why) != ATTNSTAT_LINK_CLOSED) {
        ck_assert_msg(now_ms() < until, "the refusal did not close the link: %s", why);
        attnstat_poll(c, 20);
    }
    ck_assert_msg(strstr(why, "refused this client when it connected") &&
                      strstr(why, "protocol version"), "%s", why);
    tensors t;
    tensors_make(&t, &rng);
    ck_assert_int_eq(push_step(c, &t, 0), ATTNSTAT_ECLOSED);
    poll_for(c, 1500);
    ck_assert_int_eq(lpeer_conns(&p), 1); /* never asked again */
    attnstat_close(c);
    lpeer_stop(&p);
}
END_TEST

/* With its daemon there, a background client is an ordinary one: the hello is answered at once. */
START_TEST(test_background_client_with_its_daemon_there)
{
    lpeer p;
    lpeer_start(&p, (const act[]){ACT_SERVE}, 1);
    attnstat_client *c = background_client(p.path);
    ck_assert_int_eq(attnstat_link_state(c, NULL, 0), ATTNSTAT_LINK_UP);
    ck_assert_int_eq(attnstat_hello(c, "there", 0, NULL, NULL), ATTNSTAT_OK);
    ck_assert_int_eq(attnstat_run_id(c), 42);
    attnstat_close(c);
    lpeer_stop(&p);
}
END_TEST

int main(void)
{
    g_seed = client_test_seed("test_client_link");
    Suite *s = suite_create("client_link");
    TCase *tc = tcase_create("link");
    tcase_add_test(tc, test_resume_says_the_same_hello_again);
    tcase_add_test(tc, test_monitor_subscribes_again);
    tcase_add_test(tc, test_refusal_is_not_retried);
    tcase_add_test(tc, test_lost_during_first_hello_is_not_retried);
    tcase_add_test(tc, test_busy_is_retried_with_growing_delays);
    tcase_add_test(tc, test_background_client_starts_before_its_daemon);
    tcase_add_test(tc, test_background_client_refused_when_its_daemon_comes);
    tcase_add_test(tc, test_background_client_with_its_daemon_there);
    tcase_set_timeout(tc, 300);
    suite_add_tcase(s, tc);
    return client_test_run(s);
}
