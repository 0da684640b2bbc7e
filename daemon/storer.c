/* storer.c — the store's own thread (see storer.h). Stage: store thread; calls the store through
 * storer_db, util and log.
 *
 * How it works
 * - Two lists under one mutex: `queue` (submitted, not taken) and `finished` (done on the thread,
 *   not yet handed back). The thread takes the whole queue at once, works through it, and, when the
 *   queue is empty after that (or the transaction is full or old), commits: group commit, so that
 *   a lone op is committed at once and a stream of them shares transactions.
 * - Ops of the open transaction wait in `group` (thread-local) until its commit or rollback; an
 *   op that failed alone waits there too, so that completions keep the submission order.
 * - The idle work runs when the queue is empty and no transaction is open; under a stream that
 *   never lets the queue drain it still runs between two transactions once idle_ms has passed
 *   since its last turn (it is never starved).
 * - The condition variable wakes the thread for a submit or the stop; a timed wait brings it back
 *   for the idle work. One uv_async wakes the loop for the completions.
 * - Counts (commits, rollbacks, busy time) are the thread's, under the mutex, taken by the loop.
 */
#include "storer.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "log.h"
#include "store_write.h"
#include "util.h"

#define STORER_MAX_OPS_DEFAULT 4096

struct storer {
    uv_loop_t *loop;
    uv_async_t async;
    storer_db db;
    storer_opts o;
    void (*drained)(void *data);
    void *data;
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    storer_op *q_head, *q_tail;          /* submitted */
    storer_op *f_head, *f_tail;          /* finished, for the loop */
    storer_counts counts;                /* since the last storer_take */
    int stop;                            /* the thread finishes the queue and exits */
    int closed;                          /* joined: submits run inline */
    uint32_t pending;                    /* loop thread: submitted - done */
};

static void append(storer_op **head, storer_op **tail, storer_op *op)
{
    op->next = NULL;
    if (*tail)
        (*tail)->next = op;
    else
        *head = op;
    *tail = op;
}

/* ---- the store thread ----------------------------------------------------------------------- */

typedef struct {
    storer_op *head, *tail;              /* ops of the open transaction (and ops failed alone) */
    uint32_t n;                          /* of them, written into it */
    int open;                            /* a transaction is open */
    uint64_t opened_ns;
} group;

/* The group's ops go to `finished`, the ones still OK with status st and err. */
static void finish_group(storer *s, group *g, store_status st, const store_error *err)
{
    for (storer_op *op = g->head; op; op = op->next)
        if (op->status == STORE_OK && st != STORE_OK) {
            op->status = st;
            op->err = *err;
        }
    pthread_mutex_lock(&s->mu);
    if (g->head) {
        if (s->f_tail)
            s->f_tail->next = g->head;
        else
            s->f_head = g->head;
        s->f_tail = g->tail;
    }
    if (g->open) {
        if (st == STORE_OK) {
            s->counts.commits++;
        } else {
            s->counts.rollbacks++;
            snprintf(s->counts.last_error, sizeof s->counts.last_error, "%s", err->msg);
        }
    }
    pthread_mutex_unlock(&s->mu);
    memset(g, 0, sizeof *g);
    uv_async_send(&s->async);
}

static void commit_group(storer *s, group *g)
{
    store_error err = {0, ""};
    store_status st = STORE_OK;
    if (g->open && s->db.commit(s->db.db, &err) != STORE_OK) {
        char msg[sizeof err.msg];
        snprintf(msg, sizeof msg, "commit failed: %.*s", (int)sizeof err.msg - 20, err.msg);
        snprintf(err.msg, sizeof err.msg, "%s", msg);
        s->db.rollback(s->db.db);
        st = STORE_ERROR;
    }
    finish_group(s, g, st, &err);
}

/* One op of the taken queue. */
static void work(storer *s, group *g, storer_op *op)
{
    op->status = STORE_OK;
    op->err.code = 0;
    op->err.msg[0] = '\0';
    if (op->mode == STORER_ALONE) {
        if (g->head)
            commit_group(s, g);
        op->status = op->run(s->db.db, op, &op->err);
        g->head = g->tail = op;
        op->next = NULL;
        finish_group(s, g, op->status, &op->err);
        return;
    }
    if (!g->open) {
        g->open = 1;
        g->opened_ns = util_mono_ns();
    }
    store_status st = op->run(s->db.db, op, &op->err);
    append(&g->head, &g->tail, op);
    if (st == STORE_OK) {
        g->n++;
    } else if (st == STORE_EINVAL || st == STORE_NOTFOUND) {
        op->status = st; /* nothing written: the transaction goes on */
    } else {
        store_error err = op->err;
        op->status = st;
        s->db.rollback(s->db.db);
        finish_group(s, g, STORE_ERROR, &err);
        return;
    }
    uint64_t age_ns = util_mono_ns() - g->opened_ns;
    if (g->n >= s->o.max_ops || (s->o.commit_ms && age_ns >= s->o.commit_ms * 1000000ull))
        commit_group(s, g);
}

