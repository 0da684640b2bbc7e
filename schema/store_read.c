/* store_read.c — the reading half of the store, behind store_read.h: runs (list, get, resolve),
 * trend, grid, alert transitions, integrity check. Used by the CLI on a read-only handle and by
 * the daemon's restore. Calls store.c's helpers (store_internal.h), the tiers reader
 * (store_tiers.h) and SQLite; nothing of store_write.c or store_retain.c.
 *
 * How it works
 * - Runs and alerts are one statement each of store_sql.c's table; deliver() steps it to its end
 *   and hands each row to the caller's callback as a struct whose strings point into SQLite's
 *   current row (hence valid only during the call). The order is the statement's ORDER BY.
 * - Trend and grid read three statements, one per tier, merged by store_tiers.c inside one read
 *   transaction (store_read_begin()).
 * - The latest step of a run is the runs table's summary (step_max), never a scan of samples.
 */
#include "store_read.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "store_internal.h"
#include "store_tiers.h"

static const char *col_text(sqlite3_stmt *s, int i)
{
    return sqlite3_column_type(s, i) == SQLITE_NULL ? NULL
                                                    : (const char *)sqlite3_column_text(s, i);
}

static void read_run(sqlite3_stmt *s, store_run *r)
{
    r->id = sqlite3_column_int64(s, 0);
    r->name = col_text(s, 1);
    r->rank = sqlite3_column_int(s, 2);
    r->host = col_text(s, 3);
    r->pid = sqlite3_column_int64(s, 4);
    r->started_ms = sqlite3_column_int64(s, 5);
    r->last_hello_ms = sqlite3_column_int64(s, 6);
    r->config = col_text(s, 7);
    r->thresholds = col_text(s, 8);
    r->samples = sqlite3_column_int64(s, 9);
    r->step_min = sqlite3_column_int64(s, 10);
    r->step_max = sqlite3_column_int64(s, 11);
    r->last_time_ms = sqlite3_column_int64(s, 12);
    r->bytes = sqlite3_column_int64(s, 13);
    r->retain_ms = sqlite3_column_int64(s, 14);
    r->retain_bytes = sqlite3_column_int64(s, 15);
    if (!r->name)
        r->name = "";
}

static void read_alert(sqlite3_stmt *s, store_alert *a)
{
    a->id = sqlite3_column_int64(s, 0);
    a->run_id = sqlite3_column_int64(s, 1);
    a->layer = sqlite3_column_int(s, 2);
    a->head = sqlite3_column_int(s, 3);
    a->step = sqlite3_column_int64(s, 4);
    a->rule = col_text(s, 5);
    const char *state = col_text(s, 6);
    a->state = state && strcmp(state, "raised") == 0 ? STORE_ALERT_RAISED : STORE_ALERT_CLEARED;
    a->value = col_f64(s, 7);
    a->threshold = col_f64(s, 8);
    a->time_ms = sqlite3_column_int64(s, 9);
    a->message = col_text(s, 10);
    if (!a->rule)
        a->rule = "";
}

enum { ROW_RUN, ROW_ALERT };

/* Step a bound statement to its end, handing each row to cb. *rows counts the rows delivered.
 * Resets the statement. */
static store_status deliver(store *st, sqlite3_stmt *s, int kind, void *cb, void *ctx,
                            int64_t *rows, const char *what, store_error *err)
{
    int64_t n = 0;
    int rc;
    while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
        int stop;
        n++;
        if (kind == ROW_RUN) {
            store_run r;
            read_run(s, &r);
            stop = ((store_run_cb)cb)(ctx, &r);
        } else {
            store_alert r;
            read_alert(s, &r);
            stop = ((store_alert_cb)cb)(ctx, &r);
        }
        if (stop) {
            rc = SQLITE_DONE;
            break;
        }
    }
    store_status rs = STORE_OK;
    if (rc != SQLITE_DONE)
        rs = store_db_err(st, err, rc, "%s in '%s'", what, st->path);
    stmt_done(s);
    if (rows)
        *rows = n;
    return rs;
}

static store_status check_cb(const void *cb, store_error *err)
{
    if (!cb) {
        store_set_err(err, 0, "no callback given");
        return STORE_EINVAL;
    }
    return STORE_OK;
}

