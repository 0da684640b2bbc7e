/* test_store_migrate.c — Check suite for the store's migrations from schema versions 1 to 6
 * (schema/). Version 1: a database built exactly as version 1's code built it (schema/001_init.sql, then version 1's
 * statements, bound by name as it bound them: runs, samples pushed and pushed again, alerts), opened
 * by this code: every sample and every alert read back exactly, the runs' summaries, the new key of
 * the exact tier; then compacted, every sample at the compact precision; then through a read-only
 * handle. Version 2: the runs' owners move from the thresholds text into their column, alerts keep
 * their ids and states. Version 3: everything of runs and alerts that end is kept, the layout
 * columns (version 4) and the statistics' columns (version 5) added; a fresh database has them all.
 * Version 5: a database built from schema/001..005 with runs, samples and an alert opens at
 * version 6, keeps them, and stores and reads back interventions (which delete-run takes). Version
 * 6: every alert and silence kept, ids included, and ids never given again after delete-run. Reads
 * nothing private but STORE_EXACT_ROW_BYTES (store_internal.h).
 *
 * Random data comes from a seed printed at start (ATTNSTAT_TEST_SEED=<n> replays a run). Every test
 * works in its own temporary directory.
 */
#include "store_internal.h"
#include "store_retain.h"
#include "store_testutil.h"
#include "interv_testutil.h"

#ifndef ATTNSTAT_SCHEMA_DIR
#error "ATTNSTAT_SCHEMA_DIR (the schema/ folder) must be defined by the build"
#endif

/* ---- a version-1 database, built as version 1's code built it ---------------------------------- */

/* Version 1's statements (schema/store.c at schema version 1), bound by name as it bound them. */
static const char *const v1_run_upsert =
    "INSERT INTO runs (name, rank, host, pid, started, last_hello, config, thresholds) "
    "VALUES (:name, :rank, :host, :pid, :time, :time, :config, :thresholds) "
    "ON CONFLICT (name, rank) DO UPDATE SET host = excluded.host, pid = excluded.pid, "
    "last_hello = excluded.last_hello, config = excluded.config, "
    "thresholds = excluded.thresholds RETURNING id";
static const char *const v1_sample_insert =
    "INSERT INTO samples (run_id, layer, head, step, time, rows, rows_norm, rows_empty, "
    "nonfinite_rows, entropy_mean, entropy_std, entropy_min, entropy_max, entropy_norm_mean, "
    "collapsed_frac, max_logit, sampled) VALUES (:run, :layer, :head, :step, :time, :rows, "
    ":rows_norm, :rows_empty, :nonfinite_rows, :entropy_mean, :entropy_std, :entropy_min, "
    ":entropy_max, :entropy_norm_mean, :collapsed_frac, :max_logit, :sampled) "
    "ON CONFLICT (run_id, layer, head, step) DO NOTHING";
static const char *const v1_sample_update =
    "UPDATE samples SET time = :time, rows = :rows, rows_norm = :rows_norm, "
    "rows_empty = :rows_empty, nonfinite_rows = :nonfinite_rows, "
    "entropy_mean = :entropy_mean, entropy_std = :entropy_std, entropy_min = :entropy_min, "
    "entropy_max = :entropy_max, entropy_norm_mean = :entropy_norm_mean, "
    "collapsed_frac = :collapsed_frac, max_logit = :max_logit, sampled = :sampled "
    "WHERE run_id = :run AND layer = :layer AND head = :head AND step = :step";
static const char *const v1_run_summary =
    "UPDATE runs SET samples = samples + :added, "
    "step_min = min(coalesce(step_min, :step), :step), "
    "step_max = max(coalesce(step_max, :step), :step), "
    "last_time = max(coalesce(last_time, :time), :time) WHERE id = :run";
static const char *const v1_alert_insert =
    "INSERT INTO alerts (run_id, layer, head, step, rule, state, value, threshold, time, "
    "message) VALUES (:run, :layer, :head, :step, :rule, :state, :value, :threshold, :time, "
    ":message)";

static void v1_exec(sqlite3 *db, const char *sql)
{
    char *msg = NULL;
    ck_assert_msg(sqlite3_exec(db, sql, NULL, NULL, &msg) == SQLITE_OK, "%.80s: %s", sql,
                  msg ? msg : "?");
}

static sqlite3_stmt *v1_prep(sqlite3 *db, const char *sql)
{
    sqlite3_stmt *s = NULL;
    ck_assert_msg(sqlite3_prepare_v2(db, sql, -1, &s, NULL) == SQLITE_OK, "%s", sqlite3_errmsg(db));
    return s;
}

static void b_i64(sqlite3_stmt *s, const char *name, int64_t v)
{
    ck_assert_int_eq(sqlite3_bind_int64(s, sqlite3_bind_parameter_index(s, name), v), SQLITE_OK);
}

static void b_f64(sqlite3_stmt *s, const char *name, double v)
{
    int i = sqlite3_bind_parameter_index(s, name);
    ck_assert_int_eq(isnan(v) ? sqlite3_bind_null(s, i) : sqlite3_bind_double(s, i, v), SQLITE_OK);
}

static void b_text(sqlite3_stmt *s, const char *name, const char *v)
{
    int i = sqlite3_bind_parameter_index(s, name);
    ck_assert_int_eq(v ? sqlite3_bind_text(s, i, v, -1, SQLITE_TRANSIENT) : sqlite3_bind_null(s, i),
                     SQLITE_OK);
}

