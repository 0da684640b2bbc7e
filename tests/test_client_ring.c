/* test_client_ring.c — unit tests of libattnstat's two leaves that need no socket: the ring
 * allocator (client/ring.c: FIFO blocks freed in any order, wrap, abort of the newest block; random
 * allocations against a byte map) and the compact copy of strided host tensors (client/gather.c:
 * random layouts copied element for element, dense layouts detected).
 * Random data; the seed is printed (set ATTNSTAT_TEST_SEED to repeat a run). */
#include <check.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client_testutil.h"
#include "gather.h"
#include "ring.h"

static uint64_t g_seed;

/* ---- Ring ------------------------------------------------------------------------------------- */
START_TEST(test_ring_basic)
{
    ring r;
    ck_assert_int_eq(ring_init(&r, 0, 0), -1);
    ck_assert_int_eq(ring_init(&r, 1024, 0), 0);
    uint64_t off;
    ck_assert_int_eq(ring_alloc(&r, 0, 1, &off), -1);
    ck_assert_int_eq(ring_alloc(&r, 2048, 1, &off), -1);
    ck_assert_int_eq(ring_alloc(&r, 100, 1, &off), 0);
    ck_assert_uint_eq(off, 0);
    ck_assert_int_eq(ring_alloc(&r, 500, 2, &off), 0);
    ck_assert_uint_eq(off, 128); /* 100 rounded up to the 64-byte alignment */
    ck_assert_int_eq(ring_alloc(&r, 384, 3, &off), 0);
    ck_assert_uint_eq(off, 640);
    ck_assert_int_eq(ring_alloc(&r, 64, 4, &off), 1); /* the end is reached, the start is held */
    /* Out-of-order free: 2 freed first reclaims nothing until 1 goes. */
    ck_assert_int_eq(ring_release(&r, 2), 0);
    ck_assert_int_eq(ring_release(&r, 2), -1);
    ck_assert_int_eq(ring_release(&r, 99), -1);
    ck_assert_int_eq(ring_alloc(&r, 64, 4, &off), 1);
    ck_assert_int_eq(ring_release(&r, 1), 0);
    ck_assert_uint_eq(ring_used(&r), 1024 - 640);
    /* Wrap: the end has no room for 200, the start has 640 free. */
    ck_assert_int_eq(ring_alloc(&r, 200, 5, &off), 0);
    ck_assert_uint_eq(off, 0);
    ck_assert_uint_eq(ring_used(&r), 1024 - 640 + 256);
    ck_assert_int_eq(ring_alloc(&r, 384, 6, &off), 0);
    ck_assert_uint_eq(off, 256);
    ck_assert_int_eq(ring_alloc(&r, 1, 7, &off), 1); /* head meets tail */
    ck_assert_int_eq(ring_release(&r, 3), 0);
    ck_assert_int_eq(ring_release(&r, 5), 0);
    ck_assert_int_eq(ring_release(&r, 6), 0);
    ck_assert_uint_eq(ring_used(&r), 0);
    ck_assert_uint_eq(ring_blocks(&r), 0);
    ck_assert_int_eq(ring_alloc(&r, 1024, 8, &off), 0); /* whole ring after emptying */
    ck_assert_uint_eq(off, 0);
    ring_destroy(&r);

    ck_assert_int_eq(ring_init(&r, 1 << 20, 3), 0); /* block limit */
    for (uint64_t s = 1; s <= 3; s++)
        ck_assert_int_eq(ring_alloc(&r, 10, s, &off), 0);
    ck_assert_int_eq(ring_alloc(&r, 10, 4, &off), 1);
    ring_destroy(&r);
}
END_TEST

/* Random allocations and frees in any order against a byte map of the ring: no two live blocks
 * overlap, every block lies inside the ring, and an empty ring gives back all of its room. */
/* A block taken back (its push failed before it was sent) frees its space at once, even behind
 * live blocks, and its seq is never found again. */
