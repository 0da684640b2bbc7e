/* ring.c — FIFO allocator of offsets in libattnstat's rings (see ring.h).
 *
 * State: the live region runs from tail (the offset of the oldest block) to head. When head > tail
 * the free space is [head, size) and [0, tail); when head <= tail (and blocks exist) the region has
 * wrapped and the free space is [head, tail). Blocks are never zero-length, so the two cases are
 * told apart by comparing head with tail.
 *
 * Stage: a leaf of the library (used by push.c, replies.c, session.c and gpu_pool.c); calls libc
 * only. */
#include "ring.h"

#include <stdlib.h>
#include <string.h>

int ring_init(ring *r, uint64_t size, size_t max_blocks)
{
    memset(r, 0, sizeof *r);
    if (size == 0)
        return -1;
    r->size = size;
    r->max_blocks = max_blocks;
    return 0;
}

void ring_destroy(ring *r)
{
    free(r->blocks);
    memset(r, 0, sizeof *r);
}

static ring_block *ring_at(const ring *r, size_t i)
{
    return &r->blocks[(r->first + i) % r->cap];
}

static int ring_grow(ring *r)
{
    size_t ncap = r->cap ? r->cap * 2 : 64;
    ring_block *nb = malloc(ncap * sizeof *nb);
    if (!nb)
        return -1;
    for (size_t i = 0; i < r->count; i++)
        nb[i] = *ring_at(r, i);
    free(r->blocks);
    r->blocks = nb;
    r->cap = ncap;
    r->first = 0;
    return 0;
}

int ring_alloc(ring *r, uint64_t len, uint64_t seq, uint64_t *off)
{
    if (len == 0 || len > r->size)
        return -1;
    uint64_t need = (len + RING_ALIGN - 1) / RING_ALIGN * RING_ALIGN;
    if (need > r->size)
        need = len; /* a ring whose size is not a multiple of the alignment: last block exact */
    if (r->max_blocks && r->count >= r->max_blocks)
        return 1;
    uint64_t at;
    if (r->count == 0) {
        at = 0;
    } else {
        uint64_t tail = ring_at(r, 0)->off;
        if (r->head > tail) {
            if (r->size - r->head >= need)
                at = r->head;
            else if (tail >= need)
                at = 0;
            else
                return 1;
        } else {
            if (tail - r->head >= need)
                at = r->head;
            else
                return 1;
        }
    }
    if (r->count == r->cap && ring_grow(r) != 0)
        return -1;
    ring_block *b = &r->blocks[(r->first + r->count) % r->cap];
    b->seq = seq;
    b->off = at;
    b->len = need;
    b->freed = 0;
    r->count++;
    r->head = at + need;
    r->live_bytes += need;
    *off = at;
    return 0;
}

int ring_release(ring *r, uint64_t seq)
{
    /* Blocks are in increasing seq order: binary search. */
    size_t lo = 0, hi = r->count;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (ring_at(r, mid)->seq < seq)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo == r->count)
        return -1;
    ring_block *b = ring_at(r, lo);
    if (b->seq != seq || b->freed)
        return -1;
    b->freed = 1;
    r->live_bytes -= b->len;
    while (r->count > 0 && ring_at(r, 0)->freed) {
        r->first = (r->first + 1) % r->cap;
        r->count--;
    }
    if (r->count == 0) {
        r->first = 0;
        r->head = 0;
    }
    return 0;
}

int ring_abort_last(ring *r, uint64_t seq)
{
    if (r->count == 0)
        return -1;
    ring_block *b = ring_at(r, r->count - 1);
    if (b->seq != seq || b->freed)
        return -1;
    r->live_bytes -= b->len;
    r->count--;
    if (r->count == 0) {
        r->first = 0;
        r->head = 0;
    } else {
        ring_block *prev = ring_at(r, r->count - 1);
        r->head = prev->off + prev->len;
    }
    /* Freed blocks now at the newest end have nothing live after them: drop them too. */
    while (r->count > 0 && ring_at(r, r->count - 1)->freed) {
        r->count--;
        if (r->count == 0) {
            r->first = 0;
            r->head = 0;
        } else {
            ring_block *prev = ring_at(r, r->count - 1);
            r->head = prev->off + prev->len;
        }
    }
    return 0;
}

uint64_t ring_used(const ring *r)
{
    if (r->count == 0)
        return 0;
    uint64_t tail = ring_at(r, 0)->off;
    if (r->head > tail)
        return r->head - tail;
    return r->size - tail + r->head;
}

size_t ring_blocks(const ring *r)
{
    return r->count;
}
