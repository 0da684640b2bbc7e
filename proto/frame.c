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

/* ---- strings with a NUL ------------------------------------------------------------------------
 * protobuf-c hands a string field over as a C string: one that holds a NUL byte would be cut there
 * without a word (a run name, a config). The payload is walked once more, by the message's
 * descriptor, into every length-delimited field: a string holding a NUL is found with its path. */
static int frame_varint(const uint8_t *p, size_t n, size_t *i, uint64_t *v)
{
    *v = 0;
    for (int shift = 0; shift < 64 && *i < n; shift += 7) {
        uint8_t b = p[(*i)++];
        *v |= (uint64_t)(b & 0x7f) << shift;
        if (!(b & 0x80))
            return 1;
    }
    return 0;
}

/* 1 (path: "hello.run") when a string of the message desc in p[0, n) holds a NUL; 0 when none
 * does (or the bytes do not parse: the decoder has said so already). */
static int frame_nul_string(const ProtobufCMessageDescriptor *desc, const uint8_t *p, size_t n,
                            int depth, char *path, size_t plen)
{
    size_t i = 0;
    while (i < n) {
        uint64_t key, v;
        if (!frame_varint(p, n, &i, &key))
            return 0;
        switch (key & 7) {
        case 0: if (!frame_varint(p, n, &i, &v)) return 0; continue;
        case 1: i += 8; continue;
        case 5: i += 4; continue;
        case 2: break;
        default: return 0;
        }
        if (!frame_varint(p, n, &i, &v) || v > n - i)
            return 0;
        const ProtobufCFieldDescriptor *f =
            key >> 3 <= UINT32_MAX ? protobuf_c_message_descriptor_get_field(desc,
                                                                             (unsigned)(key >> 3))
                                   : NULL;
        if (f && f->type == PROTOBUF_C_TYPE_STRING && memchr(p + i, 0, (size_t)v)) {
            size_t at = strlen(path);
            snprintf(path + at, plen - at, "%s%s (a NUL at byte %zu of its %llu)", at ? "." : "",
                     f->name, (size_t)((const uint8_t *)memchr(p + i, 0, (size_t)v) - (p + i)),
                     (unsigned long long)v);
            return 1;
        }
        if (f && f->type == PROTOBUF_C_TYPE_MESSAGE && depth < 16) {
            size_t at = strlen(path);
            snprintf(path + at, plen - at, "%s%s", at ? "." : "", f->name);
            if (frame_nul_string(f->descriptor, p + i, (size_t)v, depth + 1, path, plen))
                return 1;
            path[at] = '\0';
        }
        i += (size_t)v;
    }
    return 0;
}

Attnstat__Envelope *frame_decode_ex(const uint8_t *payload, uint32_t len,
                                    ProtobufCAllocator *allocator, char *err, size_t errlen)
{
    Attnstat__Envelope *env = attnstat__envelope__unpack(allocator, len, payload);
    char path[160] = "";
    if (!env) {
        if (err && errlen)
            snprintf(err, errlen, "a frame of %u bytes is not a valid Envelope (protobuf decode "
                     "failed)", len);
        return NULL;
    }
    if (!frame_nul_string(&attnstat__envelope__descriptor, payload, len, 0, path, sizeof path))
        return env;
    attnstat__envelope__free_unpacked(env, allocator);
    if (err && errlen)
        snprintf(err, errlen, "the string %s holds a NUL byte: a name, a config or any other "
                 "string must not (it would be cut there)", path);
    return NULL;
}

Attnstat__Envelope *frame_decode(const uint8_t *payload, uint32_t len, ProtobufCAllocator *allocator)
{
    return frame_decode_ex(payload, len, allocator, NULL, 0);
}
