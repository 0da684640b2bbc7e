/* push.c — one Push from receipt to Ack (see push.h). Stage: push; calls validate, buffers,
 * devices, worker, gpu_worker, peer, conn, envelope, head_pb (a head's statistics on the wire, by
 * vocab.h's rows, as libattnstat's local mode writes them), counters, util and log. */
#include "push.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "buffers.h"
#include "conn.h"
#include "counters.h"
#include "devices.h"
#include "envelope.h"
#include "head_pb.h"
#include "gpu_worker.h"
#include "log.h"
#include "names.h"
#include "util.h"
#include "validate.h"

_Static_assert(VALIDATE_MAX_TENSORS <= GPU_JOB_TENSORS && VALIDATE_MAX_TENSORS <= WORKER_MAX_GUARDS,
               "a push's tensors fit the GPU job's references and the CPU job's guards");

struct push {
    worker_job job;          /* queued on a worker: job.owner is the push */
    batch_item item;         /* batched: item.owner is the push */
    const stage_ctx *x;
    peer *p;                 /* its client (a reference) */
    uint64_t seq;
    int64_t step;
    uint32_t layer;
    int32_t glayer, head_base; /* the global numbers of its layer and its query head 0 (layout) */
    int want_results;
    buffers_map *maps[VALIDATE_MAX_TENSORS]; /* host buffers pinned while a worker may read them */
    int nmaps;
    gpu_refs gref;           /* device pushes: buffers and event, referenced until unmapped */
    int computing;           /* counted in p->computing */
    int local;               /* a Computed message: the client computed it (no memory, no Release) */
    validate_plan plan;
    uint64_t received_ns;
    int64_t time_ms;
};

/* Ack{seq, code, message} now, to a client still connected. A code other than OK goes into the
 * daemon's ledger of answers by code (status, metrics), and the first of each reason from a
 * client is logged at warn level: a rejected push is never silent. */
static void ack_now(const stage_ctx *x, peer *p, uint64_t seq, Attnstat__Code code,
                    const char *msg)
{
    if (code != ATTNSTAT__CODE__OK) {
        counters_answer(x->cnt, (int)code, msg);
        if (peer_first_reason(p, (int)code, msg))
            LOG_WARN("push", "client %llu (run '%s' rank %d): push %llu answered %s: %s (the first "
                     "of its kind from this client; `attnstat status` counts them by code)",
                     (unsigned long long)p->conn_id, p->hello ? p->run : "-", (int)p->rank,
                     (unsigned long long)seq, names_code((int)code), msg ? msg : "");
    }
    if (!p->c)
        return;
    Attnstat__Ack ack;
    Attnstat__Envelope env;
    conn_write(p->c, envelope_ack(&env, &ack, seq, code, msg, NULL, 0), 1);
}

/* A push refused on arrival: counted (the daemon's and its client's) and answered. */
static void refuse(const stage_ctx *x, peer *p, counter_id what, uint64_t seq, Attnstat__Code code,
                   const char *msg)
{
    counters_inc(x->cnt, what);
    if (what == CNT_REJECTED)
        peer_count(p, PEER_REJECTED);
    else if (what == CNT_DROPPED)
        peer_count(p, PEER_DROPPED);
    ack_now(x, p, seq, code, msg);
}

/* The worker no longer reads the push's memory: drop its buffer references (unmapping buffers
 * that were forgotten meanwhile). Idempotent. */
static void unpin(push *u)
{
    if (u->computing) {
        u->computing = 0;
        peer_computing(u->p, -1);
    }
    for (int i = 0; i < u->nmaps; i++)
        buffers_map_unref(u->maps[i]);
    u->nmaps = 0;
    gpu_refs_drop(&u->gref);
    for (int i = 0; i < u->gref.n; i++)
        gpu_mem_unref(u->gref.mem[i]);
    u->gref.n = 0;
    if (u->gref.ev)
        gpu_event_unref(u->gref.ev);
    u->gref.ev = NULL;
}

