#!/usr/bin/env python3
"""test_deploy.py — deploy/'s cluster files, each checked by the tool its users use, and the
daemon's /metrics by the tool that reads it:
  - Prometheus: `promtool check config` of prometheus.yml (and of the Kubernetes variant, where
    this promtool has Kubernetes discovery: Debian builds it without), `promtool check rules` and
    `promtool test rules` (the rules' unit tests: pooled values and every alert, with its labels);
  - Alertmanager: `amtool check-config`, and `amtool config routes test` for where each alert goes;
  - Grafana: the dashboard against Grafana's import format (tests/deploy_checks.py);
  - Kubernetes: the manifests against the part of the API schema they use (deploy_checks.py);
  - attnstatd's scrape in every metrics_heads mode, with two tensor-parallel ranks of one job
    pushing: `promtool check metrics` (format and naming conventions), global head numbers, the
    cardinality each mode promises;
  - attnstatd as an exporter: listening where --web.listen-address says, attnstat_build_info and
    the process_* families with their types, help, labels and values checked against what the
    test knows of the process (its start, its descriptors, its open-file limit, its uptime).
Skipped (77), saying why, when promtool and amtool are missing (deploy/install-deps.sh installs
them). Run by ctest (ATTNSTAT_DAEMON, ATTNSTAT_SYNTH, ATTNSTAT_SOURCE_DIR).
"""
import glob
import os
import re
import resource
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import clusterhelpers as ch  # noqa: E402
import deploy_checks  # noqa: E402
from pkghelpers import SOURCE, need_env, run  # noqa: E402
import pkghelpers as ph  # noqa: E402

try:
    import yaml
except ImportError:  # pragma: no cover
    yaml = None

DEPLOY = os.path.join(SOURCE, "deploy")
PROMTOOL, AMTOOL = ch.need_tools("promtool", "amtool")


class TestPrometheus(unittest.TestCase):
    def test_config(self):
        with tempfile.TemporaryDirectory() as d:
            shutil.copytree(os.path.join(DEPLOY, "prometheus"), os.path.join(d, "p"))
            out = run([PROMTOOL, "check", "config", os.path.join(d, "p", "prometheus.yml")])
            self.assertIn("SUCCESS", out.stdout + out.stderr)

    def test_rules(self):
        out = run([PROMTOOL, "check", "rules", os.path.join(DEPLOY, "prometheus", "attnstat.rules.yml")])
        self.assertIn("SUCCESS", out.stdout + out.stderr)

    def test_rules_unit_tests(self):
        """The rules' own tests: the pooled values and every alert, with its labels."""
        run([PROMTOOL, "test", "rules", "attnstat.rules.test.yml"],
            cwd=os.path.join(DEPLOY, "prometheus"))

    def test_rules_unit_tests_catch_a_wrong_threshold(self):
        """The unit tests can fail: with the default floor moved, or a job's own ceiling ignored,
        promtool says so, naming the alert."""
        mutations = [("or on (run) 0.1 * group by (run)", "or on (run) 0.05 * group by (run)",
                      "AttnstatEntropyFloor"),
                     ("> on (run) group_left () attnstat:run_logit_ceiling:min", "> 100",
                      "AttnstatLogitCeiling")]
        for old, new, alert in mutations:
            with tempfile.TemporaryDirectory() as d:
                p = shutil.copytree(os.path.join(DEPLOY, "prometheus"), os.path.join(d, "p"))
                rules = os.path.join(p, "attnstat.rules.yml")
                with open(rules) as f:
                    text = f.read()
                self.assertIn(old, text)
                with open(rules, "w") as f:
                    f.write(text.replace(old, new))
                out = run([PROMTOOL, "test", "rules", "attnstat.rules.test.yml"], check=False,
                          cwd=p)
                self.assertNotEqual(out.returncode, 0, new)
                self.assertIn(alert, out.stdout + out.stderr)

    def test_kubernetes_config(self):
        with tempfile.TemporaryDirectory() as d:
            shutil.copy(os.path.join(DEPLOY, "kubernetes", "prometheus-kubernetes.yml"), d)
            shutil.copy(os.path.join(DEPLOY, "prometheus", "attnstat.rules.yml"), d)
            out = run([PROMTOOL, "check", "config", os.path.join(d, "prometheus-kubernetes.yml")],
                      check=False)
            text = out.stdout + out.stderr
            if out.returncode != 0 and "field kubernetes_sd_configs not found" in text:
                # Debian's Prometheus is built without Kubernetes discovery: the rest of the file
                # is still checked, with that discovery taken out.
                with open(os.path.join(d, "prometheus-kubernetes.yml")) as f:
                    cfg = yaml.safe_load(f)
                for sc in cfg["scrape_configs"]:
                    self.assertEqual(sc.pop("kubernetes_sd_configs"), [{"role": "pod"}])
                    sc["static_configs"] = [{"targets": ["localhost:9464"]}]
                for am in cfg["alerting"]["alertmanagers"]:
                    am.pop("kubernetes_sd_configs")
                    am["static_configs"] = [{"targets": ["localhost:9093"]}]
                with open(os.path.join(d, "prometheus-kubernetes.yml"), "w") as f:
                    yaml.safe_dump(cfg, f)
                print("note: this promtool has no Kubernetes discovery (Debian's build): "
                      "prometheus-kubernetes.yml checked with it replaced by static targets")
                out = run([PROMTOOL, "check", "config",
                           os.path.join(d, "prometheus-kubernetes.yml")], check=False)
                text = out.stdout + out.stderr
            self.assertEqual(out.returncode, 0, text)


