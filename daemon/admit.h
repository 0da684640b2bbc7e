/* admit.h — what an admitted connection may hold, for how long, and what it may see. The
 * listener (listen.h) decides who connects and whether a connection takes one of the reserved
 * slots; from then on:
 * - a slot for a run or a subscription: a Hello or a Subscribe takes one of its uid's
 *   max_clients_per_uid; one past that share, or on a connection admitted into the reserve
 *   (status and commands only), is refused with Error(BUSY) naming the setting, and the
 *   connection is closed once the Error is out;
 * - deadlines, once a second: no Hello nor Subscribe and no message for hello_timeout_ms; a Hello
 *   and then no message (and no push in flight) for idle_timeout_ms; then the connection's own
 *   (conn_tick: a frame left incomplete for frame_timeout_ms, replies its peer read none of for
 *   write_timeout_ms). Each closure says why to the peer (when it still reads), in the log, and in
 *   a counter;
 * - what a subscriber sees: the Results and Alerts of the runs its uid owns; root and the
 *   daemon's uid see every run's (a run with no owner recorded: only they).
 * Stage: beside the loop, which calls it for each message before the session, from its tick, and
 * as the registry's broadcast filter; calls clients, peer, conn, runs, counters and log. Loop
 * thread only. */
#ifndef ATTNSTAT_ADMIT_H
#define ATTNSTAT_ADMIT_H

#include <stdint.h>
#include <sys/types.h>

#include "attnstat.pb-c.h"
#include "clients.h"
#include "ctx.h"

/* env, a message of e's client, may go on to the session: 1; 0 when it was a Hello or Subscribe
 * with no slot for it (refused, the connection closing). */
int admit_message(const stage_ctx *x, clients_entry *e, const Attnstat__Envelope *env);

/* The deadlines of every connection of the registry at now_ns (util_mono_ns). */
void admit_sweep(const stage_ctx *x, uint64_t now_ns);

/* clients_filter_fn: may a subscriber of uid see env (a Result or an Alert)? ctx: the runs. */
int admit_may_see(void *ctx, uid_t uid, const Attnstat__Envelope *env);

#endif /* ATTNSTAT_ADMIT_H */
