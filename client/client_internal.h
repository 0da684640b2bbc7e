/* client_internal.h — the one struct the files of libattnstat share: struct attnstat_client, the
 * in-flight slot of a push, and the phases of the client's link to the daemon. Internal to the
 * library (never installed, never seen by callers).
 *
 * Who touches which fields (a file reads what it needs; it writes only its own):
 *   conn.c     the socket and its byte queues: fd, closed, why_closed, sock_path, rd, oq*; back to
 *              the defaults of a new connection (max_frame, rd.max_frame) when one is made.
 *   session.c  allocates the client (attnstat_connect) and sets every default, on_frame included;
 *              hello_sent; background; hello_pending when it sets it (a background client's
 *              hello kept for later); timeout_ms (for the length of one attnstat_status call);
 *              wait_error (cleared before it waits for a reply); sub_* (what attnstat_subscribe
 *              asked for); flush_abandoned; has_layout and layout (attnstat_set_layout).
 *   link.c     the link's phase and reconnection (link_*, hello_*), hello_done, hello_pending
 *              when it clears it (the run is established), got_hello_reply (cleared
 *              before a Hello), the link counters of st (disconnects, reconnects,
 *              dropped_disconnected, and dropped_local for the pushes it drops).
 *   hostring.c the host ring: shm_*, map, ring, inflight (allocates it), st.ring_bytes.
 *   push.c     the pushes: fills an in-flight slot when a push is sent, next_seq, gpu; the push
 *              counters of st (pushed, sent, in_flight++, dropped_*, cuda_*, releases_pending++).
 *   local.c    local mode: local_on, local; for its pushes, what push.c does for the others, and
 *              for their completion what replies.c does on a Release (releases_pending--,
 *              in_flight-- and the slot when the result cannot be sent).
 *   replies.c  what the daemon answers: run_id, got_hello_reply, features, status_env, wait_error*, the
 *              callbacks, in-flight slots (frees them), max_frame and rd.max_frame (set from the
 *              HelloReply), the reply counters of st (acked, released, errors, alerts, rejected,
 *              dropped_daemon, abandoned, in_flight--, releases_pending--, last_*).
 *   every file err, through client_fail() (the message of the last failed call).
 *
 * Stage: a header below every file of the library; includes the public header, the framing of
 * proto/, and the ring and GPU headers for the types of its fields. */
#ifndef ATTNSTAT_CLIENT_INTERNAL_H
#define ATTNSTAT_CLIENT_INTERNAL_H

#include <stdint.h>
#include <sys/un.h>

#include "attnstat.h"
#include "frame.h"
#include "gpu_export.h"
#include "ring.h"
#include "util.h"

#define CLIENT_MAX_INFLIGHT 16384u /* power of two: the in-flight table is indexed by seq */
#define CLIENT_RING_ID 1u          /* the buffer id of the host ring */

/* Where the client stands with the daemon (link.c). A client starts UP once connected; hello
 * takes it through HELLO and REGISTER back to UP. A connection lost after a successful hello (or
 * by a client that never says hello) goes DOWN, and each attempt goes CONNECTING (when the connect
 * does not complete at once), HELLO (a run to resume), REGISTER, and UP again; an attempt that
 * fails goes DOWN with a longer delay. CLOSED is for good: refused, or lost before hello
 * succeeded. A background client (ATTNSTAT_CONNECT_BACKGROUND) whose daemon is not there yet
 * starts DOWN, as after a loss (link_first set), and its attempts say a hello kept meanwhile
 * (hello_pending) as they would say a run's to resume. */
typedef enum {
    LINK_UP = 0,     /* connected: the run (after hello) and the subscription established */
    LINK_HELLO,      /* Hello sent: waiting for the HelloReply */
    LINK_REGISTER,   /* ring, GPU registrations, Subscribe and a Status sent: waiting for the
                        StatusReply that confirms them */
    LINK_DOWN,       /* no connection: the next attempt at link_retry_at */
    LINK_CONNECTING, /* a non-blocking connect under way */
    LINK_CLOSED,     /* gone for good */
} link_phase;

/* A push sent and not yet acknowledged (slot seq & (CLIENT_MAX_INFLIGHT - 1)). */
/* What the daemon takes beyond the first protocol (HelloReply.features). */
#define CLIENT_FEATURE_MASK 1u          /* "mask" */
#define CLIENT_FEATURE_COMPUTE_DTYPE 2u /* "compute_dtype" */
#define CLIENT_FEATURE_CU_REF 4u        /* "cu_seqlens_ref" */
#define CLIENT_FEATURE_COMPUTED 8u      /* "computed": results computed by the client (local.c) */
#define CLIENT_FEATURE_LAYOUT 16u       /* "layout" */
#define CLIENT_FEATURE_SINKS 32u        /* "sinks" */
#define CLIENT_FEATURE_STATS 64u        /* "stats": Push.stats, a push's choice of statistics */
#define CLIENT_FEATURE_INTERVENTIONS 128u /* "interventions": Intervention */

