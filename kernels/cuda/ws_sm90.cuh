/* ws_sm90.cuh — variants 6-12 (variants.h; 6, 10 and 11 the default by shape, launch.cu pick_wg):
 * the warp-specialised Hopper kernel, stats_ws_kernel<DP, F16, POLY, NCW, BN, FW>.
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
 * CUDA backend of stats.h. Includes sm90.cuh; included by ws_sm90.cu, ws_sm90_xs.cu and
 * ws_sm90_mo.cu, whose tables (stats_ws_sm90, stats_ws_sm90_xs, stats_ws_sm90_mo: kernels.h)
 * instantiate it with the three folds FW (common.cuh): entropy and max logit (FOLD_BASE), also
 * sink mass and distance (FOLD_XS), the max logit alone (FOLD_MAX: fold_max, no exps). Outside the
 * sm_90a pass the kernel body is empty (never launched there). */
#ifndef ATTNSTAT_CUDA_WS_SM90_CUH
#define ATTNSTAT_CUDA_WS_SM90_CUH

#include "item.h"
#include "sm90.cuh"
#include "variants.h"

/* One CTA: NCW consumer warpgroups of 64 rows (BM rows) and the producer warpgroup (NTH threads),
 * K tiles of BN keys, the registers per thread the producer keeps (REG_P) and the consumers get
 * (REG_C; 128 * REG_P + NCW * 128 * REG_C at most the block's registers at launch, NTH x
 * REG_LAUNCH: setmaxnreg moves registers between the warpgroups, it adds none).
 * Shared memory: the K ring (STAGES tiles of BN keys x DL, each DL/64 columns of BN x 128 bytes in
 * the 128-byte swizzle layout the TMA unit writes and wgmma reads), Q (the CTA's rows, padded
 * pitch for ldmatrix) and the rows' indices; 1024 bytes of slack to align the ring to the
 * swizzle's 1024-byte period. QB (persistent kernels): Q buffers, and IS blocks' rows (info
 * slots): 1 and 2, or 2 and 4 (variant 12: the producer prepares a block two ahead; the ring
 * halves where both Q buffers and its 8 stages would not fit). */
template <int DP, int NCW, int BN_, bool PERSIST = false, int QB = 1> struct ws_shape {
    /* DL: the columns K's tiles and Q's rows are laid out for (DP rounded up to whole 64-column
     * swizzle slabs); the k-steps cover DP alone (DP 96: 6 of 16 columns, not 8: the d128
     * layout's last 32 columns hold the TMA unit's zeros and are never multiplied) */
    static constexpr int DL = (DP + 63) / 64 * 64;
    static constexpr int NTH = (NCW + 1) * 128, BM = NCW * 64, BN = BN_, LDQ = DL + 8;
    /* QS (head_dim 256): Q stays in shared memory in the layout K has (128-byte swizzle, 64
     * columns a 1024-byte-aligned slab of 64 rows x 128 bytes per consumer warpgroup) and wgmma
     * reads it from there; held in registers it would take 64 of them beside two 64-key
     * accumulators. Held for the whole block, so not in the persistent kernel (one Q buffer). */
    static constexpr bool QS = DL > 128;
    static constexpr size_t QBYTES = (size_t)BM * (QS ? DL : LDQ) * 2;
    static_assert(!QS || (!PERSIST && BN == 64), "Q in shared memory: one CTA per block, 64 keys");
    static constexpr int REG_P = NCW == 2 ? 56 : PERSIST ? 40 : 24;
    static constexpr int REG_C = NCW == 2 ? 224 : PERSIST ? 152 : 160;
    /* The CTA starts with the launch's registers per thread (__launch_bounds__(NTH, 1): 65536 /
     * NTH rounded down to 8), and setmaxnreg.inc only takes what the producer's .dec gave back:
     * past that sum the consumers wait for registers forever (48/232 at NCW 2 hung: round 22). */
    static constexpr int REG_LAUNCH = 65536 / NTH / 8 * 8;
    static_assert(REG_P + NCW * REG_C <= (NCW + 1) * REG_LAUNCH && REG_C % 8 == 0, "registers");
    static_assert(BN % WS_BOX_KEYS == 0, "whole TMA boxes");
    static_assert(QB == 1 || (QB == 2 && PERSIST), "two Q buffers: the persistent kernel");
    static constexpr int IS = QB == 1 ? 2 : 4;
    static constexpr unsigned TILE_BYTES = (unsigned)BN * DL * 2;
    static constexpr size_t fixed_bytes =
        1024 + (size_t)QB * QBYTES + (size_t)IS * BM * sizeof(int);
    /* 16 stages of 8 KB at head_dim 64 on 64-key tiles (round 23: the max logit alone waited for
     * K tiles in 19% of its consumers' samples with 8), 8 where a tile is 16 KB, 4 at 32 KB */
    static constexpr int STAGES0 = DL > 128                ? 4
                                   : DL <= 64 && BN <= 64   ? 16
                                   : DL <= 64 || BN <= 64   ? 8
                                                            : 4;
    static constexpr int STAGES =
        QB > 1 && fixed_bytes + (size_t)STAGES0 * TILE_BYTES > WS_SMEM_MAX ? STAGES0 / 2 : STAGES0;
    static constexpr size_t smem_bytes = fixed_bytes + (size_t)STAGES * TILE_BYTES;
    static_assert(smem_bytes <= WS_SMEM_MAX, "shared memory");
};

