/* retain.h — the retention of the history, in the background: the store thread's idle work
 * (storer_db.idle) is one retention step of the store (store_retain.h: compaction of the exact
 * tier, downsampling by age and by size) within its budget, between the store thread's commits,
 * so that it never blocks ingest for longer than one step. Its policy comes from the settings
 * (retain_days, retain_bytes, retain_exact_steps, retain_bucket_steps, retain_budget; a SIGHUP
 * changes it) and each run's own limits (attnstat retention); what it did is counted for
 * `attnstat status` and /metrics.
 * Stage: store thread (retain_idle) and loop thread (retain_set_policy, retain_stats); calls the
 * store's retention half, util and log. The two threads meet under a mutex. */
#ifndef ATTNSTAT_RETAIN_H
#define ATTNSTAT_RETAIN_H

#include <stdint.h>

#include "config.h"
#include "store.h"

typedef struct retain retain;

typedef struct {
    int64_t retain_ms, retain_bytes; /* the global policy (0: none) */
    uint64_t steps;          /* retention steps run */
    uint64_t compacted;      /* samples packed into the compact tier */
    uint64_t downsampled;    /* samples merged into buckets */
    int64_t used_bytes;      /* the database's bytes in use after the last step */
    int over_limit;          /* a size limit is exceeded and nothing more may be downsampled */
    double last_lock_ms;     /* the last step's time holding the write lock */
    uint64_t busy_ns;        /* time in retention steps */
    uint64_t failures;
    char last_error[256];
} retain_stats;

/* For the store handle db (used on the store thread only), with c's policy. NULL on no memory. */
retain *retain_new(store *db, const cfg *c);
void retain_free(retain *r);

/* The policy from the settings (loop thread: at start and after a SIGHUP). */
void retain_set_policy(retain *r, const cfg *c);

/* Store thread: one retention step (storer_db.idle; ctx is the retain): 1 when it has more to do
 * now, 0 when it is done for now. A failure is counted and logged once per kind. */
int retain_idle(void *ctx);

/* What it did so far (any thread). */
void retain_stats_get(retain *r, retain_stats *out);

#endif /* ATTNSTAT_RETAIN_H */
