#!/usr/bin/env python3
"""A stand-in training process for tests/gpu/test_gpu.py: pushes CUDA tensors to attnstatd through
the Python binding, in a process of its own.

    gpu_trainer.py values SOCKET OUT.pt [--run NAME] [--seed N] [--device N]
        pushes the fixed cases (make_cases) with want_results, waits for every result, saves the
        tensors (host copies), the per-head results and the client's counters to OUT.pt
    gpu_trainer.py loop SOCKET READY_FILE [--run NAME]
        pushes forever (zero-copy), touching READY_FILE once 20 pushes were acknowledged
    gpu_trainer.py memory SOCKET OUT.json
        a freed 4 GiB allocation the daemon read comes back to the device; a push inside a CUDA
        graph capture is dropped and the capture still replays
    gpu_trainer.py nosync SOCKET OUT.json [--pushes N]
        checks that a push neither synchronises the device nor waits (a long kernel is still
        running on the stream when it returns), then times attnstat_push_ex's CPU time
"""
import argparse
import ctypes
import json
import os
import statistics
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "client", "python"))
import attnstat  # noqa: E402
from attnstat import _lib, _tensor  # noqa: E402


def make_cases(seed, dev):
    """Random attention problems covering the paths: GQA, strided fused-QKV views, f32, packed
    sequences, near-one-hot rows with large logits. Each: dict(q, k, v?, causal, cu?)."""
    g = torch.Generator().manual_seed(seed)
    cases = []
    temp = torch.linspace(0.5, 4.0, 8).view(1, 8, 1, 1)
    q = torch.randn(2, 8, 256, 64, generator=g) * temp
    k = torch.randn(2, 2, 256, 64, generator=g)
    cases.append(dict(name="bf16 gqa causal", q=q.to(dev, torch.bfloat16),
                      k=k.to(dev, torch.bfloat16), causal=True))
    qkv = (torch.randn(2, 192, 3, 4, 128, generator=g) * 0.6).to(dev, torch.float16)
    cases.append(dict(name="f16 fused qkv views", q=qkv[:, :, 0].transpose(1, 2),
                      k=qkv[:, :, 1].transpose(1, 2), v=qkv[:, :, 2].transpose(1, 2),
                      causal=False))
    q = torch.randn(1, 4, 64, 32, generator=g) * 2
    k = torch.randn(1, 4, 200, 32, generator=g)
    cases.append(dict(name="f32 nq<nk causal", q=q.to(dev), k=k.to(dev), causal=True))
    q = torch.randn(1, 4, 300, 64, generator=g) * 2
    k = torch.randn(1, 4, 300, 64, generator=g)
    cases.append(dict(name="bf16 packed", q=q.to(dev, torch.bfloat16),
                      k=k.to(dev, torch.bfloat16), causal=True, cu=[0, 100, 300]))
    q = torch.randn(1, 4, 128, 64, generator=g) * 6
    k = torch.randn(1, 4, 128, 64, generator=g) * 3
    cases.append(dict(name="bf16 large logits", q=q.to(dev, torch.bfloat16),
                      k=k.to(dev, torch.bfloat16), causal=True))
    return cases


def run_values(args):
    dev = torch.device("cuda", args.device)
    torch.cuda.set_device(dev)
    torch.cuda.init()
    client = attnstat.Client(socket=args.socket, run=args.run, rank=0)
    results = {}
    client.on_result(lambda seq, step, layer, heads: results.__setitem__(step, heads))
    cases = make_cases(args.seed, dev)
    for i, c in enumerate(cases):
        cu = c.get("cu")
        ok = client.push(i, 0, c["q"], c["k"], v=c.get("v"), causal=c["causal"], want_results=True,
                         cu_seqlens_q=cu, cu_seqlens_k=cu)
        if not ok:
            raise SystemExit("push %d (%s) was dropped: %s" % (i, c["name"], client.stats()))
    held_after_push = client.stats()["held"]
    if not client.flush(timeout_s=60):
        raise SystemExit("flush timed out: %s" % client.stats())
    st = client.stats()
    out = dict(cases=[{k: (v.detach().cpu() if torch.is_tensor(v) else v) for k, v in c.items()}
                      for c in cases], results=results, stats=st, held_after_push=held_after_push,
               devices=client.devices)
    torch.save(out, args.out)
    client.close()
    print(json.dumps({k: st[k] for k in ("pushed", "acked", "rejected", "cuda_zero_copy",
                                         "cuda_staged", "held", "releases_pending")}))


