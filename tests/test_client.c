/* test_client.c — unit tests of libattnstat that need no attnstatd: argument checking and error
 * codes, and the client's conversation with a scripted peer (a thread in this test that speaks the
 * wire protocol) — byte-exact ring contents, drops counted when the ring or the outgoing queue is
 * full, pushes that return while the peer reads nothing, a refused ring, a lost connection.
 * The ring allocator and the compact copy have their own suite (test_client_ring.c).
 * Random data; the seed is printed (set ATTNSTAT_TEST_SEED to repeat a run).
 * Why this file is long: one scripted peer (its modes, its checks of what arrives) serves every
 * conversation here; split in two, each half would carry its own copy of it. */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <poll.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "attnstat.h"
#include "client_peer.h"
#include "client_testutil.h"
#include "frame.h"

static uint64_t g_seed;

/* ---- Arguments and codes ---------------------------------------------------------------------- */
START_TEST(test_codes_and_args)
{
    for (int c = ATTNSTAT_OK; c <= ATTNSTAT_ELOST; c++) {
        const char *m = attnstat_strerror((attnstat_code)c);
        ck_assert_ptr_nonnull(m);
        ck_assert_int_gt((int)strlen(m), 1);
    }
    ck_assert_str_eq(attnstat_strerror((attnstat_code)999), "unknown attnstat code");
    ck_assert_uint_eq(attnstat_dtype_size(ATTNSTAT_BF16), 2);
    ck_assert_uint_eq(attnstat_dtype_size((attnstat_dtype)7), 0);
    ck_assert_str_eq(attnstat_rule_name(ATTNSTAT_RULE_LOGIT_CEILING), "logit_ceiling");
    ck_assert_str_eq(attnstat_state_name(ATTNSTAT_ALERT_CLEARED), "cleared");

    attnstat_error err;
    attnstat_client *c = (attnstat_client *)1;
    ck_assert_int_eq(attnstat_connect("/nonexistent/dir/attnstatd.sock", &c, &err),
                     ATTNSTAT_ECONNECT);
    ck_assert_ptr_null(c);
    ck_assert_int_eq(err.code, ATTNSTAT_ECONNECT);
    ck_assert_ptr_nonnull(strstr(err.msg, "/nonexistent/dir/attnstatd.sock"));
    ck_assert_ptr_nonnull(strstr(err.msg, "no such socket"));
    ck_assert_int_eq(attnstat_connect(NULL, NULL, &err), ATTNSTAT_EINVAL);
    char longp[300];
    memset(longp, 'x', sizeof longp - 1);
    longp[sizeof longp - 1] = '\0';
    ck_assert_int_eq(attnstat_connect(longp, &c, &err), ATTNSTAT_EINVAL);
    ck_assert_ptr_nonnull(strstr(err.msg, "too long"));

    char buf[256];
    setenv("ATTNSTAT_SOCKET", "/tmp/x.sock", 1);
    ck_assert_str_eq(attnstat_default_socket(buf, sizeof buf), "/tmp/x.sock");
    unsetenv("ATTNSTAT_SOCKET");
    setenv("XDG_RUNTIME_DIR", "/run/user/7", 1);
    ck_assert_str_eq(attnstat_default_socket(buf, sizeof buf), "/run/user/7/attnstat/attnstatd.sock");
    unsetenv("XDG_RUNTIME_DIR");
    ck_assert_str_eq(attnstat_default_socket(buf, sizeof buf), "/run/attnstat/attnstatd.sock");
    ck_assert_ptr_null(attnstat_default_socket(buf, 4));

    attnstat_thresholds th;
    attnstat_thresholds_init(&th);
    ck_assert(isnan(th.entropy_floor) && isnan(th.logit_ceiling) && th.raise_after == 0);
    attnstat_push_opts o;
    attnstat_push_opts_init(&o);
    ck_assert_int_eq(o.window_left, -1);
    ck_assert_int_eq(o.window_right, -1);
    ck_assert_int_eq(attnstat_push(NULL, &o, NULL, NULL, NULL), ATTNSTAT_EINVAL);
    attnstat_close(NULL);
}
END_TEST

/* ---- A scripted peer -------------------------------------------------------------------------- */
enum { PEER_ACK, PEER_SILENT, PEER_STOPPED, PEER_DROP, PEER_REFUSE_RING, PEER_HANGUP, PEER_BIG_FRAMES,
       PEER_LAYOUT, /* PEER_ACK, and its HelloReply lists "layout" and "interventions" */
       PEER_SINKS, /* PEER_ACK, and its HelloReply lists "sinks" */
       PEER_STATS /* PEER_ACK, and its HelloReply lists "stats" */ };

typedef struct {
    int mode;
    char path[108];
    int lfd;
    pthread_t th;
    /* what the test expects in the next push (checked byte by byte in the shared memory) */
    const attnstat_tensor *expect[3];
    int pushes, mismatches, has_v;
    uint64_t last_offset_q;
    char shm_name[64];
    int stop_pipe[2];
    int layouts;                      /* ParallelLayout messages received */
    Attnstat__ParallelLayout layout;  /* the last one's fields (no pointers in it) */
    const attnstat_tensor *expect_sinks; /* the next pushes' sinks (checked in the ring), or NULL */
    int sinks_seen;                   /* pushes that named sinks */
    int64_t stats_seen[8];            /* Push.stats of the first 8 pushes; -1: unset */
    int interventions;                /* Intervention messages received; the last one's fields: */
    char iv_kind[40], iv_detail[64];
    int64_t iv_step;
    int iv_has_layer, iv_has_threshold, iv_has_measured;
    uint32_t iv_layer, iv_heads[8];
    size_t iv_nheads, iv_nvalues;
    double iv_values[8], iv_threshold, iv_measured;
} peer;

/* One accepted connection of the peer. */
typedef struct {
    peer *p;
    int fd;
    uint8_t *map;
    uint64_t map_size;
    int stopped;
} peer_conn;