static void v1_bind_sample(sqlite3_stmt *s, int64_t run, int layer, int head, int64_t step,
                           int64_t time, const stats_head *h)
{
    b_i64(s, ":run", run);
    b_i64(s, ":layer", layer);
    b_i64(s, ":head", head);
    b_i64(s, ":step", step);
    b_i64(s, ":time", time);
    b_i64(s, ":rows", h->rows);
    b_i64(s, ":rows_norm", h->rows_norm);
    b_i64(s, ":rows_empty", h->rows_empty);
    b_i64(s, ":nonfinite_rows", h->nonfinite_rows);
    b_f64(s, ":entropy_mean", h->entropy_mean);
    b_f64(s, ":entropy_std", h->entropy_std);
    b_f64(s, ":entropy_min", h->entropy_min);
    b_f64(s, ":entropy_max", h->entropy_max);
    b_f64(s, ":entropy_norm_mean", h->entropy_norm_mean);
    b_f64(s, ":collapsed_frac", h->collapsed_frac);
    b_f64(s, ":max_logit", h->max_logit);
    b_i64(s, ":sampled", h->sampled);
}

enum { V1_RUNS = 3, V1_LAYERS = 4, V1_HEADS = 6, V1_STEPS = 40, V1_ALERTS = 30 };

typedef struct {
    int64_t run_id[V1_RUNS];
    int64_t steps[V1_RUNS][V1_STEPS];
    int nsteps[V1_RUNS];
    int have[V1_RUNS][V1_STEPS][V1_LAYERS][V1_HEADS];
    stats_head h[V1_RUNS][V1_STEPS][V1_LAYERS][V1_HEADS];
    int64_t time[V1_RUNS][V1_STEPS];
    store_alert alerts[V1_ALERTS];
    char rules[V1_ALERTS][24], msgs[V1_ALERTS][40];
} v1_truth;

/* Build a version-1 database at path (001_init.sql, then version 1's inserts) and say in *t what
 * it holds. Run 2 has no sample; samples are pushed again (replaced) as version 1 replaced them. */
static void v1_build(const char *path, v1_truth *t)
{
    sqlite3 *db = NULL;
    ck_assert_int_eq(sqlite3_open_v2(path, &db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, NULL),
                     SQLITE_OK);
    v1_exec(db, "PRAGMA journal_mode = WAL");
    v1_exec(db, "PRAGMA synchronous = NORMAL; PRAGMA foreign_keys = ON");
    char file[512];
    snprintf(file, sizeof file, "%s/001_init.sql", ATTNSTAT_SCHEMA_DIR);
    FILE *f = fopen(file, "rb");
    ck_assert_msg(f != NULL, "cannot read %s", file);
    static char sql[1 << 16];
    size_t n = fread(sql, 1, sizeof sql - 1, f);
    fclose(f);
    sql[n] = '\0';
    v1_exec(db, "BEGIN IMMEDIATE");
    v1_exec(db, sql);
    v1_exec(db, "PRAGMA user_version = 1; PRAGMA application_id = 1635021684");
    v1_exec(db, "COMMIT");

    sqlite3_stmt *run = v1_prep(db, v1_run_upsert), *ins = v1_prep(db, v1_sample_insert);
    sqlite3_stmt *upd = v1_prep(db, v1_sample_update), *sum = v1_prep(db, v1_run_summary);
    sqlite3_stmt *al = v1_prep(db, v1_alert_insert);
    memset(t, 0, sizeof *t);
    for (int r = 0; r < V1_RUNS; r++) {
        char name[16];
        snprintf(name, sizeof name, "v1run%d", r);
        b_text(run, ":name", name);
        b_i64(run, ":rank", r % 2);
        b_text(run, ":host", r ? "node" : NULL);
        b_i64(run, ":pid", 100 + r);
        b_i64(run, ":time", 1700000000000 + r);
        b_text(run, ":config", "{\"model\":\"v1\"}");
        b_text(run, ":thresholds", r == 1 ? "{\"entropy_floor\":0.2}" : NULL);
        ck_assert_int_eq(sqlite3_step(run), SQLITE_ROW);
        t->run_id[r] = sqlite3_column_int64(run, 0);
        sqlite3_reset(run);
        sqlite3_clear_bindings(run);
    }
    for (int r = 0; r < V1_RUNS - 1; r++) {
        int64_t step = rnd_range(-3, 10);
        t->nsteps[r] = V1_STEPS;
        for (int i = 0; i < V1_STEPS; i++, step += rnd_range(1, 9)) {
            t->steps[r][i] = step;
            t->time[r][i] = 1700000000000 + step * 1000;
            v1_exec(db, "BEGIN IMMEDIATE");
            for (int l = 0; l < V1_LAYERS; l++) {
                int nh = (l == 2 && i % 3 == 0) ? V1_HEADS - 2 : V1_HEADS; /* heads missing */
                for (int pass = 0; pass < (i % 7 == 0 ? 2 : 1); pass++) { /* pushed again */
                    int64_t added = 0;
                    for (int h = 0; h < nh; h++) {
                        stats_head x = rand_head(1);
                        x.sink_mass = x.distance = NAN; /* no column for them in version 1 */
                        if (rnd() % 5 == 0 && x.rows > 0) {
                            x.entropy_mean = rand_bits_double();
                            x.max_logit = rand_bits_double();
                        }
                        t->h[r][i][l][h] = x;
                        t->have[r][i][l][h] = 1;
                        v1_bind_sample(ins, t->run_id[r], l, h, step, t->time[r][i], &x);
                        ck_assert_int_eq(sqlite3_step(ins), SQLITE_DONE);
                        if (sqlite3_changes(db) > 0) {
                            added++;
                        } else {
                            v1_bind_sample(upd, t->run_id[r], l, h, step, t->time[r][i], &x);
                            ck_assert_int_eq(sqlite3_step(upd), SQLITE_DONE);
                            sqlite3_reset(upd);
                            sqlite3_clear_bindings(upd);
                        }
                        sqlite3_reset(ins);
                        sqlite3_clear_bindings(ins);
                    }
                    b_i64(sum, ":added", added);
                    b_i64(sum, ":step", step);
                    b_i64(sum, ":time", t->time[r][i]);
                    b_i64(sum, ":run", t->run_id[r]);
                    ck_assert_int_eq(sqlite3_step(sum), SQLITE_DONE);
                    sqlite3_reset(sum);
                    sqlite3_clear_bindings(sum);
                }
            }
            v1_exec(db, "COMMIT");
        }
    }
    static const char *rules[] = {"entropy_floor", "entropy_drop", "logit_ceiling", "nonfinite"};
    for (int a = 0; a < V1_ALERTS; a++) {
        store_alert *x = &t->alerts[a];
        int r = (int)rnd_range(0, 1);
        snprintf(t->rules[a], sizeof t->rules[a], "%s", rules[rnd() % 4]);
        snprintf(t->msgs[a], sizeof t->msgs[a], "alert %d", a);
        *x = (store_alert){.run_id = t->run_id[r], .layer = (int32_t)rnd_range(0, V1_LAYERS - 1),
                           .head = (int32_t)rnd_range(0, V1_HEADS - 1),
                           .step = t->steps[r][rnd() % V1_STEPS], .rule = t->rules[a],
                           .state = rnd() % 2 ? STORE_ALERT_RAISED : STORE_ALERT_CLEARED,
                           .value = rnd() % 4 ? rand_bits_double() : NAN,
                           .threshold = rnd() % 4 ? rnd_unit() : NAN,
                           .time_ms = 1700000000000 + a,
                           .message = a % 3 ? t->msgs[a] : NULL};
        b_i64(al, ":run", x->run_id);
        b_i64(al, ":layer", x->layer);
        b_i64(al, ":head", x->head);
        b_i64(al, ":step", x->step);
        b_text(al, ":rule", x->rule);
        b_text(al, ":state", x->state == STORE_ALERT_RAISED ? "raised" : "cleared");
        b_f64(al, ":value", x->value);
        b_f64(al, ":threshold", x->threshold);
        b_i64(al, ":time", x->time_ms);
        b_text(al, ":message", x->message);
        ck_assert_int_eq(sqlite3_step(al), SQLITE_DONE);
        x->id = sqlite3_last_insert_rowid(db);
        sqlite3_reset(al);
        sqlite3_clear_bindings(al);
    }
    sqlite3_stmt *all[] = {run, ins, upd, sum, al};
    for (int i = 0; i < 5; i++)
        sqlite3_finalize(all[i]);
    ck_assert_int_eq(sqlite3_close(db), SQLITE_OK);
}

