/* session.h — protocol dispatch: what each message a client sends means. Hello (its run, rank,
 * thresholds and devices), Subscribe and Status are answered here; RegisterBuffer, RegisterEvent
 * and Forget go to the client's buffers (buffers.h), Push to push.h. Every reply to a bad message
 * is an Error (or, for a Push, an Ack) naming what was wrong; the connection stays usable.
 * A Hello is checked whole before anything is stored: run and host printable UTF-8 (no control or
 * format character: nothing a peer names can forge a log line or reach a terminal), config a JSON
 * object of at most max_hello_config bytes (stored as sent), at most 64 device UUIDs of printable
 * text (no string holds a NUL: frame_decode refuses the message), and the run name not another
 * uid's (owners.h: refused with Error(PERMISSION) naming the owner), nor past its uid's runs or
 * config bytes (runs_quota: max_runs_per_uid, max_config_bytes_per_uid; Error(BUSY)).
 * Stage: session, after the connection (the loop hands it each decoded message) and before
 * buffers and push; calls peer, buffers, push, status, the alert feed (thresholds), devices, the
 * store (the run's record), validate, owners, json, counters, conn, envelope, names and log.
 * Loop thread only. */
#ifndef ATTNSTAT_SESSION_H
#define ATTNSTAT_SESSION_H

#include "attnstat.pb-c.h"
#include "ctx.h"
#include "peer.h"

/* Handles one decoded message of client p. A reply may close the connection (conn_write closes
 * one whose queue is far over its cap), which detaches p: the session holds a reference for the
 * whole message, and after such a close p->c is NULL and its buffers are forgotten, so the rest of
 * the handler sends nothing and finds nothing. */
void session_handle(const stage_ctx *x, peer *p, const Attnstat__Envelope *env);

#endif /* ATTNSTAT_SESSION_H */
