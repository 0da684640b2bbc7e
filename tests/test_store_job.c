/* test_store_job.c — the store's side of a job across processes (schema/store_job.h, and the layout
 * and numbered-heads calls of store_write.h): samples stored under global head numbers
 * (store_add_samples_at) read back through every tier, a run's parallel layout recorded and read
 * (and refused when out of range), a version-2 database migrated to the layout columns, and
 * store_merge_stats against the statistics of the union of two row sets computed directly. */
#include "store_job.h"
#include "store_pack.h"
#include "store_testutil.h"

#ifndef ATTNSTAT_SCHEMA_DIR
#error "ATTNSTAT_SCHEMA_DIR (the schema/ folder) must be defined by the build"
#endif

/* ---- numbered heads ------------------------------------------------------------------------- */

START_TEST(test_heads_at_offset_every_tier)
{
    store *st = open_ok(dbpath);
    int64_t run = begin_run(st, "job", 3);
    const int32_t base = (int32_t)rnd_range(1, 5000), n = (int32_t)rnd_range(2, 9);
    const int steps = 30;
    stats_head *h = malloc((size_t)steps * (size_t)n * sizeof *h);
    store_error err = {0};
    for (int s = 0; s < steps; s++) {
        for (int32_t i = 0; i < n; i++)
            h[s * n + i] = rand_head(0);
        ck_assert_msg(store_add_samples_at(st, run, s, 7, base, &h[s * n], n, 1000 + s, &err) ==
                      STORE_OK, "%s", err.msg);
    }
    ck_assert_int_eq(store_commit(st, &err), STORE_OK);
    /* heads [base, base + n), in the exact tier */
    ck_assert_int_eq(raw_int(dbpath, "SELECT count(DISTINCT head) FROM samples"), n);
    char sql[200];
    snprintf(sql, sizeof sql, "SELECT min(head) * 100000 + max(head) FROM samples");
    ck_assert_int_eq(raw_int(dbpath, sql), (int64_t)base * 100000 + base + n - 1);
    /* compacted: the packed rows list the heads' ids; they read back as they were written */
    store_retention p = {.exact_steps = 4};
    retain_until_done(st, &p, 0);
    ck_assert_int_gt(raw_int(dbpath, "SELECT count(*) FROM history"), 0);
    samples_vec v = {0};
    ck_assert_int_eq(store_grid(st, run, 3, NULL, collect_sample, &v, &err), STORE_OK);
    ck_assert_int_eq(v.n, n);
    for (int i = 0; i < v.n; i++) {
        ck_assert_int_eq(v.v[i].head, base + i);
        ck_assert_int_eq(v.v[i].tier, STORE_TIER_COMPACT);
        stats_head want = h[3 * n + i];
        store_pack_round(&want);
        assert_same_head(&v.v[i].stats, &want, "compact head");
    }
    v.n = 0;
    ck_assert_int_eq(store_trend(st, run, 7, base + n - 1, 0, steps, 1, collect_sample, &v, &err),
                     STORE_OK);
    ck_assert_int_eq(v.n, steps);
    free(v.v);
    free(h);
    store_close(st);
}
END_TEST

START_TEST(test_heads_at_bounds)
{
    store *st = open_ok(dbpath);
    int64_t run = begin_run(st, "job", 0);
    stats_head h[2] = {rand_head(0), rand_head(0)};
    store_error err = {0};
    ck_assert_int_eq(store_add_samples_at(st, run, 1, 0, -1, h, 2, 0, &err), STORE_EINVAL);
    ck_assert_int_eq(store_add_samples_at(st, run, 1, 0, INT32_MAX, h, 2, 0, &err), STORE_EINVAL);
    ck_assert_ptr_nonnull(strstr(err.msg, "heads"));
    ck_assert_int_eq(store_pending(st), 0);
    ck_assert_int_eq(store_add_samples_at(st, run, 1, 0, INT32_MAX - 1, h, 2, 0, &err), STORE_OK);
    ck_assert_int_eq(store_commit(st, &err), STORE_OK);
    ck_assert_int_eq(raw_int(dbpath, "SELECT max(head) FROM samples"), INT32_MAX);
    store_close(st);
}
END_TEST

