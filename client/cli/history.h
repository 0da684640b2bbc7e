/* history.h — the attnstat CLI's history commands: runs, trend and heads (alerts.h: alerts), read
 * from the database through the store's read-only API, so they work with attnstatd stopped. Each
 * prints to stdout in the format asked for, reports failures on stderr, and returns an exit code.
 *
 * Stage: called by main.c; calls the store's read half, out.c and libattnstat's names. */
#ifndef ATTNSTAT_CLI_HISTORY_H
#define ATTNSTAT_CLI_HISTORY_H

#include <stdint.h>

#include "args.h"
#include "store_read.h"

int history_runs(const cli_args *a);
int history_trend(const cli_args *a);
int history_heads(const cli_args *a);
/* Opens the database read-only and resolves --run (a name or an id; --rank): CLI_EXIT_OK with *st
 * open (store_close it) and *name the run's name, escaped (free it), or an exit code with the
 * reason printed and nothing open. Used by admin.c and alerts.c too. */
int history_open_run(const cli_args *a, store **st, int64_t *run_id, char **name);

/* The pieces of it, for a command whose --run is optional (alerts.c): the database opened
 * read-only (NULL with the reason printed), and --run resolved on it (an exit code; *name as
 * above). */
store *history_open_db(const cli_args *a);
int history_resolve(store *st, const cli_args *a, int64_t *run_id, char **name);

/* Every run's id, name and rank (history_collect_run is a store_run_cb filling it). */
typedef struct {
    char **names;
    int64_t *ids;
    int32_t *ranks;
    size_t n, cap;
} history_runlist;
int history_collect_run(void *ctx, const store_run *r);
void history_runlist_free(history_runlist *l);
/* The name ("?" when unknown) and the rank (-1) of run id. */
const char *history_run_name(const history_runlist *l, int64_t id);
int history_run_rank(const history_runlist *l, int64_t id);

/* A run's retention limit (store_run.retain_ms with is_ms, else .retain_bytes) in a few
 * characters: "default" (< 0: the daemon's), "none" (0), "1.5d", "10.0GB". */
void history_limit_text(char *buf, size_t len, int64_t v, int is_ms);

#endif /* ATTNSTAT_CLI_HISTORY_H */
