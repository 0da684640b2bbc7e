/* ws_sm90_mo.cu — variants 6, 9, 10, 11 and 12 (ws_sm90.cuh) with the max logit alone in the fold
 * (FOLD_MAX: no exps, no entropy), for the runs that ask for max_logit and nothing else
 * (stats_problem.want; attnstat.torch.qk_clip's monitors, monitor(stats="max_logit")); variants 7
 * and 8 differ from 6 only in where their exps run, so they have none. Exports stats_ws_sm90_mo
 * (kernels.h). Built beside ws_sm90.cu and ws_sm90_xs.cu so that the three compile in parallel.
 *
 * Build alone (as kernels/cuda.cmake does):
 *   nvcc -std=c++17 -O3 -Ikernels -Ivocab -gencode=arch=compute_90a,code=sm_90a \
 *     -Xptxas=-v -c kernels/cuda/ws_sm90_mo.cu */
#include "ws_sm90.cuh"

const kernel_instance stats_ws_sm90_mo[WS_NVAR][WG_NDP] = {
    /* variant 6 */
    WS_VARIANT_D256(stats_ws_kernel, FOLD_MAX, " max"),
    WS_NONE, /* 7 */
    WS_NONE, /* 8 */
    /* 9 */
    WS_VARIANT(stats_ws_kernel, 0, 3, 64, "ws tma 3wg n64", 0, FOLD_MAX, " max", 1),
    /* 10 */
    WS_VARIANT_D96(stats_wsp_kernel, 2, 128, "ws tma pers", FOLD_MAX, " max"),
    /* 11 */
    WS_VARIANT_D96(stats_wsp_kernel, 3, 64, "ws tma 3wg pers", FOLD_MAX, " max"),
    /* 12 */
    WS_VARIANT(stats_wsp_kernel, 0, 3, 64, "ws tma 3wg pers q2", 1, FOLD_MAX, " max", 2),
};
