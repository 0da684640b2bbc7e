/* session.c — protocol dispatch (see session.h). Stage: session; calls peer, buffers, push,
 * status, command, the alert feed, devices, runs and life (a Hello's run), validate, json, the
 * store's write half (an Intervention's record, on the store thread), counters, conn, envelope,
 * names, util and log. */
#include "session.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alerts_feed.h"
#include "buffers.h"
#include "conn.h"
#include "counters.h"
#include "devices.h"
#include "envelope.h"
#include "frame.h"
#include "json.h"
#include "log.h"
#include "names.h"
#include "command.h"
#include "life.h"
#include "push.h"
#include "runs.h"
#include "status.h"
#include "storer.h"
#include "store_write.h"
#include "util.h"
#include "validate.h"

#define SESSION_HOST_MAX 255
#define SESSION_UUID_MAX 64
#define SESSION_MAX_DEVICES 64

/* Error{code, message, ref} to a client still connected. */
static void reply_error(peer *p, Attnstat__Code code, int has_ref, uint64_t ref, const char *msg)
{
    LOG_DEBUG("session", "client %llu: error %s: %s", (unsigned long long)p->conn_id,
              names_code(code), msg);
    if (p->c)
        conn_send_error(p->c, code, msg, has_ref, ref);
}

/* reply_error() with the message formatted (in a local buffer of the calling block). */
#define REPLY_ERROR(p, code, has_ref, ref, ...)                                                    \
    do {                                                                                           \
        char m_[512];                                                                              \
        util_err(m_, sizeof m_, __VA_ARGS__);                                                      \
        reply_error((p), (code), (has_ref), (ref), m_);                                            \
    } while (0)

/* ---- Hello ---------------------------------------------------------------------------------- */

/* The devices a Hello names that this host serves get a worker now (a CUDA context takes a
 * while); their UUIDs go to served[] (at most GPU_MAX_LOCAL). Returns how many. */
static size_t serve_devices(const stage_ctx *x, const peer *p, const Attnstat__Hello *h, char **served)
{
    devices *dev = x->dev;
    size_t nserved = 0;
    for (size_t i = 0; i < h->n_device_uuids && i < SESSION_MAX_DEVICES; i++) {
        const char *u = h->device_uuids[i];
        int d = devices_find(dev, u);
        char gerr[300];
        if (d < 0) {
            int none = devices_count(dev) == 0;
            LOG_WARN("session", "client %llu names device %s, which is not a usable GPU of this "
                     "host%s%s: its CUDA tensors will be refused", (unsigned long long)p->conn_id,
                     u ? u : "?", none ? ": " : "", none ? devices_why(dev) : "");
            continue;
        }
        if (!devices_gpu_worker(dev, d, gerr, sizeof gerr)) {
            LOG_ERROR("session", "client %llu: %s", (unsigned long long)p->conn_id, gerr);
            continue;
        }
        char *uuid = (char *)devices_info(dev, d)->uuid;
        int dup = 0;
        for (size_t j = 0; j < nserved; j++)
            dup |= served[j] == uuid;
        if (!dup && nserved < GPU_MAX_LOCAL)
            served[nserved++] = uuid;
    }
    return nserved;
}

