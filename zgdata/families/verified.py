"""``VerifiedFamily``: a dense decoder that has no record, run from the parts found in the model itself.

A model type transformers can build as a causal LM, that zg neither declares (zgdata/families/registry.py,
traits.py) nor refuses, gets this adapter. Its parts come from ``discover`` (zgdata/families/discover.py); the
layers are called as ``DenseFamily`` calls them (the model's own decoder-layer class, rotary ``position_embeddings``,
the masks transformers' masking utilities build for each attention type), so the same capture, blocks, conversions
and assembly run unchanged. ``zg teacher prepare`` trusts it only after the identity round trip holds bit for bit on
a probe batch (zgdata/families/selfcheck.py); its verdict goes into teacher.json.

What a check cannot find stays declared: logit scaling or soft-capping, an embedding multiplier applied outside the
embedding module, a per-layer config list other than ``layer_types``. A teacher that has one fails the round trip
(or ``check``) and is refused, naming the part; its family then needs a record.
"""

from __future__ import annotations

import copy
import functools
import inspect

import torch

from zgdata.errors import ZgError
from zgdata.families.base import mask_kwargs, positions
from zgdata.families.dense import DenseFamily, tiny_fields
from zgdata.families.discover import PartError, Parts, causal_lm_name, config_name, discover_config
from zgdata.families.traits import Traits

__all__ = ["VerifiedFamily", "verifiable"]


def verifiable(model_type: str) -> bool:
    """Whether transformers builds this model type as a causal LM (the only kind a self-check can verify)."""
    return bool(config_name(model_type) and causal_lm_name(model_type))


@functools.cache
def _sdpa(model_type: str) -> bool:
    import transformers

    return bool(getattr(getattr(transformers, causal_lm_name(model_type)), "_supports_sdpa", False))


