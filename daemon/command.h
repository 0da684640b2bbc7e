/* command.h — an operator's requests (Command, answered by one CommandReply): acknowledge, resolve
 * or silence an active alert (one, by its id, or every active alert of a run), end a silence (one,
 * by its id, or every silence of a run), delete a run, set a run's own retention limits (a limit
 * the request leaves out stays as it is). An alert acknowledged already keeps its first
 * acknowledgement: the reply names who and when instead. Every write runs on the store thread,
 * which records who (the peer's uid, from the socket's credentials) and when; the alert feed
 * learns the outcome (acknowledged, silenced, unsilenced, resolved: delivered as RESOLVED with
 * reason "operator").
 * Who may: root, the daemon's own uid, and the run's owner (its first Hello's uid; a run with no
 * owner, migrated from an older database: root and the daemon's uid only, runs_may_act); others
 * are refused (PERMISSION). Deleting a run with a client connected is refused (BUSY: stop its job
 * first); a run that is live without a connection (within run_grace_ms) is ended first ("deleted":
 * its alerts resolved). While a run is deleted (a few thousand samples per transaction, between
 * the ingest's commits) a Hello for it is refused (BUSY).
 * Stage: beside the session (it hands each Command here); calls runs, life, the alert feed, the
 * storer, the store (on the store thread), peer, conn, envelope, counters, util and log.
 * Loop thread only. */
#ifndef ATTNSTAT_COMMAND_H
#define ATTNSTAT_COMMAND_H

#include "attnstat.pb-c.h"
#include "ctx.h"
#include "peer.h"

/* Carries out m for p (answered with a CommandReply, now or when the store thread is done). */
void command_handle(const stage_ctx *x, peer *p, const Attnstat__Command *m);

#endif /* ATTNSTAT_COMMAND_H */
