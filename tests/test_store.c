/* test_store.c — Check suite for the store (schema/): migrations, exact round trips, trend and
 * grid queries, alerts, batch visibility. The failure paths (errors, kill -9, allocation failures)
 * are tests/test_store_failures.c; the compact history, the tiers and export
 * tests/test_store_history.c; retention tests/test_store_retain.c; the compact format
 * tests/test_store_pack.c.
 *
 * Random data comes from a seed printed at start (ATTNSTAT_TEST_SEED=<n> replays a run). Every test
 * works in its own temporary directory.
 */
#include "store_testutil.h"
/* ---- schema --------------------------------------------------------------------------------- */

START_TEST(test_migrate_from_empty)
{
    store *st = open_ok(dbpath);
    store_close(st);
    ck_assert_int_eq(raw_int(dbpath, "PRAGMA user_version"), store_schema_version());
    ck_assert_int_ge(store_schema_version(), 1);
    ck_assert_int_eq(raw_int(dbpath, "PRAGMA application_id"), 0x61747374);
    ck_assert_int_eq(raw_int(dbpath, "SELECT count(*) FROM sqlite_schema WHERE type = 'table' AND "
                                     "name IN ('runs', 'samples', 'alerts')"), 3);
    sqlite3 *db = NULL;
    ck_assert_int_eq(sqlite3_open_v2(dbpath, &db, SQLITE_OPEN_READONLY, NULL), SQLITE_OK);
    sqlite3_stmt *s = NULL;
    ck_assert_int_eq(sqlite3_prepare_v2(db, "PRAGMA journal_mode", -1, &s, NULL), SQLITE_OK);
    ck_assert_int_eq(sqlite3_step(s), SQLITE_ROW);
    ck_assert_str_eq((const char *)sqlite3_column_text(s, 0), "wal");
    sqlite3_finalize(s);
    sqlite3_close(db);
    /* samples is WITHOUT ROWID */
    ck_assert_int_eq(raw_int(dbpath, "SELECT count(*) FROM sqlite_schema WHERE name = 'samples' "
                                     "AND sql LIKE '%WITHOUT ROWID%'"), 1);
}
END_TEST

START_TEST(test_reopen_idempotent)
{
    store *st = open_ok(dbpath);
    int64_t a = begin_run(st, "train", 0);
    int64_t b = begin_run(st, "train", 1);
    ck_assert_int_ne(a, b);
    stats_head h = rand_head(0);
    store_error err = {0};
    ck_assert_int_eq(store_add_samples(st, a, 7, 0, &h, 1, 1000, &err), STORE_OK);
    ck_assert_int_eq(store_commit(st, &err), STORE_OK);
    store_close(st);
    for (int i = 0; i < 3; i++) {
        st = open_ok(dbpath);
        /* the same (name, rank) resumes the same run */
        ck_assert_int_eq(begin_run(st, "train", 0), a);
        ck_assert_int_eq(begin_run(st, "train", 1), b);
        int64_t n = -1;
        ck_assert_int_eq(store_count_samples(st, a, &n, &err), STORE_OK);
        ck_assert_int_eq(n, 1);
        store_close(st);
        ck_assert_int_eq(raw_int(dbpath, "PRAGMA user_version"), store_schema_version());
        ck_assert_int_eq(raw_int(dbpath, "SELECT count(*) FROM runs"), 2);
    }
    /* a resumed run keeps its first start time and takes the new pid */
    st = open_ok(dbpath);
    store_run_info info = {.name = "train", .rank = 0, .pid = 777, .time_ms = 5};
    int64_t id = 0;
    ck_assert_int_eq(store_run_begin(st, &info, &id, &err), STORE_OK);
    ck_assert_int_eq(id, a);
    rows_vec v = {0};
    ck_assert_int_eq(store_get_run(st, a, collect_run, &v, &err), STORE_OK);
    ck_assert_int_eq(v.n, 1);
    ck_assert_int_eq(v.runs[0].pid, 777);
    ck_assert_int_eq(v.runs[0].last_hello_ms, 5);
    ck_assert_int_gt(v.runs[0].started_ms, 5);
    store_close(st);
}
END_TEST

