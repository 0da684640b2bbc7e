/* history.c — the attnstat CLI's history commands (see history.h): runs, trend (one layer over
 * steps: summary.c's summary of its heads, or the samples of one head or of every head, with
 * sparklines) and heads (the layer x head grid of one step as a heatmap); alerts.c has the
 * alerts. Runs are given by name or id (--run) and resolved here, with the known runs listed when
 * the name matches none; --since/--until become steps through timearg.c.
 *
 * Stage: a command file of the CLI. Calls the store's read half (store.h: open read-only, list,
 * resolve, trend, grid, alerts), summary.c, timearg.c, out.c and checkdb.c. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "attnstat.h"
#include "checkdb.h"
#include "history.h"
#include "out.h"
#include "statcol.h"
#include "store_read.h"
#include "summary.h"
#include "timearg.h"

/* The largest heatmap drawn: layer and head numbers come from the database and go up to
 * INT32_MAX; a grid past these is refused (json/csv print any sample). */
#define HISTORY_MAX_GRID_LAYERS 4096
#define HISTORY_MAX_GRID_HEADS 4096

/* ---- Database access ---------------------------------------------------------------------------*/
store *history_open_db(const cli_args *a)
{
    if (checkdb_path(a) != 0) /* says why: missing, unreadable, a directory... */
        return NULL;
    store_error err;
    store *st = store_open_readonly(a->db, 5000, &err);
    if (!st)
        fprintf(stderr, "attnstat: cannot open database %s: %s\n", out_safe(a->db),
                out_safe(err.msg));
    return st;
}

int history_collect_run(void *ctx, const store_run *r)
{
    history_runlist *l = ctx;
    if (l->n == l->cap) {
        size_t ncap = l->cap ? l->cap * 2 : 16;
        char **nn = realloc(l->names, ncap * sizeof *nn);
        if (nn)
            l->names = nn;
        int64_t *ni = realloc(l->ids, ncap * sizeof *ni);
        if (ni)
            l->ids = ni;
        int32_t *nr = realloc(l->ranks, ncap * sizeof *nr);
        if (nr)
            l->ranks = nr;
        if (!nn || !ni || !nr)
            return 1;
        l->cap = ncap;
    }
    size_t len = strlen(r->name) + 1;
    l->names[l->n] = malloc(len);
    if (!l->names[l->n])
        return 1;
    memcpy(l->names[l->n], r->name, len);
    l->ids[l->n] = r->id;
    l->ranks[l->n] = r->rank;
    l->n++;
    return 0;
}

void history_runlist_free(history_runlist *l)
{
    for (size_t i = 0; i < l->n; i++)
        free(l->names[i]);
    free(l->names);
    free(l->ids);
    free(l->ranks);
}

const char *history_run_name(const history_runlist *l, int64_t id)
{
    for (size_t i = 0; i < l->n; i++)
        if (l->ids[i] == id)
            return l->names[i];
    return "?";
}

int history_run_rank(const history_runlist *l, int64_t id)
{
    for (size_t i = 0; i < l->n; i++)
        if (l->ids[i] == id)
            return l->ranks[i];
    return -1;
}

/* store_get_run() callback: a copy of the run's name, escaped for printing (out_escape). */
static int history_copy_run_name(void *ctx, const store_run *r)
{
    char **name = ctx;
    size_t len = strlen(r->name) * 4 + 1;
    free(*name);
    *name = malloc(len);
    if (*name)
        out_escape(*name, len, r->name);
    return 0;
}

/* Resolves --run (a name or an id) to the run's id and its name as stored (malloc'd, for the
 * caller to free), reporting what was wrong (and the known runs) when it cannot. */
