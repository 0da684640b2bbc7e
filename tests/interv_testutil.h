/* interv_testutil.h — interventions (store.h, store_intervention) for the store's test suites
 * (test_store_interv.c, test_store_migrate.c, test_store_v4.c): a random one owning its arrays,
 * a collector for store_interventions() that copies what it reads, and an exact comparison (every
 * double bit for bit). Header-only; include after store_testutil.h (its generator).
 */
#ifndef ATTNSTAT_INTERV_TESTUTIL_H
#define ATTNSTAT_INTERV_TESTUTIL_H

#include "store_testutil.h"

#define IV_HEADS_TEST 64 /* heads of a random intervention at most (the store takes 4096) */

/* One intervention with its own copies of kind, heads, values and detail. A copy that was moved
 * (realloc, qsort) has iv's pointers stale: iv_fix() points them again; iv_assert_same() reads
 * the fields and takes iv's pointers as flags only. */
typedef struct {
    store_intervention iv;   /* its pointers point into the fields below */
    char kind[STORE_INTERVENTION_KIND_MAX + 1];
    int32_t heads[STORE_INTERVENTION_HEADS_MAX];
    double values[STORE_INTERVENTION_HEADS_MAX];
    char detail[STORE_INTERVENTION_DETAIL_MAX + 1];
} iv_copy;

/* Points c->iv's pointers at c's fields. */
static inline void iv_fix(iv_copy *c, int has_values, int has_detail)
{
    c->iv.kind = c->kind;
    c->iv.heads = c->heads;
    c->iv.values = has_values ? c->values : NULL;
    c->iv.detail = has_detail ? c->detail : NULL;
}

/* A random intervention of run_id / rank: a kind of 1..32 allowed characters, a step, a layer or
 * none, 0..IV_HEADS_TEST distinct heads (random numbers up to 2^24) with values (any finite
 * double, qk_clip's (0, 1] factors most of the time) or none, threshold and measured or none, a
 * detail or none, a time. */
static inline void iv_random(iv_copy *c, int64_t run_id, int32_t rank)
{
    static const char chars[] = "abcdefghijklmnopqrstuvwxyz0123456789_.-";
    memset(c, 0, sizeof *c);
    if (rnd() % 2) {
        snprintf(c->kind, sizeof c->kind, "qk_clip");
    } else {
        int n = (int)rnd_range(1, STORE_INTERVENTION_KIND_MAX);
        for (int i = 0; i < n; i++)
            c->kind[i] = chars[rnd() % (sizeof chars - 1)];
    }
    c->iv.run_id = run_id;
    c->iv.rank = rank;
    c->iv.step = rnd_range(0, (int64_t)1 << 40);
    c->iv.time_ms = rnd_range(1, (int64_t)1 << 42);
    c->iv.layer = rnd() % 4 ? (int32_t)rnd_range(0, 1 << 20) : -1;
    c->iv.nheads = (int32_t)rnd_range(0, IV_HEADS_TEST);
    int has_values = rnd() % 4 != 0, wild = rnd() % 4 == 0;
    for (int32_t i = 0; i < c->iv.nheads; i++) {
        c->heads[i] = (int32_t)rnd_range(0, 1 << 24);
        if (wild) { /* any finite double: every exponent, sign, subnormals */
            double v;
            do {
                uint64_t b = rnd();
                memcpy(&v, &b, sizeof v);
            } while (!isfinite(v));
            c->values[i] = v;
        } else {
            c->values[i] = 1.0 - rnd_unit(); /* (0, 1] */
        }
    }
    c->iv.threshold = rnd() % 3 ? 10.0 + 190.0 * rnd_unit() : NAN;
    c->iv.measured = rnd() % 3 ? c->iv.threshold * (1.0 + rnd_unit()) - 1.0 : NAN;
    int has_detail = rnd() % 2;
    if (has_detail)
        snprintf(c->detail, sizeof c->detail, "{\"note\":\"r%016llx\",\"\\u00e9\":\"\xc3\xa9\"}",
                 (unsigned long long)rnd());
    iv_fix(c, has_values, has_detail);
}

