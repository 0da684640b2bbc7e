/* stats_cuda_stub.c — the CUDA backend's API in a build without CUDA: every call says so, so that
 * the daemon and the tests link either way and decide at run time. */
#include "stats_cuda.h"

#include <stdio.h>

static stats_status no_cuda(stats_error *err)
{
    if (err)
        snprintf(err->msg, sizeof err->msg,
                 "attnstat was built without CUDA (no nvcc at configure time, or -DATTNSTAT_CUDA=OFF); "
                 "rebuild with the CUDA toolkit to compute on GPUs, or use the CPU backend");
    return STATS_ENOTSUP;
}

int stats_cuda_built(void)
{
    return 0;
}

int stats_cuda_wg_variant_count(void)
{
    return 0;
}

int stats_cuda_wg_variant_exists(int v)
{
    (void)v;
    return 0;
}

int stats_cuda_wg_variant_default(void)
{
    return 0;
}

int stats_cuda_device_count(void)
{
    return 0;
}

stats_status stats_cuda_create(int device, stats_cuda **out, stats_error *err)
{
    (void)device;
    if (out)
        *out = NULL;
    return no_cuda(err);
}

void stats_cuda_destroy(stats_cuda *ctx)
{
    (void)ctx;
}

void stats_cuda_set_path(stats_cuda *ctx, stats_cuda_path path)
{
    (void)ctx;
    (void)path;
}

stats_status stats_cuda_reserve(stats_cuda *ctx, const stats_problem *p, stats_error *err)
{
    (void)ctx;
    (void)p;
    return no_cuda(err);
}

const char *stats_cuda_kernel_name(const stats_cuda *ctx, const stats_problem *p)
{
    (void)ctx;
    (void)p;
    return "none (no CUDA build)";
}

stats_status stats_cuda_run(stats_cuda *ctx, const stats_problem *p, void *stream, stats_head *heads,
                            float *row_entropy, float *row_maxlogit, stats_error *err)
{
    (void)ctx, (void)p, (void)stream, (void)heads, (void)row_entropy, (void)row_maxlogit;
    return no_cuda(err);
}

stats_status stats_cuda_run_async(stats_cuda *ctx, const stats_problem *p, void *stream,
                                  stats_head *heads_dev, float *row_entropy, float *row_maxlogit,
                                  stats_error *err)
{
    (void)ctx, (void)p, (void)stream, (void)heads_dev, (void)row_entropy, (void)row_maxlogit;
    return no_cuda(err);
}

stats_status stats_cuda_run_to(stats_cuda *ctx, const stats_problem *p, void *stream,
                               stats_head *heads_host, double *maxlogit_dev, float *row_entropy,
                               float *row_maxlogit, stats_error *err)
{
    (void)ctx, (void)p, (void)stream, (void)heads_host, (void)maxlogit_dev, (void)row_entropy,
        (void)row_maxlogit;
    return no_cuda(err);
}
