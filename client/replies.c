/* replies.c — libattnstat's handling of what attnstatd sends (see replies.h).
 *
 * An Ack ends a push: OK (results delivered to the result callback when asked for), DROPPED by the
 * daemon's full queue, or another code (a rejection, with the daemon's message). A Release hands a
 * push's memory back before its Ack (the daemon has read the tensors): its ring block (host or
 * staged device ring) and interprocess event go back, and a zero-copy push's release callback
 * runs. Which one comes first varies; both are idempotent per push. An Error whose ref names one of
 * our GPU registrations marks that device unusable for later pushes. When the connection is lost,
 * every push still in flight is released the same way and its slot freed (abandoned).
 *
 * Stage: the receiving end. Calls util.c, ring.c, gpu_export.c, proto/frame.c and the user's
 * callbacks. */
#include "replies.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "wire_vocab.h"

#define REPLIES_READ_FRAME_MAX (64u << 20) /* the daemon's max_frame is at most 64 MiB */

static void replies_set_last(attnstat_client *c, int code, const char *msg)
{
    c->st.last_code = code;
    util_copy_str(c->st.last_error, sizeof c->st.last_error, msg);
}

/* ---- Results ---------------------------------------------------------------------------------- */
void replies_head_result(attnstat_head_result *o, const Attnstat__HeadStats *h)
{
    memset(o, 0, sizeof *o);
    o->head = h->head;
    o->sampled = h->has_sampled && h->sampled;
    /* A count the daemon left out reads 0, a statistic NaN (vocab.h's rows, in table order). */
#define X(name, ...) o->name = h->name;
    VOCAB_COUNTS(X)
#undef X
#define X(name, ...) o->name = h->has_##name ? h->name : NAN;
    VOCAB_STATS(X)
#undef X
}

/* src: a subscribed Result's origin (NULL for an Ack's results). */
static void replies_deliver_results(attnstat_client *c, uint64_t seq, int64_t step, uint32_t layer,
                                    Attnstat__HeadStats **heads, size_t n,
                                    const attnstat_result_source *src)
{
    if ((!c->result_fn && !(src && c->run_result_fn)) || n == 0)
        return;
    attnstat_head_result *r = calloc(n, sizeof *r);
    if (!r)
        return; /* results are best effort; the counters are still right */
    for (size_t i = 0; i < n; i++)
        replies_head_result(&r[i], heads[i]);
    if (c->result_fn)
        c->result_fn(c->result_user, seq, step, layer, r, n);
    if (src && c->run_result_fn)
        c->run_result_fn(c->run_result_user, src, r, n);
    free(r);
}

/* ---- Releasing pushes ------------------------------------------------------------------------- */
/* The daemon no longer reads push f's memory: GPU resources back to their pools, and the release
 * callback for pushes that referenced the caller's memory. Once per push. */
static void replies_release_slot(attnstat_client *c, client_inflight *f)
{
    if (f->released)
        return;
    f->released = 1;
    if (f->gh.dev >= 0) {
        gpu_release(c->gpu, f->seq, &f->gh);
        f->gh.dev = -1;
    }
    if (f->held) {
        f->held = 0;
        c->st.releases_pending--;
        if (c->release_fn)
            c->release_fn(c->release_user, f->seq);
    }
}

static client_inflight *replies_slot(attnstat_client *c, uint64_t seq)
{
    client_inflight *f = c->inflight ? &c->inflight[seq & (CLIENT_MAX_INFLIGHT - 1)] : NULL;
    return f && seq != 0 && f->seq == seq ? f : NULL;
}

static void replies_on_release(attnstat_client *c, uint64_t seq)
{
    client_inflight *f = replies_slot(c, seq);
    int counted = ring_release(&c->ring, seq) == 0;
    if (f && !f->released) {
        counted |= f->gh.dev >= 0;
        replies_release_slot(c, f);
    }
    if (counted)
        c->st.released++;
}

uint64_t replies_abandon_all(attnstat_client *c)
{
    if (!c->inflight)
        return 0;
    uint64_t n = 0;
    for (uint32_t i = 0; i < CLIENT_MAX_INFLIGHT; i++) {
        client_inflight *f = &c->inflight[i];
        if (f->seq == 0)
            continue;
        replies_release_slot(c, f);
        ring_release(&c->ring, f->seq);
        f->seq = 0;
        n++;
    }
    c->st.in_flight = c->st.in_flight > n ? c->st.in_flight - n : 0;
    c->st.abandoned += n;
    return n;
}

