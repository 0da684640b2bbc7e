/* command.c — an operator's requests (see command.h). Stage: beside the session; calls runs, life,
 * the alert feed, the storer, the store (on the store thread), peer, conn, envelope, counters,
 * util and log.
 *
 * One op per request, allocated here, carried through up to two store-thread phases: an action on
 * one alert (or one silence) first reads it (is it active, whose run is it: the loop then checks
 * the permission), then writes; an action on a run's alerts (or silences) reads and writes in one
 * phase (the run, and so the permission, is known from the start). Deleting a run is one op run
 * alone on the store thread again and again, one transaction of retain_budget samples each time,
 * until it is done.
 * The requesting peer is referenced until its reply is sent (or its connection is gone). */
#include "command.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "alerts_feed.h"
#include "conn.h"
#include "counters.h"
#include "envelope.h"
#include "life.h"
#include "log.h"
#include "runs.h"
#include "storer.h"
#include "store_read.h"
#include "store_retain.h"
#include "store_write.h"
#include "util.h"

#define CMD_RULE_MAX 32

/* An alert as the op keeps it (the store's strings copied). UNSILENCE keeps its silences so: the
 * key, the silence's id in a.id. */
typedef struct {
    store_alert a;
    char rule[CMD_RULE_MAX];
    int skipped;             /* ACK: acknowledged before, left as it was */
} cmd_alert;

typedef struct {
    storer_op op;
    const stage_ctx *x;
    peer *p;
    Attnstat__Command__Action action;
    int phase;               /* alert_id: 1 read, 2 write */
    uint32_t uid;
    int64_t alert_id, run_id, silence_id, until_ms, retain_ms, retain_bytes, now_ms;
    int keep_ms, keep_bytes; /* RETENTION: a limit the request leaves out stays as it is */
    int64_t budget;
    int done;                /* DELETE_RUN: the last transaction ran */
    cmd_alert *alerts;       /* the alerts acted on (UNSILENCE: the silences) */
    size_t n, cap;
    size_t skipped;          /* ACK: of them, acknowledged before (the first: first_ack) */
    store_alert first_ack;
    char msg[600];
} cmd;

static const char *action_name(Attnstat__Command__Action a)
{
    switch (a) {
    case ATTNSTAT__COMMAND__ACTION__ACK: return "ack";
    case ATTNSTAT__COMMAND__ACTION__RESOLVE: return "resolve";
    case ATTNSTAT__COMMAND__ACTION__SILENCE: return "silence";
    case ATTNSTAT__COMMAND__ACTION__DELETE_RUN: return "delete-run";
    case ATTNSTAT__COMMAND__ACTION__RETENTION: return "retention";
    case ATTNSTAT__COMMAND__ACTION__UNSILENCE: return "unsilence";
    case _ATTNSTAT__COMMAND__ACTION_IS_INT_SIZE: break;
    }
    return "?";
}

static void reply(peer *p, Attnstat__Code code, const char *msg, uint64_t count)
{
    if (!p->c)
        return;
    Attnstat__CommandReply r;
    Attnstat__Envelope env;
    conn_write(p->c, envelope_command_reply(&env, &r, code, msg, count), 1);
}

static void finish(cmd *c, Attnstat__Code code, const char *msg, uint64_t count)
{
    if (code == ATTNSTAT__CODE__OK)
        LOG_INFO("command", "uid %u: %s: %s", (unsigned)c->uid, action_name(c->action), msg);
    else
        LOG_WARN("command", "uid %u: %s refused: %s", (unsigned)c->uid, action_name(c->action), msg);
    reply(c->p, code, msg, count);
    peer_unref(c->p);
    free(c->alerts);
    free(c);
}

/* Root, the daemon's uid and the run's owner may act on it (runs_may_act); on a run with no owner
 * (recorded before owners were kept), root and the daemon's uid only. Else why not into buf. */
static int allowed(const run_entry *e, uid_t uid, char *buf, size_t len)
{
    if (runs_may_act(e, uid))
        return 1;
    if (e->has_owner)
        snprintf(buf, len, "run '%s', which belongs to uid %u: uid %u may not", e->name,
                 (unsigned)e->owner, (unsigned)uid);
    else
        snprintf(buf, len, "run '%s', recorded by an older attnstatd with no owner: only root "
                 "and attnstatd's uid %u may act on it; uid %u may not", e->name,
                 (unsigned)geteuid(), (unsigned)uid);
    return 0;
}

