"""The ``linear_attention`` conversion (zgtrain/block/attention.py): each layer's attention linearized with learned
Hedgehog feature maps over the teacher's own q/k/v/o, optionally beside exact softmax over a window, with a
constant-size generation state. Tensor-level checks on tiny random teachers, then one real tiny Llama project
(in-process ``train_block``, ``zg_main``): two-phase training bit for bit twice, with online targets and across a
resume; the assembled student loads, generates with its own cache; export refuses it. Bitwise claims use torch.equal.
"""

from __future__ import annotations

import inspect
import shutil

import pytest
import torch

from tests.helpers.assertions import assert_user_error
from tests.helpers.models import teacher_layers as _slice
from tests.helpers.models import tiny_family_teacher as _teacher
from tests.helpers.projects import b00_converted, b00_weights, copy_project, project_of, read_json
from tests.helpers.runners import zg_main
from zgdata.errors import ZgError
from zgdata.families.base import cache_arg
from zgdata.layout import Layout
from zgtrain.block.attention import (
    LinearAttention,
    LinearAttentionState,
    transfer_loss,
    transfer_parameters,
)
from zgtrain.block.conversions import convert
from zgtrain.block.kv_cache import kv_summary
from zgtrain.block.load import load_block
from zgtrain.block.train import train_block
from zgtrain.project.config import TrainConfig


def _x(model, b: int = 2, t: int = 24, seed: int = 0) -> torch.Tensor:
    return torch.randn(b, t, model.config.hidden_size, generator=torch.Generator().manual_seed(seed))


def _convert(model, name="llama", window=0, layers=(0, 1)):
    cfg = TrainConfig(conversion="linear_attention", linear_window=window)
    return convert("linear_attention", _slice(model, name, layers), model.config, cfg, _x(model), None)


@pytest.mark.parametrize("name", ["llama", "qwen2"])
def test_feature_maps_start_as_identity_and_the_rest_is_the_teachers(name):
    model = _teacher(name)
    tensors = _slice(model, name, (1, 2))
    block = _convert(model, name, window=4, layers=(1, 2))
    assert block.attention == ["linear_attention:4"] * 2 and block.cache_windows() == [4, 4]
    la = block.layers[0].self_attn
    assert isinstance(la, LinearAttention) and (la.heads, la.kv_heads, la.head_dim, la.window) == (4, 2, 16, 4)
    assert torch.equal(la.feature_q, torch.eye(16).repeat(4, 1, 1)) and la.feature_k.shape == (2, 16, 16)
    assert not la.feature_q_bias.any() and not la.feature_k_bias.any() and la.window_factor.shape == (4,)
    for k, v in block.weights().items():  # q/k/v/o, norms and MLP are the teacher's
        if k not in transfer_parameters(block):
            assert torch.equal(v, tensors[f"layers.{1 + int(k.split('.')[1])}.{k.split('.', 2)[2]}"]), k
    assert transfer_parameters(block) == {
        f"layers.{j}.self_attn.{p}"
        for j in (0, 1)
        for p in ("feature_q", "feature_q_bias", "feature_k", "feature_k_bias", "window_factor")
    }
    phi = la.phi(torch.randn(1, 4, 5, 16), la.feature_q, la.feature_q_bias)  # two softmaxes over D: 2 D features
    assert phi.shape == (1, 4, 5, 32) and torch.allclose(phi.sum(-1), torch.full((1, 4, 5), 2.0))
    assert not hasattr(_convert(model, name).layers[0].self_attn, "window_factor")  # window 0: purely linear


