/* pipeline.c — finished pushes to durable, acknowledged samples and delivered alerts
 * (see pipeline.h).
 *
 * Batching: the first result of an empty batch arms a one-shot timer of commit_ms (0: the next
 * loop iteration, so everything finished in one iteration commits together); a batch of
 * PIPELINE_BATCH_MAX results commits at once. A store failure rolls the whole batch back and every
 * push in it gets Ack(INTERNAL) with the store's message: nothing is acknowledged that is not
 * stored. The alert engine sees a batch only once its samples are committed (then the alert rows
 * follow in a transaction of their own): a rollback never leaves the engine ahead of the store. */
#include "pipeline.h"

#include <inttypes.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alerts.h"
#include "log.h"
#include "server.h"
#include "session.h"

#define PIPELINE_BATCH_MAX 256
#define PIPELINE_MAX_CHILDREN 16

extern char **environ;

struct pipeline {
    server *srv;
    uv_timer_t timer;
    int timer_armed;
    int closing;
    session_push *head, *tail;
    uint32_t n;
    uint32_t children;
    alerts_engine *alerts;
};

typedef struct {
    uv_process_t proc;
    pipeline *pl;
} exec_child;

/* One alert transition with what its sinks need (copied: the push and its session may be gone by
 * the time it is delivered). */
typedef struct {
    alerts_transition t;
    char run[SESSION_RUN_MAX];
    int32_t rank;
    int64_t time_ms;
    char message[320];
} pipeline_alert;

/* ---- results as protobuf -------------------------------------------------------------------- */

static void fill_head(Attnstat__HeadStats *o, uint32_t head, const stats_head *h)
{
    attnstat__head_stats__init(o);
    o->head = head;
    o->rows = (uint64_t)h->rows;
    o->has_rows_norm = 1;
    o->rows_norm = (uint64_t)h->rows_norm;
    o->has_rows_empty = 1;
    o->rows_empty = (uint64_t)h->rows_empty;
    o->has_nonfinite_rows = 1;
    o->nonfinite_rows = (uint64_t)h->nonfinite_rows;
#define OPT(field, v)                                                                              \
    do {                                                                                           \
        if (isfinite(v)) {                                                                         \
            o->has_##field = 1;                                                                    \
            o->field = (v);                                                                        \
        }                                                                                          \
    } while (0)
    OPT(entropy_mean, h->entropy_mean);
    OPT(entropy_std, h->entropy_std);
    OPT(entropy_min, h->entropy_min);
    OPT(entropy_max, h->entropy_max);
    OPT(entropy_norm_mean, h->entropy_norm_mean);
    OPT(collapsed_frac, h->collapsed_frac);
    OPT(max_logit, h->max_logit);
#undef OPT
    o->has_sampled = 1;
    o->sampled = h->sampled != 0;
}

/* Heads of a push as protobuf: one array of structs plus one of pointers, freed by the caller. */
static Attnstat__HeadStats **heads_pb(const session_push *p, Attnstat__HeadStats **store_out)
{
    size_t n = (size_t)p->job.prob.heads_q;
    Attnstat__HeadStats *hs = malloc(n * sizeof *hs);
    Attnstat__HeadStats **ptrs = malloc(n * sizeof *ptrs);
    if (!hs || !ptrs) {
        free(hs);
        free(ptrs);
        *store_out = NULL;
        return NULL;
    }
    for (size_t i = 0; i < n; i++) {
        fill_head(&hs[i], (uint32_t)i, &p->job.heads[i]);
        ptrs[i] = &hs[i];
    }
    *store_out = hs;
    return ptrs;
}

/* ---- subscribers ---------------------------------------------------------------------------- */

static void send_result(pipeline *pl, session_push *p, Attnstat__HeadStats **ptrs)
{
    if (!ptrs)
        return;
    Attnstat__Result r = ATTNSTAT__RESULT__INIT;
    r.run = p->s->run;
    r.run_id = p->s->run_id;
    r.step = p->step;
    r.layer = p->layer;
    r.heads = ptrs;
    r.n_heads = (size_t)p->job.prob.heads_q;
    Attnstat__Envelope env = ATTNSTAT__ENVELOPE__INIT;
    env.msg_case = ATTNSTAT__ENVELOPE__MSG_RESULT;
    env.result = &r;
    for (conn *c = pl->srv->conns; c; c = c->next)
        if (c->sub_results && !c->closing)
            server_send(c, &env, 0);
}


