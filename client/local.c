/* local.c — libattnstat's local mode (see local.h): the statistics kernel in the caller's process,
 * the per-head results to attnstatd in Computed messages.
 *
 * Per device: a stats_cuda context (the daemon's kernels, linked into the library), a stream of
 * the lowest priority, and a pinned arena of result slots (reset whenever nothing is running on
 * that device, grown only then). Per push: an event recorded on the caller's stream that the
 * local stream waits for, the run (stats_cuda_run_to: its results copied into the push's slot),
 * and a done event; a FIFO of such entries, completed in order by local_progress.
 *
 * Stage: beside push.c. Calls conn.c (conn_send), util.c, the CUDA runtime and kernels/stats_cuda.h;
 * never link.c (link.c calls local_progress). Built twice (client/CMakeLists.txt): with
 * ATTNSTAT_LOCAL_KERNELS for the libraries a trainer links; without, for the programs that never
 * compute (the CLI, attnstat-synth), where it only refuses local mode. */
#include "local.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "envelope.h"
#include "conn.h"

attnstat_code attnstat_set_local_compute(attnstat_client *c, int on)
{
    if (!c)
        return ATTNSTAT_EINVAL;
#if !defined(ATTNSTAT_HAVE_CUDA)
    if (on)
        return client_fail(c, ATTNSTAT_ENOTSUP, "local compute needs a libattnstat built with "
                           "CUDA (this one has no GPU path)");
#elif !defined(ATTNSTAT_LOCAL_KERNELS)
    if (on)
        return client_fail(c, ATTNSTAT_ENOTSUP, "local compute is not in this program's "
                           "libattnstat (built without the kernels, as the attnstat CLI's is): "
                           "link libattnstat.so");
#endif
    c->local_on = on != 0;
    return ATTNSTAT_OK;
}

#ifdef ATTNSTAT_LOCAL_KERNELS
#include <cuda_runtime.h>

#include "head_pb.h"
#include "stats_cuda.h"

#define LOCAL_MAX_DEVICES 64
#define LOCAL_MAX_HEADS 4096 /* the daemon's bound on a Computed message */

typedef struct {
    int made;             /* 1: ready; -1: could not be made (err says why) */
    stats_cuda *sc;
    cudaStream_t stream;
    stats_head *pin;      /* result slots */
    size_t pin_cap, pin_used;
    int busy;             /* entries of this device not completed */
    int32_t *cu_dev;      /* host packed offsets, copied for the kernel */
    size_t cu_cap;
    char err[400];
} local_dev;

typedef struct {
    uint64_t seq;
    int64_t step;
    uint32_t layer;
    int dev;
    int32_t nheads;
    int want_results;
    uint32_t want;        /* the statistics asked for: the others are made absent before sending */
    stats_head *heads;    /* its slot in the device's arena */
    cudaEvent_t in, done;
} local_entry;

struct local_state {
    local_dev dev[LOCAL_MAX_DEVICES];
    local_entry *q;       /* FIFO ring of cap entries, n from head */
    size_t head, n, cap;
};

/* ---- Devices ---------------------------------------------------------------------------------- */
static cudaError_t local_on_device(int d, int *saved)
{
    cudaError_t e = cudaGetDevice(saved);
    if (e != cudaSuccess)
        return e;
    return *saved == d ? cudaSuccess : cudaSetDevice(d);
}

static void local_restore_device(int d, int saved)
{
    if (saved != d)
        (void)cudaSetDevice(saved);
}

/* The device's context and stream, made at its first push (current device: d). */
static int local_dev_make(local_dev *ld, int d)
{
    if (ld->made)
        return ld->made > 0 ? 0 : -1;
    stats_error se;
    if (stats_cuda_create(d, &ld->sc, &se) != STATS_OK) {
        snprintf(ld->err, sizeof ld->err, "the statistics kernels cannot run on device %d: %.300s",
                 d, se.msg);
        ld->made = -1;
        return -1;
    }
    int least = 0, greatest = 0;
    cudaError_t e = cudaDeviceGetStreamPriorityRange(&least, &greatest);
    if (e == cudaSuccess)
        e = cudaStreamCreateWithPriority(&ld->stream, cudaStreamNonBlocking, least);
    if (e != cudaSuccess) {
        snprintf(ld->err, sizeof ld->err, "cannot create a stream on device %d: %s", d,
                 cudaGetErrorString(e));
        (void)cudaGetLastError();
        stats_cuda_destroy(ld->sc);
        ld->sc = NULL;
        ld->made = -1;
        return -1;
    }
    ld->made = 1;
    return 0;
}

