"""Model families: Llama, Qwen2 and GPT-2 through the whole conversion, each from a tiny
random teacher built from its config in code (``teacher.source: random:tiny[-qwen2|-gpt2]``).

One project per family is built through the real CLI (`zg init --profile tiny`, then teacher, tokens,
materialize); the Llama one is the session's ``tiny_built``. Tests that train or assemble work on a copy
and call the functions the CLI calls, in-process (the CLI adds only argument parsing). Bitwise claims use
torch.equal or ``state_sha256``. Families differ on purpose: Llama ties its head, Qwen2 does not and has
q/k/v biases, GPT-2 adds learned positions, uses LayerNorm with biases and Conv1D (in, out) MLP weights.
"""

from __future__ import annotations

import shutil

import lance
import numpy as np
import pytest
import torch
from safetensors import safe_open

from tests.helpers.assertions import assert_user_error
from tests.helpers.projects import copy_project, project_of, read_json, set_params, tree_sha256
from tests.helpers.runners import zg_main
from zgdata.families.registry import FAMILIES, family, family_of
from zgdata.layout import Layout

# declared (a record in zgdata/families/) and verified at prepare (no record: zgdata/families/verified.py)
DECLARED = ("qwen2", "gpt2", "mistral", "granite", "olmo2", "phi3", "gemma2", "gemma3_text")
VERIFIED = ("qwen3", "olmo", "glm", "starcoder2", "exaone4", "phi")
SOURCES = {"llama": "random:tiny", **{t: f"random:tiny-{t}" for t in DECLARED + VERIFIED}}
TIED = {"llama", "gpt2"}  # the tiny teachers that tie their LM head to the embeddings


@pytest.fixture(scope="module", params=sorted(set(SOURCES) - set(VERIFIED)))
def built(request, tmp_path_factory):
    """(family, project after teacher, tokens and materialize); never modified by a test. The verified families run
    the same tests from tests/zgtrain/test_families_verified.py: a module of their own is a group of its own, which
    pytest-xdist runs on another worker."""
    return build(request, tmp_path_factory)


def build(request, tmp_path_factory):
    name = request.param
    source = SOURCES.get(name, f"random:tiny-{name}")  # the MoE families' matrix: tests/zgtrain/test_families_moe.py
    if source == "random:tiny":
        return name, request.getfixturevalue("tiny_built")  # the session's tiny project is exactly this one
    root = tmp_path_factory.mktemp(name) / "proj"
    zg_main("init", root, "--profile", "tiny", cwd=root.parent)
    set_params(root, {"teacher.source": source})
    for cmd in (("teacher", "prepare"), ("data", "tokenize"), ("data", "materialize")):
        zg_main(*cmd, cwd=root)
    return name, root


def _heldout_ids(layout: Layout, n: int = 4) -> torch.Tensor:
    from zgdata.tokens.store import read_tokens

    splits = lance.dataset(str(layout.tokens)).to_table(columns=["split"]).column("split").to_pylist()
    ids, _ = read_tokens(layout, [i for i, s in enumerate(splits) if s == "heldout"][:n])
    return ids


def _train_all(root, updates: dict, keys=("b00", "b01")) -> dict:
    from zgtrain.block.train import train_block

    params = set_params(root, updates)
    return {k: train_block(project_of(params), k, restart=True, layout=Layout(root)).metrics() for k in keys}


