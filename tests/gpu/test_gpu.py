#!/usr/bin/env python3
"""GPU end to end: attnstatd and training processes (tests/gpu/gpu_trainer.py), each a process of
its own, on a real CUDA device. Exits 77 (skipped) without PyTorch, without a usable GPU, or when
libattnstat / attnstatd have no GPU path.

What is checked
  - values: the daemon's per-head statistics of pushed CUDA tensors (zero-copy path) equal a
    float64 PyTorch computation on the same tensors: entropy mean within 1e-4 relative (+1e-6),
    entropy min / max (single rows) within 1e-3 nats, max logit within 1e-5 relative. Per-row
    values never leave the daemon, so the per-row bound is checked through min and max.
  - the same through the staged path (PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True);
  - a push neither synchronises the device nor waits: it returns while a long kernel still runs
    on its stream; its CPU time (p50, p99) is measured and recorded;
  - a trainer SIGKILLed mid-run: the daemon closes its handles and serves the next trainer;
  - a raw-frame client that lies about offsets and buffer sizes is refused (gpu_raw_push);
  - two trainers at once on one daemon;
  - what real models hand over: float32/float16/bfloat16 x both layouts x SDPA's masks (boolean,
    additive, general), compute dtypes; a transformers Llama model under bf16 autocast with a
    padded batch through attnstat.torch.monitor(model=...); flex_attention with a document mask
    and a sliding window through the monitor's flex door. Values against float64 computed from
    q and k rounded to the precision the daemon computes in (plain float32: bf16).
  - and the jobs people run, one test each: compiled models, flex_attention and varlen_attn,
    sinks, MultiheadAttention, activation checkpointing, tensor parallelism, QK-Clip.
Why this file is long: every test shares one daemon (started once for the class, as a node runs
one) and the float64 reference above; the training jobs themselves live in gpu_trainer.py.
Environment: ATTNSTAT_LIB, ATTNSTAT_DAEMON, ATTNSTAT_RAW_PUSH (set by ctest); ATTNSTAT_GPU_OUT: a
directory where the measurements (nosync.json) and the daemon's log are copied.
"""
import importlib.util
import json
import math
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import unittest

try:
    import torch
except Exception:  # noqa: BLE001
    print("skipped: no PyTorch")
    sys.exit(77)
if not torch.cuda.is_available():
    print("skipped: no usable CUDA device")
    sys.exit(77)

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "client", "python"))
from attnstat import _lib  # noqa: E402

LIB = _lib.load()
if b"+cuda" not in (LIB.attnstat_version() or b""):
    print("skipped: %s has no GPU path" % LIB._attnstat_path)
    sys.exit(77)
DAEMON = os.environ.get("ATTNSTAT_DAEMON") or os.path.join(
    os.path.dirname(os.path.dirname(os.path.realpath(LIB._attnstat_path))), "daemon", "attnstatd")
RAW = os.environ.get("ATTNSTAT_RAW_PUSH")
TRAINER = os.path.join(HERE, "gpu_trainer.py")
OUT = os.environ.get("ATTNSTAT_GPU_OUT")


