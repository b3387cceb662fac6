"""Helpers shared by the zgtrain tests (a plain module: no fixtures, nothing mocked)."""

from __future__ import annotations

import csv
import hashlib
import json
import shutil
from pathlib import Path

import yaml

__all__ = ["set_params", "read_json", "tree_sha256", "assert_user_error", "loss_curve", "copy_project",
           "load_params_of"]


def load_params_of(root: Path) -> dict:
    return yaml.safe_load((Path(root) / "params.yaml").read_text())


def set_params(root: Path, updates: dict) -> dict:
    """Set dotted keys (``{"train.steps": 30, "blocks.b01.lr": 1e-3}``) in ROOT/params.yaml; returns the params."""
    path = Path(root) / "params.yaml"
    params = yaml.safe_load(path.read_text())
    for dotted, value in updates.items():
        *parents, leaf = dotted.split(".")
        node = params
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value
    path.write_text(yaml.safe_dump(params, sort_keys=False))
    return params


def read_json(path: Path) -> dict:
    return json.loads(Path(path).read_text())


def tree_sha256(path: Path) -> str:
    """Hash of every file's relative name and content under ``path`` (unchanged-ness checks)."""
    h = hashlib.sha256()
    path = Path(path)
    for p in sorted(x for x in path.rglob("*") if x.is_file()):
        h.update(str(p.relative_to(path)).encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()


def assert_user_error(res, *needles: str) -> str:
    """A failed `zg` run that printed one ``error:`` line (no traceback) containing every needle."""
    assert res.returncode != 0, f"expected a failure:\n{res.stdout}\n{res.stderr}"
    assert "Traceback" not in res.stderr, res.stderr
    lines = [line for line in res.stderr.splitlines() if line.startswith("error: ")]
    assert len(lines) == 1, f"expected one error line, got:\n{res.stderr}"
    for n in needles:
        assert n in lines[0], f"{n!r} not in {lines[0]!r}"
    return lines[0]


def loss_curve(root: Path, key: str = "b00") -> list[tuple[int, float]]:
    """Rows of plots/loss/KEY.csv as (step, loss); checks the header."""
    with open(Path(root) / "plots" / "loss" / f"{key}.csv", newline="") as f:
        reader = csv.reader(f)
        assert next(reader) == ["step", "loss"]
        return [(int(s), float(v)) for s, v in reader]


def copy_project(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst, symlinks=True)
    return dst