/* Freed: after its Ack, or when nobody is left to ack. Drops its client's reference. */
static void push_free(push *u)
{
    unpin(u);
    validate_plan_free(&u->plan);
    free(u->job.heads);
    peer *p = u->p;
    free(u);
    peer_push_end(p);
}

/* Device buffers: the push's device must have a worker, its event (if any) must be of that device;
 * its device memory and event are referenced. Returns the worker, or NULL with *code and msg set. */
static worker *pin_device(push *u, const Attnstat__Push *m, Attnstat__Code *code, char *msg,
                          size_t msglen)
{
    peer *p = u->p;
    int d = u->plan.device;
    int evdev = -1;
    gpu_event *ev = m->has_event_id ? buffers_event(p->bufs, m->event_id, &evdev) : NULL;
    const char *bad = NULL;
    if (m->has_event_id && !ev)
        bad = "is not a registered event (RegisterEvent it first)";
    else if (ev && evdev != d)
        bad = "is on another device than the push's tensors";
    worker *w = devices_gpu_running(u->x->dev, d);
    if (bad || !w) {
        *code = bad ? ATTNSTAT__CODE__UNKNOWN_BUFFER : ATTNSTAT__CODE__INTERNAL;
        if (bad)
            util_err(msg, msglen, "event_id %u %s", m->event_id, bad);
        else
            util_err(msg, msglen, "device %s has no worker", devices_info(u->x->dev, d)->uuid);
        return NULL;
    }
    for (int i = 0; i < u->plan.ntensors; i++) {
        u->gref.mem[i] = buffers_device_mem(p->bufs, u->plan.buffer_id[i]);
        gpu_mem_ref(u->gref.mem[i]);
        u->gref.off[i] = u->plan.offset[i];
        u->gref.need[i] = u->plan.need_bytes[i];
    }
    u->gref.n = u->plan.ntensors;
    u->gref.mask_index = u->plan.mask_index;
    u->gref.cu_index = u->plan.cu_index;
    u->gref.sinks_index = u->plan.sinks_index;
    if (ev) {
        u->gref.ev = ev;
        gpu_event_ref(ev);
    }
    u->gref.client_gone = &p->gone;
    u->job.ext = &u->gref;
    return w;
}

/* Host buffers: each mapping the push reads is referenced, and the worker checks (fstat) that the
 * segment still holds what the push reaches before reading it. */
static void pin_host(push *u)
{
    for (int i = 0; i < u->plan.ntensors; i++) {
        buffers_map *m = buffers_host_map(u->p->bufs, u->plan.buffer_id[i]);
        int j = 0;
        while (j < u->nmaps && u->maps[j] != m)
            j++;
        if (j == u->nmaps) {
            u->maps[u->nmaps++] = m;
            buffers_map_ref(m);
            u->job.guard_fd[j] = buffers_map_fd(m);
            u->job.guard_bytes[j] = 0;
            u->job.nguards = u->nmaps;
        }
        if (u->plan.need_bytes[i] > u->job.guard_bytes[j])
            u->job.guard_bytes[j] = u->plan.need_bytes[i];
    }
}

/* The global numbers of a push's layer and query head 0, by the layout in force now (a later
 * Layout is for later pushes; peer_global(), the rule interventions follow too); -1 with a message
 * when they pass the bound. */
static int global_numbers(peer *p, uint32_t layer, int32_t heads_q, push *u, char *msg,
                          size_t cap)
{
    if (peer_global(p, layer, heads_q, heads_q, &u->glayer, &u->head_base, msg, cap) != 0)
        return -1;
    peer_heads_seen(p, heads_q);
    return 0;
}

/* Counts a Push or Computed (what) and refuses it before Hello or while the daemon stops;
 * 0 when it may go on. */
static int push_admit(const stage_ctx *x, peer *p, uint64_t seq, const char *what)
{
    counters_count_push(x->cnt);
    peer_count(p, PEER_PUSHES);
    if (!p->hello) {
        char msg[64];
        snprintf(msg, sizeof msg, "%s before Hello", what);
        refuse(x, p, CNT_REJECTED, seq, ATTNSTAT__CODE__NO_HELLO, msg);
        return -1;
    }
    if (x->stopping) {
        refuse(x, p, CNT_DROPPED, seq, ATTNSTAT__CODE__DROPPED, "the daemon is shutting down");
        return -1;
    }
    return 0;
}