/* ---- the pieces both kernels are made of ----------------------------------------------------- */

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)

/* Block si.blk's rows: rows[r] = the r-th sampled row of the block, -1 past the last; threads t0,
 * t0 + nt, ... of those taking part. */
template <int BM>
static __device__ __forceinline__ void ws_rows(const kparams &p, const seqinfo &si, int *rows,
                                               int t0, int nt)
{
    for (int r = t0; r < BM; r += nt) {
        const int j = block_first_sample(si, BM) + r;
        rows[r] = j >= 0 && j < si.nsamp ? (int)stats_row_of_sample((unsigned)j, (unsigned)si.lq,
                                                           p.sample_every, p.sample_rows, p.seed)
                               : -1;
    }
}

/* The block's first DP columns of its Q rows into sq by cp.async (ws_shape S's layout: pitch
 * S::LDQ for ldmatrix, or S::QS's for wgmma), zeros past head_dim and for rows -1; the caller
 * commits and waits. FAST: the copy loop with one column chunk per thread (fewer instructions a
 * copy, the copies issued closer together), else the general loop over (row, chunk); which one a
 * kernel takes is measured (bench/kernel_notes.md round 19). */
template <class S, int DP, bool FAST = true>
static __device__ __forceinline__ void ws_load_q(const kparams &p, const seqinfo &si, int h,
                                                 const int *rows, unsigned short *sq, int t0, int nt)
{
    constexpr int CH = DP / 8, LDQ = S::LDQ, BM = S::BM, DL = S::DL;
    constexpr bool QS = S::QS;
    const char *qrow0 = p.q + ((long long)si.tb * p.qsb + (long long)h * p.qsh +
                               (long long)si.q0 * p.qsn) * 2;
    if constexpr (!QS && FAST) {
        /* each of the first nt / CH * CH threads one column chunk c of every (nt / CH)-th row (the
         * others none: 8 of 128 at head_dim 96's 12 chunks): what a loop over the chunks computes
         * per chunk (the chunk's bytes, its column, the division) is computed once, and the shared
         * address steps (bench/kernel_notes.md round 19: the general loop took 11% of the
         * instructions at (8,32,1024,128) causal) */
        const int rs = nt / CH;
        if (t0 >= rs * CH)
            return;
        const int c = t0 % CH, rem = (p.d - c * 8) * 2;
        const int bytes = rem >= 16 ? 16 : (rem > 0 ? rem : 0);
        const long long pitch = p.qsn * 2;
        const char *col = qrow0 + c * 16;
        unsigned dst = smem_u32(sq + (t0 / CH) * LDQ + c * 8);
#pragma unroll 4
        for (int r = t0 / CH; r < BM; r += rs, dst += rs * LDQ * 2) {
            const int i = rows[r];
            /* a row -1 reads nothing (0 bytes: zeros), from row 0's address */
            cp_async16_s(dst, col + (long long)max(i, 0) * pitch, i >= 0 ? bytes : 0);
        }
    } else {
        for (int idx = t0; idx < BM * CH; idx += nt) {
            const int r = idx / CH, c = idx - r * CH, i = rows[r];
            int bytes = 0;
            const char *src = p.q;
            if (i >= 0) {
                const int rem = (p.d - c * 8) * 2;
                bytes = rem >= 16 ? 16 : (rem > 0 ? rem : 0);
                if (bytes > 0)
                    src = qrow0 + ((long long)i * p.qsn + c * 8) * 2;
            }
            /* QS (head_dim 256): warpgroup r / 64's slab c / 8 (4096 elements), row r % 64 (64),
             * its 16-byte chunk c % 8 at position (c % 8) ^ (r % 8) (wg_desc_sw128's layout) */
            const int rr = r & 63;
            unsigned short *dst = QS ? sq + ((r >> 6) * (DL / 64) + (c >> 3)) * 4096 + rr * 64 +
                                           (((c & 7) ^ (rr & 7)) << 3)
                                     : sq + r * LDQ + c * 8;
            cp_async16(dst, src, bytes);
        }
    }
}

/* The producer's thread: the block's ntiles K tiles from t_first, the g-th tile of the CTA's
 * ring going into stage g % ST once every consumer warp released tile g - ST (g counts on across
 * a persistent CTA's blocks). Keys past the tensor read as zeros; past the sequence (packed: the
 * next sequence's keys) they are outside every row's visible range, which the fold masks. */
