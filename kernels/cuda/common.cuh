/* common.cuh — device code every statistics kernel shares: the math of a row, the problem on the
 * device, the per-CTA partials, and the sm_80 instructions (cp.async, ldmatrix, mma.sync). CUDA
 * C++, device only; stage: the CUDA backend of stats.h. Included by the kernel files (mma_sm80.cu,
 * wgmma_sm90.cu, wgf_sm90.cu, generic.cu); includes kernels.h and stats.h. No -rdc: everything
 * here is inline, a template, or a file-local (static) function, so that each file compiles its
 * own copy; every kernel file calls each static function (an unused one would be an error).
 *
 * The math, per row, in base 2 (u = log2(e) * (s - m), m the true running max):
 *   l = sum 2^u,  W = sum 2^u * u,  H = ln2 * (log2 l - W / l) nats,
 *   when the max grows by d = M_old - M_new < 0, a = 2^d:  W <- a*W + a*d*l,  l <- a*l
 * guarded when M_old = -inf (l = W = 0 then; d*l would be -inf*0). This is stats_cpu.c's shifted
 * accumulator (w = sum e^t * t with t = s - m <= 0, H = log l - w / l) with log2(e) folded into
 * the scale. Masked keys are selected out, never fed through -inf, so that a NaN or Inf logit is
 * still noticed: +Inf makes M infinite, NaN makes l NaN, -Inf (with a finite max) makes
 * 2^u * u = 0 * -inf = NaN in W. A row is non-finite exactly when M, l or W is, which matches
 * stats_cpu()'s "some visible logit is not finite". The max is taken over the raw dot products:
 * scaling and softcap are increasing, so the max of the logits is the logit of the max dot product.
 * An attention sink (stats.h) is one more outcome of the row, merged into its final (M, l, W) by
 * row_done; no inner loop sees it.
 *
 * Index conventions of every statistics kernel: grid (blocks_per_head, Hq); CTA (x, h) takes the
 * sampled rows [f, f + BM) of sequence seq (cta_sequence: x -> (seq, blk)), f = blk * BM less the
 * first block's shortfall (block_first_sample: the tensor-core kernels; the CUDA-core one takes
 * f = blk * BM); per-row
 * outputs are [B, Hq, Nq] (packed: [1, Hq, total]), row (tb, h, q0 + i) at
 * ((tb * Hq + h) * len_q + q0 + i). */
#ifndef ATTNSTAT_CUDA_COMMON_CUH
#define ATTNSTAT_CUDA_COMMON_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <math.h>

#include "kernels.h"
#include "stats.h"

/* ---- exp2, tanh ------------------------------------------------------------------------------ */

