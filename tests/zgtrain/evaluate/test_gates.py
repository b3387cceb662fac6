"""The one gates module: every gates: threshold is a declared gate, and one function judges every set."""

from __future__ import annotations

import math
from dataclasses import fields, replace

from zgtrain.evaluate.gates import GATES, failures, judge_sets, shortfall
from zgtrain.project.sections import GatesConfig


def test_every_threshold_of_gates_is_one_declared_gate():
    thresholds = {f.name for f in fields(GatesConfig) if f.name != "sets"}
    assert {g.key for g in GATES} == thresholds
    assert {g.key: (g.metric, g.op) for g in GATES} == {
        "max_ce_gap": ("ce_gap", "<="),
        "min_context_retention": ("context_retention", ">="),
    }


def test_judge_sets_reads_each_gates_figure_in_its_direction_on_the_judged_sets():
    gates = replace(GatesConfig(), max_ce_gap=0.5, min_context_retention=0.5, sets=["heldout"])
    figs = {
        "heldout": {"ce_gap": 0.5, "context_retention": 0.5},  # on the thresholds: both pass
        "other": {"ce_gap": 0.7, "context_retention": math.nan},
    }  # fails both, but is not judged
    v = judge_sets(gates, figs)
    assert list(v) == ["all", "heldout", "other"] and v["all"] is True
    assert v["heldout"] == {
        "max_ce_gap": {"passed": True, "value": 0.5, "threshold": 0.5},
        "min_context_retention": {"passed": True, "value": 0.5, "threshold": 0.5},
        "all": True,
        "judged": True,
    }
    assert v["other"]["all"] is False and v["other"]["judged"] is False
    assert shortfall(v) == (0.0, "", "") and failures(v) == []

    v = judge_sets(replace(gates, sets=["heldout", "other"]), figs)
    assert v["all"] is False
    assert [(s, g.key) for s, g, _ in failures(v)] == [("other", "max_ce_gap"), ("other", "min_context_retention")]
    assert shortfall(v) == (math.inf, "other", "min_context_retention")  # NaN passes no gate and misses by inf
    figs["other"]["context_retention"] = 0.4  # misses by 20%, the gap by 40%
    assert shortfall(judge_sets(replace(gates, sets=["other"]), figs)) == ((0.7 - 0.5) / 0.5, "other", "max_ce_gap")
