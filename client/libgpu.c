/* libgpu.c — libattnstat's GPU path (see libgpu.h).
 *
 * Per push, for each CUDA tensor: one cuPointerGetAttributes call (reached through
 * cudaGetDriverEntryPointByVersion, never by linking libcuda) gives the allocation's device,
 * process-wide buffer id, base, size and whether cudaIpcGetMemHandle can share it. A buffer id
 * seen before is found in a small cache of exported allocations (no CUDA call); a new one is
 * exported once (cudaIpcGetMemHandle of the base) and registered with the daemon, and a cached
 * allocation whose address range the new one overlaps is dead (freed and reused): it is forgotten.
 * Allocations that cannot be shared (cuMemMap pools such as PyTorch's expandable_segments) are
 * copied with cudaMemcpyAsync on the caller's stream into this client's staging ring (cudaMalloc,
 * exported once); a full ring drops the push. Then one interprocess event from the device's pool
 * (created and exported in chunks, registered once each) is recorded on the caller's stream; it is
 * reused only once the push that recorded it is released. Nothing here synchronises the device
 * (the one-time cudaMalloc of a staging ring aside) or waits for the daemon. */
#include "libgpu.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef ATTNSTAT_HAVE_CUDA
#include <cuda.h>
#include <cuda_runtime_api.h>

#include "libring.h"

#define GPU_MAX_DEVICES 16
#define GPU_MAX_BUFS 48              /* under the daemon's default max_buffers (64) */
#define GPU_EVENT_CHUNK 16
#define GPU_MAX_EVENTS 1024
#define GPU_BUF_ID0 0x10000u         /* buffer ids: 0x10000.. (the host ring is 1) */
#define GPU_EVENT_ID0 0x20000000u    /* event ids, disjoint from buffer ids (Error refs) */
#define GPU_STAGING_DEFAULT (64ull << 20)
#define GPU_STAGE_ALIGN 256u

typedef CUresult (*gpu_getattrs_fn)(unsigned int n, CUpointer_attribute *attrs, void **data,
                                    CUdeviceptr ptr);

typedef struct {
    unsigned long long cu_id;  /* CU_POINTER_ATTRIBUTE_BUFFER_ID; 0: free entry */
    uintptr_t base;
    uint64_t size;
    uint32_t id;               /* our buffer id */
    int dev;
    int dead;                  /* forgotten: freed once no push references it */
    int staged_only;           /* export failed: stage this allocation's tensors */
    uint32_t inflight;
    uint64_t last_use;
} gpu_buf;

/* A staging block given back while the caller's stream may still be copying into it: freed (and
 * its event returned to the pool) once the event recorded after the copy has completed. */
typedef struct {
    uint64_t seq;
    int32_t event;
} gpu_deferred;

typedef struct {
    int ready, failed;
    char err[256];
    char uuid[48];
    cudaEvent_t *ev;
    uint32_t *ev_id;
    int32_t *free_ev;          /* stack of free pool indices */
    int nev, nfree;
    gpu_deferred *defer;       /* staged blocks whose copy may still be pending (capacity nev) */
    int ndefer;
    void *stage;
    uint64_t stage_bytes;
    ring sring;
    uint32_t stage_id;
    int stage_state;           /* 0: not made, 1: ready, -1: failed (stage_err) */
    char stage_err[256];
} gpu_dev;

struct gpu_state {
    int init;                  /* 0: not tried, 1: ready, -1: no usable CUDA (init_err) */
    char init_err[300];
    gpu_getattrs_fn getattrs;
    int ndev;
    gpu_dev dev[GPU_MAX_DEVICES];
    gpu_buf bufs[GPU_MAX_BUFS];
    int last_hit;
    uint32_t next_buf_id, next_event_id;
    uint64_t clock;
    uint64_t live;
};

int gpu_built(void)
{
    return 1;
}

static attnstat_code gpu_fail(char *err, size_t len, attnstat_code code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static attnstat_code gpu_fail(char *err, size_t len, attnstat_code code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, len, fmt, ap);
    va_end(ap);
    return code;
}

static void gpu_format_uuid(const unsigned char *u, char *buf, size_t len)
{
    snprintf(buf, len,
             "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", u[0], u[1],
             u[2], u[3], u[4], u[5], u[6], u[7], u[8], u[9], u[10], u[11], u[12], u[13], u[14],
             u[15]);
}

attnstat_code gpu_device_uuid(int device, char *buf, size_t len, char *err, size_t errlen)
{
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess)
        return gpu_fail(err, errlen, ATTNSTAT_ENOTSUP,
                        "no usable CUDA device: cudaGetDeviceCount: %s (is the NVIDIA driver "
                        "installed and a GPU visible to this process?)", cudaGetErrorString(e));
    if (device < 0 || device >= n)
        return gpu_fail(err, errlen, ATTNSTAT_EINVAL, "CUDA device %d does not exist (%d visible)",
                        device, n);
    struct cudaDeviceProp prop;
    e = cudaGetDeviceProperties(&prop, device);
    if (e != cudaSuccess)
        return gpu_fail(err, errlen, ATTNSTAT_EIO, "cudaGetDeviceProperties(%d): %s", device,
                        cudaGetErrorString(e));
    if (len < 41)
        return gpu_fail(err, errlen, ATTNSTAT_EINVAL, "UUID buffer of %zu bytes: needs 41", len);
    gpu_format_uuid((const unsigned char *)prop.uuid.bytes, buf, len);
    return ATTNSTAT_OK;
}

