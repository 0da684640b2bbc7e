#!/usr/bin/env python3
"""bench_kernel.py — the CUDA statistics kernel (libattnstat_cuda.so, through ctypes) against
PyTorch on the same tensors, in one process.

For each bf16 shape (B, Hq, Hkv, N, D, causal):
  1. check: our per-row entropy / max logit and per-head means against PyTorch in float64, every
     row of every head (tolerances of tests/test_stats_cuda.c); a failure stops the bench;
  2. time (CUDA events, median; inputs rotated among sets larger than L2 together):
       ours  stats_cuda_run_async, per-head statistics only (what the daemon asks for)
       sdpa  F.scaled_dot_product_attention, flash backend, same q, k (and a v)
       mat   the same statistics with the softmax materialised in float32 (chunked over heads)
  3. print the table: speed-ups, our Q.K^T TFLOP/s, and the share of the floor
     (Q.K^T FLOPs of the visible pairs at the bf16 matrix peak measured here).
ATTNSTAT_BENCH_VARIANTS=N,M,...: also check and time those variants, numbered as in
kernels/cuda/variants.h (read from it here: one numbering for code, bench and
bench/kernel_notes.md). Run through bench/bench_kernel.sh, which builds the library first.
ATTNSTAT_BENCH_EXTRAS=1: each shape also run asking for every statistic (stats_problem.want: the
tensor-core kernels' instances with sink mass and distance), checked against float64 and timed
beside the default run on the same tensors, interleaved (bench_kernel.sh extras).
ATTNSTAT_BENCH_MAXONLY=1: the same for a run asking for the max logit alone (the FOLD_MAX
instances, no exps: entropy NaN, max logit checked against float64), bench_kernel.sh maxonly.
ATTNSTAT_BENCH_VARIANTS_WANT=max_logit: the variants of ATTNSTAT_BENCH_VARIANTS checked and timed
asking for the max logit alone (their FOLD_MAX instances), to choose among them for that run.
ATTNSTAT_BENCH_UNCHECKED=1: time every path even where its check failed (said on each check line
and above the tables): for a floor experiment, a tree whose folds were cut out on purpose to
time what is left of the kernel (bench/kernel_notes.md round 31); never for a measurement of a
kernel that is meant to be right.
"""
import ctypes
import math
import os
import re
import statistics
import subprocess
import sys

import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))


class Tensor(ctypes.Structure):
    _fields_ = [("ptr", ctypes.c_void_p), ("stride_b", ctypes.c_int64),
                ("stride_h", ctypes.c_int64), ("stride_n", ctypes.c_int64)]


class Problem(ctypes.Structure):
    _fields_ = [("batch", ctypes.c_int32), ("heads_q", ctypes.c_int32),
                ("heads_kv", ctypes.c_int32), ("len_q", ctypes.c_int32),
                ("len_k", ctypes.c_int32), ("head_dim", ctypes.c_int32),
                ("dtype", ctypes.c_int), ("q", Tensor), ("k", Tensor),
                ("scale", ctypes.c_float), ("softcap", ctypes.c_float),
                ("causal", ctypes.c_int32), ("window_left", ctypes.c_int32),
                ("window_right", ctypes.c_int32), ("cu_seqlens_q", ctypes.c_void_p),
                ("cu_seqlens_k", ctypes.c_void_p), ("sample_every", ctypes.c_int32),
                ("sample_rows", ctypes.c_int32), ("sample_seed", ctypes.c_uint64),
                ("collapse_threshold", ctypes.c_float), ("compute_dtype", ctypes.c_int),
                ("mask", Tensor), ("mask_dtype", ctypes.c_int),
                ("sinks", ctypes.c_void_p), ("sinks_dtype", ctypes.c_int),
                ("want", ctypes.c_uint32)]


class Head(ctypes.Structure):
    _fields_ = [("rows", ctypes.c_int64), ("rows_norm", ctypes.c_int64),
                ("rows_empty", ctypes.c_int64), ("nonfinite_rows", ctypes.c_int64),
                ("entropy_mean", ctypes.c_double), ("entropy_std", ctypes.c_double),
                ("entropy_min", ctypes.c_double), ("entropy_max", ctypes.c_double),
                ("entropy_norm_mean", ctypes.c_double), ("collapsed_frac", ctypes.c_double),
                ("max_logit", ctypes.c_double), ("sink_mass", ctypes.c_double),
                ("distance", ctypes.c_double), ("sampled", ctypes.c_int32)]


