/* daemon_harness.c — the test harness (see daemon_harness.h): the attnstatd process, raw frames
 * over its socket (messages from proto/envelope.c), shared memory, the database, seeds, the runner. */
#include "daemon_harness.h"

#include <arpa/inet.h>
#include <netinet/in.h>

#ifndef ATTNSTATD_PATH
#error "ATTNSTATD_PATH must name the attnstatd binary"
#endif

/* ---- time and randomness -------------------------------------------------------------------- */

int64_t dh_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

void dh_sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

uint64_t dh_next(dh_rng *r)
{
    uint64_t z = (r->s += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

double dh_gauss(dh_rng *r)
{
    double u = ((double)(dh_next(r) >> 11) + 0.5) / 9007199254740992.0;
    double v = ((double)(dh_next(r) >> 11) + 0.5) / 9007199254740992.0;
    return sqrt(-2.0 * log(u)) * cos(6.283185307179586 * v);
}

/* A fresh seed per run, printed (ATTNSTAT_TEST_SEED replays one). */
dh_rng dh_rng_new(const char *who)
{
    const char *env = getenv("ATTNSTAT_TEST_SEED");
    uint64_t seed;
    if (env && *env) {
        seed = strtoull(env, NULL, 0);
    } else {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        seed = (uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 20) ^ ((uint64_t)getpid() << 40);
    }
    fprintf(stderr, "%s: random seed ATTNSTAT_TEST_SEED=%llu\n", who, (unsigned long long)seed);
    dh_rng r = {seed};
    return r;
}

uint16_t dh_f32_to_bf16(float f)
{
    uint32_t b;
    memcpy(&b, &f, 4);
    b += 0x7fff + ((b >> 16) & 1); /* round to nearest even (finite inputs) */
    return (uint16_t)(b >> 16);
}

int dh_run(Suite *s)
{
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? 0 : 1;
}

/* ---- the daemon process --------------------------------------------------------------------- */

void dh_dir_init(dh_daemon *d)
{
    memset(d, 0, sizeof *d);
    snprintf(d->dir, sizeof d->dir, "/tmp/attnstatd-test-XXXXXX");
    ck_assert_msg(mkdtemp(d->dir) != NULL, "mkdtemp: %s", strerror(errno));
    snprintf(d->sock, sizeof d->sock, "%s/attnstatd.sock", d->dir);
    snprintf(d->db, sizeof d->db, "%s/attnstat.db", d->dir);
    snprintf(d->log, sizeof d->log, "%s/daemon.log", d->dir);
}

int dh_try_connect(const char *path)
{
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -1;
    struct sockaddr_un a;
    memset(&a, 0, sizeof a);
    a.sun_family = AF_UNIX;
    snprintf(a.sun_path, sizeof a.sun_path, "%s", path);
    if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

/* Starts attnstatd with --socket/--db in d's directory plus the extra flags (NULL-terminated). */
void dh_start_v(dh_daemon *d, const char *const *extra)
{
    const char *argv[64];
    int n = 0;
    argv[n++] = ATTNSTATD_PATH;
    argv[n++] = "--socket";
    argv[n++] = d->sock;
    argv[n++] = "--db";
    argv[n++] = d->db;
    argv[n++] = "--log-level";
    argv[n++] = "debug";
    for (int i = 0; extra && extra[i] && n < 62; i++)
        argv[n++] = extra[i];
    argv[n] = NULL;
    pid_t pid = fork();
    ck_assert_msg(pid >= 0, "fork: %s", strerror(errno));
    if (pid == 0) {
        int fd = open(d->log, O_WRONLY | O_CREAT | O_APPEND, 0644);
        if (fd >= 0) {
            dup2(fd, 2);
            dup2(fd, 1);
            close(fd);
        }
        execv(argv[0], (char *const *)argv);
        _exit(127);
    }
    d->pid = pid;
    int64_t deadline = dh_now_ms() + 20000;
    for (;;) {
        int fd = dh_try_connect(d->sock);
        if (fd >= 0) {
            close(fd);
            return;
        }
        int st;
        if (waitpid(pid, &st, WNOHANG) == pid) {
            d->pid = 0;
            ck_abort_msg("attnstatd exited at start-up (status %d); see %s", st, d->log);
        }
        ck_assert_msg(dh_now_ms() < deadline, "attnstatd did not listen on %s in 20 s", d->sock);
        dh_sleep_ms(20);
    }
}

void dh_start(dh_daemon *d, ...)
{
    const char *extra[32];
    int n = 0;
    va_list ap;
    va_start(ap, d);
    const char *a;
    while (n < 31 && (a = va_arg(ap, const char *)) != NULL)
        extra[n++] = a;
    va_end(ap);
    extra[n] = NULL;
    dh_start_v(d, extra);
}

/* Waits for the daemon to exit (timeout_ms); returns its wait status, or -1 on timeout. */
int dh_wait(dh_daemon *d, int timeout_ms)
{
    int64_t deadline = dh_now_ms() + timeout_ms;
    for (;;) {
        int st;
        pid_t r = waitpid(d->pid, &st, WNOHANG);
        if (r == d->pid) {
            d->pid = 0;
            return st;
        }
        if (dh_now_ms() > deadline)
            return -1;
        dh_sleep_ms(10);
    }
}

/* SIGTERM and wait: returns the exit status (asserts a normal exit within 30 s). */
int dh_stop(dh_daemon *d)
{
    if (d->pid <= 0)
        return -1;
    kill(d->pid, SIGTERM);
    int st = dh_wait(d, 30000);
    if (st == -1) {
        kill(d->pid, SIGKILL);
        dh_wait(d, 5000);
        ck_abort_msg("attnstatd did not exit within 30 s of SIGTERM; see %s", d->log);
    }
    ck_assert_msg(WIFEXITED(st), "attnstatd died of signal %d; see %s", WIFSIGNALED(st) ? WTERMSIG(st) : 0,
                  d->log);
    return WEXITSTATUS(st);
}

void dh_kill9(dh_daemon *d)
{
    if (d->pid > 0) {
        kill(d->pid, SIGKILL);
        dh_wait(d, 10000);
    }
}

/* Prints the daemon's log to stderr (for failures) and removes the directory. */
void dh_cleanup(dh_daemon *d, int show_log)
{
    if (d->pid > 0)
        dh_kill9(d);
    char cmd[700];
    if (show_log) {
        snprintf(cmd, sizeof cmd, "tail -n 60 %s >&2", d->log);
        if (system(cmd) != 0)
            fprintf(stderr, "(no daemon log)\n");
    }
    snprintf(cmd, sizeof cmd, "rm -rf %s", d->dir);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", d->dir);
}

/* ---- frames --------------------------------------------------------------------------------- */

void dh_connect(dh_conn *c, const dh_daemon *d)
{
    memset(c, 0, sizeof *c);
    c->fd = dh_try_connect(d->sock);
    ck_assert_msg(c->fd >= 0, "connect %s: %s", d->sock, strerror(errno));
    frame_reader_init(&c->rd, 64u << 20);
}

void dh_close(dh_conn *c)
{
    if (c->fd >= 0)
        close(c->fd);
    c->fd = -1;
    frame_reader_free(&c->rd);
}

int dh_write_all(int fd, const void *buf, size_t n)
{
    const uint8_t *p = buf;
    while (n > 0) {
        ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            return -1;
        }
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

int dh_free_port(void)
{
    int probe = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    ck_assert_int_eq(bind(probe, (struct sockaddr *)&a, sizeof a), 0);
    socklen_t al = sizeof a;
    ck_assert_int_eq(getsockname(probe, (struct sockaddr *)&a, &al), 0);
    close(probe);
    return ntohs(a.sin_port);
}

void dh_scrape(int port, char *buf, size_t cap)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    ck_assert_int_eq(connect(fd, (struct sockaddr *)&a, sizeof a), 0);
    const char req[] = "GET /metrics HTTP/1.0\r\n\r\n";
    ck_assert_int_eq(dh_write_all(fd, req, sizeof req - 1), 0);
    size_t n = 0;
    int64_t deadline = dh_now_ms() + 20000;
    while (n + 1 < cap && dh_now_ms() < deadline) {
        struct pollfd pf = {fd, POLLIN, 0};
        if (poll(&pf, 1, 100) <= 0)
            continue;
        ssize_t r = read(fd, buf + n, cap - 1 - n);
        if (r <= 0)
            break;
        n += (size_t)r;
    }
    buf[n] = '\0';
    close(fd);
}

int dh_send(dh_conn *c, const Attnstat__Envelope *env)
{
    size_t len;
    uint8_t *buf = frame_pack(env, 64u << 20, &len);
    ck_assert_ptr_nonnull(buf);
    int rc = dh_write_all(c->fd, buf, len);
    free(buf);
    return rc;
}

/* Next message, or NULL on timeout / EOF / bad frame. Free with attnstat__envelope__free_unpacked. */
Attnstat__Envelope *dh_recv(dh_conn *c, int timeout_ms)
{
    int64_t deadline = dh_now_ms() + timeout_ms;
    for (;;) {
        const uint8_t *payload;
        uint32_t len;
        char err[128];
        int r = frame_reader_next(&c->rd, &payload, &len, err, sizeof err);
        if (r < 0)
            return NULL;
        if (r == 1) {
            Attnstat__Envelope *env = frame_decode(payload, len, NULL);
            frame_reader_consume(&c->rd);
            if (env && env->msg_case == ATTNSTAT__ENVELOPE__MSG_RELEASE)
                c->released[c->nreleased++ % 1024] = env->release->seq;
            if (env && env->msg_case == ATTNSTAT__ENVELOPE__MSG_ACK) {
                dh_ack_seen *a = &c->acked[c->nacked++ % 1024];
                a->seq = env->ack->seq;
                a->code = (int)env->ack->code;
                a->released_first = 0;
                for (size_t i = 0; i < c->nreleased && i < 1024; i++)
                    a->released_first |= c->released[i] == a->seq;
            }
            return env;
        }
        int64_t left = deadline - dh_now_ms();
        if (left <= 0)
            return NULL;
        struct pollfd pfd = {c->fd, POLLIN, 0};
        int pr = poll(&pfd, 1, (int)left);
        if (pr < 0 && errno == EINTR)
            continue;
        if (pr <= 0)
            return NULL;
        size_t avail;
        uint8_t *dst = frame_reader_space(&c->rd, 65536, &avail);
        ssize_t n = read(c->fd, dst, avail);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return NULL;
        frame_reader_commit(&c->rd, (size_t)n);
    }
}

/* Next message of the given kind, skipping others (Release, Result...). NULL on timeout/EOF. */
Attnstat__Envelope *dh_expect(dh_conn *c, Attnstat__Envelope__MsgCase kind, int timeout_ms)
{
    int64_t deadline = dh_now_ms() + timeout_ms;
    for (;;) {
        int64_t left = deadline - dh_now_ms();
        if (left <= 0)
            return NULL;
        Attnstat__Envelope *e = dh_recv(c, (int)left);
        if (!e || e->msg_case == kind)
            return e;
        attnstat__envelope__free_unpacked(e, NULL);
    }
}

/* True when the peer closed the connection within timeout_ms (reads and discards messages). */
int dh_wait_closed(dh_conn *c, int timeout_ms)
{
    int64_t deadline = dh_now_ms() + timeout_ms;
    while (dh_now_ms() < deadline) {
        struct pollfd pfd = {c->fd, POLLIN, 0};
        if (poll(&pfd, 1, 100) <= 0)
            continue;
        char buf[4096];
        ssize_t n = read(c->fd, buf, sizeof buf);
        if (n == 0 || (n < 0 && errno != EINTR && errno != EAGAIN))
            return 1;
    }
    return 0;
}

void dh_hello_lists(dh_conn *c, const char *run, int rank, const Attnstat__Thresholds *th,
                    const char *feature, int64_t *run_id)
{
    Attnstat__Hello h;
    Attnstat__Envelope env;
    envelope_hello(&env, &h, run);
    h.has_rank = 1;
    h.rank = rank;
    h.has_pid = 1;
    h.pid = getpid();
    h.thresholds = (Attnstat__Thresholds *)th;
    ck_assert_int_eq(dh_send(c, &env), 0);
    Attnstat__Envelope *r = dh_recv(c, 20000);
    ck_assert_msg(r != NULL, "no reply to Hello");
    ck_assert_msg(r->msg_case == ATTNSTAT__ENVELOPE__MSG_HELLO_REPLY, "Hello answered with %d (%s)",
                  (int)r->msg_case, r->msg_case == ATTNSTAT__ENVELOPE__MSG_ERROR ? r->error->message : "");
    ck_assert_uint_eq(r->hello_reply->protocol_version, FRAME_PROTOCOL_VERSION);
    ck_assert_int_gt(r->hello_reply->run_id, 0);
    int listed = feature == NULL;
    for (size_t i = 0; i < r->hello_reply->n_features && !listed; i++)
        listed = strcmp(r->hello_reply->features[i], feature) == 0;
    ck_assert_msg(listed, "the HelloReply does not list \"%s\"", feature ? feature : "");
    if (run_id)
        *run_id = r->hello_reply->run_id;
    attnstat__envelope__free_unpacked(r, NULL);
}

void dh_hello_th(dh_conn *c, const char *run, int rank, const Attnstat__Thresholds *th,
                 int64_t *run_id)
{
    dh_hello_lists(c, run, rank, th, NULL, run_id);
}

void dh_hello(dh_conn *c, const char *run, int rank, int64_t *run_id)
{
    dh_hello_th(c, run, rank, NULL, run_id);
}

void dh_proc_open(dh_proc *p, const dh_daemon *d, dh_rng *r, const char *run, int rank,
                  const char *tag, uint64_t heads, uint64_t n, uint64_t dim)
{
    memset(p, 0, sizeof *p);
    dh_connect(&p->c, d);
    dh_hello(&p->c, run, rank, &p->run_id);
    dh_tensor_contig(&p->q, 1, 0, ATTNSTAT__DTYPE__F32, 1, heads, n, dim);
    uint64_t qbytes = dh_tensor_elems(&p->q) * 4;
    dh_tensor_contig(&p->k, 1, qbytes, ATTNSTAT__DTYPE__F32, 1, heads, n, dim);
    dh_shm_create(&p->shm, tag, qbytes * 2);
    dh_fill(r, p->shm.ptr, dh_tensor_elems(&p->q) * 2, ATTNSTAT__DTYPE__F32, 1.0);
    dh_register(&p->c, 1, p->shm.name, p->shm.size);
}

void dh_proc_close(dh_proc *p)
{
    dh_close(&p->c);
    dh_shm_destroy(&p->shm);
}

void dh_register(dh_conn *c, uint32_t id, const char *shm, uint64_t size)
{
    Attnstat__RegisterBuffer rb;
    Attnstat__Envelope env;
    ck_assert_int_eq(dh_send(c, envelope_register_shm(&env, &rb, id, shm, size)), 0);
}

void dh_subscribe(dh_conn *c, int alerts, int results)
{
    Attnstat__Subscribe sb;
    Attnstat__Envelope env;
    ck_assert_int_eq(dh_send(c, envelope_subscribe(&env, &sb, alerts, results)), 0);
}

void dh_send_status(dh_conn *c)
{
    Attnstat__Status st;
    Attnstat__Envelope env;
    ck_assert_int_eq(dh_send(c, envelope_status(&env, &st)), 0);
}

/* ---- shared memory and tensors -------------------------------------------------------------- */

void dh_shm_create(dh_shm *s, const char *tag, size_t size)
{
    static int counter;
    snprintf(s->name, sizeof s->name, "/attnstat-test-%d-%s-%d", (int)getpid(), tag, counter++);
    int fd = shm_open(s->name, O_RDWR | O_CREAT | O_EXCL, 0600);
    if (fd < 0 && errno == EEXIST) {
        /* The name carries this process's pid, so what holds it was left by a dead process with
         * the same pid (a test that failed before its dh_shm_destroy; pids wrap): ours to reuse. */
        shm_unlink(s->name);
        fd = shm_open(s->name, O_RDWR | O_CREAT | O_EXCL, 0600);
    }
    ck_assert_msg(fd >= 0, "shm_open %s: %s", s->name, strerror(errno));
    ck_assert_int_eq(ftruncate(fd, (off_t)size), 0);
    s->ptr = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    ck_assert(s->ptr != MAP_FAILED);
    close(fd);
    s->size = size;
}

void dh_shm_destroy(dh_shm *s)
{
    if (s->ptr)
        munmap(s->ptr, s->size);
    shm_unlink(s->name);
    s->ptr = NULL;
}

void dh_tensor_contig(dh_tensor *t, uint32_t buf, uint64_t off, Attnstat__Dtype dt,
                      uint64_t b, uint64_t h, uint64_t n, uint64_t d)
{
    t->buffer_id = buf;
    t->offset = off;
    t->dtype = dt;
    t->shape[0] = b;
    t->shape[1] = h;
    t->shape[2] = n;
    t->shape[3] = d;
    t->strides[3] = 1;
    t->strides[2] = d;
    t->strides[1] = n * d;
    t->strides[0] = h * n * d;
}

uint64_t dh_tensor_elems(const dh_tensor *t)
{
    return t->shape[0] * t->shape[1] * t->shape[2] * t->shape[3];
}

void dh_tensor_ref(Attnstat__TensorRef *r, dh_tensor *t)
{
    envelope_tensor(r, t->buffer_id, t->offset, t->dtype, t->shape, t->strides);
}

/* Fills n elements at p with scale * N(0,1) values of the dtype. */
void dh_fill(dh_rng *r, void *p, uint64_t n, Attnstat__Dtype dt, double scale)
{
    for (uint64_t i = 0; i < n; i++) {
        float v = (float)(scale * dh_gauss(r));
        if (dt == ATTNSTAT__DTYPE__F32)
            ((float *)p)[i] = v;
        else
            ((uint16_t *)p)[i] = dh_f32_to_bf16(v); /* BF16 (tests use no F16 data) */
    }
}

/* The stats_problem equivalent of a q/k pair in host memory (for the reference computation). */
void dh_problem(stats_problem *p, const dh_tensor *q, const void *qbase,
                const dh_tensor *k, const void *kbase)
{
    stats_problem_init(p);
    p->batch = (int32_t)q->shape[0];
    p->heads_q = (int32_t)q->shape[1];
    p->heads_kv = (int32_t)k->shape[1];
    p->len_q = (int32_t)q->shape[2];
    p->len_k = (int32_t)k->shape[2];
    p->head_dim = (int32_t)q->shape[3];
    p->dtype = (stats_dtype)q->dtype;
    p->q.ptr = (const char *)qbase + q->offset;
    p->q.stride_b = (int64_t)q->strides[0];
    p->q.stride_h = (int64_t)q->strides[1];
    p->q.stride_n = (int64_t)q->strides[2];
    p->k.ptr = (const char *)kbase + k->offset;
    p->k.stride_b = (int64_t)k->strides[0];
    p->k.stride_h = (int64_t)k->strides[1];
    p->k.stride_n = (int64_t)k->strides[2];
}

/* Sends a Push of q/k. */
void dh_push(dh_conn *c, uint64_t seq, int64_t step, uint32_t layer, dh_tensor *q,
             dh_tensor *k, int causal, uint32_t sample_rows, int want_results)
{
    Attnstat__TensorRef qr, kr;
    dh_tensor_ref(&qr, q);
    dh_tensor_ref(&kr, k);
    Attnstat__Push p;
    Attnstat__Envelope env;
    envelope_push(&env, &p, seq, step, layer, &qr, &kr);
    p.has_causal = 1;
    p.causal = causal;
    if (sample_rows) {
        p.has_sample_rows = 1;
        p.sample_rows = sample_rows;
        p.has_sample_seed = 1;
        p.sample_seed = 0x5eed + (uint64_t)step;
    }
    p.has_want_results = 1;
    p.want_results = want_results;
    ck_assert_int_eq(dh_send(c, &env), 0);
}

/* Waits for the Ack of seq (asserting the Release came first for OK acks); returns its code and
 * copies its message. */
int dh_wait_ack(dh_conn *c, uint64_t seq, char *msg, size_t msglen, int timeout_ms)
{
    /* already read while waiting for something else (its message is not kept then); newest
     * first, and each record answers one wait (a seq may come again later on a connection) */
    for (size_t n = 0; n < c->nacked && n < 1024; n++) {
        dh_ack_seen *a = &c->acked[(c->nacked - 1 - n) % 1024];
        if (a->seq != seq)
            continue;
        const int code = a->code;
        if (msg)
            snprintf(msg, msglen, "(read earlier)");
        if (code == ATTNSTAT__CODE__OK)
            ck_assert_msg(a->released_first, "Ack(OK) of push %llu came before its Release",
                          (unsigned long long)seq);
        a->seq = UINT64_MAX;
        return code;
    }
    int64_t deadline = dh_now_ms() + timeout_ms;
    for (;;) {
        int64_t left = deadline - dh_now_ms();
        ck_assert_msg(left > 0, "no Ack for push %llu", (unsigned long long)seq);
        Attnstat__Envelope *e = dh_recv(c, (int)left);
        ck_assert_msg(e != NULL, "no Ack for push %llu (connection closed or timeout)",
                      (unsigned long long)seq);
        if (e->msg_case == ATTNSTAT__ENVELOPE__MSG_ACK && e->ack->seq == seq) {
            dh_ack_seen *a = &c->acked[(c->nacked - 1) % 1024]; /* dh_recv's record of it */
            a->seq = UINT64_MAX;                                    /* answered here */
            int code = (int)e->ack->code;
            if (msg)
                snprintf(msg, msglen, "%s", e->ack->message ? e->ack->message : "");
            if (code == ATTNSTAT__CODE__OK)
                ck_assert_msg(a->released_first, "Ack(OK) of push %llu came before its Release",
                              (unsigned long long)seq);
            attnstat__envelope__free_unpacked(e, NULL);
            return code;
        }
        attnstat__envelope__free_unpacked(e, NULL);
    }
}

/* Sends Status and returns the reply (free it). */
Attnstat__Envelope *dh_status(dh_conn *c)
{
    dh_send_status(c);
    Attnstat__Envelope *r = dh_expect(c, ATTNSTAT__ENVELOPE__MSG_STATUS_REPLY, 20000);
    ck_assert_msg(r != NULL, "no StatusReply");
    return r;
}

/* ---- the database ------------------------------------------------------------------------- */

sqlite3 *dh_db_open(const dh_daemon *d)
{
    sqlite3 *db = NULL;
    int rc = sqlite3_open_v2(d->db, &db, SQLITE_OPEN_READONLY, NULL);
    ck_assert_msg(rc == SQLITE_OK, "open %s: %s", d->db, db ? sqlite3_errmsg(db) : "?");
    sqlite3_busy_timeout(db, 5000);
    return db;
}

/* One integer from a query (asserts one row). */
int64_t dh_db_int(sqlite3 *db, const char *sql)
{
    sqlite3_stmt *st = NULL;
    int rc = sqlite3_prepare_v2(db, sql, -1, &st, NULL);
    ck_assert_msg(rc == SQLITE_OK, "%s: %s", sql, sqlite3_errmsg(db));
    rc = sqlite3_step(st);
    ck_assert_msg(rc == SQLITE_ROW, "%s: no row (%s)", sql, sqlite3_errmsg(db));
    int64_t v = sqlite3_column_int64(st, 0);
    sqlite3_finalize(st);
    return v;
}

void dh_db_text(sqlite3 *db, const char *sql, char *out, size_t n)
{
    sqlite3_stmt *st = NULL;
    int rc = sqlite3_prepare_v2(db, sql, -1, &st, NULL);
    ck_assert_msg(rc == SQLITE_OK, "%s: %s", sql, sqlite3_errmsg(db));
    rc = sqlite3_step(st);
    ck_assert_msg(rc == SQLITE_ROW, "%s: no row", sql);
    const unsigned char *t = sqlite3_column_text(st, 0);
    snprintf(out, n, "%s", t ? (const char *)t : "");
    sqlite3_finalize(st);
}

int dh_close_enough(double a, double b)
{
    if (isnan(a) || isnan(b))
        return isnan(a) && isnan(b);
    if (isinf(a) || isinf(b))
        return a == b;
    return fabs(a - b) <= 1e-9 * (1.0 + fabs(b));
}

int dh_close_to_reference(double got, double ref)
{
    if (isnan(got) || isnan(ref))
        return isnan(got) && isnan(ref);
    if (isinf(got) || isinf(ref))
        return got == ref;
    return fabs(got - ref) <= 1e-5 * fabs(ref) + 1e-5;
}
