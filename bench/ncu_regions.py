#!/usr/bin/env python3
"""ncu_regions.py — where a persistent statistics kernel (stats_wsp_kernel, variants 10-12) spends its
instructions and its warps' time, by region of its SASS, from Nsight Compute's source page:

  ncu -o REP --section SourceCounters --section WarpStateStats ... python3 bench/profile_kernel.py ...
  ncu -i REP.ncu-rep --page source --csv --print-source cuda,sass > REP.src.csv
  bench/ncu_regions.py REP.src.csv [--root DIR] [--markdown]

The kernel must be built with -lineinfo (bench/bench_kernel.sh profile does not; kernel_notes.md's
round 19 has the configure line). Each SASS instruction carries its innermost source line; the
function of that line comes from ctags over the sources under --root (default: this checkout, which
must hold the profiled commit's kernels). Regions come from the control flow, not from the names
alone, since an inlined helper (mbar_wait, a shuffle) serves several regions:
  - the tile loop: the smallest backward branch whose body holds HGMMA instructions;
  - the consumers' block loop: the smallest backward branch around the tile loop; what lies in it
    before the tile loop is a block's start, after it the block's end;
  - the producer: from the consumers' exit up to the out-of-line try-wait loops, which the compiler
    puts last; each of those takes the region of the instruction it branches back to.
Within a region, instructions are named by function (the item arithmetic, the rows' ranges, Q, the
fold, the rows' ends, the part's butterfly...). Per line: warp instructions executed, share of all,
warp-state samples, share of the consumers' samples, the top three stall reasons."""
import argparse
import collections
import csv
import os
import re
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))

# function (innermost) -> sub-region name; lines of ws_sm90.cuh's ws_consume lambdas by range
GROUPS = {
    "item": ("item_block", "ws_item", "ws_block", "cta_sequence", "stats_sample_row",
             "sampled_count_dev", "block_first_sample", "part_init"),
    "waits": ("mbar_wait", "mbar_arrive", "named_bar_sync", "smem_u32"),
    "ranges": ("warp_rows_range", "visible_range", "clampi"),
    "Q": ("ldmatrix_x4",),
    "wgmma": ("run", "wg_desc", "wg_desc_advance", "wg_desc_sw128", "wgmma_fence", "wgmma_commit",
              "wgmma_wait", "reg_fence"),
    "fold": ("fold_lane", "fold_max", "lane_row_max", "ex2", "ex2_poly", "tanh_fast", "fmax_nan",
             "first_key_pick", "quad_first_logit", "fold_tile"),
    "rows' ends": ("warp_rows_done", "warp_rows_done_max", "row_done", "row_done_max",
                   "row_uncounted", "state_merge", "head_sink"),
    "part": ("warp_store_part", "block_store_part", "part_merge", "part_shfl_merge"),
    "K tiles": ("ws_produce", "tma_load_4d", "tma_prefetch_map", "mbar_arrive_expect_tx"),
    "preparation": ("ws_rows", "block_key_range", "ws_load_q", "cp_async16", "cp_async_commit",
                    "cp_async_wait"),
}
GROUP_OF = {f: g for g, fs in GROUPS.items() for f in fs}


def load(path):
    """One entry per SASS address: text, warp instructions executed, samples, stalls, lines."""
    by = collections.OrderedDict()
    fname = hdr = None
    line = 0
    with open(path, newline="") as fh:
        for rec in csv.reader(fh):
            if not rec:
                continue
            if rec[0] == "File Path":
                fname = rec[1]
            elif rec[0] == "Line No":
                hdr = rec
            elif rec[0] == "Function Name" or hdr is None:
                continue
            elif rec[0]:
                line = int(rec[0])
            elif len(rec) > 7 and rec[2].startswith("0x"):
                num = (lambda v: int(v) if v not in ("", "-") else 0)
                a = int(rec[2], 16)
                e = by.get(a)
                if e is None:
                    stalls = {hdr[i][6:]: num(rec[i]) for i in range(len(hdr))
                              if hdr[i].startswith("stall_") and "Not Issued" not in hdr[i]}
                    e = by[a] = dict(addr=a, sass=rec[3].strip(), samples=num(rec[4]),
                                     inst=num(rec[7]), stalls=stalls, where=[])
                e["where"].append((fname, line))
    return sorted(by.values(), key=lambda e: e["addr"])


