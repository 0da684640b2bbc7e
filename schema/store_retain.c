/* store_retain.c — upkeep of the history, behind store_retain.h: the retention step (compaction,
 * downsampling by age and by size), per-run limits, deleting a run. Calls store.c's helpers
 * (store_internal.h), the compact format (store_pack.h), the exact-row and bucket readers of
 * store_tiers.h, SQLite and libc; nothing of store_write.c or store_read.c.
 *
 * How it works
 * - One call is one BEGIN IMMEDIATE ... COMMIT; any failure rolls all of it back, so the tiers are
 *   never half-moved. Work is counted in samples against the budget and stops at a whole step
 *   (compaction) or a whole layer of a window (downsampling).
 * - Compaction reads a block of whole steps of a run's exact tier (in key order: step, layer,
 *   head), groups it by (step, layer), sorts the groups by (layer, step) and writes one compact row
 *   per group in that order, so the compact tier's inserts are runs of consecutive keys. A group
 *   whose compact row exists already (a sample pushed again after compaction) is merged into it
 *   head by head, the new head winning. The block is then deleted from the exact tier by range.
 * - Downsampling goes window by window from the run's coarse_upto, layer by layer inside a window.
 *   A layer's rows of the window are folded into per-head accumulators (count, and per field the
 *   number of finite values, their sum, minimum and maximum), written as one bucket row, and
 *   deleted; the rows of steps that have alerts are skipped (kept). A bucket that exists already
 *   (rows compacted into a window after it was downsampled) is folded in with its means weighted by
 *   its sample counts. When every layer of a window is done, coarse_upto moves past it.
 * - Sizes: the database's bytes in use are (page_count - freelist_count) * page_size; a run's are
 *   the estimate in runs.bytes, kept up to date by every tier move (exact rows at
 *   STORE_EXACT_ROW_BYTES, compact and bucket rows at their BLOBs plus STORE_PACK_ROW_OVERHEAD).
 */
#include "store_retain.h"

#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "store_internal.h"
#include "store_tiers.h"

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

/* One integer (or NULL: *isnull) from a bound statement's first row; resets it. */
static store_status one_int(store *st, sqlite3_stmt *s, int64_t *v, int *isnull, const char *what,
                            store_error *err)
{
    int rc = sqlite3_step(s);
    store_status rs = STORE_OK;
    if (rc == SQLITE_ROW) {
        *isnull = sqlite3_column_type(s, 0) == SQLITE_NULL;
        *v = sqlite3_column_int64(s, 0);
    } else if (rc == SQLITE_DONE) {
        *isnull = 1;
        *v = 0;
    } else {
        rs = store_db_err(st, err, rc, "%s in '%s'", what, st->path);
    }
    stmt_done(s);
    return rs;
}

