/* devices.c — the worker pool, its CPU workers and the GPU workers (see devices.h). Stage: beside
 * the flow; calls worker, gpu_worker and log. */
#include "devices.h"

#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <strings.h>

#include "log.h"
#include "util.h"

struct devices {
    const cfg *cfg;
    worker_pool *pool;
    worker *cpu[DEVICES_MAX_CPU];
    int ncpu;
    gpu_devinfo gpus[GPU_MAX_LOCAL]; /* local devices, found at start-up */
    int ngpus;
    char gpu_why[256];               /* why there are none */
    worker *gpu_w[GPU_MAX_LOCAL];    /* a device's worker, started when a client first names it */
    gpu_ctx *gpu_c[GPU_MAX_LOCAL];
    int closed;
};

devices *devices_new(uv_loop_t *loop, const cfg *c, worker_done_fn done, void *data, char *err,
                     size_t errlen)
{
    devices *d = calloc(1, sizeof *d);
    if (!d) {
        util_err(err, errlen, "out of memory");
        return NULL;
    }
    d->cfg = c;
    d->pool = worker_pool_create(loop, done, data, err, errlen);
    if (!d->pool) {
        free(d);
        return NULL;
    }
    int ncpu = (int)c->cpu_workers;
    if (ncpu == 0) {
        cpu_set_t set;
        ncpu = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : 1;
    }
    if (ncpu < 1)
        ncpu = 1;
    if (ncpu > DEVICES_MAX_CPU)
        ncpu = DEVICES_MAX_CPU;
    for (int i = 0; i < ncpu; i++) {
        char name[16];
        if (i == 0)
            snprintf(name, sizeof name, "cpu");
        else
            snprintf(name, sizeof name, "cpu%d", i);
        d->cpu[i] = worker_pool_add(d->pool, name, (uint32_t)c->queue_depth, NULL, NULL, err, errlen);
        if (!d->cpu[i]) {
            worker_pool_close(d->pool); /* the pool frees itself (and its workers) in its close callback */
            free(d);
            return NULL;
        }
        worker_set_work_cap(d->cpu[i], c->queue_work);
        d->ncpu++;
    }
    LOG_INFO("server", "%d CPU worker%s (cpu_workers %s)", d->ncpu, d->ncpu == 1 ? "" : "s",
             c->cpu_workers ? "set" : "0: one per CPU");
    d->ngpus = gpu_enumerate(d->gpus, GPU_MAX_LOCAL, d->gpu_why, sizeof d->gpu_why);
    if (d->ngpus == 0)
        LOG_INFO("gpu", "no GPU workers: %s; CUDA_IPC buffers are refused (host tensors work)",
                 d->gpu_why);
    for (int i = 0; i < d->ngpus; i++)
        LOG_INFO("gpu", "device %d: %s, compute capability %d.%d, %s", d->gpus[i].ordinal,
                 d->gpus[i].name, d->gpus[i].cc_major, d->gpus[i].cc_minor, d->gpus[i].uuid);
    return d;
}

worker_pool *devices_pool(devices *d)
{
    return d->pool;
}

worker *devices_cpu(devices *d, int64_t run_id, uint32_t layer)
{
    uint64_t h = (uint64_t)run_id * 0x9E3779B97F4A7C15ull ^ (uint64_t)layer * 0xC2B2AE3D27D4EB4Full;
    h ^= h >> 29;
    return d->cpu[h % (uint64_t)d->ncpu];
}

int devices_ncpu(const devices *d)
{
    return d->ncpu;
}

int devices_count(const devices *d)
{
    return d->ngpus;
}

const gpu_devinfo *devices_info(const devices *d, int idx)
{
    return idx >= 0 && idx < d->ngpus ? &d->gpus[idx] : NULL;
}

const char *devices_why(const devices *d)
{
    return d->gpu_why;
}

int devices_find(const devices *d, const char *uuid)
{
    if (!uuid)
        return -1;
    for (int i = 0; i < d->ngpus; i++)
        if (strcasecmp(d->gpus[i].uuid, uuid) == 0)
            return i;
    return -1;
}

worker *devices_gpu_running(devices *d, int idx)
{
    return idx >= 0 && idx < d->ngpus ? d->gpu_w[idx] : NULL;
}

gpu_ctx *devices_gpu_ctx(devices *d, int idx)
{
    return idx >= 0 && idx < d->ngpus ? d->gpu_c[idx] : NULL;
}

worker *devices_gpu_worker(devices *d, int idx, char *err, size_t errlen)
{
    if (idx < 0 || idx >= d->ngpus) {
        util_err(err, errlen, "no such local device");
        return NULL;
    }
    if (d->gpu_w[idx])
        return d->gpu_w[idx];
    const gpu_devinfo *info = &d->gpus[idx];
    gpu_ctx *g = gpu_ctx_new(info->ordinal, info->uuid);
    if (!g) {
        util_err(err, errlen, "out of memory for the worker of %s", info->uuid);
        return NULL;
    }
    char werr[256];
    worker *w = worker_pool_add(d->pool, info->uuid, (uint32_t)d->cfg->queue_depth, gpu_compute, g,
                                werr, sizeof werr);
    if (!w) {
        free(g);
        util_err(err, errlen, "cannot start the worker of %s: %s", info->uuid, werr);
        return NULL;
    }
    gpu_ctx_set_worker(g, w);
    worker_set_finish(w, gpu_finish);
    if (worker_run_on(w, gpu_ctx_start, g) != 0)
        LOG_ERROR("gpu", "cannot start the CUDA set-up of %s", info->uuid);
    d->gpu_w[idx] = w;
    d->gpu_c[idx] = g;
    LOG_INFO("gpu", "serving device %d (%s, %s), queue %llu", info->ordinal, info->name, info->uuid,
             (unsigned long long)d->cfg->queue_depth);
    return w;
}

void devices_close(devices *d)
{
    if (d->closed)
        return;
    d->closed = 1;
    for (int i = 0; i < d->ngpus; i++)
        if (d->gpu_w[i] && worker_run_on(d->gpu_w[i], gpu_ctx_stop, d->gpu_c[i]) != 0)
            LOG_WARN("gpu", "cannot stop the CUDA context of %s cleanly", d->gpus[i].uuid);
    worker_pool_close(d->pool); /* delivers whatever finished */
    for (int i = 0; i < d->ngpus; i++) {
        if (d->gpu_c[i] && worker_ctx_abandoned(d->gpu_c[i]))
            LOG_ERROR("gpu", "the worker of %s was left computing: its context is kept",
                      d->gpus[i].uuid);
        else
            free(d->gpu_c[i]);
        d->gpu_c[i] = NULL;
        d->gpu_w[i] = NULL;
    }
}

void devices_free(devices *d)
{
    free(d);
}
