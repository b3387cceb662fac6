"""The family matrix for mixture-of-experts teachers (Mixtral, Qwen2-MoE, Qwen3-MoE, OLMoE: zgdata/families/moe.py),
each from a tiny random teacher built from its config class (``teacher.source: random:tiny-<model_type>``: 4 experts,
2 per token; Qwen2-MoE with a shared expert).

The shared tests of tests/zgtrain/test_families.py run here again with this module's fixtures: boundaries are the
residual stream as for a dense teacher, the identity student's logits equal the teacher's, evaluate runs. The expert
conversions are this module's own: ``prune_experts`` keeps the most routed experts (router rows follow, top-k clamped),
``moe_to_dense`` gives one expert per layer under a one-row router; both train, assemble to the family's stock class
(``trust_remote_code=False``) where every layer has the same counts, and to zg's pinned modeling file where they
differ; cached == online and resume are bitwise (``state_sha256``).
"""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch

from tests.helpers.assertions import assert_user_error
from tests.helpers.projects import copy_project, project_of, read_json, set_params
from tests.helpers.runners import zg_main
from tests.zgtrain import test_families as matrix
from tests.zgtrain.test_families import (  # noqa: F401 - collected here, with this module's fixtures
    test_evaluate_runs_the_family_student_and_its_boundary_shift,
    test_identity_student_logits_equal_the_teachers,
    test_teacher_slices_and_boundaries_follow_the_family,
)
from zgdata.families.registry import family, family_of
from zgdata.layout import Layout

MOE = ("mixtral", "qwen2_moe", "qwen3_moe", "olmoe")


@pytest.fixture(scope="module", params=MOE)
def built(request, tmp_path_factory):
    """(family, project after teacher, tokens and materialize); never modified by a test."""
    return matrix.build(request, tmp_path_factory)


@pytest.fixture(scope="module")
def pruned(built, tmp_path_factory):
    """(family, project) with both blocks converted by moe_to_dense, trained 3 steps, assembled (one expert per
    layer in every layer: the family's stock config). The name is the fixture the shared tests ask for."""
    name, src = built
    root = copy_project(src, tmp_path_factory.mktemp(f"dense-{name}") / "proj")
    metrics = matrix._train_all(root, {"train.conversion": "moe_to_dense", "train.steps": 3})
    for m in metrics.values():
        assert m["status"] == "done" and m["steps"] == 3 and np.isfinite(m["train_loss"])
    from zgtrain.student.assemble import assemble

    assemble(project_of(root), layout=Layout(root))
    return name, root


def _arch(layout: Layout) -> dict:
    return read_json(layout.teacher_json)["architecture"]


def _assert_layers_are_the_blocks(model, layout: Layout, firsts=(("b00", 0), ("b01", 2))):
    from zgtrain.block.load import load_block

    state, fam = model.state_dict(), family_of(model.config)
    for key, first in firsts:
        block, _ = load_block(layout, key)
        for k, v in block.weights().items():
            _, j, rest = k.split(".", 2)
            assert torch.equal(state[fam.layer_key(first + int(j), rest)], v), (key, k)


def test_moe_to_dense_trains_assembles_to_the_stock_class_and_generates(pruned):
    """One expert of top-k x the expert width per layer, under a router of one row: every routing weight is exactly
    1, so each token runs one dense MLP; the stock config says it (no remote code) and the layers are the blocks'."""
    from transformers import AutoModelForCausalLM

    name, root = pruned
    layout = Layout(root)
    arch = _arch(layout)
    width = arch["active_experts"] * arch["intermediate_size"]
    summary = read_json(layout.student / "zerograph.json")
    assert summary["remote_code"] is False and summary["family"] == name
    assert summary["intermediate_sizes"] == [width] * 4
    assert summary["layer_experts"] == [1] * 4 and summary["layer_top_k"] == [1] * 4
    assert summary["active_params"] == summary["params"]  # one expert: every parameter runs
    model = AutoModelForCausalLM.from_pretrained(layout.student, trust_remote_code=False).eval()
    fam = family_of(model.config)
    assert type(model) is fam.causal_lm() and fam.experts(model.config) == 1 and fam.top_k(model.config) == 1
    assert fam.width(model.config) == width
    _assert_layers_are_the_blocks(model, layout)
    prompt = matrix._heldout_ids(layout, 1)[:, :8]
    seen = []
    hook = model.model.layers[0].mlp.gate.register_forward_hook(lambda m, a, out: seen.append(out[1]))
    try:
        out = model.generate(prompt, max_new_tokens=4, min_new_tokens=4, do_sample=False)
    finally:
        hook.remove()
    assert out.shape == (1, 12) and torch.equal(out[:, :8], prompt)
    assert seen and all(torch.equal(w, torch.ones_like(w)) for w in seen)


