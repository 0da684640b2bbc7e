/* admin.h — the attnstat CLI's operator commands and what it asks attnstatd beyond libattnstat's
 * API: `alerts ack|resolve|silence|unsilence`, `delete-run`, `retention` (Command, answered by
 * CommandReply: the daemon records who, the uid of this process, and when; `retention --run R`
 * alone shows the run's limits, read from the database, with the daemon's own when it answers),
 * and the store's part of `status` (the store thread and the retention). Each request is one raw
 * frame on a connection of its own (proto/: envelope, frame), answered within --timeout.
 * `delete-run` with no daemon listening works on the database itself, taking the lock attnstatd
 * takes (DB.lock), so that it never deletes under a daemon.
 *
 * Stage: a command file of the CLI, called by main.c (and live.c for the status); calls the
 * store (resolving a run's name; deleting offline), proto/ and out.c. */
#ifndef ATTNSTAT_CLI_ADMIN_H
#define ATTNSTAT_CLI_ADMIN_H

#include <stdint.h>

#include "args.h"

int admin_alerts_ack(const cli_args *a);
int admin_alerts_resolve(const cli_args *a);
int admin_alerts_silence(const cli_args *a);
int admin_alerts_unsilence(const cli_args *a);
int admin_delete_run(const cli_args *a);
int admin_retention(const cli_args *a);

/* The store thread and the retention as attnstatd reports them (StatusReply.store). */
typedef struct {
    int have;                /* the daemon reported them */
    uint32_t queued, runs_live;
    uint64_t commits, retain_steps, compacted, downsampled;
    uint64_t interventions_stored, interventions_refused; /* what jobs did to their models */
    uint64_t checkpoints, checkpoints_inline, checkpoint_errors;
    int64_t retain_ms, retain_bytes, used_bytes;
    int over_limit;
    double last_step_ms, retain_busy_frac;
    char durability[16];
    char last_checkpoint_error[200];
} admin_store_status;

/* Asks for it (a Status of its own). 0, or -1 (out->have 0; nothing printed). */
int admin_store_status_get(const cli_args *a, admin_store_status *out);

#endif /* ATTNSTAT_CLI_ADMIN_H */
