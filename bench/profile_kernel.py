#!/usr/bin/env python3
"""profile_kernel.py — one run of each asked variant (numbers of kernels/cuda/variants.h) on one
shape, for Nsight Compute:
  ncu -k regex:"stats_(wg|ws|mma|generic)" python3 bench/profile_kernel.py LIB [variants] [shape index]
Shapes (index): 0 (2,32,4096,128) full, 1 the same causal, 2 (8,32,1024,128) causal, 3
(4,32/8,2048,64) causal, 4 (1,16,8192,64) causal, 5 (4,32,2048,128) causal, 6 (4,32/4,2048,64)
causal, 7 (2,32,4096,128) causal every 8th row, 8 the same full (bench_kernel.py's). Variants:
comma list (default 0); "auto" runs the default path (the kernel AUTO picks for the shape).
PROFILE_WANT=NAME[,NAME..]: the run asks for those statistics alone (e.g.
max_logit: the FOLD_MAX instances), else the default ask. By SASS region: bench/ncu_regions.py."""
import ctypes
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_kernel as bk  # noqa: E402

SHAPES = [(2, 32, 32, 4096, 128, False), (2, 32, 32, 4096, 128, True), (8, 32, 32, 1024, 128, True),
          (4, 32, 8, 2048, 64, True), (1, 16, 16, 8192, 64, True), (4, 32, 32, 2048, 128, True),
          (4, 32, 4, 2048, 64, True),
          (2, 32, 32, 4096, 128, True, 8), (2, 32, 32, 4096, 128, False, 8)]  # every 8th row


def main():
    lib = bk.load_lib(sys.argv[1])
    variants = [v if v == "auto" else int(v)
                for v in (sys.argv[2] if len(sys.argv) > 2 else "0").split(",")]
    B, Hq, Hkv, N, D, causal, *every = SHAPES[int(sys.argv[3]) if len(sys.argv) > 3 else 0]
    torch.manual_seed(1)
    q = torch.randn(B, Hq, N, D, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(B, Hkv, N, D, device="cuda", dtype=torch.bfloat16)
    p = bk.make_problem(q, k, causal, every[0] if every else 0)
    want = os.environ.get("PROFILE_WANT")
    if want:
        p.want = sum(bk.want_of(name) for name in want.split(","))
    ours = bk.Ours(lib)
    ours.heads_dev = torch.empty(Hq * ctypes.sizeof(bk.Head), dtype=torch.uint8, device="cuda")
    for v in variants:
        lib.stats_cuda_set_path(ours.ctx, 0 if v == "auto" else bk.variant_path(v))  # 0: AUTO
        print("variant", v, lib.stats_cuda_kernel_name(ours.ctx, ctypes.byref(p)).decode(), flush=True)
        ours.run(p, sync=False)
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
