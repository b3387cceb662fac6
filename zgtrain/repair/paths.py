"""Where the optional repair stage (zgtrain/repair/train.py) keeps its files, and the hash that ties its output to
the student it started from.

Kept apart from zgdata/layout.py (zgdata knows nothing about students) and small, so the pipeline
generator and evaluate can name the paths without importing torch-heavy training code.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from zgdata.layout import Layout

__all__ = ["RepairPaths", "repair_paths", "search_repair_paths", "student_sha256"]


@dataclass(frozen=True)
class RepairPaths:
    run_dir: Path      # meta.json + ckpt-NNNNNN/ (zgtrain/fit/checkpoint.py format), like a block directory
    model: Path        # the repaired student: a transformers folder like models/student
    metrics: Path      # metrics/repair.json: KL before/after on train and held-out rows, state_sha256
    loss_curve: Path   # plots/loss/repair.csv
    lock: str = "repair"  # .zg/locks/<lock>.lock: one run per folder at a time


def repair_paths(layout: Layout = Layout()) -> RepairPaths:
    root = layout.root
    return RepairPaths(run_dir=root / "models" / "repair", model=root / "models" / "repaired",
                       metrics=root / "metrics" / "repair.json", loss_curve=root / "plots" / "loss" / "repair.csv")


def search_repair_paths(layout: Layout = Layout()) -> RepairPaths:
    """The search repair's (zgtrain/search/repair.py): the searched student of models/search/student, repaired."""
    root = layout.root
    return RepairPaths(run_dir=root / "models" / "search" / "repair", model=root / "models" / "search" / "repaired",
                       metrics=root / "metrics" / "search_repair.json",
                       loss_curve=root / "plots" / "loss" / "search_repair.csv", lock="search-repair")


def student_sha256(folder: Path) -> str:
    """sha256 over every file (relative name + bytes) of a student folder: the run's frozen starting point."""
    h = hashlib.sha256()
    for p in sorted(x for x in Path(folder).rglob("*") if x.is_file()):
        h.update(str(p.relative_to(folder)).encode() + b"\0")
        with open(p, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
        h.update(b"\0")
    return h.hexdigest()
