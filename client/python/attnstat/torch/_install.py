"""The doors, installed once per process and shared by the monitors that come and go.

A door is an attention function a model reaches attention through (_doors.py says which). To
watch it, its holder's attribute (or mapping entry) is replaced by a wrapper that calls the
original and then hands the call to the active monitor (STATE.monitor), or, while Dynamo traces
it, puts the observation into the graph as a custom operator (_op.py). The wrapper decides at
run time, never from state read while tracing, so a compiled graph is the same whether a monitor
is active or not.

Where the originals live. A door is installed in its home (torch.nn.functional, the
flex_attention module, flash_attn, transformers' attention mapping) and in every loaded module
that holds the original under any name (`from torch.nn.functional import
scaled_dot_product_attention as sdpa` in a model's module, or in __main__). Modules loaded later
are looked at when they appear: refresh() (called at each monitored forward and step) installs the
doors whose home was imported since, and scans the new modules.

Leaving. When the monitor exits, the originals are put back, unless a compiled graph now holds a
door's operator (STATE.traced): the doors then stay, transparent (one Python call per attention
call while no monitor is active), so that the graph's guards on them hold and the next monitor
starts without recompiling the model. uninstall() puts every original back regardless.
"""
import sys
import threading

from . import _op, _unseen
from ._state import CALLS, STATE
_tls = threading.local()         # eager: inside a door (inner doors stay quiet)
_torch = None                    # the torch module, once a monitor has started
_is_compiling = None             # _tracer(torch) (None: a torch without torch.compile)

# Door name -> Door; (id(holder), attribute or key) -> record; id(original) -> (original, Door)
_doors = {}
_patched = {}
_originals = {}
_wrappers = {}                   # id(original) -> its wrapper
_hooks = {}                      # id(model) -> handle of its forward pre-hook
_known_modules = set()
_homes = {}                      # module name -> callable(module) installing that home's doors


class Door(object):
    """One way into attention: name ('sdpa', 'flex', 'flash_attn', 'transformers', 'mha'),
    describe (args, kwargs) -> _calls.Call or _calls.Skip, autocast (whether the door computes
    under autocast: float32 q and k are then rounded to autocast's dtype); claims (args, kwargs)
    -> False for a call the door leaves to the doors inside it (None: every call is the door's)."""

    def __init__(self, name, describe, autocast=False):
        self.name, self.describe, self.autocast = name, describe, autocast
        self.claims = None
        # True for a door whose original Dynamo puts into its graph whole after tracing the
        # wrapper (multi_head_attention_forward): the graph's code calls it by its qualified name,
        # which is the wrapper again, below Dynamo, where the call was already observed
        self.dynamo_only = False


def _tracer(torch):
    """A function saying whether a graph is being traced now: Dynamo, or AOTAutograd's tracing
    below it (a proxy or fake tensor dispatch mode). The second is where the doors inside a
    function Dynamo puts into its graph whole are called (nn.MultiheadAttention's
    multi_head_attention_forward, and with it every nn.TransformerEncoderLayer): their tensors are
    fake there, and the observation goes into the graph as it does under Dynamo. The function
    returns 0 (no tracing), 1 (Dynamo) or 2 (below Dynamo). None: a torch without
    torch.compile."""
    ic = getattr(getattr(torch, "compiler", None), "is_compiling", None)
    C = getattr(torch, "_C", None)
    mode_of = getattr(C, "_get_dispatch_mode", None)
    keys = getattr(C, "_TorchDispatchModeKey", None)
    modes = tuple(getattr(keys, n) for n in ("PROXY", "FAKE") if hasattr(keys, n))
    if ic is None or mode_of is None or not modes:
        return ic

    def tracing():
        if ic():
            return 1
        for key in modes:
            if mode_of(key) is not None:
                return 2
        return 0
    return tracing


def compiling():
    """Whether a graph is being traced now (_tracer)."""
    ic = _is_compiling
    return bool(ic is not None and ic())


def _traced_error(e):
    """A call that could not be put into a graph traced below Dynamo (AOTAutograd's, or a fake
    tensor mode the program entered): counted in the active monitor's errors and said once, as
    an eager call's failure is; raised in strict mode."""
    mon = STATE.monitor
    if mon is None:
        return
    if getattr(mon, "strict", False):
        raise e
    mon.errors += 1
    mon._warn_once("observe", "a call could not be put into the traced graph and was skipped: "
                   "%r" % (e,))


def wrapper_for(orig, door):
    """A wrapper of orig for door: calls orig, then observes the call."""

    def wrapper(*args, **kwargs):
        if door.claims is not None and not door.claims(args, kwargs):
            return orig(*args, **kwargs)  # the doors inside it see the call, as without this one
        t, ic = _torch, _is_compiling
        tr = ic() if ic is not None else 0
        if tr:
            if STATE.trace_depth or (tr == 2 and door.dynamo_only):
                return orig(*args, **kwargs)
            STATE.trace_depth += 1
            try:
                out = orig(*args, **kwargs)
            finally:
                STATE.trace_depth -= 1
            if tr == 1:
                _op.emit(t, door, door.describe(args, kwargs), out)
                return out
            try:  # below Dynamo this is real Python on fake tensors: a failure is counted, said
                _op.emit(t, door, door.describe(args, kwargs), out)
            except Exception as e:
                _traced_error(e)
            return out
        mon = STATE.monitor
        if mon is None or getattr(_tls, "depth", 0):
            return orig(*args, **kwargs)
        CALLS.n = getattr(CALLS, "n", 0) + 1  # the module around this call saw one (_unseen)
        _tls.depth = 1
        try:
            out = orig(*args, **kwargs)
        finally:
            _tls.depth = 0
        mon._observe_eager(door, args, kwargs, out)
        return out
    wrapper.__wrapped__ = orig
    wrapper.__doc__ = getattr(orig, "__doc__", None)
    wrapper.__name__ = getattr(orig, "__name__", "attention")
    wrapper._attnstat_door = door.name
    return wrapper