static void exec_closed(uv_handle_t *h)
{
    exec_child *ch = h->data;
    ch->pl->children--;
    free(ch);
}

static void exec_exited(uv_process_t *proc, int64_t status, int term_signal)
{
    exec_child *ch = proc->data;
    if (status != 0 || term_signal != 0) {
        ch->pl->srv->m.exec_failed++;
        LOG_WARN("alerts", "alert_exec command exited with status %lld (signal %d)",
                 (long long)status, term_signal);
    }
    uv_close((uv_handle_t *)proc, exec_closed);
}

static void run_exec(pipeline *pl, const pipeline_alert *a)
{
    const char *cmd = pl->srv->cfg->alert_exec;
    if (!cmd || !cmd[0])
        return;
    if (pl->children >= PIPELINE_MAX_CHILDREN) {
        pl->srv->m.exec_failed++;
        LOG_WARN("alerts", "alert_exec skipped: %u commands still running", pl->children);
        return;
    }
    char vars[8][320];
    snprintf(vars[0], sizeof vars[0], "ATTNSTAT_RUN=%s", a->run);
    snprintf(vars[1], sizeof vars[1], "ATTNSTAT_LAYER=%d", a->t.layer);
    snprintf(vars[2], sizeof vars[2], "ATTNSTAT_HEAD=%d", a->t.head);
    snprintf(vars[3], sizeof vars[3], "ATTNSTAT_STEP=%lld", (long long)a->t.step);
    snprintf(vars[4], sizeof vars[4], "ATTNSTAT_RULE=%s", alerts_rule_name(a->t.rule));
    snprintf(vars[5], sizeof vars[5], "ATTNSTAT_STATE=%s", alerts_state_name(a->t.state));
    snprintf(vars[6], sizeof vars[6], "ATTNSTAT_VALUE=%.17g", a->t.value);
    snprintf(vars[7], sizeof vars[7], "ATTNSTAT_THRESHOLD=%.17g", a->t.threshold);
    size_t nenv = 0;
    while (environ && environ[nenv])
        nenv++;
    char **env = malloc((nenv + 9) * sizeof *env);
    exec_child *ch = calloc(1, sizeof *ch);
    if (!env || !ch) {
        free(env);
        free(ch);
        pl->srv->m.exec_failed++;
        LOG_WARN("alerts", "alert_exec skipped: out of memory");
        return;
    }
    size_t k = 0;
    for (size_t i = 0; i < nenv; i++)
        if (strncmp(environ[i], "ATTNSTAT_", 9) != 0)
            env[k++] = environ[i];
    for (int i = 0; i < 8; i++)
        env[k++] = vars[i];
    env[k] = NULL;
    char *args[] = {"/bin/sh", "-c", (char *)cmd, NULL};
    uv_stdio_container_t stdio[3];
    stdio[0].flags = UV_IGNORE;
    stdio[1].flags = UV_INHERIT_FD;
    stdio[1].data.fd = 2; /* the command's output goes to the daemon's log */
    stdio[2].flags = UV_INHERIT_FD;
    stdio[2].data.fd = 2;
    uv_process_options_t opt;
    memset(&opt, 0, sizeof opt);
    opt.exit_cb = exec_exited;
    opt.file = "/bin/sh";
    opt.args = args;
    opt.env = env;
    opt.stdio = stdio;
    opt.stdio_count = 3;
    ch->pl = pl;
    ch->proc.data = ch;
    int rc = uv_spawn(pl->srv->loop, &ch->proc, &opt);
    free(env);
    if (rc != 0) {
        pl->srv->m.exec_failed++;
        LOG_WARN("alerts", "alert_exec: cannot start /bin/sh: %s", uv_strerror(rc));
        /* uv_spawn initialised the handle even on failure: it must be closed. */
        pl->children++;
        uv_close((uv_handle_t *)&ch->proc, exec_closed);
        return;
    }
    pl->children++;
    pl->srv->m.exec_started++;
}

