"""attnstat.torch.monitor: the statistics of every attention call of an unmodified PyTorch model.

    client = attnstat.Client(run="llama-1b", rank=rank)
    with attnstat.torch.monitor(client, every=10, model=model):   # one forward = one step
        for batch in loader:
            loss = model(**batch).loss; loss.backward(); opt.step()

or, without model= (gradient accumulation, several forwards per step):

    with attnstat.torch.monitor(client, every=10) as mon:
        for batch in loader:
            ...
            mon.step()                  # or mon.step(global_step)

The doors it watches (doors="auto": every one that is importable):
  - 'sdpa': torch.nn.functional.scaled_dot_product_attention, attn_mask included (boolean or
    additive, broadcastable to [B, H, Nq, Nk]);
  - 'flex': torch.nn.attention.flex_attention.flex_attention, a BlockMask's mask_mod evaluated
    into a dense boolean mask on the device (at most mask_bytes_max bytes; calls with a score_mod
    are skipped);
  - 'flash_attn': FlashAttention's flash_attn_func and flash_attn_varlen_func (cu_seqlens as
    packed sequences, causal, window_size, softcap), when the package is importable;
  - 'transformers': with model= a transformers model, the attention function its config names
    (sdpa, eager, flash_attention_2/3, flex_attention) is wrapped in transformers' attention
    interface, so that every call is seen with the model's own mask and the layer number is the
    module's layer_idx; the doors above then stay quiet inside it (no call is pushed twice).
While active, each door's function is replaced by a wrapper that calls the original, then pushes
(query, key) of every call of every `every`-th step: layer = the module's layer_idx
(transformers) or the index of the call within the forward pass. The originals are put back on
exit, exceptions included. Modules that imported a function by name (`from
torch.nn.functional import scaled_dot_product_attention`) do not see the patch: pass them as
modules=[...] and their attribute is patched too.

Precision: under autocast, q and k often reach attention as float32 (rotary tables are float32)
while the attention runs in the autocast dtype; compute_dtype='auto' (the default) tells the
daemon to compute the logits in the autocast dtype for the sdpa and eager doors, so that the
statistics are those of the attention the model computed (and run on the tensor cores).

Nothing is lost in silence: a call that cannot be described exactly is skipped, counted in
.skipped (.skipped_by[kind]) and warned about once per kind; a push the daemon rejects or drops
is counted in .rejected / .dropped (.rejected_by[reason]) and warned about once per reason, with
the daemon's own words; a push that fails here is counted in .errors and warned about once
(strict=True raises instead). Telemetry never stops training. CUDA tensors go to the daemon
without a copy and without a device synchronisation; the client keeps them alive until the
daemon has read them. Where the library has no GPU path, CUDA calls are skipped after one
warning, or copied to the host with copy_to_host=True (that synchronises the device).
"""
import re
import sys
import threading
import warnings

from .._client import AttnstatError
from .. import _lib
from . import _calls, _layout

_DOORS = ("sdpa", "flex", "flash_attn", "transformers")
_DIGITS = re.compile(r"[0-9][0-9.,e+-]*")


