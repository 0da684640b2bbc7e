/* ring.h — the allocator of libattnstat's rings (internal to the library): the host
 * shared-memory ring and each device's staging ring.
 *
 * The ring is a byte range [0, size) handed out in FIFO order: each allocation is one contiguous
 * block, identified by the push sequence number that owns it, and placed after the newest block,
 * wrapping to offset 0 when the end has no room. Blocks may be freed in any order (the daemon
 * drops some pushes at once and finishes others later); space is reclaimed when the oldest block
 * is freed, so a block freed early waits for the ones before it. No memory is touched: the ring
 * only does the bookkeeping over offsets; the caller maps the memory.
 *
 * Stage: a leaf; includes libc only. */
#ifndef ATTNSTAT_RING_H
#define ATTNSTAT_RING_H

#include <stddef.h>
#include <stdint.h>

#define RING_ALIGN 64u

typedef struct {
    uint64_t seq;
    uint64_t off, len;
    int freed;
} ring_block;

typedef struct {
    uint64_t size;       /* bytes managed */
    uint64_t head;       /* where the next block goes (before the wrap test) */
    uint64_t live_bytes; /* sum of len over blocks not freed */
    ring_block *blocks;  /* circular FIFO of blocks, oldest first */
    size_t cap, first, count, max_blocks;
} ring;

/* Prepares r to manage size bytes with at most max_blocks blocks outstanding (0: no limit beyond
 * memory). Returns 0, or -1 when size is 0. */
int ring_init(ring *r, uint64_t size, size_t max_blocks);
void ring_destroy(ring *r);

/* Reserves len bytes (rounded up to RING_ALIGN) for seq, which must be larger than every seq
 * allocated before. Returns 0 with *off set, 1 when there is no room now, -1 when len is 0 or
 * larger than the ring or bookkeeping memory ran out. */
int ring_alloc(ring *r, uint64_t len, uint64_t seq, uint64_t *off);

/* Frees seq's block. Returns 0, or -1 when seq holds no block (unknown or already freed). */
int ring_release(ring *r, uint64_t seq);

/* Takes back the newest block when it belongs to seq (a push that failed before it was sent):
 * its space is free again at once and the head returns where it was. Returns 0, or -1 when the
 * newest block is not seq's (use ring_release then). */
int ring_abort_last(ring *r, uint64_t seq);

/* Bytes not available for allocation now: from the oldest live block to the head, including
 * space skipped at the end by a wrap. 0 when empty. */
uint64_t ring_used(const ring *r);

/* Number of blocks allocated and not yet reclaimed (freed blocks behind a live one count). */
size_t ring_blocks(const ring *r);

#endif /* ATTNSTAT_RING_H */