gpu_state *gpu_new(void)
{
    gpu_state *g = calloc(1, sizeof *g);
    if (!g)
        return NULL;
    g->next_buf_id = GPU_BUF_ID0;
    g->next_event_id = GPU_EVENT_ID0;
    g->last_hit = -1;
    return g;
}

void gpu_free(gpu_state *g)
{
    if (!g)
        return;
    for (int d = 0; d < GPU_MAX_DEVICES; d++) {
        gpu_dev *v = &g->dev[d];
        for (int i = 0; i < v->nev; i++)
            cudaEventDestroy(v->ev[i]); /* best effort: the process may be exiting */
        if (v->stage)
            cudaFree(v->stage);
        if (v->stage_state == 1)
            ring_destroy(&v->sring);
        free(v->ev);
        free(v->ev_id);
        free(v->free_ev);
        free(v->defer);
    }
    free(g);
}

uint64_t gpu_buffers(const gpu_state *g)
{
    return g ? g->live : 0;
}

/* First CUDA push: the runtime, the device count and the driver entry point. */
static attnstat_code gpu_init(gpu_state *g, char *err, size_t errlen)
{
    if (g->init == 1)
        return ATTNSTAT_OK;
    if (g->init < 0)
        return gpu_fail(err, errlen, ATTNSTAT_ENOTSUP, "%s", g->init_err);
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n == 0) {
        snprintf(g->init_err, sizeof g->init_err,
                 "CUDA tensors cannot be pushed: no usable CUDA device (cudaGetDeviceCount: %s; is "
                 "the NVIDIA driver installed and a GPU visible to this process?)",
                 e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
        g->init = -1;
        return gpu_fail(err, errlen, ATTNSTAT_ENOTSUP, "%s", g->init_err);
    }
    void *fn = NULL;
    enum cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
    e = cudaGetDriverEntryPointByVersion("cuPointerGetAttributes", &fn, 12000, cudaEnableDefault,
                                         &q);
    if (e != cudaSuccess || q != cudaDriverEntryPointSuccess || !fn) {
        snprintf(g->init_err, sizeof g->init_err,
                 "CUDA tensors cannot be pushed: the driver's cuPointerGetAttributes is not "
                 "available (%s, query result %d): update the NVIDIA driver",
                 cudaGetErrorString(e), (int)q);
        g->init = -1;
        return gpu_fail(err, errlen, ATTNSTAT_ENOTSUP, "%s", g->init_err);
    }
    g->getattrs = (gpu_getattrs_fn)fn;
    g->ndev = n < GPU_MAX_DEVICES ? n : GPU_MAX_DEVICES;
    g->init = 1;
    return ATTNSTAT_OK;
}

attnstat_code gpu_available(gpu_state *g, char *err, size_t errlen)
{
    if (!g)
        return gpu_fail(err, errlen, ATTNSTAT_ENOMEM, "out of memory for the GPU path's state");
    return gpu_init(g, err, errlen);
}

static attnstat_code gpu_dev_ready(gpu_state *g, int d, char *err, size_t errlen)
{
    gpu_dev *v = &g->dev[d];
    if (v->ready)
        return ATTNSTAT_OK;
    if (v->failed)
        return gpu_fail(err, errlen, ATTNSTAT_ENOTSUP, "%s", v->err);
    attnstat_code rc = gpu_device_uuid(d, v->uuid, sizeof v->uuid, v->err, sizeof v->err);
    if (rc != ATTNSTAT_OK) {
        v->failed = 1;
        return gpu_fail(err, errlen, rc, "%s", v->err);
    }
    v->ready = 1;
    return ATTNSTAT_OK;
}

/* Runs fn with device d current, restoring the caller's current device. */
static cudaError_t gpu_on_device(int d, int *saved)
{
    cudaError_t e = cudaGetDevice(saved);
    if (e != cudaSuccess)
        return e;
    return *saved == d ? cudaSuccess : cudaSetDevice(d);
}

static void gpu_restore_device(int d, int saved)
{
    if (saved != d)
        cudaSetDevice(saved);
}

