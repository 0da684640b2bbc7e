/* status.h — the Status reply: the daemon's counters, its workers, its clients and its active
 * alerts, as StatusReply. Stage: status, beside the flow (the session calls it for a Status
 * message); reads the context (ctx.h): counters, devices, the client registry, the alert feed.
 * Loop thread only. */
#ifndef ATTNSTAT_STATUS_H
#define ATTNSTAT_STATUS_H

#include "conn.h"
#include "ctx.h"

/* Sends a StatusReply to `to` (without the client list when it would not fit in one frame). */
void status_send(const stage_ctx *x, conn *to);

#endif /* ATTNSTAT_STATUS_H */