/* Answers one message as the peer's mode says (peer_read's handler). */
static int peer_on_message(void *ctx, const Attnstat__Envelope *env)
{
    peer_conn *k = ctx;
    peer *p = k->p;
    if (k->stopped)
        return 1;
    Attnstat__Envelope out = ATTNSTAT__ENVELOPE__INIT;
    if (env->msg_case == ATTNSTAT__ENVELOPE__MSG_HELLO) {
        Attnstat__HelloReply hr = ATTNSTAT__HELLO_REPLY__INIT;
        hr.protocol_version = 1;
        hr.run_id = 42;
        hr.max_frame = p->mode == PEER_BIG_FRAMES ? 8u << 20 : FRAME_MAX_DEFAULT;
        hr.queue_capacity = 8;
        static char *features[] = {"layout", "interventions"}, *features_sinks[] = {"sinks"},
                    *features_stats[] = {"stats"};
        hr.n_features = p->mode == PEER_LAYOUT ? 2 : p->mode == PEER_SINKS || p->mode == PEER_STATS;
        hr.features = p->mode == PEER_SINKS   ? features_sinks
                      : p->mode == PEER_STATS ? features_stats
                                              : features;
        out.msg_case = ATTNSTAT__ENVELOPE__MSG_HELLO_REPLY;
        out.hello_reply = &hr;
        peer_send(k->fd, &out);
        if (p->mode == PEER_HANGUP)
            return -1;
    } else if (env->msg_case == ATTNSTAT__ENVELOPE__MSG_INTERVENTION) {
        const Attnstat__Intervention *iv = env->intervention;
        p->interventions++;
        snprintf(p->iv_kind, sizeof p->iv_kind, "%s", iv->kind ? iv->kind : "");
        snprintf(p->iv_detail, sizeof p->iv_detail, "%s", iv->detail ? iv->detail : "");
        p->iv_step = iv->step;
        p->iv_has_layer = iv->has_layer, p->iv_layer = iv->layer;
        p->iv_nheads = iv->n_heads, p->iv_nvalues = iv->n_values;
        for (size_t i = 0; i < iv->n_heads && i < 8; i++)
            p->iv_heads[i] = iv->heads[i];
        for (size_t i = 0; i < iv->n_values && i < 8; i++)
            p->iv_values[i] = iv->values[i];
        p->iv_has_threshold = iv->has_threshold, p->iv_threshold = iv->threshold;
        p->iv_has_measured = iv->has_measured, p->iv_measured = iv->measured;
    } else if (env->msg_case == ATTNSTAT__ENVELOPE__MSG_LAYOUT) {
        p->layout = *env->layout;
        p->layout.base.unknown_fields = NULL;
        p->layouts++;
    } else if (env->msg_case == ATTNSTAT__ENVELOPE__MSG_REGISTER_BUFFER) {
        Attnstat__RegisterBuffer *rb = env->register_buffer;
        if (p->mode == PEER_REFUSE_RING) {
            Attnstat__Error e = ATTNSTAT__ERROR__INIT;
            e.code = ATTNSTAT__CODE__BUSY;
            e.message = "too many buffers for this client";
            e.has_ref = 1;
            e.ref = rb->id;
            out.msg_case = ATTNSTAT__ENVELOPE__MSG_ERROR;
            out.error = &e;
            peer_send(k->fd, &out);
        } else {
            snprintf(p->shm_name, sizeof p->shm_name, "%s", rb->shm_name);
            peer_map(rb, &k->map, &k->map_size);
        }
    } else if (env->msg_case == ATTNSTAT__ENVELOPE__MSG_STATUS) {
        Attnstat__StatusReply sr = ATTNSTAT__STATUS_REPLY__INIT;
        Attnstat__WorkerStatus w = ATTNSTAT__WORKER_STATUS__INIT;
        Attnstat__WorkerStatus *wl[1] = {&w};
        w.name = "cpu";
        w.queue_depth = 1;
        w.queue_capacity = 8;
        sr.daemon_version = "fake";
        char *big = NULL;
        if (p->mode == PEER_BIG_FRAMES) { /* a reply over 1 MiB, under the 8 MiB said */
            big = malloc(2u << 20);
            memset(big, 'x', (2u << 20) - 1);
            big[(2u << 20) - 1] = '\0';
            sr.db_path = big;
        }
        sr.has_clients = 1;
        sr.clients = 1;
        sr.has_pushes = 1;
        sr.pushes = (uint64_t)p->pushes;
        sr.n_workers = 1;
        sr.workers = wl;
        out.msg_case = ATTNSTAT__ENVELOPE__MSG_STATUS_REPLY;
        out.status_reply = &sr;
        peer_send(k->fd, &out);
        free(big);
        if (p->mode == PEER_STOPPED)
            k->stopped = 1; /* reads nothing more, like a SIGSTOP'd daemon */
    } else if (env->msg_case == ATTNSTAT__ENVELOPE__MSG_PUSH) {
        Attnstat__Push *pu = env->push;
        if (p->pushes < 8)
            p->stats_seen[p->pushes] = pu->has_stats ? (int64_t)pu->stats : -1;
        p->pushes++;
        p->last_offset_q = pu->q->offset;
        if (k->map && p->expect[0]) {
            p->mismatches += peer_compare(k->map, k->map_size, pu->q, p->expect[0]);
            p->mismatches += peer_compare(k->map, k->map_size, pu->k, p->expect[1]);
            if (p->expect[2])
                p->mismatches +=
                    pu->v ? peer_compare(k->map, k->map_size, pu->v, p->expect[2]) : 1;
        }
        if (pu->sinks) {
            p->sinks_seen++;
            p->mismatches += k->map ? peer_compare(k->map, k->map_size, pu->sinks, p->expect_sinks)
                                    : 1;
        }
        if (p->mode == PEER_ACK || p->mode == PEER_LAYOUT || p->mode == PEER_SINKS ||
            p->mode == PEER_STATS) {
            Attnstat__Release rl = ATTNSTAT__RELEASE__INIT;
            rl.seq = pu->seq;
            out.msg_case = ATTNSTAT__ENVELOPE__MSG_RELEASE;
            out.release = &rl;
            peer_send(k->fd, &out);
            Attnstat__Ack ak = ATTNSTAT__ACK__INIT;
            ak.seq = pu->seq;
            ak.code = ATTNSTAT__CODE__OK;
            out.msg_case = ATTNSTAT__ENVELOPE__MSG_ACK;
            out.ack = &ak;
            peer_send(k->fd, &out);
        } else if (p->mode == PEER_DROP) {
            Attnstat__Ack ak = ATTNSTAT__ACK__INIT;
            ak.seq = pu->seq;
            ak.code = ATTNSTAT__CODE__DROPPED;
            ak.message = "queue full";
            out.msg_case = ATTNSTAT__ENVELOPE__MSG_ACK;
            out.ack = &ak;
            peer_send(k->fd, &out);
        }
    }
    return k->stopped;
}

static void *peer_main(void *arg)
{
    peer *p = arg;
    peer_conn k = {p, accept(p->lfd, NULL, NULL), NULL, 0, 0};
    if (k.fd < 0)
        return NULL;
    frame_reader rd;
    frame_reader_init(&rd, FRAME_MAX_DEFAULT);
    for (;;) {
        struct pollfd pf[2] = {{.fd = k.fd, .events = k.stopped ? 0 : POLLIN},
                               {.fd = p->stop_pipe[0], .events = POLLIN}};
        if (poll(pf, 2, -1) < 0)
            break;
        if (pf[1].revents)
            break;
        if (!(pf[0].revents & (POLLIN | POLLHUP)))
            continue;
        if (peer_read(k.fd, &rd, peer_on_message, &k) != 0)
            break;
    }
    if (k.map)
        munmap(k.map, k.map_size);
    frame_reader_free(&rd);
    close(k.fd);
    return NULL;
}

static void peer_start(peer *p, int mode)
{
    memset(p, 0, sizeof *p);
    p->mode = mode;
    snprintf(p->path, sizeof p->path, "/tmp/attnstat-test-%d-%d.sock", (int)getpid(), mode);
    p->lfd = peer_listen(p->path);
    ck_assert_int_ge(p->lfd, 0);
    ck_assert_int_eq(pipe(p->stop_pipe), 0);
    ck_assert_int_eq(pthread_create(&p->th, NULL, peer_main, p), 0);
}

static void peer_stop(peer *p)
{
    ck_assert_int_eq(write(p->stop_pipe[1], "x", 1), 1);
    pthread_join(p->th, NULL);
    close(p->lfd);
    close(p->stop_pipe[0]);
    close(p->stop_pipe[1]);
    unlink(p->path);
}

static attnstat_client *connect_small(peer *p, uint64_t ring_size, uint64_t queue)
{
    attnstat_connect_opts o;
    attnstat_connect_opts_init(&o);
    o.socket_path = p->path;
    o.ring_bytes = ring_size;
    o.queue_bytes = queue;
    attnstat_client *c = NULL;
    attnstat_error err;
    ck_assert_msg(attnstat_connect_ex(&o, &c, &err) == ATTNSTAT_OK, "connect: %s", err.msg);
    return c;
}