/* ---- Messages --------------------------------------------------------------------------------- */
static void replies_on_ack(attnstat_client *c, const Attnstat__Ack *a)
{
    client_inflight *f = c->inflight ? &c->inflight[a->seq & (CLIENT_MAX_INFLIGHT - 1)] : NULL;
    if (!f || f->seq != a->seq || a->seq == 0) {
        c->st.errors++;
        replies_set_last(c, ATTNSTAT__CODE__INTERNAL, "attnstatd acknowledged an unknown push");
        return;
    }
    int64_t step = f->step;
    uint32_t layer = f->layer;
    replies_release_slot(c, f); /* a non-OK Ack releases; after a Release this does nothing */
    f->seq = 0;
    c->st.in_flight--;
    /* A non-OK Ack releases without a Release; an OK Ack after its Release frees nothing. */
    ring_release(&c->ring, a->seq);
    if (a->code == ATTNSTAT__CODE__OK) {
        c->st.acked++;
        replies_deliver_results(c, a->seq, step, layer, a->heads, a->n_heads, NULL);
        return;
    }
    if (a->code == ATTNSTAT__CODE__DROPPED)
        c->st.dropped_daemon++;
    else
        c->st.rejected++;
    char msg[256];
    snprintf(msg, sizeof msg, "push of step %lld layer %u: %s", (long long)step, layer,
             a->message && *a->message ? a->message : "refused by attnstatd");
    replies_set_last(c, a->code, msg);
    if (c->ack_fn)
        c->ack_fn(c->ack_user, a->seq, step, layer, a->code, a->message ? a->message : "");
}

static void replies_on_alert(attnstat_client *c, const Attnstat__Alert *a)
{
    c->st.alerts++;
    if (!c->alert_fn)
        return;
    attnstat_alert al;
    memset(&al, 0, sizeof al);
    al.run = a->run ? a->run : "";
    al.message = a->message ? a->message : "";
    al.run_id = a->run_id;
    al.rank = a->has_rank ? a->rank : 0;
    al.layer = a->layer;
    al.head = a->head;
    al.step = a->step;
    al.rule = a->rule;
    al.state = a->state;
    al.value = a->has_value ? a->value : NAN;
    al.threshold = a->has_threshold ? a->threshold : NAN;
    al.time_ms = a->has_time_ms ? a->time_ms : 0;
    c->alert_fn(c->alert_user, &al);
}

static void replies_on_hello_reply(attnstat_client *c, const Attnstat__HelloReply *h)
{
    c->got_hello_reply = 1;
    c->run_id = h->run_id;
    c->features = 0;
    for (size_t i = 0; i < h->n_features; i++) {
        const char *f = h->features[i] ? h->features[i] : "";
        c->features |= strcmp(f, "mask") == 0              ? CLIENT_FEATURE_MASK
                       : strcmp(f, "compute_dtype") == 0   ? CLIENT_FEATURE_COMPUTE_DTYPE
                       : strcmp(f, "cu_seqlens_ref") == 0  ? CLIENT_FEATURE_CU_REF
                       : strcmp(f, "computed") == 0        ? CLIENT_FEATURE_COMPUTED
                       : strcmp(f, "layout") == 0          ? CLIENT_FEATURE_LAYOUT
                       : strcmp(f, "sinks") == 0           ? CLIENT_FEATURE_SINKS
                       : strcmp(f, "stats") == 0           ? CLIENT_FEATURE_STATS
                       : strcmp(f, "interventions") == 0   ? CLIENT_FEATURE_INTERVENTIONS
                                                           : 0u;
    }
    if (h->max_frame >= 256 && h->max_frame < c->max_frame)
        c->max_frame = h->max_frame;
    /* Replies (StatusReply, Ack with results) may be as large as the daemon's max_frame: read
     * frames up to that (bounded by the largest max_frame a daemon accepts). */
    if (h->max_frame > c->rd.max_frame)
        c->rd.max_frame = h->max_frame < REPLIES_READ_FRAME_MAX ? h->max_frame
                                                                : REPLIES_READ_FRAME_MAX;
}

static void replies_on_error(attnstat_client *c, const Attnstat__Error *e)
{
    c->st.errors++;
    replies_set_last(c, e->code, e->message);
    c->wait_error = e->code ? (int)e->code : -1;
    c->wait_error_has_ref = e->has_ref;
    c->wait_error_ref = e->ref;
    if (e->has_ref)
        gpu_on_refused(c->gpu, e->ref, e->message);
    else if (!c->closed) /* about the connection: the reason, should it end now (conn.c) */
        util_copy_str(c->last_conn_error, sizeof c->last_conn_error, e->message);
}

/* Handles one decoded message. Returns 1 when the envelope was kept (not to be freed). */
static int replies_handle(attnstat_client *c, Attnstat__Envelope *env)
{
    if (env->msg_case != ATTNSTAT__ENVELOPE__MSG_ERROR)
        c->last_conn_error[0] = '\0';
    switch (env->msg_case) {
    case ATTNSTAT__ENVELOPE__MSG_HELLO_REPLY:
        replies_on_hello_reply(c, env->hello_reply);
        return 0;
    case ATTNSTAT__ENVELOPE__MSG_RELEASE:
        replies_on_release(c, env->release->seq);
        return 0;
    case ATTNSTAT__ENVELOPE__MSG_ACK:
        replies_on_ack(c, env->ack);
        return 0;
    case ATTNSTAT__ENVELOPE__MSG_ALERT:
        replies_on_alert(c, env->alert);
        return 0;
    case ATTNSTAT__ENVELOPE__MSG_RESULT: {
        const Attnstat__Result *res = env->result;
        attnstat_result_source src = {.run = res->run ? res->run : "", .run_id = res->run_id,
                                      .step = res->step, .layer = res->layer};
        replies_deliver_results(c, 0, res->step, res->layer, res->heads, res->n_heads, &src);
        return 0;
    }
    case ATTNSTAT__ENVELOPE__MSG_STATUS_REPLY:
        replies_forget_status(c);
        c->status_env = env;
        return 1;
    case ATTNSTAT__ENVELOPE__MSG_ERROR:
        replies_on_error(c, env->error);
        return 0;
    default:
        return 0; /* messages meant for the daemon, or from a newer protocol: ignored */
    }
}

