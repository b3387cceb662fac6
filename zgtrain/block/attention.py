"""Student attention layers with fewer key/value heads (the ``kv_heads`` conversion).

A layer with ``n`` KV heads is the family's own decoder layer built from a copy of the layer config with
``num_key_value_heads = n``: transformers' attention then repeats each KV head for ``heads / n`` query heads,
so query head ``i`` reads KV head ``i // (heads / n)``. The teacher's query head ``i`` read its KV head
``i // (heads / kv)``; grouping the teacher's KV heads into ``n`` contiguous groups of ``kv / n`` keeps every
query head attending to the group its old KV head belonged to, and each new head starts as the mean of its
group (weights, biases, and per-channel key norms such as OLMo 2's ``k_norm``: all exactly ``mean(dim=group)``).
With ``n`` equal to the teacher's count every group holds one head and the layer is the teacher's, bit for bit.

Phi-3's fused ``qkv_proj`` (rows: queries, keys, values) is split, its key and value rows grouped, and joined
again. GPT-2 has no grouped-query attention in transformers: refused.

``attn_linear`` replaces a layer's attention by ``AttentionLinear``: one linear map (with bias) of the layer's
normed input, so no token mixing and no KV cache. It is fitted by least squares on the block's input sample
(``fit_linear``), layer after layer on the student's own running input, to the teacher attention's output there.
Why: some layers' attention output is mostly a function of the current token (attending to itself, or to a
near-constant average of the context); the best linear map of the token's own state keeps that part exactly in
the least-squares sense, where dropping the attention (zero) or a random map starts from far worse, and training
then recovers what it can. The assembled student runs the same class: each pinned modeling template carries a
verbatim copy (tests/zgtrain/block/test_attn_linear.py compares the source).
"""

from __future__ import annotations

import copy

import torch

from zgdata.errors import ZgError

__all__ = [
    "teacher_kv_heads",
    "resolve_kv_heads",
    "kv_layer_config",
    "group_kv_heads",
    "AttentionLinear",
    "check_attn_linear",
    "fit_linear",
    "attention_io",
]

_KEY = "train.kv_heads"


