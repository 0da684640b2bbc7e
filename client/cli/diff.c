/* diff.c — `attnstat diff`: runs compared side by side per (layer, head) (see diff.h).
 *
 * How it works: each run is resolved (history_open_run, a read-only handle each) and given its
 * steps: --step, --from/--to, its own steps stored in --since/--until (timearg_steps), or by
 * default the steps every run has (the latest first step to the earliest last step of the runs'
 * summaries). Each of its layers (store_run_layers; one with --layer) is read as a trend over
 * those steps (store_trend, every tier) and folded per head into a cell: each statistic an alert
 * rule reads (statcol.c, from vocab.h), by its pool: a mean (a downsampled row weighted by the
 * samples it merged; the normalised entropy, the entropy, the sink mass, the distance) or an
 * extreme (a downsampled row's maximum: the max logit). The runs' cells, each list sorted by
 * (layer, head), are merged into rows; a row's key is the largest |later run - first run| of
 * --metric; rows with a run missing sort last.
 *
 * Stage: a command file of the CLI, called by main.c. Calls history.c, timearg.c, the store's read
 * half, statcol.c and out.c. */
#include "diff.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "history.h"
#include "options.h"
#include "out.h"
#include "statcol.h"
#include "store_read.h"
#include "timearg.h"

/* One run's (layer, head): per --metric choice k (statcol.c: the statistics the alert rules
 * read), its fold over the steps compared: by the statistic's pool, the mean (sum / w, a
 * downsampled row weighted by the samples it merged) or the extreme (ext: a downsampled row's
 * minimum or maximum). */
typedef struct {
    int32_t layer, head;
    double sum[VOCAB_NSTATS], w[VOCAB_NSTATS], ext[VOCAB_NSTATS];
    int64_t samples;
} diff_cell;

typedef struct {
    store *st;
    int64_t id;
    char *name;              /* escaped */
    int64_t from, to;        /* the steps compared */
    int64_t step_min, step_max, samples; /* its summary */
    diff_cell *cells;        /* sorted by (layer, head) */
    size_t n, cap;
    size_t layer_start;      /* the first cell of the layer being read */
    int32_t layer;
    int failed;
} diff_run_data;

/* store_trend() callback: a sample folded into its head's cell of the current layer. */
static int diff_sample(void *ctx, const store_sample *s)
{
    diff_run_data *r = ctx;
    size_t lo = r->layer_start, hi = r->n;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (r->cells[mid].head < s->head)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo == r->n || r->cells[lo].head != s->head) {
        if (r->n == r->cap) {
            size_t ncap = r->cap ? r->cap * 2 : 256;
            diff_cell *nc = realloc(r->cells, ncap * sizeof *nc);
            if (!nc) {
                r->failed = 1;
                return 1;
            }
            r->cells = nc;
            r->cap = ncap;
        }
        memmove(r->cells + lo + 1, r->cells + lo, (r->n - lo) * sizeof *r->cells);
        r->cells[lo] = (diff_cell){.layer = r->layer, .head = s->head};
        for (int k = 0; k < VOCAB_NSTATS; k++)
            r->cells[lo].ext[k] = NAN;
        r->n++;
    }
    diff_cell *c = &r->cells[lo];
    double w = (double)s->merged;
    for (int k = 0; k < statcol_nmetrics(); k++) {
        int i = statcol_metric_at(k), pool = statcol_pool(i);
        if (pool == VOCAB_POOL_MAX || pool == VOCAB_POOL_MIN) {
            const stats_head *x = pool == VOCAB_POOL_MAX ? (s->max ? s->max : &s->stats)
                                                         : (s->min ? s->min : &s->stats);
            double v = statcol_value(x, i);
            if (isfinite(v) && (isnan(c->ext[k]) ||
                                (pool == VOCAB_POOL_MAX ? v > c->ext[k] : v < c->ext[k])))
                c->ext[k] = v;
        } else {
            double v = statcol_value(&s->stats, i);
            if (isfinite(v)) {
                c->sum[k] += v * w;
                c->w[k] += w;
            }
        }
    }
    c->samples += s->merged;
    return 0;
}

typedef struct {
    int32_t *v;
    size_t n, cap;
    int failed;
} diff_layers;

static int diff_layer(void *ctx, int32_t layer)
{
    diff_layers *l = ctx;
    if (l->n == l->cap) {
        size_t ncap = l->cap ? l->cap * 2 : 64;
        int32_t *nv = realloc(l->v, ncap * sizeof *nv);
        if (!nv) {
            l->failed = 1;
            return 1;
        }
        l->v = nv;
        l->cap = ncap;
    }
    l->v[l->n++] = layer;
    return 0;
}

