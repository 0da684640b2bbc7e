#!/usr/bin/env python3
"""test_service.py — attnstatd as a service, from the build tree (no root, no systemd needed):

- Readiness (systemd's Type=notify): with NOTIFY_SOCKET set (a path, or an @abstract name) the
  daemon sends READY=1 with its MAINPID and a STATUS once its socket accepts connections, and
  STOPPING=1 on SIGTERM; SIGHUP (systemctl reload) is RELOADING=1 with MONOTONIC_USEC, then
  READY=1, and the daemon serves on; a NOTIFY_SOCKET it cannot use is reported in the log and the daemon
  serves all the same.
- Versions in status: `attnstat status` (table and json) and Python's Client.status() show the
  daemon's version and the client's.
- The unit as cmake --install writes it: ExecStart= names the installed attnstatd and config
  file, `systemd-analyze verify` accepts it, and `systemd-analyze security --offline` scores it
  (printed; the test fails above 3.0, "OK" in systemd's words); an installed config file that
  the administrator edited is kept by the next install.
Run by ctest (test_service), which sets the paths; exits 77 when run otherwise.
"""
import json
import os
import re
import shutil
import signal
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import pkghelpers as ph  # noqa: E402

DAEMON, CLI, LIB = ph.need_env("ATTNSTAT_DAEMON", "ATTNSTAT_CLI", "ATTNSTAT_LIB")
V = ph.header_version()
MAX_EXPOSURE = 3.0


class Readiness(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="attnstat-service-")
        self.sock = os.path.join(self.dir, "attnstatd.sock")
        self.db = os.path.join(self.dir, "attnstat.db")
        self.daemons = []

    def tearDown(self):
        for d in self.daemons:
            d.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    def start(self, notify_socket):
        env = dict(os.environ)
        env.pop("NOTIFY_SOCKET", None)
        if notify_socket is not None:
            env["NOTIFY_SOCKET"] = notify_socket
        d = ph.Daemon([DAEMON, "--socket", self.sock, "--db", self.db], env=env, log_dir=self.dir)
        self.daemons.append(d)
        return d

    def test_ready_then_stopping(self):
        n = ph.NotifySocket()
        try:
            d = self.start(n.name)
            ready = n.wait("READY=1", proc=d.proc)
            # Ready means serving: the socket accepts a connection now, not later.
            self.assertTrue(ph.connectable(self.sock))
            self.assertEqual(int(ready["MAINPID"]), d.proc.pid)
            self.assertIn(self.sock, ready["STATUS"])
            self.assertEqual(d.stop(), 0)
            n.wait("STOPPING=1")
        finally:
            n.close()

    def test_reload_is_announced(self):
        n = ph.NotifySocket()
        try:
            d = self.start(n.name)
            n.wait("READY=1", proc=d.proc)
            n.messages.clear()
            d.proc.send_signal(signal.SIGHUP)
            reloading = n.wait("RELOADING=1", proc=d.proc)
            self.assertGreater(int(reloading["MONOTONIC_USEC"]), 0)
            n.messages.remove([m for m in n.messages if "RELOADING=1" in m][0])
            n.wait("READY=1", proc=d.proc)
            self.assertTrue(ph.connectable(self.sock))
            self.assertEqual(d.stop(), 0)
            self.assertIn("reload done", d.log_text())
        finally:
            n.close()

    def test_abstract_socket(self):
        n = ph.NotifySocket(abstract=True)
        try:
            d = self.start(n.name)
            n.wait("READY=1", proc=d.proc)
            self.assertEqual(d.stop(), 0)
        finally:
            n.close()

    def test_unusable_notify_socket_is_reported_not_fatal(self):
        d = self.start("relative/not-a-socket")
        ph.wait_for("the daemon's socket", lambda: ph.connectable(self.sock), proc=d.proc)
        self.assertEqual(d.stop(), 0)
        self.assertIn("NOTIFY_SOCKET 'relative/not-a-socket'", d.log_text())

    def test_versions_in_status(self):
        d = self.start(None)
        ph.wait_for("the daemon's socket", lambda: ph.connectable(self.sock), proc=d.proc)
        st = ph.cli_json(CLI, "--socket", self.sock, "status")[0]
        self.assertEqual(st["daemon_version"], V)
        self.assertRegex(st["client_version"], r"^%s(\+cuda)?$" % re.escape(V))
        table = ph.run([CLI, "--socket", self.sock, "status"]).stdout
        self.assertRegex(table, r"(?m)^attnstatd %s at " % re.escape(V))
        self.assertRegex(table, r"(?m)^client +attnstat %s \(libattnstat %s(\+cuda)?\)$"
                         % (re.escape(V), re.escape(V)))
        prog = ("import attnstat, json, sys\n"
                "c = attnstat.Client(socket=sys.argv[1])\n"
                "st = c.status(); c.close()\n"
                "print(json.dumps({k: st[k] for k in ('daemon_version', 'client_version', "
                "'binding_version')}))\n")
        env = dict(os.environ, PYTHONPATH=os.path.join(ph.SOURCE, "client", "python"),
                   ATTNSTAT_LIB=LIB, PYTHONDONTWRITEBYTECODE="1")
        if os.environ.get("ATTNSTAT_PRELOAD"):  # a sanitized library: its runtimes first
            env["LD_PRELOAD"] = os.environ["ATTNSTAT_PRELOAD"]
            env["ASAN_OPTIONS"] = "detect_leaks=0:abort_on_error=1"
        out = json.loads(ph.run([sys.executable, "-c", prog, self.sock], env=env).stdout)
        self.assertEqual(out["daemon_version"], V)
        self.assertEqual(out["binding_version"], V)
        self.assertRegex(out["client_version"], r"^%s(\+cuda)?$" % re.escape(V))
        self.assertEqual(d.stop(), 0)


