/* loop.c — attnstatd's event loop (see loop.h): start-up, the wiring of the stages, signals and
 * orderly shutdown. Stage: the loop, the only file that knows every stage; no stage calls it.
 *
 * The wiring, all of it here. A stage is handed what follows it as a callback or a hook:
 *   listen  -> loop: added / admitted (a registry entry and a client; the session as the
 *              connection's handler)
 *   conn    -> session_handle(): each decoded message of an admitted client (a Hello or a
 *              Subscribe once it has a slot: admit_message(), admit.h)
 *   session -> push_receive() -> worker queue (push.h: the object that carries a push)
 *   worker  -> loop (the pool's done callback): push_computed() (Release), then batch_add()
 *   batch   -> the store thread (storer.h: every write of the daemon, group commit; its idle work
 *              is the retention step, retain.h) -> loop (the storer's drained hook: batch_drained)
 *   batch   -> loop (hooks): stored -> life_touch() (the run is active), alerts_feed_batch() and
 *              headtab_observe() (the per-head metrics); answer -> push_answer() (Ack, and the
 *              Result to subscribers); done -> alerts_feed_deliver() -> (once recorded) on_alert:
 *              headtab_alert(), alerts_deliver_one()
 *   conn closed -> life_detach() (the run waits run_grace_ms for its client, or ends at once after
 *              a Goodbye); the tick -> life_check() (runs whose time has come end: alerts resolved)
 *   a scrape -> headtab_sweep() (the heads of runs that ended or were deleted leave the page), then
 *              the text of every stage (render_metrics)
 * A push's path, as push.h draws it: conn -> session -> push (validate, buffers) -> worker ->
 * batch -> store -> alerts feed -> alert delivery, the Release and the Ack sent by the push's own
 * steps at the hops above.
 *
 * Start-up: the database (its directory, its lock, its mode, the store, the check: dbfile.h, the
 * runs: runs.h), the stages (the alert feed restores from the store on this thread before the store
 * thread starts and owns the handle), then the socket. SIGHUP: the settings read again (on_hup).
 *
 * Shutdown (SIGINT/SIGTERM): stop accepting and reading; wait for queued pushes to finish, be
 * committed and acknowledged; shut each connection down after its writes drain (or after a grace
 * period); then stop the workers and the store thread (it commits what it holds) and close every
 * handle in its close callback. uv_run() then returns because nothing is left, and the loop closes
 * cleanly. Runs are not ended by a shutdown: their clients reconnect to the next daemon.
 *
 * The service manager (notify.h) is told READY=1 once every stage serves and STOPPING=1 when the
 * shutdown begins. */
#include "loop.h"

#include <errno.h>
#include <grp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>
#include <uv.h>

#include "admit.h"
#include "alerts_deliver.h"
#include "alerts_feed.h"
#include "batch.h"
#include "clients.h"
#include "conn.h"
#include "counters.h"
#include "ctx.h"
#include "dbfile.h"
#include "devices.h"
#include "headtab.h"
#include "life.h"
#include "listen.h"
#include "log.h"
#include "metrics.h"
#include "metrics_runs.h"
#include "names.h"
#include "notify.h"
#include "peer.h"
#include "push.h"
#include "reload.h"
#include "retain.h"
#include "runs.h"
#include "session.h"
#include "storer.h"
#include "store_read.h"
#include "store_write.h"
#include "util.h"

/* SQLite's primary result codes for a damaged file (the store's error carries them; the daemon
 * names no SQLite type). */
#define LOOP_SQLITE_CORRUPT 11
#define LOOP_SQLITE_NOTADB 26

typedef struct {
    cfg *cfg;                /* written by a SIGHUP reload only (config.h) */
    uv_loop_t *loop;
    uv_signal_t sig_int, sig_term, sig_hup;
    uv_timer_t grace_timer;  /* bounds the shutdown */
    uv_timer_t tick;         /* once a second: housekeeping */
    uv_timer_t life_timer;   /* a run to end at once (its last connection said Goodbye) */
    int handles;             /* the signals and timers were initialised */
    stage_ctx x;                   /* what the stages share */
    listener *lis;
    batch *bat;
    alerts_deliver *out;
    metrics_http *metrics_http;
    headtab *heads;          /* the per-head metrics (NULL: no metrics port) */
    reload *reload;          /* SIGHUP's reader of the config files (reload.h) */
    uint32_t ticks;          /* of the housekeeping timer */
    dbfile_locks locks;      /* the database's locks (dbfile.h) */
    int draining_done;       /* queued work finished; connections are closing */
    int torn_down;           /* workers stopped, handles closing */
} attnstatd;