/* Reads run r's cells over its steps [r->from, r->to]. */
static int diff_read(const cli_args *a, diff_run_data *r)
{
    diff_layers l = {0};
    store_error err;
    store_status s = STORE_OK;
    if (a->layer_set)
        diff_layer(&l, a->layer);
    else
        s = store_run_layers(r->st, r->id, diff_layer, &l, &err);
    for (size_t i = 0; s == STORE_OK && !l.failed && !r->failed && i < l.n; i++) {
        r->layer = l.v[i];
        r->layer_start = r->n;
        s = store_trend(r->st, r->id, l.v[i], -1, r->from, r->to, 1, diff_sample, r, &err);
    }
    free(l.v);
    if (s != STORE_OK || l.failed || r->failed) {
        fprintf(stderr, "attnstat: cannot read run '%s': %s\n", r->name,
                s != STORE_OK ? out_safe(err.msg) : "out of memory");
        return CLI_EXIT_FAIL;
    }
    return CLI_EXIT_OK;
}

static int diff_summary(void *ctx, const store_run *run)
{
    diff_run_data *r = ctx;
    r->samples = run->samples;
    r->step_min = run->step_min;
    r->step_max = run->step_max;
    return 0;
}

/* The steps each run is compared over. */
static int diff_windows(const cli_args *a, diff_run_data *r, int n)
{
    if (a->step_set && (a->from != INT64_MIN || a->to != INT64_MAX || a->since_set ||
                        a->until_set)) {
        fprintf(stderr, "attnstat: --step S compares one step: not with --from, --to, --since "
                "or --until\n");
        return CLI_EXIT_USAGE;
    }
    if (a->from > a->to) {
        fprintf(stderr, "attnstat: --from %lld is after --to %lld\n", (long long)a->from,
                (long long)a->to);
        return CLI_EXIT_USAGE;
    }
    int given = a->step_set || a->from != INT64_MIN || a->to != INT64_MAX || a->since_set ||
                a->until_set;
    int64_t lo = INT64_MIN, hi = INT64_MAX;
    for (int i = 0; i < n; i++) {
        if (r[i].samples == 0) {
            fprintf(stderr, "attnstat: run '%s' has no samples yet\n", r[i].name);
            return CLI_EXIT_FAIL;
        }
        lo = r[i].step_min > lo ? r[i].step_min : lo;
        hi = r[i].step_max < hi ? r[i].step_max : hi;
    }
    if (!given && lo > hi) {
        fprintf(stderr, "attnstat: the runs have no step in common (");
        for (int i = 0; i < n; i++)
            fprintf(stderr, "%s%s: steps %lld..%lld", i ? "; " : "", r[i].name,
                    (long long)r[i].step_min, (long long)r[i].step_max);
        fprintf(stderr, "): compare them over --from/--to, or by time with --since/--until\n");
        return CLI_EXIT_FAIL;
    }
    for (int i = 0; i < n; i++) {
        if (a->step_set) {
            r[i].from = r[i].to = a->step;
        } else if (!given) {
            r[i].from = lo;
            r[i].to = hi;
        } else {
            int rc = timearg_steps(r[i].st, r[i].id, r[i].name, a, &r[i].from, &r[i].to);
            if (rc != CLI_EXIT_OK)
                return rc;
        }
    }
    return CLI_EXIT_OK;
}

/* ---- rows -------------------------------------------------------------------------------------*/
/* The table's short labels of the statistics diff has always compared (the others are labelled by
 * their `cli` name, and shown in the table only when --metric picks them: JSON and CSV carry
 * all). */
static const char *const diff_short[][2] = {
    {"entropy_norm", "en"}, {"entropy", "ent"}, {"max_logit", "ml"}};

static const char *diff_short_label(const char *metric)
{
    for (size_t j = 0; j < sizeof diff_short / sizeof diff_short[0]; j++)
        if (!strcmp(diff_short[j][0], metric))
            return diff_short[j][1];
    return NULL;
}

typedef struct {
    int32_t layer, head;
    double key;              /* the largest |change| of --metric; NaN: a run lacks the head */
} diff_row;

static int diff_by_key(const void *x, const void *y)
{
    const diff_row *p = x, *q = y;
    int pn = isnan(p->key), qn = isnan(q->key);
    if (pn != qn)
        return pn - qn;
    if (!pn && p->key != q->key)
        return p->key > q->key ? -1 : 1;
    if (p->layer != q->layer)
        return p->layer < q->layer ? -1 : 1;
    return (p->head > q->head) - (p->head < q->head);
}