store_status store_list_runs(store *st, store_run_cb cb, void *ctx, store_error *err)
{
    if (check_cb((const void *)cb, err))
        return STORE_EINVAL;
    if (st->in_batch && store_flush_deltas(st, err)) /* the summaries of the open batch */
        return STORE_ERROR;
    sqlite3_stmt *s = store_stmt(st, S_RUNS_ALL, err);
    if (!s)
        return STORE_ERROR;
    return deliver(st, s, ROW_RUN, (void *)cb, ctx, NULL, "listing runs", err);
}

store_status store_get_run(store *st, int64_t run_id, store_run_cb cb, void *ctx,
                           store_error *err)
{
    if (check_cb((const void *)cb, err))
        return STORE_EINVAL;
    if (st->in_batch && store_flush_deltas(st, err))
        return STORE_ERROR;
    sqlite3_stmt *s = store_stmt(st, S_RUN_ONE, err);
    if (!s)
        return STORE_ERROR;
    int rc = bind_i64(s, 1, run_id);
    if (rc != SQLITE_OK) {
        stmt_done(s);
        return store_db_err(st, err, rc, "binding the run id");
    }
    int64_t n = 0;
    store_status rs = deliver(st, s, ROW_RUN, (void *)cb, ctx, &n, "reading a run", err);
    if (rs == STORE_OK && n == 0) {
        store_set_err(err, 0, "no run with id %" PRId64 " in '%s'", run_id, st->path);
        return STORE_NOTFOUND;
    }
    return rs;
}

store_status store_resolve_run(store *st, const char *spec, int32_t rank, int64_t *run_id,
                               store_error *err)
{
    if (!spec || !*spec) {
        store_set_err(err, 0, "no run given (a run id or name)");
        return STORE_EINVAL;
    }
    /* A decimal id of an existing run wins over a run that happens to be named with digits. */
    char *end = NULL;
    errno = 0;
    long long id = strtoll(spec, &end, 10);
    if (*spec >= '0' && *spec <= '9' && end && !*end && errno == 0 && id > 0) {
        store_status rs = store_check_run(st, id, err);
        if (rs == STORE_OK) {
            *run_id = id;
            return STORE_OK;
        }
        if (rs != STORE_NOTFOUND)
            return rs;
    }
    sqlite3_stmt *s = store_stmt(st, S_RUN_BY_NAME, err);
    if (!s)
        return STORE_ERROR;
    int rc = SQLITE_OK;
    BIND(bind_text(s, 1, spec));
    BIND(bind_i64(s, 2, rank));
    int n = 0;
    char ids[160] = "";
    size_t used = 0;
    while (rc == SQLITE_OK && (rc = sqlite3_step(s)) == SQLITE_ROW) {
        int64_t rid = sqlite3_column_int64(s, 0);
        if (n++ == 0)
            *run_id = rid;
        if (used + 48 < sizeof ids)
            used += (size_t)snprintf(ids + used, sizeof ids - used, "%s id %" PRId64 " rank %d",
                                     n > 1 ? "," : "", rid, sqlite3_column_int(s, 1));
        rc = SQLITE_OK;
    }
    if (rc != SQLITE_DONE) {
        store_db_err(st, err, rc, "looking up run '%s'", spec);
        stmt_done(s);
        return STORE_ERROR;
    }
    stmt_done(s);
    if (n == 0) {
        if (rank >= 0)
            store_set_err(err, 0, "no run '%s' with rank %" PRId32 " in '%s'", spec, rank,
                          st->path);
        else
            store_set_err(err, 0, "no run with id or name '%s' in '%s'", spec, st->path);
        return STORE_NOTFOUND;
    }
    if (n > 1) {
        store_set_err(err, 0, "run name '%s' matches %d runs (%s): give a rank or a run id",
                      spec, n, ids);
        return STORE_AMBIGUOUS;
    }
    return STORE_OK;
}

store_status store_trend(store *st, int64_t run_id, int32_t layer, int32_t head,
                         int64_t step_from, int64_t step_to, int64_t every,
                         store_sample_cb cb, void *ctx, store_error *err)
{
    if (check_cb((const void *)cb, err))
        return STORE_EINVAL;
    int began = 0;
    store_status rs = store_read_begin(st, &began, err);
    if (rs == STORE_OK)
        rs = store_tiers_trend(st, run_id, layer, head, step_from, step_to, every, cb, ctx, NULL,
                               err);
    store_read_end(st, began);
    return rs;
}

