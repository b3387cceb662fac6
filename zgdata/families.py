"""Model families: everything zg knows about a decoder-only architecture, one adapter per family.

Capture, slicing, student blocks, conversions, assembly and evaluation never name a
family: they ask the teacher's adapter (``family_of(config)``). An adapter knows
- the transformers classes (config, causal LM, decoder layer), imported lazily;
- where the decoder layers, the final norm and the head parts sit in the state dict;
- how to embed token ids (GPT-2 adds learned positions), the per-forward position inputs
  (rotary ``position_embeddings`` for Llama/Qwen2, none for GPT-2) and how one layer is
  called, exactly as the model's own forward calls it with no mask (sdpa, causal), so a
  layer-by-layer run is bit-identical to the model's forward;
- where the MLP channels are (for pruning) and how to write a config of another MLP width
  or depth (the student's).
Boundary k means the same in every family: the residual entering layer k; the last one
is the last layer's output *before* the final norm.

Adding a family: subclass ``Family`` (or ``RotaryFamily`` for Llama-like models), fill in
the class attributes, override what differs, add it to ``FAMILIES``, ship a
``zgtrain/student/templates/modeling_zg_<model_type>.py`` for students with per-layer MLP widths,
and add it to the parametrization of tests/zgtrain/test_families.py. Changing what an existing
adapter computes (``embed``, ``layer_inputs``, ``call_layer``) changes stored boundaries: bump
CAPTURE_VERSION in zgdata/capture_version.py with it.
"""

from __future__ import annotations

import copy
import importlib
import inspect
from typing import ClassVar

import torch

from zgdata.errors import ZgError
from zgdata.family_traits import REFUSED, TRAITS, Traits

__all__ = ["Family", "FAMILIES", "family", "family_of", "config_from_dict", "supported"]

WHERE = "zgdata/families.py"


def _positions(h: torch.Tensor) -> torch.Tensor:
    return torch.arange(h.shape[1], device=h.device).unsqueeze(0)  # (1, T): every sequence starts at 0


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

    def check_length(self, config, length: int) -> None:
        """Refuse sequences the layer-by-layer run would not capture as the model's forward does."""

    def finish_logits(self, logits: torch.Tensor) -> torch.Tensor:
        """What the causal LM does to ``lm_head(norm(h))`` (soft-capping, scaling); nothing by default."""
        return logits

    def width(self, config) -> int:
        return getattr(config, self.width_attr)

    def layer_config(self, config, width: int):
        """The config a student layer is built from: MLP width ``width``, sdpa, no dropout."""
        cfg = copy.deepcopy(config)
        setattr(cfg, self.width_attr, width)
        cfg._attn_implementation = "sdpa"
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
        pos = _positions(h)
        return {"position_embeddings": rotary(h, position_ids=pos), "position_ids": pos}  # cos, sin: (1, T, D)

    def rebuild_buffers(self, model, config):
        inner = self.inner(model)
        inner.rotary_emb = type(inner.rotary_emb)(config=config)


class Llama(RotaryFamily):
    model_type = "llama"
    config_class = "LlamaConfig"
    model_class = "LlamaForCausalLM"
    layer_class = ("transformers.models.llama.modeling_llama", "LlamaDecoderLayer")
    rotary_class = ("transformers.models.llama.modeling_llama", "LlamaRotaryEmbedding")

    def tiny_config(self, tok):
        return self.transformers_class(self.config_class)(
            vocab_size=len(tok),
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=4,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=512,
            tie_word_embeddings=True,
            initializer_range=0.1,
            bos_token_id=tok.bos_token_id,
            eos_token_id=tok.eos_token_id,
            pad_token_id=tok.pad_token_id,
        )