static const diff_cell *diff_find(const diff_run_data *r, int32_t layer, int32_t head)
{
    size_t lo = 0, hi = r->n;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        const diff_cell *c = &r->cells[mid];
        if (c->layer < layer || (c->layer == layer && c->head < head))
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < r->n && r->cells[lo].layer == layer && r->cells[lo].head == head ? &r->cells[lo]
                                                                                  : NULL;
}

/* Choice k's value of a cell (NaN: none, or no cell). */
static double diff_value(const diff_cell *c, int k)
{
    if (!c)
        return NAN;
    int pool = statcol_pool(statcol_metric_at(k));
    if (pool == VOCAB_POOL_MAX || pool == VOCAB_POOL_MIN)
        return c->ext[k];
    return c->w[k] > 0 ? c->sum[k] / c->w[k] : NAN;
}

/* The table's and the records' columns for n runs: layer, head, then per metric each run's value
 * and each later run's difference from the first; in JSON and CSV also each run's name and
 * samples. Names are built into one buffer. */
typedef struct {
    out_col *cols;
    int ncols;
    char *names;
} diff_columns;

static int diff_make_columns(diff_columns *dc, int n, int chosen)
{
    const int nm = statcol_nmetrics();
    int ncols = 2 + 2 * n + nm * (2 * n - 1);
    dc->cols = calloc((size_t)ncols, sizeof *dc->cols);
    dc->names = malloc((size_t)ncols * 2 * 48);
    if (!dc->cols || !dc->names)
        return -1;
    char *p = dc->names;
    int k = 0;
#define DIFF_NAME(...) (snprintf(p, 48, __VA_ARGS__), p += 48, p - 48)
    dc->cols[k++] = (out_col){"layer", NULL, OUT_INT, 0, 1};
    dc->cols[k++] = (out_col){"head", NULL, OUT_INT, 0, 1};
    for (int i = 0; i < n; i++) {
        dc->cols[k++] = (out_col){DIFF_NAME("run_%c", 'a' + i), NULL, OUT_STR, 0, 0};
        dc->cols[k++] = (out_col){DIFF_NAME("samples_%c", 'a' + i), NULL, OUT_INT, 0, 0};
    }
    for (int m = 0; m < nm; m++) {
        const char *key = opt_metrics[m];
        const char *lab = diff_short_label(key);
        int st = statcol_metric_at(m), prec = statcol_digits(st);
        int shown = lab != NULL || m == chosen;
        if (!lab)
            lab = statcol_label(st);
        for (int i = 0; i < n; i++) {
            const char *kk = DIFF_NAME("%s_%c", key, 'a' + i);
            const char *ll = DIFF_NAME("%s_%c", lab, 'A' + i);
            dc->cols[k++] = (out_col){kk, ll, OUT_NUM, prec, shown};
        }
        for (int i = 1; i < n; i++) {
            const char *kk = DIFF_NAME("%s_%c_minus_a", key, 'a' + i);
            const char *ll = DIFF_NAME("%s_%c-A", lab, 'A' + i);
            dc->cols[k++] = (out_col){kk, ll, OUT_NUM, prec, shown};
        }
    }
#undef DIFF_NAME
    dc->ncols = k;
    return 0;
}

