"""The DVC pipeline end to end: real `zg init`, git and `dvc repro` in temporary repos, tiny profile.

One project is reproduced once per run (``reproduced``, tests/conftest.py); this module works on its own copy
(the module-scoped ``reproduced`` below): tests that change it work on a further copy, except the two
selective-rerun tests, which edit params of the module's project and reproduce it again (they leave it
reproduced and clean).
"""

from __future__ import annotations

import json
import re
import shutil

import lance
import pytest
import torch

from tests.helpers.assertions import assert_user_error
from tests.helpers.projects import PIPELINE_STAGES as STAGES
from tests.helpers.projects import copy_project, load_params_of, project_of, read_json, set_params, tree_sha256
from tests.helpers.runners import run, zg_main
from zgdata.layout import Layout


@pytest.fixture(scope="module")
def reproduced(reproduced, tmp_path_factory):
    """This module's copy of the session's reproduced project: its selective-rerun tests edit it in place."""
    return copy_project(reproduced, tmp_path_factory.mktemp("pipeline_module") / "proj")


def _ran(output: str) -> list[str]:
    return re.findall(r"Running stage '([^']+)'", output)


def _status(root) -> dict:
    return json.loads(run(["dvc", "status", "--json"], cwd=root).stdout or "{}")


def _repro(root) -> list[str]:
    res = run(["dvc", "repro"], cwd=root)
    return _ran(res.stdout + res.stderr)


def test_repro_writes_eval_metrics(reproduced):
    m = read_json(reproduced / "metrics" / "eval.json")
    for k in (
        "teacher_ce",
        "student_ce",
        "ce_gap",
        "ce_recovered",
        "teacher_context_use",
        "student_context_use",
        "context_retention",
        "shift",
        "gates_passed",
    ):
        assert k in m, k
    assert m["ce_gap"] == m["student_ce"] - m["teacher_ce"]
    assert set(m["shift"]) == {"b00", "b01"}
    for v in m["shift"].values():
        assert set(v) == {"teacher_input", "student_input"} and all(x >= 0 for x in v.values())
    gates = m["gates_passed"]
    assert set(gates) == {"all", "heldout", "docs"}  # the tiny profile's sets: in-domain + embedded:docs
    held = gates["heldout"]
    assert held["judged"] is True and gates["docs"]["judged"] is False  # gates.sets defaults to [heldout]
    assert set(held) == {"all", "judged", "max_ce_gap", "min_context_retention"}
    assert gates["all"] == held["all"] == (held["max_ce_gap"]["passed"] and held["min_context_retention"]["passed"])
    assert held["max_ce_gap"]["threshold"] == load_params_of(reproduced)["gates"]["max_ce_gap"]
    assert held["max_ce_gap"]["value"] == m["ce_gap"]
    assert _status(reproduced) == {}
    lock = (reproduced / "dvc.lock").read_text()
    assert all(f"{s}:" in lock for s in STAGES)


def test_dvc_metrics_and_plots_show(reproduced):
    metrics = json.loads(run(["dvc", "metrics", "show", "--json"], cwd=reproduced).stdout)
    text = json.dumps(metrics)
    for path in ("metrics/eval.json", "metrics/blocks/b00.json", "metrics/blocks/b01.json"):
        assert path in text, path
    plots = json.loads(run(["dvc", "plots", "show", "--json"], cwd=reproduced).stdout)
    text = json.dumps(plots)
    for path in (
        "plots/loss/b00.csv",
        "plots/loss/b01.csv",
        "plots/eval/ce.csv",
        "plots/eval/sets.csv",
        "plots/eval/shift.csv",
    ):
        assert path in text, path
    assert "errors" not in plots or not plots["errors"], plots.get("errors")


def test_assembled_student_loads_and_generates(reproduced):
    from transformers import AutoModelForCausalLM

    from zgdata.tokens.store import read_tokens

    model = AutoModelForCausalLM.from_pretrained(reproduced / "models" / "student").eval()
    summary = read_json(reproduced / "models" / "student" / "zerograph.json")
    assert model.config.num_hidden_layers == summary["layers"] == 4
    ids, _ = read_tokens(Layout(reproduced), [0])
    prompt = ids[:, :8]
    out = model.generate(prompt, max_new_tokens=4, min_new_tokens=4, do_sample=False)
    assert out.shape == (1, 12) and torch.equal(out[:, :8], prompt)


