/* admit.c — slots, deadlines and what subscribers see (see admit.h). Stage: beside the loop;
 * calls clients, peer, conn, runs, counters and log. */
#include "admit.h"

#include <stdio.h>
#include <unistd.h>

#include "conn.h"
#include "counters.h"
#include "log.h"
#include "peer.h"
#include "runs.h"

/* Refuses e's client with Error(BUSY) msg (logged, counted), closing it once the Error is out. */
static void refuse(const stage_ctx *x, clients_entry *e, Attnstat__Code code, const char *msg,
                   const char *why, counter_id counted)
{
    counters_inc(x->cnt, counted);
    LOG_WARN("server", "client %llu (pid %d uid %u): %s", (unsigned long long)conn_id(e->c),
             (int)conn_pid(e->c), (unsigned)conn_uid(e->c), msg);
    conn_refuse(e->c, code, msg, why, 1);
}

int admit_message(const stage_ctx *x, clients_entry *e, const Attnstat__Envelope *env)
{
    peer *p = e->p;
    if ((env->msg_case != ATTNSTAT__ENVELOPE__MSG_HELLO &&
         env->msg_case != ATTNSTAT__ENVELOPE__MSG_SUBSCRIBE) || peer_is_session(p))
        return 1;
    const cfg *c = x->cfg;
    const char *what = env->msg_case == ATTNSTAT__ENVELOPE__MSG_HELLO ? "Hello" : "Subscribe";
    char msg[400];
    uint32_t n = clients_sessions(x->reg, p->uid);
    if (p->reserve)
        snprintf(msg, sizeof msg, "%s refused: this connection took one of the last slots "
                 "(reserved_clients %llu, kept for root, uid %u and status commands), which may "
                 "ask for status and send commands only: try again later", what,
                 (unsigned long long)c->reserved_clients, (unsigned)getuid());
    else if (n >= c->max_clients_per_uid)
        snprintf(msg, sizeof msg, "%s refused: uid %u has %u runs and subscriptions open, the "
                 "most one uid may hold (max_clients_per_uid %llu): close one, or raise the "
                 "setting", what, (unsigned)p->uid, n, (unsigned long long)c->max_clients_per_uid);
    else
        return 1;
    refuse(x, e, ATTNSTAT__CODE__BUSY, msg, "no slot for a run or subscription",
           CNT_CONNS_REFUSED);
    return 0;
}

void admit_sweep(const stage_ctx *x, uint64_t now)
{
    const cfg *c = x->cfg;
    uint64_t hello_ns = c->hello_timeout_ms * 1000000ull;
    uint64_t idle_ns = c->idle_timeout_ms * 1000000ull;
    for (clients_entry *e = clients_first(x->reg), *next; e; e = next) {
        next = e->next;
        const peer *p = e->p;
        uint64_t quiet = now - conn_last_message_ns(e->c);
        int open = p && p->c && conn_is_open(e->c);
        char msg[600];
        if (open && !peer_is_session(p) && quiet > hello_ns) {
            snprintf(msg, sizeof msg, "no Hello (or Subscribe) and no message for %llu ms "
                     "(hello_timeout_ms): closing this connection",
                     (unsigned long long)c->hello_timeout_ms);
            refuse(x, e, ATTNSTAT__CODE__NO_HELLO, msg, "no Hello in time", CNT_CONNS_TIMED_OUT);
            continue;
        }
        if (open && p->hello && idle_ns && p->inflight == 0 && quiet > idle_ns) {
            snprintf(msg, sizeof msg, "run '%s': no message for %llu ms since the last "
                     "(idle_timeout_ms %llu): closing this connection to free its slot (a client "
                     "that pushes again reconnects)", p->run,
                     (unsigned long long)(quiet / 1000000ull),
                     (unsigned long long)c->idle_timeout_ms);
            refuse(x, e, ATTNSTAT__CODE__BUSY, msg, "idle", CNT_CONNS_IDLE);
            continue;
        }
        conn_tick(e->c, now, c->frame_timeout_ms * 1000000ull, c->write_timeout_ms * 1000000ull);
    }
}

int admit_may_see(void *ctx, uid_t uid, const Attnstat__Envelope *env)
{
    const runs *rs = ctx;
    if (uid == 0 || uid == getuid())
        return 1;
    int64_t run_id = env->msg_case == ATTNSTAT__ENVELOPE__MSG_RESULT  ? env->result->run_id
                     : env->msg_case == ATTNSTAT__ENVELOPE__MSG_ALERT ? env->alert->run_id
                                                                      : 0;
    const run_entry *r = run_id > 0 ? runs_get(rs, run_id) : NULL;
    return r && r->has_owner && r->owner == uid;
}
