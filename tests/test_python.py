#!/usr/bin/env python3
"""test_python.py — tests of the Python binding (client/python/attnstat).

Offline: tensor descriptions (NumPy, PyTorch-like and CUDA-interface objects, both layouts), the
ctypes mirrors against a C compiler's sizes and offsets (tests/abi_sizes.c), argument errors with
the library's messages (against a bare listening socket). attnstat.torch.monitor is tested in
test_python_monitor.py.
End to end (when attnstatd is built): a real daemon on a temporary socket and database; pushes of
float32 / float16 arrays in both layouts; the stored per-head statistics equal a float64 two-pass
computation done here; drops while the daemon is stopped; status; alerts. A daemon that goes away
and comes back: test_python_restart.py.

Environment: ATTNSTAT_LIB (libattnstat.so), ATTNSTAT_DAEMON (attnstatd), ATTNSTAT_CC (a C
compiler), ATTNSTAT_INCLUDE (include/). Without NumPy it exits 77 (skipped).
"""
import ctypes
import grp
import json
import math
import os
import re
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
import types
import unittest

from pyhelpers import (DAEMON, HERE, LIB, RNG, ROOT, Daemon, DaemonCase, FakeDevice,  # noqa: E402
                       FakeTensor, FakeTorch, need_daemon, need_lib, np, np_sdpa, randn,
                       reference_stats)

import attnstat  # noqa: E402
import attnstat.torch  # noqa: E402
from attnstat import _lib, _tensor  # noqa: E402
from attnstat import _vocab as vocab  # noqa: E402


def proto_fields(message):
    """{field name: (type, number)} of a message of proto/attnstat.proto, read from the file."""
    with open(os.path.join(ROOT, "proto", "attnstat.proto")) as f:
        body = re.search(r"message %s \{(.*?)\n\}" % message, f.read(), re.S).group(1)
    return {m.group(2): (m.group(1), int(m.group(3))) for m in re.finditer(
        r"^\s*(?:optional|required)\s+(\w+)\s+(\w+)\s*=\s*(\d+);", body, re.M)}


def pb_fields(buf):
    """A serialized protobuf message's fields, {number: value}: varints as int, fixed64 as its 8
    bytes, length-delimited as bytes (other wire types: ValueError)."""
    out, i = {}, 0

    def varint(i):
        v, shift = 0, 0
        while buf[i] & 0x80:
            v, shift, i = v | (buf[i] & 0x7F) << shift, shift + 7, i + 1
        return v | buf[i] << shift, i + 1
    while i < len(buf):
        key, i = varint(i)
        if key & 7 == 0:
            out[key >> 3], i = varint(i)
        elif key & 7 in (1, 2):
            n, i = (8, i) if key & 7 == 1 else varint(i)
            out[key >> 3], i = buf[i:i + n], i + n
        else:
            raise ValueError("wire type %d" % (key & 7))
    return out

class TestReference(unittest.TestCase):
    """The reference itself, on cases with known answers."""

    def test_uniform_and_peaked(self):
        D, N = 8, 5
        q = np.zeros((1, 1, N, D))
        q[..., 0] = 1e-9
        k = randn(1, 1, N, D)
        r = reference_stats(q, k)[0]
        self.assertAlmostEqual(r["entropy_mean"], math.log(N), places=6)
        q = np.zeros((1, 1, 1, D))
        q[0, 0, 0, 0] = 1000.0
        k = np.zeros((1, 1, 3, D))
        k[0, 0, 0, 0] = 1.0
        self.assertLess(reference_stats(q, k)[0]["entropy_mean"], 1e-12)


# ---- tensor descriptions (no library needed) ------------------------------------------------------

class CudaLike(object):
    """Looks like device memory through __cuda_array_interface__ (never dereferenced here)."""

    def __init__(self, shape, typestr="<f2", ptr=0x7F0000001000, strides=None, device=0):
        self.__cuda_array_interface__ = {"shape": shape, "typestr": typestr, "data": (ptr, False),
                                         "strides": strides, "version": 3, "stream": 1}
        self.device = types.SimpleNamespace(id=device)