static void on_hello(const stage_ctx *x, peer *p, const Attnstat__Hello *h)
{
    const cfg *c = x->cfg;
    if (h->protocol_version != FRAME_PROTOCOL_VERSION) {
        REPLY_ERROR(p, ATTNSTAT__CODE__VERSION, 0, 0,
                    "protocol version %u is not supported: this daemon speaks version %u",
                    h->protocol_version, FRAME_PROTOCOL_VERSION);
        return;
    }
    if (p->hello) {
        REPLY_ERROR(p, ATTNSTAT__CODE__BAD_REQUEST, 0, 0,
                    "Hello was already received on this connection (run '%s'); open a new "
                    "connection for another run", p->run);
        return;
    }
    const char *run = h->run && h->run[0] ? h->run : c->default_run;
    char why[96];
    if (!util_printable(run, PEER_RUN_MAX - 1, why, sizeof why)) {
        REPLY_ERROR(p, ATTNSTAT__CODE__BAD_REQUEST, 0, 0, "run name must be 1..%d bytes of "
                    "printable UTF-8 (no control or format characters): %s", PEER_RUN_MAX - 1,
                    why);
        return;
    }
    if (h->has_rank && h->rank < 0) {
        REPLY_ERROR(p, ATTNSTAT__CODE__BAD_REQUEST, 0, 0, "rank %d must be >= 0", h->rank);
        return;
    }
    const char *host = h->host && h->host[0] ? h->host : NULL;
    if (host && !util_printable(host, SESSION_HOST_MAX, why, sizeof why)) {
        REPLY_ERROR(p, ATTNSTAT__CODE__BAD_REQUEST, 0, 0, "host must be 1..%d bytes of "
                    "printable UTF-8 (no control or format characters): %s", SESSION_HOST_MAX,
                    why);
        return;
    }
    const char *config = h->config && h->config[0] ? h->config : NULL;
    if (config) {
        size_t clen = strlen(config);
        char jerr[160];
        if (clen > c->max_hello_config) {
            REPLY_ERROR(p, ATTNSTAT__CODE__BAD_REQUEST, 0, 0,
                        "config is %zu bytes, over max_hello_config %llu: send the run's "
                        "settings, not its data", clen, (unsigned long long)c->max_hello_config);
            return;
        }
        if (json_check_object(config, clen, jerr, sizeof jerr) != 0) {
            REPLY_ERROR(p, ATTNSTAT__CODE__BAD_REQUEST, 0, 0, "config must be a JSON object: %s",
                        jerr);
            return;
        }
    }
    if (h->n_device_uuids > SESSION_MAX_DEVICES) {
        REPLY_ERROR(p, ATTNSTAT__CODE__BAD_REQUEST, 0, 0,
                    "a Hello names %zu devices, more than %d", h->n_device_uuids,
                    SESSION_MAX_DEVICES);
        return;
    }
    for (size_t i = 0; i < h->n_device_uuids; i++) {
        if (!h->device_uuids[i] ||
            !util_printable(h->device_uuids[i], SESSION_UUID_MAX, why, sizeof why)) {
            REPLY_ERROR(p, ATTNSTAT__CODE__BAD_REQUEST, 0, 0, "device_uuids[%zu] must be 1..%d "
                        "bytes of printable text (\"GPU-...\"): %s", i, SESSION_UUID_MAX,
                        h->device_uuids[i] ? why : "it is missing");
            return;
        }
    }
    uid_t owner;
    int32_t rank = h->has_rank ? h->rank : 0;
    if (runs_owner(x->runs, run, &owner) && owner != p->uid) {
        REPLY_ERROR(p, ATTNSTAT__CODE__PERMISSION, 0, 0,
                    "run '%s' belongs to uid %u, who started it; uid %u may not write into it: "
                    "choose another run name", run, (unsigned)owner, (unsigned)p->uid);
        LOG_WARN("session", "client %llu (uid %u): Hello for run '%s' refused: it belongs to uid %u",
                 (unsigned long long)p->conn_id, (unsigned)p->uid, run, (unsigned)owner);
        return;
    }
    if (!runs_privileged(p->uid) && runs_unowned(x->runs, run)) { /* migrated, no owner kept */
        REPLY_ERROR(p, ATTNSTAT__CODE__PERMISSION, 0, 0,
                    "run '%s' was recorded by an older attnstatd, which kept no owner: only root "
                    "and attnstatd's uid %u may claim it; uid %u may not write into it: choose "
                    "another run name", run, (unsigned)geteuid(), (unsigned)p->uid);
        LOG_WARN("session", "client %llu (uid %u): Hello for run '%s' refused: it has no owner "
                 "(recorded by an older attnstatd)", (unsigned long long)p->conn_id,
                 (unsigned)p->uid, run);
        return;
    }
    char msg[256];
    if (validate_thresholds(h->thresholds, msg, sizeof msg) != 0) {
        reply_error(p, ATTNSTAT__CODE__BAD_REQUEST, 0, 0, msg);
        return;
    }
    /* The computation's parameter: the Hello's, else the config's. */
    const Attnstat__Thresholds *t = h->thresholds;
    double collapse = t && t->has_collapse_threshold ? t->collapse_threshold
                                                     : c->thresholds.collapse_threshold;
    char thjson[640], aerr[256];
    if (alerts_feed_check(x->feed, t, collapse, thjson, sizeof thjson, aerr, sizeof aerr) != 0) {
        REPLY_ERROR(p, ATTNSTAT__CODE__BAD_REQUEST, 0, 0, "thresholds: %s", aerr);
        return;
    }
    run_entry *e = runs_find(x->runs, run, rank);
    if (e && e->state == RUN_DELETING) {
        REPLY_ERROR(p, ATTNSTAT__CODE__BUSY, 0, 0,
                    "run '%s' rank %d is being deleted (attnstat delete-run): say Hello again "
                    "once it is gone, or choose another run name", run, (int)rank);
        return;
    }
    size_t config_bytes = config ? strlen(config) : 0;
    char quota[400];
    if (runs_quota(x->runs, e, p->uid, config_bytes, c->max_runs_per_uid,
                   c->max_config_bytes_per_uid, quota, sizeof quota) != 0) {
        counters_inc(x->cnt, CNT_HELLOS_OVER_QUOTA);
        LOG_WARN("session", "client %llu (uid %u): Hello for run '%s' rank %d refused: %s",
                 (unsigned long long)p->conn_id, (unsigned)p->uid, run, (int)rank, quota);
        reply_error(p, ATTNSTAT__CODE__BUSY, 0, 0, quota);
        return;
    }
    if (!e && !(e = runs_add(x->runs, run, rank, p->uid))) {
        reply_error(p, ATTNSTAT__CODE__INTERNAL, 0, 0, "out of memory registering the run");
        return;
    }
    e->config_bytes = config_bytes;
    if (!e->has_owner) { /* recorded before owners were kept: root or the daemon's uid takes it */
        e->has_owner = 1;
        e->owner = p->uid;
    }
    store_run_info info = {
        .name = run,
        .rank = rank,
        .host = host,
        .pid = h->has_pid ? h->pid : (p->c ? conn_pid(p->c) : 0),
        .time_ms = (int64_t)util_wall_ms(),
        .config = config,
        .thresholds = thjson,
    };
    /* The run's record goes to the store thread, ahead of every push of this connection: the Hello
     * is answered now, without waiting on the database. */
    if (life_hello(x, e, &info) != 0) {
        reply_error(p, ATTNSTAT__CODE__INTERNAL, 0, 0, "out of memory recording the run");
        return;
    }
    int64_t run_id = e->id;
    peer_hello(p, run_id, run, rank, h->has_pid, h->pid, collapse);
    if (alerts_feed_set_run(x->feed, run_id, h->thresholds, aerr, sizeof aerr) != 0)
        LOG_ERROR("session", "run %lld: thresholds refused by the alert engine: %s", (long long)run_id,
                  aerr);
    LOG_INFO("session", "client %llu: hello run '%s' (id %lld) rank %d pid %d uid %u host %s",
             (unsigned long long)p->conn_id, p->run, (long long)run_id, p->rank, (int)p->pid,
             (unsigned)p->uid, host ? host : "-");

    char *served[GPU_MAX_LOCAL];
    size_t nserved = serve_devices(x, p, h, served);
    Attnstat__HelloReply rep;
    Attnstat__Envelope env;
    envelope_hello_reply(&env, &rep, run_id, (uint32_t)c->max_frame, (uint32_t)c->queue_depth);
    rep.n_served_devices = nserved;
    rep.served_devices = served;
    static char *features[] = {"mask", "compute_dtype", "cu_seqlens_ref", "computed", "layout",
                               "sinks", "stats", "interventions"};
    rep.n_features = sizeof features / sizeof features[0];
    rep.features = features;
    rep.daemon_version = (char *)ATTNSTAT_DAEMON_VERSION;
    if (p->c)
        conn_write(p->c, &env, 1);
}

