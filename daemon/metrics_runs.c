/* metrics_runs.c — the runs, their alerts, the store thread and the retention as Prometheus text
 * (see metrics_runs.h). Stage: metrics; calls runs, the alert feed, the storer and the retention.
 *
 * Per-run series carry run (the name, escaped as the text format wants: backslash, double quote,
 * newline), rank and run_id; only runs with an active alert have them, so their number stays the
 * number of runs in trouble, and they vanish when the alerts end. */
#include "metrics_runs.h"

#include <stdarg.h>
#include <stdio.h>

#include "alerts_feed.h"
#include "retain.h"
#include "runs.h"
#include "storer.h"

typedef struct {
    char *buf;
    size_t cap, len;
    const stage_ctx *x;
    int pass;                /* 0: active, 1: unacknowledged */
} text;

__attribute__((format(printf, 2, 3))) static void emit(text *t, const char *fmt, ...)
{
    if (t->len + 1 >= t->cap)
        return;
    va_list ap;
    va_start(ap, fmt);
    int w = vsnprintf(t->buf + t->len, t->cap - t->len, fmt, ap);
    va_end(ap);
    if (w > 0)
        t->len += (size_t)w < t->cap - t->len ? (size_t)w : t->cap - t->len - 1;
}

/* A label value: \ " and newline escaped (run names have no other control character). */
static void label(text *t, const char *s)
{
    for (; *s && t->len + 3 < t->cap; s++) {
        if (*s == '\\' || *s == '"')
            t->buf[t->len++] = '\\';
        if (*s == '\n') {
            t->buf[t->len++] = '\\';
            t->buf[t->len++] = 'n';
            continue;
        }
        t->buf[t->len++] = *s;
    }
    t->buf[t->len] = '\0';
}

static void run_line(void *ctx, int64_t run_id, uint32_t active, uint32_t unacked)
{
    text *t = ctx;
    const run_entry *e = runs_get(t->x->runs, run_id);
    emit(t, "%s{run=\"", t->pass ? "attnstat_run_alerts_unacknowledged" : "attnstat_run_alerts_active");
    label(t, e ? e->name : "?");
    emit(t, "\",rank=\"%d\",run_id=\"%lld\"} %u\n", e ? (int)e->rank : 0, (long long)run_id,
         t->pass ? unacked : active);
}

size_t metrics_render_runs(char *buf, size_t cap, const stage_ctx *x)
{
    text t = {buf, cap, 0, x, 0};
    if (cap)
        buf[0] = '\0';
    emit(&t, "# HELP attnstat_runs_live Runs with a client, or waiting for one to come back "
         "(run_grace_ms).\n# TYPE attnstat_runs_live gauge\nattnstat_runs_live %u\n",
         runs_live(x->runs));
    emit(&t, "# HELP attnstat_run_alerts_active Active alerts of a run (raised, not cleared or "
         "resolved).\n# TYPE attnstat_run_alerts_active gauge\n");
    alerts_feed_counts(x->feed, run_line, &t);
    t.pass = 1;
    emit(&t, "# HELP attnstat_run_alerts_unacknowledged Active alerts of a run that nobody "
         "acknowledged or silenced.\n# TYPE attnstat_run_alerts_unacknowledged gauge\n");
    alerts_feed_counts(x->feed, run_line, &t);
    emit(&t, "# HELP attnstat_store_queue Writes waiting for the store thread.\n"
         "# TYPE attnstat_store_queue gauge\nattnstat_store_queue %u\n",
         x->st ? storer_pending(x->st) : 0);
    if (x->ret) {
        retain_stats rs;
        retain_stats_get(x->ret, &rs);
        emit(&t, "# HELP attnstat_retention_steps_total Retention steps run.\n"
             "# TYPE attnstat_retention_steps_total counter\nattnstat_retention_steps_total %llu\n",
             (unsigned long long)rs.steps);
        emit(&t, "# HELP attnstat_retention_compacted_total Samples packed into the compact tier.\n"
             "# TYPE attnstat_retention_compacted_total counter\n"
             "attnstat_retention_compacted_total %llu\n", (unsigned long long)rs.compacted);
        emit(&t, "# HELP attnstat_retention_downsampled_total Samples merged into downsampled "
             "buckets.\n# TYPE attnstat_retention_downsampled_total counter\n"
             "attnstat_retention_downsampled_total %llu\n", (unsigned long long)rs.downsampled);
        emit(&t, "# HELP attnstat_retention_failures_total Retention steps that failed.\n"
             "# TYPE attnstat_retention_failures_total counter\n"
             "attnstat_retention_failures_total %llu\n", (unsigned long long)rs.failures);
        emit(&t, "# HELP attnstat_db_used_bytes The database's bytes in use (last retention "
             "step).\n# TYPE attnstat_db_used_bytes gauge\nattnstat_db_used_bytes %lld\n",
             (long long)rs.used_bytes);
        emit(&t, "# HELP attnstat_retention_over_limit 1 when retain_bytes (or a run's limit) is "
             "exceeded and nothing more may be downsampled.\n"
             "# TYPE attnstat_retention_over_limit gauge\nattnstat_retention_over_limit %d\n",
             rs.over_limit);
    }
    return t.len;
}
