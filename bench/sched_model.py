#!/usr/bin/env python3
"""sched_model.py — how evenly the persistent statistics kernels (variants 10-12) spread a causal
grid's blocks over the SMs, by the blocks' lengths alone: no GPU, a model for predictions
(bench/kernel_notes.md, round 22), not a measurement.

Each (sequence, head) has ceil(N / BM) blocks of BM rows, the partial one first (round 9); a block
takes its last row's K tiles of BN keys (all its warpgroups multiply up to the block's last key)
plus FIXED tile-equivalents of work that does not depend on its length (its rows' ends, Q, the
preparation: about 6 at (8,32,1024,128) by round 22's profile). Blocks are numbered longest first
(item.h, lpt). Three schedules over G CTAs:
  round-robin   CTA c takes items c, c + G, c + 2G, ... (the kernels before round 24)
  deal          CTA c takes one item of every round of G, forward in even rounds (k G + c) and
                backward in odd ones (k G + G-1-c): round 24 (item_deal, merged in 3327a8a)
  greedy        each CTA, when it finishes a block, takes the next undrawn item (a shared counter,
                round 22)
A CTA's time is the sum of its blocks'; the launch's is the busiest CTA's. Printed: the busiest
CTA over the mean (1.000: every SM busy to the end) for each, and the change from one to the other.

  python3 bench/sched_model.py [--sms 132] [--fixed 6]
"""
import argparse
import heapq
import math

# bench_kernel.py's causal shapes and the persistent variant AUTO takes for each (variants.h):
# variant 11 (BM 192, BN 64) up to 4096 keys at head_dim 64 and 8192 at 128, variant 10 (BM 128,
# BN 128) for head_dim 64 at 4097-8192 keys
SHAPES = [
    ("(8,32,1024,128) causal", 8, 32, 1024, 192, 64),
    ("(4,32,2048,128) causal", 4, 32, 2048, 192, 64),
    ("(4,32/4,2048,64) causal", 4, 32, 2048, 192, 64),
    ("(2,32,4096,128) causal", 2, 32, 4096, 192, 64),
    ("(1,16,8192,64) causal", 1, 16, 8192, 128, 128),
    ("(1,16,8192,64) causal, variant 11", 1, 16, 8192, 192, 64),
    ("(1,32,16384,128) causal, variant 11", 1, 32, 16384, 192, 64),
    # every 8th row (512 sampled rows a sequence; AUTO takes variant 6, not persistent: these
    # are what variant 10 or 11 would do there)
    ("(2,32,4096,128) causal, every 8th row, variant 10", 2, 32, 4096, 128, 128, 8),
    ("(2,32,4096,128) causal, every 8th row, variant 11", 2, 32, 4096, 192, 64, 8),
]


def block_tiles(n, bm, bn, every=1):
    """K tiles of each block of a causal sequence of n rows, every `every`-th row taken (row r at
    position r * every), the partial block first."""
    rows = math.ceil(n / every)
    nb = math.ceil(rows / bm)
    part = rows % bm
    out = []
    for b in range(nb):
        last = b * bm - ((bm - part) if part else 0) + bm - 1
        out.append(math.ceil((last * every + 1) / bn))
    return out


def imbalance(batch, heads, n, bm, bn, fixed, sms, every=1):
    tiles = block_tiles(n, bm, bn, every)
    nb = len(tiles)
    # item i = r * heads + h, r = (nb - 1 - blk) * batch + seq: the longest blocks first
    items = [tiles[nb - 1 - r // batch] + fixed for r in range(nb * batch) for _ in range(heads)]
    grid = min(sms, len(items))
    mean = sum(items) / grid
    rr = [0.0] * grid
    for i, w in enumerate(items):
        rr[i % grid] += w
    deal = [0.0] * grid
    for i, w in enumerate(items):
        k, c = divmod(i, grid)
        deal[c if k % 2 == 0 else grid - 1 - c] += w
    greedy = [0.0] * grid
    for w in items:  # the CTA that finishes first takes the next item
        heapq.heappush(greedy, heapq.heappop(greedy) + w)
    return len(items), max(rr) / mean, max(deal) / mean, max(greedy) / mean


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sms", type=int, default=132)
    ap.add_argument("--fixed", type=float, default=6.0)
    a = ap.parse_args()
    print(f"SMs {a.sms}, fixed work per block {a.fixed:g} tile-equivalents")
    print("| shape | blocks | round-robin: busiest / mean | deal | change | greedy | change |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name, b, h, n, bm, bn, *every in SHAPES:
        items, rr, dl, gr = imbalance(b, h, n, bm, bn, a.fixed, a.sms, *every)
        print(f"| {name} | {items} | {rr:.3f} | {dl:.3f} | {100 * (dl / rr - 1):+.1f}% "
              f"| {gr:.3f} | {100 * (gr / rr - 1):+.1f}% |")


if __name__ == "__main__":
    main()
