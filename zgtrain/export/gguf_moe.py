"""Mixture-of-experts students in llama.cpp: Mixtral as ``llama`` with experts, Qwen2-MoE as ``qwen2moe``, Qwen3-MoE
as ``qwen3moe`` and OLMoE as ``olmoe`` (the family -> arch table is ``ARCHS`` in zgtrain/export/gguf_arch.py).

Read from llama.cpp's source (src/models/{llama,qwen2moe,qwen3moe,olmoe}.cpp, ``build_moe_ffn`` in
src/llama-graph.cpp) and convert_hf_to_gguf.py:
- Keys: ``<arch>.expert_count`` (n_expert) and ``<arch>.expert_used_count`` (n_expert_used), one number each for
  every layer (none of these archs reads them per layer); qwen2moe and qwen3moe read one expert's width from
  ``expert_feed_forward_length``, llama and olmoe from ``feed_forward_length``; qwen2moe the shared expert's
  from ``expert_shared_feed_forward_length``.
- Tensors: the router ``ffn_gate_inp`` (E, C); ``ffn_gate_exps`` / ``ffn_up_exps`` (E, I, C), transformers' fused
  ``gate_up_proj`` (E, 2I, C) split at row I (gate rows first); ``ffn_down_exps`` (E, C, I) as ``down_proj`` is.
  Qwen2-MoE's shared expert is ``ffn_{gate,up,down}_shexp`` and its gate ``ffn_gate_inp_shexp`` (1, C), which
  llama.cpp multiplies in as sigmoid (silu(x) / x), as transformers' ``sigmoid(shared_expert_gate(x))``. The routers
  stay f32 in every dtype, as convert_hf_to_gguf keeps them (a rounded router may pick other experts).
- Routing: every one of these graphs takes the softmax over all E router logits, the top-k of it, then multiplies
  each chosen expert's output by its probability, renormalized over the k (``norm_w``) or not. That flag is a
  literal in each arch's graph, not a key (``expert_weights_norm`` is read by other archs only): llama and
  qwen3moe renormalize, qwen2moe and olmoe do not. transformers' Mixtral always renormalizes; Qwen2-MoE,
  Qwen3-MoE and OLMoE when ``norm_topk_prob``. Where the two differ the student is refused, unless top-k is every
  expert (the k probabilities then sum to 1 both ways: ``prune_experts`` keeping as many experts as run, and
  ``moe_to_dense``'s one expert).
- One expert (moe_to_dense): n_expert = n_expert_used = 1 loads and runs in all four archs (the softmax of one
  logit is 1), so it keeps the arch's expert tensors.
- OLMoE normalizes keys over the whole projection, and llama.cpp's olmoe creates that norm of the model's width:
  a student with fewer KV heads than query heads (grouped-query attention) is refused.
Per-layer expert counts or top-k (``layer_experts`` / ``layer_top_k`` differing, zg's modeling file) are refused.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from zgdata.errors import ZgError

__all__ = ["MoePlan", "CPP_NORM", "moe_plan", "write_moe_hparams", "expert_tensors", "is_router"]

# build_moe_ffn's norm_w literal in each arch's graph: the top-k weights renormalized over the k, or not
CPP_NORM = {"llama": True, "qwen2moe": False, "qwen3moe": True, "olmoe": False}
_KEEP_FIX = "keep the student folder (zg's modeling file runs it)"
_ROUTERS = ("mlp.gate.weight", "mlp.shared_expert_gate.weight")
_LAYER = re.compile(r"layers\.(\d+)\.")


@dataclass(frozen=True)
class MoePlan:
    experts: int  # n_expert, every layer
    top_k: int  # n_expert_used, every layer
    width: int  # one expert's MLP width
    shared: int = 0  # the shared expert's width (Qwen2-MoE), 0: none


def _student_norm(family: str, cfg: dict) -> bool:
    """Whether the student's router renormalizes each token's top-k weights (Mixtral's always does)."""
    return True if family == "mixtral" else bool(cfg.get("norm_topk_prob", False))


def moe_plan(summary: dict, cfg: dict, family: str, arch: str, sizes: list) -> MoePlan | None:
    """The expert counts llama.cpp's ``arch`` is given, or a one-line ZgError where it cannot run this student the
    way transformers does; None for a dense family."""
    from zgdata.families.registry import family as family_record

    moe = getattr(family_record(family), "moe", None)
    if moe is None or arch not in CPP_NORM:
        return None
    n = len(sizes)
    experts = [int(e) for e in summary.get("layer_experts") or [cfg[moe.experts]] * n]
    top_k = [int(k) for k in summary.get("layer_top_k") or [cfg[moe.top_k]] * n]
    for counts, say, knob in (
        (experts, lambda c: f"has {c} expert{'s' * (c != 1)}", "train.keep_experts"),
        (top_k, lambda c: f"runs the top {c} per token", "train.active_experts"),
    ):
        odd = next((i for i, c in enumerate(counts) if c != counts[0]), None)
        if odd is not None:
            raise ZgError(
                f"layer {odd} {say(counts[odd])} where layer 0 {say(counts[0])} (conversions prune_experts / "
                f"moe_to_dense): llama.cpp's '{arch}' architecture ({family}) reads one expert_count and one "
                "expert_used_count for all layers",
                fix=f"give every block the same expert conversion and {knob}, or {_KEEP_FIX}",
            )
    plan = MoePlan(experts[0], top_k[0], int(sizes[0]), int(cfg.get(moe.shared) or 0) if moe.shared else 0)
    ours, theirs = _student_norm(family, cfg), CPP_NORM[arch]
    if plan.top_k < plan.experts and ours != theirs:
        raise ZgError(
            f"this {family} student {'renormalizes' if ours else 'does not renormalize'} each token's top-{plan.top_k} "
            f"routing weights to sum to 1 (norm_topk_prob: {str(ours).lower()}), where llama.cpp's '{arch}' "
            f"graph {'never does' if ours else 'always does'}",
            fix="use `zg export --format hf`, or run every kept expert (train.active_experts = train.keep_experts, "
            "or moe_to_dense), where the two weightings are the same",
        )
    heads = int(cfg["num_attention_heads"])
    kv = int((summary.get("layer_kv_heads") or [cfg.get("num_key_value_heads") or heads])[0])
    if arch == "olmoe" and kv != heads:
        raise ZgError(
            f"this OLMoE student has {kv} KV heads for {heads} query heads: llama.cpp's 'olmoe' normalizes keys over "
            "the model's width, so it runs only as many KV heads as query heads",
            fix=f"use `zg export --format hf`, or {_KEEP_FIX}",
        )
    return plan


def write_moe_hparams(w, plan: MoePlan, arch: str) -> dict:
    """The expert keys of ``arch`` (see the module docstring); returns what lineage records."""
    w.add_expert_count(plan.experts)
    w.add_expert_used_count(plan.top_k)
    if arch in ("qwen2moe", "qwen3moe"):
        w.add_expert_feed_forward_length(plan.width)
    if arch == "qwen2moe":
        w.add_expert_shared_feed_forward_length(plan.shared)
    info = {"experts": plan.experts, "experts_used": plan.top_k}
    if plan.shared:
        info["shared_expert_ff"] = plan.shared
    return info


def is_router(key: str) -> bool:
    """A router's weight (kept f32 in every dtype)."""
    return key.endswith(_ROUTERS)


def expert_tensors(gguf, key: str, x: np.ndarray) -> list | None:
    """[(GGUF name, array)] of a fused expert tensor (``mlp.experts.gate_up_proj`` / ``down_proj``), None for any
    other key."""
    if not key.endswith(("mlp.experts.gate_up_proj", "mlp.experts.down_proj")):
        return None
    i = int(_LAYER.search(key).group(1))
    T, names = gguf.MODEL_TENSOR, gguf.TENSOR_NAMES

    def name(t):
        return names[t].format(bid=i) + ".weight"

    if key.endswith("down_proj"):
        return [(name(T.FFN_DOWN_EXP), x)]
    half = x.shape[1] // 2
    return [(name(T.FFN_GATE_EXP), x[:, :half]), (name(T.FFN_UP_EXP), x[:, half:])]