def test_prune_experts_keeps_the_most_routed_experts(built, tmp_path):
    """The kept experts are those with the most routing mass on the block's input sample (ties by index); the
    router's rows and the experts' weights are the teacher's rows of those experts; top-k is clamped to the count."""
    from zgdata.teacher.prepare import load_slice
    from zgtrain.block.conversions import convert
    from zgtrain.block.experts import routing
    from zgtrain.project.config import TrainConfig

    name, src = built
    layout = Layout(src)
    tensors, smeta = load_slice(layout.teacher_slice("b00"))
    config = family_of(smeta["config"]).config_from_dict(smeta["config"])
    from zgdata.store.reader import BoundaryDataset

    sample = BoundaryDataset(layout.boundary("h00")).take(np.arange(4)).float()
    gen = torch.Generator().manual_seed(0)
    teacher = convert("identity", tensors, config, TrainConfig(), sample, gen)
    mass = [w.sum(0) for _, w in routing(teacher, sample)]
    block = convert("prune_experts", tensors, config, TrainConfig(keep_experts=1), sample, gen)
    assert block.experts == [1, 1] and block.top_k == [1, 1]  # 2 per token, clamped to the one kept
    for j, (layer, m) in enumerate(zip(block.layers, mass)):
        best = int(torch.sort(-m, stable=True).indices[0])
        assert layer.mlp.gate.weight.shape[0] == 1
        assert torch.equal(layer.mlp.gate.weight[0], teacher.layers[j].mlp.gate.weight[best])
        assert torch.equal(layer.mlp.experts.down_proj[0], teacher.layers[j].mlp.experts.down_proj[best])
    three = convert("prune_experts", tensors, config, TrainConfig(keep_experts=3, active_experts=1), sample, gen)
    assert three.experts == [3, 3] and three.top_k == [1, 1]
    for j, m in enumerate(mass):
        keep = torch.sort(torch.sort(-m, stable=True).indices[:3]).values
        assert torch.equal(three.layers[j].mlp.gate.weight, teacher.layers[j].mlp.gate.weight[keep])


@pytest.mark.parametrize("init", ["merge", "top"])
def test_moe_to_dense_takes_the_chosen_expert_channels_and_scales_down_by_routing_weight(init):
    """moe_to_dense on two layers of a tiny Mixtral teacher: each dense channel j is channel c_j of expert e_j, its
    gate and up rows the teacher's rows bit for bit and its down-projection column the teacher's scaled by p_e (the
    expert's mean routing weight per token on the sample, ``routing``), so the dense MLP starts as the expected MoE
    output. The channels are the top-k x expert-width best: merge, by p_e * mean |act_{e,c}| over all experts
    (recomputed here in float64); top, the experts of most routing mass, whole."""
    import torch.nn.functional as F

    from tests.helpers.models import teacher_layers, tiny_family_teacher
    from zgtrain.block.conversions import convert
    from zgtrain.block.experts import routing
    from zgtrain.project.config import TrainConfig

    model = tiny_family_teacher("mixtral")
    config, fam = model.config, family_of(model.config)
    tensors = teacher_layers(model, "mixtral", (1, 2))
    sample = torch.randn(2, 12, config.hidden_size, generator=torch.Generator().manual_seed(4))
    gen = torch.Generator().manual_seed(0)
    teacher = convert("identity", tensors, config, TrainConfig(), sample, gen)
    block = convert("moe_to_dense", tensors, config, TrainConfig(dense_init=init), sample, gen)
    width_e, n_experts, k = fam.width(config), fam.experts(config), fam.top_k(config)
    assert config.hidden_act == "silu" and block.experts == [1, 1] and block.intermediate_sizes == [k * width_e] * 2
    for j, (x, weights) in enumerate(routing(teacher, sample)):
        p = weights.mean(0)
        up = tensors[f"layers.{1 + j}.mlp.experts.gate_up_proj"]  # (E, 2I, C): gate rows, then up rows
        down = tensors[f"layers.{1 + j}.mlp.experts.down_proj"]  # (E, C, I)
        dense = block.layers[j].mlp.experts
        gate_rows, up_rows = dense.gate_up_proj[0].chunk(2)
        # each dense channel's gate row is exactly one teacher channel's: that is its (expert, channel)
        match = (gate_rows[:, None, None, :] == up[None, :, :width_e, :]).all(-1)  # (W, E, I)
        assert (match.flatten(1).sum(1) == 1).all()
        flat = match.flatten(1).float().argmax(1)
        e, c = flat // width_e, flat % width_e
        assert torch.equal(flat, torch.sort(flat).values) and len(set(flat.tolist())) == len(flat)
        assert torch.equal(up_rows, up[e, width_e + c])
        for col in range(len(flat)):
            want = down[e[col], :, c[col]] * p[e[col]].float()
            assert torch.equal(dense.down_proj[0][:, col], want), col
        assert torch.equal(block.layers[j].mlp.gate.weight, torch.zeros(1, config.hidden_size))
        chosen = torch.zeros(n_experts * width_e, dtype=torch.bool).index_fill_(0, flat, True)
        if init == "merge":
            h = torch.einsum("nd,eid->eni", x.double(), up.double())
            act = F.silu(h[..., :width_e]) * h[..., width_e:]
            score = (act.abs().mean(1) * p[:, None]).flatten()
            assert score[chosen].min() > score[~chosen].max() * (1 + 1e-9)
        else:
            top = torch.sort(-weights.sum(0), stable=True).indices[:k]
            assert torch.equal(
                chosen.view(n_experts, width_e).all(1),
                torch.zeros(n_experts, dtype=torch.bool).index_fill_(0, top, True),
            )