START_TEST(test_ring_abort_last)
{
    ring r;
    uint64_t off;
    ck_assert_int_eq(ring_init(&r, 1024, 0), 0);
    ck_assert_int_eq(ring_alloc(&r, 100, 1, &off), 0);
    ck_assert_int_eq(ring_alloc(&r, 100, 2, &off), 0);
    ck_assert_uint_eq(off, 128);
    ck_assert_int_eq(ring_abort_last(&r, 1), -1); /* not the newest */
    ck_assert_int_eq(ring_abort_last(&r, 2), 0);
    ck_assert_int_eq(ring_abort_last(&r, 2), -1);
    ck_assert_int_eq(ring_release(&r, 2), -1);
    ck_assert_uint_eq(ring_used(&r), 128);
    ck_assert_uint_eq(ring_blocks(&r), 1);
    ck_assert_int_eq(ring_alloc(&r, 100, 3, &off), 0);
    ck_assert_uint_eq(off, 128); /* the space of 2 again */
    ck_assert_int_eq(ring_alloc(&r, 100, 4, &off), 0);
    ck_assert_int_eq(ring_release(&r, 3), 0);   /* freed behind 1, ahead of 4 */
    ck_assert_int_eq(ring_abort_last(&r, 4), 0); /* 3 goes with it: nothing live after 1 */
    ck_assert_uint_eq(ring_used(&r), 128);
    ck_assert_uint_eq(ring_blocks(&r), 1);
    ck_assert_int_eq(ring_release(&r, 1), 0);
    ck_assert_uint_eq(ring_used(&r), 0);
    ck_assert_int_eq(ring_alloc(&r, 1024, 5, &off), 0);
    ck_assert_uint_eq(off, 0);
    ring_destroy(&r);
}
END_TEST

START_TEST(test_ring_random)
{
    uint64_t s = g_seed ^ 0x1111;
    const uint64_t size = 4096 + rng_below(&s, 8192);
    ring r;
    ck_assert_int_eq(ring_init(&r, size, 0), 0);
    uint8_t *owner = calloc(size, 1);
    uint64_t live_seq[256], live_off[256], live_len[256];
    int nlive = 0;
    uint64_t seq = 1, allocs = 0, fulls = 0;
    for (int it = 0; it < 200000; it++) {
        if (nlive < 256 && (nlive == 0 || rng_below(&s, 100) < 55)) {
            uint64_t len = 1 + rng_below(&s, size / 4);
            uint64_t off;
            int rc = ring_alloc(&r, len, seq, &off);
            ck_assert_int_ge(rc, 0);
            if (rc == 1) {
                fulls++;
                seq++;
                continue;
            }
            allocs++;
            ck_assert_uint_le(off + len, size);
            ck_assert_uint_eq(off % RING_ALIGN, 0);
            int twice = 0;
            for (uint64_t i = off; i < off + len; i++) {
                twice |= owner[i];
                owner[i] = 1;
            }
            ck_assert_msg(!twice, "seed %llu: block [%llu, +%llu) overlaps a live block",
                          (unsigned long long)g_seed, (unsigned long long)off,
                          (unsigned long long)len);
            live_seq[nlive] = seq;
            live_off[nlive] = off;
            live_len[nlive] = len;
            nlive++;
            seq++;
        } else {
            int k = (int)rng_below(&s, (uint64_t)nlive);
            ck_assert_int_eq(ring_release(&r, live_seq[k]), 0);
            memset(owner + live_off[k], 0, live_len[k]);
            live_seq[k] = live_seq[nlive - 1];
            live_off[k] = live_off[nlive - 1];
            live_len[k] = live_len[nlive - 1];
            nlive--;
        }
        ck_assert_uint_le(ring_used(&r), size);
    }
    ck_assert_uint_gt(allocs, 1000);
    ck_assert_uint_gt(fulls, 0);
    while (nlive > 0)
        ck_assert_int_eq(ring_release(&r, live_seq[--nlive]), 0);
    ck_assert_uint_eq(ring_used(&r), 0);
    uint64_t off;
    ck_assert_int_eq(ring_alloc(&r, size, seq, &off), 0);
    free(owner);
    ring_destroy(&r);
}
END_TEST

