/* test_daemon_config.c — attnstatd's settings and access policy, with real daemon processes:
 * a config file sets values (flags override it; the alert thresholds of vocab.h, sink_mass_ceiling
 * and distance_floor too); a bad value is reported with its file and line
 * and the daemon exits 2; the socket is created with mode 0660; a peer of another uid is served
 * only when its group is allowed (--allow-group; run as root to switch uids, skipped otherwise). */
#include <arpa/inet.h>
#include <grp.h>
#include <netinet/in.h>
#include <pwd.h>

#include "daemon_harness.h"

static int run_status(const char *const *argv, char *out, size_t outlen)
{
    int p[2];
    ck_assert_int_eq(pipe(p), 0);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        dup2(p[1], 2);
        dup2(p[1], 1);
        close(p[0]);
        execv(argv[0], (char *const *)argv);
        _exit(127);
    }
    close(p[1]);
    size_t n = 0;
    ssize_t r;
    while (n + 1 < outlen && (r = read(p[0], out + n, outlen - 1 - n)) > 0)
        n += (size_t)r;
    out[n] = '\0';
    close(p[0]);
    int st;
    ck_assert_int_eq(waitpid(pid, &st, 0), pid);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

START_TEST(test_config_file_and_errors)
{
    dh_daemon d;
    dh_dir_init(&d);
    char conf[300], out[65536]; /* the whole --help */
    snprintf(conf, sizeof conf, "%s/attnstatd.conf", d.dir);
    FILE *f = fopen(conf, "w");
    ck_assert_ptr_nonnull(f);
    fprintf(f, "# test config\nmax_clients = 1\n\nlogit_ceiling = -5\n");
    fclose(f);
    const char *bad[] = {ATTNSTATD_PATH, "--config", conf, "--socket", d.sock, "--db", d.db, NULL};
    ck_assert_int_eq(run_status(bad, out, sizeof out), 2);
    char want[400];
    snprintf(want, sizeof want, "%s:4: logit_ceiling", conf);
    ck_assert_msg(strstr(out, want), "no '%s' in:\n%s", want, out);

    const char *badflag[] = {ATTNSTATD_PATH, "--queue-depth", "0", NULL};
    ck_assert_int_eq(run_status(badflag, out, sizeof out), 2);
    ck_assert_msg(strstr(out, "queue_depth: 0 is out of range"), "%s", out);
    const char *unknown[] = {ATTNSTATD_PATH, "--no-such-flag", "1", NULL};
    ck_assert_int_eq(run_status(unknown, out, sizeof out), 2);
    ck_assert_msg(strstr(out, "unknown flag '--no-such-flag'"), "%s", out);
    /* The thresholds are vocab.h's rows: the new ones are settings too, with their bounds. */
    const char *badsink[] = {ATTNSTATD_PATH, "--sink-mass-ceiling", "1.5", NULL};
    ck_assert_int_eq(run_status(badsink, out, sizeof out), 2);
    ck_assert_msg(strstr(out, "sink_mass_ceiling: 1.5 is out of range [1e-06, 1]"), "%s", out);
    const char *baddist[] = {ATTNSTATD_PATH, "--distance-floor=-0.5", NULL};
    ck_assert_int_eq(run_status(baddist, out, sizeof out), 2);
    ck_assert_msg(strstr(out, "distance_floor: -0.5 is out of range [0, 1e+30]"), "%s", out);
    const char *help[] = {ATTNSTATD_PATH, "--help", NULL};
    ck_assert_int_eq(run_status(help, out, sizeof out), 0);
    ck_assert_msg(strstr(out, "--max-frame") && strstr(out, "--allow-group"), "%s", out);
    ck_assert_msg(strstr(out, "--sink-mass-ceiling") && strstr(out, "default 1.0, range [1e-06, 1]") &&
                      strstr(out, "--distance-floor") && strstr(out, "default 0.0, range [0, 1e+30]") &&
                      strstr(out, "--entropy-drop") && strstr(out, "default 0.5, range [1e-06, 0.999999]"),
                  "%s", out);

    /* A good file: max_clients = 1 takes effect; a flag overrides the file's log level. */
    f = fopen(conf, "w");
    ck_assert_ptr_nonnull(f);
    fprintf(f, "max_clients = 1   # one at a time\nlog_level = error\nsink_mass_ceiling = 0.5\n"
               "distance_floor = 3\n");
    fclose(f);
    dh_start(&d, "--config", conf, "--log-level", "debug", (const char *)NULL);
    struct stat sb;
    ck_assert_int_eq(stat(d.sock, &sb), 0);
    ck_assert_int_eq(sb.st_mode & 0777, 0660);
    dh_conn a, b;
    /* The start-up probe's connection may still hold the one slot for a moment: retry. A refused
     * connection may be closed before the Status is even written: that send fails, and is retried
     * like a refusal. */
    int64_t deadline = dh_now_ms() + 20000;
    for (;;) {
        dh_connect(&a, &d);
        Attnstat__Status stq;
        Attnstat__Envelope q;
        Attnstat__Envelope *r = dh_send(&a, envelope_status(&q, &stq)) == 0 ? dh_recv(&a, 20000) : NULL;
        int served = r && r->msg_case == ATTNSTAT__ENVELOPE__MSG_STATUS_REPLY;
        if (r)
            attnstat__envelope__free_unpacked(r, NULL);
        if (served)
            break;
        dh_close(&a);
        ck_assert_msg(dh_now_ms() < deadline, "the only client slot never became free");
        dh_sleep_ms(20);
    }
    dh_hello(&a, "first", 0, NULL);
    dh_connect(&b, &d);
    Attnstat__Envelope *e = dh_recv(&b, 20000);
    ck_assert_msg(e && e->msg_case == ATTNSTAT__ENVELOPE__MSG_ERROR && e->error->code == ATTNSTAT__CODE__BUSY,
                  "second client not refused");
    attnstat__envelope__free_unpacked(e, NULL);
    dh_close(&b);
    dh_close(&a);
    ck_assert_int_eq(dh_stop(&d), 0);
    FILE *lf = fopen(d.log, "r");
    ck_assert_ptr_nonnull(lf);
    size_t n = fread(out, 1, sizeof out - 1, lf);
    out[n] = '\0';
    fclose(lf);
    ck_assert_msg(strstr(out, "debug"), "--log-level debug did not override the file");
    /* the file's sink_mass_ceiling and distance_floor are the run's (its Hello set none) */
    sqlite3 *db = dh_db_open(&d);
    char json[1024];
    dh_db_text(db, "SELECT thresholds FROM runs WHERE name = 'first'", json, sizeof json);
    sqlite3_close(db);
    ck_assert_msg(strstr(json, "\"sink_mass_ceiling\":0.5,\"distance_floor\":3"), "%s", json);
    dh_cleanup(&d, 0);
}
END_TEST

