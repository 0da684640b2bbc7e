/* push.c — libattnstat's pushes: the checks of a push's arguments and the Push message (host
 * tensors copied into the host ring, CUDA tensors through gpu_export.c). attnstat_push and
 * attnstat_push_ex are declared in include/attnstat.h.
 *
 * What it promises: a push never waits; a push that fails after taking ring space gives it back
 * at once and keeps its seq, so no two blocks ever share one.
 *
 * How a push stays non-blocking: the link is moved on first (replies already received are
 * processed, their Releases freeing ring space; a reconnection takes its next step), the tensors
 * are copied into a ring block, and the Push frame is handed to conn_send, which writes what the
 * socket takes and queues the rest within a bound. A push that finds the link not up, no ring
 * block, no in-flight slot or no queue room is dropped and counted.
 *
 * CUDA tensors go through gpu_export.c (zero-copy by IPC handle, or staged on the device); the
 * push's in-flight slot keeps what it holds (event, staging block, exported allocations) until
 * replies.c releases it.
 *
 * In local mode (attnstat_set_local_compute) CUDA pushes go to local.c instead: computed in this
 * process, their results sent when done.
 *
 * Stage: the sending end of a push. Calls link.c (is the link up; the connection lost), conn.c,
 * gather.c, ring.c, gpu_export.c, local.c and util.c. */
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "client_internal.h"
#include "envelope.h"
#include "conn.h"
#include "gather.h"
#include "link.h"
#include "local.h"

/* The tensors of one push, in the order the Push message and the GPU path take them: q, k, then
 * those present of v, the mask, the device packed offsets (cu_q, cu_k) and the sinks. */
typedef struct {
    const attnstat_tensor *t[GPU_MAX_TENSORS];
    const char *name[GPU_MAX_TENSORS];
    int nt;
    int iv, imask, icu, isinks; /* where v, the mask, cu_q and the sinks are in t[]; -1: absent */
    int32_t compute_dtype;     /* -1: not sent */
    int32_t stream_waits;      /* local mode: the caller's stream waits for the computation */
    uint32_t stats;            /* the statistics asked for (ATTNSTAT_STATS_*); 0: the defaults */
    double *max_logit_out;     /* local mode: each head's max logit, on the device */
} push_set;

static void push_set_add(push_set *s, const attnstat_tensor *t, const char *name, int *index)
{
    if (!t)
        return;
    if (index)
        *index = s->nt;
    s->t[s->nt] = t;
    s->name[s->nt++] = name;
}

/* ---- Checks ----------------------------------------------------------------------------------- */
static attnstat_code push_check_tensor(attnstat_client *c, const attnstat_tensor *t,
                                         const char *name)
{
    if (!t)
        return client_fail(c, ATTNSTAT_EINVAL, "%s is NULL", name);
    if (t->mem != ATTNSTAT_MEM_HOST && t->mem != ATTNSTAT_MEM_CUDA)
        return client_fail(c, ATTNSTAT_EINVAL, "%s has an unknown memory kind %d", name, t->mem);
    if (attnstat_dtype_size((attnstat_dtype)t->dtype) == 0)
        return client_fail(c, ATTNSTAT_EINVAL, "%s has an unknown dtype %d (f32=0, f16=1, bf16=2)",
                           name, t->dtype);
    if (!t->data)
        return client_fail(c, ATTNSTAT_EINVAL, "%s has a NULL data pointer", name);
    static const char dims[] = "BHND";
    for (int i = 0; i < 4; i++) {
        if (t->shape[i] < 1 || t->shape[i] > INT32_MAX)
            return client_fail(c, ATTNSTAT_EINVAL, "%s shape[%d] (%c) is %lld: must be 1..%d", name,
                               i, dims[i], (long long)t->shape[i], INT32_MAX);
        if (t->strides[i] < 0)
            return client_fail(c, ATTNSTAT_EINVAL, "%s strides[%d] (%c) is negative (%lld)", name,
                               i, dims[i], (long long)t->strides[i]);
    }
    if (t->strides[3] != 1)
        return client_fail(c, ATTNSTAT_EINVAL,
                           "%s strides[3] is %lld: the head dimension D must be contiguous (1)",
                           name, (long long)t->strides[3]);
    return ATTNSTAT_OK;
}

/* The top of the largest user address space of a 64-bit Linux (x86-64 with 5-level paging: 2^56,
 * arm64: 2^52), with room to spare; a 32-bit system's is its pointers' own range. */
#define PUSH_ADDR_TOP (UINTPTR_MAX > 0xffffffffu ? (uint64_t)1 << 57 : (uint64_t)UINTPTR_MAX)

/* Every tensor of the push (q, k, v, the mask, offsets, sinks): the bytes its shape and strides
 * reach from its data pointer must lie in the address space, or reading it would fault (a stride
 * of 2^60 elements) or wrap around. Caught here, the caller gets EINVAL, not a crash. */
