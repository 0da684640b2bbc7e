/* store_read_time.c — reads of the store that place a run's samples in time and list its layers,
 * behind store_read.h: store_time_steps() (a window of wall-clock time as the run's steps),
 * store_step_before() (the step stored before a step) and store_run_layers(). Used by the CLI on a
 * read-only handle. Calls store_core.c's helpers (store_internal.h) and SQLite.
 *
 * How it works
 * - Times live with the samples (001_init.sql: Unix milliseconds): an exact row's own time, a
 *   compact row's time (history.time, covered by history_step), a bucket's newest merged time. A
 *   window's steps come from one question asked of each tier, "the newest step stored at or before
 *   T": each tier's rows are walked from the newest step down and the walk stops at the first
 *   row old enough, so a window near the present (the usual '-1h') reads only its own rows.
 * - These statements are prepared for each call (a command asks a few times, never per sample):
 *   the store's statement table stays the daemon's and the hot readers'.
 */
#include "store_read.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "store_internal.h"

/* ?1 run, ?2 time: the newest step of a sample stored at or before ?2, any tier (NULL: none). A
 * bucket counts with its window's last step at the newest time it merged. */
static const char time_step_sql[] =
    "SELECT max(s) FROM ("
    "SELECT (SELECT step FROM samples WHERE run_id = ?1 AND time <= ?2 ORDER BY step DESC "
    "LIMIT 1) AS s "
    "UNION ALL SELECT (SELECT step FROM history INDEXED BY history_step WHERE run_id = ?1 AND "
    "time <= ?2 ORDER BY step DESC LIMIT 1) "
    "UNION ALL SELECT (SELECT step_hi FROM coarse INDEXED BY coarse_step WHERE run_id = ?1 AND "
    "time <= ?2 ORDER BY step_lo DESC LIMIT 1))";

/* ?1 run, ?2 step: the newest step stored before ?2, any tier (a bucket: its window's last step
 * when the whole window is before ?2, else its first when that is) (NULL: none). */
static const char step_before_sql[] =
    "SELECT max(s) FROM ("
    "SELECT (SELECT max(step) FROM samples WHERE run_id = ?1 AND step < ?2) AS s "
    "UNION ALL SELECT (SELECT max(step) FROM history INDEXED BY history_step WHERE run_id = ?1 "
    "AND step < ?2) "
    "UNION ALL SELECT (SELECT max(min(step_hi, ?2 - 1)) FROM coarse INDEXED BY coarse_step "
    "WHERE run_id = ?1 AND step_lo < ?2))";

/* One integer (*isnull: NULL) from sql with ?1 = a, ?2 = b. */
static store_status time_query(store *st, const char *sql, int64_t a, int64_t b, int64_t *v,
                               int *isnull, const char *what, store_error *err)
{
    sqlite3_stmt *s = NULL;
    int rc = sqlite3_prepare_v2(st->db, sql, -1, &s, NULL);
    if (rc != SQLITE_OK) {
        store_status rs = store_db_err(st, err, rc, "preparing the query for %s in '%s'", what,
                                       st->path);
        sqlite3_finalize(s);
        return rs;
    }
    BIND(bind_i64(s, 1, a));
    BIND(bind_i64(s, 2, b));
    if (rc == SQLITE_OK)
        rc = sqlite3_step(s);
    store_status rs = STORE_OK;
    if (rc == SQLITE_ROW) {
        *isnull = sqlite3_column_type(s, 0) == SQLITE_NULL;
        *v = sqlite3_column_int64(s, 0);
    } else {
        rs = store_db_err(st, err, rc == SQLITE_DONE ? SQLITE_INTERNAL : rc, "%s in '%s'", what,
                          st->path);
    }
    sqlite3_finalize(s);
    return rs;
}

store_status store_time_steps(store *st, int64_t run_id, int64_t since_ms, int64_t until_ms,
                              int64_t *step_from, int64_t *step_to, store_error *err)
{
    int began = 0;
    store_status rs = store_read_begin(st, &began, err);
    if (rs == STORE_OK)
        rs = store_check_run(st, run_id, err);
    int64_t before = 0, last = 0;
    int none_before = 1, none_last = 1;
    /* the newest step stored before the window: the window starts after it */
    if (rs == STORE_OK && since_ms != INT64_MIN)
        rs = time_query(st, time_step_sql, run_id, since_ms - 1, &before, &none_before,
                        "finding the steps stored before a time", err);
    /* the newest step stored in the window (or at all, with no end) */
    if (rs == STORE_OK)
        rs = time_query(st, time_step_sql, run_id, until_ms, &last, &none_last,
                        "finding the steps stored by a time", err);
    store_read_end(st, began);
    if (rs != STORE_OK)
        return rs;
    if (none_last || since_ms > until_ms || (!none_before && last <= before)) {
        store_set_err(err, 0, "run %" PRId64 " has no sample stored in that time", run_id);
        return STORE_NOTFOUND;
    }
    *step_from = none_before ? INT64_MIN : before + 1;
    *step_to = until_ms == INT64_MAX ? INT64_MAX : last;
    return STORE_OK;
}

store_status store_step_before(store *st, int64_t run_id, int64_t step, int64_t *prev,
                               store_error *err)
{
    if (step == INT64_MIN) {
        store_set_err(err, 0, "no step comes before step %" PRId64, step);
        return STORE_NOTFOUND;
    }
    int began = 0, none = 1;
    int64_t v = 0;
    store_status rs = store_read_begin(st, &began, err);
    if (rs == STORE_OK)
        rs = store_check_run(st, run_id, err);
    if (rs == STORE_OK)
        rs = time_query(st, step_before_sql, run_id, step, &v, &none,
                        "finding the step before another", err);
    store_read_end(st, began);
    if (rs == STORE_OK && none) {
        store_set_err(err, 0, "run %" PRId64 " has no step stored before step %" PRId64, run_id,
                      step);
        return STORE_NOTFOUND;
    }
    if (rs == STORE_OK)
        *prev = v;
    return rs;
}

store_status store_run_layers(store *st, int64_t run_id, store_layer_cb cb, void *ctx,
                              store_error *err)
{
    if (!cb) {
        store_set_err(err, 0, "no callback given");
        return STORE_EINVAL;
    }
    int began = 0;
    store_status rs = store_read_begin(st, &began, err);
    if (rs == STORE_OK)
        rs = store_check_run(st, run_id, err);
    sqlite3_stmt *s = rs == STORE_OK ? store_stmt(st, S_LAYERS, err) : NULL;
    if (rs == STORE_OK && !s)
        rs = STORE_ERROR;
    if (rs == STORE_OK) {
        int rc = bind_i64(s, 1, run_id);
        while (rc == SQLITE_OK && (rc = sqlite3_step(s)) == SQLITE_ROW) {
            if (cb(ctx, sqlite3_column_int(s, 0))) {
                rc = SQLITE_DONE;
                break;
            }
            rc = SQLITE_OK;
        }
        if (rc != SQLITE_DONE)
            rs = store_db_err(st, err, rc, "listing the layers of run %" PRId64 " in '%s'",
                              run_id, st->path);
        stmt_done(s);
    }
    store_read_end(st, began);
    return rs;
}
