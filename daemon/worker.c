/* worker.c — compute threads with bounded queues (see worker.h). Stage: worker; calls the CPU
 * statistics (kernels/), util and log, and the done callback it was given.
 *
 * Each worker: a mutex-protected FIFO of at most `capacity` jobs (counting the running one), a
 * thread that pops, computes, and pushes the job onto the pool's done list, then wakes the loop
 * with uv_async_send (which coalesces: one callback may see many jobs). The loop's async callback
 * takes the whole done list under the lock and calls the done callback for each job outside it.
 *
 * A client may truncate a shared-memory segment it registered while a worker reads it; the read
 * then raises SIGBUS. The worker arms a per-thread jump buffer around the compute call, and the
 * SIGBUS handler jumps back to it, failing that one job; a SIGBUS anywhere else keeps its default
 * action. Before computing, each guarded fd is also checked with fstat so the usual case (a segment
 * already shrunk) never faults at all. */
#include "worker.h"

#include <errno.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "log.h"
#include "util.h"

#define BUSY_BUCKETS 6
#define WORKER_CLOSE_WAIT_MS 5000 /* worker_pool_close waits this long for a running job */
#define BUSY_BUCKET_NS 10000000000ull /* 10 s */
#define WORKER_PIPELINE 32 /* jobs left pending at most before they are finished */

typedef struct worker_task {
    struct worker_task *next;
    void (*fn)(void *arg);
    void *arg;
} worker_task;

struct worker {
    worker_pool *pool;
    char name[64];
    uint32_t capacity;
    worker_compute_fn compute;
    worker_finish_fn finish; /* NULL: no job is left pending */
    void *wctx;
    stats_cpu_fast_workspace *ws; /* the CPU worker's: grow-only, used by its thread only */
    pthread_t thread;
    int started;
    /* under pool->lock */
    worker_job *running;     /* the job being computed, NULL between jobs */
    uint64_t running_since_ns;
    int exited;              /* worker_main returned */
    int left_behind;         /* worker_pool_close gave up waiting for it */
    worker_job *head, *tail;
    worker_task *task_head, *task_tail;
    uint32_t depth;          /* queued + running */
    uint64_t queued_work;    /* their work (multiply-adds) */
    uint64_t work_cap;       /* 0: none */
    int stop;
    pthread_cond_t cond;
    uint64_t processed, dropped;
    uint64_t batches, batched; /* pipelined: finish_pending runs, and the jobs they finished */
    uint64_t busy_ns[BUSY_BUCKETS];
    uint64_t busy_epoch[BUSY_BUCKETS];
};

struct worker_pool {
    uv_loop_t *loop;
    uv_async_t async;
    worker_done_fn done;
    void *ctx;
    pthread_mutex_t lock;
    worker_job *done_head, *done_tail; /* under lock */
    worker *workers[64];     /* the CPU workers (DEVICES_MAX_CPU) and the GPUs' (GPU_MAX_LOCAL) */
    int nworkers;
    int closing;             /* no more jobs: queued ones are handed back uncomputed */
    int abandoned;           /* a stuck worker was left behind: no thread touches the loop */
    pthread_cond_t exited_cond; /* signalled when a worker thread exits */
};

/* Workers left computing at shutdown (see worker_pool_close): kept here so that their memory
 * (and the job they read) stays valid and reachable until the process exits. */
static worker *worker_left_behind[16];

static __thread sigjmp_buf *worker_guard_jmp;

static void worker_sigbus(int sig, siginfo_t *info, void *uctx)
{
    (void)info;
    (void)uctx;
    if (worker_guard_jmp)
        siglongjmp(*worker_guard_jmp, 1);
    signal(sig, SIG_DFL);
    raise(sig);
}

/* Row states past this many (32 bytes each) are not kept between jobs: the workspace is dropped
 * after such a job, so one large push does not pin its memory for the daemon's lifetime. */
#define WORKER_WS_KEEP_ROWS (1 << 20)

