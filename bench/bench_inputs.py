#!/usr/bin/env python3
"""bench_inputs.py — the statistics kernel on the inputs real training jobs hand it: dtypes
(bf16, f16, float32 under autocast, plain float32), both memory layouts, and masks, side by side
in one run on the same shapes; plus the error of each against float64.

    python3 bench/bench_inputs.py [build-cuda/kernels/libattnstat_cuda.so]

Shapes: the attention of a Llama-3.2-1B layer in training (B 4, 32 query / 8 key-value heads,
N 2048, D 128, causal) and (2, 32, 4096, 128) full. For each input kind: the variant the planner
picks (stats_cuda_kernel_name), the median time (CUDA events, inputs rotated), its ratio to bf16
[B, H, N, D] on the same shape, and the largest per-row errors against float64 computed from the
tensors as the kernel reads them (float32 inputs: from the float32 values, so the error of
computing in bf16 shows). Masks: a boolean [B, 1, N, N] causal + padding mask as transformers'
sdpa path builds it (every row one interval of keys: the tensor-core kernels with per-row key
ranges), key padding [B, 1, 1, N] + is_causal, and a random boolean mask (general: the CUDA-core
kernel reads it per logit). Prints a markdown table last. Imports bench_kernel.py's ctypes mirror.
"""
import ctypes
import math
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_kernel as bk  # noqa: E402

F32, F16, BF16, BOOL = 0, 1, 2, 3
DT = {F32: torch.float32, F16: torch.float16, BF16: torch.bfloat16}


def problem(q, k, dtype, compute, causal, mask=None, layout="bhnd"):
    """q, k as [B, H, N, D] views (layout 'bnhd': stored [B, N, H, D])."""
    p = bk.make_problem(q, k, causal)
    p.dtype = dtype
    p.compute_dtype = compute
    if mask is not None:
        m = mask
        p.mask = bk.Tensor(m.data_ptr(), m.stride(0) if m.shape[0] > 1 else 0,
                           m.stride(1) if m.shape[1] > 1 else 0,
                           m.stride(2) if m.shape[2] > 1 else 0)
        p.mask_dtype = BOOL if m.dtype == torch.bool else {torch.float32: F32, torch.float16: F16,
                                                           torch.bfloat16: BF16}[m.dtype]
    return p


