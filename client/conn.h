/* conn.h — libattnstat's connection to attnstatd (internal): the non-blocking Unix socket, the
 * bounded outgoing byte queue, and the framed receive path. A transport only: it knows frames, not
 * messages; each complete frame that arrives goes to the handler the session gave it
 * (c->on_frame), and outgoing envelopes are packed here.
 *
 * What it promises
 *   - Nothing here blocks except conn_wait_once, for the time it is given.
 *   - conn_send writes what the socket takes now and queues the rest; a droppable frame (a push)
 *     is refused with ATTNSTAT_DROPPED when the queue is already over its bound.
 *   - Once the connection breaks, c->closed is set with the reason (conn_closed reports it), and
 *     every later call fails fast until a new connection is made (conn_connect_*, which start it
 *     afresh: nothing of the old one is sent or read).
 *
 * Stage: the transport, called by link.c, push.c and session.c; calls only util.c, proto/frame.c
 * and the handler it was given. */
#ifndef ATTNSTAT_CONN_H
#define ATTNSTAT_CONN_H

#include <stddef.h>
#include <stdint.h>

#include "client_internal.h"

/* Connects c (fields set to their defaults by the caller) to the socket at c->sock_path, waiting
 * for room in the listen backlog up to c->timeout_ms. Returns ATTNSTAT_OK, or ECONNECT with err
 * saying what to do about it and *e the connect's errno (ETIMEDOUT when the time ran out). */
attnstat_code conn_open(attnstat_client *c, int *e, attnstat_error *err);

/* One attempt, without waiting: a new non-blocking socket (c->fd) connecting to c->sock_path.
 * Returns 0 when connected (a new connection: see the top), 1 when the connect goes on (ask
 * conn_connect_done), -1 when it failed (the socket closed; *e the errno, conn_connect_why says
 * it in words). */
int conn_connect_start(attnstat_client *c, int *e);

/* For a connect that goes on: 0 connected, 1 still under way, -1 failed (as above). Never waits. */
int conn_connect_done(attnstat_client *c, int *e);

/* The sentence for a connect that failed with errno e ("... no such socket (is attnstatd
 * running? ...)"). */
void conn_connect_why(int e, const char *path, char *buf, size_t len);

/* Forgets a broken connection: the socket is closed (c->fd -1), queued bytes are dropped;
 * c->closed stays set (with its reason) until a new connection is made. */
void conn_reset(attnstat_client *c);

/* Sends what can be sent without waiting, closes the socket and frees the queues. */
void conn_shutdown(attnstat_client *c);

/* Marks the connection unusable (once; the first reason is kept and put into c->err). */
void conn_mark_closed(attnstat_client *c, const char *why);

/* ATTNSTAT_ECLOSED, with the reason the connection was marked closed kept in c->err. */
attnstat_code conn_closed(attnstat_client *c);

/* Bytes waiting in the outgoing queue. */
size_t conn_queued(const attnstat_client *c);

/* Sends one frame (see the top). Returns ATTNSTAT_OK, DROPPED, ECLOSED or ENOMEM. */
attnstat_code conn_send(attnstat_client *c, const Attnstat__Envelope *env, int droppable);

/* Writes as much of the queue as the socket takes now. Returns 0, or -1 when the connection
 * broke. */
int conn_pump_out(attnstat_client *c);

/* Reads what the socket has now and hands every complete frame to c->on_frame. Returns 0, or -1
 * when the connection is unusable (closed by the peer, broken framing). */
int conn_pump_in(attnstat_client *c);

/* Waits for the socket (readable, or writable while bytes are queued) for up to timeout_ms
 * (< 0: no limit), then pumps both ways. Returns 0, or -1 when the connection is unusable. */
int conn_wait_once(attnstat_client *c, int timeout_ms);

/* Milliseconds left until deadline (util_now_ms() time; < 0: no limit, returns -1), capped. */
int conn_remaining(int64_t deadline);

#endif /* ATTNSTAT_CONN_H */