def run_loop(args):
    dev = torch.device("cuda", 0)
    client = attnstat.Client(socket=args.socket, run=args.run, rank=1, devices=[0])
    cases = make_cases(1, dev)
    i = 0
    while True:
        c = cases[i % 2]
        client.push(i, i % 2, c["q"], c["k"], causal=c["causal"])
        # keep the stream and the daemon busy, as training does
        c["q"].mul_(1.0)
        client.poll(0)
        if i == 20:
            client.flush(timeout_s=30)
            with open(args.out, "w") as f:
                f.write(json.dumps(client.stats()))
        i += 1
        time.sleep(0.002)


def run_nosync(args):
    dev = torch.device("cuda", 0)
    torch.cuda.set_device(dev)
    client = attnstat.Client(socket=args.socket, run="nosync", rank=0, devices=[0])
    q = torch.randn(4, 16, 1024, 64, device=dev, dtype=torch.bfloat16)
    k = torch.randn(4, 16, 1024, 64, device=dev, dtype=torch.bfloat16)
    client.push(0, 0, q, k, causal=True)  # first push: exports, events, worker start-up
    client.flush(timeout_s=30)
    stream = torch.cuda.current_stream()
    res = {}
    # 1. a push behind a long kernel returns at once, and the kernel is still running after it
    torch.cuda._sleep(2_000_000_000)  # ~1 s of GPU time on the current stream
    t0 = time.perf_counter()
    ok = client.push(1, 0, q, k, causal=True)
    res["push_wall_us_behind_long_kernel"] = (time.perf_counter() - t0) * 1e6
    res["stream_busy_after_push"] = not stream.query()
    res["push_sent"] = ok
    client.flush(timeout_s=60)
    # 2. CPU time of attnstat_push_ex itself (ctypes call, prepared structs), zero-copy path
    lib = client._lib
    c = client._c
    opts = _lib.PushOpts()
    lib.attnstat_push_opts_init(ctypes.byref(opts))
    opts.causal = 1
    opts.cuda_stream = stream.cuda_stream or None
    tq, tk = _lib.Tensor(), _lib.Tensor()
    qs = torch.randn(1, 8, 128, 64, device=dev, dtype=torch.bfloat16)
    ks = torch.randn(1, 8, 128, 64, device=dev, dtype=torch.bfloat16)
    _tensor.describe(qs).fill(tq)
    _tensor.describe(ks).fill(tk)
    seq = ctypes.c_uint64()
    push_ex = lib.attnstat_push_ex
    ro, rq, rk, rs = ctypes.byref(opts), ctypes.byref(tq), ctypes.byref(tk), ctypes.byref(seq)
    cpu_ns, wall_ns, codes = [], [], {}
    torch.cuda._sleep(200_000_000)  # the stream stays busy while timing: nothing may wait for it
    for i in range(args.pushes):
        opts.step = 1000 + i
        w0 = time.perf_counter_ns()
        t0 = time.thread_time_ns()
        rc = push_ex(c, ro, rq, rk, None, rs)
        t1 = time.thread_time_ns()
        w1 = time.perf_counter_ns()
        cpu_ns.append(t1 - t0)
        wall_ns.append(w1 - w0)
        codes[rc] = codes.get(rc, 0) + 1
        if i % 16 == 15:
            client.flush(timeout_s=30)  # not timed: keeps the daemon's per-client queue open
    # an empty call of the same shape, to subtract ctypes' own cost
    null_ns = []
    ver = lib.attnstat_version
    for _ in range(args.pushes):
        t0 = time.thread_time_ns()
        ver()
        null_ns.append(time.thread_time_ns() - t0)
    client.flush(timeout_s=60)
    cpu_ns.sort()
    wall_ns.sort()

    def pct(a, p):
        return a[min(len(a) - 1, int(p * len(a)))] / 1e3
    res.update(push_cpu_us_p50=pct(cpu_ns, 0.5), push_cpu_us_p99=pct(cpu_ns, 0.99),
               push_wall_us_p50=pct(wall_ns, 0.5), push_wall_us_p99=pct(wall_ns, 0.99),
               ctypes_call_us_p50=statistics.median(null_ns) / 1e3, pushes=args.pushes,
               codes={str(k): v for k, v in codes.items()}, stats=client.stats())
    # 3. the same through Client.push (Python binding: description of torch tensors included)
    py_ns = []
    for i in range(min(args.pushes, 500)):
        t0 = time.thread_time_ns()
        client.push(5000 + i, 1, qs, ks, causal=True)
        py_ns.append(time.thread_time_ns() - t0)
        if i % 16 == 15:
            client.flush(timeout_s=30)
    py_ns.sort()
    res.update(client_push_cpu_us_p50=pct(py_ns, 0.5), client_push_cpu_us_p99=pct(py_ns, 0.99))
    client.flush(timeout_s=60)
    client.close()
    with open(args.out, "w") as f:
        json.dump(res, f, indent=1)
    print(json.dumps({k: v for k, v in res.items() if k != "stats"}))


