/* store_job.c — a job's runs with their layouts, and the pooling of samples over disjoint rows
 * (store_job.h). Calls store_core.c's helpers (store_internal.h) and SQLite; nothing of the other
 * files of the store. */
#include "store_job.h"

#include <inttypes.h>
#include <math.h>
#include <stddef.h>
#include <string.h>

#include "store_internal.h"

/* One row of JOB_RUN_COLS (store_sql.c) into r. */
static void read_job_run(sqlite3_stmt *s, store_job_run *r)
{
    r->run_id = sqlite3_column_int64(s, 0);
    r->name = (const char *)sqlite3_column_text(s, 1);
    if (!r->name)
        r->name = "";
    r->rank = sqlite3_column_int(s, 2);
    r->host = sqlite3_column_type(s, 3) == SQLITE_NULL ? NULL
                                                        : (const char *)sqlite3_column_text(s, 3);
    r->samples = sqlite3_column_int64(s, 4);
    r->step_min = sqlite3_column_int64(s, 5);
    r->step_max = sqlite3_column_int64(s, 6);
    r->last_time_ms = sqlite3_column_int64(s, 7);
    /* A layout is recorded whole (store_run_set_layout): tp_size tells whether there is one. */
    r->has_layout = sqlite3_column_type(s, 9) != SQLITE_NULL;
    int32_t *f[10] = {&r->layout.tp_rank, &r->layout.tp_size, &r->layout.pp_rank,
                      &r->layout.pp_size, &r->layout.dp_rank, &r->layout.dp_size,
                      &r->layout.cp_rank, &r->layout.cp_size, &r->layout.layer_offset,
                      &r->layout.head_offset};
    for (int i = 0; i < 10; i++) {
        int null = sqlite3_column_type(s, 8 + i) == SQLITE_NULL;
        /* no layout: rank 0 of 1, no offset; head_offset NULL: per push */
        *f[i] = null ? (i == 9 ? -1 : (i % 2 == 1 && i < 8) ? 1 : 0) : sqlite3_column_int(s, 8 + i);
    }
}

/* Steps s (bound) to its end, each row to cb. *n counts them. */
static store_status deliver_runs(store *st, sqlite3_stmt *s, store_job_run_cb cb, void *ctx,
                                 int64_t *n, store_error *err)
{
    int rc;
    *n = 0;
    while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
        store_job_run r;
        read_job_run(s, &r);
        (*n)++;
        if (cb(ctx, &r)) {
            rc = SQLITE_DONE;
            break;
        }
    }
    if (rc != SQLITE_DONE) {
        store_db_err(st, err, rc, "reading a job's runs");
        stmt_done(s);
        return STORE_ERROR;
    }
    stmt_done(s);
    return STORE_OK;
}

store_status store_job_runs(store *st, const char *name, store_job_run_cb cb, void *ctx,
                            store_error *err)
{
    if (!cb || !name) {
        store_set_err(err, 0, "store_job_runs: a name and a callback are needed");
        return STORE_EINVAL;
    }
    if (st->in_batch && store_flush_deltas(st, err)) /* the summaries of the open batch */
        return STORE_ERROR;
    sqlite3_stmt *s = store_stmt(st, S_JOB_RUNS, err);
    if (!s)
        return STORE_ERROR;
    int rc = bind_text(s, 1, name);
    if (rc != SQLITE_OK) {
        stmt_done(s);
        return store_db_err(st, err, rc, "binding a job's name");
    }
    int64_t n;
    return deliver_runs(st, s, cb, ctx, &n, err);
}

