/* gpu_worker.c — GPU workers (see gpu_worker.h). Stage: gpu worker; calls worker (worker_run_on),
 * validate (the real-size check), util and log, and the CUDA runtime and kernels.
 *
 * IPC mappings are held only while a push needs them. A client's registration (the handle bytes and
 * the registered size) lives as long as the client keeps it, but the mapping that
 * cudaIpcOpenMemHandle creates is closed as soon as no push references the buffer: the exporter's
 * cudaFree does not return the memory to the device while another process still has it mapped, so
 * a mapping kept open between pushes would pin memory the trainer freed (PyTorch's empty_cache()
 * and its OOM-retry would then fail because of us). The trade-off: a push that names a closed
 * buffer reopens it (about 0.1 ms, plus cuMemGetAddressRange, on this worker thread, never on the
 * trainer's), and the real-size check runs on each open, so a buffer that the exporter freed and
 * reallocated smaller is refused rather than read out of bounds.
 *
 * Who holds a mapping: `pending` counts the pushes submitted to the worker that name the buffer
 * (incremented on the loop thread before worker_submit, decremented by the worker when it is done
 * with the push, or by the loop thread for a push the worker never computed). Whoever brings it to
 * zero closes the mapping: the worker directly (after its stream has finished reading), the loop
 * thread by posting a close to the worker, which closes only if no push came in meanwhile. */
#include "gpu_worker.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "log.h"
#include "util.h"
#include "validate.h"

#ifdef ATTNSTAT_HAVE_CUDA
#include <cuda.h>
#include <cuda_runtime_api.h>

#include "stats_cuda.h"

#define GPU_EVENT_WAIT_NS (30ull * 1000000000ull) /* a client's stream that never gets there */

typedef CUresult (*gpu_addr_range_fn)(CUdeviceptr *base, size_t *size, CUdeviceptr ptr);
static gpu_addr_range_fn gpu_addr_range; /* set once by gpu_enumerate, before any worker */

struct gpu_ctx {
    int ordinal;
    char uuid[48];
    worker *w;
    /* worker thread only */
    int ready;
    char err[400];
    stats_cuda *sc;
    cudaStream_t stream;
    int32_t *cu_dev;          /* packed offsets, device copy */
    size_t cu_cap;            /* int32 entries */
    /* Pipelined jobs: each pending job's per-head statistics land in its slot of this pinned
     * arena; the arena is reset when none is pending and grows only then. */
    stats_head *pin;
    size_t pin_cap, pin_used;  /* heads */
    int npend;                 /* jobs left pending (gpu_finish completes them) */
};

struct gpu_mem {
    gpu_ctx *g;
    int refs;                 /* loop thread */
    int pending;              /* atomic: submitted pushes naming it that the worker is not done with */
    int tasks;                /* atomic: idle closes posted to the worker and not yet run */
    uint8_t handle[GPU_IPC_HANDLE_BYTES];
    uint64_t size;            /* registered */
    /* worker thread */
    void *ptr;                /* opened mapping, NULL while no push needs it */
    uint64_t real;            /* the allocation's size from the opened pointer */
    uint64_t opens;           /* how many times it was opened (logged at close) */
    char err[300];
};

struct gpu_event {
    gpu_ctx *g;
    int refs;
    uint8_t handle[GPU_IPC_HANDLE_BYTES];
    cudaEvent_t ev;
    int opened, failed;
    char err[300];
};