class Unit(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        (cls.build,) = ph.need_env("ATTNSTAT_BUILD_DIR")
        cls.dir = tempfile.mkdtemp(prefix="attnstat-install-")
        cls.prefix = os.path.join(cls.dir, "usr")
        ph.run(["cmake", "--install", cls.build, "--prefix", cls.prefix, "--component", "tools"])
        cls.unit = os.path.join(cls.prefix, "lib", "systemd", "system", "attnstatd.service")
        cls.conf = os.path.join(cls.prefix, "etc", "attnstat", "attnstatd.conf")

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.dir, ignore_errors=True)

    def test_unit_names_the_installed_files(self):
        with open(self.unit) as f:
            text = f.read()
        self.assertIn("\nExecStart=%s/bin/attnstatd --config %s\n" % (self.prefix, self.conf), text)
        self.assertIn("\nType=notify\n", text)
        self.assertIn("\nExecReload=/bin/kill -HUP $MAINPID\n", text)
        self.assertNotIn("@", re.sub(r"(?m)^SystemCallFilter=.*$", "", text))
        for f in ("lib/sysusers.d/attnstat.conf", "lib/tmpfiles.d/attnstat.conf",
                  "share/man/man8/attnstatd.8.gz", "share/man/man1/attnstat.1.gz",
                  "share/bash-completion/completions/attnstat",
                  "share/bash-completion/completions/attnstatd", "bin/attnstat"):
            self.assertTrue(os.path.exists(os.path.join(self.prefix, f)), f)

    def test_systemd_accepts_the_unit(self):
        if not shutil.which("systemd-analyze"):
            self.skipTest("no systemd-analyze (Debian: systemd)")
        p = ph.run(["systemd-analyze", "verify", "--man=no", self.unit], check=False)
        self.assertEqual((p.returncode, p.stdout + p.stderr), (0, ""))
        p = ph.run(["systemd-analyze", "security", "--offline=true", "--no-pager", self.unit],
                   check=False)
        m = re.search(r"Overall exposure level for attnstatd.service: ([0-9.]+) (\w+)", p.stdout)
        if not m and "offline" in p.stderr:
            self.skipTest("this systemd-analyze has no --offline: %s" % p.stderr.strip())
        self.assertTrue(m, p.stdout + p.stderr)
        print("systemd-analyze security --offline: %s %s" % (m.group(1), m.group(2)))
        self.assertLessEqual(float(m.group(1)), MAX_EXPOSURE, p.stdout)

    def test_edited_config_is_kept(self):
        with open(self.conf, "a") as f:
            f.write("log_level = debug  # the administrator's\n")
        ph.run(["cmake", "--install", self.build, "--prefix", self.prefix, "--component", "tools"])
        with open(self.conf) as f:
            self.assertIn("the administrator's", f.read())


if __name__ == "__main__":
    unittest.main(verbosity=2)
