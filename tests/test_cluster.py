#!/usr/bin/env python3
"""test_cluster.py — a cluster on one machine, end to end: two attnstatd "nodes" (each its own
socket, database and metrics port), four trainer processes pushing as the tensor-parallel ranks
0..3 of one job (ranks 0 and 1 on node a, 2 and 3 on node b; attnstat-synth with its layout), a real
Prometheus (Debian's prometheus) scraping both with the shipped deploy/prometheus/prometheus.yml and
attnstat.rules.yml, and a real Alertmanager (prometheus-alertmanager) with the shipped
deploy/alertmanager/alertmanager.yml, its receivers pointed at a webhook this test serves.

It checks, through Prometheus' HTTP API, the job's full layer x head map with global head numbers
(each node holding its ranks' heads), the collapsing head found where the trainer made it, a
collapse alert arriving at the webhook with the job, layer and head, every query of the shipped
Grafana dashboard running against the live Prometheus, and the CLI reading the same map from both
nodes' databases (attnstat job, attnstat export).

What the test changes in the shipped files, and only that: the scrape and evaluation intervals
(1 s), the alert rules' `for:` (2 s), Alertmanager's waits (1 s), the targets (the two nodes) and the
receivers' URLs (this test's webhook). Skipped (77), saying so, when the packages could not be
installed (deploy/install-deps.sh installs them). Run by ctest (ATTNSTAT_DAEMON, ATTNSTAT_SYNTH,
ATTNSTAT_CLI, ATTNSTAT_SOURCE_DIR).
"""
import http.server
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import unittest
import urllib.parse

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import clusterhelpers as ch  # noqa: E402
import deploy_checks  # noqa: E402
from pkghelpers import DEADLINE_S, SOURCE, need_env, run, wait_for  # noqa: E402

try:
    import yaml
except ImportError:  # pragma: no cover
    yaml = None

DEPLOY = os.path.join(SOURCE, "deploy")
JOB = "gpt-cluster"
LAYERS, LOCAL_HEADS, TP = 3, 4, 4
# The collapsing head: rank 3's local head 1 of layer 2, global head 3 x 4 + 1 = 13.
BAD_RANK, BAD_LAYER, BAD_LOCAL = 3, 2, 1
BAD_HEAD = BAD_RANK * LOCAL_HEADS + BAD_LOCAL


class Webhook(object):
    """Alertmanager's webhook receiver: every POST's JSON body, with its path."""

    def __init__(self):
        self.posts = []
        self.lock = threading.Lock()
        hook = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                n = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(n)
                with hook.lock:
                    hook.posts.append((self.path, json.loads(body.decode())))
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def alerts(self):
        with self.lock:
            return [(path, a) for path, body in self.posts for a in body.get("alerts", [])]

    def close(self):
        self.server.shutdown()
        self.server.server_close()