int gpu_enumerate(gpu_devinfo *out, int max, char *why, size_t whylen)
{
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        /* The runtime says "driver too old" when there is no driver at all: tell them apart by
         * the kernel module's version file, which every NVIDIA driver has. */
        char ver[160] = "";
        FILE *f = fopen("/proc/driver/nvidia/version", "r");
        if (f) {
            if (!fgets(ver, sizeof ver, f))
                ver[0] = '\0';
            fclose(f);
            ver[strcspn(ver, "\n")] = '\0';
        }
        if (!f)
            snprintf(why, whylen, "no NVIDIA driver on this host (no /proc/driver/nvidia/version; "
                     "cudaGetDeviceCount: %s)", cudaGetErrorString(e));
        else if (e == cudaErrorInsufficientDriver)
            snprintf(why, whylen, "the NVIDIA driver is older than this build's CUDA runtime "
                     "needs: update the driver (%.100s)", ver);
        else if (e == cudaErrorNoDevice)
            snprintf(why, whylen, "the NVIDIA driver sees no GPU (%.100s)", ver);
        else
            snprintf(why, whylen, "no usable CUDA device (cudaGetDeviceCount: %s; %.100s)",
                     cudaGetErrorString(e), ver);
        return 0;
    }
    void *fn = NULL;
    enum cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
    e = cudaGetDriverEntryPointByVersion("cuMemGetAddressRange", &fn, 12000, cudaEnableDefault, &q);
    if (e != cudaSuccess || q != cudaDriverEntryPointSuccess || !fn) {
        snprintf(why, whylen, "the CUDA driver's cuMemGetAddressRange is not available (%s, query "
                 "result %d): update the NVIDIA driver", cudaGetErrorString(e), (int)q);
        return 0;
    }
    gpu_addr_range = (gpu_addr_range_fn)fn;
    int k = 0;
    for (int i = 0; i < n && k < max; i++) {
        struct cudaDeviceProp prop;
        e = cudaGetDeviceProperties(&prop, i);
        if (e != cudaSuccess) {
            LOG_WARN("gpu", "device %d: cudaGetDeviceProperties: %s (skipped)", i,
                     cudaGetErrorString(e));
            continue;
        }
        const unsigned char *u = (const unsigned char *)prop.uuid.bytes;
        gpu_devinfo *d = &out[k];
        d->ordinal = i;
        snprintf(d->uuid, sizeof d->uuid,
                 "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", u[0],
                 u[1], u[2], u[3], u[4], u[5], u[6], u[7], u[8], u[9], u[10], u[11], u[12], u[13],
                 u[14], u[15]);
        snprintf(d->name, sizeof d->name, "%s", prop.name);
        d->cc_major = prop.major;
        d->cc_minor = prop.minor;
        if (prop.major < 8) {
            LOG_WARN("gpu", "device %d (%s, %s) has compute capability %d.%d; the kernels need 8.0: "
                     "not served", i, d->name, d->uuid, prop.major, prop.minor);
            continue;
        }
        k++;
    }
    if (k == 0)
        snprintf(why, whylen, "no CUDA device of compute capability 8.0 or newer");
    return k;
}

gpu_ctx *gpu_ctx_new(int ordinal, const char *uuid)
{
    gpu_ctx *g = calloc(1, sizeof *g);
    if (!g)
        return NULL;
    g->ordinal = ordinal;
    snprintf(g->uuid, sizeof g->uuid, "%s", uuid);
    snprintf(g->err, sizeof g->err, "the worker of %s is still starting", uuid);
    return g;
}

void gpu_ctx_set_worker(gpu_ctx *g, worker *w)
{
    g->w = w;
}

void gpu_ctx_start(void *arg)
{
    gpu_ctx *g = arg;
    cudaError_t e = cudaSetDevice(g->ordinal);
    if (e != cudaSuccess) {
        snprintf(g->err, sizeof g->err, "cudaSetDevice(%d) for %s: %s", g->ordinal, g->uuid,
                 cudaGetErrorString(e));
        LOG_ERROR("gpu", "%s", g->err);
        return;
    }
    stats_error se;
    if (stats_cuda_create(g->ordinal, &g->sc, &se) != STATS_OK) {
        snprintf(g->err, sizeof g->err, "CUDA statistics context on %s: %s", g->uuid, se.msg);
        LOG_ERROR("gpu", "%s", g->err);
        return;
    }
    int least = 0, greatest = 0;
    e = cudaDeviceGetStreamPriorityRange(&least, &greatest);
    if (e == cudaSuccess)
        e = cudaStreamCreateWithPriority(&g->stream, cudaStreamNonBlocking, least);
    if (e != cudaSuccess) {
        snprintf(g->err, sizeof g->err, "low-priority stream on %s: %s", g->uuid,
                 cudaGetErrorString(e));
        LOG_ERROR("gpu", "%s", g->err);
        stats_cuda_destroy(g->sc);
        g->sc = NULL;
        return;
    }
    g->ready = 1;
    g->err[0] = '\0';
    LOG_INFO("gpu", "worker for device %d (%s) ready: stream priority %d, the lowest (range %d..%d; "
             "CUDA's default priority is also the lowest)", g->ordinal, g->uuid, least, least,
             greatest);
}

