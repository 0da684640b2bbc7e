/* stats_runutil.h — the harness of the CPU reference suites (test_stats.c, test_stats_sinks.c): a
 * problem drawn from a shape (cfg) with its tensors, optional mask and sinks (run), and run_check,
 * which computes it with stats_cpu and with the independent two-pass computation of
 * stats_testutil.h and compares everything.
 *
 * Tolerances. Per-row outputs are floats: 2e-6 absolute + 2e-6 relative. Per-head statistics are
 * doubles from the same exact inputs by a different order of operations: 1e-9 absolute + 1e-9
 * relative. The collapsed fraction may differ by at most one row that sits on the threshold.
 * Header-only (static functions), for one test file each; its g_seed is set by main. */
#ifndef ATTNSTAT_STATS_RUNUTIL_H
#define ATTNSTAT_STATS_RUNUTIL_H

#include <check.h>

#include "stats_testutil.h"

static uint64_t g_seed;
static tu_rng g_rng;

/* Each test (and each iteration of a loop test) draws its own stream from the run's seed. */
static inline void reseed(int line, int i)
{
    g_rng.s = g_seed ^ ((uint64_t)line << 32) ^ (uint64_t)i * 0x9e3779b97f4a7c15ULL;
}

typedef struct {
    int b, hq, hkv, nq, nk, d;
    stats_dtype dt;
    tu_layout layout;
    int causal, wl, wr;
    float softcap, scale;
    int packed;               /* packed sequences with random lengths (b sequences) */
    int every, nsample;
    double amp;
    float collapse;
} cfg;

typedef struct {
    tu_tensor q, k;
    stats_problem p;
    int32_t cuq[16], cuk[16];
    stats_head *heads;
    float *rent, *rmax;
    tu_row *ref_rows;
    tu_head *ref_heads;
    int64_t nrows;
    tu_mask mask;             /* used when mask.mem is set (run_mask) */
    void *sinks_mem;          /* attention sinks as the backend reads them (run_sinks), or NULL */
    double *sinks_val;        /* their exact values, [Hq] */
} run;

/* cuq/cuk: explicit packed offsets (c->b + 1 entries), or NULL for random lengths */
static inline void run_setup_cu(run *r, const cfg *c, const int32_t *cuq, const int32_t *cuk)
{
    memset(r, 0, sizeof *r);
    stats_problem_init(&r->p);
    int64_t nq = c->nq, nk = c->nk, pb = c->b;
    if (c->packed && cuq) {
        memcpy(r->cuq, cuq, sizeof(int32_t) * (size_t)(c->b + 1));
        memcpy(r->cuk, cuk, sizeof(int32_t) * (size_t)(c->b + 1));
        nq = r->cuq[c->b], nk = r->cuk[c->b], pb = 1;
        r->p.cu_seqlens_q = r->cuq;
        r->p.cu_seqlens_k = r->cuk;
    } else if (c->packed) {
        r->cuq[0] = r->cuk[0] = 0;
        for (int s = 0; s < c->b; s++) {
            int lq = (int)(tu_next(&g_rng) % (uint64_t)(c->nq + 1)); /* may be 0: empty sequence */
            int lk = c->nk == c->nq ? lq : (int)(tu_next(&g_rng) % (uint64_t)(c->nk + 1));
            r->cuq[s + 1] = r->cuq[s] + lq;
            r->cuk[s + 1] = r->cuk[s] + lk;
        }
        if (r->cuq[c->b] == 0)
            r->cuq[c->b] = 1; /* at least one row overall (last sequence gets it) */
        if (r->cuk[c->b] == 0)
            r->cuk[c->b] = 1;
        nq = r->cuq[c->b], nk = r->cuk[c->b], pb = 1;
        r->p.cu_seqlens_q = r->cuq;
        r->p.cu_seqlens_k = r->cuk;
    }
    tu_alloc(&r->q, pb, c->hq, nq, c->d, c->dt, c->layout);
    tu_alloc(&r->k, pb, c->hkv, nk, c->d, c->dt, c->layout);
    double amp = c->amp > 0 ? c->amp : 1.0;
    tu_fill_gauss(&r->q, &g_rng, amp);
    tu_fill_gauss(&r->k, &g_rng, amp);
    r->p.batch = c->b, r->p.heads_q = c->hq, r->p.heads_kv = c->hkv;
    r->p.len_q = (int32_t)nq, r->p.len_k = (int32_t)nk, r->p.head_dim = c->d, r->p.dtype = c->dt;
    r->p.q = tu_view(&r->q), r->p.k = tu_view(&r->k);
    r->p.causal = c->causal, r->p.window_left = c->wl, r->p.window_right = c->wr;
    r->p.softcap = c->softcap, r->p.scale = c->scale;
    r->p.sample_every = c->every, r->p.sample_rows = c->nsample;
    r->p.sample_seed = tu_next(&g_rng);
    r->p.collapse_threshold = c->collapse;
    r->nrows = pb * c->hq * nq;
    r->heads = malloc(sizeof(stats_head) * (size_t)c->hq);
    r->rent = malloc(sizeof(float) * (size_t)r->nrows);
    r->rmax = malloc(sizeof(float) * (size_t)r->nrows);
    for (int64_t i = 0; i < r->nrows; i++)
        r->rent[i] = r->rmax[i] = 12345.0f; /* poison: every element must be written */
    r->ref_rows = malloc(sizeof(tu_row) * (size_t)r->nrows);
    r->ref_heads = malloc(sizeof(tu_head) * (size_t)c->hq);
}

