#!/usr/bin/env python3
"""test_python_restart.py — a Python client survives a daemon restart, end to end.

A real attnstatd on a temporary socket and database (test_python.Daemon); a Client pushes host
arrays, the daemon is stopped (SIGTERM: it drains and exits; SIGKILL: pushes may be in flight) and
a new one started on the same socket and database. Checked: the loss is noticed at the next push,
pushes meanwhile return False at once and are counted (dropped_disconnected), exactly one warning
says so; flush() and close() never raise; the library reconnects by itself (poll() only moves it
on), the run id is the same, pushes after the restart are acknowledged and stored under the same
run, the run's history holds the steps before and after (and none of the gap);
sent = acked + abandoned. Also: a daemon that never comes back leaves flush() and close() quiet.

A trainer that starts before its daemon (a Kubernetes sidecar's order): Client(connect=
"background") made while no socket exists does not raise (the default does), its pushes return
False at once and are counted with one warning, the daemon then starts on that socket, the
library connects by itself and says the hello, and later pushes are acknowledged and stored
under the run (none of those made before); $ATTNSTAT_CONNECT chooses the same; a bad mode is
refused by name.

No timing margins: every wait is for a condition, with a generous deadline.
Environment as test_python.py; exits 77 (skipped) without NumPy.
"""
import os
import signal
import socket
import subprocess
import tempfile
import time
import unittest
import warnings

from pyhelpers import DAEMON, LIB, query_db, randn  # noqa: E402
from pyhelpers import Daemon  # noqa: E402
import attnstat  # noqa: E402
from attnstat import AttnstatError, _lib  # noqa: E402

DEADLINE_S = 120  # for conditions only: a loaded machine takes longer, never fails sooner


