/* store_retain.h — upkeep of the history: the retention step (compaction of the exact tier,
 * downsampling by age and by size), per-run limits, and deleting a run. For the daemon's
 * background upkeep and for the CLI (delete-run); only a read-write handle does any of it
 * (STORE_EINVAL on a read-only one). Includes store.h.
 *
 * The retention step
 *   store_retain_step() does a bounded amount of work in one short transaction and returns; call it
 *   again while it reports more (rep.more), then now and then (every few seconds) as data ages.
 *   In order, within its budget (compaction takes at most half of it, so that a steady ingest
 *   cannot starve downsampling):
 *   1. Compaction. A run's samples more than policy.exact_steps steps behind its latest step are
 *      packed from the exact tier into the compact tier (schema/store_pack.h), in aligned blocks
 *      of exact_steps steps (steps below the latest multiple of exact_steps that is at least
 *      exact_steps behind the latest step), layer by layer, so a layer's rows of a block lie side
 *      by side; the exact tier so holds between exact_steps and 2 * exact_steps steps of each run
 *      (exact_steps 0: everything but the latest step). A sample pushed again after its step was
 *      compacted replaces the packed head when it is compacted in turn.
 *   2. Downsampling by age. Windows of policy.bucket_steps steps (aligned: [k*w, k*w + w - 1])
 *      whose newest sample is older than the run's retain_ms are merged into one bucket per layer:
 *      each head's minimum, mean and maximum of every field (store.h, "Tiers"). Only windows that
 *      the compaction has wholly passed are touched, so recent data always keeps full resolution.
 *   3. Downsampling by size. While the database's bytes in use exceed policy.retain_bytes, the
 *      oldest eligible window of any run (by the time of its newest sample) is downsampled,
 *      whatever its age; while a run's estimated bytes exceed its own retain_bytes, its oldest
 *      windows are. When nothing more may be downsampled and a limit is still exceeded,
 *      rep.over_limit says so (the newest, full-resolution data is never dropped). The file itself
 *      does not shrink: freed pages are reused by later writes (rep.used_bytes counts only pages
 *      in use).
 *   Alert rows are never touched, and a (run, layer, step) that raised or cleared an alert keeps
 *   its full-resolution row inside a downsampled window.
 * The write lock is held only for the step's transaction; the budget bounds it (bench/RESULTS.md,
 * "History", has the cost per sample on the development machine). Call it from the thread that
 * owns the handle, between batches, or from another thread on a handle of its own (writes of the
 * two handles then take turns through the busy timeout). With a batch open on this handle it
 * refuses (STORE_EINVAL): commit first.
 */
#ifndef ATTNSTAT_STORE_RETAIN_H
#define ATTNSTAT_STORE_RETAIN_H

#include <stdint.h>

#include "store.h"

#ifdef __cplusplus
extern "C" {
#endif

#define STORE_EXACT_STEPS_DEFAULT 64
#define STORE_BUCKET_STEPS_DEFAULT 100
#define STORE_RETAIN_BUDGET_DEFAULT 4096

typedef struct {
    int64_t exact_steps;  /* steps behind a run's latest that stay exact; < 0: never compact (and
                           * so never downsample) */
    int64_t retain_ms;    /* full resolution for samples younger than this; 0: no age limit.
                           * A run's own limit (store_run_set_retention()) replaces it. */
    int64_t retain_bytes; /* limit on the database's bytes in use; 0: none */
    int64_t bucket_steps; /* a bucket's window in steps (>= 2); 0: STORE_BUCKET_STEPS_DEFAULT */
    int64_t now_ms;       /* ages are measured from this time; 0: the clock */
} store_retention;

/* exact_steps 64, no age or size limit, windows of 100 steps, the clock. */
#define STORE_RETENTION_DEFAULT {STORE_EXACT_STEPS_DEFAULT, 0, 0, 0, 0}

typedef struct {
    int64_t compacted;    /* samples packed from the exact tier into the compact tier */
    int64_t downsampled;  /* samples merged into buckets */
    int64_t buckets;      /* bucket rows written */
    int64_t kept;         /* full-resolution rows that alerts kept inside downsampled windows */
    int64_t used_bytes;   /* the database's bytes in use after the step */
    int64_t lock_us;      /* microseconds the step held the write lock */
    int64_t wait_us;      /* microseconds it waited for the lock (another handle's batch) */
    int more;             /* 1: the budget stopped it with work left: call again soon */
    int over_limit;       /* 1: a size limit is exceeded and nothing more may be downsampled */
} store_retain_report;

/* One retention step (see above), touching about `budget` samples (<= 0:
 * STORE_RETAIN_BUDGET_DEFAULT): it stops at the first whole step (compaction) or whole layer of a
 * window (downsampling) after the budget is spent, so one call may exceed it by that much. policy
 * NULL: STORE_RETENTION_DEFAULT. rep may be NULL. On failure nothing of the step is kept. */
store_status store_retain_step(store *st, const store_retention *policy, int64_t budget,
                               store_retain_report *rep, store_error *err);

/* A run's own limits, replacing the policy's for that run: retain_ms (age) and retain_bytes (its
 * estimated bytes, store_run.bytes); a value < 0 gives the limit back to the policy, 0 means no
 * limit for this run. Durable when it returns. STORE_NOTFOUND when there is no such run. */
store_status store_run_set_retention(store *st, int64_t run_id, int64_t retain_ms,
                                     int64_t retain_bytes, store_error *err);

/* Delete a run and everything of it (samples of every tier, alerts), about `budget` samples per
 * call (<= 0: all in one transaction). Call again until *done is 1; each call is one transaction,
 * so a big run never holds the write lock long, and the run, partly deleted, stays listed until
 * the last call removes it. Delete only a run that no handle is writing to (the daemon ends its
 * sessions first): a push to it meanwhile is stored and deleted with the rest, or, after the last
 * call, refused as an unknown run by a handle that has not cached it. STORE_NOTFOUND when there
 * is no such run. */
store_status store_delete_run(store *st, int64_t run_id, int64_t budget, int *done,
                              store_error *err);

#ifdef __cplusplus
}
#endif

#endif /* ATTNSTAT_STORE_RETAIN_H */
