#!/usr/bin/env python3
"""test_python_interventions.py — Client.intervention, what a job did to its model because of what
was measured (attnstat.torch.qk_clip's clipped heads), through a real attnstatd into the run's
history: stored exactly, numbered globally under a layout, bad fields refused before the library
is called or by it (the field named), the run going on. What qk_clip sends is checked on
stand-ins in test_python_qkclip.py; the C API against a scripted daemon in test_client.c; the
daemon's checks and the store in test_daemon_interv.c and test_store_interv.c.

Skipped (77) without NumPy; the class skips when attnstatd or libattnstat.so is not built.
"""
import json
import time
import unittest

from pyhelpers import RNG, DaemonCase, need_daemon, randn  # noqa: E402

import attnstat  # noqa: E402
from attnstat import _lib  # noqa: E402


@need_daemon
class TestInterventions(DaemonCase):
    def test_interventions_recorded(self):
        """Client.intervention: what a job did because of what was measured (qk_clip's clipped
        heads) lands in the run's history exactly, numbered globally under a layout (tp_rank 1
        of 2: heads + this rank's head_offset); bad fields refused here with the field named,
        nothing sent; the run goes on."""
        run = self.run_name()
        heads = sorted(int(h) for h in RNG.choice(16, 3, replace=False))
        vals = [float(v) for v in RNG.uniform(0.05, 0.95, 3)]
        step = int(RNG.integers(1, 1 << 40))
        tau, measured = float(RNG.uniform(20, 200)), float(RNG.uniform(300, 900))
        with self.d.client(run) as c:
            self.assertTrue(c.intervention("qk_clip", step, layer=5, heads=heads, values=vals,
                                           threshold=tau, measured=measured, detail='{"g": 4}'))
            self.assertTrue(c.intervention("note", step + 1))
            for kw, says in ((dict(kind="Bad Kind", step=1), "kind"),
                             (dict(kind="qk_clip", step=1, heads=[1, 2], values=[0.5]), "values"),
                             (dict(kind="qk_clip", step=-3), "step"),
                             (dict(kind="qk_clip", step=1, heads=[-1]), "heads")):
                with self.assertRaises(attnstat.AttnstatError) as e:
                    c.intervention(**kw)
                self.assertEqual(e.exception.code, _lib.EINVAL)
                self.assertIn(says, str(e.exception))
            c.set_layout(tp_rank=1, tp_size=2, head_offset=16, layer_offset=10)
            self.assertTrue(c.intervention("qk_clip", step + 2, layer=0, heads=[0, 3],
                                           values=[0.5, 0.25], threshold=tau))
            q, k = randn(1, 2, 8, 16), randn(1, 2, 8, 16)  # the run goes on
            self.assertTrue(c.push(step + 3, 0, q, k))
            self.assertTrue(c.flush(30))
        got = []
        for _ in range(200):  # stored with the next commit of the daemon's batch
            got = self.d.query("SELECT step, kind, layer, heads, head_values, threshold, measured, "
                               "detail FROM interventions JOIN runs ON runs.id = "
                               "interventions.run_id WHERE runs.name = ? ORDER BY step", run)
            if len(got) == 3:
                break
            time.sleep(0.05)
        self.assertEqual(len(got), 3, got)
        s0, k0, l0, h0, v0, t0, m0, d0 = got[0]
        self.assertEqual((s0, k0, l0, json.loads(h0), t0, m0, d0),
                         (step, "qk_clip", 5, heads, tau, measured, '{"g": 4}'))
        self.assertEqual(json.loads(v0), vals)  # bit for bit
        self.assertEqual(got[1][:4], (step + 1, "note", None, "[]"))
        self.assertIsNone(got[1][4])
        self.assertEqual((got[2][2], json.loads(got[2][3]), json.loads(got[2][4])),
                         (10, [16, 19], [0.5, 0.25]))


if __name__ == "__main__":
    unittest.main(verbosity=2)
