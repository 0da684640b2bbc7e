/* job.c — the attnstat CLI's commands across databases (see job.h): job (a job's layer x head map
 * merged by global (layer, head)) and export (a job's whole history as one table; --interventions:
 * its interventions).
 *
 * How the map is made: every database given is opened read-only; the job's processes are the runs
 * of its name in each (store_job_runs); the step is --step, else the newest step every process
 * with samples has reached (the smallest of their latest steps: a process that lags or died does
 * not leave holes in the map, it is named); each process's grid at that step is read
 * (store_grid), the samples are sorted by (layer, head) and those of one cell pooled
 * (store_merge_stats). A process without a sample at that step is named on stderr.
 *
 * Stage: a command file of the CLI. Calls the store's read half (store_read.h, store_job.h),
 * interv.c (an intervention's JSON members), out.c and libc. */
#include "job.h"

#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "interv.h"
#include "out.h"
#include "statcol.h"
#include "store_job.h"
#include "store_read.h"
#include "timearg.h"

#define JOB_MAX_GRID 4096    /* the largest heatmap drawn (layers, heads) */
#define JOB_MAX_DBS 4096     /* databases read at once (a directory's *.db files included) */

/* ---- The databases ------------------------------------------------------------------------------*/
typedef struct {
    char **path;
    store **st;
    size_t n, cap;
} job_dbs;

static int job_add_path(job_dbs *d, const char *path)
{
    if (d->n == JOB_MAX_DBS) {
        fprintf(stderr, "attnstat: more than %d databases\n", JOB_MAX_DBS);
        return -1;
    }
    if (d->n == d->cap) {
        size_t ncap = d->cap ? d->cap * 2 : 8;
        char **np = realloc(d->path, ncap * sizeof *np);
        if (np)
            d->path = np;
        store **ns = realloc(d->st, ncap * sizeof *ns);
        if (ns)
            d->st = ns;
        if (!np || !ns)
            goto oom;
        d->cap = ncap;
    }
    d->path[d->n] = strdup(path);
    if (!d->path[d->n])
        goto oom;
    d->st[d->n++] = NULL;
    return 0;
oom:
    fprintf(stderr, "attnstat: out of memory\n");
    return -1;
}

static int job_cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* A directory's *.db files, sorted by name. */
static int job_add_dir(job_dbs *d, const char *dir)
{
    DIR *dh = opendir(dir);
    if (!dh) {
        fprintf(stderr, "attnstat: cannot read the directory %s: %s\n", out_safe(dir),
                strerror(errno));
        return -1;
    }
    char **names = NULL;
    size_t n = 0, cap = 0;
    int rc = 0;
    struct dirent *de;
    while (rc == 0 && (de = readdir(dh))) {
        size_t len = strlen(de->d_name);
        if (len < 4 || strcmp(de->d_name + len - 3, ".db") != 0 || de->d_name[0] == '.')
            continue;
        if (n == cap) {
            cap = cap ? cap * 2 : 16;
            char **nn = realloc(names, cap * sizeof *nn);
            if (!nn) {
                rc = -1;
                break;
            }
            names = nn;
        }
        size_t plen = strlen(dir) + 1 + len + 1;
        names[n] = malloc(plen);
        if (!names[n]) {
            rc = -1;
            break;
        }
        snprintf(names[n++], plen, "%s/%s", dir, de->d_name);
    }
    closedir(dh);
    if (rc != 0)
        fprintf(stderr, "attnstat: out of memory\n");
    qsort(names, n, sizeof *names, job_cmp_str);
    size_t added = 0;
    for (size_t i = 0; i < n; i++) {
        struct stat sb; /* a FIFO named x.db would block SQLite's open for ever: skipped, said */
        if (rc == 0 && stat(names[i], &sb) == 0 && !S_ISREG(sb.st_mode))
            fprintf(stderr, "attnstat: skipping %s: %s, not a database file\n",
                    out_safe(names[i]), S_ISFIFO(sb.st_mode) ? "a FIFO"
                    : S_ISDIR(sb.st_mode) ? "a directory" : "not a regular file");
        else if (rc == 0 && (rc = job_add_path(d, names[i])) == 0)
            added++;
        free(names[i]);
    }
    free(names);
    if (rc == 0 && added == 0) {
        fprintf(stderr, "attnstat: the directory %s holds no *.db file%s\n", out_safe(dir),
                n ? " that is a regular file" : "");
        rc = -1;
    }
    return rc;
}

