/* summary.c — `attnstat trend` without --head: one layer of a run summarised over its heads, in a
 * bounded number of buckets of steps (see summary.h).
 *
 * How it works: the layer's step range (the run's, within the window asked for) is cut into at
 * most N buckets of equal width; the layer's trend (store_trend, every tier) streams by in step
 * order, so one bucket is filled at a time and printed when the next begins: memory holds one
 * bucket, its heads, and two doubles per bucket for the sparklines. A downsampled row of the
 * store (a window of steps kept as min / mean / max) lands in the bucket of its first step with
 * its minimum, maximum and its mean weighted by the samples it merged.
 *
 * Stage: a command file of the CLI, called by history.c. Calls the store's read half and out.c. */
#include "summary.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "out.h"
#include "store_read.h"

#define SUMMARY_DEFAULT_BUCKETS 30

static const out_col summary_cols[] = {
    {"run", NULL, OUT_STR, 0, 0},
    {"run_id", NULL, OUT_INT, 0, 0},
    {"layer", NULL, OUT_INT, 0, 0},
    {"steps", NULL, OUT_STR, 0, 1},
    {"step_first", NULL, OUT_INT, 0, 0},
    {"step_last", NULL, OUT_INT, 0, 0},
    {"samples", NULL, OUT_INT, 0, 0},
    {"heads", NULL, OUT_INT, 0, 1},
    {"entropy_norm_min", "en_min", OUT_NUM, 3, 1},
    {"entropy_norm_min_head", "min@", OUT_NUM, 0, 1},
    {"entropy_norm_mean", "en_mean", OUT_NUM, 3, 1},
    {"entropy_norm_max", "en_max", OUT_NUM, 3, 1},
    {"entropy_mean", "entropy", OUT_NUM, 3, 1},
    {"max_logit_min", NULL, OUT_NUM, 2, 0},
    {"max_logit_mean", "ml_mean", OUT_NUM, 2, 1},
    {"max_logit_max", "ml_max", OUT_NUM, 2, 1},
    {"max_logit_max_head", "max@", OUT_NUM, 0, 1},
    {"collapsed_frac_mean", "collapsed", OUT_NUM, 3, 1},
    {"nonfinite_rows", "nonfinite", OUT_INT, 0, 1},
};
#define SUMMARY_NCOLS ((int)(sizeof summary_cols / sizeof summary_cols[0]))

/* A running minimum, mean and maximum of one quantity, with the head of each extreme. */
typedef struct {
    double lo, hi, sum, weight;
    int32_t lo_head, hi_head;
} summary_acc;

static void summary_acc_reset(summary_acc *x)
{
    *x = (summary_acc){INFINITY, -INFINITY, 0, 0, -1, -1};
}

/* A sample's value (mean, weighted by the samples it stands for) and its extremes (a sample's
 * own value; a downsampled row's minimum and maximum). Non-finite values are left out. */
static void summary_acc_add(summary_acc *x, double mean, double lo, double hi, double weight,
                            int32_t head)
{
    if (isfinite(mean)) {
        x->sum += mean * weight;
        x->weight += weight;
    }
    if (isfinite(lo) && lo < x->lo) {
        x->lo = lo;
        x->lo_head = head;
    }
    if (isfinite(hi) && hi > x->hi) {
        x->hi = hi;
        x->hi_head = head;
    }
}

static double summary_mean(const summary_acc *x)
{
    return x->weight > 0 ? x->sum / x->weight : NAN;
}

typedef struct {
    const cli_args *a;
    const char *run;
    int64_t run_id;
    out_set o;
    uint64_t width;          /* steps per bucket */
    int64_t lo;              /* the first step of bucket 0 */
    int64_t nb;              /* buckets */
    /* the bucket being filled */
    int64_t cur;             /* its index; -1: none yet */
    int64_t first, last, samples, nonfinite;
    int32_t *heads;          /* distinct heads seen in it, sorted */
    size_t nheads, cap;
    summary_acc en, ent, ml, col;
    /* per bucket, for the sparklines */
    double *spark_en, *spark_ml;
    size_t rows;
    int failed;
} summary_ctx;

static int summary_add_head(summary_ctx *c, int32_t head)
{
    size_t lo = 0, hi = c->nheads;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (c->heads[mid] < head)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo < c->nheads && c->heads[lo] == head)
        return 0;
    if (c->nheads == c->cap) {
        size_t ncap = c->cap ? c->cap * 2 : 64;
        int32_t *n = realloc(c->heads, ncap * sizeof *n);
        if (!n)
            return -1;
        c->heads = n;
        c->cap = ncap;
    }
    memmove(c->heads + lo + 1, c->heads + lo, (c->nheads - lo) * sizeof *c->heads);
    c->heads[lo] = head;
    c->nheads++;
    return 0;
}

static void summary_flush(summary_ctx *c)
{
    if (c->cur < 0)
        return;
    char steps[64];
    snprintf(steps, sizeof steps, "%lld..%lld", (long long)c->first, (long long)c->last);
    out_val v[] = {out_s(c->run),
                   out_i(c->run_id),
                   out_i(c->a->layer),
                   out_s(steps),
                   out_i(c->first),
                   out_i(c->last),
                   out_i(c->samples),
                   out_i((int64_t)c->nheads),
                   out_d(c->en.lo_head >= 0 ? c->en.lo : NAN),
                   out_d(c->en.lo_head >= 0 ? c->en.lo_head : NAN),
                   out_d(summary_mean(&c->en)),
                   out_d(c->en.hi_head >= 0 ? c->en.hi : NAN),
                   out_d(summary_mean(&c->ent)),
                   out_d(c->ml.lo_head >= 0 ? c->ml.lo : NAN),
                   out_d(summary_mean(&c->ml)),
                   out_d(c->ml.hi_head >= 0 ? c->ml.hi : NAN),
                   out_d(c->ml.hi_head >= 0 ? c->ml.hi_head : NAN),
                   out_d(summary_mean(&c->col)),
                   out_i(c->nonfinite)};
    out_add(&c->o, v);
    c->spark_en[c->cur] = c->en.lo_head >= 0 ? c->en.lo : NAN;
    c->spark_ml[c->cur] = c->ml.hi_head >= 0 ? c->ml.hi : NAN;
    c->rows++;
    c->cur = -1;
}

