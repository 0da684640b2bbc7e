/* stats_cpu_fast_body.h — the vector loops of kernels/stats_cpu_fast.c, written once for a vector
 * width and included by that file once per width it builds (4 floats: the SSE2 / NEON baseline;
 * 8: an AVX2 + FMA instance on x86-64 with GCC). Not a header of its own: stats_cpu_fast.c
 * defines, before each inclusion,
 *   VW           lanes of a vector (4 or 8; BLK is a multiple of it),
 *   FAST_FN(x)   x with the instance's suffix (every function and type below is named through it),
 *   FAST_FMA     1 to multiply-add with the FMA unit (a * b + c rounded once), else 0,
 * and, in scope: BLK, fast_row, stats_cpu_fast_workspace, load_run(), load_chunk(), the helpers of
 * stats_cpu_common.h. Everything here is static; the entry point is FAST_FN(compute).
 * Stage: kernels (private). */

#define vf FAST_FN(vf)
#define vi FAST_FN(vi)
#define vblk FAST_FN(vblk)
#define NV (BLK / VW)

typedef float vf __attribute__((vector_size(4 * VW)));
typedef int32_t vi __attribute__((vector_size(4 * VW)));
typedef struct {
    vf v[NV];
} vblk;

static inline vf FAST_FN(vload)(const float *p)
{
    vf v;
    memcpy(&v, p, sizeof v);
    return v;
}

static inline vf FAST_FN(vsel)(vi m, vf a, vf b) /* m ? a : b, lane by lane */
{
    return (vf)(((vi)a & m) | ((vi)b & ~m));
}

/* a * b + c, lane by lane (one rounding with the FMA unit) */
static inline vf FAST_FN(vfma)(vf a, vf b, vf c)
{
#if FAST_FMA
    return (vf)_mm256_fmadd_ps((__m256)a, (__m256)b, (__m256)c);
#else
    return a * b + c;
#endif
}

/* Lane reductions in a fixed order: the block's vectors pairwise, then the lanes as a tree
 * (written out per width, so that the lanes stay in registers). */
static inline float FAST_FN(lanes_sum)(vf u)
{
#if VW == 8
    return ((u[0] + u[4]) + (u[2] + u[6])) + ((u[1] + u[5]) + (u[3] + u[7]));
#else
    return (u[0] + u[2]) + (u[1] + u[3]);
#endif
}

static inline float FAST_FN(max2)(float a, float b)
{
    return b > a ? b : a;
}

static inline float FAST_FN(lanes_max)(vf u)
{
#define M2 FAST_FN(max2)
#if VW == 8
    return M2(M2(M2(u[0], u[4]), M2(u[2], u[6])), M2(M2(u[1], u[5]), M2(u[3], u[7])));
#else
    return M2(M2(u[0], u[2]), M2(u[1], u[3]));
#endif
#undef M2
}

static inline float FAST_FN(hsum)(const vblk *b)
{
    vf t[NV];
#pragma GCC unroll 4
    for (int j = 0; j < NV; j++)
        t[j] = b->v[j];
#pragma GCC unroll 4
    for (int w = NV / 2; w > 0; w /= 2)
#pragma GCC unroll 4
        for (int j = 0; j < w; j++)
            t[j] += t[j + w];
    return FAST_FN(lanes_sum)(t[0]);
}

static inline float FAST_FN(hmax)(const vblk *b)
{
    vf t[NV];
#pragma GCC unroll 4
    for (int j = 0; j < NV; j++)
        t[j] = b->v[j];
#pragma GCC unroll 4
    for (int w = NV / 2; w > 0; w /= 2)
#pragma GCC unroll 4
        for (int j = 0; j < w; j++)
            t[j] = FAST_FN(vsel)(t[j + w] > t[j], t[j + w], t[j]);
    return FAST_FN(lanes_max)(t[0]);
}

/* 2^x lane by lane for x <= 0, branch-free: x = n + f with n = round(x), |f| <= 1/2; 2^f by its
 * Taylor series in f ln 2 to degree 7 (relative error < 3e-8, under float rounding), 2^n through
 * the exponent bits. x < -126 (and -inf) gives 0 (the reference's exp underflows there too, within
 * 1e-38); NaN stays NaN. */
