"""KV-cache size per token of a stack of attention layers at a long context: the cost that windows cut.

At context L a full-attention layer caches L positions and a layer with window W caches min(W, L),
each position holding one key and one value of ``kv_heads * head_dim`` elements; ``kv_heads`` may differ by
layer (the ``kv_heads`` conversion). Bytes per token is the whole cache at L divided by L: constant for full
attention, falling with L for windows.
A ``linear_attention`` layer (zgtrain/block/attention.py) caches the positions of its exact-softmax window W as
a window does (none for W = 0) plus a state of constant size per sequence: S (F x D) and z (F) per KV head, F = 2 D
features, ``kv_heads * (2 D * D + 2 D)`` elements; amortized over the context that is ``state / L`` bytes per token
(~0 at the teacher's longest context), added to the figure, and the state's own bytes are recorded apart
(``linear_state_bytes``: all such layers together, per sequence, in the teacher's dtype).
zg reports it at the teacher's longest context (``max_position_embeddings``), in the teacher's
dtype, next to parameter counts (block metrics, zerograph.json, metrics/eval.json), so a budget
can be stated in either.
"""

from __future__ import annotations

import torch

__all__ = ["kv_bytes_per_token", "kv_geometry", "kv_summary", "linear_state_elements"]


def kv_bytes_per_token(
    windows: list[int | None],
    *,
    context: int,
    kv_heads: int | list[int],
    head_dim: int,
    dtype_bytes: int,
    state_elements: int = 0,
) -> float:
    """KV-cache bytes per token at ``context`` for layers with these windows (None: full attention) and KV heads
    (one count for every layer, or one per layer), plus ``state_elements`` of constant state (linear_attention
    layers) amortized over the context."""
    if context < 1:
        raise ValueError(f"context must be >= 1, got {context}")
    heads = [kv_heads] * len(windows) if isinstance(kv_heads, int) else list(kv_heads)
    if len(heads) != len(windows):
        raise ValueError(f"{len(heads)} KV head counts for {len(windows)} layers")
    # per layer: cached positions x heads (an integer, so the sum is exact in any order)
    cached = sum((context if w is None else min(w, context)) * h for w, h in zip(windows, heads))
    return (2 * head_dim * cached + state_elements) * dtype_bytes / context  # 2: a key and a value


def _config(config):
    if isinstance(config, dict):
        from zgdata.families.registry import config_from_dict

        return config_from_dict(config)
    return config


def kv_geometry(config) -> dict:
    """{context, kv_heads, head_dim, dtype_bytes} of a teacher config (object or dict, any zg family)."""
    config = _config(config)
    heads = config.num_attention_heads  # GPT-2's n_head, through its config's attribute map
    dtype = getattr(config, "dtype", None) or "float32"
    dtype = getattr(torch, dtype) if isinstance(dtype, str) else dtype
    return {
        "context": int(config.max_position_embeddings),
        "kv_heads": int(getattr(config, "num_key_value_heads", None) or heads),
        "head_dim": int(getattr(config, "head_dim", None) or config.hidden_size // heads),
        "dtype_bytes": torch.empty((), dtype=dtype).element_size(),
    }


def linear_state_elements(attention: list[str | None] | None, kv_heads: list[int], head_dim: int) -> int:
    """Elements of the constant generation state of the linear_attention layers among ``attention`` (one kind per
    layer; ``kv_heads``: each layer's KV heads): S and z, F = 2 D features per KV head."""
    f = 2 * head_dim
    return sum(h * (f * head_dim + f) for a, h in zip(attention or [], kv_heads) if (a or "").startswith("linear_"))


def kv_summary(
    config,
    windows: list[int | None],
    teacher_layers: int | None = None,
    kv_heads: list[int | None] | None = None,
    attention: list[str | None] | None = None,
) -> dict:
    """KV-cache figures of a student stack against ``teacher_layers`` full-attention teacher layers
    (default: all of the teacher's); ``kv_heads``: each student layer's KV heads (None: the teacher's);
    ``attention``: each layer's kind, where linear_attention layers add their constant state (``windows`` then
    holds their exact-softmax windows)."""
    config = _config(config)
    if teacher_layers is None:
        teacher_layers = config.num_hidden_layers
    g = kv_geometry(config)
    heads = [g["kv_heads"] if h is None else int(h) for h in (kv_heads or [None] * len(windows))]
    state = linear_state_elements(attention, heads, g["head_dim"])
    student = kv_bytes_per_token(windows, **{**g, "kv_heads": heads}, state_elements=state)
    teacher = kv_bytes_per_token([None] * teacher_layers, **g)
    return {
        "kv_context": g["context"],
        "kv_bytes_per_token": student,
        "teacher_kv_bytes_per_token": teacher,
        "kv_ratio": student / teacher if teacher else None,
        **({"linear_state_bytes": state * g["dtype_bytes"]} if state else {}),
    }