/* The CPU worker computes with the production backend (stats_cpu_fast_ws: float32 vector loops,
 * tested against the reference) in a workspace it owns: nothing is allocated per job in the steady
 * state, and a job abandoned by the SIGBUS guard (siglongjmp out of the kernel) leaks nothing. */
static stats_status cpu_compute(void *wctx, worker_job *job)
{
    worker *w = wctx;
    if (!w->ws && !(w->ws = stats_cpu_fast_workspace_new())) {
        snprintf(job->err.msg, sizeof job->err.msg, "out of memory for the CPU workspace");
        return STATS_ENOMEM;
    }
    stats_status st = stats_cpu_fast_ws(&job->prob, w->ws, job->heads, NULL, NULL, &job->err);
    const stats_problem *p = &job->prob;
    int64_t group = p->heads_kv > 0 ? p->heads_q / p->heads_kv : 1;
    if (group * (int64_t)stats_sampled_count(p, p->len_q) > WORKER_WS_KEEP_ROWS) {
        stats_cpu_fast_workspace_free(w->ws);
        w->ws = NULL;
    }
    return st;
}

static int guards_ok(worker_job *job)
{
    for (int i = 0; i < job->nguards; i++) {
        struct stat sb;
        if (fstat(job->guard_fd[i], &sb) != 0) {
            snprintf(job->err.msg, sizeof job->err.msg, "fstat of a registered buffer failed: %s",
                     strerror(errno));
            return 0;
        }
        if ((uint64_t)sb.st_size < job->guard_bytes[i]) {
            snprintf(job->err.msg, sizeof job->err.msg,
                     "a registered shared-memory segment shrank to %lld bytes; this push needs %llu "
                     "(do not truncate a registered segment)",
                     (long long)sb.st_size, (unsigned long long)job->guard_bytes[i]);
            return 0;
        }
    }
    return 1;
}

void worker_set_finish(worker *w, worker_finish_fn finish)
{
    pthread_mutex_lock(&w->pool->lock);
    w->finish = finish;
    pthread_mutex_unlock(&w->pool->lock);
}

static void run_job(worker *w, worker_job *job)
{
    job->started_ns = util_mono_ns();
    job->err.msg[0] = '\0';
    if (job->precomputed) {
        job->status = STATS_OK;
    } else if (!guards_ok(job)) {
        job->status = STATS_EINVAL;
    } else {
        /* The signal mask is not saved (no sigprocmask call per job): the SIGBUS handler runs with
         * SA_NODEFER and an empty sa_mask, so jumping out of it leaves the mask as it was. */
        sigjmp_buf jb;
        if (sigsetjmp(jb, 0) == 0) {
            worker_guard_jmp = &jb;
            job->status = w->compute(w->wctx, job);
            worker_guard_jmp = NULL;
        } else {
            worker_guard_jmp = NULL;
            job->status = STATS_EINVAL;
            job->pending = 0;
            snprintf(job->err.msg, sizeof job->err.msg,
                     "reading a registered shared-memory segment faulted (SIGBUS): the segment was "
                     "truncated while in use");
        }
    }
    job->done_ns = util_mono_ns();
}

/* Under the pool's lock: a finished job (computed, failed or handed back uncomputed) goes to the
 * loop thread. */
static void hand_back(worker *w, worker_job *job)
{
    worker_pool *p = w->pool;
    uint64_t epoch = job->done_ns / BUSY_BUCKET_NS;
    int b = (int)(epoch % BUSY_BUCKETS);
    if (w->busy_epoch[b] != epoch) {
        w->busy_epoch[b] = epoch;
        w->busy_ns[b] = 0;
    }
    w->busy_ns[b] += job->done_ns - job->started_ns;
    w->processed++;
    w->depth--;
    w->queued_work -= job->work;
    if (p->done_tail)
        p->done_tail->next = job;
    else
        p->done_head = job;
    p->done_tail = job;
    /* Thread-safe; the only uv call made off the loop thread. Under the lock, so that it never
     * races with the pool closing the handle after giving up on this thread. */
    uv_async_send(&p->async);
}

