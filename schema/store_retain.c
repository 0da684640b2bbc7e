/* store_retain.c — upkeep of the history, behind store_retain.h: the retention step (compaction,
 * downsampling by age and by size), per-run limits, deleting a run. Calls store_core.c's helpers
 * (store_internal.h), compaction (store_compact.c) and downsampling (store_downsample.c) through
 * store_upkeep.h, SQLite and libc; nothing of store_write.c or store_read.c.
 *
 * How it works
 * - One call is one BEGIN IMMEDIATE ... COMMIT; any failure rolls all of it back, so the tiers are
 *   never half-moved. Work is counted in samples against the budget and stops at a whole step
 *   (compaction) or a whole layer of a window (downsampling); compaction gets at most half of it.
 * - The phases, in order: compaction of every run (store_compact.c); windows an earlier step left
 *   half done; downsampling by age (each run's limit, else the policy's); by size, each run's own
 *   limit, then the database's, oldest window first across runs (store_downsample.c).
 * - Sizes: the database's bytes in use are (page_count - freelist_count) * page_size; a run's are
 *   the estimate in runs.bytes, kept up to date by every tier move (exact rows at
 *   STORE_EXACT_ROW_BYTES, compact and bucket rows at their BLOBs plus STORE_PACK_ROW_OVERHEAD).
 * - Deleting a run is its own transaction per call: the exact tier, then the compact tier, about
 *   the budget each, then the buckets, the run and its alerts (foreign key, ON DELETE CASCADE).
 */
#include "store_retain.h"

#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "store_internal.h"
#include "store_upkeep.h"

static int64_t clock_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static int64_t mono_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

static store_status check_upkeep(store *st, store_error *err)
{
    if (st->readonly) {
        store_set_err(err, 0, "database '%s' was opened read-only", st->path);
        return STORE_EINVAL;
    }
    if (st->in_batch) {
        store_set_err(err, 0, "database '%s': a batch is open on this handle (commit it first)",
                      st->path);
        return STORE_EINVAL;
    }
    return STORE_OK;
}

static store_status used_bytes(store *st, int64_t *v, store_error *err)
{
    int isnull;
    return store_query_int(st, S_PAGES_USED, NULL, 0, v, &isnull, "measuring the database", err);
}

/* Every run's retention state, into BUF_RUNS. */
static store_status load_runs(store *st, store_run_state **out, int32_t *n, store_error *err)
{
    sqlite3_stmt *s = store_stmt(st, S_RUNS_RETAIN, err);
    if (!s)
        return STORE_ERROR;
    int32_t k = 0;
    int rc;
    store_status rs = STORE_OK;
    store_run_state *v = NULL;
    while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
        v = store_scratch(st, BUF_RUNS, (size_t)(k + 1) * sizeof *v, err);
        if (!v) {
            rs = STORE_ERROR;
            break;
        }
        store_run_state *r = &v[k++];
        memset(r, 0, sizeof *r);
        r->id = sqlite3_column_int64(s, 0);
        r->has_steps = sqlite3_column_type(s, 1) != SQLITE_NULL;
        r->step_max = sqlite3_column_int64(s, 1);
        r->has_retain_ms = sqlite3_column_type(s, 2) != SQLITE_NULL;
        r->retain_ms = sqlite3_column_int64(s, 2);
        r->has_retain_bytes = sqlite3_column_type(s, 3) != SQLITE_NULL;
        r->retain_bytes = sqlite3_column_int64(s, 3);
        r->has_upto = sqlite3_column_type(s, 4) != SQLITE_NULL;
        r->coarse_upto = sqlite3_column_int64(s, 4);
        r->bytes = sqlite3_column_int64(s, 5);
    }
    if (rs == STORE_OK && rc != SQLITE_DONE)
        rs = store_db_err(st, err, rc, "listing the runs of '%s'", st->path);
    stmt_done(s);
    *out = st->buf[BUF_RUNS].p;
    *n = k;
    return rs;
}

