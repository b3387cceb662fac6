"""The family adapter interface (``Family``) and the Llama-like base (``RotaryFamily``); zgdata/families/registry.py holds
the families and the registry, zgdata/families/dense.py the dense families described as data."""

from __future__ import annotations

import copy
import functools
import importlib
import inspect
from typing import ClassVar

import torch

__all__ = ["Family", "RotaryFamily", "cache_arg", "mask_kwargs", "positions", "WHERE"]

WHERE = "zgdata/families/registry.py"


def positions(h: torch.Tensor) -> torch.Tensor:
    return torch.arange(h.shape[1], device=h.device).unsqueeze(0)  # (1, T): every sequence starts at 0


def mask_kwargs(config, h: torch.Tensor, pos: torch.Tensor) -> dict:
    """Keyword arguments of transformers' mask builders (``masking_utils.create_causal_mask`` and its siblings) for a
    forward over whole sequences, with no cache and no padding (the cache argument's name: ``cache_arg``)."""
    return {"config": config, "inputs_embeds": h, "attention_mask": None, cache_arg(): None, "position_ids": pos}


@functools.cache
def cache_arg() -> str:
    """The name transformers' forwards and mask builders take a KV cache by: ``cache`` in the release zg's CI runs,
    ``past_key_values`` in earlier 5.x releases (5.17, the GPU image's; the rename came with every model's forward)."""
    from transformers.masking_utils import create_causal_mask

    return "cache" if "cache" in inspect.signature(create_causal_mask).parameters else "past_key_values"


