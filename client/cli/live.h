/* live.h — the attnstat CLI's live commands: status and watch, which talk to attnstatd through
 * libattnstat. Each returns an exit code (1 when the daemon cannot be reached, or goes away
 * during status).
 *
 * Stage: called by main.c; calls libattnstat and out.c. */
#ifndef ATTNSTAT_CLI_LIVE_H
#define ATTNSTAT_CLI_LIVE_H

#include "args.h"

int live_status(const cli_args *a);
/* Prints the alerts that --run, --rank and --rule keep, until SIGINT or SIGTERM (exit 0). A
 * daemon that goes away is waited for (one line on stderr when it is lost, one when it is back);
 * exit 1 when it cannot be reached at the start, or refuses the watcher when it comes back. */
int live_watch(const cli_args *a);

#endif /* ATTNSTAT_CLI_LIVE_H */