static void maybe_finish(attnstatd *d);

/* ---- connections: listen -> registry -> session --------------------------------------------- */

static void on_message(void *data, conn *c, const Attnstat__Envelope *env)
{
    clients_entry *e = data;
    attnstatd *d = e->owner;
    (void)c;
    if (e->p && admit_message(&d->x, e, env))
        session_handle(&d->x, e->p, env);
}

/* A run whose last connection said Goodbye ends now, outside of that connection's callbacks. */
static void on_life_timer(uv_timer_t *t)
{
    attnstatd *d = t->data;
    life_check(&d->x);
}

/* Half-closed with pushes in flight: kept open until they are answered (maybe_finish). */
static int on_eof(void *data, conn *c)
{
    clients_entry *e = data;
    (void)c;
    return e->p && e->p->inflight > 0;
}

static void on_close(void *data, conn *c)
{
    clients_entry *e = data;
    attnstatd *d = e->owner;
    (void)c;
    if (e->p && e->p->hello && life_detach(&d->x, e->p->run_id, e->p->goodbye) && d->handles &&
        !d->torn_down)
        uv_timer_start(&d->life_timer, on_life_timer, 0, 0); /* after this callback */
    if (e->p) {
        peer_detach(e->p);
        e->p = NULL;
    }
    clients_remove(d->x.reg, e);
}

static void on_closed(void *data)
{
    clients_entry *e = data;
    attnstatd *d = e->owner;
    clients_entry_free(e);
    maybe_finish(d);
}

static const conn_handler conn_to_session = {on_message, on_eof, on_close, on_closed};

static void on_added(void *data, conn *c)
{
    attnstatd *d = data;
    clients_entry *e = clients_add(d->x.reg, c, d);
    if (!e) {
        conn_close(c, "out of memory");
        return;
    }
    conn_set_handler(c, &conn_to_session, e);
}

static void on_admitted(void *data, conn *c, int reserve)
{
    attnstatd *d = data;
    clients_entry *e = conn_data(c);
    e->p = peer_new(d->cfg, c);
    if (!e->p) {
        conn_close(c, "out of memory");
        return;
    }
    if (reserve)
        peer_reserve(e->p);
    conn_read_start(c);
}

static void on_count(void *data, uid_t uid, listen_counts *n)
{
    attnstatd *d = data;
    clients_tally(d->x.reg, uid, &n->admitted, &n->of_uid, &n->lingering, &n->reserve);
}

/* ---- pushes: worker -> batch -> alerts feed, Acks, delivery ------------------------------- */

static void on_job_done(void *data, worker_job *job)
{
    attnstatd *d = data;
    push *u = push_of_job(job);
    if (push_computed(u) != 0) {
        maybe_finish(d);
        return;
    }
    if (d->bat) {
        life_before_push(&d->x, push_item(u)->run_id);
        batch_add(d->bat, push_item(u));
    }
    else
        push_answer(u, ATTNSTAT__CODE__INTERNAL, "not stored: the daemon is stopping", NULL, NULL);
}

static void on_stored(void *data, batch_item *const *items, const Attnstat__Code *codes, size_t n)
{
    attnstatd *d = data;
    int64_t last = 0;
    for (size_t i = 0; i < n; i++)
        if (codes[i] == ATTNSTAT__CODE__OK && items[i]->run_id != last)
            life_touch(&d->x, last = items[i]->run_id);
    alerts_feed_batch(d->x.feed, items, codes, n);
    if (!d->heads)
        return;
    int64_t now = (int64_t)util_wall_ms();
    for (size_t i = 0; i < n; i++)
        if (codes[i] == ATTNSTAT__CODE__OK)
            headtab_observe(d->heads, items[i]->run, items[i]->run_id, items[i]->layer,
                            items[i]->head_base, items[i]->heads, items[i]->nheads, items[i]->step,
                            now);
}

/* The alert feed's sink: the per-head metrics see each transition, then it is delivered. */
static void on_alert(void *data, const feed_alert *a)
{
    attnstatd *d = data;
    if (d->heads)
        headtab_alert(d->heads, a->run, a->t.layer, a->t.head, (int)a->t.rule,
                      a->t.state == ALERTS_RAISED, (int64_t)util_wall_ms());
    alerts_deliver_one(d->out, a);
}