static store_status run_bytes(store *st, store_run_state *r, store_error *err)
{
    int isnull;
    return store_query_int(st, S_RUNS_RETAIN_ONE, &r->id, 1, &r->bytes, &isnull,
                           "reading a run's size", err);
}

static store_status retain_work(store *st, const store_retention *p, int64_t budget,
                                store_retain_report *rep, store_error *err)
{
    store_run_state *runs = NULL;
    int32_t nruns = 0;
    store_status rs = load_runs(st, &runs, &nruns, err);
    /* compaction takes at most half the budget, so that a steady ingest cannot starve
     * downsampling; what it leaves goes to the other phases */
    int64_t left = (budget + 1) / 2, rest = budget - left;
    /* 1. compaction */
    for (int32_t i = 0; rs == STORE_OK && i < nruns; i++) {
        store_run_state *r = &runs[i];
        if ((rs = store_hot_min(st, r, err)))
            break;
        if (p->exact_steps < 0 || !r->has_steps || !r->has_hot ||
            r->step_max < INT64_MIN / 2 + p->exact_steps)
            continue;
        /* blocks of exact_steps steps, aligned: the exact tier holds between exact_steps and
         * 2 * exact_steps steps, and a block writes each layer's rows side by side */
        int64_t block = p->exact_steps > 0 ? p->exact_steps : 1, lim = r->step_max - p->exact_steps;
        int64_t cutoff = (lim / block - (lim % block < 0)) * block;
        while (rs == STORE_OK && r->has_hot && r->hot_min < cutoff) {
            if (left <= 0) {
                rep->more = 1;
                break;
            }
            int more = 0;
            rs = store_compact_block(st, r->id, r->hot_min, cutoff - 1, &left, &rep->compacted, &more,
                               err);
            if (rs == STORE_OK)
                rs = store_hot_min(st, r, err);
            if (more)
                rep->more = 1;
        }
    }
    if (p->exact_steps < 0)
        return rs; /* nothing is compacted, so nothing may be downsampled */
    store_upkeep_counts dc = {0, 0, 0, 0};
    left = (left > 0 ? left : 0) + rest;
    int64_t width = p->bucket_steps > 0 ? p->bucket_steps : STORE_BUCKET_STEPS_DEFAULT;
    int64_t now = p->now_ms ? p->now_ms : clock_ms();
    /* a window that an earlier step left half done is finished first, whatever the limits say
     * now, so that no window stays part buckets, part rows */
    for (int32_t i = 0; rs == STORE_OK && i < nruns && left > 0; i++) {
        int64_t lo, hi;
        int found, started = 0, complete;
        rs = store_next_window(st, &runs[i], width, &lo, &hi, &found, err);
        if (rs == STORE_OK && found)
            rs = store_window_started(st, runs[i].id, lo, &started, err);
        if (rs == STORE_OK && started)
            rs = store_downsample_window(st, &runs[i], lo, hi, &left, &dc, &complete, err);
    }
    /* 2. by age */
    for (int32_t i = 0; rs == STORE_OK && i < nruns && left > 0; i++) {
        store_run_state *r = &runs[i];
        int64_t ms = r->has_retain_ms && r->retain_ms >= 0 ? r->retain_ms : p->retain_ms;
        int none;
        if (ms > 0)
            rs = store_downsample_run(st, r, width, 1, now - ms, &left, &dc, &none, err);
    }
    /* 3. by size: each run's own limit, then the database's */
    for (int32_t i = 0; rs == STORE_OK && i < nruns; i++) {
        store_run_state *r = &runs[i];
        if (!r->has_retain_bytes || r->retain_bytes <= 0)
            continue;
        while (rs == STORE_OK && (rs = run_bytes(st, r, err)) == STORE_OK &&
               r->bytes > r->retain_bytes) {
            if (left <= 0) {
                rep->more = 1;
                break;
            }
            int none;
            if ((rs = store_downsample_run(st, r, width, 0, 0, &left, &dc, &none, err)) || none) {
                rep->over_limit |= none;
                break;
            }
        }
    }
    while (rs == STORE_OK && p->retain_bytes > 0) {
        int64_t used;
        if ((rs = used_bytes(st, &used, err)) || used <= p->retain_bytes)
            break;
        if (left <= 0) {
            rep->more = 1;
            break;
        }
        /* the run whose next eligible window is the oldest */
        store_run_state *best = NULL;
        int64_t best_t = INT64_MAX;
        for (int32_t i = 0; rs == STORE_OK && i < nruns; i++) {
            int64_t lo, hi, t;
            int found;
            rs = store_next_window(st, &runs[i], width, &lo, &hi, &found, err);
            if (rs == STORE_OK && found && (rs = store_window_time(st, runs[i].id, lo, hi, &t, err)) ==
                                               STORE_OK && (!best || t < best_t)) {
                best = &runs[i];
                best_t = t;
            }
        }
        if (rs)
            break;
        if (!best) {
            rep->over_limit = 1;
            break;
        }
        int none;
        rs = store_downsample_run(st, best, width, 0, 0, &left, &dc, &none, err);
    }
    /* a spent budget may have left work in any phase: one more call finds out */
    if (left <= 0)
        rep->more = 1;
    rep->downsampled = dc.downsampled;
    rep->buckets = dc.buckets;
    rep->kept = dc.kept;
    rep->more |= dc.more;
    return rs;
}

