/* interv.h — the attnstat CLI's `interventions`: what a job did to its model because of what was
 * measured (qk_clip's scaled heads), read from the database (schema/006_interventions.sql) through
 * the store's read-only API, so it works with attnstatd stopped.
 *
 * Stage: a command file of the CLI, called by main.c; calls history.c (the database, the run), the
 * store's read half and out.c. */
#ifndef ATTNSTAT_CLI_INTERV_H
#define ATTNSTAT_CLI_INTERV_H

#include "args.h"
#include "store_read.h"

int interv_list(const cli_args *a);

/* One intervention's fields as JSON members on stdout, without braces: "step", "time" (RFC 3339
 * UTC), "time_ms", "layer" (null: none), "kind", "heads" and "values" (arrays; values null when
 * none were sent), "threshold", "measured" (null: none) and "detail". interventions' and
 * export --interventions' JSON lines. */
void interv_json_fields(const store_intervention *iv);

#endif /* ATTNSTAT_CLI_INTERV_H */
