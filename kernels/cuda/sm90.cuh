/* sm90.cuh — the sm_90a instructions the Hopper kernels use (wgmma_sm90.cu, wgf_sm90.cu): wgmma
 * with its fences and waits, the async-proxy fence, shared-memory matrix descriptors (no swizzle
 * and 128-byte swizzle), and mbarriers. CUDA C++, device only; stage: the CUDA backend of stats.h.
 * Includes common.cuh (smem_u32). Every wrapper compiles to nothing outside the sm_90a pass
 * (__CUDA_ARCH_FEAT_SM90_ALL), so the files that include it still build for sm_80 and compute_80,
 * where the Hopper kernels are empty and never launched (the launcher takes them on compute
 * capability 9.x only). */
#ifndef ATTNSTAT_CUDA_SM90_CUH
#define ATTNSTAT_CUDA_SM90_CUH

#include "common.cuh"

/* ---- wgmma ----------------------------------------------------------------------------------- */

/* D[64 x N] (+)= A[64 x 16] * B[16 x N], N = 8 * NT. A from registers (RS: each warp its 16 rows in
 * the mma.m16n8k16 A layout) or from shared memory (SS: described by adesc, K-major core matrices);
 * B from shared memory (K-major, bdesc); d is this warp's 16 x N slice in the m16n8 accumulator
 * layout. Asynchronous: wgmma_wait() before reading d. */
template <int NT, bool SS, bool F16> struct wgmma_op;
template <> struct wgmma_op<8, false, false> {
    static __device__ __forceinline__ void run(float (&d)[8][4], const unsigned (&a)[4],
                                               unsigned long long adesc, unsigned long long bdesc,
                                               int accumulate)
    {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
                     "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, "
                     "{%32,%33,%34,%35}, %36, p, 1, 1, 0;\n}\n"
                     : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(bdesc), "r"(accumulate));
#endif
        (void)a, (void)adesc;
    }
};
template <> struct wgmma_op<8, false, true> {
    static __device__ __forceinline__ void run(float (&d)[8][4], const unsigned (&a)[4],
                                               unsigned long long adesc, unsigned long long bdesc,
                                               int accumulate)
    {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 "
                     "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, "
                     "{%32,%33,%34,%35}, %36, p, 1, 1, 0;\n}\n"
                     : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(bdesc), "r"(accumulate));
#endif
        (void)a, (void)adesc;
    }
};
template <> struct wgmma_op<8, true, false> {
    static __device__ __forceinline__ void run(float (&d)[8][4], const unsigned (&a)[4],
                                               unsigned long long adesc, unsigned long long bdesc,
                                               int accumulate)
    {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
                     "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, "
                     "%32, %33, p, 1, 1, 0, 0;\n}\n"
                     : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3])
                     : "l"(adesc), "l"(bdesc), "r"(accumulate));
#endif
        (void)a, (void)adesc;
    }
};
template <> struct wgmma_op<8, true, true> {
    static __device__ __forceinline__ void run(float (&d)[8][4], const unsigned (&a)[4],
                                               unsigned long long adesc, unsigned long long bdesc,
                                               int accumulate)
    {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 "
                     "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, "
                     "%32, %33, p, 1, 1, 0, 0;\n}\n"
                     : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3])
                     : "l"(adesc), "l"(bdesc), "r"(accumulate));
#endif
        (void)a, (void)adesc;
    }
};