class Functions:
    """The function around a file's line, by ctags (start and end lines)."""

    def __init__(self, root):
        self.root, self.tags = root, {}

    def relative(self, fname):
        """fname under root: a profile names the file where it was compiled (the GPU machine's
        /tmp/ab-src-A/kernels/...), so the longest tail of it that exists under root."""
        if not fname.startswith("/"):
            return fname
        parts = fname.strip("/").split("/")
        for i in range(len(parts)):
            tail = os.path.join(*parts[i:])
            if os.path.exists(os.path.join(self.root, tail)):
                return tail
        return os.path.relpath(fname, self.root)

    def __call__(self, fname, line):
        rel = self.relative(fname)
        base = os.path.basename(fname)
        if base == "ws_sm90.cuh":  # the lambdas of ws_consume, by their lines
            for name, (a, b) in ws_consume_lambdas(os.path.join(self.root, rel)).items():
                if a <= line <= b:
                    return name
        if rel not in self.tags:
            self.tags[rel] = []
            if os.path.exists(os.path.join(self.root, rel)):
                out = subprocess.run(["ctags", "--fields=+ne", "--language-force=c++", "-o", "-",
                                      rel], capture_output=True, text=True, cwd=self.root).stdout
                for t in out.splitlines():
                    m = re.search(r"\tline:(\d+).*\tend:(\d+)", t)
                    if m and re.search(r"\tf(\t|$)", t):
                        self.tags[rel].append((int(m.group(1)), int(m.group(2)), t.split("\t")[0]))
        best = None
        for a, b, n in self.tags[rel]:
            if a <= line <= b and (best is None or a >= best[0]):
                best = (a, b, n)
        return best[2] if best else None


_lambdas = {}


def ws_consume_lambdas(path):
    """Line ranges of ws_consume's fold, release and step lambdas (auto NAME = [&](...) { ... };)."""
    if path not in _lambdas:
        rng, lines = {}, open(path).read().split("\n")
        for i, t in enumerate(lines):
            m = re.match(r"\s*auto (fold|release|step) = \[&\]", t)
            if m:
                depth, j = 0, i
                while j < len(lines):
                    depth += lines[j].count("{") - lines[j].count("}")
                    if depth == 0 and "}" in lines[j]:
                        break
                    j += 1
                rng["lambda " + m.group(1)] = (i + 1, j + 1)
        _lambdas[path] = rng
    return _lambdas[path]


def branch_target(sass):
    m = re.search(r"BRA(?:\.[A-Z.]+)?\s+(?:\S+,\s*)?0x([0-9a-f]+)", sass)
    return int(m.group(1), 16) if m else None


def regions(rows):
    """Address-based region of every instruction: setup, start, loop, end, producer."""
    idx = {e["addr"]: i for i, e in enumerate(rows)}
    back = []
    for i, e in enumerate(rows):
        t = branch_target(e["sass"])
        if t is not None and t in idx and idx[t] <= i:
            back.append((idx[t], i))
    hg = [i for i, e in enumerate(rows) if "HGMMA" in e["sass"]]
    loops = [(a, b) for a, b in back if any(a <= h <= b for h in hg)]
    if not loops:
        sys.exit("ncu_regions: no backward branch around an HGMMA: not a Hopper wgmma kernel?")
    la, lb = min(loops, key=lambda r: r[1] - r[0])
    outer = [(a, b) for a, b in back if a < la and b > lb]
    if outer:
        oa, ob = min(outer, key=lambda r: r[1] - r[0])
    else:  # one block per CTA (variants 6-9): the consumers' code ends at the EXIT after the loop
        oa = 0
        ob = next(i for i in range(lb, len(rows)) if "EXIT" in rows[i]["sass"]) - 1
    # the out-of-line try-wait loops: a short backward branch, then BRA back into the body
    stub_start = min((a for a, i in back if i - a <= 2 and a > ob), default=len(rows))
    reg = []
    for i in range(len(rows)):
        if i < oa:
            reg.append("setup")
        elif i < la:
            reg.append("start")
        elif i <= lb:
            reg.append("loop")
        elif i <= ob + 1:
            reg.append("end")
        elif i < stub_start:
            reg.append("producer")
        else:
            reg.append(None)
    # each stub: the region of the body instruction its last branch goes back to
    i = stub_start
    while i < len(rows):
        j = i
        while j < len(rows) and not (branch_target(rows[j]["sass"]) is not None and
                                     idx.get(branch_target(rows[j]["sass"]), j) < stub_start):
            j += 1
        r = reg[idx[branch_target(rows[j]["sass"])]] if j < len(rows) else "other"
        for k in range(i, min(j + 1, len(rows))):
            reg[k] = r + " (wait)" if r in ("start", "loop") else r
        i = j + 1
    return reg, (oa, la, lb, ob)


