/* client_peer.h — what the scripted peers of libattnstat's unit suites share (test_client.c,
 * test_client_link.c): a peer is a thread in the test that listens on a Unix socket and speaks the
 * wire protocol as attnstatd would, to the script of its test. Here: listening, reading frames and
 * handing each message to the peer's handler, sending one frame, and comparing a tensor named by
 * a Push with the tensor the test pushed, byte for byte, in the mapped shared-memory ring. */
#ifndef ATTNSTAT_CLIENT_PEER_H
#define ATTNSTAT_CLIENT_PEER_H

#include <stdint.h>

#include "attnstat.h"
#include "attnstat.pb-c.h"
#include "frame.h"

/* Handles one message the peer received: returns 0 to go on, 1 to read no further message now
 * (those behind it stay in the reader), -1 to hang up. */
typedef int (*peer_message_fn)(void *ctx, const Attnstat__Envelope *env);

/* Reads what fd has (one recv, which waits for at least a byte) into rd and hands each complete
 * message to fn (undecodable ones are skipped) until fn says otherwise. Returns 0, or -1 when the
 * connection ended or fn said to hang up. */
int peer_read(int fd, frame_reader *rd, peer_message_fn fn, void *ctx);

/* Sends env as one frame on fd (blocking). Returns 0, or -1 when the socket is gone. */
int peer_send(int fd, const Attnstat__Envelope *env);

/* Number of elements of t whose bytes differ from those ref names in map[0..map_size) (1 when
 * ref's dtype or shape is not t's, or it reaches past the map). */
int peer_compare(const uint8_t *map, uint64_t map_size, const Attnstat__TensorRef *ref,
                 const attnstat_tensor *t);

/* Maps the shared-memory ring rb names, read-only, into *map (*size bytes); leaves both alone
 * when it cannot. */
void peer_map(const Attnstat__RegisterBuffer *rb, uint8_t **map, uint64_t *size);

/* A socket listening at path (a stale file removed first); -1 on failure. */
int peer_listen(const char *path);

#endif /* ATTNSTAT_CLIENT_PEER_H */
