#!/usr/bin/env python3
"""A stand-in training process for tests/gpu/test_gpu.py: pushes CUDA tensors to attnstatd through
the Python binding, in a process of its own.

Why this file is long: each mode below is one training job of its own (a model, its loop, what it
records), run as this file's __main__ by test_gpu.py; they share the recording helpers
(record_pushes, _save_monitored, the small models), which a split would have to import back from
a module that runs as __main__.

    gpu_trainer.py values SOCKET OUT.pt [--run NAME] [--seed N] [--device N] [--cases inputs]
        pushes the fixed cases (make_cases; --cases inputs: make_input_cases, every dtype x both
        layouts x masks) with want_results, waits for every result, saves the tensors (host
        copies), the per-head results and the client's counters to OUT.pt
        --local: the same computed in this process (local_compute=True), results sent
    gpu_trainer.py llama SOCKET OUT.pt [--local]
        a transformers Llama model (GQA, rotary) trains two steps under bf16 autocast on a padded
        batch, monitored through attnstat.torch.monitor(model=...) with its defaults; saves what
        its attention function was handed (q, k, mask, scaling per call), the results and the
        monitor's counters
    gpu_trainer.py flex SOCKET OUT.pt
        flex_attention with BlockMasks (a document mask, causal within each document; a causal
        sliding window) under attnstat.torch.monitor(doors=("flex",)); saves q, k, the masks'
        definitions, the results and the counters
    gpu_trainer.py llama-compiled SOCKET OUT.pt [--fullgraph] [--local]
        the Llama model of 'llama' under torch.compile (default mode; --fullgraph: fullgraph=True,
        the monitor's model= the inner module, whose hook is then traced), monitored at the
        defaults; then left and entered again with every=2: saves what each push carried (q, k,
        mask, options), the results, the counters, graph breaks and the graphs compiled before
        and after the second monitor
        --compile-mode reduce-overhead: under CUDA graphs
    gpu_trainer.py flex-byname SOCKET OUT.pt [--compile]
        flex_attention imported by name into this module (`from ... import flex_attention`) with
        a document BlockMask, eager or inside a torch.compile'd function, monitored at the
        defaults; saves what each push carried
    gpu_trainer.py gptoss SOCKET OUT.pt [--compile]
        transformers' gpt-oss (attention sinks, sliding window on alternate layers, eager
        attention) trains a step monitored at the defaults; saves what each push carried (sinks
        included)
    gpu_trainer.py mha SOCKET OUT.pt
        nn.MultiheadAttention with need_weights (masks too) and an nn.TransformerEncoderLayer train
        two steps under bf16 autocast at the monitor's defaults; saves what each push carried,
        the weights the modules returned and the results; then one compiled step's counters
    gpu_trainer.py varlen SOCKET OUT.pt [--compile] [--local]
        varlen_attn on packed sequences, causal and full, eager or compiled, in the daemon or
        in this process; saves what each push carried and the results
    torch.distributed.run --nproc_per_node N gpu_trainer.py fsdp SOCKET OUT [--unnamed]
            [--names A,B] [--hsdp]
        FSDP2 (HSDP on a 2 x N/2 mesh with --hsdp) on the CPU over gloo, one step at the
        monitor's defaults; each rank saves what its pushes carried and the layout found
    gpu_trainer.py unseen SOCKET OUT.pt
        a timm ViT whose first six blocks write their attention out (no door sees it), then a
        Llama eager and compiled, at the monitor's defaults: saves each monitor's counters
        (unseen_by) and the compiled graphs
    gpu_trainer.py ckpt SOCKET OUT.pt
        the Llama of 'llama' with activation checkpointing, two steps at the monitor's defaults:
        saves what each push carried and the recomputed calls' count
    gpu_trainer.py tp SOCKET OUT_PREFIX (run under torch.distributed.run, 2 processes)
        a Llama sharded as torchtitan shards it (DTensor ColwiseParallel q/k/v, RowwiseParallel
        o over a 1-D DeviceMesh "tp"), monitored at the defaults (layout="auto"); each rank saves
        what its pushes carried and the layout the monitor found
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
import types

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


def make_input_cases(seed, dev):
    """What real models hand over: float32 / float16 / bfloat16 q and k, in [B, H, N, D] and in
    [B, N, H, D] (the layout of a fused projection's view), with SDPA's masks: none (causal),
    a boolean causal + padding [B, 1, N, N] (one row that sees no key), an additive [B, 1, 1, N]
    key padding in the tensors' dtype; plus float32 computed as bf16 and f16 (autocast), float16
    computed as bf16, and one general mask (finite biases: the CUDA-core path). The layout name
    is kept in the case: the reference transposes 'bnhd' back."""
    g = torch.Generator().manual_seed(seed)
    B, HQ, HK, N, D = 3, 4, 2, 160, 64
    valid = [N, N - 37, N - 90]

    def qk(dtype, layout):
        q = torch.randn(B, HQ, N, D, generator=g) * torch.linspace(0.6, 3.0, HQ).view(1, HQ, 1, 1)
        k = torch.randn(B, HK, N, D, generator=g) + 0.2
        if layout == "bnhd":
            q, k = q.transpose(1, 2).contiguous(), k.transpose(1, 2).contiguous()
        return q.to(dev, dtype), k.to(dev, dtype)

    i = torch.arange(N).view(N, 1)
    j = torch.arange(N).view(1, N)
    causal_pad = torch.zeros(B, 1, N, N, dtype=torch.bool)
    key_pad = torch.zeros(B, 1, 1, N)
    for b in range(B):
        causal_pad[b, 0] = (j <= i) & (j < valid[b])
        key_pad[b, 0, 0, valid[b]:] = float("-inf")
    causal_pad[1, 0, 5] = False  # a row that sees no key: left out of the statistics
    cases = []
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        for layout in ("bhnd", "bnhd"):
            tag = "%s %s" % (str(dtype).split(".")[-1], layout)
            q, k = qk(dtype, layout)
            cases.append(dict(name=tag + " causal", q=q, k=k, causal=True, layout=layout))
            q, k = qk(dtype, layout)
            cases.append(dict(name=tag + " bool causal+padding", q=q, k=k, causal=False,
                              layout=layout, mask=causal_pad.to(dev)))
            q, k = qk(dtype, layout)
            cases.append(dict(name=tag + " additive key padding", q=q, k=k, causal=False,
                              layout=layout, mask=key_pad.to(dev, dtype)))
    for dtype, comp in ((torch.float32, torch.bfloat16), (torch.float32, torch.float16),
                        (torch.float16, torch.bfloat16)):
        q, k = qk(dtype, "bnhd")
        name = "%s computed as %s, bool causal+padding" % (str(dtype)[6:], str(comp)[6:])
        cases.append(dict(name=name, q=q, k=k, causal=False, layout="bnhd",
                          mask=causal_pad.to(dev), compute=comp))
    q, k = qk(torch.bfloat16, "bhnd")
    bias = torch.randn(1, HQ, N, N, generator=g) * 2
    bias[:, :, :, 100:] = float("-inf")
    cases.append(dict(name="bf16 general additive mask (finite biases)", q=q, k=k, causal=False,
                      layout="bhnd", mask=bias.to(dev, torch.bfloat16)))
    return cases


def run_values(args):
    dev = torch.device("cuda", args.device)
    torch.cuda.set_device(dev)
    torch.cuda.init()
    client = attnstat.Client(socket=args.socket, run=args.run, rank=0, local_compute=args.local)
    results = {}
    client.on_result(lambda seq, step, layer, heads: results.__setitem__(step, heads))
    cases = (make_input_cases if args.cases == "inputs" else make_cases)(args.seed, dev)
    for i, c in enumerate(cases):
        cu = c.get("cu")
        comp = c.get("compute")
        ok = client.push(i, 0, c["q"], c["k"], v=c.get("v"), causal=c["causal"], want_results=True,
                         stats=args.stats,
                         cu_seqlens_q=cu, cu_seqlens_k=cu, layout=c.get("layout", "bhnd"),
                         attn_mask=c.get("mask"),
                         compute_dtype=str(comp).split(".")[-1] if comp is not None else None)
        if not ok:
            raise SystemExit("push %d (%s) was dropped: %s" % (i, c["name"], client.stats()))
    held_after_push = client.stats()["held"]
    if not client.flush(timeout_s=60):
        raise SystemExit("flush timed out: %s" % client.stats())
    st = client.stats()
    out = dict(cases=[{k: (v.detach().cpu() if torch.is_tensor(v) else v) for k, v in c.items()}
                      for c in cases], results=results, stats=st, held_after_push=held_after_push,
               devices=client.devices, stats_asked=args.stats is not None)
    torch.save(out, args.out)
    client.close()
    print(json.dumps({k: st[k] for k in ("pushed", "acked", "rejected", "cuda_zero_copy",
                                         "cuda_staged", "held", "releases_pending")}))


def _save_monitored(args, client, mon, calls, results, extra=None):
    if not client.flush(timeout_s=120):
        raise SystemExit("flush timed out: %s" % client.stats())
    counters = {k: getattr(mon, k) for k in ("calls", "pushed", "skipped", "rejected", "dropped",
                                             "errors")}
    counters["skipped_by"] = dict(mon.skipped_by)
    out = dict(calls=calls, results=results, monitor=counters, stats=client.stats(),
               stats_asked=args.stats is not None)
    out.update(extra or {})
    torch.save(out, args.out)
    client.close()
    print(json.dumps(counters))


def _model(args, dev):
    """--model: a GQA Llama of three layers, or a DeepSeek-V3 of three (latent attention: under
    autocast its query joins a bfloat16 part to a float32 rotary part, its key differs)."""
    if args.model == "deepseek":
        return _small_deepseek(dev, args.seed, layers=3)
    return _small_llama(dev, args.seed)


def run_llama(args):
    """A Llama model as a fine-tuning job runs it: bf16 autocast (q and k reach attention as
    float32: the rotary tables are float32), a padded batch (transformers hands sdpa a boolean
    [B, 1, N, N] mask), GQA. The attention function is wrapped beneath the monitor so that the
    test sees exactly what the monitor saw. --model deepseek: a DeepSeek-V3 instead."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
    import attnstat.torch as at
    dev = torch.device("cuda", 0)
    model = _model(args, dev)
    cfg = model.config
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    B, N = 3, 256
    ids = torch.randint(0, cfg.vocab_size, (B, N), device=dev)
    mask = torch.ones(B, N, dtype=torch.long, device=dev)
    mask[1, N - 60:] = 0
    mask[2, N - 131:] = 0
    client = attnstat.Client(socket=args.socket, run=args.run, rank=0, local_compute=args.local)
    results = {}
    client.on_result(lambda seq, step, layer, heads: results.__setitem__((step, layer), heads))
    calls = []
    orig = ALL_ATTENTION_FUNCTIONS["sdpa"]
    mon = None

    def seen(module, query, key, value, attention_mask, *a, **kw):
        calls.append(dict(step=mon.current_step, layer=module.layer_idx,
                          q=query.detach().cpu(), k=key.detach().cpu(),
                          mask=None if attention_mask is None else attention_mask.detach().cpu(),
                          scale=kw.get("scaling"), autocast=torch.is_autocast_enabled("cuda")))
        return orig(module, query, key, value, attention_mask, *a, **kw)
    ALL_ATTENTION_FUNCTIONS["sdpa"] = seen
    try:
        mon = at.monitor(client, every=1, model=model, want_results=True, stats=args.stats)
        with mon:
            doors = list(mon.doors_open)
            for _ in range(2):
                with torch.autocast("cuda", dtype=torch.bfloat16):
                    loss = model(input_ids=ids, attention_mask=mask, labels=ids).loss
                loss.backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
    finally:
        ALL_ATTENTION_FUNCTIONS["sdpa"] = orig
    _save_monitored(args, client, mon, calls, results, {"doors": doors})


def run_flex(args):
    """flex_attention with BlockMasks through the monitor's flex door: a document mask (three
    documents packed in one sequence, causal within each) and a causal sliding window of 64."""
    import torch.nn.attention.flex_attention as fa
    import attnstat.torch as at
    dev = torch.device("cuda", 0)
    g = torch.Generator().manual_seed(args.seed)
    B, H, N, D = 1, 4, 384, 64
    bounds = [0, 100, 250, N]
    doc = torch.zeros(N, dtype=torch.int32)
    for d in range(len(bounds) - 1):
        doc[bounds[d]:bounds[d + 1]] = d
    doc_dev = doc.to(dev)

    def document(b, h, qi, ki):
        return (doc_dev[qi] == doc_dev[ki]) & (ki <= qi)

    def window(b, h, qi, ki):
        return (ki <= qi) & (qi - ki < 64)
    masks = {"document": document, "window": window}
    client = attnstat.Client(socket=args.socket, run=args.run, rank=0)
    results = {}
    client.on_result(lambda seq, step, layer, heads: results.__setitem__((step, layer), heads))
    calls = []
    mon = at.monitor(client, every=1, doors=("flex",), want_results=True)
    with mon:
        for layer, name in enumerate(masks):
            q = (torch.randn(B, H, N, D, generator=g) * 1.5).to(dev, torch.bfloat16)
            k = torch.randn(B, H, N, D, generator=g).to(dev, torch.bfloat16)
            v = torch.randn(B, H, N, D, generator=g).to(dev, torch.bfloat16)
            bm = fa.create_block_mask(masks[name], B=None, H=None, Q_LEN=N, KV_LEN=N, device=dev)
            fa.flex_attention(q, k, v, block_mask=bm)
            calls.append(dict(step=0, layer=layer, mask_name=name, q=q.cpu(), k=k.cpu()))
    _save_monitored(args, client, mon, calls, results, {"doc": doc, "window": 64})


def run_varlen(args):
    """torch.nn.attention.varlen.varlen_attn (PyTorch 2.10 and later) through the monitor's
    'varlen' door: three sequences packed [T, H, D], a causal call and a full one per step, two
    steps; the release's own way of saying causal (is_causal, or window_size (-1, 0));
    compiled (fullgraph) with --compile; computed in this process (the offsets read on the
    device there too) with --local."""
    import inspect
    import torch.nn.attention.varlen as vl
    import attnstat.torch as at
    dev = torch.device("cuda", 0)
    g = torch.Generator().manual_seed(args.seed)
    H, D = 8, 64
    cu = torch.tensor([0, 100, 250, 384], dtype=torch.int32, device=dev)
    later = "window_size" in inspect.signature(vl.varlen_attn).parameters

    def layer(q, k, v, causal):
        if later:
            return vl.varlen_attn(q, k, v, cu, cu, 150, 150,
                                  window_size=(-1, 0) if causal else (-1, -1))
        return vl.varlen_attn(q, k, v, cu, cu, 150, 150, is_causal=causal)
    fn = torch.compile(layer, fullgraph=True) if args.compile else layer
    client = attnstat.Client(socket=args.socket, run=args.run, rank=0, local_compute=args.local)
    results = {}
    client.on_result(lambda seq, step, layer_, heads: results.__setitem__((step, layer_), heads))
    pushes = record_pushes(client)
    with at.monitor(client, every=1, want_results=True) as mon:
        for step in range(2):
            for causal in (True, False):
                q = (torch.randn(384, H, D, generator=g) * 1.5).to(dev, torch.bfloat16)
                k = torch.randn(384, H, D, generator=g).to(dev, torch.bfloat16)
                v = torch.randn(384, H, D, generator=g).to(dev, torch.bfloat16)
                fn(q, k, v, causal)
            mon.step()
    _save_monitored(args, client, mon, pushes, results, {"graphs": _graphs(), "later": later})


def record_pushes(client):
    """What each push carried (host copies), appended to the returned list as the client is
    called: exactly the tensors and options the daemon computes from."""
    pushes = []
    push = client.push

    def recording(step, layer, q, k, **kw):
        rec = dict(step=step, layer=layer, q=q.detach().cpu(), k=k.detach().cpu(),
                   causal=kw.get("causal", False), scale=kw.get("scale") or None,
                   layout=kw.get("layout", "bhnd"))
        if kw.get("attn_mask") is not None:
            rec["mask"] = kw["attn_mask"].detach().cpu()
        if kw.get("sinks") is not None:
            rec["sinks"] = kw["sinks"].detach().float().cpu()
        if kw.get("compute_dtype"):
            rec["compute"] = getattr(torch, kw["compute_dtype"])
        if kw.get("window") is not None:
            rec["window"] = tuple(kw["window"])
        if kw.get("cu_seqlens_q") is not None:  # packed sequences (self-attention: one offsets)
            rec["cu"] = [int(x) for x in kw["cu_seqlens_q"].tolist()]
        ok = push(step, layer, q, k, **kw)
        rec["sent"] = ok
        pushes.append(rec)
        return ok
    client.push = recording
    return pushes


def _graphs():
    from torch._dynamo.utils import counters
    return (int(counters["stats"]["unique_graphs"]),
            int(sum(counters["graph_break"].values())))


def _small_llama(dev, seed, heads=8, kv=2, layers=3):
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=512, hidden_size=32 * heads, intermediate_size=512,
                      num_hidden_layers=layers, num_attention_heads=heads,
                      num_key_value_heads=kv, max_position_embeddings=1024,
                      attn_implementation="sdpa")
    return LlamaForCausalLM(cfg).to(dev)


