/* store_tiers.h — private to schema/: reading a run's three tiers (exact, compact, buckets) as one
 * ordered history, for store_read.c (trend, grid) and store_export.c. Also the conversions between
 * the tiers' rows that store_retain.c shares (an exact-tier row read into a store_pack_head, a
 * bucket's BLOBs decoded). Includes store_read.h and store_internal.h.
 *
 * Every function here runs inside the caller's read transaction (store_read_begin()).
 */
#ifndef ATTNSTAT_STORE_TIERS_H
#define ATTNSTAT_STORE_TIERS_H

#include "store_internal.h"
#include "store_read.h"

/* store_trend()'s work, the arguments checked and the statements bound here. */
store_status store_tiers_trend(store *st, int64_t run_id, int32_t layer, int32_t head,
                               int64_t step_from, int64_t step_to, int64_t every,
                               store_sample_cb cb, void *ctx, int *stopped, store_error *err);

/* store_grid()'s work at a known step; *delivered counts the rows handed to cb. */
store_status store_tiers_grid(store *st, int64_t run_id, int64_t step, store_sample_cb cb,
                              void *ctx, int64_t *delivered, store_error *err);

/* The exact-tier row the statement is on (the columns of HOT_COLS, store_sql.c) into h; its
 * layer to *layer, its step to *step (either may be NULL). */
void store_tiers_read_hot(sqlite3_stmt *s, store_pack_head *h, int32_t *layer, int64_t *step);

/* A bucket's columns (merged, lo, mean, hi at columns c .. c+3 of s): n heads into the handle's
 * scratch buffers BUF_LO, BUF_A, BUF_HI and BUF_COUNTS. -1 with err set when they do not agree
 * (a damaged row) or memory runs out. */
int store_tiers_bucket(store *st, sqlite3_stmt *s, int c, int64_t time, int32_t *n,
                       store_error *err);

#endif /* ATTNSTAT_STORE_TIERS_H */
