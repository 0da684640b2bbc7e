/* test_store_history.c — Check suite for the store's history at scale (schema/): the three tiers
 * read as one (trend with every/from/to, grid, a head pushed again after compaction, a batch that
 * reads itself), the query plans (EXPLAIN QUERY PLAN: an index regression fails here, and the
 * check is shown to catch one), durability options, checkpoints on a thread of the handle's own
 * (the WAL bounded through thousands of commits), and export with its CSV / JSON-lines rows.
 * The migration from schema version 1 is tests/test_store_migrate.c. Reads the statements and the
 * handle's connection through store_internal.h.
 *
 * Random data comes from a seed printed at start (ATTNSTAT_TEST_SEED=<n> replays a run). Every test
 * works in its own temporary directory.
 */
#include <sys/stat.h>

#include "store_internal.h"
#include "store_retain.h"
#include "store_testutil.h"

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
    ck_assert_int_gt(retain_until_done(st, &p, rnd_range(1, 400)), 0);
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
    retain_until_done(st, &p, 0);
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

/* ---- checkpoints on a thread of the handle's own ------------------------------------------------ */

static long long file_size(const char *path)
{
    struct stat sb;
    return stat(path, &sb) == 0 ? (long long)sb.st_size : -1;
}

/* checkpoint_pages: the thread checkpoints (the writer does not, below 4x), the WAL stays bounded
 * while thousands of commits go through, and every sample is in the database after close. */
START_TEST(test_checkpoint_thread)
{
    store_error err = {0};
    store_options o = STORE_OPTIONS_DEFAULT;
    o.checkpoint_pages = 16 + rnd_range(0, 8);
    store *st = store_open_ex(dbpath, &o, &err);
    ck_assert_msg(st != NULL, "%s", err.msg);
    store_ckpt_counts ck;
    ck_assert_int_eq(store_checkpoint_counts(st, &ck), 1);
    ck_assert_int_eq(pragma_int(st, "PRAGMA wal_autocheckpoint"), 0); /* the writer's is off */
    int64_t runs[4];
    for (int r = 0; r < 4; r++) {
        char name[16];
        snprintf(name, sizeof name, "ck%d", r);
        runs[r] = begin_run(st, name, r);
    }
    char wal[600];
    snprintf(wal, sizeof wal, "%s-wal", dbpath);
    stats_head h[8];
    const int commits = 1500 + (int)rnd_range(0, 100);
    long long wal_max = 0;
    for (int c = 0; c < commits; c++) {
        for (int r = 0; r < 4; r++) {
            for (int k = 0; k < 8; k++)
                h[k] = rand_head(k);
            ck_assert_int_eq(store_add_samples(st, runs[r], c, 0, h, 8, 0, &err), STORE_OK);
        }
        ck_assert_msg(store_commit(st, &err) == STORE_OK, "%s", err.msg);
        long long w = file_size(wal);
        wal_max = w > wal_max ? w : wal_max;
    }
    ck_assert_int_eq(store_checkpoint_counts(st, &ck), 1);
    ck_assert_msg(ck.runs > 0, "the thread never checkpointed");
    ck_assert_msg(ck.frames > 0, "the thread's checkpoints copied no frame");
    ck_assert_msg(ck.errors == 0, "checkpoint failures: %s", ck.last_error);
    /* bounded: at most the writer's own limit (4x) plus a commit's frames, never the ~30 MB that
     * thousands of commits without a checkpoint write */
    long long bound = (4 * o.checkpoint_pages + 64) * (4096 + 24) + 32;
    ck_assert_msg(wal_max <= bound, "WAL grew to %lld bytes (bound %lld)", wal_max, bound);
    store_close(st);
    ck_assert_int_eq(raw_int(dbpath, "SELECT count(*) FROM samples"), (int64_t)commits * 4 * 8);
    /* a bad value is refused with a message; a read-only handle has no thread */
    o.checkpoint_pages = -1;
    ck_assert_ptr_null(store_open_ex(dbpath, &o, &err));
    ck_assert_msg(strstr(err.msg, "checkpoint_pages"), "%s", err.msg);
    o.checkpoint_pages = 16;
    o.readonly = 1;
    st = store_open_ex(dbpath, &o, &err);
    ck_assert_msg(st != NULL, "%s", err.msg);
    ck_assert_int_eq(store_checkpoint_counts(st, &ck), 0);
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
    retain_until_done(st, &p, 300);
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
    ck_assert_int_eq(ncols, 13 + 3 * VOCAB_NSTATS); /* keys and counts; each statistic, _lo, _hi */
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
        ck_assert_int_eq(commas, 12 + 3 * VOCAB_NSTATS);
        char f[64];
        ck_assert_int_eq(strtoll(csv_field(line, 3, f, sizeof f), NULL, 10), s.step);
        ck_assert_str_eq(csv_field(line, 5, f, sizeof f),
                         s.tier == 0 ? "exact" : s.tier == 1 ? "compact" : "bucket");
        ck_assert_int_eq(strtoll(csv_field(line, 8, f, sizeof f), NULL, 10), s.stats.rows);
        check_csv_double(line, 13, s.stats.entropy_mean);
        check_csv_double(line, 19, s.stats.max_logit);
        /* after the statistics, each one's _lo and _hi (max_logit: the 7th, entropy_std: the 2nd) */
        check_csv_double(line, 13 + VOCAB_NSTATS + 2 * 6, s.min ? s.min->max_logit : s.stats.max_logit);
        check_csv_double(line, 13 + VOCAB_NSTATS + 2 * 1 + 1,
                         s.max ? s.max->entropy_std : s.stats.entropy_std);
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
    tcase_add_test(tc, test_tiers_read_as_one);
    tcase_add_test(tc, test_query_plans);
    tcase_add_test(tc, test_durability_options);
    tcase_add_test(tc, test_checkpoint_thread);
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
