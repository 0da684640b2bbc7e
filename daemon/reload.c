/* reload.c — the SIGHUP reload's reading, on a thread of its own (see reload.h). */
#include "reload.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cfgfile.h"
#include "log.h"
#include "util.h"

#define RELOAD_MAX_FILES 16

typedef struct {
    pthread_mutex_t mu;
    int refs;                /* the thread's and the loop's (under mu) */
    int finished;            /* the thread has read every file (under mu) */
    int abandoned;           /* the loop let go: wake nothing (under mu) */
    reload *r;               /* whom to wake (valid while !abandoned) */
    uint64_t started_ns;
    size_t n;
    char *paths[RELOAD_MAX_FILES];
    char *texts[RELOAD_MAX_FILES];
    char err[600];           /* "" when every file was read */
} reload_job;

struct reload {
    uv_async_t async;
    reload_done_fn done;
    void *data;
    reload_job *job;         /* the read under way, or NULL */
};

static void job_unref(reload_job *j)
{
    pthread_mutex_lock(&j->mu);
    int left = --j->refs;
    pthread_mutex_unlock(&j->mu);
    if (left > 0)
        return;
    for (size_t i = 0; i < j->n; i++) {
        free(j->paths[i]);
        free(j->texts[i]);
    }
    pthread_mutex_destroy(&j->mu);
    free(j);
}

static void *read_files(void *arg)
{
    reload_job *j = arg;
    char err[sizeof j->err] = "";
    for (size_t i = 0; i < j->n && !err[0]; i++) {
        size_t len;
        if (cfgfile_read(j->paths[i], 1, &j->texts[i], &len, err, sizeof err) != 0)
            break;
    }
    pthread_mutex_lock(&j->mu);
    snprintf(j->err, sizeof j->err, "%s", err);
    j->finished = 1;
    if (!j->abandoned)
        uv_async_send(&j->r->async); /* r lives while the job is not abandoned */
    pthread_mutex_unlock(&j->mu);
    job_unref(j);
    return NULL;
}

static void on_read(uv_async_t *a)
{
    reload *r = a->data;
    reload_job *j = r->job;
    if (!j)
        return;
    pthread_mutex_lock(&j->mu);
    int finished = j->finished;
    pthread_mutex_unlock(&j->mu);
    if (!finished)
        return;
    r->job = NULL;
    r->done(r->data, (const char *const *)j->texts, j->n, j->err[0] ? j->err : NULL);
    job_unref(j);
}

reload *reload_new(uv_loop_t *loop, reload_done_fn done, void *data)
{
    reload *r = calloc(1, sizeof *r);
    if (!r) {
        LOG_ERROR("config", "out of memory for the reload's reader");
        return NULL;
    }
    int rc = uv_async_init(loop, &r->async, on_read);
    if (rc != 0) {
        LOG_ERROR("config", "uv_async_init: %s", uv_strerror(rc));
        free(r);
        return NULL;
    }
    uv_unref((uv_handle_t *)&r->async);
    r->async.data = r;
    r->done = done;
    r->data = data;
    return r;
}

int reload_start(reload *r, const char *const *paths, size_t n, char *err, size_t errlen)
{
    if (r->job)
        return util_err(err, errlen, "the reload begun %.1f s ago is still reading %s (a FIFO "
                        "with no writer, or a file system that does not answer?): this one is not "
                        "done", (double)(util_mono_ns() - r->job->started_ns) / 1e9,
                        r->job->paths[0]);
    if (n > RELOAD_MAX_FILES)
        return util_err(err, errlen, "%zu --config files: at most %d are read again", n,
                        RELOAD_MAX_FILES);
    reload_job *j = calloc(1, sizeof *j);
    if (!j)
        return util_err(err, errlen, "out of memory");
    pthread_mutex_init(&j->mu, NULL);
    j->refs = 2;
    j->r = r;
    j->started_ns = util_mono_ns();
    for (size_t i = 0; i < n; i++, j->n++)
        if (!(j->paths[i] = strdup(paths[i]))) {
            j->refs = 1;
            job_unref(j);
            return util_err(err, errlen, "out of memory");
        }
    pthread_attr_t attr;
    pthread_t t;
    int rc = pthread_attr_init(&attr);
    if (rc == 0) {
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        rc = pthread_create(&t, &attr, read_files, j);
        pthread_attr_destroy(&attr);
    }
    if (rc != 0) {
        j->refs = 1;
        job_unref(j);
        return util_err(err, errlen, "cannot start a thread to read the config: %s", strerror(rc));
    }
    r->job = j;
    return 0;
}

static void reload_closed(uv_handle_t *h)
{
    free(h->data);
}

void reload_close(reload *r)
{
    if (!r)
        return;
    reload_job *j = r->job;
    if (j) {
        pthread_mutex_lock(&j->mu);
        j->abandoned = 1;
        pthread_mutex_unlock(&j->mu);
        r->job = NULL;
        job_unref(j);
    }
    uv_close((uv_handle_t *)&r->async, reload_closed);
}