static void job_dbs_free(job_dbs *d)
{
    for (size_t i = 0; i < d->n; i++) {
        store_close(d->st[i]);
        free(d->path[i]);
    }
    free(d->path);
    free(d->st);
}

/* Every --db (files, or directories of *.db files), each opened read-only. */
static int job_open(const cli_args *a, job_dbs *d)
{
    memset(d, 0, sizeof *d);
    for (int i = 0; i < a->ndbs; i++) {
        struct stat sb;
        if (stat(a->dbs[i], &sb) != 0) {
            fprintf(stderr, "attnstat: database %s: %s\n", out_safe(a->dbs[i]), strerror(errno));
            return -1;
        }
        if ((S_ISDIR(sb.st_mode) ? job_add_dir(d, a->dbs[i]) : job_add_path(d, a->dbs[i])) != 0)
            return -1;
    }
    for (size_t i = 0; i < d->n; i++) {
        store_error err;
        d->st[i] = store_open_readonly(d->path[i], 5000, &err);
        if (!d->st[i]) {
            fprintf(stderr, "attnstat: cannot open database %s: %s\n", out_safe(d->path[i]),
                    out_safe(err.msg));
            return -1;
        }
    }
    return 0;
}

/* ---- The job's processes --------------------------------------------------------------------------*/
typedef struct {
    size_t db;               /* index in job_dbs */
    int64_t run_id;
    int32_t rank;
    char host[256];
    int has_layout;
    store_layout l;
    int64_t samples, step_min, step_max;
    int missing;             /* no sample at the map's step */
    int32_t layer_lo, layer_hi, head_lo, head_hi; /* what it holds at that step */
} job_proc;

typedef struct {
    job_proc *v;
    size_t n, cap;
    size_t db;               /* the database being read */
    int failed;
} job_procs;

static int job_collect_run(void *ctx, const store_job_run *r)
{
    job_procs *p = ctx;
    if (p->n == p->cap) {
        size_t ncap = p->cap ? p->cap * 2 : 16;
        job_proc *nv = realloc(p->v, ncap * sizeof *nv);
        if (!nv) {
            p->failed = 1;
            return 1;
        }
        p->v = nv;
        p->cap = ncap;
    }
    job_proc *x = &p->v[p->n++];
    memset(x, 0, sizeof *x);
    x->db = p->db;
    x->run_id = r->run_id;
    x->rank = r->rank;
    out_escape(x->host, sizeof x->host, r->host ? r->host : "");
    x->has_layout = r->has_layout;
    x->l = r->layout;
    x->samples = r->samples;
    x->step_min = r->step_min;
    x->step_max = r->step_max;
    x->layer_lo = x->head_lo = INT32_MAX;
    x->layer_hi = x->head_hi = -1;
    return 0;
}

/* The job's processes across every database; -1 (reported) when none is found. */
static int job_find(const cli_args *a, job_dbs *d, job_procs *p)
{
    memset(p, 0, sizeof *p);
    for (size_t i = 0; i < d->n; i++) {
        store_error err;
        p->db = i;
        if (store_job_runs(d->st[i], a->run, job_collect_run, p, &err) != STORE_OK || p->failed) {
            fprintf(stderr, "attnstat: reading the runs of %s: %s\n", out_safe(d->path[i]),
                    p->failed ? "out of memory" : out_safe(err.msg));
            return -1;
        }
    }
    if (p->n == 0) {
        fprintf(stderr, "attnstat: no run named '%s' in %zu database%s (the job's name is the run "
                "name its processes said hello with; see attnstat runs)\n", out_safe(a->run), d->n,
                d->n == 1 ? "" : "s");
        return -1;
    }
    return 0;
}

/* ---- job ------------------------------------------------------------------------------------------*/
typedef struct {
    int32_t layer, head;
    uint32_t proc;           /* index in job_procs */
    stats_head s;
} job_sample;

