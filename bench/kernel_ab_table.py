#!/usr/bin/env python3
"""kernel_ab_table.py LOGDIR RUNS [TREES..] — bench/kernel_ab.sh's summary: from bench_kernel.py's
logs of each tree (TREES: A B by default, A first; LOGDIR/benchT_R.log, R = 1..RUNS; maxT.log when
present), one markdown table per measurement: every run's median for each tree, side by side, and
the change of each candidate's median of runs against A's. Rows are bench_kernel.py's shapes;
columns the default path, SDPA flash (every tree's runs: the same PyTorch, so its drift is the
run-to-run noise to read the changes against), each variant timed, and the max logit alone."""
import os
import re
import statistics
import sys

TIME = re.compile(r"^time  (.+?)\s+ours ([0-9.]+) ms .*?sdpa ([0-9.]+) ms")


def read(path):
    """{(shape, column): ms} from one bench_kernel.py log; {} when the log is missing."""
    out = {}
    if not os.path.exists(path):
        return out
    header = None
    with open(path) as f:
        for line in f:
            m = TIME.match(line)
            if m:
                out[(m.group(1).strip(), "default")] = float(m.group(2))
                out[(m.group(1).strip(), "SDPA flash")] = float(m.group(3))
                continue
            if line.startswith("| shape |"):
                header = [c.strip() for c in line.strip().strip("|").split("|")]
                continue
            if header and line.startswith("| (") and len(header) > 2:
                cells = [c.strip() for c in line.strip().strip("|").split("|")]
                for name, cell in zip(header[2:], cells[2:]):
                    name = name.replace(" ms", "")
                    if name.startswith("default max logit alone"):
                        continue  # the variants table's own column, NaN without ATTNSTAT_BENCH_MAXONLY
                    try:
                        out[(cells[0], name)] = float(cell.split()[0])
                    except (ValueError, IndexError):
                        pass  # FAIL: the variant failed its float64 check
            elif not line.strip():
                header = None
    return out


def table(title, runs):
    """runs: {tree: [one {(shape, column): ms} per run]}, A first."""
    trees = list(runs)
    everything = [r for t in trees for r in runs[t]]
    shapes, cols = [], []
    for run in everything:
        for shape, col in run:
            shapes += [shape] if shape not in shapes else []
            cols += [col] if col not in cols else []
    keys = [(s, c) for s in shapes for c in cols if any((s, c) in r for r in everything)]
    if not keys:
        return
    print(f"### {title}\n")
    head = ["shape", "column", f"{trees[0]} ms"]
    for t in trees[1:]:
        head += [f"{t} ms", f"{t} vs {trees[0]}"]
    print("| " + " | ".join(head) + " |")
    print("|---|---|---|" + "---|---:|" * (len(trees) - 1))
    fmt = lambda xs: ", ".join(f"{x:.4f}" for x in xs) or "-"  # noqa: E731
    for shape, col in keys:
        ms = {t: [r[(shape, col)] for r in runs[t] if (shape, col) in r] for t in trees}
        a = ms[trees[0]]
        cells = [shape, col, fmt(a)]
        for t in trees[1:]:
            change = "-"
            if a and ms[t]:
                change = f"{100 * (statistics.median(ms[t]) / statistics.median(a) - 1):+.1f}%"
            cells += [fmt(ms[t]), change]
        print("| " + " | ".join(cells) + " |")
    print()


def main():
    if len(sys.argv) < 3:
        sys.exit("usage: kernel_ab_table.py LOGDIR RUNS [TREES..]")
    d, runs = sys.argv[1], int(sys.argv[2])
    trees = sys.argv[3:] or ["A", "B"]
    table("statistics asked for by the daemon's default (medians of each run)",
          {t: [read(os.path.join(d, f"bench{t}_{r}.log")) for r in range(1, runs + 1)]
           for t in trees})
    table("the max logit alone", {t: [read(os.path.join(d, f"max{t}.log"))] for t in trees})


if __name__ == "__main__":
    main()
