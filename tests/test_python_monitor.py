#!/usr/bin/env python3
"""test_python_monitor.py — attnstat.torch.monitor and its doors, against stand-ins.

No PyTorch is needed: a fake `torch` package (NumPy-backed tensors, tests/pyhelpers.py) carries
scaled_dot_product_attention; stand-ins with the real signatures play flex_attention (torch 2.5+:
flex_attention(query, key, value, score_mod=None, block_mask=None, scale=None, enable_gqa=False,
...), create_mask), FlashAttention (flash_attn_func(q, k, v, dropout_p, softmax_scale, causal,
window_size, softcap, alibi_slopes, ...), flash_attn_varlen_func(q, k, v, cu_seqlens_q,
cu_seqlens_k, max_seqlen_q, max_seqlen_k, ...); the FlashAttention door's own tests are in
test_python_flash.py) and transformers (ALL_ATTENTION_FUNCTIONS and a
model whose config names its attention implementation, modules with layer_idx, a modeling module
with eager_attention_forward), none of which is installed on the test machines. The same doors
run against the real libraries on the GPU machine (tests/gpu). A recording client stands for
attnstat.Client: what each door pushes (shapes, layout, masks, options) is checked, and what it
cannot describe is skipped, counted and warned about once.
"""
import sys
import types
import unittest
import warnings

from pyhelpers import (FakeDevice, FakeDtype, FakeTensor, FakeTorch, np, np_sdpa,  # noqa: E402
                       randn)

import attnstat  # noqa: E402
import attnstat.torch  # noqa: E402
from attnstat import _lib, _tensor  # noqa: E402
from attnstat import _vocab as vocab  # noqa: E402

# Modules the doors look for: absent (or stand-ins) during each test, put back afterwards.
DOOR_MODULES = ("torch.nn.attention", "torch.nn.attention.flex_attention",
                "torch.nn.attention.varlen", "flash_attn",
                "flash_attn_interface", "transformers", "transformers.modeling_utils",
                "fake_modeling", "fa3_model")  # fa3_model: test_python_flash.py's


class FakeHandle(object):
    def __init__(self, hooks, fn):
        self.hooks, self.fn = hooks, fn

    def remove(self):
        self.hooks.remove(self.fn)


class FakeModule(object):
    def __init__(self):
        self._pre_hooks = []

    def register_forward_pre_hook(self, fn):
        self._pre_hooks.append(fn)
        return FakeHandle(self._pre_hooks, fn)

    def __call__(self, *args):
        for h in list(self._pre_hooks):
            h(self, args)
        return self.forward(*args)


class FakeModel(FakeModule):
    """n_layers attention calls per forward, through F.scaled_dot_product_attention looked up at
    call time (as nn.Module code does)."""

    def __init__(self, F, n_layers=3, heads=4, kv_heads=4, causal=True):
        FakeModule.__init__(self)
        self.F, self.n_layers, self.heads, self.kv_heads, self.causal = (F, n_layers, heads,
                                                                         kv_heads, causal)

    def forward(self, x):
        for _ in range(self.n_layers):
            q = FakeTensor(randn(2, self.heads, 6, 8))
            k = FakeTensor(randn(2, self.kv_heads, 6, 8))
            v = FakeTensor(randn(2, self.kv_heads, 6, 8))
            x = self.F.scaled_dot_product_attention(q, k, v, is_causal=self.causal,
                                                    enable_gqa=self.kv_heads != self.heads)
        return x


class RecordingClient(object):
    def __init__(self, fail=None):
        self.calls = []
        self.tensors = []  # (q, k) of each push
        self.fail = fail

    def push(self, step, layer, q, k, **kw):
        if self.fail is not None:
            raise self.fail
        _tensor.describe(q, "q")
        _tensor.describe(k, "k")
        self.calls.append((step, layer, tuple(q.shape), tuple(k.shape), kw))
        self.tensors.append((q, k))
        return True


