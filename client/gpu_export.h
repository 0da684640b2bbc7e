/* gpu_export.h — libattnstat's GPU path (internal to the library): CUDA tensors handed to the daemon
 * by IPC handle of their allocation (zero-copy), or copied on the caller's stream into a device
 * staging ring when the allocation cannot be shared that way; an interprocess event recorded on
 * the caller's stream orders the daemon's reads after the tensors are written.
 *
 * Built only with CUDA (ATTNSTAT_HAVE_CUDA); without it every entry point exists and reports
 * that the library has no GPU path. The CUDA runtime is linked statically and the driver is
 * reached only at the first call that needs it (gpu_prepare, gpu_device_uuid): the library loads
 * and works for host tensors on machines without a GPU driver.
 *
 * State per client, touched only by the client's calls (no locks). Control frames (RegisterBuffer,
 * RegisterEvent, Forget) go out through the caller-given emit function, in order before the Push
 * that needs them.
 *
 * Stage: the GPU half of a push. Implemented by gpu_export.c (the export cache, the preparation of
 * one push) over gpu_pool.c (each device's events and staging ring). Called by push.c, replies.c,
 * link.c and session.c. */
#ifndef ATTNSTAT_GPU_EXPORT_H
#define ATTNSTAT_GPU_EXPORT_H

#include <stddef.h>
#include <stdint.h>

#include "attnstat.h"
#include "attnstat.pb-c.h"
#include "gpu_pool.h" /* gpu_emit_fn */

typedef struct gpu_state gpu_state;

/* What one sent push holds until the daemon no longer reads its memory (kept in the client's
 * in-flight slot and given back to gpu_release). */
typedef struct {
    int16_t dev;        /* device ordinal; -1: nothing held */
    uint8_t staged;     /* a staging-ring block keyed by the push's seq */
    uint8_t nent;       /* entries of ent[] in use */
    int32_t event;      /* index in the device's event pool; -1: none */
    uint16_t ent[GPU_MAX_TENSORS]; /* exported-allocation cache entries the push references */
} gpu_hold;

/* Where one tensor is, for the Push message. */
typedef struct {
    uint32_t buffer_id;
    uint64_t offset;
} gpu_loc;

/* 1 when the library was built with the GPU path. */
int gpu_built(void);

/* UUID of a device as nvidia-smi prints it. Returns ATTNSTAT_OK, or an error with err set. */
attnstat_code gpu_device_uuid(int device, char *buf, size_t len, char *err, size_t errlen);

/* ATTNSTAT_OK when CUDA tensors can be pushed from this process (first call: starts the CUDA
 * runtime and finds the driver), else ENOTSUP with err saying why. g NULL: ENOTSUP. */
attnstat_code gpu_available(gpu_state *g, char *err, size_t errlen);

/* A client's GPU state; NULL when out of memory. Makes no CUDA call. */
gpu_state *gpu_new(void);
/* Frees the events and staging rings (nothing the daemon may still read should be pending:
 * the connection is closed first). g may be NULL. */
void gpu_free(gpu_state *g);

/* Prepares the CUDA tensors ts[0..nt) (nt <= GPU_MAX_TENSORS, named names[i] in messages) of push
 * seq: checks them against their allocations, exports
 * what is new (through emit), stages what cannot be exported, records an event on stream.
 * Returns ATTNSTAT_OK with loc[], *event_id, *hold and *zero_copy (1: the caller's memory is read
 * by the daemon later) set; ATTNSTAT_DROPPED when the staging ring or the event pool is full
 * (counted in st), or when stream is being captured into a CUDA graph (checked first: then no
 * other CUDA call is made; the caller counts it in dropped_local); or an error (EINVAL, ENOTSUP, EIO) with err set. On anything but OK nothing
 * is held. */
attnstat_code gpu_prepare(gpu_state *g, const attnstat_tensor *const *ts, const char *const *names,
                          int nt, void *stream,
                          uint64_t seq, gpu_emit_fn emit, void *ectx, gpu_loc *loc,
                          uint32_t *event_id, gpu_hold *hold, int *zero_copy,
                          attnstat_counters *st, char *err, size_t errlen);

/* The daemon no longer reads push seq's memory (or the push was never sent, or was dropped): its
 * event and staging block may be reused. A staging block goes back to the ring (with its event)
 * only once the copy into it has completed on the caller's stream (cudaEventQuery, never a wait);
 * until then it is kept aside and freed by a later call. */
void gpu_release(gpu_state *g, uint64_t seq, const gpu_hold *h);

/* The connection is new (the daemon restarted and lost every registration): registers again,
 * through emit and under the same ids, what this client holds: each usable device's events and
 * staging ring, then every exported allocation still cached. Called with nothing in flight (the
 * pushes of the lost connection were released first). Makes no CUDA call: the IPC handles were
 * kept when they were made. Returns ATTNSTAT_OK or what emit returned. g may be NULL. */
attnstat_code gpu_reregister(gpu_state *g, gpu_emit_fn emit, void *ectx);

/* The daemon refused a registration (an Error whose ref is a buffer or event id of ours): the
 * device is marked unusable so that later pushes fail at once with err's message (ENOTSUP).
 * Returns 1 when ref was one of ours. */
int gpu_on_refused(gpu_state *g, uint64_t ref, const char *msg);

/* Live exported allocations (for the counters). */
uint64_t gpu_buffers(const gpu_state *g);

#endif /* ATTNSTAT_GPU_EXPORT_H */
