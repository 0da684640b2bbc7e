#!/usr/bin/env python3
"""attnstat's QK-Clip rule (client/python/attnstat/_qkclip.py) against a NumPy reference: the
factors themselves, and what they do to a layer's logits when its projection rows are scaled by
them (multi-head, grouped and multi-query attention, multi-head latent attention's parts and
fused q/k/v projections, fresh random weights each run); and
attnstat.torch.qk_clip's bookkeeping (which rows, which results, once each) on a NumPy-backed
stand-in of the few torch calls it makes (tests/gpu test_22 runs it on a real model)."""
import contextlib
import math
import os
import sys
import types
import unittest

try:
    import numpy as np
except ImportError:
    print("test_python_qkclip: NumPy is not installed; skipped")
    sys.exit(77)

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "client", "python"))
from attnstat._qkclip import qk_clip_factors  # noqa: E402
from attnstat.torch._qkclip import qk_clip  # noqa: E402

SEED = int(os.environ.get("ATTNSTAT_TEST_SEED", int.from_bytes(os.urandom(4), "little")))
print("test_python_qkclip: seed %d" % SEED)


def reference(s, tau, group):
    """The rule written with NumPy arrays: gamma per head, the group's largest for the keys."""
    s = np.asarray(s, dtype=np.float64)
    gamma = np.ones_like(s)
    over = np.isfinite(s) & (s > tau)
    gamma[over] = tau / s[over]
    k = np.sqrt(gamma.reshape(-1, group).max(axis=1))
    q = gamma / np.repeat(k, group)
    return q, k