/* ---- Gather ----------------------------------------------------------------------------------- */

START_TEST(test_gather_random)
{
    uint64_t s = g_seed ^ 0x2222;
    int dense_seen = 0, gathered_seen = 0;
    for (int it = 0; it < 2000; it++) {
        layout l;
        random_layout(&s, &l);
        uint8_t *src = malloc((size_t)l.span * l.esize);
        fill_random(src, (size_t)l.span * l.esize, &s);
        gather_plan plan;
        ck_assert_int_eq(gather_make_plan(l.shape, l.strides, l.esize, &plan), 0);
        uint64_t n = l.shape[0] * l.shape[1] * l.shape[2] * l.shape[3];
        ck_assert_uint_eq(plan.bytes, n * l.esize);
        uint8_t *dst = malloc(plan.bytes + 64);
        memset(dst, 0xA5, plan.bytes + 64);
        gather_copy(dst, src, l.shape, l.strides, l.esize, &plan);
        dense_seen += plan.dense;
        gathered_seen += !plan.dense;
        /* Every element [b,h,n,d] read through the plan's strides is the source's element. */
        for (int64_t b = 0; b < l.shape[0]; b++)
            for (int64_t h = 0; h < l.shape[1]; h++)
                for (int64_t r = 0; r < l.shape[2]; r++)
                    for (int64_t d = 0; d < l.shape[3]; d++) {
                        int64_t so = b * l.strides[0] + h * l.strides[1] + r * l.strides[2] + d;
                        int64_t dof = b * plan.strides[0] + h * plan.strides[1] +
                                      r * plan.strides[2] + d;
                        if (dof >= (int64_t)n ||
                            memcmp(src + so * (int64_t)l.esize, dst + dof * (int64_t)l.esize,
                                   l.esize) != 0)
                            ck_abort_msg("seed %llu iteration %d: element [%lld,%lld,%lld,%lld]",
                                         (unsigned long long)g_seed, it, (long long)b,
                                         (long long)h, (long long)r, (long long)d);
                    }
        for (int i = 0; i < 64; i++) /* nothing written past the compact copy */
            ck_assert_uint_eq(dst[plan.bytes + (uint64_t)i], 0xA5);
        free(src);
        free(dst);
    }
    ck_assert_int_gt(dense_seen, 0);
    ck_assert_int_gt(gathered_seen, 0);
}
END_TEST

START_TEST(test_gather_dense_detection)
{
    gather_plan p;
    int64_t shape[4] = {2, 3, 5, 8};
    int64_t bhnd[4] = {120, 40, 8, 1}, bnhd[4] = {120, 8, 24, 1}, padded[4] = {150, 50, 10, 1};
    ck_assert_int_eq(gather_make_plan(shape, bhnd, 2, &p), 0);
    ck_assert_int_eq(p.dense, 1);
    ck_assert_int_eq(gather_make_plan(shape, bnhd, 2, &p), 0);
    ck_assert_int_eq(p.dense, 1);
    ck_assert_int_eq(p.strides[1], 8); /* kept as given */
    ck_assert_int_eq(gather_make_plan(shape, padded, 2, &p), 0);
    ck_assert_int_eq(p.dense, 0);
    ck_assert_int_eq(p.strides[0], 120);
    int64_t huge[4] = {INT32_MAX, INT32_MAX, INT32_MAX, INT32_MAX};
    ck_assert_int_eq(gather_make_plan(huge, bhnd, 4, &p), -1);
}
END_TEST

static Suite *client_ring_suite(void)
{
    Suite *s = suite_create("client_ring");
    TCase *tc = tcase_create("ring");
    tcase_add_test(tc, test_ring_basic);
    tcase_add_test(tc, test_ring_random);
    tcase_add_test(tc, test_ring_abort_last);
    suite_add_tcase(s, tc);
    tc = tcase_create("gather");
    tcase_add_test(tc, test_gather_random);
    tcase_add_test(tc, test_gather_dense_detection);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    g_seed = client_test_seed("test_client_ring");
    return client_test_run(client_ring_suite());
}