/* Adds GPU_EVENT_CHUNK interprocess events to device d's pool and registers them. */
static attnstat_code gpu_grow_events(gpu_state *g, int d, gpu_emit_fn emit, void *ectx, char *err,
                                     size_t errlen)
{
    gpu_dev *v = &g->dev[d];
    if (v->nev >= GPU_MAX_EVENTS)
        return ATTNSTAT_DROPPED;
    int cap = v->nev + GPU_EVENT_CHUNK;
    cudaEvent_t *ev = realloc(v->ev, (size_t)cap * sizeof *ev);
    if (ev)
        v->ev = ev;
    uint32_t *ids = ev ? realloc(v->ev_id, (size_t)cap * sizeof *ids) : NULL;
    if (ids)
        v->ev_id = ids;
    int32_t *fr = ids ? realloc(v->free_ev, (size_t)cap * sizeof *fr) : NULL;
    if (fr)
        v->free_ev = fr;
    gpu_deferred *df = fr ? realloc(v->defer, (size_t)cap * sizeof *df) : NULL;
    if (df)
        v->defer = df;
    if (!ev || !ids || !fr || !df)
        return gpu_fail(err, errlen, ATTNSTAT_ENOMEM, "out of memory for the CUDA event pool");
    int saved = 0;
    cudaError_t e = gpu_on_device(d, &saved);
    if (e != cudaSuccess)
        return gpu_fail(err, errlen, ATTNSTAT_EIO, "cudaSetDevice(%d): %s", d,
                        cudaGetErrorString(e));
    attnstat_code rc = ATTNSTAT_OK;
    while (v->nev < cap) {
        cudaEvent_t x;
        e = cudaEventCreateWithFlags(&x, cudaEventDisableTiming | cudaEventInterprocess);
        if (e != cudaSuccess) {
            rc = gpu_fail(err, errlen, ATTNSTAT_EIO,
                          "cudaEventCreateWithFlags(interprocess) on device %d: %s", d,
                          cudaGetErrorString(e));
            break;
        }
        cudaIpcEventHandle_t h;
        e = cudaIpcGetEventHandle(&h, x);
        if (e != cudaSuccess) {
            cudaEventDestroy(x);
            rc = gpu_fail(err, errlen, ATTNSTAT_ENOTSUP,
                          "cudaIpcGetEventHandle on device %d: %s (CUDA IPC is not available "
                          "here)", d, cudaGetErrorString(e));
            break;
        }
        uint32_t id = g->next_event_id++;
        Attnstat__RegisterEvent re = ATTNSTAT__REGISTER_EVENT__INIT;
        re.id = id;
        re.ipc_handle.data = (uint8_t *)h.reserved;
        re.ipc_handle.len = sizeof h.reserved;
        re.device_uuid = v->uuid;
        Attnstat__Envelope env = ATTNSTAT__ENVELOPE__INIT;
        env.msg_case = ATTNSTAT__ENVELOPE__MSG_REGISTER_EVENT;
        env.register_event = &re;
        rc = emit(ectx, &env);
        if (rc != ATTNSTAT_OK) {
            cudaEventDestroy(x);
            snprintf(err, errlen, "cannot register a CUDA event with attnstatd");
            break;
        }
        v->ev[v->nev] = x;
        v->ev_id[v->nev] = id;
        v->free_ev[v->nfree++] = v->nev;
        v->nev++;
    }
    gpu_restore_device(d, saved);
    return rc;
}

/* The staging ring of device d, made and registered at its first use. */
static attnstat_code gpu_staging(gpu_state *g, int d, gpu_emit_fn emit, void *ectx, char *err,
                                 size_t errlen)
{
    gpu_dev *v = &g->dev[d];
    if (v->stage_state == 1)
        return ATTNSTAT_OK;
    if (v->stage_state < 0)
        return gpu_fail(err, errlen, ATTNSTAT_ENOTSUP, "%s", v->stage_err);
    uint64_t bytes = GPU_STAGING_DEFAULT;
    const char *env = getenv("ATTNSTAT_CUDA_STAGING_BYTES");
    if (env && *env) {
        char *end = NULL;
        unsigned long long b = strtoull(env, &end, 0);
        if (end && *end == '\0' && b >= (1u << 20))
            bytes = b;
    }
    int saved = 0;
    cudaError_t e = gpu_on_device(d, &saved);
    if (e == cudaSuccess) {
        e = cudaMalloc(&v->stage, bytes);
        gpu_restore_device(d, saved);
    }
    if (e != cudaSuccess) {
        v->stage = NULL;
        v->stage_state = -1;
        snprintf(v->stage_err, sizeof v->stage_err,
                 "cannot allocate the %llu-byte CUDA staging ring on device %d (%s): tensors in "
                 "memory that CUDA IPC cannot share (expandable_segments) need it; lower "
                 "ATTNSTAT_CUDA_STAGING_BYTES", (unsigned long long)bytes, d, cudaGetErrorString(e));
        return gpu_fail(err, errlen, ATTNSTAT_ENOTSUP, "%s", v->stage_err);
    }
    cudaIpcMemHandle_t h;
    e = cudaIpcGetMemHandle(&h, v->stage);
    if (e != cudaSuccess || ring_init(&v->sring, bytes, 4096) != 0) {
        cudaFree(v->stage);
        v->stage = NULL;
        v->stage_state = -1;
        snprintf(v->stage_err, sizeof v->stage_err,
                 "cannot export the CUDA staging ring of device %d: cudaIpcGetMemHandle: %s", d,
                 cudaGetErrorString(e));
        return gpu_fail(err, errlen, ATTNSTAT_ENOTSUP, "%s", v->stage_err);
    }
    v->stage_bytes = bytes;
    v->stage_id = g->next_buf_id++;
    Attnstat__RegisterBuffer rb = ATTNSTAT__REGISTER_BUFFER__INIT;
    rb.id = v->stage_id;
    rb.kind = ATTNSTAT__BUFFER_KIND__CUDA_IPC;
    rb.size = bytes;
    rb.has_ipc_handle = 1;
    rb.ipc_handle.data = (uint8_t *)h.reserved;
    rb.ipc_handle.len = sizeof h.reserved;
    rb.device_uuid = v->uuid;
    Attnstat__Envelope envl = ATTNSTAT__ENVELOPE__INIT;
    envl.msg_case = ATTNSTAT__ENVELOPE__MSG_REGISTER_BUFFER;
    envl.register_buffer = &rb;
    attnstat_code rc = emit(ectx, &envl);
    if (rc != ATTNSTAT_OK) {
        ring_destroy(&v->sring);
        cudaFree(v->stage);
        v->stage = NULL;
        return gpu_fail(err, errlen, rc, "cannot register the CUDA staging ring with attnstatd");
    }
    v->stage_state = 1;
    return ATTNSTAT_OK;
}

