/* ws_sm90.cu — variants 6-12 (ws_sm90.cuh): the instances that leave sink mass and distance to
 * other kernels (NaN), for the runs that do not ask for them. Exports stats_ws_sm90 (kernels.h),
 * and the host's encoding of the tensor map of K these kernels read (ws_encode_k_map).
 *
 * Build alone (as kernels/cuda.cmake does):
 *   nvcc -std=c++17 -O3 -Ikernels -Ivocab -gencode=arch=compute_90a,code=sm_90a \
 *     -Xptxas=-v -c kernels/cuda/ws_sm90.cu */
#include "ws_sm90.cuh"

#include <cuda.h> /* CUtensorMap and its enums only: the driver is reached through the runtime */
#include <string.h>

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

/* Variants 6-12's tensor map of K (kernels.h): (head_dim, keys, heads_kv, batch), innermost first
 * (packed: batch 1, the sequences' keys one after another), boxes of 64 elements x WS_BOX_KEYS keys
 * in the 128-byte swizzle; keys past the tensor read as zeros. An extent of 1 gets the stride a
 * dense tensor would have (a broadcast stride of 0 is not one the TMA unit takes). false when the
 * driver refuses it. */
bool ws_encode_k_map(void *encode_tiled, const stats_problem *p, tma_map *out)
{
    typedef CUresult (*encode_fn)(CUtensorMap *, CUtensorMapDataType, cuuint32_t, void *,
                                  const cuuint64_t *, const cuuint64_t *, const cuuint32_t *,
                                  const cuuint32_t *, CUtensorMapInterleave, CUtensorMapSwizzle,
                                  CUtensorMapL2promotion, CUtensorMapFloatOOBfill);
    static_assert(sizeof(CUtensorMap) == sizeof(tma_map) && alignof(tma_map) >= 64,
                  "tma_map holds a CUtensorMap");
    const int packed = p->cu_seqlens_q != NULL;
    const cuuint64_t es = 2;
    cuuint64_t dim[4] = {(cuuint64_t)p->head_dim, (cuuint64_t)p->len_k, (cuuint64_t)p->heads_kv,
                         (cuuint64_t)(packed ? 1 : p->batch)};
    cuuint64_t str[3] = {(cuuint64_t)p->k.stride_n * es, (cuuint64_t)p->k.stride_h * es,
                         (cuuint64_t)p->k.stride_b * es};
    if (dim[1] == 1)
        str[0] = dim[0] * es;
    if (dim[2] == 1)
        str[1] = str[0] * dim[1];
    if (dim[3] == 1)
        str[2] = str[1] * dim[2];
    for (int i = 0; i < 3; i++)
        if (str[i] == 0 || str[i] % 16 || str[i] >= (1ull << 40))
            return false;
    const cuuint32_t box[4] = {64, WS_BOX_KEYS, 1, 1}, estr[4] = {1, 1, 1, 1};
    CUtensorMap m;
    const CUresult r = ((encode_fn)encode_tiled)(
        &m, p->dtype == STATS_F16 ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16 : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
        4, (void *)p->k.ptr, dim, str, box, estr, CU_TENSOR_MAP_INTERLEAVE_NONE,
        CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
        CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r != CUDA_SUCCESS)
        return false;
    memcpy(out, &m, sizeof m);
    return true;
}