store_status store_retain_step(store *st, const store_retention *policy, int64_t budget,
                               store_retain_report *rep, store_error *err)
{
    store_retain_report dummy;
    if (!rep)
        rep = &dummy;
    memset(rep, 0, sizeof *rep);
    store_status rs = check_upkeep(st, err);
    if (rs)
        return rs;
    store_retention p = STORE_RETENTION_DEFAULT;
    if (policy)
        p = *policy;
    if (p.bucket_steps == 1 || p.bucket_steps < 0 || p.retain_ms < 0 || p.retain_bytes < 0) {
        store_set_err(err, 0, "retention: bucket_steps must be 0 (the default) or >= 2, and "
                      "retain_ms and retain_bytes >= 0 (bucket_steps %" PRId64 ", retain_ms %"
                      PRId64 ", retain_bytes %" PRId64 ")", p.bucket_steps, p.retain_ms,
                      p.retain_bytes);
        return STORE_EINVAL;
    }
    if (budget <= 0)
        budget = STORE_RETAIN_BUDGET_DEFAULT;
    int64_t w0 = mono_us();
    if (store_step_simple(st, S_BEGIN, err) != SQLITE_OK) {
        store_append_err(err, " (starting a retention step in '%s')", st->path);
        return STORE_ERROR;
    }
    int64_t t0 = mono_us();
    rs = retain_work(st, &p, budget, rep, err);
    if (rs == STORE_OK)
        rs = used_bytes(st, &rep->used_bytes, err);
    if (rs == STORE_OK && store_step_simple(st, S_COMMIT, err) != SQLITE_OK) {
        store_append_err(err, " (committing a retention step to '%s')", st->path);
        rs = STORE_ERROR;
    }
    if (rs != STORE_OK) {
        store_batch_rollback(st);
        store_retain_report zero = {0};
        *rep = zero;
    }
    rep->lock_us = mono_us() - t0;
    rep->wait_us = t0 - w0;
    return rs;
}

/* ---- per-run limits and deleting a run -------------------------------------------------------- */

store_status store_run_set_retention(store *st, int64_t run_id, int64_t retain_ms,
                                     int64_t retain_bytes, store_error *err)
{
    store_status rs = check_upkeep(st, err);
    if (rs == STORE_OK)
        rs = store_check_run(st, run_id, err);
    if (rs)
        return rs;
    sqlite3_stmt *s = store_stmt(st, S_RUN_SET_RETAIN, err);
    if (!s)
        return STORE_ERROR;
    int rc = bind_i64(s, 1, run_id);
    if (rc == SQLITE_OK)
        rc = retain_ms < 0 ? sqlite3_bind_null(s, 2) : bind_i64(s, 2, retain_ms);
    if (rc == SQLITE_OK)
        rc = retain_bytes < 0 ? sqlite3_bind_null(s, 3) : bind_i64(s, 3, retain_bytes);
    if (rc != SQLITE_OK) {
        stmt_done(s);
        return store_db_err(st, err, rc, "binding the limits of run %" PRId64, run_id);
    }
    return store_run_done(st, s, "setting the limits of a run", err);
}

