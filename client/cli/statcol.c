/* statcol.c — the CLI's columns, --metric choices and heatmap scales from vocab/vocab.h's
 * statistics (see statcol.h).
 *
 * Stage: a leaf of the CLI; reads options.c's --metric choices, calls out.c's value constructors
 * and libc. */
#include "statcol.h"

#include "options.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

typedef struct {
    const char *name, *cli;
    int digits, unit, pool;
} statcol_row;

static const statcol_row statcol_rows[VOCAB_NSTATS] = {
#define X(name, unit, pack, since, pool, weight, lo, hi, absent, metric, help, cli, digits, ...)  \
    {#name, cli, digits, unit, pool},
    VOCAB_STATS(X)
#undef X
};

enum {
#define X(name, ...) STATCOL_##name,
    VOCAB_STATS(X)
#undef X
    STATCOL_NONE /* a rule on a count (nonfinite_rows) */
};
/* The VOCAB_STATS index of a row's name, STATCOL_NONE for a count. */
#define X(name, ...) STATCOL_##name = STATCOL_NONE,
enum { VOCAB_COUNTS(X) };
#undef X

/* The thresholds' defaults, by the rules that compare with them. */
enum {
#define X(name, ...) STATCOL_TH_##name,
    VOCAB_THRESHOLDS(X)
#undef X
    STATCOL_TH_none /* a rule without a threshold (nonfinite) */
};
static const double statcol_th_default[] = {
#define X(name, type, def, ...) def,
    VOCAB_THRESHOLDS(X)
#undef X
    NAN};

/* The rules, by the statistic each reads: its comparison and its threshold. */
typedef struct {
    int stat, cmp, threshold;
} statcol_rule;

static const char *const statcol_rule_names[VOCAB_NRULES] = {
#define X(c, v, rname, ...) rname,
    VOCAB_RULES(X)
#undef X
};

static const statcol_rule statcol_rules[VOCAB_NRULES] = {
#define X(c, v, rname, stat, cmp, threshold) {STATCOL_##stat, cmp, STATCOL_TH_##threshold},
    VOCAB_RULES(X)
#undef X
};

/* The rule that reads statistic i, -1 when none. */
static int statcol_rule_of(int i)
{
    for (int r = 0; r < VOCAB_NRULES; r++)
        if (statcol_rules[r].stat == i)
            return r;
    return -1;
}

double statcol_value(const stats_head *h, int i)
{
    switch (i) {
#define X(name, ...)                                                                               \
    case STATCOL_##name: return h->name;
        VOCAB_STATS(X)
#undef X
    }
    return NAN;
}

static int statcol_metric_stat[VOCAB_NSTATS];
static int statcol_nmetric = -1;

/* Each --metric choice's statistic: the row called so, or so plus "_mean". */
static void statcol_init(void)
{
    if (statcol_nmetric >= 0)
        return;
    int n = 0;
    for (int k = 0; opt_metrics[k] && n < VOCAB_NSTATS; k++) {
        size_t len = strlen(opt_metrics[k]);
        for (int i = 0; i < VOCAB_NSTATS; i++) {
            const char *name = statcol_rows[i].name;
            if (!strncmp(name, opt_metrics[k], len) &&
                (name[len] == '\0' || !strcmp(name + len, "_mean"))) {
                statcol_metric_stat[n++] = i;
                break;
            }
        }
    }
    statcol_nmetric = n;
}

int statcol_metric(const char *m)
{
    statcol_init();
    for (int k = 0; k < statcol_nmetric; k++)
        if (!strcmp(opt_metrics[k], m))
            return statcol_metric_stat[k];
    return -1;
}

int statcol_nmetrics(void)
{
    statcol_init();
    return statcol_nmetric;
}

int statcol_metric_at(int k)
{
    statcol_init();
    return statcol_metric_stat[k];
}

int statcol_pool(int i)
{
    return statcol_rows[i].pool;
}

const char *statcol_label(int i)
{
    return statcol_rows[i].cli;
}

int statcol_digits(int i)
{
    return statcol_rows[i].digits;
}

int statcol_high_is_bad(int i)
{
    int r = statcol_rule_of(i);
    return r >= 0 && statcol_rules[r].cmp == VOCAB_ABOVE;
}

const char *statcol_bad_means(int i)
{
    int r = i >= 0 ? statcol_rule_of(i) : -1;
    if (r < 0)
        return "";
    int unit = statcol_rows[i].unit, cmp = statcol_rules[r].cmp;
    if ((cmp == VOCAB_BELOW || cmp == VOCAB_DROP) && (unit == VOCAB_NATS || unit == VOCAB_RATIO))
        return "collapsing";
    if (cmp == VOCAB_ABOVE && unit == VOCAB_LOGIT)
        return "logits growing";
    static char buf[VOCAB_NRULES][96];
    snprintf(buf[r], sizeof buf[r], "%s alerts", statcol_rule_names[r]);
    return buf[r];
}

void statcol_scale(int i, double vmax, double *lo, double *hi)
{
    *lo = 0;
    if (i >= 0 && statcol_rows[i].unit == VOCAB_RATIO) {
        *hi = 1;
        return;
    }
    int r = i >= 0 ? statcol_rule_of(i) : -1;
    if (r >= 0 && statcol_rules[r].cmp == VOCAB_ABOVE) {
        double t = statcol_th_default[statcol_rules[r].threshold];
        *hi = vmax > t ? vmax : t;
        return;
    }
    *hi = vmax > 0 ? vmax : 1;
}

static int statcol_named(const char *const *list, const char *name)
{
    for (int k = 0; list && list[k]; k++)
        if (!strcmp(list[k], name))
            return 1;
    return 0;
}

void statcol_cols(out_col *cols, int *n, const char *const *omit, const char *const *hide)
{
    for (int i = 0; i < VOCAB_NSTATS; i++) {
        const statcol_row *r = &statcol_rows[i];
        if (statcol_named(omit, r->name))
            continue;
        cols[(*n)++] = (out_col){r->name, strcmp(r->cli, r->name) ? r->cli : NULL, OUT_NUM,
                                 r->digits, !statcol_named(hide, r->name)};
    }
}

void statcol_vals(out_val *v, int *n, const stats_head *h, const char *const *omit)
{
    for (int i = 0; i < VOCAB_NSTATS; i++)
        if (!statcol_named(omit, statcol_rows[i].name))
            v[(*n)++] = out_d(statcol_value(h, i));
}
