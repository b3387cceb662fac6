"""Sliding-window attention for student layers: a forward pre-hook on a layer's attention module.

A windowed layer's query at position i sees keys i-W+1 .. i (W tokens, itself included), as
transformers' own sliding-window layers do. The hook only rewrites the ``attention_mask`` the
attention module receives, so the layer's weights, projections and sdpa call stay the teacher's.
While no query can see more than W keys (past + new tokens <= W) it changes nothing at all:
the layer then runs exactly the full-attention code path and a window >= the sequence length
reproduces the teacher's layer bit for bit.

The assembled student runs the same class: each shipped modeling template (zgtrain/student/templates/)
carries a copy of ``SlidingWindow`` generated from this file (a shipped model file can import only
transformers and torch; ``python -m zgtrain.student.template_source`` rewrites the copies, and
tests/zgtrain/student/test_template_source.py fails while one differs), so a student block and the
assembled model mask alike (their logits are compared bit for bit).
"""

from __future__ import annotations

import torch

__all__ = ["SlidingWindow", "attention_of", "add_windows"]


# fmt: off
# (copied into each shipped modeling template by `python -m zgtrain.student.template_source`)
class SlidingWindow:
    """Forward pre-hook (``with_kwargs=True``) of an attention module: attend to the last ``window`` positions only.

    Keys are indexed as the KV cache holds them (0 .. past + new - 1, past = tokens already cached
    for this layer). Supports sdpa (boolean masks) and eager (additive float masks) attention.
    """

    def __init__(self, window: int):
        self.window = int(window)

    def __call__(self, module, args, kwargs):
        hidden = kwargs["hidden_states"] if "hidden_states" in kwargs else args[0]
        q_len = hidden.shape[-2]
        cache = kwargs.get("cache", kwargs.get("past_key_values"))
        past = cache.get_seq_length(module.layer_idx) if cache is not None else 0
        if past + q_len <= self.window:  # nobody sees beyond the window: full attention, untouched
            return None
        impl = getattr(module.config, "_attn_implementation", None) or "eager"
        if impl not in ("sdpa", "eager"):
            raise ValueError(f"zg sliding-window layers need attn_implementation 'sdpa' or 'eager', not {impl!r}")
        mask = kwargs.get("attention_mask")
        kv_len = mask.shape[-1] if mask is not None else past + q_len
        q = torch.arange(past, past + q_len, device=hidden.device)[:, None]
        k = torch.arange(kv_len, device=hidden.device)[None, :]
        band = (k <= q) & (k > q - self.window)                            # (q_len, kv_len)
        if mask is None and impl == "sdpa":
            mask = band[None, None]
        elif mask is None:
            mask = torch.zeros(band.shape, dtype=hidden.dtype, device=hidden.device)[None, None]
            mask = mask.masked_fill(~band, torch.finfo(hidden.dtype).min)
        elif mask.dtype == torch.bool:
            mask = mask & band
        else:
            mask = mask.masked_fill(~band, torch.finfo(mask.dtype).min)
        return args, {**kwargs, "attention_mask": mask}
# fmt: on


def attention_of(layer: torch.nn.Module) -> torch.nn.Module:
    """A decoder layer's self-attention module (Llama/Qwen2: ``self_attn``, GPT-2: ``attn``)."""
    return layer.self_attn if hasattr(layer, "self_attn") else layer.attn


def add_windows(layers, windows) -> None:
    """Hook ``SlidingWindow(w)`` onto each layer whose window ``w`` is not None (None: full attention)."""
    for layer, w in zip(layers, windows):
        if w is not None:
            attention_of(layer).register_forward_pre_hook(SlidingWindow(w), with_kwargs=True)
