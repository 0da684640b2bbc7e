/* alerts.c — the attnstat CLI's alert listings (see alerts.h): `alerts`, the transitions with what
 * an operator acts on (the id that ack, resolve and silence take; who acknowledged a raise and
 * when; the silence that holds a firing alert's key now, and until when) and the filters, and
 * `alerts silences`, the silences in force.
 *
 * A raise is firing while it is the latest transition of its (run, layer, head, rule): the store's
 * active query (store_alerts, active_only) gives those, read first; the silences in force
 * (store_silences) are read next, the latest of a key being the one that holds it (as attnstatd
 * keeps them); then the transitions themselves, each matched against both.
 *
 * Stage: a command file of the CLI. Calls the store's read half (alerts, silences, runs), history.c
 * (the database, --run, the runs' names), out.c and attnstat_state_name. */
#include "alerts.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attnstat.h"
#include "history.h"
#include "out.h"
#include "store_read.h"

#define ALERTS_RULE_MAX 32

/* ---- what holds now: the firing raises and the silences ------------------------------------- */

/* A silence in force, its rule copied. */
typedef struct {
    int64_t id, run_id, time_ms, until_ms;
    int32_t layer, head;
    uint32_t uid;
    char rule[ALERTS_RULE_MAX];
} alerts_silence;

typedef struct {
    int64_t *firing;         /* ids of the firing raises, ascending (the store's order) */
    size_t nfiring, capfiring;
    alerts_silence *sil;     /* silences in force, by id */
    size_t nsil, capsil;
    int failed;              /* out of memory */
} alerts_now;

static int alerts_collect_firing(void *ctx, const store_alert *al)
{
    alerts_now *w = ctx;
    if (w->nfiring == w->capfiring) {
        size_t cap = w->capfiring ? w->capfiring * 2 : 64;
        int64_t *nv = realloc(w->firing, cap * sizeof *nv);
        if (!nv) {
            w->failed = 1;
            return 1;
        }
        w->firing = nv;
        w->capfiring = cap;
    }
    w->firing[w->nfiring++] = al->id;
    return 0;
}

static int alerts_collect_silence(void *ctx, const store_silence *s)
{
    alerts_now *w = ctx;
    if (w->nsil == w->capsil) {
        size_t cap = w->capsil ? w->capsil * 2 : 16;
        alerts_silence *nv = realloc(w->sil, cap * sizeof *nv);
        if (!nv) {
            w->failed = 1;
            return 1;
        }
        w->sil = nv;
        w->capsil = cap;
    }
    alerts_silence *k = &w->sil[w->nsil++];
    *k = (alerts_silence){.id = s->id, .run_id = s->run_id, .time_ms = s->time_ms,
                          .until_ms = s->until_ms, .layer = s->layer, .head = s->head,
                          .uid = s->uid};
    snprintf(k->rule, sizeof k->rule, "%s", s->rule ? s->rule : "");
    return 0;
}

static void alerts_now_free(alerts_now *w)
{
    free(w->firing);
    free(w->sil);
}

static int alerts_cmp_id(const void *x, const void *y)
{
    int64_t a = *(const int64_t *)x, b = *(const int64_t *)y;
    return a < b ? -1 : a > b;
}

static int alerts_is_firing(const alerts_now *w, const store_alert *al)
{
    return al->state == STORE_ALERT_RAISED && w->nfiring &&
           bsearch(&al->id, w->firing, w->nfiring, sizeof *w->firing, alerts_cmp_id);
}

/* The silence that holds the alert's key now (the latest of its key), or NULL. */
static const alerts_silence *alerts_silence_of(const alerts_now *w, const store_alert *al)
{
    for (size_t i = w->nsil; i-- > 0;) {
        const alerts_silence *k = &w->sil[i];
        if (k->run_id == al->run_id && k->layer == al->layer && k->head == al->head &&
            al->rule && !strcmp(k->rule, al->rule))
            return k;
    }
    return NULL;
}

/* "2026-11-24T16:25:42Z", or "run end" for a silence until its run ends. */
static void alerts_until_text(char *buf, size_t len, int64_t until_ms)
{
    if (until_ms)
        out_time(buf, len, until_ms);
    else
        snprintf(buf, len, "run end");
}