def test_per_layer_expert_counts_ship_the_modeling_file(pruned, tmp_path):
    """b01 re-converted by prune_experts (3 of 4 experts, 1 per token) beside b00's dense MLPs: per-layer widths and
    counts, which only zg's pinned modeling file says; a stock export is refused in one line naming the layer."""
    from zgtrain.export.hf import check_hf
    from zgtrain.student.assemble import assemble
    from zgtrain.student.load import load_student, modeling_file, template_sha256

    name, src = pruned
    root = copy_project(src, tmp_path / "proj")
    layout = Layout(root)
    m = matrix._train_all(
        root,
        {"blocks.b01.conversion": "prune_experts", "blocks.b01.keep_experts": 3, "blocks.b01.active_experts": 1},
        keys=("b01",),
    )["b01"]
    assert m["status"] == "done" and np.isfinite(m["train_loss"])
    meta = read_json(layout.block_dir("b01") / "meta.json")
    assert meta["experts"] == [3, 3] and meta["top_k"] == [1, 1] and meta["active_params"] < meta["params"]
    assemble(project_of(root), layout=layout)
    summary = read_json(layout.student / "zerograph.json")
    arch = _arch(layout)
    assert summary["remote_code"] is True and summary["modeling_sha256"] == template_sha256(name)
    assert summary["layer_experts"] == [1, 1, 3, 3] and summary["layer_top_k"] == [1, 1, 1, 1]
    assert summary["intermediate_sizes"][2:] == [arch["intermediate_size"]] * 2
    assert sorted(p.name for p in layout.student.glob("*.py")) == [modeling_file(name)]
    model = load_student(layout.student)
    assert type(model).__name__ == f"Zg{family(name).model_class}"
    assert [layer.mlp.gate.weight.shape[0] for layer in model.model.layers] == [1, 1, 3, 3]
    assert [layer.mlp.gate.top_k for layer in model.model.layers] == [1, 1, 1, 1]
    _assert_layers_are_the_blocks(model, layout)
    out = model.generate(torch.zeros(1, 4, dtype=torch.long), max_new_tokens=2, min_new_tokens=2, do_sample=False)
    assert out.shape == (1, 6)
    with pytest.raises(Exception, match="MLP width|experts"):
        check_hf(layout.student)


def test_uniform_pruned_experts_export_as_the_stock_config(built, tmp_path):
    """Both blocks keep 3 of 4 experts: the student is the family's stock class with num_experts 3, it exports as a
    stock folder (`zg export --format hf`) whose logits equal the student's, and its active parameters are fewer."""
    from transformers import AutoModelForCausalLM

    from zgtrain.student.assemble import assemble
    from zgtrain.student.load import load_student

    name, src = built
    root = copy_project(src, tmp_path / "proj")
    layout = Layout(root)
    matrix._train_all(root, {"train.conversion": "prune_experts", "train.keep_experts": 3, "train.steps": 2})
    result = assemble(project_of(root), layout=layout)
    assert result.remote_code is False and result.layer_experts == [3] * 4 and result.layer_top_k == [2] * 4
    assert result.active_params < result.params < read_json(layout.teacher_json)["params"]
    out = tmp_path / "hf"
    zg_main("export", "--format", "hf", "--out", out, cwd=root)
    fam = family(name)  # zg's padded experts, as load_student runs them (the default rounds small groups otherwise)
    stock = AutoModelForCausalLM.from_pretrained(out, trust_remote_code=False, **fam.load_kwargs()).eval()
    assert type(stock) is fam.causal_lm() and fam.experts(stock.config) == 3
    ids = matrix._heldout_ids(layout, 2)
    with torch.no_grad():
        assert torch.equal(stock(input_ids=ids).logits, load_student(layout.student)(input_ids=ids).logits)


