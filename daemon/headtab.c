/* headtab.c — the latest statistics of every (run, global layer, global head), and their
 * Prometheus text (see headtab.h). Stage: metrics; calls store_job.h (store_merge_stats),
 * metrics.h (the text buffer), names.h (the rules' names), log and libc; the per-head families
 * are vocab.h's VOCAB_STATS rows that name a metric.
 *
 * How it is kept: the entries live in one dense array; an open-addressing index (linear probing,
 * at most half full) finds an entry by its key. Runs are interned in a small array (a node serves
 * few jobs) and an entry holds its run's index. Expiry and the sweep compact the array and rebuild
 * the index when they drop something; a push never pays for them. The sweep asks, per entry, about
 * the processes that fed its latest step (a hash lookup each, in the loop's run registry): a scrape
 * of a large table pays that once, which is what makes the end of a run show in that scrape.
 * A scrape sorts the entries by (run, layer, head) once and walks them per family.
 * The keys left out (ghosts: a run held its share) are a second dense array and index of the same
 * kind, lighter (no statistics); one taken in is marked dead and goes at the next rebuild. Taking
 * room back (trim) sorts the entries of the runs over their share once: it happens when the table
 * is full and a run under its share needs room, so about once per run that comes. */
#include "headtab.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "names.h"
#include "store_job.h"
#include "vocab.h"

#define HEADTAB_CONTRIB 8 /* processes remembered per entry and step (pooling, re-pushes) */
#define HEADTAB_RULES VOCAB_NRULES /* proto's AlertRule 1 .. VOCAB_NRULES (names.h names them) */
#define HEADTAB_GHOSTS 4  /* keys left out remembered, per key the table keeps (24 bytes each) */

typedef struct {
    uint32_t run;            /* index in t->runs */
    int32_t layer, head;
    int has_stats;           /* a sample was seen (an alert alone makes an entry without one) */
    int64_t step;
    int64_t touched_ms;      /* last sample or alert transition */
    stats_head s;            /* pooled over the processes of contrib at step */
    int64_t contrib[HEADTAB_CONTRIB];
    uint32_t ncontrib;
    uint16_t raised[HEADTAB_RULES]; /* raises minus clears per rule */
} entry;

typedef struct {
    char *name;
    uint32_t entries;        /* entries of this run */
    uint32_t ghosts;         /* its keys left out for want of room (remembered ones) */
    int said;                /* the log said that its heads are left out */
} run_slot;

/* A key left out (its run held its share): remembered to be counted, and taken in when room comes.
 * dead: forgotten (taken in), its slot reused at the next rebuild. */
typedef struct {
    uint32_t run;
    int32_t layer, head;
    int dead;
    int64_t touched_ms;
} ghost;

struct headtab {
    entry *e;
    uint32_t n, cap, max;
    uint32_t *index;         /* entry index + 1; 0: empty */
    uint32_t index_cap;      /* a power of two, >= 2 x cap */
    run_slot *runs;
    uint32_t nruns, capruns;
    uint32_t last_run;       /* the run found last (pushes come in runs of one run) */
    uint64_t untracked;
    ghost *g;                /* the keys left out, at most max of them (dense; dead ones too) */
    uint32_t ng, gcap, gdead;
    uint32_t *gindex;        /* ghost index + 1; 0: empty (a power of two, >= 2 x gcap) */
    uint32_t gindex_cap;
};

int headtab_mode_from(const char *name)
{
    static const char *const names[] = {"top", "all", "layers", "off"};
    for (int i = 0; i < 4; i++)
        if (name && strcmp(name, names[i]) == 0)
            return i;
    return -1;
}

headtab *headtab_new(uint32_t max_heads)
{
    headtab *t = calloc(1, sizeof *t);
    if (!t)
        return NULL;
    t->max = max_heads ? max_heads : 1;
    return t;
}

void headtab_free(headtab *t)
{
    if (!t)
        return;
    for (uint32_t i = 0; i < t->nruns; i++)
        free(t->runs[i].name);
    free(t->runs);
    free(t->e);
    free(t->index);
    free(t->g);
    free(t->gindex);
    free(t);
}

size_t headtab_count(const headtab *t)
{
    return t->n;
}

uint64_t headtab_untracked(const headtab *t)
{
    return t->untracked;
}

/* ---- keys ---------------------------------------------------------------------------------- */

static uint32_t key_hash(uint32_t run, int32_t layer, int32_t head)
{
    uint64_t k = ((uint64_t)run * 0x9E3779B97F4A7C15ull) ^ ((uint64_t)(uint32_t)layer << 32) ^
                 (uint32_t)head;
    k ^= k >> 31;
    k *= 0xBF58476D1CE4E5B9ull;
    k ^= k >> 29;
    return (uint32_t)k;
}

