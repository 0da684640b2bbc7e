/* timearg.h — times on the attnstat CLI's command line and the steps they select: the parser of
 * every TIME option (--since, --until), and the window of steps that --from/--to and
 * --since/--until leave of one run (trend, heads, export, diff).
 *
 * Stage: a leaf of the CLI's commands; timearg_parse calls libc only (main.c parses with it),
 * timearg_steps the store's read half (store_time_steps) and out.c. */
#ifndef ATTNSTAT_CLI_TIMEARG_H
#define ATTNSTAT_CLI_TIMEARG_H

#include <stdint.h>

#include "args.h"

typedef struct store store;

/* A time as Unix milliseconds: RFC 3339 ('2024-05-01T12:00:00Z', '...+02:00', fractions of a
 * second), the same with a space, minutes only or no offset (UTC), a date alone (its midnight,
 * UTC), 'now', or a time ago counted from now_ms: '90s', '10m', '2h', '3d', with or without a
 * leading '-' ('-1h' is '1h'). Returns 0, or -1 when s is none of these. */
int timearg_parse(const char *s, int64_t now_ms, int64_t *out);

/* The steps of run run_id (named run, escaped, for messages) that a command reads: --from/--to,
 * narrowed by --since/--until (store_time_steps: the steps stored in that time). CLI_EXIT_OK with
 * the window in [*from, *to] (INT64_MIN / INT64_MAX where unbounded); else an exit code, with the
 * reason on stderr (a window in which the run stored nothing names the times it has). */
int timearg_steps(store *st, int64_t run_id, const char *run, const cli_args *a, int64_t *from,
                  int64_t *to);

#endif /* ATTNSTAT_CLI_TIMEARG_H */
