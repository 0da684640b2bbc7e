/* stats_cpu_fast.c — the production CPU backend (stats_cpu_fast_ws in stats.h): the same statistics
 * as the reference (stats_cpu.c) in float32 vector loops, validated against it
 * (tests/unit/test_stats_fast.c). Stage: kernels; calls stats.c, stats_cpu_common.h, the reference
 * (for the problems it hands over) and libm.
 *
 * K is converted to float (rounded to the compute dtype exactly as the reference rounds it) once per
 * chunk of KCHUNK keys and stored transposed in blocks of BLK keys, [d][BLK], so a row's logits for
 * one block are a matrix-vector product whose inner loop runs over the BLK keys: fixed trip counts
 * and no reduction across lanes, which gcc vectorises at -O2 without reassociating anything.
 * Per row and block, in float: s = scale * q.k (softcap: cap * tanhf(s / cap)), the block's max,
 * then e = 2^((s - m) * log2 e) by a branch-free polynomial (fast_exp below) and the block sums
 * sum e, sum e * (s - m). The row's state across blocks (l, w) is double, with the shifted form and
 * the guarded rescale of the reference; per-row results and per-head sums are the reference's
 * (stats_cpu_common.h), in double.
 *
 * Handed to the reference, whole problem at a time:
 *   - any logit that is NaN or +-Inf among the keys a row sees (the reference decides which rows
 *     are non-finite; a float32 dot product can also overflow where the reference's double one
 *     does not). Such pushes are rare and are what the alerts are for, so exactness wins.
 * Everything else (causal, windows, softcap, GQA, packed sequences, sampling, bool and additive
 * masks, f32/f16/bf16 inputs and compute dtypes, empty rows) is computed here. Masks take a scalar
 * per-key pass after the vector logits. */
#include "stats.h"
#include "stats_cpu_common.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { BLK = 16, KCHUNK = 1024 };
#define MAX_ROW_STATES (1LL << 25) /* the reference's limit, same message */

/* 2^x for x <= 0, float, branch-free: x = n + f with n = round(x), |f| <= 1/2; 2^f by its Taylor
 * series in f ln 2 to degree 7 (relative error < 3e-8, under float rounding), 2^n through the
 * exponent bits. x < -126 gives 0 (the reference's exp underflows there too, within 1e-38). */
static inline float fast_exp2(float x)
{
    const float magic = 12582912.0f; /* 1.5 * 2^23: adding it rounds to an integer */
    float xc = x < -126.0f ? -126.0f : x;
    float r = xc + magic;
    float n = r - magic, f = xc - n;
    int32_t ri;
    memcpy(&ri, &r, 4);
    int32_t ebits = (ri - 0x4b400000) + 127; /* n + 127 in [1, 127] */
    float p = 1.5252733804e-5f;              /* (ln 2)^7 / 7! */
    p = p * f + 1.5403530393e-4f;
    p = p * f + 1.3333558146e-3f;
    p = p * f + 9.6181291076e-3f;
    p = p * f + 5.5504108665e-2f;
    p = p * f + 2.4022650696e-1f;
    p = p * f + 6.9314718056e-1f;
    p = p * f + 1.0f;
    uint32_t sb = (uint32_t)ebits << 23;
    float sc;
    memcpy(&sc, &sb, 4);
    return x < -126.0f ? 0.0f : p * sc;
}

typedef struct {
    float m, mraw;  /* running max (with the mask's bias), max without it */
    double l, w;    /* sum exp(s - m), sum exp(s - m) * (s - m) */
    int64_t nvis;
} fast_row;

struct stats_cpu_fast_workspace {
    float *kt;             /* KCHUNK / BLK blocks of [STATS_MAX_HEAD_DIM][BLK] */
    float *qf;             /* STATS_MAX_HEAD_DIM */
    fast_row *rows;        /* group x sampled rows */
    int64_t rows_cap;
    head_acc *acc;
    int64_t acc_cap;
    stats_cpu_workspace *ref; /* the reference's, made on first hand-over */
    uint64_t handed_over;
};

stats_cpu_fast_workspace *stats_cpu_fast_workspace_new(void)
{
    stats_cpu_fast_workspace *ws = calloc(1, sizeof *ws);
    if (!ws)
        return NULL;
    ws->kt = malloc(sizeof(float) * KCHUNK * STATS_MAX_HEAD_DIM);
    ws->qf = malloc(sizeof(float) * STATS_MAX_HEAD_DIM);
    if (!ws->kt || !ws->qf) {
        stats_cpu_fast_workspace_free(ws);
        return NULL;
    }
    return ws;
}