class TestMonitor(unittest.TestCase):
    def setUp(self):
        self.fake = FakeTorch(np_sdpa, extra=DOOR_MODULES)
        self.F = self.fake.F

    def tearDown(self):
        self.fake.restore()

    def test_patches_and_restores(self):
        c = RecordingClient()
        orig = [np_sdpa]  # a list: a module attribute holding the original is patched too
        with attnstat.torch.monitor(c) as mon:
            self.assertIsNot(self.F.scaled_dot_product_attention, orig[0])
            self.assertIs(self.F.scaled_dot_product_attention.__wrapped__, orig[0])
            self.assertIn("active", repr(mon))
        self.assertIs(self.F.scaled_dot_product_attention, np_sdpa)
        with self.assertRaises(KeyError):
            with attnstat.torch.monitor(c):
                raise KeyError("boom")
        self.assertIs(self.F.scaled_dot_product_attention, np_sdpa)

    def test_wrapper_returns_the_original_result(self):
        q, k, v = (FakeTensor(randn(1, 2, 5, 4)) for _ in range(3))
        want = np_sdpa(q, k, v, is_causal=True)._a
        with attnstat.torch.monitor(RecordingClient()):
            got = self.F.scaled_dot_product_attention(q, k, v, is_causal=True)._a
        np.testing.assert_array_equal(got, want)

    def test_layers_steps_and_every(self):
        c = RecordingClient()
        model = FakeModel(self.F, n_layers=3)
        with attnstat.torch.monitor(c, every=2, sample_rows=16, seed=5) as mon:
            for _ in range(5):  # steps 0..4; 0, 2, 4 pushed
                model(None)
                mon.step()
        self.assertEqual([(s, l) for s, l, *_ in c.calls],
                         [(s, l) for s in (0, 2, 4) for l in range(3)])
        self.assertEqual(mon.calls, 15)
        self.assertEqual(mon.pushed, 9)
        kw = c.calls[0][4]
        self.assertTrue(kw["causal"])
        self.assertEqual((kw["sample_rows"], kw["seed"], kw["scale"]), (16, 5, 0.0))

    def test_stats_checked_at_creation_and_pushed(self):
        """stats= is checked when the monitor is made (ValueError listing the names, nothing
        installed, nothing pushed); what it asks goes with every push as the table's bits (bit
        i: row i of vocab.h's statistics); the defaults add nothing to a push."""
        c = RecordingClient()
        bits = {}
        for i, r in enumerate(vocab.STATS):
            bits[r["ask"]] = bits.get(r["ask"], 0) | 1 << i
        for bad in ("entropy_mean", ("sink_mass", "attention"), [], 1 << len(vocab.STATS)):
            with self.assertRaises(ValueError) as cm:
                attnstat.torch.monitor(c, stats=bad)
            if not isinstance(bad, int):
                for n in ("'entropy'", "'max_logit'", "'sink_mass'", "'distance'", "'all'"):
                    self.assertIn(n, str(cm.exception))
        self.assertIs(self.F.scaled_dot_product_attention, np_sdpa)
        model = FakeModel(self.F, n_layers=2)
        for stats, want in ((None, None), ("default", None),
                            ("all", (1 << len(vocab.STATS)) - 1),
                            ("sink_mass", bits["sink_mass"]),
                            (("default", "distance"),
                             bits["entropy"] | bits["max_logit"] | bits["distance"]),
                            (("entropy", "max_logit", "sink_mass", "distance"),
                             (1 << len(vocab.STATS)) - 1)):
            c.calls = []
            with attnstat.torch.monitor(c, stats=stats) as mon:
                model(None)
                mon.step()
            self.assertEqual(mon.pushed, 2)
            for call in c.calls:
                self.assertEqual(call[4].get("stats"), want, "stats=%r" % (stats,))

    def test_model_hook_counts_steps(self):
        c = RecordingClient()
        model = FakeModel(self.F, n_layers=2)
        with attnstat.torch.monitor(c, every=3, model=model, start_step=10) as mon:
            for _ in range(7):  # steps 10..16; 12 and 15 pushed
                model(None)
        self.assertEqual(model._pre_hooks, [])  # the hook is removed on exit
        self.assertEqual([(s, l) for s, l, *_ in c.calls], [(12, 0), (12, 1), (15, 0), (15, 1)])
        self.assertEqual(mon.current_step, 16)

    def test_gqa_scale_mask_and_3d(self):
        c = RecordingClient()
        model = FakeModel(self.F, n_layers=1, heads=8, kv_heads=2)
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            with attnstat.torch.monitor(c) as mon:
                model(None)
                mon.new_forward()
                q3 = FakeTensor(randn(3, 5, 8))
                self.F.scaled_dot_product_attention(q3, q3, q3, scale=0.25)
                q = FakeTensor(randn(1, 2, 4, 8))
                self.F.scaled_dot_product_attention(q, q, q, attn_mask=FakeTensor(randn(4, 4)))
                bm = FakeTensor(np.tril(np.ones((1, 1, 4, 4), bool)), "bool")
                self.F.scaled_dot_product_attention(q, q, q, attn_mask=bm)
                im = FakeTensor(np.ones((4, 4), np.int64), "int64")
                self.F.scaled_dot_product_attention(q, q, q, attn_mask=im)
                self.F.scaled_dot_product_attention(q, q, q, attn_mask=im)
        self.assertEqual(c.calls[0][2:4], ((2, 8, 6, 8), (2, 2, 6, 8)))
        self.assertEqual(c.calls[1][:4], (0, 0, (3, 1, 5, 8), (3, 1, 5, 8)))
        self.assertEqual(c.calls[1][4]["scale"], 0.25)
        self.assertNotIn("attn_mask", c.calls[1][4])
        # float and boolean masks are pushed as 4-D views [B|1, H|1, Nq, Nk]; an integer mask is not
        self.assertEqual(tuple(c.calls[2][4]["attn_mask"].shape), (1, 1, 4, 4))
        self.assertIs(c.calls[3][4]["attn_mask"], bm)
        self.assertEqual(len(c.calls), 4)
        self.assertEqual((mon.skipped, mon.skipped_by), (2, {"mask-dtype": 2}))
        self.assertEqual(len([x for x in w if "attn_mask" in str(x.message)]), 1)

    def test_push_failures_never_stop_training(self):
        err = attnstat.AttnstatError(_lib.EINVAL, "something odd")
        model = FakeModel(self.F, n_layers=2)
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            with attnstat.torch.monitor(RecordingClient(fail=err), model=model) as mon:
                model(None)
                model(None)
        self.assertEqual(mon.errors, 4)
        self.assertEqual(len(w), 1)
        with self.assertRaises(attnstat.AttnstatError):
            with attnstat.torch.monitor(RecordingClient(fail=err), model=model, strict=True):
                model(None)
        self.assertIs(self.F.scaled_dot_product_attention, np_sdpa)

    def test_any_push_exception_never_stops_training(self):
        """Not only AttnstatError: whatever a push raises (a callback's error, say) is counted and
        warned about once, unless strict."""
        model = FakeModel(self.F, n_layers=2)
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            with attnstat.torch.monitor(RecordingClient(fail=ZeroDivisionError("cb")),
                                        model=model) as mon:
                model(None)
                model(None)
        self.assertEqual(mon.errors, 4)
        self.assertEqual(len(w), 1)
        with self.assertRaises(ZeroDivisionError):
            with attnstat.torch.monitor(RecordingClient(fail=ZeroDivisionError("cb")),
                                        model=model, strict=True):
                model(None)

    def test_cuda_graph_capture_is_skipped(self):
        capturing = [True]
        sys.modules["torch"].cuda = types.SimpleNamespace(
            is_available=lambda: True, is_current_stream_capturing=lambda: capturing[0])
        c = RecordingClient()
        gpu = FakeDevice("cuda", 0)
        q = FakeTensor(randn(1, 2, 4, 8), device=gpu)
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            with attnstat.torch.monitor(c) as mon:
                self.F.scaled_dot_product_attention(q, q, q)
                self.F.scaled_dot_product_attention(q, q, q)
                capturing[0] = False
                self.F.scaled_dot_product_attention(q, q, q)
        self.assertEqual((mon.skipped, mon.pushed, len(c.calls)), (2, 1, 1))
        self.assertEqual(len([x for x in w if "graph" in str(x.message)]), 1)

    def test_extra_modules_and_later_wrappers(self):
        other = types.ModuleType("some_model_code")
        other.scaled_dot_product_attention = np_sdpa
        c = RecordingClient()
        with attnstat.torch.monitor(c, modules=[other]):
            q = FakeTensor(randn(1, 2, 4, 8))
            other.scaled_dot_product_attention(q, q, q)
            theirs = lambda *a, **kw: None  # noqa: E731  someone wraps after us
            self.F.scaled_dot_product_attention = theirs
        self.assertIs(other.scaled_dot_product_attention, np_sdpa)
        self.assertIs(self.F.scaled_dot_product_attention, theirs)  # not clobbered
        self.assertEqual(len(c.calls), 1)

    def test_layers_filter(self):
        c = RecordingClient()
        model = FakeModel(self.F, n_layers=4)
        with attnstat.torch.monitor(c, model=model, layers={1, 3}):
            model(None)
        self.assertEqual([l for _, l, *_ in c.calls], [1, 3])



