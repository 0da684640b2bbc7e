/* store_write.c — the daemon's half of the store, behind store_write.h: runs begun or resumed,
 * samples and alert transitions added to the open batch, commit and rollback, counts.
 * Calls store_core.c's helpers (store_internal.h) and SQLite; nothing of store_read.c.
 *
 * How it works
 * - The batch is one transaction, begun with BEGIN IMMEDIATE by the first write (so it holds the
 *   write lock from the start and never fails half-way on a lock upgrade); store_commit() ends it.
 *   The run a write names is checked inside it (and cached for the rest of the batch only), so a
 *   run deleted through another handle is never written to.
 *   A write failure rolls it back. SQLite itself may roll a transaction back on some errors (out
 *   of memory, I/O, full disk); after any failure the handle checks sqlite3_get_autocommit() (in
 *   store_db_err()) so its idea of the batch never drifts from SQLite's.
 * - The runs table carries a per-run summary (sample count, step range, last time, size) so that
 *   listing runs and finding the latest step never scan samples. A batch gathers what it does to
 *   each run in memory (store_run_delta) and writes it once, before its commit: one UPDATE per run
 *   per batch instead of one per push.
 * - The hot path is one prepared INSERT per head into the exact tier, its 17 parameters bound by
 *   position; the tier is keyed (run, step, layer, head), so a push appends at the B-tree's end.
 *   A sample is inserted with ON CONFLICT DO NOTHING and updated in place when that inserted
 *   nothing, which tells new rows from replaced ones and keeps the count exact. The run is checked
 *   once per push (cached), not by a foreign key per row.
 */
#include "store_write.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "store_internal.h"
#include "store_read.h"

static int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* ---- batches and counts ---------------------------------------------------------------------- */

static store_status check_writable(store *st, store_error *err)
{
    if (st->readonly) {
        store_set_err(err, 0, "database '%s' was opened read-only", st->path);
        return STORE_EINVAL;
    }
    return STORE_OK;
}

static store_status batch_begin(store *st, store_error *err)
{
    if (st->in_batch)
        return STORE_OK;
    if (!sqlite3_get_autocommit(st->db))
        store_rollback(st); /* a rollback that failed earlier left a transaction behind */
    if (store_step_simple(st, S_BEGIN, err) != SQLITE_OK) {
        store_append_err(err, " (starting a batch in '%s')", st->path);
        return STORE_ERROR;
    }
    st->in_batch = 1;
    st->pending = 0;
    /* The batch holds the write lock: a run checked from now on cannot be deleted by another
     * handle before the commit, and one deleted before it is looked up again. */
    st->known_run = 0;
    return STORE_OK;
}

void store_rollback(store *st)
{
    if (!st)
        return;
    store_batch_rollback(st);
}

/* A write failed: roll back the batch and say so. */
static store_status batch_fail(store *st, store_error *err)
{
    if (st->in_batch) {
        if (err && !strstr(err->msg, "was rolled back"))
            store_append_err(err, "; the open batch of %" PRId64 " samples was rolled back",
                             st->pending);
        store_rollback(st);
    }
    return STORE_ERROR;
}

/* The batch open (begun when none was) and run_id checked to exist: STORE_OK with the batch open;
 * a read-only store or a run that does not exist leaves the batch as it was (none, when this call
 * began it); an SQLite failure rolls it back. */
static store_status begin_for_run(store *st, int64_t run_id, store_error *err)
{
    store_status rs = check_writable(st, err);
    if (rs)
        return rs;
    int began = !st->in_batch;
    if ((rs = batch_begin(st, err)))
        return rs;
    if ((rs = store_check_run(st, run_id, err))) {
        if (rs == STORE_ERROR)
            return batch_fail(st, err);
        if (began)
            store_rollback(st); /* the batch as it was: none */
        return rs;
    }
    return STORE_OK;
}

