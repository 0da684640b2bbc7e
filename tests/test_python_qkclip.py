#!/usr/bin/env python3
"""attnstat's QK-Clip rule (client/python/attnstat/_qkclip.py) against a NumPy reference: the
factors themselves, and what they do to a layer's logits when its projection rows are scaled by
them (multi-head, grouped and multi-query attention, fresh random weights each run)."""
import math
import os
import sys
import unittest

try:
    import numpy as np
except ImportError:
    print("test_python_qkclip: NumPy is not installed; skipped")
    sys.exit(77)

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "client", "python"))
from attnstat._qkclip import qk_clip_factors  # noqa: E402

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


if __name__ == "__main__":
    unittest.main(verbosity=2)