/* Run a bound statement that returns no row; resets it. */
static store_status run_done(store *st, sqlite3_stmt *s, const char *what, store_error *err)
{
    int rc = sqlite3_step(s);
    stmt_done(s);
    if (rc != SQLITE_DONE)
        return store_db_err(st, err, rc, "%s in '%s'", what, st->path);
    return STORE_OK;
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

static store_status adjust_run(store *st, int64_t run, int64_t bytes, int64_t samples,
                               store_error *err)
{
    if (!bytes && !samples)
        return STORE_OK;
    sqlite3_stmt *s = store_stmt(st, S_RUN_ADJUST, err);
    if (!s)
        return STORE_ERROR;
    int rc = SQLITE_OK;
    BIND(bind_i64(s, 1, run));
    BIND(bind_i64(s, 2, bytes));
    BIND(bind_i64(s, 3, samples));
    if (rc != SQLITE_OK) {
        stmt_done(s);
        return store_db_err(st, err, rc, "binding a run's summary");
    }
    return run_done(st, s, "updating a run's summary", err);
}

static store_status used_bytes(store *st, int64_t *v, store_error *err)
{
    sqlite3_stmt *s = store_stmt(st, S_PAGES_USED, err);
    int isnull;
    return s ? one_int(st, s, v, &isnull, "measuring the database", err) : STORE_ERROR;
}

/* ---- compaction ------------------------------------------------------------------------------- */

typedef struct {
    int32_t layer;
    int64_t step;
    int32_t first, n; /* heads rows[first .. first + n - 1] of BUF_B */
} group;

static int group_cmp(const void *a, const void *b)
{
    const group *x = a, *y = b;
    if (x->layer != y->layer)
        return x->layer < y->layer ? -1 : 1;
    return x->step < y->step ? -1 : x->step > y->step;
}

/* Merge old[0 .. no-1] and new[0 .. nn-1] (both by head) into out; *replaced: heads in both. */
static int32_t merge_heads(const store_pack_head *old, int32_t no, const store_pack_head *nw,
                           int32_t nn, store_pack_head *out, int64_t *replaced)
{
    int32_t i = 0, j = 0, k = 0;
    while (i < no || j < nn) {
        if (j < nn && (i >= no || nw[j].head <= old[i].head)) {
            if (i < no && old[i].head == nw[j].head) {
                i++;
                (*replaced)++;
            }
            out[k++] = nw[j++];
        } else {
            out[k++] = old[i++];
        }
    }
    return k;
}

/* Write one group as a compact row (merged with the row already there). */
static store_status put_group(store *st, int64_t run, const group *g, int64_t *bytes,
                              int64_t *replaced, store_error *err)
{
    store_pack_head *heads = (store_pack_head *)st->buf[BUF_B].p + g->first;
    int32_t n = g->n;
    sqlite3_stmt *get = store_stmt(st, S_PACK_GET, err);
    sqlite3_stmt *put = get ? store_stmt(st, S_PACK_PUT, err) : NULL;
    if (!put)
        return STORE_ERROR;
    int rc = SQLITE_OK;
    BIND(bind_i64(get, 1, run));
    BIND(sqlite3_bind_int(get, 2, g->layer));
    BIND(bind_i64(get, 3, g->step));
    if (rc == SQLITE_OK)
        rc = sqlite3_step(get);
    if (rc == SQLITE_ROW) { /* merge with the compact row already there */
        const uint8_t *b = sqlite3_column_blob(get, 1);
        size_t len = (size_t)sqlite3_column_bytes(get, 1);
        int64_t t = sqlite3_column_int64(get, 0);
        int32_t no = store_pack_count(b, len);
        store_pack_head *old = no > 0 ? store_scratch(st, BUF_A, (size_t)no * sizeof *old, err)
                                      : NULL;
        store_pack_head *out =
            old ? store_scratch(st, BUF_LO, (size_t)(no + n) * sizeof *out, err) : NULL;
        if (no < 0 || (old && store_pack_decode(b, len, t, old))) {
            stmt_done(get);
            store_set_err(err, SQLITE_CORRUPT, "database '%s': the compact row of run %" PRId64
                          " layer %" PRId32 " step %" PRId64 " is damaged", st->path, run,
                          g->layer, g->step);
            return STORE_ERROR;
        }
        if (!out) {
            stmt_done(get);
            return STORE_ERROR;
        }
        n = merge_heads(old, no, heads, g->n, out, replaced);
        heads = out;
        *bytes -= (int64_t)len + STORE_PACK_ROW_OVERHEAD;
        rc = SQLITE_DONE;
    }
    stmt_done(get);
    if (rc != SQLITE_DONE && rc != SQLITE_OK)
        return store_db_err(st, err, rc, "reading a compact row of run %" PRId64, run);
    uint8_t *enc = store_scratch(st, BUF_OUT, store_pack_bound(n), err);
    if (!enc)
        return STORE_ERROR;
    size_t len = store_pack_encode(heads, n, heads[0].time_ms, enc);
    rc = SQLITE_OK;
    BIND(bind_i64(put, 1, run));
    BIND(sqlite3_bind_int(put, 2, g->layer));
    BIND(bind_i64(put, 3, g->step));
    BIND(bind_i64(put, 4, heads[0].time_ms));
    BIND(sqlite3_bind_int(put, 5, n));
    BIND(bind_blob(put, 6, enc, len));
    if (rc != SQLITE_OK) {
        stmt_done(put);
        return store_db_err(st, err, rc, "binding a compact row");
    }
    *bytes += (int64_t)len + STORE_PACK_ROW_OVERHEAD;
    return run_done(st, put, "writing a compact row", err);
}

/* Compact run's exact rows of steps [from, to], whole steps, about *left samples; *left and
 * *done (samples moved) are updated; *more says the budget stopped it before `to`. */
static store_status compact_block(store *st, int64_t run, int64_t from, int64_t to,
                                  int64_t *left, int64_t *done, int *more, store_error *err)
{
    sqlite3_stmt *s = store_stmt(st, S_HOT_BLOCK, err);
    if (!s)
        return STORE_ERROR;
    int rc = SQLITE_OK;
    BIND(bind_i64(s, 1, run));
    BIND(bind_i64(s, 2, from));
    BIND(bind_i64(s, 3, to));
    int32_t nrows = 0, ngroups = 0;
    int64_t last = from;
    store_status rs = STORE_OK;
    if (rc != SQLITE_OK)
        rs = store_db_err(st, err, rc, "binding the compaction");
    while (rs == STORE_OK && (rc = sqlite3_step(s)) == SQLITE_ROW) {
        int32_t layer;
        int64_t step;
        store_pack_head h;
        store_tiers_read_hot(s, &h, &layer, &step);
        if (nrows >= *left && step != last) { /* the budget is spent and a new step begins */
            *more = 1;
            break;
        }
        store_pack_head *rows = store_scratch(st, BUF_B, (size_t)(nrows + 1) * sizeof *rows, err);
        group *g = rows ? store_scratch(st, BUF_COUNTS, (size_t)(ngroups + 1) * sizeof *g, err)
                        : NULL;
        if (!g) {
            rs = STORE_ERROR;
            break;
        }
        if (ngroups == 0 || g[ngroups - 1].layer != layer || g[ngroups - 1].step != step)
            g[ngroups++] = (group){layer, step, nrows, 0};
        g[ngroups - 1].n++;
        rows[nrows++] = h;
        last = step;
    }
    if (rs == STORE_OK && rc != SQLITE_ROW && rc != SQLITE_DONE)
        rs = store_db_err(st, err, rc, "reading the exact tier of run %" PRId64, run);
    stmt_done(s);
    if (rs != STORE_OK || nrows == 0)
        return rs;
    group *g = st->buf[BUF_COUNTS].p;
    qsort(g, (size_t)ngroups, sizeof *g, group_cmp);
    int64_t bytes = -(int64_t)nrows * STORE_EXACT_ROW_BYTES, replaced = 0;
    for (int32_t i = 0; rs == STORE_OK && i < ngroups; i++)
        rs = put_group(st, run, &((group *)st->buf[BUF_COUNTS].p)[i], &bytes, &replaced, err);
    sqlite3_stmt *del = rs == STORE_OK ? store_stmt(st, S_HOT_DELETE, err) : NULL;
    if (rs == STORE_OK && !del)
        rs = STORE_ERROR;
    if (rs == STORE_OK) {
        rc = SQLITE_OK;
        BIND(bind_i64(del, 1, run));
        BIND(bind_i64(del, 2, from));
        BIND(bind_i64(del, 3, last));
        if (rc != SQLITE_OK) {
            stmt_done(del);
            rs = store_db_err(st, err, rc, "binding the exact tier's delete");
        } else {
            rs = run_done(st, del, "deleting compacted rows", err);
        }
    }
    if (rs == STORE_OK)
        rs = adjust_run(st, run, bytes, -replaced, err); /* a replaced head was counted twice */
    if (rs == STORE_OK) {
        *left -= nrows;
        *done += nrows;
    }
    return rs;
}

/* ---- downsampling ----------------------------------------------------------------------------- */

enum { NF = 7, NC = 4 };

typedef struct {
    int32_t head;
    int64_t n, time;
    int64_t cnt[NF];
    double sum[NF], lo[NF], hi[NF];
    int64_t csum[NC], clo[NC], chi[NC];
    int32_t slo, shi;
} acc;

static double *field(stats_head *h, int i)
{
    double *f[NF] = {&h->entropy_mean, &h->entropy_std, &h->entropy_min, &h->entropy_max,
                     &h->entropy_norm_mean, &h->collapsed_frac, &h->max_logit};
    return f[i];
}

static int64_t *count(stats_head *h, int i)
{
    int64_t *c[NC] = {&h->rows, &h->rows_norm, &h->rows_empty, &h->nonfinite_rows};
    return c[i];
}

/* Fold `weight` samples whose mean is m (min lo, max hi) into a; one sample: lo == m == hi. */
static void fold(acc *a, const store_pack_head *lo, const store_pack_head *m,
                 const store_pack_head *hi, int64_t weight)
{
    stats_head *ml = (stats_head *)&lo->s, *mm = (stats_head *)&m->s, *mh = (stats_head *)&hi->s;
    int first = a->n == 0;
    for (int i = 0; i < NF; i++) {
        double v = *field(mm, i);
        if (!isfinite(v))
            continue; /* non-finite values say nothing (max_logit is -inf when rows == 0) */
        double l = *field(ml, i), h = *field(mh, i);
        if (!a->cnt[i] || l < a->lo[i])
            a->lo[i] = l;
        if (!a->cnt[i] || h > a->hi[i])
            a->hi[i] = h;
        a->cnt[i] += weight;
        a->sum[i] += v * (double)weight;
    }
    for (int i = 0; i < NC; i++) {
        int64_t l = *count(ml, i), v = *count(mm, i), h = *count(mh, i);
        if (first || l < a->clo[i])
            a->clo[i] = l;
        if (first || h > a->chi[i])
            a->chi[i] = h;
        a->csum[i] += v * weight;
    }
    if (first || lo->s.sampled < a->slo)
        a->slo = lo->s.sampled;
    if (first || hi->s.sampled > a->shi)
        a->shi = hi->s.sampled;
    if (first || m->time_ms > a->time)
        a->time = m->time_ms;
    a->n += weight;
}

/* The accumulator of head in accs[0 .. *n-1] (sorted by head), inserted when missing. */
static acc *acc_of(store *st, int32_t head, int32_t *n, store_error *err)
{
    acc *v = st->buf[BUF_OUT].p;
    int32_t lo = 0, hi = *n;
    while (lo < hi) {
        int32_t mid = lo + (hi - lo) / 2;
        if (v[mid].head < head)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo < *n && v[lo].head == head)
        return &v[lo];
    if (!(v = store_scratch(st, BUF_OUT, (size_t)(*n + 1) * sizeof *v, err)))
        return NULL;
    memmove(&v[lo + 1], &v[lo], (size_t)(*n - lo) * sizeof *v);
    memset(&v[lo], 0, sizeof *v);
    v[lo].head = head;
    (*n)++;
    return &v[lo];
}

/* Fold the heads in BUF_A (n of them; buckets: BUF_LO / BUF_HI and counts BUF_COUNTS too). */
static store_status fold_heads(store *st, int32_t n, int bucket, int32_t *nacc, store_error *err)
{
    for (int32_t i = 0; i < n; i++) {
        const store_pack_head *m = (store_pack_head *)st->buf[BUF_A].p + i;
        acc *a = acc_of(st, m->head, nacc, err);
        if (!a)
            return STORE_ERROR;
        if (bucket)
            fold(a, (store_pack_head *)st->buf[BUF_LO].p + i, m,
                 (store_pack_head *)st->buf[BUF_HI].p + i, ((int64_t *)st->buf[BUF_COUNTS].p)[i]);
        else
            fold(a, m, m, m, 1);
    }
    return STORE_OK;
}

/* Write the bucket of (run, layer, window) from the accumulators. */
static store_status put_bucket(store *st, int64_t run, int32_t layer, int64_t w_lo, int64_t w_hi,
                               int32_t nacc, int64_t *bytes, store_error *err)
{
    store_pack_head *v[3];
    static const int ids[3] = {BUF_LO, BUF_A, BUF_HI};
    for (int k = 0; k < 3; k++)
        if (!(v[k] = store_scratch(st, ids[k], (size_t)nacc * sizeof *v[k], err)))
            return STORE_ERROR;
    int64_t *merged = store_scratch(st, BUF_COUNTS, (size_t)nacc * sizeof *merged, err);
    if (!merged)
        return STORE_ERROR;
    const acc *a = st->buf[BUF_OUT].p;
    int64_t time = INT64_MIN, samples = 0;
    for (int32_t i = 0; i < nacc; i++) {
        for (int k = 0; k < 3; k++) {
            memset(&v[k][i], 0, sizeof v[k][i]);
            v[k][i].head = a[i].head;
            v[k][i].time_ms = a[i].time;
        }
        for (int f = 0; f < NF; f++) {
            int have = a[i].cnt[f] > 0;
            *field(&v[0][i].s, f) = have ? a[i].lo[f] : NAN;
            *field(&v[1][i].s, f) = have ? a[i].sum[f] / (double)a[i].cnt[f] : NAN;
            *field(&v[2][i].s, f) = have ? a[i].hi[f] : NAN;
        }
        for (int c = 0; c < NC; c++) {
            *count(&v[0][i].s, c) = a[i].clo[c];
            *count(&v[1][i].s, c) = llround((double)a[i].csum[c] / (double)a[i].n);
            *count(&v[2][i].s, c) = a[i].chi[c];
        }
        v[0][i].s.sampled = a[i].slo;
        v[1][i].s.sampled = v[2][i].s.sampled = a[i].shi;
        merged[i] = a[i].n;
        samples += a[i].n;
        time = a[i].time > time ? a[i].time : time;
    }
    uint8_t *enc = store_scratch(st, BUF_BYTES, 3 * store_pack_bound(nacc) + 10 * (size_t)nacc,
                                 err);
    if (!enc)
        return STORE_ERROR;
    size_t len[4], off = 0;
    const uint8_t *part[4];
    for (int k = 0; k < 3; k++) {
        part[k] = enc + off;
        len[k] = store_pack_encode(v[k], nacc, time, enc + off);
        off += len[k];
    }
    part[3] = enc + off;
    len[3] = store_pack_counts_encode(merged, nacc, enc + off);
    sqlite3_stmt *s = store_stmt(st, S_COARSE_PUT, err);
    if (!s)
        return STORE_ERROR;
    int rc = SQLITE_OK;
    BIND(bind_i64(s, 1, run));
    BIND(sqlite3_bind_int(s, 2, layer));
    BIND(bind_i64(s, 3, w_lo));
    BIND(bind_i64(s, 4, w_hi));
    BIND(bind_i64(s, 5, time));
    BIND(bind_i64(s, 6, samples));
    BIND(bind_blob(s, 7, part[3], len[3]));
    BIND(bind_blob(s, 8, part[0], len[0]));
    BIND(bind_blob(s, 9, part[1], len[1]));
    BIND(bind_blob(s, 10, part[2], len[2]));
    if (rc != SQLITE_OK) {
        stmt_done(s);
        return store_db_err(st, err, rc, "binding a bucket");
    }
    *bytes += (int64_t)(len[0] + len[1] + len[2] + len[3]) + STORE_PACK_ROW_OVERHEAD;
    return run_done(st, s, "writing a bucket", err);
}

/* A bucket of (run, layer, w_lo) that exists already: folded into the accumulators and its size
 * taken off *bytes. */
static store_status fold_old_bucket(store *st, int64_t run, int32_t layer, int64_t w_lo,
                                    int32_t *nacc, int64_t *bytes, store_error *err)
{
    sqlite3_stmt *s = store_stmt(st, S_COARSE_GET, err);
    if (!s)
        return STORE_ERROR;
    int rc = SQLITE_OK;
    BIND(bind_i64(s, 1, run));
    BIND(sqlite3_bind_int(s, 2, layer));
    BIND(bind_i64(s, 3, w_lo));
    if (rc == SQLITE_OK)
        rc = sqlite3_step(s);
    store_status rs = STORE_OK;
    if (rc == SQLITE_ROW) {
        int32_t n = 0;
        if (store_tiers_bucket(st, s, 3, sqlite3_column_int64(s, 2), &n, err))
            rs = STORE_ERROR;
        else
            rs = fold_heads(st, n, 1, nacc, err);
        for (int c = 3; c <= 6; c++)
            *bytes -= sqlite3_column_bytes(s, c);
        *bytes -= STORE_PACK_ROW_OVERHEAD;
    } else if (rc != SQLITE_DONE) {
        rs = store_db_err(st, err, rc, "reading a bucket of run %" PRId64, run);
    }
    stmt_done(s);
    return rs;
}

/* The steps of (run, layer) in [w_lo, w_hi] that alerts keep, into BUF_BYTES. */
static store_status kept_steps(store *st, int64_t run, int32_t layer, int64_t w_lo, int64_t w_hi,
                               int32_t *nkept, store_error *err)
{
    sqlite3_stmt *s = store_stmt(st, S_ALERT_STEPS, err);
    if (!s)
        return STORE_ERROR;
    int rc = SQLITE_OK;
    BIND(bind_i64(s, 1, run));
    BIND(bind_i64(s, 2, w_lo));
    BIND(bind_i64(s, 3, w_hi));
    BIND(sqlite3_bind_int(s, 4, layer));
    int32_t n = 0;
    store_status rs = STORE_OK;
    while (rc == SQLITE_OK && (rc = sqlite3_step(s)) == SQLITE_ROW) {
        rc = SQLITE_OK;
        int64_t *k = store_scratch(st, BUF_BYTES, (size_t)(n + 1) * sizeof *k, err);
        if (!k) {
            rs = STORE_ERROR;
            break;
        }
        k[n++] = sqlite3_column_int64(s, 0);
    }
    if (rs == STORE_OK && rc != SQLITE_DONE)
        rs = store_db_err(st, err, rc, "reading the alerts of run %" PRId64, run);
    stmt_done(s);
    *nkept = n;
    return rs;
}

static int is_kept(const store *st, int32_t nkept, int64_t step)
{
    const int64_t *k = st->buf[BUF_BYTES].p;
    for (int32_t i = 0; i < nkept; i++)
        if (k[i] == step)
            return 1;
    return 0;
}

/* Downsample one layer of one window: rows of (run, layer, [w_lo, w_hi]) not kept by an alert.
 * Adds the samples merged to *merged_out and the rows kept to *kept. */
static store_status downsample_layer(store *st, int64_t run, int32_t layer, int64_t w_lo,
                                     int64_t w_hi, int64_t *merged_out, int64_t *kept,
                                     int64_t *nbuckets, store_error *err)
{
    int32_t nkept = 0, nacc = 0, nsteps = 0;
    int64_t nkept_rows = 0;
    store_status rs = kept_steps(st, run, layer, w_lo, w_hi, &nkept, err);
    if (rs)
        return rs;
    sqlite3_stmt *s = store_stmt(st, S_PACK_TREND, err);
    if (!s)
        return STORE_ERROR;
    int rc = SQLITE_OK;
    BIND(bind_i64(s, 1, run));
    BIND(sqlite3_bind_int(s, 2, layer));
    BIND(bind_i64(s, 3, w_lo));
    BIND(bind_i64(s, 4, w_hi));
    int64_t bytes = 0, merged = 0;
    while (rc == SQLITE_OK && (rc = sqlite3_step(s)) == SQLITE_ROW) {
        rc = SQLITE_OK;
        int64_t step = sqlite3_column_int64(s, 0);
        if (is_kept(st, nkept, step)) {
            nkept_rows++;
            continue;
        }
        const uint8_t *b = sqlite3_column_blob(s, 2);
        size_t len = (size_t)sqlite3_column_bytes(s, 2);
        int32_t n = store_pack_count(b, len);
        store_pack_head *h = n > 0 ? store_scratch(st, BUF_A, (size_t)n * sizeof *h, err) : NULL;
        int64_t *steps = h ? store_scratch(st, BUF_HI, (size_t)(nsteps + 1) * sizeof *steps, err)
                           : NULL;
        if (n > 0 && !steps) {
            rs = STORE_ERROR;
            break;
        }
        if (n < 0 || store_pack_decode(b, len, sqlite3_column_int64(s, 1), h)) {
            store_set_err(err, SQLITE_CORRUPT, "database '%s': the compact row of run %" PRId64
                          " layer %" PRId32 " step %" PRId64 " is damaged", st->path, run, layer,
                          step);
            rs = STORE_ERROR;
            break;
        }
        /* BUF_HI holds the steps to delete until the bucket is written (then it is reused) */
        steps[nsteps++] = step;
        bytes -= (int64_t)len + STORE_PACK_ROW_OVERHEAD;
        merged += n;
        if ((rs = fold_heads(st, n, 0, &nacc, err)))
            break;
    }
    if (rs == STORE_OK && rc != SQLITE_DONE)
        rs = store_db_err(st, err, rc, "reading the compact tier of run %" PRId64, run);
    stmt_done(s);
    if (rs != STORE_OK || nsteps == 0)
        return rs;
    /* the steps to delete, before BUF_HI is reused */
    int64_t *del_steps = store_scratch(st, BUF_BYTES, (size_t)nsteps * sizeof *del_steps, err);
    if (!del_steps)
        return STORE_ERROR;
    memcpy(del_steps, st->buf[BUF_HI].p, (size_t)nsteps * sizeof *del_steps);
    sqlite3_stmt *d = store_stmt(st, S_PACK_DELETE, err);
    if (!d)
        return STORE_ERROR;
    for (int32_t i = 0; rs == STORE_OK && i < nsteps; i++) {
        rc = SQLITE_OK;
        BIND(bind_i64(d, 1, run));
        BIND(sqlite3_bind_int(d, 2, layer));
        BIND(bind_i64(d, 3, ((int64_t *)st->buf[BUF_BYTES].p)[i]));
        if (rc != SQLITE_OK) {
            stmt_done(d);
            rs = store_db_err(st, err, rc, "binding a compact row's delete");
        } else {
            rs = run_done(st, d, "deleting a downsampled row", err);
        }
    }
    if (rs == STORE_OK)
        rs = fold_old_bucket(st, run, layer, w_lo, &nacc, &bytes, err);
    if (rs == STORE_OK)
        rs = put_bucket(st, run, layer, w_lo, w_hi, nacc, &bytes, err);
    if (rs == STORE_OK)
        rs = adjust_run(st, run, bytes, 0, err);
    if (rs == STORE_OK) { /* kept rows count once: when their layer's bucket is written */
        *merged_out += merged;
        *kept += nkept_rows;
        (*nbuckets)++;
    }
    return rs;
}

/* ---- the step --------------------------------------------------------------------------------- */

typedef struct {
    int64_t id, step_max, retain_ms, retain_bytes, coarse_upto, bytes;
    int has_steps, has_retain_ms, has_retain_bytes, has_upto;
    int64_t hot_min;   /* lowest step in the exact tier */
    int has_hot;
    int done;          /* no window may be downsampled now */
} run_state;

static store_status hot_min(store *st, run_state *r, store_error *err)
{
    sqlite3_stmt *s = store_stmt(st, S_HOT_MIN_STEP, err);
    if (!s)
        return STORE_ERROR;
    int isnull = 1;
    int rc = bind_i64(s, 1, r->id);
    if (rc != SQLITE_OK) {
        stmt_done(s);
        return store_db_err(st, err, rc, "binding the exact tier's first step");
    }
    store_status rs = one_int(st, s, &r->hot_min, &isnull, "finding the exact tier's first step",
                              err);
    r->has_hot = !isnull;
    return rs;
}

/* The next window of r to downsample: [*lo, *hi]. 0 when there is none that compaction has
 * passed (or none at all). */
static store_status next_window(store *st, const run_state *r, int64_t width, int64_t *lo,
                                int64_t *hi, int *found, store_error *err)
{
    *found = 0;
    sqlite3_stmt *s = store_stmt(st, S_PACK_NEXT_STEP, err);
    if (!s)
        return STORE_ERROR;
    int64_t first = 0;
    int isnull = 1;
    int rc = bind_i64(s, 1, r->id);
    if (rc == SQLITE_OK)
        rc = bind_i64(s, 2, r->has_upto ? r->coarse_upto : INT64_MIN);
    if (rc != SQLITE_OK) {
        stmt_done(s);
        return store_db_err(st, err, rc, "binding the next window");
    }
    store_status rs = one_int(st, s, &first, &isnull, "finding the next window", err);
    if (rs || isnull)
        return rs;
    /* floor division: windows are aligned for negative steps too */
    int64_t k = first / width - (first % width < 0);
    if (k < INT64_MIN / width || k > (INT64_MAX - width + 1) / width)
        return STORE_OK; /* a window at the edge of int64: left at full resolution */
    *lo = k * width;
    *hi = *lo + (width - 1);
    /* only a window the compaction has wholly passed */
    *found = !r->has_hot || r->hot_min > *hi;
    return STORE_OK;
}

/* The newest time in a window of r. */
static store_status window_time(store *st, int64_t run, int64_t lo, int64_t hi, int64_t *t,
                                store_error *err)
{
    sqlite3_stmt *s = store_stmt(st, S_PACK_WINDOW_TIME, err);
    if (!s)
        return STORE_ERROR;
    int rc = SQLITE_OK;
    BIND(bind_i64(s, 1, run));
    BIND(bind_i64(s, 2, lo));
    BIND(bind_i64(s, 3, hi));
    if (rc != SQLITE_OK) {
        stmt_done(s);
        return store_db_err(st, err, rc, "binding the window's time");
    }
    int isnull = 1;
    store_status rs = one_int(st, s, t, &isnull, "reading the window's time", err);
    if (isnull)
        *t = INT64_MIN;
    return rs;
}

/* *started: window lo of run has a bucket already (an earlier step began it). */
static store_status window_started(store *st, int64_t run, int64_t lo, int *started,
                                   store_error *err)
{
    sqlite3_stmt *s = store_stmt(st, S_COARSE_STARTED, err);
    if (!s)
        return STORE_ERROR;
    int rc = SQLITE_OK;
    BIND(bind_i64(s, 1, run));
    BIND(bind_i64(s, 2, lo));
    if (rc != SQLITE_OK) {
        stmt_done(s);
        return store_db_err(st, err, rc, "binding the window check");
    }
    int64_t n = 0;
    int isnull;
    store_status rs = one_int(st, s, &n, &isnull, "checking a window", err);
    *started = n > 0;
    return rs;
}

/* Downsample window [lo, hi] of r layer by layer within *left; *complete when every layer is
 * done (coarse_upto then moves past it). */
static store_status downsample_window(store *st, run_state *r, int64_t lo, int64_t hi,
                                      int64_t *left, store_retain_report *rep, int *complete,
                                      store_error *err)
{
    *complete = 0;
    sqlite3_stmt *nl = store_stmt(st, S_NEXT_LAYER, err);
    if (!nl)
        return STORE_ERROR;
    int64_t layer = -1;
    store_status rs = STORE_OK;
    for (;;) {
        int isnull = 1;
        int rc = SQLITE_OK;
        BIND(bind_i64(nl, 1, r->id));
        BIND(bind_i64(nl, 2, layer));
        if (rc != SQLITE_OK) {
            stmt_done(nl);
            return store_db_err(st, err, rc, "binding the next layer");
        }
        if ((rs = one_int(st, nl, &layer, &isnull, "finding the next layer", err)))
            return rs;
        if (isnull)
            break; /* every layer done: the window is complete */
        if (*left <= 0) {
            rep->more = 1;
            return STORE_OK;
        }
        int64_t merged = 0;
        rs = downsample_layer(st, r->id, (int32_t)layer, lo, hi, &merged, &rep->kept,
                              &rep->buckets, err);
        if (rs)
            return rs;
        *left -= merged + 1;
        rep->downsampled += merged;
    }
    sqlite3_stmt *u = store_stmt(st, S_RUN_DOWNSAMPLED, err);
    if (!u)
        return STORE_ERROR;
    int rc = SQLITE_OK;
    BIND(bind_i64(u, 1, r->id));
    BIND(bind_i64(u, 2, hi + 1));
    if (rc != SQLITE_OK) {
        stmt_done(u);
        return store_db_err(st, err, rc, "binding the downsampling point");
    }
    if ((rs = run_done(st, u, "moving the downsampling point", err)))
        return rs;
    r->coarse_upto = hi + 1;
    r->has_upto = 1;
    *complete = 1;
    return STORE_OK;
}

/* Every run's retention state, into BUF_RUNS. */
static store_status load_runs(store *st, run_state **out, int32_t *n, store_error *err)
{
    sqlite3_stmt *s = store_stmt(st, S_RUNS_RETAIN, err);
    if (!s)
        return STORE_ERROR;
    int32_t k = 0;
    int rc;
    store_status rs = STORE_OK;
    run_state *v = NULL;
    while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
        v = store_scratch(st, BUF_RUNS, (size_t)(k + 1) * sizeof *v, err);
        if (!v) {
            rs = STORE_ERROR;
            break;
        }
        run_state *r = &v[k++];
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

/* Downsample r's windows while `eligible` holds for the next one (age: its newest sample older
 * than cutoff; size: always) and the budget lasts. *none: no window was eligible at all. */
static store_status downsample_run(store *st, run_state *r, int64_t width, int by_age,
                                   int64_t cutoff, int64_t *left, store_retain_report *rep,
                                   int *none, store_error *err)
{
    *none = 1;
    while (*left > 0) {
        int64_t lo, hi;
        int found, complete;
        store_status rs = next_window(st, r, width, &lo, &hi, &found, err);
        if (rs || !found)
            return rs;
        if (by_age) {
            int64_t t;
            if ((rs = window_time(st, r->id, lo, hi, &t, err)))
                return rs;
            if (t >= cutoff)
                return STORE_OK;
        }
        *none = 0;
        if ((rs = downsample_window(st, r, lo, hi, left, rep, &complete, err)) || !complete)
            return rs;
        if (!by_age)
            return STORE_OK; /* size: one window, then the caller measures again */
    }
    return STORE_OK;
}

static store_status run_bytes(store *st, run_state *r, store_error *err)
{
    sqlite3_stmt *s = store_stmt(st, S_RUNS_RETAIN_ONE, err);
    if (!s)
        return STORE_ERROR;
    int isnull;
    int rc = bind_i64(s, 1, r->id);
    if (rc != SQLITE_OK) {
        stmt_done(s);
        return store_db_err(st, err, rc, "binding a run's size");
    }
    return one_int(st, s, &r->bytes, &isnull, "reading a run's size", err);
}

static store_status retain_work(store *st, const store_retention *p, int64_t budget,
                                store_retain_report *rep, store_error *err)
{
    run_state *runs = NULL;
    int32_t nruns = 0;
    store_status rs = load_runs(st, &runs, &nruns, err);
    /* compaction takes at most half the budget, so that a steady ingest cannot starve
     * downsampling; what it leaves goes to the other phases */
    int64_t left = (budget + 1) / 2, rest = budget - left;
    /* 1. compaction */
    for (int32_t i = 0; rs == STORE_OK && i < nruns; i++) {
        run_state *r = &runs[i];
        if ((rs = hot_min(st, r, err)))
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
            rs = compact_block(st, r->id, r->hot_min, cutoff - 1, &left, &rep->compacted, &more,
                               err);
            if (rs == STORE_OK)
                rs = hot_min(st, r, err);
            if (more)
                rep->more = 1;
        }
    }
    if (p->exact_steps < 0)
        return rs; /* nothing is compacted, so nothing may be downsampled */
    left = (left > 0 ? left : 0) + rest;
    int64_t width = p->bucket_steps > 0 ? p->bucket_steps : STORE_BUCKET_STEPS_DEFAULT;
    int64_t now = p->now_ms ? p->now_ms : clock_ms();
    /* a window that an earlier step left half done is finished first, whatever the limits say
     * now, so that no window stays part buckets, part rows */
    for (int32_t i = 0; rs == STORE_OK && i < nruns && left > 0; i++) {
        int64_t lo, hi;
        int found, started = 0, complete;
        rs = next_window(st, &runs[i], width, &lo, &hi, &found, err);
        if (rs == STORE_OK && found)
            rs = window_started(st, runs[i].id, lo, &started, err);
        if (rs == STORE_OK && started)
            rs = downsample_window(st, &runs[i], lo, hi, &left, rep, &complete, err);
    }
    /* 2. by age */
    for (int32_t i = 0; rs == STORE_OK && i < nruns && left > 0; i++) {
        run_state *r = &runs[i];
        int64_t ms = r->has_retain_ms && r->retain_ms >= 0 ? r->retain_ms : p->retain_ms;
        int none;
        if (ms > 0)
            rs = downsample_run(st, r, width, 1, now - ms, &left, rep, &none, err);
    }
    /* 3. by size: each run's own limit, then the database's */
    for (int32_t i = 0; rs == STORE_OK && i < nruns; i++) {
        run_state *r = &runs[i];
        if (!r->has_retain_bytes || r->retain_bytes <= 0)
            continue;
        while (rs == STORE_OK && (rs = run_bytes(st, r, err)) == STORE_OK &&
               r->bytes > r->retain_bytes) {
            if (left <= 0) {
                rep->more = 1;
                break;
            }
            int none;
            if ((rs = downsample_run(st, r, width, 0, 0, &left, rep, &none, err)) || none) {
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
        run_state *best = NULL;
        int64_t best_t = INT64_MAX;
        for (int32_t i = 0; rs == STORE_OK && i < nruns; i++) {
            int64_t lo, hi, t;
            int found;
            rs = next_window(st, &runs[i], width, &lo, &hi, &found, err);
            if (rs == STORE_OK && found && (rs = window_time(st, runs[i].id, lo, hi, &t, err)) ==
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
        rs = downsample_run(st, best, width, 0, 0, &left, rep, &none, err);
    }
    /* a spent budget may have left work in any phase: one more call finds out */
    if (left <= 0)
        rep->more = 1;
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
    return run_done(st, s, "setting the limits of a run", err);
}

/* Delete run's rows of one tier: all of them (limit < 0), or those before the bound that the
 * bound statement finds `limit` rows in. *gone: the tier has none left. */
static store_status delete_some(store *st, int64_t run, int bound_id, int del_id, int two_keys,
                                int64_t limit, int *gone, store_error *err)
{
    sqlite3_stmt *b = store_stmt(st, bound_id, err);
    sqlite3_stmt *d = b ? store_stmt(st, del_id, err) : NULL;
    if (!d)
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
        rc = SQLITE_OK;
        BIND(bind_i64(d, 1, run));
        BIND(bind_i64(d, 2, k1));
        if (two_keys)
            BIND(bind_i64(d, 3, k2));
        if (rc != SQLITE_OK) {
            stmt_done(d);
            return store_db_err(st, err, rc, "binding a delete");
        }
        store_status rs = run_done(st, d, "deleting rows of a run", err);
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
    if (rs == STORE_OK && gone) {
        sqlite3_stmt *s = store_stmt(st, S_DEL_COARSE, err);
        int rc = s ? bind_i64(s, 1, run_id) : SQLITE_OK;
        if (!s)
            rs = STORE_ERROR;
        else if (rc != SQLITE_OK)
            rs = store_db_err(st, err, rc, "binding a delete");
        else
            rs = run_done(st, s, "deleting the buckets of a run", err);
        if (rs == STORE_OK && (s = store_stmt(st, S_DEL_RUN, err)) == NULL)
            rs = STORE_ERROR;
        if (rs == STORE_OK) { /* the alerts go with it (foreign key, ON DELETE CASCADE) */
            rc = bind_i64(s, 1, run_id);
            rs = rc == SQLITE_OK ? run_done(st, s, "deleting a run", err)
                                 : store_db_err(st, err, rc, "binding a delete");
        }
    }
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
