/* frame.h — the wire framing shared by attnstatd and libattnstat: each frame is a u32
 * little-endian length followed by that many bytes of one serialized attnstat.Envelope.
 * A length of 0 or over the reader's maximum is a framing error (the connection is then unusable:
 * the caller sends an Error and closes).
 *
 * frame_pack() serialises an envelope into one heap buffer, prefix included.
 * frame_reader accumulates bytes from a stream and hands out complete frames, one at a time. */
#ifndef ATTNSTAT_FRAME_H
#define ATTNSTAT_FRAME_H

#include <stddef.h>
#include <stdint.h>

#include "attnstat.pb-c.h"

#define FRAME_PROTOCOL_VERSION 1u
#define FRAME_HEADER 4u
#define FRAME_MAX_DEFAULT (1u << 20) /* 1 MiB */

/* Serialises env with its length prefix into a new malloc'd buffer; *len gets the total size.
 * Returns NULL when allocation fails or the message is over max_frame bytes. */
uint8_t *frame_pack(const Attnstat__Envelope *env, uint32_t max_frame, size_t *len);

typedef struct {
    uint8_t *buf;       /* buffered bytes: [start, end) not yet consumed */
    size_t start, end, cap;
    uint32_t max_frame;
    uint32_t pending;   /* length of the frame handed out by frame_reader_next, until consumed */
} frame_reader;

void frame_reader_init(frame_reader *r, uint32_t max_frame);
void frame_reader_free(frame_reader *r);

/* Makes room for at least want bytes after end and returns where to write them (*avail gets the
 * room). Returns NULL on allocation failure. After writing n bytes call frame_reader_commit. */
uint8_t *frame_reader_space(frame_reader *r, size_t want, size_t *avail);
void frame_reader_commit(frame_reader *r, size_t n);
/* Copies n bytes in (space + memcpy + commit). Returns -1 on allocation failure. */
int frame_reader_feed(frame_reader *r, const void *data, size_t n);

/* Returns 1 with *payload / *len set when a whole frame is buffered (valid until the next call
 * on r), 0 when more bytes are needed, -1 on a framing error (err gets the reason). Call
 * frame_reader_consume() once done with the payload. */
int frame_reader_next(frame_reader *r, const uint8_t **payload, uint32_t *len, char *err,
                      size_t errlen);
void frame_reader_consume(frame_reader *r);

/* Decodes a payload (NULL on a malformed message; free with attnstat__envelope__free_unpacked).
 * allocator may be NULL for the default. A message with a NUL byte in any string field, however
 * deep, is malformed too: protobuf-c would hand the string over cut at the NUL. */
Attnstat__Envelope *frame_decode(const uint8_t *payload, uint32_t len, ProtobufCAllocator *allocator);
/* frame_decode, and on NULL err (when not NULL) says why: the decoder's failure, or which string
 * holds a NUL ("hello.run (a NUL at byte 3 of its 9)"). */
Attnstat__Envelope *frame_decode_ex(const uint8_t *payload, uint32_t len,
                                    ProtobufCAllocator *allocator, char *err, size_t errlen);

#endif /* ATTNSTAT_FRAME_H */