template <class S, int DP>
static __device__ __forceinline__ void ws_produce(const kparams &p, const seqinfo &si, int kvh,
                                                  int t_first, int ntiles, unsigned char *sk,
                                                  unsigned long long *full,
                                                  unsigned long long *empty, unsigned &g)
{
    constexpr int ST = S::STAGES, BN = S::BN;
    const int kc = p.packed ? si.k0 : 0, bc = p.packed ? 0 : si.tb;
    for (int it = 0; it < ntiles; it++, g++) {
        const unsigned st = g & (ST - 1);
        if (g >= (unsigned)ST)
            mbar_wait(&empty[st], ((g / ST) - 1) & 1);
        mbar_arrive_expect_tx(&full[st], S::TILE_BYTES);
        unsigned char *dst = sk + (size_t)st * S::TILE_BYTES;
#pragma unroll
        for (int c = 0; c < S::DL / 64; c++)
#pragma unroll
            for (int b = 0; b < BN / WS_BOX_KEYS; b++)
                tma_load_4d(dst + ((size_t)c * BN + b * WS_BOX_KEYS) * 128, &p.ktm, c * 64,
                            kc + (t_first + it) * BN + b * WS_BOX_KEYS, kvh, bc, &full[st]);
    }
}

/* A consumer thread's share of one block: its two rows (warp*16 + hr*8 + g of rows[]), Q from sq
 * into registers (then its arrival on q_empty, when given), the block's ntiles tiles from
 * the ring (tile g onwards, g advanced past them; each released once this warp's warpgroup's wgmma
 * is done with it, the last too when release_last), the rows' results into acc. */
