/* stats_testutil.h — shared by the kernel test suites: a seeded generator, dtype rounding written
 * independently of kernels/, tensors in either memory layout with their exact values kept as
 * doubles, and an independent two-pass computation of the statistics (all logits of a row first,
 * then the max, then p_j and -sum p_j ln p_j, the first visible key's p and sum_j p_j |pos - j|),
 * to check any backend against.
 * Header-only (static functions) so each suite includes it without a library. */
#ifndef ATTNSTAT_STATS_TESTUTIL_H
#define ATTNSTAT_STATS_TESTUTIL_H

#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "stats.h"

/* ---- random numbers: splitmix64, seeded fresh per run (ATTNSTAT_TEST_SEED to replay) ------ */

typedef struct {
    uint64_t s;
} tu_rng;

static inline uint64_t tu_next(tu_rng *r)
{
    uint64_t z = (r->s += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static inline double tu_uniform(tu_rng *r) /* (0, 1) */
{
    return ((double)(tu_next(r) >> 11) + 0.5) * (1.0 / 9007199254740992.0);
}

static inline double tu_gauss(tu_rng *r)
{
    double u = tu_uniform(r), v = tu_uniform(r);
    return sqrt(-2.0 * log(u)) * cos(6.283185307179586 * v);
}

static inline uint64_t tu_seed(void)
{
    const char *env = getenv("ATTNSTAT_TEST_SEED");
    uint64_t seed;
    if (env && *env) {
        seed = strtoull(env, NULL, 0);
    } else {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        seed = (uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 20) ^ ((uint64_t)getpid() << 40);
    }
    fprintf(stderr, "random seed: ATTNSTAT_TEST_SEED=%llu\n", (unsigned long long)seed);
    return seed;
}

/* ---- dtype rounding (round to nearest even), independent of kernels/ --------------------- */

static inline uint16_t tu_to_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffU) > 0x7f800000U)
        return (uint16_t)((u >> 16) | 0x40); /* quiet NaN */
    u += 0x7fffU + ((u >> 16) & 1U);
    return (uint16_t)(u >> 16);
}