# ---- stand-ins for the other doors -------------------------------------------------------------
class FakeBlockMask(object):
    """torch.nn.attention.flex_attention.BlockMask as the monitor reads it: shape and mask_mod."""

    def __init__(self, mask_mod, B, H, Q, KV):
        self.mask_mod, self.shape = mask_mod, (B, H, Q, KV)


def fake_create_mask(mod_fn, B, H, Q_LEN, KV_LEN, device="cuda"):
    """create_mask(mod_fn, B, H, Q_LEN, KV_LEN, device): mod_fn(b, h, q_idx, kv_idx) over a grid."""
    b, h, q, kv = np.meshgrid(np.arange(B), np.arange(H), np.arange(Q_LEN), np.arange(KV_LEN),
                              indexing="ij")
    return FakeTensor(np.asarray(mod_fn(b, h, q, kv), bool), "bool")


def install_flex():
    att = types.ModuleType("torch.nn.attention")
    fa = types.ModuleType("torch.nn.attention.flex_attention")

    def flex_attention(query, key, value, score_mod=None, block_mask=None, scale=None,
                       enable_gqa=False, return_lse=False, kernel_options=None):
        return value
    fa.flex_attention = flex_attention
    fa.create_mask = fake_create_mask
    att.flex_attention = fa
    sys.modules["torch.nn.attention"] = att
    sys.modules["torch.nn.attention.flex_attention"] = fa
    sys.modules["torch"].nn.attention = att
    return fa


def install_flash_attn():
    fl = types.ModuleType("flash_attn")

    def flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False,
                        window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                        deterministic=False, return_attn_probs=False):
        return q

    def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                               dropout_p=0.0, softmax_scale=None, causal=False,
                               window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                               deterministic=False, return_attn_probs=False, block_table=None):
        return q
    fl.flash_attn_func, fl.flash_attn_varlen_func = flash_attn_func, flash_attn_varlen_func
    sys.modules["flash_attn"] = fl
    return fl


class FakeHFAttention(FakeModule):
    """A transformers attention module: layer_idx, is_causal, and a forward that looks its
    attention function up at call time, as transformers' modeling code does."""

    def __init__(self, model, layer_idx, heads=4, kv_heads=2):
        FakeModule.__init__(self)
        self.model, self.layer_idx, self.is_causal = model, layer_idx, True
        self.heads, self.kv_heads = heads, kv_heads

    def forward(self, mask):
        q = FakeTensor(randn(2, self.heads, 6, 8))
        k = FakeTensor(randn(2, self.kv_heads, 6, 8))
        impl = self.model.config._attn_implementation
        fn = (sys.modules["fake_modeling"].eager_attention_forward if impl == "eager"
              else sys.modules["transformers.modeling_utils"].ALL_ATTENTION_FUNCTIONS[impl])
        return fn(self, q, k, k, mask, dropout=0.0, scaling=0.125)