class monitor(object):
    """Context manager; see the module's documentation.

    client: an attnstat.Client. every: push every N-th step (1: every step). start_step: the step
    number of the first step. model: an nn.Module whose forward pre-hook starts each forward pass
    (and, with auto_step, each step); a transformers model also opens the 'transformers' door.
    auto_step: advance the step at every forward of model (default: True when model is given).
    layers: a container of layer indices to push (None: all). sample_every, sample_rows, seed,
    softcap, window, want_results: passed to push(). modules: further modules whose
    scaled_dot_product_attention attribute is patched. doors: 'auto' or a sequence of door names
    ('sdpa', 'flex', 'flash_attn', 'transformers'). compute_dtype: 'auto' (the autocast dtype
    where the door computes under autocast), None (the tensors' own) or a dtype name.
    mask_bytes_max: the largest dense mask a flex_attention BlockMask is evaluated into.
    compiled: what happens inside torch.compile'd code: 'skip' (default: nothing is pushed, the
    compiled graph is untouched) or 'break' (a graph break around each push, so compiled models
    are monitored too, at the price of the break; not with fullgraph=True).
    layout: this process's parallel layout, said to the daemon at __enter__ so that its heads and
    layers get global numbers: 'auto' (Megatron-core's groups, else torch.distributed's ranks as
    replicas), None, a dict or a DeviceMesh (torch/_layout.py). layer_offset: a pipeline stage's
    first global layer (needed when the layout has pp_size > 1).
    """

    def __init__(self, client, every=1, sample_rows=0, sample_every=0, seed=0, model=None,
                 auto_step=None, start_step=0, layers=None, softcap=0.0, window=None,
                 want_results=False, modules=(), copy_to_host=False, strict=False,
                 compiled="skip", doors="auto", compute_dtype="auto", mask_bytes_max=256 << 20,
                 layout="auto", layer_offset=None):
        if compiled not in ("skip", "break"):
            raise ValueError("compiled is %r: 'skip' or 'break'" % (compiled,))
        if int(every) < 1:
            raise ValueError("every is %r: must be >= 1" % (every,))
        if doors != "auto":
            doors = tuple(doors)
            unknown = [d for d in doors if d not in _DOORS]
            if unknown:
                raise ValueError("unknown door(s) %s: choose among %s" % (unknown, _DOORS))
        self.client = client
        self.every = int(every)
        self.model = model
        self.auto_step = (model is not None) if auto_step is None else bool(auto_step)
        if self.auto_step and model is None:
            raise ValueError("auto_step needs model=: the forward pre-hook is what counts steps")
        self.layers = layers
        self.copy_to_host = bool(copy_to_host)
        self.strict = bool(strict)
        self.modules = list(modules)
        self.compiled = compiled
        self.doors = doors
        self.compute_dtype = compute_dtype
        self.mask_bytes_max = int(mask_bytes_max)
        self.layout, self.layer_offset = layout, layer_offset
        self._push_kw = dict(sample_rows=sample_rows, sample_every=sample_every, seed=seed,
                             want_results=want_results)
        self._softcap = float(softcap or 0.0)
        self._window = tuple(window) if window is not None else None
        self.current_step = int(start_step)
        self.layer_index = 0
        self.calls = 0
        self.pushed = 0
        self.dropped = 0
        self.skipped = 0
        self.errors = 0
        self.rejected = 0
        self.skipped_by = {}
        self.rejected_by = {}
        self.doors_open = []
        self._lock = threading.Lock()
        self._tls = threading.local()  # depth: inside a door's original (inner doors stay quiet)
        self._started_forward = False
        self._warned = set()
        self._patched = []       # (holder, attribute or key, original, wrapper, kind)
        self._hook = None
        self._active = False
        self._gpu_off = False
        self._torch = None
        self._ack_cb = None
        self._observe = self._observe_eager

    # ---- the user's side ------------------------------------------------------------------------
    def step(self, step=None):
        """Ends the current step: the next call is layer 0 of step + 1 (or of `step`)."""
        with self._lock:
            self.current_step = self.current_step + 1 if step is None else int(step)
            self.layer_index = 0
            self._started_forward = False

    def new_forward(self):
        """Starts a forward pass within the current step: the next call is layer 0."""
        with self._lock:
            self.layer_index = 0

    @property
    def sampling(self):
        """Whether the current step is one that is pushed."""
        return self.current_step % self.every == 0

    def stats(self):
        """The monitor's counters as a dict."""
        return {"calls": self.calls, "pushed": self.pushed, "dropped": self.dropped,
                "skipped": self.skipped, "rejected": self.rejected, "errors": self.errors,
                "skipped_by": dict(self.skipped_by), "rejected_by": dict(self.rejected_by),
                "doors": list(self.doors_open)}

    def __enter__(self):
        import torch  # only here: the rest of attnstat never imports it
        self._torch = torch
        _layout.apply(self.client, self.layout, self.layer_offset, torch, self._warn_once)
        self._observe = self._observe_eager
        if self.compiled == "break":
            disable = getattr(getattr(torch, "compiler", None), "disable", None)
            if disable is not None:  # a graph break: the push runs eagerly, on real tensors
                self._observe = disable(self._observe_eager)
        try:
            self._open_doors()
            if self.model is not None:
                self._hook = self.model.register_forward_pre_hook(self._pre_hook)
        except BaseException:
            self._restore()
            raise
        on_rejected = getattr(self.client, "on_rejected", None)
        if self._ack_cb is None and callable(on_rejected):
            self._ack_cb = on_rejected(self._on_rejected)
        self._active = True
        return self

    def __exit__(self, *exc):
        self._restore()
        return False

    # ---- doors ----------------------------------------------------------------------------------
    def _want(self, door):
        return self.doors == "auto" or door in self.doors

    def _open_doors(self):
        import torch.nn.functional as F
        t = self._torch
        if self._want("transformers") and self.model is not None:
            if self._open_transformers():
                self.doors_open.append("transformers")
            elif self.doors != "auto":
                raise ValueError("doors names 'transformers' but model is not a transformers "
                                 "model (no config._attn_implementation)")
        if self._want("sdpa"):
            sdpa = self._door(_calls.from_sdpa, autocast=True)
            for m in [F] + [m for m in self.modules if m is not F]:
                self._patch(m, "scaled_dot_product_attention", sdpa)
            self.doors_open.append("sdpa")
        if self._want("flex"):
            fa = sys.modules.get("torch.nn.attention.flex_attention")
            if fa is None:
                try:
                    import torch.nn.attention.flex_attention as fa
                except Exception:
                    fa = None
            if fa is not None and hasattr(fa, "flex_attention"):
                mb = self.mask_bytes_max
                self._patch(fa, "flex_attention",
                            self._door(lambda a, k: _calls.from_flex(a, k, mb)))
                for m in self.modules:
                    if hasattr(m, "flex_attention"):
                        self._patch(m, "flex_attention",
                                    self._door(lambda a, k: _calls.from_flex(a, k, mb)))
                self.doors_open.append("flex")
            elif self.doors != "auto":
                raise ValueError("doors names 'flex' but this torch (%s) has no flex_attention"
                                 % t.__version__)
        if self._want("flash_attn"):
            mods = []
            try:
                import flash_attn
                mods.append(flash_attn)
                iface = getattr(flash_attn, "flash_attn_interface", None)
                if iface is not None:
                    mods.append(iface)
            except Exception:
                if self.doors != "auto":
                    raise
            mods += [m for m in self.modules if hasattr(m, "flash_attn_func")
                     or hasattr(m, "flash_attn_varlen_func")]
            for m in mods:
                if hasattr(m, "flash_attn_func"):
                    self._patch(m, "flash_attn_func", self._door(_calls.from_flash))
                if hasattr(m, "flash_attn_varlen_func"):
                    self._patch(m, "flash_attn_varlen_func", self._door(_calls.from_flash_varlen))
            if mods:
                self.doors_open.append("flash_attn")

    def _open_transformers(self):
        """Wraps the model's attention function in transformers' interface (and the modeling
        modules' eager_attention_forward). False when model is not a transformers model."""
        cfg = getattr(self.model, "config", None)
        impl = getattr(cfg, "_attn_implementation", None)
        if not isinstance(impl, str):
            return False
        try:
            from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
        except Exception:
            return False
        mb = self.mask_bytes_max
        autocast = impl.split("|")[-1] in ("sdpa", "eager")

        def describe(impl_name):
            def from_args(args, kwargs):
                a = list(args) + [None] * max(0, 5 - len(args))
                module, query, key = a[0], a[1], a[2]
                mask = kwargs.get("attention_mask", a[4])
                kw = dict(kwargs)
                scaling = kw.pop("scaling", None)
                return _calls.from_transformers(impl_name, module, query, key, mask, scaling,
                                                kw, mb)
            return from_args

        if impl != "eager":
            try:
                orig = ALL_ATTENTION_FUNCTIONS[impl]
            except Exception:
                orig = None
            if orig is not None:
                self._patch_mapping(ALL_ATTENTION_FUNCTIONS, impl,
                                    self._door(describe(impl), autocast=autocast, wrap=orig))
        if impl == "eager" or "eager" in impl:
            seen = set()
            for sub in self.model.modules():
                mod = sys.modules.get(type(sub).__module__)
                if mod is None or id(mod) in seen or not hasattr(mod, "eager_attention_forward"):
                    continue
                seen.add(id(mod))
                self._patch(mod, "eager_attention_forward",
                            self._door(describe("eager"), autocast=True))
        return True

    def _door(self, describe, autocast=False, wrap=None):
        """A factory of wrappers: given the original, a function that calls it and then observes
        the call as `describe(args, kwargs)` describes it (inner doors stay quiet meanwhile)."""
        mon = self

        def make(orig):
            def wrapper(*args, **kwargs):
                tls = mon._tls
                depth = getattr(tls, "depth", 0)
                tls.depth = depth + 1
                try:
                    out = orig(*args, **kwargs)
                finally:
                    tls.depth = depth
                if mon._active and depth == 0:
                    try:
                        mon._observe(describe, autocast, args, kwargs)
                    except Exception as e:  # describing a call never stops the forward pass
                        if mon.strict:
                            raise
                        mon.errors += 1
                        mon._warn_once("observe", "a call could not be described and was "
                                       "skipped: %r" % (e,))
                return out
            wrapper.__wrapped__ = orig
            wrapper.__doc__ = getattr(orig, "__doc__", None)
            wrapper.__name__ = getattr(orig, "__name__", "attention")
            return wrapper
        return make if wrap is None else make(wrap)

    def _patch(self, holder, attr, make):
        orig = getattr(holder, attr)
        w = make(orig)
        setattr(holder, attr, w)
        self._patched.append((holder, attr, orig, w, "attr"))

    def _patch_mapping(self, mapping, key, wrapper):
        orig = mapping[key]
        mapping[key] = wrapper
        self._patched.append((mapping, key, orig, wrapper, "item"))

    def _restore(self):
        self._active = False
        if self._hook is not None:
            try:
                self._hook.remove()
            finally:
                self._hook = None
        while self._patched:
            holder, attr, orig, w, kind = self._patched.pop()
            # Someone who wrapped our wrapper after us keeps theirs; ours is then a pass-through.
            if kind == "attr":
                if getattr(holder, attr, None) is w:
                    setattr(holder, attr, orig)
            else:
                try:
                    if holder[attr] is w:
                        holder[attr] = orig
                except Exception:
                    pass
        self.doors_open = []

    def _pre_hook(self, module, args):
        with self._lock:
            if self.auto_step and self._started_forward:
                self.current_step += 1
            self._started_forward = True
            self.layer_index = 0
        return None

    # ---- observing ------------------------------------------------------------------------------
    def _compiling(self):
        t = self._torch
        for path in (("compiler", "is_compiling"), ("_dynamo", "is_compiling"),
                     ("jit", "is_tracing")):
            f = t
            for p in path:
                f = getattr(f, p, None)
            if callable(f):
                try:
                    if f():
                        return True
                except Exception:
                    pass
        return False

    def _graph_capturing(self):
        """Whether the current CUDA stream is capturing a graph (for CUDA tensors only)."""
        cuda = getattr(self._torch, "cuda", None)
        try:
            return bool(cuda.is_available() and cuda.is_current_stream_capturing())
        except Exception:
            return False

    def _warn_once(self, kind, msg):
        if kind not in self._warned:
            self._warned.add(kind)
            warnings.warn("attnstat.torch.monitor: " + msg, RuntimeWarning, stacklevel=5)

    def _skip(self, kind, why):
        self.skipped += 1
        self.skipped_by[kind] = self.skipped_by.get(kind, 0) + 1
        self._warn_once("skip:" + kind, why + " (counted in .skipped_by[%r])" % kind)

    def _on_rejected(self, seq, step, layer, code, message):
        """The daemon dropped or refused a push: counted and said once per reason."""
        if not self._active:
            return
        reason = "%s: %s" % (_lib.PROTO_CODE_NAMES.get(code, "code %d" % code),
                             _DIGITS.sub("N", message or "").strip())
        self.rejected += 1
        self.rejected_by[reason] = self.rejected_by.get(reason, 0) + 1
        self._warn_once("rejected:" + reason,
                        "the daemon did not store a push (step %d, layer %d): %s: %s (counted in "
                        ".rejected_by; further pushes for this reason are not warned about)"
                        % (step, layer, _lib.PROTO_CODE_NAMES.get(code, "code %d" % code),
                           message))

    def _autocast_dtype(self, q):
        """The dtype the logits are computed in under autocast, or None."""
        if self.compute_dtype != "auto":
            return self.compute_dtype
        t = self._torch
        if str(q.dtype) != "torch.float32":
            return None
        dev = getattr(getattr(q, "device", None), "type", "cpu")
        try:
            if not t.is_autocast_enabled(dev):
                return None
            return str(t.get_autocast_dtype(dev)).replace("torch.", "")
        except Exception:
            return None

    def _observe_eager(self, describe, autocast, args, kwargs):
        if self._compiling():
            return
        with self._lock:
            index = self.layer_index
            self.layer_index += 1
            step = self.current_step
            self.calls += 1
        if step % self.every != 0:
            return
        call = describe(args, kwargs)
        if isinstance(call, _calls.Skip):
            self._skip(call.kind, call.why)
            return
        layer = call.layer if call.layer is not None else index
        if self.layers is not None and layer not in self.layers:
            return
        q, k = call.q, call.k
        if getattr(q, "is_cuda", False):
            if self._graph_capturing():  # no push (event record, IPC, copy) inside a capture
                self._skip("graph", "calls made while a CUDA graph is being captured are not "
                           "monitored")
                return
            if self.copy_to_host:
                call.q, call.k = q.detach().cpu(), k.detach().cpu()
                if call.attn_mask is not None:
                    call.attn_mask = call.attn_mask.detach().cpu()
            elif self._gpu_off:
                self._skip("gpu", "CUDA calls are not monitored: this libattnstat has no GPU path")
                return
        kw = call.push_kwargs()
        kw.update(self._push_kw)
        if self._softcap and not call.softcap:
            kw["softcap"] = self._softcap
        if self._window is not None and call.window is None:
            kw["window"] = self._window
        if autocast:
            cd = self._autocast_dtype(q)
            if cd is not None:
                kw["compute_dtype"] = cd
        elif self.compute_dtype not in ("auto", None):
            kw["compute_dtype"] = self.compute_dtype
        try:
            sent = self.client.push(step, layer, call.q, call.k, **kw)
        except Exception as e:  # a failing push or callback never stops the forward pass
            if self.strict:
                raise
            if isinstance(e, AttnstatError) and e.code == _lib.ENOTSUP:
                if getattr(q, "is_cuda", False) and "CUDA" in str(e):
                    self._gpu_off = True
                self._skip("unsupported", "%s" % e)
                return
            self.errors += 1
            self._warn_once("push", "a push failed and was skipped: %s" % e)
            return
        if sent:
            self.pushed += 1
        else:
            self.dropped += 1
            self._warn_once("dropped", "a push was dropped by the client library (%s); drops "
                            "are counted in .dropped and in client.stats()"
                            % (self.client.stats().get("last_error") or "ring, queue or held "
                               "budget full"))

    def __repr__(self):
        return ("<attnstat.torch.monitor step=%d every=%d calls=%d pushed=%d dropped=%d skipped=%d "
                "rejected=%d errors=%d doors=%s%s>"
                % (self.current_step, self.every, self.calls, self.pushed, self.dropped,
                   self.skipped, self.rejected, self.errors, ",".join(self.doors_open) or "-",
                   " active" if self._active else ""))


Monitor = monitor
