/* alerts_feed.c — the alert engine between the store and delivery, and the life of an alert (see
 * alerts_feed.h). Stage: alerts feed; calls alerts, runs, the store (reads at start-up, writes
 * through the storer), counters, util and log, and its sink.
 *
 * Besides the engine: `events`, the transitions to record and deliver; `marks`, the active alerts
 * an operator acknowledged (key and raising step); `silences`, the keys whose transitions are not
 * sent on (until a time, or until the run ends). Both lists are short (what operators did) and
 * searched linearly. Recording copies the transitions into one storer op per batch. */
#include "alerts_feed.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alerts_limit.h"
#include "wirerow.h"
#include "log.h"
#include "util.h"

typedef struct {
    int64_t run_id;
    int32_t layer, head;
    alerts_rule rule;
    int64_t step;            /* marks: the step that raised it */
    int64_t until_ms;        /* silences: 0 until the run ends */
} feed_key;

typedef struct {
    feed_key *v;
    size_t n, cap;
} key_list;

struct alerts_feed {
    const cfg *cfg;
    store *db;               /* start-up only */
    storer *st;
    runs *reg;
    counters *cnt;
    alerts_engine *engine;
    alerts_limit *lim;       /* each run's bound on transitions (alert_rate, alert_burst) */
    alerts_feed_sink sink;
    void *data;
    feed_alert *events;      /* transitions to record and deliver */
    size_t nevents, capevents;
    key_list marks, silences;
};

/* ---- small lists ---------------------------------------------------------------------------- */

static int same_key(const feed_key *k, int64_t run, int32_t layer, int32_t head, alerts_rule rule)
{
    return k->run_id == run && k->layer == layer && k->head == head && k->rule == rule;
}

static feed_key *key_find(key_list *l, int64_t run, int32_t layer, int32_t head, alerts_rule rule)
{
    for (size_t i = 0; i < l->n; i++)
        if (same_key(&l->v[i], run, layer, head, rule))
            return &l->v[i];
    return NULL;
}

static int key_put(key_list *l, feed_key k)
{
    feed_key *old = key_find(l, k.run_id, k.layer, k.head, k.rule);
    if (old) {
        *old = k;
        return 0;
    }
    if (l->n == l->cap) {
        size_t ncap = l->cap ? l->cap * 2 : 16;
        feed_key *nv = realloc(l->v, ncap * sizeof *nv);
        if (!nv)
            return -1;
        l->v = nv;
        l->cap = ncap;
    }
    l->v[l->n++] = k;
    return 0;
}

static void key_drop(key_list *l, size_t i)
{
    l->v[i] = l->v[--l->n];
}

/* Silences whose time is past go. */
static void silences_expire(alerts_feed *f, int64_t now_ms)
{
    for (size_t i = 0; i < f->silences.n;)
        if (f->silences.v[i].until_ms && f->silences.v[i].until_ms <= now_ms)
            key_drop(&f->silences, i);
        else
            i++;
}

static int silenced(alerts_feed *f, const alerts_transition *t, int64_t now_ms)
{
    silences_expire(f, now_ms);
    return key_find(&f->silences, t->run_id, t->layer, t->head, t->rule) != NULL;
}

static feed_alert *new_event(alerts_feed *f)
{
    if (f->nevents == f->capevents) {
        size_t ncap = f->capevents ? f->capevents * 2 : 16;
        feed_alert *ne = realloc(f->events, ncap * sizeof *ne);
        if (!ne)
            return NULL;
        f->events = ne;
        f->capevents = ncap;
    }
    feed_alert *a = &f->events[f->nevents++];
    memset(a, 0, sizeof *a);
    return a;
}

/* ---- thresholds ----------------------------------------------------------------------------- */

/* A Hello's thresholds as overrides: every VOCAB_THRESHOLDS row the wire carries (by its name in
 * Thresholds; ema_warmup is a daemon setting only), set when the Hello set it. */