static void on_store_drained(void *data)
{
    attnstatd *d = data;
    if (d->bat)
        batch_drained(d->bat);
}

static void on_result(void *data, const Attnstat__Envelope *env)
{
    attnstatd *d = data;
    clients_broadcast(d->x.reg, env, CLIENTS_RESULTS);
}

static void on_answer(void *data, batch_item *it, Attnstat__Code code, const char *msg)
{
    attnstatd *d = data;
    int subscribers = clients_any_subscribed(d->x.reg, CLIENTS_RESULTS);
    push_answer(push_of_item(it), code, msg, subscribers ? on_result : NULL, d);
}

static void on_batch_done(void *data)
{
    attnstatd *d = data;
    alerts_feed_deliver(d->x.feed);
    maybe_finish(d);
}

/* headtab's question (headtab_live_fn): is the process run_id, or any process of run, live? */
typedef struct {
    const char *name;
    int live;
} name_live;

static void any_live(void *ctx, run_entry *e)
{
    name_live *q = ctx;
    if (!q->live && (e->state == RUN_LIVE || e->state == RUN_ORPHAN) && !strcmp(e->name, q->name))
        q->live = 1;
}

static int head_run_live(void *ctx, const char *run, int64_t run_id)
{
    runs *rs = ctx;
    if (run_id > 0) {
        const run_entry *e = runs_get(rs, run_id);
        return e && (e->state == RUN_LIVE || e->state == RUN_ORPHAN);
    }
    name_live q = {run, 0};
    runs_each(rs, any_live, &q);
    return q.live;
}

static void render_metrics(void *data, metrics_buf *out)
{
    attnstatd *d = data;
    if (d->heads) /* the heads of runs that ended leave this scrape */
        headtab_sweep(d->heads, head_run_live, d->x.runs);
    uint32_t n = 0, cap = clients_count(d->x.reg);
    metrics_client *cl = cap ? calloc(cap, sizeof *cl) : NULL;
    for (clients_entry *e = clients_first(d->x.reg); cl && e && n < cap; e = e->next) {
        if (!e->p || !e->p->hello)
            continue;
        /* a run that ended (idle, its client still connected) leaves this scrape too */
        const run_entry *re = runs_get(d->x.runs, e->p->run_id);
        if (!re || (re->state != RUN_LIVE && re->state != RUN_ORPHAN))
            continue;
        cl[n++] = (metrics_client){e->p->run, e->p->rank, e->p->has_layout, e->p->layout};
    }
    metrics_render(out, d->x.cnt, clients_count(d->x.reg), alerts_feed_active(d->x.feed),
                   devices_pool(d->x.dev), cl, n);
    free(cl);
    metrics_render_exporter(out, devices_count(d->x.dev));
    if (d->heads)
        headtab_render(d->heads, (headtab_mode)headtab_mode_from(d->cfg->metrics_heads),
                       (uint32_t)d->cfg->metrics_top, out);
    metrics_render_runs(out, &d->x);
    metrics_printf(out, "# HELP attnstat_alert_exec_queued Alert transitions waiting for an "
                   "alert_exec command (alert_exec_queue at most).\n"
                   "# TYPE attnstat_alert_exec_queued gauge\nattnstat_alert_exec_queued %u\n",
                   alerts_deliver_queued(d->out));
}

/* ---- shutdown ------------------------------------------------------------------------------- */

static void noop_closed(uv_handle_t *h)
{
    (void)h;
}

static void close_handle(uv_handle_t *h)
{
    if (!uv_is_closing(h))
        uv_close(h, noop_closed);
}

static void start_teardown(attnstatd *d)
{
    if (d->torn_down)
        return;
    d->torn_down = 1;
    LOG_INFO("server", "stopping workers and closing");
    if (d->x.dev)
        devices_close(d->x.dev); /* delivers whatever finished; the batch hands it on */
    if (d->x.st)
        storer_close(d->x.st); /* commits and answers everything it holds */
    if (d->out)
        alerts_deliver_stop(d->out); /* what waits for alert_exec is dropped, said */
    if (d->bat) {
        batch_free(d->bat);
        d->bat = NULL;
    }
    if (d->handles) {
        close_handle((uv_handle_t *)&d->sig_int);
        close_handle((uv_handle_t *)&d->sig_term);
        close_handle((uv_handle_t *)&d->sig_hup);
        close_handle((uv_handle_t *)&d->grace_timer);
        close_handle((uv_handle_t *)&d->tick);
        close_handle((uv_handle_t *)&d->life_timer);
    }
    metrics_http_stop(d->metrics_http);
    d->metrics_http = NULL;
    reload_close(d->reload); /* a read still under way is abandoned */
    d->reload = NULL;
}