typedef struct {
    job_sample *v;
    size_t n, cap;
    uint32_t proc;
    int failed;
} job_samples;

static int job_collect_sample(void *ctx, const store_sample *s)
{
    job_samples *l = ctx;
    if (l->n == l->cap) {
        size_t ncap = l->cap ? l->cap * 2 : 256;
        job_sample *nv = realloc(l->v, ncap * sizeof *nv);
        if (!nv) {
            l->failed = 1;
            return 1;
        }
        l->v = nv;
        l->cap = ncap;
    }
    l->v[l->n++] = (job_sample){s->layer, s->head, l->proc, s->stats};
    return 0;
}

static int job_cmp_sample(const void *a, const void *b)
{
    const job_sample *p = a, *q = b;
    if (p->layer != q->layer)
        return p->layer < q->layer ? -1 : 1;
    if (p->head != q->head)
        return p->head < q->head ? -1 : 1;
    return (p->proc > q->proc) - (p->proc < q->proc);
}

/* One cell of the map: the pooled statistics of the samples [first, first + count). */
typedef struct {
    int32_t layer, head;
    stats_head s;
    size_t first, count;
} job_cell;

/* Statistic m (a VOCAB_STATS index: statcol_metric of --metric) of a cell. */
static double job_metric(const stats_head *s, int m)
{
    return statcol_value(s, m);
}

static int job_use_color(const cli_args *a)
{
    if (a->color >= 0)
        return a->color;
    const char *term = getenv("TERM");
    const char *nc = getenv("NO_COLOR");
    return isatty(STDOUT_FILENO) && !(nc && *nc) && term && strcmp(term, "dumb");
}

/* The ranks of a cell's processes, "3+11" (cut to fit). */
static void job_ranks(const job_procs *p, const job_samples *l, const job_cell *c, char *buf,
                      size_t len)
{
    size_t o = 0;
    buf[0] = '\0';
    for (size_t i = 0; i < c->count && o + 1 < len; i++) {
        int w = snprintf(buf + o, len - o, "%s%d", i ? "+" : "",
                         (int)p->v[l->v[c->first + i].proc].rank);
        if (w < 0 || (size_t)w >= len - o)
            break;
        o += (size_t)w;
    }
}

/* A cell's columns: where it is and who pooled it, then vocab.h's statistics (statcol.c; the
 * table hides entropy_std, and the per-row extremes entropy_min and entropy_max are left out). */
static const char *const job_omitted_stats[] = {"entropy_min", "entropy_max", NULL};
static const char *const job_hidden_stats[] = {"entropy_std", NULL};
static const out_col job_cell_head[] = {
    {"job", NULL, OUT_STR, 0, 0},          {"layer", NULL, OUT_INT, 0, 1},
    {"head", NULL, OUT_INT, 0, 1},         {"step", NULL, OUT_INT, 0, 1},
    {"processes", NULL, OUT_INT, 0, 1},    {"ranks", NULL, OUT_STR, 0, 1},
    {"rows", NULL, OUT_INT, 0, 1},         {"rows_norm", NULL, OUT_INT, 0, 0},
    {"nonfinite_rows", NULL, OUT_INT, 0, 0},
};
#define JOB_NHEAD ((int)(sizeof job_cell_head / sizeof job_cell_head[0]))
#define JOB_MAX_CELL_COLS (JOB_NHEAD + VOCAB_NSTATS)