/* ---- the parallel layout -------------------------------------------------------------------- */

/* The layout's record, on the store thread (store_run_set_layout commits it itself: an op run
 * alone), ahead of every push that follows it on this connection. */
typedef struct {
    storer_op op;
    const stage_ctx *x;
    peer *p;
    int64_t run_id;
    store_layout l;
} layout_op;

static store_status layout_run(void *db, storer_op *op, store_error *err)
{
    layout_op *o = (layout_op *)op;
    return store_run_set_layout(db, o->run_id, &o->l, err);
}

static void layout_done(storer_op *op)
{
    layout_op *o = (layout_op *)op;
    peer *p = o->p;
    if (op->status != STORE_OK) {
        counters_store_error(o->x->cnt, op->err.msg);
        LOG_ERROR("session", "client %llu: recording the layout of run '%s': %s",
                  (unsigned long long)p->conn_id, p->run, op->err.msg);
        REPLY_ERROR(p, ATTNSTAT__CODE__INTERNAL, 0, 0, "the store could not record the layout of "
                    "run '%s': %s", p->run, op->err.msg);
    }
    peer_unref(p);
    free(o);
}

/* A ParallelLayout after Hello: checked, used for the pushes that follow (their global layer and
 * head numbers), and recorded with the run by the store thread before any of them is stored (a
 * failure to record it is answered with an Error). */
