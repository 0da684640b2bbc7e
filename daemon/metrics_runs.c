/* metrics_runs.c — the runs, their alerts, the store thread and the retention as Prometheus text
 * (see metrics_runs.h). Stage: metrics; calls runs, the alert feed, the storer and the retention.
 *
 * Per-run series carry run (the name, escaped as the text format wants: backslash, double quote,
 * newline), rank and run_id. The alert counts exist for runs with an active alert only, so their
 * number stays the number of runs in trouble, and they vanish when the alerts end; the thresholds
 * for every live run (LIVE or ORPHAN), so they vanish when it ends or is deleted. The operators'
 * marks are per head, of live runs only, keyed by the run's name as the per-head series are; the
 * transitions a live run had suppressed (alerts_limit.h), and its interventions recorded, for
 * those with any. */
#include "metrics_runs.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

static int is_live(const run_entry *e)
{
    return e && (e->state == RUN_LIVE || e->state == RUN_ORPHAN);
}

/* attnstat_run_threshold: each live process's thresholds in force, by rule. */
static void threshold_line(void *ctx, run_entry *e)
{
    text *t = ctx;
    if (!is_live(e))
        return;
    alerts_config c;
    alerts_feed_run_config(t->x->feed, e->id, &c);
    char name[1024], v[64];
    metrics_label(e->name, name, sizeof name);
    /* Every rule of VOCAB_RULES that has a threshold, in the table's order. */
    for (int r = 1; r <= (int)ALERTS_NRULES; r++) {
        double value;
        if (!alerts_rule_threshold(&c, (alerts_rule)r, &value, NULL))
            continue;
        metrics_value(value, v, sizeof v);
        metrics_printf(t->out, "attnstat_run_threshold{run=\"%s\",rank=\"%d\",run_id=\"%lld\","
                       "rule=\"%s\"} %s\n", name, (int)e->rank, (long long)e->id,
                       alerts_rule_name((alerts_rule)r), v);
    }
}

/* attnstat_run_alert_transitions_suppressed: a live process's transitions past its bound
 * (alert_rate, alert_burst), for those with any. */
static void suppressed_line(void *ctx, run_entry *e)
{
    text *t = ctx;
    uint64_t n = is_live(e) ? alerts_feed_suppressed(t->x->feed, e->id) : 0;
    if (!n)
        return;
    char name[1024];
    metrics_label(e->name, name, sizeof name);
    metrics_printf(t->out, "attnstat_run_alert_transitions_suppressed{run=\"%s\",rank=\"%d\","
                   "run_id=\"%lld\"} %llu\n", name, (int)e->rank, (long long)e->id,
                   (unsigned long long)n);
}

/* attnstat_run_interventions_total and attnstat_run_intervened_heads_total (pass 0 and 1): a live
 * process's Interventions recorded since this daemon started, and the heads they named, for those
 * with any. */
static void interv_line(void *ctx, run_entry *e)
{
    text *t = ctx;
    if (!is_live(e) || !e->interventions)
        return;
    char name[1024];
    metrics_label(e->name, name, sizeof name);
    metrics_printf(t->out, "%s{run=\"%s\",rank=\"%d\",run_id=\"%lld\"} %llu\n",
                   t->pass ? "attnstat_run_intervened_heads_total"
                           : "attnstat_run_interventions_total",
                   name, (int)e->rank, (long long)e->id,
                   (unsigned long long)(t->pass ? e->intervened_heads : e->interventions));
}

/* The operators' marks of live runs, by (run name, layer, head, rule): two processes of a job on
 * this node that silenced one key make one series. */
typedef struct {
    const char *run;
    int32_t layer, head;
    alerts_rule rule;
    feed_mark what;
} mark_row;

typedef struct {
    const stage_ctx *x;
    mark_row *v;
    size_t n, cap;
    int failed;
} mark_list;

static void mark_cb(void *ctx, feed_mark what, const feed_marked *m)
{
    mark_list *l = ctx;
    const run_entry *e = runs_get(l->x->runs, m->run_id);
    if (!is_live(e) || l->failed)
        return; /* a silence for a time outlives its run in the daemon; not on the page */
    if (l->n == l->cap) {
        size_t ncap = l->cap ? l->cap * 2 : 32;
        mark_row *nv = realloc(l->v, ncap * sizeof *nv);
        if (!nv) {
            l->failed = 1;
            return;
        }
        l->v = nv;
        l->cap = ncap;
    }
    l->v[l->n++] = (mark_row){e->name, m->layer, m->head, m->rule, what};
}