static int64_t v1_count(const v1_truth *t, int r)
{
    int64_t n = 0;
    for (int i = 0; i < t->nsteps[r]; i++)
        for (int l = 0; l < V1_LAYERS; l++)
            for (int h = 0; h < V1_HEADS; h++)
                n += t->have[r][i][l][h];
    return n;
}

typedef struct {
    store_alert v[64];
    char rule[64][24], msg[64][40];
    int n;
} alerts_vec;

static int collect_full_alert(void *ctx, const store_alert *a)
{
    alerts_vec *v = ctx;
    if (v->n < 64) {
        v->v[v->n] = *a;
        snprintf(v->rule[v->n], sizeof v->rule[0], "%s", a->rule);
        snprintf(v->msg[v->n], sizeof v->msg[0], "%s", a->message ? a->message : "(null)");
    }
    v->n++;
    return 0;
}

/* Every sample of the truth read back through the grid of its step: exactly, or (compact) at the
 * compact precision. */
static void v1_check_samples(store *st, const v1_truth *t, int compacted_below_latest)
{
    store_error err = {0};
    for (int r = 0; r < V1_RUNS - 1; r++)
        for (int i = 0; i < t->nsteps[r]; i++) {
            samples_vec v = {0};
            ck_assert_msg(store_grid(st, t->run_id[r], t->steps[r][i], NULL, collect_sample, &v,
                                     &err) == STORE_OK, "%s", err.msg);
            int k = 0;
            int compact = compacted_below_latest && i < t->nsteps[r] - 1;
            for (int l = 0; l < V1_LAYERS; l++)
                for (int h = 0; h < V1_HEADS; h++) {
                    if (!t->have[r][i][l][h])
                        continue;
                    ck_assert_int_lt(k, v.n);
                    const store_sample *s = &v.v[k++];
                    ck_assert_int_eq(s->layer, l);
                    ck_assert_int_eq(s->head, h);
                    ck_assert_int_eq(s->time_ms, t->time[r][i]);
                    ck_assert_int_eq(s->tier, compact ? STORE_TIER_COMPACT : STORE_TIER_EXACT);
                    stats_head want = t->h[r][i][l][h];
                    if (compact)
                        store_pack_round(&want);
                    char where[96];
                    snprintf(where, sizeof where, "run %d step %" PRId64 " layer %d head %d", r,
                             t->steps[r][i], l, h);
                    assert_same_head(&s->stats, &want, where);
                }
            ck_assert_int_eq(k, v.n);
            free(v.v);
        }
}

