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

#endif /* ATTNSTAT_CUDA_SM90_CUH */