class VerifiedFamily(DenseFamily):
    template = "dense"  # per-layer shapes: the generic modeling file, where the layout is Llama's (check_template)
    verified = True  # teacher.json records the self-check's verdict

    def __init__(self, model_type: str, config=None):
        self.model_type = model_type
        self.config_class = config_name(model_type)
        self.model_class = causal_lm_name(model_type)
        self.attn_implementation = "sdpa" if _sdpa(model_type) else "eager"
        self.config = None
        self.parts: Parts | None = None
        if config is not None:
            self._bind(config)

    def _bind(self, config) -> None:
        cfg = self.config_from_dict(config) if isinstance(config, dict) else config
        p = discover_config(self.model_type, cfg)
        types = getattr(cfg, "layer_types", None)
        self.traits = Traits(
            self.model_type,
            prefix=self.model_class.removesuffix("ForCausalLM"),
            norms=p.norms,
            fused_gate_up=p.fused_gate_up,
            window_field="sliding_window" if hasattr(cfg, "sliding_window") else None,
            attention_types=bool(types),
            rotary_per_type=p.rotary_per_type,
            attention=self.attn_implementation,
            norm_identity=p.norm_identity,
            dropout_keys=tuple(
                k for k, v in cfg.to_dict().items() if k.endswith(("dropout", "pdrop")) and isinstance(v, float)
            ),
        )
        self.config, self.parts = cfg, p
        self.base, self.layers_attr, self.norm_attr = p.base, p.layers, p.norm
        self.width_attr, self.mlp_out, self.mlp_channels = p.width_attr, p.mlp_out, dict(p.mlp_channels)
        self.layer_class, self.rotary_class = p.layer_class, p.rotary_class
        self.layer_norms, self.norm_identity, self.dropout_keys = p.norms, p.norm_identity, self.traits.dropout_keys

    def bind(self, config):
        return type(self)(self.model_type, config)

    # --- what discovery found, and what it could not -----------------------------------------------
    def _parts(self) -> Parts:
        if self.parts is None:
            raise RuntimeError(f"the {self.model_type} adapter is used before it was bound to a config")
        return self.parts

    def attention_name(self) -> str | None:
        return self._parts().attn

    def mlp_missing(self) -> str | None:
        p = self._parts()
        return None if p.width_attr else f"the MLP's projections ({p.why_no_mlp})"

    def check(self, config):
        types = set(getattr(config, "layer_types", None) or [])
        if not types <= {"full_attention", "sliding_attention"}:
            raise PartError(
                "layers",
                f"attention layer types {', '.join(sorted(types))} (zg runs full and sliding attention)",
                fix="this decoder needs a record of its own: see docs/tutorials/convert-your-model.md",
            )
        n = config.num_hidden_layers
        varied = [
            k
            for k, v in config.to_dict().items()
            if k != "layer_types" and isinstance(v, list) and len(v) == n and n > 1 and len({repr(x) for x in v}) > 1
        ]
        if varied:  # blocks renumber their layers from 0: a per-layer field would follow the index, not the layer
            raise PartError(
                "layers",
                f"config field {varied[0]} differs from layer to layer, and zg's blocks renumber their layers",
                fix="this decoder needs a record of its own: see docs/tutorials/convert-your-model.md",
            )
        if self.mlp_missing():
            raise PartError(
                "mlp",
                f"{self.mlp_missing()} were not found",
                fix="this decoder needs a record of its own: see docs/tutorials/convert-your-model.md",
            )

    def check_model(self, model) -> None:
        """Every layer has layer 0's tensors (names and shapes): a block is converted from what discovery read in
        layer 0 (its MLP, norms, attention), so a decoder whose layers differ (experts in some layers, per-layer
        widths) is refused here; the self-check at prepare then trusts the rest."""
        layers = self.layers(model)
        shapes = [{k: tuple(v.shape) for k, v in layer.state_dict().items()} for layer in layers]
        odd = next((i for i, s in enumerate(shapes) if s != shapes[0]), None)
        if odd is not None:
            extra = sorted(set(shapes[odd]) ^ set(shapes[0])) or [
                k for k in shapes[0] if shapes[odd][k] != shapes[0][k]
            ]
            raise PartError(
                f"layer {odd}",
                f"its tensors differ from layer 0's ({extra[0]}: experts or per-layer shapes)",
                fix="this decoder needs a record of its own: see docs/tutorials/convert-your-model.md",
            )

    def width(self, config):
        return getattr(config, self._parts().width_attr)

    # --- the decoder's pieces ---------------------------------------------------------------------------
    def embed(self, inner, ids):
        return getattr(inner, self._parts().embed)(ids)

    def embed_head(self, head, ids):
        return torch.nn.functional.embedding(ids, head[f"{self._parts().embed}.weight"])

    def model_rotary(self, inner):
        name = self._parts().rotary
        return getattr(inner, name) if name else None

    def rotary(self, config):
        return super().rotary(config) if self.rotary_class else None

    def head_key(self, key):
        return key if key.split(".", 1)[0] == self._parts().head else f"{self.base}.{key}"

    def layer_inputs(self, rotary, h):
        cfg = copy.copy(self.config)
        cfg._attn_implementation = self.attn_implementation  # the masks transformers builds for this attention
        pos = positions(h)
        types = sorted(set(getattr(cfg, "layer_types", None) or []))
        out = {"position_ids": pos}
        if rotary is not None and self.traits.rotary_per_type:
            out["position_embeddings"] = {t: rotary(h, pos, t) for t in types}
        elif rotary is not None:
            out["position_embeddings"] = rotary(h, position_ids=pos)
        out["masks"] = self._masks(cfg, h, pos, types)
        return out

    def _masks(self, cfg, h, pos, types) -> dict:
        from transformers.masking_utils import create_causal_mask, create_sliding_window_causal_mask

        kw = mask_kwargs(cfg, h, pos)
        if not types:  # one kind for every layer: the sliding mask where the config sets a window, as Mistral's
            windowed = getattr(cfg, "sliding_window", None) is not None
            return {None: (create_sliding_window_causal_mask if windowed else create_causal_mask)(**kw)}
        make = {"full_attention": create_causal_mask, "sliding_attention": create_sliding_window_causal_mask}
        return {t: make[t](**kw) for t in types}

    def _kind(self, layer) -> str | None:
        if not self.traits.attention_types:
            return None
        attn = layer.get_submodule(self._parts().attn) if self._parts().attn else None
        kind = getattr(attn, "layer_type", None)
        if kind is None and attn is not None and hasattr(attn, "layer_idx"):
            kind = attn.config.layer_types[attn.layer_idx]
        return kind

    def call_layer(self, layer, h, inputs):
        kind = self._kind(layer)
        emb = inputs.get("position_embeddings")
        emb = emb[kind] if isinstance(emb, dict) else emb
        kwargs = {"attention_mask": inputs["masks"][kind], "position_ids": inputs["position_ids"]}
        if emb is not None:
            kwargs["position_embeddings"] = emb
        params = inspect.signature(layer.forward).parameters
        if not any(p.kind is p.VAR_KEYWORD for p in params.values()):
            kwargs = {k: v for k, v in kwargs.items() if k in params}
        out = layer(h, **kwargs)
        return out[0] if isinstance(out, tuple) else out

    def rebuild_buffers(self, model, config):
        if self._parts().rotary:
            inner = self.inner(model)
            setattr(inner, self._parts().rotary, type(getattr(inner, self._parts().rotary))(config=config))

    def student_config(self, config_dict, widths, layer_types=None):
        config = super().student_config(config_dict, widths, layer_types)
        n = len(widths)
        for k, v in config.to_dict().items():  # per-layer lists (check: uniform) follow the layer count
            if k != "layer_types" and isinstance(v, list) and len(v) == config_dict.get("num_hidden_layers") and v:
                setattr(config, k, [v[0]] * n)
        return config

    def prune_mlp(self, layer, keep):
        if not self.traits.fused_gate_up:
            return super(DenseFamily, self).prune_mlp(layer, keep)
        out = dict(layer)
        for name, dim in self.mlp_channels.items():
            if name in layer:
                x = layer[name]
                rows = torch.cat([keep, keep + x.shape[0] // 2]) if dim == 0 else keep  # [gate; up] halves
                out[name] = x.index_select(dim, rows)
        return out

    def check_template(self) -> str | None:
        """Why this family's per-layer shapes cannot use the generic modeling file (None: they can)."""
        p = self._parts()
        layout = (p.base, p.layers, p.attn, p.width_attr, (p.mlp_out or "").split(".")[0])
        if layout != ("model", "layers", "self_attn", "intermediate_size", "mlp"):
            return "its layout is not model.layers[i].self_attn/mlp with config.intermediate_size"
        return None

    def tiny_config(self, tok):
        import transformers

        cls = getattr(transformers, self.config_class)
        try:  # the standard names: a config class's attribute_map translates them
            return cls(**tiny_fields(tok))
        except Exception as e:
            raise ZgError(
                f"transformers' {self.config_class} does not build a tiny model from standard fields ({' '.join(str(e).split())})"[
                    :300
                ],
                key="teacher.source",
                fix="prepare a model directory of this family instead (teacher.source: <path>)",
            ) from e