/* The highest step of a run (its summary). STORE_NOTFOUND when there is no run or no sample. */
static store_status latest_step(store *st, int64_t run_id, int64_t *step, store_error *err)
{
    sqlite3_stmt *q = store_stmt(st, S_RUN_ONE, err);
    if (!q)
        return STORE_ERROR;
    int rc = bind_i64(q, 1, run_id);
    if (rc == SQLITE_OK)
        rc = sqlite3_step(q);
    int have = 0;
    if (rc == SQLITE_ROW) {
        have = sqlite3_column_type(q, 11) != SQLITE_NULL;
        *step = sqlite3_column_int64(q, 11);
        rc = SQLITE_DONE;
    } else if (rc == SQLITE_DONE) {
        stmt_done(q);
        store_set_err(err, 0, "no run with id %" PRId64 " in '%s'", run_id, st->path);
        return STORE_NOTFOUND;
    }
    if (rc != SQLITE_DONE) {
        store_db_err(st, err, rc, "finding the latest step of run %" PRId64, run_id);
        stmt_done(q);
        return STORE_ERROR;
    }
    stmt_done(q);
    if (!have) {
        store_set_err(err, 0, "run %" PRId64 " has no samples yet", run_id);
        return STORE_NOTFOUND;
    }
    return STORE_OK;
}

store_status store_grid(store *st, int64_t run_id, int64_t step, int64_t *step_used,
                        store_sample_cb cb, void *ctx, store_error *err)
{
    if (check_cb((const void *)cb, err))
        return STORE_EINVAL;
    int began = 0;
    store_status rs = store_read_begin(st, &began, err);
    if (rs == STORE_OK && step == STORE_STEP_LATEST)
        rs = latest_step(st, run_id, &step, err);
    if (rs == STORE_OK && step_used)
        *step_used = step;
    int64_t n = 0;
    if (rs == STORE_OK)
        rs = store_tiers_grid(st, run_id, step, cb, ctx, &n, err);
    store_read_end(st, began);
    if (rs == STORE_OK && n == 0) {
        store_set_err(err, 0, "run %" PRId64 " has no sample at step %" PRId64, run_id, step);
        return STORE_NOTFOUND;
    }
    return rs;
}

store_status store_alerts(store *st, int64_t run_id, int active_only, store_alert_cb cb,
                          void *ctx, store_error *err)
{
    if (check_cb((const void *)cb, err))
        return STORE_EINVAL;
    int id = run_id > 0 ? (active_only ? S_ALERTS_ACTIVE_RUN : S_ALERTS_RUN)
                        : (active_only ? S_ALERTS_ACTIVE : S_ALERTS_ALL);
    sqlite3_stmt *s = store_stmt(st, id, err);
    if (!s)
        return STORE_ERROR;
    if (run_id > 0) {
        int rc = bind_i64(s, 1, run_id);
        if (rc != SQLITE_OK) {
            stmt_done(s);
            return store_db_err(st, err, rc, "binding the alert query");
        }
    }
    return deliver(st, s, ROW_ALERT, (void *)cb, ctx, NULL, "reading alerts", err);
}

store_status store_integrity_check(store *st, store_error *err)
{
    sqlite3_stmt *s = NULL;
    int rc = sqlite3_prepare_v2(st->db, "PRAGMA integrity_check", -1, &s, NULL);
    if (rc == SQLITE_OK)
        rc = sqlite3_step(s);
    store_status rs = STORE_OK;
    if (rc == SQLITE_ROW) {
        const char *r = (const char *)sqlite3_column_text(s, 0);
        if (!r || strcmp(r, "ok") != 0) {
            store_set_err(err, SQLITE_CORRUPT, "integrity check of '%s' failed: %s", st->path,
                    r ? r : "(no answer)");
            rs = STORE_ERROR;
        }
    } else {
        rs = store_db_err(st, err, rc, "checking the integrity of '%s'", st->path);
    }
    sqlite3_finalize(s);
    return rs;
}
