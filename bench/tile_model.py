#!/usr/bin/env python3
"""tile_model.py — how many wgmma tiles the TMA statistics kernels' consumer warpgroups run on causal
rows, as they are and if each warpgroup stopped at its own rows' last tile (rounds 17 and 27): no
GPU, a count (bench/kernel_notes.md, round 27), not a measurement.

The rows of one head (every row, or every k-th) in blocks of BM; a block's tiles are BN keys from
key 0 to its last row's diagonal, rounded up to an even count (the consumers' loop runs tiles in
pairs). As the kernels are, each of the block's NCW warpgroups (64 rows each) runs every tile of
the block; stopping at its own rows, each would run the tiles up to its own last row's diagonal,
rounded the same way. Printed: the second count over the first, for variant 11 (BM 192, BN 64,
three warpgroups) and variant 10 (BM 128, BN 128, two); then every 8th row's tiles over every
row's (issue 25's sampled target).

  python3 bench/tile_model.py
"""

VARIANTS = (("v10", 128, 128, 2), ("v11", 192, 64, 3))
SHAPES = (("1024 keys", 1024, 1), ("2048 keys", 2048, 1), ("4096 keys", 4096, 1),
          ("8192 keys", 8192, 1), ("16384 keys", 16384, 1), ("every 8th row of 4096", 4096, 8))


def pairs(last_tile):
    """Tiles 0..last_tile rounded up to an even count (none when last_tile < 0)."""
    return (last_tile + 2) & ~1


def tiles(n, every, bm, bn, ncw):
    """(before, after): wgmma tiles over one head's blocks. The blocks end at the last row, so the
    one partial block is the first, its empty slots (no row) at its start (common.cuh
    block_first_sample): a warpgroup with no row ran the block's tiles before, none after."""
    rows = list(range(0, n, every))
    part = len(rows) % bm
    rows = [-1] * ((bm - part) if part else 0) + rows
    before = after = 0
    for s in range(0, len(rows), bm):
        block = rows[s:s + bm]
        nt = pairs(block[-1] // bn)
        for w in range(ncw):
            last = max(block[w * 64:(w + 1) * 64])
            before += nt
            after += min(nt, pairs(last // bn)) if last >= 0 else 0
    return before, after


def main():
    print("| causal rows | " + " | ".join(v[0] for v in VARIANTS) + " |")
    print("|---|" + "---:|" * len(VARIANTS))
    for name, n, every in SHAPES:
        cells = []
        for _, bm, bn, ncw in VARIANTS:
            before, after = tiles(n, every, bm, bn, ncw)
            cells.append(f"{after / before:.3f}")
        print(f"| {name} | " + " | ".join(cells) + " |")
    # issue 25's sampled target (every 8th row <= 0.16 of the unsampled time) against the tiles:
    # the sampled run's wgmma tiles over the unsampled run's, as the kernels are and stopping at
    # each warpgroup's rows, beside the visible logits' share (1/8 plus the diagonal's)
    print()
    print("| every 8th causal row | " + " | ".join(v[0] for v in VARIANTS) +
          " | visible logits |")
    print("|---|" + "---:|" * (len(VARIANTS) + 1))
    for n in (2048, 4096):
        cells = []
        for _, bm, bn, ncw in VARIANTS:
            bu, au = tiles(n, 1, bm, bn, ncw)
            bs, as_ = tiles(n, 8, bm, bn, ncw)
            cells.append(f"{bs / bu:.3f} ({as_ / au:.3f})")
        vis = sum(i + 1 for i in range(0, n, 8)) / sum(i + 1 for i in range(n))
        print(f"| {n} keys | " + " | ".join(cells) + f" | {vis:.3f} |")


if __name__ == "__main__":
    main()