/* ---- layouts --------------------------------------------------------------------------------- */

typedef struct {
    int n;
    store_job_run r[16];
    char names[16][32];
} jobs_vec;

static int collect_job_run(void *ctx, const store_job_run *r)
{
    jobs_vec *v = ctx;
    if (v->n < 16) {
        v->r[v->n] = *r;
        snprintf(v->names[v->n], sizeof v->names[0], "%s", r->name);
        v->r[v->n].name = v->r[v->n].host = NULL;
    }
    v->n++;
    return 0;
}

static store_layout rand_layout(void)
{
    store_layout l;
    l.tp_size = (int32_t)rnd_range(1, 64);
    l.tp_rank = (int32_t)rnd_range(0, l.tp_size - 1);
    l.pp_size = (int32_t)rnd_range(1, 16);
    l.pp_rank = (int32_t)rnd_range(0, l.pp_size - 1);
    l.dp_size = (int32_t)rnd_range(1, 1024);
    l.dp_rank = (int32_t)rnd_range(0, l.dp_size - 1);
    l.cp_size = (int32_t)rnd_range(1, 8);
    l.cp_rank = (int32_t)rnd_range(0, l.cp_size - 1);
    l.layer_offset = (int32_t)rnd_range(0, 200);
    l.head_offset = rnd() % 2 ? -1 : (int32_t)rnd_range(0, 4096);
    return l;
}

START_TEST(test_layout_recorded)
{
    store *st = open_ok(dbpath);
    int64_t a = begin_run(st, "gpt", 0), b = begin_run(st, "gpt", 1), c = begin_run(st, "other", 0);
    store_layout la = rand_layout(), lb = rand_layout();
    store_error err = {0};
    ck_assert_int_eq(store_run_set_layout(st, a, &la, &err), STORE_OK);
    ck_assert_int_eq(store_run_set_layout(st, b, &lb, &err), STORE_OK);
    ck_assert_int_eq(store_run_set_layout(st, b, NULL, &err), STORE_OK); /* none again */
    ck_assert_int_eq(store_run_set_layout(st, b, &lb, &err), STORE_OK);
    (void)c;
    store_close(st);
    /* durable: read through a read-only handle */
    st = store_open_readonly(dbpath, 0, &err);
    ck_assert_ptr_nonnull(st);
    jobs_vec v = {0};
    ck_assert_int_eq(store_job_runs(st, "gpt", collect_job_run, &v, &err), STORE_OK);
    ck_assert_int_eq(v.n, 2);
    ck_assert_int_eq(v.r[0].run_id, a);
    ck_assert_int_eq(v.r[1].run_id, b);
    ck_assert_int_eq(v.r[0].has_layout, 1);
    ck_assert_mem_eq(&v.r[0].layout, &la, sizeof la);
    ck_assert_mem_eq(&v.r[1].layout, &lb, sizeof lb);
    v.n = 0;
    ck_assert_int_eq(store_job_get_run(st, c, collect_job_run, &v, &err), STORE_OK);
    ck_assert_int_eq(v.n, 1);
    ck_assert_int_eq(v.r[0].has_layout, 0);
    store_layout none = {0, 1, 0, 1, 0, 1, 0, 1, 0, -1};
    ck_assert_mem_eq(&v.r[0].layout, &none, sizeof none);
    ck_assert_int_eq(store_job_get_run(st, 999, collect_job_run, &v, &err), STORE_NOTFOUND);
    v.n = 0;
    ck_assert_int_eq(store_job_runs(st, "nosuch", collect_job_run, &v, &err), STORE_OK);
    ck_assert_int_eq(v.n, 0);
    store_close(st);
}
END_TEST