/* m64n128k16: the 128-key tiles of variant 6 (ws_sm90.cu); A from registers only. */
template <> struct wgmma_op<16, false, false> {
    static __device__ __forceinline__ void run(float (&d)[16][4], const unsigned (&a)[4],
                                               unsigned long long adesc, unsigned long long bdesc,
                                               int accumulate)
    {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
                     "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, "
                     "{%64,%65,%66,%67}, %68, p, 1, 1, 0;\n}\n"
                     : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3]), "+f"(d[8][0]), "+f"(d[8][1]), "+f"(d[8][2]), "+f"(d[8][3]), "+f"(d[9][0]), "+f"(d[9][1]), "+f"(d[9][2]), "+f"(d[9][3]), "+f"(d[10][0]), "+f"(d[10][1]), "+f"(d[10][2]), "+f"(d[10][3]), "+f"(d[11][0]), "+f"(d[11][1]), "+f"(d[11][2]), "+f"(d[11][3]), "+f"(d[12][0]), "+f"(d[12][1]), "+f"(d[12][2]), "+f"(d[12][3]), "+f"(d[13][0]), "+f"(d[13][1]), "+f"(d[13][2]), "+f"(d[13][3]), "+f"(d[14][0]), "+f"(d[14][1]), "+f"(d[14][2]), "+f"(d[14][3]), "+f"(d[15][0]), "+f"(d[15][1]), "+f"(d[15][2]), "+f"(d[15][3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(bdesc), "r"(accumulate));
#endif
        (void)a, (void)adesc;
    }
};
template <> struct wgmma_op<16, false, true> {
    static __device__ __forceinline__ void run(float (&d)[16][4], const unsigned (&a)[4],
                                               unsigned long long adesc, unsigned long long bdesc,
                                               int accumulate)
    {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 "
                     "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, "
                     "{%64,%65,%66,%67}, %68, p, 1, 1, 0;\n}\n"
                     : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3]), "+f"(d[8][0]), "+f"(d[8][1]), "+f"(d[8][2]), "+f"(d[8][3]), "+f"(d[9][0]), "+f"(d[9][1]), "+f"(d[9][2]), "+f"(d[9][3]), "+f"(d[10][0]), "+f"(d[10][1]), "+f"(d[10][2]), "+f"(d[10][3]), "+f"(d[11][0]), "+f"(d[11][1]), "+f"(d[11][2]), "+f"(d[11][3]), "+f"(d[12][0]), "+f"(d[12][1]), "+f"(d[12][2]), "+f"(d[12][3]), "+f"(d[13][0]), "+f"(d[13][1]), "+f"(d[13][2]), "+f"(d[13][3]), "+f"(d[14][0]), "+f"(d[14][1]), "+f"(d[14][2]), "+f"(d[14][3]), "+f"(d[15][0]), "+f"(d[15][1]), "+f"(d[15][2]), "+f"(d[15][3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(bdesc), "r"(accumulate));
#endif
        (void)a, (void)adesc;
    }
};

__device__ __forceinline__ void wgmma_fence(void)
{
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void wgmma_commit(void)
{
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#endif
}
/* Wait until at most N groups are in flight; d (the accumulator that must be complete) is marked
 * as written here so that the compiler reads it only afterwards. reg_fence: the same barrier to the
 * compiler, with no instruction. */
template <int N, int NT> struct wgmma_wait_op;
template <int NT> struct reg_fence_op;
template <> struct wgmma_wait_op<0, 8> {
    static __device__ __forceinline__ void run(float (&d)[8][4])
    {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
        asm volatile("wgmma.wait_group.sync.aligned 0;\n" : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3]) : : "memory");
#endif
    }
};
template <> struct wgmma_wait_op<1, 8> {
    static __device__ __forceinline__ void run(float (&d)[8][4])
    {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
        asm volatile("wgmma.wait_group.sync.aligned 1;\n" : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3]) : : "memory");
#endif
    }
};
template <> struct reg_fence_op<8> {
    static __device__ __forceinline__ void run(float (&d)[8][4])
    {
        asm volatile("" : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3]) : : "memory");
    }
};
template <> struct wgmma_wait_op<0, 16> {
    static __device__ __forceinline__ void run(float (&d)[16][4])
    {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
        asm volatile("wgmma.wait_group.sync.aligned 0;\n" : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3]), "+f"(d[8][0]), "+f"(d[8][1]), "+f"(d[8][2]), "+f"(d[8][3]), "+f"(d[9][0]), "+f"(d[9][1]), "+f"(d[9][2]), "+f"(d[9][3]), "+f"(d[10][0]), "+f"(d[10][1]), "+f"(d[10][2]), "+f"(d[10][3]), "+f"(d[11][0]), "+f"(d[11][1]), "+f"(d[11][2]), "+f"(d[11][3]), "+f"(d[12][0]), "+f"(d[12][1]), "+f"(d[12][2]), "+f"(d[12][3]), "+f"(d[13][0]), "+f"(d[13][1]), "+f"(d[13][2]), "+f"(d[13][3]), "+f"(d[14][0]), "+f"(d[14][1]), "+f"(d[14][2]), "+f"(d[14][3]), "+f"(d[15][0]), "+f"(d[15][1]), "+f"(d[15][2]), "+f"(d[15][3]) : : "memory");
