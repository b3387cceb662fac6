"""Tiny ZeroGraph projects: the one reproduced pipeline (``reproduce``, tests/conftest.py's ``reproduced_base``),
copies, their params.yaml, and what their files hold (``read_json``, ``tree_sha256``, ``loss_curve``)."""

from __future__ import annotations

import csv
import hashlib
import json
import os
import re
import shutil
from pathlib import Path

import yaml

from tests.helpers.runners import run, zg
from zgdata.yamlio import safe_load

__all__ = [
    "PIPELINE_STAGES",
    "reproduce",
    "read_json",
    "tree_sha256",
    "copy_project",
    "teacher_linked_project",
    "edit_params",
    "set_params",
    "load_params_of",
    "project_of",
    "loss_curve",
    "b00_converted",
    "b00_weights",
]

PIPELINE_STAGES = ["teacher", "tokens", "materialize", "verify", "train@b00", "train@b01", "assemble", "evaluate"]


def reproduce(base: Path) -> Path:
    """``base``/proj: a tiny project after `zg init`, a git commit, `dvc repro` of every stage and a second commit.

    Where strace is installed the `dvc repro` runs under it, one log per process in ``base``/trace
    (tests/helpers/stage_trace.py): tests/test_stage_deps.py reads what each stage opened from it, instead of running
    every stage again."""
    from tests.helpers.stage_trace import repro

    root = base / "proj"
    zg("init", root, "--profile", "tiny", cwd=base)
    run(["git", "add", "-A"], cwd=root)
    run(["git", "commit", "-qm", "zg init"], cwd=root)
    res = repro(["dvc", "repro"], root, base / "trace")
    ran = re.findall(r"Running stage '([^']+)'", res.stdout + res.stderr)
    assert ran == PIPELINE_STAGES, ran
    run(["git", "add", "-A"], cwd=root)
    run(["git", "commit", "-qm", "dvc repro"], cwd=root)
    return root


def read_json(path: Path) -> dict:
    return json.loads(Path(path).read_text())


def tree_sha256(path: Path) -> str:
    """Hash of every file's relative name and content under ``path`` (unchanged-ness checks).

    ``.zg/`` (lock files and caches: runtime state, gitignored, never an output) is left out."""
    h = hashlib.sha256()
    for rel in _files(str(path)):
        with open(os.path.join(path, rel), "rb") as f:
            h.update(rel.encode() + b"\0" + f.read() + b"\0")
    return h.hexdigest()


def _files(root: str) -> list[str]:
    """The relative names of the regular files under ``root`` (links followed, as ``Path.is_file`` does; links to
    folders not entered, as ``Path.rglob`` does not), ``.zg`` folders left out, in ``sorted(Path)`` order: os.walk,
    1.3-2.3x faster than pathlib's rglob over trees of this suite's size (the unchanged-ness checks run twice per
    case)."""
    out = []
    for top, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if d != ".zg" and not os.path.islink(os.path.join(top, d))]
        rel = os.path.relpath(top, root)
        out.extend(
            n if rel == "." else os.path.join(rel, n)
            for n in files
            if n != ".zg" and os.path.isfile(os.path.join(top, n))
        )
    return sorted(out, key=lambda r: Path(r).parts)


def copy_project(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst, symlinks=True)
    return dst


def teacher_linked_project(tiny_built: Path, root: Path):
    """A project root that shares the session's tiny teacher (read-only) and has its own data/: its Layout."""
    from zgdata.layout import Layout

    root.mkdir(parents=True, exist_ok=True)
    (root / "models").symlink_to(tiny_built / "models", target_is_directory=True)
    return Layout(root)


def _dump(params: dict) -> str:
    """params.yaml text (libyaml's emitter where PyYAML has it: the same YAML, faster)."""
    return yaml.dump(params, Dumper=getattr(yaml, "CSafeDumper", yaml.SafeDumper), sort_keys=False)


def edit_params(root: Path, **sections) -> dict:
    """Merge ``sections`` ({"teacher": {"source": ...}}) into ROOT/params.yaml and write it back."""
    path = Path(root) / "params.yaml"
    params = safe_load(path.read_text())
    for name, values in sections.items():
        params[name] = {**(params.get(name) or {}), **values}
    path.write_text(_dump(params))
    return params


def set_keys(params: dict, updates: dict) -> dict:
    """Set dotted keys (``{"train.steps": 30, "blocks.b01.lr": 1e-3}``) in the params dict; returns it."""
    for dotted, value in updates.items():
        *parents, leaf = dotted.split(".")
        node = params
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value
    return params


def set_params(root: Path, updates: dict) -> dict:
    """Set dotted keys (``set_keys``) in ROOT/params.yaml; returns the params."""
    path = Path(root) / "params.yaml"
    params = set_keys(safe_load(path.read_text()), updates)
    path.write_text(_dump(params))
    return params


def load_params_of(root: Path) -> dict:
    return safe_load((Path(root) / "params.yaml").read_text())


def project_of(root_or_params):
    """The typed ProjectConfig of a project root (its params.yaml) or of a params dict."""
    from zgtrain.project.config import ProjectConfig

    if isinstance(root_or_params, dict):
        return ProjectConfig.from_params(root_or_params)
    return ProjectConfig.from_params(load_params_of(root_or_params))


def loss_curve(root: Path, key: str = "b00") -> list[tuple[int, float]]:
    """Rows of plots/loss/KEY.csv as (step, loss); checks the header."""
    with open(Path(root) / "plots" / "loss" / f"{key}.csv", newline="") as f:
        reader = csv.reader(f)
        assert next(reader) == ["step", "loss"]
        return [(int(s), float(v)) for s, v in reader]


def b00_converted(tiny_built: Path, dst: Path, conversion: str, steps: int) -> Path:
    """A copy of the tiny project at ``dst`` whose block b00 says only ``conversion`` (its keys: defaults), trained
    ``steps`` steps, and whose b01 is the identity, untrained."""
    root = copy_project(tiny_built, dst)
    set_params(
        root,
        {
            "train.steps": steps,
            "blocks.b00.conversion": conversion,
            "blocks.b01.conversion": "identity",
            "blocks.b01.steps": 0,
        },
    )
    return root


def b00_weights(root: Path) -> dict:
    """Block b00's trainable tensors as its last checkpoint holds them."""
    from zgdata.layout import Layout
    from zgtrain.block.load import load_block

    block, _ = load_block(Layout(root), "b00")
    return block.weights()
