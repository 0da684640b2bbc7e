/* store_read.c — the reading half of the store, behind store_read.h: runs (list, get, resolve),
 * trend, grid, alert transitions, integrity check. Used by the CLI on a read-only handle and by
 * the daemon's restore. Calls store_core.c's helpers and store_rows.c's row decoders
 * (store_internal.h) and SQLite; nothing of store_write.c or store_retain.c.
 *
 * How it works
 * - Runs and alerts are one statement each of store_sql.c's table; deliver() steps it to its end
 *   and hands each row to the caller's callback as a struct whose strings point into SQLite's
 *   current row (hence valid only during the call). The order is the statement's ORDER BY.
 * - Trend and grid read three statements, one per tier, inside one read transaction
 *   (store_read_begin()). Each statement's rows come in the order of the result (a trend: by step;
 *   a grid: by layer); a cursor holds each statement's current row and its key. The reader takes
 *   the smallest key of the cursors at a time: a bucket at that key is delivered first, then the
 *   compact row and the exact rows of that key are merged head by head (the exact tier wins a head
 *   both have: it was pushed later). A cursor whose key goes backwards is an error, so a plan that
 *   stopped delivering in order cannot go unnoticed. Compact rows are decoded into the handle's
 *   scratch buffers (one head only when a trend asks for one). Thinning (every) counts the distinct
 *   keys that delivered something: the first, then every every-th.
 * - The latest step of a run is the runs table's summary (step_max), never a scan of samples.
 */
#include "store_read.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "store_internal.h"

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
    r->has_owner = sqlite3_column_type(s, 16) != SQLITE_NULL;
    r->owner_uid = r->has_owner ? (uint32_t)sqlite3_column_int64(s, 16) : 0;
    r->ended_ms = sqlite3_column_int64(s, 17);
    r->end_reason = r->ended_ms ? col_text(s, 18) : NULL;
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
    a->state = state && strcmp(state, "raised") == 0     ? STORE_ALERT_RAISED
               : state && strcmp(state, "resolved") == 0 ? STORE_ALERT_RESOLVED
                                                         : STORE_ALERT_CLEARED;
    a->value = col_f64(s, 7);
    a->threshold = col_f64(s, 8);
    a->time_ms = sqlite3_column_int64(s, 9);
    a->message = col_text(s, 10);
    a->reason = col_text(s, 11);
    a->has_uid = sqlite3_column_type(s, 12) != SQLITE_NULL;
    a->uid = a->has_uid ? (uint32_t)sqlite3_column_int64(s, 12) : 0;
    a->acked = sqlite3_column_type(s, 13) != SQLITE_NULL;
    a->ack_uid = a->acked ? (uint32_t)sqlite3_column_int64(s, 13) : 0;
    a->ack_ms = a->acked ? sqlite3_column_int64(s, 14) : 0;
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

/* ---- cursors ---------------------------------------------------------------------------------- */

typedef struct {
    sqlite3_stmt *s;
    int key_col;    /* the column the rows are ordered by */
    int live;       /* on a row */
    int64_t key;
    const char *what;
} cursor;

static store_status cur_next(store *st, cursor *c, store_error *err)
{
    int rc = sqlite3_step(c->s);
    if (rc == SQLITE_ROW) {
        int64_t k = sqlite3_column_int64(c->s, c->key_col);
        if (c->live && k < c->key) {
            c->live = 0;
            store_set_err(err, SQLITE_INTERNAL, "%s in '%s': rows out of order (%" PRId64
                          " after %" PRId64 "): a query plan changed", c->what, st->path, k,
                          c->key);
            return STORE_ERROR;
        }
        c->key = k;
        c->live = 1;
        return STORE_OK;
    }
    c->live = 0;
    if (rc == SQLITE_DONE)
        return STORE_OK;
    return store_db_err(st, err, rc, "%s in '%s'", c->what, st->path);
}

/* The exact rows at the cursor whose key is key, into BUF_B (ordered by head). */
static store_status collect_hot(store *st, cursor *c, int64_t key, int32_t *n, store_error *err)
{
    int32_t k = 0;
    while (c->live && c->key == key) {
        store_pack_head *b = store_scratch(st, BUF_B, (size_t)(k + 1) * sizeof *b, err);
        if (!b)
            return STORE_ERROR;
        store_row_hot(c->s, &b[k++], NULL, NULL);
        if (cur_next(st, c, err))
            return STORE_ERROR;
    }
    *n = k;
    return STORE_OK;
}