/* A slot of n heads, NULL when the arena is full while computations still write into it. */
static stats_head *local_slot(local_dev *ld, size_t n)
{
    if (ld->pin_used + n > ld->pin_cap) {
        if (ld->busy)
            return NULL;
        if (ld->pin)
            (void)cudaFreeHost(ld->pin);
        ld->pin = NULL;
        ld->pin_cap = ld->pin_used = 0;
        size_t want = n * 64 > 4096 ? n * 64 : 4096;
        if (cudaMallocHost((void **)&ld->pin, want * sizeof *ld->pin) != cudaSuccess) {
            (void)cudaGetLastError();
            ld->pin = NULL;
            return NULL;
        }
        ld->pin_cap = want;
    }
    stats_head *s = ld->pin + ld->pin_used;
    ld->pin_used += n;
    return s;
}

/* Host packed offsets into the device's buffer (stream-ordered: the buffer is written again only
 * after the kernels enqueued before have read it). */
static int local_offsets(local_dev *ld, const attnstat_push_opts *o, const int32_t **cq,
                         const int32_t **ck, char *err, size_t errlen)
{
    size_t n = (size_t)o->n_seqs + 1;
    if (ld->cu_cap < 2 * n) {
        if (ld->cu_dev)
            (void)cudaFree(ld->cu_dev); /* synchronising: no kernel still reads it */
        ld->cu_dev = NULL;
        ld->cu_cap = 0;
        cudaError_t e = cudaMalloc((void **)&ld->cu_dev, 2 * n * sizeof(int32_t));
        if (e != cudaSuccess) {
            (void)cudaGetLastError();
            snprintf(err, errlen, "cudaMalloc for packed offsets: %s", cudaGetErrorString(e));
            return -1;
        }
        ld->cu_cap = 2 * n;
    }
    cudaError_t e = cudaMemcpyAsync(ld->cu_dev, o->cu_seqlens_q, n * sizeof(int32_t),
                                    cudaMemcpyHostToDevice, ld->stream);
    if (e == cudaSuccess)
        e = cudaMemcpyAsync(ld->cu_dev + n, o->cu_seqlens_k, n * sizeof(int32_t),
                            cudaMemcpyHostToDevice, ld->stream);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        snprintf(err, errlen, "copying packed offsets to the device: %s", cudaGetErrorString(e));
        return -1;
    }
    *cq = ld->cu_dev;
    *ck = ld->cu_dev + n;
    return 0;
}

/* ---- The problem ------------------------------------------------------------------------------ */
static void local_tensor(stats_tensor *out, const attnstat_tensor *t)
{
    out->ptr = t->data;
    out->stride_b = t->strides[0];
    out->stride_h = t->strides[1];
    out->stride_n = t->strides[2];
}