store_status store_commit(store *st, store_error *err)
{
    if (!st->in_batch)
        return STORE_OK;
    if (store_flush_deltas(st, err) != STORE_OK) {
        store_append_err(err, " (committing a batch to '%s')", st->path);
        return batch_fail(st, err);
    }
    if (store_step_simple(st, S_COMMIT, err) != SQLITE_OK) {
        store_append_err(err, " (committing a batch to '%s')", st->path);
        return batch_fail(st, err);
    }
    st->written += st->pending;
    st->pending = 0;
    st->in_batch = 0;
    return STORE_OK;
}

int64_t store_pending(const store *st)
{
    return st->pending;
}

int64_t store_samples_written(const store *st)
{
    return st->written;
}

store_status store_count_samples(store *st, int64_t run_id, int64_t *count, store_error *err)
{
    if (st->in_batch && store_flush_deltas(st, err)) /* as the summary stood with this batch */
        return STORE_ERROR;
    sqlite3_stmt *s = store_stmt(st, run_id > 0 ? S_COUNT_ONE : S_COUNT_ALL, err);
    if (!s)
        return STORE_ERROR;
    int rc = SQLITE_OK;
    if (run_id > 0)
        BIND(bind_i64(s, 1, run_id));
    if (rc == SQLITE_OK)
        rc = sqlite3_step(s);
    store_status rs = STORE_OK;
    if (rc == SQLITE_ROW) {
        *count = sqlite3_column_int64(s, 0);
    } else if (rc == SQLITE_DONE) {
        store_set_err(err, 0, "no run with id %" PRId64 " in '%s'", run_id, st->path);
        rs = STORE_NOTFOUND;
    } else {
        rs = store_db_err(st, err, rc, "counting samples in '%s'", st->path);
    }
    stmt_done(s);
    return rs;
}

/* ---- writing --------------------------------------------------------------------------------- */

store_status store_add_run(store *st, const store_run_info *info, int64_t *run_id,
                           store_error *err)
{
    store_status rs = check_writable(st, err);
    if (rs)
        return rs;
    if (!info || !info->name || !*info->name) {
        store_set_err(err, 0, "a run needs a non-empty name");
        return STORE_EINVAL;
    }
    if (info->rank < 0 || info->id < 0) {
        store_set_err(err, 0, "run '%s': rank %" PRId32 " and id %" PRId64 " must not be negative",
                      info->name, info->rank, info->id);
        return STORE_EINVAL;
    }
    int began = !st->in_batch;
    if ((rs = batch_begin(st, err)))
        return rs;
    if (info->id > 0) { /* the id asked for must be free, or this run's own */
        int64_t taken = 0;
        int isnull = 1;
        sqlite3_stmt *q = store_stmt(st, S_RUN_ID_TAKEN, err);
        int rc = SQLITE_OK;
        if (q) {
            BIND(bind_i64(q, 1, info->id));
            BIND(bind_text(q, 2, info->name));
            BIND(bind_i64(q, 3, info->rank));
        }
        if (!q || rc != SQLITE_OK ||
            store_one_int(st, q, &taken, &isnull, "checking a run id", err) != STORE_OK) {
            if (q && rc != SQLITE_OK) {
                store_db_err(st, err, rc, "binding a run id");
                stmt_done(q);
            }
            return batch_fail(st, err);
        }
        if (!isnull) {
            store_set_err(err, 0, "run '%s' rank %" PRId32 ": id %" PRId64 " belongs to another "
                          "run", info->name, info->rank, info->id);
            if (began)
                store_rollback(st); /* the batch as it was: none */
            return STORE_EINVAL;
        }
    }
    sqlite3_stmt *s = store_stmt(st, S_RUN_UPSERT, err);
    if (!s)
        return batch_fail(st, err);
    int rc = SQLITE_OK;
    BIND(bind_text(s, 1, info->name));
    BIND(bind_i64(s, 2, info->rank));
    BIND(bind_text(s, 3, info->host));
    BIND(bind_i64(s, 4, info->pid));
    BIND(bind_i64(s, 5, info->time_ms ? info->time_ms : now_ms()));
    BIND(bind_text(s, 6, info->config));
    BIND(bind_text(s, 7, info->thresholds));
    BIND(info->has_owner ? bind_i64(s, 8, info->owner_uid) : sqlite3_bind_null(s, 8));
    BIND(info->id > 0 ? bind_i64(s, 9, info->id) : sqlite3_bind_null(s, 9));
    if (rc == SQLITE_OK) {
        rc = sqlite3_step(s);
        if (rc == SQLITE_ROW) {
            *run_id = sqlite3_column_int64(s, 0);
            rc = sqlite3_step(s);
        }
        if (rc == SQLITE_DONE)
            rc = SQLITE_OK;
    }
    if (rc != SQLITE_OK) {
        store_db_err(st, err, rc, "recording run '%s' rank %" PRId32, info->name, info->rank);
        stmt_done(s);
        return batch_fail(st, err);
    }
    stmt_done(s);
    return STORE_OK;
}