/* ---- alerts -------------------------------------------------------------------------------- */
static const out_col alerts_cols[] = {
    {"id", NULL, OUT_INT, 0, 1},          {"time", NULL, OUT_STR, 0, 1},
    {"time_ms", NULL, OUT_INT, 0, 0},     {"run", NULL, OUT_STR, 0, 1},
    {"run_id", NULL, OUT_INT, 0, 0},      {"layer", NULL, OUT_INT, 0, 1},
    {"head", NULL, OUT_INT, 0, 1},        {"step", NULL, OUT_INT, 0, 1},
    {"rule", NULL, OUT_STR, 0, 1},        {"state", NULL, OUT_STR, 0, 1},
    {"value", NULL, OUT_NUM, 4, 1},       {"threshold", NULL, OUT_NUM, 4, 1},
    {"reason", NULL, OUT_STR, 0, 1},      {"by_uid", "by", OUT_NUM, 0, 1},
    {"ack_uid", "acked by", OUT_NUM, 0, 1}, {"ack_time", "acked", OUT_STR, 0, 1},
    {"ack_time_ms", NULL, OUT_NUM, 0, 0}, {"message", NULL, OUT_STR, 0, 0},
    /* added later: after the columns CSV readers already know by position */
    {"firing", NULL, OUT_INT, 0, 0},      {"silenced_until", "silenced until", OUT_STR, 0, 1},
    {"silenced_until_ms", NULL, OUT_NUM, 0, 0},
    {"silence_id", NULL, OUT_NUM, 0, 0},  {"silenced_by", NULL, OUT_NUM, 0, 0},
};

/* The filters of `alerts`: --run and --active go to the store's query; the others are applied
 * here, over the rows it returns. */
static int alerts_kept(const cli_args *a, const history_runlist *runs, const alerts_now *w,
                       const store_alert *al)
{
    int firing = alerts_is_firing(w, al);
    const alerts_silence *sil = firing ? alerts_silence_of(w, al) : NULL;
    if (a->state) {
        int want = !strcmp(a->state, "firing")    ? firing
                   : !strcmp(a->state, "raised")  ? al->state == STORE_ALERT_RAISED
                   : !strcmp(a->state, "cleared") ? al->state == STORE_ALERT_CLEARED
                                                  : al->state == STORE_ALERT_RESOLVED;
        if (!want)
            return 0;
    }
    if (a->unacked && (!firing || al->acked || sil))
        return 0;
    if (a->silenced && !sil)
        return 0;
    return (!a->layer_set || al->layer == a->layer) && (a->head < 0 || al->head == a->head) &&
           (!a->rule || (al->rule && !strcmp(al->rule, a->rule))) &&
           (!a->since_set || al->time_ms >= a->since_ms) &&
           (a->rank < 0 || history_run_rank(runs, al->run_id) == a->rank);
}

/* -n N: the newest N alerts kept, oldest first once full (a ring over v[0..n), next the oldest). */
typedef struct {
    store_alert *v;
    size_t n, cap, next;
    int64_t want;
    int failed;
} alerts_newest;

static char *alerts_strdup(const char *s, int *failed)
{
    if (!s)
        return NULL;
    char *d = strdup(s);
    *failed |= d == NULL;
    return d;
}

static void alerts_newest_add(alerts_newest *w, const store_alert *al)
{
    store_alert *slot;
    if (w->n < (size_t)w->want) {
        if (w->n == w->cap) {
            size_t cap = w->cap ? w->cap * 2 : 16;
            if (cap > (size_t)w->want)
                cap = (size_t)w->want;
            store_alert *nv = realloc(w->v, cap * sizeof *nv);
            if (!nv) {
                w->failed = 1;
                return;
            }
            w->v = nv;
            w->cap = cap;
        }
        slot = &w->v[w->n++];
    } else {
        slot = &w->v[w->next];
        w->next = (w->next + 1) % w->n;
        free((char *)slot->rule);
        free((char *)slot->message);
        free((char *)slot->reason);
    }
    *slot = *al;
    slot->rule = alerts_strdup(al->rule, &w->failed);
    slot->message = alerts_strdup(al->message, &w->failed);
    slot->reason = alerts_strdup(al->reason, &w->failed);
}

static void alerts_newest_free(alerts_newest *w)
{
    for (size_t i = 0; i < w->n; i++) {
        free((char *)w->v[i].rule);
        free((char *)w->v[i].message);
        free((char *)w->v[i].reason);
    }
    free(w->v);
}

typedef struct {
    out_set *o;
    const history_runlist *runs;
    const alerts_now *now;
    const cli_args *a;
    alerts_newest *newest; /* NULL: every alert kept goes out at once */
} alerts_ctx;