template <class S, int DP, bool F16, int POLY, int FW>
static __device__ __forceinline__ void ws_consume(const kparams &p, const seqinfo &si, int h,
                                                  const int *rows, const unsigned short *sq,
                                                  unsigned long long *q_empty, int t_first,
                                                  int ntiles, const unsigned char *sk,
                                                  unsigned long long *full,
                                                  unsigned long long *empty, unsigned &g,
                                                  bool release_last, part &acc)
{
    constexpr int BN = S::BN, NT = BN / 8, LDQ = S::LDQ, ST = S::STAGES, KS = DP / 16;
    constexpr bool XS = FW == FOLD_XS, MX = FW == FOLD_MAX;
    constexpr int XG = XS ? 2 : 0; /* fold_lane's general distance form, or none */
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, gq = lane >> 2, tq = lane & 3;
    warp_keys wk;
    warp_rows_range(p, si, h, rows, warp, gq, wk);
    const int(&lo)[2] = wk.lo, (&hi)[2] = wk.hi;
    const int wlo_min = wk.lo_min, wlo_max = wk.lo_max, whi_min = wk.hi_min, whi_max = wk.hi_max;
    constexpr bool QS = S::QS;
    unsigned qf[QS ? 1 : KS][4];
    unsigned long long qd = 0; /* QS: the warpgroup's first Q slab */
    if constexpr (QS) {
        qd = wg_desc_sw128(sq + (warp >> 2) * (S::DL / 64) * 4096);
    } else {
#pragma unroll
        for (int ks = 0; ks < KS; ks++)
            ldmatrix_x4(qf[ks], sq + (warp * 16 + (lane & 15)) * LDQ + ks * 16 + (lane >> 4) * 8);
        if (q_empty)
            mbar_arrive(q_empty);
    }

    float M[2], l[2], W[2], D[2], F0[2] = {0.0f, 0.0f}; /* F0: XS, first_key_pick's */
    float A[2] = {0.0f, 0.0f}; /* MX: fold_max's max of magnitudes */
    /* XS: each row's causal diagonal (stats.h's pos_i); left: no row of the warp sees a key right
     * of its diagonal (causal, or a mask whose rows end there: the usual padded-batch one) */
    int pos[2];
    bool left = true;
#pragma unroll
    for (int hr = 0; hr < 2; hr++) {
        M[hr] = -INFINITY, l[hr] = 0.0f, W[hr] = 0.0f, D[hr] = 0.0f;
        pos[hr] = XS ? rows[warp * 16 + hr * 8 + gq] + si.lk - si.lq : 0;
        if (XS && lo[hr] <= hi[hr] && hi[hr] > pos[hr])
            left = false;
    }
    if (XS)
        left = __all_sync(0xffffffffu, left);
    float sa[NT][4], sb[NT][4];

    auto fold = [&](float (&s)[NT][4], int t) {
        const int j0 = t * BN, j1 = j0 + BN - 1;
        if (j0 > whi_max || j1 < wlo_min)
            return; /* no row of this warp sees the tile */
        if constexpr (MX) {
            const bool whole = j0 >= wlo_max && j1 <= whi_min;
            if (p.softcap) {
                if (whole)
                    fold_max<NT, true, false>(p, s, M, A, lo, hi, j0, tq);
                else
                    fold_max<NT, true, true>(p, s, M, A, lo, hi, j0, tq);
            } else {
                if (whole)
                    fold_max<NT, false, false>(p, s, M, A, lo, hi, j0, tq);
                else
                    fold_max<NT, false, true>(p, s, M, A, lo, hi, j0, tq);
            }
            return;
        }
        if (XS && j0 <= wlo_max && j1 >= wlo_min) /* some row's first key is in the tile */
            first_key_pick<NT>(s, lo, j0, tq, F0);
        const bool whole = j0 >= wlo_max && j1 <= whi_min;
        if constexpr (XS && POLY == 0) {
            /* every key a row sees is at or left of its diagonal (masked keys weigh 0), so every
             * tile takes fold_lane's one-FFMA distance form (a register for a per-tile test
             * against the rows' diagonals spilled variants 6-8 at d128; with this form, variants
             * 7-8 (POLY) spill at d128 and keep the general one) */
            if (left) {
                if (p.softcap) {
                    if (whole)
                        fold_lane<NT, true, false, POLY, 1>(p, s, M, l, W, lo, hi, j0, tq, D, pos);
                    else
                        fold_lane<NT, true, true, POLY, 1>(p, s, M, l, W, lo, hi, j0, tq, D, pos);
                } else {
                    if (whole)
                        fold_lane<NT, false, false, POLY, 1>(p, s, M, l, W, lo, hi, j0, tq, D, pos);
                    else
                        fold_lane<NT, false, true, POLY, 1>(p, s, M, l, W, lo, hi, j0, tq, D, pos);
                }
                return;
            }
        }
        if (p.softcap) {
            if (whole)
                fold_lane<NT, true, false, POLY, XG>(p, s, M, l, W, lo, hi, j0, tq, D, pos);
            else
                fold_lane<NT, true, true, POLY, XG>(p, s, M, l, W, lo, hi, j0, tq, D, pos);
        } else {
            if (whole)
                fold_lane<NT, false, false, POLY, XG>(p, s, M, l, W, lo, hi, j0, tq, D, pos);
            else
                fold_lane<NT, false, true, POLY, XG>(p, s, M, l, W, lo, hi, j0, tq, D, pos);
        }
    };
    auto release = [&](unsigned tile) {
        __syncwarp();
        if (lane == 0)
            mbar_arrive(&empty[tile & (ST - 1)]);
    };
    /* wait for tile it, issue its wgmma into cur, then release and fold tile it-1 (in prev)
     * while the tensor cores work */
    auto step = [&](int it, float (&cur)[NT][4], float (&prev)[NT][4]) {
        const unsigned gt = g + it, st = gt & (ST - 1);
        mbar_wait(&full[st], (gt / ST) & 1);
        const unsigned long long kd = wg_desc_sw128(sk + (size_t)st * S::TILE_BYTES);
        reg_fence(cur);
        wgmma_fence();
#pragma unroll
        for (int ks = 0; ks < KS; ks++) {
            const unsigned long long kdk = wg_desc_advance(kd, (ks >> 2) * BN * 128 + (ks & 3) * 32);
            if constexpr (QS)
                wgmma_op<NT, true, F16>::run(
                    cur, qf[0], wg_desc_advance(qd, (ks >> 2) * 8192 + (ks & 3) * 32), kdk, ks > 0);
            else
                wgmma_op<NT, false, F16>::run(cur, qf[ks], 0ull, kdk, ks > 0);
        }
        wgmma_commit();
        reg_fence(cur);
        wgmma_wait<1>(prev);
        reg_fence(prev);
        if (it > 0) { /* tile it-1 is no longer read by this warp's warpgroup */
            release(gt - 1);
            fold(prev, t_first + it - 1);
        }
    };
    /* tiles in pairs, with no branch around a wgmma (see stats_wgmma_kernel) */
    for (int it = 0; it < ntiles; it += 2) {
        step(it, sa, sb);
        step(it + 1, sb, sa);
        wgmma_wait<0>(sb); /* nothing in flight across the loop's edge: no serialisation */
        reg_fence(sb);
    }
    if (ntiles > 0) {
        if (release_last)
            release(g + ntiles - 1);
        fold(sb, t_first + ntiles - 1);
    }
    g += ntiles;

    if constexpr (MX)
        warp_rows_done_max(p, si, h, rows, warp, gq, tq, wk, M, A, acc);
    else
        warp_rows_done<XS>(p, si, h, rows, warp, gq, tq, wk, M, l, W, acc, D, F0);
}

/* The (head, block) of item i of the grid (item.h: longest first where p.lpt). */
static __device__ __forceinline__ void ws_item(const kparams &p, long long i, int *h, int *x)
{
    item_block(i, p.lpt && !p.packed, p.hq, p.batch, p.nblk, p.blocks_per_head, h, x);
}

