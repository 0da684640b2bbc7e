/* local.h — libattnstat's local mode (attnstat_set_local_compute): CUDA pushes computed in the
 * caller's own process, only their per-head results sent to attnstatd.
 *
 * Why: without MPS the GPU time-slices between the trainer's CUDA context and the daemon's, and
 * the daemon's kernels then stop the trainer's instead of sharing the GPU with them (measured in
 * bench/RESULTS.md, "Overhead on a real model"). Here the statistics kernel (kernels/cuda, the
 * daemon's own) runs on a stream of the lowest priority in the caller's context, after an event
 * recorded on the caller's stream; its per-head results land in pinned memory, and once its done
 * event has fired they go to the daemon in a Computed message, which the daemon stores and checks
 * against the alert rules like its own results (and answers with an Ack).
 *
 * What it promises: a push never synchronises the device and never waits (a workspace that must
 * grow aside: once, on the local stream); a push's tensors are in use until its kernel is done,
 * then released (the release callback, like a zero-copy push's Release); results are sent in push
 * order; a result whose connection is gone is dropped and counted (dropped_disconnected). The
 * in-flight slot of a local push is taken when it is pushed and freed by the daemon's Ack (or
 * abandoned with a lost connection): flush waits for both the kernel and the Ack.
 *
 * Stage: beside push.c (it calls conn.c, link.c, util.c and kernels/stats_cuda.h); push.c hands it
 * the CUDA pushes of a client in local mode; link.c calls local_progress wherever the link moves. */
#ifndef ATTNSTAT_LOCAL_H
#define ATTNSTAT_LOCAL_H

#include "client_internal.h"

/* The tensors of one local push (q and k; the mask, the device packed offsets and the sinks when
 * given), and what it asks for. */
typedef struct {
    const attnstat_tensor *q, *k, *mask, *cu_q, *cu_k, *sinks;
    int32_t compute_dtype; /* -1: the tensors' own precision */
    int32_t stream_waits;  /* 1: the caller's stream waits for the computation (no copy kept) */
    uint32_t stats;        /* the statistics asked for (the problem's want); 0: the defaults */
    double *max_logit_out; /* device [Hq]: each head's max logit, or NULL */
} local_tensors;

/* Enqueues the computation of push seq (its in-flight slot given) on the tensors' device. OK, or
 * DROPPED (no room for its results: counted), or an error with c->err set (nothing held). */
attnstat_code local_push(attnstat_client *c, const attnstat_push_opts *o, const local_tensors *t,
                         uint64_t seq, client_inflight *slot);

/* Sends the results of the computations that are done (in push order), releases their tensors.
 * Never waits. */
void local_progress(attnstat_client *c);

/* Computations enqueued and not yet done (their results not yet sent). */
int local_busy(const attnstat_client *c);

/* attnstat_close: waits for the computations still running (the caller's memory must not go while
 * a kernel reads it), releases them, frees everything. */
void local_free(attnstat_client *c);

#endif /* ATTNSTAT_LOCAL_H */