START_TEST(test_migrate_v1)
{
    static v1_truth t;
    v1_build(dbpath, &t);
    ck_assert_int_eq(raw_int(dbpath, "PRAGMA user_version"), 1);
    int64_t rows_v1 = raw_int(dbpath, "SELECT count(*) FROM samples");
    ck_assert_int_eq(rows_v1, v1_count(&t, 0) + v1_count(&t, 1));

    /* a read-only open refuses the old schema; the writer migrates it */
    store_error err = {0};
    ck_assert_ptr_null(store_open_readonly(dbpath, 0, &err));
    ck_assert_msg(strstr(err.msg, "older"), "%s", err.msg);
    store *st = open_ok(dbpath);
    ck_assert_int_eq(raw_int(dbpath, "PRAGMA user_version"), store_schema_version());
    ck_assert_int_eq(store_integrity_check(st, &err), STORE_OK);
    ck_assert_int_eq(raw_int(dbpath, "SELECT count(*) FROM samples"), rows_v1);
    ck_assert_int_eq(raw_int(dbpath, "SELECT count(*) FROM sqlite_schema WHERE name = 'samples' "
                                     "AND sql LIKE '%PRIMARY KEY (run_id, step, layer, head)%'"), 1);
    /* runs: summaries, names, texts */
    rows_vec rv = {0};
    ck_assert_int_eq(store_list_runs(st, collect_run, &rv, &err), STORE_OK);
    ck_assert_int_eq(rv.n, V1_RUNS);
    for (int r = 0; r < V1_RUNS; r++) {
        ck_assert_int_eq(rv.ids[r], t.run_id[r]);
        ck_assert_int_eq(rv.runs[r].samples, v1_count(&t, r));
        ck_assert_int_eq(rv.runs[r].bytes, v1_count(&t, r) * STORE_EXACT_ROW_BYTES);
        ck_assert_int_eq(rv.runs[r].retain_ms, -1);
        if (r < V1_RUNS - 1) {
            ck_assert_int_eq(rv.runs[r].step_min, t.steps[r][0]);
            ck_assert_int_eq(rv.runs[r].step_max, t.steps[r][V1_STEPS - 1]);
            ck_assert_int_eq(rv.runs[r].last_time_ms, t.time[r][V1_STEPS - 1]);
        }
    }
    v1_check_samples(st, &t, 0);
    /* alerts: every transition, in order, every field; and again after compaction */
    for (int pass = 0; pass < 2; pass++) {
        static alerts_vec av;
        av.n = 0;
        ck_assert_int_eq(store_alerts(st, 0, 0, collect_full_alert, &av, &err), STORE_OK);
        ck_assert_int_eq(av.n, V1_ALERTS);
        for (int a = 0; a < V1_ALERTS; a++) {
            const store_alert *g = &av.v[a], *w = &t.alerts[a];
            ck_assert_int_eq(g->id, w->id);
            ck_assert_int_eq(g->run_id, w->run_id);
            ck_assert_int_eq(g->layer, w->layer);
            ck_assert_int_eq(g->head, w->head);
            ck_assert_int_eq(g->step, w->step);
            ck_assert_int_eq(g->state, w->state);
            ck_assert_int_eq(g->time_ms, w->time_ms);
            ck_assert_str_eq(av.rule[a], w->rule);
            ck_assert_str_eq(av.msg[a], w->message ? w->message : "(null)");
            ck_assert(same_double(g->value, w->value) && same_double(g->threshold, w->threshold));
        }
        if (pass == 0) { /* compact the exact tier: every sample but each run's latest step */
            store_retention p = STORE_RETENTION_DEFAULT;
            p.exact_steps = 0;
            retain_until_done(st, &p, 500);
            v1_check_samples(st, &t, 1);
            int64_t n0 = 0;
            ck_assert_int_eq(store_count_samples(st, 0, &n0, &err), STORE_OK);
            ck_assert_int_eq(n0, rows_v1);
            int64_t latest = 0; /* the exact tier keeps each run's latest step */
            for (int r = 0; r < V1_RUNS - 1; r++)
                for (int l = 0; l < V1_LAYERS; l++)
                    for (int h = 0; h < V1_HEADS; h++)
                        latest += t.have[r][V1_STEPS - 1][l][h];
            ck_assert_int_eq(raw_int(dbpath, "SELECT count(*) FROM samples"), latest);
            ck_assert_int_gt(raw_int(dbpath, "SELECT count(*) FROM history"), 0);
        }
    }
    store_close(st);
    /* the migrated database reads through a read-only handle too */
    st = store_open_readonly(dbpath, 0, &err);
    ck_assert_msg(st != NULL, "%s", err.msg);
    v1_check_samples(st, &t, 1);
    store_close(st);
}
END_TEST

/* ---- version 2 -> 3: the owner out of the thresholds text, alerts that end ------------------------ */

static void exec_file(sqlite3 *db, const char *name)
{
    char file[512];
    snprintf(file, sizeof file, "%s/%s", ATTNSTAT_SCHEMA_DIR, name);
    FILE *f = fopen(file, "rb");
    ck_assert_msg(f != NULL, "cannot read %s", file);
    static char sql[1 << 16];
    size_t n = fread(sql, 1, sizeof sql - 1, f);
    fclose(f);
    sql[n] = '\0';
    v1_exec(db, sql);
}

typedef struct {
    int n;
    int64_t id[16];
    int has_owner[16];
    uint32_t owner[16];
    char th[16][400];
    int state[16];
    char reason[16][16];
} v2_rows;

static int v2_run(void *ctx, const store_run *r)
{
    v2_rows *v = ctx;
    v->id[v->n] = r->id;
    v->has_owner[v->n] = r->has_owner;
    v->owner[v->n] = r->owner_uid;
    snprintf(v->th[v->n], sizeof v->th[0], "%s", r->thresholds ? r->thresholds : "(null)");
    v->n++;
    return 0;
}

static int v2_alert(void *ctx, const store_alert *a)
{
    v2_rows *v = ctx;
    v->id[v->n] = a->id;
    v->state[v->n] = a->state;
    snprintf(v->reason[v->n], sizeof v->reason[0], "%s", a->reason ? a->reason : "");
    v->n++;
    return 0;
}

/* A version-2 database (001 + 002, as attnstatd at version 2 left it: the owner inside the
 * thresholds text, after collapse_threshold), opened by this code: each owner is a column, the
 * thresholds text is what it was without the owner (byte for byte: the alert engine parses it),
 * a run without one has none; alerts keep their ids and states, clears get the reason "samples". */
