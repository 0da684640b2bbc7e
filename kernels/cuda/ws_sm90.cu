/* ws_sm90.cu — variants 6-12 (ws_sm90.cuh): the instances that leave sink mass and distance to
 * other kernels (NaN), for the runs that do not ask for them. Exports stats_ws_sm90 (kernels.h).
 *
 * Build alone (as kernels/cuda.cmake does):
 *   nvcc -std=c++17 -O3 -Ikernels -Ivocab -gencode=arch=compute_90a,code=sm_90a \
 *     -Xptxas=-v -c kernels/cuda/ws_sm90.cu */
#include "ws_sm90.cuh"

const kernel_instance stats_ws_sm90[WS_NVAR][WG_NDP] = {
    /* variant 6 */
    WS_VARIANT_D256(stats_ws_kernel, FOLD_BASE, ""),
    /* 7: 1/8 exps on FMA */
    WS_VARIANT(stats_ws_kernel, 1, 2, 128, "ws tma p1", 0, FOLD_BASE, "", 1),
    /* 8: 1/4 */
    WS_VARIANT(stats_ws_kernel, 2, 2, 128, "ws tma p2", 0, FOLD_BASE, "", 1),
    /* 9: 3 consumer wgs */
    WS_VARIANT(stats_ws_kernel, 0, 3, 64, "ws tma 3wg n64", 0, FOLD_BASE, "", 1),
    /* 10: 6, persistent */
    WS_VARIANT_D96(stats_wsp_kernel, 2, 128, "ws tma pers", FOLD_BASE, ""),
    /* 11: 9, persistent */
    WS_VARIANT_D96(stats_wsp_kernel, 3, 64, "ws tma 3wg pers", FOLD_BASE, ""),
    /* 12: 11, blocks ahead */
    WS_VARIANT(stats_wsp_kernel, 0, 3, 64, "ws tma 3wg pers q2", 1, FOLD_BASE, "", 2),
};
