/* diff.h — `attnstat diff RUN_A RUN_B [RUN...]`: runs compared side by side per (layer, head),
 * read from the database (works with attnstatd stopped). Per run and head: the mean normalised
 * entropy, the mean entropy (nats) and the largest max logit over the steps compared; per later
 * run, its difference from the first; rows sorted by the largest change of --metric.
 *
 * Stage: called by main.c; calls history.c (opening and resolving runs), timearg.c, the store's
 * read half and out.c. */
#ifndef ATTNSTAT_CLI_DIFF_H
#define ATTNSTAT_CLI_DIFF_H

#include "args.h"

int diff_run(const cli_args *a);

#endif /* ATTNSTAT_CLI_DIFF_H */