/* Item i's block (ws_item) and its sequence; false when the block has none. Each role of the
 * persistent kernel walks the items through it: they must count the same blocks (m). */
static __device__ __forceinline__ bool ws_block(const kparams &p, long long i, int *h, int *x,
                                                seqinfo *si)
{
    ws_item(p, i, h, x);
    return cta_sequence(p, *x, si);
}

#endif

/* ---- variants 6-9: one CTA per block -------------------------------------------------------- */

/* grid (blocks_per_head, Hq), block NTH: warps 0 .. 4*NCW-1 the consumer warpgroups (warp w: rows
 * [w*16, w*16 + 16) of the CTA's BM sampled rows), the last four the producer warpgroup (one thread
 * of it copies). q: [B, Hq, Nq, D] by strides; K through the tensor map p.ktm. parts: [Hq,
 * blocks_per_head]. */
template <int DP, bool F16, int POLY, int NCW, int BN_, int FW, int QB = 1>
__global__ void __launch_bounds__(ws_shape<DP, NCW, BN_>::NTH, 1)
    stats_ws_kernel(const __grid_constant__ kparams p, part *parts)
{
    static_assert(QB == 1, "one Q buffer (the table's QB column is the persistent kernel's)");
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
    if (gate_closed(p.gate, p.gate_general))
        return;
    using S = ws_shape<DP, NCW, BN_>;
    constexpr int NTH = S::NTH, BN = S::BN, BM = S::BM;
    constexpr int ST = S::STAGES, PRODUCER = NCW * 4;
    static_assert((ST & (ST - 1)) == 0 && ST >= 3, "K ring");
    static_assert(DP % 16 == 0, "whole k-steps");
    extern __shared__ __align__(128) unsigned char ws_smem[];
    unsigned char *sk = ws_smem + ((1024u - (smem_u32(ws_smem) & 1023u)) & 1023u);
    unsigned short *sq = (unsigned short *)(sk + (size_t)ST * S::TILE_BYTES);
    int *s_row = (int *)((unsigned char *)sq + S::QBYTES);
    __shared__ int s_range[2];
    __shared__ unsigned long long s_full[ST], s_empty[ST];

    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    int h, x;
    ws_item(p, (long long)blockIdx.y * gridDim.x + blockIdx.x, &h, &x);
    part acc;
    part_init(acc, FW == FOLD_XS, FW != FOLD_MAX);
    seqinfo si;
    if (!cta_sequence(p, x, &si)) {
        if (tid == 0)
            parts[(long long)h * p.blocks_per_head + x] = acc;
        return;
    }
    if (tid == 0) {
        s_range[0] = 0x7fffffff, s_range[1] = -1;
        for (int st = 0; st < ST; st++) {
            mbar_init(&s_full[st], 1);        /* the producer's expect_tx */
            mbar_init(&s_empty[st], NCW * 4); /* one arrival per consumer warp */
        }
        fence_mbar_init();
    }
    ws_rows<BM>(p, si, s_row, tid, NTH);
    __syncthreads();
    block_key_range<BM>(p, si, h, s_row, s_range, tid, NTH);
    /* Q by the consumers alone (they wait for their own copies below), so that the producer
     * starts loading K as soon as the CTA's key range is known */
    if (warp < PRODUCER)
        ws_load_q<S, DP>(p, si, h, s_row, sq, tid, PRODUCER * 32);
    cp_async_commit();
    __syncthreads(); /* s_range final, mbarriers initialised */

    const int t_first = s_range[1] >= 0 ? s_range[0] / BN : 0;
    const int t_last = s_range[1] >= 0 ? s_range[1] / BN : -1;
    const int ntiles = (t_last - t_first + 2) & ~1;
    unsigned g = 0;
    if (warp >= PRODUCER) {
        setmaxnreg_dec<S::REG_P>();
        if (warp == PRODUCER && lane == 0 && ntiles > 0) {
            tma_prefetch_map(&p.ktm);
            ws_produce<S, DP>(p, si, h / p.group, t_first, ntiles, sk, s_full, s_empty, g);
        }
        return; /* the copies complete on the mbarriers without this thread; the consumers reduce */
    }
    setmaxnreg_inc<S::REG_C>();
    cp_async_wait<0>();
    if constexpr (S::QS)
        fence_proxy_async(); /* this thread's Q copies visible to wgmma (the async proxy) */
    named_bar_sync<1, PRODUCER * 32>(); /* Q in shared memory: every consumer's copies */
    ws_consume<S, DP, F16, POLY, FW>(p, si, h, s_row, sq, NULL, t_first, ntiles, sk, s_full, s_empty,
                                 g, false, acc);
    block_store_part<PRODUCER, FW == FOLD_XS>(acc, &parts[(long long)h * p.blocks_per_head + x]);
#endif
}

