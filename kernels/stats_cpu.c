/* stats_cpu.c — the CPU reference backend: plain C, double accumulation, written for clarity.
 * Every other backend is tested against this file, and hosts without a GPU compute with it.
 *
 * Per row, one pass over the visible keys in tiles of TILE keys, with the shifted accumulators
 * of DESIGN.md ("The math"): t = s - m <= 0,  l = sum exp(t),  w = sum exp(t) * t,
 * H = log(l) - w / l. When a tile raises the running max by d = m_old - m_new < 0:
 *     l <- a * l,   w <- a * (w + d * l_old),   a = exp(d)
 * guarded on the first tile, where m = -inf and l = 0 (d * l would be -inf * 0 = NaN). */
#include "stats.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { TILE = 64 };

/* ---- dtype conversion ------------------------------------------------------------------- */

static float f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h >> 15) << 31, exp = (h >> 10) & 0x1f, man = h & 0x3ff, bits;
    if (exp == 0) {
        if (man == 0) {
            bits = sign;
        } else { /* subnormal: normalise */
            int e = -1;
            do {
                e++;
                man <<= 1;
            } while ((man & 0x400) == 0);
            bits = sign | ((uint32_t)(127 - 15 - e) << 23) | ((man & 0x3ff) << 13);
        }
    } else if (exp == 0x1f) {
        bits = sign | 0x7f800000U | (man << 13); /* Inf or NaN */
    } else {
        bits = sign | ((exp + 127 - 15) << 23) | (man << 13);
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

static float bf16_to_f32(uint16_t b)
{
    uint32_t bits = (uint32_t)b << 16;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

/* Reads n contiguous elements of dtype dt at src into dst as doubles. */
static void load_row(double *dst, const void *src, int n, stats_dtype dt)
{
    switch (dt) {
    case STATS_F32: {
        const float *s = src;
        for (int i = 0; i < n; i++)
            dst[i] = s[i];
        break;
    }
    case STATS_F16: {
        const uint16_t *s = src;
        for (int i = 0; i < n; i++)
            dst[i] = f16_to_f32(s[i]);
        break;
    }
    case STATS_BF16: {
        const uint16_t *s = src;
        for (int i = 0; i < n; i++)
            dst[i] = bf16_to_f32(s[i]);
        break;
    }
    }
}

static const void *elem(const stats_tensor *t, stats_dtype dt, int64_t b, int64_t h, int64_t n)
{
    int64_t off = b * t->stride_b + h * t->stride_h + n * t->stride_n;
    return (const char *)t->ptr + off * (int64_t)stats_dtype_size(dt);
}

/* ---- one row ---------------------------------------------------------------------------- */

/* q . k in double. Eight independent partial sums keep the FPU busy (a single running sum is
 * one long dependency chain); the order is fixed, so results are reproducible. */
static double dot(const double *q, const double *k, int d)
{
    double acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int e = 0;
    for (; e + 8 <= d; e += 8)
        for (int u = 0; u < 8; u++)
            acc[u] += q[e + u] * k[e + u];
    for (; e < d; e++)
        acc[e & 7] += q[e] * k[e];
    return ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
}

typedef struct {
    double entropy, max_logit;
    int64_t visible;
    int finite;
} row_result;

static void row_stats(const double *q, const double *k, int64_t lo, int64_t hi, int d,
                      double scale, double softcap, row_result *out)
{
    double m = -INFINITY, l = 0.0, w = 0.0;
    double s[TILE];
    int finite = 1;
    for (int64_t j0 = lo; j0 <= hi; j0 += TILE) {
        int nt = (int)(hi - j0 + 1 < TILE ? hi - j0 + 1 : TILE);
        double tmax = -INFINITY;
        for (int t = 0; t < nt; t++) {
            double x = scale * dot(q, k + (j0 + t) * d, d);
            if (softcap > 0.0)
                x = softcap * tanh(x / softcap);
            if (!isfinite(x))
                finite = 0;
            s[t] = x;
            if (x > tmax)
                tmax = x;
        }
        if (!finite)
            break; /* the row is excluded; nothing more to learn from it */
        if (tmax > m) {
            if (l > 0.0) {
                double dlt = m - tmax, a = exp(dlt);
                w = a * (w + dlt * l);
                l = a * l;
            }
            m = tmax;
        }
        for (int t = 0; t < nt; t++) {
            double tt = s[t] - m, e = exp(tt);
            l += e;
            w += e * tt;
        }
    }
    out->visible = hi - lo + 1;
    out->finite = finite;
    if (!finite) {
        out->entropy = NAN;
        out->max_logit = NAN;
        return;
    }
    double h = log(l) - w / l;
    out->entropy = h > 0.0 ? h : 0.0;
    out->max_logit = m;
}

/* ---- per-head accumulation ---------------------------------------------------------------- */

typedef struct {
    int64_t rows, rows_norm, rows_empty, nonfinite, collapsed;
    double sum, sumsq, min, max, sum_norm, max_logit;
} head_acc;

static void acc_init(head_acc *a)
{
    memset(a, 0, sizeof *a);
    a->min = INFINITY;
    a->max = -INFINITY;
    a->max_logit = -INFINITY;
}

static void acc_row(head_acc *a, const row_result *r, double collapse)
{
    if (!r->finite) {
        a->nonfinite++;
        return;
    }
    a->rows++;
    a->sum += r->entropy;
    a->sumsq += r->entropy * r->entropy;
    if (r->entropy < a->min)
        a->min = r->entropy;
    if (r->entropy > a->max)
        a->max = r->entropy;
    if (r->max_logit > a->max_logit)
        a->max_logit = r->max_logit;
    if (r->visible >= 2) {
        double hn = r->entropy / log((double)r->visible);
        a->rows_norm++;
        a->sum_norm += hn;
        if (hn < collapse)
            a->collapsed++;
    }
}

static void acc_finish(const head_acc *a, int sampled, stats_head *out)
{
    memset(out, 0, sizeof *out);
    out->rows = a->rows;
    out->rows_norm = a->rows_norm;
    out->rows_empty = a->rows_empty;
    out->nonfinite_rows = a->nonfinite;
    out->sampled = sampled;
    out->max_logit = a->max_logit;
    if (a->rows > 0) {
        double n = (double)a->rows, mean = a->sum / n, var = a->sumsq / n - mean * mean;
        out->entropy_mean = mean;
        out->entropy_std = sqrt(var > 0.0 ? var : 0.0);
        out->entropy_min = a->min;
        out->entropy_max = a->max;
    } else {
        out->entropy_mean = out->entropy_std = out->entropy_min = out->entropy_max = NAN;
    }
    if (a->rows_norm > 0) {
        out->entropy_norm_mean = a->sum_norm / (double)a->rows_norm;
        out->collapsed_frac = (double)a->collapsed / (double)a->rows_norm;
    } else {
        out->entropy_norm_mean = NAN;
        out->collapsed_frac = 0.0;
    }
}

/* ---- the whole problem -------------------------------------------------------------------- */

stats_status stats_cpu(const stats_problem *p, stats_head *heads, float *row_entropy,
                       float *row_maxlogit, stats_error *err)
{
    stats_status st = stats_validate(p, err);
    if (st != STATS_OK)
        return st;
    if (!heads) {
        if (err)
            snprintf(err->msg, sizeof err->msg, "heads output is NULL");
        return STATS_EINVAL;
    }
    int packed = p->cu_seqlens_q != NULL;
    if (packed) {
        st = stats_validate_seqlens(p->cu_seqlens_q, p->batch, p->len_q, "cu_seqlens_q", err);
        if (st == STATS_OK)
            st = stats_validate_seqlens(p->cu_seqlens_k, p->batch, p->len_k, "cu_seqlens_k", err);
        if (st != STATS_OK)
            return st;
    }

    const int d = p->head_dim, group = p->heads_q / p->heads_kv;
    const double scale = p->scale > 0.0f ? (double)p->scale : 1.0 / sqrt((double)d);
    const double softcap = p->softcap;
    const double collapse = p->collapse_threshold > 0.0f ? p->collapse_threshold
                                                         : STATS_DEFAULT_COLLAPSE;
    const int sampled = p->sample_every > 1 || p->sample_rows > 0;
    const int64_t phys_b = packed ? 1 : p->batch;

    int64_t max_lk = 0;
    for (int32_t b = 0; b < p->batch; b++) {
        int64_t lk = packed ? p->cu_seqlens_k[b + 1] - p->cu_seqlens_k[b] : p->len_k;
        if (lk > max_lk)
            max_lk = lk;
    }
    double *kbuf = malloc(sizeof(double) * (size_t)(max_lk > 0 ? max_lk : 1) * (size_t)d);
    double *qbuf = malloc(sizeof(double) * (size_t)d);
    head_acc *acc = malloc(sizeof(head_acc) * (size_t)p->heads_q);
    if (!kbuf || !qbuf || !acc) {
        free(kbuf);
        free(qbuf);
        free(acc);
        if (err)
            snprintf(err->msg, sizeof err->msg, "out of memory for a %lld x %d key buffer",
                     (long long)max_lk, d);
        return STATS_ENOMEM;
    }
    for (int h = 0; h < p->heads_q; h++)
        acc_init(&acc[h]);

    if (row_entropy || row_maxlogit) {
        int64_t nrows = phys_b * p->heads_q * (int64_t)p->len_q;
        for (int64_t r = 0; r < nrows; r++) {
            if (row_entropy)
                row_entropy[r] = STATS_ROW_SKIPPED;
            if (row_maxlogit)
                row_maxlogit[r] = -INFINITY;
        }
    }

    for (int32_t b = 0; b < p->batch; b++) {
        int64_t q0 = packed ? p->cu_seqlens_q[b] : 0, k0 = packed ? p->cu_seqlens_k[b] : 0;
        int64_t lq = packed ? p->cu_seqlens_q[b + 1] - q0 : p->len_q;
        int64_t lk = packed ? p->cu_seqlens_k[b + 1] - k0 : p->len_k;
        int64_t tb = packed ? 0 : b, off = lk - lq; /* bottom-right alignment */
        int32_t nsamp = stats_sampled_count(p, (int32_t)lq);
        int loaded_kvh = -1;
        for (int h = 0; h < p->heads_q; h++) {
            int kvh = h / group;
            if (kvh != loaded_kvh) {
                for (int64_t j = 0; j < lk; j++)
                    load_row(kbuf + j * d, elem(&p->k, p->dtype, tb, kvh, k0 + j), d, p->dtype);
                loaded_kvh = kvh;
            }
            for (int32_t sj = 0; sj < nsamp; sj++) {
                int64_t i = stats_row_of_sample((uint32_t)sj, (uint32_t)lq, p->sample_every,
                                                p->sample_rows, p->sample_seed);
                int64_t lo = 0, hi = lk - 1;
                if (p->causal && i + off < hi)
                    hi = i + off;
                if (p->window_right >= 0 && i + off + p->window_right < hi)
                    hi = i + off + p->window_right;
                if (p->window_left >= 0 && i + off - p->window_left > lo)
                    lo = i + off - p->window_left;
                if (lo > hi) {
                    acc[h].rows_empty++;
                    continue;
                }
                load_row(qbuf, elem(&p->q, p->dtype, tb, h, q0 + i), d, p->dtype);
                row_result r;
                row_stats(qbuf, kbuf, lo, hi, d, scale, softcap, &r);
                acc_row(&acc[h], &r, collapse);
                int64_t ro = (tb * p->heads_q + h) * (int64_t)p->len_q + q0 + i;
                if (row_entropy)
                    row_entropy[ro] = (float)r.entropy;
                if (row_maxlogit)
                    row_maxlogit[ro] = (float)r.max_logit;
            }
        }
    }
    for (int h = 0; h < p->heads_q; h++)
        acc_finish(&acc[h], sampled, &heads[h]);
    free(kbuf);
    free(qbuf);
    free(acc);
    return STATS_OK;
}