static void on_layout(const stage_ctx *x, peer *p, const Attnstat__ParallelLayout *m)
{
    if (!p->hello) {
        reply_error(p, ATTNSTAT__CODE__NO_HELLO, 0, 0, "ParallelLayout before Hello");
        return;
    }
    /* Unset: rank 0 of a group of 1, no offsets. A value past INT32_MAX stays past every bound. */
#define LAYOUT_FIELD(f, dflt) (m->has_##f ? (m->f > INT32_MAX ? INT32_MAX : (int32_t)m->f) : (dflt))
    store_layout l = {
        .tp_rank = LAYOUT_FIELD(tp_rank, 0), .tp_size = LAYOUT_FIELD(tp_size, 1),
        .pp_rank = LAYOUT_FIELD(pp_rank, 0), .pp_size = LAYOUT_FIELD(pp_size, 1),
        .dp_rank = LAYOUT_FIELD(dp_rank, 0), .dp_size = LAYOUT_FIELD(dp_size, 1),
        .cp_rank = LAYOUT_FIELD(cp_rank, 0), .cp_size = LAYOUT_FIELD(cp_size, 1),
        .layer_offset = LAYOUT_FIELD(layer_offset, 0), .head_offset = LAYOUT_FIELD(head_offset, -1),
    };
#undef LAYOUT_FIELD
    store_error se = {0, ""};
    if (store_layout_check(&l, &se) != STORE_OK) {
        reply_error(p, ATTNSTAT__CODE__BAD_REQUEST, 0, 0, se.msg);
        return;
    }
    layout_op *o = calloc(1, sizeof *o);
    if (!o) {
        reply_error(p, ATTNSTAT__CODE__INTERNAL, 0, 0, "out of memory recording the layout");
        return;
    }
    o->op.mode = STORER_ALONE;
    o->op.run = layout_run;
    o->op.done = layout_done;
    o->x = x;
    o->p = p;
    o->run_id = p->run_id;
    o->l = l;
    peer_ref(p);
    life_before_push(x, p->run_id); /* the run's record first, if it was rolled back */
    storer_submit(x->st, &o->op);
    peer_layout(p, &l);
    char heads[48];
    if (l.head_offset >= 0)
        snprintf(heads, sizeof heads, "%d", (int)l.head_offset);
    else
        snprintf(heads, sizeof heads, "tp_rank x heads");
    LOG_INFO("session", "client %llu: run '%s' rank %d layout tp %d/%d pp %d/%d dp %d/%d cp %d/%d, "
             "layer offset %d, head offset %s", (unsigned long long)p->conn_id, p->run, p->rank,
             (int)l.tp_rank, (int)l.tp_size, (int)l.pp_rank, (int)l.pp_size, (int)l.dp_rank,
             (int)l.dp_size, (int)l.cp_rank, (int)l.cp_size, (int)l.layer_offset, heads);
}