static void deliver_alert(pipeline *pl, const pipeline_alert *a)
{
    server *srv = pl->srv;
    if (a->t.state == ALERTS_RAISED)
        srv->m.alerts_raised++;
    else
        srv->m.alerts_cleared++;
    LOG_WARN("alerts", "run '%s': %s", a->run, a->message);
    Attnstat__Alert al = ATTNSTAT__ALERT__INIT;
    al.run = (char *)a->run;
    al.run_id = a->t.run_id;
    al.has_rank = 1;
    al.rank = a->rank;
    al.layer = (uint32_t)a->t.layer;
    al.head = (uint32_t)a->t.head;
    al.step = a->t.step;
    al.rule = (Attnstat__AlertRule)a->t.rule;
    al.state = (Attnstat__AlertState)a->t.state;
    if (!isnan(a->t.value)) {
        al.has_value = 1;
        al.value = a->t.value;
    }
    if (!isnan(a->t.threshold)) {
        al.has_threshold = 1;
        al.threshold = a->t.threshold;
    }
    al.has_time_ms = 1;
    al.time_ms = a->time_ms;
    al.message = a->message[0] ? (char *)a->message : NULL;
    Attnstat__Envelope env = ATTNSTAT__ENVELOPE__INIT;
    env.msg_case = ATTNSTAT__ENVELOPE__MSG_ALERT;
    env.alert = &al;
    for (conn *c = srv->conns; c; c = c->next)
        if (c->sub_alerts && !c->closing)
            server_send(c, &env, 0);
    run_exec(pl, a);
}

/* ---- batch ---------------------------------------------------------------------------------- */

/* Feeds every head of p to the alert engine; appends the transitions to *ev. -1 on no memory. */
static int feed_alerts(pipeline *pl, const session_push *p, pipeline_alert **ev, size_t *n,
                       size_t *cap)
{
    int rc = 0;
    for (int32_t h = 0; h < p->job.prob.heads_q; h++) {
        alerts_transition tr[ALERTS_NRULES];
        int k = alerts_observe(pl->alerts, p->s->run_id, (int32_t)p->layer, h, p->step,
                               &p->job.heads[h], tr);
        if (k == ALERTS_OBSERVE_RUN_FULL || k == ALERTS_OBSERVE_FULL) {
            /* A limit, not a failure: the samples are stored, this head is not alerted on. Said
             * once per run (and, for the engine's limit, again at each power of two). */
            uint64_t run_n = alerts_refused(pl->alerts, p->s->run_id);
            uint64_t all_n = alerts_refused(pl->alerts, 0);
            alerts_limits lim;
            alerts_get_limits(pl->alerts, &lim);
            if (k == ALERTS_OBSERVE_RUN_FULL && run_n == 1)
                LOG_WARN("alerts", "run '%s' has more than %u distinct (layer, head) pairs "
                         "(max_heads_per_run): new ones, from layer %u head %d on, are stored but "
                         "not alerted on", p->s->run, lim.max_heads_per_run, p->layer, h);
            else if (k == ALERTS_OBSERVE_FULL && (run_n == 1 || (all_n & (all_n - 1)) == 0))
                LOG_WARN("alerts", "the alert engine holds its maximum of %u (layer, head) states: "
                         "new heads (run '%s' layer %u head %d; %llu refused so far) are stored but "
                         "not alerted on", lim.max_heads, p->s->run, p->layer, h,
                         (unsigned long long)all_n);
            continue;
        }
        if (k < 0) {
            rc = -1;
            continue;
        }
        for (int i = 0; i < k; i++) {
            if (*n == *cap) {
                size_t ncap = *cap ? *cap * 2 : 16;
                pipeline_alert *ne = realloc(*ev, ncap * sizeof *ne);
                if (!ne)
                    return -1;
                *ev = ne;
                *cap = ncap;
            }
            pipeline_alert *a = &(*ev)[(*n)++];
            a->t = tr[i];
            snprintf(a->run, sizeof a->run, "%s", p->s->run);
            a->rank = p->s->rank;
            a->time_ms = p->time_ms;
            alerts_format(&tr[i], a->message, sizeof a->message);
        }
    }
    return rc;
}

static void finish_push(pipeline *pl, session_push *p, Attnstat__Code code, const char *msg)
{
    server *srv = pl->srv;
    if (code == ATTNSTAT__CODE__OK) {
        srv->m.pushes_done++;
        Attnstat__HeadStats *hs = NULL;
        Attnstat__HeadStats **ptrs = NULL;
        int subscribers = 0;
        for (conn *c = srv->conns; c; c = c->next)
            subscribers |= c->sub_results && !c->closing;
        if (p->want_results || subscribers)
            ptrs = heads_pb(p, &hs);
        session_send_ack(p, code, NULL, p->want_results ? ptrs : NULL,
                         p->want_results && ptrs ? (size_t)p->job.prob.heads_q : 0);
        if (subscribers)
            send_result(pl, p, ptrs);
        free(ptrs);
        free(hs);
    } else {
        srv->m.failed++;
        session_send_ack(p, code, msg, NULL, 0);
    }
    session_push_free(p);
}

