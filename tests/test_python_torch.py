#!/usr/bin/env python3
"""test_python_torch.py — the Python binding with real PyTorch (skipped, exit 77, without it).

Against a real attnstatd (the helpers of test_python.py): CPU tensors that require grad and
bfloat16 tensors read through data_ptr(); attnstat.torch.monitor on a small model trained for a few
steps (forward and backward), its stored per-head statistics equal to a float64 computation of the
same query/key; nn.MultiheadAttention seen through the patched function; CUDA tensors, when a GPU
is there: a clear ENOTSUP while libattnstat has no GPU path, and monitor(copy_to_host=True).
And qk_clip's device mode's arithmetic (torch ops, run here on the CPU) against the host rule.
"""
import contextlib
import math
import os
import sys
import types
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

try:
    import numpy  # noqa: F401  (the reference of test_python.py)
    import torch
    import torch.nn.functional as F
except ImportError as e:
    print("SKIP: %s (%s)" % (e, sys.executable))
    sys.exit(77)

import test_python as tp  # noqa: E402  (exits 77 itself without NumPy)
import attnstat  # noqa: E402
import attnstat.torch  # noqa: E402
from attnstat import _lib  # noqa: E402
from attnstat.torch._qkclip_dev import DeviceClip, device_factors, device_rows  # noqa: E402

torch.manual_seed(int.from_bytes(os.urandom(4), "little"))  # fresh data every run
CUDA = torch.cuda.is_available()


def ref(q, k, causal=False, scale=None):
    return tp.reference_stats(q.detach().cpu().double().numpy(), k.detach().cpu().double().numpy(),
                              causal=causal, scale=scale)


class Attn(torch.nn.Module):
    """A self-attention layer that calls F.scaled_dot_product_attention the way models do, and
    keeps what it fed it (for the reference)."""

    def __init__(self, dim, heads, kv_heads):
        super().__init__()
        self.h, self.kvh, self.dh = heads, kv_heads, dim // heads
        self.q = torch.nn.Linear(dim, dim)
        self.kv = torch.nn.Linear(dim, 2 * kv_heads * self.dh)
        self.seen = []

    def forward(self, x):
        B, N, _ = x.shape
        q = self.q(x).view(B, N, self.h, self.dh).transpose(1, 2)        # a [B, H, N, D] view
        k, v = self.kv(x).view(B, N, 2, self.kvh, self.dh).unbind(2)
        k, v = k.transpose(1, 2), v.transpose(1, 2)
        self.seen.append((q.detach().clone(), k.detach().clone()))
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                           enable_gqa=self.kvh != self.h)
        return x + o.transpose(1, 2).reshape(B, N, -1)


class Model(torch.nn.Module):
    def __init__(self, dim=32, heads=4, kv_heads=2, layers=3):
        super().__init__()
        self.layers = torch.nn.ModuleList(Attn(dim, heads, kv_heads) for _ in range(layers))

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


