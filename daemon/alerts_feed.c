/* alerts_feed.c — the alert engine between the store and delivery (see alerts_feed.h). Stage:
 * alerts feed; calls alerts, the store, counters, util and log, and its sink. */
#include "alerts_feed.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "util.h"

struct alerts_feed {
    const cfg *cfg;
    store *db;
    counters *cnt;
    alerts_engine *engine;
    alerts_feed_sink sink;
    void *data;
    feed_alert *events;      /* transitions of the last batch, until delivered */
    size_t nevents, capevents;
};

/* ---- thresholds ----------------------------------------------------------------------------- */

static void to_overrides(const Attnstat__Thresholds *t, alerts_overrides *o)
{
    memset(o, 0, sizeof *o);
    if (!t)
        return;
    o->has_entropy_floor = t->has_entropy_floor;
    o->entropy_floor = t->entropy_floor;
    o->has_entropy_drop = t->has_entropy_drop;
    o->entropy_drop = t->entropy_drop;
    o->has_ema_alpha = t->has_ema_alpha;
    o->ema_alpha = t->ema_alpha;
    o->has_logit_ceiling = t->has_logit_ceiling;
    o->logit_ceiling = t->logit_ceiling;
    o->has_raise_after = t->has_raise_after;
    o->raise_after = t->raise_after;
    o->has_clear_after = t->has_clear_after;
    o->clear_after = t->clear_after;
}

static void to_alerts_config(const cfg_thresholds *th, alerts_config *c)
{
    c->entropy_floor = th->entropy_floor;
    c->entropy_drop = th->entropy_drop;
    c->ema_alpha = th->ema_alpha;
    c->ema_warmup = (uint32_t)th->ema_warmup;
    c->logit_ceiling = th->logit_ceiling;
    c->raise_after = (uint32_t)th->raise_after;
    c->clear_after = (uint32_t)th->clear_after;
}

int alerts_feed_check(alerts_feed *f, const Attnstat__Thresholds *t, double collapse_threshold,
                      char *json, size_t jsonlen, char *err, size_t errlen)
{
    alerts_config base, merged;
    alerts_overrides o;
    to_alerts_config(&f->cfg->thresholds, &base);
    to_overrides(t, &o);
    if (alerts_config_merge(&merged, &base, &o, err, errlen) != ALERTS_OK)
        return -1;
    alerts_config_format(&merged, json, jsonlen);
    /* The computation's parameter travels with the rules' thresholds. */
    size_t jl = strlen(json);
    if (jl > 0 && json[jl - 1] == '}')
        snprintf(json + jl - 1, jsonlen - (jl - 1), ",\"collapse_threshold\":%.17g}",
                 collapse_threshold);
    return 0;
}

int alerts_feed_set_run(alerts_feed *f, int64_t run_id, const Attnstat__Thresholds *t, char *err,
                        size_t errlen)
{
    alerts_overrides o;
    to_overrides(t, &o);
    return alerts_set_run(f->engine, run_id, &o, err, errlen) == ALERTS_OK ? 0 : -1;
}

int alerts_feed_reload(alerts_feed *f, char *err, size_t errlen)
{
    alerts_config c;
    to_alerts_config(&f->cfg->thresholds, &c);
    return alerts_set_defaults(f->engine, &c, err, errlen) == ALERTS_OK ? 0 : -1;
}

uint32_t alerts_feed_active(const alerts_feed *f)
{
    return (uint32_t)alerts_active(f->engine, 0, NULL, 0);
}

/* ---- start-up: the engine takes back what the store says is raised -------------------------- */

typedef struct {
    alerts_engine *e;
    size_t runs, alerts, skipped;
} restore_ctx;

/* A run's thresholds as alerts_feed_check() wrote them (alerts_config_format(), then
 * collapse_threshold): restored as that run's thresholds until its next Hello sets them again. */
