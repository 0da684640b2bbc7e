/* wgmma_sm90.cu — variant 0 (variants.h): the first Hopper kernel, stats_wgmma_kernel, Q.K^T on
 * wgmma m64n64k16 (sm_90a), 3 warpgroups x 64 rows, 64-key tiles, Q fragments in registers ("3wg
 * n64 rs"). The fold2 kernels (wgf_sm90.cu, variants 1-3) keep its shape and replaced it as the
 * default. Stage: the CUDA backend of stats.h. Includes sm90.cuh; exports stats_wgmma_sm90
 * (kernels.h). Outside the sm_90a pass the kernel body is empty (never launched there).
 *
 * The template still takes the shapes that bench/kernel_notes.md measured in round 3 (2
 * warpgroups, 128-key tiles, Q in shared memory, polynomial exps); only the fastest one is
 * instantiated, and the m64n128 wgmma wrappers the 128-key tiles need were removed.
 *
 * Build alone (as kernels/cuda.cmake does):
 *   nvcc -std=c++17 -O3 -Ikernels -gencode=arch=compute_90a,code=sm_90a \
 *     -gencode=arch=compute_80,code=sm_80 -gencode=arch=compute_80,code=compute_80 \
 *     -Xptxas=-v -c kernels/cuda/wgmma_sm90.cu */
#include "sm90.cuh"

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


/* grid (blocks_per_head, Hq), block NWG * 128 (384: 3 warpgroups of 64 rows). q: [B, Hq, Nq, D],
 * k: [B, Hkv, Nk, D] by strides; CTA (x, h) takes BM sampled rows (block_first_sample) of its
 * sequence, BM = NWG * 64 (warp w: rows [w*16, w*16 + 16)); parts: [Hq, blocks_per_head]. As
 * stats_mma_kernel, with Q.K^T issued asynchronously on wgmma: the logits of tile t+1 are computed
 * while the warps fold tile t (two accumulator sets), and K goes through WG_STAGES stages, WG_PF
 * tiles ahead. */
template <int DP, bool F16, int NWG, int BN, bool SS, int POLY>
__global__ void __launch_bounds__(NWG * 128, 1) stats_wgmma_kernel(const kparams p, part *parts)
{
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
    if (gate_closed(p.gate, p.gate_general))
        return;
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
    part_init(acc, false);
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
        int j = block_first_sample(si, BM) + r;
        s_row[r] = j >= 0 && j < si.nsamp ? (int)stats_row_of_sample((unsigned)j, (unsigned)si.lq,
                                                            p.sample_every, p.sample_rows, p.seed)
                                : -1;
    }
    __syncthreads();
    for (int r = tid; r < BM; r += NTH) {
        if (s_row[r] >= 0) {
            int lo, hi;
            visible_range(p, si, h, s_row[r], &lo, &hi);
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
            visible_range(p, si, h, i, &lo[0][hr], &hi[0][hr]);
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

    const float sink = head_sink(p, h);
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
            row_done<false>(p, acc, ro, hi[0][hr] - lo[0][hr] + 1, M[0][hr], lr, wr, M[0][hr], sink,
                     NAN, NAN); /* sink mass and distance: not computed here */
        }
    }
    block_store_part<0, false>(acc, &parts[(long long)h * p.blocks_per_head + x]);
#endif
}

/* ---- the instances: variant 0 at head_dim 64 and 128 (kernels.h WG_NDP) ---------------------- */

#define WG_ONE(DP, NWG, BN, SS, POLY, TAG)                                                         \
    { DP, wg_shape<DP, NWG, BN, SS>::BM, NWG * 128, wg_shape<DP, NWG, BN, SS>::smem_bytes,          \
      stats_wgmma_kernel<DP, false, NWG, BN, SS, POLY>,                                            \
      stats_wgmma_kernel<DP, true, NWG, BN, SS, POLY>, "wgmma bf16 d" #DP " " TAG,                 \
      "wgmma f16 d" #DP " " TAG, "stats_wgmma_kernel", NULL, NULL, 0 }

const kernel_instance stats_wgmma_sm90[] = {
    WG_ONE(64, WG_WARPGROUPS, WG_KEYS, false, 0, "3wg n64 rs"),
    WG_ONE(128, WG_WARPGROUPS, WG_KEYS, false, 0, "3wg n64 rs"),
};