#endif
    }
};
template <> struct wgmma_wait_op<1, 16> {
    static __device__ __forceinline__ void run(float (&d)[16][4])
    {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
        asm volatile("wgmma.wait_group.sync.aligned 1;\n" : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3]), "+f"(d[8][0]), "+f"(d[8][1]), "+f"(d[8][2]), "+f"(d[8][3]), "+f"(d[9][0]), "+f"(d[9][1]), "+f"(d[9][2]), "+f"(d[9][3]), "+f"(d[10][0]), "+f"(d[10][1]), "+f"(d[10][2]), "+f"(d[10][3]), "+f"(d[11][0]), "+f"(d[11][1]), "+f"(d[11][2]), "+f"(d[11][3]), "+f"(d[12][0]), "+f"(d[12][1]), "+f"(d[12][2]), "+f"(d[12][3]), "+f"(d[13][0]), "+f"(d[13][1]), "+f"(d[13][2]), "+f"(d[13][3]), "+f"(d[14][0]), "+f"(d[14][1]), "+f"(d[14][2]), "+f"(d[14][3]), "+f"(d[15][0]), "+f"(d[15][1]), "+f"(d[15][2]), "+f"(d[15][3]) : : "memory");
#endif
    }
};
template <> struct reg_fence_op<16> {
    static __device__ __forceinline__ void run(float (&d)[16][4])
    {
        asm volatile("" : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3]), "+f"(d[8][0]), "+f"(d[8][1]), "+f"(d[8][2]), "+f"(d[8][3]), "+f"(d[9][0]), "+f"(d[9][1]), "+f"(d[9][2]), "+f"(d[9][3]), "+f"(d[10][0]), "+f"(d[10][1]), "+f"(d[10][2]), "+f"(d[10][3]), "+f"(d[11][0]), "+f"(d[11][1]), "+f"(d[11][2]), "+f"(d[11][3]), "+f"(d[12][0]), "+f"(d[12][1]), "+f"(d[12][2]), "+f"(d[12][3]), "+f"(d[13][0]), "+f"(d[13][1]), "+f"(d[13][2]), "+f"(d[13][3]), "+f"(d[14][0]), "+f"(d[14][1]), "+f"(d[14][2]), "+f"(d[14][3]), "+f"(d[15][0]), "+f"(d[15][1]), "+f"(d[15][2]), "+f"(d[15][3]) : : "memory");
    }
};
template <int N, int NT> static __device__ __forceinline__ void wgmma_wait(float (&d)[NT][4])
{
    wgmma_wait_op<N, NT>::run(d);
}
template <int NT> static __device__ __forceinline__ void reg_fence(float (&d)[NT][4])
{
    reg_fence_op<NT>::run(d);
}
__device__ __forceinline__ void fence_proxy_async(void)
{
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}

/* A warpgroup's registers per thread lowered (the producer) or raised (the consumers) to N: every
 * thread of the warpgroup executes it. */
template <int N> __device__ __forceinline__ void setmaxnreg_dec(void)
{
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N));
#endif
}
template <int N> __device__ __forceinline__ void setmaxnreg_inc(void)
{
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N));
#endif
}

/* Named barrier ID (1..15; 0 is __syncthreads) for the first N threads' warps (N a multiple of 32). */
template <int ID, int N> __device__ __forceinline__ void named_bar_sync(void)
{
    asm volatile("bar.sync %0, %1;\n" ::"n"(ID), "n"(N) : "memory");
}

/* ---- shared-memory matrix descriptors -------------------------------------------------------- */

/* Shared-memory matrix descriptor, no swizzle: start address, leading byte offset (between core
 * matrices along K), stride byte offset (between groups of 8 rows), all in 16-byte units. */
__device__ __forceinline__ unsigned long long wg_desc(const void *p, unsigned lbo, unsigned sbo)
{
    return (unsigned long long)((smem_u32(p) & 0x3ffffU) >> 4) |
           ((unsigned long long)(lbo >> 4) << 16) | ((unsigned long long)(sbo >> 4) << 32);
}


