/* test_store_v4.c — Check suite for a history database made by the store of schema version 4
 * (tests/fixtures/store_v4.db: commit 440be5d's store, before samples had sink_mass and distance
 * and the compact format had version 2; tests/fixtures/README.md says how it was made), opened by
 * this store: it migrates to version 6 (interventions: tests/test_store_interv.c,
 * test_store_migrate.c) and every value reads back as written (the exact and
 * compact tiers against the values regenerated from their seed, tests/fixtures/store_v4_values.h;
 * the buckets against version 4's own export of them, store_v4_buckets.csv, column by column), the
 * runs with their stored thresholds, the new statistics NaN; then new samples with finite
 * sink_mass and distance go through all three tiers beside the old ones and read back.
 *
 * Random data of the new samples comes from a seed printed at start (ATTNSTAT_TEST_SEED=<n>
 * replays a run); the fixture's values come from its own fixed seed. Every test works on a copy
 * of the fixture in its own temporary directory.
 */
#include "store_pack.h"
#include "store_testutil.h"
#include "store_v4_values.h"

#ifndef ATTNSTAT_FIXTURE_DIR
#error "ATTNSTAT_FIXTURE_DIR (tests/fixtures) must be defined by the build"
#endif

static stats_head fx[2][FX_STEPS][FX_LAYERS][FX_HEADS];

/* The fixture copied to dbpath (the test's own file: the migration writes to it). */
static void copy_fixture(void)
{
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "cp '%s/store_v4.db' '%s'", ATTNSTAT_FIXTURE_DIR, dbpath);
    ck_assert_int_eq(system(cmd), 0);
    ck_assert_int_eq(raw_int(dbpath, "PRAGMA user_version"), 4);
    ck_assert_int_eq(raw_int(dbpath, "SELECT count(*) FROM pragma_table_info('samples') WHERE "
                                     "name IN ('sink_mass', 'distance')"), 0);
    fx_values(fx);
}

/* Samples with their buckets' extremes copied (the callback's pointers do not outlive it). */
typedef struct {
    store_sample s;
    stats_head lo, hi;
} kept;

typedef struct {
    kept *v;
    int n, cap;
} kept_vec;

static int keep(void *ctx, const store_sample *s)
{
    kept_vec *v = ctx;
    if (v->n == v->cap) {
        v->cap = v->cap ? 2 * v->cap : 256;
        v->v = realloc(v->v, (size_t)v->cap * sizeof *v->v);
        ck_assert_ptr_nonnull(v->v);
    }
    kept *k = &v->v[v->n++];
    k->s = *s;
    k->lo = s->min ? *s->min : s->stats;
    k->hi = s->max ? *s->max : s->stats;
    k->s.min = k->s.max = NULL;
    return 0;
}

static kept_vec read_run(store *st, int64_t run)
{
    kept_vec v = {0};
    store_error err = {0};
    for (int32_t l = 0; l < FX_LAYERS; l++)
        ck_assert_msg(store_trend(st, run, l, -1, INT64_MIN, INT64_MAX, 1, keep, &v, &err) ==
                          STORE_OK, "%s", err.msg);
    return v;
}

/* Field i of a CSV line (no quoting in the store's CSV) into out. */
static const char *csv_col(const char *line, int i, char *out, size_t len)
{
    const char *p = line;
    for (int k = 0; k < i; k++) {
        p = strchr(p, ',');
        ck_assert_ptr_nonnull(p);
        p++;
    }
    size_t n = strcspn(p, ",\n");
    ck_assert_uint_lt(n, len);
    memcpy(out, p, n);
    out[n] = '\0';
    return out;
}

static int csv_index(const char *header, const char *name)
{
    char f[64];
    for (int i = 0;; i++) {
        const char *p = header;
        for (int k = 0; k < i; k++)
            if (!(p = strchr(p, ',')) || !*++p)
                return -1;
        if (strcmp(csv_col(header, i, f, sizeof f), name) == 0)
            return i;
    }
}

/* The runs as read, strings copied. */
typedef struct {
    store_run r;
    char name[32], host[32], config[128], thresholds[256], reason[32];
} run_copy;

static run_copy got_runs[8];
static int ngot_runs;

static int grab_run(void *ctx, const store_run *r)
{
    (void)ctx;
    ck_assert_int_lt(ngot_runs, 8);
    run_copy *c = &got_runs[ngot_runs++];
    c->r = *r;
    snprintf(c->name, sizeof c->name, "%s", r->name);
    snprintf(c->host, sizeof c->host, "%s", r->host ? r->host : "(null)");
    snprintf(c->config, sizeof c->config, "%s", r->config ? r->config : "(null)");
    snprintf(c->thresholds, sizeof c->thresholds, "%s", r->thresholds ? r->thresholds : "(null)");
    snprintf(c->reason, sizeof c->reason, "%s", r->end_reason ? r->end_reason : "(null)");
    return 0;
}

