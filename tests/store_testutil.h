/* store_testutil.h — shared by the store's test suites (test_store.c, test_store_failures.c,
 * test_store_history.c, test_store_retain.c): a seeded generator (ATTNSTAT_TEST_SEED=<n> replays a
 * run), a temporary directory per test, random statistics, exact comparisons, raw SQLite access to
 * check what the store wrote, collectors for the read callbacks, and the retention step run to its
 * end. Header-only (static functions), as tests/stats_testutil.h. Includes check.h, sqlite3.h,
 * store_read.h, store_retain.h and store_write.h.
 */
#ifndef ATTNSTAT_STORE_TESTUTIL_H
#define ATTNSTAT_STORE_TESTUTIL_H

#include <check.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <sqlite3.h>

#include "store_read.h"
#include "store_retain.h"
#include "store_write.h"

static uint64_t g_seed;
static uint64_t rng_state;

static inline uint64_t rnd(void)
{
    /* xorshift64* */
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return rng_state * 0x2545F4914F6CDD1DULL;
}

static inline double rnd_unit(void)
{
    return (double)(rnd() >> 11) / 9007199254740992.0;
}

static inline int64_t rnd_range(int64_t lo, int64_t hi) /* inclusive */
{
    return lo + (int64_t)(rnd() % (uint64_t)(hi - lo + 1));
}

static char tmpdir[256];
static char dbpath[320];

static inline void setup(void)
{
    rng_state = g_seed ^ 0x9E3779B97F4A7C15ULL;
    if (!rng_state)
        rng_state = 1;
    const char *base = getenv("TMPDIR");
    snprintf(tmpdir, sizeof tmpdir, "%s/attnstat-store-XXXXXX", base && *base ? base : "/tmp");
    ck_assert_ptr_nonnull(mkdtemp(tmpdir));
    snprintf(dbpath, sizeof dbpath, "%s/history.db", tmpdir);
}

static inline void teardown(void)
{
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", tmpdir);
}

/* A plausible stats_head; a random one in ~1/8 of cases has no counted row (NaN means). */
static inline stats_head rand_head(int allow_empty)
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
        h.sink_mass = h.distance = NAN;
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
    h.sink_mass = rnd_unit();
    h.distance = rnd_unit() * 2048;
    return h;
}

/* A double with random bits: any finite value, infinities, subnormals (not NaN, not -0.0). */
static inline double rand_bits_double(void)
{
    for (;;) {
        uint64_t u = rnd();
        double d;
        memcpy(&d, &u, sizeof d);
        if (!isnan(d) && !(d == 0 && signbit(d)))
            return d;
    }
}

static inline int same_double(double a, double b)
{
    if (isnan(a) || isnan(b))
        return isnan(a) && isnan(b);
    return memcmp(&a, &b, sizeof a) == 0;
}

static inline void assert_same_head(const stats_head *a, const stats_head *b, const char *where)
{
    ck_assert_msg(a->rows == b->rows && a->rows_norm == b->rows_norm &&
                      a->rows_empty == b->rows_empty && a->nonfinite_rows == b->nonfinite_rows &&
                      a->sampled == b->sampled,
                  "%s: counts differ", where);
#define SAME_STAT_(name, ...)                                                                      \
    ck_assert_msg(same_double(a->name, b->name), "%s: %s differs: %.17g vs %.17g", where, #name,   \
                  a->name, b->name);
    VOCAB_STATS(SAME_STAT_)
#undef SAME_STAT_
}

static inline store *open_ok(const char *path)
{
    store_error err = {0};
    store *st = store_open(path, 0, &err);
    ck_assert_msg(st != NULL, "store_open: %s", err.msg);
    return st;
}

static inline int64_t begin_run(store *st, const char *name, int32_t rank)
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
static inline int64_t raw_int(const char *path, const char *sql)
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

static inline void raw_exec(const char *path, const char *sql)
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

static inline int collect_sample(void *ctx, const store_sample *s)
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

static inline int collect_run(void *ctx, const store_run *r)
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

static inline int collect_alert(void *ctx, const store_alert *a)
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


static inline int count_sample(void *ctx, const store_sample *s)
{
    (void)s;
    (*(int64_t *)ctx)++;
    return 0;
}

static inline int count_alert(void *ctx, const store_alert *a)
{
    (void)a;
    (*(int64_t *)ctx)++;
    return 0;
}

/* Retention steps until none reports more work (a bounded number: a step that makes no progress
 * fails here, not by the suite's timeout). Returns the number of calls. */
static inline int retain_until_done(store *st, const store_retention *p, int64_t budget)
{
    store_error err = {0};
    store_retain_report rep;
    int calls = 0;
    do {
        ck_assert_msg(store_retain_step(st, p, budget, &rep, &err) == STORE_OK, "%s", err.msg);
        ck_assert_msg(++calls < 5000, "the retention step never finishes");
    } while (rep.more);
    return calls;
}

/* The retention step's compaction point (store_retain.h): steps below it are compacted, with
 * exact_steps e and the run's latest step. */
static inline int64_t compact_cutoff(int64_t step_max, int64_t e)
{
    int64_t block = e > 0 ? e : 1, lim = step_max - e;
    return (lim / block - (lim % block < 0)) * block;
}

/* The seed of this run: ATTNSTAT_TEST_SEED, else fresh; printed so that a failure can be replayed. */
static inline void seed_init(const char *suite)
{
    const char *env = getenv("ATTNSTAT_TEST_SEED");
    g_seed = env && *env ? strtoull(env, NULL, 10)
                         : ((uint64_t)time(NULL) * 6364136223846793005ULL) ^ (uint64_t)getpid();
    printf("%s: seed %" PRIu64 " (ATTNSTAT_TEST_SEED=%" PRIu64 " to replay)\n", suite, g_seed,
           g_seed);
    fflush(stdout);
}

#endif /* ATTNSTAT_STORE_TESTUTIL_H */
