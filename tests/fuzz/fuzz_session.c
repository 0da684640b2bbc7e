/* fuzz_session.c — libFuzzer target over attnstatd's whole receiving side, in one process: the
 * input's bytes go into a real connection (conn.c, over a socketpair) in pieces of a size the
 * input's first byte picks, so framing (frame.c), decoding (protobuf-c), the session's dispatch
 * (session.c: Hello and its checks, run ownership, registrations, Forget, Subscribe, Status,
 * Goodbye, operators' Commands) and
 * every Push's validation (push.c, validate.c, buffers.c) run as they do in the daemon; pushes
 * that pass are computed by the CPU worker and answered. Everything an input made is closed and
 * freed before the next one (libFuzzer's leak check holds the harness to it).
 *
 * The world it runs in, made once: the settings (small work limits, so a valid push computes in
 * microseconds), counters, the client registry, the runs, a store in a fresh temporary directory
 * with its store thread, the alert feed, the CPU worker, and a shared-memory segment "/attnstat-fuzz" of FUZZ_SHM bytes of random
 * bf16 values that inputs may register (the seed corpus does).
 *
 * Build: a tree configured with clang and -DATTNSTAT_FUZZ=ON (tests/fuzz.sh does it). Stage: a
 * test; calls the daemon's stages (attnstatd_core) as loop.c wires them, without the listener. */
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>
#include <uv.h>

#include "alerts_feed.h"
#include "clients.h"
#include "config.h"
#include "conn.h"
#include "counters.h"
#include "ctx.h"
#include "devices.h"
#include "log.h"
#include "peer.h"
#include "push.h"
#include "session.h"
#include "runs.h"
#include "store.h"
#include "storer.h"
#include "worker.h"

#define FUZZ_SHM_NAME "/attnstat-fuzz"
#define FUZZ_SHM (64 * 1024)

static uv_loop_t loop;
static cfg conf;
static stage_ctx x;
static char dir[64];
static uint64_t next_id;

typedef struct {
    clients_entry *e;
    int closed;
} fuzz_conn;

/* ---- the wiring loop.c does, for one connection ---------------------------------------------- */

static void on_message(void *data, conn *c, const Attnstat__Envelope *env)
{
    fuzz_conn *f = data;
    (void)c;
    if (f->e->p)
        session_handle(&x, f->e->p, env);
}

static int on_eof(void *data, conn *c)
{
    fuzz_conn *f = data;
    (void)c;
    return f->e->p && f->e->p->inflight > 0;
}

static void on_close(void *data, conn *c)
{
    fuzz_conn *f = data;
    (void)c;
    if (f->e->p) {
        peer_detach(f->e->p);
        f->e->p = NULL;
    }
    clients_remove(x.reg, f->e);
}

static void on_closed(void *data)
{
    fuzz_conn *f = data;
    clients_entry_free(f->e);
    f->e = NULL;
    f->closed = 1;
}

static const conn_handler handler = {on_message, on_eof, on_close, on_closed};

/* The pool's done callback: Release, then the Ack (the store's batch is not in this harness). */
static void on_job_done(void *data, worker_job *job)
{
    (void)data;
    push *u = push_of_job(job);
    if (push_computed(u) == 0)
        push_answer(u, ATTNSTAT__CODE__OK, "", NULL, NULL);
}

static void no_sink(void *data, const feed_alert *a)
{
    (void)data;
    (void)a;
}

static void cleanup(void)
{
    if (getenv("FUZZ_LOG") && x.cnt)
        fprintf(stderr, "fuzz_session: pushes %llu, done %llu, rejected %llu, dropped %llu, "
                "failed %llu\n", (unsigned long long)counters_get(x.cnt, CNT_PUSHES),
                (unsigned long long)counters_get(x.cnt, CNT_PUSHES_DONE),
                (unsigned long long)counters_get(x.cnt, CNT_REJECTED),
                (unsigned long long)counters_get(x.cnt, CNT_DROPPED),
                (unsigned long long)counters_get(x.cnt, CNT_FAILED));
    shm_unlink(FUZZ_SHM_NAME);
    if (dir[0]) {
        char cmd[128];
        snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
        if (system(cmd) != 0)
            fprintf(stderr, "fuzz_session: could not remove %s\n", dir);
    }
}