int history_resolve(store *st, const cli_args *a, int64_t *run_id, char **name)
{
    *name = NULL;
    if (!a->run) {
        fprintf(stderr, "attnstat: %s needs --run NAME (see attnstat runs)\n", a->cmd);
        return CLI_EXIT_USAGE;
    }
    store_error err;
    store_status s = store_resolve_run(st, a->run, a->rank, run_id, &err);
    if (s == STORE_OK) {
        /* --run may have been an id: every output names the run by its name. */
        s = store_get_run(st, *run_id, history_copy_run_name, name, &err);
        if (s == STORE_OK && *name)
            return CLI_EXIT_OK;
        if (s == STORE_OK)
            fprintf(stderr, "attnstat: out of memory\n");
        else
            fprintf(stderr, "attnstat: cannot read run '%s': %s\n", out_safe(a->run),
                    out_safe(err.msg));
        free(*name);
        *name = NULL;
        return CLI_EXIT_FAIL;
    }
    history_runlist l = {0};
    store_error e2;
    store_list_runs(st, history_collect_run, &l, &e2);
    if (s == STORE_NOTFOUND) {
        fprintf(stderr, "attnstat: no run '%s'%s in %s; ", out_safe(a->run),
                a->rank >= 0 ? " with that rank" : "", store_path(st));
        if (l.n == 0) {
            fprintf(stderr, "the database has no runs yet\n");
        } else {
            fprintf(stderr, "known runs:");
            for (size_t i = 0; i < l.n; i++)
                fprintf(stderr, "%s %s (id %lld, rank %d)", i ? "," : "", out_safe(l.names[i]),
                        (long long)l.ids[i], l.ranks[i]);
            fputc('\n', stderr);
        }
    } else if (s == STORE_AMBIGUOUS) {
        fprintf(stderr, "attnstat: run '%s' has several ranks: pass --rank K or the run id:",
                out_safe(a->run));
        for (size_t i = 0; i < l.n; i++)
            if (!strcmp(l.names[i], a->run))
                fprintf(stderr, " id %lld (rank %d)", (long long)l.ids[i], l.ranks[i]);
        fputc('\n', stderr);
    } else {
        fprintf(stderr, "attnstat: cannot look up run '%s': %s\n", out_safe(a->run),
                out_safe(err.msg));
    }
    history_runlist_free(&l);
    return CLI_EXIT_FAIL;
}

/* Opens the database and resolves --run: CLI_EXIT_OK with *st open (close it) and *name to free,
 * or an exit code with everything closed and the reason printed. */
int history_open_run(const cli_args *a, store **st, int64_t *run_id, char **name)
{
    *st = history_open_db(a);
    if (!*st)
        return CLI_EXIT_FAIL;
    int rc = history_resolve(*st, a, run_id, name);
    if (rc != CLI_EXIT_OK) {
        store_close(*st);
        *st = NULL;
    }
    return rc;
}

/* ---- runs --------------------------------------------------------------------------------------*/
static const out_col history_run_cols[] = {
    {"run_id", "id", OUT_INT, 0, 1},       {"run", NULL, OUT_STR, 0, 1},
    {"rank", NULL, OUT_INT, 0, 1},         {"host", NULL, OUT_STR, 0, 1},
    {"pid", NULL, OUT_INT, 0, 0},          {"started", NULL, OUT_STR, 0, 1},
    {"started_ms", NULL, OUT_INT, 0, 0},   {"last_sample", "last sample", OUT_STR, 0, 1},
    {"last_sample_ms", NULL, OUT_INT, 0, 0}, {"steps", NULL, OUT_STR, 0, 1},
    {"step_min", NULL, OUT_INT, 0, 0},     {"step_max", NULL, OUT_INT, 0, 0},
    {"samples", NULL, OUT_INT, 0, 1},      {"config", NULL, OUT_STR, 0, 0},
    /* added later: after the columns CSV readers already know by position */
    {"state", NULL, OUT_STR, 0, 1},        {"end_reason", "reason", OUT_STR, 0, 1},
    {"ended", NULL, OUT_STR, 0, 0},        {"ended_ms", NULL, OUT_NUM, 0, 0},
    {"duration", NULL, OUT_STR, 0, 1},     {"duration_ms", NULL, OUT_INT, 0, 0},
    {"alerts_active", "alerts", OUT_INT, 0, 1}, {"limits", NULL, OUT_STR, 0, 1},
    {"retain_ms", NULL, OUT_INT, 0, 0},    {"retain_bytes", NULL, OUT_INT, 0, 0},
    {"bytes", NULL, OUT_INT, 0, 0},
};

void history_limit_text(char *buf, size_t len, int64_t v, int is_ms)
{
    if (v < 0) {
        snprintf(buf, len, "default");
    } else if (v == 0) {
        snprintf(buf, len, "none");
    } else if (is_ms) {
        snprintf(buf, len, "%.4gd", (double)v / 86400000.0);
    } else {
        char b[24]; /* fits the callers' 32 with the B (gcc -O3 checks) */
        out_fit(b, sizeof b, (double)v, 5);
        snprintf(buf, len, "%sB", b);
    }
}

