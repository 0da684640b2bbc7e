/* cli.c — the attnstat command-line tool. History commands (runs, trend, heads, alerts) read the
 * database directly through the store's read-only API, so they work with the daemon down; live
 * commands (status, watch) talk to attnstatd through libattnstat.
 * Exit status: 0 success, 1 a runtime failure (missing database, unknown run, daemon unreachable),
 * 2 a usage error. */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "attnstat.h"
#include "cli_out.h"
#include "store_read.h"

#define CLI_EXIT_OK 0
#define CLI_EXIT_FAIL 1
#define CLI_EXIT_USAGE 2
#define CLI_DEFAULT_CEILING 100.0
/* The largest heatmap drawn: layer and head numbers come from the database and go up to
 * INT32_MAX; a grid past these is refused (json/csv print any sample). */
#define CLI_MAX_GRID_LAYERS 4096
#define CLI_MAX_GRID_HEADS 4096

typedef struct {
    const char *db;
    const char *socket;
    char db_buf[4096], sock_buf[4096];
    out_format fmt;
    int color;             /* -1 auto, 0 never, 1 always */
    const char *cmd;
    const char *run;
    int32_t rank;          /* -1: any */
    int layer_set;
    int32_t layer;
    int32_t head;          /* -1: all */
    int64_t from, to, every;
    int64_t step;          /* STORE_STEP_LATEST */
    const char *metric;
    int active;
    int help;
    int timeout_ms;
} cli_args;

/* ---- Help --------------------------------------------------------------------------------------*/
static const char cli_usage[] =
    "usage: attnstat [--db PATH] [--socket PATH] COMMAND [OPTIONS]\n"
    "\n"
    "History (reads the database; works with attnstatd stopped):\n"
    "  runs                         the runs in the database\n"
    "  trend --run R --layer L      per-step statistics of one layer, with sparklines\n"
    "  heads --run R                the layer x head grid of one step, as a heatmap\n"
    "  alerts [--run R] [--active]  alerts raised and cleared\n"
    "Live (talks to attnstatd):\n"
    "  status                       clients, pushes, drops, queue depths, rates\n"
    "  watch                        print alerts as they happen, until interrupted\n"
    "\n"
    "Global options:\n"
    "  --db PATH        database (default $ATTNSTAT_DB, else $XDG_STATE_HOME/attnstat/attnstat.db,\n"
    "                   else /var/lib/attnstat/attnstat.db)\n"
    "  --socket PATH    attnstatd socket (default $ATTNSTAT_SOCKET, else\n"
    "                   $XDG_RUNTIME_DIR/attnstat/attnstatd.sock, else /run/attnstat/attnstatd.sock)\n"
    "  --format F       table (default), json (one object per line) or csv\n"
    "  --color WHEN     auto (default: when stdout is a terminal and NO_COLOR is unset), always, never\n"
    "  -h, --help       this help; 'attnstat COMMAND --help' for a command's\n"
    "\n"
    "Exit status: 0 success, 1 failure (missing database, unknown run, daemon unreachable), 2 usage.\n";

static void cli_command_help(const char *cmd)
{
    if (!strcmp(cmd, "runs"))
        printf("usage: attnstat [--db PATH] runs [--format table|json|csv]\n\n"
               "Lists every run: id, name, rank, host, when it started, its step range, the number\n"
               "of per-head samples stored and the time of the newest one.\n");
    else if (!strcmp(cmd, "trend"))
        printf("usage: attnstat [--db PATH] trend --run R --layer L [--head H] [--from S] [--to S]\n"
               "                [--every N] [--rank K] [--format table|json|csv]\n\n"
               "Per-step statistics of one layer (every head, or --head H): rows counted, entropy\n"
               "mean (nats), normalised entropy mean (0..1), entropy min, max logit, fraction of\n"
               "collapsed rows. --from/--to bound the steps (inclusive); --every N keeps the first\n"
               "step and every N-th after it. The table ends with a sparkline per head.\n"
               "R is a run name or id; --rank picks one rank of a multi-rank run.\n");
    else if (!strcmp(cmd, "heads"))
        printf("usage: attnstat [--db PATH] heads --run R [--step S] [--metric M] [--rank K]\n"
               "                [--format table|json|csv] [--color auto|always|never]\n\n"
               "The layer x head grid of one step (default: the run's latest) as a heatmap, so\n"
               "collapsing heads stand out. M is entropy_norm (default; low = collapsing), entropy\n"
               "(nats) or max_logit (high = logits growing). json/csv print one record per cell.\n");
    else if (!strcmp(cmd, "alerts"))
        printf("usage: attnstat [--db PATH] alerts [--run R] [--rank K] [--active]\n"
               "                [--format table|json|csv]\n\n"
               "Alert transitions (raised / cleared) in the order they happened, of one run or of\n"
               "all. --active keeps, per (run, layer, head, rule), the latest transition when it\n"
               "is a raise: the alerts firing now.\n");
    else if (!strcmp(cmd, "status"))
        printf("usage: attnstat [--socket PATH] status [--format table|json] [--timeout MS]\n\n"
               "Asks attnstatd for its status: uptime, clients, pushes done / dropped / rejected,\n"
               "push rate, samples stored, active alerts, each worker's queue, each client.\n");
    else if (!strcmp(cmd, "watch"))
        printf("usage: attnstat [--socket PATH] watch [--format table|json]\n\n"
               "Subscribes to attnstatd's alerts and prints each as it happens until interrupted\n"
               "(Ctrl-C). Exits 1 when the daemon goes away.\n");
    else
        fputs(cli_usage, stdout);
}

