/* batch.h — computed pushes to durable samples: each computed push's results go to the store thread
 * (storer.h) as one op of its group commit, and are answered only once that transaction is
 * committed: an acknowledged sample is durable. The store thread commits as soon as its queue is
 * empty, so a lone push is committed at once and a stream of pushes shares transactions (at most
 * commit_ms open, at most max_ops ops: storer_opts).
 * Stage: batch, after the workers and before the alert feed and the Acks. It knows neither pushes
 * nor alerts: it takes batch_items, writes each through its add function on the store thread (the
 * daemon's: store_add_samples(); a fake in the tests) and hands results on through its hooks.
 * Calls the storer, counters, util and log. Loop thread only (but the add function).
 *
 * What comes back, each turn of the store thread's completions (batch_drained(), which the owner
 * of the storer calls from its drained hook), in order:
 *   1. hooks.stored() gets the items finished this turn, codes[i] OK for each one committed,
 *      INTERNAL for one the store refused alone before writing (EINVAL, NOTFOUND: not stored) or
 *      one whose transaction was rolled back (a write or the commit failed: nothing of it stored):
 *      the alert feed observes only samples that are stored, so a rollback never leaves the alert
 *      engine ahead of the store. Not called when none is OK;
 *   2. hooks.answer() once per item, in the order they were added, with the store's message when
 *      not OK;
 *   3. hooks.done() once.
 * The counters: COMMITS and COMMIT_FAILURES (every transaction of the store thread, alert records
 * included; a failure also as a store error with its message), SAMPLES_STORED. */
#ifndef ATTNSTAT_BATCH_H
#define ATTNSTAT_BATCH_H

#include <stddef.h>
#include <stdint.h>

#include "attnstat.pb-c.h"
#include "counters.h"
#include "stats.h"
#include "storer.h"
#include "store_write.h"

/* One push's results, as the batch and what follows it need them. The submitter fills it and
 * keeps it alive (it is part of the submitter's object) until its answer. */
typedef struct {
    storer_op op;            /* the batch's: carries the item to the store thread */
    void *owner;             /* the submitter's object (a push), handed back untouched */
    int64_t run_id;
    const char *run;         /* for logs and alerts */
    int32_t rank;
    uint64_t seq;
    int64_t step;
    int32_t layer;           /* global (the run's layout applied) */
    int32_t head_base;       /* heads[i] is global head head_base + i */
    const stats_head *heads; /* [nheads] */
    int32_t nheads;
    int64_t time_ms;         /* when it was received (Unix ms) */
} batch_item;

/* Writes an item into the store thread's open transaction (store thread; db is the storer's).
 * STORE_EINVAL / STORE_NOTFOUND: refused before anything was written. */
typedef store_status (*batch_add_fn)(void *db, const batch_item *it, store_error *err);

/* The daemon's: store_add_samples() on the store handle db. */
store_status batch_add_samples(void *db, const batch_item *it, store_error *err);

/* data is the pointer given to batch_new. */
typedef struct {
    void (*stored)(void *data, batch_item *const *items, const Attnstat__Code *codes, size_t n);
    /* The answer of one item (OK, or INTERNAL with the store's message). The item is the hook's
     * from then on: the batch forgets it. */
    void (*answer)(void *data, batch_item *it, Attnstat__Code code, const char *msg);
    void (*done)(void *data); /* may be NULL */
} batch_hooks;

typedef struct batch batch;

/* A batch writing through st with add. NULL with err set on failure. */
batch *batch_new(storer *st, batch_add_fn add, const batch_hooks *hooks, void *data,
                 counters *cnt, char *err, size_t errlen);
/* Hands a computed push's results to the store thread. */
void batch_add(batch *b, batch_item *it);
/* The storer's drained hook calls this: the items finished since go to the hooks (above). */
void batch_drained(batch *b);
/* Items added and not yet answered. */
uint32_t batch_pending(const batch *b);
/* Frees the batch; nothing may be pending (close the storer first: it finishes every op). */
void batch_free(batch *b);

#endif /* ATTNSTAT_BATCH_H */