/* Shared-memory matrix descriptor for a K-major operand in the 128-byte swizzle layout: rows of
 * 128 bytes (64 elements of K), 8-row groups 1024 bytes apart, the 16-byte chunk c of row r stored
 * at chunk position c ^ (r % 8) (address bits [4,7) XOR [7,10), so the groups are 1024-byte
 * aligned). p: the first row of the 64-element column, advanced by 32 bytes per k16 step. */
__device__ __forceinline__ unsigned long long wg_desc_sw128(const void *p)
{
    return (unsigned long long)((smem_u32(p) & 0x3ffffU) >> 4) | (1ull << 16) |
           ((unsigned long long)(1024 >> 4) << 32) | (1ull << 62);
}

/* The descriptor of p + bytes from p's descriptor d (either kind above; bytes a multiple of 16):
 * one 32-bit add to the start address field (bits [0,14), address >> 4) instead of building the
 * descriptor again. Exact while p + bytes stays inside shared memory: addresses there are below
 * 228 KiB < 2^18, so the field never carries into the bits above it (and the & 0x3ffff above
 * never dropped anything). */
__device__ __forceinline__ unsigned long long wg_desc_advance(unsigned long long d, unsigned bytes)
{
    return (d & 0xffffffff00000000ull) | (unsigned)((unsigned)d + (bytes >> 4));
}

/* ---- mbarriers ------------------------------------------------------------------------------- */

/* mbarrier in shared memory (sm_80+): init with an arrival count, arrive (release), wait for the
 * phase of the given parity to complete (acquire). */
__device__ __forceinline__ void mbar_init(unsigned long long *bar, unsigned count)
{
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_u32(bar)), "r"(count)
                 : "memory");
}
__device__ __forceinline__ void mbar_arrive(unsigned long long *bar)
{
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem_u32(bar)) : "memory");
}
__device__ __forceinline__ void mbar_wait(unsigned long long *bar, unsigned parity)
{
    const unsigned a = smem_u32(bar);
    unsigned done;
    do {
        asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
                     "selp.u32 %0, 1, 0, p;\n}\n"
                     : "=r"(done)
                     : "r"(a), "r"(parity)
                     : "memory");
    } while (!done);
}

/* Arrive on bar and add bytes to the transaction count its phase waits for (the TMA copies that
 * complete on it count them down). */
__device__ __forceinline__ void mbar_arrive_expect_tx(unsigned long long *bar, unsigned bytes)
{
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_u32(bar)),
                 "r"(bytes)
                 : "memory");
#endif
    (void)bar, (void)bytes;
}

/* The mbarriers' initialisation made visible to the async proxy (the TMA unit) before use. */
__device__ __forceinline__ void fence_mbar_init(void)
{
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
#endif
}

/* ---- TMA ------------------------------------------------------------------------------------- */

/* One box of a 4-d tensor (tensor map tmap: a kernel parameter, __grid_constant__) at coordinates
 * (c0, c1, c2, c3), innermost first, copied into shared memory at dst by the TMA unit; its bytes
 * complete on bar. Coordinates past the tensor's extent read as zeros. */
__device__ __forceinline__ void tma_load_4d(void *dst, const void *tmap, int c0, int c1, int c2,
                                            int c3, unsigned long long *bar)
{
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
    asm volatile("cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
                 " [%0], [%1, {%2, %3, %4, %5}], [%6];\n" ::"r"(smem_u32(dst)),
                 "l"((unsigned long long)tmap), "r"(c0), "r"(c1), "r"(c2), "r"(c3),
                 "r"(smem_u32(bar))
                 : "memory");
#endif
    (void)dst, (void)tmap, (void)c0, (void)c1, (void)c2, (void)c3, (void)bar;
}

/* The tensor map's 128 bytes fetched into the TMA unit's cache ahead of the first copy. */
__device__ __forceinline__ void tma_prefetch_map(const void *tmap)
{
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
    asm volatile("prefetch.tensormap [%0];\n" ::"l"((unsigned long long)tmap) : "memory");
#endif
    (void)tmap;
}

/* ---- a warp's rows and their keys (variants 1-3 and 6-12) ------------------------------------ */

