/* summary.h — the summary `attnstat trend` prints of a layer when no head is asked for: the
 * layer's steps in at most --buckets buckets of equal width (30 by default), and per bucket the
 * minimum, mean and maximum over its heads and steps of the normalised entropy and of the max
 * logit (with the head of each extreme), the mean entropy and collapsed fraction, and the
 * non-finite rows; sparklines of the minimum entropy and the maximum logit after a table.
 *
 * Stage: called by history.c; calls the store's read half and out.c. */
#ifndef ATTNSTAT_CLI_SUMMARY_H
#define ATTNSTAT_CLI_SUMMARY_H

#include <stddef.h>
#include <stdint.h>

#include "args.h"

typedef struct store store;

/* Prints the summary of layer a->layer of run run_id (named run, escaped) over steps [from, to],
 * in a->fmt. CLI_EXIT_OK with *rows the buckets printed (0: no sample in the range, nothing
 * printed: the caller says what the run has); else an exit code, the reason on stderr. */
int summary_trend(const cli_args *a, store *st, int64_t run_id, const char *run, int64_t from,
                  int64_t to, size_t *rows);

#endif /* ATTNSTAT_CLI_SUMMARY_H */
