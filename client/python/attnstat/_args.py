"""The checks of what the binding hands to libattnstat's C types: ctypes wraps an integer that does
not fit (step=2**70 becomes step 0, rank=2**40 rank 0) and a C string ends at its first NUL
("run\\0x" becomes "run"), both without a word, and a NaN threshold means "the daemon's value" to
the library. So every integer is checked against its C type's range, every float for being finite,
every string for a NUL, here, before the call: what does not fit is refused with ArgumentError,
naming the field.
"""
import ctypes
import math
import operator
import os
import sys

from . import _lib
from ._errors import AttnstatError

I32 = (-(1 << 31), (1 << 31) - 1)
U32 = (0, (1 << 32) - 1)
I64 = (-(1 << 63), (1 << 63) - 1)
U64 = (0, (1 << 64) - 1)
FLOAT32_MAX = 3.4028234663852886e38


class ArgumentError(AttnstatError, ValueError):
    """An argument refused before it reaches libattnstat (code EINVAL): out of its C type's range,
    not finite, or a string with a NUL. A ValueError too; the message names the field."""

    def __init__(self, message):
        AttnstatError.__init__(self, _lib.EINVAL, message)


def integer(v, name, lo, hi):
    """v as a Python int in lo..hi (an int, anything with __index__, or an integral float)."""
    if isinstance(v, bool):
        v = int(v)
    try:
        i = operator.index(v)
    except TypeError:
        f = v if isinstance(v, float) else None
        if f is None or not math.isfinite(f) or not f.is_integer():
            raise ArgumentError("%s is %r: must be an integer" % (name, v)) from None
        i = int(f)
    if not lo <= i <= hi:
        raise ArgumentError("%s is %d: must be %d..%d" % (name, i, lo, hi))
    return i


def i32(v, name):
    return integer(v, name, *I32)


def u32(v, name):
    return integer(v, name, *U32)


def i64(v, name):
    return integer(v, name, *I64)


def u64(v, name):
    return integer(v, name, *U64)


def finite(v, name, lo=None, hi=None, single=False):
    """v as a finite float (within lo..hi when given; within float32's range when single: a C
    float that would turn it into inf)."""
    try:
        f = float(v)
    except (TypeError, ValueError):
        raise ArgumentError("%s is %r: must be a number" % (name, v)) from None
    if not math.isfinite(f):
        raise ArgumentError("%s is %r: must be finite" % (name, f))
    if single and abs(f) > FLOAT32_MAX:
        raise ArgumentError("%s is %r: past a 32-bit float's range (%g)" % (name, f, FLOAT32_MAX))
    if (lo is not None and f < lo) or (hi is not None and f > hi):
        raise ArgumentError("%s is %r: must be %s..%s" % (name, f, "-inf" if lo is None else lo,
                                                          "inf" if hi is None else hi))
    return f


def text(v, name):
    """v (str or bytes) as the bytes of a C string: UTF-8, and no NUL (C would end it there)."""
    if isinstance(v, str):
        try:
            b = v.encode("utf-8")
        except UnicodeEncodeError as e:
            raise ArgumentError("%s is not valid text (%s)" % (name, e.reason)) from None
    elif isinstance(v, (bytes, bytearray)):
        b = bytes(v)
    else:
        raise ArgumentError("%s is %s: must be a str" % (name, type(v).__name__))
    at = b.find(b"\0")
    if at >= 0:
        raise ArgumentError("%s holds a NUL character (at byte %d of %d): the C string would end "
                            "there" % (name, at, len(b)))
    return b


def timeout_ms(timeout_s, name):
    """A timeout in seconds as the C int of milliseconds (at least 1)."""
    ms = max(1, int(round(finite(timeout_s, name, lo=0.0) * 1000)))
    return integer(ms, name + " (in ms)", 1, I32[1])


def thresholds(lib, given, fields):
    """The attnstat_thresholds of a dict (None or empty: None): every field known and checked (a
    NaN double or a 0 count would mean "the daemon's value" to the library; None says that)."""
    if not given:
        return None
    th = _lib.Thresholds()
    lib.attnstat_thresholds_init(ctypes.byref(th))
    for k, v in dict(given).items():
        if k not in fields:
            raise AttnstatError(_lib.EINVAL, "unknown threshold %r (known: %s)"
                                % (k, ", ".join(fields)))
        if v is None:
            continue
        if dict(_lib.Thresholds._fields_)[k] is ctypes.c_uint32:  # a count (vocab.h: VOCAB_U)
            setattr(th, k, integer(v, k, 1, U32[1]))
        else:
            setattr(th, k, finite(v, k))
    return th


