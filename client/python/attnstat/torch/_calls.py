"""One attention call, described the way the daemon takes it, from each door a model uses.

Every door (torch's scaled_dot_product_attention and flex_attention, FlashAttention's
flash_attn_func / flash_attn_varlen_func, FlashAttention 3's (flash_attn_interface), transformers'
attention interface) hands its arguments to one of the from_* functions here, which returns a Call
(what to push) or a Skip (why the call cannot be described exactly: it is then counted and warned
about once, never guessed).

Conventions kept from each library:
  - SDPA: attn_mask broadcastable to [B, H, Nq, Nk]; boolean True = the key takes part, float =
    added to the logits (-inf excludes); is_causal is top-left aligned in SDPA but the two agree
    for Nq == Nk, the only case SDPA's training calls use (Nq != Nk with is_causal is skipped).
  - FlashAttention: [B, N, H, D] tensors (layout 'bnhd'); causal bottom-right aligned;
    window_size=(left, right), -1 = unbounded; softcap; varlen: [total, H, D] with int32
    cu_seqlens of every sequence's start (device tensors are passed by reference, no copy).
  - flex_attention: a BlockMask's mask_mod is evaluated into a dense boolean mask (bounded by
    mask_bytes_max); a score_mod cannot be described and the call is skipped.
Nothing here synchronises the device or copies q and k.
"""
import sys


class Skip(object):
    """A call that is not pushed: kind (a short key, one warning per kind) and why (a sentence)."""
    __slots__ = ("kind", "why")

    def __init__(self, kind, why):
        self.kind, self.why = kind, why

    def __repr__(self):
        return "Skip(%s: %s)" % (self.kind, self.why)


class Call(object):
    """What one push carries. q, k: tensors in `layout` ('bhnd' or 'bnhd'); attn_mask: None or a
    4-D view broadcastable to [B, Hq, Nq, Nk]; cu_seqlens_q/k: None or int32 tensors (packed
    sequences, B = 1); layer: an explicit layer number (transformers' layer_idx) or None; sinks:
    None or the per-head sink logits [Hq] that join every row's softmax; heads: the number of query
    heads the model's configuration gives this call's module (0: unknown), so that a process that
    holds a shard of the heads is never stored as the whole layer."""
    __slots__ = ("q", "k", "layout", "causal", "scale", "window", "softcap", "attn_mask",
                 "cu_seqlens_q", "cu_seqlens_k", "layer", "sinks", "heads")

    def __init__(self, q, k, layout="bhnd", causal=False, scale=None, window=None, softcap=0.0,
                 attn_mask=None, cu_seqlens_q=None, cu_seqlens_k=None, layer=None, sinks=None,
                 heads=0):
        self.q, self.k, self.layout = q, k, layout
        self.causal, self.scale, self.window, self.softcap = bool(causal), scale, window, softcap
        self.attn_mask = attn_mask
        self.cu_seqlens_q, self.cu_seqlens_k = cu_seqlens_q, cu_seqlens_k
        self.layer = layer
        self.sinks = sinks    # [Hq] per-head sink logits (gpt-oss), or None
        self.heads = heads    # the model's configured query heads for this call (0: unknown)

    def push_kwargs(self):
        """The keyword arguments of Client.push for this call (step, layer, q, k apart)."""
        kw = {"causal": self.causal, "layout": self.layout,
              "scale": float(self.scale) if self.scale is not None else 0.0}
        if self.window is not None:
            kw["window"] = tuple(self.window)
        if self.softcap:
            kw["softcap"] = float(self.softcap)
        if self.attn_mask is not None:
            kw["attn_mask"] = self.attn_mask
        if self.cu_seqlens_q is not None:
            kw["cu_seqlens_q"] = self.cu_seqlens_q
            kw["cu_seqlens_k"] = self.cu_seqlens_k
        if self.sinks is not None:
            kw["sinks"] = self.sinks
        return kw


_FLOATS = ("torch.float32", "torch.float16", "torch.bfloat16")
TENSOR = None  # torch.Tensor once a monitor started with PyTorch (a check Dynamo can trace)


def _is_tensor(t):
    if TENSOR is not None:
        return isinstance(t, TENSOR)
    return t is not None and callable(getattr(t, "data_ptr", None))


def _dims(t):
    shape = getattr(t, "shape", None)
    return None if shape is None else len(shape)


