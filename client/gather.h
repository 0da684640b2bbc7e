/* gather.h — copying a strided host tensor compactly into ring memory (internal to
 * libattnstat). Only the bytes the shape and strides describe are copied. A tensor whose
 * elements tile a dense block in some order of the B, H, N dimensions (e.g. [B,H,N,D] or
 * [B,N,H,D] memory) is copied with one memcpy and keeps its strides; any other tensor (a slice,
 * padding between rows, broadcast strides) is gathered into a dense [B,H,N,D] block.
 *
 * Stage: a leaf; includes libc only. */
#ifndef ATTNSTAT_GATHER_H
#define ATTNSTAT_GATHER_H

#include <stddef.h>
#include <stdint.h>

typedef struct {
    uint64_t bytes;         /* size of the compact copy */
    int64_t strides[4];     /* element strides of the copy, [B, H, N, D] */
    int dense;              /* 1: the source is one dense block, copied as is */
} gather_plan;

/* Plans the copy of a tensor of shape[4] with strides[4] (elements, strides[3] == 1, every
 * shape > 0) and elements of esize bytes. Returns 0, or -1 when the byte count overflows. */
int gather_make_plan(const int64_t shape[4], const int64_t strides[4], size_t esize,
                     gather_plan *plan);

/* The bytes from a tensor's first element to the end of its last one:
 * (sum over i of (shape[i] - 1) * strides[i] + 1) * esize, every shape >= 1 and stride >= 0.
 * Returns 0, or -1 when that count overflows 64 bits (or a shape is < 1, or a stride of a
 * dimension longer than 1 is negative). */
int gather_extent(const int64_t shape[4], const int64_t strides[4], size_t esize,
                  uint64_t *bytes);

/* Copies the tensor at src into dst (plan->bytes bytes) according to plan. */
void gather_copy(void *dst, const void *src, const int64_t shape[4], const int64_t strides[4],
                 size_t esize, const gather_plan *plan);

#endif /* ATTNSTAT_GATHER_H */
