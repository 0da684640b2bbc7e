"""clusterhelpers.py — what the cluster suites share (test_deploy.py, test_cluster.py): the
monitoring tools Debian packages (promtool, amtool, prometheus, prometheus-alertmanager) or a clear
skip when they could not be installed, free TCP ports, an attnstatd "node" (its own socket,
database and metrics port in a directory of its own), trainer processes pushing as ranks of a job
(attnstat-synth, or cluster_trainer.py driven step by step), scraping a node's /metrics and
parsing the text. Standard library only. Conditions are waited for with generous deadlines
(pkghelpers.wait_for), never a timing margin.
"""
import json
import os
import select
import shutil
import socket
import subprocess
import sys
import urllib.request

from pkghelpers import DEADLINE_S, Daemon, connectable, run, skip, wait_for  # noqa: F401

TOOLS = {"promtool": "prometheus", "amtool": "prometheus-alertmanager",
         "prometheus": "prometheus", "prometheus-alertmanager": "prometheus-alertmanager"}


def need_tools(*names):
    """The paths of the tools, or a skip naming the Debian packages that could not be installed
    (deploy/install-deps.sh installs them; without root or a package mirror it cannot)."""
    missing = [n for n in names if not shutil.which(n)]
    if missing:
        pkgs = sorted({TOOLS.get(n, n) for n in missing})
        skip("%s not found: the Debian package%s %s could not be installed (run "
             "deploy/install-deps.sh as root with a package mirror reachable)"
             % (", ".join(missing), "s" if len(pkgs) > 1 else "", " ".join(pkgs)))
    return [shutil.which(n) for n in names]


