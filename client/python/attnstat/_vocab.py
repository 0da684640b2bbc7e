"""The tables of attnstat's per-head statistics, counts, alert thresholds and rules (vocab/vocab.h,
where each is described once), for the Python binding: the ctypes mirrors, the history reader's
fields and the compact format's layout are built from these rows, never listed by hand.

In the source tree the rows are read from vocab/vocab.h itself. An installed package has them
written here when it is built (setup.py, deploy/CMakeLists.txt), by this module run as a program:

    python3 client/python/attnstat/_vocab.py vocab/vocab.h > attnstat/_vocab.py

Each list holds one dict per row, keyed by the column names of vocab.h; identifiers are kept as
written there (for example pack "VOCAB_PACK_UNIT16"), numbers as numbers, strings as strings.
"""
import os
import re
import sys

COLUMNS = {
    "VOCAB_STATS": ("name", "unit", "pack", "since", "pool", "weight", "lo", "hi", "absent",
                    "metric", "help", "cli", "digits", "ask", "dflt"),
    "VOCAB_COUNTS": ("name", "help"),
    "VOCAB_THRESHOLDS": ("name", "type", "default", "lo", "lo_incl", "hi", "hi_incl", "help"),
    "VOCAB_RULES": ("constant", "value", "name", "stat", "cmp", "threshold"),
}

_TOKEN = re.compile(r'\s*(?:("(?:[^"\\]|\\.)*")|([-+]?[0-9][0-9.eE+-]*)|([A-Za-z_][A-Za-z_0-9]*)|(.))')


def _value(tok):
    s, num, ident, other = tok
    if s is not None:
        return bytes(s[1:-1], "ascii").decode("unicode_escape")
    if num is not None:
        return float(num) if re.search(r"[.eE]", num) else int(num)
    return ident if ident is not None else other


def _rows(body, columns, macro):
    toks = [m.groups() for m in _TOKEN.finditer(body) if any(g is not None for g in m.groups())]
    rows, i = [], 0
    while i < len(toks):
        if toks[i][2] != "X" or i + 1 >= len(toks) or toks[i + 1][3] != "(":
            raise ValueError("%s: expected X( at token %d" % (macro, i))
        i += 2
        args, cur, depth = [], [], 0
        while True:
            t = toks[i]
            i += 1
            if t[3] == "(":
                depth += 1
            elif t[3] == ")":
                if depth == 0:
                    break
                depth -= 1
            if t[3] == "," and depth == 0:
                args.append(cur)
                cur = []
            else:
                cur.append(t)
        args.append(cur)
        vals = []
        for a in args:
            if all(t[0] is not None for t in a):  # adjacent string literals concatenate
                vals.append("".join(_value(t) for t in a))
            elif len(a) == 1:
                vals.append(_value(a[0]))
            else:
                raise ValueError("%s: an argument that is not one token: %r" % (macro, a))
        if len(vals) != len(columns):
            raise ValueError("%s: a row of %d columns, not %d: %r" % (macro, len(vals),
                                                                     len(columns), vals))
        rows.append(dict(zip(columns, vals)))
    return rows


def parse(text):
    """The four lists of a vocab.h's text, as {macro: [row dict, ...]}."""
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S).replace("\\\n", " ")
    out = {}
    for macro, columns in COLUMNS.items():
        m = re.search(r"^#define %s\(X\)(.*)$" % macro, text, re.M)
        if not m:
            raise ValueError("vocab.h defines no %s(X)" % macro)
        out[macro] = _rows(m.group(1), columns, macro)
    return out


def _header():
    return os.environ.get("ATTNSTAT_VOCAB_HEADER") or os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "vocab", "vocab.h")


def _load():
    path = _header()
    try:
        with open(path) as f:
            return parse(f.read())
    except OSError:
        raise ImportError("attnstat's tables (vocab/vocab.h) are not at %s, and this package was "
                          "not built with them written in: install the built package, or use "
                          "attnstat from its source tree" % path)


_T = _load()
STATS, COUNTS = _T["VOCAB_STATS"], _T["VOCAB_COUNTS"]
THRESHOLDS, RULES = _T["VOCAB_THRESHOLDS"], _T["VOCAB_RULES"]


def emit(tables):
    """The text of an installed _vocab.py holding these tables."""
    out = ['"""The tables of attnstat\'s per-head statistics, counts, alert thresholds and rules, '
           'written at build time\nfrom vocab/vocab.h (see the source tree\'s _vocab.py)."""']
    for macro, name in (("VOCAB_STATS", "STATS"), ("VOCAB_COUNTS", "COUNTS"),
                        ("VOCAB_THRESHOLDS", "THRESHOLDS"), ("VOCAB_RULES", "RULES")):
        out.append("%s = [" % name)
        out.extend("    %r," % (row,) for row in tables[macro])
        out.append("]")
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python3 _vocab.py VOCAB_H > _vocab.py")
    with open(sys.argv[1]) as f:
        sys.stdout.write(emit(parse(f.read())))
