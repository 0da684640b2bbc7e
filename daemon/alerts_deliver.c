/* alerts_deliver.c — an alert transition to the log, the subscribers and --alert-exec (see
 * alerts_deliver.h). Stage: alert delivery; calls alerts (rule and state names), clients,
 * envelope, counters and log.
 *
 * --alert-exec: /bin/sh -c COMMAND, stdin ignored, stdout and stderr to the daemon's log, the
 * daemon's environment without its ATTNSTAT_* variables plus the alert's; at most
 * DELIVER_MAX_CHILDREN run at once. The transitions that come while they run wait in one queue of
 * alert_exec_queue items (a pool allocated at the first), kept per run in arrival order, and are
 * started one at a time, a turn each: the uid served least recently first, then its run served
 * least recently (runs and uids with nothing queued hold no entry: one that comes back is served
 * before those that never stopped). A full queue makes room for a newcomer whose uid holds fewer
 * items than the uid holding the most (else, within its uid, whose run holds fewer than that uid's
 * largest run): the newest item of the largest one is dropped; otherwise the newcomer is. Each drop
 * is counted (attnstat_alert_exec_dropped_total) and logged (the first, then at each power of
 * two): one uid's flood cannot crowd out another's alerts, nor one run another's of the same uid.
 * Runs and uids with queued items are at most alert_exec_queue: they are searched linearly. */
#include "alerts_deliver.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "envelope.h"
#include "log.h"

#define DELIVER_MAX_CHILDREN 16
#define DQ_NONE UINT32_MAX

extern char **environ;

typedef struct {
    feed_alert a;
    uint32_t next;           /* the next item of its run, or of the free list */
} dq_item;

typedef struct {
    int64_t run_id;
    uint32_t uid;
    uint32_t head, tail, n;  /* its items, oldest first */
    uint64_t served;         /* the turn it last had one started (0: not since it queued) */
} dq_run;

typedef struct {
    uint32_t uid, n;
    uint64_t served;
} dq_uid;

struct alerts_deliver {
    uv_loop_t *loop;
    const cfg *cfg;
    counters *cnt;
    clients *reg;
    uint32_t children;       /* --alert-exec commands running */
    dq_item *items;          /* the queue's pool (cap items), allocated at its first use */
    uint32_t cap, nq, free_head;
    dq_run *runs;            /* runs with queued items */
    dq_uid *uids;            /* uids with queued items */
    uint32_t nruns, nuids;
    uint64_t turn, dropped;
    int stopped;             /* the daemon stops: nothing more is started */
};

typedef struct {
    uv_process_t proc;
    alerts_deliver *d;
} exec_child;

static void pump(alerts_deliver *d);

alerts_deliver *alerts_deliver_new(uv_loop_t *loop, const cfg *c, counters *cnt, clients *reg)
{
    alerts_deliver *d = calloc(1, sizeof *d);
    if (!d)
        return NULL;
    d->loop = loop;
    d->cfg = c;
    d->cnt = cnt;
    d->reg = reg;
    d->cap = c->alert_exec_queue ? (uint32_t)c->alert_exec_queue : 1;
    return d;
}

void alerts_deliver_free(alerts_deliver *d)
{
    if (!d)
        return;
    free(d->items);
    free(d->runs);
    free(d->uids);
    free(d);
}

void alerts_deliver_stop(alerts_deliver *d)
{
    if (d->stopped)
        return;
    d->stopped = 1;
    if (d->nq == 0)
        return;
    counters_add(d->cnt, CNT_EXEC_DROPPED, d->nq);
    LOG_WARN("alerts", "the daemon stops: %u queued alert transition%s not given to alert_exec "
             "(they are in the alerts table)", d->nq, d->nq == 1 ? "" : "s");
    d->nq = 0;
    d->nruns = d->nuids = 0;
}

uint32_t alerts_deliver_queued(const alerts_deliver *d)
{
    return d->nq;
}