static int restore_run_cb(void *ctx, const store_run *run)
{
    restore_ctx *rc = ctx;
    alerts_overrides o;
    memset(&o, 0, sizeof o);
    if (!run->thresholds ||
        sscanf(run->thresholds,
               "{\"entropy_floor\":%lf,\"entropy_drop\":%lf,\"ema_alpha\":%lf,\"ema_warmup\":%" SCNu32
               ",\"logit_ceiling\":%lf,\"raise_after\":%" SCNu32 ",\"clear_after\":%" SCNu32,
               &o.entropy_floor, &o.entropy_drop, &o.ema_alpha, &o.ema_warmup, &o.logit_ceiling,
               &o.raise_after, &o.clear_after) != 7)
        return 0;
    o.has_entropy_floor = o.has_entropy_drop = o.has_ema_alpha = o.has_ema_warmup = 1;
    o.has_logit_ceiling = o.has_raise_after = o.has_clear_after = 1;
    char aerr[256];
    if (alerts_set_run(rc->e, run->id, &o, aerr, sizeof aerr) == ALERTS_OK)
        rc->runs++;
    else
        LOG_WARN("alerts", "run %lld: stored thresholds not restored: %s", (long long)run->id, aerr);
    return 0;
}

static int restore_alert_cb(void *ctx, const store_alert *a)
{
    restore_ctx *rc = ctx;
    alerts_rule rule = alerts_rule_from_name(a->rule ? a->rule : "");
    alerts_status st = rule ? alerts_restore(rc->e, a->run_id, a->layer, a->head, rule, a->step,
                                             a->value, a->threshold)
                            : ALERTS_EINVAL;
    if (st == ALERTS_OK) {
        rc->alerts++;
    } else {
        rc->skipped++;
        LOG_WARN("alerts", "active alert %s of run %lld layer %d head %d not restored (%s): it "
                 "stays raised in the alerts table", a->rule ? a->rule : "?", (long long)a->run_id,
                 (int)a->layer, (int)a->head,
                 st == ALERTS_ELIMIT ? "over the engine's limits"
                 : st == ALERTS_ENOMEM ? "out of memory" : "unknown rule or bad value");
    }
    return 0;
}

/* The alerts the store has raised (and not cleared) go back into the engine, so that good samples
 * after a restart clear them. A failure to read is logged: the daemon runs on without them. */
static void restore(alerts_feed *f)
{
    if (!f->db)
        return;
    restore_ctx rc = {.e = f->engine};
    store_error se = {0, ""};
    if (store_list_runs(f->db, restore_run_cb, &rc, &se) != STORE_OK)
        LOG_WARN("alerts", "reading the runs' thresholds: %s", se.msg);
    se.msg[0] = '\0';
    if (store_alerts(f->db, 0, 1, restore_alert_cb, &rc, &se) != STORE_OK)
        LOG_WARN("alerts", "reading the active alerts: %s (they are not restored)", se.msg);
    if (rc.alerts || rc.skipped)
        LOG_INFO("alerts", "restored %zu active alert%s from the store (%zu not restored)",
                 rc.alerts, rc.alerts == 1 ? "" : "s", rc.skipped);
}

alerts_feed *alerts_feed_new(const cfg *c, store *db, counters *cnt, alerts_feed_sink sink,
                             void *data, char *err, size_t errlen)
{
    alerts_feed *f = calloc(1, sizeof *f);
    if (!f) {
        util_err(err, errlen, "out of memory");
        return NULL;
    }
    f->cfg = c;
    f->db = db;
    f->cnt = cnt;
    f->sink = sink;
    f->data = data;
    alerts_config ac;
    to_alerts_config(&c->thresholds, &ac);
    f->engine = alerts_new(&ac, err, errlen);
    if (!f->engine) {
        free(f);
        return NULL;
    }
    alerts_limits lim;
    alerts_limits_default(&lim);
    lim.max_heads_per_run = (uint32_t)c->max_heads_per_run;
    if (alerts_set_limits(f->engine, &lim, err, errlen) != ALERTS_OK) {
        alerts_free(f->engine);
        free(f);
        return NULL;
    }
    restore(f);
    return f;
}

void alerts_feed_free(alerts_feed *f)
{
    if (!f)
        return;
    alerts_free(f->engine);
    free(f->events);
    free(f);
}

/* ---- a batch -------------------------------------------------------------------------------- */

