/* test_store_history.c — Check suite for the store's history at scale (schema/): the migration
 * from schema version 1 (a database built as version 1's code built it, every sample and alert
 * read back), the three tiers read as one (trend with every/from/to, grid, a head pushed again
 * after compaction), the query plans (EXPLAIN QUERY PLAN: an index regression fails here, and the
 * check is shown to catch one), durability options, and export with its CSV / JSON-lines rows.
 * Reads the statements and the handle's connection through store_internal.h.
 *
 * Random data comes from a seed printed at start (ATTNSTAT_TEST_SEED=<n> replays a run). Every test
 * works in its own temporary directory.
 */
#include "store_internal.h"
#include "store_retain.h"
#include "store_testutil.h"

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
            store_retain_report rep;
            do
                ck_assert_msg(store_retain_step(st, &p, 500, &rep, &err) == STORE_OK, "%s",
                              err.msg);
            while (rep.more);
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

/* ---- the tiers read as one -------------------------------------------------------------------- */

enum { T_LAYERS = 3, T_HEADS = 5, T_STEPS = 160 };

typedef struct {
    int64_t steps[T_STEPS];
    int have[T_STEPS][T_LAYERS][T_HEADS];
    int tier[T_STEPS][T_LAYERS][T_HEADS];
    stats_head h[T_STEPS][T_LAYERS][T_HEADS];
    int64_t time[T_STEPS][T_LAYERS][T_HEADS];
} tmodel;

static void t_push(store *st, int64_t run, tmodel *m, int i, int l, int nh, int64_t time)
{
    stats_head hs[T_HEADS];
    for (int h = 0; h < nh; h++) {
        hs[h] = rand_head(1);
        m->h[i][l][h] = hs[h];
        m->have[i][l][h] = 1;
        m->tier[i][l][h] = STORE_TIER_EXACT;
        m->time[i][l][h] = time;
    }
    store_error err = {0};
    ck_assert_msg(store_add_samples(st, run, m->steps[i], l, hs, nh, time, &err) == STORE_OK, "%s",
                  err.msg);
}

/* Compact with exact_steps e, a small budget a call; the model follows. */
static void t_compact(store *st, tmodel *m, int64_t e)
{
    store_retention p = STORE_RETENTION_DEFAULT;
    p.exact_steps = e;
    store_retain_report rep;
    store_error err = {0};
    int calls = 0;
    do {
        ck_assert_msg(store_retain_step(st, &p, rnd_range(1, 400), &rep, &err) == STORE_OK, "%s",
                      err.msg);
        calls++;
    } while (rep.more);
    ck_assert_int_gt(calls, 0);
    for (int i = 0; i < T_STEPS; i++)
        if (m->steps[i] < compact_cutoff(m->steps[T_STEPS - 1], e))
            for (int l = 0; l < T_LAYERS; l++)
                for (int h = 0; h < T_HEADS; h++)
                    if (m->have[i][l][h])
                        m->tier[i][l][h] = STORE_TIER_COMPACT;
}

static void t_check_sample(const tmodel *m, int i, int l, int h, const store_sample *s)
{
    char where[96];
    snprintf(where, sizeof where, "step %" PRId64 " layer %d head %d", m->steps[i], l, h);
    ck_assert_msg(s->step == m->steps[i] && s->layer == l && s->head == h,
                  "%s: got step %" PRId64 " layer %d head %d", where, s->step, s->layer, s->head);
    ck_assert_msg(s->tier == m->tier[i][l][h], "%s: tier %d, expected %d", where, s->tier,
                  m->tier[i][l][h]);
    ck_assert_int_eq(s->time_ms, m->time[i][l][h]);
    ck_assert_int_eq(s->step_last, s->step);
    ck_assert_int_eq(s->merged, 1);
    ck_assert(s->min == NULL && s->max == NULL);
    stats_head want = m->h[i][l][h];
    if (m->tier[i][l][h] == STORE_TIER_COMPACT)
        store_pack_round(&want);
    assert_same_head(&s->stats, &want, where);
}