def local(t):
    """A DTensor's local shard (tensor parallelism hands attention the local heads; the layout
    gives them their global numbers); any other object as it is."""
    if hasattr(t, "placements") and callable(getattr(t, "to_local", None)):
        return t.to_local()
    return t


def _check_qk(q, k, want_dims, what):
    for name, t in (("query", q), ("key", k)):
        if not _is_tensor(t):
            return Skip("shape", "%s calls whose %s is not a tensor are not monitored"
                        % (what, name))
        if str(t.dtype) not in _FLOATS:
            return Skip("dtype", "%s calls with %s dtype %s are not monitored (float32, float16 "
                        "and bfloat16 are)" % (what, name, t.dtype))
    if _dims(q) not in want_dims or _dims(k) != _dims(q):
        return Skip("shape", "%s calls whose query/key are not %s-D tensors are not monitored"
                    % (what, " or ".join(str(d) for d in want_dims)))
    return None


def _mask_4d(m, what):
    """SDPA's attn_mask as a 4-D view [B|1, H|1, Nq, Nk] (a view: no copy), or a Skip."""
    if str(getattr(m, "dtype", "")) not in ("torch.bool",) + _FLOATS:
        return Skip("mask-dtype", "%s calls with an attn_mask of dtype %s are not monitored "
                    "(bool and float masks are)" % (what, getattr(m, "dtype", type(m).__name__)))
    nd = _dims(m)
    if nd is None or nd < 2 or nd > 4:
        return Skip("mask-shape", "%s calls with a %s-D attn_mask are not monitored" % (what, nd))
    while m.dim() < 4:
        m = m.unsqueeze(0)
    return m


# ---- torch.nn.functional.scaled_dot_product_attention ------------------------------------------
_SDPA_ARGS = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa")


def from_sdpa(args, kwargs):
    a = dict(zip(_SDPA_ARGS, args))
    a.update(kwargs)
    q, k = local(a.get("query")), local(a.get("key"))
    bad = _check_qk(q, k, (3, 4), "scaled_dot_product_attention")
    if bad is not None:
        return bad
    one_head = _dims(q) == 3
    if one_head:  # [B, N, D]: one head
        q, k = q.unsqueeze(1), k.unsqueeze(1)
    causal = bool(a.get("is_causal", False))
    if causal and q.shape[2] != k.shape[2]:
        return Skip("causal-align", "scaled_dot_product_attention calls with is_causal and "
                    "Nq != Nk are not monitored (SDPA aligns causal masks top-left there)")
    mask = a.get("attn_mask")
    if mask is not None:
        if one_head and _dims(mask) == 3:  # [B, Nq, Nk] against [B, Nq, Nk] weights
            mask = mask.unsqueeze(1)
        mask = _mask_4d(mask, "scaled_dot_product_attention")
        if isinstance(mask, Skip):
            return mask
    return Call(q, k, causal=causal, scale=a.get("scale"), attn_mask=mask)


# ---- FlashAttention -----------------------------------------------------------------------------
_FA_ARGS = ("q", "k", "v", "dropout_p", "softmax_scale", "causal", "window_size", "softcap",
            "alibi_slopes", "deterministic", "return_attn_probs")
_FA_VARLEN_ARGS = ("q", "k", "v", "cu_seqlens_q", "cu_seqlens_k", "max_seqlen_q", "max_seqlen_k",
                   "dropout_p", "softmax_scale", "causal", "window_size", "softcap",
                   "alibi_slopes", "deterministic", "return_attn_probs", "block_table")


def _fa_common(a, what):
    if a.get("alibi_slopes") is not None:
        return Skip("alibi", "%s calls with alibi_slopes are not monitored (a per-head bias the "
                    "daemon cannot describe)" % what)
    if a.get("block_table") is not None:
        return Skip("paged", "%s calls with a block_table (paged KV cache) are not monitored"
                    % what)
    w = a.get("window_size", (-1, -1))
    try:
        wl, wr = (int(w[0]), int(w[1])) if w is not None else (-1, -1)
    except (TypeError, ValueError, IndexError):
        return Skip("window", "%s calls with window_size %r are not monitored" % (what, w))
    window = None if (wl < 0 and wr < 0) else (wl, wr)
    return dict(causal=bool(a.get("causal", False)), scale=a.get("softmax_scale"),
                window=window, softcap=float(a.get("softcap", 0.0) or 0.0))


