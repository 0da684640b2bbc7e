/* gpu_pool.c — one CUDA device's interprocess events and staging ring (see gpu_pool.h).
 *
 * Events are created and exported in chunks of GPU_POOL_EVENT_CHUNK (cudaEventInterprocess,
 * timing disabled), each registered with the daemon once; a stack of free indices hands them out.
 * The staging ring is one cudaMalloc'd block (sized by the first staged push: gpu_pool_staging;
 * ATTNSTAT_CUDA_STAGING_BYTES sets it) managed
 * by ring.c, exported once. A staged push's block is keyed by its seq; when the push is released
 * while the copy into its block may still be queued on the caller's stream, block and event are
 * kept aside (defer[]) until cudaEventQuery says the copy is done. The IPC handles of the events
 * and of the staging ring are kept, so that a new connection gets them again without a CUDA call.
 *
 * Stage: below gpu_export.c. Calls ring.c, util.c and the CUDA runtime. */
#include "gpu_pool.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "envelope.h"
#include "ring.h"
#include "util.h"

#define GPU_POOL_EVENT_CHUNK 16
#define GPU_POOL_MAX_EVENTS 1024
#define GPU_POOL_STAGING_DEFAULT (64ull << 20) /* the least a staging ring is made with */
#define GPU_POOL_STAGING_PUSHES 4               /* pushes of the first one's size it holds */
#define GPU_POOL_STAGE_ALIGN 256u

/* A staging block given back while the caller's stream may still be copying into it: freed (and
 * its event returned to the pool) once the event recorded after the copy has completed. */
typedef struct {
    uint64_t seq;
    int32_t event;
} gpu_deferred;

struct gpu_pool {
    int dev;
    char uuid[48];
    cudaEvent_t *ev;
    cudaIpcEventHandle_t *ev_h; /* their exports */
    uint32_t *ev_id;
    int32_t *free_ev;          /* stack of free pool indices */
    int nev, nfree;
    gpu_deferred *defer;       /* staged blocks whose copy may still be pending (capacity nev) */
    int ndefer;
    void *stage;
    uint64_t stage_bytes;
    ring sring;
    uint32_t stage_id;
    cudaIpcMemHandle_t stage_h;
    int stage_state;           /* 0: not made, 1: ready, -1: failed (stage_err) */
    char stage_err[256];
};

gpu_pool *gpu_pool_new(int device, const char *uuid)
{
    gpu_pool *p = calloc(1, sizeof *p);
    if (!p)
        return NULL;
    p->dev = device;
    util_copy_str(p->uuid, sizeof p->uuid, uuid);
    return p;
}

void gpu_pool_free(gpu_pool *p)
{
    if (!p)
        return;
    for (int i = 0; i < p->nev; i++)
        cudaEventDestroy(p->ev[i]); /* best effort: the process may be exiting */
    if (p->stage)
        cudaFree(p->stage);
    if (p->stage_state == 1)
        ring_destroy(&p->sring);
    free(p->ev);
    free(p->ev_h);
    free(p->ev_id);
    free(p->free_ev);
    free(p->defer);
    free(p);
}

uint32_t gpu_pool_stage_id(const gpu_pool *p)
{
    return p->stage_id;
}

int gpu_pool_owns(const gpu_pool *p, uint64_t ref)
{
    if (!p)
        return 0;
    if (ref == p->stage_id && p->stage_state == 1)
        return 1;
    for (int i = 0; i < p->nev; i++)
        if (p->ev_id[i] == ref)
            return 1;
    return 0;
}

/* Makes device d current, keeping the caller's current device in *saved. */
static cudaError_t gpu_pool_on_device(int d, int *saved)
{
    cudaError_t e = cudaGetDevice(saved);
    if (e != cudaSuccess)
        return e;
    return *saved == d ? cudaSuccess : cudaSetDevice(d);
}

static void gpu_pool_restore_device(int d, int saved)
{
    if (saved != d)
        cudaSetDevice(saved);
}

/* ---- Registrations ---------------------------------------------------------------------------- */
/* Registers event i of the pool with the daemon. */
static attnstat_code gpu_pool_send_event(const gpu_pool *p, int i, gpu_emit_fn emit, void *ectx)
{
    Attnstat__RegisterEvent re;
    Attnstat__Envelope env;
    return emit(ectx, envelope_register_event(&env, &re, p->ev_id[i],
                                              (const uint8_t *)p->ev_h[i].reserved,
                                              sizeof p->ev_h[i].reserved, p->uuid));
}