static void *thread_main(void *arg)
{
    storer *s = arg;
    group g;
    memset(&g, 0, sizeof g);
    uint64_t idle_due = util_mono_ns(), last_idle = idle_due;
    for (;;) {
        pthread_mutex_lock(&s->mu);
        for (;;) {
            if (s->q_head || s->stop || g.head)
                break; /* work, the stop, or a transaction to commit now that the queue is empty */
            uint64_t now = util_mono_ns();
            if (s->db.idle && now >= idle_due)
                break;
            if (!s->db.idle) {
                pthread_cond_wait(&s->cv, &s->mu);
                continue;
            }
            uint64_t wait_ns = idle_due - now;
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            uint64_t ns = (uint64_t)ts.tv_nsec + wait_ns;
            ts.tv_sec += (time_t)(ns / 1000000000ull);
            ts.tv_nsec = (long)(ns % 1000000000ull);
            pthread_cond_timedwait(&s->cv, &s->mu, &ts);
        }
        /* Ops keep coming and the queue never drains: the idle work still gets a turn between two
         * transactions once idle_ms has passed without one, so that a steady stream cannot starve
         * it (compaction and downsampling keep moving, a step of their budget at a time). */
        int starved = 0;
        if (s->q_head && !g.head && !s->stop && s->db.idle) {
            uint64_t now = util_mono_ns();
            starved = now - last_idle >= s->o.idle_ms * 1000000ull; /* then idle_due is past too */
        }
        storer_op *take = NULL;
        if (!starved) {
            take = s->q_head;
            s->q_head = s->q_tail = NULL;
        }
        int stop = s->stop;
        pthread_mutex_unlock(&s->mu);

        uint64_t t0 = util_mono_ns();
        if (take) {
            for (storer_op *op = take, *next; op; op = next) {
                next = op->next;
                work(s, &g, op);
            }
        } else if (g.head) {
            commit_group(s, &g); /* the queue drained */
        } else if (stop) {
            break;
        } else {
            int more = s->db.idle(s->db.idle_ctx);
            uint64_t t1 = util_mono_ns();
            idle_due = more ? t1 : t1 + s->o.idle_ms * 1000000ull;
            last_idle = t1;
            pthread_mutex_lock(&s->mu);
            s->counts.idle_ns += t1 - t0;
            pthread_mutex_unlock(&s->mu);
            continue;
        }
        uint64_t t1 = util_mono_ns();
        pthread_mutex_lock(&s->mu);
        s->counts.busy_ns += t1 - t0;
        pthread_mutex_unlock(&s->mu);
    }
    return NULL;
}

/* ---- the loop thread ------------------------------------------------------------------------ */

static void deliver(storer *s)
{
    pthread_mutex_lock(&s->mu);
    storer_op *op = s->f_head;
    s->f_head = s->f_tail = NULL;
    pthread_mutex_unlock(&s->mu);
    if (!op)
        return;
    for (storer_op *next; op; op = next) {
        next = op->next; /* done may reuse or free the op */
        op->next = NULL;
        s->pending--;
        op->done(op);
    }
    if (s->drained)
        s->drained(s->data);
}

static void on_async(uv_async_t *a)
{
    deliver(a->data);
}

static store_status sqlite_commit(void *db, store_error *err)
{
    return store_commit(db, err);
}

static void sqlite_rollback(void *db)
{
    store_rollback(db);
}

storer_db storer_db_of(store *db)
{
    storer_db d = {db, sqlite_commit, sqlite_rollback, NULL, NULL};
    return d;
}

static void free_on_close(uv_handle_t *h)
{
    storer_free(h->data);
}

storer *storer_new(uv_loop_t *loop, const storer_db *db, const storer_opts *o,
                   void (*drained)(void *data), void *data, char *err, size_t errlen)
{
    storer *s = calloc(1, sizeof *s);
    if (!s) {
        util_err(err, errlen, "out of memory");
        return NULL;
    }
    s->loop = loop;
    s->db = *db;
    s->o = *o;
    if (!s->o.max_ops)
        s->o.max_ops = STORER_MAX_OPS_DEFAULT;
    s->drained = drained;
    s->data = data;
    int rc = uv_async_init(loop, &s->async, on_async);
    if (rc != 0) {
        util_err(err, errlen, "uv_async_init: %s", uv_strerror(rc));
        free(s);
        return NULL;
    }
    s->async.data = s;
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    rc = pthread_create(&s->thread, NULL, thread_main, s);
    if (rc != 0) {
        util_err(err, errlen, "cannot start the store thread: %s", strerror(rc));
        uv_close((uv_handle_t *)&s->async, free_on_close);
        return NULL;
    }
    return s;
}

void storer_submit(storer *s, storer_op *op)
{
    s->pending++;
    if (s->closed) {
        /* The thread is gone: this thread owns the store now. */
        op->status = STORE_OK;
        op->err.code = 0;
        op->err.msg[0] = '\0';
        op->status = op->run(s->db.db, op, &op->err);
        if (op->status == STORE_OK && s->db.commit(s->db.db, &op->err) != STORE_OK) {
            s->db.rollback(s->db.db);
            op->status = STORE_ERROR;
        } else if (op->status != STORE_OK) {
            s->db.rollback(s->db.db);
        }
        s->pending--;
        op->done(op);
        if (s->drained)
            s->drained(s->data);
        return;
    }
    pthread_mutex_lock(&s->mu);
    append(&s->q_head, &s->q_tail, op);
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
}

uint32_t storer_pending(const storer *s)
{
    return s->pending;
}

void storer_take(storer *s, storer_counts *out)
{
    pthread_mutex_lock(&s->mu);
    out->commits += s->counts.commits;
    out->rollbacks += s->counts.rollbacks;
    if (s->counts.last_error[0])
        memcpy(out->last_error, s->counts.last_error, sizeof out->last_error);
    out->busy_ns += s->counts.busy_ns;
    out->idle_ns += s->counts.idle_ns;
    memset(&s->counts, 0, sizeof s->counts);
    pthread_mutex_unlock(&s->mu);
}

void storer_close(storer *s)
{
    if (!s || s->closed)
        return;
    pthread_mutex_lock(&s->mu);
    s->stop = 1;
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
    pthread_join(s->thread, NULL);
    s->closed = 1;
    deliver(s); /* may submit more: those run inline now */
    uv_close((uv_handle_t *)&s->async, NULL);
}

void storer_free(storer *s)
{
    if (!s)
        return;
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
    free(s);
}
