#!/usr/bin/env python3
"""test_python_mha.py — the 'mha' door of attnstat.torch.monitor (nn.MultiheadAttention), against
a stand-in.

torch.nn.functional.multi_head_attention_forward(query, key, value, embed_dim_to_check,
num_heads, in_proj_weight, in_proj_bias, bias_k, bias_v, add_zero_attn, dropout_p,
out_proj_weight, out_proj_bias, training, key_padding_mask, need_weights, attn_mask,
use_separate_proj_weight, q_proj_weight, k_proj_weight, v_proj_weight, static_k, static_v,
average_attn_weights, is_causal) is played by a NumPy function with that signature and torch's
documented semantics: sequence-first tensors, masks with True = excluded (or float, added), the
weights by softmax where need_weights, else a call of scaled_dot_product_attention looked up in
torch.nn.functional at call time, as torch 2 makes it. Each pushed call is checked the strongest
way available without PyTorch: the softmax of the pushed q, k and mask, in float64, must be the
attention weights the module returned. The real nn.MultiheadAttention runs in tests/gpu.
"""
import math
import unittest
import warnings

from pyhelpers import FakeTensor, FakeTorch, np, np_sdpa, randn  # noqa: E402

import attnstat.torch  # noqa: E402
from test_python_monitor import DOOR_MODULES, RecordingClient  # noqa: E402


def np_linear(x, w, b=None):
    y = x._a.astype(np.float64) @ w._a.astype(np.float64).T
    if b is not None:
        y = y + b._a
    return FakeTensor(y.astype(x._a.dtype))


def _mha_bias(m, shape):
    """An MHA mask (bool True = excluded, or float) as an additive float64 array."""
    a = m._a
    if a.dtype == bool:
        return np.where(a, -np.inf, 0.0).reshape(shape)
    return a.astype(np.float64).reshape(shape)


def make_mha(F):
    """The stand-in, calling F.scaled_dot_product_attention (whatever is there at call time)."""
    def multi_head_attention_forward(query, key, value, embed_dim_to_check, num_heads,
                                     in_proj_weight, in_proj_bias, bias_k, bias_v, add_zero_attn,
                                     dropout_p, out_proj_weight, out_proj_bias, training=True,
                                     key_padding_mask=None, need_weights=True, attn_mask=None,
                                     use_separate_proj_weight=False, q_proj_weight=None,
                                     k_proj_weight=None, v_proj_weight=None, static_k=None,
                                     static_v=None, average_attn_weights=True, is_causal=False):
        x, kx, vx = (t._a.astype(np.float64) for t in (query, key, value))
        batched = x.ndim == 3
        if not batched:
            x, kx, vx = x[:, None], kx[:, None], vx[:, None]
        L, N, E = x.shape
        S, H = kx.shape[0], num_heads
        D = E // H
        if use_separate_proj_weight:
            wq, wk, wv = (w._a for w in (q_proj_weight, k_proj_weight, v_proj_weight))
        else:
            wq, wk, wv = np.split(in_proj_weight._a, 3)
        bq, bk, bv = (np.split(in_proj_bias._a, 3) if in_proj_bias is not None
                      else (0.0, 0.0, 0.0))
        q, k, v = x @ wq.T + bq, kx @ wk.T + bk, vx @ wv.T + bv
        q, k, v = (t.reshape(t.shape[0], N, H, D).transpose(1, 2, 0, 3) for t in (q, k, v))
        bias = np.zeros((N, H, L, S))
        if attn_mask is not None:
            bias = bias + _mha_bias(attn_mask, (1, 1, L, S) if attn_mask._a.ndim == 2
                                    else (N, H, L, S))
        if key_padding_mask is not None:
            bias = bias + _mha_bias(key_padding_mask, (N, 1, 1, S))
        if not need_weights:
            o = F.scaled_dot_product_attention(
                FakeTensor(q.astype(np.float32)), FakeTensor(k.astype(np.float32)),
                FakeTensor(v.astype(np.float32)),
                attn_mask=FakeTensor(bias.astype(np.float32)), dropout_p=dropout_p)
            return o, None
        s = q @ k.transpose(0, 1, 3, 2) / math.sqrt(D) + bias
        p = np.exp(s - s.max(-1, keepdims=True))
        p /= p.sum(-1, keepdims=True)
        w = p.mean(1) if average_attn_weights else p
        return (FakeTensor((p @ v).astype(np.float32)),
                FakeTensor((w if batched else w[0]).astype(np.float32)))
    return multi_head_attention_forward