/* ---- interventions ---------------------------------------------------------------------------- */

/* An intervention on its way to the store thread: its fields copied (the message is freed once
 * handled), stored into the open batch like an alert. One allocation: the op, then the heads, the
 * values and the detail. */
typedef struct {
    storer_op op;
    const stage_ctx *x;
    peer *p;
    store_intervention iv;
    char kind[STORE_INTERVENTION_KIND_MAX + 1];
} interv_op;

static store_status interv_run(void *db, storer_op *op, store_error *err)
{
    interv_op *o = (interv_op *)op;
    return store_add_intervention(db, &o->iv, NULL, err);
}

static void interv_done(storer_op *op)
{
    interv_op *o = (interv_op *)op;
    peer *p = o->p;
    if (op->status == STORE_OK) {
        counters_inc(o->x->cnt, CNT_INTERVENTIONS_STORED);
        run_entry *e = runs_get(o->x->runs, o->iv.run_id); /* per run on /metrics */
        if (e) {
            e->interventions++;
            e->intervened_heads += (uint64_t)o->iv.nheads;
        }
    } else {
        counters_inc(o->x->cnt, CNT_INTERVENTIONS_REFUSED);
        counters_store_error(o->x->cnt, op->err.msg);
        LOG_ERROR("session", "client %llu: storing intervention %s of run '%s' step %lld: %s",
                  (unsigned long long)p->conn_id, o->kind, p->run, (long long)o->iv.step,
                  op->err.msg);
        REPLY_ERROR(p, ATTNSTAT__CODE__INTERNAL, 0, 0, "the store could not record intervention "
                    "%s of run '%s' at step %lld: %s", o->kind, p->run, (long long)o->iv.step,
                    op->err.msg);
    }
    peer_unref(p);
    free(o);
}

/* An Intervention refused: counted, answered with code and msg, and the first of each reason from
 * this client logged at warn level (as a refused push is). */
static void interv_refuse(const stage_ctx *x, peer *p, Attnstat__Code code, const char *msg)
{
    counters_inc(x->cnt, CNT_INTERVENTIONS_REFUSED);
    if (peer_first_reason(p, (int)code, msg))
        LOG_WARN("session", "client %llu (run '%s' rank %d): Intervention answered %s: %s (the "
                 "first of its kind from this client; attnstat_interventions_refused_total counts "
                 "them)", (unsigned long long)p->conn_id, p->hello ? p->run : "-", (int)p->rank,
                 names_code((int)code), msg);
    reply_error(p, code, 0, 0, msg);
}

/* An Intervention after Hello: checked field by field, its layer and heads made global by the
 * layout in force (peer_global(), as a push's), and stored with the run by the store thread, in
 * order with this connection's pushes. Nothing comes back unless it is refused. */