/* Strided host tensors of every dtype and layout arrive in the ring byte for byte. */
START_TEST(test_push_bytes_exact)
{
    uint64_t s = g_seed ^ 0x3333;
    peer p;
    peer_start(&p, PEER_ACK);
    attnstat_client *c = connect_small(&p, 1 << 20, 0);
    ck_assert_int_eq(attnstat_push(c, &(attnstat_push_opts){.window_left = -1, .window_right = -1},
                                   &(attnstat_tensor){0}, &(attnstat_tensor){0}, NULL),
                     ATTNSTAT_EINVAL); /* zero shapes, before the state check */
    attnstat_thresholds th;
    attnstat_thresholds_init(&th);
    th.logit_ceiling = 50;
    ck_assert_msg(attnstat_hello(c, "unit", 3, &th, "{\"lr\": 0.1}") == ATTNSTAT_OK, "%s",
                  attnstat_last_error(c));
    ck_assert_int_eq(attnstat_run_id(c), 42);
    /* the peer mapped the ring at registration: its name is already gone from /dev/shm */
    ck_assert(p.shm_name[0] == '/');
    ck_assert_int_lt(shm_open(p.shm_name, O_RDONLY, 0), 0);
    ck_assert_int_eq(errno, ENOENT);
    ck_assert_int_eq(attnstat_hello(c, "unit", 3, NULL, NULL), ATTNSTAT_ESTATE);
    ck_assert_ptr_nonnull(strstr(attnstat_last_error(c), "already"));
    for (int it = 0; it < 300; it++) {
        layout lq, lk, lv;
        random_layout(&s, &lq);
        random_layout(&s, &lk);
        random_layout(&s, &lv);
        /* make the shapes agree: same B and D, Hq a multiple of Hkv, same dtype */
        lk.shape[0] = lq.shape[0];
        lk.shape[3] = lq.shape[3];
        lk.esize = lq.esize;
        lq.shape[1] = lk.shape[1] * (1 + (int64_t)rng_below(&s, 2));
        memcpy(lv.shape, lk.shape, sizeof lv.shape);
        lv.esize = lq.esize;
        layout *ls[3] = {&lq, &lk, &lv};
        for (int i = 0; i < 3; i++) { /* recompute layouts for the adjusted shapes */
            int64_t acc = ls[i]->shape[3] + (int64_t)rng_below(&s, 2);
            ls[i]->strides[2] = acc;
            acc *= ls[i]->shape[2];
            ls[i]->strides[1] = acc;
            acc *= ls[i]->shape[1];
            ls[i]->strides[0] = acc;
            if (rng_below(&s, 3) == 0) { /* [B,N,H,D] memory */
                int64_t row = ls[i]->shape[3];
                ls[i]->strides[1] = row;
                ls[i]->strides[2] = row * ls[i]->shape[1];
                ls[i]->strides[0] = row * ls[i]->shape[1] * ls[i]->shape[2];
            }
            ls[i]->span = 1;
            for (int d = 0; d < 4; d++)
                ls[i]->span += (ls[i]->shape[d] - 1) * ls[i]->strides[d];
        }
        attnstat_dtype dt = lq.esize == 4 ? ATTNSTAT_F32 : rng_below(&s, 2) ? ATTNSTAT_BF16
                                                                            : ATTNSTAT_F16;
        void *mem[3];
        attnstat_tensor t[3];
        for (int i = 0; i < 3; i++) {
            mem[i] = malloc((size_t)ls[i]->span * ls[i]->esize);
            fill_random(mem[i], (size_t)ls[i]->span * ls[i]->esize, &s);
            memset(&t[i], 0, sizeof t[i]);
            t[i].data = mem[i];
            t[i].dtype = dt;
            memcpy(t[i].shape, ls[i]->shape, sizeof t[i].shape);
            memcpy(t[i].strides, ls[i]->strides, sizeof t[i].strides);
        }
        int with_v = (int)rng_below(&s, 2);
        p.expect[0] = &t[0];
        p.expect[1] = &t[1];
        p.expect[2] = with_v ? &t[2] : NULL;
        attnstat_push_opts o;
        attnstat_push_opts_init(&o);
        o.step = it;
        o.layer = (uint32_t)(it % 4);
        attnstat_code rc = attnstat_push(c, &o, &t[0], &t[1], with_v ? &t[2] : NULL);
        ck_assert_msg(rc == ATTNSTAT_OK, "seed %llu: push %d: %s", (unsigned long long)g_seed, it,
                      attnstat_last_error(c));
        ck_assert_int_eq(attnstat_flush(c, 10000), ATTNSTAT_OK);
        for (int i = 0; i < 3; i++)
            free(mem[i]);
    }
    attnstat_counters st;
    attnstat_stats(c, &st);
    ck_assert_uint_eq(st.sent, 300);
    ck_assert_uint_eq(st.acked, 300);
    ck_assert_uint_eq(st.released, 300);
    ck_assert_uint_eq(st.in_flight, 0);
    ck_assert_uint_eq(st.ring_used, 0);
    ck_assert_uint_eq(st.dropped_local, 0);
    attnstat_daemon_status ds;
    ck_assert_int_eq(attnstat_status(c, &ds, 5000), ATTNSTAT_OK);
    ck_assert_str_eq(ds.daemon_version, "fake");
    ck_assert_uint_eq(ds.n_workers, 1);
    ck_assert_str_eq(ds.workers[0].name, "cpu");
    ck_assert_uint_eq(ds.pushes, 300);
    char shm[64];
    snprintf(shm, sizeof shm, "%s", p.shm_name);
    attnstat_close(c);
    peer_stop(&p);
    ck_assert_msg(p.mismatches == 0, "seed %llu: %d elements differ", (unsigned long long)g_seed,
                  p.mismatches);
    ck_assert_int_eq(p.pushes, 300);
    /* the ring's name is gone after close */
    ck_assert_int_lt(shm_open(shm, O_RDONLY, 0), 0);
    ck_assert_int_eq(errno, ENOENT);
}
END_TEST

static void make_tensors(attnstat_tensor *q, attnstat_tensor *k, uint16_t *mem, int n)
{
    attnstat_tensor_init(q, mem, ATTNSTAT_BF16, 1, 2, n, 16);
    attnstat_tensor_init(k, mem, ATTNSTAT_BF16, 1, 1, n, 16);
}

/* Bad arguments are refused with a code and a message naming the problem, and never sent. */
START_TEST(test_push_bad_args)
{
    peer p;
    peer_start(&p, PEER_ACK);
    attnstat_client *c = connect_small(&p, 1 << 16, 0);
    uint16_t mem[2 * 8 * 16] = {0};
    attnstat_tensor q, k;
    make_tensors(&q, &k, mem, 8);
    attnstat_push_opts o;
    attnstat_push_opts_init(&o);
    ck_assert_int_eq(attnstat_push(c, &o, &q, &k, NULL), ATTNSTAT_ESTATE);
    ck_assert_ptr_nonnull(strstr(attnstat_last_error(c), "hello"));
    ck_assert_int_eq(attnstat_hello(c, NULL, 0, NULL, NULL), ATTNSTAT_OK);

    static const struct {
        const char *want;
        attnstat_code code;
    } cases[] = {
        {"dtype", ATTNSTAT_EINVAL},          {"different dtypes", ATTNSTAT_EINVAL},
        {"contiguous", ATTNSTAT_EINVAL},     {"shape[2]", ATTNSTAT_EINVAL},
        {"negative", ATTNSTAT_EINVAL},       {"multiple", ATTNSTAT_EINVAL},
        {"head dimensions", ATTNSTAT_EINVAL}, {"NULL data", ATTNSTAT_EINVAL},
        {"CUDA", ATTNSTAT_ENOTSUP},          {"memory kind", ATTNSTAT_EINVAL},
        {"contradicts", ATTNSTAT_EINVAL},    {"exclusive", ATTNSTAT_EINVAL},
        {"go together", ATTNSTAT_EINVAL},    {"finite", ATTNSTAT_EINVAL},
        {"ring", ATTNSTAT_EINVAL},
    };
    for (int i = 0; i < (int)(sizeof cases / sizeof cases[0]); i++) {
        attnstat_tensor q2 = q, k2 = k;
        attnstat_push_opts o2 = o;
        switch (i) {
        case 0: q2.dtype = 9; break;
        case 1: q2.dtype = ATTNSTAT_F16; break;
        case 2: q2.strides[3] = 2; break;
        case 3: q2.shape[2] = 0; break;
        case 4: k2.strides[1] = -1; break;
        case 5: k2.shape[1] = 3; break;
        case 6: k2.shape[3] = 8; break;
        case 7: q2.data = NULL; break;
        case 8: q2.mem = ATTNSTAT_MEM_CUDA; break;
        case 9: k2.mem = 5; break;
        case 10: o2.causal = 1; o2.window_right = 4; break;
        case 11: o2.sample_every = 2; o2.sample_rows = 3; break;
        case 12: o2.cu_seqlens_q = (const int32_t *)mem; break;
        case 13: o2.scale = NAN; break;
        case 14: q2.shape[2] = 1 << 20; q2.strides[2] = 0; break;
        }
        attnstat_code rc = attnstat_push(c, &o2, &q2, &k2, NULL);
        ck_assert_msg(rc == cases[i].code, "case %d: got %d (%s)", i, rc, attnstat_last_error(c));
        ck_assert_msg(strstr(attnstat_last_error(c), cases[i].want), "case %d: message '%s'", i,
                      attnstat_last_error(c));
    }
    /* packed sequences that do not add up */
    int32_t cuq[3] = {0, 3, 8}, cuk[3] = {0, 4, 7};
    attnstat_push_opts op = o;
    op.cu_seqlens_q = cuq;
    op.cu_seqlens_k = cuk;
    op.n_seqs = 2;
    ck_assert_int_eq(attnstat_push(c, &op, &q, &k, NULL), ATTNSTAT_EINVAL);
    ck_assert_ptr_nonnull(strstr(attnstat_last_error(c), "cu_seqlens_k"));
    cuk[2] = 8;
    ck_assert_int_eq(attnstat_push(c, &op, &q, &k, NULL), ATTNSTAT_OK);
    ck_assert_int_eq(attnstat_flush(c, 10000), ATTNSTAT_OK);
    attnstat_counters st;
    attnstat_stats(c, &st);
    ck_assert_uint_eq(st.sent, 1);
    ck_assert_uint_eq(st.acked, 1);
    attnstat_close(c);
    peer_stop(&p);
    ck_assert_int_eq(p.pushes, 1);
}
END_TEST

