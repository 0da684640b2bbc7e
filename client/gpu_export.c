/* gpu_export.c — libattnstat's GPU path as the rest of the library sees it (see gpu_export.h):
 * CUDA tensors resolved to exported allocations, or staged, for one push.
 *
 * Per push, for each CUDA tensor: one cuPointerGetAttributes call (reached through
 * cudaGetDriverEntryPointByVersion, never by linking libcuda) gives the allocation's device,
 * process-wide buffer id, base, size and whether cudaIpcGetMemHandle can share it. A buffer id
 * seen before is found in a small cache of exported allocations (no CUDA call); a new one is
 * exported once (cudaIpcGetMemHandle of the base) and registered with the daemon, and a cached
 * allocation whose address range the new one overlaps is dead (freed and reused): it is forgotten.
 * Allocations that cannot be shared (cuMemMap pools such as PyTorch's expandable_segments) are
 * copied into the device's staging ring, and one interprocess event is recorded on the caller's
 * stream: both come from the device's pool (gpu_pool.c). Nothing here synchronises the device or
 * waits for the daemon. Each export's IPC handle is kept, so that a new connection (a daemon
 * restart) gets the same registrations again without a CUDA call.
 *
 * Stage: called by push.c (prepare), replies.c (release, refused registrations), link.c (register
 * again) and session.c (version, device UUID, counters, free). Calls gpu_pool.c, util.c and the
 * CUDA runtime. */
#include "gpu_export.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "envelope.h"
#include "util.h"

#ifdef ATTNSTAT_HAVE_CUDA
#include <cuda.h>
#include <cuda_runtime_api.h>

#include "gpu_pool.h"

#define GPU_MAX_DEVICES 16
#define GPU_MAX_BUFS 48              /* under the daemon's default max_buffers (64) */
#define GPU_BUF_ID0 0x10000u         /* buffer ids: 0x10000.. (the host ring is 1) */

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
    cudaIpcMemHandle_t h;      /* its export, kept to register it again on a new connection */
} gpu_buf;

/* A device as this client uses it: usable (its UUID known, its pool made) or not, and why. */
typedef struct {
    int ready, failed;
    char err[256];
    char uuid[48];
    gpu_pool *pool;            /* events and staging ring, made when the device is first used */
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
        return util_fail(err, errlen, ATTNSTAT_ENOTSUP,
                        "no usable CUDA device: cudaGetDeviceCount: %s (is the NVIDIA driver "
                        "installed and a GPU visible to this process?)", cudaGetErrorString(e));
    if (device < 0 || device >= n)
        return util_fail(err, errlen, ATTNSTAT_EINVAL, "CUDA device %d does not exist (%d visible)",
                        device, n);
    struct cudaDeviceProp prop;
    e = cudaGetDeviceProperties(&prop, device);
    if (e != cudaSuccess)
        return util_fail(err, errlen, ATTNSTAT_EIO, "cudaGetDeviceProperties(%d): %s", device,
                        cudaGetErrorString(e));
    if (len < 41)
        return util_fail(err, errlen, ATTNSTAT_EINVAL, "UUID buffer of %zu bytes: needs 41", len);
    gpu_format_uuid((const unsigned char *)prop.uuid.bytes, buf, len);
    return ATTNSTAT_OK;
}

gpu_state *gpu_new(void)
{
    gpu_state *g = calloc(1, sizeof *g);
    if (!g)
        return NULL;
    g->next_buf_id = GPU_BUF_ID0;
    g->next_event_id = GPU_POOL_EVENT_ID0;
    g->last_hit = -1;
    return g;
}

void gpu_free(gpu_state *g)
{
    if (!g)
        return;
    for (int d = 0; d < GPU_MAX_DEVICES; d++)
        gpu_pool_free(g->dev[d].pool);
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
        return util_fail(err, errlen, ATTNSTAT_ENOTSUP, "%s", g->init_err);
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n == 0) {
        snprintf(g->init_err, sizeof g->init_err,
                 "CUDA tensors cannot be pushed: no usable CUDA device (cudaGetDeviceCount: %s; is "
                 "the NVIDIA driver installed and a GPU visible to this process?)",
                 e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
        g->init = -1;
        return util_fail(err, errlen, ATTNSTAT_ENOTSUP, "%s", g->init_err);
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
        return util_fail(err, errlen, ATTNSTAT_ENOTSUP, "%s", g->init_err);
    }
    g->getattrs = (gpu_getattrs_fn)fn;
    g->ndev = n < GPU_MAX_DEVICES ? n : GPU_MAX_DEVICES;
    g->init = 1;
    return ATTNSTAT_OK;
}

attnstat_code gpu_available(gpu_state *g, char *err, size_t errlen)
{
    if (!g)
        return util_fail(err, errlen, ATTNSTAT_ENOMEM, "out of memory for the GPU path's state");
    return gpu_init(g, err, errlen);
}