def test_teacher_slices_and_boundaries_follow_the_family(built):
    """Slices hold `layers.{i}.*` and the family's head parts; boundary k is hidden_states[k], the last one
    the final norm's input (bit for bit); the head slice embeds to boundary 0 as evaluate's shift does."""
    from zgdata.store.reader import BoundaryDataset
    from zgdata.teacher.prepare import load_slice, load_teacher
    from zgdata.tokens.store import read_tokens

    name, root = built
    layout = Layout(root)
    arch = read_json(layout.teacher_json)["architecture"]
    assert arch["model_type"] == name and arch["num_layers"] == 4
    model, _ = load_teacher(layout, with_tokenizer=False)
    fam = family_of(model.config)
    assert type(model) is fam.causal_lm()
    want_layers, want_head = fam.split_state(model.state_dict())
    for key, lo in (("b00", 0), ("b01", 2)):
        with safe_open(str(layout.teacher_slice(key)), framework="pt") as f:
            assert sorted(f.keys()) == sorted(f"layers.{i}.{k}" for i in (lo, lo + 1) for k in want_layers[i])
    head, _ = load_slice(layout.teacher_head)
    assert sorted(head) == sorted(want_head)
    assert ("wpe.weight" in head) == (name == "gpt2")
    assert arch["tie_word_embeddings"] == (name in TIED)
    # a decoder without a record is in the project because its self-check passed, and teacher.json says so
    verdict = read_json(layout.teacher_json).get("verified")
    assert (verdict or {}).get("verdict") == ("pass" if name in VERIFIED else None)
    assert fam.verified == (name in VERIFIED) and (name in FAMILIES) == (name not in VERIFIED)

    pre_norm = []
    hook = fam.final_norm(model).register_forward_pre_hook(lambda m, args: pre_norm.append(args[0].detach().clone()))
    rows = np.arange(8)
    ids, _ = read_tokens(layout, rows)
    try:
        with torch.no_grad():
            hs = model(ids, output_hidden_states=True).hidden_states
    finally:
        hook.remove()
    assert len(hs) == 5 and len(pre_norm) == 1
    for layer in (0, 2, 4):
        stored = BoundaryDataset(layout.boundary(f"h{layer:02d}")).take(rows)
        ref = pre_norm[0] if layer == 4 else hs[layer]
        assert torch.equal(stored.view(torch.int16), ref.to(torch.bfloat16).view(torch.int16)), layer
    assert not torch.equal(BoundaryDataset(layout.boundary("h04")).take(rows), hs[4].to(torch.bfloat16))
    # the lineage records the attention the boundaries were captured with (eager for Gemma 2, else sdpa)
    assert {BoundaryDataset(layout.boundary(f"h{i:02d}")).meta["lineage"]["attn_implementation"] for i in (2, 4)} == {
        family_of(model.config).attn_implementation
    }
    h0 = family_of(model.config).embed_head({k: v.float() for k, v in head.items()}, ids)
    assert torch.equal(h0, hs[0])


def test_identity_student_logits_equal_the_teachers(built, tmp_path):
    from transformers import AutoModelForCausalLM

    from zgdata.teacher.prepare import load_teacher
    from zgtrain.student.assemble import assemble

    name, src = built
    root = copy_project(src, tmp_path / "proj")
    layout = Layout(root)
    for m in _train_all(root, {"train.conversion": "identity", "train.steps": 0}).values():
        assert m["status"] == "done" and m["params"] == m["teacher_params"]
    summary = assemble(project_of(root), layout=layout)
    assert summary.family == name and summary.remote_code is False
    student = AutoModelForCausalLM.from_pretrained(layout.student, dtype=torch.float32, **family(name).load_kwargs())
    student = student.eval()
    teacher, _ = load_teacher(layout, with_tokenizer=False)
    assert type(student) is type(teacher) is family(name).causal_lm()
    # Gemma 3's sliding and full layers stay where they were (block b01 starts with a full layer)
    assert getattr(student.config, "layer_types", None) == getattr(teacher.config, "layer_types", None)
    ids = _heldout_ids(layout)
    with torch.no_grad():
        a, b = student(input_ids=ids).logits, teacher(input_ids=ids).logits
    assert a.shape == b.shape and torch.equal(a, b)


@pytest.fixture(scope="module")
def pruned(built, tmp_path_factory):
    """(family, project) with both blocks converted by prune_mlp (ratio 0.5), trained 3 steps, assembled."""
    return prune(built, tmp_path_factory)


