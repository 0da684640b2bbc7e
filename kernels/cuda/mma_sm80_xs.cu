/* mma_sm80_xs.cu — variant 4 (mma_sm80.cuh) with sink mass and distance in the fold (XS), for the
 * runs that ask for them (stats_problem.want). Exports stats_mma_sm80_xs (kernels.h). Built beside
 * mma_sm80.cu so that the two compile in parallel.
 *
 * Build alone (as kernels/cuda.cmake does):
 *   nvcc -std=c++17 -O3 -Ikernels -Ivocab -gencode=arch=compute_90a,code=sm_90a \
 *     -gencode=arch=compute_80,code=sm_80 -gencode=arch=compute_80,code=compute_80 \
 *     -Xptxas=-v -c kernels/cuda/mma_sm80_xs.cu */
#include "mma_sm80.cuh"

const kernel_instance stats_mma_sm80_xs[MMA_NDP] = MMA_TABLE(true, " +sd");
