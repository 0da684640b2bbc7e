/* test_store_interv.c — Check suite for interventions in the store (schema/006_interventions.sql,
 * store_add_intervention(), store_interventions()): random ones of several runs read back exactly
 * (every double bit for bit, heads in the order sent, layer / values / threshold / measured /
 * detail absent where absent), ordered by run, step and id; the JSON arrays as stored; a batch
 * rolled back takes them with it; bad arguments refused naming the field with the batch untouched;
 * delete-run takes a run's interventions and only its; the retention step leaves them; a damaged
 * row is reported, not read wrong.
 *
 * Random data from a seed printed at start (ATTNSTAT_TEST_SEED=<n> replays a run).
 */
#include "interv_testutil.h"

#define NRUNS 3
#define PER_RUN 40

static iv_copy want[NRUNS * PER_RUN];

/* The wanted list sorted as the store reads it: run, step, then the order added. */
static int by_run_step(const void *a, const void *b)
{
    const iv_copy *x = a, *y = b;
    if (x->iv.run_id != y->iv.run_id)
        return x->iv.run_id < y->iv.run_id ? -1 : 1;
    if (x->iv.step != y->iv.step)
        return x->iv.step < y->iv.step ? -1 : 1;
    return x->iv.id < y->iv.id ? -1 : x->iv.id > y->iv.id;
}

/* Adds n random interventions of runs[] (round robin, some sharing a step) into want[] and
 * commits; returns n. */
static int add_random(store *st, const int64_t *runs, int nruns, int n)
{
    store_error err = {0};
    for (int i = 0; i < n; i++) {
        iv_random(&want[i], runs[i % nruns], (int32_t)(i % nruns));
        if (i >= nruns && rnd() % 4 == 0) /* a step another of its run has: ordered by id */
            want[i].iv.step = want[i - nruns].iv.step;
        int64_t id = 0;
        ck_assert_msg(store_add_intervention(st, &want[i].iv, &id, &err) == STORE_OK, "add %d: %s",
                      i, err.msg);
        ck_assert_int_gt(id, 0);
        want[i].iv.id = id;
    }
    ck_assert_msg(store_commit(st, &err) == STORE_OK, "commit: %s", err.msg);
    qsort(want, (size_t)n, sizeof *want, by_run_step);
    for (int i = 0; i < n; i++)
        iv_fix(&want[i], want[i].iv.values != NULL, want[i].iv.detail != NULL);
    return n;
}

START_TEST(test_round_trip)
{
    store *st = open_ok(dbpath);
    int64_t runs[NRUNS];
    for (int r = 0; r < NRUNS; r++) {
        char name[32];
        snprintf(name, sizeof name, "job%d", r);
        runs[r] = begin_run(st, name, r);
    }
    int n = add_random(st, runs, NRUNS, NRUNS * PER_RUN);
    store_close(st);

    /* a read-only handle, as the CLI reads */
    store_error err = {0};
    st = store_open_readonly(dbpath, 0, &err);
    ck_assert_msg(st != NULL, "%s", err.msg);
    static iv_list all;
    all.n = 0;
    ck_assert_msg(store_interventions(st, 0, iv_collect, &all, &err) == STORE_OK, "%s", err.msg);
    ck_assert_int_eq(all.n, n);
    for (int i = 0; i < n; i++) {
        char where[64];
        snprintf(where, sizeof where, "intervention %d (id %lld)", i, (long long)want[i].iv.id);
        ck_assert_int_eq(all.v[i].iv.id, want[i].iv.id);
        iv_assert_same(&all.v[i], &want[i], where);
    }
    /* one run: its own, in the same order */
    iv_list one = {0};
    ck_assert_int_eq(store_interventions(st, runs[1], iv_collect, &one, &err), STORE_OK);
    ck_assert_int_eq(one.n, PER_RUN);
    int k = 0;
    for (int i = 0; i < n; i++)
        if (want[i].iv.run_id == runs[1])
            iv_assert_same(&one.v[k++], &want[i], "run 1");
    ck_assert_int_eq(k, PER_RUN);
    ck_assert_int_eq(store_interventions(st, 999999, iv_collect, &one, &err), STORE_NOTFOUND);
    store_close(st);
    free(all.v);
    free(one.v);

    /* as stored: JSON arrays SQLite reads, NULL where absent */
    char sql[300];
    int64_t first = want[0].iv.id;
    snprintf(sql, sizeof sql, "SELECT json_array_length(heads) FROM interventions WHERE id = %lld",
             (long long)first);
    ck_assert_int_eq(raw_int(dbpath, sql), want[0].iv.nheads);
    for (int i = 0; i < n; i++) {
        const store_intervention *w = &want[i].iv;
        snprintf(sql, sizeof sql, "SELECT (layer IS NULL) + 2 * (head_values IS NULL) + "
                 "4 * (threshold IS NULL) + 8 * (measured IS NULL) + 16 * (detail IS NULL) "
                 "FROM interventions WHERE id = %lld", (long long)w->id);
        ck_assert_int_eq(raw_int(dbpath, sql), (w->layer < 0) + 2 * (w->values == NULL) +
                                                   4 * isnan(w->threshold) +
                                                   8 * isnan(w->measured) + 16 * !w->detail);
        if (w->nheads) {
            int32_t h = (int32_t)rnd_range(0, w->nheads - 1);
            snprintf(sql, sizeof sql, "SELECT j.value FROM interventions AS i, json_each(i.heads) AS j "
                     "WHERE i.id = %lld AND j.key = %d", (long long)w->id, h);
            ck_assert_int_eq(raw_int(dbpath, sql), w->heads[h]);
        }
    }
}
END_TEST

