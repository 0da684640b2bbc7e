/* metrics_runs.c — the runs, their alerts, the store thread and the retention as Prometheus text
 * (see metrics_runs.h). Stage: metrics; calls runs, the alert feed, the storer and the retention.
 *
 * Per-run series carry run (the name, escaped as the text format wants: backslash, double quote,
 * newline), rank and run_id; only runs with an active alert have them, so their number stays the
 * number of runs in trouble, and they vanish when the alerts end. */
#include "metrics_runs.h"

#include <stdio.h>

#include "alerts_feed.h"
#include "retain.h"
#include "runs.h"
#include "storer.h"

typedef struct {
    metrics_buf *out;
    const stage_ctx *x;
    int pass;                /* 0: active, 1: unacknowledged */
} text;

static void run_line(void *ctx, int64_t run_id, uint32_t active, uint32_t unacked)
{
    text *t = ctx;
    const run_entry *e = runs_get(t->x->runs, run_id);
    char name[1024];
    metrics_label(e ? e->name : "?", name, sizeof name);
    metrics_printf(t->out, "%s{run=\"%s\",rank=\"%d\",run_id=\"%lld\"} %u\n",
                   t->pass ? "attnstat_run_alerts_unacknowledged" : "attnstat_run_alerts_active",
                   name, e ? (int)e->rank : 0, (long long)run_id, t->pass ? unacked : active);
}

void metrics_render_runs(metrics_buf *out, const stage_ctx *x)
{
    text t = {out, x, 0};
    metrics_printf(out, "# HELP attnstat_runs_live Runs with a client, or waiting for one to come back "
         "(run_grace_ms).\n# TYPE attnstat_runs_live gauge\nattnstat_runs_live %u\n",
         runs_live(x->runs));
    metrics_printf(out, "# HELP attnstat_run_alerts_active Active alerts of a run (raised, not cleared or "
         "resolved).\n# TYPE attnstat_run_alerts_active gauge\n");
    alerts_feed_counts(x->feed, run_line, &t);
    t.pass = 1;
    metrics_printf(out, "# HELP attnstat_run_alerts_unacknowledged Active alerts of a run that nobody "
         "acknowledged or silenced.\n# TYPE attnstat_run_alerts_unacknowledged gauge\n");
    alerts_feed_counts(x->feed, run_line, &t);
    metrics_printf(out, "# HELP attnstat_store_queue Writes waiting for the store thread.\n"
         "# TYPE attnstat_store_queue gauge\nattnstat_store_queue %u\n",
         x->st ? storer_pending(x->st) : 0);
    if (x->ret) {
        retain_stats rs;
        retain_stats_get(x->ret, &rs);
        metrics_printf(out, "# HELP attnstat_retention_steps_total Retention steps run.\n"
             "# TYPE attnstat_retention_steps_total counter\nattnstat_retention_steps_total %llu\n",
             (unsigned long long)rs.steps);
        metrics_printf(out, "# HELP attnstat_retention_compacted_total Samples packed into the compact tier.\n"
             "# TYPE attnstat_retention_compacted_total counter\n"
             "attnstat_retention_compacted_total %llu\n", (unsigned long long)rs.compacted);
        metrics_printf(out, "# HELP attnstat_retention_downsampled_total Samples merged into downsampled "
             "buckets.\n# TYPE attnstat_retention_downsampled_total counter\n"
             "attnstat_retention_downsampled_total %llu\n", (unsigned long long)rs.downsampled);
        metrics_printf(out, "# HELP attnstat_retention_failures_total Retention steps that failed.\n"
             "# TYPE attnstat_retention_failures_total counter\n"
             "attnstat_retention_failures_total %llu\n", (unsigned long long)rs.failures);
        metrics_printf(out, "# HELP attnstat_db_used_bytes The database's bytes in use (last retention "
             "step).\n# TYPE attnstat_db_used_bytes gauge\nattnstat_db_used_bytes %lld\n",
             (long long)rs.used_bytes);
        metrics_printf(out, "# HELP attnstat_retention_over_limit 1 when retain_bytes (or a run's limit) is "
             "exceeded and nothing more may be downsampled.\n"
             "# TYPE attnstat_retention_over_limit gauge\nattnstat_retention_over_limit %d\n",
             rs.over_limit);
    }
}
