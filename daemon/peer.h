/* peer.h — one connected client as the stages after the connection know it: its run (from its
 * Hello), its subscriptions, its registered buffers, its pushes in flight and its counters.
 * Stage: shared by session (which sets it up), push (which counts on it) and status (which reads
 * it); calls buffers, conn (ids) and log, nothing of those stages (store.h only for the type of
 * its layout).
 *
 * Glossary: a conn is the transport (conn.h); a peer is the client behind it; the session
 * (session.h) is what each of its messages means.
 *
 * Lifetime. A peer is reference-counted: its connection holds one reference, and every push in
 * flight holds one. When the connection closes, peer_detach() forgets its buffers (each mapping is
 * unmapped when the last push reading it has finished) and drops the connection's reference;
 * pushes still in flight finish, are stored, and are not answered.
 *
 * Fields: read them freely; they are written by peer.c only, through the functions below.
 * Loop thread only (but `gone`, which GPU workers read atomically). */
#ifndef ATTNSTAT_PEER_H
#define ATTNSTAT_PEER_H

#include <stdint.h>
#include <sys/types.h>

#include "buffers.h"
#include "config.h"
#include "conn.h"
#include "store.h"

#define PEER_RUN_MAX 256

typedef struct peer peer;
struct peer {
    conn *c;                 /* NULL once the connection closed */
    int refs;
    uint64_t conn_id;
    uid_t uid;               /* SO_PEERCRED */
    int hello;
    int64_t run_id;
    char run[PEER_RUN_MAX];
    int32_t rank;
    int32_t pid;             /* from Hello, else SO_PEERCRED */
    double collapse_threshold; /* the computation's: the Hello's, else the config's */
    int has_layout;          /* a ParallelLayout was accepted: its pushes get global numbers */
    store_layout layout;
    int32_t heads_q;         /* the query heads of its latest push given global numbers (0: none
                                yet): an Intervention's heads are numbered by it */
    int sub_alerts, sub_results;
    int reserve;             /* admitted into the reserved slots (listen.h): Status and Command
                                only, never a Hello or a Subscribe */
    int goodbye;             /* it said Goodbye: its run ends when the connection closes */
    buffers *bufs;
    int gone;                /* the connection closed (read atomically by GPU workers) */
    uint32_t inflight;       /* pushes not yet acknowledged (holding a reference) */
    uint32_t computing;      /* of those, queued or computing in a worker (client_inflight) */
    uint64_t pushes, dropped, rejected;
    uint32_t reasons_seen[16]; /* the reasons (code and message, numbers aside) its pushes were
                                  refused for, hashed; 0: a free entry */
};

/* A peer for connection c (one reference: the connection's), its collapse threshold the
 * config's. NULL on no memory. */
peer *peer_new(const cfg *conf, conn *c);
void peer_ref(peer *p);
void peer_unref(peer *p);
/* The connection is closing: forget the buffers, drop the connection's reference. */
void peer_detach(peer *p);

/* Its Hello was accepted: run, rank, pid (when the Hello has one, else kept) and the collapse
 * threshold its pushes are computed with. */
void peer_hello(peer *p, int64_t run_id, const char *run, int32_t rank, int has_pid, int32_t pid,
                double collapse_threshold);
void peer_subscribe(peer *p, int alerts, int results);
/* It was admitted into the reserved slots: it may ask for status and send commands only. */
void peer_reserve(peer *p);
/* It holds a run's or a subscription's slot: it said Hello, or subscribed. */
int peer_is_session(const peer *p);
/* It said Goodbye. */
void peer_goodbye(peer *p);
/* Its ParallelLayout was accepted (checked): the pushes received from now on get global numbers. */
void peer_layout(peer *p, const store_layout *l);

/* The largest global layer or head number (a layout's offsets are checked against the same bound,
 * schema/store_write.c): far past any model, and a sum of two never overflows an int32_t. */
#define PEER_GLOBAL_MAX (1 << 24)

/* The global numbers of its layer `layer` and of its local query heads 0 .. span-1 by the layout in
 * force now (none: the local ones), for a push of heads_q query heads (head_offset unset: the base
 * is tp_rank x heads_q): *glayer, and *head_base (local head h is global *head_base + h). The one
 * rule for pushes and interventions. -1 with msg when a number passes PEER_GLOBAL_MAX. */
int peer_global(const peer *p, uint32_t layer, int32_t heads_q, int64_t span, int32_t *glayer,
                int32_t *head_base, char *msg, size_t cap);
/* A push of heads_q query heads was given global numbers: an Intervention that follows numbers its
 * heads as that push's. */
void peer_heads_seen(peer *p, int32_t heads_q);

typedef enum { PEER_PUSHES, PEER_DROPPED, PEER_REJECTED } peer_counter;
void peer_count(peer *p, peer_counter what);
/* A push of this peer was answered with code (not OK) and msg: 1 the first time for that reason
 * (the code and the message with its numbers left out), else 0; the daemon then logs it at warn
 * level. Past 16 reasons, each further one counts as seen. */
int peer_first_reason(peer *p, int code, const char *msg);

/* A push of this peer is in flight (holds a reference) until peer_push_end(). */
void peer_push_start(peer *p);
void peer_push_end(peer *p);
/* A push of this peer entered (+1) or left (-1) a worker's queue. */
void peer_computing(peer *p, int delta);

#endif /* ATTNSTAT_PEER_H */
