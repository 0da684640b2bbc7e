/* gather.c — compact copy of strided host tensors into the ring (see gather.h).
 *
 * Stage: a leaf of the library (used by push.c); calls libc only. */
#include "gather.h"

#include <string.h>

/* Dense when, ignoring dimensions of size 1 and taking the others by increasing stride, each
 * stride equals the product of the sizes of the dimensions before it (D first, stride 1). */
static int gather_is_dense(const int64_t shape[4], const int64_t strides[4])
{
    int idx[3], n = 0;
    for (int i = 0; i < 3; i++)
        if (shape[i] > 1)
            idx[n++] = i;
    for (int i = 1; i < n; i++) /* insertion sort by stride */
        for (int j = i; j > 0 && strides[idx[j]] < strides[idx[j - 1]]; j--) {
            int t = idx[j];
            idx[j] = idx[j - 1];
            idx[j - 1] = t;
        }
    int64_t expect = shape[3];
    for (int i = 0; i < n; i++) {
        if (strides[idx[i]] != expect)
            return 0;
        expect *= shape[idx[i]];
    }
    return 1;
}

int gather_extent(const int64_t shape[4], const int64_t strides[4], size_t esize,
                  uint64_t *bytes)
{
    uint64_t last = 0, step = 0;
    for (int i = 0; i < 4; i++)
        if (shape[i] < 1 || (shape[i] > 1 && strides[i] < 0) ||
            __builtin_mul_overflow((uint64_t)(shape[i] - 1), (uint64_t)strides[i], &step) ||
            __builtin_add_overflow(last, step, &last))
            return -1;
    if (__builtin_add_overflow(last, 1, &last) || __builtin_mul_overflow(last, esize, bytes))
        return -1;
    return 0;
}

int gather_make_plan(const int64_t shape[4], const int64_t strides[4], size_t esize,
                     gather_plan *plan)
{
    uint64_t n = esize;
    for (int i = 0; i < 4; i++)
        if (__builtin_mul_overflow(n, (uint64_t)shape[i], &n))
            return -1;
    plan->bytes = n;
    plan->dense = gather_is_dense(shape, strides);
    if (plan->dense) {
        memcpy(plan->strides, strides, sizeof plan->strides);
    } else {
        plan->strides[3] = 1;
        plan->strides[2] = shape[3];
        plan->strides[1] = shape[2] * shape[3];
        plan->strides[0] = shape[1] * shape[2] * shape[3];
    }
    return 0;
}

void gather_copy(void *dst, const void *src, const int64_t shape[4], const int64_t strides[4],
                 size_t esize, const gather_plan *plan)
{
    if (plan->dense) {
        memcpy(dst, src, plan->bytes);
        return;
    }
    const char *s = src;
    char *d = dst;
    size_t row = (size_t)shape[3] * esize;
    int rows_contiguous = shape[2] == 1 || strides[2] == shape[3];
    for (int64_t b = 0; b < shape[0]; b++)
        for (int64_t h = 0; h < shape[1]; h++) {
            const char *sh = s + (size_t)(b * strides[0] + h * strides[1]) * esize;
            if (rows_contiguous) {
                memcpy(d, sh, row * (size_t)shape[2]);
                d += row * (size_t)shape[2];
                continue;
            }
            for (int64_t n = 0; n < shape[2]; n++) {
                memcpy(d, sh + (size_t)(n * strides[2]) * esize, row);
                d += row;
            }
        }
}
