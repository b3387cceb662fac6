"""How each zg family maps onto a llama.cpp architecture: which arch, which hyperparameter keys, which tensor edits.

Read from llama.cpp's own source (src/models/<arch>.cpp, src/llama-model.cpp load_hparams) and
convert_hf_to_gguf.py (conversion/*.py):
- Llama, Mistral and Granite use llama.cpp's NORM (interleaved) rotary: q/k rows are permuted as
  ``LlamaModel.permute`` does so it equals transformers' rotate_half. Qwen2, OLMo 2, Phi-3 and Gemma use NEOX
  rotary (no permutation). GPT-2's Conv1D weights are (in, out): transposed. Gemma stores norms as 1 + w.
- Per-layer MLP widths: only ``deci`` (src/models/deci.cpp) reads ``feed_forward_length`` per layer
  (``hparams.n_ff(i)``); it is Llama's layer with optional q/k/v biases, so Llama, Mistral and Qwen2 students
  with mixed widths export as ``deci`` (Qwen2's q/k weights and biases permuted for NORM rotary). Every other
  arch builds its tensors from one ``n_ff``: mixed widths are refused. Per-layer KV heads (the kv_heads
  conversion) likewise: ``deci`` reads ``head_count_kv`` per layer, every other arch one count.
- Decoders verified at prepare (no record in zgdata/families/) export where llama.cpp has their architecture and
  it was checked against the student's logits in llama.cpp (tests/zgtrain/export/test_gguf.py): Qwen3 (``qwen3``),
  StarCoder2 (``starcoder2``, LayerNorm), Phi (``phi2``, partial rotary) and OLMo (``olmo``, parameter-free LayerNorm
  of fixed epsilon, NORM rotary). Any other family is refused in one line (``spec_of``).
- Windows: Gemma 2/3 read a per-layer ``sliding_window_pattern`` array, written from the student's
  ``layer_types`` (a dropped layer keeps its own type). The llama arch has no sliding window, llama.cpp
  switches Phi-3's off and reads none for StarCoder2 or qwen3: a Mistral / Phi-3 / StarCoder2 window, or a Qwen3
  one where ``layer_types`` has sliding layers, shorter than the context is written as the model's
  ``context_length`` (= the window: within it sliding and full attention are the same computation).
- OLMo's ``clip_qkv`` (q, k and v clamped) is ``attention.clamp_kqv``; llama.cpp's olmoe does not apply it, so an
  OLMoE student with ``clip_qkv`` is refused (``check_options``), as are bias tensors an arch does not load.
- Mixtures of experts (zgtrain/export/gguf_moe.py): Mixtral as ``llama`` with experts (expert_count,
  expert_used_count, ffn_gate_inp and ffn_{gate,up,down}_exps), Qwen2-MoE as ``qwen2moe`` (with its shared expert
  and that expert's sigmoid gate), Qwen3-MoE as ``qwen3moe``, OLMoE as ``olmoe``: one expert count and top-k for
  every layer, a router weighting llama.cpp's graph does the same way, and (OLMoE) no grouped-query attention.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from gguf import RopeScalingType

from zgdata.errors import ZgError

__all__ = ["ArchSpec", "ARCHS", "spec_of", "check_options", "write_hparams", "edit_tensor", "permute_qk"]

WIDTHS_FIX = "keep the student folder (zg's modeling file runs it), or rebuild the student with uniform MLP widths"


@dataclass(frozen=True)
class ArchSpec:
    family: str
    arch: str  # llama.cpp arch of a uniform student
    per_layer_arch: str | None = None  # arch reading per-layer widths (deci), or None: mixed widths refused
    norm_rotary: bool = False  # llama.cpp NORM rotary: permute q/k (in ``arch``; deci always)
    norm_shift: float = 0.0  # Gemma: stored norm weight is w, llama.cpp multiplies by 1 + w
    conv1d: bool = False  # GPT-2: Conv1D (in, out) weights
    window: str | None = None  # "pattern": per-layer swa array (Gemma); "context": window capped as context
    needs_output: bool = False  # arch has no tied-embedding fallback (OLMo 2): write output.weight
    layer_norm_eps: str | None = None  # LayerNorm (not RMSNorm) layers: the config field of their epsilon
    partial_rotary: bool = False  # rotary over partial_rotary_factor of each head
    # the bias tensors the arch's loader takes: "optional" (any), "none" (a bias tensor fails the load: the
    # config's attention_bias / mlp_bias must be off), "required" (StarCoder2: use_bias must be on)
    biases: str = "optional"


ARCHS = {
    s.family: s
    for s in (
        ArchSpec("llama", "llama", "deci", norm_rotary=True),
        ArchSpec("mistral", "llama", "deci", norm_rotary=True, window="context"),
        ArchSpec("qwen2", "qwen2", "deci"),
        ArchSpec("gpt2", "gpt2", conv1d=True),
        ArchSpec("granite", "granite", norm_rotary=True),
        ArchSpec("olmo2", "olmo2", needs_output=True, biases="none"),
        ArchSpec("phi3", "phi3", window="context"),
        ArchSpec("gemma2", "gemma2", norm_shift=1.0, window="pattern", biases="none"),
        ArchSpec("gemma3_text", "gemma3", norm_shift=1.0, window="pattern", biases="none"),
        # verified at prepare (no record in zgdata/families/): Qwen3 is Qwen2's layer with q/k RMSNorms, no biases
        ArchSpec("qwen3", "qwen3", biases="none"),
        ArchSpec("starcoder2", "starcoder2", layer_norm_eps="norm_epsilon", window="context", biases="required"),
        ArchSpec("phi", "phi2", layer_norm_eps="layer_norm_eps", partial_rotary=True),
        ArchSpec("olmo", "olmo", norm_rotary=True, layer_norm_eps="-1e-5", biases="none"),
        # mixture-of-experts families (experts, routing and refusals: zgtrain/export/gguf_moe.py)
        ArchSpec("mixtral", "llama", norm_rotary=True, window="context"),
        ArchSpec("qwen2_moe", "qwen2moe", needs_output=True),
        ArchSpec("qwen3_moe", "qwen3moe", biases="none"),
        ArchSpec("olmoe", "olmoe", needs_output=True, biases="none"),
    )
}


def spec_of(family: str) -> ArchSpec:
    if family not in ARCHS:
        raise ZgError(
            f"no llama.cpp architecture mapping for family '{family}'",
            fix=f"use `zg export --format hf` (GGUF export covers {', '.join(ARCHS)}: the families llama.cpp has an "
            "architecture for that zg checked against llama.cpp)",
        )
    return ARCHS[family]


def _rope(cfg: dict, kind: str | None = None) -> dict:
    """The rope parameters of a config (transformers 5: rope_parameters, per attention type for Gemma 3)."""
    rp = cfg.get("rope_parameters") or {}
    if kind and kind in rp:
        rp = rp[kind]
    if not rp and cfg.get("rope_theta") is not None:
        rp = {"rope_type": "default", "rope_theta": cfg["rope_theta"]}
    return rp


def check_rope(cfg: dict, family: str) -> None:
    kinds = ("full_attention", "sliding_attention") if family == "gemma3_text" else (None,)
    for kind in kinds:
        rp = _rope(cfg, kind)
        rope_type = rp.get("rope_type", "default")
        if rope_type not in ("default", "linear"):
            raise ZgError(
                f"the student's rotary scaling '{rope_type}'{f' ({kind})' if kind else ''} is not written to GGUF by zg "
                "(only default and linear)",
                fix="use `zg export --format hf`, or llama.cpp's convert_hf_to_gguf.py on the exported folder",
            )


def check_options(cfg: dict, spec: ArchSpec) -> None:
    """Config options the arch cannot carry: bias tensors its loader does not take, or lacks (llama.cpp fails the
    load: a wrong tensor count), and a q/k/v clamp (``clip_qkv``) it does not apply (only ``olmo`` reads
    attention.clamp_kqv; measured: llama.cpp's olmoe left the values unclamped, logits 4.4 away)."""
    if cfg.get("clip_qkv") is not None and spec.arch != "olmo":
        raise ZgError(
            f"this {spec.family} student clamps q, k and v (clip_qkv: {cfg['clip_qkv']}), which llama.cpp's "
            f"'{spec.arch}' architecture does not",
            fix="use `zg export --format hf` (transformers runs it)",
        )
    if spec.family == "phi" and cfg.get("qk_layernorm"):  # found at write time before: check_gguf now says it
        raise ZgError(
            "this phi student normalizes q and k (qk_layernorm: true), which llama.cpp's 'phi2' architecture has no "
            "tensors for",
            fix="use `zg export --format hf` (transformers runs it)",
        )
    on = next((f for f in ("attention_bias", "mlp_bias") if cfg.get(f)), None)
    if spec.biases == "none" and on:
        raise ZgError(
            f"this {spec.family} student has {on}: true, and llama.cpp's '{spec.arch}' architecture loads no bias "
            "tensors (the file would not load)",
            fix="use `zg export --format hf` (transformers runs it)",
        )
    if spec.biases == "required" and cfg.get("use_bias") is False:
        raise ZgError(
            f"this {spec.family} student has use_bias: false, and llama.cpp's '{spec.arch}' architecture needs its "
            "bias tensors (the file would not load)",
            fix="use `zg export --format hf` (transformers runs it)",
        )


def head_dim(cfg: dict) -> int:
    return cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]


