/* mma_sm80.cu — variant 4 (mma_sm80.cuh): the instances that leave sink mass and distance to
 * other kernels (NaN), for the runs that do not ask for them. Exports stats_mma_sm80 (kernels.h).
 *
 * Build alone (as kernels/cuda.cmake does):
 *   nvcc -std=c++17 -O3 -Ikernels -Ivocab -gencode=arch=compute_90a,code=sm_90a \
 *     -gencode=arch=compute_80,code=sm_80 -gencode=arch=compute_80,code=compute_80 \
 *     -Xptxas=-v -c kernels/cuda/mma_sm80.cu */
#include "mma_sm80.cuh"

const kernel_instance stats_mma_sm80[MMA_NDP] = MMA_TABLE(false, "");