store_status store_run_begin(store *st, const store_run_info *info, int64_t *run_id,
                             store_error *err)
{
    store_status rs = store_add_run(st, info, run_id, err);
    return rs ? rs : store_commit(st, err);
}

/* Bind one head's row: the parameters of S_SAMPLE_INSERT and S_SAMPLE_UPDATE (HOT_COLS order). */
static int bind_sample(sqlite3_stmt *s, int64_t run_id, int32_t layer, int32_t head,
                       int64_t step, int64_t time_ms, const stats_head *h)
{
    int rc = SQLITE_OK;
    BIND(sqlite3_bind_int64(s, 1, run_id));
    BIND(sqlite3_bind_int(s, 2, layer));
    BIND(sqlite3_bind_int(s, 3, head));
    BIND(sqlite3_bind_int64(s, 4, step));
    BIND(sqlite3_bind_int64(s, 5, time_ms));
    for (int i = 0; i < VOCAB_NCOUNTS; i++)
        BIND(sqlite3_bind_int64(s, HOT_COL_COUNTS + 1 + i, *store_count((stats_head *)h, i)));
    for (int i = 0; i < VOCAB_NSTATS; i++)
        BIND(bind_f64(s, HOT_COL_STATS + 1 + i, store_stat_get(h, i)));
    BIND(sqlite3_bind_int(s, HOT_COL_SAMPLED + 1, h->sampled));
    return rc;
}

/* The open batch's delta of run_id (created when missing). NULL with err set when out of memory. */
static store_run_delta *delta_of(store *st, int64_t run_id, int64_t step, store_error *err)
{
    for (int i = 0; i < st->ndeltas; i++)
        if (st->deltas[i].run_id == run_id)
            return &st->deltas[i];
    if (st->ndeltas == st->capdeltas) {
        int cap = st->capdeltas ? st->capdeltas * 2 : 8;
        store_run_delta *d = sqlite3_realloc64(st->deltas, (uint64_t)cap * sizeof *d);
        if (!d) {
            store_set_err(err, SQLITE_NOMEM, "out of memory (the batch's run summaries)");
            return NULL;
        }
        st->deltas = d;
        st->capdeltas = cap;
    }
    store_run_delta *d = &st->deltas[st->ndeltas++];
    *d = (store_run_delta){.run_id = run_id, .step_min = step, .step_max = step,
                           .time_max = INT64_MIN};
    return d;
}

store_status store_add_samples(store *st, int64_t run_id, int64_t step, int32_t layer,
                               const stats_head *heads, int32_t nheads, int64_t time_ms,
                               store_error *err)
{
    return store_add_samples_at(st, run_id, step, layer, 0, heads, nheads, time_ms, err);
}