@pytest.mark.parametrize("window", [0, 3])
def test_incremental_decoding_equals_the_parallel_forward_in_float64(window):
    """A prefill of 7 positions then one position at a time through ``LinearAttentionState`` gives the parallel
    causal forward's outputs within 1e-10 in float64: the same sums in another order (state S, z vs the masked
    T x T products), so only rounding differs. The state's shapes stop growing once the window is full: O(1)."""
    from transformers import DynamicCache

    model = _teacher("llama")
    block = _convert(model, window=window).double().eval()
    la = block.layers[0].self_attn
    with torch.no_grad():  # random feature maps: not the identity start, so the maps matter
        for p in (la.feature_q, la.feature_k, la.feature_q_bias, la.feature_k_bias):
            p.copy_(torch.randn(p.shape, generator=torch.Generator().manual_seed(7), dtype=p.dtype))
    x = _x(model, t=20).double()
    cos, sin = block.family.layer_inputs(block.rotary_emb, x)["position_embeddings"]
    with torch.no_grad():
        full = la(x, position_embeddings=(cos, sin))[0]
        cache = DynamicCache()
        outs = [la(x[:, :7], position_embeddings=(cos[:, :7], sin[:, :7]), past_key_values=cache)[0]]
        shapes = []
        for i in range(7, 20):
            outs.append(la(x[:, i : i + 1], position_embeddings=(cos[:, i : i + 1], sin[:, i : i + 1]), cache=cache)[0])
            shapes.append([tuple(t.shape) for t in cache.layers[0].state])
    assert (torch.cat(outs, 1) - full).abs().max() < 1e-10
    assert isinstance(cache.layers[0], LinearAttentionState) and cache.get_seq_length() == 20
    w = max(window - 1, 0)  # the window's earlier keys; the current one is the query's own
    assert all(s == [(2, 2, 32, 16), (2, 2, 32), (2, 2, w, 16), (2, 2, w, 16)] for s in shapes)


@pytest.mark.parametrize("name", ["llama", "qwen2"])
def test_a_window_covering_the_sequence_is_the_teachers_softmax_attention(name):
    """With ``linear_window`` at least the sequence length no key is linear: each query's weights are
    sigmoid(window_factor) exp(q . k * scaling - m) over its causal keys, normalized by their own sum, which is the
    teacher's softmax attention (the factor cancels). So on the teacher's own attention inputs (``attention_call``)
    the layer's output equals the teacher attention's output within float32 rounding; the window's scores carry the
    teacher's ``scaling``."""
    from zgtrain.block.attention import attention_call

    model = _teacher(name)
    teacher = convert("identity", _slice(model, name, (0, 1)), model.config, TrainConfig(), _x(model), None)
    teacher.eval()
    block = _convert(model, name, window=24).eval()  # _x: 24 positions, so every key is inside the window
    x = _x(model, seed=5)
    with torch.no_grad():
        inputs = teacher.family.layer_inputs(teacher.rotary_emb, x)
        h = x
        for t_layer, s_layer in zip(teacher.layers, block.layers):
            a_in, a_kw, a_out, h = attention_call(teacher.family, t_layer, h, inputs)
            y = s_layer.self_attn(a_in, **a_kw)[0]
            assert a_out.abs().max() > 1e-2  # not a trivially small output
            torch.testing.assert_close(y, a_out, rtol=0, atol=1e-5)


def test_attention_transfer_trains_only_the_feature_maps_and_its_loss_falls():
    model = _teacher("llama")
    teacher = convert("identity", _slice(model, "llama", (0, 1)), model.config, TrainConfig(), _x(model), None)
    teacher.eval().requires_grad_(False)
    block = _convert(model, window=2)
    names = transfer_parameters(block)
    params = [p for n, p in block.named_parameters() if n in names]
    before = {k: v.clone() for k, v in block.weights().items()}
    opt = torch.optim.AdamW(params, lr=1e-2)
    x = _x(model)
    losses = []
    for _ in range(15):
        loss = transfer_loss(teacher, block, x)
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    assert losses[-1] < 0.8 * losses[0], losses
    for k, v in block.weights().items():
        assert torch.equal(v, before[k]) != (k in names), k


def test_attention_transfer_loss_is_float32_under_bf16_autocast():
    """precision: bf16 changes the forward, not the loss: the student's and the teacher's attention outputs leave
    bf16 linears, and their difference is taken in float32 (in bf16 it rounds away what transfer trains on)."""
    from zgdata.core.runtime import autocast

    model = _teacher("llama")
    teacher = convert("identity", _slice(model, "llama", (0, 1)), model.config, TrainConfig(), _x(model), None)
    block = _convert(model, window=2)
    with autocast(torch.device("cpu"), "bf16"):
        loss = transfer_loss(teacher.eval(), block, _x(model))
    assert loss.dtype == torch.float32