/* ---- variants 10-12: persistent CTAs ------------------------------------------------------- */

/* grid (G), G <= blocks_per_head * Hq, block NTH: CTA c takes one block (item) of every round of
 * G, c first (item_deal; ws_item: longest first where p.lpt). The producer warpgroup prepares each
 * block (its rows and key range into one of IS info slots, its Q rows by cp.async into one of QB
 * buffers) and one thread of it loads its K tiles into the ring, which runs on across blocks; the
 * consumers take each block when its slot and its Q are ready (mbarriers info_full, q_full) and
 * hand them back (info_empty after the rows' results, q_empty once Q is in their registers). So
 * the next block's rows, Q and first tiles load while the consumers finish the current one, and
 * no CTA starts or ends between blocks.
 * QB = 1 (variants 10, 11): two info slots, one Q buffer, and the whole producer warpgroup
 * prepares a block after its thread 0 has issued the previous block's K tiles. QB = 2 (variant
 * 12): four info slots and two Q buffers, and the two jobs run apart: warp 0's lane 0 issues K
 * tiles (waiting on info_full for each block's key range, as the consumers do) while warps 1-3
 * prepare the blocks ahead (bench/kernel_notes.md, round 12: the consumers waited at a short
 * block's start for its preparation, which began only when the block before it started). */
