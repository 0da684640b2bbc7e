/* test_client_restart.c — libattnstat and `attnstat watch` across a daemon restart, against real
 * attnstatd processes started from the build tree, one after the other on the same socket and
 * database:
 *   - a trainer pushes host tensors; the daemon is stopped (SIGTERM: it finishes and acknowledges
 *     what it read, then exits; SIGKILL: pushes may be in flight) and a new one started. Checked:
 *     the next push notices, pushes meanwhile return DROPPED at once with a message that says what
 *     happened, flush never fails (ELOST once, only for abandoned pushes), the library reconnects
 *     inside attnstat_poll alone, the run id is the same, the pushes after the restart are
 *     acknowledged, the run's history in the database holds the steps before and after and none of
 *     the gap, and the counters add up (sent = acked + abandoned; dropped = the pushes of the gap);
 *   - `attnstat watch` says once that the daemon is gone and once that it is back, then prints the
 *     alerts the new daemon raises.
 * Fresh random data (the seed is printed; ATTNSTAT_TEST_SEED repeats a run). Every wait is for a
 * condition with a generous deadline; nothing sleeps and then asserts. */
#include "daemon_harness.h"
#include "stats_testutil.h"

#include "attnstat.h"
#include "cli_harness.h"

enum { LAYERS = 2, HEADS = 4, DEADLINE_MS = 120000 };

/* One push of random Q/K (4 heads, N=32, D=32, bf16) for (step, layer); returns its code. */
static attnstat_code push_one(attnstat_client *c, tu_rng *rng, int64_t step, uint32_t layer)
{
    tu_tensor q, k;
    tu_alloc(&q, 1, HEADS, 32, 32, STATS_BF16, TU_BHND);
    tu_alloc(&k, 1, HEADS, 32, 32, STATS_BF16, TU_BNHD);
    tu_fill_gauss(&q, rng, 1.0);
    tu_fill_gauss(&k, rng, 1.0);
    attnstat_tensor aq = cli_tensor(&q), ak = cli_tensor(&k);
    attnstat_push_opts o;
    attnstat_push_opts_init(&o);
    o.step = step;
    o.layer = layer;
    attnstat_code rc = attnstat_push(c, &o, &aq, &ak, NULL);
    tu_free(&q);
    tu_free(&k);
    return rc;
}

/* Calls attnstat_poll (and nothing else) until the client's link is up again. */
static void wait_reconnected(attnstat_client *c)
{
    int64_t deadline = dh_now_ms() + DEADLINE_MS;
    char why[256];
    while (attnstat_link_state(c, why, sizeof why) != ATTNSTAT_LINK_UP) {
        ck_assert_msg(dh_now_ms() < deadline, "not reconnected after %d ms: %s", DEADLINE_MS, why);
        ck_assert_int_eq(attnstat_poll(c, 100), ATTNSTAT_OK);
    }
}

static int64_t db_count(const dh_daemon *d, const char *fmt, long long a)
{
    char sql[300];
    snprintf(sql, sizeof sql, fmt, a);
    sqlite3 *db = dh_db_open(d);
    int64_t n = dh_db_int(db, sql);
    sqlite3_close(db);
    return n;
}