/* Delete run's rows of one tier: all of them (limit < 0), or those before the bound that the
 * bound statement finds `limit` rows in. *gone: the tier has none left. */
static store_status delete_some(store *st, int64_t run, int bound_id, int del_id, int two_keys,
                                int64_t limit, int *gone, store_error *err)
{
    sqlite3_stmt *b = store_stmt(st, bound_id, err);
    if (!b)
        return STORE_ERROR;
    int64_t k1 = INT64_MAX, k2 = INT64_MAX;
    int rc = SQLITE_OK;
    *gone = 1;
    if (limit >= 0) {
        BIND(bind_i64(b, 1, run));
        BIND(bind_i64(b, 2, limit));
        if (rc == SQLITE_OK)
            rc = sqlite3_step(b);
        if (rc == SQLITE_ROW) {
            *gone = 0;
            k1 = sqlite3_column_int64(b, 0);
            k2 = two_keys ? sqlite3_column_int64(b, 1) : 0;
            rc = SQLITE_DONE;
        }
        stmt_done(b);
        if (rc != SQLITE_DONE)
            return store_db_err(st, err, rc, "finding what to delete of run %" PRId64, run);
    }
    for (int pass = 0; pass < 2; pass++) {
        store_status rs = store_exec_ints(st, del_id, (const int64_t[]){run, k1, k2},
                                          two_keys ? 3 : 2, "deleting rows of a run", err);
        /* keys below a bound on the very first step: none; take that whole step instead */
        if (rs || *gone || two_keys || sqlite3_changes(st->db) > 0 || k1 == INT64_MAX)
            return rs;
        k1++;
    }
    return STORE_OK;
}

store_status store_delete_run(store *st, int64_t run_id, int64_t budget, int *done,
                              store_error *err)
{
    *done = 0;
    store_status rs = check_upkeep(st, err);
    if (rs)
        return rs;
    if (store_step_simple(st, S_BEGIN, err) != SQLITE_OK) {
        store_append_err(err, " (starting to delete run %" PRId64 ")", run_id);
        return STORE_ERROR;
    }
    st->known_run = 0;
    rs = store_check_run(st, run_id, err);
    int gone = 1;
    /* the exact tier: about budget rows (at least one whole step: a bound on the first step deletes
     * nothing, so the step after it is taken) */
    if (rs == STORE_OK)
        rs = delete_some(st, run_id, S_DEL_HOT_BOUND, S_DEL_HOT, 0, budget > 0 ? budget : -1,
                         &gone, err);
    /* the compact tier, then, when the exact tier is gone: about budget / 64 rows (a row holds
     * every head of a layer) */
    if (rs == STORE_OK && gone)
        rs = delete_some(st, run_id, S_DEL_PACK_BOUND, S_DEL_PACK, 1,
                         budget > 0 ? (budget + 63) / 64 : -1, &gone, err);
    if (rs == STORE_OK && gone)
        rs = store_exec_ints(st, S_DEL_COARSE, &run_id, 1, "deleting the buckets of a run", err);
    if (rs == STORE_OK && gone) /* the alerts go with it (foreign key, ON DELETE CASCADE) */
        rs = store_exec_ints(st, S_DEL_RUN, &run_id, 1, "deleting a run", err);
    if (rs == STORE_OK && store_step_simple(st, S_COMMIT, err) != SQLITE_OK) {
        store_append_err(err, " (committing the delete of run %" PRId64 ")", run_id);
        rs = STORE_ERROR;
    }
    st->known_run = 0;
    if (rs != STORE_OK) {
        store_batch_rollback(st);
        return rs;
    }
    *done = gone;
    return STORE_OK;
}