static attnstat_code push_check_extents(attnstat_client *c, const push_set *set)
{
    for (int i = 0; i < set->nt; i++) {
        const attnstat_tensor *t = set->t[i];
        uint64_t bytes = 0, at = (uint64_t)(uintptr_t)t->data;
        int bad = gather_extent(t->shape, t->strides, attnstat_dtype_size((attnstat_dtype)t->dtype),
                                &bytes) != 0;
        if (!bad && at <= PUSH_ADDR_TOP && bytes <= PUSH_ADDR_TOP - at)
            continue;
        char reach[40] = "more than 2^64 bytes";
        if (!bad)
            snprintf(reach, sizeof reach, "%llu bytes", (unsigned long long)bytes);
        return client_fail(c, ATTNSTAT_EINVAL,
                           "%s: shape [%lld, %lld, %lld, %lld] with strides [%lld, %lld, %lld, "
                           "%lld] spans %s from its data pointer %p, beyond the address space: a "
                           "stride or a shape is wrong", set->name[i], (long long)t->shape[0],
                           (long long)t->shape[1], (long long)t->shape[2], (long long)t->shape[3],
                           (long long)t->strides[0], (long long)t->strides[1],
                           (long long)t->strides[2], (long long)t->strides[3], reach, t->data);
    }
    return ATTNSTAT_OK;
}

static attnstat_code push_check_push(attnstat_client *c, const attnstat_push_opts *o,
                                       const attnstat_tensor *q, const attnstat_tensor *k,
                                       const attnstat_tensor *v)
{
    attnstat_code rc;
    if (!o)
        return client_fail(c, ATTNSTAT_EINVAL, "push options are NULL");
    if ((rc = push_check_tensor(c, q, "q")) || (rc = push_check_tensor(c, k, "k")))
        return rc;
    if (v && (rc = push_check_tensor(c, v, "v")))
        return rc;
    if (k->mem != q->mem || (v && v->mem != q->mem))
        return client_fail(c, ATTNSTAT_ENOTSUP,
                           "q is %s memory but %s is %s memory: the tensors of one push must be all "
                           "in CUDA memory or all in host memory",
                           q->mem == ATTNSTAT_MEM_CUDA ? "CUDA" : "host", k->mem != q->mem ? "k" : "v",
                           q->mem == ATTNSTAT_MEM_CUDA ? "host" : "CUDA");
    if (q->dtype != k->dtype)
        return client_fail(c, ATTNSTAT_EINVAL, "q and k have different dtypes (%d and %d)",
                           q->dtype, k->dtype);
    if (q->shape[0] != k->shape[0])
        return client_fail(c, ATTNSTAT_EINVAL, "q and k batch sizes differ (%lld and %lld)",
                           (long long)q->shape[0], (long long)k->shape[0]);
    if (q->shape[3] != k->shape[3])
        return client_fail(c, ATTNSTAT_EINVAL, "q and k head dimensions differ (%lld and %lld)",
                           (long long)q->shape[3], (long long)k->shape[3]);
    if (q->shape[1] % k->shape[1] != 0)
        return client_fail(c, ATTNSTAT_EINVAL,
                           "q heads (%lld) are not a multiple of k heads (%lld)",
                           (long long)q->shape[1], (long long)k->shape[1]);
    if (v && (v->shape[0] != k->shape[0] || v->shape[1] != k->shape[1] ||
              v->shape[2] != k->shape[2]))
        return client_fail(c, ATTNSTAT_EINVAL, "v's B, H and N must equal k's");
    if (o->causal != 0 && o->causal != 1)
        return client_fail(c, ATTNSTAT_EINVAL, "causal is %d: must be 0 or 1", o->causal);
    if (o->causal && o->window_right > 0)
        return client_fail(c, ATTNSTAT_EINVAL,
                           "causal with window_right %d > 0 contradicts itself", o->window_right);
    if (!isfinite(o->scale) || o->scale < 0 || !isfinite(o->softcap) || o->softcap < 0)
        return client_fail(c, ATTNSTAT_EINVAL, "scale and softcap must be finite and >= 0");
    if (o->sample_every > 1 && o->sample_rows > 0)
        return client_fail(c, ATTNSTAT_EINVAL, "sample_every and sample_rows are exclusive");
    if (!o->cu_seqlens_q != !o->cu_seqlens_k)
        return client_fail(c, ATTNSTAT_EINVAL, "cu_seqlens_q and cu_seqlens_k go together");
    if (o->cu_seqlens_q) {
        if (o->n_seqs < 1 || o->n_seqs > 1000000)
            return client_fail(c, ATTNSTAT_EINVAL, "n_seqs is %d: must be 1..1000000", o->n_seqs);
        if (q->shape[0] != 1)
            return client_fail(c, ATTNSTAT_EINVAL, "packed sequences need batch 1 (q has %lld)",
                               (long long)q->shape[0]);
        const int32_t *cu[2] = {o->cu_seqlens_q, o->cu_seqlens_k};
        const int64_t total[2] = {q->shape[2], k->shape[2]};
        for (int s = 0; s < 2; s++) {
            if (cu[s][0] != 0 || cu[s][o->n_seqs] != total[s])
                return client_fail(c, ATTNSTAT_EINVAL,
                                   "cu_seqlens_%c must start at 0 and end at %lld (N of %c)",
                                   s ? 'k' : 'q', (long long)total[s], s ? 'k' : 'q');
            for (int32_t i = 0; i < o->n_seqs; i++)
                if (cu[s][i + 1] < cu[s][i])
                    return client_fail(c, ATTNSTAT_EINVAL, "cu_seqlens_%c decreases at %d",
                                       s ? 'k' : 'q', i + 1);
        }
    }
    return ATTNSTAT_OK;
}