/* Jobs the compute function left pending, in submission order (this thread's own list). */
typedef struct {
    worker_job *head, *tail;
    int n;
} pending_list;

/* Called with the lock held; returns with it held (it is dropped while each job finishes). */
static void finish_pending(worker *w, pending_list *pl)
{
    worker_pool *p = w->pool;
    w->batches++;
    w->batched += (uint64_t)pl->n;
    while (pl->head) {
        worker_job *job = pl->head;
        pl->head = job->next;
        if (!pl->head)
            pl->tail = NULL;
        pl->n--;
        job->next = NULL;
        w->running = job;
        pthread_mutex_unlock(&p->lock);
        job->status = w->finish(w->wctx, job);
        job->pending = 0;
        job->done_ns = util_mono_ns();
        pthread_mutex_lock(&p->lock);
        w->running = NULL;
        if (p->abandoned)
            return; /* the pool gave up on this thread: touch nothing of the loop's */
        hand_back(w, job);
    }
}

static void *worker_main(void *arg)
{
    worker *w = arg;
    worker_pool *p = w->pool;
    sigset_t set;
    sigfillset(&set);
    sigdelset(&set, SIGBUS);
    sigdelset(&set, SIGSEGV);
    sigdelset(&set, SIGFPE);
    sigdelset(&set, SIGILL);
    pthread_sigmask(SIG_BLOCK, &set, NULL);

    /* Every time this thread (re)takes the lock it first checks `abandoned`: once the pool gave up
     * on a thread (stuck in a job or in a task such as a CUDA context's start or stop), that thread
     * leaves at its next look, running no more tasks, handing back no job and never calling
     * uv_async_send (the handle is closed, its loop may be gone). `abandoned` is set under the lock
     * before the handle is closed, and uv_async_send is only called under the lock after this
     * check, so the two cannot race.
     *
     * Pipelining (worker_set_finish): a job the compute function leaves pending is kept here, and
     * the next queued job is computed right away; the pending ones are finished, in order, when
     * the queue is empty, before a task (a task may unmap what they read), at WORKER_PIPELINE jobs
     * and before the thread leaves. */
    pending_list pend = {NULL, NULL, 0};
    pthread_mutex_lock(&p->lock);
    for (;;) {
        if (p->abandoned)
            break; /* touch nothing of the loop's */
        if (pend.n && (!w->head || w->task_head || w->stop || pend.n >= WORKER_PIPELINE)) {
            finish_pending(w, &pend);
            continue;
        }
        while (!w->head && !w->task_head && !w->stop && !p->abandoned)
            pthread_cond_wait(&w->cond, &p->lock);
        if (p->abandoned)
            break;
        if (w->task_head) {
            worker_task *t = w->task_head;
            w->task_head = t->next;
            if (!w->task_head)
                w->task_tail = NULL;
            pthread_mutex_unlock(&p->lock);
            t->fn(t->arg);
            free(t);
            pthread_mutex_lock(&p->lock);
            continue;
        }
        if (!w->head)
            break; /* stop requested and the queue is empty (nothing pending: finished above) */
        worker_job *job = w->head;
        w->head = job->next;
        if (!w->head)
            w->tail = NULL;
        job->next = NULL;
        if (p->closing) {
            /* Shutting down past its grace: queued jobs go back uncomputed. */
            job->status = STATS_EINVAL;
            job->fail_code = 0;
            snprintf(job->err.msg, sizeof job->err.msg,
                     "the daemon is shutting down: not computed");
            job->started_ns = job->done_ns = util_mono_ns();
        } else {
            w->running = job;
            w->running_since_ns = util_mono_ns();
            pthread_mutex_unlock(&p->lock);

            job->pending = 0;
            run_job(w, job);

            pthread_mutex_lock(&p->lock);
            w->running = NULL;
            if (p->abandoned)
                break; /* the pool gave up on this thread: touch nothing of the loop's */
            if (job->pending && w->finish) {
                if (pend.tail)
                    pend.tail->next = job;
                else
                    pend.head = job;
                pend.tail = job;
                pend.n++;
                continue;
            }
            job->pending = 0;
        }
        hand_back(w, job);
    }
    if (w->batches)
        LOG_INFO("worker", "%s: %llu jobs, %llu of them pipelined in %llu batches (%.1f a batch)",
                 w->name, (unsigned long long)w->processed, (unsigned long long)w->batched,
                 (unsigned long long)w->batches, (double)w->batched / (double)w->batches);
    w->exited = 1;
    pthread_cond_broadcast(&p->exited_cond);
    pthread_mutex_unlock(&p->lock);
    return NULL;
}