/* The slot of the key in the index: its entry's, or the empty one where it would go. */
static uint32_t slot_of(const headtab *t, uint32_t run, int32_t layer, int32_t head)
{
    uint32_t mask = t->index_cap - 1;
    uint32_t i = key_hash(run, layer, head) & mask;
    for (;;) {
        uint32_t v = t->index[i];
        if (v == 0)
            return i;
        const entry *x = &t->e[v - 1];
        if (x->run == run && x->layer == layer && x->head == head)
            return i;
        i = (i + 1) & mask;
    }
}

/* The index rebuilt for index_cap slots (a power of two). -1 on no memory (the old one kept). */
static int reindex(headtab *t, uint32_t index_cap)
{
    uint32_t *ni = calloc(index_cap, sizeof *ni);
    if (!ni)
        return -1;
    free(t->index);
    t->index = ni;
    t->index_cap = index_cap;
    for (uint32_t k = 0; k < t->n; k++)
        t->index[slot_of(t, t->e[k].run, t->e[k].layer, t->e[k].head)] = k + 1;
    return 0;
}

/* The run called name (interned when new); UINT32_MAX on no memory. */
static uint32_t run_of(headtab *t, const char *name)
{
    if (t->last_run < t->nruns && strcmp(t->runs[t->last_run].name, name) == 0)
        return t->last_run;
    for (uint32_t i = 0; i < t->nruns; i++)
        if (strcmp(t->runs[i].name, name) == 0)
            return t->last_run = i;
    if (t->nruns == t->capruns) {
        uint32_t ncap = t->capruns ? t->capruns * 2 : 8;
        run_slot *nr = realloc(t->runs, ncap * sizeof *nr);
        if (!nr)
            return UINT32_MAX;
        t->runs = nr;
        t->capruns = ncap;
    }
    char *dup = strdup(name);
    if (!dup)
        return UINT32_MAX;
    t->runs[t->nruns] = (run_slot){dup, 0, 0, 0};
    return t->last_run = t->nruns++;
}

/* ---- fair shares: keys left out ------------------------------------------------------------- */

/* The keys each run may keep now: max shared evenly by the runs known (those with entries or keys
 * left out, and the one asking). */
static uint32_t fair_share(const headtab *t)
{
    uint32_t share = t->max / (t->nruns ? t->nruns : 1);
    return share ? share : 1;
}

static uint32_t ghost_slot(const headtab *t, uint32_t run, int32_t layer, int32_t head)
{
    uint32_t mask = t->gindex_cap - 1;
    for (uint32_t i = key_hash(run, layer, head) & mask;; i = (i + 1) & mask) {
        uint32_t v = t->gindex[i];
        if (v == 0)
            return i;
        const ghost *g = &t->g[v - 1];
        if (g->run == run && g->layer == layer && g->head == head)
            return i;
    }
}

/* The ghosts' index rebuilt for cap slots (a power of two). -1 on no memory (the old one kept). */
static int ghost_reindex(headtab *t, uint32_t cap)
{
    uint32_t *ni = calloc(cap, sizeof *ni);
    if (!ni)
        return -1;
    free(t->gindex);
    t->gindex = ni;
    t->gindex_cap = cap;
    for (uint32_t k = 0; k < t->ng; k++)
        t->gindex[ghost_slot(t, t->g[k].run, t->g[k].layer, t->g[k].head)] = k + 1;
    return 0;
}

/* The forgotten ghosts go, the others keep their order, their runs renumbered through map when
 * given; the index is rebuilt. */
static void ghost_pack(headtab *t, const uint32_t *map)
{
    uint32_t kept = 0;
    for (uint32_t k = 0; k < t->ng; k++)
        if (!t->g[k].dead)
            t->g[kept++] = t->g[k];
    t->ng = kept;
    t->gdead = 0;
    for (uint32_t k = 0; map && k < t->ng; k++)
        t->g[k].run = map[t->g[k].run];
    if (t->gindex_cap && ghost_reindex(t, t->gindex_cap) != 0) {
        memset(t->gindex, 0, (size_t)t->gindex_cap * sizeof *t->gindex);
        for (uint32_t k = 0; k < t->ng; k++)
            t->gindex[ghost_slot(t, t->g[k].run, t->g[k].layer, t->g[k].head)] = k + 1;
    }
}

/* The key (of run r) is left out: remembered (or seen again) at now_ms. Past HEADTAB_GHOSTS x max
 * remembered keys, it is not (the counts of keys left out are then lower bounds; untracked counts
 * every sample). */
