#!/usr/bin/env python3
"""test_python_unseen.py — attnstat.torch.monitor's check against a model it sees only in part:
the attention modules whose forward no door saw, counted by class and said once.

No PyTorch is needed: the modules are stand-ins with nn.Module's hook API (forward pre-hooks and
forward hooks, named_modules, modules); torch is the fake of tests/pyhelpers.py, whose
scaled_dot_product_attention is the door the watched layers go through. The real modules (an
nn.MultiheadAttention with weights, a timm-style Attention, a Llama) run in tests/gpu.
"""
import unittest
import warnings

from pyhelpers import FakeTensor, FakeTorch, np, np_sdpa, randn  # noqa: E402

import attnstat.torch  # noqa: E402
from test_python_monitor import DOOR_MODULES, FakeHandle, RecordingClient  # noqa: E402


class Module(object):
    """nn.Module's hook API, as much as the monitor uses."""

    def __init__(self, *children):
        self.children, self._pre, self._post = list(children), [], []

    def register_forward_pre_hook(self, fn):
        self._pre.append(fn)
        return FakeHandle(self._pre, fn)

    def register_forward_hook(self, fn):
        self._post.append(fn)
        return FakeHandle(self._post, fn)

    def named_modules(self, prefix=""):
        yield prefix, self
        for i, c in enumerate(self.children):
            yield from c.named_modules("%s%s%d" % (prefix, "." if prefix else "", i))

    def modules(self):
        return [m for _, m in self.named_modules()]

    def __call__(self, *args):
        for h in list(self._pre):
            h(self, args)
        out = self.forward(*args)
        for h in list(self._post):
            h(self, args, out)
        return out


class SdpaAttention(Module):
    """Attention through the sdpa door (looked up at call time, as module code does)."""

    def __init__(self, F):
        Module.__init__(self)
        self.F = F

    def forward(self, x):
        q = FakeTensor(randn(1, 2, 5, 8))
        return self.F.scaled_dot_product_attention(q, q, q, is_causal=True)


class ManualAttention(Module):
    """Attention written out (matmul, softmax): no door sees it."""

    def forward(self, x):
        s = randn(2, 5, 5)
        p = np.exp(s - s.max(-1, keepdims=True))
        return FakeTensor(p / p.sum(-1, keepdims=True))


class ChannelAttention(Module):
    def forward(self, x):
        return x


class AttentionBlock(Module):
    """A container whose class says attention too: the inner module is the one watched."""

    def forward(self, x):
        for c in self.children:
            x = c(x)
        return x


class Model(Module):
    def forward(self, x):
        for c in self.children:
            c(x)
        return x


class TestUnseen(unittest.TestCase):
    def setUp(self):
        self.fake = FakeTorch(np_sdpa, extra=DOOR_MODULES)
        self.F = self.fake.F

    def tearDown(self):
        attnstat.torch.uninstall()
        self.fake.restore()

    def run_model(self, model, steps=3, **kw):
        c = RecordingClient()
        with warnings.catch_warnings(record=True) as ws:
            warnings.simplefilter("always")
            with attnstat.torch.monitor(c, model=model, **kw) as mon:
                for _ in range(steps):
                    model(FakeTensor(randn(2, 3)))
        return mon, c, [str(w.message) for w in ws]

    def test_layers_no_door_sees_are_counted_and_said_once(self):
        """Two layers through SDPA, one written out and one inside a container: the two no door
        saw are counted at every forward, by class, and said once each; the seen ones are not."""
        manual = ManualAttention()
        model = Model(SdpaAttention(self.F), manual, AttentionBlock(ManualAttention()),
                      SdpaAttention(self.F))
        mon, c, msgs = self.run_model(model)
        self.assertEqual(len(c.calls), 2 * 3)
        self.assertEqual(mon.unseen_by, {"ManualAttention": 2 * 3})
        self.assertEqual(mon.stats()["unseen_by"], {"ManualAttention": 6})
        said = [m for m in msgs if "ManualAttention" in m]
        self.assertEqual(len(said), 1, msgs)
        self.assertIn("'1'", said[0])  # the first one's place in the model
        self.assertIn("check_modules=False", said[0])
        self.assertEqual(mon.blind, 0)  # the model is seen in part: not blind

    def test_container_is_not_watched_when_its_inner_module_is(self):
        """AttentionBlock holds the attention module: a forward of the block whose inner module
        goes through a door counts nothing, though the block's own code made no call."""
        model = Model(AttentionBlock(SdpaAttention(self.F), ChannelAttention()))
        mon, c, msgs = self.run_model(model, steps=2)
        self.assertEqual(len(c.calls), 2)
        self.assertEqual(mon.unseen_by, {"ChannelAttention": 2})  # innermost, named so: said

    def test_check_modules_false_and_hooks_removed(self):
        manual = ManualAttention()
        model = Model(SdpaAttention(self.F), manual)
        mon, c, msgs = self.run_model(model, check_modules=False)
        self.assertEqual(mon.unseen_by, {})
        self.assertEqual(manual._pre, [])
        mon, c, msgs = self.run_model(model)
        self.assertEqual(mon.unseen_by, {"ManualAttention": 3})
        # the monitor left and nothing was compiled: the hooks go with the doors
        self.assertEqual((manual._pre, manual._post), ([], []))
        model(FakeTensor(randn(2, 3)))  # outside a monitor: nothing counted, nothing raised
        self.assertEqual(mon.unseen_by, {"ManualAttention": 3})

    def test_a_layer_the_door_skips_is_seen(self):
        """A call a door skips (counted there, with its reason) is not also unseen."""
        class Float64Attention(SdpaAttention):
            def forward(self, x):
                q = FakeTensor(randn(1, 2, 5, 8).astype(np.float64))
                return self.F.scaled_dot_product_attention(q, q, q)
        model = Model(Float64Attention(self.F))
        mon, c, msgs = self.run_model(model, steps=2)
        self.assertEqual(mon.skipped_by, {"dtype": 2})
        self.assertEqual(mon.unseen_by, {})


if __name__ == "__main__":
    unittest.main(verbosity=2)