def test_refusals_are_one_line_and_kv_bytes_count_the_window_and_the_state():
    for name, what in (("gpt2", "no separate q/k/v/o"), ("olmo2", "q_norm"), ("gemma2", "softcapping")):
        model = _teacher(name)
        with pytest.raises(ZgError, match=what) as e:
            _convert(model, name, layers=(0,))
        assert "\n" not in str(e.value) and "linear_attention" in str(e.value)
    config = _teacher("llama").config.to_dict()  # 2 KV heads x 16 dims, float32, 512 positions
    state = 2 * (32 * 16 + 32)  # per layer: S (F x D) and z (F) per KV head, F = 32
    s = kv_summary(config, [0, 8, None, None], kv_heads=[None] * 4, attention=["linear_attention", "x:8", None, None])
    assert s["linear_state_bytes"] == 4 * state  # "x:8" is not linear_attention: its window only
    s = kv_summary(config, [0, 8, None, None], kv_heads=[None] * 4, attention=["linear_attention"] * 2 + [None] * 2)
    per_pos = 2 * 2 * 16 * 4
    assert s["linear_state_bytes"] == 2 * state * 4
    assert s["kv_bytes_per_token"] == (8 * per_pos + 2 * 512 * per_pos + 2 * state * 4) / 512
    assert "linear_state_bytes" not in kv_summary(config, [None] * 4)


def test_linear_attention_copies_in_the_modeling_files_are_verbatim():
    from zgtrain.student.load import template_class

    for cls in (LinearAttentionState, LinearAttention):
        ours = inspect.getsource(cls)
        for name in ("llama", "qwen2", "mistral"):  # the three templates (mistral: the dense one)
            module = inspect.getmodule(template_class(name, "AutoConfig"))
            assert inspect.getsource(getattr(module, cls.__name__)) == ours, (name, cls.__name__)


def test_modeling_file_generates_with_its_constant_state_in_float64():
    """zg's modeling file with layers [full, linear_attention:3, linear_attention, full] in float64: greedy tokens
    with the cache equal those without it (generate hands back float32 logits: close to the full forward's at float32
    rounding); fed one token at a time through the cache, each position's float64 logits equal the full forward's
    within 1e-10 (two summation orders of the same sums), and each linear_attention layer's state keeps its shapes
    once its window is full."""
    from transformers import DynamicCache

    from zgtrain.student.load import template_class

    teacher = _teacher("llama")
    kinds = ["full", "linear_attention:3", "linear_attention", "full"]
    fields = {k: v for k, v in teacher.config.to_dict().items() if k not in ("model_type", "architectures")}
    config = template_class("llama", "AutoConfig")(intermediate_sizes=[128] * 4, layer_attention=kinds, **fields)
    model = template_class("llama", "AutoModelForCausalLM")(config)
    missing, unexpected = model.load_state_dict(teacher.state_dict(), strict=False)
    assert not unexpected and all(".self_attn.feature_" in m or "window_factor" in m for m in missing)
    model = model.double().eval()
    ids = torch.randint(0, teacher.config.vocab_size, (1, 6), generator=torch.Generator().manual_seed(3))
    greedy = dict(max_new_tokens=8, min_new_tokens=8, do_sample=False)
    out = model.generate(ids, **greedy, output_logits=True, return_dict_in_generate=True)
    seq = out.sequences
    assert torch.equal(model.generate(ids, **greedy, use_cache=False), seq)
    with torch.no_grad():
        full = model(input_ids=seq).logits[0]
        for step, logits in enumerate(out.logits):
            torch.testing.assert_close(logits[0], full[5 + step].float(), rtol=1e-5, atol=1e-5)
        cache = DynamicCache(config=model.config)
        shapes, worst = [], 0.0
        for i in range(seq.shape[1]):
            logits = model(input_ids=seq[:, i : i + 1], **{cache_arg(): cache}, use_cache=True).logits[0, 0]
            worst = max(worst, float((logits - full[i]).abs().max()))
            shapes.append(tuple(tuple(t.shape) for j in (1, 2) for t in cache.layers[j].state))
    assert worst < 1e-10
    assert cache.get_seq_length() == seq.shape[1] and cache.layers[0].keys.shape[2] == seq.shape[1]
    assert len(set(shapes[2:])) == 1  # the window's 2 earlier keys held: nothing grows any more


@pytest.fixture(scope="module")
def la_project(tiny_built, tmp_path_factory):
    """The tiny project with b00 converted to linear_attention (nothing else said: defaults) for 8 steps, the first
    2 (a quarter) attention transfer, and b01 the identity (untrained)."""
    return b00_converted(tiny_built, tmp_path_factory.mktemp("la") / "proj", "linear_attention", steps=8)