class RestartableDaemon(Daemon):
    """Daemon that can be stopped with a signal and started again on its socket and database."""

    def stop_with(self, sig):
        os.kill(self.proc.pid, sig)
        self.proc.wait(DEADLINE_S)

    def start_again(self):
        self.proc = subprocess.Popen([DAEMON, "--socket", self.socket, "--db", self.db],
                                     stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + DEADLINE_S
        while True:
            self.assert_running()
            try:
                with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                    s.connect(self.socket)
                return
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("attnstatd did not listen again:\n" + self.log_text())
            time.sleep(0.02)

    def assert_running(self):
        if self.proc.poll() is not None:
            raise RuntimeError("attnstatd exited with %s:\n%s" % (self.proc.returncode,
                                                                   self.log_text()))


def wait_for(what, cond, poll=None):
    deadline = time.monotonic() + DEADLINE_S
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError("%s: not within %d s" % (what, DEADLINE_S))
        if poll:
            poll()
        else:
            time.sleep(0.01)


@unittest.skipIf(LIB is None or not DAEMON, "attnstatd or libattnstat.so is not built")
class TestRestart(unittest.TestCase):
    def setUp(self):
        self.d = RestartableDaemon()
        self.addCleanup(self.d.stop)

    def survive(self, sig):
        run = "restart-%s-%d" % (signal.Signals(sig).name, os.getpid())
        q, k = randn(1, 2, 16, 16, scale=2.0), randn(1, 2, 16, 16)
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            c = self.d.client(run, timeout_s=30)
            run_id = c.run_id
            self.assertGreater(run_id, 0)
            for layer in range(3):
                self.assertTrue(c.push(0, layer, q, k))
            self.assertTrue(c.flush(DEADLINE_S))
            if sig == signal.SIGKILL:  # in flight at the kill: acknowledged or abandoned
                for layer in range(3):
                    self.assertTrue(c.push(1, layer, q, k))
            self.d.stop_with(sig)

            # The daemon is gone: the next push notices, and every push meanwhile is dropped.
            gap = 0
            for layer in range(5):
                t0 = time.monotonic()
                self.assertFalse(c.push(2, layer, q, k))
                self.assertLess(time.monotonic() - t0, 5.0, "a push waited for the daemon")
                gap += 1
            st = c.stats()
            self.assertEqual(st["link"], "reconnecting", st)
            self.assertIn("closed the connection", st["link_error"])
            self.assertEqual(st["in_flight"], 0)
            # flush() never raises for it; False only when pushes were abandoned
            self.assertEqual(c.flush(5), st["abandoned"] == 0)
            lost_before = st["abandoned"]
            if sig == signal.SIGTERM:  # it drained: everything it had was acknowledged
                self.assertEqual(lost_before, 0)

            self.d.start_again()
            wait_for("the client reconnected", lambda: c.stats()["link"] == "up",
                     poll=lambda: c.poll(50))
            self.assertEqual(c.run_id, run_id)
            for layer in range(3):
                self.assertTrue(c.push(3, layer, q, k))
            self.assertTrue(c.flush(DEADLINE_S))
            st = c.stats()
            c.close()
            c.close()

        self.assertEqual((st["disconnects"], st["reconnects"]), (1, 1), st)
        self.assertEqual(st["dropped_disconnected"], gap)
        self.assertEqual(st["dropped_local"], gap)
        self.assertEqual(st["pushed"], st["sent"] + gap)
        self.assertEqual(st["sent"], st["acked"] + st["abandoned"] + st["dropped_daemon"]
                         + st["rejected"], st)
        self.assertEqual(st["abandoned"], lost_before)
        self.assertEqual((st["dropped_daemon"], st["rejected"], st["in_flight"]), (0, 0, 0))
        link_warnings = [x for x in w if "drops pushes meanwhile" in str(x.message)]
        self.assertEqual(len(link_warnings), 1, [str(x.message) for x in w])
        flush_warnings = [x for x in w if "flush()" in str(x.message)]
        self.assertEqual(len(flush_warnings), 1 if lost_before else 0)

        # One run, its history on both sides of the restart, nothing of the gap.
        self.assertEqual(self.d.query("SELECT id FROM runs WHERE name = ?", run), [(run_id,)])
        steps = {s for (s,) in self.d.query("SELECT DISTINCT step FROM samples WHERE run_id = ?",
                                            run_id)}
        self.assertTrue({0, 3} <= steps <= {0, 1, 3}, steps)
        per_push = {(s, l): n for s, l, n in self.d.query(
            "SELECT step, layer, COUNT(*) FROM samples WHERE run_id = ? GROUP BY step, layer",
            run_id)}
        for key in [(0, 0), (0, 1), (0, 2), (3, 0), (3, 1), (3, 2)]:
            self.assertEqual(per_push.get(key), 2, key)  # both heads
        # acknowledged means stored: the pushes of step 1 not abandoned were acknowledged
        stored_step1 = len([1 for (s, _l) in per_push if s == 1])
        self.assertGreaterEqual(stored_step1, 3 - lost_before if sig == signal.SIGKILL else 0)

    def test_sigterm(self):
        self.survive(signal.SIGTERM)

    def test_sigkill(self):
        self.survive(signal.SIGKILL)

    def test_daemon_that_stays_away(self):
        """flush() and close() stay quiet while the daemon is gone; pushes return False."""
        q = randn(1, 1, 8, 16)
        with warnings.catch_warnings(record=True):
            warnings.simplefilter("always")
            c = self.d.client("gone-%d" % os.getpid(), timeout_s=30)
            self.assertTrue(c.push(0, 0, q, q))
            self.d.stop_with(signal.SIGKILL)
            results = [c.push(1, layer, q, q) for layer in range(10)]
            self.assertEqual(results, [False] * 10)
            c.poll(200)
            self.assertIn(c.flush(2), (True, False))
            self.assertEqual(c.stats()["link"], "reconnecting")
            c.close()


@unittest.skipIf(LIB is None or not DAEMON, "attnstatd or libattnstat.so is not built")
class TestBackground(unittest.TestCase):
    """A Client made before its daemon exists (connect="background")."""

    def setUp(self):
        self.dir = tempfile.TemporaryDirectory(prefix="attnstat-bg-")
        self.addCleanup(self.dir.cleanup)
        self.socket = os.path.join(self.dir.name, "d.sock")
        self.db = os.path.join(self.dir.name, "d.db")
        self.proc = None
        self.log = open(os.path.join(self.dir.name, "d.log"), "w+")
        self.addCleanup(self.log.close)
        self.addCleanup(self.stop_daemon)

    def start_daemon(self):
        self.proc = subprocess.Popen([DAEMON, "--socket", self.socket, "--db", self.db],
                                     stdout=self.log, stderr=subprocess.STDOUT)

    def stop_daemon(self):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(DEADLINE_S)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def query(self, sql, *args):
        return query_db(self.db, sql, *args)

    def test_client_before_its_daemon(self):
        run = "early-%d" % os.getpid()
        # The default still says at once that the daemon is not there.
        with self.assertRaises(AttnstatError) as cm:
            attnstat.Client(socket=self.socket, run=run, lib=LIB)
        self.assertEqual(cm.exception.code, _lib.ECONNECT)
        self.assertIn("no such socket", str(cm.exception))

        q, k = randn(1, 2, 16, 16, scale=2.0), randn(1, 2, 16, 16)
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            t0 = time.monotonic()
            c = attnstat.Client(socket=self.socket, run=run, rank=2, lib=LIB, timeout_s=30,
                                connect="background", config={"started": "before attnstatd"})
            self.assertLess(time.monotonic() - t0, 10.0, "the constructor waited for the daemon")
            self.assertEqual(c.connect, "background")
            self.assertEqual(c.run_id, -1)
            st = c.stats()
            self.assertEqual(st["link"], "reconnecting", st)
            self.assertIn("not connected yet", st["link_error"])
            gap = 6
            for layer in range(gap):
                t0 = time.monotonic()
                self.assertFalse(c.push(0, layer, q, k))
                self.assertLess(time.monotonic() - t0, 5.0, "a push waited for the daemon")
            self.assertTrue(c.flush(5))  # nothing was sent: nothing to wait for
            c.poll(0)
            st = c.stats()
            self.assertEqual((st["pushed"], st["sent"]), (gap, 0), st)
            self.assertEqual((st["dropped_disconnected"], st["dropped_local"]), (gap, gap), st)
            waiting = [x for x in w if "not connected to attnstatd" in str(x.message)]
            self.assertEqual(len(waiting), 1, [str(x.message) for x in w])
            self.assertIn("drops pushes meanwhile", str(waiting[0].message))

            # The sidecar comes up: the library connects and says the hello by itself.
            self.start_daemon()
            wait_for("the client connected to the daemon that came",
                     lambda: c.stats()["link"] == "up", poll=lambda: c.poll(50))
            self.assertGreater(c.run_id, 0)
            for step in (1, 2):
                for layer in range(3):
                    self.assertTrue(c.push(step, layer, q, k))
            self.assertTrue(c.flush(DEADLINE_S))
            st = c.stats()
            run_id = c.run_id
            c.close()
        self.assertEqual((st["reconnects"], st["disconnects"], st["abandoned"]), (0, 0, 0), st)
        self.assertEqual(st["acked"], 6, st)
        self.assertEqual(st["dropped_disconnected"], gap)
        self.assertEqual(self.query("SELECT id, rank, config FROM runs WHERE name = ?", run),
                         [(run_id, 2, '{"started": "before attnstatd"}')])
        per_push = {(s, l): n for s, l, n in self.query(
            "SELECT step, layer, COUNT(*) FROM samples WHERE run_id = ? GROUP BY step, layer",
            run_id)}
        self.assertEqual(per_push, {(s, l): 2 for s in (1, 2) for l in range(3)})

    def test_mode_from_the_environment(self):
        saved = os.environ.get("ATTNSTAT_CONNECT")
        self.addCleanup(lambda: os.environ.__setitem__("ATTNSTAT_CONNECT", saved)
                        if saved is not None else os.environ.pop("ATTNSTAT_CONNECT", None))
        os.environ["ATTNSTAT_CONNECT"] = "background"
        c = attnstat.Client(socket=self.socket, run="env", lib=LIB)
        self.assertEqual((c.connect, c.stats()["link"]), ("background", "reconnecting"))
        c.close()
        with self.assertRaises(AttnstatError):  # the argument wins
            attnstat.Client(socket=self.socket, run="env", lib=LIB, connect="now")
        os.environ["ATTNSTAT_CONNECT"] = "later"
        with self.assertRaises(AttnstatError) as cm:
            attnstat.Client(socket=self.socket, run="env", lib=LIB)
        self.assertEqual(cm.exception.code, _lib.EINVAL)
        self.assertIn("ATTNSTAT_CONNECT is 'later'", str(cm.exception))
        with self.assertRaises(AttnstatError) as cm:
            attnstat.Client(socket=self.socket, run="env", lib=LIB, connect=True)
        self.assertIn("connect is True", str(cm.exception))


if __name__ == "__main__":
    unittest.main(verbosity=2)
