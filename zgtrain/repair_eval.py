"""Evaluate's view of the optional repair stage: score models/repaired beside the student, gate the final model.

Kept out of zgtrain/evaluate.py (two small hooks there) so evaluate's own changes and repair's stay apart.
With ``repair.steps: 0`` nothing here runs and metrics/eval.json is what it always was.
"""

from __future__ import annotations

import json
import math
from typing import Callable

from zgdata.errors import ZgError
from zgdata.layout import Layout
from zgtrain.repair_paths import repair_paths, student_sha256

__all__ = ["repaired_loader", "add_repaired"]


def repaired_loader(layout: Layout) -> Callable:
    """A loader of models/repaired for evaluate's model table, after checking it was repaired from this student."""
    from zgtrain.student import load_student

    folder = repair_paths(layout).model
    if not (folder / "config.json").exists():
        raise ZgError(f"{folder} not found (repair.steps > 0)", fix="run `dvc repro repair` (or `zg train repair`)")
    try:
        started = json.loads((folder / "zerograph.json").read_text())["repair"]["student_sha256"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ZgError(f"{folder / 'zerograph.json'} does not record the student it was repaired from ({e})",
                      fix="rerun `dvc repro -f repair`") from e
    if started != student_sha256(layout.student):
        raise ZgError(f"{folder} was repaired from another student than {layout.student} "
                      f"(student_sha256 {started[:12]})", fix="rerun `dvc repro repair` after assemble")
    return lambda: load_student(folder)


def add_repaired(result: dict, scores: dict, gate_verdicts: Callable, gates) -> dict:
    """Add ``repaired`` (CE, gap, CE recovered, context use, retention) next to the student's figures; the
    gates then judge the repaired model (``gates_passed``), the student's verdict stays as ``student_gates_passed``."""
    t, u, r = scores["teacher"], scores["untrained"], scores["repaired"]
    gap = r["ce"] - t["ce"]
    retention = r["context_use"] / t["context_use"] if t["context_use"] else float("nan")
    denom = u["ce"] - t["ce"]
    result["repaired"] = {"ce": r["ce"], "ce_gap": gap, "ce_recovered": (u["ce"] - r["ce"]) / denom if denom
                          else float("nan"), "context_use": r["context_use"], "context_retention": retention,
                          "ce_gap_closed": (result["ce_gap"] - gap) / result["ce_gap"]
                          if result["ce_gap"] and math.isfinite(result["ce_gap"]) else float("nan")}
    result["student_gates_passed"] = result["gates_passed"]
    result["gates_passed"] = gate_verdicts(gates, gap, retention)
    result["gated_model"] = "repaired"
    return result
