/* alerts.c — the alert engine behind alerts.h. Stage: the rule engine (pure); calls names and util;
 * reads vocab.h's rows.
 *
 * How it works
 * - One slot per (run, layer, head) in an open-addressing table with linear probing, kept at most
 *   half full; run_id 0 marks an empty slot (run ids are > 0). Removal (forgetting a run) uses
 *   backward-shift deletion, so there are no tombstones and forgetting never allocates.
 * - A slot holds, per rule, the consecutive bad and good counts, whether the rule is raised, and
 *   the transition that raised it; plus the EMA baseline of entropy_mean for ENTROPY_DROP.
 * - The rules are vocab.h's VOCAB_RULES, judged by their cmp column (observe_rule()); the
 *   thresholds are its VOCAB_THRESHOLDS, checked, merged, written and read back by their rows.
 * - Per-run records (thresholds, number of states, refused new heads) sit in a small array searched
 *   linearly (runs are few: one per training process), with the last hit remembered. A run gets
 *   one with its first state or its thresholds, and loses it when forgotten.
 * - Limits: a new head is admitted only while its run holds fewer than max_heads_per_run states
 *   and the engine fewer than max_heads; otherwise it is refused and counted, before anything is
 *   allocated.
 * - Every allocation goes through one helper that counts it, which is what alerts_allocations()
 *   reports and the tests watch.
 */
#include "alerts.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "names.h"
#include "util.h"

typedef struct {
    uint32_t bad, good;        /* consecutive samples, saturating */
    int raised;
    alerts_transition raise;   /* the transition that raised it (valid while raised) */
} rule_state;

typedef struct {
    int64_t run_id;            /* 0: empty slot */
    int32_t layer, head;
    double ema;                /* baseline of entropy_mean */
    uint32_t ema_n;            /* samples folded into the baseline (saturating) */
    rule_state r[ALERTS_NRULES];
} head_state;

typedef struct {
    int64_t run_id;
    alerts_config cfg;
    alerts_overrides ov;       /* what its Hello set (cfg = defaults + ov) */
    size_t heads;              /* states of this run in the table */
    uint64_t refused;          /* samples of new heads refused by a limit */
} run_config;

/* Room for this many runs comes with the engine. */
#define RUNS_INITIAL 8

struct alerts_engine {
    alerts_config defaults;
    alerts_limits limits;
    uint64_t refused;          /* every run's refused new heads, since alerts_new() */
    head_state *slots;
    size_t cap;                /* power of two, or 0 */
    size_t count;
    run_config *runs;
    size_t nruns, runs_cap;
    size_t last_run;           /* index of the last run found in runs[] */
    size_t allocations;
};

/* ---- names, configs ---------------------------------------------------------------------------- */

/* The rules and states are the protocol's (names.h): their names are spelled there once. */
const char *alerts_rule_name(alerts_rule r)
{
    return names_alert_rule((int)r);
}

const char *alerts_state_name(alerts_state s)
{
    return names_alert_state((int)s);
}

alerts_rule alerts_rule_from_name(const char *name)
{
    return (alerts_rule)names_alert_rule_from(name);
}

void alerts_config_default(alerts_config *c)
{
#define ALERTS_SET_DEFAULT(name, type, def, ...) c->name = (ALERTS_CTYPE_##type)(def);
    VOCAB_THRESHOLDS(ALERTS_SET_DEFAULT)
#undef ALERTS_SET_DEFAULT
}

/* v within [lo, hi] (each end open when its _incl is 0), finite. */
static int in_bounds(double v, double lo, int lo_incl, double hi, int hi_incl)
{
    return isfinite(v) && (lo_incl ? v >= lo : v > lo) && (hi_incl ? v <= hi : v < hi);
}