static void t_check(store *st, int64_t run, const tmodel *m)
{
    store_error err = {0};
    for (int trial = 0; trial < 60; trial++) {
        int a = (int)rnd_range(0, T_STEPS - 1), b = (int)rnd_range(a, T_STEPS - 1);
        int64_t from = m->steps[a] - (int64_t)(rnd() % 2), to = m->steps[b] + (int64_t)(rnd() % 2);
        if (trial == 0)
            from = INT64_MIN, to = INT64_MAX;
        int64_t every = trial % 4 == 0 ? 1 : rnd_range(2, 9);
        int head = trial % 3 == 0 ? -1 : (int)rnd_range(0, T_HEADS - 1);
        int layer = (int)rnd_range(0, T_LAYERS - 1);
        samples_vec v = {0};
        ck_assert_int_eq(store_trend(st, run, layer, head, from, to, every, collect_sample, &v,
                                     &err), STORE_OK);
        int idx = 0, k = 0;
        for (int i = 0; i < T_STEPS; i++) {
            if (m->steps[i] < from || m->steps[i] > to)
                continue;
            int any = 0;
            for (int h = 0; h < T_HEADS; h++)
                any |= m->have[i][layer][h] && (head < 0 || h == head);
            if (!any || k++ % every != 0)
                continue;
            for (int h = 0; h < T_HEADS; h++) {
                if (!m->have[i][layer][h] || (head >= 0 && h != head))
                    continue;
                ck_assert_msg(idx < v.n, "trial %d: %d rows, more expected", trial, v.n);
                t_check_sample(m, i, layer, h, &v.v[idx++]);
            }
        }
        ck_assert_msg(idx == v.n, "trial %d: %d rows, expected %d", trial, v.n, idx);
        free(v.v);
    }
    for (int i = 0; i < T_STEPS; i++) {
        samples_vec v = {0};
        ck_assert_int_eq(store_grid(st, run, m->steps[i], NULL, collect_sample, &v, &err),
                         STORE_OK);
        int idx = 0;
        for (int l = 0; l < T_LAYERS; l++)
            for (int h = 0; h < T_HEADS; h++)
                if (m->have[i][l][h]) {
                    ck_assert_int_lt(idx, v.n);
                    t_check_sample(m, i, l, h, &v.v[idx++]);
                }
        ck_assert_int_eq(idx, v.n);
        free(v.v);
    }
}

static int64_t t_count(const tmodel *m, int64_t below)
{
    int64_t n = 0;
    for (int i = 0; i < T_STEPS; i++)
        for (int l = 0; l < T_LAYERS; l++)
            for (int h = 0; h < T_HEADS; h++)
                n += m->have[i][l][h] && m->steps[i] >= below;
    return n;
}

