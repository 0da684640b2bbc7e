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

/* A block's BLK lanes as NV vectors of 4 floats (GCC/Clang vector extensions: SSE registers on
 * x86-64, NEON on arm64); every lane-wise step below is a loop over the NV vectors that the
 * compiler unrolls. Lane masks are integer vectors of 0 / -1. */
typedef float v4 __attribute__((vector_size(16)));
typedef int32_t v4i __attribute__((vector_size(16)));
enum { NV = BLK / 4 };
typedef struct {
    v4 v[NV];
} vblk;

static inline v4 v4load(const float *p)
{
    v4 v;
    memcpy(&v, p, sizeof v);
    return v;
}

static inline v4 v4sel(v4i m, v4 a, v4 b) /* m ? a : b, lane by lane */
{
    return (v4)(((v4i)a & m) | ((v4i)b & ~m));
}

/* Lane reductions in a fixed order (a tree). */
static inline float hsum(const vblk *b)
{
    v4 t = (b->v[0] + b->v[1]) + (b->v[2] + b->v[3]);
    return (t[0] + t[2]) + (t[1] + t[3]);
}

static inline float max2(float a, float b)
{
    return b > a ? b : a;
}

static inline float hmax(const vblk *b)
{
    v4 t[2];
    #pragma GCC unroll 2
    for (int j = 0; j < 2; j++) {
        v4i gt = b->v[j + 2] > b->v[j];
        t[j] = v4sel(gt, b->v[j + 2], b->v[j]);
    }
    v4 u = v4sel(t[1] > t[0], t[1], t[0]);
    return max2(max2(u[0], u[2]), max2(u[1], u[3]));
}

/* 2^x lane by lane for x <= 0, branch-free: x = n + f with n = round(x), |f| <= 1/2; 2^f by its
 * Taylor series in f ln 2 to degree 7 (relative error < 3e-8, under float rounding), 2^n through
 * the exponent bits. x < -126 (and -inf) gives 0 (the reference's exp underflows there too, within
 * 1e-38); NaN stays NaN. */
static inline v4 v4exp2(v4 x)
{
    const v4 magic = {12582912.0f, 12582912.0f, 12582912.0f, 12582912.0f}; /* 1.5 * 2^23 */
    const v4 lowest = {-126.0f, -126.0f, -126.0f, -126.0f};
    v4i under = x < lowest;
    v4 xc = v4sel(under, lowest, x);
    v4 r = xc + magic;                      /* rounds xc to an integer, in the low mantissa bits */
    v4 n = r - magic, f = xc - n;
    v4i ebits = ((v4i)r - 0x4b400000) + 127; /* n + 127 in [1, 127] */
    v4 p = f * 1.5252733804e-5f;            /* (ln 2)^7 / 7! */
    p = (p + 1.5403530393e-4f) * f;
    p = (p + 1.3333558146e-3f) * f;
    p = (p + 9.6181291076e-3f) * f;
    p = (p + 5.5504108665e-2f) * f;
    p = (p + 2.4022650696e-1f) * f;
    p = (p + 6.9314718056e-1f) * f;
    p = p + 1.0f;
    return (v4)((v4i)(p * (v4)(ebits << 23)) & ~under);
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

/* n elements of dtype dt at src into dst as floats rounded to compute (load_elem's values), the
 * dtype's branch taken once per run rather than per element. */
static inline void load_run(float *restrict dst, const void *src, int n, stats_dtype dt,
                            stats_dtype compute)
{
    if (dt == STATS_F32 && (compute == STATS_F32 || compute == dt)) {
        memcpy(dst, src, sizeof(float) * (size_t)n);
    } else if (dt == STATS_BF16 && (compute == STATS_BF16 || compute == STATS_F32)) {
        for (int e = 0; e < n; e++)
            dst[e] = bf16_to_f32(((const uint16_t *)src)[e]);
    } else {
        for (int e = 0; e < n; e++)
            dst[e] = load_elem(src, e, dt, compute);
    }
}

/* Keys [c0, c1] of one (sequence, KV head) into ws->kt, transposed per block; the tail of the
 * last block is zero (its lanes are computed and never used). */
static inline void load_chunk(stats_cpu_fast_workspace *ws, const stats_problem *p, int64_t tb,
                              int kvh, int64_t k0, int64_t c0, int64_t c1)
{
    const int d = p->head_dim;
    int64_t n = c1 - c0 + 1, nblk = (n + BLK - 1) / BLK;
    float row[STATS_MAX_HEAD_DIM];
    for (int64_t j = 0; j < n; j++) {
        float *dst = ws->kt + (j / BLK) * d * BLK + j % BLK;
        load_run(row, elem(&p->k, p->dtype, tb, kvh, k0 + c0 + j), d, p->dtype, p->compute_dtype);
        for (int e = 0; e < d; e++)
            dst[e * BLK] = row[e];
    }
    for (int64_t j = n; j < nblk * BLK; j++) {
        float *dst = ws->kt + (j / BLK) * d * BLK + j % BLK;
        for (int e = 0; e < d; e++)
            dst[e * BLK] = 0.0f;
    }
}

/* scale * q . k_t for the BLK keys of one block ([d][BLK]). */
static inline void block_logits(vblk *s, const float *restrict q, const float *restrict kb, int d,
                                float scale)
{
    vblk acc;
    #pragma GCC unroll 4
    for (int j = 0; j < NV; j++)
        acc.v[j] = (v4){0.0f, 0.0f, 0.0f, 0.0f};
    for (int e = 0; e < d; e++) {
        const float qe = q[e];
        #pragma GCC unroll 4
        for (int j = 0; j < NV; j++)
            acc.v[j] += qe * v4load(kb + e * BLK + 4 * j);
    }
    #pragma GCC unroll 4
    for (int j = 0; j < NV; j++)
        s->v[j] = acc.v[j] * scale;
}

/* Folds the lanes of s that take part (the others hold -inf) into the row: one max, one rescale
 * when it moves, then the block's sums. */
static inline void block_fold(fast_row *r, const vblk *s, float tmax)
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
    vblk e, ew;
    #pragma GCC unroll 4
    for (int j = 0; j < NV; j++) {
        v4 tt = s->v[j] - m;                         /* <= 0; -inf for lanes not taking part */
        e.v[j] = v4exp2(tt * log2e);
        tt = (v4)((v4i)tt & (e.v[j] > 0.0f));        /* keeps 0 * -inf out of w */
        ew.v[j] = e.v[j] * tt;
    }
    r->l += hsum(&e);
    r->w += hsum(&ew);
}