/* ---- The Push message ------------------------------------------------------------------------- */
/* One tensor of a Push: its buffer and offset, dtype, shape, and the strides the daemon reads it
 * with (those of the copy in the ring, or the caller's own for CUDA memory). */
static void push_ref(Attnstat__TensorRef *r, uint64_t shape[4], uint64_t strides[4],
                     const attnstat_tensor *t, uint32_t buffer_id, uint64_t off,
                     const int64_t src_strides[4])
{
    attnstat__tensor_ref__init(r);
    r->buffer_id = buffer_id;
    r->offset = off;
    r->dtype = (Attnstat__Dtype)t->dtype;
    for (int i = 0; i < 4; i++) {
        shape[i] = (uint64_t)t->shape[i];
        strides[i] = (uint64_t)src_strides[i];
    }
    r->n_shape = 4;
    r->shape = shape;
    r->n_strides = 4;
    r->strides = strides;
}

static attnstat_code push_drop(attnstat_client *c, int ring_full)
{
    c->st.dropped_local++;
    if (ring_full)
        c->st.dropped_ring++;
    else
        c->st.dropped_queue++;
    return client_fail(c, ATTNSTAT_DROPPED, "push dropped: %s",
                       ring_full ? "no room in the shared-memory ring (the daemon has not "
                                   "released earlier pushes yet)"
                                 : "the outgoing queue is full (the daemon is not reading)");
}

static uint64_t push_align(uint64_t n)
{
    return (n + RING_ALIGN - 1) / RING_ALIGN * RING_ALIGN;
}

/* The Push fields that come from the options. */
static void push_fill(Attnstat__Push *p, const attnstat_push_opts *o)
{
    p->has_causal = o->causal != 0;
    p->causal = o->causal != 0;
    p->has_window_left = o->window_left >= 0;
    p->window_left = o->window_left;
    p->has_window_right = o->window_right >= 0;
    p->window_right = o->window_right;
    p->has_softcap = o->softcap != 0;
    p->softcap = o->softcap;
    p->has_scale = o->scale != 0;
    p->scale = o->scale;
    if (o->cu_seqlens_q) {
        p->n_cu_seqlens_q = p->n_cu_seqlens_k = (size_t)o->n_seqs + 1;
        p->cu_seqlens_q = (int32_t *)o->cu_seqlens_q;
        p->cu_seqlens_k = (int32_t *)o->cu_seqlens_k;
    }
    p->has_sample_every = o->sample_every > 1;
    p->sample_every = o->sample_every;
    p->has_sample_rows = o->sample_rows > 0;
    p->sample_rows = o->sample_rows;
    p->has_sample_seed = o->sample_rows > 0;
    p->sample_seed = o->sample_seed;
    p->has_want_results = o->want_results != 0;
    p->want_results = o->want_results != 0;
}

/* How gpu_export.c sends its control frames (RegisterBuffer, RegisterEvent, Forget), in order
 * before the Push that needs them: never dropped. */
static attnstat_code push_emit(void *ctx, const Attnstat__Envelope *env)
{
    return conn_send(ctx, env, 0);
}

/* Sends the Push of seq naming the set's tensors (refs, in the set's order) and, for CUDA tensors,
 * the event the daemon waits for. Droppable: refused with ATTNSTAT_DROPPED when the outgoing queue
 * is over its bound. */
