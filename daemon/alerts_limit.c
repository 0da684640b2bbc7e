/* alerts_limit.c — the per-run bound on alert transitions (see alerts_limit.h). Stage: beside the
 * alert feed; calls libc only.
 *
 * Runs are few (those with transitions, forgotten when they end): a dense array searched linearly,
 * the last one found first (a batch's transitions come in runs of one run). The keys of suppressed
 * raises still active are an open-addressing set (linear probing, at most half full counting the
 * deleted slots), rebuilt without its deleted slots when it fills. */
#include "alerts_limit.h"

#include <stdlib.h>
#include <string.h>

typedef struct {
    int64_t run_id;
    double tokens;
    int64_t refill_ms;       /* tokens are as of this time */
    uint64_t total;          /* suppressed in the run's life */
    uint64_t pending;        /* suppressed since the last summary */
    int64_t first_ms, last_ms; /* of those */
} lim_run;

/* A key of a suppressed raise; run_id 0: an empty slot, -1: a deleted one. */
typedef struct {
    int64_t run_id;
    int32_t layer, head;
    int32_t rule;
} lim_key;

struct alerts_limit {
    double rate, burst;
    lim_run *runs;
    size_t nruns, capruns, last;
    lim_key *keys;
    size_t kcap, klive, kused; /* slots (a power of two), keys, keys + deleted slots */
    uint64_t total;
};

alerts_limit *alerts_limit_new(double rate, double burst)
{
    alerts_limit *l = calloc(1, sizeof *l);
    if (l)
        alerts_limit_set(l, rate, burst);
    return l;
}

void alerts_limit_free(alerts_limit *l)
{
    if (!l)
        return;
    free(l->runs);
    free(l->keys);
    free(l);
}

void alerts_limit_set(alerts_limit *l, double rate, double burst)
{
    l->rate = rate > 0 ? rate : 1e-9;
    l->burst = burst >= 1 ? burst : 1;
    for (size_t i = 0; i < l->nruns; i++)
        if (l->runs[i].tokens > l->burst)
            l->runs[i].tokens = l->burst;
}

/* ---- runs ----------------------------------------------------------------------------------- */

static lim_run *run_find(alerts_limit *l, int64_t run_id)
{
    if (l->last < l->nruns && l->runs[l->last].run_id == run_id)
        return &l->runs[l->last];
    for (size_t i = 0; i < l->nruns; i++)
        if (l->runs[i].run_id == run_id) {
            l->last = i;
            return &l->runs[i];
        }
    return NULL;
}

/* The run's entry, made with a full bucket when new; NULL on no memory. */
static lim_run *run_of(alerts_limit *l, int64_t run_id, int64_t now_ms)
{
    lim_run *r = run_find(l, run_id);
    if (r)
        return r;
    if (l->nruns == l->capruns) {
        size_t ncap = l->capruns ? l->capruns * 2 : 16;
        lim_run *nr = realloc(l->runs, ncap * sizeof *nr);
        if (!nr)
            return NULL;
        l->runs = nr;
        l->capruns = ncap;
    }
    r = &l->runs[l->nruns];
    memset(r, 0, sizeof *r);
    r->run_id = run_id;
    r->tokens = l->burst;
    r->refill_ms = now_ms;
    l->last = l->nruns++;
    return r;
}

static void refill(const alerts_limit *l, lim_run *r, int64_t now_ms)
{
    if (now_ms > r->refill_ms) {
        r->tokens += l->rate * (double)(now_ms - r->refill_ms) / 1000.0;
        if (r->tokens > l->burst)
            r->tokens = l->burst;
    }
    r->refill_ms = now_ms;
}

/* ---- keys ----------------------------------------------------------------------------------- */

static size_t key_hash(int64_t run_id, int32_t layer, int32_t head, int32_t rule)
{
    uint64_t k = (uint64_t)run_id * 0x9E3779B97F4A7C15ull;
    k ^= ((uint64_t)(uint32_t)layer << 32 | (uint32_t)head) +
         (uint64_t)rule * 0x632BE59BD9B4E019ull;
    k ^= k >> 31;
    k *= 0xBF58476D1CE4E5B9ull;
    k ^= k >> 29;
    return (size_t)k;
}

static int key_is(const lim_key *k, const alerts_transition *t)
{
    return k->run_id == t->run_id && k->layer == t->layer && k->head == t->head &&
           k->rule == (int32_t)t->rule;
}

/* The slot holding t's key, or SIZE_MAX. */
static size_t key_find(const alerts_limit *l, const alerts_transition *t)
{
    if (!l->kcap)
        return SIZE_MAX;
    size_t mask = l->kcap - 1;
    for (size_t i = key_hash(t->run_id, t->layer, t->head, (int32_t)t->rule) & mask;;
         i = (i + 1) & mask) {
        if (l->keys[i].run_id == 0)
            return SIZE_MAX;
        if (key_is(&l->keys[i], t))
            return i;
    }
}

static void key_put_raw(lim_key *keys, size_t cap, const lim_key *k)
{
    size_t mask = cap - 1;
    size_t i = key_hash(k->run_id, k->layer, k->head, k->rule) & mask;
    while (keys[i].run_id > 0)
        i = (i + 1) & mask;
    keys[i] = *k;
}

