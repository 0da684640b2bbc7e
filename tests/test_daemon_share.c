/* test_daemon_share.c — what one peer, or one mistake, could take from everyone else (issue 23),
 * with a real attnstatd: each test is a defect once seen, and fails on the code that had it.
 *  - R1: one daemon per database FILE: a hard link or a symbolic link to a database in use does
 *    not start a second daemon (two WALs on one file lost acknowledged samples);
 *  - R3: the last slots are kept for root, the daemon's uid and status commands, a uid whose share
 *    is full still gets status, and a connection that said Hello and then nothing loses its slot;
 *  - R4: a subscriber sees its own uid's runs only (root all), holds at most sub_queue_bytes
 *    unsent (the rest dropped and counted), and is closed once it reads nothing for
 *    write_timeout_ms;
 *  - R7: Hellos alone store at most max_runs_per_uid runs and max_config_bytes_per_uid bytes of
 *    configs per uid;
 *  - R8: SIGHUP reads the config file off the event loop: a FIFO in its place is refused with the
 *    reason, a file too big too, and the daemon serves throughout;
 * Waits are for conditions, with generous deadlines: nothing here depends on a timing margin. */
#include "daemon_harness.h"

#include <arpa/inet.h>
#include <grp.h>
#include <netinet/in.h>

/* ---- helpers -------------------------------------------------------------------------------- */

/* The whole file at path ("" when unreadable); free it. */
static char *slurp(const char *path)
{
    FILE *f = fopen(path, "r");
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    ck_assert_ptr_nonnull(buf);
    if (f) {
        size_t r;
        while ((r = fread(buf + n, 1, cap - n - 1, f)) > 0) {
            n += r;
            if (cap - n < 2) {
                cap *= 2;
                buf = realloc(buf, cap);
                ck_assert_ptr_nonnull(buf);
            }
        }
        fclose(f);
    }
    buf[n] = '\0';
    return buf;
}

/* Waits until the file at path holds needle (or timeout_ms passes). 1 when it does. */
static int file_has(const char *path, const char *needle, int timeout_ms)
{
    int64_t deadline = dh_now_ms() + timeout_ms;
    for (;;) {
        char *text = slurp(path);
        int found = strstr(text, needle) != NULL;
        free(text);
        if (found || dh_now_ms() > deadline)
            return found;
        dh_sleep_ms(50);
    }
}

/* How many times needle occurs in the file at path. */
static int file_count(const char *path, const char *needle)
{
    char *text = slurp(path);
    int n = 0;
    for (const char *p = text; (p = strstr(p, needle)); p += strlen(needle))
        n++;
    free(text);
    return n;
}

/* Waits until needle occurs more than `than` times in the file at path. 1 when it does. */
static int file_count_over(const char *path, const char *needle, int than, int timeout_ms)
{
    int64_t deadline = dh_now_ms() + timeout_ms;
    for (;;) {
        if (file_count(path, needle) > than)
            return 1;
        if (dh_now_ms() > deadline)
            return 0;
        dh_sleep_ms(50);
    }
}

static void write_file(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    ck_assert_msg(f != NULL, "%s: %s", path, strerror(errno));
    fputs(text, f);
    ck_assert_int_eq(fclose(f), 0);
}

/* Runs attnstatd with args (NULL-terminated, after the binary) to its end, its output into log;
 * returns its exit status (-1: killed by a signal, or still running after 60 s: then killed). */
static int run_daemon_to_end(const char *log, const char *const *args)
{
    const char *argv[32];
    int n = 0;
    argv[n++] = ATTNSTATD_PATH;
    for (int i = 0; args[i] && n < 31; i++)
        argv[n++] = args[i];
    argv[n] = NULL;
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd >= 0) {
            dup2(fd, 1);
            dup2(fd, 2);
            close(fd);
        }
        execv(argv[0], (char *const *)argv);
        _exit(127);
    }
    int64_t deadline = dh_now_ms() + 60000;
    int st;
    while (waitpid(pid, &st, WNOHANG) != pid) {
        if (dh_now_ms() > deadline) {
            kill(pid, SIGTERM);
            waitpid(pid, &st, 0);
            return -1;
        }
        dh_sleep_ms(20);
    }
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* ---- connections of other uids ------------------------------------------------------------- */

/* gid 65534: the allowed group of the tests that act as other uids (a uid is admitted by its
 * primary group, as the daemon reads it from SO_PEERCRED). */
static const gid_t ALLOWED_GID = 65534;

/* The name of ALLOWED_GID, for --allow-group; 0 when the test cannot act as other uids (not root,
 * no such group): the caller skips, saying so. */
static int other_uids_possible(char *name, size_t len, const char *who)
{
    struct group *g = getuid() == 0 ? getgrgid(ALLOWED_GID) : NULL;
    if (!g) {
        fprintf(stderr, "%s: SKIPPED (needs root and group %u to act as other uids)\n", who,
                (unsigned)ALLOWED_GID);
        return 0;
    }
    snprintf(name, len, "%s", g->gr_name);
    return 1;
}

/* n connections to d made by uid (primary group ALLOWED_GID): a child process takes the uid,
 * connects, hands the sockets over (SCM_RIGHTS) and exits; the daemon sees uid as their peer
 * (SO_PEERCRED is the connecting process's). */