class Qwen2(RotaryFamily):
    """Qwen2 / Qwen2.5: Llama's layout plus q/k/v biases and per-layer attention types."""

    model_type = "qwen2"
    config_class = "Qwen2Config"
    model_class = "Qwen2ForCausalLM"
    layer_class = ("transformers.models.qwen2.modeling_qwen2", "Qwen2DecoderLayer")
    rotary_class = ("transformers.models.qwen2.modeling_qwen2", "Qwen2RotaryEmbedding")

    def check(self, config):
        # a sliding-window layer needs its own mask; called with none it would attend to the whole prefix
        if "sliding_attention" in (getattr(config, "layer_types", None) or []):
            raise ZgError(
                "this Qwen2 teacher uses sliding-window attention layers, which zg does not capture bit-exactly",
                key="teacher.source",
                fix="use a Qwen2 model with use_sliding_window: false (all Qwen2.5 releases are)",
            )

    def student_config(self, config_dict, widths, layer_types=None):
        config = super().student_config(config_dict, widths)
        config.layer_types = ["full_attention"] * len(widths)  # one entry per layer; check() refused the rest
        return config

    def tiny_config(self, tok):
        return self.transformers_class(self.config_class)(
            vocab_size=len(tok),
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=4,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=512,
            tie_word_embeddings=False,
            initializer_range=0.1,
            use_sliding_window=False,
            bos_token_id=tok.bos_token_id,
            eos_token_id=tok.eos_token_id,
            pad_token_id=tok.pad_token_id,
        )


class GPT2(Family):
    """GPT-2: learned absolute positions added to the token embeddings, LayerNorm, Conv1D (in, out) MLP."""

    model_type = "gpt2"
    config_class = "GPT2Config"
    model_class = "GPT2LMHeadModel"
    layer_class = ("transformers.models.gpt2.modeling_gpt2", "GPT2Block")
    base = "transformer"
    layers_attr = "h"
    norm_attr = "ln_f"
    width_attr = "n_inner"
    mlp_out = "mlp.c_proj"
    # Conv1D stores weight as (in, out): c_fc's channels are its columns, c_proj's its rows; c_proj.bias is per output
    mlp_channels = {"mlp.c_fc.weight": 1, "mlp.c_fc.bias": 0, "mlp.c_proj.weight": 0}
    layer_norms = ("ln_1", "ln_2")
    dropout_keys = ("resid_pdrop", "embd_pdrop", "attn_pdrop")

    def check(self, config):
        if getattr(config, "add_cross_attention", False):
            raise ZgError(
                "this GPT-2 teacher has cross-attention layers (an encoder-decoder)",
                key="teacher.source",
                fix="use a decoder-only GPT-2 model",
            )
        if getattr(config, "scale_attn_by_inverse_layer_idx", False):
            # the scale depends on the layer's index, which blocks and assembly renumber
            raise ZgError(
                "this GPT-2 teacher scales attention by its layer index (scale_attn_by_inverse_layer_idx)",
                key="teacher.source",
                fix="use a GPT-2 model without scale_attn_by_inverse_layer_idx",
            )

    def width(self, config):
        return config.n_inner if config.n_inner is not None else 4 * config.hidden_size  # GPT2Block's default

    def embed(self, inner, ids):
        return inner.wte(ids) + inner.wpe(_positions(ids))  # as GPT2Model.forward (its dropout is off in eval)

    def embed_head(self, head, ids):
        emb = torch.nn.functional.embedding
        return emb(ids, head["wte.weight"]) + emb(_positions(ids), head["wpe.weight"])

    def tiny_config(self, tok):
        return self.transformers_class(self.config_class)(
            vocab_size=len(tok),
            n_embd=64,
            n_layer=4,
            n_head=4,
            n_positions=512,
            initializer_range=0.1,
            tie_word_embeddings=True,
            bos_token_id=tok.bos_token_id,
            eos_token_id=tok.eos_token_id,
            pad_token_id=tok.pad_token_id,
        )


