/* clients.h — the registry of the connections the daemon has open: each entry is a connection
 * (conn.h) and, once it passed the policy, its client (peer.h). Stage: beside the flow; the loop
 * adds and removes entries, status lists them, and results and alerts go to the subscribers among
 * them (clients_broadcast). Calls conn, nothing else. Loop thread only.
 *
 * An entry lives as long as its connection: it is unlinked when the connection starts closing
 * (clients_remove: no longer counted, listed or sent to) and freed when the connection is gone
 * (clients_entry_free). */
#ifndef ATTNSTAT_CLIENTS_H
#define ATTNSTAT_CLIENTS_H

#include <stdint.h>
#include <sys/types.h>

#include "attnstat.pb-c.h"
#include "conn.h"
#include "peer.h"

typedef struct clients clients;
typedef struct clients_entry clients_entry;
struct clients_entry {
    conn *c;
    peer *p;                 /* NULL until admitted (a refused connection never has one) */
    void *owner;             /* the one who added it (the loop) */
    clients_entry *prev, *next;
    int linked;
};

clients *clients_new(void);
void clients_free(clients *r);   /* the registry only: entries are their connections' */

/* A new entry for c, first in the list. NULL on no memory. */
clients_entry *clients_add(clients *r, conn *c, void *owner);
/* Unlinks e (idempotent); e stays valid until clients_entry_free(). */
void clients_remove(clients *r, clients_entry *e);
void clients_entry_free(clients_entry *e);

uint32_t clients_count(const clients *r);
/* Of the entries: *admitted served now (a client, its connection open), *of_uid of those with
 * peer uid uid, *reserve of those admitted into the reserved slots (peer.h), *other the rest
 * (refused, or closing after a last reply). */
void clients_tally(const clients *r, uid_t uid, uint32_t *admitted, uint32_t *of_uid,
                   uint32_t *other, uint32_t *reserve);
/* The open connections of uid that said Hello or subscribed (peer_is_session). */
uint32_t clients_sessions(const clients *r, uid_t uid);
/* The first entry (then e->next), newest first. */
clients_entry *clients_first(const clients *r);

typedef enum { CLIENTS_ALERTS, CLIENTS_RESULTS } clients_sub;
/* 1 when a client is subscribed to what. */
int clients_any_subscribed(const clients *r, clients_sub what);
/* Whether a subscriber of uid may see env (a Result or an Alert: its run's owner decides). */
typedef int (*clients_filter_fn)(void *ctx, uid_t uid, const Attnstat__Envelope *env);
/* The filter every broadcast asks (the loop sets it once). */
void clients_set_filter(clients *r, clients_filter_fn may_see, void *ctx);
/* env, non-essential (dropped for a subscriber over its cap), to every client subscribed to what
 * that the filter lets see it. */
void clients_broadcast(clients *r, const Attnstat__Envelope *env, clients_sub what);

#endif /* ATTNSTAT_CLIENTS_H */