def prune(built, tmp_path_factory):
    from zgtrain.student.assemble import assemble

    name, src = built
    root = copy_project(src, tmp_path_factory.mktemp(f"pruned-{name}") / "proj")
    metrics = _train_all(root, {"train.conversion": "prune_mlp", "train.steps": 3})
    for m in metrics.values():
        assert m["status"] == "done" and m["steps"] == 3 and np.isfinite(m["train_loss"])
    assemble(project_of(root), layout=Layout(root))
    return name, root


def test_prune_mlp_trains_assembles_loads_and_generates(pruned):
    from transformers import AutoModelForCausalLM

    from zgtrain.block.load import load_block

    name, root = pruned
    layout = Layout(root)
    width = read_json(layout.teacher_json)["architecture"]["intermediate_size"]
    summary = read_json(layout.student / "zerograph.json")
    assert summary["intermediate_sizes"] == [width // 2] * 4 and summary["remote_code"] is False
    assert summary["param_ratio"] < 1
    model = AutoModelForCausalLM.from_pretrained(layout.student).eval()
    fam = family_of(model.config)
    assert type(model) is fam.causal_lm() and fam.width(model.config) == width // 2
    # the assembled layers are the trained blocks' weights, renumbered
    state = model.state_dict()
    for key, first in (("b00", 0), ("b01", 2)):
        block, _ = load_block(layout, key)
        for k, v in block.weights().items():
            _, j, rest = k.split(".", 2)
            assert torch.equal(state[fam.layer_key(first + int(j), rest)], v), (key, k)
    prompt = _heldout_ids(layout, 1)[:, :8]
    out = model.generate(prompt, max_new_tokens=4, min_new_tokens=4, do_sample=False)
    assert out.shape == (1, 12) and torch.equal(out[:, :8], prompt)


def test_evaluate_runs_the_family_student_and_its_boundary_shift(pruned, tmp_path):
    from zgtrain.evaluate.run import evaluate

    name, src = pruned
    root = copy_project(src, tmp_path / "proj")
    set_params(root, {"eval.heldout_seqs": 2, "eval.context_targets": 8})  # small: the CE figures are not the point
    m = evaluate(project_of(root), layout=Layout(root))
    assert set(m.shift) == {"b00", "b01"}
    assert all(np.isfinite(v) and v >= 0 for s in m.shift.values() for v in s.values())
    # b00's upstream is boundary 0 in both cases: the head slice's embedding equals the teacher's
    assert m.shift["b00"]["student_input"] == pytest.approx(m.shift["b00"]["teacher_input"], rel=1e-2)
    assert np.isfinite(m.student_ce) and np.isfinite(m.teacher_ce)
    assert m.shift == _shift_by_definition(root)


def _shift_by_definition(root) -> dict:
    """Each block's boundary shift recomputed from its definition on evaluate's held-out rows: the block's
    normalized error against teacher boundary k+1 when fed teacher boundary k, and when fed the student's own
    upstream (the embedding, then every earlier block in turn). A swap of the two inputs, or a chain that restarts
    from the teacher's boundary, changes the figures of every block after the first."""
    from zgdata.materialize.virtual import open_pair_in
    from zgdata.teacher.prepare import load_slice
    from zgdata.tokens.store import read_tokens
    from zgtrain.block.load import load_block
    from zgtrain.block.objectives import nmse
    from zgtrain.evaluate.sets import heldout_set

    layout, project = Layout(root), project_of(root)
    _, rows = heldout_set(layout, project.eval.heldout_seqs)
    head, meta = load_slice(layout.teacher_head)
    with torch.no_grad():
        upstream = family_of(meta["config"]).embed_head(
            {k: v.float() for k, v in head.items()}, read_tokens(layout, rows)[0]
        )
        out = {}
        for spec in project.partition.blocks():
            block, _ = load_block(layout, spec.key)
            x, y = (ds.take(rows).float() for ds in open_pair_in(layout, spec, project.partition, project.materialize))
            upstream = block(upstream)
            (fed_teacher, d), (fed_student, _) = nmse(block(x), y), nmse(upstream, y)
            out[spec.key] = {"teacher_input": fed_teacher / d, "student_input": fed_student / d}
    return out


def test_per_layer_widths_ship_the_family_modeling_file(pruned, tmp_path):
    from zgtrain.block.load import load_block
    from zgtrain.student.assemble import assemble
    from zgtrain.student.load import load_student, modeling_file, template_sha256

    name, src = pruned
    root = copy_project(src, tmp_path / "proj")
    layout = Layout(root)
    _train_all(root, {"blocks.b01.prune_ratio": 0.75}, keys=("b01",))
    assemble(project_of(root), layout=layout)
    summary = read_json(layout.student / "zerograph.json")
    width = read_json(layout.teacher_json)["architecture"]["intermediate_size"]
    assert summary["remote_code"] is True and summary["family"] == name
    assert summary["intermediate_sizes"] == [width // 2] * 2 + [width // 4] * 2
    assert sorted(p.name for p in layout.student.glob("*.py")) == [modeling_file(name)]
    assert summary["modeling_sha256"] == template_sha256(name)
    model = load_student(layout.student)
    assert type(model).__name__ == f"Zg{family(name).model_class}"
    state = model.state_dict()
    block, _ = load_block(layout, "b01")
    for k, v in block.weights().items():
        _, j, rest = k.split(".", 2)
        assert torch.equal(state[family_of(model.config).layer_key(2 + int(j), rest)], v), k
    out = model.generate(torch.zeros(1, 4, dtype=torch.long), max_new_tokens=2, min_new_tokens=2, do_sample=False)
    assert out.shape == (1, 6)


def test_cached_and_online_targets_are_bitwise_identical(built, tmp_path):
    """b01 ends at the last boundary (before the final norm): online capture must stop there too."""
    from zgtrain.block.train import train_block

    _, src = built
    root = copy_project(src, tmp_path / "proj")
    params = set_params(root, {"train.steps": 3, "train.objective": "noisy_regress"})
    layout = Layout(root)
    cached = train_block(project_of(params), "b01", layout=layout)
    shutil.rmtree(root / "data" / "boundaries")  # online can only get its pairs from the teacher
    online = train_block(project_of(params), "b01", targets="online", restart=True, layout=layout)
    assert (cached.targets, online.targets) == ("cached", "online")
    assert online.state_sha256 == cached.state_sha256 and online.heldout_loss == cached.heldout_loss


@pytest.mark.parametrize("name", sorted(SOURCES))
def test_conversions_use_the_family_layout(name):
    """Pure tensors, no project: prune_mlp equals the full block with the dropped MLP channels silenced (GPT-2's
    Conv1D (in, out) weights and biases included); drop_layers and reinit know the family's layers and norms."""
    from zgdata.teacher.prepare import tiny_teacher
    from zgtrain.block.conversions import convert
    from zgtrain.project.config import TrainConfig

    model, _ = tiny_teacher(name)
    fam, config = family_of(model.config), model.config
    layers, _ = fam.split_state(model.state_dict())
    tensors = {f"layers.{i}.{k}": v for i in (1, 2) for k, v in layers[i].items()}
    x = torch.randn(2, 12, config.hidden_size, generator=torch.Generator().manual_seed(0))
    cfg = TrainConfig(conversion="prune_mlp", prune_ratio=0.75)
    full = convert("identity", tensors, config, cfg, x, torch.Generator()).eval()
    pruned = convert("prune_mlp", tensors, config, cfg, x, torch.Generator()).eval()
    width = fam.width(config)
    assert pruned.intermediate_sizes == [width // 4] * 2
    masks = []
    with torch.no_grad():
        for act in full.mlp_activations(x):
            keep = torch.sort(-act.abs().double().mean(dim=(0, 1)), stable=True).indices[: width // 4]
            masks.append(torch.zeros(width).index_fill_(0, keep, 1.0))
        hooks = [
            layer.get_submodule(fam.mlp_out).register_forward_pre_hook(lambda m, a, mask=mask: (a[0] * mask,))
            for layer, mask in zip(full.layers, masks)
        ]
        try:
            silenced = full(x)
        finally:
            for h in hooks:
                h.remove()
        assert torch.allclose(pruned(x), silenced, rtol=1e-4, atol=1e-5)
        assert not torch.allclose(full(x), silenced, rtol=1e-4, atol=1e-5)
    if name == "gpt2":
        w = pruned.weights()
        assert w["layers.0.mlp.c_fc.weight"].shape == (config.hidden_size, width // 4)
        assert w["layers.0.mlp.c_fc.bias"].shape == (width // 4,)
        assert w["layers.0.mlp.c_proj.weight"].shape == (width // 4, config.hidden_size)
        assert torch.equal(w["layers.0.mlp.c_proj.bias"], tensors["layers.1.mlp.c_proj.bias"])

    dropped = convert("drop_layers", tensors, config, TrainConfig(keep_layers=[1]), x, torch.Generator())
    assert dropped.weights().keys() == {f"layers.0.{k}" for k in layers[2]}
    assert dropped.layer_types == fam.layer_types(config, [2])  # Gemma 3: the kept layer's own type (full)
    assert all(torch.equal(v, tensors[f"layers.2.{k.split('.', 2)[2]}"]) for k, v in dropped.weights().items())
    fresh = convert("reinit", tensors, config, TrainConfig(), x, torch.Generator().manual_seed(1))
    norms = {n: p for n, p in fresh.named_parameters() if fam.is_layer_norm(n)}
    # 2 layers x the family's norms' parameters (GPT-2's and StarCoder2's LayerNorms have biases; OLMo 2 norms q and
    # k too; OLMo's LayerNorm has no parameters at all)
    per_layer = sum(1 for n, _ in fam.layers(model)[0].named_parameters() if fam.is_layer_norm(n))
    assert len(norms) == 2 * per_layer and (per_layer >= 2 or name == "olmo")
    assert per_layer == len(fam.layer_norms) * (2 if name in ("gpt2", "starcoder2", "phi") else 1)
    one = fam.norm_identity  # Gemma's norms scale by 1 + w
    assert all(torch.equal(p, torch.full_like(p, one if n.endswith("weight") else 0.0)) for n, p in norms.items())


def _save_model_dir(path, config) -> None:
    from transformers import AutoModelForCausalLM

    from zgdata.teacher.tokenizer import byte_level_tokenizer

    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(path)
    byte_level_tokenizer().save_pretrained(path)


def test_a_declared_family_variant_zg_cannot_capture_is_refused_at_teacher_prepare(tmp_path):
    """A Qwen2 checkpoint with sliding-window layers: its record refuses it (decoders without a record are verified
    instead: tests/zgdata/teacher/test_verified_families.py)."""
    from transformers import Qwen2Config

    from zgtrain.pipeline.profiles import profile_params
    from zgtrain.pipeline.stages import dump_params

    teacher = tmp_path / "teacher"
    _save_model_dir(
        teacher,
        Qwen2Config(
            vocab_size=257,
            hidden_size=32,
            num_hidden_layers=4,
            num_attention_heads=4,
            num_key_value_heads=2,
            intermediate_size=64,
            use_sliding_window=True,
            sliding_window=16,
            max_window_layers=2,
        ),
    )
    needles = ("sliding-window", "use_sliding_window: false")
    root = tmp_path / "proj"  # prepare needs only params.yaml: write the tiny profile's, as `zg init` does
    root.mkdir()
    (root / "params.yaml").write_text(dump_params(profile_params("tiny")))
    set_params(root, {"teacher.source": str(teacher)})
    before = tree_sha256(root)
    res = zg_main("teacher", "prepare", cwd=root, check=False)
    assert_user_error(res, "teacher.source", *needles)
    assert tree_sha256(root) == before and not (root / "models").exists()


@pytest.mark.parametrize(
    ("config_class", "needles"),
    [
        ("PhimoeConfig", ("'phimoe' is a mixture-of-experts decoder zg has no record of", "Mixtral, Qwen2-MoE")),
        ("GraniteMoeConfig", ("'granitemoe' is a mixture-of-experts decoder",)),
        ("DbrxConfig", ("'dbrx' is a mixture-of-experts decoder", "a Moe entry")),
        ("JambaConfig", ("'jamba' is a hybrid attention + state-space decoder", "recurrent state")),
        ("FalconH1Config", ("'falcon_h1' is a hybrid attention + state-space decoder",)),
        ("T5Config", ("'t5' is an encoder-decoder", "zgdata/families/capture.py")),
    ],
)
def test_unsupported_kinds_are_refused_with_what_and_where(tmp_path, config_class, needles):
    """MoE, hybrid attention+SSM and encoder-decoder checkpoints stop at config.json, before any weight is read:
    one line naming what the model is and where support would go."""
    import transformers

    from zgtrain.pipeline.profiles import profile_params
    from zgtrain.pipeline.stages import dump_params

    teacher = tmp_path / "teacher"
    getattr(transformers, config_class)().save_pretrained(teacher)  # config.json only: refused before weights
    root = tmp_path / "proj"
    root.mkdir()
    (root / "params.yaml").write_text(dump_params(profile_params("tiny")))
    set_params(root, {"teacher.source": str(teacher)})
    res = zg_main("teacher", "prepare", cwd=root, check=False)
    assert_user_error(res, "teacher.source", "zg does not support it", "support would go in", *needles)
    assert not (root / "models").exists()


@pytest.mark.parametrize("name", ["mistral", "gemma2", "gemma3_text"])
def test_a_sequence_beyond_the_sliding_window_gets_the_models_own_mask(name):
    """The tiny teachers' windows (16) are shorter than the matrix's sequences (64), so the matrix runs the window
    path; here it is pinned down on 24 tokens: capture and an identity student block give the model's own
    hidden states bit for bit, and a layer run without the window's mask would not (position 16 would see
    position 0)."""
    from zgdata.families.capture import capture
    from zgdata.teacher.prepare import tiny_teacher
    from zgtrain.block.conversions import convert
    from zgtrain.project.config import TrainConfig

    model, _ = tiny_teacher(name)
    model = model.eval()
    model.config._attn_implementation = family(name).attn_implementation
    fam = family_of(model.config)
    ids = torch.randint(0, model.config.vocab_size, (2, 24), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        hs = model(ids, output_hidden_states=True).hidden_states
        got = capture(model, ids, [0, 1, 2], storage_dtype=torch.float32)
        assert all(torch.equal(got[k], hs[k]) for k in (0, 1, 2))
        layers, _ = fam.split_state(model.state_dict())
        tensors = {f"layers.{i}.{k}": v for i in (0, 1) for k, v in layers[i].items()}
        block = convert("identity", tensors, model.config, TrainConfig(), hs[0], torch.Generator()).eval()
        assert torch.equal(block(hs[0]), hs[2])
        inputs = fam.layer_inputs(model.model.rotary_emb, hs[0])
        first = model.model.layers[0]  # a sliding layer in every one of these tiny teachers
        assert inputs["masks"][getattr(first.self_attn, "layer_type", None)] is not None
        # the causal mask, given as a mask (sdpa's full layers get None and run is_causal: another kernel path, whose
        # last bits differ from the masked one's on torch 2.6), so both runs differ in the window alone
        causal = inputs["masks"].get("full_attention")  # Gemma 2's eager: the causal mask
        if causal is None:
            causal = torch.ones(24, 24, dtype=torch.bool).tril()[None, None]
        unmasked = fam.call_layer(first, hs[0], {**inputs, "masks": dict.fromkeys(inputs["masks"], causal)})
        assert torch.equal(unmasked[:, :16], hs[1][:, :16])
        assert not torch.allclose(unmasked[:, 16:], hs[1][:, 16:], rtol=1e-4, atol=1e-5)


def test_an_unknown_variant_of_a_known_family_is_refused(tmp_path):
    """What zg derives from the loaded model is checked at `zg teacher prepare`: a layer class that is not the
    family's own (here a subclass of it, as remote code might bring) is one line; so is a Gemma 3 config asking for attention
    soft-capping, which sdpa capture would silently drop."""
    from transformers import Gemma3TextConfig
    from transformers.models.mistral.modeling_mistral import MistralDecoderLayer

    from zgdata.errors import ZgError
    from zgdata.teacher.prepare import tiny_teacher
    from zgtrain.pipeline.profiles import profile_params
    from zgtrain.pipeline.stages import dump_params

    model, _ = tiny_teacher("mistral")
    family_of(model.config).check_model(model)  # the stock model passes
    model.model.layers[1] = type("VariantLayer", (MistralDecoderLayer,), {})(model.config, layer_idx=1)
    with pytest.raises(ZgError, match="not the MistralForCausalLM layout zg captures") as e:
        family_of(model.config).check_model(model)
    assert e.value.key == "teacher.source" and "\n" not in str(e.value)

    teacher = tmp_path / "teacher"
    _save_model_dir(
        teacher,
        Gemma3TextConfig(
            vocab_size=257,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=2,
            num_key_value_heads=1,
            head_dim=16,
            attn_logit_softcapping=50.0,
        ),
    )
    root = tmp_path / "proj"
    root.mkdir()
    (root / "params.yaml").write_text(dump_params(profile_params("tiny")))
    set_params(root, {"teacher.source": str(teacher), "partition.boundaries": [0, 1, 2]})
    res = zg_main("teacher", "prepare", cwd=root, check=False)
    assert_user_error(res, "teacher.source", "soft-caps attention logits", "attn_logit_softcapping")
    assert not (root / "models").exists()


def test_a_student_with_a_dropped_layer_round_trips(pruned, tmp_path):
    """b00 keeps only teacher layer 1 (drop_layers, no steps) beside b01's pruned pair: three layers of two widths,
    through zg's modeling file; each layer keeps its teacher layer's attention type (Gemma) and weights."""
    from zgdata.teacher.prepare import load_teacher
    from zgtrain.student.assemble import assemble
    from zgtrain.student.load import load_student

    name, src = pruned
    root = copy_project(src, tmp_path / "proj")
    layout = Layout(root)
    _train_all(
        root,
        {"blocks.b00.conversion": "drop_layers", "blocks.b00.keep_layers": [1], "blocks.b00.steps": 0},
        keys=("b00",),
    )
    assemble(project_of(root), layout=layout)
    width = read_json(layout.teacher_json)["architecture"]["intermediate_size"]
    assert read_json(layout.student / "zerograph.json")["intermediate_sizes"] == [width, width // 2, width // 2]
    model = load_student(layout.student)
    teacher, _ = load_teacher(layout, with_tokenizer=False)
    fam = family_of(teacher.config)
    types = getattr(teacher.config, "layer_types", None)
    assert getattr(model.config, "layer_types", None) == (types and [types[i] for i in (1, 2, 3)])
    got, want = fam.split_state(model.state_dict())[0][0], fam.split_state(teacher.state_dict())[0][1]
    assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in got)
    out = model.generate(torch.zeros(1, 4, dtype=torch.long), max_new_tokens=2, min_new_tokens=2, do_sample=False)
    assert out.shape == (1, 6)