void pipeline_flush(pipeline *pl)
{
    server *srv = pl->srv;
    if (pl->timer_armed) {
        uv_timer_stop(&pl->timer);
        pl->timer_armed = 0;
    }
    if (pl->n == 0)
        return;
    session_push *list = pl->head;
    uint32_t n = pl->n;
    pl->head = pl->tail = NULL;
    pl->n = 0;

    pipeline_alert *events = NULL;
    size_t nevents = 0, capevents = 0;
    store_error se = {0, ""};
    int failed = 0;
    char failmsg[600] = "";
    uint64_t rows = 0;
    uint64_t t0 = worker_now_ns();

    /* 1. The samples, in one transaction. */
    for (session_push *p = list; p && !failed; p = p->next) {
        int32_t nh = p->job.prob.heads_q;
        p->code = ATTNSTAT__CODE__OK;
        store_status st = store_add_samples(srv->db, p->s->run_id, p->step, (int32_t)p->layer,
                                            p->job.heads, nh, p->time_ms, &se);
        if (st == STORE_EINVAL || st == STORE_NOTFOUND) {
            /* Refused before anything was written: the batch is intact, only this push fails. */
            p->code = ATTNSTAT__CODE__INTERNAL;
            snprintf(p->msg, sizeof p->msg, "not stored: %.240s", se.msg);
            LOG_ERROR("store", "push %llu of run '%s' not stored: %s", (unsigned long long)p->seq,
                      p->s->run, se.msg);
            continue;
        }
        if (st != STORE_OK) {
            failed = 1;
            snprintf(failmsg, sizeof failmsg, "not stored: %s", se.msg);
            break;
        }
        rows += (uint64_t)nh;
    }
    if (!failed && store_commit(srv->db, &se) != STORE_OK) {
        failed = 1;
        snprintf(failmsg, sizeof failmsg, "not stored: commit failed: %s", se.msg);
    }
    if (failed) {
        store_rollback(srv->db);
        srv->m.commit_failures++;
        LOG_ERROR("store", "batch of %u pushes rolled back: %s", n, failmsg);
    } else {
        srv->m.commits++;
        srv->m.samples_stored += rows;
        LOG_DEBUG("store", "committed %u pushes (%llu rows) in %.2f ms", n, (unsigned long long)rows,
                  (double)(worker_now_ns() - t0) / 1e6);
    }

    /* 2. Only samples that are stored reach the alert engine, so a rolled-back batch leaves every
     * head's state (streaks, raised alerts) as it was. The transitions are then recorded in a
     * transaction of their own, right after the samples': an alert row never exists without its
     * sample. Should that second commit fail, the transitions are still logged, sent to
     * subscribers and run through alert_exec; only the alerts table misses them (logged). */
    if (!failed) {
        for (session_push *p = list; p; p = p->next)
            if (p->code == ATTNSTAT__CODE__OK &&
                feed_alerts(pl, p, &events, &nevents, &capevents) != 0)
                LOG_ERROR("alerts", "alert engine: out of memory; alerts of this batch may be "
                          "missing");
        int afailed = 0;
        for (size_t i = 0; i < nevents && !afailed; i++) {
            store_alert sa = {
                .run_id = events[i].t.run_id,
                .layer = events[i].t.layer,
                .head = events[i].t.head,
                .step = events[i].t.step,
                .rule = alerts_rule_name(events[i].t.rule),
                .state = events[i].t.state == ALERTS_RAISED ? STORE_ALERT_RAISED : STORE_ALERT_CLEARED,
                .value = events[i].t.value,
                .threshold = events[i].t.threshold,
                .time_ms = events[i].time_ms,
                .message = events[i].message,
            };
            afailed = store_add_alert(srv->db, &sa, &se) != STORE_OK;
        }
        if (!afailed && nevents > 0 && store_commit(srv->db, &se) != STORE_OK)
            afailed = 1;
        if (afailed) {
            store_rollback(srv->db);
            srv->m.commit_failures++;
            LOG_ERROR("store", "%zu alert transitions not recorded in the alerts table (they are "
                      "still delivered): %s", nevents, se.msg);
        }
    }
    while (list) {
        session_push *p = list;
        list = p->next;
        p->next = NULL;
        if (failed)
            finish_push(pl, p, ATTNSTAT__CODE__INTERNAL, failmsg);
        else
            finish_push(pl, p, p->code, p->msg);
    }
    for (size_t i = 0; i < nevents; i++)
        deliver_alert(pl, &events[i]);
    free(events);
    server_maybe_finish(srv);
}