static void to_overrides(const Attnstat__Thresholds *t, alerts_overrides *o)
{
    memset(o, 0, sizeof *o);
    if (!t)
        return;
    int has;
    double v;
#define FEED_OVERRIDE(name, type, ...)                                                             \
    if (wirerow_get(&t->base, #name, &has, &v) == 0 && has) {                                     \
        o->has_##name = 1;                                                                         \
        o->name = (ALERTS_CTYPE_##type)v;                                                          \
    }
    VOCAB_THRESHOLDS(FEED_OVERRIDE)
#undef FEED_OVERRIDE
}

/* The daemon's settings (config.h: one field per row, uint64_t for the uint32 rows, checked
 * against the same bounds by config.c) as the engine's thresholds. */
static void to_alerts_config(const cfg_thresholds *th, alerts_config *c)
{
#define FEED_CONFIG(name, type, ...) c->name = (ALERTS_CTYPE_##type)th->name;
    VOCAB_THRESHOLDS(FEED_CONFIG)
#undef FEED_CONFIG
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
    if (alerts_set_defaults(f->engine, &c, err, errlen) != ALERTS_OK)
        return -1;
    alerts_limit_set(f->lim, f->cfg->alert_rate, (double)f->cfg->alert_burst);
    return 0;
}

uint32_t alerts_feed_active(const alerts_feed *f)
{
    return (uint32_t)alerts_active(f->engine, 0, NULL, 0);
}

static int run_is_live(const alerts_feed *f, int64_t run_id)
{
    const run_entry *e = f->reg ? runs_get(f->reg, run_id) : NULL;
    return !f->reg || (e && (e->state == RUN_LIVE || e->state == RUN_ORPHAN));
}

/* ---- start-up: the engine takes back what the store says is raised -------------------------- */

typedef struct {
    alerts_feed *f;
    size_t runs, alerts, skipped, ended;
} restore_ctx;

/* A run's thresholds as alerts_feed_check() wrote them (alerts_config_format(), then
 * collapse_threshold): restored as that run's thresholds until its next Hello sets them again. */
static int restore_run_cb(void *ctx, const store_run *run)
{
    restore_ctx *rc = ctx;
    alerts_overrides o;
    if (run->ended_ms || !run->thresholds)
        return 0;
    if (alerts_config_parse(run->thresholds, &o) <= 0) {
        LOG_WARN("alerts", "run %lld: its stored thresholds are not readable (%.80s): the "
                 "daemon's apply until its next Hello", (long long)run->id, run->thresholds);
        return 0;
    }
    char aerr[256];
    if (alerts_set_run(rc->f->engine, run->id, &o, aerr, sizeof aerr) == ALERTS_OK)
        rc->runs++;
    else
        LOG_WARN("alerts", "run %lld: stored thresholds not restored: %s", (long long)run->id, aerr);
    return 0;
}

/* An active alert of a run that ended while no daemon saw it: resolved now ("ended"). */
static void resolve_stale(restore_ctx *rc, const store_alert *a, alerts_rule rule)
{
    feed_alert *e = new_event(rc->f);
    if (!e)
        return;
    const run_entry *r = rc->f->reg ? runs_get(rc->f->reg, a->run_id) : NULL;
    e->t = (alerts_transition){.run_id = a->run_id, .layer = a->layer, .head = a->head,
                               .step = a->step, .rule = rule, .state = ALERTS_RESOLVED,
                               .value = NAN, .threshold = NAN};
    snprintf(e->run, sizeof e->run, "%s", r ? r->name : "?");
    e->rank = r ? r->rank : 0;
    e->time_ms = (int64_t)util_wall_ms();
    snprintf(e->reason, sizeof e->reason, "ended");
    alerts_format(&e->t, e->message, sizeof e->message);
    rc->ended++;
}

static int restore_alert_cb(void *ctx, const store_alert *a)
{
    restore_ctx *rc = ctx;
    alerts_rule rule = alerts_rule_from_name(a->rule ? a->rule : "");
    if (rule && !run_is_live(rc->f, a->run_id)) {
        resolve_stale(rc, a, rule);
        return 0;
    }
    alerts_status st = rule ? alerts_restore(rc->f->engine, a->run_id, a->layer, a->head, rule,
                                             a->step, a->value, a->threshold)
                            : ALERTS_EINVAL;
    if (st == ALERTS_OK) {
        rc->alerts++;
        if (a->acked) {
            feed_key k = {a->run_id, a->layer, a->head, rule, a->step, 0};
            if (key_put(&rc->f->marks, k) != 0)
                LOG_WARN("alerts", "out of memory restoring an acknowledgement");
        }
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

static int restore_silence_cb(void *ctx, const store_silence *s)
{
    restore_ctx *rc = ctx;
    alerts_rule rule = alerts_rule_from_name(s->rule);
    feed_key k = {s->run_id, s->layer, s->head, rule, 0, s->until_ms};
    if (rule && run_is_live(rc->f, s->run_id) && key_put(&rc->f->silences, k) != 0)
        LOG_WARN("alerts", "out of memory restoring a silence");
    return 0;
}

/* The alerts the store has raised (and not ended) go back into the engine, so that good samples
 * after a restart clear them. A failure to read is logged: the daemon runs on without them. */
static void restore(alerts_feed *f)
{
    if (!f->db)
        return;
    restore_ctx rc = {.f = f};
    store_error se = {0, ""};
    if (store_list_runs(f->db, restore_run_cb, &rc, &se) != STORE_OK)
        LOG_WARN("alerts", "reading the runs' thresholds: %s", se.msg);
    se.msg[0] = '\0';
    if (store_alerts(f->db, 0, 1, restore_alert_cb, &rc, &se) != STORE_OK)
        LOG_WARN("alerts", "reading the active alerts: %s (they are not restored)", se.msg);
    se.msg[0] = '\0';
    if (store_silences(f->db, 0, 0, restore_silence_cb, &rc, &se) != STORE_OK)
        LOG_WARN("alerts", "reading the silences: %s (they are not restored)", se.msg);
    if (rc.alerts || rc.skipped || rc.ended)
        LOG_INFO("alerts", "restored %zu active alert%s of live runs from the store (%zu not "
                 "restored; %zu of runs that ended are resolved)", rc.alerts,
                 rc.alerts == 1 ? "" : "s", rc.skipped, rc.ended);
}

alerts_feed *alerts_feed_new(const cfg *c, store *db, runs *reg, counters *cnt,
                             alerts_feed_sink sink, void *data, char *err, size_t errlen)
{
    alerts_feed *f = calloc(1, sizeof *f);
    if (!f) {
        util_err(err, errlen, "out of memory");
        return NULL;
    }
    f->cfg = c;
    f->db = db;
    f->reg = reg;
    f->cnt = cnt;
    f->sink = sink;
    f->data = data;
    alerts_config ac;
    to_alerts_config(&c->thresholds, &ac);
    f->engine = alerts_new(&ac, err, errlen);
    f->lim = f->engine ? alerts_limit_new(c->alert_rate, (double)c->alert_burst) : NULL;
    if (!f->lim) {
        if (f->engine)
            util_err(err, errlen, "out of memory");
        alerts_free(f->engine);
        free(f);
        return NULL;
    }
    alerts_limits lim;
    alerts_limits_default(&lim);
    lim.max_heads_per_run = (uint32_t)c->max_heads_per_run;
    if (alerts_set_limits(f->engine, &lim, err, errlen) != ALERTS_OK) {
        alerts_limit_free(f->lim);
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
    alerts_limit_free(f->lim);
    free(f->events);
    free(f->marks.v);
    free(f->silences.v);
    free(f);
}

/* ---- recording ------------------------------------------------------------------------------ */

typedef struct {
    storer_op op;
    alerts_feed *f;
    size_t n;
    size_t skipped;          /* rows the store refused alone (their run was deleted) */
    feed_alert rows[];
} record_op;

/* Store thread: every row into the open transaction. */
static store_status record_run(void *db, storer_op *op, store_error *err)
{
    record_op *r = (record_op *)op;
    for (size_t i = 0; i < r->n; i++) {
        const feed_alert *e = &r->rows[i];
        if (e->recorded)
            continue; /* an operator's resolve: in the store already */
        store_alert sa = {
            .run_id = e->t.run_id,
            .layer = e->t.layer,
            .head = e->t.head,
            .step = e->t.step,
            .rule = alerts_rule_name(e->t.rule),
            .state = e->t.state == ALERTS_RAISED    ? STORE_ALERT_RAISED
                     : e->t.state == ALERTS_CLEARED ? STORE_ALERT_CLEARED
                                                    : STORE_ALERT_RESOLVED,
            .value = e->t.value,
            .threshold = e->t.threshold,
            .time_ms = e->time_ms,
            .message = e->message,
            .reason = e->reason[0] ? e->reason : NULL,
            .has_uid = e->has_uid,
            .uid = e->uid,
        };
        store_status st = store_add_alert(db, &sa, err);
        if (st == STORE_EINVAL || st == STORE_NOTFOUND)
            r->skipped++;
        else if (st != STORE_OK)
            return st;
    }
    return STORE_OK;
}

/* A transition handed to the sink, with its run's owner (who it is delivered for). */
static void sink(alerts_feed *f, feed_alert *a)
{
    const run_entry *e = f->reg ? runs_get(f->reg, a->t.run_id) : NULL;
    a->owner = e && e->has_owner ? (uint32_t)e->owner : 0;
    f->sink(f->data, a);
}

/* Loop thread: the rows are in the table (or could not be): now they are delivered, in order. */
static void record_done(storer_op *op)
{
    record_op *r = (record_op *)op;
    if (op->status != STORE_OK)
        LOG_ERROR("store", "%zu alert transitions not recorded in the alerts table (they are "
                  "still delivered): %s", r->n, op->err.msg);
    else if (r->skipped)
        LOG_WARN("store", "%zu of %zu alert transitions not recorded: their run is gone (%s)",
                 r->skipped, r->n, op->err.msg);
    for (size_t i = 0; i < r->n; i++)
        sink(r->f, &r->rows[i]);
    free(r);
}

/* The kept transitions go to the store thread, in one op, and are delivered once recorded: a
 * watcher that sees an alert finds it in the alerts table. Without a store thread (or memory for
 * the op) they are delivered now. */
static void record(alerts_feed *f)
{
    if (f->nevents == 0)
        return;
    record_op *r = f->st ? malloc(sizeof *r + f->nevents * sizeof r->rows[0]) : NULL;
    if (!r) {
        if (f->st) {
            counters_store_error(f->cnt, "out of memory recording alert transitions");
            LOG_ERROR("store", "out of memory: %zu alert transitions not recorded (they are still "
                      "delivered)", f->nevents);
        }
        for (size_t i = 0; i < f->nevents; i++)
            sink(f, &f->events[i]);
        f->nevents = 0;
        return;
    }
    memset(&r->op, 0, sizeof r->op);
    r->op.mode = STORER_BATCHED;
    r->op.run = record_run;
    r->op.done = record_done;
    r->f = f;
    r->n = f->nevents;
    r->skipped = 0;
    memcpy(r->rows, f->events, f->nevents * sizeof r->rows[0]);
    f->nevents = 0;
    storer_submit(f->st, &r->op);
}

void alerts_feed_start(alerts_feed *f, storer *st)
{
    f->st = st;
    f->db = NULL; /* the store thread owns the handle from now on */
    alerts_feed_deliver(f);
}

/* ---- the bound on a run's transitions (alerts_limit.h) --------------------------------------- */

static const char *run_name(const alerts_feed *f, int64_t run_id)
{
    const run_entry *e = f->reg ? runs_get(f->reg, run_id) : NULL;
    return e ? e->name : "?";
}

/* A summary of a run's suppressed transitions: one log line (the counts are on /metrics). */
static void say_suppressed(void *ctx, const alerts_limit_summary *s)
{
    alerts_feed *f = ctx;
    LOG_WARN("alerts", "run '%s' (id %lld): %llu alert transition%s suppressed in %.1f s (over "
             "alert_burst %llu raises, refilled at alert_rate %g a second): not recorded nor "
             "delivered%s", run_name(f, s->run_id), (long long)s->run_id,
             (unsigned long long)s->suppressed, s->suppressed == 1 ? "" : "s",
             (double)(s->last_ms - s->first_ms) / 1000.0,
             (unsigned long long)f->cfg->alert_burst, f->cfg->alert_rate,
             s->ended ? "" : "; it goes on");
}

/* Whether transition t of run (its name) goes on past the run's bound; suppressed ones counted. */
static int limit_pass(alerts_feed *f, const alerts_transition *t, const char *run, int64_t now_ms)
{
    alerts_limit_verdict v = alerts_limit_admit(f->lim, t, now_ms);
    if (v == ALERTS_LIMIT_PASS)
        return 1;
    counters_inc(f->cnt, CNT_ALERTS_SUPPRESSED);
    if (v == ALERTS_LIMIT_FIRST && t->state == ALERTS_RAISED)
        LOG_WARN("alerts", "run '%s': its alerts raise faster than alert_rate %g a second past "
                 "alert_burst %llu: its transitions are suppressed (not recorded nor delivered, "
                 "counted in attnstat_alert_transitions_suppressed_total) until they slow down; a "
                 "summary follows", run, f->cfg->alert_rate,
                 (unsigned long long)f->cfg->alert_burst);
    return 0;
}

uint64_t alerts_feed_suppressed(const alerts_feed *f, int64_t run_id)
{
    return alerts_limit_suppressed(f->lim, run_id);
}

/* ---- a batch -------------------------------------------------------------------------------- */

/* The marks of an alert that ended go. */
static void ended(alerts_feed *f, const alerts_transition *t)
{
    for (size_t i = 0; i < f->marks.n; i++)
        if (same_key(&f->marks.v[i], t->run_id, t->layer, t->head, t->rule)) {
            key_drop(&f->marks, i);
            return;
        }
}

/* Feeds every head of it to the engine; keeps the transitions. -1 on no memory. */
static int observe(alerts_feed *f, const batch_item *it, int64_t now_ms)
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
            if (tr[i].state == ALERTS_CLEARED)
                ended(f, &tr[i]);
            if (!limit_pass(f, &tr[i], it->run, now_ms))
                continue;
            feed_alert *a = new_event(f);
            if (!a)
                return -1;
            a->t = tr[i];
            snprintf(a->run, sizeof a->run, "%s", it->run);
            a->rank = it->rank;
            a->time_ms = it->time_ms;
            if (tr[i].state == ALERTS_CLEARED)
                snprintf(a->reason, sizeof a->reason, "samples");
            a->silenced = silenced(f, &tr[i], now_ms);
            alerts_format(&tr[i], a->message, sizeof a->message);
        }
    }
    return rc;
}

void alerts_feed_batch(alerts_feed *f, batch_item *const *items, const Attnstat__Code *codes,
                       size_t n)
{
    int64_t now_ms = (int64_t)util_wall_ms();
    for (size_t i = 0; i < n; i++)
        if (codes[i] == ATTNSTAT__CODE__OK && run_is_live(f, items[i]->run_id) &&
            observe(f, items[i], now_ms) != 0)
            LOG_ERROR("alerts", "alert engine: out of memory; alerts of this batch may be missing");
}

void alerts_feed_deliver(alerts_feed *f)
{
    alerts_limit_summaries(f->lim, (int64_t)util_wall_ms(), say_suppressed, f);
    record(f); /* the sink runs once they are recorded */
}

/* ---- the end of a run, operators' marks ---------------------------------------------------- */

uint32_t alerts_feed_end_run(alerts_feed *f, const run_entry *e, const char *reason)
{
    size_t n = alerts_active(f->engine, e->id, NULL, 0);
    alerts_transition *act = n ? calloc(n, sizeof *act) : NULL;
    if (n && !act) {
        LOG_ERROR("alerts", "out of memory resolving the alerts of run '%s'", e->name);
        n = 0;
    }
    n = act ? alerts_active(f->engine, e->id, act, n) : 0;
    int64_t now_ms = (int64_t)util_wall_ms();
    uint32_t done = 0;
    for (size_t i = 0; i < n; i++) {
        alerts_transition t = act[i];
        t.state = ALERTS_RESOLVED;
        t.value = NAN;
        t.threshold = NAN;
        t.streak = 0;
        done++;
        if (!limit_pass(f, &t, e->name, now_ms))
            continue; /* its raise was suppressed: so is its end */
        feed_alert *a = new_event(f);
        if (!a)
            break;
        a->t = t;
        snprintf(a->run, sizeof a->run, "%s", e->name);
        a->rank = e->rank;
        a->time_ms = now_ms;
        snprintf(a->reason, sizeof a->reason, "%s", reason);
        a->silenced = silenced(f, &a->t, now_ms);
        alerts_format(&a->t, a->message, sizeof a->message);
        size_t ml = strlen(a->message);
        snprintf(a->message + ml, sizeof a->message - ml, ": the run ended (%s)", reason);
    }
    free(act);
    alerts_limit_end_run(f->lim, e->id, say_suppressed, f);
    if (e->conns > 0)
        alerts_forget_heads(f->engine, e->id); /* idle, still connected: its thresholds stay */
    else
        alerts_forget_run(f->engine, e->id);
    for (size_t i = 0; i < f->marks.n;)
        if (f->marks.v[i].run_id == e->id)
            key_drop(&f->marks, i);
        else
            i++;
    for (size_t i = 0; i < f->silences.n;)
        if (f->silences.v[i].run_id == e->id && f->silences.v[i].until_ms == 0)
            key_drop(&f->silences, i);
        else
            i++;
    record(f);
    return done;
}

void alerts_feed_mark(alerts_feed *f, feed_mark what, const store_alert *a, uint32_t uid,
                      int64_t until_ms, const char *run, int32_t rank)
{
    alerts_rule rule = alerts_rule_from_name(a->rule ? a->rule : "");
    if (!rule)
        return;
    feed_key k = {a->run_id, a->layer, a->head, rule, a->step, until_ms};
    if (what == FEED_ACK) {
        if (key_put(&f->marks, k) != 0)
            LOG_ERROR("alerts", "out of memory keeping an acknowledgement");
        return;
    }
    if (what == FEED_SILENCE) {
        if (key_put(&f->silences, k) != 0)
            LOG_ERROR("alerts", "out of memory keeping a silence");
        return;
    }
    if (what == FEED_UNSILENCE) {
        for (size_t i = 0; i < f->silences.n; i++)
            if (same_key(&f->silences.v[i], a->run_id, a->layer, a->head, rule)) {
                key_drop(&f->silences, i);
                break;
            }
        return;
    }
    /* FEED_RESOLVE: the row is in the store; the engine lets the alert go, it is delivered. */
    if (!alerts_resolve(f->engine, a->run_id, a->layer, a->head, rule, a->step))
        return; /* it ended meanwhile, or raised again at another step */
    alerts_transition t = {.run_id = a->run_id, .layer = a->layer, .head = a->head,
                           .step = a->step, .rule = rule, .state = ALERTS_RESOLVED,
                           .value = NAN, .threshold = NAN};
    ended(f, &t);
    int64_t now_ms = (int64_t)util_wall_ms();
    if (!limit_pass(f, &t, run, now_ms))
        return;
    feed_alert *e = new_event(f);
    if (!e)
        return;
    e->t = t;
    snprintf(e->run, sizeof e->run, "%s", run);
    e->rank = rank;
    e->time_ms = now_ms;
    snprintf(e->reason, sizeof e->reason, "operator");
    e->has_uid = 1;
    e->uid = uid;
    e->recorded = 1;
    e->silenced = silenced(f, &t, now_ms);
    alerts_format(&t, e->message, sizeof e->message);
    size_t ml = strlen(e->message);
    snprintf(e->message + ml, sizeof e->message - ml, " by uid %u", (unsigned)uid);
}

/* ---- counts for the metrics ----------------------------------------------------------------- */

static int by_run(const void *a, const void *b)
{
    int64_t x = ((const alerts_transition *)a)->run_id, y = ((const alerts_transition *)b)->run_id;
    return x < y ? -1 : x > y;
}

void alerts_feed_counts(alerts_feed *f, void (*fn)(void *ctx, int64_t run_id, uint32_t active,
                                                    uint32_t unacked),
                        void *ctx)
{
    size_t n = alerts_active(f->engine, 0, NULL, 0);
    if (!n)
        return;
    alerts_transition *act = calloc(n, sizeof *act);
    if (!act)
        return;
    n = alerts_active(f->engine, 0, act, n);
    qsort(act, n, sizeof *act, by_run);
    int64_t now_ms = (int64_t)util_wall_ms();
    silences_expire(f, now_ms);
    for (size_t i = 0; i < n;) {
        int64_t run = act[i].run_id;
        uint32_t active = 0, unacked = 0;
        for (; i < n && act[i].run_id == run; i++) {
            const feed_key *m = key_find(&f->marks, run, act[i].layer, act[i].head, act[i].rule);
            int acked = m && m->step == act[i].step;
            active++;
            unacked += !acked &&
                       !key_find(&f->silences, run, act[i].layer, act[i].head, act[i].rule);
        }
        fn(ctx, run, active, unacked);
    }
    free(act);
}

void alerts_feed_run_config(const alerts_feed *f, int64_t run_id, alerts_config *out)
{
    alerts_run_config(f->engine, run_id, out);
}

int alerts_feed_marks(alerts_feed *f, void (*fn)(void *ctx, feed_mark what, const feed_marked *m),
                      void *ctx)
{
    silences_expire(f, (int64_t)util_wall_ms());
    for (size_t i = 0; i < f->silences.n; i++) {
        const feed_key *k = &f->silences.v[i];
        feed_marked m = {k->run_id, k->layer, k->head, k->rule, k->until_ms};
        fn(ctx, FEED_SILENCE, &m);
    }
    size_t n = f->marks.n ? alerts_active(f->engine, 0, NULL, 0) : 0;
    if (n == 0)
        return 0;
    alerts_transition *act = calloc(n, sizeof *act);
    if (!act)
        return -1;
    n = alerts_active(f->engine, 0, act, n);
    for (size_t i = 0; i < n; i++) {
        const feed_key *k = key_find(&f->marks, act[i].run_id, act[i].layer, act[i].head,
                                     act[i].rule);
        if (!k || k->step != act[i].step)
            continue;
        feed_marked m = {k->run_id, k->layer, k->head, k->rule, 0};
        fn(ctx, FEED_ACK, &m);
    }
    free(act);
    return 0;
}
