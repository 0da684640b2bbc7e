/* storer.h — the store's own thread: every write of attnstatd to its database (the samples of
 * computed pushes, runs, alert transitions, operators' marks, deletions, the retention step) runs
 * on it, so that the event loop never waits on SQLite, a lock or an fsync.
 * Stage: store thread, between the batch (and the other writers: session, alerts feed, commands)
 * and the store; calls the store only through the storer_db it was given (the daemon's SQLite
 * store, or a fake in the tests), util and log. It knows nothing of pushes or alerts.
 *
 * Ops. The loop thread submits ops (storer_submit); they are taken in submission order:
 *   STORER_BATCHED  op->run writes into the open transaction. The transaction is committed as soon
 *                   as the queue is empty (whatever arrived while one commit ran goes into the
 *                   next: group commit), or once it holds max_ops ops, or has been open commit_ms
 *                   while ops kept coming. An op whose run returns STORE_EINVAL or STORE_NOTFOUND
 *                   wrote nothing and fails alone; any other failure, or a failed commit, rolls the
 *                   transaction back and every op in it fails with that message (STORE_ERROR).
 *   STORER_ALONE    op->run runs with no transaction open (the open one is committed first) and
 *                   commits what it writes itself: per-run limits, one step of deleting a run.
 *   Idle work (storer_db.idle: the retention step): when the queue is empty and no transaction is
 *   open, at most every idle_ms, or again at once while it says it has more to do; and, while ops
 *   keep the queue from draining, between two transactions once idle_ms has passed since its last
 *   turn (a steady stream does not starve it). Ops that arrive meanwhile wait for it; its own
 *   budget bounds how long.
 * Completion: each finished op (status and err set) is handed back on the loop thread (one
 * uv_async), in submission order, to op->done; then drained(data) once for the ops of that turn.
 *
 * Ownership. An op belongs to its submitter, who keeps it alive until its done; the storer only
 * links it (op->next) meanwhile. storer_db's functions run on the store thread only.
 * Threads: storer_submit, storer_pending, storer_take and storer_close on the loop thread. */
#ifndef ATTNSTAT_STORER_H
#define ATTNSTAT_STORER_H

#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "store.h"

typedef enum { STORER_BATCHED = 0, STORER_ALONE = 1 } storer_mode;

typedef struct storer_op storer_op;
struct storer_op {
    storer_op *next;         /* the storer's while the op is queued or finishing */
    storer_mode mode;
    /* Store thread: the work, on the storer_db's db. */
    store_status (*run)(void *db, storer_op *op, store_error *err);
    /* Loop thread: the op finished. May submit further ops. */
    void (*done)(storer_op *op);
    void *data;              /* the submitter's */
    /* Set by the storer before done. */
    store_status status;
    store_error err;
};

/* What the thread works on. */
typedef struct {
    void *db;
    store_status (*commit)(void *db, store_error *err);
    void (*rollback)(void *db);
    /* Optional idle work (store thread): 1 when it has more to do now, 0 when it is done for now. */
    int (*idle)(void *idle_ctx);
    void *idle_ctx;
} storer_db;

/* The daemon's SQLite store behind storer_db (store_commit, store_rollback); no idle work. */
storer_db storer_db_of(store *db);

typedef struct {
    uint64_t commit_ms;      /* longest a transaction stays open while ops keep coming (0: none) */
    uint32_t max_ops;        /* ops of one transaction at most (0: 4096) */
    uint64_t idle_ms;        /* the idle work at most this often when it is done for now */
} storer_opts;

/* What the thread did since the last storer_take() (loop thread). */
typedef struct {
    uint64_t commits;        /* transactions committed */
    uint64_t rollbacks;      /* transactions rolled back (a write or the commit failed) */
    char last_error[512];    /* why the last one was rolled back ("" when none since) */
    uint64_t busy_ns;        /* time spent on ops and commits */
    uint64_t idle_ns;        /* time spent in the idle work */
} storer_counts;

typedef struct storer storer;

/* Starts the thread. drained(data) is called on the loop thread after each turn of completions (may
 * be NULL). NULL with err set on failure. */
storer *storer_new(uv_loop_t *loop, const storer_db *db, const storer_opts *o,
                   void (*drained)(void *data), void *data, char *err, size_t errlen);

/* Queues op (see above). After storer_close() the op runs at once on the calling thread (with a
 * commit of its own) and its done is called before this returns. */
void storer_submit(storer *s, storer_op *op);

/* Ops submitted and not yet done. */
uint32_t storer_pending(const storer *s);

/* Adds what the thread did since the last call to *out (zeroed by the caller). */
void storer_take(storer *s, storer_counts *out);

/* Lets the thread finish every queued op, commit and stop; joins it, completes what finished (done
 * and drained, before this returns) and closes the async handle. Later submits run inline (above).
 * Once. */
void storer_close(storer *s);
/* Frees s once the loop has run the async handle's close callback (after uv_run returned). */
void storer_free(storer *s);

#endif /* ATTNSTAT_STORER_H */
