/* life.c — the life of a run (see life.h). Stage: beside the session, the loop and the commands;
 * calls runs, the alert feed, the storer, the store's write half (on the store thread), counters,
 * util and log.
 *
 * Two store ops, each allocated with what it writes: a run's record (store_add_run() under the id
 * the registry gave it, into the store thread's open transaction, so that the pushes that follow
 * it in the queue find it) and a run's end or resumption (store_run_end()). */
#include "life.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alerts_feed.h"
#include "counters.h"
#include "log.h"
#include "storer.h"
#include "util.h"

/* ---- store ops ------------------------------------------------------------------------------ */

typedef struct {
    storer_op op;
    counters *cnt;
    runs *runs;
    store_run_info info;     /* its strings point into text[] */
    char text[];
} record_op;

static store_status record_run(void *db, storer_op *op, store_error *err)
{
    record_op *r = (record_op *)op;
    int64_t id = 0;
    store_status st = store_add_run(db, &r->info, &id, err);
    if (st == STORE_OK && id != r->info.id) {
        snprintf(err->msg, sizeof err->msg, "run '%s' rank %d is recorded under id %lld, not %lld",
                 r->info.name, (int)r->info.rank, (long long)id, (long long)r->info.id);
        return STORE_EINVAL; /* the registry and the store disagree: said, not hidden */
    }
    return st;
}

static void record_done(storer_op *op)
{
    record_op *r = (record_op *)op;
    if (op->status == STORE_OK) {
        free(r);
        return;
    }
    counters_store_error(r->cnt, op->err.msg);
    run_entry *e = runs_get(r->runs, r->info.id);
    if (op->status == STORE_ERROR && e && !e->unrecorded) {
        /* Its transaction was rolled back (disk full, I/O): tried again before its next push. */
        LOG_ERROR("store", "run '%s' rank %d (id %lld) not recorded: %s; tried again with its "
                  "next push", r->info.name, (int)r->info.rank, (long long)r->info.id,
                  op->err.msg);
        e->unrecorded = r;
        return;
    }
    LOG_ERROR("store", "run '%s' rank %d (id %lld) not recorded: %s; its pushes will fail until "
              "its client says Hello again", r->info.name, (int)r->info.rank,
              (long long)r->info.id, op->err.msg);
    free(r);
}

void life_before_push(const stage_ctx *x, int64_t run_id)
{
    run_entry *e = runs_get(x->runs, run_id);
    if (!e || !e->unrecorded)
        return;
    record_op *r = e->unrecorded;
    e->unrecorded = NULL;
    memset(&r->op, 0, sizeof r->op);
    r->op.mode = STORER_BATCHED;
    r->op.run = record_run;
    r->op.done = record_done;
    storer_submit(x->st, &r->op);
}

static char *copy_in(char **at, const char *s)
{
    if (!s)
        return NULL;
    size_t n = strlen(s) + 1;
    char *p = memcpy(*at, s, n);
    *at += n;
    return p;
}

int life_hello(const stage_ctx *x, run_entry *e, const store_run_info *info)
{
    size_t n = 0;
    const char *strs[] = {info->name, info->host, info->config, info->thresholds};
    for (size_t i = 0; i < sizeof strs / sizeof strs[0]; i++)
        n += strs[i] ? strlen(strs[i]) + 1 : 0;
    record_op *r = calloc(1, sizeof *r + n);
    if (!r)
        return -1;
    r->op.mode = STORER_BATCHED;
    r->op.run = record_run;
    r->op.done = record_done;
    r->cnt = x->cnt;
    r->runs = x->runs;
    r->info = *info;
    char *at = r->text;
    r->info.name = copy_in(&at, info->name);
    r->info.host = copy_in(&at, info->host);
    r->info.config = copy_in(&at, info->config);
    r->info.thresholds = copy_in(&at, info->thresholds);
    r->info.id = e->id;
    r->info.has_owner = e->has_owner;
    r->info.owner_uid = (uint32_t)e->owner;
    free(e->unrecorded); /* this record replaces one that failed */
    e->unrecorded = NULL;
    storer_submit(x->st, &r->op);
    runs_attach(e, util_mono_ns());
    return 0;
}

typedef struct {
    storer_op op;
    counters *cnt;
    int64_t run_id;
    int64_t time_ms;
    char reason[32];         /* "": resumed */
} end_op;

static store_status end_run(void *db, storer_op *op, store_error *err)
{
    end_op *o = (end_op *)op;
    return store_run_end(db, o->run_id, o->time_ms, o->reason[0] ? o->reason : NULL, err);
}

static void end_done(storer_op *op)
{
    end_op *o = (end_op *)op;
    if (op->status != STORE_OK && op->status != STORE_NOTFOUND) {
        counters_store_error(o->cnt, op->err.msg);
        LOG_ERROR("store", "the %s of run %lld not recorded: %s", o->reason[0] ? "end" : "resumption",
                  (long long)o->run_id, op->err.msg);
    }
    free(o);
}

static void record_end(const stage_ctx *x, int64_t run_id, const char *reason)
{
    end_op *o = calloc(1, sizeof *o);
    if (!o) {
        LOG_ERROR("store", "out of memory: the end of run %lld not recorded", (long long)run_id);
        return;
    }
    o->op.mode = STORER_BATCHED;
    o->op.run = end_run;
    o->op.done = end_done;
    o->cnt = x->cnt;
    o->run_id = run_id;
    o->time_ms = (int64_t)util_wall_ms();
    snprintf(o->reason, sizeof o->reason, "%s", reason ? reason : "");
    storer_submit(x->st, &o->op);
}

/* ---- the life ------------------------------------------------------------------------------- */

int life_detach(const stage_ctx *x, int64_t run_id, int goodbye)
{
    run_entry *e = runs_get(x->runs, run_id);
    if (!e)
        return 0;
    runs_detach(e, goodbye, util_mono_ns());
    return e->state == RUN_ORPHAN && e->goodbye;
}

void life_touch(const stage_ctx *x, int64_t run_id)
{
    run_entry *e = runs_get(x->runs, run_id);
    if (e && runs_touch(e, util_mono_ns())) {
        LOG_INFO("server", "run '%s' rank %d (id %lld) resumed: a push after it ended for "
                 "idleness", e->name, (int)e->rank, (long long)e->id);
        record_end(x, e->id, NULL);
    }
}

uint32_t life_end(const stage_ctx *x, run_entry *e, const char *reason)
{
    uint32_t n = alerts_feed_end_run(x->feed, e, reason);
    record_end(x, e->id, reason);
    runs_ended(e);
    counters_inc(x->cnt, CNT_RUNS_ENDED);
    LOG_INFO("server", "run '%s' rank %d (id %lld) ended (%s): %u active alert%s resolved", e->name,
             (int)e->rank, (long long)e->id, reason, n, n == 1 ? "" : "s");
    alerts_feed_deliver(x->feed);
    return n;
}

static void end_due(void *ctx, run_entry *e, const char *reason)
{
    life_end(ctx, e, reason);
}

void life_check(const stage_ctx *x)
{
    const cfg *c = x->cfg;
    runs_due(x->runs, util_mono_ns(), c->run_grace_ms * 1000000ull, c->run_idle_ms * 1000000ull,
             end_due, (void *)x);
}
