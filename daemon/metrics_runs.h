/* metrics_runs.h — the Prometheus text of what metrics.c does not know: the runs (live, each live
 * process's alert thresholds, each run's active and unacknowledged alerts), the operators' marks
 * (the silences in force and the alerts acknowledged, per head), the store thread (ops waiting)
 * and the retention (steps, samples compacted and downsampled, bytes in use, over a limit).
 * Appended to metrics_render()'s by the loop's render callback.
 * Stage: metrics, beside the flow; reads runs, the alert feed, the storer and the retention.
 * Loop thread only. */
#ifndef ATTNSTAT_METRICS_RUNS_H
#define ATTNSTAT_METRICS_RUNS_H

#include <stddef.h>

#include "ctx.h"
#include "metrics.h"

/* The text, appended to out. */
void metrics_render_runs(metrics_buf *out, const stage_ctx *x);

#endif /* ATTNSTAT_METRICS_RUNS_H */