static void maybe_finish(attnstatd *d)
{
    /* Half-closed clients whose pushes are all answered. */
    for (clients_entry *e = clients_first(d->x.reg), *next; e; e = next) {
        next = e->next;
        if (conn_half_closed(e->c) && (!e->p || e->p->inflight == 0))
            conn_close_after_flush(e->c, "end of stream");
    }
    if (!d->x.stopping || d->torn_down)
        return;
    if (!d->draining_done) {
        if (worker_pool_busy(devices_pool(d->x.dev)) > 0)
            return;
        if (d->bat && batch_pending(d->bat) > 0)
            return; /* the store thread is at it: its answers call back here */
        d->draining_done = 1;
        LOG_INFO("server", "queued work finished and committed; closing %u connections",
                 clients_count(d->x.reg));
        for (clients_entry *e = clients_first(d->x.reg), *next; e; e = next) {
            next = e->next;
            conn_close_after_flush(e->c, "daemon shutting down");
        }
    }
    if (clients_count(d->x.reg) == 0)
        start_teardown(d);
}

static void begin_shutdown(attnstatd *d, const char *why)
{
    if (d->x.stopping)
        return;
    d->x.stopping = 1;
    LOG_INFO("server", "%s: shutting down (finishing %u queued pushes)", why,
             worker_pool_busy(devices_pool(d->x.dev)));
    char nerr[300];
    if (notify_send("STOPPING=1", nerr, sizeof nerr) < 0)
        LOG_WARN("server", "%s", nerr);
    listen_close(d->lis);
    d->lis = NULL;
    for (clients_entry *e = clients_first(d->x.reg); e; e = e->next)
        conn_read_stop(e->c);
    maybe_finish(d);
}

static void grace_expired(uv_timer_t *t)
{
    attnstatd *d = t->data;
    LOG_WARN("server", "shutdown grace of %llu ms is over (shutdown_grace_ms): closing %u "
             "connections now", (unsigned long long)d->cfg->shutdown_grace_ms,
             clients_count(d->x.reg));
    d->draining_done = 1;
    for (clients_entry *e = clients_first(d->x.reg), *next; e; e = next) {
        next = e->next;
        conn_close(e->c, "daemon shutting down (grace over)");
    }
    start_teardown(d);
}

/* SIGHUP, second half, on the loop: the config files' texts (read by reload.c's thread) parsed
 * with the flags over them; what may change live changes, each change logged (config.c); a file
 * that no longer parses, or could not be read, changes nothing. */
static void on_reloaded(void *data, const char *const *texts, size_t n, const char *why)
{
    attnstatd *d = data;
    char err[600], nerr[300];
    int changed = why ? -1 : cfg_reload(d->cfg, texts, n, err, sizeof err);
    if (changed < 0) {
        LOG_ERROR("config", "reload failed, settings unchanged: %s", why ? why : err);
    } else {
        log_set_level(d->cfg->log_level);
        if (d->x.feed && alerts_feed_reload(d->x.feed, err, sizeof err) != 0)
            LOG_ERROR("config", "reload: the alert engine refused the thresholds: %s", err);
        if (d->x.ret)
            retain_set_policy(d->x.ret, d->cfg);
        LOG_INFO("config", "reload done: %d setting%s changed", changed, changed == 1 ? "" : "s");
    }
    if (notify_send("READY=1\nSTATUS=serving (settings reloaded)", nerr, sizeof nerr) < 0)
        LOG_WARN("server", "%s", nerr);
}

/* SIGHUP, first half: the config files are read on reload.c's thread (a FIFO or a file system
 * that hangs must not stop the loop); on_reloaded() applies them. */