class TestAlertmanager(unittest.TestCase):
    CFG = os.path.join(DEPLOY, "alertmanager", "alertmanager.yml")

    def test_config(self):
        out = run([AMTOOL, "check-config", self.CFG])
        self.assertIn("SUCCESS", out.stdout + out.stderr)

    def test_routes(self):
        """Where each kind of alert goes: attention health to the ML on-call (critical) or its
        chat (warnings), the daemons' health to the cluster's operators, operators' silences and
        acknowledgements to nobody (they only inhibit)."""
        cases = [(["alertname=AttnstatEntropyFloor", "severity=critical", "run=gpt"], "ml-oncall"),
                 (["alertname=AttnstatLogitCeiling", "severity=critical", "run=gpt"], "ml-oncall"),
                 (["alertname=AttnstatEntropyDrop", "severity=warning", "run=gpt"], "ml-chat"),
                 (["alertname=AttnstatDaemonAlert", "severity=warning", "run=gpt"], "ml-chat"),
                 (["alertname=AttnstatDaemonDown", "severity=warning"], "cluster-ops"),
                 (["alertname=AttnstatStoreErrors", "severity=critical"], "cluster-ops"),
                 (["alertname=AttnstatSilenced", "severity=none", "run=gpt"], "attnstat-marks"),
                 (["alertname=AttnstatAcknowledged", "severity=none", "run=gpt"],
                  "attnstat-marks")]
        for labels, receiver in cases:
            run([AMTOOL, "config", "routes", "test", "--config.file", self.CFG,
                 "--verify.receivers", receiver] + labels)
        wrong = run([AMTOOL, "config", "routes", "test", "--config.file", self.CFG,
                     "--verify.receivers", "ml-oncall", "alertname=AttnstatDaemonDown"], check=False)
        self.assertNotEqual(wrong.returncode, 0)


class TestGrafana(unittest.TestCase):
    def test_dashboard(self):
        d = deploy_checks.load_dashboard(os.path.join(DEPLOY, "grafana", "attnstat-dashboard.json"))
        self.assertEqual(deploy_checks.check_dashboard(d, "attnstat-dashboard.json"), [])
        kinds = {p["type"] for p in d["panels"]}
        self.assertTrue({"heatmap", "table", "timeseries"} <= kinds)
        self.assertTrue(any("ALERTS" in a.get("expr", "") for a in d["annotations"]["list"]))

    def test_check_catches_mistakes(self):
        d = deploy_checks.load_dashboard(os.path.join(DEPLOY, "grafana", "attnstat-dashboard.json"))
        d["panels"][2]["id"] = d["panels"][1]["id"]
        d["panels"][3]["targets"][0]["datasource"] = {"type": "prometheus", "uid": "prod"}
        d["panels"][4]["targets"][0]["expr"] += ' + on() vector($nosuch)'
        problems = "\n".join(deploy_checks.check_dashboard(d, "x"))
        self.assertIn("not unique", problems)
        self.assertIn("not one of the dashboard's inputs", problems)
        self.assertIn("$nosuch", problems)