class Err(ctypes.Structure):
    _fields_ = [("msg", ctypes.c_char * 256)]


assert ctypes.sizeof(Problem) == 216 and ctypes.sizeof(Head) == 112, "stats.h layout changed"

BF16, BOOL = 2, 3
# stats_cuda_path (kernels/stats_cuda.h)
PATH_GENERIC, PATH_MMA_SYNC, PATH_WG_VARIANT = 1, 2, 16
VARIANTS_H = os.path.join(HERE, "..", "kernels", "cuda", "variants.h")


def want_all():
    """stats_problem.want asking for every statistic: one bit per row of vocab/vocab.h (read through
    the Python binding's parser of it, loaded by path: the package itself needs its library)."""
    import importlib.util
    spec = importlib.util.spec_from_file_location(
        "attnstat_vocab", os.path.join(HERE, "..", "client", "python", "attnstat", "_vocab.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return (1 << len(mod.STATS)) - 1


def want_of(name):
    """stats_problem.want asking for the statistic `name` alone (its row's bit in vocab/vocab.h)."""
    import importlib.util
    spec = importlib.util.spec_from_file_location(
        "attnstat_vocab", os.path.join(HERE, "..", "client", "python", "attnstat", "_vocab.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return 1 << [r["name"] for r in mod.STATS].index(name)


def read_variants(path=VARIANTS_H):
    """{number: (name, path that asks for it)} from the X-macro table of kernels/cuda/variants.h."""
    rows = re.findall(r'X\(\s*(\d+),\s*\w+,\s*(\w+),\s*"([^"]*)"', open(path).read())
    if not rows:
        sys.exit(f"bench: no variant table found in {path}")
    how = {"WG": lambda n: PATH_WG_VARIANT + n, "MMA_SYNC": lambda n: PATH_MMA_SYNC,
           "GENERIC": lambda n: PATH_GENERIC}
    return {int(n): (name, how[sel](int(n))) for n, sel, name in rows}


VARIANTS = read_variants()
MMA_SYNC_VARIANT = next(n for n, (_, p) in VARIANTS.items() if p == PATH_MMA_SYNC)


def variant_path(v):
    if v not in VARIANTS:
        sys.exit(f"bench: no variant {v}; kernels/cuda/variants.h has {sorted(VARIANTS)}")
    return VARIANTS[v][1]


def load_lib(path):
    lib = ctypes.CDLL(path)
    lib.stats_cuda_create.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(Err)]
    lib.stats_cuda_create.restype = ctypes.c_int
    for name in ("stats_cuda_run", "stats_cuda_run_async"):
        fn = getattr(lib, name)
        fn.argtypes = [ctypes.c_void_p, ctypes.POINTER(Problem), ctypes.c_void_p, ctypes.c_void_p,
                       ctypes.c_void_p, ctypes.c_void_p, ctypes.POINTER(Err)]
        fn.restype = ctypes.c_int
    lib.stats_cuda_reserve.argtypes = [ctypes.c_void_p, ctypes.POINTER(Problem), ctypes.POINTER(Err)]
    lib.stats_cuda_reserve.restype = ctypes.c_int
    lib.stats_cuda_kernel_name.argtypes = [ctypes.c_void_p, ctypes.POINTER(Problem)]
    lib.stats_cuda_kernel_name.restype = ctypes.c_char_p
    lib.stats_cuda_set_path.argtypes = [ctypes.c_void_p, ctypes.c_int]
    lib.stats_cuda_set_path.restype = None
    return lib


def make_problem(q, k, causal, every=0, mask=None):
    """q: [B, Hq, N, D], k: [B, Hkv, N, D] torch bf16 tensors (any strides, D contiguous); mask:
    a bool [B, 1, N, N] tensor given instead of the causal flag (what a padded batch hands over)."""
    p = Problem()
    p.batch, p.heads_q, p.len_q, p.head_dim = q.shape[0], q.shape[1], q.shape[2], q.shape[3]
    p.heads_kv, p.len_k = k.shape[1], k.shape[2]
    p.dtype = BF16
    p.q = Tensor(q.data_ptr(), q.stride(0), q.stride(1), q.stride(2))
    p.k = Tensor(k.data_ptr(), k.stride(0), k.stride(1), k.stride(2))
    p.causal = 1 if causal and mask is None else 0
    if mask is not None:
        p.mask = Tensor(mask.data_ptr(), mask.stride(0), 0, mask.stride(2))  # heads broadcast
        p.mask_dtype = BOOL
    p.window_left = p.window_right = -1
    p.sample_every = every
    return p


class Ours:
    def __init__(self, lib):
        self.lib = lib
        self.ctx = ctypes.c_void_p()
        err = Err()
        if lib.stats_cuda_create(torch.cuda.current_device(), ctypes.byref(self.ctx), ctypes.byref(err)):
            sys.exit("stats_cuda_create: " + err.msg.decode())
        self.heads_dev = None

    def run(self, p, row_h=None, row_m=None, sync=True):
        err = Err()
        stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
        if sync:
            heads = (Head * p.heads_q)()
            st = self.lib.stats_cuda_run(self.ctx, ctypes.byref(p), stream, ctypes.cast(heads, ctypes.c_void_p),
                                         row_h.data_ptr() if row_h is not None else None,
                                         row_m.data_ptr() if row_m is not None else None, ctypes.byref(err))
            if st:
                sys.exit("stats_cuda_run: " + err.msg.decode())
            return heads
        st = self.lib.stats_cuda_run_async(self.ctx, ctypes.byref(p), stream, self.heads_dev.data_ptr(),
                                           None, None, ctypes.byref(err))
        if st:
            sys.exit("stats_cuda_run_async: " + err.msg.decode())
        return None


def ref_rows_f64(q, k, causal, scale):
    """Every row's entropy, max logit, sink mass (p of its first visible key: key 0 here) and
    distance (sum_j p_ij |i + Lk - Lq - j|) in float64: [B, Hq, N] each."""
    B, Hq, N, D = q.shape
    group = Hq // k.shape[1]
    H = torch.empty(B, Hq, N, dtype=torch.float64, device=q.device)
    M, S, X = torch.empty_like(H), torch.empty_like(H), torch.empty_like(H)
    chunk = max(1, (1 << 28) // k.shape[2])  # rows per piece: ~2 GiB of float64 logits
    for b in range(B):
        for h in range(Hq):
            kk = k[b, h // group].double()
            for r0 in range(0, N, chunk):
                r1 = min(N, r0 + chunk)
                s = (q[b, h, r0:r1].double() @ kk.T) * scale
                if causal:
                    off = k.shape[2] - N
                    i = torch.arange(r0, r1, device=q.device)[:, None]
                    j = torch.arange(k.shape[2], device=q.device)[None, :]
                    s.masked_fill_(j > i + off, float("-inf"))
                lp = torch.log_softmax(s, dim=-1)
                H[b, h, r0:r1] = -(lp.exp() * torch.where(torch.isinf(lp), torch.zeros_like(lp), lp)).sum(-1)
                M[b, h, r0:r1] = s.max(-1).values
                pr = lp.exp()
                S[b, h, r0:r1] = pr[:, 0]
                pos = torch.arange(r0, r1, device=q.device, dtype=torch.float64)[:, None] + \
                    (k.shape[2] - N)
                jj = torch.arange(k.shape[2], device=q.device, dtype=torch.float64)[None, :]
                X[b, h, r0:r1] = (pr * (pos - jj).abs()).sum(-1)
                del s, lp, pr
    return H, M, S, X


def torch_materialised_stats(q, k, causal, scale):
    """What one does without attnstat: materialise the softmax (float32), reduce per head."""
    B, Hq, N, D = q.shape
    group = Hq // k.shape[1]
    per = max(1, (1 << 31) // (N * k.shape[2] * 4 * 3))  # heads per chunk: ~2 GiB of float32 x3
    means, maxes = [], []
    mask = None
    if causal:
        mask = torch.ones(N, k.shape[2], dtype=torch.bool, device=q.device).tril(k.shape[2] - N)
    for b in range(B):
        for h0 in range(0, Hq, per):
            h1 = min(Hq, h0 + per)
            kk = k[b].repeat_interleave(group, dim=0)[h0:h1] if group > 1 else k[b, h0:h1]
            s = torch.matmul(q[b, h0:h1], kk.transpose(-1, -2)).float() * scale
            if mask is not None:
                s = s.masked_fill(~mask, float("-inf"))
            lp = torch.log_softmax(s, dim=-1)
            ent = -(lp.exp() * lp.nan_to_num(neginf=0.0)).sum(-1)
            means.append(ent.mean(-1))
            maxes.append(s.amax(dim=(-1, -2)))
    return torch.cat(means), torch.cat(maxes)


def time_events(fn, sets, iters, warmup=3):
    for i in range(warmup):
        fn(sets[i % len(sets)])
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    for i in range(iters):
        starts[i].record()
        fn(sets[i % len(sets)])
        ends[i].record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in zip(starts, ends))


def matmul_peak():
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    ms = time_events(lambda _: torch.matmul(a, b), [None], 30, warmup=5)
    return 2 * 8192 ** 3 / (ms * 1e-3) / 1e12


def main():
    libpath = sys.argv[1] if len(sys.argv) > 1 else os.path.join(HERE, "..", "build-cuda", "kernels", "libattnstat_cuda.so")
    lib = load_lib(libpath)
    torch.manual_seed(int(os.environ.get("ATTNSTAT_BENCH_SEED", "1234")))
    dev = torch.cuda.get_device_properties(0)
    try:
        driver = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                capture_output=True, text=True).stdout.strip()
    except OSError:
        driver = "?"
    peak = matmul_peak()
    print(f"GPU {dev.name}, {dev.multi_processor_count} SMs, driver {driver}, torch {torch.__version__}, "
          f"CUDA {torch.version.cuda}; bf16 matmul peak measured {peak:.0f} TFLOP/s")
    ours = Ours(lib)
    # the runs that ask for other statistics than the defaults, each checked and timed beside the
    # default run on the same tensors: (tag, want, what the table calls it)
    asks = []
    if os.environ.get("ATTNSTAT_BENCH_EXTRAS") == "1":
        asks.append(("x", want_all(), "with sink mass and distance"))
    if os.environ.get("ATTNSTAT_BENCH_MAXONLY") == "1":
        asks.append(("m", want_of("max_logit"), "max logit alone"))
    ask_want = {tag: want for tag, want, _ in asks}
    shapes = [  # B, Hq, Hkv, N, D, causal, sample_every
        (2, 32, 32, 4096, 128, False, 0),
        (2, 32, 32, 4096, 128, True, 0),
        (4, 32, 32, 2048, 128, True, 0),
        (8, 32, 32, 1024, 128, True, 0),
        (1, 16, 16, 8192, 64, True, 0),
        (1, 32, 32, 16384, 128, True, 0),
        (2, 32, 8, 4096, 128, True, 0),
        (2, 32, 32, 4096, 128, False, 8),
        (2, 32, 32, 4096, 128, True, 8),
        (4, 32, 4, 2048, 64, True, 0),  # the 1.1 B Llama of bench_overhead_llama.py (GQA, D 64)
        (2, 16, 16, 4096, 256, True, 0),  # Gemma-class heads (mma.sync by default; variant 6 has a
                                          # Hopper instance, ATTNSTAT_BENCH_VARIANTS=6)
        (4, 32, 32, 2048, 96, True, 0),  # Phi-3's head_dim
    ]
    only = os.environ.get("ATTNSTAT_BENCH_ONLY")
    if only:
        shapes = [shapes[int(i)] for i in only.split(",")]
    rows = []
    base_ms = {}
    # ATTNSTAT_BENCH_VARIANTS=0,1,...: also check and time those variants (kernels/cuda/variants.h)
    variants = [int(i) for i in os.environ.get("ATTNSTAT_BENCH_VARIANTS", "").split(",") if i != ""]
    for var in variants:
        variant_path(var)
    vwant = os.environ.get("ATTNSTAT_BENCH_VARIANTS_WANT")
    unchecked = os.environ.get("ATTNSTAT_BENCH_UNCHECKED") == "1"
    if unchecked:
        print("bench: ATTNSTAT_BENCH_UNCHECKED=1: paths that fail their check are timed all the same "
              "(a floor experiment, not a measurement of a right kernel)", flush=True)
    if vwant not in (None, "", "max_logit"):
        sys.exit("bench: ATTNSTAT_BENCH_VARIANTS_WANT takes max_logit (or nothing)")
    vwant = want_of("max_logit") if vwant else None
    vrows = []
    for (B, Hq, Hkv, N, D, causal, every) in shapes:
        scale = 1.0 / math.sqrt(D)
        set_bytes = 2 * (B * Hq * N * D * 2) + B * Hkv * N * D * 2
        nsets = max(2, min(8, math.ceil(3 * 50e6 / set_bytes)))
        sets = []
        # ATTNSTAT_BENCH_MASK=1: causal rows as a [B, 1, N, N] bool mask (the padded batch's path:
        # the mask's analysis, then the tensor-core kernel on per-row key ranges)
        mask = None
        if causal and os.environ.get("ATTNSTAT_BENCH_MASK") == "1":
            mask = torch.ones(N, N, dtype=torch.bool, device="cuda").tril().expand(B, 1, N, N)
            mask = mask.contiguous()
        for _ in range(nsets):
            q = torch.randn(B, Hq, N, D, device="cuda", dtype=torch.bfloat16)
            k = torch.randn(B, Hkv, N, D, device="cuda", dtype=torch.bfloat16)
            v = torch.randn(B, Hkv, N, D, device="cuda", dtype=torch.bfloat16)
            sets.append((q, k, v, make_problem(q, k, causal, every, mask), mask))
        ours.heads_dev = torch.empty(Hq * ctypes.sizeof(Head), dtype=torch.uint8, device="cuda")
        err = Err()
        lib.stats_cuda_reserve(ours.ctx, ctypes.byref(sets[0][3]), ctypes.byref(err))
        kname = lib.stats_cuda_kernel_name(ours.ctx, ctypes.byref(sets[0][3])).decode()
        tag = f"({B},{Hq}{'/' + str(Hkv) if Hkv != Hq else ''},{N},{D}) " + \
              ("mask" if mask is not None else "causal" if causal else "full") + \
              (f" every {every}" if every else "")

        # 1. check against float64 (every row): the default path, then each variant asked for
        q, k, v, p, _ = sets[0]
        H, M, S, X = ref_rows_f64(q, k, causal, scale)
        sel = None
        if every:
            sel = torch.zeros(N, dtype=torch.bool, device="cuda")
            sel[::every] = True
            H, M, S, X = H[:, :, sel], M[:, :, sel], S[:, :, sel], X[:, :, sel]
        ref_mean = H.mean(dim=(0, 2))
        ref_sink, ref_dist = S.mean(dim=(0, 2)), X.mean(dim=(0, 2))
        failed = set()
        # None: the default path; a tag of asks: the default path asking for those statistics
        for var in [None] + [tag for tag, _, _ in asks] + variants:
            path = 0 if var is None or var in ask_want else variant_path(var)
            lib.stats_cuda_set_path(ours.ctx, path)
            pp = p
            if var in ask_want or (vwant is not None and var in variants):
                pp = Problem.from_buffer_copy(p)
                pp.want = ask_want[var] if var in ask_want else vwant
            name = lib.stats_cuda_kernel_name(ours.ctx, ctypes.byref(pp)).decode()
            rh = torch.full((B, Hq, N), float("nan"), device="cuda")
            rm = torch.full((B, Hq, N), float("nan"), device="cuda")
            heads = ours.run(pp, rh, rm)
            if sel is not None:
                rh, rm = rh[:, :, sel], rm[:, :, sel]
            dh = (rh.double() - H).abs().max().item()
            dm = ((rm.double() - M).abs() / M.abs().clamp(min=1.0)).max().item()
            got_mean = torch.tensor([heads[h].entropy_mean for h in range(Hq)], dtype=torch.float64, device="cuda")
            dmean = ((got_mean - ref_mean).abs() / ref_mean.abs()).max().item()
            ok = dh <= 1e-3 and dm <= 1e-5 and dmean <= 1e-4 and not math.isnan(dh + dm + dmean)
            if (var == "m" or (vwant is not None and var in variants)) and name.endswith(" max"):
                # no entropy computed: NaN, never a number
                ok = dm <= 1e-5 and not math.isnan(dm) and bool(torch.isnan(rh).all()) and \
                    bool(torch.isnan(got_mean).all())
                dh = dmean = float("nan")
            # sink mass and distance: checked where the kernel computes them (NaN: it does not)
            got_s = torch.tensor([heads[h].sink_mass for h in range(Hq)], dtype=torch.float64, device="cuda")
            got_x = torch.tensor([heads[h].distance for h in range(Hq)], dtype=torch.float64, device="cuda")
            extras = "not computed"
            if var == "x" and (torch.isnan(got_s).any() or torch.isnan(got_x).any()):
                ok, extras = False, "asked for, not computed"
            elif not torch.isnan(got_s).all() or not torch.isnan(got_x).all():
                ds = (got_s - ref_sink).abs().max().item()
                dx = ((got_x - ref_dist).abs() / ref_dist.abs().clamp(min=1.0)).max().item()
                ok = ok and ds <= 1e-4 and dx <= 1e-4 and not math.isnan(ds + dx)
                extras = f"max|dsink| {ds:.2e}, max rel ddistance {dx:.2e}"
            verdict = "ok" if ok else "FAILED, timed all the same (ATTNSTAT_BENCH_UNCHECKED)" \
                if unchecked else "FAILED"
            print(f"check {tag:40s} {name}: max|dH| {dh:.2e} nats, max rel dmaxlogit {dm:.2e}, "
                  f"max rel dmean {dmean:.2e}, {extras}: {verdict}", flush=True)
            lib.stats_cuda_set_path(ours.ctx, 0)
            if not ok and not unchecked and (var is None or var in ask_want):
                sys.exit("bench: our output disagrees with PyTorch float64; not timing")
            if not ok and not unchecked:  # a variant under trial: report it, time the others
                failed.add(var)
            del rh, rm
        del H, M, S, X

        # 2. time
        iters = 50
        t_ours = time_events(lambda s: ours.run(s[3], sync=False), sets, iters)
        t_asks = []
        for _, want, _ in asks:  # the same tensors asking for other statistics, interleaved
            pxs = []
            for s in sets:
                pxs.append(Problem.from_buffer_copy(s[3]))
                pxs[-1].want = want
            xsets = [s[:3] + (x,) + s[4:] for s, x in zip(sets, pxs)]
            t_x = time_events(lambda s: ours.run(s[3], sync=False), xsets, iters)
            t_ours2 = time_events(lambda s: ours.run(s[3], sync=False), sets, iters)
            t_x2 = time_events(lambda s: ours.run(s[3], sync=False), xsets, iters)
            t_ours = min(t_ours, t_ours2)
            t_asks.append(min(t_x, t_x2))
        lib.stats_cuda_set_path(ours.ctx, variant_path(MMA_SYNC_VARIANT))  # for the notes
        t_mma = time_events(lambda s: ours.run(s[3], sync=False), sets, iters)
        lib.stats_cuda_set_path(ours.ctx, 0)
        t_var = []
        for i in variants:
            if i in failed:
                t_var.append(float("nan"))
                continue
            lib.stats_cuda_set_path(ours.ctx, variant_path(i))
            vsets = sets
            if vwant is not None:  # their runs asking for the max logit alone
                vsets = []
                for s in sets:
                    x = Problem.from_buffer_copy(s[3])
                    x.want = vwant
                    vsets.append(s[:3] + (x,) + s[4:])
            t_var.append(time_events(lambda s: ours.run(s[3], sync=False), vsets, iters))
            lib.stats_cuda_set_path(ours.ctx, 0)
        if variants:
            t_m = t_asks[[a[0] for a in asks].index("m")] if "m" in ask_want else float("nan")
            vrows.append((tag, t_ours, t_m, t_var))
        t_sdpa = t_mat = float("nan")
        if not every:
            from torch.nn.attention import SDPBackend, sdpa_kernel
            gqa = Hkv != Hq
            with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                try:
                    t_sdpa = time_events(lambda s: F.scaled_dot_product_attention(
                        s[0], s[1], s[2], is_causal=causal, enable_gqa=gqa), sets, iters)
                except RuntimeError as e:  # flash without GQA support: expand K/V first
                    print(f"  sdpa flash: {str(e).splitlines()[0]}; timing it on expanded K/V")
                    ex = [(s[0], s[1].repeat_interleave(Hq // Hkv, 1), s[2].repeat_interleave(Hq // Hkv, 1))
                          for s in sets[:2]]
                    t_sdpa = time_events(lambda s: F.scaled_dot_product_attention(
                        s[0], s[1], s[2], is_causal=causal), ex, iters)
            t_mat = time_events(lambda s: torch_materialised_stats(s[0], s[1], causal, scale), sets, 5, warmup=1)
            base_ms[(B, Hq, Hkv, N, D, causal)] = t_ours
        pairs = N * (N + 1) / 2 if causal else N * N
        if every:
            pairs = sum((i + 1) if causal else N for i in range(0, N, every))
        flops = 2.0 * D * pairs * B * Hq
        tflops = flops / (t_ours * 1e-3) / 1e12
        floor_ms = flops / (peak * 1e12) * 1e3
        rows.append((tag, t_ours, t_sdpa, t_mat, tflops, floor_ms, base_ms.get((B, Hq, Hkv, N, D, causal)),
                     t_asks))
        print(f"time  {tag:40s} ours {t_ours:.4f} ms (variant {MMA_SYNC_VARIANT}, mma.sync: {t_mma:.4f})  "
              f"sdpa {t_sdpa:.4f} ms  "
              f"materialised {t_mat:.2f} ms", flush=True)
        del sets, q, k, v
        torch.cuda.empty_cache()

    print()
    if unchecked:
        print("Timed unchecked (ATTNSTAT_BENCH_UNCHECKED=1): a failed check above is a floor "
              "experiment's, not a right kernel's.")
    print(f"| shape (B,H,N,D) bf16 | ours ms | SDPA flash ms | materialised ms | x SDPA | x mat | "
          f"TFLOP/s | floor ms | share of floor |")
    print("|---|---|---|---|---|---|---|---|---|")
    for tag, t, ts, tm, tf, fl, base, _ in rows:
        xs = f"{ts / t:.2f}" if ts == ts else "-"
        xm = f"{tm / t:.1f}" if tm == tm else "-"
        extra = f" ({t / base:.3f} of unsampled)" if base and "every" in tag else ""
        print(f"| {tag}{extra} | {t:.3f} | {ts:.3f} | {tm:.2f} | {xs} | {xm} | {tf:.0f} | {fl:.3f} | "
              f"{100 * fl / t:.0f}% |")
    for i, (_, _, what) in enumerate(asks):  # what each ask costs beside the default (best of two medians)
        print()
        print(f"| shape | default ms | {what} ms | ratio |")
        print("|---|---|---|---|")
        for tag, t, *_, tx in rows:
            print(f"| {tag} | {t:.4f} | {tx[i]:.4f} | {tx[i] / t:.3f} ({100 * (tx[i] / t - 1):+.1f}%) |")
    if variants:  # last: the variants side by side (FAIL: failed the float64 check, not timed)
        print()
        alone = " max logit alone" if vwant is not None else ""
        print("| shape | default ms | default max logit alone ms | " +
              " | ".join(f"v{i} {VARIANTS[i][0]}{alone} ms" for i in variants) + " |")
        print("|---|---|---|" + "---|" * len(variants))
        for tag, t, tm, tv in vrows:
            print(f"| {tag} | {t:.4f} | {tm:.4f} | " +
                  " | ".join("FAIL" if x != x else f"{x:.4f}" for x in tv) + " |")


if __name__ == "__main__":
    main()