void gpu_ctx_stop(void *arg)
{
    gpu_ctx *g = arg;
    if (!g->ready)
        return;
    g->ready = 0;
    snprintf(g->err, sizeof g->err, "the worker of %s has stopped", g->uuid);
    cudaError_t e = g->pin ? cudaFreeHost(g->pin) : cudaSuccess; /* nothing is pending: a task */
    if (e != cudaSuccess)
        LOG_WARN("gpu", "cudaFreeHost of the result slots on %s: %s", g->uuid, cudaGetErrorString(e));
    g->pin = NULL;
    g->pin_cap = g->pin_used = 0;
    e = g->cu_dev ? cudaFree(g->cu_dev) : cudaSuccess;
    if (e != cudaSuccess)
        LOG_WARN("gpu", "cudaFree of the packed offsets on %s: %s", g->uuid, cudaGetErrorString(e));
    g->cu_dev = NULL;
    g->cu_cap = 0;
    e = cudaStreamDestroy(g->stream);
    if (e != cudaSuccess)
        LOG_WARN("gpu", "cudaStreamDestroy on %s: %s", g->uuid, cudaGetErrorString(e));
    stats_cuda_destroy(g->sc);
    g->sc = NULL;
}

/* ---- client objects (refs on the loop thread, CUDA calls on the worker thread) ---------------- */
gpu_mem *gpu_mem_new(gpu_ctx *g, const uint8_t *handle, uint64_t size)
{
    gpu_mem *m = calloc(1, sizeof *m);
    if (!m)
        return NULL;
    m->g = g;
    m->refs = 1;
    memcpy(m->handle, handle, GPU_IPC_HANDLE_BYTES);
    m->size = size;
    return m;
}

gpu_ctx *gpu_mem_ctx(const gpu_mem *m)
{
    return m->g;
}

gpu_ctx *gpu_event_ctx(const gpu_event *e)
{
    return e->g;
}

void gpu_mem_ref(gpu_mem *m)
{
    m->refs++;
}

/* Worker thread: closes the mapping (the buffer stays registered). The caller made sure that the
 * worker's stream no longer reads it. */
static void gpu_mem_unmap(gpu_mem *m)
{
    if (!m->ptr)
        return;
    cudaError_t e = cudaIpcCloseMemHandle(m->ptr);
    if (e != cudaSuccess)
        LOG_WARN("gpu", "cudaIpcCloseMemHandle on %s: %s (the exporter's memory may stay "
                 "allocated until the daemon exits)", m->g->uuid, cudaGetErrorString(e));
    else
        LOG_DEBUG("gpu", "closed an IPC allocation of %llu bytes on %s (opened %llu times)",
                  (unsigned long long)m->real, m->g->uuid, (unsigned long long)m->opens);
    m->ptr = NULL;
}

static void gpu_mem_close(void *arg)
{
    gpu_mem *m = arg;
    gpu_mem_unmap(m);
    free(m);
}

/* Worker thread, posted by the loop thread when a push the worker never computed was the last to
 * name the buffer. A push submitted since keeps it open (it will close it when done). */
static void gpu_mem_idle_task(void *arg)
{
    gpu_mem *m = arg;
    if (__atomic_load_n(&m->pending, __ATOMIC_ACQUIRE) == 0)
        gpu_mem_unmap(m);
    __atomic_sub_fetch(&m->tasks, 1, __ATOMIC_RELEASE); /* m may be freed from here on */
}

void gpu_mem_unref(gpu_mem *m)
{
    if (--m->refs > 0)
        return;
    /* No push holds it (pushes hold references), so only an idle close still queued can touch it. */
    int tasks = __atomic_load_n(&m->tasks, __ATOMIC_ACQUIRE);
    if (!m->ptr && tasks == 0) {
        free(m); /* not mapped: nothing of CUDA's to close */
        return;
    }
    /* Closed and freed on the device's worker thread, after the tasks posted before (an idle close
     * of this buffer included). Refused only once the worker is stopping (the process is ending:
     * the mapping goes with it) or on no memory: then the mapping stays open, and that is said. */
    if (worker_run_on(m->g->w, gpu_mem_close, m) != 0) {
        if (tasks == 0) {
            LOG_WARN("gpu", "an IPC allocation of %llu bytes on %s is left mapped (its worker is "
                     "stopping, or memory ran out)", (unsigned long long)m->real, m->g->uuid);
            free(m);
        } else {
            /* An idle close queued on the worker still names it: it may not be freed here. */
            LOG_WARN("gpu", "an IPC buffer on %s is left to its worker's queued close (its worker "
                     "is stopping, or memory ran out)", m->g->uuid);
        }
    }
}

