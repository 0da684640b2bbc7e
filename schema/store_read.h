/* store_read.h — the reading half of the store: runs (list, get, resolve a name), the trend of a
 * layer or head over steps, the grid of one step, alert transitions, and the integrity check.
 * Used by the CLI on a read-only handle (store_open_readonly()) and by the daemon's restore at
 * start-up on its read-write handle. None of these calls writes to the database.
 * Includes store.h and kernels/stats.h (stats_head, the statistics of one head).
 *
 * Reads deliver rows through callbacks: each row struct and its strings are valid only during the
 * call (copy what you keep). A callback returns 0 to go on, non-zero to stop early (the read then
 * returns STORE_OK). Rows come in a documented order.
 */
#ifndef ATTNSTAT_STORE_READ_H
#define ATTNSTAT_STORE_READ_H

#include <stdint.h>

#include "stats.h"
#include "store.h"

#ifdef __cplusplus
extern "C" {
#endif

/* store_grid(): the latest step of the run. */
#define STORE_STEP_LATEST INT64_MIN

typedef struct {
    int64_t id;
    const char *name;
    int32_t rank;
    const char *host;        /* NULL when unknown */
    int64_t pid;             /* 0 when unknown */
    int64_t started_ms;      /* first Hello */
    int64_t last_hello_ms;   /* latest Hello */
    const char *config;      /* NULL when none */
    const char *thresholds;  /* NULL when none */
    int64_t samples;         /* committed sample rows */
    int64_t step_min, step_max; /* 0 when samples == 0 */
    int64_t last_time_ms;    /* time of the newest sample; 0 when none */
} store_run;

typedef struct {
    int64_t run_id;
    int32_t layer, head;
    int64_t step;
    int64_t time_ms;
    stats_head stats;
} store_sample;

typedef int (*store_run_cb)(void *ctx, const store_run *run);
typedef int (*store_sample_cb)(void *ctx, const store_sample *s);
typedef int (*store_alert_cb)(void *ctx, const store_alert *a);

/* Every run, ordered by id. */
store_status store_list_runs(store *st, store_run_cb cb, void *ctx, store_error *err);

/* One run by id. STORE_NOTFOUND when there is none. */
store_status store_get_run(store *st, int64_t run_id, store_run_cb cb, void *ctx,
                           store_error *err);

/* Resolve a run given by the user: a decimal id of an existing run, else a run name. A name with
 * several ranks needs rank >= 0 (rank < 0: any rank, STORE_AMBIGUOUS when there are several).
 * STORE_NOTFOUND with a message naming spec when nothing matches. */
store_status store_resolve_run(store *st, const char *spec, int32_t rank, int64_t *run_id,
                               store_error *err);

/* Trend of one layer of one run over steps [step_from, step_to] (inclusive), head >= 0 for one
 * head, head < 0 for every head. Thinning: of the distinct steps in the range (that have a sample
 * of the selected head(s)), the first one and then every `every`-th (every <= 1: all).
 * Rows come ordered by step, then head. */
store_status store_trend(store *st, int64_t run_id, int32_t layer, int32_t head,
                         int64_t step_from, int64_t step_to, int64_t every,
                         store_sample_cb cb, void *ctx, store_error *err);

/* Every (layer, head) sample of one step of one run: the grid. step == STORE_STEP_LATEST: the
 * run's highest stored step. The step used is written to *step_used (may be NULL).
 * STORE_NOTFOUND when the run has no sample (or none at that step).
 * Rows come ordered by layer, then head. */
store_status store_grid(store *st, int64_t run_id, int64_t step, int64_t *step_used,
                        store_sample_cb cb, void *ctx, store_error *err);

/* Alert transitions of one run (run_id > 0) or of all runs (run_id == 0), ordered by id (time of
 * insertion). active_only: for each (run, layer, head, rule), only its latest transition, and only
 * when that one is a raise. */
store_status store_alerts(store *st, int64_t run_id, int active_only, store_alert_cb cb,
                          void *ctx, store_error *err);

/* PRAGMA integrity_check: STORE_OK when it says "ok"; otherwise STORE_ERROR with the problems it
 * found in err (as many as fit). store_quick_check: the same with PRAGMA quick_check (every page
 * read and checked, indexes not compared with their tables: O(size) rather than O(size log size)),
 * what the daemon runs at start. */
store_status store_integrity_check(store *st, store_error *err);
store_status store_quick_check(store *st, store_error *err);

#ifdef __cplusplus
}
#endif

#endif /* ATTNSTAT_STORE_READ_H */
