"""The parallel layout of this process, for attnstat.torch.monitor(layout=...): from what the
caller gives, else from the process groups of the frameworks that are already running.

    monitor(client, layout="auto")                       # the default: detected (below)
    monitor(client, layout=mesh)                         # a torch DeviceMesh with named dims
    monitor(client, layout={"tp_rank": 1, "tp_size": 8}) # given (attnstat._layout.FIELDS)
    monitor(client, layout=None)                         # none: local numbers are global ones
    monitor(client, layout="auto", layer_offset=24)      # a pipeline stage's first layer

"auto" looks, in order, at (nothing is imported: only modules the program already imported):
  - Megatron-core's parallel_state, once its model parallel groups exist: tensor, pipeline,
    data and context parallel ranks and sizes;
  - torch.distributed, once initialised: every rank a data-parallel replica (DDP, FSDP);
  - else nothing (a single process).
A DeviceMesh is read by its dimension names: "tp", "pp", "cp", and "dp" or "dp_replicate" x
"dp_shard" (HSDP) for the replicas; other dimensions (e.g. "ep") are not parallelism of attention
heads and are ignored.

A pipeline stage's layers cannot be numbered from ranks alone (the stages before it may hold any
number of layers): with pp_size > 1, layer_offset must be given (or come with the layout), else
the monitor refuses to start rather than store stage 1's layer 0 as stage 0's.
"""
import sys

from .. import _layout as _base

_MEGATRON = "megatron.core.parallel_state"


def _call(mod, name, *args, **kw):
    f = getattr(mod, name, None)
    if not callable(f):
        return None
    try:
        return f(*args, **kw)
    except Exception:
        return None


def from_megatron():
    """Ranks and sizes from Megatron-core's parallel_state, or None when it is not in use."""
    ps = sys.modules.get(_MEGATRON)
    if ps is None or not _call(ps, "model_parallel_is_initialized"):
        return None
    out = {}
    for g, rank, size in (("tp", "get_tensor_model_parallel_rank",
                           "get_tensor_model_parallel_world_size"),
                          ("pp", "get_pipeline_model_parallel_rank",
                           "get_pipeline_model_parallel_world_size"),
                          ("dp", "get_data_parallel_rank", "get_data_parallel_world_size"),
                          ("cp", "get_context_parallel_rank", "get_context_parallel_world_size")):
        r, n = _call(ps, rank), _call(ps, size)
        if r is not None and n is not None:
            out[g + "_rank"], out[g + "_size"] = int(r), int(n)
    return out


def from_torch_distributed(torch):
    """Every rank a replica, or None when torch.distributed is not initialised."""
    dist = getattr(torch, "distributed", None)
    try:
        if dist is None or not dist.is_available() or not dist.is_initialized():
            return None
        return {"dp_rank": int(dist.get_rank()), "dp_size": int(dist.get_world_size())}
    except Exception:
        return None


def from_mesh(mesh):
    """Ranks and sizes from a DeviceMesh's named dimensions."""
    names = tuple(getattr(mesh, "mesh_dim_names", None) or ())
    if not names:
        raise ValueError("layout: the DeviceMesh has no dimension names (mesh_dim_names): name "
                         "them ('tp', 'pp', 'dp', 'cp', ...) or pass a dict")
    shape = tuple(int(s) for s in mesh.shape) if hasattr(mesh, "shape") else tuple(mesh.size(i)
                                                                               for i in
                                                                               range(len(names)))
    local = {n: int(mesh.get_local_rank(n)) for n in names}
    size = dict(zip(names, shape))
    out = {}
    for g in ("tp", "pp", "cp", "dp"):
        if g in local:
            out[g + "_rank"], out[g + "_size"] = local[g], size[g]
    if "dp" not in local and ("dp_replicate" in local or "dp_shard" in local):
        rr, rs = local.get("dp_replicate", 0), size.get("dp_replicate", 1)
        sr, ss = local.get("dp_shard", 0), size.get("dp_shard", 1)
        out["dp_rank"], out["dp_size"] = rr * ss + sr, rs * ss
    return out


def resolve(layout, torch, layer_offset=None):
    """The layout as a dict of every field (attnstat._layout.as_dict), or None for no layout.
    Raises ValueError when a pipeline stage's layer_offset is unknown."""
    if layout is None:
        found = None
    elif isinstance(layout, str):
        if layout != "auto":
            raise ValueError("layout is %r: 'auto', None, a dict or a DeviceMesh" % (layout,))
        found = from_megatron()
        if found is None:
            found = from_torch_distributed(torch)
    elif hasattr(layout, "mesh_dim_names") and hasattr(layout, "get_local_rank"):
        found = from_mesh(layout)
    else:
        found = dict(layout) if isinstance(layout, dict) else layout
    if found is None and layer_offset is None:
        return None
    d = _base.as_dict(found, **({} if layer_offset is None else {"layer_offset": layer_offset}))
    given = layer_offset is not None or (isinstance(found, dict) and "layer_offset" in found) or \
        (found is not None and not isinstance(found, dict) and hasattr(found, "layer_offset"))
    if d["pp_size"] > 1 and not given:
        raise ValueError("attnstat.torch.monitor: this process is pipeline stage %d of %d: its "
                         "layers' global numbers need the number of layers the stages before it "
                         "hold. Pass layer_offset=N (the global number of this stage's first "
                         "monitored layer), or layout=None to keep local numbers"
                         % (d["pp_rank"], d["pp_size"]))
    return d


def apply(client, layout, layer_offset, torch, warn):
    """Says the resolved layout to the client (once: a layout the client already has from
    Client(layout=...) is kept unless this one was given explicitly). warn(kind, msg) is the
    monitor's warn-once."""
    explicit = (layout is not None and not isinstance(layout, str)) or layer_offset is not None
    d = resolve(layout, torch, layer_offset)
    if d is None:
        return None
    if getattr(client, "layout", None) is not None and not explicit:
        return client.layout
    set_layout = getattr(client, "set_layout", None)
    if set_layout is None:
        warn("layout", "the client has no set_layout (an older attnstat): heads keep their "
             "local numbers")
        return None
    try:
        set_layout(d)
    except Exception as e:  # an older daemon: monitoring goes on with local numbers
        warn("layout", "the parallel layout was not taken: %s; heads keep their local numbers"
             % (e,))
        return None
    return d