void gpu_refs_hold(gpu_refs *r)
{
    for (int i = 0; i < r->n; i++) {
        __atomic_add_fetch(&r->mem[i]->pending, 1, __ATOMIC_ACQ_REL);
        r->held[i] = 1;
    }
}

void gpu_refs_drop(gpu_refs *r)
{
    for (int i = 0; i < r->n; i++) {
        if (!r->held[i])
            continue;
        r->held[i] = 0;
        gpu_mem *m = r->mem[i];
        if (__atomic_sub_fetch(&m->pending, 1, __ATOMIC_ACQ_REL) != 0)
            continue;
        /* The worker may have kept it mapped for this push: have it closed there. */
        __atomic_add_fetch(&m->tasks, 1, __ATOMIC_ACQ_REL);
        if (worker_run_on(m->g->w, gpu_mem_idle_task, m) != 0) {
            __atomic_sub_fetch(&m->tasks, 1, __ATOMIC_ACQ_REL);
            LOG_DEBUG("gpu", "an idle IPC buffer on %s stays mapped until it is forgotten (its "
                      "worker is stopping, or memory ran out)", m->g->uuid);
        }
    }
}

gpu_event *gpu_event_new(gpu_ctx *g, const uint8_t *handle)
{
    gpu_event *e = calloc(1, sizeof *e);
    if (!e)
        return NULL;
    e->g = g;
    e->refs = 1;
    memcpy(e->handle, handle, GPU_IPC_HANDLE_BYTES);
    return e;
}

void gpu_event_ref(gpu_event *e)
{
    e->refs++;
}

static void gpu_event_close(void *arg)
{
    gpu_event *e = arg;
    if (e->opened) {
        cudaError_t r = cudaEventDestroy(e->ev);
        if (r != cudaSuccess)
            LOG_WARN("gpu", "cudaEventDestroy of an IPC event on %s: %s", e->g->uuid,
                     cudaGetErrorString(r));
    }
    free(e);
}

void gpu_event_unref(gpu_event *e)
{
    if (--e->refs > 0)
        return;
    if (!e->opened) {
        free(e);
        return;
    }
    if (worker_run_on(e->g->w, gpu_event_close, e) != 0) {
        LOG_WARN("gpu", "an IPC event on %s is left open (its worker is stopping, or memory ran "
                 "out)", e->g->uuid);
        free(e);
    }
}

/* ---- the compute function --------------------------------------------------------------------- */
/* Fails job: its message, its Ack code; evaluates to the status st. */
#define JOB_FAIL(job, code, st, ...)                                                               \
    (util_err((job)->err.msg, sizeof(job)->err.msg, __VA_ARGS__), (job)->fail_code = (code), (st))

static int gpu_mem_open(gpu_mem *m)
{
    if (m->ptr)
        return 0;
    /* A failure is not remembered: the next push that names the buffer tries again. */
    cudaIpcMemHandle_t h;
    memcpy(h.reserved, m->handle, sizeof h.reserved);
    cudaError_t e = cudaIpcOpenMemHandle(&m->ptr, h, cudaIpcMemLazyEnablePeerAccess);
    if (e != cudaSuccess) {
        m->ptr = NULL;
        snprintf(m->err, sizeof m->err, "cudaIpcOpenMemHandle on %s: %s (was the buffer exported "
                 "on this device, by a live process?)", m->g->uuid, cudaGetErrorString(e));
        return -1;
    }
    CUdeviceptr base = 0;
    size_t size = 0;
    CUresult r = gpu_addr_range(&base, &size, (CUdeviceptr)(uintptr_t)m->ptr);
    if (r != CUDA_SUCCESS || (uintptr_t)base != (uintptr_t)m->ptr) {
        cudaError_t ce = cudaIpcCloseMemHandle(m->ptr);
        if (ce != cudaSuccess)
            LOG_WARN("gpu", "cudaIpcCloseMemHandle on %s: %s", m->g->uuid, cudaGetErrorString(ce));
        m->ptr = NULL;
        snprintf(m->err, sizeof m->err, "cuMemGetAddressRange of an opened IPC allocation on %s "
                 "failed (CUDA error %d)", m->g->uuid, (int)r);
        return -1;
    }
    m->real = size;
    m->opens++;
    return 0;
}