class TestDescribe(unittest.TestCase):
    def test_numpy_both_layouts_and_dtypes(self):
        for dt, code in ((np.float32, _lib.F32), (np.float16, _lib.F16)):
            a = randn(2, 3, 5, 8, dtype=dt)
            d = _tensor.describe(a, "q")
            self.assertEqual((d.dtype, d.mem, d.ptr), (code, _lib.MEM_HOST, a.ctypes.data))
            self.assertEqual(d.shape, (2, 3, 5, 8))
            self.assertEqual(d.strides, (120, 40, 8, 1))
            d = _tensor.describe(a, "q", layout="bnhd")  # read as [B, N=3, H=5, D]
            self.assertEqual(d.shape, (2, 5, 3, 8))
            self.assertEqual(d.strides, (120, 8, 40, 1))

    def test_strided_views(self):
        a = randn(2, 4, 6, 16)
        v = a[:, 1:3, ::2, :8]
        d = _tensor.describe(v, "k")
        self.assertEqual(d.shape, (2, 2, 3, 8))
        self.assertEqual(d.strides, (384, 96, 32, 1))
        self.assertEqual(d.ptr, v.ctypes.data)
        b = np.broadcast_to(randn(1, 1, 4, 8), (3, 2, 4, 8))  # zero strides are fine
        self.assertEqual(_tensor.describe(b).strides, (0, 0, 8, 1))

    def test_rejections(self):
        a = randn(2, 3, 4, 8)
        cases = [
            (a.astype(np.float64), "typestr"),
            (a.astype(">f4"), "typestr"),
            (a[0], "4-D"),
            (a[..., ::2], "contiguous"),
            (a[:, :, ::-1], "negative"),
            ([1.0, 2.0], "not a tensor"),
        ]
        for x, needle in cases:
            with self.assertRaises(_tensor.TensorError) as cm:
                _tensor.describe(x, "q")
            self.assertIn(needle, str(cm.exception))
        raw = np.frombuffer(bytearray(4 * 2 * 3 * 5 * 8 + 2), dtype=np.uint8)[2:].view(np.float32)
        odd = np.lib.stride_tricks.as_strided(raw, shape=(2, 3, 4, 8), strides=(482, 160, 32, 4))
        with self.assertRaises(_tensor.TensorError) as cm:
            _tensor.describe(odd, "q")
        self.assertIn("not a multiple", str(cm.exception))
        with self.assertRaises(_tensor.TensorError):
            _tensor.describe(a, "q", layout="nhd")

    def test_torch_like(self):
        a = randn(2, 5, 3, 8)  # stored [B, N, H, D]
        t = FakeTensor(a).transpose(1, 2)  # a [B, H, N, D] view, as models hold them
        d = _tensor.describe(t, "q")
        self.assertEqual((d.shape, d.strides), ((2, 3, 5, 8), (120, 8, 24, 1)))
        self.assertEqual((d.dtype, d.mem), (_lib.F32, _lib.MEM_HOST))
        bf = FakeTensor(np.zeros((1, 2, 3, 4), np.uint16), "bfloat16")
        self.assertEqual(_tensor.describe(bf).dtype, _lib.BF16)
        g = FakeTensor(randn(1, 2, 3, 4, dtype=np.float16), device=FakeDevice("cuda", 3))
        d = _tensor.describe(g)
        self.assertEqual((d.mem, d.device, d.dtype), (_lib.MEM_CUDA, 3, _lib.F16))
        with self.assertRaises(_tensor.TensorError):
            _tensor.describe(FakeTensor(randn(1, 2, 3, 4, dtype=np.float64)))
        with self.assertRaises(_tensor.TensorError):
            _tensor.describe(FakeTensor(randn(1, 2, 3, 4), device=FakeDevice("mps", 0)))

    def test_cuda_interface(self):
        c = CudaLike((2, 4, 16, 64), "<f2", device=1)
        d = _tensor.describe(c, "q")
        self.assertEqual((d.mem, d.device, d.dtype, d.stream), (_lib.MEM_CUDA, 1, _lib.F16, 1))
        self.assertEqual(d.strides, (4 * 16 * 64, 16 * 64, 64, 1))
        c = CudaLike((2, 16, 4, 64), "<f4", strides=(4 * 4 * 16 * 64, 4 * 64 * 4, 4 * 64, 4))
        d = _tensor.describe(c, "q", layout="bnhd")
        self.assertEqual(d.shape, (2, 4, 16, 64))
        self.assertEqual(d.strides, (4 * 16 * 64, 64, 4 * 64, 1))

    def test_numpy_method_fallback(self):
        a = randn(1, 2, 3, 4)

        class HasNumpy(object):
            def numpy(self):
                return a

        d = _tensor.describe(HasNumpy())
        self.assertEqual(d.ptr, a.ctypes.data)
        self.assertIs(d.owner[1], a)


class TestImports(unittest.TestCase):
    def test_imports_nothing_third_party(self):
        code = ("import sys, attnstat, attnstat.torch; "
                "bad = [m for m in ('numpy', 'torch', 'cupy') if m in sys.modules]; "
                "sys.exit(1 if bad else 0)")
        env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "client", "python"))
        r = subprocess.run([sys.executable, "-c", code], env=env)
        self.assertEqual(r.returncode, 0, "importing attnstat imported numpy/torch/cupy")

    def test_library_not_found_lists_places(self):
        code = "import attnstat; attnstat.Client()"
        env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "client", "python"),
                   ATTNSTAT_LIB="/nonexistent/libattnstat.so")
        r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("/nonexistent/libattnstat.so does not exist", r.stderr)
        self.assertIn("ATTNSTAT_LIB", r.stderr)


# ---- ABI -------------------------------------------------------------------------------------------
@need_lib
class TestABI(unittest.TestCase):
    def test_struct_layouts_match_c(self):
        cc = os.environ.get("ATTNSTAT_CC") or "cc"
        inc = os.environ.get("ATTNSTAT_INCLUDE") or os.path.join(ROOT, "include")
        with tempfile.TemporaryDirectory() as d:
            exe = os.path.join(d, "abi_sizes")
            try:
                subprocess.run([cc, "-std=c11", "-I", inc, os.path.join(HERE, "abi_sizes.c"),
                                "-o", exe], check=True, capture_output=True, text=True)
            except FileNotFoundError:
                self.skipTest("no C compiler (%s): set ATTNSTAT_CC" % cc)
            except subprocess.CalledProcessError as e:
                self.fail("abi_sizes.c does not compile against %s:\n%s" % (inc, e.stderr))
            out = subprocess.run([exe], check=True, capture_output=True, text=True).stdout
        seen = {}
        for line in out.splitlines():
            sname, field, off, size = line.split()
            seen.setdefault(sname, {})[field] = (int(off), int(size))
        self.assertEqual(set(seen), set(_lib.C_NAMES))
        for sname, cls in _lib.C_NAMES.items():
            c = seen[sname]
            self.assertEqual(ctypes.sizeof(cls), c["-"][1], "sizeof(%s)" % sname)
            py_fields = [f for f, _ in cls._fields_]
            self.assertEqual(sorted(py_fields), sorted(f for f in c if f != "-"), sname)
            for f in py_fields:
                desc = getattr(cls, f)
                self.assertEqual((desc.offset, desc.size), c[f], "%s.%s" % (sname, f))


