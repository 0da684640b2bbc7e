/* stats_cuda.h — the CUDA backend of stats.h: the same problem, the same results as stats_cpu(),
 * computed on the GPU from device tensors on a caller-given stream. Plain C; no CUDA header needed
 * (streams are passed as void *, i.e. a cudaStream_t, NULL for the legacy default stream).
 *
 * One context per device, created once: it owns a grow-only workspace (per-block partial
 * statistics, packed-sequence block offsets, per-head results, a pinned host staging buffer). A
 * call allocates nothing unless the problem needs more workspace than any earlier call
 * (stats_cuda_reserve() sizes it ahead of time, so that the steady state never allocates).
 * A context is not thread-safe: use it from one thread, and keep the calls that share it on one
 * stream (the workspace is reused by the next call on that stream).
 *
 * What is computed: exactly stats_cpu()'s stats_head and per-row outputs (stats.h), in float32 on
 * the device with the shifted accumulator of stats_cpu.c (in base 2: cuda/common.cuh) and the true
 * row max, reduced per head in a fixed order (the results do not depend on scheduling). Q.K^T runs on the tensor cores
 * (bf16/f16 in, f32 accumulation) when the data are 16-byte aligned and the strides are multiples
 * of 8 elements: wgmma on Hopper for head_dim 33..128, mma.sync otherwise (and on Ampere); float32
 * tensors are rounded to the operand type as their tiles load. Everything else (odd strides, a
 * 16-bit tensor computed in the other 16-bit type, general masks) takes a CUDA-core path that gives
 * the same results more slowly.
 * Precision: the logits' inputs are q and k rounded to compute_dtype (stats.h); float32 tensors
 * with compute_dtype STATS_F32 (plain float32, no autocast) are computed as STATS_BF16 on every
 * GPU path (stats_cpu() computes them exactly): bench/RESULTS.md measures what that costs against
 * exact float32 (at most ~1e-2 nats per row). The implementation: cuda/ (launch.cu plans and launches; the kernels
 * and their numbers in cuda/variants.h); kernels/dev/stats_dev runs one variant against
 * stats_cpu() and times it.
 *
 * Device pointers: p->q.ptr, p->k.ptr, p->mask.ptr, p->sinks, p->cu_seqlens_q/k, row_entropy,
 * row_maxlogit, heads_dev.
 * Packed offsets are read on the device only: the caller validates them on the host first
 * (stats_validate_seqlens() on a host copy); the kernels clamp them to [0, len] so that bad offsets
 * give wrong statistics, never an out-of-bounds access.
 *
 * When the build has no CUDA (ATTNSTAT_HAVE_CUDA undefined) every function exists and returns
 * STATS_ENOTSUP with a message saying so. */
#ifndef ATTNSTAT_STATS_CUDA_H
#define ATTNSTAT_STATS_CUDA_H

#include "stats.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct stats_cuda stats_cuda;

/* Which implementation of Q.K^T a call uses. */
typedef enum {
    STATS_CUDA_PATH_AUTO = 0,    /* tensor cores when the problem allows it, else CUDA cores */
    STATS_CUDA_PATH_GENERIC = 1, /* always the CUDA-core path (slow; a cross-check) */
    STATS_CUDA_PATH_MMA_SYNC = 2, /* tensor cores through mma.sync only, also on Hopper (no wgmma) */
    STATS_CUDA_PATH_WGMMA = 3,    /* the Hopper kernel wherever it applies (AUTO does the same on
                                     Hopper; this path names it) */
    STATS_CUDA_PATH_WG_VARIANT = 16, /* + v, stats_cuda_wg_variant_exists(v): variant v of the
                                        Hopper kernel (tests and bench; numbers in
                                        cuda/variants.h). Any value not named here acts as
                                        MMA_SYNC. */
} stats_cuda_path;

/* One past the highest Hopper variant number, whether N is one (the numbers between are other
 * kernels: cuda/variants.h), and the one AUTO and WGMMA use. */
int stats_cuda_wg_variant_count(void);
int stats_cuda_wg_variant_exists(int v);
int stats_cuda_wg_variant_default(void);

/* 1 when this build has the CUDA backend, 0 otherwise. */
int stats_cuda_built(void);

/* Number of usable CUDA devices (compute capability >= 8.0), 0 when none or no CUDA build.
 * Never fails: a missing driver counts as no device. */
int stats_cuda_device_count(void);

/* Create a context on `device` (sets it current on the calling thread). Fails with STATS_ENOTSUP
 * when the build has no CUDA or the device is older than compute capability 8.0, STATS_EDEVICE
 * when a CUDA call fails. */
stats_status stats_cuda_create(int device, stats_cuda **out, stats_error *err);

void stats_cuda_destroy(stats_cuda *ctx);

/* Choose the implementation (default AUTO). */
void stats_cuda_set_path(stats_cuda *ctx, stats_cuda_path path);

/* Grow the workspace now for problems up to p's size (same shape rules as a run), so that later
 * runs of that size allocate nothing. Tensor pointers in p are not read. */
stats_status stats_cuda_reserve(stats_cuda *ctx, const stats_problem *p, stats_error *err);

/* Name of the kernel a run of p would use, e.g. "mma.sync bf16 d128" or "cuda-core f32". */
const char *stats_cuda_kernel_name(const stats_cuda *ctx, const stats_problem *p);

/* Compute, then wait for the stream and return the per-head statistics on the host.
 *   heads:        host [heads_q] (required)
 *   row_entropy:  optional device [B, Hq, Nq] (packed: [1, Hq, total]) as in stats_cpu()
 *   row_maxlogit: optional device, same shape
 * Synchronizes `stream` before returning (and only that stream). */
stats_status stats_cuda_run(stats_cuda *ctx, const stats_problem *p, void *stream,
                            stats_head *heads, float *row_entropy, float *row_maxlogit,
                            stats_error *err);

/* Same computation, enqueued only: heads_dev is device memory [heads_q] that holds the statistics
 * once the stream reaches this point. Never synchronizes (unless the workspace must grow): a
 * masked run decides between the tensor-core and the CUDA-core kernel on the device. The
 * workspace is the context's: runs on one stream may be enqueued back to back. */
stats_status stats_cuda_run_async(stats_cuda *ctx, const stats_problem *p, void *stream,
                                  stats_head *heads_dev, float *row_entropy, float *row_maxlogit,
                                  stats_error *err);

/* stats_cuda_run without its synchronisation: the per-head statistics are copied to heads_host
 * (pinned host memory, [heads_q]) once the stream reaches this point. The caller synchronizes the
 * stream (or an event recorded after this call) before it reads heads_host or lets go of the
 * tensors; runs on one stream may be enqueued back to back, each into its own heads_host.
 * maxlogit_dev: optional device memory [heads_q] (float64) on the context's device that each
 * head's max_logit is folded into as well, on the stream: the larger of the two (NaN there counts
 * as none), so that it holds the largest of every run since its owner set it to NaN (a consumer
 * on the device reads it without the host: local mode's QK-Clip). */
stats_status stats_cuda_run_to(stats_cuda *ctx, const stats_problem *p, void *stream,
                               stats_head *heads_host, double *maxlogit_dev, float *row_entropy,
                               float *row_maxlogit, stats_error *err);

#ifdef __cplusplus
}
#endif

#endif /* ATTNSTAT_STATS_CUDA_H */