def test_gates_come_from_params(reproduced, tmp_path):
    root = copy_project(reproduced, tmp_path / "proj")
    set_params(root, {"gates.max_ce_gap": -1, "gates.min_context_retention": -1.0e9})
    lenient = zg_main("train", "evaluate", cwd=root)  # no --strict: a failed gate is reported, exit 0
    m = read_json(root / "metrics" / "eval.json")
    g = m["gates_passed"]["heldout"]
    assert m["gates_passed"]["all"] is False and g["max_ce_gap"]["passed"] is False
    assert g["max_ce_gap"]["threshold"] == -1 and g["min_context_retention"]["passed"] is True
    assert "gates.max_ce_gap" in lenient.stderr

    strict = zg_main("train", "evaluate", "--strict", cwd=root, check=False)
    assert strict.returncode != 0 and "Traceback" not in strict.stderr
    assert "gates.max_ce_gap" in strict.stderr and f"{m['ce_gap']:.4g}" in strict.stderr
    assert "gates.min_context_retention" not in strict.stderr


def test_assemble_refuses_stale_and_missing_blocks(reproduced, tmp_path):
    root = copy_project(reproduced, tmp_path / "proj")
    student = tree_sha256(root / "models" / "student")
    set_params(root, {"materialize.storage_dtype": "float32"})  # expected boundary fingerprints change
    res = zg_main("train", "assemble", cwd=root, check=False)
    assert_user_error(res, "block b00", "stale", "dvc repro train@b00")
    assert tree_sha256(root / "models" / "student") == student

    set_params(root, {"materialize.storage_dtype": "bfloat16"})
    shutil.rmtree(root / "models" / "blocks" / "b01")
    res = zg_main("train", "assemble", cwd=root, check=False)
    assert_user_error(res, "b01", "missing", "dvc repro train@b01")
    assert tree_sha256(root / "models" / "student") == student


def test_identity_assembly_reproduces_teacher_logits(tiny_project):
    """Guarantee 3: identity blocks, untrained, assemble into a model with the teacher's logits bit for bit."""
    from transformers import AutoModelForCausalLM

    from zgdata.teacher.prepare import load_teacher
    from zgdata.tokens.store import read_tokens
    from zgtrain.block.train import train_block
    from zgtrain.student.assemble import assemble

    params = set_params(tiny_project, {"train.conversion": "identity", "train.steps": 0})
    layout = Layout(tiny_project)
    for key in ("b00", "b01"):
        assert train_block(project_of(params), key, layout=layout).status == "done"
    assemble(project_of(params), layout=layout)
    student = AutoModelForCausalLM.from_pretrained(
        tiny_project / "models" / "student", dtype=torch.float32, attn_implementation="sdpa"
    ).eval()
    teacher, _ = load_teacher(layout, with_tokenizer=False)
    splits = lance.dataset(str(layout.tokens)).to_table(columns=["split"]).column("split").to_pylist()
    heldout = [i for i, s in enumerate(splits) if s == "heldout"]
    ids, _ = read_tokens(layout, heldout[:4])
    with torch.no_grad():
        a, b = student(input_ids=ids).logits, teacher(input_ids=ids).logits
    assert a.shape == b.shape and torch.equal(a, b)


def test_init_refuses_an_existing_project(reproduced, tmp_path):
    before = (reproduced / "params.yaml").read_text()
    res = zg_main("init", reproduced, "--profile", "tiny", cwd=tmp_path, check=False)
    assert_user_error(res, str(reproduced), "already holds")
    assert (reproduced / "params.yaml").read_text() == before
    for name in ("params.yaml", "dvc.yaml"):
        d = tmp_path / f"only-{name}"
        d.mkdir()
        (d / name).write_text("# mine\n")
        res = zg_main("init", d, "--profile", "tiny", cwd=tmp_path, check=False)
        assert_user_error(res, "already holds")
        assert (d / name).read_text() == "# mine\n" and sorted(p.name for p in d.iterdir()) == [name]


# --- selective reruns (edit the shared project; keep these last) -----------------------------------------


def test_editing_one_block_reruns_that_block_only(reproduced):
    """Guarantee 4."""
    b00 = read_json(reproduced / "metrics" / "blocks" / "b00.json")
    b01 = read_json(reproduced / "metrics" / "blocks" / "b01.json")
    lr = 2 * load_params_of(reproduced)["train"]["lr"]  # differs from the inherited train.lr
    set_params(reproduced, {"blocks.b01.lr": lr})
    # dvc status reports the stage whose own deps changed; downstream stages change once it reruns
    assert _status(reproduced) == {"train@b01": [{"changed deps": {"params.yaml": {"blocks.b01": "modified"}}}]}
    assert _repro(reproduced) == ["train@b01", "assemble", "evaluate"]
    assert _status(reproduced) == {}
    assert read_json(reproduced / "metrics" / "blocks" / "b00.json") == b00
    new = read_json(reproduced / "metrics" / "blocks" / "b01.json")
    assert new["state_sha256"] != b01["state_sha256"]
    assert read_json(reproduced / "models" / "blocks" / "b01" / "meta.json")["config"]["lr"] == lr