# ---- argument errors (a bare listening socket: no daemon) ------------------------------------------
@need_lib
class TestArguments(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.path = os.path.join(self.dir.name, "bare.sock")
        self.srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.srv.bind(self.path)
        self.srv.listen(4)
        self.c = attnstat.Client(socket=self.path, hello=False, lib=LIB)

    def tearDown(self):
        self.c.close()
        self.srv.close()
        self.dir.cleanup()

    def assertPushError(self, code, needle, *args, **kw):
        with self.assertRaises(attnstat.AttnstatError) as cm:
            self.c.push(*args, **kw)
        self.assertEqual(cm.exception.code, code, str(cm.exception))
        self.assertIn(needle, str(cm.exception))
        return cm.exception

    def test_bad_arguments_raise_with_the_message(self):
        q, k = randn(2, 4, 8, 16), randn(2, 4, 8, 16)
        E = _lib.EINVAL
        self.assertPushError(E, "not a multiple of k heads", 0, 0, q, randn(2, 3, 8, 16))
        self.assertPushError(E, "different dtypes", 0, 0, q, k.astype(np.float16))
        self.assertPushError(E, "batch sizes differ", 0, 0, q, randn(1, 4, 8, 16))
        self.assertPushError(E, "head dimensions differ", 0, 0, q, randn(2, 4, 8, 8))
        self.assertPushError(E, "contradicts", 0, 0, q, k, causal=True, window=(4, 2))
        self.assertPushError(E, "exclusive", 0, 0, q, k, sample_every=2, sample_rows=3)
        self.assertPushError(E, "must start at 0", 0, 0, q[:1], k[:1], cu_seqlens_q=[0, 3, 7],
                             cu_seqlens_k=[0, 4, 8])
        self.assertPushError(E, "go together", 0, 0, q, k, cu_seqlens_q=[0, 8])
        self.assertPushError(E, "4-D", 0, 0, q[0], k)
        self.assertPushError(E, "typestr", 0, 0, q.astype(np.float64), k)
        self.assertPushError(E, "not both", 0, 0, q, k, window=(1, 1), window_left=2)
        self.assertPushError(E, "finite", 0, 0, q, k, scale=float("nan"))
        self.assertPushError(E, "layer", 0, -1, q, k)
        e = self.assertPushError(_lib.ESTATE, "hello", 0, 0, q, k)  # valid, but no hello yet
        self.assertEqual(e.code_name, "ESTATE")

    def assertRefused(self, field, fn, *args, **kw):
        """fn(*args, **kw) raises a ValueError (an AttnstatError EINVAL too) naming field."""
        with self.assertRaises(ValueError) as cm:
            fn(*args, **kw)
        e = cm.exception
        self.assertIsInstance(e, attnstat.AttnstatError)
        self.assertEqual(e.code, _lib.EINVAL, str(e))
        self.assertIn(field, str(e))
        return e

    def test_values_past_the_c_types_refused(self):
        """ctypes wraps an integer past its C type (step=2**70 was stored as step 0, rank=2**40
        wrote into rank 0's run), a C string ends at a NUL and NaN means "the daemon's
        threshold": each is refused before the call, a ValueError naming the field."""
        q, k = randn(1, 2, 8, 16), randn(1, 2, 8, 16)
        big = int(RNG.integers(1, 1 << 20))
        push = self.c.push
        for field, kw in (("step", dict(step=(1 << 63) + big)), ("step", dict(step=-(1 << 70))),
                          ("layer", dict(layer=(1 << 32) + big)),
                          ("window_left", dict(window_left=(1 << 31) + big)),
                          ("sample_every", dict(sample_every=(1 << 32) + big)),
                          ("seed", dict(seed=(1 << 64) + big)), ("seed", dict(seed=-big)),
                          ("scale", dict(scale=1e39 * big)), ("softcap", dict(softcap=math.inf)),
                          ("stream", dict(stream=(1 << 64) + big)),
                          ("step", dict(step=2.5)), ("layer", dict(layer="3")),
                          ("cu_seqlens_k[1]",
                           dict(cu_seqlens_q=[0, 8], cu_seqlens_k=[0, 1 << 31]))):
            args = dict(step=big, layer=0)
            args.update(kw)
            self.assertRefused(field, push, args.pop("step"), args.pop("layer"), q, k, **args)
        # a tensor whose stride does not fit int64 (ctypes would make it 2**66 mod 2**64 = 0)
        arr = randn(1, 2, 8, 16)

        class Wide(object):
            __array_interface__ = dict(arr.__array_interface__, strides=(1024, (1 << 66) * 4,
                                                                         64, 4))
        e = self.assertRefused("q stride[1]", push, big, 0, Wide(), k)
        self.assertIn("past 64 bits", str(e))
        # the hello's numbers and strings, refused before anything is sent
        name = "run-%d" % big
        for field, kw in (("rank", dict(rank=(1 << 40) + big)), ("rank", dict(rank=-1)),
                          ("run", dict(run=name + "\0evil")),
                          ("config", dict(config='{"a": "x\0y"}')),
                          ("config", dict(config=b'{"a": 1}\0tail')),
                          ("entropy_floor", dict(thresholds={"entropy_floor": math.nan})),
                          ("logit_ceiling", dict(thresholds={"logit_ceiling": -math.inf})),
                          ("raise_after", dict(thresholds={"raise_after": 1 << 32})),
                          ("raise_after", dict(thresholds={"raise_after": 0})),
                          ("devices", dict(devices=["GPU-%d\0x" % big])),
                          ("socket", dict(socket=self.path + "\0.other")),
                          ("timeout_s", dict(timeout_s=1e10)), ("timeout_s", dict(timeout_s=-1))):
            args = dict(socket=self.path, run=name, lib=LIB, timeout_s=1)
            args.update(kw)
            self.assertRefused(field, attnstat.Client, **args)
        self.assertRefused("layout field tp_size", self.c.set_layout, tp_rank=1,
                           tp_size=(1 << 31) + big)
        self.assertRefused("timeout_s", self.c.status, timeout_s=math.nan)
        self.assertRefused("timeout_s", self.c.flush, timeout_s=math.nan)
        # in range: the push itself goes on to the library (no hello yet: ESTATE)
        with self.assertRaises(attnstat.AttnstatError) as cm:
            push((1 << 63) - 1, (1 << 32) - 1, q, k, seed=(1 << 64) - 1, window_left=-1)
        self.assertEqual(cm.exception.code, _lib.ESTATE, str(cm.exception))
        self.assertNotIsInstance(cm.exception, ValueError)

    def test_cuda_tensors_without_a_gpu_path(self):
        """Without CUDA in the library or a usable device, CUDA tensors are ENOTSUP with a message
        that says so (checked before the hello); with one, the missing hello is what is wrong."""
        q, k = CudaLike((1, 2, 8, 16)), CudaLike((1, 2, 8, 16))
        with self.assertRaises(attnstat.AttnstatError) as cm:
            self.c.push(0, 0, q, k)
        e = cm.exception
        if e.code == _lib.ESTATE:
            self.assertIn(b"+cuda", LIB.attnstat_version())
        else:
            self.assertEqual(e.code, _lib.ENOTSUP, str(e))
            self.assertIn("CUDA", str(e))
            self.assertIn("GPU path", str(e))
        self.assertEqual(self.c.stats()["held"], 0)

    def test_gpu_tensors_are_held_until_released(self):
        """The holding logic of the GPU path, against a stand-in for the library calls that the
        GPU path adds (attnstat_push_ex with the push's seq, a release callback)."""
        real = self.c._lib
        state = {"seq": 0, "in_flight": 0}

        class Stub(object):
            def __getattr__(self, name):
                return getattr(real, name)

            def attnstat_push(self, c, o, q, k, v):
                state["in_flight"] += 1
                return _lib.OK

            def attnstat_push_ex(self, c, o, q, k, v, seq):
                state["seq"] += 1
                seq._obj.value = state["seq"]
                return _lib.OK

            def attnstat_stats(self, c, out):
                real.attnstat_stats(c, out)
                out._obj.in_flight = state["in_flight"]

            def attnstat_poll(self, c, ms):
                return _lib.OK

        q, k = CudaLike((1, 2, 8, 16)), CudaLike((1, 2, 8, 16))
        # Without per-push notifications: held until nothing is in flight.
        self.c._lib, self.c._push_ex = Stub(), None
        self.assertTrue(self.c.push(0, 0, q, k))
        self.assertTrue(self.c.push(0, 1, q, k))
        self.assertEqual(self.c.stats()["held"], 2)
        self.c.poll()
        self.assertEqual(self.c.stats()["held"], 2)
        state["in_flight"] = 0
        self.c.poll()
        self.assertEqual(self.c.stats()["held"], 0)
        # With attnstat_push_ex and a release callback: held per seq, freed by its Release.
        stub = Stub()
        self.c._lib, self.c._push_ex, self.c._release_cb = stub, stub.attnstat_push_ex, True
        self.assertTrue(self.c.push(0, 0, q, k))
        self.assertTrue(self.c.push(0, 1, q, k))
        self.assertEqual(sorted(self.c._held), [1, 2])
        self.c._on_release_c(None, 1)
        self.assertEqual(sorted(self.c._held), [2])
        self.assertIs(self.c._held[2][0], q)
        self.c._lib = real
        self.c.close()
        self.assertEqual(self.c._held, {})

    def _stub_lib(self, on_push=None):
        """A stand-in for the library calls of the GPU path: attnstat_push_ex gives seqs 1, 2...
        and runs on_push(seq) first (to play a callback that runs inside the C push)."""
        real = self.c._lib
        state = {"seq": 0, "pushes": 0}

        class Stub(object):
            def __getattr__(self, name):
                return getattr(real, name)

            def attnstat_push_ex(self, c, o, q, k, v, seq):
                state["seq"] += 1
                state["pushes"] += 1
                if on_push is not None:
                    on_push(state["seq"])
                seq._obj.value = state["seq"]
                return _lib.OK

            def attnstat_poll(self, c, ms):
                return _lib.OK

        stub = Stub()
        self.c._lib, self.c._push_ex, self.c._release_cb = stub, stub.attnstat_push_ex, True
        self.addCleanup(setattr, self.c, "_lib", real)
        return state

    def test_callback_error_never_escapes_a_sent_push(self):
        """A callback that raises inside push(): the push was sent, so it returns True and its GPU
        tensors are held; the error comes out of the next poll()."""
        def bad(*args):
            raise ZeroDivisionError("from a callback")
        self.c.on_rejected(bad)
        self._stub_lib(on_push=lambda seq: self.c._on_ack_c(None, 99, 0, 0, 3, b"refused"))
        q, k = CudaLike((1, 2, 8, 16)), CudaLike((1, 2, 8, 16))
        self.assertTrue(self.c.push(0, 0, q, k))
        self.assertEqual(sorted(self.c._held), [1])
        self.assertIs(self.c._held[1][0], q)
        with self.assertRaises(ZeroDivisionError):
            self.c.poll()
        self.c.poll()  # reported once

    def test_push_never_waits_for_a_busy_client(self):
        """While another thread holds the client's lock, push() returns False at once and counts
        the drop (dropped_busy) instead of waiting."""
        import threading
        held, release = threading.Event(), threading.Event()

        def holder():
            with self.c._lock:
                held.set()
                release.wait(5)

        t = threading.Thread(target=holder)
        t.start()
        try:
            held.wait(5)
            threading.Timer(2.0, release.set).start()
            q = randn(1, 1, 4, 8)
            t0 = time.monotonic()
            self.assertFalse(self.c.push(0, 0, q, q))
            self.assertLess(time.monotonic() - t0, 0.5, "push waited for the lock")
        finally:
            release.set()
            t.join()
        self.assertEqual(self.c.stats()["dropped_busy"], 1)

    def test_held_gpu_memory_is_detached_and_bounded(self):
        """What a zero-copy push keeps alive is the tensors' detach() (not their autograd graph),
        and at most held_bytes_max bytes / held_pushes_max pushes of it: beyond, GPU pushes are
        dropped (dropped_held) until Releases come back."""
        class GradTensor(FakeTensor):
            def detach(self):
                t = FakeTensor(self._a, self.dtype.name, self.device)
                t.detached_from = self
                return t

        c = attnstat.Client(socket=self.path, hello=False, lib=LIB, held_bytes_max=3000,
                            held_pushes_max=3)
        self.addCleanup(self.c.close)
        self.c = c
        state = self._stub_lib()
        gpu = FakeDevice("cuda", 0)
        q = GradTensor(randn(1, 2, 8, 16), device=gpu)             # 1 KiB
        k = GradTensor(randn(1, 2, 16, 16)[:, :, ::2], device=gpu)  # strided: spans 1984 bytes
        self.assertTrue(c.push(0, 0, q, k))
        h = c._held[1]
        self.assertIsNot(h[0], q)
        self.assertIs(h[0].detached_from, q)
        self.assertIs(h[1].detached_from, k)
        st = c.stats()
        self.assertEqual((st["held"], st["held_bytes"], st["dropped_held"]), (1, 1024 + 1984, 0))
        self.assertFalse(c.push(0, 1, q, k))  # over the byte budget: dropped, not sent
        self.assertEqual(state["pushes"], 1)
        self.assertEqual(c.stats()["dropped_held"], 1)
        c._on_release_c(None, 1)
        self.assertEqual(c.stats()["held_bytes"], 0)
        small = GradTensor(randn(1, 1, 4, 16), device=gpu)  # 256 bytes
        for layer in range(3):
            self.assertTrue(c.push(1, layer, small, small))
        self.assertFalse(c.push(1, 3, small, small))  # over the count
        self.assertEqual(c.stats()["dropped_held"], 2)
        self.assertEqual(c.stats()["held_bytes"], 3 * 512)
        self.assertTrue(c.push(1, 4, randn(1, 1, 4, 16), randn(1, 1, 4, 16)))  # host: unbounded
        c.close()
        self.assertEqual(c._held_bytes, 0)

    def test_the_last_reference_closes_the_connection(self):
        """A Client is in no reference cycle: dropping it closes the connection at once, without
        waiting for the garbage collector."""
        import gc
        import weakref
        first, _ = self.srv.accept()  # setUp's client
        gc.disable()
        try:
            c = attnstat.Client(socket=self.path, hello=False, lib=LIB)
            c.on_alert(lambda a: None, subscribe=False)
            conn, _ = self.srv.accept()
            ref = weakref.ref(c)
            del c
            self.assertIsNone(ref(), "the Client outlived its last reference")
        finally:
            gc.enable()
        conn.settimeout(5)
        try:
            while conn.recv(4096):
                pass  # until EOF: the library closed the socket
        finally:
            conn.close()
            first.close()

    def test_clients_left_at_interpreter_exit(self):
        code = ("import attnstat, threading\n"
                "c = attnstat.Client(socket=%r, hello=False)\n"
                "c.me = c\n"                                   # a cycle of the user's own
                "d = attnstat.Client(socket=%r, hello=False)\n"
                "threading.Thread(target=c.poll, args=(10000,), daemon=True).start()\n"
                % (self.path, self.path))
        env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "client", "python"),
                   ATTNSTAT_LIB=LIB._attnstat_path)
        r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                           timeout=30)
        self.assertEqual((r.returncode, r.stderr), (0, ""))

    def test_forked_child_leaves_the_connection_alone(self):
        q = randn(1, 1, 4, 8)
        pid = os.fork()
        if pid == 0:  # the child: its pushes fail clearly, its close() touches nothing
            code = 1
            try:
                self.c.push(0, 0, q, q)
            except attnstat.AttnstatError as e:
                code = 0 if (e.code == _lib.ESTATE and "fork" in str(e)) else 2
            self.c.close()
            os._exit(code)
        _, status = os.waitpid(pid, 0)
        self.assertEqual(os.waitstatus_to_exitcode(status), 0)
        self.assertFalse(self.c.closed)
        self.assertPushError(_lib.ESTATE, "hello", 0, 0, q, q)  # still ours, still connected

    def test_bad_thresholds(self):
        with self.assertRaises(attnstat.AttnstatError) as cm:
            attnstat.Client(socket=self.path, thresholds={"entropy_flor": 0.1}, lib=LIB)
        self.assertIn("unknown threshold", str(cm.exception))

    def test_thresholds_reach_the_hello(self):
        """Every threshold keyword (vocab.h's rows the hello carries, collapse_threshold) is sent
        in the Hello with its value: the Hello's bytes are decoded here by the field numbers of
        proto/attnstat.proto, so a keyword dropped on its way fails."""
        numbers = proto_fields("Thresholds")
        given = {}
        for row in vocab.THRESHOLDS:
            name = row["name"]
            if name in _lib.DAEMON_ONLY_THRESHOLDS:
                self.assertNotIn(name, numbers)
                with self.assertRaises(attnstat.AttnstatError) as cm:
                    attnstat.Client(socket=self.path, thresholds={name: 5}, lib=LIB)
                self.assertIn("unknown threshold", str(cm.exception))
                continue
            if row["type"] == "VOCAB_U":
                given[name] = int(RNG.integers(1, 1000))
            else:
                lo, hi = float(row["lo"]), min(float(row["hi"]), float(row["lo"]) + 1000.0)
                given[name] = float(lo + (hi - lo) * RNG.uniform(0.01, 0.99))
        given["collapse_threshold"] = float(RNG.uniform(0.01, 0.99))
        self.assertEqual(set(given), set(numbers))
        path = os.path.join(self.dir.name, "hello.sock")
        srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.addCleanup(srv.close)
        srv.bind(path)
        srv.listen(1)
        with self.assertRaises(attnstat.AttnstatError) as cm:  # nobody answers the Hello
            attnstat.Client(socket=path, run="th", thresholds=given, lib=LIB, timeout_s=0.3)
        self.assertEqual(cm.exception.code, _lib.ETIMEDOUT, str(cm.exception))
        conn, _ = srv.accept()
        self.addCleanup(conn.close)
        conn.settimeout(5)
        data = b"".join(iter(lambda: conn.recv(65536), b""))
        n = int.from_bytes(data[:4], "little")
        env = pb_fields(data[4:4 + n])
        hello = pb_fields(env[1])  # Envelope.hello
        sent = pb_fields(hello[7])  # Hello.thresholds
        for name, (kind, num) in numbers.items():
            self.assertIn(num, sent, "%s not in the Hello (sent %r)" % (name, given))
            got = struct.unpack("<d", sent[num])[0] if kind == "double" else sent[num]
            self.assertEqual(got, given[name], name)
        self.assertEqual(len(sent), len(numbers))

    def test_connect_error(self):
        with self.assertRaises(attnstat.AttnstatError) as cm:
            attnstat.Client(socket=self.path + ".nope", lib=LIB)
        self.assertEqual(cm.exception.code, _lib.ECONNECT)
        self.assertIn(self.path + ".nope", str(cm.exception))

    def test_closed_client(self):
        self.c.close()
        self.c.close()
        with self.assertRaises(attnstat.AttnstatError) as cm:
            self.c.push(0, 0, randn(1, 1, 2, 4), randn(1, 1, 2, 4))
        self.assertIn("closed", str(cm.exception))


