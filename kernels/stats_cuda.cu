/* stats_cuda.cu — the CUDA backend of stats.h (API in stats_cuda.h).
 *
 * Kernels, in launch order:
 *   fill_rows      sampled runs only: per-row outputs set to "not computed" (STATS_ROW_SKIPPED, -inf)
 *   packed_offsets packed runs only: first block index of each sequence (one block, a scan)
 *   stats_mma      Q.K^T on the tensor cores (mma.sync m16n8k16, bf16/f16 in, f32 out), one CTA per
 *                  (head, sequence, block of BM sampled rows); K streams through shared memory in
 *                  tiles of 64 keys (cp.async, 3 stages); each warp keeps its rows' Q fragments in
 *                  registers, computes its 16*MT x 64 logits per tile and folds them into
 *                  (M, l, W) per row; the CTA then reduces its rows into one partial.
 *   stats_generic  the same results on CUDA cores for any dtype, head_dim and stride (one warp per row)
 *   reduce_heads   one block per head: the partials, in a fixed order, into a stats_head
 *
 * The math, per row, in base 2 (u = log2(e) * (s - m), m the true running max):
 *   l = sum 2^u,  W = sum 2^u * u,  H = ln2 * (log2 l - W / l) nats,
 *   when the max grows by d = M_old - M_new < 0, a = 2^d:  W <- a*W + a*d*l,  l <- a*l
 * guarded when M_old = -inf (l = W = 0 then; d*l would be -inf*0). Masked keys are selected out,
 * never fed through -inf, so that a NaN or Inf logit is still noticed: +Inf makes M infinite, NaN
 * makes l NaN, -Inf (with a finite max) makes 2^u * u = 0 * -inf = NaN in W. A row is non-finite
 * exactly when M, l or W is, which matches stats_cpu()'s "some visible logit is not finite".
 * The max is taken over the raw dot products: scaling and softcap are increasing, so the max of
 * the logits is the logit of the max dot product. */
#include "stats_cuda.h"

#include <cuda_runtime.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- small device helpers --------------------------------------------------------------- */

#define LOG2E_F 1.4426950408889634f
#define LN2_F 0.6931471805599453f
#define LN2_D 0.6931471805599453

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
static __device__ __forceinline__ void cp_async_commit(void)
{
    asm volatile("cp.async.commit_group;\n" ::);
}
template <int N> static __device__ __forceinline__ void cp_async_wait(void)
{
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
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

static __device__ __forceinline__ float load_elem(const void *base, long long off, int dtype)
{
    if (dtype == STATS_F32)
        return ((const float *)base)[off];
    unsigned short bits = ((const unsigned short *)base)[off];
    if (dtype == STATS_BF16)
        return __uint_as_float((unsigned)bits << 16);
    /* f16 -> f32 */
    float f;
    asm("{ .reg .f16 h; mov.b16 h, %1; cvt.f32.f16 %0, h; }" : "=f"(f) : "h"(bits));
    return f;
}

/* ---- problem description on the device -------------------------------------------------- */

struct kparams {
    const char *q, *k;                     /* base pointers */
    long long qsb, qsh, qsn, ksb, ksh, ksn; /* element strides */
    int batch, hq, group, len_q, len_k, d, dtype, esize;
    int packed;
    const int *cu_q, *cu_k;
    const int *blk_off; /* packed: [batch + 1] first block of each sequence */
    int nblk;           /* not packed: blocks per sequence */
    int blocks_per_head;
    int rows_per_cta;
    float c;      /* no softcap: scale * log2(e) */
    float sc, cl; /* softcap: scale / cap, cap * log2(e) */
    int softcap;
    int causal, wl, wr;
    int sample_every, sample_rows;
    unsigned long long seed;
    float collapse;
    float *row_h, *row_m;
    int sampled;
};

/* Partial statistics of one CTA's rows. */
struct part {
    int rows, rows_norm, rows_empty, nonfinite, collapsed, pad;
    double sum, sumsq, sum_norm;
    float hmin, hmax, mmax, pad2;
};

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

static __device__ __forceinline__ int clampi(int v, int lo, int hi)
{
    return v < lo ? lo : (v > hi ? hi : v);
}

/* Which (sequence, block) CTA x of a head works on; false when x is past the last block. */
static __device__ bool cta_sequence(const kparams &p, int x, seqinfo *s)
{
    if (!p.packed) {
        s->seq = x / p.nblk;
        s->blk = x % p.nblk;
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

/* Visible keys [lo, hi] of row i (lo > hi: none). */
static __device__ __forceinline__ void visible_range(const kparams &p, int i, int lq, int lk,
                                                     int *lo_out, int *hi_out)
{
    long long o = (long long)lk - lq, lo = 0, hi = (long long)lk - 1, a = i + o;
    if (p.causal && a < hi)
        hi = a;
    if (p.wr >= 0 && a + p.wr < hi)
        hi = a + p.wr;
    if (p.wl >= 0 && a - p.wl > lo)
        lo = a - p.wl;
    if (lo > hi)
        lo = 1, hi = 0;
    *lo_out = (int)lo;
    *hi_out = (int)hi;
}

static __device__ __forceinline__ void part_init(part &a)
{
    a.rows = a.rows_norm = a.rows_empty = a.nonfinite = a.collapsed = a.pad = 0;
    a.sum = a.sumsq = a.sum_norm = 0.0;
    a.hmin = INFINITY, a.hmax = -INFINITY, a.mmax = -INFINITY, a.pad2 = 0.0f;
}

static __device__ __forceinline__ void part_merge(part &a, const part &b)
{
    a.rows += b.rows, a.rows_norm += b.rows_norm, a.rows_empty += b.rows_empty;
    a.nonfinite += b.nonfinite, a.collapsed += b.collapsed;
    a.sum += b.sum, a.sumsq += b.sumsq, a.sum_norm += b.sum_norm;
    a.hmin = fminf(a.hmin, b.hmin), a.hmax = fmaxf(a.hmax, b.hmax), a.mmax = fmaxf(a.mmax, b.mmax);
}

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
    part_merge(a, b);
}

/* One finished row: (M, l, W) in base 2 over its nvis visible keys; writes the per-row outputs
 * and folds the row into a. ro: index of the row in the per-row outputs. */
static __device__ __forceinline__ void row_done(const kparams &p, part &a, long long ro, int nvis,
                                                float M, float l, float W)
{
    if (nvis <= 0) {
        a.rows_empty++;
        if (p.row_h)
            p.row_h[ro] = STATS_ROW_SKIPPED;
        if (p.row_m)
            p.row_m[ro] = -INFINITY;
        return;
    }
    bool finite = isfinite(M) && isfinite(l) && isfinite(W) && l > 0.0f;
    if (!finite) {
        a.nonfinite++;
        if (p.row_h)
            p.row_h[ro] = NAN;
        if (p.row_m)
            p.row_m[ro] = NAN;
        return;
    }
    float h = LN2_F * (log2f(l) - W / l);
    h = h > 0.0f ? h : 0.0f;
    float m = M * LN2_F;
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
    if (nvis >= 2) {
        double hn = hd / log((double)nvis);
        a.rows_norm++;
        a.sum_norm += hn;
        if (hn < (double)p.collapse)
            a.collapsed++;
    }
}

/* Reduce one part per thread over the block (blockDim.x multiple of 32, <= 1024) into out;
 * a fixed order, so the result never depends on scheduling. */
static __device__ void block_store_part(part &a, part *out)
{
    __shared__ part s_warp[32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    for (int m = 1; m < 32; m <<= 1)
        part_shfl_merge(a, m);
    if (lane == 0)
        s_warp[warp] = a;
    __syncthreads();
    if (threadIdx.x == 0) {
        part t = s_warp[0];
        for (int w = 1; w < nw; w++)
            part_merge(t, s_warp[w]);
        *out = t;
    }
}

/* ---- fill / packed offsets ---------------------------------------------------------------- */

__global__ void fill_rows_kernel(float *row_h, float *row_m, long long n)
{
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        if (row_h)
            row_h[i] = STATS_ROW_SKIPPED;
        if (row_m)
            row_m[i] = -INFINITY;
    }
}

/* blk_off[s] = sum over sequences t < s of ceil(sampled rows of t / rows_per_cta). One block. */
__global__ void packed_offsets_kernel(kparams p, int *blk_off)
{
    __shared__ int s_sum[1024];
    const int t = threadIdx.x, nt = blockDim.x;
    const int per = (p.batch + nt - 1) / nt, s0 = t * per;
    int local = 0;
    for (int s = s0; s < s0 + per && s < p.batch; s++) {
        int q0 = clampi(p.cu_q[s], 0, p.len_q), q1 = clampi(p.cu_q[s + 1], q0, p.len_q);
        int n = sampled_count_dev(p, q1 - q0);
        local += (n + p.rows_per_cta - 1) / p.rows_per_cta;
    }
    s_sum[t] = local;
    __syncthreads();
    if (t == 0) { /* exclusive scan over threads; nt is small */
        int run = 0;
        for (int i = 0; i < nt; i++) {
            int v = s_sum[i];
            s_sum[i] = run;
            run += v;
        }
        blk_off[p.batch] = run;
    }
    __syncthreads();
    int run = s_sum[t];
    for (int s = s0; s < s0 + per && s < p.batch; s++) {
        int q0 = clampi(p.cu_q[s], 0, p.len_q), q1 = clampi(p.cu_q[s + 1], q0, p.len_q);
        int n = sampled_count_dev(p, q1 - q0);
        blk_off[s] = run;
        run += (n + p.rows_per_cta - 1) / p.rows_per_cta;
    }
}

/* ---- the tensor-core kernel ---------------------------------------------------------------- */

enum { MMA_WARPS = 8, MMA_BN = 64, MMA_STAGES = 3 };

template <int DP, int MT> struct mma_shape {
    static constexpr int BM = MMA_WARPS * 16 * MT; /* sampled rows per CTA */
    static constexpr int LD = DP + 8;              /* smem row pitch in elements: no ldmatrix conflicts */
    static constexpr size_t smem_bytes =
        (size_t)(BM + MMA_STAGES * MMA_BN) * LD * 2 + (size_t)BM * sizeof(int);
};

/* Load one tile of BN keys (rows j0 .. j0+BN-1 of the sequence) into a stage; zero past lk / d. */
template <int DP>
static __device__ __forceinline__ void load_k_tile(const kparams &p, const char *krow0,
                                                   unsigned short *dst, int j0, int lk)
{
    constexpr int CH = DP / 8, LD = DP + 8;
    for (int idx = threadIdx.x; idx < MMA_BN * CH; idx += MMA_WARPS * 32) {
        int r = idx / CH, c = idx - r * CH;
        int j = j0 + r;
        int bytes = 0;
        const char *src = p.k;
        if (j < lk) {
            int rem = (p.d - c * 8) * 2;
            bytes = rem >= 16 ? 16 : (rem > 0 ? rem : 0);
            if (bytes > 0)
                src = krow0 + ((long long)j * p.ksn + c * 8) * 2;
        }
        cp_async16(dst + r * LD + c * 8, src, bytes);
    }
}

/* One tile of logits s[mt][nt][4] (m16n8 accumulator layout) folded into the row states. */
template <int MT, int NT, bool CAP, bool MASK, int POLY>
static __device__ __forceinline__ void fold_tile(const kparams &p, float (&s)[MT][NT][4],
                                                 float (&M)[MT][2], float (&l)[MT][2][2],
                                                 float (&W)[MT][2][2], const int (&lo)[MT][2],
                                                 const int (&hi)[MT][2], int j0, int tq)
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
                M[mt][hr] = Mn;
            }
            const float negM = -Mn;
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
                }
        }
    }
}

