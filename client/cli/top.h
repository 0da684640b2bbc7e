/* top.h — `attnstat top --run R`: a view of one run that refreshes in place, as nvidia-smi -l and
 * dcgmi dmon do: the layer x head heatmaps of the normalised entropy and of the max logit, the
 * heads most at risk with their change, and the run's latest alerts. Live from attnstatd (its
 * subscribed results and alerts) or, without a daemon or with --db, from the database. Not on a
 * terminal, or with --once / -n N, plain frames without escape codes (for pipes and tests).
 *
 * Stage: called by main.c; calls libattnstat (connect, subscribe, poll, status), history.c
 * (opening a run), the store's read half and out.c. */
#ifndef ATTNSTAT_CLI_TOP_H
#define ATTNSTAT_CLI_TOP_H

#include "args.h"

/* Runs until q, Ctrl-C (SIGINT) or SIGTERM, or -n frames: exit 0. Exit 1 when the run cannot be
 * read at the start (no daemon and no database, an unknown run), or the daemon refuses the
 * view. */
int top_run(const cli_args *a);

#endif /* ATTNSTAT_CLI_TOP_H */
