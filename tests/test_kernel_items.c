/* test_kernel_items.c — the order in which the Hopper TMA kernels (variants 6-12) take their grid's
 * items (kernels/cuda/item.h item_block, which ws_sm90.cuh's ws_item calls on the device).
 *
 * Every item of random grids maps to one (head, block) and every (head, block) is taken once
 * (a block missed would leave its part unwritten; one taken twice, counted twice); each result
 * inverts to its item by the layout's definition (lpt: i = r * Hq + h, r = (nblk - 1 - blk) *
 * batch + seq; else i = h * blocks_per_head + x). With lpt, the blocks come longest first (every
 * head's and sequence's last block before any earlier one), else head by head. Past 2^31 items,
 * where item_block leaves 32-bit arithmetic, the items on both sides of the edge and random ones
 * beyond it invert too. Random shapes; the seed is printed (ATTNSTAT_TEST_SEED repeats a run).
 *
 * Stage: a host unit test of the CUDA backend's grid order; needs no GPU. */
#include <check.h>
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cuda/item.h"

static uint64_t g_rng;

static uint64_t next_u64(void)
{
    uint64_t z = (g_rng += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static int rnd(int lo, int hi) /* in [lo, hi] */
{
    return lo + (int)(next_u64() % (uint64_t)(hi - lo + 1));
}

/* The item that (h, x) is by the layout's definition. */
static long long item_of(int lpt, int hq, int batch, int nblk, int bph, int h, int x)
{
    if (!lpt)
        return (long long)h * bph + x;
    const int seq = x / nblk, blk = x % nblk;
    const long long r = (long long)(nblk - 1 - blk) * batch + seq;
    return r * hq + h;
}

START_TEST(test_every_block_once)
{
    for (int t = 0; t < 300; t++) {
        const int lpt = t & 1, hq = rnd(1, 40), batch = rnd(1, 6), nblk = rnd(1, 40);
        /* unpacked lpt grids have batch * nblk blocks per head; the others may have more (a
         * packed grid's bound), the items past a sequence's blocks are still taken once */
        const int bph = lpt ? batch * nblk : batch * nblk + rnd(0, 5);
        const long long items = (long long)bph * hq;
        unsigned char *seen = calloc((size_t)items, 1);
        ck_assert_ptr_nonnull(seen);
        int prev_h = -1, prev_blk = nblk;
        for (long long i = 0; i < items; i++) {
            int h = -1, x = -1;
            item_block(i, lpt, hq, batch, nblk, bph, &h, &x);
            ck_assert_msg(h >= 0 && h < hq && x >= 0 && x < bph,
                          "item %lld of (hq %d, batch %d, nblk %d, bph %d, lpt %d): h %d x %d", i,
                          hq, batch, nblk, bph, lpt, h, x);
            ck_assert_int_eq(seen[(long long)h * bph + x], 0);
            seen[(long long)h * bph + x] = 1;
            ck_assert_int_eq(item_of(lpt, hq, batch, nblk, bph, h, x), i);
            if (lpt) { /* longest first: a block's place in its sequence never rises */
                const int blk = x % nblk;
                ck_assert_int_le(blk, prev_blk);
                if (i < (long long)hq * batch)
                    ck_assert_int_eq(blk, nblk - 1);
                prev_blk = blk;
            } else { /* head by head */
                ck_assert_int_ge(h, prev_h);
                prev_h = h;
            }
        }
        free(seen);
    }
}
END_TEST

START_TEST(test_past_2_31)
{
    /* 32768 heads x 2 sequences x 40000 blocks: 2.6e9 items */
    const int hq = 32768, batch = 2, nblk = 40000, bph = batch * nblk;
    const long long items = (long long)bph * hq, edge = 0x80000000LL;
    ck_assert(items > edge);
    for (int lpt = 0; lpt <= 1; lpt++) {
        for (long long k = -3; k <= 3; k++) {
            int h, x;
            item_block(edge + k, lpt, hq, batch, nblk, bph, &h, &x);
            ck_assert_int_eq(item_of(lpt, hq, batch, nblk, bph, h, x), edge + k);
        }
        for (int t = 0; t < 100000; t++) {
            const long long i = (long long)(next_u64() % (uint64_t)items);
            int h, x;
            item_block(i, lpt, hq, batch, nblk, bph, &h, &x);
            ck_assert(h >= 0 && h < hq && x >= 0 && x < bph);
            ck_assert_int_eq(item_of(lpt, hq, batch, nblk, bph, h, x), i);
        }
        int h, x;
        item_block(items - 1, lpt, hq, batch, nblk, bph, &h, &x);
        ck_assert_int_eq(item_of(lpt, hq, batch, nblk, bph, h, x), items - 1);
    }
}
END_TEST

int main(void)
{
    const char *env = getenv("ATTNSTAT_TEST_SEED");
    g_rng = env && *env ? strtoull(env, NULL, 10) : (uint64_t)time(NULL) ^ (uint64_t)clock();
    printf("test_kernel_items: seed %" PRIu64 " (set ATTNSTAT_TEST_SEED=%" PRIu64 " to replay)\n",
           g_rng, g_rng);
    Suite *su = suite_create("kernel_items");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, test_every_block_once);
    tcase_add_test(tc, test_past_2_31);
    suite_add_tcase(su, tc);
    SRunner *sr = srunner_create(su);
    srunner_run_all(sr, CK_NORMAL);
    const int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