static int64_t min_key(const cursor *c, int n)
{
    int64_t m = INT64_MAX;
    int any = 0;
    for (int i = 0; i < n; i++)
        if (c[i].live && (!any || c[i].key < m)) {
            m = c[i].key;
            any = 1;
        }
    return any ? m : INT64_MAX;
}

static int any_live(const cursor *c, int n)
{
    for (int i = 0; i < n; i++)
        if (c[i].live)
            return 1;
    return 0;
}

/* ---- delivering ------------------------------------------------------------------------------- */

typedef struct {
    store_sample_cb cb;
    void *ctx;
    int64_t run_id;
    int64_t every, seen;  /* thinning: keys that delivered something so far */
    int stopped;
    int64_t delivered;
} sink;

static void emit(sink *k, int32_t layer, int64_t step, const store_pack_head *h, int32_t tier)
{
    store_sample s = {.run_id = k->run_id, .layer = layer, .head = h->head, .step = step,
                      .time_ms = h->time_ms, .stats = h->s, .tier = tier, .step_last = step,
                      .merged = 1};
    k->delivered++;
    if (k->cb(k->ctx, &s))
        k->stopped = 1;
}

/* One key's compact heads a[0 .. na-1] and exact heads b[0 .. nb-1], merged by head. */
static void emit_merged(sink *k, int32_t layer, int64_t step, const store_pack_head *a,
                        int32_t na, const store_pack_head *b, int32_t nb)
{
    if (na + nb == 0 || k->seen++ % k->every != 0)
        return;
    int32_t i = 0, j = 0;
    while (!k->stopped && (i < na || j < nb)) {
        if (j < nb && (i >= na || b[j].head <= a[i].head)) {
            if (i < na && a[i].head == b[j].head)
                i++;
            emit(k, layer, step, &b[j++], STORE_TIER_EXACT);
        } else {
            emit(k, layer, step, &a[i++], STORE_TIER_COMPACT);
        }
    }
}

/* The bucket decoded by store_row_bucket() (n heads): every head (head < 0) or one. */
static void emit_bucket(store *st, sink *k, int32_t layer, int64_t lo_step, int64_t hi_step,
                        int32_t n, int32_t head)
{
    const store_pack_head *lo = st->buf[BUF_LO].p, *mean = st->buf[BUF_A].p;
    const store_pack_head *hi = st->buf[BUF_HI].p;
    const int64_t *merged = st->buf[BUF_COUNTS].p;
    int32_t first = 0, last = n;
    if (head >= 0) {
        first = last = 0;
        for (int32_t i = 0; i < n; i++)
            if (mean[i].head == head) {
                first = i;
                last = i + 1;
            }
    }
    if (first == last || k->seen++ % k->every != 0)
        return;
    for (int32_t i = first; i < last && !k->stopped; i++) {
        store_sample s = {.run_id = k->run_id, .layer = layer, .head = mean[i].head,
                          .step = lo_step, .time_ms = mean[i].time_ms, .stats = mean[i].s,
                          .tier = STORE_TIER_BUCKET, .step_last = hi_step, .merged = merged[i],
                          .min = &lo[i].s, .max = &hi[i].s};
        k->delivered++;
        if (k->cb(k->ctx, &s))
            k->stopped = 1;
    }
}

/* ---- trend: the three tiers merged ------------------------------------------------------------------------------------ */

