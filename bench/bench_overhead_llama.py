"""bench_overhead_llama.py — what monitoring costs a real training step, at attnstatd's defaults.

    python3 bench/bench_overhead_llama.py [--socket PATH] [--layers 16] [--batch 4] [--seq 2048]
                                          [--block 10] [--rounds 6] [--modes off,every10,every1,...]
                                          [--compile]

A Llama-architecture model of about 1.1 B parameters built from a config with the transformers
library (Llama-3.2-1B's shape: hidden 2048, 16 layers, 32 query / 8 key-value heads, rotary
embeddings, RMSNorm, SwiGLU; random weights, nothing downloaded) trains with AdamW under bf16
autocast on a padded batch (attention_mask with padding at the end of every sequence but the
first, as fine-tuning batches are): transformers' sdpa attention hands q and k to
scaled_dot_product_attention as float32 with a boolean [B, 1, N, N] mask. The monitor is
attnstat.torch.monitor(client, model=model, ...) with the model's own doors.

Modes, in blocks of --block steps, the order shuffled every round so that clock or load drift hits
all alike: off; every10 (every 10th step); every1 (every step); every1-s8 (every step, every 8th
query row); MODE:alt pushes to a second daemon started with --alt-daemon-args; MODE:local
computes in this process (Client(local_compute=True)) and sends the daemon the results. Each
monitored mode starts with the monitor's state reset (a new monitor is entered for every block,
as a job that switches monitoring on and off would). --compile: the model under torch.compile
(default mode), monitored through the compiled graph's operator; "off" is then the compiled model
with the doors installed and no monitor active, and a block of "pristine" steps, timed before any
monitor was ever entered (so before the doors existed), is printed beside it; graphs compiled and
graph breaks are counted from the first monitored step on (recompilations show there). Prints one
JSON line per
mode (median and mean step time, overhead against off, and what the monitor and client counted:
calls, pushed, skipped, rejected, dropped) and a table. The daemon (--daemon, default the build
tree's) is started with its defaults on a private socket and database unless --socket names a
running one. Needs a CUDA GPU, PyTorch and transformers.
"""
import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "client", "python"))


