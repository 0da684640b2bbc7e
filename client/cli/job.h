/* job.h — the attnstat CLI across nodes: one training job (every run of one name: its processes)
 * read from one database or several (--db given more than once, or a directory of *.db files
 * copied from the nodes or shared between them), by global (layer, head) numbers.
 *   job     the job's layer x head map at one step, samples of the same global head from several
 *           processes (data-parallel replicas, context-parallel ranks) pooled over their rows
 *           (store_merge_stats), with the processes that produced it;
 *   export  every sample of every process of the job as CSV or JSON lines, each row with the
 *           database, the process's rank and its parallel layout: one table for offline analysis
 *           (pandas, pyarrow and DuckDB read it with its header; no cell mixes types).
 * Each prints to stdout in the format asked for, reports failures on stderr, and returns an exit
 * code.
 *
 * Stage: called by main.c; calls the store's read half (store_read.h, store_job.h) and out.c. */
#ifndef ATTNSTAT_CLI_JOB_H
#define ATTNSTAT_CLI_JOB_H

#include "args.h"

int job_map(const cli_args *a);
int job_export(const cli_args *a);

#endif /* ATTNSTAT_CLI_JOB_H */
