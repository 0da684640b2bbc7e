/* variants.h — the one numbering of the statistics kernels. The launcher (launch.cu), the dev
 * harness (kernels/dev/stats_dev.c), the bench scripts (bench/bench_kernel.py reads the table
 * below), the test knobs and bench/kernel_notes.md all say "variant N" with these numbers. Plain C
 * (C11 and C++); stage: the CUDA backend of stats.h; includes stats_cuda.h only.
 *
 * How a variant is asked for: the Hopper variants 0-3 and 6-12 through STATS_CUDA_PATH_WG_VARIANT + N
 * (N < stats_cuda_wg_variant_count() == 13 with stats_cuda_wg_variant_exists(N); WG_VARIANT + 4
 * and + 5 act as MMA_SYNC; the test's ATTNSTAT_TEST_WG_ONLY=N), variant 4 through
 * STATS_CUDA_PATH_MMA_SYNC, variant 5 through STATS_CUDA_PATH_GENERIC (stats_variant_get(); the
 * bench's ATTNSTAT_BENCH_VARIANTS and stats_dev take any number); AUTO and STATS_CUDA_PATH_WGMMA
 * take STATS_VARIANT_DEFAULT where it applies.
 * Where a variant does not apply (another GPU, head_dim, dtype or alignment) the planner falls
 * back as stats_cuda.h says: Hopper -> mma.sync -> CUDA cores; stats_cuda_plan_variant() says what
 * a run will really use.
 *
 * A number is never given to another kernel: a retired variant keeps its line in
 * bench/kernel_notes.md. The public path STATS_CUDA_PATH_WG_VARIANT + N reaches Hopper variant N
 * (launch.cu checks the numbers). */
#ifndef ATTNSTAT_CUDA_VARIANTS_H
#define ATTNSTAT_CUDA_VARIANTS_H

#include "stats_cuda.h"

/* Sink mass and distance (stats.h): the CUDA-core kernel (5) computes them always; variant 4 and
 * variants 6, 9, 10 and 11 have a second instance each that computes them (stats_mma_sm80_xs,
 * stats_ws_sm90_xs: kernels.h), which a run takes when its want asks for either (they cost the
 * fold time: bench/kernel_notes.md); AUTO then leaves a Hopper variant without one (2, for
 * float32 inputs or a K the TMA unit refuses) for variant 4's. Variants 0-3, 7 and 8 leave them
 * NaN (and variant 12, bench only). The max logit alone (a want of max_logit and nothing else):
 * variants 6, 9, 10, 11 and 12 have a third instance without exps (stats_ws_sm90_mo: FOLD_MAX,
 * common.cuh), the others compute the entropy too (left out of the result by stats_head_keep()). */

