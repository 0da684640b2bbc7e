#!/usr/bin/env python3
"""check_structure.py — the shape of the tree, checked: run by ctest (test_structure) and by hand.

    python3 tests/check_structure.py [--root DIR] [--build BUILD_DIR] [--max-lines 900] [-v]

What it checks, over the product code (include/, kernels/, proto/, schema/, daemon/, client/):
  1. Layers. Each top-level directory may use only the ones below it:
         include, kernels, proto            (bottom: they use nothing of ours but themselves;
                                              proto may use include/ for the public enums)
         schema                             (the history store: kernels for stats_head)
         daemon                             (kernels, proto, schema)
         client                             (include, kernels, proto, schema: never daemon)
     "Uses" means a quoted #include that resolves to a file of that directory, or (with --build) a
     call to a function defined in one of its objects.
  2. No circle between modules. A module is a source file with its header of the same name in the
     same folder (daemon/conn.c + daemon/conn.h), and its private header NAME_internal.h. Edges come from the #include lines and, with
     --build, from the object files: module A -> B when A's object calls or reads a symbol that B's
     object defines (nm). Each circle is printed with the names that tie it.
  3. Size. No source file (product, tests, bench) over --max-lines lines unless a comment in its
     first 60 lines says why, with the words "Why this file is long:".
Exits 0 when every check passes, 1 otherwise (each failure printed), 2 on a usage error.
"""
import argparse
import os
import re
import subprocess
import sys

PRODUCT = ["include", "kernels", "proto", "schema", "daemon", "client"]
ALLOWED = {
    "include": {"include"},
    "kernels": {"kernels"},
    "proto": {"proto", "include"},
    "schema": {"schema", "kernels"},
    "daemon": {"daemon", "kernels", "proto", "schema"},
    "client": {"client", "include", "kernels", "proto", "schema"},
}
SRC_EXT = (".c", ".h", ".cu", ".cuh")
SIZE_EXT = (".c", ".h", ".cu", ".cuh", ".py")
LONG_MARK = "Why this file is long:"
INCLUDE_RE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def tracked_files(root):
    """Files git tracks plus untracked ones it does not ignore; a plain walk outside a checkout."""
    try:
        out = subprocess.run(["git", "-C", root, "ls-files", "-co", "--exclude-standard"],
                             check=True, capture_output=True, text=True).stdout
        files = [f for f in out.splitlines() if os.path.isfile(os.path.join(root, f))]
        if files:
            return sorted(set(files))
    except (OSError, subprocess.CalledProcessError):
        pass
    files = []
    for d, dirs, names in os.walk(root):
        dirs[:] = [x for x in dirs if not x.startswith(".") and not x.startswith("build")]
        for n in names:
            files.append(os.path.relpath(os.path.join(d, n), root))
    return sorted(files)


def top(path):
    return path.split("/", 1)[0]


def module_of(path):
    """daemon/conn.c and daemon/conn.h -> daemon/conn; a module's private header
    (schema/store_internal.h) belongs to it (schema/store)."""
    base, ext = os.path.splitext(path)
    if ext not in SRC_EXT:
        return path
    return base[:-len("_internal")] if base.endswith("_internal") else base


def strip_comments(text):
    text = re.sub(r"/\*.*?\*/", lambda m: "\n" * m.group(0).count("\n"), text, flags=re.S)
    return re.sub(r"//[^\n]*", "", text)


def resolve(inc, includer, by_name, files):
    """The product file a quoted include names: next to the includer, then by path suffix."""
    here = os.path.normpath(os.path.join(os.path.dirname(includer), inc))
    if here in files:
        return here
    cands = by_name.get(os.path.basename(inc), [])
    cands = [c for c in cands if c.endswith("/" + inc) or c == inc or os.path.basename(inc) == inc]
    if len(cands) == 1:
        return cands[0]
    same = [c for c in cands if top(c) == top(includer)]
    if len(same) == 1:
        return same[0]
    return None  # generated (attnstat.pb-c.h, store_schema.h) or a system header in quotes


def include_edges(root, files):
    product = [f for f in files if top(f) in PRODUCT and f.endswith(SRC_EXT)]
    fileset = set(product)
    by_name = {}
    for f in product:
        by_name.setdefault(os.path.basename(f), []).append(f)
    edges = {}  # (module a, module b) -> set of reasons
    for f in product:
        with open(os.path.join(root, f), encoding="utf-8", errors="replace") as fh:
            text = strip_comments(fh.read())
        for inc in INCLUDE_RE.findall(text):
            tgt = resolve(inc, f, by_name, fileset)
            if tgt is None:
                continue
            a, b = module_of(f), module_of(tgt)
            if a != b:
                edges.setdefault((a, b), set()).add("#include \"%s\" in %s" % (inc, f))
    return product, edges


