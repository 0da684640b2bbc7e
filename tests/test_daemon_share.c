/* test_daemon_share.c — what one peer, or one mistake, could take from everyone else (issue 23),
 * with a real attnstatd: each test is a defect once seen, and fails on the code that had it.
 *  - R1: one daemon per database FILE: a hard link or a symbolic link to a database in use does
 *    not start a second daemon (two WALs on one file lost acknowledged samples);
 *  - R8: SIGHUP reads the config file off the event loop: a FIFO in its place is refused with the
 *    reason, a file too big too, and the daemon serves throughout;
 * Waits are for conditions, with generous deadlines: nothing here depends on a timing margin. */
#include "daemon_harness.h"

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
