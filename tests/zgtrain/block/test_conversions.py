"""zgtrain/block/conversions.py on a tiny random Llama block (pure tensor code, no project needed)."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig

from zgdata.errors import ZgError
from zgtrain.block.conversions import CONVERSIONS, convert
from zgtrain.project.config import TrainConfig

CONFIG = LlamaConfig(
    vocab_size=32,
    hidden_size=16,
    intermediate_size=24,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=32,
    initializer_range=0.1,
)


def _teacher_tensors(first_layer: int = 3, n: int = 3) -> dict[str, torch.Tensor]:
    """Slice-style tensors ``layers.{teacher index}.*`` of n random decoder layers."""
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer

    g = torch.Generator().manual_seed(0)
    out = {}
    for i in range(first_layer, first_layer + n):
        layer = LlamaDecoderLayer(CONFIG, layer_idx=0)
        for k, v in layer.state_dict().items():
            out[f"layers.{i}.{k}"] = torch.randn(v.shape, generator=g) * 0.2 + (1.0 if "norm" in k else 0.0)
    return out


def _sample(n=2, t=8):
    return torch.randn(n, t, CONFIG.hidden_size, generator=torch.Generator().manual_seed(1))


def test_registry_holds_the_documented_conversions():
    assert set(CONVERSIONS) == {
        "identity",
        "prune_mlp",
        "drop_layers",
        "reinit",
        "window_attention",
        "kv_heads",
        "attn_linear",
        "linear_attention",
        "prune_experts",
        "moe_to_dense",
    }
    with pytest.raises(ZgError, match="unknown conversion 'nope'"):
        convert("nope", {}, CONFIG, TrainConfig(), _sample(), torch.Generator())


def test_identity_copies_the_teacher_layers_in_order():
    tensors = _teacher_tensors()
    block = convert("identity", tensors, CONFIG, TrainConfig(conversion="identity"), _sample(), torch.Generator())
    w = block.weights()
    assert len(w) == len(tensors) and block.intermediate_sizes == [24, 24, 24]
    for k, v in w.items():
        _, j, rest = k.split(".", 2)
        assert torch.equal(v, tensors[f"layers.{3 + int(j)}.{rest}"]), k


def test_prune_mlp_keeps_the_most_active_channels():
    tensors = _teacher_tensors(n=1)
    cfg = TrainConfig(conversion="prune_mlp", prune_ratio=0.75)
    block = convert("prune_mlp", tensors, CONFIG, cfg, _sample(), torch.Generator())
    assert block.intermediate_sizes == [6]  # round(24 * 0.25)
    full = convert("identity", tensors, CONFIG, cfg, _sample(), torch.Generator())
    act = full.mlp_activations(_sample())[0].abs().double().mean(dim=(0, 1))
    keep = torch.sort(torch.sort(-act, stable=True).indices[:6]).values
    w = block.weights()
    assert torch.equal(w["layers.0.mlp.gate_proj.weight"], tensors["layers.3.mlp.gate_proj.weight"][keep])
    assert torch.equal(w["layers.0.mlp.up_proj.weight"], tensors["layers.3.mlp.up_proj.weight"][keep])
    assert torch.equal(w["layers.0.mlp.down_proj.weight"], tensors["layers.3.mlp.down_proj.weight"][:, keep])
    assert torch.equal(w["layers.0.self_attn.q_proj.weight"], tensors["layers.3.self_attn.q_proj.weight"])


def test_drop_layers_keeps_the_named_offsets_and_refuses_bad_ones():
    tensors = _teacher_tensors()
    block = convert("drop_layers", tensors, CONFIG, TrainConfig(keep_layers=[0, 2]), _sample(), torch.Generator())
    assert len(block.layers) == 2
    assert torch.equal(block.weights()["layers.1.mlp.up_proj.weight"], tensors["layers.5.mlp.up_proj.weight"])
    for bad in ([], [2, 0], [0, 3], [-1]):
        with pytest.raises(ZgError, match="train.keep_layers"):
            convert("drop_layers", tensors, CONFIG, TrainConfig(keep_layers=bad), _sample(), torch.Generator())


def test_reinit_draws_only_from_the_block_generator():
    tensors = _teacher_tensors()
    a = convert("reinit", tensors, CONFIG, TrainConfig(), _sample(), torch.Generator().manual_seed(5))
    torch.manual_seed(123)  # the global RNG must not matter
    b = convert("reinit", tensors, CONFIG, TrainConfig(), _sample(), torch.Generator().manual_seed(5))
    c = convert("reinit", tensors, CONFIG, TrainConfig(), _sample(), torch.Generator().manual_seed(6))
    wa, wb, wc = a.weights(), b.weights(), c.weights()
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    assert any(not torch.equal(wa[k], wc[k]) for k in wa if "layernorm" not in k)
    assert all(torch.equal(v, torch.ones_like(v)) for k, v in wa.items() if k.endswith("layernorm.weight"))
