"""attnstat.torch.monitor: statistics of every scaled_dot_product_attention call of an unmodified
PyTorch model.

    client = attnstat.Client(run="gpt-small", rank=rank)
    with attnstat.torch.monitor(client, every=10, model=model):   # one forward = one step
        for batch in loader:
            loss = model(batch); loss.backward(); opt.step()

or, without model= (gradient accumulation, several forwards per step):

    with attnstat.torch.monitor(client, every=10) as mon:
        for batch in loader:
            ...
            mon.step()                  # or mon.step(global_step)

While active, torch.nn.functional.scaled_dot_product_attention is replaced by a wrapper that calls
the original, then pushes (query, key) of every call of every `every`-th step: layer = the index of
the call within the forward pass, is_causal -> causal, scale -> scale; K with fewer heads than Q
(enable_gqa) is passed as is. The original is put back on exit, exceptions included.

What is not monitored (counted in .skipped, one warning each kind): calls with an attn_mask
(masks other than causal cannot be described to the daemon yet), tensors that are not 3-D
([B, N, D], taken as one head) or 4-D [B, H, N, D], dtypes other than float32 / float16 / bfloat16,
calls made while torch.compile traces (compiled='break' monitors compiled code through a graph
break at each call instead), CUDA calls made while a CUDA graph is being captured (a replay of the
graph does not call the wrapper either). Modules that imported the function by name
(`from torch.nn.functional import scaled_dot_product_attention`) do not see the patch: pass them as
modules=[...] and their attribute is patched too. With activation checkpointing the recomputed
forward calls again: pass layers=range(n_layers) to keep only the first pass's indices.

Telemetry never stops training: a failed push (any exception from it, a callback's included) is
counted in .errors and warned about once (pass strict=True to raise instead). CUDA tensors go to
the daemon without a copy and without a device synchronisation (libattnstat's GPU path: CUDA IPC, an event on the current stream); the client
keeps them alive until the daemon has read them. Where the library has no GPU path (built without
CUDA), CUDA calls are skipped after one warning, or copied to the host with copy_to_host=True
(that synchronises the device).
"""
import threading
import warnings

from ._client import AttnstatError
from . import _lib

_SDPA = "scaled_dot_product_attention"
_ARGS = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa")