/* grid (blocks_per_head, Hq), block 256. q: [B, Hq, Nq, D] by strides, k: [B, Hkv, Nk, D];
 * CTA (x, h) takes sampled rows [blk*BM, blk*BM + BM) of its sequence. */
template <int DP, int MT, bool F16>
__global__ void __launch_bounds__(MMA_WARPS * 32, 1) stats_mma_kernel(const kparams p, part *parts)
{
    using S = mma_shape<DP, MT>;
    constexpr int BM = S::BM, LD = S::LD, KS = DP / 16, NT = MMA_BN / 8, CH = DP / 8;
    extern __shared__ __align__(16) unsigned char smem[];
    unsigned short *sq = (unsigned short *)smem;
    unsigned short *sk = sq + BM * LD;
    int *s_row = (int *)(sk + MMA_STAGES * MMA_BN * LD);
    __shared__ int s_range[2];

    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, tq = lane & 3;
    const int h = blockIdx.y, x = blockIdx.x;
    part acc;
    part_init(acc);
    seqinfo si;
    if (!cta_sequence(p, x, &si)) {
        if (tid == 0)
            parts[(long long)h * p.blocks_per_head + x] = acc;
        return;
    }
    const int kvh = h / p.group;
    const char *qrow0 = p.q + ((long long)si.tb * p.qsb + (long long)h * p.qsh +
                               (long long)si.q0 * p.qsn) * 2;
    const char *krow0 = p.k + ((long long)si.tb * p.ksb + (long long)kvh * p.ksh +
                               (long long)si.k0 * p.ksn) * 2;

    if (tid == 0)
        s_range[0] = 0x7fffffff, s_range[1] = -1;
    for (int r = tid; r < BM; r += MMA_WARPS * 32) {
        int j = si.blk * BM + r;
        s_row[r] = j < si.nsamp ? (int)stats_row_of_sample((unsigned)j, (unsigned)si.lq,
                                                            p.sample_every, p.sample_rows, p.seed)
                                : -1;
    }
    __syncthreads();
    for (int r = tid; r < BM; r += MMA_WARPS * 32) {
        if (s_row[r] >= 0) {
            int lo, hi;
            visible_range(p, s_row[r], si.lq, si.lk, &lo, &hi);
            if (lo <= hi) {
                atomicMin(&s_range[0], lo);
                atomicMax(&s_range[1], hi);
            }
        }
    }
    /* Q rows of this CTA -> shared memory (zero for absent rows and past d). */
    for (int idx = tid; idx < BM * CH; idx += MMA_WARPS * 32) {
        int r = idx / CH, c = idx - r * CH;
        int i = s_row[r], bytes = 0;
        const char *src = p.q;
        if (i >= 0) {
            int rem = (p.d - c * 8) * 2;
            bytes = rem >= 16 ? 16 : (rem > 0 ? rem : 0);
            if (bytes > 0)
                src = qrow0 + ((long long)i * p.qsn + c * 8) * 2;
        }
        cp_async16(sq + r * LD + c * 8, src, bytes);
    }
    cp_async_commit();
    __syncthreads(); /* s_range final */
    const int t_first = s_range[1] >= 0 ? s_range[0] / MMA_BN : 0;
    const int t_last = s_range[1] >= 0 ? s_range[1] / MMA_BN : -1;
    for (int st = 0; st < MMA_STAGES - 1; st++) {
        if (t_first + st <= t_last)
            load_k_tile<DP>(p, krow0, sk + st * MMA_BN * LD, (t_first + st) * MMA_BN, si.lk);
        cp_async_commit();
    }

    /* This thread's rows: local row = warp*16*MT + mt*16 + hr*8 + g. */
    int lo[MT][2], hi[MT][2];
    int wlo_min = 0x7fffffff, wlo_max = -1, whi_min = 0x7fffffff, whi_max = -1;
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int hr = 0; hr < 2; hr++) {
            int r = warp * 16 * MT + mt * 16 + hr * 8 + g, i = s_row[r];
            lo[mt][hr] = 1, hi[mt][hr] = 0;
            if (i >= 0)
                visible_range(p, i, si.lq, si.lk, &lo[mt][hr], &hi[mt][hr]);
            if (lo[mt][hr] <= hi[mt][hr]) {
                wlo_min = min(wlo_min, lo[mt][hr]), wlo_max = max(wlo_max, lo[mt][hr]);
                whi_min = min(whi_min, hi[mt][hr]), whi_max = max(whi_max, hi[mt][hr]);
            }
        }
    for (int m = 4; m < 32; m <<= 1) {
        wlo_min = min(wlo_min, __shfl_xor_sync(0xffffffffu, wlo_min, m));
        wlo_max = max(wlo_max, __shfl_xor_sync(0xffffffffu, wlo_max, m));
        whi_min = min(whi_min, __shfl_xor_sync(0xffffffffu, whi_min, m));
        whi_max = max(whi_max, __shfl_xor_sync(0xffffffffu, whi_max, m));
    }

    cp_async_wait<MMA_STAGES - 1>(); /* Q has landed */
    __syncthreads();
    unsigned qf[MT][KS][4];
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int ks = 0; ks < KS; ks++)
            ldmatrix_x4(qf[mt][ks], sq + (warp * 16 * MT + mt * 16 + (lane & 15)) * LD + ks * 16 +
                                        (lane >> 4) * 8);

    float M[MT][2], l[MT][2][2], W[MT][2][2];
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int hr = 0; hr < 2; hr++) {
            M[mt][hr] = -INFINITY;
            l[mt][hr][0] = l[mt][hr][1] = W[mt][hr][0] = W[mt][hr][1] = 0.0f;
        }

    /* ldmatrix addressing for K: lanes 0-7 keys 0-7 col 0, 8-15 keys 0-7 col 8,
     * 16-23 keys 8-15 col 0, 24-31 keys 8-15 col 8 (two n8 tiles per x4). */
    const int kb_row = (lane & 7) + ((lane >> 4) << 3), kb_col = ((lane >> 3) & 1) * 8;

    for (int t = t_first; t <= t_last; t++) {
        const int it = t - t_first;
        cp_async_wait<MMA_STAGES - 2>();
        __syncthreads();
        if (t + MMA_STAGES - 1 <= t_last)
            load_k_tile<DP>(p, krow0, sk + ((it + MMA_STAGES - 1) % MMA_STAGES) * MMA_BN * LD,
                            (t + MMA_STAGES - 1) * MMA_BN, si.lk);
        cp_async_commit();

        const int j0 = t * MMA_BN, j1 = j0 + MMA_BN - 1;
        if (j0 > whi_max || j1 < wlo_min)
            continue; /* no row of this warp sees this tile */
        const unsigned short *kt = sk + (it % MMA_STAGES) * MMA_BN * LD;

        float s[MT][NT][4];
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int nt = 0; nt < NT; nt++)
                s[mt][nt][0] = s[mt][nt][1] = s[mt][nt][2] = s[mt][nt][3] = 0.0f;
#pragma unroll
        for (int ks = 0; ks < KS; ks++) {
#pragma unroll
            for (int np = 0; np < NT / 2; np++) {
                unsigned b[4];
                ldmatrix_x4(b, kt + (np * 16 + kb_row) * LD + ks * 16 + kb_col);
#pragma unroll
                for (int mt = 0; mt < MT; mt++) {
                    mma16816<F16>(s[mt][2 * np], qf[mt][ks], b[0], b[1]);
                    mma16816<F16>(s[mt][2 * np + 1], qf[mt][ks], b[2], b[3]);
                }
            }
        }
        const bool full = j0 >= wlo_max && j1 <= whi_min;
        if (p.softcap) {
            if (full)
                fold_tile<MT, NT, true, false, 0>(p, s, M, l, W, lo, hi, j0, tq);
            else
                fold_tile<MT, NT, true, true, 0>(p, s, M, l, W, lo, hi, j0, tq);
        } else {
            if (full)
                fold_tile<MT, NT, false, false, 0>(p, s, M, l, W, lo, hi, j0, tq);
            else
                fold_tile<MT, NT, false, true, 0>(p, s, M, l, W, lo, hi, j0, tq);
        }
    }
    cp_async_wait<0>();

    /* Rows: sum the four lanes of each quad, lane tq == 0 finishes the row. */
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int hr = 0; hr < 2; hr++) {
            float lr = l[mt][hr][0] + l[mt][hr][1], wr = W[mt][hr][0] + W[mt][hr][1];
            lr += __shfl_xor_sync(0xffffffffu, lr, 1);
            wr += __shfl_xor_sync(0xffffffffu, wr, 1);
            lr += __shfl_xor_sync(0xffffffffu, lr, 2);
            wr += __shfl_xor_sync(0xffffffffu, wr, 2);
            int r = warp * 16 * MT + mt * 16 + hr * 8 + g, i = s_row[r];
            if (tq == 0 && i >= 0) {
                long long ro = ((long long)si.tb * p.hq + h) * p.len_q + si.q0 + i;
                row_done(p, acc, ro, hi[mt][hr] - lo[mt][hr] + 1, M[mt][hr], lr, wr);
            }
        }
    block_store_part(acc, &parts[(long long)h * p.blocks_per_head + x]);
}

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

/* ---- the Hopper kernel (wgmma, sm_90a) -------------------------------------------------------- */

/* D[64 x N] (+)= A[64 x 16] * B[16 x N], N = 8 * NT. A from registers (RS: each warp its 16 rows in
 * the mma.m16n8k16 A layout) or from shared memory (SS: described by adesc, K-major core matrices);
 * B from shared memory (K-major, bdesc); d is this warp's 16 x N slice in the m16n8 accumulator
 * layout. Asynchronous: wgmma_wait() before reading d. */
template <int NT, bool SS, bool F16> struct wgmma_op;
template <> struct wgmma_op<8, false, false> {
    static __device__ __forceinline__ void run(float (&d)[8][4], const unsigned (&a)[4],
                                               unsigned long long adesc, unsigned long long bdesc,
                                               int accumulate)
    {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
                     "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, "
                     "{%32,%33,%34,%35}, %36, p, 1, 1, 0;\n}\n"
                     : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(bdesc), "r"(accumulate));
#endif
        (void)a, (void)adesc;
    }
};
template <> struct wgmma_op<8, false, true> {
    static __device__ __forceinline__ void run(float (&d)[8][4], const unsigned (&a)[4],
                                               unsigned long long adesc, unsigned long long bdesc,
                                               int accumulate)
    {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 "
                     "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, "
                     "{%32,%33,%34,%35}, %36, p, 1, 1, 0;\n}\n"
                     : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(bdesc), "r"(accumulate));
#endif
        (void)a, (void)adesc;
    }
};
template <> struct wgmma_op<8, true, false> {
    static __device__ __forceinline__ void run(float (&d)[8][4], const unsigned (&a)[4],
                                               unsigned long long adesc, unsigned long long bdesc,
                                               int accumulate)
    {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
                     "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, "
                     "%32, %33, p, 1, 1, 0, 0;\n}\n"
                     : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3])
                     : "l"(adesc), "l"(bdesc), "r"(accumulate));