static void pool_deliver(worker_pool *p)
{
    pthread_mutex_lock(&p->lock);
    worker_job *list = p->done_head;
    p->done_head = p->done_tail = NULL;
    pthread_mutex_unlock(&p->lock);
    while (list) {
        worker_job *job = list;
        list = job->next;
        job->next = NULL;
        p->done(p->ctx, job);
    }
}

static void pool_async_cb(uv_async_t *h)
{
    pool_deliver(h->data);
}

worker_pool *worker_pool_create(uv_loop_t *loop, worker_done_fn done, void *ctx, char *err,
                                size_t errlen)
{
    worker_pool *p = calloc(1, sizeof *p);
    if (!p) {
        snprintf(err, errlen, "out of memory creating the worker pool");
        return NULL;
    }
    p->loop = loop;
    p->done = done;
    p->ctx = ctx;
    int rc = pthread_mutex_init(&p->lock, NULL);
    if (rc != 0) {
        snprintf(err, errlen, "pthread_mutex_init: %s", strerror(rc));
        free(p);
        return NULL;
    }
    rc = pthread_cond_init(&p->exited_cond, NULL);
    if (rc != 0) {
        snprintf(err, errlen, "pthread_cond_init: %s", strerror(rc));
        pthread_mutex_destroy(&p->lock);
        free(p);
        return NULL;
    }
    rc = uv_async_init(loop, &p->async, pool_async_cb);
    if (rc != 0) {
        snprintf(err, errlen, "uv_async_init: %s", uv_strerror(rc));
        pthread_cond_destroy(&p->exited_cond);
        pthread_mutex_destroy(&p->lock);
        free(p);
        return NULL;
    }
    p->async.data = p;

    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = worker_sigbus;
    sa.sa_flags = SA_SIGINFO | SA_NODEFER;
    sigemptyset(&sa.sa_mask);
    if (sigaction(SIGBUS, &sa, NULL) != 0)
        LOG_WARN("worker", "cannot install the SIGBUS guard (%s): a client truncating a registered "
                 "segment mid-push could crash the daemon", strerror(errno));
    return p;
}

worker *worker_pool_add(worker_pool *p, const char *name, uint32_t capacity,
                        worker_compute_fn compute, void *wctx, char *err, size_t errlen)
{
    if (p->nworkers == (int)(sizeof p->workers / sizeof p->workers[0])) {
        snprintf(err, errlen, "too many workers (at most %zu)", sizeof p->workers / sizeof p->workers[0]);
        return NULL;
    }
    worker *w = calloc(1, sizeof *w);
    if (!w) {
        snprintf(err, errlen, "out of memory creating worker %s", name);
        return NULL;
    }
    w->pool = p;
    snprintf(w->name, sizeof w->name, "%s", name);
    w->capacity = capacity ? capacity : 1;
    w->compute = compute ? compute : cpu_compute;
    w->wctx = compute ? wctx : w;
    int rc = pthread_cond_init(&w->cond, NULL);
    if (rc != 0) {
        snprintf(err, errlen, "pthread_cond_init: %s", strerror(rc));
        free(w);
        return NULL;
    }
    rc = pthread_create(&w->thread, NULL, worker_main, w);
    if (rc != 0) {
        snprintf(err, errlen, "cannot start worker thread %s: %s", name, strerror(rc));
        pthread_cond_destroy(&w->cond);
        free(w);
        return NULL;
    }
    w->started = 1;
    p->workers[p->nworkers++] = w;
    return w;
}