def gemma_scale_check(cfg: dict, spec: ArchSpec, n_layer: int) -> None:
    """llama.cpp scales Gemma's queries by 1/sqrt(head_dim), or 1/sqrt(hidden/heads) when the layer count is the
    27B's (46 Gemma 2, 62 Gemma 3: a property derived from the count); transformers by query_pre_attn_scalar^-0.5."""
    big = {"gemma2": 46, "gemma3": 62}[spec.arch]
    cpp = cfg["hidden_size"] // cfg["num_attention_heads"] if n_layer == big else head_dim(cfg)
    want = cfg.get("query_pre_attn_scalar") or head_dim(cfg)
    if cpp != want:
        raise ZgError(
            f"llama.cpp's {spec.arch} with {n_layer} layers scales attention by 1/sqrt({cpp}); this student by "
            f"1/sqrt(query_pre_attn_scalar={want})",
            fix="use `zg export --format hf`"
            + (f" (or keep a layer count other than {big})" if n_layer == big else ""),
        )


def write_hparams(
    w, cfg: dict, spec: ArchSpec, arch: str, sizes: list[int], layer_types: list | None, kv_heads: list | None = None
) -> dict:
    """The ``<arch>.*`` keys llama.cpp's load_hparams reads (``kv_heads``: each layer's, where they differ, which
    only ``deci`` can say); returns notes for lineage."""
    fam, n_layer, notes = spec.family, len(sizes), {}
    if fam == "gpt2":
        w.add_context_length(cfg["n_positions"])
        w.add_embedding_length(cfg["n_embd"])
        w.add_feed_forward_length(sizes[0])
        w.add_block_count(n_layer)
        w.add_head_count(cfg["n_head"])
        w.add_layer_norm_eps(cfg["layer_norm_epsilon"])
        return notes
    ctx = cfg["max_position_embeddings"]
    window = cfg.get("sliding_window")
    # an arch without windows runs sliding layers (Qwen3's use_sliding_window) as full attention:
    # equal within the window, so the window becomes the context, as for the "context" archs
    slides = spec.window == "context" or (spec.window is None and "sliding_attention" in (layer_types or []))
    if slides and window and window < ctx:
        notes["context_length_capped_to_window"] = window
        ctx = window
    w.add_context_length(ctx)
    w.add_embedding_length(cfg["hidden_size"])
    w.add_block_count(n_layer)
    w.add_feed_forward_length(list(sizes) if arch == "deci" else sizes[0])
    heads, kv = cfg["num_attention_heads"], cfg.get("num_key_value_heads") or cfg["num_attention_heads"]
    w.add_head_count([heads] * n_layer if arch == "deci" else heads)
    if kv_heads is not None and len(set(kv_heads)) > 1 and arch != "deci":
        raise ValueError(f"per-layer KV heads {kv_heads} need the deci architecture, not {arch}")
    w.add_head_count_kv(list(kv_heads or [kv] * n_layer) if arch == "deci" else (kv_heads or [kv])[0])
    if spec.layer_norm_eps is None:
        w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    else:  # OLMo's parameter-free LayerNorm has a fixed epsilon, written "-<value>"
        eps = spec.layer_norm_eps
        w.add_layer_norm_eps(float(eps[1:]) if eps.startswith("-") else cfg[eps])
    hd = head_dim(cfg)
    if hd != cfg["hidden_size"] // heads or spec.window == "pattern":
        w.add_key_length(hd)
        w.add_value_length(hd)
    _rope_hparams(w, cfg, spec, hd)
    _family_hparams(w, cfg, spec, notes)
    if spec.window == "pattern":
        _gemma_hparams(w, cfg, spec, n_layer, layer_types, notes)
    return notes