def test_cached_online_and_resumed_expert_blocks_are_bitwise_identical(built, tmp_path):
    """b01 (ending at the last boundary) by prune_experts: from the stored boundaries, from the teacher online, and
    stopped after 2 steps then resumed, the trained state is the same bits."""
    from zgtrain.block.train import train_block

    _, src = built
    root = copy_project(src, tmp_path / "proj")
    params = set_params(root, {"train.conversion": "prune_experts", "train.steps": 4, "train.checkpoint_every": 2})
    layout = Layout(root)
    cached = train_block(project_of(params), "b01", layout=layout)
    stopped = train_block(project_of(params), "b01", restart=True, stop_after=2, layout=layout)
    assert stopped.status == "stopped" and stopped.step == 2
    resumed = train_block(project_of(params), "b01", layout=layout)
    assert resumed.status == "done" and resumed.state_sha256 == cached.state_sha256
    shutil.rmtree(root / "data" / "boundaries")  # online can only get its pairs from the teacher
    online = train_block(project_of(params), "b01", targets="online", restart=True, layout=layout)
    assert online.targets == "online" and online.state_sha256 == cached.state_sha256


def test_prune_mlp_and_too_many_experts_are_refused_on_a_moe_teacher(built, tmp_path):
    """prune_mlp on a MoE teacher, and more experts kept than it has: one line each, nothing trained."""
    name, src = built
    root = copy_project(src, tmp_path / "moe")
    set_params(root, {"train.conversion": "prune_mlp"})
    res = zg_main("train", "block", "b00", cwd=root, check=False)
    assert_user_error(res, "train.conversion", "prune_mlp", "prune_experts or moe_to_dense")
    assert not (Layout(root).block_dir("b00") / "model.safetensors").exists()
    set_params(root, {"train.conversion": "prune_experts", "train.keep_experts": 9})
    res = zg_main("train", "block", "b00", cwd=root, check=False)
    assert_user_error(res, "train.keep_experts", "4 experts per layer")


def test_a_teacher_whose_layers_do_not_all_route_experts_or_that_slides_is_refused():
    """``MoeFamily.check`` on Qwen2-MoE configs: dense MLP layers among the expert ones (``decoder_sparse_step`` 2, or
    ``mlp_only_layers``) cannot be described by per-layer expert counts, and Qwen2-MoE's sliding-window layers are
    not captured bit-exactly: each is refused in one line keyed to teacher.source; every layer routing experts with
    full attention passes."""
    from transformers import Qwen2MoeConfig

    from zgdata.errors import ZgError

    def config(**extra):
        return Qwen2MoeConfig(
            vocab_size=257,
            hidden_size=32,
            intermediate_size=64,
            moe_intermediate_size=16,
            shared_expert_intermediate_size=16,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            num_experts=4,
            num_experts_per_tok=2,
            **extra,
        )

    family_of(config()).check(config())
    mixed = "this qwen2_moe teacher mixes dense and expert MLP layers \\(mlp_only_layers / decoder_sparse_step\\)"
    sliding = "this qwen2_moe teacher uses sliding-window attention layers"
    for extra, what in (
        ({"decoder_sparse_step": 2}, mixed),
        ({"mlp_only_layers": [0]}, mixed),
        ({"use_sliding_window": True, "sliding_window": 16, "layer_types": ["sliding_attention"] * 2}, sliding),
    ):
        cfg = config(**extra)
        with pytest.raises(ZgError, match=what) as e:
            family_of(cfg).check(cfg)
        assert e.value.key == "teacher.source" and "\n" not in str(e.value), extra


def test_expert_conversions_are_refused_on_a_dense_teacher(tiny_built, tmp_path):
    dense = copy_project(tiny_built, tmp_path / "dense")
    set_params(dense, {"train.conversion": "moe_to_dense"})
    res = zg_main("train", "block", "b00", cwd=dense, check=False)
    assert_user_error(res, "train.conversion", "mixture-of-experts teacher", "dense MLPs")