/* A push's identity once admitted: its owner, peer (whose count of pushes in flight it joins),
 * numbers and arrival times. */
static void push_begin(push *u, const stage_ctx *x, peer *p, uint64_t seq, int64_t step,
                       uint32_t layer, int want_results)
{
    u->job.owner = u;
    u->x = x;
    u->p = p;
    peer_push_start(p);
    u->seq = seq;
    u->step = step;
    u->layer = layer;
    u->want_results = want_results;
    u->received_ns = util_mono_ns();
    u->time_ms = (int64_t)util_wall_ms();
}

void push_receive(const stage_ctx *x, peer *p, const Attnstat__Push *m)
{
    const cfg *c = x->cfg;
    if (push_admit(x, p, m->seq, "Push") != 0)
        return;
    validate_limits lim = {.max_push_work = c->max_push_work,
                           .max_push_work_gpu = c->max_push_work_gpu,
                           .collapse_threshold = (float)p->collapse_threshold};
    push *u = calloc(1, sizeof *u);
    if (!u) {
        counters_inc(x->cnt, CNT_FAILED);
        ack_now(x, p, m->seq, ATTNSTAT__CODE__INTERNAL, "out of memory");
        return;
    }
    char msg[512];
    Attnstat__Code code = validate_push(m, buffers_lookup, p->bufs, &lim, &u->plan, msg, sizeof msg);
    if (code != ATTNSTAT__CODE__OK) {
        free(u);
        LOG_DEBUG("session", "client %llu: push %llu rejected: %s", (unsigned long long)p->conn_id,
                  (unsigned long long)m->seq, msg);
        refuse(x, p, CNT_REJECTED, m->seq, code, msg);
        return;
    }
    if (p->computing >= c->client_inflight) {
        validate_plan_free(&u->plan);
        free(u);
        snprintf(msg, sizeof msg, "dropped: this client already has %u pushes queued or "
                 "computing (client_inflight)", p->computing);
        refuse(x, p, CNT_DROPPED, m->seq, ATTNSTAT__CODE__DROPPED, msg);
        return;
    }
    if (global_numbers(p, m->layer, u->plan.prob.heads_q, u, msg, sizeof msg) != 0) {
        validate_plan_free(&u->plan);
        free(u);
        refuse(x, p, CNT_REJECTED, m->seq, ATTNSTAT__CODE__BAD_REQUEST, msg);
        return;
    }
    u->job.prob = u->plan.prob;
    u->job.work = u->plan.work;
    u->job.heads = calloc((size_t)u->plan.prob.heads_q, sizeof(stats_head));
    if (!u->job.heads) {
        validate_plan_free(&u->plan);
        free(u);
        counters_inc(x->cnt, CNT_FAILED);
        ack_now(x, p, m->seq, ATTNSTAT__CODE__INTERNAL, "out of memory");
        return;
    }
    push_begin(u, x, p, m->seq, m->step, m->layer, m->want_results);
    /* Routing: host buffers go to the CPU worker; device buffers to their device's. */
    worker *target = devices_cpu(x->dev, p->run_id, m->layer);
    if (u->plan.kind == ATTNSTAT__BUFFER_KIND__CUDA_IPC) {
        target = pin_device(u, m, &code, msg, sizeof msg);
        if (!target) {
            refuse(x, p, CNT_REJECTED, m->seq, code, msg);
            push_free(u);
            return;
        }
        gpu_refs_hold(&u->gref); /* keeps its buffers mapped until the worker is done with it */
    } else {
        pin_host(u);
    }
    if (worker_submit(target, &u->job) != 0) {
        worker_stats ws;
        worker_stats_of(target, &ws);
        if (ws.work_cap && ws.queue_depth < ws.capacity)
            snprintf(msg, sizeof msg, "dropped: the %s worker's queue is full (%u pushes, %llu of "
                     "%llu multiply-adds queued, queue_work; this push %llu); not computed",
                     ws.name ? ws.name : "cpu", ws.queue_depth,
                     (unsigned long long)ws.queued_work, (unsigned long long)ws.work_cap,
                     (unsigned long long)u->job.work);
        else
            snprintf(msg, sizeof msg, "dropped: the %s worker's queue is full (%u of %u); not "
                     "computed", ws.name ? ws.name : "cpu", ws.queue_depth, ws.capacity);
        refuse(x, p, CNT_DROPPED, m->seq, ATTNSTAT__CODE__DROPPED, msg);
        push_free(u);
        return;
    }
    u->computing = 1;
    peer_computing(p, +1);
}

