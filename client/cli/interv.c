/* interv.c — `attnstat interventions RUN` (see interv.h): one row per intervention, by run, then
 * step, then the order received: when the daemon received it, the process's rank, the step it
 * acted on, the global layer, the kind, the heads with their values, threshold and measured.
 *
 * A run name that several ranks share (a tensor- or pipeline-parallel job) lists every rank's,
 * unless --rank picks one. A table shows at most INTERV_TABLE_HEADS heads a row (the rest
 * counted); CSV carries heads and values whole as JSON arrays; json prints one object a line
 * with them as arrays (values null when none were sent).
 *
 * Stage: a command file of the CLI. Calls the store's read half (runs, interventions), history.c
 * (the database, the runs' names, a run's resolution) and out.c. */
#include "interv.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "history.h"
#include "out.h"
#include "store_read.h"

#define INTERV_TABLE_HEADS 12

static const out_col interv_cols[] = {
    {"time", NULL, OUT_STR, 0, 1},       {"time_ms", NULL, OUT_INT, 0, 0},
    {"run", NULL, OUT_STR, 0, 1},        {"run_id", NULL, OUT_INT, 0, 0},
    {"rank", NULL, OUT_INT, 0, 1},       {"step", NULL, OUT_INT, 0, 1},
    {"layer", NULL, OUT_NUM, 0, 1},      {"kind", NULL, OUT_STR, 0, 1},
    {"heads", "heads (=value)", OUT_STR, 0, 1}, {"values", NULL, OUT_STR, 0, 0},
    {"threshold", NULL, OUT_NUM, 4, 1},  {"measured", NULL, OUT_NUM, 4, 1},
    {"detail", NULL, OUT_STR, 0, 0},     {"id", NULL, OUT_INT, 0, 0},
};

typedef struct {
    const cli_args *a;
    const history_runlist *runs;
    out_set o;               /* table and CSV */
    char *heads, *values;    /* text of one row's cells */
    size_t cap;
    size_t n;                /* rows printed */
    int failed;              /* out of memory */
} interv_ctx;

static int interv_kept(const cli_args *a, const store_intervention *iv)
{
    return (!a->layer_set || iv->layer == a->layer) && (!a->kind || !strcmp(iv->kind, a->kind)) &&
           (!a->since_set || iv->time_ms >= a->since_ms) &&
           (!a->until_set || iv->time_ms <= a->until_ms);
}

/* The cells' buffers grown for n heads (a number takes at most 25 characters and a separator). */
static int interv_room(interv_ctx *c, int32_t n)
{
    size_t need = 64 + (size_t)n * 28;
    if (need <= c->cap)
        return 0;
    char *h = realloc(c->heads, need), *v = h ? realloc(c->values, need) : NULL;
    if (h)
        c->heads = h;
    if (!h || !v) {
        c->failed = 1;
        return -1;
    }
    c->values = v;
    c->cap = need;
    return 0;
}

/* A table's cell: "8=0.5 11=0.25" (or "8 11" without values), at most INTERV_TABLE_HEADS heads
 * and "+N" for the rest. CSV's: the JSON arrays. */
static void interv_cells(interv_ctx *c, const store_intervention *iv)
{
    size_t a = 0, b = 0;
    int table = c->a->fmt == OUT_TABLE;
    if (!table)
        a += (size_t)snprintf(c->heads + a, c->cap - a, "[");
    b += (size_t)snprintf(c->values + b, c->cap - b, "[");
    for (int32_t i = 0; i < iv->nheads; i++) {
        if (table && i == INTERV_TABLE_HEADS) {
            a += (size_t)snprintf(c->heads + a, c->cap - a, " +%d", (int)(iv->nheads - i));
            break;
        }
        if (table && iv->values)
            a += (size_t)snprintf(c->heads + a, c->cap - a, "%s%d=%.4g", i ? " " : "",
                                  (int)iv->heads[i], iv->values[i]);
        else
            a += (size_t)snprintf(c->heads + a, c->cap - a, "%s%d", i ? (table ? " " : ",") : "",
                                  (int)iv->heads[i]);
    }
    for (int32_t i = 0; iv->values && i < iv->nheads; i++)
        b += (size_t)snprintf(c->values + b, c->cap - b, "%s%.17g", i ? "," : "", iv->values[i]);
    if (!table)
        snprintf(c->heads + a, c->cap - a, "]");
    snprintf(c->values + b, c->cap - b, "]");
    if (table && iv->nheads == 0)
        snprintf(c->heads, c->cap, "-");
}

/* A number of JSON (17 significant digits: it reads back bit for bit), or null when it is none. */
static void interv_json_num(const char *key, double v)
{
    if (isfinite(v))
        printf(", \"%s\": %.17g", key, v);
    else
        printf(", \"%s\": null", key);
}

void interv_json_fields(const store_intervention *iv)
{
    char t[32];
    out_time(t, sizeof t, iv->time_ms);
    printf("\"step\": %lld, \"time\": \"%s\", \"time_ms\": %lld", (long long)iv->step, t,
           (long long)iv->time_ms);
    if (iv->layer >= 0)
        printf(", \"layer\": %d", (int)iv->layer);
    else
        printf(", \"layer\": null");
    printf(", \"kind\": ");
    out_json_string(stdout, iv->kind);
    printf(", \"heads\": [");
    for (int32_t i = 0; i < iv->nheads; i++)
        printf("%s%d", i ? "," : "", (int)iv->heads[i]);
    if (iv->values) {
        printf("], \"values\": [");
        for (int32_t i = 0; i < iv->nheads; i++)
            printf("%s%.17g", i ? "," : "", iv->values[i]);
        printf("]");
    } else {
        printf("], \"values\": null");
    }
    interv_json_num("threshold", iv->threshold);
    interv_json_num("measured", iv->measured);
    printf(", \"detail\": ");
    if (iv->detail)
        out_json_string(stdout, iv->detail);
    else
        printf("null");
}

