/* store_read.c — the reading half of the store, behind store_read.h: runs (list, get, resolve),
 * trend, grid, alert transitions, integrity check. Used by the CLI on a read-only handle and by
 * the daemon's restore. Calls store.c's helpers (store_internal.h) and SQLite; nothing of
 * store_write.c.
 *
 * How it works
 * - Each query is one statement of store.c's table; deliver() steps it to its end and hands each
 *   row to the caller's callback as a struct whose strings point into SQLite's current row (hence
 *   valid only during the call). The order of the rows is the statement's ORDER BY.
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

static double col_f64(sqlite3_stmt *s, int i)
{
    return sqlite3_column_type(s, i) == SQLITE_NULL ? NAN : sqlite3_column_double(s, i);
}

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
    if (!r->name)
        r->name = "";
}

static void read_sample(sqlite3_stmt *s, store_sample *o)
{
    o->run_id = sqlite3_column_int64(s, 0);
    o->layer = sqlite3_column_int(s, 1);
    o->head = sqlite3_column_int(s, 2);
    o->step = sqlite3_column_int64(s, 3);
    o->time_ms = sqlite3_column_int64(s, 4);
    stats_head *h = &o->stats;
    h->rows = sqlite3_column_int64(s, 5);
    h->rows_norm = sqlite3_column_int64(s, 6);
    h->rows_empty = sqlite3_column_int64(s, 7);
    h->nonfinite_rows = sqlite3_column_int64(s, 8);
    h->entropy_mean = col_f64(s, 9);
    h->entropy_std = col_f64(s, 10);
    h->entropy_min = col_f64(s, 11);
    h->entropy_max = col_f64(s, 12);
    h->entropy_norm_mean = col_f64(s, 13);
    h->collapsed_frac = col_f64(s, 14);
    h->max_logit = col_f64(s, 15);
    h->sampled = sqlite3_column_int(s, 16);
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

enum { ROW_RUN, ROW_SAMPLE, ROW_ALERT };

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
        } else if (kind == ROW_SAMPLE) {
            store_sample r;
            read_sample(s, &r);
            stop = ((store_sample_cb)cb)(ctx, &r);
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
    sqlite3_stmt *s = store_stmt(st, S_RUN_ONE, err);
    if (!s)
        return STORE_ERROR;
    int rc = bind_i64(s, ":run", run_id);
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
    BIND(bind_text(s, ":name", spec));
    BIND(bind_i64(s, ":rank", rank));
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
    sqlite3_stmt *s = store_stmt(st, head >= 0 ? S_TREND_HEAD : S_TREND_LAYER, err);
    if (!s)
        return STORE_ERROR;
    int rc = SQLITE_OK;
    BIND(bind_i64(s, ":run", run_id));
    BIND(bind_i64(s, ":layer", layer));
    if (head >= 0)
        BIND(bind_i64(s, ":head", head));
    BIND(bind_i64(s, ":from", step_from));
    BIND(bind_i64(s, ":to", step_to));
    BIND(bind_i64(s, ":every", every > 1 ? every : 1));
    if (rc != SQLITE_OK) {
        stmt_done(s);
        return store_db_err(st, err, rc, "binding the trend query");
    }
    return deliver(st, s, ROW_SAMPLE, (void *)cb, ctx, NULL, "reading a trend", err);
}

store_status store_grid(store *st, int64_t run_id, int64_t step, int64_t *step_used,
                        store_sample_cb cb, void *ctx, store_error *err)
{
    if (check_cb((const void *)cb, err))
        return STORE_EINVAL;
    if (step == STORE_STEP_LATEST) {
        sqlite3_stmt *q = store_stmt(st, S_RUN_ONE, err);
        if (!q)
            return STORE_ERROR;
        int rc = bind_i64(q, ":run", run_id);
        if (rc == SQLITE_OK)
            rc = sqlite3_step(q);
        int have = 0;
        if (rc == SQLITE_ROW) {
            have = sqlite3_column_type(q, 11) != SQLITE_NULL;
            step = sqlite3_column_int64(q, 11);
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
    }
    if (step_used)
        *step_used = step;
    sqlite3_stmt *s = store_stmt(st, S_GRID, err);
    if (!s)
        return STORE_ERROR;
    int rc = SQLITE_OK;
    BIND(bind_i64(s, ":run", run_id));
    BIND(bind_i64(s, ":step", step));
    if (rc != SQLITE_OK) {
        stmt_done(s);
        return store_db_err(st, err, rc, "binding the grid query");
    }
    int64_t n = 0;
    store_status rs = deliver(st, s, ROW_SAMPLE, (void *)cb, ctx, &n, "reading a step", err);
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
    sqlite3_stmt *s = store_stmt(st, active_only ? S_ALERTS_ACTIVE : S_ALERTS_ALL, err);
    if (!s)
        return STORE_ERROR;
    int rc = bind_i64(s, ":run", run_id > 0 ? run_id : 0);
    if (rc != SQLITE_OK) {
        stmt_done(s);
        return store_db_err(st, err, rc, "binding the alert query");
    }
    return deliver(st, s, ROW_ALERT, (void *)cb, ctx, NULL, "reading alerts", err);
}

/* PRAGMA integrity_check or quick_check: STORE_OK when it answers "ok"; else STORE_ERROR with as
 * many of its problems as fit in err (it lists at most 100). */
static store_status run_check(store *st, const char *pragma, const char *what, store_error *err)
{
    sqlite3_stmt *s = NULL;
    int rc = sqlite3_prepare_v2(st->db, pragma, -1, &s, NULL);
    int rows = 0;
    store_status rs = STORE_OK;
    while (rc == SQLITE_OK || rc == SQLITE_ROW) {
        rc = sqlite3_step(s);
        if (rc != SQLITE_ROW)
            break;
        const char *r = (const char *)sqlite3_column_text(s, 0);
        if (rows++ == 0 && r && strcmp(r, "ok") == 0)
            continue;
        if (rs == STORE_OK) {
            store_set_err(err, SQLITE_CORRUPT, "%s of '%s' failed: %s", what, st->path,
                          r ? r : "(no answer)");
            rs = STORE_ERROR;
        } else {
            store_append_err(err, "; %s", r ? r : "?");
        }
    }
    if (rc != SQLITE_DONE && rs == STORE_OK)
        rs = store_db_err(st, err, rc, "%s of '%s'", what, st->path);
    sqlite3_finalize(s);
    return rs;
}

store_status store_integrity_check(store *st, store_error *err)
{
    return run_check(st, "PRAGMA integrity_check(100)", "integrity check", err);
}

store_status store_quick_check(store *st, store_error *err)
{
    return run_check(st, "PRAGMA quick_check(100)", "quick check", err);
}