static void gpu_forget(gpu_state *g, gpu_buf *b, gpu_emit_fn emit, void *ectx)
{
    if (!b->dead && !b->staged_only) {
        Attnstat__Forget f = ATTNSTAT__FORGET__INIT;
        f.has_buffer_id = 1;
        f.buffer_id = b->id;
        Attnstat__Envelope env = ATTNSTAT__ENVELOPE__INIT;
        env.msg_case = ATTNSTAT__ENVELOPE__MSG_FORGET;
        env.forget = &f;
        emit(ectx, &env); /* the connection may be gone: nothing is left to forget then */
        g->live--;
    }
    b->dead = 1;
    if (b->inflight == 0)
        memset(b, 0, sizeof *b);
}

/* One tensor as the driver sees it. */
typedef struct {
    int dev;
    unsigned long long cu_id;
    uintptr_t ptr, base;
    uint64_t size, span;
    int ipc;
} gpu_ptr;

static uint64_t gpu_span(const attnstat_tensor *t)
{
    uint64_t last = 0;
    for (int i = 0; i < 4; i++)
        last += (uint64_t)(t->shape[i] - 1) * (uint64_t)t->strides[i];
    return (last + 1) * attnstat_dtype_size((attnstat_dtype)t->dtype);
}

static attnstat_code gpu_lookup_ptr(gpu_state *g, const attnstat_tensor *t, const char *name,
                                    gpu_ptr *r, char *err, size_t errlen)
{
    unsigned int memtype = 0;
    int ordinal = -1;
    unsigned long long cu_id = 0;
    CUdeviceptr start = 0;
    size_t size = 0;
    int ipc = 0; /* the driver writes a bool: the int starts at 0 */
    CUpointer_attribute a[6] = {CU_POINTER_ATTRIBUTE_MEMORY_TYPE, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
                                CU_POINTER_ATTRIBUTE_BUFFER_ID, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR,
                                CU_POINTER_ATTRIBUTE_RANGE_SIZE,
                                CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE};
    void *data[6] = {&memtype, &ordinal, &cu_id, &start, &size, &ipc};
    CUresult cr = g->getattrs(6, a, data, (CUdeviceptr)(uintptr_t)t->data);
    if (cr != CUDA_SUCCESS)
        return gpu_fail(err, errlen, ATTNSTAT_EINVAL,
                        "%s: cuPointerGetAttributes(%p) failed with CUDA error %d", name, t->data,
                        (int)cr);
    if (memtype != CU_MEMORYTYPE_DEVICE || ordinal < 0)
        return gpu_fail(err, errlen, ATTNSTAT_EINVAL,
                        "%s (%p) is not CUDA device memory (memory type %u): pass host tensors with "
                        "mem = ATTNSTAT_MEM_HOST", name, t->data, memtype);
    if (t->device >= 0 && t->device != ordinal)
        return gpu_fail(err, errlen, ATTNSTAT_EINVAL,
                        "%s says device %d but its memory is on CUDA device %d", name, t->device,
                        ordinal);
    if (ordinal >= g->ndev)
        return gpu_fail(err, errlen, ATTNSTAT_ENOTSUP, "%s is on CUDA device %d: at most %d "
                        "devices are supported", name, ordinal, GPU_MAX_DEVICES);
    r->dev = ordinal;
    r->cu_id = cu_id;
    r->ptr = (uintptr_t)t->data;
    r->base = (uintptr_t)start;
    r->size = size;
    r->span = gpu_span(t);
    r->ipc = ipc != 0 && cu_id != 0 && start != 0;
    if (r->ipc && (r->ptr < r->base || r->ptr - r->base > r->size ||
                   r->span > r->size - (r->ptr - r->base)))
        return gpu_fail(err, errlen, ATTNSTAT_EINVAL,
                        "%s: %llu bytes at %p reach past the end of its allocation [%p, +%llu)",
                        name, (unsigned long long)r->span, t->data, (void *)r->base,
                        (unsigned long long)r->size);
    return ATTNSTAT_OK;
}