/* Attention sinks through attnstat_push2: refused (ENOTSUP, nothing sent) by a daemon whose
 * HelloReply does not list "sinks"; checked (shape, dtype, memory, data); host sinks of any stride
 * arrive in the ring value for value and the Push names them; an attnstat_push_ext of the size
 * before sinks (a caller built against the older attnstat.h) pushes none, whatever lies past it. */
START_TEST(test_push_sinks)
{
    uint16_t mem[2 * 8 * 16];
    for (size_t i = 0; i < sizeof mem / sizeof mem[0]; i++)
        mem[i] = (uint16_t)(0x3c00 + (i * 37 + g_seed) % 512);
    attnstat_tensor q, k, sk;
    make_tensors(&q, &k, mem, 8);
    float sv[6];
    for (int i = 0; i < 6; i++)
        sv[i] = (float)((int)((g_seed >> i) % 17) - 8) * 0.25f;
    attnstat_tensor_init(&sk, sv, ATTNSTAT_F32, 1, 2, 1, 1);
    sk.strides[1] = 3; /* host sinks may be strided: they are copied */
    attnstat_push_ext e;
    attnstat_push_ext_init(&e);
    ck_assert_uint_eq(e.size, sizeof e);
    ck_assert_ptr_null(e.sinks);
    e.sinks = &sk;
    attnstat_push_opts o;
    attnstat_push_opts_init(&o);

    peer old;
    peer_start(&old, PEER_ACK); /* a daemon that takes no sinks */
    attnstat_client *c = connect_small(&old, 1 << 16, 0);
    ck_assert_int_eq(attnstat_hello(c, "sinks-old", 0, NULL, NULL), ATTNSTAT_OK);
    ck_assert_int_eq(attnstat_push2(c, &o, &e, &q, &k, NULL, NULL), ATTNSTAT_ENOTSUP);
    ck_assert_ptr_nonnull(strstr(attnstat_last_error(c), "does not list \"sinks\""));
    ck_assert_int_eq(attnstat_push2(c, &o, NULL, &q, &k, NULL, NULL), ATTNSTAT_OK);
    ck_assert_int_eq(attnstat_flush(c, 10000), ATTNSTAT_OK);
    attnstat_close(c);
    peer_stop(&old);
    ck_assert_int_eq(old.pushes, 1);
    ck_assert_int_eq(old.sinks_seen, 0);

    peer p;
    peer_start(&p, PEER_SINKS);
    c = connect_small(&p, 1 << 16, 0);
    ck_assert_int_eq(attnstat_hello(c, "sinks", 0, NULL, NULL), ATTNSTAT_OK);
    static const char *const says[] = {"shape is [1, 3, 1, 1]", "shape is [2, 2, 1, 1]",
                                       "dtype 3", "NULL data", "in CUDA memory but q in host",
                                       "strides[1] is negative"};
    for (int i = 0; i < 6; i++) {
        attnstat_tensor b = sk;
        switch (i) {
        case 0: b.shape[1] = 3; break;
        case 1: b.shape[0] = 2; break;
        case 2: b.dtype = ATTNSTAT_BOOL; break;
        case 3: b.data = NULL; break;
        case 4: b.mem = ATTNSTAT_MEM_CUDA; break;
        case 5: b.strides[1] = -1; break;
        }
        e.sinks = &b;
        ck_assert_int_eq(attnstat_push2(c, &o, &e, &q, &k, NULL, NULL), ATTNSTAT_EINVAL);
        ck_assert_msg(strstr(attnstat_last_error(c), says[i]), "case %d: %s", i,
                      attnstat_last_error(c));
    }
    e.sinks = &sk;
    p.expect[0] = &q;
    p.expect[1] = &k;
    p.expect_sinks = &sk;
    ck_assert_msg(attnstat_push2(c, &o, &e, &q, &k, NULL, NULL) == ATTNSTAT_OK, "%s",
                  attnstat_last_error(c));
    ck_assert_int_eq(attnstat_flush(c, 10000), ATTNSTAT_OK);
    /* the struct as an older attnstat.h had it: no sinks field, so none pushed */
    attnstat_push_ext before = e;
    before.size = (uint32_t)offsetof(attnstat_push_ext, sinks);
    before.sinks = (const attnstat_tensor *)&mem[3]; /* not a tensor: must never be read */
    ck_assert_msg(attnstat_push2(c, &o, &before, &q, &k, NULL, NULL) == ATTNSTAT_OK, "%s",
                  attnstat_last_error(c));
    ck_assert_int_eq(attnstat_flush(c, 10000), ATTNSTAT_OK);
    before.size = (uint32_t)offsetof(attnstat_push_ext, sinks) - 1;
    ck_assert_int_eq(attnstat_push2(c, &o, &before, &q, &k, NULL, NULL), ATTNSTAT_EINVAL);
    ck_assert_ptr_nonnull(strstr(attnstat_last_error(c), "attnstat_push_ext.size"));
    /* stream_waits is local mode's alone: a stream cannot wait for the daemon's work */
    e.stream_waits = 1;
    ck_assert_int_eq(attnstat_push2(c, &o, &e, &q, &k, NULL, NULL), ATTNSTAT_EINVAL);
    ck_assert_msg(strstr(attnstat_last_error(c), "stream_waits is for CUDA tensors in local mode"),
                  "%s", attnstat_last_error(c));
    e.stream_waits = 2;
    ck_assert_int_eq(attnstat_push2(c, &o, &e, &q, &k, NULL, NULL), ATTNSTAT_EINVAL);
    ck_assert_ptr_nonnull(strstr(attnstat_last_error(c), "0 or 1"));
    e.stream_waits = 0;
    /* so is max_logit_out (the max logits written on the device), and the wait that reads it */
    double out[2];
    e.max_logit_out = out;
    ck_assert_int_eq(attnstat_push2(c, &o, &e, &q, &k, NULL, NULL), ATTNSTAT_EINVAL);
    ck_assert_msg(strstr(attnstat_last_error(c), "max_logit_out is for CUDA tensors in local mode"),
                  "%s", attnstat_last_error(c));
    e.stats = ATTNSTAT_STATS_ENTROPY;
    ck_assert_int_eq(attnstat_push2(c, &o, &e, &q, &k, NULL, NULL), ATTNSTAT_EINVAL);
    ck_assert_msg(strstr(attnstat_last_error(c), "does not ask for the max logit"), "%s",
                  attnstat_last_error(c));
    e.stats = 0;
    e.max_logit_out = NULL;
    ck_assert_int_eq(attnstat_local_wait(c, NULL), ATTNSTAT_EINVAL);
    ck_assert_msg(strstr(attnstat_last_error(c), "attnstat_local_wait is for local mode"), "%s",
                  attnstat_last_error(c));
    /* the struct as the attnstat.h before stream_waits had it: its sinks pushed, nothing past
     * them read */
    attnstat_push_ext v2 = e;
    v2.size = (uint32_t)offsetof(attnstat_push_ext, stream_waits);
    v2.stream_waits = 7;
    v2.max_logit_out = out; /* past its struct: never read */
    ck_assert_msg(attnstat_push2(c, &o, &v2, &q, &k, NULL, NULL) == ATTNSTAT_OK, "%s",
                  attnstat_last_error(c));
    ck_assert_int_eq(attnstat_flush(c, 10000), ATTNSTAT_OK);
    attnstat_close(c);
    peer_stop(&p);
    ck_assert_int_eq(p.pushes, 3);
    ck_assert_int_eq(p.sinks_seen, 2);
    ck_assert_msg(p.mismatches == 0, "%d elements differ", p.mismatches);
}
END_TEST

