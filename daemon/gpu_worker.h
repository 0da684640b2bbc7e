/* gpu_worker.h — attnstatd's GPU workers (stage: gpu worker, beside the CPU worker; includes
 * worker.h and kernels/ only; gpu_worker.c calls worker, validate, util and log): one per local device that a client names (by UUID), each a
 * worker of the pool (worker.h) whose compute function runs the CUDA statistics kernel
 * (kernels/stats_cuda.h) on the device's own context and low-priority stream.
 *
 * The CUDA objects of a client — IPC memory handles (gpu_mem) and IPC events (gpu_event) — are
 * created on the loop thread as plain descriptions and opened lazily on the worker thread of their
 * device by the pushes that use them. An IPC memory mapping is closed again on that thread as soon
 * as no submitted push names the buffer (an importer's open mapping keeps the exporter's freed
 * memory allocated on the device), and reopened by the next push that does; the registration
 * stays until the client Forgets it or goes. Events stay open until then.
 *
 * Before the kernel reads a byte, each tensor's span is checked against the opened allocation's
 * real size (cuMemGetAddressRange on the opened pointer, through the runtime's driver entry point),
 * not only against the size the client registered. The worker waits for the push's event on the
 * host with a bound (polling, so a client that dies or stalls cannot hold the device's worker
 * forever), then orders its stream after it.
 *
 * Without CUDA in the build, or without a usable device, gpu_enumerate() finds nothing and the
 * daemon refuses CUDA_IPC buffers with UNSUPPORTED. */
#ifndef ATTNSTAT_GPU_WORKER_H
#define ATTNSTAT_GPU_WORKER_H

#include <stddef.h>
#include <stdint.h>

#include "stats.h"
#include "worker.h"

#define GPU_MAX_LOCAL 16
#define GPU_IPC_HANDLE_BYTES 64
#define GPU_JOB_TENSORS 7 /* the tensors of a push (validate.h VALIDATE_MAX_TENSORS) */

typedef struct {
    int ordinal;
    char uuid[48];           /* "GPU-xxxxxxxx-..." as nvidia-smi prints it */
    char name[256];
    int cc_major, cc_minor;
} gpu_devinfo;

typedef struct gpu_ctx gpu_ctx;      /* a device worker's context (the compute function's wctx) */
typedef struct gpu_mem gpu_mem;
typedef struct gpu_event gpu_event;

/* What a GPU job reads: set by the push (push.c) on the loop thread, read by the worker. */
typedef struct {
    gpu_mem *mem[GPU_JOB_TENSORS]; /* q, k, then v, the mask, the packed offsets, the sinks
                                      (validate_plan's order; a buffer may repeat) */
    uint64_t off[GPU_JOB_TENSORS];  /* byte offset of each tensor in its buffer */
    uint64_t need[GPU_JOB_TENSORS]; /* offset + bytes spanned */
    int n;
    int mask_index;          /* where the mask is in mem[]; -1: none */
    int cu_index;            /* device packed offsets: cu_q there, cu_k next; -1: none */
    int sinks_index;         /* where the attention sinks are in mem[]; -1: none */
    int held[GPU_JOB_TENSORS]; /* the push counts among the pushes that keep mem[i] mapped */
    gpu_event *ev;           /* NULL: no event (the client says its data are ready) */
    const int *client_gone;  /* set (atomically) when the client disconnects */
    stats_head *slot;        /* worker thread: a pending job's pinned result slot */
} gpu_refs;

/* Loop thread. hold: right before worker_submit (the worker lets go when it is done with the
 * push); drop: when the push is freed, for a push the worker never computed (refused or handed
 * back); a buffer no push names any more is then unmapped on its worker. */
void gpu_refs_hold(gpu_refs *r);
void gpu_refs_drop(gpu_refs *r);

/* Local devices usable by the kernels (compute capability >= 8.0), found once at start-up.
 * Returns how many (0 without CUDA or a driver: why says so). */
int gpu_enumerate(gpu_devinfo *out, int max, char *why, size_t whylen);

/* A worker context for device ordinal; its CUDA set-up runs on the worker thread through
 * gpu_ctx_start() (post it with worker_run_on right after adding the worker). */
gpu_ctx *gpu_ctx_new(int ordinal, const char *uuid);
void gpu_ctx_set_worker(gpu_ctx *g, worker *w);
void gpu_ctx_start(void *g);         /* worker thread: device, stats context, low-priority stream */
void gpu_ctx_stop(void *g);          /* worker thread: closes everything; the ctx stays allocated */
stats_status gpu_compute(void *g, worker_job *job);  /* worker_compute_fn; job->ext is gpu_refs */
stats_status gpu_finish(void *g, worker_job *job);   /* worker_finish_fn: a job gpu_compute left
                                                        pending (worker_set_finish) */

/* Loop thread. size: the registered size; handle: GPU_IPC_HANDLE_BYTES bytes. NULL on no memory. */
gpu_mem *gpu_mem_new(gpu_ctx *g, const uint8_t *handle, uint64_t size);
void gpu_mem_ref(gpu_mem *m);
void gpu_mem_unref(gpu_mem *m);      /* the last reference: closed and freed on the worker thread */
gpu_event *gpu_event_new(gpu_ctx *g, const uint8_t *handle);
void gpu_event_ref(gpu_event *e);
void gpu_event_unref(gpu_event *e);
gpu_ctx *gpu_mem_ctx(const gpu_mem *m);
gpu_ctx *gpu_event_ctx(const gpu_event *e);

#endif /* ATTNSTAT_GPU_WORKER_H */
