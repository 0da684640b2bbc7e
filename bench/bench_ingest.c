/* bench_ingest.c — ingest of tiny pushes through a real attnstatd at its defaults, beside the
 * store alone in this process on the same schema (the SQLite limit), in one run. Run by hand:
 *   build/bench/bench_ingest [--seconds S] [--rounds R] [--clients C] [--window W] [--window1 W1]
 *                            [--heads H] [--dir /tmp] [-- DAEMON FLAGS...]
 * (attnstatd admits max_clients_per_uid, 64, connections of one uid: more clients than that need
 * -- --max-clients-per-uid C.)
 * A tiny push: one layer of H (8) heads, N=16 rows x D=16 f32 host tensors in shared memory,
 * registered once and read by every push (the bytes never change: nothing to copy). Each client is
 * a thread with its own connection and run, raw frames, W (32) pushes in flight; the lone client of
 * a. keeps W1 (1024, attnstatd's client_inflight) in flight, as libattnstat does, which sends
 * without waiting for Acks. Each phase lasts S (3) seconds.
 *   R (3) rounds of:
 *     a. one client, W1 in flight: pushes/s;
 *     b. C (64, the figure) clients, W in flight each: pushes/s;
 *     c. the store alone in this process (store_add_samples and store_commit, the schema and
 *        pragmas the daemon uses, no socket, no daemon), writing what a. wrote (one run) and what
 *        b. wrote (C runs, their pushes in turn), 1024 pushes a commit: pushes/s (the limit);
 *     d. the limit / the daemon, for one client and for C.
 *     The store alone keeps its two databases from round to round, as the daemon keeps its own, and
 *     the rounds interleave the two sides so that a drift of the machine's speed (a shared VM)
 *     moves both sides of each ratio.
 *   then: one client, one push at a time: the Ack latency (median, p95, p99); C clients sending,
 *   paced, 20% of b.'s median: pushes dropped (the daemon's answer DROPPED) and the Ack latency;
 *   and, on fresh databases, for reference: the store alone at 64 pushes a commit (slower than 1024
 *   in every run recorded), and at 1024 with each push's statistics computed first
 *   (stats_cpu_fast_ws, the daemon's CPU backend, on the very tensors the clients pushed, one
 *   workspace, as the daemon's CPU worker does): the work the daemon must do, so that the daemon /
 *   that is the daemon's own overhead (threads, socket, protocol).
 * The summary: the rounds' median ratios, and in how many rounds one client and the C clients were
 * within 1.5x of the limit (issue #14). The daemon also compacts what it stores (the retention step, on its store
 * thread), which the store alone does not: that is part of the daemon's cost here.
 * The daemon is the attnstatd of this build tree, started on a socket and database in a fresh
 * directory under --dir with the flags after "--" (none: its defaults), stopped with SIGTERM; the
 * directory is removed at the end. Includes proto/ (frames), the store's write half, kernels/
 * (stats_cpu_fast_ws), libc, pthreads. */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "attnstat.pb-c.h"
#include "envelope.h"
#include "frame.h"
#include "stats.h"
#include "store_write.h"

#ifndef ATTNSTATD_PATH
#error "ATTNSTATD_PATH must name the attnstatd binary"
#endif

enum { N = 16, D = 16, MAX_CLIENTS = 256 };

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(const double *v, int n)
{
    double s[32];
    for (int i = 0; i < n && i < 32; i++)
        s[i] = v[i];
    qsort(s, (size_t)n, sizeof *s, cmp_double);
    return n % 2 ? s[n / 2] : 0.5 * (s[n / 2 - 1] + s[n / 2]);
}

/* ---- one client ------------------------------------------------------------------------------ */

typedef struct {
    /* in */
    int id, heads, window;
    double seconds;
    double rate;             /* pushes/s of this client; 0: as fast as the window allows */
    const char *sock, *shm;
    size_t shm_bytes;
    /* out */
    uint64_t ok, dropped, failed;
    double *lat;             /* Ack latencies (s) */
    size_t nlat, caplat;
    char err[200];
} client;