START_TEST(test_tiers_read_as_one)
{
    static tmodel m;
    memset(&m, 0, sizeof m);
    store *st = open_ok(dbpath);
    int64_t run = begin_run(st, "tiers", 0), other = begin_run(st, "tiers", 1);
    store_error err = {0};
    int64_t step = rnd_range(-20, 20);
    for (int i = 0; i < T_STEPS; i++, step += rnd_range(1, 5)) {
        m.steps[i] = step;
        for (int l = T_LAYERS - 1; l >= 0; l--) {
            int nh = (l == 1 && i % 2) ? T_HEADS - 1 : T_HEADS; /* a head on even steps only */
            t_push(st, run, &m, i, l, nh, 5000 + i);
            stats_head hs[T_HEADS] = {rand_head(0)}; /* another run's rows between */
            ck_assert_int_eq(store_add_samples(st, other, step, l, hs, 1, 0, &err), STORE_OK);
        }
        if (i % 13 == 0)
            ck_assert_int_eq(store_commit(st, &err), STORE_OK);
    }
    ck_assert_int_eq(store_commit(st, &err), STORE_OK);
    t_check(st, run, &m);

    int64_t e = rnd_range(5, 40);
    t_compact(st, &m, e);
    int64_t cutoff = compact_cutoff(m.steps[T_STEPS - 1], e);
    char hot_sql[96];
    snprintf(hot_sql, sizeof hot_sql, "SELECT count(*) FROM samples WHERE run_id = %" PRId64, run);
    ck_assert_int_eq(raw_int(dbpath, hot_sql), t_count(&m, cutoff));
    t_check(st, run, &m);

    /* heads pushed again after compaction (heads 0 .. k-1 of a layer, as a push does), and in
     * the exact tier: the newest value wins, the other heads stay as they were */
    for (int r = 0; r < 12; r++) {
        int i = (int)rnd_range(0, T_STEPS - 1), l = (int)rnd_range(0, T_LAYERS - 1);
        t_push(st, run, &m, i, l, (int)rnd_range(1, T_HEADS), 9000 + r);
    }
    ck_assert_int_eq(store_commit(st, &err), STORE_OK);
    t_check(st, run, &m);
    /* compacted again: the pushed-again heads are merged into their rows; the count is exact */
    t_compact(st, &m, e);
    t_check(st, run, &m);
    int64_t n = 0;
    ck_assert_int_eq(store_count_samples(st, run, &n, &err), STORE_OK);
    ck_assert_int_eq(n, t_count(&m, INT64_MIN));
    ck_assert_int_eq(raw_int(dbpath, hot_sql), t_count(&m, cutoff));

    /* a batch sees itself: the grid of its newest step and the run's count before the commit */
    t_push(st, run, &m, T_STEPS - 1, 0, T_HEADS, 7777);
    int64_t used = 0, newest = m.steps[T_STEPS - 1] + 1; /* a new latest step, in this batch */
    samples_vec v = {0};
    stats_head hs[2] = {rand_head(0), rand_head(0)};
    ck_assert_int_eq(store_add_samples(st, run, newest, 0, hs, 2, 0, &err), STORE_OK);
    ck_assert_int_eq(store_grid(st, run, STORE_STEP_LATEST, &used, collect_sample, &v, &err),
                     STORE_OK);
    ck_assert_int_eq(used, newest);
    ck_assert_int_eq(v.n, 2);
    free(v.v);
    ck_assert_int_eq(store_count_samples(st, run, &n, &err), STORE_OK);
    ck_assert_int_eq(n, t_count(&m, INT64_MIN) + 2);
    ck_assert_int_eq(store_commit(st, &err), STORE_OK);
    store_close(st);
}
END_TEST

/* ---- query plans ------------------------------------------------------------------------------ */

/* The plan of statement id on the handle's connection, its lines joined by " | ". */
static void plan_of(store *st, int id, char *out, size_t len)
{
    char sql[4096];
    snprintf(sql, sizeof sql, "EXPLAIN QUERY PLAN %s", store_sql[id]);
    sqlite3_stmt *s = NULL;
    out[0] = '\0';
    if (sqlite3_prepare_v2(st->db, sql, -1, &s, NULL) != SQLITE_OK) { /* INDEXED BY a lost index */
        snprintf(out, len, "cannot prepare: %s", sqlite3_errmsg(st->db));
        return;
    }
    size_t used = 0;
    while (sqlite3_step(s) == SQLITE_ROW && used + 4 < len)
        used += (size_t)snprintf(out + used, len - used, "%s%s", used ? " | " : "",
                                 (const char *)sqlite3_column_text(s, 3));
    sqlite3_finalize(s);
}