static void timer_cb(uv_timer_t *t)
{
    pipeline *pl = t->data;
    pl->timer_armed = 0;
    pipeline_flush(pl);
}

void pipeline_job_done(void *ctx, worker_job *job)
{
    server *srv = ctx;
    pipeline *pl = srv->pipe;
    session_push *p = (session_push *)job;
    session_push_unmap(p);
    if (p->s->c) {
        Attnstat__Release rel = ATTNSTAT__RELEASE__INIT;
        rel.seq = p->seq;
        Attnstat__Envelope env = ATTNSTAT__ENVELOPE__INIT;
        env.msg_case = ATTNSTAT__ENVELOPE__MSG_RELEASE;
        env.release = &rel;
        server_send(p->s->c, &env, 1);
    }
    if (job->status != STATS_OK) {
        char msg[400];
        snprintf(msg, sizeof msg, "not computed: %s", job->err.msg);
        LOG_WARN("worker", "push %llu of run '%s' failed: %s", (unsigned long long)p->seq, p->s->run,
                 job->err.msg);
        Attnstat__Code code = job->fail_code ? (Attnstat__Code)job->fail_code
                              : job->status == STATS_EINVAL ? ATTNSTAT__CODE__BAD_REQUEST
                                                            : ATTNSTAT__CODE__INTERNAL;
        finish_push(pl, p, code, msg);
        server_maybe_finish(srv);
        return;
    }
    p->next = NULL;
    if (pl->tail)
        pl->tail->next = p;
    else
        pl->head = p;
    pl->tail = p;
    pl->n++;
    if (pl->n >= PIPELINE_BATCH_MAX || pl->closing) {
        pipeline_flush(pl);
    } else if (!pl->timer_armed) {
        int rc = uv_timer_start(&pl->timer, timer_cb, srv->cfg->commit_ms, 0);
        if (rc != 0) {
            LOG_ERROR("store", "cannot arm the commit timer (%s): committing now", uv_strerror(rc));
            pipeline_flush(pl);
        } else {
            pl->timer_armed = 1;
        }
    }
}

uint32_t pipeline_pending(const pipeline *pl)
{
    return pl->n;
}

uint32_t pipeline_children(const pipeline *pl)
{
    return pl->children;
}

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

int pipeline_check_thresholds(pipeline *pl, const Attnstat__Thresholds *t, char *json,
                              size_t jsonlen, char *err, size_t errlen)
{
    alerts_config base, merged;
    alerts_overrides o;
    to_alerts_config(&pl->srv->cfg->thresholds, &base);
    to_overrides(t, &o);
    if (alerts_config_merge(&merged, &base, &o, err, errlen) != ALERTS_OK)
        return -1;
    alerts_config_format(&merged, json, jsonlen);
    return 0;
}

int pipeline_set_run(pipeline *pl, int64_t run_id, const Attnstat__Thresholds *t, char *err,
                     size_t errlen)
{
    alerts_overrides o;
    to_overrides(t, &o);
    return alerts_set_run(pl->alerts, run_id, &o, err, errlen) == ALERTS_OK ? 0 : -1;
}

/* ---- start-up: the alert engine takes back what the store says is raised --------------------- */

typedef struct {
    alerts_engine *e;
    size_t runs, alerts, skipped;
} restore_ctx;