static void ghost_note(headtab *t, uint32_t r, int32_t layer, int32_t head, int64_t now_ms)
{
    if (t->gindex_cap) {
        uint32_t v = t->gindex[ghost_slot(t, r, layer, head)];
        if (v) {
            ghost *g = &t->g[v - 1];
            g->touched_ms = now_ms;
            if (g->dead) {
                g->dead = 0;
                t->gdead--;
                t->runs[r].ghosts++;
            }
            return;
        }
    }
    uint64_t most = (uint64_t)t->max * HEADTAB_GHOSTS;
    if (t->ng - t->gdead >= most)
        return;
    if (t->ng == t->gcap && t->gdead)
        ghost_pack(t, NULL);
    if (t->ng == t->gcap) {
        uint64_t ncap = t->gcap ? (uint64_t)t->gcap * 2 : 256;
        if (ncap > most)
            ncap = most;
        ghost *ng = realloc(t->g, (size_t)ncap * sizeof *ng);
        if (!ng)
            return;
        t->g = ng;
        t->gcap = (uint32_t)ncap;
    }
    if ((uint64_t)(t->ng + 1) * 2 > t->gindex_cap &&
        ghost_reindex(t, t->gindex_cap ? t->gindex_cap * 2 : 512) != 0)
        return;
    t->g[t->ng] = (ghost){r, layer, head, 0, now_ms};
    t->gindex[ghost_slot(t, r, layer, head)] = ++t->ng;
    t->runs[r].ghosts++;
}

/* The key (of run r) is kept from now on: no longer left out. */
static void ghost_take(headtab *t, uint32_t r, int32_t layer, int32_t head)
{
    if (!t->gindex_cap || t->ng == t->gdead)
        return;
    uint32_t v = t->gindex[ghost_slot(t, r, layer, head)];
    if (v && !t->g[v - 1].dead) {
        t->g[v - 1].dead = 1;
        t->gdead++;
        t->runs[r].ghosts--;
    }
}

/* A new key of run r that does not fit (r holds its share): counted, remembered, said once. */
static void left_out(headtab *t, uint32_t r, int32_t layer, int32_t head, int64_t now_ms)
{
    t->untracked++;
    ghost_note(t, r, layer, head, now_ms);
    if (t->runs[r].said)
        return;
    t->runs[r].said = 1;
    LOG_WARN("metrics", "run '%s' holds its share of the per-head metrics (%u keys: "
             "metrics_max_heads %u shared by %u run%s): its other heads are left out of /metrics "
             "(stored and alerted on; counted in attnstat_metrics_run_heads_left_out)",
             t->runs[r].name, fair_share(t), t->max, t->nruns, t->nruns == 1 ? "" : "s");
}

static uint32_t compact(headtab *t, const uint8_t *keep, const uint8_t *drop_ghost, int drop_runs);

typedef struct {
    uint32_t run;
    int raised;
    int64_t touched_ms;
    uint32_t k;
} trim_ord;

/* Within a run: entries with an alert raised first, then the most recently updated. */
static int cmp_trim(const void *a, const void *b)
{
    const trim_ord *p = a, *q = b;
    if (p->run != q->run)
        return p->run < q->run ? -1 : 1;
    if (p->raised != q->raised)
        return p->raised ? -1 : 1;
    if (p->touched_ms != q->touched_ms)
        return p->touched_ms > q->touched_ms ? -1 : 1;
    return (p->k > q->k) - (p->k < q->k);
}

static int any_raised(const entry *x);

/* The runs over their share give back their least useful entries (no alert raised, updated
 * longest ago) down to it, remembered as left out: room for a run under its share. Runs keep
 * their numbers. Returns 1 when there is room now. */
static int trim(headtab *t, uint32_t share, int64_t now_ms)
{
    int over = 0;
    for (uint32_t r = 0; r < t->nruns; r++)
        over |= t->runs[r].entries > share;
    if (!over)
        return 0;
    trim_ord *o = malloc((size_t)t->n * sizeof *o);
    uint8_t *keep = malloc(t->n);
    if (!o || !keep) {
        free(o);
        free(keep);
        return 0;
    }
    uint32_t m = 0;
    for (uint32_t k = 0; k < t->n; k++) {
        const entry *x = &t->e[k];
        keep[k] = 1;
        if (t->runs[x->run].entries > share)
            o[m++] = (trim_ord){x->run, any_raised(x), x->touched_ms, k};
    }
    qsort(o, m, sizeof *o, cmp_trim);
    for (uint32_t i = 0; i < m;) {
        uint32_t run = o[i].run, j = 0;
        for (; i < m && o[i].run == run; i++, j++) {
            if (j < share)
                continue;
            const entry *x = &t->e[o[i].k];
            keep[o[i].k] = 0;
            ghost_note(t, run, x->layer, x->head, now_ms);
        }
    }
    free(o);
    compact(t, keep, NULL, 0);
    free(keep);
    return t->n < t->max;
}