/* A push's choice of statistics through attnstat_push2 (ext.stats): bits past
 * ATTNSTAT_STATS_ALL are EINVAL; to a daemon whose HelloReply does not list "stats" anything but 0
 * and ATTNSTAT_STATS_DEFAULT is ENOTSUP ("upgrade the daemon"), never sent; to one that does, the
 * Push carries it as given (0: unset); an attnstat_push_ext of the size before stats (a caller
 * built against the older attnstat.h) asks for the defaults, whatever lies past it. */
START_TEST(test_push_stats)
{
    uint16_t mem[2 * 8 * 16];
    for (size_t i = 0; i < sizeof mem / sizeof mem[0]; i++)
        mem[i] = (uint16_t)(0x3c00 + (i * 41 + g_seed) % 512);
    attnstat_tensor q, k;
    make_tensors(&q, &k, mem, 8);
    attnstat_push_ext e;
    memset(&e, 0x5a, sizeof e); /* init must set every field */
    attnstat_push_ext_init(&e);
    ck_assert_uint_eq(e.size, sizeof e);
    ck_assert_uint_eq(e.stats, 0);
    ck_assert_int_eq(e.reserved2, 0);
    ck_assert_uint_gt(e.size, offsetof(attnstat_push_ext, stats));
    attnstat_push_opts o;
    attnstat_push_opts_init(&o);

    peer old;
    peer_start(&old, PEER_ACK); /* a daemon that takes no choice of statistics */
    attnstat_client *c = connect_small(&old, 1 << 16, 0);
    ck_assert_int_eq(attnstat_hello(c, "stats-old", 0, NULL, NULL), ATTNSTAT_OK);
    e.stats = ATTNSTAT_STATS_ALL + 1; /* bit 9: no such statistic */
    ck_assert_int_eq(attnstat_push2(c, &o, &e, &q, &k, NULL, NULL), ATTNSTAT_EINVAL);
    ck_assert_msg(strstr(attnstat_last_error(c), "stats 0x200 asks for statistics that do not "
                         "exist (bits 0x200)"), "%s", attnstat_last_error(c));
    static const uint32_t refused[] = {ATTNSTAT_STATS_ALL, ATTNSTAT_STATS_SINK_MASS,
                                       ATTNSTAT_STATS_ENTROPY};
    for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++) {
        e.stats = refused[i];
        ck_assert_int_eq(attnstat_push2(c, &o, &e, &q, &k, NULL, NULL), ATTNSTAT_ENOTSUP);
        ck_assert_msg(strstr(attnstat_last_error(c), "does not list \"stats\"") &&
                          strstr(attnstat_last_error(c), "upgrade the daemon"),
                      "%s", attnstat_last_error(c));
    }
    e.stats = ATTNSTAT_STATS_DEFAULT; /* what the daemon computes anyway */
    ck_assert_int_eq(attnstat_push2(c, &o, &e, &q, &k, NULL, NULL), ATTNSTAT_OK);
    e.stats = 0;
    ck_assert_int_eq(attnstat_push2(c, &o, &e, &q, &k, NULL, NULL), ATTNSTAT_OK);
    ck_assert_int_eq(attnstat_flush(c, 10000), ATTNSTAT_OK);
    attnstat_close(c);
    peer_stop(&old);
    ck_assert_int_eq(old.pushes, 2);
    ck_assert_int_eq(old.stats_seen[0], ATTNSTAT_STATS_DEFAULT);
    ck_assert_int_eq(old.stats_seen[1], -1);

    peer p;
    peer_start(&p, PEER_STATS);
    c = connect_small(&p, 1 << 16, 0);
    ck_assert_int_eq(attnstat_hello(c, "stats", 0, NULL, NULL), ATTNSTAT_OK);
    e.stats = 0x80000000u | ATTNSTAT_STATS_SINK_MASS;
    ck_assert_int_eq(attnstat_push2(c, &o, &e, &q, &k, NULL, NULL), ATTNSTAT_EINVAL);
    ck_assert_msg(strstr(attnstat_last_error(c), "(bits 0x80000000)"), "%s",
                  attnstat_last_error(c));
    const uint32_t asks[3] = {ATTNSTAT_STATS_SINK_MASS | ATTNSTAT_STATS_DISTANCE |
                                  ATTNSTAT_STATS_DEFAULT,
                              ATTNSTAT_STATS_SINK_MASS,
                              ATTNSTAT_STATS_MAX_LOGIT | ATTNSTAT_STATS_DISTANCE};
    for (int i = 0; i < 3; i++) {
        e.stats = asks[i];
        ck_assert_msg(attnstat_push2(c, &o, &e, &q, &k, NULL, NULL) == ATTNSTAT_OK, "%s",
                      attnstat_last_error(c));
    }
    /* the struct as the attnstat.h before stats had it: the defaults, nothing past it read */
    attnstat_push_ext before = e;
    before.size = (uint32_t)offsetof(attnstat_push_ext, stats);
    before.stats = 0xdead0000u;
    ck_assert_msg(attnstat_push2(c, &o, &before, &q, &k, NULL, NULL) == ATTNSTAT_OK, "%s",
                  attnstat_last_error(c));
    ck_assert_int_eq(attnstat_flush(c, 10000), ATTNSTAT_OK);
    attnstat_close(c);
    peer_stop(&p);
    ck_assert_int_eq(p.pushes, 4);
    for (int i = 0; i < 3; i++)
        ck_assert_int_eq(p.stats_seen[i], asks[i]);
    ck_assert_int_eq(p.stats_seen[3], -1);
}
END_TEST

/* A tensor whose shape and strides reach past the address space (a stride of 2^60 elements, or a
 * byte count past 2^64) is refused with EINVAL naming the tensor, before anything is read or
 * sent: without the check the host copy reads at data + 2^61 and the caller crashes. Sinks (a
 * tensor of the extension) are checked too; a tensor that fits still pushes. */