static attnstat_code push_send(attnstat_client *c, const attnstat_push_opts *o, uint64_t seq,
                               const push_set *set, Attnstat__TensorRef *refs, int has_event,
                               uint32_t event_id)
{
    Attnstat__Push p;
    Attnstat__Envelope env;
    envelope_push(&env, &p, seq, o->step, o->layer, &refs[0], &refs[1]);
    push_fill(&p, o);
    p.v = set->iv >= 0 ? &refs[set->iv] : NULL;
    p.mask = set->imask >= 0 ? &refs[set->imask] : NULL;
    if (set->icu >= 0) {
        p.cu_seqlens_q_ref = &refs[set->icu];
        p.cu_seqlens_k_ref = &refs[set->icu + 1];
    }
    p.sinks = set->isinks >= 0 ? &refs[set->isinks] : NULL;
    p.has_stats = set->stats != 0;
    p.stats = set->stats;
    p.has_compute_dtype = set->compute_dtype >= 0;
    p.compute_dtype = set->compute_dtype >= 0 ? (Attnstat__Dtype)set->compute_dtype
                                              : ATTNSTAT__DTYPE__F32;
    p.has_event_id = has_event;
    p.event_id = event_id;
    return conn_send(c, &env, 1);
}

/* A push that conn_send refused (its ring space or GPU resources already given back): counted,
 * and the connection's loss handled (the pushes in flight abandoned; the library reconnects). */
static attnstat_code push_unsent(attnstat_client *c, attnstat_code rc)
{
    if (rc == ATTNSTAT_DROPPED)
        return push_drop(c, 0);
    if (rc == ATTNSTAT_ECLOSED) {
        link_lost(c);
        return link_drop(c);
    }
    c->st.dropped_local++;
    return rc;
}

/* The push went out: its slot keeps it (and what it holds of the GPU path, gh) until replies.c
 * releases it. held: the daemon reads the caller's own memory. */
static void push_sent(attnstat_client *c, client_inflight *slot, const attnstat_push_opts *o,
                      uint64_t seq, int held, const gpu_hold *gh)
{
    slot->seq = seq;
    slot->step = o->step;
    slot->layer = o->layer;
    slot->held = (uint8_t)(held != 0);
    slot->released = 0;
    if (gh)
        slot->gh = *gh;
    else
        slot->gh.dev = -1;
    c->st.sent++;
    c->st.in_flight++;
}

/* ---- Host tensors: a compact copy into the ring ----------------------------------------------- */
static attnstat_code push_host(attnstat_client *c, const attnstat_push_opts *o,
                               const push_set *set, uint64_t seq, client_inflight *slot)
{
    const attnstat_tensor *const *ts = set->t;
    const int nt = set->nt;
    gather_plan plans[GPU_MAX_TENSORS];
    uint64_t offs[GPU_MAX_TENSORS] = {0}, total = 0;
    for (int i = 0; i < nt; i++) {
        size_t es = attnstat_dtype_size((attnstat_dtype)ts[i]->dtype);
        if (gather_make_plan(ts[i]->shape, ts[i]->strides, es, &plans[i]) != 0 ||
            plans[i].bytes > c->ring_bytes)
            return client_fail(c, ATTNSTAT_EINVAL,
                               "%s is too large for the %llu-byte ring (raise ring_bytes or "
                               "sample fewer rows)", set->name[i],
                               (unsigned long long)c->ring_bytes);
        offs[i] = total;
        total += push_align(plans[i].bytes);
    }
    if (total > c->ring_bytes)
        return client_fail(c, ATTNSTAT_EINVAL,
                           "the push's tensors need %llu bytes, more than the %llu-byte ring "
                           "(raise ring_bytes)", (unsigned long long)total,
                           (unsigned long long)c->ring_bytes);
    uint64_t base;
    int ar = ring_alloc(&c->ring, total, seq, &base);
    if (ar == 1)
        return push_drop(c, 1);
    if (ar < 0)
        return client_fail(c, ATTNSTAT_ENOMEM, "out of memory for ring bookkeeping");
    for (int i = 0; i < nt; i++) {
        offs[i] += base;
        gather_copy(c->map + offs[i], ts[i]->data, ts[i]->shape, ts[i]->strides,
                    attnstat_dtype_size((attnstat_dtype)ts[i]->dtype), &plans[i]);
    }
    Attnstat__TensorRef refs[GPU_MAX_TENSORS];
    uint64_t shapes[GPU_MAX_TENSORS][4], strides[GPU_MAX_TENSORS][4];
    for (int i = 0; i < nt; i++)
        push_ref(&refs[i], shapes[i], strides[i], ts[i], CLIENT_RING_ID, offs[i],
                 plans[i].strides);
    attnstat_code rc = push_send(c, o, seq, set, refs, 0, 0);
    if (rc != ATTNSTAT_OK) {
        if (ring_abort_last(&c->ring, seq) != 0) /* its space is free again at once */
            ring_release(&c->ring, seq);
        return push_unsent(c, rc);
    }
    push_sent(c, slot, o, seq, 0, NULL);
    return ATTNSTAT_OK;
}