def run_llama_compiled(args):
    import attnstat.torch as at
    dev = torch.device("cuda", 0)
    model = _model(args, dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    B, N = 3, 256
    ids = torch.randint(0, 512, (B, N), device=dev)
    mask = torch.ones(B, N, dtype=torch.long, device=dev)
    mask[1, N - 60:] = 0
    mask[2, N - 131:] = 0
    cm = torch.compile(model, fullgraph=args.fullgraph, mode=args.compile_mode)
    client = attnstat.Client(socket=args.socket, run=args.run, rank=0, local_compute=args.local)
    results = {}
    client.on_result(lambda seq, step, layer, heads: results.__setitem__((step, layer), heads))
    pushes = record_pushes(client)

    def train(n):
        for _ in range(n):
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = cm(input_ids=ids, attention_mask=mask, labels=ids).loss
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
    hooked = model if args.fullgraph else cm
    mons, graphs = [], []
    for every, start, steps in ((1, 0, 2), (2, 10, 4), (1, 20, 1)):
        with at.monitor(client, every=every, start_step=start, model=hooked,
                        want_results=True) as mon:
            train(steps)
        mons.append(mon)
        graphs.append(_graphs())
    total = types.SimpleNamespace(skipped_by={})
    for k in ("calls", "pushed", "skipped", "rejected", "dropped", "errors"):
        setattr(total, k, sum(getattr(m, k) for m in mons))
    for m in mons:
        for kind, n in m.skipped_by.items():
            total.skipped_by[kind] = total.skipped_by.get(kind, 0) + n
    _save_monitored(args, client, total, pushes, results,
                    {"graphs": graphs, "each": [m.stats() for m in mons]})


from torch.nn.attention.flex_attention import flex_attention  # noqa: E402  by name, as users do


def run_flex_byname(args):
    import torch.nn.attention.flex_attention as fa
    import attnstat.torch as at
    dev = torch.device("cuda", 0)
    g = torch.Generator().manual_seed(args.seed)
    B, H, N, D = 2, 4, 256, 64
    doc = torch.zeros(N, dtype=torch.int32)
    doc[100:] = 1
    doc[190:] = 2
    doc_dev = doc.to(dev)

    def document(b, h, qi, ki):
        return (doc_dev[qi] == doc_dev[ki]) & (ki <= qi)
    bm = fa.create_block_mask(document, B=None, H=None, Q_LEN=N, KV_LEN=N, device=dev)

    def layer(q, k, v):
        return flex_attention(q, k, v, block_mask=bm)
    fn = torch.compile(layer, fullgraph=True) if args.compile else layer
    client = attnstat.Client(socket=args.socket, run=args.run, rank=0)
    results = {}
    client.on_result(lambda seq, step, layer_, heads: results.__setitem__((step, layer_), heads))
    pushes = record_pushes(client)
    with at.monitor(client, every=1, want_results=True) as mon:
        for step in range(2):
            for _ in range(2):
                q = (torch.randn(B, H, N, D, generator=g) * 1.5).to(dev, torch.bfloat16)
                k = torch.randn(B, H, N, D, generator=g).to(dev, torch.bfloat16)
                v = torch.randn(B, H, N, D, generator=g).to(dev, torch.bfloat16)
                fn(q, k, v)
            mon.step()
    _save_monitored(args, client, mon, pushes, results, {"graphs": _graphs(), "doc": doc})


class _MhaModel(torch.nn.Module):
    """Two nn.MultiheadAttention layers as DETR-like code calls them (need_weights left at its
    default, True; the second with a causal attn_mask and a key_padding_mask, bool, True =
    excluded) and an nn.TransformerEncoderLayer (need_weights=False inside: torch's SDPA path)."""

    def __init__(self, E=256, H=8):
        super().__init__()
        self.a = torch.nn.MultiheadAttention(E, H, batch_first=True)
        self.b = torch.nn.MultiheadAttention(E, H, batch_first=True)
        self.enc = torch.nn.TransformerEncoderLayer(E, H, 512, dropout=0.0, batch_first=True)
        self.weights, self.keep = [], True

    def forward(self, x, causal, pad):
        y, w = self.a(x, x, x, average_attn_weights=False)
        y2, w2 = self.b(y, y, y, attn_mask=causal, key_padding_mask=pad,
                        average_attn_weights=False)
        if self.keep:
            self.weights += [w.detach().float().cpu(), w2.detach().float().cpu()]
        return self.enc(y2)


def run_mha(args):
    """nn.MultiheadAttention with need_weights (the default) trains two steps under bf16 autocast
    at the monitor's defaults, an encoder layer beside it; saves what each push carried, the
    weights the modules returned, the results; then the same model compiled, one step: its
    calls with weights skipped and counted, the encoder's pushed."""
    import attnstat.torch as at
    dev = torch.device("cuda", 0)
    torch.manual_seed(args.seed)
    model = _MhaModel().to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    B, N = 3, 200
    x = torch.randn(B, N, 256, device=dev)
    causal = torch.triu(torch.ones(N, N, dtype=torch.bool, device=dev), 1)
    pad = torch.zeros(B, N, dtype=torch.bool, device=dev)
    pad[1, N - 50:] = True
    pad[2, N - 120:] = True
    client = attnstat.Client(socket=args.socket, run=args.run, rank=0)
    results = {}
    client.on_result(lambda seq, step, layer, heads: results.__setitem__((step, layer), heads))
    pushes = record_pushes(client)
    mon = at.monitor(client, every=1, model=model, want_results=True)
    with mon:
        doors = list(mon.doors_open)
        for _ in range(2):
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = model(x, causal, pad).float().pow(2).mean()
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
    model.keep = False
    compiled = torch.compile(model)
    c2 = attnstat.Client(socket=args.socket, run=args.run + "-compiled", rank=0)
    cpushes = record_pushes(c2)
    with at.monitor(c2, every=1, model=compiled) as cmon:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            compiled(x, causal, pad).float().sum().backward()
    c2.flush(timeout_s=120)
    c2.close()
    cm = dict(pushed=cmon.pushed, skipped_by=dict(cmon.skipped_by), errors=cmon.errors,
              compiled_calls=cmon.compiled_calls, pushes=cpushes)
    _save_monitored(args, client, mon, pushes, results,
                    {"doors": doors, "weights": model.weights, "compiled": cm,
                     "graphs": _graphs()})
def run_unseen(args):
    """A model seen in part: timm's ViT-S/16 with the attention of its first six blocks written
    out (Attention.fused_attn False: matmul and softmax, no door) and the last six through SDPA,
    two training steps at the monitor's defaults; then a Llama (sdpa), eager and compiled, where
    no attention module may be reported. Saves the monitors' counters and the compiled graphs."""
    import timm
    import attnstat.torch as at
    dev = torch.device("cuda", 0)
    torch.manual_seed(args.seed)
    vit = timm.create_model("vit_small_patch16_224", pretrained=False, num_classes=10).to(dev)
    for blk in vit.blocks[:6]:
        blk.attn.fused_attn = False
    opt = torch.optim.AdamW(vit.parameters(), lr=1e-4)
    x = torch.randn(4, 3, 224, 224, device=dev)
    client = attnstat.Client(socket=args.socket, run=args.run, rank=0)
    pushes = record_pushes(client)
    out = {}
    with at.monitor(client, every=1, model=vit) as mon:
        for _ in range(2):
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = vit(x).float().pow(2).mean()
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
    out["vit"] = dict(mon.stats(), pushes=len(pushes))
    llama = _small_llama(dev, args.seed)
    ids = torch.randint(0, 512, (2, 128), device=dev)
    for name, m in (("llama", llama), ("llama-compiled", torch.compile(llama))):
        before = len(pushes)
        with at.monitor(client, every=1, model=m) as mon:
            for _ in range(2):
                with torch.autocast("cuda", dtype=torch.bfloat16):
                    m(input_ids=ids, labels=ids).loss.backward()
        out[name] = dict(mon.stats(), pushes=len(pushes) - before)
    out["graphs"] = _graphs()
    client.flush(timeout_s=120)
    client.close()
    torch.save(out, args.out)
    print(json.dumps({k: str(v) for k, v in out.items()}))


def run_ckpt(args):
    """The Llama of 'llama' with activation checkpointing (transformers'
    gradient_checkpointing_enable: each layer's forward runs again in backward), two steps at the
    monitor's defaults; saves what each push carried and the monitor's counters; then the same
    model compiled, two steps: which (step, layer) each push was, and its monitor's counters."""
    import attnstat.torch as at
    dev = torch.device("cuda", 0)
    model = _small_llama(dev, args.seed)
    model.gradient_checkpointing_enable()
    model.train()
    ids = torch.randint(0, 512, (2, 128), device=dev)
    client = attnstat.Client(socket=args.socket, run=args.run, rank=0)
    results = {}
    client.on_result(lambda seq, step, layer, heads: results.__setitem__((step, layer), heads))
    pushes = record_pushes(client)
    mon = at.monitor(client, every=1, model=model, want_results=True)
    with mon:
        for _ in range(2):
            with torch.autocast("cuda", dtype=torch.bfloat16):
                model(input_ids=ids, labels=ids).loss.backward()
    # the same model compiled (torchtitan's way: checkpointing and torch.compile together)
    compiled = torch.compile(model)
    c2 = attnstat.Client(socket=args.socket, run=args.run + "-compiled", rank=0)
    cpushes = record_pushes(c2)
    with at.monitor(c2, every=1, model=compiled) as cmon:
        for _ in range(2):
            with torch.autocast("cuda", dtype=torch.bfloat16):
                compiled(input_ids=ids, labels=ids).loss.backward()
    c2.flush(timeout_s=120)
    c2.close()
    cm = dict(keys=[(p["step"], p["layer"]) for p in cpushes], pushed=cmon.pushed,
              errors=cmon.errors, recomputed=cmon.recomputed, blind=cmon.blind,
              skipped_by=dict(cmon.skipped_by), compiled_calls=cmon.compiled_calls)
    _save_monitored(args, client, mon, pushes, results, {"recomputed": mon.recomputed,
                                                         "compiled": cm})


def run_gptoss(args):
    from transformers import GptOssConfig, GptOssForCausalLM
    import attnstat.torch as at
    torch.manual_seed(args.seed)
    dev = torch.device("cuda", 0)
    cfg = GptOssConfig(vocab_size=512, hidden_size=256, intermediate_size=256,
                       num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=2,
                       head_dim=32, num_local_experts=4, num_experts_per_tok=2,
                       sliding_window=64, max_position_embeddings=1024,
                       layer_types=["sliding_attention", "full_attention"],
                       attn_implementation="eager")
    model = GptOssForCausalLM(cfg).to(dev)
    with torch.no_grad():
        for m in model.modules():
            if hasattr(m, "sinks"):
                m.sinks.normal_(0.0, 2.0)  # sinks that matter: some above the rows' logits
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ids = torch.randint(0, 512, (2, 160), device=dev)
    fwd = torch.compile(model) if args.compile else model
    client = attnstat.Client(socket=args.socket, run=args.run, rank=0)
    results = {}
    client.on_result(lambda seq, step, layer, heads: results.__setitem__((step, layer), heads))
    pushes = record_pushes(client)
    with at.monitor(client, every=1, model=fwd, want_results=True, stats=args.stats) as mon:
        for _ in range(2):
            loss = fwd(input_ids=ids, labels=ids).loss
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
    _save_monitored(args, client, mon, pushes, results, {"graphs": _graphs()})


def _small_deepseek(dev, seed, heads=8, layers=2):
    """A DeepSeek-V3 (multi-head latent attention, Kimi K2's kind) of dense layers: q through
    q_a_proj / q_b_proj, k_C and the values through kv_b_proj, the rotary key shared."""
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM
    torch.manual_seed(seed)
    cfg = DeepseekV3Config(vocab_size=512, hidden_size=256, intermediate_size=512,
                           moe_intermediate_size=128, num_hidden_layers=layers,
                           num_attention_heads=heads, num_key_value_heads=heads,
                           q_lora_rank=96, kv_lora_rank=64, qk_nope_head_dim=32,
                           qk_rope_head_dim=16, v_head_dim=32, first_k_dense_replace=layers,
                           max_position_embeddings=1024, attn_implementation="sdpa")
    return DeepseekV3ForCausalLM(cfg).to(dev)


def _small_phi3(dev, seed, heads=8, kv=2, layers=2):
    """A Phi-3 (one fused qkv_proj per layer: query rows, key rows, value rows) with GQA."""
    from transformers import Phi3Config, Phi3ForCausalLM
    torch.manual_seed(seed)
    cfg = Phi3Config(vocab_size=512, hidden_size=32 * heads, intermediate_size=512,
                     num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv,
                     max_position_embeddings=1024, pad_token_id=0, attn_implementation="sdpa")
    return Phi3ForCausalLM(cfg).to(dev)


def _forward_flushed(client, model, ids):
    """One measured forward of model under bf16 autocast, its pushes flushed (results in)."""
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
        model(input_ids=ids)
    if not client.flush(timeout_s=60):
        raise SystemExit("flush timed out: %s" % client.stats())


def _clip_and_measure_again(client, model, mon, results, tau, ids):
    """qk_clip at tau from step 0's results (they came before the clip existed), then the same
    forward again under the monitor (step 1), flushed. Returns the clip and how many heads it
    clipped."""
    import attnstat.torch as at
    clip = at.qk_clip(client, model, tau=tau, monitor=mon)
    for (st, layer), hs in list(results.items()):
        clip.observe(0, st, layer, hs)
    clipped = clip.step()
    _forward_flushed(client, model, ids)  # step 1
    return clip, clipped


def _qkclip_measure(args, model, heads, qrows):
    """QK-Clip from the measurements, on model under bf16 autocast: each layer's query rows of
    head h (qrows(layer): the weight, rows per head) scaled by 1 .. 12 so that the heads' max
    logits differ; step 0 measured, tau set to the median of its heads' max logits, qk_clip
    applied, then the same forward again (step 1). Saves both steps' results, tau and what the
    clip did. --local: the clip on the device (qk_clip's device mode, lag 0): made before step 0
    so that the pushes write the max logits into its buffers, tau given once step 0's results
    are in."""
    import attnstat.torch as at
    dev = torch.device("cuda", 0)
    cfg = model.config
    with torch.no_grad():  # heads of very different sizes: some over tau, some under
        for layer in model.model.layers:
            w, per = qrows(layer.self_attn)
            w.view(heads, per, -1).mul_(torch.linspace(1.0, 12.0, heads, device=dev).view(
                heads, 1, 1))
    ids = torch.randint(0, cfg.vocab_size, (2, 256), device=dev)
    client = attnstat.Client(socket=args.socket, run=args.run, rank=0, local_compute=args.local)
    results = {}
    client.on_result(lambda seq, step, layer, hs: results.__setitem__((step, layer), hs))
    with at.monitor(client, every=1, model=model, want_results=True) as mon:
        clip = at.qk_clip(client, model, tau=1.0, monitor=mon) if args.local else None
        _forward_flushed(client, model, ids)  # step 0
        ml = sorted(h["max_logit"] for hs in results.values() for h in hs)  # the first step's
        tau = ml[len(ml) // 2]
        if clip is None:
            clip, clipped = _clip_and_measure_again(client, model, mon, results, tau, ids)
        else:  # on the device, from the max logits step 0's pushes wrote
            clip.tau = tau
            clip.step()
            _forward_flushed(client, model, ids)  # step 1
            clipped = clip.stats()["clipped_heads"]
    out = dict(results=results, tau=tau, clipped=clipped, clip=clip.stats(), stats=client.stats())
    torch.save(out, args.out)
    client.close()
    print(json.dumps({"tau": tau, "clipped": clipped, "clip": clip.stats()}))


def run_qkclip(args):
    """_qkclip_measure on a GQA Llama (8 query heads, 2 key/value heads)."""
    model = _small_llama(torch.device("cuda", 0), args.seed, layers=2)
    _qkclip_measure(args, model, 8, lambda a: (a.q_proj.weight, a.head_dim))


def run_qkclip_fused(args):
    """_qkclip_measure on a Phi-3 (fused q/k/v, 8 query heads, 2 key/value heads)."""
    model = _small_phi3(torch.device("cuda", 0), args.seed)
    _qkclip_measure(args, model, 8, lambda a: (a.qkv_proj.weight[:8 * a.head_dim], a.head_dim))


def run_qkclip_mla(args):
    """_qkclip_measure on a DeepSeek-V3 (latent attention, 8 heads): q_b_proj's rows scaled."""
    model = _small_deepseek(torch.device("cuda", 0), args.seed)
    _qkclip_measure(args, model, 8, lambda a: (a.q_b_proj.weight, a.qk_head_dim))


def run_maxout(args):
    """Client.push(max_logit_out=) in local mode: three pushes of different q against one k fold
    their heads' max logits into one NaN buffer (the second and third also into buffers of their
    own), read after local_wait on the device; and the refusals (a host tensor, a wrong shape,
    float32, the max logit not asked for) with their messages, nothing sent."""
    dev = torch.device("cuda", 0)
    g = torch.Generator().manual_seed(args.seed)
    B, H, N, D = 2, 4, 96, 64
    k = torch.randn(B, H, N, D, generator=g).to(dev, torch.bfloat16)
    qs = [(torch.randn(B, H, N, D, generator=g) * s).to(dev, torch.bfloat16) for s in (1.0, 3.0, 0.5)]
    client = attnstat.Client(socket=args.socket, run=args.run, rank=0, local_compute=True)
    results = {}
    client.on_result(lambda seq, step, layer, hs: results.__setitem__((step, layer), hs))
    fold = torch.full((H,), float("nan"), dtype=torch.float64, device=dev)
    own = [torch.full((H,), float("nan"), dtype=torch.float64, device=dev) for _ in qs]
    for i, q in enumerate(qs):
        if not client.push(0, i, q, k, causal=True, want_results=True, max_logit_out=fold):
            raise SystemExit("push %d dropped: %s" % (i, client.stats()))
        if not client.push(1, i, q, k, causal=True, want_results=True, max_logit_out=own[i]):
            raise SystemExit("push %d dropped: %s" % (i, client.stats()))
    client.local_wait()  # the current stream waits; the copies below run after the pushes'
    out = dict(fold=fold.cpu(), own=[o.cpu() for o in own], q=[q.cpu() for q in qs], k=k.cpu())
    refused = {}
    bad = {"host": torch.full((H,), float("nan"), dtype=torch.float64),
           "shape": torch.full((H + 1,), float("nan"), dtype=torch.float64, device=dev),
           "float32": torch.full((H,), float("nan"), dtype=torch.float32, device=dev)}
    for name, t in bad.items():
        try:
            client.push(2, 0, qs[0], k, causal=True, max_logit_out=t)
            refused[name] = None
        except attnstat.AttnstatError as e:
            refused[name] = (e.code, str(e))
    try:
        client.push(2, 0, qs[0], k, causal=True, stats="entropy", max_logit_out=fold)
        refused["stats"] = None
    except attnstat.AttnstatError as e:
        refused["stats"] = (e.code, str(e))
    if not client.flush(timeout_s=60):
        raise SystemExit("flush timed out: %s" % client.stats())
    out.update(results=results, refused=refused, stats=client.stats(), EINVAL=attnstat._lib.EINVAL)
    torch.save(out, args.out)
    client.close()


def _tp_llama(args):
    """This rank of a 2-way tensor-parallel run: the process group (NCCL), its device and a GQA
    Llama (16 query / 4 key-value heads, 2 layers) sharded as torchtitan's plan does (q, k, v
    ColwiseParallel, o RowwiseParallel over the mesh 'tp'). Returns (rank, world, device, model)."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel,
                                                   parallelize_module)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl")
    dev = torch.device("cuda", rank)
    mesh = init_device_mesh("cuda", (world,), mesh_dim_names=("tp",))
    model = _small_llama(dev, args.seed, heads=16, kv=4, layers=2)
    for layer in model.model.layers:
        parallelize_module(layer.self_attn, mesh, {"q_proj": ColwiseParallel(),
                                                   "k_proj": ColwiseParallel(),
                                                   "v_proj": ColwiseParallel(),
                                                   "o_proj": RowwiseParallel()})
    return rank, world, dev, model


def run_tp(args):
    """One rank of a 2-way tensor-parallel Llama (torchtitan's plan)."""
    import attnstat.torch as at
    rank, _, dev, model = _tp_llama(args)
    g = torch.Generator(device=dev).manual_seed(args.seed)
    ids = torch.randint(0, 512, (2, 128), device=dev, generator=g)
    # the run's name from the environment: torch.distributed.run takes --run for its own --run-path
    run = os.environ.get("ATTNSTAT_TEST_RUN", args.run)
    client = attnstat.Client(socket=args.socket, run=run, rank=rank)
    pushes = record_pushes(client)
    with at.monitor(client, every=1, model=model) as mon:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            model(input_ids=ids).logits.sum().backward()
    _finish_rank(args, client, mon, pushes, rank)


def _finish_rank(args, client, mon, pushes, rank):
    """The end of one rank of a distributed job: flush, save what each push carried and the
    stats to OUT.RANK.pt, close, leave the process group, print the monitor's stats."""
    import torch.distributed as dist
    if not client.flush(timeout_s=120):
        raise SystemExit("flush timed out: %s" % client.stats())
    torch.save(dict(pushes=pushes, monitor=mon.stats(), stats=client.stats(), rank=rank),
               "%s.%d.pt" % (args.out, rank))
    client.close()
    dist.destroy_process_group()
    print(json.dumps(mon.stats(), default=str))


def run_fsdp(args):
    """One rank of an FSDP2 job on the CPU over gloo: fully_shard on every decoder layer and on
    the model, the mesh named 'dp_shard' as torchtitan names it (unnamed with --unnamed, or
    --names); with --hsdp a 2-D mesh (2 x world / 2: HSDP, replicas over the first dimension,
    shards over the second) named 'dp_replicate', 'dp_shard'. One training step monitored at
    layout='auto'. Saves what each push carried and the monitor's stats (its layout: data
    parallelism, every head in every process)."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    import attnstat.torch as at
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo")
    shape, names = ((2, world // 2), ("dp_replicate", "dp_shard")) if args.hsdp else \
        ((world,), ("dp_shard",))
    if args.names:
        names = tuple(args.names.split(","))
    mesh = init_device_mesh("cpu", shape, mesh_dim_names=None if args.unnamed else names)
    model = _small_llama(torch.device("cpu"), args.seed, heads=8, kv=2, layers=2)
    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    g = torch.Generator().manual_seed(args.seed + rank)
    ids = torch.randint(0, 512, (2, 64), generator=g)
    run = os.environ.get("ATTNSTAT_TEST_RUN", args.run)
    client = attnstat.Client(socket=args.socket, run=run, rank=rank)
    pushes = record_pushes(client)
    with at.monitor(client, every=1, model=model) as mon:
        model(input_ids=ids, labels=ids).loss.backward()
    _finish_rank(args, client, mon, pushes, rank)


def run_qkclip_tp(args):
    """One rank of a 2-way tensor-parallel GQA Llama (torchtitan's plan: q/k/v ColwiseParallel, o
    RowwiseParallel) under bf16 autocast with attnstat.torch.qk_clip: each rank's query rows
    scaled so that its heads' max logits differ; step 0 measured (the max logit alone), tau the
    median over both ranks' heads, the clip applied on each rank's own shard, the same forward
    again (step 1). Saves both steps' results (this rank's heads, numbered from 0), tau and what
    the clip did."""
    import torch.distributed as dist
    import attnstat.torch as at
    rank, world, dev, model = _tp_llama(args)
    hidden = model.config.hidden_size
    for layer in model.model.layers:
        with torch.no_grad():  # this rank's 8 heads of very different sizes
            w = layer.self_attn.q_proj.weight.to_local()
            w.view(8, -1, hidden).mul_(torch.linspace(1.0, 12.0, 8, device=dev).view(8, 1, 1)
                                       * (1.0 + 0.5 * rank))
    g = torch.Generator(device=dev).manual_seed(args.seed)
    ids = torch.randint(0, 512, (2, 128), device=dev, generator=g)
    run = os.environ.get("ATTNSTAT_TEST_RUN", args.run)
    client = attnstat.Client(socket=args.socket, run=run, rank=rank)
    results = {}
    client.on_result(lambda seq, step, layer, heads: results.__setitem__((step, layer), heads))
    with at.monitor(client, every=1, model=model, want_results=True, stats="max_logit") as mon:
        _forward_flushed(client, model, ids)  # step 0
        mine = [h["max_logit"] for hs in results.values() for h in hs]
        every = [None] * world
        dist.all_gather_object(every, mine)
        ml = sorted(m for part in every for m in part)
        tau = ml[len(ml) // 2]
        clip, clipped = _clip_and_measure_again(client, model, mon, results, tau, ids)
    torch.save(dict(results=results, tau=tau, clipped=clipped, clip=clip.stats(), rank=rank,
                    layout=mon.stats().get("layout")), "%s.%d.pt" % (args.out, rank))
    client.close()
    dist.destroy_process_group()
    print(json.dumps({"rank": rank, "tau": tau, "clip": clip.stats()}, default=str))


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
    ap.add_argument("mode", choices=("values", "loop", "nosync", "memory", "llama", "flex",
                                     "llama-compiled", "flex-byname", "gptoss", "tp", "qkclip",
                                     "qkclip-tp", "qkclip-mla", "qkclip-fused", "maxout",
                                     "mha", "unseen", "ckpt", "varlen", "fsdp"))
    ap.add_argument("socket")
    ap.add_argument("out")
    ap.add_argument("--run", default="gpu-test")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", type=int, default=0, help="values: the CUDA device to push from")
    ap.add_argument("--pushes", type=int, default=2000)
    ap.add_argument("--local", action="store_true",
                    help="values, llama, varlen: compute in this process (Client(local_compute=True))")
    ap.add_argument("--cases", default="paths", choices=("paths", "inputs"),
                    help="values: make_cases (paths) or make_input_cases (inputs)")
    ap.add_argument("--fullgraph", action="store_true", help="llama-compiled: fullgraph=True")
    ap.add_argument("--stats", default=None,
                    help="values, llama, gptoss: the statistics asked for (push / monitor stats=)")
    ap.add_argument("--compile", action="store_true",
                    help="flex-byname, gptoss, varlen: compiled")
    ap.add_argument("--compile-mode", default=None, help="llama-compiled: torch.compile's mode")
    ap.add_argument("--unnamed", action="store_true", help="fsdp: a mesh without names")
    ap.add_argument("--names", default=None, help="fsdp: the mesh's names, comma-separated")
    ap.add_argument("--hsdp", action="store_true", help="fsdp: HSDP on a 2 x world/2 mesh")
    ap.add_argument("--model", default="llama", choices=("llama", "deepseek"),
                    help="llama, llama-compiled: the model (_model)")
    args = ap.parse_args()
    {"values": run_values, "loop": run_loop, "nosync": run_nosync,
     "memory": run_memory, "llama": run_llama, "flex": run_flex,
     "llama-compiled": run_llama_compiled, "flex-byname": run_flex_byname,
     "gptoss": run_gptoss, "tp": run_tp, "qkclip": run_qkclip,
     "qkclip-tp": run_qkclip_tp, "qkclip-mla": run_qkclip_mla,
     "qkclip-fused": run_qkclip_fused, "maxout": run_maxout, "mha": run_mha,
     "unseen": run_unseen, "ckpt": run_ckpt, "varlen": run_varlen,
     "fsdp": run_fsdp}[args.mode](args)


if __name__ == "__main__":
    main()
