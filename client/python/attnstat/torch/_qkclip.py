"""attnstat.torch.qk_clip: QK-Clip (MuonClip's per-head rule) driven by the max logits attnstat
measures, applied to the model's query and key projection rows after each optimizer step.

    client = attnstat.Client(run="llama", rank=0)
    with attnstat.torch.monitor(client, every=1, model=model, want_results=True) as mon, \\
            attnstat.torch.qk_clip(client, model, tau=100.0, monitor=mon) as clip:
        for batch in data:
            loss = model(**batch).loss
            loss.backward()
            opt.step()
            clip.step()          # the heads whose measured max logit passed tau
            opt.zero_grad()

The factors are attnstat.qk_clip_factors' (client/python/attnstat/_qkclip.py says the rule and
why a grouped-query layer's shared key rows take the group's mildest clip), from each head's
largest max logit over one optimizer step's results: given the monitor, the forwards whose
monitor steps fall between two step() calls are one optimizer step (gradient accumulation's
micro-batches, each its own step with auto_step); without it, each step is. Each is applied once:
the newest optimizer step's results that have arrived replace an older one's, and a result of one
already applied is dropped. The results come back from attnstatd with the pushes' Acks, so a
step's clip uses the newest the daemon has answered: usually the step's own (its kernel finishes
during the backward pass: lag 0 at every step of bench/bench_qkclip.py on the H100), else an
older one. Given the monitor, `clip.lag` is the last gap seen. The monitor must
push with want_results=True, and every step (every=1) for a clip at every step; stats="max_logit"
makes its kernel skip the entropy's exps. Since the clip scales the weights after the optimizer
step from logits measured before it (MuonClip's order), the next step's max logit passes tau by
that step's growth, whatever the lag (bench/RESULTS.md measures it).

On the device (a client in local mode, Client(local_compute=True), the monitor given, CUDA
weights; device="auto" turns it on): each layer has a CUDA float64 buffer of its heads' max
logits that the layer's pushes fold theirs into on the device (Client.push's max_logit_out: the
largest since the last step(), as above), and step() makes the current stream wait for the
step's computations (Client.local_wait), computes the factors there with the same rule in
float64, scales the rows and sets the buffers back to NaN (a layer the monitor did not push in a
step is not clipped in it). The step's own max logits
(lag 0), and no host synchronisation inside the step: every head's rows are multiplied, by 1
where the head is under tau. The clips are counted and recorded once the max logits' copy to
the host is done (at a later step(), or stats() and close(), which wait for it), so step()
returns the heads of earlier steps' clips.

Each layer clipped is recorded in the run's history (Client.intervention, kind "qk_clip": the
heads, the factor each head's logits scale by, tau, the largest measured max logit), listed by
`attnstat interventions RUN`; stats() counts what was recorded, dropped while reconnecting, or
refused (an older daemon records none: said once, the clip goes on).

Which rows: a transformers attention module (one with layer_idx, q_proj, k_proj and head_dim: the
layer number the monitor pushes is its layer_idx), or, for any other model, projections={layer:
(q_linear, k_linear, head_dim)}. Rows of head h are h*head_dim .. (h+1)*head_dim - 1 of the
linear's weight (and bias).
Multi-head latent attention (DeepSeek-V3 and Kimi K2, the models MuonClip was made for: a
transformers module with layer_idx, kv_b_proj, q_proj or q_b_proj, qk_nope_head_dim,
qk_rope_head_dim and v_head_dim; or projections={layer: {"q": q_linear, "kv": kv_b_linear,
"nope": n, "rope": r, "v": dv}}) is clipped as MuonClip clips it: of head h's rows, the
non-rotary query part q_C (the first n of its n + r rows of q) and key part k_C (the first n of
its n + dv rows of kv_b) scale by sqrt(gamma_h), the rotary query part q_R (the last r) by
gamma_h, and neither the rotary key, which every head shares (kv_a_proj_with_mqa), nor the
values are touched: each clipped head's logits scale by gamma_h and no other head's change.
Fused projections (Phi-3 and Phi-4's qkv_proj: a transformers module with layer_idx, qkv_proj and
head_dim; or projections={layer: {"qkv": linear, "heads": hq, "kv_heads": hk, "head_dim": d}}):
the query heads' rows first, then the key heads', then the values' (left alone); a fused
projection sharded by tensor parallelism is refused (its shards mix the three).
A layer that normalises q and k after projecting them (q_norm /
k_norm: QK-norm) cannot be clipped through its projections: refused when found. Under tensor
parallelism (DTensor weights sharded by rows, ColwiseParallel, as torchtitan and PyTorch's plans
shard q_proj and k_proj) each process clips its own heads: its pushes' results number them from 0
(the daemon stores them globally), and the rows it scales are its local shard's; a projection
sharded across its input features is refused.
"""
from .._qkclip import check_tau, qk_clip_factors
from ._qkclip_dev import DeviceClip, scale_rows
from ._qkclip_dev import local as _local