/* One row over keys [lo, hi] (chunk coordinates c0..) of the loaded chunk. Returns 0, or -1 when a
 * logit the row sees is NaN or +-Inf (the problem goes to the reference). */
static inline int row_fast(fast_row *r, const float *q, const float *kt, int64_t c0, int64_t lo,
                           int64_t hi, int d, float scale, float softcap, const row_mask *mk)
{
    const v4i lane = {0, 1, 2, 3};
    const v4 ninf = {-INFINITY, -INFINITY, -INFINITY, -INFINITY};
    v4 chk = {0.0f, 0.0f, 0.0f, 0.0f}; /* NaN in a lane once a logit the row sees is not finite */
    vblk s;
    for (int64_t b0 = ((lo - c0) / BLK) * BLK; b0 <= hi - c0; b0 += BLK) {
        block_logits(&s, q, kt + b0 * d, d, scale);
        int a = (int)(lo - c0 - b0 > 0 ? lo - c0 - b0 : 0);
        int z = (int)(hi - c0 - b0 < BLK - 1 ? hi - c0 - b0 : BLK - 1);
        if (softcap > 0.0f) {
            float sv[BLK];
            memcpy(sv, &s, sizeof sv);
            for (int t = a; t <= z; t++)
                sv[t] = softcap * tanhf(sv[t] / softcap);
            memcpy(&s, sv, sizeof sv);
        }
        float tmax;
        int nv;
        if (!mk->row) {
            #pragma GCC unroll 4
            for (int j = 0; j < NV; j++) {
                v4i in = (lane + 4 * j >= a) & (lane + 4 * j <= z);
                chk += (v4)((v4i)s.v[j] & in) * 0.0f;
                s.v[j] = v4sel(in, s.v[j], ninf);
            }
            tmax = hmax(&s);
            nv = z - a + 1;
            if (tmax > r->mraw)
                r->mraw = tmax;
        } else {
            float sv[BLK], ck = 0.0f;
            memcpy(sv, &s, sizeof sv);
            tmax = -INFINITY;
            nv = 0;
            for (int t = 0; t < BLK; t++) {
                double bias;
                if (t < a || t > z || !mask_take(mk, c0 + b0 + t, &bias)) {
                    sv[t] = -INFINITY;
                    continue;
                }
                if (sv[t] > r->mraw)
                    r->mraw = sv[t];
                float x = (float)((double)sv[t] + bias);
                ck += x * 0.0f;
                sv[t] = x;
                tmax = x > tmax ? x : tmax;
                nv++;
            }
            chk[0] += ck;
            memcpy(&s, sv, sizeof sv);
        }
        r->nvis += nv;
        if (nv > 0)
            block_fold(r, &s, tmax);
    }
    float c = (chk[0] + chk[1]) + (chk[2] + chk[3]);
    return c != c ? -1 : 0;
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
                        load_run(ws->qf, elem(&p->q, p->dtype, tb, h, q0 + i), d, p->dtype,
                                 p->compute_dtype);
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
