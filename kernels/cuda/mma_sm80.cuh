/* mma_sm80.cuh — variant 4 (variants.h): the statistics kernel on the tensor cores through
 * mma.sync m16n8k16 (bf16/f16 in, f32 accumulation), sm_80 and newer. On Hopper the Hopper
 * variants take head_dim 33..128; this one every other head_dim, Ampere, and
 * STATS_CUDA_PATH_MMA_SYNC.
 * Stage: the CUDA backend of stats.h. Includes common.cuh; included by mma_sm80.cu and
 * mma_sm80_xs.cu, whose tables (stats_mma_sm80, stats_mma_sm80_xs: kernels.h) instantiate it
 * without and with sink mass and distance (XS).
 *
 * One CTA per (head, sequence, block of BM sampled rows), MMA_WARPS warps of 16 * MT rows; K
 * streams through shared memory in tiles of MMA_BN keys (cp.async, MMA_STAGES stages, padded rows:
 * ldmatrix without bank conflicts); each warp keeps its rows' Q fragments in registers, computes
 * its 16*MT x 64 logits per tile and folds them into (M, l, W) per row (fold_tile); the CTA then
 * reduces its rows into one partial. Tile sizes: kernels.h.
 */
#ifndef ATTNSTAT_CUDA_MMA_SM80_CUH
#define ATTNSTAT_CUDA_MMA_SM80_CUH

#include "common.cuh"
#include "variants.h"

template <int DP, int MT> struct mma_shape {
    static constexpr int BM = MMA_WARPS * 16 * MT; /* sampled rows per CTA */
    static constexpr int LD = DP + 8;              /* smem row pitch in elements: no ldmatrix conflicts */
    static constexpr size_t smem_bytes =
        (size_t)(BM + MMA_STAGES * MMA_BN) * LD * 2 + (size_t)BM * sizeof(int);
};

/* Load one tile of BN keys (rows j0 .. j0+BN-1 of the sequence) into a stage; zero past lk / d.
 * CVT: k is float32, rounded to the operand type (F16 or bf16) on the way (synchronous). */
template <int DP, bool F16, bool CVT>
static __device__ __forceinline__ void load_k_tile(const kparams &p, const char *krow0,
                                                   unsigned short *dst, int j0, int lk)
{
    constexpr int CH = DP / 8, LD = DP + 8, ES = CVT ? 4 : 2;
    for (int idx = threadIdx.x; idx < MMA_BN * CH; idx += MMA_WARPS * 32) {
        int r = idx / CH, c = idx - r * CH;
        int j = j0 + r;
        int bytes = 0;
        const char *src = p.k;
        if (j < lk) {
            int rem = (p.d - c * 8) * 2;
            bytes = rem >= 16 ? 16 : (rem > 0 ? rem : 0);
            if (bytes > 0)
                src = krow0 + ((long long)j * p.ksn + c * 8) * ES;
        }
        if (CVT)
            st_chunk_from_f32<F16>(dst + r * LD + c * 8, (const float *)src, bytes / 2);
        else
            cp_async16(dst + r * LD + c * 8, src, bytes);
    }
}



/* grid (blocks_per_head, Hq), block 256. q: [B, Hq, Nq, D] by strides, k: [B, Hkv, Nk, D];
 * CTA (x, h) takes BM sampled rows of its sequence (block_first_sample), BM = MMA_WARPS * 16 * MT
 * (warp w: rows [w*16*MT, (w+1)*16*MT) of the block); parts: [Hq, blocks_per_head], this CTA's at
 * h * blocks_per_head + x; per-row outputs [B, Hq, Nq]. CVT: q and k are float32, rounded to the
 * operand type as they are loaded (the next K tile is loaded after this tile's MMAs). */
