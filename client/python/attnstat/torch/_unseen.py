"""Attention modules that ran without a call any door saw: the monitor's check against a model
it watches only in part.

A forward pass in which no door saw a call at all is counted as blind (_monitor.py). A model whose
attention goes through a door in some layers and past every door in others (a layer on a fused
library kernel, attention written out with matmul and softmax, nn.MultiheadAttention's weights
path, PyTorch's inference fast path) would otherwise look monitored while some of its layers are
not. With model=, the innermost modules whose class name says attention (LlamaAttention,
MultiheadAttention, timm's Attention, TransformerEngine's DotProductAttention backends) get a
forward pre-hook and a forward hook: a module whose forward ended without a door call in this
thread since it began is counted by class (monitor.unseen_by) and said once per class.

Eager forward passes only: while Dynamo traces, the hooks return at once (nothing of them enters a
compiled graph). Installed once per module and kept while a compiled graph holds the doors (so
that its guards on the hooks keep holding, as the doors do), removed with them otherwise.
"""
import re

from ._state import CALLS, STATE

_ATTENTION = re.compile("attention", re.IGNORECASE)
_watched = {}  # id(module) -> (pre-hook handle, hook handle)


def _says_attention(m):
    return _ATTENTION.search(type(m).__name__) is not None


def attention_modules(model):
    """[(qualified name, module)]: model's modules whose class name says attention and that hold
    no such module themselves (the one that runs the attention, not its container)."""
    named = getattr(model, "named_modules", None)
    if not callable(named):
        return []
    out = []
    for name, m in named():
        if not _says_attention(m):
            continue
        subs = getattr(m, "modules", None)
        inner = callable(subs) and any(s is not m and _says_attention(s) for s in subs())
        if not inner:
            out.append((name, m))
    return out


def door_calls():
    """The door calls this thread made while a monitor was active."""
    return getattr(CALLS, "n", 0)


def watch(model, is_compiling):
    """Hooks on model's attention modules (once per module). Returns how many are watched."""
    ic = is_compiling
    for name, m in attention_modules(model):
        if id(m) in _watched:
            continue
        began = []  # the door calls when each running forward of m began (a stack: re-entry)

        def pre(mod, args, _began=began):
            if ic is not None and ic():
                return None
            if STATE.monitor is not None:
                _began.append(door_calls())
            return None

        def post(mod, args, out, _began=began, _name=name):
            if ic is not None and ic():
                return None
            if not _began:
                return None
            start = _began.pop()
            mon = STATE.monitor
            if mon is not None and door_calls() == start:
                mon._unseen(type(mod).__name__, _name)
            return None
        try:
            _watched[id(m)] = (m.register_forward_pre_hook(pre), m.register_forward_hook(post))
        except Exception:  # a module that takes no hooks: left unwatched
            continue
    return len(_watched)


def unwatch():
    for hp, hf in list(_watched.values()):
        for h in (hp, hf):
            try:
                h.remove()
            except Exception:
                pass
    _watched.clear()