void stats_cpu_fast_workspace_free(stats_cpu_fast_workspace *ws)
{
    if (!ws)
        return;
    free(ws->kt);
    free(ws->qf);
    free(ws->rows);
    free(ws->acc);
    stats_cpu_workspace_free(ws->ref);
    free(ws);
}

uint64_t stats_cpu_fast_handed_over(const stats_cpu_fast_workspace *ws)
{
    return ws ? ws->handed_over : 0;
}

/* Keys [c0, c1] of one (sequence, KV head) into ws->kt, transposed per block; the tail of the
 * last block is zero (its lanes are computed and never used). */
static void load_chunk(stats_cpu_fast_workspace *ws, const stats_problem *p, int64_t tb, int kvh,
                       int64_t k0, int64_t c0, int64_t c1)
{
    const int d = p->head_dim;
    int64_t n = c1 - c0 + 1, nblk = (n + BLK - 1) / BLK;
    for (int64_t j = 0; j < n; j++) {
        float *dst = ws->kt + (j / BLK) * d * BLK + j % BLK;
        const void *src = elem(&p->k, p->dtype, tb, kvh, k0 + c0 + j);
        for (int e = 0; e < d; e++)
            dst[e * BLK] = load_elem(src, e, p->dtype, p->compute_dtype);
    }
    for (int64_t j = n; j < nblk * BLK; j++) {
        float *dst = ws->kt + (j / BLK) * d * BLK + j % BLK;
        for (int e = 0; e < d; e++)
            dst[e * BLK] = 0.0f;
    }
}

/* s[t] = scale * q . k_t for the BLK keys of one block ([d][BLK]). */
static inline void block_logits(float *restrict s, const float *restrict q,
                                const float *restrict kb, int d, float scale)
{
    float acc[BLK];
    for (int t = 0; t < BLK; t++)
        acc[t] = 0.0f;
    for (int e = 0; e < d; e++) {
        const float qe = q[e];
        const float *restrict kr = kb + e * BLK;
        /* unrolled, so the BLK accumulators live in vector registers across e (a rolled loop
         * keeps them in memory: a store-to-load chain per e) */
#pragma GCC unroll 16
        for (int t = 0; t < BLK; t++)
            acc[t] += qe * kr[t];
    }
    for (int t = 0; t < BLK; t++)
        s[t] = scale * acc[t];
}

/* Folds the lanes of s that take part (the others hold -inf) into the row: one max, one rescale
 * when it moves, then the block's sums. */
static inline void block_fold(fast_row *r, const float *restrict s, float tmax)
{
    if (tmax > r->m) {
        if (r->l > 0.0) { /* guarded: on the first block m = -inf and l = 0 */
            double dlt = (double)r->m - (double)tmax, a = exp(dlt);
            r->w = a * (r->w + dlt * r->l);
            r->l = a * r->l;
        }
        r->m = tmax;
    }
    const float m = r->m, log2e = 1.4426950408889634f;
    float ls[BLK], wsum[BLK];
    for (int t = 0; t < BLK; t++) {
        float tt = s[t] - m;            /* <= 0; -inf for lanes that do not take part */
        float e = fast_exp2(tt * log2e);
        tt = e > 0.0f ? tt : 0.0f;      /* keeps 0 * -inf out of w */
        ls[t] = e;
        wsum[t] = e * tt;
    }
    float lsum = 0.0f, wtot = 0.0f;
    for (int t = 0; t < BLK; t++) {
        lsum += ls[t];
        wtot += wsum[t];
    }
    r->l += lsum;
    r->w += wtot;
}

/* One row over keys [lo, hi] (chunk coordinates c0..) of the loaded chunk. Returns 0, or -1 when a
 * logit the row sees is NaN or +-Inf (the problem goes to the reference). */