/* The cache entry of an exportable allocation, exporting it when new. NULL with *rc set when it
 * cannot be had now; *stage set when it must be staged instead. */
static gpu_buf *gpu_export(gpu_state *g, const gpu_ptr *p, gpu_emit_fn emit, void *ectx,
                           int *stage, attnstat_code *rc, char *err, size_t errlen)
{
    *stage = 0;
    *rc = ATTNSTAT_OK;
    if (g->last_hit >= 0) {
        gpu_buf *b = &g->bufs[g->last_hit];
        if (b->cu_id == p->cu_id && !b->dead) {
            b->last_use = ++g->clock;
            *stage = b->staged_only;
            return b;
        }
    }
    int free_i = -1, lru = -1;
    for (int i = 0; i < GPU_MAX_BUFS; i++) {
        gpu_buf *b = &g->bufs[i];
        if (b->cu_id == 0) {
            if (free_i < 0)
                free_i = i;
            continue;
        }
        if (b->cu_id == p->cu_id && !b->dead) {
            g->last_hit = i;
            b->last_use = ++g->clock;
            *stage = b->staged_only;
            return b;
        }
    }
    /* New allocation: cached ones it overlaps were freed (their memory is reused now). */
    for (int i = 0; i < GPU_MAX_BUFS; i++) {
        gpu_buf *b = &g->bufs[i];
        if (b->cu_id && !b->dead && b->dev == p->dev && b->base < p->base + p->size &&
            p->base < b->base + b->size) {
            gpu_forget(g, b, emit, ectx);
            if (b->cu_id == 0 && free_i < 0)
                free_i = i;
        }
    }
    if (free_i < 0) {
        for (int i = 0; i < GPU_MAX_BUFS; i++) {
            gpu_buf *b = &g->bufs[i];
            if (!b->dead && b->inflight == 0 && (lru < 0 || b->last_use < g->bufs[lru].last_use))
                lru = i;
        }
        if (lru < 0) {
            *rc = ATTNSTAT_DROPPED;
            snprintf(err, errlen, "push dropped: %d device allocations are referenced by pushes "
                     "in flight", GPU_MAX_BUFS);
            return NULL;
        }
        gpu_forget(g, &g->bufs[lru], emit, ectx);
        free_i = lru;
    }
    gpu_buf *b = &g->bufs[free_i];
    memset(b, 0, sizeof *b);
    b->cu_id = p->cu_id;
    b->base = p->base;
    b->size = p->size;
    b->dev = p->dev;
    b->last_use = ++g->clock;
    cudaIpcMemHandle_t h;
    cudaError_t e = cudaIpcGetMemHandle(&h, (void *)p->base);
    if (e != cudaSuccess) {
        /* Shareable by its attributes, refused anyway: stage it from now on. */
        b->staged_only = 1;
        *stage = 1;
        g->last_hit = free_i;
        return b;
    }
    b->id = g->next_buf_id++;
    Attnstat__RegisterBuffer rb = ATTNSTAT__REGISTER_BUFFER__INIT;
    rb.id = b->id;
    rb.kind = ATTNSTAT__BUFFER_KIND__CUDA_IPC;
    rb.size = p->size;
    rb.has_ipc_handle = 1;
    rb.ipc_handle.data = (uint8_t *)h.reserved;
    rb.ipc_handle.len = sizeof h.reserved;
    rb.device_uuid = g->dev[p->dev].uuid;
    Attnstat__Envelope env = ATTNSTAT__ENVELOPE__INIT;
    env.msg_case = ATTNSTAT__ENVELOPE__MSG_REGISTER_BUFFER;
    env.register_buffer = &rb;
    *rc = emit(ectx, &env);
    if (*rc != ATTNSTAT_OK) {
        memset(b, 0, sizeof *b);
        snprintf(err, errlen, "cannot register a CUDA allocation with attnstatd");
        return NULL;
    }
    g->live++;
    g->last_hit = free_i;
    return b;
}

typedef struct {
    uintptr_t lo, hi;
    uint64_t off; /* in the staging ring */
} gpu_span_iv;

/* Pins cache entry b for the push being prepared (once per entry): a pinned entry is never
 * evicted, so exporting k cannot take the slot of q's entry of the same push. */
static void gpu_pin(gpu_state *g, gpu_hold *hold, gpu_buf *b)
{
    for (int k = 0; k < hold->nent; k++)
        if (&g->bufs[hold->ent[k]] == b)
            return;
    hold->ent[hold->nent++] = (uint16_t)(b - g->bufs);
    b->inflight++;
}

/* Frees the deferred staging blocks of device v whose copies have completed (never waits). */
static void gpu_reap(gpu_dev *v)
{
    for (int i = 0; i < v->ndefer;) {
        gpu_deferred *x = &v->defer[i];
        cudaError_t e = cudaEventQuery(v->ev[x->event]);
        if (e == cudaErrorNotReady) {
            i++;
            continue;
        }
        /* Done, or the event cannot tell (an error of the caller's context): the block cannot be
         * waited for usefully, so it is freed. */
        if (e != cudaSuccess)
            (void)cudaGetLastError();
        if (v->stage_state == 1)
            ring_release(&v->sring, x->seq);
        if (v->nfree < v->nev)
            v->free_ev[v->nfree++] = x->event;
        *x = v->defer[--v->ndefer];
    }
}