#endif
        (void)a, (void)adesc;
    }
};
template <> struct wgmma_op<8, true, true> {
    static __device__ __forceinline__ void run(float (&d)[8][4], const unsigned (&a)[4],
                                               unsigned long long adesc, unsigned long long bdesc,
                                               int accumulate)
    {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 "
                     "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, "
                     "%32, %33, p, 1, 1, 0, 0;\n}\n"
                     : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3])
                     : "l"(adesc), "l"(bdesc), "r"(accumulate));
#endif
        (void)a, (void)adesc;
    }
};

__device__ __forceinline__ void wgmma_fence(void)
{
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void wgmma_commit(void)
{
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#endif
}
/* Wait until at most N groups are in flight; d (the accumulator that must be complete) is marked
 * as written here so that the compiler reads it only afterwards. reg_fence: the same barrier to the
 * compiler, with no instruction. */
template <int N, int NT> struct wgmma_wait_op;
template <int NT> struct reg_fence_op;
template <> struct wgmma_wait_op<0, 8> {
    static __device__ __forceinline__ void run(float (&d)[8][4])
    {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
        asm volatile("wgmma.wait_group.sync.aligned 0;\n" : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3]) : : "memory");
#endif
    }
};
template <> struct wgmma_wait_op<1, 8> {
    static __device__ __forceinline__ void run(float (&d)[8][4])
    {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
        asm volatile("wgmma.wait_group.sync.aligned 1;\n" : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3]) : : "memory");
#endif
    }
};
template <> struct reg_fence_op<8> {
    static __device__ __forceinline__ void run(float (&d)[8][4])
    {
        asm volatile("" : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3]) : : "memory");
    }
};
template <int N, int NT> static __device__ __forceinline__ void wgmma_wait(float (&d)[NT][4])
{
    wgmma_wait_op<N, NT>::run(d);
}
template <int NT> static __device__ __forceinline__ void reg_fence(float (&d)[NT][4])
{
    reg_fence_op<NT>::run(d);
}
__device__ __forceinline__ void fence_proxy_async(void)
{
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}

/* K stages: PF tiles are in flight ahead of the one being multiplied, and the stage of the tile
 * being folded is not overwritten (STAGES = PF + 2). */
enum { WG_N = 3, WG_STAGES = 4, WG_PF = WG_STAGES - 2 };

/* BN keys per tile (64: wgmma m64n64; 128-key tiles were measured slower and their m64n128
 * wrappers removed, bench/kernel_notes.md); SS: Q read by wgmma from shared memory
 * (core-matrix layout, no Q registers), else Q fragments in registers (padded rows, ldmatrix). */
template <int DP, int NWG, int BN, bool SS> struct wg_shape {
    static constexpr int BM = NWG * 64;         /* sampled rows per CTA: 64 per warpgroup */
    static constexpr int LDQ = SS ? DP : DP + 8; /* Q pitch (RS: ldmatrix, no conflicts) */
    static constexpr int KTILE = BN * DP;       /* elements of one K stage */
    static constexpr size_t smem_bytes =
        (size_t)WG_STAGES * KTILE * 2 + (size_t)BM * LDQ * 2 + (size_t)BM * sizeof(int);
};

/* One tile of BN keys in the no-swizzle K-major core-matrix layout that wgmma reads: the 16-byte
 * chunk c of key n lies at byte ((n / 8) * CH + c) * 128 + (n % 8) * 16. A warp writes 512
 * contiguous bytes and reads 8 keys x 64 contiguous bytes. Zero past lk and past d. */
template <int DP, int BN, int NTH>
static __device__ __forceinline__ void load_k_tile_cm(const kparams &p, const char *krow0,
                                                      unsigned short *dst, int j0, int lk)
{
    constexpr int CH = DP / 8;
    for (int idx = threadIdx.x; idx < BN * CH; idx += NTH) {
        const int n = ((idx >> 3) / CH) * 8 + (idx & 7), c = (idx >> 3) % CH;
        const int j = j0 + n;
        int bytes = 0;
        const char *src = p.k;
        if (j < lk) {
            int rem = (p.d - c * 8) * 2;
            bytes = rem >= 16 ? 16 : (rem > 0 ? rem : 0);
            if (bytes > 0)
                src = krow0 + ((long long)j * p.ksn + c * 8) * 2;
        }
        cp_async16((char *)dst + ((n >> 3) * CH + c) * 128 + (n & 7) * 16, src, bytes);
    }
}

/* Shared-memory matrix descriptor, no swizzle: start address, leading byte offset (between core
 * matrices along K), stride byte offset (between groups of 8 rows), all in 16-byte units. */
__device__ __forceinline__ unsigned long long wg_desc(const void *p, unsigned lbo, unsigned sbo)
{
    return (unsigned long long)((smem_u32(p) & 0x3ffffU) >> 4) |
           ((unsigned long long)(lbo >> 4) << 16) | ((unsigned long long)(sbo >> 4) << 32);
}

/* grid (blocks_per_head, Hq), block 384 (3 warpgroups of 64 rows). As stats_mma_kernel, with
 * Q.K^T issued asynchronously on wgmma: the logits of tile t+1 are computed while the warps fold
 * tile t (two accumulator sets), and K goes through WG_STAGES stages, WG_PF tiles ahead. */
template <int DP, bool F16, int NWG, int BN, bool SS, int POLY>
__global__ void __launch_bounds__(NWG * 128, 1) stats_wgmma_kernel(const kparams p, part *parts)
{
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
    constexpr int NT = BN / 8, WG_BN = BN, WG_N = NWG;
    using S = wg_shape<DP, NWG, BN, SS>;
    constexpr int BM = S::BM, LDQ = S::LDQ, KS = DP / 16, CH = DP / 8, NTH = WG_N * 128;
    extern __shared__ __align__(128) unsigned char wg_smem[];
    unsigned short *sk = (unsigned short *)wg_smem;
    unsigned short *sq = sk + WG_STAGES * S::KTILE;
    int *s_row = (int *)(sq + BM * LDQ);
    __shared__ int s_range[2], s_wg[WG_N][2];

    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, tq = lane & 3;
    const int wg = warp >> 2;
    const int h = blockIdx.y, x = blockIdx.x;
    part acc;
    part_init(acc);
    seqinfo si;
    if (!cta_sequence(p, x, &si)) {
        if (tid == 0)
            parts[(long long)h * p.blocks_per_head + x] = acc;
        return;
    }
    const int kvh = h / p.group;
    const char *qrow0 = p.q + ((long long)si.tb * p.qsb + (long long)h * p.qsh +
                               (long long)si.q0 * p.qsn) * 2;
    const char *krow0 = p.k + ((long long)si.tb * p.ksb + (long long)kvh * p.ksh +
                               (long long)si.k0 * p.ksn) * 2;

    if (tid == 0)
        s_range[0] = 0x7fffffff, s_range[1] = -1;
    if (tid < WG_N)
        s_wg[tid][0] = 0x7fffffff, s_wg[tid][1] = -1;
    for (int r = tid; r < BM; r += NTH) {
        int j = si.blk * BM + r;
        s_row[r] = j < si.nsamp ? (int)stats_row_of_sample((unsigned)j, (unsigned)si.lq,
                                                            p.sample_every, p.sample_rows, p.seed)
                                : -1;
    }
    __syncthreads();
    for (int r = tid; r < BM; r += NTH) {
        if (s_row[r] >= 0) {
            int lo, hi;
            visible_range(p, s_row[r], si.lq, si.lk, &lo, &hi);
            if (lo <= hi) {
                atomicMin(&s_range[0], lo);
                atomicMax(&s_range[1], hi);
            }
        }
    }
    for (int idx = tid; idx < BM * CH; idx += NTH) {
        int r = idx / CH, c = idx - r * CH;
        int i = s_row[r], bytes = 0;
        const char *src = p.q;
        if (i >= 0) {
            int rem = (p.d - c * 8) * 2;
            bytes = rem >= 16 ? 16 : (rem > 0 ? rem : 0);
            if (bytes > 0)
                src = qrow0 + ((long long)i * p.qsn + c * 8) * 2;
        }
        if (SS) /* core matrices, as the K tiles: chunk c of row r at ((r/8)*CH + c)*128 + (r%8)*16 */
            cp_async16((char *)sq + ((r >> 3) * CH + c) * 128 + (r & 7) * 16, src, bytes);
        else
            cp_async16(sq + r * LDQ + c * 8, src, bytes);
    }
    cp_async_commit();

    /* this thread's rows: warp*16 + hr*8 + g */
    int lo[1][2], hi[1][2];
    int wlo_min = 0x7fffffff, wlo_max = -1, whi_min = 0x7fffffff, whi_max = -1;
#pragma unroll
    for (int hr = 0; hr < 2; hr++) {
        int i = s_row[warp * 16 + hr * 8 + g];
        lo[0][hr] = 1, hi[0][hr] = 0;
        if (i >= 0)
            visible_range(p, i, si.lq, si.lk, &lo[0][hr], &hi[0][hr]);
        if (lo[0][hr] <= hi[0][hr]) {
            wlo_min = min(wlo_min, lo[0][hr]), wlo_max = max(wlo_max, lo[0][hr]);
            whi_min = min(whi_min, hi[0][hr]), whi_max = max(whi_max, hi[0][hr]);
        }
    }
    for (int m = 4; m < 32; m <<= 1) {
        wlo_min = min(wlo_min, __shfl_xor_sync(0xffffffffu, wlo_min, m));
        wlo_max = max(wlo_max, __shfl_xor_sync(0xffffffffu, wlo_max, m));
        whi_min = min(whi_min, __shfl_xor_sync(0xffffffffu, whi_min, m));
        whi_max = max(whi_max, __shfl_xor_sync(0xffffffffu, whi_max, m));
    }
    if (lane == 0 && whi_max >= 0) {
        atomicMin(&s_wg[wg][0], wlo_min);
        atomicMax(&s_wg[wg][1], whi_max);
    }
    __syncthreads(); /* s_range, s_wg final */
    const int t_first = s_range[1] >= 0 ? s_range[0] / WG_BN : 0;
    const int t_last = s_range[1] >= 0 ? s_range[1] / WG_BN : -1;
    const int ntiles = (t_last - t_first + 2) & ~1, t_end = t_first + ntiles - 1;
    for (int st = 0; st < WG_PF; st++) {
        if (t_first + st <= t_end)
            load_k_tile_cm<DP, BN, NTH>(p, krow0, sk + st * S::KTILE, (t_first + st) * WG_BN, si.lk);
        cp_async_commit();
    }
    cp_async_wait<WG_PF>(); /* Q has landed */
    __syncthreads();
    unsigned qf[SS ? 1 : KS][4];
#pragma unroll
    for (int ks = 0; ks < (SS ? 1 : KS); ks++) {
        if (SS)
            qf[ks][0] = qf[ks][1] = qf[ks][2] = qf[ks][3] = 0u; /* unused */
        else
            ldmatrix_x4(qf[ks], sq + (warp * 16 + (lane & 15)) * LDQ + ks * 16 + (lane >> 4) * 8);
    }
    /* SS: this warpgroup's 64 rows start at core-matrix row group wg * 8 */
    const unsigned short *sq_wg = (const unsigned short *)((const char *)sq + wg * 8 * CH * 128);

    float M[1][2], l[1][2][2], W[1][2][2];
#pragma unroll
    for (int hr = 0; hr < 2; hr++) {
        M[0][hr] = -INFINITY;
        l[0][hr][0] = l[0][hr][1] = W[0][hr][0] = W[0][hr][1] = 0.0f;
    }
    float sa[1][NT][4], sb[1][NT][4];

    auto fold = [&](float (&s)[1][NT][4], int t) {
        const int j0 = t * WG_BN, j1 = j0 + WG_BN - 1;
        if (j0 > whi_max || j1 < wlo_min)
            return; /* no row of this warp sees the tile */
        const bool full = j0 >= wlo_max && j1 <= whi_min;
        if (p.softcap) {
            if (full)
                fold_tile<1, NT, true, false, POLY>(p, s, M, l, W, lo, hi, j0, tq);
            else
                fold_tile<1, NT, true, true, POLY>(p, s, M, l, W, lo, hi, j0, tq);
        } else {
            if (full)
                fold_tile<1, NT, false, false, POLY>(p, s, M, l, W, lo, hi, j0, tq);
            else
                fold_tile<1, NT, false, true, POLY>(p, s, M, l, W, lo, hi, j0, tq);
        }
    };
    /* issue tile it into cur, then fold tile it-1 (in prev) while the tensor cores work */
    auto step = [&](int it, float (&cur)[1][NT][4], float (&prev)[1][NT][4]) {
        const int t = t_first + it;
        cp_async_wait<WG_PF - 1>();
        fence_proxy_async(); /* cp.async data -> visible to the tensor cores (async proxy) */
        __syncthreads();
        if (t + WG_PF <= t_end)
            load_k_tile_cm<DP, BN, NTH>(p, krow0, sk + ((it + WG_PF) % WG_STAGES) * S::KTILE,
                               (t + WG_PF) * WG_BN, si.lk);
        cp_async_commit();
        /* issued for every tile of the CTA's range (a warpgroup-dependent skip would make the
         * compiler serialise the wgmma); the fold skips what its rows do not see */
        const unsigned short *kt = sk + (it % WG_STAGES) * S::KTILE;
        reg_fence(cur[0]);
        wgmma_fence();
#pragma unroll
        for (int ks = 0; ks < KS; ks++)
            wgmma_op<NT, SS, F16>::run(cur[0], qf[SS ? 0 : ks],
                                       SS ? wg_desc(sq_wg + ks * 128, 128, CH * 128) : 0ull,
                                       wg_desc(kt + ks * 128, 128, CH * 128), ks > 0);
        wgmma_commit();
        reg_fence(cur[0]);
        wgmma_wait<1>(prev[0]);
        reg_fence(prev[0]);
        if (it > 0)
            fold(prev, t - 1);
    };
    /* Tiles in pairs, with no branch around a wgmma: a wgmma or wait on a path the compiler cannot
     * prove uniform makes it serialise them all. An odd count gets one more tile past the range,
     * which every warp's fold skips. */
    for (int it = 0; it < ntiles; it += 2) {
        step(it, sa, sb);
        step(it + 1, sb, sa);
        /* nothing in flight across the loop's back edge (else the compiler serialises every
         * wgmma); sb's tile ran while the warps folded sa's, so this wait is short */
        wgmma_wait<0>(sb[0]);
        reg_fence(sb[0]);
    }
    wgmma_wait<0>(sa[0]);
    wgmma_wait<0>(sb[0]);
    if (ntiles > 0)
        fold(sb, t_end); /* an even count: the last tile is in sb */
    cp_async_wait<0>();

#pragma unroll
    for (int hr = 0; hr < 2; hr++) {
        float lr = l[0][hr][0] + l[0][hr][1], wr = W[0][hr][0] + W[0][hr][1];
        lr += __shfl_xor_sync(0xffffffffu, lr, 1);
        wr += __shfl_xor_sync(0xffffffffu, wr, 1);
        lr += __shfl_xor_sync(0xffffffffu, lr, 2);
        wr += __shfl_xor_sync(0xffffffffu, wr, 2);
        int i = s_row[warp * 16 + hr * 8 + g];
        if (tq == 0 && i >= 0) {
            long long ro = ((long long)si.tb * p.hq + h) * p.len_q + si.q0 + i;
            row_done(p, acc, ro, hi[0][hr] - lo[0][hr] + 1, M[0][hr], lr, wr);
        }
    }
    block_store_part(acc, &parts[(long long)h * p.blocks_per_head + x]);
#endif
}

