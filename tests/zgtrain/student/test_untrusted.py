"""Data never runs as code: pickled checkpoint state, a stranger's auto_map and a tampered modeling file
are refused or ignored, and damaged checkpoints are one-line errors (issue: trust nothing that was pulled).

Each attack plants a payload that would create a marker file if it ever ran; the tests assert it never does.
"""

from __future__ import annotations

import json
import pickle
import re
import shutil
from pathlib import Path

import pytest
import torch

from tests.helpers.assertions import assert_user_error
from tests.helpers.projects import copy_project, read_json, set_params, tree_sha256
from tests.helpers.runners import zg_main
from zgdata.layout import Layout
from zgtrain.student.load import MODELING_FILE, load_student

ROOT = Path(__file__).resolve().parents[3]


class _Payload:
    """Unpickling this calls Path.touch(marker): the classic pickle code-execution gadget."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


def test_no_pickle_loads_and_no_unconditional_remote_code_in_the_code():
    """Grep-level guard over zg's own code (zgdata, zgtrain, bench)."""
    patterns = {
        r"weights_only\s*=\s*False": "torch.load(weights_only=False) unpickles",
        r"\bpickle\.loads?\(": "pickle.load runs code",
        r"allow_pickle\s*=\s*True": "numpy pickles",
        r"trust_remote_code\s*=\s*True": "unconditional trust_remote_code",
        r"torch\.load\((?![^)]*weights_only\s*=\s*True)": "torch.load without weights_only=True",
    }
    hits = []
    for folder in ("zgdata", "zgtrain", "bench"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            text = path.read_text()
            for pat, why in patterns.items():
                for m in re.finditer(pat, text):
                    hits.append(f"{path.relative_to(ROOT)}:{text[: m.start()].count(chr(10)) + 1}: {why}")
    assert hits == []


def test_pickled_payloads_in_a_checkpoint_never_run(tiny_project, tmp_path):
    zg_main("train", "block", "b00", "--stop-after", "4", cwd=tiny_project)
    d = tiny_project / "models" / "blocks" / "b00"
    stopped = shutil.copytree(d, tmp_path / "stopped")
    meta = read_json(d / "meta.json")
    ckpt = d / meta["checkpoint"]
    assert sorted(p.name for p in ckpt.iterdir()) == [
        "curve.json",
        "model.safetensors",
        "optimizer.json",
        "optimizer.safetensors",
        "rng.json",
        "rng.safetensors",
    ]
    marker = tmp_path / "pwned"
    for name in ("optimizer.pt", "rng.pt"):  # where zg 0.1 kept pickles: a stranger may still put them there
        (ckpt / name).write_bytes(pickle.dumps(_Payload(marker)))
    res = zg_main("train", "block", "b00", "--json", cwd=tiny_project)
    assert json.loads(res.stdout)["status"] == "done"
    assert not marker.exists()

    # a checkpoint in zg 0.1's pickled format is refused, not unpickled
    shutil.rmtree(d)
    shutil.copytree(stopped, d)
    ckpt = d / meta["checkpoint"]
    for name in ("optimizer", "rng"):
        (ckpt / f"{name}.safetensors").unlink()
        (ckpt / f"{name}.json").unlink()
        (ckpt / f"{name}.pt").write_bytes(pickle.dumps(_Payload(marker)))
    old = {k: v for k, v in meta.items() if k != "checkpoint_format"}
    (d / "meta.json").write_text(json.dumps(old))
    before = tree_sha256(d)
    res = zg_main("train", "block", "b00", cwd=tiny_project, check=False)
    assert_user_error(res, "older format", "--restart")
    assert not marker.exists() and tree_sha256(d) == before


def test_checkpoint_pointing_at_missing_files_is_one_line(tiny_project):
    zg_main("train", "block", "b00", "--stop-after", "2", cwd=tiny_project)
    d = tiny_project / "models" / "blocks" / "b00"
    ckpt = d / read_json(d / "meta.json")["checkpoint"]
    (ckpt / "optimizer.safetensors").unlink()
    before = tree_sha256(d)
    res = zg_main("train", "block", "b00", cwd=tiny_project, check=False)
    assert_user_error(res, "optimizer.safetensors", "missing", "--restart")
    assert tree_sha256(d) == before
    (ckpt / "model.safetensors").write_bytes(b"\x00" * 40)  # not a safetensors file
    res = zg_main("train", "block", "b00", cwd=tiny_project, check=False)
    assert_user_error(res, "model.safetensors", "--restart")


def test_zero_steps_finishes_and_reports(tiny_project):
    set_params(tiny_project, {"train.steps": 0})
    res = zg_main("train", "block", "b00", cwd=tiny_project)
    assert "done at step 0/0" in res.stderr and "train_loss n/a" in res.stderr
    m = read_json(tiny_project / "metrics" / "blocks" / "b00.json")
    assert m["status"] == "done" and m["train_loss"] is None


@pytest.fixture(scope="module")
def wide_student(tiny_built, tmp_path_factory):
    """A tiny project whose blocks have different MLP widths, so its student ships zg's modeling file."""
    root = copy_project(tiny_built, tmp_path_factory.mktemp("wide") / "proj")
    set_params(root, {"train.steps": 2, "blocks.b01.prune_ratio": 0.75})
    for key in ("b00", "b01"):
        zg_main("train", "block", key, cwd=root)
    zg_main("train", "assemble", cwd=root)
    summary = read_json(root / "models" / "student" / "zerograph.json")
    assert summary["remote_code"] is True and len(set(summary["intermediate_sizes"])) == 2
    return root


def test_zg_own_modeling_file_loads(wide_student):
    model = load_student(wide_student / "models" / "student")
    assert [layer.mlp.up_proj.out_features for layer in model.model.layers] == read_json(
        wide_student / "models" / "student" / "zerograph.json"
    )["intermediate_sizes"]
    out = model.generate(torch.zeros(1, 4, dtype=torch.long), max_new_tokens=2, min_new_tokens=2, do_sample=False)
    assert out.shape == (1, 6)


def _evil_module(marker: Path) -> str:
    return f"from pathlib import Path\nPath({str(marker)!r}).touch()\n"


@pytest.mark.parametrize(
    "attack", ["auto_map_to_stranger", "tampered_modeling_file", "extra_python_file", "auto_map_on_uniform_student"]
)
def test_remote_code_attacks_are_refused(wide_student, tmp_path, attack):
    root = copy_project(wide_student, tmp_path / "proj")
    student = root / "models" / "student"
    marker = tmp_path / "pwned"
    cfg = read_json(student / "config.json")
    if attack == "auto_map_to_stranger":
        (student / "evil.py").write_text(_evil_module(marker))
        (student / MODELING_FILE).unlink()
        cfg["auto_map"] = {"AutoConfig": "evil.ZgLlamaConfig", "AutoModelForCausalLM": "evil.ZgLlamaForCausalLM"}
        (student / "config.json").write_text(json.dumps(cfg))
        needle = "evil.py"
    elif attack == "tampered_modeling_file":
        with open(student / MODELING_FILE, "a") as f:
            f.write("\n" + _evil_module(marker))
        needle = MODELING_FILE
    elif attack == "extra_python_file":
        (student / "helper.py").write_text(_evil_module(marker))
        needle = "helper.py"
    else:  # a plain Llama student that a stranger gave an auto_map
        (student / MODELING_FILE).unlink()
        cfg["auto_map"] = {"AutoModelForCausalLM": "modeling_zg_llama.ZgLlamaForCausalLM"}
        (student / "config.json").write_text(json.dumps(cfg))
        needle = "auto_map"
    before = tree_sha256(root / "metrics") if (root / "metrics").exists() else None
    res = zg_main("train", "evaluate", cwd=root, check=False)
    assert_user_error(res, needle, "dvc repro -f assemble")
    assert not marker.exists()
    assert not (root / "metrics" / "eval.json").exists()
    assert (tree_sha256(root / "metrics") if (root / "metrics").exists() else None) == before
    assert Layout(root).student.exists()
