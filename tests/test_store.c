/* test_store.c — Check suite for the store (schema/): migrations, exact round trips, trend and
 * grid queries, alerts, batch visibility, crash safety under kill -9, error paths, and allocation
 * failure injected into SQLite.
 *
 * Random data comes from a seed printed at start (ATTNSTAT_TEST_SEED=<n> replays a run). Every test
 * works in its own temporary directory.
 */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <sqlite3.h>

#include "store_read.h"
#include "store_write.h"

/* ---- shared helpers ------------------------------------------------------------------------- */

static uint64_t g_seed;
static uint64_t rng_state;

static uint64_t rnd(void)
{
    /* xorshift64* */
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return rng_state * 0x2545F4914F6CDD1DULL;
}

static double rnd_unit(void)
{
    return (double)(rnd() >> 11) / 9007199254740992.0;
}

static int64_t rnd_range(int64_t lo, int64_t hi) /* inclusive */
{
    return lo + (int64_t)(rnd() % (uint64_t)(hi - lo + 1));
}

static char tmpdir[256];
static char dbpath[320];

static void setup(void)
{
    rng_state = g_seed ^ 0x9E3779B97F4A7C15ULL;
    if (!rng_state)
        rng_state = 1;
    const char *base = getenv("TMPDIR");
    snprintf(tmpdir, sizeof tmpdir, "%s/attnstat-store-XXXXXX", base && *base ? base : "/tmp");
    ck_assert_ptr_nonnull(mkdtemp(tmpdir));
    snprintf(dbpath, sizeof dbpath, "%s/history.db", tmpdir);
}

static void teardown(void)
{
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", tmpdir);
}

/* A plausible stats_head; a random one in ~1/8 of cases has no counted row (NaN means). */
static stats_head rand_head(int allow_empty)
{
    stats_head h;
    memset(&h, 0, sizeof h);
    if (allow_empty && rnd() % 8 == 0) {
        h.rows = 0;
        h.rows_norm = 0;
        h.rows_empty = rnd_range(0, 50);
        h.nonfinite_rows = rnd_range(0, 3);
        h.entropy_mean = h.entropy_std = h.entropy_min = h.entropy_max = NAN;
        h.entropy_norm_mean = NAN;
        h.collapsed_frac = NAN;
        h.max_logit = -INFINITY;
        h.sampled = (int32_t)(rnd() & 1);
        return h;
    }
    h.rows = rnd_range(1, 1 << 20);
    h.rows_norm = rnd_range(0, h.rows);
    h.rows_empty = rnd_range(0, 100);
    h.nonfinite_rows = rnd_range(0, 2);
    h.entropy_min = rnd_unit() * 3;
    h.entropy_max = h.entropy_min + rnd_unit() * 4;
    h.entropy_mean = h.entropy_min + rnd_unit() * (h.entropy_max - h.entropy_min);
    h.entropy_std = rnd_unit();
    h.entropy_norm_mean = h.rows_norm ? rnd_unit() : NAN;
    h.collapsed_frac = h.rows_norm ? rnd_unit() : NAN;
    h.max_logit = (rnd_unit() - 0.2) * 300;
    h.sampled = (int32_t)(rnd() & 1);
    return h;
}

/* A double with random bits: any finite value, infinities, subnormals (not NaN, not -0.0). */
static double rand_bits_double(void)
{
    for (;;) {
        uint64_t u = rnd();
        double d;
        memcpy(&d, &u, sizeof d);
        if (!isnan(d) && !(d == 0 && signbit(d)))
            return d;
    }
}

static int same_double(double a, double b)
{
    if (isnan(a) || isnan(b))
        return isnan(a) && isnan(b);
    return memcmp(&a, &b, sizeof a) == 0;
}

static void assert_same_head(const stats_head *a, const stats_head *b, const char *where)
{
    ck_assert_msg(a->rows == b->rows && a->rows_norm == b->rows_norm &&
                      a->rows_empty == b->rows_empty && a->nonfinite_rows == b->nonfinite_rows &&
                      a->sampled == b->sampled,
                  "%s: counts differ", where);
    const double *x[] = {&a->entropy_mean, &a->entropy_std, &a->entropy_min, &a->entropy_max,
                         &a->entropy_norm_mean, &a->collapsed_frac, &a->max_logit};
    const double *y[] = {&b->entropy_mean, &b->entropy_std, &b->entropy_min, &b->entropy_max,
                         &b->entropy_norm_mean, &b->collapsed_frac, &b->max_logit};
    for (int i = 0; i < 7; i++)
        ck_assert_msg(same_double(*x[i], *y[i]), "%s: double field %d differs: %.17g vs %.17g",
                      where, i, *x[i], *y[i]);
}

