/* worker.h — compute workers. Stage: worker (the CPU pool; the GPU workers of gpu_worker.h plug
 * their compute function into the same pool). Includes kernels/ (stats.h); calls util and log.
 *
 * Each worker owns a thread and a bounded queue of jobs, and hands finished jobs back to the loop
 * thread through one uv_async shared by the pool, to the done callback the loop gave the pool. The
 * pool knows nothing of pushes, clients or devices: a job is memory to read and heads to write. A
 * worker is a name, a capacity and a compute function (with its own context): the CPU worker
 * computes with stats_cpu_fast_ws() in a grow-only workspace it owns (no allocation per job; nothing
 * leaks when a job faults); a GPU worker (one per device) plugs in its own function and context
 * (CUDA context, low-priority stream, cached IPC handles) and is chosen by the submitter from the
 * push's buffer kind and device. Everything else (queueing, back-pressure, completion, shutdown,
 * counters) is shared.
 *
 * Threads. worker_submit(), worker_pool_* and the done callback run on the loop thread; the compute
 * function runs on the worker's thread and touches only its job. A job's memory belongs to the
 * submitter; the worker reads job->prob's tensors, writes job->heads / status / err, and never
 * touches the job after handing it back. */
#ifndef ATTNSTAT_WORKER_H
#define ATTNSTAT_WORKER_H

#include <stdint.h>
#include <uv.h>

#include "stats.h"

#define WORKER_MAX_GUARDS 7 /* the tensors of a push (validate.h VALIDATE_MAX_TENSORS) */

typedef struct worker_job worker_job;
struct worker_job {
    worker_job *next;        /* queue link (owned by the pool while queued) */
    stats_problem prob;      /* tensors resolved to readable memory */
    stats_head *heads;       /* [prob.heads_q], written by the worker */
    /* Memory guards: before computing, the worker checks that each fd still has at least `bytes`
     * bytes (a client may shrink its shm segment), and a SIGBUS while computing fails the job
     * instead of killing the daemon. */
    int guard_fd[WORKER_MAX_GUARDS];
    uint64_t guard_bytes[WORKER_MAX_GUARDS];
    int nguards;
    void *ext;               /* the compute function's own per-job data (GPU: gpu_refs) */
    void *owner;             /* the submitter's object (a push), handed back untouched */
    /* Set by a compute function that enqueued the work and returns before it is done (the GPU
     * workers): the worker's finish function completes it later (worker_set_finish). */
    int pending;
    int precomputed;         /* heads already filled (a client's Computed): nothing to compute */
    uint64_t work;           /* its weight in the queue, in multiply-adds (worker_set_work_cap) */
    /* Results. */
    stats_status status;
    int fail_code;           /* non-zero: the Ack code of a failure (else derived from status) */
    stats_error err;
    uint64_t queued_ns, started_ns, done_ns; /* monotonic clock */
    struct worker *worker;   /* where it ran */
};

typedef struct worker worker;
typedef struct worker_pool worker_pool;

/* Computes one job on the worker's thread: fills job->heads, returns the status (err on failure). */
typedef stats_status (*worker_compute_fn)(void *wctx, worker_job *job);
/* Completes, on the worker's thread, a job its compute function left pending: waits for its
 * results and returns its status. Jobs are finished in the order they were computed. */
typedef stats_status (*worker_finish_fn)(void *wctx, worker_job *job);
/* Called on the loop thread for every finished job, in completion order. */
typedef void (*worker_done_fn)(void *ctx, worker_job *job);

typedef struct {
    const char *name;
    uint32_t queue_depth;    /* queued + running */
    uint32_t capacity;
    uint64_t queued_work;    /* multiply-adds queued + running */
    uint64_t work_cap;       /* 0: none */
    uint64_t processed;
    uint64_t dropped;
    double busy_frac;        /* share of the last minute spent computing (approximate) */
} worker_stats;

/* Creates the pool and its async handle on loop. Returns NULL with err set on failure. */
worker_pool *worker_pool_create(uv_loop_t *loop, worker_done_fn done, void *ctx, char *err,
                                size_t errlen);

/* Adds a worker and starts its thread. compute NULL means the CPU backend. */
worker *worker_pool_add(worker_pool *p, const char *name, uint32_t capacity,
                        worker_compute_fn compute, void *wctx, char *err, size_t errlen);

/* Runs fn(arg) on w's thread before its next job (device set-up, closing IPC handles: work that
 * must happen on the thread that owns the device context). Not counted against the capacity and
 * not delivered to the done callback. Returns 0, or -1 when the pool is stopping (fn not run). */
int worker_run_on(worker *w, void (*fn)(void *arg), void *arg);

/* Lets w's compute function leave jobs pending (job->pending = 1): the next queued job is computed
 * at once, and finish() completes the pending ones, in order, when the queue runs empty, before a
 * task runs, or when many are pending. Set before the first job is submitted. */
void worker_set_finish(worker *w, worker_finish_fn finish);

/* Stats of one worker (the pool index of w is not needed). */
void worker_stats_of(worker *w, worker_stats *out);

/* Bounds w's queue by work too: a job is refused when the queue is not empty and the work queued
 * (jobs' `work`, queued and running) plus its own would pass cap (0: no bound by work; the count,
 * capacity, always holds). Loop thread, before the first submit. */
void worker_set_work_cap(worker *w, uint64_t cap);

/* Queues a job. Returns 0, or -1 when the worker's queue is full (capacity jobs, or its work cap:
 * the job is untouched; the worker's drop counter goes up) or the pool is stopping. */
int worker_submit(worker *w, worker_job *job);

/* Jobs queued or running in every worker of the pool. */
uint32_t worker_pool_busy(const worker_pool *p);

int worker_pool_count(const worker_pool *p);
void worker_pool_stats(worker_pool *p, int i, worker_stats *out);

/* Stops the threads: jobs still queued are not computed (delivered failed, "shutting down"), each
 * thread finishes the job it is computing; a thread still computing after 5 s is left behind
 * (logged; worker_ctx_abandoned() says so; its worker, its job and the pool stay allocated until the
 * process exits) so that shutdown never hangs on one long job. Then delivers every finished job
 * to the done callback and closes the async handle; the pool is freed in its close callback. Call
 * once, from the loop thread, when no more jobs will be submitted (normally once the queues have
 * drained). */
void worker_pool_close(worker_pool *p);

/* 1 when worker_pool_close() left behind, still computing, the worker whose compute context is
 * wctx: that context (e.g. a GPU worker's) must not be freed. */
int worker_ctx_abandoned(const void *wctx);

/* 1 when any worker was left behind: its thread may still run until the process exits. */
int worker_any_abandoned(void);

#endif /* ATTNSTAT_WORKER_H */