/* This thread's two rows (rows[warp*16 + hr*8 + g], -1: none) with their visible keys [lo, hi]
 * (lo > hi: none), and over the warp's rows that see a key the least and greatest first key
 * (lo_min, lo_max) and last key (hi_min, hi_max): what the fold needs to skip a tile no row sees
 * and to tell a tile every row sees whole from one it must mask. */
struct warp_keys {
    int lo[2], hi[2], lo_min, lo_max, hi_min, hi_max;
};
static __device__ __forceinline__ void warp_rows_range(const kparams &p, const seqinfo &si, int h,
                                                       const int *rows, int warp, int g,
                                                       warp_keys &k)
{
    k.lo_min = 0x7fffffff, k.lo_max = -1, k.hi_min = 0x7fffffff, k.hi_max = -1;
    const bool pl = plain(p); /* the usual run in 32 bits (bench/kernel_notes.md round 22b) */
#pragma unroll
    for (int hr = 0; hr < 2; hr++) {
        const int i = rows[warp * 16 + hr * 8 + g];
        k.lo[hr] = 1, k.hi[hr] = 0;
        if (i >= 0 && pl)
            visible_range_plain(p, si, i, &k.lo[hr], &k.hi[hr]);
        else if (i >= 0)
            visible_range(p, si, h, i, &k.lo[hr], &k.hi[hr]);
        if (k.lo[hr] <= k.hi[hr]) {
            k.lo_min = min(k.lo_min, k.lo[hr]), k.lo_max = max(k.lo_max, k.lo[hr]);
            k.hi_min = min(k.hi_min, k.hi[hr]), k.hi_max = max(k.hi_max, k.hi[hr]);
        }
    }
    for (int m = 4; m < 32; m <<= 1) {
        k.lo_min = min(k.lo_min, __shfl_xor_sync(0xffffffffu, k.lo_min, m));
        k.lo_max = max(k.lo_max, __shfl_xor_sync(0xffffffffu, k.lo_max, m));
        k.hi_min = min(k.hi_min, __shfl_xor_sync(0xffffffffu, k.hi_min, m));
        k.hi_max = max(k.hi_max, __shfl_xor_sync(0xffffffffu, k.hi_max, m));
    }
}

/* The end of a warp's rows: the four lanes of a quad hold disjoint keys of each row, so their
 * (M, l, W) are merged exactly (state_merge), and lane hr of the quad finishes row hr into acc
 * (both rows at once, 16 lanes of the warp, where one lane finishing both took two passes of 8:
 * bench/kernel_notes.md round 20), with head h's sink (read here, once per block and warp, after
 * the block's tiles). XS: the fold also kept D (fold_lane), summed over the quad at the merged
 * max, and F0 the raw logit of each row's first key (first_key_pick), whose scaled value gives
 * the row's sink mass (quad_first_logit); without, row_done gets NaN for both. */
template <bool XS = false>
static __device__ __forceinline__ void warp_rows_done(const kparams &p, const seqinfo &si, int h,
                                                      const int *rows, int warp, int g, int tq,
                                                      const warp_keys &k, const float (&M)[2],
                                                      const float (&l)[2], const float (&W)[2],
                                                      part &acc, const float *D = nullptr,
                                                      const float *F0 = nullptr)
{
    const float sink = head_sink(p, h);
    float Ms[2], ls[2], Ws[2], Fs[2], Ds[2];
    int is[2];
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
        const int i = rows[warp * 16 + hr * 8 + g];
        float F = NAN, Dr = NAN;
        if (XS) { /* every lane: the shuffles below take the whole warp */
            Dr = D[hr] != 0.0f ? D[hr] * ex2(M[hr] - Mr) : 0.0f; /* to the quad's max */
            Dr += __shfl_xor_sync(0xffffffffu, Dr, 1);
            Dr += __shfl_xor_sync(0xffffffffu, Dr, 2);
            F = quad_first_logit(p, F0[hr], i >= 0 && k.lo[hr] <= k.hi[hr]);
        }
        Ms[hr] = Mr, ls[hr] = lr, Ws[hr] = wr, Fs[hr] = F, Ds[hr] = Dr, is[hr] = i;
    }
    /* every lane of the quad holds both rows' merged states: lane 0 finishes row 0, lane 1 row 1
     * (selects, not an index: a register array indexed at run time goes to local memory) */
    const bool r1 = tq == 1;
    const int i = r1 ? is[1] : is[0];
    if (tq < 2 && i >= 0) {
        const long long ro = ((long long)si.tb * p.hq + h) * p.len_q + si.q0 + i;
        const int nvis = r1 ? k.hi[1] - k.lo[1] + 1 : k.hi[0] - k.lo[0] + 1;
        const float Mr = r1 ? Ms[1] : Ms[0];
        row_done<XS>(p, acc, ro, nvis, Mr, r1 ? ls[1] : ls[0], r1 ? Ws[1] : Ws[0], Mr, sink,
                     r1 ? Fs[1] : Fs[0], r1 ? Ds[1] : Ds[0]);
    }
}

