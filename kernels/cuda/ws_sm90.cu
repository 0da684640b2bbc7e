/* ws_sm90.cu — variants 6-9 (variants.h; 6 and 9 the default, launch.cu pick_wg): the
 * warp-specialised Hopper kernel, stats_ws_kernel<DP, F16, POLY, NCW, BN>.
 * One thread of a producer warpgroup loads K tiles of 128 keys with the TMA unit (128-byte
 * swizzle) into a ring of stages guarded by mbarriers (full: the tile's bytes landed; empty: every
 * consumer warp is done with it); the producer warpgroup gives its registers to the two consumer
 * warpgroups (setmaxnreg: 56 and 224 per thread), which multiply (wgmma m64n128k16, Q fragments
 * in registers, two 64-register accumulator sets) and fold (fold_lane, sm90.cuh) 64 rows each.
 * Within a warpgroup the wgmma of tile t+1 runs while tile t is folded; the warpgroups never meet
 * at a CTA barrier, so one's fold runs under the other's matrix work. The consumers compute no
 * address and issue no copy.
 * Variants 7 and 8 take 1/8 and 1/4 of the exps on the FMA pipe (ex2_poly) instead of MUFU;
 * variant 9 has three consumer warpgroups (192 rows) on 64-key tiles (m64n64k16).
 * bench/kernel_notes.md (round 7) has the design, the predictions and the measurements. Stage: the
 * CUDA backend of stats.h. Includes sm90.cuh; exports stats_ws_sm90 (kernels.h). Outside the sm_90a
 * pass the kernel body is empty (never launched there).
 *
 * Build alone (as kernels/cuda.cmake does):
 *   nvcc -std=c++17 -O3 -Ikernels -gencode=arch=compute_90a,code=sm_90a \
 *     -gencode=arch=compute_80,code=sm_80 -gencode=arch=compute_80,code=compute_80 \
 *     -Xptxas=-v -c kernels/cuda/ws_sm90.cu */
#include "sm90.cuh"

/* One CTA: NCW consumer warpgroups of 64 rows (BM rows) and the producer warpgroup (NTH threads),
 * K tiles of BN keys, the registers per thread the producer keeps (REG_P) and the consumers get
 * (REG_C; 128 * REG_P + NCW * 128 * REG_C = the block's registers at launch, NTH * 65536 / NTH).
 * Shared memory: the K ring (STAGES tiles of BN keys x DP, each DP/64 columns of BN x 128 bytes in
 * the 128-byte swizzle layout the TMA unit writes and wgmma reads), Q (the CTA's rows, padded
 * pitch for ldmatrix) and the rows' indices; 1024 bytes of slack to align the ring to the
 * swizzle's 1024-byte period. */
template <int DP, int NCW, int BN_> struct ws_shape {
    static constexpr int NTH = (NCW + 1) * 128, BM = NCW * 64, BN = BN_, LDQ = DP + 8;
    static constexpr int REG_P = NCW == 2 ? 56 : 24, REG_C = NCW == 2 ? 224 : 160;
    static_assert(128 * REG_P + NCW * 128 * REG_C <= 65536 && REG_C % 8 == 0, "registers");
    static_assert(BN % WS_BOX_KEYS == 0, "whole TMA boxes");
    static constexpr int STAGES = DP <= 64 || BN <= 64 ? 8 : 4;
    static constexpr unsigned TILE_BYTES = (unsigned)BN * DP * 2;
    static constexpr size_t smem_bytes =
        1024 + (size_t)STAGES * TILE_BYTES + (size_t)BM * LDQ * 2 + (size_t)BM * sizeof(int);
};

/* grid (blocks_per_head, Hq), block NTH: warps 0 .. 4*NCW-1 the consumer warpgroups (warp w: rows
 * [w*16, w*16 + 16) of the CTA's BM sampled rows), the last four the producer warpgroup (one thread
 * of it copies). q: [B, Hq, Nq, D] by
 * strides; K through the tensor map p.ktm. parts: [Hq, blocks_per_head]. */