static int summary_sample(void *ctx, const store_sample *s)
{
    summary_ctx *c = ctx;
    /* a downsampled row that starts before the range lands in bucket 0 */
    int64_t b = s->step < c->lo ? 0 : (int64_t)(((uint64_t)s->step - (uint64_t)c->lo) / c->width);
    if (b >= c->nb)
        b = c->nb - 1;
    if (b != c->cur) {
        summary_flush(c);
        c->cur = b;
        c->first = s->step;
        c->samples = c->nonfinite = 0;
        c->nheads = 0;
        summary_acc_reset(&c->en);
        summary_acc_reset(&c->ent);
        summary_acc_reset(&c->ml);
        summary_acc_reset(&c->col);
    }
    c->last = s->step_last > c->last || c->samples == 0 ? s->step_last : c->last;
    c->samples += s->merged;
    const stats_head *h = &s->stats;
    const stats_head *lo = s->min ? s->min : h, *hi = s->max ? s->max : h;
    double w = (double)s->merged;
    c->nonfinite += h->nonfinite_rows * s->merged;
    summary_acc_add(&c->en, h->entropy_norm_mean, lo->entropy_norm_mean, hi->entropy_norm_mean, w,
                    s->head);
    summary_acc_add(&c->ent, h->entropy_mean, lo->entropy_mean, hi->entropy_mean, w, s->head);
    summary_acc_add(&c->ml, h->max_logit, lo->max_logit, hi->max_logit, w, s->head);
    summary_acc_add(&c->col, h->collapsed_frac, lo->collapsed_frac, hi->collapsed_frac, w,
                    s->head);
    if (summary_add_head(c, s->head) != 0) {
        c->failed = 1;
        return 1;
    }
    return 0;
}

/* store_get_run() callback: the run's step range. */
static int summary_run_steps(void *ctx, const store_run *r)
{
    int64_t *v = ctx;
    v[0] = r->samples;
    v[1] = r->step_min;
    v[2] = r->step_max;
    return 0;
}

int summary_trend(const cli_args *a, store *st, int64_t run_id, const char *run, int64_t from,
                  int64_t to, size_t *rows)
{
    *rows = 0;
    int64_t r[3] = {0, 0, 0};
    store_error err;
    if (store_get_run(st, run_id, summary_run_steps, r, &err) != STORE_OK) {
        fprintf(stderr, "attnstat: cannot read run '%s': %s\n", run, out_safe(err.msg));
        return CLI_EXIT_FAIL;
    }
    int64_t lo = r[1] > from ? r[1] : from, hi = r[2] < to ? r[2] : to;
    if (r[0] == 0 || lo > hi)
        return CLI_EXIT_OK; /* nothing in the range: the caller says what there is */
    summary_ctx c = {.a = a, .run = run, .run_id = run_id, .lo = lo, .cur = -1};
    c.nb = a->buckets > 0 ? a->buckets : SUMMARY_DEFAULT_BUCKETS;
    uint64_t span = (uint64_t)hi - (uint64_t)lo; /* steps in the range, minus one */
    c.width = span / (uint64_t)c.nb + 1;
    if ((uint64_t)(c.nb - 1) * c.width > span) /* fewer buckets fill the range */
        c.nb = (int64_t)(span / c.width) + 1;
    c.spark_en = malloc((size_t)c.nb * sizeof *c.spark_en);
    c.spark_ml = malloc((size_t)c.nb * sizeof *c.spark_ml);
    if (!c.spark_en || !c.spark_ml) {
        free(c.spark_en);
        free(c.spark_ml);
        fprintf(stderr, "attnstat: out of memory\n");
        return CLI_EXIT_FAIL;
    }
    for (int64_t i = 0; i < c.nb; i++)
        c.spark_en[i] = c.spark_ml[i] = NAN;
    out_begin(&c.o, a->fmt, stdout, summary_cols, SUMMARY_NCOLS);
    store_status s = store_trend(st, run_id, a->layer, -1, lo, hi, 1, summary_sample, &c, &err);
    if (s == STORE_OK && !c.failed)
        summary_flush(&c);
    int oe = out_end(&c.o);
    int rc = CLI_EXIT_OK;
    if (s != STORE_OK || c.failed) {
        fprintf(stderr, "attnstat: cannot read the trend: %s\n",
                c.failed ? "out of memory" : out_safe(err.msg));
        rc = CLI_EXIT_FAIL;
    } else if (oe) {
        rc = CLI_EXIT_FAIL;
    } else if (a->fmt == OUT_TABLE && c.rows > 0) {
        printf("\nrun %s, layer %d, steps %lld..%lld in %lld buckets of %llu steps (min, mean "
               "and max over the heads and steps of each; min@ / max@: the head)\n",
               run, a->layer, (long long)lo, (long long)hi, (long long)c.nb,
               (unsigned long long)c.width);
        out_spark_line(stdout, "entropy_norm min", 16, c.spark_en, (size_t)c.nb, 3);
        out_spark_line(stdout, "max_logit max", 16, c.spark_ml, (size_t)c.nb, 2);
    }
    *rows = c.rows;
    free(c.heads);
    free(c.spark_en);
    free(c.spark_ml);
    return rc;
}