/* The processes, what each holds at the map's step, to stdout (table format). */
static void job_print_procs(const job_dbs *d, const job_procs *p, int64_t step)
{
    printf("\n%zu process%s in %zu database%s at step %lld:\n", p->n, p->n == 1 ? "" : "es", d->n,
           d->n == 1 ? "" : "s", (long long)step);
    printf("  %-5s %-6s %-6s %-6s %-6s %-13s %-13s %-9s %s\n", "rank", "tp", "pp", "dp", "cp",
           "layers", "heads", "latest", "database");
    for (size_t i = 0; i < p->n; i++) {
        const job_proc *x = &p->v[i];
        char g[4][16], layers[32], heads[32];
        const int32_t r[4][2] = {{x->l.tp_rank, x->l.tp_size}, {x->l.pp_rank, x->l.pp_size},
                                 {x->l.dp_rank, x->l.dp_size}, {x->l.cp_rank, x->l.cp_size}};
        for (int k = 0; k < 4; k++)
            snprintf(g[k], sizeof g[k], x->has_layout ? "%d/%d" : "-", (int)r[k][0], (int)r[k][1]);
        if (x->missing || x->layer_hi < 0) {
            snprintf(layers, sizeof layers, "(none)");
            snprintf(heads, sizeof heads, "(none)");
        } else {
            snprintf(layers, sizeof layers, "%d..%d", (int)x->layer_lo, (int)x->layer_hi);
            snprintf(heads, sizeof heads, "%d..%d", (int)x->head_lo, (int)x->head_hi);
        }
        printf("  %-5d %-6s %-6s %-6s %-6s %-13s %-13s %-9lld %s\n", (int)x->rank, g[0], g[1], g[2],
               g[3], layers, heads, (long long)x->step_max, out_safe(d->path[x->db]));
    }
}

static int job_print_map(const cli_args *a, const job_cell *cells, size_t ncells, int64_t step,
                         const job_procs *p)
{
    const int mi = statcol_metric(a->metric); /* main.c took only a choice of statcol.c */
    if (mi < 0) {
        fprintf(stderr, "attnstat: no statistic called '%s'\n", a->metric);
        return -1;
    }
    int32_t layers = 0, heads = 0;
    double vmax = -INFINITY;
    for (size_t i = 0; i < ncells; i++) {
        layers = cells[i].layer + 1 > layers ? cells[i].layer + 1 : layers;
        heads = cells[i].head + 1 > heads ? cells[i].head + 1 : heads;
        double v = job_metric(&cells[i].s, mi);
        if (isfinite(v) && v > vmax)
            vmax = v;
    }
    if (layers > JOB_MAX_GRID || heads > JOB_MAX_GRID) {
        fprintf(stderr, "attnstat: job '%s' has global layers up to %d and heads up to %d: more "
                "than the %d x %d drawn; use --format json or csv\n", out_safe(a->run),
                (int)layers - 1, (int)heads - 1, JOB_MAX_GRID, JOB_MAX_GRID);
        return -1;
    }
    double *grid = malloc((size_t)layers * (size_t)heads * sizeof *grid);
    if (!grid) {
        fprintf(stderr, "attnstat: out of memory for the map\n");
        return -1;
    }
    for (size_t i = 0; i < (size_t)layers * (size_t)heads; i++)
        grid[i] = NAN;
    for (size_t i = 0; i < ncells; i++)
        grid[(size_t)cells[i].layer * (size_t)heads + (size_t)cells[i].head] =
            job_metric(&cells[i].s, mi);
    char title[1400];
    snprintf(title, sizeof title, "job %s, step %lld: %s per layer x head (global numbers, %zu "
             "process%s)", out_safe(a->run), (long long)step, a->metric, p->n,
             p->n == 1 ? "" : "es");
    out_heatmap hm = {.title = title, .metric = a->metric, .layers = (int)layers,
                      .heads = (int)heads, .values = grid, .high_is_good = !statcol_high_is_bad(mi),
                          .bad_means = statcol_bad_means(mi),
                      .color = job_use_color(a), .show_values = heads <= 16};
    statcol_scale(mi, vmax, &hm.lo, &hm.hi);
    out_heatmap_print(stdout, &hm);
    free(grid);
    /* The heads most at risk, named. */
    int low_bad = !statcol_high_is_bad(mi);
    size_t pick[5], np = 0;
    for (; np < 5; np++) {
        size_t best = SIZE_MAX;
        for (size_t i = 0; i < ncells; i++) {
            double v = job_metric(&cells[i].s, mi);
            int used = 0;
            for (size_t k = 0; k < np; k++)
                used |= pick[k] == i;
            if (used || !isfinite(v))
                continue;
            double bv = best == SIZE_MAX ? 0 : job_metric(&cells[best].s, mi);
            if (best == SIZE_MAX || (low_bad ? v < bv : v > bv))
                best = i;
        }
        if (best == SIZE_MAX)
            break;
        pick[np] = best;
    }
    printf("%s %s:", low_bad ? "lowest" : "highest", a->metric);
    for (size_t k = 0; k < np; k++)
        printf("%s L%d.H%d %.3f", k ? "," : "", (int)cells[pick[k]].layer,
               (int)cells[pick[k]].head, job_metric(&cells[pick[k]].s, mi));
    printf("\n");
    return 0;
}