static int diff_print(const cli_args *a, diff_run_data *r, int n)
{
    int metric = -1; /* the --metric choice rows are sorted by */
    for (int k = 0; opt_metrics[k]; k++)
        if (!strcmp(opt_metrics[k], a->metric))
            metric = k;
    if (metric < 0) {
        fprintf(stderr, "attnstat: no statistic called '%s'\n", a->metric);
        return CLI_EXIT_USAGE;
    }
    size_t cap = 0;
    for (int i = 0; i < n; i++)
        cap += r[i].n;
    diff_row *rows = malloc((cap ? cap : 1) * sizeof *rows);
    size_t *at = calloc((size_t)n, sizeof *at);
    diff_columns dc = {0};
    out_val *v = NULL;
    int rc = CLI_EXIT_FAIL;
    if (!rows || !at || diff_make_columns(&dc, n, metric) != 0 ||
        !(v = malloc((size_t)dc.ncols * sizeof *v))) {
        fprintf(stderr, "attnstat: out of memory\n");
        goto out;
    }
    /* the union of the runs' (layer, head), in order */
    size_t nrows = 0;
    for (;;) {
        const diff_cell *next = NULL;
        for (int i = 0; i < n; i++) {
            const diff_cell *c = at[i] < r[i].n ? &r[i].cells[at[i]] : NULL;
            if (c && (!next || c->layer < next->layer ||
                      (c->layer == next->layer && c->head < next->head)))
                next = c;
        }
        if (!next)
            break;
        diff_row row = {next->layer, next->head, 0};
        double first = NAN;
        int missing = 0;
        for (int i = 0; i < n; i++) {
            const diff_cell *c = at[i] < r[i].n ? &r[i].cells[at[i]] : NULL;
            int here = c && c->layer == row.layer && c->head == row.head;
            double val = diff_value(here ? c : NULL, metric);
            if (i == 0)
                first = val;
            else if (fabs(val - first) > row.key)
                row.key = fabs(val - first);
            missing |= isnan(val);
            at[i] += here;
        }
        if (missing)
            row.key = NAN;
        rows[nrows++] = row;
    }
    qsort(rows, nrows, sizeof *rows, diff_by_key);
    if (a->limit > 0 && (size_t)a->limit < nrows)
        nrows = (size_t)a->limit;
    if (a->fmt == OUT_TABLE) {
        for (int i = 0; i < n; i++)
            printf("%c  run %s (id %lld): steps %lld..%lld\n", 'A' + i, r[i].name,
                   (long long)r[i].id, (long long)r[i].from, (long long)r[i].to);
        char more[96] = "";
        if (!diff_short_label(a->metric))
            snprintf(more, sizeof more, ", %s = mean %s", statcol_label(statcol_metric_at(metric)),
                     a->metric);
        printf("per (layer, head): en = mean normalised entropy (0..1), ent = mean entropy "
               "(nats), ml = largest max logit%s; X-A = run X minus run A; sorted by the largest "
               "change of %s\n\n", more, a->metric);
    }
    out_set o;
    out_begin(&o, a->fmt, stdout, dc.cols, dc.ncols);
    for (size_t j = 0; j < nrows; j++) {
        int k = 0;
        v[k++] = out_i(rows[j].layer);
        v[k++] = out_i(rows[j].head);
        for (int i = 0; i < n; i++) {
            const diff_cell *c = diff_find(&r[i], rows[j].layer, rows[j].head);
            v[k++] = out_s(r[i].name);
            v[k++] = out_i(c ? c->samples : 0);
        }
        for (int m = 0; m < statcol_nmetrics(); m++) {
            double first = diff_value(diff_find(&r[0], rows[j].layer, rows[j].head), m);
            for (int i = 0; i < n; i++)
                v[k++] = out_d(diff_value(diff_find(&r[i], rows[j].layer, rows[j].head), m));
            for (int i = 1; i < n; i++)
                v[k++] = out_d(diff_value(diff_find(&r[i], rows[j].layer, rows[j].head), m) -
                               first);
        }
        out_add(&o, v);
    }
    rc = out_end(&o) == 0 ? CLI_EXIT_OK : CLI_EXIT_FAIL;
    if (rc == CLI_EXIT_OK && nrows == 0) {
        fprintf(stderr, "attnstat: no sample of the runs in the steps compared%s\n",
                a->layer_set ? " (of that layer)" : "");
        rc = CLI_EXIT_FAIL;
    }
out:
    free(v);
    free(dc.cols);
    free(dc.names);
    free(at);
    free(rows);
    return rc;
}

int diff_run(const cli_args *a)
{
    if (a->nruns < 2) {
        fprintf(stderr, "attnstat: diff compares two runs or more: attnstat diff RUN_A RUN_B "
                "(or --run A --run B)\n");
        return CLI_EXIT_USAGE;
    }
    int n = a->nruns;
    diff_run_data *r = calloc((size_t)n, sizeof *r);
    if (!r) {
        fprintf(stderr, "attnstat: out of memory\n");
        return CLI_EXIT_FAIL;
    }
    int rc = CLI_EXIT_OK;
    for (int i = 0; i < n && rc == CLI_EXIT_OK; i++) {
        cli_args one = *a;
        one.run = a->runs[i];
        rc = history_open_run(&one, &r[i].st, &r[i].id, &r[i].name);
        store_error err;
        if (rc == CLI_EXIT_OK &&
            store_get_run(r[i].st, r[i].id, diff_summary, &r[i], &err) != STORE_OK) {
            fprintf(stderr, "attnstat: cannot read run '%s': %s\n", r[i].name,
                    out_safe(err.msg));
            rc = CLI_EXIT_FAIL;
        }
    }
    if (rc == CLI_EXIT_OK)
        rc = diff_windows(a, r, n);
    for (int i = 0; i < n && rc == CLI_EXIT_OK; i++)
        rc = diff_read(a, &r[i]);
    if (rc == CLI_EXIT_OK)
        rc = diff_print(a, r, n);
    for (int i = 0; i < n; i++) {
        if (r[i].st)
            store_close(r[i].st);
        free(r[i].name);
        free(r[i].cells);
    }
    free(r);
    return rc;
}
