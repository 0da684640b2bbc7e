/* ws_sm90_xs.cu — variants 6-11 (ws_sm90.cuh) with sink mass and distance in the fold (XS), for
 * the runs that ask for them (stats_problem.want); variants 7, 8 and 12 have none. Exports
 * stats_ws_sm90_xs (kernels.h). Built beside ws_sm90.cu so that the two compile in parallel.
 *
 * Build alone (as kernels/cuda.cmake does):
 *   nvcc -std=c++17 -O3 -Ikernels -Ivocab -gencode=arch=compute_90a,code=sm_90a \
 *     -Xptxas=-v -c kernels/cuda/ws_sm90_xs.cu */
#include "ws_sm90.cuh"

const kernel_instance stats_ws_sm90_xs[WS_NVAR][WG_NDP] = {
    /* variant 6 */
    WS_VARIANT_D256(stats_ws_kernel, FOLD_XS, " +sd"),
    WS_NONE, /* 7 */
    WS_NONE, /* 8 */
    /* 9 */
    WS_VARIANT(stats_ws_kernel, 0, 3, 64, "ws tma 3wg n64", 0, FOLD_XS, " +sd", 1),
    /* 10 */
    WS_VARIANT_D96(stats_wsp_kernel, 2, 128, "ws tma pers", FOLD_XS, " +sd"),
    /* 11 */
    WS_VARIANT_D96(stats_wsp_kernel, 3, 64, "ws tma 3wg pers", FOLD_XS, " +sd"),
    WS_NONE, /* 12 */
};