int job_map(const cli_args *a)
{
    job_dbs d;
    job_procs p = {0};
    job_samples l = {0};
    job_cell *cells = NULL;
    int rc = CLI_EXIT_FAIL;
    if (job_open(a, &d) != 0 || job_find(a, &d, &p) != 0)
        goto out;
    int64_t step = a->step;
    if (!a->step_set) {
        int any = 0;
        for (size_t i = 0; i < p.n; i++)
            if (p.v[i].samples > 0 && (!any || p.v[i].step_max < step)) {
                step = p.v[i].step_max;
                any = 1;
            }
        if (!any) {
            fprintf(stderr, "attnstat: job '%s' has no samples yet\n", out_safe(a->run));
            goto out;
        }
    }
    for (size_t i = 0; i < p.n; i++) {
        store_error err;
        size_t before = l.n;
        l.proc = (uint32_t)i;
        int64_t used;
        store_status s = p.v[i].samples > 0
                             ? store_grid(d.st[p.v[i].db], p.v[i].run_id, step, &used,
                                          job_collect_sample, &l, &err)
                             : STORE_NOTFOUND;
        if (l.failed) {
            fprintf(stderr, "attnstat: out of memory\n");
            goto out;
        }
        if (s != STORE_OK && s != STORE_NOTFOUND) {
            fprintf(stderr, "attnstat: reading rank %d in %s: %s\n", (int)p.v[i].rank,
                    out_safe(d.path[p.v[i].db]), out_safe(err.msg));
            goto out;
        }
        p.v[i].missing = l.n == before;
        if (p.v[i].missing)
            fprintf(stderr, "attnstat: rank %d of job '%s' (%s) has no sample at step %lld (its "
                    "steps: %lld..%lld)\n", (int)p.v[i].rank, out_safe(a->run),
                    out_safe(d.path[p.v[i].db]), (long long)step, (long long)p.v[i].step_min,
                    (long long)p.v[i].step_max);
        for (size_t k = before; k < l.n; k++) {
            job_proc *x = &p.v[i];
            const job_sample *s2 = &l.v[k];
            x->layer_lo = s2->layer < x->layer_lo ? s2->layer : x->layer_lo;
            x->layer_hi = s2->layer > x->layer_hi ? s2->layer : x->layer_hi;
            x->head_lo = s2->head < x->head_lo ? s2->head : x->head_lo;
            x->head_hi = s2->head > x->head_hi ? s2->head : x->head_hi;
        }
    }
    if (l.n == 0) {
        fprintf(stderr, "attnstat: job '%s' has no sample at step %lld\n", out_safe(a->run),
                (long long)step);
        goto out;
    }
    qsort(l.v, l.n, sizeof *l.v, job_cmp_sample);
    cells = malloc(l.n * sizeof *cells);
    if (!cells) {
        fprintf(stderr, "attnstat: out of memory\n");
        goto out;
    }
    size_t ncells = 0;
    for (size_t k = 0; k < l.n; k++) {
        if (ncells && cells[ncells - 1].layer == l.v[k].layer &&
            cells[ncells - 1].head == l.v[k].head) {
            store_merge_stats(&cells[ncells - 1].s, &l.v[k].s);
            cells[ncells - 1].count++;
        } else {
            cells[ncells++] = (job_cell){l.v[k].layer, l.v[k].head, l.v[k].s, k, 1};
        }
    }
    if (a->fmt == OUT_TABLE) {
        if (job_print_map(a, cells, ncells, step, &p) != 0)
            goto out;
        job_print_procs(&d, &p, step);
        rc = CLI_EXIT_OK;
        goto out;
    }
    out_set o;
    out_col cols[JOB_MAX_CELL_COLS];
    int ncols = 0;
    for (int i = 0; i < JOB_NHEAD; i++)
        cols[ncols++] = job_cell_head[i];
    statcol_cols(cols, &ncols, job_omitted_stats, job_hidden_stats);
    out_begin(&o, a->fmt, stdout, cols, ncols);
    for (size_t i = 0; i < ncells; i++) {
        char ranks[256];
        job_ranks(&p, &l, &cells[i], ranks, sizeof ranks);
        const stats_head *h = &cells[i].s;
        out_val v[JOB_MAX_CELL_COLS];
        int n = 0;
        v[n++] = out_s(a->run);
        v[n++] = out_i(cells[i].layer);
        v[n++] = out_i(cells[i].head);
        v[n++] = out_i(step);
        v[n++] = out_i((int64_t)cells[i].count);
        v[n++] = out_s(ranks);
        v[n++] = out_i(h->rows);
        v[n++] = out_i(h->rows_norm);
        v[n++] = out_i(h->nonfinite_rows);
        statcol_vals(v, &n, h, job_omitted_stats);
        out_add(&o, v);
    }
    rc = out_end(&o) ? CLI_EXIT_FAIL : CLI_EXIT_OK;
out:
    free(cells);
    free(l.v);
    free(p.v);
    job_dbs_free(&d);
    return rc;
}