@need_daemon
class TestEndToEnd(DaemonCase):
    def test_entropy_matches_float64_reference(self):
        run = self.run_name()
        # (dtype, layout, causal, B, Hq, Hkv, Nq, Nk, D, scale)
        cases = [
            (np.float32, "bhnd", False, 2, 4, 4, 33, 33, 16, None),
            (np.float32, "bnhd", True, 2, 6, 2, 17, 40, 32, None),
            (np.float16, "bhnd", True, 1, 4, 1, 29, 29, 64, None),
            (np.float16, "bnhd", False, 3, 2, 2, 8, 70, 16, 0.3),
            (np.float32, "bhnd", True, 2, 8, 4, 64, 64, 8, 0.7),
        ]
        refs = []
        with self.d.client(run, config={"test": "python"}) as c:
            self.assertGreater(c.run_id, 0)
            for layer, (dt, layout, causal, B, Hq, Hkv, Nq, Nk, D, scale) in enumerate(cases):
                q = randn(B, Hq, Nq, D, dtype=dt, scale=1.5)
                k = randn(B, Hkv, Nk, D, dtype=dt, scale=1.5)
                refs.append(reference_stats(q, k, causal=causal, scale=scale))
                if layout == "bnhd":  # hand them over as [B, N, H, D] arrays
                    q = np.ascontiguousarray(q.transpose(0, 2, 1, 3))
                    k = np.ascontiguousarray(k.transpose(0, 2, 1, 3))
                self.assertTrue(c.push(7, layer, q, k, causal=causal, scale=scale or 0.0,
                                       layout=layout))
            self.assertTrue(c.flush(30))
            st = c.stats()
            self.assertEqual((st["pushed"], st["acked"], st["rejected"]), (5, 5, 0), st)
        for layer, (dt, *_rest) in enumerate(cases):
            self.check_stored(run, 7, layer, refs[layer], 1e-6)

    def test_local_compute_leaves_host_pushes_alone(self):
        """local_compute=True changes CUDA pushes only (tests/gpu checks those): host tensors still
        go to the daemon's CPU worker, with the same values. A libattnstat without CUDA refuses
        the mode with the reason."""
        run = self.run_name()
        try:
            c = self.d.client(run, local_compute=True)
        except attnstat.AttnstatError as e:
            self.assertIn("built with CUDA", str(e))
            self.assertNotIn("+cuda", _lib.load().attnstat_version().decode())
            return
        with c:
            self.assertTrue(c.local_compute)
            q, k = randn(2, 4, 24, 16, scale=1.5), randn(2, 2, 24, 16, scale=1.5)
            self.assertTrue(c.push(3, 0, q, k, causal=True))
            self.assertTrue(c.flush(30))
            self.assertEqual(c.stats()["acked"], 1)
        self.check_stored(run, 3, 0, reference_stats(q, k, causal=True), 1e-6)

    def test_strided_views_and_packed_sequences(self):
        run = self.run_name()
        base_q, base_k = randn(2, 6, 40, 24), randn(2, 6, 50, 24)
        q, k = base_q[:, ::2, 3:31, 4:20], base_k[:, 1:4, ::2, 4:20]  # views, nothing copied
        self.assertFalse(q.flags.c_contiguous)
        ref_views = reference_stats(q, k, causal=True)
        pq, pk = randn(1, 3, 30, 16), randn(1, 3, 45, 16)
        cu_q, cu_k = [0, 10, 10, 30], [0, 15, 20, 45]  # the middle sequence has no query row
        ref_packed = reference_stats(pq, pk, causal=True, cu_q=cu_q, cu_k=cu_k)
        with self.d.client(run) as c:
            self.assertTrue(c.push(1, 0, q, k, causal=True))
            self.assertTrue(c.push(1, 1, pq, pk, causal=True, cu_seqlens_q=np.array(cu_q),
                                   cu_seqlens_k=cu_k))
            self.assertTrue(c.flush(30))
        self.check_stored(run, 1, 0, ref_views, 1e-6)
        self.check_stored(run, 1, 1, ref_packed, 1e-6)

    def test_row_sampling(self):
        run = self.run_name()
        q, k = randn(2, 3, 37, 16), randn(2, 3, 37, 16)
        with self.d.client(run) as c:
            self.assertTrue(c.push(2, 0, q, k, causal=True, sample_every=4))
            self.assertTrue(c.push(2, 1, q, k, sample_rows=5, seed=RNG.integers(1 << 62)))
            self.assertTrue(c.flush(30))
        self.check_stored(run, 2, 0, reference_stats(q, k, causal=True, every=4), 1e-6)
        got = self.d.samples(run, 2, 1)
        self.assertEqual([got[h]["rows"] for h in range(3)], [2 * 5] * 3)
        self.assertTrue(all(got[h]["sampled"] for h in range(3)))

    def test_results_callback_matches_store(self):
        run = self.run_name()
        got = []
        with self.d.client(run) as c:
            c.on_result(lambda seq, step, layer, heads: got.append((step, layer, heads)))
            q, k = randn(1, 3, 12, 16), randn(1, 3, 12, 16)
            self.assertTrue(c.push(4, 2, q, k, want_results=True))
            self.assertTrue(c.flush(30))
        self.assertEqual(len(got), 1)
        step, layer, heads = got[0]
        self.assertEqual((step, layer, len(heads)), (4, 2, 3))
        stored = self.d.samples(run, 4, 2)
        for h in heads:
            self.assertEqual(h["entropy_mean"], stored[h["head"]]["entropy_mean"])

    def test_status(self):
        with self.d.client(self.run_name()) as c:
            st = c.status()
        self.assertTrue(st["daemon_version"])
        self.assertGreaterEqual(st["clients"], 1)
        self.assertIsInstance(st["workers"], list)
        self.assertIsInstance(st["client_list"], list)
        self.assertIn(self.run_name(), [x["run"] for x in st["client_list"]])

    def test_alerts_reach_the_callback(self):
        run = self.run_name()
        alerts = []
        th = {"logit_ceiling": 5.0, "raise_after": 1, "clear_after": 1}
        with self.d.client(run, thresholds=th) as c:
            c.on_alert(alerts.append)
            q = randn(1, 2, 8, 16, scale=4.0)
            self.assertTrue(c.push(3, 0, q, q.copy()))  # q . q: logits far over 5
            self.assertTrue(c.flush(30))
            deadline = time.monotonic() + 10
            ceiling = []
            while len(ceiling) < 2 and time.monotonic() < deadline:  # one per head
                c.poll(100)
                ceiling = [a for a in alerts if a.rule == "logit_ceiling"]
        # (the entropy floor fires too: q . q makes every row attend to its own key)
        self.assertEqual(sorted(a.head for a in ceiling), [0, 1], alerts)
        a = ceiling[0]
        self.assertEqual((a.state, a.run, a.step, a.layer), ("raised", run, 3, 0))
        self.assertGreater(a.value, a.threshold)
        self.assertEqual(a.threshold, 5.0)

    def test_callback_errors_are_raised_after_the_call(self):
        with self.d.client(self.run_name()) as c:
            def bad(*args):
                raise ZeroDivisionError("from a callback")
            c.on_result(bad)
            c.push(0, 0, randn(1, 1, 4, 8), randn(1, 1, 4, 8), want_results=True)
            with self.assertRaises(ZeroDivisionError):
                c.flush(30)

    def test_monitor_pushes_through_data_ptr(self):
        """attnstat.torch.monitor with a real client, over a fake torch (NumPy-backed tensors)."""
        run = self.run_name()
        fake = FakeTorch(np_sdpa)
        try:
            F = fake.F
            qs = [randn(2, 4, 10, 16) for _ in range(2)]
            ks = [randn(2, 2, 10, 16) for _ in range(2)]
            with self.d.client(run) as c:
                with attnstat.torch.monitor(c, every=1, strict=True) as mon:
                    for step in range(2):
                        for layer in range(2):
                            q, k = FakeTensor(qs[layer]), FakeTensor(ks[layer])
                            F.scaled_dot_product_attention(q, k, k, is_causal=True,
                                                           enable_gqa=True)
                        mon.step()
                self.assertTrue(c.flush(30))
            self.assertEqual(mon.pushed, 4)
        finally:
            fake.restore()
        for step in range(2):
            for layer in range(2):
                self.check_stored(run, step, layer,
                                  reference_stats(qs[layer], ks[layer], causal=True), 1e-6)