static inline vf FAST_FN(vexp2)(vf x)
{
    const vf zero = {0};
    const vf magic = zero + 12582912.0f, lowest = zero - 126.0f; /* 1.5 * 2^23: rounds to integer */
    vi under = x < lowest;
    vf xc = FAST_FN(vsel)(under, lowest, x);
    vf r = xc + magic;                       /* xc rounded, in the low mantissa bits */
    vf n = r - magic, f = xc - n;
    vi ebits = ((vi)r - 0x4b400000) + 127;   /* n + 127 in [1, 127] */
    vf p = zero + 1.5252733804e-5f;          /* (ln 2)^7 / 7! */
    p = FAST_FN(vfma)(p, f, zero + 1.5403530393e-4f);
    p = FAST_FN(vfma)(p, f, zero + 1.3333558146e-3f);
    p = FAST_FN(vfma)(p, f, zero + 9.6181291076e-3f);
    p = FAST_FN(vfma)(p, f, zero + 5.5504108665e-2f);
    p = FAST_FN(vfma)(p, f, zero + 2.4022650696e-1f);
    p = FAST_FN(vfma)(p, f, zero + 6.9314718056e-1f);
    p = FAST_FN(vfma)(p, f, zero + 1.0f);
    return (vf)((vi)(p * (vf)(ebits << 23)) & ~under);
}

/* scale * q . k_t for the BLK keys of one block ([d][BLK]). Even and odd e accumulate apart (two
 * dependency chains per vector: the loop is bound by the add's latency, not its throughput). */
static inline void FAST_FN(block_logits)(vblk *s, const float *restrict q,
                                         const float *restrict kb, int d, float scale)
{
    const vf zero = {0};
    vblk acc0, acc1;
#pragma GCC unroll 4
    for (int j = 0; j < NV; j++)
        acc0.v[j] = acc1.v[j] = zero;
    int e = 0;
    for (; e + 1 < d; e += 2) {
        const vf q0 = zero + q[e], q1 = zero + q[e + 1];
#pragma GCC unroll 4
        for (int j = 0; j < NV; j++) {
            acc0.v[j] = FAST_FN(vfma)(q0, FAST_FN(vload)(kb + e * BLK + VW * j), acc0.v[j]);
            acc1.v[j] = FAST_FN(vfma)(q1, FAST_FN(vload)(kb + (e + 1) * BLK + VW * j), acc1.v[j]);
        }
    }
    if (e < d) {
        const vf q0 = zero + q[e];
#pragma GCC unroll 4
        for (int j = 0; j < NV; j++)
            acc0.v[j] = FAST_FN(vfma)(q0, FAST_FN(vload)(kb + e * BLK + VW * j), acc0.v[j]);
    }
#pragma GCC unroll 4
    for (int j = 0; j < NV; j++)
        s->v[j] = (acc0.v[j] + acc1.v[j]) * scale;
}

/* Folds the lanes of s that take part (the others hold -inf) into the row: one max, one rescale
 * when it moves, then the block's sums. */
static inline void FAST_FN(block_fold)(fast_row *r, const vblk *s, const vblk *dist, float tmax)
{
    if (tmax > r->m) {
        if (r->l > 0.0) { /* guarded: on the first block m = -inf and l = 0 */
            double dlt = (double)r->m - (double)tmax, a = exp(dlt);
            r->w = a * (r->w + dlt * r->l);
            r->l = a * r->l;
            r->dsum = a * r->dsum;
        }
        r->m = tmax;
    }
    const float m = r->m, log2e = 1.4426950408889634f;
    vblk e, ew, ed;
#pragma GCC unroll 4
    for (int j = 0; j < NV; j++) {
        vf tt = s->v[j] - m;                      /* <= 0; -inf for lanes not taking part */
        e.v[j] = FAST_FN(vexp2)(tt * log2e);
        tt = (vf)((vi)tt & (e.v[j] > 0.0f));      /* keeps 0 * -inf out of w */
        ew.v[j] = e.v[j] * tt;
        ed.v[j] = e.v[j] * dist->v[j];            /* 0 for lanes not taking part */
    }
    r->l += FAST_FN(hsum)(&e);
    r->w += FAST_FN(hsum)(&ew);
    r->dsum += FAST_FN(hsum)(&ed);
}

/* One row over keys [lo, hi] (chunk coordinates c0..) of the loaded chunk. Returns 0, or -1 when a
 * logit the row sees is NaN or +-Inf (the problem goes to the reference). */
static inline int FAST_FN(row)(fast_row *r, const float *q, const float *kt, int64_t c0,
                               int64_t lo, int64_t hi, int64_t pos, int d, float scale,
                               float softcap, const row_mask *mk)
{
    static const int32_t lanes[8] = {0, 1, 2, 3, 4, 5, 6, 7};
    const vf zero = {0}, ninf = zero - INFINITY;
    vi lane;
    memcpy(&lane, lanes, sizeof lane);
    vf chk = zero; /* NaN in a lane once a logit the row sees is NaN or +-Inf */
    vblk s;
    for (int64_t b0 = ((lo - c0) / BLK) * BLK; b0 <= hi - c0; b0 += BLK) {
        FAST_FN(block_logits)(&s, q, kt + b0 * d, d, scale);
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
                vi in = (lane + VW * j >= a) & (lane + VW * j <= z);
                chk += (vf)((vi)s.v[j] & in) * 0.0f;
                s.v[j] = FAST_FN(vsel)(in, s.v[j], ninf);
            }
            tmax = FAST_FN(hmax)(&s);
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
        if (nv > 0) {
            if (r->nvis == 0) { /* the row's first visible key: the lowest lane taking part */
                float sv[BLK];
                memcpy(sv, &s, sizeof sv);
                int t = a;
                while (t < z && sv[t] == -INFINITY)
                    t++;
                r->first = sv[t];
            }
            vblk dist; /* |pos - j| for the block's keys, j = c0 + b0 + lane */
            const vf lanef = __builtin_convertvector(lane, vf);
            const float base = (float)(c0 + b0 - pos);
#pragma GCC unroll 4
            for (int j = 0; j < NV; j++) {
                vf x = lanef + (base + (float)(VW * j));
                dist.v[j] = FAST_FN(vsel)(x < 0.0f, -x, x);
            }
            FAST_FN(block_fold)(r, &s, &dist, tmax);
        }
        r->nvis += nv;
    }
    float c = FAST_FN(lanes_sum)(chk);
    return c != c ? -1 : 0;
}

