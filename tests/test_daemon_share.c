/* test_daemon_share.c — what one peer, or one mistake, could take from everyone else (issue 23),
 * with a real attnstatd: each test is a defect once seen, and fails on the code that had it.
 *  - R1: one daemon per database FILE: a hard link or a symbolic link to a database in use does
 *    not start a second daemon (two WALs on one file lost acknowledged samples);
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

/* ---- the suite ------------------------------------------------------------------------------ */

static Suite *share_suite(void)
{
    Suite *s = suite_create("daemon_share");
    TCase *lock = tcase_create("lock");
    tcase_set_timeout(lock, 300);
    tcase_add_test(lock, test_second_name_of_database_refused);
    suite_add_tcase(s, lock);
    return s;
}

int main(void)
{
    return dh_run(share_suite());
}