START_TEST(test_push_extent)
{
    uint16_t mem[2 * 8 * 16];
    for (size_t i = 0; i < sizeof mem / sizeof mem[0]; i++)
        mem[i] = (uint16_t)(0x3c00 + (i * 29 + g_seed) % 512);
    attnstat_tensor q, k, v, sk;
    make_tensors(&q, &k, mem, 8);
    v = k;
    float sv[2] = {0.5f, (float)(g_seed % 7)};
    attnstat_tensor_init(&sk, sv, ATTNSTAT_F32, 1, 2, 1, 1);
    attnstat_push_ext e;
    attnstat_push_ext_init(&e);
    attnstat_push_opts o;
    attnstat_push_opts_init(&o);
    peer p;
    peer_start(&p, PEER_SINKS);
    attnstat_client *c = connect_small(&p, 1 << 16, 0);
    ck_assert_int_eq(attnstat_hello(c, "extent", 0, NULL, NULL), ATTNSTAT_OK);
    static const struct {
        const char *tensor, *says;
    } cases[] = {
        {"q:", "bytes from its data pointer"}, {"k:", "more than 2^64 bytes"},
        {"v:", "beyond the address space"},    {"sinks:", "beyond the address space"},
        {"q:", "more than 2^64 bytes"},
    };
    for (int i = 0; i < (int)(sizeof cases / sizeof cases[0]); i++) {
        attnstat_tensor q2 = q, k2 = k, v2 = v, s2 = sk;
        switch (i) {
        case 0: q2.strides[1] = (int64_t)1 << 60; break;       /* 2^61 bytes past q */
        case 1: k2.strides[2] = (int64_t)1 << 62; break;       /* 7 * 2^62 elements */
        case 2: v2.strides[2] = ((int64_t)1 << 57) / 14; break; /* just past the top */
        case 3: s2.strides[1] = (int64_t)1 << 60; break;       /* host sinks are copied too */
        case 4: q2.strides[1] = INT64_MAX; q2.strides[2] = INT64_MAX; break; /* the sum wraps */
        }
        e.sinks = &s2;
        attnstat_code rc = attnstat_push2(c, &o, &e, &q2, &k2, i == 2 ? &v2 : NULL, NULL);
        ck_assert_msg(rc == ATTNSTAT_EINVAL, "case %d: got %d (%s)", i, rc,
                      attnstat_last_error(c));
        const char *msg = attnstat_last_error(c);
        ck_assert_msg(strncmp(msg, cases[i].tensor, strlen(cases[i].tensor)) == 0 &&
                      strstr(msg, cases[i].says), "case %d: message '%s'", i, msg);
    }
    attnstat_counters st;
    attnstat_stats(c, &st);
    ck_assert_uint_eq(st.sent, 0);
    /* a tensor inside memory pushes, its heads broadcast (stride 0) */
    q.strides[1] = 0;
    e.sinks = &sk;
    ck_assert_msg(attnstat_push2(c, &o, &e, &q, &k, &v, NULL) == ATTNSTAT_OK, "%s",
                  attnstat_last_error(c));
    ck_assert_int_eq(attnstat_flush(c, 10000), ATTNSTAT_OK);
    attnstat_close(c);
    peer_stop(&p);
    ck_assert_int_eq(p.pushes, 1);
}
END_TEST

/* A peer that never answers pushes: the ring fills, later pushes drop and are counted. */
START_TEST(test_drop_when_ring_full)
{
    peer p;
    peer_start(&p, PEER_SILENT);
    attnstat_client *c = connect_small(&p, 64 * 1024, 0);
    ck_assert_int_eq(attnstat_hello(c, "full", 0, NULL, NULL), ATTNSTAT_OK);
    uint16_t mem[2 * 64 * 16];
    attnstat_tensor q, k;
    make_tensors(&q, &k, mem, 64); /* q 4 KiB + k 2 KiB = 6 KiB a push: 10 fit */
    attnstat_push_opts o;
    attnstat_push_opts_init(&o);
    int ok = 0, dropped = 0;
    for (int i = 0; i < 100; i++) {
        attnstat_code rc = attnstat_push(c, &o, &q, &k, NULL);
        ck_assert(rc == ATTNSTAT_OK || rc == ATTNSTAT_DROPPED);
        ok += rc == ATTNSTAT_OK;
        dropped += rc == ATTNSTAT_DROPPED;
    }
    ck_assert_int_eq(ok, 10);
    ck_assert_int_eq(dropped, 90);
    attnstat_counters st;
    attnstat_stats(c, &st);
    ck_assert_uint_eq(st.dropped_local, 90);
    ck_assert_uint_eq(st.dropped_ring, 90);
    ck_assert_uint_eq(st.in_flight, 10);
    ck_assert_uint_eq(st.ring_used, 10 * 6144);
    ck_assert_int_eq(attnstat_flush(c, 50), ATTNSTAT_ETIMEDOUT);
    ck_assert_ptr_nonnull(strstr(attnstat_last_error(c), "10 pushes"));
    attnstat_close(c);
    peer_stop(&p);
}
END_TEST

/* A peer that has stopped reading (like a SIGSTOP'd daemon): every push returns at once, OK or
 * DROPPED, and the drops are counted. */
START_TEST(test_never_blocks_when_peer_stopped)
{
    peer p;
    peer_start(&p, PEER_STOPPED);
    attnstat_client *c = connect_small(&p, 256u << 20, 8192);
    ck_assert_int_eq(attnstat_hello(c, "stopped", 0, NULL, NULL), ATTNSTAT_OK);
    uint16_t mem[2 * 4 * 16];
    attnstat_tensor q, k;
    make_tensors(&q, &k, mem, 4);
    attnstat_push_opts o;
    attnstat_push_opts_init(&o);
    const int n = 200000;
    int ok = 0, dropped = 0;
    for (int i = 0; i < n; i++) {
        o.step = i;
        attnstat_code rc = attnstat_push(c, &o, &q, &k, NULL);
        ck_assert_msg(rc == ATTNSTAT_OK || rc == ATTNSTAT_DROPPED, "push %d: %s", i,
                      attnstat_last_error(c));
        ok += rc == ATTNSTAT_OK;
        dropped += rc == ATTNSTAT_DROPPED;
    }
    attnstat_counters st;
    attnstat_stats(c, &st);
    ck_assert_uint_eq(st.sent + st.dropped_local, (uint64_t)n);
    ck_assert_uint_eq(st.dropped_local, (uint64_t)dropped);
    /* The socket buffer, the 8 KiB queue and the in-flight table hold far fewer than n frames. */
    ck_assert_uint_lt(st.sent, 20000);
    ck_assert_uint_gt(st.dropped_queue, 0);
    ck_assert_uint_le(st.queue_bytes, 8192 + 1024);
    attnstat_close(c);
    peer_stop(&p);
}
END_TEST

typedef struct {
    int n;
    int32_t code;
} ack_count;

static void on_ack(void *u, uint64_t seq, int64_t step, uint32_t layer, int32_t code,
                   const char *m)
{
    ack_count *x = u;
    x->n++;
    x->code = code;
}

/* Daemon-side drops (Ack DROPPED) free the ring and are counted apart from local drops. */
START_TEST(test_daemon_drops_counted)
{
    peer p;
    peer_start(&p, PEER_DROP);
    attnstat_client *c = connect_small(&p, 64 * 1024, 0);
    ck_assert_int_eq(attnstat_hello(c, "dropping", 0, NULL, NULL), ATTNSTAT_OK);
    int calls = 0;
    ack_count cbs = {0, 0};
    attnstat_set_ack_callback(c, on_ack, &cbs);
    uint16_t mem[2 * 64 * 16] = {0};
    attnstat_tensor q, k;
    make_tensors(&q, &k, mem, 64);
    attnstat_push_opts o;
    attnstat_push_opts_init(&o);
    for (int i = 0; i < 50; i++) {
        o.step = i;
        ck_assert_int_eq(attnstat_push(c, &o, &q, &k, NULL), ATTNSTAT_OK);
        ck_assert_int_eq(attnstat_flush(c, 10000), ATTNSTAT_OK);
        calls++;
    }
    attnstat_counters st;
    attnstat_stats(c, &st);
    ck_assert_uint_eq(st.dropped_daemon, 50);
    ck_assert_uint_eq(st.dropped_local, 0);
    ck_assert_uint_eq(st.ring_used, 0);
    ck_assert_int_eq(st.last_code, 1);
    ck_assert_ptr_nonnull(strstr(st.last_error, "queue full"));
    ck_assert_ptr_nonnull(strstr(st.last_error, "step 49"));
    ck_assert_int_eq(cbs.n, calls);
    ck_assert_int_eq(cbs.code, 1);
    attnstat_close(c);
    peer_stop(&p);
}
END_TEST

START_TEST(test_ring_refused)
{
    peer p;
    peer_start(&p, PEER_REFUSE_RING);
    attnstat_client *c = connect_small(&p, 0, 0);
    ck_assert_int_eq(attnstat_hello(c, "refused", 0, NULL, NULL), ATTNSTAT_EREFUSED);
    ck_assert_ptr_nonnull(strstr(attnstat_last_error(c), "too many buffers"));
    uint16_t mem[2 * 4 * 16] = {0};
    attnstat_tensor q, k;
    make_tensors(&q, &k, mem, 4);
    attnstat_push_opts o;
    attnstat_push_opts_init(&o);
    ck_assert_int_eq(attnstat_push(c, &o, &q, &k, NULL), ATTNSTAT_ESTATE);
    attnstat_close(c);
    peer_stop(&p);
}
END_TEST