static int row_fast(fast_row *r, const float *q, const float *kt, int64_t c0, int64_t lo,
                    int64_t hi, int d, float scale, float softcap, const row_mask *mk)
{
    float s[BLK];
    for (int64_t b0 = ((lo - c0) / BLK) * BLK; b0 <= hi - c0; b0 += BLK) {
        block_logits(s, q, kt + b0 * d, d, scale);
        int a = (int)(lo - c0 - b0 > 0 ? lo - c0 - b0 : 0);
        int z = (int)(hi - c0 - b0 < BLK - 1 ? hi - c0 - b0 : BLK - 1);
        if (softcap > 0.0f)
            for (int t = a; t <= z; t++)
                s[t] = softcap * tanhf(s[t] / softcap);
        float chk = 0.0f, tmax = -INFINITY;
        int nv = 0;
        if (!mk->row) {
            for (int t = 0; t < BLK; t++) {
                int in = t >= a && t <= z;
                float x = in ? s[t] : 0.0f;
                chk += x * 0.0f; /* NaN once any x is NaN or +-Inf */
                s[t] = in ? s[t] : -INFINITY;
                tmax = s[t] > tmax ? s[t] : tmax;
            }
            nv = z - a + 1;
            if (tmax > r->mraw)
                r->mraw = tmax;
        } else {
            for (int t = 0; t < BLK; t++) {
                double bias;
                if (t < a || t > z || !mask_take(mk, c0 + b0 + t, &bias)) {
                    s[t] = -INFINITY;
                    continue;
                }
                if (s[t] > r->mraw)
                    r->mraw = s[t];
                float x = (float)((double)s[t] + bias);
                chk += x * 0.0f;
                s[t] = x;
                tmax = x > tmax ? x : tmax;
                nv++;
            }
        }
        if (chk != chk)
            return -1;
        r->nvis += nv;
        if (nv > 0)
            block_fold(r, s, tmax);
    }
    return 0;
}

/* Computes p here; returns 1 when it must go to the reference instead (nothing written). */
static int compute_fast(const stats_problem *p, stats_cpu_fast_workspace *ws, stats_head *heads,
                        float *row_entropy, float *row_maxlogit)
{
    const int packed = p->cu_seqlens_q != NULL;
    const int d = p->head_dim, group = p->heads_q / p->heads_kv;
    const float scale = p->scale > 0.0f ? p->scale : (float)(1.0 / sqrt((double)d));
    const double collapse = p->collapse_threshold > 0.0f ? p->collapse_threshold
                                                         : STATS_DEFAULT_COLLAPSE;
    const int sampled = p->sample_every > 1 || p->sample_rows > 0;
    head_acc *acc = ws->acc;
    for (int h = 0; h < p->heads_q; h++)
        acc_init(&acc[h]);

    for (int32_t b = 0; b < p->batch; b++) {
        int64_t q0 = packed ? p->cu_seqlens_q[b] : 0, k0 = packed ? p->cu_seqlens_k[b] : 0;
        int64_t lq = packed ? p->cu_seqlens_q[b + 1] - q0 : p->len_q;
        int64_t lk = packed ? p->cu_seqlens_k[b + 1] - k0 : p->len_k;
        int64_t tb = packed ? 0 : b, off = lk - lq;
        int64_t nsamp = stats_sampled_count(p, (int32_t)lq);
        if (nsamp == 0)
            continue;
        for (int kvh = 0; kvh < p->heads_kv; kvh++) {
            fast_row *rows = ws->rows;
            for (int64_t r = 0; r < (int64_t)group * nsamp; r++)
                rows[r] = (fast_row){-INFINITY, -INFINITY, 0.0, 0.0, 0};
            for (int64_t c0 = 0; c0 < lk; c0 += KCHUNK) {
                int64_t c1 = c0 + KCHUNK - 1 < lk - 1 ? c0 + KCHUNK - 1 : lk - 1;
                int loaded = 0;
                for (int g = 0; g < group; g++) {
                    int h = kvh * group + g;
                    for (int64_t sj = 0; sj < nsamp; sj++) {
                        int64_t i = stats_row_of_sample((uint32_t)sj, (uint32_t)lq, p->sample_every,
                                                        p->sample_rows, p->sample_seed);
                        int64_t lo, hi;
                        visible_range(p, i, off, lk, &lo, &hi);
                        lo = lo > c0 ? lo : c0;
                        hi = hi < c1 ? hi : c1;
                        if (lo > hi)
                            continue;
                        if (!loaded) {
                            load_chunk(ws, p, tb, kvh, k0, c0, c1);
                            loaded = 1;
                        }
                        const void *qsrc = elem(&p->q, p->dtype, tb, h, q0 + i);
                        for (int e = 0; e < d; e++)
                            ws->qf[e] = load_elem(qsrc, e, p->dtype, p->compute_dtype);
                        row_mask mk = {NULL, p->mask_dtype};
                        if (p->mask.ptr)
                            mk.row = elem(&p->mask, p->mask_dtype, b, h, i);
                        if (row_fast(&rows[g * nsamp + sj], ws->qf, ws->kt, c0, lo, hi, d, scale,
                                     p->softcap, &mk))
                            return 1;
                    }
                }
            }
            for (int g = 0; g < group; g++) {
                int h = kvh * group + g;
                for (int64_t sj = 0; sj < nsamp; sj++) {
                    int64_t i = stats_row_of_sample((uint32_t)sj, (uint32_t)lq, p->sample_every,
                                                    p->sample_rows, p->sample_seed);
                    const fast_row *rs = &rows[g * nsamp + sj];
                    if (rs->nvis == 0) {
                        acc[h].rows_empty++;
                        continue;
                    }
                    double hh = log(rs->l) - rs->w / rs->l;
                    row_result r = {hh > 0.0 ? hh : 0.0, rs->mraw, rs->nvis, 1};
                    acc_row(&acc[h], &r, collapse);
                    int64_t ro = (tb * p->heads_q + h) * (int64_t)p->len_q + q0 + i;
                    if (row_entropy)
                        row_entropy[ro] = (float)r.entropy;
                    if (row_maxlogit)
                        row_maxlogit[ro] = (float)r.max_logit;
                }
            }
        }
    }
    for (int h = 0; h < p->heads_q; h++)
        acc_finish(&acc[h], sampled, &heads[h]);
    return 0;
}