int worker_run_on(worker *w, void (*fn)(void *arg), void *arg)
{
    worker_pool *p = w->pool;
    worker_task *t = malloc(sizeof *t);
    if (!t)
        return -1;
    t->next = NULL;
    t->fn = fn;
    t->arg = arg;
    pthread_mutex_lock(&p->lock);
    if (w->stop) {
        pthread_mutex_unlock(&p->lock);
        free(t);
        return -1;
    }
    if (w->task_tail)
        w->task_tail->next = t;
    else
        w->task_head = t;
    w->task_tail = t;
    pthread_cond_signal(&w->cond);
    pthread_mutex_unlock(&p->lock);
    return 0;
}

void worker_set_work_cap(worker *w, uint64_t cap)
{
    pthread_mutex_lock(&w->pool->lock);
    w->work_cap = cap;
    pthread_mutex_unlock(&w->pool->lock);
}

int worker_submit(worker *w, worker_job *job)
{
    worker_pool *p = w->pool;
    pthread_mutex_lock(&p->lock);
    if (p->closing || w->depth >= w->capacity ||
        (w->work_cap && w->depth > 0 && w->queued_work + job->work > w->work_cap)) {
        w->dropped++;
        pthread_mutex_unlock(&p->lock);
        return -1;
    }
    job->next = NULL;
    job->worker = w;
    job->queued_ns = util_mono_ns();
    if (w->tail)
        w->tail->next = job;
    else
        w->head = job;
    w->tail = job;
    w->depth++;
    w->queued_work += job->work;
    pthread_cond_signal(&w->cond);
    pthread_mutex_unlock(&p->lock);
    return 0;
}

uint32_t worker_pool_busy(const worker_pool *p)
{
    worker_pool *mp = (worker_pool *)p;
    uint32_t n = 0;
    pthread_mutex_lock(&mp->lock);
    for (int i = 0; i < p->nworkers; i++)
        n += p->workers[i]->depth;
    if (p->done_head)
        n++; /* finished but not yet delivered */
    pthread_mutex_unlock(&mp->lock);
    return n;
}

int worker_pool_count(const worker_pool *p)
{
    return p->nworkers;
}

void worker_pool_stats(worker_pool *p, int i, worker_stats *out)
{
    memset(out, 0, sizeof *out);
    if (i < 0 || i >= p->nworkers)
        return;
    worker *w = p->workers[i];
    uint64_t now = util_mono_ns(), epoch = now / BUSY_BUCKET_NS, busy = 0;
    pthread_mutex_lock(&p->lock);
    out->name = w->name;
    out->queue_depth = w->depth;
    out->capacity = w->capacity;
    out->queued_work = w->queued_work;
    out->work_cap = w->work_cap;
    out->processed = w->processed;
    out->dropped = w->dropped;
    for (int b = 0; b < BUSY_BUCKETS; b++)
        if (w->busy_epoch[b] + BUSY_BUCKETS > epoch)
            busy += w->busy_ns[b];
    pthread_mutex_unlock(&p->lock);
    out->busy_frac = (double)busy / (double)(BUSY_BUCKETS * BUSY_BUCKET_NS);
    if (out->busy_frac > 1.0)
        out->busy_frac = 1.0;
}

void worker_stats_of(worker *w, worker_stats *out)
{
    worker_pool *p = w->pool;
    for (int i = 0; i < p->nworkers; i++)
        if (p->workers[i] == w) {
            worker_pool_stats(p, i, out);
            return;
        }
    memset(out, 0, sizeof *out);
}

static void pool_closed(uv_handle_t *h)
{
    worker_pool *p = h->data;
    if (p->abandoned)
        return; /* a thread left behind still takes p->lock: p lives until the process exits */
    pthread_cond_destroy(&p->exited_cond);
    pthread_mutex_destroy(&p->lock);
    free(p);
}