static void exec_closed(uv_handle_t *h)
{
    exec_child *ch = h->data;
    alerts_deliver *d = ch->d;
    d->children--;
    free(ch);
    pump(d);
}

static void exec_exited(uv_process_t *proc, int64_t status, int term_signal)
{
    exec_child *ch = proc->data;
    if (status != 0 || term_signal != 0) {
        counters_inc(ch->d->cnt, CNT_EXEC_FAILED);
        LOG_WARN("alerts", "alert_exec command exited with status %lld (signal %d)",
                 (long long)status, term_signal);
    }
    uv_close((uv_handle_t *)proc, exec_closed);
}

static void run_exec(alerts_deliver *d, const feed_alert *a)
{
    const char *cmd = d->cfg->alert_exec;
    if (!cmd || !cmd[0])
        return; /* alert_exec was emptied (a reload) meanwhile */
    char vars[9][320];
    snprintf(vars[0], sizeof vars[0], "ATTNSTAT_RUN=%s", a->run);
    snprintf(vars[1], sizeof vars[1], "ATTNSTAT_LAYER=%d", a->t.layer);
    snprintf(vars[2], sizeof vars[2], "ATTNSTAT_HEAD=%d", a->t.head);
    snprintf(vars[3], sizeof vars[3], "ATTNSTAT_STEP=%lld", (long long)a->t.step);
    snprintf(vars[4], sizeof vars[4], "ATTNSTAT_RULE=%s", alerts_rule_name(a->t.rule));
    snprintf(vars[5], sizeof vars[5], "ATTNSTAT_STATE=%s", alerts_state_name(a->t.state));
    snprintf(vars[6], sizeof vars[6], "ATTNSTAT_VALUE=%.17g", a->t.value);
    snprintf(vars[7], sizeof vars[7], "ATTNSTAT_THRESHOLD=%.17g", a->t.threshold);
    snprintf(vars[8], sizeof vars[8], "ATTNSTAT_REASON=%s", a->reason);
    size_t nenv = 0;
    while (environ && environ[nenv])
        nenv++;
    char **env = malloc((nenv + 10) * sizeof *env);
    exec_child *ch = calloc(1, sizeof *ch);
    if (!env || !ch) {
        free(env);
        free(ch);
        counters_inc(d->cnt, CNT_EXEC_FAILED);
        LOG_WARN("alerts", "alert_exec skipped: out of memory");
        return;
    }
    size_t k = 0;
    for (size_t i = 0; i < nenv; i++)
        if (strncmp(environ[i], "ATTNSTAT_", 9) != 0)
            env[k++] = environ[i];
    for (int i = 0; i < 9; i++)
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
    ch->d = d;
    ch->proc.data = ch;
    int rc = uv_spawn(d->loop, &ch->proc, &opt);
    free(env);
    if (rc != 0) {
        counters_inc(d->cnt, CNT_EXEC_FAILED);
        LOG_WARN("alerts", "alert_exec: cannot start /bin/sh: %s", uv_strerror(rc));
        /* uv_spawn initialised the handle even on failure: it must be closed. */
        d->children++;
        uv_close((uv_handle_t *)&ch->proc, exec_closed);
        return;
    }
    d->children++;
    counters_inc(d->cnt, CNT_EXEC_STARTED);
}

/* ---- the queue of --alert-exec ------------------------------------------------------------- */

static dq_uid *uid_find(alerts_deliver *d, uint32_t uid)
{
    for (uint32_t i = 0; i < d->nuids; i++)
        if (d->uids[i].uid == uid)
            return &d->uids[i];
    return NULL;
}

static dq_run *run_find(alerts_deliver *d, int64_t run_id)
{
    for (uint32_t i = 0; i < d->nruns; i++)
        if (d->runs[i].run_id == run_id)
            return &d->runs[i];
    return NULL;
}

