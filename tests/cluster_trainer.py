"""cluster_trainer.py — one process of a training job that tests/test_cluster.py drives line by
line: an attnstat.Client with the job's run name, its rank, its own alert thresholds and its
tensor-parallel layout, pushing float32 q and k [1, H, 16, 16] of every layer at each step it is
told (ctypes buffers offered through __array_interface__: no NumPy), the heads it is told made
collapsed or hot, the others healthy; it says Goodbye when told. Standard library only.

usage: cluster_trainer.py --socket PATH --run NAME --rank R --layers L --heads H
                          [--tp-rank R --tp-size S] [--threshold NAME=VALUE]...
It answers one JSON line on stdout for every line it reads on stdin:
  start          {"ready": true, "run_id": ID, "seed": S}
  {"step": S, "heads": {"L.H": "collapse" | LOGIT, ...}}
                 every layer of step S pushed and acknowledged: {"step": S, "ok": true,
                 "max_logit": {"L.H": x}, "entropy_norm": {"L.H": x}}, the named heads' values
                 computed here in float64 from the very data pushed (no mask, scale 1/sqrt(D))
  {"bye": true}  the client closed (Goodbye: the run ends); {"bye": true}, then it exits 0
End of input without bye: it exits at once without Goodbye, as a process that died would (the
run waits run_grace_ms for it).

The data, fresh from a seed drawn at start (printed): a healthy head's q and k are N(0, 1); a
collapsed head's queries and its first key share a direction of norm 9 (every row attends that key:
logit about 20 over the others); a hot head's queries and keys all share a direction of norm
sqrt(4 LOGIT), so its logits sit around LOGIT while its attention stays spread.
"""
import argparse
import ctypes
import json
import math
import os
import random
import sys

import attnstat

N, D = 16, 16


class HostTensor(object):
    """A float32 [1, H, N, D] tensor in a ctypes buffer, read through __array_interface__."""

    def __init__(self, values, heads):
        self.buf = (ctypes.c_float * len(values))(*values)
        self.values = list(self.buf)  # as float32 rounded them
        self.__array_interface__ = {"version": 3, "shape": (1, heads, N, D), "typestr": "<f4",
                                    "data": (ctypes.addressof(self.buf), False), "strides": None}

    def row(self, h, i):
        o = (h * N + i) * D
        return self.values[o:o + D]


def unit_vector(rng):
    v = [rng.gauss(0.0, 1.0) for _ in range(D)]
    n = math.sqrt(sum(x * x for x in v))
    return [x / n for x in v]


def head_data(rng, kind):
    """q and k rows (N each, D values a row) of one head."""
    z = lambda s: [rng.gauss(0.0, s) for _ in range(D)]  # noqa: E731
    if kind == "collapse":
        u = [9.0 * x for x in unit_vector(rng)]
        q = [[a + b for a, b in zip(u, z(0.3))] for _ in range(N)]
        k = [[a + b for a, b in zip(u, z(0.3))]] + [z(1.0) for _ in range(N - 1)]
    elif kind is not None:
        a = math.sqrt(4.0 * float(kind))
        u = [a * x for x in unit_vector(rng)]
        q = [[x + y for x, y in zip(u, z(0.5))] for _ in range(N)]
        k = [[x + y for x, y in zip(u, z(0.5))] for _ in range(N)]
    else:
        q = [z(1.0) for _ in range(N)]
        k = [z(1.0) for _ in range(N)]
    return q, k


def reference(q, k, h):
    """Head h's max logit and normalised entropy mean, in float64."""
    ents, mx = [], -math.inf
    for i in range(N):
        qi = q.row(h, i)
        s = [sum(a * b for a, b in zip(qi, k.row(h, j))) / math.sqrt(D) for j in range(N)]
        m = max(s)
        e = [math.exp(x - m) for x in s]
        zsum = sum(e)
        ents.append(-sum((x / zsum) * math.log(x / zsum) for x in e if x > 0) / math.log(N))
        mx = max(mx, m)
    return mx, sum(ents) / N


def say(obj):
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--socket", required=True)
    ap.add_argument("--run", required=True)
    ap.add_argument("--rank", type=int, default=0)
    ap.add_argument("--layers", type=int, required=True)
    ap.add_argument("--heads", type=int, required=True)
    ap.add_argument("--tp-rank", type=int)
    ap.add_argument("--tp-size", type=int)
    ap.add_argument("--threshold", action="append", default=[])
    o = ap.parse_args()
    seed = int.from_bytes(os.urandom(8), "little")
    rng = random.Random(seed)
    thresholds = {}
    for t in o.threshold:
        name, _, value = t.partition("=")
        thresholds[name] = float(value)
    layout = {"tp_rank": o.tp_rank, "tp_size": o.tp_size} if o.tp_size else None
    c = attnstat.Client(socket=o.socket, run=o.run, rank=o.rank, thresholds=thresholds or None,
                        layout=layout)
    say({"ready": True, "run_id": c.run_id, "seed": seed})
    for line in sys.stdin:
        msg = json.loads(line)
        if msg.get("bye"):
            c.close()
            say({"bye": True})
            return 0
        named = msg.get("heads", {})
        out = {"step": msg["step"], "ok": True, "max_logit": {}, "entropy_norm": {}}
        for layer in range(o.layers):
            qs, ks = [], []
            for h in range(o.heads):
                q, k = head_data(rng, named.get("%d.%d" % (layer, h)))
                qs += [x for row in q for x in row]
                ks += [x for row in k for x in row]
            q, k = HostTensor(qs, o.heads), HostTensor(ks, o.heads)
            out["ok"] = c.push(msg["step"], layer, q, k) and out["ok"]
            for key in named:
                lh = [int(x) for x in key.split(".")]
                if lh[0] == layer:
                    out["max_logit"][key], out["entropy_norm"][key] = reference(q, k, lh[1])
        out["ok"] = c.flush(timeout_s=120) and out["ok"]
        say(out)
    os._exit(0)  # no Goodbye: the connection just closes
    return 0


if __name__ == "__main__":
    sys.exit(main())
