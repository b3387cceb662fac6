"""A student block: a stack of decoder layers mapping boundary k to boundary k+1.

It runs the teacher family's own decoder-layer class exactly as the teacher's forward does
(the family adapter in zgdata/families/registry.py: rotary positions from 0 for Llama/Qwen2, nothing
for GPT-2 whose positions are in boundary 0 already; sdpa causal attention, no mask), so an
identity block reproduces the teacher's boundary bit for bit. Dropout is off in a block's
layers: a block trains deterministically toward the teacher's function. A layer with a window
(``windows``, None: full attention) attends to its last W positions only (zgtrain/block/window.py). Families
whose layers differ in attention type (Gemma 3: sliding and full, each with its own rotary) build each layer
as the teacher layer it came from (``layer_types``). A layer may have fewer key/value heads than the teacher's
(``kv_heads``, None: the teacher's; zgtrain/block/attention.py), or a linear map in place of its attention
(``attention``: "linear"; None: the teacher's attention), or its attention linearized with learned feature maps
(``attention``: "linear_attention" or "linear_attention:W", W the exact-softmax window; the linear_attention
conversion). A mixture-of-experts layer may keep fewer experts or run fewer per token (``experts`` /
``top_k``, None: the teacher's; zgtrain/block/experts.py), its width being one expert's.
"""

from __future__ import annotations

import torch
from torch import nn

from zgdata.families.registry import family_of
from zgtrain.block.attention import AttentionLinear, LinearAttention, kv_layer_config
from zgtrain.block.window import add_windows

__all__ = ["StudentBlock", "layer_config"]


def layer_config(config, intermediate_size: int):
    return family_of(config).layer_config(config, intermediate_size)


class StudentBlock(nn.Module):
    def __init__(
        self,
        config,
        intermediate_sizes: list[int],
        windows: list[int | None] | None = None,
        layer_types: list[str] | None = None,
        kv_heads: list[int | None] | None = None,
        attention: list[str | None] | None = None,
        experts: list[int | None] | None = None,
        top_k: list[int | None] | None = None,
    ):
        super().__init__()
        fam = family_of(config)
        self.family = fam
        self.intermediate_sizes = list(intermediate_sizes)
        self.windows = list(windows) if windows is not None else [None] * len(self.intermediate_sizes)
        if len(self.windows) != len(self.intermediate_sizes):
            raise ValueError(f"{len(self.windows)} windows for {len(self.intermediate_sizes)} layers")
        # the teacher's attention type of each layer, where the family has several (Gemma 3); None: one type
        self.layer_types = list(layer_types) if layer_types is not None else None
        types = self.layer_types or [None] * len(self.intermediate_sizes)
        # each layer's KV heads where the kv_heads conversion set them; None: the teacher's
        self.kv_heads = list(kv_heads) if kv_heads is not None else [None] * len(self.intermediate_sizes)
        if len(self.kv_heads) != len(self.intermediate_sizes):
            raise ValueError(f"{len(self.kv_heads)} kv_heads for {len(self.intermediate_sizes)} layers")
        # a MoE layer's experts and experts per token (the expert conversions); None: the teacher's
        self.experts = _per_layer(experts, len(self.intermediate_sizes), "experts")
        self.top_k = _per_layer(top_k, len(self.intermediate_sizes), "top_k")
        if any(e is not None or k is not None for e, k in zip(self.experts, self.top_k)) and fam.moe is None:
            raise ValueError(f"expert counts for a {fam.model_type} block, whose MLPs have no experts")
        self.layers = nn.ModuleList(
            fam.make_layer(kv_layer_config(self._mlp_config(fam, config, m, e, k), kv), i, t)
            for i, (m, t, kv, e, k) in enumerate(
                zip(intermediate_sizes, types, self.kv_heads, self.experts, self.top_k)
            )
        )
        # "linear": the attn_linear conversion's AttentionLinear in place of the layer's attention; None: attention
        self.attention = list(attention) if attention is not None else [None] * len(self.intermediate_sizes)
        if len(self.attention) != len(self.intermediate_sizes):
            raise ValueError(f"{len(self.attention)} attention kinds for {len(self.intermediate_sizes)} layers")
        for i, (layer, kind) in enumerate(zip(self.layers, self.attention)):
            if kind == "linear":
                layer.self_attn = AttentionLinear(config.hidden_size, i, getattr(layer.self_attn, "layer_type", None))
            elif kind is not None and kind.startswith("linear_attention"):
                window = LinearAttention.window_of(kind)
                layer.self_attn = LinearAttention(
                    layer.self_attn, window, i, getattr(layer.self_attn, "layer_type", None)
                )
            elif kind is not None:
                raise ValueError(f"unknown attention kind {kind!r}")
        add_windows(self.layers, self.windows)
        rotary = fam.rotary(fam.layer_config(config, fam.width(config)))
        if rotary is not None:  # buffers derived from the config, never saved (see weights())
            self.rotary_emb = rotary

    @staticmethod
    def _mlp_config(fam, config, width, experts, top_k):
        cfg = fam.layer_config(config, width)
        return cfg if fam.moe is None else fam.with_experts(cfg, experts, top_k)

    def cache_heads(self) -> list[int | None]:
        """Each layer's KV heads for the KV-cache figures: 0 for a linear layer (no cache), None for the teacher's."""
        return [0 if a == "linear" else h for a, h in zip(self.attention, self.kv_heads)]

    def cache_windows(self) -> list[int | None]:
        """Each layer's cached positions for the KV-cache figures: a linear_attention layer's window (its constant
        state is counted apart: zgtrain/block/kv_cache.py), else its sliding window (None: full attention)."""
        return [
            LinearAttention.window_of(a) if a and a.startswith("linear_attention") else w
            for a, w in zip(self.attention, self.windows)
        ]

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        """(B, T, C) boundary k -> (B, T, C) boundary k+1."""
        inputs = self.family.layer_inputs(getattr(self, "rotary_emb", None), h)
        for layer in self.layers:
            h = self.family.call_layer(layer, h, inputs)
        return h

    def weights(self) -> dict[str, torch.Tensor]:
        """Trainable tensors only (the rotary buffers are derived from the config)."""
        return {k: v for k, v in self.state_dict().items() if not k.startswith("rotary_emb.")}

    def mlp_activations(self, h: torch.Tensor) -> list[torch.Tensor]:
        """Per layer, the MLP's intermediate activation (the input of its output projection): (B, T, I)."""
        acts = []
        hooks = [
            layer.get_submodule(self.family.mlp_out).register_forward_hook(
                lambda m, inp, out: acts.append(inp[0].detach())
            )
            for layer in self.layers
        ]
        try:
            self.forward(h)
        finally:
            for hk in hooks:
                hk.remove()
        return acts


def _per_layer(values, n: int, what: str) -> list:
    out = list(values) if values is not None else [None] * n
    if len(out) != n:
        raise ValueError(f"{len(out)} {what} for {n} layers")
    return out