template <int DP, int MT, bool F16, bool CVT, bool XS>
__global__ void __launch_bounds__(MMA_WARPS * 32, 1) stats_mma_kernel(const kparams p, part *parts)
{
    if (gate_closed(p.gate, p.gate_general))
        return;
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
    part_init(acc, XS);
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

    if (tid == 0)
        s_range[0] = 0x7fffffff, s_range[1] = -1;
    for (int r = tid; r < BM; r += MMA_WARPS * 32) {
        int j = block_first_sample(si, BM) + r;
        s_row[r] = j >= 0 && j < si.nsamp ? (int)stats_row_of_sample((unsigned)j, (unsigned)si.lq,
                                                            p.sample_every, p.sample_rows, p.seed)
                                : -1;
    }
    __syncthreads();
    for (int r = tid; r < BM; r += MMA_WARPS * 32) {
        if (s_row[r] >= 0) {
            int lo, hi;
            visible_range(p, si, h, s_row[r], &lo, &hi);
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
                src = qrow0 + ((long long)i * p.qsn + c * 8) * ES;
        }
        if (CVT)
            st_chunk_from_f32<F16>(sq + r * LD + c * 8, (const float *)src, bytes / 2);
        else
            cp_async16(sq + r * LD + c * 8, src, bytes);
    }
    cp_async_commit();
    __syncthreads(); /* s_range final */
    const int t_first = s_range[1] >= 0 ? s_range[0] / MMA_BN : 0;
    const int t_last = s_range[1] >= 0 ? s_range[1] / MMA_BN : -1;
    for (int st = 0; st < MMA_STAGES - 1; st++) {
        if (t_first + st <= t_last)
            load_k_tile<DP, F16, CVT>(p, krow0, sk + st * MMA_BN * LD, (t_first + st) * MMA_BN,
                                      si.lk);
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
                visible_range(p, si, h, i, &lo[mt][hr], &hi[mt][hr]);
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

    float M[MT][2], l[MT][2][2], W[MT][2][2], D[MT][2];
    float F0[MT][2] = {}; /* XS: each row's first key's raw logit (first_key_pick) */
    int pos[MT][2]; /* XS: each row's causal diagonal (stats.h's pos_i) */
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int hr = 0; hr < 2; hr++) {
            M[mt][hr] = -INFINITY;
            l[mt][hr][0] = l[mt][hr][1] = W[mt][hr][0] = W[mt][hr][1] = 0.0f;
            D[mt][hr] = 0.0f;
            pos[mt][hr] = XS ? s_row[warp * 16 * MT + mt * 16 + hr * 8 + g] + si.lk - si.lq : 0;
        }

    /* ldmatrix addressing for K: lanes 0-7 keys 0-7 col 0, 8-15 keys 0-7 col 8,
     * 16-23 keys 8-15 col 0, 24-31 keys 8-15 col 8 (two n8 tiles per x4). */
    const int kb_row = (lane & 7) + ((lane >> 4) << 3), kb_col = ((lane >> 3) & 1) * 8;

    for (int t = t_first; t <= t_last; t++) {
        const int it = t - t_first;
        cp_async_wait<MMA_STAGES - 2>();
        __syncthreads();
        unsigned short *next = sk + ((it + MMA_STAGES - 1) % MMA_STAGES) * MMA_BN * LD;
        if (!CVT && t + MMA_STAGES - 1 <= t_last)
            load_k_tile<DP, F16, CVT>(p, krow0, next, (t + MMA_STAGES - 1) * MMA_BN, si.lk);
        cp_async_commit();

        const int j0 = t * MMA_BN, j1 = j0 + MMA_BN - 1;
        if (j0 > whi_max || j1 < wlo_min) { /* no row of this warp sees this tile */
            if (CVT && t + MMA_STAGES - 1 <= t_last)
                load_k_tile<DP, F16, CVT>(p, krow0, next, (t + MMA_STAGES - 1) * MMA_BN, si.lk);
            continue;
        }
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
        if (CVT && t + MMA_STAGES - 1 <= t_last) /* synchronous loads, after this tile's MMAs */
            load_k_tile<DP, F16, CVT>(p, krow0, next, (t + MMA_STAGES - 1) * MMA_BN, si.lk);
        if (XS && j0 <= wlo_max && j1 >= wlo_min) /* some row's first key is in the tile */
#pragma unroll
            for (int mt = 0; mt < MT; mt++)
                first_key_pick<NT>(s[mt], lo[mt], j0, tq, F0[mt]);
        const bool full = j0 >= wlo_max && j1 <= whi_min;
        if (p.softcap) {
            if (full)
                fold_tile<MT, NT, true, false, 0, XS>(p, s, M, l, W, lo, hi, j0, tq, D, pos);
            else
                fold_tile<MT, NT, true, true, 0, XS>(p, s, M, l, W, lo, hi, j0, tq, D, pos);
        } else {
            if (full)
                fold_tile<MT, NT, false, false, 0, XS>(p, s, M, l, W, lo, hi, j0, tq, D, pos);
            else
                fold_tile<MT, NT, false, true, 0, XS>(p, s, M, l, W, lo, hi, j0, tq, D, pos);
        }
    }
    cp_async_wait<0>();

    /* Rows: sum the four lanes of each quad, lane tq == 0 finishes the row. */
    const float sink = head_sink(p, h);
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
            float F = NAN, Dr = NAN; /* XS: M is the quad's already; D sums as l does */
            if (XS) {
                Dr = D[mt][hr];
                Dr += __shfl_xor_sync(0xffffffffu, Dr, 1);
                Dr += __shfl_xor_sync(0xffffffffu, Dr, 2);
                F = quad_first_logit(p, F0[mt][hr], i >= 0 && lo[mt][hr] <= hi[mt][hr]);
            }
            if (tq == 0 && i >= 0) {
                long long ro = ((long long)si.tb * p.hq + h) * p.len_q + si.q0 + i;
                row_done<XS>(p, acc, ro, hi[mt][hr] - lo[mt][hr] + 1, M[mt][hr], lr, wr, M[mt][hr],
                         sink, F, Dr);
            }
        }
    block_store_part<0, XS>(acc, &parts[(long long)h * p.blocks_per_head + x]);
}


/* ---- the instances: one per head_dim bucket (kernels.h MMA_NDP), in the tables of mma_sm80.cu
 * (XS = false) and mma_sm80_xs.cu (XS = true: sink mass and distance too, for the runs that ask
 * for them); two files, so that the two sets compile side by side. */

#define MMA_ONE(DP, MT, XS, XTAG)                                                                  \
    { DP, mma_shape<DP, MT>::BM, MMA_WARPS * 32, mma_shape<DP, MT>::smem_bytes,                     \
      stats_mma_kernel<DP, MT, false, false, XS>, stats_mma_kernel<DP, MT, true, false, XS>,      \
      "mma.sync bf16 d" #DP XTAG, "mma.sync f16 d" #DP XTAG, "stats_mma_kernel",                   \
      stats_mma_kernel<DP, MT, false, true, XS>, stats_mma_kernel<DP, MT, true, true, XS>, 0 }
#define MMA_TABLE(XS, XTAG)                                                                        \
    {MMA_ONE(32, MMA_MT, XS, XTAG), MMA_ONE(64, MMA_MT, XS, XTAG), MMA_ONE(96, MMA_MT, XS, XTAG),   \
     MMA_ONE(128, MMA_MT, XS, XTAG), MMA_ONE(256, MMA_MT_D256, XS, XTAG)}

#endif /* ATTNSTAT_CUDA_MMA_SM80_CUH */