def test_editing_what_changes_no_trained_bit_reruns_nothing(reproduced):
    """A checkpoint's period changes no trained bit (resume is bitwise, guarantee 3), so no block reruns for it: the
    train stages list train's keys one by one, all but ``TrainConfig.UNRECORDED``. Any other train key reruns
    every block that inherits it."""
    params = load_params_of(reproduced)
    every = params["train"]["checkpoint_every"]
    set_params(reproduced, {"train.checkpoint_every": every + 1, "repair.checkpoint_every": every + 1})
    assert _status(reproduced) == {}
    set_params(reproduced, {"train.weight_decay": params["train"]["weight_decay"] + 0.01})
    assert _status(reproduced) == {
        f"train@{b}": [{"changed deps": {"params.yaml": {"train.weight_decay": "modified"}}}] for b in ("b00", "b01")
    }
    set_params(reproduced, {"train.weight_decay": params["train"]["weight_decay"], "train.checkpoint_every": every})
    set_params(reproduced, {"repair.checkpoint_every": params["repair"]["checkpoint_every"]})
    assert _status(reproduced) == {}


def test_editing_eval_reruns_evaluate_only(reproduced):
    set_params(reproduced, {"eval.window": 16})
    assert set(_status(reproduced)) == {"evaluate"}
    assert _repro(reproduced) == ["evaluate"]
    assert _status(reproduced) == {}
    assert read_json(reproduced / "metrics" / "eval.json")["context_window"] == 16


def test_objective_study_arms_as_dvc_experiments(reproduced, tmp_path):
    """`dvc exp run -S ...`, as the objective study runs its arms: the online-targets arm reruns the blocks and
    reproduces the cached ones bit for bit, and `dvc exp show` lists it with its metrics (what another objective
    does to a block's bits is tested in block/test_train.py; online == cached per family in test_families.py)."""
    root = copy_project(reproduced, tmp_path / "proj")
    base = {k: read_json(root / "metrics" / "blocks" / f"{k}.json")["state_sha256"] for k in ("b00", "b01")}
    res = run(["dvc", "exp", "run", "-n", "online", "-S", "train.targets=online"], cwd=root)
    # online targets add the teacher and the token set to the train stage's deps, which `-S` cannot regenerate:
    # each block's command says so and runs the graph it has (zgtrain/pipeline/current.py)
    said = res.stdout + res.stderr
    assert said.count("warning: dvc.yaml is out of date with params.yaml (stage train changed)") == 2, said
    online = {k: read_json(root / "metrics" / "blocks" / f"{k}.json") for k in ("b00", "b01")}
    assert {k: v["state_sha256"] for k, v in online.items()} == base
    assert all(v["targets"] == "online" for v in online.values())
    shown = json.loads(run(["dvc", "exp", "show", "--json"], cwd=root).stdout)
    names = {e.get("name") for rev in shown for e in (rev.get("experiments") or []) for e in (e.get("revs") or [e])}
    assert "online" in names, names
    assert "student_ce" in json.dumps(shown)


def test_stages_list_every_param_their_outputs_depend_on():
    """materialize lists each materialize key that is boundary lineage (an edit of compute_dtype must rerun it), and
    each variant stage lists what a block's train stage lists (seed and every recorded train key), with its own
    variants.NAME for blocks.KEY: a key left out lets `dvc repro` keep outputs made under the old value."""
    from dataclasses import fields

    from zgdata.config import MaterializeConfig
    from zgdata.lineage import COMPARED_KEYS
    from zgtrain.pipeline.profiles import profile_params
    from zgtrain.pipeline.stages import dvc_yaml
    from zgtrain.project.config import ProjectConfig

    stages = dvc_yaml(ProjectConfig.from_params(profile_params("tiny-search")), code_deps=False)["stages"]
    owned = {f.name for f in fields(MaterializeConfig)}
    lineage = {f"materialize.{k}" for k in COMPARED_KEYS if k in owned}
    assert {"materialize.compute_dtype", "materialize.storage_dtype"} <= lineage <= set(stages["materialize"]["params"])
    train, variant = stages["train"]["do"]["params"], stages["variant"]["do"]["params"]
    assert "seed" in train and "train.lr" in train and "train.checkpoint_every" not in train
    assert set(train) - {"blocks.${key}"} == set(variant) - {"variants.${item.variant}"}