class Server(object):
    """A Prometheus or Alertmanager process, its output in a log file; stopped by SIGTERM."""

    def __init__(self, cmd, log_path):
        self.log_path = log_path
        self.log = open(log_path, "w")
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT)

    def text(self):
        self.log.flush()
        with open(self.log_path) as f:
            return f.read()

    def close(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


def ready(url):
    try:
        ch.http_get(url, timeout=5)
        return True
    except OSError:
        return False


@unittest.skipIf(yaml is None, "PyYAML (python3-yaml) is missing")
class TestCluster(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.prom_bin, cls.am_bin = ch.need_tools("prometheus", "prometheus-alertmanager")
        cls.daemon, cls.synth_bin, cls.cli = need_env("ATTNSTAT_DAEMON", "ATTNSTAT_SYNTH",
                                                      "ATTNSTAT_CLI")
        cls.tmp = tempfile.mkdtemp(prefix="attnstat-cluster-")
        cls.nodes, cls.servers, cls.trainers = [], [], []
        cls.hook = Webhook()
        try:
            cls._start()
        except BaseException:
            cls._stop()
            raise

    @classmethod
    def _start(cls):
        # Two nodes, every head on /metrics (the map), alerts as the daemons' defaults.
        cls.a = ch.Node(cls.daemon, cls.tmp, "node-a", "--metrics-heads", "all")
        cls.b = ch.Node(cls.daemon, cls.tmp, "node-b", "--metrics-heads", "all")
        cls.nodes = [cls.a, cls.b]
        cls._start_alertmanager()
        cls._start_prometheus()
        # The job: 4 tensor-parallel ranks, 2 per node, each its own seed; one head collapses.
        for rank in range(TP):
            node = cls.a if rank < 2 else cls.b
            bad = "%d.%d" % (BAD_LAYER, BAD_LOCAL) if rank == BAD_RANK else ""
            args = [cls.synth_bin, "--socket", node.socket, "--run", JOB, "--rank", str(rank),
                    "--tp-rank", str(rank), "--tp-size", str(TP), "--layers", str(LAYERS),
                    "--heads", str(LOCAL_HEADS), "--seq", "64", "--steps", "60",
                    "--seed", str(100 + rank), "--quiet"]
            # A collapsing head only on the bad rank; the others are healthy throughout (--grow
            # names the same head: a growing head's attention sharpens, so no other is named).
            args += ["--collapse", bad, "--grow", bad]
            log = open(os.path.join(cls.tmp, "trainer-%d.log" % rank), "w")
            cls.trainers.append((subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT), log))

    @classmethod
    def _start_alertmanager(cls):
        with open(os.path.join(DEPLOY, "alertmanager", "alertmanager.yml")) as f:
            cfg = yaml.safe_load(f)
        for r in cfg["receivers"]:
            for w in r.get("webhook_configs", []):
                w["url"] = "http://127.0.0.1:%d/%s" % (cls.hook.port, r["name"])

        def shorten(route):
            for k in ("group_wait", "group_interval"):
                if k in route:
                    route[k] = "1s"
            if "repeat_interval" in route:
                route["repeat_interval"] = "1m"
            for sub in route.get("routes", []):
                shorten(sub)
        shorten(cfg["route"])
        d = os.path.join(cls.tmp, "alertmanager")
        os.makedirs(d)
        path = os.path.join(d, "alertmanager.yml")
        with open(path, "w") as f:
            yaml.safe_dump(cfg, f)
        cls.am_port = ch.free_port()
        am = Server([cls.am_bin, "--config.file", path, "--storage.path", os.path.join(d, "data"),
                     "--web.listen-address", "127.0.0.1:%d" % cls.am_port,
                     "--cluster.listen-address", ""], os.path.join(d, "log"))
        cls.servers.append(am)
        wait_for("Alertmanager ready", lambda: ready("http://127.0.0.1:%d/-/ready" % cls.am_port),
                 proc=am.proc)

    @classmethod
    def _start_prometheus(cls):
        d = os.path.join(cls.tmp, "prometheus")
        shutil.copytree(os.path.join(DEPLOY, "prometheus"), d)
        path = os.path.join(d, "prometheus.yml")
        with open(path) as f:
            cfg = yaml.safe_load(f)
        cfg["global"]["scrape_interval"] = cfg["global"]["evaluation_interval"] = "1s"
        for sc in cfg["scrape_configs"]:
            sc["scrape_timeout"] = "1s"
        cfg["alerting"]["alertmanagers"][0]["static_configs"][0]["targets"] = [
            "127.0.0.1:%d" % cls.am_port]
        with open(path, "w") as f:
            yaml.safe_dump(cfg, f)
        rules = os.path.join(d, "attnstat.rules.yml")
        with open(rules) as f:
            rcfg = yaml.safe_load(f)
        for g in rcfg["groups"]:
            for r in g["rules"]:
                if "for" in r:
                    r["for"] = "2s"
        with open(rules, "w") as f:
            yaml.safe_dump(rcfg, f)
        with open(os.path.join(d, "attnstat-targets", "nodes.json"), "w") as f:
            json.dump([{"targets": [n.target for n in cls.nodes], "labels": {"cluster": "test"}}], f)
        cls.prom_port = ch.free_port()
        prom = Server([cls.prom_bin, "--config.file", path, "--storage.tsdb.path",
                       os.path.join(d, "data"), "--web.listen-address",
                       "127.0.0.1:%d" % cls.prom_port], os.path.join(d, "log"))
        cls.servers.append(prom)
        cls.prom = prom
        wait_for("Prometheus ready", lambda: ready("http://127.0.0.1:%d/-/ready" % cls.prom_port),
                 proc=prom.proc)

    @classmethod
    def _stop(cls):
        for p, log in cls.trainers:
            if p.poll() is None:
                p.kill()
            p.wait()
            log.close()
        for s in cls.servers:
            s.close()
        for n in cls.nodes:
            n.close()
        cls.hook.close()
        shutil.rmtree(cls.tmp, ignore_errors=True)

    @classmethod
    def tearDownClass(cls):
        cls._stop()

    # ---- helpers -------------------------------------------------------------------------------
    def query(self, expr):
        """Prometheus' instant query: the result vector (list of {metric, value})."""
        url = "http://127.0.0.1:%d/api/v1/query?%s" % (self.prom_port,
                                                        urllib.parse.urlencode({"query": expr}))
        body = json.loads(ch.http_get(url))
        self.assertEqual(body.get("status"), "success", body)
        return body["data"]["result"]

    def wait_trainers(self):
        for rank, (p, log) in enumerate(self.trainers):
            try:
                p.wait(DEADLINE_S)
            except subprocess.TimeoutExpired:
                p.kill()
            log.flush()
            with open(log.name) as f:
                out = f.read()
            self.assertEqual(p.returncode, 0, "trainer rank %d:\n%s" % (rank, out))

    def cells(self, expr):
        return {(int(r["metric"]["layer"]), int(r["metric"]["head"])): float(r["value"][1])
                for r in self.query(expr)}

    # ---- the tests -----------------------------------------------------------------------------
    def test_1_map_in_prometheus(self):
        """The job's full layer x head map, global head numbers, from both nodes."""
        self.wait_trainers()
        want = {(l, h) for l in range(LAYERS) for h in range(TP * LOCAL_HEADS)}
        expr = 'attnstat:head_entropy_normalized_ratio:avg{run="%s"}' % JOB
        wait_for("the job's %d heads in Prometheus" % len(want),
                 lambda: set(self.cells(expr)) == want, proc=self.prom.proc)
        # Each node holds its own ranks' heads: a's 0..7, b's 8..15.
        raw = self.query('attnstat_head_entropy_normalized_ratio{run="%s"}' % JOB)
        by_node = {}
        for r in raw:
            by_node.setdefault(r["metric"]["instance"], set()).add(int(r["metric"]["head"]))
        self.assertEqual(by_node, {self.a.target: set(range(0, 8)),
                                   self.b.target: set(range(8, 16))})
        # The collapsed head is where the trainer made it; every other head is healthy.
        wait_for("the last step's samples", lambda: {v for v in self.cells(
            'attnstat:head_step:max{run="%s"}' % JOB).values()} == {59.0})
        ent = self.cells(expr)
        low = {k for k, v in ent.items() if v < 0.1}
        self.assertEqual(low, {(BAD_LAYER, BAD_HEAD)}, ent)
        self.assertTrue(all(v > 0.3 for k, v in ent.items() if k != (BAD_LAYER, BAD_HEAD)), ent)
        # The processes: 4 connected or recently gone (run_info lists the connected ones only).
        layers = self.query('attnstat:layer_min_entropy_normalized_ratio:min{run="%s"}' % JOB)
        self.assertEqual(len(layers), LAYERS)

    def test_2_alert_at_the_webhook(self):
        """A collapse alert arrives at the webhook, with the job, the layer and the head."""
        self.wait_trainers()

        def collapse():
            for path, a in self.hook.alerts():
                lab = a.get("labels", {})
                if (lab.get("alertname") == "AttnstatEntropyFloor" and lab.get("run") == JOB and
                        a.get("status") == "firing"):
                    return path, lab
            return None
        path, lab = wait_for("AttnstatEntropyFloor at the webhook", collapse,
                             proc=self.prom.proc)
        self.assertEqual((lab["layer"], lab["head"]), (str(BAD_LAYER), str(BAD_HEAD)))
        self.assertEqual((lab["severity"], lab["rule"]), ("critical", "entropy_floor"))
        self.assertEqual(path, "/ml-oncall")  # the critical route
        # No other head of the job was reported collapsed.
        heads = {(a["labels"].get("layer"), a["labels"].get("head")) for _, a in self.hook.alerts()
                 if a["labels"].get("alertname") == "AttnstatEntropyFloor"}
        self.assertEqual(heads, {(str(BAD_LAYER), str(BAD_HEAD))})

    def test_3_dashboard_queries(self):
        """Every query of the shipped Grafana dashboard runs against this Prometheus; the map's
        returns the whole job."""
        self.wait_trainers()
        d = deploy_checks.load_dashboard(os.path.join(DEPLOY, "grafana", "attnstat-dashboard.json"))
        subst = {"$run": JOB, "$layer": ".*", "$__rate_interval": "1m"}
        for where, expr in deploy_checks.dashboard_queries(d):
            for k, v in subst.items():
                expr = expr.replace(k, v)
            if expr.startswith("label_values("):  # a Grafana function: its selector is the query
                expr = expr[len("label_values("):].rsplit(",", 1)[0]
            self.query(expr)  # a PromQL error fails here, naming the status
        map_expr = next(t["expr"] for p in d["panels"] if p["type"] == "table"
                        for t in p["targets"] if "head_entropy" in t["expr"])
        wait_for("the dashboard's map", lambda: len(self.query(map_expr.replace("$run", JOB)))
                 == LAYERS * TP * LOCAL_HEADS)

    def test_4_cli_across_nodes(self):
        """attnstat job reads the same map from both nodes' databases (given one by one, or as
        the directory holding copies of them); export lists every sample with its ranks."""
        self.wait_trainers()
        out = run([self.cli, "--db", self.a.db, "--db", self.b.db, "job", "--run", JOB,
                   "--format", "json"]).stdout
        rows = [json.loads(l) for l in out.splitlines()]
        self.assertEqual({(r["layer"], r["head"]) for r in rows},
                         {(l, h) for l in range(LAYERS) for h in range(TP * LOCAL_HEADS)})
        for r in rows:
            self.assertEqual(r["step"], 59)
            self.assertEqual(r["ranks"], str(r["head"] // LOCAL_HEADS))
        low = {(r["layer"], r["head"]) for r in rows if r["entropy_norm_mean"] < 0.1}
        self.assertEqual(low, {(BAD_LAYER, BAD_HEAD)})
        # The same values as Prometheus saw (one node holds each head: nothing pooled).
        prom = self.cells('attnstat:head_entropy_normalized_ratio:avg{run="%s"}' % JOB)
        for r in rows:
            self.assertAlmostEqual(r["entropy_norm_mean"], prom[(r["layer"], r["head"])], places=6)
        # A directory of copies: the usual way after a run (the WAL is checkpointed by a copy).
        copies = os.path.join(self.tmp, "copies")
        os.makedirs(copies)
        for n in self.nodes:
            run(["sqlite3", n.db, ".backup '%s'" % os.path.join(copies, n.name + ".db")])
        table = run([self.cli, "--db", copies, "job", "--run", JOB, "--color", "never"]).stdout
        self.assertIn("job %s, step 59" % JOB, table)
        self.assertIn("L%d.H%d" % (BAD_LAYER, BAD_HEAD), table.split("lowest")[1].split(",")[0])
        for rank in range(TP):
            self.assertRegex(table, r"\n  %d +%d/%d " % (rank, rank, TP))
        csv = run([self.cli, "--db", copies, "export", "--run", JOB]).stdout.splitlines()
        head = csv[0].split(",")
        self.assertEqual(head[:5], ["job", "db", "rank", "host", "tp_rank"])
        self.assertEqual(len(csv) - 1, 60 * LAYERS * TP * LOCAL_HEADS)
        ranks = {(c.split(",")[2], c.split(",")[4]) for c in csv[1:]}
        self.assertEqual(ranks, {(str(r), str(r)) for r in range(TP)})


if __name__ == "__main__":
    unittest.main(verbosity=2)
