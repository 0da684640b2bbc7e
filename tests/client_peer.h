/* client_peer.h — what the scripted peers of libattnstat's unit suites share (test_client.c,
 * test_client_link.c): a peer is a thread in the test that listens on a Unix socket and speaks the
 * wire protocol as attnstatd would, to the script of its test. Here: sending one frame, and
 * comparing a tensor named by a Push with the tensor the test pushed, byte for byte, in the
 * mapped shared-memory ring. */
#ifndef ATTNSTAT_CLIENT_PEER_H
#define ATTNSTAT_CLIENT_PEER_H

#include <stdint.h>

#include "attnstat.h"
#include "attnstat.pb-c.h"

/* Sends env as one frame on fd (blocking). Returns 0, or -1 when the socket is gone. */
int peer_send(int fd, const Attnstat__Envelope *env);

/* Number of elements of t whose bytes differ from those ref names in map[0..map_size) (1 when
 * ref's dtype or shape is not t's, or it reaches past the map). */
int peer_compare(const uint8_t *map, uint64_t map_size, const Attnstat__TensorRef *ref,
                 const attnstat_tensor *t);

/* A socket listening at path (a stale file removed first); -1 on failure. */
int peer_listen(const char *path);

#endif /* ATTNSTAT_CLIENT_PEER_H */
