"""attnstat.torch: monitoring a PyTorch model's attention with no change to the model.

    import attnstat, attnstat.torch
    client = attnstat.Client(run="llama-1b", rank=rank)
    with attnstat.torch.monitor(client, every=10, model=model):
        train()

monitor (see its documentation in _monitor.py) watches the doors real models reach attention
through: torch's scaled_dot_product_attention (attn_mask included) and flex_attention (BlockMask),
FlashAttention's flash_attn_func / flash_attn_varlen_func (FlashAttention 2's flash_attn and 3's
flash_attn_interface), and transformers' attention interface. _calls.py turns each door's arguments
into the one description the daemon takes. qk_clip (_qkclip.py) scales the query and key projection
rows of the heads whose measured max logit passed tau, after each optimizer step (QK-Clip). Nothing
here is imported by `import attnstat`; PyTorch is imported when a monitor starts.
"""
from ._calls import Call, Skip
from ._monitor import Monitor, monitor, uninstall
from ._qkclip import qk_clip

__all__ = ["monitor", "Monitor", "Call", "Skip", "uninstall", "qk_clip"]