START_TEST(test_newer_schema_refused)
{
    store_close(open_ok(dbpath));
    int newer = store_schema_version() + 1 + (int)(rnd() % 50);
    char sql[64];
    snprintf(sql, sizeof sql, "PRAGMA user_version = %d", newer);
    raw_exec(dbpath, sql);
    store_error err = {0};
    store *st = store_open(dbpath, 0, &err);
    ck_assert_ptr_null(st);
    ck_assert_msg(strstr(err.msg, "newer") && strstr(err.msg, dbpath), "message: %s", err.msg);
    memset(&err, 0, sizeof err);
    st = store_open_readonly(dbpath, 0, &err);
    ck_assert_ptr_null(st);
    ck_assert_msg(strstr(err.msg, "newer"), "message: %s", err.msg);
    ck_assert_int_eq(raw_int(dbpath, "PRAGMA user_version"), newer); /* untouched */
}
END_TEST

START_TEST(test_foreign_database_refused)
{
    raw_exec(dbpath, "CREATE TABLE other (x)");
    store_error err = {0};
    ck_assert_ptr_null(store_open(dbpath, 0, &err));
    ck_assert_msg(strstr(err.msg, "not an attnstat database"), "message: %s", err.msg);
    /* an empty database cannot be read as one */
    char empty[400];
    snprintf(empty, sizeof empty, "%s/empty.db", tmpdir);
    raw_exec(empty, "PRAGMA user_version = 0");
    ck_assert_ptr_null(store_open_readonly(empty, 0, &err));
    ck_assert_msg(strstr(err.msg, "not an attnstat database"), "message: %s", err.msg);
}
END_TEST

/* ---- round trips and queries ------------------------------------------------------------------ */

START_TEST(test_samples_round_trip)
{
    store *st = open_ok(dbpath);
    int64_t run = begin_run(st, "rt", 0);
    enum { LAYERS = 5, HEADS = 12, STEPS = 4 };
    static stats_head want[STEPS][LAYERS][HEADS];
    store_error err = {0};
    for (int s = 0; s < STEPS; s++) {
        for (int l = 0; l < LAYERS; l++) {
            for (int h = 0; h < HEADS; h++) {
                want[s][l][h] = rand_head(1);
                if (s == STEPS - 1 && want[s][l][h].rows > 0 && rnd() % 3 == 0) { /* random bit patterns: exactness */
                    want[s][l][h].entropy_mean = rand_bits_double();
                    want[s][l][h].entropy_std = rand_bits_double();
                    want[s][l][h].max_logit = rand_bits_double();
                    want[s][l][h].collapsed_frac = rand_bits_double();
                }
            }
            ck_assert_msg(store_add_samples(st, run, s * 100, l, want[s][l], HEADS, 1000 + s, &err)
                          == STORE_OK, "add: %s", err.msg);
        }
        ck_assert_int_eq(store_pending(st), (int64_t)LAYERS * HEADS);
        ck_assert_int_eq(store_commit(st, &err), STORE_OK);
        ck_assert_int_eq(store_pending(st), 0);
    }
    ck_assert_int_eq(store_samples_written(st), (int64_t)STEPS * LAYERS * HEADS);
    store_close(st);

    /* read back through a read-only handle */
    st = store_open_readonly(dbpath, 0, &err);
    ck_assert_msg(st != NULL, "%s", err.msg);
    for (int s = 0; s < STEPS; s++) {
        samples_vec v = {0};
        int64_t used = -1;
        ck_assert_int_eq(store_grid(st, run, s * 100, &used, collect_sample, &v, &err), STORE_OK);
        ck_assert_int_eq(used, s * 100);
        ck_assert_int_eq(v.n, LAYERS * HEADS);
        for (int i = 0; i < v.n; i++) {
            int l = i / HEADS, h = i % HEADS;
            ck_assert_int_eq(v.v[i].layer, l);
            ck_assert_int_eq(v.v[i].head, h);
            ck_assert_int_eq(v.v[i].run_id, run);
            ck_assert_int_eq(v.v[i].time_ms, 1000 + s);
            char where[64];
            snprintf(where, sizeof where, "step %d layer %d head %d", s * 100, l, h);
            assert_same_head(&v.v[i].stats, &want[s][l][h], where);
        }
        free(v.v);
    }
    int64_t n = 0;
    ck_assert_int_eq(store_count_samples(st, 0, &n, &err), STORE_OK);
    ck_assert_int_eq(n, (int64_t)STEPS * LAYERS * HEADS);
    store_close(st);
    /* NaN went in as NULL */
    ck_assert_int_eq(raw_int(dbpath, "SELECT count(*) FROM samples WHERE rows = 0 AND "
                                     "entropy_mean IS NOT NULL"), 0);
    ck_assert_int_eq(raw_int(dbpath, "SELECT count(*) FROM samples WHERE rows = 0"),
                     raw_int(dbpath, "SELECT count(*) FROM samples WHERE entropy_mean IS NULL"));
}
END_TEST