typedef struct {
    int fd;
    frame_reader rd;
} link_t;

static int send_env(int fd, const Attnstat__Envelope *env)
{
    size_t len;
    uint8_t *buf = frame_pack(env, 1u << 20, &len);
    if (!buf)
        return -1;
    size_t off = 0;
    while (off < len) {
        ssize_t w = send(fd, buf + off, len - off, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR)
            continue;
        if (w < 0) {
            free(buf);
            return -1;
        }
        off += (size_t)w;
    }
    free(buf);
    return 0;
}

/* The next message, waiting up to timeout_ms (0: only what is buffered or readable now). NULL on
 * timeout (*closed 0) or EOF / error (*closed 1). */
static Attnstat__Envelope *recv_env(link_t *l, int timeout_ms, int *closed)
{
    *closed = 0;
    for (;;) {
        const uint8_t *payload;
        uint32_t len;
        char err[128];
        int r = frame_reader_next(&l->rd, &payload, &len, err, sizeof err);
        if (r < 0) {
            *closed = 1;
            return NULL;
        }
        if (r == 1) {
            Attnstat__Envelope *e = frame_decode(payload, len, NULL);
            frame_reader_consume(&l->rd);
            return e;
        }
        struct pollfd pfd = {l->fd, POLLIN, 0};
        int pr = poll(&pfd, 1, timeout_ms);
        if (pr == 0)
            return NULL;
        if (pr < 0 && errno == EINTR)
            continue;
        size_t avail;
        uint8_t *dst = frame_reader_space(&l->rd, 65536, &avail);
        ssize_t n = dst ? read(l->fd, dst, avail) : -1;
        if (n <= 0) {
            *closed = 1;
            return NULL;
        }
        frame_reader_commit(&l->rd, (size_t)n);
    }
}

static void add_lat(client *c, double v)
{
    if (c->nlat == c->caplat) {
        size_t cap = c->caplat ? c->caplat * 2 : 4096;
        double *nl = realloc(c->lat, cap * sizeof *nl);
        if (!nl)
            return;
        c->lat = nl;
        c->caplat = cap;
    }
    c->lat[c->nlat++] = v;
}

