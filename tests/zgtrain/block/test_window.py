"""Sliding-window attention: the ``window_attention`` conversion, the windowed layers of zg's
shipped modeling files, and the KV-cache figure. Pure tensors on tiny random teachers of every family (no
project) except the last test, which trains, assembles and loads a heterogeneous Llama student for real.
Bitwise claims use torch.equal.
"""

from __future__ import annotations

import inspect
import json

import lance
import numpy as np
import pytest
import torch

from tests.helpers.models import teacher_layers as _slice
from tests.helpers.models import tiny_family_teacher as _teacher
from tests.helpers.projects import copy_project, project_of, read_json
from zgdata.errors import ZgError
from zgdata.families.registry import FAMILIES, family, family_of
from zgdata.layout import Layout
from zgtrain.block.conversions import convert
from zgtrain.block.kv_cache import kv_bytes_per_token, kv_geometry, kv_summary
from zgtrain.block.window import SlidingWindow, attention_of
from zgtrain.project.config import TrainConfig

NAMES = sorted(FAMILIES)


def _x(model, t: int = 12) -> torch.Tensor:
    return torch.randn(2, t, model.config.hidden_size, generator=torch.Generator().manual_seed(0))


def _block(name, model, layers, window, x):
    cfg = TrainConfig(conversion="window_attention", window=window)
    return convert("window_attention", _slice(model, name, layers), model.config, cfg, x, torch.Generator()).eval()


@pytest.mark.parametrize("name", NAMES)
def test_a_window_at_least_the_sequence_is_the_teacher_block_bit_for_bit(name):
    model = _teacher(name)
    x = _x(model)
    tensors = _slice(model, name, (1, 2))
    teacher = convert("identity", tensors, model.config, TrainConfig(), x, torch.Generator()).eval()
    with torch.no_grad():
        want = teacher(x)
        for w in (x.shape[1], x.shape[1] + 1, 4096):
            block = _block(name, model, (1, 2), w, x)
            assert block.windows == [w, w] and block.intermediate_sizes == teacher.intermediate_sizes
            assert all(
                torch.equal(v, tensors[f"layers.{1 + int(k.split('.')[1])}.{k.split('.', 2)[2]}"])
                for k, v in block.weights().items()
            )  # the whole block copied: only attention is restricted
            assert torch.equal(block(x), want), w
        assert not torch.equal(_block(name, model, (1, 2), x.shape[1] - 1, x)(x), want)


def _with_causal_mask(block, x: torch.Tensor) -> torch.Tensor:
    """``block(x)`` with each sdpa attention given the causal mask as a mask where it gets none, as a windowed
    layer's attention is (eager attention gets its causal mask from transformers already)."""
    t = x.shape[1]

    def hook(module, args, kwargs):
        if kwargs.get("attention_mask") is not None or module.config._attn_implementation != "sdpa":
            return None
        return args, {**kwargs, "attention_mask": torch.ones(t, t, dtype=torch.bool).tril()[None, None]}

    handles = [attention_of(layer).register_forward_pre_hook(hook, with_kwargs=True) for layer in block.layers]
    try:
        return block(x)
    finally:
        for h in handles:
            h.remove()


