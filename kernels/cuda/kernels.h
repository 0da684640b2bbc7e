/* kernels.h — the contract between the kernel files and the launcher (launch.cu), and the one
 * place that holds the tile sizes per architecture. CUDA C++ for host and device; stage: the CUDA
 * backend of stats.h. Included by common.cuh (so by every kernel file) and by launch.cu; includes
 * stats.h and the CUDA runtime only.
 *
 * What it promises:
 *   kparams          the problem as every kernel reads it (filled once per run by launch.cu)
 *   part             one CTA's partial statistics (the per-head reduction merges them in order)
 *   tile sizes       per architecture, below; each kernel file reads them from here
 *   kernel_instance  one compiled statistics kernel (a head_dim, both input types) with its launch
 *                    shape; each family file exports a table of them (variants.h numbers the
 *                    variants those tables implement)
 *   launch_*         host launchers of the small kernels around the statistics kernel
 *
 * Nothing is built with -rdc: a kernel is compiled only in the file that defines it, the launcher
 * reaches it through the host-side function pointers of these tables, and device code that several
 * files need lives in headers (common.cuh, sm90.cuh) as inline functions and templates. */
#ifndef ATTNSTAT_CUDA_KERNELS_H
#define ATTNSTAT_CUDA_KERNELS_H

#include <cuda_runtime.h>
#include <stddef.h>

#include "stats.h"

#define LOG2E_F 1.4426950408889634f
#define LN2_F 0.6931471805599453f
#define LN2_D 0.6931471805599453

/* ---- the problem on the device --------------------------------------------------------------- */

/* A TMA tensor map (the driver's CUtensorMap: 128 opaque bytes, 64-byte aligned), filled on the
 * host by cuTensorMapEncodeTiled (launch.cu) for the kernels that load K with the TMA unit
 * (variant 6); they take kparams as a __grid_constant__ parameter so that its address is the
 * map's. */
struct alignas(64) tma_map {
    unsigned long long w[16];
};

/* Q: [B, Hq, Nq, D] and K: [B, Hkv, Nk, D] by element strides (packed: B = 1, sequences by
 * cu_q/cu_k). Logits in base 2: u = c * q.k (no softcap) or cl * tanh(sc * q.k). */
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
    /* A mask whose every row sees one interval of keys (mask_ranges_kernel found it so): each
     * row's [lo, hi] (inclusive; lo > hi: no key), rr[(b' * rr_mh + h') * len_q + i] with
     * b' = b when rr_mb > 1 else 0, h' likewise; NULL without a mask. visible_range() intersects
     * it with causal and the window. */
    const int2 *rr;
    int rr_mb, rr_mh;
    /* A general mask (rows that are not one interval, or finite additive biases), read per logit
     * by the CUDA-core kernel alone: element [b, h, i, j] at mask + (b*msb + h*msh + i*msn + j)
     * elements of mdtype (STATS_BOOL, F32, F16, BF16). NULL otherwise. */
    const char *mask;
    long long msb, msh, msn;
    int mdtype;
    /* The precision of the logits' inputs (stats_problem.compute_dtype): the CUDA-core kernel
     * rounds q and k to it; the tensor-core kernels take their operand type from it. */
    int compute;
    /* A masked run launches both paths behind mask_ranges_kernel, and the mask's analysis decides
     * on the device which one computes (no synchronisation with the host): a kernel whose gate is
     * set returns at once unless (*gate != 0) == gate_general, *gate being mask_ranges_kernel's
     * "general" flag. NULL: no gate. */
    const int *gate;
    int gate_general;
    /* Variants 6-12: K as a 4-d tensor (head_dim, keys, heads_kv, batch; packed: batch 1) in boxes
     * of 64 elements x WS_BOX_KEYS keys, 128-byte swizzle. Unused (zeros) by the other kernels. */
    tma_map ktm;
    /* Variants 6-12: take the blocks of the longest rows first (causal grids of a few waves, where
     * a long CTA started last would run alone at the end; every causal grid of the persistent
     * kernels, whose CTAs then take one block of every round of G, forward and back: item.h
     * item_deal). */
    int lpt;
    /* Attention sinks (stats.h): [hq] sink logits of sinks_dtype (STATS_F32, F16, BF16), NULL
     * without; each kernel reads its head's (head_sink, common.cuh) for row_done. */
    const void *sinks;
    int sinks_dtype;
};