stats_status stats_cpu_fast_ws(const stats_problem *p, stats_cpu_fast_workspace *ws,
                               stats_head *heads, float *row_entropy, float *row_maxlogit,
                               stats_error *err)
{
    stats_status st = stats_validate(p, err);
    if (st != STATS_OK)
        return st;
    if (!heads || !ws) {
        if (err)
            snprintf(err->msg, sizeof err->msg, "%s is NULL", heads ? "workspace" : "heads output");
        return STATS_EINVAL;
    }
    const int packed = p->cu_seqlens_q != NULL;
    if (packed) {
        st = stats_validate_seqlens(p->cu_seqlens_q, p->batch, p->len_q, "cu_seqlens_q", err);
        if (st == STATS_OK)
            st = stats_validate_seqlens(p->cu_seqlens_k, p->batch, p->len_k, "cu_seqlens_k", err);
        if (st != STATS_OK)
            return st;
    }
    const int group = p->heads_q / p->heads_kv;
    int64_t max_ns = 0;
    for (int32_t b = 0; b < p->batch; b++) {
        int64_t lq = packed ? p->cu_seqlens_q[b + 1] - p->cu_seqlens_q[b] : p->len_q;
        int64_t ns = stats_sampled_count(p, (int32_t)lq);
        max_ns = ns > max_ns ? ns : max_ns;
    }
    if ((int64_t)group * max_ns > MAX_ROW_STATES) {
        if (err)
            snprintf(err->msg, sizeof err->msg, "%lld sampled rows per sequence x %d query heads "
                     "per KV head is over the CPU backend's limit of %lld rows per pass; sample "
                     "fewer rows", (long long)max_ns, group, (long long)MAX_ROW_STATES);
        return STATS_EINVAL;
    }
    if (cpu_grow((void **)&ws->rows, &ws->rows_cap, (int64_t)group * (max_ns > 0 ? max_ns : 1),
             sizeof(fast_row)) ||
        cpu_grow((void **)&ws->acc, &ws->acc_cap, p->heads_q, sizeof(head_acc))) {
        if (err)
            snprintf(err->msg, sizeof err->msg, "out of memory for %lld row states",
                     (long long)group * max_ns);
        return STATS_ENOMEM;
    }
    if (row_entropy || row_maxlogit) {
        int64_t nrows = (packed ? 1 : p->batch) * p->heads_q * (int64_t)p->len_q;
        for (int64_t r = 0; r < nrows; r++) {
            if (row_entropy)
                row_entropy[r] = STATS_ROW_SKIPPED;
            if (row_maxlogit)
                row_maxlogit[r] = -INFINITY;
        }
    }
    if (!compute_fast(p, ws, heads, row_entropy, row_maxlogit))
        return STATS_OK;

    /* A logit was not finite: the reference decides, for the whole problem. */
    ws->handed_over++;
    if (!ws->ref && !(ws->ref = stats_cpu_workspace_new())) {
        if (err)
            snprintf(err->msg, sizeof err->msg, "out of memory for the CPU workspace");
        return STATS_ENOMEM;
    }
    return stats_cpu_ws(p, ws->ref, heads, row_entropy, row_maxlogit, err);
}

stats_status stats_cpu_fast(const stats_problem *p, stats_head *heads, float *row_entropy,
                            float *row_maxlogit, stats_error *err)
{
    stats_cpu_fast_workspace *ws = stats_cpu_fast_workspace_new();
    if (!ws) {
        if (err)
            snprintf(err->msg, sizeof err->msg, "out of memory for the CPU workspace");
        return STATS_ENOMEM;
    }
    stats_status st = stats_cpu_fast_ws(p, ws, heads, row_entropy, row_maxlogit, err);
    stats_cpu_fast_workspace_free(ws);
    return st;
}