static void local_problem(attnstat_client *c, const attnstat_push_opts *o, const local_tensors *t,
                          stats_problem *p)
{
    stats_problem_init(p);
    p->batch = (int32_t)(o->cu_seqlens_q ? o->n_seqs
                         : t->cu_q ? t->cu_q->shape[2] - 1 : t->q->shape[0]);
    p->heads_q = (int32_t)t->q->shape[1];
    p->heads_kv = (int32_t)t->k->shape[1];
    p->len_q = (int32_t)t->q->shape[2];
    p->len_k = (int32_t)t->k->shape[2];
    p->head_dim = (int32_t)t->q->shape[3];
    p->dtype = (stats_dtype)t->q->dtype;
    local_tensor(&p->q, t->q);
    local_tensor(&p->k, t->k);
    p->scale = o->scale;
    p->softcap = o->softcap;
    p->causal = o->causal ? 1 : 0;
    p->window_left = o->window_left;
    p->window_right = o->window_right;
    p->sample_every = (int32_t)o->sample_every;
    p->sample_rows = (int32_t)o->sample_rows;
    p->sample_seed = o->sample_seed;
    /* The daemon's collapse threshold is its own setting; a job that set one in its hello gets
     * it here too, else the kernels' default (README: local mode). */
    p->collapse_threshold = c->hello_has_th && isfinite(c->hello_th.collapse_threshold)
                                ? (float)c->hello_th.collapse_threshold : 0.0f;
    p->compute_dtype = t->compute_dtype >= 0 ? (stats_dtype)t->compute_dtype : STATS_F32;
    if (t->mask) {
        local_tensor(&p->mask, t->mask);
        p->mask_dtype = (stats_dtype)t->mask->dtype;
    }
    if (t->cu_q) {
        p->cu_seqlens_q = (const int32_t *)t->cu_q->data;
        p->cu_seqlens_k = (const int32_t *)t->cu_k->data;
    }
    if (t->sinks) { /* [Hq] on the device, contiguous (push.c checked) */
        p->sinks = t->sinks->data;
        p->sinks_dtype = (stats_dtype)t->sinks->dtype;
    }
    p->want = t->stats; /* the tensor-core kernels compute sink_mass and distance when asked */
}

/* ---- Push ------------------------------------------------------------------------------------- */
/* max_logit_out: device memory of device d (a host pointer or another device's would make the
 * copy fail later, on the stream, where nobody could say why). */
static attnstat_code local_check_out(attnstat_client *c, const double *out, int d)
{
    struct cudaPointerAttributes pa;
    cudaError_t e = cudaPointerGetAttributes(&pa, out);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return client_fail(c, ATTNSTAT_EINVAL, "max_logit_out (%p): %s", (const void *)out,
                           cudaGetErrorString(e));
    }
    if (pa.type != cudaMemoryTypeDevice || pa.device != d)
        return client_fail(c, ATTNSTAT_EINVAL, "max_logit_out (%p) is not device memory of "
                           "device %d, where q is: it must be a float64 [Hq] CUDA tensor there",
                           (const void *)out, d);
    return ATTNSTAT_OK;
}

static local_state *local_state_of(attnstat_client *c)
{
    if (!c->local) {
        c->local = calloc(1, sizeof *c->local);
        if (!c->local)
            return NULL;
    }
    local_state *ls = c->local;
    if (ls->n == ls->cap) {
        size_t cap = ls->cap ? 2 * ls->cap : 64;
        local_entry *q = malloc(cap * sizeof *q);
        if (!q)
            return NULL;
        for (size_t i = 0; i < ls->n; i++)
            q[i] = ls->q[(ls->head + i) % ls->cap];
        free(ls->q);
        ls->q = q;
        ls->head = 0;
        ls->cap = cap;
    }
    return ls;
}