store_status store_add_samples_at(store *st, int64_t run_id, int64_t step, int32_t layer,
                                  int32_t head_base, const stats_head *heads, int32_t nheads,
                                  int64_t time_ms, store_error *err)
{
    store_status rs = check_writable(st, err);
    if (rs)
        return rs;
    if (!heads || nheads < 1 || layer < 0) {
        store_set_err(err, 0, "samples of run %" PRId64 " step %" PRId64 ": need layer >= 0 and at "
                "least one head (layer %" PRId32 ", %" PRId32 " heads)", run_id, step, layer,
                nheads);
        return STORE_EINVAL;
    }
    if (head_base < 0 || head_base > INT32_MAX - nheads + 1) {
        store_set_err(err, 0, "samples of run %" PRId64 " step %" PRId64 " layer %" PRId32 ": heads "
                "%" PRId32 " .. %" PRId32 " + %" PRId32 " are not all in 0 .. %" PRId32, run_id,
                step, layer, head_base, head_base, nheads - 1, INT32_MAX);
        return STORE_EINVAL;
    }
    if ((rs = begin_for_run(st, run_id, err)))
        return rs;
    if (!time_ms)
        time_ms = now_ms();
    sqlite3_stmt *ins = store_stmt(st, S_SAMPLE_INSERT, err);
    sqlite3_stmt *upd = ins ? store_stmt(st, S_SAMPLE_UPDATE, err) : NULL;
    store_run_delta *d = upd ? delta_of(st, run_id, step, err) : NULL;
    if (!d)
        return batch_fail(st, err);
    int64_t added = 0;
    int rc = SQLITE_OK;
    int32_t h;
    for (h = 0; h < nheads && rc == SQLITE_OK; h++) {
        int32_t head = head_base + h;
        rc = bind_sample(ins, run_id, layer, head, step, time_ms, &heads[h]);
        if (rc == SQLITE_OK)
            rc = sqlite3_step(ins);
        if (rc == SQLITE_DONE) {
            rc = SQLITE_OK;
            if (sqlite3_changes(st->db) > 0) {
                added++;
            } else { /* already stored: replace */
                rc = bind_sample(upd, run_id, layer, head, step, time_ms, &heads[h]);
                if (rc == SQLITE_OK)
                    rc = sqlite3_step(upd);
                if (rc == SQLITE_DONE)
                    rc = SQLITE_OK;
                if (rc != SQLITE_OK)
                    store_db_err(st, err, rc, "replacing sample run %" PRId64 " layer %" PRId32
                           " head %" PRId32 " step %" PRId64, run_id, layer, head, step);
                sqlite3_reset(upd);
            }
        } else {
            store_db_err(st, err, rc, "storing sample run %" PRId64 " layer %" PRId32
                         " head %" PRId32 " step %" PRId64, run_id, layer, head, step);
        }
        /* every parameter is bound again for the next head: no need to clear them */
        sqlite3_reset(ins);
    }
    if (rc != SQLITE_OK)
        return batch_fail(st, err);
    d->added += added;
    d->step_min = step < d->step_min ? step : d->step_min;
    d->step_max = step > d->step_max ? step : d->step_max;
    d->time_max = time_ms > d->time_max ? time_ms : d->time_max;
    st->pending += nheads;
    return STORE_OK;
}

/* ---- the parallel layout of a run ----------------------------------------------------------- */

/* Bounds of a layout's fields: group sizes and offsets far past any model, small enough that a
 * global number always fits in an int32_t. */
#define LAYOUT_SIZE_MAX (1 << 20)
#define LAYOUT_OFFSET_MAX (1 << 24)

