#!/usr/bin/env python3
"""A small GPT in plain PyTorch, trained on synthetic data, with attnstat monitoring its attention.

    python3 examples/gpt.py --socket /tmp/a.sock --run healthy              # lr 6e-4, warm-up 100
    python3 examples/gpt.py --socket /tmp/a.sock --run collapse --lr 2e-2 --warmup 0

The model calls torch.nn.functional.scaled_dot_product_attention and knows nothing of attnstat:
attnstat.torch.monitor intercepts the calls (layer = call index within the forward pass) and pushes
Q and K of every --every-th step to attnstatd, which computes each head's attention entropy and max
logit on the GPU and raises alerts. With --bench, the script instead measures the step time with
monitoring off, every 10th step and every step, in interleaved blocks of 30 steps (shuffled order
each round) in one process, and prints one JSON line (median, mean, 10%-trimmed mean).

The data: sequences from a random sparse Markov chain over --vocab tokens (each token has 4 likely
successors), so attention has something to learn and the loss has a known floor.
"""
import argparse
import json
import math
import os
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "client", "python"))


class Block(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d, bias=False)
        self.proj = nn.Linear(d, d, bias=False)
        self.ln2 = nn.LayerNorm(d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d, bias=False), nn.GELU(), nn.Linear(4 * d, d, bias=False))

    def forward(self, x):
        b, n, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=-1)
        # [B, N, H, Dh] -> [B, H, N, Dh]: views, no copies (attnstat takes the strides as they are)
        q = q.view(b, n, self.heads, d // self.heads).transpose(1, 2)
        k = k.view(b, n, self.heads, d // self.heads).transpose(1, 2)
        v = v.view(b, n, self.heads, d // self.heads).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, n, d))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, vocab, d, heads, layers, n_ctx):
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Embedding(n_ctx, d)
        self.blocks = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.ln = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)

    def forward(self, idx):
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.ln(x))


def markov_chain(vocab, gen):
    """A transition matrix where each token has 4 likely successors (90% of the mass)."""
    p = torch.full((vocab, vocab), 0.1 / (vocab - 4))
    for t in range(vocab):
        succ = torch.randperm(vocab, generator=gen)[:4]
        p[t, succ] = 0.9 / 4
    return p / p.sum(dim=1, keepdim=True)


def batches(p, batch, n, device, gen):
    vocab = p.shape[0]
    p = p.to(device)
    while True:
        x = torch.empty(batch, n + 1, dtype=torch.long, device=device)
        x[:, 0] = torch.randint(vocab, (batch,), device=device)
        for t in range(1, n + 1):
            x[:, t] = torch.multinomial(p[x[:, t - 1]], 1).squeeze(1)
        yield x[:, :-1], x[:, 1:]


def pregenerate(p, batch, n, device, count, seed):
    gen = torch.Generator().manual_seed(seed)
    it = batches(p, batch, n, device, gen)
    return [next(it) for _ in range(count)]


def lr_at(step, base, warmup, total):
    if warmup > 0 and step < warmup:
        return base * (step + 1) / warmup
    return base * 0.5 * (1 + math.cos(math.pi * min(1.0, step / max(1, total))))


def train(args, model, opt, data, steps, mon=None, start=0):
    """Runs `steps` optimiser steps; returns (losses, per-step seconds)."""
    times, losses = [], []
    for i in range(steps):
        s = start + i
        for g in opt.param_groups:
            g["lr"] = lr_at(s, args.lr, args.warmup, args.steps)
        x, y = data[s % len(data)]
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(x)
            loss = F.cross_entropy(logits.float().view(-1, logits.shape[-1]), y.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if args.clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
        opt.step()
        if mon is not None:
            mon.step()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
        losses.append(loss.item())
        if args.verbose and (s % 50 == 0 or s == args.steps - 1):
            print("step %4d  loss %.4f  lr %.2e  %.2f ms" % (s, losses[-1], opt.param_groups[0]["lr"],
                                                         1e3 * times[-1]), flush=True)
    return losses, times


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--socket", default=None, help="attnstatd socket (default: the daemon's default)")
    ap.add_argument("--run", default="gpt", help="run name recorded by the daemon")
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--lr", type=float, default=6e-4)
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--clip", type=float, default=1.0, help="gradient clipping (0: off)")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--ctx", type=int, default=256)
    ap.add_argument("--vocab", type=int, default=256)
    ap.add_argument("--dim", type=int, default=384)
    ap.add_argument("--heads", type=int, default=6)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--every", type=int, default=10, help="monitor every N-th step")
    ap.add_argument("--sample-rows", type=int, default=0, help="rows sampled per sequence (0: all)")
    ap.add_argument("--no-monitor", action="store_true")
    ap.add_argument("--bench", action="store_true", help="step time: off / every 10th / every step")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--verbose", action="store_true")
    args = ap.parse_args()

    torch.manual_seed(args.seed)
    dev = torch.device("cuda")
    model = GPT(args.vocab, args.dim, args.heads, args.layers, args.ctx).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.0)
    gen = torch.Generator().manual_seed(args.seed)
    data = pregenerate(markov_chain(args.vocab, gen), args.batch, args.ctx, dev, 64, args.seed)

    if args.no_monitor and not args.bench:
        losses, times = train(args, model, opt, data, args.steps)
        print(json.dumps({"final_loss": losses[-1], "median_step_ms": 1e3 * sorted(times)[len(times) // 2]}))
        return 0

    import attnstat
    import attnstat.torch as at

    client = attnstat.Client(socket=args.socket, run=args.run, rank=0,
                             config=json.dumps({k: v for k, v in vars(args).items()}))
    if not args.bench:
        with at.monitor(client, every=args.every, sample_rows=args.sample_rows) as mon:
            losses, times = train(args, model, opt, data, args.steps, mon=mon)
        client.flush(timeout_s=60)
        st = client.stats()
        client.close()
        print(json.dumps({"run": args.run, "final_loss": losses[-1],
                          "median_step_ms": 1e3 * sorted(times)[len(times) // 2],
                          "pushed": mon.pushed, "dropped": mon.dropped, "skipped": mon.skipped,
                          "acked": st.get("acked"), "client": st}))
        return 0

    # --bench: warm up (kernels, the allocator, the daemon's worker, exported buffers), then blocks of
    # `block` steps in each setting, in a shuffled order every round, so that drift in clocks or in
    # the machine's load hits all three alike.
    import random
    train(args, model, opt, data, 40)
    with at.monitor(client, every=1, sample_rows=args.sample_rows) as mon:
        train(args, model, opt, data, 20, mon=mon, start=40)
    client.flush(timeout_s=60)
    rnd = random.Random(args.seed)
    per = {"off": [], "every10": [], "every1": []}
    start, block = 60, 30
    rounds = max(4, args.steps // (3 * block))
    for _ in range(rounds):
        order = list(per)
        rnd.shuffle(order)
        for key in order:
            if key == "off":
                _, t = train(args, model, opt, data, block, start=start)
            else:
                with at.monitor(client, every=10 if key == "every10" else 1,
                                sample_rows=args.sample_rows) as mon:
                    _, t = train(args, model, opt, data, block, mon=mon, start=start)
            per[key] += t
            start += block
            client.poll(0)
    client.flush(timeout_s=60)
    # What the patched-in wrapper costs on a call of a step that is not pushed.
    x = torch.empty(1, 1, 1, 8, device=dev)
    with at.monitor(client, every=10, start_step=1) as mon:
        t0 = time.perf_counter()
        for _ in range(10000):
            mon._observe((x, x, x), {"is_causal": True})
        wrapper_us = (time.perf_counter() - t0) / 10000 * 1e6
    st = client.stats()
    client.close()

    def trimmed(v, cut=0.1):
        v = sorted(v)
        k = int(len(v) * cut)
        v = v[k:len(v) - k]
        return sum(v) / len(v)
    med = {k: 1e3 * sorted(v)[len(v) // 2] for k, v in per.items()}
    mean = {k: 1e3 * sum(v) / len(v) for k, v in per.items()}
    tmean = {k: 1e3 * trimmed(v) for k, v in per.items()}
    print(json.dumps({"median_step_ms": med, "mean_step_ms": mean, "trimmed_mean_step_ms": tmean,
                      "overhead_pct": {k: {"median": 100 * (med[k] / med["off"] - 1),
                                           "mean": 100 * (mean[k] / mean["off"] - 1),
                                           "trimmed_mean": 100 * (tmean[k] / tmean["off"] - 1)}
                                       for k in ("every10", "every1")},
                      "steps_each": len(per["off"]), "block": block, "rounds": rounds,
                      "wrapper_us_per_unpushed_call": wrapper_us,
                      "client": st}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