START_TEST(test_replace_keeps_count)
{
    store *st = open_ok(dbpath);
    int64_t run = begin_run(st, "dup", 0);
    store_error err = {0};
    stats_head a[3] = {rand_head(0), rand_head(0), rand_head(0)};
    stats_head b[3] = {rand_head(0), rand_head(0), rand_head(0)};
    ck_assert_int_eq(store_add_samples(st, run, 5, 1, a, 3, 0, &err), STORE_OK);
    ck_assert_int_eq(store_commit(st, &err), STORE_OK);
    ck_assert_int_eq(store_add_samples(st, run, 5, 1, b, 3, 0, &err), STORE_OK);
    ck_assert_int_eq(store_add_samples(st, run, 6, 1, b, 2, 0, &err), STORE_OK);
    ck_assert_int_eq(store_commit(st, &err), STORE_OK);
    int64_t n = 0;
    ck_assert_int_eq(store_count_samples(st, run, &n, &err), STORE_OK);
    ck_assert_int_eq(n, 5);
    samples_vec v = {0};
    ck_assert_int_eq(store_grid(st, run, 5, NULL, collect_sample, &v, &err), STORE_OK);
    ck_assert_int_eq(v.n, 3);
    for (int i = 0; i < 3; i++)
        assert_same_head(&v.v[i].stats, &b[i], "replaced");
    free(v.v);
    store_close(st);
    ck_assert_int_eq(raw_int(dbpath, "SELECT count(*) FROM samples"), 5);
}
END_TEST

START_TEST(test_trend_range_thinning)
{
    store *st = open_ok(dbpath);
    int64_t run = begin_run(st, "trend", 0);
    int64_t other = begin_run(st, "trend", 1);
    store_error err = {0};
    enum { HEADS = 4, MAXSTEPS = 300 };
    int64_t steps[MAXSTEPS];
    int nsteps = (int)rnd_range(50, MAXSTEPS);
    int64_t step = rnd_range(-5, 20);
    for (int i = 0; i < nsteps; i++) {
        steps[i] = step;
        step += rnd_range(1, 7); /* gaps */
        for (int l = 0; l < 3; l++) {
            stats_head hs[HEADS];
            for (int h = 0; h < HEADS; h++) {
                hs[h] = rand_head(0);
                hs[h].entropy_mean = (double)steps[i] + l * 0.25 + h * 0.01; /* identifies it */
            }
            /* layer 1 head 3 only on even indices: a head-specific step set */
            int nh = (l == 1 && i % 2) ? HEADS - 1 : HEADS;
            ck_assert_int_eq(store_add_samples(st, run, steps[i], l, hs, nh, 0, &err), STORE_OK);
            ck_assert_int_eq(store_add_samples(st, other, steps[i], l, hs, nh, 0, &err), STORE_OK);
        }
        if (i % 17 == 0)
            ck_assert_int_eq(store_commit(st, &err), STORE_OK);
    }
    ck_assert_int_eq(store_commit(st, &err), STORE_OK);

    for (int trial = 0; trial < 40; trial++) {
        int a = (int)rnd_range(0, nsteps - 1), b = (int)rnd_range(a, nsteps - 1);
        int64_t from = steps[a] - (int64_t)(rnd() % 2), to = steps[b] + (int64_t)(rnd() % 2);
        int64_t every = trial % 4 == 0 ? 1 : rnd_range(2, 9);
        int head = trial % 3 == 0 ? -1 : (int)rnd_range(0, HEADS - 1);
        int layer = (int)rnd_range(0, 2);
        /* expected: the distinct steps in range that the selection has, first and every Nth */
        int64_t exp_steps[MAXSTEPS];
        int ne = 0, k = 0;
        for (int i = 0; i < nsteps; i++) {
            if (steps[i] < from || steps[i] > to)
                continue;
            int has = !(layer == 1 && head == HEADS - 1 && i % 2);
            if (!has)
                continue;
            if (k++ % every == 0)
                exp_steps[ne++] = steps[i];
        }
        samples_vec v = {0};
        ck_assert_int_eq(store_trend(st, run, layer, head, from, to, every, collect_sample, &v,
                                     &err), STORE_OK);
        int idx = 0;
        for (int e = 0; e < ne; e++) {
            int nh = 1;
            if (head < 0) { /* count the heads stored at this step */
                nh = 0;
                while (idx + nh < v.n && v.v[idx + nh].step == exp_steps[e])
                    nh++;
                ck_assert_int_ge(nh, HEADS - 1);
            }
            for (int j = 0; j < nh; j++, idx++) {
                ck_assert_int_lt(idx, v.n);
                ck_assert_int_eq(v.v[idx].step, exp_steps[e]);
                ck_assert_int_eq(v.v[idx].run_id, run);
                ck_assert_int_eq(v.v[idx].layer, layer);
                int hh = head >= 0 ? head : j;
                ck_assert_int_eq(v.v[idx].head, hh);
                ck_assert(v.v[idx].stats.entropy_mean ==
                          (double)exp_steps[e] + layer * 0.25 + hh * 0.01);
            }
        }
        ck_assert_msg(idx == v.n, "trial %d: %d rows, expected %d", trial, v.n, idx);
        free(v.v);
    }
    /* a callback can stop early */
    samples_vec v = {0};
    ck_assert_int_eq(store_trend(st, run, 0, 0, INT64_MIN + 1, INT64_MAX, 1, collect_sample, &v,
                                 &err), STORE_OK);
    ck_assert_int_eq(v.n, nsteps);
    free(v.v);
    store_close(st);
}
END_TEST

