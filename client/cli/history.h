/* history.h — the attnstat CLI's history commands: runs, trend, heads and alerts, read from the
 * database through the store's read-only API, so they work with attnstatd stopped. Each prints to
 * stdout in the format asked for, reports failures on stderr, and returns an exit code.
 *
 * Stage: called by main.c; calls the store's read half, out.c and libattnstat's names. */
#ifndef ATTNSTAT_CLI_HISTORY_H
#define ATTNSTAT_CLI_HISTORY_H

#include <stdint.h>

#include "args.h"

typedef struct store store;

int history_runs(const cli_args *a);
int history_trend(const cli_args *a);
int history_heads(const cli_args *a);
int history_alerts(const cli_args *a);
/* Opens the database read-only and resolves --run (a name or an id; --rank): CLI_EXIT_OK with *st
 * open (store_close it) and *name the run's name, escaped (free it), or an exit code with the
 * reason printed and nothing open. Used by admin.c too. */
int history_open_run(const cli_args *a, store **st, int64_t *run_id, char **name);

#endif /* ATTNSTAT_CLI_HISTORY_H */