/* ---- the Hopper kernel, fold2 variants ------------------------------------------------------ */

/* mbarrier in shared memory (sm_80+): init with an arrival count, arrive (release), wait for the
 * phase of the given parity to complete (acquire). */
__device__ __forceinline__ void mbar_init(unsigned long long *bar, unsigned count)
{
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_u32(bar)), "r"(count)
                 : "memory");
}
__device__ __forceinline__ void mbar_arrive(unsigned long long *bar)
{
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem_u32(bar)) : "memory");
}
__device__ __forceinline__ void mbar_wait(unsigned long long *bar, unsigned parity)
{
    const unsigned a = smem_u32(bar);
    unsigned done;
    do {
        asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
                     "selp.u32 %0, 1, 0, p;\n}\n"
                     : "=r"(done)
                     : "r"(a), "r"(parity)
                     : "memory");
    } while (!done);
}

/* Shared-memory matrix descriptor for a K-major operand in the 128-byte swizzle layout: rows of
 * 128 bytes (64 elements of K), 8-row groups 1024 bytes apart, the 16-byte chunk c of row r stored
 * at chunk position c ^ (r % 8) (address bits [4,7) XOR [7,10), so the groups are 1024-byte
 * aligned). p: the first row of the 64-element column, advanced by 32 bytes per k16 step. */
__device__ __forceinline__ unsigned long long wg_desc_sw128(const void *p)
{
    return (unsigned long long)((smem_u32(p) & 0x3ffffU) >> 4) | (1ull << 16) |
           ((unsigned long long)(1024 >> 4) << 32) | (1ull << 62);
}

/* One tile of 64 keys folded into per-lane row states. Each lane keeps its own (M, l, W) per row
 * over the keys it holds (16 per tile: columns 2*tq, 2*tq+1 of each n8 block); the four lanes of
 * a quad are merged exactly once, at the end of the row (state_merge), so the tile needs no
 * shuffle. Within a tile: tree max (depth 4), one rescale per row with the lane's true running
 * max (branch-free: a = 2^d with d clamped at -256 so that a = 0 and a*d = 0 where the old max was
 * -inf, instead of -inf*0), then the 16 exps summed into NP independent partials of l and W,
 * combined at the end of the tile: w <- a*(w + d*l) + sum e*u,  l <- a*l + sum e. Both rows are
 * one straight-line block, so their chains interleave. NaN/Inf behave as in fold_tile: +Inf
 * makes M infinite (and u NaN), NaN makes l NaN, a -Inf logit with a finite max makes e*u NaN. */
template <int NT, bool CAP, bool MASK>
static __device__ __forceinline__ void fold_lane(const kparams &p, float (&s)[NT][4], float (&M)[2],
                                                 float (&l)[2], float (&W)[2], const int (&lo)[2],
                                                 const int (&hi)[2], int j0, int tq)
{
    constexpr int NV = 2 * NT, NP = 4;
    static_assert(NV == 16, "the tree max below is written for 16 values per row");
    if (MASK) {
#pragma unroll
        for (int hr = 0; hr < 2; hr++)
#pragma unroll
            for (int nt = 0; nt < NT; nt++)
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    const int j = j0 + nt * 8 + 2 * tq + e;
                    if (j < lo[hr] || j > hi[hr])
                        s[nt][2 * hr + e] = -INFINITY;
                }
    }
    float Mn[2], a[2], ad[2];
#pragma unroll
    for (int hr = 0; hr < 2; hr++) {
        float t[NV];
#pragma unroll
        for (int k = 0; k < NV; k++)
            t[k] = s[k >> 1][2 * hr + (k & 1)];
#pragma unroll
        for (int k = 0; k < 8; k++)
            t[k] = fmaxf(t[k], t[k + 8]);
#pragma unroll
        for (int k = 0; k < 4; k++)
            t[k] = fmaxf(t[k], t[k + 4]);
        t[0] = fmaxf(fmaxf(t[0], t[2]), fmaxf(t[1], t[3]));
        const float Mt = CAP ? p.cl * tanhf(t[0] * p.sc) : t[0] * p.c;
        Mn[hr] = fmaxf(M[hr], Mt);
        const float d = fmaxf(M[hr] - Mn[hr], -256.0f);
        a[hr] = ex2(d);
        ad[hr] = a[hr] * d;
    }
    float lp[2][NP], wp[2][NP];
#pragma unroll
    for (int hr = 0; hr < 2; hr++) {
        const float negM = -Mn[hr];
#pragma unroll
        for (int k = 0; k < NV; k++) {
            const float v = s[k >> 1][2 * hr + (k & 1)];
            float u = CAP ? fmaf(p.cl, tanh_fast(v * p.sc), negM) : fmaf(v, p.c, negM);
            float e = ex2(u);
            if (MASK) {
                const int j = j0 + (k >> 1) * 8 + 2 * tq + (k & 1);
                const bool vis = j >= lo[hr] && j <= hi[hr];
                e = vis ? e : 0.0f;
                u = vis ? u : 0.0f;
            }
            const int q = k % NP;
            if (k < NP) {
                lp[hr][q] = e;
                wp[hr][q] = e * u;
            } else {
                lp[hr][q] += e;
                wp[hr][q] = fmaf(e, u, wp[hr][q]);
            }
        }
    }
#pragma unroll
    for (int hr = 0; hr < 2; hr++) {
        const float lt = (lp[hr][0] + lp[hr][1]) + (lp[hr][2] + lp[hr][3]);
        const float wt = (wp[hr][0] + wp[hr][1]) + (wp[hr][2] + wp[hr][3]);
        W[hr] = fmaf(a[hr], W[hr], fmaf(ad[hr], l[hr], wt));
        l[hr] = fmaf(a[hr], l[hr], lt);
        M[hr] = Mn[hr];
    }
}

/* K pipeline of the fold2 kernels. MB = false: as stats_wgmma_kernel (4 stages, 2 tiles ahead, a
 * CTA barrier per tile). MB = true: 8 stages, 4 tiles ahead, and per-stage mbarriers instead of the
 * CTA barrier: a warp publishes tile t (its copies landed, proxy fence, one arrival per warp on
 * full[t % 8]) two steps before t is multiplied, and releases tile t (one arrival per warp on
 * empty[t % 8]) once its warpgroup's wgmma on it completed; a stage is refilled after every warp
 * released it. Warpgroups can then drift up to about two tiles apart instead of meeting at every
 * tile. */
