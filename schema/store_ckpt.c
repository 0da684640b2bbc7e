/* store_ckpt.c — WAL checkpoints on a thread of the handle's own (store_options.checkpoint_pages),
 * so that the thread committing never copies the WAL back into the database itself.
 * Private to schema/ (store_internal.h declares it); store_core.c starts it at open and stops it
 * at close. Calls SQLite and pthreads.
 *
 * Why: SQLite checkpoints on the connection that commits, once the WAL passes 1000 pages. That
 * commit then reads a thousand frames back, writes them into the database file and (synchronous
 * NORMAL or FULL) fsyncs it: milliseconds during which no push is stored or acknowledged (the
 * 17-19 ms Ack p99 of a client with 32 pushes in flight in bench_ingest). Here the writer's
 * connection has its automatic checkpoint off and a WAL hook instead: past `pages` it wakes this
 * thread, which runs a PASSIVE checkpoint on a second connection of its own, concurrently with
 * the next commits; then again each time pages / 2 more frames are in the WAL (not after every
 * commit: each checkpoint fsyncs the database file).
 *
 * The WAL stays bounded: a passive checkpoint copies the frames committed when it began; the
 * writer starts the WAL over at its next transaction once every frame is copied, which a steady
 * stream of commits during the thread's checkpoints can put off. So past 4 x pages the hook waits
 * for the thread's checkpoint in progress (if any) to end and checkpoints on the writer's
 * connection itself, between two of its transactions, as SQLite would have: nothing is appended
 * meanwhile, every frame is copied (unless a reader still holds an old snapshot, as with SQLite's
 * own) and the next transaction starts the WAL over (counted as `inline_runs`).
 */
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "store_internal.h"

#define CKPT_HARD_FACTOR 4

struct store_ckpt {
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    sqlite3 *db;             /* the thread's own connection */
    int64_t pages, hard;     /* wake the thread at; checkpoint inline at */
    int64_t next_at, last;   /* the writer's: frames at which to wake the thread next, and at the
                              * last commit (fewer now: the WAL started over) */
    int want, stop;
    int running;             /* the thread is in a checkpoint */
    int writer_in;           /* the writer is in one: the thread does not start another */
    pthread_cond_t idle_cv;  /* running went to 0 */
    store_ckpt_counts counts;
};

/* Writer's thread, after each commit: nframes are in the WAL. */
static int wal_hook(void *arg, sqlite3 *db, const char *name, int nframes)
{
    struct store_ckpt *c = arg;
    if (nframes < c->last)
        c->next_at = c->pages;
    c->last = nframes;
    if (nframes >= c->hard) {
        c->next_at = c->pages;
        pthread_mutex_lock(&c->mu);
        c->writer_in = 1;
        while (c->running)
            pthread_cond_wait(&c->idle_cv, &c->mu);
        pthread_mutex_unlock(&c->mu);
        int rc = sqlite3_wal_checkpoint_v2(db, name, SQLITE_CHECKPOINT_PASSIVE, NULL, NULL);
        pthread_mutex_lock(&c->mu);
        c->writer_in = 0;
        c->counts.inline_runs++;
        if (rc != SQLITE_OK && rc != SQLITE_BUSY) {
            c->counts.errors++;
            snprintf(c->counts.last_error, sizeof c->counts.last_error,
                     "checkpoint on the writer: %s", sqlite3_errmsg(db));
        }
        pthread_mutex_unlock(&c->mu);
    } else if (nframes >= c->next_at) {
        c->next_at = nframes + (c->pages + 1) / 2;
        pthread_mutex_lock(&c->mu);
        if (!c->want) {
            c->want = 1;
            pthread_cond_signal(&c->cv);
        }
        pthread_mutex_unlock(&c->mu);
    }
    return SQLITE_OK;
}