def free_port():
    """A TCP port nobody listens on now on 127.0.0.1 (the kernel's choice)."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
    finally:
        s.close()


def http_get(url, timeout=10):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.read().decode()


def parse_metrics(text):
    """The samples of a Prometheus text page: {(name, frozenset(labels.items())): value}."""
    out = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        head, _, value = line.rpartition(" ")
        name, labels = head, {}
        if "{" in head:
            name, _, rest = head.partition("{")
            for part in _split_labels(rest.rstrip("}")):
                k, _, v = part.partition("=")
                labels[k] = v[1:-1].replace('\\"', '"').replace("\\\\", "\\")
        out[(name, frozenset(labels.items()))] = float(value)
    return out


def _split_labels(s):
    parts, cur, quoted, esc = [], "", False, False
    for ch in s:
        if esc:
            cur += ch
            esc = False
        elif ch == "\\":
            cur += ch
            esc = True
        elif ch == '"':
            cur += ch
            quoted = not quoted
        elif ch == "," and not quoted:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    if cur:
        parts.append(cur)
    return parts


def series(metrics, name, **match):
    """{labels dict as a sorted tuple: value} of the samples of name whose labels include match."""
    return {tuple(sorted(k[1])): v for k, v in metrics.items()
            if k[0] == name and all(dict(k[1]).get(a) == str(b) for a, b in match.items())}


class Node(object):
    """One attnstatd of a simulated cluster: its own directory holding its socket and database,
    its metrics port on 127.0.0.1, extra settings as flags. Stopped by SIGTERM (stop) or killed
    (close)."""

    def __init__(self, daemon, base, name, *flags):
        self.dir = os.path.join(base, name)
        os.makedirs(self.dir, exist_ok=True)
        self.name = name
        self.socket = os.path.join(self.dir, "attnstatd.sock")
        self.db = os.path.join(self.dir, name + ".db")
        self.port = free_port()
        self.d = Daemon([daemon, "--socket", self.socket, "--db", self.db, "--metrics-port",
                         str(self.port), "--metrics-bind", "127.0.0.1"] + list(flags),
                        log_dir=self.dir)
        wait_for("%s's socket" % name, lambda: connectable(self.socket), proc=self.d.proc)
        wait_for("%s's metrics port" % name, self._serves, proc=self.d.proc)

    def _serves(self):
        try:
            self.metrics_text()
            return True
        except OSError:
            return False

    @property
    def target(self):
        return "127.0.0.1:%d" % self.port

    def metrics_text(self):
        return http_get("http://%s/metrics" % self.target)

    def metrics(self):
        return parse_metrics(self.metrics_text())

    def stop(self):
        return self.d.stop()

    def close(self):
        self.d.close()


def synth(synth_bin, node, run_name, rank, *args, timeout=600):
    """attnstat-synth pushing to node as one process of job run_name; returns its output."""
    return run([synth_bin, "--socket", node.socket, "--run", run_name, "--rank", str(rank),
                "--quiet"] + [str(a) for a in args], timeout=timeout).stdout


class Trainer(object):
    """A cluster_trainer.py process: one process of job run on node, its layers and heads, with
    its tensor-parallel rank of tp (None: no layout) and its own thresholds ({name: value}),
    driven step by step. Its log (stderr) is in the node's directory. Needs the attnstat package
    (client/python) and ATTNSTAT_LIB; a sanitized library gets its runtimes (ATTNSTAT_PRELOAD)."""

    SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "cluster_trainer.py")

    def __init__(self, node, run, rank=0, layers=1, heads=2, tp=None, thresholds=None):
        from pkghelpers import SOURCE
        self.name = "%s rank %d" % (run, rank)
        cmd = [sys.executable, self.SCRIPT, "--socket", node.socket, "--run", run, "--rank",
               str(rank), "--layers", str(layers), "--heads", str(heads)]
        if tp:
            cmd += ["--tp-rank", str(tp[0]), "--tp-size", str(tp[1])]
        for k, v in sorted((thresholds or {}).items()):
            cmd += ["--threshold", "%s=%r" % (k, v)]
        env = dict(os.environ, PYTHONPATH=os.path.join(SOURCE, "client", "python"),
                   PYTHONDONTWRITEBYTECODE="1")
        if os.environ.get("ATTNSTAT_PRELOAD"):  # a sanitized library: its runtimes first
            env["LD_PRELOAD"] = os.environ["ATTNSTAT_PRELOAD"]
            env["ASAN_OPTIONS"] = "detect_leaks=0:abort_on_error=1"
        self.log_path = os.path.join(node.dir, "trainer-%s-%d.log" % (run, rank))
        self.log = open(self.log_path, "w")
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self.log, env=env, universal_newlines=True)
        self.ready = self._answer()
        self.run_id = self.ready["run_id"]

    def _answer(self):
        ready, _, _ = select.select([self.proc.stdout], [], [], DEADLINE_S)
        line = self.proc.stdout.readline() if ready else ""
        if not line:
            self.close()
            with open(self.log_path) as f:
                raise AssertionError("trainer %s: no answer (exit %s):\n%s"
                                     % (self.name, self.proc.poll(), f.read()))
        return json.loads(line)

    def _send(self, obj):
        self.proc.stdin.write(json.dumps(obj) + "\n")
        self.proc.stdin.flush()

    def step(self, step, heads=None):
        """Pushes every layer of step (heads: {"L.H": "collapse" | logit}) and waits for the
        daemon's acknowledgements; returns the trainer's answer (the named heads' values)."""
        self._send({"step": step, "heads": heads or {}})
        out = self._answer()
        assert out.get("ok"), "trainer %s, step %d: not every push acknowledged: %s" % (
            self.name, step, out)
        return out

    def bye(self):
        """Goodbye: the run ends at once."""
        self._send({"bye": True})
        assert self._answer() == {"bye": True}
        assert self.proc.wait(DEADLINE_S) == 0
        self.close()

    def die(self):
        """Gone without Goodbye: the run waits run_grace_ms for it."""
        self.proc.stdin.close()
        assert self.proc.wait(DEADLINE_S) == 0
        self.close()

    def close(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        for f in (self.proc.stdin, self.proc.stdout, self.log):
            if f and not f.closed:
                f.close()
