/* listen.h — the daemon's Unix socket: bind, mode, peer credentials, policy, accept. Stage: listen,
 * before the flow; creates each connection (conn.h) and hands it to the loop through its hooks;
 * calls conn, counters, util and log, nothing after them.
 *
 * Binding: the socket's directory is created when missing; a stale socket file (nobody accepts on
 * it) is removed, a live one is an error; the socket is bound under umask 0117 and then set to 0660
 * (group set to --allow-group when given). Accepting: each peer's pid/uid/gid come from SO_PEERCRED
 * and are logged; a peer of another uid than the daemon's, other than root, is refused with
 * Error(PERMISSION) unless it is in the allowed group (primary or supplementary group). Slots: a
 * peer past max_clients connections, or past max_clients_per_uid + status_clients_per_uid of its
 * uid, is refused with Error(BUSY); the last reserved_clients slots are kept for root and the
 * daemon's uid: another uid's connection may take one only while other uids hold fewer than half
 * of them, and is then admitted into the reserve (status and commands only: the loop refuses its
 * Hello or Subscribe, as it refuses one past max_clients_per_uid runs and subscriptions of a uid).
 * A refused connection is closed once its Error is out and the peer closed its end (lingering:
 * a peer that sent its Hello first still reads the reason), at most CONN_FLUSH_NS later.
 * Loop thread only. */
#ifndef ATTNSTAT_LISTEN_H
#define ATTNSTAT_LISTEN_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <uv.h>

#include "config.h"
#include "conn.h"
#include "counters.h"

typedef struct listener listener;

/* Connections the owner has registered, for the accept policy. */
typedef struct {
    uint32_t admitted;       /* served now (the new one not included) */
    uint32_t of_uid;         /* of those, the new peer's uid's */
    uint32_t lingering;      /* refused or closing, not yet gone */
    uint32_t reserve;        /* of those served, admitted into the reserved slots */
} listen_counts;

/* What the listener tells its owner; data is the pointer given to listen_new. */
typedef struct {
    /* A connection was accepted, before any check: the owner registers it (and sets its handler;
     * a refused connection keeps it until it is closed). */
    void (*added)(void *data, conn *c);
    /* It passed the policy and the client limits: the owner serves it (starts reading); reserve:
     * it took one of the reserved slots (status and commands only). */
    void (*admitted)(void *data, conn *c, int reserve);
    /* The connections registered now (max_clients, the uid's, the reserve's). */
    void (*count)(void *data, uid_t uid, listen_counts *out);
} listen_hooks;

/* A listener for the settings c (socket path, allow_group, max_clients, limits of a connection);
 * the group is looked up now. NULL with err set (the group does not exist, no memory). */
listener *listen_new(uv_loop_t *loop, const cfg *c, counters *cnt, const listen_hooks *hooks,
                     void *data, char *err, size_t errlen);
/* Binds and listens. Returns 0, or -1 with err set. */
int listen_start(listener *l, char *err, size_t errlen);
/* Stops accepting: the socket is closed and its file removed; the listener frees itself (in the
 * close callback when it was listening, else now). Once: the owner then forgets l. NULL is
 * allowed. */
void listen_close(listener *l);

#endif /* ATTNSTAT_LISTEN_H */