class FakeHFModel(FakeModule):
    def __init__(self, impl, layer_ids=(5, 7)):
        FakeModule.__init__(self)
        self.config = types.SimpleNamespace(_attn_implementation=impl)
        self.layers = [FakeHFAttention(self, i) for i in layer_ids]

    def modules(self):
        return [self] + self.layers

    def forward(self, mask):
        for m in self.layers:
            m(mask)


def install_transformers(F):
    """transformers.modeling_utils.ALL_ATTENTION_FUNCTIONS (sdpa calls F's SDPA inside, as the
    real one does) and a modeling module with eager_attention_forward."""
    tr = types.ModuleType("transformers")
    mu = types.ModuleType("transformers.modeling_utils")

    def sdpa_attention_forward(module, query, key, value, attention_mask, dropout=0.0,
                               scaling=None, is_causal=None, **kwargs):
        return F.scaled_dot_product_attention(query, key, value, attn_mask=attention_mask,
                                              scale=scaling, enable_gqa=True), None

    def flash_attention_forward(module, query, key, value, attention_mask, dropout=0.0,
                                scaling=None, sliding_window=None, softcap=None, **kwargs):
        return query, None
    mu.ALL_ATTENTION_FUNCTIONS = {"sdpa": sdpa_attention_forward,
                                  "flash_attention_2": flash_attention_forward}
    modeling = types.ModuleType("fake_modeling")

    def eager_attention_forward(module, query, key, value, attention_mask, scaling, dropout=0.0,
                                **kwargs):
        return query, None
    modeling.eager_attention_forward = eager_attention_forward
    FakeHFAttention.__module__ = "fake_modeling"
    sys.modules.update({"transformers": tr, "transformers.modeling_utils": mu,
                        "fake_modeling": modeling})
    return mu, modeling


class RejectingClient(RecordingClient):
    def on_rejected(self, cb):
        self.rejected_cb = cb
        return cb


