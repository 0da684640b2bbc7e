/* store_upkeep.h — private to schema/: the pieces of the retention step (store_retain.c) that live
 * in files of their own: compaction (store_compact.c) and downsampling (store_downsample.c), and
 * the state of a run they share. Every function here runs inside the step's transaction, counts
 * its work in samples against *left, and adds what it did to a store_upkeep_counts (which the step
 * copies into its store_retain_report). Includes store_internal.h only.
 */
#ifndef ATTNSTAT_STORE_UPKEEP_H
#define ATTNSTAT_STORE_UPKEEP_H

#include "store_internal.h"

/* What downsampling did, for the step's report (store_retain_report's fields of the same names). */
typedef struct {
    int64_t downsampled, buckets, kept;
    int more;
} store_upkeep_counts;

/* A run as the retention step sees it (runs' columns, and its exact tier's first step). */
typedef struct {
    int64_t id, step_max, retain_ms, retain_bytes, coarse_upto, bytes;
    int has_steps, has_retain_ms, has_retain_bytes, has_upto;
    int64_t hot_min;   /* lowest step in the exact tier */
    int has_hot;
    int done;          /* no window may be downsampled now */
} store_run_state;

/* ---- compaction (store_compact.c) -------------------------------------------------------------- */

/* Compact run's exact rows of steps [from, to], whole steps, about *left samples; *left and *done
 * (samples moved) are updated; *more says the budget stopped it before `to`. */
store_status store_compact_block(store *st, int64_t run, int64_t from, int64_t to, int64_t *left,
                                 int64_t *done, int *more, store_error *err);

/* ---- downsampling (store_downsample.c) -------------------------------------------------------- */

/* r's exact tier's first step into r->hot_min (r->has_hot: it has one). */
store_status store_hot_min(store *st, store_run_state *r, store_error *err);

/* The next window of r to downsample, [*lo, *hi] of `width` steps; *found is 0 when there is none
 * that the compaction has wholly passed (or none at all). */
store_status store_next_window(store *st, const store_run_state *r, int64_t width, int64_t *lo,
                               int64_t *hi, int *found, store_error *err);

/* The newest time of run's compact rows in [lo, hi] (INT64_MIN when none). */
store_status store_window_time(store *st, int64_t run, int64_t lo, int64_t hi, int64_t *t,
                               store_error *err);

/* *started: window lo of run has a bucket already (an earlier step began it). */
store_status store_window_started(store *st, int64_t run, int64_t lo, int *started,
                                  store_error *err);

/* Downsample window [lo, hi] of r layer by layer within *left; *complete when every layer is done
 * (coarse_upto then moves past it); rep counts what was merged, kept and written. */
store_status store_downsample_window(store *st, store_run_state *r, int64_t lo, int64_t hi,
                                     int64_t *left, store_upkeep_counts *rep, int *complete,
                                     store_error *err);

/* Downsample r's windows in order while the next one is eligible: by_age, its newest sample older
 * than cutoff; otherwise (size) just one window. *none: no window was eligible. */
store_status store_downsample_run(store *st, store_run_state *r, int64_t width, int by_age,
                                  int64_t cutoff, int64_t *left, store_upkeep_counts *rep,
                                  int *none, store_error *err);

#endif /* ATTNSTAT_STORE_UPKEEP_H */