/* A run's thresholds as pipeline_check_thresholds() wrote them (alerts_config_format(), then
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
static void pipeline_restore_alerts(pipeline *pl)
{
    store *db = pl->srv->db;
    if (!db)
        return;
    restore_ctx rc = {.e = pl->alerts};
    store_error se = {0, ""};
    if (store_list_runs(db, restore_run_cb, &rc, &se) != STORE_OK)
        LOG_WARN("alerts", "reading the runs' thresholds: %s", se.msg);
    se.msg[0] = '\0';
    if (store_alerts(db, 0, 1, restore_alert_cb, &rc, &se) != STORE_OK)
        LOG_WARN("alerts", "reading the active alerts: %s (they are not restored)", se.msg);
    if (rc.alerts || rc.skipped)
        LOG_INFO("alerts", "restored %zu active alert%s from the store (%zu not restored)",
                 rc.alerts, rc.alerts == 1 ? "" : "s", rc.skipped);
}

pipeline *pipeline_new(server *srv, char *err, size_t errlen)
{
    pipeline *pl = calloc(1, sizeof *pl);
    if (!pl) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    pl->srv = srv;
    alerts_config ac;
    to_alerts_config(&srv->cfg->thresholds, &ac);
    pl->alerts = alerts_new(&ac, err, errlen);
    if (!pl->alerts) {
        free(pl);
        return NULL;
    }
    alerts_limits lim;
    alerts_limits_default(&lim);
    lim.max_heads_per_run = (uint32_t)srv->cfg->max_heads_per_run;
    if (alerts_set_limits(pl->alerts, &lim, err, errlen) != ALERTS_OK) {
        alerts_free(pl->alerts);
        free(pl);
        return NULL;
    }
    pipeline_restore_alerts(pl);
    int rc = uv_timer_init(srv->loop, &pl->timer);
    if (rc != 0) {
        snprintf(err, errlen, "uv_timer_init: %s", uv_strerror(rc));
        alerts_free(pl->alerts);
        free(pl);
        return NULL;
    }
    pl->timer.data = pl;
    return pl;
}

static void pipeline_closed(uv_handle_t *h)
{
    pipeline *pl = h->data;
    alerts_free(pl->alerts);
    free(pl);
}

void pipeline_close(pipeline *pl)
{
    pl->closing = 1;
    pipeline_flush(pl);
    uv_close((uv_handle_t *)&pl->timer, pipeline_closed);
}

/* ---- status --------------------------------------------------------------------------------- */

void pipeline_send_status(pipeline *pl, conn *to)
{
    server *srv = pl->srv;
    Attnstat__StatusReply r = ATTNSTAT__STATUS_REPLY__INIT;
    r.daemon_version = (char *)ATTNSTAT_DAEMON_VERSION;
    r.has_uptime_s = 1;
    r.uptime_s = metrics_uptime_s(&srv->m);
    r.has_clients = 1;
    r.clients = srv->nconns;
    r.has_pushes = 1;
    r.pushes = srv->m.pushes;
    r.has_pushes_done = 1;
    r.pushes_done = srv->m.pushes_done;
    r.has_dropped = 1;
    r.dropped = srv->m.dropped;
    r.has_rejected = 1;
    r.rejected = srv->m.rejected;
    r.has_samples_stored = 1;
    r.samples_stored = srv->m.samples_stored;
    r.has_alerts_active = 1;
    r.alerts_active = (uint32_t)alerts_active(pl->alerts, 0, NULL, 0);
    r.has_push_rate = 1;
    r.push_rate = metrics_push_rate(&srv->m);
    r.db_path = (char *)srv->cfg->db_path;

    int nw = worker_pool_count(srv->pool);
    Attnstat__WorkerStatus ws[16], *wsp[16];
    worker_stats st[16];
    for (int i = 0; i < nw && i < 16; i++) {
        worker_pool_stats(srv->pool, i, &st[i]);
        attnstat__worker_status__init(&ws[i]);
        ws[i].name = (char *)st[i].name;
        ws[i].queue_depth = st[i].queue_depth;
        ws[i].queue_capacity = st[i].capacity;
        ws[i].has_processed = 1;
        ws[i].processed = st[i].processed;
        ws[i].has_dropped = 1;
        ws[i].dropped = st[i].dropped;
        ws[i].has_busy_frac = 1;
        ws[i].busy_frac = st[i].busy_frac;
        wsp[i] = &ws[i];
    }
    r.workers = wsp;
    r.n_workers = (size_t)(nw < 16 ? nw : 16);

    Attnstat__ClientStatus *cs = calloc(srv->nconns ? srv->nconns : 1, sizeof *cs);
    Attnstat__ClientStatus **csp = calloc(srv->nconns ? srv->nconns : 1, sizeof *csp);
    size_t n = 0;
    if (cs && csp) {
        for (conn *c = srv->conns; c && n < srv->nconns; c = c->next) {
            Attnstat__ClientStatus *x = &cs[n];
            attnstat__client_status__init(x);
            x->id = c->id;
            x->has_uid = 1;
            x->uid = (uint32_t)c->uid;
            x->has_pid = 1;
            x->pid = (int32_t)c->pid;
            if (c->sess) {
                session *s = c->sess;
                if (s->hello) {
                    x->run = s->run;
                    x->has_rank = 1;
                    x->rank = s->rank;
                    x->pid = s->pid;
                }
                x->has_pushes = 1;
                x->pushes = s->pushes;
                x->has_dropped = 1;
                x->dropped = s->dropped;
                x->has_rejected = 1;
                x->rejected = s->rejected;
            }
            csp[n] = x;
            n++;
        }
    }
    r.client_list = csp;
    r.n_client_list = n;
    Attnstat__Envelope env = ATTNSTAT__ENVELOPE__INIT;
    env.msg_case = ATTNSTAT__ENVELOPE__MSG_STATUS_REPLY;
    env.status_reply = &r;
    if (server_send(to, &env, 1) != 0) {
        r.client_list = NULL; /* too many clients for one frame: send the totals */
        r.n_client_list = 0;
        server_send(to, &env, 1);
    }
    free(cs);
    free(csp);
}

