/* test_cli_top.c — attnstat top, against databases this test writes through the store with fresh
 * random statistics and against a real attnstatd:
 *   - from the database with --once / -n: plain frames (no escape code), each starting with its
 *     time; the heads most at risk with their value and their change since the run's previous
 *     step, computed here; the run's alerts; every line within $COLUMNS, heads grouped to fit;
 *   - live from attnstatd: the results of its run only (another run's layers never drawn), the
 *     values the daemon stored, its alerts as they are raised; SIGINT ends it with exit 0;
 *   - on a terminal (a pseudo-terminal of known size): drawn in place on the alternate screen,
 *     every frame within the terminal's rows and columns (layers grouped to fit), q and Ctrl-C
 *     each end it with exit 0 and give the screen and the cursor back.
 * Fresh random data each run; the seed is printed (ATTNSTAT_TEST_SEED repeats a run). */
#include "daemon_harness.h"
#include "stats_testutil.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/wait.h>
#include <termios.h>
#include <unistd.h>

#include "attnstat.h"
#include "cli_harness.h"
#include "view_testutil.h"

/* ---- top ------------------------------------------------------------------------------------*/
/* "L3.H6       0.012    -0.004" as top prints a head most at risk (change: "-" without base). */
static void worst_text(char *buf, size_t len, int layer, int head, double x, double base, int en)
{
    char h[32], c[32];
    int prec = en ? 3 : 2;
    snprintf(h, sizeof h, "L%d.H%d", layer, head);
    if (isnan(base))
        snprintf(c, sizeof c, "-");
    else if (fabs(x - base) < 0.5 * pow(10, -prec))
        snprintf(c, sizeof c, "%.*f", prec, 0.0);
    else
        snprintf(c, sizeof c, "%+.*f", prec, x - base);
    snprintf(buf, len, "%-11s %9.*f %9s", h, prec, x, c);
}

/* The widest line of s, in columns (a UTF-8 sequence counts one). */
static int widest(const char *s)
{
    int w = 0, cols = 0;
    for (; *s; s++) {
        if (*s == '\n') {
            cols = 0;
            continue;
        }
        cols += ((unsigned char)*s & 0xC0) != 0x80;
        w = cols > w ? cols : w;
    }
    return w;
}

START_TEST(test_top_database)
{
    dh_rng r = dh_rng_new("top_database");
    dh_daemon d;
    dh_dir_init(&d);
    enum { S = 12 };
    stats_head *v = malloc(sizeof(stats_head) * S * L * H);
    ck_assert_ptr_nonnull(v);
    int64_t id = write_run(d.db, "topdb", 0, S, H, T0, MIN_MS, v, &r);
    store_error err;
    store *st = store_open(d.db, 0, &err);
    ck_assert_ptr_nonnull(st);
    store_alert al = {.run_id = id, .layer = 2, .head = 1, .step = S - 1,
                      .rule = "entropy_floor", .state = STORE_ALERT_RAISED, .value = 0.05,
                      .threshold = 0.1, .time_ms = T0 + (S - 1) * MIN_MS};
    ck_assert_int_eq(store_add_alert(st, &al, &err), STORE_OK);
    ck_assert_int_eq(store_commit(st, &err), STORE_OK);
    store_close(st);
    cli_result res = cli_run(d.dir, "--db", d.db, "top", "--run", "topdb", "--once");
    CLI_OK(res);
    ck_assert_ptr_null(strchr(res.out, '\x1b'));
    ck_assert_int_eq(cli_count_text(res.out, "attnstat top  run topdb  step 11  from the "
                                              "database"), 1);
    ck_assert_int_le(widest(res.out), 100);
    /* the heads most at risk at step 11, with their change since step 10 */
    size_t last = (size_t)(S - 1) * L * H, prev = (size_t)(S - 2) * L * H;
    for (int en = 0; en <= 1; en++) {
        size_t best = 0;
        for (size_t i = 1; i < (size_t)(L * H); i++)
            if (en ? v[last + i].entropy_norm_mean < v[last + best].entropy_norm_mean
                   : v[last + i].max_logit > v[last + best].max_logit)
                best = i;
        char want[96];
        worst_text(want, sizeof want, (int)(best / H), (int)(best % H),
                   en ? v[last + best].entropy_norm_mean : v[last + best].max_logit,
                   en ? v[prev + best].entropy_norm_mean : v[prev + best].max_logit, en);
        ck_assert_msg(strstr(res.out, want), "no '%s' in:\n%s", want, res.out);
    }
    ck_assert_ptr_nonnull(strstr(res.out, "(change: since step 10)"));
    ck_assert_msg(strstr(res.out, "raised   entropy_floor L2.H1  step 11  0.05 (threshold 0.1)"),
                  "%s", res.out);
    cli_result_free(&res);

    /* -n 2: two frames; a narrow terminal: every line within it, heads grouped */
    write_run(d.db, "wide", 0, 3, 40, T0, MIN_MS, NULL, &r);
    setenv("COLUMNS", "50", 1);
    res = cli_run(d.dir, "--db", d.db, "top", "--run", "wide", "-n", "2", "--interval", "0.1");
    unsetenv("COLUMNS");
    CLI_OK(res);
    ck_assert_int_eq(cli_count_text(res.out, "attnstat top  run wide"), 2);
    ck_assert_int_le(widest(res.out), 50);
    ck_assert_msg(strstr(res.out, "a cell: 1 layer x 2 heads"), "%s", res.out);
    cli_result_free(&res);
    free(v);
    dh_cleanup(&d, 0);
}
END_TEST