store_status store_layout_check(const store_layout *l, store_error *err)
{
    if (!l) {
        store_set_err(err, 0, "no layout given");
        return STORE_EINVAL;
    }
    const struct {
        const char *name;
        int32_t rank, size;
    } g[] = {{"tp", l->tp_rank, l->tp_size}, {"pp", l->pp_rank, l->pp_size},
             {"dp", l->dp_rank, l->dp_size}, {"cp", l->cp_rank, l->cp_size}};
    for (size_t i = 0; i < sizeof g / sizeof g[0]; i++) {
        if (g[i].size < 1 || g[i].size > LAYOUT_SIZE_MAX || g[i].rank < 0 ||
            g[i].rank >= g[i].size) {
            store_set_err(err, 0, "layout: %s_rank %" PRId32 " of %s_size %" PRId32 ": the size "
                          "must be 1 .. %d and the rank 0 .. size - 1", g[i].name, g[i].rank,
                          g[i].name, g[i].size, LAYOUT_SIZE_MAX);
            return STORE_EINVAL;
        }
    }
    if (l->layer_offset < 0 || l->layer_offset > LAYOUT_OFFSET_MAX) {
        store_set_err(err, 0, "layout: layer_offset %" PRId32 " is not in 0 .. %d", l->layer_offset,
                      LAYOUT_OFFSET_MAX);
        return STORE_EINVAL;
    }
    if (l->head_offset < -1 || l->head_offset > LAYOUT_OFFSET_MAX) {
        store_set_err(err, 0, "layout: head_offset %" PRId32 " is not in 0 .. %d (or unset)",
                      l->head_offset, LAYOUT_OFFSET_MAX);
        return STORE_EINVAL;
    }
    return STORE_OK;
}

store_status store_run_set_layout(store *st, int64_t run_id, const store_layout *l,
                                  store_error *err)
{
    store_status rs = check_writable(st, err);
    if (rs)
        return rs;
    if (l && (rs = store_layout_check(l, err)))
        return rs;
    if ((rs = begin_for_run(st, run_id, err)))
        return rs;
    sqlite3_stmt *s = store_stmt(st, S_RUN_SET_LAYOUT, err);
    if (!s)
        return batch_fail(st, err);
    const int32_t v[10] = {l ? l->tp_rank : 0, l ? l->tp_size : 0, l ? l->pp_rank : 0,
                           l ? l->pp_size : 0, l ? l->dp_rank : 0, l ? l->dp_size : 0,
                           l ? l->cp_rank : 0, l ? l->cp_size : 0, l ? l->layer_offset : 0,
                           l ? l->head_offset : -1};
    int rc = bind_i64(s, 1, run_id);
    for (int i = 0; i < 10; i++)
        BIND(!l || (i == 9 && v[i] < 0) ? sqlite3_bind_null(s, i + 2) : bind_i64(s, i + 2, v[i]));
    if (rc == SQLITE_OK)
        rc = sqlite3_step(s);
    if (rc != SQLITE_DONE) {
        store_db_err(st, err, rc, "recording the layout of run %" PRId64, run_id);
        stmt_done(s);
        return batch_fail(st, err);
    }
    stmt_done(s);
    return store_commit(st, err);
}

store_status store_add_alert(store *st, const store_alert *a, store_error *err)
{
    store_status rs = check_writable(st, err);
    if (rs)
        return rs;
    if (!a || !a->rule || !*a->rule || a->layer < 0 || a->head < 0 ||
        (a->state != STORE_ALERT_RAISED && a->state != STORE_ALERT_CLEARED &&
         a->state != STORE_ALERT_RESOLVED)) {
        store_set_err(err, 0, "an alert needs a rule name, layer >= 0, head >= 0 and state "
                      "raised, cleared or resolved");
        return STORE_EINVAL;
    }
    if ((rs = begin_for_run(st, a->run_id, err)))
        return rs;
    sqlite3_stmt *s = store_stmt(st, S_ALERT_INSERT, err);
    if (!s)
        return batch_fail(st, err);
    int rc = SQLITE_OK;
    BIND(bind_i64(s, 1, a->run_id));
    BIND(bind_i64(s, 2, a->layer));
    BIND(bind_i64(s, 3, a->head));
    BIND(bind_i64(s, 4, a->step));
    BIND(bind_text(s, 5, a->rule));
    BIND(bind_text(s, 6, a->state == STORE_ALERT_RAISED    ? "raised"
                         : a->state == STORE_ALERT_CLEARED ? "cleared"
                                                           : "resolved"));
    BIND(bind_f64(s, 7, a->value));
    BIND(bind_f64(s, 8, a->threshold));
    BIND(bind_i64(s, 9, a->time_ms ? a->time_ms : now_ms()));
    BIND(bind_text(s, 10, a->message));
    BIND(bind_text(s, 11, a->reason));
    BIND(a->has_uid ? bind_i64(s, 12, a->uid) : sqlite3_bind_null(s, 12));
    if (rc == SQLITE_OK)
        rc = sqlite3_step(s);
    if (rc == SQLITE_DONE)
        rc = SQLITE_OK;
    if (rc != SQLITE_OK)
        store_db_err(st, err, rc, "storing alert %s of run %" PRId64 " layer %" PRId32
                     " head %" PRId32, a->rule, a->run_id, a->layer, a->head);
    stmt_done(s);
    return rc == SQLITE_OK ? STORE_OK : batch_fail(st, err);
}

