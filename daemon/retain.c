/* retain.c — the retention step as the store thread's idle work (see retain.h). Stage: store
 * thread and loop thread (the policy and the stats, under one mutex); calls the store's retention
 * half, util and log. */
#include "retain.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "store_retain.h"
#include "util.h"

struct retain {
    store *db;
    pthread_mutex_t mu;
    store_retention policy;  /* under mu */
    int64_t budget;          /* under mu */
    retain_stats stats;      /* under mu */
    int logged_failure;      /* store thread */
};

retain *retain_new(store *db, const cfg *c)
{
    retain *r = calloc(1, sizeof *r);
    if (!r)
        return NULL;
    r->db = db;
    pthread_mutex_init(&r->mu, NULL);
    retain_set_policy(r, c);
    return r;
}

void retain_free(retain *r)
{
    if (!r)
        return;
    pthread_mutex_destroy(&r->mu);
    free(r);
}

void retain_set_policy(retain *r, const cfg *c)
{
    pthread_mutex_lock(&r->mu);
    r->policy.exact_steps = (int64_t)c->retain_exact_steps;
    r->policy.retain_ms = (int64_t)(c->retain_days * 86400000.0);
    if (c->retain_days > 0 && r->policy.retain_ms < 1)
        r->policy.retain_ms = 1;
    r->policy.retain_bytes = (int64_t)c->retain_bytes;
    r->policy.bucket_steps = (int64_t)c->retain_bucket_steps;
    r->policy.now_ms = 0;
    r->budget = (int64_t)c->retain_budget;
    r->stats.retain_ms = r->policy.retain_ms;
    r->stats.retain_bytes = r->policy.retain_bytes;
    pthread_mutex_unlock(&r->mu);
}

int retain_idle(void *ctx)
{
    retain *r = ctx;
    pthread_mutex_lock(&r->mu);
    store_retention p = r->policy;
    int64_t budget = r->budget;
    pthread_mutex_unlock(&r->mu);
    store_retain_report rep;
    memset(&rep, 0, sizeof rep);
    store_error err = {0, ""};
    uint64_t t0 = util_mono_ns();
    store_status st = store_retain_step(r->db, &p, budget, &rep, &err);
    uint64_t dt = util_mono_ns() - t0;
    pthread_mutex_lock(&r->mu);
    r->stats.busy_ns += dt;
    if (st == STORE_OK) {
        r->stats.steps++;
        r->stats.compacted += (uint64_t)rep.compacted;
        r->stats.downsampled += (uint64_t)rep.downsampled;
        r->stats.used_bytes = rep.used_bytes;
        r->stats.over_limit = rep.over_limit;
        r->stats.last_lock_ms = (double)rep.lock_us / 1000.0;
    } else {
        r->stats.failures++;
        snprintf(r->stats.last_error, sizeof r->stats.last_error, "%.*s",
                 (int)sizeof r->stats.last_error - 1, err.msg);
    }
    pthread_mutex_unlock(&r->mu);
    if (st != STORE_OK) {
        if (!r->logged_failure++)
            LOG_ERROR("store", "retention step failed (retried every retain_interval_ms; logged "
                      "once): %s", err.msg);
        return 0;
    }
    r->logged_failure = 0;
    if (rep.compacted || rep.downsampled)
        LOG_DEBUG("store", "retention: %lld compacted, %lld downsampled, %lld bytes in use, lock "
                  "%.1f ms%s", (long long)rep.compacted, (long long)rep.downsampled,
                  (long long)rep.used_bytes, (double)rep.lock_us / 1000.0,
                  rep.more ? " (more to do)" : "");
    return rep.more;
}

void retain_stats_get(retain *r, retain_stats *out)
{
    pthread_mutex_lock(&r->mu);
    *out = r->stats;
    pthread_mutex_unlock(&r->mu);
}