static void on_intervention(const stage_ctx *x, peer *p, const Attnstat__Intervention *m)
{
    char msg[512];
    if (!p->hello) {
        interv_refuse(x, p, ATTNSTAT__CODE__NO_HELLO, "Intervention before Hello");
        return;
    }
    if (validate_intervention(m, msg, sizeof msg) != 0) {
        interv_refuse(x, p, ATTNSTAT__CODE__BAD_REQUEST, msg);
        return;
    }
    int64_t span = 0;
    for (size_t i = 0; i < m->n_heads; i++)
        if ((int64_t)m->heads[i] + 1 > span)
            span = (int64_t)m->heads[i] + 1;
    if (p->has_layout && p->layout.head_offset < 0 && p->layout.tp_rank > 0 && span > 0 &&
        p->heads_q == 0) {
        util_err(msg, sizeof msg, "intervention.heads: the layout numbers this process's heads "
                 "from tp_rank %d x its pushes' query heads, and no push of this connection has "
                 "said how many it has: push first, or give the layout a head_offset",
                 (int)p->layout.tp_rank);
        interv_refuse(x, p, ATTNSTAT__CODE__BAD_REQUEST, msg);
        return;
    }
    int32_t glayer, head_base;
    if (peer_global(p, m->has_layer ? m->layer : 0, p->heads_q, span, &glayer, &head_base, msg,
                    sizeof msg) != 0) {
        interv_refuse(x, p, ATTNSTAT__CODE__BAD_REQUEST, msg);
        return;
    }
    size_t dlen = m->detail ? strlen(m->detail) + 1 : 0;
    interv_op *o = calloc(1, sizeof *o + m->n_heads * (sizeof(int32_t) + sizeof(double)) + dlen);
    if (!o) {
        interv_refuse(x, p, ATTNSTAT__CODE__INTERNAL, "out of memory recording the intervention");
        return;
    }
    /* the values first (aligned after the op), then the heads, then the detail */
    double *values = (double *)(o + 1);
    int32_t *heads = (int32_t *)(values + m->n_heads);
    char *detail = (char *)(heads + m->n_heads);
    for (size_t i = 0; i < m->n_heads; i++) {
        heads[i] = head_base + (int32_t)m->heads[i];
        values[i] = m->n_values ? m->values[i] : 0.0;
    }
    if (dlen)
        memcpy(detail, m->detail, dlen);
    snprintf(o->kind, sizeof o->kind, "%s", m->kind);
    o->iv = (store_intervention){
        .run_id = p->run_id,
        .rank = p->rank,
        .step = m->step,
        .time_ms = (int64_t)util_wall_ms(),
        .kind = o->kind,
        .layer = m->has_layer ? glayer : -1,
        .heads = heads,
        .nheads = (int32_t)m->n_heads,
        .values = m->n_values ? values : NULL,
        .threshold = m->has_threshold ? m->threshold : NAN,
        .measured = m->has_measured ? m->measured : NAN,
        .detail = dlen ? detail : NULL,
    };
    o->op.mode = STORER_BATCHED;
    o->op.run = interv_run;
    o->op.done = interv_done;
    o->x = x;
    o->p = p;
    peer_ref(p);
    life_before_push(x, p->run_id); /* the run's record first, if it was rolled back */
    storer_submit(x->st, &o->op);
    LOG_DEBUG("session", "client %llu: run '%s' rank %d: intervention %s at step %lld, layer %d, "
              "%zu heads", (unsigned long long)p->conn_id, p->run, p->rank, o->kind,
              (long long)m->step, (int)o->iv.layer, m->n_heads);
}

/* ---- buffers -------------------------------------------------------------------------------- */

static void on_register_buffer(const stage_ctx *x, peer *p, const Attnstat__RegisterBuffer *rb)
{
    if (!p->hello) {
        REPLY_ERROR(p, ATTNSTAT__CODE__NO_HELLO, 1, rb->id, "RegisterBuffer %u before Hello",
                    rb->id);
        return;
    }
    char msg[512];
    Attnstat__Code code = buffers_register(p->bufs, x, rb, p->uid, p->conn_id, msg, sizeof msg);
    if (code != ATTNSTAT__CODE__OK)
        reply_error(p, code, 1, rb->id, msg);
}

static void on_register_event(const stage_ctx *x, peer *p, const Attnstat__RegisterEvent *re)
{
    if (!p->hello) {
        REPLY_ERROR(p, ATTNSTAT__CODE__NO_HELLO, 1, re->id, "RegisterEvent %u before Hello",
                    re->id);
        return;
    }
    char msg[512];
    Attnstat__Code code = buffers_register_event(p->bufs, x, re, msg, sizeof msg);
    if (code != ATTNSTAT__CODE__OK)
        reply_error(p, code, 1, re->id, msg);
}