static int gpu_event_open(gpu_event *e)
{
    if (e->opened)
        return 0;
    if (e->failed)
        return -1;
    cudaIpcEventHandle_t h;
    memcpy(h.reserved, e->handle, sizeof h.reserved);
    cudaError_t r = cudaIpcOpenEventHandle(&e->ev, h);
    if (r != cudaSuccess) {
        e->failed = 1;
        snprintf(e->err, sizeof e->err, "cudaIpcOpenEventHandle on %s: %s", e->g->uuid,
                 cudaGetErrorString(r));
        return -1;
    }
    e->opened = 1;
    return 0;
}

/* Waits on the host until the client's stream passed the event (bounded; gives up when the client
 * disconnects), then orders the worker's stream after it. */
static stats_status gpu_wait_event(gpu_ctx *g, gpu_event *ev, const int *gone, worker_job *job)
{
    uint64_t t0 = util_mono_ns();
    long sleep_ns = 2000;
    for (;;) {
        cudaError_t e = cudaEventQuery(ev->ev);
        if (e == cudaSuccess)
            break;
        if (e != cudaErrorNotReady)
            return JOB_FAIL(job, ATTNSTAT__CODE__INTERNAL, STATS_EDEVICE,
                            "waiting for the client's event: %s", cudaGetErrorString(e));
        if (gone && __atomic_load_n(gone, __ATOMIC_ACQUIRE))
            return JOB_FAIL(job, ATTNSTAT__CODE__INTERNAL, STATS_EDEVICE,
                            "the client disconnected before its stream reached the push's event");
        if (util_mono_ns() - t0 > GPU_EVENT_WAIT_NS)
            return JOB_FAIL(job, ATTNSTAT__CODE__INTERNAL, STATS_EDEVICE,
                            "the client's stream did not reach the push's event within %llu s",
                            GPU_EVENT_WAIT_NS / 1000000000ull);
        struct timespec ts = {0, sleep_ns};
        nanosleep(&ts, NULL);
        if (sleep_ns < 500000)
            sleep_ns *= 2;
    }
    cudaError_t e = cudaStreamWaitEvent(g->stream, ev->ev, 0);
    if (e != cudaSuccess)
        return JOB_FAIL(job, ATTNSTAT__CODE__INTERNAL, STATS_EDEVICE, "cudaStreamWaitEvent: %s",
                        cudaGetErrorString(e));
    return STATS_OK;
}

/* A pinned slot of n heads for a pipelined job, NULL when none is free (the job then runs
 * synchronously). The arena grows only while no job is pending (their copies target it). */
static stats_head *gpu_pin_slot(gpu_ctx *g, size_t n)
{
    if (g->pin_used + n > g->pin_cap) {
        if (g->npend)
            return NULL;
        size_t want = n * 32 > 4096 ? n * 32 : 4096;
        if (g->pin) {
            cudaError_t e = cudaFreeHost(g->pin);
            if (e != cudaSuccess)
                LOG_WARN("gpu", "cudaFreeHost of the result slots on %s: %s", g->uuid,
                         cudaGetErrorString(e));
        }
        g->pin = NULL;
        g->pin_cap = g->pin_used = 0;
        cudaError_t e = cudaMallocHost((void **)&g->pin, want * sizeof *g->pin);
        if (e != cudaSuccess) {
            LOG_WARN("gpu", "cudaMallocHost of %zu result slots on %s: %s (pushes run one at a "
                     "time)", want, g->uuid, cudaGetErrorString(e));
            (void)cudaGetLastError();
            g->pin = NULL;
            return NULL;
        }
        g->pin_cap = want;
    }
    stats_head *slot = g->pin + g->pin_used;
    g->pin_used += n;
    return slot;
}