static void die(const char *what, const char *why)
{
    fprintf(stderr, "fuzz_session: %s: %s\n", what, why);
    abort();
}

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    signal(SIGPIPE, SIG_IGN);
    char err[600];
    if (uv_loop_init(&loop) != 0)
        die("uv_loop_init", "failed");
    if (cfg_init(&conf, err, sizeof err) != 0)
        die("cfg_init", err);
    log_set_level(getenv("FUZZ_LOG") ? LOG_DEBUG : LOG_ERROR);
    snprintf(dir, sizeof dir, "%s", "/tmp/attnstat-fuzz-XXXXXX");
    if (!mkdtemp(dir))
        die("mkdtemp", "failed");
    atexit(cleanup);
    char db[128];
    snprintf(db, sizeof db, "%s/fuzz.db", dir);
    conf.max_push_work = 1 << 22;
    conf.max_push_work_gpu = 1 << 22;
    conf.queue_depth = 8;
    conf.client_inflight = 8;
    conf.max_hello_config = 4096;
    x.cfg = &conf;
    x.cnt = counters_new();
    x.reg = clients_new();
    x.runs = runs_new();
    store_error se = {0, ""};
    x.db = store_open(db, 0, &se);
    if (!x.cnt || !x.reg || !x.runs || !x.db)
        die("the stages", se.msg);
    x.feed = alerts_feed_new(&conf, x.db, x.runs, x.cnt, no_sink, NULL, err, sizeof err);
    if (!x.feed)
        die("alerts_feed_new", err);
    storer_db sdb = storer_db_of(x.db);
    storer_opts so = {conf.commit_ms, 0, 1000};
    x.st = storer_new(&loop, &sdb, &so, NULL, NULL, err, sizeof err);
    if (!x.st)
        die("storer_new", err);
    alerts_feed_start(x.feed, x.st);
    x.dev = devices_new(&loop, &conf, on_job_done, NULL, err, sizeof err);
    if (!x.dev)
        die("devices_new", err);
    int fd = shm_open(FUZZ_SHM_NAME, O_RDWR | O_CREAT, 0600);
    if (fd < 0 || ftruncate(fd, FUZZ_SHM) != 0)
        die("shm", FUZZ_SHM_NAME);
    uint16_t *v = mmap(NULL, FUZZ_SHM, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (v == MAP_FAILED)
        die("mmap", FUZZ_SHM_NAME);
    uint64_t s = 0x9E3779B97F4A7C15ull;
    for (size_t i = 0; i < FUZZ_SHM / 2; i++) { /* bf16 values of about N(0, 1), never zero */
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        float f = (float)((double)(s % 20001) / 10000.0 - 1.0) + 0.0001f;
        uint32_t u;
        memcpy(&u, &f, 4);
        v[i] = (uint16_t)(u >> 16);
    }
    munmap(v, FUZZ_SHM);
    close(fd);
    return 0;
}

/* Reads and drops what the connection wrote back, so that it never stops reading for a full
 * outgoing queue (that path is fuzzed too when the input floods it faster). */
static void drain(int fd)
{
    char buf[65536];
    while (read(fd, buf, sizeof buf) > 0) {
    }
}

static void turn(int fd)
{
    uv_run(&loop, UV_RUN_NOWAIT);
    drain(fd);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    size_t piece = data[0] ? data[0] : size; /* 0: the stream in one write */
    data++, size--;
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0)
        die("socketpair", "failed");
    fcntl(sv[1], F_SETFL, fcntl(sv[1], F_GETFL) | O_NONBLOCK);
    conn_limits lim = {(uint32_t)conf.max_frame, conf.out_queue_bytes, conf.sub_queue_bytes};
    conn *c = conn_new(&loop, ++next_id, &lim, x.cnt);
    if (!c || conn_adopt(c, sv[0]) != 0)
        die("conn", "failed");
    conn_set_peer(c, getpid(), getuid(), getgid());
    fuzz_conn f = {clients_add(x.reg, c, NULL), 0};
    if (!f.e)
        die("clients_add", "out of memory");
    conn_set_handler(c, &handler, &f);
    f.e->p = peer_new(&conf, c);
    if (!f.e->p)
        die("peer_new", "out of memory");
    conn_read_start(c);

    for (size_t off = 0; off < size && !f.closed;) {
        size_t n = size - off < piece ? size - off : piece;
        ssize_t w = write(sv[1], data + off, n);
        if (w > 0)
            off += (size_t)w;
        else if (w < 0 && errno != EAGAIN)
            break; /* the conn closed: the rest is never read */
        turn(sv[1]);
    }
    shutdown(sv[1], SHUT_WR);
    /* The stream is over: the conn reads to its end; pushes in flight finish on the worker. */
    for (int i = 0; i < 1000000 && !f.closed; i++) {
        turn(sv[1]);
        if (i > 64 && worker_pool_busy(devices_pool(x.dev)) == 0 && f.e && f.e->p &&
            f.e->p->inflight == 0)
            conn_close(c, "the input is over");
        else if (i > 64 && f.e && !f.e->p)
            conn_close(c, "the input is over");
        if (i > 64)
            usleep(10);
    }
    while (worker_pool_busy(devices_pool(x.dev)) > 0 || storer_pending(x.st) > 0) {
        turn(sv[1]);
        usleep(10);
    }
    for (int i = 0; i < 16; i++)
        turn(sv[1]);
    close(sv[1]);
    if (!f.closed)
        die("the connection", "not closed after its input");
    return 0;
}
