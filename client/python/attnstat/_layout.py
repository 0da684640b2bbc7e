"""The parallel layout of a process of a training job (attnstat_layout): where its heads and layers
sit in the whole model, and which ranks it is.

    client.set_layout(tp_rank=1, tp_size=4, pp_rank=0, pp_size=1, dp_rank=3, dp_size=8)
    client.set_layout({"tp_rank": 1, "tp_size": 4})          # a dict does as well

Fields (each optional): tp_rank/tp_size (tensor parallelism: the heads of a layer split; query
head h of a push is global head tp_rank x heads + h, or head_offset + h when head_offset is given),
pp_rank/pp_size and layer_offset (pipeline: layer l of a push is global layer layer_offset + l),
dp_rank/dp_size (replicas), cp_rank/cp_size (context parallelism: the rows of a sequence split).
attnstat.torch.monitor(layout="auto") finds them in torch.distributed and the process groups of
common frameworks (attnstat/torch/_layout.py).
"""
import ctypes

from ._errors import AttnstatError
from . import _args, _lib

FIELDS = ("tp_rank", "tp_size", "pp_rank", "pp_size", "dp_rank", "dp_size", "cp_rank", "cp_size",
          "layer_offset", "head_offset")
DEFAULTS = {"tp_rank": 0, "tp_size": 1, "pp_rank": 0, "pp_size": 1, "dp_rank": 0, "dp_size": 1,
            "cp_rank": 0, "cp_size": 1, "layer_offset": 0, "head_offset": None}


def as_dict(layout=None, **fields):
    """The layout as a dict of every field (defaults for those not given), from a dict, an object
    with the fields as attributes, keyword arguments, or several of these (keywords win). Raises
    AttnstatError (EINVAL) for an unknown field or a value out of range."""
    out = dict(DEFAULTS)
    given = {}
    if layout is not None:
        if isinstance(layout, dict):
            given.update(layout)
        else:
            given.update({f: getattr(layout, f) for f in FIELDS if hasattr(layout, f)})
    given.update(fields)
    for k, v in given.items():
        if k not in FIELDS:
            raise AttnstatError(_lib.EINVAL, "unknown layout field %r (known: %s)"
                                % (k, ", ".join(FIELDS)))
        if v is None:
            continue
        out[k] = _args.i32(v, "layout field %s" % k)  # "... is 'x': must be an integer"
    for g in ("tp", "pp", "dp", "cp"):
        r, n = out[g + "_rank"], out[g + "_size"]
        if n < 1 or not 0 <= r < n:
            raise AttnstatError(_lib.EINVAL, "layout: %s_rank %d of %s_size %d: the size must be "
                                ">= 1 and the rank 0 .. size - 1" % (g, r, g, n))
    if out["layer_offset"] < 0 or (out["head_offset"] is not None and out["head_offset"] < 0):
        raise AttnstatError(_lib.EINVAL, "layout: layer_offset and head_offset are >= 0")
    return out


def to_c(lib, d):
    """The C struct (attnstat_layout) of a dict from as_dict()."""
    c = _lib.Layout()
    lib.attnstat_layout_init(ctypes.byref(c))
    for f in FIELDS:
        v = d.get(f)
        setattr(c, f, -1 if v is None else int(v))
    return c