static __device__ __forceinline__ float ex2(float x)
{
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

/* tanh(y) = 1 - 2 / (1 + e^(2y)); absolute error ~1e-7, exact limits at +-inf, NaN stays NaN. */
static __device__ __forceinline__ float tanh_fast(float y)
{
    float e = ex2(y * (2.0f * LOG2E_F));
    return 1.0f - __fdividef(2.0f, 1.0f + e);
}

/* 2^x on the FMA pipe, for x <= 0 (the fold's u): x = n + f with n = rint(x), f in [-1/2, 1/2],
 * 2^f by a degree-5 polynomial (coefficients fitted here for minimax relative error on [-1/2, 1/2];
 * max relative error 2.1e-7 in float32 Horner), 2^n added to the exponent bits. x is clamped at
 * -126 (the result is then < 2^-125, a denormal: negligible next to l >= 1) so that the exponent
 * never wraps; NaN also becomes -126 here, which is fine because the fold keeps the unclamped u
 * for W (W = NaN then, so the row is still reported non-finite). Moves work off MUFU. */
static __device__ __forceinline__ float ex2_poly(float x)
{
    x = fmaxf(x, -126.0f);
    const float t = __fadd_rn(x, 12582912.0f); /* 1.5 * 2^23: round to an integer in the low bits */
    const float n = __fsub_rn(t, 12582912.0f);
    const float f = __fsub_rn(x, n);
    float q = 1.327647245e-03f;
    q = fmaf(q, f, 9.675540961e-03f);
    q = fmaf(q, f, 5.550713092e-02f);
    q = fmaf(q, f, 2.402212024e-01f);
    q = fmaf(q, f, 6.931469440e-01f);
    q = fmaf(q, f, 1.000000119e+00f);
    return __int_as_float(__float_as_int(q) + (__float_as_int(t) << 23));
}

/* ---- sm_80 instructions: cp.async, ldmatrix, mma.sync ---------------------------------------- */

static __device__ __forceinline__ unsigned smem_u32(const void *p)
{
    return (unsigned)__cvta_generic_to_shared(p);
}

/* 16-byte asynchronous copy global -> shared; bytes < 16 are read, the rest zero-filled. */
static __device__ __forceinline__ void cp_async16(void *dst, const void *src, int bytes)
{
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_u32(dst)), "l"(src),
                 "r"(bytes));
}
/* The same to a shared-memory address (a smem_u32 value: loops that step it need no conversion). */
static __device__ __forceinline__ void cp_async16_s(unsigned dst, const void *src, int bytes)
{
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(bytes));
}
static __device__ __forceinline__ void cp_async_commit(void)
{
    asm volatile("cp.async.commit_group;\n" ::);
}
template <int N> static __device__ __forceinline__ void cp_async_wait(void)
{
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}
/* An arrival on the mbarrier at bar once this thread's earlier cp.async copies have landed (one of
 * the arrivals it was initialised to expect; the thread goes on at once). sm_80 and later. */
static __device__ __forceinline__ void cp_async_mbar_arrive(unsigned long long *bar)
{
    asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(smem_u32(bar))
                 : "memory");
}

static __device__ __forceinline__ void ldmatrix_x4(unsigned (&r)[4], const void *p)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_u32(p)));
}