static void connect_as(const dh_daemon *d, uid_t uid, int n, dh_conn *out)
{
    int sv[2];
    ck_assert_int_eq(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        close(sv[0]);
        if (setgroups(0, NULL) != 0 || setgid(ALLOWED_GID) != 0 || setuid(uid) != 0)
            _exit(3);
        for (int i = 0; i < n; i++) {
            int fd = dh_try_connect(d->sock);
            if (fd < 0)
                _exit(4);
            char byte = 'c';
            struct iovec iov = {&byte, 1};
            union {
                struct cmsghdr h;
                char buf[CMSG_SPACE(sizeof(int))];
            } u;
            struct msghdr mh;
            memset(&mh, 0, sizeof mh);
            memset(&u, 0, sizeof u);
            mh.msg_iov = &iov;
            mh.msg_iovlen = 1;
            mh.msg_control = u.buf;
            mh.msg_controllen = sizeof u.buf;
            struct cmsghdr *cm = CMSG_FIRSTHDR(&mh);
            cm->cmsg_level = SOL_SOCKET;
            cm->cmsg_type = SCM_RIGHTS;
            cm->cmsg_len = CMSG_LEN(sizeof(int));
            memcpy(CMSG_DATA(cm), &fd, sizeof fd);
            if (sendmsg(sv[1], &mh, 0) != 1)
                _exit(5);
            close(fd);
        }
        _exit(0);
    }
    close(sv[1]);
    for (int i = 0; i < n; i++) {
        char byte;
        struct iovec iov = {&byte, 1};
        union {
            struct cmsghdr h;
            char buf[CMSG_SPACE(sizeof(int))];
        } u;
        struct msghdr mh;
        memset(&mh, 0, sizeof mh);
        mh.msg_iov = &iov;
        mh.msg_iovlen = 1;
        mh.msg_control = u.buf;
        mh.msg_controllen = sizeof u.buf;
        ssize_t r = recvmsg(sv[0], &mh, MSG_CMSG_CLOEXEC);
        struct cmsghdr *cm = r == 1 ? CMSG_FIRSTHDR(&mh) : NULL;
        ck_assert_msg(cm && cm->cmsg_type == SCM_RIGHTS, "connection %d of uid %u not handed over",
                      i, (unsigned)uid);
        memset(&out[i], 0, sizeof out[i]);
        memcpy(&out[i].fd, CMSG_DATA(cm), sizeof(int));
        frame_reader_init(&out[i].rd, 64u << 20);
    }
    close(sv[0]);
    int st;
    ck_assert_int_eq(waitpid(pid, &st, 0), pid);
    ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0, "the child of uid %u failed (%d)",
                  (unsigned)uid, st);
}

/* ---- messages ------------------------------------------------------------------------------- */

/* The next Error on c (other messages skipped) with its code, message copied; -1 when none came
 * before the connection closed or timeout_ms passed. */
static int next_error(dh_conn *c, char *msg, size_t len, int timeout_ms)
{
    Attnstat__Envelope *e = dh_expect(c, ATTNSTAT__ENVELOPE__MSG_ERROR, timeout_ms);
    if (!e)
        return -1;
    int code = (int)e->error->code;
    snprintf(msg, len, "%s", e->error->message);
    attnstat__envelope__free_unpacked(e, NULL);
    return code;
}

/* Sends a Hello of run with config (NULL: none); returns the Error code it got, or 0 for a
 * HelloReply. */
static int hello_with(dh_conn *c, const char *run, int32_t rank, const char *config, char *msg,
                      size_t len)
{
    Attnstat__Hello h;
    Attnstat__Envelope env;
    envelope_hello(&env, &h, run);
    h.has_rank = 1;
    h.rank = rank;
    h.config = (char *)config;
    ck_assert_int_eq(dh_send(c, &env), 0);
    Attnstat__Envelope *r = dh_recv(c, 20000);
    ck_assert_msg(r != NULL, "no reply to a Hello");
    int code = 0;
    msg[0] = '\0';
    if (r->msg_case == ATTNSTAT__ENVELOPE__MSG_ERROR) {
        code = (int)r->error->code;
        snprintf(msg, len, "%s", r->error->message);
    } else {
        ck_assert_int_eq(r->msg_case, ATTNSTAT__ENVELOPE__MSG_HELLO_REPLY);
    }
    attnstat__envelope__free_unpacked(r, NULL);
    return code;
}

/* Waits until the daemon counts `want` connections (w among them). */
static void wait_clients(dh_conn *w, uint32_t want)
{
    int64_t deadline = dh_now_ms() + 30000;
    for (;;) {
        Attnstat__Envelope *r = dh_status(w);
        uint32_t n = r->status_reply->clients;
        attnstat__envelope__free_unpacked(r, NULL);
        if (n == want)
            return;
        ck_assert_msg(dh_now_ms() < deadline, "the daemon counts %u connections, not %u", n, want);
        dh_sleep_ms(50);
    }
}

/* A Computed message of n heads with random, self-consistent values; nonfinite: every head
 * reports non-finite rows (an alert at once). hs and ptrs are the caller's arrays of n. */
