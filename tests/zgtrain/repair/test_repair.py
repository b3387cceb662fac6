"""The optional repair stage: global distillation of the assembled student on the teacher's
logits, rebuilt from the head slice and the last stored boundary.

Everything runs on the real tiny project: a student assembled from two briefly trained blocks, real Lance
boundaries, the real `zg` CLI in subprocesses for the runs whose bits are compared. The reference is one
straight `zg train repair` with the tiny profile's repair params and ``repair.steps: 12`` (checkpoint every 4).
"""

from __future__ import annotations

import csv
import json

import pytest
import torch
from safetensors.torch import load_file

from tests.helpers.assertions import assert_user_error
from tests.helpers.llama_cpp_run import assert_close_to_f32, llama_cpp_logits, llama_cpp_model
from tests.helpers.models import student_logits
from tests.helpers.projects import copy_project, project_of, read_json, set_params, tree_sha256
from tests.helpers.runners import kill_after_first_checkpoint, zg_main
from zgdata.layout import Layout
from zgtrain.pipeline.profiles import profile_params
from zgtrain.pipeline.stages import dvc_yaml
from zgtrain.project.config import ProjectConfig

STEPS = 12


def _repair_json(root, *args, env=None) -> dict:
    return json.loads(zg_main("train", "repair", "--json", *args, cwd=root, env=env).stdout)


def _curve(root) -> str:
    return (root / "plots" / "loss" / "repair.csv").read_text()


@pytest.fixture(scope="module")
def assembled(tiny_built, tmp_path_factory):
    """The tiny project with both blocks briefly trained (2 steps: a student with a gap left to repair), the
    student assembled and repair turned on (``repair.steps: 12``). b00 keeps more MLP channels than b01, so
    the student has per-layer widths and ships zg's pinned modeling file, which models/repaired must keep."""
    root = copy_project(tiny_built, tmp_path_factory.mktemp("assembled") / "proj")
    set_params(root, {"train.steps": 2, "train.warmup": 1, "train.checkpoint_every": 0, "blocks.b00.prune_ratio": 0.25})
    for key in ("b00", "b01"):
        zg_main("train", "block", key, cwd=root)
    zg_main("train", "assemble", cwd=root)
    set_params(root, {"repair.steps": STEPS})
    return root


@pytest.fixture(scope="module")
def straight(assembled, tmp_path_factory):
    """One uninterrupted `zg train repair`: (project, `--json` result)."""
    root = copy_project(assembled, tmp_path_factory.mktemp("straight") / "proj")
    res = _repair_json(root)
    assert res["status"] == "done" and res["step"] == res["steps"] == STEPS
    return root, res


def test_repair_lowers_the_training_kl_and_writes_a_loadable_model(straight):
    root, res = straight
    # the real, checkable effect: KL(teacher || student) on train rows falls, and on held-out rows too
    assert res["kl_train_after"] < 0.95 * res["kl_train_before"], res
    assert res["kl_heldout_after"] < res["kl_heldout_before"], res
    metrics = read_json(root / "metrics" / "repair.json")
    assert metrics["state_sha256"] == res["state_sha256"] and metrics["kl_train_after"] == res["kl_train_after"]
    assert _curve(root).splitlines()[0] == "step,loss" and len(_curve(root).splitlines()) == STEPS + 1

    from zgtrain.student.load import load_student

    student, repaired = load_student(root / "models" / "student"), load_student(root / "models" / "repaired")
    a, b = student.state_dict(), repaired.state_dict()
    assert a.keys() == b.keys() and any(not torch.equal(a[k], b[k]) for k in a)
    assert (root / "models" / "repaired" / "modeling_zg_dense.py").read_bytes() == (
        root / "models" / "student" / "modeling_zg_dense.py"
    ).read_bytes()
    assert (
        read_json(root / "models" / "repaired" / "config.json")["auto_map"]
        == read_json(root / "models" / "student" / "config.json")["auto_map"]
    )
    summary = read_json(root / "models" / "repaired" / "zerograph.json")
    assert summary["repair"]["state_sha256"] == res["state_sha256"]
    assert summary["repair"]["student_sha256"] == res["student_sha256"]
    assert sorted(p.name for p in (root / "models" / "repair").iterdir()) == [
        "ckpt-000012",
        "meta.json",
        "model.safetensors",
    ]