attnstat_code gpu_pool_send_buffer(uint32_t id, uint64_t size, const void *handle, size_t hlen,
                                   const char *uuid, gpu_emit_fn emit, void *ectx)
{
    Attnstat__RegisterBuffer rb;
    Attnstat__Envelope env;
    return emit(ectx, envelope_register_cuda(&env, &rb, id, handle, hlen, size, uuid));
}

/* Registers the staging ring with the daemon. */
static attnstat_code gpu_pool_send_stage(const gpu_pool *p, gpu_emit_fn emit, void *ectx)
{
    return gpu_pool_send_buffer(p->stage_id, p->stage_bytes, p->stage_h.reserved,
                                sizeof p->stage_h.reserved, p->uuid, emit, ectx);
}

attnstat_code gpu_pool_reregister(gpu_pool *p, gpu_emit_fn emit, void *ectx)
{
    if (!p)
        return ATTNSTAT_OK;
    attnstat_code rc = ATTNSTAT_OK;
    for (int i = 0; i < p->nev && rc == ATTNSTAT_OK; i++)
        rc = gpu_pool_send_event(p, i, emit, ectx);
    if (rc == ATTNSTAT_OK && p->stage_state == 1)
        rc = gpu_pool_send_stage(p, emit, ectx);
    return rc;
}

/* ---- Events ----------------------------------------------------------------------------------- */
/* Adds GPU_POOL_EVENT_CHUNK interprocess events to the pool and registers them. */
static attnstat_code gpu_pool_grow_events(gpu_pool *p, uint32_t *next_event_id, gpu_emit_fn emit,
                                          void *ectx, char *err, size_t errlen)
{
    if (p->nev >= GPU_POOL_MAX_EVENTS)
        return ATTNSTAT_DROPPED;
    int cap = p->nev + GPU_POOL_EVENT_CHUNK;
    cudaEvent_t *ev = realloc(p->ev, (size_t)cap * sizeof *ev);
    if (ev)
        p->ev = ev;
    cudaIpcEventHandle_t *hs = ev ? realloc(p->ev_h, (size_t)cap * sizeof *hs) : NULL;
    if (hs)
        p->ev_h = hs;
    uint32_t *ids = hs ? realloc(p->ev_id, (size_t)cap * sizeof *ids) : NULL;
    if (ids)
        p->ev_id = ids;
    int32_t *fr = ids ? realloc(p->free_ev, (size_t)cap * sizeof *fr) : NULL;
    if (fr)
        p->free_ev = fr;
    gpu_deferred *df = fr ? realloc(p->defer, (size_t)cap * sizeof *df) : NULL;
    if (df)
        p->defer = df;
    if (!ev || !hs || !ids || !fr || !df)
        return util_fail(err, errlen, ATTNSTAT_ENOMEM, "out of memory for the CUDA event pool");
    int d = p->dev, saved = 0;
    cudaError_t e = gpu_pool_on_device(d, &saved);
    if (e != cudaSuccess)
        return util_fail(err, errlen, ATTNSTAT_EIO, "cudaSetDevice(%d): %s", d,
                         cudaGetErrorString(e));
    attnstat_code rc = ATTNSTAT_OK;
    while (p->nev < cap) {
        cudaEvent_t x;
        e = cudaEventCreateWithFlags(&x, cudaEventDisableTiming | cudaEventInterprocess);
        if (e != cudaSuccess) {
            rc = util_fail(err, errlen, ATTNSTAT_EIO,
                           "cudaEventCreateWithFlags(interprocess) on device %d: %s", d,
                           cudaGetErrorString(e));
            break;
        }
        e = cudaIpcGetEventHandle(&p->ev_h[p->nev], x);
        if (e != cudaSuccess) {
            cudaEventDestroy(x);
            rc = util_fail(err, errlen, ATTNSTAT_ENOTSUP,
                           "cudaIpcGetEventHandle on device %d: %s (CUDA IPC is not available "
                           "here)", d, cudaGetErrorString(e));
            break;
        }
        p->ev[p->nev] = x;
        p->ev_id[p->nev] = (*next_event_id)++;
        rc = gpu_pool_send_event(p, p->nev, emit, ectx);
        if (rc != ATTNSTAT_OK) {
            cudaEventDestroy(x);
            util_fail(err, errlen, rc, "cannot register a CUDA event with attnstatd");
            break;
        }
        p->free_ev[p->nfree++] = p->nev;
        p->nev++;
    }
    gpu_pool_restore_device(d, saved);
    return rc;
}