/* Gives back push seq's staging block and event: at once when the copy into the block has
 * completed, else later (gpu_reap), so that a copy still queued on the caller's stream never
 * writes into space handed to another push. */
static void gpu_free_staged(gpu_dev *v, uint64_t seq, int32_t event)
{
    if (event >= 0 && v->ndefer < v->nev) {
        cudaError_t e = cudaEventQuery(v->ev[event]);
        if (e == cudaErrorNotReady) {
            v->defer[v->ndefer].seq = seq;
            v->defer[v->ndefer].event = event;
            v->ndefer++;
            return;
        }
        if (e != cudaSuccess)
            (void)cudaGetLastError();
    }
    if (v->stage_state == 1)
        ring_release(&v->sring, seq);
    if (event >= 0 && v->nfree < v->nev)
        v->free_ev[v->nfree++] = event;
}

/* Undoes the pins of a push that is not sent. */
static void gpu_unpin(gpu_state *g, gpu_hold *hold)
{
    for (int i = 0; i < hold->nent; i++) {
        gpu_buf *b = &g->bufs[hold->ent[i]];
        if (b->inflight > 0 && --b->inflight == 0 && b->dead)
            memset(b, 0, sizeof *b);
    }
    hold->nent = 0;
}

attnstat_code gpu_prepare(gpu_state *g, const attnstat_tensor *const *ts, int nt, void *stream,
                          uint64_t seq, gpu_emit_fn emit, void *ectx, gpu_loc *loc,
                          uint32_t *event_id, gpu_hold *hold, int *zero_copy,
                          attnstat_counters *st, char *err, size_t errlen)
{
    static const char *const names[3] = {"q", "k", "v"};
    memset(hold, 0, sizeof *hold);
    hold->dev = -1;
    hold->event = -1;
    *zero_copy = 0;
    attnstat_code rc = gpu_init(g, err, errlen);
    if (rc != ATTNSTAT_OK)
        return rc;
    cudaStream_t s = stream == (void *)1   ? cudaStreamLegacy
                     : stream == (void *)2 ? cudaStreamPerThread
                                           : (cudaStream_t)stream;
    /* Under CUDA graph capture the event record and the staging copy would become graph nodes
     * (the daemon would wait for an event that is never reached), and a first-use call (event
     * pool, export, staging ring) could invalidate the caller's capture: nothing is touched. */
    enum cudaStreamCaptureStatus cap = cudaStreamCaptureStatusNone;
    cudaError_t before = cudaPeekAtLastError();
    cudaError_t ce = cudaStreamIsCapturing(s, &cap);
    if (ce != cudaSuccess && before == cudaSuccess)
        (void)cudaGetLastError(); /* ours, not the caller's: a later launch check must not see it */
    if (ce == cudaErrorStreamCaptureImplicit || (ce == cudaSuccess &&
                                                 cap != cudaStreamCaptureStatusNone)) {
        /* Implicit: a legacy-stream query while another stream captures in global mode. */
        snprintf(err, errlen, "push dropped: cuda_stream %p is being captured into a CUDA graph "
                 "(%s); push outside the captured region, e.g. after replaying the graph",
                 stream, ce == cudaSuccess ? (cap == cudaStreamCaptureStatusActive
                                                  ? "capture active"
                                                  : "capture invalidated")
                                           : "another stream captures in global mode");
        return ATTNSTAT_DROPPED;
    }
    if (ce != cudaSuccess)
        return gpu_fail(err, errlen, ATTNSTAT_EINVAL,
                        "cudaStreamIsCapturing on stream %p: %s (cuda_stream must be a live "
                        "stream, or NULL/1/2 for the default streams)", stream,
                        cudaGetErrorString(ce));
    gpu_ptr p[3];
    memset(p, 0, sizeof p);
    for (int i = 0; i < nt; i++) {
        rc = gpu_lookup_ptr(g, ts[i], names[i], &p[i], err, errlen);
        if (rc != ATTNSTAT_OK)
            return rc;
        if (p[i].dev != p[0].dev)
            return gpu_fail(err, errlen, ATTNSTAT_EINVAL,
                            "%s is on CUDA device %d but q is on device %d: one push, one device",
                            names[i], p[i].dev, p[0].dev);
    }
    int d = p[0].dev;
    rc = gpu_dev_ready(g, d, err, errlen);
    if (rc != ATTNSTAT_OK)
        return rc;
    gpu_dev *v = &g->dev[d];
    gpu_reap(v);

    /* An event first: without one the push cannot be ordered, so nothing else is done. */
    if (v->nfree == 0) {
        rc = gpu_grow_events(g, d, emit, ectx, err, errlen);
        if (rc == ATTNSTAT_DROPPED || (rc == ATTNSTAT_OK && v->nfree == 0)) {
            st->dropped_events++;
            snprintf(err, errlen, "push dropped: all %d CUDA events of device %d are in use by "
                     "pushes the daemon has not released", v->nev, d);
            return ATTNSTAT_DROPPED;
        }
        if (rc != ATTNSTAT_OK)
            return rc;
    }

    /* Zero-copy where the allocation can be shared; the rest is staged. */
    gpu_buf *ent[3] = {NULL, NULL, NULL};
    int staged[3] = {0, 0, 0}, nstaged = 0;
    for (int i = 0; i < nt; i++) {
        if (!p[i].ipc) {
            staged[i] = 1;
        } else {
            int st_only = 0;
            ent[i] = gpu_export(g, &p[i], emit, ectx, &st_only, &rc, err, errlen);
            if (!ent[i]) {
                gpu_unpin(g, hold);
                if (rc == ATTNSTAT_DROPPED)
                    st->dropped_events++;
                return rc;
            }
            staged[i] = st_only;
            if (!st_only)
                gpu_pin(g, hold, ent[i]);
        }
        nstaged += staged[i];
    }
    gpu_span_iv iv[3];
    int niv = 0;
    if (nstaged) {
        rc = gpu_staging(g, d, emit, ectx, err, errlen);
        if (rc != ATTNSTAT_OK) {
            gpu_unpin(g, hold);
            return rc;
        }
        /* Spans of the staged tensors, overlapping ones merged (q, k, v of one fused buffer). */
        for (int i = 0; i < nt; i++) {
            if (!staged[i])
                continue;
            uintptr_t lo = p[i].ptr, hi = p[i].ptr + p[i].span;
            int j = 0;
            while (j < niv && (hi < iv[j].lo || lo > iv[j].hi))
                j++;
            if (j < niv) {
                iv[j].lo = lo < iv[j].lo ? lo : iv[j].lo;
                iv[j].hi = hi > iv[j].hi ? hi : iv[j].hi;
            } else {
                iv[niv].lo = lo;
                iv[niv].hi = hi;
                niv++;
            }
        }
        for (int a = 0; a < niv; a++) /* a merge can make earlier intervals meet */
            for (int b2 = a + 1; b2 < niv; b2++)
                if (!(iv[b2].hi < iv[a].lo || iv[b2].lo > iv[a].hi)) {
                    iv[a].lo = iv[b2].lo < iv[a].lo ? iv[b2].lo : iv[a].lo;
                    iv[a].hi = iv[b2].hi > iv[a].hi ? iv[b2].hi : iv[a].hi;
                    iv[b2] = iv[--niv];
                    b2 = a;
                }
        uint64_t total = 0;
        for (int j = 0; j < niv; j++) {
            iv[j].off = total;
            total += (iv[j].hi - iv[j].lo + GPU_STAGE_ALIGN - 1) / GPU_STAGE_ALIGN * GPU_STAGE_ALIGN;
        }
        if (total > v->stage_bytes) {
            gpu_unpin(g, hold);
            return gpu_fail(err, errlen, ATTNSTAT_EINVAL,
                            "the staged tensors need %llu bytes, more than the %llu-byte CUDA "
                            "staging ring (raise ATTNSTAT_CUDA_STAGING_BYTES or sample fewer rows)",
                            (unsigned long long)total, (unsigned long long)v->stage_bytes);
        }
        uint64_t base = 0;
        int ar = ring_alloc(&v->sring, total, seq, &base);
        if (ar != 0) {
            gpu_unpin(g, hold);
            if (ar < 0)
                return gpu_fail(err, errlen, ATTNSTAT_ENOMEM, "out of memory for the staging ring");
            st->dropped_staging++;
            snprintf(err, errlen, "push dropped: no room in the %llu-byte CUDA staging ring of "
                     "device %d (the daemon has not released earlier pushes yet)",
                     (unsigned long long)v->stage_bytes, d);
            return ATTNSTAT_DROPPED;
        }
        for (int j = 0; j < niv; j++) {
            iv[j].off += base;
            cudaError_t e = cudaMemcpyAsync((char *)v->stage + iv[j].off, (const void *)iv[j].lo,
                                            iv[j].hi - iv[j].lo, cudaMemcpyDeviceToDevice, s);
            if (e != cudaSuccess) {
                /* Copies queued before this one write into the block: mark them with the
                 * push's event and free the block once they are done. When the stream takes
                 * no event either, it runs nothing more of ours: free it now. */
                int32_t evi = v->free_ev[v->nfree - 1];
                if (j > 0 && cudaEventRecord(v->ev[evi], s) == cudaSuccess) {
                    v->nfree--;
                    gpu_free_staged(v, seq, evi);
                } else {
                    if (j > 0)
                        (void)cudaGetLastError();
                    ring_release(&v->sring, seq);
                }
                gpu_unpin(g, hold);
                return gpu_fail(err, errlen, ATTNSTAT_EINVAL,
                                "cudaMemcpyAsync into the staging ring on stream %p: %s (is the "
                                "stream on device %d?)", stream, cudaGetErrorString(e), d);
            }
        }
        hold->staged = 1;
    }

    int32_t evi = v->free_ev[v->nfree - 1];
    cudaError_t e = cudaEventRecord(v->ev[evi], s);
    if (e != cudaSuccess) {
        /* The stream refuses the event: nothing later of ours can be ordered on it, and the
         * copies queued into the block cannot be tracked; the block is freed now. */
        if (hold->staged)
            ring_release(&v->sring, seq);
        hold->staged = 0;
        gpu_unpin(g, hold);
        return gpu_fail(err, errlen, ATTNSTAT_EINVAL,
                        "cudaEventRecord on stream %p: %s (cuda_stream must be a stream of device "
                        "%d, or NULL/1/2 for the default streams)", stream, cudaGetErrorString(e),
                        d);
    }
    v->nfree--;
    hold->dev = (int16_t)d;
    hold->event = evi;
    *event_id = v->ev_id[evi];
    for (int i = 0; i < nt; i++) {
        if (staged[i]) {
            int j = 0;
            while (!(p[i].ptr >= iv[j].lo && p[i].ptr < iv[j].hi))
                j++;
            loc[i].buffer_id = v->stage_id;
            loc[i].offset = iv[j].off + (p[i].ptr - iv[j].lo);
        } else {
            loc[i].buffer_id = ent[i]->id; /* pinned since its export: still this allocation's */
            loc[i].offset = p[i].ptr - ent[i]->base;
            *zero_copy = 1;
        }
    }
    if (*zero_copy)
        st->cuda_zero_copy++;
    else
        st->cuda_staged++;
    return ATTNSTAT_OK;
}

