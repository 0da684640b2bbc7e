"""attnstat.Client: one connection to attnstatd through libattnstat (ctypes)."""
import ctypes
import json
import math
import os
import select
import threading
import time
import warnings
import weakref

from . import _args, _layout, _lib, _vocab
from ._args import ArgumentError
from ._tensor import TensorError, describe
from ._version import __version__
from ._errors import AttnstatError
from ._pushargs import (_Ext, _Held, _cu_pair, _detached, _float, _i32, _nonneg_int, _span_bytes,
                        _u32, check_max_out, stats_mask)


class Alert(object):
    __doc__ = ("An alert from the daemon (see Client.on_alert). rule: %s (vocab.h's rules); state: "
               "'raised' or 'cleared'." % ", ".join(repr(r["name"]) for r in _vocab.RULES))
    __slots__ = ("run", "run_id", "rank", "step", "layer", "head", "rule", "state", "value",
                 "threshold", "time_ms", "message")

    def __init__(self, **kw):
        for k in self.__slots__:
            setattr(self, k, kw.get(k))

    def as_dict(self):
        return {k: getattr(self, k) for k in self.__slots__}

    def __repr__(self):
        return ("Alert(%s %s run=%r rank=%s step=%s layer=%s head=%s value=%g threshold=%g)"
                % (self.rule, self.state, self.run, self.rank, self.step, self.layer, self.head,
                   self.value, self.threshold))


_HEAD_FIELDS = [f for f, _ in _lib.HeadResult._fields_]
_COUNTER_FIELDS = [f for f, _ in _lib.Counters._fields_ if f not in ("reserved", "last_error")]
_THRESHOLD_FIELDS = [f for f, _ in _lib.Thresholds._fields_]


def _s(b):
    return b.decode("utf-8", "replace") if b is not None else ""


def _struct_dict(st, skip=("reserved",)):
    out = {}
    for f, _ in st._fields_:
        if f in skip:
            continue
        v = getattr(st, f)
        out[f] = _s(v) if isinstance(v, bytes) else v
    return out


