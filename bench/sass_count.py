#!/usr/bin/env python3
"""sass_count.py — counts the machine instructions (SASS) that the Hopper statistics kernels spend
per logit in their steady state, without a GPU: compiles kernels/cuda/wgf_sm90.cu (variants 1-3)
and wgmma_sm90.cu (variant 0) for sm_90a, disassembles them with nvdisasm, finds each kernel's
key-tile loop (the backward branch around the wgmma), enumerates the paths through one iteration
of it (two 64-key tiles: the loop is unrolled by two), and prints per path class and per logit:

  MUFU.EX2, other MUFU, FMNMX, FFMA, FADD, FMUL, FSEL/FSETP, conversions, shuffles, integer and
  address arithmetic, predicates (ISETP ...), uniform datapath, constant loads, shared and global
  memory, wgmma, synchronisation, branches, never-executed fillers (@!PT)

against the floor of the fold, 5 per logit (max, FFMA for u, ex2, FADD for l, FFMA for W).
"Per logit" is per thread: a warp instruction handles one logit per lane, so it is also warp
instructions per 32 logits. Logits per iteration come from the code: 64x64 per HGMMA group over
128 threads = 32 per thread per tile, times the tiles issued on the path (WARPGROUP.ARRIVE).

The path classes of one iteration (both steps issue their wgmma and load their next K tile):
  full       both tiles folded unmasked, no softcap (the common case: every tile off the diagonal)
  masked     both tiles folded with the per-key visibility test (causal diagonal, windows, masks)
  cap full   both with softcap, unmasked;  cap masked: both with softcap and the test
The unmasked and masked folds are told apart by count (the masked one is the longer of the paths
with the same MUFU counts), softcap by its MUFU.RCP (tanh_fast's division).

  bench/sass_count.py [--base REV] [--only NAME] [--paths] [--keep DIR] [--cubin FILE ...]
    --base REV   also count the kernels of git revision REV and print both (before -> after)
    --only NAME  kernels whose label contains NAME (labels: "v2 d128 bf16", "v2 d128 bf16 f32in")
    --paths      print every distinct path signature of each loop, not only the classes
    --cubin F    count these cubins instead of compiling (sm_90a, any CUDA 12/13 nvcc)
  NVCC (default nvcc on PATH or /usr/local/cuda/bin/nvcc) and NVDISASM (default nvdisasm on
  PATH, /usr/local/cuda/bin/nvdisasm) in the environment. Run from the repository root; about
  40 s per .cu and tree on one core (the two files compile in parallel).

nvdisasm: the CUDA toolkit's own. An older one (Debian's nvidia-cuda-toolkit 11.8, non-free:
`apt-get download nvidia-cuda-toolkit && dpkg -x nvidia-cuda-toolkit_*.deb DIR`, then
NVDISASM=DIR/usr/bin/nvdisasm; where the machine's sources list main alone, give apt-get a list of
its own with `-o Dir::Etc::sourcelist=F -o Dir::Etc::sourceparts=- -o Dir::State::Lists=D`, F
naming "bookworm non-free", an update first) decodes sm_90a code, HGMMA included, but refuses the ELF header
that CUDA 13 writes ("does not contain Cuda architecture information"); this script then gives it
a copy of the cubin whose header says the same architecture in the older layout (OS/ABI 0x33,
ABI version 7, EF_CUDA_SM90 | 64-bit | virtual SM90). The code bytes are not touched.

Plain Python 3. Stage: a development tool of kernels/ (bench/kernel_notes.md, round 6); touches
nothing but a temporary directory (kept with --keep)."""
import argparse
import collections
import concurrent.futures
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile

ROOT = os.getcwd()
NVCC = os.environ.get("NVCC") or shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"
SOURCES = ("wgf_sm90.cu", "wgmma_sm90.cu")
FLOOR = 5.0

# ---- building and disassembling ------------------------------------------------------------------


