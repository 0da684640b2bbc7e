/* stats_cli.c — the CLI's columns, --metric choices and heatmap scales from vocab/vocab.h's
 * statistics (see stats_cli.h).
 *
 * Stage: a leaf of the CLI; reads options.c's --metric choices, calls out.c's value constructors
 * and libc. */
#include "stats_cli.h"

#include "options.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

typedef struct {
    const char *name, *cli;
    int digits, unit, pool;
} stats_cli_row;

static const stats_cli_row stats_cli_rows[VOCAB_NSTATS] = {
#define X(name, unit, pack, since, pool, weight, lo, hi, absent, metric, help, cli, digits)       \
    {#name, cli, digits, unit, pool},
    VOCAB_STATS(X)
#undef X
};

enum {
#define X(name, ...) STATS_CLI_##name,
    VOCAB_STATS(X)
#undef X
    STATS_CLI_NONE /* a rule on a count (nonfinite_rows) */
};
/* The VOCAB_STATS index of a row's name, STATS_CLI_NONE for a count. */
#define X(name, ...) STATS_CLI_##name = STATS_CLI_NONE,
enum { VOCAB_COUNTS(X) };
#undef X

/* The thresholds' defaults, by the rules that compare with them. */
enum {
#define X(name, ...) STATS_CLI_TH_##name,
    VOCAB_THRESHOLDS(X)
#undef X
    STATS_CLI_TH_none /* a rule without a threshold (nonfinite) */
};
static const double stats_cli_th_default[] = {
#define X(name, type, def, ...) def,
    VOCAB_THRESHOLDS(X)
#undef X
    NAN};

/* The rules, by the statistic each reads: its comparison and its threshold. */
typedef struct {
    int stat, cmp, threshold;
} stats_cli_rule;

static const char *const stats_cli_rule_names[VOCAB_NRULES] = {
#define X(c, v, rname, ...) rname,
    VOCAB_RULES(X)
#undef X
};

static const stats_cli_rule stats_cli_rules[VOCAB_NRULES] = {
#define X(c, v, rname, stat, cmp, threshold) {STATS_CLI_##stat, cmp, STATS_CLI_TH_##threshold},
    VOCAB_RULES(X)
#undef X
};

/* The rule that reads statistic i, -1 when none. */
static int stats_cli_rule_of(int i)
{
    for (int r = 0; r < VOCAB_NRULES; r++)
        if (stats_cli_rules[r].stat == i)
            return r;
    return -1;
}

double stats_cli_value(const stats_head *h, int i)
{
    switch (i) {
#define X(name, ...)                                                                               \
    case STATS_CLI_##name: return h->name;
        VOCAB_STATS(X)
#undef X
    }
    return NAN;
}

static int stats_cli_metric_stat[VOCAB_NSTATS];
static int stats_cli_nmetric = -1;

/* Each --metric choice's statistic: the row called so, or so plus "_mean". */
static void stats_cli_init(void)
{
    if (stats_cli_nmetric >= 0)
        return;
    int n = 0;
    for (int k = 0; opt_metrics[k] && n < VOCAB_NSTATS; k++) {
        size_t len = strlen(opt_metrics[k]);
        for (int i = 0; i < VOCAB_NSTATS; i++) {
            const char *name = stats_cli_rows[i].name;
            if (!strncmp(name, opt_metrics[k], len) &&
                (name[len] == '\0' || !strcmp(name + len, "_mean"))) {
                stats_cli_metric_stat[n++] = i;
                break;
            }
        }
    }
    stats_cli_nmetric = n;
}

int stats_cli_metric(const char *m)
{
    stats_cli_init();
    for (int k = 0; k < stats_cli_nmetric; k++)
        if (!strcmp(opt_metrics[k], m))
            return stats_cli_metric_stat[k];
    return -1;
}

int stats_cli_nmetrics(void)
{
    stats_cli_init();
    return stats_cli_nmetric;
}

int stats_cli_metric_at(int k)
{
    stats_cli_init();
    return stats_cli_metric_stat[k];
}

int stats_cli_pool(int i)
{
    return stats_cli_rows[i].pool;
}

const char *stats_cli_label(int i)
{
    return stats_cli_rows[i].cli;
}

int stats_cli_digits(int i)
{
    return stats_cli_rows[i].digits;
}

int stats_cli_high_is_bad(int i)
{
    int r = stats_cli_rule_of(i);
    return r >= 0 && stats_cli_rules[r].cmp == VOCAB_ABOVE;
}

const char *stats_cli_bad_means(int i)
{
    int r = i >= 0 ? stats_cli_rule_of(i) : -1;
    if (r < 0)
        return "";
    int unit = stats_cli_rows[i].unit, cmp = stats_cli_rules[r].cmp;
    if ((cmp == VOCAB_BELOW || cmp == VOCAB_DROP) && (unit == VOCAB_NATS || unit == VOCAB_RATIO))
        return "collapsing";
    if (cmp == VOCAB_ABOVE && unit == VOCAB_LOGIT)
        return "logits growing";
    static char buf[VOCAB_NRULES][96];
    snprintf(buf[r], sizeof buf[r], "%s alerts", stats_cli_rule_names[r]);
    return buf[r];
}

void stats_cli_scale(int i, double vmax, double *lo, double *hi)
{
    *lo = 0;
    if (i >= 0 && stats_cli_rows[i].unit == VOCAB_RATIO) {
        *hi = 1;
        return;
    }
    int r = i >= 0 ? stats_cli_rule_of(i) : -1;
    if (r >= 0 && stats_cli_rules[r].cmp == VOCAB_ABOVE) {
        double t = stats_cli_th_default[stats_cli_rules[r].threshold];
        *hi = vmax > t ? vmax : t;
        return;
    }
    *hi = vmax > 0 ? vmax : 1;
}

static int stats_cli_named(const char *const *list, const char *name)
{
    for (int k = 0; list && list[k]; k++)
        if (!strcmp(list[k], name))
            return 1;
    return 0;
}

void stats_cli_cols(out_col *cols, int *n, const char *const *omit, const char *const *hide)
{
    for (int i = 0; i < VOCAB_NSTATS; i++) {
        const stats_cli_row *r = &stats_cli_rows[i];
        if (stats_cli_named(omit, r->name))
            continue;
        cols[(*n)++] = (out_col){r->name, strcmp(r->cli, r->name) ? r->cli : NULL, OUT_NUM,
                                 r->digits, !stats_cli_named(hide, r->name)};
    }
}

void stats_cli_vals(out_val *v, int *n, const stats_head *h, const char *const *omit)
{
    for (int i = 0; i < VOCAB_NSTATS; i++)
        if (!stats_cli_named(omit, stats_cli_rows[i].name))
            v[(*n)++] = out_d(stats_cli_value(h, i));
}