attnstat_code local_push(attnstat_client *c, const attnstat_push_opts *o, const local_tensors *t,
                         uint64_t seq, client_inflight *slot)
{
    if (!(c->features & CLIENT_FEATURE_COMPUTED))
        return client_fail(c, ATTNSTAT_ENOTSUP, "this attnstatd takes no locally computed results "
                           "(its HelloReply does not list \"computed\"): upgrade the daemon, or "
                           "turn local compute off");
    if (t->q->shape[1] > LOCAL_MAX_HEADS)
        return client_fail(c, ATTNSTAT_EINVAL, "q has %lld heads: at most %d are computed locally",
                           (long long)t->q->shape[1], LOCAL_MAX_HEADS);
    cudaStream_t caller = (cudaStream_t)o->cuda_stream;
    enum cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(caller, &cs) != cudaSuccess) {
        (void)cudaGetLastError();
        cs = cudaStreamCaptureStatusNone;
    }
    if (cs != cudaStreamCaptureStatusNone) {
        c->st.dropped_local++;
        return client_fail(c, ATTNSTAT_DROPPED, "push dropped: the stream is being captured into "
                           "a CUDA graph (nothing is enqueued on it during a capture)");
    }
    int d = t->q->device;
    if (d < 0) {
        struct cudaPointerAttributes pa;
        if (cudaPointerGetAttributes(&pa, t->q->data) != cudaSuccess || pa.device < 0) {
            (void)cudaGetLastError();
            return client_fail(c, ATTNSTAT_EINVAL, "q (%p) is not device memory CUDA knows",
                               t->q->data);
        }
        d = pa.device;
    }
    if (d >= LOCAL_MAX_DEVICES)
        return client_fail(c, ATTNSTAT_EINVAL, "device %d: local compute takes devices 0..%d", d,
                           LOCAL_MAX_DEVICES - 1);
    local_state *ls = local_state_of(c);
    if (!ls)
        return client_fail(c, ATTNSTAT_ENOMEM, "out of memory for local compute");
    local_dev *ld = &ls->dev[d];
    int saved = 0;
    cudaError_t e = local_on_device(d, &saved);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return client_fail(c, ATTNSTAT_EINVAL, "cudaSetDevice(%d): %s", d, cudaGetErrorString(e));
    }
    attnstat_code rc = ATTNSTAT_OK;
    stats_problem p;
    local_problem(c, o, t, &p);
    stats_error se;
    local_entry en;
    memset(&en, 0, sizeof en);
    if (local_dev_make(ld, d) != 0) {
        rc = client_fail(c, ATTNSTAT_ENOTSUP, "%s", ld->err);
        goto out;
    }
    if (o->cu_seqlens_q && local_offsets(ld, o, &p.cu_seqlens_q, &p.cu_seqlens_k, c->err,
                                         sizeof c->err) != 0) {
        rc = ATTNSTAT_EINVAL;
        goto out;
    }
    if (stats_validate(&p, &se) != STATS_OK) {
        rc = client_fail(c, ATTNSTAT_EINVAL, "%s", se.msg);
        goto out;
    }
    if (t->max_logit_out && local_check_out(c, t->max_logit_out, d) != ATTNSTAT_OK) {
        rc = ATTNSTAT_EINVAL;
        goto out;
    }
    en.heads = local_slot(ld, (size_t)p.heads_q);
    if (!en.heads) {
        c->st.dropped_local++;
        rc = client_fail(c, ATTNSTAT_DROPPED, "push dropped: every result slot of device %d is "
                         "taken by computations still running", d);
        goto out;
    }
    e = cudaEventCreateWithFlags(&en.in, cudaEventDisableTiming);
    if (e == cudaSuccess && (e = cudaEventCreateWithFlags(&en.done, cudaEventDisableTiming)) !=
                                cudaSuccess)
        (void)cudaEventDestroy(en.in);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        ld->pin_used -= (size_t)p.heads_q;
        rc = client_fail(c, ATTNSTAT_EINVAL, "cudaEventCreate: %s", cudaGetErrorString(e));
        goto out;
    }
    /* After the caller's stream has written the tensors, on the local stream. */
    e = cudaEventRecord(en.in, caller);
    if (e == cudaSuccess)
        e = cudaStreamWaitEvent(ld->stream, en.in, 0);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        rc = client_fail(c, ATTNSTAT_EINVAL, "ordering the computation after stream %p: %s (is "
                         "the stream on device %d?)", (void *)caller, cudaGetErrorString(e), d);
    } else if (stats_cuda_run_to(ld->sc, &p, ld->stream, en.heads, t->max_logit_out, NULL, NULL,
                                 &se) != STATS_OK) {
        (void)cudaGetLastError();
        rc = client_fail(c, ATTNSTAT_EINVAL, "%s", se.msg);
    } else if ((e = cudaEventRecord(en.done, ld->stream)) != cudaSuccess) {
        (void)cudaGetLastError();
        /* The run is enqueued: wait for it before the caller may let go of its tensors. */
        (void)cudaStreamSynchronize(ld->stream);
        rc = client_fail(c, ATTNSTAT_EINVAL, "cudaEventRecord: %s", cudaGetErrorString(e));
    } else if (t->stream_waits && (e = cudaStreamWaitEvent(caller, en.done, 0)) != cudaSuccess) {
        /* The caller may overwrite the tensors with its next work: held to it by the host. */
        (void)cudaGetLastError();
        (void)cudaStreamSynchronize(ld->stream);
    }
    if (rc != ATTNSTAT_OK) {
        (void)cudaEventDestroy(en.in);
        (void)cudaEventDestroy(en.done);
        ld->pin_used -= (size_t)p.heads_q;
        goto out;
    }
    en.seq = seq;
    en.step = o->step;
    en.layer = o->layer;
    en.dev = d;
    en.nheads = p.heads_q;
    en.want_results = o->want_results != 0;
    en.want = p.want;
    ls->q[(ls->head + ls->n) % ls->cap] = en;
    ls->n++;
    ld->busy++;
    /* The slot waits for the daemon's Ack; the entry holds the caller's memory until the kernel
     * is done (local_progress releases it). */
    slot->seq = seq;
    slot->step = o->step;
    slot->layer = o->layer;
    slot->held = 0;
    slot->released = 0;
    slot->gh.dev = -1;
    c->st.sent++;
    c->st.in_flight++;
    c->st.releases_pending++;
