"""attnstat.torch.monitor: the statistics of every attention call of an unmodified PyTorch model,
eager or compiled.

    client = attnstat.Client(run="llama-1b", rank=rank)
    model = torch.compile(model)                                   # or not
    with attnstat.torch.monitor(client, every=10, model=model):   # one forward = one step
        for batch in loader:
            loss = model(**batch).loss; loss.backward(); opt.step()

or, without model= (gradient accumulation, several forwards per step):

    with attnstat.torch.monitor(client, every=10) as mon:
        for batch in loader:
            for micro in batch:         # each forward's layers numbered from 0 again
                mon.new_forward(); model(micro).loss.backward()
            opt.step(); mon.step()      # or mon.step(global_step)

The doors it watches (doors="auto": every one that is importable; _doors.py):
  - 'sdpa': torch.nn.functional.scaled_dot_product_attention, attn_mask included (boolean or
    additive, broadcastable to [B, H, Nq, Nk]);
  - 'flex': torch.nn.attention.flex_attention.flex_attention, a BlockMask's mask_mod evaluated
    into a dense boolean mask on the device (at most mask_bytes_max bytes; calls with a score_mod
    are skipped);
  - 'flash_attn': FlashAttention's flash_attn_func and flash_attn_varlen_func (cu_seqlens as
    packed sequences, causal, window_size, softcap), of FlashAttention 2 (flash_attn) and of
    FlashAttention 3 (flash_attn_interface; calls with qv, attention_chunk or seqused_q/k are
    skipped), when either is importable;
  - 'transformers': with model= a transformers model, the attention function its config names
    (sdpa, eager, flash_attention_2/3, flex_attention) is wrapped in transformers' attention
    interface, so that every call is seen with the model's own mask, attention sinks (gpt-oss)
    and layer number (the module's layer_idx); the doors above then stay quiet inside it (no
    call is pushed twice);
  - 'mha': nn.MultiheadAttention's calls that ask for the attention weights (need_weights=True,
    its default), which torch computes without scaled_dot_product_attention: q and k are
    computed from the call's own projection weights by the linear calls torch makes (on
    monitored steps only: one more input projection there), masks in MHA's convention (True =
    excluded) turned into SDPA's; its calls without weights reach the 'sdpa' door inside it. In
    compiled code such calls are skipped and counted (pass need_weights=False there);
  - 'varlen': torch.nn.attention.varlen.varlen_attn (PyTorch 2.10 and later): packed sequences
    by their offsets, causal (is_causal, or window_size (-1, 0)), a window, the scale; calls
    with a KV cache (k_cache / v_cache, block_table, page_table) or seqused_k are skipped.
However the model reaches them: through the module attribute, or imported by name into any
loaded module (`from torch.nn.attention.flex_attention import flex_attention`); modules loaded
while the monitor is active are looked at before each forward pass (or step). Layer = the
module's layer_idx (transformers) or the index of the call within the forward pass.

Compiled models (torch.compile, fullgraph=True included) are monitored with no graph break: under
tracing a door puts a custom operator in the graph (_op.py) that pushes at run time, on the real
tensors; it copies q and k on the stream first (compiled code reuses its buffers). Entering or
leaving the monitor and changing `every` recompile nothing: after a compiled model has traced a
door, the doors stay installed (transparent) when the monitor exits
(attnstat.torch.uninstall() removes them). Calls inside a CUDA graph capture (mode=
"reduce-overhead") are not monitored: skipped, counted and said once.

Precision: under autocast, q and k often reach attention as float32 (rotary tables are float32)
while the attention runs in the autocast dtype; compute_dtype='auto' (the default) tells the
daemon to compute the logits in the dtype the attention computed in for the sdpa and eager doors,
so that the statistics are those of the attention the model computed. Where q and k differ in
dtype under autocast (DeepSeek-V3: a float32 rotary part joined to a bfloat16 query), both are
rounded to autocast's dtype, as the attention rounds them.

Nothing is lost in silence: a call that cannot be described exactly is skipped, counted in
.skipped (.skipped_by[kind]) and warned about once per kind; a push the daemon rejects or drops
is counted in .rejected / .dropped (.rejected_by[reason]) and warned about once per reason, with
the daemon's own words; a push that fails here is counted in .errors and warned about once
(strict=True raises instead). A forward pass (with model=; a step without it) in which no
attention call was seen is counted in .blind and said once with the likely causes, and so is one
in which every call was skipped (.all_skipped); an attention module of model= whose eager
forward no door saw is counted by class in .unseen_by and said once (_unseen.py). Telemetry never
stops training. CUDA tensors go to
the daemon without a device synchronisation; the client keeps them alive until the daemon has
read them. Where the library has no GPU path, CUDA calls are skipped after one warning, or copied
to the host with copy_to_host=True (that synchronises the device).

Statistics: by default every push asks for the entropy statistics and the max logit;
stats="all" (or stats=("entropy", "max_logit", "sink_mass", "distance"), or one name) asks for
the sink mass and the mean attention distance too. Those two cost the GPU's tensor-core kernels
extra time, so they are computed only when asked; a statistic not asked for is absent from the
results and the store. The names come from attnstat's statistics table and are checked when the
monitor is made (ValueError listing the valid ones), not at the first step.

Parallel layouts: layout='auto' finds tensor parallelism in the DTensor placements of the
attention's query projections and refuses to start when a process holds a shard of the heads that
no layout explains (_layout.py).
"""
import re
import threading
import warnings