static void fill_computed(Attnstat__Computed *m, Attnstat__HeadStats *hs,
                          Attnstat__HeadStats **ptrs, size_t n, uint64_t seq, int64_t step,
                          dh_rng *rng, int nonfinite)
{
    attnstat__computed__init(m);
    m->seq = seq;
    m->step = step;
    m->layer = 0;
    for (size_t h = 0; h < n; h++) {
        Attnstat__HeadStats *o = &hs[h];
        attnstat__head_stats__init(o);
        o->head = (uint32_t)h;
        o->rows = 64 + dh_next(rng) % 64;
        o->has_rows_norm = 1;
        o->rows_norm = o->rows - 1;
        o->has_entropy_mean = o->has_entropy_std = o->has_entropy_min = o->has_entropy_max = 1;
        o->entropy_mean = 2.0 + 0.5 * (double)(dh_next(rng) % 1000) / 1000.0;
        o->entropy_std = 0.05 + 0.01 * fabs(dh_gauss(rng));
        o->entropy_min = o->entropy_mean * 0.5;
        o->entropy_max = o->entropy_mean * 1.5;
        o->has_entropy_norm_mean = 1;
        o->entropy_norm_mean = o->entropy_mean / 4.0;
        o->has_collapsed_frac = 1;
        o->collapsed_frac = 0.0;
        o->has_max_logit = 1;
        o->max_logit = 3.0 + dh_gauss(rng);
        if (nonfinite) {
            o->has_nonfinite_rows = 1;
            o->nonfinite_rows = 1 + dh_next(rng) % 8;
        }
        ptrs[h] = o;
    }
    m->n_heads = n;
    m->heads = ptrs;
}

static void send_computed(dh_conn *c, Attnstat__Computed *m)
{
    Attnstat__Envelope env = ATTNSTAT__ENVELOPE__INIT;
    env.msg_case = ATTNSTAT__ENVELOPE__MSG_COMPUTED;
    env.computed = m;
    ck_assert_int_eq(dh_send(c, &env), 0);
}

/* The Ack of Computed seq (a Computed has no Release); its code. */
static int computed_ack(dh_conn *c, uint64_t seq)
{
    for (;;) {
        Attnstat__Envelope *e = dh_recv(c, 30000);
        ck_assert_msg(e != NULL, "no Ack for Computed %llu", (unsigned long long)seq);
        int code = e->msg_case == ATTNSTAT__ENVELOPE__MSG_ACK && e->ack->seq == seq
                       ? (int)e->ack->code : -1;
        attnstat__envelope__free_unpacked(e, NULL);
        if (code >= 0)
            return code;
    }
}

/* What a subscriber holds: Status sent, then every message read up to its StatusReply (the
 * daemon's stream keeps order: every Result and Alert queued for it before the Status was read
 * comes first). Per run name (runs[0..nruns)), Results and Alerts counted; bytes: the frames read. */
typedef struct {
    int results[4], alerts[4];
    int other;               /* of runs not named */
    uint64_t bytes;
} sub_seen;

/* Counts e into out (see sub_seen). */
static void count_message(const Attnstat__Envelope *e, const char *const *runs, int nruns,
                          sub_seen *out)
{
    out->bytes += attnstat__envelope__get_packed_size(e) + 4;
    const char *run = e->msg_case == ATTNSTAT__ENVELOPE__MSG_RESULT  ? e->result->run
                      : e->msg_case == ATTNSTAT__ENVELOPE__MSG_ALERT ? e->alert->run
                                                                     : NULL;
    if (!run)
        return;
    int k = 0;
    while (k < nruns && strcmp(runs[k], run) != 0)
        k++;
    if (k == nruns)
        out->other++;
    else if (e->msg_case == ATTNSTAT__ENVELOPE__MSG_RESULT)
        out->results[k]++;
    else
        out->alerts[k]++;
}

/* Adds to *out what c holds up to the StatusReply of a Status sent now. */
static void drain_subscriber(dh_conn *c, const char *const *runs, int nruns, sub_seen *out)
{
    dh_send_status(c);
    for (;;) {
        Attnstat__Envelope *e = dh_recv(c, 30000);
        ck_assert_msg(e != NULL, "the subscriber's stream ended before its StatusReply");
        int last = e->msg_case == ATTNSTAT__ENVELOPE__MSG_STATUS_REPLY;
        count_message(e, runs, nruns, out);
        attnstat__envelope__free_unpacked(e, NULL);
        if (last)
            return;
    }
}

/* A free TCP port of 127.0.0.1 (bound and released: the daemon takes it next). */
static int free_port(void)
{
    int probe = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ck_assert_int_eq(bind(probe, (struct sockaddr *)&a, sizeof a), 0);
    socklen_t al = sizeof a;
    ck_assert_int_eq(getsockname(probe, (struct sockaddr *)&a, &al), 0);
    close(probe);
    return ntohs(a.sin_port);
}

/* The value of the counter `name` on the daemon's /metrics at port (asserted present). */
static uint64_t scrape_counter(int port, const char *name)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    ck_assert_int_ge(fd, 0);
    struct sockaddr_in a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_port = htons((uint16_t)port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ck_assert_msg(connect(fd, (struct sockaddr *)&a, sizeof a) == 0, "connect :%d: %s", port,
                  strerror(errno));
    const char req[] = "GET /metrics HTTP/1.0\r\n\r\n";
    ck_assert_int_eq(dh_write_all(fd, req, sizeof req - 1), 0);
    size_t cap = 1 << 20, n = 0;
    char *buf = malloc(cap);
    ck_assert_ptr_nonnull(buf);
    for (;;) {
        struct pollfd pf = {fd, POLLIN, 0};
        ck_assert_msg(poll(&pf, 1, 20000) > 0, "no /metrics page in 20 s");
        ssize_t r = read(fd, buf + n, cap - 1 - n);
        if (r <= 0)
            break;
        n += (size_t)r;
        ck_assert(n < cap - 1);
    }
    buf[n] = '\0';
    close(fd);
    char line[128];
    snprintf(line, sizeof line, "\n%s ", name);
    const char *at = strstr(buf, line);
    ck_assert_msg(at != NULL, "%s is not on /metrics", name);
    uint64_t v = strtoull(at + strlen(line), NULL, 10);
    free(buf);
    return v;
}

/* ---- R1: one daemon per database file ------------------------------------------------------- */

