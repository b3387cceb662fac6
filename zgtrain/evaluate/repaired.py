"""Evaluate's view of the optional repair stage: score models/repaired beside the student, gate the final model.

Kept out of zgtrain/evaluate/run.py (two small hooks there) so evaluate's own changes and repair's stay apart.
With ``repair.steps: 0`` nothing here runs and metrics/eval.json is what it always was.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable

from zgdata.errors import ZgError
from zgdata.layout import Layout
from zgtrain.evaluate.gates import judge_sets
from zgtrain.student.load import student_sha256

__all__ = ["repaired_loader", "add_repaired", "gap_closed"]


def repaired_loader(layout: Layout) -> Callable:
    """A loader of models/repaired for evaluate's model table, after checking it was repaired from this student."""
    from zgtrain.student.load import load_student

    folder = layout.repair.model
    if not (folder / "config.json").exists():
        raise ZgError(
            f"{folder} not found (repair.steps > 0)",
            fix="run `zg pipeline` if dvc.yaml has no repair stage yet, then `dvc repro repair` (or `zg train repair`)",
        )
    try:
        started = json.loads((folder / "zerograph.json").read_text())["repair"]["student_sha256"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ZgError(
            f"{folder / 'zerograph.json'} does not record the student it was repaired from ({e})",
            fix="rerun `dvc repro -f repair`",
        ) from e
    if started != student_sha256(layout.student):
        raise ZgError(
            f"{folder} was repaired from another student than {layout.student} (student_sha256 {started[:12]})",
            fix="rerun `dvc repro repair` after assemble",
        )
    return lambda: load_student(folder)


def gap_closed(before: float, after: float) -> float:
    """The share of the CE gap ``before`` that repair closed (NaN when there was no finite gap to close)."""
    return (before - after) / before if before and math.isfinite(before) else float("nan")


def add_repaired(result: dict, scores: dict, figs: dict, gates, *, figures: Callable, sets: list) -> dict:
    """Add ``repaired`` next to the student's figures, per eval set as the student's are (``figures(set, scores)``
    with the repaired model in the student's place); the gates then judge the repaired model (``gates_passed``,
    same shape as the student's), and the student's verdict stays as ``student_gates_passed``.

    ``result["repaired"]`` holds the in-domain figures (ce, ce_gap, ce_recovered, context_use, context_retention,
    ce_gap_closed: the share of the student's CE gap that repair closed) and ``sets``: every set's."""
    per_set = {}
    for s in sets:
        sc = scores[s.name]
        f = figures(s, {"teacher": sc["teacher"], "untrained": sc["untrained"], "student": sc["repaired"]})
        per_set[s.name] = {
            "ce": f["student_ce"],
            "ce_gap": f["ce_gap"],
            "ce_gap_ci95": f["ce_gap_ci95"],
            "ce_recovered": f["ce_recovered"],
            "context_use": f["student_context_use"],
            "context_retention": f["context_retention"],
            "context_retention_ci95": f["context_retention_ci95"],
            "top1_agreement": f["top1_agreement"],
            "ce_gap_closed": gap_closed(figs[s.name]["ce_gap"], f["ce_gap"]),
        }
    first = sets[0].name  # the in-domain held-out split
    result["repaired"] = {
        **{k: v for k, v in per_set[first].items() if "ci95" not in k and k != "top1_agreement"},
        "sets": per_set,
    }
    result["student_gates_passed"] = result["gates_passed"]
    result["gates_passed"] = judge_sets(gates, per_set)
    result["gated_model"] = "repaired"
    return result