def is_wrapper(f):
    return getattr(f, "_attnstat_door", None) is not None


def patch(holder, attr, door, item=False):
    """Installs door's wrapper at holder.attr (holder[attr] with item=True), once. True when a
    wrapper is there afterwards."""
    key = (id(holder), attr)
    rec = _patched.get(key)
    cur = holder[attr] if item else getattr(holder, attr, None)
    if rec is not None and cur is rec[3]:
        return True
    if cur is None or is_wrapper(cur):
        return cur is not None
    w = _wrappers.get(id(cur))
    if w is None or w.__wrapped__ is not cur or w._attnstat_door != door.name:
        w = _wrappers[id(cur)] = wrapper_for(cur, door)  # one wrapper per original
    if item:
        holder[attr] = w
    else:
        setattr(holder, attr, w)
    _patched[key] = (holder, attr, cur, w, item)
    if not item:
        _originals[id(cur)] = (cur, door)
    return True


def add_door(door):
    _doors[door.name] = door
    return door


def add_home(module_name, install):
    """install(module) installs the doors whose home is module_name, now if it is loaded, else
    when refresh() first sees it."""
    _homes[module_name] = install
    mod = sys.modules.get(module_name)
    if mod is not None:
        install(mod)


def _skip_module(name):
    return name.startswith(("attnstat", "torch.", "_pytest", "importlib")) or name == "torch"


def scan(names=None):
    """Installs the doors wherever a loaded module holds an original under any name (names: only
    those modules). Returns how many attributes it patched."""
    if not _originals:
        return 0
    n = 0
    mods = sys.modules if names is None else {k: sys.modules.get(k) for k in names}
    for name, mod in list(mods.items()):
        if mod is None or _skip_module(name):
            continue
        d = getattr(mod, "__dict__", None)
        if not isinstance(d, dict):
            continue
        for attr, v in list(d.items()):
            hit = _originals.get(id(v))
            if hit is not None and hit[0] is v:
                n += patch(mod, attr, hit[1])
    return n


def refresh():
    """The modules loaded since the last look: their homes' doors installed, then scanned."""
    if len(sys.modules) == len(_known_modules):
        return 0
    now = set(sys.modules)
    new = now - _known_modules
    _known_modules.clear()
    _known_modules.update(now)
    for name in new:
        inst = _homes.get(name)
        mod = sys.modules.get(name)
        if inst is not None and mod is not None:
            inst(mod)
    return scan(new)


def hook_model(model, torch):
    """A forward pre-hook on model (once): each forward starts a pass of the active monitor (or,
    compiled, an attnstat::forward node that does it at run time)."""
    key = id(model)
    if key in _hooks:
        return

    def hook(module, args, kwargs=None):
        t, ic = _torch, _is_compiling
        if ic is not None and ic():
            _op.emit_forward(t, key, args, kwargs or {})
            return None
        mon = STATE.monitor
        if mon is not None:
            mon._forward_begin(key)
        return None
    try:
        h = model.register_forward_pre_hook(hook, with_kwargs=True)
    except TypeError:  # an older torch (or a stand-in) without with_kwargs
        h = model.register_forward_pre_hook(hook)
    _hooks[key] = h


def watch_modules(model):
    """The attention modules of model watched for forward passes no door saw (_unseen.py)."""
    return _unseen.watch(model, _is_compiling)


def activate(mon, torch):
    global _torch, _is_compiling
    if STATE.monitor is not None and STATE.monitor is not mon:
        raise RuntimeError("attnstat.torch.monitor: another monitor is active in this process "
                           "(%r); leave it first" % (STATE.monitor,))
    _torch = torch
    _is_compiling = _tracer(torch)
    if not _known_modules:
        _known_modules.update(sys.modules)
    STATE.monitor = mon


def deactivate(mon):
    """The monitor leaves: the originals go back unless a compiled graph holds a door."""
    if STATE.monitor is mon:
        STATE.monitor = None
    if not STATE.traced:
        uninstall()


def uninstall():
    """Puts every original back and removes the model hooks. A compiled graph that held a door
    recompiles at its next call."""
    global _torch
    if STATE.monitor is not None:
        raise RuntimeError("attnstat.torch.uninstall: a monitor is active; leave it first")
    for key, (holder, attr, orig, w, item) in list(_patched.items()):
        # Someone who wrapped our wrapper after us keeps theirs; ours is then a pass-through.
        try:
            if item:
                if holder[attr] is w:
                    holder[attr] = orig
            elif getattr(holder, attr, None) is w:
                setattr(holder, attr, orig)
        except Exception:
            pass
    _patched.clear()
    _originals.clear()
    _wrappers.clear()
    _doors.clear()
    _homes.clear()
    _known_modules.clear()
    for h in list(_hooks.values()):
        try:
            h.remove()
        except Exception:
            pass
    _hooks.clear()
    _unseen.unwatch()
    STATE.traced = STATE.cudagraphs = False
    _torch = None


def installed():
    """What is installed: {door name: number of places}."""
    out = {}
    for holder, attr, orig, w, item in _patched.values():
        out[w._attnstat_door] = out.get(w._attnstat_door, 0) + 1
    return out