def device_uuids(lib, devices):
    """UUID strings (bytes) of devices (Client's documentation says which forms): None takes the
    current CUDA device where torch has initialised CUDA, else none."""
    if devices is None:
        torch = sys.modules.get("torch")
        cuda = getattr(torch, "cuda", None)
        try:
            if cuda is not None and cuda.is_available() and cuda.is_initialized():
                devices = [cuda.current_device()]
        except Exception:
            devices = None
        if not devices:
            return []
    elif isinstance(devices, (int, str, bytes)) or hasattr(devices, "type"):
        devices = [devices]
    uuid_of = _lib.optional(lib, "attnstat_cuda_device_uuid")
    out = []
    for d in devices:
        if isinstance(d, bytes):
            d = d.decode()
        if isinstance(d, str) and d.upper().startswith("GPU-"):
            out.append(text(d, "devices (%r)" % d))
            continue
        if hasattr(d, "type"):  # torch.device
            if d.type != "cuda":
                raise AttnstatError(_lib.EINVAL, "devices: %r is not a CUDA device" % (d,))
            d = d.index if d.index is not None else 0
        if isinstance(d, str) and d.startswith("cuda"):
            d = int(d.partition(":")[2] or 0)
        try:
            ordinal = int(d)
        except (TypeError, ValueError):
            raise AttnstatError(_lib.EINVAL, "devices: %r is neither a CUDA ordinal nor a UUID "
                                "('GPU-...')" % (d,))
        if uuid_of is None:
            raise AttnstatError(_lib.ENOTSUP, "this libattnstat cannot name CUDA devices "
                                "(no attnstat_cuda_device_uuid): an older library")
        buf = ctypes.create_string_buffer(64)
        err = _lib.Error()
        rc = uuid_of(ordinal, buf, len(buf), ctypes.byref(err))
        if rc != _lib.OK:
            raise AttnstatError(rc, err.msg.decode("utf-8", "replace"))
        out.append(buf.value)
    return out


def intervention(lib, kind, step, layer, heads, values, threshold, measured, detail):
    """The attnstat_intervention of Client.intervention's arguments, each checked against its C
    type (the library checks the rest: the kind's characters, the bounds), and the ctypes arrays
    it points into (keep them until the call returns)."""
    iv = _lib.Intervention()
    lib.attnstat_intervention_init(ctypes.byref(iv))
    iv.kind = text(kind, "intervention kind")
    iv.step = i64(step, "intervention step")
    iv.layer = -1 if layer is None else integer(layer, "intervention layer", 0, I32[1])
    hs = [integer(h, "intervention heads[%d]" % i, 0, U32[1]) for i, h in enumerate(heads)]
    harr = (ctypes.c_uint32 * max(len(hs), 1))(*hs)
    iv.heads, iv.nheads = (harr if hs else None), len(hs)
    varr = None
    if values is not None:
        vs = [finite(v, "intervention values[%d]" % i) for i, v in enumerate(values)]
        if len(vs) != len(hs):
            raise ArgumentError("intervention: %d values for %d heads (one per head, or none)"
                                % (len(vs), len(hs)))
        varr = (ctypes.c_double * max(len(vs), 1))(*vs)
        iv.values = varr
    if threshold is not None:
        iv.threshold = finite(threshold, "intervention threshold")
    if measured is not None:
        iv.measured = finite(measured, "intervention measured")
    if detail is not None:
        iv.detail = text(detail, "intervention detail")
    return iv, (harr, varr)


_CONNECT_MODES = ("now", "background")


def connect_mode(connect):
    """'now' or 'background' (see Client): connect, else $ATTNSTAT_CONNECT, else 'now'."""
    source = "connect"
    if connect is None:
        connect, source = os.environ.get("ATTNSTAT_CONNECT") or "now", "ATTNSTAT_CONNECT"
    if connect not in _CONNECT_MODES:
        raise AttnstatError(_lib.EINVAL, "%s is %r: 'now' (fail when attnstatd is not there) or "
                            "'background' (start without it and connect when it comes)"
                            % (source, connect))
    return connect
