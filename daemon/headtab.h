/* headtab.h — the per-head half of the metrics: the latest statistics of every (run, global layer,
 * global head) this daemon stored, the alerts raised on each, and their Prometheus text under the
 * cardinality the operator chose (metrics_heads, metrics_top).
 *
 * Stage: metrics, beside the flow. The loop feeds it each committed batch (headtab_observe) and
 * each alert transition (headtab_alert), and renders it at a scrape; it calls store_job.h's pooling,
 * metrics.h's text buffer and the log, nothing else of the daemon. Loop thread only.
 *
 * Keys and pooling. An entry is keyed by the run's NAME (the job: every process of a job shares
 * it), the global layer and the global head (the layout applied, push.c). On one node several
 * processes may report the same key at the same step (data-parallel replicas, context-parallel
 * ranks sharing a node): their samples are pooled into the statistics of the union of their rows
 * (store_merge_stats). A sample of another step replaces the entry (the newest step wins, whichever
 * way the steps go: a job resumed from a checkpoint goes back); a process that reports the same
 * step again replaces it too. Across nodes, Prometheus' recording rules pool the nodes' series
 * (deploy/prometheus/attnstat.rules.yml).
 *
 * The end of a run. An entry belongs to the processes that fed its latest step (their run ids,
 * up to 8 of them are remembered; past that, to every process of its run name). When
 * none of them is live any more (its run ended: Goodbye, run_grace_ms passed, run_idle_ms, deleted)
 * the entry goes at the next headtab_sweep, which the loop runs before every scrape: a job that
 * ended leaves the page at once, its per-layer aggregates and raised alerts with it, and
 * Prometheus marks its series stale at its next scrape, so no rule fires on what it last said. An
 * entry made by an alert alone (restored at start-up) goes when its alerts clear or when no process
 * of its run name is live. A clear never makes an entry (the run's end resolves its alerts after
 * the sweep may have dropped them).
 *
 * Bounds. At most max_heads entries (metrics_max_heads), shared evenly by the run names that have
 * keys here (or keys left out): a run grows only to its share, and a run under its share takes
 * room from those over theirs when the table is full (their entries with an alert raised kept
 * first, then the most recently updated). A new key that does not fit is left out: counted
 * (attnstat_metrics_heads_untracked_total), remembered per run (up to 4 x max_heads keys:
 * attnstat_metrics_run_heads_left_out), taken in when room comes, and said once per run in the
 * log. An entry not updated for stale_ms (no sample, no alert transition) is dropped at the next
 * headtab_expire: a live process that stopped pushing a head leaves it after metrics_stale_s.
 *
 * What a scrape shows (headtab_render), every series labelled run, layer (and head):
 *   HEADTAB_ALL     every head: attnstat_head_* families (entropy normalised, entropy, max logit,
 *                   collapsed fraction, step; non-finite rows where any), per-layer aggregates
 *                   (attnstat_layer_*) and the raised alerts (attnstat_head_alert{rule}).
 *   HEADTAB_TOP     per run, the `top` heads of lowest normalised entropy and the `top` heads of
 *                   highest max logit, and every head with an alert raised; the per-layer
 *                   aggregates of every layer; the raised alerts. The default: about
 *                   2 x top x 6 + layers x 5 series per job, whatever the model's size.
 *   HEADTAB_LAYERS  the per-layer aggregates and the raised alerts only.
 *   HEADTAB_OFF     nothing of this table (the daemon's counters only).
 */
#ifndef ATTNSTAT_HEADTAB_H
#define ATTNSTAT_HEADTAB_H

#include <stddef.h>
#include <stdint.h>

#include "metrics.h"
#include "stats.h"

typedef enum { HEADTAB_TOP = 0, HEADTAB_ALL, HEADTAB_LAYERS, HEADTAB_OFF } headtab_mode;

/* The mode called name ("top", "all", "layers", "off"); -1 when none is. */
int headtab_mode_from(const char *name);

typedef struct headtab headtab;

/* A table of at most max_heads entries (>= 1). NULL on no memory. */
headtab *headtab_new(uint32_t max_heads);
void headtab_free(headtab *t);

/* The heads of one stored push: heads[i] is global head head_base + i of global layer `layer`
 * of run `run` (its name), pushed by the process whose run id is run_id. now_ms: its time. */
void headtab_observe(headtab *t, const char *run, int64_t run_id, int32_t layer, int32_t head_base,
                     const stats_head *heads, int32_t nheads, int64_t step, int64_t now_ms);

/* An alert transition of rule (1 .. VOCAB_NRULES, proto's AlertRule) on (run, layer, head): raised 1 or
 * cleared 0. Raises and clears are counted per rule, so that two processes' alerts on one key
 * (replicas) hold until both cleared. */
void headtab_alert(headtab *t, const char *run, int32_t layer, int32_t head, int rule, int raised,
                   int64_t now_ms);

/* Drops the entries not updated since now_ms - stale_ms. */
void headtab_expire(headtab *t, int64_t now_ms, int64_t stale_ms);

/* Is the process run_id of run (its name) live (a client says Hello for it, or it waits for one
 * within run_grace_ms)? run_id 0: is any process of run live? Nonzero when it is. */
typedef int (*headtab_live_fn)(void *ctx, const char *run, int64_t run_id);

/* Drops the entries none of whose processes is live (see "The end of a run"), with the runs left
 * without an entry. Returns how many entries it dropped. */
uint32_t headtab_sweep(headtab *t, headtab_live_fn live, void *ctx);

/* Entries kept; new keys refused for want of room (since headtab_new). */
size_t headtab_count(const headtab *t);
uint64_t headtab_untracked(const headtab *t);

/* The Prometheus text of the table in mode (top: the N of HEADTAB_TOP) into out, with the table's
 * own gauges (attnstat_metrics_heads, attnstat_metrics_heads_untracked_total, the share and each
 * run's keys kept and left out). */
void headtab_render(const headtab *t, headtab_mode mode, uint32_t top, metrics_buf *out);

#endif /* ATTNSTAT_HEADTAB_H */