template <int DP, bool F16, int POLY, int NCW, int BN_, int FW, int QB = 1>
__global__ void __launch_bounds__(ws_shape<DP, NCW, BN_, true, QB>::NTH, 1)
    stats_wsp_kernel(const __grid_constant__ kparams p, part *parts)
{
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
    if (gate_closed(p.gate, p.gate_general))
        return;
    using S = ws_shape<DP, NCW, BN_, true, QB>;
    constexpr int BN = S::BN, BM = S::BM, LDQ = S::LDQ, ST = S::STAGES, PRODUCER = NCW * 4;
    constexpr int IS = S::IS, LIS = IS == 4 ? 2 : 1, LQB = QB == 2 ? 1 : 0;
    /* QB 1 and the max logit alone: the preparing threads' Q copies arrive on q_full by themselves
     * and K's tiles start with them (round 26: 2-5% off the max logit alone at head_dim 128, 0-1%
     * at 64; +0.3 to +0.6% with the entropy, which keeps round 19's order: kernel_notes.md) */
    constexpr bool EARLYQ = QB == 1 && FW == FOLD_MAX;
    static_assert((ST & (ST - 1)) == 0 && ST >= 3, "K ring");
    static_assert(IS == 1 << LIS && QB == 1 << LQB, "slots and buffers: powers of two");
    extern __shared__ __align__(128) unsigned char ws_smem[];
    unsigned char *sk = ws_smem + ((1024u - (smem_u32(ws_smem) & 1023u)) & 1023u);
    unsigned short *sq = (unsigned short *)(sk + (size_t)ST * S::TILE_BYTES); /* QB buffers */
    int *s_rows = (int *)((unsigned char *)sq + QB * S::QBYTES);               /* IS slots of BM */
    __shared__ int s_range[IS][2], s_tf[IS], s_nt[IS];
    __shared__ unsigned long long s_full[ST], s_empty[ST], s_info_full[IS], s_info_empty[IS];
    __shared__ unsigned long long s_q_full[QB], s_q_empty[QB];

    const int tid = threadIdx.x, warp = tid >> 5;
    if (tid == 0) {
        for (int st = 0; st < ST; st++) {
            mbar_init(&s_full[st], 1);
            mbar_init(&s_empty[st], NCW * 4);
        }
        /* info_empty and q_empty count every consumer thread: a thread's arrival releases its
         * own reads of the slot's rows and of the Q buffer (one lane's arrival after __syncwarp
         * left compute-sanitizer racecheck reporting the next block's writes there, rows by
         * ws_rows and Q by cp.async, as racing the last block's reads; bench/kernel_notes.md
         * round 12). QB 2: the K thread also hands each slot back. */
        for (int sl = 0; sl < IS; sl++) {
            mbar_init(&s_info_full[sl], 1);
            mbar_init(&s_info_empty[sl], NCW * 128 + (QB > 1));
        }
        for (int b = 0; b < QB; b++) {
            mbar_init(&s_q_full[b], EARLYQ ? 128 : 1); /* EARLYQ: each preparing thread's copies */
            mbar_init(&s_q_empty[b], NCW * 128);
        }
        fence_mbar_init();
    }
    __syncthreads();
    const long long items = (long long)p.blocks_per_head * p.hq;
    unsigned g = 0; /* the ring's tiles so far */
    int m = 0;      /* the blocks so far that have a sequence */
    if (warp >= PRODUCER) {
        setmaxnreg_dec<S::REG_P>();
        const int pt = tid - PRODUCER * 32;
        if (pt == 0)
            tma_prefetch_map(&p.ktm);
        if (QB > 1 && pt < 32) { /* warp 0: its lane 0 issues the K tiles, block after block */
            if (pt != 0)
                return;
            for (item_deal d = item_deal_start(blockIdx.x, gridDim.x); d.i < items;
                 item_deal_next(&d)) {
                const long long i = d.i;
                int h, x;
                seqinfo si;
                if (!ws_block(p, i, &h, &x, &si))
                    continue;
                const int slot = m & (IS - 1);
                mbar_wait(&s_info_full[slot], (m >> LIS) & 1);
                const int t_first = s_tf[slot], ntiles = s_nt[slot];
                /* read: the slot may take block m + IS (blocks of no tile let the consumers run
                 * ahead of this thread, and nothing else would hold the preparing warps back) */
                mbar_arrive(&s_info_empty[slot]);
                ws_produce<S, DP>(p, si, h / p.group, t_first, ntiles, sk, s_full, s_empty, g);
                m++;
            }
            return;
        }
        /* the block's preparation: the whole warpgroup (QB 1) or warps 1-3 (QB 2) */
        constexpr int NP = QB > 1 ? 96 : 128;
        const int pp = QB > 1 ? pt - 32 : pt;
        for (item_deal d = item_deal_start(blockIdx.x, gridDim.x); d.i < items;
             item_deal_next(&d)) {
            const long long i = d.i;
            int h, x;
            seqinfo si;
            if (!ws_block(p, i, &h, &x, &si))
                continue;
            const int slot = m & (IS - 1), b = m & (QB - 1);
            int *rows = s_rows + slot * BM;
            if (m >= IS) /* the consumers (and QB 2's K thread) are done with the slot's block */
                mbar_wait(&s_info_empty[slot], ((m >> LIS) - 1) & 1);
            if (pp == 0)
                s_range[slot][0] = 0x7fffffff, s_range[slot][1] = -1;
            ws_rows<BM>(p, si, rows, pp, NP);
            named_bar_sync<3, NP>();
            /* the one-chunk loop where the copy is on the critical path (the max logit alone:
             * the consumers' blocks are short) or the general loop's division is not a shift
             * (head_dim 96); the general loop elsewhere: the one-chunk loop was 2-6% slower at
             * head_dim 128 and 1% at 64 with the entropy (round 19, H200) */
            constexpr bool FASTQ = FW == FOLD_MAX || (DP / 8 & (DP / 8 - 1)) != 0;
            if (EARLYQ) {
                /* Q's copies first, each thread's landing on q_full by itself (no thread waits
                 * for them), under the key range; then thread 0 lets the consumers in and issues
                 * every K tile at once, so the block's Q and first tiles load together
                 * (bench/kernel_notes.md round 26). q_full completes once the 128 arrivals are
                 * in: every one is issued before the barrier below, so a tile thread 0 waits for
                 * a stage for never waits on this block's Q */
                if (m >= QB) /* the Q of the block before is in the consumers' registers */
                    mbar_wait(&s_q_empty[b], ((m >> LQB) - 1) & 1);
                ws_load_q<S, DP, FASTQ>(p, si, h, rows, sq + b * BM * LDQ, pp, NP);
                cp_async_mbar_arrive(&s_q_full[b]);
                block_key_range<BM>(p, si, h, rows, s_range[slot], pp, NP);
                named_bar_sync<3, NP>(); /* every row and the key range */
            } else {
                block_key_range<BM>(p, si, h, rows, s_range[slot], pp, NP);
                if (m >= QB) /* the Q of the block that used this buffer is in the consumers'
                              * registers */
                    mbar_wait(&s_q_empty[b], ((m >> LQB) - 1) & 1);
                ws_load_q<S, DP, FASTQ>(p, si, h, rows, sq + b * BM * LDQ, pp, NP);
                cp_async_commit();
                cp_async_wait<0>();
                named_bar_sync<3, NP>(); /* every row, the key range and every Q copy done */
            }
            if (pp == 0) {
                const int t_first = s_range[slot][1] >= 0 ? s_range[slot][0] / BN : 0;
                const int t_last = s_range[slot][1] >= 0 ? s_range[slot][1] / BN : -1;
                const int ntiles = (t_last - t_first + 2) & ~1;
                s_tf[slot] = t_first, s_nt[slot] = ntiles;
                mbar_arrive(&s_info_full[slot]);
                if (!EARLYQ)
                    mbar_arrive(&s_q_full[b]);
                if (QB == 1)
                    ws_produce<S, DP>(p, si, h / p.group, t_first, ntiles, sk, s_full, s_empty, g);
            }
            m++;
        }
        if (EARLYQ) { /* no thread leaves with its copies (and their arrivals) in flight */
            cp_async_commit();
            cp_async_wait<0>();
        }
        return;
    }
    setmaxnreg_inc<S::REG_C>();
    for (item_deal d = item_deal_start(blockIdx.x, gridDim.x); d.i < items;
         item_deal_next(&d)) {
        const long long i = d.i;
        int h, x;
        seqinfo si;
        const bool has = ws_block(p, i, &h, &x, &si);
        part acc;
        part_init(acc, FW == FOLD_XS, FW != FOLD_MAX);
        if (!has) {
            if (tid == 0)
                parts[(long long)h * p.blocks_per_head + x] = acc;
            continue;
        }
        const int slot = m & (IS - 1), b = m & (QB - 1);
        mbar_wait(&s_info_full[slot], (m >> LIS) & 1);
        mbar_wait(&s_q_full[b], (m >> LQB) & 1);
        ws_consume<S, DP, F16, POLY, FW>(p, si, h, s_rows + slot * BM, sq + b * BM * LDQ,
                                         &s_q_empty[b], s_tf[slot], s_nt[slot], sk, s_full,
                                         s_empty, g, true, acc);
        mbar_arrive(&s_info_empty[slot]); /* rows[] read for the last time (row_done) */
        block_store_part<PRODUCER, FW == FOLD_XS>(acc, &parts[(long long)h * p.blocks_per_head + x]);
        m++;
    }
#endif
}