static inline void run_setup(run *r, const cfg *c)
{
    run_setup_cu(r, c, NULL, NULL);
}

static inline void run_free(run *r)
{
    tu_free(&r->q);
    tu_free(&r->k);
    free(r->heads);
    free(r->rent);
    free(r->rmax);
    free(r->ref_rows);
    free(r->ref_heads);
    tu_mask_free(&r->mask);
    free(r->sinks_mem);
    free(r->sinks_val);
}

/* Computes with stats_cpu and the two-pass reference and compares everything. */
static inline void run_check(run *r, const char *what)
{
    stats_error err = {{0}};
    stats_status st = stats_cpu(&r->p, r->heads, r->rent, r->rmax, &err);
    ck_assert_msg(st == STATS_OK, "%s: stats_cpu failed: %s", what, err.msg);
    tu_reference_sinks(&r->p, &r->q, &r->k, r->mask.mem ? &r->mask : NULL, r->sinks_val,
                       r->ref_rows, r->ref_heads);
    for (int64_t i = 0; i < r->nrows; i++) {
        const tu_row *w = &r->ref_rows[i];
        if (w->state == 1) {
            ck_assert_msg(tu_close(r->rent[i], w->entropy, 2e-6, 2e-6),
                          "%s: row %lld entropy %.9g, reference %.9g", what, (long long)i,
                          (double)r->rent[i], w->entropy);
            ck_assert_msg(tu_close(r->rmax[i], w->max_logit, 2e-6, 2e-6),
                          "%s: row %lld max logit %.9g, reference %.9g", what, (long long)i,
                          (double)r->rmax[i], w->max_logit);
        } else if (w->state == 2) {
            ck_assert_msg(isnan(r->rent[i]) && isnan(r->rmax[i]),
                          "%s: non-finite row %lld must be NaN, got %g / %g", what, (long long)i,
                          (double)r->rent[i], (double)r->rmax[i]);
        } else {
            ck_assert_msg(r->rent[i] == STATS_ROW_SKIPPED && isinf(r->rmax[i]) && r->rmax[i] < 0,
                          "%s: row %lld was not computed but holds %g / %g", what, (long long)i,
                          (double)r->rent[i], (double)r->rmax[i]);
        }
    }
    for (int h = 0; h < r->p.heads_q; h++) {
        const stats_head *g = &r->heads[h];
        const tu_head *w = &r->ref_heads[h];
        ck_assert_msg(g->rows == w->rows && g->rows_norm == w->rows_norm &&
                          g->rows_empty == w->rows_empty && g->nonfinite_rows == w->nonfinite,
                      "%s: head %d counts rows=%lld/%lld norm=%lld/%lld empty=%lld/%lld nonfinite=%lld/%lld",
                      what, h, (long long)g->rows, (long long)w->rows, (long long)g->rows_norm,
                      (long long)w->rows_norm, (long long)g->rows_empty, (long long)w->rows_empty,
                      (long long)g->nonfinite_rows, (long long)w->nonfinite);
        ck_assert_msg(tu_close(g->entropy_mean, w->mean, 1e-9, 1e-9), "%s: head %d mean %.15g vs %.15g",
                      what, h, g->entropy_mean, w->mean);
        ck_assert_msg(tu_close(g->entropy_std, w->std, 1e-7, 1e-7), "%s: head %d std %.15g vs %.15g",
                      what, h, g->entropy_std, w->std);
        ck_assert_msg(tu_close(g->entropy_min, w->min, 1e-9, 1e-9), "%s: head %d min", what, h);
        ck_assert_msg(tu_close(g->entropy_max, w->max, 1e-9, 1e-9), "%s: head %d max", what, h);
        ck_assert_msg(tu_close(g->entropy_norm_mean, w->norm_mean, 1e-9, 1e-9),
                      "%s: head %d norm mean %.15g vs %.15g", what, h, g->entropy_norm_mean,
                      w->norm_mean);
        ck_assert_msg(tu_close(g->max_logit, w->max_logit, 1e-9, 1e-9),
                      "%s: head %d max logit %.15g vs %.15g", what, h, g->max_logit, w->max_logit);
        ck_assert_msg(tu_close(g->sink_mass, w->sink_mass, 1e-9, 0),
                      "%s: head %d sink mass %.15g vs %.15g", what, h, g->sink_mass, w->sink_mass);
        ck_assert_msg(tu_close(g->distance, w->distance, 1e-12, 1e-9),
                      "%s: head %d distance %.15g vs %.15g", what, h, g->distance, w->distance);
        double slack = w->rows_norm ? 1.0 / (double)w->rows_norm + 1e-12 : 1e-12;
        ck_assert_msg(fabs(g->collapsed_frac - w->collapsed_frac) <= slack,
                      "%s: head %d collapsed %.6f vs %.6f", what, h, g->collapsed_frac,
                      w->collapsed_frac);
        ck_assert_int_eq(g->sampled, r->p.sample_every > 1 || r->p.sample_rows > 0);
    }
}