/* The pool and the tables, at the first use. -1 on no memory. */
static int queue_alloc(alerts_deliver *d)
{
    if (d->items)
        return 0;
    d->items = malloc((size_t)d->cap * sizeof *d->items);
    d->runs = malloc((size_t)d->cap * sizeof *d->runs);
    d->uids = malloc((size_t)d->cap * sizeof *d->uids);
    if (!d->items || !d->runs || !d->uids) {
        free(d->items);
        free(d->runs);
        free(d->uids);
        d->items = NULL;
        d->runs = NULL;
        d->uids = NULL;
        return -1;
    }
    for (uint32_t i = 0; i < d->cap; i++)
        d->items[i].next = i + 1 < d->cap ? i + 1 : DQ_NONE;
    d->free_head = 0;
    return 0;
}

/* One item fewer for run r (and its uid): entries left empty go. */
static void run_lost_one(alerts_deliver *d, dq_run *r)
{
    dq_uid *u = uid_find(d, r->uid);
    d->nq--;
    if (u && --u->n == 0)
        *u = d->uids[--d->nuids];
    if (--r->n == 0)
        *r = d->runs[--d->nruns];
}

/* The newest item of run r is dropped (to make room for another uid's or run's). */
static void drop_newest(alerts_deliver *d, dq_run *r)
{
    uint32_t prev = DQ_NONE, i = r->head;
    while (d->items[i].next != DQ_NONE && i != r->tail) {
        prev = i;
        i = d->items[i].next;
    }
    if (prev == DQ_NONE)
        r->head = DQ_NONE;
    else
        d->items[prev].next = DQ_NONE;
    r->tail = prev;
    d->items[i].next = d->free_head;
    d->free_head = i;
    run_lost_one(d, r);
}

/* The run holding the most items, of uid (or of any uid when all). */
static dq_run *largest_run(alerts_deliver *d, uint32_t uid, int all)
{
    dq_run *big = NULL;
    for (uint32_t i = 0; i < d->nruns; i++)
        if ((all || d->runs[i].uid == uid) && (!big || d->runs[i].n > big->n))
            big = &d->runs[i];
    return big;
}

static void say_dropped(alerts_deliver *d, const char *run, uint32_t uid, const char *why)
{
    d->dropped++;
    counters_inc(d->cnt, CNT_EXEC_DROPPED);
    if ((d->dropped & (d->dropped - 1)) == 0)
        LOG_WARN("alerts", "alert_exec: %u commands running and alert_exec_queue (%u) full: a "
                 "transition of run '%s' (uid %u) dropped, %s (%llu dropped so far; every one is "
                 "in the alerts table)", d->children, d->cap, run, (unsigned)uid, why,
                 (unsigned long long)d->dropped);
}

/* Room for a transition of run_id (of uid) in a full queue: 1 when an item of a larger share was
 * dropped for it, 0 when it is the one to drop. */
static int make_room(alerts_deliver *d, uint32_t uid, int64_t run_id)
{
    dq_uid *u = uid_find(d, uid), *big = NULL;
    uint32_t un = u ? u->n : 0;
    for (uint32_t i = 0; i < d->nuids; i++)
        if (!big || d->uids[i].n > big->n)
            big = &d->uids[i];
    dq_run *victim = NULL;
    if (big && big->uid != uid && big->n > un + 1) {
        victim = largest_run(d, big->uid, 0);
    } else if (u) {
        dq_run *r = run_find(d, run_id), *bigr = largest_run(d, uid, 0);
        if (bigr && bigr->run_id != run_id && bigr->n > (r ? r->n : 0) + 1)
            victim = bigr;
    }
    if (!victim)
        return 0;
    say_dropped(d, d->items[victim->tail].a.run, victim->uid,
                "the newest of the run holding the most, for another run's");
    drop_newest(d, victim);
    return 1;
}

