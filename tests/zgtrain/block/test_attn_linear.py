"""The ``attn_linear`` conversion (zgtrain/block/attention.py): each layer's attention replaced by one linear map of
its normed input, fitted by least squares on the block's input sample. Pure tensors on tiny random teachers;
tests/zgtrain/block/test_attention_students.py trains and assembles one for real. Bitwise claims use torch.equal.
"""

from __future__ import annotations

import inspect
import json

import pytest
import torch

from tests.helpers.models import teacher_layers as _slice
from tests.helpers.models import tiny_family_teacher as _teacher
from zgdata.errors import ZgError
from zgdata.families.base import cache_arg
from zgdata.families.registry import FAMILIES, family, family_of
from zgtrain.block.attention import AttentionLinear, AttentionLinearState, attention_io, fit_linear
from zgtrain.block.conversions import convert
from zgtrain.block.kv_cache import kv_summary
from zgtrain.block.model import StudentBlock
from zgtrain.project.config import TrainConfig

SELF_ATTN = sorted(n for n in FAMILIES if n != "gpt2")


def _x(model, b: int = 4, t: int = 32, seed: int = 0) -> torch.Tensor:
    return torch.randn(b, t, model.config.hidden_size, generator=torch.Generator().manual_seed(seed))


def _mse(a, b) -> float:
    return float(((a - b) ** 2).mean())


@pytest.mark.parametrize("name", ["llama", "qwen2", "phi3", "gemma3_text"])
def test_least_squares_init_beats_zero_and_random_on_the_sample(name):
    """Layer 0's map is the least-squares fit of the teacher attention's output on its normed input (the residual is
    orthogonal to the inputs), so it beats dropping the attention (zero) and a random map; the rest of the layer,
    and the next layer's fit on the student's own running input, are what the conversion says."""
    model = _teacher(name)
    x = _x(model)
    tensors = _slice(model, name, (1, 2))
    teacher = convert("identity", tensors, model.config, TrainConfig(), x, torch.Generator()).eval()
    block = convert("attn_linear", tensors, model.config, TrainConfig(conversion="attn_linear"), x, torch.Generator())
    assert block.attention == ["linear", "linear"] and block.cache_heads() == [0, 0]
    assert all(isinstance(layer.self_attn, AttentionLinear) for layer in block.layers)
    fam = family(name)
    with torch.no_grad():
        inputs = fam.layer_inputs(teacher.rotary_emb, x)
        a_in, a_out, _ = attention_io(fam, teacher.layers[0], x, inputs)
        lin = block.layers[0].self_attn.linear
        fitted = lin(a_in)
        w, b = fit_linear(a_in, a_out)
        assert torch.equal(lin.weight, w) and torch.equal(lin.bias, b)
        # normal equations: the residual is orthogonal to every input channel and sums to 0 (the bias)
        r = (fitted - a_out).reshape(-1, a_out.shape[-1]).double()
        xs = a_in.reshape(-1, a_in.shape[-1]).double()
        assert (xs.T @ r).abs().max() < 1e-3 * (xs.T @ a_out.reshape(-1, a_out.shape[-1]).double()).abs().max()
        g = torch.Generator().manual_seed(1)
        rand = a_in @ (torch.randn(w.shape, generator=g) * model.config.initializer_range).T
        assert _mse(fitted, a_out) < _mse(torch.zeros_like(a_out), a_out)
        assert _mse(fitted, a_out) < _mse(rand, a_out)
        # layer 1 is fitted on the student's layer-0 output, not the teacher's
        h1 = fam.call_layer(block.layers[0], x, inputs)
        a_in1, a_out1, _ = attention_io(fam, teacher.layers[1], h1, inputs)
        w1, b1 = fit_linear(a_in1, a_out1)
        assert torch.equal(block.layers[1].self_attn.linear.weight, w1)
        assert torch.equal(block.layers[1].self_attn.linear.bias, b1)
    for k, v in block.weights().items():  # everything but the attention is the teacher's
        if ".self_attn." not in k:
            assert torch.equal(v, tensors[f"layers.{1 + int(k.split('.')[1])}.{k.split('.', 2)[2]}"]), k