/* Feeds every head of it to the engine; keeps the transitions. -1 on no memory. */
static int observe(alerts_feed *f, const batch_item *it)
{
    int rc = 0;
    for (int32_t h = 0; h < it->nheads; h++) {
        alerts_transition tr[ALERTS_NRULES];
        int32_t head = it->head_base + h; /* global (the run's layout) */
        int k = alerts_observe(f->engine, it->run_id, it->layer, head, it->step, &it->heads[h], tr);
        if (k == ALERTS_OBSERVE_RUN_FULL || k == ALERTS_OBSERVE_FULL) {
            /* A limit, not a failure: the samples are stored, this head is not alerted on. Said
             * once per run (and, for the engine's limit, again at each power of two). */
            uint64_t run_n = alerts_refused(f->engine, it->run_id);
            uint64_t all_n = alerts_refused(f->engine, 0);
            alerts_limits lim;
            alerts_get_limits(f->engine, &lim);
            if (k == ALERTS_OBSERVE_RUN_FULL && run_n == 1)
                LOG_WARN("alerts", "run '%s' has more than %u distinct (layer, head) pairs "
                         "(max_heads_per_run): new ones, from layer %u head %d on, are stored but "
                         "not alerted on", it->run, lim.max_heads_per_run, (unsigned)it->layer, head);
            else if (k == ALERTS_OBSERVE_FULL && (run_n == 1 || (all_n & (all_n - 1)) == 0))
                LOG_WARN("alerts", "the alert engine holds its maximum of %u (layer, head) states: "
                         "new heads (run '%s' layer %u head %d; %llu refused so far) are stored but "
                         "not alerted on", lim.max_heads, it->run, (unsigned)it->layer, head,
                         (unsigned long long)all_n);
            continue;
        }
        if (k < 0) {
            rc = -1;
            continue;
        }
        for (int i = 0; i < k; i++) {
            if (f->nevents == f->capevents) {
                size_t ncap = f->capevents ? f->capevents * 2 : 16;
                feed_alert *ne = realloc(f->events, ncap * sizeof *ne);
                if (!ne)
                    return -1;
                f->events = ne;
                f->capevents = ncap;
            }
            feed_alert *a = &f->events[f->nevents++];
            a->t = tr[i];
            snprintf(a->run, sizeof a->run, "%s", it->run);
            a->rank = it->rank;
            a->time_ms = it->time_ms;
            alerts_format(&tr[i], a->message, sizeof a->message);
        }
    }
    return rc;
}

/* The kept transitions into the alerts table, in a transaction of their own. */
static void record(alerts_feed *f)
{
    if (!f->db)
        return;
    store_error se = {0, ""};
    int failed = 0;
    for (size_t i = 0; i < f->nevents && !failed; i++) {
        const feed_alert *e = &f->events[i];
        store_alert sa = {
            .run_id = e->t.run_id,
            .layer = e->t.layer,
            .head = e->t.head,
            .step = e->t.step,
            .rule = alerts_rule_name(e->t.rule),
            .state = e->t.state == ALERTS_RAISED ? STORE_ALERT_RAISED : STORE_ALERT_CLEARED,
            .value = e->t.value,
            .threshold = e->t.threshold,
            .time_ms = e->time_ms,
            .message = e->message,
        };
        failed = store_add_alert(f->db, &sa, &se) != STORE_OK;
    }
    if (!failed && f->nevents > 0 && store_commit(f->db, &se) != STORE_OK)
        failed = 1;
    if (failed) {
        store_rollback(f->db);
        counters_inc(f->cnt, CNT_COMMIT_FAILURES);
        counters_store_error(f->cnt, se.msg);
        LOG_ERROR("store", "%zu alert transitions not recorded in the alerts table (they are "
                  "still delivered): %s", f->nevents, se.msg);
    }
}

void alerts_feed_batch(alerts_feed *f, batch_item *const *items, const Attnstat__Code *codes,
                       size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (codes[i] == ATTNSTAT__CODE__OK && observe(f, items[i]) != 0)
            LOG_ERROR("alerts", "alert engine: out of memory; alerts of this batch may be missing");
    record(f);
}

void alerts_feed_deliver(alerts_feed *f)
{
    /* The sink may not add transitions (it only delivers), but it is handed a stable array. */
    for (size_t i = 0; i < f->nevents; i++)
        f->sink(f->data, &f->events[i]);
    f->nevents = 0;
}
