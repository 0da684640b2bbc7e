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
  - with model=, the DTensor placements of the attention's query projections (q_proj, wq, ...):
    a Shard(0) weight on a mesh dimension is tensor parallelism over that dimension (torchtitan's
    and PyTorch's ColwiseParallel, transformers' tp_plan), its local rank and size the TP rank and
    size; the mesh's other named dimensions as below; else the device mesh transformers keeps for
    a model loaded with a tp_plan;
    (under FSDP, fully_shard or the wrapper, its Shard(0) on the data-parallel dimension is not
    tensor parallelism: FSDP gathers the rows for each forward);
  - torch.distributed, once initialised: every rank a data-parallel replica (DDP, FSDP);
  - else nothing (a single process).
With model= and a configuration that names its heads (config.num_attention_heads), the heads the
query projection holds in this process must be the configured ones over tp_size: a process that
holds a shard of the heads that no layout explains refuses to start (its local heads would be
stored as global ones, and pooled with other ranks' different heads).
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
    # HSDP: replicas x shards; torchtitan folds context parallelism into the shard dimension of
    # the mesh it gives FSDP ("dp_shard_cp"), so any "dp_shard*" dimension is the shard one
    shard = next((n for n in names if n.startswith("dp_shard")), None)
    if "dp" not in local and ("dp_replicate" in local or shard is not None):
        rr, rs = local.get("dp_replicate", 0), size.get("dp_replicate", 1)
        sr, ss = (local[shard], size[shard]) if shard is not None else (0, 1)
        out["dp_rank"], out["dp_size"] = rr * ss + sr, rs * ss
    return out


_Q_NAMES = ("q_proj", "wq", "query", "to_q", "q", "query_proj")


def _named_modules(model):
    f = getattr(model, "named_modules", None)
    if not callable(f):
        return []
    try:
        return list(f())
    except Exception:
        return []


def _is_dtensor(t):
    return hasattr(t, "placements") and hasattr(t, "device_mesh") and callable(
        getattr(t, "to_local", None))


def _query_weights(model):
    """(name, weight) of every query projection of the model, in module order."""
    out = []
    for name, mod in _named_modules(model):
        if name.rsplit(".", 1)[-1] in _Q_NAMES:
            w = getattr(mod, "weight", None)
            if w is not None and hasattr(w, "shape"):
                out.append((name, w))
    return out


# FSDP's module classes (fully_shard's, in the releases that have had it, and the wrapper's)
_FSDP_CLASSES = (("torch.distributed.fsdp", "FSDPModule"),
                 ("torch.distributed._composable.fsdp", "FSDPModule"),
                 ("torch.distributed.fsdp", "FullyShardedDataParallel"))


def _dp_named(n):
    """A mesh dimension named for data parallelism: torchtitan's "dp*", Lightning's
    "data_parallel", "fsdp", "hsdp", "ddp", "*shard*", "*replicate*"."""
    n = n.lower()
    return n.startswith("dp") or any(w in n for w in ("data", "fsdp", "hsdp", "ddp", "shard",
                                                      "replicate"))


def _tp_named(n):
    """A mesh dimension named for tensor parallelism: "tp", "tp_*", "*tensor*" (Lightning's
    "tensor_parallel"), "mp", "model_parallel"."""
    n = n.lower()
    return n in ("tp", "mp") or n.startswith("tp_") or "tensor" in n or "model_parallel" in n


def _fsdp(model):
    """(whether FSDP shards the model's parameters: fully_shard, or the FullyShardedDataParallel
    wrapper; the number of dimensions of fully_shard's own mesh, when its state says, else None).
    FSDP gathers the parameters for each forward, so its Shard(0) of a query projection is not
    tensor parallelism, and the rows a process holds between forwards say nothing of the heads
    its attention computes."""
    classes = []
    for mod_name, cls_name in _FSDP_CLASSES:
        c = getattr(sys.modules.get(mod_name), cls_name, None)
        if isinstance(c, type):
            classes.append(c)
    found, ndim = False, None
    for _, mod in _named_modules(model):
        if not ((classes and isinstance(mod, tuple(classes))) or
                type(mod).__name__.startswith(("FSDP", "FullyShardedDataParallel"))):
            continue
        found = True
        try:  # fully_shard's state: the mesh it shards over (a private attribute: may move)
            group = mod._get_fsdp_state()._fsdp_param_group
            ndim = int(group.mesh_info.mesh.ndim)
            break
        except Exception:
            continue
    return found, ndim


def _tp_dims(w, fsdp):
    """The dimensions of DTensor w's mesh on which its rows are sharded for tensor parallelism.
    fsdp: _fsdp(model). A dimension named for it ('tp', 'tensor_parallel', ...) is; under FSDP,
    FSDP's own dimensions are not: the leading ones, as many as fully_shard's mesh has (its
    parameters' mesh is its own, then tensor parallelism's); where its state cannot be read, the
    first sharded dimension (FSDP's dimensions lead the mesh, HSDP's replicated one first, so a
    (Replicate, Shard) mesh is HSDP's whatever its names) and those named for data parallelism;
    without FSDP, every sharded dimension not named for data parallelism."""
    found, ndim = fsdp
    pl = tuple(w.placements)
    names = tuple(getattr(w.device_mesh, "mesh_dim_names", None) or ())
    names = names + ("",) * (len(pl) - len(names))
    dims = [i for i, p in enumerate(pl) if _shard_dim(p) == 0]
    tp = [i for i in dims if _tp_named(names[i])]
    if tp:
        return tp
    if found and ndim is not None:
        return [i for i in dims if i >= ndim]
    if found:
        dims = dims[1:]
    return [i for i in dims if not _dp_named(names[i])]


def _shard_dim(p):
    is_shard = getattr(p, "is_shard", None)
    try:
        if callable(is_shard) and not is_shard():
            return None
    except Exception:
        return None
    d = getattr(p, "dim", None)
    return d if isinstance(d, int) else None


def _replicas(torch, tp_size, group_ranks):
    """dp_rank / dp_size of a process whose TP group holds group_ranks (global ranks), when the
    mesh does not name them: the other ranks of the world are replicas of this group."""
    dist = getattr(torch, "distributed", None)
    try:
        world = int(dist.get_world_size()) if dist is not None and dist.is_initialized() else 0
    except Exception:
        world = 0
    if world <= tp_size or world % tp_size or not group_ranks:
        return {}
    g = sorted(group_ranks)
    size = world // tp_size
    if g == list(range(g[0], g[0] + tp_size)) and g[0] % tp_size == 0:  # TP innermost
        return {"dp_rank": g[0] // tp_size, "dp_size": size}
    if all(b - a == size for a, b in zip(g, g[1:])) and g[0] < size:    # TP outermost
        return {"dp_rank": g[0], "dp_size": size}
    return {}


def _mesh_ranks(mesh):
    m = getattr(mesh, "mesh", None)
    try:
        return [int(r) for r in m.flatten().tolist()]
    except Exception:
        return []


def from_model(model, torch):
    """Tensor parallelism from the model: the DTensor placements of its query projections, else
    the device mesh transformers keeps for a model loaded with a tp_plan. None when neither says
    anything."""
    fsdp = _fsdp(model)
    for name, w in _query_weights(model):
        if not _is_dtensor(w):
            continue
        mesh = w.device_mesh
        names = tuple(getattr(mesh, "mesh_dim_names", None) or ())
        dims = _tp_dims(w, fsdp)
        if not dims:
            return {}  # replicated heads, or FSDP's shards: no tensor parallelism of attention
        if len(dims) > 1:
            raise ValueError("attnstat.torch.monitor: %s.weight is sharded along its rows on "
                             "mesh dimensions %s (%s): which one is tensor parallelism is not "
                             "clear; pass layout=... (a dict or a DeviceMesh with a 'tp' "
                             "dimension)" % (name, dims, names or "unnamed"))
        i = dims[0]
        out = {"tp_rank": int(mesh.get_local_rank(i)), "tp_size": int(mesh.size(i))}
        if names:
            rest = from_mesh(mesh)
            for g in ("pp", "cp", "dp"):
                if g + "_size" in rest:
                    out[g + "_rank"], out[g + "_size"] = rest[g + "_rank"], rest[g + "_size"]
        if "dp_size" not in out:
            out.update(_replicas(torch, out["tp_size"], _sub_ranks(torch, mesh, i)))
        return out
    mesh = getattr(model, "_device_mesh", None)
    if mesh is not None and getattr(model, "_tp_plan", None):
        names = tuple(getattr(mesh, "mesh_dim_names", None) or ())
        i = names.index("tp") if "tp" in names else (0 if len(tuple(mesh.shape)) == 1 else None)
        if i is None:
            return None
        out = {"tp_rank": int(mesh.get_local_rank(i)), "tp_size": int(mesh.size(i))}
        out.update(_replicas(torch, out["tp_size"], _sub_ranks(torch, mesh, i)))
        return out
    return None


def _sub_ranks(torch, mesh, i):
    """The global ranks of this process's group along mesh dimension i."""
    if len(tuple(getattr(mesh, "shape", ()) or ())) == 1:
        return _mesh_ranks(mesh)
    try:
        return [int(r) for r in torch.distributed.get_process_group_ranks(mesh.get_group(i))]
    except Exception:
        return []


def model_heads(model):
    """(configured query heads, query heads the first query projection holds in this process,
    its name), or None when the model does not say."""
    cfg = getattr(model, "config", None)
    heads = getattr(cfg, "num_attention_heads", None)
    if not isinstance(heads, int) or heads < 1:
        return None
    hd = getattr(cfg, "head_dim", None)
    if not isinstance(hd, int) or hd < 1:
        hidden = getattr(cfg, "hidden_size", None)
        if not isinstance(hidden, int) or hidden % heads:
            return None
        hd = hidden // heads
    fsdp = _fsdp(model)
    for name, w in _query_weights(model):
        if _is_dtensor(w):  # the whole projection's rows over its tensor-parallel shards
            rows = int(w.shape[0])
            for i in _tp_dims(w, fsdp):
                rows //= max(1, int(w.device_mesh.size(i)))
        elif fsdp[0] and (len(tuple(w.shape)) != 2 or int(w.shape[0]) == 0):
            return None  # the FSDP wrapper's view of a flat shard: no rows of heads here
        else:
            rows = int(w.shape[0])
        if rows % hd:
            return None
        return heads, rows // hd, name
    return None


def check_heads(model, d):
    """Refuses (ValueError) a process whose query projection holds other heads than the
    configuration's over the layout's tp_size."""
    mh = model_heads(model)
    if mh is None:
        return
    heads, local, name = mh
    tp = int((d or {}).get("tp_size", 1) or 1)
    if local * tp == heads:
        return
    raise ValueError(
        "attnstat.torch.monitor: the model's configuration has %d attention heads, but %s holds "
        "%d in this process%s: a shard of the heads (tensor parallelism?) that the layout does "
        "not explain. Monitoring would store this process's heads as heads 0..%d of the whole "
        "layer and pool them with other ranks' different heads. Pass layout={'tp_rank': r, "
        "'tp_size': n} or a DeviceMesh with a 'tp' dimension (or shard the projections as "
        "DTensors, which layout='auto' reads)"
        % (heads, name, local, "" if tp == 1 else " with tp_size %d" % tp, local - 1))


def resolve(layout, torch, layer_offset=None, model=None):
    """The layout as a dict of every field (attnstat._layout.as_dict), or None for no layout.
    Raises ValueError when a pipeline stage's layer_offset is unknown."""
    if layout is None:
        found = None
    elif isinstance(layout, str):
        if layout != "auto":
            raise ValueError("layout is %r: 'auto', None, a dict or a DeviceMesh" % (layout,))
        found = from_megatron()
        if found is None and model is not None:
            found = from_model(model, torch) or None
            if found is not None and "dp_size" not in found:
                rest = from_torch_distributed(torch)
                if rest is not None and found.get("tp_size", 1) == rest["dp_size"]:
                    found.update(dp_rank=0, dp_size=1)  # the whole world is one TP group
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


def apply(client, layout, layer_offset, torch, warn, model=None):
    """Says the resolved layout to the client (once: a layout the client already has from
    Client(layout=...) is kept unless this one was given explicitly) and returns it (a dict), or
    None. With model=, refuses (ValueError) a process that holds heads no layout explains.
    warn(kind, msg) is the monitor's warn-once."""
    explicit = (layout is not None and not isinstance(layout, str)) or layer_offset is not None
    d = resolve(layout, torch, layer_offset, model)
    if getattr(client, "layout", None) is not None and not explicit:
        d = client.layout
    if model is not None and layout is not None:
        check_heads(model, d)
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