/* A second daemon given another name of the database in use (a hard link, then a symbolic link)
 * stops at start, naming the first one's pid; the first one's data stays whole. Without the lock
 * on the file itself, each started and served (their WALs apart). */
START_TEST(test_second_name_of_database_refused)
{
    dh_rng rng = dh_rng_new("second_name");
    dh_daemon d;
    dh_dir_init(&d);
    dh_start(&d, (const char *)NULL);
    dh_conn c;
    dh_connect(&c, &d);
    int64_t run_id = 0;
    char run[64];
    snprintf(run, sizeof run, "lock-%llu", (unsigned long long)(dh_next(&rng) % 1000000));
    dh_hello(&c, run, 0, &run_id);
    dh_close(&c);

    char sub[200], hard[300], soft[300], sock2[200], log2[300], want[128];
    snprintf(sub, sizeof sub, "%s/elsewhere", d.dir);
    ck_assert_int_eq(mkdir(sub, 0700), 0);
    snprintf(hard, sizeof hard, "%s/hard.db", sub);
    snprintf(soft, sizeof soft, "%s/soft.db", sub);
    snprintf(sock2, sizeof sock2, "%s/second.sock", d.dir);
    snprintf(log2, sizeof log2, "%s/second.log", d.dir);
    ck_assert_msg(link(d.db, hard) == 0, "link: %s", strerror(errno));
    ck_assert_msg(symlink(d.db, soft) == 0, "symlink: %s", strerror(errno));
    snprintf(want, sizeof want, "is in use by another attnstatd (pid %d)", (int)d.pid);
    const char *names[] = {hard, soft};
    for (int i = 0; i < 2; i++) {
        const char *args[] = {"--socket", sock2, "--db", names[i], NULL};
        int st = run_daemon_to_end(log2, args);
        char *out = slurp(log2);
        int named = strstr(out, want) != NULL;
        if (st != 1 || !named)
            fprintf(stderr, "second daemon on %s:\n%s\n", names[i], out);
        free(out);
        ck_assert_msg(st == 1, "a second daemon on %s (the same file) exited %d", names[i], st);
        ck_assert_msg(named, "the second daemon on %s did not say '%s'", names[i], want);
        unlink(sock2);
    }
    /* The first one serves on, and its run is there. */
    dh_connect(&c, &d);
    attnstat__envelope__free_unpacked(dh_status(&c), NULL);
    dh_close(&c);
    int rc = dh_stop(&d);
    sqlite3 *db = dh_db_open(&d);
    char sql[200];
    snprintf(sql, sizeof sql, "SELECT count(*) FROM runs WHERE id = %lld", (long long)run_id);
    int64_t n = dh_db_int(db, sql);
    sqlite3_close(db);
    unlink(hard);
    unlink(soft);
    rmdir(sub);
    dh_cleanup(&d, rc != 0);
    ck_assert_int_eq(rc, 0);
    ck_assert_int_eq(n, 1);
}
END_TEST

/* ---- R3: slots kept back, and deadlines ---------------------------------------------------- */

/* A uid whose trainers held its whole share could not even ask for status, and uids holding every
 * slot locked root out. Now a uid gets status_clients_per_uid connections past its share (status
 * and commands only: a Hello there is refused, naming max_clients_per_uid), and the last
 * reserved_clients slots are root's and the daemon's, other uids taking at most half of them for
 * status only (their Hello refused, naming reserved_clients; past that share, refused at once);
 * root still gets status and a Hello in. Needs root (other uids). */
START_TEST(test_slots_reserved_for_status_and_root)
{
    char group[64];
    if (!other_uids_possible(group, sizeof group, "slots_reserved"))
        return;
    dh_rng rng = dh_rng_new("slots_reserved");
    uid_t ua = 40000 + (uid_t)(dh_next(&rng) % 1000), ub = ua + 1000, uc = ua + 2000;
    dh_daemon d;
    dh_dir_init(&d);
    ck_assert_int_eq(chmod(d.dir, 0755), 0);
    /* 13 slots: root's watcher + 4 of A + 4 of B fill the 9 general ones; 4 kept back. */
    dh_start(&d, "--allow-group", group, "--max-clients", "13", "--reserved-clients", "4",
             "--max-clients-per-uid", "4", "--status-clients-per-uid", "1", (const char *)NULL);
    dh_conn w, a[5], b[4], cc[3], r;
    dh_connect(&w, &d);
    wait_clients(&w, 1);
    char msg[512], run[64];
    connect_as(&d, ua, 4, a);
    for (int i = 0; i < 4; i++) {
        snprintf(run, sizeof run, "a-%d", i);
        ck_assert_int_eq(hello_with(&a[i], run, 0, NULL, msg, sizeof msg), 0);
    }
    /* A's share is full: its fifth connection still asks for status, but may not say Hello. */
    connect_as(&d, ua, 1, &a[4]);
    attnstat__envelope__free_unpacked(dh_status(&a[4]), NULL);
    int code = hello_with(&a[4], "a-4", 0, NULL, msg, sizeof msg);
    ck_assert_msg(code == ATTNSTAT__CODE__BUSY && strstr(msg, "max_clients_per_uid 4"),
                  "a Hello past the uid's share got %d (%s)", code, msg);
    ck_assert(dh_wait_closed(&a[4], 30000));
    dh_close(&a[4]);
    wait_clients(&w, 5);
    connect_as(&d, ub, 4, b);
    for (int i = 0; i < 4; i++) {
        snprintf(run, sizeof run, "b-%d", i);
        ck_assert_int_eq(hello_with(&b[i], run, 0, NULL, msg, sizeof msg), 0);
    }
    /* Every general slot taken: C gets two of the four kept back (half), for status only. */
    connect_as(&d, uc, 3, cc);
    code = next_error(&cc[2], msg, sizeof msg, 30000);
    ck_assert_msg(code == ATTNSTAT__CODE__BUSY && strstr(msg, "reserved_clients"),
                  "a connection past the other uids' share of the reserve got %d (%s)", code, msg);
    dh_close(&cc[2]);
    attnstat__envelope__free_unpacked(dh_status(&cc[0]), NULL);
    code = hello_with(&cc[1], "c-1", 0, NULL, msg, sizeof msg);
    ck_assert_msg(code == ATTNSTAT__CODE__BUSY && strstr(msg, "reserved_clients 4"),
                  "a Hello in a reserved slot got %d (%s)", code, msg);
    dh_close(&cc[1]);
    /* Root gets in: its status, and its Hello. */
    dh_connect(&r, &d);
    attnstat__envelope__free_unpacked(dh_status(&r), NULL);
    ck_assert_int_eq(hello_with(&r, "root-run", 0, NULL, msg, sizeof msg), 0);
    dh_close(&r);
    dh_close(&cc[0]);
    for (int i = 0; i < 4; i++) {
        dh_close(&a[i]);
        dh_close(&b[i]);
    }
    dh_close(&w);
    int rc = dh_stop(&d);
    dh_cleanup(&d, rc != 0);
    ck_assert_int_eq(rc, 0);
}
END_TEST