int worker_any_abandoned(void)
{
    for (size_t i = 0; i < sizeof worker_left_behind / sizeof worker_left_behind[0]; i++)
        if (worker_left_behind[i])
            return 1;
    return 0;
}

int worker_ctx_abandoned(const void *wctx)
{
    for (size_t i = 0; i < sizeof worker_left_behind / sizeof worker_left_behind[0]; i++)
        if (worker_left_behind[i] && worker_left_behind[i]->wctx == wctx)
            return 1;
    return 0;
}

void worker_pool_close(worker_pool *p)
{
    /* Jobs still queued are handed back uncomputed (closing), each thread exits after its running
     * job, and the loop thread waits for that at most WORKER_CLOSE_WAIT_MS: a job that runs
     * longer (the CPU kernel cannot be interrupted) is left behind, logged, with its thread, so
     * that shutdown is bounded. Such a thread only finishes its job, under the pool's lock sees
     * `abandoned`, and exits without touching anything else; the pool, the worker and the job stay
     * allocated (reachable from worker_left_behind) until the process exits. */
    struct timespec deadline;
    clock_gettime(CLOCK_REALTIME, &deadline);
    deadline.tv_sec += WORKER_CLOSE_WAIT_MS / 1000;
    deadline.tv_nsec += (long)(WORKER_CLOSE_WAIT_MS % 1000) * 1000000L;
    if (deadline.tv_nsec >= 1000000000L) {
        deadline.tv_sec++;
        deadline.tv_nsec -= 1000000000L;
    }
    pthread_mutex_lock(&p->lock);
    p->closing = 1;
    for (int i = 0; i < p->nworkers; i++) {
        p->workers[i]->stop = 1;
        pthread_cond_signal(&p->workers[i]->cond);
    }
    for (;;) {
        int running = 0;
        for (int i = 0; i < p->nworkers; i++)
            running += p->workers[i]->started && !p->workers[i]->exited;
        if (running == 0)
            break;
        int rc = pthread_cond_timedwait(&p->exited_cond, &p->lock, &deadline);
        if (rc == ETIMEDOUT)
            break;
    }
    uint64_t now = util_mono_ns();
    for (int i = 0; i < p->nworkers; i++) {
        worker *w = p->workers[i];
        if (!w->started || w->exited)
            continue;
        p->abandoned = 1;
        w->left_behind = 1;
        LOG_ERROR("worker", "worker %s is still computing a job after %d ms (running for %.1f s): "
                  "leaving it behind so that the daemon can exit", w->name, WORKER_CLOSE_WAIT_MS,
                  w->running ? (double)(now - w->running_since_ns) / 1e9 : 0.0);
        for (size_t j = 0; j < sizeof worker_left_behind / sizeof worker_left_behind[0]; j++)
            if (!worker_left_behind[j]) {
                worker_left_behind[j] = w;
                break;
            }
    }
    pthread_mutex_unlock(&p->lock);
    for (int i = 0; i < p->nworkers; i++) {
        worker *w = p->workers[i];
        if (w->started && !w->left_behind) {
            int rc = pthread_join(w->thread, NULL);
            if (rc != 0)
                LOG_ERROR("worker", "joining worker %s: %s", w->name, strerror(rc));
        }
    }
    /* Deliver while the workers are still allocated: the done callback may post to a worker
     * (a GPU buffer's last reference schedules its close with worker_run_on, refused now). */
    pool_deliver(p);
    for (int i = 0; i < p->nworkers; i++) {
        worker *w = p->workers[i];
        if (w->left_behind)
            continue; /* neither joined nor freed: its thread may still run */
        pthread_cond_destroy(&w->cond);
        stats_cpu_fast_workspace_free(w->ws);
        free(w);
        p->workers[i] = NULL;
    }
    p->nworkers = 0;
    uv_close((uv_handle_t *)&p->async, pool_closed);
}
