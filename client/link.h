/* link.h — libattnstat's link to attnstatd (internal): the hello and the registrations that
 * establish a run on a connection, the loss of that connection, and its re-establishment (a daemon
 * restart). There is no thread: every step is taken inside a call the caller makes.
 *
 * What it promises
 *   - Nothing here waits except link_establish (the first hello, up to the connect timeout for
 *     each answer) and link_wait (up to the time it is given).
 *   - A connection lost after a successful hello (or by a client that never said hello) is made
 *     again: non-blocking connect attempts, the first 50 to 100 ms after the loss, each delay
 *     twice the one before up to 5 s (before jitter: half to all of it); on the new connection the same Hello, a new host ring, the GPU
 *     path's registrations and the subscription, all confirmed by one Status round trip before
 *     pushes go out again (st.reconnects).
 *   - Pushes in flight at the loss are abandoned (replies_abandon_all: released, counted); pushes
 *     made while the link is not up are dropped and counted (link_drop).
 *   - A daemon's refusal of an attempt for good (permission, protocol version, a hello it rejects)
 *     closes the link for good (LINK_CLOSED); other failures are tried again later. A connection
 *     lost while the first hello was not yet done is closed for good too.
 *   - A background client that started before its daemon (link_start_waiting) is made the same
 *     way: its attempts begin at once, and the first that connects says the hello kept meanwhile
 *     (hello_pending), if any; that first connection is not counted as a reconnection.
 *
 * Stage: between the calls of the API (session.c, push.c) and what they drive: calls conn.c,
 * hostring.c, replies.c, gpu_export.c, util.c and proto/. */
#ifndef ATTNSTAT_LINK_H
#define ATTNSTAT_LINK_H

#include <stddef.h>
#include <stdint.h>

#include "client_internal.h"

/* Keeps copies of the hello's fields, to be sent now and again on every new connection. Returns
 * ATTNSTAT_OK or ENOMEM (c->err set). */
attnstat_code link_set_hello(attnstat_client *c, const char *run, int32_t rank,
                             const attnstat_thresholds *th, const char *config_json,
                             const char *const *device_uuids, int32_t n_devices);

/* The hello's thresholds on the wire: every field of th that is set (vocab.h's rows the hello
 * carries, and collapse_threshold); unset ones left out. */
void link_thresholds_pb(Attnstat__Thresholds *o, const attnstat_thresholds *th);

/* The first hello on the current connection: sends the kept Hello, then (once answered) makes and
 * registers the host ring, waiting up to c->timeout_ms for each answer. Returns ATTNSTAT_OK with
 * the link UP and hello_done set, or the error with c->err saying it (EREFUSED with the daemon's
 * reason, ECLOSED, ETIMEDOUT, EIO, ENOMEM); the link is then CLOSED when the connection is gone,
 * else UP (it still serves status and poll, as any connection without a run). */
attnstat_code link_establish(attnstat_client *c);

/* Sends the kept parallel layout (c->layout) on the current connection. ATTNSTAT_OK, or what
 * conn_send says. */
attnstat_code link_send_layout(attnstat_client *c);

/* Moves the link on without waiting: processes what arrived and sends what is queued; notices a
 * lost connection (link_lost); moves an attempt on as its answers arrive; makes the next attempt
 * once its time has come. */
void link_advance(attnstat_client *c);

/* Waits up to timeout_ms (< 0: no limit) for what the link waits for now (the socket when
 * connected, a connect under way, or the time of the next attempt), then moves it on (as
 * link_advance). Returns at once when the link is CLOSED; returns early on a signal. */
void link_wait(attnstat_client *c, int timeout_ms);

/* Moves the link on (link_advance); 1 when a push may be sent now: UP, with the run established. */
int link_ready(attnstat_client *c);

/* The established connection broke (c->closed): the pushes in flight are abandoned, the host ring
 * and the socket are let go, and the first attempt is scheduled (or, when no run was established
 * although a hello was tried, the link is CLOSED). Does nothing unless the link is UP. */
void link_lost(attnstat_client *c);

/* Counts a push that could not be sent because the link is not up (dropped_local,
 * dropped_disconnected) and says so in c->err. Returns ATTNSTAT_DROPPED while the library
 * reconnects, ATTNSTAT_ECLOSED when the link is closed for good. */
attnstat_code link_drop(attnstat_client *c);

/* One sentence on why the link is not up (what was lost, and how the reconnection goes); "" when
 * it is up. */
void link_describe(const attnstat_client *c, char *buf, size_t len);

/* A background client (ATTNSTAT_CONNECT_BACKGROUND) whose first connect failed with errno e: 1
 * when waiting for the daemon may cure it (no socket yet, nobody listening on it, a full listen
 * backlog, a connect that timed out), the link then DOWN with its first attempt scheduled, as
 * after a loss, and c->err cleared; 0 when it may not (permission, a bad path...). */
int link_start_waiting(attnstat_client *c, int e);

/* Frees the kept hello. */
void link_free(attnstat_client *c);

#endif /* ATTNSTAT_LINK_H */