class DenseFamily(RotaryFamily):
    """A Llama-like dense decoder described by a ``Traits`` record (zgdata/family_traits.py): the classes are
    ``<prefix>Config``, ``<prefix>ForCausalLM``, ``<prefix>DecoderLayer``, ``<prefix>RotaryEmbedding``; code
    appears only where a trait needs it. ``family_of(config)`` binds the adapter to the teacher's config, which
    the config-valued traits (embedding multiplier, logit scaling, window) read."""

    template = "dense"  # per-layer widths: the one generic modeling file (zgtrain/student/templates/)

    def __init__(self, traits: Traits, config=None):
        self.traits = traits
        self.model_type = traits.model_type
        self.config_class = traits.config_class or f"{traits.prefix}Config"
        self.model_class = f"{traits.prefix}ForCausalLM"
        self.layer_class = (traits.module, f"{traits.prefix}DecoderLayer")
        self.rotary_class = (traits.module, f"{traits.prefix}RotaryEmbedding")
        self.mlp_channels = traits.mlp_channels
        self.layer_norms = traits.norms
        self.dropout_keys = traits.dropout_keys
        self.norm_identity = traits.norm_identity
        self.config = config

    def bind(self, config):
        return type(self)(self.traits, config)

    def _field(self, name: str | None):
        if name is None or self.config is None:
            return None
        return self.config.get(name) if isinstance(self.config, dict) else getattr(self.config, name, None)

    def check(self, config):
        types = set(getattr(config, "layer_types", None) or [])
        if getattr(config, "attn_logit_softcapping", None) is not None or getattr(
            config, "use_bidirectional_attention", False
        ):
            raise ZgError(
                f"this {self.model_type} teacher soft-caps attention logits or attends bidirectionally, which zg's "
                "sdpa capture does not run",
                key="teacher.source",
                fix=f"use a {self.model_type} model without attn_logit_softcapping / use_bidirectional_attention",
            )
        if self.traits.attention_types and types <= {"full_attention", "sliding_attention"}:
            return
        if len(types) > 1:
            raise ZgError(
                f"this {self.model_type} teacher mixes attention layer types ({', '.join(sorted(types))})",
                key="teacher.source",
                fix=f"use a {self.model_type} model whose layers all attend alike, or teach DenseFamily in {WHERE} "
                "per-layer inputs",
            )

    def check_model(self, model) -> None:
        """Refuse a loaded teacher whose modules or layer call are not the ones this adapter runs."""
        module, name = self.layer_class
        want = getattr(importlib.import_module(module), name)
        inner = self.inner(model) if hasattr(model, self.base) else None
        have = [a for a in ("embed_tokens", "rotary_emb", self.layers_attr, self.norm_attr) if hasattr(inner, a)]
        params = inspect.signature(want.forward).parameters
        bad = (
            len(have) < 4
            or any(type(layer) is not want for layer in self.layers(model))
            or not {"attention_mask", "position_embeddings", "position_ids"} <= set(params)
        )
        if bad:
            raise ZgError(
                f"this {self.model_type} teacher ({type(model).__name__}) is not the {self.model_class} layout zg "
                f"captures ({self.base}.embed_tokens/rotary_emb/{self.layers_attr}/{self.norm_attr}, {name} layers "
                "called with position_embeddings)",
                key="teacher.source",
                fix=f"use a stock {self.model_class} checkpoint, or extend the {self.model_type} adapter in {WHERE}",
            )

    def check_length(self, config, length: int) -> None:
        window = getattr(config, self.traits.window_field, None) if self.traits.window_field else None
        if window is not None and length > window:
            raise ZgError(
                f"sequences of {length} tokens exceed this {self.model_type} teacher's sliding window ({window}); "
                "zg captures sliding-window layers only within the window",
                key="corpus.seq_len",
                fix=f"set corpus.seq_len <= {window}",
            )

    def student_config(self, config_dict, widths, layer_types=None):
        config = super().student_config(config_dict, widths)
        types = getattr(config, "layer_types", None)
        if layer_types is not None:  # each student layer keeps its teacher layer's type (Gemma 3)
            config.layer_types = list(layer_types)
        elif types:  # check() refused mixed types: one entry per student layer
            config.layer_types = [types[0]] * len(widths)
        return config

    def layer_types(self, config, indices):
        return [config.layer_types[i] for i in indices] if self.traits.attention_types else None

    def make_layer(self, config, index, layer_type=None):
        if layer_type is not None:  # the layer reads its type from config.layer_types[index]
            config = copy.copy(config)
            config.layer_types = [*config.layer_types[:index], layer_type, *config.layer_types[index + 1 :]]
        return super().make_layer(config, index)

    def layer_inputs(self, rotary, h):
        if not self.traits.attention_types:
            return super().layer_inputs(rotary, h)
        pos = _positions(h)  # one rotary per attention type, as the model's forward computes them
        return {"position_ids": pos, "by_type": {t: rotary(h, pos, t) for t in rotary.layer_types}}

    def call_layer(self, layer, h, inputs):
        if "by_type" not in inputs:
            return super().call_layer(layer, h, inputs)
        emb = inputs["by_type"][layer.self_attn.layer_type]
        return layer(h, attention_mask=None, position_embeddings=emb, position_ids=inputs["position_ids"])

    def rebuild_buffers(self, model, config):
        super().rebuild_buffers(model, config)
        for m in self.inner(model).modules():  # Gemma's scaled embedding: a buffer not in the state dict
            if hasattr(m, "scalar_embed_scale"):
                m.embed_scale = torch.tensor(m.scalar_embed_scale)

    def embed(self, inner, ids):
        h = inner.embed_tokens(ids)
        if self.traits.embed_multiplier:  # as the model's forward: inputs_embeds * multiplier (a float)
            h = h * getattr(inner, self.traits.embed_multiplier)
        return h

    def embed_head(self, head, ids):
        w = head["embed_tokens.weight"]
        h = torch.nn.functional.embedding(ids, w)
        if self.traits.embed_scaled:  # as the scaled embedding module: * tensor(sqrt(hidden)) in the weight's dtype
            h = h * torch.tensor(self._field("hidden_size") ** 0.5).to(w.dtype)
        if self.traits.embed_multiplier:
            h = h * self._field(self.traits.embed_multiplier)
        return h

    def finish_logits(self, logits):
        divisor, cap = self._field(self.traits.logits_divisor), self._field(self.traits.logits_softcap)
        if divisor is not None:
            logits = logits / divisor
        if cap is not None:
            logits = torch.tanh(logits / cap) * cap
        return logits

    def prune_mlp(self, layer, keep):
        if not self.traits.fused_gate_up:
            return super().prune_mlp(layer, keep)
        out = dict(layer)
        fused = layer["mlp.gate_up_proj.weight"]
        half = fused.shape[0] // 2
        out["mlp.gate_up_proj.weight"] = fused.index_select(0, torch.cat([keep, keep + half]))
        out["mlp.down_proj.weight"] = layer["mlp.down_proj.weight"].index_select(1, keep)
        return out

    def tiny_config(self, tok):
        fields = {
            "vocab_size": len(tok),
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_hidden_layers": 4,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "max_position_embeddings": 512,
            "tie_word_embeddings": False,
            "initializer_range": 0.1,
            "bos_token_id": tok.bos_token_id,
            "eos_token_id": tok.eos_token_id,
            "pad_token_id": tok.pad_token_id,
        }
        return self.transformers_class(self.config_class)(**{**fields, **self.traits.tiny})


