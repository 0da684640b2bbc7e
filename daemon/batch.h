/* batch.h — computed pushes to durable samples: finished results wait in an open batch that is
 * committed to the store in one transaction (at most commit_ms after its first result, or at once
 * when BATCH_MAX results wait), and only then answered: an acknowledged sample is durable.
 * Stage: batch, after the workers and before the alert feed and the Acks. It knows neither pushes
 * nor alerts: it takes batch_items, writes through a small store interface (batch_store: the
 * daemon's SQLite store, or a fake in the tests) and hands results on through its hooks. Calls
 * the store (through the interface), counters, util and log. Loop thread only.
 *
 * A flush, in order:
 *   1. every item's samples are added; a store that refuses one item before writing anything
 *      (EINVAL, NOTFOUND) fails that item alone (INTERNAL); any other failure, or a failed commit,
 *      rolls the whole batch back and every item of it is answered INTERNAL with the store's
 *      message: nothing is acknowledged that is not stored;
 *   2. when the samples are committed, hooks.stored() gets the batch (the alert feed sees only
 *      stored samples, so a rollback never leaves the alert engine ahead of the store);
 *   3. hooks.answer() once per item, in the order they were added;
 *   4. hooks.done() once, after the last answer. */
#ifndef ATTNSTAT_BATCH_H
#define ATTNSTAT_BATCH_H

#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "attnstat.pb-c.h"
#include "counters.h"
#include "stats.h"
#include "store_write.h"

#define BATCH_MAX 256 /* results of one transaction at most */

/* One push's results, as the batch and what follows it need them. The submitter fills it and
 * keeps it alive (it is part of the submitter's object) until its answer. */
typedef struct {
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

/* The store as the batch uses it. db is passed back to every call. */
typedef struct {
    void *db;
    store_status (*add)(void *db, const batch_item *it, store_error *err);
    store_status (*commit)(void *db, store_error *err);
    void (*rollback)(void *db);
} batch_store;

/* The daemon's store behind the interface (store_add_samples, store_commit, store_rollback). */
batch_store batch_store_of(store *db);

/* data is the pointer given to batch_new. */
typedef struct {
    /* Step 2: the samples are committed. codes[i] is OK for the items stored, INTERNAL for those
     * the store refused alone. May be NULL. */
    void (*stored)(void *data, batch_item *const *items, const Attnstat__Code *codes, size_t n);
    /* Step 3: the answer of one item (OK, or INTERNAL with the store's message). The item is the
     * hook's from then on: the batch forgets it. */
    void (*answer)(void *data, batch_item *it, Attnstat__Code code, const char *msg);
    /* Step 4. May be NULL. */
    void (*done)(void *data);
} batch_hooks;

typedef struct batch batch;

/* A batch whose timer runs on loop. NULL with err set on failure. */
batch *batch_new(uv_loop_t *loop, uint64_t commit_ms, const batch_store *st,
                 const batch_hooks *hooks, void *data, counters *cnt, char *err, size_t errlen);
/* Adds a computed push's results; commits when the batch is full or closing, else arms the timer
 * (commit_ms; 0: the next loop iteration). */
void batch_add(batch *b, batch_item *it);
/* Commits what waits and answers it now (nothing when the batch is empty). */
void batch_flush(batch *b);
/* Items waiting for a commit. */
uint32_t batch_pending(const batch *b);
/* Commits what waits, then closes the timer and frees the batch in its close callback. Items
 * added after this are committed at once. */
void batch_close(batch *b);

#endif /* ATTNSTAT_BATCH_H */