/* The entry of the key, made when missing while its run holds less than its fair share (room is
 * taken from the runs over theirs when the table is full); NULL when it does not fit (left out:
 * counted) or on no memory. */
static entry *entry_of(headtab *t, const char *run, int32_t layer, int32_t head, int64_t now_ms)
{
    uint32_t r = run_of(t, run);
    if (r == UINT32_MAX)
        return NULL;
    if (t->index_cap) {
        uint32_t sl = slot_of(t, r, layer, head);
        if (t->index[sl])
            return &t->e[t->index[sl] - 1];
    }
    uint32_t share = fair_share(t);
    if (t->runs[r].entries >= share || (t->n >= t->max && !trim(t, share, now_ms))) {
        left_out(t, r, layer, head, now_ms);
        return NULL;
    }
    if (t->n == t->cap) {
        uint32_t ncap = t->cap ? t->cap * 2 : 256;
        if (ncap > t->max)
            ncap = t->max;
        entry *ne = realloc(t->e, (size_t)ncap * sizeof *ne);
        if (!ne)
            return NULL;
        t->e = ne;
        t->cap = ncap;
    }
    if ((uint64_t)(t->n + 1) * 2 > t->index_cap) {
        uint32_t ic = t->index_cap ? t->index_cap * 2 : 512;
        if (reindex(t, ic) != 0)
            return NULL;
    }
    entry *x = &t->e[t->n];
    memset(x, 0, sizeof *x);
    x->run = r;
    x->layer = layer;
    x->head = head;
    t->index[slot_of(t, r, layer, head)] = ++t->n;
    t->runs[r].entries++;
    ghost_take(t, r, layer, head);
    return x;
}

static int any_raised(const entry *x)
{
    for (int r = 0; r < HEADTAB_RULES; r++)
        if (x->raised[r])
            return 1;
    return 0;
}

/* The entry of the key, or NULL: nothing is made. */
static entry *find_entry(headtab *t, const char *run, int32_t layer, int32_t head)
{
    if (!t->index_cap)
        return NULL;
    for (uint32_t r = 0; r < t->nruns; r++) {
        if (strcmp(t->runs[r].name, run) != 0)
            continue;
        uint32_t sl = slot_of(t, r, layer, head);
        return t->index[sl] ? &t->e[t->index[sl] - 1] : NULL;
    }
    return NULL;
}

/* ---- feeding ------------------------------------------------------------------------------- */

void headtab_observe(headtab *t, const char *run, int64_t run_id, int32_t layer, int32_t head_base,
                     const stats_head *heads, int32_t nheads, int64_t step, int64_t now_ms)
{
    for (int32_t i = 0; i < nheads; i++) {
        entry *x = entry_of(t, run, layer, head_base + i, now_ms);
        if (!x)
            continue;
        x->touched_ms = now_ms;
        int again = 0;
        for (uint32_t k = 0; k < x->ncontrib && k < HEADTAB_CONTRIB; k++)
            again |= x->contrib[k] == run_id;
        if (!x->has_stats || x->step != step || again) {
            /* the newest step (or a process's new word on its own step) replaces the entry */
            x->has_stats = 1;
            x->step = step;
            x->s = heads[i];
            x->contrib[0] = run_id;
            x->ncontrib = 1;
        } else {
            /* another process's rows of the same step: pooled */
            store_merge_stats(&x->s, &heads[i]);
            if (x->ncontrib < HEADTAB_CONTRIB)
                x->contrib[x->ncontrib] = run_id;
            x->ncontrib++;
        }
    }
}

void headtab_alert(headtab *t, const char *run, int32_t layer, int32_t head, int rule, int raised,
                   int64_t now_ms)
{
    if (rule < 1 || rule > HEADTAB_RULES)
        return;
    /* A clear finds its entry or nothing: an entry swept with its run (headtab_sweep) is not made
     * again by the resolutions that follow the run's end. */
    entry *x = raised ? entry_of(t, run, layer, head, now_ms) : find_entry(t, run, layer, head);
    if (!x)
        return;
    x->touched_ms = now_ms;
    uint16_t *c = &x->raised[rule - 1];
    if (raised && *c < UINT16_MAX)
        (*c)++;
    else if (!raised && *c > 0)
        (*c)--;
}