/* What store_interventions() gave, copied. */
typedef struct {
    iv_copy *v;
    int n, cap;
} iv_list;

static inline int iv_collect(void *ctx, const store_intervention *iv)
{
    iv_list *l = ctx;
    if (l->n == l->cap) {
        l->cap = l->cap ? 2 * l->cap : 16;
        l->v = realloc(l->v, (size_t)l->cap * sizeof *l->v);
        ck_assert_ptr_nonnull(l->v);
    }
    iv_copy *c = &l->v[l->n++];
    memset(c, 0, sizeof *c);
    c->iv = *iv;
    ck_assert_ptr_nonnull(iv->kind);
    ck_assert_int_le(strlen(iv->kind), STORE_INTERVENTION_KIND_MAX);
    snprintf(c->kind, sizeof c->kind, "%s", iv->kind);
    ck_assert_int_ge(iv->nheads, 0);
    ck_assert_int_le(iv->nheads, STORE_INTERVENTION_HEADS_MAX);
    if (iv->nheads)
        memcpy(c->heads, iv->heads, (size_t)iv->nheads * sizeof *c->heads);
    if (iv->values && iv->nheads)
        memcpy(c->values, iv->values, (size_t)iv->nheads * sizeof *c->values);
    if (iv->detail) {
        ck_assert_int_le(strlen(iv->detail), STORE_INTERVENTION_DETAIL_MAX);
        snprintf(c->detail, sizeof c->detail, "%s", iv->detail);
    }
    iv_fix(c, iv->values != NULL, iv->detail != NULL);
    return 0;
}

/* Every field of got is want's (doubles bit for bit; got's id as read). */
static inline void iv_assert_same(const iv_copy *got, const iv_copy *want, const char *where)
{
    const store_intervention *g = &got->iv, *w = &want->iv;
    ck_assert_msg(g->run_id == w->run_id && g->rank == w->rank && g->step == w->step &&
                      g->time_ms == w->time_ms && g->layer == w->layer,
                  "%s: run %lld/%lld rank %d/%d step %lld/%lld time %lld/%lld layer %d/%d", where,
                  (long long)g->run_id, (long long)w->run_id, g->rank, w->rank,
                  (long long)g->step, (long long)w->step, (long long)g->time_ms,
                  (long long)w->time_ms, g->layer, w->layer);
    ck_assert_msg(!strcmp(got->kind, want->kind), "%s: kind '%s', want '%s'", where, got->kind,
                  want->kind);
    ck_assert_msg(g->nheads == w->nheads, "%s: %d heads, want %d", where, g->nheads, w->nheads);
    ck_assert_msg((g->values != NULL) == (w->values != NULL), "%s: values %s, want %s", where,
                  g->values ? "present" : "none", w->values ? "present" : "none");
    for (int32_t i = 0; i < w->nheads; i++) {
        ck_assert_msg(got->heads[i] == want->heads[i], "%s: heads[%d] %d, want %d", where, i,
                      got->heads[i], want->heads[i]);
        if (w->values)
            ck_assert_msg(same_double(got->values[i], want->values[i]), "%s: values[%d] %.17g, "
                          "want %.17g", where, i, got->values[i], want->values[i]);
    }
    ck_assert_msg(same_double(g->threshold, w->threshold) && same_double(g->measured, w->measured),
                  "%s: threshold %.17g/%.17g measured %.17g/%.17g", where, g->threshold,
                  w->threshold, g->measured, w->measured);
    ck_assert_msg((g->detail != NULL) == (w->detail != NULL), "%s: detail %s, want %s", where,
                  g->detail ? "present" : "none", w->detail ? "present" : "none");
    if (w->detail)
        ck_assert_str_eq(got->detail, want->detail);
}

#endif /* ATTNSTAT_INTERV_TESTUTIL_H */