/* Queues a (a copy) for --alert-exec, or drops it (counted, said). */
static void enqueue(alerts_deliver *d, const feed_alert *a)
{
    if (d->stopped || queue_alloc(d) != 0) {
        say_dropped(d, a->run, a->owner, d->stopped ? "the daemon stops" : "out of memory");
        return;
    }
    /* a run queued keeps the uid it was queued for (an ownerless run claimed meanwhile) */
    const dq_run *was = run_find(d, a->t.run_id);
    uint32_t uid = was ? was->uid : a->owner;
    if (d->nq == d->cap && !make_room(d, uid, a->t.run_id)) {
        say_dropped(d, a->run, uid, "its own share (uid and run) being the largest");
        return;
    }
    dq_run *r = run_find(d, a->t.run_id); /* again: make_room may have moved the entries */
    if (!r) {
        r = &d->runs[d->nruns++];
        *r = (dq_run){a->t.run_id, uid, DQ_NONE, DQ_NONE, 0, 0};
    }
    dq_uid *u = uid_find(d, uid);
    if (!u) {
        u = &d->uids[d->nuids++];
        *u = (dq_uid){uid, 0, 0};
    }
    uint32_t i = d->free_head;
    d->free_head = d->items[i].next;
    d->items[i].a = *a;
    d->items[i].next = DQ_NONE;
    if (r->tail == DQ_NONE)
        r->head = i;
    else
        d->items[r->tail].next = i;
    r->tail = i;
    r->n++;
    u->n++;
    d->nq++;
}

/* Starts queued commands while fewer than DELIVER_MAX_CHILDREN run: a turn each, the uid served
 * least recently first, then its run served least recently. */
static void pump(alerts_deliver *d)
{
    while (!d->stopped && d->nq > 0 && d->children < DELIVER_MAX_CHILDREN) {
        dq_uid *u = NULL;
        for (uint32_t k = 0; k < d->nuids; k++)
            if (!u || d->uids[k].served < u->served)
                u = &d->uids[k];
        dq_run *r = NULL;
        for (uint32_t k = 0; k < d->nruns; k++)
            if (d->runs[k].uid == u->uid && (!r || d->runs[k].served < r->served))
                r = &d->runs[k];
        uint32_t i = r->head;
        r->head = d->items[i].next;
        if (r->head == DQ_NONE)
            r->tail = DQ_NONE;
        u->served = r->served = ++d->turn;
        feed_alert a = d->items[i].a;
        d->items[i].next = d->free_head;
        d->free_head = i;
        run_lost_one(d, r);
        run_exec(d, &a);
    }
}

void alerts_deliver_one(void *data, const feed_alert *a)
{
    alerts_deliver *d = data;
    counters_inc(d->cnt, a->t.state == ALERTS_RAISED    ? CNT_ALERTS_RAISED
                         : a->t.state == ALERTS_CLEARED ? CNT_ALERTS_CLEARED
                                                        : CNT_ALERTS_RESOLVED);
    if (a->silenced) {
        LOG_INFO("alerts", "run '%s': %s (silenced: not sent to watchers or alert_exec)", a->run,
                 a->message);
        return;
    }
    LOG_WARN("alerts", "run '%s': %s", a->run, a->message);
    Attnstat__Alert al;
    Attnstat__Envelope env;
    envelope_alert(&env, &al, a->run, a->t.run_id, (uint32_t)a->t.layer, (uint32_t)a->t.head,
                   a->t.step, (Attnstat__AlertRule)a->t.rule, (Attnstat__AlertState)a->t.state);
    al.has_rank = 1;
    al.rank = a->rank;
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
    al.reason = a->reason[0] ? (char *)a->reason : NULL;
    clients_broadcast(d->reg, &env, CLIENTS_ALERTS);
    if (!d->cfg->alert_exec || !d->cfg->alert_exec[0])
        return;
    enqueue(d, a);
    pump(d);
}
