/* status.c — the StatusReply (see status.h). Stage: status; calls counters, devices (worker
 * statistics), clients, peer, conn, the alert feed, runs, the storer, the retention and
 * envelope. */
#include "status.h"

#include <stdlib.h>
#include <string.h>

#include "alerts_feed.h"
#include "clients.h"
#include "counters.h"
#include "devices.h"
#include "envelope.h"
#include "retain.h"
#include "runs.h"
#include "storer.h"

/* Every worker the pool can hold (DEVICES_MAX_CPU CPU workers and the GPUs' beside them): a list cut
 * short left out the GPU workers, added last, on hosts with 16 CPUs or more. */
#define STATUS_MAX_WORKERS (DEVICES_MAX_CPU + GPU_MAX_LOCAL)

void status_send(const stage_ctx *x, conn *to)
{
    Attnstat__StatusReply r;
    Attnstat__Envelope env;
    envelope_status_reply(&env, &r);
    uint32_t nclients = clients_count(x->reg);
    r.daemon_version = (char *)ATTNSTAT_DAEMON_VERSION;
    r.has_uptime_s = 1;
    r.uptime_s = counters_uptime_s(x->cnt);
    r.has_clients = 1;
    r.clients = nclients;
    r.has_pushes = 1;
    r.pushes = counters_get(x->cnt, CNT_PUSHES);
    r.has_pushes_done = 1;
    r.pushes_done = counters_get(x->cnt, CNT_PUSHES_DONE);
    r.has_dropped = 1;
    r.dropped = counters_get(x->cnt, CNT_DROPPED);
    r.has_rejected = 1;
    r.rejected = counters_get(x->cnt, CNT_REJECTED);
    r.has_failed = 1;
    r.failed = counters_get(x->cnt, CNT_FAILED);
    r.has_store_errors = 1;
    r.store_errors = counters_get(x->cnt, CNT_STORE_ERRORS);
    r.last_store_error = (char *)counters_last_store_error(x->cnt);
    r.has_samples_stored = 1;
    r.samples_stored = counters_get(x->cnt, CNT_SAMPLES_STORED);
    r.has_alerts_active = 1;
    r.alerts_active = alerts_feed_active(x->feed);
    r.has_push_rate = 1;
    r.push_rate = counters_push_rate(x->cnt);
    r.db_path = (char *)x->cfg->db_path;
    r.has_runs_live = 1;
    r.runs_live = runs_live(x->runs);
    r.has_interventions_stored = r.has_interventions_refused = 1;
    r.interventions_stored = counters_get(x->cnt, CNT_INTERVENTIONS_STORED);
    r.interventions_refused = counters_get(x->cnt, CNT_INTERVENTIONS_REFUSED);
    /* The store thread and the retention. */
    Attnstat__StoreStatus ss;
    attnstat__store_status__init(&ss);
    ss.has_queued = 1;
    ss.queued = x->st ? storer_pending(x->st) : 0;
    ss.has_commits = 1;
    ss.commits = counters_get(x->cnt, CNT_COMMITS);
    ss.durability = (char *)x->cfg->durability;
    store_ckpt_counts ck;
    if (store_checkpoint_counts(x->db, &ck)) {
        ss.has_checkpoints = ss.has_checkpoints_inline = ss.has_checkpoint_errors = 1;
        ss.checkpoints = ck.runs;
        ss.checkpoints_inline = ck.inline_runs;
        ss.checkpoint_errors = ck.errors;
        if (ck.errors)
            ss.last_checkpoint_error = ck.last_error;
    }
    if (x->ret) {
        retain_stats rs;
        retain_stats_get(x->ret, &rs);
        ss.has_retain_ms = ss.has_retain_bytes = ss.has_retain_steps = ss.has_compacted = 1;
        ss.has_downsampled = ss.has_used_bytes = ss.has_over_limit = ss.has_last_step_ms = 1;
        ss.has_retain_busy_frac = 1;
        ss.retain_ms = rs.retain_ms;
        ss.retain_bytes = rs.retain_bytes;
        ss.retain_steps = rs.steps;
        ss.compacted = rs.compacted;
        ss.downsampled = rs.downsampled;
        ss.used_bytes = rs.used_bytes;
        ss.over_limit = rs.over_limit != 0;
        ss.last_step_ms = rs.last_lock_ms;
        double up = counters_uptime_s(x->cnt);
        ss.retain_busy_frac = up > 0 ? (double)rs.busy_ns / 1e9 / up : 0;
    }
    r.store = &ss;
    /* The pushes answered with another code than OK, by code, with each code's last message. */
    Attnstat__Rejection rej[COUNTERS_CODES], *rejp[COUNTERS_CODES];
    size_t nrej = 0;
    for (int code = 1; code < COUNTERS_CODES; code++) {
        uint64_t n = counters_answered(x->cnt, code);
        if (!n)
            continue;
        attnstat__rejection__init(&rej[nrej]);
        rej[nrej].code = (Attnstat__Code)code;
        rej[nrej].count = n;
        rej[nrej].last_message = (char *)counters_answer_message(x->cnt, code);
        rejp[nrej] = &rej[nrej];
        nrej++;
    }
    r.rejections = rejp;
    r.n_rejections = nrej;

    worker_pool *pool = devices_pool(x->dev);
    int nw = worker_pool_count(pool);
    if (nw > STATUS_MAX_WORKERS)
        nw = STATUS_MAX_WORKERS;
    Attnstat__WorkerStatus ws[STATUS_MAX_WORKERS], *wsp[STATUS_MAX_WORKERS];
    worker_stats st[STATUS_MAX_WORKERS];
    /* The GPU workers first: a client keeps the first ATTNSTAT_STATUS_MAX_WORKERS (16) entries,
     * and a host with 16 CPUs has as many CPU workers. */
    int order[STATUS_MAX_WORKERS], no = 0;
    for (int pass = 0; pass < 2; pass++)
        for (int i = 0; i < nw; i++) {
            worker_stats probe;
            worker_pool_stats(pool, i, &probe);
            if ((strncmp(probe.name, "cpu", 3) != 0) == (pass == 0))
                order[no++] = i;
        }
    for (int i = 0; i < nw; i++) {
        worker_pool_stats(pool, order[i], &st[i]);
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
    r.n_workers = (size_t)nw;

    Attnstat__ClientStatus *cs = calloc(nclients ? nclients : 1, sizeof *cs);
    Attnstat__ClientStatus **csp = calloc(nclients ? nclients : 1, sizeof *csp);
    size_t n = 0;
    if (cs && csp) {
        for (clients_entry *e = clients_first(x->reg); e && n < nclients; e = e->next) {
            Attnstat__ClientStatus *c = &cs[n];
            attnstat__client_status__init(c);
            c->id = conn_id(e->c);
            c->has_uid = 1;
            c->uid = (uint32_t)conn_uid(e->c);
            c->has_pid = 1;
            c->pid = (int32_t)conn_pid(e->c);
            const peer *p = e->p;
            if (p) {
                if (p->hello) {
                    c->run = (char *)p->run;
                    c->has_rank = 1;
                    c->rank = p->rank;
                    c->pid = p->pid;
                }
                c->has_pushes = 1;
                c->pushes = p->pushes;
                c->has_dropped = 1;
                c->dropped = p->dropped;
                c->has_rejected = 1;
                c->rejected = p->rejected;
            }
            csp[n] = c;
            n++;
        }
    }
    r.client_list = csp;
    r.n_client_list = n;
    if (conn_write(to, &env, 1) != 0) {
        r.client_list = NULL; /* too many clients for one frame: send the totals */
        r.n_client_list = 0;
        conn_write(to, &env, 1);
    }
    free(cs);
    free(csp);
}