def ref_rows(q, k, causal, scale, mask=None):
    """Per-row entropy and max logit in float64 (dense, per head; chunked over heads)."""
    B, Hq, N, D = q.shape
    g = Hq // k.shape[1]
    Hs, Ms = [], []
    for h in range(Hq):
        s = scale * torch.einsum("bnd,bmd->bnm", q[:, h].double(), k[:, h // g].double())
        vis = torch.ones_like(s, dtype=torch.bool)
        if causal:
            vis &= torch.ones(N, N, dtype=torch.bool, device=s.device).tril()
        if mask is not None:
            mh = mask[:, min(h, mask.shape[1] - 1)]
            vis = vis & mh.expand_as(s)
        raw = s.masked_fill(~vis, float("-inf"))
        m = raw.amax(-1, keepdim=True)
        p = torch.exp(raw - m)
        p = p / p.sum(-1, keepdim=True)
        ent = -(p * torch.log(p.clamp_min(1e-300))).sum(-1)
        empty = ~vis.any(-1)
        Hs.append(ent.masked_fill(empty, float("nan")))
        Ms.append(m.squeeze(-1).masked_fill(empty, float("nan")))
    return torch.stack(Hs, 1), torch.stack(Ms, 1)


def main():
    lib = bk.load_lib(sys.argv[1] if len(sys.argv) > 1 else
                      os.path.join(bk.HERE, "..", "build-cuda", "kernels", "libattnstat_cuda.so"))
    torch.manual_seed(int(os.environ.get("ATTNSTAT_BENCH_SEED", "1234")))
    ours = bk.Ours(lib)
    dev = torch.cuda.get_device_properties(0)
    print(f"GPU {dev.name}, torch {torch.__version__}")
    shapes = [(4, 32, 8, 2048, 128, True), (2, 32, 32, 4096, 128, False)]
    table = []
    for (B, Hq, Hkv, N, D, causal) in shapes:
        scale = 1.0 / math.sqrt(D)
        tag = f"({B},{Hq}/{Hkv},{N},{D}) {'causal' if causal else 'full'}"
        pad = torch.ones(B, N, dtype=torch.bool, device="cuda")
        for b in range(1, B):
            pad[b, N - (N // 8) * b:] = False
        causal_pad = (torch.ones(N, N, dtype=torch.bool, device="cuda").tril()[None, None]
                      & pad[:, None, None, :])
        kinds = [  # name, stored dtype, compute, layout, causal flag, mask maker, forced path
            ("bf16", BF16, F32, "bhnd", causal, None, 0),
            ("bf16 [B,N,H,D]", BF16, F32, "bnhd", causal, None, 0),
            ("f16", F16, F32, "bhnd", causal, None, 0),
            ("f32 computed as bf16 (autocast)", F32, BF16, "bhnd", causal, None, 0),
            ("f32 computed as bf16, [B,N,H,D]", F32, BF16, "bnhd", causal, None, 0),
            ("f32 plain (tensor cores as bf16)", F32, F32, "bhnd", causal, None, 0),
            ("f32 on CUDA cores (before)", F32, F32, "bhnd", causal, None, bk.PATH_GENERIC),
        ]
        if causal:
            kinds += [
                ("bf16, bool mask [B,1,N,N] causal+pad", BF16, F32, "bhnd", False, "causal_pad", 0),
                ("f32->bf16, bool mask causal+pad", F32, BF16, "bnhd", False, "causal_pad", 0),
                ("bf16, key padding [B,1,1,N] + causal", BF16, F32, "bhnd", True, "keypad", 0),
                ("bf16, random bool mask (general)", BF16, F32, "bhnd", False, "random", 0),
            ]
        base = None
        for name, dt, compute, layout, cflag, mkind, path in kinds:
            sets = []
            for _ in range(3):
                shape_q = (B, N, Hq, D) if layout == "bnhd" else (B, Hq, N, D)
                shape_k = (B, N, Hkv, D) if layout == "bnhd" else (B, Hkv, N, D)
                q = torch.randn(shape_q, device="cuda", dtype=DT[dt])
                k = torch.randn(shape_k, device="cuda", dtype=DT[dt])
                if layout == "bnhd":
                    q, k = q.transpose(1, 2), k.transpose(1, 2)
                mask = None
                if mkind == "causal_pad":
                    mask = causal_pad
                elif mkind == "keypad":
                    mask = pad[:, None, None, :]
                elif mkind == "random":
                    mask = torch.rand(B, 1, N, N, device="cuda") < 0.5
                sets.append((q, k, mask, problem(q, k, dt, compute, cflag, mask)))
            q, k, mask, p = sets[0]
            ours.heads_dev = torch.empty(Hq * ctypes.sizeof(bk.Head), dtype=torch.uint8,
                                         device="cuda")
            lib.stats_cuda_set_path(ours.ctx, path)
            kname = lib.stats_cuda_kernel_name(ours.ctx, ctypes.byref(p)).decode()
            err = bk.Err()
            lib.stats_cuda_reserve(ours.ctx, ctypes.byref(p), ctypes.byref(err))
            # accuracy: every row against float64 from the stored values
            rh = torch.full((B, Hq, N), float("nan"), device="cuda")
            rm = torch.full((B, Hq, N), float("nan"), device="cuda")
            ours.run(p, rh, rm)
            m4 = None
            if mask is not None:
                m4 = mask.expand(B, mask.shape[1], N, N)
            H, M = ref_rows(q, k, cflag, scale, m4)
            ok = ~torch.isnan(H)
            dh = (rh.double() - H)[ok].abs().max().item()
            dm = ((rm.double() - M)[ok].abs() / M[ok].abs().clamp(min=1.0)).max().item()
            del H, M, rh, rm
            iters = 20 if path == bk.PATH_GENERIC or mkind == "random" else 50
            t = bk.time_events(lambda s: ours.run(s[3], sync=False), sets, iters)
            lib.stats_cuda_set_path(ours.ctx, 0)
            if base is None:
                base = t
            print(f"{tag:28s} {name:40s} {kname:34s} {t:9.4f} ms  x{t / base:6.2f} of bf16  "
                  f"max|dH| {dh:.2e} nats  max rel dmaxlogit {dm:.2e}", flush=True)
            table.append((tag, name, kname, t, t / base, dh, dm))
            del sets, q, k, mask, p
            torch.cuda.empty_cache()
    print()
    print("| shape | input | kernel | ms | x bf16 | max abs dH vs float64 (nats) | "
          "max rel d max logit |")
    print("|---|---|---|---:|---:|---:|---:|")
    for tag, name, kname, t, x, dh, dm in table:
        print(f"| {tag} | {name} | {kname} | {t:.3f} | {x:.2f} | {dh:.1e} | {dm:.1e} |")


if __name__ == "__main__":
    main()