static int stop_after_one(void *ctx, const store_sample *s)
{
    (void)s;
    (*(int *)ctx)++;
    return 1;
}

START_TEST(test_grid)
{
    store *st = open_ok(dbpath);
    int64_t run = begin_run(st, "grid", 0);
    store_error err = {0};
    samples_vec v = {0};
    ck_assert_int_eq(store_grid(st, run, STORE_STEP_LATEST, NULL, collect_sample, &v, &err),
                     STORE_NOTFOUND);
    ck_assert_int_eq(store_grid(st, run + 100, STORE_STEP_LATEST, NULL, collect_sample, &v, &err),
                     STORE_NOTFOUND);
    int64_t last = 0;
    int layers = (int)rnd_range(2, 8), heads = (int)rnd_range(1, 16);
    for (int s = 0; s < 10; s++) {
        last = s * 10 + (int64_t)(rnd() % 5);
        for (int l = layers - 1; l >= 0; l--) { /* any order in */
            stats_head hs[16];
            for (int h = 0; h < heads; h++) {
                hs[h] = rand_head(1);
                hs[h].rows_empty = last * 1000 + l * 100 + h;
            }
            ck_assert_int_eq(store_add_samples(st, run, last, l, hs, heads, 0, &err), STORE_OK);
        }
        ck_assert_int_eq(store_commit(st, &err), STORE_OK);
    }
    int64_t used = 0;
    ck_assert_int_eq(store_grid(st, run, STORE_STEP_LATEST, &used, collect_sample, &v, &err),
                     STORE_OK);
    ck_assert_int_eq(used, last);
    ck_assert_int_eq(v.n, layers * heads);
    for (int i = 0; i < v.n; i++) { /* layer-major, head-minor */
        ck_assert_int_eq(v.v[i].layer, i / heads);
        ck_assert_int_eq(v.v[i].head, i % heads);
        ck_assert_int_eq(v.v[i].stats.rows_empty, last * 1000 + (i / heads) * 100 + i % heads);
    }
    v.n = 0;
    ck_assert_int_eq(store_grid(st, run, last - 1, NULL, collect_sample, &v, &err),
                     STORE_NOTFOUND);
    ck_assert_msg(strstr(err.msg, "no sample at step"), "%s", err.msg);
    free(v.v);
    int calls = 0;
    ck_assert_int_eq(store_grid(st, run, last, NULL, stop_after_one, &calls, &err), STORE_OK);
    ck_assert_int_eq(calls, 1);
    /* the summary of the run agrees with the table */
    rows_vec r = {0};
    ck_assert_int_eq(store_list_runs(st, collect_run, &r, &err), STORE_OK);
    ck_assert_int_eq(r.n, 1);
    ck_assert_int_eq(r.runs[0].samples, (int64_t)10 * layers * heads);
    ck_assert_int_eq(r.runs[0].step_max, last);
    ck_assert_int_le(r.runs[0].step_min, 4);
    ck_assert_str_eq(r.names[0], "grid");
    store_close(st);
}
END_TEST