static void on_hup(uv_signal_t *h, int signum)
{
    attnstatd *d = h->data;
    (void)signum;
    char err[600], state[96], nerr[300];
    /* systemd (ExecReload=kill -HUP): RELOADING=1 with the monotonic time, READY=1 when done. */
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    snprintf(state, sizeof state, "RELOADING=1\nMONOTONIC_USEC=%llu",
             (unsigned long long)now.tv_sec * 1000000ull + (unsigned long long)now.tv_nsec / 1000);
    if (notify_send(state, nerr, sizeof nerr) < 0)
        LOG_WARN("server", "%s", nerr);
    LOG_INFO("config", "SIGHUP: reading the settings again (%s)",
             d->cfg->config_path ? d->cfg->config_path : "no --config file: the flags only");
    const char *paths[32];
    size_t n = cfg_config_files(d->cfg, paths, sizeof paths / sizeof paths[0]);
    if (n == 0) {
        on_reloaded(d, NULL, 0, NULL);
        return;
    }
    if (!d->reload || reload_start(d->reload, paths, n, err, sizeof err) != 0) {
        LOG_ERROR("config", "reload failed, settings unchanged: %s",
                  d->reload ? err : "no reader (out of memory at start)");
        if (notify_send("READY=1\nSTATUS=serving (reload failed)", nerr, sizeof nerr) < 0)
            LOG_WARN("server", "%s", nerr);
    }
}

static void on_signal(uv_signal_t *h, int signum)
{
    attnstatd *d = h->data;
    if (d->x.stopping) {
        LOG_WARN("server", "signal %d again: still waiting for queued work (grace %llu ms)", signum,
                 (unsigned long long)d->cfg->shutdown_grace_ms);
        return;
    }
    int rc = uv_timer_start(&d->grace_timer, grace_expired, d->cfg->shutdown_grace_ms, 0);
    if (rc != 0)
        LOG_ERROR("server", "cannot arm the shutdown grace timer: %s", uv_strerror(rc));
    begin_shutdown(d, signum == SIGINT ? "SIGINT" : "SIGTERM");
}

/* Once a second: the connections' deadlines (admit_sweep: their slots freed), the runs whose time
 * has come, the per-head metrics' old keys; repeated log lines held back are summed up. */
static void on_tick(uv_timer_t *t)
{
    attnstatd *d = t->data;
    const cfg *c = d->cfg;
    admit_sweep(&d->x, util_mono_ns());
    life_check(&d->x);
    if (d->heads && ++d->ticks % 10 == 0) {
        headtab_expire(d->heads, (int64_t)util_wall_ms(), (int64_t)c->metrics_stale_s * 1000);
        headtab_sweep(d->heads, head_run_live, d->x.runs); /* their memory, between scrapes */
    }
    log_flush();
}

/* ---- start-up ------------------------------------------------------------------------------- */

static void walk_report(uv_handle_t *h, void *arg)
{
    (void)arg;
    LOG_ERROR("server", "handle of type %s still open at exit (closing: %d)",
              uv_handle_type_name(uv_handle_get_type(h)), uv_is_closing(h));
}

/* Every registered shm buffer keeps its fd (the workers fstat it to catch a shrunk segment before
 * reading), so the daemon needs about max_clients x (max_buffers + 1) descriptors: raise the soft
 * limit to the hard one, and say so when even that is short. */
static void raise_fd_limit(const cfg *c)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0) {
        LOG_WARN("server", "getrlimit(RLIMIT_NOFILE): %s", strerror(errno));
        return;
    }
    rlim_t old = rl.rlim_cur;
    if (rl.rlim_cur != rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        if (setrlimit(RLIMIT_NOFILE, &rl) != 0) {
            LOG_WARN("server", "cannot raise the open-file limit from %llu to %llu: %s",
                     (unsigned long long)old, (unsigned long long)rl.rlim_max, strerror(errno));
            rl.rlim_cur = old;
        }
    }
    unsigned long long need = (unsigned long long)c->max_clients * (c->max_buffers + 1) + 64;
    if (rl.rlim_cur != RLIM_INFINITY && (unsigned long long)rl.rlim_cur < need)
        LOG_WARN("server", "open-file limit %llu is under the %llu that max_clients %llu x "
                 "(max_buffers %llu + 1) may need: registrations past it will be refused (raise "
                 "LimitNOFILE / ulimit -Hn, or lower max_clients / max_buffers)",
                 (unsigned long long)rl.rlim_cur, need, (unsigned long long)c->max_clients,
                 (unsigned long long)c->max_buffers);
    else
        LOG_INFO("server", "open-file limit %llu (was %llu)", (unsigned long long)rl.rlim_cur,
                 (unsigned long long)old);
}

/* The per-head metrics start with the alerts the store holds raised (a restart keeps them on
 * /metrics); each is keyed by its run's name. */
