/* push.h — one Push, from its receipt to its Ack: the one object that carries it through the
 * stages. Stage: push, after the session; calls validate, buffers, devices, worker and gpu_worker
 * to start it, and conn (Release, Ack), envelope and counters to finish it; it calls neither the
 * batch nor the session: the loop hands it from stage to stage.
 *
 * Ownership, written once here:
 *   created   push_receive(): the session hands it a Push message of a client (peer). It is
 *             validated (validate.c), its client is referenced, its buffers pinned (mappings,
 *             device memory, event), and it is queued on a worker: the worker's queue owns it.
 *             A push refused on the way (no Hello, shutting down, invalid, over the client's or
 *             the worker's limit) is answered at once and freed: it never exists past the call.
 *   computed  the worker hands its job back on the loop thread (push_of_job); push_computed()
 *             lets go of its memory (Release sent to the client) and keeps in its heads only the
 *             statistics the Push asked for (Push.stats: the others made absent, whichever
 *             backend computed them); a failed computation is answered and freed there.
 *   batched   push_item(): its results, as the batch's item; the batch owns it until it answers.
 *   acked     push_answer() (push_of_item): the Ack to its client, with the per-head results when
 *             it asked for them, and a Result to the subscribers;
 *   freed     by push_answer() too: its client's reference goes with it.
 * Its fields are written by push.c only; nobody else holds it between those calls.
 *
 * The path of a push through the daemon, each stage's file crossed once:
 *   conn.c (frame, decode) -> session.c (dispatch) -> push.c (created: validate.c, buffers.c,
 *   devices.c) -> worker.c or gpu_worker.c (computed, on a worker thread) -> batch.c (one
 *   transaction: the store's insert) -> alerts_feed.c (engine, alert rows) -> alerts_deliver.c
 *   (log, subscribers, --alert-exec).
 * Between the worker and the batch, and after the batch, the hop is a callback loop.c wired (the
 * pool's done callback; the batch's hooks); there the object's own steps are taken: push_computed
 * (Release) before the batch, push_answer (Ack, Result) after it. Loop thread only. */
#ifndef ATTNSTAT_PUSH_H
#define ATTNSTAT_PUSH_H

#include "attnstat.pb-c.h"
#include "batch.h"
#include "ctx.h"
#include "peer.h"
#include "worker.h"

typedef struct push push;

/* Where a stored push's Result goes (the subscribers); data is push_answer's. */
typedef void (*push_result_fn)(void *data, const Attnstat__Envelope *env);

/* Created: see above. Counts PUSHES, and REJECTED / DROPPED / FAILED for one refused at once. */
void push_receive(const stage_ctx *x, peer *p, const Attnstat__Push *m);

/* A Computed message (statistics the client computed in its own process): checked
 * (validate_computed), then the same path as a push's results, through the CPU worker's queue
 * without a computation and without a Release. Counts as a push. */
void push_receive_computed(const stage_ctx *x, peer *p, const Attnstat__Computed *m);

/* The push of a job the pool handed back, of an item the batch answers. */
push *push_of_job(worker_job *job);
push *push_of_item(batch_item *it);

/* Computed: the memory is let go of and Release sent; the statistics not asked for are made
 * absent (stats_head_keep). 0: it goes on to the batch (push_item); -1: the computation failed,
 * the push was answered (FAILED) and freed. */
int push_computed(push *u);
batch_item *push_item(push *u);

/* Acked and freed: Ack(code, msg) to its client (OK: with the per-head results when it asked for
 * them; PUSHES_DONE, else FAILED counted); for OK, results (may be NULL: nobody subscribed) gets
 * the Result. u is gone when this returns. */
void push_answer(push *u, Attnstat__Code code, const char *msg, push_result_fn results, void *data);

#endif /* ATTNSTAT_PUSH_H */
