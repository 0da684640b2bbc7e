/* test_daemon_share.c — what one peer, or one mistake, could take from everyone else (issue 23),
 * with a real attnstatd: each test is a defect once seen, and fails on the code that had it.
 *  - R1: one daemon per database FILE: a hard link or a symbolic link to a database in use does
 *    not start a second daemon (two WALs on one file lost acknowledged samples);
 *  - R7: Hellos alone store at most max_runs_per_uid runs and max_config_bytes_per_uid bytes of
 *    configs per uid;
 *  - R8: SIGHUP reads the config file off the event loop: a FIFO in its place is refused with the
 *    reason, a file too big too, and the daemon serves throughout.
 * Connection slots and subscribers (R3, R4): test_daemon_slots.c. Waits are for conditions, with
 * generous deadlines: nothing here depends on a timing margin. */
#include "share_testutil.h"

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
        int st = sh_run_daemon_to_end(log2, args, (uid_t)-1);
        char *out = sh_slurp(log2);
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
        ck_assert_int_eq(sh_hello_with(&t[i], run, i, cfg, msg, sizeof msg), 0);
        free(cfg);
    }
    /* A fourth run: refused. */
    dh_connect(&t[3], &d);
    snprintf(run, sizeof run, "%s-3", prefix);
    int code = sh_hello_with(&t[3], run, 0, NULL, msg, sizeof msg);
    ck_assert_msg(code == ATTNSTAT__CODE__BUSY && strstr(msg, "max_runs_per_uid 3") &&
                      strstr(msg, "delete-run"), "a fourth run got %d (%s)", code, msg);
    /* A run of its own again, its config bigger: the sum decides. */
    dh_connect(&t[4], &d);
    snprintf(run, sizeof run, "%s-0", prefix);
    char *big = random_config(&rng, 4096 - sizes[1] - sizes[2] + 1);
    code = sh_hello_with(&t[4], run, 0, big, msg, sizeof msg);
    free(big);
    ck_assert_msg(code == ATTNSTAT__CODE__BUSY && strstr(msg, "max_config_bytes_per_uid 4096"),
                  "configs past the uid's bytes got %d (%s)", code, msg);
    dh_connect(&t[5], &d);
    char *fits = random_config(&rng, 4096 - sizes[1] - sizes[2]);
    ck_assert_int_eq(sh_hello_with(&t[5], run, 0, fits, msg, sizeof msg), 0);
    free(fits);
    /* The runs' records go to the store thread ahead of a push of this connection: once its Ack
     * is here, they are committed. */
    Attnstat__HeadStats hs[2], *ptrs[2];
    Attnstat__Computed cm;
    sh_fill_computed(&cm, hs, ptrs, 2, 1, 0, &rng, 0);
    sh_send_computed(&t[5], &cm);
    ck_assert_int_eq(sh_computed_ack(&t[5], 1), 0);
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
    ck_assert_int_eq(sh_hello_with(&t[6], run, 0, NULL, msg, sizeof msg), 0);
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
    sh_write_file(conf, "logit_ceiling = 100\n");
    dh_start(&d, "--config", conf, (const char *)NULL);
    dh_conn c;
    dh_connect(&c, &d);
    attnstat__envelope__free_unpacked(dh_status(&c), NULL);

    /* A FIFO nobody writes to, in the config file's place. */
    ck_assert_int_eq(unlink(conf), 0);
    ck_assert_msg(mkfifo(conf, 0600) == 0, "mkfifo: %s", strerror(errno));
    const char *failed = "reload failed, settings unchanged";
    int before = sh_file_count(d.log, failed);
    ck_assert_int_eq(kill(d.pid, SIGHUP), 0);
    ck_assert_msg(sh_file_count_over(d.log, failed, before, 30000), "no failed reload logged");
    ck_assert_msg(sh_file_has(d.log, "is a FIFO, not a regular file", 1000),
                  "the failed reload does not say the file is a FIFO");
    attnstat__envelope__free_unpacked(dh_status(&c), NULL); /* it serves */

    /* Too big: refused, saying the bound. */
    ck_assert_int_eq(unlink(conf), 0);
    FILE *f = fopen(conf, "w");
    ck_assert_ptr_nonnull(f);
    for (int i = 0; i < 20000; i++)
        fprintf(f, "# %060llu\n", (unsigned long long)dh_next(&rng));
    ck_assert_int_eq(fclose(f), 0);
    before = sh_file_count(d.log, failed);
    ck_assert_int_eq(kill(d.pid, SIGHUP), 0);
    ck_assert(sh_file_count_over(d.log, failed, before, 30000));
    ck_assert_msg(sh_file_has(d.log, "more than the 1048576 bytes", 1000),
                  "the failed reload does not state the size bound");
    attnstat__envelope__free_unpacked(dh_status(&c), NULL);

    /* A regular file again: applied. */
    double ceiling = 10 + (double)(dh_next(&rng) % 80);
    snprintf(text, sizeof text, "logit_ceiling = %g\n", ceiling);
    sh_write_file(conf, text);
    char want[100];
    snprintf(want, sizeof want, "reload: logit_ceiling: 100 -> %g", ceiling);
    ck_assert_int_eq(kill(d.pid, SIGHUP), 0);
    ck_assert_msg(sh_file_has(d.log, want, 30000), "the reload after the FIFO was not applied");
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