START_TEST(test_layout_refused)
{
    store *st = open_ok(dbpath);
    int64_t a = begin_run(st, "gpt", 0);
    store_error err = {0};
    /* a pending batch is left alone by a refusal */
    stats_head h = rand_head(0);
    ck_assert_int_eq(store_add_samples(st, a, 1, 0, &h, 1, 0, &err), STORE_OK);
    struct {
        store_layout l;
        const char *says;
    } bad[] = {
        {{2, 2, 0, 1, 0, 1, 0, 1, 0, -1}, "tp_rank 2 of tp_size 2"},
        {{0, 0, 0, 1, 0, 1, 0, 1, 0, -1}, "tp_size 0"},
        {{0, 1, -1, 1, 0, 1, 0, 1, 0, -1}, "pp_rank -1"},
        {{0, 1, 0, 1, 0, (1 << 20) + 1, 0, 1, 0, -1}, "dp_size"},
        {{0, 1, 0, 1, 0, 1, 3, 2, 0, -1}, "cp_rank 3 of cp_size 2"},
        {{0, 1, 0, 1, 0, 1, 0, 1, -1, -1}, "layer_offset -1"},
        {{0, 1, 0, 1, 0, 1, 0, 1, 0, (1 << 24) + 1}, "head_offset"},
        {{0, 1, 0, 1, 0, 1, 0, 1, 0, -2}, "head_offset -2"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        ck_assert_int_eq(store_run_set_layout(st, a, &bad[i].l, &err), STORE_EINVAL);
        ck_assert_msg(strstr(err.msg, bad[i].says), "case %zu: '%s' does not say '%s'", i, err.msg,
                      bad[i].says);
        ck_assert_int_eq(store_pending(st), 1);
    }
    store_layout ok = {0, 1, 0, 1, 0, 1, 0, 1, 0, -1};
    ck_assert_int_eq(store_run_set_layout(st, 12345, &ok, &err), STORE_NOTFOUND);
    ck_assert_int_eq(store_pending(st), 1);
    /* a good one commits the batch with it */
    ck_assert_int_eq(store_run_set_layout(st, a, &ok, &err), STORE_OK);
    ck_assert_int_eq(store_pending(st), 0);
    ck_assert_int_eq(raw_int(dbpath, "SELECT count(*) FROM samples"), 1);
    ck_assert_int_eq(raw_int(dbpath, "SELECT tp_size FROM runs"), 1);
    store_close(st);
    /* a read-only handle writes nothing */
    st = store_open_readonly(dbpath, 0, &err);
    ck_assert_int_eq(store_run_set_layout(st, a, &ok, &err), STORE_EINVAL);
    store_close(st);
}
END_TEST

/* A database of schema version 2 (the migrations 001 and 002 as files) opens as the current one:
 * its runs have no layout, its samples keep their numbers. */
START_TEST(test_migrate_from_version_2)
{
    sqlite3 *db = NULL;
    ck_assert_int_eq(sqlite3_open(dbpath, &db), SQLITE_OK);
    for (int i = 1; i <= 2; i++) {
        char file[512];
        snprintf(file, sizeof file, "%s/00%d_%s.sql", ATTNSTAT_SCHEMA_DIR, i,
                 i == 1 ? "init" : "compact");
        FILE *f = fopen(file, "rb");
        ck_assert_msg(f != NULL, "cannot read %s", file);
        static char sql[1 << 16];
        size_t n = fread(sql, 1, sizeof sql - 1, f);
        fclose(f);
        sql[n] = '\0';
        ck_assert_int_eq(sqlite3_exec(db, sql, NULL, NULL, NULL), SQLITE_OK);
    }
    ck_assert_int_eq(sqlite3_exec(db, "PRAGMA user_version = 2; PRAGMA application_id = 1635021684;"
                                      "INSERT INTO runs (name, rank, started, last_hello) VALUES "
                                      "('old', 0, 1, 1); INSERT INTO samples (run_id, layer, head, "
                                      "step, time, rows, rows_norm, rows_empty, nonfinite_rows) "
                                      "VALUES (1, 2, 5, 9, 1, 10, 10, 0, 0)", NULL, NULL, NULL),
                     SQLITE_OK);
    sqlite3_close(db);
    store_error err = {0};
    ck_assert_ptr_null(store_open_readonly(dbpath, 0, &err)); /* older: migrate first */
    store *st = open_ok(dbpath);
    store_close(st);
    ck_assert_int_eq(raw_int(dbpath, "PRAGMA user_version"), store_schema_version());
    ck_assert_int_ge(store_schema_version(), 4);
    st = store_open_readonly(dbpath, 0, &err);
    ck_assert_msg(st != NULL, "%s", err.msg);
    jobs_vec v = {0};
    ck_assert_int_eq(store_job_runs(st, "old", collect_job_run, &v, &err), STORE_OK);
    ck_assert_int_eq(v.n, 1);
    ck_assert_int_eq(v.r[0].has_layout, 0);
    samples_vec s = {0};
    ck_assert_int_eq(store_grid(st, 1, 9, NULL, collect_sample, &s, &err), STORE_OK);
    ck_assert_int_eq(s.n, 1);
    ck_assert_int_eq(s.v[0].head * 10 + s.v[0].layer, 52);
    free(s.v);
    store_close(st);
}
END_TEST

/* ---- pooling --------------------------------------------------------------------------------- */

/* Per-row values of a set of rows, and its statistics computed directly (two passes, as the CPU
 * reference reduces). */
typedef struct {
    int n;
    double h[256], norm[256], logit[256], sink[256], dist[256];
    int has_norm[256];
} rows;

static void rand_rows(rows *r, int n, double shift)
{
    r->n = n;
    for (int i = 0; i < n; i++) {
        r->h[i] = shift + rnd_unit() * 4;
        r->has_norm[i] = rnd() % 5 != 0;
        r->norm[i] = rnd_unit();
        r->logit[i] = (rnd_unit() - 0.3) * 200;
        r->sink[i] = rnd_unit() * shift / 2;       /* a row's p(first visible key) */
        r->dist[i] = rnd_unit() * 300 * (1 + shift); /* a row's sum_j p_ij |i - j| */
    }
}

static stats_head direct(const rows *const *sets, int nsets)
{
    stats_head s;
    memset(&s, 0, sizeof s);
    double sum = 0, nsum = 0, coll = 0, sink = 0, dist = 0;
    s.entropy_min = INFINITY;
    s.entropy_max = -INFINITY;
    s.max_logit = -INFINITY;
    for (int k = 0; k < nsets; k++)
        for (int i = 0; i < sets[k]->n; i++) {
            s.rows++;
            sum += sets[k]->h[i];
            s.entropy_min = fmin(s.entropy_min, sets[k]->h[i]);
            s.entropy_max = fmax(s.entropy_max, sets[k]->h[i]);
            s.max_logit = fmax(s.max_logit, sets[k]->logit[i]);
            sink += sets[k]->sink[i];
            dist += sets[k]->dist[i];
            if (sets[k]->has_norm[i]) {
                s.rows_norm++;
                nsum += sets[k]->norm[i];
                coll += sets[k]->norm[i] < 0.1;
            }
        }
    if (s.rows == 0) {
        s.entropy_mean = s.entropy_std = s.entropy_min = s.entropy_max = NAN;
    } else {
        s.entropy_mean = sum / (double)s.rows;
        double var = 0;
        for (int k = 0; k < nsets; k++)
            for (int i = 0; i < sets[k]->n; i++)
                var += (sets[k]->h[i] - s.entropy_mean) * (sets[k]->h[i] - s.entropy_mean);
        s.entropy_std = sqrt(var / (double)s.rows);
    }
    s.entropy_norm_mean = s.rows_norm ? nsum / (double)s.rows_norm : NAN;
    s.collapsed_frac = s.rows_norm ? coll / (double)s.rows_norm : NAN;
    s.sink_mass = s.rows ? sink / (double)s.rows : NAN;
    s.distance = s.rows ? dist / (double)s.rows : NAN;
    return s;
}

static void assert_close_head(const stats_head *a, const stats_head *b, const char *where)
{
    ck_assert_msg(a->rows == b->rows && a->rows_norm == b->rows_norm, "%s: counts", where);
    const double x[9] = {a->entropy_mean, a->entropy_std, a->entropy_min, a->entropy_max,
                         a->entropy_norm_mean, a->collapsed_frac, a->max_logit, a->sink_mass,
                         a->distance};
    const double y[9] = {b->entropy_mean, b->entropy_std, b->entropy_min, b->entropy_max,
                         b->entropy_norm_mean, b->collapsed_frac, b->max_logit, b->sink_mass,
                         b->distance};
    for (int i = 0; i < 9; i++) {
        if (isnan(x[i]) || isnan(y[i]) || isinf(x[i]) || isinf(y[i])) {
            ck_assert_msg(same_double(x[i], y[i]), "%s: field %d: %g vs %g", where, i, x[i], y[i]);
            continue;
        }
        ck_assert_msg(fabs(x[i] - y[i]) <= 1e-12 * fmax(1, fabs(y[i])),
                      "%s: field %d: %.17g vs %.17g", where, i, x[i], y[i]);
    }
}

START_TEST(test_merge_is_the_union)
{
    for (int trial = 0; trial < 200; trial++) {
        rows a, b, c;
        /* sets of other sizes and other means (replicas see other data), some empty */
        rand_rows(&a, (int)rnd_range(trial % 7 == 0 ? 0 : 1, 256), rnd_unit() * 2);
        rand_rows(&b, (int)rnd_range(trial % 11 == 0 ? 0 : 1, 256), rnd_unit() * 2);
        rand_rows(&c, (int)rnd_range(1, 256), rnd_unit() * 2);
        const rows *sa[] = {&a}, *sb[] = {&b}, *sc[] = {&c}, *abc[] = {&a, &b, &c};
        stats_head ha = direct(sa, 1), hb = direct(sb, 1), hc = direct(sc, 1);
        stats_head want = direct(abc, 3);
        stats_head m = ha;
        store_merge_stats(&m, &hb);
        store_merge_stats(&m, &hc);
        assert_close_head(&m, &want, "a+b+c");
        stats_head r = hc; /* any order */
        store_merge_stats(&r, &hb);
        store_merge_stats(&r, &ha);
        assert_close_head(&r, &want, "c+b+a");
    }
}
END_TEST

START_TEST(test_merge_counts_and_flags)
{
    stats_head a = rand_head(0), e = rand_head(0);
    e.rows = e.rows_norm = 0;
    e.entropy_mean = e.entropy_std = e.entropy_min = e.entropy_max = NAN;
    e.entropy_norm_mean = e.collapsed_frac = NAN;
    e.max_logit = -INFINITY;
    e.rows_empty = 7;
    e.nonfinite_rows = 3;
    e.sampled = 1;
    a.sampled = 0;
    stats_head m = a;
    store_merge_stats(&m, &e); /* an empty side adds its counts only */
    ck_assert_int_eq(m.rows_empty, a.rows_empty + 7);
    ck_assert_int_eq(m.nonfinite_rows, a.nonfinite_rows + 3);
    ck_assert_int_eq(m.sampled, 1);
    ck_assert(same_double(m.entropy_mean, a.entropy_mean));
    ck_assert(same_double(m.max_logit, a.max_logit));
    stats_head m2 = e;
    store_merge_stats(&m2, &a); /* and takes the other's values whole */
    ck_assert(same_double(m2.entropy_std, a.entropy_std));
    ck_assert(same_double(m2.collapsed_frac, a.collapsed_frac));
    ck_assert_int_eq(m2.rows, a.rows);
}
END_TEST

static Suite *make_job_suite(void)
{
    Suite *s = suite_create("store_job");
    TCase *tc = tcase_create("job");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, test_heads_at_offset_every_tier);
    tcase_add_test(tc, test_heads_at_bounds);
    tcase_add_test(tc, test_layout_recorded);
    tcase_add_test(tc, test_layout_refused);
    tcase_add_test(tc, test_migrate_from_version_2);
    tcase_add_test(tc, test_merge_is_the_union);
    tcase_add_test(tc, test_merge_counts_and_flags);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    seed_init("test_store_job");
    SRunner *sr = srunner_create(make_job_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