def label(rows, reg, funcs):
    """Region and function group per instruction; helpers without a group take the one before."""
    out, prev = [], {}
    for e, r in zip(rows, reg):
        names = [funcs(f, ln) for f, ln in e["where"]]
        groups = [GROUP_OF.get(n) for n in names if n]
        lam = [n for n in names if n and n.startswith("lambda ")]
        base = r.split(" ")[0]
        if r.endswith("(wait)"):
            g = "waits"
        elif "lambda fold" in lam or "fold" in groups:
            g = "fold"
        elif lam and base == "loop":
            g = "wgmma" if "lambda step" in lam else "waits"
        elif [x for x in groups if x]:
            g = [x for x in groups if x][0]
        else:
            g = prev.get(base, "other")
        if base == "loop" and g not in ("fold", "waits"):
            g = "wgmma"
        prev[base] = g
        out.append((base, g))
    return out


NAMES = {
    ("setup", None): "setup (both roles)",
    ("start", "item"): "block start: item, sequence, part init",
    ("start", "waits"): "block start: waits for the rows and Q (info_full, q_full)",
    ("start", "ranges"): "block start: the rows' key ranges",
    ("start", "Q"): "block start: Q fragments (ldmatrix)",
    ("loop", "wgmma"): "tile loop: wgmma issue, descriptors, waits for the tensor cores",
    ("loop", "waits"): "tile loop: K tile waits and releases (mbarrier)",
    ("loop", "fold"): "tile loop: the fold",
    ("end", "fold"): "block end: the last tile's fold",
    ("end", "rows' ends"): "block end: the rows' ends (quad merges, row_done)",
    ("end", "part"): "block end: the part's butterfly and store",
    ("producer", None): "producer warpgroup (preparation and K tiles)",
}


def name_of(base, g):
    if base in ("setup", "producer"):
        return NAMES[(base, None)]
    if base == "other":
        return "out-of-line code (subroutines)"
    return NAMES.get((base, g), f"{'block ' if base in ('start', 'end') else ''}{base}: {g}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("csv")
    ap.add_argument("--root", default=os.path.dirname(HERE))
    ap.add_argument("--markdown", action="store_true")
    a = ap.parse_args()
    rows = load(a.csv)
    reg, bounds = regions(rows)
    lab = label(rows, reg, Functions(os.path.abspath(a.root)))
    agg = collections.OrderedDict()
    order = ["setup", "start", "loop", "end", "producer", "other"]
    for e, (base, g) in sorted(zip(rows, lab), key=lambda x: order.index(x[1][0])):
        k = name_of(base, g)
        s = agg.setdefault(k, dict(inst=0, samples=0, stalls=collections.Counter(), n=0, base=base))
        s["inst"] += e["inst"]
        s["samples"] += e["samples"]
        s["stalls"].update(e["stalls"])
        s["n"] += 1
    ti = sum(s["inst"] for s in agg.values())
    cs = sum(s["samples"] for s in agg.values() if s["base"] in ("start", "loop", "end"))
    ts = sum(s["samples"] for s in agg.values())
    print(f"{len(rows)} SASS instructions; tile loop at {bounds[1]}-{bounds[2]}, block loop "
          f"{bounds[0]}-{bounds[3]} (instruction indices); {ti / 1e6:.1f} M warp instructions "
          f"executed, {ts} samples ({cs} in the consumers' code)")
    if a.markdown:
        print("\n| region | instr. (M) | share | SASS | samples | of consumers' | top stalls |")
        print("|---|---:|---:|---:|---:|---:|---|")
    for k, s in agg.items():
        tot = sum(s["stalls"].values()) or 1
        top = ", ".join(f"{n} {100 * v / tot:.0f}%" for n, v in s["stalls"].most_common(3) if v)
        share = f"{100 * s['samples'] / cs:.1f}%" if s["base"] in ("start", "loop", "end") else "-"
        if a.markdown:
            print(f"| {k} | {s['inst'] / 1e6:.2f} | {100 * s['inst'] / ti:.1f}% | {s['n']} | "
                  f"{s['samples']} | {share} | {top} |")
        else:
            print(f"{k:66s} {s['inst'] / 1e6:7.2f} M {100 * s['inst'] / ti:5.1f}% {s['n']:5d} "
                  f"{s['samples']:6d} {share:>6s}  {top}")


if __name__ == "__main__":
    main()