/* Connects as uid/gid and sends Hello; returns 1 when served, 0 when refused (by the socket's
 * mode or by the daemon's policy), from a forked child. */
static int served_as(dh_daemon *d, uid_t uid, gid_t gid)
{
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        if (setgroups(0, NULL) != 0 || setgid(gid) != 0 || setuid(uid) != 0)
            _exit(3);
        int fd = dh_try_connect(d->sock);
        if (fd < 0)
            _exit(1); /* the socket's mode keeps it out */
        dh_conn c;
        memset(&c, 0, sizeof c);
        c.fd = fd;
        frame_reader_init(&c.rd, 1u << 20);
        Attnstat__Hello h;
        Attnstat__Envelope env;
        if (dh_send(&c, envelope_hello(&env, &h, "other-user")) != 0)
            _exit(1);
        Attnstat__Envelope *r = dh_recv(&c, 20000);
        _exit(r && r->msg_case == ATTNSTAT__ENVELOPE__MSG_HELLO_REPLY ? 0 : 2);
    }
    int st;
    ck_assert_int_eq(waitpid(pid, &st, 0), pid);
    ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) != 3, "could not switch to uid %u", (unsigned)uid);
    return WEXITSTATUS(st) == 0;
}

START_TEST(test_allow_group)
{
    if (getuid() != 0) {
        fprintf(stderr, "allow_group: not root, cannot switch uids: skipped\n");
        return;
    }
    struct passwd *pw = getpwnam("nobody");
    struct group *gr = getgrnam("nogroup");
    if (!pw || !gr) {
        fprintf(stderr, "allow_group: no nobody/nogroup: skipped\n");
        return;
    }
    uid_t uid = pw->pw_uid;
    gid_t gid = gr->gr_gid;
    dh_daemon d;
    dh_dir_init(&d);
    ck_assert_int_eq(chmod(d.dir, 0755), 0);
    /* Without --allow-group: another uid is kept out. */
    dh_start(&d, (const char *)NULL);
    ck_assert_int_eq(served_as(&d, uid, gid), 0);
    /* Even through a socket opened up by hand, the daemon's own check refuses it. */
    ck_assert_int_eq(chmod(d.sock, 0666), 0);
    ck_assert_int_eq(served_as(&d, uid, gid), 0);
    ck_assert_int_eq(dh_stop(&d), 0);
    FILE *lf0 = fopen(d.log, "r");
    ck_assert_ptr_nonnull(lf0);
    char log0[16384];
    size_t n0 = fread(log0, 1, sizeof log0 - 1, lf0);
    log0[n0] = '\0';
    fclose(lf0);
    ck_assert_msg(strstr(log0, "may not use this daemon"), "no policy refusal in the log");
    /* With its group allowed: served; the same uid in another group is not. */
    dh_start(&d, "--allow-group", "nogroup", (const char *)NULL);
    ck_assert_int_eq(served_as(&d, uid, gid), 1);
    ck_assert_int_eq(served_as(&d, uid, 1), 0);
    ck_assert_int_eq(dh_stop(&d), 0);
    char log[16384];
    FILE *lf = fopen(d.log, "r");
    ck_assert_ptr_nonnull(lf);
    size_t n = fread(log, 1, sizeof log - 1, lf);
    log[n] = '\0';
    fclose(lf);
    char want[64];
    snprintf(want, sizeof want, "uid %u gid %u", (unsigned)uid, (unsigned)gid);
    ck_assert_msg(strstr(log, want), "the peer's credentials were not logged ('%s')", want);
    dh_cleanup(&d, 0);
}
END_TEST