START_TEST(test_rollback_and_bad_arguments)
{
    store *st = open_ok(dbpath);
    int64_t run = begin_run(st, "bad", 0);
    store_error err = {0};
    static iv_copy c;
    iv_random(&c, run, 0);
    c.iv.nheads = 3;
    c.heads[0] = 5, c.heads[1] = 6, c.heads[2] = 7;
    /* rolled back with its batch */
    ck_assert_int_eq(store_add_intervention(st, &c.iv, NULL, &err), STORE_OK);
    store_rollback(st);
    ck_assert_int_eq(raw_int(dbpath, "SELECT count(*) FROM interventions"), 0);

    /* refused, naming what; a batch holding a good one is untouched */
    ck_assert_int_eq(store_add_intervention(st, &c.iv, NULL, &err), STORE_OK);
    static iv_copy b;
    static char long_detail[STORE_INTERVENTION_DETAIL_MAX + 2];
    memset(long_detail, 'x', STORE_INTERVENTION_DETAIL_MAX + 1);
#define BAD(stmt, words_, status)                                                                  \
    do {                                                                                           \
        b = c;                                                                                     \
        iv_fix(&b, c.iv.values != NULL, c.iv.detail != NULL);                                      \
        stmt;                                                                                      \
        err.msg[0] = '\0';                                                                         \
        ck_assert_int_eq(store_add_intervention(st, &b.iv, NULL, &err), status);                   \
        ck_assert_msg(strstr(err.msg, words_), "'%s' does not say '%s'", err.msg, words_);         \
    } while (0)
    BAD(b.iv.kind = "QK", "kind", STORE_EINVAL);
    BAD(b.iv.kind = "", "kind", STORE_EINVAL);
    BAD(b.iv.kind = "abcdefghijklmnopqrstuvwxyz0123456", "kind", STORE_EINVAL);
    BAD(b.iv.step = -1, "step", STORE_EINVAL);
    BAD(b.iv.layer = -2, "layer", STORE_EINVAL);
    BAD(b.iv.nheads = STORE_INTERVENTION_HEADS_MAX + 1, "heads", STORE_EINVAL);
    BAD(b.heads[1] = -3, "heads[1]", STORE_EINVAL);
    BAD((b.values[2] = INFINITY, b.iv.values = b.values), "values[2]", STORE_EINVAL);
    BAD(b.iv.threshold = -INFINITY, "threshold", STORE_EINVAL);
    BAD(b.iv.detail = long_detail, "detail", STORE_EINVAL);
    BAD(b.iv.run_id = run + 100, "", STORE_NOTFOUND);
#undef BAD
    ck_assert_msg(store_commit(st, &err) == STORE_OK, "%s", err.msg);
    ck_assert_int_eq(raw_int(dbpath, "SELECT count(*) FROM interventions"), 1);
    ck_assert_int_eq(raw_int(dbpath, "SELECT count(*) FROM interventions WHERE heads = '[5,6,7]'"),
                     1);
    /* the largest: 4096 heads with values */
    b = c;
    b.iv.nheads = STORE_INTERVENTION_HEADS_MAX;
    for (int i = 0; i < b.iv.nheads; i++) {
        b.heads[i] = (int32_t)rnd_range(0, 1 << 24);
        b.values[i] = -rand_bits_double();
    }
    iv_fix(&b, 1, 0);
    ck_assert_msg(store_add_intervention(st, &b.iv, &b.iv.id, &err) == STORE_OK, "%s", err.msg);
    ck_assert_int_eq(store_commit(st, &err), STORE_OK);
    static iv_list l;
    l.n = 0;
    ck_assert_int_eq(store_interventions(st, run, iv_collect, &l, &err), STORE_OK);
    ck_assert_int_eq(l.n, 2);
    iv_assert_same(&l.v[l.v[0].iv.id == b.iv.id ? 0 : 1], &b, "4096 heads");
    free(l.v);
    store_close(st);
}
END_TEST