/* Appends to buf[*len..cap), keeping it NUL-terminated; stops quietly at the end. */
__attribute__((format(printf, 4, 5))) static void emit(char *buf, size_t cap, size_t *len,
                                                       const char *fmt, ...)
{
    if (*len + 1 >= cap)
        return;
    va_list ap;
    va_start(ap, fmt);
    int w = vsnprintf(buf + *len, cap - *len, fmt, ap);
    va_end(ap);
    if (w > 0)
        *len += (size_t)w < cap - *len ? (size_t)w : cap - *len - 1;
}

size_t pipeline_render_metrics(void *ctx, char *buf, size_t cap)
{
    server *srv = ctx;
    const metrics *m = &srv->m;
    size_t len = 0;
#define EMIT(...) emit(buf, cap, &len, __VA_ARGS__)
#define COUNTER(name, help, v)                                                                     \
    EMIT("# HELP attnstat_" name " " help "\n# TYPE attnstat_" name " counter\nattnstat_" name     \
         " %llu\n", (unsigned long long)(v))
    COUNTER("pushes_total", "Push messages received.", m->pushes);
    COUNTER("pushes_done_total", "Pushes stored and acknowledged.", m->pushes_done);
    COUNTER("pushes_dropped_total", "Pushes dropped (queue full).", m->dropped);
    COUNTER("pushes_rejected_total", "Pushes rejected by validation.", m->rejected);
    COUNTER("pushes_failed_total", "Pushes failed in compute or store.", m->failed);
    COUNTER("samples_stored_total", "Per-head rows committed.", m->samples_stored);
    COUNTER("commits_total", "Store transactions committed.", m->commits);
    COUNTER("commit_failures_total", "Store transactions rolled back.", m->commit_failures);
    COUNTER("alerts_raised_total", "Alert raises.", m->alerts_raised);
    COUNTER("alerts_cleared_total", "Alert clears.", m->alerts_cleared);
    COUNTER("messages_dropped_total", "Results/alerts not sent to slow subscribers.",
            m->messages_dropped);
    COUNTER("connections_total", "Connections accepted.", m->conns_accepted);
    COUNTER("connections_refused_total", "Connections refused.", m->conns_refused);
    COUNTER("frame_errors_total", "Connections closed on framing errors.", m->frame_errors);
    EMIT("# HELP attnstat_clients Connected clients.\n# TYPE attnstat_clients gauge\n"
         "attnstat_clients %u\n", srv->nconns);
    EMIT("# HELP attnstat_alerts_active Alerts raised and not cleared.\n"
         "# TYPE attnstat_alerts_active gauge\nattnstat_alerts_active %u\n",
         (uint32_t)alerts_active(srv->pipe->alerts, 0, NULL, 0));
    EMIT("# HELP attnstat_queue_depth Pushes queued or computing.\n"
         "# TYPE attnstat_queue_depth gauge\n");
    for (int i = 0; i < worker_pool_count(srv->pool); i++) {
        worker_stats st;
        worker_pool_stats(srv->pool, i, &st);
        EMIT("attnstat_queue_depth{worker=\"%s\"} %u\n", st.name, st.queue_depth);
    }
#undef COUNTER
#undef EMIT
    return len;
}
