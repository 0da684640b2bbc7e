/* wgf_sm90.cu — variants 1, 2 (the default until round 7; still float32's) and 3 (variants.h): the fold2 Hopper kernel,
 * stats_wgf_kernel<DP, F16, SW, MB>, on wgmma m64n64k16 (sm_90a) in variant 0's shape (3
 * warpgroups x 64 rows, 64-key tiles, Q fragments in registers, two accumulator sets, tiles in
 * pairs) with a shorter fold (fold_lane: per-lane row states, tree max, partial sums):
 *   variant 1  fold2             the K-tile addressing computed once per thread
 *   variant 2  fold2 sw128       + K in the 128-byte swizzle layout, a whole line per 8 lanes (SW)
 *   variant 3  fold2 sw128 mbar  + per-stage mbarriers instead of the per-tile CTA barrier (MB)
 * bench/kernel_notes.md (round 4) has the design, the predictions and the measurements. Stage: the
 * CUDA backend of stats.h. Includes sm90.cuh; exports stats_wgf_sm90 (kernels.h). Outside the
 * sm_90a pass the kernel body is empty (never launched there).
 *
 * Build alone (as kernels/cuda.cmake does):
 *   nvcc -std=c++17 -O3 -Ikernels -gencode=arch=compute_90a,code=sm_90a \
 *     -gencode=arch=compute_80,code=sm_80 -gencode=arch=compute_80,code=compute_80 \
 *     -Xptxas=-v -c kernels/cuda/wgf_sm90.cu */
#include "sm90.cuh"

/* K pipeline of the fold2 kernels. MB = false: as stats_wgmma_kernel (4 stages, 2 tiles ahead, a
 * CTA barrier per tile). MB = true: 8 stages, 4 tiles ahead, and per-stage mbarriers instead of the
 * CTA barrier: a warp publishes tile t (its copies landed, proxy fence, one arrival per warp on
 * full[t % 8]) two steps before t is multiplied, and releases tile t (one arrival per warp on
 * empty[t % 8]) once its warpgroup's wgmma on it completed; a stage is refilled after every warp
 * released it. Warpgroups can then drift up to about two tiles apart instead of meeting at every
 * tile. */

/* SW: K tiles in the 128-byte swizzle layout (DP/64 columns of 64 keys x 128 bytes), loaded a
 * whole 128-byte line per 8 lanes; else the no-swizzle core-matrix layout of stats_wgmma_kernel.
 * The K pipeline (stages, prefetch distance, MB): wgf_pipe in kernels.h. */
template <int DP, bool SW, bool MB> struct wgf_shape {
    static constexpr int BM = WG_WARPGROUPS * 64, BN = WG_KEYS, LDQ = DP + 8, KTILE = BN * DP;
    static constexpr size_t smem_bytes = (SW ? 1024 : 0) +
                                         (size_t)wgf_pipe<MB>::STAGES * KTILE * 2 +
                                         (size_t)BM * LDQ * 2 + (size_t)BM * sizeof(int);
};

/* grid (blocks_per_head, Hq), block 384 (3 warpgroups of 64 rows, 64-key tiles, Q in registers).
 * q: [B, Hq, Nq, D], k: [B, Hkv, Nk, D] by strides; CTA (x, h) takes 192 sampled rows of its
 * sequence (block_first_sample) (warp w: rows [w*16, w*16 + 16)); parts: [Hq, blocks_per_head].
 * Variant 0's shape (stats_wgmma_kernel) with the fold of fold_lane, the K-tile addressing
 * computed once per thread (a pointer bump and up to 3 predicated copies per tile), SW the swizzled, line-wide K
 * loads (half the L2 tag lookups of the core-matrix loads), MB the mbarrier pipeline. CVT: q and k
 * are float32, rounded to the operand type (F16 or bf16) as they are loaded into shared memory
 * (st_chunk_from_f32: synchronous loads, so the K tile of it + PF is loaded after tile it's wgmma
 * is issued, under the tensor cores' work); no copy of the tensors. */