#ifdef __cplusplus
extern "C" {
#endif

/* X(number, ID, how it is asked for: WG (path WG_VARIANT + number) | MMA_SYNC | GENERIC, name,
 *   kernel (file): what it is), numbers in order from 0. stats_cuda_kernel_name() names a run with
 *   the name in it. */
#define STATS_VARIANTS(X)                                                                          \
    X(0, WGMMA, WG, "3wg n64 rs",                                                                  \
      "stats_wgmma_kernel (cuda/wgmma_sm90.cu): wgmma m64n64k16, 3 warpgroups x 64 rows, 64-key "  \
      "tiles, Q in registers, fold of the quad's max per tile")                                    \
    X(1, FOLD2, WG, "fold2",                                                                       \
      "stats_wgf_kernel SW=0 MB=0 (cuda/wgf_sm90.cu): variant 0's shape, per-lane row states "     \
      "(fold_lane), K addressing computed once per thread")                                        \
    X(2, FOLD2_SW128, WG, "fold2 sw128",                                                           \
      "stats_wgf_kernel SW=1 MB=0 (cuda/wgf_sm90.cu): variant 1 with K in the 128-byte swizzle "   \
      "layout, a whole line per 8 lanes; the default until round 7, and for float32")             \
    X(3, FOLD2_SW128_MBAR, WG, "fold2 sw128 mbar",                                                 \
      "stats_wgf_kernel SW=1 MB=1 (cuda/wgf_sm90.cu): variant 2 with per-stage mbarriers instead " \
      "of the per-tile CTA barrier")                                                               \
    X(4, MMA_SYNC, MMA_SYNC, "mma.sync",                                                           \
      "stats_mma_kernel (cuda/mma_sm80.cu): mma.sync m16n8k16, 8 warps x 32 rows (16 at d256), "   \
      "64-key tiles through 3 cp.async stages; sm_80 and newer, head_dim 1..256")                  \
    X(5, GENERIC, GENERIC, "cuda-core",                                                            \
      "stats_generic_kernel (cuda/generic.cu): CUDA cores, one warp per row, any dtype, "          \
      "head_dim and stride")                                                                       \
    X(6, WS_TMA, WG, "ws tma",                                                                     \
      "stats_ws_kernel (cuda/ws_sm90.cu): a producer warpgroup loading 128-key K tiles with the "  \
      "TMA unit, 2 consumer warpgroups x 64 rows on wgmma m64n128k16; bf16/f16; AUTO's for "       \
      "sampled rows and causal rows of > 8192 keys; at head_dim 129-256 (by number only) 64-key "  \
      "tiles, Q read by wgmma from shared memory")                                                 \
    X(7, WS_TMA_P1, WG, "ws tma p1",                                                               \
      "stats_ws_kernel POLY=1 (cuda/ws_sm90.cu): variant 6 with 1/8 of the exps by a polynomial "  \
      "on the FMA pipe (ex2_poly) instead of MUFU")                                                \
    X(8, WS_TMA_P2, WG, "ws tma p2",                                                               \
      "stats_ws_kernel POLY=2 (cuda/ws_sm90.cu): variant 6 with 1/4 of the exps on the FMA pipe")  \
    X(9, WS_TMA_3WG, WG, "ws tma 3wg n64",                                                         \
      "stats_ws_kernel NCW=3 BN=64 (cuda/ws_sm90.cu): variant 6 with 3 consumer warpgroups (192 "  \
      "rows, 160 registers each) on 64-key tiles (wgmma m64n64k16); AUTO's for masks with a row " \
      "per query")                                                                                \
    X(10, WS_TMA_PERS, WG, "ws tma pers",                                                          \
      "stats_wsp_kernel NCW=2 BN=128 (cuda/ws_sm90.cu): variant 6 as a persistent kernel, one "    \
      "CTA per SM taking blocks longest first, the next block's rows, Q and K loading under the "  \
      "current one; AUTO's for full rows and causal rows of 4097-8192 keys at head_dim 64")       \
    X(11, WS_TMA_3WG_PERS, WG, "ws tma 3wg pers",                                                  \
      "stats_wsp_kernel NCW=3 BN=64 (cuda/ws_sm90.cu): variant 9 as a persistent kernel; AUTO's " \
      "for causal rows of <= 8192 keys (<= 4096 at head_dim 64)")                                \
    X(12, WS_TMA_3WG_PERS_Q2, WG, "ws tma 3wg pers q2",                                            \
      "stats_wsp_kernel NCW=3 BN=64 QB=2 (cuda/ws_sm90.cu): variant 11 with two Q buffers and four " \
      "blocks' rows, one producer thread issuing K tiles apart from the three warps that prepare "  \
      "the blocks ahead (a 4-stage ring at head_dim 128); bench only (round 12)")

/* How each kind of variant is asked for (the third column). */
#define STATS_VARIANT_PATH_WG(n) ((stats_cuda_path)(STATS_CUDA_PATH_WG_VARIANT + (n)))
#define STATS_VARIANT_PATH_MMA_SYNC(n) STATS_CUDA_PATH_MMA_SYNC
#define STATS_VARIANT_PATH_GENERIC(n) STATS_CUDA_PATH_GENERIC
#define STATS_VARIANT_IS_WG_WG 1
#define STATS_VARIANT_IS_WG_MMA_SYNC 0
#define STATS_VARIANT_IS_WG_GENERIC 0

#define STATS_VARIANT_ENUM(n, id, sel, name, what) STATS_VARIANT_##id = n,
#define STATS_VARIANT_ONE(n, id, sel, name, what) +1
#define STATS_VARIANT_ONE_WG(n, id, sel, name, what) +STATS_VARIANT_IS_WG_##sel
typedef enum {
    STATS_VARIANTS(STATS_VARIANT_ENUM)
    STATS_VARIANT_COUNT = 0 STATS_VARIANTS(STATS_VARIANT_ONE),
    STATS_VARIANT_HOPPER_COUNT = 0 STATS_VARIANTS(STATS_VARIANT_ONE_WG), /* how many */
    STATS_VARIANT_WG_END = STATS_VARIANT_WS_TMA_3WG_PERS_Q2 + 1, /* WG_VARIANT + N below it (not 4, 5) */
    STATS_VARIANT_DEFAULT = STATS_VARIANT_WS_TMA, /* what AUTO and WGMMA take on Hopper, or 9, 10
                                                     or 11 by the problem's shape, 2 for float32
                                                     and K the TMA unit refuses: launch.cu
                                                     pick_wg */
} stats_variant;
#undef STATS_VARIANT_ENUM
#undef STATS_VARIANT_ONE
#undef STATS_VARIANT_ONE_WG

/* What the table says of one variant. */
typedef struct {
    const char *name;     /* "fold2 sw128" */
    const char *what;     /* the kernel, its file, what it is */
    stats_cuda_path path; /* the path that asks for it */
} stats_variant_info;

/* Variant v's line of the table; NULL past it. */
static inline const stats_variant_info *stats_variant_get(int v)
{
#define STATS_VARIANT_INFO(n, id, sel, name, what) {name, what, STATS_VARIANT_PATH_##sel(n)},
    static const stats_variant_info k_info[] = {STATS_VARIANTS(STATS_VARIANT_INFO)};
#undef STATS_VARIANT_INFO
    return v >= 0 && v < STATS_VARIANT_COUNT ? &k_info[v] : NULL;
}

/* The variant a run of p on ctx would use with ctx's current path, after the planner's fallbacks
 * (launch.cu); -1 when p is not valid. Tensor pointers in p are read for their alignment only. */
int stats_cuda_plan_variant(const stats_cuda *ctx, const stats_problem *p);

#ifdef __cplusplus
}
#endif

#endif /* ATTNSTAT_CUDA_VARIANTS_H */