/* ---- Argument parsing --------------------------------------------------------------------------*/
static int cli_parse_i64(const char *opt, const char *s, int64_t lo, int64_t hi, int64_t *out)
{
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi) {
        fprintf(stderr, "attnstat: %s wants an integer in %lld..%lld, not '%s'\n", opt,
                (long long)lo, (long long)hi, s);
        return -1;
    }
    *out = v;
    return 0;
}

static void cli_default_db(cli_args *a)
{
    const char *env = getenv("ATTNSTAT_DB");
    const char *xdg = getenv("XDG_STATE_HOME");
    if (env && *env)
        snprintf(a->db_buf, sizeof a->db_buf, "%s", env);
    else if (xdg && *xdg)
        snprintf(a->db_buf, sizeof a->db_buf, "%s/attnstat/attnstat.db", xdg);
    else
        snprintf(a->db_buf, sizeof a->db_buf, "/var/lib/attnstat/attnstat.db");
    a->db = a->db_buf;
}

/* Returns -1 on a usage error (already reported). */
static int cli_parse(int argc, char **argv, cli_args *a)
{
    memset(a, 0, sizeof *a);
    a->color = -1;
    a->rank = -1;
    a->head = -1;
    a->from = INT64_MIN;
    a->to = INT64_MAX;
    a->every = 1;
    a->step = STORE_STEP_LATEST;
    a->metric = "entropy_norm";
    a->timeout_ms = 5000;
    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i];
        if (arg[0] != '-' || !arg[1]) {
            if (a->cmd) {
                fprintf(stderr, "attnstat: unexpected argument '%s' (see attnstat %s --help)\n",
                        arg, a->cmd);
                return -1;
            }
            a->cmd = arg;
            continue;
        }
        if (!strcmp(arg, "-h") || !strcmp(arg, "--help")) {
            a->help = 1;
            continue;
        }
        if (!strcmp(arg, "--active")) {
            a->active = 1;
            continue;
        }
        /* Options with a value: "--opt V" or "--opt=V". */
        char name[64];
        const char *val = NULL;
        const char *eq = strchr(arg, '=');
        if (eq) {
            snprintf(name, sizeof name, "%.*s", (int)(eq - arg), arg);
            val = eq + 1;
        } else {
            snprintf(name, sizeof name, "%s", arg);
        }
        static const char *const valued[] = {"--db", "--socket", "--format", "--color", "--run",
                                             "--rank", "--layer", "--head", "--from", "--to",
                                             "--every", "--step", "--metric", "--timeout"};
        int known = 0;
        for (size_t k = 0; k < sizeof valued / sizeof valued[0]; k++)
            known |= !strcmp(name, valued[k]);
        if (!known) {
            fprintf(stderr, "attnstat: unknown option '%s' (see attnstat --help)\n", name);
            return -1;
        }
        if (!val) {
            if (i + 1 >= argc) {
                fprintf(stderr, "attnstat: %s needs a value\n", name);
                return -1;
            }
            val = argv[++i];
        }
        int64_t v;
        if (!strcmp(name, "--db")) {
            a->db = val;
        } else if (!strcmp(name, "--socket")) {
            a->socket = val;
        } else if (!strcmp(name, "--format")) {
            if (!strcmp(val, "table"))
                a->fmt = OUT_TABLE;
            else if (!strcmp(val, "json"))
                a->fmt = OUT_JSON;
            else if (!strcmp(val, "csv"))
                a->fmt = OUT_CSV;
            else {
                fprintf(stderr, "attnstat: --format is table, json or csv, not '%s'\n", val);
                return -1;
            }
        } else if (!strcmp(name, "--color")) {
            if (!strcmp(val, "auto"))
                a->color = -1;
            else if (!strcmp(val, "always"))
                a->color = 1;
            else if (!strcmp(val, "never"))
                a->color = 0;
            else {
                fprintf(stderr, "attnstat: --color is auto, always or never, not '%s'\n", val);
                return -1;
            }
        } else if (!strcmp(name, "--run")) {
            a->run = val;
        } else if (!strcmp(name, "--metric")) {
            if (strcmp(val, "entropy_norm") && strcmp(val, "entropy") && strcmp(val, "max_logit")) {
                fprintf(stderr, "attnstat: --metric is entropy_norm, entropy or max_logit, not '%s'\n",
                        val);
                return -1;
            }
            a->metric = val;
        } else {
            int64_t lo = !strcmp(name, "--every") || !strcmp(name, "--timeout") ? 1
                       : !strcmp(name, "--from") || !strcmp(name, "--to") || !strcmp(name, "--step")
                           ? INT64_MIN + 1
                           : 0;
            int64_t hi = !strcmp(name, "--layer") || !strcmp(name, "--head") ||
                                 !strcmp(name, "--rank") || !strcmp(name, "--timeout")
                             ? INT32_MAX
                             : INT64_MAX;
            if (cli_parse_i64(name, val, lo, hi, &v) != 0)
                return -1;
            if (!strcmp(name, "--rank"))
                a->rank = (int32_t)v;
            else if (!strcmp(name, "--layer")) {
                a->layer = (int32_t)v;
                a->layer_set = 1;
            } else if (!strcmp(name, "--head"))
                a->head = (int32_t)v;
            else if (!strcmp(name, "--from"))
                a->from = v;
            else if (!strcmp(name, "--to"))
                a->to = v;
            else if (!strcmp(name, "--every"))
                a->every = v;
            else if (!strcmp(name, "--step"))
                a->step = v;
            else if (!strcmp(name, "--timeout"))
                a->timeout_ms = (int)v;
        }
    }
    if (!a->db)
        cli_default_db(a);
    if (!a->socket) {
        if (!attnstat_default_socket(a->sock_buf, sizeof a->sock_buf)) {
            fprintf(stderr, "attnstat: the default socket path is too long; pass --socket\n");
            return -1;
        }
        a->socket = a->sock_buf;
    }
    return 0;
}

