/* stats_cpu.c — the CPU reference backend: plain C, double accumulation, written for clarity.
 * Every other backend is tested against this file, and hosts without a GPU compute with it.
 *
 * Per row, one pass over the visible keys in tiles of TILE keys, with the shifted accumulators
 *     t = s - m <= 0,  l = sum exp(t),  w = sum exp(t) * t,  H = log(l) - w / l
 * (the form H = m + log l - r/l with r = sum exp(t) * s cancels catastrophically when the logits
 * are large and H small, the regime the alerts are for). When a tile raises the running max by
 * d = m_old - m_new < 0:
 *     l <- a * l,   w <- a * (w + d * l_old),   a = exp(d)
 * guarded on the first tile, where m = -inf and l = 0 (d * l would be -inf * 0 = NaN).
 * An attention sink is one more outcome, folded into the row's final state (row_finish).
 * Sink mass and distance: the row keeps the logit of its first visible key (keys are folded in
 * order, so the first that takes part), and dsum = sum exp(t) |pos - j| (pos = i + Lk - Lq, the
 * causal diagonal), rescaled by a with l; at the end p_first = exp(first - m) / l and
 * distance = dsum / l (row_sink_distance, with the sink folded into m and l). */
#include "stats.h"
#include "stats_cpu_common.h"

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { TILE = 64 };

/* Reads n contiguous elements of dtype dt at src into dst as doubles, each rounded to the
 * precision of the logits' inputs (compute). */