/* ---- runs and alerts that end ------------------------------------------------------------------ */

store_status store_run_end(store *st, int64_t run_id, int64_t time_ms, const char *reason,
                           store_error *err)
{
    store_status rs = begin_for_run(st, run_id, err);
    if (rs)
        return rs;
    int64_t t = time_ms ? time_ms : now_ms();
    sqlite3_stmt *s = store_stmt(st, S_RUN_END, err);
    int rc = SQLITE_OK;
    if (!s)
        return batch_fail(st, err);
    BIND(bind_i64(s, 1, run_id));
    BIND(reason ? bind_i64(s, 2, t) : sqlite3_bind_null(s, 2));
    BIND(bind_text(s, 3, reason));
    if (rc != SQLITE_OK) {
        stmt_done(s);
        store_db_err(st, err, rc, "binding the end of run %" PRId64, run_id);
        return batch_fail(st, err);
    }
    if (store_run_done(st, s, "recording the end of a run", err) != STORE_OK)
        return batch_fail(st, err);
    if (!reason)
        return STORE_OK; /* running again: its silences stay as they are */
    int64_t args[2] = {run_id, t};
    if (store_exec_ints(st, S_SILENCES_END_RUN, args, 2, "ending the run's silences", err))
        return batch_fail(st, err);
    return STORE_OK;
}

/* The alert alert_id, checked to be an active raise: its run to *run_id. */
typedef struct {
    int64_t run_id;
} active_ctx;

static int active_cb(void *ctx, const store_alert *a)
{
    ((active_ctx *)ctx)->run_id = a->run_id;
    return 0;
}

store_status store_ack_alert(store *st, int64_t alert_id, uint32_t uid, int64_t time_ms,
                             store_error *err)
{
    store_status rs = check_writable(st, err);
    if (rs)
        return rs;
    active_ctx ac = {0};
    if ((rs = store_active_alert(st, alert_id, active_cb, &ac, err)))
        return rs;
    if ((rs = begin_for_run(st, ac.run_id, err)))
        return rs;
    int64_t args[3] = {alert_id, (int64_t)uid, time_ms ? time_ms : now_ms()};
    if (store_exec_ints(st, S_ALERT_ACK, args, 3, "acknowledging an alert", err))
        return batch_fail(st, err);
    return STORE_OK;
}

