"""bench_qkclip.py — QK-Clip driven by attnstat's measured max logits, against no clip and against
the recomputation of Q.K^T in PyTorch that a trainer writes where its attention kernel returns
no max logit.

    python3 bench/bench_qkclip.py [--daemon build/daemon/attnstatd] [--steps 200] [--lr 3e-3]
                                  [--grow auto|G] [--tau auto|T] [--layers 8] [--batch 8]
                                  [--seq 1024] [--rounds 3] [--block 10] [--local] [--cost-only]

A Llama built from a config with transformers (hidden 1024, 8 layers, 16 query / 4 key-value
heads of 64, SwiGLU, rotary; random weights) trains under bf16 autocast with AdamW on a copy task
(each sequence a random half repeated, which rewards sharp attention), the same data and the same
initial weights in every run:
  1. growth: trained --steps steps three times, every step measured by the monitor asking for
     the max logit alone (monitor(stats="max_logit", want_results=True)):
       none       no clip;
       attnstat   attnstat.torch.qk_clip(tau) after each optimizer step, from the newest results
                  attnstatd has sent back (the lag, in steps, is recorded every step);
       attnstat:local  the same with Client(local_compute=True) (--local): qk_clip on the device,
                  from the step's own max logits (lag 0);
       recompute  the max logit per head recomputed in the attention (q @ k^T in bf16 under
                  autocast, causal mask, amax: a transformers attention function registered
                  beside sdpa) and the same clip rule applied on the device, no lag.
     tau: --tau, or (auto) the geometric mean of the first step's and the unclipped run's largest
     max logit, so that the unclipped run passes it. --grow G multiplies every query and key
     projection by 1 + G after each optimizer step (a stand-in for the growth of a long run);
     auto: 0 unless the unclipped run's max logit grew less than 1.5x, then the three runs again
     with 0.004 (printed).
  2. cost: step time (synchronised, medians) with the learning rate at 1e-4, in blocks of --block
     steps, the order shuffled every round: off; monitor (every step, default statistics);
     monitor max (stats="max_logit", want_results=True); qkclip (that and qk_clip); recompute;
     with --local also monitor:local, monitor-max:local, qkclip:local (qk_clip on the device) and
     qkclip:local-host (qk_clip(device=False): from the results, lag 1), all with
     Client(local_compute=True); for each clip, clip.step()'s own time on the host.
     --cost-only: this part alone, at --tau.
The daemon (--daemon) runs at its defaults on a private socket and database. Needs a CUDA GPU,
PyTorch and transformers. Prints a table per part and one JSON line of everything.
"""
import argparse
import json
import math
import os
import random
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "client", "python"))
sys.path.insert(0, HERE)


class Recompute(object):
    """The baseline: a transformers attention function that records each layer's per-head max
    logit (device tensors, no synchronisation) before calling sdpa's, and the clip from them."""

    def __init__(self, torch, tau):
        self.torch, self.tau, self.on = torch, tau, False
        self.maxes = {}
        self.clipped = None
        self._masks = {}

    def attention(self, module, query, key, value, attention_mask, **kw):
        from transformers.integrations.sdpa_attention import sdpa_attention_forward
        torch = self.torch
        if self.on:
            with torch.no_grad():
                q, k = query.detach(), key.detach()
                rep = q.shape[1] // k.shape[1]
                if rep > 1:
                    k = k.repeat_interleave(rep, 1)
                scale = kw.get("scaling") or getattr(module, "scaling", q.shape[-1] ** -0.5)
                s = torch.matmul(q, k.transpose(-1, -2))
                n, m = s.shape[-2], s.shape[-1]
                mask = self._masks.get((n, m))
                if mask is None:
                    mask = torch.ones(n, m, dtype=torch.bool, device=s.device).triu(m - n + 1)
                    self._masks[(n, m)] = mask
                s = s.masked_fill(mask, float("-inf"))
                self.maxes[module.layer_idx] = s.amax(dim=(0, 2, 3)).float() * scale
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kw)

    def clip(self, model):
        """attnstat.qk_clip_factors' rule on the device: gamma = min(1, tau / S_h), the key rows of
        a group by sqrt(max gamma), each head's query rows by gamma / that."""
        torch = self.torch
        with torch.no_grad():
            for layer in model.model.layers:
                a = layer.self_attn
                m = self.maxes.get(a.layer_idx)
                if m is None:
                    continue
                d = a.head_dim
                hk = a.k_proj.weight.shape[0] // d
                g = m.numel() // hk
                gamma = torch.where(m > self.tau, self.tau / m, torch.ones_like(m))
                kf = gamma.view(hk, g).amax(1).sqrt()
                qf = gamma / kf.repeat_interleave(g)
                a.q_proj.weight.mul_(qf.repeat_interleave(d).to(a.q_proj.weight.dtype)[:, None])
                a.k_proj.weight.mul_(kf.repeat_interleave(d).to(a.k_proj.weight.dtype)[:, None])
                over = (m > self.tau).sum()
                self.clipped = over if self.clipped is None else self.clipped + over

    def step_max(self):
        return self.torch.stack(list(self.maxes.values())).amax() if self.maxes else None