alerts_status alerts_config_check(const alerts_config *c, char *err, size_t errlen)
{
    if (!c) {
        util_err(err, errlen, "no alert config given");
        return ALERTS_EINVAL;
    }
    /* Every threshold against its row's bounds; the message names it, its value and the bounds
     * as the row gives them ("(0, 1]"). */
#define ALERTS_CHECK_ROW(name, type, def, lo, lo_incl, hi, hi_incl, help)                         \
    if (!in_bounds((double)c->name, lo, lo_incl, hi, hi_incl)) {                                  \
        util_err(err, errlen, "%s %g is out of bounds %c%g, %g%c", #name, (double)c->name,        \
                 (lo_incl) ? '[' : '(', (double)(lo), (double)(hi), (hi_incl) ? ']' : ')');       \
        return ALERTS_EINVAL;                                                                     \
    }
    VOCAB_THRESHOLDS(ALERTS_CHECK_ROW)
#undef ALERTS_CHECK_ROW
    return ALERTS_OK;
}

alerts_status alerts_config_merge(alerts_config *out, const alerts_config *base,
                                  const alerts_overrides *o, char *err, size_t errlen)
{
    alerts_config c = *base;
    if (o) {
#define ALERTS_MERGE_ROW(name, ...)                                                                \
    if (o->has_##name)                                                                             \
        c.name = o->name;
        VOCAB_THRESHOLDS(ALERTS_MERGE_ROW)
#undef ALERTS_MERGE_ROW
    }
    alerts_status st = alerts_config_check(&c, err, errlen);
    if (st == ALERTS_OK)
        *out = c;
    return st;
}

/* The runs table's JSON holds the thresholds by name, in VOCAB_THRESHOLDS' order:
 * alerts_config_format writes them, alerts_config_parse reads them back by key (a row added to
 * the table leaves the rows written before it readable, each missing key the daemon's value). */
static int config_put(char *buf, size_t n, size_t *at, const char *key, double d, int is_u32,
                      uint32_t u)
{
    const size_t room = *at < n ? n - *at : 0;
    const char *sep = *at > 1 ? "," : "";
    int w = is_u32 ? snprintf(buf ? buf + *at : NULL, room, "%s\"%s\":%" PRIu32, sep, key, u)
                   : snprintf(buf ? buf + *at : NULL, room, "%s\"%s\":%.17g", sep, key, d);
    if (w < 0)
        return -1;
    *at += (size_t)w;
    return 0;
}

int alerts_config_format(const alerts_config *c, char *buf, size_t n)
{
    size_t at = (size_t)snprintf(buf, n, "{");
#define PUT_VOCAB_D(name) (double)c->name, 0, 0
#define PUT_VOCAB_U(name) 0.0, 1, c->name
#define PUT(name, type, ...)                                                                      \
    if (config_put(n ? buf : NULL, n, &at, #name, PUT_##type(name)) != 0)                         \
        return -1;
    VOCAB_THRESHOLDS(PUT)
#undef PUT
#undef PUT_VOCAB_U
#undef PUT_VOCAB_D
    int w = snprintf(at < n ? buf + at : NULL, at < n ? n - at : 0, "}");
    return w < 0 ? -1 : (int)(at + (size_t)w);
}

/* The number after "key": in json (our own format: no spaces, no nesting); 0 when absent or not
 * a number. */
static int config_number(const char *json, const char *key, double *v)
{
    char pat[64];
    snprintf(pat, sizeof pat, "\"%s\":", key);
    const char *p = strstr(json, pat);
    if (!p)
        return 0;
    p += strlen(pat);
    char *end;
    *v = strtod(p, &end);
    return end != p && (*end == ',' || *end == '}');
}

int alerts_config_parse(const char *json, alerts_overrides *o)
{
    memset(o, 0, sizeof *o);
    if (!json || json[0] != '{')
        return -1;
    int found = 0;
    double v;
#define GET_VOCAB_D(name) o->name = v
#define GET_VOCAB_U(name) o->name = v >= 0.0 && v <= (double)UINT32_MAX ? (uint32_t)v : 0
#define GET(name, type, ...)                                                                      \
    if (config_number(json, #name, &v)) {                                                         \
        GET_##type(name);                                                                        \
        o->has_##name = 1;                                                                        \
        found++;                                                                                  \
    }
    VOCAB_THRESHOLDS(GET)
#undef GET
#undef GET_VOCAB_U
#undef GET_VOCAB_D
    return found;
}

/* The thresholds' places in an array of their values (thresholds_of()), ALERTS_THR_none last. */
enum {
#define ALERTS_THR_ID(name, ...) ALERTS_THR_##name,
    VOCAB_THRESHOLDS(ALERTS_THR_ID)
#undef ALERTS_THR_ID
    ALERTS_THR_N,
    ALERTS_THR_none = ALERTS_THR_N
};

/* c's thresholds as doubles by their place, and 0 for a rule that has none (VOCAB_ANY). */
static void thresholds_of(const alerts_config *c, double thv[ALERTS_THR_N + 1])
{
#define ALERTS_THR_VALUE(name, ...) thv[ALERTS_THR_##name] = (double)c->name;
    VOCAB_THRESHOLDS(ALERTS_THR_VALUE)
#undef ALERTS_THR_VALUE
    thv[ALERTS_THR_none] = 0.0;
}

/* Each rule's columns of VOCAB_RULES, by rule - 1. */
static const struct {
    const char *stat;     /* the statistic or count it reads */
    enum vocab_cmp cmp;
    const char *threshold; /* the threshold row, "none" */
    int thr;               /* its place (ALERTS_THR_*) */
} rule_row[ALERTS_NRULES] = {
#define ALERTS_RULE_ROW(c, v, name, stat, cmp, threshold)                                         \
    [v - 1] = {#stat, cmp, #threshold, ALERTS_THR_##threshold},
    VOCAB_RULES(ALERTS_RULE_ROW)
#undef ALERTS_RULE_ROW
};

/* The rules are 1..ALERTS_NRULES in the table's order (their slots), and one rule at most keeps
 * the EMA baseline a head's state has room for. */
#define ALERTS_RULE_AT(c, v, ...) _Static_assert(v >= 1 && v <= ALERTS_NRULES, "rule " #c);
VOCAB_RULES(ALERTS_RULE_AT)
#undef ALERTS_RULE_AT
#define ALERTS_ONE_DROP(c, v, name, stat, cmp, ...) +((cmp) == VOCAB_DROP)
_Static_assert((0 VOCAB_RULES(ALERTS_ONE_DROP)) <= 1, "a head keeps one EMA baseline");
#undef ALERTS_ONE_DROP

int alerts_rule_threshold(const alerts_config *c, alerts_rule r, double *value, const char **name)
{
    if ((int)r < 1 || (int)r > (int)ALERTS_NRULES || rule_row[r - 1].thr == ALERTS_THR_none)
        return 0;
    double thv[ALERTS_THR_N + 1];
    thresholds_of(c, thv);
    *value = thv[rule_row[r - 1].thr];
    if (name)
        *name = rule_row[r - 1].threshold;
    return 1;
}

int alerts_format(const alerts_transition *t, char *buf, size_t n)
{
    if (t->state == ALERTS_RESOLVED)
        return snprintf(buf, n, "%s resolved: run %" PRId64 " layer %" PRId32 " head %" PRId32
                        " (raised at step %" PRId64 ")", alerts_rule_name(t->rule), t->run_id,
                        t->layer, t->head, t->step);
    const char *what = "value", *cmp = "?", *than = "";
    int raised = t->state == ALERTS_RAISED;
    if ((int)t->rule >= 1 && (int)t->rule <= (int)ALERTS_NRULES) {
        what = rule_row[t->rule - 1].stat;
        switch (rule_row[t->rule - 1].cmp) {
        case VOCAB_BELOW:
            cmp = raised ? "<" : ">=";
            break;
        case VOCAB_ABOVE:
            cmp = raised ? ">" : "<=";
            break;
        case VOCAB_DROP:
            cmp = raised ? "<" : ">=";
            than = " (1 - ";
            break;
        case VOCAB_ANY:
            cmp = raised ? ">" : "=";
            break;
        }
    }
    char thr[96];
    if (*than)
        snprintf(thr, sizeof thr, "%.4g%s%s) x its baseline", t->threshold, than,
                 rule_row[t->rule - 1].threshold);
    else
        snprintf(thr, sizeof thr, "%.4g", t->threshold);
    return snprintf(buf, n,
                    "%s %s: run %" PRId64 " layer %" PRId32 " head %" PRId32 " step %" PRId64
                    ": %s %.4g %s %s for %" PRIu32 " sample%s",
                    alerts_rule_name(t->rule), alerts_state_name(t->state), t->run_id, t->layer,
                    t->head, t->step, what, t->value, cmp, thr, t->streak,
                    t->streak == 1 ? "" : "s");
}

/* ---- the engine ---------------------------------------------------------------------------------- */

static void *counted_alloc(alerts_engine *e, size_t n)
{
    void *p = calloc(1, n);
    if (p)
        e->allocations++;
    return p;
}

alerts_engine *alerts_new(const alerts_config *defaults, char *err, size_t errlen)
{
    alerts_config c;
    if (defaults) {
        if (alerts_config_check(defaults, err, errlen))
            return NULL;
        c = *defaults;
    } else {
        alerts_config_default(&c);
    }
    alerts_engine *e = calloc(1, sizeof *e);
    if (!e) {
        util_err(err, errlen, "alert engine: out of memory");
        return NULL;
    }
    e->defaults = c;
    alerts_limits_default(&e->limits);
    e->allocations = 1;
    e->runs = counted_alloc(e, RUNS_INITIAL * sizeof *e->runs);
    if (!e->runs) {
        free(e);
        util_err(err, errlen, "alert engine: out of memory");
        return NULL;
    }
    e->runs_cap = RUNS_INITIAL;
    return e;
}

void alerts_limits_default(alerts_limits *l)
{
    l->max_heads_per_run = ALERTS_DEFAULT_MAX_HEADS_PER_RUN;
    l->max_heads = ALERTS_MAX_HEADS;
}

alerts_status alerts_limits_check(const alerts_limits *l, char *err, size_t errlen)
{
    if (!l) {
        util_err(err, errlen, "no alert limits given");
        return ALERTS_EINVAL;
    }
    if (l->max_heads_per_run < 1 || l->max_heads_per_run > ALERTS_MAX_HEADS) {
        util_err(err, errlen, "max_heads_per_run %" PRIu32 " is out of bounds [1, %u]",
                l->max_heads_per_run, ALERTS_MAX_HEADS);
        return ALERTS_EINVAL;
    }
    if (l->max_heads < 1 || l->max_heads > ALERTS_MAX_HEADS) {
        util_err(err, errlen, "max_heads %" PRIu32 " is out of bounds [1, %u]", l->max_heads,
                ALERTS_MAX_HEADS);
        return ALERTS_EINVAL;
    }
    return ALERTS_OK;
}

alerts_status alerts_set_limits(alerts_engine *e, const alerts_limits *l, char *err, size_t errlen)
{
    alerts_status st = alerts_limits_check(l, err, errlen);
    if (st == ALERTS_OK)
        e->limits = *l;
    return st;
}

void alerts_get_limits(const alerts_engine *e, alerts_limits *out)
{
    *out = e->limits;
}

void alerts_free(alerts_engine *e)
{
    if (!e)
        return;
    free(e->slots);
    free(e->runs);
    free(e);
}

static uint64_t key_hash(int64_t run_id, int32_t layer, int32_t head)
{
    uint64_t x = (uint64_t)run_id * 0x9E3779B97F4A7C15ULL;
    x ^= ((uint64_t)(uint32_t)layer << 32 | (uint32_t)head) + 0x632BE59BD9B4E019ULL + (x << 6) +
         (x >> 2);
    /* splitmix64 finaliser */
    x ^= x >> 30;
    x *= 0xBF58476D1CE4E5B9ULL;
    x ^= x >> 27;
    x *= 0x94D049BB133111EBULL;
    x ^= x >> 31;
    return x;
}

static size_t home_of(const alerts_engine *e, const head_state *s)
{
    return (size_t)key_hash(s->run_id, s->layer, s->head) & (e->cap - 1);
}

/* The slot of the key, or of the empty slot where it would go. Needs cap > count. */
static head_state *probe(const alerts_engine *e, int64_t run_id, int32_t layer, int32_t head)
{
    size_t mask = e->cap - 1;
    size_t i = (size_t)key_hash(run_id, layer, head) & mask;
    for (;;) {
        head_state *s = &e->slots[i];
        if (s->run_id == 0 || (s->run_id == run_id && s->layer == layer && s->head == head))
            return s;
        i = (i + 1) & mask;
    }
}

/* Grow the table to at least new_cap slots (a power of two). */
static alerts_status grow(alerts_engine *e, size_t new_cap)
{
    if (new_cap <= e->cap)
        return ALERTS_OK;
    if (new_cap > (size_t)ALERTS_MAX_HEADS * 2 || new_cap > SIZE_MAX / sizeof(head_state))
        return ALERTS_ENOMEM;
    head_state *old = e->slots;
    size_t old_cap = e->cap;
    head_state *slots = counted_alloc(e, new_cap * sizeof *slots);
    if (!slots)
        return ALERTS_ENOMEM;
    e->slots = slots;
    e->cap = new_cap;
    for (size_t i = 0; i < old_cap; i++)
        if (old[i].run_id != 0)
            *probe(e, old[i].run_id, old[i].layer, old[i].head) = old[i];
    free(old);
    return ALERTS_OK;
}

static size_t cap_for(size_t n)
{
    size_t cap = 64;
    while (cap < 2 * n && cap < ((size_t)1 << 40))
        cap *= 2;
    return cap;
}

size_t alerts_table_bytes_max(const alerts_engine *e)
{
    size_t cap = cap_for(e->limits.max_heads);
    return (cap > e->cap ? cap : e->cap) * sizeof(head_state);
}

alerts_status alerts_reserve(alerts_engine *e, size_t n)
{
    if (n > e->limits.max_heads)
        return ALERTS_ELIMIT;
    return grow(e, cap_for(n));
}

static run_config *find_run(alerts_engine *e, int64_t run_id)
{
    if (e->last_run < e->nruns && e->runs[e->last_run].run_id == run_id)
        return &e->runs[e->last_run];
    for (size_t i = 0; i < e->nruns; i++) {
        if (e->runs[i].run_id == run_id) {
            e->last_run = i;
            return &e->runs[i];
        }
    }
    return NULL;
}

/* A new record for run_id (not in runs[] yet), with the default thresholds. NULL: no memory. */
static run_config *add_run(alerts_engine *e, int64_t run_id)
{
    if (e->nruns == e->runs_cap) {
        size_t ncap = e->runs_cap ? e->runs_cap * 2 : RUNS_INITIAL;
        run_config *nr = counted_alloc(e, ncap * sizeof *nr);
        if (!nr)
            return NULL;
        if (e->nruns)
            memcpy(nr, e->runs, e->nruns * sizeof *nr);
        free(e->runs);
        e->runs = nr;
        e->runs_cap = ncap;
    }
    run_config *r = &e->runs[e->nruns];
    memset(r, 0, sizeof *r);
    r->run_id = run_id;
    r->cfg = e->defaults;
    e->last_run = e->nruns++;
    return r;
}

/* The state of a new (run, layer, head), zeroed, once the caller has checked the limits; *rc is the
 * run's record, created when missing. NULL when an allocation fails (nothing is then counted). */
static head_state *new_head(alerts_engine *e, run_config **rc, int64_t run_id, int32_t layer,
                            int32_t head)
{
    if ((e->cap == 0 || (e->count + 1) * 2 > e->cap) && grow(e, e->cap ? e->cap * 2 : 64))
        return NULL;
    if (!*rc && !(*rc = add_run(e, run_id)))
        return NULL;
    head_state *s = probe(e, run_id, layer, head);
    memset(s, 0, sizeof *s);
    s->run_id = run_id;
    s->layer = layer;
    s->head = head;
    e->count++;
    (*rc)->heads++;
    return s;
}

alerts_status alerts_set_run(alerts_engine *e, int64_t run_id, const alerts_overrides *o,
                             char *err, size_t errlen)
{
    if (run_id <= 0) {
        util_err(err, errlen, "run id %" PRId64 " is not > 0", run_id);
        return ALERTS_EINVAL;
    }
    alerts_config c;
    alerts_status st = alerts_config_merge(&c, &e->defaults, o, err, errlen);
    if (st)
        return st;
    run_config *r = find_run(e, run_id);
    if (!r) {
        r = add_run(e, run_id);
        if (!r) {
            util_err(err, errlen, "alert engine: out of memory");
            return ALERTS_ENOMEM;
        }
    }
    r->cfg = c;
    if (o)
        r->ov = *o;
    else
        memset(&r->ov, 0, sizeof r->ov);
    return ALERTS_OK;
}

alerts_status alerts_set_defaults(alerts_engine *e, const alerts_config *c, char *err,
                                  size_t errlen)
{
    alerts_status st = alerts_config_check(c, err, errlen);
    if (st)
        return st;
    /* Every run's thresholds from the new defaults and its overrides; a run whose overrides no
     * longer fit them (a clear_after past a new bound...) keeps what it had. */
    for (size_t i = 0; i < e->nruns; i++) {
        alerts_config m;
        if (alerts_config_merge(&m, c, &e->runs[i].ov, NULL, 0) == ALERTS_OK)
            e->runs[i].cfg = m;
    }
    e->defaults = *c;
    return ALERTS_OK;
}

void alerts_run_config(const alerts_engine *e, int64_t run_id, alerts_config *out)
{
    for (size_t i = 0; i < e->nruns; i++) {
        if (e->runs[i].run_id == run_id) {
            *out = e->runs[i].cfg;
            return;
        }
    }
    *out = e->defaults;
}

/* Advance one rule by one judgement (bad or good); write a transition to *t when it flips. */
static int judge(rule_state *r, int bad, uint32_t raise_after, uint32_t clear_after,
                 alerts_transition *t)
{
    if (bad) {
        r->good = 0;
        if (r->bad < UINT32_MAX)
            r->bad++;
        if (!r->raised && r->bad >= raise_after) {
            r->raised = 1;
            t->state = ALERTS_RAISED;
            t->streak = r->bad;
            r->raise = *t;
            return 1;
        }
    } else {
        r->bad = 0;
        if (r->good < UINT32_MAX)
            r->good++;
        if (r->raised && r->good >= clear_after) {
            r->raised = 0;
            t->state = ALERTS_CLEARED;
            t->streak = r->good;
            return 1;
        }
    }
    return 0;
}

/* Judge one rule of one sample: value is its stat, threshold its threshold's value (for
 * VOCAB_DROP: entropy_drop). Writes its transition to *out and returns 1 when it flips; 0
 * otherwise. A NaN value says nothing (neither bad nor good), and so does a sample with no counted
 * row for the rules on a statistic. */
static int observe_rule(head_state *s, const alerts_config *c, int has_rows, alerts_rule rule,
                        enum vocab_cmp cmp, double value, double threshold, alerts_transition *t,
                        alerts_transition *out)
{
    rule_state *r = &s->r[rule - 1];
    t->rule = rule;
    t->value = value;
    switch (cmp) {
    case VOCAB_BELOW:
    case VOCAB_ABOVE:
        if (!has_rows || isnan(value))
            return 0;
        t->threshold = threshold;
        if (judge(r, cmp == VOCAB_BELOW ? value < threshold : value > threshold, c->raise_after,
                  c->clear_after, t)) {
            *out = *t;
            return 1;
        }
        return 0;
    case VOCAB_DROP: {
        /* Judged against the baseline before this sample, which it may then join. */
        if (!has_rows || !isfinite(value))
            return 0;
        int bad = 0, flipped = 0;
        if (s->ema_n >= c->ema_warmup) {
            t->threshold = (1.0 - threshold) * s->ema;
            bad = value < t->threshold;
            if (judge(r, bad, c->raise_after, c->clear_after, t)) {
                *out = *t;
                flipped = 1;
            }
        }
        if (!r->raised && !bad) {
            s->ema = s->ema_n == 0 ? value : s->ema + c->ema_alpha * (value - s->ema);
            if (s->ema_n < UINT32_MAX)
                s->ema_n++;
        }
        return flipped;
    }
    case VOCAB_ANY: /* immediate: raises on the first bad sample */
        t->threshold = 0;
        if (judge(r, value > 0, 1, c->clear_after, t)) {
            *out = *t;
            return 1;
        }
        return 0;
    }
    return 0;
}

int alerts_observe(alerts_engine *e, int64_t run_id, int32_t layer, int32_t head, int64_t step,
                   const stats_head *h, alerts_transition out[ALERTS_NRULES])
{
    if (!e || run_id <= 0 || layer < 0 || head < 0 || !h || !out)
        return ALERTS_OBSERVE_ERROR;
    int has_rows = h->rows > 0;
    if (!has_rows && h->nonfinite_rows <= 0)
        return 0; /* says nothing: not even a new state */

    head_state *s = e->cap ? probe(e, run_id, layer, head) : NULL;
    run_config *rc = find_run(e, run_id);
    if (!s || s->run_id == 0) {
        /* A new head: within the limits, then room for it, then its run's record. */
        if (rc && rc->heads >= e->limits.max_heads_per_run) {
            rc->refused++;
            e->refused++;
            return ALERTS_OBSERVE_RUN_FULL;
        }
        if (e->count >= e->limits.max_heads) {
            if (rc)
                rc->refused++;
            e->refused++;
            return ALERTS_OBSERVE_FULL;
        }
        if (!(s = new_head(e, &rc, run_id, layer, head)))
            return ALERTS_OBSERVE_ERROR;
    }
    const alerts_config *c = rc ? &rc->cfg : &e->defaults; /* a kept head's run has a record */

    double thv[ALERTS_THR_N + 1];
    thresholds_of(c, thv);

    /* Every rule, in the table's order: its stat (a double, or a count) against its threshold. */
    int n = 0;
    alerts_transition t = {.run_id = run_id, .layer = layer, .head = head, .step = step};
#define ALERTS_OBSERVE_RULE(k, v, name, stat, cmp, threshold)                                     \
    n += observe_rule(s, c, has_rows, ALERTS_##k, cmp, (double)h->stat,                          \
                      thv[ALERTS_THR_##threshold], &t, &out[n]);
    VOCAB_RULES(ALERTS_OBSERVE_RULE)
#undef ALERTS_OBSERVE_RULE
    return n;
}

alerts_status alerts_restore(alerts_engine *e, int64_t run_id, int32_t layer, int32_t head,
                             alerts_rule rule, int64_t step, double value, double threshold)
{
    if (!e || run_id <= 0 || layer < 0 || head < 0 || (int)rule < 1 || (int)rule > (int)ALERTS_NRULES)
        return ALERTS_EINVAL;
    int drop = rule_row[rule - 1].cmp == VOCAB_DROP;
    if (drop && !(isfinite(threshold) && threshold > 0))
        return ALERTS_EINVAL;
    head_state *s = e->cap ? probe(e, run_id, layer, head) : NULL;
    run_config *rc = find_run(e, run_id);
    if (!s || s->run_id == 0) {
        if ((rc && rc->heads >= e->limits.max_heads_per_run) || e->count >= e->limits.max_heads)
            return ALERTS_ELIMIT;
        if (!(s = new_head(e, &rc, run_id, layer, head)))
            return ALERTS_ENOMEM;
    }
    rule_state *r = &s->r[rule - 1];
    if (r->raised)
        return ALERTS_OK;
    if (drop) { /* the threshold was (1 - drop) x baseline */
        double thv[ALERTS_THR_N + 1];
        thresholds_of(&rc->cfg, thv);
        s->ema = threshold / (1.0 - thv[rule_row[rule - 1].thr]);
        s->ema_n = UINT32_MAX; /* judged at once, whatever ema_warmup the run gets */
    }
    r->raised = 1;
    r->bad = 0;
    r->good = 0;
    memset(&r->raise, 0, sizeof r->raise);
    r->raise.run_id = run_id;
    r->raise.layer = layer;
    r->raise.head = head;
    r->raise.step = step;
    r->raise.rule = rule;
    r->raise.state = ALERTS_RAISED;
    r->raise.value = value;
    r->raise.threshold = threshold;
    return ALERTS_OK;
}

int alerts_resolve(alerts_engine *e, int64_t run_id, int32_t layer, int32_t head,
                   alerts_rule rule, int64_t step)
{
    if (!e || run_id <= 0 || (int)rule < 1 || (int)rule > (int)ALERTS_NRULES || !e->cap)
        return 0;
    head_state *s = probe(e, run_id, layer, head);
    if (s->run_id == 0)
        return 0;
    rule_state *r = &s->r[rule - 1];
    if (!r->raised || r->raise.step != step)
        return 0;
    r->raised = 0;
    r->bad = 0;
    r->good = 0;
    return 1;
}

size_t alerts_active(const alerts_engine *e, int64_t run_id, alerts_transition *out, size_t max)
{
    size_t n = 0;
    for (size_t i = 0; i < e->cap; i++) {
        const head_state *s = &e->slots[i];
        if (s->run_id == 0 || (run_id > 0 && s->run_id != run_id))
            continue;
        for (int r = 0; r < ALERTS_NRULES; r++) {
            if (!s->r[r].raised)
                continue;
            if (n < max)
                out[n] = s->r[r].raise;
            n++;
        }
    }
    return n;
}

/* Empty slot i and close the gap (backward-shift deletion for linear probing). */
static void remove_slot(alerts_engine *e, size_t i)
{
    size_t mask = e->cap - 1, j = i;
    e->slots[i].run_id = 0;
    for (;;) {
        j = (j + 1) & mask;
        if (e->slots[j].run_id == 0)
            break;
        size_t k = home_of(e, &e->slots[j]);
        /* Entry j may stay when its home k lies cyclically in (i, j]. */
        int stays = i <= j ? (i < k && k <= j) : (i < k || k <= j);
        if (stays)
            continue;
        e->slots[i] = e->slots[j];
        e->slots[j].run_id = 0;
        i = j;
    }
    e->count--;
}

void alerts_forget_heads(alerts_engine *e, int64_t run_id)
{
    if (!e || run_id <= 0)
        return;
    for (size_t i = 0; i < e->cap;) {
        if (e->slots[i].run_id == run_id)
            remove_slot(e, i); /* another entry may have moved into i: look again */
        else
            i++;
    }
    /* the run's record stays (its thresholds): its count of states goes with them, or a run that
     * ends for idleness and resumes would count its heads again on top and reach its cap */
    for (size_t i = 0; i < e->nruns; i++)
        if (e->runs[i].run_id == run_id)
            e->runs[i].heads = 0;
    e->last_run = 0;
}

void alerts_forget_run(alerts_engine *e, int64_t run_id)
{
    if (!e || run_id <= 0)
        return;
    alerts_forget_heads(e, run_id);
    for (size_t i = 0; i < e->nruns; i++) {
        if (e->runs[i].run_id == run_id) {
            e->runs[i] = e->runs[--e->nruns];
            break;
        }
    }
    e->last_run = 0;
}

size_t alerts_heads(const alerts_engine *e)
{
    return e->count;
}

size_t alerts_run_heads(const alerts_engine *e, int64_t run_id)
{
    for (size_t i = 0; i < e->nruns; i++)
        if (e->runs[i].run_id == run_id)
            return e->runs[i].heads;
    return 0;
}

uint64_t alerts_refused(const alerts_engine *e, int64_t run_id)
{
    if (run_id <= 0)
        return e->refused;
    for (size_t i = 0; i < e->nruns; i++)
        if (e->runs[i].run_id == run_id)
            return e->runs[i].refused;
    return 0;
}

size_t alerts_allocations(const alerts_engine *e)
{
    return e->allocations;
}