/* A run's own limits in a cell: "default" (the daemon's, both), else the ones it has of its own
 * ("age 1.5d", "size 10.0GB", "age none, size 1.00GB"). */
static void history_limits_cell(char *buf, size_t len, const store_run *r)
{
    char age[32], size[32];
    history_limit_text(age, sizeof age, r->retain_ms, 1);
    history_limit_text(size, sizeof size, r->retain_bytes, 0);
    if (r->retain_ms < 0 && r->retain_bytes < 0)
        snprintf(buf, len, "default");
    else if (r->retain_bytes < 0)
        snprintf(buf, len, "age %s", age);
    else if (r->retain_ms < 0)
        snprintf(buf, len, "size %s", size);
    else
        snprintf(buf, len, "age %s, size %s", age, size);
}

/* The active alerts of each run (store_alerts, active only): counted by run id. */
typedef struct {
    int64_t *ids;
    int64_t *counts;
    size_t n, cap;
    int failed;
} history_counts;

static int history_count_alert(void *ctx, const store_alert *al)
{
    history_counts *c = ctx;
    for (size_t i = 0; i < c->n; i++)
        if (c->ids[i] == al->run_id) {
            c->counts[i]++;
            return 0;
        }
    if (c->n == c->cap) {
        size_t cap = c->cap ? c->cap * 2 : 16;
        int64_t *ni = realloc(c->ids, cap * sizeof *ni);
        if (ni)
            c->ids = ni;
        int64_t *nc = realloc(c->counts, cap * sizeof *nc);
        if (nc)
            c->counts = nc;
        if (!ni || !nc) {
            c->failed = 1;
            return 1;
        }
        c->cap = cap;
    }
    c->ids[c->n] = al->run_id;
    c->counts[c->n++] = 1;
    return 0;
}

typedef struct {
    out_set *o;
    const history_counts *alerts;
    int64_t now_ms;
} history_runs_ctx;

static int history_run_row(void *ctx, const store_run *r)
{
    history_runs_ctx *c = ctx;
    char started[32], ended[32], last[32], steps[64], duration[32], limits[80];
    out_time(started, sizeof started, r->started_ms);
    out_time(ended, sizeof ended, r->ended_ms);
    out_time(last, sizeof last, r->last_time_ms);
    if (r->samples > 0)
        snprintf(steps, sizeof steps, "%lld..%lld", (long long)r->step_min, (long long)r->step_max);
    else
        snprintf(steps, sizeof steps, "-");
    /* from its first hello to its end, or to now while it runs */
    int64_t dur = (r->ended_ms ? r->ended_ms : c->now_ms) - r->started_ms;
    if (dur < 0)
        dur = 0;
    out_duration(duration, sizeof duration, dur);
    history_limits_cell(limits, sizeof limits, r);
    int64_t active = 0;
    for (size_t i = 0; i < c->alerts->n; i++)
        if (c->alerts->ids[i] == r->id)
            active = c->alerts->counts[i];
    out_val v[] = {out_i(r->id),
                   out_s(r->name),
                   out_i(r->rank),
                   out_s(r->host),
                   out_i(r->pid),
                   out_s(started),
                   out_i(r->started_ms),
                   out_s(last),
                   out_i(r->last_time_ms),
                   out_s(steps),
                   out_i(r->step_min),
                   out_i(r->step_max),
                   out_i(r->samples),
                   out_s(r->config),
                   out_s(r->ended_ms ? "ended" : "live"),
                   out_s(r->ended_ms ? r->end_reason : NULL),
                   out_s(r->ended_ms ? ended : NULL),
                   out_d(r->ended_ms ? (double)r->ended_ms : NAN),
                   out_s(duration),
                   out_i(dur),
                   out_i(active),
                   out_s(limits),
                   out_i(r->retain_ms),
                   out_i(r->retain_bytes),
                   out_i(r->bytes)};
    out_add(c->o, v);
    return 0;
}