/* The set rebuilt with room for `want` keys at most half full, deleted slots gone. -1 on no
 * memory. */
static int key_rebuild(alerts_limit *l, size_t want)
{
    size_t cap = 64;
    while (cap < want * 2)
        cap *= 2;
    lim_key *nk = calloc(cap, sizeof *nk);
    if (!nk)
        return -1;
    for (size_t i = 0; i < l->kcap; i++)
        if (l->keys[i].run_id > 0)
            key_put_raw(nk, cap, &l->keys[i]);
    free(l->keys);
    l->keys = nk;
    l->kcap = cap;
    l->kused = l->klive;
    return 0;
}

static int key_add(alerts_limit *l, const alerts_transition *t)
{
    if (key_find(l, t) != SIZE_MAX)
        return 0;
    if ((l->kused + 1) * 2 > l->kcap && key_rebuild(l, (l->klive + 1) * 2) != 0)
        return -1;
    lim_key k = {t->run_id, t->layer, t->head, (int32_t)t->rule};
    size_t mask = l->kcap - 1;
    size_t i = key_hash(k.run_id, k.layer, k.head, k.rule) & mask;
    while (l->keys[i].run_id > 0)
        i = (i + 1) & mask;
    if (l->keys[i].run_id == 0)
        l->kused++; /* an empty slot taken; a deleted one was counted already */
    l->keys[i] = k;
    l->klive++;
    return 0;
}

/* ---- verdicts ------------------------------------------------------------------------------- */

static alerts_limit_verdict suppress(alerts_limit *l, lim_run *r, int64_t now_ms)
{
    int first = r->pending == 0;
    if (first)
        r->first_ms = now_ms;
    r->pending++;
    r->last_ms = now_ms;
    r->total++;
    l->total++;
    return first ? ALERTS_LIMIT_FIRST : ALERTS_LIMIT_SUPPRESSED;
}

alerts_limit_verdict alerts_limit_admit(alerts_limit *l, const alerts_transition *t,
                                        int64_t now_ms)
{
    if (t->state != ALERTS_RAISED) { /* an end follows its raise */
        size_t i = key_find(l, t);
        if (i == SIZE_MAX)
            return ALERTS_LIMIT_PASS;
        l->keys[i].run_id = -1;
        l->klive--;
        lim_run *r = run_of(l, t->run_id, now_ms);
        return r ? suppress(l, r, now_ms) : ALERTS_LIMIT_SUPPRESSED;
    }
    lim_run *r = run_of(l, t->run_id, now_ms);
    if (!r)
        return ALERTS_LIMIT_PASS;
    refill(l, r, now_ms);
    if (r->tokens >= 1) {
        r->tokens -= 1;
        return ALERTS_LIMIT_PASS;
    }
    if (key_add(l, t) != 0)
        return ALERTS_LIMIT_PASS; /* no memory to follow it: it goes on rather than half of it */
    return suppress(l, r, now_ms);
}

/* ---- summaries ------------------------------------------------------------------------------ */

static void summarise(lim_run *r, int ended, void (*fn)(void *, const alerts_limit_summary *),
                      void *ctx)
{
    alerts_limit_summary s = {r->run_id, r->pending, r->first_ms, r->last_ms, ended};
    r->pending = 0;
    if (fn)
        fn(ctx, &s);
}

size_t alerts_limit_summaries(alerts_limit *l, int64_t now_ms,
                              void (*fn)(void *ctx, const alerts_limit_summary *s), void *ctx)
{
    size_t n = 0;
    for (size_t i = 0; i < l->nruns; i++) {
        lim_run *r = &l->runs[i];
        if (!r->pending)
            continue;
        int over = now_ms - r->last_ms >= ALERTS_LIMIT_QUIET_MS;
        if (over || now_ms - r->first_ms >= ALERTS_LIMIT_REPORT_MS) {
            summarise(r, over, fn, ctx);
            n++;
        }
    }
    return n;
}

void alerts_limit_end_run(alerts_limit *l, int64_t run_id,
                          void (*fn)(void *ctx, const alerts_limit_summary *s), void *ctx)
{
    lim_run *r = run_find(l, run_id);
    if (r) {
        if (r->pending)
            summarise(r, 1, fn, ctx);
        *r = l->runs[--l->nruns];
        l->last = 0;
    }
    int any = 0;
    for (size_t i = 0; i < l->kcap; i++)
        if (l->keys[i].run_id == run_id) {
            l->keys[i].run_id = -1;
            l->klive--;
            any = 1;
        }
    if (any && l->klive == 0) { /* every slot empty again */
        memset(l->keys, 0, l->kcap * sizeof *l->keys);
        l->kused = 0;
    }
}

uint64_t alerts_limit_suppressed(const alerts_limit *l, int64_t run_id)
{
    if (run_id == 0)
        return l->total;
    for (size_t i = 0; i < l->nruns; i++)
        if (l->runs[i].run_id == run_id)
            return l->runs[i].total;
    return 0;
}

size_t alerts_limit_pending(const alerts_limit *l)
{
    return l->klive;
}