static inline double tu_from_bf16(uint16_t b)
{
    uint32_t u = (uint32_t)b << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* f16 by way of frexp: exact for every value, including subnormals. */
static inline uint16_t tu_to_f16(float f)
{
    if (isnan(f))
        return 0x7e00;
    uint16_t sign = signbit(f) ? 0x8000 : 0;
    double a = fabs((double)f);
    if (isinf(f) || a >= 65520.0)
        return sign | 0x7c00;
    if (a < 0x1p-14) { /* subnormal: units of 2^-24 */
        double m = nearbyint(a * 0x1p24);
        return sign | (uint16_t)m;
    }
    int e;
    double fr = frexp(a, &e); /* a = fr * 2^e, fr in [0.5, 1) */
    double m = nearbyint(fr * 2048.0); /* 11 significant bits */
    if (m == 2048.0) {
        m = 1024.0;
        e++;
    }
    int biased = e - 1 + 15;
    if (biased >= 31)
        return sign | 0x7c00;
    return sign | (uint16_t)(biased << 10) | (uint16_t)((uint32_t)m - 1024U);
}

static inline double tu_from_f16(uint16_t h)
{
    int e = (h >> 10) & 0x1f, m = h & 0x3ff;
    double v;
    if (e == 0)
        v = ldexp((double)m, -24);
    else if (e == 31)
        v = m ? NAN : INFINITY;
    else
        v = ldexp((double)(m + 1024), e - 25);
    return (h & 0x8000) ? -v : v;
}

/* ---- tensors ------------------------------------------------------------------------------ */

typedef enum { TU_BHND = 0, TU_BNHD = 1, TU_PADDED = 2 } tu_layout;

typedef struct {
    int64_t b, h, n, d;
    stats_dtype dtype;
    void *mem;            /* the tensor as a backend sees it */
    int64_t elems;        /* allocated elements */
    int64_t sb, sh, sn;   /* element strides */
    double *val;          /* exact values after rounding, logical [b][h][n][d] */
} tu_tensor;

static inline double *tu_at(tu_tensor *t, int64_t b, int64_t h, int64_t n)
{
    return t->val + ((b * t->h + h) * t->n + n) * t->d;
}

/* Stores x (already a double) at [b,h,n,e], rounding to the dtype, and keeps the rounded value. */
static inline void tu_set(tu_tensor *t, int64_t b, int64_t h, int64_t n, int64_t e, double x)
{
    int64_t off = b * t->sb + h * t->sh + n * t->sn + e;
    double r;
    switch (t->dtype) {
    case STATS_F32: {
        float f = (float)x;
        ((float *)t->mem)[off] = f;
        r = f;
        break;
    }
    case STATS_F16: {
        uint16_t v = tu_to_f16((float)x);
        ((uint16_t *)t->mem)[off] = v;
        r = tu_from_f16(v);
        break;
    }
    default: {
        uint16_t v = tu_to_bf16((float)x);
        ((uint16_t *)t->mem)[off] = v;
        r = tu_from_bf16(v);
        break;
    }
    }
    tu_at(t, b, h, n)[e] = r;
}

static inline void tu_alloc(tu_tensor *t, int64_t b, int64_t h, int64_t n, int64_t d,
                            stats_dtype dt, tu_layout layout)
{
    memset(t, 0, sizeof *t);
    t->b = b, t->h = h, t->n = n, t->d = d, t->dtype = dt;
    switch (layout) {
    case TU_BHND:
        t->sn = d, t->sh = n * d, t->sb = h * n * d;
        break;
    case TU_BNHD:
        t->sh = d, t->sn = h * d, t->sb = n * h * d;
        break;
    case TU_PADDED: /* rows padded by 8 elements, heads by one extra row: nothing contiguous */
        t->sn = d + 8, t->sh = (n + 1) * (d + 8), t->sb = h * (n + 1) * (d + 8) + 3;
        break;
    }
    t->elems = stats_tensor_extent(b, h, n, d, t->sb, t->sh, t->sn);
    t->mem = malloc((size_t)t->elems * stats_dtype_size(dt));
    t->val = malloc(sizeof(double) * (size_t)(b * h * n * d));
    /* poison the gaps: a backend that reads them gets NaN */
    if (dt == STATS_F32) {
        for (int64_t i = 0; i < t->elems; i++)
            ((float *)t->mem)[i] = NAN;
    } else {
        for (int64_t i = 0; i < t->elems; i++)
            ((uint16_t *)t->mem)[i] = dt == STATS_F16 ? 0x7e00 : 0x7fc0;
    }
}

static inline void tu_fill_gauss(tu_tensor *t, tu_rng *r, double amp)
{
    for (int64_t b = 0; b < t->b; b++)
        for (int64_t h = 0; h < t->h; h++)
            for (int64_t n = 0; n < t->n; n++)
                for (int64_t e = 0; e < t->d; e++)
                    tu_set(t, b, h, n, e, amp * tu_gauss(r));
}

static inline void tu_free(tu_tensor *t)
{
    free(t->mem);
    free(t->val);
    memset(t, 0, sizeof *t);
}

static inline stats_tensor tu_view(const tu_tensor *t)
{
    stats_tensor v = {t->mem, t->sb, t->sh, t->sn};
    return v;
}

/* ---- masks --------------------------------------------------------------------------------- */

/* A mask [mb, mh, nq, nk] (mb in {1, B}, mh in {1, Hq}: broadcast with stride 0 when 1) as a
 * backend sees it (mem, element strides, the key dimension contiguous) and as the reference reads
 * it (take: whether key j takes part; bias: the value added to its logit). */
typedef struct {
    int64_t mb, mh, nq, nk;
    stats_dtype dtype;
    void *mem;
    int64_t sb, sh, sn;
    unsigned char *take;
    double *bias;
} tu_mask;

static inline int64_t tu_mask_index(const tu_mask *m, int64_t b, int64_t h, int64_t i, int64_t j)
{
    return (((m->mb == 1 ? 0 : b) * m->mh + (m->mh == 1 ? 0 : h)) * m->nq + i) * m->nk + j;
}

static inline void tu_mask_alloc(tu_mask *m, int64_t mb, int64_t mh, int64_t nq, int64_t nk,
                                 stats_dtype dt)
{
    memset(m, 0, sizeof *m);
    m->mb = mb, m->mh = mh, m->nq = nq, m->nk = nk, m->dtype = dt;
    m->sn = nk, m->sh = mh == 1 ? 0 : nq * nk, m->sb = mb == 1 ? 0 : mh * nq * nk;
    int64_t n = mb * mh * nq * nk;
    m->mem = calloc((size_t)n, stats_dtype_size(dt));
    m->take = calloc((size_t)n, 1);
    m->bias = calloc((size_t)n, sizeof(double));
}

/* Sets element [b, h, i, j]: take or not, and for an additive mask the bias of a key that takes
 * part (a key that does not is written as -inf, or as the dtype's lowest value when lowest). */
static inline void tu_mask_set(tu_mask *m, int64_t b, int64_t h, int64_t i, int64_t j, int take,
                               double bias, int lowest)
{
    int64_t x = tu_mask_index(m, b, h, i, j);
    int64_t off = b * m->sb + h * m->sh + i * m->sn + j;
    m->take[x] = (unsigned char)(take != 0);
    switch (m->dtype) {
    case STATS_BOOL:
        ((unsigned char *)m->mem)[off] = take ? (unsigned char)(1 + (j % 3)) : 0; /* any nonzero */
        m->bias[x] = 0.0;
        break;
    case STATS_F32: {
        float v = take ? (float)bias : (lowest ? -FLT_MAX : -INFINITY);
        ((float *)m->mem)[off] = v;
        m->bias[x] = take ? v : 0.0;
        break;
    }
    default: {
        int f16 = m->dtype == STATS_F16;
        uint16_t v = take ? (f16 ? tu_to_f16((float)bias) : tu_to_bf16((float)bias))
                          : (uint16_t)(lowest ? (f16 ? 0xfbff : 0xff7f) : (f16 ? 0xfc00 : 0xff80));
        ((uint16_t *)m->mem)[off] = v;
        m->bias[x] = take ? (f16 ? tu_from_f16(v) : tu_from_bf16(v)) : 0.0;
        break;
    }
    }
}

static inline void tu_mask_free(tu_mask *m)
{
    free(m->mem);
    free(m->take);
    free(m->bias);
    memset(m, 0, sizeof *m);
}

/* A value of q or k as the logits see it under compute_dtype (rounded from float32). */
static inline double tu_compute(double v, stats_dtype in, stats_dtype compute)
{
    if (compute == STATS_BF16 && in != STATS_BF16)
        return tu_from_bf16(tu_to_bf16((float)v));
    if (compute == STATS_F16 && in != STATS_F16)
        return tu_from_f16(tu_to_f16((float)v));
    return v;
}

/* ---- the independent two-pass computation --------------------------------------------------- */

typedef struct {
    double entropy, max_logit;
    double sink_mass, distance; /* p of the first visible key; sum_j p_j |i + o - j| */
    int64_t visible;  /* outcomes of the distribution: visible keys, plus one for a sink */
    int state; /* 0 not computed, 1 counted, 2 non-finite, 3 empty */
} tu_row;

typedef struct {
    int64_t rows, rows_norm, rows_empty, nonfinite;
    double mean, std, min, max, norm_mean, collapsed_frac, max_logit;
    double sink_mass, distance; /* means over counted rows; NaN when none */
} tu_head;

/* Fills rows ([phys_b, Hq, Nq] like the backends' per-row outputs) and heads ([Hq]) for problem p,
 * whose tensors' exact values are q and k, whose mask (may be NULL) is mask, and whose attention
 * sinks (may be NULL: none) are sinks[Hq], exact values (-inf: that head has none). A sink is one
 * more outcome of every row that sees a key: its logit joins the keys' in the softmax as it is
 * (stats.h). Each row: all its outcomes' logits, their max, ln of their sum of exponentials
 * (log1p of the outcomes other than the max: exact where one outcome dominates), then
 * -sum p ln p with ln p = s - max - ln sum; sink mass is p of the lowest visible key (the
 * first outcome kept: keys are visited in order), distance sum_j p_j |i + o - j| over the keys
 * (o = Lk - Lq, the causal alignment; the sink has no position). */
static inline void tu_reference_sinks(const stats_problem *p, tu_tensor *q, tu_tensor *k,
                                      const tu_mask *mask, const double *sinks, tu_row *rows,
                                      tu_head *heads)
{
    int packed = p->cu_seqlens_q != NULL;
    int64_t phys_b = packed ? 1 : p->batch, nq = p->len_q;
    int group = p->heads_q / p->heads_kv;
    double scale = p->scale > 0 ? p->scale : 1.0 / sqrt((double)p->head_dim);
    double collapse = p->collapse_threshold > 0 ? p->collapse_threshold : STATS_DEFAULT_COLLAPSE;
    memset(rows, 0, sizeof(tu_row) * (size_t)(phys_b * p->heads_q * nq));
    double *s = malloc(sizeof(double) * (size_t)(p->len_k + 1));
    int64_t *pos = malloc(sizeof(int64_t) * (size_t)(p->len_k + 1));
    for (int h = 0; h < p->heads_q; h++) {
        const double sink = sinks ? sinks[h] : -INFINITY;
        for (int b = 0; b < p->batch; b++) {
            int64_t q0 = packed ? p->cu_seqlens_q[b] : 0, k0 = packed ? p->cu_seqlens_k[b] : 0;
            int64_t lq = packed ? p->cu_seqlens_q[b + 1] - q0 : p->len_q;
            int64_t lk = packed ? p->cu_seqlens_k[b + 1] - k0 : p->len_k;
            int64_t tb = packed ? 0 : b, o = lk - lq;
            for (int64_t i = 0; i < lq; i++) {
                int take;
                if (p->sample_rows > 0) {
                    take = 0;
                    int64_t ns = p->sample_rows < lq ? p->sample_rows : lq;
                    for (int64_t j = 0; j < ns && !take; j++)
                        take = stats_row_of_sample((uint32_t)j, (uint32_t)lq, 0, p->sample_rows,
                                                   p->sample_seed) == (uint32_t)i;
                } else {
                    take = p->sample_every > 1 ? i % p->sample_every == 0 : 1;
                }
                if (!take)
                    continue;
                tu_row *r = &rows[(tb * p->heads_q + h) * nq + q0 + i];
                const double *qr = tu_at(q, tb, h, q0 + i);
                int64_t nv = 0;
                int finite = 1;
                double raw = -INFINITY; /* the max logit: without the mask's bias */
                for (int64_t j = 0; j < lk; j++) {
                    int vis = (!p->causal || j <= i + o) &&
                              (p->window_left < 0 || j >= i + o - p->window_left) &&
                              (p->window_right < 0 || j <= i + o + p->window_right);
                    double bias = 0;
                    if (vis && mask) {
                        int64_t x = tu_mask_index(mask, b, h, i, j);
                        vis = mask->take[x];
                        bias = mask->bias[x];
                    }
                    if (!vis)
                        continue;
                    const double *kr = tu_at(k, tb, h / group, k0 + j);
                    double dot = 0;
                    for (int e = 0; e < p->head_dim; e++)
                        dot += tu_compute(qr[e], q->dtype, p->compute_dtype) *
                               tu_compute(kr[e], k->dtype, p->compute_dtype);
                    double x = scale * dot;
                    if (p->softcap > 0)
                        x = p->softcap * tanh(x / p->softcap);
                    if (!isfinite(x))
                        finite = 0;
                    raw = x > raw ? x : raw;
                    pos[nv] = j;
                    s[nv++] = x + bias;
                }
                if (nv == 0) {
                    r->visible = 0;
                    r->state = 3; /* empty */
                    continue;
                }
                if (sink != -INFINITY) { /* the sink: one more outcome */
                    if (isnan(sink) || sink == INFINITY)
                        finite = 0;
                    s[nv++] = sink;
                }
                const int64_t nkeys = sink != -INFINITY ? nv - 1 : nv;
                r->visible = nv;
                if (!finite) {
                    r->state = 2;
                    continue;
                }
                int64_t top = 0;
                for (int64_t j = 1; j < nv; j++)
                    top = s[j] > s[top] ? j : top;
                double m = s[top], rest = 0;
                for (int64_t j = 0; j < nv; j++)
                    if (j != top)
                        rest += exp(s[j] - m);
                const double lnl = log1p(rest); /* ln sum_j exp(s_j - m) */
                double ent = 0, dist = 0;
                for (int64_t j = 0; j < nv; j++) {
                    double lp = s[j] - m - lnl, pj = exp(lp);
                    if (pj > 0)
                        ent -= pj * lp;
                    if (j < nkeys)
                        dist += pj * (double)llabs(i + o - pos[j]);
                }
                r->sink_mass = exp(s[0] - m - lnl);
                r->distance = dist;
                r->entropy = ent > 0 ? ent : 0;
                r->max_logit = raw;
                r->state = 1;
            }
        }
        /* two-pass per-head aggregates */
        tu_head *hd = &heads[h];
        memset(hd, 0, sizeof *hd);
        hd->min = INFINITY, hd->max = -INFINITY, hd->max_logit = -INFINITY;
        double sum = 0, sumn = 0, sumsink = 0, sumdist = 0;
        int64_t collapsed = 0;
        for (int64_t b = 0; b < phys_b; b++)
            for (int64_t i = 0; i < nq; i++) {
                tu_row *r = &rows[(b * p->heads_q + h) * nq + i];
                if (r->state == 3)
                    hd->rows_empty++;
                if (r->state == 2)
                    hd->nonfinite++;
                if (r->state != 1)
                    continue;
                hd->rows++;
                sum += r->entropy;
                sumsink += r->sink_mass;
                sumdist += r->distance;
                hd->min = fmin(hd->min, r->entropy);
                hd->max = fmax(hd->max, r->entropy);
                hd->max_logit = fmax(hd->max_logit, r->max_logit);
                if (r->visible >= 2) {
                    double hn = r->entropy / log((double)r->visible);
                    hd->rows_norm++;
                    sumn += hn;
                    collapsed += hn < collapse;
                }
            }
        hd->mean = hd->rows ? sum / (double)hd->rows : NAN;
        hd->sink_mass = hd->rows ? sumsink / (double)hd->rows : NAN;
        hd->distance = hd->rows ? sumdist / (double)hd->rows : NAN;
        double ss = 0;
        for (int64_t b = 0; b < phys_b; b++)
            for (int64_t i = 0; i < nq; i++) {
                tu_row *r = &rows[(b * p->heads_q + h) * nq + i];
                if (r->state == 1)
                    ss += (r->entropy - hd->mean) * (r->entropy - hd->mean);
            }
        hd->std = hd->rows ? sqrt(ss / (double)hd->rows) : NAN;
        hd->norm_mean = hd->rows_norm ? sumn / (double)hd->rows_norm : NAN;
        hd->collapsed_frac = hd->rows_norm ? (double)collapsed / (double)hd->rows_norm : 0;
        if (!hd->rows)
            hd->min = hd->max = NAN;
    }
    free(s);
    free(pos);
}

static inline void tu_reference_masked(const stats_problem *p, tu_tensor *q, tu_tensor *k,
                                       const tu_mask *mask, tu_row *rows, tu_head *heads)
{
    tu_reference_sinks(p, q, k, mask, NULL, rows, heads);
}

static inline void tu_reference(const stats_problem *p, tu_tensor *q, tu_tensor *k, tu_row *rows,
                                tu_head *heads)
{
    tu_reference_masked(p, q, k, NULL, rows, heads);
}

/* |got - want| <= atol + rtol * |want|, NaN only matching NaN. */
static inline int tu_close(double got, double want, double atol, double rtol)
{
    if (isnan(want) || isnan(got))
        return isnan(want) && isnan(got);
    if (isinf(want) || isinf(got))
        return got == want;
    return fabs(got - want) <= atol + rtol * fabs(want);
}

#endif /* ATTNSTAT_STATS_TESTUTIL_H */