static int keep_alert(cmd *c, const store_alert *a)
{
    if (c->n == c->cap) {
        size_t ncap = c->cap ? c->cap * 2 : 8;
        cmd_alert *na = realloc(c->alerts, ncap * sizeof *na);
        if (!na)
            return 1;
        c->alerts = na;
        c->cap = ncap;
    }
    cmd_alert *k = &c->alerts[c->n++];
    k->a = *a;
    snprintf(k->rule, sizeof k->rule, "%s", a->rule ? a->rule : "");
    k->a.rule = k->rule;
    k->a.message = k->a.reason = NULL;
    k->skipped = 0;
    return 0;
}

static int keep_cb(void *ctx, const store_alert *a)
{
    return keep_alert(ctx, a);
}

/* A silence in force that the request names (its id, or any of its run), kept as an alert's key. */
static int keep_silence_cb(void *ctx, const store_silence *s)
{
    cmd *c = ctx;
    if (c->silence_id && s->id != c->silence_id)
        return 0;
    store_alert k = {.id = s->id, .run_id = s->run_id, .layer = s->layer, .head = s->head,
                     .rule = s->rule, .time_ms = s->time_ms, .has_uid = 1, .uid = s->uid};
    return keep_alert(c, &k);
}

/* RFC 3339 UTC of a Unix time in ms. */
static void cmd_time(char *buf, size_t len, int64_t ms)
{
    time_t t = (time_t)(ms / 1000);
    struct tm tm;
    if (!gmtime_r(&t, &tm) || !strftime(buf, len, "%Y-%m-%dT%H:%M:%SZ", &tm))
        snprintf(buf, len, "%lld ms", (long long)ms);
}

/* store_get_run(): the run's own limits, into the request's limits it leaves as they are. */
static int keep_limits_cb(void *ctx, const store_run *r)
{
    cmd *c = ctx;
    if (c->keep_ms)
        c->retain_ms = r->retain_ms;
    if (c->keep_bytes)
        c->retain_bytes = r->retain_bytes;
    return 0;
}

/* ---- the store thread ----------------------------------------------------------------------- */

/* One alert, active (checked again in this transaction), marked. An acknowledgement stays the
 * first one's: acknowledged again, the alert is left as it is and the reply says who was first. */
static store_status act_on(void *db, cmd *c, cmd_alert *k, store_error *err)
{
    const store_alert *a = &k->a;
    switch (c->action) {
    case ATTNSTAT__COMMAND__ACTION__ACK:
        if (a->acked) {
            k->skipped = 1;
            if (!c->skipped++)
                c->first_ack = *a;
            return STORE_OK;
        }
        return store_ack_alert(db, a->id, c->uid, c->now_ms, err);
    case ATTNSTAT__COMMAND__ACTION__SILENCE: {
        store_silence s = {.run_id = a->run_id, .layer = a->layer, .head = a->head,
                           .rule = a->rule, .uid = c->uid, .time_ms = c->now_ms,
                           .until_ms = c->until_ms};
        return store_add_silence(db, &s, NULL, err);
    }
    case ATTNSTAT__COMMAND__ACTION__RESOLVE: {
        char msg[200];
        snprintf(msg, sizeof msg, "%s resolved by uid %u (raised at step %lld)", a->rule,
                 (unsigned)c->uid, (long long)a->step);
        store_alert r = {.run_id = a->run_id, .layer = a->layer, .head = a->head,
                         .step = a->step, .rule = a->rule, .state = STORE_ALERT_RESOLVED,
                         .value = NAN, .threshold = NAN, .time_ms = c->now_ms, .message = msg,
                         .reason = "operator", .has_uid = 1, .uid = c->uid};
        return store_add_alert(db, &r, err);
    }
    default:
        break;
    }
    return STORE_EINVAL;
}