/* ---- the instances: variants 6-12 at head_dim 64 and 128, variant 6 also at 256 (kernels.h
 * WS_NVAR x WG_NDP; its d256 instance has two consumer warpgroups on 64-key tiles, Q in shared
 * memory: ws_shape QS), 16-bit
 * inputs only, in the tables of ws_sm90.cu (FOLD_BASE: stats_ws_sm90), ws_sm90_xs.cu (FOLD_XS,
 * stats_ws_sm90_xs: the fold also computes sink mass and distance, for the runs that ask for them:
 * stats_problem.want) and ws_sm90_mo.cu (FOLD_MAX, stats_ws_sm90_mo: the max logit alone, for the
 * runs that ask for nothing else). Three files, so that the three sets compile side by side. POLY:
 * of every 8 n8 blocks of a tile, how many take their exps on the FMA pipe. Variants 7 and 8 (bench
 * only) have neither an XS instance (an empty row: the XS = 1 form spilled them at d128) nor a
 * FOLD_MAX one (no exps to move); variant 12 (bench only until measured) has no XS instance. QB,
 * the last column: Q buffers (stats_wsp_kernel's; 1 elsewhere). */

#define WS_ONE(K, DP, POLY, NCW, BN, TAG, PERSIST, FW, XTAG, QB)                                  \
    { DP, ws_shape<DP, NCW, BN, PERSIST, QB>::BM, ws_shape<DP, NCW, BN, PERSIST, QB>::NTH,         \
      ws_shape<DP, NCW, BN, PERSIST, QB>::smem_bytes, K<DP, false, POLY, NCW, BN, FW, QB>,         \
      K<DP, true, POLY, NCW, BN, FW, QB>, "wgmma bf16 d" #DP " " TAG XTAG,                         \
      "wgmma f16 d" #DP " " TAG XTAG, #K, NULL, NULL, PERSIST }
#define WS_VARIANT(K, POLY, NCW, BN, TAG, PERSIST, FW, XTAG, QB)                                   \
    {WS_ONE(K, 64, POLY, NCW, BN, TAG, PERSIST, FW, XTAG, QB),                                     \
     WS_ONE(K, 128, POLY, NCW, BN, TAG, PERSIST, FW, XTAG, QB)}
/* Variants 10 and 11 with a head_dim 96 instance (the table's fourth column: the d128 layout, six
 * k-steps instead of eight; launch.cu takes the smallest instance that covers head_dim). */
#define WS_VARIANT_D96(K, NCW, BN, TAG, FW, XTAG)                                                  \
    {WS_ONE(K, 64, 0, NCW, BN, TAG, 1, FW, XTAG, 1), WS_ONE(K, 128, 0, NCW, BN, TAG, 1, FW, XTAG, 1), \
     {}, WS_ONE(K, 96, 0, NCW, BN, TAG, 1, FW, XTAG, 1)}
/* Variant 6 with its head_dim 256 instance (the table's third column; the others leave it zero). */
#define WS_VARIANT_D256(K, FW, XTAG)                                                               \
    {WS_ONE(K, 64, 0, 2, 128, "ws tma", 0, FW, XTAG, 1),                                           \
     WS_ONE(K, 128, 0, 2, 128, "ws tma", 0, FW, XTAG, 1),                                          \
     WS_ONE(K, 256, 0, 2, 64, "ws tma n64 qs", 0, FW, XTAG, 1)}
/* A variant without an instance in a table (zeros: launch.cu takes a NULL kernel as none). */
#define WS_NONE {{}, {}}

#endif /* ATTNSTAT_CUDA_WS_SM90_CUH */