/* Every exact and compact row of a run against the fixture's values; buckets returned to the
 * caller. *covered counts the samples read (a bucket: those it merged). */
static void check_samples(const kept_vec *v, int r, int64_t *covered, int *tiers)
{
    for (int i = 0; i < v->n; i++) {
        const store_sample *s = &v->v[i].s;
        tiers[s->tier]++;
        *covered += s->merged;
        ck_assert(isnan(s->stats.sink_mass) && isnan(s->stats.distance));
        ck_assert(isnan(v->v[i].lo.sink_mass) && isnan(v->v[i].hi.distance));
        if (s->tier == STORE_TIER_BUCKET)
            continue;
        ck_assert(s->step >= 0 && s->step < FX_STEPS && s->head >= 0 && s->head < FX_HEADS);
        stats_head want = fx[r][s->step][s->layer][s->head];
        if (s->tier == STORE_TIER_COMPACT)
            store_pack_round(&want);
        ck_assert_int_eq(s->time_ms, FX_TIME(r, s->step));
        char where[96];
        snprintf(where, sizeof where, "run %d step %" PRId64 " layer %d head %d (%s)", r, s->step,
                 s->layer, s->head, s->tier ? "compact" : "exact");
        assert_same_head(&s->stats, &want, where);
    }
}

/* The buckets of run_id against version 4's export of them: every column it had, the same text;
 * the columns it lacked empty (NaN). Returns the number of bucket rows checked. */
static int check_buckets(const kept_vec *v, int64_t run_id)
{
    char path[512];
    snprintf(path, sizeof path, "%s/store_v4_buckets.csv", ATTNSTAT_FIXTURE_DIR);
    FILE *f = fopen(path, "r");
    ck_assert_msg(f != NULL, "cannot read %s", path);
    static char old_header[4096], line[4096], mine[STORE_FORMAT_MAX];
    ck_assert_ptr_nonnull(fgets(old_header, sizeof old_header, f));
    const char *new_header = STORE_EXPORT_CSV_HEADER;
    int ncols_new = 1, checked = 0;
    for (const char *c = new_header; *c; c++)
        ncols_new += *c == ',';
    while (fgets(line, sizeof line, f)) {
        char a[64], b[64];
        if (strtoll(csv_col(line, 0, a, sizeof a), NULL, 10) != run_id)
            continue;
        int32_t layer = (int32_t)strtol(csv_col(line, 1, a, sizeof a), NULL, 10);
        int32_t head = (int32_t)strtol(csv_col(line, 2, a, sizeof a), NULL, 10);
        int64_t step = strtoll(csv_col(line, 3, a, sizeof a), NULL, 10);
        const kept *k = NULL;
        for (int i = 0; i < v->n && !k; i++)
            if (v->v[i].s.tier == STORE_TIER_BUCKET && v->v[i].s.layer == layer &&
                v->v[i].s.head == head && v->v[i].s.step == step)
                k = &v->v[i];
        ck_assert_msg(k != NULL, "run %" PRId64 ": bucket layer %d head %d step %" PRId64
                      " is gone", run_id, layer, head, step);
        store_sample s = k->s;
        s.min = &k->lo;
        s.max = &k->hi;
        size_t n = store_format_sample(&s, STORE_FORMAT_CSV, mine, sizeof mine);
        ck_assert_uint_lt(n, sizeof mine);
        for (int c = 0; c < ncols_new; c++) {
            char name[64];
            csv_col(new_header, c, name, sizeof name);
            int old = csv_index(old_header, name);
            csv_col(mine, c, b, sizeof b);
            if (old < 0) { /* a statistic version 4 did not have */
                ck_assert_msg(b[0] == '\0', "bucket column %s: '%s', not empty", name, b);
                continue;
            }
            csv_col(line, old, a, sizeof a);
            ck_assert_msg(strcmp(a, b) == 0, "run %" PRId64 " bucket layer %d head %d step %"
                          PRId64 " column %s: '%s', version 4 read '%s'", run_id, layer, head,
                          step, name, b, a);
        }
        checked++;
    }
    fclose(f);
    return checked;
}

/* ---- the fixture, migrated, read back ---------------------------------------------------------- */