void gpu_release(gpu_state *g, uint64_t seq, const gpu_hold *h)
{
    if (!g || h->dev < 0)
        return;
    gpu_dev *v = &g->dev[h->dev];
    if (h->staged) {
        gpu_free_staged(v, seq, h->event); /* also the event, once the copy is done */
    } else if (h->event >= 0 && v->nfree < v->nev) {
        v->free_ev[v->nfree++] = h->event;
    }
    gpu_reap(v);
    for (int i = 0; i < h->nent; i++) {
        gpu_buf *b = &g->bufs[h->ent[i]];
        if (b->inflight > 0 && --b->inflight == 0 && b->dead)
            memset(b, 0, sizeof *b);
    }
}

int gpu_on_refused(gpu_state *g, uint64_t ref, const char *msg)
{
    if (!g || ref < GPU_BUF_ID0)
        return 0;
    for (int d = 0; d < GPU_MAX_DEVICES; d++) {
        gpu_dev *v = &g->dev[d];
        int ours = ref == v->stage_id && v->stage_state == 1;
        for (int i = 0; !ours && i < v->nev; i++)
            ours = v->ev_id[i] == ref;
        for (int i = 0; !ours && i < GPU_MAX_BUFS; i++)
            ours = g->bufs[i].cu_id && g->bufs[i].dev == d && g->bufs[i].id == ref;
        if (ours) {
            v->failed = 1;
            v->ready = 0;
            snprintf(v->err, sizeof v->err, "attnstatd cannot take CUDA tensors of device %d: %s",
                     d, msg && *msg ? msg : "registration refused");
            return 1;
        }
    }
    return 0;
}