START_TEST(test_migrate_v2_owner)
{
    sqlite3 *db = NULL;
    ck_assert_int_eq(sqlite3_open_v2(dbpath, &db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, NULL),
                     SQLITE_OK);
    v1_exec(db, "PRAGMA journal_mode = WAL");
    v1_exec(db, "BEGIN IMMEDIATE");
    exec_file(db, "001_init.sql");
    exec_file(db, "002_compact.sql");
    v1_exec(db, "PRAGMA user_version = 2; PRAGMA application_id = 1635021684");
    v1_exec(db, "COMMIT");
    uint32_t uid = (uint32_t)rnd_range(1, 4000000000u);
    double floor = 0.05 + rnd_unit() * 0.5;
    char th[400], tagged[460], sql[1200];
    snprintf(th, sizeof th, "{\"entropy_floor\":%.17g,\"entropy_drop\":0.5,\"ema_alpha\":0.05,"
             "\"ema_warmup\":20,\"logit_ceiling\":100,\"raise_after\":3,\"clear_after\":5,"
             "\"collapse_threshold\":0.10000000000000001}", floor);
    snprintf(tagged, sizeof tagged, "%.*s,\"owner_uid\":%u}", (int)strlen(th) - 1, th, uid);
    snprintf(sql, sizeof sql, "INSERT INTO runs (id, name, rank, started, last_hello, thresholds) "
             "VALUES (3, 'owned', 0, 1, 1, '%s'), (5, 'older', 0, 1, 1, '%s'), "
             "(6, 'bare', 1, 1, 1, NULL)", tagged, th);
    v1_exec(db, sql);
    v1_exec(db, "INSERT INTO alerts (id, run_id, layer, head, step, rule, state, time) VALUES "
                "(7, 3, 0, 1, 10, 'nonfinite', 'raised', 5), (9, 3, 0, 1, 11, 'nonfinite', "
                "'cleared', 6), (12, 5, 1, 0, 4, 'entropy_floor', 'raised', 7)");
    sqlite3_close(db);

    store *st = open_ok(dbpath);
    ck_assert_int_eq(raw_int(dbpath, "PRAGMA user_version"), store_schema_version());
    store_error err = {0};
    v2_rows r = {0};
    ck_assert_int_eq(store_list_runs(st, v2_run, &r, &err), STORE_OK);
    ck_assert_int_eq(r.n, 3);
    ck_assert(r.has_owner[0]);
    ck_assert_uint_eq(r.owner[0], uid);
    ck_assert_str_eq(r.th[0], th);
    ck_assert(!r.has_owner[1]);
    ck_assert_str_eq(r.th[1], th);
    ck_assert(!r.has_owner[2]);
    ck_assert_str_eq(r.th[2], "(null)");
    v2_rows a = {0};
    ck_assert_int_eq(store_alerts(st, 0, 0, v2_alert, &a, &err), STORE_OK);
    ck_assert_int_eq(a.n, 3);
    ck_assert_int_eq(a.id[0], 7);
    ck_assert_int_eq(a.id[1], 9);
    ck_assert_int_eq(a.id[2], 12);
    ck_assert_int_eq(a.state[1], STORE_ALERT_CLEARED);
    ck_assert_str_eq(a.reason[1], "samples");
    ck_assert_str_eq(a.reason[0], "");
    memset(&a, 0, sizeof a);
    ck_assert_int_eq(store_alerts(st, 0, 1, v2_alert, &a, &err), STORE_OK);
    ck_assert_int_eq(a.n, 1);
    ck_assert_int_eq(a.id[0], 12);
    /* the new state is accepted now */
    store_alert res = {.run_id = 5, .layer = 1, .head = 0, .step = 5, .rule = "entropy_floor",
                       .state = STORE_ALERT_RESOLVED, .value = NAN, .threshold = NAN,
                       .reason = "goodbye"};
    ck_assert_msg(store_add_alert(st, &res, &err) == STORE_OK, "%s", err.msg);
    ck_assert_int_eq(store_commit(st, &err), STORE_OK);
    memset(&a, 0, sizeof a);
    ck_assert_int_eq(store_alerts(st, 0, 1, v2_alert, &a, &err), STORE_OK);
    ck_assert_int_eq(a.n, 0);
    ck_assert_int_eq(raw_int(dbpath, "SELECT count(*) FROM pragma_foreign_key_check"), 0);
    store_close(st);
}
END_TEST

/* ---- version 3 -> 4, and a fresh database: both lines of changes meet ------------------------- */

/* The columns and tables of both version 3 (runs and alerts that end) and version 4 (the layout). */
static void assert_v3_and_v4(void)
{
    ck_assert_int_eq(raw_int(dbpath, "SELECT count(*) FROM pragma_table_info('runs') WHERE name IN "
                                      "('owner_uid', 'ended', 'end_reason', 'tp_rank', 'tp_size', "
                                      "'layer_offset', 'head_offset')"), 7);
    ck_assert_int_eq(raw_int(dbpath, "SELECT count(*) FROM pragma_table_info('alerts') WHERE name "
                                      "IN ('reason', 'uid', 'ack_uid', 'ack_time')"), 4);
    ck_assert_int_eq(raw_int(dbpath, "SELECT count(*) FROM sqlite_master WHERE name = 'silences'"),
                     1);
    /* and version 5's statistics (tests/test_store_v4.c migrates a version-4 file) */
    ck_assert_int_eq(raw_int(dbpath, "SELECT count(*) FROM pragma_table_info('samples') WHERE name "
                                      "IN ('sink_mass', 'distance')"), 2);
    /* and version 6's interventions */
    ck_assert_int_eq(raw_int(dbpath, "SELECT count(*) FROM pragma_table_info('interventions') "
                                      "WHERE name IN ('run_id', 'rank', 'step', 'time_ms', 'kind', "
                                      "'layer', 'heads', 'head_values', 'threshold', 'measured', "
                                      "'detail')"), 11);
    /* and version 7's ids never given again, the tables' indexes rebuilt with them */
    ck_assert_int_eq(raw_int(dbpath, "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND "
                                      "name IN ('alerts', 'silences') AND sql LIKE "
                                      "'%AUTOINCREMENT%'"), 2);
    ck_assert_int_eq(raw_int(dbpath, "SELECT count(*) FROM sqlite_master WHERE type = 'index' AND "
                                      "name IN ('alerts_key', 'alerts_step', 'silences_run')"), 3);
}