/* ---- the per-lane fold (variants 1-3 and 6-12) --------------------------------------------- */

/* The largest of row hr's 2 * NT values of a tile on this lane (columns 2 tq, 2 tq + 1 of each n8
 * block; masked keys already -inf), scaled and softcapped into the fold's base-2 logit (scaling
 * and softcap are increasing: the logit of the max dot product). A tree of depth 4 (5 at NT = 16)
 * with its stages written out: a loop over the stride put the array on the stack (64 bytes of
 * local memory in the 128-key variants, bench/kernel_notes.md). fold_lane's and fold_max's. */
template <int NT, bool CAP>
static __device__ __forceinline__ float lane_row_max(const kparams &p, const float (&s)[NT][4],
                                                     int hr)
{
    constexpr int NV = 2 * NT;
    static_assert(NV == 16 || NV == 32, "the tree below is written for 16 or 32 values per row");
    float t[NV / 2];
#pragma unroll
    for (int k = 0; k < NV / 2; k++)
        t[k] = fmaxf(s[k >> 1][2 * hr + (k & 1)], s[(k + NV / 2) >> 1][2 * hr + (k & 1)]);
    if (NV == 32) {
#pragma unroll
        for (int k = 0; k < 8; k++)
            t[k] = fmaxf(t[k], t[k + 8]);
    }
#pragma unroll
    for (int k = 0; k < 4; k++)
        t[k] = fmaxf(t[k], t[k + 4]);
    t[0] = fmaxf(fmaxf(t[0], t[2]), fmaxf(t[1], t[3]));
    return CAP ? p.cl * tanhf(t[0] * p.sc) : t[0] * p.c;
}

/* One tile of 8 * NT keys (64: variants 1-3, wgf_sm90.cu; 128: variant 6, ws_sm90.cu) folded into
 * per-lane row states. Each lane keeps its own (M, l, W) per row over the keys it holds (2 * NT per
 * tile: columns 2*tq, 2*tq+1 of each n8 block); the four lanes of a quad are merged exactly once,
 * at the end of the row (state_merge), so the tile needs no shuffle. Within a tile: tree max
 * (depth 4, 5 at NT = 16), one rescale per row with the lane's true running max (branch-free:
 * a = 2^d with d clamped at -256 so that a = 0 and a*d = 0 where the old max was -inf, instead of
 * -inf*0), then the row's exps summed into NP independent partials of l and W, combined at the end
 * of the tile: w <- a*(w + d*l) + sum e*u,  l <- a*l + sum e (POLY of every 8 n8 blocks' exps by
 * ex2_poly on the FMA pipe, the rest on MUFU). Both rows are one straight-line
 * block, so their chains interleave. NaN/Inf behave as in fold_tile: +Inf makes M infinite (and u
 * NaN), NaN makes l NaN, a -Inf logit with a finite max makes e*u NaN.
 * XS (sink mass and distance): also D[hr] = sum e |pos[hr] - j| per lane, combined like l
 * (D <- a*D + the tile's sum), with b = j0 + 2 tq - pos per row and tile and c the key's constant
 * offset in the tile (j - pos = b + c):
 *   XS = 1, a tile whose keys are all <= pos for both rows (the caller knows: every tile off the
 *           diagonal of a causal run): sum e |b + c| = -(b * sum e + sum e * c), and sum e * c is
 *           one FFMA per logit with c an immediate;
 *   XS = 2, any other tile: NP partials of e * |b + c| (FADD, abs, FFMA per logit).
 * XS = 0 is the code as it was before the two statistics. */