static store_status tiers_trend(store *st, int64_t run_id, int32_t layer, int32_t head,
                               int64_t step_from, int64_t step_to, int64_t every,
                               store_sample_cb cb, void *ctx, store_error *err)
{
    cursor c[3] = {
        {.s = store_stmt(st, S_COARSE_TREND, err), .key_col = 0, .what = "reading buckets"},
        {.s = NULL, .key_col = 0, .what = "reading the compact tier"},
        {.s = NULL, .key_col = 3, .what = "reading the exact tier"},
    };
    if (c[0].s)
        c[1].s = store_stmt(st, S_PACK_TREND, err);
    if (c[1].s)
        c[2].s = store_stmt(st, head >= 0 ? S_HOT_TREND_HEAD : S_HOT_TREND_LAYER, err);
    if (!c[2].s)
        return STORE_ERROR;
    int rc = SQLITE_OK;
    for (int i = 0; i < 3; i++) {
        BIND(bind_i64(c[i].s, 1, run_id));
        BIND(sqlite3_bind_int(c[i].s, 2, layer));
        BIND(bind_i64(c[i].s, 3, step_from));
        BIND(bind_i64(c[i].s, 4, step_to));
    }
    if (head >= 0)
        BIND(sqlite3_bind_int(c[2].s, 5, head));
    store_status rs = STORE_OK;
    if (rc != SQLITE_OK)
        rs = store_db_err(st, err, rc, "binding the trend query");
    sink k = {.cb = cb, .ctx = ctx, .run_id = run_id, .every = every > 1 ? every : 1};
    for (int i = 0; rs == STORE_OK && i < 3; i++)
        rs = cur_next(st, &c[i], err);
    while (rs == STORE_OK && !k.stopped && any_live(c, 3)) {
        int64_t m = min_key(c, 3);
        if (c[0].live && c[0].key == m) {
            int32_t n = 0;
            if (store_row_bucket(st, c[0].s, 3, sqlite3_column_int64(c[0].s, 2), &n, err)) {
                rs = STORE_ERROR;
                break;
            }
            emit_bucket(st, &k, layer, m, sqlite3_column_int64(c[0].s, 1), n, head);
            rs = cur_next(st, &c[0], err);
            continue;
        }
        int32_t na = 0, nb = 0;
        if (c[1].live && c[1].key == m) {
            if (store_row_pack(st, c[1].s, 1, 2, head, &na, err)) {
                rs = STORE_ERROR;
                break;
            }
            if ((rs = cur_next(st, &c[1], err)))
                break;
        }
        if (c[2].live && c[2].key == m && (rs = collect_hot(st, &c[2], m, &nb, err)))
            break;
        emit_merged(&k, layer, m, st->buf[BUF_A].p, na, st->buf[BUF_B].p, nb);
    }
    for (int i = 0; i < 3; i++)
        stmt_done(c[i].s);
    return rs;
}

/* ---- grid: the three tiers merged ------------------------------------------------------------------------------------- */

static store_status tiers_grid(store *st, int64_t run_id, int64_t step, store_sample_cb cb,
                             void *ctx, int64_t *delivered, store_error *err)
{
    cursor c[2] = {
        {.s = store_stmt(st, S_PACK_GRID, err), .key_col = 0, .what = "reading the compact tier"},
        {.s = NULL, .key_col = 1, .what = "reading the exact tier"},
    };
    if (c[0].s)
        c[1].s = store_stmt(st, S_HOT_GRID, err);
    if (!c[1].s)
        return STORE_ERROR;
    int rc = SQLITE_OK;
    for (int i = 0; i < 2; i++) {
        BIND(bind_i64(c[i].s, 1, run_id));
        BIND(bind_i64(c[i].s, 2, step));
    }
    store_status rs = STORE_OK;
    if (rc != SQLITE_OK)
        rs = store_db_err(st, err, rc, "binding the grid query");
    sink k = {.cb = cb, .ctx = ctx, .run_id = run_id, .every = 1};
    for (int i = 0; rs == STORE_OK && i < 2; i++)
        rs = cur_next(st, &c[i], err);
    while (rs == STORE_OK && !k.stopped && any_live(c, 2)) {
        int64_t m = min_key(c, 2);
        int32_t na = 0, nb = 0;
        if (c[0].live && c[0].key == m) {
            if (store_row_pack(st, c[0].s, 1, 2, -1, &na, err)) {
                rs = STORE_ERROR;
                break;
            }
            if ((rs = cur_next(st, &c[0], err)))
                break;
        }
        if (c[1].live && c[1].key == m && (rs = collect_hot(st, &c[1], m, &nb, err)))
            break;
        emit_merged(&k, (int32_t)m, step, st->buf[BUF_A].p, na, st->buf[BUF_B].p, nb);
    }
    for (int i = 0; i < 2; i++)
        stmt_done(c[i].s);

    /* No sample left at this step: the buckets whose window holds it. */
    if (rs == STORE_OK && k.delivered == 0) {
        cursor b = {.s = store_stmt(st, S_COARSE_AT, err), .key_col = 0,
                    .what = "reading buckets"};
        if (!b.s)
            return STORE_ERROR;
        rc = SQLITE_OK;
        BIND(bind_i64(b.s, 1, run_id));
        BIND(bind_i64(b.s, 2, step));
        if (rc != SQLITE_OK)
            rs = store_db_err(st, err, rc, "binding the bucket query");
        if (rs == STORE_OK)
            rs = cur_next(st, &b, err);
        while (rs == STORE_OK && b.live && !k.stopped) {
            int32_t n = 0;
            if (store_row_bucket(st, b.s, 4, sqlite3_column_int64(b.s, 3), &n, err)) {
                rs = STORE_ERROR;
                break;
            }
            emit_bucket(st, &k, (int32_t)b.key, sqlite3_column_int64(b.s, 1),
                        sqlite3_column_int64(b.s, 2), n, -1);
            rs = cur_next(st, &b, err);
        }
        stmt_done(b.s);
    }
    *delivered = k.delivered;
    return rs;
}