/* A database this code makes from nothing is at the last version and has both. */
START_TEST(test_fresh_has_every_version)
{
    ck_assert_int_eq(store_schema_version(), 7);
    store *st = open_ok(dbpath);
    store_close(st);
    ck_assert_int_eq(raw_int(dbpath, "PRAGMA user_version"), 7);
    assert_v3_and_v4();
}
END_TEST

/* A version-3 database (001 + 002 + 003 as files, with an owner, an ended run, a resolved alert,
 * an acknowledged raise and a silence) opens at version 4: everything of version 3 is kept and
 * the layout columns are there, NULL. */
START_TEST(test_migrate_v3_layout)
{
    sqlite3 *db = NULL;
    ck_assert_int_eq(sqlite3_open_v2(dbpath, &db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, NULL),
                     SQLITE_OK);
    v1_exec(db, "PRAGMA journal_mode = WAL");
    v1_exec(db, "BEGIN IMMEDIATE");
    exec_file(db, "001_init.sql");
    exec_file(db, "002_compact.sql");
    exec_file(db, "003_lifecycle.sql");
    v1_exec(db, "PRAGMA user_version = 3; PRAGMA application_id = 1635021684");
    v1_exec(db, "COMMIT");
    uint32_t uid = (uint32_t)rnd_range(1, 4000000000u), ack = (uint32_t)rnd_range(1, 60000);
    char sql[1200];
    snprintf(sql, sizeof sql, "INSERT INTO runs (id, name, rank, started, last_hello, owner_uid, "
             "ended, end_reason) VALUES (3, 'owned', 0, 1, 1, %u, 50, 'goodbye'), "
             "(4, 'live', 1, 1, 1, %u, NULL, NULL)", uid, uid);
    v1_exec(db, sql);
    snprintf(sql, sizeof sql, "INSERT INTO alerts (id, run_id, layer, head, step, rule, state, "
             "time, reason, uid, ack_uid, ack_time) VALUES "
             "(7, 3, 0, 1, 10, 'nonfinite', 'raised', 5, NULL, NULL, %u, 9), "
             "(8, 3, 0, 1, 10, 'nonfinite', 'resolved', 6, 'operator', %u, NULL, NULL), "
             "(9, 4, 2, 3, 12, 'entropy_floor', 'raised', 7, NULL, NULL, NULL, NULL)", ack, uid);
    v1_exec(db, sql);
    v1_exec(db, "INSERT INTO silences (run_id, layer, head, rule, uid, time, until) VALUES "
                "(4, 2, 3, 'entropy_floor', 17, 8, NULL)");
    sqlite3_close(db);

    store *st = open_ok(dbpath);
    ck_assert_int_eq(raw_int(dbpath, "PRAGMA user_version"), store_schema_version());
    assert_v3_and_v4();
    store_error err = {0};
    v2_rows r = {0};
    ck_assert_int_eq(store_list_runs(st, v2_run, &r, &err), STORE_OK);
    ck_assert_int_eq(r.n, 2);
    ck_assert(r.has_owner[0] && r.has_owner[1]);
    ck_assert_uint_eq(r.owner[0], uid);
    char q[200];
    snprintf(q, sizeof q, "SELECT count(*) FROM runs WHERE end_reason = 'goodbye' AND ended = 50 "
             "AND owner_uid = %u AND tp_rank IS NULL AND head_offset IS NULL", uid);
    ck_assert_int_eq(raw_int(dbpath, q), 1);
    snprintf(q, sizeof q, "SELECT count(*) FROM alerts WHERE (id = 7 AND ack_uid = %u AND "
             "ack_time = 9) OR (id = 8 AND state = 'resolved' AND uid = %u)", ack, uid);
    ck_assert_int_eq(raw_int(dbpath, q), 2);
    v2_rows a = {0};
    ck_assert_int_eq(store_alerts(st, 0, 1, v2_alert, &a, &err), STORE_OK);
    ck_assert_int_eq(a.n, 1); /* 9: 7 was resolved by 8 */
    ck_assert_int_eq(a.id[0], 9);
    ck_assert_int_eq(raw_int(dbpath, "SELECT count(*) FROM silences WHERE uid = 17"), 1);
    /* and a layout can be recorded on the migrated run */
    store_layout l = {0, 2, 0, 1, 0, 1, 0, 1, 0, -1};
    ck_assert_msg(store_run_set_layout(st, 4, &l, &err) == STORE_OK, "%s", err.msg);
    ck_assert_int_eq(raw_int(dbpath, "SELECT count(*) FROM runs WHERE id = 4 AND tp_size = 2"), 1);
    ck_assert_int_eq(raw_int(dbpath, "SELECT count(*) FROM pragma_foreign_key_check"), 0);
    store_close(st);
}
END_TEST

/* ---- version 5 -> 6: interventions ------------------------------------------------------------ */

/* A database at dbpath as attnstatd at schema version v left it: migrations 001 .. v as files,
 * user_version v; open, for the caller's rows. */
static sqlite3 *db_at_version(int v)
{
    static const char *const files[] = {"001_init.sql", "002_compact.sql", "003_lifecycle.sql",
                                        "004_layout.sql", "005_stats.sql", "006_interventions.sql"};
    ck_assert_int_le(v, (int)(sizeof files / sizeof files[0]));
    sqlite3 *db = NULL;
    ck_assert_int_eq(sqlite3_open_v2(dbpath, &db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, NULL),
                     SQLITE_OK);
    v1_exec(db, "PRAGMA journal_mode = WAL");
    v1_exec(db, "BEGIN IMMEDIATE");
    for (int i = 0; i < v; i++)
        exec_file(db, files[i]);
    char sql[128];
    snprintf(sql, sizeof sql, "PRAGMA user_version = %d; PRAGMA application_id = 1635021684", v);
    v1_exec(db, sql);
    v1_exec(db, "COMMIT");
    return db;
}