template <bool F16>
static __device__ __forceinline__ void mma16816(float (&c)[4], const unsigned (&a)[4], unsigned b0,
                                                unsigned b1)
{
    if (F16)
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, "
                     "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                     : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    else
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, "
                     "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                     : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* ---- the problem on the device: which rows a CTA takes, which keys a row sees ---------------- */

struct seqinfo {
    int seq, blk, q0, lq, k0, lk, nsamp, tb;
};

static __device__ __forceinline__ int sampled_count_dev(const kparams &p, int lq)
{
    if (lq <= 0)
        return 0;
    if (p.sample_rows > 0)
        return p.sample_rows < lq ? p.sample_rows : lq;
    if (p.sample_every > 1)
        return (int)(((long long)lq + p.sample_every - 1) / p.sample_every);
    return lq;
}

/* A gated kernel whose path the mask's analysis did not choose (kparams.gate): it returns before
 * touching anything. */
static __device__ __forceinline__ bool gate_closed(const int *gate, int gate_general)
{
    return gate && ((*(const volatile int *)gate != 0) != (gate_general != 0));
}

static __device__ __forceinline__ int clampi(int v, int lo, int hi)
{
    return v < lo ? lo : (v > hi ? hi : v);
}

/* Which (sequence, block) CTA x of a head works on; false when x is past the last block. */
static __device__ bool cta_sequence(const kparams &p, int x, seqinfo *s)
{
    if (!p.packed) {
        const unsigned q = (unsigned)x / (unsigned)p.nblk; /* x >= 0, nblk >= 1: unsigned, cheaper */
        s->seq = (int)q;
        s->blk = x - (int)q * p.nblk;
        if (s->seq >= p.batch)
            return false;
        s->q0 = 0, s->lq = p.len_q, s->k0 = 0, s->lk = p.len_k, s->tb = s->seq;
    } else {
        if (x >= p.blk_off[p.batch])
            return false;
        int lo = 0, hi = p.batch - 1; /* last sequence whose first block is <= x */
        while (lo < hi) {
            int mid = (lo + hi + 1) >> 1;
            if (p.blk_off[mid] <= x)
                lo = mid;
            else
                hi = mid - 1;
        }
        s->seq = lo;
        s->blk = x - p.blk_off[lo];
        int q0 = clampi(p.cu_q[lo], 0, p.len_q), q1 = clampi(p.cu_q[lo + 1], q0, p.len_q);
        int k0 = clampi(p.cu_k[lo], 0, p.len_k), k1 = clampi(p.cu_k[lo + 1], k0, p.len_k);
        s->q0 = q0, s->lq = q1 - q0, s->k0 = k0, s->lk = k1 - k0, s->tb = 0;
    }
    s->nsamp = sampled_count_dev(p, s->lq);
    return true;
}

/* The first sampled row (index among the sequence's sampled rows) of block si.blk of BM rows. The
 * blocks end at the sequence's last sampled row, so that the one partial block is the first: its
 * rows are the lowest, which see the fewest keys when the run is causal. A CTA takes as long as
 * its longest row, so a partial block of the longest rows held a CTA as long as a full one for a
 * fraction of its work (bench/kernel_notes.md, round 9). Indices below 0 are no row (-1), as those
 * past the last were before. */
static __device__ __forceinline__ int block_first_sample(const seqinfo &si, int BM)
{
    const int part = si.nsamp % BM;
    return si.blk * BM - (part ? BM - part : 0);
}

/* Visible keys [lo, hi] of row i of head h in sequence si (lo > hi: none): causal and the window,
 * intersected with the row's interval of an interval mask (p.rr). */
static __device__ __forceinline__ void visible_range(const kparams &p, const seqinfo &si, int h,
                                                     int i, int *lo_out, int *hi_out)
{
    const int lq = si.lq, lk = si.lk;
    long long o = (long long)lk - lq, lo = 0, hi = (long long)lk - 1, a = i + o;
    if (p.causal && a < hi)
        hi = a;
    if (p.wr >= 0 && a + p.wr < hi)
        hi = a + p.wr;
    if (p.wl >= 0 && a - p.wl > lo)
        lo = a - p.wl;
    if (p.rr) {
        const int2 r = p.rr[((long long)(p.rr_mb > 1 ? si.tb : 0) * p.rr_mh +
                             (p.rr_mh > 1 ? h : 0)) * p.len_q + i];
        lo = r.x > lo ? r.x : lo;
        hi = r.y < hi ? r.y : hi;
    }
    if (lo > hi)
        lo = 1, hi = 0;
    *lo_out = (int)lo;
    *hi_out = (int)hi;
}

/* visible_range for the usual run, causal or full rows with no window and no interval mask
 * (plain(p)): in 32 bits, since lq and lk are at most 2^30 (stats_validate) and 0 <= i < lq, so
 * i + lk - lq cannot overflow (the windows' sums can). The same [lo, hi] as visible_range. */
static __device__ __forceinline__ bool plain(const kparams &p)
{
    return !p.rr && p.wl < 0 && p.wr < 0;
}
static __device__ __forceinline__ void visible_range_plain(const kparams &p, const seqinfo &si,
                                                           int i, int *lo_out, int *hi_out)
{
    const int a = i + (si.lk - si.lq), last = si.lk - 1, hi = p.causal && a < last ? a : last;
    *lo_out = hi >= 0 ? 0 : 1;
    *hi_out = hi >= 0 ? hi : 0;
}

/* The block's keys: range[0] = the least first visible key, range[1] = the greatest last one, over
 * rows[t0], rows[t0 + nt], ... of its BM rows (-1: no row). range is preset to {INT_MAX, -1}; the
 * rows are written and visible to these threads. */
template <int BM>
static __device__ __forceinline__ void block_key_range(const kparams &p, const seqinfo &si, int h,
                                                       const int *rows, int *range, int t0, int nt)
{
    for (int r = t0; r < BM; r += nt) {
        if (rows[r] >= 0) {
            int lo, hi;
            visible_range(p, si, h, rows[r], &lo, &hi);
            if (lo <= hi) {
                atomicMin(&range[0], lo);
                atomicMax(&range[1], hi);
            }
        }
    }
}

/* Up to 8 float32 values at src (n of them: 0..8, the rest zero) rounded to bf16 or f16 (round to
 * nearest even) and stored as one 16-byte chunk at dst (shared memory, 16-byte aligned): the
 * tensor-core kernels' load of float32 tensors. src is 16-byte aligned when n == 8. */
template <bool F16>
static __device__ __forceinline__ void st_chunk_from_f32(void *dst, const float *src, int n)
{
    float v[8];
    if (n == 8) {
        const float4 a = __ldg((const float4 *)src), b = __ldg((const float4 *)src + 1);
        v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
    } else {
#pragma unroll
        for (int e = 0; e < 8; e++)
            v[e] = e < n ? __ldg(src + e) : 0.0f;
    }
    unsigned w[4];
#pragma unroll
    for (int e = 0; e < 4; e++) {
        if (F16) {
            __half2 hv = __floats2half2_rn(v[2 * e], v[2 * e + 1]);
            w[e] = *(unsigned *)&hv;
        } else {
            __nv_bfloat162 bv = __floats2bfloat162_rn(v[2 * e], v[2 * e + 1]);
            w[e] = *(unsigned *)&bv;
        }
    }
    *(uint4 *)dst = make_uint4(w[0], w[1], w[2], w[3]);
}

/* ---- per-CTA partials: one finished row into a part, a block's parts into one ---------------- */

/* What a tensor-core instance's fold computes (its template argument FW; launch.cu takes the
 * instance by stats_problem.want): FOLD_BASE entropy and max logit, FOLD_XS also sink mass and
 * distance, FOLD_MAX the max logit alone (no exps: a run that asks for max_logit and nothing else;
 * bench/kernel_notes.md has what each costs). */
enum { FOLD_BASE = 0, FOLD_XS = 1, FOLD_MAX = 2 };

/* XS: the kernel computes sink mass and distance; without, their sums are NaN from the start and
 * neither row_done<false> nor the merges below touch them (no per-row work, no shuffles). ent =
 * false (FOLD_MAX): the entropy sums are NaN from the start (reduce_heads then gives NaN for every
 * entropy statistic, never a number the kernel did not compute). */
static __device__ __forceinline__ void part_init(part &a, bool xs = true, bool ent = true)
{
    a.rows = a.rows_norm = a.rows_empty = a.nonfinite = a.collapsed = a.pad = 0;
    a.sum = a.sumsq = a.sum_norm = ent ? 0.0 : (double)NAN;
    a.hmin = INFINITY, a.hmax = -INFINITY, a.mmax = -INFINITY, a.pad2 = 0.0f;
    a.sum_sink = a.sum_dist = xs ? 0.0 : (double)NAN;
}

template <bool XS = true>
static __device__ __forceinline__ void part_merge(part &a, const part &b)
{
    a.rows += b.rows, a.rows_norm += b.rows_norm, a.rows_empty += b.rows_empty;
    a.nonfinite += b.nonfinite, a.collapsed += b.collapsed;
    a.sum += b.sum, a.sumsq += b.sumsq, a.sum_norm += b.sum_norm;
    a.hmin = fminf(a.hmin, b.hmin), a.hmax = fmaxf(a.hmax, b.hmax), a.mmax = fmaxf(a.mmax, b.mmax);
    if (XS)
        a.sum_sink += b.sum_sink, a.sum_dist += b.sum_dist;
}

template <bool XS = true>
static __device__ __forceinline__ void part_shfl_merge(part &a, int lane_mask)
{
    part b;
    b.rows = __shfl_xor_sync(0xffffffffu, a.rows, lane_mask);
    b.rows_norm = __shfl_xor_sync(0xffffffffu, a.rows_norm, lane_mask);
    b.rows_empty = __shfl_xor_sync(0xffffffffu, a.rows_empty, lane_mask);
    b.nonfinite = __shfl_xor_sync(0xffffffffu, a.nonfinite, lane_mask);
    b.collapsed = __shfl_xor_sync(0xffffffffu, a.collapsed, lane_mask);
    b.sum = __shfl_xor_sync(0xffffffffu, a.sum, lane_mask);
    b.sumsq = __shfl_xor_sync(0xffffffffu, a.sumsq, lane_mask);
    b.sum_norm = __shfl_xor_sync(0xffffffffu, a.sum_norm, lane_mask);
    b.hmin = __shfl_xor_sync(0xffffffffu, a.hmin, lane_mask);
    b.hmax = __shfl_xor_sync(0xffffffffu, a.hmax, lane_mask);
    b.mmax = __shfl_xor_sync(0xffffffffu, a.mmax, lane_mask);
    if (XS) {
        b.sum_sink = __shfl_xor_sync(0xffffffffu, a.sum_sink, lane_mask);
        b.sum_dist = __shfl_xor_sync(0xffffffffu, a.sum_dist, lane_mask);
    }
    part_merge<XS>(a, b);
}

/* ---- attention sinks ------------------------------------------------------------------------ */

/* The sink logit of query head h in base 2 (stats.h: log2(e) * s_h), -inf when the problem has
 * none: read once per block after its tiles (per row in the CUDA-core kernel, whose registers it
 * would raise otherwise: generic.cu), handed to row_done for each row. A finite sink stays finite
 * (clamped to +-FLT_MAX where log2(e) * s_h overflows float), so it is still an outcome; NaN and
 * +inf stay as they are (row_done counts the rows non-finite). */
static __device__ __forceinline__ float head_sink(const kparams &p, int h)
{
    if (!p.sinks)
        return -INFINITY;
    float s;
    if (p.sinks_dtype == STATS_F32) {
        s = __ldg((const float *)p.sinks + h);
    } else {
        const unsigned short u = __ldg((const unsigned short *)p.sinks + h);
        s = p.sinks_dtype == STATS_BF16 ? __uint_as_float((unsigned)u << 16)
                                        : __half2float(__ushort_as_half(u));
    }
    if (s == -INFINITY || !(s < INFINITY))
        return s;
    return fminf(fmaxf(s * LOG2E_F, -3.402823466e38f), 3.402823466e38f);
}

/* A row that does not count: empty (no visible key: STATS_ROW_SKIPPED / -inf, rows_empty) or
 * non-finite (NaN / NaN, nonfinite). row_done's and row_done_max's (a template only so that a file
 * compiles it where it calls them). */
template <bool = true>
static __device__ __forceinline__ void row_uncounted(const kparams &p, part &a, long long ro,
                                                     bool empty)
{
    if (empty)
        a.rows_empty++;
    else
        a.nonfinite++;
    if (p.row_h)
        p.row_h[ro] = empty ? STATS_ROW_SKIPPED : NAN;
    if (p.row_m)
        p.row_m[ro] = empty ? -INFINITY : NAN;
}

/* One finished row: (M, l, W) in base 2 over its nvis visible keys; writes the per-row outputs
 * and folds the row into a. F: the logit of the row's first visible key (base 2, as M, the mask's
 * bias included) and D = sum 2^(s_j - M) |pos - j| (the scale of l): the row's sink mass is
 * 2^(F - M) / l and its distance D / l, with (M, l) after the sink's merge (D rescaled to that M);
 * XS = false: a kernel that does not compute them, whose part holds NaN for both (part_init):
 * nothing per row (a division by l with a NaN operand takes the slow path of IEEE division).
 * ro: index of the row in the per-row outputs. Mraw: the max logit
 * (base 2 units, as M) without an additive mask's bias; M itself where there is none. sink: the
 * head's sink logit in base 2 (head_sink), -inf for none: one more outcome, merged into the row's
 * (M, l, W) as the state (sink, 1, 0) the way the online update merges when the max moves (guarded
 * where an exponential is 0, so that no 0 * inf appears); the max logit stays the keys'. */
template <bool XS = true>
static __device__ __forceinline__ void row_done(const kparams &p, part &a, long long ro, int nvis,
                                                float M, float l, float W, float Mraw, float sink,
                                                float F, float D)
{
    if (nvis <= 0) {
        row_uncounted(p, a, ro, true);
        return;
    }
    bool finite = isfinite(M) && isfinite(l) && isfinite(W) && l > 0.0f;
    int nout = nvis;
    if (sink != -INFINITY && finite) { /* a sink: one more outcome */
        nout++;
        if (!(sink < INFINITY)) { /* NaN or +inf */
            finite = false;
        } else if (sink > M) {
            const float d = M - sink, e = ex2(d);
            W = e > 0.0f ? e * fmaf(d, l, W) : 0.0f;
            l = fmaf(e, l, 1.0f); /* the max is the sink's now: its term is 2^0 */
            if (XS)
                D *= e;
            M = sink;
        } else {
            const float d = sink - M, e = ex2(d);
            if (e > 0.0f) {
                W = fmaf(e, d, W);
                l += e;
            }
        }
    }
    if (!finite) {
        row_uncounted(p, a, ro, false);
        return;
    }
    float h = LN2_F * (log2f(l) - W / l);
    h = h > 0.0f ? h : 0.0f;
    float m = Mraw * LN2_F;
    if (XS) { /* l >= 1 here (the max's term is 2^0): one reciprocal for both */
        const float rl = 1.0f / l;
        a.sum_sink += (double)(ex2(F - M) * rl);
        a.sum_dist += (double)(D * rl);
    }
    if (p.row_h)
        p.row_h[ro] = h;
    if (p.row_m)
        p.row_m[ro] = m;
    double hd = h;
    a.rows++;
    a.sum += hd;
    a.sumsq += hd * hd;
    a.hmin = fminf(a.hmin, h);
    a.hmax = fmaxf(a.hmax, h);
    a.mmax = fmaxf(a.mmax, m);
    if (nout >= 2) {
        /* normalised by ln(nout) in float, on MUFU (log2 and reciprocal: within 3e-7 relative of
         * the double form, whose log and division were the longest chain of a block's end:
         * bench/kernel_notes.md, round 10); the per-row entropy above is unchanged */
        const float hn = __fdividef(h, LN2_F * __log2f((float)nout));
        a.rows_norm++;
        a.sum_norm += (double)hn;
        if (hn < p.collapse)
            a.collapsed++;
    }
}

/* One finished row of a FOLD_MAX kernel (the max logit alone): M its max logit (base 2, as
 * row_done's), finite whether every visible logit was finite (the fold's max of magnitudes, NaN
 * kept), sink as row_done's. The same rows count as empty, non-finite and counted as row_done's
 * would (a sink that is NaN or +inf makes the row non-finite there too), and the max logit is
 * the same number; the per-row entropy is NaN on a counted row (not computed: row_m tells it from
 * a non-finite row, whose both are NaN). A template only so that the files without a FOLD_MAX
 * instance compile no copy. */
template <bool = true>
static __device__ __forceinline__ void row_done_max(const kparams &p, part &a, long long ro,
                                                    int nvis, float M, bool finite, float sink)
{
    if (nvis <= 0) {
        row_uncounted(p, a, ro, true);
        return;
    }
    if (!finite || !isfinite(M) || (sink != -INFINITY && !(sink < INFINITY))) {
        row_uncounted(p, a, ro, false);
        return;
    }
    const float m = M * LN2_F;
    if (p.row_h)
        p.row_h[ro] = NAN;
    if (p.row_m)
        p.row_m[ro] = m;
    a.rows++;
    a.mmax = fmaxf(a.mmax, m);
}

/* max(a, b) with NaN kept (NaN if either is; fmaxf returns the other): PTX max.NaN, sm_80 and
 * newer. A template for the reason row_done_max is. */
template <bool = true> static __device__ __forceinline__ float fmax_nan(float a, float b)
{
    float d;
    asm("max.NaN.f32 %0, %1, %2;" : "=f"(d) : "f"(a), "f"(b));
    return d;
}

/* Sink mass in the tensor-core kernels (XS): a row's first visible key is lo (they take no general
 * mask), and its logit is already in the S fragment of the tile that holds key lo, as the mma
 * accumulated it (the very value the fold takes). first_key_pick copies it out, on the lane that
 * holds column lo of row hr (columns j0 + nt * 8 + 2 * tq + e of s[nt][2 * hr + e], the m16n8 and
 * wgmma accumulator layouts); f[hr] stays as it was (0) on the other lanes and tiles. Only the
 * tiles that hold some row's lo need the call (the caller's warp-uniform test); the selects keep s
 * in registers (no dynamic index). */
template <int NT>
static __device__ __forceinline__ void first_key_pick(const float (&s)[NT][4], const int (&lo)[2],
                                                      int j0, int tq, float (&f)[2])
{
#pragma unroll
    for (int hr = 0; hr < 2; hr++) {
        const int c = lo[hr] - j0;
        if (c >= 0 && c < 8 * NT && ((c >> 1) & 3) == tq) {
            const int nt = c >> 3;
            const bool odd = c & 1;
            float v = f[hr];
#pragma unroll
            for (int n = 0; n < NT; n++)
                v = n == nt ? (odd ? s[n][2 * hr + 1] : s[n][2 * hr]) : v;
            f[hr] = v;
        }
    }
}

/* The logit (base 2) of a row's first visible key from first_key_pick's values (0 on the lanes
 * that do not hold it): summed over the quad, then scaled and softcapped as the fold's. Every lane
 * of the warp calls it (the shuffles take the whole warp); NaN when the row has none (!valid). */
static __device__ __forceinline__ float quad_first_logit(const kparams &p, float f, bool valid)
{
    f += __shfl_xor_sync(0xffffffffu, f, 1);
    f += __shfl_xor_sync(0xffffffffu, f, 2);
    if (!valid)
        return NAN;
    return p.softcap ? p.cl * tanhf(f * p.sc) : f * p.c;
}

/* Reduce one part per thread over the block (blockDim.x multiple of 32, <= 1024) into out;
 * a fixed order, so the result never depends on scheduling. NW > 0: over the first NW warps alone,
 * meeting at named barrier 2 (the warp-specialised kernels, whose producer warps do not take
 * part), and again after the merge (a persistent CTA reduces one block after another). */
template <int NW = 0, bool XS = true> static __device__ void block_store_part(part &a, part *out)
{
    __shared__ part s_warp[NW > 0 ? NW : 32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int nw = NW > 0 ? NW : blockDim.x >> 5;
    for (int m = 1; m < 32; m <<= 1)
        part_shfl_merge<XS>(a, m);
    if (lane == 0)
        s_warp[warp] = a;
    if (NW > 0)
        asm volatile("bar.sync 2, %0;\n" ::"n"(NW * 32) : "memory");
    else
        __syncthreads();
    if (threadIdx.x == 0) {
        part t = s_warp[0];
        for (int w = 1; w < nw; w++)
            part_merge<XS>(t, s_warp[w]);
        *out = t;
    }
    if (NW > 0) /* s_warp read before a persistent CTA's next block writes it */
        asm volatile("bar.sync 2, %0;\n" ::"n"(NW * 32) : "memory");
}

/* ---- row-state merge ------------------------------------------------------------------------- */

/* Merge base-2 row state (M2, l2, W2) into (M, l, W). */
static __device__ __forceinline__ void state_merge(float &M, float &l, float &W, float M2, float l2,
                                                   float W2)
{
    if (!(l2 != 0.0f || W2 != 0.0f))
        return; /* empty side (l2 == 0 and W2 == 0) */
    if (!(l != 0.0f || W != 0.0f)) {
        M = M2, l = l2, W = W2;
        return;
    }
    float Mn = fmaxf(M, M2);
    float d1 = M - Mn, d2 = M2 - Mn;
    float a1 = M == Mn ? 1.0f : ex2(d1), a2 = M2 == Mn ? 1.0f : ex2(d2);
    float t1 = M == Mn ? 0.0f : a1 * d1, t2 = M2 == Mn ? 0.0f : a2 * d2;
    W = a1 * W + t1 * l + a2 * W2 + t2 * l2;
    l = a1 * l + a2 * l2;
    M = Mn;
}

/* ---- the fold of mma.sync and wgmma (variants 0 and 4) --------------------------------------- */

/* One tile of logits s[mt][nt][4] (m16n8 accumulator layout: this lane holds rows g and g + 8 of
 * each m16 tile, keys j0 + nt*8 + 2*tq + e, e < 2) folded into the row states M[mt][hr] (the quad's
 * true max, after two shuffles) and l, W[mt][hr][e] (this lane's keys). lo/hi: each row's visible
 * keys; MASK: some key of the tile is outside them. XS: also D[mt][hr] += e |pos - j| per key
 * (this lane's keys; b = j0 + 2 tq - pos per row and tile, c the key's offset: FADD, abs, FFMA),
 * rescaled with l; without XS the code is as before. */
template <int MT, int NT, bool CAP, bool MASK, int POLY, bool XS = false>
static __device__ __forceinline__ void fold_tile(const kparams &p, float (&s)[MT][NT][4],
                                                 float (&M)[MT][2], float (&l)[MT][2][2],
                                                 float (&W)[MT][2][2], const int (&lo)[MT][2],
                                                 const int (&hi)[MT][2], int j0, int tq,
                                                 float (*D)[2] = nullptr,
                                                 const int (*pos)[2] = nullptr)
{
    /* POLY of every 4 n8 column blocks take ex2_poly (FMA pipe), the rest MUFU */
#pragma unroll
    for (int mt = 0; mt < MT; mt++) {
#pragma unroll
        for (int hr = 0; hr < 2; hr++) {
            if (MASK) {
#pragma unroll
                for (int nt = 0; nt < NT; nt++)
#pragma unroll
                    for (int e = 0; e < 2; e++) {
                        int j = j0 + nt * 8 + 2 * tq + e;
                        if (j < lo[mt][hr] || j > hi[mt][hr])
                            s[mt][nt][2 * hr + e] = -INFINITY;
                    }
            }
            float mx = -INFINITY;
#pragma unroll
            for (int nt = 0; nt < NT; nt++)
                mx = fmaxf(mx, fmaxf(s[mt][nt][2 * hr], s[mt][nt][2 * hr + 1]));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
            const float Mt = CAP ? p.cl * tanhf(mx * p.sc) : mx * p.c;
            const float Mo = M[mt][hr], Mn = fmaxf(Mo, Mt);
            if (Mn != Mo) {
                const float d = Mo - Mn, a = ex2(d);
                const float ad = Mo > -INFINITY ? a * d : 0.0f;
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    W[mt][hr][e] = fmaf(a, W[mt][hr][e], ad * l[mt][hr][e]);
                    l[mt][hr][e] *= a;
                }
                if (XS)
                    D[mt][hr] *= a;
                M[mt][hr] = Mn;
            }
            const float negM = -Mn;
            const float bj = XS ? (float)(j0 + 2 * tq - pos[mt][hr]) : 0.0f;
#pragma unroll
            for (int nt = 0; nt < NT; nt++)
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    const float v = s[mt][nt][2 * hr + e];
                    float u = CAP ? fmaf(p.cl, tanh_fast(v * p.sc), negM) : fmaf(v, p.c, negM);
                    float pe;
                    const bool poly = (nt & 3) < POLY;
                    if (MASK) {
                        const int j = j0 + nt * 8 + 2 * tq + e;
                        const bool vis = j >= lo[mt][hr] && j <= hi[mt][hr];
                        pe = vis ? (poly ? ex2_poly(u) : ex2(u)) : 0.0f;
                        u = vis ? u : 0.0f;
                    } else {
                        pe = poly ? ex2_poly(u) : ex2(u);
                    }
                    l[mt][hr][e] += pe;
                    W[mt][hr][e] = fmaf(pe, u, W[mt][hr][e]);
                    if (XS)
                        D[mt][hr] = fmaf(pe, fabsf(bj + (float)(nt * 8 + e)), D[mt][hr]);
                }
        }
    }
}

#endif /* ATTNSTAT_CUDA_COMMON_CUH */
