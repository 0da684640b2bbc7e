"""Which attention functions are doors, where they live, and how each call is described.

  - 'sdpa': torch.nn.functional.scaled_dot_product_attention;
  - 'flex': torch.nn.attention.flex_attention.flex_attention;
  - 'flash_attn': flash_attn_func / flash_attn_varlen_func of flash_attn (and its
    flash_attn_interface) and of FlashAttention 3's flash_attn_interface module;
  - 'transformers': the attention function a transformers model's config names, in transformers'
    attention mapping, and the modeling modules' eager_attention_forward;
  - 'mha': torch.nn.functional.multi_head_attention_forward (nn.MultiheadAttention), for the
    calls that ask for the attention weights (the others reach the 'sdpa' door inside it);
  - 'varlen': torch.nn.attention.varlen.varlen_attn (packed sequences, PyTorch 2.10 and later).
Each is installed in its home and, through _install.scan(), wherever a loaded module holds the
original by name. One Door object per door and process: a later monitor reuses the wrappers (a
compiled graph that traced them stays valid), with its own mask_bytes_max.
"""
import sys

from . import _calls, _install

_DOORS = {}


def _door(key, name, describe, autocast=False):
    d = _DOORS.get(key)
    if d is None:
        d = _DOORS[key] = _install.Door(name, describe, autocast)
    return d


def _at(door, home, attr, modules):
    """door installed at home.attr (now, or when home is loaded) and at the modules' attr."""
    _install.add_home(home, lambda m: _install.patch(m, attr, door))
    for m in modules:
        if hasattr(m, attr):
            _install.patch(m, attr, door)


def open_sdpa(modules):
    _at(_door("sdpa", "sdpa", _calls.from_sdpa, autocast=True), "torch.nn.functional",
        "scaled_dot_product_attention", modules)
    return True


def open_mha(modules, mask_bytes_max):
    """nn.MultiheadAttention (torch.nn.functional.multi_head_attention_forward), for its calls
    with need_weights (the module's default): torch computes those without
    scaled_dot_product_attention, so no other door sees them. Its other calls are left to the
    sdpa door inside it (torch 2), at no cost."""
    F = sys.modules.get("torch.nn.functional")
    if F is None or not hasattr(F, "multi_head_attention_forward"):
        return False
    public_sdpa = hasattr(F, "scaled_dot_product_attention")
    d = _door("mha", "mha", None, autocast=True)
    d.mask_bytes_max = mask_bytes_max
    d.describe = lambda a, k: _calls.from_mha(a, k, d.mask_bytes_max, _install.compiling())
    d.claims = lambda a, k: _calls.mha_claims(a, k, public_sdpa)
    d.dynamo_only = True
    _at(d, "torch.nn.functional", "multi_head_attention_forward", modules)
    return True


def open_varlen(modules, required):
    """torch.nn.attention.varlen.varlen_attn (PyTorch 2.10 and later). Its arguments are read by
    the installed release's own signature. Quiet below Dynamo, as the 'mha' door: where Dynamo
    puts the function into its graph whole, the graph's code calls the wrapper again by its
    qualified name while AOTAutograd traces it, after Dynamo observed the call."""
    if sys.modules.get("torch.nn.attention.varlen") is None:
        try:
            import torch.nn.attention.varlen  # noqa: F401
        except Exception:
            pass
    vm = sys.modules.get("torch.nn.attention.varlen")
    if vm is None or not hasattr(vm, "varlen_attn"):
        if required:
            raise ValueError("doors names 'varlen' but this torch has no "
                             "torch.nn.attention.varlen.varlen_attn (PyTorch 2.10 and later)")
        return False
    orig = vm.varlen_attn
    if not _install.is_wrapper(orig):
        _calls.set_varlen_names(orig)
    d = _door("varlen", "varlen", _calls.from_varlen)
    d.dynamo_only = True
    _at(d, "torch.nn.attention.varlen", "varlen_attn", modules)
    return True