/* Keeps the entries marked in keep[0 .. n) (compacted in order) and drops the others; drops the
 * keys left out marked in drop_ghost[0 .. ng) (when given) and the forgotten ones; with drop_runs,
 * the runs left with neither an entry nor a key left out go and the others are renumbered. The
 * indexes are rebuilt. Returns the number of entries dropped. */
static uint32_t compact(headtab *t, const uint8_t *keep, const uint8_t *drop_ghost, int drop_runs)
{
    uint32_t kept = 0;
    for (uint32_t k = 0; k < t->n; k++) {
        if (!keep[k]) {
            t->runs[t->e[k].run].entries--;
            continue;
        }
        if (kept != k)
            t->e[kept] = t->e[k];
        kept++;
    }
    uint32_t dropped = t->n - kept;
    t->n = kept;
    for (uint32_t k = 0; drop_ghost && k < t->ng; k++)
        if (!t->g[k].dead && drop_ghost[k]) {
            t->runs[t->g[k].run].ghosts--;
            t->g[k].dead = 1;
            t->gdead++;
        }
    /* Runs left with nothing go, and the others are renumbered. */
    uint32_t *map = NULL;
    int gone = 0;
    for (uint32_t r = 0; drop_runs && r < t->nruns; r++)
        gone |= t->runs[r].entries == 0 && t->runs[r].ghosts == 0;
    if (gone && (map = malloc(t->nruns * sizeof *map)) != NULL) {
        uint32_t nr = 0;
        for (uint32_t r = 0; r < t->nruns; r++) {
            if (t->runs[r].entries == 0 && t->runs[r].ghosts == 0) {
                free(t->runs[r].name);
                map[r] = UINT32_MAX;
                continue;
            }
            t->runs[nr] = t->runs[r];
            map[r] = nr++;
        }
        t->nruns = nr;
        t->last_run = 0;
        for (uint32_t k = 0; k < t->n; k++)
            t->e[k].run = map[t->e[k].run];
    }
    if (t->gdead || map)
        ghost_pack(t, map);
    free(map);
    /* Rebuilt in place (the same size: never more than half full). On no memory for the new index
     * the old one is cleared and refilled. */
    if ((dropped || gone) && reindex(t, t->index_cap) != 0) {
        memset(t->index, 0, (size_t)t->index_cap * sizeof *t->index);
        for (uint32_t k = 0; k < t->n; k++)
            t->index[slot_of(t, t->e[k].run, t->e[k].layer, t->e[k].head)] = k + 1;
    }
    return dropped;
}

void headtab_expire(headtab *t, int64_t now_ms, int64_t stale_ms)
{
    uint8_t *keep = malloc(t->n ? t->n : 1), *drop = malloc(t->ng ? t->ng : 1);
    if (!keep || !drop) {
        free(keep);
        free(drop);
        return; /* tried again at the next expiry */
    }
    for (uint32_t k = 0; k < t->n; k++)
        keep[k] = now_ms - t->e[k].touched_ms <= stale_ms;
    for (uint32_t k = 0; k < t->ng; k++)
        drop[k] = now_ms - t->g[k].touched_ms > stale_ms;
    compact(t, keep, drop, 1);
    free(keep);
    free(drop);
}

uint32_t headtab_sweep(headtab *t, headtab_live_fn live, void *ctx)
{
    uint8_t *keep = malloc(t->n ? t->n : 1), *drop = malloc(t->ng ? t->ng : 1);
    int8_t *by_name = malloc(t->nruns ? t->nruns : 1); /* a run name's answer, asked once */
    if (!keep || !drop || !by_name) {
        free(keep);
        free(drop);
        free(by_name);
        return 0; /* tried again at the next sweep */
    }
    memset(by_name, -1, t->nruns ? t->nruns : 1);
    for (uint32_t k = 0; k < t->n; k++) {
        const entry *x = &t->e[k];
        const char *run = t->runs[x->run].name;
        int on = 0;
        if (x->has_stats && x->ncontrib <= HEADTAB_CONTRIB) {
            for (uint32_t i = 0; i < x->ncontrib && !on; i++)
                on = live(ctx, run, x->contrib[i]);
        } else if (x->has_stats || any_raised(x)) {
            /* contributors not all remembered, or an alert alone: the run name's answer */
            if (by_name[x->run] < 0)
                by_name[x->run] = (int8_t)(live(ctx, run, 0) != 0);
            on = by_name[x->run];
        }
        keep[k] = (uint8_t)(on != 0);
    }
    for (uint32_t k = 0; k < t->ng; k++) { /* keys left out: while their run name lives */
        const ghost *g = &t->g[k];
        if (g->dead)
            continue;
        if (by_name[g->run] < 0)
            by_name[g->run] = (int8_t)(live(ctx, t->runs[g->run].name, 0) != 0);
        drop[k] = (uint8_t)!by_name[g->run];
    }
    free(by_name);
    uint32_t dropped = compact(t, keep, drop, 1);
    free(keep);
    free(drop);
    return dropped;
}