/* ---- Database access ---------------------------------------------------------------------------*/
static store *cli_open_db(const cli_args *a)
{
    struct stat sb;
    if (stat(a->db, &sb) != 0) {
        if (errno == ENOENT)
            fprintf(stderr,
                    "attnstat: database %s does not exist (attnstatd creates it on start; pass "
                    "--db PATH or set ATTNSTAT_DB)\n", a->db);
        else
            fprintf(stderr, "attnstat: cannot read database %s: %s\n", a->db, strerror(errno));
        return NULL;
    }
    store_error err;
    store *st = store_open_readonly(a->db, 5000, &err);
    if (!st)
        fprintf(stderr, "attnstat: cannot open database %s: %s\n", a->db, err.msg);
    return st;
}

typedef struct {
    char **names;
    int64_t *ids;
    int32_t *ranks;
    size_t n, cap;
} cli_runlist;

static int cli_collect_run(void *ctx, const store_run *r)
{
    cli_runlist *l = ctx;
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

static void cli_runlist_free(cli_runlist *l)
{
    for (size_t i = 0; i < l->n; i++)
        free(l->names[i]);
    free(l->names);
    free(l->ids);
    free(l->ranks);
}

static const char *cli_run_name(const cli_runlist *l, int64_t id)
{
    for (size_t i = 0; i < l->n; i++)
        if (l->ids[i] == id)
            return l->names[i];
    return "?";
}

/* store_get_run() callback: a copy of the run's name. */
static int cli_copy_run_name(void *ctx, const store_run *r)
{
    char **name = ctx;
    size_t len = strlen(r->name) + 1;
    free(*name);
    *name = malloc(len);
    if (*name)
        memcpy(*name, r->name, len);
    return 0;
}

/* Resolves --run (a name or an id) to the run's id and its name as stored (malloc'd, for the
 * caller to free), reporting what was wrong (and the known runs) when it cannot. */
static int cli_resolve(store *st, const cli_args *a, int64_t *run_id, char **name)
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
        s = store_get_run(st, *run_id, cli_copy_run_name, name, &err);
        if (s == STORE_OK && *name)
            return CLI_EXIT_OK;
        if (s == STORE_OK)
            fprintf(stderr, "attnstat: out of memory\n");
        else
            fprintf(stderr, "attnstat: cannot read run '%s': %s\n", a->run, err.msg);
        free(*name);
        *name = NULL;
        return CLI_EXIT_FAIL;
    }
    cli_runlist l = {0};
    store_error e2;
    store_list_runs(st, cli_collect_run, &l, &e2);
    if (s == STORE_NOTFOUND) {
        fprintf(stderr, "attnstat: no run '%s'%s in %s; ", a->run,
                a->rank >= 0 ? " with that rank" : "", store_path(st));
        if (l.n == 0) {
            fprintf(stderr, "the database has no runs yet\n");
        } else {
            fprintf(stderr, "known runs:");
            for (size_t i = 0; i < l.n; i++)
                fprintf(stderr, "%s %s (id %lld, rank %d)", i ? "," : "", l.names[i],
                        (long long)l.ids[i], l.ranks[i]);
            fputc('\n', stderr);
        }
    } else if (s == STORE_AMBIGUOUS) {
        fprintf(stderr, "attnstat: run '%s' has several ranks: pass --rank K or the run id:",
                a->run);
        for (size_t i = 0; i < l.n; i++)
            if (!strcmp(l.names[i], a->run))
                fprintf(stderr, " id %lld (rank %d)", (long long)l.ids[i], l.ranks[i]);
        fputc('\n', stderr);
    } else {
        fprintf(stderr, "attnstat: cannot look up run '%s': %s\n", a->run, err.msg);
    }
    cli_runlist_free(&l);
    return CLI_EXIT_FAIL;
}

/* Opens the database and resolves --run: CLI_EXIT_OK with *st open (close it) and *name to free,
 * or an exit code with everything closed and the reason printed. */
static int cli_open_run(const cli_args *a, store **st, int64_t *run_id, char **name)
{
    *st = cli_open_db(a);
    if (!*st)
        return CLI_EXIT_FAIL;
    int rc = cli_resolve(*st, a, run_id, name);
    if (rc != CLI_EXIT_OK) {
        store_close(*st);
        *st = NULL;
    }
    return rc;
}

/* ---- runs --------------------------------------------------------------------------------------*/
static const out_col cli_run_cols[] = {
    {"run_id", "id", OUT_INT, 0, 1},       {"run", NULL, OUT_STR, 0, 1},
    {"rank", NULL, OUT_INT, 0, 1},         {"host", NULL, OUT_STR, 0, 1},
    {"pid", NULL, OUT_INT, 0, 0},          {"started", NULL, OUT_STR, 0, 1},
    {"started_ms", NULL, OUT_INT, 0, 0},   {"last_sample", "last sample", OUT_STR, 0, 1},
    {"last_sample_ms", NULL, OUT_INT, 0, 0}, {"steps", NULL, OUT_STR, 0, 1},
    {"step_min", NULL, OUT_INT, 0, 0},     {"step_max", NULL, OUT_INT, 0, 0},
    {"samples", NULL, OUT_INT, 0, 1},      {"config", NULL, OUT_STR, 0, 0},
};

