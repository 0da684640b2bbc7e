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
 * sum e, sum e * (s - m), sum e * |pos - j| (distance; pos = i + Lk - Lq, the causal diagonal, and
 * |pos - j| exact in float below 2^24). The row's state across blocks (l, w, dsum) is double, with the shifted form and
 * the guarded rescale of the reference; per-row results and per-head sums are the reference's
 * (stats_cpu_common.h), in double.
 *
 * Handed to the reference, whole problem at a time:
 *   - any logit that is NaN or +-Inf among the keys a row sees (the reference decides which rows
 *     are non-finite; a float32 dot product can also overflow where the reference's double one
 *     does not). Such pushes are rare and are what the alerts are for, so exactness wins.
 * Everything else (causal, windows, softcap, GQA, packed sequences, sampling, bool and additive
 * masks, attention sinks, f32/f16/bf16 inputs and compute dtypes, empty rows) is computed here.
 * Masks take a scalar per-key pass after the vector logits; a sink is folded into each row's
 * final state in double, as the reference does; the first visible key's logit is kept as it
 * passes (sink mass = exp(first - m) / l at the row's end) (a NaN or +inf sink makes the row non-finite here
 * too, with no hand-over: it is one value per head, not a logit). */
#include "stats.h"
#include "stats_cpu_common.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* x86-64 with GCC also builds an AVX2 + FMA instance of the vector loops, picked at run time. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define FAST_HAVE_AVX2 1
#include <immintrin.h>
#else
#define FAST_HAVE_AVX2 0
#endif

enum { BLK = 16, KCHUNK = 1024 };
#define MAX_ROW_STATES (1LL << 25) /* the reference's limit, same message */

typedef struct {
    float m, mraw;  /* running max (with the mask's bias), max without it */
    double l, w;    /* sum exp(s - m), sum exp(s - m) * (s - m) */
    int64_t nvis;
    float first;    /* the logit (bias included) of the row's first visible key */
    double dsum;    /* sum exp(s - m) |pos - j| */
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
    int wide;                 /* the 8-float instance (AVX2 + FMA) */
};

/* Whether this CPU runs the 8-float instance, unless ATTNSTAT_CPU_SIMD=baseline. */
static int fast_wide_available(void)
{
#if FAST_HAVE_AVX2
    const char *env = getenv("ATTNSTAT_CPU_SIMD");
    if (env && strcmp(env, "baseline") == 0)
        return 0;
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#else
    return 0;
#endif
}