/* Gives r a mask [mb, mh, Nq, Nk] of dtype dt: keys take part with probability keep_pct %, and
 * some rows see nothing; additive masks carry finite biases in [-bias, bias] on kept keys and
 * write excluded ones as -inf or as the dtype's lowest value, alternately. */
static inline void run_mask(run *r, int mb, int mh, stats_dtype dt, int keep_pct, double bias)
{
    const stats_problem *p = &r->p;
    tu_mask_alloc(&r->mask, mb, mh, p->len_q, p->len_k, dt);
    for (int b = 0; b < mb; b++)
        for (int h = 0; h < mh; h++)
            for (int i = 0; i < p->len_q; i++) {
                /* rows that see no key at all: the first of every (b, h) and a few at random */
                int none = i == 0 || tu_next(&g_rng) % 11 == 0;
                for (int j = 0; j < p->len_k; j++) {
                    int take = !none && (int)(tu_next(&g_rng) % 100) < keep_pct;
                    double v = bias > 0 ? bias * (2.0 * tu_uniform(&g_rng) - 1.0) : 0.0;
                    tu_mask_set(&r->mask, b, h, i, j, take, v, (int)((i + j) & 1));
                }
            }
    r->p.mask = (stats_tensor){r->mask.mem, r->mask.sb, r->mask.sh, r->mask.sn};
    r->p.mask_dtype = dt;
}

#endif /* ATTNSTAT_STATS_RUNUTIL_H */