typedef struct {
    attnstatd *d;
    int64_t run_id;
    char run[PEER_RUN_MAX];
} restore_ctx;

static int restore_run_name(void *ctx, const store_run *r)
{
    restore_ctx *rc = ctx;
    snprintf(rc->run, sizeof rc->run, "%s", r->name);
    return 1;
}

static int restore_head_alert(void *ctx, const store_alert *a)
{
    restore_ctx *rc = ctx;
    if (a->run_id != rc->run_id) {
        rc->run_id = a->run_id;
        rc->run[0] = '\0';
        store_error se = {0, ""};
        store_get_run(rc->d->x.db, a->run_id, restore_run_name, rc, &se);
    }
    int rule = names_alert_rule_from(a->rule);
    if (rc->run[0] && rule)
        headtab_alert(rc->d->heads, rc->run, a->layer, a->head, rule, 1, (int64_t)util_wall_ms());
    return 0;
}

static void start_headtab(attnstatd *d)
{
    const cfg *c = d->cfg;
    if (!c->metrics_port)
        return;
    d->heads = headtab_new((uint32_t)c->metrics_max_heads);
    if (!d->heads) {
        LOG_ERROR("server", "out of memory for the per-head metrics: /metrics has the counters only");
        return;
    }
    restore_ctx rc = {d, 0, ""};
    store_error se = {0, ""};
    if (d->x.db && store_alerts(d->x.db, 0, 1, restore_head_alert, &rc, &se) != STORE_OK)
        LOG_WARN("server", "reading the raised alerts for /metrics: %s (they show again at their "
                 "next transition)", se.msg);
}

/* The stages after the store, wired: workers, batch, alert feed and delivery. 0, or -1 with what
 * failed logged (what was made is closed by the teardown). */
static int start_stages(attnstatd *d)
{
    const cfg *c = d->cfg;
    char err[600];
    start_headtab(d);
    d->out = alerts_deliver_new(d->loop, c, d->x.cnt, d->x.reg);
    if (!d->out) {
        LOG_ERROR("server", "alerts: out of memory");
        return -1;
    }
    /* The feed restores from the store on this thread, before the store thread owns the handle. */
    d->x.feed = alerts_feed_new(c, d->x.db, d->x.runs, d->x.cnt, on_alert, d, err, sizeof err);
    if (!d->x.feed) {
        LOG_ERROR("server", "alerts: %s", err);
        return -1;
    }
    d->x.ret = retain_new(d->x.db, c);
    if (!d->x.ret) {
        LOG_ERROR("server", "retention: out of memory");
        return -1;
    }
    storer_db sdb = storer_db_of(d->x.db);
    sdb.idle = retain_idle;
    sdb.idle_ctx = d->x.ret;
    storer_opts so = {c->commit_ms, 0, c->retain_interval_ms};
    d->x.st = storer_new(d->loop, &sdb, &so, on_store_drained, d, err, sizeof err);
    if (!d->x.st) {
        LOG_ERROR("server", "store thread: %s", err);
        return -1;
    }
    alerts_feed_start(d->x.feed, d->x.st);
    d->x.dev = devices_new(d->loop, c, on_job_done, d, err, sizeof err);
    if (!d->x.dev) {
        LOG_ERROR("server", "workers: %s", err);
        return -1;
    }
    batch_hooks hooks = {on_stored, on_answer, on_batch_done};
    d->bat = batch_new(d->x.st, batch_add_samples, &hooks, d, d->x.cnt, err, sizeof err);
    if (!d->bat) {
        LOG_ERROR("server", "batch: %s", err);
        return -1;
    }
    return 0;
}

/* Signals, timers, the metrics endpoint and, last, the socket: once a client can connect, every
 * part of the daemon is up. 0, or -1 (logged). */