static stats_status gpu_compute_job(gpu_ctx *g, worker_job *job)
{
    gpu_refs *r = job->ext;
    if (!g->ready)
        return JOB_FAIL(job, ATTNSTAT__CODE__INTERNAL, STATS_EDEVICE, "%s", g->err);
    const void *ptr[GPU_JOB_TENSORS] = {NULL};
    for (int i = 0; i < r->n; i++) {
        const char *name = i == 0 ? "q" : i == 1 ? "k" : i == r->mask_index ? "mask"
                           : i == r->cu_index ? "cu_seqlens_q_ref"
                           : r->cu_index >= 0 && i == r->cu_index + 1 ? "cu_seqlens_k_ref"
                           : i == r->sinks_index ? "sinks" : "v";
        gpu_mem *m = r->mem[i];
        if (gpu_mem_open(m) != 0)
            return JOB_FAIL(job, ATTNSTAT__CODE__BAD_REQUEST, STATS_EINVAL, "%s: %s", name,
                            m->err);
        char msg[256];
        if (validate_device_span(name, r->need[i], m->size, m->real, msg, sizeof msg) !=
            ATTNSTAT__CODE__OK)
            return JOB_FAIL(job, ATTNSTAT__CODE__OUT_OF_BOUNDS, STATS_EINVAL, "%s", msg);
        ptr[i] = (const char *)m->ptr + r->off[i];
    }
    stats_problem p = job->prob;
    p.q.ptr = ptr[0];
    p.k.ptr = ptr[1];
    if (r->mask_index >= 0)
        p.mask.ptr = ptr[r->mask_index];
    if (r->sinks_index >= 0)
        p.sinks = ptr[r->sinks_index];
    if (r->cu_index >= 0) { /* the offsets are on the device already */
        p.cu_seqlens_q = (const int32_t *)ptr[r->cu_index];
        p.cu_seqlens_k = (const int32_t *)ptr[r->cu_index + 1];
    } else if (p.cu_seqlens_q) {
        size_t n = (size_t)p.batch + 1;
        if (g->cu_cap < 2 * n) {
            if (g->cu_dev) {
                cudaError_t fe = cudaFree(g->cu_dev);
                if (fe != cudaSuccess)
                    LOG_WARN("gpu", "cudaFree of the packed offsets on %s: %s", g->uuid,
                             cudaGetErrorString(fe));
            }
            g->cu_dev = NULL;
            g->cu_cap = 0;
            cudaError_t e = cudaMalloc((void **)&g->cu_dev, 2 * n * sizeof(int32_t));
            if (e != cudaSuccess)
                return JOB_FAIL(job, ATTNSTAT__CODE__INTERNAL, STATS_EDEVICE,
                                "cudaMalloc for packed offsets: %s", cudaGetErrorString(e));
            g->cu_cap = 2 * n;
        }
        cudaError_t e = cudaMemcpyAsync(g->cu_dev, p.cu_seqlens_q, n * sizeof(int32_t),
                                        cudaMemcpyHostToDevice, g->stream);
        if (e == cudaSuccess)
            e = cudaMemcpyAsync(g->cu_dev + n, p.cu_seqlens_k, n * sizeof(int32_t),
                                cudaMemcpyHostToDevice, g->stream);
        if (e != cudaSuccess)
            return JOB_FAIL(job, ATTNSTAT__CODE__INTERNAL, STATS_EDEVICE,
                            "copying packed offsets to the device: %s", cudaGetErrorString(e));
        p.cu_seqlens_q = g->cu_dev;
        p.cu_seqlens_k = g->cu_dev + n;
    }
    if (r->ev) {
        if (gpu_event_open(r->ev) != 0)
            return JOB_FAIL(job, ATTNSTAT__CODE__BAD_REQUEST, STATS_EINVAL, "%s", r->ev->err);
        stats_status st = gpu_wait_event(g, r->ev, r->client_gone, job);
        if (st != STATS_OK)
            return st;
    }
    /* Enqueued into a pinned slot and left pending (gpu_finish), so that the worker enqueues the
     * pushes queued behind this one before it is done: the device runs them back to back, with no
     * round trip to this thread between them (measured in bench/RESULTS.md, "Overhead on a real
     * model"); synchronously when no slot is free. */
    stats_head *slot = gpu_pin_slot(g, (size_t)p.heads_q);
    stats_status st = slot ? stats_cuda_run_to(g->sc, &p, g->stream, slot, NULL, NULL, NULL, &job->err)
                           : stats_cuda_run(g->sc, &p, g->stream, job->heads, NULL, NULL, &job->err);
    if (st != STATS_OK) {
        job->fail_code = st == STATS_EINVAL ? ATTNSTAT__CODE__BAD_REQUEST : ATTNSTAT__CODE__INTERNAL;
        cudaError_t e = cudaGetLastError(); /* clears a sticky-free error for the next job */
        (void)e;
        if (slot)
            g->pin_used -= (size_t)p.heads_q;
        return st;
    }
    if (slot) {
        r->slot = slot;
        job->pending = 1;
        g->npend++;
    }
    return st;
}

