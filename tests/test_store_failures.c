/* test_store_failures.c — Check suite for the store's failure paths (schema/): errors a person can
 * act on (missing directory, garbage, a damaged file), bad arguments that leave the batch intact,
 * crash safety under kill -9, and allocation failure injected into SQLite (and the store's own
 * memory) for open, a write batch, reads and the retention step.
 *
 * Random data comes from a seed printed at start (ATTNSTAT_TEST_SEED=<n> replays a run). Every test
 * works in its own temporary directory.
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include "store_retain.h"
#include "store_testutil.h"
/* ---- errors ------------------------------------------------------------------------------------ */

START_TEST(test_error_paths)
{
    store_error err = {0};
    char path[400];
    /* a directory that does not exist */
    snprintf(path, sizeof path, "%s/no/such/dir/x.db", tmpdir);
    ck_assert_ptr_null(store_open(path, 0, &err));
    ck_assert_msg(strstr(err.msg, path) && strstr(err.msg, "unable to open") && err.code != 0,
                  "message: %s", err.msg);
    fprintf(stderr, "  missing dir: %s\n", err.msg);
    /* a path under a regular file */
    snprintf(path, sizeof path, "%s/plain", tmpdir);
    FILE *f = fopen(path, "w");
    ck_assert_ptr_nonnull(f);
    fclose(f);
    snprintf(path, sizeof path, "%s/plain/x.db", tmpdir);
    ck_assert_ptr_null(store_open(path, 0, &err));
    ck_assert_msg(strstr(err.msg, path), "message: %s", err.msg);
    /* a missing file cannot be read */
    snprintf(path, sizeof path, "%s/missing.db", tmpdir);
    ck_assert_ptr_null(store_open_readonly(path, 0, &err));
    ck_assert_msg(strstr(err.msg, path) && strstr(err.msg, "reading"), "message: %s", err.msg);
    ck_assert_int_ne(access(path, F_OK), 0); /* and was not created */
    /* no path, NULL err */
    ck_assert_ptr_null(store_open(NULL, 0, NULL));
    ck_assert_ptr_null(store_open("", 0, &err));

    /* a file of garbage */
    snprintf(path, sizeof path, "%s/garbage.db", tmpdir);
    f = fopen(path, "wb");
    ck_assert_ptr_nonnull(f);
    for (int i = 0; i < 8192; i++)
        fputc((int)(rnd() & 0xff), f);
    fclose(f);
    memset(&err, 0, sizeof err);
    ck_assert_ptr_null(store_open(path, 0, &err));
    ck_assert_msg(strstr(err.msg, "not a database") && strstr(err.msg, path) && err.code != 0,
                  "message: %s", err.msg);
    fprintf(stderr, "  garbage: %s\n", err.msg);
    ck_assert_ptr_null(store_open_readonly(path, 0, &err));
    ck_assert_msg(strstr(err.msg, "not a database"), "message: %s", err.msg);

    /* a real database with damaged pages: open or the first read fails, or the check does */
    store *st = open_ok(dbpath);
    int64_t run = begin_run(st, "c", 0);
    for (int s = 0; s < 200; s++) {
        stats_head hs[16];
        for (int h = 0; h < 16; h++)
            hs[h] = rand_head(0);
        ck_assert_int_eq(store_add_samples(st, run, s, 0, hs, 16, 0, &err), STORE_OK);
    }
    ck_assert_int_eq(store_commit(st, &err), STORE_OK);
    store_close(st); /* checkpoints the WAL into the file */
    struct stat sb;
    ck_assert_int_eq(stat(dbpath, &sb), 0);
    ck_assert_int_gt(sb.st_size, 4 * 4096);
    int fd = open(dbpath, O_WRONLY);
    ck_assert_int_ge(fd, 0);
    unsigned char junk[4096];
    for (size_t i = 0; i < sizeof junk; i++)
        junk[i] = (unsigned char)rnd();
    for (off_t page = 2; page * 4096 < sb.st_size; page += 2)
        ck_assert_int_eq(pwrite(fd, junk, sizeof junk, page * 4096), (ssize_t)sizeof junk);
    close(fd);
    memset(&err, 0, sizeof err);
    st = store_open(dbpath, 0, &err);
    int failed = st == NULL;
    if (st) {
        samples_vec v = {0};
        store_status rs = store_grid(st, run, STORE_STEP_LATEST, NULL, collect_sample, &v, &err);
        free(v.v);
        if (rs == STORE_OK)
            rs = store_integrity_check(st, &err);
        failed = rs != STORE_OK;
        store_close(st);
    }
    ck_assert_msg(failed, "a damaged database went unnoticed");
    ck_assert_msg(strstr(err.msg, "malformed") || strstr(err.msg, "integrity") ||
                      strstr(err.msg, "corrupt") || strstr(err.msg, "not a database"),
                  "message: %s", err.msg);
    fprintf(stderr, "  damaged: %s\n", err.msg);
}
END_TEST