START_TEST(test_delete_run_and_retention)
{
    store *st = open_ok(dbpath);
    int64_t runs[2] = {begin_run(st, "gone", 0), begin_run(st, "kept", 0)};
    store_error err = {0};
    /* samples enough for the retention step to compact and downsample */
    stats_head heads[4];
    for (int64_t s = 0; s < 300; s++) {
        for (int h = 0; h < 4; h++)
            heads[h] = rand_head(0);
        for (int r = 0; r < 2; r++)
            ck_assert_int_eq(store_add_samples(st, runs[r], s, 0, heads, 4, 1000 + s, &err),
                             STORE_OK);
    }
    int n = add_random(st, runs, 2, 30);
    store_retention pol = {.exact_steps = 8, .retain_ms = 1, .bucket_steps = 10,
                           .now_ms = (int64_t)1 << 50};
    retain_until_done(st, &pol, 0);
    ck_assert_int_gt(raw_int(dbpath, "SELECT count(*) FROM coarse"), 0); /* it did downsample */
    static iv_list l;
    l.n = 0;
    ck_assert_int_eq(store_interventions(st, 0, iv_collect, &l, &err), STORE_OK);
    ck_assert_int_eq(l.n, n);
    for (int i = 0; i < n; i++)
        iv_assert_same(&l.v[i], &want[i], "after retention");

    int done = 0;
    while (!done)
        ck_assert_msg(store_delete_run(st, runs[0], 64, &done, &err) == STORE_OK, "%s", err.msg);
    char sql[160];
    snprintf(sql, sizeof sql, "SELECT count(*) FROM interventions WHERE run_id = %lld",
             (long long)runs[0]);
    ck_assert_int_eq(raw_int(dbpath, sql), 0);
    l.n = 0;
    ck_assert_int_eq(store_interventions(st, 0, iv_collect, &l, &err), STORE_OK);
    int k = 0;
    for (int i = 0; i < n; i++)
        if (want[i].iv.run_id == runs[1])
            iv_assert_same(&l.v[k++], &want[i], "the run kept");
    ck_assert_int_eq(l.n, k);
    ck_assert_int_eq(k, 15);
    free(l.v);
    store_close(st);
}
END_TEST

START_TEST(test_damaged_row)
{
    store *st = open_ok(dbpath);
    int64_t run = begin_run(st, "damaged", 0);
    store_close(st);
    char sql[300];
    snprintf(sql, sizeof sql, "INSERT INTO interventions (id, run_id, rank, step, time_ms, kind, "
             "heads, head_values) VALUES (77, %lld, 0, 1, 1, 'x', '[1,2', NULL), (78, %lld, 0, 2, "
             "1, 'x', '[1,2]', '[0.5]')", (long long)run, (long long)run);
    raw_exec(dbpath, sql);
    store_error err = {0};
    st = store_open_readonly(dbpath, 0, &err);
    ck_assert_ptr_nonnull(st);
    iv_list l = {0};
    ck_assert_int_eq(store_interventions(st, run, iv_collect, &l, &err), STORE_ERROR);
    ck_assert_msg(strstr(err.msg, "intervention 77"), "%s", err.msg);
    raw_exec(dbpath, "DELETE FROM interventions WHERE id = 77");
    ck_assert_int_eq(store_interventions(st, run, iv_collect, &l, &err), STORE_ERROR);
    ck_assert_msg(strstr(err.msg, "intervention 78"), "%s", err.msg);
    ck_assert_int_eq(l.n, 0);
    free(l.v);
    store_close(st);
}
END_TEST

int main(void)
{
    seed_init("test_store_interv");
    Suite *s = suite_create("store interventions");
    TCase *tc = tcase_create("interventions");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, test_round_trip);
    tcase_add_test(tc, test_rollback_and_bad_arguments);
    tcase_add_test(tc, test_delete_run_and_retention);
    tcase_add_test(tc, test_damaged_row);
    tcase_set_timeout(tc, 120);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