def test_linear_attention_block_trains_in_two_phases_bitwise(la_project, tmp_path):
    """Same seed twice: the same bits; online targets: the same bits; stopped inside attention transfer and
    resumed across the phase change: the same bits and loss curve."""
    layout = Layout(la_project)
    first = train_block(project_of(la_project), "b00", restart=True, layout=layout).metrics()
    assert first["status"] == "done" and first["conversion"] == "linear_attention"
    meta = read_json(layout.block_dir("b00") / "meta.json")
    assert meta["attention"] == ["linear_attention", "linear_attention"] and meta["transfer_steps"] == 2
    init, _ = load_block(layout, "b00", which="init")
    w1 = b00_weights(la_project)
    changed = {k for k, v in init.weights().items() if not torch.equal(v, w1[k])}
    assert "layers.0.self_attn.feature_q" in changed and "layers.0.self_attn.q_proj.weight" in changed
    assert first["kv_bytes_per_token"] == first["linear_state_bytes"] / first["kv_context"] > 0
    assert first["kv_ratio"] < 0.05 and first["params"] > first["teacher_params"]  # the maps add parameters
    curve = (layout.block_loss_curve("b00")).read_text()

    again = train_block(project_of(la_project), "b00", restart=True, layout=layout).metrics()
    assert again["state_sha256"] == first["state_sha256"]
    assert all(torch.equal(v, w1[k]) for k, v in b00_weights(la_project).items())

    online = copy_project(la_project, tmp_path / "online")
    shutil.rmtree(online / "data" / "boundaries")
    res = train_block(project_of(online), "b00", targets="online", restart=True, layout=Layout(online)).metrics()
    assert res["state_sha256"] == first["state_sha256"] and res["heldout_loss"] == first["heldout_loss"]

    stopped = train_block(project_of(la_project), "b00", restart=True, stop_after=1, layout=layout)
    assert stopped.status == "stopped" and read_json(layout.block_dir("b00") / "meta.json")["step"] == 1
    resumed = train_block(project_of(la_project), "b00", layout=layout).metrics()
    assert resumed["state_sha256"] == first["state_sha256"]
    assert layout.block_loss_curve("b00").read_text() == curve


def test_linear_attention_student_loads_generates_and_export_refuses(la_project):
    from zgtrain.student.assemble import assemble, build_student
    from zgtrain.student.load import load_student

    root, layout = la_project, Layout(la_project)
    if not read_json(layout.block_dir("b00") / "meta.json").get("done"):
        train_block(project_of(root), "b00", layout=layout)
    train_block(project_of(root), "b01", restart=True, layout=layout)
    assemble(project_of(root), layout=layout)
    summary = read_json(layout.student / "zerograph.json")
    assert summary["layer_attention"] == ["linear_attention"] * 2 + ["full"] * 2 and summary["remote_code"] is True
    state = 2 * 2 * (32 * 16 + 32) * 4  # bytes: S and z of 2 KV heads in 2 layers, float32 (see kv_cache.py)
    assert summary["linear_state_bytes"] == state
    assert summary["kv_bytes_per_token"] == 2 * (2 * 2 * 16 * 4) + state / 512  # 2 full layers + the state / L
    model = load_student(layout.student)
    assert type(model).__name__ == "ZgLlamaForCausalLM"
    built, _ = build_student(project_of(root), layout=layout)
    ids = torch.randint(0, model.config.vocab_size, (2, 12), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert torch.equal(model(input_ids=ids).logits, built(input_ids=ids).logits)
    prompt = ids[:1, :10]
    greedy = dict(max_new_tokens=6, min_new_tokens=6, do_sample=False)
    out = model.generate(prompt, **greedy, output_logits=True, return_dict_in_generate=True)
    assert torch.equal(model.generate(prompt, **greedy, use_cache=False), out.sequences)
    with torch.no_grad():
        full = model(input_ids=out.sequences).logits[0]
    for step, logits in enumerate(out.logits):  # float32: two summation orders, rounding only
        torch.testing.assert_close(logits[0], full[9 + step], rtol=1e-4, atol=1e-4)
    for fmt in ("hf", "gguf"):
        out_dir = root / "models" / f"out-{fmt}"
        res = zg_main("export", "student", "--format", fmt, "--out", str(out_dir), cwd=root, check=False)
        assert_user_error(
            res, "layer 0 has linearized attention with learned feature maps (conversion linear_attention)"
        )
        assert not out_dir.exists()