/* ---- export ---------------------------------------------------------------------------------------*/
/* The columns before the store's own (STORE_EXPORT_CSV_HEADER). */
#define JOB_EXPORT_HEAD "job,db,rank,host,tp_rank,tp_size,pp_rank,pp_size,dp_rank,dp_size,cp_rank," \
                        "cp_size,layer_offset,"

typedef struct {
    const cli_args *a;
    const char *db;          /* escaped */
    const job_proc *x;
    int64_t from, to;        /* the steps exported: --from/--to, --since/--until */
    char prefix[2048];       /* this process's leading cells (CSV) or keys (JSON), ready */
    char line[STORE_FORMAT_MAX];
    int failed;
    size_t rows;             /* --interventions: rows written */
} job_export_ctx;

/* s as a CSV cell: escaped (out_escape), quoted when it holds a comma or a quote. */
static void job_csv_cell(char *buf, size_t len, const char *s)
{
    char esc[1100];
    out_escape(esc, sizeof esc, s);
    if (!strpbrk(esc, ",\"")) {
        snprintf(buf, len, "%s", esc);
        return;
    }
    size_t o = 0;
    if (len < 3)
        return;
    buf[o++] = '"';
    for (const char *c = esc; *c && o + 3 < len; c++) {
        if (*c == '"')
            buf[o++] = '"';
        buf[o++] = *c;
    }
    buf[o++] = '"';
    buf[o] = '\0';
}

/* s as a JSON string with its quotes (control characters as \u00XX). */
static void job_json_str(char *buf, size_t len, const char *s)
{
    size_t o = 0;
    if (len < 3)
        return;
    buf[o++] = '"';
    for (const unsigned char *c = (const unsigned char *)s; *c && o + 8 < len; c++) {
        if (*c == '"' || *c == '\\') {
            buf[o++] = '\\';
            buf[o++] = (char)*c;
        } else if (*c < 0x20 || *c == 0x7f) {
            o += (size_t)snprintf(buf + o, len - o, "\\u%04x", *c);
        } else {
            buf[o++] = (char)*c;
        }
    }
    buf[o++] = '"';
    buf[o] = '\0';
}