def test_a_linear_block_mixes_no_tokens():
    model = _teacher("llama")
    x = _x(model, b=1, t=10)
    block = convert("attn_linear", _slice(model, "llama", (0, 1)), model.config, TrainConfig(), _x(model), None)
    with torch.no_grad():
        full = block(x)
        for t in (0, 4, 9):
            torch.testing.assert_close(block(x[:, t : t + 1])[0, 0], full[0, t], rtol=1e-5, atol=1e-6)
        y = x.clone()
        y[:, :5] = torch.randn(1, 5, x.shape[-1])  # earlier tokens change: later outputs do not
        assert torch.equal(block(y)[:, 5:], full[:, 5:])


def test_attn_linear_refusals_and_kv_bytes():
    gpt2 = _teacher("gpt2")
    with pytest.raises(ZgError, match="attn_linear") as e:
        convert("attn_linear", _slice(gpt2, "gpt2", (0,)), gpt2.config, TrainConfig(), _x(gpt2), None)
    assert "\n" not in str(e.value)
    with pytest.raises(ValueError, match="attention kind"):
        StudentBlock(_teacher("llama").config, [128], attention=["conv"])
    # a linear layer caches nothing: 2 linear + 2 full layers of 2 KV heads x 16 dims x float32 = half the teacher
    config = _teacher("llama").config.to_dict()
    s = kv_summary(config, [None] * 4, kv_heads=[0, None, 0, None])
    assert s["kv_bytes_per_token"] == 2 * (2 * 2 * 16 * 4) and s["kv_ratio"] == 0.5
    assert kv_summary(config, [None] * 2, 2, [0, 0])["kv_bytes_per_token"] == 0


def test_attention_linear_copies_in_the_modeling_files_are_verbatim():
    from zgtrain.student.load import template_class

    for cls in (AttentionLinearState, AttentionLinear):
        ours = inspect.getsource(cls)
        for name in SELF_ATTN:
            module = inspect.getmodule(template_class(name, "AutoConfig"))
            assert inspect.getsource(getattr(module, cls.__name__)) == ours, (name, cls.__name__)