static void alerts_out(alerts_ctx *c, const store_alert *al)
{
    char t[32], acked[32] = "", until[32] = "";
    out_time(t, sizeof t, al->time_ms);
    if (al->acked)
        out_time(acked, sizeof acked, al->ack_ms);
    int firing = alerts_is_firing(c->now, al);
    const alerts_silence *sil = firing ? alerts_silence_of(c->now, al) : NULL;
    if (sil)
        alerts_until_text(until, sizeof until, sil->until_ms);
    /* A table says "firing" for a raise still active; JSON and CSV keep the transition's name and
     * say it in the column firing. */
    const char *state = attnstat_state_name(al->state);
    if (firing && c->a->fmt == OUT_TABLE)
        state = "firing";
    out_val v[] = {out_i(al->id),
                   out_s(t),
                   out_i(al->time_ms),
                   out_s(history_run_name(c->runs, al->run_id)),
                   out_i(al->run_id),
                   out_i(al->layer),
                   out_i(al->head),
                   out_i(al->step),
                   out_s(al->rule),
                   out_s(state),
                   out_d(al->value),
                   out_d(al->threshold),
                   out_s(al->reason ? al->reason : ""),
                   out_d(al->has_uid ? (double)al->uid : NAN),
                   out_d(al->acked ? (double)al->ack_uid : NAN),
                   out_s(acked),
                   out_d(al->acked ? (double)al->ack_ms : NAN),
                   out_s(al->message),
                   out_i(firing),
                   out_s(sil ? until : NULL),
                   out_d(sil ? (double)sil->until_ms : NAN),
                   out_d(sil ? (double)sil->id : NAN),
                   out_d(sil ? (double)sil->uid : NAN)};
    out_add(c->o, v);
}

static int alerts_row(void *ctx, const store_alert *al)
{
    alerts_ctx *c = ctx;
    if (!alerts_kept(c->a, c->runs, c->now, al))
        return 0;
    if (c->newest)
        alerts_newest_add(c->newest, al);
    else
        alerts_out(c, al);
    return 0;
}

/* " --rank 1 --layer 3 ..." of the filters given, for the empty-result line. */
static void alerts_filters(char *buf, size_t len, const cli_args *a)
{
    size_t n = 0;
    buf[0] = '\0';
#define ALERTS_ADD(...)                                                                            \
    do {                                                                                           \
        if (n < len)                                                                               \
            n += (size_t)snprintf(buf + n, len - n, __VA_ARGS__);                                  \
    } while (0)
    if (a->state)
        ALERTS_ADD(" --state %s", a->state);
    if (a->unacked)
        ALERTS_ADD(" --unacked");
    if (a->silenced)
        ALERTS_ADD(" --silenced");
    if (a->rank >= 0)
        ALERTS_ADD(" --rank %d", a->rank);
    if (a->layer_set)
        ALERTS_ADD(" --layer %d", a->layer);
    if (a->head >= 0)
        ALERTS_ADD(" --head %d", a->head);
    if (a->rule)
        ALERTS_ADD(" --rule %s", a->rule);
    if (a->since_set) {
        char t[32];
        out_time(t, sizeof t, a->since_ms);
        ALERTS_ADD(" --since '%s'", t);
    }
#undef ALERTS_ADD
}

/* Opens the database and resolves an optional --run: CLI_EXIT_OK with *st open, *run_id (0: every
 * run) and *run (NULL, or the name to free). */
static int alerts_open(const cli_args *a, store **st, int64_t *run_id, char **run)
{
    *run_id = 0;
    *run = NULL;
    *st = history_open_db(a);
    if (!*st)
        return CLI_EXIT_FAIL;
    if (a->run) {
        int rc = history_resolve(*st, a, run_id, run);
        if (rc != CLI_EXIT_OK) {
            store_close(*st);
            *st = NULL;
            return rc;
        }
    }
    return CLI_EXIT_OK;
}

/* What a listing reads besides its rows: the runs (names, ranks), the silences in force and,
 * with firing, the raises still active (of run_id, or every run's when 0). */
static store_status alerts_gather(store *st, int64_t run_id, int firing, history_runlist *runs,
                                  alerts_now *now, store_error *err)
{
    store_status s = store_list_runs(st, history_collect_run, runs, err);
    if (s == STORE_OK && firing)
        s = store_alerts(st, run_id, 1, alerts_collect_firing, now, err);
    if (s == STORE_OK)
        s = store_silences(st, run_id, 0, alerts_collect_silence, now, err);
    return s;
}