template <int DP, bool F16, int POLY, int NCW, int BN_>
__global__ void __launch_bounds__(ws_shape<DP, NCW, BN_>::NTH, 1)
    stats_ws_kernel(const __grid_constant__ kparams p, part *parts)
{
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
    if (gate_closed(p.gate, p.gate_general))
        return;
    using S = ws_shape<DP, NCW, BN_>;
    constexpr int NTH = S::NTH, BN = S::BN, NT = BN / 8, BM = S::BM, LDQ = S::LDQ;
    constexpr int ST = S::STAGES, KS = DP / 16, CH = DP / 8, PRODUCER = NCW * 4;
    static_assert((ST & (ST - 1)) == 0 && ST >= 3, "K ring");
    static_assert(DP % 64 == 0, "K tiles are whole 64-element swizzle columns");
    extern __shared__ __align__(128) unsigned char ws_smem[];
    unsigned char *sk = ws_smem + ((1024u - (smem_u32(ws_smem) & 1023u)) & 1023u);
    unsigned short *sq = (unsigned short *)(sk + (size_t)ST * S::TILE_BYTES);
    int *s_row = (int *)(sq + BM * LDQ);
    __shared__ int s_range[2];
    __shared__ unsigned long long s_full[ST], s_empty[ST];

    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, tq = lane & 3;
    int h = blockIdx.y, x = blockIdx.x;
    if (p.lpt && !p.packed) {
        /* Causal blocks differ in length (the last rows see every key): the longest first, every
         * head's and sequence's before any shorter one, so that the short ones fill the last wave
         * instead of a long one running alone at the end. CTAs start in (x, then y) order. */
        const long long lin = (long long)blockIdx.y * gridDim.x + blockIdx.x;
        const int r = (int)(lin / p.hq);
        h = (int)(lin % p.hq);
        x = (r % p.batch) * p.nblk + (p.nblk - 1 - r / p.batch);
    }
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

    if (tid == 0) {
        s_range[0] = 0x7fffffff, s_range[1] = -1;
        for (int st = 0; st < ST; st++) {
            mbar_init(&s_full[st], 1);                   /* the producer's expect_tx */
            mbar_init(&s_empty[st], NCW * 4);            /* one arrival per consumer warp */
        }
        fence_mbar_init();
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
            visible_range(p, si, h, s_row[r], &lo, &hi);
            if (lo <= hi) {
                atomicMin(&s_range[0], lo);
                atomicMax(&s_range[1], hi);
            }
        }
    }
    /* Q by the consumers alone (they wait for their own copies below), so that the producer
     * starts loading K as soon as the CTA's key range is known */
    for (int idx = tid; idx < BM * CH && warp < PRODUCER; idx += PRODUCER * 32) {
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
    __syncthreads(); /* s_range final, mbarriers initialised */

    const int t_first = s_range[1] >= 0 ? s_range[0] / BN : 0;
    const int t_last = s_range[1] >= 0 ? s_range[1] / BN : -1;
    const int ntiles = (t_last - t_first + 2) & ~1, t_end = t_first + ntiles - 1;

    if (warp >= PRODUCER) {
        setmaxnreg_dec<S::REG_P>();
        /* Tile it into stage it % ST once every consumer warp released what was there (tile
         * it - ST). Keys past the tensor read as zeros; past the sequence (packed: the next
         * sequence's keys) they are outside every row's visible range, which the fold masks. */
        if (warp == PRODUCER && lane == 0 && ntiles > 0) {
            tma_prefetch_map(&p.ktm);
            const int kc = p.packed ? si.k0 : 0, bc = p.packed ? 0 : si.tb;
            for (int it = 0; it < ntiles; it++) {
                const int st = it & (ST - 1);
                if (it >= ST)
                    mbar_wait(&s_empty[st], ((it / ST) - 1) & 1);
                mbar_arrive_expect_tx(&s_full[st], S::TILE_BYTES);
                unsigned char *dst = sk + (size_t)st * S::TILE_BYTES;
#pragma unroll
                for (int c = 0; c < DP / 64; c++)
#pragma unroll
                    for (int b = 0; b < BN / WS_BOX_KEYS; b++)
                        tma_load_4d(dst + ((size_t)c * BN + b * WS_BOX_KEYS) * 128, &p.ktm, c * 64,
                                    kc + (t_first + it) * BN + b * WS_BOX_KEYS, kvh, bc,
                                    &s_full[st]);
            }
        }
        return; /* the copies complete on the mbarriers without this thread; the consumers reduce */
    } else {
        setmaxnreg_inc<S::REG_C>();
        cp_async_wait<0>();
        named_bar_sync<1, PRODUCER * 32>(); /* Q in shared memory: every consumer's copies */
        /* this thread's rows: warp*16 + hr*8 + g */
        int lo[2], hi[2];
        int wlo_min = 0x7fffffff, wlo_max = -1, whi_min = 0x7fffffff, whi_max = -1;
#pragma unroll
        for (int hr = 0; hr < 2; hr++) {
            int i = s_row[warp * 16 + hr * 8 + g];
            lo[hr] = 1, hi[hr] = 0;
            if (i >= 0)
                visible_range(p, si, h, i, &lo[hr], &hi[hr]);
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
        unsigned qf[KS][4];
#pragma unroll
        for (int ks = 0; ks < KS; ks++)
            ldmatrix_x4(qf[ks], sq + (warp * 16 + (lane & 15)) * LDQ + ks * 16 + (lane >> 4) * 8);

        float M[2], l[2], W[2];
#pragma unroll
        for (int hr = 0; hr < 2; hr++)
            M[hr] = -INFINITY, l[hr] = 0.0f, W[hr] = 0.0f;
        float sa[NT][4], sb[NT][4];

        auto fold = [&](float (&s)[NT][4], int t) {
            const int j0 = t * BN, j1 = j0 + BN - 1;
            if (j0 > whi_max || j1 < wlo_min)
                return; /* no row of this warp sees the tile */
            const bool full = j0 >= wlo_max && j1 <= whi_min;
            if (p.softcap) {
                if (full)
                    fold_lane<NT, true, false, POLY>(p, s, M, l, W, lo, hi, j0, tq);
                else
                    fold_lane<NT, true, true, POLY>(p, s, M, l, W, lo, hi, j0, tq);
            } else {
                if (full)
                    fold_lane<NT, false, false, POLY>(p, s, M, l, W, lo, hi, j0, tq);
                else
                    fold_lane<NT, false, true, POLY>(p, s, M, l, W, lo, hi, j0, tq);
            }
        };
        /* wait for tile it, issue its wgmma into cur, then release and fold tile it-1 (in prev)
         * while the tensor cores work */
        auto step = [&](int it, float (&cur)[NT][4], float (&prev)[NT][4]) {
            const int t = t_first + it, st = it & (ST - 1);
            mbar_wait(&s_full[st], (it / ST) & 1);
            const unsigned long long kd = wg_desc_sw128(sk + (size_t)st * S::TILE_BYTES);
            reg_fence(cur);
            wgmma_fence();
#pragma unroll
            for (int ks = 0; ks < KS; ks++)
                wgmma_op<NT, false, F16>::run(cur, qf[ks], 0ull,
                                              wg_desc_advance(kd, (ks >> 2) * BN * 128 + (ks & 3) * 32),
                                              ks > 0);
            wgmma_commit();
            reg_fence(cur);
            wgmma_wait<1>(prev);
            reg_fence(prev);
            if (it > 0) { /* tile it-1 is no longer read by this warp's warpgroup */
                __syncwarp();
                if (lane == 0)
                    mbar_arrive(&s_empty[(it - 1) & (ST - 1)]);
                fold(prev, t - 1);
            }
        };
        /* tiles in pairs, with no branch around a wgmma (see stats_wgmma_kernel) */
        for (int it = 0; it < ntiles; it += 2) {
            step(it, sa, sb);
            step(it + 1, sb, sa);
            wgmma_wait<0>(sb); /* nothing in flight across the loop's edge: no serialisation */
            reg_fence(sb);
        }
        if (ntiles > 0)
            fold(sb, t_end);

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
                row_done(p, acc, ro, hi[hr] - lo[hr] + 1, Mr, lr, wr, Mr);
            }
        }
    }
    block_store_part<PRODUCER>(acc, &parts[(long long)h * p.blocks_per_head + x]);
