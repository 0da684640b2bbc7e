/* conn.h — one client connection: the transport. Stage: conn, the first of the flow; includes
 * proto/ (frame, envelope) and counters.h, and calls nothing of the stages after it.
 *
 * A conn reads frames (proto/frame.h) from its socket, decodes each into an Envelope and hands it
 * to the handler it was given (conn_set_handler: the loop wires it to the session, as Redis'
 * connSetReadHandler does); it knows nothing of sessions, runs or pushes. It writes what it is
 * given, one frame per message, with a cap per connection.
 *
 * Reading: libuv reads straight into the frame_reader; every complete frame is decoded and handed
 * to on_message whole, one at a time. A framing error (zero or oversize length, undecodable bytes,
 * a frame left incomplete past frame_timeout_ms) is answered with Error(FRAME) and the connection
 * is closed once that Error is written and the peer closed its end (conn_refuse: lingering).
 * Writing: every message is one frame_pack()ed frame, gathered in the connection's output buffer
 * and handed to one write request per turn of the loop (just before it polls again: the replies of
 * a turn cost one write(2)); a request owns its bytes until its callback. Unsent bytes are
 * counted: past sub_queue_bytes, non-essential messages (results and alerts to a subscriber) are
 * dropped (counted, logged at the first and every 1000th); past out_queue_bytes reading pauses
 * until the queue drains to half; essential replies still queue, and a connection 4x over
 * out_queue_bytes is closed. A connection with replies waiting of which its peer has read nothing
 * for write_timeout_ms is closed (conn_tick): a client that never reads cannot make the daemon
 * buffer without bound, nor hold its slot.
 *
 * Ownership (libuv's rules): conn_new() allocates the conn; it is freed only in its handle's close
 * callback, right after the handler's on_closed. A handler may call conn_close() (or send, which
 * may close) from any of its callbacks: the conn stays valid until that callback returns, reads
 * nothing more, and on_closed comes from a later turn of the loop. Loop thread only. */
#ifndef ATTNSTAT_CONN_H
#define ATTNSTAT_CONN_H

#include <stdint.h>
#include <sys/types.h>
#include <uv.h>

#include "attnstat.pb-c.h"
#include "counters.h"

#define CONN_FLUSH_NS (5ull * 1000000000ull) /* a closing connection's last replies, at most */

typedef struct conn conn;

/* What a connection calls; data is the pointer given with the handler. */
typedef struct {
    /* One whole frame, decoded. env is freed when this returns. */
    void (*on_message)(void *data, conn *c, const Attnstat__Envelope *env);
    /* The peer half-closed its side. 1: keep the connection (reading stops; the handler closes
     * it later, once its replies are out); 0: close it now. NULL: close it now. */
    int (*on_eof)(void *data, conn *c);
    /* conn_close() began: no message comes after this, and sends fail from now on. */
    void (*on_close)(void *data, conn *c);
    /* The handle is closed: the conn is freed when this returns. */
    void (*on_closed)(void *data);
} conn_handler;

typedef struct {
    uint32_t max_frame;          /* largest frame read or written */
    uint64_t out_queue_bytes;    /* unsent bytes before reading pauses (4x: closed) */
    uint64_t sub_queue_bytes;    /* unsent bytes before non-essential messages are dropped */
} conn_limits;

/* A new connection's handle on loop, ready for uv_accept(conn_stream(c)). id names it in logs.
 * NULL (logged) when memory or the handle could not be had. */
conn *conn_new(uv_loop_t *loop, uint64_t id, const conn_limits *lim, counters *cnt);
uv_stream_t *conn_stream(conn *c);
/* Instead of uv_accept: the connection takes fd, a connected stream socket (a socketpair's end in
 * the tests). Returns 0, or a libuv error (fd is then still the caller's). */
int conn_adopt(conn *c, int fd);
void conn_set_handler(conn *c, const conn_handler *h, void *data);
/* The handler's data (as given to conn_set_handler), for the one who gave it. */
void *conn_data(const conn *c);

/* The peer's credentials (SO_PEERCRED), as the listener read them. */
void conn_set_peer(conn *c, pid_t pid, uid_t uid, gid_t gid);
uint64_t conn_id(const conn *c);
pid_t conn_pid(const conn *c);
uid_t conn_uid(const conn *c);

/* Starts (or resumes) reading. Nothing when it reads already, is closing, half-closed or stopped.
 * Returns 0, or -1 when reading could not start (the conn is then closed, why logged). */
int conn_read_start(conn *c);
/* Stops reading for good (shutdown): what is queued is still written. */
void conn_read_stop(conn *c);

/* Queues one envelope. essential: Ack/Release/Error/replies, always queued (a connection far over
 * its cap is closed instead); non-essential (Result/Alert to a subscriber) is dropped and counted
 * when the connection is over its cap. Returns 0 when queued, -1 otherwise (too big for max_frame,
 * dropped, closing, or closed by this call). */
int conn_write(conn *c, const Attnstat__Envelope *env, int essential);
/* Sends Error{code, message, ref} (ref when has_ref), essential. */
void conn_send_error(conn *c, Attnstat__Code code, const char *msg, int has_ref, uint64_t ref);

/* Closes c now (idempotent): on_close is called before this returns. why is logged. */
void conn_close(conn *c, const char *why);
/* Closes c once its queued writes are out (an Error, then close). Reading stops now. */
void conn_close_after_flush(conn *c, const char *why);

/* Refuses c: Error{code, msg}, then closed once it is out (why is logged). linger: after our end
 * is shut, what the peer still sends is read and dropped until it closes (at most CONN_FLUSH_NS),
 * so that a peer that was writing (a Hello) reads the reason instead of meeting EPIPE. */
void conn_refuse(conn *c, Attnstat__Code code, const char *msg, const char *why, int linger);

/* Neither closing nor flushing its last writes: it still takes messages to send. */
int conn_is_open(const conn *c);
/* The peer half-closed and the handler kept the connection (on_eof returned 1). */
int conn_half_closed(const conn *c);
/* When its last whole message was read (util_mono_ns(); the accept time before the first). */
uint64_t conn_last_message_ns(const conn *c);
/* Housekeeping (once a second): a connection whose last replies were not read (or that did not
 * close its end, lingering) within CONN_FLUSH_NS of conn_close_after_flush() is closed; one with
 * replies waiting of which nothing was written for more than write_timeout_ns (0: no limit) is
 * closed (counted: CNT_CONNS_STALLED); one that holds the first bytes of a frame for more than
 * frame_timeout_ns (0: no limit) while it is read is answered Error(FRAME) and closed (its slot
 * freed). now_ns: util_mono_ns(). */
void conn_tick(conn *c, uint64_t now_ns, uint64_t frame_timeout_ns, uint64_t write_timeout_ns);

#endif /* ATTNSTAT_CONN_H */