FAMILIES: dict[str, Family] = {f.model_type: f for f in (Llama(), Qwen2(), GPT2(), *(DenseFamily(t) for t in TRAITS))}


def supported() -> str:
    return ", ".join(sorted(FAMILIES))


def family(model_type: str) -> Family:
    """The adapter of ``model_type``, or a one-line error naming the supported families and where to add one."""
    if model_type in REFUSED:
        what, where = REFUSED[model_type]
        raise ZgError(
            f"teacher architecture '{model_type}' is {what}; zg does not support it",
            key="teacher.source",
            fix=f"use a dense decoder-only model ({supported()}); support would go in {where}",
        )
    if model_type not in FAMILIES:
        raise ZgError(
            f"teacher architecture '{model_type}' is not supported (zg supports {supported()})",
            key="teacher.source",
            fix=f"use a model of one of those families, or add an adapter for '{model_type}' in {WHERE}",
        )
    return FAMILIES[model_type]


def family_of(config) -> Family:
    """The adapter of a transformers config (or a config dict), bound to it where the family reads config values."""
    model_type = config.get("model_type") if isinstance(config, dict) else config.model_type
    return family(str(model_type).removeprefix("zg_")).bind(config)  # zg's per-layer-width students are zg_<family>


def config_from_dict(d: dict):
    """A teacher config as recorded in slices and block metadata, in its family's config class."""
    return family_of(d).config_from_dict(d)