START_TEST(test_bad_arguments)
{
    store *st = open_ok(dbpath);
    int64_t run = begin_run(st, "args", 0);
    store_error err = {0};
    stats_head h[2] = {rand_head(0), rand_head(0)};
    ck_assert_int_eq(store_add_samples(st, run, 1, 0, h, 2, 0, &err), STORE_OK);
    ck_assert_int_eq(store_add_samples(st, run, 1, -1, h, 2, 0, &err), STORE_EINVAL);
    ck_assert_int_eq(store_add_samples(st, run, 1, 0, h, 0, 0, &err), STORE_EINVAL);
    ck_assert_int_eq(store_add_samples(st, run, 1, 0, NULL, 2, 0, &err), STORE_EINVAL);
    ck_assert_int_eq(store_add_samples(st, run + 1, 1, 0, h, 2, 0, &err), STORE_NOTFOUND);
    store_run_info info = {.name = "", .rank = 0};
    int64_t id;
    ck_assert_int_eq(store_run_begin(st, &info, &id, &err), STORE_EINVAL);
    info.name = "x";
    info.rank = -2;
    ck_assert_int_eq(store_run_begin(st, &info, &id, &err), STORE_EINVAL);
    /* none of that touched the batch */
    ck_assert_int_eq(store_pending(st), 2);
    ck_assert_int_eq(store_commit(st, &err), STORE_OK);
    int64_t n = 0;
    ck_assert_int_eq(store_count_samples(st, run, &n, &err), STORE_OK);
    ck_assert_int_eq(n, 2);
    ck_assert_int_eq(store_count_samples(st, run + 5, &n, &err), STORE_NOTFOUND);
    store_close(st);
}
END_TEST

/* ---- kill -9 ---------------------------------------------------------------------------------- */

enum { KILL_LAYERS = 6, KILL_HEADS = 16 };

static double kill_value(int64_t batch, int layer, int head)
{
    return (double)batch + layer * 0.001 + head * 0.000001;
}

/* Child: write batches forever, reporting each committed batch number through the pipe. */
static void kill_child(int wfd, int64_t run, int64_t first)
{
    store_error err = {0};
    store *st = store_open(dbpath, 0, &err);
    if (!st)
        _exit(2);
    for (int64_t b = first;; b++) {
        int layers = 1 + (int)(b % KILL_LAYERS);
        for (int l = 0; l < layers; l++) {
            stats_head hs[KILL_HEADS];
            for (int h = 0; h < KILL_HEADS; h++) {
                hs[h] = rand_head(0);
                hs[h].entropy_mean = kill_value(b, l, h);
            }
            if (store_add_samples(st, run, b, l, hs, KILL_HEADS, 0, &err) != STORE_OK)
                _exit(3);
        }
        if (b % 3 == 0) {
            store_alert a = {.run_id = run, .layer = 0, .head = 0, .step = b,
                             .rule = "entropy_floor", .state = STORE_ALERT_RAISED};
            if (store_add_alert(st, &a, &err) != STORE_OK)
                _exit(4);
        }
        if (store_commit(st, &err) != STORE_OK)
            _exit(5);
        if (write(wfd, &b, sizeof b) != (ssize_t)sizeof b)
            _exit(6);
    }
}