/* ---- the text ------------------------------------------------------------------------------ */

/* The order of a scrape: by run name, then layer, then head (qsort's context through a global is
 * avoided: the entries are copied with their run's rank in the name order). */
typedef struct {
    uint32_t rrank;          /* the run's place in name order */
    const entry *x;
} sorted;

static int cmp_sorted(const void *a, const void *b)
{
    const sorted *p = a, *q = b;
    if (p->rrank != q->rrank)
        return p->rrank < q->rrank ? -1 : 1;
    if (p->x->layer != q->x->layer)
        return p->x->layer < q->x->layer ? -1 : 1;
    return (p->x->head > q->x->head) - (p->x->head < q->x->head);
}

typedef struct {
    const headtab *t;
    uint32_t i;
} run_ref;

static int cmp_run_ref(const void *a, const void *b)
{
    const run_ref *p = a, *q = b;
    return strcmp(p->t->runs[p->i].name, q->t->runs[q->i].name);
}

/* A value for the ranking of the top heads: -1 when the head has none. */
typedef struct {
    double v;
    uint32_t k;              /* index in the sorted array */
} ranked;

static int cmp_ranked_up(const void *a, const void *b)
{
    const ranked *p = a, *q = b;
    if (p->v != q->v)
        return p->v < q->v ? -1 : 1;
    return (p->k > q->k) - (p->k < q->k);
}

static int cmp_ranked_down(const void *a, const void *b)
{
    return cmp_ranked_up(b, a);
}

/* Marks in sel[lo .. hi) the `top` heads of lowest normalised entropy and of highest max logit
 * (heads without the value take no place), and every head with an alert raised. */
static int select_top(const sorted *so, uint32_t lo, uint32_t hi, uint32_t top, uint8_t *sel)
{
    ranked *r = malloc((size_t)(hi - lo) * sizeof *r);
    if (!r)
        return -1;
    for (int pass = 0; pass < 2; pass++) {
        uint32_t n = 0;
        for (uint32_t k = lo; k < hi; k++) {
            const entry *x = so[k].x;
            if (!x->has_stats)
                continue;
            double v = pass == 0 ? x->s.entropy_norm_mean : x->s.max_logit;
            if (isnan(v) || (pass == 1 && isinf(v) && v < 0))
                continue;
            r[n++] = (ranked){v, k};
        }
        qsort(r, n, sizeof *r, pass == 0 ? cmp_ranked_up : cmp_ranked_down);
        for (uint32_t i = 0; i < n && i < top; i++)
            sel[r[i].k] = 1;
    }
    free(r);
    for (uint32_t k = lo; k < hi; k++)
        if (any_raised(so[k].x))
            sel[k] = 1;
    return 0;
}