def test_lora_trains_only_adapters_and_merges_them_into_a_plain_model(assembled, tmp_path):
    from safetensors.torch import load_file

    from zgtrain.repair.train import repair
    from zgtrain.student.load import load_student

    root = copy_project(assembled, tmp_path / "proj")
    set_params(root, {"repair.trainable": "lora", "repair.lr": 1e-3})
    res = repair(project_of(root), layout=Layout(root))
    assert res.status == "done" and res.kl_train_after < res.kl_train_before, res
    assert (
        0
        < res.trainable_params
        < res.params
        == sum(v.numel() for v in load_file(str(root / "models" / "student" / "model.safetensors")).values())
    )
    a = load_file(str(root / "models" / "student" / "model.safetensors"))
    b = load_file(str(root / "models" / "repaired" / "model.safetensors"))
    assert a.keys() == b.keys()  # adapters merged: no lora_* tensors, a plain (pinned-code) student folder
    changed = {k for k in a if not torch.equal(a[k], b[k])}
    assert "model.layers.0.self_attn.q_proj.weight" in changed
    assert all(k.endswith("proj.weight") for k in changed), changed  # embeddings and norms untouched
    load_student(root / "models" / "repaired")


def test_head_slice_on_the_last_boundary_is_the_teachers_logits(straight):
    """The repair targets need no teacher forward: final norm + LM head of the head slice on the stored last
    boundary give the teacher's own logits up to the boundary's bf16 rounding, far closer than the student."""
    from zgdata.teacher.prepare import load_slice, load_teacher
    from zgtrain.repair.model import TeacherHead, token_kl
    from zgtrain.repair.train import RepairData
    from zgtrain.student.load import load_student

    root, _ = straight
    layout = Layout(root)
    data = RepairData(layout, "h04")
    ids, mask, h = data.take(data.rows("train")[:4])
    assert mask.all()
    teacher, _ = load_teacher(layout, with_tokenizer=False)
    student = load_student(layout.student)
    head, _ = load_slice(layout.teacher_head)
    with torch.no_grad():
        ref = teacher(input_ids=ids).logits.float()
        kl_head = float(token_kl(TeacherHead(head, student)(h), ref).mean())
        kl_student = float(token_kl(student(input_ids=ids).logits.float(), ref).mean())
    assert kl_head < 1e-4 and kl_head < kl_student / 100, (kl_head, kl_student)


def test_kill_9_between_checkpoints_then_resume_is_bitwise_identical(straight, assembled, tmp_path):
    ref_root, ref = straight
    root = copy_project(assembled, tmp_path / "proj")
    meta_path = root / "models" / "repair" / "meta.json"
    kill_after_first_checkpoint(["train", "repair"], root, meta_path, tmp_path / "killed.stderr")
    meta = read_json(meta_path)
    assert meta["done"] is False and 0 < meta["step"] < STEPS
    assert not (root / "models" / "repaired").exists()  # nothing published by the killed run

    resumed = _repair_json(root)
    assert resumed["status"] == "done" and resumed["state_sha256"] == ref["state_sha256"]
    assert resumed["kl_train_before"] == ref["kl_train_before"] and resumed["kl_train_after"] == ref["kl_train_after"]
    assert _curve(root) == _curve(ref_root)
    assert (
        load_file(str(root / "models" / "repaired" / "model.safetensors")).keys()
        == load_file(str(ref_root / "models" / "repaired" / "model.safetensors")).keys()
    )
    assert (root / "models" / "repaired" / "model.safetensors").read_bytes() == (
        ref_root / "models" / "repaired" / "model.safetensors"
    ).read_bytes()