def open_flex(modules, mask_bytes_max, required):
    d = _door("flex", "flex", None)
    d.mask_bytes_max = mask_bytes_max
    d.describe = lambda a, k: _calls.from_flex(a, k, d.mask_bytes_max)
    if sys.modules.get("torch.nn.attention.flex_attention") is None:
        try:
            import torch.nn.attention.flex_attention  # noqa: F401
        except Exception:
            if required:
                raise ValueError("doors names 'flex' but this torch has no flex_attention")
    fa = sys.modules.get("torch.nn.attention.flex_attention")
    if fa is None or not hasattr(fa, "flex_attention"):
        if required:
            raise ValueError("doors names 'flex' but this torch has no flex_attention")
        return False
    _at(d, "torch.nn.attention.flex_attention", "flex_attention", modules)
    return True


def _fa3_importable():
    """Whether flash_attn_interface (FlashAttention 3) is loaded or could be, not importing it."""
    if sys.modules.get("flash_attn_interface") is not None:
        return True
    try:
        import importlib.util
        return importlib.util.find_spec("flash_attn_interface") is not None
    except Exception:
        return False


def open_flash(modules, required):
    """FlashAttention 2 (flash_attn) and 3 (flash_attn_interface, a module of its own whose
    functions take other arguments): one door, 'flash_attn', a describer for each. A function is
    FlashAttention 3's where it lives in (or comes from) flash_attn_interface."""
    doors = {False: (_door("flash_attn_func", "flash_attn", _calls.from_flash),
                     _door("flash_attn_varlen_func", "flash_attn", _calls.from_flash_varlen)),
             True: (_door("fa3_func", "flash_attn", _calls.from_flash3),
                    _door("fa3_varlen_func", "flash_attn", _calls.from_flash3_varlen))}

    def install(m, fa3_home=False):
        ok = False
        for n, (attr, which) in enumerate((("flash_attn_func", "func"),
                                           ("flash_attn_varlen_func", "varlen"))):
            orig = getattr(m, attr, None)
            if orig is None:
                continue
            fa3 = fa3_home or str(getattr(orig, "__module__", "")).startswith(
                "flash_attn_interface")
            if fa3 and not _install.is_wrapper(orig):
                _calls.set_fa3_names(which, orig)
            ok = _install.patch(m, attr, doors[fa3][n]) or ok
        return ok
    try:
        import flash_attn  # noqa: F401
    except Exception:
        if required and not _fa3_importable():  # FlashAttention 3 alone will do
            raise
    opened = False
    for home, fa3 in (("flash_attn", False), ("flash_attn.flash_attn_interface", False),
                      ("flash_attn_interface", True)):
        _install.add_home(home, lambda m, fa3=fa3: install(m, fa3))
        opened = opened or sys.modules.get(home) is not None
    for m in modules:
        opened = install(m) or opened
    return opened


def open_transformers(model, mask_bytes_max):
    """Wraps the model's attention function in transformers' mapping (and the modeling modules'
    eager_attention_forward). False when model is not a transformers model."""
    cfg = getattr(model, "config", None)
    impl = getattr(cfg, "_attn_implementation", None)
    if not isinstance(impl, str):
        return False
    try:
        from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
    except Exception:
        return False
    autocast = impl.split("|")[-1] in ("sdpa", "eager")

    def describe(impl_name, door):
        def from_args(args, kwargs):
            a = list(args) + [None] * max(0, 5 - len(args))
            module, query, key = a[0], a[1], a[2]
            mask = kwargs.get("attention_mask", a[4])
            kw = dict(kwargs)
            scaling = kw.pop("scaling", None)
            return _calls.from_transformers(impl_name, module, query, key, mask, scaling, kw,
                                            door.mask_bytes_max)
        return from_args

    if impl != "eager":
        try:
            orig = ALL_ATTENTION_FUNCTIONS[impl]
        except Exception:
            orig = None
        if orig is not None:
            d = _door("transformers:" + impl, "transformers", None, autocast)
            d.mask_bytes_max = mask_bytes_max
            d.describe = describe(impl, d)
            _install.patch(ALL_ATTENTION_FUNCTIONS, impl, d, item=True)
    if impl == "eager" or "eager" in impl:
        d = _door("transformers:eager", "transformers", None, True)
        d.mask_bytes_max = mask_bytes_max
        d.describe = describe("eager", d)
        seen = set()
        for sub in model.modules():
            mod = sys.modules.get(type(sub).__module__)
            if mod is None or id(mod) in seen or not hasattr(mod, "eager_attention_forward"):
                continue
            seen.add(id(mod))
            _install.patch(mod, "eager_attention_forward", d)
    return True