static void on_forget(peer *p, const Attnstat__Forget *f)
{
    if (!p->hello) {
        reply_error(p, ATTNSTAT__CODE__NO_HELLO, 0, 0, "Forget before Hello");
        return;
    }
    char msg[512];
    if (f->has_buffer_id &&
        buffers_forget_buffer(p->bufs, f->buffer_id, msg, sizeof msg) != ATTNSTAT__CODE__OK)
        reply_error(p, ATTNSTAT__CODE__UNKNOWN_BUFFER, 1, f->buffer_id, msg);
    if (f->has_event_id &&
        buffers_forget_event(p->bufs, f->event_id, msg, sizeof msg) != ATTNSTAT__CODE__OK)
        reply_error(p, ATTNSTAT__CODE__UNKNOWN_BUFFER, 1, f->event_id, msg);
    if (!f->has_buffer_id && !f->has_event_id)
        reply_error(p, ATTNSTAT__CODE__BAD_REQUEST, 0, 0,
                    "Forget names neither buffer_id nor event_id");
}

/* ---- dispatch ------------------------------------------------------------------------------- */

static void dispatch(const stage_ctx *x, peer *p, const Attnstat__Envelope *env)
{
    switch (env->msg_case) {
    case ATTNSTAT__ENVELOPE__MSG_HELLO:
        on_hello(x, p, env->hello);
        break;
    case ATTNSTAT__ENVELOPE__MSG_REGISTER_BUFFER:
        on_register_buffer(x, p, env->register_buffer);
        break;
    case ATTNSTAT__ENVELOPE__MSG_REGISTER_EVENT:
        on_register_event(x, p, env->register_event);
        break;
    case ATTNSTAT__ENVELOPE__MSG_FORGET:
        on_forget(p, env->forget);
        break;
    case ATTNSTAT__ENVELOPE__MSG_PUSH:
        push_receive(x, p, env->push);
        break;
    case ATTNSTAT__ENVELOPE__MSG_COMPUTED:
        push_receive_computed(x, p, env->computed);
        break;
    case ATTNSTAT__ENVELOPE__MSG_SUBSCRIBE:
        if (p->c) {
            peer_subscribe(p, env->subscribe->alerts, env->subscribe->results);
            LOG_INFO("session", "client %llu subscribed (alerts %d, results %d)",
                     (unsigned long long)p->conn_id, p->sub_alerts, p->sub_results);
        }
        break;
    case ATTNSTAT__ENVELOPE__MSG_STATUS:
        if (p->c)
            status_send(x, p->c);
        break;
    case ATTNSTAT__ENVELOPE__MSG_GOODBYE:
        if (p->hello) {
            peer_goodbye(p);
            LOG_INFO("session", "client %llu: goodbye from run '%s' (id %lld): it ends when this "
                     "connection closes", (unsigned long long)p->conn_id, p->run,
                     (long long)p->run_id);
        }
        break;
    case ATTNSTAT__ENVELOPE__MSG_COMMAND:
        command_handle(x, p, env->command);
        break;
    case ATTNSTAT__ENVELOPE__MSG_LAYOUT:
        on_layout(x, p, env->layout);
        break;
    case ATTNSTAT__ENVELOPE__MSG_INTERVENTION:
        on_intervention(x, p, env->intervention);
        break;
    case ATTNSTAT__ENVELOPE__MSG_HELLO_REPLY:
    case ATTNSTAT__ENVELOPE__MSG_RELEASE:
    case ATTNSTAT__ENVELOPE__MSG_ACK:
    case ATTNSTAT__ENVELOPE__MSG_ALERT:
    case ATTNSTAT__ENVELOPE__MSG_RESULT:
    case ATTNSTAT__ENVELOPE__MSG_STATUS_REPLY:
    case ATTNSTAT__ENVELOPE__MSG_COMMAND_REPLY:
    case ATTNSTAT__ENVELOPE__MSG_ERROR:
        REPLY_ERROR(p, ATTNSTAT__CODE__BAD_REQUEST, 0, 0,
                    "message type %d is sent by the daemon, not to it", (int)env->msg_case);
        break;
    default:
        REPLY_ERROR(p, ATTNSTAT__CODE__BAD_REQUEST, 0, 0,
                    "unknown or empty message (no known field of Envelope is set): this daemon "
                    "speaks protocol version %u", FRAME_PROTOCOL_VERSION);
        break;
    }
}

void session_handle(const stage_ctx *x, peer *p, const Attnstat__Envelope *env)
{
    peer_ref(p);
    dispatch(x, p, env);
    peer_unref(p);
}
