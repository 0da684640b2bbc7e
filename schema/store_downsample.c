/* store_downsample.c — downsampling, behind store_upkeep.h: a run's windows of steps merged into
 * buckets (per head, the minimum, mean and maximum of each field), window by window, layer by
 * layer, and the questions the retention step asks about windows (the next one, its age, whether
 * an earlier step began it). Calls store_core.c's helpers (store_internal.h), the compact format, the
 * bucket reader of store_rows.c, SQLite and libc.
 *
 * How it works
 * - A layer's rows of the window are folded into per-head accumulators (count, and per field the
 *   number of finite values, their sum, minimum and maximum), written as one bucket row (three
 *   compact rows lo / mean / hi and the per-head counts), and deleted; the rows of steps that have
 *   alerts are skipped (kept). A bucket that exists already (rows compacted into a window after it
 *   was downsampled) is folded in with its means weighted by its sample counts.
 * - Windows are aligned ([k*w, k*w + w - 1]); the next one starts at the first compact row at or
 *   after the run's coarse_upto, and is eligible only once the compaction has wholly passed it.
 *   When every layer of a window is done, coarse_upto moves past it.
 */
#include <inttypes.h>
#include <math.h>
#include <string.h>

#include "store_internal.h"
#include "store_upkeep.h"

/* ---- one layer of a window ------------------------------------------------------------------- */

/* Every statistic and count of vocab.h's rows (store_stat(), store_count()). */
enum { NF = VOCAB_NSTATS, NC = VOCAB_NCOUNTS };

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
    return store_stat(h, i);
}

static int64_t *count(stats_head *h, int i)
{
    return store_count(h, i);
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
    return store_run_done(st, s, "writing a bucket", err);
}

/* A bucket of (run, layer, w_lo) that exists already: folded into the accumulators and its size
 * taken off *bytes. */