static void job_export_prefix(job_export_ctx *e, const char *db)
{
    const job_proc *x = e->x;
    store_layout l = x->l;
    const int32_t v[9] = {l.tp_rank, l.tp_size, l.pp_rank, l.pp_size, l.dp_rank,
                          l.dp_size, l.cp_rank, l.cp_size, l.layer_offset};
    static const char *const keys[9] = {"tp_rank", "tp_size", "pp_rank", "pp_size", "dp_rank",
                                        "dp_size", "cp_rank", "cp_size", "layer_offset"};
    char job[1100], dbc[1100], host[1100];
    size_t o = 0;
    if (e->a->fmt == OUT_JSON) {
        char esc[1100];
        job_json_str(job, sizeof job, out_escape(esc, sizeof esc, e->a->run));
        job_json_str(dbc, sizeof dbc, out_escape(esc, sizeof esc, db));
        job_json_str(host, sizeof host, x->host);
        o += (size_t)snprintf(e->prefix, sizeof e->prefix, "{\"job\": %s, \"db\": %s, \"rank\": %d, "
                              "\"host\": %s", job, dbc, (int)x->rank, host);
        for (int i = 0; i < 9 && o < sizeof e->prefix; i++)
            o += (size_t)snprintf(e->prefix + o, sizeof e->prefix - o, ", \"%s\": %d", keys[i],
                                  (int)v[i]);
        if (o < sizeof e->prefix)
            snprintf(e->prefix + o, sizeof e->prefix - o, ", ");
    } else {
        job_csv_cell(job, sizeof job, e->a->run);
        job_csv_cell(dbc, sizeof dbc, db);
        job_csv_cell(host, sizeof host, x->host);
        o += (size_t)snprintf(e->prefix, sizeof e->prefix, "%s,%s,%d,%s", job, dbc, (int)x->rank,
                              host);
        for (int i = 0; i < 9 && o < sizeof e->prefix; i++)
            o += (size_t)snprintf(e->prefix + o, sizeof e->prefix - o, ",%d", (int)v[i]);
        if (o < sizeof e->prefix)
            snprintf(e->prefix + o, sizeof e->prefix - o, ",");
    }
}

static int job_export_row(void *ctx, const store_sample *s)
{
    job_export_ctx *e = ctx;
    const cli_args *a = e->a;
    if (s->step_last < e->from || s->step > e->to || (a->layer_set && s->layer != a->layer))
        return 0;
    store_format f = a->fmt == OUT_JSON ? STORE_FORMAT_JSONL : STORE_FORMAT_CSV;
    size_t need = store_format_sample(s, f, e->line, sizeof e->line);
    if (need >= sizeof e->line) {
        e->failed = 1;
        return 1;
    }
    /* JSON: the store's object continues ours (its opening brace dropped). */
    const char *rest = f == STORE_FORMAT_JSONL ? e->line + 1 : e->line;
    if (fputs(e->prefix, stdout) == EOF || fputs(rest, stdout) == EOF) {
        e->failed = 1;
        return 1;
    }
    return 0;
}

/* export --interventions: one of a process's interventions, kept when its step (--from/--to),
 * the time it was recorded (--since/--until), its layer and its kind are those asked for, after
 * the process's leading cells. CSV: heads and values as JSON arrays in one cell each (values
 * empty when none were sent), NaN thresholds and measures empty; JSON: interventions' members
 * (interv_json_fields), then the id. */
#define JOB_INTERV_CSV_HEAD "time,time_ms,step,layer,kind,heads,values,threshold,measured,detail,id\n"

static int job_export_interv(void *ctx, const store_intervention *iv)
{
    job_export_ctx *e = ctx;
    const cli_args *a = e->a;
    if (iv->step < e->from || iv->step > e->to || (a->layer_set && iv->layer != a->layer) ||
        (a->kind && strcmp(iv->kind, a->kind)) || (a->since_set && iv->time_ms < a->since_ms) ||
        (a->until_set && iv->time_ms > a->until_ms))
        return 0;
    fputs(e->prefix, stdout);
    if (a->fmt == OUT_JSON) {
        interv_json_fields(iv);
        printf(", \"id\": %lld}\n", (long long)iv->id);
    } else {
        char t[32];
        out_time(t, sizeof t, iv->time_ms);
        printf("%s,%lld,%lld,", t, (long long)iv->time_ms, (long long)iv->step);
        if (iv->layer >= 0)
            printf("%d", (int)iv->layer);
        putchar(',');
        out_csv_string(stdout, iv->kind);
        printf(",\"[");
        for (int32_t i = 0; i < iv->nheads; i++)
            printf("%s%d", i ? "," : "", (int)iv->heads[i]);
        printf("]\",");
        if (iv->values) {
            printf("\"[");
            for (int32_t i = 0; i < iv->nheads; i++)
                printf("%s%.17g", i ? "," : "", iv->values[i]);
            printf("]\"");
        }
        const double num[2] = {iv->threshold, iv->measured};
        for (int i = 0; i < 2; i++)
            printf(isfinite(num[i]) ? ",%.17g" : ",", num[i]);
        putchar(',');
        if (iv->detail)
            out_csv_string(stdout, iv->detail);
        printf(",%lld\n", (long long)iv->id);
    }
    e->rows++;
    if (ferror(stdout)) {
        e->failed = 1;
        return 1;
    }
    return 0;
}

