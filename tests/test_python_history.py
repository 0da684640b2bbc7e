#!/usr/bin/env python3
"""test_python_history.py — tests of attnstat.history (client/python/attnstat/_history.py), the
reader of the history database that needs only Python's sqlite3 module.

A database written through the store by tests/store_dbgen (every tier: exact rows, compact rows
with listed head ids and per-head times, buckets; empty heads with NaN / -inf; alerts) comes with
the store's own export of every run (JSON lines, store_format_sample). The reader's rows must equal
the store's, field for field and bit for bit, in the same order, whole and filtered by layer, head
and step range. Also: runs by id and name, ambiguous and unknown runs, a file that is not an
attnstat database, a version-1 database (001_init.sql, exact rows only), active alerts; the
compact format's layout by its rule (versions 1 and 2), a version-1 row built by hand, and
tests/fixtures/store_v4.db (made by the store of schema version 4, version-1 compact rows) read as
it is against the store's export of a migrated copy.
pandas is not installed on the development machine: dataframe() is then checked to raise
ImportError with a message; where pandas exists, the frame is checked against samples().

Environment: ATTNSTAT_STORE_DBGEN (the store_dbgen executable). Without it, exits 77 (skipped).
"""
import json
import math
import os
import random
import shutil
import sqlite3
import struct
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "client", "python"))

import attnstat  # noqa: E402
from attnstat import _history  # noqa: E402

DBGEN = os.environ.get("ATTNSTAT_STORE_DBGEN")
SEED = int(os.environ.get("ATTNSTAT_TEST_SEED") or random.SystemRandom().randrange(1, 1 << 62))


def same(a, b):
    """Equal as the export says: null for NaN and infinities, else the exact double."""
    if isinstance(b, float) or b is None:
        if b is None:
            return isinstance(a, float) and not math.isfinite(a)
        return a == b
    return a == b