/* A version-5 database (001 .. 005 as files, two runs with random samples and an alert) opens at
 * version 6: the rows are kept, and interventions of both runs are stored and read back exactly;
 * deleting one run takes its interventions and only its. */
START_TEST(test_migrate_v5_interventions)
{
    sqlite3 *db = db_at_version(5);
    v1_exec(db, "INSERT INTO runs (id, name, rank, started, last_hello, owner_uid, tp_rank, "
                "tp_size) VALUES (11, 'clip', 0, 1, 1, 1000, 0, 2), (12, 'clip', 1, 1, 1, 1000, 1, "
                "2)");
    int64_t want_sum = 0;
    for (int r = 11; r <= 12; r++)
        for (int step = 0; step < 5; step++)
            for (int h = 0; h < 4; h++) {
                int64_t rows = rnd_range(1, 1000);
                want_sum += rows;
                char sql[400];
                snprintf(sql, sizeof sql, "INSERT INTO samples (run_id, layer, head, step, time, "
                         "rows, rows_norm, rows_empty, nonfinite_rows, entropy_mean, sink_mass) "
                         "VALUES (%d, 2, %d, %d, %d, %lld, %lld, 0, 0, %.17g, %.17g)", r,
                         (r - 11) * 4 + h, step, 100 + step, (long long)rows, (long long)rows,
                         rnd_unit() * 3.0, rnd_unit());
                v1_exec(db, sql);
            }
    v1_exec(db, "INSERT INTO alerts (id, run_id, layer, head, step, rule, state, time) VALUES "
                "(5, 12, 2, 6, 3, 'logit_ceiling', 'raised', 103)");
    sqlite3_close(db);

    store *st = open_ok(dbpath);
    ck_assert_int_eq(raw_int(dbpath, "PRAGMA user_version"), store_schema_version());
    assert_v3_and_v4();
    ck_assert_int_eq(raw_int(dbpath, "SELECT sum(rows) FROM samples"), want_sum);
    ck_assert_int_eq(raw_int(dbpath, "SELECT count(*) FROM alerts WHERE id = 5"), 1);
    ck_assert_int_eq(raw_int(dbpath, "SELECT count(*) FROM interventions"), 0);

    enum { N = 12 };
    static iv_copy want[N];
    store_error err = {0};
    for (int i = 0; i < N; i++) {
        iv_random(&want[i], 11 + i % 2, i % 2);
        want[i].iv.step = i; /* read back in this order: run, then step */
        ck_assert_msg(store_add_intervention(st, &want[i].iv, &want[i].iv.id, &err) == STORE_OK,
                      "%s", err.msg);
    }
    ck_assert_msg(store_commit(st, &err) == STORE_OK, "%s", err.msg);
    static iv_list got;
    got.n = 0;
    ck_assert_int_eq(store_interventions(st, 0, iv_collect, &got, &err), STORE_OK);
    ck_assert_int_eq(got.n, N);
    for (int k = 0; k < N; k++) {
        int i = k < N / 2 ? 2 * k : 2 * (k - N / 2) + 1; /* run 11's, then run 12's */
        iv_assert_same(&got.v[k], &want[i], "migrated");
    }
    int done = 0;
    while (!done)
        ck_assert_msg(store_delete_run(st, 12, 0, &done, &err) == STORE_OK, "%s", err.msg);
    ck_assert_int_eq(raw_int(dbpath, "SELECT count(*) FROM interventions WHERE run_id = 12"), 0);
    ck_assert_int_eq(raw_int(dbpath, "SELECT count(*) FROM interventions WHERE run_id = 11"), N / 2);
    ck_assert_int_eq(raw_int(dbpath, "SELECT count(*) FROM alerts"), 0);
    ck_assert_int_eq(raw_int(dbpath, "SELECT count(*) FROM pragma_foreign_key_check"), 0);
    free(got.v);
    store_close(st);
}
END_TEST

/* ---- version 6 -> 7: ids never given again ---------------------------------------------------- */

/* Every row of a table as one text (each column of cols quoted by SQLite), in id order. */
static char *table_text(const char *table, const char *cols)
{
    sqlite3 *db = NULL;
    ck_assert_int_eq(sqlite3_open_v2(dbpath, &db, SQLITE_OPEN_READONLY, NULL), SQLITE_OK);
    char expr[600] = "quote(", sql[900];
    size_t n = strlen(expr);
    for (const char *c = cols; *c && n + 16 < sizeof expr; c++) {
        if (*c == ' ')
            n += (size_t)snprintf(expr + n, sizeof expr - n, ")||','||quote(");
        else
            expr[n++] = *c;
    }
    snprintf(expr + n, sizeof expr - n, ")");
    snprintf(sql, sizeof sql, "SELECT group_concat(r, ';') FROM (SELECT %s AS r FROM %s ORDER BY "
             "id)", expr, table);
    sqlite3_stmt *st = NULL;
    char *out = NULL;
    if (sqlite3_prepare_v2(db, sql, -1, &st, NULL) == SQLITE_OK && sqlite3_step(st) == SQLITE_ROW)
        out = strdup(sqlite3_column_text(st, 0) ? (const char *)sqlite3_column_text(st, 0) : "");
    ck_assert_msg(out != NULL, "reading %s: %s", table, sqlite3_errmsg(db));
    sqlite3_finalize(st);
    sqlite3_close(db);
    return out;
}

/* One alert and one silence of run r, through the store; their ids to *alert and *silence. */
static void add_alert_and_silence(store *st, int64_t r, int64_t *alert, int64_t *silence)
{
    store_error err = {0};
    store_alert a = {.run_id = r, .layer = 1, .head = 2, .step = 9, .rule = "entropy_floor",
                     .state = STORE_ALERT_RAISED, .value = rnd_unit(), .threshold = 0.5,
                     .message = "new"};
    ck_assert_msg(store_add_alert(st, &a, &err) == STORE_OK, "%s", err.msg);
    store_silence s = {.run_id = r, .layer = 1, .head = 2, .rule = "entropy_floor", .uid = 1000,
                       .time_ms = 0, .until_ms = 0};
    ck_assert_msg(store_add_silence(st, &s, silence, &err) == STORE_OK, "%s", err.msg);
    ck_assert_msg(store_commit(st, &err) == STORE_OK, "%s", err.msg);
    *alert = raw_int(dbpath, "SELECT max(id) FROM alerts");
}