/* The per-head families over the selected entries. */
static void render_heads(const headtab *t, const sorted *so, uint32_t n, const uint8_t *sel,
                         metrics_buf *out)
{
    /* A family per VOCAB_STATS row with a metric (attnstat_head_<metric>, the row's help), then
     * the step and the non-finite rows. A head's value is left out when its row's weight count
     * is 0 (no counted row: a fraction of none is no news) and when it is NaN (no value) or -Inf
     * (no logit). */
    static const struct {
        const char *name, *help;
        size_t stat, weight;  /* offsets in stats_head: the double and its int64 weight count */
    } fam[] = {
#define HEADTAB_FAMILY(name, unit, pack, since, pool, weight, lo, hi, absent, metric, help, ...)    \
    {"attnstat_head_" metric, help, offsetof(stats_head, name), offsetof(stats_head, weight)},
        VOCAB_STATS(HEADTAB_FAMILY)
#undef HEADTAB_FAMILY
    };
    static const struct {
        const char *name, *help;
    } more[] = {
        {"attnstat_head_step", "Training step of a head's latest sample."},
        {"attnstat_head_nonfinite_rows",
         "Rows with NaN or Inf logits in a head's latest sample (heads with any only)."},
    };
    const size_t nfam = sizeof fam / sizeof fam[0], nmore = sizeof more / sizeof more[0];
    char run[3 * 256], val[64];
    for (size_t f = 0; f < nfam + nmore; f++) {
        if (f < nfam && strcmp(fam[f].name, "attnstat_head_") == 0)
            continue; /* the row has no family */
        const char *name = f < nfam ? fam[f].name : more[f - nfam].name;
        const char *help = f < nfam ? fam[f].help : more[f - nfam].help;
        metrics_printf(out, "# HELP %s %s\n# TYPE %s gauge\n", name, help, name);
        uint32_t last_run = UINT32_MAX;
        for (uint32_t k = 0; k < n; k++) {
            const entry *x = so[k].x;
            if (!sel[k] || !x->has_stats)
                continue;
            double v;
            if (f < nfam) {
                int64_t w;
                memcpy(&w, (const char *)&x->s + fam[f].weight, sizeof w);
                memcpy(&v, (const char *)&x->s + fam[f].stat, sizeof v);
                if (w <= 0)
                    v = NAN;
            } else if (f == nfam) {
                v = (double)x->step;
            } else {
                v = x->s.nonfinite_rows > 0 ? (double)x->s.nonfinite_rows : NAN;
            }
            /* No sample says nothing: NaN (no counted row) and -Inf (no logit) are left out. */
            if (isnan(v) || (isinf(v) && v < 0))
                continue;
            if (x->run != last_run) {
                metrics_label(t->runs[x->run].name, run, sizeof run);
                last_run = x->run;
            }
            metrics_value(v, val, sizeof val);
            metrics_printf(out, "%s{run=\"%s\",layer=\"%d\",head=\"%d\"} %s\n", name, run,
                           (int)x->layer, (int)x->head, val);
        }
    }
}

/* The per-layer aggregates: one pass per family over the sorted entries, a layer at a time. */
static void render_layers(const headtab *t, const sorted *so, uint32_t n, metrics_buf *out)
{
    static const struct {
        const char *name, *help;
    } fam[] = {
        {"attnstat_layer_min_entropy_normalized_ratio",
         "Lowest latest normalised entropy mean over a layer's heads."},
        {"attnstat_layer_mean_entropy_normalized_ratio",
         "Mean over a layer's heads of their latest normalised entropy mean."},
        {"attnstat_layer_max_logit", "Highest latest max logit over a layer's heads."},
        {"attnstat_layer_heads", "Heads of a layer with a sample on this node."},
        {"attnstat_layer_step", "Training step of a layer's newest sample."},
    };
    char run[3 * 256], val[64];
    for (size_t f = 0; f < sizeof fam / sizeof fam[0]; f++) {
        metrics_printf(out, "# HELP %s %s\n# TYPE %s gauge\n", fam[f].name, fam[f].help,
                       fam[f].name);
        for (uint32_t k = 0; k < n;) {
            uint32_t r = so[k].x->run;
            int32_t layer = so[k].x->layer;
            double emin = INFINITY, esum = 0, lmax = -INFINITY;
            int64_t step = INT64_MIN;
            uint32_t ne = 0, heads = 0;
            for (; k < n && so[k].x->run == r && so[k].x->layer == layer; k++) {
                const entry *x = so[k].x;
                if (!x->has_stats)
                    continue;
                heads++;
                step = x->step > step ? x->step : step;
                if (!isnan(x->s.entropy_norm_mean)) {
                    emin = fmin(emin, x->s.entropy_norm_mean);
                    esum += x->s.entropy_norm_mean;
                    ne++;
                }
                lmax = fmax(lmax, x->s.max_logit);
            }
            if (heads == 0)
                continue;
            double v = f == 0 ? (ne ? emin : NAN)
                     : f == 1 ? (ne ? esum / ne : NAN)
                     : f == 2 ? lmax
                     : f == 3 ? (double)heads
                              : (double)step;
            if (isnan(v) || (isinf(v) && v < 0))
                continue;
            metrics_label(t->runs[r].name, run, sizeof run);
            metrics_value(v, val, sizeof val);
            metrics_printf(out, "%s{run=\"%s\",layer=\"%d\"} %s\n", fam[f].name, run, (int)layer,
                           val);
        }
    }
}

static void render_alerts(const headtab *t, const sorted *so, uint32_t n, metrics_buf *out)
{
    metrics_printf(out, "# HELP attnstat_head_alert An alert this daemon raised on a head and has "
                   "not cleared (1), by rule; heads without one have no series.\n"
                   "# TYPE attnstat_head_alert gauge\n");
    char run[3 * 256];
    for (uint32_t k = 0; k < n; k++) {
        const entry *x = so[k].x;
        for (int r = 0; r < HEADTAB_RULES; r++) {
            if (!x->raised[r])
                continue;
            metrics_label(t->runs[x->run].name, run, sizeof run);
            metrics_printf(out, "attnstat_head_alert{run=\"%s\",layer=\"%d\",head=\"%d\","
                           "rule=\"%s\"} 1\n", run, (int)x->layer, (int)x->head,
                           names_alert_rule(r + 1));
        }
    }
}

