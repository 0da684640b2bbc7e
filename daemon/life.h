/* life.h — the life of a run as attnstatd drives it (runs.h says where each stands): recorded at
 * its Hello, attached to and detached from its connections, ended (Goodbye, grace passed, idle,
 * deleted) with its active alerts resolved and the end recorded, resumed by a push after an idle
 * end. Every write goes to the store thread; what the alert feed resolves is delivered at once.
 * Stage: beside the session, the loop and the commands; calls runs, the alert feed, the storer,
 * the store's write half (on the store thread), counters, util and log. Loop thread only. */
#ifndef ATTNSTAT_LIFE_H
#define ATTNSTAT_LIFE_H

#include <stdint.h>

#include "ctx.h"
#include "runs.h"
#include "store_write.h"

/* A Hello for e: its record (info; its strings are copied) goes to the store thread under e's id
 * and owner, and e is attached (LIVE). A failure to record is logged and counted (the run's pushes
 * then fail with the store's reason). 0, or -1 when memory ran out (nothing done). */
int life_hello(const stage_ctx *x, run_entry *e, const store_run_info *info);

/* A push of run_id goes to the store thread next: when the run's record was rolled back (its
 * transaction failed), it goes again first, so that the push finds its run. */
void life_before_push(const stage_ctx *x, int64_t run_id);

/* A connection of run run_id closed (goodbye: it said Goodbye). 1 when the run must end now (the
 * caller runs life_check() soon, outside of the connection's callbacks), else 0. */
int life_detach(const stage_ctx *x, int64_t run_id, int goodbye);

/* A push of run_id was stored: it is active now; one that had ended for idleness resumes (its end
 * is cleared in the store). */
void life_touch(const stage_ctx *x, int64_t run_id);

/* Ends every live run whose time has come (Goodbye, run_grace_ms, run_idle_ms). */
void life_check(const stage_ctx *x);

/* Ends e now for reason: its alerts resolved (recorded, delivered), the end recorded, e ENDED.
 * Returns the number of alerts resolved. */
uint32_t life_end(const stage_ctx *x, run_entry *e, const char *reason);

#endif /* ATTNSTAT_LIFE_H */