class TestDoors(unittest.TestCase):
    def setUp(self):
        self.fake = FakeTorch(np_sdpa, extra=DOOR_MODULES)
        self.F = self.fake.F

    def tearDown(self):
        self.fake.restore()

    def test_flex_block_masks_are_evaluated(self):
        fa = install_flex()
        orig = fa.flex_attention
        c = RecordingClient()
        q = FakeTensor(randn(2, 4, 6, 8))
        doc = np.array([0, 0, 0, 1, 1, 1])

        def causal(b, h, qi, ki):
            return qi >= ki

        def document(b, h, qi, ki):
            return (doc[qi] == doc[ki]) & (qi >= ki)
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            with attnstat.torch.monitor(c, mask_bytes_max=100) as mon:
                self.assertIn("flex", mon.doors_open)
                fa.flex_attention(q, q, q, block_mask=FakeBlockMask(causal, 1, 1, 6, 6))
                fa.flex_attention(q, q, q, block_mask=FakeBlockMask(document, 2, 1, 6, 6),
                                  scale=0.5)
                fa.flex_attention(q, q, q)
                fa.flex_attention(q, q, q, score_mod=lambda s, b, h, qi, ki: s)
                fa.flex_attention(q, q, q, block_mask=FakeBlockMask(causal, 2, 4, 6, 6))
        self.assertIs(fa.flex_attention, orig)
        self.assertEqual(len(c.calls), 3)
        m0 = c.calls[0][4]["attn_mask"]
        np.testing.assert_array_equal(m0._a[0, 0], np.tril(np.ones((6, 6), bool)))
        m1 = c.calls[1][4]["attn_mask"]
        self.assertEqual(tuple(m1.shape), (2, 1, 6, 6))
        self.assertFalse(m1._a[0, 0, 4, 1])   # another document
        self.assertTrue(m1._a[1, 0, 4, 3])
        self.assertEqual(c.calls[1][4]["scale"], 0.5)
        self.assertNotIn("attn_mask", c.calls[2][4])
        self.assertEqual(mon.skipped_by, {"flex-score_mod": 1, "flex-mask-size": 1})
        self.assertEqual(len([x for x in w if "score_mod" in str(x.message)]), 1)

    def _hf(self, impl, mask, n_forward=2, **kw):
        mu, modeling = install_transformers(self.F)
        regs = dict(mu.ALL_ATTENTION_FUNCTIONS)
        eager = modeling.eager_attention_forward
        c = RecordingClient()
        model = FakeHFModel(impl)
        with attnstat.torch.monitor(c, model=model, **kw) as mon:
            self.assertIn("transformers", mon.doors_open)
            for _ in range(n_forward):
                model(mask)
        self.assertEqual(mu.ALL_ATTENTION_FUNCTIONS, regs)  # restored
        self.assertIs(modeling.eager_attention_forward, eager)
        return c, mon

    def test_transformers_sdpa_layer_idx_and_no_double_count(self):
        mask = FakeTensor(np.tril(np.ones((2, 1, 6, 6), bool)), "bool")
        c, mon = self._hf("sdpa", mask)
        # one push per attention call (the inner SDPA door stays quiet), layers from layer_idx
        self.assertEqual([(s, l) for s, l, *_ in c.calls], [(0, 5), (0, 7), (1, 5), (1, 7)])
        self.assertEqual(mon.calls, 4)
        self.assertEqual(c.calls[0][2:4], ((2, 4, 6, 8), (2, 2, 6, 8)))  # GQA as given
        self.assertIs(c.calls[0][4]["attn_mask"], mask)
        self.assertFalse(c.calls[0][4]["causal"])
        self.assertEqual(c.calls[0][4]["scale"], 0.125)
        c, _ = self._hf("sdpa", None, n_forward=1)
        self.assertTrue(c.calls[0][4]["causal"])  # no mask: causal, as transformers' sdpa

    def test_transformers_eager_and_flash(self):
        add = FakeTensor(np.where(np.tril(np.ones((2, 1, 6, 6), bool)), 0.0,
                                  np.finfo(np.float32).min).astype(np.float32))
        c, _ = self._hf("eager", add, n_forward=1)
        self.assertEqual([l for _, l, *_ in c.calls], [5, 7])
        self.assertEqual(tuple(c.calls[0][4]["attn_mask"].shape), (2, 1, 6, 6))
        pad = FakeTensor(np.array([[1] * 6, [1] * 4 + [0] * 2], np.int64), "int64")
        c, _ = self._hf("flash_attention_2", pad, n_forward=1)
        kw = c.calls[0][4]
        self.assertTrue(kw["causal"])  # padding [B, N] -> key padding [B, 1, 1, N] + causal
        np.testing.assert_array_equal(kw["attn_mask"]._a[:, 0, 0, :], pad._a.astype(bool))
        c, _ = self._hf("flash_attention_2", None, n_forward=1)
        self.assertTrue(c.calls[0][4]["causal"])
        self.assertNotIn("attn_mask", c.calls[0][4])

    def test_rejections_are_counted_and_said_once_per_reason(self):
        c = RejectingClient()
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            with attnstat.torch.monitor(c) as mon:
                c.rejected_cb(1, 0, 3, 2, "work 34359738368 is over max_push_work 17179869184")
                c.rejected_cb(2, 0, 4, 2, "work 34359738369 is over max_push_work 17179869184")
                c.rejected_cb(3, 1, 0, 1, "dropped: the cpu worker's queue is full (64 of 64)")
        self.assertEqual(mon.rejected, 3)
        self.assertEqual(sorted(mon.rejected_by.values()), [1, 2])
        msgs = [str(x.message) for x in w if "did not store" in str(x.message)]
        self.assertEqual(len(msgs), 2)
        self.assertIn("BAD_REQUEST", msgs[0])
        self.assertIn("34359738368", msgs[0])  # the daemon's own words

    def test_autocast_dtype_is_passed(self):
        t = sys.modules["torch"]
        t.is_autocast_enabled = lambda dev: True
        t.get_autocast_dtype = lambda dev: "torch.bfloat16"
        c = RecordingClient()
        q32 = FakeTensor(randn(1, 2, 4, 8))
        q16 = FakeTensor(randn(1, 2, 4, 8).astype(np.float16))
        with attnstat.torch.monitor(c):
            self.F.scaled_dot_product_attention(q32, q32, q32)
            self.F.scaled_dot_product_attention(q16, q16, q16)
        with attnstat.torch.monitor(c, compute_dtype=None):
            self.F.scaled_dot_product_attention(q32, q32, q32)
        self.assertEqual(c.calls[0][4]["compute_dtype"], "bfloat16")
        self.assertNotIn("compute_dtype", c.calls[1][4])  # already in a 16-bit dtype
        self.assertNotIn("compute_dtype", c.calls[2][4])

    def test_max_logit_out_goes_with_a_layers_pushes(self):
        """qk_clip's device path: a layer given a buffer in monitor.max_logit_out has it passed
        with its CUDA pushes in local mode; one whose heads do not match, or a client not in
        local mode, goes without it, counted in max_out_refused and said once."""
        dev = FakeDevice("cuda", 0)
        c = RecordingClient()
        c.local_compute = True
        q = FakeTensor(randn(1, 4, 6, 8), device=dev)
        good = types.SimpleNamespace(shape=(4,), device=dev)
        bad = types.SimpleNamespace(shape=(3,), device=dev)
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            with attnstat.torch.monitor(c) as mon:
                mon.max_logit_out.update({0: good, 1: bad})
                for _ in range(2):
                    mon.new_forward()
                    self.F.scaled_dot_product_attention(q, q, q)  # layer 0
                    self.F.scaled_dot_product_attention(q, q, q)  # layer 1
            c.local_compute = False
            with attnstat.torch.monitor(c) as mon2:
                mon2.max_logit_out[0] = good
                self.F.scaled_dot_product_attention(q, q, q)
        self.assertEqual([kw.get("max_logit_out") for _, _, _, _, kw in c.calls],
                         [good, None, good, None, None])
        self.assertEqual((mon.max_out_refused, mon2.max_out_refused), (2, 1))
        said = [str(x.message) for x in w if "max logits on the device" in str(x.message)]
        self.assertEqual(len(said), 2)
        self.assertIn("4 query heads, the layer's projections 3", said[0])
        self.assertIn("not in local mode", said[1])

    def test_mixed_dtypes_are_rounded_as_autocast_rounds_them(self):
        """DeepSeek-V3 under autocast: q float32 (a float32 rotary part joined to it), k float16;
        the attention rounds both to autocast's dtype, and so does the monitor. Outside autocast
        the call is skipped and said once."""
        t = sys.modules["torch"]
        t.float16, t.float32 = FakeDtype("float16"), FakeDtype("float32")
        t.is_autocast_enabled = lambda dev: True
        t.get_autocast_dtype = lambda dev: "torch.float16"
        c = RecordingClient()
        q32 = FakeTensor(randn(1, 2, 4, 8, scale=3.0))
        k16 = FakeTensor(randn(1, 2, 4, 8).astype(np.float16))
        with attnstat.torch.monitor(c):
            self.F.scaled_dot_product_attention(q32, k16, k16)
            self.F.scaled_dot_product_attention(k16, q32, k16)
        self.assertEqual(len(c.tensors), 2)
        for (pq, pk), (q, k) in zip(c.tensors, ((q32, k16), (k16, q32))):
            self.assertEqual((str(pq.dtype), str(pk.dtype)), ("torch.float16",) * 2)
            np.testing.assert_array_equal(pq._a, q._a.astype(np.float16))
            np.testing.assert_array_equal(pk._a, k._a.astype(np.float16))
        t.is_autocast_enabled = lambda dev: False
        c = RecordingClient()
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            with attnstat.torch.monitor(c) as mon:
                self.F.scaled_dot_product_attention(q32, k16, k16)
                self.F.scaled_dot_product_attention(q32, k16, k16)
        self.assertEqual(c.calls, [])
        self.assertEqual(mon.skipped_by.get("dtype"), 2)
        said = [str(x.message) for x in w if "different dtypes" in str(x.message)]
        self.assertEqual(len(said), 1)
        self.assertIn("float32 and float16", said[0])