template <int DP, bool F16, bool SW, bool MB, bool CVT>
__global__ void __launch_bounds__(WG_WARPGROUPS * 128, 1)
    stats_wgf_kernel(const kparams p, part *parts)
{
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
    if (gate_closed(p.gate, p.gate_general))
        return;
    constexpr int NWG = WG_WARPGROUPS, NTH = NWG * 128, BN = WG_KEYS, NT = BN / 8;
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
    part_init(acc, false);
    seqinfo si;
    if (!cta_sequence(p, x, &si)) {
        if (tid == 0)
            parts[(long long)h * p.blocks_per_head + x] = acc;
        return;
    }
    const int kvh = h / p.group;
    constexpr int ES = CVT ? 4 : 2; /* bytes per element of q and k in memory */
    const char *qrow0 = p.q + ((long long)si.tb * p.qsb + (long long)h * p.qsh +
                               (long long)si.q0 * p.qsn) * ES;
    const char *krow0 = p.k + ((long long)si.tb * p.ksb + (long long)kvh * p.ksh +
                               (long long)si.k0 * p.ksn) * ES;

    if (tid == 0) {
        s_range[0] = 0x7fffffff, s_range[1] = -1;
        if (MB)
            for (int st = 0; st < ST; st++) {
                mbar_init(&s_full[st], NWG * 4);
                mbar_init(&s_empty[st], NWG * 4);
            }
    }
    for (int r = tid; r < BM; r += NTH) {
        int j = block_first_sample(si, BM) + r;
        s_row[r] = j >= 0 && j < si.nsamp ? (int)stats_row_of_sample((unsigned)j, (unsigned)si.lq,
                                                            p.sample_every, p.sample_rows, p.seed)
                                : -1;
    }
    __syncthreads();
    block_key_range<BM>(p, si, h, s_row, s_range, tid, NTH);
    for (int idx = tid; idx < BM * CH; idx += NTH) {
        int r = idx / CH, c = idx - r * CH;
        int i = s_row[r], bytes = 0;
        const char *src = p.q;
        if (i >= 0) {
            int rem = (p.d - c * 8) * 2;
            bytes = rem >= 16 ? 16 : (rem > 0 ? rem : 0);
            if (bytes > 0)
                src = qrow0 + ((long long)i * p.qsn + c * 8) * ES;
        }
        if (CVT)
            st_chunk_from_f32<F16>(sq + r * LDQ + c * 8, (const float *)src, bytes / 2);
        else
            cp_async16(sq + r * LDQ + c * 8, src, bytes);
    }
    cp_async_commit();

    /* this thread's rows: warp*16 + hr*8 + g */
    warp_keys wk;
    warp_rows_range(p, si, h, s_row, warp, g, wk);
    const int(&lo)[2] = wk.lo, (&hi)[2] = wk.hi;
    const int wlo_min = wk.lo_min, wlo_max = wk.lo_max, whi_min = wk.hi_min, whi_max = wk.hi_max;

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
    const long long kpitch = p.ksn * ES; /* bytes between keys */
    /* the strides in bytes once (a tile, a thread's next chunk), so that a tile's addresses are
     * one multiply-add and then an add per chunk, not a 64-bit product per chunk */
    const long long ktile = (long long)BN * kpitch, kchunk = (long long)NS * kpitch;
    const char *kthr = krow0 + (long long)n0 * kpitch + cg * 8 * ES; /* chunk 0 of tile 0 */
    const int klim = kbytes > 0 ? si.lk - n0 : 0; /* chunk i of tile t in range: t*BN + i*NS < klim */
    const bool last_ok = tid + (NIT - 1) * NTH < BN * CH;
    auto load_tile = [&](int stage, int t) {
        const int j0 = t * BN;
        const char *src = kthr + (long long)t * ktile;
        unsigned short *dst = (unsigned short *)((char *)sk + (size_t)stage * S::KTILE * 2 + soff0);
#pragma unroll
        for (int i = 0; i < NIT; i++) {
            if (i == NIT - 1 && !last_ok)
                break;
            const bool in = j0 + i * NS < klim;
            if (CVT)
                st_chunk_from_f32<F16>((char *)dst + i * SSTEP,
                                       (const float *)(in ? src : p.k), in ? kbytes / 2 : 0);
            else
                cp_async16((char *)dst + i * SSTEP, in ? src : p.k, in ? kbytes : 0);
            src += kchunk;
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
            if (!CVT && t + PF <= t_end)
                load_tile((it + PF) % ST, t + PF);
            cp_async_commit();
        }
        const unsigned short *kt = sk + (it & (ST - 1)) * S::KTILE;
        /* the tile's descriptor once, then a constant added per k16 step (elements x 2 bytes) */
        const unsigned long long kd = SW ? wg_desc_sw128(kt) : wg_desc(kt, 128, CH * 128);
        reg_fence(cur[0]);
        wgmma_fence();
#pragma unroll
        for (int ks = 0; ks < KS; ks++)
            wgmma_op<NT, false, F16>::run(
                cur[0], qf[ks], 0ull,
                wg_desc_advance(kd, SW ? ((ks >> 2) * BN * 64 + (ks & 3) * 16) * 2 : ks * 128 * 2),
                ks > 0);
        wgmma_commit();
        if (CVT && !MB && t + PF <= t_end) /* synchronous loads, under this tile's wgmma */
            load_tile((it + PF) % ST, t + PF);
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

    warp_rows_done(p, si, h, s_row, warp, g, tq, wk, M, l, W, acc);
    block_store_part<0, false>(acc, &parts[(long long)h * p.blocks_per_head + x]);
#endif
}

/* ---- the instances: variants 1-3 at head_dim 64 and 128 (kernels.h WGF_NVAR x WG_NDP) -------- */

/* FROM_F32: the float32 instances (CVT), built for variant 2 only (AUTO's for float32 inputs). */
#define WGF_ONE(DP, SW, MB, TAG, FROM_F32)                                                         \
    { DP, wgf_shape<DP, SW, MB>::BM, WG_WARPGROUPS * 128, wgf_shape<DP, SW, MB>::smem_bytes,        \
      stats_wgf_kernel<DP, false, SW, MB, false>, stats_wgf_kernel<DP, true, SW, MB, false>,       \
      "wgmma bf16 d" #DP " " TAG, "wgmma f16 d" #DP " " TAG, "stats_wgf_kernel",                   \
      FROM_F32 ? stats_wgf_kernel<DP, false, SW, MB, FROM_F32> : NULL,                             \
      FROM_F32 ? stats_wgf_kernel<DP, true, SW, MB, FROM_F32> : NULL, 0 }
#define WGF_VARIANT(SW, MB, TAG, FROM_F32)                                                         \
    {WGF_ONE(64, SW, MB, TAG, FROM_F32), WGF_ONE(128, SW, MB, TAG, FROM_F32)}

const kernel_instance stats_wgf_sm90[][WG_NDP] = {
    WGF_VARIANT(false, false, "fold2", false),          /* variant 1 */
    WGF_VARIANT(true, false, "fold2 sw128", true),      /* variant 2: float32 inputs */
    WGF_VARIANT(true, true, "fold2 sw128 mbar", false), /* variant 3 */
};