/* What each statement's plan must (and must not) say: the index it searches. */
static const struct {
    int id;
    const char *must[3];
} plans[] = {
    {S_HOT_TREND_HEAD, {"SEARCH samples USING PRIMARY KEY (run_id=? AND step=? AND layer=? AND head=?)",
                        "SEARCH samples USING PRIMARY KEY (run_id=? AND step>?)"}},
    {S_HOT_TREND_LAYER, {"SEARCH samples USING PRIMARY KEY (run_id=? AND step=? AND layer=?)"}},
    {S_HOT_GRID, {"SEARCH samples USING PRIMARY KEY (run_id=? AND step=?)"}},
    {S_PACK_TREND, {"SEARCH history USING INDEX history_key (run_id=? AND layer=? AND step>? AND step<?)"}},
    {S_PACK_GRID, {"SEARCH history USING INDEX history_step (run_id=? AND step=?)"}},
    {S_COARSE_TREND, {"SEARCH coarse USING INDEX coarse_key (run_id=? AND layer=? AND step_lo<?)"}},
    {S_COARSE_AT, {"SEARCH coarse USING INDEX coarse_step (run_id=? AND step_lo=?)",
                   "SEARCH coarse USING COVERING INDEX coarse_step (run_id=? AND step_lo<?)"}},
    {S_LAYERS, {"SEARCH history USING COVERING INDEX history_key (run_id=? AND layer>?)",
                "SEARCH coarse USING COVERING INDEX coarse_key (run_id=? AND layer>?)",
                "SEARCH samples USING PRIMARY KEY (run_id=?)"}},
    {S_ALERTS_ACTIVE, {"SCAN alerts USING COVERING INDEX alerts_key"}},
    {S_ALERTS_ACTIVE_RUN, {"SEARCH alerts USING COVERING INDEX alerts_key (run_id=?)"}},
    {S_ALERTS_RUN, {"SEARCH alerts USING INDEX ", "(run_id=?)"}},
    {S_RUN_ONE, {"SEARCH runs USING INTEGER PRIMARY KEY (rowid=?)"}},
    {S_RUN_BY_NAME, {"sqlite_autoindex_runs_1 (name=?)"}},
    {S_HOT_MIN_STEP, {"SEARCH samples USING PRIMARY KEY (run_id=?)"}},
    {S_HOT_BLOCK, {"SEARCH samples USING PRIMARY KEY (run_id=? AND step>? AND step<?)"}},
    {S_HOT_DELETE, {"SEARCH samples USING PRIMARY KEY (run_id=? AND step>? AND step<?)"}},
    {S_PACK_GET, {"SEARCH history USING INDEX history_key (run_id=? AND layer=? AND step=?)"}},
    {S_PACK_NEXT_STEP, {"SEARCH history USING COVERING INDEX history_step (run_id=? AND step>?)"}},
    {S_PACK_WINDOW_TIME,
     {"SEARCH history USING COVERING INDEX history_step (run_id=? AND step>? AND step<?)"}},
    {S_NEXT_LAYER, {"SEARCH history USING COVERING INDEX history_key (run_id=? AND layer>?)"}},
    {S_PACK_DELETE, {"SEARCH history USING INDEX history_key (run_id=? AND layer=? AND step=?)"}},
    {S_ALERT_STEPS, {"SEARCH alerts USING INDEX alerts_step (run_id=? AND step>? AND step<?)"}},
    {S_COARSE_GET, {"SEARCH coarse USING INDEX coarse_key (run_id=? AND layer=? AND step_lo=?)"}},
    {S_DEL_HOT_BOUND, {"SEARCH samples USING PRIMARY KEY (run_id=?)"}},
    {S_DEL_HOT, {"SEARCH samples USING PRIMARY KEY (run_id=? AND step<?)"}},
    {S_DEL_PACK_BOUND, {"SEARCH history USING COVERING INDEX history_key (run_id=?)"}},
    {S_DEL_PACK, {"SEARCH history USING INDEX history_key (run_id=? AND (layer,step)<(?,?))"}},
    {S_DEL_COARSE, {"SEARCH coarse USING ", "(run_id=?)"}},
};

/* NULL when every plan is as it must be; otherwise what is wrong (a static buffer). Full scans of
 * the sample tables and sorts in temporary B-trees are wrong everywhere. */
static const char *check_plans(store *st)
{
    static char bad[8192];
    char plan[2048];
    bad[0] = '\0';
    size_t used = 0;
    for (size_t i = 0; i < sizeof plans / sizeof plans[0]; i++) {
        plan_of(st, plans[i].id, plan, sizeof plan);
        const char *why = NULL;
        for (int k = 0; k < 3 && plans[i].must[k] && !why; k++)
            if (!strstr(plan, plans[i].must[k]))
                why = plans[i].must[k];
        if (!why && (strstr(plan, "SCAN samples") || strstr(plan, "SCAN history") ||
                     strstr(plan, "SCAN coarse") ||
                     (strstr(plan, "SCAN alerts") && plans[i].id != S_ALERTS_ACTIVE)))
            why = "no full scan (the active alerts of every run walk the alerts_key index)";
        /* sorts: the layer list and a run's alerts (small) may; sample reads may not */
        if (!why && plans[i].id != S_LAYERS && plans[i].id != S_ALERTS_RUN &&
            strstr(plan, "TEMP B-TREE"))
            why = "no sort in a temporary B-tree";
        if (why && used < sizeof bad - 1)
            used += (size_t)snprintf(bad + used, sizeof bad - used,
                                     "statement %d: wants \"%s\"; plan: %s\n", plans[i].id, why,
                                     plan);
    }
    return used ? bad : NULL;
}