from .._client import AttnstatError
from .. import _lib, _pushargs
from . import _calls, _doors, _install, _layout, _op

_DOORS = ("sdpa", "flex", "flash_attn", "transformers", "mha", "varlen")
_DIGITS = re.compile(r"[0-9][0-9.,e+-]*")
_BLIND_WHY = ("the model's attention did not go through a door the monitor watches (a fused or "
              "custom attention kernel, a function held where the monitor cannot see it: pass "
              "its module as modules=[...]), or it ran inside a CUDA graph (torch.compile "
              "mode='reduce-overhead', torch.cuda.graphs), or doors= leaves its door out")


class monitor(object):
    """Context manager; see the module's documentation.

    client: an attnstat.Client. every: push every N-th step (1: every step). start_step: the step
    number of the first step. model: an nn.Module (compiled or not) whose forward pre-hook starts
    each forward pass (and, with auto_step, each step); a transformers model also opens the
    'transformers' door. auto_step: advance the step at every forward of model (default: True
    when model is given). layers: a container of layer indices to push (None: all).
    sample_every, sample_rows, seed, softcap, window, want_results: passed to push(). modules:
    further modules whose attention attributes are patched (those that hold the original
    functions are found on their own). doors: 'auto' or a sequence of door names ('sdpa',
    'flex', 'flash_attn', 'transformers', 'mha', 'varlen'). compute_dtype: 'auto' (the
    precision the attention computed in, where the door computes under autocast), None (the
    tensors' own) or a dtype name (in compiled code, float32 q and k of an autocast door reach
    the monitor already rounded to the attention's precision, as the attention read them).
    mask_bytes_max: the largest dense mask a flex_attention BlockMask is evaluated into.
    compiled: inside torch.compile'd code, 'auto' (default: monitored through the custom
    operator, no graph break) or 'skip' (counted in .skipped_by['compiled'], not pushed); 'break'
    is taken as 'auto' (it used to add a graph break around each push).
    layout: this process's parallel layout, said to the daemon at __enter__ so that its heads and
    layers get global numbers: 'auto' (Megatron-core's groups, DTensor placements of the
    attention's projections, else torch.distributed's ranks as replicas), None, a dict or a
    DeviceMesh (torch/_layout.py). layer_offset: a pipeline stage's first global layer (needed
    when the layout has pp_size > 1).
    stats: the statistics every push asks for (Client.push's stats): None (the defaults: the
    entropy statistics and max_logit), "all", "default", one name ("entropy", "max_logit",
    "sink_mass", "distance") or an iterable of names. sink_mass and distance cost the tensor-core
    kernels extra time and are computed only when asked. Checked here: ValueError listing the
    valid names.
    check_modules: with model=, watch its attention modules (the innermost whose class name says
    attention) for eager forward passes in which no door saw a call: counted by class in
    .unseen_by and said once per class (a layer the monitor does not see is never silent).
    """

    def __init__(self, client, every=1, sample_rows=0, sample_every=0, seed=0, model=None,
                 auto_step=None, start_step=0, layers=None, softcap=0.0, window=None,
                 want_results=False, modules=(), copy_to_host=False, strict=False,
                 compiled="auto", doors="auto", compute_dtype="auto", mask_bytes_max=256 << 20,
                 layout="auto", layer_offset=None, stats=None, check_modules=True):
        if compiled not in ("auto", "skip", "break"):
            raise ValueError("compiled is %r: 'auto' or 'skip'" % (compiled,))
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
        self.compiled = "skip" if compiled == "skip" else "auto"
        self.doors = doors
        self.compute_dtype = compute_dtype
        self.mask_bytes_max = int(mask_bytes_max)
        self.layout, self.layer_offset = layout, layer_offset
        self.stats_asked = _pushargs.stats_mask(stats)  # their bits; 0: the defaults
        self._push_kw = dict(sample_rows=sample_rows, sample_every=sample_every, seed=seed,
                             want_results=want_results)
        if self.stats_asked not in (0, _pushargs.STATS_DEFAULT):
            self._push_kw["stats"] = self.stats_asked  # else nothing asked: any client takes it
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
        self.blind = 0           # forward passes (steps without model=) that saw no call
        self.all_skipped = 0     # forward passes (steps) whose every call was skipped
        self.compiled_calls = 0  # calls observed through the compiled graph's operator
        self.recomputed = 0      # calls run again in backward (activation checkpointing): not pushed
        self.skipped_by = {}
        self.rejected_by = {}
        self.unseen_by = {}      # attention modules (class) whose forward no door saw: runs
        self.check_modules = bool(check_modules)
        self.doors_open = []
        self.layout_used = None  # the layout said to the client (a dict), or None
        self._lock = threading.Lock()
        self._started_forward = False
        self._pass_calls = self._pass_skipped = 0
        self._warned = set()
        self._model_key = id(model) if model is not None else None
        self._active = False
        self._gpu_off = False
        self._waits_ok = True    # the library takes stream_waits (local mode: compiled calls uncopied)
        self._torch = None
        self._ack_cb = None
        self._wanted = set(_DOORS if doors == "auto" else doors)
        self._tp_size = 1
        self._side = {}          # device index -> the stream compiled calls are copied on
        # layer -> a CUDA float64 [heads] tensor each push of the layer folds its heads' max
        # logits into, on the device (local mode: qk_clip's device path sets them)
        self.max_logit_out = {}
        self.max_out_refused = 0  # pushes of such a layer that could not fold into it (_out_ok)
        self._max_out_off = None  # why this libattnstat cannot (an older one), or None

    # ---- the user's side ------------------------------------------------------------------------
    def step(self, step=None):
        """Ends the current step: the next call is layer 0 of step + 1 (or of `step`)."""
        if self.model is None or (not self.auto_step and self._started_forward):
            self._end_pass()  # with model= and auto_step=False the step ends the pass too
            _install.refresh()
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
                "blind": self.blind, "all_skipped": self.all_skipped,
                "compiled_calls": self.compiled_calls, "max_out_refused": self.max_out_refused,
                "recomputed": self.recomputed,
                "skipped_by": dict(self.skipped_by), "rejected_by": dict(self.rejected_by),
                "unseen_by": dict(self.unseen_by),
                "doors": list(self.doors_open), "layout": self.layout_used}

    def __enter__(self):
        import torch  # only here: the rest of attnstat never imports it
        self._torch = torch
        if isinstance(getattr(torch, "Tensor", None), type):
            _calls.TENSOR = torch.Tensor
        _op.ops(torch)  # registered now: never while Dynamo traces a door
        self.layout_used = _layout.apply(self.client, self.layout, self.layer_offset, torch,
                                         self._warn_once, model=self.model)
        self._tp_size = int((self.layout_used or {}).get("tp_size", 1) or 1)
        _install.activate(self, torch)
        try:
            self._open_doors()
            if self.model is not None:
                _install.hook_model(self.model, torch)
                if self.check_modules:
                    _install.watch_modules(self.model)
            _install.scan()
        except BaseException:
            _install.deactivate(self)
            raise
        on_rejected = getattr(self.client, "on_rejected", None)
        last, off = _install.STATE.last_monitor, getattr(self.client, "off", None)
        if last is not None and last is not self and callable(off):
            off(last._on_rejected)  # its late answers are in: let it (and its model) go
            last._ack_cb = None
        if self._ack_cb is None and callable(on_rejected):
            self._ack_cb = on_rejected(self._on_rejected)
        self._active = True
        return self

    def __exit__(self, *exc):
        try:
            if exc[0] is None and self.model is not None:
                self._end_pass()  # without model=, the pass after the last step() is empty
        finally:
            self._active = False
            self.doors_open = []
            _install.STATE.last_monitor = self
            _install.deactivate(self)
        return False

    # ---- doors ----------------------------------------------------------------------------------
    def _want(self, door):
        return door in self._wanted

    def _open_doors(self):
        required = self.doors != "auto"
        if self._want("transformers") and self.model is not None:
            if _doors.open_transformers(self.model, self.mask_bytes_max):
                self.doors_open.append("transformers")
            elif required:
                raise ValueError("doors names 'transformers' but model is not a transformers "
                                 "model (no config._attn_implementation)")
        if self._want("sdpa") and _doors.open_sdpa(self.modules):
            self.doors_open.append("sdpa")
        if self._want("flex") and _doors.open_flex(self.modules, self.mask_bytes_max, required):
            self.doors_open.append("flex")
        if self._want("flash_attn") and _doors.open_flash(self.modules, required):
            self.doors_open.append("flash_attn")
        if self._want("mha") and _doors.open_mha(self.modules, self.mask_bytes_max):
            self.doors_open.append("mha")
        if self._want("varlen") and _doors.open_varlen(self.modules, required):
            self.doors_open.append("varlen")

    # ---- forward passes -------------------------------------------------------------------------
    def _forward_begin(self, key):
        """A forward pass of a hooked model starts (eagerly, or through the compiled graph)."""
        if key != self._model_key:
            return
        self._end_pass()
        _install.refresh()
        with self._lock:
            if self.auto_step and self._started_forward:
                self.current_step += 1
            self._started_forward = True
            self.layer_index = 0

    def _forward_compiled(self, key):
        self._forward_begin(key)

    def _end_pass(self):
        """The forward pass (step) that ends: said once when it saw nothing, or skipped all."""
        with self._lock:
            calls, skipped = self._pass_calls, self._pass_skipped
            started = self._started_forward if self.model is not None else True
            self._pass_calls = self._pass_skipped = 0
        if not started or not self._active:
            return
        what = "forward pass of the model" if self.model is not None else "step"
        if calls == 0:
            self.blind += 1
            self._warn_once("blind", "a %s saw no attention call: %s. Nothing was pushed for "
                            "it (counted in stats()['blind'])" % (what, _BLIND_WHY))
        elif skipped == calls:
            self.all_skipped += 1
            self._warn_once("all-skipped", "every attention call of a %s was skipped (%s): the "
                            "model is not monitored (counted in stats()['all_skipped'])"
                            % (what, ", ".join("%s: %d" % kv for kv in
                                               sorted(self.skipped_by.items()))))

    def _unseen(self, cls, name):
        """An attention module of the model (class cls, at name) ran a forward no door saw."""
        if not self._active or self._jit_tracing():
            return
        with self._lock:
            self.unseen_by[cls] = self.unseen_by.get(cls, 0) + 1
        self._warn_once("unseen:" + cls, "the model's attention module %s (first at %r) ran "
                        "without a call the monitor sees: its attention goes through a kernel no "
                        "door watches (a fused library kernel, attention written out with matmul "
                        "and softmax, or PyTorch's inference fast path), so that layer is not "
                        "monitored (counted in stats()['unseen_by']). If %s computes no softmax "
                        "attention over keys, pass check_modules=False" % (cls, name, cls))

    # ---- observing ------------------------------------------------------------------------------
    def _jit_tracing(self):
        f = getattr(getattr(self._torch, "jit", None), "is_tracing", None)
        try:
            return bool(callable(f) and f())
        except Exception:
            return False

    def _recomputed(self):
        """Whether autograd's engine is running a backward on this thread (a checkpointed
        layer's forward runs again there, eagerly or in a compiled backward: its attention was
        observed when it first ran); such a call is counted in .recomputed."""
        f = getattr(getattr(self._torch, "_C", None), "_current_graph_task_id", None)
        try:
            if f is None or f() == -1:
                return False
        except Exception:
            return False
        self.recomputed += 1
        return True

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
        self._pass_skipped += 1
        self.skipped_by[kind] = self.skipped_by.get(kind, 0) + 1
        self._warn_once("skip:" + kind, why + " (counted in .skipped_by[%r])" % kind)

    def _on_rejected(self, seq, step, layer, code, message):
        """The daemon dropped or refused a push: counted and said once per reason. Also after
        the monitor left (the Acks of its last pushes arrive with client.flush()), as long as it
        is the last monitor that was active."""
        st = _install.STATE
        if not self._active and (st.monitor is not None or st.last_monitor is not self):
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

    def _autocast_dtype(self, call):
        """The dtype the logits are computed in under autocast, or None."""
        if self.compute_dtype != "auto":
            return self.compute_dtype
        t = self._torch
        if "torch.float32" not in (str(call.q.dtype), str(call.k.dtype)):
            return None
        dev = getattr(getattr(call.q, "device", None), "type", "cpu")
        try:
            if not t.is_autocast_enabled(dev):
                return None
            return str(t.get_autocast_dtype(dev)).replace("torch.", "")
        except Exception:
            return None

    def _one_dtype(self, call, cd):
        """q and k in one dtype, or the call skipped (False). Under autocast the attention rounds
        both to autocast's dtype (DeepSeek-V3's query concatenates a bfloat16 part with a float32
        rotary part while its key stays bfloat16): the monitor rounds them the same way."""
        qd, kd = str(call.q.dtype), str(call.k.dtype)
        if qd == kd:
            return True
        if cd in ("bfloat16", "float16", "float32"):
            dt = getattr(self._torch, cd)
            if qd != "torch." + cd:
                call.q = call.q.to(dt)
            if kd != "torch." + cd:
                call.k = call.k.to(dt)
            return True
        self._skip("dtype", "attention calls whose q and k have different dtypes (%s and %s) "
                   "outside autocast are not monitored: the attention itself computes them in "
                   "one dtype; pass compute_dtype='bfloat16' (or 'float16', 'float32') to say "
                   "which" % (qd.replace("torch.", ""), kd.replace("torch.", "")))
        return False

    def _count(self):
        """One call seen: (its index in the forward pass, the step, whether the step is pushed)."""
        with self._lock:
            index = self.layer_index
            self.layer_index += 1
            step = self.current_step
            self.calls += 1
            self._pass_calls += 1
        return index, step, step % self.every == 0

    def _observe_eager(self, door, args, kwargs, out):
        if door.name not in self._wanted or not self._active or self._jit_tracing():
            return
        if self._recomputed():  # activation checkpointing's recompute: pushed in the forward
            return
        try:
            index, step, sampled = self._count()
            if not sampled:
                return
            call = door.describe(args, kwargs)
            if isinstance(call, _calls.Skip):
                self._skip(call.kind, call.why)
                return
            cd = None
            if door.autocast:
                cd = self._autocast_dtype(call)
            elif self.compute_dtype not in ("auto", None):
                cd = self.compute_dtype
            self._push(call, step, index, cd, copy=False)
        except Exception as e:  # describing or pushing a call never stops the forward pass
            if self.strict:
                raise
            self.errors += 1
            self._warn_once("observe", "a call could not be described and was skipped: %r"
                            % (e,))

    def _note_compiled(self, door, kind, why):
        if door not in self._wanted or not self._active or self._recomputed():
            return
        self.compiled_calls += 1
        _, _, sampled = self._count()
        if sampled:
            self._skip(kind, why)

    def _observe_compiled(self, q, k, mask, cu_q, cu_k, sinks, door, layer, heads, causal,
                          scale, wl, wr, softcap, layout, compute_dtype):
        """The attnstat::observe operator at run time: a call of a compiled graph."""
        if door not in self._wanted or not self._active:
            return
        if self._recomputed():  # a compiled graph's recompute of a checkpointed layer
            return
        try:
            self.compiled_calls += 1
            index, step, sampled = self._count()
            if not sampled:
                return
            if self.compiled == "skip":
                self._skip("compiled", "calls inside torch.compile'd code are not monitored "
                           "(compiled='skip')")
                return
            if _install.STATE.cudagraphs:
                # Copies held past the call would sit in the CUDA graph tree's private pool,
                # which must hold nothing but the graph's outputs (PyTorch fails the step).
                self._skip("graph", "calls of a model compiled with CUDA graphs (torch.compile "
                           "mode='reduce-overhead') are not monitored: use the default mode or "
                           "'max-autotune-no-cudagraphs' to monitor them")
                return
            call = _calls.Call(q, k, layout=layout, causal=causal, scale=scale or None,
                               window=None if (wl < 0 and wr < 0) else (wl, wr), softcap=softcap,
                               attn_mask=mask, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k,
                               layer=None if layer < 0 else layer, sinks=sinks, heads=heads)
            cd = compute_dtype or None
            if self.compute_dtype != "auto":
                cd = self.compute_dtype
            self._push(call, step, index, cd, copy=True)
        except Exception as e:
            if self.strict:
                raise
            self.errors += 1
            self._warn_once("observe", "a compiled call could not be pushed and was skipped: %r"
                            % (e,))

    def _heads_ok(self, call):
        """Whether the call's query heads are what the model's configuration and the layout say
        this process holds (else it is skipped: a shard is never stored as the whole layer)."""
        if not call.heads:
            return True
        hq = int(call.q.shape[1] if call.layout == "bhnd" else call.q.shape[2])
        if hq * self._tp_size == call.heads:
            return True
        self._skip("heads", "attention calls with %d query heads while the model's "
                   "configuration has %d%s are not monitored: this process holds a shard of the "
                   "heads that no layout explains (tensor parallelism the monitor did not find?). "
                   "Pass layout={'tp_rank': r, 'tp_size': n} (or a DeviceMesh with a 'tp' "
                   "dimension) so that local heads get their global numbers"
                   % (hq, call.heads, "" if self._tp_size == 1 else
                      " over tp_size %d" % self._tp_size))
        return False

    def _out_ok(self, call, out):
        """Whether this push can write the layer's max logits into out (qk_clip's device path);
        said once when not, with why (that layer is then not clipped in that step)."""
        why = None
        hq = int(call.q.shape[1] if call.layout == "bhnd" else call.q.shape[2])
        if self._max_out_off is not None:
            why = self._max_out_off
        elif not getattr(call.q, "is_cuda", False) or self.copy_to_host:
            why = "the push is not a CUDA push"
        elif not getattr(self.client, "local_compute", False):
            why = "the client is not in local mode"
        elif self.stats_asked and not (self.stats_asked & _pushargs.STATS_BY_NAME["max_logit"]):
            why = "the monitor's stats leave out the max logit"
        elif int(out.shape[0]) != hq:
            why = "the call has %d query heads, the layer's projections %d" % (hq, out.shape[0])
        elif out.device != call.q.device:
            why = "the call is on %s, the layer's weights on %s" % (call.q.device, out.device)
        if why is not None:
            self.max_out_refused += 1
            self._warn_once("max-out:" + why, "qk_clip cannot read this layer's max logits on "
                            "the device (%s): it is not clipped in the steps where this happens "
                            "(counted in .max_out_refused)" % why)
        return why is None

    def _copy(self, t, dtype=None):
        """A copy of a CUDA tensor on the stream (compiled code reuses its buffers once the
        operator returns); dimensions broadcast by stride 0 stay broadcast."""
        if t is None:
            return None
        for d, st in enumerate(t.stride()):
            if st == 0 and t.shape[d] > 1:
                t = t.narrow(d, 0, 1)
        return t.detach().to(dtype) if dtype is not None else t.detach().clone()

    def _copy_call(self, call, cd):
        """Copies a compiled call's CUDA tensors (compiled code reuses its buffers once the
        operator returns) on a side stream of this monitor: its allocations come from PyTorch's
        caching allocator, never from a CUDA graph tree's private pool (which must hold no
        tensor that outlives the graph's outputs); the side stream waits for the current one
        before the copy, and the current one for the copy before it goes on, on the device (no
        host synchronisation). Returns (the compute dtype left to the daemon, the stream the
        push's event is recorded on)."""
        t = self._torch
        dev = call.q.device
        side = self._side.get(dev.index)
        if side is None:
            side = self._side[dev.index] = t.cuda.Stream(device=dev)
        cur = t.cuda.current_stream(dev)
        side.wait_stream(cur)
        dt = getattr(t, cd) if cd in ("bfloat16", "float16") else None
        with t.cuda.stream(side):
            call.q, call.k = self._copy(call.q, dt), self._copy(call.k, dt)
            call.attn_mask = self._copy(call.attn_mask)
            call.cu_seqlens_q = self._copy(call.cu_seqlens_q)
            call.cu_seqlens_k = self._copy(call.cu_seqlens_k)
            call.sinks = self._copy(call.sinks)
        cur.wait_stream(side)
        return (None if dt is not None else cd), side  # rounded here, as autocast did

    def _push(self, call, step, index, cd, copy):
        layer = call.layer if call.layer is not None else index
        if self.layers is not None and layer not in self.layers:
            return
        if not self._heads_ok(call):
            return
        q = call.q
        stream = None
        kw_waits = False
        if getattr(q, "is_cuda", False):
            if self._graph_capturing():  # no push (event record, IPC, copy) inside a capture
                self._skip("graph", "calls made while a CUDA graph is being captured are not "
                           "monitored (torch.compile mode='reduce-overhead' and CUDA graphs replay "
                           "the attention without running the monitor: use the default mode or "
                           "'max-autotune-no-cudagraphs' to monitor them)")
                return
            if self.copy_to_host:
                call.q, call.k = q.detach().cpu(), call.k.detach().cpu()
                if call.attn_mask is not None:
                    call.attn_mask = call.attn_mask.detach().cpu()
                if call.sinks is not None:
                    call.sinks = call.sinks.detach().cpu()
                if call.cu_seqlens_q is not None:  # host tensors take host offsets
                    call.cu_seqlens_q = call.cu_seqlens_q.cpu()
                    call.cu_seqlens_k = call.cu_seqlens_k.cpu()
            elif self._gpu_off:
                self._skip("gpu", "CUDA calls are not monitored: this libattnstat has no GPU path")
                return
            elif copy and getattr(self.client, "local_compute", False) and self._waits_ok:
                kw_waits = True  # computed in this process: the stream waits for it, no copy
            elif copy:
                cd, stream = self._copy_call(call, cd)
            if call.sinks is not None and not self.copy_to_host and not copy:
                call.sinks = call.sinks.detach().clone()  # the optimizer updates it in place
        if not self._one_dtype(call, cd):  # after the filters: a call not pushed is not rounded
            return
        kw = call.push_kwargs()
        kw.update(self._push_kw)
        if self._softcap and not call.softcap:
            kw["softcap"] = self._softcap
        if self._window is not None and call.window is None:
            kw["window"] = self._window
        if cd is not None:
            kw["compute_dtype"] = cd
        if stream is not None:
            kw["stream"] = stream
        if kw_waits:
            kw["stream_waits"] = True
        out = self.max_logit_out.get(layer) if self.max_logit_out else None
        if out is not None and self._out_ok(call, out):
            kw["max_logit_out"] = out
        try:
            sent = self.client.push(step, layer, call.q, call.k, **kw)
        except Exception as e:  # a failing push or callback never stops the forward pass
            if (kw_waits and isinstance(e, AttnstatError) and e.code == _lib.ENOTSUP
                    and "stream_waits" in str(e)):
                self._waits_ok = False  # an older libattnstat: compiled calls copied instead
                return self._push(call, step, index, cd, copy)
            if ("max_logit_out" in kw and isinstance(e, AttnstatError)
                    and e.code == _lib.ENOTSUP and "max_logit_out" in str(e)):
                self._max_out_off = str(e)  # an older libattnstat: pushed without it
                return self._push(call, step, index, cd, copy)
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
            # said without asking the client (its stats() waits for its lock, which a drop
            # often means another thread holds; the forward pass must not wait for it)
            self._warn_once("dropped", "a push was dropped by the client library (ring, queue "
                            "or held budget full, or the client busy in another thread); drops "
                            "are counted in .dropped and in client.stats()")

    def __repr__(self):
        return ("<attnstat.torch.monitor step=%d every=%d calls=%d pushed=%d dropped=%d skipped=%d "
                "rejected=%d errors=%d blind=%d doors=%s%s>"
                % (self.current_step, self.every, self.calls, self.pushed, self.dropped,
                   self.skipped, self.rejected, self.errors, self.blind,
                   ",".join(self.doors_open) or "-", " active" if self._active else ""))


Monitor = monitor


def uninstall():
    """Puts every door's original back (the monitor leaves them installed, transparent, once a
    compiled graph has traced one: see the module's documentation)."""
    _install.uninstall()