START_TEST(test_v4_reads_back)
{
    copy_fixture();
    store *st = open_ok(dbpath);
    ck_assert_int_eq(raw_int(dbpath, "PRAGMA user_version"), store_schema_version());
    ck_assert_int_eq(raw_int(dbpath, "SELECT count(*) FROM interventions"), 0);
    ck_assert_int_eq(raw_int(dbpath, "SELECT count(*) FROM pragma_table_info('samples') WHERE "
                                     "name IN ('sink_mass', 'distance')"), 2);
    ck_assert_int_eq(raw_int(dbpath, "SELECT count(*) FROM samples WHERE sink_mass IS NOT NULL OR "
                                     "distance IS NOT NULL"), 0);
    ck_assert_int_eq(raw_int(dbpath, "SELECT count(*) FROM history WHERE substr(data, 1, 1) != "
                                     "x'01'"), 0); /* no BLOB rewritten: version-1 rows */

    /* the runs, with their stored thresholds */
    store_error err = {0};
    ngot_runs = 0;
    ck_assert_int_eq(store_list_runs(st, grab_run, NULL, &err), STORE_OK);
    ck_assert_int_eq(ngot_runs, FX_RUNS);
    for (int r = 0; r < FX_RUNS; r++) {
        const run_copy *c = &got_runs[r];
        ck_assert_str_eq(c->name, fx_names[r]);
        ck_assert_int_eq(c->r.rank, fx_ranks[r]);
        ck_assert_str_eq(c->host, "fx-node");
        ck_assert_int_eq(c->r.pid, 4242 + r);
        ck_assert_int_eq(c->r.started_ms, 90000 + r);
        ck_assert_str_eq(c->config, fx_configs[r] ? fx_configs[r] : "(null)");
        ck_assert_str_eq(c->thresholds, fx_thresholds[r]);
        ck_assert_int_eq(c->r.has_owner, r != 1);
        if (r != 1)
            ck_assert_uint_eq(c->r.owner_uid, 1000 + (uint32_t)r);
        ck_assert_int_eq(c->r.samples, r < 2 ? FX_STEPS * FX_LAYERS * FX_HEADS : 0);
        if (r < 2) {
            ck_assert_int_eq(c->r.step_min, 0);
            ck_assert_int_eq(c->r.step_max, FX_STEPS - 1);
            ck_assert_int_eq(c->r.last_time_ms, FX_TIME(r, FX_STEPS - 1));
        }
        ck_assert_int_eq(c->r.ended_ms, r == 2 ? 95000 : 0);
        ck_assert_str_eq(c->reason, r == 2 ? "finished" : "(null)");
    }

    /* every sample: exact and compact rows against the seed's values, buckets against version
     * 4's export, all three tiers present, every sample once */
    int buckets = 0;
    for (int r = 0; r < 2; r++) {
        int tiers[3] = {0};
        int64_t covered = 0;
        kept_vec v = read_run(st, got_runs[r].r.id);
        check_samples(&v, r, &covered, tiers);
        ck_assert_msg(tiers[0] && tiers[1] && tiers[2], "run %d tiers %d %d %d", r, tiers[0],
                      tiers[1], tiers[2]);
        ck_assert_int_eq(covered, FX_STEPS * FX_LAYERS * FX_HEADS);
        int b = check_buckets(&v, got_runs[r].r.id);
        ck_assert_int_eq(b, tiers[2]);
        buckets += b;
        free(v.v);
    }
    ck_assert_int_eq(buckets, 2 * FX_LAYERS * FX_HEADS * (FX_BUCKETED_BELOW / FX_BUCKET_STEPS));
    /* the alerts, as raised */
    rows_vec al = {0};
    ck_assert_int_eq(store_alerts(st, 0, 0, collect_alert, &al, &err), STORE_OK);
    ck_assert_int_eq(al.n, 4);
    store_close(st);

    /* and through a read-only handle, as the CLI reads it */
    st = store_open_readonly(dbpath, 0, &err);
    ck_assert_msg(st != NULL, "%s", err.msg);
    kept_vec v = read_run(st, got_runs[1].r.id);
    int tiers[3] = {0};
    int64_t covered = 0;
    check_samples(&v, 1, &covered, tiers);
    ck_assert_int_eq(covered, FX_STEPS * FX_LAYERS * FX_HEADS);
    free(v.v);
    store_close(st);
}
END_TEST

/* ---- new samples beside the old ones ------------------------------------------------------------ */

enum { NEW_FROM = FX_STEPS, NEW_TO = 2 * FX_STEPS - 1 }; /* steps 32 .. 63 */