static int cli_run_row(void *ctx, const store_run *r)
{
    out_set *o = ctx;
    char started[32], last[32], steps[64];
    out_time(started, sizeof started, r->started_ms);
    out_time(last, sizeof last, r->last_time_ms);
    if (r->samples > 0)
        snprintf(steps, sizeof steps, "%lld..%lld", (long long)r->step_min, (long long)r->step_max);
    else
        snprintf(steps, sizeof steps, "-");
    out_val v[] = {out_i(r->id),          out_s(r->name),        out_i(r->rank),
                   out_s(r->host),        out_i(r->pid),         out_s(started),
                   out_i(r->started_ms),  out_s(last),           out_i(r->last_time_ms),
                   out_s(steps),          out_i(r->step_min),    out_i(r->step_max),
                   out_i(r->samples),     out_s(r->config)};
    out_add(o, v);
    return 0;
}

static int cli_runs(const cli_args *a)
{
    store *st = cli_open_db(a);
    if (!st)
        return CLI_EXIT_FAIL;
    out_set o;
    out_begin(&o, a->fmt, stdout, cli_run_cols, (int)(sizeof cli_run_cols / sizeof cli_run_cols[0]));
    store_error err;
    store_status s = store_list_runs(st, cli_run_row, &o, &err);
    size_t n = out_rows(&o);
    int oe = out_end(&o);
    store_close(st);
    if (s != STORE_OK) {
        fprintf(stderr, "attnstat: cannot list runs: %s\n", err.msg);
        return CLI_EXIT_FAIL;
    }
    if (n == 0 && a->fmt == OUT_TABLE)
        printf("no runs in %s yet\n", a->db);
    return oe ? CLI_EXIT_FAIL : CLI_EXIT_OK;
}

/* ---- Samples (trend, heads) --------------------------------------------------------------------*/
static const out_col cli_sample_cols[] = {
    {"run", NULL, OUT_STR, 0, 0},
    {"run_id", NULL, OUT_INT, 0, 0},
    {"layer", NULL, OUT_INT, 0, 1},
    {"head", NULL, OUT_INT, 0, 1},
    {"step", NULL, OUT_INT, 0, 1},
    {"time_ms", NULL, OUT_INT, 0, 0},
    {"rows", NULL, OUT_INT, 0, 1},
    {"entropy_mean", "entropy", OUT_NUM, 4, 1},
    {"entropy_std", NULL, OUT_NUM, 4, 0},
    {"entropy_min", "ent_min", OUT_NUM, 4, 1},
    {"entropy_max", NULL, OUT_NUM, 4, 0},
    {"entropy_norm_mean", "ent_norm", OUT_NUM, 4, 1},
    {"collapsed_frac", "collapsed", OUT_NUM, 3, 1},
    {"max_logit", NULL, OUT_NUM, 2, 1},
    {"rows_norm", NULL, OUT_INT, 0, 0},
    {"rows_empty", NULL, OUT_INT, 0, 0},
    {"nonfinite_rows", "nonfinite", OUT_INT, 0, 1},
    {"sampled", NULL, OUT_INT, 0, 0},
};
#define CLI_NSAMPLE_COLS ((int)(sizeof cli_sample_cols / sizeof cli_sample_cols[0]))

static void cli_sample_out(out_set *o, const char *run, const store_sample *s)
{
    const stats_head *h = &s->stats;
    out_val v[] = {out_s(run),
                   out_i(s->run_id),
                   out_i(s->layer),
                   out_i(s->head),
                   out_i(s->step),
                   out_i(s->time_ms),
                   out_i(h->rows),
                   out_d(h->entropy_mean),
                   out_d(h->entropy_std),
                   out_d(h->entropy_min),
                   out_d(h->entropy_max),
                   out_d(h->entropy_norm_mean),
                   out_d(h->collapsed_frac),
                   out_d(h->max_logit),
                   out_i(h->rows_norm),
                   out_i(h->rows_empty),
                   out_i(h->nonfinite_rows),
                   out_i(h->sampled)};
    out_add(o, v);
}

/* A growable list of samples. */
typedef struct {
    store_sample *v;
    size_t n, cap;
    int failed;
} cli_samples;

static int cli_collect_sample(void *ctx, const store_sample *s)
{
    cli_samples *l = ctx;
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

static void cli_spark_line(const char *label, const double *v, size_t n, int prec)
{
    double first = NAN, last = NAN, lo = INFINITY, hi = -INFINITY;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(v[i]))
            continue;
        if (isnan(first))
            first = v[i];
        last = v[i];
        lo = v[i] < lo ? v[i] : lo;
        hi = v[i] > hi ? v[i] : hi;
    }
    printf("  %-13s ", label);
    out_sparkline(stdout, v, n, 48);
    if (isnan(first))
        printf("  (no values)\n");
    else
        printf("  %.*f -> %.*f  (min %.*f, max %.*f)\n", prec, first, prec, last, prec, lo, prec,
               hi);
}

/* The layer and head counts (highest number + 1) of a set of samples. In 64 bits: layer and head
 * numbers go up to INT32_MAX. */
static void cli_extent(const cli_samples *l, int64_t *layers, int64_t *heads)
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
} cli_head_pos;

static int cli_by_head(const void *x, const void *y)
{
    const cli_head_pos *p = x, *q = y;
    if (p->head != q->head)
        return p->head < q->head ? -1 : 1;
    return p->i < q->i ? -1 : p->i > q->i;
}