/* Partial statistics of one CTA's rows. parts: [Hq, blocks_per_head], one per CTA. */
struct part {
    int rows, rows_norm, rows_empty, nonfinite, collapsed, pad;
    double sum, sumsq, sum_norm;
    float hmin, hmax, mmax, pad2;
    double sum_sink, sum_dist; /* sums of the rows' sink mass and distance (NaN: a kernel that
                                  does not compute them, so the head's values are NaN) */
};

/* ---- tile sizes per architecture ------------------------------------------------------------- */

/* sm_80, mma.sync m16n8k16 (mma_sm80.cu, variant 4): MMA_WARPS warps of 16 * MT rows each, K tiles
 * of MMA_BN keys through MMA_STAGES cp.async stages. MT (m16 tiles per warp): MMA_MT up to
 * head_dim 128 (256 rows per CTA), MMA_MT_D256 at 256 (128 rows: the Q fragments of 2 tiles do not
 * fit the registers). */
enum { MMA_WARPS = 8, MMA_BN = 64, MMA_STAGES = 3 };
enum { MMA_MT = 2, MMA_MT_D256 = 1 };

/* sm_90a, wgmma m64n64k16 (wgmma_sm90.cu, variant 0; wgf_sm90.cu, variants 1-3): WG_WARPGROUPS
 * warpgroups of 64 rows (192 rows per CTA), K tiles of WG_KEYS keys (the wgmma N). Variant 0's K
 * pipeline: WG_STAGES stages, WG_PF tiles in flight ahead of the one being multiplied, and the
 * stage of the tile being folded is not overwritten (WG_STAGES = WG_PF + 2). */
enum { WG_WARPGROUPS = 3, WG_KEYS = 64 };
enum { WG_STAGES = 4, WG_PF = WG_STAGES - 2 };

/* The K pipeline of the fold2 kernels (variants 1-3). MB = false: as variant 0 (4 stages, 2 tiles
 * ahead, a CTA barrier per tile). MB = true (variant 3): 8 stages, 4 tiles ahead, and per-stage
 * mbarriers instead of the CTA barrier: a warp publishes tile t (its copies landed, proxy fence,
 * one arrival per warp on full[t % 8]) PUB steps before t is multiplied, and releases tile t (one
 * arrival per warp on empty[t % 8]) once its warpgroup's wgmma on it completed; a stage is refilled
 * after every warp released it. Warpgroups can then drift up to about two tiles apart instead of
 * meeting at every tile. */
template <bool MB> struct wgf_pipe {
    static constexpr int STAGES = MB ? 8 : 4, PF = MB ? 4 : 2, PUB = 2;
};

/* sm_90a, warp-specialised (ws_sm90.cu, variants 6-12): consumer warpgroups of 64 rows on wgmma and
 * a producer warpgroup whose one thread loads the K tiles with the TMA unit, in boxes of 64
 * elements x WS_BOX_KEYS keys (the tensor map launch.cu encodes); the shapes per variant are
 * ws_shape's, whose dynamic shared memory stays under WS_SMEM_MAX (sm_90's 227 KB a block, less 2
 * KB for the kernels' static shared memory: 1.3 KB at most, ptxas -v). */
enum { WS_BOX_KEYS = 64, WS_SMEM_MAX = 225 * 1024 };

/* CUDA cores (generic.cu, variant 5): GEN_WARPS warps of GEN_ROWS_PER_WARP rows each. */
enum { GEN_WARPS = 8, GEN_ROWS_PER_WARP = 4, GEN_BM = GEN_WARPS * GEN_ROWS_PER_WARP,
       GEN_GATED_CTAS_PER_SM = 2 /* the gated kernel's (generic.cu) */ };

/* Threads per block of the per-row fill and of the per-head reduction. */
enum { FILL_THREADS = 256, REDUCE_THREADS = 256 };

/* ---- the statistics kernels, as the launcher sees them --------------------------------------- */

/* grid (blocks_per_head, Hq), block `threads`; writes parts[h * blocks_per_head + x]. */
typedef void (*stats_kernel_fn)(const kparams, part *);