static store_status fold_old_bucket(store *st, int64_t run, int32_t layer, int64_t w_lo,
                                    int32_t *nacc, int64_t *bytes, store_error *err)
{
    sqlite3_stmt *s = store_bind_ints(st, S_COARSE_GET, (const int64_t[]){run, layer, w_lo}, 3,
                                      "reading a bucket", err);
    if (!s)
        return STORE_ERROR;
    int rc = sqlite3_step(s);
    store_status rs = STORE_OK;
    if (rc == SQLITE_ROW) {
        int32_t n = 0;
        if (store_row_bucket(st, s, 3, sqlite3_column_int64(s, 2), &n, err))
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
    sqlite3_stmt *s = store_bind_ints(st, S_ALERT_STEPS, (const int64_t[]){run, w_lo, w_hi, layer},
                                      4, "reading the alerts of a window", err);
    if (!s)
        return STORE_ERROR;
    int rc = SQLITE_OK;
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
    sqlite3_stmt *s = store_bind_ints(st, S_PACK_TREND, (const int64_t[]){run, layer, w_lo, w_hi},
                                      4, "reading a window", err);
    if (!s)
        return STORE_ERROR;
    int rc = SQLITE_OK;
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
    for (int32_t i = 0; rs == STORE_OK && i < nsteps; i++)
        rs = store_exec_ints(st, S_PACK_DELETE, (const int64_t[]){run, layer, del_steps[i]}, 3,
                             "deleting a downsampled row", err);
    if (rs == STORE_OK)
        rs = fold_old_bucket(st, run, layer, w_lo, &nacc, &bytes, err);
    if (rs == STORE_OK)
        rs = put_bucket(st, run, layer, w_lo, w_hi, nacc, &bytes, err);
    if (rs == STORE_OK)
        rs = store_adjust_run(st, run, bytes, 0, err);
    if (rs == STORE_OK) { /* kept rows count once: when their layer's bucket is written */
        *merged_out += merged;
        *kept += nkept_rows;
        (*nbuckets)++;
    }
    return rs;
}

/* ---- windows ------------------------------------------------------------------------------------- */

store_status store_hot_min(store *st, store_run_state *r, store_error *err)
{
    int isnull = 1;
    store_status rs = store_query_int(st, S_HOT_MIN_STEP, &r->id, 1, &r->hot_min, &isnull,
                                      "finding the exact tier's first step", err);
    r->has_hot = !isnull;
    return rs;
}

/* The next window of r to downsample: [*lo, *hi]. 0 when there is none that compaction has
 * passed (or none at all). */
store_status store_next_window(store *st, const store_run_state *r, int64_t width, int64_t *lo,
                                int64_t *hi, int *found, store_error *err)
{
    *found = 0;
    int64_t first = 0;
    int isnull = 1;
    store_status rs = store_query_int(
        st, S_PACK_NEXT_STEP, (const int64_t[]){r->id, r->has_upto ? r->coarse_upto : INT64_MIN},
        2, &first, &isnull, "finding the next window", err);
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
store_status store_window_time(store *st, int64_t run, int64_t lo, int64_t hi, int64_t *t,
                                store_error *err)
{
    int isnull = 1;
    store_status rs = store_query_int(st, S_PACK_WINDOW_TIME, (const int64_t[]){run, lo, hi}, 3,
                                      t, &isnull, "reading the window's time", err);
    if (isnull)
        *t = INT64_MIN;
    return rs;
}

/* *started: window lo of run has a bucket already (an earlier step began it). */
store_status store_window_started(store *st, int64_t run, int64_t lo, int *started,
                                   store_error *err)
{
    int64_t n = 0;
    int isnull;
    store_status rs = store_query_int(st, S_COARSE_STARTED, (const int64_t[]){run, lo}, 2, &n,
                                      &isnull, "checking a window", err);
    *started = n > 0;
    return rs;
}

/* Downsample window [lo, hi] of r layer by layer within *left; *complete when every layer is
 * done (coarse_upto then moves past it). */
store_status store_downsample_window(store *st, store_run_state *r, int64_t lo, int64_t hi,
                                      int64_t *left, store_upkeep_counts *rep, int *complete,
                                      store_error *err)
{
    *complete = 0;
    int64_t layer = -1;
    store_status rs = STORE_OK;
    for (;;) {
        int isnull = 1;
        if ((rs = store_query_int(st, S_NEXT_LAYER, (const int64_t[]){r->id, layer}, 2, &layer,
                                  &isnull, "finding the next layer", err)))
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
    if ((rs = store_exec_ints(st, S_RUN_DOWNSAMPLED, (const int64_t[]){r->id, hi + 1}, 2,
                              "moving the downsampling point", err)))
        return rs;
    r->coarse_upto = hi + 1;
    r->has_upto = 1;
    *complete = 1;
    return STORE_OK;
}

/* Downsample r's windows while `eligible` holds for the next one (age: its newest sample older
 * than cutoff; size: always) and the budget lasts. *none: no window was eligible at all. */
store_status store_downsample_run(store *st, store_run_state *r, int64_t width, int by_age,
                                   int64_t cutoff, int64_t *left, store_upkeep_counts *rep,
                                   int *none, store_error *err)
{
    *none = 1;
    while (*left > 0) {
        int64_t lo, hi;
        int found, complete;
        store_status rs = store_next_window(st, r, width, &lo, &hi, &found, err);
        if (rs || !found)
            return rs;
        if (by_age) {
            int64_t t;
            if ((rs = store_window_time(st, r->id, lo, hi, &t, err)))
                return rs;
            if (t >= cutoff)
                return STORE_OK;
        }
        *none = 0;
        if ((rs = store_downsample_window(st, r, lo, hi, left, rep, &complete, err)) || !complete)
            return rs;
        if (!by_age)
            return STORE_OK; /* size: one window, then the caller measures again */
    }
    return STORE_OK;
}