out:
    local_restore_device(d, saved);
    return rc;
}

/* ---- Completion ------------------------------------------------------------------------------- */
/* The Computed message of entry en. OK, or the conn_send code (DROPPED, ECLOSED), or ENOMEM. */
static attnstat_code local_send(attnstat_client *c, const local_entry *en)
{
    size_t n = (size_t)en->nheads;
    Attnstat__HeadStats *hs = malloc(n * sizeof *hs);
    Attnstat__HeadStats **ptrs = malloc(n * sizeof *ptrs);
    attnstat_code rc = ATTNSTAT_ENOMEM;
    if (hs && ptrs) {
        /* what was asked, whichever kernel ran: as the daemon keeps its own results */
        stats_head_keep(en->heads, en->nheads, en->want);
        for (size_t i = 0; i < n; i++) {
            HEAD_PB_FILL(&hs[i], (uint32_t)i, &en->heads[i]);
            ptrs[i] = &hs[i];
        }
        Attnstat__Computed m;
        Attnstat__Envelope env;
        envelope_computed(&env, &m, en->seq, en->step, en->layer, ptrs, n);
        m.has_want_results = en->want_results;
        m.want_results = en->want_results;
        rc = conn_send(c, &env, 1);
    }
    free(hs);
    free(ptrs);
    return rc;
}

void local_progress(attnstat_client *c)
{
    local_state *ls = c->local;
    if (!ls)
        return;
    while (ls->n) {
        local_entry *en = &ls->q[ls->head];
        cudaError_t e = cudaEventQuery(en->done);
        if (e == cudaErrorNotReady)
            break;
        if (e != cudaSuccess) /* the kernel failed (the context's error is the caller's now) */
            (void)cudaGetLastError();
        client_inflight *slot = &c->inflight[en->seq & (CLIENT_MAX_INFLIGHT - 1)];
        int ours = c->inflight && slot->seq == en->seq;
        attnstat_code rc = ATTNSTAT_ECLOSED;
        if (ours && e == cudaSuccess && c->link == LINK_UP && !c->closed)
            rc = local_send(c, en);
        if (ours && rc != ATTNSTAT_OK) { /* never to be acknowledged */
            slot->seq = 0;
            c->st.in_flight--;
            if (e != cudaSuccess) {
                c->st.errors++;
                c->st.last_code = -1;
                snprintf(c->st.last_error, sizeof c->st.last_error, "the local computation of "
                         "step %lld layer %u failed on device %d: %s", (long long)en->step,
                         en->layer, en->dev, cudaGetErrorString(e));
            } else if (rc == ATTNSTAT_DROPPED) {
                c->st.dropped_local++;
            } else {
                c->st.dropped_local++;
                c->st.dropped_disconnected++;
            }
        } else if (!ours) {
            c->st.dropped_disconnected++; /* its slot went with a lost connection */
        }
        /* The kernel has read the tensors: the caller may let go of them. */
        c->st.releases_pending--;
        if (c->release_fn)
            c->release_fn(c->release_user, en->seq);
        (void)cudaEventDestroy(en->in);
        (void)cudaEventDestroy(en->done);
        local_dev *ld = &ls->dev[en->dev];
        if (--ld->busy == 0)
            ld->pin_used = 0;
        ls->head = (ls->head + 1) % ls->cap;
        ls->n--;
    }
}

