/* statcol.h — the attnstat CLI's view of vocab/vocab.h's per-head statistics: the columns of
 * the sample tables (trend, heads, job), the --metric choices and how a heatmap of one is drawn,
 * all from the rows, so that a statistic added to the table shows in the CLI without a hand here.
 *
 *   column     key = the row's name (JSON key, CSV header), label = its `cli`, decimals = its
 *              `digits`, in table order. A view names the rows it leaves out of the table (kept
 *              in JSON and CSV) or out altogether.
 *   --metric   options.c's choices (opt_metrics): the statistics an alert rule reads (VOCAB_RULES'
 *              stat), in the rules' order, each by its row's name less a trailing "_mean"
 *              (entropy_norm, entropy, max_logit, sink_mass, distance: the names the option has
 *              always taken; `cli` abbreviates entropy_norm). Low is bad unless its rule alerts
 *              above a threshold (VOCAB_ABOVE).
 *   heatmap    a ratio (VOCAB_RATIO) on 0..1; a statistic whose rule alerts above a threshold on
 *              0..max(largest value, the threshold's default); any other on 0..its largest value.
 *
 * Stage: a leaf of the CLI above out.c; includes vocab.h and kernels/stats.h (stats_head). */
#ifndef ATTNSTAT_CLI_STATCOL_H
#define ATTNSTAT_CLI_STATCOL_H

#include "out.h"
#include "stats.h"
#include "vocab.h"

/* The statistic `i` (VOCAB_STATS order) of h. */
double statcol_value(const stats_head *h, int i);

/* The statistic --metric m names (its VOCAB_STATS index), -1 when none. */
int statcol_metric(const char *m);

/* How many --metric choices there are, and the statistic of choice k (opt_metrics[k]). */
int statcol_nmetrics(void);
int statcol_metric_at(int k);

/* Statistic i's row: its pool (VOCAB_POOL_*), its `cli` label and its `digits`. */
int statcol_pool(int i);
const char *statcol_label(int i);
int statcol_digits(int i);

/* 1 when high values of statistic i are the bad ones (a rule alerts above a threshold). */
int statcol_high_is_bad(int i);

/* What the bad end of statistic i's heatmap means: "collapsing" (an entropy low), "logits
 * growing" (a logit high), else "<rule> alerts". */
const char *statcol_bad_means(int i);

/* The colour scale of statistic i's heatmap, given the largest finite value drawn (-inf: none). */
void statcol_scale(int i, double vmax, double *lo, double *hi);

/* Appends the statistics' columns to cols[*n...] (room for VOCAB_NSTATS more), leaving out the
 * rows named in omit and out of the table those named in hide (each NULL-terminated, or NULL). */
void statcol_cols(out_col *cols, int *n, const char *const *omit, const char *const *hide);

/* Appends h's statistics to v[*n...], the same rows as statcol_cols with the same omit. */
void statcol_vals(out_val *v, int *n, const stats_head *h, const char *const *omit);

#endif /* ATTNSTAT_CLI_STATCOL_H */