/* One object a line, as out.c writes them ("key": value, ...), heads and values as arrays. */
static void interv_json(interv_ctx *c, const store_intervention *iv)
{
    printf("{\"id\": %lld, \"run\": ", (long long)iv->id);
    out_json_string(stdout, history_run_name(c->runs, iv->run_id));
    printf(", \"run_id\": %lld, \"rank\": %d, ", (long long)iv->run_id, (int)iv->rank);
    interv_json_fields(iv);
    printf("}\n");
}

static int interv_row(void *ctx, const store_intervention *iv)
{
    interv_ctx *c = ctx;
    if (!interv_kept(c->a, iv))
        return 0;
    c->n++;
    if (c->a->fmt == OUT_JSON) {
        interv_json(c, iv);
        return 0;
    }
    char t[32];
    out_time(t, sizeof t, iv->time_ms);
    if (interv_room(c, iv->nheads) != 0)
        return 1;
    interv_cells(c, iv);
    out_val v[] = {out_s(t),
                   out_i(iv->time_ms),
                   out_s(history_run_name(c->runs, iv->run_id)),
                   out_i(iv->run_id),
                   out_i(iv->rank),
                   out_i(iv->step),
                   out_d(iv->layer >= 0 ? (double)iv->layer : NAN),
                   out_s(iv->kind),
                   out_s(c->heads),
                   out_s(iv->values ? c->values : NULL),
                   out_d(iv->threshold),
                   out_d(iv->measured),
                   out_s(iv->detail),
                   out_i(iv->id)};
    out_add(&c->o, v);
    return 0;
}

/* The runs to list: the one --run (and --rank) names, or every rank of a name several share. */
static int interv_runs(store *st, const cli_args *a, const history_runlist *all, int64_t *ids,
                       size_t cap, size_t *n)
{
    *n = 0;
    store_error err;
    int64_t id;
    store_status s = store_resolve_run(st, a->run, a->rank, &id, &err);
    if (s == STORE_OK) {
        ids[(*n)++] = id;
        return CLI_EXIT_OK;
    }
    if (s == STORE_AMBIGUOUS && a->rank < 0) {
        for (size_t i = 0; i < all->n && *n < cap; i++)
            if (!strcmp(all->names[i], a->run))
                ids[(*n)++] = all->ids[i];
        if (*n)
            return CLI_EXIT_OK;
    }
    int64_t unused;
    char *name = NULL;
    int rc = history_resolve(st, a, &unused, &name); /* says why, as every command does */
    free(name);
    return rc == CLI_EXIT_OK ? CLI_EXIT_FAIL : rc;
}

int interv_list(const cli_args *a)
{
    if (!a->run || a->nruns > 1) {
        fprintf(stderr, "attnstat: interventions takes one run: attnstat interventions RUN (a name "
                "or an id; see attnstat runs)\n");
        return CLI_EXIT_USAGE;
    }
    store *st = history_open_db(a);
    if (!st)
        return CLI_EXIT_FAIL;
    history_runlist runs = {0};
    store_error err;
    store_status s = store_list_runs(st, history_collect_run, &runs, &err);
    if (s != STORE_OK) {
        fprintf(stderr, "attnstat: cannot read the runs: %s\n", out_safe(err.msg));
        store_close(st);
        return CLI_EXIT_FAIL;
    }
    int64_t *ids = malloc((runs.n ? runs.n : 1) * sizeof *ids);
    size_t nids = 0;
    int rc = ids ? interv_runs(st, a, &runs, ids, runs.n, &nids) : CLI_EXIT_FAIL;
    if (rc != CLI_EXIT_OK) {
        if (!ids)
            fprintf(stderr, "attnstat: out of memory\n");
        free(ids);
        history_runlist_free(&runs);
        store_close(st);
        return rc;
    }
    interv_ctx c = {.a = a, .runs = &runs};
    if (a->fmt != OUT_JSON)
        out_begin(&c.o, a->fmt, stdout, interv_cols, (int)(sizeof interv_cols / sizeof *interv_cols));
    for (size_t i = 0; i < nids && s == STORE_OK && !c.failed; i++)
        s = store_interventions(st, ids[i], interv_row, &c, &err);
    int oe = a->fmt != OUT_JSON ? out_end(&c.o) : 0;
    if (s != STORE_OK || c.failed) {
        fprintf(stderr, "attnstat: cannot read the interventions of run '%s': %s\n",
                out_safe(a->run), s != STORE_OK ? out_safe(err.msg) : "out of memory");
        rc = CLI_EXIT_FAIL;
    } else if (c.n == 0 && a->fmt == OUT_TABLE) {
        printf("no interventions for run %s%s%s%s%s%s\n", out_safe(a->run),
               a->layer_set ? " at that --layer" : "", a->kind ? " of kind " : "",
               a->kind ? out_safe(a->kind) : "", a->since_set || a->until_set ? " in that time" : "",
               nids > 1 ? " (any rank)" : "");
    }
    free(c.heads);
    free(c.values);
    free(ids);
    history_runlist_free(&runs);
    store_close(st);
    return rc != CLI_EXIT_OK ? rc : oe ? CLI_EXIT_FAIL : CLI_EXIT_OK;
}