int local_busy(const attnstat_client *c)
{
    return c->local ? (int)c->local->n : 0;
}

attnstat_code attnstat_local_wait(attnstat_client *c, void *cuda_stream)
{
    if (!c)
        return ATTNSTAT_EINVAL;
    if (!c->local_on)
        return client_fail(c, ATTNSTAT_EINVAL, "attnstat_local_wait is for local mode "
                           "(attnstat_set_local_compute): attnstatd computes this client's pushes");
    local_state *ls = c->local;
    if (!ls)
        return ATTNSTAT_OK;
    /* Each device's computations run in order on its stream: its newest one's done event stands
     * for all of them (waiting on one already done is a no-op). */
    int newest[LOCAL_MAX_DEVICES];
    for (int d = 0; d < LOCAL_MAX_DEVICES; d++)
        newest[d] = -1;
    for (size_t i = 0; i < ls->n; i++) {
        size_t at = (ls->head + i) % ls->cap;
        newest[ls->q[at].dev] = (int)at;
    }
    for (int d = 0; d < LOCAL_MAX_DEVICES; d++) {
        if (newest[d] < 0)
            continue;
        cudaError_t e = cudaStreamWaitEvent((cudaStream_t)cuda_stream, ls->q[newest[d]].done, 0);
        if (e != cudaSuccess) {
            (void)cudaGetLastError();
            return client_fail(c, ATTNSTAT_EINVAL, "making stream %p wait for the computations "
                               "on device %d: %s", cuda_stream, d, cudaGetErrorString(e));
        }
    }
    return ATTNSTAT_OK;
}

void local_free(attnstat_client *c)
{
    local_state *ls = c->local;
    if (!ls)
        return;
    for (int d = 0; d < LOCAL_MAX_DEVICES; d++)
        if (ls->dev[d].made > 0)
            (void)cudaStreamSynchronize(ls->dev[d].stream);
    local_progress(c); /* everything is done: the results go if they can, the tensors are released */
    for (int d = 0; d < LOCAL_MAX_DEVICES; d++) {
        local_dev *ld = &ls->dev[d];
        if (ld->made <= 0)
            continue;
        int saved = 0;
        if (local_on_device(d, &saved) == cudaSuccess) {
            if (ld->pin)
                (void)cudaFreeHost(ld->pin);
            if (ld->cu_dev)
                (void)cudaFree(ld->cu_dev);
            (void)cudaStreamDestroy(ld->stream);
            stats_cuda_destroy(ld->sc);
            local_restore_device(d, saved);
        }
        (void)cudaGetLastError();
    }
    free(ls->q);
    free(ls);
    c->local = NULL;
}

#else /* no kernels (no CUDA, or the CLI's library): local mode is refused by
       * attnstat_set_local_compute, nothing is ever queued */

attnstat_code local_push(attnstat_client *c, const attnstat_push_opts *o, const local_tensors *t,
                         uint64_t seq, client_inflight *slot)
{
    (void)o, (void)t, (void)seq, (void)slot;
    return client_fail(c, ATTNSTAT_ENOTSUP, "this libattnstat was built without local mode's "
                       "kernels");
}

void local_progress(attnstat_client *c)
{
    (void)c;
}

int local_busy(const attnstat_client *c)
{
    (void)c;
    return 0;
}

attnstat_code attnstat_local_wait(attnstat_client *c, void *cuda_stream)
{
    (void)cuda_stream;
    if (!c)
        return ATTNSTAT_EINVAL;
    return client_fail(c, ATTNSTAT_EINVAL, "attnstat_local_wait is for local mode, which this "
                       "libattnstat does not have");
}

void local_free(attnstat_client *c)
{
    (void)c;
}

#endif
