/* gpu_pool.h — one CUDA device's resources for libattnstat's GPU path (internal): the pool of
 * interprocess events that order the daemon's reads after the caller's stream, and the device
 * staging ring that tensors CUDA IPC cannot share are copied into. Both are made at their first
 * use, registered with the daemon once (through the emit function given), and reused.
 *
 * What it promises
 *   - Nothing here synchronises the device or waits (the one-time cudaMalloc of a staging ring
 *     aside). An event and a staging block go back to the pool only once the push that took them
 *     is released, and a staging block only once the copy into it has completed on the caller's
 *     stream (cudaEventQuery; until then it is kept aside and freed by a later call).
 *   - Event ids (GPU_POOL_EVENT_ID0 and up) never meet buffer ids, so an Error's ref tells them
 *     apart.
 *
 * Compiled only with CUDA (ATTNSTAT_HAVE_CUDA); the header is CUDA-free (streams are passed as
 * the cudaStream_t value in a void *). One pool per device per client, touched only by the
 * client's calls (no locks).
 *
 * Stage: below gpu_export.c, its only caller. Calls ring.c, util.c and the CUDA runtime. */
#ifndef ATTNSTAT_GPU_POOL_H
#define ATTNSTAT_GPU_POOL_H

#include <stddef.h>
#include <stdint.h>

#include "attnstat.h"
#include "attnstat.pb-c.h"

/* The tensors of one push at most: q, k, v, a mask, two packed-offset arrays, the sinks. */
#define GPU_MAX_TENSORS 7

#define GPU_POOL_EVENT_ID0 0x20000000u /* event ids, disjoint from buffer ids (Error refs) */

/* Queues one control frame to the daemon; returns an attnstat_code. */
typedef attnstat_code (*gpu_emit_fn)(void *ctx, const Attnstat__Envelope *env);

typedef struct gpu_pool gpu_pool;

/* The pool of device `device` (uuid as the daemon knows it); NULL when out of memory. Makes no
 * CUDA call. */
gpu_pool *gpu_pool_new(int device, const char *uuid);

/* Destroys the events and frees the staging ring (best effort: the process may be exiting). */
void gpu_pool_free(gpu_pool *p);

/* Gives back the staging blocks whose copies have completed (never waits). */
void gpu_pool_reap(gpu_pool *p);

/* Makes sure an event is free for the next push, growing the pool (each new event registered
 * through emit; ids from *next_event_id). ATTNSTAT_OK; ATTNSTAT_DROPPED when every event is in use
 * by pushes not yet released (counted in st->dropped_events, err says so); or an error. */
attnstat_code gpu_pool_reserve_event(gpu_pool *p, uint32_t *next_event_id, gpu_emit_fn emit,
                                     void *ectx, attnstat_counters *st, char *err, size_t errlen);

/* Copies the nt spans [ptr[i], ptr[i] + span[i]) (device memory) into one block of the staging
 * ring keyed by seq, on stream, after an event was reserved. Overlapping spans (q, k and v of one
 * fused buffer) are copied once. The ring is made and registered at its first use (its buffer id
 * from *next_buf_id). On ATTNSTAT_OK, off[i] is where span i starts in the ring. On DROPPED (no
 * room: counted in st->dropped_staging) or an error, nothing is held. */
attnstat_code gpu_pool_stage(gpu_pool *p, const uintptr_t *ptr, const uint64_t *span, int nt,
                             uint64_t seq, void *stream, uint32_t *next_buf_id, gpu_emit_fn emit,
                             void *ectx, uint64_t *off, attnstat_counters *st, char *err,
                             size_t errlen);

/* Records the reserved event on stream for push seq (staged: it holds a staging block). On
 * ATTNSTAT_OK the event is taken: *event (the pool's index) and *event_id (the daemon's id). On
 * failure (EINVAL, err set) the push's staging block is freed and nothing is held. */
attnstat_code gpu_pool_record(gpu_pool *p, uint64_t seq, void *stream, int staged, int32_t *event,
                              uint32_t *event_id, char *err, size_t errlen);

/* Push seq is released: its event (index; -1 none) and staging block (staged) go back, the block
 * once its copy has completed. */
void gpu_pool_release(gpu_pool *p, uint64_t seq, int staged, int32_t event);

/* Sends the RegisterBuffer of a CUDA IPC allocation (id, size, its cudaIpcMemHandle_t's hlen
 * bytes, the device's UUID) through emit: the one builder of that message for the GPU path. */
attnstat_code gpu_pool_send_buffer(uint32_t id, uint64_t size, const void *handle, size_t hlen,
                                   const char *uuid, gpu_emit_fn emit, void *ectx);

/* A new connection: registers again, through emit, the pool's events and its staging ring (when
 * made) under their old ids. Makes no CUDA call (their IPC handles were kept). p may be NULL. */
attnstat_code gpu_pool_reregister(gpu_pool *p, gpu_emit_fn emit, void *ectx);

/* The staging ring's buffer id (0 before it is made). */
uint32_t gpu_pool_stage_id(const gpu_pool *p);

/* 1 when ref is the id of this pool's staging ring or of one of its events. */
int gpu_pool_owns(const gpu_pool *p, uint64_t ref);

#endif /* ATTNSTAT_GPU_POOL_H */