/* Each run's share of the table: the keys it keeps and those left out, runs in name order. */
static void render_shares(const headtab *t, const run_ref *rr, metrics_buf *out)
{
    metrics_printf(out, "# HELP attnstat_metrics_heads_share Per-head keys each run may keep now: "
                   "metrics_max_heads shared evenly by the runs with heads on this node (a run "
                   "under its share takes room from those over it).\n"
                   "# TYPE attnstat_metrics_heads_share gauge\nattnstat_metrics_heads_share %u\n",
                   fair_share(t));
    static const char *const fam[2][2] = {
        {"attnstat_metrics_run_heads", "Per-head keys of a run kept for /metrics."},
        {"attnstat_metrics_run_heads_left_out",
         "Heads of a run left out of the per-head metrics for want of room (the run holds its "
         "share of metrics_max_heads; at most 4 x metrics_max_heads are counted); they are "
         "stored and alerted on all the same."},
    };
    char run[3 * 256];
    for (int f = 0; f < 2; f++) {
        metrics_printf(out, "# HELP %s %s\n# TYPE %s gauge\n", fam[f][0], fam[f][1], fam[f][0]);
        for (uint32_t i = 0; i < t->nruns; i++) {
            const run_slot *r = &t->runs[rr[i].i];
            metrics_label(r->name, run, sizeof run);
            metrics_printf(out, "%s{run=\"%s\"} %u\n", fam[f][0], run,
                           f ? r->ghosts : r->entries);
        }
    }
}

void headtab_render(const headtab *t, headtab_mode mode, uint32_t top, metrics_buf *out)
{
    metrics_printf(out, "# HELP attnstat_metrics_heads (run, layer, head) keys this daemon keeps "
                   "for its per-head metrics (metrics_max_heads at most).\n"
                   "# TYPE attnstat_metrics_heads gauge\nattnstat_metrics_heads %u\n"
                   "# HELP attnstat_metrics_heads_untracked_total Samples of new (run, layer, "
                   "head) keys not kept for the metrics: their run held its share of "
                   "metrics_max_heads.\n"
                   "# TYPE attnstat_metrics_heads_untracked_total counter\n"
                   "attnstat_metrics_heads_untracked_total %llu\n",
                   t->n, (unsigned long long)t->untracked);
    run_ref *rr = malloc((size_t)(t->nruns ? t->nruns : 1) * sizeof *rr);
    uint32_t *rrank = malloc((size_t)(t->nruns ? t->nruns : 1) * sizeof *rrank);
    sorted *so = NULL;
    uint8_t *sel = NULL;
    if (!rr || !rrank) {
        out->full = 1; /* said by the scrape's log line */
        goto done;
    }
    for (uint32_t i = 0; i < t->nruns; i++)
        rr[i] = (run_ref){t, i};
    qsort(rr, t->nruns, sizeof *rr, cmp_run_ref);
    for (uint32_t i = 0; i < t->nruns; i++)
        rrank[rr[i].i] = i;
    render_shares(t, rr, out);
    if (mode == HEADTAB_OFF || t->n == 0)
        goto done;
    so = malloc((size_t)t->n * sizeof *so);
    sel = calloc(t->n, 1);
    if (!so || !sel) {
        out->full = 1;
        goto done;
    }
    for (uint32_t k = 0; k < t->n; k++)
        so[k] = (sorted){rrank[t->e[k].run], &t->e[k]};
    qsort(so, t->n, sizeof *so, cmp_sorted);
    if (mode == HEADTAB_ALL) {
        memset(sel, 1, t->n);
    } else if (mode == HEADTAB_TOP) {
        for (uint32_t k = 0; k < t->n;) {
            uint32_t lo = k;
            while (k < t->n && so[k].x->run == so[lo].x->run)
                k++;
            if (select_top(so, lo, k, top, sel) != 0) {
                out->full = 1;
                goto done;
            }
        }
    }
    if (mode != HEADTAB_LAYERS)
        render_heads(t, so, t->n, sel, out);
    render_layers(t, so, t->n, out);
    render_alerts(t, so, t->n, out);
done:
    free(rr);
    free(rrank);
    free(so);
    free(sel);
}