def export_tree(rev, dest):
    """kernels/ of git revision rev (None: the work tree) under dest."""
    os.makedirs(dest, exist_ok=True)
    if rev is None:
        shutil.copytree(os.path.join(ROOT, "kernels"), os.path.join(dest, "kernels"))
        return
    tar = subprocess.run(["git", "archive", rev, "kernels"], cwd=ROOT, check=True,
                         capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", dest], input=tar, check=True)


def compile_tree(tree):
    """sm_90a cubins of SOURCES in tree/kernels/cuda, with the flags of the CMake build."""
    kdir = os.path.join(tree, "kernels")

    def one(name):
        src = os.path.join(kdir, "cuda", name)
        out = os.path.join(tree, os.path.splitext(name)[0] + ".cubin")
        cmd = [NVCC, "-D_GNU_SOURCE", "-I" + kdir, "-O2", "-DNDEBUG", "-std=c++17",
               "-gencode=arch=compute_90a,code=sm_90a", "-Xptxas=-warn-spills", "-cubin",
               "-x", "cu", src, "-o", out]
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            sys.exit(f"sass_count: {' '.join(cmd)}\n{r.stdout}{r.stderr}")
        return out

    with concurrent.futures.ThreadPoolExecutor(2) as ex:
        return list(ex.map(one, SOURCES))


def find_nvdisasm():
    for cand in (os.environ.get("NVDISASM"), shutil.which("nvdisasm"),
                 "/usr/local/cuda/bin/nvdisasm"):
        if cand and os.path.exists(cand):
            return cand
    sys.exit("sass_count: no nvdisasm (set NVDISASM; the module docstring says where to get one)")


def old_header_copy(cubin, dest):
    """A copy of cubin with the pre-CUDA-13 ELF header layout, for an older nvdisasm."""
    b = bytearray(open(cubin, "rb").read())
    (flags,) = struct.unpack_from("<I", b, 48)
    sm = (flags >> 8) & 0xFF  # CUDA 13: the SM number in bits 8-15 (0x5a = 90)
    if b[8] != 8 or sm < 50:
        sys.exit(f"sass_count: {cubin}: unknown ELF header (ABI {b[8]}, flags {flags:#x})")
    b[7], b[8] = 0x33, 7
    struct.pack_into("<I", b, 48, (sm << 16) | 0x500 | sm)  # virtual SM, 64-bit, unified tex, SM
    open(dest, "wb").write(b)
    return dest


def disassemble(cubin, tmp):
    """{function: [text lines]} of every kernel in cubin."""
    tool = find_nvdisasm()
    r = subprocess.run([tool, "-c", cubin], capture_output=True, text=True)
    if r.returncode != 0 and "architecture information" in r.stderr:
        patched = old_header_copy(cubin, os.path.join(tmp, os.path.basename(cubin) + ".old"))
        r = subprocess.run([tool, "-c", patched], capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"sass_count: {tool} {cubin}: {r.stderr.strip()}")
    funcs, cur = {}, None
    for line in r.stdout.splitlines():
        m = re.match(r"//-+ \.text\.(\S+) -+", line)
        if m:
            cur = funcs.setdefault(m.group(1), [])
        elif cur is not None:
            cur.append(line)
    return funcs


def label_of(mangled):
    """A short label for a kernel instance: 'v2 d128 bf16', 'v0 d64 f16', 'v2 d128 bf16 f32in'."""
    m = re.match(r"_Z\d+(\w+?)I(.*)E(v7kparams|v)", mangled)
    if not m:
        return None
    name, args = m.group(1), re.findall(r"L([ib])(\d+)E", m.group(2))
    vals = [int(v) for _, v in args]
    if name == "stats_wgf_kernel" and len(vals) == 5:
        dp, f16, sw, mb, cvt = vals
        v = 3 if mb else (2 if sw else 1)
        return f"v{v} d{dp} {'f16' if f16 else 'bf16'}" + (" f32in" if cvt else "")
    if name == "stats_wgmma_kernel" and len(vals) == 6:
        dp, f16, nwg, bn, ss, poly = vals
        return f"v0 d{dp} {'f16' if f16 else 'bf16'}"
    return None


# ---- the control-flow graph of one function ------------------------------------------------------

INSN = re.compile(r"^\s*/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;")
TARGET = re.compile(r"`\((\.L_\w+)\)")


class Insn:
    def __init__(self, addr, text):
        self.addr = addr
        m = re.match(r"(@!?U?P(?:T|\d+))\s+(.*)", text)
        self.pred, rest = (m.group(1), m.group(2)) if m else (None, text)
        parts = rest.split(None, 1)
        self.op = parts[0]
        self.args = parts[1] if len(parts) > 1 else ""
        t = TARGET.search(self.args)
        self.target = t.group(1) if t else None

    def is_branch(self):
        return self.op.split(".")[0] in ("BRA", "BRX", "JMP", "EXIT", "RET", "BPT")

    def conditional(self):
        if self.pred not in (None, "@PT"):
            return True
        base = self.op.split(".")[0]
        # BRA.DIV, BRA with a predicate operand (`BRA P1, target`) fall through too
        return self.op != base or bool(re.match(r"!?U?P\d", self.args))


def parse(lines):
    insns, labels, pending = [], {}, []
    for line in lines:
        s = line.strip()
        m = re.match(r"^(\.L_\w+):", s)
        if m:
            pending.append(m.group(1))
            continue
        m = INSN.match(line)
        if m:
            for lab in pending:
                labels[lab] = len(insns)
            pending = []
            insns.append(Insn(int(m.group(1), 16), m.group(2)))
    for lab in pending:
        labels[lab] = len(insns)
    return insns, labels


def blocks_of(insns, labels):
    """[(start, end, [successor block indices])], blocks in address order."""
    leaders = {0} | set(labels.values())
    for i, ins in enumerate(insns):
        if ins.is_branch():
            leaders.add(i + 1)
    starts = sorted(x for x in leaders if x < len(insns))
    index = {s: k for k, s in enumerate(starts)}
    blocks = []
    for k, s in enumerate(starts):
        e = starts[k + 1] if k + 1 < len(starts) else len(insns)
        last = insns[e - 1]
        succ = []
        if last.is_branch():
            if last.target is not None and labels.get(last.target) in index:
                succ.append(index[labels[last.target]])
            if last.conditional() and e < len(insns):
                succ.append(index[e])
        elif e < len(insns):
            succ.append(index[e])
        blocks.append((s, e, succ))
    return blocks


# ---- classes ---------------------------------------------------------------------------------

CLASSES = [
    ("ex2", "MUFU.EX2"), ("mufu", "other MUFU"), ("fmnmx", "FMNMX"), ("ffma", "FFMA"),
    ("fadd", "FADD"), ("fmul", "FMUL"), ("fsel", "FSEL/FSETP"), ("cvt", "conversions"),
    ("shfl", "shuffles"), ("int", "integer/address"), ("pred", "predicates"),
    ("uni", "uniform datapath"), ("const", "constant loads"), ("smem", "shared memory"),
    ("gmem", "global memory"), ("mma", "wgmma"), ("sync", "sync/barriers"),
    ("bra", "branches"), ("nop", "@!PT fillers"), ("other", "other"),
]
FOLD_FP = ("ex2", "mufu", "fmnmx", "ffma", "fadd", "fmul", "fsel")


def classify(ins):
    op, base = ins.op, ins.op.split(".")[0]
    if ins.pred == "@!PT":
        return "nop"
    if op.startswith("MUFU.EX2"):
        return "ex2"
    if base == "MUFU":
        return "mufu"
    table = {
        "FMNMX": "fmnmx", "FFMA": "ffma", "FADD": "fadd", "FMUL": "fmul", "FSEL": "fsel",
        "FSETP": "fsel", "FCHK": "fsel", "FSET": "fsel", "F2F": "cvt", "F2I": "cvt",
        "I2F": "cvt", "F2FP": "cvt", "FRND": "cvt", "I2FP": "cvt", "F2IP": "cvt",
        "SHFL": "shfl", "ISETP": "pred", "PLOP3": "pred", "P2R": "pred", "R2P": "pred",
        "VOTE": "pred", "LDC": "const", "ULDC": "const", "LDS": "smem", "STS": "smem",
        "LDSM": "smem", "ATOMS": "smem", "LDG": "gmem", "STG": "gmem", "LDGSTS": "gmem",
        "LDGDEPBAR": "gmem", "RED": "gmem", "ATOMG": "gmem", "ATOM": "gmem", "LD": "gmem",
        "ST": "gmem", "HGMMA": "mma", "HMMA": "mma", "BAR": "sync", "DEPBAR": "sync",
        "MEMBAR": "sync", "FENCE": "sync", "WARPGROUP": "sync", "WARPSYNC": "sync",
        "BSSY": "sync", "BSYNC": "sync", "SYNCS": "sync", "NANOSLEEP": "sync",
        "ERRBAR": "sync", "CCTL": "sync", "BRA": "bra", "EXIT": "bra", "CALL": "bra",
        "RET": "bra", "BRX": "bra", "JMP": "bra", "NOP": "nop",
    }
    if base in table:
        return table[base]
    if base in ("R2UR", "S2UR", "REDUX") or base.startswith("U") or base == "VOTEU":
        return "uni"
    if base in ("IADD3", "IMAD", "LEA", "LOP3", "SHF", "SEL", "MOV", "PRMT", "IABS", "IMNMX",
                "POPC", "FLO", "BMSK", "S2R", "CS2R", "IADD", "SGXT", "BREV", "IDP", "IMUL",
                "MOV32I", "LOP", "SHL", "SHR", "BFE", "BFI", "LEPC", "IMNMX"):
        return "int"
    return "other"


# ---- the loop and its paths ------------------------------------------------------------------


def loop_paths(insns, labels, limit=20000):
    """For each loop around a wgmma: (head block, back-edge block, {signature: paths}), where a
    signature is a tuple of (class, count) over one iteration's path, head to back edge."""
    blocks = blocks_of(insns, labels)
    found = []
    for b, (s, e, succ) in enumerate(blocks):
        for h in succ:
            if h <= b and any(insns[i].op.startswith("HGMMA") or insns[i].op.startswith("HMMA")
                              for i in range(blocks[h][0], e)):
                found.append((h, b))
    if not found:
        return []
    # the innermost such loop: ptxas also makes outer ones (a warp-synchronous retry at the end
    # of the function that jumps back before the key-tile loop)
    h, back = min(found, key=lambda x: blocks[x[1]][1] - blocks[x[0]][0])
    counts = [collections.Counter(classify(insns[i]) for i in range(s, e)) for s, e, _ in blocks]
    for k, (s, e, _) in enumerate(blocks):
        counts[k]["_arrive"] = sum(insns[i].op == "WARPGROUP.ARRIVE" for i in range(s, e))
        counts[k]["_ld16"] = sum(bool(re.match(r"(LDGSTS|LDG)\..*128", insns[i].op))
                                 and insns[i].pred != "@!PT" for i in range(s, e))
    # Paths from each block to the back edge over forward edges inside [h, back], kept per key
    # (tiles issued, 16-byte K loads, MUFU other than EX2 or not, MUFU.EX2): the number of paths
    # and the shortest and longest one's counts. (The float32-input kernel has a branch per
    # element of a short chunk; all its paths would be too many to list.)
    def key(c):
        return (c["_arrive"], c["_ld16"], c["mufu"] > 0, c["ex2"])

    def total(c):
        return sum(v for k, v in c.items() if not k.startswith("_"))

    memo = {}
    for k in range(back, h - 1, -1):
        if k == back:
            memo[k] = {key(counts[k]): [counts[k], counts[k], 1]}
            continue
        acc = {}
        for nxt in blocks[k][2]:
            if not k < nxt <= back:
                continue
            for lo, hi, n in memo[nxt].values():
                lo, hi = lo + counts[k], hi + counts[k]
                cur = acc.get(key(lo))
                if cur is None:
                    acc[key(lo)] = [lo, hi, n]
                else:
                    if total(lo) < total(cur[0]):
                        cur[0] = lo
                    if total(hi) > total(cur[1]):
                        cur[1] = hi
                    cur[2] += n
        memo[k] = acc
    return [(h, back, memo[h])]


def tile_logits(insns):
    """Logits per thread per tile: M x N of the HGMMA shape over the warpgroup's 128 threads."""
    for ins in insns:
        m = re.match(r"HGMMA\.(\d+)x(\d+)x\d+", ins.op)
        if m:
            return int(m.group(1)) * int(m.group(2)) // 128
    return None


def path_classes(paths, per_tile):
    """The named steady-state paths: among the paths that issue the most tiles and the most
    16-byte K loads (both steps load a whole tile), by softcap (a MUFU other than EX2: tanh_fast's
    division) and, with the most MUFU.EX2 (every tile folded), the shortest (full) and the longest
    (masked)."""
    if not paths:
        return {}
    most = max(k[:2] for k in paths)
    out = {}
    for cap in (False, True):
        sel = [k for k in paths if k[:2] == most and k[2] == cap]
        if not sel:
            continue
        lo, hi, n = paths[max(sel, key=lambda k: k[3])]
        pre = "cap " if cap else ""
        out[pre + "full"] = lo
        if hi is not lo and sum(hi.values()) != sum(lo.values()):
            out[pre + "masked"] = hi
    return {k: (v, most[0] * per_tile) for k, v in out.items()}


def count_tree(cubins, tmp, only):
    """{(label, class): (counter, logits)} for every known kernel in cubins; also the raw loops."""
    res, raw = {}, {}
    for cubin in cubins:
        for fn, lines in sorted(disassemble(cubin, tmp).items()):
            lab = label_of(fn)
            if lab is None or (only and only not in lab):
                continue
            insns, labels = parse(lines)
            loops = loop_paths(insns, labels)
            if not loops:
                print(f"sass_count: {lab}: no loop around a wgmma")
                continue
            per_tile = tile_logits(insns)
            h, back, paths = loops[0]
            raw[lab] = (paths, per_tile, len(insns))
            for cls, (c, logits) in path_classes(paths, per_tile).items():
                res[(lab, cls)] = (c, logits)
    return res, raw


# ---- printing --------------------------------------------------------------------------------


def fmt_row(c, logits):
    tot = sum(v for k, v in c.items() if not k.startswith("_"))
    fold = sum(c.get(k, 0) for k in FOLD_FP)
    return tot, fold, logits


def merge_dtypes(res):
    """One row for bf16 and f16 where their counts are the same (the usual case)."""
    out = dict(res)
    for (lab, cls), v in res.items():
        if " bf16" in lab:
            other = (lab.replace(" bf16", " f16"), cls)
            if other in out and out[other] == v:
                del out[other], out[(lab, cls)]
                out[(lab.replace(" bf16", " bf16=f16"), cls)] = v
    return out


def print_table(res, base=None):
    res = merge_dtypes(res)
    base = merge_dtypes(base) if base else None
    keys = sorted(res, key=lambda k: (k[0], ["full", "masked", "cap full", "cap masked"].index(k[1])
                                      if k[1] in ("full", "masked", "cap full", "cap masked") else 9))
    print("Per logit (per thread) in one steady-state iteration of the key-tile loop; floor of the "
          f"fold {FLOOR:.0f} (FMNMX, FFMA, MUFU.EX2, FADD, FFMA).")
    head = ["kernel", "path", "logits", "total/logit", "fold FP/logit"]
    print("| " + " | ".join(head) + " | " + " | ".join(n for _, n in CLASSES if _ != "other") + " |")
    print("|" + "---|" * (len(head) + len(CLASSES) - 1))
    for k in keys:
        c, logits = res[k]
        tot, fold, _ = fmt_row(c, logits)

        def cell(val, bval):
            s = f"{val / logits:.3f}"
            if bval is not None and bval != val:
                s = f"{bval / logits:.3f} -> {s}"
            return s
        b = base.get(k) if base else None
        bc = b[0] if b else None
        btot, bfold = (fmt_row(bc, logits)[:2]) if bc else (None, None)
        cells = [k[0], k[1], str(logits), cell(tot, btot), cell(fold, bfold)]
        for cls, _ in CLASSES:
            if cls == "other":
                continue
            cells.append(cell(c.get(cls, 0), bc.get(cls, 0) if bc else None))
        print("| " + " | ".join(cells) + " |")
    others = {k: v[0].get("other", 0) for k, v in res.items() if v[0].get("other", 0)}
    if others:
        print("unclassified instructions:", others)


def print_paths(raw):
    for lab, (paths, per_tile, n) in sorted(raw.items()):
        print(f"\n{lab}: {n} instructions in the function, {sum(v[2] for v in paths.values())} "
              f"paths through one iteration, {per_tile} logits per thread per tile")
        for k, (lo, hi, npaths) in sorted(paths.items(), reverse=True):
            for what, c in (("shortest", lo), ("longest", hi)):
                c = {a: b for a, b in c.items() if b and not a.startswith("_")}
                tot = sum(c.values())
                print(f"  tiles {k[0]}, 16-byte loads {k[1]}, softcap {int(k[2])}, ex2 {k[3]}: "
                      f"{npaths} path(s), {what} {tot}:", ", ".join(f"{a} {b}" for a, b in
                                                                   sorted(c.items())))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base")
    ap.add_argument("--only")
    ap.add_argument("--paths", action="store_true")
    ap.add_argument("--keep")
    ap.add_argument("--cubin", nargs="*")
    a = ap.parse_args()
    tmp = a.keep or tempfile.mkdtemp(prefix="sass_count.")
    os.makedirs(tmp, exist_ok=True)
    try:
        if a.cubin:
            cubins = a.cubin
        else:
            export_tree(None, os.path.join(tmp, "head"))
            cubins = compile_tree(os.path.join(tmp, "head"))
        res, raw = count_tree(cubins, tmp, a.only)
        base = None
        if a.base:
            export_tree(a.base, os.path.join(tmp, "base"))
            base, _ = count_tree(compile_tree(os.path.join(tmp, "base")), tmp, a.only)
            print(f"before ({a.base}) -> after (work tree) where they differ")
        print_table(res, base)
        if a.paths:
            print_paths(raw)
    finally:
        if not a.keep:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
