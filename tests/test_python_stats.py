#!/usr/bin/env python3
"""test_python_stats.py — the statistics a push asks for, from Python (stats= of Client.push and
attnstat.torch.monitor).

Offline: the names and their bits come from vocab.h's table (attnstat._vocab.STATS: bit i is row
i, a name stands for the rows that ask by it, the defaults are the rows marked VOCAB_ON); every
form (None, "all", "default", a name, an iterable, the bits) parses to those bits, and anything
else raises ValueError listing the valid names, before the library is called; attnstat_push_ext
gets the bits, and a libattnstat too old to read them makes the push raise ENOTSUP. The float64
reference's sink mass and distance on a case with a known answer.
End to end (when attnstatd is built): pushes asking for different statistics through a real
daemon get exactly those back (results and store), equal to the float64 reference; the monitor's
stats="all" stores the sink mass and distance of every call. The monitor's own checks (at
creation, the bits it pushes) are in test_python_monitor.py.

Skipped (77) without NumPy; the end-to-end class skips when attnstatd or libattnstat.so is not
built.
"""
import ctypes
import math
import os
import socket
import tempfile
import unittest

from pyhelpers import (LIB, DaemonCase, FakeTensor, FakeTorch, need_daemon, need_lib,  # noqa: E402
                       np, np_sdpa, randn, reference_stats)

import attnstat  # noqa: E402
import attnstat.torch  # noqa: E402
from attnstat import _lib, _pushargs  # noqa: E402
from attnstat import _vocab as vocab  # noqa: E402


def table():
    """{ask name: bits} of the table, the defaults' bits and every statistic's, read here from the
    rows themselves."""
    rows, default = {}, 0
    for i, r in enumerate(vocab.STATS):
        rows[r["ask"]] = rows.get(r["ask"], 0) | 1 << i
        if r["dflt"] == "VOCAB_ON":
            default |= 1 << i
    return rows, default, (1 << len(vocab.STATS)) - 1


class TestReference(unittest.TestCase):
    def test_sink_mass_and_distance(self):
        """Keys all alike: every visible key has the same weight, so a row seeing n keys has a
        sink mass of 1/n and a distance of the mean of |pos - j| over them (causal, Nk > Nq: row i
        sees keys 0 .. i + Nk - Nq)."""
        D, NQ, NK = 8, 4, 6
        q = randn(1, 1, NQ, D)
        k = np.repeat(randn(1, 1, 1, D), NK, axis=2)
        r = reference_stats(q, k, causal=True)[0]
        seen = [i + NK - NQ + 1 for i in range(NQ)]
        self.assertAlmostEqual(r["sink_mass"], np.mean([1.0 / n for n in seen]), places=12)
        self.assertAlmostEqual(r["distance"], np.mean([np.mean(np.arange(n)) for n in seen]),
                               places=12)


