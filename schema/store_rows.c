/* store_rows.c — the rows of the three tiers decoded from a statement's current row, behind
 * store_internal.h: an exact-tier row into a store_pack_head, a compact row (every head or one)
 * and a bucket (lo / mean / hi and the per-head counts) into the handle's scratch buffers. Shared
 * by the reads (store_read.c), compaction (store_compact.c) and downsampling (store_downsample.c).
 * Calls store_core.c's helpers, the compact format (store_pack.h) and SQLite.
 *
 * How it works: a BLOB is taken from SQLite once (a NULL pointer with SQLITE_NOMEM is an error, a
 * zero-length one an empty row) and decoded by store_pack.c, which checks every bound; a row that
 * is not in the format is reported as damaged (SQLITE_CORRUPT), never read past.
 */
#include <inttypes.h>
#include <string.h>

#include "store_internal.h"

/* ---- exact rows, compact rows, buckets ------------------------------------------------------------------------------- */

void store_row_hot(sqlite3_stmt *s, store_pack_head *o, int32_t *layer, int64_t *step)
{
    if (layer)
        *layer = sqlite3_column_int(s, 1);
    o->head = sqlite3_column_int(s, 2);
    if (step)
        *step = sqlite3_column_int64(s, 3);
    o->time_ms = sqlite3_column_int64(s, 4);
    stats_head *h = &o->s;
    for (int i = 0; i < VOCAB_NCOUNTS; i++)
        *store_count(h, i) = sqlite3_column_int64(s, HOT_COL_COUNTS + i);
    for (int i = 0; i < VOCAB_NSTATS; i++) /* NULL (also a row older than its column): NaN */
        *store_stat(h, i) = col_f64(s, HOT_COL_STATS + i);
    h->sampled = sqlite3_column_int(s, HOT_COL_SAMPLED);
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

int store_row_pack(store *st, sqlite3_stmt *s, int time_col, int data_col, int32_t head,
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

int store_row_bucket(store *st, sqlite3_stmt *s, int c, int64_t time, int32_t *n,
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
