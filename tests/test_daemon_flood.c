/* test_daemon_flood.c — one run's flood of alert transitions against a real attnstatd (issue 23,
 * R2): a run raises hundreds of alerts at once while every --alert-exec command is busy; another
 * run (another uid's when the suite runs as root) then raises 2 alerts, and both reach the command
 * (its transitions take a place in the full queue from the flood's, and are started first); the
 * flood's rows stay within alert_burst (its raises) and the ends of those raises, the rest
 * suppressed, logged as such and summarised with their exact count, on /metrics too.
 * The commands wait for a file the test creates: nothing depends on how fast the machine is.
 * Fresh random values each run (the seed is printed). */
#include "daemon_harness.h"

#include <arpa/inet.h>
#include <grp.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cli_harness.h"

static const uid_t NOBODY = 65534;

/* A Computed of n heads of layer 0 at step; heads in bad[] have a max logit over 50 (the run's
 * ceiling), the others under it. hs and ptrs are the caller's arrays of n. */
static void computed(Attnstat__Computed *m, Attnstat__HeadStats *hs, Attnstat__HeadStats **ptrs,
                     size_t n, uint64_t seq, int64_t step, int bad_all, dh_rng *rng)
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
        o->entropy_mean = 1.5 + 0.5 * (double)(dh_next(rng) % 100) / 100.0;
        o->entropy_std = 0.1;
        o->entropy_min = o->entropy_mean * 0.5;
        o->entropy_max = o->entropy_mean * 1.5;
        o->has_entropy_norm_mean = 1;
        o->entropy_norm_mean = 0.5;
        o->has_collapsed_frac = 1;
        o->collapsed_frac = 0;
        o->has_max_logit = 1;
        o->max_logit = bad_all ? 60.0 + (double)(dh_next(rng) % 1000) / 10.0 : 3.0;
        ptrs[h] = o;
    }
    m->n_heads = n;
    m->heads = ptrs;
}

/* Hello for run (logit ceiling 50, raise after 1 sample) and a Computed of n bad heads; waits for
 * its Ack (OK asserted). */
static void raise_heads(dh_conn *c, const char *run, size_t n, dh_rng *rng)
{
    Attnstat__Thresholds th = ATTNSTAT__THRESHOLDS__INIT;
    th.has_logit_ceiling = 1;
    th.logit_ceiling = 50.0;
    th.has_raise_after = 1;
    th.raise_after = 1;
    dh_hello_th(c, run, 0, &th, NULL);
    Attnstat__HeadStats *hs = calloc(n, sizeof *hs);
    Attnstat__HeadStats **ptrs = calloc(n, sizeof *ptrs);
    ck_assert(hs && ptrs);
    Attnstat__Computed m;
    computed(&m, hs, ptrs, n, 1, 1, 1, rng);
    Attnstat__Envelope env = ATTNSTAT__ENVELOPE__INIT;
    env.msg_case = ATTNSTAT__ENVELOPE__MSG_COMPUTED;
    env.computed = &m;
    ck_assert_int_eq(dh_send(c, &env), 0);
    Attnstat__Envelope *a = dh_expect(c, ATTNSTAT__ENVELOPE__MSG_ACK, 30000);
    ck_assert_msg(a && a->ack->code == ATTNSTAT__CODE__OK, "Computed of run '%s' not stored",
                  run);
    attnstat__envelope__free_unpacked(a, NULL);
    free(hs);
    free(ptrs);
}

/* Times needle appears in the file at path (0 when it cannot be read). */
static int file_count(const char *path, const char *needle)
{
    char *s = cli_slurp(path);
    int n = s ? cli_count_text(s, needle) : 0;
    free(s);
    return n;
}

/* Waits (a condition, up to timeout_ms) until needle appears want times in the file. */
static int wait_count(const char *path, const char *needle, int want, int timeout_ms)
{
    int64_t end = dh_now_ms() + timeout_ms;
    int n;
    while ((n = file_count(path, needle)) < want && dh_now_ms() < end)
        dh_sleep_ms(20);
    return n;
}