def test_resume_with_changed_config_is_refused_unless_restart(assembled, tmp_path):
    from zgtrain.repair.train import repair

    root = copy_project(assembled, tmp_path / "proj")
    stopped = repair(project_of(root), stop_after=2, layout=Layout(root))
    assert stopped.status == "stopped" and stopped.step == 2
    set_params(root, {"repair.temperature": 1.0})
    before = tree_sha256(root / "models")
    res = zg_main("train", "repair", cwd=root, check=False)
    assert_user_error(res, "models/repair", "config", "--restart")
    assert tree_sha256(root / "models") == before
    # checkpoint_every does not change the trained bits: a resume may change it
    set_params(root, {"repair.temperature": 2.0, "repair.checkpoint_every": 5})
    assert _repair_json(root, "--stop-after", "1")["step"] == 3


def test_evaluate_scores_the_repaired_model_and_gates_it(straight, tmp_path):
    root = copy_project(straight[0], tmp_path / "proj")
    res = zg_main("train", "evaluate", cwd=root)
    ev = read_json(root / "metrics" / "eval.json")
    rep = ev["repaired"]
    assert ev["gated_model"] == "repaired"
    # the summary line gives the figures of the model the gates judged (it gave the student's beside their verdict)
    summary = next(line for line in (res.stdout + res.stderr).splitlines() if line.startswith("gates "))
    assert summary.startswith(f"gates {'PASS' if ev['gates_passed']['all'] else 'FAIL'} (repaired): "), summary
    assert f"repaired CE {rep['ce']:.3f} (gap {rep['ce_gap']:.3f})" in summary, summary
    assert ev["gates_passed"]["heldout"]["max_ce_gap"]["value"] == rep["ce_gap"] == rep["ce"] - ev["teacher_ce"]
    assert ev["student_gates_passed"]["heldout"]["max_ce_gap"]["value"] == ev["ce_gap"]
    for name, f in rep["sets"].items():  # every eval set scores the repaired model, and its gates judge it
        assert ev["gates_passed"][name]["max_ce_gap"]["value"] == f["ce_gap"]
        assert f["ce_gap"] == f["ce"] - ev["sets"][name]["teacher_ce"]
    assert set(rep["sets"]) == set(ev["sets"]) and rep["sets"]["heldout"]["ce"] == rep["ce"]
    assert rep["ce"] != ev["student_ce"]
    # the plots carry the repaired model: a column per set in sets.csv, a row in ce.csv (6 decimals)
    rows = {r["set"]: r for r in csv.DictReader(open(root / "plots" / "eval" / "sets.csv"))}
    assert {n: float(r["repaired_ce"]) for n, r in rows.items()} == pytest.approx(
        {n: f["ce"] for n, f in rep["sets"].items()}, abs=5e-7
    )
    ces = {r["model"]: float(r["ce"]) for r in csv.DictReader(open(root / "plots" / "eval" / "ce.csv"))}
    assert ces["repaired"] == pytest.approx(rep["ce"], abs=5e-7)
    # the generation check shows the repaired model's continuations beside the student's
    gen = ev["generation"]
    report = (root / "reports" / "generation.md").read_text()
    assert report.count("| prompt | teacher | student | repaired |") == gen["prompts"] > 0
    assert 0 <= gen["repaired_matching_prefix_mean"] <= gen["new_tokens"]
    # a repaired model of another student is refused, nothing published is touched
    (root / "models" / "student" / "zerograph.json").write_text("{}\n")
    before = tree_sha256(root / "metrics")
    assert_user_error(zg_main("train", "evaluate", cwd=root, check=False), "models/repaired", "another student")
    assert tree_sha256(root / "metrics") == before