/* ---- trend and grid ------------------------------------------------------------------------- */

store_status store_trend(store *st, int64_t run_id, int32_t layer, int32_t head,
                         int64_t step_from, int64_t step_to, int64_t every,
                         store_sample_cb cb, void *ctx, store_error *err)
{
    if (check_cb((const void *)cb, err))
        return STORE_EINVAL;
    int began = 0;
    store_status rs = store_read_begin(st, &began, err);
    if (rs == STORE_OK)
        rs = tiers_trend(st, run_id, layer, head, step_from, step_to, every, cb, ctx, err);
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
        rs = tiers_grid(st, run_id, step, cb, ctx, &n, err);
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

/* ---- the lifecycle: one alert, silences ------------------------------------------------------- */

static const char *state_word(int32_t state)
{
    return state == STORE_ALERT_RAISED    ? "a raise"
           : state == STORE_ALERT_CLEARED ? "a clear"
                                          : "a resolve";
}

store_status store_active_alert(store *st, int64_t alert_id, store_alert_cb cb, void *ctx,
                                store_error *err)
{
    if (check_cb((const void *)cb, err))
        return STORE_EINVAL;
    sqlite3_stmt *s = store_stmt(st, S_ALERT_ONE, err);
    if (!s)
        return STORE_ERROR;
    int rc = bind_i64(s, 1, alert_id);
    if (rc == SQLITE_OK)
        rc = sqlite3_step(s);
    if (rc == SQLITE_DONE) {
        stmt_done(s);
        store_set_err(err, 0, "no alert with id %" PRId64 " (see attnstat alerts)", alert_id);
        return STORE_NOTFOUND;
    }
    if (rc != SQLITE_ROW) {
        store_db_err(st, err, rc, "reading alert %" PRId64 " in '%s'", alert_id, st->path);
        stmt_done(s);
        return STORE_ERROR;
    }
    store_alert a;
    read_alert(s, &a);
    int64_t latest = sqlite3_column_int64(s, 15);
    store_status rs = STORE_EINVAL;
    if (a.state != STORE_ALERT_RAISED) {
        store_set_err(err, 0, "alert %" PRId64 " is %s, not a raise: the raise it ends is listed "
                      "before it (attnstat alerts --run %" PRId64 ")", alert_id,
                      state_word(a.state), a.run_id);
    } else if (latest != alert_id) {
        store_set_err(err, 0, "alert %" PRId64 " (%s of run %" PRId64 " layer %" PRId32
                      " head %" PRId32 ") is no longer active: transition %" PRId64
                      " came after it", alert_id, a.rule, a.run_id, a.layer, a.head, latest);
    } else {
        rs = STORE_OK;
        cb(ctx, &a);
    }
    stmt_done(s);
    return rs;
}

store_status store_silences(store *st, int64_t run_id, int64_t now_ms, store_silence_cb cb,
                            void *ctx, store_error *err)
{
    if (check_cb((const void *)cb, err))
        return STORE_EINVAL;
    if (now_ms == 0) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        now_ms = (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
    }
    sqlite3_stmt *s = store_stmt(st, S_SILENCES, err);
    if (!s)
        return STORE_ERROR;
    int rc = SQLITE_OK;
    BIND(bind_i64(s, 1, now_ms));
    BIND(bind_i64(s, 2, run_id > 0 ? run_id : 0));
    while (rc == SQLITE_OK && (rc = sqlite3_step(s)) == SQLITE_ROW) {
        store_silence v = {
            .id = sqlite3_column_int64(s, 0),
            .run_id = sqlite3_column_int64(s, 1),
            .layer = sqlite3_column_int(s, 2),
            .head = sqlite3_column_int(s, 3),
            .rule = col_text(s, 4),
            .uid = (uint32_t)sqlite3_column_int64(s, 5),
            .time_ms = sqlite3_column_int64(s, 6),
            .until_ms = sqlite3_column_int64(s, 7),
        };
        if (!v.rule)
            v.rule = "";
        if (cb(ctx, &v)) {
            rc = SQLITE_DONE;
            break;
        }
        rc = SQLITE_OK;
    }
    store_status rs = STORE_OK;
    if (rc != SQLITE_DONE)
        rs = store_db_err(st, err, rc, "reading silences in '%s'", st->path);
    stmt_done(s);
    return rs;
}

/* PRAGMA integrity_check or quick_check: STORE_OK when it answers "ok"; else STORE_ERROR with as
 * many of its problems as fit in err (it lists at most 100). */
/* store_integrity_check / store_quick_check: the problems store_check_problems finds, joined
 * with "; " into err's message after the first (as many as fit). */
typedef struct {
    char text[sizeof ((store_error *)0)->msg];
    size_t len;
} check_text;

static int check_join(void *ctx, const char *line)
{
    check_text *t = ctx;
    if (t->len < sizeof t->text - 1) {
        int n = snprintf(t->text + t->len, sizeof t->text - t->len, "%s%s", t->len ? "; " : "",
                         line);
        t->len = n < 0 ? t->len : t->len + (size_t)n;
        if (t->len > sizeof t->text - 1)
            t->len = sizeof t->text - 1;
    }
    return 0;
}

static store_status run_check(store *st, int quick, store_error *err)
{
    check_text t = {.len = 0};
    uint64_t problems = 0;
    store_status rs = store_check_problems(st, quick, check_join, &t, &problems, err);
    if (rs != STORE_OK && problems > 0)
        store_set_err(err, SQLITE_CORRUPT, "%s of '%s' failed: %s",
                      quick ? "quick check" : "integrity check", st->path, t.text);
    return rs;
}

store_status store_integrity_check(store *st, store_error *err)
{
    return run_check(st, 0, err);
}

store_status store_quick_check(store *st, store_error *err)
{
    return run_check(st, 1, err);
}

store_status store_check_problems(store *st, int quick, store_problem_fn fn, void *ctx,
                                  uint64_t *problems, store_error *err)
{
    const char *what = quick ? "quick check" : "integrity check";
    *problems = 0;
    sqlite3_stmt *s = NULL;
    int rc = sqlite3_prepare_v2(st->db, quick ? "PRAGMA quick_check(100)"
                                              : "PRAGMA integrity_check(100)", -1, &s, NULL);
    int rows = 0, stop = 0;
    while (!stop && (rc == SQLITE_OK || rc == SQLITE_ROW)) {
        rc = sqlite3_step(s);
        if (rc != SQLITE_ROW)
            break;
        const char *r = (const char *)sqlite3_column_text(s, 0);
        if (rows++ == 0 && r && strcmp(r, "ok") == 0)
            continue;
        if (!r)
            r = "(no answer)";
        /* One answer may hold several lines (a b-tree's header, then its pages' problems). */
        while (!stop && *r) {
            size_t n = strcspn(r, "\n");
            char line[1024];
            snprintf(line, sizeof line, "%.*s", (int)(n < sizeof line ? n : sizeof line - 1), r);
            if (n > 0) {
                (*problems)++;
                stop = fn(ctx, line) != 0;
            }
            r += n + (r[n] == '\n');
        }
    }
    if (rc != SQLITE_DONE && rc != SQLITE_ROW && *problems == 0) {
        store_status rs = store_db_err(st, err, rc, "%s of '%s'", what, st->path);
        sqlite3_finalize(s);
        return rs;
    }
    sqlite3_finalize(s);
    if (*problems == 0)
        return STORE_OK;
    store_set_err(err, SQLITE_CORRUPT, "%s of '%s' found %llu problem%s", what, st->path,
                  (unsigned long long)*problems, *problems == 1 ? "" : "s");
    return STORE_ERROR;
}
