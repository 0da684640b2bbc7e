/* replies.h — what attnstatd sends to libattnstat, handled (internal): HelloReply, Ack, Release,
 * Error, Alert, Result and StatusReply; the callbacks they call; the release of a push's
 * in-flight slot (ring block, GPU resources, the release callback) exactly once.
 *
 * What it promises
 *   - Every push sent is released once: by its Release, by a non-OK Ack, or by
 *     replies_abandon_all when the connection is lost.
 *   - The counters of st that describe answers (acked, released, errors, ...) are changed here
 *     only; last_code / last_error keep the latest rejection or Error.
 *   - User callbacks run from inside replies_on_frame, on the caller's thread.
 *
 * Stage: the receiving end, given to conn.c as its frame handler by session.c. Calls util.c,
 * ring.c, gpu_export.c and proto/frame.c; never the transport. */
#ifndef ATTNSTAT_REPLIES_H
#define ATTNSTAT_REPLIES_H

#include <stdint.h>

#include "client_internal.h"

/* Decodes one frame from the daemon and handles it (conn.c's handler). An undecodable one is
 * counted as an error and skipped. */
/* A HeadStats from the wire as the public result: every count (0 when left out) and statistic
 * (NaN when left out) of vocab.h's rows. */
void replies_head_result(attnstat_head_result *o, const Attnstat__HeadStats *h);

void replies_on_frame(attnstat_client *c, const uint8_t *payload, uint32_t len);

/* The connection is gone: no Ack will come for the pushes in flight. Each is released (its ring
 * block, GPU resources, the release callback of a zero-copy push) and its slot freed; they are
 * counted in st.abandoned and leave st.in_flight. Returns how many there were. */
uint64_t replies_abandon_all(attnstat_client *c);

/* Forgets the StatusReply kept from before (a blocking call is about to wait for a new one). */
void replies_forget_status(attnstat_client *c);

/* Copies the kept StatusReply (there must be one) into out. */
void replies_status_out(const attnstat_client *c, attnstat_daemon_status *out);

#endif /* ATTNSTAT_REPLIES_H */