class TestStatsChoice(unittest.TestCase):
    def setUp(self):
        self.mask = _pushargs.stats_mask
        self.rows, self.default, self.all = table()

    def test_names_are_the_tables(self):
        self.assertEqual(sorted(self.rows), ["distance", "entropy", "max_logit", "sink_mass"])
        self.assertEqual(sum(bin(b).count("1") for b in self.rows.values()), len(vocab.STATS))
        for i, r in enumerate(vocab.STATS):
            self.assertTrue(self.mask(r["ask"]) >> i & 1, "%s asks by %r" % (r["name"], r["ask"]))
            self.assertEqual(bool(self.mask("default") >> i & 1), r["dflt"] == "VOCAB_ON",
                             r["name"])
        # sink_mass and distance are asked for; everything else comes by default
        self.assertEqual(self.mask("default") & (self.mask("sink_mass") | self.mask("distance")),
                         0)
        self.assertEqual(self.mask("default"), self.mask(("entropy", "max_logit")))

    def test_each_form(self):
        m, rows = self.mask, self.rows
        self.assertEqual(m(None), 0)
        self.assertEqual(m("all"), self.all)
        self.assertEqual(m("default"), self.default)
        for name, bits in rows.items():
            self.assertEqual(m(name), bits)
            self.assertEqual(m([name]), bits)
        self.assertEqual(m(("entropy", "max_logit", "sink_mass", "distance")), self.all)
        self.assertEqual(m(("default", "sink_mass")), self.default | rows["sink_mass"])
        self.assertEqual(m(n for n in ("distance", "max_logit")),
                         rows["distance"] | rows["max_logit"])
        self.assertEqual(m({"sink_mass", "all"}), self.all)
        self.assertEqual(m(rows["sink_mass"]), rows["sink_mass"])  # the bits themselves
        self.assertEqual(m(np.uint32(self.all)), self.all)
        for bad in ("entropy_mean", "Sink_mass", ("entropy", None), [], 1 << 31, True, 0.5, -1):
            with self.assertRaises(ValueError) as cm:
                m(bad)
            self.assertIn("stats", str(cm.exception))

    @need_lib
    def test_the_library_gets_the_bits(self):
        for stats, want in (("all", self.all), ("sink_mass", self.rows["sink_mass"]),
                            (("max_logit", "distance"), self.rows["max_logit"] |
                             self.rows["distance"]), ("default", 0), (None, 0)):
            ext = _pushargs._Ext(None, None, None, None, stats=self.mask(stats))
            self.assertEqual(ext.needed, want != 0, "stats=%r" % (stats,))
            e = ctypes.cast(ext.fill(LIB), ctypes.POINTER(_lib.PushExt)).contents
            self.assertEqual(e.stats, want, "stats=%r" % (stats,))
            self.assertGreaterEqual(e.size, _lib.PUSH_EXT_SIZE_STATS)
        # a libattnstat whose struct ends before stats would compute the defaults: refused
        saved = _lib.PUSH_EXT_SIZE_STATS
        _lib.PUSH_EXT_SIZE_STATS = ctypes.sizeof(_lib.PushExt) + 1
        try:
            with self.assertRaises(attnstat.AttnstatError) as cm:
                _pushargs._Ext(None, None, None, None, stats=self.all).fill(LIB)
            self.assertEqual(cm.exception.code, _lib.ENOTSUP)
            self.assertIn("this one is older", str(cm.exception))
            _pushargs._Ext(None, None, None, None, stats=0).fill(LIB)  # asks nothing: fine
        finally:
            _lib.PUSH_EXT_SIZE_STATS = saved


@need_lib
class TestPushArgument(unittest.TestCase):
    """Client.push(stats=...) against a bare listening socket (no daemon, no hello)."""

    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        path = os.path.join(self.dir.name, "bare.sock")
        self.srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.srv.bind(path)
        self.srv.listen(4)
        self.c = attnstat.Client(socket=path, hello=False, lib=LIB)

    def tearDown(self):
        self.c.close()
        self.srv.close()
        self.dir.cleanup()

    def test_checked_before_the_library(self):
        """An unknown name, an empty choice, a bool, a list in the list or bits past the table
        raise ValueError (an AttnstatError EINVAL too) naming stats and listing the names a push
        asks by; a valid choice goes on to the library (no hello yet: ESTATE)."""
        q, k = randn(1, 2, 8, 16), randn(1, 2, 8, 16)
        names = sorted({r["ask"] for r in vocab.STATS}) + ["all", "default"]
        for bad in ("entropy_mean", "ALL", ("entropy", "bogus"), (), True, 1 << len(vocab.STATS),
                    -1, 2.0, [["sink_mass"]]):
            with self.assertRaises(ValueError) as cm:
                self.c.push(0, 0, q, k, stats=bad)
            e = cm.exception
            self.assertIsInstance(e, attnstat.AttnstatError)
            self.assertEqual(e.code, _lib.EINVAL, str(e))
            self.assertIn("stats", str(e))
            if isinstance(bad, (str, tuple, list, bool)):
                for n in names:
                    self.assertIn(repr(n), str(e), "stats=%r" % (bad,))
        for good in ("all", "sink_mass", ("default", "distance"), None, "default"):
            with self.assertRaises(attnstat.AttnstatError) as cm:
                self.c.push(0, 0, q, k, stats=good)
            self.assertEqual(cm.exception.code, _lib.ESTATE, "stats=%r: %s" % (good, cm.exception))


