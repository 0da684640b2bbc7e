#!/usr/bin/env python3
"""profile_kernel.py — one run of each asked variant (numbers of kernels/cuda/variants.h) on one
shape, for Nsight Compute:
  ncu -k regex:"stats_(wg|ws|mma|generic)" python3 bench/profile_kernel.py LIB [variants] [shape index]
Shapes as in bench_kernel.py (0: (2,32,4096,128) full). Variants: comma list (default 0)."""
import ctypes
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_kernel as bk  # noqa: E402

SHAPES = [(2, 32, 32, 4096, 128, False), (2, 32, 32, 4096, 128, True)]


def main():
    lib = bk.load_lib(sys.argv[1])
    variants = [int(v) for v in (sys.argv[2] if len(sys.argv) > 2 else "0").split(",")]
    B, Hq, Hkv, N, D, causal = SHAPES[int(sys.argv[3]) if len(sys.argv) > 3 else 0]
    torch.manual_seed(1)
    q = torch.randn(B, Hq, N, D, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(B, Hkv, N, D, device="cuda", dtype=torch.bfloat16)
    p = bk.make_problem(q, k, causal)
    ours = bk.Ours(lib)
    ours.heads_dev = torch.empty(Hq * ctypes.sizeof(bk.Head), dtype=torch.uint8, device="cuda")
    for v in variants:
        lib.stats_cuda_set_path(ours.ctx, bk.variant_path(v))
        print("variant", v, lib.stats_cuda_kernel_name(ours.ctx, ctypes.byref(p)).decode(), flush=True)
        ours.run(p, sync=False)
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