/* ---- A trainer across a restart ----------------------------------------------------------------*/
static void survive_restart(int kill9)
{
    tu_rng rng = {tu_seed()};
    dh_daemon d;
    dh_dir_init(&d);
    dh_start(&d, NULL);
    const char *run = kill9 ? "restart-kill9" : "restart-term";
    attnstat_client *c = cli_trainer(d.sock, run, 1, NULL, 16u << 20, 0);
    int64_t run_id = attnstat_run_id(c);
    ck_assert_int_gt(run_id, 0);
    cli_push_steps(c, &rng, 0, 3, LAYERS, 1.0); /* steps 0..2, flushed: acknowledged */
    if (kill9) /* step 3 in flight when the daemon dies: acknowledged or abandoned */
        for (uint32_t l = 0; l < LAYERS; l++)
            ck_assert_int_eq(push_one(c, &rng, 3, l), ATTNSTAT_OK);
    if (kill9)
        dh_kill9(&d);
    else
        ck_assert_int_eq(dh_stop(&d), 0);

    /* The daemon is gone (its end of the socket closed): the next push notices. */
    attnstat_counters st;
    const int gap = 6;
    for (int i = 0; i < gap; i++) {
        int64_t t0 = dh_now_ms();
        attnstat_code rc = push_one(c, &rng, 10 + i, 0);
        ck_assert_msg(rc == ATTNSTAT_DROPPED, "push %d of the gap: %d %s", i, rc,
                      attnstat_last_error(c));
        ck_assert_msg(dh_now_ms() - t0 < 10000, "a push waited for the daemon");
        ck_assert_msg(strstr(attnstat_last_error(c), "lost") &&
                          strstr(attnstat_last_error(c), "reconnecting"),
                      "%s", attnstat_last_error(c));
    }
    char want[64];
    snprintf(want, sizeof want, "%d pushes dropped so far", gap);
    ck_assert_msg(strstr(attnstat_last_error(c), want), "%s", attnstat_last_error(c));
    char why[256];
    ck_assert_int_eq(attnstat_link_state(c, why, sizeof why), ATTNSTAT_LINK_RECONNECTING);
    ck_assert_msg(strstr(why, "closed the connection"), "%s", why);
    ck_assert_int_eq(attnstat_fd(c), -1);
    attnstat_stats(c, &st);
    ck_assert_uint_eq(st.in_flight, 0);
    ck_assert_uint_eq(st.ring_used, 0);
    uint64_t lost = st.abandoned;
    if (!kill9) /* a daemon that drains acknowledges everything it read */
        ck_assert_uint_eq(lost, 0);
    /* flush never fails because the daemon went away: ELOST once for abandoned pushes */
    attnstat_code fr = attnstat_flush(c, 5000);
    ck_assert_msg(fr == (lost ? ATTNSTAT_ELOST : ATTNSTAT_OK), "flush: %d %s", fr,
                  attnstat_last_error(c));
    if (lost)
        ck_assert_msg(strstr(attnstat_last_error(c), "will never be acknowledged"), "%s",
                      attnstat_last_error(c));
    ck_assert_int_eq(attnstat_flush(c, 5000), ATTNSTAT_OK);

    /* A new daemon on the same socket and database: attnstat_poll alone brings the link back. */
    dh_start(&d, NULL);
    wait_reconnected(c);
    ck_assert_int_ge(attnstat_fd(c), 0);
    ck_assert_int_eq(attnstat_run_id(c), run_id);
    cli_push_steps(c, &rng, 20, 23, LAYERS, 1.0); /* every push OK, flushed: acknowledged */
    attnstat_stats(c, &st);
    ck_assert_uint_eq(st.disconnects, 1);
    ck_assert_uint_eq(st.reconnects, 1);
    ck_assert_uint_eq(st.dropped_disconnected, gap);
    ck_assert_uint_eq(st.dropped_local, gap);
    ck_assert_uint_eq(st.pushed, st.sent + gap);
    ck_assert_uint_eq(st.abandoned, lost);
    ck_assert_uint_eq(st.sent, st.acked + st.abandoned + st.dropped_daemon + st.rejected);
    ck_assert_uint_eq(st.dropped_daemon + st.rejected + st.in_flight + st.ring_used, 0);
    ck_assert_uint_eq(st.acked, (uint64_t)(6 * LAYERS) + (kill9 ? (uint64_t)LAYERS - lost : 0));
    attnstat_close(c);
    ck_assert_int_eq(dh_stop(&d), 0);

    /* One run; its history on both sides of the restart, nothing of the gap. */
    char name_q[200];
    snprintf(name_q, sizeof name_q, "SELECT COUNT(*) FROM runs WHERE name = '%s' AND id = %%lld "
             "AND rank = 1", run);
    ck_assert_int_eq(db_count(&d, name_q, (long long)run_id), 1);
    ck_assert_int_eq(db_count(&d, "SELECT COUNT(*) FROM runs WHERE id <> %lld", run_id), 0);
    for (int step = 0; step < 23; step++) {
        char q[200];
        snprintf(q, sizeof q, "SELECT COUNT(*) FROM samples WHERE run_id = %%lld AND step = %d",
                 step);
        int64_t n = db_count(&d, q, (long long)run_id);
        if (step < 3 || step >= 20)
            ck_assert_msg(n == LAYERS * HEADS, "step %d: %lld samples", step, (long long)n);
        else if (step == 3 && kill9) /* acknowledged means stored */
            ck_assert_msg(n >= (int64_t)(LAYERS - lost) * HEADS && n <= LAYERS * HEADS,
                          "step 3: %lld samples, %llu pushes abandoned", (long long)n,
                          (unsigned long long)lost);
        else
            ck_assert_msg(n == 0, "step %d of the gap was stored (%lld samples)", step,
                          (long long)n);
    }
    dh_cleanup(&d, 0);
}