class FakeWeight(object):
    """A DTensor parameter as the layout detection reads it: placements, device_mesh, to_local;
    its shape is the whole tensor's (as a DTensor's), to_local()'s this process's shard."""

    def __init__(self, rows, placements, mesh):
        self.shape = (rows, 64)
        self.placements, self.device_mesh = placements, mesh
        for i, p in enumerate(placements):
            if p.is_shard():
                rows //= mesh.shape[i]
        self._local = (rows, 64)

    def to_local(self):
        return types.SimpleNamespace(shape=self._local)


class FakeShard(object):
    def __init__(self, dim):
        self.dim = dim

    def is_shard(self):
        return True


class FakeReplicate(object):
    def is_shard(self):
        return False


class FakeTPMesh(object):
    def __init__(self, names, shape, local):
        self.mesh_dim_names, self.shape, self._local = names, shape, local

    def _i(self, d):
        return d if isinstance(d, int) else self.mesh_dim_names.index(d)

    def get_local_rank(self, d):
        return self._local[self._i(d)]

    def size(self, d):
        return self.shape[self._i(d)]


class FakeTPModel(FakeModel):
    """A model whose attention module holds a q_proj (a DTensor shard, or a plain local weight)
    and whose configuration names its heads, as transformers' configurations do."""

    def __init__(self, F, heads_cfg, local_heads, weight_placements=None, mesh=None):
        FakeModel.__init__(self, F, n_layers=2, heads=local_heads, kv_heads=local_heads)
        self.config = types.SimpleNamespace(num_attention_heads=heads_cfg, hidden_size=heads_cfg * 8)
        w = (FakeWeight(heads_cfg * 8, weight_placements, mesh) if weight_placements is not None
             else types.SimpleNamespace(shape=(local_heads * 8, heads_cfg * 8)))
        self.q = types.SimpleNamespace(weight=w)

    def named_modules(self):
        return [("", self), ("layers.0.self_attn.q_proj", self.q)]