/* The sum of N over the log's lines "run 'RUN' (id ...): N alert transition(s) suppressed". */
static uint64_t suppressed_in_log(const char *log_path, const char *run)
{
    char *s = cli_slurp(log_path);
    char head[128];
    snprintf(head, sizeof head, "run '%s' (id ", run);
    uint64_t sum = 0;
    for (const char *p = s; p && (p = strstr(p, head)); p++) {
        const char *q = strstr(p, "): ");
        unsigned long long n;
        if (q && sscanf(q, "): %llu alert transition", &n) == 1)
            sum += n;
    }
    free(s);
    return sum;
}

/* GET /metrics on 127.0.0.1:port; the body (malloc'd). */
static char *scrape(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    ck_assert_int_eq(connect(fd, (struct sockaddr *)&a, sizeof a), 0);
    const char *req = "GET /metrics HTTP/1.0\r\nHost: x\r\n\r\n";
    ck_assert_int_eq(dh_write_all(fd, req, strlen(req)), 0);
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    ssize_t r;
    while (buf && (r = read(fd, buf + n, cap - n - 1)) > 0) {
        n += (size_t)r;
        if (n + 1 == cap) {
            char *nb = realloc(buf, cap *= 2);
            if (!nb)
                break;
            buf = nb;
        }
    }
    close(fd);
    ck_assert_ptr_nonnull(buf);
    buf[n] = '\0';
    return buf;
}