static void *ckpt_main(void *arg)
{
    struct store_ckpt *c = arg;
    for (;;) {
        pthread_mutex_lock(&c->mu);
        while (!c->want && !c->stop)
            pthread_cond_wait(&c->cv, &c->mu);
        if (c->stop) {
            pthread_mutex_unlock(&c->mu);
            break;
        }
        c->want = 0;
        if (c->writer_in) { /* the writer checkpoints now; a later commit wakes this thread */
            pthread_mutex_unlock(&c->mu);
            continue;
        }
        c->running = 1;
        pthread_mutex_unlock(&c->mu);
        int nlog = 0, ncopied = 0;
        int rc = sqlite3_wal_checkpoint_v2(c->db, "main", SQLITE_CHECKPOINT_PASSIVE, &nlog,
                                           &ncopied);
        pthread_mutex_lock(&c->mu);
        c->running = 0;
        pthread_cond_broadcast(&c->idle_cv);
        c->counts.runs++;
        if (rc == SQLITE_OK && ncopied > 0)
            c->counts.frames += (uint64_t)ncopied;
        if (rc != SQLITE_OK && rc != SQLITE_BUSY) {
            c->counts.errors++;
            snprintf(c->counts.last_error, sizeof c->counts.last_error, "checkpoint: %s",
                     sqlite3_errmsg(c->db));
        }
        pthread_mutex_unlock(&c->mu);
    }
    return NULL;
}

static void ckpt_free(struct store_ckpt *c)
{
    sqlite3_close_v2(c->db);
    pthread_mutex_destroy(&c->mu);
    pthread_cond_destroy(&c->cv);
    pthread_cond_destroy(&c->idle_cv);
    sqlite3_free(c);
}

store_status store_ckpt_start(store *st, int64_t pages, const char *sync_sql, store_error *err)
{
    struct store_ckpt *c = sqlite3_malloc64(sizeof *c);
    if (!c) {
        err->code = SQLITE_NOMEM;
        snprintf(err->msg, sizeof err->msg, "checkpoint thread of '%s': out of memory", st->path);
        return STORE_ERROR;
    }
    memset(c, 0, sizeof *c);
    c->pages = pages;
    c->hard = pages * CKPT_HARD_FACTOR;
    c->next_at = pages;
    pthread_mutex_init(&c->mu, NULL);
    pthread_cond_init(&c->cv, NULL);
    pthread_cond_init(&c->idle_cv, NULL);
    int rc = sqlite3_open_v2(st->path, &c->db,
                             SQLITE_OPEN_READWRITE | SQLITE_OPEN_NOMUTEX | SQLITE_OPEN_EXRESCODE,
                             NULL);
    if (rc == SQLITE_OK)
        rc = sqlite3_busy_timeout(c->db, 5000);
    /* the checkpoint fsyncs the database file as this connection's synchronous says */
    if (rc == SQLITE_OK)
        rc = sqlite3_exec(c->db, sync_sql, NULL, NULL, NULL);
    if (rc != SQLITE_OK) {
        err->code = rc;
        snprintf(err->msg, sizeof err->msg, "checkpoint thread: opening a second connection to "
                 "'%s': %s", st->path, c->db ? sqlite3_errmsg(c->db) : sqlite3_errstr(rc));
        ckpt_free(c);
        return STORE_ERROR;
    }
    int prc = pthread_create(&c->thread, NULL, ckpt_main, c);
    if (prc != 0) {
        err->code = 0;
        snprintf(err->msg, sizeof err->msg, "checkpoint thread of '%s': cannot start it: %s",
                 st->path, strerror(prc));
        ckpt_free(c);
        return STORE_ERROR;
    }
    /* only now: no frame is left to a thread that never started */
    sqlite3_wal_autocheckpoint(st->db, 0);
    sqlite3_wal_hook(st->db, wal_hook, c);
    st->ckpt = c;
    return STORE_OK;
}

void store_ckpt_stop(store *st)
{
    struct store_ckpt *c = st->ckpt;
    if (!c)
        return;
    sqlite3_wal_hook(st->db, NULL, NULL);
    pthread_mutex_lock(&c->mu);
    c->stop = 1;
    pthread_cond_signal(&c->cv);
    pthread_mutex_unlock(&c->mu);
    pthread_join(c->thread, NULL);
    ckpt_free(c);
    st->ckpt = NULL;
}

int store_checkpoint_counts(store *st, store_ckpt_counts *out)
{
    memset(out, 0, sizeof *out);
    struct store_ckpt *c = st ? st->ckpt : NULL;
    if (!c)
        return 0;
    pthread_mutex_lock(&c->mu);
    *out = c->counts;
    pthread_mutex_unlock(&c->mu);
    return 1;
}
