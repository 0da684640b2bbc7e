#!/usr/bin/env python3
"""kernel_ab_table.py LOGDIR RUNS — bench/kernel_ab.sh's summary: from bench_kernel.py's logs of
builds A and B (LOGDIR/benchA_R.log, benchB_R.log, R = 1..RUNS; maxA.log, maxB.log when present),
one markdown table per measurement: every run's median for A and for B, side by side, and the change
of B's median of runs against A's. Rows are bench_kernel.py's shapes; columns the default path,
SDPA flash (A's runs and B's: the same PyTorch, so its drift is the run-to-run noise to read the
change against), each variant timed, and the max logit alone."""
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


def table(title, runs_a, runs_b):
    shapes, cols = [], []
    for run in runs_a + runs_b:
        for shape, col in run:
            shapes += [shape] if shape not in shapes else []
            cols += [col] if col not in cols else []
    keys = [(s, c) for s in shapes for c in cols
            if any((s, c) in r for r in runs_a + runs_b)]
    if not keys:
        return
    print(f"### {title}\n")
    print("| shape | column | A ms | B ms | change |")
    print("|---|---|---|---|---:|")
    for shape, col in keys:
        a = [r[(shape, col)] for r in runs_a if (shape, col) in r]
        b = [r[(shape, col)] for r in runs_b if (shape, col) in r]
        change = "-"
        if a and b:
            change = f"{100 * (statistics.median(b) / statistics.median(a) - 1):+.1f}%"
        fmt = lambda xs: ", ".join(f"{x:.4f}" for x in xs) or "-"  # noqa: E731
        print(f"| {shape} | {col} | {fmt(a)} | {fmt(b)} | {change} |")
    print()


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: kernel_ab_table.py LOGDIR RUNS")
    d, runs = sys.argv[1], int(sys.argv[2])
    table("statistics asked for by the daemon's default (medians of each run)",
          [read(os.path.join(d, f"benchA_{r}.log")) for r in range(1, runs + 1)],
          [read(os.path.join(d, f"benchB_{r}.log")) for r in range(1, runs + 1)])
    table("the max logit alone", [read(os.path.join(d, "maxA.log"))], [read(os.path.join(d, "maxB.log"))])


if __name__ == "__main__":
    main()