def _rope_hparams(w, cfg: dict, spec: ArchSpec, hd: int) -> None:
    """The rotary base, its linear scaling and the rotated dimensions (partial for Phi and Phi-3)."""
    rp = _rope(cfg, "full_attention" if spec.family == "gemma3_text" else None)
    w.add_rope_freq_base(float(rp.get("rope_theta", 10000.0)))
    if rp.get("rope_type") == "linear":
        w.add_rope_scaling_type(RopeScalingType.LINEAR)
        w.add_rope_scaling_factor(float(rp["factor"]))
    if spec.family == "phi3" or spec.partial_rotary:
        w.add_rope_dimension_count(int(rp.get("partial_rotary_factor", cfg.get("partial_rotary_factor", 1.0)) * hd))
    else:
        w.add_rope_dimension_count(hd)


def _family_hparams(w, cfg: dict, spec: ArchSpec, notes: dict) -> None:
    """One family's own keys: OLMo's q/k/v clamp, Granite's multipliers."""
    if spec.family == "olmo" and cfg.get("clip_qkv") is not None:  # q, k and v clamped to +-clip_qkv
        w.add_clamp_kqv(float(cfg["clip_qkv"]))
        notes["clamp_kqv"] = float(cfg["clip_qkv"])
    if spec.family == "granite":
        for key, add in (
            ("attention_multiplier", w.add_attention_scale),
            ("embedding_multiplier", w.add_embedding_scale),
            ("residual_multiplier", w.add_residual_scale),
            ("logits_scaling", w.add_logit_scale),
        ):
            if cfg.get(key) is not None:
                add(float(cfg[key]))