class TestJobsPeopleRun(unittest.TestCase):
    """What real jobs do that plain examples do not: attention functions imported by name (before
    the monitor starts, and in modules loaded while it runs), forward passes that see nothing,
    tensor-parallel shards, attention sinks, and compiled graphs that keep the doors."""

    def setUp(self):
        self.fake = FakeTorch(np_sdpa, extra=DOOR_MODULES + ("user_model", "late_model"))
        self.F = self.fake.F

    def tearDown(self):
        for name in ("user_model", "late_model"):
            sys.modules.pop(name, None)
        attnstat.torch.uninstall()
        self.fake.restore()

    def test_imported_by_name_is_found(self):
        fa = install_flex()
        user = types.ModuleType("user_model")
        user.sdpa = np_sdpa                       # from torch.nn.functional import ... as sdpa
        user.flex_attention = fa.flex_attention   # from ...flex_attention import flex_attention
        sys.modules["user_model"] = user
        orig_flex = fa.flex_attention
        c = RecordingClient()
        q = FakeTensor(randn(1, 2, 4, 8))
        with attnstat.torch.monitor(c) as mon:
            user.sdpa(q, q, q, is_causal=True)
            user.flex_attention(q, q, q)
            self.assertIs(user.sdpa, self.F.scaled_dot_product_attention)  # one wrapper
        self.assertEqual((mon.calls, mon.pushed), (2, 2))
        self.assertTrue(c.calls[0][4]["causal"])
        self.assertFalse(c.calls[1][4]["causal"])
        self.assertIs(user.flex_attention, orig_flex)  # put back on exit
        self.assertIs(user.sdpa, self.F.scaled_dot_product_attention)
        self.assertIs(user.sdpa, sys.modules["pyhelpers"].np_sdpa)

    def test_modules_loaded_while_active(self):
        """flash_attn imported after the monitor started, and a model module holding its
        function by name: both found before the next forward pass."""
        c = RecordingClient()
        model = FakeModel(self.F, n_layers=0)
        q = FakeTensor(randn(1, 6, 2, 8))
        with warnings.catch_warnings(record=True):
            warnings.simplefilter("always")
            with attnstat.torch.monitor(c, model=model) as mon:
                self.assertNotIn("flash_attn", mon.doors_open)
                fl = install_flash_attn()
                late = types.ModuleType("late_model")
                late.flash_attn_func = fl.flash_attn_func
                sys.modules["late_model"] = late
                model(None)                       # the pre-hook looks at the new modules
                late.flash_attn_func(q, q, q, causal=True)
                fl.flash_attn_func(q, q, q)
        self.assertEqual(mon.pushed, 2)
        self.assertEqual(c.calls[0][4]["layout"], "bnhd")
        self.assertTrue(c.calls[0][4]["causal"])

    def test_a_blind_forward_is_counted_and_said_once(self):
        c = RecordingClient()
        model = FakeModel(self.F, n_layers=0)      # its attention goes through no door
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            with attnstat.torch.monitor(c, model=model) as mon:
                for _ in range(3):
                    model(None)
        self.assertEqual((mon.blind, mon.stats()["blind"], mon.calls), (3, 3, 0))
        said = [str(x.message) for x in w if "saw no attention call" in str(x.message)]
        self.assertEqual(len(said), 1)
        self.assertIn("reduce-overhead", said[0])
        # a model that does reach attention is not blind, and a step without model= either
        model = FakeModel(self.F, n_layers=2)
        with attnstat.torch.monitor(c, model=model) as mon:
            model(None)
            model(None)
        self.assertEqual((mon.blind, mon.pushed), (0, 4))
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            with attnstat.torch.monitor(c) as mon:
                mon.step()
                mon.step()
        self.assertEqual(mon.blind, 2)
        self.assertEqual(len([x for x in w if "saw no attention" in str(x.message)]), 1)

    def test_a_forward_whose_calls_are_all_skipped_is_said(self):
        install_flex()
        fa = sys.modules["torch.nn.attention.flex_attention"]

        class FlexModel(FakeModule):
            def forward(self, x):
                q = FakeTensor(randn(1, 2, 4, 8))
                fa.flex_attention(q, q, q, score_mod=lambda s, b, h, i, j: s)
        model = FlexModel()
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            with attnstat.torch.monitor(RecordingClient(), model=model) as mon:
                model(None)
                model(None)
        self.assertEqual((mon.all_skipped, mon.blind, mon.pushed), (2, 0, 0))
        said = [str(x.message) for x in w if "was skipped" in str(x.message)
                and "every attention call" in str(x.message)]
        self.assertEqual(len(said), 1)
        self.assertIn("flex-score_mod", said[0])

    def test_compiled_graphs_keep_the_doors(self):
        """Once a compiled graph holds a door's operator (its fake implementation ran), leaving
        the monitor keeps the doors, the same objects, so that the graph's guards hold: a new
        monitor recompiles nothing. uninstall() puts the originals back."""
        c = RecordingClient()
        model = FakeModel(self.F, n_layers=1)
        with attnstat.torch.monitor(c, model=model):
            w = self.F.scaled_dot_product_attention
            hooks = list(model._pre_hooks)
            attnstat.torch._install.STATE.traced = True   # what the fake implementation records
        self.assertIs(self.F.scaled_dot_product_attention, w)   # transparent now
        self.assertEqual(model._pre_hooks, hooks)
        model(None)
        self.assertEqual(len(c.calls), 0)                 # no monitor: nothing pushed
        with attnstat.torch.monitor(c, model=model, every=2) as mon:
            self.assertIs(self.F.scaled_dot_product_attention, w)
            self.assertEqual(model._pre_hooks, hooks)
            model(None)
            model(None)
            model(None)
        self.assertEqual([s for s, *_ in c.calls], [0, 2])
        self.assertEqual(mon.calls, 3)
        with self.assertRaises(RuntimeError):               # one monitor at a time
            with attnstat.torch.monitor(c):
                with attnstat.torch.monitor(c):
                    pass
        attnstat.torch.uninstall()
        self.assertIs(self.F.scaled_dot_product_attention, np_sdpa)
        self.assertEqual(model._pre_hooks, [])

    def test_the_compiled_operator_at_run_time(self):
        """What attnstat::observe does when a compiled graph calls it: the call pushed with the
        options traced into the graph, layers by call order, every honoured at run time; under a
        model compiled with CUDA graphs, skipped and said; with no monitor, nothing."""
        from attnstat.torch import _install
        c = RecordingClient()
        q = FakeTensor(randn(1, 2, 4, 8))
        args = (None, None, None, None, "sdpa", -1, 0, True, 0.125, -1, -1, 0.0, "bhnd", "")
        with attnstat.torch.monitor(c, every=2) as mon:
            for step in range(3):
                mon._observe_compiled(q, q, *args)
                mon._observe_compiled(q, q, *args)
                mon.step()
            _install.STATE.cudagraphs = True
            with warnings.catch_warnings(record=True) as w:
                warnings.simplefilter("always")
                mon.step()
                mon._observe_compiled(q, q, *args)
        self.assertEqual([(s, l) for s, l, *_ in c.calls], [(0, 0), (0, 1), (2, 0), (2, 1)])
        self.assertEqual((c.calls[0][4]["scale"], c.calls[0][4]["causal"]), (0.125, True))
        self.assertEqual((mon.compiled_calls, mon.pushed, mon.skipped_by), (7, 4, {"graph": 1}))
        self.assertTrue(any("reduce-overhead" in str(x.message) for x in w))
        mon._observe_compiled(q, q, *args)  # after exit: nothing
        self.assertEqual(mon.compiled_calls, 7)

    def test_tensor_parallel_shards(self):
        """layout='auto' reads DTensor placements of q_proj; a shard no layout explains refuses
        to start."""
        mesh = FakeTPMesh(("tp",), (4,), (2,))
        model = FakeTPModel(self.F, 16, 4, (FakeShard(0),), mesh)
        c = RecordingClient()
        c.layout = None
        got = {}
        c.set_layout = got.update
        with attnstat.torch.monitor(c, model=model) as mon:
            model(None)
        self.assertEqual((got["tp_rank"], got["tp_size"]), (2, 4))
        self.assertEqual(mon.stats()["layout"]["tp_size"], 4)
        self.assertEqual(mon.pushed, 2)
        # the same shard as plain tensors: nothing says how the heads were split
        model = FakeTPModel(self.F, 16, 4)
        with self.assertRaises(ValueError) as cm:
            with attnstat.torch.monitor(c, model=model):
                pass
        self.assertIn("16 attention heads", str(cm.exception))
        self.assertIn("holds 4", str(cm.exception))
        self.assertIs(self.F.scaled_dot_product_attention, np_sdpa)  # nothing left installed
        with attnstat.torch.monitor(c, model=model, layout={"tp_rank": 1, "tp_size": 4}) as mon:
            model(None)
        self.assertEqual(mon.pushed, 2)
        # FSDP's Shard(0) beside TP's: the dimension named 'tp' is tensor parallelism
        mesh = FakeTPMesh(("dp_shard", "tp"), (2, 4), (1, 3))
        model = FakeTPModel(self.F, 16, 4, (FakeShard(0), FakeShard(0)), mesh)
        with attnstat.torch.monitor(c, model=model):
            pass
        self.assertEqual((got["tp_rank"], got["tp_size"], got["dp_rank"], got["dp_size"]),
                         (3, 4, 1, 2))
        # transformers' tp_plan with plain local weights: the device mesh it keeps on the model
        model = FakeTPModel(self.F, 16, 8)
        model._device_mesh = FakeTPMesh(("tp",), (2,), (1,))
        model._tp_plan = {"layers.*.self_attn.q_proj": "colwise"}
        got.clear()
        with attnstat.torch.monitor(c, model=model) as mon:
            model(None)
        self.assertEqual((got["tp_rank"], got["tp_size"], mon.pushed), (1, 2, 2))
        # replicated projections: no tensor parallelism, and the heads are all here
        model = FakeTPModel(self.F, 16, 16, (FakeReplicate(),), FakeTPMesh(("dp",), (2,), (0,)))
        got.clear()
        with attnstat.torch.monitor(c, model=model):
            pass
        self.assertNotIn("tp_size", got)

    def test_heads_checked_at_every_transformers_call(self):
        """A transformers call whose heads are not the configuration's over tp_size is skipped
        and said, never stored as the whole layer."""
        mu, _ = install_transformers(self.F)
        model = FakeHFModel("sdpa")
        for m in model.layers:
            m.config = types.SimpleNamespace(num_attention_heads=8)
        c = RecordingClient()
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            with attnstat.torch.monitor(c, model=model) as mon:
                model(None)
        self.assertEqual((mon.pushed, mon.skipped_by), (0, {"heads": 2}))
        self.assertTrue(any("tp_size" in str(x.message) for x in w))
        for m in model.layers:
            m.config = types.SimpleNamespace(num_attention_heads=4)
        with attnstat.torch.monitor(c, model=model) as mon:
            model(None)
        self.assertEqual(mon.pushed, 2)

    def test_sinks_are_pushed_with_the_call(self):
        mu, _ = install_transformers(self.F)
        model = FakeHFModel("sdpa")
        sinks = FakeTensor(randn(4))
        sinks.detach = lambda: sinks

        def with_sinks(module, query, key, value, attention_mask, **kw):
            return query, None
        mu.ALL_ATTENTION_FUNCTIONS["sdpa"] = with_sinks
        for m in model.layers:
            m.forward = (lambda mod: lambda mask: mu.ALL_ATTENTION_FUNCTIONS["sdpa"](
                mod, FakeTensor(randn(2, 4, 6, 8)), FakeTensor(randn(2, 2, 6, 8)), None, None,
                scaling=0.125, s_aux=sinks))(m)
        c = RecordingClient()
        with attnstat.torch.monitor(c, model=model) as mon:
            model(None)
        self.assertEqual(mon.pushed, 2)
        self.assertIs(c.calls[0][4]["sinks"], sinks)
        bad = FakeTensor(randn(3))
        bad.detach = lambda: bad
        for m in model.layers:
            m.forward = (lambda mod: lambda mask: mu.ALL_ATTENTION_FUNCTIONS["sdpa"](
                mod, FakeTensor(randn(2, 4, 6, 8)), FakeTensor(randn(2, 2, 6, 8)), None, None,
                s_aux=bad))(m)
        with warnings.catch_warnings(record=True):
            warnings.simplefilter("always")
            with attnstat.torch.monitor(c, model=model) as mon:
                model(None)
        self.assertEqual(mon.skipped_by, {"sinks-shape": 2})


if __name__ == "__main__":
    unittest.main(verbosity=2)