#else /* no CUDA: the GPU path reports that it is missing */

int gpu_built(void)
{
    return 0;
}

static attnstat_code gpu_nocuda(char *err, size_t errlen)
{
    snprintf(err, errlen, "this libattnstat was built without CUDA: it has only the host path "
             "(rebuild with the CUDA toolkit, -DATTNSTAT_CUDA=ON)");
    return ATTNSTAT_ENOTSUP;
}

attnstat_code gpu_available(gpu_state *g, char *err, size_t errlen)
{
    (void)g;
    return gpu_nocuda(err, errlen);
}

attnstat_code gpu_device_uuid(int device, char *buf, size_t len, char *err, size_t errlen)
{
    (void)device;
    (void)buf;
    (void)len;
    return gpu_nocuda(err, errlen);
}

gpu_state *gpu_new(void)
{
    return NULL;
}

void gpu_free(gpu_state *g)
{
    (void)g;
}

attnstat_code gpu_prepare(gpu_state *g, const attnstat_tensor *const *ts, int nt, void *stream,
                          uint64_t seq, gpu_emit_fn emit, void *ectx, gpu_loc *loc,
                          uint32_t *event_id, gpu_hold *hold, int *zero_copy,
                          attnstat_counters *st, char *err, size_t errlen)
{
    (void)g, (void)ts, (void)nt, (void)stream, (void)seq, (void)emit, (void)ectx, (void)loc;
    (void)event_id, (void)st;
    hold->dev = -1;
    hold->event = -1;
    hold->staged = 0;
    hold->nent = 0;
    *zero_copy = 0;
    return gpu_nocuda(err, errlen);
}

void gpu_release(gpu_state *g, uint64_t seq, const gpu_hold *h)
{
    (void)g, (void)seq, (void)h;
}

int gpu_on_refused(gpu_state *g, uint64_t ref, const char *msg)
{
    (void)g, (void)ref, (void)msg;
    return 0;
}

uint64_t gpu_buffers(const gpu_state *g)
{
    (void)g;
    return 0;
}

#endif