store_status store_add_silence(store *st, const store_silence *sil, int64_t *id, store_error *err)
{
    store_status rs = check_writable(st, err);
    if (rs)
        return rs;
    if (!sil || !sil->rule || !*sil->rule || sil->layer < 0 || sil->head < 0 ||
        sil->until_ms < 0) {
        store_set_err(err, 0, "a silence needs a rule name, layer >= 0, head >= 0 and until >= 0");
        return STORE_EINVAL;
    }
    if ((rs = begin_for_run(st, sil->run_id, err)))
        return rs;
    int64_t t = sil->time_ms ? sil->time_ms : now_ms();
    sqlite3_stmt *s = store_stmt(st, S_SILENCES_END_KEY, err); /* the one it replaces end now */
    if (!s)
        return batch_fail(st, err);
    int rc = SQLITE_OK;
    BIND(bind_i64(s, 1, sil->run_id));
    BIND(bind_i64(s, 2, sil->layer));
    BIND(bind_i64(s, 3, sil->head));
    BIND(bind_text(s, 4, sil->rule));
    BIND(bind_i64(s, 5, t));
    if (rc != SQLITE_OK) {
        stmt_done(s);
        store_db_err(st, err, rc, "binding the silences of run %" PRId64, sil->run_id);
        return batch_fail(st, err);
    }
    if (store_run_done(st, s, "ending the silences a new one replaces", err) != STORE_OK)
        return batch_fail(st, err);
    if (!(s = store_stmt(st, S_SILENCE_INSERT, err)))
        return batch_fail(st, err);
    BIND(bind_i64(s, 1, sil->run_id));
    BIND(bind_i64(s, 2, sil->layer));
    BIND(bind_i64(s, 3, sil->head));
    BIND(bind_text(s, 4, sil->rule));
    BIND(bind_i64(s, 5, sil->uid));
    BIND(bind_i64(s, 6, t));
    BIND(sil->until_ms ? bind_i64(s, 7, sil->until_ms) : sqlite3_bind_null(s, 7));
    if (rc == SQLITE_OK)
        rc = sqlite3_step(s);
    if (rc == SQLITE_DONE)
        rc = SQLITE_OK;
    if (rc != SQLITE_OK)
        store_db_err(st, err, rc, "storing a silence of run %" PRId64, sil->run_id);
    stmt_done(s);
    if (rc != SQLITE_OK)
        return batch_fail(st, err);
    if (id)
        *id = sqlite3_last_insert_rowid(st->db);
    return STORE_OK;
}

store_status store_end_silences(store *st, int64_t run_id, int64_t silence_id, int64_t time_ms,
                                int64_t *ended, store_error *err)
{
    if (ended)
        *ended = 0;
    store_status rs = check_writable(st, err);
    if (rs)
        return rs;
    if (silence_id < 0) {
        store_set_err(err, 0, "a silence id is > 0 (0: every silence of the run)");
        return STORE_EINVAL;
    }
    if ((rs = begin_for_run(st, run_id, err)))
        return rs;
    int64_t args[3] = {run_id, silence_id, time_ms ? time_ms : now_ms()};
    if (store_exec_ints(st, S_SILENCES_END, args, 3, "ending silences", err))
        return batch_fail(st, err);
    if (ended)
        *ended = sqlite3_changes(st->db);
    return STORE_OK;
}

/* ---- interventions ---------------------------------------------------------------------------- */

/* STORE_OK when iv's fields are in range (store_write.h); STORE_EINVAL naming the first that is
 * not. */
static store_status intervention_check(const store_intervention *iv, store_error *err)
{
    if (!iv) {
        store_set_err(err, 0, "no intervention given");
        return STORE_EINVAL;
    }
    size_t klen = iv->kind ? strlen(iv->kind) : 0;
    if (klen < 1 || klen > STORE_INTERVENTION_KIND_MAX ||
        strspn(iv->kind, VOCAB_INTERVENTION_KIND_CHARS) != klen) {
        store_set_err(err, 0, "intervention kind must be 1..%d of a-z 0-9 _ . -",
                      STORE_INTERVENTION_KIND_MAX);
        return STORE_EINVAL;
    }
    if (iv->step < 0 || iv->layer < -1 || iv->nheads < 0 ||
        iv->nheads > STORE_INTERVENTION_HEADS_MAX || (iv->nheads > 0 && !iv->heads)) {
        store_set_err(err, 0, "intervention of run %" PRId64 ": step %" PRId64 " must be >= 0, "
                      "layer %" PRId32 " >= -1 (none), and %" PRId32 " heads 0..%d", iv->run_id,
                      iv->step, iv->layer, iv->nheads, STORE_INTERVENTION_HEADS_MAX);
        return STORE_EINVAL;
    }
    for (int32_t i = 0; i < iv->nheads; i++) {
        if (iv->heads[i] < 0) {
            store_set_err(err, 0, "intervention heads[%" PRId32 "] is %" PRId32 ": a head is >= 0",
                          i, iv->heads[i]);
            return STORE_EINVAL;
        }
        if (iv->values && !isfinite(iv->values[i])) {
            store_set_err(err, 0, "intervention values[%" PRId32 "] is not finite", i);
            return STORE_EINVAL;
        }
    }
    if (isinf(iv->threshold) || isinf(iv->measured)) {
        store_set_err(err, 0, "intervention threshold and measured are finite (or NaN: none)");
        return STORE_EINVAL;
    }
    if (iv->detail && strlen(iv->detail) > STORE_INTERVENTION_DETAIL_MAX) {
        store_set_err(err, 0, "intervention detail is longer than %d bytes",
                      STORE_INTERVENTION_DETAIL_MAX);
        return STORE_EINVAL;
    }
    return STORE_OK;
}

