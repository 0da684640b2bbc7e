/* devices.h — where pushes are computed: the worker pool with its CPU workers, and the local GPUs
 * (found at start-up), each with a worker started when a client first names the device. Stage:
 * beside the flow (the push picks its worker here; the loop owns it); calls worker, gpu_worker and
 * log. Loop thread only. */
#ifndef ATTNSTAT_DEVICES_H
#define ATTNSTAT_DEVICES_H

#include <stddef.h>
#include <uv.h>

#include "config.h"
#include "gpu_worker.h"
#include "worker.h"

typedef struct devices devices;

/* The pool on loop (finished jobs go to done(data, job) on the loop thread), its CPU worker, and
 * the local GPUs (logged). NULL with err set when the pool or the CPU worker cannot start (then
 * nothing is left to close). */
devices *devices_new(uv_loop_t *loop, const cfg *c, worker_done_fn done, void *data, char *err,
                     size_t errlen);

#define DEVICES_MAX_CPU 32 /* CPU workers at most */

worker_pool *devices_pool(devices *d);
/* The CPU worker of a push of (run_id, layer): one of the pool's cpu_workers threads (one per CPU
 * this process may run on by default), always the same for a (run, layer), so that a layer's steps
 * are computed, stored and alerted on in order while other layers and runs use the other cores. */
worker *devices_cpu(devices *d, int64_t run_id, uint32_t layer);
/* How many CPU workers there are. */
int devices_ncpu(const devices *d);

/* Local GPUs usable by the kernels: how many, each one's description, and why there are none. */
int devices_count(const devices *d);
const gpu_devinfo *devices_info(const devices *d, int idx);
const char *devices_why(const devices *d);
/* The index of the local device with this UUID (case-insensitive), or -1. */
int devices_find(const devices *d, const char *uuid);
/* The worker of device idx, started now when it has none. NULL with err set on failure. */
worker *devices_gpu_worker(devices *d, int idx, char *err, size_t errlen);
/* The worker of device idx when it was started, else NULL. */
worker *devices_gpu_running(devices *d, int idx);
/* The compute context of device idx (NULL until its worker was started). */
gpu_ctx *devices_gpu_ctx(devices *d, int idx);

/* Shutdown: stops the GPU contexts on their threads, closes the pool (queued jobs come back
 * uncomputed, finished ones go to done) and frees the contexts no thread was left using. Once. */
void devices_close(devices *d);
/* Frees d (after devices_close, once the loop has run the pool's close callback). */
void devices_free(devices *d);

#endif /* ATTNSTAT_DEVICES_H */