attnstat_code gpu_pool_reserve_event(gpu_pool *p, uint32_t *next_event_id, gpu_emit_fn emit,
                                     void *ectx, attnstat_counters *st, char *err, size_t errlen)
{
    if (p->nfree > 0)
        return ATTNSTAT_OK;
    attnstat_code rc = gpu_pool_grow_events(p, next_event_id, emit, ectx, err, errlen);
    if (rc == ATTNSTAT_DROPPED || (rc == ATTNSTAT_OK && p->nfree == 0)) {
        st->dropped_events++;
        return util_fail(err, errlen, ATTNSTAT_DROPPED, "push dropped: all %d CUDA events of "
                         "device %d are in use by pushes the daemon has not released", p->nev,
                         p->dev);
    }
    return rc;
}

/* ---- The staging ring ------------------------------------------------------------------------- */
/* Made and registered at its first use, sized by that first push (need bytes): room for
 * GPU_POOL_STAGING_PUSHES such pushes, at least GPU_POOL_STAGING_DEFAULT, at most 1/32 of the
 * device's memory; ATTNSTAT_CUDA_STAGING_BYTES sets the size instead. (A fixed 64 MiB refused
 * every push of a 1 B-parameter Llama at 4 x 2048 tokens: 96 MB of float32 q and k a layer.) */
static attnstat_code gpu_pool_staging(gpu_pool *p, uint64_t need, uint32_t *next_buf_id,
                                      gpu_emit_fn emit, void *ectx, char *err, size_t errlen)
{
    if (p->stage_state == 1)
        return ATTNSTAT_OK;
    if (p->stage_state < 0)
        return util_fail(err, errlen, ATTNSTAT_ENOTSUP, "%s", p->stage_err);
    uint64_t bytes = 0;
    const char *env = getenv("ATTNSTAT_CUDA_STAGING_BYTES");
    if (env && *env) {
        char *end = NULL;
        unsigned long long b = strtoull(env, &end, 0);
        if (end && *end == '\0' && b >= (1u << 20))
            bytes = b;
    }
    int d = p->dev, saved = 0;
    cudaError_t e = gpu_pool_on_device(d, &saved);
    if (e == cudaSuccess) {
        if (!bytes) {
            size_t free_b = 0, total_b = 0;
            uint64_t cap = cudaMemGetInfo(&free_b, &total_b) == cudaSuccess
                               ? (uint64_t)total_b / 32 : GPU_POOL_STAGING_DEFAULT;
            (void)cudaGetLastError();
            bytes = need > UINT64_MAX / GPU_POOL_STAGING_PUSHES ? UINT64_MAX
                                                                 : need * GPU_POOL_STAGING_PUSHES;
            if (bytes > cap)
                bytes = cap;
            if (bytes < GPU_POOL_STAGING_DEFAULT)
                bytes = GPU_POOL_STAGING_DEFAULT;
            bytes = (bytes + (1u << 20) - 1) & ~(uint64_t)((1u << 20) - 1);
        }
        e = cudaMalloc(&p->stage, bytes);
        gpu_pool_restore_device(d, saved);
    }
    if (e != cudaSuccess) {
        p->stage = NULL;
        p->stage_state = -1;
        snprintf(p->stage_err, sizeof p->stage_err,
                 "cannot allocate the %llu-byte CUDA staging ring on device %d (%s): tensors in "
                 "memory that CUDA IPC cannot share (expandable_segments) need it; lower "
                 "ATTNSTAT_CUDA_STAGING_BYTES", (unsigned long long)bytes, d, cudaGetErrorString(e));
        return util_fail(err, errlen, ATTNSTAT_ENOTSUP, "%s", p->stage_err);
    }
    e = cudaIpcGetMemHandle(&p->stage_h, p->stage);
    if (e != cudaSuccess || ring_init(&p->sring, bytes, 4096) != 0) {
        cudaFree(p->stage);
        p->stage = NULL;
        p->stage_state = -1;
        snprintf(p->stage_err, sizeof p->stage_err,
                 "cannot export the CUDA staging ring of device %d: cudaIpcGetMemHandle: %s", d,
                 cudaGetErrorString(e));
        return util_fail(err, errlen, ATTNSTAT_ENOTSUP, "%s", p->stage_err);
    }
    p->stage_bytes = bytes;
    p->stage_id = (*next_buf_id)++;
    attnstat_code rc = gpu_pool_send_stage(p, emit, ectx);
    if (rc != ATTNSTAT_OK) {
        ring_destroy(&p->sring);
        cudaFree(p->stage);
        p->stage = NULL;
        return util_fail(err, errlen, rc, "cannot register the CUDA staging ring with attnstatd");
    }
    p->stage_state = 1;
    return ATTNSTAT_OK;
}