void push_receive_computed(const stage_ctx *x, peer *p, const Attnstat__Computed *m)
{
    const cfg *c = x->cfg;
    if (push_admit(x, p, m->seq, "Computed") != 0)
        return;
    char msg[512];
    if (p->computing >= c->client_inflight) {
        snprintf(msg, sizeof msg, "dropped: this client already has %u pushes queued or "
                 "computing (client_inflight)", p->computing);
        refuse(x, p, CNT_DROPPED, m->seq, ATTNSTAT__CODE__DROPPED, msg);
        return;
    }
    push *u = calloc(1, sizeof *u);
    stats_head *heads = calloc(VALIDATE_MAX_HEADS, sizeof *heads);
    if (!u || !heads) {
        free(u);
        free(heads);
        counters_inc(x->cnt, CNT_FAILED);
        ack_now(x, p, m->seq, ATTNSTAT__CODE__INTERNAL, "out of memory");
        return;
    }
    Attnstat__Code code = validate_computed(m, heads, msg, sizeof msg);
    if (code != ATTNSTAT__CODE__OK) {
        free(u);
        free(heads);
        refuse(x, p, CNT_REJECTED, m->seq, code, msg);
        return;
    }
    if (global_numbers(p, m->layer, (int32_t)m->n_heads, u, msg, sizeof msg) != 0) {
        free(u);
        free(heads);
        refuse(x, p, CNT_REJECTED, m->seq, ATTNSTAT__CODE__BAD_REQUEST, msg);
        return;
    }
    /* Through the CPU worker of its (run, layer) like any push, so that a layer's Acks keep their
     * order and the client's in-flight count holds; the worker does nothing with it
     * (precomputed). */
    stats_problem_init(&u->job.prob);
    u->job.prob.heads_q = (int32_t)m->n_heads;
    u->job.heads = heads;
    u->job.precomputed = 1;
    u->local = 1;
    push_begin(u, x, p, m->seq, m->step, m->layer, m->want_results);
    worker *target = devices_cpu(x->dev, p->run_id, m->layer);
    if (worker_submit(target, &u->job) != 0) {
        worker_stats ws;
        worker_stats_of(target, &ws);
        snprintf(msg, sizeof msg, "dropped: the %s worker's queue is full (%u of %u)",
                 ws.name ? ws.name : "cpu", ws.queue_depth, ws.capacity);
        refuse(x, p, CNT_DROPPED, m->seq, ATTNSTAT__CODE__DROPPED, msg);
        push_free(u);
        return;
    }
    u->computing = 1;
    peer_computing(p, +1);
}

push *push_of_job(worker_job *job)
{
    return job->owner;
}

push *push_of_item(batch_item *it)
{
    return it->owner;
}

batch_item *push_item(push *u)
{
    return &u->item;
}