def run_memory(args):
    """Memory the trainer frees comes back to the device once the daemon is done with it, and a
    push inside a CUDA graph capture is dropped without breaking the capture."""
    dev = torch.device("cuda", 0)
    torch.cuda.set_device(dev)
    torch.cuda.init()
    client = attnstat.Client(socket=args.socket, run="memory", rank=0, devices=[0])
    res = {}
    # warm-up: the daemon's worker and context for this device exist before the measurement
    w = torch.randn(1, 2, 64, 64, device=dev, dtype=torch.bfloat16)
    client.push(100, 0, w, w, causal=True)
    client.flush(timeout_s=60)
    torch.cuda.synchronize()
    time.sleep(0.3)
    free0 = torch.cuda.mem_get_info()[0]
    size = 4 << 30
    block = torch.empty(size // 2, dtype=torch.bfloat16, device=dev)  # one 4 GiB allocation
    block.normal_()
    q = block[: 8 * 1024 * 64].view(1, 8, 1024, 64)
    k = block[-8 * 1024 * 64:].view(1, 8, 1024, 64)
    res["push_sent"] = client.push(0, 0, q, k, causal=True)
    res["flushed"] = client.flush(timeout_s=60)
    res["acked"] = client.stats()["acked"] - 1
    del q, k, block
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    time.sleep(0.5)
    free1 = torch.cuda.mem_get_info()[0]
    res["free_before_gib"] = free0 / 2**30
    res["free_after_gib"] = free1 / 2**30
    res["memory_returned"] = free1 >= free0 - (256 << 20)
    # a push from inside a graph capture: dropped, and the captured graph still replays
    x = torch.randn(1, 4, 256, 64, device=dev, dtype=torch.bfloat16)
    y = torch.zeros_like(x)
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        y.copy_(x * 2)  # warm-up outside the capture
    torch.cuda.current_stream().wait_stream(s)
    with torch.cuda.graph(g):
        y.copy_(x * 2)
        res["push_in_capture"] = client.push(1, 0, x, x, causal=True)
    x.fill_(1.5)
    g.replay()
    torch.cuda.synchronize()
    res["replay_ok"] = bool((y == 3.0).all().item())
    st = client.stats()
    res["dropped_local"] = st["dropped_local"]
    res["last_error"] = st.get("last_error", "")
    client.close()
    with open(args.out, "w") as f:
        json.dump(res, f, indent=1)
    print(json.dumps(res))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=("values", "loop", "nosync", "memory"))
    ap.add_argument("socket")
    ap.add_argument("out")
    ap.add_argument("--run", default="gpu-test")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", type=int, default=0, help="values: the CUDA device to push from")
    ap.add_argument("--pushes", type=int, default=2000)
    args = ap.parse_args()
    {"values": run_values, "loop": run_loop, "nosync": run_nosync,
     "memory": run_memory}[args.mode](args)


if __name__ == "__main__":
    main()