/* The peer hangs up after the hello reply: the client reports a closed connection, never
 * crashes or raises SIGPIPE. */
START_TEST(test_connection_lost)
{
    peer p;
    peer_start(&p, PEER_HANGUP);
    attnstat_client *c = connect_small(&p, 0, 0);
    attnstat_code rc = attnstat_hello(c, "hangup", 0, NULL, NULL);
    ck_assert_int_eq(rc, ATTNSTAT_ECLOSED);
    ck_assert_msg(strstr(attnstat_last_error(c), "closed the connection"), "message: %s",
                  attnstat_last_error(c));
    ck_assert_int_eq(attnstat_poll(c, 0), ATTNSTAT_ECLOSED);
    attnstat_daemon_status ds;
    ck_assert_int_eq(attnstat_status(c, &ds, 100), ATTNSTAT_ECLOSED);
    attnstat_close(c);
    peer_stop(&p);
}
END_TEST

/* A push that fails after its ring space was taken (its frame is over the daemon's max_frame)
 * gives the space back at once and does not hand its seq to the next push: otherwise two ring
 * blocks share a seq, a Release frees the wrong one and the ring wedges. */
START_TEST(test_failed_push_gives_its_ring_space_back)
{
    peer p;
    peer_start(&p, PEER_SILENT);
    attnstat_client *c = connect_small(&p, 64 * 1024, 0);
    ck_assert_int_eq(attnstat_hello(c, "failed-push", 0, NULL, NULL), ATTNSTAT_OK);
    uint16_t mem[2 * 64 * 16] = {0};
    attnstat_tensor q, k;
    make_tensors(&q, &k, mem, 64); /* 6 KiB a push */
    attnstat_push_opts o;
    attnstat_push_opts_init(&o);
    ck_assert_int_eq(attnstat_push(c, &o, &q, &k, NULL), ATTNSTAT_OK);
    attnstat_counters st;
    attnstat_stats(c, &st);
    uint64_t used1 = st.ring_used;
    /* 1e6 packed sequences of one row each: cu_seqlens alone is over the 1 MiB max_frame. */
    enum { NS = 1000000 };
    int32_t *cu = calloc(NS + 1, sizeof *cu);
    ck_assert_ptr_nonnull(cu);
    cu[NS] = 1;
    uint16_t one[16] = {0};
    attnstat_tensor qb, kb;
    attnstat_tensor_init(&qb, one, ATTNSTAT_BF16, 1, 1, 1, 16);
    attnstat_tensor_init(&kb, one, ATTNSTAT_BF16, 1, 1, 1, 16);
    attnstat_push_opts ob = o;
    ob.cu_seqlens_q = cu;
    ob.cu_seqlens_k = cu;
    ob.n_seqs = NS;
    ck_assert_int_ne(attnstat_push(c, &ob, &qb, &kb, NULL), ATTNSTAT_OK);
    free(cu);
    attnstat_stats(c, &st);
    ck_assert_uint_eq(st.ring_used, used1);
    ck_assert_int_eq(attnstat_push(c, &o, &q, &k, NULL), ATTNSTAT_OK);
    attnstat_stats(c, &st);
    ck_assert_uint_eq(st.ring_used, 2 * used1);
    ck_assert_uint_eq(st.in_flight, 2);
    attnstat_close(c);
    peer_stop(&p);
}
END_TEST

/* A daemon whose max_frame is over the default sends frames that large (a StatusReply listing
 * many clients, an Ack with many heads): the client reads frames up to what its HelloReply said. */
START_TEST(test_reads_frames_up_to_the_daemons_max_frame)
{
    peer p;
    peer_start(&p, PEER_BIG_FRAMES);
    attnstat_client *c = connect_small(&p, 64 * 1024, 0);
    attnstat_code hr = attnstat_hello(c, "big-frames", 0, NULL, NULL);
    ck_assert_msg(hr == ATTNSTAT_OK, "hello: %d: %s", hr, attnstat_last_error(c));
    attnstat_daemon_status ds;
    attnstat_code rc = attnstat_status(c, &ds, 10000);
    ck_assert_msg(rc == ATTNSTAT_OK, "status: %d: %s", rc, attnstat_last_error(c));
    ck_assert_int_eq(ds.db_path[0], 'x');
    attnstat_close(c);
    peer_stop(&p);
}
END_TEST

/* attnstat_set_layout: after hello only, checked, refused by a daemon that does not list the
 * feature, else sent as one ParallelLayout with the fields given (head_offset -1 left unset). */
START_TEST(test_set_layout)
{
    attnstat_layout l;
    attnstat_layout_init(&l);
    ck_assert_uint_eq(l.size, sizeof l);
    ck_assert(l.tp_size == 1 && l.pp_size == 1 && l.dp_size == 1 && l.cp_size == 1);
    ck_assert(l.tp_rank == 0 && l.layer_offset == 0 && l.head_offset == -1);
    ck_assert_int_eq(attnstat_set_layout(NULL, &l), ATTNSTAT_EINVAL);

    peer old;
    peer_start(&old, PEER_ACK); /* a daemon that takes no layout */
    attnstat_client *c = connect_small(&old, 1 << 20, 0);
    ck_assert_int_eq(attnstat_set_layout(c, &l), ATTNSTAT_ESTATE);
    ck_assert_ptr_nonnull(strstr(attnstat_last_error(c), "after attnstat_hello"));
    ck_assert_int_eq(attnstat_hello(c, "lay", 0, NULL, NULL), ATTNSTAT_OK);
    ck_assert_int_eq(attnstat_set_layout(c, &l), ATTNSTAT_ENOTSUP);
    ck_assert_ptr_nonnull(strstr(attnstat_last_error(c), "older"));
    attnstat_close(c);
    peer_stop(&old);

    peer p;
    peer_start(&p, PEER_LAYOUT);
    c = connect_small(&p, 1 << 20, 0);
    ck_assert_int_eq(attnstat_hello(c, "lay", 5, NULL, NULL), ATTNSTAT_OK);
    struct {
        int field, value;
        const char *says;
    } bad[] = {{0, 4, "tp_rank 4 of tp_size 4"}, {1, 0, "pp_rank 0 of pp_size 0"},
               {2, -1, "dp_rank -1"},           {3, (1 << 20) + 1, "cp_size"},
               {4, -3, "layer_offset -3"},      {5, -2, "head_offset -2"}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        attnstat_layout b;
        attnstat_layout_init(&b);
        b.tp_size = 4;
        int32_t *f[] = {&b.tp_rank, &b.pp_size, &b.dp_rank, &b.cp_size, &b.layer_offset,
                        &b.head_offset};
        *f[bad[i].field] = bad[i].value;
        ck_assert_int_eq(attnstat_set_layout(c, &b), ATTNSTAT_EINVAL);
        ck_assert_msg(strstr(attnstat_last_error(c), bad[i].says), "case %zu: %s", i,
                      attnstat_last_error(c));
    }
    l.size = 8;
    ck_assert_int_eq(attnstat_set_layout(c, &l), ATTNSTAT_EINVAL);
    attnstat_layout_init(&l);
    l.tp_rank = 2;
    l.tp_size = 4;
    l.pp_rank = 1;
    l.pp_size = 2;
    l.dp_rank = 6;
    l.dp_size = 7;
    l.layer_offset = 24;
    ck_assert_int_eq(attnstat_set_layout(c, &l), ATTNSTAT_OK);
    /* a Status round trip: the peer has read everything sent before it */
    attnstat_daemon_status ds;
    ck_assert_int_eq(attnstat_status(c, &ds, 5000), ATTNSTAT_OK);
    ck_assert_int_eq(p.layouts, 1);
    ck_assert(p.layout.has_tp_rank && p.layout.tp_rank == 2 && p.layout.tp_size == 4);
    ck_assert(p.layout.pp_rank == 1 && p.layout.pp_size == 2 && p.layout.dp_rank == 6 &&
              p.layout.dp_size == 7 && p.layout.cp_size == 1 && p.layout.layer_offset == 24);
    ck_assert(!p.layout.has_head_offset);
    l.head_offset = 96;
    ck_assert_int_eq(attnstat_set_layout(c, &l), ATTNSTAT_OK);
    ck_assert_int_eq(attnstat_status(c, &ds, 5000), ATTNSTAT_OK);
    ck_assert_int_eq(p.layouts, 2);
    ck_assert(p.layout.has_head_offset && p.layout.head_offset == 96);
    attnstat_close(c);
    peer_stop(&p);
}
END_TEST

