/* server.h — the daemon's context and its connections. server.c owns the libuv loop: the Unix
 * socket (bind, mode 0660, SO_PEERCRED policy), accept, per-connection reads through frame_reader,
 * the write queue with its per-connection cap, signals and orderly shutdown. Protocol handling is
 * session.c's; results, the store batch and alert delivery are pipeline.c's.
 *
 * Ownership (libuv's rules): a conn is allocated at accept and freed only in its handle's close
 * callback; each queued write owns its frame buffer until its write callback. A conn's session may
 * outlive it (in-flight pushes hold references); the session learns of the close through
 * session_detach(). */
#ifndef ATTNSTAT_SERVER_H
#define ATTNSTAT_SERVER_H

#include <stdint.h>
#include <sys/types.h>
#include <uv.h>

#include "attnstat.pb-c.h"
#include "config.h"
#include "frame.h"
#include "gpu.h"
#include "metrics.h"
#include "store_read.h"
#include "store_write.h"
#include "worker.h"

typedef struct session session;
typedef struct pipeline pipeline;
typedef struct server server;
typedef struct conn conn;

struct conn {
    uv_pipe_t pipe;          /* must stay first: the handle's address is the conn's */
    server *srv;
    conn *prev, *next;
    uint64_t id;
    frame_reader rd;
    session *sess;
    pid_t pid;
    uid_t uid;
    gid_t gid;
    size_t out_bytes;        /* queued, not yet written */
    int reading;             /* uv_read_start active */
    int paused;              /* reading stopped because out_bytes is over the cap */
    int closing;             /* uv_close called */
    int shutting;            /* uv_shutdown pending */
    int eof;                 /* the client half-closed: close once its pushes are answered */
    uint64_t flush_since_ns; /* when shutting began */
    int sub_alerts, sub_results;
    uint64_t msgs_dropped;
    uv_shutdown_t shutdown_req;
};

struct server {
    const cfg *cfg;
    uv_loop_t *loop;
    uv_pipe_t listener;
    uv_signal_t sig_int, sig_term;
    uv_timer_t grace_timer;  /* bounds the shutdown */
    uv_timer_t tick;         /* once a second: housekeeping */
    int listening;
    worker_pool *pool;
    worker *cpu;             /* the CPU worker */
    gpu_devinfo gpus[GPU_MAX_LOCAL]; /* local devices, found at start-up */
    int ngpus;
    char gpu_why[256];       /* why there are none */
    worker *gpu_w[GPU_MAX_LOCAL];    /* a device's worker, started when a client first names it */
    gpu_ctx *gpu_c[GPU_MAX_LOCAL];
    store *db;
    pipeline *pipe;
    metrics m;
    void *metrics_http;
    conn *conns;
    uint32_t nconns;
    uint64_t next_conn_id;
    uid_t uid;
    int have_allow_gid;
    gid_t allow_gid;
    int stopping;            /* shutdown requested */
    int draining_done;       /* queued work finished; connections are closing */
    int torn_down;           /* workers stopped, handles closing */
    int pool_closed;
    int exit_code;
    uint64_t accept_failures;    /* accept errors (EMFILE...), logged at most once a second */
    uint64_t accept_logged_ns;
};

/* Runs the daemon until SIGINT/SIGTERM. Returns the process exit status. */
int server_run(const cfg *c);

/* Queues one envelope to c. essential: Ack/Release/Error/replies, always queued (a connection
 * whose queue is far over the cap is closed instead); non-essential (Result/Alert to a subscriber)
 * is dropped and counted when the connection is over its cap. Returns 0 when queued. */
int server_send(conn *c, const Attnstat__Envelope *env, int essential);

/* Sends Error{code, message, ref} (ref when has_ref). */
void server_send_error(conn *c, Attnstat__Code code, const char *msg, int has_ref, uint64_t ref);

/* Closes c (idempotent). why is logged. */
void server_close_conn(conn *c, const char *why);

/* The index in s->gpus of the local device with this UUID, or -1. */
int server_gpu_find(const server *s, const char *uuid);
/* The worker of local device idx, started now when it has none. NULL with err set on failure. */
worker *server_gpu_worker(server *s, int idx, char *err, size_t errlen);

/* Called by the pipeline when the last in-flight push finished (shutdown waits for that). */
void server_maybe_finish(server *s);

#endif /* ATTNSTAT_SERVER_H */
