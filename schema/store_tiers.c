/* store_tiers.c — a run's three tiers read as one history, behind store_tiers.h: the trend of a
 * layer or a head (store_trend(), store_export()) and the grid of one step (store_grid()). Calls
 * store.c's helpers (store_internal.h), the compact format (store_pack.h) and SQLite.
 *
 * How it works
 * - Each tier is one statement whose rows come in the order of the result (a trend: by step; a
 *   grid: by layer); a cursor holds each statement's current row and its key. The reader takes
 *   the smallest key of the three cursors at a time: a bucket at that key is delivered first, then
 *   the compact row and the exact rows of that key are merged head by head (the exact tier wins a
 *   head both have: it was pushed later). A cursor whose key goes backwards is an error, so a plan
 *   that stopped delivering in order cannot go unnoticed.
 * - Compact rows are decoded into the handle's scratch buffers (one head only when a trend asks
 *   for one); nothing is allocated per row once the buffers have grown.
 * - Thinning (every) counts the distinct keys that delivered something, as the exact tier's SQL
 *   used to: the first, then every every-th.
 */
#include "store_tiers.h"

#include <inttypes.h>
#include <string.h>

/* ---- rows ------------------------------------------------------------------------------------- */

void store_tiers_read_hot(sqlite3_stmt *s, store_pack_head *o, int32_t *layer, int64_t *step)
{
    if (layer)
        *layer = sqlite3_column_int(s, 1);
    o->head = sqlite3_column_int(s, 2);
    if (step)
        *step = sqlite3_column_int64(s, 3);
    o->time_ms = sqlite3_column_int64(s, 4);
    stats_head *h = &o->s;
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

/* A BLOB column: its bytes, or NULL with err set when SQLite ran out of memory reading it. */
static const uint8_t *col_blob(store *st, sqlite3_stmt *s, int c, size_t *len, store_error *err)
{
    const uint8_t *b = sqlite3_column_blob(s, c);
    *len = (size_t)sqlite3_column_bytes(s, c);
    if (!b && sqlite3_errcode(st->db) == SQLITE_NOMEM) {
        store_db_err(st, err, SQLITE_NOMEM, "reading a compact row");
        return NULL;
    }
    return b ? b : (const uint8_t *)"";
}

static int corrupt(store *st, store_error *err, const char *what)
{
    store_set_err(err, SQLITE_CORRUPT, "database '%s': %s is not in the compact format of this "
                  "attnstat (a damaged row?)", st->path, what);
    return -1;
}

/* The compact row at columns time_col / data_col into BUF_A: every head (head < 0) or the one of
 * id head. *n: the heads decoded. */
static int decode_pack(store *st, sqlite3_stmt *s, int time_col, int data_col, int32_t head,
                       int32_t *n, store_error *err)
{
    size_t len;
    const uint8_t *b = col_blob(st, s, data_col, &len, err);
    if (!b)
        return -1;
    int64_t t = sqlite3_column_int64(s, time_col);
    if (head >= 0) {
        store_pack_head *a = store_scratch(st, BUF_A, sizeof *a, err);
        if (!a)
            return -1;
        int r = store_pack_decode_one(b, len, t, head, a);
        if (r < 0)
            return corrupt(st, err, "a compact row");
        *n = r;
        return 0;
    }
    int32_t cnt = store_pack_count(b, len);
    if (cnt < 0)
        return corrupt(st, err, "a compact row");
    store_pack_head *a = store_scratch(st, BUF_A, (size_t)cnt * sizeof *a, err);
    if (!a)
        return -1;
    if (store_pack_decode(b, len, t, a))
        return corrupt(st, err, "a compact row");
    *n = cnt;
    return 0;
}

int store_tiers_bucket(store *st, sqlite3_stmt *s, int c, int64_t time, int32_t *n,
                       store_error *err)
{
    static const int ids[3] = {BUF_LO, BUF_A, BUF_HI};
    const uint8_t *blob[3];
    size_t len[3], mlen;
    const uint8_t *m = col_blob(st, s, c, &mlen, err);
    if (!m)
        return -1;
    for (int i = 0; i < 3; i++)
        if (!(blob[i] = col_blob(st, s, c + 1 + i, &len[i], err)))
            return -1;
    int32_t cnt = store_pack_count(blob[1], len[1]);
    if (cnt < 0)
        return corrupt(st, err, "a bucket");
    store_pack_head *v[3];
    for (int i = 0; i < 3; i++) {
        if (store_pack_count(blob[i], len[i]) != cnt)
            return corrupt(st, err, "a bucket");
        if (!(v[i] = store_scratch(st, ids[i], (size_t)cnt * sizeof *v[i], err)))
            return -1;
        if (store_pack_decode(blob[i], len[i], time, v[i]))
            return corrupt(st, err, "a bucket");
    }
    int64_t *merged = store_scratch(st, BUF_COUNTS, (size_t)cnt * sizeof *merged, err);
    if (!merged)
        return -1;
    if (store_pack_counts_decode(m, mlen, merged, cnt))
        return corrupt(st, err, "a bucket");
    for (int32_t i = 0; i < cnt; i++)
        if (v[0][i].head != v[1][i].head || v[2][i].head != v[1][i].head)
            return corrupt(st, err, "a bucket");
    *n = cnt;
    return 0;
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
        store_tiers_read_hot(c->s, &b[k++], NULL, NULL);
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

/* The bucket decoded by store_tiers_bucket() (n heads): every head (head < 0) or one. */
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

/* ---- trend ------------------------------------------------------------------------------------ */

store_status store_tiers_trend(store *st, int64_t run_id, int32_t layer, int32_t head,
                               int64_t step_from, int64_t step_to, int64_t every,
                               store_sample_cb cb, void *ctx, int *stopped, store_error *err)
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
            if (store_tiers_bucket(st, c[0].s, 3, sqlite3_column_int64(c[0].s, 2), &n, err)) {
                rs = STORE_ERROR;
                break;
            }
            emit_bucket(st, &k, layer, m, sqlite3_column_int64(c[0].s, 1), n, head);
            rs = cur_next(st, &c[0], err);
            continue;
        }
        int32_t na = 0, nb = 0;
        if (c[1].live && c[1].key == m) {
            if (decode_pack(st, c[1].s, 1, 2, head, &na, err)) {
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
    if (stopped)
        *stopped = k.stopped;
    return rs;
}

/* ---- grid ------------------------------------------------------------------------------------- */

store_status store_tiers_grid(store *st, int64_t run_id, int64_t step, store_sample_cb cb,
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
            if (decode_pack(st, c[0].s, 1, 2, -1, &na, err)) {
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
            if (store_tiers_bucket(st, b.s, 4, sqlite3_column_int64(b.s, 3), &n, err)) {
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
