/* stats_cpu_common.h — the pieces both CPU backends share (kernels/stats_cpu.c, the reference, and
 * kernels/stats_cpu_fast.c): dtype conversion and rounding to the compute dtype, mask elements,
 * the visible key range of a row, attention sinks, per-row results and their per-head accumulation
 * in double.
 * Stage: kernels (private to kernels/; not installed); calls libc and libm only. Everything here is
 * static inline so each backend compiles it as its own code. */
#ifndef ATTNSTAT_STATS_CPU_COMMON_H
#define ATTNSTAT_STATS_CPU_COMMON_H

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "stats.h"

/* ---- dtype conversion ------------------------------------------------------------------- */

static inline float f16_to_f32(uint16_t h)
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

static inline float bf16_to_f32(uint16_t b)
{
    uint32_t bits = (uint32_t)b << 16;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

/* x rounded to the nearest bfloat16 (ties to even), as a float; NaN stays NaN. */
static inline float round_bf16(float x)
{
    uint32_t u;
    memcpy(&u, &x, 4);
    if ((u & 0x7fffffffU) > 0x7f800000U)
        return x;
    u += 0x7fffU + ((u >> 16) & 1U);
    u &= 0xffff0000U;
    memcpy(&x, &u, 4);
    return x;
}

/* x rounded to the nearest float16 value (ties to even), as a float: 11 significant bits, 2^-24
 * steps under 2^-14, +-inf from 65520 on. */
static inline float round_f16(float x)
{
    if (!isfinite(x))
        return x;
    double a = fabs((double)x), r;
    if (a >= 65520.0) {
        r = INFINITY;
    } else if (a < 0x1p-14) {
        r = nearbyint(a * 0x1p24) * 0x1p-24;
    } else {
        int e;
        double fr = frexp(a, &e); /* a = fr * 2^e, fr in [0.5, 1) */
        r = ldexp(nearbyint(fr * 2048.0), e - 11);
    }
    return (float)(x < 0 ? -r : r);
}

/* Element i of a contiguous run of dtype dt at src, as a float rounded to the precision of the
 * logits' inputs (compute). */
static inline float load_elem(const void *src, int i, stats_dtype dt, stats_dtype compute)
{
    float f;
    switch (dt) {
    case STATS_F16: f = f16_to_f32(((const uint16_t *)src)[i]); break;
    case STATS_BF16: f = bf16_to_f32(((const uint16_t *)src)[i]); break;
    default: f = ((const float *)src)[i]; break;
    }
    if (compute == STATS_BF16 && dt != STATS_BF16)
        f = round_bf16(f);
    else if (compute == STATS_F16 && dt != STATS_F16)
        f = round_f16(f);
    return f;
}

/* ---- masks and visibility --------------------------------------------------------------- */

/* One row of the mask: whether key j takes part and, for an additive mask, its bias. */
typedef struct {
    const char *row;    /* element [b, h, i, 0]; NULL: no mask */
    stats_dtype dtype;
} row_mask;

static inline int mask_take(const row_mask *mk, int64_t j, double *bias)
{
    *bias = 0.0;
    switch (mk->dtype) {
    case STATS_BOOL:
        return mk->row[j] != 0;
    case STATS_F32: {
        float v;
        memcpy(&v, mk->row + j * 4, 4);
        if (v == -INFINITY || v <= -FLT_MAX)
            return 0;
        *bias = v;
        return 1;
    }
    default: { /* 16-bit: the lowest finite value is 0xfbff (f16) or 0xff7f (bf16) */
        uint16_t u;
        memcpy(&u, mk->row + j * 2, 2);
        int f16 = mk->dtype == STATS_F16;
        if (u == (f16 ? 0xfc00 : 0xff80) || u == (f16 ? 0xfbff : 0xff7f))
            return 0;
        *bias = f16 ? f16_to_f32(u) : bf16_to_f32(u);
        return 1;
    }
    }
}

static inline const void *elem(const stats_tensor *t, stats_dtype dt, int64_t b, int64_t h,
                               int64_t n)
{
    int64_t off = b * t->stride_b + h * t->stride_h + n * t->stride_n;
    return (const char *)t->ptr + off * (int64_t)stats_dtype_size(dt);
}

/* Visible key range [*lo, *hi] of row i (bottom-right offset off); empty when *lo > *hi. */
static inline void visible_range(const stats_problem *p, int64_t i, int64_t off, int64_t lk,
                                 int64_t *lo, int64_t *hi)
{
    *lo = 0, *hi = lk - 1;
    if (p->causal && i + off < *hi)
        *hi = i + off;
    if (p->window_right >= 0 && i + off + p->window_right < *hi)
        *hi = i + off + p->window_right;
    if (p->window_left >= 0 && i + off - p->window_left > *lo)
        *lo = i + off - p->window_left;
}

/* ---- attention sinks ------------------------------------------------------------------------ */

/* The sink logit of query head h (stats.h), -inf when the problem has none. */
static inline double head_sink(const stats_problem *p, int h)
{
    if (!p->sinks)
        return -INFINITY;
    return load_elem(p->sinks, h, p->sinks_dtype, p->sinks_dtype);
}

/* Folds a finite sink logit s into a row's final online state (running max *m, l = sum e^(x - m),
 * w = sum e^(x - m) (x - m), over at least one key) as the one-element state (s, 1, 0): the
 * online update when the max moves to s, or one more term when it does not. Guarded where an
 * exponential underflows to 0 (the distance between s and *m may be infinite in double; 0 * -inf
 * would be NaN). */
static inline void sink_fold(double *m, double *l, double *w, double s)
{
    if (s > *m) {
        double d = *m - s, a = exp(d);
        *w = a > 0.0 ? a * (*w + d * *l) : 0.0;
        *l = a * *l + 1.0;
        *m = s;
    } else {
        double d = s - *m, e = exp(d);
        if (e > 0.0) {
            *l += e;
            *w += e * d;
        }
    }
}

/* Sink mass and distance of a row at its end. Over its keys the row's online state is (mk, lk) with
 * first = the logit (bias included) of its first visible key and dsum = sum_j e^(s_j - mk) |pos - j|;
 * (m, l) is the final state, with the sink folded in when there is one (else m = mk, l = lk). */
static inline void row_sink_distance(double mk, double first, double dsum, double m, double l,
                                     double *sink_mass, double *distance)
{
    *sink_mass = exp(first - m) / l;
    *distance = (m == mk ? dsum : dsum * exp(mk - m)) / l;
}

/* ---- per-row results and per-head accumulation ------------------------------------------- */

typedef struct {
    double entropy, max_logit;
    int64_t outcomes; /* of the row's distribution: its visible keys, plus one for a sink */
    int finite;
    double sink_mass, distance; /* p of the first visible key; sum_j p_j |pos - j| */
} row_result;

typedef struct {
    int64_t rows, rows_norm, rows_empty, nonfinite, collapsed;
    double sum, sumsq, min, max, sum_norm, max_logit;
    double sum_sink, sum_dist;
} head_acc;

static inline void acc_init(head_acc *a)
{
    memset(a, 0, sizeof *a);
    a->min = INFINITY;
    a->max = -INFINITY;
    a->max_logit = -INFINITY;
}

/* acc_row() with log(r->outcomes) given (the fast path keeps the last one: rows of a head mostly
 * see the same number of keys). */
static inline void acc_row_logv(head_acc *a, const row_result *r, double collapse, double logv)
{
    if (!r->finite) {
        a->nonfinite++;
        return;
    }
    a->rows++;
    a->sum += r->entropy;
    a->sum_sink += r->sink_mass;
    a->sum_dist += r->distance;
    a->sumsq += r->entropy * r->entropy;
    if (r->entropy < a->min)
        a->min = r->entropy;
    if (r->entropy > a->max)
        a->max = r->entropy;
    if (r->max_logit > a->max_logit)
        a->max_logit = r->max_logit;
    if (r->outcomes >= 2) {
        double hn = r->entropy / logv;
        a->rows_norm++;
        a->sum_norm += hn;
        if (hn < collapse)
            a->collapsed++;
    }
}

static inline void acc_row(head_acc *a, const row_result *r, double collapse)
{
    acc_row_logv(a, r, collapse, r->outcomes >= 2 ? log((double)r->outcomes) : 0.0);
}

/* A row's result into the optional per-row outputs (row i of sequence q0.. of head h, batch tb). */
static inline void row_out(const stats_problem *p, int64_t tb, int h, int64_t q0, int64_t i,
                           const row_result *r, float *row_entropy, float *row_maxlogit)
{
    int64_t ro = (tb * p->heads_q + h) * (int64_t)p->len_q + q0 + i;
    if (row_entropy)
        row_entropy[ro] = (float)r->entropy;
    if (row_maxlogit)
        row_maxlogit[ro] = (float)r->max_logit;
}

static inline void acc_finish(const head_acc *a, int sampled, stats_head *out)
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
        out->sink_mass = a->sum_sink / n;
        out->distance = a->sum_dist / n;
        out->entropy_mean = mean;
        out->entropy_std = sqrt(var > 0.0 ? var : 0.0);
        out->entropy_min = a->min;
        out->entropy_max = a->max;
    } else {
        out->entropy_mean = out->entropy_std = out->entropy_min = out->entropy_max = NAN;
        out->sink_mass = out->distance = NAN;
    }
    if (a->rows_norm > 0) {
        out->entropy_norm_mean = a->sum_norm / (double)a->rows_norm;
        out->collapsed_frac = (double)a->collapsed / (double)a->rows_norm;
    } else {
        out->entropy_norm_mean = NAN;
        out->collapsed_frac = 0.0;
    }
}

/* Grows *buf to hold n elements of size sz (both backends' workspaces); *buf stays valid whatever
 * happens. 0, or -1 when out of memory. */
static inline int cpu_grow(void **buf, int64_t *cap, int64_t n, size_t sz)
{
    if (n <= *cap)
        return 0;
    void *nb = realloc(*buf, (size_t)n * sz);
    if (!nb)
        return -1;
    *buf = nb;
    *cap = n;
    return 0;
}

#endif /* ATTNSTAT_STATS_CPU_COMMON_H */