static int tcp_connect_local(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    ck_assert_int_ge(fd, 0);
    struct sockaddr_in a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_port = htons((uint16_t)port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ck_assert_msg(connect(fd, (struct sockaddr *)&a, sizeof a) == 0, "connect 127.0.0.1:%d: %s",
                  port, strerror(errno));
    return fd;
}

/* How many of fds[0..n) the peer has closed, polling them all together until `want` are closed or
 * deadline_ms (dh_now_ms) passes. closed[i] is set for each closed one. */
static int tcp_count_closed(const int *fds, int n, int *closed, int want, int64_t deadline_ms)
{
    int count = 0;
    for (int i = 0; i < n; i++)
        count += closed[i];
    while (count < want) {
        int64_t left = deadline_ms - dh_now_ms();
        if (left <= 0)
            break;
        struct pollfd pf[64];
        int idx[64], np = 0;
        for (int i = 0; i < n && np < 64; i++)
            if (!closed[i]) {
                pf[np] = (struct pollfd){fds[i], POLLIN, 0};
                idx[np++] = i;
            }
        if (poll(pf, (nfds_t)np, (int)(left < 200 ? left : 200)) <= 0)
            continue;
        for (int j = 0; j < np; j++) {
            if (!(pf[j].revents & (POLLIN | POLLHUP | POLLERR)))
                continue;
            char buf[4096];
            ssize_t r = read(pf[j].fd, buf, sizeof buf);
            if (r == 0 || (r < 0 && errno != EINTR && errno != EAGAIN)) {
                closed[idx[j]] = 1;
                count++;
            }
        }
    }
    return count;
}

/* Scrape connections of the metrics port are bounded: past the cap of 16 new ones are closed at
 * once, idle ones are closed after metrics_timeout_ms, and a real scrape is then served again.
 * No timing margin: "at once" means before the (long) timeout, and the wait for the timeout is
 * generous; a loaded machine only makes the test slower. */
START_TEST(test_metrics_scrapes_bounded)
{
    int probe = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ck_assert_int_eq(bind(probe, (struct sockaddr *)&a, sizeof a), 0);
    socklen_t al = sizeof a;
    ck_assert_int_eq(getsockname(probe, (struct sockaddr *)&a, &al), 0);
    int port = ntohs(a.sin_port);
    close(probe);
    char portarg[16];
    snprintf(portarg, sizeof portarg, "%d", port);
    enum { IDLE = 40, CAP = 16, TIMEOUT_MS = 10000 };
    char timeoutarg[16];
    snprintf(timeoutarg, sizeof timeoutarg, "%d", TIMEOUT_MS);
    dh_daemon d;
    dh_dir_init(&d);
    dh_start(&d, "--metrics-port", portarg, "--metrics-timeout-ms", timeoutarg, (const char *)NULL);

    int fds[IDLE], closed[IDLE];
    int64_t t0 = dh_now_ms();
    for (int i = 0; i < IDLE; i++) {
        fds[i] = tcp_connect_local(port);
        closed[i] = 0;
    }
    /* Those over the cap are closed as soon as accepted: well before half the timeout. */
    int early = tcp_count_closed(fds, IDLE, closed, IDLE - CAP, t0 + TIMEOUT_MS / 2);
    ck_assert_msg(early >= IDLE - CAP, "only %d of %d idle scrapes closed before half the %d ms "
                  "timeout (cap %d)", early, IDLE, TIMEOUT_MS, CAP);
    /* The ones held are closed by the timeout. */
    int all = tcp_count_closed(fds, IDLE, closed, IDLE, dh_now_ms() + 3 * TIMEOUT_MS);
    ck_assert_msg(all == IDLE, "%d idle scrapes still open after %lld ms", IDLE - all,
                  (long long)(dh_now_ms() - t0));
    for (int i = 0; i < IDLE; i++)
        close(fds[i]);
    int fd = tcp_connect_local(port);
    const char req[] = "GET /metrics HTTP/1.0\r\n\r\n";
    ck_assert_int_eq(dh_write_all(fd, req, sizeof req - 1), 0);
    char buf[65536];
    size_t n = 0;
    int64_t deadline = dh_now_ms() + 10000;
    while (n + 1 < sizeof buf && dh_now_ms() < deadline) {
        struct pollfd pf = {fd, POLLIN, 0};
        if (poll(&pf, 1, 100) <= 0)
            continue;
        ssize_t r = read(fd, buf + n, sizeof buf - 1 - n);
        if (r <= 0)
            break;
        n += (size_t)r;
    }
    buf[n] = '\0';
    close(fd);
    ck_assert_msg(strstr(buf, "200 OK") && strstr(buf, "attnstat_pushes_total"), "scrape: %.200s",
                  buf);
    int code = dh_stop(&d);
    dh_cleanup(&d, code != 0);
    ck_assert_int_eq(code, 0);
}
END_TEST

static Suite *config_suite(void)
{
    Suite *s = suite_create("daemon_config");
    TCase *tc = tcase_create("config");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_config_file_and_errors);
    tcase_add_test(tc, test_allow_group);
    tcase_add_test(tc, test_metrics_scrapes_bounded);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return dh_run(config_suite());
}