# A trainer of one uid, a daemon of another: the packaged service runs as attnstat and admits the
# members of its group. libattnstat's host ring is created 0600 and, when the daemon's uid is
# another, given the daemon's group and made 0640 (a ring the daemon could not open once refused
# every such trainer at hello, GPU-only ones too).
CROSS_PUSHER = r"""
import json, sys
import numpy as np
sys.path.insert(0, sys.argv[1])
import attnstat
rng = np.random.default_rng()
c = attnstat.Client(socket=sys.argv[2], run=sys.argv[3], lib=sys.argv[4])
q = (rng.standard_normal((1, 2, 24, 16)) + 0.1).astype(np.float32)
k = (rng.standard_normal((1, 2, 24, 16)) + 0.1).astype(np.float32)
assert c.push(0, 0, q, k)
c.flush()
c.close()
json.dump({"q": q.tolist(), "k": k.tolist()}, sys.stdout)
"""


@unittest.skipIf(os.geteuid() != 0, "needs root to run the daemon and a trainer as two other uids")
@unittest.skipIf(LIB is None or DAEMON is None, "the library or the daemon is not built")
class TestAnotherUsersDaemon(DaemonCase):
    DAEMON_IDS = ["--reuid", "65534", "--regid", "65534", "--clear-groups"]
    TRAINER = ["--reuid", "4243", "--regid", "4243"]

    @classmethod
    def setUpClass(cls):
        gname = grp.getgrgid(65534).gr_name
        cls.d = Daemon(["--allow-group", gname], prefix=["setpriv"] + cls.DAEMON_IDS + ["--"])

    @classmethod
    def tearDownClass(cls):
        cls.d.stop()

    def push_as(self, groups, run):
        return subprocess.run(["setpriv"] + self.TRAINER + groups +
                              ["--", sys.executable, "-c", CROSS_PUSHER,
                               os.path.join(ROOT, "client", "python"), self.d.socket, run,
                               LIB._attnstat_path],
                              capture_output=True, text=True, timeout=60, cwd="/")

    def test_member_of_the_daemons_group_pushes(self):
        run = "cross-member-%d" % os.getpid()
        p = self.push_as(["--groups", "65534"], run)
        self.assertEqual(p.returncode, 0, p.stderr[-2000:] + "\n" + self.d.log_text())
        data = json.loads(p.stdout)
        q, k = np.array(data["q"], np.float32), np.array(data["k"], np.float32)
        self.check_stored(run, 0, 0, reference_stats(q, k), 1e-5)

    def test_outsider_is_refused_with_the_reason(self):
        p = self.push_as(["--clear-groups"], "cross-outsider-%d" % os.getpid())
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("permission denied", p.stderr)


