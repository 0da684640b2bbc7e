"""pyhelpers.py — what the Python test suites share: the binding on sys.path, the library and
daemon of the build tree, fresh random data (never all zeros) and NumPy-backed stand-ins for
torch tensors (FakeTensor: data_ptr(), stride(), shape, dtype, device, unsqueeze(), no array
interface), so that no PyTorch is needed. Imported by test_python.py and test_python_monitor.py;
it exits 77 (skipped) when NumPy is missing.
"""
import math
import os
import sys
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