int push_computed(push *u)
{
    unpin(u);
    peer *p = u->p;
    if (p->c && !u->local) {
        Attnstat__Release rel;
        Attnstat__Envelope env;
        conn_write(p->c, envelope_release(&env, &rel, u->seq), 1);
    }
    worker_job *job = &u->job;
    if (job->status != STATS_OK) {
        char msg[400];
        snprintf(msg, sizeof msg, "not computed: %s", job->err.msg);
        LOG_WARN("worker", "push %llu of run '%s' failed: %s", (unsigned long long)u->seq, p->run,
                 job->err.msg);
        Attnstat__Code code = job->fail_code ? (Attnstat__Code)job->fail_code
                              : job->status == STATS_EINVAL ? ATTNSTAT__CODE__BAD_REQUEST
                                                            : ATTNSTAT__CODE__INTERNAL;
        push_answer(u, code, msg, NULL, NULL);
        return -1;
    }
    /* A result carries the statistics the push asked for, whichever backend (the CPU worker, a
     * GPU worker's kernel) computed more: here, before the heads go to the store, the alerts,
     * the per-head metrics and the Ack. A Computed message's heads are the client's, blanked
     * there already. */
    if (!u->local)
        stats_head_keep(job->heads, job->prob.heads_q, job->prob.want);
    batch_item *it = &u->item;
    it->owner = u;
    it->run_id = p->run_id;
    it->run = p->run;
    it->rank = p->rank;
    it->seq = u->seq;
    it->step = u->step;
    it->layer = u->glayer;
    it->head_base = u->head_base;
    it->heads = job->heads;
    it->nheads = job->prob.heads_q;
    it->time_ms = u->time_ms;
    return 0;
}

/* ---- results as protobuf -------------------------------------------------------------------- */


/* The heads of a push as protobuf: one array of structs (*store_out) plus one of pointers
 * (returned), both freed by the caller; NULL on no memory. */
static Attnstat__HeadStats **heads_pb(const push *u, Attnstat__HeadStats **store_out)
{
    size_t n = (size_t)u->job.prob.heads_q;
    Attnstat__HeadStats *hs = malloc(n * sizeof *hs);
    Attnstat__HeadStats **ptrs = malloc(n * sizeof *ptrs);
    if (!hs || !ptrs) {
        free(hs);
        free(ptrs);
        *store_out = NULL;
        return NULL;
    }
    for (size_t i = 0; i < n; i++) {
        HEAD_PB_FILL(&hs[i], (uint32_t)i, &u->job.heads[i]);
        ptrs[i] = &hs[i];
    }
    *store_out = hs;
    return ptrs;
}

/* Ack with the heads (NULL: none) to a client still connected. One whose results do not fit in
 * max_frame is acknowledged without them. */
static void ack_stored(push *u, Attnstat__HeadStats **heads, size_t nheads)
{
    peer *p = u->p;
    if (!p->c)
        return;
    Attnstat__Ack ack;
    Attnstat__Envelope env;
    envelope_ack(&env, &ack, u->seq, ATTNSTAT__CODE__OK, NULL, heads, nheads);
    /* A send that closed the connection (its queue far over the cap) detached the client: then
     * p->c is NULL and nothing is retried. */
    if (conn_write(p->c, &env, 1) != 0 && heads && p->c) {
        ack.heads = NULL;
        ack.n_heads = 0;
        ack.message = "stored; per-head results omitted: they do not fit in max_frame";
        conn_write(p->c, &env, 1);
    }
}

void push_answer(push *u, Attnstat__Code code, const char *msg, push_result_fn results, void *data)
{
    const stage_ctx *x = u->x;
    if (code == ATTNSTAT__CODE__OK) {
        counters_inc(x->cnt, CNT_PUSHES_DONE);
        Attnstat__HeadStats *hs = NULL;
        Attnstat__HeadStats **ptrs = NULL;
        size_t n = (size_t)u->job.prob.heads_q;
        if (u->want_results || results)
            ptrs = heads_pb(u, &hs);
        ack_stored(u, u->want_results ? ptrs : NULL, n);
        if (results && ptrs) {
            /* The Ack says the push's own numbers; subscribers see the job's global ones. */
            for (size_t i = 0; i < n; i++)
                hs[i].head = (uint32_t)u->head_base + (uint32_t)i;
            Attnstat__Result r;
            Attnstat__Envelope env;
            results(data, envelope_result(&env, &r, u->p->run, u->p->run_id, u->step,
                                          (uint32_t)u->glayer, ptrs, n));
        }
        free(ptrs);
        free(hs);
    } else {
        counters_inc(x->cnt, CNT_FAILED);
        ack_now(x, u->p, u->seq, code, msg);
    }
    push_free(u);
}