@need_daemon
class TestDrops(DaemonCase):
    def test_pushes_drop_while_the_daemon_is_stopped(self):
        run = self.run_name()
        q, k = randn(1, 4, 256, 64), randn(1, 4, 256, 64)  # 256 KiB each
        with self.d.client(run, ring_bytes=2 << 20) as c:
            self.assertTrue(c.push(0, 0, q, k))
            self.assertTrue(c.flush(30))
            os.kill(self.d.proc.pid, signal.SIGSTOP)
            try:
                results = [c.push(1, layer, q, k) for layer in range(40)]
            finally:
                os.kill(self.d.proc.pid, signal.SIGCONT)
            self.assertIn(False, results)
            self.assertTrue(results[0])
            self.assertTrue(c.flush(60))
            st = c.stats()
        sent = results.count(True)
        self.assertEqual(st["pushed"], 41)
        self.assertEqual(st["dropped_local"], 40 - sent)
        self.assertGreater(st["dropped_ring"] + st["dropped_queue"], 0)
        self.assertEqual(st["acked"] + st["dropped_daemon"] + st["rejected"], sent + 1)
        self.assertEqual(st["in_flight"], 0)


    def test_flush_in_a_thread_does_not_stall_pushes(self):
        """A flush() waiting in another thread (the daemon stopped) does not hold the client's lock
        while it waits: the training thread's pushes return at once."""
        import threading
        q = randn(1, 2, 16, 16)
        with self.d.client(self.run_name()) as c:
            self.assertTrue(c.flush(30))
            os.kill(self.d.proc.pid, signal.SIGSTOP)
            try:
                self.assertTrue(c.push(0, 0, q, q))  # in flight: flush() has to wait
                out = []
                t = threading.Thread(target=lambda: out.append(c.flush(timeout_s=3)))
                t.start()
                time.sleep(0.2)
                slowest = 0.0
                for layer in range(20):
                    t0 = time.monotonic()
                    c.push(1, layer, q, q)
                    slowest = max(slowest, time.monotonic() - t0)
                    time.sleep(0.01)
                self.assertTrue(t.is_alive())
            finally:
                os.kill(self.d.proc.pid, signal.SIGCONT)
            t.join(60)
            self.assertFalse(t.is_alive())
            self.assertEqual(out, [True])
            self.assertLess(slowest, 0.25, "a push waited for the flushing thread")
            self.assertTrue(c.flush(30))


if __name__ == "__main__":
    unittest.main(verbosity=2)