static attnstat_code gpu_dev_ready(gpu_state *g, int d, char *err, size_t errlen)
{
    gpu_dev *v = &g->dev[d];
    if (v->ready)
        return ATTNSTAT_OK;
    if (v->failed)
        return util_fail(err, errlen, ATTNSTAT_ENOTSUP, "%s", v->err);
    attnstat_code rc = gpu_device_uuid(d, v->uuid, sizeof v->uuid, v->err, sizeof v->err);
    if (rc != ATTNSTAT_OK) {
        v->failed = 1;
        return util_fail(err, errlen, rc, "%s", v->err);
    }
    if (!v->pool && !(v->pool = gpu_pool_new(d, v->uuid)))
        return util_fail(err, errlen, ATTNSTAT_ENOMEM, "out of memory for the state of CUDA "
                         "device %d", d);
    v->ready = 1;
    return ATTNSTAT_OK;
}

static void gpu_forget(gpu_state *g, gpu_buf *b, gpu_emit_fn emit, void *ectx)
{
    if (!b->dead && !b->staged_only) {
        Attnstat__Forget f;
        Attnstat__Envelope env;
        emit(ectx, envelope_forget(&env, &f, 1, b->id, 0, 0)); /* the connection may be gone: nothing is left to forget then */
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
        return util_fail(err, errlen, ATTNSTAT_EINVAL,
                        "%s: cuPointerGetAttributes(%p) failed with CUDA error %d", name, t->data,
                        (int)cr);
    if (memtype != CU_MEMORYTYPE_DEVICE || ordinal < 0)
        return util_fail(err, errlen, ATTNSTAT_EINVAL,
                        "%s (%p) is not CUDA device memory (memory type %u): pass host tensors with "
                        "mem = ATTNSTAT_MEM_HOST", name, t->data, memtype);
    if (t->device >= 0 && t->device != ordinal)
        return util_fail(err, errlen, ATTNSTAT_EINVAL,
                        "%s says device %d but its memory is on CUDA device %d", name, t->device,
                        ordinal);
    if (ordinal >= g->ndev)
        return util_fail(err, errlen, ATTNSTAT_ENOTSUP, "%s is on CUDA device %d: at most %d "
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
        return util_fail(err, errlen, ATTNSTAT_EINVAL,
                        "%s: %llu bytes at %p reach past the end of its allocation [%p, +%llu)",
                        name, (unsigned long long)r->span, t->data, (void *)r->base,
                        (unsigned long long)r->size);
    return ATTNSTAT_OK;
}

/* Registers exported allocation b with the daemon (its id, size, handle and device). */
static attnstat_code gpu_send_buf(const gpu_state *g, const gpu_buf *b, gpu_emit_fn emit,
                                  void *ectx)
{
    return gpu_pool_send_buffer(b->id, b->size, b->h.reserved, sizeof b->h.reserved,
                                g->dev[b->dev].uuid, emit, ectx);
}

/* The cache entry of an exportable allocation, exporting it when new. NULL with *rc set when it
 * cannot be had now; *stage set when it must be staged instead. */
static gpu_buf *gpu_cache_export(gpu_state *g, const gpu_ptr *p, gpu_emit_fn emit, void *ectx,
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
    cudaError_t e = cudaIpcGetMemHandle(&b->h, (void *)p->base);
    if (e != cudaSuccess) {
        /* Shareable by its attributes, refused anyway: stage it from now on. */
        b->staged_only = 1;
        *stage = 1;
        g->last_hit = free_i;
        return b;
    }
    b->id = g->next_buf_id++;
    *rc = gpu_send_buf(g, b, emit, ectx);
    if (*rc != ATTNSTAT_OK) {
        memset(b, 0, sizeof *b);
        snprintf(err, errlen, "cannot register a CUDA allocation with attnstatd");
        return NULL;
    }
    g->live++;
    g->last_hit = free_i;
    return b;
}

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

attnstat_code gpu_prepare(gpu_state *g, const attnstat_tensor *const *ts, const char *const *names,
                          int nt, void *stream, uint64_t seq, gpu_emit_fn emit, void *ectx,
                          gpu_loc *loc, uint32_t *event_id, gpu_hold *hold, int *zero_copy,
                          attnstat_counters *st, char *err, size_t errlen)
{
    memset(hold, 0, sizeof *hold);
    if (nt < 1 || nt > GPU_MAX_TENSORS)
        return util_fail(err, errlen, ATTNSTAT_EINVAL, "a push names %d tensors (1..%d)", nt,
                         GPU_MAX_TENSORS);
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
        return util_fail(err, errlen, ATTNSTAT_EINVAL,
                        "cudaStreamIsCapturing on stream %p: %s (cuda_stream must be a live "
                        "stream, or NULL/1/2 for the default streams)", stream,
                        cudaGetErrorString(ce));
    gpu_ptr p[GPU_MAX_TENSORS];
    memset(p, 0, sizeof p);
    for (int i = 0; i < nt; i++) {
        rc = gpu_lookup_ptr(g, ts[i], names[i], &p[i], err, errlen);
        if (rc != ATTNSTAT_OK)
            return rc;
        if (p[i].dev != p[0].dev)
            return util_fail(err, errlen, ATTNSTAT_EINVAL,
                            "%s is on CUDA device %d but q is on device %d: one push, one device",
                            names[i], p[i].dev, p[0].dev);
    }
    int d = p[0].dev;
    rc = gpu_dev_ready(g, d, err, errlen);
    if (rc != ATTNSTAT_OK)
        return rc;
    gpu_pool *pool = g->dev[d].pool;
    gpu_pool_reap(pool);

    /* An event first: without one the push cannot be ordered, so nothing else is done. */
    rc = gpu_pool_reserve_event(pool, &g->next_event_id, emit, ectx, st, err, errlen);
    if (rc != ATTNSTAT_OK)
        return rc;

    /* Zero-copy where the allocation can be shared; the rest is staged. */
    gpu_buf *ent[GPU_MAX_TENSORS] = {NULL};
    int staged[GPU_MAX_TENSORS] = {0}, nstaged = 0;
    for (int i = 0; i < nt; i++) {
        if (!p[i].ipc) {
            staged[i] = 1;
        } else {
            int st_only = 0;
            ent[i] = gpu_cache_export(g, &p[i], emit, ectx, &st_only, &rc, err, errlen);
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
    uint64_t stage_off[GPU_MAX_TENSORS] = {0};
    if (nstaged) {
        uintptr_t ptr[GPU_MAX_TENSORS];
        uint64_t span[GPU_MAX_TENSORS], off[GPU_MAX_TENSORS];
        for (int i = 0, n = 0; i < nt; i++)
            if (staged[i]) {
                ptr[n] = p[i].ptr;
                span[n++] = p[i].span;
            }
        rc = gpu_pool_stage(pool, ptr, span, nstaged, seq, (void *)s, &g->next_buf_id, emit, ectx,
                            off, st, err, errlen);
        if (rc != ATTNSTAT_OK) {
            gpu_unpin(g, hold);
            return rc;
        }
        for (int i = 0, n = 0; i < nt; i++)
            if (staged[i])
                stage_off[i] = off[n++];
        hold->staged = 1;
    }

    int32_t evi = -1;
    rc = gpu_pool_record(pool, seq, (void *)s, hold->staged, &evi, event_id, err, errlen);
    if (rc != ATTNSTAT_OK) {
        hold->staged = 0;
        gpu_unpin(g, hold);
        return rc;
    }
    hold->dev = (int16_t)d;
    hold->event = evi;
    for (int i = 0; i < nt; i++) {
        if (staged[i]) {
            loc[i].buffer_id = gpu_pool_stage_id(pool);
            loc[i].offset = stage_off[i];
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
    gpu_pool_release(g->dev[h->dev].pool, seq, h->staged, h->event);
    for (int i = 0; i < h->nent; i++) {
        gpu_buf *b = &g->bufs[h->ent[i]];
        if (b->inflight > 0 && --b->inflight == 0 && b->dead)
            memset(b, 0, sizeof *b);
    }
}

attnstat_code gpu_reregister(gpu_state *g, gpu_emit_fn emit, void *ectx)
{
    if (!g)
        return ATTNSTAT_OK;
    attnstat_code rc = ATTNSTAT_OK;
    /* Events and staging rings first, as at their first use: before any push names them. */
    for (int d = 0; d < GPU_MAX_DEVICES && rc == ATTNSTAT_OK; d++)
        if (g->dev[d].ready)
            rc = gpu_pool_reregister(g->dev[d].pool, emit, ectx);
    for (int i = 0; i < GPU_MAX_BUFS && rc == ATTNSTAT_OK; i++) {
        gpu_buf *b = &g->bufs[i];
        if (b->cu_id && !b->dead && !b->staged_only && g->dev[b->dev].ready)
            rc = gpu_send_buf(g, b, emit, ectx);
    }
    return rc;
}

int gpu_on_refused(gpu_state *g, uint64_t ref, const char *msg)
{
    if (!g || ref < GPU_BUF_ID0)
        return 0;
    for (int d = 0; d < GPU_MAX_DEVICES; d++) {
        gpu_dev *v = &g->dev[d];
        int ours = gpu_pool_owns(v->pool, ref);
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
    return util_fail(err, errlen, ATTNSTAT_ENOTSUP, "this libattnstat was built without CUDA: it "
                     "has only the host path (rebuild with the CUDA toolkit, -DATTNSTAT_CUDA=ON)");
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

attnstat_code gpu_prepare(gpu_state *g, const attnstat_tensor *const *ts, const char *const *names,
                          int nt, void *stream, uint64_t seq, gpu_emit_fn emit, void *ectx,
                          gpu_loc *loc, uint32_t *event_id, gpu_hold *hold, int *zero_copy,
                          attnstat_counters *st, char *err, size_t errlen)
{
    (void)g, (void)ts, (void)names, (void)nt, (void)stream, (void)seq, (void)emit, (void)ectx, (void)loc;
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

attnstat_code gpu_reregister(gpu_state *g, gpu_emit_fn emit, void *ectx)
{
    (void)g, (void)emit, (void)ectx;
    return ATTNSTAT_OK;
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