START_TEST(test_trainer_survives_sigterm)
{
    survive_restart(0);
}
END_TEST

START_TEST(test_trainer_survives_sigkill)
{
    survive_restart(1);
}
END_TEST

/* ---- watch across a restart --------------------------------------------------------------------*/
START_TEST(test_watch_survives_restart)
{
    tu_rng rng = {tu_seed()};
    dh_daemon d;
    dh_dir_init(&d);
    dh_start(&d, NULL);
    char out[400], err[400];
    snprintf(out, sizeof out, "%s/watch.out", d.dir);
    snprintf(err, sizeof err, "%s/watch.err", d.dir);
    pid_t w = cli_spawn(out, err, "--socket", d.sock, "watch", "--format", "json");
    cli_wait_text(err, "watching alerts from", 1, w, DEADLINE_MS);

    dh_kill9(&d);
    cli_wait_text(err, "waiting for it to come back", 1, w, DEADLINE_MS);
    dh_start(&d, NULL);
    cli_wait_text(err, "is back; watching alerts again", 1, w, DEADLINE_MS);

    /* The new daemon's alerts reach the watcher: a run whose ceiling is 1, every push raises. */
    attnstat_thresholds th;
    attnstat_thresholds_init(&th);
    th.logit_ceiling = 1.0;
    th.raise_after = 1;
    attnstat_client *c = cli_trainer(d.sock, "after-restart", 0, &th, 0, 0);
    cli_push_steps(c, &rng, 0, 1, 1, 8.0);
    attnstat_close(c);
    cli_wait_text(out, "\"rule\": \"logit_ceiling\"", HEADS, w, DEADLINE_MS);
    char *o = cli_slurp(out);
    ck_assert_int_eq(cli_count_text(o, "\"run\": \"after-restart\""), cli_count_lines(o));
    free(o);

    /* one line each way, and the watcher still runs until told to stop */
    char *e = cli_slurp(err);
    ck_assert_msg(cli_count_text(e, "waiting for it to come back") == 1 &&
                      cli_count_text(e, "is back") == 1,
                  "%s", e);
    free(e);
    ck_assert_int_eq(kill(w, SIGTERM), 0);
    int st;
    ck_assert_int_eq(waitpid(w, &st, 0), w);
    ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0, "watch exit status %d", st);
    ck_assert_int_eq(dh_stop(&d), 0);
    dh_cleanup(&d, 0);
}
END_TEST

int main(void)
{
    const TTest *tests[] = {test_trainer_survives_sigterm, test_trainer_survives_sigkill,
                            test_watch_survives_restart};
    return cli_run_tests("client_restart", tests, (int)(sizeof tests / sizeof tests[0]));
}