template <bool MB> struct wgf_pipe {
    static constexpr int STAGES = MB ? 8 : 4, PF = MB ? 4 : 2, PUB = 2;
};

/* SW: K tiles in the 128-byte swizzle layout (DP/64 columns of 64 keys x 128 bytes), loaded a
 * whole 128-byte line per 8 lanes; else the no-swizzle core-matrix layout of stats_wgmma_kernel. */
template <int DP, bool SW, bool MB> struct wgf_shape {
    static constexpr int BM = 192, BN = 64, LDQ = DP + 8, KTILE = BN * DP;
    static constexpr size_t smem_bytes = (SW ? 1024 : 0) +
                                         (size_t)wgf_pipe<MB>::STAGES * KTILE * 2 +
                                         (size_t)BM * LDQ * 2 + (size_t)BM * sizeof(int);
};

/* grid (blocks_per_head, Hq), block 384 (3 warpgroups of 64 rows, 64-key tiles, Q in registers):
 * stats_wgmma_kernel's v0 shape with the fold of fold_lane, the K-tile addressing computed once
 * per thread (a pointer bump and up to 3 predicated copies per tile), SW the swizzled, line-wide K
 * loads (half the L2 tag lookups of the core-matrix loads), MB the mbarrier pipeline. */
template <int DP, bool F16, bool SW, bool MB>
__global__ void __launch_bounds__(384, 1) stats_wgf_kernel(const kparams p, part *parts)
{
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
    constexpr int NWG = 3, NTH = NWG * 128, BN = 64, NT = BN / 8;
    using S = wgf_shape<DP, SW, MB>;
    using P = wgf_pipe<MB>;
    constexpr int ST = P::STAGES, PF = P::PF, PUB = P::PUB;
    constexpr int BM = S::BM, LDQ = S::LDQ, KS = DP / 16, CH = DP / 8;
    static_assert((ST & (ST - 1)) == 0 && PF + 2 <= ST && (!MB || PUB < PF), "K pipeline");
    extern __shared__ __align__(128) unsigned char wg_smem[];
    unsigned char *sbase = wg_smem;
    if (SW) /* the swizzle pattern repeats every 1024 bytes of shared address */
        sbase += (1024u - (smem_u32(wg_smem) & 1023u)) & 1023u;
    unsigned short *sk = (unsigned short *)sbase;
    unsigned short *sq = sk + ST * S::KTILE;
    int *s_row = (int *)(sq + BM * LDQ);
    __shared__ int s_range[2];
    __shared__ unsigned long long s_full[ST], s_empty[ST];

    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, tq = lane & 3;
    const int h = blockIdx.y, x = blockIdx.x;
    part acc;
    part_init(acc);
    seqinfo si;
    if (!cta_sequence(p, x, &si)) {
        if (tid == 0)
            parts[(long long)h * p.blocks_per_head + x] = acc;
        return;
    }
    const int kvh = h / p.group;
    const char *qrow0 = p.q + ((long long)si.tb * p.qsb + (long long)h * p.qsh +
                               (long long)si.q0 * p.qsn) * 2;
    const char *krow0 = p.k + ((long long)si.tb * p.ksb + (long long)kvh * p.ksh +
                               (long long)si.k0 * p.ksn) * 2;

    if (tid == 0) {
        s_range[0] = 0x7fffffff, s_range[1] = -1;
        if (MB)
            for (int st = 0; st < ST; st++) {
                mbar_init(&s_full[st], NWG * 4);
                mbar_init(&s_empty[st], NWG * 4);
            }
    }
    for (int r = tid; r < BM; r += NTH) {
        int j = si.blk * BM + r;
        s_row[r] = j < si.nsamp ? (int)stats_row_of_sample((unsigned)j, (unsigned)si.lq,
                                                            p.sample_every, p.sample_rows, p.seed)
                                : -1;
    }
    __syncthreads();
    for (int r = tid; r < BM; r += NTH) {
        if (s_row[r] >= 0) {
            int lo, hi;
            visible_range(p, s_row[r], si.lq, si.lk, &lo, &hi);
            if (lo <= hi) {
                atomicMin(&s_range[0], lo);
                atomicMax(&s_range[1], hi);
            }
        }
    }
    for (int idx = tid; idx < BM * CH; idx += NTH) {
        int r = idx / CH, c = idx - r * CH;
        int i = s_row[r], bytes = 0;
        const char *src = p.q;
        if (i >= 0) {
            int rem = (p.d - c * 8) * 2;
            bytes = rem >= 16 ? 16 : (rem > 0 ? rem : 0);
            if (bytes > 0)
                src = qrow0 + ((long long)i * p.qsn + c * 8) * 2;
        }
        cp_async16(sq + r * LDQ + c * 8, src, bytes);
    }
    cp_async_commit();

    /* this thread's rows: warp*16 + hr*8 + g */
    int lo[2], hi[2];
    int wlo_min = 0x7fffffff, wlo_max = -1, whi_min = 0x7fffffff, whi_max = -1;
#pragma unroll
    for (int hr = 0; hr < 2; hr++) {
        int i = s_row[warp * 16 + hr * 8 + g];
        lo[hr] = 1, hi[hr] = 0;
        if (i >= 0)
            visible_range(p, i, si.lq, si.lk, &lo[hr], &hi[hr]);
        if (lo[hr] <= hi[hr]) {
            wlo_min = min(wlo_min, lo[hr]), wlo_max = max(wlo_max, lo[hr]);
            whi_min = min(whi_min, hi[hr]), whi_max = max(whi_max, hi[hr]);
        }
    }
    for (int m = 4; m < 32; m <<= 1) {
        wlo_min = min(wlo_min, __shfl_xor_sync(0xffffffffu, wlo_min, m));
        wlo_max = max(wlo_max, __shfl_xor_sync(0xffffffffu, wlo_max, m));
        whi_min = min(whi_min, __shfl_xor_sync(0xffffffffu, whi_min, m));
        whi_max = max(whi_max, __shfl_xor_sync(0xffffffffu, whi_max, m));
    }

    /* This thread's 16-byte chunks of a K tile: key n0 + i*NS, chunk cg of the key's row, for
     * i < NIT (the last one only for the threads whose index stays under BN*CH). SW: 8 lanes per
     * 128-byte line (keys n, n+1 whole per warp at DP = 128, 4 keys at DP = 64); else 8 keys x 4
     * chunks per warp, as load_k_tile_cm. Either way the offsets step by constants with i. */
    constexpr int A = SW ? DP / 64 : 1;                     /* 64-element columns (SW) */
    constexpr int NS = SW ? NTH / (8 * A) : NTH / CH;       /* keys between a thread's chunks */
    constexpr int NIT = (BN * CH + NTH - 1) / NTH;
    constexpr unsigned SSTEP = SW ? NS * 128u : NTH * 16u; /* shared bytes between them */
    static_assert(NS % 8 == 0 && (SW ? (NTH / 8) % A : (NTH / 8) % CH) == 0, "K tile addressing");
    const int n0 = SW ? (tid >> 3) / A : ((tid >> 3) / CH) * 8 + (tid & 7);
    const int cg = SW ? ((tid >> 3) % A) * 8 + (tid & 7) : (tid >> 3) % CH;
    const unsigned soff0 =
        SW ? (unsigned)(((cg >> 3) * BN + n0) * 128 + (((cg & 7) ^ (n0 & 7)) << 4))
           : (unsigned)(((n0 >> 3) * CH + cg) * 128 + (n0 & 7) * 16);
    const int krem = (p.d - cg * 8) * 2, kbytes = krem >= 16 ? 16 : (krem > 0 ? krem : 0);
    const long long kpitch = p.ksn * 2; /* bytes between keys */
    const long long goff0 = (long long)n0 * kpitch + cg * 16;
    const bool last_ok = tid + (NIT - 1) * NTH < BN * CH;
    auto load_tile = [&](int stage, int t) {
        const int j0 = t * BN;
        const char *tb = krow0 + (long long)j0 * kpitch + goff0;
        unsigned short *dst = (unsigned short *)((char *)sk + (size_t)stage * S::KTILE * 2 + soff0);
#pragma unroll
        for (int i = 0; i < NIT; i++) {
            if (i == NIT - 1 && !last_ok)
                break;
            const bool in = j0 + n0 + i * NS < si.lk && kbytes > 0;
            cp_async16((char *)dst + i * SSTEP, in ? tb + i * NS * kpitch : p.k, in ? kbytes : 0);
        }
    };

    __syncthreads(); /* s_range final, mbarriers initialised */
    const int t_first = s_range[1] >= 0 ? s_range[0] / BN : 0;
    const int t_last = s_range[1] >= 0 ? s_range[1] / BN : -1;
    const int ntiles = (t_last - t_first + 2) & ~1, t_end = t_first + ntiles - 1;
    for (int st = 0; st < PF; st++) {
        if (st < ntiles)
            load_tile(st, t_first + st);
        cp_async_commit();
    }
    if (MB) {
        cp_async_wait<PF - PUB>(); /* Q and tiles 0 .. PUB-1 */
        fence_proxy_async();
    } else {
        cp_async_wait<PF>(); /* Q */
    }
    __syncthreads();
    if (MB && lane == 0)
        for (int q = 0; q < PUB; q++)
            mbar_arrive(&s_full[q]);
    unsigned qf[KS][4];
#pragma unroll
    for (int ks = 0; ks < KS; ks++)
        ldmatrix_x4(qf[ks], sq + (warp * 16 + (lane & 15)) * LDQ + ks * 16 + (lane >> 4) * 8);

    float M[2], l[2], W[2];
#pragma unroll
    for (int hr = 0; hr < 2; hr++)
        M[hr] = -INFINITY, l[hr] = 0.0f, W[hr] = 0.0f;
    float sa[1][NT][4], sb[1][NT][4];

    auto fold = [&](float (&s)[1][NT][4], int t) {
        const int j0 = t * BN, j1 = j0 + BN - 1;
        if (j0 > whi_max || j1 < wlo_min)
            return; /* no row of this warp sees the tile */
        const bool full = j0 >= wlo_max && j1 <= whi_min;
        if (p.softcap) {
            if (full)
                fold_lane<NT, true, false>(p, s[0], M, l, W, lo, hi, j0, tq);
            else
                fold_lane<NT, true, true>(p, s[0], M, l, W, lo, hi, j0, tq);
        } else {
            if (full)
                fold_lane<NT, false, false>(p, s[0], M, l, W, lo, hi, j0, tq);
            else
                fold_lane<NT, false, true>(p, s[0], M, l, W, lo, hi, j0, tq);
        }
    };
    /* issue tile it into cur, then fold tile it-1 (in prev) while the tensor cores work */
    auto step = [&](int it, float (&cur)[1][NT][4], float (&prev)[1][NT][4]) {
        const int t = t_first + it;
        if (MB) {
            /* publish tile it+PUB: this thread's copies of it (committed PF-PUB steps ago) */
            cp_async_wait<PF - PUB - 1>();
            fence_proxy_async(); /* cp.async data -> visible to the tensor cores (async proxy) */
            __syncwarp();
            if (lane == 0 && it + PUB < ntiles)
                mbar_arrive(&s_full[(it + PUB) & (ST - 1)]);
            /* refill: tile it+PF goes where tile it+PF-ST was, once every warp released that */
            if (it + PF < ntiles) {
                if (it + PF >= ST)
                    mbar_wait(&s_empty[(it + PF) & (ST - 1)], ((it + PF) / ST - 1) & 1);
                load_tile((it + PF) & (ST - 1), t + PF);
            }
            cp_async_commit();
            mbar_wait(&s_full[it & (ST - 1)], (it / ST) & 1);
        } else {
            cp_async_wait<PF - 1>();
            fence_proxy_async();
            __syncthreads();
            if (t + PF <= t_end)
                load_tile((it + PF) % ST, t + PF);
            cp_async_commit();
        }
        const unsigned short *kt = sk + (it & (ST - 1)) * S::KTILE;
        reg_fence(cur[0]);
        wgmma_fence();
#pragma unroll
        for (int ks = 0; ks < KS; ks++)
            wgmma_op<NT, false, F16>::run(
                cur[0], qf[ks], 0ull,
                SW ? wg_desc_sw128(kt + (ks >> 2) * BN * 64 + (ks & 3) * 16)
                   : wg_desc(kt + ks * 128, 128, CH * 128),
                ks > 0);
        wgmma_commit();
        reg_fence(cur[0]);
        wgmma_wait<1>(prev[0]);
        reg_fence(prev[0]);
        if (MB) { /* tile it-1 is no longer read by this warp's warpgroup */
            __syncwarp();
            if (lane == 0 && it > 0)
                mbar_arrive(&s_empty[(it - 1) & (ST - 1)]);
        }
        if (it > 0)
            fold(prev, t - 1);
    };
    /* tiles in pairs, with no branch around a wgmma (see stats_wgmma_kernel) */
    for (int it = 0; it < ntiles; it += 2) {
        step(it, sa, sb);
        step(it + 1, sb, sa);
        wgmma_wait<0>(sb[0]);
        reg_fence(sb[0]);
    }
    wgmma_wait<0>(sa[0]);
    wgmma_wait<0>(sb[0]);
    if (ntiles > 0)
        fold(sb, t_end);
    cp_async_wait<0>();

    /* the four lanes of a quad hold disjoint keys of the row: merge their states exactly */
#pragma unroll
    for (int hr = 0; hr < 2; hr++) {
        float Mr = M[hr], lr = l[hr], wr = W[hr];
#pragma unroll
        for (int m = 1; m <= 2; m <<= 1) {
            const float M2 = __shfl_xor_sync(0xffffffffu, Mr, m);
            const float l2 = __shfl_xor_sync(0xffffffffu, lr, m);
            const float W2 = __shfl_xor_sync(0xffffffffu, wr, m);
            state_merge(Mr, lr, wr, M2, l2, W2);
        }
        int i = s_row[warp * 16 + hr * 8 + g];
        if (tq == 0 && i >= 0) {
            long long ro = ((long long)si.tb * p.hq + h) * p.len_q + si.q0 + i;
            row_done(p, acc, ro, hi[hr] - lo[hr] + 1, Mr, lr, wr);
        }
    }
    block_store_part(acc, &parts[(long long)h * p.blocks_per_head + x]);
#endif
}

