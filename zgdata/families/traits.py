"""Family knowledge as data: one ``Traits`` record per dense decoder family zg runs through ``DenseFamily``
(zgdata/families/registry.py), and the architectures zg refuses, each with the reason and where support would go.

A record names the transformers classes and the few traits that change what zg computes outside a decoder
layer (the layer itself always runs as transformers wrote it):
- ``embed_multiplier``: a config field the model's forward multiplies the token embeddings by (Granite);
- ``logits_divisor`` / ``logits_softcap``: config fields the causal LM applies to its logits (Granite's
  ``logits_scaling``; Gemma 2/3's ``final_logit_softcapping``), so a head built from the head slice matches;
- ``norms``: the norm modules inside a layer, after attention and MLP included (OLMo 2) and q/k norms;
- ``fused_gate_up``: the MLP's gate and up projections are one tensor, gate rows first (Phi-3), so pruning
  MLP channels selects the same rows in both halves;
- ``window_field``: a config field giving layers a sliding window (Mistral, Phi-3: every layer; Gemma 2/3:
  their sliding layers); each layer then gets the mask the model's own forward builds (transformers'
  masking_utils: none while the sequence fits the window, a band beyond it), in capture and in student
  blocks alike, and the student's stock config keeps the window;
- ``embed_scaled``: the embedding module multiplies by sqrt(hidden_size) itself (Gemma 3's scaled embedding),
  which ``embed_head`` repeats from the head slice's tensor;
- ``attention_types``: layers differ in attention type (``config.layer_types``: Gemma 3's sliding and full
  layers, each with its own rotary); student blocks record each layer's teacher type and the assembled
  config's ``layer_types`` follows them, so a dropped layer stays a stock config;
- ``rotary_per_type``: one rotary per attention type (Gemma 3's local and global bases);
- ``attention``: the attention implementation capture, blocks and students run (``eager`` for Gemma 2, whose
  attention soft-capping transformers runs only there; eager attention has no implicit causal mask: every
  layer gets the model's own masks);
- ``norm_identity``: the norm weight that scales by 1 (Gemma stores 1 + w: 0), where ``reinit`` starts norms.
- ``moe``: the MLP is a routed mixture of experts (``Moe``: the config fields of the expert count, one expert's
  width, the active experts per token and a shared expert's width); blocks then count, prune and densify experts
  (zgtrain/block/experts.py) and run zg's padded grouped GEMM (zgdata/families/moe_kernel.py), as capture does.
``tiny`` holds the fields of the family's tiny random teacher (``teacher.source: random:tiny-<model_type>``)
beyond the shared ones.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["Moe", "Traits", "TRAITS", "REFUSED"]

GATED_MLP = {
    "mlp.gate_proj.weight": 0,
    "mlp.gate_proj.bias": 0,
    "mlp.up_proj.weight": 0,
    "mlp.up_proj.bias": 0,
    "mlp.down_proj.weight": 1,
}


@dataclass(frozen=True)
class Moe:
    """A routed mixture-of-experts MLP (``layer.mlp``): a router ``gate`` (E, C) and ``experts`` holding
    ``gate_up_proj`` (E, 2I, C: gate rows first) and ``down_proj`` (E, C, I), as transformers 5 stores them."""

    experts: str  # config field: experts per layer (E)
    width: str  # config field: one expert's MLP width (I)
    shared: str | None = None  # config field: the width of a shared expert every token runs (Qwen2-MoE)
    top_k: str = "num_experts_per_tok"  # config field: experts each token runs


@dataclass(frozen=True)
class Traits:
    model_type: str
    prefix: str  # transformers class prefix: <prefix>Config, <prefix>ForCausalLM, <prefix>DecoderLayer, ...
    norms: tuple[str, ...] = ("input_layernorm", "post_attention_layernorm")
    embed_multiplier: str | None = None
    logits_divisor: str | None = None
    logits_softcap: str | None = None
    fused_gate_up: bool = False
    window_field: str | None = None
    embed_scaled: bool = False
    attention_types: bool = False
    rotary_per_type: bool = False
    attention: str = "sdpa"
    norm_identity: float = 1.0
    config_class: str | None = None  # where the names do not follow the prefix (Gemma 3: Gemma3TextConfig)
    module_name: str | None = None  # transformers.models.<module_name> (default: model_type)
    dropout_keys: tuple[str, ...] = ("attention_dropout",)
    moe: Moe | None = None
    tiny: dict = field(default_factory=dict)

    @property
    def module(self) -> str:
        name = self.module_name or self.model_type
        return f"transformers.models.{name}.modeling_{name}"

    @property
    def mlp_channels(self) -> dict[str, int]:
        if self.moe is not None:  # channels live inside each expert: prune_experts / moe_to_dense, not prune_mlp
            return {}
        if self.fused_gate_up:  # (2I, C): rows [0, I) gate, [I, 2I) up; DenseFamily.prune_mlp selects both halves
            return {"mlp.gate_up_proj.weight": 0, "mlp.down_proj.weight": 1}
        return GATED_MLP


TRAITS: tuple[Traits, ...] = (
    Traits("mistral", "Mistral", window_field="sliding_window", tiny={"sliding_window": 16}),  # < corpus.seq_len 64
    Traits(
        "granite",
        "Granite",
        embed_multiplier="embedding_multiplier",
        logits_divisor="logits_scaling",
        tiny={
            "embedding_multiplier": 3.0,
            "logits_scaling": 2.5,
            "residual_multiplier": 0.5,
            "attention_multiplier": 0.2,
        },
    ),
    Traits(
        "olmo2",
        "Olmo2",
        norms=("post_attention_layernorm", "post_feedforward_layernorm", "q_norm", "k_norm"),
    ),
    Traits(
        "gemma3_text",
        "Gemma3",
        config_class="Gemma3TextConfig",
        module_name="gemma3",
        norms=(
            "input_layernorm",
            "post_attention_layernorm",
            "pre_feedforward_layernorm",
            "post_feedforward_layernorm",
            "q_norm",
            "k_norm",
        ),
        embed_scaled=True,
        logits_softcap="final_logit_softcapping",
        window_field="sliding_window",
        attention_types=True,
        rotary_per_type=True,
        norm_identity=0.0,
        tiny={
            "sliding_window": 16,
            "layer_types": ["sliding_attention", "sliding_attention", "full_attention", "sliding_attention"],
            "final_logit_softcapping": 30.0,
            "head_dim": 16,
            "query_pre_attn_scalar": 16,
        },
    ),
    Traits(
        "gemma2",
        "Gemma2",
        norms=(
            "input_layernorm",
            "post_attention_layernorm",
            "pre_feedforward_layernorm",
            "post_feedforward_layernorm",
        ),
        embed_scaled=True,
        logits_softcap="final_logit_softcapping",
        window_field="sliding_window",
        attention_types=True,
        attention="eager",
        norm_identity=0.0,
        tiny={
            "sliding_window": 16,
            "layer_types": ["sliding_attention", "full_attention", "sliding_attention", "full_attention"],
            "head_dim": 16,
            "query_pre_attn_scalar": 16,
        },
    ),
    Traits(
        "phi3",
        "Phi3",
        fused_gate_up=True,
        window_field="sliding_window",
        dropout_keys=("attention_dropout", "resid_pdrop", "embd_pdrop"),
        tiny={"sliding_window": None},
    ),
    Traits(
        "mixtral",
        "Mixtral",
        window_field="sliding_window",
        dropout_keys=("attention_dropout", "router_jitter_noise"),
        moe=Moe("num_local_experts", "intermediate_size"),
        tiny={"num_local_experts": 4, "num_experts_per_tok": 2, "sliding_window": None},
    ),
    Traits(
        "qwen2_moe",
        "Qwen2Moe",
        moe=Moe("num_experts", "moe_intermediate_size", shared="shared_expert_intermediate_size"),
        tiny={
            "num_experts": 4,
            "num_experts_per_tok": 2,
            "moe_intermediate_size": 64,
            "shared_expert_intermediate_size": 96,
            "use_sliding_window": False,
        },
    ),
    Traits(
        "qwen3_moe",
        "Qwen3Moe",
        norms=("input_layernorm", "post_attention_layernorm", "q_norm", "k_norm"),
        window_field="sliding_window",
        moe=Moe("num_local_experts", "moe_intermediate_size"),
        tiny={"num_local_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 64, "head_dim": 16},
    ),
    Traits(
        "olmoe",
        "Olmoe",
        norms=("input_layernorm", "post_attention_layernorm", "q_norm", "k_norm"),
        moe=Moe("num_experts", "intermediate_size"),
        tiny={"num_experts": 4, "num_experts_per_tok": 2, "intermediate_size": 64},
    ),
)

# model_type -> (what it is, where support would go). family() refuses these with one line.
_MOE = (
    "a mixture-of-experts decoder zg has no record of (zg runs Mixtral, Qwen2-MoE, Qwen3-MoE and OLMoE: routed "
    "experts stored as transformers 5's fused gate_up_proj/down_proj with a top-k router)"
)
_HYBRID = "a hybrid attention + state-space decoder (its recurrent layers carry state that boundaries do not capture)"
_ENC_DEC = "an encoder-decoder (zg distils decoder-only models: one residual stream, boundary by boundary)"
_WHERE_MOE = "a Traits record with a Moe entry in zgdata/families/traits.py, where its experts have that layout"
_WHERE_HYBRID = "a Family whose layer_inputs carry the recurrent state, in zgdata/families/registry.py"
_WHERE_ENC_DEC = "a new capture for cross-attention inputs (zgdata/families/capture.py), not a family adapter"
REFUSED: dict[str, tuple[str, str]] = {
    **{
        t: (_MOE, _WHERE_MOE)
        for t in (
            "deepseek_v2",
            "deepseek_v3",
            "dbrx",
            "granitemoe",
            "granitemoeshared",
            "phimoe",
            "jetmoe",
            "gpt_oss",
            "llama4",
            "llama4_text",
            "minimax",
        )
    },
    **{
        t: (_HYBRID, _WHERE_HYBRID)
        for t in (
            "jamba",
            "falcon_h1",
            "bamba",
            "zamba",
            "zamba2",
            "granitemoehybrid",
            "nemotron_h",
            "lfm2",
            "mamba",
            "mamba2",
            "recurrent_gemma",
        )
    },
    **{
        t: (_ENC_DEC, _WHERE_ENC_DEC)
        for t in (
            "t5",
            "mt5",
            "bart",
            "mbart",
            "pegasus",
            "marian",
            "encoder-decoder",
            "whisper",
            "umt5",
            "longt5",
            "switch_transformers",
        )
    },
}
