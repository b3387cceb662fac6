"""Every file a DVC stage reads inside the project is a declared dep of that stage.

`dvc repro --pull --allow-missing` fetches exactly a stage's declared deps before running it, and DVC
reruns a stage only when a declared dep changes; a file the command reads without declaring it is
neither pulled nor watched. These tests compare the files each stage's real `cmd` opened (strace) with
what dvc.yaml declares.

The main pipeline's stages are read from the trace of the session's one `dvc repro` of a fresh tiny project
(tests/helpers/projects.py ``reproduce`` runs it under strace; tests/helpers/stage_trace.py attributes each open
to its stage): each stage did its whole work there, in dvc.yaml order. The optional stages (repair, and evaluate
reading its output) run here under strace, one by one in a copy of that project, each with its outputs deleted
just before its command runs.

A path the command opened counts as a read of the project when it is inside the project, existed
before the command opened it (files the command creates itself, such as `*.tmp` and `*.partial`
siblings of its outputs, are its own) and is not under `.git/`, `.dvc/`, `.zg/`, `data/.staging/` or
a `__pycache__` folder. It must then be under a declared dep, under the stage's own outputs, be
params.yaml for a stage with `params:`, or be dvc.yaml, which every stage that DVC starts compares with params.yaml
before it runs (zgtrain/pipeline/current.py: it refuses or goes on, and changes no output). Opening a folder that holds a declared dep (listing it) is
allowed; any file opened inside it is checked on its own.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from tests.helpers.projects import PIPELINE_STAGES
from tests.helpers.runners import run, zg
from tests.helpers.stage_deps import assert_saw_reads, entry_paths, is_under, pipeline_stages, trace_stage, undeclared
from tests.helpers.stage_trace import STRACE, reads, stage_opens

pytestmark = pytest.mark.skipif(
    STRACE is None,
    reason="strace is not installed (apt-get install strace): this test traces the files each stage's command opens",
)


def _group(paths: list[str], outputs: dict[str, str]) -> str:
    """Paths folded into the output holding them: `models/teacher/hf (output of teacher: config.json, ...)`."""
    groups: dict[str, list[str]] = {}
    for p in paths:
        owner = next((o for o in outputs if is_under(p, [o])), p)
        groups.setdefault(owner, []).append(p[len(owner) + 1 :])
    shown = []
    for owner, inside in groups.items():
        inside = [s for s in inside if s]
        if owner in outputs:
            owner += f" (output of {outputs[owner]}" + (": " + ", ".join(inside) if inside else "") + ")"
        shown.append(owner)
    return "; ".join(shown)


def _outputs(stages: dict[str, dict]) -> dict[str, str]:
    """{output path: the stage that writes it}."""
    return {
        o: name
        for name, s in stages.items()
        for o in entry_paths(s.get("outs")) + entry_paths(s.get("metrics")) + entry_paths(s.get("plots"))
    }


def _trace_stages(root: Path, stages: dict[str, dict], names: list[str], tmp_path: Path) -> dict[str, list[str]]:
    """Run each named stage's cmd under strace (its outputs deleted first); {stage: undeclared paths}."""
    outputs = _outputs(stages)
    found = {}
    for name in names:
        stage = stages[name]
        for out in entry_paths(stage.get("outs")) + entry_paths(stage.get("metrics")) + entry_paths(stage.get("plots")):
            p = root / out
            shutil.rmtree(p) if p.is_dir() else p.unlink(missing_ok=True)
        read = trace_stage(root, stage, tmp_path / f"{name}.strace")
        for out in entry_paths(stage.get("outs")) + entry_paths(stage.get("metrics")) + entry_paths(stage.get("plots")):
            assert (root / out).exists(), f"{name} did not write {out}"
        assert_saw_reads(name, stage, read)
        if bad := undeclared(stage, read):
            found[name] = _group(bad, outputs)
        # record the outputs as `dvc repro` does after each stage: downstream stages check their inputs against
        # dvc.lock (zgdata/trust/dvc_lock.py), and these outputs are new bytes (Lance names its files afresh)
        run(["dvc", "commit", "-f", "-q", name], cwd=root)
    return found


def _fail(found: dict[str, str]) -> None:
    if found:
        pytest.fail(
            "stages read project files that are not their declared deps (stage -> undeclared paths):\n"
            + "\n".join(f"  {name} -> {paths}" for name, paths in found.items())
            + "\nadd them to the stage's deps in zgtrain/pipeline/stages.py dvc_yaml() (code: zgtrain/pipeline/code.py) and run `zg pipeline`"
        )


def test_every_stage_reads_only_declared_deps(reproduced_base):
    """Every stage of the session's one `dvc repro` (tests/helpers/projects.py ``reproduce``, traced with strace
    there)."""
    root = reproduced_base / "proj"
    stages = pipeline_stages(root)
    assert list(stages) == PIPELINE_STAGES
    opens = stage_opens(reproduced_base / "trace", root, {name: s["cmd"] for name, s in stages.items()})
    found = {}
    for name, stage in stages.items():
        assert_saw_reads(name, stage, opens[name])
        read = reads(opens[name])
        if bad := undeclared(stage, read):
            found[name] = _group(bad, _outputs(stages))
    _fail(found)
    # the check can fail: without its deps, a block's training reads what it does not declare
    read = reads(opens["train@b00"])
    assert undeclared({**stages["train@b00"], "deps": []}, read), sorted(read)


@pytest.mark.long
def test_repair_stage_and_its_evaluate_read_only_declared_deps(reproduced, tmp_path):
    """With the optional repair stage on (repair.steps > 0): repair, then evaluate reading models/repaired."""
    root = tmp_path / "proj"
    shutil.copytree(reproduced, root, symlinks=True)
    params = yaml.safe_load((root / "params.yaml").read_text())
    params["repair"]["steps"] = 3
    (root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    zg("pipeline", cwd=root)
    stages = pipeline_stages(root)
    assert list(stages) == PIPELINE_STAGES[:-1] + ["repair", "evaluate"]
    _fail(_trace_stages(root, stages, ["repair", "evaluate"], tmp_path))


@pytest.mark.long
def test_a_block_with_online_targets_reads_only_declared_deps(reproduced, tmp_path):
    """``targets: online`` for one block (`zg pipeline` after the edit): its stage recomputes the pair from the
    tokens with the teacher, and every file it opens is declared."""
    root = tmp_path / "proj"
    shutil.copytree(reproduced, root, symlinks=True)
    params = yaml.safe_load((root / "params.yaml").read_text())
    params["blocks"]["b01"].update(targets="online", steps=2)  # a few steps: the reads are the same
    (root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    zg("pipeline", cwd=root)
    stages = pipeline_stages(root)
    _fail(_trace_stages(root, stages, ["train@b01"], tmp_path))