void replies_on_frame(attnstat_client *c, const uint8_t *payload, uint32_t len)
{
    Attnstat__Envelope *env = frame_decode(payload, len, NULL);
    if (!env) {
        c->st.errors++;
        replies_set_last(c, ATTNSTAT__CODE__FRAME, "undecodable message from attnstatd");
        return;
    }
    if (!replies_handle(c, env))
        attnstat__envelope__free_unpacked(env, NULL);
}

/* ---- Status ----------------------------------------------------------------------------------- */
void replies_forget_status(attnstat_client *c)
{
    if (c->status_env) {
        attnstat__envelope__free_unpacked(c->status_env, NULL);
        c->status_env = NULL;
    }
}

void replies_status_out(const attnstat_client *c, attnstat_daemon_status *out)
{
    const Attnstat__StatusReply *r = c->status_env->status_reply;
    memset(out, 0, sizeof *out);
    util_copy_str(out->daemon_version, sizeof out->daemon_version, r->daemon_version);
    util_copy_str(out->db_path, sizeof out->db_path, r->db_path);
    out->uptime_s = r->uptime_s;
    out->push_rate = r->push_rate;
    out->clients = r->clients;
    out->alerts_active = r->alerts_active;
    out->pushes = r->pushes;
    out->pushes_done = r->pushes_done;
    out->dropped = r->dropped;
    out->rejected = r->rejected;
    out->samples_stored = r->samples_stored;
    out->failed = r->failed;
    out->store_errors = r->store_errors;
    util_copy_str(out->last_store_error, sizeof out->last_store_error, r->last_store_error);
    for (size_t i = 0; i < r->n_workers && i < ATTNSTAT_STATUS_MAX_WORKERS; i++) {
        const Attnstat__WorkerStatus *w = r->workers[i];
        attnstat_worker_status *o = &out->workers[out->n_workers++];
        util_copy_str(o->name, sizeof o->name, w->name);
        o->queue_depth = w->queue_depth;
        o->queue_capacity = w->queue_capacity;
        o->processed = w->processed;
        o->dropped = w->dropped;
        o->busy_frac = w->has_busy_frac ? w->busy_frac : 0;
    }
    for (size_t i = 0; i < r->n_client_list && i < ATTNSTAT_STATUS_MAX_CLIENTS; i++) {
        const Attnstat__ClientStatus *cs = r->client_list[i];
        attnstat_client_status *o = &out->client_list[out->n_client_list++];
        o->id = cs->id;
        util_copy_str(o->run, sizeof o->run, cs->run);
        o->rank = cs->rank;
        o->pid = cs->pid;
        o->uid = cs->uid;
        o->pushes = cs->pushes;
        o->dropped = cs->dropped;
        o->rejected = cs->rejected;
    }
    for (size_t i = 0; i < r->n_rejections && i < ATTNSTAT_STATUS_MAX_REJECTIONS; i++) {
        const Attnstat__Rejection *rj = r->rejections[i];
        attnstat_rejection *o = &out->rejections[out->n_rejections++];
        o->code = (int32_t)rj->code;
        o->count = rj->count;
        util_copy_str(o->last_message, sizeof o->last_message, rj->last_message);
    }
}

/* ---- Callbacks -------------------------------------------------------------------------------- */
void attnstat_set_alert_callback(attnstat_client *c, attnstat_alert_fn fn, void *user)
{
    if (c) {
        c->alert_fn = fn;
        c->alert_user = user;
    }
}

void attnstat_set_result_callback(attnstat_client *c, attnstat_result_fn fn, void *user)
{
    if (c) {
        c->result_fn = fn;
        c->result_user = user;
    }
}

void attnstat_set_run_result_callback(attnstat_client *c, attnstat_run_result_fn fn, void *user)
{
    if (c) {
        c->run_result_fn = fn;
        c->run_result_user = user;
    }
}

void attnstat_set_ack_callback(attnstat_client *c, attnstat_ack_fn fn, void *user)
{
    if (c) {
        c->ack_fn = fn;
        c->ack_user = user;
    }
}

void attnstat_set_release_callback(attnstat_client *c, attnstat_release_fn fn, void *user)
{
    if (c) {
        c->release_fn = fn;
        c->release_user = user;
    }
}