static int cmp_mark(const void *a, const void *b)
{
    const mark_row *p = a, *q = b;
    if (p->what != q->what)
        return p->what < q->what ? -1 : 1;
    int c = strcmp(p->run, q->run);
    if (c)
        return c;
    if (p->layer != q->layer)
        return p->layer < q->layer ? -1 : 1;
    if (p->head != q->head)
        return p->head < q->head ? -1 : 1;
    return (p->rule > q->rule) - (p->rule < q->rule);
}

static void render_marks(metrics_buf *out, const stage_ctx *x)
{
    mark_list l = {x, NULL, 0, 0, 0};
    if (alerts_feed_marks(x->feed, mark_cb, &l) != 0 || l.failed) {
        out->full = 1; /* the scrape's log line says memory ran out */
        free(l.v);
        return;
    }
    if (l.n > 1)
        qsort(l.v, l.n, sizeof *l.v, cmp_mark);
    static const struct {
        feed_mark what;
        const char *name, *help;
    } fam[] = {
        {FEED_SILENCE, "attnstat_head_silenced",
         "A silence in force on a head's rule (attnstat alerts silence): its alerts are not sent "
         "to watchers or --alert-exec; 1, keys without one have no series."},
        {FEED_ACK, "attnstat_head_alert_acknowledged",
         "An active alert on a head that someone acknowledged (attnstat alerts ack); 1, others "
         "have no series."},
    };
    char name[1024];
    for (size_t f = 0; f < sizeof fam / sizeof fam[0]; f++) {
        metrics_printf(out, "# HELP %s %s\n# TYPE %s gauge\n", fam[f].name, fam[f].help,
                       fam[f].name);
        for (size_t i = 0; i < l.n; i++) {
            const mark_row *m = &l.v[i];
            if (m->what != fam[f].what || (i > 0 && cmp_mark(m, &l.v[i - 1]) == 0))
                continue;
            metrics_label(m->run, name, sizeof name);
            metrics_printf(out, "%s{run=\"%s\",layer=\"%d\",head=\"%d\",rule=\"%s\"} 1\n",
                           fam[f].name, name, (int)m->layer, (int)m->head,
                           alerts_rule_name(m->rule));
        }
    }
    free(l.v);
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
    /* The rules that have a threshold, named in the HELP text as the series label them. */
    char rules[512] = "";
    alerts_config dc;
    alerts_config_default(&dc);
    for (int r = 1, at = 0; r <= (int)ALERTS_NRULES; r++) {
        double value;
        if (alerts_rule_threshold(&dc, (alerts_rule)r, &value, NULL) && at < (int)sizeof rules)
            at += snprintf(rules + at, sizeof rules - (size_t)at, "%s%s", at ? ", " : "",
                           alerts_rule_name((alerts_rule)r));
    }
    metrics_printf(out, "# HELP attnstat_run_threshold The alert thresholds in force for a live "
         "process of a run (the daemon's settings under the run's own, from its Hello), by rule: "
         "%s (entropy_drop: the fraction of the baseline).\n"
         "# TYPE attnstat_run_threshold gauge\n", rules);
    runs_each(x->runs, threshold_line, &t);
    metrics_printf(out, "# HELP attnstat_run_alert_transitions_suppressed Alert transitions of a "
         "live process neither recorded nor delivered: it raised more than alert_burst at "
         "alert_rate a second (processes with any only).\n"
         "# TYPE attnstat_run_alert_transitions_suppressed gauge\n");
    runs_each(x->runs, suppressed_line, &t);
    metrics_printf(out, "# HELP attnstat_run_interventions_total Interventions a live process "
         "recorded (what it did to its model: qk_clip's clips, one per layer and step) since "
         "this daemon started (processes with any only).\n"
         "# TYPE attnstat_run_interventions_total counter\n");
    t.pass = 0;
    runs_each(x->runs, interv_line, &t);
    metrics_printf(out, "# HELP attnstat_run_intervened_heads_total The heads those interventions "
         "named, summed (qk_clip: heads clipped).\n"
         "# TYPE attnstat_run_intervened_heads_total counter\n");
    t.pass = 1;
    runs_each(x->runs, interv_line, &t);
    render_marks(out, x);
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
