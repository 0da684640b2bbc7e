"""qk_clip on the device (a client in local mode): the step's own max logits, written by the
pushes into one CUDA buffer, turned into row factors and applied on the current stream with no
host synchronisation; attnstat.qk_clip_factors' rule in float64, for every layer of one shape at
once (a model's layers are usually all alike: a handful of operations per step, not per layer).

Stage: under torch/_qkclip.py (qk_clip makes a DeviceClip in device mode, and takes local and
scale_rows from here); imports nothing.
"""


def local(t):
    """A parameter's own rows: the local shard of a DTensor (tensor parallelism: ColwiseParallel
    shards q_proj and k_proj by rows, i.e. by heads, and this process's pushes and results
    number its own heads from 0), the tensor itself otherwise. Scaled in place, it scales the
    parameter."""
    return t.to_local() if hasattr(t, "to_local") and hasattr(t, "placements") else t


def scale_rows(lin, w, rows, rep=1):
    """lin's rows (its local weight w, and its bias) times rows, each repeated rep times."""
    if rep > 1:
        rows = rows.repeat_interleave(rep)
    w.mul_(rows.view(-1, *([1] * (w.dim() - 1))))
    if getattr(lin, "bias", None) is not None:
        local(lin.bias).mul_(rows)


def device_factors(torch, ml, tau, group):
    """attnstat.qk_clip_factors on the device for L layers at once: ml [L, H] float64 max logits
    (NaN, -inf or +inf: untouched) -> (q [L, H], k [L, H // group]): exactly 1 where the host
    rule gives 1, the others within a few ulps of its floats (PyTorch's kernels need not round
    each division as Python does)."""
    n_layers, h = ml.shape
    # tensor / tensor: a correctly rounded division (a float / tensor is reciprocal times float)
    gamma = torch.where((ml > tau) & torch.isfinite(ml), torch.full_like(ml, tau) / ml,
                        torch.ones_like(ml))
    g = gamma.view(n_layers, h // group, group)
    top = g.amax(2, keepdim=True)
    k = top.sqrt()
    q = torch.where(g == top, k, g / k).reshape(n_layers, h)
    return q, k.reshape(n_layers, h // group)


def device_rows(torch, q, k, d, form):
    """Each projection row's factor from the heads' (q [L, H], k [L, Hk]): a tuple with one
    [L, rows] tensor per projection qk_clip scales, in the order of the layer's (q, k) linears.
    form None: q rows per head d, then k rows; "fused": one projection, the query heads' rows,
    the key heads', the values' (by 1); (nope, rope, dv): latent attention, q_C by q, q_R by
    q * k (gamma), k_C by k, the values by 1 (qk_clip's documentation)."""
    n_layers, h = q.shape
    if form is None:
        return q.repeat_interleave(d, 1), k.repeat_interleave(d, 1)
    if form == "fused":
        return (torch.cat([q.repeat_interleave(d, 1), k.repeat_interleave(d, 1),
                           torch.ones_like(k).repeat_interleave(d, 1)], 1),)
    nope, rope, dv = form
    qr = torch.cat([q.view(n_layers, h, 1).expand(n_layers, h, nope),
                    (q * k).view(n_layers, h, 1).expand(n_layers, h, rope)], 2)
    kr = torch.cat([k.view(n_layers, h, 1).expand(n_layers, h, nope),
                    torch.ones(n_layers, h, dv, dtype=k.dtype, device=k.device)], 2)
    return qr.reshape(n_layers, -1), kr.reshape(n_layers, -1)


class DeviceClip(object):
    """The buffers and the step of device mode. layers: qk_clip's {layer: (q linear, k linear or
    None, rows per head, heads, group, form)}; monitor: gets each layer's view of the buffer as
    monitor.max_logit_out[layer]. Layers of one shape (rows per head, heads, group, form) are
    contiguous in the buffer and computed together."""

    def __init__(self, torch, layers, monitor):
        self.layers = layers
        weights = [local(layers[l][0].weight) for l in sorted(layers)]
        dev = weights[0].device
        if any(w.device != dev for w in weights):
            raise ValueError("qk_clip on the device: the layers' weights are on several devices "
                             "(%s); give each device's layers a qk_clip of their own"
                             % sorted({str(w.device) for w in weights}))
        by_shape = {}
        for layer in sorted(layers):
            by_shape.setdefault(tuple(layers[layer][2:]), []).append(layer)
        self.batches, self.offsets, total = [], {}, 0
        for spec, members in by_shape.items():
            lo = total
            for layer in members:
                self.offsets[layer] = (total, spec[1])
                total += spec[1]
            self.batches.append((spec, members, lo, total))
        self.all = torch.full((total,), float("nan"), dtype=torch.float64, device=dev)
        for layer, (off, h) in self.offsets.items():
            monitor.max_logit_out[layer] = self.all[off:off + h]
        # the values go to the host for the record, through two pinned buffers in turn
        self.host = [torch.empty(total, dtype=torch.float64, pin_memory=True) for _ in range(2)]
        self.copied = [torch.cuda.Event(), torch.cuda.Event()]
        self.turn = 0
        self.pending = []  # (step, buffer index): copies not yet read, oldest first

    def step(self, torch, client, tau, st, drain_one):
        """The buffer's device's current stream waits for the pushed computations, then clips
        from their values on it; the values are copied to the host for the record
        (drain_one(wait=True) reads the oldest copy first when its buffer is needed again).
        Returns the heads clipped in the copies it had to read so."""
        dev = self.all.device
        n = 0
        with torch.cuda.device(dev), torch.no_grad():
            client.local_wait(torch.cuda.current_stream(dev))
            for (d, h, group, form), members, lo, hi in self.batches:
                q, k = device_factors(torch, self.all[lo:hi].view(len(members), h), tau, group)
                for which, rows in enumerate(device_rows(torch, q, k, d, form)):
                    cast = {}
                    for j, layer in enumerate(members):
                        lin = self.layers[layer][which]
                        w = local(lin.weight)
                        if w.dtype not in cast:
                            cast[w.dtype] = rows.to(w.dtype)
                        scale_rows(lin, w, cast[w.dtype][j])
            i = self.turn
            self.turn ^= 1
            while self.pending and self.pending[0][1] == i:
                n += drain_one(wait=True) or 0  # two steps old: done long ago
            self.host[i].copy_(self.all, non_blocking=True)
            self.copied[i].record(torch.cuda.current_stream(dev))
            self.all.fill_(float("nan"))  # a layer not pushed in a step is not clipped in it
        self.pending.append((st, i))
        return n

    def take(self, wait):
        """The oldest copy's (step, {layer: [max logit per head]}), or None when there is none
        or (wait False) it has not reached the host yet."""
        if not self.pending:
            return None
        st, i = self.pending[0]
        if wait:
            self.copied[i].synchronize()
        elif not self.copied[i].query():
            return None
        self.pending.pop(0)
        vals = self.host[i].tolist()
        return st, {l: vals[off:off + h] for l, (off, h) in self.offsets.items()}