/* ---- the CUDA-core kernel ------------------------------------------------------------------ */

enum { GEN_WARPS = 8, GEN_ROWS_PER_WARP = 4, GEN_BM = GEN_WARPS * GEN_ROWS_PER_WARP };

/* grid (blocks_per_head, Hq), block 256; each warp takes GEN_ROWS_PER_WARP sampled rows, each lane
 * every 32nd visible key. Any dtype, head_dim and stride. */
__global__ void __launch_bounds__(GEN_WARPS * 32) stats_generic_kernel(const kparams p, part *parts)
{
    __shared__ float s_q[GEN_WARPS][STATS_MAX_HEAD_DIM];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int h = blockIdx.y, x = blockIdx.x;
    part acc;
    part_init(acc);
    seqinfo si;
    const bool have = cta_sequence(p, x, &si);
    const int kvh = h / p.group;
    for (int rr = 0; have && rr < GEN_ROWS_PER_WARP; rr++) {
        int j = si.blk * GEN_BM + warp * GEN_ROWS_PER_WARP + rr;
        if (j >= si.nsamp)
            break;
        int i = (int)stats_row_of_sample((unsigned)j, (unsigned)si.lq, p.sample_every,
                                         p.sample_rows, p.seed);
        int lo, hi;
        visible_range(p, i, si.lq, si.lk, &lo, &hi);
        long long qoff = (long long)si.tb * p.qsb + (long long)h * p.qsh + (long long)(si.q0 + i) * p.qsn;
        __syncwarp();
        for (int e = lane; e < p.d; e += 32)
            s_q[warp][e] = load_elem(p.q, qoff + e, p.dtype);
        __syncwarp();
        float M = -INFINITY, l = 0.0f, W = 0.0f;
        long long kbase = (long long)si.tb * p.ksb + (long long)kvh * p.ksh;
        for (int kj = lo + lane; kj <= hi; kj += 32) {
            long long koff = kbase + (long long)(si.k0 + kj) * p.ksn;
            float dot = 0.0f;
            for (int e = 0; e < p.d; e++)
                dot = fmaf(s_q[warp][e], load_elem(p.k, koff + e, p.dtype), dot);
            float xv = p.softcap ? p.cl * tanhf(dot * p.sc) : dot * p.c;
            if (xv > M) {
                if (M > -INFINITY) {
                    float dd = M - xv, a = ex2(dd);
                    W = a * W + a * dd * l;
                    l = a * l;
                }
                M = xv;
            }
            float u = xv - M, pe = ex2(u);
            l += pe;
            W = fmaf(pe, u, W);
        }
        for (int m = 1; m < 32; m <<= 1) {
            float M2 = __shfl_xor_sync(0xffffffffu, M, m), l2 = __shfl_xor_sync(0xffffffffu, l, m);
            float W2 = __shfl_xor_sync(0xffffffffu, W, m);
            state_merge(M, l, W, M2, l2, W2);
        }
        if (lane == 0) {
            long long ro = ((long long)si.tb * p.hq + h) * p.len_q + si.q0 + i;
            row_done(p, acc, ro, hi - lo + 1, M, l, W);
        }
    }
    block_store_part(acc, &parts[(long long)h * p.blocks_per_head + x]);
}

/* ---- per-head reduction ---------------------------------------------------------------------- */

/* grid Hq, block 256: parts [Hq][nparts] -> heads [Hq]. */
__global__ void reduce_heads_kernel(const part *parts, int nparts, int sampled, stats_head *heads)
{
    const int h = blockIdx.x;
    part a;
    part_init(a);
    for (int i = threadIdx.x; i < nparts; i += blockDim.x)
        part_merge(a, parts[(long long)h * nparts + i]);
    __shared__ part s_tot;
    block_store_part(a, &s_tot);
    __syncthreads();
    if (threadIdx.x == 0) {
        const part t = s_tot;
        stats_head o = {};
        o.rows = t.rows, o.rows_norm = t.rows_norm, o.rows_empty = t.rows_empty;
        o.nonfinite_rows = t.nonfinite, o.sampled = sampled;
        o.max_logit = t.rows > 0 ? (double)t.mmax : -INFINITY;
        if (t.rows > 0) {
            double n = (double)t.rows, mean = t.sum / n, var = t.sumsq / n - mean * mean;
            o.entropy_mean = mean;
            o.entropy_std = sqrt(var > 0.0 ? var : 0.0);
            o.entropy_min = t.hmin;
            o.entropy_max = t.hmax;
        } else {
            o.entropy_mean = o.entropy_std = o.entropy_min = o.entropy_max = NAN;
        }
        if (t.rows_norm > 0) {
            o.entropy_norm_mean = t.sum_norm / (double)t.rows_norm;
            o.collapsed_frac = (double)t.collapsed / (double)t.rows_norm;
        } else {
            o.entropy_norm_mean = NAN;
            o.collapsed_frac = 0.0;
        }
        heads[h] = o;
    }
}

/* ---- host side ------------------------------------------------------------------------------- */

enum { N_VARIANTS = 5 };

struct stats_cuda {
    int device;
    int sm_count;
    int cc_major;
    int wg_ok;                  /* the Hopper kernels can run here */
    int variant_ok[N_VARIANTS]; /* fits the device's shared memory */
    stats_cuda_path path;
    void *ws;          /* device workspace */
    size_t ws_bytes;
    stats_head *host;  /* pinned staging for stats_cuda_run */
    size_t host_heads;
};

__attribute__((format(printf, 3, 4))) static stats_status fail(stats_error *err, stats_status st,
                                                               const char *fmt, ...)
{
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err->msg, sizeof err->msg, fmt, ap);
        va_end(ap);
    }
    return st;
}

#define CUDA_TRY(call, what)                                                                       \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        if (e_ != cudaSuccess)                                                                     \
            return fail(err, STATS_EDEVICE, "stats_cuda: %s failed: %s (%s, code %d)", what,       \
                        cudaGetErrorString(e_), cudaGetErrorName(e_), (int)e_);                    \
    } while (0)

typedef void (*mma_kernel_fn)(const kparams, part *);

struct mma_variant {
    int dp, mt;
    mma_kernel_fn bf16, f16;
    size_t smem;
};

#define MMA_VARIANT(DP, MT)                                                                        \
    { DP, MT, stats_mma_kernel<DP, MT, false>, stats_mma_kernel<DP, MT, true>,                     \
      mma_shape<DP, MT>::smem_bytes }

static const mma_variant k_variants[] = {
    MMA_VARIANT(32, 2), MMA_VARIANT(64, 2), MMA_VARIANT(96, 2), MMA_VARIANT(128, 2),
    MMA_VARIANT(256, 1),
};

static_assert(sizeof k_variants / sizeof k_variants[0] == N_VARIANTS, "variant table");

struct wg_variant {
    int dp, nwg;
    mma_kernel_fn bf16, f16;
    size_t smem;
    const char *name_bf16, *name_f16;
};

/* The Hopper kernel's variants: the tests and the bench run each one through
 * STATS_CUDA_PATH_WG_VARIANT + v; AUTO and STATS_CUDA_PATH_WGMMA take WG_DEFAULT. */
