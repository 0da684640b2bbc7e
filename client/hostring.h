/* hostring.h — libattnstat's host ring (internal): the shared-memory segment that host tensors are
 * copied into, with the allocator over it (ring.c) and the in-flight table of the pushes that hold
 * blocks of it.
 *
 * What it promises
 *   - One ring per connection: the daemon maps it by name at its RegisterBuffer, and the name is
 *     removed once the daemon has confirmed (hostring_unlink), so that a process that dies leaves
 *     nothing behind in /dev/shm. A new connection gets a new ring (the old name is gone, and
 *     memory an old daemon may still map is never written again).
 *   - hostring_free leaves the client as before hostring_make: every field back to "no ring".
 *
 * Stage: below link.c (which makes a ring for each connection and frees it when the connection is
 * lost) and session.c (which frees it at close); push.c and replies.c use the fields it fills.
 * Calls ring.c and util.c. */
#ifndef ATTNSTAT_HOSTRING_H
#define ATTNSTAT_HOSTRING_H

#include "client_internal.h"

/* Creates, sizes and maps the shared-memory ring (c->ring_bytes, a new name) and the in-flight
 * table, before the RegisterBuffer that names it. Returns ATTNSTAT_OK, or EIO / ENOMEM with c->err
 * set (what was made is freed again). */
attnstat_code hostring_make(attnstat_client *c);

/* The daemon has mapped the ring: its name is removed from /dev/shm. */
void hostring_unlink(attnstat_client *c);

/* Unmaps the ring, closes it, removes its name if still there, frees the in-flight table (whose
 * pushes must have been released). */
void hostring_free(attnstat_client *c);

#endif /* ATTNSTAT_HOSTRING_H */