#endif
}

/* ---- the instances: variants 6-9 at head_dim 64 and 128 (kernels.h WS_NVAR x WG_NDP), 16-bit
 * inputs only. POLY: of every 8 n8 blocks of a tile, how many take their exps on the FMA pipe. */

#define WS_ONE(DP, POLY, NCW, BN, TAG)                                                             \
    { DP, ws_shape<DP, NCW, BN>::BM, ws_shape<DP, NCW, BN>::NTH,                                   \
      ws_shape<DP, NCW, BN>::smem_bytes, stats_ws_kernel<DP, false, POLY, NCW, BN>,                \
      stats_ws_kernel<DP, true, POLY, NCW, BN>, "wgmma bf16 d" #DP " " TAG,                        \
      "wgmma f16 d" #DP " " TAG, "stats_ws_kernel", NULL, NULL }
#define WS_VARIANT(POLY, NCW, BN, TAG)                                                             \
    {WS_ONE(64, POLY, NCW, BN, TAG), WS_ONE(128, POLY, NCW, BN, TAG)}

const kernel_instance stats_ws_sm90[WS_NVAR][WG_NDP] = {
    WS_VARIANT(0, 2, 128, "ws tma"),        /* variant 6, the default */
    WS_VARIANT(1, 2, 128, "ws tma p1"),     /* variant 7: 1/8 of the exps on the FMA pipe */
    WS_VARIANT(2, 2, 128, "ws tma p2"),     /* variant 8: 1/4 */
    WS_VARIANT(0, 3, 64, "ws tma 3wg n64"), /* variant 9: 3 consumer warpgroups, 64-key tiles */
};