/* ---- CUDA tensors: gpu_export.c resolves them (zero-copy or staged) and records the event ----- */
static attnstat_code push_cuda(attnstat_client *c, const attnstat_push_opts *o,
                               const push_set *set, uint64_t seq, client_inflight *slot,
                               uint64_t *seq_out)
{
    const attnstat_tensor *const *ts = set->t;
    const int nt = set->nt;
    gpu_loc loc[GPU_MAX_TENSORS];
    gpu_hold gh;
    uint32_t event_id = 0;
    int zero_copy = 0;
    attnstat_code rc = gpu_prepare(c->gpu, ts, set->name, nt, o->cuda_stream, seq, push_emit, c,
                                   loc, &event_id, &gh, &zero_copy, &c->st, c->err,
                                   sizeof c->err);
    if (rc != ATTNSTAT_OK) {
        if (rc == ATTNSTAT_ECLOSED) { /* a registration found the connection gone */
            link_lost(c);
            return link_drop(c);
        }
        if (rc == ATTNSTAT_DROPPED)
            c->st.dropped_local++;
        return rc;
    }
    Attnstat__TensorRef refs[GPU_MAX_TENSORS];
    uint64_t shapes[GPU_MAX_TENSORS][4], strides[GPU_MAX_TENSORS][4];
    for (int i = 0; i < nt; i++)
        push_ref(&refs[i], shapes[i], strides[i], ts[i], loc[i].buffer_id, loc[i].offset,
                 ts[i]->strides);
    rc = push_send(c, o, seq, set, refs, 1, event_id);
    if (rc != ATTNSTAT_OK) {
        gpu_release(c->gpu, seq, &gh);
        if (zero_copy)
            c->st.cuda_zero_copy--;
        else
            c->st.cuda_staged--;
        return push_unsent(c, rc);
    }
    push_sent(c, slot, o, seq, zero_copy, &gh);
    if (zero_copy) {
        c->st.releases_pending++;
        if (seq_out)
            *seq_out = seq;
    }
    return ATTNSTAT_OK;
}

/* ---- The calls -------------------------------------------------------------------------------- */
attnstat_code attnstat_push(attnstat_client *c, const attnstat_push_opts *o,
                            const attnstat_tensor *q, const attnstat_tensor *k,
                            const attnstat_tensor *v)
{
    return attnstat_push_ex(c, o, q, k, v, NULL);
}

attnstat_code attnstat_push_ex(attnstat_client *c, const attnstat_push_opts *o,
                               const attnstat_tensor *q, const attnstat_tensor *k,
                               const attnstat_tensor *v, uint64_t *seq_out)
{
    return attnstat_push2(c, o, NULL, q, k, v, seq_out);
}

void attnstat_push_ext_init(attnstat_push_ext *e)
{
    memset(e, 0, sizeof *e);
    e->size = (uint32_t)sizeof *e;
    e->compute_dtype = -1;
}

/* attnstat_push_ext as it was before sinks, before stream_waits and before stats: a caller built
 * against that attnstat.h passes a size under the field's end, and its push has no sinks (does not
 * wait, asks for the defaults). The struct before stats ended at stream_waits (its size, padded,
 * is reserved2's end on 64-bit systems: reserved2 keeps stats past it). */
#define PUSH_EXT_SIZE_V1 offsetof(attnstat_push_ext, sinks)
#define PUSH_EXT_SIZE_V2 offsetof(attnstat_push_ext, stream_waits)
#define PUSH_EXT_SIZE_V3 offsetof(attnstat_push_ext, reserved2)
#define PUSH_EXT_SIZE_V4 (offsetof(attnstat_push_ext, stats) + sizeof(uint32_t))
#define PUSH_EXT_SIZE_V5 (offsetof(attnstat_push_ext, max_logit_out) + sizeof(double *))
_Static_assert(PUSH_EXT_SIZE_V4 > (PUSH_EXT_SIZE_V3 + _Alignof(void *) - 1) / _Alignof(void *) *
                                      _Alignof(void *),
               "stats lies past the end of the struct before it, its tail padding included");
_Static_assert(offsetof(attnstat_push_ext, max_logit_out) >=
                   (PUSH_EXT_SIZE_V4 + _Alignof(void *) - 1) / _Alignof(void *) * _Alignof(void *),
               "max_logit_out lies past the end of the struct before it, its tail padding "
               "included");

/* The sinks' checks: [1, Hq, 1, 1] of a floating-point dtype in q's memory, contiguous along the
 * heads in CUDA memory (the daemon and local mode read them in place), a daemon that takes them. */