def head_max_logits(wq, wk, x, heads, group, d):
    """Each query head's max logit over every (query, key) pair of x: (x wq_h)(x wk_g)^T / sqrt(d)."""
    q = (x @ wq.T).reshape(len(x), heads, d)
    k = (x @ wk.T).reshape(len(x), heads // group, d)
    return np.array([(q[:, h] @ k[:, h // group].T).max() / math.sqrt(d) for h in range(heads)])


class TestRule(unittest.TestCase):
    def setUp(self):
        self.rng = np.random.default_rng(SEED)

    def test_against_numpy(self):
        """Random max logits around tau (some under, some over, some unknown) for every grouping
        of 8 heads: the factors equal the reference's, none above 1, and q_h * k_g is gamma_h."""
        for group in (1, 2, 4, 8):
            for _ in range(50):
                tau = float(self.rng.uniform(5.0, 100.0))
                s = self.rng.uniform(-0.5, 2.0, size=8) * tau
                s[self.rng.integers(0, 8)] = [np.nan, -np.inf, np.inf][self.rng.integers(0, 3)]
                q, k = qk_clip_factors(s.tolist(), tau, group)
                rq, rk = reference(s, tau, group)
                np.testing.assert_allclose(q, rq, rtol=1e-15, atol=0)
                np.testing.assert_allclose(k, rk, rtol=1e-15, atol=0)
                self.assertTrue(all(0.0 < f <= 1.0 for f in q + k), (q, k))
                for h in range(8):
                    want = tau / s[h] if np.isfinite(s[h]) and s[h] > tau else 1.0
                    self.assertAlmostEqual(q[h] * k[h // group], want, delta=1e-14)

    def test_mha_is_muonclip(self):
        """One head per group: both projections by sqrt(tau / S_h), as MuonClip has it."""
        q, k = qk_clip_factors([50.0, 200.0, 100.0, 400.0], 100.0)
        self.assertEqual(q, k)
        np.testing.assert_allclose(q, [1.0, math.sqrt(0.5), 1.0, 0.5], rtol=1e-15)

    def test_shared_keys_untouched_while_a_head_is_under(self):
        """A group with one head under tau keeps its key rows; the heads over tau are clipped by
        their queries alone. A group all over tau shares its mildest clip through the keys."""
        q, k = qk_clip_factors([400.0, 90.0, 200.0, 400.0], 100.0, group=2)
        self.assertEqual(k[0], 1.0)
        self.assertEqual(q[:2], [0.25, 1.0])
        self.assertAlmostEqual(k[1], math.sqrt(0.5), delta=1e-15)
        self.assertAlmostEqual(q[2], math.sqrt(0.5), delta=1e-15)
        self.assertAlmostEqual(q[3], 0.25 / math.sqrt(0.5), delta=1e-15)

    def test_logits_after_the_rows_are_scaled(self):
        """A layer's weights (fresh Gaussian, heads made loud or quiet at random), its max logits
        measured, the rows scaled by the factors, measured again: every head over tau is at tau
        (1e-9), every other head's max logit unchanged; MHA, GQA and MQA."""
        d, dm, n = 16, 48, 24
        for heads, group in ((8, 1), (8, 2), (8, 4), (6, 6)):
            wq = self.rng.standard_normal((heads * d, dm))
            wk = self.rng.standard_normal((heads // group * d, dm))
            loud = self.rng.uniform(0.3, 3.0, size=heads)
            wq *= np.repeat(loud, d)[:, None]  # some heads' logits far past the others'
            x = self.rng.standard_normal((n, dm))
            s = head_max_logits(wq, wk, x, heads, group, d)
            tau = float(np.median(s))
            q, k = qk_clip_factors(s.tolist(), tau, group)
            wq2 = wq * np.repeat(q, d)[:, None]
            wk2 = wk * np.repeat(k, d)[:, None]
            s2 = head_max_logits(wq2, wk2, x, heads, group, d)
            for h in range(heads):
                if s[h] > tau:
                    self.assertAlmostEqual(s2[h], tau, delta=1e-9 * tau, msg="head %d" % h)
                else:
                    self.assertAlmostEqual(s2[h], s[h], delta=1e-9 * abs(s[h]) + 1e-12,
                                           msg="head %d" % h)
            self.assertTrue((s > tau).any() and (s <= tau).any())

    def test_bad_arguments(self):
        for tau in (0.0, -1.0, float("nan"), float("inf")):
            with self.assertRaisesRegex(ValueError, "tau"):
                qk_clip_factors([1.0], tau)
        for group in (0, -2, 1.5, True):
            with self.assertRaisesRegex(ValueError, "group"):
                qk_clip_factors([1.0, 2.0], 10.0, group)
        with self.assertRaisesRegex(ValueError, "groups of 4"):
            qk_clip_factors([1.0] * 6, 10.0, 4)


class T(object):
    """A NumPy-backed stand-in for the tensor methods qk_clip uses (views share memory)."""

    def __init__(self, a):
        self.a = a

    @property
    def shape(self):
        return self.a.shape

    @property
    def dtype(self):
        return self.a.dtype

    device = "cpu"

    def dim(self):
        return self.a.ndim

    def view(self, *shape):
        return T(self.a.reshape(shape))

    def repeat_interleave(self, n):
        return T(np.repeat(self.a, n))

    def mul_(self, other):
        self.a *= other.a
        return self


def fake_torch():
    torch = types.ModuleType("torch")
    torch.no_grad = contextlib.nullcontext
    torch.tensor = lambda data, dtype=None, device=None: T(np.array(data, dtype=dtype))
    return torch


class Linear(object):
    def __init__(self, rng, rows, cols, bias=False):
        self.weight = T(rng.standard_normal((rows, cols)))
        self.bias = T(rng.standard_normal(rows)) if bias else None


class Attention(object):
    def __init__(self, rng, layer, heads, kv, d, hidden=12, qk_norm=False):
        self.layer_idx, self.head_dim = layer, d
        self.q_proj = Linear(rng, heads * d, hidden, bias=True)
        self.k_proj = Linear(rng, kv * d, hidden, bias=True)
        if qk_norm:
            self.q_norm = self.k_norm = object()


class Model(object):
    def __init__(self, layers):
        self.layers = layers

    def named_modules(self):
        yield "", self
        for i, m in enumerate(self.layers):
            yield "layers.%d.self_attn" % i, m


class FakeClient(object):
    def __init__(self, refuse=None):
        self.cbs, self.polls, self.interventions, self.refuse = [], 0, [], refuse

    def intervention(self, kind, step, layer=None, heads=(), values=None, threshold=None,
                     measured=None, detail=None):
        if self.refuse is not None:
            raise self.refuse
        self.interventions.append(dict(kind=kind, step=step, layer=layer, heads=list(heads),
                                       values=list(values), threshold=threshold,
                                       measured=measured))
        return True

    def on_result(self, cb):
        self.cbs.append(cb)

    def poll(self, timeout_ms=0):
        self.polls += 1

    def result(self, step, layer, max_logits):
        for cb in self.cbs:
            cb(0, step, layer, [dict(head=h, max_logit=m) for h, m in enumerate(max_logits)])


class FakeTorchCase(unittest.TestCase):
    """The NumPy stand-in of torch in place for each test, and a generator of SEED + SEED_OFFSET
    (each class its own stream)."""
    SEED_OFFSET = 2

    def setUp(self):
        self.rng = np.random.default_rng(SEED + self.SEED_OFFSET)
        self.saved = sys.modules.get("torch")
        sys.modules["torch"] = fake_torch()

    def tearDown(self):
        if self.saved is None:
            sys.modules.pop("torch", None)
        else:
            sys.modules["torch"] = self.saved


class TestClipStep(FakeTorchCase):
    """qk_clip.step() on stand-ins: the rows of each head scaled by the rule's factors (weights
    and biases), from each head's largest max logit over its layer's results since the last
    step(), once; nothing for results of steps it has applied, statistics not asked (NaN) or
    layers it does not know."""
    SEED_OFFSET = 1

    def check_rows(self, lin, before_w, before_b, factors, d):
        f = np.repeat(np.asarray(factors), d)
        np.testing.assert_array_equal(lin.weight.a, before_w * f[:, None])
        np.testing.assert_array_equal(lin.bias.a, before_b * f)

    def test_transformers_layers(self):
        heads, kv, d, tau = 8, 2, 4, 10.0
        layers = [Attention(self.rng, i, heads, kv, d) for i in range(3)]
        client, mon = FakeClient(), types.SimpleNamespace(current_step=7)
        clip = qk_clip(client, Model(layers), tau=tau, monitor=mon)
        self.assertEqual(clip.stats()["layers"], [0, 1, 2])
        w0 = [(m.q_proj.weight.a.copy(), m.q_proj.bias.a.copy(), m.k_proj.weight.a.copy(),
               m.k_proj.bias.a.copy()) for m in layers]
        ml0 = list(self.rng.uniform(0.2, 3.0, heads) * tau)
        ml1 = [tau * 0.5] * heads
        ml1[5] = float("nan")  # not measured: untouched
        ml4 = [tau * 0.1] * heads  # an earlier forward since the last step(): its larger ones count
        ml4[2], ml4[6] = tau * 9, float("nan")
        client.result(4, 0, ml4)
        client.result(5, 0, ml0)
        ml0 = [max(a, b) if a == a else b for a, b in zip(ml4, ml0)]  # head 2 at 9 tau
        client.result(5, 1, ml1)
        client.result(5, 9, [tau * 9] * heads)  # a layer qk_clip does not know
        n = clip.step()
        q0, k0 = qk_clip_factors(ml0, tau, heads // kv)
        self.assertEqual(n, sum(1 for m in ml0 if m > tau))
        self.check_rows(layers[0].q_proj, w0[0][0], w0[0][1], q0, d)
        self.check_rows(layers[0].k_proj, w0[0][2], w0[0][3], k0, d)
        for i in (1, 2):  # nothing over tau, no result: not touched
            np.testing.assert_array_equal(layers[i].q_proj.weight.a, w0[i][0])
            np.testing.assert_array_equal(layers[i].k_proj.weight.a, w0[i][2])
        st = clip.stats()
        self.assertEqual(st["clipped_by_layer"], {0: n} if n else {})
        self.assertEqual(st["lag"], 2)
        # recorded in the history: layer 0's clipped heads with the factor of each one's logits
        over = [h for h, m in enumerate(ml0) if m > tau]
        self.assertEqual(len(client.interventions), 1 if over else 0)
        if over:
            iv = client.interventions[0]
            self.assertEqual((iv["kind"], iv["step"], iv["layer"], iv["heads"], iv["threshold"]),
                             ("qk_clip", 5, 0, over, tau))
            np.testing.assert_allclose(iv["values"], [tau / ml0[h] for h in over], rtol=1e-12)
            self.assertEqual(iv["measured"], max(ml0[h] for h in over))
            self.assertEqual(st["recorded"], 1)
        self.assertGreater(client.polls, 0)
        # applied once: no new result, nothing more; one of an optimizer step applied is dropped
        w1 = layers[0].q_proj.weight.a.copy()
        mon.current_step = 8
        self.assertEqual(clip.step(), 0)
        client.result(5, 0, [tau * 9] * heads)
        client.result(3, 0, [tau * 9] * heads)
        self.assertEqual(clip.step(), 0)
        np.testing.assert_array_equal(layers[0].q_proj.weight.a, w1)
        client.result(8, 0, [tau * 2] * heads)  # a newer step over tau: every head clipped
        self.assertEqual(clip.step(), heads)
        iv = client.interventions[-1]  # the groups' key rows scaled too: still tau / 2 a head
        self.assertEqual((iv["step"], iv["heads"]), (8, list(range(heads))))
        np.testing.assert_allclose(iv["values"], [0.5] * heads, rtol=1e-12)
        clip.close()
        client.result(7, 0, [tau * 2] * heads)  # closed: ignored
        self.assertEqual(clip.step(), 0)

    def test_optimizer_steps(self):
        """With the monitor, the forwards between two step() calls are one optimizer step: their
        results fold (each head's largest), late ones still apply once at the next step() (lag
        1), a newer optimizer step's replace an older one's not yet applied, and one already
        applied is dropped."""
        a = Attention(self.rng, 0, 4, 4, 2)
        client, mon = FakeClient(), types.SimpleNamespace(current_step=0)
        tau = 10.0
        clip = qk_clip(client, projections={0: (a.q_proj, a.k_proj, 2)}, tau=tau, monitor=mon)

        def over_heads():
            return client.interventions[-1]["heads"] if client.interventions else None
        mon.current_step = 3  # micro-batches 1, 2, 3 of one optimizer step (auto_step)
        client.result(1, 0, [20.0, 1.0, 1.0, 1.0])
        client.result(2, 0, [1.0, 30.0, 1.0, 1.0])
        client.result(3, 0, [1.0, 1.0, 1.0, float("nan")])
        self.assertEqual(clip.step(), 2)
        self.assertEqual(over_heads(), [0, 1])
        self.assertEqual(client.interventions[-1]["step"], 3)
        np.testing.assert_allclose(client.interventions[-1]["values"], [0.5, 1 / 3.0], rtol=1e-12)
        mon.current_step = 6  # steps 4-6 run; their results come after this step() (lag 1)
        self.assertEqual(clip.step(), 0)
        client.result(3, 0, [50.0] * 4)  # late, of an optimizer step applied: dropped
        client.result(4, 0, [1.0, 1.0, 40.0, 1.0])
        client.result(6, 0, [1.0, 1.0, 1.0, 15.0])
        mon.current_step = 9
        self.assertEqual(clip.step(), 2)  # steps 4-6: heads 2 and 3
        self.assertEqual((over_heads(), client.interventions[-1]["step"]), ([2, 3], 6))
        self.assertEqual(clip.lag, 3)
        client.result(8, 0, [12.0, 1.0, 1.0, 1.0])  # steps 7-9, then 10-12 before the next
        mon.current_step = 12
        client.result(11, 0, [1.0, 11.0, 1.0, 1.0])  # a newer optimizer step: replaces 7-9's
        self.assertEqual(clip.step(), 1)
        self.assertEqual((over_heads(), client.interventions[-1]["step"]), ([1], 11))
        client.result(9, 0, [99.0] * 4)  # 7-9 were never applied, but 10-12 were: dropped
        self.assertEqual(clip.step(), 0)

    def test_a_step_that_raises_keeps_the_next_ones(self):
        """step() raising while it scales the rows (here the first time only) still ends its
        optimizer step: the next step's results are applied, not taken for the failed one's."""
        a = Attention(self.rng, 0, 4, 4, 2)
        client, mon = FakeClient(), types.SimpleNamespace(current_step=3)
        clip = qk_clip(client, projections={0: (a.q_proj, a.k_proj, 2)}, tau=10.0, monitor=mon)
        factors, calls = clip._factors, []

        def once(*args):
            calls.append(1)
            if len(calls) == 1:
                raise RuntimeError("the weights could not be scaled")
            return factors(*args)
        clip._factors = once
        client.result(2, 0, [20.0, 1.0, 1.0, 1.0])
        with self.assertRaises(RuntimeError):
            clip.step()
        mon.current_step = 6
        client.result(5, 0, [1.0, 40.0, 1.0, 1.0])
        self.assertEqual(clip.step(), 1)
        self.assertEqual(client.interventions[-1]["step"], 5)

    def test_unrecorded_clip_goes_on(self):
        """A daemon that records no interventions (ENOTSUP): the clip is applied all the same,
        said once, counted, and not tried again."""
        import warnings
        from attnstat._errors import AttnstatError
        a = Attention(self.rng, 0, 4, 4, 2)
        client = FakeClient(refuse=AttnstatError(11, "this attnstatd records no interventions"))
        clip = qk_clip(client, projections={0: (a.q_proj, a.k_proj, 2)}, tau=5.0)
        w = a.q_proj.weight.a.copy()
        with warnings.catch_warnings(record=True) as got:
            warnings.simplefilter("always")
            client.result(1, 0, [10.0, 1.0, 1.0, 20.0])
            self.assertEqual(clip.step(), 2)
            client.result(2, 0, [10.0, 1.0, 1.0, 20.0])
            self.assertEqual(clip.step(), 2)
        self.assertFalse(np.array_equal(a.q_proj.weight.a, w))
        self.assertEqual(sum(1 for x in got if "not recorded" in str(x.message)), 1)
        self.assertEqual(clip.stats()["record_errors"], 1)  # ENOTSUP: not asked again
        self.assertEqual(clip.stats()["recorded"], 0)

    def test_a_failed_poll_does_not_stop_training(self):
        """The link closed for good (or a callback raised): step() goes on with the results
        that arrived, counts the failure and says it once, instead of raising into the loop."""
        import warnings
        from attnstat._errors import AttnstatError
        a = Attention(self.rng, 0, 4, 4, 2)
        client = FakeClient()
        clip = qk_clip(client, projections={0: (a.q_proj, a.k_proj, 2)}, tau=5.0)

        def closed(timeout_ms=0):
            raise AttnstatError(32, "the link to attnstatd is closed")
        client.poll = closed
        with warnings.catch_warnings(record=True) as got:
            warnings.simplefilter("always")
            client.result(1, 0, [10.0, 1.0, 1.0, 20.0])
            self.assertEqual(clip.step(), 2)
            self.assertEqual(clip.step(), 0)
        self.assertEqual(clip.stats()["poll_errors"], 2)
        self.assertEqual(sum(1 for x in got if "reading results failed" in str(x.message)), 1)

    def test_a_result_arriving_during_step_is_kept(self):
        """A result that arrives while step() applies the last ones (a background thread polling
        the client; here delivered from inside step(), as the intervention is recorded) is kept
        for the next step(), which applies it once; one of a step already applied is dropped."""
        a = Attention(self.rng, 0, 4, 4, 2)
        client = FakeClient()
        clip = qk_clip(client, projections={0: (a.q_proj, a.k_proj, 2)}, tau=5.0)
        record = client.intervention
        late = [(2, [1.0, 30.0, 1.0, 1.0]), (1, [50.0, 50.0, 50.0, 50.0])]

        def intervention(*args, **kw):
            while late:  # the newer step's result, then a late one of the step being applied
                step, ml = late.pop(0)
                client.result(step, 0, ml)
            return record(*args, **kw)
        client.intervention = intervention
        client.result(1, 0, [10.0, 1.0, 1.0, 20.0])
        self.assertEqual(clip.step(), 2)
        w = a.q_proj.weight.a.copy()
        self.assertEqual(clip.step(), 1)  # step 2's head 1, kept
        f = np.sqrt(5.0 / 30.0)
        np.testing.assert_allclose(a.q_proj.weight.a[2:4], w[2:4] * f, rtol=1e-12)
        np.testing.assert_array_equal(a.q_proj.weight.a[:2], w[:2])
        self.assertEqual(clip.step(), 0)
        self.assertEqual([iv["step"] for iv in client.interventions], [1, 2])

    def test_tensor_parallel_shard(self):
        """A DTensor projection sharded by rows (ColwiseParallel): the process's own heads,
        numbered from 0 in its results, are its local shard's rows; the global shape (twice the
        rows here) is never used. Sharded across input features: refused."""
        class Shard(object):
            def __init__(self, dim):
                self.dim = dim

            def is_shard(self):
                return True

        class DT(object):  # the DTensor surface qk_clip may touch
            def __init__(self, local, dim):
                self.local, self.placements = local, [Shard(dim)]
                self.shape = (2 * local.shape[0],) + tuple(local.shape[1:])

            def to_local(self):
                return self.local

        heads, kv, d, tau = 4, 2, 3, 8.0
        a = Attention(self.rng, 0, heads, kv, d)
        wq, bq, wk = a.q_proj.weight.a.copy(), a.q_proj.bias.a.copy(), a.k_proj.weight.a.copy()
        bk = a.k_proj.bias.a.copy()
        for lin in (a.q_proj, a.k_proj):
            lin.weight, lin.bias = DT(lin.weight, 0), DT(lin.bias, 0)
        client = FakeClient()
        clip = qk_clip(client, Model([a]), tau=tau)
        ml = [tau * 3, tau * 0.5, tau * 2, tau * 4]
        client.result(2, 0, ml)
        self.assertEqual(clip.step(), 3)
        q, k = qk_clip_factors(ml, tau, heads // kv)
        self.check_rows(types.SimpleNamespace(weight=a.q_proj.weight.local,
                                              bias=a.q_proj.bias.local), wq, bq, q, d)
        self.check_rows(types.SimpleNamespace(weight=a.k_proj.weight.local,
                                              bias=a.k_proj.bias.local), wk, bk, k, d)
        b = Attention(self.rng, 0, heads, kv, d)
        b.q_proj.weight = DT(b.q_proj.weight, 1)
        with self.assertRaisesRegex(ValueError, "input features"):
            qk_clip(FakeClient(), Model([b]), tau=tau)

    def test_projections_and_refusals(self):
        a = Attention(self.rng, 0, 4, 4, 2)
        clip = qk_clip(FakeClient(), projections={3: (a.q_proj, a.k_proj, 2)}, tau=5.0)
        self.assertEqual(clip.stats()["layers"], [3])
        with self.assertRaisesRegex(ValueError, "QK-norm"):
            qk_clip(FakeClient(), Model([Attention(self.rng, 0, 4, 2, 2, qk_norm=True)]))
        with self.assertRaisesRegex(ValueError, "no attention layer"):
            qk_clip(FakeClient(), Model([]))
        with self.assertRaisesRegex(ValueError, "whole heads"):
            qk_clip(FakeClient(), projections={0: (a.q_proj, a.k_proj, 3)})
        with self.assertRaisesRegex(ValueError, "tau"):
            qk_clip(FakeClient(), projections={0: (a.q_proj, a.k_proj, 2)}, tau=0)


class LatentAttention(object):
    """transformers' DeepseekV3Attention's surface for qk_clip: q_b_proj (heads x (nope + rope)
    rows), kv_b_proj (heads x (nope + v) rows), kv_a_proj_with_mqa (the latent and the rotary key
    every head shares), no q_proj / k_proj / head_dim."""

    def __init__(self, rng, layer, heads, nope, rope, dv, rq=10, rkv=9, hidden=12):
        self.layer_idx = layer
        self.qk_nope_head_dim, self.qk_rope_head_dim, self.v_head_dim = nope, rope, dv
        self.q_b_proj = Linear(rng, heads * (nope + rope), rq)
        self.kv_b_proj = Linear(rng, heads * (nope + dv), rkv)
        self.kv_a_proj_with_mqa = Linear(rng, rkv + rope, hidden)


class TestLatentAttention(FakeTorchCase):
    """Multi-head latent attention (DeepSeek-V3, Kimi K2): each head's logits computed with NumPy
    from its q rows (q_C, q_R), its kv_b rows (k_C) and the rotary key every head shares, before
    and after qk_clip.step(): a head over tau comes to tau exactly, the others do not move, and
    the shared key and the values are not touched (fresh random weights, latents and tau)."""

    @staticmethod
    def max_logits(m, cq, ckv, kr):
        """Head h's largest logit over every (query, key) pair: (q_C . k_C + q_R . k_R) /
        sqrt(nope + rope), q from the query latents cq, k_C from the key latents ckv, k_R shared."""
        n, r, dv = m.qk_nope_head_dim, m.qk_rope_head_dim, m.v_head_dim
        q = (cq @ m.q_b_proj.weight.a.T).reshape(len(cq), -1, n + r)
        kv = (ckv @ m.kv_b_proj.weight.a.T).reshape(len(ckv), -1, n + dv)
        out = []
        for h in range(q.shape[1]):
            s = q[:, h, :n] @ kv[:, h, :n].T + q[:, h, n:] @ kr.T
            out.append(float(s.max() / math.sqrt(n + r)))
        return out

    def test_logits_come_to_tau(self):
        for heads, nope, rope, dv in ((8, 6, 2, 5), (4, 3, 4, 3), (6, 5, 0, 4)):
            m = LatentAttention(self.rng, 0, heads, nope, rope, dv)
            cq = self.rng.standard_normal((20, 10))
            ckv = self.rng.standard_normal((20, 9))
            kr = self.rng.standard_normal((20, rope))
            s = self.max_logits(m, cq, ckv, kr)
            tau = float(np.median(s))
            if tau <= 0:
                tau = max(s) / 2
            kva, kvb = m.kv_a_proj_with_mqa.weight.a.copy(), m.kv_b_proj.weight.a.copy()
            client = FakeClient()
            clip = qk_clip(client, Model([m]), tau=tau)
            client.result(3, 0, s)
            over = [h for h in range(heads) if s[h] > tau]
            self.assertEqual(clip.step(), len(over))
            after = self.max_logits(m, cq, ckv, kr)
            for h in range(heads):
                if h in over:
                    self.assertAlmostEqual(after[h] / tau, 1.0, delta=1e-12, msg="head %d" % h)
                else:
                    self.assertEqual(after[h], s[h], "head %d moved" % h)
            np.testing.assert_array_equal(m.kv_a_proj_with_mqa.weight.a, kva)
            v = np.concatenate([np.arange(h * (nope + dv) + nope, (h + 1) * (nope + dv))
                                for h in range(heads)])
            np.testing.assert_array_equal(m.kv_b_proj.weight.a[v], kvb[v])  # the values
            rec = client.interventions[0]
            self.assertEqual(rec["heads"], over)
            np.testing.assert_allclose(rec["values"], [tau / s[h] for h in over], rtol=1e-12)

    def test_projections_and_refusals(self):
        m = LatentAttention(self.rng, 0, 4, 3, 2, 3)
        client = FakeClient()
        clip = qk_clip(client, projections={5: dict(q=m.q_b_proj, kv=m.kv_b_proj, nope=3, rope=2,
                                                    v=3)}, tau=4.0)
        self.assertEqual(clip.stats()["layers"], [5])
        wq = m.q_b_proj.weight.a.copy()
        client.result(1, 5, [16.0, 1.0, 1.0, 1.0])  # head 0: gamma 1/4
        self.assertEqual(clip.step(), 1)
        f = np.ones(4 * 5)
        f[0:3], f[3:5] = 0.5, 0.25  # q_C by sqrt(gamma), q_R by gamma
        np.testing.assert_array_equal(m.q_b_proj.weight.a, wq * f[:, None])
        with self.assertRaisesRegex(ValueError, "same number of heads"):
            qk_clip(FakeClient(), projections={0: dict(q=m.q_b_proj, kv=m.kv_b_proj, nope=3,
                                                       rope=2, v=4)})
        with self.assertRaisesRegex(ValueError, "latent attention needs"):
            qk_clip(FakeClient(), projections={0: dict(q=m.q_b_proj, nope=3, rope=2, v=3)})


class FusedAttention(object):
    """transformers' Phi3Attention's surface: one qkv_proj (query heads' rows, key heads', value
    heads'), head_dim, num_key_value_heads, the query heads in its config."""

    def __init__(self, rng, layer, heads, kv, d, hidden=12):
        self.layer_idx, self.head_dim, self.num_key_value_heads = layer, d, kv
        self.config = types.SimpleNamespace(num_attention_heads=heads, num_key_value_heads=kv)
        self.qkv_proj = Linear(rng, (heads + 2 * kv) * d, hidden)


class TestFusedProjection(FakeTorchCase):
    """A fused q/k/v projection (Phi-3, Phi-4): the logits of every head, from the query and key
    rows of the one weight, before and after the clip as in TestRule (groups of 1, 2 and 4);
    the value rows not touched; a sharded or odd-shaped one refused."""
    SEED_OFFSET = 3

    def test_logits_come_to_tau(self):
        for heads, kv, d in ((4, 4, 3), (8, 4, 2), (8, 2, 4)):
            group, hidden = heads // kv, 12
            m = FusedAttention(self.rng, 0, heads, kv, d, hidden)
            x = self.rng.standard_normal((16, hidden))

            def logits():
                w = m.qkv_proj.weight.a
                return head_max_logits(w[:heads * d], w[heads * d:(heads + kv) * d], x, heads,
                                       group, d)
            s = logits()
            tau = float(np.median(s)) if np.median(s) > 0 else float(max(s)) / 2
            wv = m.qkv_proj.weight.a[(heads + kv) * d:].copy()
            client = FakeClient()
            clip = qk_clip(client, Model([m]), tau=tau)
            client.result(2, 0, list(s))
            over = [h for h in range(heads) if s[h] > tau]
            self.assertEqual(clip.step(), len(over))
            after = logits()
            for h in range(heads):
                if h in over:
                    self.assertAlmostEqual(after[h] / tau, 1.0, delta=1e-12, msg="head %d" % h)
                else:  # its query rows take 1 / its group's key factor
                    self.assertLessEqual(abs(after[h] - s[h]), 1e-12 * abs(s[h]) + 1e-12,
                                         "head %d moved" % h)
            np.testing.assert_array_equal(m.qkv_proj.weight.a[(heads + kv) * d:], wv)

    def test_projections_and_refusals(self):
        m = FusedAttention(self.rng, 0, 4, 2, 3)
        clip = qk_clip(FakeClient(), projections={2: dict(qkv=m.qkv_proj, heads=4, kv_heads=2,
                                                          head_dim=3)})
        self.assertEqual(clip.stats()["layers"], [2])
        with self.assertRaisesRegex(ValueError, "rows are not"):
            qk_clip(FakeClient(), projections={2: dict(qkv=m.qkv_proj, heads=4, kv_heads=1,
                                                       head_dim=3)})
        m.qkv_proj.weight.placements = ()
        with self.assertRaisesRegex(ValueError, "sharded by tensor parallelism"):
            qk_clip(FakeClient(), Model([m]))


if __name__ == "__main__":
    unittest.main(verbosity=2)
