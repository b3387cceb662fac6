"""The ``kv_heads`` conversion (zgtrain/block/attention.py): its init, its refusals, the KV-cache figure, zg's
modeling files with per-layer KV heads and the stock config of a uniform one. Pure tensors on the tiny random
teachers of every family; tests/zgtrain/block/test_attention_students.py trains and assembles for real.
Bitwise claims use torch.equal.
"""

from __future__ import annotations

import json

import pytest
import torch

from tests.helpers.models import teacher_layers as _slice
from tests.helpers.models import tiny_family_teacher as _teacher
from zgdata.errors import ZgError
from zgdata.families.registry import FAMILIES, family, family_of
from zgtrain.block.conversions import convert
from zgtrain.block.kv_cache import kv_bytes_per_token, kv_summary
from zgtrain.block.model import StudentBlock
from zgtrain.project.config import TrainConfig

GQA = sorted(n for n in FAMILIES if n != "gpt2")  # GPT-2 has no grouped-query attention in transformers


def _x(model, t: int = 12) -> torch.Tensor:
    return torch.randn(2, t, model.config.hidden_size, generator=torch.Generator().manual_seed(0))


def _kv(model, name, layers, n, x):
    cfg = TrainConfig(conversion="kv_heads", kv_heads=n)
    return convert("kv_heads", _slice(model, name, layers), model.config, cfg, x, torch.Generator()).eval()