@pytest.mark.parametrize("name", NAMES)
def test_a_windowed_layer_sees_exactly_its_last_w_tokens(name):
    """One layer, window 4: position t's output is the teacher layer's output for position t run on tokens t-3..t
    alone (equal up to float rounding: rotary attention depends on relative positions only, GPT-2's positions are
    in its input already). Positions before the window fills see their whole prefix: bit for bit the unwindowed
    layer's output given the causal mask."""
    model = _teacher(name)
    x = _x(model, 10)
    w = 4
    teacher = convert("identity", _slice(model, name, (1,)), model.config, TrainConfig(), x, torch.Generator()).eval()
    with torch.no_grad():
        got = _block(name, model, (1,), w, x)(x)
        # Before the window fills, the band is the causal mask: the output equals, bit for bit, the unwindowed layer's
        # on the same tokens given the causal mask as a mask. (Given none, sdpa runs is_causal, another kernel path:
        # equal bits on torch 2.11 and 2.13, the last bit apart on 2.6.)
        assert torch.equal(got[:, :w], _with_causal_mask(teacher, x)[:, :w])
        for t in range(w, x.shape[1]):
            alone = teacher(x[:, t - w + 1 : t + 1])[:, -1]
            torch.testing.assert_close(got[:, t], alone, rtol=1e-4, atol=1e-5)
            assert not torch.allclose(got[:, t], teacher(x[:, : t + 1])[:, -1], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("name", NAMES)
def test_shipped_modeling_file_runs_the_same_window_as_the_student_blocks(name, tmp_path):
    """zg's modeling file of each family, saved and reloaded with from_pretrained, gives logits equal (bitwise) to
    the block-wise forward (embed, StudentBlocks, final norm, head), and its KV-cached generation follows the
    window: each generated step's logits match a fresh full forward over the sequence so far."""
    from transformers import AutoModelForCausalLM

    from zgtrain.block.model import StudentBlock
    from zgtrain.student.load import ship_modeling_code, template_class

    teacher = _teacher(name)
    fam = family(name)
    windows = [None, 5, 3, None]
    width = fam.width(teacher.config)
    fields = {k: v for k, v in teacher.config.to_dict().items() if k not in ("model_type", "architectures")}
    config = template_class(name, "AutoConfig")(intermediate_sizes=[width] * 4, layer_windows=windows, **fields)
    model = template_class(name, "AutoModelForCausalLM")(config)
    model.load_state_dict(teacher.state_dict())
    model.save_pretrained(tmp_path)
    ship_modeling_code(tmp_path, name)
    loaded = AutoModelForCausalLM.from_pretrained(
        tmp_path,
        trust_remote_code=True,
        dtype=torch.float32,
        **fam.load_kwargs(),  # MoE: zg's padded experts
    ).eval()
    assert type(loaded).__name__ == f"Zg{fam.model_class}" and loaded.config.layer_windows == windows
    assert json.loads((tmp_path / "config.json").read_text())["layer_windows"] == windows

    ids = torch.randint(0, teacher.config.vocab_size, (2, 16), generator=torch.Generator().manual_seed(3))
    layers, _ = fam.split_state(teacher.state_dict())
    with torch.no_grad():
        h = fam.embed(fam.inner(loaded), ids)
        for lo in (0, 2):
            types = fam.layer_types(teacher.config, [lo, lo + 1])  # Gemma 3: each layer's teacher type
            block = StudentBlock(teacher.config, [width] * 2, windows[lo : lo + 2], types).eval()
            block.load_state_dict(
                {f"layers.{j}.{k}": v for j in (0, 1) for k, v in layers[lo + j].items()}, strict=False
            )
            h = block(h)
        blockwise = family_of(teacher.config).finish_logits(loaded.lm_head(fam.final_norm(loaded)(h)))  # Granite scales
        logits = loaded(input_ids=ids).logits
        assert torch.equal(logits, blockwise)
        assert not torch.allclose(logits, teacher(input_ids=ids).logits, rtol=1e-4, atol=1e-4)  # windows matter
        # eager attention (additive float masks) and a left-padded batch (the window merged into a 4-D padding mask)
        eager = AutoModelForCausalLM.from_pretrained(
            tmp_path, trust_remote_code=True, dtype=torch.float32, attn_implementation="eager"
        ).eval()
        torch.testing.assert_close(eager(input_ids=ids).logits, logits, rtol=1e-4, atol=1e-4)
        pad = torch.cat([torch.zeros(2, 3, dtype=torch.long), ids], 1)
        attn = torch.cat([torch.tensor([[0, 0, 0], [1, 1, 1]]), torch.ones(2, 16, dtype=torch.long)], 1)
        pos = (attn.cumsum(1) - 1).clamp(min=0)
        padded = loaded(input_ids=pad, attention_mask=attn, position_ids=pos).logits
        torch.testing.assert_close(padded[0, 3:], logits[0], rtol=1e-4, atol=1e-4)

        prompt = ids[:1, :6]
        out = loaded.generate(
            prompt,
            max_new_tokens=8,
            min_new_tokens=8,
            do_sample=False,
            output_logits=True,
            return_dict_in_generate=True,
        )
        seq = out.sequences
        assert seq.shape == (1, 14) and torch.equal(seq[:, :6], prompt)
        full = loaded(input_ids=seq).logits[0]  # (14, V) without a cache
        for step, step_logits in enumerate(out.logits):  # step s predicts token 6 + s
            torch.testing.assert_close(step_logits[0], full[5 + step], rtol=1e-4, atol=1e-4)


def test_window_copies_in_the_modeling_files_are_verbatim():
    from zgtrain.student.load import template_class

    ours = inspect.getsource(SlidingWindow)
    for name in NAMES:
        module = inspect.getmodule(template_class(name, "AutoConfig"))
        assert inspect.getsource(module.SlidingWindow) == ours, name


def test_train_window_is_validated():
    assert TrainConfig().window == 128
    for bad in (0, -3, "ten", 2.5):
        with pytest.raises(ZgError, match="train.window"):
            TrainConfig(window=bad)


def test_kv_bytes_per_token_by_hand():
    # one cached position of one layer: key + value, 2 heads x 8 dims x 2 bytes each = 2 * 2 * 8 * 2 = 64 bytes
    g = dict(kv_heads=2, head_dim=8, dtype_bytes=2)
    assert kv_bytes_per_token([None] * 4, context=128, **g) == 4 * 64  # 256: full attention
    # windows 64 and 16 at context 128: (128 + 64 + 128 + 16) positions * 64 bytes / 128 tokens = 168
    assert kv_bytes_per_token([None, 64, None, 16], context=128, **g) == 168
    assert kv_bytes_per_token([None, 64, None, 16], context=32, **g) == (32 + 32 + 32 + 16) * 64 / 32  # 224
    assert kv_bytes_per_token([1000], context=128, **g) == 64  # window >= context
    assert kv_bytes_per_token([], context=128, **g) == 0
    with pytest.raises(ValueError):
        kv_bytes_per_token([None], context=0, **g)


@pytest.mark.parametrize("name", NAMES)
def test_kv_geometry_of_each_family(name):
    config = _teacher(name).config.to_dict()
    g = kv_geometry(config)
    kv_heads = 2 if name != "gpt2" else 4  # tiny configs: 4 heads, Llama/Qwen2 GQA 2
    assert g == {"context": 512, "kv_heads": kv_heads, "head_dim": 16, "dtype_bytes": 4}
    s = kv_summary(config, [None, 256, 512, 64])
    per_layer = 2 * kv_heads * 16 * 4
    assert s["kv_context"] == 512 and s["teacher_kv_bytes_per_token"] == 4 * per_layer
    assert s["kv_bytes_per_token"] == per_layer * (512 + 256 + 512 + 64) / 512
    assert kv_summary({**config, "dtype": "bfloat16"}, [None])["kv_bytes_per_token"] == per_layer / 2


def test_heterogeneous_student_loads_generates_and_equals_its_blocks(tiny_built, tmp_path):
    """The tiny Llama project re-partitioned into three blocks (materialized for real): b00 windowed (window 16 of
    64 tokens), b01 identity, b02 prune_mlp; trained, assembled, loaded through zg's pinned modeling file with
    from_pretrained, generating; its logits equal the block-wise forward of the trained blocks bit for bit, and the
    block metrics, zerograph.json and eval.json report KV-cache bytes per token next to parameters."""
    import yaml

    from zgdata.materialize.driver import materialize
    from zgdata.teacher.prepare import prepare
    from zgdata.tokens.store import read_tokens
    from zgtrain.block.load import load_block
    from zgtrain.block.train import train_block
    from zgtrain.evaluate.run import evaluate
    from zgtrain.student.assemble import assemble
    from zgtrain.student.load import load_student, modeling_file, template_sha256

    root = copy_project(tiny_built, tmp_path / "proj")
    layout = Layout(root)
    params = yaml.safe_load((root / "params.yaml").read_text())
    params["partition"]["boundaries"] = [0, 1, 2, 4]
    params["blocks"] = {
        "b00": {"in": "h00", "out": "h01", "conversion": "window_attention", "window": 16},
        "b01": {"in": "h01", "out": "h02", "conversion": "identity", "steps": 0},
        "b02": {"in": "h02", "out": "h04", "conversion": "prune_mlp", "prune_ratio": 0.5},
    }
    params["train"]["steps"] = 2
    params["eval"].update(heldout_seqs=2, context_targets=8)  # small: the CE figures are not the point
    (root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    project = project_of(root)
    prepare(project.teacher, project.partition, layout=layout)
    materialize(project.materialize, project.partition, layout=layout)
    metrics = {k: train_block(project, k, restart=True, layout=layout).metrics() for k in ("b00", "b01", "b02")}
    assert all(m["status"] == "done" for m in metrics.values())
    # block metrics: one layer windowed to 16 of the teacher's 512-position context caches 16/512 of it
    assert metrics["b00"]["kv_context"] == 512 and metrics["b00"]["kv_ratio"] == 16 / 512
    assert metrics["b00"]["param_ratio"] == 1.0
    assert metrics["b01"]["kv_ratio"] == metrics["b02"]["kv_ratio"] == 1.0 and metrics["b02"]["param_ratio"] < 1
    per_layer = metrics["b01"]["kv_bytes_per_token"]  # full attention, 1 layer
    assert metrics["b00"]["kv_bytes_per_token"] == per_layer * 16 / 512
    assert metrics["b02"]["teacher_kv_bytes_per_token"] == 2 * per_layer

    assemble(project, layout=layout)
    summary = read_json(layout.student / "zerograph.json")
    assert summary["layer_windows"] == [16, None, None, None] and summary["remote_code"] is True
    assert summary["intermediate_sizes"] == [128, 128, 64, 64]
    assert summary["kv_bytes_per_token"] == per_layer * (16 + 3 * 512) / 512
    assert summary["teacher_kv_bytes_per_token"] == 4 * per_layer
    assert sorted(p.name for p in layout.student.glob("*.py")) == [modeling_file("llama")]
    assert summary["modeling_sha256"] == template_sha256("llama")
    assert read_json(layout.student / "config.json")["layer_windows"] == [16, None, None, None]

    model = load_student(layout.student)  # from_pretrained, trust_remote_code only for zg's pinned file
    assert type(model).__name__ == "ZgLlamaForCausalLM"
    splits = np.asarray(lance.dataset(str(layout.tokens)).to_table(columns=["split"]).column("split").to_pylist())
    ids, _ = read_tokens(layout, np.flatnonzero(splits == "heldout")[:2])
    assert ids.shape[1] == 64 > 16
    fam = family("llama")
    with torch.no_grad():
        h = fam.embed(fam.inner(model), ids)
        for key in ("b00", "b01", "b02"):
            h = load_block(layout, key)[0](h)
        assert torch.equal(model(input_ids=ids).logits, model.lm_head(fam.final_norm(model)(h)))
    out = model.generate(ids[:1, :24], max_new_tokens=4, min_new_tokens=4, do_sample=False)
    assert out.shape == (1, 28) and torch.equal(out[:, :24], ids[:1, :24])

    result = evaluate(project, layout=layout)
    assert result.size["kv_bytes_per_token"] == summary["kv_bytes_per_token"]
    assert result.size["kv_ratio"] == (16 + 3 * 512) / (4 * 512) and result.size["param_ratio"] < 1
    assert np.isfinite(result.student_ce) and set(result.shift) == {"b00", "b01", "b02"}
    assert json.loads(layout.eval_metrics.read_text())["size"] == result.size