static int start_serving(attnstatd *d)
{
    const cfg *c = d->cfg;
    char err[600];
    uv_signal_init(d->loop, &d->sig_int);
    uv_signal_init(d->loop, &d->sig_term);
    uv_signal_init(d->loop, &d->sig_hup);
    uv_timer_init(d->loop, &d->grace_timer);
    uv_timer_init(d->loop, &d->tick);
    uv_timer_init(d->loop, &d->life_timer);
    d->handles = 1;
    d->sig_int.data = d->sig_term.data = d->sig_hup.data = d;
    d->grace_timer.data = d->tick.data = d->life_timer.data = d;
    int rc;
    if ((rc = uv_signal_start(&d->sig_int, on_signal, SIGINT)) != 0 ||
        (rc = uv_signal_start(&d->sig_term, on_signal, SIGTERM)) != 0 ||
        (rc = uv_signal_start(&d->sig_hup, on_hup, SIGHUP)) != 0 ||
        (rc = uv_timer_start(&d->tick, on_tick, 1000, 1000)) != 0) {
        LOG_ERROR("server", "signal/timer setup: %s", uv_strerror(rc));
        return -1;
    }
    uv_unref((uv_handle_t *)&d->tick);
    uv_unref((uv_handle_t *)&d->sig_hup);
    d->reload = reload_new(d->loop, on_reloaded, d); /* NULL: logged; a SIGHUP then says so */
    if (c->metrics_port) {
        d->metrics_http = metrics_http_start(d->loop, c->metrics_bind, (int)c->metrics_port,
                                             c->metrics_timeout_ms, render_metrics, d, err,
                                             sizeof err);
        if (!d->metrics_http) {
            LOG_ERROR("server", "%s", err);
            return -1;
        }
        int v6 = strchr(c->metrics_bind, ':') != NULL;
        LOG_INFO("server", "metrics on http://%s%s%s:%llu/metrics (per-head series: %s)",
                 v6 ? "[" : "", c->metrics_bind, v6 ? "]" : "", (unsigned long long)c->metrics_port,
                 c->metrics_heads);
    }
    if (listen_start(d->lis, err, sizeof err) != 0) {
        LOG_ERROR("server", "%s", err);
        return -1;
    }
    return 0;
}

/* The database, in order: its directory, the file and its mode, the locks (one daemon per
 * database file), the store (schema, migrations), the check at start, the runs' owners. 0, or -1
 * (logged). */
static int open_database(attnstatd *d)
{
    const cfg *c = d->cfg;
    char err[1400];
    if (util_mkdir_parents(c->db_path, err, sizeof err) != 0) {
        LOG_ERROR("server", "database: %s", err);
        return -1;
    }
    struct group gr, *res = NULL;
    char gbuf[4096];
    int have_gid = c->allow_group && c->allow_group[0] &&
                   getgrnam_r(c->allow_group, &gr, gbuf, sizeof gbuf, &res) == 0 && res;
    if (dbfile_prepare(c->db_path, have_gid, have_gid ? gr.gr_gid : 0, err, sizeof err) != 0 ||
        dbfile_lock(c->db_path, &d->locks, err, sizeof err) != 0) {
        LOG_ERROR("server", "%s", err);
        return -1;
    }
    store_error se = {0, ""};
    store_options so = STORE_OPTIONS_DEFAULT;
    so.durability = strcmp(c->durability, "full") == 0 ? STORE_SYNC_FULL : STORE_SYNC_NORMAL;
    so.checkpoint_pages = (int64_t)c->checkpoint_pages;
    d->x.db = store_open_ex(c->db_path, &so, &se);
    if (!d->x.db) {
        int primary = se.code & 0xff;
        if (primary == LOOP_SQLITE_CORRUPT || primary == LOOP_SQLITE_NOTADB)
            LOG_ERROR("server", "the database %s is damaged and cannot be opened: %s. Move it aside "
                      "(with its -wal and -shm files) and start again for a new one, or restore a "
                      "copy ('sqlite3 %s .recover' may save what is readable)", c->db_path, se.msg,
                      c->db_path);
        else
            LOG_ERROR("server", "cannot open the database %s: %s", c->db_path, se.msg);
        return -1;
    }
    LOG_INFO("server", "database %s (schema version %d, durability %s: %s)", c->db_path,
             store_schema_version(), c->durability,
             so.durability == STORE_SYNC_FULL
                 ? "an acknowledged sample survives a power loss; one fsync per commit"
                 : "an acknowledged sample survives a crash of attnstatd, not always a power loss");
    if (dbfile_check(d->x.db, c->db_path, c->db_check, err, sizeof err) != 0) {
        LOG_ERROR("server", "%s", err);
        return -1;
    }
    if (runs_load(d->x.runs, d->x.db, util_mono_ns(), err, sizeof err) != 0) {
        LOG_ERROR("server", "%s", err);
        return -1;
    }
    return 0;
}