/* A connection that said Hello and then nothing held its slot for ever. Now it is answered
 * Error(BUSY) naming idle_timeout_ms and closed; a subscriber, silent longer still, is judged by
 * what it reads and stays. */
START_TEST(test_idle_hello_loses_its_slot)
{
    dh_rng rng = dh_rng_new("idle_hello");
    dh_daemon d;
    dh_dir_init(&d);
    char ms[16];
    snprintf(ms, sizeof ms, "%llu", 200 + (unsigned long long)(dh_next(&rng) % 300));
    dh_start(&d, "--idle-timeout-ms", ms, (const char *)NULL);
    dh_conn s, t;
    dh_connect(&s, &d);
    dh_subscribe(&s, 1, 1);
    attnstat__envelope__free_unpacked(dh_status(&s), NULL);
    dh_connect(&t, &d);
    dh_hello(&t, "idle", 0, NULL);
    char msg[512];
    int code = next_error(&t, msg, sizeof msg, 30000);
    ck_assert_msg(code == ATTNSTAT__CODE__BUSY && strstr(msg, "idle_timeout_ms"),
                  "an idle connection got %d (%s)", code, msg);
    ck_assert(dh_wait_closed(&t, 30000));
    dh_close(&t);
    attnstat__envelope__free_unpacked(dh_status(&s), NULL); /* the subscriber is still served */
    dh_close(&s);
    int rc = dh_stop(&d);
    dh_cleanup(&d, rc != 0);
    ck_assert_int_eq(rc, 0);
}
END_TEST

/* ---- R4: subscribers see their own runs, and what they do not read is bounded --------------- */

/* Any admitted uid read every run's results and alerts live. Now a subscriber of another uid than
 * root or the daemon's sees the runs its uid owns only; root sees them all. Needs root. */
START_TEST(test_subscriber_sees_its_own_runs)
{
    char group[64];
    if (!other_uids_possible(group, sizeof group, "own_runs"))
        return;
    dh_rng rng = dh_rng_new("own_runs");
    uid_t ua = 40000 + (uid_t)(dh_next(&rng) % 1000);
    dh_daemon d;
    dh_dir_init(&d);
    ck_assert_int_eq(chmod(d.dir, 0755), 0);
    dh_start(&d, "--allow-group", group, (const char *)NULL);
    dh_conn sa, sr, ta, tr;
    connect_as(&d, ua, 1, &sa);
    connect_as(&d, ua, 1, &ta);
    dh_connect(&sr, &d);
    dh_connect(&tr, &d);
    dh_subscribe(&sa, 1, 1);
    dh_subscribe(&sr, 1, 1);
    attnstat__envelope__free_unpacked(dh_status(&sa), NULL); /* subscribed by now */
    attnstat__envelope__free_unpacked(dh_status(&sr), NULL);
    const char *runs[] = {"a-run", "root-run"};
    char msg[512];
    ck_assert_int_eq(hello_with(&ta, runs[0], 0, NULL, msg, sizeof msg), 0);
    ck_assert_int_eq(hello_with(&tr, runs[1], 0, NULL, msg, sizeof msg), 0);
    int k = 3 + (int)(dh_next(&rng) % 5);
    Attnstat__HeadStats hs[8], *ptrs[8];
    for (int i = 0; i < k; i++) {
        Attnstat__Computed m;
        fill_computed(&m, hs, ptrs, 8, (uint64_t)i + 1, i, &rng, 0);
        send_computed(&ta, &m);
        fill_computed(&m, hs, ptrs, 8, (uint64_t)i + 1, i, &rng, i == k - 1);
        send_computed(&tr, &m); /* its last one: non-finite rows, an alert of root's run */
    }
    for (int i = 0; i < k; i++) {
        ck_assert_int_eq(computed_ack(&ta, (uint64_t)i + 1), 0);
        ck_assert_int_eq(computed_ack(&tr, (uint64_t)i + 1), 0);
    }
    /* Root's subscriber gets the alert (its copy and A's are sent together, if A's were). */
    sub_seen root_seen, a_seen;
    memset(&root_seen, 0, sizeof root_seen);
    memset(&a_seen, 0, sizeof a_seen);
    while (root_seen.alerts[1] == 0) {
        Attnstat__Envelope *e = dh_recv(&sr, 30000);
        ck_assert_msg(e != NULL, "root's subscriber got no alert of its run");
        count_message(e, runs, 2, &root_seen);
        attnstat__envelope__free_unpacked(e, NULL);
    }
    drain_subscriber(&sa, runs, 2, &a_seen);
    ck_assert_msg(a_seen.results[0] == k && a_seen.results[1] == 0 && a_seen.alerts[1] == 0,
                  "uid %u's subscriber saw %d results of its run (of %d), %d results and %d alerts "
                  "of root's", (unsigned)ua, a_seen.results[0], k, a_seen.results[1],
                  a_seen.alerts[1]);
    drain_subscriber(&sr, runs, 2, &root_seen);
    ck_assert_msg(root_seen.results[0] == k && root_seen.results[1] == k,
                  "root's subscriber saw %d and %d results, not %d of each", root_seen.results[0],
                  root_seen.results[1], k);
    dh_close(&sa);
    dh_close(&sr);
    dh_close(&ta);
    dh_close(&tr);
    int rc = dh_stop(&d);
    dh_cleanup(&d, rc != 0);
    ck_assert_int_eq(rc, 0);
}
END_TEST