/* Worker thread, after every push (computed or failed): the push lets go of its buffers, and one
 * that no other submitted push names is unmapped, once the stream has stopped reading it. */
static void gpu_release_job(gpu_ctx *g, gpu_refs *r)
{
    int synced = 0;
    for (int i = 0; i < r->n; i++) {
        if (!r->held[i])
            continue;
        r->held[i] = 0;
        gpu_mem *m = r->mem[i];
        if (__atomic_sub_fetch(&m->pending, 1, __ATOMIC_ACQ_REL) != 0 || !m->ptr)
            continue;
        if (!synced && g->ready) {
            /* A failed push may have left work queued that reads the mapping. */
            cudaError_t e = cudaStreamSynchronize(g->stream);
            if (e != cudaSuccess) {
                LOG_WARN("gpu", "cudaStreamSynchronize before closing IPC mappings on %s: %s",
                         g->uuid, cudaGetErrorString(e));
                (void)cudaGetLastError();
            }
            synced = 1;
        }
        gpu_mem_unmap(m);
    }
}

stats_status gpu_compute(void *arg, worker_job *job)
{
    gpu_ctx *g = arg;
    stats_status st = gpu_compute_job(g, job);
    if (job->pending)
        return st; /* gpu_finish releases it */
    gpu_release_job(g, job->ext);
    return st;
}

stats_status gpu_finish(void *arg, worker_job *job)
{
    gpu_ctx *g = arg;
    gpu_refs *r = job->ext;
    stats_status st = STATS_OK;
    /* The first of a batch waits for them all; the others find the stream done. */
    cudaError_t e = cudaStreamSynchronize(g->stream);
    if (e != cudaSuccess) {
        st = JOB_FAIL(job, ATTNSTAT__CODE__INTERNAL, STATS_EDEVICE,
                      "stats_cuda on %s: %s (a kernel may have faulted)", g->uuid,
                      cudaGetErrorString(e));
        (void)cudaGetLastError();
    } else {
        memcpy(job->heads, r->slot, sizeof *job->heads * (size_t)job->prob.heads_q);
    }
    r->slot = NULL;
    if (--g->npend == 0)
        g->pin_used = 0;
    gpu_release_job(g, r);
    return st;
}

#else /* no CUDA in this build */

struct gpu_ctx {
    int unused;
};
struct gpu_mem {
    int unused;
};
struct gpu_event {
    int unused;
};

int gpu_enumerate(gpu_devinfo *out, int max, char *why, size_t whylen)
{
    (void)out, (void)max;
    snprintf(why, whylen, "attnstatd was built without CUDA");
    return 0;
}

gpu_ctx *gpu_ctx_new(int ordinal, const char *uuid)
{
    (void)ordinal, (void)uuid;
    return NULL;
}

void gpu_ctx_set_worker(gpu_ctx *g, worker *w)
{
    (void)g, (void)w;
}

void gpu_ctx_start(void *g)
{
    (void)g;
}

void gpu_ctx_stop(void *g)
{
    (void)g;
}

stats_status gpu_compute(void *g, worker_job *job)
{
    (void)g;
    snprintf(job->err.msg, sizeof job->err.msg, "attnstatd was built without CUDA");
    return STATS_ENOTSUP;
}

stats_status gpu_finish(void *g, worker_job *job)
{
    (void)g, (void)job;
    return STATS_ENOTSUP;
}

gpu_mem *gpu_mem_new(gpu_ctx *g, const uint8_t *handle, uint64_t size)
{
    (void)g, (void)handle, (void)size;
    return NULL;
}

void gpu_mem_ref(gpu_mem *m)
{
    (void)m;
}

void gpu_mem_unref(gpu_mem *m)
{
    (void)m;
}

gpu_event *gpu_event_new(gpu_ctx *g, const uint8_t *handle)
{
    (void)g, (void)handle;
    return NULL;
}

void gpu_event_ref(gpu_event *e)
{
    (void)e;
}

void gpu_event_unref(gpu_event *e)
{
    (void)e;
}

void gpu_refs_hold(gpu_refs *r)
{
    (void)r;
}

void gpu_refs_drop(gpu_refs *r)
{
    (void)r;
}

gpu_ctx *gpu_mem_ctx(const gpu_mem *m)
{
    (void)m;
    return NULL;
}

gpu_ctx *gpu_event_ctx(const gpu_event *e)
{
    (void)e;
    return NULL;
}

#endif