#define WG_ONE(DP, NWG, BN, SS, POLY, TAG)                                                         \
    { DP, NWG, stats_wgmma_kernel<DP, false, NWG, BN, SS, POLY>,                                   \
      stats_wgmma_kernel<DP, true, NWG, BN, SS, POLY>, wg_shape<DP, NWG, BN, SS>::smem_bytes,       \
      "wgmma bf16 d" #DP " " TAG, "wgmma f16 d" #DP " " TAG }
#define WG_VARIANT(NWG, BN, SS, POLY, TAG)                                                         \
    {WG_ONE(64, NWG, BN, SS, POLY, TAG), WG_ONE(128, NWG, BN, SS, POLY, TAG)}
#define WGF_ONE(DP, SW, MB, TAG)                                                                   \
    { DP, 3, stats_wgf_kernel<DP, false, SW, MB>, stats_wgf_kernel<DP, true, SW, MB>,              \
      wgf_shape<DP, SW, MB>::smem_bytes, "wgmma bf16 d" #DP " " TAG, "wgmma f16 d" #DP " " TAG }
#define WGF_VARIANT(SW, MB, TAG) {WGF_ONE(64, SW, MB, TAG), WGF_ONE(128, SW, MB, TAG)}

enum { WG_NDP = 2, WG_NVAR = 4, WG_DEFAULT = 2 };
/* Measured on the H100 (bench/kernel_notes.md): v0 is the fastest shape of stats_wgmma_kernel
 * (v3 of the notes; 2 x 64 rows with 128-key tiles and Q in shared memory, and 1/4 of the exps on
 * the polynomial, were slower and are no longer instantiated). v1-v3: the fold2 kernel (v4 of the
 * notes); v2 is 12-23% faster than v0 on every bench shape and is the default. */
static const wg_variant k_wg_variants[WG_NVAR][WG_NDP] = {
    WG_VARIANT(3, 64, false, 0, "3wg n64 rs"), /* v0: 3 x 64 rows, 64-key tiles, Q in registers */
    WGF_VARIANT(false, false, "fold2"),        /* v1: v0 with fold_lane and hoisted K addressing */
    WGF_VARIANT(true, false, "fold2 sw128"),   /* v2 (default): v1, K swizzled, a line per 8 lanes */
    WGF_VARIANT(true, true, "fold2 sw128 mbar"), /* v3: v2, mbarrier pipeline, no CTA barrier */
};

extern "C" int stats_cuda_wg_variant_count(void)
{
    return WG_NVAR;
}

extern "C" int stats_cuda_wg_variant_default(void)
{
    return WG_DEFAULT;
}

static const wg_variant *pick_wg(const stats_cuda *ctx, const stats_problem *p)
{
    int v = WG_DEFAULT;
    if (ctx->path >= STATS_CUDA_PATH_WG_VARIANT && ctx->path < STATS_CUDA_PATH_WG_VARIANT + WG_NVAR)
        v = (int)ctx->path - STATS_CUDA_PATH_WG_VARIANT;
    else if (ctx->path != STATS_CUDA_PATH_AUTO && ctx->path != STATS_CUDA_PATH_WGMMA)
        return NULL;
    if (!ctx->wg_ok || p->head_dim <= 32)
        return NULL;
    for (int i = 0; i < WG_NDP; i++)
        if (p->head_dim <= k_wg_variants[v][i].dp)
            return &k_wg_variants[v][i];
    return NULL;
}

static const mma_variant *pick_variant(const stats_cuda *ctx, int d)
{
    for (int i = 0; i < N_VARIANTS; i++)
        if (d <= k_variants[i].dp)
            return ctx->variant_ok[i] ? &k_variants[i] : NULL;
    return NULL;
}

/* Tensor-core path possible: 2-byte dtype, 16-byte aligned bases, strides multiple of 8. */
static bool mma_ok(const stats_cuda *ctx, const stats_problem *p)
{
    if (p->dtype != STATS_BF16 && p->dtype != STATS_F16)
        return false;
    if (((uintptr_t)p->q.ptr & 15) || ((uintptr_t)p->k.ptr & 15))
        return false;
    const int64_t s[6] = {p->q.stride_b, p->q.stride_h, p->q.stride_n,
                          p->k.stride_b, p->k.stride_h, p->k.stride_n};
    for (int i = 0; i < 6; i++)
        if (s[i] % 8)
            return false;
    return pick_variant(ctx, p->head_dim) != NULL;
}

extern "C" int stats_cuda_built(void)
{
    return 1;
}

extern "C" int stats_cuda_device_count(void)
{
    int n = 0, usable = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        cudaGetLastError(); /* clear the sticky-free error so later calls start clean */
        return 0;
    }
    for (int i = 0; i < n; i++) {
        int major = 0;
        if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, i) == cudaSuccess &&
            major >= 8)
            usable++;
    }
    return usable;
}

extern "C" stats_status stats_cuda_create(int device, stats_cuda **out, stats_error *err)
{
    if (err)
        err->msg[0] = '\0';
    if (!out)
        return fail(err, STATS_EINVAL, "stats_cuda_create: out is NULL");
    *out = NULL;
    int n = 0;
    CUDA_TRY(cudaGetDeviceCount(&n), "cudaGetDeviceCount (is the NVIDIA driver loaded?)");
    if (device < 0 || device >= n)
        return fail(err, STATS_EINVAL, "stats_cuda_create: device %d does not exist (%d visible)",
                    device, n);
    CUDA_TRY(cudaSetDevice(device), "cudaSetDevice");
    int major = 0, sms = 0;
    CUDA_TRY(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device),
             "cudaDeviceGetAttribute(compute capability)");
    CUDA_TRY(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device),
             "cudaDeviceGetAttribute(multiprocessor count)");
    if (major < 8)
        return fail(err, STATS_ENOTSUP,
                    "stats_cuda_create: device %d has compute capability %d.x; the kernels need 8.0 "
                    "or newer (Ampere, Hopper); use the CPU backend", device, major);
    int smem_optin = 0;
    CUDA_TRY(cudaDeviceGetAttribute(&smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device),
             "cudaDeviceGetAttribute(shared memory per block)");
    int ok[N_VARIANTS];
    for (int i = 0; i < N_VARIANTS; i++) {
        ok[i] = k_variants[i].smem + 1024 <= (size_t)smem_optin; /* + static shared memory */
        if (!ok[i])
            continue; /* that head_dim takes the CUDA-core path on this device */
        CUDA_TRY(cudaFuncSetAttribute(k_variants[i].bf16, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                      (int)k_variants[i].smem),
                 "cudaFuncSetAttribute(shared memory) for the bf16 kernel");
        CUDA_TRY(cudaFuncSetAttribute(k_variants[i].f16, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                      (int)k_variants[i].smem),
                 "cudaFuncSetAttribute(shared memory) for the f16 kernel");
    }
    stats_cuda *c = (stats_cuda *)calloc(1, sizeof *c);
    if (!c)
        return fail(err, STATS_ENOMEM, "stats_cuda_create: out of host memory");
    c->device = device;
    c->sm_count = sms;
    c->path = STATS_CUDA_PATH_AUTO;
    memcpy(c->variant_ok, ok, sizeof ok);
    c->cc_major = major;
    c->wg_ok = 0;
    if (major == 9) { /* the sm_90a binary: Hopper only */
        c->wg_ok = 1;
        for (int i = 0; i < WG_NVAR * WG_NDP; i++) {
            const wg_variant *w = &k_wg_variants[i / WG_NDP][i % WG_NDP];
            cudaError_t e1 = cudaFuncSetAttribute(w->bf16, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                  (int)w->smem);
            cudaError_t e2 = cudaFuncSetAttribute(w->f16, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                  (int)w->smem);
            if (e1 != cudaSuccess || e2 != cudaSuccess || w->smem + 1024 > (size_t)smem_optin) {
                cudaGetLastError();
                c->wg_ok = 0; /* mma.sync serves every head_dim then */
            }
        }
    }
    *out = c;
    return STATS_OK;
}

extern "C" void stats_cuda_destroy(stats_cuda *ctx)
{
    if (!ctx)
        return;
    int prev = -1;
    cudaGetDevice(&prev);
    cudaSetDevice(ctx->device);
    if (ctx->ws)
        cudaFree(ctx->ws);
    if (ctx->host)
        cudaFreeHost(ctx->host);
    if (prev >= 0)
        cudaSetDevice(prev);
    free(ctx);
}

extern "C" void stats_cuda_set_path(stats_cuda *ctx, stats_cuda_path path)
{
    if (ctx)
        ctx->path = path;
}

/* Launch plan of one problem. */
struct plan {
    const wg_variant *w;  /* Hopper kernel, or NULL */
    const mma_variant *v; /* mma.sync kernel, or NULL; both NULL: CUDA-core kernel */
    int rows_per_cta, nblk, blocks_per_head;
    size_t parts_off, off_off, heads_off, bytes;
};

static stats_status make_plan(const stats_cuda *ctx, const stats_problem *p, plan *pl,
                              stats_error *err)
{
    memset(pl, 0, sizeof *pl);
    const bool tc = ctx->path != STATS_CUDA_PATH_GENERIC && mma_ok(ctx, p);
    pl->w = tc ? pick_wg(ctx, p) : NULL;
    /* Small grids (sampled runs, mostly) take the Hopper kernel too: until v3 of the kernel notes
     * AUTO switched to mma.sync's 256-row blocks under two waves of the 192-row grid (0.18 ms
     * against 0.21 ms at every 8th row of (2,32,4096,128)); the fold2 kernel (v2) takes 0.164 ms
     * there against mma.sync's 0.180 ms, and 0.138 against 0.175 causal (kernel_notes.md, v4). */
    pl->v = tc && !pl->w ? pick_variant(ctx, p->head_dim) : NULL;
    pl->rows_per_cta = pl->w ? pl->w->nwg * 64 : pl->v ? MMA_WARPS * 16 * pl->v->mt : GEN_BM;
    const int packed = p->cu_seqlens_q != NULL;
    long long bph;
    if (!packed) {
        long long ns = stats_sampled_count(p, p->len_q);
        pl->nblk = (int)((ns + pl->rows_per_cta - 1) / pl->rows_per_cta);
        if (pl->nblk < 1)
            pl->nblk = 1;
        bph = (long long)pl->nblk * p->batch;
    } else {
        bph = ((long long)p->len_q + pl->rows_per_cta - 1) / pl->rows_per_cta + p->batch;
    }
    if (bph > 0x7fffffffLL)
        return fail(err, STATS_EINVAL, "stats_cuda: %lld blocks per head is over the grid limit",
                    bph);
    if (p->heads_q > 65535)
        return fail(err, STATS_EINVAL, "stats_cuda: heads_q %d is over the grid limit 65535",
                    p->heads_q);
    pl->blocks_per_head = (int)bph;
    size_t o = 0;
    pl->parts_off = o;
    o += sizeof(part) * (size_t)bph * (size_t)p->heads_q;
    o = (o + 255) & ~(size_t)255;
    pl->off_off = o;
    o += sizeof(int) * (size_t)(packed ? p->batch + 1 : 1);
    o = (o + 255) & ~(size_t)255;
    pl->heads_off = o;
    o += sizeof(stats_head) * (size_t)p->heads_q;
    pl->bytes = o;
    return STATS_OK;
}