def test_repair_is_off_by_default_and_its_stage_appears_only_when_on(tiny_project):
    for profile in ("smollm2", "tiny"):
        params = profile_params(profile)
        assert params["repair"]["steps"] == 0
        stages = dvc_yaml(ProjectConfig.from_params(params), code_deps=True)["stages"]
        assert "repair" not in stages and "models/repaired" not in stages["evaluate"]["deps"]
        assert stages["evaluate"]["params"] == ["eval", "gates"]
    res = zg_main("train", "repair", cwd=tiny_project, check=False)
    assert_user_error(res, "repair.steps")

    params = profile_params("tiny")
    params["repair"]["steps"] = 5
    stages = dvc_yaml(ProjectConfig.from_params(params), code_deps=False)["stages"]
    assert list(stages)[-2:] == ["repair", "evaluate"]
    assert stages["repair"]["deps"] == [
        "models/student",
        "models/teacher/blocks/head.safetensors",
        "data/boundaries/h04.lance",
        "data/tokens.lance",
        "data/tokens.json",
    ]
    assert stages["repair"]["outs"] == ["models/repair", "models/repaired"]
    assert "models/repaired" in stages["evaluate"]["deps"] and "repair.steps" in stages["evaluate"]["params"]


def test_bad_repair_params_name_their_key(tiny_project):
    from zgdata.errors import ZgError

    for key, value in [
        ("repair.temperature", 0),
        ("repair.trainable", "bogus"),
        ("repair.lora_rank", 0),
        ("repair.ce_weight", -1),
        ("repair.lr", "fast"),
        ("repair.nope", 1),
    ]:
        params = profile_params("tiny")
        params["repair"][key.split(".")[1]] = value
        with pytest.raises(ZgError) as e:
            project_of(params)
        assert e.value.key == ("repair" if key == "repair.nope" else key), key
    # and through the CLI: one line, before anything is written
    set_params(tiny_project, {"repair.steps": -3})
    before = tree_sha256(tiny_project)
    assert_user_error(zg_main("train", "repair", cwd=tiny_project, check=False), "repair.steps", alone=True)
    assert tree_sha256(tiny_project) == before


def test_divergence_is_one_error_and_keeps_the_last_good_checkpoint(assembled, tmp_path):
    from zgdata.errors import ZgError
    from zgtrain.repair.train import repair

    root = copy_project(assembled, tmp_path / "proj")
    set_params(root, {"repair.lr": 1e30, "repair.warmup": 0})
    with pytest.raises(ZgError, match="last good checkpoint .step 0. is intact") as e:
        repair(project_of(root), layout=Layout(root))
    assert e.value.key == "repair.lr"
    assert read_json(root / "models" / "repair" / "meta.json")["step"] == 0
    assert not (root / "models" / "repaired").exists() and not (root / "metrics" / "repair.json").exists()


def test_the_repaired_student_leaves_zg_as_gguf_and_runs_in_llama_cpp(straight, tmp_path):
    """`zg export repaired`: its per-layer MLP widths (b00 keeps more channels) are refused by the stock hf format in
    one line with nothing written, and go to llama.cpp's deci architecture as GGUF, whose logits in llama.cpp match
    the repaired student's; export.json names models/repaired and its sha256."""
    from zgdata.tokens.store import read_tokens
    from zgtrain.student.load import student_sha256

    root = copy_project(straight[0], tmp_path / "proj")
    res = zg_main("export", "repaired", "--format", "hf", cwd=root, check=False)
    assert_user_error(res, "MLP width", "--format gguf")
    assert not (root / "models" / "export").exists()
    zg_main("export", "repaired", "--format", "gguf", "--dtype", "f32", cwd=root)
    out = root / "models" / "export" / "repaired-f32"
    record = read_json(out / "export.json")
    repaired = root / "models" / "repaired"
    assert record["student"] == "models/repaired" and record["student_sha256"] == student_sha256(repaired)
    sizes = read_json(repaired / "zerograph.json")["intermediate_sizes"]
    assert len(set(sizes)) > 1 and record["info"]["arch"] == "deci" and record["info"]["n_ff"] == sizes
    ids = read_tokens(Layout(root), [0])[0][0, :32].tolist()
    assert_close_to_f32(
        llama_cpp_logits(llama_cpp_model(out / "repaired.gguf"), ids), student_logits(repaired, ids), repaired
    )