static void *client_main(void *arg)
{
    client *c = arg;
    link_t l = {socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0), {0}};
    frame_reader_init(&l.rd, 16u << 20);
    struct sockaddr_un a;
    memset(&a, 0, sizeof a);
    a.sun_family = AF_UNIX;
    snprintf(a.sun_path, sizeof a.sun_path, "%s", c->sock);
    if (connect(l.fd, (struct sockaddr *)&a, sizeof a) != 0) {
        snprintf(c->err, sizeof c->err, "connect: %s", strerror(errno));
        goto out;
    }
    Attnstat__Envelope env;
    Attnstat__Hello h;
    char run[32];
    snprintf(run, sizeof run, "ingest-%d", c->id);
    int closed;
    send_env(l.fd, envelope_hello(&env, &h, run));
    Attnstat__Envelope *r = recv_env(&l, 30000, &closed);
    if (!r || r->msg_case != ATTNSTAT__ENVELOPE__MSG_HELLO_REPLY) {
        snprintf(c->err, sizeof c->err, "no HelloReply%s%s",
                 r && r->msg_case == ATTNSTAT__ENVELOPE__MSG_ERROR ? ": " : "",
                 r && r->msg_case == ATTNSTAT__ENVELOPE__MSG_ERROR ? r->error->message : "");
        if (r)
            attnstat__envelope__free_unpacked(r, NULL);
        goto out;
    }
    attnstat__envelope__free_unpacked(r, NULL);
    Attnstat__RegisterBuffer rb;
    send_env(l.fd, envelope_register_shm(&env, &rb, 1, c->shm, c->shm_bytes));

    uint64_t shape[4] = {1, (uint64_t)c->heads, N, D};
    uint64_t strides[4] = {(uint64_t)c->heads * N * D, N * D, D, 1};
    uint64_t kshape[4] = {1, 1, N, D}, kstrides[4] = {N * D, N * D, D, 1};
    Attnstat__TensorRef qr, kr;
    envelope_tensor(&qr, 1, 0, ATTNSTAT__DTYPE__F32, shape, strides);
    envelope_tensor(&kr, 1, (uint64_t)c->heads * N * D * 4, ATTNSTAT__DTYPE__F32, kshape,
                    kstrides);
    double *sent = calloc(1u << 20, sizeof *sent); /* by seq, modulo */
    uint64_t seq = 0, answered = 0;
    double t0 = now_s(), end = t0 + c->seconds;
    while (sent) {
        double t = now_s();
        int sending = t < end;
        /* send while the window and the pace allow */
        while (sending && seq - answered < (uint64_t)c->window &&
               (c->rate <= 0 || (double)seq < (t - t0) * c->rate)) {
            Attnstat__Push p;
            seq++;
            envelope_push(&env, &p, seq, (int64_t)(seq / 4), (uint32_t)(seq % 4), &qr, &kr);
            sent[seq & ((1u << 20) - 1)] = now_s();
            if (send_env(l.fd, &env) != 0) {
                snprintf(c->err, sizeof c->err, "send failed");
                goto done;
            }
        }
        if (!sending && answered == seq)
            break;
        /* Block until an answer comes, or (paced, with room in the window) until the next send is
         * due, rounded up: a wait of 0 here would spin, and 64 spinning clients starve the daemon
         * they measure on two cores. */
        int wait_ms = 1000;
        if (c->rate > 0 && sending && seq - answered < (uint64_t)c->window) {
            double next = t0 + (double)seq / c->rate - now_s();
            wait_ms = next > 0 ? (int)ceil(next * 1e3) : 0;
        }
        r = recv_env(&l, wait_ms, &closed);
        if (!r) {
            if (closed) {
                snprintf(c->err, sizeof c->err, "the daemon closed the connection");
                break;
            }
            if (!sending && now_s() > end + 60) {
                snprintf(c->err, sizeof c->err, "%llu pushes never answered",
                         (unsigned long long)(seq - answered));
                break;
            }
            continue;
        }
        if (r->msg_case == ATTNSTAT__ENVELOPE__MSG_ACK) {
            answered++;
            if (r->ack->code == ATTNSTAT__CODE__OK) {
                c->ok++;
                add_lat(c, now_s() - sent[r->ack->seq & ((1u << 20) - 1)]);
            } else if (r->ack->code == ATTNSTAT__CODE__DROPPED) {
                c->dropped++;
            } else {
                c->failed++;
                if (!c->err[0])
                    snprintf(c->err, sizeof c->err, "push %llu: code %d %s",
                             (unsigned long long)r->ack->seq, r->ack->code,
                             r->ack->message ? r->ack->message : "");
            }
        } else if (r->msg_case == ATTNSTAT__ENVELOPE__MSG_ERROR) {
            snprintf(c->err, sizeof c->err, "Error: %s", r->error->message);
            attnstat__envelope__free_unpacked(r, NULL);
            break;
        }
        attnstat__envelope__free_unpacked(r, NULL);
    }
done:
    free(sent);
out:
    close(l.fd);
    frame_reader_free(&l.rd);
    return NULL;
}

typedef struct {
    double wall, rate;
    uint64_t ok, dropped, failed;
    double p50, p95, p99;   /* ms */
} phase_out;