/* attnstat_record_intervention: after hello only, checked field by field (EINVAL naming it),
 * refused by a daemon that does not list "interventions", else sent as one Intervention with
 * exactly the fields given (unset layer, threshold, measured and values left out). */
START_TEST(test_record_intervention)
{
    attnstat_intervention iv;
    attnstat_intervention_init(&iv);
    ck_assert(iv.size == sizeof iv && iv.layer == -1 && iv.nheads == 0 && !iv.values);
    ck_assert(isnan(iv.threshold) && isnan(iv.measured) && !iv.kind && !iv.detail);
    ck_assert_int_eq(attnstat_record_intervention(NULL, &iv), ATTNSTAT_EINVAL);

    peer old;
    peer_start(&old, PEER_ACK); /* a daemon that records none */
    attnstat_client *c = connect_small(&old, 1 << 20, 0);
    iv.kind = "qk_clip";
    ck_assert_int_eq(attnstat_record_intervention(c, &iv), ATTNSTAT_ESTATE);
    ck_assert_int_eq(attnstat_hello(c, "iv", 0, NULL, NULL), ATTNSTAT_OK);
    ck_assert_int_eq(attnstat_record_intervention(c, &iv), ATTNSTAT_ENOTSUP);
    ck_assert_ptr_nonnull(strstr(attnstat_last_error(c), "older"));
    attnstat_close(c);
    peer_stop(&old);

    peer p;
    peer_start(&p, PEER_LAYOUT);
    c = connect_small(&p, 1 << 20, 0);
    ck_assert_int_eq(attnstat_hello(c, "iv", 3, NULL, NULL), ATTNSTAT_OK);
    srand((unsigned)(g_seed ^ 0x1717)); /* fresh each run (the printed seed repeats it) */
    uint32_t heads[3], big[1] = {1u << 24};
    double vals[3], inf[3] = {0.5, INFINITY, 0.5};
    for (int i = 0; i < 3; i++) { /* fresh values each run */
        heads[i] = (uint32_t)(rand() % 64) + 64u * (uint32_t)i;
        vals[i] = 0.05 + 0.9 * rand() / (double)RAND_MAX;
    }
    char longdetail[1100];
    memset(longdetail, 'x', sizeof longdetail - 1);
    longdetail[sizeof longdetail - 1] = '\0';
    struct {
        const char *kind, *detail, *says;
        int64_t step;
        int32_t layer, nheads;
        const uint32_t *heads;
        const double *values;
        double threshold;
    } bad[] = {
        {NULL, NULL, "kind must be", 1, 0, 0, NULL, NULL, NAN},
        {"", NULL, "kind must be", 1, 0, 0, NULL, NULL, NAN},
        {"QK clip", NULL, "may hold", 1, 0, 0, NULL, NULL, NAN},
        {"an_intervention_kind_of_33_chars_", NULL, "kind must be", 1, 0, 0, NULL, NULL, NAN},
        {"qk_clip", NULL, "step -1", -1, 0, 0, NULL, NULL, NAN},
        {"qk_clip", NULL, "layer -2", 1, -2, 0, NULL, NULL, NAN},
        {"qk_clip", NULL, "nheads 4097", 1, 0, 4097, heads, NULL, NAN},
        {"qk_clip", NULL, "nheads 2", 1, 0, 2, NULL, NULL, NAN},
        {"qk_clip", NULL, "heads[0]", 1, 0, 1, big, NULL, NAN},
        {"qk_clip", NULL, "values[1]", 1, 0, 3, heads, inf, NAN},
        {"qk_clip", NULL, "threshold", 1, 0, 0, NULL, NULL, INFINITY},
        {"qk_clip", longdetail, "detail", 1, 0, 0, NULL, NULL, NAN},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        attnstat_intervention b;
        attnstat_intervention_init(&b);
        b.kind = bad[i].kind, b.detail = bad[i].detail, b.step = bad[i].step;
        b.layer = bad[i].layer, b.nheads = bad[i].nheads, b.heads = bad[i].heads;
        b.values = bad[i].values, b.threshold = bad[i].threshold;
        ck_assert_int_eq(attnstat_record_intervention(c, &b), ATTNSTAT_EINVAL);
        ck_assert_msg(strstr(attnstat_last_error(c), bad[i].says), "case %zu: %s", i,
                      attnstat_last_error(c));
    }
    iv.size = 8;
    ck_assert_int_eq(attnstat_record_intervention(c, &iv), ATTNSTAT_EINVAL);
    attnstat_intervention_init(&iv);
    const int64_t step = 1000 + rand() % 100000;
    const double tau = 20.0 + rand() % 100, measured = tau * 3.5;
    iv.kind = "qk_clip", iv.step = step, iv.layer = 7, iv.heads = heads, iv.nheads = 3;
    iv.values = vals, iv.threshold = tau, iv.measured = measured, iv.detail = "{\"g\":4}";
    ck_assert_int_eq(attnstat_record_intervention(c, &iv), ATTNSTAT_OK);
    attnstat_daemon_status ds; /* a Status round trip: the peer has read what came before it */
    ck_assert_int_eq(attnstat_status(c, &ds, 5000), ATTNSTAT_OK);
    ck_assert_int_eq(p.interventions, 1);
    ck_assert_str_eq(p.iv_kind, "qk_clip");
    ck_assert_str_eq(p.iv_detail, "{\"g\":4}");
    ck_assert(p.iv_step == step && p.iv_has_layer && p.iv_layer == 7);
    ck_assert(p.iv_nheads == 3 && p.iv_nvalues == 3);
    for (int i = 0; i < 3; i++)
        ck_assert(p.iv_heads[i] == heads[i] && p.iv_values[i] == vals[i]);
    ck_assert(p.iv_has_threshold && p.iv_threshold == tau && p.iv_has_measured &&
              p.iv_measured == measured);
    attnstat_intervention_init(&iv); /* the least: a kind and a step */
    iv.kind = "note", iv.step = step + 1;
    ck_assert_int_eq(attnstat_record_intervention(c, &iv), ATTNSTAT_OK);
    ck_assert_int_eq(attnstat_status(c, &ds, 5000), ATTNSTAT_OK);
    ck_assert_int_eq(p.interventions, 2);
    ck_assert(p.iv_step == step + 1 && !p.iv_has_layer && p.iv_nheads == 0 &&
              p.iv_nvalues == 0 && !p.iv_has_threshold && !p.iv_has_measured);
    ck_assert_str_eq(p.iv_detail, "");
    attnstat_close(c);
    peer_stop(&p);
}
END_TEST

static Suite *client_suite(void)
{
    Suite *s = suite_create("client");
    TCase *tc = tcase_create("api");
    tcase_add_test(tc, test_codes_and_args);
    tcase_add_test(tc, test_push_bad_args);
    tcase_add_test(tc, test_push_sinks);
    tcase_add_test(tc, test_push_stats);
    tcase_add_test(tc, test_push_extent);
    tcase_add_test(tc, test_push_bytes_exact);
    tcase_add_test(tc, test_drop_when_ring_full);
    tcase_add_test(tc, test_never_blocks_when_peer_stopped);
    tcase_add_test(tc, test_daemon_drops_counted);
    tcase_add_test(tc, test_ring_refused);
    tcase_add_test(tc, test_connection_lost);
    tcase_add_test(tc, test_failed_push_gives_its_ring_space_back);
    tcase_add_test(tc, test_reads_frames_up_to_the_daemons_max_frame);
    tcase_add_test(tc, test_set_layout);
    tcase_add_test(tc, test_record_intervention);
    tcase_set_timeout(tc, 120);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    g_seed = client_test_seed("test_client");
    return client_test_run(client_suite());
}
