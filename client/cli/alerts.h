/* alerts.h — the attnstat CLI's alert listings, read from the database (they work with attnstatd
 * stopped): `alerts` (every transition, with its id, who acknowledged it and when, the silence
 * that holds a firing alert now; filters on the state, the acknowledgement and the silence besides
 * the run, layer, head, rule and time) and `alerts silences` (the silences in force, with the id
 * that `alerts unsilence` takes). The operator's actions on them are in admin.h.
 *
 * Stage: a command file of the CLI, called by main.c; calls history.c, the store's read half and
 * out.c. */
#ifndef ATTNSTAT_CLI_ALERTS_H
#define ATTNSTAT_CLI_ALERTS_H

#include "args.h"

int alerts_list(const cli_args *a);
int alerts_silences(const cli_args *a);

#endif /* ATTNSTAT_CLI_ALERTS_H */