/* Runs nclients clients for seconds; prints and returns what they did. */
static phase_out run_phase(const char *what, int nclients, int window, double rate_each,
                           double seconds, int heads, const char *sock, const char *shm,
                           size_t shm_bytes)
{
    static client cs[MAX_CLIENTS];
    pthread_t th[MAX_CLIENTS];
    static int next_id;
    memset(cs, 0, sizeof cs);
    double t0 = now_s();
    for (int i = 0; i < nclients; i++) {
        cs[i] = (client){.id = next_id++, .heads = heads, .window = window, .seconds = seconds,
                         .rate = rate_each, .sock = sock, .shm = shm, .shm_bytes = shm_bytes};
        pthread_create(&th[i], NULL, client_main, &cs[i]);
    }
    phase_out o = {0};
    size_t nlat = 0;
    for (int i = 0; i < nclients; i++) {
        pthread_join(th[i], NULL);
        o.ok += cs[i].ok;
        o.dropped += cs[i].dropped;
        o.failed += cs[i].failed;
        nlat += cs[i].nlat;
        if (cs[i].err[0])
            fprintf(stderr, "bench: %s, client %d: %s\n", what, i, cs[i].err);
    }
    o.wall = now_s() - t0;
    double *all = malloc((nlat ? nlat : 1) * sizeof *all);
    size_t k = 0;
    for (int i = 0; i < nclients; i++) {
        if (all)
            memcpy(all + k, cs[i].lat, cs[i].nlat * sizeof *all);
        k += cs[i].nlat;
        free(cs[i].lat);
    }
    if (all && nlat) {
        qsort(all, nlat, sizeof *all, cmp_double);
        o.p50 = all[nlat / 2] * 1e3;
        o.p95 = all[(size_t)((double)(nlat - 1) * 0.95)] * 1e3;
        o.p99 = all[(size_t)((double)(nlat - 1) * 0.99)] * 1e3;
    }
    free(all);
    o.rate = (double)o.ok / seconds;
    printf("%-44s %10.0f %8llu %8llu %9.3f %9.3f %9.3f\n", what, o.rate, (unsigned long long)o.dropped,
           (unsigned long long)o.failed, o.p50, o.p95, o.p99);
    fflush(stdout);
    return o;
}

/* ---- the store alone --------------------------------------------------------------------------- */

/* The pushes' problem, as the daemon's validation builds it from a Push: Q [1, heads, N, D] and K
 * [1, 1, N, D] f32, K right after Q in the segment at q. */
static void tiny_problem(stats_problem *pr, const float *q, int heads)
{
    stats_problem_init(pr);
    pr->batch = 1;
    pr->heads_q = heads;
    pr->heads_kv = 1;
    pr->len_q = pr->len_k = N;
    pr->head_dim = D;
    pr->dtype = STATS_F32;
    pr->q = (stats_tensor){q, (int64_t)heads * N * D, N * D, D};
    pr->k = (stats_tensor){q + (size_t)heads * N * D, N * D, N * D, D};
}

/* The store alone, writing the pushes of nruns runs in turn (each run's own steps and layers, as
 * each client pushes them: a phase of C clients writes C runs). Kept open between calls, so that a
 * later round goes on with the same database, as the daemon's does. tensors non-NULL: each push's
 * statistics are computed from them first (stats_cpu_fast_ws, one workspace, as the daemon's CPU
 * worker does) and those are stored. */
typedef struct {
    store *st;
    int heads, nruns;
    int64_t run_ids[MAX_CLIENTS];
    uint64_t n;              /* pushes written so far */
    stats_head *h;
    stats_problem pr;
    stats_cpu_fast_workspace *ws;
} alone;

static alone *alone_open(const char *dir, const char *name, int heads, const float *tensors,
                         int nruns)
{
    char path[400];
    snprintf(path, sizeof path, "%.300s/%.40s.db", dir, name);
    store_error err = {0, ""};
    alone *a = calloc(1, sizeof *a);
    if (!a || !(a->h = calloc((size_t)heads, sizeof *a->h))) {
        fprintf(stderr, "bench: out of memory\n");
        free(a);
        return NULL;
    }
    a->heads = heads;
    a->nruns = nruns;
    if (!(a->st = store_open(path, 5000, &err))) {
        fprintf(stderr, "bench: store_open: %s\n", err.msg);
        free(a->h);
        free(a);
        return NULL;
    }
    for (int r = 0; r < nruns; r++) {
        char rname[32];
        snprintf(rname, sizeof rname, "alone-%d", r);
        store_run_info info = {.name = rname, .rank = 0, .host = "bench", .pid = 1};
        if (store_run_begin(a->st, &info, &a->run_ids[r], &err) != STORE_OK) {
            fprintf(stderr, "bench: store_run_begin: %s\n", err.msg);
            goto fail;
        }
    }
    for (int i = 0; i < heads; i++)
        a->h[i] = (stats_head){.rows = N, .rows_norm = N, .entropy_mean = 2.0 + 0.01 * i,
                               .entropy_std = 0.1, .entropy_min = 1.5, .entropy_max = 2.5,
                               .entropy_norm_mean = 0.8, .collapsed_frac = 0.0, .max_logit = 3.0};
    if (tensors) {
        tiny_problem(&a->pr, tensors, heads);
        if (!(a->ws = stats_cpu_fast_workspace_new())) {
            fprintf(stderr, "bench: out of memory for the CPU workspace\n");
            goto fail;
        }
    }
    return a;
fail:
    store_close(a->st);
    free(a->h);
    free(a);
    return NULL;
}