static void delete_run(store *st, int64_t r)
{
    store_error err = {0};
    int done = 0;
    while (!done)
        ck_assert_msg(store_delete_run(st, r, 0, &done, &err) == STORE_OK, "%s", err.msg);
}

/* A version-6 database (001 .. 006 as files) whose alerts and silences have every column set
 * opens at version 7 with every row as it was, ids included; after delete-run takes the run that
 * holds the largest ids, a new alert and a new silence get ids above every one given before
 * (version 6 gave the deleted ones again: a stale `alerts ack --id` acted on a new alert). */
START_TEST(test_migrate_v6_ids)
{
    sqlite3 *db = db_at_version(6);
    v1_exec(db, "INSERT INTO runs (id, name, rank, started, last_hello, owner_uid) VALUES "
                "(21, 'keep', 0, 1, 1, 1000), (22, 'gone', 0, 1, 1, 1000)");
    static const char *const states[] = {"raised", "cleared", "resolved"};
    for (int i = 1; i <= 6; i++) {
        char sql[700];
        snprintf(sql, sizeof sql, "INSERT INTO alerts (id, run_id, layer, head, step, rule, state, "
                 "value, threshold, time, message, reason, uid, ack_uid, ack_time) VALUES (%d, %d, "
                 "%d, %d, %d, 'logit_ceiling', '%s', %.17g, %.17g, %d, 'm%d', %s, %s, %s, %s)",
                 i, i <= 3 ? 21 : 22, (int)rnd_range(0, 40), (int)rnd_range(0, 63), 10 * i,
                 states[i % 3], rnd_unit() * 100.0, 50.0, 1000 + i, i,
                 i % 3 ? "'samples'" : "NULL", i % 3 == 2 ? "1001" : "NULL",
                 i % 3 == 0 ? "1002" : "NULL", i % 3 == 0 ? "2000" : "NULL");
        v1_exec(db, sql);
    }
    v1_exec(db, "INSERT INTO silences (id, run_id, layer, head, rule, uid, time, until) VALUES "
                "(1, 21, 3, 4, 'nonfinite', 1000, 500, NULL), (2, 22, 5, 6, 'entropy_floor', 1001, "
                "600, 900)");
    sqlite3_close(db);
    static const char *const acols = "id run_id layer head step rule state value threshold time "
                                     "message reason uid ack_uid ack_time";
    static const char *const scols = "id run_id layer head rule uid time until";
    char *alerts = table_text("alerts", acols), *silences = table_text("silences", scols);

    store *st = open_ok(dbpath);
    ck_assert_int_eq(raw_int(dbpath, "PRAGMA user_version"), 7);
    assert_v3_and_v4();
    char *alerts2 = table_text("alerts", acols), *silences2 = table_text("silences", scols);
    ck_assert_str_eq(alerts2, alerts);
    ck_assert_str_eq(silences2, silences);
    ck_assert_int_eq(raw_int(dbpath, "SELECT count(*) FROM pragma_foreign_key_check"), 0);
    ck_assert_int_eq(raw_int(dbpath, "SELECT count(*) FROM pragma_integrity_check WHERE "
                                      "integrity_check = 'ok'"), 1);

    delete_run(st, 22);
    ck_assert_int_eq(raw_int(dbpath, "SELECT count(*) FROM alerts"), 3);
    int64_t a = 0, s = 0;
    add_alert_and_silence(st, 21, &a, &s);
    ck_assert_int_eq(a, 7);
    ck_assert_int_eq(s, 3);
    store_close(st);
    free(alerts), free(silences), free(alerts2), free(silences2);
}
END_TEST

/* The same on a database made from nothing: a run's alerts and silences deleted with it, the next
 * ones of another run numbered above them, again after the store is opened anew. */
START_TEST(test_fresh_ids_never_given_again)
{
    store *st = open_ok(dbpath);
    int64_t r1 = begin_run(st, "keep", 0), r2 = begin_run(st, "gone", 0);
    int64_t a1 = 0, s1 = 0, a2 = 0, s2 = 0, a3 = 0, s3 = 0;
    add_alert_and_silence(st, r1, &a1, &s1);
    add_alert_and_silence(st, r2, &a2, &s2);
    ck_assert_int_gt(a2, a1);
    ck_assert_int_gt(s2, s1);
    delete_run(st, r2);
    store_close(st);
    st = open_ok(dbpath);
    add_alert_and_silence(st, r1, &a3, &s3);
    ck_assert_int_gt(a3, a2);
    ck_assert_int_gt(s3, s2);
    ck_assert_int_eq(raw_int(dbpath, "SELECT count(*) FROM alerts"), 2);
    store_close(st);
}
END_TEST

/* ---- runner ------------------------------------------------------------------------------------ */

static Suite *make_migrate_suite(void)
{
    Suite *s = suite_create("store migration");
    TCase *tc = tcase_create("version 1");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, test_migrate_v1);
    tcase_add_test(tc, test_migrate_v2_owner);
    tcase_add_test(tc, test_migrate_v3_layout);
    tcase_add_test(tc, test_fresh_has_every_version);
    tcase_add_test(tc, test_migrate_v5_interventions);
    tcase_add_test(tc, test_migrate_v6_ids);
    tcase_add_test(tc, test_fresh_ids_never_given_again);
    tcase_set_timeout(tc, 300);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    seed_init("test_store_migrate");
    SRunner *sr = srunner_create(make_migrate_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
