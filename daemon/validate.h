/* validate.h — checks every field of a Push before anything reads tensor memory, and turns a valid
 * Push into a stats_problem whose tensors point into the registered buffers.
 *
 * Guarantee: when validate_push() returns OK, every element the stats backend can read for q and
 * k (and v, the mask, the packed offsets and the sinks, when given) lies inside its registered
 * buffer: [offset, offset + extent * dtype size)
 * within [0, size), computed with overflow checks from the shape and strides. Otherwise it returns
 * the Ack code (UNKNOWN_BUFFER, OUT_OF_BOUNDS, BAD_REQUEST, UNSUPPORTED) and a message naming the
 * field. Pure: no allocation except the cu_seqlens copies, no I/O.
 *
 * Stage: validate, called by the push (push.c) with the client's buffers behind a lookup function,
 * and by the GPU worker for the real-size check. Includes proto/ (generated code) and kernels/
 * (stats.h) only. */
#ifndef ATTNSTAT_VALIDATE_H
#define ATTNSTAT_VALIDATE_H

#include <stddef.h>
#include <stdint.h>

#include "attnstat.pb-c.h"
#include "stats.h"
#include "vocab.h"

/* Limits on one push, beyond what the buffers' sizes imply. */
#define VALIDATE_MAX_HEADS 4096      /* Hq, Hkv: bounds the per-push result (Ack, store batch) */
#define VALIDATE_MAX_DIM 0x7fffffffu /* B, N: the stats API counts in int32 */
#define VALIDATE_MAX_LEN ((uint64_t)STATS_MAX_LEN) /* N of q and k (stats.h says why) */
#define VALIDATE_MAX_SEQS 65536      /* packed sequences */
#define VALIDATE_MAX_LAYER 1048575u  /* Push.layer: the store and the alerts keep it in int32 */

/* What validation needs to know about a registered buffer. */
typedef struct {
    int kind;            /* ATTNSTAT__BUFFER_KIND__HOST_SHM, ... */
    uint64_t size;       /* bytes (registered) */
    const void *base;    /* readable mapping of [0, size) (host buffers); NULL for device buffers */
    int device;          /* CUDA_IPC: the daemon's index of the buffer's device; -1 for host */
} validate_buffer;

/* Looks a buffer id up in the client's registrations; NULL when not registered. */
typedef const validate_buffer *(*validate_lookup_fn)(void *ctx, uint32_t id);

typedef struct {
    uint64_t max_push_work;     /* B * Hq * sampled rows * Nk * D, for the CPU worker */
    uint64_t max_push_work_gpu; /* the same, for a GPU worker (device buffers) */
    float collapse_threshold;   /* goes into the problem */
} validate_limits;

/* The tensors of a push, in plan order: q, k, then those present of v, the mask, the packed
 * offsets and the attention sinks (validate_plan's index fields say where each is). */
#define VALIDATE_MAX_TENSORS 7

typedef struct {
    stats_problem prob;              /* ready for stats_cpu (tensors resolved) */
    int32_t *cu_q, *cu_k;            /* copies owned by the plan (prob points at them) */
    uint32_t buffer_id[VALIDATE_MAX_TENSORS];  /* q, k, then v, mask, cu_q, cu_k, sinks when
                                                  present */
    uint64_t need_bytes[VALIDATE_MAX_TENSORS]; /* bytes of each buffer it reaches (offset + span) */
    uint64_t offset[VALIDATE_MAX_TENSORS];     /* each tensor's byte offset in its buffer */
    int kind;                        /* of every buffer of the push (one kind per push) */
    int device;                      /* CUDA_IPC: the device index of every buffer; -1 for host */
    int ntensors;                    /* 2 .. VALIDATE_MAX_TENSORS */
    int mask_index;                  /* where the mask is in the lists above; -1: none */
    int cu_index;                    /* device packed offsets: cu_q there, cu_k next; -1: none */
    int sinks_index;                 /* where the attention sinks are; -1: none */
    uint64_t work;                   /* multiply-adds */
} validate_plan;

/* A Computed message (per-head statistics a client computed in its own process): 1 to
 * VALIDATE_MAX_HEADS heads in order 0..n-1, a layer up to VALIDATE_MAX_LAYER, counts that agree
 * (rows_norm <= rows), every statistic of vocab.h's VOCAB_STATS within its row's lo and hi where
 * given (inclusive; a value past a bound by rounding only, 1e-6 of it, is taken as the bound).
 * Into out[n] (n = m->n_heads, checked first: out must hold VALIDATE_MAX_HEADS) as the kernels
 * give them: a statistic not given (or NaN) takes its row's `absent` value (NaN; collapsed_frac
 * 0; max_logit -inf for a head without rows, else NaN). OK, or BAD_REQUEST with msg. */
Attnstat__Code validate_computed(const Attnstat__Computed *m, stats_head *out, char *msg,
                                 size_t msglen);

/* Returns ATTNSTAT__CODE__OK with *plan filled (free with validate_plan_free), or an error code
 * with msg set (plan left empty). The problem's want is the Push's stats (0 when unset: the
 * defaults); a stats bit past vocab.h's rows is BAD_REQUEST. */
Attnstat__Code validate_push(const Attnstat__Push *push, validate_lookup_fn lookup, void *ctx,
                             const validate_limits *lim, validate_plan *plan, char *msg,
                             size_t msglen);
void validate_plan_free(validate_plan *plan);

/* Device buffers: the problem's q/k pointers are placeholders until the GPU worker has opened the
 * buffers; it then checks each tensor again against the allocation it really opened:
 * need (offset + span) must lie within both the registered size and real, the size of the opened
 * allocation (cuMemGetAddressRange). Returns OK or OUT_OF_BOUNDS with msg naming the tensor. */
Attnstat__Code validate_device_span(const char *name, uint64_t need, uint64_t registered,
                                    uint64_t real, char *msg, size_t msglen);

/* Checks a shm segment name: "/name", 2..255 bytes, no other '/'. Returns 0 or -1 with msg set. */
int validate_shm_name(const char *name, char *msg, size_t msglen);

/* Checks Hello thresholds (each field that is set). Returns 0 or -1 with msg naming the field. */
int validate_thresholds(const Attnstat__Thresholds *t, char *msg, size_t msglen);

/* An Intervention (what a job did to its model: qk_clip's scaled heads), field by field: kind 1..
 * VALIDATE_INTERVENTION_KIND_MAX of [a-z0-9_.-]; step >= 0; layer, when set, up to
 * VALIDATE_MAX_LAYER; at most VALIDATE_MAX_HEADS heads, each < VALIDATE_INTERVENTION_HEAD_LIMIT;
 * values none or one per head, each finite; threshold and measured finite when set; detail at most
 * VALIDATE_INTERVENTION_DETAIL_MAX bytes (a NUL in any string never gets here: frame_decode
 * refuses the frame). Returns 0, or -1 with msg naming the field and what it may be. */
#define VALIDATE_INTERVENTION_KIND_MAX VOCAB_INTERVENTION_KIND_MAX
#define VALIDATE_INTERVENTION_HEAD_LIMIT VOCAB_INTERVENTION_HEAD_LIMIT
#define VALIDATE_INTERVENTION_DETAIL_MAX VOCAB_INTERVENTION_DETAIL_MAX
int validate_intervention(const Attnstat__Intervention *m, char *msg, size_t msglen);

#endif /* ATTNSTAT_VALIDATE_H */
