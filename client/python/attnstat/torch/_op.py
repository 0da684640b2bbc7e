"""The monitor's observation as PyTorch custom operators, so that a compiled graph keeps it.

Under torch.compile (Dynamo tracing a door's wrapper), a door does not push: it describes the call
on the traced tensors and puts one node in the graph,

    attnstat::observe(q, k, mask?, cu_seqlens_q?, cu_seqlens_k?, sinks?, door, layer, causal,
                      scale, window_left, window_right, softcap, layout, compute_dtype) -> ()

(attnstat::note(anchor, door, kind, why) for a call that cannot be described, attnstat::forward
(anchor, model) for a monitored model's forward pre-hook). Each is registered with an ordered
effect: no dead-code elimination although they return nothing, and they run in program order
(layers numbered by call order stay right). At run time Inductor calls the real implementation
with the real tensors; it hands them to whichever monitor is active then (STATE), so
entering or leaving a monitor, or changing `every`, changes nothing the graph was compiled
against: no recompilation. Nothing here reads Python state while tracing.

The fake implementations only say that a graph now holds the observation (STATE.traced):
the doors then stay installed, transparent, after the monitor exits, so that the compiled graph's
guards keep holding when a monitor starts again.
"""
from ._state import STATE

_OPS = None  # (observe, note, forward) once registered


def _register(torch):
    lib = getattr(torch, "library", None)
    custom_op = getattr(lib, "custom_op", None)
    if custom_op is None:
        return None

    def observe_impl(q, k, mask, cu_q, cu_k, sinks, door, layer, heads, causal, scale, wl, wr,
                     softcap, layout, compute_dtype):
        mon = STATE.monitor
        if mon is not None:
            mon._observe_compiled(q, k, mask, cu_q, cu_k, sinks, door, layer, heads, causal,
                                  scale, wl, wr, softcap, layout, compute_dtype)

    def note_impl(anchor, door, kind, why):
        mon = STATE.monitor
        if mon is not None:
            mon._note_compiled(door, kind, why)

    def forward_impl(anchor, model):
        mon = STATE.monitor
        if mon is not None:
            mon._forward_compiled(model)

    def traced(*args):
        STATE.traced = True
        try:  # Inductor's settings while it compiles: mode="reduce-overhead" turns CUDA graphs on
            import torch._inductor.config as ic
            if getattr(getattr(ic, "triton", None), "cudagraphs", False):
                STATE.cudagraphs = True
        except Exception:
            pass
        return None

    def define(name, fn, schema, tags=()):
        if tags:
            try:
                return custom_op(name, fn, mutates_args=(), schema=schema, tags=tags)
            except TypeError:  # a torch whose custom_op takes no tags
                pass
        return custom_op(name, fn, mutates_args=(), schema=schema)

    observe = define(
        "attnstat::observe", observe_impl,
        "(Tensor q, Tensor k, Tensor? mask, Tensor? cu_q, Tensor? cu_k, Tensor? sinks, str door, "
        "int layer, int heads, bool causal, float scale, int wl, int wr, float softcap, "
        "str layout, str compute_dtype) -> ()", _tags(torch))
    note = define("attnstat::note", note_impl,
                  "(Tensor anchor, str door, str kind, str why) -> ()", _tags(torch))
    forward = define("attnstat::forward", forward_impl, "(Tensor anchor, int model) -> ()",
                     _tags(torch))
    for op in (observe, note, forward):
        op.register_fake(traced)
        _ordered(torch, op)
    return observe, note, forward


def _tags(torch):
    """cudagraph_unsafe where Inductor partitions CUDA graphs around such operators (the rest of
    the graph stays captured and the observation runs at every replay); nothing where it would
    instead give up CUDA graphs for the whole graph."""
    tag = getattr(getattr(torch, "Tag", None), "cudagraph_unsafe", None)
    try:
        import torch._inductor.config as ic
        if tag is not None and getattr(ic, "graph_partition", False):
            return (tag,)
    except Exception:
        pass
    return ()


def _ordered(torch, op):
    """An ordered effect on op: kept although it returns nothing, run in program order."""
    try:
        from torch._higher_order_ops.effects import EffectType
        op.register_effect(EffectType.ORDERED)
        return
    except Exception:  # an older PyTorch: the private spelling, else FX's side-effect list
        pass
    try:
        from torch._higher_order_ops import effects
        effects._register_effectful_op(op._opoverload, effects._EffectType.ORDERED)
        return
    except Exception:
        pass
    torch.fx.node.has_side_effect(op._opoverload)


def ops(torch):
    """(observe, note, forward), registered once per process; None where this PyTorch has no
    torch.library.custom_op (compiled code is then left alone, and says so)."""
    global _OPS
    if _OPS is None:
        _OPS = _register(torch) or ()
    return _OPS or None


def _first_tensor(x, torch):
    if isinstance(x, torch.Tensor):
        return x
    if isinstance(x, (tuple, list)):
        for v in x:
            t = _first_tensor(v, torch)
            if t is not None:
                return t
    return None


def emit(torch, door, call, out):
    """While Dynamo traces a door: the call (a _calls.Call or Skip) as a node of the graph.
    door: the _install.Door; out: what the attention returned (its dtype is the precision the
    attention computed in: under autocast, float32 q and k reach a bf16 attention)."""
    o = ops(torch)
    if o is None:
        return
    observe, note, _ = o
    from . import _calls
    if isinstance(call, _calls.Skip):
        anchor = _first_tensor(out, torch)
        if anchor is not None:
            note(anchor, door.name, call.kind, call.why)
        return
    q, k = call.q, call.k
    if door.autocast and torch.float32 in (q.dtype, k.dtype):
        # rounded in the graph, as autocast rounds them for the attention (Inductor fuses the
        # cast into the kernel that makes q, or shares autocast's own): the observation gets
        # 16-bit tensors, which the statistics kernel reads on its fastest path and which cost
        # half as much to copy
        t = _first_tensor(out, torch)
        if t is not None and t.dtype in (torch.bfloat16, torch.float16):
            q, k = q.to(t.dtype), k.to(t.dtype)
    wl, wr = call.window if call.window is not None else (-1, -1)
    observe(q, k, call.attn_mask, call.cu_seqlens_q, call.cu_seqlens_k, call.sinks,
            door.name, -1 if call.layer is None else int(call.layer), int(call.heads or 0),
            bool(call.causal),
            float(call.scale or 0.0), int(wl), int(wr), float(call.softcap or 0.0), call.layout,
            "")


def emit_forward(torch, model_key, args, kwargs):
    """While Dynamo traces a monitored model's forward pre-hook: a node that starts the forward
    pass at run time."""
    o = ops(torch)
    if o is None:
        return
    anchor = _first_tensor(list(args) + list(kwargs.values()), torch)
    if anchor is None:
        anchor = torch.zeros(())
    o[2](anchor, int(model_key))