static int cli_trend(const cli_args *a)
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
    store *st;
    int64_t run_id;
    char *run;
    int rc = cli_open_run(a, &st, &run_id, &run);
    if (rc != CLI_EXIT_OK)
        return rc;
    cli_samples l = {0};
    store_error err;
    store_status s = store_trend(st, run_id, a->layer, a->head, a->from, a->to, a->every,
                                 cli_collect_sample, &l, &err);
    if (s != STORE_OK || l.failed) {
        fprintf(stderr, "attnstat: cannot read the trend: %s\n", l.failed ? "out of memory" : err.msg);
        free(l.v);
        free(run);
        store_close(st);
        return CLI_EXIT_FAIL;
    }
    if (l.n == 0) {
        /* Say what exists, so the person can fix the query. */
        cli_samples g = {0};
        int64_t step_used = 0;
        store_grid(st, run_id, STORE_STEP_LATEST, &step_used, cli_collect_sample, &g, &err);
        int64_t layers, heads;
        cli_extent(&g, &layers, &heads);
        if (g.n == 0)
            fprintf(stderr, "attnstat: run '%s' has no samples yet\n", run);
        else if (a->layer >= layers || a->head >= heads)
            fprintf(stderr,
                    "attnstat: run '%s' has layers 0..%lld and heads 0..%lld; no layer %d%s\n",
                    run, (long long)(layers - 1), (long long)(heads - 1), a->layer,
                    a->head >= 0 ? " with that head" : "");
        else
            fprintf(stderr, "attnstat: run '%s' layer %d has no samples in steps %lld..%lld\n",
                    run, a->layer, (long long)a->from, (long long)a->to);
        free(g.v);
        free(l.v);
        free(run);
        store_close(st);
        return CLI_EXIT_FAIL;
    }
    out_set o;
    out_begin(&o, a->fmt, stdout, cli_sample_cols, CLI_NSAMPLE_COLS);
    for (size_t i = 0; i < l.n; i++)
        cli_sample_out(&o, run, &l.v[i]);
    int oe = out_end(&o);
    if (a->fmt == OUT_TABLE) {
        double *en = malloc(l.n * sizeof *en), *ml = malloc(l.n * sizeof *ml);
        cli_head_pos *idx = malloc(l.n * sizeof *idx);
        if (en && ml && idx) {
            printf("\nrun %s, layer %d, steps %lld..%lld (%zu samples)\n", run, a->layer,
                   (long long)l.v[0].step, (long long)l.v[l.n - 1].step, l.n);
            /* One sparkline per head present, in head order (not a loop over 0..max head: head
             * numbers go up to INT32_MAX). */
            for (size_t i = 0; i < l.n; i++)
                idx[i] = (cli_head_pos){l.v[i].head, i};
            qsort(idx, l.n, sizeof *idx, cli_by_head);
            for (size_t i = 0; i < l.n;) {
                int32_t h = idx[i].head;
                size_t n = 0;
                for (; i < l.n && idx[i].head == h; i++, n++) {
                    en[n] = l.v[idx[i].i].stats.entropy_norm_mean;
                    ml[n] = l.v[idx[i].i].stats.max_logit;
                }
                printf("head %d\n", h);
                cli_spark_line("entropy_norm", en, n, 3);
                cli_spark_line("max_logit", ml, n, 2);
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

static double cli_metric(const store_sample *s, const char *metric)
{
    if (!strcmp(metric, "entropy"))
        return s->stats.entropy_mean;
    if (!strcmp(metric, "max_logit"))
        return s->stats.max_logit;
    return s->stats.entropy_norm_mean;
}

static int cli_use_color(const cli_args *a)
{
    if (a->color >= 0)
        return a->color;
    const char *term = getenv("TERM");
    const char *nc = getenv("NO_COLOR");
    return isatty(STDOUT_FILENO) && !(nc && *nc) && term && strcmp(term, "dumb");
}

static int cli_heads(const cli_args *a)
{
    store *st;
    int64_t run_id;
    char *run;
    int rc = cli_open_run(a, &st, &run_id, &run);
    if (rc != CLI_EXIT_OK)
        return rc;
    cli_samples l = {0};
    store_error err;
    int64_t step = 0;
    store_status s = store_grid(st, run_id, a->step, &step, cli_collect_sample, &l, &err);
    if (s != STORE_OK || l.failed || l.n == 0) {
        if (s == STORE_NOTFOUND || (s == STORE_OK && l.n == 0)) {
            if (a->step == STORE_STEP_LATEST)
                fprintf(stderr, "attnstat: run '%s' has no samples yet\n", run);
            else
                fprintf(stderr, "attnstat: run '%s' has no samples at step %lld (see attnstat "
                        "runs for its step range)\n", run, (long long)a->step);
        } else {
            fprintf(stderr, "attnstat: cannot read the grid: %s\n",
                    l.failed ? "out of memory" : err.msg);
        }
        free(l.v);
        free(run);
        store_close(st);
        return CLI_EXIT_FAIL;
    }
    int oe = 0;
    if (a->fmt != OUT_TABLE) {
        out_set o;
        out_begin(&o, a->fmt, stdout, cli_sample_cols, CLI_NSAMPLE_COLS);
        for (size_t i = 0; i < l.n; i++)
            cli_sample_out(&o, run, &l.v[i]);
        oe = out_end(&o);
    } else {
        int64_t layers, heads;
        cli_extent(&l, &layers, &heads);
        if (layers > CLI_MAX_GRID_LAYERS || heads > CLI_MAX_GRID_HEADS) {
            fprintf(stderr,
                    "attnstat: run '%s' step %lld has layer numbers up to %lld and head numbers up "
                    "to %lld: a %lld x %lld heatmap is more than the %d x %d drawn; use --format "
                    "json or csv for its samples\n",
                    run, (long long)step, (long long)(layers - 1), (long long)(heads - 1),
                    (long long)layers, (long long)heads, CLI_MAX_GRID_LAYERS, CLI_MAX_GRID_HEADS);
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
            double v = cli_metric(&l.v[i], a->metric);
            grid[(size_t)l.v[i].layer * (size_t)heads + (size_t)l.v[i].head] = v;
            if (isfinite(v) && v > vmax)
                vmax = v;
        }
        snprintf(title, (size_t)tn + 1, "run %s, step %lld: %s per layer x head", run,
                 (long long)step, a->metric);
        out_heatmap hm = {.title = title, .metric = a->metric, .layers = (int)layers,
                          .heads = (int)heads,
                          .values = grid, .lo = 0, .hi = 1, .high_is_good = 1,
                          .color = cli_use_color(a), .show_values = heads <= 16};
        if (!strcmp(a->metric, "entropy"))
            hm.hi = vmax > 0 ? vmax : 1;
        else if (!strcmp(a->metric, "max_logit")) {
            hm.hi = vmax > CLI_DEFAULT_CEILING ? vmax : CLI_DEFAULT_CEILING;
            hm.high_is_good = 0;
        }
        out_heatmap_print(stdout, &hm);
        /* The heads most at risk, named. */
        size_t order[5];
        size_t nw = 0;
        int low_bad = strcmp(a->metric, "max_logit") != 0;
        for (size_t pick = 0; pick < 5 && pick < l.n; pick++) {
            size_t best = SIZE_MAX;
            for (size_t i = 0; i < l.n; i++) {
                int used = 0;
                for (size_t k = 0; k < nw; k++)
                    used |= order[k] == i;
                double v = cli_metric(&l.v[i], a->metric);
                if (used || !isfinite(v))
                    continue;
                if (best == SIZE_MAX ||
                    (low_bad ? v < cli_metric(&l.v[best], a->metric)
                             : v > cli_metric(&l.v[best], a->metric)))
                    best = i;
            }
            if (best == SIZE_MAX)
                break;
            order[nw++] = best;
        }
        printf("%s %s:", low_bad ? "lowest" : "highest", a->metric);
        for (size_t k = 0; k < nw; k++) {
            const store_sample *x = &l.v[order[k]];
            printf("%s L%d.H%d %.3f", k ? "," : "", x->layer, x->head, cli_metric(x, a->metric));
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

/* ---- alerts ------------------------------------------------------------------------------------*/
static const out_col cli_alert_cols[] = {
    {"id", NULL, OUT_INT, 0, 0},          {"time", NULL, OUT_STR, 0, 1},
    {"time_ms", NULL, OUT_INT, 0, 0},     {"run", NULL, OUT_STR, 0, 1},
    {"run_id", NULL, OUT_INT, 0, 0},      {"layer", NULL, OUT_INT, 0, 1},
    {"head", NULL, OUT_INT, 0, 1},        {"step", NULL, OUT_INT, 0, 1},
    {"rule", NULL, OUT_STR, 0, 1},        {"state", NULL, OUT_STR, 0, 1},
    {"value", NULL, OUT_NUM, 4, 1},       {"threshold", NULL, OUT_NUM, 4, 1},
    {"message", NULL, OUT_STR, 0, 0},
};

typedef struct {
    out_set *o;
    const cli_runlist *runs;
} cli_alert_ctx;

static int cli_alert_row(void *ctx, const store_alert *al)
{
    cli_alert_ctx *c = ctx;
    char t[32];
    out_time(t, sizeof t, al->time_ms);
    out_val v[] = {out_i(al->id),
                   out_s(t),
                   out_i(al->time_ms),
                   out_s(cli_run_name(c->runs, al->run_id)),
                   out_i(al->run_id),
                   out_i(al->layer),
                   out_i(al->head),
                   out_i(al->step),
                   out_s(al->rule),
                   out_s(attnstat_state_name(al->state)),
                   out_d(al->value),
                   out_d(al->threshold),
                   out_s(al->message)};
    out_add(c->o, v);
    return 0;
}

static int cli_alerts(const cli_args *a)
{
    store *st = cli_open_db(a);
    if (!st)
        return CLI_EXIT_FAIL;
    int64_t run_id = 0;
    char *run = NULL;
    if (a->run) {
        int rc = cli_resolve(st, a, &run_id, &run);
        if (rc != CLI_EXIT_OK) {
            store_close(st);
            return rc;
        }
    }
    cli_runlist runs = {0};
    store_error err;
    store_status s = store_list_runs(st, cli_collect_run, &runs, &err);
    out_set o;
    out_begin(&o, a->fmt, stdout, cli_alert_cols,
              (int)(sizeof cli_alert_cols / sizeof cli_alert_cols[0]));
    cli_alert_ctx ctx = {&o, &runs};
    if (s == STORE_OK)
        s = store_alerts(st, run_id, a->active, cli_alert_row, &ctx, &err);
    size_t n = out_rows(&o);
    int oe = out_end(&o);
    cli_runlist_free(&runs);
    store_close(st);
    if (s != STORE_OK) {
        fprintf(stderr, "attnstat: cannot read alerts: %s\n", err.msg);
        free(run);
        return CLI_EXIT_FAIL;
    }
    if (n == 0 && a->fmt == OUT_TABLE)
        printf("no %salerts%s%s\n", a->active ? "active " : "", run ? " for run " : "",
               run ? run : "");
    free(run);
    return oe ? CLI_EXIT_FAIL : CLI_EXIT_OK;
}

/* ---- status and watch --------------------------------------------------------------------------*/
static attnstat_client *cli_connect(const cli_args *a)
{
    attnstat_connect_opts o;
    attnstat_connect_opts_init(&o);
    o.socket_path = a->socket;
    o.timeout_ms = a->timeout_ms;
    attnstat_client *c = NULL;
    attnstat_error err;
    if (attnstat_connect_ex(&o, &c, &err) != ATTNSTAT_OK) {
        fprintf(stderr, "attnstat: %s\n", err.msg);
        return NULL;
    }
    return c;
}

static int cli_status(const cli_args *a)
{
    attnstat_client *c = cli_connect(a);
    if (!c)
        return CLI_EXIT_FAIL;
    attnstat_daemon_status *ds = malloc(sizeof *ds);
    if (!ds) {
        attnstat_close(c);
        fprintf(stderr, "attnstat: out of memory\n");
        return CLI_EXIT_FAIL;
    }
    attnstat_code rc = attnstat_status(c, ds, a->timeout_ms);
    if (rc != ATTNSTAT_OK) {
        fprintf(stderr, "attnstat: status from %s: %s\n", a->socket, attnstat_last_error(c));
        free(ds);
        attnstat_close(c);
        return CLI_EXIT_FAIL;
    }
    if (a->fmt == OUT_JSON) {
        printf("{\"socket\": ");
        out_json_string(stdout, a->socket);
        printf(", \"daemon_version\": ");
        out_json_string(stdout, ds->daemon_version);
        printf(", \"db\": ");
        out_json_string(stdout, ds->db_path);
        printf(", \"uptime_s\": %.3f, \"clients\": %u, \"pushes\": %llu, \"pushes_done\": %llu, "
               "\"dropped\": %llu, \"rejected\": %llu, \"samples_stored\": %llu, "
               "\"alerts_active\": %u, \"push_rate\": %.3f, \"workers\": [",
               ds->uptime_s, ds->clients, (unsigned long long)ds->pushes,
               (unsigned long long)ds->pushes_done, (unsigned long long)ds->dropped,
               (unsigned long long)ds->rejected, (unsigned long long)ds->samples_stored,
               ds->alerts_active, ds->push_rate);
        for (uint32_t i = 0; i < ds->n_workers; i++) {
            const attnstat_worker_status *w = &ds->workers[i];
            printf("%s{\"name\": ", i ? ", " : "");
            out_json_string(stdout, w->name);
            printf(", \"queue_depth\": %u, \"queue_capacity\": %u, \"processed\": %llu, "
                   "\"dropped\": %llu, \"busy_frac\": %.4f}",
                   w->queue_depth, w->queue_capacity, (unsigned long long)w->processed,
                   (unsigned long long)w->dropped, w->busy_frac);
        }
        printf("], \"client_list\": [");
        for (uint32_t i = 0; i < ds->n_client_list; i++) {
            const attnstat_client_status *cs = &ds->client_list[i];
            printf("%s{\"id\": %llu, \"run\": ", i ? ", " : "", (unsigned long long)cs->id);
            out_json_string(stdout, cs->run);
            printf(", \"rank\": %d, \"pid\": %d, \"uid\": %u, \"pushes\": %llu, \"dropped\": %llu, "
                   "\"rejected\": %llu}",
                   cs->rank, cs->pid, cs->uid, (unsigned long long)cs->pushes,
                   (unsigned long long)cs->dropped, (unsigned long long)cs->rejected);
        }
        printf("]}\n");
    } else {
        printf("attnstatd %s at %s, up %.0f s\n", ds->daemon_version[0] ? ds->daemon_version : "?",
               a->socket, ds->uptime_s);
        printf("database       %s\n", ds->db_path[0] ? ds->db_path : "-");
        printf("clients        %u\n", ds->clients);
        printf("pushes         %llu received, %llu done, %llu dropped, %llu rejected\n",
               (unsigned long long)ds->pushes, (unsigned long long)ds->pushes_done,
               (unsigned long long)ds->dropped, (unsigned long long)ds->rejected);
        printf("push rate      %.1f /s (last 10 s)\n", ds->push_rate);
        printf("samples stored %llu\n", (unsigned long long)ds->samples_stored);
        printf("alerts active  %u\n", ds->alerts_active);
        if (ds->n_workers) {
            static const out_col wc[] = {
                {"worker", NULL, OUT_STR, 0, 1},   {"queue", NULL, OUT_INT, 0, 1},
                {"capacity", NULL, OUT_INT, 0, 1}, {"processed", NULL, OUT_INT, 0, 1},
                {"dropped", NULL, OUT_INT, 0, 1},  {"busy", NULL, OUT_NUM, 2, 1}};
            out_set o;
            printf("\n");
            out_begin(&o, OUT_TABLE, stdout, wc, 6);
            for (uint32_t i = 0; i < ds->n_workers; i++) {
                const attnstat_worker_status *w = &ds->workers[i];
                out_val v[] = {out_s(w->name), out_i(w->queue_depth), out_i(w->queue_capacity),
                               out_i((int64_t)w->processed), out_i((int64_t)w->dropped),
                               out_d(w->busy_frac)};
                out_add(&o, v);
            }
            out_end(&o);
        }
        if (ds->n_client_list) {
            static const out_col cc[] = {
                {"client", NULL, OUT_INT, 0, 1}, {"run", NULL, OUT_STR, 0, 1},
                {"rank", NULL, OUT_INT, 0, 1},   {"pid", NULL, OUT_INT, 0, 1},
                {"uid", NULL, OUT_INT, 0, 1},    {"pushes", NULL, OUT_INT, 0, 1},
                {"dropped", NULL, OUT_INT, 0, 1}, {"rejected", NULL, OUT_INT, 0, 1}};
            out_set o;
            printf("\n");
            out_begin(&o, OUT_TABLE, stdout, cc, 8);
            for (uint32_t i = 0; i < ds->n_client_list; i++) {
                const attnstat_client_status *cs = &ds->client_list[i];
                out_val v[] = {out_i((int64_t)cs->id), out_s(cs->run), out_i(cs->rank),
                               out_i(cs->pid), out_i(cs->uid), out_i((int64_t)cs->pushes),
                               out_i((int64_t)cs->dropped), out_i((int64_t)cs->rejected)};
                out_add(&o, v);
            }
            out_end(&o);
        }
    }
    free(ds);
    attnstat_close(c);
    return CLI_EXIT_OK;
}

static volatile sig_atomic_t cli_stop;

static void cli_on_signal(int sig)
{
    (void)sig;
    cli_stop = 1;
}

static void cli_print_alert(void *user, const attnstat_alert *al)
{
    const cli_args *a = user;
    char t[32];
    out_time(t, sizeof t, al->time_ms);
    if (a->fmt == OUT_JSON) {
        printf("{\"time\": \"%s\", \"time_ms\": %lld, \"run\": ", t, (long long)al->time_ms);
        out_json_string(stdout, al->run);
        printf(", \"run_id\": %lld, \"rank\": %d, \"layer\": %u, \"head\": %u, \"step\": %lld, "
               "\"rule\": \"%s\", \"state\": \"%s\", \"value\": ",
               (long long)al->run_id, al->rank, al->layer, al->head, (long long)al->step,
               attnstat_rule_name(al->rule), attnstat_state_name(al->state));
        if (isfinite(al->value))
            printf("%.17g", al->value);
        else
            printf("null");
        printf(", \"threshold\": ");
        if (isfinite(al->threshold))
            printf("%.17g", al->threshold);
        else
            printf("null");
        printf(", \"message\": ");
        out_json_string(stdout, al->message);
        printf("}\n");
    } else {
        printf("%s  %-7s  %-13s  run %s rank %d  layer %u head %u  step %lld  value %.4g "
               "threshold %.4g\n",
               t, attnstat_state_name(al->state), attnstat_rule_name(al->rule), al->run, al->rank,
               al->layer, al->head, (long long)al->step, al->value, al->threshold);
    }
    fflush(stdout);
}

static int cli_watch(cli_args *a)
{
    attnstat_client *c = cli_connect(a);
    if (!c)
        return CLI_EXIT_FAIL;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = cli_on_signal;
    sigemptyset(&sa.sa_mask);
    if (sigaction(SIGINT, &sa, NULL) != 0 || sigaction(SIGTERM, &sa, NULL) != 0) {
        fprintf(stderr, "attnstat: sigaction: %s\n", strerror(errno));
        attnstat_close(c);
        return CLI_EXIT_FAIL;
    }
    attnstat_set_alert_callback(c, cli_print_alert, a);
    if (attnstat_subscribe(c, 1, 0) != ATTNSTAT_OK) {
        fprintf(stderr, "attnstat: subscribe: %s\n", attnstat_last_error(c));
        attnstat_close(c);
        return CLI_EXIT_FAIL;
    }
    /* A Status round trip: once answered, the daemon has handled the Subscribe before it, so
     * every alert from now on reaches this watcher. Then say so (on stderr: stdout stays data). */
    attnstat_daemon_status *ds = malloc(sizeof *ds);
    attnstat_code sc = ds ? attnstat_status(c, ds, a->timeout_ms) : ATTNSTAT_ENOMEM;
    free(ds);
    if (sc != ATTNSTAT_OK) {
        fprintf(stderr, "attnstat: subscribing at %s: %s\n", a->socket,
                sc == ATTNSTAT_ENOMEM ? "out of memory" : attnstat_last_error(c));
        attnstat_close(c);
        return CLI_EXIT_FAIL;
    }
    fprintf(stderr, "watching alerts from %s (Ctrl-C to stop)\n", a->socket);
    int rc = CLI_EXIT_OK;
    while (!cli_stop) {
        if (attnstat_poll(c, 1000) != ATTNSTAT_OK) {
            fprintf(stderr, "attnstat: %s\n", attnstat_last_error(c));
            rc = CLI_EXIT_FAIL;
            break;
        }
    }
    attnstat_close(c);
    return rc;
}

int main(int argc, char **argv)
{
    cli_args a;
    if (cli_parse(argc, argv, &a) != 0)
        return CLI_EXIT_USAGE;
    if (!a.cmd || !strcmp(a.cmd, "help")) {
        if (a.cmd && argc > 2)
            for (int i = 2; i < argc; i++)
                if (argv[i][0] != '-') {
                    cli_command_help(argv[i]);
                    return CLI_EXIT_OK;
                }
        fputs(cli_usage, a.help || a.cmd ? stdout : stderr);
        return a.help || a.cmd ? CLI_EXIT_OK : CLI_EXIT_USAGE;
    }
    static const char *const cmds[] = {"runs", "trend", "heads", "alerts", "status", "watch"};
    int known = 0;
    for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++)
        known |= !strcmp(a.cmd, cmds[i]);
    if (!known) {
        fprintf(stderr, "attnstat: unknown command '%s' (commands: runs, trend, heads, alerts, "
                "status, watch; see attnstat --help)\n", a.cmd);
        return CLI_EXIT_USAGE;
    }
    if (a.help) {
        cli_command_help(a.cmd);
        return CLI_EXIT_OK;
    }
    if ((!strcmp(a.cmd, "status") || !strcmp(a.cmd, "watch")) && a.fmt == OUT_CSV) {
        fprintf(stderr, "attnstat: %s prints table or json, not csv\n", a.cmd);
        return CLI_EXIT_USAGE;
    }
    if (!strcmp(a.cmd, "runs"))
        return cli_runs(&a);
    if (!strcmp(a.cmd, "trend"))
        return cli_trend(&a);
    if (!strcmp(a.cmd, "heads"))
        return cli_heads(&a);
    if (!strcmp(a.cmd, "alerts"))
        return cli_alerts(&a);
    if (!strcmp(a.cmd, "status"))
        return cli_status(&a);
    return cli_watch(&a);
}