START_TEST(test_query_plans)
{
    store *st = open_ok(dbpath);
    int64_t run = begin_run(st, "plans", 0);
    store_error err = {0};
    stats_head hs[4] = {rand_head(0), rand_head(0), rand_head(0), rand_head(0)};
    for (int64_t s = 0; s < 300; s++)
        for (int l = 0; l < 3; l++)
            ck_assert_int_eq(store_add_samples(st, run, s, l, hs, 4, 1000 + s, &err), STORE_OK);
    ck_assert_int_eq(store_commit(st, &err), STORE_OK);
    store_retention p = {.exact_steps = 20, .retain_ms = 100, .now_ms = 1300};
    store_retain_report rep;
    do
        ck_assert_int_eq(store_retain_step(st, &p, 0, &rep, &err), STORE_OK);
    while (rep.more);
    ck_assert_int_gt(raw_int(dbpath, "SELECT count(*) FROM coarse"), 0);
    const char *bad = check_plans(st);
    ck_assert_msg(bad == NULL, "query plans changed:\n%s", bad);
    /* the check catches a lost index: without history_step the grid scans the compact tier */
    ck_assert_int_eq(sqlite3_exec(st->db, "DROP INDEX history_step", NULL, NULL, NULL), SQLITE_OK);
    bad = check_plans(st);
    ck_assert_msg(bad && strstr(bad, "history_step"), "a dropped index went unnoticed");
    fprintf(stderr, "  without history_step:\n%s", bad);
    store_close(st);
}
END_TEST

/* ---- durability options ----------------------------------------------------------------------- */

static int64_t pragma_int(store *st, const char *sql)
{
    sqlite3_stmt *s = NULL;
    ck_assert_int_eq(sqlite3_prepare_v2(st->db, sql, -1, &s, NULL), SQLITE_OK);
    ck_assert_int_eq(sqlite3_step(s), SQLITE_ROW);
    int64_t v = sqlite3_column_int64(s, 0);
    sqlite3_finalize(s);
    return v;
}

START_TEST(test_durability_options)
{
    store_error err = {0};
    store *st = open_ok(dbpath); /* the default: NORMAL (1) */
    ck_assert_int_eq(store_durability_of(st), STORE_SYNC_NORMAL);
    ck_assert_int_eq(pragma_int(st, "PRAGMA synchronous"), 1);
    store_close(st);
    store_options o = STORE_OPTIONS_DEFAULT;
    o.durability = STORE_SYNC_FULL;
    o.cache_kib = 8192 + rnd_range(0, 100);
    st = store_open_ex(dbpath, &o, &err);
    ck_assert_msg(st != NULL, "%s", err.msg);
    ck_assert_int_eq(store_durability_of(st), STORE_SYNC_FULL);
    ck_assert_int_eq(pragma_int(st, "PRAGMA synchronous"), 2);
    ck_assert_int_eq(pragma_int(st, "PRAGMA cache_size"), -o.cache_kib);
    ck_assert_int_eq(pragma_int(st, "PRAGMA foreign_keys"), 1);
    int64_t run = begin_run(st, "full", 0);
    stats_head h = rand_head(0);
    ck_assert_int_eq(store_add_samples(st, run, 1, 0, &h, 1, 0, &err), STORE_OK);
    ck_assert_int_eq(store_commit(st, &err), STORE_OK);
    store_close(st);
    ck_assert_int_eq(raw_int(dbpath, "SELECT count(*) FROM samples"), 1);
    /* bad options are refused with a message */
    o = (store_options)STORE_OPTIONS_DEFAULT;
    o.durability = (store_durability)7;
    ck_assert_ptr_null(store_open_ex(dbpath, &o, &err));
    ck_assert_msg(strstr(err.msg, "durability"), "%s", err.msg);
    o = (store_options)STORE_OPTIONS_DEFAULT;
    o.busy_ms = -1;
    ck_assert_ptr_null(store_open_ex(dbpath, &o, &err));
    /* readonly through the options: reads, refuses writes, never touches durability */
    o = (store_options)STORE_OPTIONS_DEFAULT;
    o.readonly = 1;
    o.durability = STORE_SYNC_FULL;
    st = store_open_ex(dbpath, &o, &err);
    ck_assert_msg(st != NULL, "%s", err.msg);
    ck_assert_int_eq(store_durability_of(st), STORE_SYNC_NORMAL);
    ck_assert_int_eq(store_add_samples(st, run, 2, 0, &h, 1, 0, &err), STORE_EINVAL);
    ck_assert_int_eq(store_retain_step(st, NULL, 0, NULL, &err), STORE_EINVAL);
    samples_vec v = {0};
    ck_assert_int_eq(store_grid(st, run, 1, NULL, collect_sample, &v, &err), STORE_OK);
    ck_assert_int_eq(v.n, 1);
    free(v.v);
    store_close(st);
    /* NULL options: the defaults */
    st = store_open_ex(dbpath, NULL, &err);
    ck_assert_msg(st != NULL, "%s", err.msg);
    ck_assert_int_eq(pragma_int(st, "PRAGMA synchronous"), 1);
    store_close(st);
}
END_TEST

