/* generic.cu — the kernels that use no tensor core, and their launchers:
 *   mask_ranges          before the statistics kernel, masked runs: each mask row's interval of
 *                        keys, and whether the mask is general (read per logit) instead
 *   fill_rows            before the statistics kernel, sampled runs: per-row outputs set to
 *                        "not computed" (STATS_ROW_SKIPPED, -inf) before the kernel writes the
 *                        sampled rows
 *   packed_offsets       before it, packed runs: the first block of each sequence (a scan)
 *   stats_generic_kernel variant 5 (variants.h): the statistics on CUDA cores for any dtype (f32,
 *                        f16, bf16), head_dim and stride; the path of every problem the
 *                        tensor-core kernels cannot take (f32, unaligned data or strides) and of
 *                        STATS_CUDA_PATH_GENERIC (a cross-check)
 *   reduce_heads         after it, every variant: the per-CTA partials of each head merged in a
 *                        fixed order (the result never depends on scheduling) into a stats_head
 * Stage: the CUDA backend of stats.h. Includes common.cuh; exports stats_generic_cuda,
 * launch_fill_rows, launch_packed_offsets and launch_reduce_heads (kernels.h).
 *
 * reduce_heads and stats_generic_kernel share this file on purpose: both use block_store_part's
 * shared array, and in a file where only one kernel uses it the compiler moves it into that kernel,
 * which lays out the kernel's shared memory in another order (different machine code for the same
 * program; kernels/dev/sass_compare.py shows it).
 *
 * Build alone (as kernels/cuda.cmake does):
 *   nvcc -std=c++17 -O3 -Ikernels -gencode=arch=compute_90a,code=sm_90a \
 *     -gencode=arch=compute_80,code=sm_80 -gencode=arch=compute_80,code=compute_80 \
 *     -Xptxas=-v -c kernels/cuda/generic.cu */
#include "common.cuh"

/* ---- before the statistics kernel ------------------------------------------------------------ */

/* grid-stride, block FILL_THREADS: row_h, row_m [n] (either may be NULL), n = B * Hq * Nq. */
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

/* grid 1, block min(batch rounded up to 32, 1024). First the offsets as every kernel after this
 * one reads them, into sq and sk [batch + 1] (right after blk_off): each the running maximum of
 * those given, clamped to [0, len]. Device offsets are never read on the host, so nothing else
 * holds them to the packed layout: a decreasing one would let sequences overlap, multiplying the
 * rows computed past the bound the daemon admitted the push under (each sequence up to len rows)
 * and overflowing the block counts below. Offsets that were valid are unchanged. Then blk_off
 * [batch + 1], blk_off[s] = sum over sequences t < s of ceil(sampled rows of t / rows_per_cta);
 * blk_off[batch] = blocks in all (at most len_q / rows_per_cta + batch: no overflow). */
__global__ void packed_offsets_kernel(kparams p, int *blk_off)
{
    __shared__ int s_sum[1024], s_mq[1024], s_mk[1024];
    const int t = threadIdx.x, nt = blockDim.x, ne = p.batch + 1;
    int *sq = blk_off + ne, *sk = sq + ne;
    const int pe = (ne + nt - 1) / nt, e0 = t * pe;
    int mq = 0, mk = 0;
    for (int e = e0; e < e0 + pe && e < ne; e++)
        mq = max(mq, p.cu_q[e]), mk = max(mk, p.cu_k[e]);
    s_mq[t] = mq, s_mk[t] = mk;
    __syncthreads();
    if (t == 0) { /* exclusive running maximum over threads; nt is small */
        int rq = 0, rk = 0;
        for (int i = 0; i < nt; i++) {
            const int vq = s_mq[i], vk = s_mk[i];
            s_mq[i] = rq, s_mk[i] = rk;
            rq = max(rq, vq), rk = max(rk, vk);
        }
    }
    __syncthreads();
    mq = s_mq[t], mk = s_mk[t];
    for (int e = e0; e < e0 + pe && e < ne; e++) {
        mq = max(mq, p.cu_q[e]), mk = max(mk, p.cu_k[e]);
        sq[e] = min(mq, p.len_q), sk[e] = min(mk, p.len_k);
    }
    __syncthreads(); /* sq, sk written by the block's threads: visible to all of them after it */

    const int per = (p.batch + nt - 1) / nt, s0 = t * per;
    int local = 0;
    for (int s = s0; s < s0 + per && s < p.batch; s++) {
        int n = sampled_count_dev(p, sq[s + 1] - sq[s]);
        local += (n + p.rows_per_cta - 1) / p.rows_per_cta;
    }
    s_sum[t] = local;
    __syncthreads();
    if (t == 0) { /* exclusive scan over threads */
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
        int n = sampled_count_dev(p, sq[s + 1] - sq[s]);
        blk_off[s] = run;
        run += (n + p.rows_per_cta - 1) / p.rows_per_cta;
    }
}