def start_daemon(path, workdir, extra):
    sock, db = os.path.join(workdir, "d.sock"), os.path.join(workdir, "d.db")
    log = open(os.path.join(workdir, "attnstatd.log"), "w")
    proc = subprocess.Popen([path, "--socket", sock, "--db", db] + extra, stdout=log,
                            stderr=subprocess.STDOUT)
    for _ in range(400):
        if os.path.exists(sock):
            return proc, sock, db
        if proc.poll() is not None:
            break
        time.sleep(0.05)
    raise RuntimeError("attnstatd did not start; see %s" % log.name)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--socket", default=None)
    ap.add_argument("--daemon", default=os.path.join(ROOT, "build", "daemon", "attnstatd"))
    ap.add_argument("--daemon-args", default="",
                    help="settings for the daemon this bench starts (default: none, its defaults)")
    ap.add_argument("--alt-daemon-args", default=None,
                    help="a second daemon with these settings: modes named MODE:alt push to it "
                         "(both daemons' figures side by side in one run)")
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--block", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--warmup", type=int, default=8)
    ap.add_argument("--modes", default="off,every10,every1,every1-s8")
    ap.add_argument("--impl", default="sdpa")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--compile", action="store_true", help="the model under torch.compile")
    a = ap.parse_args()

    import torch
    import transformers
    from transformers import LlamaConfig, LlamaForCausalLM
    import attnstat
    import attnstat.torch as at

    torch.manual_seed(a.seed)
    cfg = LlamaConfig(vocab_size=32000, hidden_size=2048, intermediate_size=8192,
                      num_hidden_layers=a.layers, num_attention_heads=32, num_key_value_heads=8,
                      max_position_embeddings=max(4096, a.seq), rms_norm_eps=1e-5,
                      tie_word_embeddings=False, attn_implementation=a.impl)
    model = LlamaForCausalLM(cfg).cuda()
    nparams = sum(p.numel() for p in model.parameters())
    fwd = torch.compile(model) if a.compile else model
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    gen = torch.Generator(device="cuda").manual_seed(a.seed)
    ids = torch.randint(0, cfg.vocab_size, (8, a.batch, a.seq), device="cuda", generator=gen)
    mask = torch.ones(a.batch, a.seq, dtype=torch.long, device="cuda")
    for b in range(1, a.batch):
        mask[b, a.seq - (a.seq // 8) * b:] = 0  # padding at the end of every sequence but the first

    def step(i):
        x = ids[i % ids.shape[0]]
        with torch.autocast("cuda", dtype=torch.bfloat16):
            out = fwd(input_ids=x, attention_mask=mask, labels=x)
        out.loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    workdir = tempfile.mkdtemp(prefix="attnstat-bench-")
    proc = None
    sock = a.socket
    if sock is None:
        proc, sock, _ = start_daemon(a.daemon, workdir, a.daemon_args.split())
    client = attnstat.Client(socket=sock, run="bench-llama", rank=0)
    clients = [client]
    alt, alt_proc, altdir = None, None, None
    if a.alt_daemon_args is not None:
        altdir = tempfile.mkdtemp(prefix="attnstat-bench-alt-")
        alt_proc, alt_sock, _ = start_daemon(a.daemon, altdir, a.alt_daemon_args.split())
        alt = attnstat.Client(socket=alt_sock, run="bench-llama-alt", rank=0)
        clients.append(alt)
    modes = a.modes.split(",")
    local = None
    if any(m.endswith(":local") for m in modes):
        local = attnstat.Client(socket=sock, run="bench-llama-local", rank=0, local_compute=True)
        clients.append(local)

    def monitor_for(mode):
        if mode == "off":
            return None
        name, _, where = mode.partition(":")
        every = 10 if name.startswith("every10") else 1
        kw = {}
        if name.endswith("-s8"):
            kw["sample_every"] = 8
        c = alt if where == "alt" else local if where == "local" else client
        return at.monitor(c, every=every, model=fwd, **kw)

    def timed(n, i0):
        out = []
        for i in range(n):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            step(i0 + i)
            torch.cuda.synchronize()
            out.append(time.perf_counter() - t0)
        return out

    # warm-up: kernels, the allocator (and compilation), the daemon's worker and its buffers
    for i in range(a.warmup):
        step(i)
    pristine = timed(a.block * 2, 0) if a.compile else []
    from torch._dynamo.utils import counters

    def graphs():
        return (int(counters["stats"]["unique_graphs"]),
                int(sum(counters["graph_break"].values())))
    for c in clients:
        with at.monitor(c, every=1, model=fwd):
            for i in range(3):
                step(i)
        c.flush(timeout_s=120)
    torch.cuda.synchronize()
    graphs0 = graphs()

    times = {m: [] for m in modes}
    cpu = {m: [] for m in modes}  # until step() returns: how far the CPU runs ahead of the GPU
    counts = {m: {"calls": 0, "pushed": 0, "skipped": 0, "rejected": 0, "dropped": 0,
                  "errors": 0} for m in modes}
    rnd = random.Random(a.seed)
    it = 0
    for _ in range(a.rounds):
        order = list(modes)
        rnd.shuffle(order)
        for m in order:
            mon = monitor_for(m)
            if mon is not None:
                mon.__enter__()
            try:
                for _ in range(a.block):
                    torch.cuda.synchronize()
                    t0 = time.perf_counter()
                    step(it)
                    cpu[m].append(time.perf_counter() - t0)
                    torch.cuda.synchronize()
                    times[m].append(time.perf_counter() - t0)
                    it += 1
                if mon is not None:
                    mon.client.flush(timeout_s=120)  # every push of the block acknowledged
            finally:
                if mon is not None:
                    mon.__exit__(None, None, None)
                    for k in counts[m]:
                        counts[m][k] += getattr(mon, k)
            for c in clients:
                c.poll(0)
    graphs1 = graphs()
    for c in clients:
        c.flush(timeout_s=120)
    st = client.stats()
    for c in clients:
        c.close()
    for p, d in ((proc, workdir), (alt_proc, altdir if alt_proc else None)):
        if p is not None:
            p.terminate()
            p.wait(30)
            with open(os.path.join(d, "attnstatd.log")) as f:  # the GPU worker's batching
                for line in f:
                    if "pipelined" in line or "waited for the trainer" in line:
                        print("# attnstatd%s: %s" % (" (alt)" if d != workdir else "",
                                                     line.strip().split("] ", 1)[-1]))

    def med(v):
        v = sorted(v)
        return v[len(v) // 2]
    base_med, base_mean = med(times["off"]), sum(times["off"]) / len(times["off"])
    dev = torch.cuda.get_device_name()
    print("# %s, torch %s, transformers %s, %.2f B parameters, B=%d N=%d, %d steps per mode, "
          "attnstatd %s, MPS %s, %s"
          % (dev, torch.__version__, transformers.__version__, nparams / 1e9, a.batch, a.seq,
             len(times["off"]), a.daemon_args or "defaults",
             "on" if os.environ.get("CUDA_MPS_PIPE_DIRECTORY") else "off",
             "torch.compile (default mode)" if a.compile else "eager"))
    if a.compile:
        print("# graphs compiled %d, graph breaks %d after the first monitor; during the %d "
              "monitored blocks: %d more graphs, %d more breaks"
              % (graphs0[0], graphs0[1], a.rounds * (len(modes) - 1), graphs1[0] - graphs0[0],
                 graphs1[1] - graphs0[1]))
        print(json.dumps({"graphs_before": graphs0, "graphs_after": graphs1,
                          "pristine_median_ms": 1e3 * med(pristine),
                          "pristine_mean_ms": 1e3 * sum(pristine) / len(pristine)}))
        print("%-16s %10.2f %10.2f  (compiled, before any monitor: no doors installed)"
              % ("pristine", 1e3 * med(pristine), 1e3 * sum(pristine) / len(pristine)))
    if a.alt_daemon_args is not None:
        print("# :alt = a second attnstatd with %s" % a.alt_daemon_args)
    print("%-16s %10s %10s %9s %9s  %s" % ("mode", "median ms", "mean ms", "d median", "d mean",
                                            "monitor"))
    for m in modes:
        v = times[m]
        md, mn = med(v), sum(v) / len(v)
        row = {"mode": m, "median_ms": 1e3 * md, "mean_ms": 1e3 * mn,
               "overhead_median_pct": 100 * (md / base_med - 1),
               "overhead_mean_pct": 100 * (mn / base_mean - 1), "steps": len(v),
               "cpu_median_ms": 1e3 * med(cpu[m]),
               "monitor": counts[m]}
        print(json.dumps(row))
        print("%-16s %10.2f %10.2f %8.2f%% %8.2f%%  %s" % (m, 1e3 * md, 1e3 * mn,
                                                         row["overhead_median_pct"],
                                                         row["overhead_mean_pct"],
                                                         counts[m] if m != "off" else ""))
    print(json.dumps({"client": {k: st[k] for k in ("pushed", "acked", "dropped_local",
                                                    "dropped_daemon", "rejected", "last_error")}}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