START_TEST(test_v4_new_rows_every_tier)
{
    copy_fixture();
    store *st = open_ok(dbpath);
    store_error err = {0};
    ngot_runs = 0;
    ck_assert_int_eq(store_list_runs(st, grab_run, NULL, &err), STORE_OK);
    int64_t run = got_runs[0].r.id;
    static stats_head pushed[NEW_TO + 1][FX_LAYERS][FX_HEADS];
    int finite = 0;
    for (int s = NEW_FROM; s <= NEW_TO; s++) {
        for (int l = 0; l < FX_LAYERS; l++) {
            for (int h = 0; h < FX_HEADS; h++) {
                pushed[s][l][h] = rand_head(1); /* sink_mass in [0, 1), distance in [0, 2048) */
                finite += isfinite(pushed[s][l][h].sink_mass) != 0;
            }
            ck_assert_msg(store_add_samples(st, run, s, l, pushed[s][l], FX_HEADS,
                                            FX_TIME(0, s), &err) == STORE_OK, "%s", err.msg);
        }
        ck_assert_int_eq(store_commit(st, &err), STORE_OK);
    }
    ck_assert_int_gt(finite, 0);
    ck_assert_int_gt(raw_int(dbpath, "SELECT count(*) FROM samples WHERE sink_mass > 0 AND "
                                     "distance > 0"), 0);
    /* steps before 48 into buckets of 8, the 4 newest exact, the rest compact (version 2) */
    store_retention p = {.exact_steps = 4, .retain_ms = FX_TIME(0, 64) - FX_TIME(0, 48),
                         .bucket_steps = 8, .now_ms = FX_TIME(0, 64)};
    retain_until_done(st, &p, 0);
    ck_assert_int_gt(raw_int(dbpath, "SELECT count(*) FROM history WHERE substr(data, 1, 1) = "
                                     "x'02'"), 0);
    kept_vec v = read_run(st, run);
    int tiers[3] = {0};
    for (int i = 0; i < v.n; i++) {
        const store_sample *s = &v.v[i].s;
        if (s->step < NEW_FROM)
            continue; /* the fixture's own steps: test_v4_reads_back */
        tiers[s->tier]++;
        char where[96];
        snprintf(where, sizeof where, "new step %" PRId64 " layer %d head %d tier %d", s->step,
                 s->layer, s->head, s->tier);
        if (s->tier != STORE_TIER_BUCKET) {
            stats_head want = pushed[s->step][s->layer][s->head];
            if (s->tier == STORE_TIER_COMPACT)
                store_pack_round(&want);
            assert_same_head(&s->stats, &want, where);
            continue;
        }
        /* a bucket: each new statistic's minimum, mean and maximum over the window's samples,
         * within the compact precision (1/65534 for sink_mass, binary32 for distance) */
        ck_assert_int_eq(s->step_last, s->step + 7);
        for (int f = 0; f < 2; f++) {
            double lo = INFINITY, hi = -INFINITY, sum = 0;
            int n = 0;
            for (int64_t t = s->step; t <= s->step_last; t++) {
                double x = f ? pushed[t][s->layer][s->head].distance
                             : pushed[t][s->layer][s->head].sink_mass;
                if (isnan(x))
                    continue;
                lo = fmin(lo, x), hi = fmax(hi, x), sum += x, n++;
            }
            double got[3] = {f ? v.v[i].lo.distance : v.v[i].lo.sink_mass,
                             f ? s->stats.distance : s->stats.sink_mass,
                             f ? v.v[i].hi.distance : v.v[i].hi.sink_mass};
            double want[3] = {lo, n ? sum / n : NAN, hi};
            for (int k = 0; k < 3; k++) {
                if (!n) {
                    ck_assert_msg(isnan(got[k]), "%s: %s %d %.17g of no value", where,
                                  f ? "distance" : "sink_mass", k, got[k]);
                    continue;
                }
                double tol = f ? 2 * ldexp(fabs(want[k]), -24) + 1e-12 : 1.0 / 65534;
                ck_assert_msg(fabs(got[k] - want[k]) <= tol, "%s: %s %d %.17g, want %.17g",
                              where, f ? "distance" : "sink_mass", k, got[k], want[k]);
            }
        }
    }
    ck_assert_msg(tiers[0] && tiers[1] && tiers[2], "new rows' tiers %d %d %d", tiers[0],
                  tiers[1], tiers[2]);
    free(v.v);
    store_close(st);
}
END_TEST

static Suite *make_v4_suite(void)
{
    Suite *s = suite_create("store v4 fixture");
    TCase *tc = tcase_create("version 4");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, test_v4_reads_back);
    tcase_add_test(tc, test_v4_new_rows_every_tier);
    tcase_set_timeout(tc, 60);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    seed_init("test_store_v4");
    SRunner *sr = srunner_create(make_v4_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