stats_cpu_fast_workspace *stats_cpu_fast_workspace_new(void)
{
    stats_cpu_fast_workspace *ws = calloc(1, sizeof *ws);
    if (!ws)
        return NULL;
    ws->wide = fast_wide_available();
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

const char *stats_cpu_fast_simd(const stats_cpu_fast_workspace *ws)
{
    return ws && ws->wide ? "avx2+fma, 8 floats" : "baseline, 4 floats";
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

/* 4 x 4 tiles for the transposition of K: four keys' runs of four elements in, four elements'
 * runs of four keys out (GCC >= 12 and Clang have __builtin_shufflevector; older GCC spells it
 * __builtin_shuffle with a mask vector). */
typedef float tv4 __attribute__((vector_size(16)));
typedef uint32_t tv4u __attribute__((vector_size(16)));
typedef uint16_t tv4h __attribute__((vector_size(8)));
#if defined(__clang__) || (defined(__GNUC__) && __GNUC__ >= 12)
#define SHUF4(a, b, i, j, k, l) __builtin_shufflevector(a, b, i, j, k, l)
#else
#define SHUF4(a, b, i, j, k, l) __builtin_shuffle(a, b, (tv4u){i, j, k, l})
#endif

/* Four elements at src (f32, or bf16 widened: exact) as floats. */
static inline tv4 tile_row(const char *src, int bf16)
{
    tv4 v;
    if (bf16) {
        tv4h h;
        memcpy(&h, src, sizeof h);
        tv4u u = __builtin_convertvector(h, tv4u) << 16;
        memcpy(&v, &u, sizeof v);
    } else {
        memcpy(&v, src, sizeof v);
    }
    return v;
}

/* Keys [c0, c1] of one (sequence, KV head) into ws->kt, transposed per block; the tail of the
 * last block is zero (its lanes are computed and never used). Full blocks of f32 or bf16 keys
 * whose values need no rounding (the compute dtype is theirs or f32), d a multiple of 4, go by 4 x
 * 4 tiles; the rest element by element. */
static inline void load_chunk(stats_cpu_fast_workspace *ws, const stats_problem *p, int64_t tb,
                              int kvh, int64_t k0, int64_t c0, int64_t c1)
{
    const int d = p->head_dim;
    const int64_t n = c1 - c0 + 1, nblk = (n + BLK - 1) / BLK;
    const int direct = p->dtype == STATS_F32 && p->compute_dtype == STATS_F32;
    const int bf16 = p->dtype == STATS_BF16 &&
                     (p->compute_dtype == STATS_BF16 || p->compute_dtype == STATS_F32);
    const int tiles = (direct || bf16) && d % 4 == 0;
    const int esz = stats_dtype_size(p->dtype);
    const char *src = elem(&p->k, p->dtype, tb, kvh, k0 + c0);
    const int64_t step = p->k.stride_n * (int64_t)esz;
    float row[STATS_MAX_HEAD_DIM];
    int64_t j = 0;
    if (tiles)
        for (; j + BLK <= n; j += BLK) {
            float *blk = ws->kt + (j / BLK) * d * BLK;
            for (int t0 = 0; t0 < BLK; t0 += 4) {
                const char *r = src + (j + t0) * step;
                for (int e0 = 0; e0 < d; e0 += 4) {
                    const char *at = r + (int64_t)e0 * esz;
                    tv4 r0 = tile_row(at, bf16), r1 = tile_row(at + step, bf16);
                    tv4 r2 = tile_row(at + 2 * step, bf16), r3 = tile_row(at + 3 * step, bf16);
                    tv4 a0 = SHUF4(r0, r1, 0, 4, 1, 5), a1 = SHUF4(r0, r1, 2, 6, 3, 7);
                    tv4 a2 = SHUF4(r2, r3, 0, 4, 1, 5), a3 = SHUF4(r2, r3, 2, 6, 3, 7);
                    tv4 col[4] = {SHUF4(a0, a2, 0, 1, 4, 5), SHUF4(a0, a2, 2, 3, 6, 7),
                                  SHUF4(a1, a3, 0, 1, 4, 5), SHUF4(a1, a3, 2, 3, 6, 7)};
                    for (int i = 0; i < 4; i++)
                        memcpy(blk + (e0 + i) * BLK + t0, &col[i], sizeof col[i]);
                }
            }
        }
    for (const char *at = src + j * step; j < n; j++, at += step) {
        float *dst = ws->kt + (j / BLK) * d * BLK + j % BLK;
        const float *from = (const float *)at;
        if (!direct) {
            load_run(row, at, d, p->dtype, p->compute_dtype);
            from = row;
        }
        for (int e = 0; e < d; e++)
            dst[e * BLK] = from[e];
    }
    for (j = n; j < nblk * BLK; j++) {
        float *dst = ws->kt + (j / BLK) * d * BLK + j % BLK;
        for (int e = 0; e < d; e++)
            dst[e * BLK] = 0.0f;
    }
}

/* The vector loops, once per width (see stats_cpu_fast_body.h). */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wpsabi" /* vectors by value between static functions only */
#endif

#define VW 4
#define FAST_FMA 0
#define FAST_FN(x) x##_v4
#include "stats_cpu_fast_body.h"
#undef VW
#undef FAST_FMA
#undef FAST_FN

#if FAST_HAVE_AVX2
#pragma GCC push_options
#pragma GCC target("avx2,fma")
#define VW 8
#define FAST_FMA 1
#define FAST_FN(x) x##_v8
#include "stats_cpu_fast_body.h"
#undef VW
#undef FAST_FMA
#undef FAST_FN
#pragma GCC pop_options
#endif

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
#if FAST_HAVE_AVX2
    int handed = ws->wide ? compute_v8(p, ws, heads, row_entropy, row_maxlogit)
                          : compute_v4(p, ws, heads, row_entropy, row_maxlogit);
#else
    int handed = compute_v4(p, ws, heads, row_entropy, row_maxlogit);
#endif
    if (!handed)
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