START_TEST(test_top_live)
{
    tu_rng rng = {tu_seed()};
    dh_daemon d;
    dh_dir_init(&d);
    dh_start(&d, (const char *)NULL);
    char out[400], errp[400];
    snprintf(out, sizeof out, "%s/top.out", d.dir);
    snprintf(errp, sizeof errp, "%s/top.err", d.dir);
    pid_t top = cli_spawn(out, errp, "--socket", d.sock, "top", "--run", "live", "--interval",
                          "0.2");
    cli_wait_text(out, "no sample of run live yet", 1, top, 30000);
    /* another run's results are not the view's */
    attnstat_client *other = cli_trainer(d.sock, "other", 0, NULL, 0, 0);
    cli_push_steps(other, &rng, 0, 3, 5, 1.0);
    attnstat_thresholds th;
    attnstat_thresholds_init(&th);
    th.logit_ceiling = 1.0;
    th.raise_after = 1;
    attnstat_client *c = cli_trainer(d.sock, "live", 0, &th, 0, 0);
    cli_push_steps(c, &rng, 0, 4, 2, 8.0);
    cli_wait_text(out, "run live  step 3  live from attnstatd", 1, top, 30000);
    cli_wait_text(out, "raised   logit_ceiling", 1, top, 30000);
    /* two frames more: every result of step 3 has been drawn */
    char *text = cli_slurp(out);
    int frames = cli_count_text(text, "attnstat top  run live");
    free(text);
    cli_wait_text(out, "attnstat top  run live", frames + 2, top, 30000);
    ck_assert_int_eq(kill(top, SIGINT), 0);
    int status;
    ck_assert_int_eq(waitpid(top, &status, 0), top);
    ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0, "top: status %d", status);
    text = cli_slurp(out);
    const char *frame = text, *p;
    while ((p = strstr(frame + 1, "attnstat top  run live")))
        frame = p;
    ck_assert_ptr_nonnull(strstr(frame, "layer 1 "));
    ck_assert_ptr_null(strstr(frame, "layer 2 ")); /* "other" has 5 layers */
    ck_assert_ptr_null(strchr(text, '\x1b'));
    /* the values are the daemon's: the lowest entropy and highest logit of step 3 */
    cli_result res = cli_run(d.dir, "--db", d.db, "heads", "--run", "live", "--format", "json");
    CLI_OK(res);
    char *copy, *lines[16];
    int n = json_lines(res.out, &copy, lines, 16);
    ck_assert_int_eq(n, 2 * 4);
    int lo = 0, hi = 0;
    for (int i = 1; i < n; i++) {
        double en = cli_json_num(lines[i], "entropy_norm_mean");
        if (en < cli_json_num(lines[lo], "entropy_norm_mean"))
            lo = i;
        if (cli_json_num(lines[i], "max_logit") > cli_json_num(lines[hi], "max_logit"))
            hi = i;
    }
    char want[64];
    snprintf(want, sizeof want, "L%d.H%d", (int)cli_json_num(lines[lo], "layer"),
             (int)cli_json_num(lines[lo], "head"));
    const char *row = strstr(frame, "lowest entropy_norm");
    ck_assert_ptr_nonnull(row);
    row = strchr(row, '\n') + 1;
    ck_assert_msg(!strncmp(row, want, strlen(want)), "want %s first in:\n%s", want, frame);
    snprintf(want, sizeof want, "%.3f", cli_json_num(lines[lo], "entropy_norm_mean"));
    ck_assert_msg(strstr(row, want) && strstr(row, want) < strchr(row, '\n'), "%s", frame);
    char head[32];
    snprintf(head, sizeof head, "L%d.H%d", (int)cli_json_num(lines[hi], "layer"),
             (int)cli_json_num(lines[hi], "head"));
    snprintf(want, sizeof want, "%-11s %9.2f", head, cli_json_num(lines[hi], "max_logit"));
    ck_assert_msg(strstr(row, want) && strstr(row, want) < strchr(row, '\n'), "want %s:\n%s",
                  want, frame);
    free(copy);
    cli_result_free(&res);
    free(text);
    attnstat_close(c);
    attnstat_close(other);
    dh_cleanup(&d, 0);
}
END_TEST

/* ---- top on a terminal ------------------------------------------------------------------------*/
/* attnstat with args on a new pseudo-terminal of rows x cols (its stdin, stdout and stderr);
 * *master: the terminal's other end. */
