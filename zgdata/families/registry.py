"""Model families: everything zg knows about a decoder-only architecture, one adapter per family.

Capture, slicing, student blocks, conversions, assembly and evaluation never name a family: they ask
the teacher's adapter (``family_of(config)``). An adapter knows
- the transformers classes (config, causal LM, decoder layer), imported lazily;
- where the decoder layers, the final norm and the head parts sit in the state dict;
- how to embed token ids (GPT-2 adds learned positions, Granite multiplies, Gemma scales), the per-forward
  layer inputs (rotary ``position_embeddings``; Gemma 3 one per attention type; Gemma 2's masks, as it runs
  eager attention) and how one layer is called, exactly as the model's own forward calls it (sdpa: no mask,
  causal), so a layer-by-layer run is bit-identical to the model's forward;
- what the causal LM does to its logits (Granite's scaling, Gemma's soft-capping: ``finish_logits``);
- where the MLP channels are (for pruning; Phi-3's fused gate_up) and how to write a config of another MLP
  width or depth (the student's), keeping each layer's attention type where layers differ (Gemma).
Boundary k means the same in every family: the residual entering layer k; the last one
is the last layer's output *before* the final norm.

Families: Llama, Qwen2 and GPT-2 (classes below), the dense decoders described as data in
zgdata/families/traits.py and run by ``DenseFamily`` (Mistral, Granite, OLMo 2, Phi-3, Gemma 2, Gemma 3 text), and
the mixture-of-experts decoders described there with a ``Moe`` entry and run by ``MoeFamily`` (Mixtral, Qwen2-MoE,
Qwen3-MoE, OLMoE: zgdata/families/moe.py).
Any other model type transformers builds as a causal LM gets a ``VerifiedFamily`` (zgdata/families/verified.py):
its parts found in the model itself, trusted once `zg teacher prepare`'s identity round trip holds bit for bit.
A student with per-layer shapes ships one pinned modeling file: GPT-2 its own, every other family the generic
dense one (``template``; zgtrain/student/template_source.py generates both). Other mixture-of-experts, hybrid
attention + SSM and encoder-decoder model types are refused with what they are and where support would go (``REFUSED``).

Adding a family: a Llama-like dense decoder is a ``Traits`` record in zgdata/families/traits.py (plus, only if
no trait covers what differs, a trait and its code in ``DenseFamily``); anything else subclasses ``Family``
(or ``RotaryFamily``), overrides what differs, joins ``FAMILIES`` and ships
``zgtrain/student/templates/modeling_zg_<model_type>.py``. Either way add its ``random:tiny-<model_type>``
source to the parametrization of tests/zgtrain/test_families.py (checklist: docs/tutorials/convert-your-model.md).
Changing what an existing adapter computes (``embed``, ``layer_inputs``, ``call_layer``) changes stored
boundaries: bump CAPTURE_VERSION in zgdata/capture_version.py with it.
"""

from __future__ import annotations

import torch

from zgdata.errors import ZgError
from zgdata.families.base import WHERE, Family, RotaryFamily, positions
from zgdata.families.dense import DenseFamily
from zgdata.families.moe import MoeFamily
from zgdata.families.traits import REFUSED, TRAITS
from zgdata.families.verified import VerifiedFamily, verifiable

__all__ = [
    "Family",
    "RotaryFamily",
    "DenseFamily",
    "MoeFamily",
    "VerifiedFamily",
    "FAMILIES",
    "family",
    "family_of",
    "config_from_dict",
    "supported",
    "known",
]


class Llama(RotaryFamily):
    model_type = "llama"
    template = "dense"  # per-layer widths: the one generic modeling file (earlier zg: modeling_zg_llama.py)
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
    template = "dense"  # per-layer widths: the one generic modeling file (earlier zg: modeling_zg_qwen2.py)
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

    def attention_name(self):
        return "attn"

    def width(self, config):
        return config.n_inner if config.n_inner is not None else 4 * config.hidden_size  # GPT2Block's default

    def embed(self, inner, ids):
        return inner.wte(ids) + inner.wpe(positions(ids))  # as GPT2Model.forward (its dropout is off in eval)

    def embed_head(self, head, ids):
        emb = torch.nn.functional.embedding
        return emb(ids, head["wte.weight"]) + emb(positions(ids), head["wpe.weight"])

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


FAMILIES: dict[str, Family] = {
    f.model_type: f for f in (Llama(), Qwen2(), GPT2(), *((MoeFamily if t.moe else DenseFamily)(t) for t in TRAITS))
}


def supported() -> str:
    return ", ".join(sorted(FAMILIES))


def family(model_type: str) -> Family:
    """The adapter of ``model_type``: its record, else (transformers builds it as a causal LM) a ``VerifiedFamily``
    whose parts are found once it is bound to a config; or a one-line error naming what it is and where to add one."""
    if model_type in REFUSED:
        what, where = REFUSED[model_type]
        raise ZgError(
            f"teacher architecture '{model_type}' is {what}; zg does not support it",
            key="teacher.source",
            fix=f"use a dense decoder-only model ({supported()}); support would go in {where}",
        )
    if model_type in FAMILIES:
        return FAMILIES[model_type]
    if verifiable(model_type):  # no record: parts found in the model, trusted once prepare's self-check passed
        return VerifiedFamily(model_type)
    raise ZgError(
        f"teacher architecture '{model_type}' is not supported: transformers builds no causal LM of it "
        f"(zg declares {supported()} and verifies any other decoder-only model transformers has)",
        key="teacher.source",
        fix=f"use a decoder-only model transformers can load, or add an adapter for '{model_type}' in {WHERE}",
    )


def known(model_type: str) -> bool:
    """Whether zg has an adapter for ``model_type``: a record, or one a self-check can verify (not refused)."""
    return model_type in FAMILIES or (model_type not in REFUSED and verifiable(model_type))


def family_of(config) -> Family:
    """The adapter of a transformers config (or a config dict), bound to it where the family reads config values."""
    model_type = config.get("model_type") if isinstance(config, dict) else config.model_type
    return family(str(model_type).removeprefix("zg_")).bind(config)  # zg's per-layer-width students are zg_<family>


def config_from_dict(d: dict):
    """A teacher config as recorded in slices and block metadata, in its family's config class."""
    return family_of(d).config_from_dict(d)
