#!/usr/bin/env python3
"""test_python_varlen.py — the 'varlen' door of attnstat.torch.monitor
(torch.nn.attention.varlen.varlen_attn, PyTorch 2.10 and later), against stand-ins with the two
signatures released: 2.10's (query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, is_causal,
return_aux) and the later one's (the same seven, then keyword-only return_aux, scale,
window_size, enable_gqa, seqused_k, block_table, num_splits). Each call must be pushed as one
packed batch [1, T, H, D] with its offsets, causal as either release says it, its scale and
window; what the daemon cannot describe (a paged KV cache, seqused_k) is skipped and counted;
a function imported by name into a model's module is seen. The real function runs in tests/gpu.
"""
import sys
import types
import unittest
import warnings

from pyhelpers import FakeTensor, FakeTorch, np, np_sdpa, randn  # noqa: E402

import attnstat.torch  # noqa: E402
from test_python_monitor import DOOR_MODULES, RecordingClient  # noqa: E402

HOME = "torch.nn.attention.varlen"


def install_varlen(later):
    """A stand-in module torch.nn.attention.varlen with the 2.10 (later=False) or the later
    signature; the calls it received are in .seen."""
    m = types.ModuleType(HOME)
    m.seen = []
    if later:
        def varlen_attn(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, *, return_aux=None,
                        scale=None, window_size=(-1, -1), enable_gqa=False, seqused_k=None,
                        block_table=None, num_splits=None, k_cache=None, v_cache=None,
                        cache_seqlens=None, cache_batch_idx=None, page_table=None):
            m.seen.append(query)
            return query
    else:
        def varlen_attn(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, is_causal=False,
                        return_aux=None):
            m.seen.append(query)
            return query
    m.varlen_attn = varlen_attn
    sys.modules[HOME] = m
    return m


class TestVarlenDoor(unittest.TestCase):
    def setUp(self):
        self.fake = FakeTorch(np_sdpa, extra=DOOR_MODULES + ("varlen_model",))
        self.names = list(attnstat.torch._calls._VARLEN_NAMES)

    def tearDown(self):
        attnstat.torch.uninstall()
        attnstat.torch._calls._VARLEN_NAMES[:] = self.names
        self.fake.restore()

    @staticmethod
    def packed(hq=4, hk=4):
        """q [10, Hq, 8], k [10, Hk, 8] (three sequences) and their offsets."""
        return (FakeTensor(randn(10, hq, 8)), FakeTensor(randn(10, hk, 8)),
                FakeTensor(np.array([0, 3, 7, 10], np.int32), "int32"))

    def run_monitor(self, calls, **mkw):
        c = RecordingClient()
        with warnings.catch_warnings(record=True) as ws:
            warnings.simplefilter("always")
            with attnstat.torch.monitor(c, **mkw) as mon:
                self.assertIn("varlen", mon.doors_open)
                calls()
        return c, mon, ws

    def check_push(self, call, q, k, cu):
        step, layer, qs, ks, kw = call
        self.assertEqual((qs, ks), ((1,) + q.shape, (1,) + k.shape))
        self.assertEqual(kw["layout"], "bnhd")
        self.assertIs(kw["cu_seqlens_q"], cu)
        self.assertIs(kw["cu_seqlens_k"], cu)
        return kw

    def test_release_2_10(self):
        """is_causal by position and by name; the pushed q and k are the call's own, packed as
        one batch."""
        m = install_varlen(later=False)
        q, k, cu = self.packed()

        def calls():
            m.varlen_attn(q, k, k, cu, cu, 4, 4, True)
            m.varlen_attn(q, k, k, cu, cu, 4, 4, is_causal=False)
        c, mon, _ = self.run_monitor(calls)
        self.assertEqual(len(m.seen), 2)
        self.assertEqual(len(c.calls), 2)
        kw = self.check_push(c.calls[0], q, k, cu)
        self.assertTrue(kw["causal"])
        self.assertNotIn("window", kw)
        self.assertFalse(self.check_push(c.calls[1], q, k, cu)["causal"])
        pq, pk = c.tensors[0]
        np.testing.assert_array_equal(pq.numpy()[0], q.numpy())
        np.testing.assert_array_equal(pk.numpy()[0], k.numpy())
        self.assertEqual(mon.skipped_by, {})

    def test_later_release(self):
        """window_size (-1, 0) is causal; (W, 0) a window; the scale; GQA's fewer key heads;
        a KV cache (paged, or k_cache / v_cache) and seqused_k skipped and counted, said once
        per kind."""
        m = install_varlen(later=True)
        q, k, cu = self.packed(hq=4, hk=2)

        def calls():
            m.varlen_attn(q, k, k, cu, cu, 4, 4, window_size=(-1, 0), scale=0.3)
            m.varlen_attn(q, k, k, cu, cu, 4, 4, window_size=(2, 0), enable_gqa=True)
            m.varlen_attn(q, k, k, cu, cu, 4, 4)
            m.varlen_attn(q, k, k, cu, cu, 4, 4, block_table=FakeTensor(
                np.zeros((3, 2), np.int32), "int32"))
            m.varlen_attn(q, k, k, cu, cu, 4, 4, seqused_k=FakeTensor(
                np.array([2, 3, 3], np.int32), "int32"))
            m.varlen_attn(q, k, k, cu, cu, 4, 4, k_cache=FakeTensor(randn(3, 8, 2, 8)),
                          v_cache=FakeTensor(randn(3, 8, 2, 8)))
        c, mon, ws = self.run_monitor(calls)
        self.assertEqual(len(m.seen), 6)
        self.assertEqual(len(c.calls), 3)
        kw = self.check_push(c.calls[0], q, k, cu)
        self.assertEqual((kw["causal"], kw["scale"]), (True, 0.3))
        self.assertNotIn("window", kw)
        kw = self.check_push(c.calls[1], q, k, cu)
        self.assertEqual((kw["causal"], kw["window"]), (False, (2, 0)))
        kw = self.check_push(c.calls[2], q, k, cu)
        self.assertEqual(kw["causal"], False)
        self.assertNotIn("window", kw)
        self.assertEqual(mon.skipped_by, {"paged": 2, "varlen-seqused": 1})
        said = [str(w.message) for w in ws]
        self.assertEqual(sum("KV cache" in s for s in said), 1)  # said once per kind
        self.assertEqual(sum("seqused_k" in s for s in said), 1)

    def test_imported_by_name_and_restored(self):
        """A model's module holding varlen_attn by name is patched while the monitor is
        active, and both get the original back after it."""
        m = install_varlen(later=True)
        orig = m.varlen_attn
        model_mod = types.ModuleType("varlen_model")
        model_mod.attend = m.varlen_attn  # from torch.nn.attention.varlen import ... as attend
        sys.modules["varlen_model"] = model_mod
        q, k, cu = self.packed()
        c, mon, _ = self.run_monitor(
            lambda: model_mod.attend(q, k, k, cu, cu, 4, 4, window_size=(-1, 0)),
            doors=["varlen"])
        self.assertEqual(len(c.calls), 1)
        self.assertTrue(c.calls[0][4]["causal"])
        attnstat.torch.uninstall()
        self.assertIs(m.varlen_attn, orig)
        self.assertIs(model_mod.attend, orig)

    def test_required_but_absent(self):
        """doors=['varlen'] on a torch without it: a clear error, not a monitor that sees
        nothing."""
        with self.assertRaises(ValueError) as e:
            with attnstat.torch.monitor(RecordingClient(), doors=["varlen"]):
                pass
        self.assertIn("PyTorch 2.10", str(e.exception))


if __name__ == "__main__":
    unittest.main(verbosity=2)