def set_impl(model, name):
    if hasattr(model, "set_attn_implementation"):
        try:
            model.set_attn_implementation(name)
            return
        except Exception:  # older or stricter versions: the config's field
            pass
    model.config._attn_implementation = name


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--daemon", default=os.path.join(ROOT, "build", "daemon", "attnstatd"))
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--grow", default="auto")
    ap.add_argument("--tau", default="auto")
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--block", type=int, default=10)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--local", action="store_true",
                    help="also the attnstat runs with Client(local_compute=True) (':local')")
    ap.add_argument("--cost-only", action="store_true", help="the cost part alone (needs --tau)")
    a = ap.parse_args()
    if a.cost_only and a.tau == "auto":
        ap.error("--cost-only needs a --tau")

    import torch
    from transformers import AttentionInterface, LlamaConfig, LlamaForCausalLM
    import attnstat
    import attnstat.torch as at
    from bench_overhead_llama import start_daemon

    dev = torch.device("cuda", 0)
    V = 8192
    cfg = LlamaConfig(vocab_size=V, hidden_size=1024, intermediate_size=2816,
                      num_hidden_layers=a.layers, num_attention_heads=16, num_key_value_heads=4,
                      max_position_embeddings=max(2048, a.seq), attn_implementation="sdpa")
    torch.manual_seed(a.seed)
    model = LlamaForCausalLM(cfg).to(dev)
    init = {k: v.detach().clone() for k, v in model.state_dict().items()}
    rec = Recompute(torch, 0.0)
    AttentionInterface.register("sdpa_maxlogit", rec.attention)

    def batch(step):
        g = torch.Generator(device=dev).manual_seed(a.seed * 100003 + step)
        half = torch.randint(0, V, (a.batch, a.seq // 2), device=dev, generator=g)
        return torch.cat([half, half], dim=1)

    work = tempfile.mkdtemp(prefix="attnstat-qkclip-")
    proc, sock, _ = start_daemon(a.daemon, work, [])

    def train(kind, steps, lr, tau, grow, timing=None):
        """One run from the initial weights; returns per-step max logits (measured by the
        monitor, or by the recomputation), the clip's lags and counts, and the losses."""
        model.load_state_dict(init)
        set_impl(model, "sdpa_maxlogit" if kind == "recompute" else "sdpa")
        opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.0)
        maxes, lags, losses = {}, [], {}
        client = mon = clip = None
        rec.on, rec.tau, rec.clipped, rec.maxes = kind == "recompute", tau, None, {}
        rec_max = []
        if kind.split(":")[0] in ("none", "attnstat"):
            client = attnstat.Client(socket=sock, run="qkclip-%s-%d" % (kind, time.time_ns()),
                                     rank=0, local_compute=kind.endswith(":local"))
            client.on_result(lambda seq, st, layer, heads: maxes.setdefault(st, []).extend(
                h["max_logit"] for h in heads))
            mon = at.monitor(client, every=1, model=model, want_results=True, stats="max_logit")
            mon.__enter__()
            if kind.startswith("attnstat"):
                clip = at.qk_clip(client, model, tau=tau, monitor=mon)
        for step in range(steps):
            ids = batch(step)
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            if grow:
                with torch.no_grad():
                    for layer in model.model.layers:
                        layer.self_attn.q_proj.weight.mul_(1.0 + grow)
                        layer.self_attn.k_proj.weight.mul_(1.0 + grow)
            if clip is not None:
                clip.step()
                lags.append(clip.lag)
            if kind == "recompute":
                rec_max.append(rec.step_max())
                rec.clip(model)
            if step % 20 == 0 or step == steps - 1:
                losses[step] = float(loss.detach())
        out = {"losses": losses, "lags": lags}
        if client is not None:
            if not client.flush(timeout_s=120):
                print("flush timed out: %s" % client.stats(), flush=True)
            mon.__exit__(None, None, None)
            out["max"] = {st: max(v) for st, v in maxes.items()}
            out["monitor"] = {"calls": mon.calls, "pushed": mon.pushed, "dropped": mon.dropped,
                              "rejected": mon.rejected}
            if clip is not None:
                out["clip"] = clip.stats()
            client.close()
        else:
            out["max"] = {st: float(v) for st, v in enumerate(rec_max) if v is not None}
            out["clip"] = {"clipped_heads": int(rec.clipped) if rec.clipped is not None else 0}
        rec.on = False
        return out

    def growth(grow, tau):
        none = train("none", a.steps, a.lr, 0.0 if tau is None else tau, grow)
        ml = [none["max"][s] for s in sorted(none["max"])]
        if tau is None:
            tau = math.sqrt(max(ml[0], 1e-3) * max(ml)) if max(ml) > 0 else 1.0
        return none, ml, tau

    def growth_part():
        """1. growth: the runs, their table and summary. Returns (tau, grow, summary,
        one_step)."""
        grow = 0.0 if a.grow == "auto" else float(a.grow)
        tau = None if a.tau == "auto" else float(a.tau)
        none, ml, tau_run = growth(grow, tau)
        if a.grow == "auto" and (not ml or max(ml) < 1.5 * max(ml[0], 1e-6)):
            print("the unclipped run's max logit grew %.2fx in %d steps at lr %g (under 1.5x): the "
                  "three runs again with --grow 0.004" % (max(ml) / max(ml[0], 1e-6), a.steps, a.lr),
                  flush=True)
            grow = 0.004
            none, ml, tau_run = growth(grow, tau)
        tau = tau_run
        runs = {"none": none}
        for kind in ("attnstat",) + (("attnstat:local",) if a.local else ()) + ("recompute",):
            runs[kind] = train(kind, a.steps, a.lr, tau, grow)
        kinds = list(runs)

        print("\ngrowth: lr %g, grow %g per step, tau %.3f, %d steps, (B, N) = (%d, %d), %d layers"
              % (a.lr, grow, tau, a.steps, a.batch, a.seq, a.layers))
        print("| step | " + " | ".join("%s: max logit" % k for k in kinds) + " | loss " +
              " / ".join(kinds) + " |")
        print("|---|" + "---|" * (len(kinds) + 1))
        for st in sorted(set(runs["none"]["losses"])):
            cells = ["%.3f" % runs[k]["max"][st] if st in runs[k]["max"] else "-" for k in kinds]
            loss = " / ".join("%.3f" % runs[k]["losses"].get(st, float("nan")) for k in kinds)
            print("| %d | %s | %s |" % (st, " | ".join(cells), loss))
        # what one optimizer step does to the unclipped run's max logit: the overshoot a clip from
        # the step's own logits cannot prevent (the weights it scales have moved since)
        nv = [runs["none"]["max"][s] for s in sorted(runs["none"]["max"])]
        ratios = sorted(b / x for x, b in zip(nv, nv[1:]) if x > 0)
        one_step = {"median": statistics.median(ratios), "p90": ratios[int(0.9 * (len(ratios) - 1))],
                    "max": ratios[-1]} if ratios else None
        print("one optimizer step, unclipped: the max logit x%.3f median, x%.3f p90, x%.3f at most"
              % (one_step["median"], one_step["p90"], one_step["max"]) if one_step else "-")
        summary = {}
        for k, r in runs.items():
            v = [r["max"][s] for s in sorted(r["max"])]
            over = [x for x in v if x > tau]
            first = next((i for i, x in enumerate(v) if x > tau), len(v))
            after = sorted(x / tau for x in v[first + 1:])  # the steps after tau was first passed
            summary[k] = {"measured_steps": len(v), "peak": max(v) if v else None,
                          "steps_over_tau": len(over), "worst_over_tau": max(over) / tau if over else None,
                          "after_first_pass_median": statistics.median(after) if after else None,
                          "after_first_pass_p90": after[int(0.9 * (len(after) - 1))] if after else None,
                          "clip": r.get("clip"), "monitor": r.get("monitor")}
            if r["lags"]:
                lags = [x for x in r["lags"] if x is not None]
                summary[k]["lag"] = {str(x): lags.count(x) for x in sorted(set(lags))}
            print("%-14s peak %s, %d of %d measured steps over tau (worst %s of tau; after tau was "
                  "first passed: median %s, p90 %s of tau), clip %s, lag %s"
                  % (k, "%.3f" % summary[k]["peak"] if v else "-", len(over), len(v),
                     "%.4f" % (max(over) / tau) if over else "-",
                     "%.3f" % summary[k]["after_first_pass_median"] if after else "-",
                     "%.3f" % summary[k]["after_first_pass_p90"] if after else "-", r.get("clip"),
                     summary[k].get("lag")), flush=True)
        return tau, grow, summary, one_step

    if a.cost_only:  # the cost alone, at the given tau
        tau, grow, summary, one_step = float(a.tau), 0.0, {}, None
    else:
        tau, grow, summary, one_step = growth_part()

    # 2. cost
    modes = ["off", "monitor", "monitor-max", "qkclip", "recompute"]
    if a.local:
        modes += ["monitor:local", "monitor-max:local", "qkclip:local", "qkclip:local-host"]
    times = {m: [] for m in modes}
    clip_ms = {m: [] for m in modes}  # clip.step()'s own time on the host
    model.load_state_dict(init)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    step_no = [0]

    def block(mode):
        client = mon = clip = None
        rec.on, rec.tau, rec.maxes = mode == "recompute", tau, {}
        set_impl(model, "sdpa_maxlogit" if mode == "recompute" else "sdpa")
        kind = mode.split(":")[0]
        if kind in ("monitor", "monitor-max", "qkclip"):
            client = attnstat.Client(socket=sock, run="qkclip-cost", rank=0,
                                     local_compute=":local" in mode)
            kw = {} if kind == "monitor" else {"stats": "max_logit", "want_results": True}
            mon = at.monitor(client, every=1, model=model, **kw)
            mon.__enter__()
            if kind == "qkclip":  # in local mode on the device, unless "-host"
                clip = at.qk_clip(client, model, tau=tau, monitor=mon,
                                  device=False if mode.endswith("-host") else "auto")
        for _ in range(a.block):
            ids = batch(step_no[0])
            step_no[0] += 1
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            if clip is not None:
                t1 = time.perf_counter()
                clip.step()
                clip_ms[mode].append((time.perf_counter() - t1) * 1e3)
            if mode == "recompute":
                rec.clip(model)
            torch.cuda.synchronize()
            times[mode].append((time.perf_counter() - t0) * 1e3)
        if client is not None:
            mon.__exit__(None, None, None)
            client.flush(timeout_s=60)
            client.close()
        rec.on = False

    for m in modes:  # warm-up: every path once
        block(m)
    for m in modes:
        times[m].clear()
        clip_ms[m].clear()
    rng = random.Random(a.seed)
    for _ in range(a.rounds):
        order = list(modes)
        rng.shuffle(order)
        for m in order:
            block(m)
    base = statistics.median(times["off"])
    print("\ncost: step time, %d steps per mode in %d rounds of blocks of %d, order shuffled"
          % (a.rounds * a.block, a.rounds, a.block))
    print("| mode | median ms | mean ms | over off | clip.step() on the host, median ms |")
    print("|---|---|---|---|---|")
    cost = {}
    for m in modes:
        med = statistics.median(times[m])
        cost[m] = {"median_ms": med, "mean_ms": statistics.mean(times[m])}
        if clip_ms[m]:
            cost[m]["clip_step_ms"] = statistics.median(clip_ms[m])
        print("| %s | %.2f | %.2f | %+.1f%% | %s |" % (m, med, cost[m]["mean_ms"],
                                                     100 * (med / base - 1),
                                                     "%.3f" % cost[m]["clip_step_ms"]
                                                     if clip_ms[m] else "-"))
    proc.terminate()
    proc.wait(timeout=30)
    print(json.dumps({"tau": tau, "grow": grow, "lr": a.lr, "steps": a.steps, "growth": summary,
                      "one_step_unclipped": one_step,
                      "cost": cost, "gpu": torch.cuda.get_device_name(0),
                      "torch": torch.__version__}))


if __name__ == "__main__":
    main()
