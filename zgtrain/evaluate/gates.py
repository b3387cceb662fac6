"""The gates, declared once: each one's params key, the figure it reads and its direction.

``gates:`` in params.yaml sets a threshold per gate (zgtrain/project/sections.py ``GatesConfig``). Every judge of a
model (`zg train evaluate` and its repaired model, the search's tries and its repaired mix) calls ``judge_sets``
on the per-set figures of zgtrain/evaluate/set_metrics.py and gets the same verdicts; ``shortfall`` ranks a
failed verdict, and ``failures`` lists what a failed gate measured and needed, for the CLI to print.

A verdict is the figure's point value against the threshold. The figures' bootstrap intervals
(``ce_gap_ci95``, ``context_retention_ci95``) are reported next to it and judged by no gate.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["Gate", "GATES", "gate", "set_verdicts", "judge_sets", "shortfall", "failures", "describe"]


@dataclass(frozen=True, kw_only=True)
class Gate:
    """One gate: ``metric`` (a per-set figure) must be at most, or at least, ``gates.<key>``."""

    key: str
    """The params key under ``gates:`` that holds the threshold, and the gate's name in the verdicts."""
    metric: str
    """The per-set figure the gate reads (zgtrain/evaluate/set_metrics.py ``figures``)."""
    at_most: bool
    """True: the figure passes when <= the threshold; False: when >= it."""

    @property
    def op(self) -> str:
        return "<=" if self.at_most else ">="

    def passes(self, value: float, threshold: float) -> bool:
        """NaN passes no gate."""
        return bool(value <= threshold if self.at_most else value >= threshold)

    def miss(self, value: float, threshold: float) -> float:
        """How far ``value`` misses the threshold, relative to it (inf when the value is not finite)."""
        if not math.isfinite(value):
            return math.inf
        return (value - threshold if self.at_most else threshold - value) / max(abs(threshold), 1e-12)


GATES = (
    Gate(key="max_ce_gap", metric="ce_gap", at_most=True),
    Gate(key="min_context_retention", metric="context_retention", at_most=False),
)


def gate(key: str) -> Gate:
    return next(g for g in GATES if g.key == key)


def set_verdicts(gates, figs: dict) -> dict:
    """One set's verdicts: {gate key: {"passed", "value", "threshold"}, ..., "all": every gate passed}."""
    out = {}
    for g in GATES:
        value, threshold = figs[g.metric], getattr(gates, g.key)
        out[g.key] = {"passed": g.passes(value, threshold), "value": value, "threshold": threshold}
    out["all"] = all(v["passed"] for v in out.values())
    return out


def judge_sets(gates, figs: dict[str, dict]) -> dict:
    """``gates_passed`` of a model from its figures per eval set: {"all": every judged set passed, set: its
    verdicts and "judged" (the set is one ``gates.sets`` names)}."""
    verdicts = {n: {**set_verdicts(gates, f), "judged": n in gates.sets} for n, f in figs.items()}
    return {"all": all(v["all"] for v in verdicts.values() if v["judged"]), **verdicts}


def shortfall(gates_passed: dict) -> tuple[float, str, str]:
    """(how far the worst judged gate misses, relative to its threshold; its set; its gate). 0 when all pass."""
    worst = (0.0, "", "")
    for set_name, v in gates_passed.items():
        if not isinstance(v, dict) or not v.get("judged"):
            continue
        for g in GATES:
            verdict = v[g.key]
            if not verdict["passed"]:
                worst = max(worst, (g.miss(verdict["value"], verdict["threshold"]), set_name, g.key))
    return worst


def failures(gates_passed: dict) -> list[tuple[str, Gate, dict]]:
    """(set, gate, its verdict) of every failed gate on a judged set, in the verdicts' order."""
    return [
        (set_name, g, v[g.key])
        for set_name, v in gates_passed.items()
        if set_name != "all" and v["judged"]
        for g in GATES
        if not v[g.key]["passed"]
    ]


def describe(gates) -> str:
    """The thresholds as one phrase: 'max_ce_gap 0.5, min_context_retention 0.5'."""
    return ", ".join(f"{g.key} {getattr(gates, g.key)}" for g in GATES)
