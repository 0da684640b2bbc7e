"""clusterhelpers.py — what the cluster suites share (test_deploy.py, test_cluster.py): the
monitoring tools Debian packages (promtool, amtool, prometheus, prometheus-alertmanager) or a clear
skip when they could not be installed, free TCP ports, an attnstatd "node" (its own socket,
database and metrics port in a directory of its own), trainer processes (attnstat-synth) pushing
as ranks of a job, scraping a node's /metrics and parsing the text. Standard library only.
Conditions are waited for with generous deadlines (pkghelpers.wait_for), never a timing margin.
"""
import os
import shutil
import socket
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