static store_status cmd_run(void *db, storer_op *op, store_error *err)
{
    cmd *c = (cmd *)op;
    store_status st;
    switch (c->action) {
    case ATTNSTAT__COMMAND__ACTION__DELETE_RUN:
        return store_delete_run(db, c->run_id, c->budget, &c->done, err);
    case ATTNSTAT__COMMAND__ACTION__RETENTION:
        st = c->keep_ms || c->keep_bytes ? store_get_run(db, c->run_id, keep_limits_cb, c, err)
                                          : STORE_OK;
        if (st == STORE_OK)
            st = store_run_set_retention(db, c->run_id, c->retain_ms, c->retain_bytes, err);
        return st;
    case ATTNSTAT__COMMAND__ACTION__UNSILENCE:
        /* phase 1 (one silence): which run; then (or for a run) those in force end now */
        c->n = 0;
        st = store_silences(db, c->phase == 1 ? 0 : c->run_id, c->now_ms, keep_silence_cb, c,
                            err);
        if (st != STORE_OK || c->phase == 1 || !c->n)
            return st;
        return store_end_silences(db, c->run_id, c->silence_id, c->now_ms, NULL, err);
    default:
        break;
    }
    if (c->alert_id && c->phase == 1)
        return store_active_alert(db, c->alert_id, keep_cb, c, err);
    if (c->alert_id) { /* phase 2: still active? then marked */
        c->n = 0;
        st = store_active_alert(db, c->alert_id, keep_cb, c, err);
        if (st == STORE_OK && c->n == 1)
            st = act_on(db, c, &c->alerts[0], err);
        return st;
    }
    c->n = 0;
    st = store_alerts(db, c->run_id, 1, keep_cb, c, err);
    for (size_t i = 0; st == STORE_OK && i < c->n; i++)
        st = act_on(db, c, &c->alerts[i], err);
    return st;
}

/* ---- the loop ------------------------------------------------------------------------------- */

static void cmd_done(storer_op *op);

static void submit(cmd *c, storer_mode mode)
{
    memset(&c->op, 0, sizeof c->op);
    c->op.mode = mode;
    c->op.run = cmd_run;
    c->op.done = cmd_done;
    storer_submit(c->x->st, &c->op);
}

static Attnstat__Code code_of(store_status st)
{
    return st == STORE_EINVAL || st == STORE_NOTFOUND ? ATTNSTAT__CODE__BAD_REQUEST
                                                      : ATTNSTAT__CODE__INTERNAL;
}

static const char *mark_word(feed_mark what)
{
    return what == FEED_ACK           ? "acknowledged"
           : what == FEED_SILENCE     ? "silenced"
           : what == FEED_UNSILENCE   ? "unsilenced"
                                      : "resolved";
}

/* An UNSILENCE's reply: the silences that ended (their keys' transitions are delivered again). */
static void unsilence_msg(cmd *c)
{
    if (c->silence_id && c->n == 1) {
        const store_alert *k = &c->alerts[0].a;
        snprintf(c->msg, sizeof c->msg, "silence %lld ended: %s of run %lld layer %d head %d is "
                 "delivered again (watchers, --alert-exec)", (long long)c->silence_id, k->rule,
                 (long long)k->run_id, (int)k->layer, (int)k->head);
    } else {
        snprintf(c->msg, sizeof c->msg, "%zu silence%s of run %lld ended%s", c->n,
                 c->n == 1 ? "" : "s", (long long)c->run_id,
                 c->n ? "" : " (none was in force: see attnstat alerts silences)");
    }
}

static void alerts_done(cmd *c)
{
    const stage_ctx *x = c->x;
    feed_mark what = c->action == ATTNSTAT__COMMAND__ACTION__ACK         ? FEED_ACK
                     : c->action == ATTNSTAT__COMMAND__ACTION__SILENCE   ? FEED_SILENCE
                     : c->action == ATTNSTAT__COMMAND__ACTION__UNSILENCE ? FEED_UNSILENCE
                                                                          : FEED_RESOLVE;
    run_entry *e = runs_get(x->runs, c->run_id);
    for (size_t i = 0; i < c->n; i++)
        if (!c->alerts[i].skipped)
            alerts_feed_mark(x->feed, what, &c->alerts[i].a, c->uid, c->until_ms,
                             e ? e->name : "?", e ? e->rank : 0);
    alerts_feed_deliver(x->feed);
    size_t done = c->n - c->skipped;
    char first[160] = "";
    if (c->skipped) {
        char t[48];
        cmd_time(t, sizeof t, c->first_ack.ack_ms);
        snprintf(first, sizeof first, "by uid %u at %s", (unsigned)c->first_ack.ack_uid, t);
    }
    if (what == FEED_UNSILENCE) {
        if (c->silence_id && !c->n) { /* it ended between the two phases */
            snprintf(c->msg, sizeof c->msg, "silence %lld is no longer in force",
                     (long long)c->silence_id);
            finish(c, ATTNSTAT__CODE__BAD_REQUEST, c->msg, 0);
            return;
        }
        unsilence_msg(c);
    } else if (c->alert_id && c->skipped) {
        snprintf(c->msg, sizeof c->msg, "alert %lld was acknowledged already, %s: left as it was",
                 (long long)c->alert_id, first);
    } else if (c->alert_id) {
        snprintf(c->msg, sizeof c->msg, "alert %lld %s", (long long)c->alert_id, mark_word(what));
    } else {
        int n = snprintf(c->msg, sizeof c->msg, "%zu active alert%s of run %lld %s", done,
                         done == 1 ? "" : "s", (long long)c->run_id, mark_word(what));
        if (c->skipped && n > 0 && (size_t)n < sizeof c->msg)
            snprintf(c->msg + n, sizeof c->msg - (size_t)n, "; %zu acknowledged already, left as "
                     "they were (the first: alert %lld, %s)", c->skipped,
                     (long long)c->first_ack.id, first);
    }
    finish(c, ATTNSTAT__CODE__OK, c->msg, done);
}

