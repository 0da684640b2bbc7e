#!/usr/bin/env python3
"""test_python_flash.py — the 'flash_attn' door of attnstat.torch.monitor, against stand-ins.

FlashAttention 2 (flash_attn: flash_attn_func(q, k, v, dropout_p, softmax_scale, causal,
window_size, softcap, alibi_slopes, ...), flash_attn_varlen_func(q, k, v, cu_seqlens_q,
cu_seqlens_k, max_seqlen_q, max_seqlen_k, ...)) and FlashAttention 3 (flash_attn_interface, its
Hopper build: flash_attn_func(q, k, v, softmax_scale, causal, qv, q/k/v_descale, window_size,
attention_chunk, softcap, ...), flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k,
max_seqlen_q, max_seqlen_k, seqused_q, seqused_k, softmax_scale, causal, ...), and an earlier
release without qv and attention_chunk). Neither library is installed on the test machines (nor,
FlashAttention 3, on the GPU machine); the stand-ins have their signatures. The fakes of torch and
the recording client are test_python_monitor.py's.
"""
import sys
import types
import unittest
import warnings

from pyhelpers import FakeTensor, FakeTorch, np, np_sdpa, randn  # noqa: E402

import attnstat.torch  # noqa: E402
from test_python_monitor import DOOR_MODULES, RecordingClient, install_flash_attn  # noqa: E402


def install_flash_attn3(old=False):
    """FlashAttention 3's flash_attn_interface (its Hopper build): the current release's
    signatures, or (old=True) an earlier one's, without qv and attention_chunk, so that the same
    position holds another argument."""
    fl = types.ModuleType("flash_attn_interface")
    if old:
        def flash_attn_func(q, k, v, softmax_scale=None, causal=False, q_descale=None,
                            k_descale=None, v_descale=None, window_size=(-1, -1), softcap=0.0,
                            num_splits=1, pack_gqa=None, deterministic=False, sm_margin=0):
            return q
    else:
        def flash_attn_func(q, k, v, softmax_scale=None, causal=False, qv=None, q_descale=None,
                            k_descale=None, v_descale=None, window_size=(-1, -1),
                            attention_chunk=0, softcap=0.0, num_splits=1, pack_gqa=None,
                            deterministic=False, sm_margin=0, return_attn_probs=False):
            return q

    def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                               seqused_q=None, seqused_k=None, softmax_scale=None, causal=False,
                               qv=None, q_descale=None, k_descale=None, v_descale=None,
                               window_size=(-1, -1), attention_chunk=0, softcap=0.0, num_splits=1,
                               pack_gqa=None, deterministic=False, sm_margin=0,
                               return_attn_probs=False):
        return q
    for f in (flash_attn_func, flash_attn_varlen_func):
        f.__module__ = "flash_attn_interface"
    fl.flash_attn_func, fl.flash_attn_varlen_func = flash_attn_func, flash_attn_varlen_func
    sys.modules["flash_attn_interface"] = fl
    return fl