static pid_t pty_spawn(int *master, int rows, int cols, const char *const *args)
{
    int m = posix_openpt(O_RDWR | O_NOCTTY);
    ck_assert_int_ge(m, 0);
    ck_assert_int_eq(grantpt(m), 0);
    ck_assert_int_eq(unlockpt(m), 0);
    char slave[128];
    ck_assert_ptr_nonnull(ptsname(m));
    snprintf(slave, sizeof slave, "%s", ptsname(m));
    const char *argv[32] = {cli_binary()};
    for (int i = 0; args[i] && i < 30; i++)
        argv[i + 1] = args[i];
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        struct winsize ws = {.ws_row = (unsigned short)rows, .ws_col = (unsigned short)cols};
        setsid();
        int s = open(slave, O_RDWR);
        if (s < 0 || ioctl(s, TIOCSCTTY, 0) != 0 || ioctl(s, TIOCSWINSZ, &ws) != 0)
            _exit(126);
        dup2(s, 0);
        dup2(s, 1);
        dup2(s, 2);
        close(m);
        alarm(120);
        execv(argv[0], (char *const *)argv);
        _exit(127);
    }
    *master = m;
    return pid;
}

/* Reads the terminal into *buf until it holds needle n times (needle NULL: until it closes);
 * fails after 30 s. */
static void pty_read(int m, char **buf, size_t *len, const char *needle, int n)
{
    int64_t end = dh_now_ms() + 30000;
    for (;;) {
        if (needle && cli_count_text(*buf, needle) >= n)
            return;
        int64_t left = end - dh_now_ms();
        ck_assert_msg(left > 0, "the terminal did not show '%s' %d times:\n%s",
                      needle ? needle : "(its end)", n, *buf);
        struct pollfd p = {.fd = m, .events = POLLIN};
        if (poll(&p, 1, (int)left) <= 0)
            continue;
        char chunk[4096];
        ssize_t k = read(m, chunk, sizeof chunk);
        if (k <= 0) { /* EIO: every end of the terminal closed */
            ck_assert_msg(!needle, "the terminal closed before '%s':\n%s", needle, *buf);
            return;
        }
        char *nb = realloc(*buf, *len + (size_t)k + 1);
        ck_assert_ptr_nonnull(nb);
        memcpy(nb + *len, chunk, (size_t)k);
        *len += (size_t)k;
        nb[*len] = '\0';
        *buf = nb;
    }
}

/* The frames drawn in place: each after a clear screen; every one within rows x cols (escape
 * sequences and carriage returns aside). Returns how many. */
static int pty_frames(const char *out, int rows, int cols)
{
    int frames = 0;
    for (const char *f = strstr(out, "\x1b[H\x1b[2J"); f; frames++) {
        f += 7;
        const char *next = strstr(f, "\x1b[H\x1b[2J");
        const char *stop = next ? next : f + strlen(f);
        int lines = 0, w = 0;
        for (const char *p = f; p < stop; p++) {
            if (*p == '\x1b' && p[1] == '[') {
                p += 2;
                while (p < stop && (*p < 0x40 || *p > 0x7e))
                    p++;
                continue;
            }
            if (*p == '\r')
                continue;
            if (*p == '\n') {
                lines++;
                w = 0;
                continue;
            }
            w += ((unsigned char)*p & 0xC0) != 0x80;
            ck_assert_msg(w <= cols, "a line wider than %d:\n%s", cols, f);
        }
        ck_assert_msg(lines <= rows, "%d lines on %d rows:\n%.*s", lines, rows, (int)(stop - f),
                      f);
        f = next;
    }
    return frames;
}

START_TEST(test_top_terminal)
{
    dh_rng r = dh_rng_new("top_terminal");
    dh_daemon d;
    dh_dir_init(&d);
    write_run_l(d.db, "tty", 0, 3, 40, 24, T0, MIN_MS, NULL, &r);
    const char *args[] = {"--db", d.db, "top", "--run", "tty", "--interval", "0.2", NULL};
    for (int how = 0; how < 2; how++) { /* q, then Ctrl-C */
        int m;
        pid_t pid = pty_spawn(&m, 30, 64, args);
        char *out = calloc(1, 1);
        size_t len = 0;
        pty_read(m, &out, &len, "attnstat top  run tty", 2);
        if (how == 0)
            ck_assert_int_eq(write(m, "q", 1), 1);
        else
            ck_assert_int_eq(kill(pid, SIGINT), 0);
        int status;
        ck_assert_int_eq(waitpid(pid, &status, 0), pid);
        ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0, "status %d:\n%s", status,
                      out);
        pty_read(m, &out, &len, NULL, 0);
        close(m);
        /* the alternate screen taken and given back, the cursor shown again */
        ck_assert_msg(!strncmp(out, "\x1b[?1049h", 8), "%s", out);
        ck_assert_ptr_nonnull(strstr(out, "\x1b[?25h\x1b[?1049l"));
        ck_assert_int_ge(pty_frames(out, 30, 64), 2);
        /* 40 layers x 24 heads in 30 rows x 64 columns: cells of several */
        ck_assert_ptr_nonnull(strstr(out, "(a cell: "));
        free(out);
    }
    dh_cleanup(&d, 0);
}
END_TEST

int main(void)
{
    const TTest *tests[] = {test_top_database, test_top_live, test_top_terminal};
    return cli_run_tests("cli_top", tests, (int)(sizeof tests / sizeof tests[0]));
}