START_TEST(test_kill9)
{
    store *st = open_ok(dbpath);
    int64_t run = begin_run(st, "crash", 0);
    store_error err = {0};
    stats_head hs[KILL_HEADS];
    for (int h = 0; h < KILL_HEADS; h++) {
        hs[h] = rand_head(0);
        hs[h].entropy_mean = kill_value(0, 0, h);
    }
    ck_assert_int_eq(store_add_samples(st, run, 0, 0, hs, KILL_HEADS, 0, &err), STORE_OK);
    ck_assert_int_eq(store_commit(st, &err), STORE_OK);
    store_close(st);

    static int64_t reported[1 << 16];
    int nrep = 0;
    reported[nrep++] = 0;
    int64_t next = 1;
    for (int round = 0; round < 6; round++) {
        int fds[2];
        ck_assert_int_eq(pipe(fds), 0);
        pid_t pid = fork();
        ck_assert_int_ge(pid, 0);
        if (pid == 0) {
            close(fds[0]);
            kill_child(fds[1], run, next);
        }
        close(fds[1]);
        /* wait for a random number of commits, then a random extra delay, then kill */
        int want = (int)rnd_range(1, 40), got = 0;
        int64_t b;
        while (got < want && read(fds[0], &b, sizeof b) == (ssize_t)sizeof b) {
            ck_assert_int_lt(nrep, 1 << 16);
            reported[nrep++] = b;
            got++;
        }
        ck_assert_msg(got == want, "child died early");
        struct timespec ts = {0, (long)rnd_range(0, 3000) * 1000};
        nanosleep(&ts, NULL);
        ck_assert_int_eq(kill(pid, SIGKILL), 0);
        int status = 0;
        ck_assert_int_eq(waitpid(pid, &status, 0), pid);
        ck_assert_msg(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL,
                      "child exited on its own (status %d)", status);
        /* every commit it reported before dying counts */
        while (read(fds[0], &b, sizeof b) == (ssize_t)sizeof b) {
            ck_assert_int_lt(nrep, 1 << 16);
            reported[nrep++] = b;
        }
        close(fds[0]);
        next = reported[nrep - 1] + 1;

        /* a post-mortem first: the read-only handle of the CLI, on the WAL the crash left, then
         * the writer's reopen, which recovers it */
        for (int pass = 0; pass < 2; pass++) {
            st = pass == 0 ? store_open_readonly(dbpath, 0, &err) : store_open(dbpath, 0, &err);
            ck_assert_msg(st != NULL, "reopen after kill (pass %d): %s", pass, err.msg);
            ck_assert_msg(store_integrity_check(st, &err) == STORE_OK, "%s", err.msg);
            for (int i = 0; i < nrep; i++) {
                int64_t bb = reported[i];
                samples_vec v = {0};
                ck_assert_int_eq(store_grid(st, run, bb, NULL, collect_sample, &v, &err),
                                 STORE_OK);
                int layers = bb == 0 ? 1 : 1 + (int)(bb % KILL_LAYERS);
                ck_assert_msg(v.n == layers * KILL_HEADS, "batch %" PRId64 ": %d of %d samples",
                              bb, v.n, layers * KILL_HEADS);
                for (int k = 0; k < v.n; k++)
                    ck_assert(v.v[k].stats.entropy_mean ==
                              kill_value(bb, v.v[k].layer, v.v[k].head));
                free(v.v);
            }
            if (pass == 0)
                store_close(st);
        }
        /* the summary kept in runs agrees with the table: no half batch anywhere */
        int64_t n = 0;
        ck_assert_int_eq(store_count_samples(st, run, &n, &err), STORE_OK);
        store_close(st);
        ck_assert_int_eq(raw_int(dbpath, "SELECT count(*) FROM samples"), n);
        ck_assert_int_eq(raw_int(dbpath, "SELECT count(*) FROM (SELECT step, count(*) AS c FROM "
                                         "samples GROUP BY step HAVING c % 16 != 0)"), 0);
        /* a batch committed after the last report (killed before write) is allowed, and counts
         * as the next start */
        int64_t maxstep = raw_int(dbpath, "SELECT max(step) FROM samples");
        ck_assert_int_ge(maxstep, reported[nrep - 1]);
        ck_assert_int_le(maxstep, reported[nrep - 1] + 1);
        if (maxstep > reported[nrep - 1])
            reported[nrep++] = maxstep;
        next = maxstep + 1;
    }
    fprintf(stderr, "  kill -9: %d committed batches checked over 6 kills\n", nrep);
}
END_TEST

/* ---- allocation failures ----------------------------------------------------------------------- */

static sqlite3_mem_methods fi_base;
static int fi_armed;
static long fi_fail_at, fi_calls;
static int fi_failed;

static void *fi_malloc(int n)
{
    if (fi_armed && ++fi_calls >= fi_fail_at) {
        fi_failed = 1;
        return NULL;
    }
    return fi_base.xMalloc(n);
}

static void *fi_realloc(void *p, int n)
{
    if (fi_armed && ++fi_calls >= fi_fail_at) {
        fi_failed = 1;
        return NULL;
    }
    return fi_base.xRealloc(p, n);
}

static void fi_arm(long n)
{
    fi_calls = 0;
    fi_fail_at = n;
    fi_failed = 0;
    fi_armed = 1;
}

