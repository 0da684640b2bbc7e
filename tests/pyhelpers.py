"""pyhelpers.py — what the Python test suites share: the binding on sys.path, the library and
daemon of the build tree, fresh random data (never all zeros) and NumPy-backed stand-ins for
torch tensors (FakeTensor: data_ptr(), stride(), shape, dtype, device, unsqueeze(), no array
interface), so that no PyTorch is needed. Imported by test_python.py and test_python_monitor.py;
it exits 77 (skipped) when NumPy is missing.
"""
import math
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "client", "python"))

try:
    import numpy as np
except ImportError:
    print("SKIP: NumPy is not installed for %s (Debian: apt-get install python3-numpy)"
          % sys.executable)
    sys.exit(77)

import attnstat  # noqa: E402
from attnstat import _lib  # noqa: E402

RNG = np.random.default_rng()  # fresh data every run


def _find_lib():
    try:
        return _lib.load()
    except _lib.LibraryNotFound:
        if os.environ.get("ATTNSTAT_LIB"):
            raise
        return None


LIB = _find_lib()


def _find_daemon():
    if "ATTNSTAT_DAEMON" in os.environ:  # set, even empty (the build has no daemon): no search
        return os.environ["ATTNSTAT_DAEMON"] or None
    if LIB is not None:  # the daemon of the library's own build tree
        p = os.path.join(os.path.dirname(os.path.dirname(os.path.realpath(LIB._attnstat_path))),
                         "daemon", "attnstatd")
        if os.path.exists(p):
            return p
    return None


DAEMON = _find_daemon()


def need_lib(test):
    return unittest.skipIf(LIB is None, "libattnstat.so is not built (set ATTNSTAT_LIB)")(test)


def randn(*shape, dtype=np.float32, scale=1.0):
    a = RNG.standard_normal(shape) * scale
    while not np.any(a):
        a = RNG.standard_normal(shape) * scale
    return a.astype(dtype)


class FakeDtype(object):
    def __init__(self, name):
        self.name = name

    def __str__(self):
        return "torch." + self.name


class FakeDevice(object):
    def __init__(self, type_="cpu", index=None):
        self.type, self.index = type_, index


_NP_OF = {"float32": np.float32, "float16": np.float16, "float64": np.float64}