def test_a_tokens_boundaries_do_not_depend_on_its_batch(built):
    """Which tokens an expert gets depends on the whole batch; zg's padded experts (zgdata/families/moe_kernel.py)
    keep every product in the many-row regime, so any subset of rows captures the same bits as the stored batch."""
    from zgdata.families.capture import capture
    from zgdata.store.reader import BoundaryDataset
    from zgdata.teacher.prepare import load_teacher
    from zgdata.tokens.store import read_tokens

    _, src = built
    layout = Layout(src)
    model, _ = load_teacher(layout, dtype="float32", with_tokenizer=False, per_layer=True)
    stored = {k: BoundaryDataset(layout.boundary(f"h{k:02d}")).take(np.arange(12)) for k in (2, 4)}
    for rows in ([0], [3, 7, 9], [1, 2, 3, 4, 5], [11, 0]):
        ids, _ = read_tokens(layout, np.array(rows))
        got = capture(model, ids, [2, 4], storage_dtype=torch.bfloat16)
        for k in (2, 4):
            assert torch.equal(got[k].view(torch.int16), stored[k][rows].view(torch.int16)), (rows, k)


def test_teacher_json_counts_the_experts(built):
    name, src = built
    arch = _arch(Layout(src))
    cfg = json.loads((Layout(src).teacher_hf / "config.json").read_text())
    fam = family(name)
    assert arch["experts"] == 4 == fam.experts(cfg) and arch["active_experts"] == 2
    assert ("shared_expert_size" in arch) == (name == "qwen2_moe")


@pytest.mark.parametrize("built", ["mixtral"], indirect=True)  # one family is enough for the search's arithmetic
def test_search_mixes_expert_variants_under_an_active_params_budget(built, tmp_path):
    """A variant library of expert conversions (fewer experts and fewer per token; one dense MLP of one expert's
    width) searched with search.cost: active_params: each option's cost is what a token runs, the teacher block's
    top-k / E of its experts; the choice is the cheapest-delta mix within the budget and assembles."""
    from zgtrain.search.assemble import mix_blocks
    from zgtrain.search.solve import run_search
    from zgtrain.search.variants import train_variant
    from zgtrain.student.assemble import build_from_blocks

    name, src = built
    assert name == "mixtral"
    root = copy_project(src, tmp_path / "proj")
    layout = Layout(root)
    width = _arch(layout)["intermediate_size"]
    variants = {
        "e1": {"conversion": "prune_experts", "keep_experts": 2, "active_experts": 1, "steps": 2},
        "dense": {"conversion": "moe_to_dense", "dense_width": width, "steps": 2},
    }
    params = set_params(root, {"variants": variants, "search.cost": "active_params", "search.budget": 0.8})
    project = project_of(params)
    metrics = {(b, v): train_variant(project, b, v, layout=layout).metrics() for b in ("b00", "b01") for v in variants}
    for (b, v), m in metrics.items():
        assert m["status"] == "done" and m["active_params"] < m["teacher_active_params"] < m["teacher_params"], (b, v)
    result = run_search(project, layout=layout)
    assert result.cost == "active_params" and result.active_params <= result.budget_cost
    assert result.teacher_active_params == sum(metrics[(b, "e1")]["teacher_active_params"] for b in ("b00", "b01"))
    options = [
        [(metrics[(b, "e1")]["teacher_active_params"], 0.0)]
        + [(metrics[(b, v)]["active_params"], metrics[(b, v)]["ce_delta"]) for v in variants]
        for b in ("b00", "b01")
    ]
    best = min(
        ((i, j) for i in range(3) for j in range(3) if options[0][i][0] + options[1][j][0] <= result.budget_cost),
        key=lambda ij: (options[0][ij[0]][1] + options[1][ij[1]][1], options[0][ij[0]][0] + options[1][ij[1]][0]),
    )
    names = ["teacher", *variants]
    mix = {b: o["variant"] for b, o in result.blocks.items()}
    assert mix == {"b00": names[best[0]], "b01": names[best[1]]}
    model, summary = build_from_blocks(mix_blocks(project, mix, layout), layout=layout)
    assert summary["active_params"] <= summary["params"]
    out = model.generate(torch.zeros(1, 4, dtype=torch.long), max_new_tokens=2, min_new_tokens=2, do_sample=False)
    assert out.shape == (1, 6)