@unittest.skipIf(yaml is None, "PyYAML (python3-yaml) is missing")
class TestKubernetes(unittest.TestCase):
    def test_manifests(self):
        files = sorted(glob.glob(os.path.join(DEPLOY, "kubernetes", "*.yaml")))
        self.assertGreaterEqual(len(files), 2)
        kinds = set()
        for fn in files:
            with open(fn) as f:
                docs = list(yaml.safe_load_all(f))
            self.assertEqual(deploy_checks.check_k8s(docs, os.path.basename(fn)), [])
            kinds |= {d["kind"] for d in docs if d}
        self.assertTrue({"DaemonSet", "Job", "ConfigMap"} <= kinds)

    def test_check_catches_mistakes(self):
        with open(os.path.join(DEPLOY, "kubernetes", "attnstat-daemonset.yaml")) as f:
            docs = list(yaml.safe_load_all(f))
        ds = docs[1]
        c = ds["spec"]["template"]["spec"]["containers"][0]
        c["volumeMount"] = c.pop("volumeMounts")[:1]                   # a typo'd key
        ds["spec"]["template"]["spec"]["hostIPC"] = "true"              # a string, not a bool
        ds["spec"]["template"]["metadata"]["annotations"]["prometheus.io/port"] = "9999"
        problems = "\n".join(deploy_checks.check_k8s(docs, "x"))
        self.assertIn("'volumeMount'", problems)
        self.assertIn("hostIPC", problems)
        self.assertIn("prometheus.io/port", problems)