/* Subscribers that never read made the daemon buffer 4 MiB each (64 of them: +380 MB). Now what
 * one holds unsent is bounded by sub_queue_bytes (256 KiB): the bytes it finds once it reads are at
 * most that and what the kernel's socket buffer held, whatever was sent meanwhile, and every
 * Result it did not get is counted (messages_dropped on /metrics); the trainer is not slowed. */
START_TEST(test_subscriber_output_bounded)
{
    dh_rng rng = dh_rng_new("sub_bounded");
    int port = free_port();
    char portarg[16];
    snprintf(portarg, sizeof portarg, "%d", port);
    dh_daemon d;
    dh_dir_init(&d);
    dh_start(&d, "--metrics-port", portarg, (const char *)NULL);
    dh_conn s, t;
    dh_connect(&s, &d);
    dh_subscribe(&s, 0, 1);
    attnstat__envelope__free_unpacked(dh_status(&s), NULL);
    dh_connect(&t, &d);
    const char *runs[] = {"flood"};
    dh_hello(&t, runs[0], 0, NULL);
    /* About 8 MB of Results to a subscriber that reads none of them. */
    enum { HEADS = 64, N = 1200, WINDOW = 256 };
    static Attnstat__HeadStats hs[HEADS];
    static Attnstat__HeadStats *ptrs[HEADS];
    for (int i = 0; i < N; i++) {
        Attnstat__Computed m;
        fill_computed(&m, hs, ptrs, HEADS, (uint64_t)i + 1, i, &rng, 0);
        send_computed(&t, &m);
        if (i >= WINDOW)
            ck_assert_int_eq(computed_ack(&t, (uint64_t)(i - WINDOW) + 1), 0);
    }
    for (int i = N - WINDOW; i < N; i++)
        ck_assert_int_eq(computed_ack(&t, (uint64_t)i + 1), 0);
    sub_seen seen;
    memset(&seen, 0, sizeof seen);
    drain_subscriber(&s, runs, 1, &seen);
    long wmem = 212992;
    FILE *f = fopen("/proc/sys/net/core/wmem_default", "r");
    if (f) {
        if (fscanf(f, "%ld", &wmem) != 1)
            wmem = 212992;
        fclose(f);
    }
    uint64_t bound = 262144 + 2 * (uint64_t)wmem + 65536;
    ck_assert_msg(seen.bytes <= bound, "the subscriber found %llu bytes waiting, over the %llu "
                  "that sub_queue_bytes and the socket buffer allow (%d of %d results)",
                  (unsigned long long)seen.bytes, (unsigned long long)bound, seen.results[0], N);
    ck_assert_msg(seen.results[0] > 0 && seen.results[0] < N, "%d of %d results came",
                  seen.results[0], N);
    uint64_t dropped = scrape_counter(port, "attnstat_messages_dropped_total");
    ck_assert_msg(dropped == (uint64_t)(N - seen.results[0]), "%llu drops counted, %d results "
                  "missing", (unsigned long long)dropped, N - seen.results[0]);
    dh_close(&s);
    dh_close(&t);
    int rc = dh_stop(&d);
    dh_cleanup(&d, rc != 0);
    ck_assert_int_eq(rc, 0);
}
END_TEST

/* A subscriber that stopped reading held its slot and its queue for ever. Now, once it has read
 * none of what waits for it for write_timeout_ms, it is closed (logged with the reason). */
START_TEST(test_stalled_subscriber_closed)
{
    dh_rng rng = dh_rng_new("stalled_sub");
    dh_daemon d;
    dh_dir_init(&d);
    dh_start(&d, "--write-timeout-ms", "300", (const char *)NULL);
    dh_conn s, t, w;
    dh_connect(&s, &d);
    dh_subscribe(&s, 0, 1);
    attnstat__envelope__free_unpacked(dh_status(&s), NULL);
    dh_connect(&w, &d);
    dh_connect(&t, &d);
    dh_hello(&t, "stall", 0, NULL);
    wait_clients(&w, 3);
    enum { HEADS = 64 };
    static Attnstat__HeadStats hs[HEADS];
    static Attnstat__HeadStats *ptrs[HEADS];
    /* Results until the daemon has closed the subscriber (each push fills its socket more). */
    int closed = 0;
    int64_t deadline = dh_now_ms() + 60000;
    for (uint64_t seq = 1; !closed; seq++) {
        ck_assert_msg(dh_now_ms() < deadline, "a subscriber that reads nothing was not closed");
        Attnstat__Computed m;
        fill_computed(&m, hs, ptrs, HEADS, seq, (int64_t)seq, &rng, 0);
        send_computed(&t, &m);
        ck_assert_int_eq(computed_ack(&t, seq), 0);
        if (seq % 64 == 0) {
            Attnstat__Envelope *r = dh_status(&w);
            closed = r->status_reply->clients == 2;
            attnstat__envelope__free_unpacked(r, NULL);
        }
    }
    ck_assert(file_has(d.log, "(write_timeout_ms 300)", 10000));
    dh_close(&s);
    dh_close(&t);
    dh_close(&w);
    int rc = dh_stop(&d);
    dh_cleanup(&d, rc != 0);
    ck_assert_int_eq(rc, 0);
}
END_TEST