@tp.need_daemon
class TestTorch(tp.DaemonCase):
    def test_cpu_tensors_that_require_grad_and_bf16(self):
        run = self.run_name()
        q = torch.randn(2, 4, 20, 16, requires_grad=True)
        k = torch.randn(2, 4, 20, 16, requires_grad=True)
        qb, kb = torch.randn(1, 2, 9, 32).bfloat16(), torch.randn(1, 2, 9, 32).bfloat16()
        qh = torch.randn(1, 12, 3, 64).half()  # [B, N, H, D]
        kh = torch.randn(1, 30, 3, 64).half()
        with self.d.client(run) as c:
            self.assertTrue(c.push(0, 0, q, k, causal=True))
            self.assertTrue(c.push(0, 1, qb, kb, scale=0.2))
            self.assertTrue(c.push(0, 2, qh, kh, layout="bnhd", causal=True))
            self.assertTrue(c.flush(30))
        self.check_stored(run, 0, 0, ref(q, k, causal=True), 1e-6)
        self.check_stored(run, 0, 1, ref(qb, kb, scale=0.2), 1e-6)
        self.check_stored(run, 0, 2, ref(qh.transpose(1, 2), kh.transpose(1, 2), causal=True),
                          1e-6)

    def test_monitor_a_training_loop(self):
        run = self.run_name()
        model = Model()
        opt = torch.optim.SGD(model.parameters(), lr=1e-2)
        orig = F.scaled_dot_product_attention
        with self.d.client(run) as c:
            with attnstat.torch.monitor(c, every=2, model=model, strict=True) as mon:
                for _ in range(4):  # steps 0..3: 0 and 2 pushed
                    x = torch.randn(2, 10, 32)
                    loss = model(x).square().mean()
                    opt.zero_grad()
                    loss.backward()
                    opt.step()
            self.assertIs(F.scaled_dot_product_attention, orig)
            self.assertTrue(c.flush(30))
        self.assertEqual((mon.calls, mon.pushed, mon.skipped, mon.errors), (12, 6, 0, 0))
        for step in (0, 2):
            for layer, attn in enumerate(model.layers):
                q, k = attn.seen[step]
                self.check_stored(run, step, layer, ref(q, k, causal=True), 1e-6)
        self.assertEqual(self.d.samples(run, 1, 0), {})

    def test_multihead_attention_is_seen(self):
        run = self.run_name()
        mha = torch.nn.MultiheadAttention(32, 4, batch_first=True)
        x = torch.randn(2, 7, 32)
        with self.d.client(run) as c:
            with attnstat.torch.monitor(c, strict=True) as mon:
                mha(x, x, x, need_weights=False)
            self.assertTrue(c.flush(30))
        self.assertEqual(mon.pushed, 1)
        self.assertEqual(sorted(self.d.samples(run, 0, 0)), [0, 1, 2, 3])

    def test_compiled_models(self):
        run = self.run_name()
        model = Model(layers=2)
        compiled = torch.compile(model, backend="eager")  # dynamo traces; no C++ toolchain needed
        x = torch.randn(2, 10, 32)
        with self.d.client(run) as c:
            with attnstat.torch.monitor(c, model=model, strict=True, compiled="skip") as skip:
                compiled(x)
            torch._dynamo.reset()
            with attnstat.torch.monitor(c, model=model, strict=True, start_step=5) as auto:
                compiled(x)  # the default: through the graph's attnstat operator
            self.assertTrue(c.flush(30))
        self.assertEqual((skip.pushed, skip.skipped_by.get("compiled")), (0, 2))
        self.assertEqual(auto.pushed, 2)
        for layer, attn in enumerate(model.layers):
            q, k = attn.seen[-1]
            self.check_stored(run, 5, layer, ref(q, k, causal=True), 1e-6)

    @unittest.skipUnless(CUDA, "no CUDA device")
    def test_cuda_tensors(self):
        run = self.run_name()
        q = torch.randn(1, 2, 16, 32, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(1, 2, 16, 32, device="cuda", dtype=torch.bfloat16)
        with self.d.client(run) as c:
            try:
                sent = c.push(0, 0, q, k)
            except attnstat.AttnstatError as e:  # a libattnstat without the GPU path
                self.assertEqual(e.code, _lib.ENOTSUP)
                self.assertIn("GPU path", str(e))
                sent = None
            if sent is not None:  # the GPU path: held until released
                self.assertTrue(sent)
                self.assertTrue(c.flush(30))
                self.assertEqual(c.stats()["held"], 0)
                # computed by the CUDA kernel (float32): tests/gpu checks it at its tolerances
                self.check_stored(run, 0, 0, ref(q, k), 1e-3)
            model = Model().cuda()
            with attnstat.torch.monitor(c, model=model, copy_to_host=True, strict=True) as mon:
                model(torch.randn(2, 10, 32, device="cuda"))
            self.assertTrue(c.flush(30))
            self.assertEqual(mon.pushed, 3)
        for layer, attn in enumerate(model.layers):
            qq, kk = attn.seen[0]
            self.check_stored(run, 0, layer, ref(qq, kk, causal=True), 1e-6)


class _Event(object):
    """torch.cuda.Event as DeviceClip uses it, on the CPU: done once synchronised (a copy still
    on its way until then)."""

    def __init__(self):
        self.done = False

    def record(self, stream=None):
        self.done = False

    def query(self):
        return self.done

    def synchronize(self):
        self.done = True


class _CpuTorch(object):
    """The torch DeviceClip is handed, for CPU tensors: torch itself but for torch.cuda (events,
    device, stream) and pinned memory."""
    cuda = types.SimpleNamespace(Event=_Event, device=lambda d: contextlib.nullcontext(),
                                 current_stream=lambda d=None: 0)

    def __getattr__(self, name):
        return getattr(torch, name)

    @staticmethod
    def empty(*shape, pin_memory=False, **kw):
        return torch.empty(*shape, **kw)


class _WaitingClient(object):
    """What qk_clip's device mode calls of a Client: local_wait, intervention, on_result."""

    def __init__(self):
        self.waits, self.interventions = 0, []

    def local_wait(self, stream=None):
        self.waits += 1

    def on_result(self, fn):
        pass

    def intervention(self, kind, step, **kw):
        self.interventions.append(dict(kw, kind=kind, step=step))
        return True


class TestQKClipOnTheDevice(unittest.TestCase):
    """qk_clip's device mode computes attnstat.qk_clip_factors' rule with torch ops, for every
    layer of one shape at once (attnstat.torch._qkclip_dev): the same floats as the host rule,
    and each projection row the factor of its head's part; and its bookkeeping over steps."""

    def test_steps(self):
        """DeviceClip over three steps on the CPU: each step waits for the pushes, clips from the
        values folded into its buffer (layer 0 over tau on some heads, layer 1 never pushed:
        untouched, counted unmeasured), sets them back to NaN and copies them for the record,
        the two host buffers in turn: the first copy, not yet arrived, is read at the third step
        when its buffer is needed again, and the rest at stats()."""
        heads, kv, d, tau = 4, 2, 3, 10.0
        lins = {l: (torch.nn.Linear(8, heads * d).double(), torch.nn.Linear(8, kv * d).double())
                for l in (0, 1)}
        mon = types.SimpleNamespace(current_step=0, max_logit_out={})
        client = _WaitingClient()
        clip = attnstat.torch.qk_clip(client, projections={l: (q, k, d) for l, (q, k) in
                                                           lins.items()},
                                      tau=tau, monitor=mon, device=False)
        dev = DeviceClip(_CpuTorch(), clip._layers, mon)
        clip._dev, clip.device = dev, True
        self.assertEqual(sorted(mon.max_logit_out), [0, 1])
        before = {l: (q.weight.detach().clone(), k.weight.detach().clone())
                  for l, (q, k) in lins.items()}
        steps = [[20.0, 5.0, 12.0, 40.0], [5.0, 5.0, 5.0, 5.0], [11.0, 9.0, float("-inf"), 1.0]]
        want_w = before[0]
        returned = []
        for st, ml in enumerate(steps):
            mon.current_step = st
            mon.max_logit_out[0].copy_(torch.tensor(ml, dtype=torch.float64))  # the pushes
            returned.append(dev.step(_CpuTorch(), client, tau, st, clip._drain_one))
            self.assertTrue(torch.isnan(dev.all).all())  # set back for the next step
            hq, hk = attnstat.qk_clip_factors(ml, tau, heads // kv)
            want_w = (want_w[0] * torch.tensor(hq, dtype=torch.float64).repeat_interleave(d)[:, None],
                      want_w[1] * torch.tensor(hk, dtype=torch.float64).repeat_interleave(d)[:, None])
            for got, want in zip((lins[0][0].weight, lins[0][1].weight), want_w):
                self.assertTrue(torch.allclose(got, want, rtol=1e-14, atol=0), (st, ml))
        self.assertTrue(torch.equal(lins[1][0].weight, before[1][0]))  # by exactly 1
        self.assertTrue(torch.equal(lins[1][1].weight, before[1][1]))
        self.assertEqual(client.waits, 3)
        # step 0's copy was read when step 2 needed its buffer (3 heads over tau), no other yet
        self.assertEqual(returned, [0, 0, 3])
        self.assertEqual([iv["step"] for iv in client.interventions], [0])
        st = clip.stats()  # waits for the rest: step 1 clipped nothing, step 2 one head
        self.assertEqual([iv["step"] for iv in client.interventions], [0, 2])
        self.assertEqual(client.interventions[1]["heads"], [0])
        self.assertEqual((st["clipped_by_layer"], st["unmeasured_by_layer"], st["lag"]),
                         ({0: 4}, {1: 3}, 0))

    def test_factors_equal_the_host_rule(self):
        for group in (1, 2, 4, 8):
            for _ in range(20):
                tau = float(torch.empty(()).uniform_(5.0, 100.0))
                ml = (torch.rand(3, 8, dtype=torch.float64) * 2.5 - 0.5) * tau
                for layer in range(3):  # unknown or unmeasurable heads are left alone
                    ml[layer, int(torch.randint(0, 8, ()))] = [float("nan"), -float("inf"),
                                                               float("inf")][layer]
                q, k = device_factors(torch, ml, tau, group)
                self.assertEqual((tuple(q.shape), tuple(k.shape)), ((3, 8), (3, 8 // group)))
                for layer in range(3):
                    hq, hk = attnstat.qk_clip_factors(ml[layer].tolist(), tau, group)
                    for got, want in ((q[layer].tolist(), hq), (k[layer].tolist(), hk)):
                        # a head left alone exactly 1; the others within a few ulps (PyTorch's
                        # CPU kernels need not round as Python does)
                        self.assertEqual([g == 1.0 for g in got], [w == 1.0 for w in want])
                        for g, w in zip(got, want):
                            self.assertTrue(math.isclose(g, w, rel_tol=1e-15, abs_tol=0.0),
                                            (group, ml[layer], got, want))

    def test_rows(self):
        q = torch.rand(2, 4, dtype=torch.float64) + 0.1
        k = torch.rand(2, 2, dtype=torch.float64) + 0.1
        rq, rk = device_rows(torch, q, k, 3, None)  # 4 query heads of 3 rows, 2 key heads
        for layer in range(2):
            self.assertEqual(rq[layer].tolist(), [q[layer, r // 3].item() for r in range(12)])
            self.assertEqual(rk[layer].tolist(), [k[layer, r // 3].item() for r in range(6)])
        rf, = device_rows(torch, q, k, 3, "fused")  # q rows, k rows, v rows
        self.assertEqual(rf[1].tolist(), rq[1].tolist() + rk[1].tolist() + [1.0] * 6)
        km = torch.rand(2, 4, dtype=torch.float64) + 0.1  # latent: one key factor per head
        rq, rk = device_rows(torch, q, km, 0, (5, 2, 3))  # nope 5, rope 2, v 3
        for layer in range(2):
            want_q, want_k = [], []
            for h in range(4):
                want_q += [q[layer, h].item()] * 5 + [(q[layer, h] * km[layer, h]).item()] * 2
                want_k += [km[layer, h].item()] * 5 + [1.0] * 3
            self.assertEqual(rq[layer].tolist(), want_q)
            self.assertEqual(rk[layer].tolist(), want_k)


if __name__ == "__main__":
    unittest.main(verbosity=2)
