"""What Client.push checks and describes besides q, k and v: the arguments, the mask, the compute
dtype, packed offsets, attention sinks, the statistics asked for, and the objects kept alive while
the daemon reads them."""
import ctypes
import operator

from . import _args
from . import _lib
from . import _tensor
from . import _vocab
from ._errors import AttnstatError


def _stats_table():
    """{ask name: its bits} over vocab.h's statistics (bit i is row i), the defaults' bits (the
    rows whose dflt is VOCAB_ON) and every row's."""
    by_name, default = {}, 0
    for i, row in enumerate(_vocab.STATS):
        by_name[row["ask"]] = by_name.get(row["ask"], 0) | 1 << i
        if row["dflt"] == "VOCAB_ON":
            default |= 1 << i
    return by_name, default, (1 << len(_vocab.STATS)) - 1


# The names a push asks for statistics by, with their bits (attnstat_push_ext.stats); the defaults
# and every statistic. From the table, in its order: "entropy" (its six rows), "max_logit",
# "sink_mass", "distance".
STATS_BY_NAME, STATS_DEFAULT, STATS_ALL = _stats_table()
STATS_NAMES = tuple(STATS_BY_NAME)


def stats_mask(stats, name="stats"):
    """The bits of a choice of statistics (attnstat_push_ext.stats, bit i = vocab.h's row i):
    None gives 0 (the defaults); "all" every statistic; "default" the defaults (the entropy
    statistics and max_logit); a name a push asks by ("entropy", "max_logit", "sink_mass",
    "distance": STATS_NAMES) that one; an iterable of those names (and "all" / "default") their
    union; an int, the bits themselves. ArgumentError (a ValueError) listing the valid names
    otherwise."""
    if stats is None:
        return 0
    valid = "'all', 'default', " + ", ".join(repr(n) for n in STATS_NAMES)

    def one(v):
        if v == "all":
            return STATS_ALL
        if v == "default":
            return STATS_DEFAULT
        if isinstance(v, str) and v in STATS_BY_NAME:
            return STATS_BY_NAME[v]
        raise _args.ArgumentError("%s names %r: the statistics are asked for by %s (or an "
                                  "iterable of them)" % (name, v, valid))

    if isinstance(stats, str):
        return one(stats)
    if isinstance(stats, bool):
        raise _args.ArgumentError("%s is %r: a name (%s) or an iterable of them" % (name, stats,
                                                                                   valid))
    if not isinstance(stats, int) and hasattr(stats, "__index__"):
        stats = operator.index(stats)  # a NumPy integer
    if isinstance(stats, int):
        if stats < 0 or stats & ~STATS_ALL:
            raise _args.ArgumentError("%s is %#x: bits past the table's %d statistics (every one "
                                      "is %#x); or name them: %s" % (name, stats,
                                                                     len(_vocab.STATS), STATS_ALL,
                                                                     valid))
        return stats
    try:
        names = list(stats)
    except TypeError:
        raise _args.ArgumentError("%s is %r: a name (%s) or an iterable of them"
                                  % (name, stats, valid)) from None
    if not names:
        raise _args.ArgumentError("%s names no statistic: give None for the defaults, or some of "
                                  "%s" % (name, valid))
    bits = 0
    for v in names:
        bits |= one(v)
    return bits


_COMPUTE = {"float32": _lib.F32, "f32": _lib.F32, "float": _lib.F32, "float16": _lib.F16,
            "f16": _lib.F16, "half": _lib.F16, "bfloat16": _lib.BF16, "bf16": _lib.BF16}


