#!/usr/bin/env python3
"""test_cluster.py — a cluster on one machine, end to end: attnstatd "nodes" (each its own
socket, database and metrics port), four trainer processes pushing as the tensor-parallel ranks
0..3 of one job (ranks 0 and 1 on node a, 2 and 3 on node b; tests/cluster_trainer.py, driven step
by step, so that the job is live while it is looked at and ends when the test says), a real
Prometheus (Debian's prometheus) scraping the nodes with the shipped
deploy/prometheus/prometheus.yml and attnstat.rules.yml, and a real Alertmanager (prometheus-alertmanager) with the shipped
deploy/alertmanager/alertmanager.yml, its receivers pointed at a webhook this test serves.

It checks, through Prometheus' and Alertmanager's HTTP APIs and at the webhook: the job's full
layer x head map with global head numbers (each node holding its ranks' heads), the collapsing
head found where the trainer made it, a collapse alert arriving with the job, layer and head,
every query of the shipped Grafana dashboard running against the live Prometheus, and the CLI
reading the same map from both nodes' databases (attnstat job, attnstat export). Then what an
operator must be able to trust: a run with its own logit ceiling pages at that ceiling and not
at the default (and a run with a higher one does not page at the default); a run deleted while
its client was gone, and the job once it ended (Goodbye), leave every series and fire nothing;
a head silenced and one acknowledged with attnstat on a node page nobody (Alertmanager shows
them inhibited), while the same job's other collapsed head pages. For the last, the node joins
Prometheus' targets only once the marks are on its page, so that Prometheus never sees the heads
without them: nothing depends on who is faster.

What the test changes in the shipped files, and only that: the scrape and evaluation intervals
(1 s), the file discovery's refresh (1 s), the alert rules' `for:` (2 s), Alertmanager's waits
(1 s), the targets (the nodes) and the receivers' URLs (this test's webhook). Skipped (77), saying
so, when the packages could not be installed (deploy/install-deps.sh installs them). Run by ctest
(ATTNSTAT_DAEMON, ATTNSTAT_CLI, ATTNSTAT_LIB, ATTNSTAT_SOURCE_DIR).
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
from pkghelpers import SOURCE, cli_json, need_env, run, wait_for  # noqa: E402

try:
    import yaml
except ImportError:  # pragma: no cover
    yaml = None

DEPLOY = os.path.join(SOURCE, "deploy")
JOB = "gpt-cluster"
LAYERS, LOCAL_HEADS, TP, STEPS = 3, 4, 4, 4
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

    def find(self, status, alertname, run, layer=None, head=None):
        """The (path, labels) of each alert sent with that status and those labels."""
        out = []
        for path, a in self.alerts():
            lab = a.get("labels", {})
            if (a.get("status") == status and lab.get("alertname") == alertname and
                    lab.get("run") == run and layer in (None, lab.get("layer")) and
                    head in (None, lab.get("head"))):
                out.append((path, lab))
        return out

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
        cls.daemon, cls.cli, _ = need_env("ATTNSTAT_DAEMON", "ATTNSTAT_CLI", "ATTNSTAT_LIB")
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
        # Three nodes, every head on /metrics (the map), alerts as the daemons' defaults, and a
        # long grace: a run whose client is gone stays live until the test ends it. Node c is
        # scraped from test_6 on.
        flags = ("--metrics-heads", "all", "--run-grace-ms", "600000")
        cls.a = ch.Node(cls.daemon, cls.tmp, "node-a", *flags)
        cls.b = ch.Node(cls.daemon, cls.tmp, "node-b", *flags)
        cls.c = ch.Node(cls.daemon, cls.tmp, "node-c", *flags)
        cls.nodes = [cls.a, cls.b, cls.c]
        cls._start_alertmanager()
        cls._start_prometheus([cls.a, cls.b])
        # The job: 4 tensor-parallel ranks, 2 per node; one head collapsed at every step.
        cls.job = []
        for rank in range(TP):
            t = cls.trainer(cls.a if rank < 2 else cls.b, JOB, rank, layers=LAYERS,
                            heads=LOCAL_HEADS, tp=(rank, TP))
            cls.job.append(t)
        for step in range(STEPS):
            for rank, t in enumerate(cls.job):
                bad = {"%d.%d" % (BAD_LAYER, BAD_LOCAL): "collapse"} if rank == BAD_RANK else {}
                t.step(step, bad)

    @classmethod
    def trainer(cls, node, run, rank=0, **kw):
        t = ch.Trainer(node, run, rank, **kw)
        cls.trainers.append(t)
        return t

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
        cls.am = am
        wait_for("Alertmanager ready", lambda: ready("http://127.0.0.1:%d/-/ready" % cls.am_port),
                 proc=am.proc)

    @classmethod
    def _start_prometheus(cls, nodes):
        d = os.path.join(cls.tmp, "prometheus")
        shutil.copytree(os.path.join(DEPLOY, "prometheus"), d)
        path = os.path.join(d, "prometheus.yml")
        with open(path) as f:
            cfg = yaml.safe_load(f)
        cfg["global"]["scrape_interval"] = cfg["global"]["evaluation_interval"] = "1s"
        for sc in cfg["scrape_configs"]:
            sc["scrape_timeout"] = "1s"
            for sd in sc["file_sd_configs"]:
                sd["refresh_interval"] = "1s"
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
        cls.targets = os.path.join(d, "attnstat-targets", "nodes.json")
        cls.scrape(nodes)
        cls.prom_port = ch.free_port()
        prom = Server([cls.prom_bin, "--config.file", path, "--storage.tsdb.path",
                       os.path.join(d, "data"), "--web.listen-address",
                       "127.0.0.1:%d" % cls.prom_port], os.path.join(d, "log"))
        cls.servers.append(prom)
        cls.prom = prom
        wait_for("Prometheus ready", lambda: ready("http://127.0.0.1:%d/-/ready" % cls.prom_port),
                 proc=prom.proc)

    @classmethod
    def scrape(cls, nodes):
        """Prometheus' targets from now on: nodes (the file replaced whole, as file_sd wants)."""
        tmp = cls.targets + ".new"
        with open(tmp, "w") as f:
            json.dump([{"targets": [n.target for n in nodes], "labels": {"cluster": "test"}}], f)
        os.replace(tmp, cls.targets)

    @classmethod
    def _stop(cls):
        for t in cls.trainers:
            t.close()
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

    def cells(self, expr):
        return {(int(r["metric"]["layer"]), int(r["metric"]["head"])): float(r["value"][1])
                for r in self.query(expr)}

    def alerts_of(self, alertname, run_re):
        """Prometheus' alerts (pending or firing) of that name: {(run, layer, head): state}."""
        return {(r["metric"]["run"], r["metric"]["layer"], r["metric"]["head"]):
                r["metric"]["alertstate"]
                for r in self.query('ALERTS{alertname="%s", run=~"%s"}' % (alertname, run_re))}

    def am_alerts(self, run):
        """Alertmanager's alerts of run (API v2): each with its labels and status."""
        url = "http://127.0.0.1:%d/api/v2/alerts?%s" % (
            self.am_port, urllib.parse.urlencode({"filter": 'run="%s"' % run}))
        return json.loads(ch.http_get(url))

    def gone(self, run):
        """Prometheus has no series of run now: raw, recorded or ALERTS."""
        return self.query('{run="%s"}' % run) == []

    # ---- the job, seen whole -------------------------------------------------------------------
    def test_1_map_in_prometheus(self):
        """The job's full layer x head map, global head numbers, from both nodes."""
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
            'attnstat:head_step:max{run="%s"}' % JOB).values()} == {STEPS - 1.0})
        ent = self.cells(expr)
        low = {k for k, v in ent.items() if v < 0.1}
        self.assertEqual(low, {(BAD_LAYER, BAD_HEAD)}, ent)
        self.assertTrue(all(v > 0.3 for k, v in ent.items() if k != (BAD_LAYER, BAD_HEAD)), ent)
        layers = self.query('attnstat:layer_min_entropy_normalized_ratio:min{run="%s"}' % JOB)
        self.assertEqual(len(layers), LAYERS)
        # The 4 processes, connected; the job's thresholds, the daemons' defaults.
        procs = self.query('attnstat:run_processes:count{run="%s"}' % JOB)
        self.assertEqual([float(r["value"][1]) for r in procs], [TP])
        ceiling = self.query('attnstat:run_logit_ceiling:min{run="%s"}' % JOB)
        self.assertEqual([float(r["value"][1]) for r in ceiling], [100.0])

    def test_2_alert_at_the_webhook(self):
        """A collapse alert arrives at the webhook, with the job, the layer and the head."""
        path, lab = wait_for("AttnstatEntropyFloor at the webhook", lambda: next(
            iter(self.hook.find("firing", "AttnstatEntropyFloor", JOB)), None),
            proc=self.prom.proc)
        self.assertEqual((lab["layer"], lab["head"]), (str(BAD_LAYER), str(BAD_HEAD)))
        self.assertEqual((lab["severity"], lab["rule"]), ("critical", "entropy_floor"))
        self.assertEqual(path, "/ml-oncall")  # the critical route
        # No other head of the job was reported collapsed.
        heads = {(l["layer"], l["head"]) for _, l in self.hook.find("firing",
                                                                   "AttnstatEntropyFloor", JOB)}
        self.assertEqual(heads, {(str(BAD_LAYER), str(BAD_HEAD))})

    def test_3_dashboard_queries(self):
        """Every query of the shipped Grafana dashboard runs against this Prometheus; the map's
        returns the whole job."""
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
        out = run([self.cli, "--db", self.a.db, "--db", self.b.db, "job", "--run", JOB,
                   "--format", "json"]).stdout
        rows = [json.loads(l) for l in out.splitlines()]
        self.assertEqual({(r["layer"], r["head"]) for r in rows},
                         {(l, h) for l in range(LAYERS) for h in range(TP * LOCAL_HEADS)})
        for r in rows:
            self.assertEqual(r["step"], STEPS - 1)
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
        for n in (self.a, self.b):
            run(["sqlite3", n.db, ".backup '%s'" % os.path.join(copies, n.name + ".db")])
        table = run([self.cli, "--db", copies, "job", "--run", JOB, "--color", "never"]).stdout
        self.assertIn("job %s, step %d" % (JOB, STEPS - 1), table)
        self.assertIn("L%d.H%d" % (BAD_LAYER, BAD_HEAD), table.split("lowest")[1].split(",")[0])
        for rank in range(TP):
            self.assertRegex(table, r"\n  %d +%d/%d " % (rank, rank, TP))
        csv = run([self.cli, "--db", copies, "export", "--run", JOB]).stdout.splitlines()
        head = csv[0].split(",")
        self.assertEqual(head[:5], ["job", "db", "rank", "host", "tp_rank"])
        self.assertEqual(len(csv) - 1, STEPS * LAYERS * TP * LOCAL_HEADS)
        ranks = {(c.split(",")[2], c.split(",")[4]) for c in csv[1:]}
        self.assertEqual(ranks, {(str(r), str(r)) for r in range(TP)})

    # ---- what the operator must trust ----------------------------------------------------------
    def test_5_own_ceiling_and_deleted_run(self):
        """A run's own logit ceiling is the one that pages: 30 pages a head at about 50, which the
        default 100 lets pass; 1000 lets a head at about 150 pass, which 100 pages. A run deleted
        while its client was gone leaves Prometheus whole, and what fired for it resolves."""
        high = self.trainer(self.a, "ceil-high", thresholds={"logit_ceiling": 1000.0})
        plain = self.trainer(self.a, "ceil-plain")
        low = self.trainer(self.a, "ceil-low", thresholds={"logit_ceiling": 30.0})
        # The runs that must not page first: Prometheus has their heads at least as long as it
        # has the ones that page when those fire.
        logits = {}
        for t, heads in ((high, {"0.1": 150}), (plain, {"0.0": 50, "0.1": 150}),
                         (low, {"0.0": 50})):
            for step in range(3):
                out = t.step(step, heads)
            for key, v in out["max_logit"].items():
                logits[(t.name.split()[0], key)] = v
        # What the test relies on, from the very data pushed.
        for (run_name, key), v in logits.items():
            if run_name == "ceil-high" or key == "0.1":
                self.assertTrue(100 < v < 1000, (run_name, key, v))
            else:
                self.assertTrue(30 < v < 100, (run_name, key, v))
        wait_for("the pages of ceil-low head 0 and ceil-plain head 1", lambda: (
            self.hook.find("firing", "AttnstatLogitCeiling", "ceil-low", "0", "0") and
            self.hook.find("firing", "AttnstatLogitCeiling", "ceil-plain", "0", "1")),
            proc=self.prom.proc)
        self.assertEqual(self.alerts_of("AttnstatLogitCeiling", "ceil-.*"),
                         {("ceil-low", "0", "0"): "firing", ("ceil-plain", "0", "1"): "firing"})
        paged = {(l["run"], l["layer"], l["head"]) for _, a in self.hook.alerts()
                 for l in [a["labels"]] if l.get("alertname") == "AttnstatLogitCeiling"}
        self.assertEqual(paged, {("ceil-low", "0", "0"), ("ceil-plain", "0", "1")})
        ceilings = {r["metric"]["run"]: float(r["value"][1])
                    for r in self.query('attnstat:run_logit_ceiling:min{run=~"ceil-.*"}')}
        self.assertEqual(ceilings, {"ceil-high": 1000.0, "ceil-plain": 100.0, "ceil-low": 30.0})
        description = [a["annotations"]["description"] for a in self.am_alerts("ceil-low")
                       if a["labels"]["alertname"] == "AttnstatLogitCeiling"]
        self.assertEqual(len(description), 1)
        self.assertIn("over the job's ceiling 30 ", description[0])

        # ceil-low's process dies; the run waits for it (still live: still paging). Deleted, it
        # leaves every page and its alert resolves.
        low.die()
        self.assertIn('run="ceil-low"', self.a.metrics_text())
        run([self.cli, "--socket", self.a.socket, "--db", self.a.db, "delete-run", "--run",
             "ceil-low"])
        self.assertNotIn('run="ceil-low"', self.a.metrics_text())
        wait_for("nothing of ceil-low in Prometheus", lambda: self.gone("ceil-low"),
                 proc=self.prom.proc)
        wait_for("ceil-low's page resolved", lambda: self.hook.find(
            "resolved", "AttnstatLogitCeiling", "ceil-low", "0", "0"), proc=self.prom.proc)
        self.assertEqual(self.alerts_of("AttnstatLogitCeiling", "ceil-.*"),
                         {("ceil-plain", "0", "1"): "firing"})
        high.bye()
        plain.bye()

    def test_6_silenced_head_not_paged(self):
        """On node c, job gpt-quiet has three collapsed heads. Before Prometheus scrapes c, an
        operator silences head 0's alert and acknowledges head 1's with attnstat. Head 2 pages;
        heads 0 and 1 page nobody: Alertmanager holds their alerts (the pooled rule's and the
        daemon's) inhibited by AttnstatSilenced / AttnstatAcknowledged."""
        t = self.trainer(self.c, "gpt-quiet", heads=3)
        for step in range(3):  # raise_after 3: the daemon raises the three
            out = t.step(step, {"0.0": "collapse", "0.1": "collapse", "0.2": "collapse"})
        self.assertTrue(all(v < 0.1 for v in out["entropy_norm"].values()), out)
        wait_for("the daemon's three alerts", lambda: len(cli_json(
            self.cli, "--db", self.c.db, "alerts", "--run", "gpt-quiet", "--active")) == 3)
        ids = {r["head"]: r["id"] for r in cli_json(self.cli, "--db", self.c.db, "alerts",
                                                     "--run", "gpt-quiet", "--active")}
        run([self.cli, "--socket", self.c.socket, "alerts", "silence", "--id", str(ids[0])])
        run([self.cli, "--socket", self.c.socket, "alerts", "ack", "--id", str(ids[1])])
        page = ch.parse_metrics(self.c.metrics_text())
        self.assertEqual(list(ch.series(page, "attnstat_head_silenced", run="gpt-quiet").values()),
                         [1.0])
        self.assertEqual(set(dict(k)["head"] for k in ch.series(
            page, "attnstat_head_silenced", run="gpt-quiet", rule="entropy_floor")), {"0"})
        self.assertEqual(set(dict(k)["head"] for k in ch.series(
            page, "attnstat_head_alert_acknowledged", run="gpt-quiet", rule="entropy_floor")),
            {"1"})
        self.scrape([self.a, self.b, self.c])
        wait_for("gpt-quiet head 2 paged", lambda: self.hook.find(
            "firing", "AttnstatEntropyFloor", "gpt-quiet", "0", "2"), proc=self.prom.proc)
        self.assertEqual(self.alerts_of("AttnstatEntropyFloor", "gpt-quiet"),
                         {("gpt-quiet", "0", h): "firing" for h in ("0", "1", "2")})
        # Heads 0 and 1 reached nobody, by any route.
        sent = {(l["alertname"], l["head"]) for _, a in self.hook.alerts()
                for l in [a["labels"]] if l.get("run") == "gpt-quiet" and l.get("head") != "2"}
        self.assertEqual(sent, set())
        # Alertmanager has them, inhibited by the operator's marks.
        state = {}
        for a in self.am_alerts("gpt-quiet"):
            lab = a["labels"]
            state[(lab["alertname"], lab["head"])] = (a["status"]["state"],
                                                       bool(a["status"]["inhibitedBy"]))
        for head in ("0", "1"):
            self.assertEqual(state.get(("AttnstatEntropyFloor", head)), ("suppressed", True),
                             state)
        self.assertEqual(state.get(("AttnstatSilenced", "0")), ("active", False), state)
        self.assertEqual(state.get(("AttnstatAcknowledged", "1")), ("active", False), state)
        self.assertEqual(state.get(("AttnstatEntropyFloor", "2")), ("active", False), state)
        for head in ("0", "1"):  # the daemon's own alert too
            self.assertEqual(state.get(("AttnstatDaemonAlert", head), ("?",))[0], "suppressed",
                             state)
        t.bye()

    def test_7_ended_run_fires_nothing(self):
        """The job ends (every rank says Goodbye): each node's page has nothing of it any more,
        Prometheus has no series of it (raw, recorded or alerts), and the collapse page resolves.
        """
        self.assertTrue(self.hook.find("firing", "AttnstatEntropyFloor", JOB))
        for t in self.job:
            t.bye()
        for n in (self.a, self.b):  # the daemon ends the run once it has read the Goodbye
            wait_for("nothing of %s on %s's page" % (JOB, n.name),
                     lambda: 'run="%s"' % JOB not in n.metrics_text(), proc=n.d.proc)
        wait_for("nothing of %s in Prometheus" % JOB, lambda: self.gone(JOB),
                 proc=self.prom.proc)
        wait_for("the collapse page resolved", lambda: self.hook.find(
            "resolved", "AttnstatEntropyFloor", JOB, str(BAD_LAYER), str(BAD_HEAD)),
            proc=self.prom.proc)
        self.assertEqual(self.query('ALERTS{run="%s"}' % JOB), [])


if __name__ == "__main__":
    unittest.main(verbosity=2)