/* A limit as the reply says it: ms or bytes, < 0 the daemon's, 0 none. */
static void limit_text(char *buf, size_t len, int64_t v, int is_ms)
{
    if (v < 0)
        snprintf(buf, len, "attnstatd's %s", is_ms ? "retain_days" : "retain_bytes");
    else if (v == 0)
        snprintf(buf, len, "none");
    else if (is_ms)
        snprintf(buf, len, "%g days", (double)v / 86400000.0);
    else
        snprintf(buf, len, "%lld bytes", (long long)v);
}

static void cmd_done(storer_op *op)
{
    cmd *c = (cmd *)op;
    const stage_ctx *x = c->x;
    if (op->status != STORE_OK) {
        if (c->action == ATTNSTAT__COMMAND__ACTION__DELETE_RUN) {
            run_entry *e = runs_get(x->runs, c->run_id);
            if (e)
                runs_ended(e); /* a Hello may take it again; a delete may be tried again */
        }
        finish(c, code_of(op->status), op->err.msg, 0);
        return;
    }
    switch (c->action) {
    case ATTNSTAT__COMMAND__ACTION__DELETE_RUN: {
        if (!c->done) {
            submit(c, STORER_ALONE); /* the next transaction, after what waits */
            return;
        }
        run_entry *e = runs_get(x->runs, c->run_id);
        snprintf(c->msg, sizeof c->msg, "run '%s' rank %d (id %lld) deleted", e ? e->name : "?",
                 e ? (int)e->rank : 0, (long long)c->run_id);
        if (e)
            runs_remove(x->runs, e);
        finish(c, ATTNSTAT__CODE__OK, c->msg, 1);
        return;
    }
    case ATTNSTAT__COMMAND__ACTION__RETENTION: {
        run_entry *e = runs_get(x->runs, c->run_id);
        char age[64], size[64];
        limit_text(age, sizeof age, c->retain_ms, 1);
        limit_text(size, sizeof size, c->retain_bytes, 0);
        snprintf(c->msg, sizeof c->msg, "run '%s' rank %d (id %lld): age limit %s (full "
                 "resolution that long), size limit %s", e ? e->name : "?", e ? (int)e->rank : 0,
                 (long long)c->run_id, age, size);
        finish(c, ATTNSTAT__CODE__OK, c->msg, 1);
        return;
    }
    default:
        break;
    }
    if ((c->alert_id || c->silence_id) && c->phase == 1) {
        const char *what = c->alert_id ? "alert" : "silence";
        if (c->silence_id && c->n != 1) {
            snprintf(c->msg, sizeof c->msg, "no silence %lld in force (it ended, or there is none "
                     "with that id: see attnstat alerts silences)", (long long)c->silence_id);
            finish(c, ATTNSTAT__CODE__BAD_REQUEST, c->msg, 0);
            return;
        }
        run_entry *e = c->n == 1 ? runs_get(x->runs, c->alerts[0].a.run_id) : NULL;
        if (!e) {
            snprintf(c->msg, sizeof c->msg, "the %s's run is gone", what);
            finish(c, ATTNSTAT__CODE__BAD_REQUEST, c->msg, 0);
            return;
        }
        char why[400];
        if (!allowed(e, c->uid, why, sizeof why)) {
            snprintf(c->msg, sizeof c->msg, "%s %lld is of %s %s it", what,
                     (long long)(c->alert_id ? c->alert_id : c->silence_id), why,
                     action_name(c->action));
            finish(c, ATTNSTAT__CODE__PERMISSION, c->msg, 0);
            return;
        }
        c->run_id = e->id;
        c->phase = 2;
        submit(c, STORER_BATCHED);
        return;
    }
    alerts_done(c);
}