/* ---- variant 5: the statistics on CUDA cores ------------------------------------------------- */

/* Element off of a tensor of any dtype, as float. */
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

/* A q or k element as the logits see it: rounded to the compute dtype when it is another 16-bit
 * type than the tensor's (stats.h, compute_dtype). */
static __device__ __forceinline__ float load_qk(const void *base, long long off, const kparams &p)
{
    float v = load_elem(base, off, p.dtype);
    if (p.compute == STATS_BF16 && p.dtype != STATS_BF16)
        v = __bfloat162float(__float2bfloat16_rn(v));
    else if (p.compute == STATS_F16 && p.dtype != STATS_F16)
        v = __half2float(__float2half_rn(v));
    return v;
}

/* Element j of the mask row at element offset mrow: whether key j takes part, and its additive
 * bias (natural-log units; 0 for a boolean mask). -inf and the dtype's lowest finite value
 * exclude the key (stats.h). */
static __device__ __forceinline__ bool mask_take(const kparams &p, long long mrow, int j,
                                                 float *bias)
{
    *bias = 0.0f;
    if (p.mdtype == STATS_BOOL)
        return p.mask[mrow + j] != 0;
    if (p.mdtype == STATS_F32) {
        const float v = ((const float *)p.mask)[mrow + j];
        if (v == -INFINITY || v <= -3.402823466e38f)
            return false;
        *bias = v;
        return true;
    }
    const unsigned short u = ((const unsigned short *)p.mask)[mrow + j];
    const bool f16 = p.mdtype == STATS_F16;
    if (u == (f16 ? 0xfc00 : 0xff80) || u == (f16 ? 0xfbff : 0xff7f))
        return false;
    *bias = load_elem(p.mask, mrow + j, p.mdtype);
    return true;
}

/* The logit (base 2, the mask's bias included) of the first key of [lo, hi] that a row takes,
 * for its sink mass: lo, or under a general mask the first the mask lets through (a ballot per 32
 * keys). The warp's lanes share the dot product (q in shared memory; k from kseq, the sequence's
 * key 0). NaN when the row takes no key. Every lane gets the value. */
static __device__ __forceinline__ float first_logit(const kparams &p, const float *q,
                                                   long long kseq, long long mrow, int lo, int hi,
                                                   int lane)
{
    int first = lo;
    float bias = 0.0f;
    if (p.mask) {
        first = hi + 1;
        for (int j0 = lo; j0 <= hi; j0 += 32) {
            float b = 0.0f;
            const bool take = j0 + lane <= hi && mask_take(p, mrow, j0 + lane, &b);
            const unsigned bal = __ballot_sync(0xffffffffu, take);
            if (bal) {
                const int src = __ffs(bal) - 1;
                first = j0 + src;
                bias = __shfl_sync(0xffffffffu, b, src);
                break;
            }
        }
    }
    if (first > hi)
        return NAN;
    const long long koff = kseq + (long long)first * p.ksn;
    float dot = 0.0f;
    for (int e = lane; e < p.d; e += 32)
        dot = fmaf(q[e], load_qk(p.k, koff + e, p), dot);
    for (int m = 16; m > 0; m >>= 1)
        dot += __shfl_xor_sync(0xffffffffu, dot, m);
    const float xv = p.softcap ? p.cl * tanhf(dot * p.sc) : dot * p.c;
    return xv + bias * LOG2E_F;
}