@need_daemon
class TestThroughTheDaemon(DaemonCase):
    def test_each_push_gets_what_it_asked(self):
        """Each push gets what it asked for: a statistic asked for is in the results (equal to
        the float64 reference where it computes one) and stored; one not asked for is NaN in the
        results and NULL in the store; the counts always there."""
        run = self.run_name()
        rows, default, every = table()
        asks = [(None, default), ("all", every), ("sink_mass", rows["sink_mass"]),
                (("default", "distance"), default | rows["distance"])]
        q, k = randn(2, 4, 24, 16, scale=1.5), randn(2, 2, 30, 16, scale=1.5)
        ref = reference_stats(q, k, causal=True)
        got = {}
        with self.d.client(run) as c:
            c.on_result(lambda seq, step, layer, heads: got.setdefault(layer, heads))
            for layer, (stats, _) in enumerate(asks):
                self.assertTrue(c.push(5, layer, q, k, causal=True, want_results=True,
                                       stats=stats))
            self.assertTrue(c.flush(30))
            st = c.stats()
            self.assertEqual((st["acked"], st["rejected"]), (len(asks), 0), st)
        names = [r["name"] for r in vocab.STATS]
        for layer, (stats, bits) in enumerate(asks):
            stored = self.d.query("SELECT samples.head, samples.rows, %s FROM samples JOIN runs ON "
                                  "runs.id = samples.run_id WHERE runs.name = ? AND samples.layer "
                                  "= ? ORDER BY samples.head" % ", ".join("samples." + n
                                                                           for n in names),
                                  run, layer)
            self.assertEqual(len(stored), 4)
            self.assertEqual(sorted(h["head"] for h in got[layer]), [0, 1, 2, 3])
            for h in got[layer]:
                row, r = stored[h["head"]], ref[h["head"]]
                self.assertEqual(h["rows"], r["rows"])
                self.assertEqual(row[1], r["rows"])
                for i, n in enumerate(names):
                    asked = bool(bits >> i & 1)
                    what = "stats=%r head %d %s" % (stats, h["head"], n)
                    self.assertEqual(not math.isnan(h[n]), asked, what + " in the results")
                    self.assertEqual(row[2 + i] is not None, asked, what + " stored")
                    if asked and n in r:
                        self.assertClose(h[n], r[n], 1e-5, what, 1e-6)
                        self.assertEqual(row[2 + i], h[n], what)

    def test_monitor_asks_for_every_statistic(self):
        """monitor(stats="all"): each call's sink mass and distance are stored, equal to the
        float64 reference, beside the entropy."""
        run = self.run_name()
        fake = FakeTorch(np_sdpa)
        try:
            q, k = randn(1, 4, 12, 16, scale=1.5), randn(1, 2, 12, 16, scale=1.5)
            with self.d.client(run) as c:
                with attnstat.torch.monitor(c, strict=True, stats="all") as mon:
                    fake.F.scaled_dot_product_attention(FakeTensor(q), FakeTensor(k),
                                                        FakeTensor(k), is_causal=True,
                                                        enable_gqa=True)
                    mon.step()
                self.assertTrue(c.flush(30))
            self.assertEqual(mon.pushed, 1)
        finally:
            fake.restore()
        ref = reference_stats(q, k, causal=True)
        self.check_stored(run, 0, 0, ref, 1e-6)
        stored = self.d.query("SELECT samples.head, sink_mass, distance FROM samples JOIN runs ON "
                              "runs.id = samples.run_id WHERE runs.name = ? ORDER BY samples.head",
                              run)
        self.assertEqual([r[0] for r in stored], [0, 1, 2, 3])
        for h, sink, dist in stored:
            self.assertClose(sink, ref[h]["sink_mass"], 1e-5, "head %d sink_mass" % h, 1e-6)
            self.assertClose(dist, ref[h]["distance"], 1e-5, "head %d distance" % h, 1e-6)


if __name__ == "__main__":
    unittest.main(verbosity=2)
