"""``MoeFamily``: a Llama-like decoder whose MLP is a routed mixture of experts (Mixtral, Qwen2-MoE, Qwen3-MoE,
OLMoE), described by a ``Traits`` record with a ``Moe`` entry (zgdata/families/traits.py).

A boundary is the residual stream whatever the MLP is, so capture, slices and student blocks run these layers as
``DenseFamily`` runs a dense one. What differs is the MLP: ``layer.mlp`` holds a router ``gate`` (E, C) and
``experts`` with ``gate_up_proj`` (E, 2I, C: gate rows first) and ``down_proj`` (E, C, I), plus, in Qwen2-MoE, a
shared expert every token runs (``shared_expert``, ``shared_expert_gate``). A student layer may keep fewer experts
(``with_experts``: the router's rows follow, top-k is clamped) or a single one (moe_to_dense: one expert of any
width under a one-row router, whose softmax is exactly 1: a dense MLP in the family's own stock classes).

Experts run as zg's padded grouped GEMM everywhere (zgdata/families/moe_kernel.py): in capture
(``experts_implementation`` at load), in blocks and in the students zg loads. A token's boundary then does not depend
on which other tokens share its batch, as cached == online needs.
"""

from __future__ import annotations

import copy

import torch

from zgdata.errors import ZgError
from zgdata.families.base import WHERE
from zgdata.families.dense import DenseFamily
from zgdata.families.moe_kernel import EXPERTS_IMPLEMENTATION, register

__all__ = ["MoeFamily", "EXPERTS_IMPLEMENTATION", "EXPERT_TENSORS"]

# a layer's tensors indexed by expert on dim 0 (the router's rows, each expert's weights)
EXPERT_TENSORS = ("mlp.gate.weight", "mlp.experts.gate_up_proj", "mlp.experts.down_proj")


class MoeFamily(DenseFamily):
    """A ``DenseFamily`` whose ``width`` is one expert's MLP width and whose layers count experts."""

    mlp_out = None  # no one MLP activation: prune_mlp is refused (mlp_missing), prune_experts / moe_to_dense work
    experts_implementation = EXPERTS_IMPLEMENTATION

    def __init__(self, traits, config=None):
        super().__init__(traits, config)
        self.moe = traits.moe
        self.width_attr = traits.moe.width

    # --- counts ---------------------------------------------------------------------------
    def experts(self, config) -> int:
        return int(_get(config, self.moe.experts))

    def top_k(self, config) -> int:
        return int(_get(config, self.moe.top_k))

    def shared_width(self, config) -> int:
        return int(_get(config, self.moe.shared) or 0) if self.moe.shared else 0

    def mlp_missing(self):
        return "one MLP per layer (this teacher's MLPs are routed experts: use prune_experts or moe_to_dense)"

    # --- configs ----------------------------------------------------------------------------
    def check(self, config):
        super().check(config)
        sparse_step = getattr(config, "decoder_sparse_step", 1) or 1
        if getattr(config, "mlp_only_layers", None) or sparse_step != 1:
            raise ZgError(
                f"this {self.model_type} teacher mixes dense and expert MLP layers (mlp_only_layers / "
                "decoder_sparse_step), which zg's per-layer expert counts do not describe",
                key="teacher.source",
                fix=f"use a {self.model_type} model whose every layer routes experts (decoder_sparse_step 1, no "
                "mlp_only_layers)",
            )
        types = set(getattr(config, "layer_types", None) or [])
        if "sliding_attention" in types and self.traits.window_field is None:
            raise ZgError(
                f"this {self.model_type} teacher uses sliding-window attention layers, which zg does not capture "
                "bit-exactly for this family",
                key="teacher.source",
                fix=f"use a {self.model_type} model with use_sliding_window: false",
            )

    def check_model(self, model):
        super().check_model(model)
        for i, layer in enumerate(self.layers(model)):
            experts = getattr(getattr(layer, "mlp", None), "experts", None)
            up = getattr(experts, "gate_up_proj", None)
            if not isinstance(up, torch.Tensor) or up.dim() != 3 or not hasattr(layer.mlp, "gate"):
                raise ZgError(
                    f"layer {i} of this {self.model_type} teacher has no fused experts (mlp.experts.gate_up_proj of "
                    "shape (E, 2I, C)) under a router mlp.gate",
                    key="teacher.source",
                    fix=f"load it with transformers >= 5 (its experts are fused there), or extend {WHERE}",
                )

    def load_kwargs(self):
        register()  # the name means zg's kernel only once transformers knows it
        return {**super().load_kwargs(), "experts_implementation": self.experts_implementation}

    def layer_config(self, config, width):
        cfg = super().layer_config(config, width)
        register()
        cfg._experts_implementation = self.experts_implementation
        return cfg

    def with_experts(self, cfg, experts: int | None, top_k: int | None = None):
        """``cfg`` (a layer config) for a layer of ``experts`` experts running ``top_k`` each (clamped to the
        count; None: the teacher's)."""
        if experts is None and top_k is None:
            return cfg
        cfg = copy.copy(cfg)
        n = self.experts(cfg) if experts is None else int(experts)
        setattr(cfg, self.moe.experts, n)
        setattr(cfg, self.moe.top_k, min(n, self.top_k(cfg) if top_k is None else int(top_k)))
        return cfg

    def student_config(self, config_dict, widths, layer_types=None, experts=None, top_k=None):
        """The stock config, with one expert count and top-k for every layer (``experts`` / ``top_k``: each
        layer's; the assembly ships per-layer counts in zg's modeling file, where they differ)."""
        config = super().student_config(config_dict, widths, layer_types)
        n = max(experts) if experts else self.experts(config)
        k = max(top_k) if top_k else self.top_k(config)
        setattr(config, self.moe.experts, n)
        setattr(config, self.moe.top_k, min(k, n))
        return config

    def architecture(self, config):
        return {
            **super().architecture(config),
            "experts": self.experts(config),
            "active_experts": self.top_k(config),
            **({"shared_expert_size": self.shared_width(config)} if self.moe.shared else {}),
        }

    # --- tensors ------------------------------------------------------------------------------
    def prune_experts(self, layer: dict[str, torch.Tensor], keep: torch.Tensor) -> dict[str, torch.Tensor]:
        """A layer's tensors keeping only experts ``keep`` (sorted indices): the router's rows and the experts'."""
        out = dict(layer)
        for name in EXPERT_TENSORS:
            out[name] = layer[name].index_select(0, keep)
        return out


def _get(config, name):
    return config.get(name) if isinstance(config, dict) else getattr(config, name, None)