int loop_run(cfg *c)
{
    char err[600];
    attnstatd *d = calloc(1, sizeof *d);
    counters *cnt = counters_new();
    clients *reg = clients_new();
    runs *rs = runs_new();
    if (!d || !cnt || !reg || !rs) {
        LOG_ERROR("server", "out of memory");
        free(d);
        counters_free(cnt);
        clients_free(reg);
        runs_free(rs);
        return 1;
    }
    d->cfg = c;
    d->x.cfg = c;
    d->x.cnt = cnt;
    d->x.reg = reg;
    d->x.runs = rs;
    d->locks = (dbfile_locks)DBFILE_LOCKS_NONE;
    dbfile_umask(c);
    raise_fd_limit(c);
    int exit_code = 1;
    /* The loop is on the heap, not on this stack: when shutdown leaves a worker thread behind (see
     * worker_pool_close), the loop is deliberately kept, neither closed nor freed, so that its
     * memory and wake-up descriptor stay valid for as long as that thread can exist. The thread
     * is built never to touch it once abandoned; keeping the loop makes that a second line of
     * defence rather than the only one, while shutdown still commits and closes the store and
     * returns normally (an _exit would skip the exit handlers and flushing of everything else). */
    uv_loop_t *loopp = malloc(sizeof *loopp);
    if (!loopp) {
        LOG_ERROR("server", "out of memory for the event loop");
        goto out_free;
    }
    int rc = uv_loop_init(loopp);
    if (rc != 0) {
        LOG_ERROR("server", "uv_loop_init: %s", uv_strerror(rc));
        free(loopp);
        goto out_free;
    }
    d->loop = loopp;

    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = SIG_IGN;
    if (sigaction(SIGPIPE, &sa, NULL) != 0)
        LOG_WARN("server", "cannot ignore SIGPIPE: %s", strerror(errno));

    clients_set_filter(reg, admit_may_see, rs);
    listen_hooks lh = {on_added, on_admitted, on_count};
    d->lis = listen_new(loopp, c, cnt, &lh, d, err, sizeof err);
    if (!d->lis) {
        LOG_ERROR("server", "%s", err);
        goto out_loop;
    }
    if (open_database(d) != 0) {
        if (d->x.db) {
            store_close(d->x.db);
            d->x.db = NULL;
        }
        goto out_loop;
    }

    if (start_stages(d) != 0 || start_serving(d) != 0)
        goto out_teardown;
    LOG_INFO("server", "attnstatd %s ready (pid %d, cpu worker queue %llu, max_frame %llu)",
             ATTNSTAT_DAEMON_VERSION, (int)getpid(), (unsigned long long)c->queue_depth,
             (unsigned long long)c->max_frame);
    char state[700], nerr[300];
    snprintf(state, sizeof state, "READY=1\nSTATUS=serving on %s\nMAINPID=%d", c->socket_path,
             (int)getpid());
    if (notify_send(state, nerr, sizeof nerr) < 0)
        LOG_WARN("server", "%s", nerr);
    exit_code = 0;
    uv_run(loopp, UV_RUN_DEFAULT);
    goto out_store;

out_teardown:
    d->x.stopping = 1;
    d->draining_done = 1;
    listen_close(d->lis);
    d->lis = NULL;
    start_teardown(d);
    uv_run(loopp, UV_RUN_DEFAULT);
out_store:
    storer_free(d->x.st);
    retain_free(d->x.ret);
    alerts_feed_free(d->x.feed);
    headtab_free(d->heads);
    d->heads = NULL;
    alerts_deliver_free(d->out);
    if (d->x.dev)
        devices_free(d->x.dev);
    if (d->x.db) {
        store_error ce = {0, ""};
        if (store_commit(d->x.db, &ce) != STORE_OK) {
            LOG_ERROR("server", "final commit: %s", ce.msg);
            exit_code = 1;
        }
        store_close(d->x.db);
    }
out_loop:
    listen_close(d->lis); /* one that never listened */
    if (worker_any_abandoned()) {
        LOG_WARN("server", "a worker thread was left behind: the event loop is kept open until "
                 "the process exits");
    } else {
        rc = uv_loop_close(loopp);
        if (rc != 0) {
            LOG_ERROR("server", "the event loop did not close cleanly: %s", uv_strerror(rc));
            uv_walk(loopp, walk_report, NULL);
            exit_code = 1;
        }
        free(loopp);
    }
    if (exit_code == 0)
        LOG_INFO("server", "stopped cleanly");
    dbfile_unlock(&d->locks);
out_free:
    clients_free(reg);
    runs_free(rs);
    counters_free(cnt);
    free(d);
    return exit_code;
}
