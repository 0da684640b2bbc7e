"""probe_attention_calls.py — what real models hand to their attention function.

    python3 bench/probe_attention_calls.py [--layers 2] [--batch 4] [--seq 2048] [--impl sdpa,flex_attention,eager]

Builds a Llama-architecture model from a config (transformers; no weights are downloaded) and runs
one forward + backward under bf16 autocast with a padded batch (attention_mask with zeros at the
end of every sequence but the first), once per attention implementation. For every call of
scaled_dot_product_attention / flex_attention it prints the query/key dtypes and shapes, the mask
(None, its dtype and shape, or a BlockMask), is_causal, scale and the autocast state: the facts the
monitor has to honour. Needs a CUDA GPU, PyTorch and transformers.
"""
import argparse
import functools
import sys


def describe(t):
    if t is None:
        return "None"
    if hasattr(t, "shape") and hasattr(t, "dtype"):
        return "%s%s stride%s" % (str(t.dtype).replace("torch.", ""), tuple(t.shape), tuple(t.stride()))
    return type(t).__name__


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--impl", default="sdpa,flex_attention,eager")
    a = ap.parse_args()
    import torch
    import torch.nn.functional as F
    import transformers
    from transformers import LlamaConfig, LlamaForCausalLM
    print("torch", torch.__version__, "transformers", transformers.__version__)
    seen = []

    def wrap(mod, name):
        orig = getattr(mod, name)

        @functools.wraps(orig)
        def w(*args, **kw):
            rec = {"fn": name, "args": [describe(x) for x in args[:4]],
                   "kw": {k: (describe(v) if hasattr(v, "shape") else repr(v)[:80])
                          for k, v in kw.items()},
                   "autocast": torch.is_autocast_enabled("cuda"),
                   "autocast_dtype": str(torch.get_autocast_dtype("cuda"))}
            bm = kw.get("block_mask")
            if bm is not None:
                rec["block_mask"] = {"shape": getattr(bm, "shape", None),
                                     "seq_lengths": getattr(bm, "seq_lengths", None),
                                     "BLOCK_SIZE": getattr(bm, "BLOCK_SIZE", None),
                                     "mask_mod": getattr(getattr(bm, "mask_mod", None), "__name__", None),
                                     "mask_mod_repr": repr(getattr(bm, "mask_mod", None))[:200]}
            if name == "scaled_dot_product_attention":
                m = kw.get("attn_mask", args[3] if len(args) > 3 else None)
                if m is not None and hasattr(m, "dtype"):
                    rec["mask_true_frac"] = float((m if m.dtype == torch.bool else m > -1e30).float().mean())
            seen.append(rec)
            return orig(*args, **kw)
        setattr(mod, name, w)
        return orig

    wrap(F, "scaled_dot_product_attention")
    try:
        import torch.nn.attention.flex_attention as fa
        wrap(fa, "flex_attention")
    except Exception as e:
        print("no flex_attention:", e)

    cfg = dict(vocab_size=32000, hidden_size=2048, intermediate_size=5632, num_hidden_layers=a.layers,
               num_attention_heads=16, num_key_value_heads=4, max_position_embeddings=4096,
               rms_norm_eps=1e-5, tie_word_embeddings=False)
    for impl in a.impl.split(","):
        seen.clear()
        try:
            model = LlamaForCausalLM(LlamaConfig(attn_implementation=impl, **cfg)).cuda()
        except Exception as e:
            print("impl %s: cannot build: %s" % (impl, e))
            continue
        ids = torch.randint(0, 32000, (a.batch, a.seq), device="cuda")
        mask = torch.ones_like(ids)
        for b in range(1, a.batch):
            mask[b, a.seq - 100 * b:] = 0
        try:
            with torch.autocast("cuda", dtype=torch.bfloat16):
                out = model(input_ids=ids, attention_mask=mask, labels=ids)
            out.loss.backward()
            torch.cuda.synchronize()
        except Exception as e:
            print("impl %s: forward/backward failed: %s" % (impl, e))
        print("== impl %s: %d attention calls; the first:" % (impl, len(seen)))
        for r in seen[:2]:
            print("  ", r)
        del model
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