void gpu_pool_reap(gpu_pool *p)
{
    for (int i = 0; i < p->ndefer;) {
        gpu_deferred *x = &p->defer[i];
        cudaError_t e = cudaEventQuery(p->ev[x->event]);
        if (e == cudaErrorNotReady) {
            i++;
            continue;
        }
        /* Done, or the event cannot tell (an error of the caller's context): the block cannot be
         * waited for usefully, so it is freed. */
        if (e != cudaSuccess)
            (void)cudaGetLastError();
        if (p->stage_state == 1)
            ring_release(&p->sring, x->seq);
        if (p->nfree < p->nev)
            p->free_ev[p->nfree++] = x->event;
        *x = p->defer[--p->ndefer];
    }
}

/* Gives back push seq's staging block and event: at once when the copy into the block has
 * completed, else later (gpu_pool_reap), so that a copy still queued on the caller's stream never
 * writes into space handed to another push. */
static void gpu_pool_free_staged(gpu_pool *p, uint64_t seq, int32_t event)
{
    if (event >= 0 && p->ndefer < p->nev) {
        cudaError_t e = cudaEventQuery(p->ev[event]);
        if (e == cudaErrorNotReady) {
            p->defer[p->ndefer].seq = seq;
            p->defer[p->ndefer].event = event;
            p->ndefer++;
            return;
        }
        if (e != cudaSuccess)
            (void)cudaGetLastError();
    }
    if (p->stage_state == 1)
        ring_release(&p->sring, seq);
    if (event >= 0 && p->nfree < p->nev)
        p->free_ev[p->nfree++] = event;
}

typedef struct {
    uintptr_t lo, hi;
    uint64_t off; /* in the staging ring */
} gpu_pool_span;