def _gemma_hparams(w, cfg: dict, spec: ArchSpec, n_layer: int, layer_types: list | None, notes: dict) -> None:
    """Gemma 2/3: soft-capping, the window and its per-layer pattern (each kept layer's own type), local rotary."""
    fam, window = spec.family, cfg.get("sliding_window")
    gemma_scale_check(cfg, spec, n_layer)
    if cfg.get("attn_logit_softcapping") is not None:
        w.add_attn_logit_softcapping(float(cfg["attn_logit_softcapping"]))
    if cfg.get("final_logit_softcapping") is not None:
        w.add_final_logit_softcapping(float(cfg["final_logit_softcapping"]))
    pattern = [t == "sliding_attention" for t in (layer_types or [])]
    if window and any(pattern):
        w.add_sliding_window(int(window))
        w.add_sliding_window_pattern(pattern)  # per layer: dropped layers keep their own type
        notes["sliding_window_pattern"] = pattern
    elif fam == "gemma2":  # gemma2 always has a window (default 4096): every layer full = pattern of no swa
        w.add_sliding_window(int(window or 4096))
        w.add_sliding_window_pattern([False] * n_layer)
    if fam == "gemma3_text":
        local = _rope(cfg, "sliding_attention")
        if local:
            w.add_rope_freq_base_swa(float(local.get("rope_theta", 10000.0)))


def permute_qk(x: np.ndarray, n_head: int) -> np.ndarray:
    """convert_hf_to_gguf's LlamaModel.permute: rotate_half's halves -> llama.cpp's interleaved pairs (rows)."""
    return x.reshape(n_head, 2, x.shape[0] // n_head // 2, *x.shape[1:]).swapaxes(1, 2).reshape(x.shape)


def edit_tensor(name: str, x: np.ndarray, cfg: dict, spec: ArchSpec, arch: str) -> np.ndarray:
    """One HF tensor as the GGUF arch stores it (``name``: the HF state-dict key)."""
    if spec.conv1d and name.endswith(
        ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")
    ):
        x = x.T
    if spec.norm_shift and name.endswith("norm.weight"):
        x = x + spec.norm_shift
    if spec.norm_rotary or arch == "deci":
        if ".self_attn.q_proj." in name:
            x = permute_qk(x, cfg["num_attention_heads"])
        elif ".self_attn.k_proj." in name:  # this layer's KV heads (the kv_heads conversion may vary them)
            x = permute_qk(x, x.shape[0] // head_dim(cfg))
    return np.ascontiguousarray(x)