class FakeTensor(object):
    """A NumPy-backed stand-in for torch.Tensor: data_ptr(), stride() in elements, shape, dtype,
    device, is_cuda, unsqueeze(), and nothing of the array interfaces."""

    def __init__(self, arr, dtype_name=None, device=None):
        self._a = arr
        self.dtype = FakeDtype(dtype_name or str(arr.dtype))
        self.device = device or FakeDevice()
        self.is_cuda = self.device.type == "cuda"

    @property
    def shape(self):
        return tuple(self._a.shape)

    def data_ptr(self):
        return self._a.ctypes.data

    def stride(self):
        return tuple(s // self._a.itemsize for s in self._a.strides)

    def dim(self):
        return self._a.ndim

    def unsqueeze(self, d):
        return FakeTensor(np.expand_dims(self._a, d), self.dtype.name, self.device)

    def transpose(self, a, b):
        return FakeTensor(np.swapaxes(self._a, a, b), self.dtype.name, self.device)

    def numpy(self):
        return self._a

    def __getitem__(self, idx):
        return FakeTensor(self._a[idx], self.dtype.name, self.device)

    def bool(self):
        return FakeTensor(self._a.astype(bool), "bool", self.device)

    def to(self, dtype):
        return FakeTensor(self._a.astype(_NP_OF[dtype.name]), dtype.name, self.device)

    # what the 'mha' door computes with (test_python_mha.py): views, and masks' algebra
    def view(self, *shape):
        return FakeTensor(self._a.reshape(shape), self.dtype.name, self.device)

    def __invert__(self):
        return FakeTensor(~self._a, "bool", self.device)

    def __and__(self, other):
        return FakeTensor(self._a & other._a, "bool", self.device)

    def __add__(self, other):
        return FakeTensor(self._a + other._a, self.dtype.name, self.device)

    def masked_fill(self, m, value):
        return FakeTensor(np.where(m._a, value, self._a).astype(self._a.dtype), self.dtype.name,
                          self.device)


def np_sdpa(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
             enable_gqa=False):
    q, k, v = query._a.astype(np.float64), key._a.astype(np.float64), value._a.astype(np.float64)
    if enable_gqa and k.shape[-3] != q.shape[-3]:
        rep = q.shape[-3] // k.shape[-3]
        k, v = np.repeat(k, rep, axis=-3), np.repeat(v, rep, axis=-3)
    s = (q @ np.swapaxes(k, -1, -2)) * (scale or 1.0 / math.sqrt(q.shape[-1]))
    if is_causal:
        s = np.where(np.tril(np.ones(s.shape[-2:], bool)), s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    return FakeTensor((p @ v).astype(query._a.dtype))


class FakeTorch(object):
    """A fake `torch` package in sys.modules (torch, torch.nn, torch.nn.functional with the given
    scaled_dot_product_attention) until restore(); .F is the functional module."""
    NAMES = ("torch", "torch.nn", "torch.nn.functional")

    def __init__(self, sdpa, extra=None):
        import types
        self.saved = {m: sys.modules.get(m) for m in self.NAMES + tuple(extra or ())}
        torch = types.ModuleType("torch")
        torch.__version__ = "0.0-fake"
        torch.nn = types.ModuleType("torch.nn")
        F = types.ModuleType("torch.nn.functional")
        F.scaled_dot_product_attention = sdpa
        torch.nn.functional = F
        torch.compiler = types.SimpleNamespace(is_compiling=lambda: False)
        sys.modules.update({"torch": torch, "torch.nn": torch.nn, "torch.nn.functional": F})
        for m in extra or ():
            sys.modules.pop(m, None)
        self.torch, self.F = torch, F

    def restore(self):
        for m, v in self.saved.items():
            if v is None:
                sys.modules.pop(m, None)
            else:
                sys.modules[m] = v


# ---- the float64 reference ------------------------------------------------------------------------
def reference_stats(q, k, causal=False, scale=None, cu_q=None, cu_k=None, every=1):
    """Per-head statistics of q [B, Hq, Nq, D], k [B, Hkv, Nk, D], in float64, two passes per row:
    the row max first, then the probabilities; H = -sum p log p. Causal masks are bottom-right
    aligned; cu_q / cu_k (B = 1) split N into packed sequences; every=k keeps rows 0, k, 2k...
    of each sequence. Returns one dict per head:
    rows, entropy_mean / min / max, max_logit, and sink_mass (the mean of each row's probability
    on its first visible key) and distance (the mean of sum_j p_j |i + Nk - Nq - j| over rows, in
    positions within the sequence)."""
    q = q.astype(np.float64)
    k = k.astype(np.float64)
    B, Hq, Nq, D = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    sc = 1.0 / math.sqrt(D) if not scale else float(np.float32(scale))
    if cu_q is None:
        cu_q, cu_k = [0, Nq], [0, Nk]
    out = []
    for h in range(Hq):
        kh = h // (Hq // Hkv)
        ents, sinks, dists, maxl = [], [], [], -np.inf
        for b in range(B):
            for (q0, q1), (k0, k1) in zip(zip(cu_q, cu_q[1:]), zip(cu_k, cu_k[1:])):
                s = sc * (q[b, h, q0:q1] @ k[b, kh, k0:k1].T)  # [nq, nk]
                nq, nk = q1 - q0, k1 - k0
                for i in range(0, nq, every):
                    row = s[i, : max(0, i + (nk - nq) + 1)] if causal else s[i]
                    if row.size == 0:
                        continue  # no visible key: no distribution
                    m = row.max()
                    p = np.exp(row - m)
                    p /= p.sum()
                    nz = p[p > 0]
                    ents.append(float(-(nz * np.log(nz)).sum()))
                    sinks.append(float(p[0]))  # keys 0.. are visible: the first is key 0
                    pos = i + (nk - nq)
                    dists.append(float((p * np.abs(pos - np.arange(row.size))).sum()))
                    maxl = max(maxl, float(m))
        out.append({"rows": len(ents), "entropy_mean": float(np.mean(ents)),
                    "entropy_min": float(np.min(ents)), "entropy_max": float(np.max(ents)),
                    "max_logit": maxl, "sink_mass": float(np.mean(sinks)),
                    "distance": float(np.mean(dists))})
    return out


# ---- end to end: a real attnstatd ------------------------------------------------------------------
def query_db(path, sql, *args):
    """The rows of sql over the database at path, opened read-only (a daemon may be writing)."""
    db = sqlite3.connect("file:%s?mode=ro" % path, uri=True, timeout=10)
    try:
        return db.execute(sql, args).fetchall()
    finally:
        db.close()


class Daemon(object):
    """attnstatd on a temporary socket and database, for the life of a test class."""

    def __init__(self, args=(), prefix=()):
        """prefix: a command the daemon runs under (setpriv ... -- to run it as another uid; the
        directory is then open to every uid, the files in it keep the daemon's modes)."""
        self.dir = tempfile.TemporaryDirectory(prefix="attnstat-py-")
        if prefix:
            os.chmod(self.dir.name, 0o777)
        self.socket = os.path.join(self.dir.name, "d.sock")
        self.db = os.path.join(self.dir.name, "d.db")
        self.log = open(os.path.join(self.dir.name, "d.log"), "w+")
        self.proc = subprocess.Popen(list(prefix) + [DAEMON, "--socket", self.socket, "--db",
                                                     self.db] + list(args),
                                     stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 20
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError("attnstatd exited with %s:\n%s" % (self.proc.returncode,
                                                                       self.log_text()))
            if os.path.exists(self.socket):
                try:
                    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                    s.connect(self.socket)
                    s.close()
                    break
                except OSError:
                    pass
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError("attnstatd did not listen on %s within 20 s:\n%s"
                                   % (self.socket, self.log_text()))
            time.sleep(0.02)

    def log_text(self):
        self.log.flush()
        with open(self.log.name) as f:
            return f.read()[-4000:]

    def client(self, run, **kw):
        return attnstat.Client(socket=self.socket, run=run, lib=LIB, **kw)

    def query(self, sql, *args):
        return query_db(self.db, sql, *args)

    def samples(self, run, step, layer):
        """{head: row dict} of the stored samples of (run, step, layer)."""
        cols = ("head", "rows", "rows_empty", "nonfinite_rows", "entropy_mean", "entropy_min",
                "entropy_max", "max_logit", "sampled")
        rows = self.query("SELECT %s FROM samples JOIN runs ON runs.id = samples.run_id "
                          "WHERE runs.name = ? AND samples.step = ? AND samples.layer = ? "
                          "ORDER BY head" % ", ".join("samples." + c for c in cols),
                          run, step, layer)
        return {r[0]: dict(zip(cols, r)) for r in rows}

    def stop(self):
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGCONT)
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        self.dir.cleanup()


def need_daemon(cls):
    return unittest.skipIf(LIB is None or not DAEMON,
                           "attnstatd or libattnstat.so is not built (ATTNSTAT_DAEMON)")(cls)


class DaemonCase(unittest.TestCase):
    daemon_args = ()  # extra attnstatd flags of a test class

    @classmethod
    def setUpClass(cls):
        cls.d = Daemon(cls.daemon_args)

    @classmethod
    def tearDownClass(cls):
        cls.d.stop()

    def run_name(self):
        return "%s-%d" % (self.id().rsplit(".", 1)[-1], os.getpid())

    def assertClose(self, got, want, rel, what, abs_tol=0.0):
        self.assertIsNotNone(got, what)
        self.assertLessEqual(abs(got - want), rel * max(abs(want), 1e-3) + abs_tol,
                             "%s: daemon %r, reference %r" % (what, got, want))

    def check_stored(self, run, step, layer, ref, rel):
        # The daemon computes host pushes in float32 (stats_cpu_fast_ws): 1e-5 relative at least,
        # 1e-6 absolute (a row's entropy is good to ~1e-7 nats, not relative to a tiny entropy).
        rel = max(rel, 1e-5)
        got = self.d.samples(run, step, layer)
        self.assertEqual(sorted(got), list(range(len(ref))), "heads stored for layer %d" % layer)
        for h, r in enumerate(ref):
            g = got[h]
            self.assertEqual(g["rows"], r["rows"], "rows of head %d" % h)
            self.assertEqual(g["nonfinite_rows"], 0)
            for f in ("entropy_mean", "entropy_min", "entropy_max", "max_logit"):
                self.assertClose(g[f], r[f], rel, "layer %d head %d %s" % (layer, h, f), 1e-6)
