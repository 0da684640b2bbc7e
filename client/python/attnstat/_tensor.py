"""Describing the caller's tensors to libattnstat without importing NumPy, PyTorch or CuPy.

What is accepted, tried in this order:
  1. PyTorch-like tensors, duck-typed: data_ptr(), stride(), shape, dtype and device (CPU and CUDA
     tensors, bfloat16 included, tensors that require grad included). Nothing is copied.
  2. __cuda_array_interface__ (CuPy, Numba, PyTorch): device memory.
  3. __array_interface__ (NumPy, and anything that speaks it): host memory. A bfloat16 array
     (ml_dtypes) has typestr '<V2'; it is taken as bfloat16 when its dtype's name says so.
  4. An object with .numpy() and none of the above: the array it returns is used.
Shapes are 4-D, [B, H, N, D] (layout 'bhnd', the default) or [B, N, H, D] ('bnhd', permuted here
as a view: no copy). Strides may be anything >= 0 with the last (D) stride 1.
"""
import sys

from . import _lib

_TYPESTR = {"f4": _lib.F32, "f2": _lib.F16}
_TYPESTR_FAST = {"<f4": _lib.F32, "<f2": _lib.F16}
_TYPESTR_AUX = {"|b1": _lib.BOOL, "<i4": _lib.I32, "|u1": _lib.BOOL}
_TORCH_DTYPES = {"torch.float32": _lib.F32, "torch.float16": _lib.F16,
                 "torch.bfloat16": _lib.BF16, "torch.float": _lib.F32, "torch.half": _lib.F16}
_TORCH_AUX = {"torch.bool": _lib.BOOL, "torch.int32": _lib.I32, "torch.uint8": _lib.BOOL}
LAYOUTS = ("bhnd", "bnhd")


class TensorError(ValueError):
    """A tensor that libattnstat cannot take; the message says which and why."""


class Desc(object):
    """What libattnstat needs about one tensor, plus the object that keeps its memory alive."""
    __slots__ = ("ptr", "dtype", "mem", "device", "shape", "strides", "stream", "owner")

    def __init__(self, ptr, dtype, mem, device, shape, strides, stream, owner):
        self.ptr, self.dtype, self.mem, self.device = ptr, dtype, mem, device
        self.shape, self.strides, self.stream, self.owner = shape, strides, stream, owner

    def fill(self, t):
        """Writes this description into the ctypes Tensor t."""
        t.data = self.ptr
        t.dtype = self.dtype
        t.mem = self.mem
        t.device = self.device
        t.reserved = 0
        t.shape[:] = self.shape
        t.strides[:] = self.strides


_I64 = (-(1 << 63), (1 << 63) - 1)


def _fits(d, name):
    """d, once its numbers fit the C struct (attnstat_tensor: a pointer, int32 device, int64
    shape and strides): ctypes would wrap one that does not, describing another tensor."""
    if not 0 <= d.ptr < (1 << 64):
        raise TensorError("%s has data pointer %#x: not an address" % (name, d.ptr))
    if not -(1 << 31) <= d.device < (1 << 31):
        raise TensorError("%s is on device %d: not a CUDA ordinal" % (name, d.device))
    for what, vals in (("shape", d.shape), ("stride", d.strides)):
        for i, v in enumerate(vals):
            if not _I64[0] <= v <= _I64[1]:
                raise TensorError("%s %s[%d] is %d: past 64 bits" % (name, what, i, v))
    return d


def _is_torch_like(x):
    return (callable(getattr(x, "data_ptr", None)) and callable(getattr(x, "stride", None))
            and hasattr(x, "dtype") and hasattr(x, "shape"))


def _torch_current_stream(device):
    """The current stream's handle of a CUDA device, when PyTorch is already imported (a tensor of
    it is in hand, so it is); None otherwise. Never imports anything."""
    torch = sys.modules.get("torch")
    cuda = getattr(torch, "cuda", None)
    try:
        return int(cuda.current_stream(device).cuda_stream)
    except Exception:
        return None


def _from_torch(x, name, aux=False):
    dtype = _TORCH_DTYPES.get(str(x.dtype))
    if dtype is None and aux:
        dtype = _TORCH_AUX.get(str(x.dtype))
    if dtype is None:
        raise TensorError("%s has dtype %s: attnstat takes torch.float32, torch.float16 or "
                          "torch.bfloat16" % (name, x.dtype))
    dev = getattr(x, "device", None)
    kind = getattr(dev, "type", None)
    if kind is None:
        kind = "cuda" if getattr(x, "is_cuda", False) else "cpu"
    if kind == "cpu":
        mem, index, stream = _lib.MEM_HOST, 0, None
    elif kind == "cuda":
        index = getattr(dev, "index", None)
        index = -1 if index is None else int(index)
        mem, stream = _lib.MEM_CUDA, _torch_current_stream(index if index >= 0 else None)
    else:
        raise TensorError("%s is on device %r: attnstat takes CPU or CUDA tensors" % (name, kind))
    shape = tuple(int(s) for s in x.shape)
    strides = tuple(int(s) for s in x.stride())
    return _fits(Desc(int(x.data_ptr()), dtype, mem, index, shape, strides, stream, x), name)