static void fi_install(void)
{
    ck_assert_int_eq(sqlite3_shutdown(), SQLITE_OK);
    ck_assert_int_eq(sqlite3_config(SQLITE_CONFIG_GETMALLOC, &fi_base), SQLITE_OK);
    sqlite3_mem_methods m = fi_base;
    m.xMalloc = fi_malloc;
    m.xRealloc = fi_realloc;
    ck_assert_int_eq(sqlite3_config(SQLITE_CONFIG_MALLOC, &m), SQLITE_OK);
    ck_assert_int_eq(sqlite3_config(SQLITE_CONFIG_MEMSTATUS, 1), SQLITE_OK);
    ck_assert_int_eq(sqlite3_initialize(), SQLITE_OK);
}

static void fi_uninstall(void)
{
    fi_armed = 0;
    ck_assert_int_eq(sqlite3_shutdown(), SQLITE_OK);
    ck_assert_int_eq(sqlite3_config(SQLITE_CONFIG_MALLOC, &fi_base), SQLITE_OK);
}


START_TEST(test_fault_injection)
{
    fi_install();
    sqlite3_int64 baseline = sqlite3_memory_used();
    store_error err;

    /* open: create and migrate */
    store *st = NULL;
    long n;
    int failures = 0;
    for (n = 1; n < 100000; n++) {
        memset(&err, 0, sizeof err);
        fi_arm(n);
        st = store_open(dbpath, 0, &err);
        fi_armed = 0;
        if (st)
            break;
        failures++;
        ck_assert_msg(err.msg[0] != '\0', "open failure %ld without a message", n);
        ck_assert_msg(sqlite3_memory_used() == baseline,
                      "open failing at allocation %ld leaks %lld bytes", n,
                      (long long)(sqlite3_memory_used() - baseline));
    }
    ck_assert_ptr_nonnull(st);
    ck_assert_msg(fi_failed == 0 || failures > 0, "no failure was injected");
    fprintf(stderr, "  open: %d injected failures before success\n", failures);
    ck_assert_int_eq(store_integrity_check(st, &err), STORE_OK);
    store_close(st);
    ck_assert_int_eq(sqlite3_memory_used(), baseline);

    /* a batch: run, samples, alert, commit. The handle stays usable after every failure. */
    st = store_open(dbpath, 0, &err);
    ck_assert_ptr_nonnull(st);
    stats_head hs[8];
    for (int h = 0; h < 8; h++)
        hs[h] = rand_head(1);
    failures = 0;
    int64_t run = 0;
    for (n = 1; n < 100000; n++) {
        memset(&err, 0, sizeof err);
        fi_arm(n);
        store_status rs = store_run_begin(st, &(store_run_info){.name = "fi", .rank = 0}, &run,
                                          &err);
        for (int l = 0; rs == STORE_OK && l < 4; l++)
            rs = store_add_samples(st, run, 3, l, hs, 8, 0, &err);
        if (rs == STORE_OK) {
            store_alert a = {.run_id = run, .layer = 1, .head = 2, .step = 3, .rule = "nonfinite",
                             .state = STORE_ALERT_RAISED, .value = 1, .threshold = 0};
            rs = store_add_alert(st, &a, &err);
        }
        if (rs == STORE_OK)
            rs = store_commit(st, &err);
        fi_armed = 0;
        if (rs == STORE_OK)
            break;
        failures++;
        ck_assert_msg(err.msg[0] != '\0', "write failure %ld without a message", n);
        ck_assert_int_eq(store_pending(st), 0);
    }
    ck_assert_int_eq(fi_failed, 0);
    fprintf(stderr, "  write batch: %d injected failures before success\n", failures);
    int64_t count = 0;
    ck_assert_int_eq(store_count_samples(st, run, &count, &err), STORE_OK);
    ck_assert_int_eq(count, 32);
    int64_t alerts = 0;
    ck_assert_int_eq(store_alerts(st, run, 0, count_alert, &alerts, &err), STORE_OK);
    ck_assert_int_eq(alerts, 1); /* failed attempts left nothing behind */
    store_close(st);
    ck_assert_int_eq(sqlite3_memory_used(), baseline);

    /* reads on a fresh read-only handle (statements prepared under failure) */
    st = store_open_readonly(dbpath, 0, &err);
    ck_assert_ptr_nonnull(st);
    failures = 0;
    for (n = 1; n < 100000; n++) {
        memset(&err, 0, sizeof err);
        int64_t rows = 0, arows = 0, id = 0;
        fi_arm(n);
        store_status rs = store_resolve_run(st, "fi", -1, &id, &err);
        if (rs == STORE_OK)
            rs = store_trend(st, id, 1, -1, 0, 10, 1, count_sample, &rows, &err);
        if (rs == STORE_OK)
            rs = store_grid(st, id, STORE_STEP_LATEST, NULL, count_sample, &rows, &err);
        if (rs == STORE_OK)
            rs = store_alerts(st, 0, 1, count_alert, &arows, &err);
        fi_armed = 0;
        if (rs == STORE_OK) {
            ck_assert_int_eq(rows, 8 + 32);
            ck_assert_int_eq(arows, 1);
            break;
        }
        failures++;
        ck_assert_msg(err.msg[0] != '\0', "read failure %ld without a message", n);
    }
    fprintf(stderr, "  reads: %d injected failures before success\n", failures);
    store_close(st);
    ck_assert_int_eq(sqlite3_memory_used(), baseline);

    /* a retention step (compaction, then downsampling by age), then deleting the run: every
     * failure keeps nothing of the step, and the handle goes on */
    st = store_open(dbpath, 0, &err);
    ck_assert_ptr_nonnull(st);
    for (int64_t s = 10; s < 40; s++)
        for (int l = 0; l < 3; l++)
            ck_assert_int_eq(store_add_samples(st, run, s, l, hs, 8, 1000 + s, &err), STORE_OK);
    ck_assert_int_eq(store_commit(st, &err), STORE_OK);
    const char *tiers = "SELECT (SELECT count(*) FROM samples) * 1000000 + "
                        "(SELECT count(*) FROM history) * 1000 + (SELECT count(*) FROM coarse)";
    int64_t before = raw_int(dbpath, tiers), total = 0;
    ck_assert_int_eq(store_count_samples(st, run, &total, &err), STORE_OK);
    store_retention p = {.exact_steps = 2, .retain_ms = 10, .bucket_steps = 4,
                         .now_ms = 4102444800000}; /* 2100: everything is old */
    store_retain_report rep;
    failures = 0;
    for (n = 1; n < 100000; n++) {
        memset(&err, 0, sizeof err);
        fi_arm(n);
        store_status rs = store_retain_step(st, &p, 0, &rep, &err);
        fi_armed = 0;
        if (rs == STORE_OK)
            break;
        failures++;
        ck_assert_msg(err.msg[0] != '\0', "retention failure %ld without a message", n);
        ck_assert_int_eq(raw_int(dbpath, tiers), before);
    }
    ck_assert_int_gt(failures, 0);
    ck_assert(rep.compacted > 0 && rep.downsampled > 0);
    ck_assert_int_ne(raw_int(dbpath, tiers), before);
    int64_t after = 0;
    ck_assert_int_eq(store_count_samples(st, run, &after, &err), STORE_OK);
    ck_assert_int_eq(after, total);
    fprintf(stderr, "  retention step: %d injected failures before success\n", failures);
    before = raw_int(dbpath, tiers);
    failures = 0;
    for (n = 1; n < 100000; n++) {
        int done = 0;
        memset(&err, 0, sizeof err);
        fi_arm(n);
        store_status rs = store_delete_run(st, run, 0, &done, &err);
        fi_armed = 0;
        if (rs == STORE_OK) {
            ck_assert_int_eq(done, 1);
            break;
        }
        failures++;
        ck_assert_msg(err.msg[0] != '\0', "delete failure %ld without a message", n);
        ck_assert_int_eq(raw_int(dbpath, tiers), before);
    }
    fprintf(stderr, "  delete run: %d injected failures before success\n", failures);
    ck_assert_int_eq(raw_int(dbpath, tiers), 0);
    ck_assert_int_eq(store_integrity_check(st, &err), STORE_OK);
    store_close(st);
    ck_assert_int_eq(sqlite3_memory_used(), baseline);
    fi_uninstall();
}
END_TEST

/* ---- runner ------------------------------------------------------------------------------------ */

/* ---- runner ------------------------------------------------------------------------------------ */

static Suite *make_failures_suite(void)
{
    Suite *s = suite_create("store failures");
    TCase *tc = tcase_create("failures");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, test_error_paths);
    tcase_add_test(tc, test_bad_arguments);
    tcase_add_test(tc, test_kill9);
    tcase_add_test(tc, test_fault_injection);
    /* A deadline, not a margin: the fault injection opens (and migrates through every schema
     * version) once per allocation; under ASan with every CPU busy (tests/run-loaded.sh) that takes
     * minutes. */
    tcase_set_timeout(tc, 900);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    seed_init("test_store_failures");
    SRunner *sr = srunner_create(make_failures_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