static store *open_ok(const char *path)
{
    store_error err = {0};
    store *st = store_open(path, 0, &err);
    ck_assert_msg(st != NULL, "store_open: %s", err.msg);
    return st;
}

static int64_t begin_run(store *st, const char *name, int32_t rank)
{
    store_error err = {0};
    store_run_info info = {.name = name, .rank = rank, .host = "node1", .pid = 42,
                           .config = "{\"model\":\"x\"}", .thresholds = "{}"};
    int64_t id = 0;
    ck_assert_msg(store_run_begin(st, &info, &id, &err) == STORE_OK, "run_begin: %s", err.msg);
    ck_assert_int_gt(id, 0);
    return id;
}

/* Raw SQLite access to check what the store wrote. */
static int64_t raw_int(const char *path, const char *sql)
{
    sqlite3 *db = NULL;
    ck_assert_int_eq(sqlite3_open_v2(path, &db, SQLITE_OPEN_READWRITE, NULL), SQLITE_OK);
    sqlite3_stmt *s = NULL;
    ck_assert_msg(sqlite3_prepare_v2(db, sql, -1, &s, NULL) == SQLITE_OK, "%s: %s", sql,
                  sqlite3_errmsg(db));
    int rc = sqlite3_step(s);
    ck_assert_msg(rc == SQLITE_ROW, "%s: %s", sql, sqlite3_errmsg(db));
    int64_t v = sqlite3_column_int64(s, 0);
    sqlite3_finalize(s);
    sqlite3_close(db);
    return v;
}

static void raw_exec(const char *path, const char *sql)
{
    sqlite3 *db = NULL;
    ck_assert_int_eq(sqlite3_open_v2(path, &db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, NULL),
                     SQLITE_OK);
    ck_assert_msg(sqlite3_exec(db, sql, NULL, NULL, NULL) == SQLITE_OK, "%s: %s", sql,
                  sqlite3_errmsg(db));
    sqlite3_close(db);
}

/* Collectors for the callbacks. */
typedef struct {
    store_sample *v;
    int n, cap;
} samples_vec;

static int collect_sample(void *ctx, const store_sample *s)
{
    samples_vec *v = ctx;
    if (v->n == v->cap) {
        v->cap = v->cap ? v->cap * 2 : 64;
        v->v = realloc(v->v, (size_t)v->cap * sizeof *v->v);
        ck_assert_ptr_nonnull(v->v);
    }
    v->v[v->n++] = *s;
    return 0;
}

typedef struct {
    int n;
    int64_t ids[64];
    char names[64][32];
    store_run runs[64];
    int states[64];
    char rules[64][32];
    int64_t steps[64];
    int32_t heads[64];
} rows_vec;

static int collect_run(void *ctx, const store_run *r)
{
    rows_vec *v = ctx;
    if (v->n < 64) {
        v->runs[v->n] = *r;
        v->ids[v->n] = r->id;
        snprintf(v->names[v->n], sizeof v->names[0], "%s", r->name);
        v->runs[v->n].name = v->runs[v->n].host = v->runs[v->n].config = NULL;
        v->runs[v->n].thresholds = NULL;
    }
    v->n++;
    return 0;
}

static int collect_alert(void *ctx, const store_alert *a)
{
    rows_vec *v = ctx;
    if (v->n < 64) {
        v->ids[v->n] = a->id;
        v->states[v->n] = a->state;
        v->steps[v->n] = a->step;
        v->heads[v->n] = a->head;
        snprintf(v->rules[v->n], sizeof v->rules[0], "%s", a->rule);
    }
    v->n++;
    return 0;
}

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

static int count_sample(void *ctx, const store_sample *s)
{
    (void)s;
    (*(int64_t *)ctx)++;
    return 0;
}

static int count_alert(void *ctx, const store_alert *a)
{
    (void)a;
    (*(int64_t *)ctx)++;
    return 0;
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
    fi_uninstall();
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

    tc = tcase_create("failures");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, test_error_paths);
    tcase_add_test(tc, test_bad_arguments);
    tcase_add_test(tc, test_kill9);
    tcase_add_test(tc, test_fault_injection);
    tcase_set_timeout(tc, 300);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    const char *env = getenv("ATTNSTAT_TEST_SEED");
    g_seed = env && *env ? strtoull(env, NULL, 10)
                         : ((uint64_t)time(NULL) * 6364136223846793005ULL) ^ (uint64_t)getpid();
    printf("test_store: seed %" PRIu64 " (ATTNSTAT_TEST_SEED=%" PRIu64 " to replay)\n", g_seed,
           g_seed);
    fflush(stdout);
    SRunner *sr = srunner_create(make_store_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