static attnstat_code push_check_sinks(attnstat_client *c, const attnstat_tensor *s,
                                      const attnstat_tensor *q)
{
    if (s->mem != q->mem)
        return client_fail(c, ATTNSTAT_EINVAL, "the sinks are in %s memory but q in %s memory",
                           s->mem == ATTNSTAT_MEM_CUDA ? "CUDA" : "host",
                           q->mem == ATTNSTAT_MEM_CUDA ? "CUDA" : "host");
    if (s->dtype != ATTNSTAT_F32 && s->dtype != ATTNSTAT_F16 && s->dtype != ATTNSTAT_BF16)
        return client_fail(c, ATTNSTAT_EINVAL, "the sinks' dtype %d is not ATTNSTAT_F32, F16 or "
                           "BF16", s->dtype);
    if (!s->data)
        return client_fail(c, ATTNSTAT_EINVAL, "the sinks have a NULL data pointer");
    if (s->shape[0] != 1 || s->shape[1] != q->shape[1] || s->shape[2] != 1 || s->shape[3] != 1)
        return client_fail(c, ATTNSTAT_EINVAL, "the sinks' shape is [%lld, %lld, %lld, %lld]: it "
                           "must be [1, Hq, 1, 1], one sink per query head (Hq = %lld)",
                           (long long)s->shape[0], (long long)s->shape[1], (long long)s->shape[2],
                           (long long)s->shape[3], (long long)q->shape[1]);
    if (s->strides[1] < 0)
        return client_fail(c, ATTNSTAT_EINVAL, "the sinks' strides[1] is negative");
    if (s->mem == ATTNSTAT_MEM_CUDA && s->shape[1] > 1 && s->strides[1] != 1)
        return client_fail(c, ATTNSTAT_EINVAL, "the sinks' strides[1] is %lld: CUDA sinks must be "
                           "contiguous along the heads (stride 1); make them contiguous first",
                           (long long)s->strides[1]);
    if (!(c->features & CLIENT_FEATURE_SINKS))
        return client_fail(c, ATTNSTAT_ENOTSUP, "this attnstatd takes no attention sinks (its "
                           "HelloReply does not list \"sinks\"): upgrade the daemon");
    return ATTNSTAT_OK;
}