typedef struct local_state local_state; /* local.c */

typedef struct {
    uint64_t seq; /* 0: free slot */
    int64_t step;
    uint32_t layer;
    uint8_t held;      /* the daemon reads the caller's memory (zero-copy CUDA) */
    uint8_t released;  /* Release (or its equivalent) handled */
    gpu_hold gh;       /* GPU resources of the push */
} client_inflight;

struct attnstat_client {
    /* conn.c */
    int fd;
    int timeout_ms;
    int closed;            /* connection unusable */
    char why_closed[200];  /* and why */
    char last_conn_error[160]; /* the daemon's last Error about the connection (no ref), until
                                  another message came: why it closed, if it closes now */
    char sock_path[sizeof(((struct sockaddr_un *)0)->sun_path)];
    frame_reader rd;
    uint32_t max_frame;
    uint8_t *oq;           /* outgoing bytes [oq_start, oq_end) */
    size_t oq_start, oq_end, oq_cap, oq_limit;
    /* Where each complete incoming frame goes (set by session.c: replies_on_frame). The payload
     * is valid during the call only. */
    void (*on_frame)(attnstat_client *c, const uint8_t *payload, uint32_t len);

    /* session.c */
    int hello_sent;
    int hello_pending;     /* a hello kept while not connected (background): said by the next
                              attempt; cleared (link.c) once the run is established */
    int background;        /* ATTNSTAT_CONNECT_BACKGROUND: a hello waits for the daemon */
    int sub_alerts, sub_results, subscribed; /* what attnstat_subscribe asked for */
    uint64_t flush_abandoned;                /* st.abandoned when flush last reported */

    /* link.c */
    int hello_done;
    link_phase link;
    int link_resuming;          /* the connection is one the library made again */
    int link_first;             /* a background client's first connection is still to be made */
    int link_hello_answered;    /* the daemon answered a Hello on this connection */
    int64_t link_deadline;      /* HELLO, REGISTER, CONNECTING: the attempt is given up then */
    int64_t link_retry_at;      /* DOWN: when the next attempt is made */
    int link_backoff_ms;        /* the delay after the next failed attempt (before jitter) */
    uint64_t link_jitter;       /* state of the jitter's generator */
    uint32_t link_attempts;     /* attempts since the connection was lost */
    uint64_t link_dropped_mark; /* st.dropped_disconnected when it was lost */
    char link_lost_why[200];    /* why the connection was lost, or why the daemon refused us */
    char link_retry_why[300];   /* why the last attempt failed */
    char *hello_run, *hello_config; /* the hello, kept to be sent again (NULL: none) */
    int32_t hello_rank, hello_ndev;
    int has_layout;             /* a layout was set (session.c): said after every Hello */
    attnstat_layout layout;
    int hello_has_th;
    attnstat_thresholds hello_th;
    char **hello_devices;

    /* hostring.c: the host ring of the current connection */
    int shm_fd;
    int shm_linked;        /* name still exists in /dev/shm */
    char shm_name[64];
    uint8_t *map;
    uint64_t ring_bytes;
    ring ring;
    client_inflight *inflight; /* [CLIENT_MAX_INFLIGHT] */

    /* push.c */
    uint64_t next_seq;
    gpu_state *gpu;          /* made at the first CUDA push */

    /* local.c: local mode (attnstat_set_local_compute) */
    int local_on;
    local_state *local;      /* made at the first local push */

    /* replies.c: what a blocking call waits for, and the callbacks */
    int64_t run_id;
    int got_hello_reply;
    uint32_t features;       /* CLIENT_FEATURE_* the daemon's HelloReply lists (replies.c) */
    Attnstat__Envelope *status_env; /* the last StatusReply, owned */
    int wait_error;                 /* an Error arrived while waiting: its code */
    uint64_t wait_error_ref;
    int wait_error_has_ref;
    attnstat_alert_fn alert_fn;
    void *alert_user;
    attnstat_result_fn result_fn;
    void *result_user;
    attnstat_run_result_fn run_result_fn; /* subscribed Results, with their run */
    void *run_result_user;
    attnstat_ack_fn ack_fn;
    void *ack_user;
    attnstat_release_fn release_fn;
    void *release_user;

    /* shared, as said at the top */
    attnstat_counters st;
    char err[512];
};

/* Sets the client's last error (printf format) and returns code: `return client_fail(c, ...)`. */
#define client_fail(c, code, ...) util_fail((c)->err, sizeof (c)->err, (code), __VA_ARGS__)

#endif /* ATTNSTAT_CLIENT_INTERNAL_H */