def _fa_call(names, common, what, varlen, args, kwargs):
    """A FlashAttention call: args bound to names, the options by common (_fa_common or
    _fa3_common), q and k [B, N, H, D], or [total, H, D] with cu_seqlens (varlen)."""
    a = dict(zip(names, args))
    a.update(kwargs)
    q, k = a.get("q"), a.get("k")
    bad = _check_qk(q, k, (3,) if varlen else (4,), what)
    if bad is not None:
        return bad
    c = common(a, what)
    if isinstance(c, Skip):
        return c
    if not varlen:
        return Call(q, k, layout="bnhd", **c)
    cq, ck = a.get("cu_seqlens_q"), a.get("cu_seqlens_k")
    if cq is None or ck is None:
        return Skip("varlen", "%s calls without cu_seqlens are not monitored" % what)
    # [total, H, D] -> [1, total, H, D]: one packed batch, sequences given by cu_seqlens
    return Call(q.unsqueeze(0), k.unsqueeze(0), layout="bnhd", cu_seqlens_q=cq, cu_seqlens_k=ck,
                **c)


def from_flash(args, kwargs):
    return _fa_call(_FA_ARGS, _fa_common, "flash_attn_func", False, args, kwargs)


def from_flash_varlen(args, kwargs):
    return _fa_call(_FA_VARLEN_ARGS, _fa_common, "flash_attn_varlen_func", True, args, kwargs)


# ---- torch.nn.attention.varlen.varlen_attn (PyTorch 2.10 and later) ----------------------------
# Packed sequences, query [T_q, H_q, D] and key [T_k, H_kv, D] with cumulative offsets, FlashAttention
# conventions (causal bottom-right). 2.10 takes is_causal; later releases take keyword-only scale,
# window_size ((-1, 0): causal; (W, 0): a causal window of W keys back), enable_gqa, seqused_k and
# a KV cache (block_table, or k_cache / v_cache / cache_seqlens / page_table in newer ones: the
# keys attended to are then not key's alone, so such calls are skipped). The names come from the
# installed function's signature (set_varlen_names, at install); these are 2.10's.
_VARLEN = "varlen_attn"
_VARLEN_NAMES = ["query", "key", "value", "cu_seq_q", "cu_seq_k", "max_q", "max_k", "is_causal",
                 "return_aux"]