static void alone_close(alone *a)
{
    if (!a)
        return;
    stats_cpu_fast_workspace_free(a->ws);
    free(a->h);
    store_close(a->st);
    free(a);
}

/* Pushes/s over seconds, a commit every per_commit pushes; 0 on failure (said on stderr). */
static double alone_run(alone *a, int per_commit, double seconds)
{
    store_error err = {0, ""};
    uint64_t n0 = a->n;
    double t0 = now_s();
    while (now_s() - t0 < seconds) {
        for (int i = 0; i < per_commit; i++, a->n++) {
            stats_error serr;
            if (a->ws && stats_cpu_fast_ws(&a->pr, a->ws, a->h, NULL, NULL, &serr) != STATS_OK) {
                fprintf(stderr, "bench: stats_cpu_fast_ws: %s\n", serr.msg);
                return 0;
            }
            if (!a->ws)
                a->h[0].max_logit = 3.0 + (double)(a->n % 17);
            uint64_t rn = a->n / (uint64_t)a->nruns; /* this run's push number */
            if (store_add_samples(a->st, a->run_ids[a->n % (uint64_t)a->nruns], (int64_t)(rn / 4),
                                  (int32_t)(rn % 4), a->h, a->heads, 0, &err) != STORE_OK) {
                fprintf(stderr, "bench: store_add_samples: %s\n", err.msg);
                return 0;
            }
        }
        if (store_commit(a->st, &err) != STORE_OK) {
            fprintf(stderr, "bench: store_commit: %s\n", err.msg);
            return 0;
        }
    }
    return (double)(a->n - n0) / (now_s() - t0);
}

/* One fresh database: pushes/s over seconds (alone_run). */
static double store_alone(const char *dir, const char *name, int heads, const float *tensors,
                          int nruns, int per_commit, double seconds)
{
    alone *a = alone_open(dir, name, heads, tensors, nruns);
    double rate = a ? alone_run(a, per_commit, seconds) : 0;
    alone_close(a);
    return rate;
}

/* ---- main ---------------------------------------------------------------------------------------- */

