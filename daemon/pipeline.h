/* pipeline.h — what happens to a push after its worker finished: Release at once (the memory is
 * no longer read), then the per-head results join the open store batch; the batch is committed in
 * one transaction (at most commit_ms after its first result, or sooner when large) and only then
 * does each push get its Ack(OK) — an acknowledged sample is durable. Each head's statistics feed
 * the alert engine; transitions are written in the same batch, and after the commit go to the log,
 * to subscribed connections (Alert, and Result for those who asked) and to --alert-exec.
 * Also builds StatusReply. Loop thread only. */
#ifndef ATTNSTAT_PIPELINE_H
#define ATTNSTAT_PIPELINE_H

#include <stdint.h>

#include "attnstat.pb-c.h"
#include "config.h"
#include "worker.h"

typedef struct server server;
typedef struct conn conn;
typedef struct pipeline pipeline;

pipeline *pipeline_new(server *srv, char *err, size_t errlen);
/* Commits what is pending, then closes the timer and frees the pipeline in its close callback. */
void pipeline_close(pipeline *pl);

/* worker_done_fn for the pool (ctx is the server). */
void pipeline_job_done(void *ctx, worker_job *job);
/* Commits the open batch and answers its pushes now. */
void pipeline_flush(pipeline *pl);
/* Results waiting for a commit. */
uint32_t pipeline_pending(const pipeline *pl);
/* Alert-exec children still running. */
uint32_t pipeline_children(const pipeline *pl);

/* Checks a Hello's thresholds against the configured ones (merged, bounds checked) and writes
 * the effective set as JSON. Returns 0, or -1 with err naming the field. t may be NULL. */
int pipeline_check_thresholds(pipeline *pl, const Attnstat__Thresholds *t, char *json,
                              size_t jsonlen, char *err, size_t errlen);
/* Gives the alert engine a run's overrides (from its Hello). Returns 0 or -1 with err set. */
int pipeline_set_run(pipeline *pl, int64_t run_id, const Attnstat__Thresholds *t, char *err,
                     size_t errlen);

/* Sends a StatusReply to c. */
void pipeline_send_status(pipeline *pl, conn *c);
/* Prometheus text (metrics_render_fn; ctx is the server). */
size_t pipeline_render_metrics(void *ctx, char *buf, size_t cap);

#endif /* ATTNSTAT_PIPELINE_H */
