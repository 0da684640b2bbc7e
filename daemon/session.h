/* session.h — one client's protocol state: its Hello (run, rank, thresholds), its registered
 * buffers (shared-memory segments mapped read-only), and its pushes from receipt to submission.
 *
 * Lifetime. A session is reference-counted: its connection holds one reference, and every push in
 * flight holds one. When the connection closes, session_detach() forgets its buffers (each mapping
 * is unmapped when the last push reading it has finished) and drops the connection's reference;
 * pushes still in flight finish, are stored, and are not answered. Loop thread only. */
#ifndef ATTNSTAT_SESSION_H
#define ATTNSTAT_SESSION_H

#include <stdint.h>

#include "attnstat.pb-c.h"
#include "config.h"
#include "gpu.h"
#include "stats.h"
#include "validate.h"
#include "worker.h"

typedef struct server server;
typedef struct conn conn;
typedef struct session session;
typedef struct session_map session_map;

#define SESSION_RUN_MAX 256

struct session {
    server *srv;
    conn *c;                 /* NULL once the connection closed */
    int refs;
    uint64_t conn_id;
    int hello;
    int64_t run_id;
    char run[SESSION_RUN_MAX];
    int32_t rank;
    int32_t pid;             /* from Hello, else SO_PEERCRED */
    cfg_thresholds th;       /* effective thresholds: config overridden by the Hello */
    struct session_buf *bufs;
    uint32_t nbufs, capbufs;
    struct session_event *evs;   /* CUDA IPC events */
    uint32_t nevs, capevs;
    int gone;                /* the connection closed (read atomically by GPU workers) */
    uint32_t inflight;       /* pushes not yet acknowledged (holding a reference) */
    uint32_t computing;      /* of those, queued or computing in a worker (client_inflight) */
    uint64_t pushes, dropped, rejected;
};

/* A push between receipt and its Ack. The worker job comes first so that a finished job converts
 * back to its push. */
typedef struct session_push session_push;
struct session_push {
    worker_job job;
    session *s;
    uint64_t seq;
    int64_t step;
    uint32_t layer;
    int want_results;
    session_map *maps[3];
    int nmaps;
    gpu_refs gref;           /* device pushes: buffers and event, referenced until unmapped */
    int computing;           /* counted in s->computing */
    validate_plan plan;
    uint64_t received_ns;
    int64_t time_ms;
    Attnstat__Code code;     /* outcome, set by the pipeline */
    char msg[256];
    session_push *next;      /* pipeline batch link */
};

session *session_new(server *srv, conn *c);
/* The connection is closing: forget buffers, drop the connection's reference. */
void session_detach(session *s);
/* Handles one decoded message from the client. */
void session_handle(session *s, const Attnstat__Envelope *env);

/* The worker no longer reads the push's memory: drop its buffer references (unmapping buffers
 * that were forgotten meanwhile). Idempotent. */
void session_push_unmap(session_push *p);
/* Frees a push (after its Ack, or when nobody is left to ack): drops its session reference. */
void session_push_free(session_push *p);

/* Sends Ack{seq, code, message} to the push's client when it is still connected. heads may be
 * NULL. */
void session_send_ack(session_push *p, Attnstat__Code code, const char *msg,
                      Attnstat__HeadStats **heads, size_t nheads);

#endif /* ATTNSTAT_SESSION_H */
