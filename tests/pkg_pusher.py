"""pkg_pusher.py SOCKET RUN PUSHES — a training process as an installed attnstat package sees it,
for test_wheel and test_package: run by the Python under test (a venv's, Debian's), it imports
attnstat from wherever that Python finds it, pushes PUSHES steps of fresh random float32 [1, 3,
24, 16] q and k (ctypes buffers offered through __array_interface__: no NumPy) with
want_results, flushes, and prints one JSON object: where the package and its library were found,
the versions, whether NumPy was importable, sys.path, and per step the daemon's per-head entropy
mean and max logit beside a float64 computation of them here (no mask, scale 1/sqrt(D)).
Standard library only.
"""
import ctypes
import json
import math
import random
import sys

import attnstat

B, H, N, D = 1, 3, 24, 16


class HostTensor(object):
    """A float32 [B, H, N, D] tensor in a ctypes buffer, read through __array_interface__."""

    def __init__(self, scale):
        values = [random.gauss(0.0, scale) for _ in range(B * H * N * D)]
        while not any(values):
            values = [random.gauss(0.0, scale) for _ in range(B * H * N * D)]
        self.buf = (ctypes.c_float * len(values))(*values)
        self.values = list(self.buf)  # as float32 rounded them
        self.__array_interface__ = {"version": 3, "shape": (B, H, N, D), "typestr": "<f4",
                                    "data": (ctypes.addressof(self.buf), False), "strides": None}

    def row(self, h, i):
        o = (h * N + i) * D
        return self.values[o:o + D]


def reference(q, k):
    """Per head: the entropy mean (nats) and the max logit, in float64."""
    out = []
    for h in range(H):
        ents, mx = [], -math.inf
        for i in range(N):
            qi = q.row(h, i)
            s = [sum(a * b for a, b in zip(qi, k.row(h, j))) / math.sqrt(D) for j in range(N)]
            m = max(s)
            e = [math.exp(x - m) for x in s]
            z = sum(e)
            ents.append(-sum((x / z) * math.log(x / z) for x in e if x > 0))
            mx = max(mx, m)
        out.append({"entropy_mean": sum(ents) / N, "max_logit": mx})
    return out


def main():
    sock, run, pushes = sys.argv[1], sys.argv[2], int(sys.argv[3])
    try:
        import numpy  # noqa: F401
        numpy_visible = True
    except ImportError:
        numpy_visible = False
    lib = attnstat.load_library()
    results, refs = {}, {}
    c = attnstat.Client(socket=sock, run=run)
    c.on_result(lambda seq, step, layer, heads: results.__setitem__(step, heads))
    pushed = True
    for step in range(pushes):
        q, k = HostTensor(1.0 + step), HostTensor(1.0)
        refs[step] = reference(q, k)
        pushed = c.push(step, 0, q, k, want_results=True) and pushed
    flushed = c.flush(timeout_s=120)
    status = c.status()
    c.close()
    print(json.dumps({
        "module": attnstat.__file__, "version": attnstat.__version__,
        "library": lib._attnstat_path, "library_version": lib.attnstat_version().decode(),
        "numpy_visible": numpy_visible, "pushed": pushed, "flushed": flushed,
        "sys_path": sys.path, "heads": H,
        "daemon_version": status["daemon_version"], "client_version": status["client_version"],
        "results": {str(s): [{"head": h["head"], "entropy_mean": h["entropy_mean"],
                              "max_logit": h["max_logit"]} for h in hs]
                    for s, hs in results.items()},
        "reference": {str(s): r for s, r in refs.items()},
    }))


if __name__ == "__main__":
    main()