def pushed_probs(q, k, kw):
    """float64 softmax of a pushed 'bnhd' call: [B, H, Nq, Nk]."""
    qa = q.numpy().astype(np.float64).transpose(0, 2, 1, 3)
    ka = k.numpy().astype(np.float64).transpose(0, 2, 1, 3)
    s = qa @ ka.transpose(0, 1, 3, 2) / math.sqrt(qa.shape[-1])
    m = kw.get("attn_mask")
    if m is not None:
        a = m.numpy()
        s = np.where(a, s, -np.inf) if a.dtype == bool else s + a
    p = np.exp(s - s.max(-1, keepdims=True))
    return p / p.sum(-1, keepdims=True)


class TestMhaDoor(unittest.TestCase):
    E, H = 16, 4

    def setUp(self):
        self.fake = FakeTorch(np_sdpa, extra=DOOR_MODULES)
        self.F = self.fake.F
        self.F.linear = np_linear
        self.F.multi_head_attention_forward = make_mha(self.F)
        self.fake.torch.zeros_like = lambda m, dtype=None: FakeTensor(
            np.zeros(m.shape, {"float32": np.float32, "float16": np.float16}[dtype.name]),
            dtype.name)
        E = self.E
        self.w = FakeTensor(randn(3 * E, E, scale=0.5))
        self.b = FakeTensor(randn(3 * E, scale=0.1))
        self.wo = FakeTensor(randn(E, E))

    def tearDown(self):
        self.fake.restore()

    def call(self, q, k, v, **kw):
        kw.setdefault("average_attn_weights", False)
        return self.F.multi_head_attention_forward(q, k, v, self.E, self.H, self.w, self.b, None,
                                                   None, False, 0.0, self.wo, None, **kw)

    def check(self, push, weights, n_rows=None):
        """The pushed call's float64 softmax is the module's attention weights."""
        q, k, kw = push
        self.assertEqual(kw["layout"], "bnhd")
        got = pushed_probs(q, k, kw)
        want = weights.numpy().astype(np.float64)
        if want.ndim == 3:  # unbatched [H, L, S]
            want = want[None]
        self.assertEqual(got.shape, want.shape)
        np.testing.assert_allclose(got, want, rtol=2e-5, atol=1e-6)

    def run_monitored(self, *calls, **mkw):
        c = RecordingClient()
        outs = []
        with warnings.catch_warnings(record=True):
            warnings.simplefilter("always")
            with attnstat.torch.monitor(c, **mkw) as mon:
                self.assertIn("mha", mon.doors_open)
                for args, kw in calls:
                    outs.append(self.call(*args, **kw))
        pushes = [(q, k, call[4]) for (q, k), call in zip(c.tensors, c.calls)]
        return mon, pushes, outs

    def test_self_attention(self):
        """query is key is value (torch's one packed projection): the pushed q and k are the
        projections, [N, L, H, D] views, and their softmax is the module's weights."""
        x = FakeTensor(randn(6, 2, self.E))
        mon, pushes, outs = self.run_monitored(((x, x, x), {}))
        self.assertEqual(len(pushes), 1)
        q, k, kw = pushes[0]
        self.assertEqual(q.shape, (2, 6, self.H, self.E // self.H))
        wq = self.w.numpy()[:self.E]
        want_q = x.numpy().astype(np.float64) @ wq.T + self.b.numpy()[:self.E]
        np.testing.assert_allclose(q.numpy().transpose(1, 0, 2, 3).reshape(6, 2, self.E), want_q,
                                   rtol=1e-5, atol=1e-6)
        self.assertNotIn("attn_mask", kw)
        self.check(pushes[0], outs[0][1])
        self.assertEqual(mon.skipped_by, {})

    def test_masks_in_mha_convention(self):
        """Bool masks (True = excluded) are inverted into SDPA's; a causal attn_mask [L, S] with
        a key_padding_mask [N, S], bool and float, and a per-head [N * H, L, S] float one: each
        call's softmax is the module's weights (excluded keys weigh 0)."""
        L, N, H = 5, 3, self.H
        x = FakeTensor(randn(L, N, self.E))
        causal = FakeTensor(np.triu(np.ones((L, L), bool), 1), "bool")
        pad = np.zeros((N, L), bool)
        pad[1, 3:] = True
        pad[2, 4:] = True
        kpm = FakeTensor(pad, "bool")
        kpm_f = FakeTensor(np.where(pad, -np.inf, 0.0).astype(np.float32))
        per_head = FakeTensor(randn(N * H, L, L))
        mon, pushes, outs = self.run_monitored(
            ((x, x, x), {"attn_mask": causal}),
            ((x, x, x), {"key_padding_mask": kpm}),
            ((x, x, x), {"attn_mask": causal, "key_padding_mask": kpm}),
            ((x, x, x), {"attn_mask": causal, "key_padding_mask": kpm_f}),
            ((x, x, x), {"attn_mask": per_head}))
        self.assertEqual(len(pushes), 5)
        for p, o in zip(pushes, outs):
            self.check(p, o[1])
        self.assertEqual(pushes[0][2]["attn_mask"].shape, (1, 1, L, L))
        self.assertEqual(pushes[1][2]["attn_mask"].shape, (N, 1, 1, L))
        self.assertEqual(str(pushes[2][2]["attn_mask"].dtype), "torch.bool")
        self.assertEqual(pushes[4][2]["attn_mask"].shape, (N, H, L, L))

    def test_cross_attention_and_separate_weights(self):
        """Keys from another sequence (key is value: torch's q, then kv projection; key is not
        value: three projections), separate projection weights with another key width (kdim),
        and an unbatched [L, E] call."""
        E = self.E
        x, mem, other = (FakeTensor(randn(4, 2, E)), FakeTensor(randn(7, 2, E)),
                         FakeTensor(randn(7, 2, E)))
        kdim = 10
        qw, kw_, vw = (FakeTensor(randn(E, E)), FakeTensor(randn(E, kdim)),
                       FakeTensor(randn(E, kdim)))
        mk = FakeTensor(randn(7, 2, kdim))
        u = FakeTensor(randn(5, E))
        mon, pushes, outs = self.run_monitored(
            ((x, mem, mem), {}), ((x, mem, other), {}),
            ((x, mk, mk), {"use_separate_proj_weight": True, "q_proj_weight": qw,
                           "k_proj_weight": kw_, "v_proj_weight": vw}),
            ((u, u, u), {}))
        self.assertEqual(len(pushes), 4)
        self.assertEqual(pushes[0][1].shape, (2, 7, self.H, E // self.H))
        for p, o in zip(pushes, outs):
            self.check(p, o[1])
        self.assertEqual(pushes[3][0].shape, (1, 5, self.H, E // self.H))

    def test_calls_without_weights_are_the_sdpa_doors(self):
        """need_weights=False: torch 2 computes through scaled_dot_product_attention, whose door
        pushes the call (once: 'bhnd', as SDPA has it), not this one."""
        x = FakeTensor(randn(6, 2, self.E))
        mon, pushes, outs = self.run_monitored(((x, x, x), {"need_weights": False}),
                                               ((x, x, x), {"need_weights": True}))
        self.assertEqual([p[2]["layout"] for p in pushes], ["bhnd", "bnhd"])
        self.assertEqual(pushes[0][0].shape, (2, self.H, 6, self.E // self.H))
        mon, pushes, outs = self.run_monitored(((x, x, x), {"need_weights": False}),
                                               doors=["mha"])
        self.assertEqual(pushes, [])  # the sdpa door not asked for: the call is not mha's

    def test_what_cannot_be_described_is_skipped(self):
        x = FakeTensor(randn(4, 2, self.E))
        bk = FakeTensor(randn(1, 1, self.E))
        c = RecordingClient()
        with warnings.catch_warnings(record=True) as ws:
            warnings.simplefilter("always")
            with attnstat.torch.monitor(c) as mon:
                self.F.multi_head_attention_forward(x, x, x, self.E, self.H, self.w, self.b, bk,
                                                    bk, False, 0.0, self.wo, None)
                self.F.multi_head_attention_forward(x, x, x, self.E, self.H, self.w, self.b, None,
                                                    None, True, 0.0, self.wo, None)
                self.call(x, x, x, attn_mask=FakeTensor(np.zeros((4, 4), np.int64), "int64"))
        self.assertEqual(c.calls, [])
        self.assertEqual(mon.skipped_by, {"mha-bias-kv": 1, "mha-zero-attn": 1, "mask-dtype": 1})
        self.assertTrue(any("bias_k" in str(w.message) for w in ws))

    def test_restored(self):
        orig = self.F.multi_head_attention_forward
        with attnstat.torch.monitor(RecordingClient()):
            self.assertIsNot(self.F.multi_head_attention_forward, orig)
        self.assertIs(self.F.multi_head_attention_forward, orig)


class TestBelowDynamo(unittest.TestCase):
    """torch.compile: Dynamo puts multi_head_attention_forward into its graph whole, and the
    graph's code calls it again by its qualified name (the door's wrapper) in AOTAutograd's
    tracing, below Dynamo, with fake tensors (a proxy or fake dispatch mode active,
    torch.compiler.is_compiling() False). There the sdpa door inside it must put its observation
    into the graph (not push fake tensors), and the 'mha' door, whose wrapper Dynamo traced and
    observed already, must stay quiet. The stand-in torch has the dispatch-mode query; the graph
    is a list of what the doors emitted."""
    E, H = TestMhaDoor.E, TestMhaDoor.H

    def setUp(self):
        import types
        from attnstat.torch import _op
        TestMhaDoor.setUp(self)
        self.modes, self.dynamo = {}, False
        T = self.fake.torch
        T._C = types.SimpleNamespace(
            _TorchDispatchModeKey=types.SimpleNamespace(PROXY="proxy", FAKE="fake"),
            _get_dispatch_mode=lambda key: self.modes.get(key))
        T.compiler = types.SimpleNamespace(is_compiling=lambda: self.dynamo)
        self.graph, self._op, self._emit = [], _op, _op.emit
        _op.emit = lambda torch, door, call, out: self.graph.append((door.name, call))

    def tearDown(self):
        self._op.emit = self._emit
        attnstat.torch.uninstall()
        TestMhaDoor.tearDown(self)

    def test_levels(self):
        from attnstat.torch import _install
        tracing = _install._tracer(self.fake.torch)
        self.assertEqual(tracing(), 0)
        self.modes["fake"] = object()
        self.assertEqual(tracing(), 2)
        self.dynamo = True
        self.assertEqual(tracing(), 1)
        del self.fake.torch._C  # a torch without the query: Dynamo's flag alone
        self.assertIs(_install._tracer(self.fake.torch), self.fake.torch.compiler.is_compiling)

    def test_doors_below_dynamo(self):
        from attnstat.torch import _calls
        x = FakeTensor(randn(5, 2, self.E))
        c = RecordingClient()
        with warnings.catch_warnings(record=True) as ws:
            warnings.simplefilter("always")
            with attnstat.torch.monitor(c) as mon:
                self.modes["proxy"] = object()
                TestMhaDoor.call(self, x, x, x, need_weights=False)  # the encoder layer's call
                self.assertEqual([d for d, _ in self.graph], ["sdpa"])
                self.assertIsInstance(self.graph[0][1], _calls.Call)
                out, w = TestMhaDoor.call(self, x, x, x)  # weights: Dynamo observed it
                self.assertIsNotNone(w)
                self.assertEqual(len(self.graph), 1)
                self.dynamo = True  # Dynamo tracing the wrapper: the call is noted there
                TestMhaDoor.call(self, x, x, x)
                self.assertEqual([d for d, _ in self.graph], ["sdpa", "mha"])
                self.assertEqual(self.graph[1][1].kind, "mha-compiled")
                self.modes.clear()
                self.dynamo = False  # eager again: pushed, nothing emitted
                TestMhaDoor.call(self, x, x, x)
        self.assertEqual(len(self.graph), 2)
        self.assertEqual((mon.pushed, mon.errors, len(c.calls)), (1, 0, 1), [str(w.message)
                                                                              for w in ws])


    def test_a_failure_below_dynamo_is_counted(self):
        """Below Dynamo the wrapper runs as real Python on fake tensors (AOTAutograd, or a fake
        tensor mode the program entered, e.g. a memory estimator): an observation that cannot
        be put into the graph is counted in errors and said once, and the call returns what the
        attention returned; under Dynamo itself the error is Dynamo's to handle."""
        def broken(torch, door, call, out):
            raise RuntimeError("no fake implementation here")
        self._op.emit = broken
        x = FakeTensor(randn(5, 2, self.E))
        with warnings.catch_warnings(record=True) as ws:
            warnings.simplefilter("always")
            with attnstat.torch.monitor(RecordingClient()) as mon:
                self.modes["fake"] = object()
                for _ in range(2):
                    out, _ = TestMhaDoor.call(self, x, x, x, need_weights=False)
                    self.assertIsNotNone(out)
                self.modes.clear()
                self.dynamo = True
                with self.assertRaises(RuntimeError):
                    TestMhaDoor.call(self, x, x, x, need_weights=False)
                self.dynamo = False
        self.assertEqual(mon.errors, 2)
        self.assertEqual(sum("no fake implementation" in str(w.message) for w in ws), 1)

if __name__ == "__main__":
    unittest.main(verbosity=2)