class qk_clip(object):
    """See the module's documentation. client: the attnstat.Client the monitor pushes through
    (with want_results=True). model: an nn.Module (its transformers attention modules are found
    by their layer_idx), or None with projections. tau: the max logit no head should pass (the
    daemon's logit_ceiling by default is 100 too). projections: {layer: (q_linear, k_linear,
    head_dim)}, or {layer: {"q": q_linear, "kv": kv_b_linear, "nope": n, "rope": r, "v": dv}}
    for latent attention, or {layer: {"qkv": linear, "heads": hq, "kv_heads": hk, "head_dim":
    d}} for a fused projection, used instead of the model's. monitor: the attnstat.torch.monitor
    pushing them, for the lag (its current step minus the step of the result a clip used).
    device: "auto" (on with a client in local mode, a monitor and CUDA weights), True or False:
    each push folds its heads' max logits into a CUDA tensor of this object's, and step() makes
    the current stream wait for them and clips from them on the device: the step's own max
    logits (lag 0), no host synchronisation (the module's documentation).

    step() applies what arrived since the last call and returns how many heads it clipped (on
    the device: the heads of earlier steps' clips that became known since; stats() and close()
    wait for the rest); stats() says what was clipped so far (per layer), and the lag of the
    results used."""

    def __init__(self, client, model=None, tau=100.0, projections=None, monitor=None,
                 device="auto"):
        self.tau = check_tau(tau)
        self.client = client
        self.monitor = monitor
        self._layers = {}
        if projections is not None:
            for layer, p in dict(projections).items():
                what = "layer %s" % layer
                if isinstance(p, dict) and "qkv" in p:
                    self._layers[int(layer)] = self._fused(p["qkv"], p.get("heads"),
                                                           p.get("kv_heads"), p.get("head_dim"),
                                                           what)
                elif isinstance(p, dict):
                    self._layers[int(layer)] = self._mla(p.get("q"), p.get("kv"), p.get("nope"),
                                                         p.get("rope"), p.get("v"), what)
                else:
                    ql, kl, d = p
                    self._layers[int(layer)] = self._layer(ql, kl, int(d), what)
        elif model is not None:
            for name, m in model.named_modules():
                if hasattr(m, "layer_idx") and (getattr(m, "q_norm", None) is not None or
                                                getattr(m, "k_norm", None) is not None):
                    raise ValueError("%s normalises q and k after their projections (QK-norm):"
                                     " scaling the projections' rows does not change its "
                                     "logits, so qk_clip cannot clip it" % name)
                if all(hasattr(m, a) for a in ("layer_idx", "kv_b_proj", "qk_nope_head_dim",
                                               "qk_rope_head_dim", "v_head_dim")):
                    ql = getattr(m, "q_b_proj", None)
                    self._layers[int(m.layer_idx)] = self._mla(
                        ql if ql is not None else getattr(m, "q_proj", None), m.kv_b_proj,
                        m.qk_nope_head_dim, m.qk_rope_head_dim, m.v_head_dim, name)
                elif all(hasattr(m, a) for a in ("layer_idx", "qkv_proj", "head_dim")):
                    cfg = getattr(m, "config", None)
                    hq = getattr(m, "num_heads", getattr(cfg, "num_attention_heads", None))
                    hk = getattr(m, "num_key_value_heads",
                                 getattr(cfg, "num_key_value_heads", None))
                    self._layers[int(m.layer_idx)] = self._fused(m.qkv_proj, hq, hk, m.head_dim,
                                                                 name)
                elif all(hasattr(m, a) for a in ("layer_idx", "q_proj", "k_proj", "head_dim")):
                    self._layers[int(m.layer_idx)] = self._layer(m.q_proj, m.k_proj,
                                                                 int(m.head_dim), name)
        if not self._layers:
            raise ValueError("no attention layer to clip: give a transformers model (attention "
                             "modules with layer_idx, q_proj, k_proj, head_dim, or multi-head "
                             "latent attention's kv_b_proj) or projections={layer: (q_linear, "
                             "k_linear, head_dim)} ({layer: {'q':, 'kv':, 'nope':, 'rope':, "
                             "'v':}} for latent attention)")
        import threading
        # observe() runs in whichever thread polls the client (a background poller's too): the
        # results, the steps applied and the step bounds change under this lock
        self._lock = threading.Lock()
        self._latest = {}    # layer -> (optimizer step, newest step, [largest max logit per head])
        self._applied = {}   # layer -> the optimizer step (_group) applied last
        self._bounds = []    # the monitor's step at each step() call (the last ones), and
        self._bounds_off = 0  # how many earlier ones were let go
        self.clipped = {}    # layer -> heads clipped so far
        self.unmeasured = {}  # device mode: layer -> steps whose clip had no value of it
        self.steps = 0       # step() calls that clipped a head
        self.lag = None      # the monitor's step minus the step of the result applied last
        self._closed = False
        self._pinned = {}    # (layer, "q" | "k") -> (pinned buffer, event after its last copy)
        self.recorded = 0         # clips recorded in the run's history (Client.intervention)
        self.record_dropped = 0   # not recorded: the library was reconnecting
        self.record_errors = 0    # not recorded: refused, or a daemon that records none
        self._record_off = False
        self._warned = False
        self.poll_errors = 0      # step()'s reads of results that failed (said once)
        self._poll_warned = False
        self._dev = self._device_clip(device)  # device mode: its buffers and step
        self.device = self._dev is not None
        client.on_result(self.observe)

    def _device_clip(self, device):
        """Device mode's DeviceClip (its buffers given to the monitor), or None: "auto" takes it
        where everything it needs is there, else clips from the results."""
        from .. import _pushargs
        mon = self.monitor
        asked = getattr(mon, "stats_asked", 0)
        why = None
        if not getattr(self.client, "local_compute", False):
            why = "the client is not in local mode (Client(local_compute=True))"
        elif mon is None or not hasattr(mon, "max_logit_out"):
            why = "no attnstat.torch.monitor given (monitor=)"
        elif not all(getattr(_local(p[0].weight), "is_cuda", False)
                     for p in self._layers.values()):
            why = "the projections are not on a GPU"
        elif len({str(_local(p[0].weight).device) for p in self._layers.values()}) > 1:
            why = "the projections are on several devices"
        elif getattr(mon, "copy_to_host", False):
            why = "the monitor copies the tensors to the host (copy_to_host=True)"
        elif asked and not asked & _pushargs.STATS_BY_NAME["max_logit"]:
            why = "the monitor's stats leave out the max logit"
        elif not _pushargs.max_out_supported(getattr(self.client, "_lib", None)):
            why = "this libattnstat cannot fold max logits on the device (an older one)"
        if device == "auto":
            device = why is None
        elif device and why is not None:
            raise ValueError("qk_clip(device=True) reads the max logits on the device, but %s"
                             % why)
        if not device:
            return None
        import torch
        return DeviceClip(torch, self._layers, self.monitor)

    @staticmethod
    def _by_rows(what, *lins):
        for lin in lins:
            pl = getattr(lin.weight, "placements", None)
            if pl is not None and any(getattr(x, "dim", 0) not in (0, None) and x.is_shard()
                                      for x in pl):
                raise ValueError("%s: a projection's weight is sharded across its input "
                                 "features (%s): qk_clip scales whole rows of heads, which needs "
                                 "them sharded by rows (ColwiseParallel) or whole" % (what, pl))

    @classmethod
    def _layer(cls, ql, kl, d, what):
        """(q linear, k linear, rows per head, query heads, query heads per key head, None)."""
        cls._by_rows(what, ql, kl)
        hq, hk = _local(ql.weight).shape[0], _local(kl.weight).shape[0]
        if d < 1 or hq % d or hk % d or (hq // d) % (hk // d):
            raise ValueError("%s: q rows %d and k rows %d are not whole heads of %d with query "
                             "heads a multiple of key heads" % (what, hq, hk, d))
        return (ql, kl, d, hq // d, (hq // d) // (hk // d), None)

    @classmethod
    def _mla(cls, ql, kvl, nope, rope, dv, what):
        """Latent attention: (q linear, kv_b linear, 0, heads, 1, (nope, rope, dv)), head h's q
        rows h*(nope + rope) .., its kv_b rows h*(nope + dv) .. (the module's docstring)."""
        if ql is None or kvl is None or nope is None or rope is None or dv is None:
            raise ValueError("%s: latent attention needs its q (q_proj or q_b_proj) and kv_b "
                             "projections and qk_nope_head_dim, qk_rope_head_dim, v_head_dim"
                             % what)
        nope, rope, dv = int(nope), int(rope), int(dv)
        cls._by_rows(what, ql, kvl)
        hq, hk = _local(ql.weight).shape[0], _local(kvl.weight).shape[0]
        if nope < 1 or rope < 0 or dv < 1 or hq % (nope + rope) or hk % (nope + dv) or \
                hq // (nope + rope) != hk // (nope + dv):
            raise ValueError("%s: q rows %d and kv_b rows %d are not the same number of heads of "
                             "%d + %d and %d + %d rows" % (what, hq, hk, nope, rope, nope, dv))
        return (ql, kvl, 0, hq // (nope + rope), 1, (nope, rope, dv))

    @staticmethod
    def _fused(lin, hq, hk, d, what):
        """One projection for q, k and v: (linear, None, head_dim, query heads, query heads per
        key head, "fused"), query rows first, then key rows, then value rows."""
        if hq is None or hk is None or d is None:
            raise ValueError("%s: a fused q/k/v projection needs its query and key heads and "
                             "head_dim" % what)
        hq, hk, d = int(hq), int(hk), int(d)
        if getattr(lin.weight, "placements", None) is not None:
            raise ValueError("%s: a fused q/k/v projection sharded by tensor parallelism (its "
                             "shards mix query, key and value rows): qk_clip cannot tell its "
                             "heads' rows apart" % what)
        rows = lin.weight.shape[0]
        if hq < 1 or hk < 1 or d < 1 or hq % hk or rows != (hq + 2 * hk) * d:
            raise ValueError("%s: %d rows are not %d query and %d key and value heads of %d"
                             % (what, rows, hq, hk, d))
        return (lin, None, d, hq, hq // hk, "fused")

    def _group(self, step):
        """The optimizer step a result's step belongs to: with the monitor, the number of the
        first step() call whose monitor step was >= it (the forwards between two step() calls,
        gradient accumulation's included, are one); without, the step itself."""
        if self.monitor is None:
            return step
        import bisect
        return self._bounds_off + bisect.bisect_left(self._bounds, step)

    def observe(self, seq, step, layer, heads):
        """A result (Client.on_result's arguments): each head's max logit folded into the largest
        of its layer's results of the same optimizer step (_group; NaN: not measured); a newer
        optimizer step's replace an older one's not yet applied, and one already applied is
        dropped (not in device mode, which has read them on the device)."""
        if self._closed or layer not in self._layers or self.device:
            return
        with self._lock:
            self._observe(step, layer, heads)

    def _observe(self, step, layer, heads):
        g = self._group(step)
        done = self._applied.get(layer)
        prev = self._latest.get(layer)
        if (done is not None and g <= done) or (prev is not None and g < prev[0]):
            return
        if prev is None or g > prev[0]:
            prev = (g, step, [float("nan")] * self._layers[layer][3])
        _, st, ml = prev
        for h in heads:
            x = h["max_logit"]
            if 0 <= h["head"] < len(ml) and (ml[h["head"]] != ml[h["head"]] or x > ml[h["head"]]):
                ml[h["head"]] = x
        self._latest[layer] = (g, max(st, step), ml)

    def step(self):
        """Scale the projection rows of every head whose measured max logit passed tau
        (the results that arrived since the last call); returns the number of heads clipped."""
        import torch
        try:
            self.client.poll(0)  # results waiting in the socket are read now
        except Exception as e:  # a link closed for good, or a callback that raised: the step
            self.poll_errors += 1  # goes on with the results already here
            if not self._poll_warned:
                self._poll_warned = True
                import warnings
                warnings.warn("qk_clip: reading results failed (%s); clipping goes on with the "
                              "results that arrived (counted in stats()['poll_errors'])" % e,
                              RuntimeWarning, stacklevel=2)
        if self.device:  # (the heads of a copy it had to wait for first, then those arrived)
            n = self._dev.step(torch, self.client, self.tau,
                               getattr(self.monitor, "current_step", None), self._drain_one)
            while True:  # the clips whose values have reached the host
                got = self._drain_one(wait=False)
                if got is None:
                    return n
                n += got
        # each layer it clips is recorded in the run's history (`attnstat interventions`).
        # The results are taken at once, and their steps marked applied, under the lock: a result
        # arriving meanwhile in another thread is either in them, or of a newer step and kept for
        # the next step(), or of a step being applied and dropped (never applied twice).
        with self._lock:
            latest, self._latest = self._latest, {}
            for layer, (g, _, _) in latest.items():
                self._applied[layer] = g
        try:
            n = self._apply(torch, latest)
        finally:  # the end of this optimizer step's forwards, whatever the clip did
            cur = getattr(self.monitor, "current_step", None)
            if cur is not None:
                with self._lock:
                    self._bounds.append(cur)
                    if len(self._bounds) > 256:  # results older than the last 128: applied
                        del self._bounds[:128]
                        self._bounds_off += 128
        if n:
            self.steps += 1
        return n

    def _apply(self, torch, latest):
        """The rows of each head of latest ({layer: (group, step, max logits)}) over tau
        scaled; the number of heads clipped."""
        n = 0
        for layer, (g, st, ml) in sorted(latest.items()):
            ql, kl, d, heads, group, form = self._layers[layer]
            q, k = qk_clip_factors(ml, self.tau, group)
            over = sum(1 for f in q if f < 1.0)
            if over:
                # (which, linear, its rows' factors, rows per factor, the heads' factors)
                if form is None:
                    per = (("q", ql, q, d, q), ("k", kl, k, d, k))
                elif form == "fused":  # q rows, k rows, then the values' (by 1)
                    per = (("qkv", ql, list(q) + list(k) + [1.0] * len(k), d, q),)
                else:  # latent: q_C and k_C by sqrt(gamma) (q_h = k_h), q_R by gamma, values by 1
                    import numpy as np  # each row's factor, a head's parts side by side
                    nope, rope, dv = form
                    qa, ka = np.asarray(q, dtype=np.float64), np.asarray(k, dtype=np.float64)
                    qr = np.repeat(np.stack([qa, qa * ka], 1), [nope, rope], axis=1).reshape(-1)
                    kr = np.repeat(np.stack([ka, np.ones_like(ka)], 1), [nope, dv],
                                   axis=1).reshape(-1)
                    per = (("q", ql, qr, 1, q), ("k", kl, kr, 1, k))
                with torch.no_grad():
                    for which, lin, f, rep, heads_f in per:
                        if all(x == 1.0 for x in heads_f):
                            continue
                        w = _local(lin.weight)
                        scale_rows(lin, w, self._factors(torch, (layer, which), f, w), rep)
                self.clipped[layer] = self.clipped.get(layer, 0) + over
                n += over
                self._record(st, layer, ml, q, k, group)
            cur = getattr(self.monitor, "current_step", None)
            if cur is not None:
                self.lag = cur - st
        return n

    def _drain_one(self, wait):
        """Device mode: the oldest clip whose max logits reached the host (wait: waiting for
        them), counted and recorded as the host mode's are; the heads it clipped, or None when
        there is none. A layer with no value at all in it (not pushed that step: every > 1, a
        dropped push, one that could not fold into it) is counted in unmeasured; the lag is 0
        once a clip had values (the step's own), None until then."""
        got = self._dev.take(wait)
        if got is None:
            return None
        st, by_layer = got
        n = 0
        for layer, ml in sorted(by_layer.items()):
            if all(x != x for x in ml):
                self.unmeasured[layer] = self.unmeasured.get(layer, 0) + 1
                continue
            self.lag = 0
            group = self._layers[layer][4]
            q, k = qk_clip_factors(ml, self.tau, group)
            over = sum(1 for f in q if f < 1.0)
            if over:
                self.clipped[layer] = self.clipped.get(layer, 0) + over
                n += over
                self._record(st, layer, ml, q, k, group)
        if n:
            self.steps += 1
        return n

    def _record(self, step, layer, ml, q, k, group):
        """The layer's clip into the run's history (Client.intervention): the heads clipped, the
        factor each one's logits scale by (q_h * k_g = gamma_h), tau, the largest max logit among
        them. Never stops the clip: a daemon that records none (older), or a refusal, is said
        once (RuntimeWarning) and counted; a drop while reconnecting is counted."""
        if self._record_off:
            return
        heads = [h for h, f in enumerate(q) if f < 1.0]
        gammas = [q[h] * k[h // group] for h in heads]
        try:
            sent = self.client.intervention("qk_clip", step, layer=layer, heads=heads,
                                            values=gammas, threshold=self.tau,
                                            measured=max(ml[h] for h in heads))
        except Exception as e:  # AttnstatError: ENOTSUP (an older daemon), or a refusal
            self.record_errors += 1
            from .. import _lib
            if getattr(e, "code", None) == _lib.ENOTSUP:  # an older daemon: it never will
                self._record_off = True
            if not self._warned:
                self._warned = True
                import warnings
                warnings.warn("qk_clip: clips are applied but not recorded in the run's history: "
                              "%s" % e, RuntimeWarning, stacklevel=3)
            return
        if sent:
            self.recorded += 1
        else:
            self.record_dropped += 1

    def _factors(self, torch, key, f, weight):
        """The factors f as a tensor of weight's dtype on weight's device. On a GPU, copied from
        a pinned buffer of their own (one per layer and projection, reused once the copy out of
        it a step earlier is done) without waiting: a copy from pageable memory would hold the
        host until the GPU had run everything queued before it, every step."""
        if getattr(weight.device, "type", weight.device) != "cuda":
            return torch.tensor(f, dtype=weight.dtype, device=weight.device)
        buf, done = self._pinned.get(key, (None, None))
        if buf is None or buf.numel() != len(f):
            buf = torch.empty(len(f), dtype=torch.float32, pin_memory=True)
            done = None
        elif done is not None:
            done.synchronize()
        buf.numpy()[:] = f
        g = buf.to(device=weight.device, non_blocking=True)
        done = done if done is not None else torch.cuda.Event()  # one per buffer, recorded again
        done.record(torch.cuda.current_stream(weight.device))
        self._pinned[key] = (buf, done)
        return g.to(weight.dtype)

    def stats(self):
        while self.device and self._drain_one(wait=True) is not None:
            pass
        return {"tau": self.tau, "clipped_heads": sum(self.clipped.values()),
                "clipped_by_layer": dict(self.clipped), "steps_clipped": self.steps,
                "lag": self.lag, "layers": sorted(self._layers), "recorded": self.recorded,
                "record_dropped": self.record_dropped, "record_errors": self.record_errors,
                "device": self.device, "unmeasured_by_layer": dict(self.unmeasured),
                "poll_errors": self.poll_errors}

    def close(self):
        off = getattr(self.client, "off", None)
        if callable(off) and not self._closed:
            off(self.observe)  # the client holds this clip (and its model) no longer
        if self.device and not self._closed:
            while self._drain_one(wait=True) is not None:
                pass
            for layer in self._layers:
                self.monitor.max_logit_out.pop(layer, None)
        self._closed = True

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False
