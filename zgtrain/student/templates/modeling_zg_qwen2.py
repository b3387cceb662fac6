"""Qwen2 with a per-layer MLP width and per-layer sliding-window attention, shipped inside ZeroGraph
students whose blocks differ in shape or attention window.

zg loads it with ``zgtrain.student.load_student``, which first checks that this file is byte for byte
the one zg wrote (sha256 pinned in zerograph.json). Outside zg, pass ``trust_remote_code`` to
``AutoModelForCausalLM.from_pretrained`` only after checking that hash yourself.

``layer_windows`` (one entry per layer; null: full attention) restricts a layer's attention to its last
W positions, itself included. Such layers need ``attn_implementation`` sdpa (the default) or eager.
``layer_kv_heads`` (one entry per layer) is each layer's number of key/value heads: a layer whose count
differs from ``num_key_value_heads`` gets its own attention module built with its count.
``layer_attention`` (one entry per layer: "full", or "linear": one linear map of the normed input in place of
the attention, no KV cache) is zg's attn_linear conversion.
"""

import copy

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM
from transformers.models.qwen2.modeling_qwen2 import Qwen2MLP


# A verbatim copy of zgtrain/window.py's SlidingWindow (tests/zgtrain/test_window.py checks it).
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


# A verbatim copy of zgtrain/block/attention.py's AttentionLinear (tests/zgtrain/block/test_attn_linear.py checks it).
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


class ZgQwen2Config(Qwen2Config):
    model_type = "zg_qwen2"

    def __init__(
        self, intermediate_sizes=None, layer_windows=None, layer_kv_heads=None, layer_attention=None, **kwargs
    ):
        super().__init__(**kwargs)
        self.intermediate_sizes = list(intermediate_sizes or [self.intermediate_size] * self.num_hidden_layers)
        self.layer_windows = list(layer_windows or [None] * self.num_hidden_layers)
        self.layer_kv_heads = list(layer_kv_heads or [self.num_key_value_heads] * self.num_hidden_layers)
        self.layer_attention = list(layer_attention or ["full"] * self.num_hidden_layers)


class ZgQwen2ForCausalLM(Qwen2ForCausalLM):
    config_class = ZgQwen2Config

    def __init__(self, config):
        super().__init__(config)
        for layer, width in zip(self.model.layers, config.intermediate_sizes):
            cfg = copy.copy(config)
            cfg.intermediate_size = width
            layer.mlp = Qwen2MLP(cfg)
        for i, (layer, heads) in enumerate(zip(self.model.layers, config.layer_kv_heads)):
            if heads != config.num_key_value_heads:  # this layer's own KV head count
                cfg = copy.copy(config)
                cfg.num_key_value_heads = heads
                layer.self_attn = type(layer.self_attn)(cfg, layer_idx=i)
        for i, (layer, kind) in enumerate(zip(self.model.layers, config.layer_attention)):
            if kind == "linear":  # no attention: one linear map of the normed input
                layer.self_attn = AttentionLinear(config.hidden_size, i, getattr(layer.self_attn, "layer_type", None))
        for layer, window in zip(self.model.layers, config.layer_windows):
            if window is not None:
                layer.self_attn.register_forward_pre_hook(SlidingWindow(window), with_kwargs=True)
        self.post_init()