static void load_row(double *dst, const void *src, int n, stats_dtype dt, stats_dtype compute)
{
    for (int i = 0; i < n; i++)
        dst[i] = load_elem(src, i, dt, compute);
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

/* Online state of one row: running max m, l = sum exp(s - m), w = sum exp(s - m) * (s - m), over
 * the logits s with their mask's bias; mraw the max without it; nvis the keys that took part;
 * first the logit of the first of them, dsum = sum exp(s - m) |pos - j|. */
typedef struct {
    double m, l, w, mraw, first, dsum;
    int64_t nvis;
    int finite;
} row_state;

/* Folds keys [lo, hi] (indices into k, each a row of d doubles) that the mask lets through into
 * the row's state, TILE keys at a time: one max per tile, one rescale per tile when it moves. */
static void row_update(row_state *st, const double *q, const double *k, int64_t lo, int64_t hi,
                       int64_t pos, int d, double scale, double softcap, const row_mask *mk)
{
    double s[TILE], dj[TILE];
    for (int64_t j0 = lo; j0 <= hi && st->finite; j0 += TILE) {
        int nt = (int)(hi - j0 + 1 < TILE ? hi - j0 + 1 : TILE), nv = 0;
        double tmax = -INFINITY;
        for (int t = 0; t < nt; t++) {
            double bias = 0.0;
            if (mk->row && !mask_take(mk, j0 + t, &bias))
                continue;
            double x = scale * dot(q, k + (j0 + t) * d, d);
            if (softcap > 0.0)
                x = softcap * tanh(x / softcap);
            if (x > st->mraw)
                st->mraw = x;
            x += bias;
            if (!isfinite(x))
                st->finite = 0;
            dj[nv] = (double)llabs(pos - (j0 + t));
            s[nv++] = x;
            if (x > tmax)
                tmax = x;
        }
        st->nvis += nv;
        if (!st->finite)
            return; /* the row is excluded; nothing more to learn from it */
        if (nv == 0)
            continue;
        if (st->nvis == nv) /* the row's first keys */
            st->first = s[0];
        if (tmax > st->m) {
            if (st->l > 0.0) { /* guarded: on the first tile m = -inf and l = 0 */
                double dlt = st->m - tmax, a = exp(dlt);
                st->w = a * (st->w + dlt * st->l);
                st->l = a * st->l;
                st->dsum = a * st->dsum;
            }
            st->m = tmax;
        }
        for (int t = 0; t < nv; t++) {
            double tt = s[t] - st->m, e = exp(tt);
            st->l += e;
            st->w += e * tt;
            st->dsum += e * dj[t];
        }
    }
}

/* A row's result from its final state over its visible keys and its head's sink logit (-inf: no
 * sink). A sink is one more outcome: folded into (m, l, w) as the state (sink, 1, 0), the way the
 * online update merges two states; the max logit stays the keys'. A NaN or +inf sink makes the
 * row non-finite, like a NaN logit. */
static void row_finish(const row_state *st, int64_t visible, double sink, row_result *out)
{
    out->outcomes = visible;
    out->finite = st->finite;
    double m = st->m, l = st->l, w = st->w;
    if (out->finite && sink != -INFINITY) {
        out->outcomes++;
        if (sink < INFINITY) /* NaN is not */
            sink_fold(&m, &l, &w, sink);
        else
            out->finite = 0;
    }
    if (!out->finite) {
        out->entropy = out->max_logit = out->sink_mass = out->distance = NAN;
        return;
    }
    row_sink_distance(st->m, st->first, st->dsum, m, l, &out->sink_mass, &out->distance);
    double h = log(l) - w / l;
    out->entropy = h > 0.0 ? h : 0.0;
    out->max_logit = st->mraw;
}

/* ---- the whole problem -------------------------------------------------------------------- */

/* Keys are converted to double KCHUNK rows at a time, so memory stays bounded whatever the
 * length of K; each sampled row keeps its online state across chunks. */
enum { KCHUNK = 1024 };
#define MAX_ROW_STATES (1LL << 25) /* 1 GiB of row state per (sequence, KV head) */

struct stats_cpu_workspace {
    double *kbuf;       /* KCHUNK x STATS_MAX_HEAD_DIM */
    double *qbuf;       /* STATS_MAX_HEAD_DIM */
    row_state *rows;    /* group x sampled rows */
    int64_t rows_cap;
    head_acc *acc;      /* heads_q */
    int64_t acc_cap;
};

stats_cpu_workspace *stats_cpu_workspace_new(void)
{
    stats_cpu_workspace *ws = calloc(1, sizeof *ws);
    if (!ws)
        return NULL;
    ws->kbuf = malloc(sizeof(double) * KCHUNK * STATS_MAX_HEAD_DIM);
    ws->qbuf = malloc(sizeof(double) * STATS_MAX_HEAD_DIM);
    if (!ws->kbuf || !ws->qbuf) {
        stats_cpu_workspace_free(ws);
        return NULL;
    }
    return ws;
}

void stats_cpu_workspace_free(stats_cpu_workspace *ws)
{
    if (!ws)
        return;
    free(ws->kbuf);
    free(ws->qbuf);
    free(ws->rows);
    free(ws->acc);
    free(ws);
}

stats_status stats_cpu_ws(const stats_problem *p, stats_cpu_workspace *ws, stats_head *heads,
                          float *row_entropy, float *row_maxlogit, stats_error *err)
{
    stats_status st = stats_validate(p, err);
    if (st != STATS_OK)
        return st;
    if (!heads || !ws) {
        if (err)
            snprintf(err->msg, sizeof err->msg, "%s is NULL", heads ? "workspace" : "heads output");
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
             sizeof(row_state)) ||
        cpu_grow((void **)&ws->acc, &ws->acc_cap, p->heads_q, sizeof(head_acc))) {
        if (err)
            snprintf(err->msg, sizeof err->msg, "out of memory for %lld row states",
                     (long long)group * max_ns);
        return STATS_ENOMEM;
    }
    head_acc *acc = ws->acc;
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
        int64_t nsamp = stats_sampled_count(p, (int32_t)lq);
        if (nsamp == 0)
            continue; /* no rows: K is not even read */
        for (int kvh = 0; kvh < p->heads_kv; kvh++) {
            row_state *rows = ws->rows; /* [g][sj] */
            for (int64_t r = 0; r < (int64_t)group * nsamp; r++)
                rows[r] = (row_state){-INFINITY, 0.0, 0.0, -INFINITY, 0.0, 0.0, 0, 1};
            for (int64_t c0 = 0; c0 < lk; c0 += KCHUNK) {
                int64_t c1 = c0 + KCHUNK - 1 < lk - 1 ? c0 + KCHUNK - 1 : lk - 1;
                int loaded = 0;
                for (int g = 0; g < group; g++) {
                    int h = kvh * group + g;
                    for (int64_t sj = 0; sj < nsamp; sj++) {
                        row_state *rs = &rows[g * nsamp + sj];
                        int64_t i = stats_row_of_sample((uint32_t)sj, (uint32_t)lq, p->sample_every,
                                                        p->sample_rows, p->sample_seed);
                        int64_t lo, hi;
                        visible_range(p, i, off, lk, &lo, &hi);
                        lo = lo > c0 ? lo : c0;
                        hi = hi < c1 ? hi : c1;
                        if (lo > hi || !rs->finite)
                            continue;
                        if (!loaded) { /* this chunk of K, converted once for the whole group */
                            for (int64_t j = c0; j <= c1; j++)
                                load_row(ws->kbuf + (j - c0) * d,
                                         elem(&p->k, p->dtype, tb, kvh, k0 + j), d, p->dtype,
                                         p->compute_dtype);
                            loaded = 1;
                        }
                        load_row(ws->qbuf, elem(&p->q, p->dtype, tb, h, q0 + i), d, p->dtype,
                                 p->compute_dtype);
                        row_mask mk = {NULL, p->mask_dtype};
                        if (p->mask.ptr)
                            mk.row = elem(&p->mask, p->mask_dtype, b, h, i);
                        row_update(rs, ws->qbuf, ws->kbuf - c0 * d, lo, hi, i + off, d, scale,
                                   softcap, &mk);
                    }
                }
            }
            for (int g = 0; g < group; g++) {
                int h = kvh * group + g;
                const double sink = head_sink(p, h);
                for (int64_t sj = 0; sj < nsamp; sj++) {
                    int64_t i = stats_row_of_sample((uint32_t)sj, (uint32_t)lq, p->sample_every,
                                                    p->sample_rows, p->sample_seed);
                    int64_t lo, hi;
                    visible_range(p, i, off, lk, &lo, &hi);
                    const row_state *rs = &rows[g * nsamp + sj];
                    if (lo > hi || (rs->finite && rs->nvis == 0)) {
                        acc[h].rows_empty++;
                        continue;
                    }
                    row_result r;
                    row_finish(rs, rs->nvis, sink, &r);
                    acc_row(&acc[h], &r, collapse);
                    row_out(p, tb, h, q0, i, &r, row_entropy, row_maxlogit);
                }
            }
        }
    }
    for (int h = 0; h < p->heads_q; h++)
        acc_finish(&acc[h], sampled, &heads[h]);
    return STATS_OK;
}

stats_status stats_cpu(const stats_problem *p, stats_head *heads, float *row_entropy,
                       float *row_maxlogit, stats_error *err)
{
    stats_cpu_workspace *ws = stats_cpu_workspace_new();
    if (!ws) {
        if (err)
            snprintf(err->msg, sizeof err->msg, "out of memory for the CPU workspace");
        return STATS_ENOMEM;
    }
    stats_status st = stats_cpu_ws(p, ws, heads, row_entropy, row_maxlogit, err);
    stats_cpu_workspace_free(ws);
    return st;
}
