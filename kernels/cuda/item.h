/* item.h — which block a Hopper TMA kernel's grid item works on (variants 6-12, ws_sm90.cuh
 * ws_item): item i of blocks_per_head * Hq to (head h, block x). Causal blocks differ in length
 * (the last rows see every key), so with lpt the longest first: every head's and sequence's last
 * block, then every one's last but one, and so on (the short ones then fill the last wave instead
 * of a long one running alone at the end); else head by head. Plain C, so that the host suite
 * (tests/test_kernel_items.c) checks the order the kernels walk; ws_sm90.cuh includes it for the
 * device. Stage: the CUDA backend's grid order, beside kernels.h. */
#ifndef ATTNSTAT_CUDA_ITEM_H
#define ATTNSTAT_CUDA_ITEM_H

#ifdef __CUDACC__
#define ITEM_FN static __host__ __device__ __forceinline__
#else
#define ITEM_FN static inline
#endif

/* Item i's head *h and block *x: lpt (never packed) with batch sequences of nblk blocks each, i =
 * (r * Hq + h) where r = (nblk - 1 - blk) * batch + seq and x = seq * nblk + blk; else i = h * bph
 * + x (bph: blocks per head). In 32-bit unsigned arithmetic where the item fits (every grid of
 * fewer than 2^31 blocks): a 64-bit division is a subroutine of tens of instructions, and the
 * persistent kernels' roles run this at every block's start (bench/kernel_notes.md round 13). */
ITEM_FN void item_block(long long i, int lpt, int hq, int batch, int nblk, int bph, int *h, int *x)
{
    if (i <= 0x7fffffffLL) {
        const unsigned u = (unsigned)i;
        if (lpt) {
            const unsigned uh = (unsigned)hq, ub = (unsigned)batch, r = u / uh, rq = r / ub;
            *h = (int)(u - r * uh);
            *x = (int)(r - rq * ub) * nblk + (nblk - 1 - (int)rq);
        } else {
            const unsigned ubph = (unsigned)bph, q = u / ubph;
            *h = (int)q, *x = (int)(u - q * ubph);
        }
        return;
    }
    if (lpt) {
        const int r = (int)(i / hq);
        *h = (int)(i % hq);
        *x = (r % batch) * nblk + (nblk - 1 - r / batch);
    } else {
        *h = (int)(i / bph);
        *x = (int)(i % bph);
    }
}

/* The items CTA c of a persistent grid of g CTAs (variants 10-12, ws_sm90.cuh) takes: one in every
 * round of g items, dealt forward in even rounds and backward in odd ones, item k of its sequence
 * being k g + c or k g + g-1-c (steps 2 (g - c) - 1 and 2 c + 1 in turn). With the longest blocks
 * first (lpt) the CTA dealt a round's longest block is dealt the next round's shortest:
 * round-robin (c, c + g, ...) gave CTA 0 the longest of every round, its busiest CTA 4-18% over
 * the mean on causal grids of 4096 keys and more, this 0-3% (bench/sched_model.py,
 * bench/kernel_notes.md round 24). The sequence rises, item k lying in [k g, k g + g): once past
 * the grid's items, every later one is too. Every role of the kernel walks the same sequence. */
typedef struct {
    long long i;      /* the item */
    int step, other;  /* the step to the next one, and the one after */
} item_deal;

ITEM_FN item_deal item_deal_start(unsigned c, unsigned g)
{
    item_deal d;
    d.i = (long long)c;
    d.step = 2 * (int)(g - c) - 1;
    d.other = 2 * (int)c + 1;
    return d;
}

ITEM_FN void item_deal_next(item_deal *d)
{
    const int t = d->step;
    d->i += t;
    d->step = d->other;
    d->other = t;
}

#endif /* ATTNSTAT_CUDA_ITEM_H */