def _typestr_dtype(typestr, x, name):
    ts = str(typestr)
    if len(ts) >= 3 and ts[0] in "<=|" and ts[1:] in _TYPESTR:
        return _TYPESTR[ts[1:]]
    if ts in ("<V2", "|V2") and getattr(getattr(x, "dtype", None), "name", "") == "bfloat16":
        return _lib.BF16
    raise TensorError("%s has typestr %r: attnstat takes little-endian float32 ('<f4'), float16 "
                      "('<f2') or bfloat16" % (name, ts))


def _from_interface(x, iface, mem, name, aux=False):
    shape = tuple(iface["shape"])
    dtype = _TYPESTR_FAST.get(iface["typestr"])
    if dtype is None and aux:
        dtype = _TYPESTR_AUX.get(iface["typestr"])
    if dtype is None:
        dtype = _typestr_dtype(iface["typestr"], x, name)
    size = _lib.DTYPE_SIZES[dtype]
    data = iface.get("data")
    if not isinstance(data, tuple) or not data:
        raise TensorError("%s exposes its data as a buffer object, not a pointer: pass a NumPy "
                          "array" % name)
    if iface.get("mask") is not None:
        raise TensorError("%s is a masked array: attnstat takes plain arrays" % name)
    ptr = int(data[0])
    bstrides = iface.get("strides")
    if bstrides is None:  # C-contiguous
        n = len(shape)
        strides = [1] * n
        for i in range(n - 2, -1, -1):
            strides[i] = strides[i + 1] * shape[i + 1]
        strides = tuple(strides)
    else:
        if any(b % size for b in bstrides):
            i = [b % size != 0 for b in bstrides].index(True)
            raise TensorError("%s stride %d is %d bytes, not a multiple of the %d-byte "
                              "element" % (name, i, bstrides[i], size))
        strides = tuple(b // size for b in bstrides)
    device, stream = 0, None
    if mem == _lib.MEM_CUDA:
        device = _cuda_device_of(x)
        s = iface.get("stream")
        stream = int(s) if s is not None else None
    return _fits(Desc(ptr, dtype, mem, device, shape, strides, stream, x), name)


def _cuda_device_of(x):
    """The CUDA ordinal of an object with __cuda_array_interface__, or -1 when it does not say
    (the interface itself does not carry it)."""
    dev = getattr(x, "device", None)
    for attr in ("index", "id"):  # PyTorch, CuPy
        v = getattr(dev, attr, None)
        if isinstance(v, int):
            return v
    return -1


def describe(x, name="tensor", layout="bhnd"):
    """Desc of x as a [B, H, N, D] tensor, or TensorError."""
    if layout not in LAYOUTS:
        raise TensorError("layout is %r: must be 'bhnd' ([B, H, N, D]) or 'bnhd' ([B, N, H, D])"
                          % (layout,))
    if x is None:
        raise TensorError("%s is None" % name)
    if _is_torch_like(x):
        d = _from_torch(x, name)
    else:
        try:
            iface = getattr(x, "__cuda_array_interface__", None)
        except Exception as e:  # e.g. a library that refuses the interface for this tensor
            raise TensorError("%s: __cuda_array_interface__ failed: %s" % (name, e))
        if iface is not None:
            d = _from_interface(x, iface, _lib.MEM_CUDA, name)
        else:
            iface = getattr(x, "__array_interface__", None)
            if iface is not None:
                d = _from_interface(x, iface, _lib.MEM_HOST, name)
            elif callable(getattr(x, "numpy", None)):
                arr = x.numpy()
                d = describe(arr, name, "bhnd")
                d.owner = (x, arr)
            else:
                raise TensorError(
                    "%s (%s) is not a tensor attnstat can read: pass a NumPy array, a PyTorch "
                    "tensor or an object with __array_interface__ / __cuda_array_interface__"
                    % (name, type(x).__name__))
    if len(d.shape) != 4 or len(d.strides) != 4:
        raise TensorError("%s has %d dimensions (shape %s): attnstat takes 4-D tensors, [B, H, N, D] "
                          "or [B, N, H, D] with layout='bnhd'" % (name, len(d.shape), list(d.shape)))
    if layout == "bnhd":
        d.shape = (d.shape[0], d.shape[2], d.shape[1], d.shape[3])
        d.strides = (d.strides[0], d.strides[2], d.strides[1], d.strides[3])
    for i, s in enumerate(d.strides):
        if s < 0:
            raise TensorError("%s has a negative stride in dimension %d (%d): flip it with a "
                              "copy first" % (name, i, s))
    if d.strides[3] != 1 and d.shape[3] != 1:
        raise TensorError("%s is not contiguous in its last dimension (D stride %d): make it "
                          "contiguous first" % (name, d.strides[3]))
    if d.shape[3] == 1:
        d.strides = d.strides[:3] + (1,)
    return d


def _describe_any(x, name, aux):
    """Desc of x with its own shape (any number of dimensions)."""
    if x is None:
        raise TensorError("%s is None" % name)
    if _is_torch_like(x):
        return _from_torch(x, name, aux)
    try:
        iface = getattr(x, "__cuda_array_interface__", None)
    except Exception as e:
        raise TensorError("%s: __cuda_array_interface__ failed: %s" % (name, e))
    if iface is not None:
        return _from_interface(x, iface, _lib.MEM_CUDA, name, aux)
    iface = getattr(x, "__array_interface__", None)
    if iface is not None:
        return _from_interface(x, iface, _lib.MEM_HOST, name, aux)
    if callable(getattr(x, "numpy", None)):
        arr = x.numpy()
        d = _describe_any(arr, name, aux)
        d.owner = (x, arr)
        return d
    raise TensorError("%s (%s) is not a tensor attnstat can read" % (name, type(x).__name__))


def describe_mask(m, name="attn_mask"):
    """Desc of an attention mask with scaled_dot_product_attention's conventions: 2 to 4
    dimensions broadcastable to [B, H, Nq, Nk] (leading ones added), boolean (True: the key takes
    part) or float (added to the logits; -inf excludes), the last dimension contiguous. Dimensions
    of size 1 broadcast. No copy."""
    d = _describe_any(m, name, aux=True)
    if d.dtype == _lib.I32:
        raise TensorError("%s has dtype int32: a mask is boolean or floating point" % name)
    if not 2 <= len(d.shape) <= 4:
        raise TensorError("%s has %d dimensions: a mask has 2 to 4 ([B, H,] Nq, Nk)"
                          % (name, len(d.shape)))
    while len(d.shape) < 4:
        d.shape = (1,) + tuple(d.shape)
        d.strides = (0,) + tuple(d.strides)
    if d.shape[3] > 1 and d.strides[3] != 1:
        raise TensorError("%s is not contiguous along the keys (last stride %d): make it "
                          "contiguous first" % (name, d.strides[3]))
    if any(st < 0 for st in d.strides):
        raise TensorError("%s has a negative stride" % name)
    d.strides = tuple(0 if n == 1 else st for n, st in zip(d.shape, d.strides))
    if d.shape[3] == 1:
        d.strides = d.strides[:3] + (1,)
    return d


def describe_sinks(s, name="sinks"):
    """Desc of attention sinks (gpt-oss's `sinks`: one logit per query head) as the
    [1, Hq, 1, 1] tensor libattnstat takes: s is 1-D [Hq], or any shape with at most one dimension
    over 1 ([Hq, 1], [1, Hq, 1, 1], ...: the same values, reshaped here as a view); float32,
    float16 or bfloat16. No copy (host sinks are copied into the ring by libattnstat; CUDA sinks are
    read in place and must be contiguous)."""
    d = _describe_any(s, name, aux=False)
    big = [i for i, n in enumerate(d.shape) if n != 1]
    if len(big) > 1:
        raise TensorError("%s has shape %s: one value per query head, 1-D [Hq] (or a shape with "
                          "one dimension over 1)" % (name, list(d.shape)))
    n = d.shape[big[0]] if big else 1
    if n == 0:
        raise TensorError("%s is empty: one value per query head" % name)
    stride = d.strides[big[0]] if big else 1
    if stride < 0:
        raise TensorError("%s has a negative stride (%d)" % (name, stride))
    d.shape = (1, n, 1, 1)
    d.strides = (0, stride if n > 1 else 1, 0, 1)
    return d


def describe_offsets(t, name):
    """Desc of packed offsets (int32, 1-D [n + 1]) as the [1, 1, n + 1, 1] tensor libattnstat
    takes for CUDA memory."""
    d = _describe_any(t, name, aux=True)
    if d.dtype != _lib.I32 or len(d.shape) != 1:
        raise TensorError("%s must be a 1-D int32 tensor (cu_seqlens), not %s %s"
                          % (name, _lib.DTYPE_NAMES.get(d.dtype, d.dtype), list(d.shape)))
    d.shape = (1, 1, d.shape[0], 1)
    d.strides = (0, 0, d.strides[0], 1)
    return d