class HistoryReader(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory(prefix="attnstat-pyhist-")
        cls.db = os.path.join(cls.tmp.name, "history.db")
        export = os.path.join(cls.tmp.name, "export.jsonl")
        subprocess.run([DBGEN, cls.db, export, str(SEED)], check=True)
        with open(export) as f:
            cls.want = [json.loads(line) for line in f]
        cls.h = attnstat.history(cls.db)

    @classmethod
    def tearDownClass(cls):
        cls.h.close()
        cls.tmp.cleanup()

    def check_rows(self, got, want, what):
        self.assertEqual(len(got), len(want), what)
        for i, (g, w) in enumerate(zip(got, want)):
            self.assertEqual(set(g), set(w), what)
            for k in w:
                self.assertTrue(same(g[k], w[k]), "%s row %d (%s layer %d head %d step %d): %s "
                                "is %r, the store says %r" % (what, i, w["tier"], w["layer"],
                                                               w["head"], w["step"], k, g[k],
                                                               w[k]))

    def test_runs(self):
        runs = self.h.runs()
        self.assertEqual([(r["name"], r["rank"]) for r in runs],
                         [("gpt", 0), ("gpt", 1), ("bert", 0)])
        self.assertEqual(runs[0]["step_max"], 119)
        self.assertEqual(self.h.run_id("bert"), runs[2]["id"])
        self.assertEqual(self.h.run_id("gpt", rank=1), runs[1]["id"])
        with self.assertRaisesRegex(attnstat.HistoryError, "matches 2 runs"):
            self.h.run_id("gpt")
        with self.assertRaisesRegex(attnstat.HistoryError, "no run named"):
            self.h.samples("nope")
        with self.assertRaisesRegex(attnstat.HistoryError, "no run with id"):
            self.h.samples(9999)

    def test_every_row_as_the_store_reads_it(self):
        tiers = set()
        for r in self.h.runs():
            want = [w for w in self.want if w["run_id"] == r["id"]]
            got = self.h.samples(r["id"])
            self.check_rows(got, want, "run %d" % r["id"])
            tiers |= {w["tier"] for w in want}
        self.assertEqual(tiers, {"exact", "compact", "bucket"})
        # heads 0, 1 of bert's step 60 layer 0 are in both tiers: the exact ones, then compact
        bert = self.h.run_id("bert")
        at60 = [(w["head"], w["tier"]) for w in self.want
                if w["run_id"] == bert and w["layer"] == 0 and w["step"] == 60]
        self.assertEqual(at60[:3], [(0, "exact"), (1, "exact"), (2, "compact")])
        # the row with listed head ids (head 40) and the per-head times came through
        gpt = self.h.run_id("gpt", rank=0)
        self.assertTrue(any(w["head"] == 40 and w["tier"] == "compact" for w in self.want
                            if w["run_id"] == gpt))

    def test_filters(self):
        rng = random.Random(SEED)
        rid = self.h.run_id("bert")
        allw = [w for w in self.want if w["run_id"] == rid]
        for _ in range(12):
            layer = rng.choice([None, 0, 1, 2])
            head = rng.choice([None, 0, 3, 5])
            lo, hi = sorted(rng.randrange(-5, 125) for _ in range(2))
            if rng.random() < 0.3:
                lo, hi = None, None
            want = [w for w in allw
                    if (layer is None or w["layer"] == layer) and
                    (head is None or w["head"] == head) and
                    (lo is None or (w["step_last"] >= lo and w["step"] <= hi))]
            got = self.h.samples(rid, layer=layer, head=head, step_from=lo, step_to=hi)
            self.check_rows(got, want, "layer %s head %s steps %s..%s" % (layer, head, lo, hi))

    def test_alerts(self):
        alerts = self.h.alerts()
        self.assertEqual(len(alerts), 3 * 12)
        self.assertEqual(alerts, sorted(alerts, key=lambda a: a["id"]))
        active = self.h.alerts(run="bert", active=True)
        self.assertTrue(active and all(a["state"] == "raised" for a in active))
        keys = {(a["layer"], a["head"], a["rule"]) for a in active}
        self.assertEqual(len(keys), len(active))

    def test_dataframe(self):
        try:
            import pandas  # noqa: F401
        except ImportError:
            print("pandas is not installed: dataframe() is checked to say so", file=sys.stderr)
            with self.assertRaisesRegex(ImportError, "pandas"):
                self.h.dataframe("bert")
            return
        df = self.h.dataframe("bert", layer=1)
        self.assertEqual(len(df), len(self.h.samples("bert", layer=1)))

    def test_not_a_history(self):
        other = os.path.join(self.tmp.name, "other.db")
        con = sqlite3.connect(other)
        con.execute("CREATE TABLE x (y)")
        con.commit()
        con.close()
        with self.assertRaisesRegex(attnstat.HistoryError, "not an attnstat history"):
            attnstat.history(other)
        with self.assertRaisesRegex(attnstat.HistoryError, "cannot read"):
            attnstat.history(os.path.join(self.tmp.name, "missing.db"))

    def test_fifo_refused(self):
        # a FIFO named *.db: refused at once (SQLite's open would wait for a writer for ever)
        fifo = os.path.join(self.tmp.name, "fifo-%d.db" % random.randrange(1 << 30))
        os.mkfifo(fifo)
        try:
            with self.assertRaisesRegex(attnstat.HistoryError, "is a FIFO, not a database file"):
                attnstat.history(fifo)
            with self.assertRaisesRegex(attnstat.HistoryError, "is a directory"):
                attnstat.history(self.tmp.name)
        finally:
            os.unlink(fifo)

    def test_version_1(self):
        path = os.path.join(self.tmp.name, "v1.db")
        con = sqlite3.connect(path)
        with open(os.path.join(ROOT, "schema", "001_init.sql")) as f:
            con.executescript(f.read())
        con.execute("PRAGMA user_version = 1")
        con.execute("PRAGMA application_id = %d" % 0x61747374)
        con.execute("INSERT INTO runs (id, name, started, last_hello) VALUES (1, 'old', 1, 1)")
        con.execute("INSERT INTO samples VALUES (1, 0, 1, 7, 99, 5, 4, 0, 0, 1.5, NULL, 0.5, 2.5, "
                    "0.75, 0.0, 12.0, 0)")
        con.commit()
        con.close()
        with attnstat.history(path) as h:
            rows = h.samples("old")
            self.assertEqual(len(rows), 1)
            r = rows[0]
            self.assertEqual((r["tier"], r["head"], r["step"], r["rows"]), ("exact", 1, 7, 5))
            self.assertTrue(math.isnan(r["entropy_std"]))
            self.assertEqual(r["max_logit_hi"], 12.0)

    def test_damaged_compact_row(self):
        with self.assertRaisesRegex(attnstat.HistoryError, "compact row"):
            _history.unpack(b"\x01\x05\x00" + b"\x00" * 10, 0)
        with self.assertRaisesRegex(attnstat.HistoryError, "format"):
            _history.unpack(b"\x03\x01\x00", 0)
        with self.assertRaisesRegex(attnstat.HistoryError, "format"):
            _history.unpack(b"\x00\x01\x00", 0)

    def test_new_statistics_through_every_tier(self):
        # store_dbgen writes finite sink_mass and distance: they come back from every tier
        seen = {w["tier"] for w in self.want
                if w["sink_mass"] is not None and w["distance"] is not None}
        self.assertEqual(seen, {"exact", "compact", "bucket"})

    def test_layout_rule(self):
        # schema/store_pack.h: version 1 is f32 entropy_mean, f32 max_logit, u16 entropy_std,
        # entropy_min, entropy_max, entropy_norm_mean, collapsed_frac; version 2 adds f32 distance
        # after max_logit and u16 sink_mass at the end
        v1, size1 = _history.layout(1)
        self.assertEqual([(c[0], c[1], c[3]) for c in v1],
                         [("entropy_mean", "f", 0), ("max_logit", "f", 4), ("entropy_std", "H", 8),
                          ("entropy_min", "H", 10), ("entropy_max", "H", 12),
                          ("entropy_norm_mean", "H", 14), ("collapsed_frac", "H", 16)])
        self.assertEqual(size1, 18)
        v2, size2 = _history.layout(2)
        self.assertEqual([c[0] for c in v2],
                         ["entropy_mean", "max_logit", "distance", "entropy_std", "entropy_min",
                          "entropy_max", "entropy_norm_mean", "collapsed_frac", "sink_mass"])
        self.assertEqual(size2, 24)

    def test_version_1_row_by_hand(self):
        # two heads, ids 0 and 1, the same counts, the row's time: built from the documented bytes
        rng = random.Random(SEED ^ 0x51)
        mean = [rng.uniform(0.1, 5) for _ in range(2)]
        logit = [rng.uniform(-50, 50) for _ in range(2)]
        u16 = [[rng.randrange(1, 60000) for _ in range(2)] for _ in range(5)]
        b = bytes([1, 2, 0]) + struct.pack("<2f", *mean) + struct.pack("<2f", *logit)
        for col in u16:
            b += struct.pack("<2H", *col)
        b += bytes([0b10]) + bytes([2 * 7, 2 * 3, 0, 2 * 1])  # sampled: head 1; zigzag counts
        rows = _history.unpack(b, 1234)
        self.assertEqual([(h, t) for h, t, _ in rows], [(0, 1234), (1, 1234)])
        for h, (_, _, s) in enumerate(rows):
            self.assertEqual(s["entropy_mean"], struct.unpack("<f", struct.pack("<f", mean[h]))[0])
            self.assertEqual(s["max_logit"], struct.unpack("<f", struct.pack("<f", logit[h]))[0])
            for k, f in enumerate(("entropy_std", "entropy_min", "entropy_max")):
                self.assertEqual(s[f], u16[k][h] / 2048.0)
            for k, f in enumerate(("entropy_norm_mean", "collapsed_frac")):
                self.assertEqual(s[f], u16[3 + k][h] / 65534.0)
            self.assertTrue(math.isnan(s["sink_mass"]) and math.isnan(s["distance"]))
            self.assertEqual((s["rows"], s["rows_norm"], s["rows_empty"], s["nonfinite_rows"]),
                             (7, 3, 0, 1))
            self.assertEqual(s["sampled"], h)

    def test_version_4_file(self):
        # tests/fixtures/store_v4.db: made by the store of schema version 4 (compact rows of
        # format version 1, no sink_mass / distance columns). Read as it is, it must equal what
        # the store of today exports from a migrated copy, the new statistics NaN.
        fixture = os.path.join(HERE, "fixtures", "store_v4.db")
        copy = os.path.join(self.tmp.name, "v4-copy.db")
        export = os.path.join(self.tmp.name, "v4-export.jsonl")
        shutil.copyfile(fixture, copy)
        subprocess.run([DBGEN, "--export", copy, export], check=True)
        with open(export) as f:
            want = [json.loads(line) for line in f]
        tiers = set()
        with attnstat.history(fixture) as h:
            self.assertEqual(h.version, 4)
            for r in h.runs():
                w = [x for x in want if x["run_id"] == r["id"]]
                self.check_rows(h.samples(r["id"]), w, "v4 run %d" % r["id"])
                tiers |= {x["tier"] for x in w}
                for x in w:
                    for k in ("sink_mass", "distance"):
                        for e in ("", "_lo", "_hi"):
                            self.assertIsNone(x[k + e])
        self.assertEqual(tiers, {"exact", "compact", "bucket"})


if __name__ == "__main__":
    if not DBGEN:
        print("SKIP: ATTNSTAT_STORE_DBGEN (tests/store_dbgen) is not set")
        sys.exit(77)
    print("test_python_history: seed %d (ATTNSTAT_TEST_SEED=%d to replay)" % (SEED, SEED))
    unittest.main(verbosity=1)