/* Computes p here; returns 1 when it must go to the reference instead (nothing written). */
static int FAST_FN(compute)(const stats_problem *p, stats_cpu_fast_workspace *ws,
                            stats_head *heads, float *row_entropy, float *row_maxlogit)
{
    const int packed = p->cu_seqlens_q != NULL;
    const int d = p->head_dim, group = p->heads_q / p->heads_kv;
    const float scale = p->scale > 0.0f ? p->scale : (float)(1.0 / sqrt((double)d));
    const double collapse = p->collapse_threshold > 0.0f ? p->collapse_threshold
                                                         : STATS_DEFAULT_COLLAPSE;
    const int sampled = p->sample_every > 1 || p->sample_rows > 0;
    const int qdirect = p->dtype == STATS_F32 && p->compute_dtype == STATS_F32;
    head_acc *acc = ws->acc;
    for (int h = 0; h < p->heads_q; h++)
        acc_init(&acc[h]);
    int64_t last_vis = -1;
    double last_logv = 0.0;

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
                rows[r] = (fast_row){-INFINITY, -INFINITY, 0.0, 0.0, 0, 0.0f, 0.0};
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
                        const float *qrow = qsrc;
                        if (!qdirect) {
                            load_run(ws->qf, qsrc, d, p->dtype, p->compute_dtype);
                            qrow = ws->qf;
                        }
                        row_mask mk = {NULL, p->mask_dtype};
                        if (p->mask.ptr)
                            mk.row = elem(&p->mask, p->mask_dtype, b, h, i);
                        if (FAST_FN(row)(&rows[g * nsamp + sj], qrow, ws->kt, c0, lo, hi, i + off,
                                         d, scale, p->softcap, &mk))
                            return 1;
                    }
                }
            }
            for (int g = 0; g < group; g++) {
                int h = kvh * group + g;
                /* the head's sink: one more outcome, folded into each row's final state */
                const double sink = head_sink(p, h);
                const int has_sink = sink != -INFINITY, sink_ok = sink < INFINITY;
                for (int64_t sj = 0; sj < nsamp; sj++) {
                    int64_t i = stats_row_of_sample((uint32_t)sj, (uint32_t)lq, p->sample_every,
                                                    p->sample_rows, p->sample_seed);
                    const fast_row *rs = &rows[g * nsamp + sj];
                    if (rs->nvis == 0) {
                        acc[h].rows_empty++;
                        continue;
                    }
                    double m = rs->m, l = rs->l, w = rs->w;
                    row_result r = {0.0, rs->mraw, rs->nvis + has_sink, 1, 0.0, 0.0};
                    if (has_sink && !sink_ok) { /* a NaN or +inf sink: the row is non-finite */
                        r.entropy = r.max_logit = r.sink_mass = r.distance = NAN;
                        r.finite = 0;
                        acc_row_logv(&acc[h], &r, collapse, 0.0);
                        row_out(p, tb, h, q0, i, &r, row_entropy, row_maxlogit);
                        continue;
                    }
                    if (has_sink)
                        sink_fold(&m, &l, &w, sink);
                    row_sink_distance(rs->m, rs->first, rs->dsum, m, l, &r.sink_mass,
                                      &r.distance);
                    double hh = log(l) - w / l;
                    r.entropy = hh > 0.0 ? hh : 0.0;
                    if (r.outcomes != last_vis) {
                        last_vis = r.outcomes;
                        last_logv = last_vis >= 2 ? log((double)last_vis) : 0.0;
                    }
                    acc_row_logv(&acc[h], &r, collapse, last_logv);
                    row_out(p, tb, h, q0, i, &r, row_entropy, row_maxlogit);
                }
            }
        }
    }
    for (int h = 0; h < p->heads_q; h++)
        acc_finish(&acc[h], sampled, &heads[h]);
    return 0;
}

#undef vf
#undef vi
#undef vblk
#undef NV
