"""``DenseFamily``: a Llama-like dense decoder described by a ``Traits`` record (zgdata/families/traits.py), with
code only where a trait needs it. The instances join the registry in zgdata/families/registry.py."""

from __future__ import annotations

import copy
import importlib
import inspect

import torch

from zgdata.errors import ZgError
from zgdata.families.base import WHERE, RotaryFamily, mask_kwargs, positions
from zgdata.families.traits import Traits

__all__ = ["DenseFamily", "tiny_fields"]


class DenseFamily(RotaryFamily):
    """A Llama-like dense decoder described by a ``Traits`` record (zgdata/families/traits.py): the classes are
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
        self.attn_implementation = traits.attention
        self.config = config

    def bind(self, config):
        return type(self)(self.traits, config)

    def _field(self, name: str | None):
        if name is None or self.config is None:
            return None
        return self.config.get(name) if isinstance(self.config, dict) else getattr(self.config, name, None)

    def check(self, config):
        types = set(getattr(config, "layer_types", None) or [])
        capped = getattr(config, "attn_logit_softcapping", None) is not None and self.attn_implementation == "sdpa"
        if capped or getattr(config, "use_bidirectional_attention", False):
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
        config = rotary.config  # the teacher's (capture) or the block's layer config: same attention, same window
        windowed = self.traits.window_field is not None and getattr(config, self.traits.window_field, None) is not None
        if not (self.traits.attention_types or windowed):
            return super().layer_inputs(rotary, h)  # Llama's: no mask, sdpa runs causal
        pos = positions(h)
        if self.traits.rotary_per_type:  # one rotary per attention type, as the model's forward computes them
            emb = {t: rotary(h, pos, t) for t in rotary.layer_types}
        else:
            emb = rotary(h, position_ids=pos)
        return {"position_ids": pos, "position_embeddings": emb, "masks": self.masks(config, h, pos)}

    def masks(self, config, h, pos) -> dict:
        """{attention type (None: the only one): mask} as the model's own forward builds them with masking_utils:
        sdpa gets None while the sequence fits the window (then it runs causal), a band beyond it; eager (Gemma 2)
        always a mask, having no implicit causal one."""
        from transformers.masking_utils import create_causal_mask, create_sliding_window_causal_mask

        kw = mask_kwargs(config, h, pos)
        if not self.traits.attention_types:
            return {None: create_sliding_window_causal_mask(**kw)}
        return {
            "full_attention": create_causal_mask(**kw),
            "sliding_attention": create_sliding_window_causal_mask(**kw),
        }

    def call_layer(self, layer, h, inputs):
        if "masks" not in inputs:
            return super().call_layer(layer, h, inputs)
        kind = layer.self_attn.layer_type if self.traits.attention_types else None
        emb = inputs["position_embeddings"]
        emb = emb[kind] if isinstance(emb, dict) else emb
        return layer(
            h, attention_mask=inputs["masks"][kind], position_embeddings=emb, position_ids=inputs["position_ids"]
        )

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
        return self.transformers_class(self.config_class)(**{**tiny_fields(tok), **self.traits.tiny})


def tiny_fields(tok) -> dict:
    """A tiny random teacher's config fields under transformers' standard names, over the byte-level tokenizer."""
    return {
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