/* ---- R7: what Hellos alone may store ------------------------------------------------------ */

/* A JSON object config of exactly n bytes (n >= 16), random content. */
static char *random_config(dh_rng *rng, size_t n)
{
    char *s = malloc(n + 1);
    ck_assert_ptr_nonnull(s);
    memcpy(s, "{\"k\":\"", 6);
    for (size_t i = 6; i < n - 2; i++)
        s[i] = (char)('a' + dh_next(rng) % 26);
    memcpy(s + n - 2, "\"}", 3);
    return s;
}

/* Hellos with new run names (or big configs) and no push grew the database without bound (1 000
 * Hellos of 64 KiB: 66 MB in 2 s). Now a uid's runs are at most max_runs_per_uid and their configs
 * together max_config_bytes_per_uid: a Hello past either is refused (BUSY, naming the setting and
 * what frees it), nothing of it stored; a run deleted frees its share. */
START_TEST(test_hellos_bounded_per_uid)
{
    dh_rng rng = dh_rng_new("hello_quota");
    dh_daemon d;
    dh_dir_init(&d);
    dh_start(&d, "--max-runs-per-uid", "3", "--max-config-bytes-per-uid", "4096",
             (const char *)NULL);
    dh_conn t[8];
    char msg[512], run[64], prefix[16];
    snprintf(prefix, sizeof prefix, "q%llu", (unsigned long long)(dh_next(&rng) % 100000));
    size_t sizes[3] = {900 + dh_next(&rng) % 100, 900 + dh_next(&rng) % 100, 1000};
    int64_t ids[3];
    for (int i = 0; i < 3; i++) {
        dh_connect(&t[i], &d);
        char *cfg = random_config(&rng, sizes[i]);
        snprintf(run, sizeof run, "%s-%d", prefix, i);
        ck_assert_int_eq(hello_with(&t[i], run, i, cfg, msg, sizeof msg), 0);
        free(cfg);
    }
    /* A fourth run: refused. */
    dh_connect(&t[3], &d);
    snprintf(run, sizeof run, "%s-3", prefix);
    int code = hello_with(&t[3], run, 0, NULL, msg, sizeof msg);
    ck_assert_msg(code == ATTNSTAT__CODE__BUSY && strstr(msg, "max_runs_per_uid 3") &&
                      strstr(msg, "delete-run"), "a fourth run got %d (%s)", code, msg);
    /* A run of its own again, its config bigger: the sum decides. */
    dh_connect(&t[4], &d);
    snprintf(run, sizeof run, "%s-0", prefix);
    char *big = random_config(&rng, 4096 - sizes[1] - sizes[2] + 1);
    code = hello_with(&t[4], run, 0, big, msg, sizeof msg);
    free(big);
    ck_assert_msg(code == ATTNSTAT__CODE__BUSY && strstr(msg, "max_config_bytes_per_uid 4096"),
                  "configs past the uid's bytes got %d (%s)", code, msg);
    dh_connect(&t[5], &d);
    char *fits = random_config(&rng, 4096 - sizes[1] - sizes[2]);
    ck_assert_int_eq(hello_with(&t[5], run, 0, fits, msg, sizeof msg), 0);
    free(fits);
    sqlite3 *db = dh_db_open(&d);
    char sql[300];
    snprintf(sql, sizeof sql, "SELECT count(*) FROM runs WHERE name LIKE '%s-%%'", prefix);
    int64_t nruns = dh_db_int(db, sql);
    snprintf(sql, sizeof sql, "SELECT coalesce(sum(length(config)), 0) FROM runs WHERE name "
             "LIKE '%s-%%'", prefix);
    int64_t bytes = dh_db_int(db, sql);
    for (int i = 0; i < 3; i++) {
        snprintf(sql, sizeof sql, "SELECT id FROM runs WHERE name = '%s-%d'", prefix, i);
        ids[i] = dh_db_int(db, sql);
    }
    sqlite3_close(db);
    ck_assert_int_eq(nruns, 3);
    ck_assert_int_le(bytes, 4096);
    /* Run 2 deleted (its client gone): its share is free, the fourth run gets in. */
    dh_close(&t[2]);
    dh_conn op;
    dh_connect(&op, &d);
    int64_t deadline = dh_now_ms() + 30000;
    for (;;) {
        Attnstat__Command m;
        Attnstat__Envelope env;
        envelope_command(&env, &m, ATTNSTAT__COMMAND__ACTION__DELETE_RUN);
        m.has_run_id = 1;
        m.run_id = ids[2];
        ck_assert_int_eq(dh_send(&op, &env), 0);
        Attnstat__Envelope *r = dh_expect(&op, ATTNSTAT__ENVELOPE__MSG_COMMAND_REPLY, 30000);
        ck_assert_ptr_nonnull(r);
        int ok = r->command_reply->code == ATTNSTAT__CODE__OK;
        attnstat__envelope__free_unpacked(r, NULL);
        if (ok)
            break;
        ck_assert_msg(dh_now_ms() < deadline, "run %lld could not be deleted", (long long)ids[2]);
        dh_sleep_ms(50); /* its client's close not seen yet */
    }
    dh_connect(&t[6], &d);
    snprintf(run, sizeof run, "%s-3", prefix);
    ck_assert_int_eq(hello_with(&t[6], run, 0, NULL, msg, sizeof msg), 0);
    dh_close(&op);
    for (int i = 0; i < 7; i++)
        if (i != 2)
            dh_close(&t[i]);
    int rc = dh_stop(&d);
    dh_cleanup(&d, rc != 0);
    ck_assert_int_eq(rc, 0);
}
END_TEST