class Client(object):
    """A connection to attnstatd, introduced with a hello.

        with attnstat.Client(run="gpt-small", rank=0) as c:
            for step ...:
                c.push(step, layer, q, k, causal=True)     # True: sent; False: dropped
            c.flush()

    socket: the daemon's socket path (None: $ATTNSTAT_SOCKET, else
    $XDG_RUNTIME_DIR/attnstat/attnstatd.sock, else /run/attnstat/attnstatd.sock).
    run, rank: the run this process belongs to. thresholds: a dict overriding the daemon's alert
    thresholds for this run (keys: %s). config: a str or a JSON-serialisable object stored with
    the run. ring_bytes, queue_bytes: sizes of the shared-memory ring and the outgoing queue.
    timeout_s: for connect and hello. lib: a path to libattnstat.so or an already loaded CDLL.
    layout: this process's parallel layout, said after the hello (see set_layout()).
    hello=False connects without introducing a run (for status() and subscribe() only).
    devices: the GPUs this process will push CUDA tensors from, named in the hello so that the
    daemon starts their workers at once: CUDA ordinals, torch.device objects or UUID strings
    ("GPU-..."). Default: PyTorch's current device when PyTorch has already initialised CUDA,
    else none (a device first used later is announced with its first tensors).

    CUDA tensors are handed over without a copy (CUDA IPC) and kept alive by this object until
    the daemon has read them; an event recorded on the tensor's current stream (or stream=)
    orders the daemon's reads after the writes, so a push never synchronises the device. What is
    kept is t.detach() where the object has it (the memory, not the autograd graph), and it is
    bounded: while the pushes held span more than held_bytes_max bytes (default 2 GiB; None: no
    limit) or number held_pushes_max (default 1024), further GPU pushes are dropped and counted
    (stats()['dropped_held']); a push is never dropped for its own size while nothing is held.

    A Client may be used from several threads: every call holds the client's lock, briefly. push()
    never waits for it: while another thread is inside the library (status(), or a step of poll(),
    flush()) a push is dropped and counted (stats()['dropped_busy']); poll() and flush() wait for
    the socket outside the lock, so pushes from other threads go on meanwhile. It belongs to
    the process that made it: a forked child gets errors from it and must make its own. Callbacks run
    inside push(), poll(), flush() and status() on the calling thread and must not call the client.
    An exception raised by a callback is re-raised by the next poll(), flush() or status() (the
    first one only), never by push(): a push that was sent returns True whatever a callback did.

    local_compute=True computes CUDA pushes in this process (the daemon's kernel on a stream of
    the lowest priority in this process' CUDA context) and sends the daemon only their per-head
    results: without MPS the GPU time-slices between this process and the daemon, which makes
    every-step monitoring cost several percent of the step; in one context the kernel shares the
    GPU instead (bench/RESULTS.md). The tensors are held until the kernel has read them; the
    collapse threshold is this hello's (thresholds=) or 0.1. Host tensors are unaffected.

    A daemon restart does not end monitoring: the library reconnects on its own (inside push(),
    poll(), flush() and status(); no thread), says the same hello again and carries on the same
    run. Meanwhile push() returns False (counted in stats()['dropped_disconnected'], with one
    RuntimeWarning per loss); pushes that were in flight are abandoned (stats()['abandoned']) and
    their GPU tensors let go. flush() and close() never raise because the daemon went away: flush()
    returns False when pushes were abandoned, and says why in a RuntimeWarning (once) and in
    stats()['link'] / ['link_error']. A daemon that refuses the client when it comes back
    (permission, version) is not asked again: push() returns False, poll() and status() raise.

    connect: 'now' (the default) raises AttnstatError (ECONNECT) when the daemon is not there.
    'background' does not: for a trainer that may start before its daemon (a Kubernetes sidecar
    or a DaemonSet pod that comes up later), the client starts not connected (stats()['link'] is
    'reconnecting', stats()['link_error'] says it waits for attnstatd), the hello, layout and
    subscriptions are kept, push() returns False (counted in stats()['dropped_disconnected'],
    with one RuntimeWarning), and the library connects inside the calls made anyway (push(),
    poll(), flush(), status()) with attempts from 100 ms apart up to every 5 s; the first that
    connects says the hello, run_id is set, and pushes from then on are sent. Errors that waiting
    cannot cure (a socket path too long, permission denied on the socket) still raise at once.
    None: $ATTNSTAT_CONNECT ('now' or 'background') when set, else 'now'. 'now' stays the
    default because with 'background' a wrong socket path looks like a daemon that has not
    started yet: the job would run unmonitored, saying so only in a warning and in stats().
    """ % ", ".join(_THRESHOLD_FIELDS)

    def __init__(self, socket=None, run=None, rank=0, thresholds=None, config=None,
                 ring_bytes=None, lib=None, queue_bytes=None, timeout_s=None, hello=True,
                 devices=None, held_bytes_max=2 << 30, held_pushes_max=1024,
                 local_compute=False, layout=None, connect=None):
        self._c = None
        rank = _args.integer(rank, "rank", 0, _args.I32[1])  # before a connection is made
        self.connect = _args.connect_mode(connect)
        self._held_bytes_max = (None if held_bytes_max is None
                                else _nonneg_int(held_bytes_max, "held_bytes_max"))
        self._held_pushes_max = (None if held_pushes_max is None
                                 else _nonneg_int(held_pushes_max, "held_pushes_max"))
        self._held_bytes = 0     # the spans of the tensors in _held and _held_unseq
        self._dropped_held = 0
        self._lock = threading.RLock()
        self._count_lock = threading.Lock()  # the Python-side drop counters only
        self._dropped_busy = 0
        self._in_callback = False
        self._callback_error = None
        self._alert_cbs = []
        self._result_cbs = []
        self._ack_cbs = []
        self._subscribed = (False, False)
        self._held = {}          # seq -> objects kept alive for the daemon (GPU path)
        self._held_unseq = []    # the same, when the library cannot say which push they belong to
        self._warned_closed = False
        self._warned_link = False   # a warning was given for the current loss of the connection
        self._warned_lost = False   # ... and for pushes flush() found abandoned
        self._pid = os.getpid()
        if lib is None or isinstance(lib, (str, bytes, os.PathLike)):
            lib = _lib.load(lib)
        elif not hasattr(lib, "_attnstat_path"):
            _lib._declare(lib)
        self._lib = lib
        self._push_ex = _lib.optional(lib, "attnstat_push_ex")
        self._push2 = _lib.optional(lib, "attnstat_push2")

        # the hello's arguments are checked before a connection is made
        hello_args = self._hello_args(run, rank, thresholds, config, devices) if hello else None
        opts = _lib.ConnectOpts()
        lib.attnstat_connect_opts_init(ctypes.byref(opts))
        self.socket = os.fsdecode(socket) if socket is not None else default_socket(lib)
        opts.socket_path = _args.text(os.fsencode(self.socket), "socket")
        if ring_bytes is not None:
            opts.ring_bytes = _nonneg_int(ring_bytes, "ring_bytes")
        if queue_bytes is not None:
            opts.queue_bytes = _nonneg_int(queue_bytes, "queue_bytes")
        if timeout_s is not None:
            opts.timeout_ms = _args.timeout_ms(timeout_s, "timeout_s")
        err = _lib.Error()
        handle = ctypes.c_void_p()
        if self.connect == "background":
            connect2 = _lib.optional(lib, "attnstat_connect2")
            if connect2 is None:
                raise AttnstatError(_lib.ENOTSUP, "connect='background' needs a libattnstat with "
                                    "attnstat_connect2 (this one is older)")
            rc = connect2(ctypes.byref(opts), _lib.CONNECT_BACKGROUND, ctypes.byref(handle),
                          ctypes.byref(err))
        else:
            rc = lib.attnstat_connect_ex(ctypes.byref(opts), ctypes.byref(handle),
                                         ctypes.byref(err))
        if rc != _lib.OK:
            raise AttnstatError(rc, _s(err.msg) or _s(lib.attnstat_strerror(rc)))
        self._c = handle

        # Scratch structs reused by every push (under the lock).
        self._opts = _lib.PushOpts()
        lib.attnstat_push_opts_init(ctypes.byref(self._opts))  # push() then sets every field
        self._tq, self._tk, self._tv = _lib.Tensor(), _lib.Tensor(), _lib.Tensor()
        self._seq = ctypes.c_uint64()
        self._refs = (ctypes.byref(self._opts), ctypes.byref(self._tq), ctypes.byref(self._tk),
                      ctypes.byref(self._tv), ctypes.byref(self._seq))

        # The C callbacks reach this object through a weak reference: no reference cycle, so the
        # connection (and the library's staging memory) goes as soon as the last reference does.
        me = weakref.ref(self)
        self._alert_fn = _lib.ALERT_FN(_lib.trampoline(me, "_on_alert_c"))
        self._result_fn = _lib.RESULT_FN(_lib.trampoline(me, "_on_result_c"))
        self._ack_fn = _lib.ACK_FN(_lib.trampoline(me, "_on_ack_c"))
        self._release_fn = _lib.RELEASE_FN(_lib.trampoline(me, "_on_release_c"))
        lib.attnstat_set_alert_callback(handle, self._alert_fn, None)
        lib.attnstat_set_result_callback(handle, self._result_fn, None)
        lib.attnstat_set_ack_callback(handle, self._ack_fn, None)
        set_release = _lib.optional(lib, "attnstat_set_release_callback")
        self._release_cb = set_release is not None and self._push_ex is not None
        if self._release_cb:
            set_release(handle, self._release_fn, None)

        self.local_compute = bool(local_compute)
        if self.local_compute:
            set_local = _lib.optional(lib, "attnstat_set_local_compute")
            rc = set_local(handle, 1) if set_local is not None else _lib.ENOTSUP
            if rc != _lib.OK:
                msg = (_s(lib.attnstat_last_error(handle)) if set_local is not None
                       else "this libattnstat has no local mode (attnstat_set_local_compute)")
                self.close()
                raise AttnstatError(rc, msg)

        self.run = run
        self.rank = rank
        self.devices = []
        self.layout = None
        if hello:
            try:
                self._hello(hello_args)
                if layout is not None:
                    self.set_layout(layout)
            except BaseException:
                self.close()
                raise

    def set_layout(self, layout=None, **fields):
        """Tells the daemon where this process's heads and layers sit in the whole model (tensor,
        pipeline, data and context parallelism: attnstat._layout says each field), so that every
        process of the job stores global (layer, head) numbers. A dict, an object with the fields
        as attributes, or keywords (tp_rank=1, tp_size=4, ...). Applies to the pushes after it;
        kept and said again after a reconnection. Raises AttnstatError: EINVAL for a bad layout,
        ENOTSUP when the daemon (or the library) is too old to take one."""
        d = _layout.as_dict(layout, **fields)
        fn = _lib.optional(self._lib, "attnstat_set_layout")
        if fn is None:
            raise AttnstatError(_lib.ENOTSUP, "this libattnstat takes no parallel layout (no "
                                "attnstat_set_layout): an older library")
        c = _layout.to_c(self._lib, d)
        with self._lock:
            self._enter()
            self._check(fn(self._handle(), ctypes.byref(c)))
            self.layout = d

    def intervention(self, kind, step, layer=None, heads=(), values=None, threshold=None,
                     measured=None, detail=None):
        """Records in the run's history something the job did to its model at `step` because of
        what was measured (attnstat.torch.qk_clip sends kind "qk_clip" for each layer it clips:
        the query heads whose rows it scaled, the factor each head's logits scale by, tau, the
        largest measured max logit); `attnstat interventions RUN` lists them. layer and heads are
        numbered as the pushes' are. Never waits for the daemon. Returns True when sent, False
        when dropped because the library is not connected (a daemon restart: the run goes on).
        Raises AttnstatError: EINVAL for a field out of range (the message names it), ENOTSUP
        when the daemon or the library is too old to record interventions."""
        fn = _lib.optional(self._lib, "attnstat_record_intervention")
        if fn is None:
            raise AttnstatError(_lib.ENOTSUP, "this libattnstat records no interventions (no "
                                "attnstat_record_intervention): an older library")
        iv, _keep = _args.intervention(self._lib, kind, step, layer, heads, values, threshold,
                                       measured, detail)
        with self._lock:
            self._enter()
            rc = fn(self._handle(), ctypes.byref(iv))
            if rc == _lib.DROPPED:
                return False
            self._check(rc)
        return True

    # ---- setup ----------------------------------------------------------------------------------
    def _hello_args(self, run, rank, thresholds, config, devices=None):
        """What the hello sends, checked (before the connection is made): (run, rank,
        thresholds, config, device UUIDs) as the C call takes them."""
        th = _args.thresholds(self._lib, thresholds, _THRESHOLD_FIELDS)
        rank = _args.integer(rank, "rank", 0, _args.I32[1])
        if config is not None and not isinstance(config, (str, bytes, bytearray)):
            config = json.dumps(config, sort_keys=True, default=str)
        cfg = _args.text(config, "config") if config is not None else None
        runb = _args.text(run, "run") if run is not None else None
        try:
            uuids = _args.device_uuids(self._lib, devices)
        except AttnstatError:
            if devices is not None:
                raise
            uuids = []  # the automatic choice is only a head start: never an error
        return runb, rank, th, cfg, uuids

    def _hello(self, args):
        """Says the hello of _hello_args."""
        runb, rank, th, cfg, uuids = args
        thp = ctypes.byref(th) if th is not None else None
        hello_ex = _lib.optional(self._lib, "attnstat_hello_ex")
        if uuids and hello_ex is not None:
            arr = (ctypes.c_char_p * len(uuids))(*uuids)
            rc = hello_ex(self._c, runb, rank, thp, cfg, arr, len(uuids))
        else:
            rc = self._lib.attnstat_hello(self._c, runb, rank, thp, cfg)
        self._check(rc)
        self.devices = [u.decode() for u in uuids]

    # ---- pushing --------------------------------------------------------------------------------
    def push(self, step, layer, q, k, v=None, causal=False, window=None, window_left=None,
             window_right=None, softcap=0.0, scale=0.0, sample_every=0, sample_rows=0, seed=0,
             cu_seqlens_q=None, cu_seqlens_k=None, layout="bhnd", want_results=False,
             stream=None, attn_mask=None, compute_dtype=None, sinks=None, stream_waits=False,
             stats=None, max_logit_out=None):
        """Hands q, k (and v) of one attention call to the daemon; never waits for it.

        Returns True when the push is on its way, False when it was dropped (the ring or the
        queue was full, or the library is reconnecting to a daemon that went away, or the
        connection is gone for good: counted in stats()). Raises AttnstatError for
        a bad argument (code EINVAL, the message says which) and for CUDA tensors while this
        libattnstat has no GPU path (ENOTSUP).

        q: [B, Hq, Nq, D]; k, v: [B, Hkv, Nk, D], Hq a multiple of Hkv (GQA); layout='bnhd' takes
        [B, N, H, D] tensors instead. float32, float16 or bfloat16; q and k of one dtype.
        causal: bottom-right aligned when Nk > Nq. window=(left, right) or window_left /
        window_right: sliding window, negative = unbounded. softcap: tanh soft-capping of the
        logits (0: off). scale: logit scale (0: 1/sqrt(D)). sample_every=k: rows 0, k, 2k...;
        sample_rows=n: n random rows per sequence drawn with seed. cu_seqlens_q/k: packed
        sequences (B = 1), n_seqs + 1 int32 offsets each. want_results: the per-head results come
        back to the on_result callbacks. stream: the CUDA stream (handle as int, or an object with
        .cuda_stream or .ptr) the tensors were written on; default: the tensor's own.
        attn_mask: a mask with scaled_dot_product_attention's conventions (2 to 4 dimensions
        broadcastable to [B, Hq, Nq, Nk]; boolean, True = the key takes part, or floating point
        added to the logits, -inf excluding the key), in the same memory as q (no copy on the GPU
        path; kept alive with q and k). compute_dtype: 'bfloat16' / 'float16' / 'float32' (or a
        torch dtype): q and k are rounded to it before the dot products, as attention under
        autocast computes them. cu_seqlens_q/k may be CUDA int32 tensors (read by the daemon on
        the device: no synchronisation). sinks: attention sinks (gpt-oss's `sinks`), one logit per
        query head: 1-D [Hq] (or any shape with one dimension over 1, taken as [Hq]), float32,
        float16 or bfloat16, in the same memory as q (CUDA sinks contiguous; kept alive with q and
        k). Each joins every row of its head as one more outcome of the softmax, as it is (no
        scale, softcap or mask): the entropy and its normalisation (ln(visible keys + 1)) count
        it, the max logit does not; -inf is no sink. A daemon that does not take sinks makes the
        push raise (ENOTSUP) rather than compute without them. stream_waits (local mode, CUDA
        tensors): the stream waits, on the device, for this push's computation, so that the
        caller's next work on it may overwrite the tensors (no copy needed; AttnstatError EINVAL
        when the daemon computes the push). stats: the statistics to compute (_pushargs.stats_mask):
        None (the entropy statistics and max_logit), "all", "default", a name ("entropy",
        "max_logit", "sink_mass", "distance") or names; sink_mass and distance cost the
        tensor-core kernels extra time and are computed only when asked; one not asked for is NaN
        in the results and not stored. ValueError for an unknown name, ENOTSUP from an older daemon.
        max_logit_out (local mode, CUDA tensors): a CUDA torch.float64 [Hq] tensor on q's device
        that each head's max logit is folded into (the larger; NaN counts as none); a stream that
        waits for it (stream_waits, or local_wait()) reads it with no host synchronisation. Kept
        alive with q and k; EINVAL when the daemon computes the push or stats leaves out the max
        logit."""
        if window is not None:
            if window_left is not None or window_right is not None:
                raise AttnstatError(_lib.EINVAL, "give window=(left, right) or window_left / "
                                    "window_right, not both")
            try:
                window_left, window_right = window
            except (TypeError, ValueError):
                raise AttnstatError(_lib.EINVAL, "window is %r: must be a pair (left, right)"
                                    % (window,))
        bits = stats_mask(stats)
        try:
            dq = describe(q, "q", layout)
            dk = describe(k, "k", layout)
            dv = describe(v, "v", layout) if v is not None else None
            ext = _Ext(attn_mask, compute_dtype, cu_seqlens_q, cu_seqlens_k, sinks,
                       stream_waits, bits, max_logit_out)
            if max_logit_out is not None:
                check_max_out(max_logit_out, dq.shape[1])
            if ext.sinks is not None and ext.sinks.shape[1] != dq.shape[1]:
                raise TensorError("sinks has %d values: one per query head (q has %d)"
                                  % (ext.sinks.shape[1], dq.shape[1]))
        except TensorError as e:
            raise ArgumentError(str(e)) from None
        cu = None if ext.cu_q is not None else _cu_pair(cu_seqlens_q, cu_seqlens_k)
        if ext.needed and self._push2 is None:
            raise AttnstatError(_lib.ENOTSUP, "attn_mask, compute_dtype, CUDA cu_seqlens, sinks "
                                "and stats need a libattnstat with attnstat_push2 (this one is "
                                "older)")
        gpu = dq.mem == _lib.MEM_CUDA or dk.mem == _lib.MEM_CUDA or (
            dv is not None and dv.mem == _lib.MEM_CUDA)
        if stream is None:
            stream = dq.stream
        elif not isinstance(stream, int):
            stream = getattr(stream, "cuda_stream", getattr(stream, "ptr", stream))

        if not self._lock.acquire(blocking=False):  # another thread is in the library: drop
            with self._count_lock:
                self._dropped_busy += 1
            return False
        try:
            if gpu and self._over_hold_budget(dq, dk, dv, ext):
                self._dropped_held += 1
                return False
            return self._push_locked(step, layer, causal, window_left, window_right, softcap,
                                     scale, sample_every, sample_rows, seed, want_results,
                                     stream, cu, dq, dk, dv, gpu, ext)
        finally:
            self._lock.release()

    def _push_locked(self, step, layer, causal, window_left, window_right, softcap, scale,
                     sample_every, sample_rows, seed, want_results, stream, cu, dq, dk, dv, gpu,
                     ext):
        self._enter()
        o = self._opts  # every field is set below
        try:
            o.step = _args.i64(step, "step")
            o.layer = _u32(layer, "layer")
            o.causal = 1 if causal else 0
            o.window_left = -1 if window_left is None else _i32(window_left, "window_left")
            o.window_right = -1 if window_right is None else _i32(window_right, "window_right")
            o.softcap = _float(softcap, "softcap")
            o.scale = _float(scale, "scale")
            o.sample_every = _u32(sample_every, "sample_every")
            o.sample_rows = _u32(sample_rows, "sample_rows")
            o.sample_seed = _args.u64(seed, "seed")
            o.want_results = 1 if want_results else 0
            o.cuda_stream = _args.u64(stream, "stream") if stream else None
            o.cu_seqlens_q = o.cu_seqlens_k = None
            o.n_seqs = 0
        except ArgumentError:
            raise
        except (TypeError, ValueError, OverflowError) as e:
            raise ArgumentError(str(e)) from None
        if cu is not None:
            o.cu_seqlens_q, o.cu_seqlens_k, o.n_seqs = cu[:3]
        dq.fill(self._tq)
        dk.fill(self._tk)
        ro, rq, rk, rv, rs = self._refs
        if dv is not None:
            dv.fill(self._tv)
        else:
            rv = None
        c = self._handle()
        if ext.needed:
            self._seq.value = 0
            rc = self._push2(c, ro, ext.fill(self._lib), rq, rk, rv, rs)
        elif self._push_ex is not None:
            self._seq.value = 0
            rc = self._push_ex(c, ro, rq, rk, rv, rs)
        else:
            rc = self._lib.attnstat_push(c, ro, rq, rk, rv)
        if rc == _lib.OK and gpu:  # first: the daemon may read these from now on
            self._hold((dq.owner, dk.owner, dv.owner if dv is not None else None) + ext.owners(),
                       self._pending_bytes)
        o.cu_seqlens_q = o.cu_seqlens_k = None
        # An exception from a callback that ran in here stays stored for the next poll(),
        # flush() or status(): the push itself went through, so it must not raise.
        if rc == _lib.OK:
            self._warned_link = False
            return True
        if rc == _lib.DROPPED:
            self._warn_link()
            return False
        if rc == _lib.ECLOSED:
            if not self._warned_closed:
                self._warned_closed = True
                warnings.warn("attnstat: the connection to attnstatd is closed; pushes are "
                              "dropped from now on (%s)" % self._last_error(),
                              RuntimeWarning, stacklevel=3)
            return False
        if rc == _lib.ENOTSUP and gpu:
            raise AttnstatError(rc, self._last_error() + " (CUDA tensors need a libattnstat "
                                "with the GPU path and a usable CUDA device; copy the tensors "
                                "to the host meanwhile)")
        raise AttnstatError(rc, self._last_error())

    def _link(self):
        """(state name, reason) of the connection (under the lock): 'up', 'reconnecting' or
        'closed'; ('up', '') with a library that cannot say."""
        fn = _lib.optional(self._lib, "attnstat_link_state")
        if fn is None or not self._c:
            return ("up" if self._c else "closed"), ""
        buf = ctypes.create_string_buffer(512)
        st = fn(self._c, buf, len(buf))
        return _lib.LINK_NAMES.get(st, "code %d" % st), _s(buf.value)

    def _warn_link(self):
        """After a dropped push: one warning per loss of the connection (or while a background
        client waits for its daemon)."""
        if self._warned_link:
            return
        state, why = self._link()
        if state == "up":
            return
        self._warned_link = True
        if why.startswith("not connected yet"):
            warnings.warn("attnstat: not connected to attnstatd at %s yet (%s); the library "
                          "connects when it comes and drops pushes meanwhile (counted in stats())"
                          % (self.socket, why), RuntimeWarning, stacklevel=4)
            return
        warnings.warn("attnstat: the connection to attnstatd was lost (%s); the library reconnects "
                      "on its own and drops pushes meanwhile (counted in stats())" % why,
                      RuntimeWarning, stacklevel=4)

    def _over_hold_budget(self, dq, dk, dv, ext):
        """Whether a GPU push of these tensors would hold more than the budget (under the lock);
        leaves their bytes in _pending_bytes for _hold."""
        n = _span_bytes(dq) + _span_bytes(dk) + (_span_bytes(dv) if dv is not None else 0)
        n += sum(_span_bytes(d) for d in ext.descs())
        self._pending_bytes = n
        count = len(self._held) + len(self._held_unseq)
        if self._held_pushes_max is not None and count >= self._held_pushes_max:
            return True
        return (self._held_bytes_max is not None and count > 0
                and self._held_bytes + n > self._held_bytes_max)

    def _hold(self, objs, nbytes=0):
        """Keeps the caller's GPU tensors alive until the daemon no longer reads them: their
        detached views (same memory, no autograd graph)."""
        seq = self._seq.value if self._push_ex is not None else 0
        if seq == 0 and self._push_ex is not None:
            return  # the library copied them (staged path): nothing to hold
        held = _Held(_detached(o) for o in objs)
        held.nbytes = nbytes
        self._held_bytes += nbytes
        if seq and self._release_cb:
            old = self._held.pop(seq, None)
            if old is not None:
                self._held_bytes -= old.nbytes
            self._held[seq] = held
        else:
            self._held_unseq.append(held)

    def _unhold_all(self):
        self._held.clear()
        del self._held_unseq[:]
        self._held_bytes = 0

    def _clear_unseq(self):
        self._held_bytes -= sum(h.nbytes for h in self._held_unseq)
        del self._held_unseq[:]

    def _drop_unseq_holds(self):
        """Without per-push release notifications: once nothing is in flight, nothing is read."""
        if self._held_unseq and self._c:
            st = _lib.Counters()
            self._lib.attnstat_stats(self._c, ctypes.byref(st))
            if st.in_flight == 0:
                self._clear_unseq()

    # ---- replies --------------------------------------------------------------------------------
    _WAIT_SLICE_S = 0.05  # the longest wait without a look at the outgoing queue

    def _io_state(self):
        """(fd, whether bytes wait to be written); under the lock."""
        c = self._handle()
        st = _lib.Counters()
        self._lib.attnstat_stats(c, ctypes.byref(st))
        return int(self._lib.attnstat_fd(c)), st.queue_bytes > 0

    def _wait_io(self, fd, want_write, deadline):
        """Waits, without the lock, until fd is readable (or writable, when bytes are queued), at
        most until deadline (time.monotonic(); None: no limit) and at most _WAIT_SLICE_S.
        True when it is readable."""
        left = self._WAIT_SLICE_S
        if deadline is not None:
            left = max(0.0, min(left, deadline - time.monotonic()))
        if fd < 0:  # no connection while the library reconnects: its next attempt is timed
            time.sleep(left)
            return False
        try:
            p = select.poll()
            p.register(fd, select.POLLIN | (select.POLLOUT if want_write else 0))
            ev = p.poll(int(math.ceil(left * 1000)))
        except (OSError, ValueError):  # closed meanwhile: the next step under the lock says so
            return True
        return any(e & (select.POLLIN | select.POLLERR | select.POLLHUP) for _, e in ev)

    def poll(self, timeout_ms=0):
        """Sends what is queued and processes what arrived (running the callbacks), waiting up to
        timeout_ms (0: not at all; < 0: until something arrives). While the library reconnects it
        makes its attempts. Raises AttnstatError when the connection is gone for good (refused
        by the daemon). The waiting is done outside the client's lock."""
        timeout_ms = int(timeout_ms)
        deadline = None if timeout_ms < 0 else time.monotonic() + timeout_ms / 1000.0
        while True:
            with self._lock:
                self._enter()
                c = self._handle()
                rc = self._lib.attnstat_poll(c, 0)
                done = (rc != _lib.OK or timeout_ms == 0
                        or (deadline is not None and time.monotonic() >= deadline))
                if done:
                    self._raise_callback_error()
                    self._drop_unseq_holds()
                    self._check(rc)
                    return
                fd, want_write = self._io_state()
            if self._wait_io(fd, want_write, deadline):
                timeout_ms = 0  # something arrived: process it, then return

    def local_wait(self, stream=None):
        """Local mode: the CUDA stream (default: PyTorch's current one; an int handle, or an object
        with .cuda_stream) waits, on the device, for every computation pushed so far (their
        max_logit_out); the host does not. AttnstatError EINVAL outside local mode."""
        fn = _lib.optional(self._lib, "attnstat_local_wait")
        if fn is None:
            raise AttnstatError(_lib.ENOTSUP, "this libattnstat has no attnstat_local_wait")
        if stream is None:
            import torch
            stream = torch.cuda.current_stream()
        if not isinstance(stream, int):
            stream = getattr(stream, "cuda_stream", getattr(stream, "ptr", stream))
        with self._lock:
            self._enter()
            self._check(fn(self._handle(), int(stream) if stream else None))

    def flush(self, timeout_s=10):
        """Waits until every push sent is acknowledged (stored by the daemon), up to timeout_s
        seconds (None: no limit). True when everything sent since the previous flush was
        acknowledged; False when time ran out, or when pushes were abandoned because the daemon
        went away (stats()['abandoned'], and a RuntimeWarning the first time). Never raises
        because the connection was lost. The waiting is done outside the client's lock, so other
        threads' pushes go on meanwhile."""
        deadline = (None if timeout_s is None
                    else time.monotonic() + _args.finite(timeout_s, "timeout_s", lo=0.0))
        while True:
            with self._lock:
                self._enter()
                c = self._handle()
                self._lib.attnstat_poll(c, 0)          # sends, reads, runs the callbacks
                rc = self._lib.attnstat_flush(c, 0)    # OK, ETIMEDOUT (not yet) or ECLOSED
                if rc != _lib.ETIMEDOUT or (deadline is not None
                                            and time.monotonic() >= deadline):
                    self._raise_callback_error()
                    if rc == _lib.ETIMEDOUT:
                        return False
                    if rc in (_lib.ELOST, _lib.ECLOSED):  # the daemon went away: said, not raised
                        self._clear_unseq()
                        self._warn_lost(rc)
                        return False
                    self._check(rc)
                    self._clear_unseq()
                    return True
                fd, want_write = self._io_state()
            self._wait_io(fd, want_write, deadline)

    def _warn_lost(self, rc):
        """flush() found pushes abandoned (ELOST) or the connection gone: said once."""
        if self._warned_lost:
            return
        self._warned_lost = True
        warnings.warn("attnstat: flush(): %s" % (self._last_error() or _lib.CODE_NAMES[rc]),
                      RuntimeWarning, stacklevel=3)

    def stats(self):
        """The client's counters as a dict: pushed, sent, acked, dropped_local (dropped_ring,
        dropped_queue), dropped_daemon, rejected, released, in_flight, errors, alerts, ring_bytes,
        ring_used, queue_bytes, last_code, last_error; plus, from this binding: held (GPU pushes
        whose tensors this object keeps alive), held_bytes (their spans), dropped_busy (pushes
        dropped because another thread was inside the library) and dropped_held (GPU pushes
        dropped because the held budget was spent); these two are in neither 'pushed' nor
        'dropped_local'. After a daemon restart: dropped_disconnected (pushes dropped while not
        connected), abandoned (pushes in flight when the connection was lost: never
        acknowledged), disconnects, reconnects, and link ('up', 'reconnecting' or 'closed') with
        link_error (why it is not up)."""
        with self._lock:
            st = _lib.Counters()
            self._lib.attnstat_stats(self._handle(), ctypes.byref(st))
            d = _struct_dict(st)
            d["link"], d["link_error"] = self._link()
            d["held"] = len(self._held) + len(self._held_unseq)
            d["held_bytes"] = self._held_bytes
            d["dropped_held"] = self._dropped_held
            with self._count_lock:
                d["dropped_busy"] = self._dropped_busy
            return d

    def status(self, timeout_s=5):
        """The daemon's status as a dict (the fields of attnstat_daemon_status; 'workers' and
        'client_list' are lists of dicts, 'clients' is the number connected), with this client's
        versions beside the daemon's: 'client_version' (libattnstat's) and 'binding_version'
        (this package's). Works without a hello. It holds the client's lock while it waits for the reply (the library has no
        non-blocking form of it): pushes from other threads meanwhile are dropped as busy. Raises
        AttnstatError (ECLOSED) while the library reconnects to a daemon that went away."""
        with self._lock:
            self._enter()
            out = _lib.DaemonStatus()
            rc = self._lib.attnstat_status(self._handle(), ctypes.byref(out),
                                           _args.timeout_ms(timeout_s, "timeout_s"))
            self._raise_callback_error()
            self._check(rc)
        d = _struct_dict(out, skip=("workers", "client_list", "n_workers", "n_client_list",
                                    "rejections"))
        d["workers"] = [_struct_dict(out.workers[i])
                        for i in range(min(out.n_workers, _lib.STATUS_MAX_WORKERS))]
        d["client_list"] = [_struct_dict(out.client_list[i])
                            for i in range(min(out.n_client_list, _lib.STATUS_MAX_CLIENTS))]
        rej = []
        for i in range(min(getattr(out, "n_rejections", 0), _lib.STATUS_MAX_REJECTIONS)):
            r = out.rejections[i]
            rej.append({"code": _lib.PROTO_CODE_NAMES.get(r.code, "code %d" % r.code),
                        "count": r.count, "last_message": _s(r.last_message)})
        d["rejections"] = rej
        for k in ("n_rejections", "reserved2"):
            d.pop(k, None)
        version = _lib.optional(self._lib, "attnstat_version")
        d["client_version"] = _s(version()) if version else "?"
        d["binding_version"] = __version__
        return d

    def subscribe(self, alerts=True, results=False):
        """Asks the daemon to stream alerts (and every push's per-head results) to this
        connection; they reach the on_alert / on_result callbacks during poll()."""
        with self._lock:
            self._enter()
            a = bool(alerts) or self._subscribed[0]
            r = bool(results) or self._subscribed[1]
            rc = self._lib.attnstat_subscribe(self._handle(), int(a), int(r))
            self._check(rc)
            self._subscribed = (a, r)

    def _on(self, cbs, callback):
        with self._lock:
            cbs.append(callback)
        return callback

    def on_alert(self, callback, subscribe=True):
        """Calls callback(alert: Alert) for every alert; subscribes to alerts unless told not to.
        Returns the callback (usable as a decorator)."""
        self._on(self._alert_cbs, callback)
        if subscribe and not self._subscribed[0]:
            self.subscribe(alerts=True)
        return callback

    def on_result(self, callback):
        """Calls callback(seq, step, layer, heads: list of dicts) for pushes made with
        want_results=True (and, after subscribe(results=True), for every push)."""
        return self._on(self._result_cbs, callback)

    def on_rejected(self, callback):
        """Calls callback(seq, step, layer, code, message) for every push the daemon dropped or
        refused (its Ack was not OK)."""
        return self._on(self._ack_cbs, callback)

    def off(self, callback):
        """Takes callback off every on_* registration (so that what registered it can be let
        go); True when it was registered."""
        with self._lock:
            lists = (self._alert_cbs, self._result_cbs, self._ack_cbs)
            n = sum(cbs.count(callback) for cbs in lists)
            for cbs in lists:
                cbs[:] = [c for c in cbs if c != callback]
            return n > 0

    # ---- C callbacks ----------------------------------------------------------------------------
    def _dispatch(self, cbs, *args):
        self._in_callback = True
        try:
            for cb in list(cbs):
                try:
                    cb(*args)
                except BaseException as e:  # re-raised when the C call returns
                    if self._callback_error is None:
                        self._callback_error = e
        finally:
            self._in_callback = False

    def _on_alert_c(self, user, a):
        if not self._alert_cbs:
            return
        a = a.contents
        alert = Alert(run=_s(a.run), run_id=a.run_id, rank=a.rank, step=a.step, layer=a.layer,
                      head=a.head, rule=_s(self._lib.attnstat_rule_name(a.rule)),
                      state=_s(self._lib.attnstat_state_name(a.state)), value=a.value,
                      threshold=a.threshold, time_ms=a.time_ms, message=_s(a.message))
        self._dispatch(self._alert_cbs, alert)

    def _on_result_c(self, user, seq, step, layer, heads, n):
        if not self._result_cbs:
            return
        hs = [{f: getattr(heads[i], f) for f in _HEAD_FIELDS} for i in range(n)]
        self._dispatch(self._result_cbs, seq, step, layer, hs)

    def _on_ack_c(self, user, seq, step, layer, code, message):
        if self._ack_cbs:
            self._dispatch(self._ack_cbs, seq, step, layer, code, _s(message))

    def _on_release_c(self, user, seq):
        h = self._held.pop(seq, None)
        if h is not None:
            self._held_bytes -= h.nbytes

    def _raise_callback_error(self):
        e, self._callback_error = self._callback_error, None
        if e is not None:
            raise e

    # ---- lifetime -------------------------------------------------------------------------------
    @property
    def run_id(self):
        """The run id the daemon gave this connection, or -1."""
        with self._lock:
            return int(self._lib.attnstat_run_id(self._handle()))

    @property
    def library_path(self):
        return getattr(self._lib, "_attnstat_path", None)

    def fileno(self):
        """The socket descriptor, to wait on in a selector (readable: call poll(0)). It changes
        when the library reconnects, and is -1 while it is not connected."""
        with self._lock:
            return int(self._lib.attnstat_fd(self._handle()))

    @property
    def closed(self):
        return self._c is None

    def close(self):
        """Closes the connection. Pushes not yet acknowledged are abandoned: flush() first to
        wait for them. Safe to call twice; never raises because the daemon went away."""
        with self._lock:
            if self._in_callback:
                raise AttnstatError(_lib.ESTATE, "close() from inside a callback")
            c, self._c = self._c, None
            if c and os.getpid() == self._pid:  # a forked child leaves its parent's alone
                self._lib.attnstat_close(c)
            self._unhold_all()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def __del__(self, _getpid=os.getpid):
        # Runs when the last reference goes (the object is in no cycle of its own) or at
        # interpreter exit, when module globals may already be gone: nothing here may raise or
        # wait (attnstat_close only writes what the socket takes at once).
        try:
            c = self.__dict__.get("_c")
            if c and _getpid() == self.__dict__.get("_pid"):
                self._c = None
                self._lib.attnstat_close(c)
        except BaseException:
            pass

    def __repr__(self):
        return "<attnstat.Client socket=%r run=%r rank=%d%s%s>" % (
            self.socket, self.run, self.rank,
            " connect=background" if self.connect == "background" else "",
            " closed" if self._c is None else "")

    # ---- helpers --------------------------------------------------------------------------------
    def _handle(self):
        if self._c is None:
            raise AttnstatError(_lib.ESTATE, "the client is closed")
        if os.getpid() != self._pid:
            raise AttnstatError(_lib.ESTATE, "this client belongs to process %d (this is %d, a "
                                "fork): create a Client in each process that pushes"
                                % (self._pid, os.getpid()))
        return self._c

    def _enter(self):
        if self._in_callback:
            raise AttnstatError(_lib.ESTATE, "a callback must not call back into its client")

    def _last_error(self):
        m = self._lib.attnstat_last_error(self._c) if self._c else None
        return _s(m)

    def _check(self, rc):
        if rc != _lib.OK:
            msg = self._last_error() or _s(self._lib.attnstat_strerror(rc))
            raise AttnstatError(rc, msg)


def default_socket(lib=None):
    """The daemon's socket path by attnstatd's own rule."""
    if lib is None:
        lib = _lib.load()
    buf = ctypes.create_string_buffer(4096)
    p = lib.attnstat_default_socket(buf, len(buf))
    return _s(p)


