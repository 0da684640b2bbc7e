/* push.h — libattnstat's pushes (internal): the shared-memory ring that host tensors are copied
 * into, the checks of a push's arguments, and the Push message (host tensors through the ring,
 * CUDA tensors through gpu_export.c). attnstat_push and attnstat_push_ex are defined in push.c.
 *
 * What it promises: a push never waits (see include/attnstat.h); a push that fails after taking
 * ring space gives it back at once and keeps its seq, so no two blocks ever share one.
 *
 * Stage: the sending end of a push. Calls conn.c (send, pump), replies.c (release everything when
 * the connection is lost), gather.c, ring.c, gpu_export.c and util.c. */
#ifndef ATTNSTAT_PUSH_H
#define ATTNSTAT_PUSH_H

#include "client_internal.h"

/* Creates, sizes and maps the shared-memory ring (c->ring_bytes) and the in-flight table, before
 * the RegisterBuffer that names it. Returns ATTNSTAT_OK, or EIO / ENOMEM with c->err set. */
attnstat_code push_make_ring(attnstat_client *c);

/* The daemon has mapped the ring: its name is removed from /dev/shm, so that a process that dies
 * leaves nothing behind. */
void push_unlink_ring(attnstat_client *c);

/* Unmaps the ring, closes it, removes its name if still there, frees the in-flight table. */
void push_free_ring(attnstat_client *c);

#endif /* ATTNSTAT_PUSH_H */