class monitor(object):
    """Context manager; see the module's documentation.

    client: an attnstat.Client. every: push every N-th step (1: every step). start_step: the step
    number of the first step. model: an nn.Module whose forward pre-hook starts each forward pass
    (and, with auto_step, each step). auto_step: advance the step at every forward of model
    (default: True when model is given). layers: a container of layer indices to push (None:
    all). sample_every, sample_rows, seed, softcap, window, want_results: passed to push().
    modules: further modules whose scaled_dot_product_attention attribute is patched.
    compiled: what happens inside torch.compile'd code: 'skip' (default: nothing is pushed, the
    compiled graph is untouched) or 'break' (a graph break around each push, so compiled models
    are monitored too, at the price of the break; not with fullgraph=True).
    """

    def __init__(self, client, every=1, sample_rows=0, sample_every=0, seed=0, model=None,
                 auto_step=None, start_step=0, layers=None, softcap=0.0, window=None,
                 want_results=False, modules=(), copy_to_host=False, strict=False,
                 compiled="skip"):
        if compiled not in ("skip", "break"):
            raise ValueError("compiled is %r: 'skip' or 'break'" % (compiled,))
        if int(every) < 1:
            raise ValueError("every is %r: must be >= 1" % (every,))
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
        self._push_kw = dict(sample_rows=sample_rows, sample_every=sample_every, seed=seed,
                             softcap=softcap, want_results=want_results)
        if window is not None:
            self._push_kw["window"] = tuple(window)
        self.current_step = int(start_step)
        self.layer_index = 0
        self.calls = 0
        self.pushed = 0
        self.dropped = 0
        self.skipped = 0
        self.errors = 0
        self._lock = threading.Lock()
        self._started_forward = False
        self._warned = set()
        self._patched = []       # (module, original)
        self._hook = None
        self._active = False
        self._gpu_off = False
        self._torch = None
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

    def __enter__(self):
        import torch  # only here: the rest of attnstat never imports it
        import torch.nn.functional as F
        self._torch = torch
        self._observe = self._observe_eager
        if self.compiled == "break":
            disable = getattr(getattr(torch, "compiler", None), "disable", None)
            if disable is not None:  # a graph break: the push runs eagerly, on real tensors
                self._observe = disable(self._observe_eager)
        targets = [F] + [m for m in self.modules if m is not F]
        wrapper = self._make_wrapper()
        try:
            for m in targets:
                orig = getattr(m, _SDPA)
                setattr(m, _SDPA, wrapper)
                self._patched.append((m, orig, wrapper))
            if self.model is not None:
                self._hook = self.model.register_forward_pre_hook(self._pre_hook)
        except BaseException:
            self._restore()
            raise
        self._active = True
        return self

    def __exit__(self, *exc):
        self._restore()
        return False

    def _restore(self):
        self._active = False
        if self._hook is not None:
            try:
                self._hook.remove()
            finally:
                self._hook = None
        while self._patched:
            m, orig, wrapper = self._patched.pop()
            # Someone who wrapped our wrapper after us keeps theirs; ours is then a pass-through.
            if getattr(m, _SDPA, None) is wrapper:
                setattr(m, _SDPA, orig)

    def _pre_hook(self, module, args):
        with self._lock:
            if self.auto_step and self._started_forward:
                self.current_step += 1
            self._started_forward = True
            self.layer_index = 0
        return None

    # ---- the wrapper ----------------------------------------------------------------------------
    def _make_wrapper(self):
        orig = getattr(self._torch.nn.functional, _SDPA)
        mon = self

        def scaled_dot_product_attention(*args, **kwargs):
            out = orig(*args, **kwargs)
            if mon._active:
                mon._observe(args, kwargs)
            return out

        scaled_dot_product_attention.__wrapped__ = orig
        scaled_dot_product_attention.__doc__ = orig.__doc__
        return scaled_dot_product_attention

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
            warnings.warn("attnstat.torch.monitor: " + msg, RuntimeWarning, stacklevel=4)

    def _observe_eager(self, args, kwargs):
        if self._compiling():
            return
        with self._lock:
            layer = self.layer_index
            self.layer_index += 1
            step = self.current_step
            self.calls += 1
        if step % self.every != 0 or (self.layers is not None and layer not in self.layers):
            return
        a = dict(zip(_ARGS, args))
        a.update(kwargs)
        q, k = a.get("query"), a.get("key")
        if a.get("attn_mask") is not None:
            self.skipped += 1
            self._warn_once("mask", "calls with an attn_mask are not monitored (only causal and "
                            "no mask can be described to the daemon)")
            return
        q, k = self._as_4d(q), self._as_4d(k)
        if q is None or k is None:
            self.skipped += 1
            self._warn_once("shape", "calls whose query/key are not 3-D or 4-D tensors are not "
                            "monitored")
            return
        if str(q.dtype) not in ("torch.float32", "torch.float16", "torch.bfloat16"):
            self.skipped += 1
            self._warn_once("dtype", "dtype %s is not monitored (float32, float16, bfloat16 are)"
                            % q.dtype)
            return
        if getattr(q, "is_cuda", False):
            if self._graph_capturing():  # no push (event record, IPC, copy) inside a capture
                self.skipped += 1
                self._warn_once("graph", "calls made while a CUDA graph is being captured are not "
                                "monitored")
                return
            if self.copy_to_host:
                q, k = q.detach().cpu(), k.detach().cpu()
            elif self._gpu_off:
                self.skipped += 1
                return
        scale = a.get("scale")
        try:
            sent = self.client.push(step, layer, q, k, causal=bool(a.get("is_causal", False)),
                                    scale=float(scale) if scale is not None else 0.0,
                                    **self._push_kw)
        except Exception as e:  # a failing push or callback never stops the forward pass
            if self.strict:
                raise
            self.errors += 1
            if (isinstance(e, AttnstatError) and e.code == _lib.ENOTSUP
                    and getattr(q, "is_cuda", False)):
                self._gpu_off = True
                self._warn_once("gpu", "%s; CUDA calls are skipped from now on (copy_to_host=True "
                                "copies them to the host instead)" % e)
            else:
                self._warn_once("push", "a push failed and was skipped: %s" % e)
            return
        if sent:
            self.pushed += 1
        else:
            self.dropped += 1

    @staticmethod
    def _as_4d(t):
        shape = getattr(t, "shape", None)
        if shape is None or not callable(getattr(t, "data_ptr", None)):
            return None
        if len(shape) == 4:
            return t
        if len(shape) == 3:
            try:
                return t.unsqueeze(1)  # [B, N, D] -> [B, 1, N, D], a view
            except Exception:
                return None
        return None

    def __repr__(self):
        return ("<attnstat.torch.monitor step=%d every=%d calls=%d pushed=%d dropped=%d skipped=%d "
                "errors=%d%s>" % (self.current_step, self.every, self.calls, self.pushed,
                                  self.dropped, self.skipped, self.errors,
                                  " active" if self._active else ""))


Monitor = monitor