/* Block x of head h (the CUDA-core kernels below): its rows into one part, parts[h][x]. */
static __device__ __forceinline__ void generic_block(const kparams &p, part *parts, int h, int x)
{
    __shared__ float s_q[GEN_WARPS][STATS_MAX_HEAD_DIM];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
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
        visible_range(p, si, h, i, &lo, &hi);
        long long qoff = (long long)si.tb * p.qsb + (long long)h * p.qsh + (long long)(si.q0 + i) * p.qsn;
        __syncwarp();
        for (int e = lane; e < p.d; e += 32)
            s_q[warp][e] = load_qk(p.q, qoff + e, p);
        __syncwarp();
        /* D = sum 2^(u) |pos - j|, with l's scale (the row's first visible key's logit is
         * computed after the loop: held in it, it spilled the gated kernel's registers) */
        float M = -INFINITY, l = 0.0f, W = 0.0f, Mraw = -INFINITY, D = 0.0f;
        int nvis = 0;
        const int pos = i + si.lk - si.lq; /* the causal diagonal: stats.h's pos_i */
        long long kbase = (long long)si.tb * p.ksb + (long long)kvh * p.ksh;
        const long long mrow = p.mask ? (long long)si.tb * p.msb + (long long)h * p.msh +
                                            (long long)i * p.msn
                                      : 0;
        for (int kj = lo + lane; kj <= hi; kj += 32) {
            float bias = 0.0f;
            if (p.mask && !mask_take(p, mrow, kj, &bias))
                continue;
            nvis++;
            long long koff = kbase + (long long)(si.k0 + kj) * p.ksn;
            float dot = 0.0f;
            for (int e = 0; e < p.d; e++)
                dot = fmaf(s_q[warp][e], load_qk(p.k, koff + e, p), dot);
            float xv = p.softcap ? p.cl * tanhf(dot * p.sc) : dot * p.c;
            Mraw = fmaxf(Mraw, xv);
            xv += bias * LOG2E_F;
            if (xv > M) {
                if (M > -INFINITY) {
                    float dd = M - xv, a = ex2(dd);
                    W = a * W + a * dd * l;
                    l = a * l;
                    D = a * D;
                }
                M = xv;
            }
            float u = xv - M, pe = ex2(u);
            l += pe;
            W = fmaf(pe, u, W);
            D = fmaf(pe, (float)abs(pos - kj), D);
        }
        const float Mlane = M;
        for (int m = 1; m < 32; m <<= 1) {
            float M2 = __shfl_xor_sync(0xffffffffu, M, m), l2 = __shfl_xor_sync(0xffffffffu, l, m);
            float W2 = __shfl_xor_sync(0xffffffffu, W, m);
            state_merge(M, l, W, M2, l2, W2);
            Mraw = fmaxf(Mraw, __shfl_xor_sync(0xffffffffu, Mraw, m));
            nvis += __shfl_xor_sync(0xffffffffu, nvis, m);
        }
        /* D to the row's max (every lane's M is it now); a lane with D = 0 adds nothing (its own
         * max may be -inf) */
        D = D != 0.0f ? D * ex2(Mlane - M) : 0.0f;
        for (int m = 1; m < 32; m <<= 1)
            D += __shfl_xor_sync(0xffffffffu, D, m);
        const float F = first_logit(p, s_q[warp], kbase + (long long)si.k0 * p.ksn, mrow, lo, hi,
                                    lane);
        if (lane == 0) {
            /* the head's sink is read here, at each of the warp's few rows: held across the row
             * loop it cost 15 registers on sm_80 (64 -> 79, one CTA less per SM) */
            long long ro = ((long long)si.tb * p.hq + h) * p.len_q + si.q0 + i;
            row_done(p, acc, ro, p.mask ? nvis : hi - lo + 1, M, l, W, p.mask ? Mraw : M,
                     head_sink(p, h), F, D);
        }
    }
    block_store_part(acc, &parts[(long long)h * p.blocks_per_head + x]);
}

/* grid (blocks_per_head, Hq), block 256; CTA (x, h) takes sampled rows [blk*GEN_BM, blk*GEN_BM +
 * GEN_BM) of its sequence, each warp GEN_ROWS_PER_WARP of them, each lane every 32nd visible key.
 * q: [B, Hq, Nq, D], k: [B, Hkv, Nk, D] by strides; parts: [Hq, blocks_per_head]. A general mask
 * (p.mask) is read per logit: keys it excludes are skipped, its biases added to the logits (the
 * reported max logit stays without them). */