class _Ext(object):
    """What attnstat_push2 adds to a push: a mask, the compute dtype, CUDA packed offsets, attention
    sinks, the statistics asked for (bits of stats_mask; the defaults are no ask: 0)."""

    def __init__(self, mask, compute, cu_q, cu_k, sinks=None, stream_waits=False, stats=0,
                 max_out=None):
        self.waits = 1 if stream_waits else 0
        self.max_out = max_out  # a CUDA float64 [Hq] tensor (checked by check_max_out), or None
        self.stats = 0 if stats == STATS_DEFAULT else stats
        self.mask = _tensor.describe_mask(mask) if mask is not None else None
        self.sinks = _tensor.describe_sinks(sinks) if sinks is not None else None
        self.compute = -1
        if compute is not None:
            name = str(compute).replace("torch.", "")
            if isinstance(compute, int) and compute in (_lib.F32, _lib.F16, _lib.BF16):
                self.compute = compute
            elif name in _COMPUTE:
                self.compute = _COMPUTE[name]
            else:
                raise _tensor.TensorError("compute_dtype is %r: 'bfloat16', 'float16' or "
                                          "'float32'" % (compute,))
        self.cu_q = self.cu_k = None
        if _is_cuda(cu_q) or _is_cuda(cu_k):
            if cu_q is None or cu_k is None:
                raise _tensor.TensorError("cu_seqlens_q and cu_seqlens_k go together")
            self.cu_q = _tensor.describe_offsets(cu_q, "cu_seqlens_q")
            self.cu_k = _tensor.describe_offsets(cu_k, "cu_seqlens_k")
        self.needed = (self.mask is not None or self.compute >= 0 or self.cu_q is not None
                       or self.sinks is not None or self.waits or self.stats != 0
                       or max_out is not None)
        self._ext = self._tm = self._tcq = self._tck = self._ts = None

    def descs(self):
        return [d for d in (self.mask, self.cu_q, self.cu_k, self.sinks) if d is not None]

    def owners(self):
        return tuple(d.owner for d in self.descs()) + (
            (self.max_out,) if self.max_out is not None else ())

    def fill(self, lib):
        """A pointer to an attnstat_push_ext describing this (kept alive by this object)."""
        e = _lib.PushExt()
        lib.attnstat_push_ext_init(ctypes.byref(e))
        e.compute_dtype = self.compute
        if self.mask is not None:
            self._tm = _lib.Tensor()
            self.mask.fill(self._tm)
            e.mask = ctypes.pointer(self._tm)
        if self.cu_q is not None:
            self._tcq, self._tck = _lib.Tensor(), _lib.Tensor()
            self.cu_q.fill(self._tcq)
            self.cu_k.fill(self._tck)
            e.cu_seqlens_q = ctypes.pointer(self._tcq)
            e.cu_seqlens_k = ctypes.pointer(self._tck)
        if self.sinks is not None:
            if e.size < _lib.PUSH_EXT_SIZE_SINKS:  # an older libattnstat would ignore them
                raise AttnstatError(_lib.ENOTSUP, "sinks need a libattnstat that takes attention "
                                    "sinks (this one is older)")
            self._ts = _lib.Tensor()
            self.sinks.fill(self._ts)
            e.sinks = ctypes.pointer(self._ts)
        if self.waits:
            if e.size < _lib.PUSH_EXT_SIZE_WAITS:  # an older libattnstat would not wait
                raise AttnstatError(_lib.ENOTSUP, "stream_waits needs a libattnstat that takes "
                                    "it (this one is older)")
            e.stream_waits = 1
        if self.stats:
            if e.size < _lib.PUSH_EXT_SIZE_STATS:  # an older libattnstat would compute the defaults
                raise AttnstatError(_lib.ENOTSUP, "stats needs a libattnstat that takes a choice "
                                    "of statistics (this one is older)")
            e.stats = self.stats
        if self.max_out is not None:
            if e.size < _lib.PUSH_EXT_SIZE_MAXOUT:  # an older libattnstat would write nothing
                raise AttnstatError(_lib.ENOTSUP, "max_logit_out needs a libattnstat that takes "
                                    "it (this one is older)")
            e.max_logit_out = int(self.max_out.data_ptr())
        self._ext = e
        return ctypes.byref(e)


