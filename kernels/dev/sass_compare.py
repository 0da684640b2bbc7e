#!/usr/bin/env python3
"""sass_compare.py — proves that a change to kernels/ left the machine code of every kernel as it
was, without a GPU: compiles the CUDA sources of two revisions with the flags of kernels/cuda.cmake
(nvcc --keep, -Xptxas=-v), then compares kernel by kernel, for each architecture:
  code      the bytes of the kernel's .text section in the cubin (its SASS, byte for byte), and its
            relocations; with cuobjdump on PATH also the text of `cuobjdump -sass`, per function
  info      the kernel's .nv.info attributes (registers, stack, parameters, barriers ...) and its
            static shared memory and parameter bank sizes
  ptxas     the -Xptxas=-v report (registers, spills, stack, shared memory)
  ptx       the compute_80 PTX of each entry (what newer GPUs JIT), with the names nvcc makes from
            the file name of a translation unit (_INTERNAL_<hash>_...) normalised
It prints one line per kernel and architecture and exits 1 on any difference.

  kernels/dev/sass_compare.py BASE [HEAD]
    BASE, HEAD: git revisions (HEAD defaults to the work tree). Run from the repository root.
    NVCC (default /usr/local/cuda/bin/nvcc or nvcc on PATH), JOBS (default 2) in the environment.

Plain Python 3 and binutils-free: the cubins are read as ELF here. Stage: a development tool of
kernels/; touches nothing but a temporary directory (kept with --keep-tmp)."""
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


def gencode_flags(tree):
    text = open(os.path.join(tree, "kernels", "cuda.cmake")).read()
    flags = re.findall(r'"(-gencode=[^"]+)"', text)
    if not flags:
        sys.exit("sass_compare: no -gencode flags found in kernels/cuda.cmake")
    return flags