template <int NT, bool CAP, bool MASK, int POLY = 0, int XS = 0>
static __device__ __forceinline__ void fold_lane(const kparams &p, float (&s)[NT][4], float (&M)[2],
                                                 float (&l)[2], float (&W)[2], const int (&lo)[2],
                                                 const int (&hi)[2], int j0, int tq,
                                                 float *D = nullptr, const int *pos = nullptr)
{
    constexpr int NV = 2 * NT, NP = 4;
    static_assert(NV == 16 || NV == 32, "the tree max below is written for 16 or 32 values per row");
    if (MASK) {
#pragma unroll
        for (int hr = 0; hr < 2; hr++)
#pragma unroll
            for (int nt = 0; nt < NT; nt++)
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    const int j = j0 + nt * 8 + 2 * tq + e;
                    if (j < lo[hr] || j > hi[hr])
                        s[nt][2 * hr + e] = -INFINITY;
                }
    }
    float Mn[2], a[2], ad[2];
#pragma unroll
    for (int hr = 0; hr < 2; hr++) {
        const float Mt = lane_row_max<NT, CAP>(p, s, hr);
        Mn[hr] = fmaxf(M[hr], Mt);
        const float d = fmaxf(M[hr] - Mn[hr], -256.0f);
        a[hr] = ex2(d);
        ad[hr] = a[hr] * d;
    }
    float lp[2][NP], wp[2][NP], dp[2][NP];
#pragma unroll
    for (int hr = 0; hr < 2; hr++) {
        const float negM = -Mn[hr];
        const float b = XS ? (float)(j0 + 2 * tq - pos[hr]) : 0.0f;
#pragma unroll
        for (int k = 0; k < NV; k++) {
            const float v = s[k >> 1][2 * hr + (k & 1)];
            float u = CAP ? fmaf(p.cl, tanh_fast(v * p.sc), negM) : fmaf(v, p.c, negM);
            /* POLY of every 8 n8 blocks: the polynomial 2^u on the FMA pipe instead of MUFU */
            float e = POLY > 0 && ((k >> 1) & 7) < POLY ? ex2_poly(u) : ex2(u);
            if (MASK) {
                const int j = j0 + (k >> 1) * 8 + 2 * tq + (k & 1);
                const bool vis = j >= lo[hr] && j <= hi[hr];
                e = vis ? e : 0.0f;
                u = vis ? u : 0.0f;
            }
            const int q = k % NP;
            if (k < NP) {
                lp[hr][q] = e;
                wp[hr][q] = e * u;
            } else {
                lp[hr][q] += e;
                wp[hr][q] = fmaf(e, u, wp[hr][q]);
            }
            if (XS) {
                const float c = (float)((k >> 1) * 8 + (k & 1));
                const float dj = XS == 1 ? c : fabsf(b + c);
                dp[hr][q] = k < NP ? e * dj : fmaf(e, dj, dp[hr][q]);
            }
        }
    }
#pragma unroll
    for (int hr = 0; hr < 2; hr++) {
        const float lt = (lp[hr][0] + lp[hr][1]) + (lp[hr][2] + lp[hr][3]);
        const float wt = (wp[hr][0] + wp[hr][1]) + (wp[hr][2] + wp[hr][3]);
        W[hr] = fmaf(a[hr], W[hr], fmaf(ad[hr], l[hr], wt));
        l[hr] = fmaf(a[hr], l[hr], lt);
        M[hr] = Mn[hr];
        if (XS) {
            const float dt = (dp[hr][0] + dp[hr][1]) + (dp[hr][2] + dp[hr][3]);
            const float b = (float)(j0 + 2 * tq - pos[hr]);
            D[hr] = fmaf(a[hr], D[hr], XS == 1 ? -fmaf(b, lt, dt) : dt);
        }
    }
}

/* ---- the max logit alone (FOLD_MAX instances of variants 6, 9, 10, 11) ----------------------- */

