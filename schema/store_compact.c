/* store_compact.c — compaction, behind store_upkeep.h: a block of whole steps of a run's exact
 * tier packed into the compact tier (schema/store_pack.h), one row per (layer, step), merged with
 * the row already there. Called by the retention step (store_retain.c). Calls store_core.c's helpers
 * (store_internal.h), the compact format, the exact-row reader of store_rows.c, SQLite and libc.
 *
 * How it works
 * - The block is read in the exact tier's key order (step, layer, head) and grouped by
 *   (step, layer); the groups are sorted by (layer, step) and written in that order, so a layer's
 *   rows of the block are neighbours in the table (they are read together by a trend). A group
 *   whose compact row exists already (a sample pushed again after compaction) is merged into it
 *   head by head, the new head winning, and the run's count corrected (the push counted it as new).
 * - The block is then deleted from the exact tier by range, and runs.bytes follows.
 */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "store_internal.h"
#include "store_upkeep.h"

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
    sqlite3_stmt *put = store_stmt(st, S_PACK_PUT, err);
    sqlite3_stmt *get = put ? store_bind_ints(st, S_PACK_GET, (const int64_t[]){run, g->layer,
                                              g->step}, 3, "reading a compact row", err) : NULL;
    if (!get)
        return STORE_ERROR;
    int rc = sqlite3_step(get);
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
    return store_run_done(st, put, "writing a compact row", err);
}

/* Compact run's exact rows of steps [from, to], whole steps, about *left samples; *left and
 * *done (samples moved) are updated; *more says the budget stopped it before `to`. */
store_status store_compact_block(store *st, int64_t run, int64_t from, int64_t to,
                                  int64_t *left, int64_t *done, int *more, store_error *err)
{
    sqlite3_stmt *s = store_bind_ints(st, S_HOT_BLOCK, (const int64_t[]){run, from, to}, 3,
                                      "reading the exact tier", err);
    if (!s)
        return STORE_ERROR;
    int rc = SQLITE_OK;
    int32_t nrows = 0, ngroups = 0;
    int64_t last = from;
    store_status rs = STORE_OK;
    while (rs == STORE_OK && (rc = sqlite3_step(s)) == SQLITE_ROW) {
        int32_t layer;
        int64_t step;
        store_pack_head h;
        store_row_hot(s, &h, &layer, &step);
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
    if (rs == STORE_OK)
        rs = store_exec_ints(st, S_HOT_DELETE, (const int64_t[]){run, from, last}, 3,
                             "deleting compacted rows", err);
    if (rs == STORE_OK)
        rs = store_adjust_run(st, run, bytes, -replaced, err); /* a replaced head was counted twice */
    if (rs == STORE_OK) {
        *left -= nrows;
        *done += nrows;
    }
    return rs;
}