class TestFlashDoor(unittest.TestCase):
    def setUp(self):
        self.fake = FakeTorch(np_sdpa, extra=DOOR_MODULES)
        self.F = self.fake.F
        # the FA3 parameter names an installed stand-in set (the older release's) do not outlive
        # the test
        self.fa3_names = dict(attnstat.torch._calls._FA3_NAMES)

    def tearDown(self):
        attnstat.torch._calls._FA3_NAMES.update(self.fa3_names)
        self.fake.restore()

    @staticmethod
    def tensors():
        """q [B, N, H, D], a packed [total, H, D] and its cu_seqlens (two sequences)."""
        return (FakeTensor(randn(2, 6, 4, 8)), FakeTensor(randn(10, 4, 8)),
                FakeTensor(np.array([0, 4, 10], np.int32), "int32"))

    def test_flash_attn_both_functions(self):
        fl = install_flash_attn()
        c = RecordingClient()
        q, packed, cu = self.tensors()
        with warnings.catch_warnings(record=True):
            warnings.simplefilter("always")
            with attnstat.torch.monitor(c) as mon:
                fl.flash_attn_func(q, q, q, 0.0, 0.25, True, (3, 0), 30.0)
                fl.flash_attn_func(q, q, q, causal=False)
                fl.flash_attn_varlen_func(packed, packed, packed, cu, cu, 6, 6, causal=True)
                fl.flash_attn_func(q, q, q, alibi_slopes=FakeTensor(randn(4)))
        self.assertEqual(len(c.calls), 3)
        kw = c.calls[0][4]
        self.assertEqual((kw["layout"], kw["causal"], kw["scale"], kw["window"], kw["softcap"]),
                         ("bnhd", True, 0.25, (3, 0), 30.0))
        self.assertNotIn("window", c.calls[1][4])
        self.assertEqual(c.calls[2][2], (1, 10, 4, 8))
        self.assertIs(c.calls[2][4]["cu_seqlens_q"], cu)
        self.assertEqual(mon.skipped_by, {"alibi": 1})

    def test_flash_attn3_interface(self):
        """FlashAttention 3 (flash_attn_interface) alone, without flash_attn: its own argument
        order (softmax_scale third, no dropout_p), its arguments that cannot be described
        skipped, and a function held by name in a model's module described as FA3's."""
        fl = install_flash_attn3()
        model_mod = types.ModuleType("fa3_model")
        model_mod.attend = fl.flash_attn_func  # from flash_attn_interface import ... as attend
        sys.modules["fa3_model"] = model_mod
        c = RecordingClient()
        q, packed, cu = self.tensors()
        with warnings.catch_warnings(record=True):
            warnings.simplefilter("always")
            with attnstat.torch.monitor(c, doors=["flash_attn"]) as mon:
                self.assertIn("flash_attn", mon.doors_open)
                fl.flash_attn_func(q, q, q, 0.25, True)
                fl.flash_attn_func(q, q, q, causal=True, window_size=(3, 0), softcap=30.0)
                fl.flash_attn_varlen_func(packed, packed, packed, cu, cu, 6, 6, causal=True)
                model_mod.attend(q, q, q, 0.5, False)
                fl.flash_attn_func(q, q, q, qv=FakeTensor(randn(2, 6, 4, 8)))
                fl.flash_attn_func(q, q, q, causal=True, attention_chunk=4)
                fl.flash_attn_varlen_func(packed, packed, packed, cu, cu, 6, 6,
                                          seqused_k=FakeTensor(np.array([3, 5], np.int32),
                                                               "int32"))
        self.assertEqual(len(c.calls), 4)
        kw = c.calls[0][4]
        self.assertEqual((kw["layout"], kw["causal"], kw["scale"]), ("bnhd", True, 0.25))
        self.assertNotIn("window", kw)
        self.assertEqual((c.calls[1][4]["window"], c.calls[1][4]["softcap"]), ((3, 0), 30.0))
        self.assertEqual(c.calls[2][2], (1, 10, 4, 8))
        self.assertIs(c.calls[2][4]["cu_seqlens_q"], cu)
        self.assertTrue(c.calls[2][4]["causal"])
        self.assertEqual((c.calls[3][4]["scale"], c.calls[3][4]["causal"]), (0.5, False))
        self.assertEqual(mon.skipped_by, {"fa3-qv": 1, "fa3-chunk": 1, "fa3-seqused": 1})

    def test_flash_attn3_older_signature_by_position(self):
        """An earlier FlashAttention 3 whose window_size sits one place earlier: read by the
        installed function's own parameter names, not the current release's."""
        fl = install_flash_attn3(old=True)
        c = RecordingClient()
        q = FakeTensor(randn(1, 5, 2, 8))
        with attnstat.torch.monitor(c):
            fl.flash_attn_func(q, q, q, None, True, None, None, None, (2, 0), 20.0)
        self.assertEqual(len(c.calls), 1)
        kw = c.calls[0][4]
        self.assertEqual((kw["causal"], kw["window"], kw["softcap"]), (True, (2, 0), 20.0))


if __name__ == "__main__":
    unittest.main(verbosity=2)
