#!/usr/bin/env python3
"""test_python_masks.py — what real attention calls carry, end to end through a real attnstatd's
CPU worker: masks (boolean and additive, broadcast over batch, heads and rows), the precision of
the logits (float32 tensors computed as bfloat16, as under autocast), attention sinks (gpt-oss:
one logit per query head joining every row's softmax), and what happens to pushes the daemon will
not take (the work limit): the client's counters and last error, the monitor's count and one
warning per reason, the daemon's status by reason and one log line per reason.

Every per-head statistic is checked against a float64 computation done here with NumPy from the
values as the daemon reads them. Skipped (77) without NumPy; the end-to-end classes skip when
attnstatd or libattnstat.so is not built.
"""
import math
import re
import time
import unittest
import warnings

from pyhelpers import (DaemonCase, FakeTensor, FakeTorch, need_daemon, np,  # noqa: E402
                       np_sdpa, randn)

import attnstat.torch  # noqa: E402
from attnstat import _lib  # noqa: E402

FLT_MAX = float(np.finfo(np.float32).max)


def round_bf16(a):
    """float32 values rounded to the nearest bfloat16 (ties to even), as float32."""
    u = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32).astype(np.uint64)
    u = (u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000
    return u.astype(np.uint32).view(np.float32)


def reference(q, k, causal=False, scale=None, mask=None, compute=None, sinks=None, window=None):
    """Per head: rows, rows_norm, rows_empty, nonfinite_rows, entropy mean/min/max, normalised
    entropy mean and max logit (the largest scale * q.k over the keys that take part, without the
    mask's bias), in float64. sinks: one logit per query head (-inf: none), one more outcome of
    each row's softmax, normalised by ln(keys + 1); NaN or +inf makes the rows non-finite.
    window: (left, right), negative unbounded."""
    if compute == "bfloat16":
        q, k = round_bf16(q), round_bf16(k)
    q, k = q.astype(np.float64), k.astype(np.float64)
    B, Hq, Nq, D = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    sc = 1.0 / math.sqrt(D) if not scale else float(np.float32(scale))
    if mask is not None:
        m = np.broadcast_to(mask, (B, Hq, Nq, Nk))
        if m.dtype == np.bool_:
            take, bias = m, np.zeros(m.shape)
        else:
            mf = m.astype(np.float64)
            take = ~((mf == -np.inf) | (mf <= -FLT_MAX))
            bias = np.where(take, mf, 0.0)
    out = []
    for h in range(Hq):
        ents, norms, maxl, empty, nonfinite = [], [], -np.inf, 0, 0
        sink = -np.inf if sinks is None else float(sinks[h])
        for b in range(B):
            s = sc * (q[b, h] @ k[b, h // (Hq // Hkv)].T)
            for i in range(Nq):
                vis = np.ones(Nk, bool)
                a = i + (Nk - Nq)
                if causal:
                    vis[a + 1:] = False
                if window is not None and window[0] >= 0:
                    vis[:max(a - window[0], 0)] = False
                if window is not None and window[1] >= 0:
                    vis[a + window[1] + 1:] = False
                bi = np.zeros(Nk)
                if mask is not None:
                    vis &= take[b, h, i]
                    bi = bias[b, h, i]
                if not vis.any():
                    empty += 1
                    continue
                raw, x = s[i][vis], (s[i] + bi)[vis]
                if sink != -np.inf:
                    if not sink < np.inf:  # NaN or +inf
                        nonfinite += 1
                        continue
                    x = np.append(x, sink)  # the sink: one more outcome
                p = np.exp(x - x.max())
                p /= p.sum()
                nz = p[p > 0]
                e = float(-(nz * np.log(nz)).sum())
                ents.append(e)
                if len(x) >= 2:
                    norms.append(e / math.log(len(x)))
                maxl = max(maxl, float(raw.max()))
        nan = float("nan")
        out.append({"rows": len(ents), "rows_empty": empty, "rows_norm": len(norms),
                    "nonfinite_rows": nonfinite,
                    "entropy_mean": float(np.mean(ents)) if ents else nan,
                    "entropy_min": float(np.min(ents)) if ents else nan,
                    "entropy_max": float(np.max(ents)) if ents else nan,
                    "entropy_norm_mean": float(np.mean(norms)) if norms else nan,
                    "max_logit": maxl})
    return out


def push_and_get(self, q, k, **kw):
    """One push of q, k with want_results through the test's daemon: its per-head results."""
    got = []
    with self.d.client(self.run_name()) as c:
        c.on_result(lambda seq, step, layer, heads: got.append(heads))
        self.assertTrue(c.push(1, 0, q, k, want_results=True, **kw))
        self.assertTrue(c.flush(60))
        st = c.stats()
    self.assertEqual(st["rejected"], 0, st["last_error"])
    self.assertEqual(len(got), 1)
    return got[0]


@need_daemon
class TestMasksEndToEnd(DaemonCase):
    push_and_get = push_and_get

    def check(self, heads, ref, rel=1e-5):  # the daemon computes in float32 (stats_cpu_fast_ws)
        self.assertEqual(len(heads), len(ref))
        for h, r in zip(heads, ref):
            self.assertEqual((h["rows"], h["rows_empty"]), (r["rows"], r["rows_empty"]),
                             "head %d rows" % h["head"])
            for f in ("entropy_mean", "entropy_min", "entropy_max", "entropy_norm_mean",
                      "max_logit"):
                want, g = r[f], h[f]
                if math.isnan(want):
                    self.assertTrue(math.isnan(g), "head %d %s" % (h["head"], f))
                    continue
                # + 1e-6 nats: a float32 row's entropy is good to ~1e-7 absolute, not relative
                self.assertLessEqual(abs(g - want), rel * max(abs(want), 1e-3) + 1e-6,
                                     "head %d %s: daemon %r, float64 %r" % (h["head"], f, g, want))

    def test_boolean_mask_random_and_empty_rows(self):
        q, k = randn(2, 4, 9, 16, scale=2.0), randn(2, 2, 11, 16)
        m = np.random.default_rng().random((2, 1, 9, 11)) < 0.6
        m[:, :, 0, :] = False  # a row that sees no key: excluded, counted empty
        self.check(self.push_and_get(q, k, attn_mask=m), reference(q, k, mask=m))

    def test_key_padding_with_causal(self):
        q, k = randn(3, 2, 12, 8), randn(3, 2, 12, 8)
        pad = np.ones((3, 12), bool)
        pad[1, 9:] = pad[2, 5:] = False
        m = pad[:, None, None, :]  # [B, 1, 1, Nk]: broadcast over heads and rows
        self.check(self.push_and_get(q, k, attn_mask=m, causal=True),
                   reference(q, k, causal=True, mask=m))

    def test_additive_mask_with_biases_per_head(self):
        q, k = randn(2, 3, 7, 16, scale=3.0), randn(2, 3, 10, 16)
        rng = np.random.default_rng()
        m = (rng.standard_normal((1, 3, 7, 10)) * 2.0).astype(np.float32)
        m[0, 0, 2, 3:] = -np.inf
        m[0, 1, 4, :5] = -FLT_MAX  # what transformers writes for "masked"
        self.check(self.push_and_get(q, k, attn_mask=m), reference(q, k, mask=m))

    def test_two_dimensional_mask(self):
        q, k = randn(1, 2, 6, 8), randn(1, 2, 6, 8)
        m = np.tril(np.ones((6, 6), bool))  # [Nq, Nk]: as SDPA takes it
        self.check(self.push_and_get(q, k, attn_mask=m), reference(q, k, causal=True))

    def test_float32_computed_as_bfloat16(self):
        q, k = randn(2, 2, 9, 32, scale=3.0), randn(2, 2, 9, 32)
        heads = self.push_and_get(q, k, causal=True, compute_dtype="bfloat16")
        self.check(heads, reference(q, k, causal=True, compute="bfloat16"))
        full = reference(q, k, causal=True)
        self.assertGreater(max(abs(h["entropy_mean"] - r["entropy_mean"])
                               for h, r in zip(heads, full)), 1e-7,
                           "rounding to bfloat16 changed nothing: was compute_dtype ignored?")

    def test_bad_masks_are_refused_with_a_reason(self):
        q, k = randn(1, 2, 4, 8), randn(1, 2, 5, 8)
        with self.d.client(self.run_name()) as c:
            for m, needle in ((np.ones((1, 2, 4, 4), bool), "shape"),
                              (np.ones((1, 2, 4, 5), np.int32), "int32"),
                              (np.ones((3, 4, 5), np.float32), "shape")):
                with self.assertRaises(attnstat.AttnstatError) as cm:
                    c.push(0, 0, q, k, attn_mask=m)
                self.assertIn(needle, str(cm.exception))


@need_daemon
class TestSinksEndToEnd(DaemonCase):
    """Attention sinks (Client.push(sinks=...)) on host tensors, through the daemon's CPU worker,
    against the float64 softmax over the keys and the sink computed here."""

    push_and_get = push_and_get

    def check(self, heads, ref, rel=1e-5):
        self.assertEqual(len(heads), len(ref))
        for h, r in zip(heads, ref):
            for f in ("rows", "rows_norm", "rows_empty", "nonfinite_rows"):
                self.assertEqual(h[f], r[f], "head %d %s" % (h["head"], f))
            for f in ("entropy_mean", "entropy_min", "entropy_max", "entropy_norm_mean",
                      "max_logit"):
                want, g = r[f], h[f]
                if r["rows"] == 0:  # no statistic: NaN (the max logit of no row may say -inf)
                    self.assertTrue(math.isnan(g) or (f == "max_logit" and g == -math.inf),
                                    "head %d %s: daemon %r for no row" % (h["head"], f, g))
                    continue
                if math.isnan(want) or math.isinf(want):
                    self.assertTrue(g == want or (math.isnan(g) and math.isnan(want)),
                                    "head %d %s: daemon %r, float64 %r" % (h["head"], f, g, want))
                    continue
                self.assertLessEqual(abs(g - want), rel * max(abs(want), 1e-3) + 1e-6,
                                     "head %d %s: daemon %r, float64 %r" % (h["head"], f, g, want))

    def test_sinks_with_gqa_and_causal(self):
        q, k = randn(2, 4, 9, 16, scale=2.0), randn(2, 2, 11, 16)
        sinks = randn(4, scale=2.0) + np.float32(1.5)
        sinks[3] = -np.inf  # no sink for head 3
        heads = self.push_and_get(q, k, causal=True, sinks=sinks)
        self.check(heads, reference(q, k, causal=True, sinks=sinks))
        plain = reference(q, k, causal=True)
        self.assertGreater(min(abs(h["entropy_mean"] - p["entropy_mean"])
                               for h, p in zip(heads[:3], plain[:3])), 1e-4,
                           "the sinks changed nothing: were they ignored?")

    def test_float16_sinks_reshaped_strided_with_a_mask(self):
        q, k = randn(2, 3, 7, 16, scale=3.0), randn(2, 3, 10, 16)
        rng = np.random.default_rng()
        m = (rng.standard_normal((1, 3, 7, 10)) * 2.0).astype(np.float32)
        m[0, 0, 2, :] = -np.inf  # a row that sees no key: empty, sink or not
        wide = (rng.standard_normal((3, 2)) * 2.0 + 1.0).astype(np.float16)
        sinks = wide[:, :1]  # [Hq, 1], strided: taken as [Hq]
        self.check(self.push_and_get(q, k, attn_mask=m, sinks=sinks),
                   reference(q, k, mask=m, sinks=sinks[:, 0].astype(np.float64)))

    def test_one_visible_key_has_a_normalised_entropy(self):
        q, k = randn(1, 2, 12, 8), randn(1, 2, 12, 8)
        sinks = np.array([0.3, -0.7], np.float32)
        heads = self.push_and_get(q, k, causal=True, window=(0, 0), sinks=sinks)
        self.check(heads, reference(q, k, causal=True, window=(0, 0), sinks=sinks))
        for h in heads:  # one key and the sink: two outcomes, normalised by ln 2
            self.assertEqual(h["rows_norm"], h["rows"])
            self.assertEqual(h["rows"], 12)

    def test_nan_and_inf_sinks_count_rows_non_finite(self):
        q, k = randn(1, 4, 6, 8), randn(1, 4, 9, 8)
        sinks = np.array([np.nan, 0.5, np.inf, 40.0], np.float32)  # 40: the sink takes it all
        heads = self.push_and_get(q, k, sinks=sinks)
        self.check(heads, reference(q, k, sinks=sinks))
        self.assertEqual([h["nonfinite_rows"] for h in heads], [6, 0, 6, 0])
        self.assertLess(heads[3]["entropy_max"], 1e-9)

    def test_bad_sinks_are_refused_with_a_reason(self):
        q, k = randn(1, 2, 4, 8), randn(1, 2, 5, 8)
        with self.d.client(self.run_name()) as c:
            for s, needle in ((np.zeros(3, np.float32), "one per query head (q has 2)"),
                              (np.zeros((2, 2), np.float32), "one value per query head"),
                              (np.zeros(2, np.int32), "float32"),
                              (np.zeros(0, np.float32), "empty")):
                with self.assertRaises(attnstat.AttnstatError) as cm:
                    c.push(0, 0, q, k, sinks=s)
                self.assertIn(needle, str(cm.exception))
                self.assertEqual(cm.exception.code, _lib.EINVAL)
            self.assertTrue(c.push(0, 0, q, k, sinks=np.ones(2, np.float32)))
            self.assertTrue(c.flush(60))

    def test_stream_waits_is_refused_where_the_daemon_computes(self):
        """stream_waits (the caller's stream waits for the computation, local mode only): host
        tensors computed by the daemon are refused saying why, and nothing is sent."""
        q, k = randn(1, 2, 4, 8), randn(1, 2, 5, 8)
        with self.d.client(self.run_name()) as c:
            with self.assertRaises(attnstat.AttnstatError) as cm:
                c.push(0, 0, q, k, stream_waits=True)
            self.assertEqual(cm.exception.code, _lib.EINVAL)
            self.assertIn("local mode", str(cm.exception))
            self.assertTrue(c.push(1, 0, q, k))
            self.assertTrue(c.flush(60))
            self.assertEqual(c.stats()["acked"], 1)

    def test_max_logit_out_is_refused_where_the_daemon_computes(self):
        """max_logit_out (each head's max logit written on the device, local mode only) and
        local_wait: refused saying why, nothing sent; a host array is not a CUDA float64 tensor."""
        q, k = randn(1, 2, 4, 8), randn(1, 2, 5, 8)
        with self.d.client(self.run_name()) as c:
            with self.assertRaises(attnstat.AttnstatError) as cm:
                c.push(0, 0, q, k, max_logit_out=np.zeros(2))
            self.assertEqual(cm.exception.code, _lib.EINVAL)
            self.assertIn("CUDA torch.float64 tensor", str(cm.exception))
            with self.assertRaises(attnstat.AttnstatError) as cm:
                c.local_wait(stream=0)
            self.assertEqual(cm.exception.code, _lib.EINVAL)
            self.assertIn("is for local mode", str(cm.exception))
            self.assertTrue(c.push(1, 0, q, k))
            self.assertTrue(c.flush(60))
            self.assertEqual(c.stats()["acked"], 1)


@need_daemon
class TestRejectionsAreNeverSilent(DaemonCase):
    daemon_args = ("--max-push-work", "4096")

    def test_client_monitor_status_and_log(self):
        run = self.run_name()
        big_q, big_k = randn(1, 4, 16, 32), randn(1, 4, 16, 32)  # 4*16*16*32 > 4096
        fake = FakeTorch(np_sdpa)
        try:
            with self.d.client(run) as c, warnings.catch_warnings(record=True) as w:
                warnings.simplefilter("always")
                with attnstat.torch.monitor(c, every=1) as mon:
                    for _ in range(3):
                        fake.F.scaled_dot_product_attention(FakeTensor(big_q), FakeTensor(big_k),
                                                            FakeTensor(big_k))
                        mon.step()
                    c.flush(60)
                    c.poll(0)
                st = c.stats()
                status = c.status()
        finally:
            fake.restore()
        self.assertEqual(mon.pushed, 3)
        self.assertEqual(st["rejected"], 3)
        self.assertIn("max_push_work", st["last_error"])
        self.assertEqual(mon.rejected, 3)
        said = [str(x.message) for x in w if "did not store" in str(x.message)]
        self.assertEqual(len(said), 1, said)  # once per reason
        self.assertIn("max_push_work", said[0])
        rej = {r["code"]: r for r in status["rejections"]}
        self.assertGreaterEqual(rej["BAD_REQUEST"]["count"], 3)
        self.assertIn("max_push_work", rej["BAD_REQUEST"]["last_message"])
        deadline = time.monotonic() + 30
        while True:  # the daemon's log line: the first of its kind from this client, once
            lines = [x for x in self.d.log_text().splitlines()
                     if re.search(r"answered BAD_REQUEST.*max_push_work", x)]
            if lines or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        self.assertEqual(len(lines), 1, lines)


if __name__ == "__main__":
    unittest.main(verbosity=2)