/* The spans of the tensors, overlapping ones merged (q, k, v of one fused buffer). */
static int gpu_pool_merge(const uintptr_t *ptr, const uint64_t *span, int nt, gpu_pool_span *iv)
{
    int niv = 0;
    for (int i = 0; i < nt; i++) {
        uintptr_t lo = ptr[i], hi = ptr[i] + span[i];
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
        for (int b = a + 1; b < niv; b++)
            if (!(iv[b].hi < iv[a].lo || iv[b].lo > iv[a].hi)) {
                iv[a].lo = iv[b].lo < iv[a].lo ? iv[b].lo : iv[a].lo;
                iv[a].hi = iv[b].hi > iv[a].hi ? iv[b].hi : iv[a].hi;
                iv[b] = iv[--niv];
                b = a;
            }
    return niv;
}

attnstat_code gpu_pool_stage(gpu_pool *p, const uintptr_t *ptr, const uint64_t *span, int nt,
                             uint64_t seq, void *stream, uint32_t *next_buf_id, gpu_emit_fn emit,
                             void *ectx, uint64_t *off, attnstat_counters *st, char *err,
                             size_t errlen)
{
    gpu_pool_span iv[GPU_MAX_TENSORS];
    if (nt > GPU_MAX_TENSORS)
        return util_fail(err, errlen, ATTNSTAT_EINVAL, "%d tensors to stage (at most %d)", nt,
                         GPU_MAX_TENSORS);
    int niv = gpu_pool_merge(ptr, span, nt, iv);
    uint64_t total = 0;
    for (int j = 0; j < niv; j++) {
        iv[j].off = total;
        total += (iv[j].hi - iv[j].lo + GPU_POOL_STAGE_ALIGN - 1) / GPU_POOL_STAGE_ALIGN *
                 GPU_POOL_STAGE_ALIGN;
    }
    attnstat_code rc = gpu_pool_staging(p, total, next_buf_id, emit, ectx, err, errlen);
    if (rc != ATTNSTAT_OK)
        return rc;
    if (total > p->stage_bytes)
        return util_fail(err, errlen, ATTNSTAT_EINVAL,
                         "the staged tensors need %llu bytes, more than the %llu-byte CUDA "
                         "staging ring (raise ATTNSTAT_CUDA_STAGING_BYTES or sample fewer rows)",
                         (unsigned long long)total, (unsigned long long)p->stage_bytes);
    uint64_t base = 0;
    int ar = ring_alloc(&p->sring, total, seq, &base);
    if (ar < 0)
        return util_fail(err, errlen, ATTNSTAT_ENOMEM, "out of memory for the staging ring");
    if (ar != 0) {
        st->dropped_staging++;
        return util_fail(err, errlen, ATTNSTAT_DROPPED, "push dropped: no room in the %llu-byte "
                         "CUDA staging ring of device %d (the daemon has not released earlier "
                         "pushes yet)", (unsigned long long)p->stage_bytes, p->dev);
    }
    cudaStream_t s = (cudaStream_t)stream;
    for (int j = 0; j < niv; j++) {
        iv[j].off += base;
        cudaError_t e = cudaMemcpyAsync((char *)p->stage + iv[j].off, (const void *)iv[j].lo,
                                        iv[j].hi - iv[j].lo, cudaMemcpyDeviceToDevice, s);
        if (e != cudaSuccess) {
            /* Copies queued before this one write into the block: mark them with the push's
             * event and free the block once they are done. When the stream takes no event
             * either, it runs nothing more of ours: free it now. */
            int32_t evi = p->free_ev[p->nfree - 1];
            if (j > 0 && cudaEventRecord(p->ev[evi], s) == cudaSuccess) {
                p->nfree--;
                gpu_pool_free_staged(p, seq, evi);
            } else {
                if (j > 0)
                    (void)cudaGetLastError();
                ring_release(&p->sring, seq);
            }
            return util_fail(err, errlen, ATTNSTAT_EINVAL,
                             "cudaMemcpyAsync into the staging ring on stream %p: %s (is the "
                             "stream on device %d?)", stream, cudaGetErrorString(e), p->dev);
        }
    }
    for (int i = 0; i < nt; i++) {
        int j = 0;
        while (!(ptr[i] >= iv[j].lo && ptr[i] < iv[j].hi))
            j++;
        off[i] = iv[j].off + (ptr[i] - iv[j].lo);
    }
    return ATTNSTAT_OK;
}

/* ---- Recording and releasing ------------------------------------------------------------------ */
attnstat_code gpu_pool_record(gpu_pool *p, uint64_t seq, void *stream, int staged, int32_t *event,
                              uint32_t *event_id, char *err, size_t errlen)
{
    int32_t evi = p->free_ev[p->nfree - 1];
    cudaError_t e = cudaEventRecord(p->ev[evi], (cudaStream_t)stream);
    if (e != cudaSuccess) {
        /* The stream refuses the event: nothing later of ours can be ordered on it, and the
         * copies queued into the block cannot be tracked; the block is freed now. */
        if (staged)
            ring_release(&p->sring, seq);
        return util_fail(err, errlen, ATTNSTAT_EINVAL,
                         "cudaEventRecord on stream %p: %s (cuda_stream must be a stream of "
                         "device %d, or NULL/1/2 for the default streams)", stream,
                         cudaGetErrorString(e), p->dev);
    }
    p->nfree--;
    *event = evi;
    *event_id = p->ev_id[evi];
    return ATTNSTAT_OK;
}

void gpu_pool_release(gpu_pool *p, uint64_t seq, int staged, int32_t event)
{
    if (staged)
        gpu_pool_free_staged(p, seq, event); /* also the event, once the copy is done */
    else if (event >= 0 && p->nfree < p->nev)
        p->free_ev[p->nfree++] = event;
    gpu_pool_reap(p);
}