__global__ void __launch_bounds__(GEN_WARPS * 32) stats_generic_kernel(const kparams p, part *parts)
{
    if (gate_closed(p.gate, p.gate_general))
        return;
    generic_block(p, parts, blockIdx.y, blockIdx.x);
}

/* The same behind a masked run's gate (launch.cu): grid (gx, Hq) with gx <= blocks_per_head, CTA
 * (x, h) taking blocks x, x + gx, ... of head h. The gate is closed for every mask but a general
 * one, and a grid of blocks_per_head x Hq CTAs returning at once took 20 us of a (4,32/4,2048,64)
 * push (kernel_notes.md round 8); a wave of CTAs returns in a few. Two CTAs per SM: at three (80
 * registers) ptxas spilled on sm_90a once the fold also kept the distance sum (D); before it, three
 * fitted and four spilled. */
__global__ void __launch_bounds__(GEN_WARPS * 32, GEN_GATED_CTAS_PER_SM)
    stats_generic_gated_kernel(const kparams p, part *parts)
{
    if (gate_closed(p.gate, p.gate_general))
        return;
    for (int x = blockIdx.x; x < p.blocks_per_head; x += gridDim.x) {
        generic_block(p, parts, blockIdx.y, x);
        __syncthreads(); /* block_store_part's shared partials read before the next block's */
    }
}

/* ---- before it, masked runs: each mask row's interval of keys --------------------------------- */

/* Bit b (0..3) set when byte b of w (little-endian: key 4i + b of a 16-byte chunk's word i) is
 * non-zero. */
static __device__ __forceinline__ unsigned nz_bytes(unsigned w)
{
    return (w & 0xffu ? 1u : 0u) | (w & 0xff00u ? 2u : 0u) | (w & 0xff0000u ? 4u : 0u) |
           (w & 0xff000000u ? 8u : 0u);
}

/* grid-stride over the mask's rows, a warp per row: rows [mb * mh * len_q), row r = (b', h', i)
 * with i = r % len_q, h' = (r / len_q) % mh, b' = r / (len_q * mh) (mask indices: 0 where the
 * mask broadcasts). rr[r] = {first, last} key that takes part ({1, 0}: none); *general |= 1 when
 * the keys between first and last are not all taken, or a taken key carries a non-zero bias. */
__global__ void mask_ranges_kernel(const kparams p, int mb, int mh, int2 *rr, int *general)
{
    const int lane = threadIdx.x & 31, wpb = blockDim.x >> 5;
    const long long nrows = (long long)mb * mh * p.len_q;
    for (long long r = (long long)blockIdx.x * wpb + (threadIdx.x >> 5); r < nrows;
         r += (long long)gridDim.x * wpb) {
        const int i = (int)(r % p.len_q);
        const long long bh = r / p.len_q;
        const int hh = (int)(bh % mh), bb = (int)(bh / mh);
        const long long mrow = (long long)bb * p.msb + (long long)hh * p.msh + (long long)i * p.msn;
        int first = 0x7fffffff, last = -1, count = 0, biased = 0, j0 = 0;
        const unsigned char *row = (const unsigned char *)p.mask + mrow;
        if (p.mdtype == STATS_BOOL && ((unsigned long long)row & 15) == 0) {
            /* a boolean row: 16 keys per lane and load instead of one (a padded batch hands a
             * [B, 1, N, N] mask over with every call) */
            const int nv = p.len_k >> 4;
            for (int c = lane; c < nv; c += 32) {
                const uint4 v = __ldg((const uint4 *)row + c);
                const unsigned bits = nz_bytes(v.x) | nz_bytes(v.y) << 4 | nz_bytes(v.z) << 8 |
                                      nz_bytes(v.w) << 12;
                if (bits) {
                    first = min(first, 16 * c + __ffs(bits) - 1);
                    last = max(last, 16 * c + 31 - __clz(bits));
                    count += __popc(bits);
                }
            }
            j0 = nv << 4; /* the tail below, by bytes */
        }
        for (int j = j0 + lane; j < p.len_k; j += 32) {
            float b;
            if (mask_take(p, mrow, j, &b)) {
                first = min(first, j);
                last = max(last, j);
                count++;
                biased |= b != 0.0f; /* NaN too */
            }
        }
        for (int m = 1; m < 32; m <<= 1) {
            first = min(first, __shfl_xor_sync(0xffffffffu, first, m));
            last = max(last, __shfl_xor_sync(0xffffffffu, last, m));
            count += __shfl_xor_sync(0xffffffffu, count, m);
            biased |= __shfl_xor_sync(0xffffffffu, biased, m);
        }
        if (lane == 0) {
            rr[r] = count ? make_int2(first, last) : make_int2(1, 0);
            if (count && (count != last - first + 1 || biased))
                atomicOr(general, 1);
        }
    }
}

