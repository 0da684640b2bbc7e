/* ws_sm90_mo.cu — variants 6, 9, 10, 11 and 12 (ws_sm90.cuh) with the max logit alone in the fold
 * (FOLD_MAX: no exps, no entropy), for the runs that ask for max_logit and nothing else
 * (stats_problem.want; attnstat.torch.qk_clip's monitors, monitor(stats="max_logit")); variants 7
 * and 8 differ from 6 only in where their exps run, so they have none. Exports stats_ws_sm90_mo
 * and launch_k_magnitude (kernels.h). Built beside ws_sm90.cu and ws_sm90_xs.cu so that the three compile in parallel.
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

/* Every element of K read once (the tensor's rows as the tensor map spans them: head_dim x len_k
 * x heads_kv x batch, packed: batch 1), a warp a row: the largest of the 16-bit patterns' magnitude
 * bits, by atomicMax into *out. The order of the bits is the order of the magnitudes, and a NaN or
 * an infinity has the largest exponent, so the result tells ws_consume both whether K is finite
 * and how large its elements are (round 28). Block FILL_THREADS, grid-stride. */
__global__ void k_magnitude_kernel(const kparams p, unsigned *out)
{
    const int hkv = p.hq / p.group, nb = p.packed ? 1 : p.batch;
    const long long rows = (long long)nb * hkv * p.len_k;
    const int lane = threadIdx.x & 31, wpb = blockDim.x >> 5;
    const unsigned short *k = (const unsigned short *)p.k;
    unsigned m = 0;
    for (long long r = (long long)blockIdx.x * wpb + (threadIdx.x >> 5); r < rows;
         r += (long long)gridDim.x * wpb) {
        const long long n = r % p.len_k, bh = r / p.len_k, h = bh % hkv, b = bh / hkv;
        const unsigned short *row = k + b * p.ksb + h * p.ksh + n * p.ksn;
        for (int j = lane; j < p.d; j += 32)
            m = max(m, (unsigned)(row[j] & 0x7fffu));
    }
    m = __reduce_max_sync(0xffffffffu, m);
    if (lane == 0 && m)
        atomicMax(out, m);
}

cudaError_t launch_k_magnitude(const kparams &k, unsigned *out, int sm_count, cudaStream_t s)
{
    cudaError_t e = cudaMemsetAsync(out, 0, sizeof *out, s);
    if (e != cudaSuccess)
        return e;
    const int hkv = k.hq / k.group;
    const long long rows = (long long)(k.packed ? 1 : k.batch) * hkv * k.len_k;
    const long long wpb = FILL_THREADS / 32, want = (rows + wpb - 1) / wpb;
    const long long cap = (long long)sm_count * 8;
    const long long blocks = want < 1 ? 1 : want < cap ? want : cap;
    k_magnitude_kernel<<<(unsigned)blocks, FILL_THREADS, 0, s>>>(k, out);
    return cudaGetLastError();
}

/* The pass is a launch and a read of K; the folds it shortens save about a fifth of the max-only
 * kernel's time (round 28's prediction), so below some size it costs more than it saves: 2^26
 * logits by default, a guess until measured (bench/kernel_notes.md round 28). */
bool ws_kmag_pays(const stats_problem *p, double min_logits)
{
    const int packed = p->cu_seqlens_q != NULL, nb = p->batch > 0 ? p->batch : 1;
    const double rows = (double)(packed ? 1 : nb) * p->heads_q * stats_sampled_count(p, p->len_q);
    const double keys = packed ? (double)p->len_k / nb : (double)p->len_k;
    return rows * keys / (p->causal ? 2.0 : 1.0) >= min_logits;
}