@pytest.mark.parametrize("name", ["llama", "qwen2", "olmo2", "gemma3_text"])  # the 3 templates; per-type inputs
def test_modeling_file_with_linear_layers_equals_the_blocks_and_caches_nothing_there(name, tmp_path):
    """zg's modeling file with layer_attention [full, linear, linear, full], saved and reloaded with from_pretrained:
    logits equal (bitwise) to the block-wise forward, KV-cached greedy generation equals the uncached one and follows
    the full forward, and the cache holds zero heads for the linear layers."""
    from transformers import AutoModelForCausalLM, DynamicCache

    from zgtrain.student.load import ship_modeling_code, template_class

    teacher = _teacher(name)
    fam = family(name)
    kinds = ["full", "linear", "linear", "full"]
    width = fam.width(teacher.config)
    fields = {k: v for k, v in teacher.config.to_dict().items() if k not in ("model_type", "architectures")}
    config = template_class(name, "AutoConfig")(intermediate_sizes=[width] * 4, layer_attention=kinds, **fields)
    model = template_class(name, "AutoModelForCausalLM")(config)
    layers, head = fam.split_state(teacher.state_dict())
    g = torch.Generator().manual_seed(2)
    for i, kind in enumerate(kinds):  # a linear layer: the teacher's layer less its attention, a random map
        if kind == "linear":
            layers[i] = {k: v for k, v in layers[i].items() if not k.startswith("self_attn.")}
            h = teacher.config.hidden_size
            layers[i]["self_attn.linear.weight"] = torch.randn(h, h, generator=g) * 0.1
            layers[i]["self_attn.linear.bias"] = torch.randn(h, generator=g) * 0.1
    state = {fam.head_key(k): v for k, v in head.items()}
    state.update({fam.layer_key(i, k): v for i in range(4) for k, v in layers[i].items()})
    missing, unexpected = model.load_state_dict(state, strict=False)
    assert not unexpected and all("rotary" in m or "lm_head" in m for m in missing)
    model.tie_weights()
    model.save_pretrained(tmp_path)
    ship_modeling_code(tmp_path, name)
    assert json.loads((tmp_path / "config.json").read_text())["layer_attention"] == kinds
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path, trust_remote_code=True, dtype=torch.float32).eval()
    ids = torch.randint(0, teacher.config.vocab_size, (2, 16), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        h = fam.embed(fam.inner(loaded), ids)
        for lo in (0, 2):
            types = fam.layer_types(teacher.config, [lo, lo + 1])
            attention = [None if k == "full" else k for k in kinds[lo : lo + 2]]
            block = StudentBlock(teacher.config, [width] * 2, None, types, None, attention).eval()
            block.load_state_dict(
                {f"layers.{j}.{k}": v for j in (0, 1) for k, v in layers[lo + j].items()}, strict=False
            )
            h = block(h)
        blockwise = family_of(teacher.config).finish_logits(loaded.lm_head(fam.final_norm(loaded)(h)))
        assert torch.equal(loaded(input_ids=ids).logits, blockwise)

        cache = DynamicCache(config=loaded.config)
        loaded(input_ids=ids[:1, :6], **{cache_arg(): cache}, use_cache=True)
        assert [cache.layers[i].keys.shape[1] for i in range(4)] == [2, 0, 0, 2]  # KV heads cached per layer
        assert cache.get_seq_length() == 6

    prompt = ids[:1, :6]
    greedy = dict(max_new_tokens=8, min_new_tokens=8, do_sample=False)
    out = loaded.generate(prompt, **greedy, output_logits=True, return_dict_in_generate=True)
    seq = out.sequences
    assert torch.equal(loaded.generate(prompt, **greedy, use_cache=False), seq)
    with torch.no_grad():
        full = loaded(input_ids=seq).logits[0]
    for step, step_logits in enumerate(out.logits):
        torch.testing.assert_close(step_logits[0], full[5 + step], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(
    "name,kinds",
    [
        ("llama", ["linear", "full", "linear", "full"]),  # layer 0 linear: transformers reads lengths from it
        ("llama", ["full", "linear", "full", "linear"]),
        ("qwen2", ["linear", "linear", "full", "full"]),
        ("gemma3_text", ["linear", "full", "linear", "full"]),  # the dense template; sliding and full layer types
    ],
)
def test_a_cache_driven_by_hand_counts_the_positions_of_linear_layers_in_float64(name, kinds):
    """zg's modeling file with linear layers (layer 0 among them or not) in float64, fed one token at a time through
    a cache with no cache_position or position_ids passed: the cache's sequence length is the number of tokens fed
    (read from the first layer, linear or not), so each position's logits equal the full forward's within 1e-10,
    and the linear layers still hold 0 bytes."""
    from transformers import DynamicCache

    from zgtrain.student.load import template_class

    teacher = _teacher(name)
    fam = family(name)
    fields = {k: v for k, v in teacher.config.to_dict().items() if k not in ("model_type", "architectures")}
    config = template_class(name, "AutoConfig")(
        intermediate_sizes=[fam.width(teacher.config)] * 4, layer_attention=kinds, **fields
    )
    torch.manual_seed(0)
    model = template_class(name, "AutoModelForCausalLM")(config)
    model = model.double().eval()
    ids = torch.randint(0, teacher.config.vocab_size, (2, 9), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        full = model(input_ids=ids).logits
        cache = DynamicCache(config=model.config)
        worst, lengths = 0.0, []
        for i in range(ids.shape[1]):
            logits = model(input_ids=ids[:, i : i + 1], **{cache_arg(): cache}, use_cache=True).logits[:, 0]
            worst = max(worst, float((logits - full[:, i]).abs().max()))
            lengths.append([cache.get_seq_length()] + [cache.get_seq_length(j) for j in range(4)])
        chunked = DynamicCache(config=model.config)  # a prompt of 5, then 4 tokens at once
        step = [
            model(input_ids=ids[:, a:b], **{cache_arg(): chunked}, use_cache=True).logits for a, b in ((0, 5), (5, 9))
        ]
        worst_chunked = float((torch.cat(step, 1) - full).abs().max())
    assert worst < 1e-10 and worst_chunked < 1e-10, (worst, worst_chunked)
    assert lengths == [[i + 1] * 5 for i in range(ids.shape[1])]
    assert chunked.get_seq_length() == ids.shape[1]
    assert [cache.layers[j].keys.numel() == 0 for j in range(4)] == [k == "linear" for k in kinds]