int history_runs(const cli_args *a)
{
    store *st = history_open_db(a);
    if (!st)
        return CLI_EXIT_FAIL;
    history_counts alerts = {0};
    store_error err;
    store_status s = store_alerts(st, 0, 1, history_count_alert, &alerts, &err);
    if (s != STORE_OK || alerts.failed) {
        fprintf(stderr, "attnstat: cannot count the runs' active alerts: %s\n",
                s != STORE_OK ? out_safe(err.msg) : "out of memory");
        free(alerts.ids);
        free(alerts.counts);
        store_close(st);
        return CLI_EXIT_FAIL;
    }
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    out_set o;
    out_begin(&o, a->fmt, stdout, history_run_cols,
              (int)(sizeof history_run_cols / sizeof history_run_cols[0]));
    history_runs_ctx ctx = {&o, &alerts, (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000};
    s = store_list_runs(st, history_run_row, &ctx, &err);
    size_t n = out_rows(&o);
    int oe = out_end(&o);
    free(alerts.ids);
    free(alerts.counts);
    store_close(st);
    if (s != STORE_OK) {
        fprintf(stderr, "attnstat: cannot list runs: %s\n", out_safe(err.msg));
        return CLI_EXIT_FAIL;
    }
    if (n == 0 && a->fmt == OUT_TABLE)
        printf("no runs in %s yet\n", a->db);
    return oe ? CLI_EXIT_FAIL : CLI_EXIT_OK;
}

/* ---- Samples (trend, heads) --------------------------------------------------------------------*/
/* The samples' columns: where they are, then vocab.h's statistics (statcol.c: the table hides
 * entropy_std and entropy_max, kept in JSON and CSV), then the other counts. */
static const char *const history_hidden_stats[] = {"entropy_std", "entropy_max", NULL};
static const out_col history_sample_head[] = {
    {"run", NULL, OUT_STR, 0, 0},  {"run_id", NULL, OUT_INT, 0, 0},
    {"layer", NULL, OUT_INT, 0, 1}, {"head", NULL, OUT_INT, 0, 1},
    {"step", NULL, OUT_INT, 0, 1}, {"time_ms", NULL, OUT_INT, 0, 0},
    {"rows", NULL, OUT_INT, 0, 1},
};
static const out_col history_sample_tail[] = {
    {"rows_norm", NULL, OUT_INT, 0, 0},
    {"rows_empty", NULL, OUT_INT, 0, 0},
    {"nonfinite_rows", "nonfinite", OUT_INT, 0, 1},
    {"sampled", NULL, OUT_INT, 0, 0},
};
#define HISTORY_NHEAD ((int)(sizeof history_sample_head / sizeof history_sample_head[0]))
#define HISTORY_NTAIL ((int)(sizeof history_sample_tail / sizeof history_sample_tail[0]))
#define HISTORY_MAX_SAMPLE_COLS (HISTORY_NHEAD + VOCAB_NSTATS + HISTORY_NTAIL)

/* The columns into cols (room for HISTORY_MAX_SAMPLE_COLS); returns how many. */
static int history_sample_cols(out_col *cols)
{
    int n = 0;
    for (int i = 0; i < HISTORY_NHEAD; i++)
        cols[n++] = history_sample_head[i];
    statcol_cols(cols, &n, NULL, history_hidden_stats);
    for (int i = 0; i < HISTORY_NTAIL; i++)
        cols[n++] = history_sample_tail[i];
    return n;
}

static void history_sample_out(out_set *o, const char *run, const store_sample *s)
{
    const stats_head *h = &s->stats;
    out_val v[HISTORY_MAX_SAMPLE_COLS];
    int n = 0;
    v[n++] = out_s(run);
    v[n++] = out_i(s->run_id);
    v[n++] = out_i(s->layer);
    v[n++] = out_i(s->head);
    v[n++] = out_i(s->step);
    v[n++] = out_i(s->time_ms);
    v[n++] = out_i(h->rows);
    statcol_vals(v, &n, h, NULL);
    v[n++] = out_i(h->rows_norm);
    v[n++] = out_i(h->rows_empty);
    v[n++] = out_i(h->nonfinite_rows);
    v[n++] = out_i(h->sampled);
    out_add(o, v);
}

/* A growable list of samples. */
typedef struct {
    store_sample *v;
    size_t n, cap;
    int failed;
} history_samples;

static int history_collect_sample(void *ctx, const store_sample *s)
{
    history_samples *l = ctx;
    if (l->n == l->cap) {
        size_t ncap = l->cap ? l->cap * 2 : 256;
        store_sample *nv = realloc(l->v, ncap * sizeof *nv);
        if (!nv) {
            l->failed = 1;
            return 1;
        }
        l->v = nv;
        l->cap = ncap;
    }
    l->v[l->n++] = *s;
    return 0;
}

/* The layer and head counts (highest number + 1) of a set of samples. In 64 bits: layer and head
 * numbers go up to INT32_MAX. */
static void history_extent(const history_samples *l, int64_t *layers, int64_t *heads)
{
    *layers = 0;
    *heads = 0;
    for (size_t i = 0; i < l->n; i++) {
        if ((int64_t)l->v[i].layer + 1 > *layers)
            *layers = (int64_t)l->v[i].layer + 1;
        if ((int64_t)l->v[i].head + 1 > *heads)
            *heads = (int64_t)l->v[i].head + 1;
    }
}

/* A sample's head and its position in a trend (step order), sorted to group the heads. */
typedef struct {
    int32_t head;
    size_t i;
} history_head_pos;

static int history_by_head(const void *x, const void *y)
{
    const history_head_pos *p = x, *q = y;
    if (p->head != q->head)
        return p->head < q->head ? -1 : 1;
    return p->i < q->i ? -1 : p->i > q->i;
}

/* Says why a trend found no sample, so the person can fix the query. */
static void history_trend_none(store *st, const cli_args *a, int64_t run_id, const char *run,
                               int64_t from, int64_t to)
{
    history_samples g = {0};
    int64_t step_used = 0;
    store_error err;
    store_grid(st, run_id, STORE_STEP_LATEST, &step_used, history_collect_sample, &g, &err);
    int64_t layers, heads;
    history_extent(&g, &layers, &heads);
    if (g.n == 0)
        fprintf(stderr, "attnstat: run '%s' has no samples yet\n", run);
    else if (a->layer >= layers || a->head >= heads)
        fprintf(stderr,
                "attnstat: run '%s' has layers 0..%lld and heads 0..%lld; no layer %d%s\n",
                run, (long long)(layers - 1), (long long)(heads - 1), a->layer,
                a->head >= 0 ? " with that head" : "");
    else
        fprintf(stderr, "attnstat: run '%s' layer %d has no samples in steps %lld..%lld\n",
                run, a->layer, (long long)from, (long long)to);
    free(g.v);
}

int history_trend(const cli_args *a)
{
    if (!a->layer_set) {
        fprintf(stderr, "attnstat: trend needs --layer L (see attnstat trend --help)\n");
        return CLI_EXIT_USAGE;
    }
    if (a->from > a->to) {
        fprintf(stderr, "attnstat: --from %lld is after --to %lld\n", (long long)a->from,
                (long long)a->to);
        return CLI_EXIT_USAGE;
    }
    int summary = a->head < 0 && !a->per_head;
    if (a->head >= 0 && a->per_head) {
        fprintf(stderr, "attnstat: --per-head prints every head; --head H one: not both\n");
        return CLI_EXIT_USAGE;
    }
    if (summary && a->every > 1) {
        fprintf(stderr, "attnstat: --every thins the samples of --head H or --per-head; the "
                "summary takes --buckets N\n");
        return CLI_EXIT_USAGE;
    }
    if (!summary && a->buckets > 0) {
        fprintf(stderr, "attnstat: --buckets is the summary's (trend without --head or "
                "--per-head)\n");
        return CLI_EXIT_USAGE;
    }
    store *st;
    int64_t run_id, from, to;
    char *run;
    int rc = history_open_run(a, &st, &run_id, &run);
    if (rc != CLI_EXIT_OK)
        return rc;
    rc = timearg_steps(st, run_id, run, a, &from, &to);
    if (rc == CLI_EXIT_OK && summary) {
        size_t rows = 0;
        rc = summary_trend(a, st, run_id, run, from, to, &rows);
        if (rc == CLI_EXIT_OK && rows == 0) {
            history_trend_none(st, a, run_id, run, from, to);
            rc = CLI_EXIT_FAIL;
        }
    }
    if (rc != CLI_EXIT_OK || summary) {
        free(run);
        store_close(st);
        return rc;
    }
    history_samples l = {0};
    store_error err;
    store_status s = store_trend(st, run_id, a->layer, a->head, from, to, a->every,
                                 history_collect_sample, &l, &err);
    if (s != STORE_OK || l.failed) {
        fprintf(stderr, "attnstat: cannot read the trend: %s\n",
                l.failed ? "out of memory" : out_safe(err.msg));
        free(l.v);
        free(run);
        store_close(st);
        return CLI_EXIT_FAIL;
    }
    if (l.n == 0) {
        history_trend_none(st, a, run_id, run, from, to);
        free(l.v);
        free(run);
        store_close(st);
        return CLI_EXIT_FAIL;
    }
    out_col cols[HISTORY_MAX_SAMPLE_COLS];
    out_set o;
    out_begin(&o, a->fmt, stdout, cols, history_sample_cols(cols));
    for (size_t i = 0; i < l.n; i++)
        history_sample_out(&o, run, &l.v[i]);
    int oe = out_end(&o);
    if (a->fmt == OUT_TABLE) {
        double *en = malloc(l.n * sizeof *en), *ml = malloc(l.n * sizeof *ml);
        history_head_pos *idx = malloc(l.n * sizeof *idx);
        if (en && ml && idx) {
            printf("\nrun %s, layer %d, steps %lld..%lld (%zu samples)\n", run, a->layer,
                   (long long)l.v[0].step, (long long)l.v[l.n - 1].step, l.n);
            /* One sparkline per head present, in head order (not a loop over 0..max head: head
             * numbers go up to INT32_MAX). */
            for (size_t i = 0; i < l.n; i++)
                idx[i] = (history_head_pos){l.v[i].head, i};
            qsort(idx, l.n, sizeof *idx, history_by_head);
            for (size_t i = 0; i < l.n;) {
                int32_t h = idx[i].head;
                size_t n = 0;
                for (; i < l.n && idx[i].head == h; i++, n++) {
                    en[n] = l.v[idx[i].i].stats.entropy_norm_mean;
                    ml[n] = l.v[idx[i].i].stats.max_logit;
                }
                printf("head %d\n", h);
                out_spark_line(stdout, "entropy_norm", 13, en, n, 3);
                out_spark_line(stdout, "max_logit", 13, ml, n, 2);
            }
        }
        free(en);
        free(ml);
        free(idx);
    }
    free(l.v);
    free(run);
    store_close(st);
    return oe ? CLI_EXIT_FAIL : CLI_EXIT_OK;
}

/* Statistic m (a VOCAB_STATS index: statcol_metric of --metric) of a sample. */
static double history_metric(const store_sample *s, int m)
{
    return statcol_value(&s->stats, m);
}

static int history_use_color(const cli_args *a)
{
    if (a->color >= 0)
        return a->color;
    const char *term = getenv("TERM");
    const char *nc = getenv("NO_COLOR");
    return isatty(STDOUT_FILENO) && !(nc && *nc) && term && strcmp(term, "dumb");
}

int history_heads(const cli_args *a)
{
    const int mi = statcol_metric(a->metric); /* main.c took only a choice of statcol.c */
    if (mi < 0) {
        fprintf(stderr, "attnstat: no statistic called '%s'\n", a->metric);
        return CLI_EXIT_USAGE;
    }
    store *st;
    int64_t run_id;
    char *run;
    int rc = history_open_run(a, &st, &run_id, &run);
    if (rc != CLI_EXIT_OK)
        return rc;
    int64_t from, to;
    if (a->step_set && (a->since_set || a->until_set)) {
        fprintf(stderr, "attnstat: heads reads --step S or the latest step in --since/--until, "
                "not both\n");
        rc = CLI_EXIT_USAGE;
    } else {
        rc = timearg_steps(st, run_id, run, a, &from, &to);
    }
    if (rc != CLI_EXIT_OK) {
        free(run);
        store_close(st);
        return rc;
    }
    history_samples l = {0};
    store_error err;
    int64_t step = 0;
    int64_t want = a->step_set ? a->step : to != INT64_MAX ? to : STORE_STEP_LATEST;
    store_status s = store_grid(st, run_id, want, &step, history_collect_sample, &l, &err);
    if (s != STORE_OK || l.failed || l.n == 0) {
        if (s == STORE_NOTFOUND || (s == STORE_OK && l.n == 0)) {
            if (want == STORE_STEP_LATEST)
                fprintf(stderr, "attnstat: run '%s' has no samples yet\n", run);
            else
                fprintf(stderr, "attnstat: run '%s' has no samples at step %lld (see attnstat "
                        "runs for its step range)\n", run, (long long)a->step);
        } else {
            fprintf(stderr, "attnstat: cannot read the grid: %s\n",
                    l.failed ? "out of memory" : out_safe(err.msg));
        }
        free(l.v);
        free(run);
        store_close(st);
        return CLI_EXIT_FAIL;
    }
    int oe = 0;
    if (a->fmt != OUT_TABLE) {
        out_col cols[HISTORY_MAX_SAMPLE_COLS];
        out_set o;
        out_begin(&o, a->fmt, stdout, cols, history_sample_cols(cols));
        for (size_t i = 0; i < l.n; i++)
            history_sample_out(&o, run, &l.v[i]);
        oe = out_end(&o);
    } else {
        int64_t layers, heads;
        history_extent(&l, &layers, &heads);
        if (layers > HISTORY_MAX_GRID_LAYERS || heads > HISTORY_MAX_GRID_HEADS) {
            fprintf(stderr,
                    "attnstat: run '%s' step %lld has layer numbers up to %lld and head numbers up "
                    "to %lld: a %lld x %lld heatmap is more than the %d x %d drawn; use --format "
                    "json or csv for its samples\n",
                    run, (long long)step, (long long)(layers - 1), (long long)(heads - 1),
                    (long long)layers, (long long)heads, HISTORY_MAX_GRID_LAYERS, HISTORY_MAX_GRID_HEADS);
            free(l.v);
            free(run);
            store_close(st);
            return CLI_EXIT_FAIL;
        }
        double *grid = malloc((size_t)layers * (size_t)heads * sizeof *grid);
        int tn = snprintf(NULL, 0, "run %s, step %lld: %s per layer x head", run, (long long)step,
                          a->metric);
        char *title = tn >= 0 ? malloc((size_t)tn + 1) : NULL;
        if (!grid || !title) {
            fprintf(stderr, "attnstat: out of memory for a %lld x %lld grid\n", (long long)layers,
                    (long long)heads);
            free(grid);
            free(title);
            free(l.v);
            free(run);
            store_close(st);
            return CLI_EXIT_FAIL;
        }
        for (size_t i = 0; i < (size_t)layers * (size_t)heads; i++)
            grid[i] = NAN;
        double vmax = -INFINITY;
        for (size_t i = 0; i < l.n; i++) {
            double v = history_metric(&l.v[i], mi);
            grid[(size_t)l.v[i].layer * (size_t)heads + (size_t)l.v[i].head] = v;
            if (isfinite(v) && v > vmax)
                vmax = v;
        }
        snprintf(title, (size_t)tn + 1, "run %s, step %lld: %s per layer x head", run,
                 (long long)step, a->metric);
        out_heatmap hm = {.title = title, .metric = a->metric, .layers = (int)layers,
                          .heads = (int)heads,
                          .values = grid, .high_is_good = !statcol_high_is_bad(mi),
                          .bad_means = statcol_bad_means(mi),
                          .color = history_use_color(a), .show_values = heads <= 16};
        statcol_scale(mi, vmax, &hm.lo, &hm.hi);
        out_heatmap_print(stdout, &hm);
        /* The heads most at risk, named. */
        size_t order[5];
        size_t nw = 0;
        int low_bad = !statcol_high_is_bad(mi);
        for (size_t pick = 0; pick < 5 && pick < l.n; pick++) {
            size_t best = SIZE_MAX;
            for (size_t i = 0; i < l.n; i++) {
                int used = 0;
                for (size_t k = 0; k < nw; k++)
                    used |= order[k] == i;
                double v = history_metric(&l.v[i], mi);
                if (used || !isfinite(v))
                    continue;
                if (best == SIZE_MAX ||
                    (low_bad ? v < history_metric(&l.v[best], mi)
                             : v > history_metric(&l.v[best], mi)))
                    best = i;
            }
            if (best == SIZE_MAX)
                break;
            order[nw++] = best;
        }
        printf("%s %s:", low_bad ? "lowest" : "highest", a->metric);
        for (size_t k = 0; k < nw; k++) {
            const store_sample *x = &l.v[order[k]];
            printf("%s L%d.H%d %.3f", k ? "," : "", x->layer, x->head, history_metric(x, mi));
        }
        printf("\n");
        free(grid);
        free(title);
    }
    free(l.v);
    free(run);
    store_close(st);
    return oe ? CLI_EXIT_FAIL : CLI_EXIT_OK;
}