/* The extension's checks; fills set's mask, offsets, sinks and compute dtype. */
static attnstat_code push_check_ext(attnstat_client *c, const attnstat_push_opts *o,
                                    const attnstat_push_ext *e, const attnstat_tensor *q,
                                    const attnstat_tensor *k, push_set *set)
{
    if (!e)
        return ATTNSTAT_OK;
    if (e->size < PUSH_EXT_SIZE_V1)
        return client_fail(c, ATTNSTAT_EINVAL, "attnstat_push_ext.size is %u, not %zu: initialise "
                           "it with attnstat_push_ext_init", e->size, sizeof *e);
    /* the fields a caller's attnstat.h had: sinks, stream_waits and stats only where its struct
     * holds them */
    const attnstat_tensor *sinks = e->size >= PUSH_EXT_SIZE_V2 ? e->sinks : NULL;
    const int32_t waits = e->size >= PUSH_EXT_SIZE_V3 ? e->stream_waits : 0;
    const uint32_t stats = e->size >= PUSH_EXT_SIZE_V4 ? e->stats : 0;
    double *max_out = e->size >= PUSH_EXT_SIZE_V5 ? e->max_logit_out : NULL;
    if (stats & ~(uint32_t)ATTNSTAT_STATS_ALL)
        return client_fail(c, ATTNSTAT_EINVAL, "stats 0x%x asks for statistics that do not exist "
                           "(bits 0x%x): an OR of ATTNSTAT_STATS_* (ATTNSTAT_STATS_ALL is "
                           "0x%x), or 0 for the defaults", stats,
                           stats & ~(uint32_t)ATTNSTAT_STATS_ALL, (unsigned)ATTNSTAT_STATS_ALL);
    if (max_out && stats && !(stats & ATTNSTAT_STATS_MAX_LOGIT))
        return client_fail(c, ATTNSTAT_EINVAL, "max_logit_out is set but stats 0x%x does not ask "
                           "for the max logit (ATTNSTAT_STATS_MAX_LOGIT)", stats);
    if (stats != 0 && stats != ATTNSTAT_STATS_DEFAULT && !(c->features & CLIENT_FEATURE_STATS))
        return client_fail(c, ATTNSTAT_ENOTSUP, "this attnstatd takes no choice of statistics (its "
                           "HelloReply does not list \"stats\"), and would compute the defaults "
                           "instead of stats 0x%x: upgrade the daemon", stats);
    set->stats = stats;
    if (waits != 0 && waits != 1)
        return client_fail(c, ATTNSTAT_EINVAL, "stream_waits is %d: 0 or 1", waits);
    if (waits && (q->mem != ATTNSTAT_MEM_CUDA || !c->local_on))
        return client_fail(c, ATTNSTAT_EINVAL, "stream_waits is for CUDA tensors in local mode "
                           "(attnstat_set_local_compute): %s", q->mem != ATTNSTAT_MEM_CUDA
                               ? "these are in host memory"
                               : "attnstatd computes this push, and a stream cannot wait for "
                                 "another process's work; keep the tensors (or copies) until "
                                 "their release");
    set->stream_waits = waits;
    if (max_out && (q->mem != ATTNSTAT_MEM_CUDA || !c->local_on))
        return client_fail(c, ATTNSTAT_EINVAL, "max_logit_out is for CUDA tensors in local mode "
                           "(attnstat_set_local_compute): %s", q->mem != ATTNSTAT_MEM_CUDA
                               ? "these are in host memory"
                               : "attnstatd computes this push; its max logits come back with "
                                 "the results (attnstat_set_result_callback)");
    set->max_logit_out = max_out;
    if (e->compute_dtype != -1 && e->compute_dtype != ATTNSTAT_F32 &&
        e->compute_dtype != ATTNSTAT_F16 && e->compute_dtype != ATTNSTAT_BF16)
        return client_fail(c, ATTNSTAT_EINVAL, "compute_dtype %d is not -1, ATTNSTAT_F32, F16 or "
                           "BF16", e->compute_dtype);
    set->compute_dtype = e->compute_dtype;
    const attnstat_tensor *m = e->mask;
    if (m) {
        if (m->mem != q->mem)
            return client_fail(c, ATTNSTAT_EINVAL, "the mask is in %s memory but q in %s memory",
                               m->mem == ATTNSTAT_MEM_CUDA ? "CUDA" : "host",
                               q->mem == ATTNSTAT_MEM_CUDA ? "CUDA" : "host");
        if (m->dtype != ATTNSTAT_BOOL && m->dtype != ATTNSTAT_F32 && m->dtype != ATTNSTAT_F16 &&
            m->dtype != ATTNSTAT_BF16)
            return client_fail(c, ATTNSTAT_EINVAL, "the mask's dtype %d is not ATTNSTAT_BOOL, "
                               "F32, F16 or BF16", m->dtype);
        if (!m->data)
            return client_fail(c, ATTNSTAT_EINVAL, "the mask has a NULL data pointer");
        const int64_t want[4] = {q->shape[0], q->shape[1], q->shape[2], k->shape[2]};
        for (int i = 0; i < 4; i++) {
            if (m->shape[i] != want[i] && !(i < 3 && m->shape[i] == 1))
                return client_fail(c, ATTNSTAT_EINVAL,
                                   "the mask's shape[%d] is %lld: it must be %lld%s", i,
                                   (long long)m->shape[i], (long long)want[i],
                                   i < 3 ? " or 1 (broadcast)" : " (Nk)");
            if (m->strides[i] < 0)
                return client_fail(c, ATTNSTAT_EINVAL, "the mask's strides[%d] is negative", i);
        }
        if (m->shape[3] > 1 && m->strides[3] != 1)
            return client_fail(c, ATTNSTAT_EINVAL, "the mask's last dimension (keys) must be "
                               "contiguous (strides[3] = 1, not %lld)", (long long)m->strides[3]);
        if (o->cu_seqlens_q || e->cu_seqlens_q)
            return client_fail(c, ATTNSTAT_EINVAL, "a mask does not combine with packed "
                               "sequences");
        if (!(c->features & CLIENT_FEATURE_MASK))
            return client_fail(c, ATTNSTAT_ENOTSUP, "this attnstatd takes no masks (its "
                               "HelloReply does not list \"mask\"): upgrade the daemon");
        push_set_add(set, m, "mask", &set->imask);
    }
    if (!e->cu_seqlens_q != !e->cu_seqlens_k)
        return client_fail(c, ATTNSTAT_EINVAL, "ext cu_seqlens_q and cu_seqlens_k go together");
    if (e->cu_seqlens_q) {
        const attnstat_tensor *cu[2] = {e->cu_seqlens_q, e->cu_seqlens_k};
        if (o->cu_seqlens_q)
            return client_fail(c, ATTNSTAT_EINVAL, "packed offsets either in opts (host) or in "
                               "ext (CUDA), not both");
        for (int i = 0; i < 2; i++) {
            const attnstat_tensor *t = cu[i];
            if (t->mem != ATTNSTAT_MEM_CUDA || q->mem != ATTNSTAT_MEM_CUDA)
                return client_fail(c, ATTNSTAT_EINVAL, "ext cu_seqlens are for CUDA tensors; "
                                   "give host offsets in opts->cu_seqlens_*");
            if (t->dtype != ATTNSTAT_I32 || !t->data || t->shape[0] != 1 || t->shape[1] != 1 ||
                t->shape[3] != 1 || t->shape[2] < 2 || t->strides[2] < 0)
                return client_fail(c, ATTNSTAT_EINVAL, "ext cu_seqlens_%c must be an int32 "
                                   "tensor of shape [1, 1, n_seqs + 1, 1]", i ? 'k' : 'q');
            if (t->strides[2] != 1)
                return client_fail(c, ATTNSTAT_EINVAL, "ext cu_seqlens_%c must be contiguous "
                                   "(strides[2] = 1, not %lld): the kernels read n_seqs + 1 "
                                   "consecutive entries; pass cu_seqlens.contiguous()",
                                   i ? 'k' : 'q', (long long)t->strides[2]);
        }
        if (cu[0]->shape[2] != cu[1]->shape[2])
            return client_fail(c, ATTNSTAT_EINVAL, "ext cu_seqlens_q and cu_seqlens_k have "
                               "different lengths");
        if (q->shape[0] != 1)
            return client_fail(c, ATTNSTAT_EINVAL, "packed sequences need batch 1 (q has %lld)",
                               (long long)q->shape[0]);
        if (!(c->features & CLIENT_FEATURE_CU_REF))
            return client_fail(c, ATTNSTAT_ENOTSUP, "this attnstatd takes no device offsets (its "
                               "HelloReply does not list \"cu_seqlens_ref\"): upgrade it");
        push_set_add(set, cu[0], "cu_seqlens_q", &set->icu);
        push_set_add(set, cu[1], "cu_seqlens_k", NULL);
    }
    if (sinks) {
        attnstat_code rc = push_check_sinks(c, sinks, q);
        if (rc != ATTNSTAT_OK)
            return rc;
        push_set_add(set, sinks, "sinks", &set->isinks);
    }
    if (set->compute_dtype >= 0 && !(c->features & CLIENT_FEATURE_COMPUTE_DTYPE))
        return client_fail(c, ATTNSTAT_ENOTSUP, "this attnstatd takes no compute_dtype (its "
                           "HelloReply does not list \"compute_dtype\"): upgrade the daemon");
    return ATTNSTAT_OK;
}