/* ---- export ----------------------------------------------------------------------------------- */

static int stop_after_five(void *ctx, const store_sample *s)
{
    (void)s;
    return ++*(int *)ctx >= 5;
}

/* The i-th comma-separated field of a CSV line (into out). */
static const char *csv_field(const char *line, int i, char *out, size_t len)
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

static void check_csv_double(const char *line, int col, double want)
{
    char f[64];
    csv_field(line, col, f, sizeof f);
    if (isnan(want)) {
        ck_assert_msg(f[0] == '\0', "column %d: NaN printed as '%s'", col, f);
        return;
    }
    char *end = NULL;
    double got = strtod(f, &end);
    ck_assert_msg(*end == '\0' && same_double(got, want == 0 ? 0.0 : want),
                  "column %d: '%s' for %.17g", col, f, want);
}

START_TEST(test_export)
{
    store *st = open_ok(dbpath);
    int64_t run = begin_run(st, "export", 0), other = begin_run(st, "other", 0);
    store_error err = {0};
    int layers = (int)rnd_range(2, 5);
    for (int64_t s = 0; s < 400; s += rnd_range(1, 3))
        for (int l = layers - 1; l >= 0; l--) {
            stats_head hs[6];
            for (int h = 0; h < 6; h++)
                hs[h] = rand_head(1);
            ck_assert_int_eq(store_add_samples(st, run, s, l * 3, hs, 6 - (l % 2), 1000 + s, &err),
                             STORE_OK);
            ck_assert_int_eq(store_add_samples(st, other, s, l, hs, 2, 1000 + s, &err), STORE_OK);
        }
    ck_assert_int_eq(store_commit(st, &err), STORE_OK);
    /* three tiers: buckets below ~step 200, compact rows, the exact tail */
    store_retention p = {.exact_steps = 50, .retain_ms = 200, .bucket_steps = 16, .now_ms = 1400};
    store_retain_report rep;
    do
        ck_assert_int_eq(store_retain_step(st, &p, 300, &rep, &err), STORE_OK);
    while (rep.more);
    samples_vec all = {0};
    ck_assert_int_eq(store_export(st, run, collect_sample, &all, &err), STORE_OK);
    /* the same rows as each layer's whole trend, in order */
    samples_vec want = {0};
    for (int l = 0; l < layers; l++)
        ck_assert_int_eq(store_trend(st, run, l * 3, -1, INT64_MIN, INT64_MAX, 1, collect_sample,
                                     &want, &err), STORE_OK);
    ck_assert_int_eq(all.n, want.n);
    int tiers[3] = {0};
    int64_t merged = 0;
    for (int i = 0; i < all.n; i++) {
        const store_sample *a = &all.v[i], *w = &want.v[i];
        ck_assert(a->layer == w->layer && a->head == w->head && a->step == w->step &&
                  a->tier == w->tier && a->merged == w->merged && a->step_last == w->step_last);
        assert_same_head(&a->stats, &w->stats, "export");
        ck_assert(a->run_id == run);
        if (i > 0) { /* layer, then step, then head */
            const store_sample *b = &all.v[i - 1];
            ck_assert(b->layer < a->layer || (b->layer == a->layer && (b->step < a->step ||
                      (b->step == a->step && (b->head < a->head || b->tier != a->tier)))));
        }
        tiers[a->tier]++;
        merged += a->merged;
    }
    ck_assert_msg(tiers[0] && tiers[1] && tiers[2], "tiers %d %d %d", tiers[0], tiers[1],
                  tiers[2]);
    int64_t count = 0;
    ck_assert_int_eq(store_count_samples(st, run, &count, &err), STORE_OK);
    ck_assert_int_eq(merged, count); /* every sample once, a bucket for the ones it merged */
    free(want.v);

    /* the text rows: the header's columns, every number back exactly */
    int ncols = 1;
    for (const char *c = STORE_EXPORT_CSV_HEADER; *c; c++)
        ncols += *c == ',';
    ck_assert_int_eq(ncols, 34);
    char line[STORE_FORMAT_MAX];
    for (int i = 0; i < all.n; i += (int)rnd_range(1, 7)) {
        store_sample s = all.v[i];
        stats_head lo, hi;
        if (s.tier == STORE_TIER_BUCKET) { /* the pointers of the callback are gone: fake them */
            lo = s.stats, hi = s.stats;
            lo.max_logit -= 1;
            hi.entropy_std += 0.5;
            s.min = &lo, s.max = &hi;
        } else {
            s.min = s.max = NULL;
        }
        size_t n = store_format_sample(&s, STORE_FORMAT_CSV, line, sizeof line);
        ck_assert_uint_lt(n, sizeof line);
        ck_assert_uint_eq(strlen(line), n);
        int commas = 0;
        for (const char *c = line; *c; c++)
            commas += *c == ',';
        ck_assert_int_eq(commas, 33);
        char f[64];
        ck_assert_int_eq(strtoll(csv_field(line, 3, f, sizeof f), NULL, 10), s.step);
        ck_assert_str_eq(csv_field(line, 5, f, sizeof f),
                         s.tier == 0 ? "exact" : s.tier == 1 ? "compact" : "bucket");
        ck_assert_int_eq(strtoll(csv_field(line, 8, f, sizeof f), NULL, 10), s.stats.rows);
        check_csv_double(line, 13, s.stats.entropy_mean);
        check_csv_double(line, 19, s.stats.max_logit);
        check_csv_double(line, 32, s.min ? s.min->max_logit : s.stats.max_logit);
        check_csv_double(line, 23, s.max ? s.max->entropy_std : s.stats.entropy_std);
        n = store_format_sample(&s, STORE_FORMAT_JSONL, line, sizeof line);
        ck_assert_uint_eq(strlen(line), n);
        ck_assert(line[0] == '{' && line[n - 2] == '}' && line[n - 1] == '\n');
        const char *k = strstr(line, "\"entropy_mean\": ");
        ck_assert_ptr_nonnull(k);
        k += strlen("\"entropy_mean\": ");
        if (isnan(s.stats.entropy_mean))
            ck_assert(strncmp(k, "null", 4) == 0);
        else
            ck_assert(same_double(strtod(k, NULL), s.stats.entropy_mean));
        if (s.stats.rows == 0) /* max_logit -inf: JSON has no infinity */
            ck_assert_ptr_nonnull(strstr(line, "\"max_logit\": null"));
        /* a buffer too small: cut, NUL-terminated, the length it needs */
        char small[16];
        ck_assert_uint_eq(store_format_sample(&s, STORE_FORMAT_JSONL, small, sizeof small), n);
        ck_assert_uint_eq(strlen(small), sizeof small - 1);
    }
    free(all.v);
    int calls = 0;
    ck_assert_int_eq(store_export(st, run, stop_after_five, &calls, &err), STORE_OK);
    ck_assert_int_eq(calls, 5);
    ck_assert_int_eq(store_export(st, run + 100, collect_sample, &all, &err), STORE_NOTFOUND);
    ck_assert_int_eq(store_export(st, run, NULL, NULL, &err), STORE_EINVAL);
    store_close(st);
}
END_TEST

/* ---- runner ------------------------------------------------------------------------------------ */

static Suite *make_history_suite(void)
{
    Suite *s = suite_create("store history");
    TCase *tc = tcase_create("history");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, test_migrate_v1);
    tcase_add_test(tc, test_tiers_read_as_one);
    tcase_add_test(tc, test_query_plans);
    tcase_add_test(tc, test_durability_options);
    tcase_add_test(tc, test_export);
    tcase_set_timeout(tc, 300);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    seed_init("test_store_history");
    SRunner *sr = srunner_create(make_history_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