def max_out_supported(lib):
    """Whether lib (a libattnstat) folds max logits into device memory: attnstat_push_ext's
    max_logit_out and attnstat_local_wait (an older library has neither)."""
    init = _lib.optional(lib, "attnstat_push_ext_init") if lib is not None else None
    if init is None or _lib.optional(lib, "attnstat_local_wait") is None:
        return False
    e = _lib.PushExt()
    init(ctypes.byref(e))
    return e.size >= _lib.PUSH_EXT_SIZE_MAXOUT


def check_max_out(t, heads):
    """max_logit_out: a CUDA torch.float64 tensor of one value per query head, contiguous (each
    head's max logit is written there on the device); TensorError otherwise."""
    if not getattr(t, "is_cuda", False) or str(getattr(t, "dtype", "")) != "torch.float64":
        raise _tensor.TensorError("max_logit_out must be a CUDA torch.float64 tensor (one value "
                                  "per query head), not %s on %s"
                                  % (getattr(t, "dtype", type(t).__name__),
                                     getattr(t, "device", "the host")))
    shape = tuple(getattr(t, "shape", ()))
    if shape != (heads,) or (heads > 1 and tuple(t.stride()) != (1,)):
        raise _tensor.TensorError("max_logit_out has shape %s and strides %s: it must be [%d] "
                                  "(one value per query head of q), contiguous"
                                  % (list(shape), list(t.stride()), heads))


def _is_cuda(x):
    if x is None:
        return False
    if getattr(x, "is_cuda", False):
        return True
    try:
        return getattr(x, "__cuda_array_interface__", None) is not None
    except Exception:
        return False


class _Held(tuple):
    """The objects one push keeps alive, with .nbytes, the spans of its tensors."""
    nbytes = 0


def _detached(o):
    """o.detach() where o has it (a tensor: the same memory without its autograd graph), else o."""
    detach = getattr(o, "detach", None)
    if callable(detach):
        try:
            return detach()
        except Exception:
            pass
    return o


def _span_bytes(d):
    """The bytes from the first to one past the last element of a described tensor."""
    if any(n == 0 for n in d.shape):
        return 0
    return (1 + sum((n - 1) * s for n, s in zip(d.shape, d.strides))) * _lib.DTYPE_SIZES[d.dtype]


def _nonneg_int(v, name):
    return _args.integer(v, name, 0, _args.U64[1])


def _u32(v, name):
    return _args.u32(v, name)


def _i32(v, name):
    return _args.i32(v, name)


def _float(v, name):
    """A C float option (softcap, scale): finite, >= 0, within float32's range; None is 0."""
    return _args.finite(v if v is not None else 0.0, name, lo=0.0, single=True)


def _int32_array(x, name):
    """A ctypes int32 array of the values of x (a sequence, or anything iterable / array-like)."""
    if hasattr(x, "tolist"):
        x = x.tolist()
    try:
        vals = list(x)
    except TypeError:
        raise _args.ArgumentError("%s must be a sequence of integers" % name) from None
    vals = [_args.i32(v, "%s[%d]" % (name, i)) for i, v in enumerate(vals)]
    return (ctypes.c_int32 * len(vals))(*vals)


def _cu_pair(cq, ck):
    if cq is None and ck is None:
        return None
    if cq is None or ck is None:
        raise AttnstatError(_lib.EINVAL, "cu_seqlens_q and cu_seqlens_k go together")
    aq, ak = _int32_array(cq, "cu_seqlens_q"), _int32_array(ck, "cu_seqlens_k")
    if len(aq) != len(ak) or len(aq) < 2:
        raise AttnstatError(_lib.EINVAL, "cu_seqlens_q and cu_seqlens_k need the same length, "
                            "n_seqs + 1 >= 2 (got %d and %d)" % (len(aq), len(ak)))
    # aq and ak stay referenced by the tuple (and by the casts) for the duration of the push.
    return (ctypes.cast(aq, ctypes.POINTER(ctypes.c_int32)),
            ctypes.cast(ak, ctypes.POINTER(ctypes.c_int32)), len(aq) - 1, aq, ak)