def _heads(config) -> tuple[int, int, int]:
    """(query heads, KV heads, head dim) of a teacher config."""
    heads = int(config.num_attention_heads)
    kv = int(getattr(config, "num_key_value_heads", None) or heads)
    hd = int(getattr(config, "head_dim", None) or config.hidden_size // heads)
    return heads, kv, hd


def teacher_kv_heads(config) -> int:
    return _heads(config)[1]


def resolve_kv_heads(config, requested: int) -> int:
    """The KV heads of a ``kv_heads`` student layer: ``requested``, or (0) half the teacher's rounded down to a
    divisor of it (1 at least). One-line ZgError naming ``train.kv_heads`` for a family or count zg cannot build."""
    if config.model_type == "gpt2":
        raise ZgError(
            "the kv_heads conversion needs grouped-query attention, which transformers' GPT-2 does not have",
            key="train.conversion",
            fix="use another conversion for GPT-2 teachers (prune_mlp, drop_layers, window_attention)",
        )
    heads, kv, _ = _heads(config)
    if requested == 0:
        return max(d for d in range(1, max(1, kv // 2) + 1) if kv % d == 0)
    if requested < 1 or kv % requested or heads % requested:
        divisors = [d for d in range(1, kv + 1) if kv % d == 0]
        raise ZgError(
            f"{_KEY} is {requested}, which does not divide the teacher's {kv} KV heads and {heads} query heads",
            key=_KEY,
            fix=f"use one of {', '.join(map(str, divisors))} (0: half the teacher's, {resolve_kv_heads(config, 0)})",
        )
    return requested


def kv_layer_config(config, kv_heads: int | None):
    """A copy of a layer config with ``kv_heads`` KV heads (None: the config itself)."""
    if kv_heads is None or kv_heads == teacher_kv_heads(config):
        return config
    cfg = copy.copy(config)
    cfg.num_key_value_heads = int(kv_heads)
    return cfg


def _group(x: torch.Tensor, n: int, hd: int) -> torch.Tensor:
    """Rows (dim 0) of ``kv * hd`` channels, head-major, as ``n`` heads: each the mean of ``kv / n`` contiguous."""
    rows = x.shape[0]
    return x.reshape(n, rows // (n * hd), hd, *x.shape[1:]).mean(dim=1).reshape(n * hd, *x.shape[1:])


def group_kv_heads(layer: dict[str, torch.Tensor], config, n: int) -> dict[str, torch.Tensor]:
    """A teacher layer's tensors (names within the layer) with its KV heads grouped to ``n``."""
    heads, kv, hd = _heads(config)
    out = dict(layer)
    for name, x in layer.items():
        if not name.startswith("self_attn."):
            continue
        part = name.split(".")[1]
        if part in ("k_proj", "v_proj") or (part == "k_norm" and x.shape[0] == kv * hd):
            out[name] = _group(x, n, hd)
        elif part == "qkv_proj":  # Phi-3: [queries; keys; values] rows
            q, k, v = x.split([heads * hd, kv * hd, kv * hd])
            out[name] = torch.cat([q, _group(k, n, hd), _group(v, n, hd)])
    return out


# fmt: off
# (verbatim in each pinned modeling template: tests/zgtrain/block/test_attn_linear.py compares the source)
class AttentionLinear(torch.nn.Module):
    """A decoder layer's attention replaced by one linear map of its normed input: no token mixing.

    Called as the attention module it replaces (hidden_states, mask, rotary and cache keywords; only the cache is
    read), it returns ``(linear(hidden_states), None)``. Under a KV cache it caches zero heads per position, so the
    cache still counts the sequence (transformers reads past lengths from it) and holds 0 bytes for this layer.
    """

    def __init__(self, hidden_size, layer_idx, layer_type=None):
        super().__init__()
        self.linear = torch.nn.Linear(hidden_size, hidden_size)
        self.layer_idx = layer_idx
        self.layer_type = layer_type  # the replaced attention's type (Gemma 3 picks its layer inputs by it)

    def forward(self, hidden_states, *args, **kwargs):
        cache = kwargs.get("cache", kwargs.get("past_key_values"))
        if cache is not None:
            empty = hidden_states.new_zeros(hidden_states.shape[0], 0, hidden_states.shape[1], 1)
            cache.update(empty, empty, self.layer_idx)
        return self.linear(hidden_states), None
# fmt: on


def check_attn_linear(config) -> None:
    if config.model_type == "gpt2":
        raise ZgError(
            "the attn_linear conversion is built for decoders whose layers call `self_attn` (not GPT-2's `attn`)",
            key="train.conversion",
            fix="use another conversion for GPT-2 teachers (prune_mlp, drop_layers, window_attention)",
        )


def fit_linear(x: torch.Tensor, y: torch.Tensor, ridge: float = 1e-6) -> tuple[torch.Tensor, torch.Tensor]:
    """(W, b) minimizing ||x W^T + b - y||^2 over every position of x, y (..., C), in float64 (normal equations
    on centred data, ridge ``ridge`` x the mean variance for rank-deficient samples); returned in float32."""
    xs, ys = x.reshape(-1, x.shape[-1]).double(), y.reshape(-1, y.shape[-1]).double()
    mx, my = xs.mean(0), ys.mean(0)
    xc, yc = xs - mx, ys - my
    gram = xc.T @ xc
    gram = gram + (ridge * gram.diagonal().mean() + 1e-12) * torch.eye(gram.shape[0], dtype=gram.dtype)
    w = torch.linalg.solve(gram, xc.T @ yc).T  # (C out, C in)
    return w.float(), (my - w @ mx).float()


def attention_io(family, layer, h: torch.Tensor, inputs: dict) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(the attention's input, its output, the layer's output) of one decoder layer run on ``h``."""
    seen = {}

    def pre(module, args, kwargs):
        seen["x"] = kwargs["hidden_states"] if "hidden_states" in kwargs else args[0]

    def post(module, args, out):
        seen["y"] = out[0]

    hooks = [
        layer.self_attn.register_forward_pre_hook(pre, with_kwargs=True),
        layer.self_attn.register_forward_hook(post),
    ]
    try:
        out = family.call_layer(layer, h, inputs)
    finally:
        for hook in hooks:
            hook.remove()
    return seen["x"], seen["y"], out