int job_export(const cli_args *a)
{
    job_dbs d;
    job_procs p = {0};
    int rc = CLI_EXIT_FAIL;
    if (job_open(a, &d) != 0 || job_find(a, &d, &p) != 0)
        goto out;
    if (a->since_set && a->until_set && a->since_ms > a->until_ms) {
        fprintf(stderr, "attnstat: --since is after --until\n");
        rc = CLI_EXIT_USAGE;
        goto out;
    }
    if (a->kind && !a->interventions) {
        fprintf(stderr, "attnstat: export --kind picks interventions: give --interventions too\n");
        rc = CLI_EXIT_USAGE;
        goto out;
    }
    if (a->fmt != OUT_JSON)
        fputs(a->interventions ? JOB_EXPORT_HEAD JOB_INTERV_CSV_HEAD
                               : JOB_EXPORT_HEAD STORE_EXPORT_CSV_HEADER, stdout);
    size_t exported = 0, rows = 0;
    for (size_t i = 0; i < p.n; i++) {
        /* --since/--until: each process's own steps of that time (one that stored none there is
         * said on stderr and left out) */
        int64_t from = a->from, to = a->to;
        char name[64];
        snprintf(name, sizeof name, "%s (rank %d)", out_safe(a->run), (int)p.v[i].rank);
        /* interventions: --since/--until are the times they were recorded (job_export_interv) */
        if (!a->interventions &&
            timearg_steps(d.st[p.v[i].db], p.v[i].run_id, name, a, &from, &to) != CLI_EXIT_OK)
            continue;
        job_export_ctx *e = calloc(1, sizeof *e);
        if (!e) {
            fprintf(stderr, "attnstat: out of memory\n");
            goto out;
        }
        e->a = a;
        e->x = &p.v[i];
        e->from = from;
        e->to = to;
        job_export_prefix(e, d.path[p.v[i].db]);
        store_error err;
        store_status s = a->interventions
                             ? store_interventions(d.st[p.v[i].db], p.v[i].run_id,
                                                   job_export_interv, e, &err)
                             : store_export(d.st[p.v[i].db], p.v[i].run_id, job_export_row, e,
                                            &err);
        int failed = e->failed;
        rows += e->rows;
        free(e);
        if (failed) {
            fprintf(stderr, "attnstat: writing the export failed (%s)\n",
                    errno ? strerror(errno) : "a row too long");
            goto out;
        }
        if (s != STORE_OK) {
            fprintf(stderr, "attnstat: exporting rank %d from %s: %s\n", (int)p.v[i].rank,
                    out_safe(d.path[p.v[i].db]), out_safe(err.msg));
            goto out;
        }
        exported++;
    }
    if (exported == 0) {
        fprintf(stderr, "attnstat: no process of job '%s' stored a sample in that time\n",
                out_safe(a->run));
        goto out;
    }
    if (a->interventions && rows == 0) /* an answer, not a failure: the job clipped nothing */
        fprintf(stderr, "attnstat: no process of job '%s' recorded an intervention%s\n",
                out_safe(a->run), a->kind || a->layer_set || a->since_set || a->until_set ||
                                          a->from != INT64_MIN || a->to != INT64_MAX
                                      ? " matching that"
                                      : "");
    rc = fflush(stdout) == 0 ? CLI_EXIT_OK : CLI_EXIT_FAIL;
out:
    free(p.v);
    job_dbs_free(&d);
    return rc;
}