def _mean(x: torch.Tensor, n: int, hd: int) -> torch.Tensor:
    """The rows of ``x`` (head-major, hd each) as n heads, each the mean of a contiguous group: the claim."""
    size = x.shape[0] // hd // n  # old heads per new head
    heads = [x[h * hd : (h + 1) * hd] for h in range(x.shape[0] // hd)]
    return torch.cat([torch.stack(heads[g * size : (g + 1) * size]).mean(0) for g in range(n)])


@pytest.mark.parametrize("name", GQA)
def test_kv_heads_at_the_teachers_count_is_the_teacher_block_bit_for_bit(name):
    model = _teacher(name)
    x = _x(model)
    tensors = _slice(model, name, (1, 2))
    teacher = convert("identity", tensors, model.config, TrainConfig(), x, torch.Generator()).eval()
    block = _kv(model, name, (1, 2), model.config.num_key_value_heads, x)
    assert block.kv_heads == [2, 2]
    for k, v in block.weights().items():
        assert torch.equal(v, tensors[f"layers.{1 + int(k.split('.')[1])}.{k.split('.', 2)[2]}"]), k
    with torch.no_grad():
        assert torch.equal(block(x), teacher(x))


@pytest.mark.parametrize("name", GQA)
def test_each_new_kv_head_is_the_mean_of_its_group(name):
    """The default (half of the tiny teachers' 2) is 1 head: the mean of both, in keys, values, Qwen2's biases,
    OLMo 2's whole-projection k_norm and Phi-3's fused qkv rows; queries, outputs and MLPs stay the teacher's."""
    model = _teacher(name)
    x = _x(model)
    tensors = _slice(model, name, (1,))
    block = convert("kv_heads", tensors, model.config, TrainConfig(conversion="kv_heads"), x, torch.Generator())
    assert block.kv_heads == [1]
    heads, kv = model.config.num_attention_heads, model.config.num_key_value_heads
    hd = getattr(model.config, "head_dim", None) or model.config.hidden_size // heads
    attn = block.layers[0].self_attn
    assert attn.config.num_key_value_heads == 1 and attn.num_key_value_groups == heads
    grouped = 0
    for k, v in block.weights().items():
        t = tensors[f"layers.1.{k.split('.', 2)[2]}"]
        part = k.split(".")[3] if k.split(".")[2] == "self_attn" else None
        if part in ("k_proj", "v_proj") or (part == "k_norm" and t.shape[0] == kv * hd):
            assert torch.equal(v, _mean(t, 1, hd)), k
            grouped += 1
        elif part == "qkv_proj":
            q, kk, vv = t.split([heads * hd, kv * hd, kv * hd])
            assert torch.equal(v, torch.cat([q, _mean(kk, 1, hd), _mean(vv, 1, hd)])), k
            grouped += 1
        else:
            assert torch.equal(v, t), k
    assert grouped >= 1
    assert ("layers.0.self_attn.k_proj.bias" in block.weights()) == (name in ("qwen2", "qwen2_moe"))


def test_contiguous_groups_of_four_heads_into_two():
    """8 KV heads into 2 (a Llama of 8 query heads): new head 0 = mean of old 0..3, head 1 = mean of old 4..7."""
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer

    config = LlamaConfig(
        vocab_size=32, hidden_size=32, intermediate_size=16, num_hidden_layers=1, num_attention_heads=8,
        num_key_value_heads=8, max_position_embeddings=64,
    )  # fmt: skip
    g = torch.Generator().manual_seed(0)
    layer = LlamaDecoderLayer(config, 0).state_dict()
    tensors = {f"layers.0.{k}": torch.randn(v.shape, generator=g) for k, v in layer.items()}
    block = convert("kv_heads", tensors, config, TrainConfig(kv_heads=2), torch.zeros(1, 4, 32), g)
    k = tensors["layers.0.self_attn.k_proj.weight"].reshape(8, 4, 32)
    want = torch.cat([k[0:4].mean(0), k[4:8].mean(0)])
    assert torch.equal(block.weights()["layers.0.self_attn.k_proj.weight"], want)
    assert torch.equal(want, _mean(tensors["layers.0.self_attn.k_proj.weight"], 2, 4))


def test_bad_kv_heads_and_gpt2_are_one_line_errors():
    model = _teacher("llama")  # 4 query heads, 2 KV heads
    x = _x(model)
    for bad in (3, 4, 8):
        with pytest.raises(ZgError, match=r"train\.kv_heads is") as e:
            _kv(model, "llama", (0,), bad, x)
        assert "\n" not in str(e.value) and "use one of 1, 2" in str(e.value)
    for bad in (-1, "two", 1.5):
        with pytest.raises(ZgError, match=r"train\.kv_heads"):
            TrainConfig(kv_heads=bad)
    gpt2 = _teacher("gpt2")
    with pytest.raises(ZgError, match="GPT-2") as e:
        _kv(gpt2, "gpt2", (0,), 0, _x(gpt2))
    assert "\n" not in str(e.value)


def test_kv_bytes_per_token_with_per_layer_heads_by_hand():
    # one cached position of one head: key + value, 8 dims x 2 bytes each = 2 * 8 * 2 = 32 bytes
    g = dict(head_dim=8, dtype_bytes=2)
    assert kv_bytes_per_token([None] * 4, context=128, kv_heads=[2, 2, 2, 2], **g) == 4 * 2 * 32  # 256, as before
    # heads 2, 1, 4, 1 at full attention: (2 + 1 + 4 + 1) heads * 32 bytes = 256
    assert kv_bytes_per_token([None] * 4, context=128, kv_heads=[2, 1, 4, 1], **g) == 256
    # with windows 64 and 16 at context 128: (128*2 + 64*1 + 128*4 + 16*1) * 32 / 128 = 848 * 32 / 128 = 212
    assert kv_bytes_per_token([None, 64, None, 16], context=128, kv_heads=[2, 1, 4, 1], **g) == 212
    with pytest.raises(ValueError):
        kv_bytes_per_token([None], context=128, kv_heads=[1, 1], **g)
    config = _teacher("llama").config.to_dict()  # 2 KV heads of 16 dims, float32, context 512
    s = kv_summary(config, [None, 256, None, None], kv_heads=[1, 1, None, 2])
    assert s["teacher_kv_bytes_per_token"] == 4 * (2 * 2 * 16 * 4)  # 4 layers x 256 bytes
    assert s["kv_bytes_per_token"] == 2 * 16 * 4 * (512 * 1 + 256 * 1 + 512 * 2 + 512 * 2) / 512  # 128 * 5.5 = 704
    assert s["kv_bytes_per_token"] == 704 and s["kv_ratio"] == 704 / 1024


def _blockwise(name, teacher, model, ids, kv_heads):
    """Logits of embed -> two StudentBlocks (teacher layers, KV heads grouped as the student's) -> norm -> head."""
    from zgtrain.block.attention import group_kv_heads

    fam = family(name)
    width = fam.width(teacher.config)
    layers, _ = fam.split_state(teacher.state_dict())
    with torch.no_grad():
        h = fam.embed(fam.inner(model), ids)
        for lo in (0, 2):
            types = fam.layer_types(teacher.config, [lo, lo + 1])
            block = StudentBlock(teacher.config, [width] * 2, None, types, kv_heads[lo : lo + 2]).eval()
            state = {
                f"layers.{j}.{k}": v
                for j in (0, 1)
                for k, v in group_kv_heads(layers[lo + j], teacher.config, kv_heads[lo + j]).items()
            }
            block.load_state_dict(state, strict=False)
            h = block(h)
        return family_of(teacher.config).finish_logits(model.lm_head(fam.final_norm(model)(h)))


def _cached_generation_equals_full_forward(model, ids):
    prompt = ids[:1, :6]
    greedy = dict(max_new_tokens=8, min_new_tokens=8, do_sample=False)
    out = model.generate(prompt, **greedy, output_logits=True, return_dict_in_generate=True)
    seq = out.sequences
    assert seq.shape == (1, 14) and torch.equal(seq[:, :6], prompt)
    assert torch.equal(model.generate(prompt, **greedy, use_cache=False), seq)  # the same greedy tokens uncached
    with torch.no_grad():
        full = model(input_ids=seq).logits[0]
    for step, step_logits in enumerate(out.logits):  # step s predicts token 6 + s
        torch.testing.assert_close(step_logits[0], full[5 + step], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("name", ["llama", "qwen2", "phi3", "gemma3_text"])  # the 3 templates; fused qkv; layer types
def test_modeling_file_with_per_layer_kv_heads_equals_the_blocks(name, tmp_path):
    """zg's modeling file of each family with layer_kv_heads [2, 1, 1, 2], saved and reloaded with from_pretrained:
    logits equal (bitwise) to the block-wise forward, and KV-cached greedy generation follows the full forward."""
    from transformers import AutoModelForCausalLM

    from zgtrain.block.attention import group_kv_heads
    from zgtrain.student.load import ship_modeling_code, template_class

    teacher = _teacher(name)
    fam = family(name)
    kv = [2, 1, 1, 2]
    width = fam.width(teacher.config)
    fields = {k: v for k, v in teacher.config.to_dict().items() if k not in ("model_type", "architectures")}
    config = template_class(name, "AutoConfig")(intermediate_sizes=[width] * 4, layer_kv_heads=kv, **fields)
    model = template_class(name, "AutoModelForCausalLM")(config)
    layers, head = fam.split_state(teacher.state_dict())
    state = {fam.head_key(k): v for k, v in head.items()}
    for i in range(4):
        state.update({fam.layer_key(i, k): v for k, v in group_kv_heads(layers[i], teacher.config, kv[i]).items()})
    missing, unexpected = model.load_state_dict(state, strict=False)
    assert not unexpected and all("rotary" in m or "lm_head" in m for m in missing)
    model.tie_weights()
    model.save_pretrained(tmp_path)
    ship_modeling_code(tmp_path, name)
    assert json.loads((tmp_path / "config.json").read_text())["layer_kv_heads"] == kv
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path, trust_remote_code=True, dtype=torch.float32).eval()
    assert [layer.self_attn.config.num_key_value_heads for layer in loaded.model.layers] == kv
    ids = torch.randint(0, teacher.config.vocab_size, (2, 16), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        assert torch.equal(loaded(input_ids=ids).logits, _blockwise(name, teacher, loaded, ids, kv))
    _cached_generation_equals_full_forward(loaded, ids)


@pytest.mark.parametrize("name", ["llama", "olmo2"])
def test_a_uniform_kv_heads_student_is_the_stock_class(name, tmp_path):
    """Every layer at 1 KV head: the family's own config (num_key_value_heads 1) and class, loaded without
    trust_remote_code, equal to the blocks bitwise; cached generation follows the full forward."""
    from transformers import AutoModelForCausalLM

    from zgtrain.block.attention import group_kv_heads
    from zgtrain.student.assemble import needs_modeling_code, student_model

    teacher = _teacher(name)
    fam = family(name)
    kv = [1] * 4
    width = fam.width(teacher.config)
    assert not needs_modeling_code([width] * 4, [None] * 4, kv) and needs_modeling_code([width] * 4, [None] * 4, [1, 2])
    layers, head = fam.split_state(teacher.state_dict())
    state = {fam.head_key(k): v for k, v in head.items()}
    for i in range(4):
        state.update({fam.layer_key(i, k): v for k, v in group_kv_heads(layers[i], teacher.config, 1).items()})
    types = fam.layer_types(teacher.config, list(range(4)))
    model = student_model(teacher.config.to_dict(), state, [width] * 4, [None] * 4, types, kv, dtype=torch.float32)
    assert type(model) is fam.causal_lm() and model.config.num_key_value_heads == 1
    model.save_pretrained(tmp_path)
    assert "auto_map" not in json.loads((tmp_path / "config.json").read_text())
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path, trust_remote_code=False, dtype=torch.float32).eval()
    ids = torch.randint(0, teacher.config.vocab_size, (2, 16), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        assert torch.equal(loaded(input_ids=ids).logits, _blockwise(name, teacher, loaded, ids, kv))
    _cached_generation_equals_full_forward(loaded, ids)