START_TEST(test_alerts_active)
{
    store *st = open_ok(dbpath);
    int64_t r1 = begin_run(st, "a", 0), r2 = begin_run(st, "b", 0);
    store_error err = {0};
    /* r1 head 0 floor: raised, cleared, raised again (active);
     * r1 head 1 logit: raised then cleared (not active); r2 head 0 nonfinite: raised (active) */
    struct { int64_t run; int head; const char *rule; int state; int64_t step; } seq[] = {
        {r1, 0, "entropy_floor", STORE_ALERT_RAISED, 10},
        {r1, 1, "logit_ceiling", STORE_ALERT_RAISED, 11},
        {r2, 0, "nonfinite", STORE_ALERT_RAISED, 12},
        {r1, 0, "entropy_floor", STORE_ALERT_CLEARED, 13},
        {r1, 1, "logit_ceiling", STORE_ALERT_CLEARED, 14},
        {r1, 0, "entropy_floor", STORE_ALERT_RAISED, 15},
        {r1, 0, "entropy_drop", STORE_ALERT_RAISED, 16},
        {r1, 0, "entropy_drop", STORE_ALERT_CLEARED, 17},
    };
    int n = (int)(sizeof seq / sizeof seq[0]);
    for (int i = 0; i < n; i++) {
        store_alert a = {.run_id = seq[i].run, .layer = 2, .head = seq[i].head,
                         .step = seq[i].step, .rule = seq[i].rule, .state = seq[i].state,
                         .value = rnd_unit(), .threshold = i == 0 ? NAN : 0.5,
                         .message = "something happened"};
        ck_assert_msg(store_add_alert(st, &a, &err) == STORE_OK, "%s", err.msg);
    }
    /* uncommitted alerts are not visible to another connection */
    store *ro = store_open_readonly(dbpath, 0, &err);
    ck_assert_msg(ro != NULL, "%s", err.msg);
    rows_vec v = {0};
    ck_assert_int_eq(store_alerts(ro, 0, 0, collect_alert, &v, &err), STORE_OK);
    ck_assert_int_eq(v.n, 0);
    ck_assert_int_eq(store_commit(st, &err), STORE_OK);

    memset(&v, 0, sizeof v);
    ck_assert_int_eq(store_alerts(ro, 0, 0, collect_alert, &v, &err), STORE_OK);
    ck_assert_int_eq(v.n, n);
    for (int i = 0; i < n; i++) {
        ck_assert_int_eq(v.steps[i], seq[i].step);
        ck_assert_str_eq(v.rules[i], seq[i].rule);
        ck_assert_int_eq(v.states[i], seq[i].state);
    }
    memset(&v, 0, sizeof v);
    ck_assert_int_eq(store_alerts(ro, 0, 1, collect_alert, &v, &err), STORE_OK);
    ck_assert_int_eq(v.n, 2);
    ck_assert_int_eq(v.steps[0], 12);
    ck_assert_int_eq(v.steps[1], 15);
    memset(&v, 0, sizeof v);
    ck_assert_int_eq(store_alerts(ro, r1, 1, collect_alert, &v, &err), STORE_OK);
    ck_assert_int_eq(v.n, 1);
    ck_assert_str_eq(v.rules[0], "entropy_floor");
    ck_assert_int_eq(v.states[0], STORE_ALERT_RAISED);
    memset(&v, 0, sizeof v);
    ck_assert_int_eq(store_alerts(ro, r1, 0, collect_alert, &v, &err), STORE_OK);
    ck_assert_int_eq(v.n, n - 1);
    store_close(ro);

    /* bad alerts are refused without touching the batch */
    store_alert bad = {.run_id = r1, .layer = 0, .head = 0, .rule = "", .state = 1};
    ck_assert_int_eq(store_add_alert(st, &bad, &err), STORE_EINVAL);
    bad.rule = "x";
    bad.run_id = r2 + 1000;
    ck_assert_int_eq(store_add_alert(st, &bad, &err), STORE_NOTFOUND);
    ck_assert_msg(strstr(err.msg, "no run with id"), "%s", err.msg);
    store_close(st);
}
END_TEST