/* ---- after it: the per-head reduction -------------------------------------------------------- */

/* grid Hq, block REDUCE_THREADS: parts [Hq][nparts] -> heads [Hq]. */
__global__ void reduce_heads_kernel(const part *parts, int nparts, int sampled, stats_head *heads,
                                    const int *gate, int gate_general)
{
    if (gate_closed(gate, gate_general))
        return;
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
        o.sink_mass = o.distance = NAN;
        if (t.rows > 0) {
            double n = (double)t.rows, mean = t.sum / n, var = t.sumsq / n - mean * mean;
            o.sink_mass = t.sum_sink / n; /* NaN from a kernel that does not compute it */
            o.distance = t.sum_dist / n;
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
        if (isnan(t.sum)) /* a FOLD_MAX kernel's parts (part_init): no entropy computed */
            o.entropy_mean = o.entropy_std = o.entropy_min = o.entropy_max = o.entropy_norm_mean =
                o.collapsed_frac = NAN;
        heads[h] = o;
    }
}

/* ---- the launchers --------------------------------------------------------------------------- */

/* One kernel for every dtype; launch.cu names it by dtype ("cuda-core f32", ...). */
const kernel_instance stats_generic_cuda = {
    STATS_MAX_HEAD_DIM, GEN_BM, GEN_WARPS * 32, 0, stats_generic_kernel, stats_generic_kernel,
    NULL, NULL, "stats_generic_kernel", NULL, NULL, 0};

cudaError_t launch_fill_rows(float *row_h, float *row_m, long long n, int sm_count, cudaStream_t s)
{
    long long blocks = (n + FILL_THREADS - 1) / FILL_THREADS;
    if (blocks > (long long)sm_count * 8)
        blocks = (long long)sm_count * 8;
    fill_rows_kernel<<<(unsigned)blocks, FILL_THREADS, 0, s>>>(row_h, row_m, n);
    return cudaGetLastError();
}

cudaError_t launch_packed_offsets(const kparams &k, int *blk_off, cudaStream_t s)
{
    int threads = k.batch < 1024 ? ((k.batch + 31) / 32) * 32 : 1024;
    packed_offsets_kernel<<<1, threads, 0, s>>>(k, blk_off);
    return cudaGetLastError();
}

cudaError_t launch_generic_gated(const kparams &k, part *parts, int heads_q, int sm_count,
                                 cudaStream_t s)
{
    long long gx = ((long long)GEN_GATED_CTAS_PER_SM * sm_count + heads_q - 1) / heads_q; /* a wave */
    if (gx > k.blocks_per_head)
        gx = k.blocks_per_head;
    stats_generic_gated_kernel<<<dim3((unsigned)(gx > 0 ? gx : 1), (unsigned)heads_q),
                                 GEN_WARPS * 32, 0, s>>>(k, parts);
    return cudaGetLastError();
}

cudaError_t launch_mask_ranges(const kparams &k, int mb, int mh, int2 *rr, int *general,
                               int sm_count, cudaStream_t s)
{
    const long long rows = (long long)mb * mh * k.len_q, per = 256 / 32;
    long long blocks = (rows + per - 1) / per;
    if (blocks > (long long)sm_count * 16)
        blocks = (long long)sm_count * 16;
    mask_ranges_kernel<<<(unsigned)(blocks > 0 ? blocks : 1), 256, 0, s>>>(k, mb, mh, rr, general);
    return cudaGetLastError();
}

cudaError_t launch_reduce_heads(const part *parts, int nparts, int sampled, stats_head *heads,
                                int heads_q, const int *gate, int gate_general, cudaStream_t s)
{
    reduce_heads_kernel<<<heads_q, REDUCE_THREADS, 0, s>>>(parts, nparts, sampled, heads, gate,
                                                           gate_general);
    return cudaGetLastError();
}