START_TEST(test_flood_leaves_other_runs_alerts)
{
    dh_rng rng = dh_rng_new("flood");
    const int burst = 100 + (int)(dh_next(&rng) % 100), queue = 32 + (int)(dh_next(&rng) % 32);
    const int flood = burst + 150 + (int)(dh_next(&rng) % 200);
    int other_uid = getuid() == 0 && getgrgid(NOBODY) != NULL;
    dh_daemon d;
    dh_dir_init(&d);
    char out[200], release[200], cmd[700], qs[16], bs[16], ps[16], gname[64] = "";
    snprintf(out, sizeof out, "%s/exec.out", d.dir);
    snprintf(release, sizeof release, "%s/release", d.dir);
    snprintf(cmd, sizeof cmd, "while [ ! -e %s ]; do sleep 0.05; done; "
             "echo \"$ATTNSTAT_RUN $ATTNSTAT_STATE $ATTNSTAT_HEAD\" >> %s", release, out);
    snprintf(qs, sizeof qs, "%d", queue);
    snprintf(bs, sizeof bs, "%d", burst);
    int port = dh_free_port();
    snprintf(ps, sizeof ps, "%d", port);
    if (other_uid) {
        snprintf(gname, sizeof gname, "%s", getgrgid(NOBODY)->gr_name);
        ck_assert_int_eq(chmod(d.dir, 0755), 0);
    }
    const char *args[] = {"--alert-exec", cmd, "--alert-exec-queue", qs, "--alert-burst", bs,
                          "--alert-rate", "0.001", "--metrics-port", ps,
                          other_uid ? "--allow-group" : NULL, gname, NULL};
    dh_start_v(&d, args);
    if (other_uid)
        ck_assert_int_eq(chmod(d.sock, 0666), 0);

    /* the flood: every head over the ceiling at once; 16 commands start and wait, the queue
     * fills, the rest of the burst is dropped, what is past the burst suppressed */
    dh_conn f;
    dh_connect(&f, &d);
    raise_heads(&f, "flood", (size_t)flood, &rng);
    ck_assert_msg(wait_count(d.log, "alert_exec_queue (", 1, 60000) >= 1,
                  "the full alert_exec queue was not said");
    ck_assert_int_eq(file_count(d.log, "its alerts raise faster than alert_rate"), 1);

    /* another run (another uid's, as root) raises 2 alerts while the queue is full */
    pid_t child = fork();
    ck_assert_int_ge(child, 0);
    if (child == 0) {
        if (other_uid && (setgid(NOBODY) != 0 || setuid(NOBODY) != 0))
            _exit(2);
        dh_conn o;
        dh_connect(&o, &d);
        raise_heads(&o, "other", 2, &rng);
        dh_close(&o);
        _exit(0);
    }
    int st;
    ck_assert_int_eq(waitpid(child, &st, 0), child);
    ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0, "the other run's process failed");

    /* every command waits: the queue is full, the other run's 2 among the flood's */
    char *m = scrape(port);
    char want[200];
    snprintf(want, sizeof want, "\nattnstat_alert_exec_queued %d\n", queue);
    ck_assert_msg(strstr(m, want), "no '%s' in /metrics", want + 1);
    free(m);

    /* the commands go on: the other run's alerts are run, the flood's queued ones too */
    FILE *rf = fopen(release, "w");
    ck_assert_ptr_nonnull(rf);
    fclose(rf);
    int got = wait_count(out, "other raised ", 2, 60000);
    ck_assert_msg(got == 2, "the other run's 2 alerts reached alert_exec %d times", got);
    ck_assert_int_eq(file_count(out, "other raised 0\n"), 1);
    ck_assert_int_eq(file_count(out, "other raised 1\n"), 1);
    /* the flood's: the 16 running and what the queue kept, never more */
    int flood_lines = wait_count(out, "flood raised ", 16 + queue - 2, 60000);
    ck_assert_int_eq(flood_lines, 16 + queue - 2);

    /* the counts on /metrics: drops and suppressed transitions, the flood's own */
    m = scrape(port);
    snprintf(want, sizeof want, "\nattnstat_alert_exec_dropped_total %d\n", burst - 16 - queue + 2);
    ck_assert_msg(strstr(m, want), "no '%s' in /metrics", want + 1);
    snprintf(want, sizeof want, "\nattnstat_alert_transitions_suppressed_total %d\n",
             flood - burst);
    ck_assert_msg(strstr(m, want), "no '%s' in /metrics", want + 1);
    ck_assert_ptr_nonnull(strstr(m, "\nattnstat_run_alert_transitions_suppressed{run=\"flood\""));
    ck_assert_ptr_nonnull(strstr(m, "\nattnstat_alert_exec_queued 0\n")); /* all run */
    free(m);

    /* the flood ends: its resolutions follow its raises (those suppressed are suppressed) and
     * the log sums up every suppressed transition */
    Attnstat__Goodbye gb;
    Attnstat__Envelope env;
    ck_assert_int_eq(dh_send(&f, envelope_goodbye(&env, &gb)), 0);
    dh_close(&f);
    int64_t end = dh_now_ms() + 60000;
    while (suppressed_in_log(d.log, "flood") < (uint64_t)(2 * (flood - burst)) &&
           dh_now_ms() < end)
        dh_sleep_ms(20);
    ck_assert_uint_eq(suppressed_in_log(d.log, "flood"), (uint64_t)(2 * (flood - burst)));
    ck_assert_int_eq(dh_stop(&d), 0);
    sqlite3 *db = dh_db_open(&d);
    int64_t raised = dh_db_int(db, "SELECT count(*) FROM alerts a JOIN runs r ON r.id = a.run_id "
                                   "WHERE r.name = 'flood' AND a.state = 'raised'");
    int64_t ended = dh_db_int(db, "SELECT count(*) FROM alerts a JOIN runs r ON r.id = a.run_id "
                                  "WHERE r.name = 'flood' AND a.state != 'raised'");
    int64_t other = dh_db_int(db, "SELECT count(*) FROM alerts a JOIN runs r ON r.id = a.run_id "
                                  "WHERE r.name = 'other' AND a.state = 'raised'");
    sqlite3_close(db);
    dh_cleanup(&d, 0);
    ck_assert_int_eq(raised, burst);
    ck_assert_int_eq(ended, burst);
    ck_assert_int_eq(other, 2);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("daemon_flood");
    TCase *tc = tcase_create("flood");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, test_flood_leaves_other_runs_alerts);
    suite_add_tcase(s, tc);
    return dh_run(s);
}