class Family:
    """The interface. Class attributes name things; methods do the few things that differ by family."""

    model_type: ClassVar[str]
    config_class: ClassVar[str]  # transformers top-level names
    model_class: ClassVar[str]
    layer_class: ClassVar[tuple[str, str]]  # (module, class) of one decoder layer
    base: ClassVar[str]  # attribute of the causal LM that holds the decoder
    layers_attr: ClassVar[str]  # ModuleList of decoder layers inside ``base``
    norm_attr: ClassVar[str]  # final norm inside ``base``
    width_attr: ClassVar[str]  # config field of the MLP width
    mlp_out: ClassVar[str]  # module in a layer whose input is the MLP's intermediate activation
    mlp_channels: ClassVar[dict[str, int]]  # layer tensor -> the dim that indexes MLP channels
    layer_norms: ClassVar[tuple[str, ...]]  # norm modules inside a layer
    norm_identity: ClassVar[float] = 1.0  # the norm weight that scales by 1 (Gemma stores 1 + w: 0)
    attn_implementation: ClassVar[str] = "sdpa"  # what capture, blocks and students run (Gemma 2: eager)
    dropout_keys: ClassVar[tuple[str, ...]]  # config fields a student block zeroes (it trains deterministically)

    # --- classes and configs -------------------------------------------------------------
    def transformers_class(self, name: str):
        import transformers

        return getattr(transformers, name)

    def causal_lm(self):
        return self.transformers_class(self.model_class)

    def config_from_dict(self, d: dict):
        return self.transformers_class(self.config_class).from_dict(d)

    template: ClassVar[str | None] = None  # per-layer-width modeling file: modeling_zg_<template or model_type>.py

    def bind(self, config) -> Family:
        """The adapter for one teacher config (families whose traits read config values return a bound copy)."""
        return self

    def check(self, config) -> None:
        """Refuse variants whose layer-by-layer run would not be the model's own forward."""

    def check_model(self, model) -> None:
        """Refuse a loaded teacher whose modules are not the ones this adapter runs (``zg teacher prepare``)."""

    moe = None  # a routed mixture-of-experts MLP's config fields (traits.Moe; zgdata/families/moe.py), else None
    verified: ClassVar[bool] = False  # True: no record; prepare's self-check trusts it (zgdata/families/verified.py)

    def attention_name(self) -> str | None:
        """The attention module inside a layer (None: not found)."""
        return "self_attn"

    def mlp_missing(self) -> str | None:
        """What prune_mlp would need and the adapter could not find (None: nothing)."""
        return None

    def check_template(self) -> str | None:
        """Why per-layer shapes cannot use this family's modeling template (None: they can)."""
        return None

    def load_kwargs(self) -> dict:
        """``from_pretrained`` keywords that make a loaded model run as zg's capture, blocks and students do."""
        return {"attn_implementation": self.attn_implementation}

    def finish_logits(self, logits: torch.Tensor) -> torch.Tensor:
        """What the causal LM does to ``lm_head(norm(h))`` (soft-capping, scaling); nothing by default."""
        return logits

    def width(self, config) -> int:
        return getattr(config, self.width_attr)

    def layer_config(self, config, width: int):
        """The config a student layer is built from: MLP width ``width``, sdpa, no dropout."""
        cfg = copy.deepcopy(config)
        setattr(cfg, self.width_attr, width)
        cfg._attn_implementation = self.attn_implementation
        for k in self.dropout_keys:
            if getattr(cfg, k, 0):
                setattr(cfg, k, 0.0)
        return cfg

    def make_layer(self, config, index: int, layer_type: str | None = None) -> torch.nn.Module:
        """Decoder layer ``index`` of a block; ``layer_type``: the teacher layer's attention type (see layer_types)."""
        module, name = self.layer_class
        return getattr(importlib.import_module(module), name)(config, layer_idx=index)

    def layer_types(self, config, indices: list[int]) -> list[str] | None:
        """The attention types of teacher layers ``indices`` where the family's layers differ in them (Gemma 3);
        None where every layer attends alike (student blocks then record none)."""
        return None

    def student_config(self, config_dict: dict, widths: list[int], layer_types: list[str] | None = None):
        """The assembled student's config: the teacher's, with ``len(widths)`` layers of MLP width max(widths)
        (``layer_types``: each student layer's attention type, where the family has several)."""
        config = self.config_from_dict(config_dict)
        config.num_hidden_layers = len(widths)
        setattr(config, self.width_attr, max(widths))
        return config

    def architecture(self, config) -> dict:
        """teacher.json's ``architecture`` record."""
        return {
            "model_type": config.model_type,
            "num_layers": config.num_hidden_layers,
            "hidden_size": config.hidden_size,
            "num_heads": config.num_attention_heads,
            "num_kv_heads": getattr(config, "num_key_value_heads", None) or config.num_attention_heads,
            "intermediate_size": self.width(config),
            "vocab_size": config.vocab_size,
            "max_positions": config.max_position_embeddings,
            "tie_word_embeddings": bool(config.tie_word_embeddings),
        }

    def tiny_config(self, tok):
        """A tiny random teacher's config over the byte-level tokenizer ``tok`` (``teacher.source: random:tiny-*``)."""
        raise NotImplementedError

    # --- modules of a loaded model -------------------------------------------------------
    def inner(self, model) -> torch.nn.Module:
        return getattr(model, self.base)

    def layers(self, model) -> torch.nn.ModuleList:
        return getattr(self.inner(model), self.layers_attr)

    def final_norm(self, model) -> torch.nn.Module:
        return getattr(self.inner(model), self.norm_attr)

    def embed(self, inner, ids: torch.Tensor) -> torch.Tensor:
        """Boundary 0 from token ids, with the model's own embedding modules: (B, T) -> (B, T, C)."""
        raise NotImplementedError

    def embed_head(self, head: dict[str, torch.Tensor], ids: torch.Tensor) -> torch.Tensor:
        """Boundary 0 from the head slice's tensors (keys as ``split_state`` names them)."""
        raise NotImplementedError

    def model_rotary(self, inner):
        """The model's own position module that ``layer_inputs`` needs (None when positions are embedded)."""
        return None

    def rotary(self, config):
        """A fresh position module for a student block (None when positions are embedded)."""
        return None

    def layer_inputs(self, rotary, h: torch.Tensor) -> dict:
        """Per-forward keyword inputs of every layer, computed once (rotary cos/sin, position ids)."""
        return {}

    def call_layer(self, layer, h: torch.Tensor, inputs: dict) -> torch.Tensor:
        """One decoder layer as the model's forward calls it; ``attention_mask=None`` lets sdpa run causal."""
        return layer(h, attention_mask=None, **inputs)

    def rebuild_buffers(self, model, config) -> None:
        """Recreate derived buffers of a model built on the meta device (assembly)."""

    # --- state dicts -------------------------------------------------------------------------
    def split_state(self, state: dict) -> tuple[dict[int, dict[str, torch.Tensor]], dict[str, torch.Tensor]]:
        """({layer: {name in layer: tensor}}, {head key: tensor}); head keys drop the ``base.`` prefix."""
        prefix = f"{self.base}.{self.layers_attr}."
        layers: dict[int, dict[str, torch.Tensor]] = {}
        head = {}
        for k, v in state.items():
            if k.startswith(prefix):
                idx, rest = k[len(prefix) :].split(".", 1)
                layers.setdefault(int(idx), {})[rest] = v
            else:
                head[k.removeprefix(f"{self.base}.")] = v
        return dict(sorted(layers.items())), head

    def layer_key(self, index: int, name: str) -> str:
        return f"{self.base}.{self.layers_attr}.{index}.{name}"

    def head_key(self, key: str) -> str:
        """The model's state-dict key of a head-slice key (the LM head sits outside ``base``)."""
        return key if key.split(".", 1)[0] == "lm_head" else f"{self.base}.{key}"

    def prune_mlp(self, layer: dict[str, torch.Tensor], keep: torch.Tensor) -> dict[str, torch.Tensor]:
        """A layer's tensors keeping only MLP channels ``keep`` (sorted indices)."""
        out = dict(layer)
        for name, dim in self.mlp_channels.items():
            if name in layer:
                out[name] = layer[name].index_select(dim, keep)
        return out

    def is_layer_norm(self, param: str) -> bool:
        """Is ``param`` (a parameter name inside a block) a weight or bias of a layer norm?"""
        return any(f".{n}." in f".{param}" for n in self.layer_norms)


class RotaryFamily(Family):
    """Llama-like: token embeddings only, rotary positions per attention, RMSNorm, gated MLP."""

    rotary_class: ClassVar[tuple[str, str]]
    base = "model"
    layers_attr = "layers"
    norm_attr = "norm"
    width_attr = "intermediate_size"
    mlp_out = "mlp.down_proj"
    mlp_channels = {
        "mlp.gate_proj.weight": 0,
        "mlp.gate_proj.bias": 0,
        "mlp.up_proj.weight": 0,
        "mlp.up_proj.bias": 0,
        "mlp.down_proj.weight": 1,
    }
    layer_norms = ("input_layernorm", "post_attention_layernorm")
    dropout_keys = ("attention_dropout",)

    def embed(self, inner, ids):
        return inner.embed_tokens(ids)

    def embed_head(self, head, ids):
        return torch.nn.functional.embedding(ids, head["embed_tokens.weight"])

    def model_rotary(self, inner):
        return inner.rotary_emb

    def rotary(self, config):
        module, name = self.rotary_class
        return getattr(importlib.import_module(module), name)(config=config)

    def layer_inputs(self, rotary, h):
        pos = positions(h)
        return {"position_embeddings": rotary(h, position_ids=pos), "position_ids": pos}  # cos, sin: (1, T, D)

    def rebuild_buffers(self, model, config):
        inner = self.inner(model)
        inner.rotary_emb = type(inner.rotary_emb)(config=config)