/* ---- R8: SIGHUP off the event loop -------------------------------------------------------- */

/* SIGHUP read the config file on the event loop: a FIFO in its place (or a file system that hangs)
 * stopped the daemon for good. Now the file is read on a thread of its own, a FIFO is refused
 * with the reason and the daemon serves throughout; a file too big is refused too; a regular file
 * put back is applied. */
START_TEST(test_sighup_fifo_does_not_stop_the_daemon)
{
    dh_rng rng = dh_rng_new("sighup_fifo");
    dh_daemon d;
    dh_dir_init(&d);
    char conf[300], text[200];
    snprintf(conf, sizeof conf, "%s/attnstatd.conf", d.dir);
    write_file(conf, "logit_ceiling = 100\n");
    dh_start(&d, "--config", conf, (const char *)NULL);
    dh_conn c;
    dh_connect(&c, &d);
    attnstat__envelope__free_unpacked(dh_status(&c), NULL);

    /* A FIFO nobody writes to, in the config file's place. */
    ck_assert_int_eq(unlink(conf), 0);
    ck_assert_msg(mkfifo(conf, 0600) == 0, "mkfifo: %s", strerror(errno));
    const char *failed = "reload failed, settings unchanged";
    int before = file_count(d.log, failed);
    ck_assert_int_eq(kill(d.pid, SIGHUP), 0);
    ck_assert_msg(file_count_over(d.log, failed, before, 30000), "no failed reload logged");
    ck_assert_msg(file_has(d.log, "is a FIFO, not a regular file", 1000),
                  "the failed reload does not say the file is a FIFO");
    attnstat__envelope__free_unpacked(dh_status(&c), NULL); /* it serves */

    /* Too big: refused, saying the bound. */
    ck_assert_int_eq(unlink(conf), 0);
    FILE *f = fopen(conf, "w");
    ck_assert_ptr_nonnull(f);
    for (int i = 0; i < 20000; i++)
        fprintf(f, "# %060llu\n", (unsigned long long)dh_next(&rng));
    ck_assert_int_eq(fclose(f), 0);
    before = file_count(d.log, failed);
    ck_assert_int_eq(kill(d.pid, SIGHUP), 0);
    ck_assert(file_count_over(d.log, failed, before, 30000));
    ck_assert_msg(file_has(d.log, "more than the 1048576 bytes", 1000),
                  "the failed reload does not state the size bound");
    attnstat__envelope__free_unpacked(dh_status(&c), NULL);

    /* A regular file again: applied. */
    double ceiling = 10 + (double)(dh_next(&rng) % 80);
    snprintf(text, sizeof text, "logit_ceiling = %g\n", ceiling);
    write_file(conf, text);
    char want[100];
    snprintf(want, sizeof want, "reload: logit_ceiling: 100 -> %g", ceiling);
    ck_assert_int_eq(kill(d.pid, SIGHUP), 0);
    ck_assert_msg(file_has(d.log, want, 30000), "the reload after the FIFO was not applied");
    attnstat__envelope__free_unpacked(dh_status(&c), NULL);
    dh_close(&c);
    int rc = dh_stop(&d);
    dh_cleanup(&d, rc != 0);
    ck_assert_int_eq(rc, 0);
}
END_TEST

/* ---- the suite ------------------------------------------------------------------------------ */

static Suite *share_suite(void)
{
    Suite *s = suite_create("daemon_share");
    TCase *lock = tcase_create("lock");
    tcase_set_timeout(lock, 300);
    tcase_add_test(lock, test_second_name_of_database_refused);
    suite_add_tcase(s, lock);
    TCase *slots = tcase_create("slots");
    tcase_set_timeout(slots, 300);
    tcase_add_test(slots, test_slots_reserved_for_status_and_root);
    tcase_add_test(slots, test_idle_hello_loses_its_slot);
    suite_add_tcase(s, slots);
    TCase *subs = tcase_create("subscribers");
    tcase_set_timeout(subs, 300);
    tcase_add_test(subs, test_subscriber_sees_its_own_runs);
    tcase_add_test(subs, test_subscriber_output_bounded);
    tcase_add_test(subs, test_stalled_subscriber_closed);
    suite_add_tcase(s, subs);
    TCase *quota = tcase_create("quota");
    tcase_set_timeout(quota, 300);
    tcase_add_test(quota, test_hellos_bounded_per_uid);
    suite_add_tcase(s, quota);
    TCase *hup = tcase_create("sighup");
    tcase_set_timeout(hup, 300);
    tcase_add_test(hup, test_sighup_fifo_does_not_stop_the_daemon);
    suite_add_tcase(s, hup);
    return s;
}

int main(void)
{
    return dh_run(share_suite());
}