/* The JSON array of n integers (ints) or doubles (dbls, 17 significant digits: they read back bit
 * for bit) into scratch buffer id; NULL with err set when out of memory. */
static const char *intervention_json(store *st, int id, const int32_t *ints, const double *dbls,
                                     int32_t n, store_error *err)
{
    size_t cap = 3 + (size_t)n * 26; /* "-1.2345678901234567e-308," is 25 bytes */
    char *buf = store_scratch(st, id, cap, err);
    if (!buf)
        return NULL;
    size_t at = 0;
    buf[at++] = '[';
    for (int32_t i = 0; i < n; i++) {
        int w = ints ? snprintf(buf + at, cap - at, "%s%" PRId32, i ? "," : "", ints[i])
                     : snprintf(buf + at, cap - at, "%s%.17g", i ? "," : "", dbls[i]);
        at += (size_t)w;
    }
    buf[at++] = ']';
    buf[at] = '\0';
    return buf;
}

store_status store_add_intervention(store *st, const store_intervention *iv, int64_t *id,
                                    store_error *err)
{
    store_status rs = check_writable(st, err);
    if (rs)
        return rs;
    if ((rs = intervention_check(iv, err)))
        return rs;
    if ((rs = begin_for_run(st, iv->run_id, err)))
        return rs;
    const char *heads = intervention_json(st, BUF_A, iv->heads, NULL, iv->nheads, err);
    const char *values =
        iv->values ? intervention_json(st, BUF_B, NULL, iv->values, iv->nheads, err) : NULL;
    if (!heads || (iv->values && !values)) {
        store_append_err(err, " (storing an intervention of run %" PRId64 ")", iv->run_id);
        return batch_fail(st, err);
    }
    sqlite3_stmt *s = store_stmt(st, S_INTERVENTION_INSERT, err);
    if (!s)
        return batch_fail(st, err);
    int rc = SQLITE_OK;
    BIND(bind_i64(s, 1, iv->run_id));
    BIND(bind_i64(s, 2, iv->rank));
    BIND(bind_i64(s, 3, iv->step));
    BIND(bind_i64(s, 4, iv->time_ms ? iv->time_ms : now_ms()));
    BIND(bind_text(s, 5, iv->kind));
    BIND(iv->layer >= 0 ? bind_i64(s, 6, iv->layer) : sqlite3_bind_null(s, 6));
    BIND(bind_text(s, 7, heads));
    BIND(bind_text(s, 8, values));
    BIND(bind_f64(s, 9, iv->threshold));
    BIND(bind_f64(s, 10, iv->measured));
    BIND(bind_text(s, 11, iv->detail));
    if (rc == SQLITE_OK)
        rc = sqlite3_step(s);
    if (rc == SQLITE_DONE)
        rc = SQLITE_OK;
    if (rc != SQLITE_OK)
        store_db_err(st, err, rc, "storing intervention %s of run %" PRId64 " step %" PRId64,
                     iv->kind, iv->run_id, iv->step);
    else if (id)
        *id = sqlite3_last_insert_rowid(st->db);
    stmt_done(s);
    return rc == SQLITE_OK ? STORE_OK : batch_fail(st, err);
}