def object_source(obj, build):
    """build/<dir>/CMakeFiles/<target>.dir/<rel>.o -> <dir>/<rel> (the source, relative to root)."""
    rel = os.path.relpath(obj, build)
    m = re.match(r"^(.*?)/?CMakeFiles/[^/]+\.dir/(.+)\.o$", rel)
    if not m:
        return None
    return os.path.normpath(os.path.join(m.group(1), m.group(2)))


def nm_symbols(obj):
    out = subprocess.run(["nm", "-P", obj], check=True, capture_output=True, text=True).stdout
    defined, undefined = set(), set()
    for line in out.splitlines():
        parts = line.split()
        if len(parts) < 2:
            continue
        name, kind = parts[0], parts[1]
        if kind in ("U", "w", "v"):
            undefined.add(name)
        elif kind in ("T", "D", "B", "R", "G", "S", "C", "V", "W", "u"):
            defined.add(name)  # lower-case kinds but 'u' are local to the object
    return defined, undefined


def symbol_edges(build, files):
    objs = []
    for d, _dirs, names in os.walk(build):
        if "CompilerId" in d:
            continue
        for n in names:
            if n.endswith(".o"):
                objs.append(os.path.join(d, n))
    fileset = set(files)
    per_src = {}
    for o in sorted(objs):
        src = object_source(o, build)
        if not src or src not in fileset or top(src) not in PRODUCT:
            continue
        if src in per_src:
            continue  # the same source in two targets: one is enough
        per_src[src] = nm_symbols(o)
    owner = {}
    for src, (defined, _u) in per_src.items():
        for s in defined:
            owner.setdefault(s, src)
    edges = {}
    for src, (_d, undefined) in per_src.items():
        for s in undefined:
            tgt = owner.get(s)
            if not tgt:
                continue
            a, b = module_of(src), module_of(tgt)
            if a != b:
                edges.setdefault((a, b), set()).add(s)
    return len(per_src), edges


def cycles(nodes, edges):
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    graph = {n: [] for n in nodes}
    for a, b in edges:
        graph.setdefault(a, []).append(b)
        graph.setdefault(b, [])
    index, low, onstack, stack, out = {}, {}, set(), [], []
    counter = [0]
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter[0]
        counter[0] += 1
        stack.append(start)
        onstack.add(start)
        while work:
            v, it = work[-1]
            advanced = False
            for w in it:
                if w not in index:
                    index[w] = low[w] = counter[0]
                    counter[0] += 1
                    stack.append(w)
                    onstack.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                    advanced = True
                    break
                if w in onstack:
                    low[v] = min(low[v], index[w])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    onstack.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


def report_edges(kind, edges, failures, verbose):
    for (a, b), why in sorted(edges.items()):
        ta, tb = top(a), top(b)
        if tb not in ALLOWED.get(ta, {ta}):
            failures.append("%s: %s uses %s (%s/ may not use %s/): %s"
                            % (kind, a, b, ta, tb, ", ".join(sorted(why)[:4])))
        elif verbose:
            print("  %s %s -> %s" % (kind, a, b))
    for comp in cycles({m for e in edges for m in e}, edges):
        ties = []
        for a in comp:
            for b in comp:
                if (a, b) in edges:
                    ties.append("%s -> %s: %s" % (a, b, ", ".join(sorted(edges[(a, b)])[:4])))
        failures.append("%s circle of %d modules: %s\n    %s"
                        % (kind, len(comp), ", ".join(comp), "\n    ".join(ties)))


def check_sizes(root, files, max_lines, failures):
    for f in files:
        if not f.endswith(SIZE_EXT) or top(f) in ("build",):
            continue
        try:
            with open(os.path.join(root, f), encoding="utf-8", errors="replace") as fh:
                lines = fh.readlines()
        except OSError:
            continue
        if len(lines) > max_lines and LONG_MARK not in "".join(lines[:60]):
            failures.append("size: %s has %d lines (over %d) and no '%s' comment at its top"
                            % (f, len(lines), max_lines, LONG_MARK))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--root", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    ap.add_argument("--build", help="build directory: adds the call graph read from its objects")
    ap.add_argument("--max-lines", type=int, default=900)
    ap.add_argument("-v", "--verbose", action="store_true")
    a = ap.parse_args()
    root = os.path.abspath(a.root)
    files = tracked_files(root)
    failures = []
    product, inc = include_edges(root, files)
    report_edges("include", inc, failures, a.verbose)
    nobj = 0
    if a.build:
        if not os.path.isdir(a.build):
            print("check_structure: no build directory %s" % a.build, file=sys.stderr)
            return 2
        nobj, sym = symbol_edges(os.path.abspath(a.build), files)
        if nobj == 0:
            failures.append("calls: no object file of the product under %s (build it first)" % a.build)
        report_edges("calls", sym, failures, a.verbose)
    check_sizes(root, files, a.max_lines, failures)
    for f in failures:
        print("FAIL " + f)
    print("check_structure: %d product files, %d include edges%s; %d failure(s)"
          % (len(product), len(inc), ", %d objects read" % nobj if a.build else "", len(failures)))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
