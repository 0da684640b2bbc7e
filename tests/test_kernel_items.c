/* test_kernel_items.c — the order in which the Hopper TMA kernels (variants 6-12) take their grid's
 * items (kernels/cuda/item.h item_block, which ws_sm90.cuh's ws_item calls on the device).
 *
 * Every item of random grids maps to one (head, block) and every (head, block) is taken once
 * (a block missed would leave its part unwritten; one taken twice, counted twice); each result
 * inverts to its item by the layout's definition (lpt: i = r * Hq + h, r = (nblk - 1 - blk) *
 * batch + seq; else i = h * blocks_per_head + x). With lpt, the blocks come longest first (every
 * head's and sequence's last block before any earlier one), else head by head. Past 2^31 items,
 * where item_block leaves 32-bit arithmetic, the items on both sides of the edge and random ones
 * beyond it invert too. The persistent kernels' deal (item_deal): every item of random grids
 * taken by exactly one CTA, item k of CTA c being k G + c in even rounds and k G + G-1-c in odd
 * ones, and on blocks of non-increasing length no CTA's total over round-robin's busiest (strictly
 * under it once there are two full rounds of strictly decreasing lengths). Random shapes; the seed
 * is printed (ATTNSTAT_TEST_SEED repeats a run).
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

START_TEST(test_deal)
{
    for (int t = 0; t < 400; t++) {
        const int g = rnd(1, 300);
        const long long items = g + rnd(0, t < 200 ? 5 * g : 40 * g); /* G <= items (grid_of) */
        unsigned char *seen = calloc((size_t)items, 1);
        double *w = malloc(sizeof(double) * (size_t)items);
        ck_assert(seen && w);
        /* lengths, longest first, some equal: non-increasing */
        double v = 1000.0 + rnd(0, 1000);
        for (long long i = 0; i < items; i++) {
            w[i] = v;
            if (rnd(0, 3))
                v -= rnd(0, 7) * (v / 5000.0);
        }
        double dealt_max = 0, rr_max = 0;
        for (int c = 0; c < g; c++) {
            double dealt = 0, rr = 0;
            long long k = 0, last = -1;
            for (item_deal d = item_deal_start((unsigned)c, (unsigned)g); d.i < items;
                 item_deal_next(&d), k++) {
                const long long want = k * g + (k & 1 ? g - 1 - c : c);
                ck_assert_msg(d.i == want, "g %d, CTA %d, item %lld of its deal: %lld, not %lld",
                              g, c, k, d.i, want);
                ck_assert(d.i > last);
                last = d.i;
                ck_assert_int_eq(seen[d.i], 0);
                seen[d.i] = 1;
                dealt += w[d.i];
            }
            /* once past the items, the next one is too (the loops stop at the first) */
            ck_assert(k * g + (k & 1 ? g - 1 - c : c) >= items);
            for (long long i = c; i < items; i += g)
                rr += w[i];
            dealt_max = dealt > dealt_max ? dealt : dealt_max;
            rr_max = rr > rr_max ? rr : rr_max;
        }
        for (long long i = 0; i < items; i++)
            ck_assert_msg(seen[i], "g %d, items %lld: item %lld dealt to no CTA", g, items, i);
        ck_assert_msg(dealt_max <= rr_max * (1 + 1e-12), "g %d, items %lld: %g > %g", g, items,
                      dealt_max, rr_max);
        free(seen);
        free(w);
    }
    /* two full rounds of strictly decreasing lengths: round-robin's CTA 0 takes the longest of
     * both, the deal never does */
    for (int g = 2; g <= 300; g += 7) {
        double dealt_max = 0, rr0 = 0;
        for (int c = 0; c < g; c++) {
            double dealt = 0;
            for (item_deal d = item_deal_start((unsigned)c, (unsigned)g); d.i < 2LL * g;
                 item_deal_next(&d))
                dealt += 4.0 * g - (double)d.i;
            dealt_max = dealt > dealt_max ? dealt : dealt_max;
        }
        rr0 = (4.0 * g - 0) + (4.0 * g - g);
        ck_assert_msg(dealt_max < rr0, "g %d: dealt %g, round-robin %g", g, dealt_max, rr0);
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
    tcase_add_test(tc, test_deal);
    suite_add_tcase(su, tc);
    SRunner *sr = srunner_create(su);
    srunner_run_all(sr, CK_NORMAL);
    const int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