class Daemon(object):
    def __init__(self, d):
        self.dir = d
        self.socket = os.path.join(d, "a.sock")
        self.db = os.path.join(d, "a.db")
        self.logpath = os.path.join(d, "attnstatd.log")
        self.log = open(self.logpath, "w")
        self.proc = subprocess.Popen([DAEMON, "--socket", self.socket, "--db", self.db,
                                      "--log-level", "debug"], stdout=self.log,
                                     stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError("attnstatd exited:\n" + self.text())
            try:
                with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                    s.connect(self.socket)
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError("attnstatd did not listen:\n" + self.text())
                time.sleep(0.05)

    def text(self):
        self.log.flush()
        with open(self.logpath) as f:
            return f.read()

    def close(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        if OUT:
            os.makedirs(OUT, exist_ok=True)
            with open(os.path.join(OUT, "attnstatd.log"), "a") as f:
                f.write(self.text_final())

    def text_final(self):
        with open(self.logpath) as f:
            return f.read()


def trainer(mode, sock, out, *extra, env=None, check=True, timeout=240):
    e = dict(os.environ)
    e.update(env or {})
    e["PYTHONUNBUFFERED"] = "1"
    r = subprocess.run([sys.executable, TRAINER, mode, sock, out] + list(extra), env=e,
                       capture_output=True, text=True, timeout=timeout)
    if check and r.returncode != 0:
        raise AssertionError("trainer %s failed (%d):\n%s\n%s" % (mode, r.returncode, r.stdout,
                                                                   r.stderr))
    return r


def _mask_4d(m, B, H, Nq, Nk):
    while m.dim() < 4:
        m = m.unsqueeze(0)
    return m.expand(B, H, Nq, Nk)


def reference(c):
    """float64 per-head statistics: {head: (mean, min, max, max_logit, rows, sink_mass, distance)}.
    q and k are first
    rounded to the precision the daemon computes in: the case's compute dtype, else their own,
    and bf16 for plain float32 (the GPU's float32 mode, stats_cuda.h). Masks follow SDPA: boolean
    True = the key takes part; additive values are added to the logits, -inf and the dtype's
    lowest value exclude the key; the max logit is the largest logit without the additive values.
    Rows that see no key are left out. c["sinks"] ([Hq]): each head's sink logit joins every
    row's softmax as one more outcome (not in the max logit). Sink mass: each row's probability of
    its first visible key; distance: sum_j p_j |i + Lk - Lq - j| over its keys (the causal diagonal;
    the sink has no position); both means over the counted rows (kernels/stats.h)."""
    q, k = c["q"], c["k"]
    if c.get("layout") == "bnhd":
        q, k = q.transpose(1, 2), k.transpose(1, 2)
    comp = c.get("compute")
    if comp is None and q.dtype == torch.float32:
        comp = torch.bfloat16
    if comp is not None and comp != torch.float32:
        q, k = q.to(comp), k.to(comp)
    q, k = q.double(), k.double()
    B, hq, hk = q.shape[0], q.shape[1], k.shape[1]
    k = k.repeat_interleave(hq // hk, dim=1)
    scale = c.get("scale") or 1.0 / math.sqrt(q.shape[-1])
    mask = c.get("mask")
    if c.get("cu"):
        cu = c["cu"]
        segs = [(0, cu[i], cu[i + 1], cu[i], cu[i + 1]) for i in range(len(cu) - 1)]
    else:
        segs = [(b, 0, q.shape[2], 0, k.shape[2]) for b in range(B)]
    ent = [[] for _ in range(hq)]
    mx = [[] for _ in range(hq)]
    sink = [[] for _ in range(hq)]
    dist = [[] for _ in range(hq)]
    for b, q0, q1, k0, k1 in segs:
        s = scale * torch.matmul(q[b, :, q0:q1], k[b, :, k0:k1].transpose(-1, -2))
        lq, lk = q1 - q0, k1 - k0
        keep = torch.ones_like(s, dtype=torch.bool)
        bias = torch.zeros_like(s)
        if c["causal"]:
            i = torch.arange(lq).view(-1, 1)
            j = torch.arange(lk).view(1, -1)
            keep &= (j <= i + (lk - lq))
        if mask is not None:
            m = _mask_4d(mask.cpu(), B, hq, lq, lk)[b]
            if m.dtype == torch.bool:
                keep &= m
            else:
                out = (m == float("-inf")) | (m == torch.finfo(m.dtype).min)
                keep &= ~out
                bias = torch.where(out, torch.zeros_like(s), m.double())
        m_raw = s.masked_fill(~keep, float("-inf")).max(dim=-1).values
        sb = (s + bias).masked_fill(~keep, float("-inf"))
        ok = torch.isfinite(sb.max(dim=-1).values)
        if c.get("sinks") is not None:  # one more outcome per row: the head's sink logit
            sk = c["sinks"].double().view(hq, 1, 1).expand(hq, lq, 1)
            sb = torch.cat([sb, sk], dim=-1)
        m = sb.max(dim=-1).values
        t = sb - m.unsqueeze(-1)
        p = torch.exp(t)
        l = p.sum(-1)
        w = torch.where(torch.isfinite(t), p * t, torch.zeros_like(t)).sum(-1)
        h = torch.log(l) - w / l
        pk = p[..., :lk] / l.unsqueeze(-1)  # the keys' probabilities (the sink's left out)
        first = keep.to(torch.int8).argmax(dim=-1, keepdim=True)  # the lowest visible key
        sm = pk.gather(-1, first).squeeze(-1)
        pos = torch.arange(lq, dtype=torch.float64).view(-1, 1) + (lk - lq)
        dd = torch.where(keep, pk * (pos - torch.arange(lk, dtype=torch.float64).view(1, -1)).abs(),
                         torch.zeros_like(pk)).sum(-1)
        for hh in range(hq):
            ent[hh].append(h[hh][ok[hh]].clamp_min(0))
            mx[hh].append(m_raw[hh][ok[hh]])
            sink[hh].append(sm[hh][ok[hh]])
            dist[hh].append(dd[hh][ok[hh]])
    out = {}
    for hh in range(hq):
        e = torch.cat(ent[hh])
        out[hh] = (e.mean().item(), e.min().item(), e.max().item(), torch.cat(mx[hh]).max().item(),
                   e.numel(), torch.cat(sink[hh]).mean().item(), torch.cat(dist[hh]).mean().item())
    return out


def absent(v):
    return v is None or v != v


def compare_heads(c, got, bad, asked=False):
    """got: the daemon's heads of case c ({head: result}); appends every value off by more than
    tests/gpu's tolerances to bad. asked: the pushes asked for every statistic (stats="all"), so
    sink mass and distance must be there and right; else they must be absent, whichever kernel
    ran (a result carries what was asked)."""
    for hh, (mean, mn, mxe, ml, rows, sm, dd) in reference(c).items():
        g = got[hh]
        checks = [("rows", g["rows"], rows, 0, 0),
                  ("entropy_mean", g["entropy_mean"], mean, 1e-4, 1e-6),
                  ("entropy_min", g["entropy_min"], mn, 0, 1e-3),
                  ("entropy_max", g["entropy_max"], mxe, 0, 1e-3),
                  ("max_logit", g["max_logit"], ml, 1e-5, 1e-5 if abs(ml) < 1 else 0),
                  ("sink_mass", g["sink_mass"], sm, 0, 1e-4),
                  ("distance", g["distance"], dd, 1e-4, 1e-4)]
        for name, a, b, rel, ab in checks:
            if name in ("sink_mass", "distance") and not asked:
                if not absent(a):
                    bad.append("%s head %d %s: %r, not asked for" % (c["name"], hh, name, a))
                continue
            if absent(a) or not abs(a - b) <= rel * abs(b) + ab:
                bad.append("%s head %d %s: daemon %.9g, float64 %.9g" % (c["name"], hh, name, a, b))


def compare(tc, data):
    bad = []
    for i, c in enumerate(data["cases"]):
        got = {h["head"]: h for h in data["results"].get(i, [])}
        tc.assertEqual(len(got), c["q"].shape[2 if c.get("layout") == "bnhd" else 1],
                       "case %s: heads in the result" % c["name"])
        compare_heads(c, got, bad, data.get("stats_asked", False))
    tc.assertEqual(bad, [], "\n".join(bad))


def two_gpus(test):
    """Marks a test that needs two GPUs (it skips itself with one): bench/gpu_e2e.sh PART=two runs
    the marked ones alone."""
    test.two_gpus = True
    return test


class TestGPU(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory(prefix="attnstat-gpu-")
        cls.d = Daemon(cls.tmp.name)

    @classmethod
    def tearDownClass(cls):
        cls.d.close()
        cls.tmp.cleanup()

    def tearDown(self):
        # A daemon that died fails the test it died in, with its exit, and the next test gets a
        # new one (else every later test fails on a refused connection and hides the cause).
        rc = self.d.proc.poll()
        if rc is None:
            return
        log = self.d.text()[-3000:]
        self.d.close()
        type(self).d = Daemon(tempfile.mkdtemp(dir=self.tmp.name))
        self.fail("attnstatd died during this test (exit %s%s); its log ends:\n%s"
                  % (rc, " = signal %d" % -rc if rc < 0 else "", log))

    def values(self, name, env=None, extra=()):
        out = os.path.join(self.tmp.name, name + ".pt")
        r = trainer("values", self.d.socket, out, "--run", name, *extra, env=env)
        data = torch.load(out, weights_only=False)
        st = data["stats"]
        self.assertEqual(st["acked"], len(data["cases"]), r.stdout + r.stderr)
        self.assertEqual(st["rejected"], 0)
        self.assertEqual(st["held"], 0, "tensors still held after flush")
        self.assertEqual(st["releases_pending"], 0)
        compare(self, data)
        return data, r

    def test_1_zero_copy_values(self):
        data, r = self.values("zero-copy")
        st = data["stats"]
        self.assertEqual(st["cuda_zero_copy"], len(data["cases"]), r.stdout)
        self.assertEqual(st["cuda_staged"], 0)
        self.assertGreater(data["held_after_push"], 0, "zero-copy pushes hold their tensors")
        self.assertEqual(len(data["devices"]), 1, "the hello named the current device")

    def test_2_staged_values(self):
        data, r = self.values("staged", env={"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"})
        st = data["stats"]
        self.assertEqual(st["cuda_staged"], len(data["cases"]), r.stdout)
        self.assertEqual(st["cuda_zero_copy"], 0)
        self.assertEqual(data["held_after_push"], 0, "staged pushes hold nothing")

    def test_3_push_does_not_synchronise(self):
        out = os.path.join(self.tmp.name, "nosync.json")
        trainer("nosync", self.d.socket, out, "--pushes", "2000")
        with open(out) as f:
            res = json.load(f)
        if OUT:
            os.makedirs(OUT, exist_ok=True)
            shutil.copy(out, os.path.join(OUT, "nosync.json"))
        self.assertTrue(res["push_sent"])
        self.assertTrue(res["stream_busy_after_push"], res)
        self.assertLess(res["push_wall_us_behind_long_kernel"], 50000, res)
        print("push CPU time p50 %.1f us, p99 %.1f us (ctypes call alone %.2f us); Client.push "
              "p50 %.1f us" % (res["push_cpu_us_p50"], res["push_cpu_us_p99"],
                               res["ctypes_call_us_p50"], res["client_push_cpu_us_p50"]))

    def test_4_killed_trainer(self):
        ready = os.path.join(self.tmp.name, "loop.ready")
        e = dict(os.environ, PYTHONUNBUFFERED="1")
        p = subprocess.Popen([sys.executable, TRAINER, "loop", self.d.socket, ready, "--run",
                              "killed"], env=e, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 120
        while not os.path.exists(ready):
            if p.poll() is not None:
                self.fail("loop trainer exited: %s" % p.stdout.read().decode())
            self.assertLess(time.monotonic(), deadline, "loop trainer never got 20 pushes acked")
            time.sleep(0.1)
        time.sleep(0.5)  # pushes in flight when it dies
        p.kill()
        p.wait()
        p.stdout.close()
        # the daemon closes the dead client's handles and keeps serving
        deadline = time.monotonic() + 30
        while "closed an IPC allocation" not in self.d.text():
            self.assertLess(time.monotonic(), deadline, "no IPC handle closed after the kill:\n"
                            + self.d.text()[-3000:])
            time.sleep(0.2)
        self.assertIsNone(self.d.proc.poll(), "attnstatd died")
        self.values("after-kill")

    def test_5_raw_frames_past_the_end_are_refused(self):
        if not RAW or not os.path.exists(RAW):
            self.skipTest("gpu_raw_push is not built (ATTNSTAT_RAW_PUSH)")
        r = subprocess.run([RAW, self.d.socket], capture_output=True, text=True, timeout=60)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertIn("past the end of the device allocation", r.stdout)
        self.assertIsNone(self.d.proc.poll(), "attnstatd died")

    def test_6_two_trainers(self):
        outs = [os.path.join(self.tmp.name, "two%d.pt" % i) for i in range(2)]
        e = dict(os.environ, PYTHONUNBUFFERED="1")
        ps = [subprocess.Popen([sys.executable, TRAINER, "values", self.d.socket, outs[i], "--run",
                                "two-%d" % i, "--seed", str(10 + i)], env=e,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
              for i in range(2)]
        for p in ps:
            txt = p.communicate(timeout=240)[0].decode()
            self.assertEqual(p.returncode, 0, txt)
        for o in outs:
            data = torch.load(o, weights_only=False)
            self.assertEqual(data["stats"]["acked"], len(data["cases"]))
            compare(self, data)

    @two_gpus
    def test_7_two_gpus_one_daemon(self):
        """Two trainers on two GPUs, one daemon: a GPU worker per device, values right on both."""
        if torch.cuda.device_count() < 2:
            self.skipTest("one GPU: the two-GPU case needs a machine with two")
        outs = [os.path.join(self.tmp.name, "gpu%d.pt" % i) for i in range(2)]
        e = dict(os.environ, PYTHONUNBUFFERED="1")
        ps = [subprocess.Popen([sys.executable, TRAINER, "values", self.d.socket, outs[i], "--run",
                                "gpu-%d" % i, "--seed", str(20 + i), "--device", str(i)], env=e,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
              for i in range(2)]
        for p in ps:
            txt = p.communicate(timeout=240)[0].decode()
            self.assertEqual(p.returncode, 0, txt)
        uuids = set()
        for o in outs:
            data = torch.load(o, weights_only=False)
            self.assertEqual(data["stats"]["acked"], len(data["cases"]))
            self.assertEqual(data["stats"]["cuda_zero_copy"] + data["stats"]["cuda_staged"],
                             len(data["cases"]))
            compare(self, data)
            uuids.update(u.decode() if isinstance(u, bytes) else str(u) for u in data["devices"])
        self.assertEqual(len(uuids), 2, "the trainers named %s" % sorted(uuids))
        import attnstat
        with attnstat.Client(socket=self.d.socket, hello=False) as c:
            workers = {w["name"] for w in c.status()["workers"]}
        self.assertTrue(uuids <= workers, "workers %s, devices %s" % (sorted(workers), sorted(uuids)))

    def test_8_freed_memory_returns_and_graph_capture(self):
        out = os.path.join(self.tmp.name, "memory.json")
        r = trainer("memory", self.d.socket, out)
        with open(out) as f:
            res = json.load(f)
        self.assertTrue(res["push_sent"] and res["flushed"] and res["acked"] == 1, r.stdout)
        self.assertTrue(res["memory_returned"],
                        "free %.2f GiB before, %.2f GiB after the trainer freed its 4 GiB: the "
                        "daemon still maps it" % (res["free_before_gib"], res["free_after_gib"]))
        self.assertFalse(res["push_in_capture"], "a push inside a graph capture must be dropped")
        self.assertTrue(res["replay_ok"], "the captured graph no longer replays correctly")
        self.assertGreaterEqual(res["dropped_local"], 1)
        self.assertIsNone(self.d.proc.poll(), "attnstatd died")

    def test_9_dtypes_layouts_masks(self):
        """float32 / float16 / bfloat16 x [B,H,N,D] / [B,N,H,D] x no mask / boolean / additive,
        compute dtypes, a general mask: every push zero-copy, every value against float64."""
        data, r = self.values("inputs", extra=("--cases", "inputs"))
        st = data["stats"]
        self.assertEqual(st["cuda_zero_copy"], len(data["cases"]), r.stdout)
        self.assertGreaterEqual(len(data["cases"]), 22)

    def monitored(self, mode, extra=()):
        out = os.path.join(self.tmp.name, mode + "".join(extra) + ".pt")
        r = trainer(mode, self.d.socket, out, "--run", "monitored-" + mode + "".join(extra),
                    *extra)
        data = torch.load(out, weights_only=False)
        mon, st = data["monitor"], data["stats"]
        # every call pushed, nothing skipped, rejected, dropped or failed
        self.assertEqual(mon["pushed"], len(data["calls"]), (mon, r.stdout, r.stderr[-3000:]))
        self.assertEqual((mon["skipped"], mon["rejected"], mon["dropped"], mon["errors"]),
                         (0, 0, 0, 0), (mon, r.stderr[-3000:]))
        self.assertEqual(st["rejected"], 0, st)
        self.assertEqual(st["acked"], len(data["calls"]), st)
        return data, r

    def test_12_local_compute(self):
        """Local mode: every dtype, layout and mask computed in the trainer's process, only the
        results sent; the same values against float64, nothing exported or staged, every push
        acknowledged and its tensors let go."""
        data, r = self.values("local", extra=("--cases", "inputs", "--local"))
        st = data["stats"]
        self.assertEqual((st["cuda_zero_copy"], st["cuda_staged"]), (0, 0), r.stdout)
        self.assertGreater(data["held_after_push"], 0, "local pushes hold their tensors")

    def test_13_llama_local_compute(self):
        """The Llama model of test_10 monitored in local mode."""
        if importlib.util.find_spec("transformers") is None:
            self.skipTest("transformers is not installed")
        self.llama(("--local",))

    def test_10_llama_padded_batch_under_autocast(self):
        """A transformers Llama model, bf16 autocast, a padded batch, monitor(model=model) with
        its defaults: the calls are seen through transformers' attention interface with float32
        q and k and a boolean mask; each is pushed, computed as bf16 (what the model's attention
        computes), and equals float64."""
        if importlib.util.find_spec("transformers") is None:
            self.skipTest("transformers is not installed")
        self.llama(())

    def llama(self, extra):
        data, r = self.monitored("llama", extra)
        self.assertIn("transformers", data["doors"])
        calls = data["calls"]
        self.assertEqual(len(calls), 2 * 3, "two steps of three layers")
        bad = []
        for c in calls:
            self.assertIn(torch.float32, (c["q"].dtype, c["k"].dtype),
                          "q or k under autocast: float32 expected")
            self.assertTrue(c["autocast"])
            self.assertIsNotNone(c["mask"], "a padded batch comes with a mask")
            case = dict(name="llama step %d layer %d" % (c["step"], c["layer"]), q=c["q"],
                        k=c["k"], mask=c["mask"], causal=False, compute=torch.bfloat16,
                        scale=c["scale"])
            got = data["results"].get((c["step"], c["layer"]))
            self.assertIsNotNone(got, "no result for step %d layer %d (have %s)"
                                 % (c["step"], c["layer"], sorted(data["results"])))
            compare_heads(case, {h["head"]: h for h in got}, bad, data.get("stats_asked", False))
        self.assertEqual(bad, [], "\n".join(bad))

    def test_26_deepseek_under_autocast(self):
        """A transformers DeepSeek-V3 (latent attention) as test_10 runs the Llama: under autocast
        its query (a bfloat16 part joined to a float32 rotary part) and key reach sdpa in
        different dtypes and the attention rounds both to bfloat16; every call pushed, rounded
        the same way, equal to float64. Compiled too (each push's q and k rounded in the graph)."""
        if importlib.util.find_spec("transformers") is None:
            self.skipTest("transformers is not installed")
        try:
            from transformers import DeepseekV3Config  # noqa: F401
        except ImportError:
            self.skipTest("this transformers has no DeepSeek-V3")
        self.llama(("--model", "deepseek"))
        data = self.compiled_llama(("--model", "deepseek"))
        for p in data["calls"]:
            self.assertEqual((p["q"].dtype, p["k"].dtype), (torch.bfloat16,) * 2)

    def test_11_flex_attention_block_masks(self):
        """flex_attention with a document mask and a sliding window: the BlockMask's mask_mod is
        honoured (evaluated into a dense mask), values equal float64 of the same mask."""
        if importlib.util.find_spec("torch.nn.attention.flex_attention") is None:
            self.skipTest("this PyTorch has no flex_attention")
        data, r = self.monitored("flex")
        doc, w = data["doc"], data["window"]
        bad = []
        for c in data["calls"]:
            n = c["q"].shape[2]
            i = torch.arange(n).view(-1, 1)
            j = torch.arange(n).view(1, -1)
            if c["mask_name"] == "document":
                m = (doc.view(-1, 1) == doc.view(1, -1)) & (j <= i)
            else:
                m = (j <= i) & (i - j < w)
            case = dict(name="flex " + c["mask_name"], q=c["q"], k=c["k"], mask=m, causal=False)
            got = data["results"].get((c["step"], c["layer"]))
            self.assertIsNotNone(got, "no result for %s" % c["mask_name"])
            compare_heads(case, {h["head"]: h for h in got}, bad, data.get("stats_asked", False))
        self.assertEqual(bad, [], "\n".join(bad))

    # ---- the jobs people run: compiled, imported by name, sinks, tensor parallelism -------------
    def pushed_values(self, data, want):
        """Every push the monitor made (what it carried, recorded as it was called) against
        float64, and their number."""
        pushes = data["calls"]
        self.assertEqual(len(pushes), want, "pushes: %d, expected %d" % (len(pushes), want))
        bad = []
        for p in pushes:
            self.assertTrue(p["sent"])
            case = dict(p, name="step %d layer %d" % (p["step"], p["layer"]))
            got = data["results"].get((p["step"], p["layer"]))
            self.assertIsNotNone(got, "no result for step %d layer %d" % (p["step"], p["layer"]))
            compare_heads(case, {h["head"]: h for h in got}, bad, data.get("stats_asked", False))
        self.assertEqual(bad, [], "\n".join(bad))

    def test_29_multihead_attention_weights(self):
        """nn.MultiheadAttention called as DETR-like code calls it (need_weights at its default:
        torch computes it without SDPA) under bf16 autocast at the monitor's defaults, masks in
        MHA's convention: every call pushed ('mha' door, q and k from the module's own
        projection), each equal to float64, and the softmax of what was pushed is the weights the
        module returned (its excluded keys exactly 0); the encoder layer beside it through the
        sdpa door, once. Compiled: the calls with weights skipped and counted, never silent."""
        data, r = self.monitored("mha")
        self.assertIn("mha", data["doors"])
        pushes = data["calls"]
        self.assertEqual([p["layout"] for p in pushes], ["bnhd", "bnhd", "bhnd"] * 2)
        self.pushed_values(data, 6)
        mha = [p for p in pushes if p["layout"] == "bnhd"]
        self.assertEqual(len(data["weights"]), len(mha))
        for p, w in zip(mha, data["weights"]):
            q, k = p["q"].transpose(1, 2).double(), p["k"].transpose(1, 2).double()
            s = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
            keep = torch.ones_like(s, dtype=torch.bool)
            if p.get("mask") is not None:
                m = p["mask"]
                keep = keep & (m if m.dtype == torch.bool else m != float("-inf"))
                if m.dtype != torch.bool:
                    s = s + torch.where(keep, m.double(), torch.zeros_like(s))
            got = torch.softmax(s.masked_fill(~keep, float("-inf")), dim=-1)
            self.assertEqual(w.shape, got.shape)
            self.assertEqual(float(w[~keep].abs().max()) if (~keep).any() else 0.0, 0.0)
            self.assertTrue(bool((w[keep] > 0).all()), "a key the push keeps has weight 0")
            self.assertLess(float((got - w.double()).abs().max()), 0.05,
                            "the pushed q, k and mask are not what the module attended with")
        self.assertTrue(any(p.get("mask") is not None for p in mha))
        cm = data["compiled"]
        self.assertEqual(cm["skipped_by"], {"mha-compiled": 2}, (cm, r.stderr[-3000:]))
        self.assertEqual((cm["pushed"], cm["errors"]), (1, 0), (cm, r.stderr[-3000:]))
        self.assertEqual([p["layout"] for p in cm["pushes"]], ["bhnd"])

    def test_30_layers_no_door_sees_are_said(self):
        """A model the monitor sees in part is never silent: timm's ViT-S/16 with six blocks
        whose attention is written out (no door) and six through SDPA: the six pushed at each
        step, the six others counted (unseen_by {'Attention': 6 a forward}); a Llama, eager and
        compiled, reports no module, and compiled it breaks no graph."""
        if importlib.util.find_spec("timm") is None or \
                importlib.util.find_spec("transformers") is None:
            self.skipTest("timm or transformers is not installed")
        out = os.path.join(self.tmp.name, "unseen.pt")
        r = trainer("unseen", self.d.socket, out, "--run", "unseen")
        data = torch.load(out, weights_only=False)
        vit = data["vit"]
        self.assertEqual(vit["unseen_by"], {"Attention": 6 * 2}, (vit, r.stderr[-2000:]))
        self.assertEqual((vit["pushes"], vit["blind"], vit["errors"]), (6 * 2, 0, 0), vit)
        self.assertIn("ran without a call the monitor sees", r.stderr)
        for name in ("llama", "llama-compiled"):
            st = data[name]
            self.assertEqual((st["unseen_by"], st["errors"], st["blind"]), ({}, 0, 0), (name, st))
            self.assertEqual(st["pushes"], 2 * 3, (name, st))
        self.assertEqual(data["graphs"][1], 0, "graph breaks: %s" % (data["graphs"],))

    def test_31_activation_checkpointing_pushes_once(self):
        """A Llama with activation checkpointing: each layer's forward runs again in backward;
        every (step, layer) is pushed once, equal to float64, and the recomputed calls are
        counted, not pushed. Compiled too (checkpointing and torch.compile together): each
        (step, layer) pushed once, nothing failed, skipped or blind."""
        if importlib.util.find_spec("transformers") is None:
            self.skipTest("transformers is not installed")
        data, r = self.monitored("ckpt")
        self.assertEqual(sorted((p["step"], p["layer"]) for p in data["calls"]),
                         [(s, l) for s in range(2) for l in range(3)])
        self.assertEqual(data["recomputed"], 2 * 3, r.stdout)
        self.pushed_values(data, 6)
        cm = data["compiled"]  # compiled: each (step, layer) once, whatever the graph recomputes
        self.assertEqual(sorted(cm["keys"]), [(s, l) for s in range(2) for l in range(3)],
                         (cm, r.stderr[-3000:]))
        self.assertEqual((cm["pushed"], cm["errors"], cm["blind"], cm["skipped_by"]),
                         (6, 0, 0, {}), (cm, r.stderr[-3000:]))

    def test_32_varlen_attn(self):
        """torch.nn.attention.varlen.varlen_attn (PyTorch 2.10 and later), eager and compiled
        (fullgraph), and computed in the process (local_compute): every call pushed once with its
        packed sequences (offsets as CUDA tensors), causal and full, each equal to float64 of its
        sequences; no graph break."""
        if importlib.util.find_spec("torch.nn.attention.varlen") is None:
            self.skipTest("this PyTorch has no torch.nn.attention.varlen")
        for extra in ((), ("--compile",), ("--local",)):
            data, r = self.monitored("varlen", extra)
            self.assertEqual([p["causal"] for p in data["calls"]], [True, False] * 2,
                             r.stderr[-3000:])
            for p in data["calls"]:
                self.assertEqual(p["cu"], [0, 100, 250, 384])
                self.assertNotIn("window", p)
            self.pushed_values(data, 4)
            if "--compile" in extra:
                self.assertEqual(data["graphs"][1], 0, "graph breaks: %s" % (data["graphs"],))

    def compiled_llama(self, extra):
        if importlib.util.find_spec("transformers") is None:
            self.skipTest("transformers is not installed")
        data, r = self.monitored("llama-compiled", extra)
        first, second, third = data["each"]
        # 3 layers: steps 0-1 every step; 10-13 every 2nd (10, 12); step 20
        self.assertEqual([m["pushed"] for m in data["each"]], [6, 6, 3], data["each"])
        self.assertEqual([m["calls"] for m in data["each"]], [6, 12, 3], data["each"])
        self.assertEqual(first["compiled_calls"], 6, first)
        self.assertEqual([m["blind"] for m in data["each"]], [0, 0, 0])
        self.pushed_values(data, 15)
        for p in data["calls"]:
            self.assertIn("mask", p, "a padded batch comes with a mask")
        (g1, b1), (g2, b2), (g3, b3) = data["graphs"]
        self.assertEqual((b1, b2, b3), (0, 0, 0), "graph breaks")
        self.assertEqual((g2, g3), (g1, g1), "leaving and entering the monitor, every=2, "
                         "recompiled: graphs %s" % (data["graphs"],))
        return data

    def test_14_llama_compiled(self):
        """A transformers Llama under torch.compile (default mode), bf16 autocast, padded batch,
        monitor(model=compiled) at the defaults: every call pushed, 0 graph breaks, no
        recompilation when the monitor is left and entered again or every changes, values equal
        float64."""
        self.compiled_llama(())

    def test_15_llama_compiled_fullgraph(self):
        """The same with fullgraph=True, the monitor's hook on the inner module (traced)."""
        self.compiled_llama(("--fullgraph",))

    def test_16_llama_compiled_local(self):
        """The compiled Llama in local mode (the kernel in the trainer's process)."""
        self.compiled_llama(("--local",))

    def test_20_compiled_cuda_graphs_never_silent(self):
        """mode='reduce-overhead' (CUDA graphs): the calls are pushed (where Inductor partitions
        the graphs around the operator) or skipped, counted and said; never neither."""
        if importlib.util.find_spec("transformers") is None:
            self.skipTest("transformers is not installed")
        out = os.path.join(self.tmp.name, "cudagraphs.pt")
        r = trainer("llama-compiled", self.d.socket, out, "--compile-mode", "reduce-overhead",
                    "--run", "cudagraphs")
        data = torch.load(out, weights_only=False)
        for m in data["each"]:
            calls = m["calls"]
            graph = m["skipped_by"].get("graph", 0)
            self.assertGreater(m["pushed"] + graph + m["blind"], 0, (m, r.stderr[-3000:]))
            if m["pushed"] < calls:
                self.assertTrue(graph > 0 or m["blind"] > 0, m)
        if any(m["skipped_by"].get("graph") for m in data["each"]):
            self.assertIn("CUDA graph", r.stderr)
        if OUT:
            with open(os.path.join(OUT, "cudagraphs.json"), "w") as f:
                json.dump(data["each"], f, default=str, indent=1)

    def test_17_flex_imported_by_name(self):
        """flex_attention imported by name (from ... import flex_attention), eager and inside a
        compiled function (fullgraph): every call pushed with its BlockMask, values equal
        float64 of the same mask."""
        if importlib.util.find_spec("torch.nn.attention.flex_attention") is None:
            self.skipTest("this PyTorch has no flex_attention")
        for extra in ((), ("--compile",)):
            data, r = self.monitored("flex-byname", extra)
            doc = data["doc"]
            n = doc.numel()
            i, j = torch.arange(n).view(-1, 1), torch.arange(n).view(1, -1)
            want = (doc.view(-1, 1) == doc.view(1, -1)) & (j <= i)
            for p in data["calls"]:
                self.assertTrue(torch.equal(p["mask"][0, 0].bool(), want), "flex mask")
            self.pushed_values(data, 4)

    def test_18_gptoss_sinks(self):
        """transformers' gpt-oss (sinks, a sliding window on alternate layers) at the defaults:
        every call pushed with its sinks, entropy of the sink-augmented softmax equal float64;
        compiled too."""
        if importlib.util.find_spec("transformers") is None:
            self.skipTest("transformers is not installed")
        try:
            from transformers import GptOssConfig  # noqa: F401
        except ImportError:
            self.skipTest("this transformers has no gpt-oss")
        for extra in ((), ("--compile",)):
            data, r = self.monitored("gptoss", extra)
            for p in data["calls"]:
                self.assertIn("sinks", p)
            self.pushed_values(data, 2 * 2)

    def test_21_stats_on_request(self):
        """Sink mass and distance asked for (stats="all"): every dtype, layout and mask of test_9
        pushed to the daemon and in local mode, a padded Llama under autocast monitored with
        monitor(stats="all") in both modes, and gpt-oss with its sinks: both present on every head
        and equal to float64, whichever kernel ran (the tensor-core kernels' instances that
        compute them). The tests above, which ask for nothing, hold them absent."""
        self.values("inputs-stats", extra=("--cases", "inputs", "--stats", "all"))
        self.values("local-stats", extra=("--cases", "inputs", "--local", "--stats", "all"))
        if importlib.util.find_spec("transformers") is None:
            self.skipTest("transformers is not installed")
        self.llama(("--stats", "all"))
        self.llama(("--local", "--stats", "all"))
        data, r = self.monitored("gptoss", ("--stats", "all"))
        self.pushed_values(data, 2 * 2)

    def qk_clip_check(self, mode, run, extra=()):
        """gpu_trainer's qkclip modes: tau set to the median of step 0's measured max logits,
        the clip applied, the same forward measured again. Layer 0 sees the same input both
        times: every head that was over tau is at tau (2%: bf16 projections), every other head's
        max logit unchanged. Layer 1's input is layer 0's output, which the clip changed, so there
        only the count is checked: each layer's clipped heads are those that were over tau."""
        if importlib.util.find_spec("transformers") is None:
            self.skipTest("transformers is not installed")
        out = os.path.join(self.tmp.name, run + ".pt")
        r = trainer(mode, self.d.socket, out, "--run", run, *extra)
        data = torch.load(out, weights_only=False)
        tau, res = data["tau"], data["results"]
        steps = sorted({st for st, _ in res})
        self.assertEqual(len(steps), 2, sorted(res))
        over, bad = {}, []
        for layer in range(2):
            before = {h["head"]: h["max_logit"] for h in res[(steps[0], layer)]}
            after = {h["head"]: h["max_logit"] for h in res[(steps[1], layer)]}
            self.assertEqual(sorted(before), list(range(8)))
            over[layer] = sum(1 for m in before.values() if m > tau)
            for h, m0 in before.items():
                m1 = after[h]
                if layer > 0:
                    continue
                if m0 > tau:
                    if not abs(m1 - tau) <= 0.02 * tau:
                        bad.append("layer %d head %d: %.4f over tau %.4f, %.4f after the clip"
                                   % (layer, h, m0, tau, m1))
                elif not abs(m1 - m0) <= 1e-6 * abs(m0) + 1e-6:
                    bad.append("layer %d head %d: %.6f under tau, %.6f after the clip"
                               % (layer, h, m0, m1))
        self.assertEqual(bad, [], "\n".join(bad) + "\n" + r.stdout)
        self.assertTrue(0 < over[0] < 8, over)
        self.assertEqual(data["clip"]["clipped_by_layer"], {l: n for l, n in over.items() if n})
        self.assertEqual(data["clipped"], sum(over.values()))
        return data

    def test_22_qk_clip(self):
        """attnstat.torch.qk_clip on a GQA Llama under bf16 autocast (qk_clip_check)."""
        self.qk_clip_check("qkclip", "qkclip")

    def test_27_qk_clip_on_the_device(self):
        """qk_clip's device mode (a client in local mode): each push writes its heads' max logits
        into the clip's CUDA buffers, step() clips from them on the device with no host
        synchronisation; qk_clip_check's outcome on the GQA Llama and the latent-attention
        DeepSeek-V3, and the clips recorded once their values reach the host."""
        for mode in ("qkclip", "qkclip-mla"):
            data = self.qk_clip_check(mode, mode + "-device", ("--local",))
            self.assertTrue(data["clip"]["device"], data["clip"])
            self.assertEqual(data["clip"]["lag"], 0)
            self.assertEqual(data["clip"]["unmeasured_by_layer"], {})
            self.assertEqual(data["clip"]["recorded"], len(data["clip"]["clipped_by_layer"]))

    def test_28_max_logit_out(self):
        """Local mode's max_logit_out: three pushes fold their heads' max logits into one NaN
        buffer, which holds the largest of the three (float64 of each push, 1e-5), and each push
        alone into its own buffer its own; read on the device after local_wait. A host tensor, a
        wrong shape, float32 and stats without the max logit are refused (EINVAL, saying why),
        nothing of them sent: the results are the six pushes'."""
        out = os.path.join(self.tmp.name, "maxout.pt")
        trainer("maxout", self.d.socket, out, "--run", "maxout")
        data = torch.load(out, weights_only=False)
        refs = [reference(dict(q=q, k=data["k"], causal=True)) for q in data["q"]]
        bad = []
        for h in range(data["fold"].shape[0]):
            want = max(r[h][3] for r in refs)
            if not abs(data["fold"][h].item() - want) <= 1e-5 * abs(want):
                bad.append("fold head %d: %r, float64 %r" % (h, data["fold"][h].item(), want))
            for i, r in enumerate(refs):
                got = data["own"][i][h].item()
                if not abs(got - r[h][3]) <= 1e-5 * abs(r[h][3]):
                    bad.append("push %d head %d: %r, float64 %r" % (i, h, got, r[h][3]))
        self.assertEqual(bad, [], "\n".join(bad))
        says = {"host": "CUDA torch.float64 tensor", "shape": "must be [4]",
                "float32": "CUDA torch.float64 tensor", "stats": "does not ask for the max logit"}
        for name, needle in says.items():
            got = data["refused"][name]
            self.assertIsNotNone(got, "%s was not refused" % name)
            self.assertEqual(got[0], data["EINVAL"], got)
            self.assertIn(needle, got[1])
        self.assertEqual(sorted(data["results"]), [(s, i) for s in (0, 1) for i in range(3)])
        self.assertEqual(data["stats"]["acked"], 6, data["stats"])

    def test_24_qk_clip_latent_attention(self):
        """attnstat.torch.qk_clip on a transformers DeepSeek-V3 (multi-head latent attention, the
        rotary key shared by every head) under bf16 autocast (qk_clip_check): q_C and k_C by
        sqrt(gamma), q_R by gamma, so each clipped head's logits come to tau and no other's move."""
        if importlib.util.find_spec("transformers") is None:
            self.skipTest("transformers is not installed")
        try:
            from transformers import DeepseekV3Config  # noqa: F401
        except ImportError:
            self.skipTest("this transformers has no DeepSeek-V3")
        self.qk_clip_check("qkclip-mla", "qkclip-mla")

    def test_25_qk_clip_fused_projection(self):
        """attnstat.torch.qk_clip on a transformers Phi-3 (one qkv_proj: query, key and value
        rows in one weight; GQA 8/2) under bf16 autocast (qk_clip_check)."""
        if importlib.util.find_spec("transformers") is None:
            self.skipTest("transformers is not installed")
        self.qk_clip_check("qkclip-fused", "qkclip-fused")

    def tensor_parallel_run(self, mode, run, gpus=2, extra=(), nproc=2):
        """gpu_trainer's `mode` in nproc processes under torch.distributed.run (run name `run`),
        each on a GPU of its own (gpus=2) or on the CPU (gpus=0): its completed process and each
        rank's saved output; skips without the GPUs or transformers."""
        if torch.cuda.device_count() < gpus:
            self.skipTest("one GPU: tensor parallelism needs two")
        if importlib.util.find_spec("transformers") is None:
            self.skipTest("transformers is not installed")
        out = os.path.join(self.tmp.name, run)
        e = dict(os.environ, PYTHONUNBUFFERED="1", ATTNSTAT_TEST_RUN=run)
        r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                            "--nproc_per_node", str(nproc), TRAINER, mode, self.d.socket, out,
                            *extra],
                           env=e, capture_output=True, text=True, timeout=300)
        self.assertEqual(r.returncode, 0, r.stdout[-3000:] + r.stderr[-5000:])
        return r, [torch.load("%s.%d.pt" % (out, i), weights_only=False) for i in range(nproc)]

    def test_33_fsdp_is_data_parallelism(self):
        """FSDP2 (fully_shard on every decoder layer and the model) in two processes (the CPU,
        gloo), the mesh named as torchtitan names it and unnamed: layout='auto' sees two
        data-parallel replicas, not tensor parallelism over them; every call pushed with all 8
        heads, none skipped."""
        if importlib.util.find_spec("torch.distributed.fsdp") is None:
            self.skipTest("this PyTorch has no torch.distributed.fsdp")
        for extra, run in (((), "fsdp"), (("--unnamed",), "fsdpu")):
            r, ranks = self.tensor_parallel_run("fsdp", run, gpus=0, extra=extra)
            for d in ranks:
                lay = d["monitor"]["layout"]
                self.assertEqual((lay.get("tp_size", 1), lay["dp_rank"], lay["dp_size"]),
                                 (1, d["rank"], 2), (extra, lay))
                self.assertEqual((d["monitor"]["pushed"], d["monitor"]["skipped"]), (2, 0),
                                 d["monitor"])
                self.assertEqual([p["q"].shape[1] for p in d["pushes"]], [8, 8])

    def test_34_hsdp_is_data_parallelism(self):
        """HSDP (fully_shard on a 2 x 2 mesh: replicas over the first dimension, shards over the
        second) in four processes (the CPU, gloo), the mesh named as torchtitan names it and for
        nothing: layout='auto' sees four data-parallel replicas, not tensor parallelism over
        either dimension; every call pushed with all 8 heads. (An unnamed 2-D mesh is not a case:
        fully_shard refuses it, "Please init the 2D mesh for HSDP with mesh_dim_names specified",
        PyTorch 2.11.)"""
        if importlib.util.find_spec("torch.distributed.fsdp") is None:
            self.skipTest("this PyTorch has no torch.distributed.fsdp")
        for extra, run in ((("--hsdp",), "hsdp"), (("--hsdp", "--names", "inter,intra"), "hsdpn")):
            r, ranks = self.tensor_parallel_run("fsdp", run, gpus=0, extra=extra, nproc=4)
            self.assertEqual(sorted(d["rank"] for d in ranks), [0, 1, 2, 3])
            for d in ranks:
                lay = d["monitor"]["layout"]
                self.assertEqual((lay.get("tp_size", 1), lay["dp_rank"], lay["dp_size"]),
                                 (1, d["rank"], 4), (extra, lay))
                self.assertEqual((d["monitor"]["pushed"], d["monitor"]["skipped"]), (2, 0),
                                 (extra, d["monitor"]))
                self.assertEqual([p["q"].shape[1] for p in d["pushes"]], [8, 8], extra)

    @two_gpus
    def test_23_qk_clip_tensor_parallel(self):
        """attnstat.torch.qk_clip on a 2-way tensor-parallel GQA Llama (DTensor, ColwiseParallel
        q/k): each rank clips its own heads on its own shard. Layer 0 (the same input both
        steps): every head over the common tau comes to tau (2%), every other one stays; each
        layer's clip is in the run's history with global head numbers (rank 1's as 8..15)."""
        r, ranks = self.tensor_parallel_run("qkclip-tp", "qktp")
        tau = ranks[0]["tau"]
        self.assertEqual(ranks[1]["tau"], tau)
        bad, over = [], {}
        for d in ranks:
            res = d["results"]
            steps = sorted({st for st, _ in res})
            self.assertEqual(len(steps), 2, sorted(res))
            for layer in range(2):
                before = {h["head"]: h["max_logit"] for h in res[(steps[0], layer)]}
                after = {h["head"]: h["max_logit"] for h in res[(steps[1], layer)]}
                self.assertEqual(sorted(before), list(range(8)))
                over[(d["rank"], layer)] = sorted(h + 8 * d["rank"] for h, m in before.items()
                                                  if m > tau)
                if layer > 0:
                    continue
                for h, m0 in before.items():
                    m1 = after[h]
                    if m0 > tau and not abs(m1 - tau) <= 0.02 * tau:
                        bad.append("rank %d head %d: %.4f over tau %.4f, %.4f after"
                                   % (d["rank"], h, m0, tau, m1))
                    elif m0 <= tau and not abs(m1 - m0) <= 1e-6 * abs(m0) + 1e-6:
                        bad.append("rank %d head %d: %.6f under tau, %.6f after"
                                   % (d["rank"], h, m0, m1))
            self.assertEqual(d["clip"]["record_errors"], 0, d["clip"])
        self.assertEqual(bad, [], "\n".join(bad) + "\n" + r.stdout[-2000:])
        self.assertTrue(over[(0, 0)] and over[(1, 0)], over)  # each rank clips some heads
        import sqlite3
        want = sum(1 for v in over.values() if v)
        deadline = time.monotonic() + 30
        while True:
            with sqlite3.connect(self.d.db) as db:
                rows = db.execute("SELECT interventions.rank, layer, heads, kind FROM "
                                  "interventions JOIN runs ON runs.id = run_id WHERE runs.name = "
                                  "'qktp' ORDER BY interventions.rank, layer").fetchall()
            if len(rows) >= want or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        got = {(rk, l): json.loads(h) for rk, l, h, k in rows}
        self.assertEqual(got, {key: v for key, v in over.items() if v})

    @two_gpus
    def test_19_tensor_parallel_two_gpus(self):
        """A Llama sharded with DTensor (ColwiseParallel q/k/v, RowwiseParallel o, mesh 'tp') on
        two GPUs, monitor at layout='auto': every global head stored once, rank 1's heads as
        8..15, values equal float64 of what each rank pushed."""
        r, ranks = self.tensor_parallel_run("tp", "tp")
        local = None
        for d in ranks:
            self.assertEqual((d["monitor"]["layout"]["tp_rank"], d["monitor"]["layout"]["tp_size"]),
                             (d["rank"], 2))
            self.assertEqual(d["monitor"]["pushed"], 2, d["monitor"])
            local = d["pushes"][0]["q"].shape[1]
        self.assertEqual(local, 8)
        import sqlite3
        want = 2 * 16
        deadline = time.monotonic() + 60
        while True:
            with sqlite3.connect(self.d.db) as db:
                rows = db.execute("SELECT layer, head, rows, entropy_mean, max_logit, sink_mass, "
                                  "distance FROM samples "
                                  "JOIN runs ON runs.id = run_id WHERE runs.name = 'tp' "
                                  "ORDER BY layer, head").fetchall()
            if len(rows) >= want or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        self.assertEqual([(l, h) for l, h, *_ in rows],
                         [(l, h) for l in range(2) for h in range(16)])
        stored = {(l, h): (n, e, m, sm, dd) for l, h, n, e, m, sm, dd in rows}
        bad = []  # sink mass and distance: NULL where the GPU path does not compute them
        for d in ranks:
            for p in d["pushes"]:
                for hh, (mean, mn, mxe, ml, n, sm, dd) in reference(p).items():
                    g = stored[(p["layer"], d["rank"] * local + hh)]
                    if g[0] != n or abs(g[1] - mean) > 1e-4 * abs(mean) + 1e-6 or \
                            abs(g[2] - ml) > 1e-5 * abs(ml) + 1e-5 or \
                            (g[3] is not None and not abs(g[3] - sm) <= 1e-4) or \
                            (g[4] is not None and not abs(g[4] - dd) <= 1e-4 * abs(dd) + 1e-4):
                        bad.append("rank %d layer %d head %d: stored %s, float64 %s"
                                   % (d["rank"], p["layer"], hh, g, (n, mean, ml, sm, dd)))
        self.assertEqual(bad, [], "\n".join(bad))


if __name__ == "__main__":
    unittest.main(verbosity=2)