def set_varlen_names(fn):
    """The positional parameter names of the installed varlen_attn, when its signature can be
    read and starts query, key, value; else the defaults stay."""
    try:
        import inspect
        names = [n for n, p in inspect.signature(fn).parameters.items()
                 if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    except (TypeError, ValueError):
        return
    if names[:3] == ["query", "key", "value"]:
        _VARLEN_NAMES[:] = names


def from_varlen(args, kwargs):
    a = dict(zip(_VARLEN_NAMES, args))
    a.update(kwargs)
    for name in ("block_table", "page_table", "k_cache", "v_cache", "cache_seqlens",
                 "cache_batch_idx"):
        if a.get(name) is not None:  # the keys attended to are not (all) in key
            return Skip("paged", "%s calls with a KV cache (%s) are not monitored" % (_VARLEN,
                                                                                    name))
    if a.get("seqused_k") is not None:
        return Skip("varlen-seqused", "%s calls with seqused_k are not monitored (only part of "
                    "each packed sequence's keys takes part)" % _VARLEN)
    q, k = local(a.get("query")), local(a.get("key"))
    bad = _check_qk(q, k, (3,), _VARLEN)
    if bad is not None:
        return bad
    cq, ck = a.get("cu_seq_q"), a.get("cu_seq_k")
    if cq is None or ck is None:
        return Skip("varlen", "%s calls without cu_seq_q and cu_seq_k are not monitored" % _VARLEN)
    w = a.get("window_size", (-1, -1))
    try:
        wl, wr = (int(w[0]), int(w[1])) if w is not None else (-1, -1)
    except (TypeError, ValueError, IndexError):
        return Skip("window", "%s calls with window_size %r are not monitored" % (_VARLEN, w))
    causal, window = bool(a.get("is_causal", False)), None
    if (wl, wr) == (-1, 0):
        causal = True
    elif wl >= 0 or wr >= 0:
        window = (wl, wr)
    # [total, H, D] -> [1, total, H, D]: one packed batch, sequences given by the offsets
    return Call(q.unsqueeze(0), k.unsqueeze(0), layout="bnhd", cu_seqlens_q=cq, cu_seqlens_k=ck,
                causal=causal, scale=a.get("scale"), window=window)


# ---- FlashAttention 3 (flash_attn_interface, its Hopper build) --------------------------------
# The same conventions as FlashAttention 2 ([B, N, H, D], causal bottom-right, window_size,
# softcap), other arguments: no dropout_p, and after causal qv, q/k/v_descale, window_size,
# attention_chunk, softcap, ... (varlen: seqused_q/k after max_seqlen_k). Releases differ in that
# tail (older ones have no qv or attention_chunk), so the names come from the installed function's
# own signature where it has one (set_fa3_names, at install); these are the current release's.
_FA3_TAIL = ("softmax_scale", "causal", "qv", "q_descale", "k_descale", "v_descale", "window_size",
             "attention_chunk", "softcap", "num_splits", "pack_gqa", "deterministic", "sm_margin",
             "return_attn_probs")
_FA3_NAMES = {"func": ("q", "k", "v") + _FA3_TAIL,
              "varlen": ("q", "k", "v", "cu_seqlens_q", "cu_seqlens_k", "max_seqlen_q",
                         "max_seqlen_k", "seqused_q", "seqused_k") + _FA3_TAIL}


def set_fa3_names(which, fn):
    """The parameter names of the installed flash_attn_interface function (which: 'func' or
    'varlen'), when its signature can be read and starts q, k, v; else the defaults stay."""
    try:
        import inspect
        names = tuple(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return
    if names[:3] == ("q", "k", "v") and "causal" in names:
        _FA3_NAMES[which] = names


def _fa3_common(a, what):
    if a.get("qv") is not None:
        return Skip("fa3-qv", "%s calls with qv are not monitored (its logits add q.k and qv.v, "
                    "which the daemon does not compute)" % what)
    try:
        chunk = int(a.get("attention_chunk") or 0)
    except (TypeError, ValueError):
        chunk = -1
    if chunk != 0:
        return Skip("fa3-chunk", "%s calls with attention_chunk are not monitored (chunked local "
                    "attention: a mask the daemon cannot describe)" % what)
    if a.get("seqused_q") is not None or a.get("seqused_k") is not None:
        return Skip("fa3-seqused", "%s calls with seqused_q / seqused_k are not monitored (only "
                    "part of each packed sequence takes part)" % what)
    return _fa_common(a, what)


def from_flash3(args, kwargs):
    return _fa_call(_FA3_NAMES["func"], _fa3_common, "flash_attn_interface.flash_attn_func",
                    False, args, kwargs)


def from_flash3_varlen(args, kwargs):
    return _fa_call(_FA3_NAMES["varlen"], _fa3_common,
                    "flash_attn_interface.flash_attn_varlen_func", True, args, kwargs)


# ---- torch.nn.attention.flex_attention -----------------------------------------------------------
_FLEX_ARGS = ("query", "key", "value", "score_mod", "block_mask", "scale", "enable_gqa",
              "return_lse", "kernel_options")


def block_mask_dense(bm, B, H, Nq, Nk, device, mask_bytes_max, what="flex_attention"):
    """A BlockMask's mask_mod evaluated into a boolean [B|1, H|1, Nq, Nk] tensor on the device
    (create_mask: no synchronisation), or a Skip when it would pass mask_bytes_max."""
    try:
        from torch.nn.attention.flex_attention import create_mask
    except Exception as e:  # pragma: no cover - torch without flex_attention
        return Skip("flex", "%s: torch.nn.attention.flex_attention.create_mask is missing (%s)"
                    % (what, e))
    shape = getattr(bm, "shape", None) or (B, H, Nq, Nk)
    mb = 1 if int(shape[0]) == 1 else B
    mh = 1 if int(shape[1]) == 1 else H
    if mb * mh * Nq * Nk > mask_bytes_max:
        return Skip("flex-mask-size", "%s calls whose BlockMask would take more than %d bytes as "
                    "a dense mask are not monitored (mask_bytes_max)" % (what, mask_bytes_max))
    mod = getattr(bm, "mask_mod", None)
    if mod is None:
        return Skip("flex-mask", "%s calls whose BlockMask has no mask_mod are not monitored"
                    % what)
    try:
        return create_mask(mod, mb, mh, Nq, Nk, device=device)
    except Exception as e:
        return Skip("flex-mask", "%s: the BlockMask's mask_mod could not be evaluated (%s): "
                    "not monitored" % (what, e))


def from_flex(args, kwargs, mask_bytes_max):
    a = dict(zip(_FLEX_ARGS, args))
    a.update(kwargs)
    q, k = local(a.get("query")), local(a.get("key"))
    bad = _check_qk(q, k, (4,), "flex_attention")
    if bad is not None:
        return bad
    if a.get("score_mod") is not None:
        return Skip("flex-score_mod", "flex_attention calls with a score_mod are not monitored "
                    "(an arbitrary function of the logits cannot be described)")
    mask = None
    bm = a.get("block_mask")
    if bm is not None:
        mask = block_mask_dense(bm, int(q.shape[0]), int(q.shape[1]), int(q.shape[2]),
                                int(k.shape[2]), q.device, mask_bytes_max)
        if isinstance(mask, Skip):
            return mask
    return Call(q, k, scale=a.get("scale"), attn_mask=mask)


# ---- torch.nn.functional.multi_head_attention_forward (nn.MultiheadAttention) -------------------
_MHA_ARGS = ("query", "key", "value", "embed_dim_to_check", "num_heads", "in_proj_weight",
             "in_proj_bias", "bias_k", "bias_v", "add_zero_attn", "dropout_p", "out_proj_weight",
             "out_proj_bias", "training", "key_padding_mask", "need_weights", "attn_mask",
             "use_separate_proj_weight", "q_proj_weight", "k_proj_weight", "v_proj_weight",
             "static_k", "static_v", "average_attn_weights", "is_causal")
_MHA = "nn.MultiheadAttention"


def mha_claims(args, kwargs, public_sdpa):
    """Whether the 'mha' door describes this call: where its attention weights are asked for
    (need_weights, the default), which torch computes with bmm and softmax and no door sees;
    without them torch 2 calls scaled_dot_product_attention, whose door describes the call at no
    cost (public_sdpa: this torch has it)."""
    if len(args) > 15:
        need = args[15]
    else:
        need = kwargs.get("need_weights", True)
    return bool(need) or not public_sdpa


def _mha_mask(m, what, allowed_is_false):
    """An MHA mask (bool True = excluded, or float added) as SDPA's convention, 4-D or 2-D."""
    dt = str(getattr(m, "dtype", ""))
    if dt == "torch.bool":
        return ~m if allowed_is_false else m
    if dt in _FLOATS:
        return m
    return Skip("mask-dtype", "%s calls with a %s of dtype %s are not monitored (bool and float "
                "masks are)" % (_MHA, what, dt or type(m).__name__))


def from_mha(args, kwargs, mask_bytes_max, compiling=False):
    """nn.MultiheadAttention's call (torch.nn.functional.multi_head_attention_forward: query
    [L, N, E] or [L, E], key [S, N, E] or [S, E], sequence first as the module hands them over):
    q and k are not arguments, so they are computed here from the call's own projection weights,
    by the same linear calls torch makes (one packed projection for self-attention, so the values
    are the ones the model multiplies), on monitored steps only. Masks in MHA's convention (bool
    True = excluded; key_padding_mask [N, S]; attn_mask [L, S] or [N * H, L, S]) become SDPA's."""
    if compiling:
        return Skip("mha-compiled", "%s calls with need_weights=True inside torch.compile'd code "
                    "are not monitored (their query and key exist only inside the call): pass "
                    "need_weights=False where the weights are not used (that path is monitored, "
                    "compiled too), or run the module eagerly" % _MHA)
    a = dict(zip(_MHA_ARGS, args))
    a.update(kwargs)
    for name, kind in (("bias_k", "mha-bias-kv"), ("static_k", "mha-static-kv")):
        if a.get(name) is not None:
            return Skip(kind, "%s calls with %s are not monitored (keys the projection does not "
                        "make)" % (_MHA, name))
    if a.get("add_zero_attn"):
        return Skip("mha-zero-attn", "%s calls with add_zero_attn are not monitored" % _MHA)
    query, key, value = local(a.get("query")), local(a.get("key")), local(a.get("value"))
    bad = _check_qk(query, key, (2, 3), _MHA)
    if bad is not None:
        return bad
    if _dims(query) == 2:  # unbatched: [L, E]
        query, key = query.unsqueeze(1), key.unsqueeze(1)
        value = value.unsqueeze(1) if _is_tensor(value) else value
    L, N, E = (int(x) for x in query.shape)
    S = int(key.shape[0])
    H = int(a.get("num_heads") or 0)
    if H <= 0 or E % H:
        return Skip("shape", "%s calls with embed_dim %d and %d heads are not monitored"
                    % (_MHA, E, H))
    D = E // H
    T = sys.modules.get("torch")
    no_grad = getattr(T, "no_grad", None)
    if no_grad is None:  # a stand-in torch
        return _mha_qk(a, query, key, value, L, N, E, S, H, D, mask_bytes_max)
    with no_grad():  # the copies of the model's q and k need no autograd graph
        return _mha_qk(a, query, key, value, L, N, E, S, H, D, mask_bytes_max)


def _mha_qk(a, query, key, value, L, N, E, S, H, D, mask_bytes_max):
    F = sys.modules.get("torch.nn.functional")
    b = a.get("in_proj_bias")
    bq, bk = (None, None) if b is None else (b[:E], b[E:2 * E])
    if a.get("use_separate_proj_weight"):
        q = F.linear(query, a.get("q_proj_weight"), bq)
        k = F.linear(key, a.get("k_proj_weight"), bk)
    else:
        w = a.get("in_proj_weight")
        if query is key and key is value:  # self-attention: torch's one packed projection
            qkv = F.linear(query, w, b)
            q, k = qkv[..., :E], qkv[..., E:2 * E]
        elif key is value:  # torch: q, then k and v in one projection
            q = F.linear(query, w[:E], bq)
            k = F.linear(key, w[E:], None if b is None else b[E:])[..., :E]
        else:
            q, k = F.linear(query, w[:E], bq), F.linear(key, w[E:2 * E], bk)
    # [L, N, E] -> [N, L, H, D] (a view: D stays contiguous)
    q, k = q.view(L, N, H, D).transpose(0, 1), k.view(S, N, H, D).transpose(0, 1)
    mask = None
    am, kpm = a.get("attn_mask"), a.get("key_padding_mask")
    if am is not None:
        am = _mha_mask(am, "attn_mask", True)
        if isinstance(am, Skip):
            return am
        if _dims(am) == 2:
            am = am.view(1, 1, L, S)
        elif _dims(am) == 3 and int(am.shape[0]) == N * H:  # PyTorch takes no other 3-D one
            am = am.view(N, H, L, S)
        else:
            return Skip("mask-shape", "%s calls with an attn_mask of shape %s are not monitored"
                        % (_MHA, tuple(am.shape)))
        mask = am
    if kpm is not None:
        kpm = _mha_mask(kpm, "key_padding_mask", True)
        if isinstance(kpm, Skip):
            return kpm
        if _dims(kpm) == 1:
            kpm = kpm.view(1, S)
        kpm = kpm.view(int(kpm.shape[0]), 1, 1, S)
        if mask is None:
            mask = kpm
        else:  # both: one mask, as torch merges them
            h = int(mask.shape[1])
            if N * h * L * S * 4 > mask_bytes_max:
                return Skip("mask-size", "%s calls with both an attn_mask and a key_padding_mask "
                            "of [%d, %d, %d, %d] are not monitored (the merged mask would pass "
                            "mask_bytes_max=%d)" % (_MHA, N, h, L, S, mask_bytes_max))
            fl = [m for m in (mask, kpm) if str(m.dtype) != "torch.bool"]
            if not fl:
                mask = mask & kpm
            else:  # float: -inf where a bool one excludes, then added
                dt = fl[0].dtype
                T = sys.modules.get("torch")
                mask, kpm = [m if str(m.dtype) != "torch.bool" else
                             T.zeros_like(m, dtype=dt).masked_fill(~m, float("-inf"))
                             for m in (mask, kpm)]
                mask = mask + kpm
    return Call(q, k, layout="bnhd", attn_mask=mask, heads=H)


# ---- transformers' attention interface ----------------------------------------------------------
def from_transformers(impl, module, query, key, attention_mask, scaling, kwargs, mask_bytes_max):
    """A call of transformers' attention function `impl` ('sdpa', 'eager', 'flash_attention_2',
    'flex_attention', ...): query [B, Hq, N, D], key [B, Hkv, N, D] before any repeat_kv."""
    what = "transformers attention (%s)" % impl
    query, key = local(query), local(key)
    bad = _check_qk(query, key, (4,), what)
    if bad is not None:
        return bad
    sinks = kwargs.get("s_aux")
    if sinks is None:
        sinks = kwargs.get("sinks")
    if sinks is not None:
        sinks = local(sinks)
        if _dims(sinks) != 1 or int(sinks.shape[0]) != int(query.shape[1]):
            return Skip("sinks-shape", "%s calls whose attention sinks are not one logit per "
                        "query head ([%d]) are not monitored" % (what, int(query.shape[1])))
        sinks = sinks.detach()
    layer = getattr(module, "layer_idx", None)
    cfg = getattr(module, "config", None)
    heads = getattr(cfg, "num_attention_heads", 0)
    heads = heads if isinstance(heads, int) else 0
    softcap = float(kwargs.get("softcap") or 0.0)
    nq, nk = int(query.shape[2]), int(key.shape[2])
    sw = kwargs.get("sliding_window")
    base = impl.split("|")[-1]
    if base.startswith("flash_attention"):
        # transformers' flash path: window_size = (sliding_window - 1,) * 2 when the keys exceed it
        window = (sw - 1, sw - 1) if sw and nk > sw else None
        if kwargs.get("cu_seq_lens_q") is not None:  # packed batches (position_ids)
            cq, ck = kwargs.get("cu_seq_lens_q"), kwargs.get("cu_seq_lens_k")
            if ck is None:
                ck = cq
            if int(query.shape[0]) != 1:
                return Skip("varlen", "%s: packed sequences with batch %d are not monitored"
                            % (what, int(query.shape[0])))
            # [1, H, total, D] in transformers' layout: the daemon takes 'bhnd' as it is
            return Call(query, key, causal=bool(getattr(module, "is_causal", True)), scale=scaling,
                        window=window, softcap=softcap, cu_seqlens_q=cq, cu_seqlens_k=ck,
                        layer=layer, sinks=sinks, heads=heads)
        mask = None
        if attention_mask is not None:
            if _dims(attention_mask) != 2:
                return Skip("mask-shape", "%s: a %s-D attention_mask is not monitored"
                            % (what, _dims(attention_mask)))
            # [B, Nk] padding (1 = token) -> [B, 1, 1, Nk] key padding
            mask = attention_mask[:, None, None, :].bool()
        causal = bool(getattr(module, "is_causal", True)) and nq > 1
        return Call(query, key, causal=causal, scale=scaling, window=window, softcap=softcap,
                    attn_mask=mask, layer=layer, sinks=sinks, heads=heads)
    if base == "flex_attention":
        if kwargs.get("score_mod") is not None:
            return Skip("flex-score_mod", "%s calls with a score_mod are not monitored" % what)
        mask = None
        if attention_mask is not None:
            if hasattr(attention_mask, "mask_mod"):
                mask = block_mask_dense(attention_mask, int(query.shape[0]), int(query.shape[1]),
                                        nq, nk, query.device, mask_bytes_max, what)
            else:
                mask = _mask_4d(attention_mask, what)
            if isinstance(mask, Skip):
                return mask
        return Call(query, key, scale=scaling, softcap=softcap, attn_mask=mask, layer=layer,
                    sinks=sinks, heads=heads)
    if base in ("sdpa", "eager"):
        mask = None
        if attention_mask is not None:
            mask = _mask_4d(attention_mask, what)
            if isinstance(mask, Skip):
                return mask
            if int(mask.shape[-1]) != nk:
                mask = mask[:, :, :, :nk]  # as eager does: the mask cut to the keys
        is_causal = kwargs.get("is_causal")
        if is_causal is None:
            is_causal = getattr(module, "is_causal", True)
        # as transformers' sdpa: causal only without a mask and with more than one query row
        causal = base == "sdpa" and bool(is_causal) and mask is None and nq > 1
        if causal and nq != nk:
            return Skip("causal-align", "%s: is_causal with Nq != Nk is not monitored" % what)
        return Call(query, key, causal=causal, scale=scaling, softcap=softcap, attn_mask=mask,
                    layer=layer, sinks=sinks, heads=heads)
    return Skip("impl", "transformers attention implementation %r is not monitored" % impl)