int main(int argc, char **argv)
{
    double seconds = 3;
    int clients = 64, window = 32, window1 = 1024, heads = 8, rounds = 3;
    const char *base = "/tmp";
    int extra = argc;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--")) {
            extra = i + 1;
            break;
        }
        if (i + 1 >= argc)
            goto usage;
        if (!strcmp(argv[i], "--seconds"))
            seconds = atof(argv[++i]);
        else if (!strcmp(argv[i], "--clients"))
            clients = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--rounds"))
            rounds = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--window1"))
            window1 = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--window"))
            window = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--heads"))
            heads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--dir"))
            base = argv[++i];
        else
            goto usage;
    }
    if (seconds <= 0 || clients < 1 || clients > MAX_CLIENTS || window < 1 || window1 < 1 ||
        heads < 1 || heads > 1024 || rounds < 1 || rounds > 32)
        goto usage;

    char dir[80];
    snprintf(dir, sizeof dir, "%.50s/attnstat-ingest-XXXXXX", base);
    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        return 1;
    }
    char sock[100], db[100], logp[100];
    snprintf(sock, sizeof sock, "%s/s.sock", dir);
    snprintf(db, sizeof db, "%s/a.db", dir);
    snprintf(logp, sizeof logp, "%s/daemon.log", dir);
    const char **dargv = calloc((size_t)(argc - extra) + 8, sizeof *dargv);
    int k = 0;
    dargv[k++] = ATTNSTATD_PATH;
    dargv[k++] = "--socket";
    dargv[k++] = sock;
    dargv[k++] = "--db";
    dargv[k++] = db;
    for (int i = extra; i < argc; i++)
        dargv[k++] = argv[i];
    pid_t dpid = fork();
    if (dpid == 0) {
        int fd = open(logp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd >= 0) {
            dup2(fd, 2);
            close(fd);
        }
        execv(ATTNSTATD_PATH, (char *const *)dargv);
        _exit(127);
    }
    for (int tries = 0; tries < 1000; tries++) {
        int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        struct sockaddr_un a;
        memset(&a, 0, sizeof a);
        a.sun_family = AF_UNIX;
        snprintf(a.sun_path, sizeof a.sun_path, "%s", sock);
        int ok = connect(fd, (struct sockaddr *)&a, sizeof a) == 0;
        close(fd);
        if (ok)
            break;
        usleep(10000);
    }

    /* Q (heads) and K (one head), random, never all zeros. */
    size_t elems = (size_t)(heads + 1) * N * D, bytes = elems * 4;
    char shm[64];
    snprintf(shm, sizeof shm, "/attnstat-ingest-%d", (int)getpid());
    int sfd = shm_open(shm, O_RDWR | O_CREAT | O_EXCL, 0600);
    if (sfd < 0 || ftruncate(sfd, (off_t)bytes) != 0) {
        perror("shm");
        return 1;
    }
    float *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, sfd, 0);
    close(sfd);
    if (p == MAP_FAILED) {
        perror("mmap");
        return 1;
    }
    uint64_t s = (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 32);
    for (size_t i = 0; i < elems; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        p[i] = (float)((double)(s >> 11) / 9007199254740992.0 * 2.0 - 1.0);
    }

    printf("tiny pushes: %d heads, N=%d, D=%d f32; %.1f s a phase; daemon flags:", heads, N, D,
           seconds);
    for (int i = extra; i < argc; i++)
        printf(" %s", argv[i]);
    printf("%s\n\n", extra >= argc ? " (none: the defaults)" : "");
    printf("%-44s %10s %8s %8s %9s %9s %9s\n", "case", "pushes/s", "dropped", "failed",
           "p50 ms", "p95 ms", "p99 ms");
    char what[120], lbl[80];
    /* Rounds, so that a drift of the machine's speed (a shared VM) moves both sides of each
     * comparison: in each, the daemon with one client and with C, then the store alone writing
     * what they wrote (one run; C runs, their pushes in turn) at 1024 pushes a commit, on
     * databases kept from round to round as the daemon's is. */
    enum { MAX_ROUNDS = 32 };
    double one[MAX_ROUNDS], many[MAX_ROUNDS], lim1[MAX_ROUNDS], limc[MAX_ROUNDS];
    double rat1[MAX_ROUNDS], ratc[MAX_ROUNDS];
    alone *a1 = alone_open(dir, "alone-1", heads, NULL, 1);
    alone *ac = a1 ? alone_open(dir, "alone-c", heads, NULL, clients) : NULL;
    if (!ac) {
        alone_close(a1);
        kill(dpid, SIGTERM);
        waitpid(dpid, NULL, 0);
        return 1;
    }
    int met = 0, met1 = 0;
    for (int r = 0; r < rounds; r++) {
        snprintf(what, sizeof what, "[%d] 1 client, %d in flight", r + 1, window1);
        one[r] = run_phase(what, 1, window1, 0, seconds, heads, sock, shm, bytes).rate;
        snprintf(what, sizeof what, "[%d] %d clients, %d in flight each", r + 1, clients, window);
        many[r] = run_phase(what, clients, window, 0, seconds, heads, sock, shm, bytes).rate;
        lim1[r] = alone_run(a1, 1024, seconds);
        snprintf(lbl, sizeof lbl, "[%d] the store alone, 1 run, 1024 a commit", r + 1);
        printf("%-44s %10.0f\n", lbl, lim1[r]);
        limc[r] = alone_run(ac, 1024, seconds);
        snprintf(lbl, sizeof lbl, "[%d] the store alone, %d runs, 1024 a commit", r + 1, clients);
        printf("%-44s %10.0f\n", lbl, limc[r]);
        rat1[r] = one[r] > 0 ? lim1[r] / one[r] : 1e9;
        ratc[r] = many[r] > 0 ? limc[r] / many[r] : 1e9;
        met += ratc[r] <= 1.5;
        met1 += rat1[r] <= 1.5;
        printf("[%d] the limit / the daemon: 1 client %.2fx, %d clients %.2fx\n", r + 1, rat1[r],
               clients, ratc[r]);
        fflush(stdout);
    }
    alone_close(a1);
    alone_close(ac);
    double med_many = median(many, rounds);
    run_phase("1 client, 1 in flight (Ack latency)", 1, 1, 0, seconds, heads, sock, shm, bytes);
    snprintf(what, sizeof what, "%d clients paced at 20%% (%.0f/s in all)", clients,
             med_many * 0.2);
    run_phase(what, clients, window, med_many * 0.2 / clients, seconds, heads, sock, shm, bytes);
    /* For reference, on fresh databases: the store alone at 64 pushes a commit, and at 1024 with
     * each push's statistics computed first (the work the daemon must do: the daemon / that is
     * its own overhead). */
    const int runs_of[2] = {1, clients};
    double work[2];
    for (int r = 0; r < 2; r++) {
        char name[40];
        snprintf(name, sizeof name, "ref-%d-64", runs_of[r]);
        double rate = store_alone(dir, name, heads, NULL, runs_of[r], 64, seconds);
        snprintf(lbl, sizeof lbl, "the store alone, %d run%s, 64 a commit", runs_of[r],
                 runs_of[r] == 1 ? "" : "s");
        printf("%-44s %10.0f\n", lbl, rate);
        snprintf(name, sizeof name, "ref-stats-%d", runs_of[r]);
        work[r] = store_alone(dir, name, heads, p, runs_of[r], 1024, seconds);
        snprintf(lbl, sizeof lbl, "  + stats_cpu_fast (%d run%s, 1024 a commit)", runs_of[r],
                 runs_of[r] == 1 ? "" : "s");
        printf("%-44s %10.0f\n", lbl, work[r]);
    }
    double r1 = median(rat1, rounds), rn = median(ratc, rounds);
    printf("\nthe limit (the store alone, same runs, same round) / the daemon, median of %d rounds: "
           "1 client %.2fx, %d clients %.2fx; <= 1.5x (issue #14): 1 client in %d of %d rounds, %d "
           "clients in %d of %d\n", rounds, r1, clients, rn, met1, rounds, clients, met, rounds);
    double m1 = median(one, rounds);
    printf("the store alone + stats / the daemon (medians): 1 client %.2fx, %d clients %.2fx (the "
           "daemon's own overhead)\n", m1 > 0 ? work[0] / m1 : 0, clients,
           med_many > 0 ? work[1] / med_many : 0);
    printf("the store alone with 1 run / the daemon with %d clients (medians): %.2fx (unlike data: "
           "one run against %d)\n", clients, med_many > 0 ? median(lim1, rounds) / med_many : 0,
           clients);

    kill(dpid, SIGTERM);
    int st = 0;
    waitpid(dpid, &st, 0);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
        fprintf(stderr, "bench: attnstatd exit status %d (see %s)\n", st, logp);
    munmap(p, bytes);
    shm_unlink(shm);
    free(dargv);
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd) != 0)
        fprintf(stderr, "bench: could not remove %s\n", dir);
    return 0;
usage:
    fprintf(stderr, "usage: %s [--seconds S] [--rounds R] [--clients C] [--window W] [--window1 W1] "
            "[--heads H] [--dir D] [-- DAEMON FLAGS...]\n", argv[0]);
    return 2;
}
