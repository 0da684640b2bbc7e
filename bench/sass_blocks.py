#!/usr/bin/env python3
"""sass_blocks.py — the fold paths of the warp-specialised statistics kernels (variants 6-12,
kernels/cuda/ws_sm90*.cu) by SASS basic block, without a GPU: compiles one of those files for
sm_90a (or takes a cubin), disassembles it with nvdisasm (bench/sass_count.py's, which says where
an nvdisasm that reads CUDA 13's cubins comes from), and for each kernel whose mangled name matches
prints the basic blocks (split at the disassembly's labels) that hold a fold: those with at least
--min FMNMX or MUFU, with their instruction count, how many of their FP instructions read two
register sources of the same parity ("same bank": one of two register banks, round 32), and the
opcodes that make them up.

A fold path's count per tile and thread is what bench/kernel_notes.md's rounds 26-28 compare
(the unmasked and masked folds, with and without softcap, appear once per loop copy: the
shortest block with the fold's FMNMX count is the unmasked one). A count, not a measurement.

  bench/sass_blocks.py FILE.cu|FILE.cubin REGEX [--min 20] [--base REV]
    REGEX   kernels whose mangled name matches (e.g.
            'stats_wsp_kernelILi64ELb0ELi0ELi2ELi128ELi2ELi1E': variant 10, d64, bf16, FOLD_MAX;
            the template's arguments in order DP, F16, POLY, NCW, BN, FW (0 statistics, 1
            sink/distance, 2 max logit alone), QB)
    --base  also the same file at git revision REV, its blocks printed first
  NVCC and NVDISASM as for bench/sass_count.py. Run from the repository root.
"""
import argparse
import collections
import os
import re
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import sass_count as sc  # noqa: E402

INSN = re.compile(r"\s+/\*[0-9a-f]{4}\*/\s+(?:@!?U?P\w+\s+)?([A-Z0-9_]+)")


def cubin_of(path, tmp, rev=None):
    """path itself when it is a cubin, else path (at git revision rev) compiled for sm_90a."""
    if path.endswith(".cubin"):
        return path
    root = os.getcwd()
    if rev:
        root = os.path.join(tmp, rev)
        sc.export_tree(rev, root)  # kernels/ alone: all that ws_sm90*.cu include
    out = os.path.join(tmp, (rev or "work") + "-" + os.path.basename(path) + ".cubin")
    cmd = [sc.NVCC, "-D_GNU_SOURCE", "-I" + os.path.join(root, "kernels"),
           "-I" + os.path.join(root, "include"), "-I" + os.path.join(root, "vocab"), "-O3",
           "-DNDEBUG", "-std=c++17", "-gencode=arch=compute_90a,code=sm_90a", "-cubin",
           os.path.join(root, path), "-o", out]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"sass_blocks: nvcc failed on {path}{' at ' + rev if rev else ''}:\n{r.stderr}")
    return out


FP_SOURCES = re.compile(r"\s(FMNMX|FADD|FMUL|FFMA)\S*\s+R\d+,\s*([^;]*);")


def same_bank(line):
    """True where an FP instruction reads two of its register sources from registers of the same
    parity: one register bank of two, by the reading of round 32 (bench/kernel_notes.md; the reuse
    cache, which spares a read, is not modelled)."""
    m = FP_SOURCES.search(line)
    if not m:
        return False
    regs = [int(a[1:]) for a in (x.strip().strip("-|") for x in m.group(2).split(","))
            if re.fullmatch(r"R\d+", a)]
    return len({r % 2 for r in regs}) < len(regs)


def blocks(lines):
    """[(label, [opcodes], same-bank reads)] of one function, split at its labels."""
    out, name, cur, nb = [], "entry", [], 0
    for line in lines:
        m = re.match(r"^(\.L_x_\d+):", line)
        if m:
            out.append((name, cur, nb))
            name, cur, nb = m.group(1), [], 0
            continue
        m = INSN.match(line)
        if m:
            cur.append(m.group(1))
            nb += same_bank(line)
    out.append((name, cur, nb))
    return out


def report(funcs, regex, least):
    for fn in sorted(f for f in funcs if re.search(regex, f)):
        print(fn)
        for label, ops, nb in blocks(funcs[fn]):
            c = collections.Counter(ops)
            if c["FMNMX"] >= least or c["MUFU"] >= least:
                top = ", ".join(f"{op} {n}" for op, n in c.most_common(8))
                print(f"  {label:12s} {len(ops):4d}  same bank {nb:3d}  {top}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("file")
    ap.add_argument("regex")
    ap.add_argument("--min", type=int, default=20)
    ap.add_argument("--base")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        for rev in ([a.base] if a.base else []) + [None]:
            print(f"== {a.file} at {rev or 'the work tree'}")
            report(sc.disassemble(cubin_of(a.file, tmp, rev), tmp), a.regex, a.min)


if __name__ == "__main__":
    main()
