/* store_job.h — one training job across its processes and their databases: the runs of a job
 * (its processes: every run of one name) with the parallel layout each said, and the merge of
 * samples of one global (layer, head, step) that different processes computed over disjoint rows.
 *
 * A job's processes share its run name; each is a run (name, rank) of the database of the node it
 * ran on. Since schema version 4 their samples hold global layer and head numbers (store.h,
 * store_layout; schema/004_layout.sql), so a job's layer x head map is the union of its runs'
 * grids, read from one database or several (attnstat job, attnstat export). Where several runs
 * hold the same global (layer, head, step) — data-parallel replicas, context-parallel ranks —
 * each computed it over other rows: store_merge_stats() pools them into the statistics of the
 * union of their rows, exactly (deploy/CLUSTER.md says why that is the right merge).
 *
 * Includes store.h and kernels/stats.h. Reads only: a read-only handle serves (the CLI), and so
 * does the daemon's. Callbacks as store_read.h's: the row and its strings are valid during the
 * call; return non-zero to stop. */
#ifndef ATTNSTAT_STORE_JOB_H
#define ATTNSTAT_STORE_JOB_H

#include <stdint.h>

#include "stats.h"
#include "store.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    int64_t run_id;
    const char *name;
    int32_t rank;
    const char *host;        /* NULL when unknown */
    int has_layout;          /* 0: the process said none: its numbers are global as they are */
    store_layout layout;     /* when has_layout (head_offset -1: tp_rank x a push's heads) */
    int64_t samples;         /* committed samples */
    int64_t step_min, step_max; /* 0 when samples == 0 */
    int64_t last_time_ms;    /* 0 when none */
} store_job_run;

typedef int (*store_job_run_cb)(void *ctx, const store_job_run *r);

/* The runs named name (a job's processes), ordered by rank. STORE_OK with no row when none. */
store_status store_job_runs(store *st, const char *name, store_job_run_cb cb, void *ctx,
                            store_error *err);

/* One run by id, with its layout. STORE_NOTFOUND when there is none. */
store_status store_job_get_run(store *st, int64_t run_id, store_job_run_cb cb, void *ctx,
                           store_error *err);

/* Pool x into acc: afterwards acc holds the statistics of the union of the rows both were computed
 * over (disjoint sets: replicas' batch entries, context ranks' rows). Counts add; each statistic
 * pools as its row in vocab/vocab.h says (columns pool and weight): a MEAN is the mean weighted by
 * its count (entropy_mean, sink_mass and distance by rows; entropy_norm_mean and collapsed_frac by
 * rows_norm), a STD the pooled population deviation about the MEAN row before it (entropy_std),
 * MIN and MAX the extremes (entropy_min, entropy_max, max_logit); sampled is set when either was.
 * A side whose count is 0 (NaN statistics) adds only its counts, except that max_logit, defined
 * with no counted row (-inf), is always the larger. Exact up to rounding for samples of the exact
 * tier; a downsampled bucket (means over steps) pools its means. */
void store_merge_stats(stats_head *acc, const stats_head *x);

#ifdef __cplusplus
}
#endif

#endif /* ATTNSTAT_STORE_JOB_H */