void command_handle(const stage_ctx *x, peer *p, const Attnstat__Command *m)
{
    char msg[600];
    cmd *c = calloc(1, sizeof *c);
    if (!c) {
        reply(p, ATTNSTAT__CODE__INTERNAL, "out of memory", 0);
        return;
    }
    peer_ref(p);
    c->x = x;
    c->p = p;
    c->action = m->action;
    c->uid = (uint32_t)p->uid;
    c->alert_id = m->has_alert_id ? m->alert_id : 0;
    c->run_id = m->has_run_id ? m->run_id : 0;
    c->until_ms = m->has_until_ms ? m->until_ms : 0;
    c->silence_id = m->has_silence_id ? m->silence_id : 0;
    c->keep_ms = !m->has_retain_ms;
    c->keep_bytes = !m->has_retain_bytes;
    c->retain_ms = m->has_retain_ms ? m->retain_ms : -1;
    c->retain_bytes = m->has_retain_bytes ? m->retain_bytes : -1;
    c->now_ms = (int64_t)util_wall_ms();
    c->budget = (int64_t)x->cfg->retain_budget;
    int on_alerts = m->action == ATTNSTAT__COMMAND__ACTION__ACK ||
                    m->action == ATTNSTAT__COMMAND__ACTION__RESOLVE ||
                    m->action == ATTNSTAT__COMMAND__ACTION__SILENCE;
    int unsilence = m->action == ATTNSTAT__COMMAND__ACTION__UNSILENCE;
    if (!on_alerts && !unsilence && m->action != ATTNSTAT__COMMAND__ACTION__DELETE_RUN &&
        m->action != ATTNSTAT__COMMAND__ACTION__RETENTION) {
        snprintf(msg, sizeof msg, "unknown command action %d", (int)m->action);
        finish(c, ATTNSTAT__CODE__BAD_REQUEST, msg, 0);
        return;
    }
    if (on_alerts && (c->alert_id > 0) == (c->run_id > 0)) {
        finish(c, ATTNSTAT__CODE__BAD_REQUEST, "name one alert (alert_id) or one run (run_id)", 0);
        return;
    }
    if (m->action == ATTNSTAT__COMMAND__ACTION__SILENCE && c->until_ms != 0 &&
        c->until_ms <= c->now_ms) {
        finish(c, ATTNSTAT__CODE__BAD_REQUEST, "until_ms is not in the future", 0);
        return;
    }
    if (unsilence && (c->silence_id > 0) == (c->run_id > 0)) {
        finish(c, ATTNSTAT__CODE__BAD_REQUEST, "name one silence (silence_id) or one run (run_id)",
               0);
        return;
    }
    if ((on_alerts && c->alert_id) || (unsilence && c->silence_id)) {
        c->phase = 1;
        submit(c, STORER_BATCHED);
        return;
    }
    run_entry *e = c->run_id > 0 ? runs_get(x->runs, c->run_id) : NULL;
    if (!e) {
        snprintf(msg, sizeof msg, "no run with id %lld (see attnstat runs)", (long long)c->run_id);
        finish(c, ATTNSTAT__CODE__BAD_REQUEST, msg, 0);
        return;
    }
    char why[400];
    if (!allowed(e, p->uid, why, sizeof why)) {
        snprintf(msg, sizeof msg, "%s %s it", why, action_name(m->action));
        finish(c, ATTNSTAT__CODE__PERMISSION, msg, 0);
        return;
    }
    if (m->action == ATTNSTAT__COMMAND__ACTION__RETENTION) {
        if (c->retain_ms < -1 || c->retain_bytes < -1) {
            finish(c, ATTNSTAT__CODE__BAD_REQUEST, "retain_ms and retain_bytes are >= -1", 0);
            return;
        }
        submit(c, STORER_ALONE);
        return;
    }
    if (m->action == ATTNSTAT__COMMAND__ACTION__DELETE_RUN) {
        if (e->state == RUN_DELETING) {
            snprintf(msg, sizeof msg, "run '%s' is being deleted already", e->name);
            finish(c, ATTNSTAT__CODE__BUSY, msg, 0);
            return;
        }
        if (e->conns > 0) {
            snprintf(msg, sizeof msg, "run '%s' rank %d has %u connected client%s: stop its job "
                     "first (a run is deleted only when nothing writes to it)", e->name,
                     (int)e->rank, e->conns, e->conns == 1 ? "" : "s");
            finish(c, ATTNSTAT__CODE__BUSY, msg, 0);
            return;
        }
        if (e->state == RUN_LIVE || e->state == RUN_ORPHAN)
            life_end(x, e, "deleted");
        e->state = RUN_DELETING;
        submit(c, STORER_ALONE);
        return;
    }
    submit(c, STORER_BATCHED); /* every active alert of the run */
}