class TestMetrics(unittest.TestCase):
    """attnstatd's /metrics, read by promtool, with two tensor-parallel ranks of one job."""

    @classmethod
    def setUpClass(cls):
        cls.daemon, cls.synth = need_env("ATTNSTAT_DAEMON", "ATTNSTAT_SYNTH")
        cls.tmp = tempfile.mkdtemp(prefix="attnstat-deploy-")

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def scrape(self, mode, top=None):
        node = ch.Node(self.daemon, self.tmp, "node-" + mode, "--metrics-heads", mode,
                       *(["--metrics-top", str(top)] if top else []))
        try:
            # 2 ranks x 6 local heads x 3 layers: global heads 0..11; rank 1's local head 2 of
            # layer 1 (global 8) and rank 0's head 4 of layer 2 (global 4) collapse (their
            # logits grow too: a growing head's attention sharpens, so no other head is named).
            # The ranks leave without Goodbye, so that the job is still live (with its alerts)
            # when scraped: a Goodbye ends a run and resolves its alerts.
            for rank, bad in ((0, "2.4"), (1, "1.2")):
                ch.synth(self.synth, node, "tpjob", rank, "--no-goodbye", "--tp-rank", rank,
                         "--tp-size", 2,
                         "--layers", 3, "--heads", 6, "--seq", 64, "--steps", 40,
                         "--seed", 11 + rank, "--collapse", bad, "--grow", bad)
            text = node.metrics_text()
        finally:
            node.stop()
        with open(os.path.join(self.tmp, "metrics-%s.txt" % mode), "w") as f:
            f.write(text)
        p = subprocess.run([PROMTOOL, "check", "metrics"], input=text, universal_newlines=True,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        self.assertEqual(p.returncode, 0, "promtool check metrics:\n%s" % p.stdout)
        self.assertEqual(p.stdout.strip(), "", "lint problems:\n%s" % p.stdout)
        return ch.parse_metrics(text)

    def test_all(self):
        m = self.scrape("all")
        ent = ch.series(m, "attnstat_head_entropy_normalized_ratio", run="tpjob")
        heads = sorted((int(dict(k)["layer"]), int(dict(k)["head"])) for k in ent)
        self.assertEqual(heads, [(l, h) for l in range(3) for h in range(12)])
        low = {(int(dict(k)["layer"]), int(dict(k)["head"])) for k, v in ent.items() if v < 0.1}
        self.assertEqual(low, {(1, 8), (2, 4)})
        self.assertEqual(len(ch.series(m, "attnstat_head_step", run="tpjob")), 36)
        self.assertEqual({v for v in ch.series(m, "attnstat_head_step").values()}, {39})
        self.assertEqual(len(ch.series(m, "attnstat_layer_heads", run="tpjob")), 3)
        self.assertEqual(set(ch.series(m, "attnstat_layer_heads").values()), {12})
        alerts = ch.series(m, "attnstat_head_alert", rule="entropy_floor")
        self.assertEqual({(dict(k)["layer"], dict(k)["head"]) for k in alerts},
                         {("1", "8"), ("2", "4")})

    def test_dashboard_and_rules_read_exported_metrics(self):
        """Every attnstatd metric the Grafana dashboard and the Prometheus rules query is one
        /metrics exports (a panel or rule on a name it does not is empty, and says nothing)."""
        self.scrape("all")
        with open(os.path.join(self.tmp, "metrics-all.txt")) as f:
            exported = set(families(f.read()))
        d = deploy_checks.load_dashboard(os.path.join(DEPLOY, "grafana", "attnstat-dashboard.json"))
        exprs = [e for _, e in deploy_checks.dashboard_queries(d)]
        with open(os.path.join(DEPLOY, "prometheus", "attnstat.rules.yml")) as f:
            exprs += re.findall(r"expr:\s*(.+)", f.read())
        used = {n for e in exprs for n in re.findall(r"\battnstat_[a-z0-9_]+", e)}
        self.assertGreaterEqual(len(used), 10, used)
        self.assertIn("attnstat_interventions_stored_total", used)
        missing = sorted(n for n in used if n not in exported and
                         re.sub(r"_(bucket|sum|count)$", "", n) not in exported)
        self.assertEqual(missing, [], "queried, not exported (exported: %s)" % sorted(exported))

    def test_top(self):
        m = self.scrape("top", top=2)
        ent = ch.series(m, "attnstat_head_entropy_normalized_ratio", run="tpjob")
        logit = ch.series(m, "attnstat_head_max_logit", run="tpjob")
        # the 2 lowest-entropy heads, the 2 highest-logit ones, and every alerted head
        self.assertLessEqual(len(ent), 2 + 2 + 4)
        self.assertGreaterEqual(len(ent), 2)
        named = {(dict(k)["layer"], dict(k)["head"]) for k in ent}
        self.assertTrue({("1", "8"), ("2", "4")} <= named, named)
        self.assertEqual(len(logit), len(ent))
        self.assertEqual(len(ch.series(m, "attnstat_layer_min_entropy_normalized_ratio")), 3)

    def test_layers(self):
        m = self.scrape("layers")
        self.assertEqual(ch.series(m, "attnstat_head_entropy_normalized_ratio"), {})
        lmin = ch.series(m, "attnstat_layer_min_entropy_normalized_ratio", run="tpjob")
        self.assertEqual(len(lmin), 3)
        self.assertLess(lmin[(("layer", "1"), ("run", "tpjob"))], 0.1)
        self.assertGreater(lmin[(("layer", "0"), ("run", "tpjob"))], 0.3)
        self.assertEqual(len(ch.series(m, "attnstat_head_alert", rule="entropy_floor")), 2)


def families(text):
    """{name: {"type": ..., "help": ..., "samples": [(labels dict, value)]}} of a Prometheus text
    page; a sample counts under the family its name begins with (name, name_total...)."""
    fam = {}
    for line in text.splitlines():
        m = re.match(r"^# (HELP|TYPE) (\S+) (.*)$", line)
        if m:
            fam.setdefault(m.group(2), {"samples": []})[m.group(1).lower()] = m.group(3)
    for (name, labels), value in ch.parse_metrics(text).items():
        if name in fam:
            fam[name]["samples"].append((dict(labels), value))
    return fam


class TestExporter(unittest.TestCase):
    """attnstatd as Prometheus expects an exporter to be: --web.listen-address, its build's
    attnstat_build_info and the process_* families of the client libraries."""

    @classmethod
    def setUpClass(cls):
        cls.daemon, cls.cli = need_env("ATTNSTAT_DAEMON", "ATTNSTAT_CLI")
        cls.tmp = tempfile.mkdtemp(prefix="attnstat-exporter-")

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def test_build_info_and_process_metrics(self):
        sock, db = os.path.join(self.tmp, "d.sock"), os.path.join(self.tmp, "d.db")
        port, other = ch.free_port(), ch.free_port()
        # An open-file limit the daemon cannot raise (it raises its soft limit to the hard one):
        # process_max_fds must say exactly this.
        nofile = min(4321, resource.getrlimit(resource.RLIMIT_NOFILE)[1])

        def limit():
            resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))
        t0 = time.time()
        # The alias comes after --metrics-port / --metrics-bind: the later flag wins.
        d = ph.Daemon([self.daemon, "--socket", sock, "--db", db, "--metrics-port", str(other),
                       "--metrics-bind", "::1", "--web.listen-address", "127.0.0.1:%d" % port],
                      log_dir=self.tmp, preexec_fn=limit)
        try:
            url = "http://127.0.0.1:%d/metrics" % port

            def serves():
                try:
                    return ch.http_get(url)
                except OSError:
                    return None
            ch.wait_for("the metrics port given by --web.listen-address", serves, proc=d.proc)
            t1 = time.time()
            text = ch.http_get(url)
            fds_now = len(os.listdir("/proc/%d/fd" % d.proc.pid))
            status = ph.cli_json(self.cli, "--socket", sock, "status")[0]
            now = time.time()
            text2 = ch.http_get(url)
            self.assertFalse(connects("::1", other), "the overridden --metrics-port listens")
        finally:
            d.stop()
        p = subprocess.run([PROMTOOL, "check", "metrics"], input=text, universal_newlines=True,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        self.assertEqual((p.returncode, p.stdout.strip()), (0, ""), "promtool check metrics")
        fam = families(text)

        def one(name, typ):
            f = fam.get(name)
            self.assertIsNotNone(f, "%s is not on the page" % name)
            self.assertEqual(f.get("type"), typ, name)
            self.assertTrue(f.get("help"), "%s has no HELP" % name)
            self.assertEqual(len(f["samples"]), 1, name)
            return f["samples"][0]

        labels, value = one("attnstat_build_info", "gauge")
        self.assertEqual(value, 1)
        self.assertEqual(set(labels), {"version", "protocol", "schema", "cuda", "libuv"})
        self.assertEqual(labels["version"], ph.header_version())
        with open(os.path.join(SOURCE, "proto", "frame.h")) as f:
            proto = re.search(r"#define FRAME_PROTOCOL_VERSION (\d+)u", f.read()).group(1)
        self.assertEqual(labels["protocol"], proto)
        migrations = glob.glob(os.path.join(SOURCE, "schema", "[0-9][0-9][0-9]_*.sql"))
        self.assertEqual(int(labels["schema"]),
                         max(int(os.path.basename(m)[:3]) for m in migrations))
        # The same build's libattnstat says "+cuda" when the build has the GPU path.
        cuda = "+cuda" in run([self.cli, "--version"]).stdout
        self.assertEqual(labels["cuda"], "true" if cuda else "false")
        self.assertRegex(labels["libuv"], r"^\d+\.\d+\.\d+")
        _, gpus = one("attnstat_gpu_devices", "gauge")
        self.assertGreaterEqual(gpus, 0)
        if not cuda:
            self.assertEqual(gpus, 0)

        _, cpu = one("process_cpu_seconds_total", "counter")
        self.assertGreaterEqual(cpu, 0)
        self.assertLessEqual(cpu, (now - t0) * (os.cpu_count() or 1) + 1)
        _, rss = one("process_resident_memory_bytes", "gauge")
        _, vsz = one("process_virtual_memory_bytes", "gauge")
        self.assertGreater(rss, 1 << 20)
        self.assertGreater(vsz, rss)
        _, start = one("process_start_time_seconds", "gauge")
        # Started while the test waited for it (the clock's tick of 10 ms either side), and as
        # long before the status reply as the daemon's own uptime says (its counters begin a
        # moment after the process).
        self.assertGreaterEqual(start, t0 - 1.0)
        self.assertLessEqual(start, t1 + 1.0)
        since = now - status["uptime_s"] - start
        self.assertGreaterEqual(since, -1.0, (now, status["uptime_s"], start))
        self.assertLessEqual(since, t1 - t0 + 1.0, (now, status["uptime_s"], start))
        _, fds = one("process_open_fds", "gauge")
        self.assertGreater(fds, 0)
        self.assertLessEqual(abs(fds - fds_now), 3, "open fds %g, /proc says %d" % (fds, fds_now))
        _, maxfds = one("process_max_fds", "gauge")
        self.assertEqual(maxfds, nofile)
        # Read at each scrape: the CPU time only grows.
        self.assertGreaterEqual(families(text2)["process_cpu_seconds_total"]["samples"][0][1], cpu)

    def test_listen_address_refused_with_the_reason(self):
        for value, why in (("localhost:9464", "not an IPv4 address"),
                           ("::1:9464", "in brackets"),
                           ("127.0.0.1", "[HOST]:PORT"),
                           (":0", "not in 1 .. 65535")):
            p = run([self.daemon, "--web.listen-address", value, "--socket",
                     os.path.join(self.tmp, "x.sock"), "--db", os.path.join(self.tmp, "x.db")],
                    check=False, timeout=60)
            self.assertEqual(p.returncode, 2, value)
            self.assertIn("--web.listen-address '%s'" % value, p.stderr)
            self.assertIn(why, p.stderr)
        conf = os.path.join(self.tmp, "alias.conf")
        with open(conf, "w") as f:
            f.write("web.listen-address = :9464\n")
        p = run([self.daemon, "--config", conf, "--help"], check=False)
        self.assertEqual(p.returncode, 2)
        self.assertIn("metrics_bind and metrics_port", p.stderr)


def connects(host, port):
    """Whether something accepts a TCP connection at host:port."""
    try:
        with socket.create_connection((host, port), timeout=5):
            return True
    except OSError:
        return False


if __name__ == "__main__":
    unittest.main(verbosity=2)