/* One tile of 8 * NT keys into per-lane running maxima, no exps (a run that asks for max_logit
 * alone: common.cuh FOLD_MAX): M[hr] <- the max of the row's visible logits, scaled and softcapped
 * in base 2 as fold_lane's M (the same number: a max does not depend on its order), and A[hr],
 * finite exactly where fold_lane's (M, l, W) stays finite (common.cuh): without a softcap the sum
 * of the visible dot products times 2^-64 (finite exactly when each is), with one the max of
 * their magnitudes with NaN kept (fmax_nan: only NaN counts there, an infinite dot product caps
 * to +-cl as in fold_lane).
 * Masked keys are selected out of both (-inf for M, in s as fold_lane does; 0 for A). M by
 * lane_row_max (fold_lane's tree) over s; A in two chains as the values stream past, so that no
 * second array of a tile's values is live (one spilled variant 6 at both head_dims). One FMNMX and one
 * FFMA per logit (two FMNMX with a softcap) where fold_lane takes about five instructions and an
 * exp. */
template <int NT, bool CAP, bool MASK>
static __device__ __forceinline__ void fold_max(const kparams &p, float (&s)[NT][4], float (&M)[2],
                                                float (&A)[2], const int (&lo)[2],
                                                const int (&hi)[2], int j0, int tq)
{
    constexpr int NV = 2 * NT;
    static_assert(NV == 16 || NV == 32, "the tree max below is written for 16 or 32 values per row");
#pragma unroll
    for (int hr = 0; hr < 2; hr++) {
        float a0 = 0.0f, a1 = 0.0f;
#pragma unroll
        for (int k = 0; k < NV; k++) {
            float &v = s[k >> 1][2 * hr + (k & 1)];
            float av = CAP ? fabsf(v) : v;
            if (MASK) {
                const int j = j0 + (k >> 1) * 8 + 2 * tq + (k & 1);
                const bool vis = j >= lo[hr] && j <= hi[hr];
                av = vis ? av : 0.0f;
                v = vis ? v : -INFINITY;
            }
            float &a = k & 1 ? a1 : a0;
            /* no softcap: a sum (FFMA, the FMA pipe; the max tree keeps the ALU pipe), non-finite
             * exactly when a value is (+inf and -inf give NaN), scaled by 2^-64 so that no sum of
             * finite dot products reaches float's range; with one (where an infinite dot product
             * caps to a finite logit and NaN alone counts) the max of magnitudes, NaN kept */
            a = CAP ? fmax_nan(a, av) : fmaf(av, 0x1p-64f, a);
        }
        const float Mt = lane_row_max<NT, CAP>(p, s, hr);
        M[hr] = fmaxf(M[hr], Mt);
        A[hr] = CAP ? fmax_nan(A[hr], fmax_nan(a0, a1)) : A[hr] + (a0 + a1);
    }
}

/* warp_rows_done for fold_max's (M, A): merged over the quad (the lanes hold disjoint keys), then
 * lane 0 of the quad finishes the row (row_done_max) with head h's sink. */
template <bool = true>
static __device__ __forceinline__ void warp_rows_done_max(const kparams &p, const seqinfo &si,
                                                          int h, const int *rows, int warp, int g,
                                                          int tq, const warp_keys &k,
                                                          const float (&M)[2], const float (&A)[2],
                                                          part &acc)
{
    const float sink = head_sink(p, h);
#pragma unroll
    for (int hr = 0; hr < 2; hr++) {
        float Mr = M[hr], Ar = A[hr];
#pragma unroll
        for (int m = 1; m <= 2; m <<= 1) {
            Mr = fmaxf(Mr, __shfl_xor_sync(0xffffffffu, Mr, m));
            const float A2 = __shfl_xor_sync(0xffffffffu, Ar, m);
            Ar = p.softcap ? fmax_nan(Ar, A2) : Ar + A2;
        }
        const int i = rows[warp * 16 + hr * 8 + g];
        if (tq == 0 && i >= 0) {
            const long long ro = ((long long)si.tb * p.hq + h) * p.len_q + si.q0 + i;
            /* softcapped logits are finite wherever the dot product is not NaN (tanh(+-inf)) */
            row_done_max(p, acc, ro, k.hi[hr] - k.lo[hr] + 1, Mr,
                         p.softcap ? Ar == Ar : fabsf(Ar) < INFINITY, sink);
        }
    }
}

#endif /* ATTNSTAT_CUDA_SM90_CUH */