int alerts_list(const cli_args *a)
{
    store *st;
    int64_t run_id;
    char *run;
    int rc = alerts_open(a, &st, &run_id, &run);
    if (rc != CLI_EXIT_OK)
        return rc;
    history_runlist runs = {0};
    alerts_now now = {0};
    store_error err;
    store_status s = alerts_gather(st, run_id, 1, &runs, &now, &err);
    out_set o;
    out_begin(&o, a->fmt, stdout, alerts_cols, (int)(sizeof alerts_cols / sizeof alerts_cols[0]));
    alerts_newest newest = {.want = a->newest};
    alerts_ctx ctx = {&o, &runs, &now, a, a->newest > 0 ? &newest : NULL};
    /* Only firing raises can pass these: the store's active query reads fewer rows. */
    int active = a->active || a->unacked || a->silenced ||
                 (a->state && !strcmp(a->state, "firing"));
    if (s == STORE_OK && !now.failed)
        s = store_alerts(st, run_id, active, alerts_row, &ctx, &err);
    for (size_t i = 0; i < newest.n; i++)
        alerts_out(&ctx, &newest.v[(newest.next + i) % newest.n]);
    size_t n = out_rows(&o);
    int oe = out_end(&o);
    int failed = newest.failed || now.failed;
    alerts_newest_free(&newest);
    alerts_now_free(&now);
    history_runlist_free(&runs);
    store_close(st);
    if (s != STORE_OK || failed) {
        fprintf(stderr, "attnstat: cannot read alerts: %s\n",
                s != STORE_OK ? out_safe(err.msg) : "out of memory");
        free(run);
        return CLI_EXIT_FAIL;
    }
    if (n == 0 && a->fmt == OUT_TABLE) {
        char filters[256];
        alerts_filters(filters, sizeof filters, a);
        printf("no %salerts%s%s%s%s\n", a->active ? "active " : "", run ? " for run " : "",
               run ? run : "", filters[0] ? " matching" : "", filters);
    }
    free(run);
    return oe ? CLI_EXIT_FAIL : CLI_EXIT_OK;
}

/* ---- alerts silences ------------------------------------------------------------------------ */
static const out_col alerts_silence_cols[] = {
    {"id", NULL, OUT_INT, 0, 1},         {"run", NULL, OUT_STR, 0, 1},
    {"run_id", NULL, OUT_INT, 0, 0},     {"rank", NULL, OUT_INT, 0, 1},
    {"layer", NULL, OUT_INT, 0, 1},      {"head", NULL, OUT_INT, 0, 1},
    {"rule", NULL, OUT_STR, 0, 1},       {"by_uid", "by", OUT_INT, 0, 1},
    {"since", NULL, OUT_STR, 0, 1},      {"since_ms", NULL, OUT_INT, 0, 0},
    {"until", NULL, OUT_STR, 0, 1},      {"until_ms", NULL, OUT_INT, 0, 0},
    {"until_run_end", NULL, OUT_INT, 0, 0},
};

int alerts_silences(const cli_args *a)
{
    store *st;
    int64_t run_id;
    char *run;
    int rc = alerts_open(a, &st, &run_id, &run);
    if (rc != CLI_EXIT_OK)
        return rc;
    history_runlist runs = {0};
    alerts_now now = {0};
    store_error err;
    store_status s = alerts_gather(st, run_id, 0, &runs, &now, &err);
    store_close(st);
    if (s != STORE_OK || now.failed) {
        fprintf(stderr, "attnstat: cannot read silences: %s\n",
                s != STORE_OK ? out_safe(err.msg) : "out of memory");
        alerts_now_free(&now);
        history_runlist_free(&runs);
        free(run);
        return CLI_EXIT_FAIL;
    }
    out_set o;
    out_begin(&o, a->fmt, stdout, alerts_silence_cols,
              (int)(sizeof alerts_silence_cols / sizeof alerts_silence_cols[0]));
    for (size_t i = 0; i < now.nsil; i++) {
        const alerts_silence *k = &now.sil[i];
        char since[32], until[32];
        out_time(since, sizeof since, k->time_ms);
        alerts_until_text(until, sizeof until, k->until_ms);
        out_val v[] = {out_i(k->id),
                       out_s(history_run_name(&runs, k->run_id)),
                       out_i(k->run_id),
                       out_i(history_run_rank(&runs, k->run_id)),
                       out_i(k->layer),
                       out_i(k->head),
                       out_s(k->rule),
                       out_i(k->uid),
                       out_s(since),
                       out_i(k->time_ms),
                       out_s(until),
                       out_i(k->until_ms),
                       out_i(k->until_ms == 0)};
        out_add(&o, v);
    }
    int oe = out_end(&o);
    if (now.nsil == 0 && a->fmt == OUT_TABLE)
        printf("no silences in force%s%s\n", run ? " for run " : "", run ? run : "");
    alerts_now_free(&now);
    history_runlist_free(&runs);
    free(run);
    return oe ? CLI_EXIT_FAIL : CLI_EXIT_OK;
}