static stats_status grow(stats_cuda *ctx, size_t bytes, void *stream, stats_error *err)
{
    if (bytes <= ctx->ws_bytes)
        return STATS_OK;
    if (ctx->ws) {
        /* the previous call on this stream may still read the old workspace */
        CUDA_TRY(cudaStreamSynchronize((cudaStream_t)stream), "cudaStreamSynchronize before growing");
        CUDA_TRY(cudaFree(ctx->ws), "cudaFree(workspace)");
        ctx->ws = NULL;
        ctx->ws_bytes = 0;
    }
    size_t want = bytes + bytes / 4;
    cudaError_t e = cudaMalloc(&ctx->ws, want);
    if (e != cudaSuccess) {
        ctx->ws = NULL;
        cudaGetLastError();
        return fail(err, e == cudaErrorMemoryAllocation ? STATS_ENOMEM : STATS_EDEVICE,
                    "stats_cuda: cudaMalloc of a %zu-byte workspace failed: %s", want,
                    cudaGetErrorString(e));
    }
    ctx->ws_bytes = want;
    return STATS_OK;
}

static stats_status check_problem(stats_cuda *ctx, const stats_problem *p, stats_error *err)
{
    if (!ctx)
        return fail(err, STATS_EINVAL, "stats_cuda: context is NULL");
    stats_status st = stats_validate(p, err);
    if (st != STATS_OK)
        return st;
    return STATS_OK;
}

extern "C" stats_status stats_cuda_reserve(stats_cuda *ctx, const stats_problem *p, stats_error *err)
{
    if (err)
        err->msg[0] = '\0';
    if (!ctx || !p)
        return fail(err, STATS_EINVAL, "stats_cuda_reserve: context or problem is NULL");
    CUDA_TRY(cudaSetDevice(ctx->device), "cudaSetDevice");
    /* the plan is largest on the CUDA-core path (fewer rows per block) */
    stats_cuda tmp = *ctx;
    tmp.path = STATS_CUDA_PATH_GENERIC;
    plan pl;
    stats_status st = make_plan(&tmp, p, &pl, err);
    if (st != STATS_OK)
        return st;
    st = grow(ctx, pl.bytes, NULL, err);
    if (st != STATS_OK)
        return st;
    if (ctx->host_heads < (size_t)p->heads_q) {
        if (ctx->host)
            CUDA_TRY(cudaFreeHost(ctx->host), "cudaFreeHost");
        ctx->host = NULL;
        ctx->host_heads = 0;
        CUDA_TRY(cudaMallocHost((void **)&ctx->host, sizeof(stats_head) * (size_t)p->heads_q),
                 "cudaMallocHost(per-head staging)");
        ctx->host_heads = (size_t)p->heads_q;
    }
    return STATS_OK;
}

extern "C" const char *stats_cuda_kernel_name(const stats_cuda *ctx, const stats_problem *p)
{
    static const char *names[2][5] = {
        {"mma.sync bf16 d32", "mma.sync bf16 d64", "mma.sync bf16 d96", "mma.sync bf16 d128",
         "mma.sync bf16 d256"},
        {"mma.sync f16 d32", "mma.sync f16 d64", "mma.sync f16 d96", "mma.sync f16 d128",
         "mma.sync f16 d256"}};
    if (!ctx || !p)
        return "none";
    plan pl;
    if (make_plan(ctx, p, &pl, NULL) != STATS_OK)
        return "none (invalid problem)";
    if (pl.w)
        return p->dtype == STATS_F16 ? pl.w->name_f16 : pl.w->name_bf16;
    if (pl.v)
        return names[p->dtype == STATS_F16][pl.v - k_variants];
    return p->dtype == STATS_F32 ? "cuda-core f32" : p->dtype == STATS_F16 ? "cuda-core f16"
                                                                           : "cuda-core bf16";
}

extern "C" stats_status stats_cuda_run_async(stats_cuda *ctx, const stats_problem *p, void *stream,
                                             stats_head *heads_dev, float *row_entropy,
                                             float *row_maxlogit, stats_error *err)
{
    if (err)
        err->msg[0] = '\0';
    stats_status st = check_problem(ctx, p, err);
    if (st != STATS_OK)
        return st;
    if (!heads_dev)
        return fail(err, STATS_EINVAL, "stats_cuda: heads output is NULL");
    CUDA_TRY(cudaSetDevice(ctx->device), "cudaSetDevice");
    cudaStream_t s = (cudaStream_t)stream;
    plan pl;
    st = make_plan(ctx, p, &pl, err);
    if (st != STATS_OK)
        return st;
    st = grow(ctx, pl.bytes, stream, err);
    if (st != STATS_OK)
        return st;

    const int packed = p->cu_seqlens_q != NULL;
    kparams k;
    memset(&k, 0, sizeof k);
    k.q = (const char *)p->q.ptr, k.k = (const char *)p->k.ptr;
    k.qsb = p->q.stride_b, k.qsh = p->q.stride_h, k.qsn = p->q.stride_n;
    k.ksb = p->k.stride_b, k.ksh = p->k.stride_h, k.ksn = p->k.stride_n;
    k.batch = p->batch, k.hq = p->heads_q, k.group = p->heads_q / p->heads_kv;
    k.len_q = p->len_q, k.len_k = p->len_k, k.d = p->head_dim, k.dtype = (int)p->dtype;
    k.esize = (int)stats_dtype_size(p->dtype);
    k.packed = packed;
    k.cu_q = p->cu_seqlens_q, k.cu_k = p->cu_seqlens_k;
    k.blk_off = (const int *)((char *)ctx->ws + pl.off_off);
    k.nblk = pl.nblk;
    k.blocks_per_head = pl.blocks_per_head;
    k.rows_per_cta = pl.rows_per_cta;
    const float scale = p->scale > 0.0f ? p->scale : 1.0f / sqrtf((float)p->head_dim);
    k.c = scale * LOG2E_F;
    k.softcap = p->softcap > 0.0f;
    k.sc = k.softcap ? scale / p->softcap : 0.0f;
    k.cl = k.softcap ? p->softcap * LOG2E_F : 0.0f;
    k.causal = p->causal, k.wl = p->window_left, k.wr = p->window_right;
    k.sample_every = p->sample_every, k.sample_rows = p->sample_rows, k.seed = p->sample_seed;
    k.collapse = p->collapse_threshold > 0.0f ? p->collapse_threshold : STATS_DEFAULT_COLLAPSE;
    k.row_h = row_entropy, k.row_m = row_maxlogit;
    k.sampled = p->sample_every > 1 || p->sample_rows > 0;
    part *parts = (part *)((char *)ctx->ws + pl.parts_off);
    stats_head *heads_ws = (stats_head *)heads_dev;

    if (k.sampled && (row_entropy || row_maxlogit)) {
        long long n = (long long)(packed ? 1 : p->batch) * p->heads_q * p->len_q;
        long long blocks = (n + 255) / 256;
        if (blocks > (long long)ctx->sm_count * 8)
            blocks = (long long)ctx->sm_count * 8;
        fill_rows_kernel<<<(unsigned)blocks, 256, 0, s>>>(row_entropy, row_maxlogit, n);
        CUDA_TRY(cudaGetLastError(), "launch of fill_rows_kernel");
    }
    if (packed) {
        int threads = p->batch < 1024 ? ((p->batch + 31) / 32) * 32 : 1024;
        packed_offsets_kernel<<<1, threads, 0, s>>>(k, (int *)((char *)ctx->ws + pl.off_off));
        CUDA_TRY(cudaGetLastError(), "launch of packed_offsets_kernel");
    }
    dim3 grid((unsigned)pl.blocks_per_head, (unsigned)p->heads_q);
    if (pl.w) {
        mma_kernel_fn fn = p->dtype == STATS_F16 ? pl.w->f16 : pl.w->bf16;
        fn<<<grid, pl.w->nwg * 128, pl.w->smem, s>>>(k, parts);
        CUDA_TRY(cudaGetLastError(), "launch of stats_wgmma_kernel");
    } else if (pl.v) {
        mma_kernel_fn fn = p->dtype == STATS_F16 ? pl.v->f16 : pl.v->bf16;
        fn<<<grid, MMA_WARPS * 32, pl.v->smem, s>>>(k, parts);
        CUDA_TRY(cudaGetLastError(), "launch of stats_mma_kernel");
    } else {
        stats_generic_kernel<<<grid, GEN_WARPS * 32, 0, s>>>(k, parts);
        CUDA_TRY(cudaGetLastError(), "launch of stats_generic_kernel");
    }
    reduce_heads_kernel<<<p->heads_q, 256, 0, s>>>(parts, pl.blocks_per_head, k.sampled, heads_ws);
    CUDA_TRY(cudaGetLastError(), "launch of reduce_heads_kernel");
    return STATS_OK;
}

extern "C" stats_status stats_cuda_run(stats_cuda *ctx, const stats_problem *p, void *stream,
                                       stats_head *heads, float *row_entropy, float *row_maxlogit,
                                       stats_error *err)
{
    if (err)
        err->msg[0] = '\0';
    stats_status st = check_problem(ctx, p, err);
    if (st != STATS_OK)
        return st;
    if (!heads)
        return fail(err, STATS_EINVAL, "stats_cuda: heads output is NULL");
    CUDA_TRY(cudaSetDevice(ctx->device), "cudaSetDevice");
    plan pl;
    st = make_plan(ctx, p, &pl, err);
    if (st != STATS_OK)
        return st;
    st = grow(ctx, pl.bytes, stream, err);
    if (st != STATS_OK)
        return st;
    if (ctx->host_heads < (size_t)p->heads_q) {
        if (ctx->host) {
            CUDA_TRY(cudaStreamSynchronize((cudaStream_t)stream), "cudaStreamSynchronize");
            CUDA_TRY(cudaFreeHost(ctx->host), "cudaFreeHost");
        }
        ctx->host = NULL;
        ctx->host_heads = 0;
        CUDA_TRY(cudaMallocHost((void **)&ctx->host, sizeof(stats_head) * (size_t)p->heads_q),
                 "cudaMallocHost(per-head staging)");
        ctx->host_heads = (size_t)p->heads_q;
    }
    stats_head *heads_ws = (stats_head *)((char *)ctx->ws + pl.heads_off);
    st = stats_cuda_run_async(ctx, p, stream, heads_ws, row_entropy, row_maxlogit, err);
    if (st != STATS_OK)
        return st;
    cudaStream_t s = (cudaStream_t)stream;
    cudaError_t ce = cudaMemcpyAsync(ctx->host, heads_ws, sizeof(stats_head) * (size_t)p->heads_q,
                                     cudaMemcpyDeviceToHost, s);
    if (ce != cudaSuccess) {
        /* The kernels are launched: wait for them before returning, so that the caller does not
         * release the memory they read while they still run. */
        cudaError_t se = cudaStreamSynchronize(s);
        return fail(err, STATS_EDEVICE,
                    "stats_cuda: cudaMemcpyAsync(per-head statistics to the host) failed: %s (%s, "
                    "code %d); cudaStreamSynchronize after it: %s", cudaGetErrorString(ce),
                    cudaGetErrorName(ce), (int)ce,
                    se == cudaSuccess ? "ok" : cudaGetErrorString(se));
    }
    CUDA_TRY(cudaStreamSynchronize(s), "cudaStreamSynchronize (a kernel may have faulted)");
    memcpy(heads, ctx->host, sizeof(stats_head) * (size_t)p->heads_q);
    return STATS_OK;
}