struct kernel_instance {
    int dp;            /* head_dim it is compiled for: it takes head_dim <= dp */
    int rows_per_cta;  /* sampled rows per CTA */
    int threads;       /* per CTA */
    size_t smem;       /* dynamic shared memory, bytes */
    stats_kernel_fn bf16, f16;
    const char *name_bf16, *name_f16; /* what stats_cuda_kernel_name() says */
    const char *kernel;               /* the kernel's name, for error messages */
    /* float32 tensors converted to bf16 / f16 as the tiles are loaded (no copy of the tensors);
     * NULL where the family has no such instance (the planner then takes another). */
    stats_kernel_fn bf16_from_f32, f16_from_f32;
    /* 1: a persistent kernel, launched on grid (G) with G <= blocks_per_head * Hq CTAs, each
     * taking one block of every round of G (item.h item_deal: variants 10-12); 0: grid
     * (blocks_per_head, Hq). */
    int persistent;
};

/* Each family's table: mma.sync's ordered by dp (the first instance whose dp covers head_dim is
 * taken); a Hopper table's entries d64, d128, d256, d96, zeros where a variant has no instance
 * (dp 0), the smallest that covers head_dim taken. */
enum { MMA_NDP = 5, WG_NDP = 4, WGF_NVAR = 3, WS_NVAR = 7 };
extern const kernel_instance stats_mma_sm80[MMA_NDP];          /* variant 4, d32 .. d256 */
extern const kernel_instance stats_wgmma_sm90[WG_NDP];         /* variant 0, d64, d128 */
extern const kernel_instance stats_wgf_sm90[WGF_NVAR][WG_NDP]; /* variants 1-3, d64, d128 */
extern const kernel_instance stats_generic_cuda;               /* variant 5, any head_dim, dtype */
extern const kernel_instance stats_ws_sm90[WS_NVAR][WG_NDP];   /* variants 6-12, d64, d128; 6 d256; 10, 11 d96 */
/* The same kernels with sink mass and distance in the fold (XS), for the runs whose want asks for
 * either: the same shapes, entry for entry; an entry whose bf16 is NULL has none (variants 7, 8). */
extern const kernel_instance stats_mma_sm80_xs[MMA_NDP];
extern const kernel_instance stats_ws_sm90_xs[WS_NVAR][WG_NDP];
/* The same with the max logit alone (FOLD_MAX, no exps), for the runs whose want asks for nothing
 * else; an entry whose bf16 is NULL has none (variants 7, 8). */
extern const kernel_instance stats_ws_sm90_mo[WS_NVAR][WG_NDP];
/* Variants 6-12's tensor map of K for p through the driver's cuTensorMapEncodeTiled (encode_tiled,
 * as the runtime's entry point query gives it); false when it refuses (ws_sm90.cu). */
bool ws_encode_k_map(void *encode_tiled, const stats_problem *p, tma_map *out);

/* ---- the small kernels around it (generic.cu); each returns the launch's error --------------- */

/* Sampled runs: per-row outputs [n] set to "not computed" (STATS_ROW_SKIPPED, -inf) first. */
cudaError_t launch_fill_rows(float *row_h, float *row_m, long long n, int sm_count, cudaStream_t s);

/* Packed runs: blk_off[s] = the first block (rows_per_cta sampled rows) of sequence s. */
cudaError_t launch_packed_offsets(const kparams &k, int *blk_off, cudaStream_t s);

/* The CUDA-core kernel behind a masked run's gate (k.gate): a wave of CTAs per head striding over
 * k.blocks_per_head blocks, parts [heads_q][k.blocks_per_head]. */
cudaError_t launch_generic_gated(const kparams &k, part *parts, int heads_q, int sm_count,
                                 cudaStream_t s);
/* Masked runs: each mask row's interval of keys into rr ([mb * mh * len_q] int2), and 1 into
 * *general when a row's keys are not one interval or an additive value is a finite bias (the run
 * must then read the mask per logit). Reads the mask once. */
cudaError_t launch_mask_ranges(const kparams &k, int mb, int mh, int2 *rr, int *general,
                               int sm_count, cudaStream_t s);

/* parts [heads_q][nparts] -> heads [heads_q], in a fixed order; gated as kparams.gate says. */
cudaError_t launch_reduce_heads(const part *parts, int nparts, int sampled, stats_head *heads,
                                int heads_q, const int *gate, int gate_general, cudaStream_t s);

#endif /* ATTNSTAT_CUDA_KERNELS_H */