attnstat_code attnstat_push2(attnstat_client *c, const attnstat_push_opts *o,
                             const attnstat_push_ext *e, const attnstat_tensor *q,
                             const attnstat_tensor *k, const attnstat_tensor *v,
                             uint64_t *seq_out)
{
    if (seq_out)
        *seq_out = 0;
    if (!c)
        return ATTNSTAT_EINVAL;
    c->err[0] = '\0';
    attnstat_code rc = push_check_push(c, o, q, k, v);
    if (rc != ATTNSTAT_OK)
        return rc;
    push_set set;
    memset(&set, 0, sizeof set);
    set.iv = set.imask = set.icu = set.isinks = -1;
    set.compute_dtype = -1;
    push_set_add(&set, q, "q", NULL);
    push_set_add(&set, k, "k", NULL);
    push_set_add(&set, v, "v", &set.iv);
    if (e && c->hello_done && (rc = push_check_ext(c, o, e, q, k, &set)) != ATTNSTAT_OK)
        return rc;
    if ((rc = push_check_extents(c, &set)) != ATTNSTAT_OK)
        return rc;
    int cuda = q->mem == ATTNSTAT_MEM_CUDA;
    if (cuda) {
        if (!c->gpu && gpu_built())
            c->gpu = gpu_new();
        if ((rc = gpu_available(c->gpu, c->err, sizeof c->err)) != ATTNSTAT_OK)
            return rc;
    }
    if (!c->hello_done && !c->hello_pending)
        return client_fail(c, ATTNSTAT_ESTATE, "push before a successful attnstat_hello");
    c->st.pushed++;
    if (!link_ready(c)) /* also processes what arrived: Releases free ring space */
        return link_drop(c);
    /* Cheap early test: a queue already over its bound drops before any copy. */
    if (conn_queued(c) + 1024 > c->oq_limit && conn_queued(c) > 0)
        return push_drop(c, 0);
    uint64_t seq = c->next_seq;
    client_inflight *slot = &c->inflight[seq & (CLIENT_MAX_INFLIGHT - 1)];
    if (slot->seq != 0)
        return push_drop(c, 0); /* CLIENT_MAX_INFLIGHT pushes unacknowledged */
    /* From here on the push owns seq whatever happens: a push that fails after allocating ring
     * space (host or staged device ring) must never leave its seq to the next push, or two blocks
     * would share it and a Release would find the wrong one. */
    c->next_seq++;

    if (cuda && c->local_on) {
        local_tensors lt = {q, k, set.imask >= 0 ? set.t[set.imask] : NULL,
                            set.icu >= 0 ? set.t[set.icu] : NULL,
                            set.icu >= 0 ? set.t[set.icu + 1] : NULL,
                            set.isinks >= 0 ? set.t[set.isinks] : NULL, set.compute_dtype,
                            set.stream_waits, set.stats, set.max_logit_out};
        rc = local_push(c, o, &lt, seq, slot);
        if (rc == ATTNSTAT_OK && seq_out)
            *seq_out = seq; /* its tensors are read until its kernel is done: held */
        return rc;
    }
    if (cuda)
        return push_cuda(c, o, &set, seq, slot, seq_out);
    return push_host(c, o, &set, seq, slot);
}
