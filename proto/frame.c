/* frame.c — length-prefixed framing of attnstat envelopes (see frame.h). */
#include "frame.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

uint8_t *frame_pack(const Attnstat__Envelope *env, uint32_t max_frame, size_t *len)
{
    size_t body = attnstat__envelope__get_packed_size(env);
    if (body == 0 || body > max_frame)
        return NULL;
    uint8_t *buf = malloc(FRAME_HEADER + body);
    if (!buf)
        return NULL;
    buf[0] = (uint8_t)body;
    buf[1] = (uint8_t)(body >> 8);
    buf[2] = (uint8_t)(body >> 16);
    buf[3] = (uint8_t)(body >> 24);
    attnstat__envelope__pack(env, buf + FRAME_HEADER);
    *len = FRAME_HEADER + body;
    return buf;
}

void frame_reader_init(frame_reader *r, uint32_t max_frame)
{
    memset(r, 0, sizeof *r);
    r->max_frame = max_frame ? max_frame : FRAME_MAX_DEFAULT;
}

void frame_reader_free(frame_reader *r)
{
    free(r->buf);
    memset(r, 0, sizeof *r);
}

uint8_t *frame_reader_space(frame_reader *r, size_t want, size_t *avail)
{
    if (r->start > 0 && r->pending == 0) { /* slide unconsumed bytes to the front */
        memmove(r->buf, r->buf + r->start, r->end - r->start);
        r->end -= r->start;
        r->start = 0;
    }
    if (r->cap - r->end < want) {
        size_t cap = r->cap ? r->cap : 4096;
        while (cap - r->end < want)
            cap *= 2;
        uint8_t *nb = realloc(r->buf, cap);
        if (!nb)
            return NULL;
        r->buf = nb;
        r->cap = cap;
    }
    *avail = r->cap - r->end;
    return r->buf + r->end;
}

void frame_reader_commit(frame_reader *r, size_t n)
{
    r->end += n;
}

int frame_reader_feed(frame_reader *r, const void *data, size_t n)
{
    size_t avail;
    uint8_t *dst = frame_reader_space(r, n, &avail);
    if (!dst)
        return -1;
    memcpy(dst, data, n);
    frame_reader_commit(r, n);
    return 0;
}

int frame_reader_next(frame_reader *r, const uint8_t **payload, uint32_t *len, char *err,
                      size_t errlen)
{
    if (r->pending)
        frame_reader_consume(r);
    size_t have = r->end - r->start;
    if (have < FRAME_HEADER)
        return 0;
    const uint8_t *h = r->buf + r->start;
    uint32_t n = (uint32_t)h[0] | (uint32_t)h[1] << 8 | (uint32_t)h[2] << 16 | (uint32_t)h[3] << 24;
    if (n == 0 || n > r->max_frame) {
        if (err && errlen)
            snprintf(err, errlen, "frame length %u is %s (maximum %u bytes)", n,
                     n == 0 ? "zero" : "over the limit", r->max_frame);
        return -1;
    }
    if (have - FRAME_HEADER < n)
        return 0;
    *payload = h + FRAME_HEADER;
    *len = n;
    r->pending = n;
    return 1;
}

void frame_reader_consume(frame_reader *r)
{
    if (!r->pending)
        return;
    r->start += FRAME_HEADER + r->pending;
    r->pending = 0;
    if (r->start == r->end)
        r->start = r->end = 0;
}

Attnstat__Envelope *frame_decode(const uint8_t *payload, uint32_t len, ProtobufCAllocator *allocator)
{
    return attnstat__envelope__unpack(allocator, len, payload);
}