def export_tree(rev, dest):
    """The kernels/ folder of rev (None: the work tree) under dest."""
    os.makedirs(dest)
    if rev is None:
        shutil.copytree(os.path.join(ROOT, "kernels"), os.path.join(dest, "kernels"))
        return
    tar = subprocess.run(["git", "archive", rev, "kernels"], cwd=ROOT, check=True,
                         capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", dest], input=tar, check=True)


def compile_tree(tree, gencode, jobs):
    """nvcc --keep every CUDA source of tree/kernels (not dev/); returns {source: ptxas log}."""
    kdir = os.path.join(tree, "kernels")
    sources = []
    for sub in ("", "cuda"):
        d = os.path.join(kdir, sub)
        if os.path.isdir(d):
            sources += [os.path.join(d, f) for f in sorted(os.listdir(d)) if f.endswith(".cu")]
    if not sources:
        sys.exit(f"sass_compare: no .cu under {kdir}")

    def one(src):
        name = os.path.splitext(os.path.basename(src))[0]
        keep = os.path.join(tree, "keep", name)
        os.makedirs(keep)
        cmd = [NVCC, "-D_GNU_SOURCE", "-I" + kdir, "-O2", "-g", "-DNDEBUG", "-Xcompiler=-fPIC",
               *gencode, "-Xptxas=-warn-spills", "-Xcompiler=-Wall,-Wextra",
               "-Werror=all-warnings", "-std=c++17", "-Xptxas=-v", "--keep", "--keep-dir", keep,
               "-x", "cu", "-c", src, "-o", os.path.join(keep, name + ".o")]
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            sys.exit(f"sass_compare: {' '.join(cmd)}\n{r.stdout}{r.stderr}")
        return src, r.stdout + r.stderr

    with concurrent.futures.ThreadPoolExecutor(jobs) as ex:
        return dict(ex.map(one, sources))


# ---- cubin (ELF64) -------------------------------------------------------------------------------

def read_elf(path):
    data = open(path, "rb").read()
    if data[:4] != b"\x7fELF" or data[4] != 2:
        sys.exit(f"sass_compare: {path} is not a 64-bit ELF file")
    (shoff,) = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    secs = []
    for i in range(shnum):
        name, typ, flags, addr, off, size, link, info, align, entsize = struct.unpack_from(
            "<IIQQQQIIQQ", data, shoff + i * shentsize)
        secs.append(dict(name_off=name, type=typ, off=off, size=size, link=link, info=info,
                         entsize=entsize))
    strtab = secs[shstrndx]

    def cstr(sec, off):
        start = sec["off"] + off
        return data[start:data.index(b"\0", start)].decode()

    for s in secs:
        s["name"] = cstr(strtab, s["name_off"])
        s["bytes"] = data[s["off"]:s["off"] + s["size"]] if s["type"] != 8 else b""  # 8: NOBITS
    symtab = next(s for s in secs if s["type"] == 2)
    syms = []
    for i in range(symtab["size"] // 24):
        name, info, other, shndx, value, size = struct.unpack_from("<IBBHQQ", data,
                                                                   symtab["off"] + 24 * i)
        sname = cstr(secs[symtab["link"]], name)
        if not sname and shndx < len(secs):
            sname = secs[shndx]["name"]  # a section symbol: named after its section
        syms.append(sname)
    (flags,) = struct.unpack_from("<I", data, 0x30)
    return secs, syms, flags


PARAM_CBANK = 0x0A  # EIATTR_PARAM_CBANK: the parameter bank's section symbol, offset, size


def nv_info(raw, syms, symbolic=False):
    """Decode .nv.info entries: (attribute, value). Symbol indices (which differ between two
    cubins) are replaced by names: the first word of every sized entry of the global .nv.info
    (symbolic: per-kernel attributes such as registers and stack) and of EIATTR_PARAM_CBANK."""
    out, i = [], 0
    while i + 2 <= len(raw):
        fmt, attr = raw[i], raw[i + 1]
        i += 2
        if fmt == 1:  # no value (2 bytes of padding)
            out.append((attr, None))
            i += 2
        elif fmt == 2:  # byte value
            out.append((attr, raw[i]))
            i += 2
        elif fmt == 3:  # half-word value
            out.append((attr, struct.unpack_from("<H", raw, i)[0]))
            i += 2
        elif fmt == 4:  # sized value
            (size,) = struct.unpack_from("<H", raw, i)
            i += 2
            val = raw[i:i + size]
            i += size
            if (symbolic or attr == PARAM_CBANK) and size >= 4:
                (idx,) = struct.unpack_from("<I", val, 0)
                val = (syms[idx] if idx < len(syms) else f"symbol {idx}", val[4:].hex())
            else:
                val = val.hex()
            out.append((attr, val))
        else:
            out.append(("undecoded", raw[i - 2:].hex()))
            break
    return out


def kernels_of_cubin(path):
    """{kernel: {aspect: value}} for one cubin."""
    secs, syms, _ = read_elf(path)
    by_name = {s["name"]: s for s in secs}
    res = {}
    for s in secs:
        if not s["name"].startswith(".text."):
            continue
        fn = s["name"][len(".text."):]
        k = {"code": s["bytes"].hex()}
        for rel in (".rela.text.", ".rel.text."):
            r = by_name.get(rel + fn)
            if r and r["size"]:
                es = r["entsize"] or (24 if rel == ".rela.text." else 16)
                ents = []
                for j in range(r["size"] // es):
                    off, info = struct.unpack_from("<QQ", r["bytes"], j * es)
                    add = struct.unpack_from("<q", r["bytes"], j * es + 16)[0] if es == 24 else 0
                    ents.append((off, info & 0xFFFFFFFF, syms[info >> 32], add))
                k["relocations"] = ents
        info = by_name.get(".nv.info." + fn)
        k["info"] = nv_info(info["bytes"], syms) if info else None
        sh = by_name.get(".nv.shared." + fn)
        k["static shared bytes"] = sh["size"] if sh else 0
        cb = by_name.get(".nv.constant0." + fn)
        k["parameter bank bytes"] = cb["size"] if cb else 0
        res[fn] = k
    # per-kernel attributes kept in the global .nv.info (registers, stack, frame)
    glob = by_name.get(".nv.info")
    if glob:
        for attr, val in nv_info(glob["bytes"], syms, symbolic=True):
            if isinstance(val, tuple) and val[0] in res:
                res[val[0]].setdefault("global info", []).append((attr, val[1]))
    for k in res.values():
        if "global info" in k:
            k["global info"].sort()
    return res


def sass_text(path):
    """{function: SASS text} through cuobjdump, when it is installed; else {}."""
    tool = shutil.which("cuobjdump")
    if not tool:
        return {}
    out = subprocess.run([tool, "-sass", path], capture_output=True, text=True, check=True).stdout
    funcs, cur = {}, None
    for line in out.splitlines():
        m = re.match(r"\s*Function : (\S+)", line)
        if m:
            cur = m.group(1)
            funcs[cur] = []
        elif cur and re.match(r"\s*/\*[0-9a-f]{4,}\*/", line):
            funcs[cur].append(line.strip())
    return {f: "\n".join(v) for f, v in funcs.items()}


def arch_of(path):
    m = re.search(r"\.(sm_\w+)\.cubin$", path) or re.search(r"\.compute_(\w+)\.cubin$", path)
    if not m:
        sys.exit(f"sass_compare: cannot tell the architecture of {path}")
    a = m.group(1)
    return a if a.startswith("sm_") else "sm_" + a


def collect(tree):
    """{(arch, kernel): aspects} over every cubin of a compiled tree, plus PTX entries."""
    kernels, ptx = {}, {}
    for dirpath, _, files in os.walk(os.path.join(tree, "keep")):
        for f in files:
            p = os.path.join(dirpath, f)
            if f.endswith(".cubin"):
                arch = arch_of(f)
                text = sass_text(p)
                for fn, k in kernels_of_cubin(p).items():
                    if fn in text:
                        k["cuobjdump -sass"] = text[fn]
                    if (arch, fn) in kernels:
                        sys.exit(f"sass_compare: {fn} is defined twice for {arch}")
                    kernels[(arch, fn)] = k
            elif f.endswith(".ptx"):
                arch = "compute_" + re.search(r"compute_(\w+)\.ptx$", f).group(1)
                src = normalise_ptx(open(p).read())
                for m in re.finditer(r"\.entry (\w+)\((.*?)\n}\n", src, re.S):
                    ptx[(arch, m.group(1))] = m.group(2)
    return kernels, ptx


def normalise_ptx(src):
    """Names that depend on the translation unit, not on the code: internal names carry the file
    name and a hash (N44_INTERNAL_<hash>_13_stats_cuda_cu_<hash>16block_store_part...), and basic
    block labels ($L__BB6_4) the index of the function in its file."""
    def internal(m):
        n = int(m.group(1))
        return "N_INTERNAL_" + m.group(2)[n:]
    src = re.sub(r"N(\d+)(_INTERNAL_\w+)", internal, src)
    return re.sub(r"\$L__BB\d+_", "$L__BB_", src)


def ptxas_report(logs):
    """{(arch, function): 'N registers, ... spill ...'} from the -Xptxas=-v output."""
    rep, cur = {}, None
    for log in logs.values():
        for line in log.splitlines():
            m = re.search(r"Compiling entry function '(\w+)' for '(\w+)'", line)
            if m:
                cur = (m.group(2), m.group(1))
                rep[cur] = []
            elif cur and ("Used" in line or "stack frame" in line):
                rep[cur].append(re.sub(r"\s+", " ", line.split(":", 1)[-1]).strip())
    return {k: "; ".join(v) for k, v in rep.items()}


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    if not 1 <= len(args) <= 2:
        sys.exit(__doc__)
    base, head = args[0], args[1] if len(args) > 1 else None
    jobs = int(os.environ.get("JOBS", "2"))
    tmp = tempfile.mkdtemp(prefix="sass_compare.")
    try:
        gencode = gencode_flags(ROOT)
        print(f"sass_compare: nvcc {NVCC}, {' '.join(gencode)}; cuobjdump: "
              f"{shutil.which('cuobjdump') or 'not installed (ELF .text bytes compared)'}")
        trees, results = {}, {}
        for label, rev in (("base", base), ("head", head)):
            trees[label] = os.path.join(tmp, label)
            export_tree(rev, trees[label])
            logs = compile_tree(trees[label], gencode, jobs)
            k, p = collect(trees[label])
            results[label] = (k, p, ptxas_report(logs))
            print(f"  {label} ({rev or 'work tree'}): {len(logs)} sources, {len(k)} (architecture, "
                  f"kernel) pairs in the cubins, {len(p)} PTX entries")
        (kb, pb, rb), (kh, ph, rh) = results["base"], results["head"]
        bad = 0
        for key in sorted(set(kb) | set(kh)):
            arch, fn = key
            if key not in kb or key not in kh:
                print(f"DIFFERENT {arch} {fn}: only in {'base' if key in kb else 'head'}")
                bad += 1
                continue
            diffs = [a for a in sorted(set(kb[key]) | set(kh[key])) if kb[key].get(a) != kh[key].get(a)]
            if rb.get(key) != rh.get(key):
                diffs.append("ptxas -v")
            size = len(kb[key]["code"]) // 2
            if diffs:
                bad += 1
                print(f"DIFFERENT {arch} {fn}: {', '.join(diffs)}")
                for a in diffs:  # the small ones in full; code and attribute lists by name only
                    vb, vh = (rb.get(key), rh.get(key)) if a == "ptxas -v" else (kb[key].get(a), kh[key].get(a))
                    if isinstance(vb, (int, str, type(None))) and len(str(vb)) < 300:
                        print(f"    {a}: base {vb}\n    {' ' * len(a)}  head {vh}")
            else:
                print(f"identical {arch} {fn}: {size} bytes of code; {rb.get(key, '(no ptxas line)')}")
        for key in sorted(set(pb) | set(ph)):
            if pb.get(key) != ph.get(key):
                bad += 1
                print(f"DIFFERENT {key[0]} PTX of {key[1]}")
        same_ptx = sum(1 for k in pb if pb[k] == ph.get(k))
        print(f"sass_compare: {len(kb)} (architecture, kernel) pairs, {same_ptx} of {len(pb)} PTX "
              f"entries identical; {bad} difference(s)")
        return 1 if bad else 0
    finally:
        if "--keep-tmp" in sys.argv:
            print(f"sass_compare: kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