START_TEST(test_batch_visibility)
{
    store *st = open_ok(dbpath);
    int64_t run = begin_run(st, "vis", 0);
    store_error err = {0};
    store *ro = store_open_readonly(dbpath, 0, &err);
    ck_assert_msg(ro != NULL, "%s", err.msg);
    int64_t total = 0;
    for (int b = 0; b < 5; b++) {
        int nl = (int)rnd_range(1, 6);
        for (int l = 0; l < nl; l++) {
            stats_head hs[8];
            for (int h = 0; h < 8; h++)
                hs[h] = rand_head(1);
            ck_assert_int_eq(store_add_samples(st, run, b, l, hs, 8, 0, &err), STORE_OK);
        }
        int64_t n = -1;
        ck_assert_int_eq(store_count_samples(ro, 0, &n, &err), STORE_OK);
        ck_assert_int_eq(n, total); /* the open batch is invisible */
        samples_vec v = {0};
        ck_assert_int_eq(store_grid(ro, run, b, NULL, collect_sample, &v, &err), STORE_NOTFOUND);
        ck_assert_int_eq(v.n, 0);
        /* the writer itself sees its own batch */
        ck_assert_int_eq(store_count_samples(st, run, &n, &err), STORE_OK);
        ck_assert_int_eq(n, total + nl * 8);
        if (b == 2) { /* a rolled back batch never appears */
            store_rollback(st);
            ck_assert_int_eq(store_pending(st), 0);
        } else {
            ck_assert_int_eq(store_commit(st, &err), STORE_OK);
            total += nl * 8;
        }
        ck_assert_int_eq(store_count_samples(ro, 0, &n, &err), STORE_OK);
        ck_assert_int_eq(n, total);
    }
    /* a read-only handle refuses to write */
    stats_head h = rand_head(0);
    ck_assert_int_eq(store_add_samples(ro, run, 99, 0, &h, 1, 0, &err), STORE_EINVAL);
    ck_assert_msg(strstr(err.msg, "read-only"), "%s", err.msg);
    /* close with an open batch rolls it back */
    ck_assert_int_eq(store_add_samples(st, run, 100, 0, &h, 1, 0, &err), STORE_OK);
    store_close(st);
    int64_t n = 0;
    ck_assert_int_eq(store_count_samples(ro, 0, &n, &err), STORE_OK);
    ck_assert_int_eq(n, total);
    store_close(ro);
    ck_assert_int_eq(raw_int(dbpath, "SELECT count(*) FROM samples"), total);
}
END_TEST

START_TEST(test_resolve_run)
{
    store *st = open_ok(dbpath);
    int64_t a0 = begin_run(st, "alpha", 0), a1 = begin_run(st, "alpha", 1);
    int64_t b = begin_run(st, "beta", 0);
    int64_t num = begin_run(st, "12345", 0);
    store_error err = {0};
    int64_t id = 0;
    ck_assert_int_eq(store_resolve_run(st, "beta", -1, &id, &err), STORE_OK);
    ck_assert_int_eq(id, b);
    ck_assert_int_eq(store_resolve_run(st, "alpha", -1, &id, &err), STORE_AMBIGUOUS);
    ck_assert_msg(strstr(err.msg, "alpha") && strstr(err.msg, "rank"), "%s", err.msg);
    ck_assert_int_eq(store_resolve_run(st, "alpha", 1, &id, &err), STORE_OK);
    ck_assert_int_eq(id, a1);
    char spec[32];
    snprintf(spec, sizeof spec, "%" PRId64, a0);
    ck_assert_int_eq(store_resolve_run(st, spec, -1, &id, &err), STORE_OK);
    ck_assert_int_eq(id, a0);
    ck_assert_int_eq(store_resolve_run(st, "12345", -1, &id, &err), STORE_OK); /* by name */
    ck_assert_int_eq(id, num);
    ck_assert_int_eq(store_resolve_run(st, "gamma", -1, &id, &err), STORE_NOTFOUND);
    ck_assert_msg(strstr(err.msg, "gamma"), "%s", err.msg);
    ck_assert_int_eq(store_resolve_run(st, "", -1, &id, &err), STORE_EINVAL);
    store_close(st);
}
END_TEST

/* ---- runner ------------------------------------------------------------------------------------ */

static Suite *make_store_suite(void)
{
    Suite *s = suite_create("store");
    TCase *tc = tcase_create("schema");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, test_migrate_from_empty);
    tcase_add_test(tc, test_reopen_idempotent);
    tcase_add_test(tc, test_newer_schema_refused);
    tcase_add_test(tc, test_foreign_database_refused);
    suite_add_tcase(s, tc);

    tc = tcase_create("data");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, test_samples_round_trip);
    tcase_add_test(tc, test_replace_keeps_count);
    tcase_add_test(tc, test_trend_range_thinning);
    tcase_add_test(tc, test_grid);
    tcase_add_test(tc, test_alerts_active);
    tcase_add_test(tc, test_batch_visibility);
    tcase_add_test(tc, test_resolve_run);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    seed_init("test_store");
    SRunner *sr = srunner_create(make_store_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