store_status store_job_get_run(store *st, int64_t run_id, store_job_run_cb cb, void *ctx,
                           store_error *err)
{
    if (!cb) {
        store_set_err(err, 0, "store_job_get_run: a callback is needed");
        return STORE_EINVAL;
    }
    if (st->in_batch && store_flush_deltas(st, err))
        return STORE_ERROR;
    sqlite3_stmt *s = store_bind_ints(st, S_JOB_RUN_ONE, &run_id, 1, "reading a run", err);
    if (!s)
        return STORE_ERROR;
    int64_t n;
    store_status rs = deliver_runs(st, s, cb, ctx, &n, err);
    if (rs == STORE_OK && n == 0) {
        store_set_err(err, 0, "no run with id %" PRId64 " in '%s'", run_id, st->path);
        return STORE_NOTFOUND;
    }
    return rs;
}

/* ---- pooling ------------------------------------------------------------------------------- */

/* The weighted mean of a (weight wa) and b (weight wb), wa, wb > 0. */
static double wmean(double a, double wa, double b, double wb)
{
    return a + (b - a) * (wb / (wa + wb));
}

/* Each statistic's pooling, from its row: how (pool), over which count (weight, a VOCAB_COUNTS
 * row), and whether its value means something when that count is 0 (absent: max_logit's -inf). */
#define POOL_(name, unit, pack, since, pool, weight, lo, hi, absent, ...)                         \
    {pool, offsetof(stats_head, weight), absent == VOCAB_ABSENT_NO_LOGIT},
static const struct {
    enum vocab_pool pool;
    size_t weight;  /* offset of the count in stats_head */
    int ungated;    /* pooled whatever the counts (a value is defined with no counted row) */
} pool_of[VOCAB_NSTATS] = {VOCAB_STATS(POOL_)};
#undef POOL_

static int64_t weight_of(const stats_head *h, int i)
{
    int64_t w;
    memcpy(&w, (const char *)h + pool_of[i].weight, sizeof w);
    return w;
}

void store_merge_stats(stats_head *acc, const stats_head *x)
{
    /* Every statistic pools from acc's values as they were (a STD row reads its MEAN row's mean
     * before that mean moves): the results go to out, then back to acc. */
    stats_head out = *acc;
    int mean_row = -1; /* the latest MEAN row before the current one */
    for (int i = 0; i < VOCAB_NSTATS; i++) {
        double a = store_stat_get(acc, i), b = store_stat_get(x, i), *o = store_stat(&out, i);
        int64_t wa = weight_of(acc, i), wb = weight_of(x, i);
        enum vocab_pool p = pool_of[i].pool;
        if (p == VOCAB_POOL_MEAN)
            mean_row = i;
        if (pool_of[i].ungated) { /* fmin / fmax ignore a NaN side; -inf gives way to any value */
            if (p == VOCAB_POOL_MAX)
                *o = fmax(a, b);
            else if (p == VOCAB_POOL_MIN)
                *o = fmin(a, b);
            continue;
        }
        if (wb <= 0)
            continue; /* x has no row this statistic is over: acc's value stays */
        if (wa <= 0) {
            *o = b; /* acc had none: x's value whole */
            continue;
        }
        double na = (double)wa, nb = (double)wb, n = na + nb;
        switch (p) {
        case VOCAB_POOL_MEAN:
            *o = wmean(a, na, b, nb);
            break;
        case VOCAB_POOL_STD: {
            /* the pooled population deviation about the MEAN row before it */
            double d = mean_row >= 0 ? store_stat_get(x, mean_row) - store_stat_get(acc, mean_row)
                                     : 0;
            double var = (na * (a * a) + nb * (b * b)) / n + d * d * (na / n) * (nb / n);
            *o = sqrt(var > 0 ? var : 0);
            break;
        }
        case VOCAB_POOL_MIN:
            *o = fmin(a, b);
            break;
        case VOCAB_POOL_MAX:
            *o = fmax(a, b);
            break;
        }
    }
    for (int i = 0; i < VOCAB_NSTATS; i++)
        *store_stat(acc, i) = store_stat_get(&out, i);
    acc->rows += x->rows;
    acc->rows_norm += x->rows_norm;
    acc->rows_empty += x->rows_empty;
    acc->nonfinite_rows += x->nonfinite_rows;
    acc->sampled = acc->sampled || x->sampled;
}