def test_the_repair_loss_is_hintons_kl_teacher_to_student_plus_weighted_ce():
    """token_kl is KL(teacher || student) of the softmaxes at T, recomputed from its definition; distill_loss is
    T^2 x its mean over real positions plus ce_weight x the next-token CE over real targets (the direction and
    the T^2 factor were untested: both losses still fell with either wrong)."""
    from zgtrain.repair.model import distill_loss, token_kl

    g = torch.Generator().manual_seed(0)
    s, t = (3 * torch.randn(2, 5, 11, generator=g, dtype=torch.float64) for _ in range(2))
    ids = torch.randint(0, 11, (2, 5), generator=g)
    mask = torch.tensor([[True] * 5, [True, True, True, False, False]])
    for temp in (1.0, 2.0):
        ps, pt = torch.softmax(s / temp, -1), torch.softmax(t / temp, -1)
        want = (pt * (pt.log() - ps.log())).sum(-1)
        assert torch.allclose(token_kl(s, t, temp), want, rtol=1e-12, atol=1e-15)
        assert not torch.allclose(token_kl(s, t, temp), (ps * (ps.log() - pt.log())).sum(-1), rtol=1e-3)
        for w in (0.0, 0.5):
            kl = want[mask].mean()
            logp = torch.log_softmax(s[:, :-1], -1).gather(-1, ids[:, 1:, None])[..., 0]
            ce = -logp[mask[:, 1:]].mean()
            got = distill_loss(s, t, ids, mask, temperature=temp, ce_weight=w)
            assert torch.allclose(got, temp**2 * kl + w * ce, rtol=1e-12), (temp, w)


def test_a_merged_lora_adapter_computes_what_the_adapter_did():
    """LoRALinear's output is base(x) + scale * B A x (scale = alpha / rank); merging folds scale * B A into the
    base weight, so the merged nn.Linear gives the adapter's output (the repaired model is the trained one). B is
    set non-zero, as after training, and alpha / rank = 4 so a dropped scale shows."""
    from torch import nn

    from zgtrain.repair.model import LoRALinear

    g = torch.Generator().manual_seed(0)
    base = nn.Linear(12, 10, dtype=torch.float64)
    lora = LoRALinear(base, rank=2, alpha=8.0, gen=g)
    with torch.no_grad():
        lora.lora_b.copy_(torch.randn(10, 2, generator=g, dtype=torch.float64))
    x = torch.randn(5, 12, generator=g, dtype=torch.float64)
    with torch.no_grad():
        want = base(x) + 4.0 * (x @ lora.lora_a.T @ lora.lora_b.T)
        assert torch.allclose(lora(x), want, rtol=1e-12, atol=1e-12)
        merged = lora.merged()
        assert type(merged) is nn.Linear
        assert torch.allclose(merged(x), want, rtol=1e-12, atol=1e-12)


def test_trainable_norms_are_every_layers_norms_and_the_final_norm():
    """repair.trainable: norms trains the RMSNorm weights and nothing else: both norms of every decoder layer and
    the final norm before the head (the teacher's logits go through it too); embeddings, attention and MLP stay
    frozen."""
    from tests.helpers.models import tiny_family_teacher
    from zgtrain.repair.model import RepairModel

    lm = tiny_family_teacher("llama")
    norms = {f"lm.{n}" for n, _ in lm.named_parameters() if "norm" in n.split(".")[-2]}
    assert len(norms) == 2 * lm.config.num_hidden_layers + 1 and "lm.model.norm.weight" in norms
    model = RepairModel(lm, "norms")
    assert set(model.weights()) == norms
    assert {n for n, p in model.named_parameters() if p.requires_grad} == norms
