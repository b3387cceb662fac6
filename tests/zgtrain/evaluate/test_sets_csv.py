"""The per-set CSV for `dvc plots` (zgtrain/evaluate/run.py ``_sets_csv``): each interval's columns are (lo, hi)."""

from __future__ import annotations

from zgtrain.evaluate.run import SET_COLUMNS, _sets_csv


def test_interval_columns_are_lo_then_hi():
    """The header names ce_gap_lo, ce_gap_hi, context_retention_lo, context_retention_hi last (no repair), so the
    row must hold each interval's lower bound before its upper one, as six-decimal floats."""
    figs = {name: 1.5 for name in SET_COLUMNS} | {"ce_tokens": 40}
    figs |= {"ce_gap_ci95": {"lo": 0.1, "hi": 0.2}, "context_retention_ci95": {"lo": 0.7, "hi": 0.9}}
    head, row = _sets_csv({"heldout": figs}, {}).splitlines()
    assert head.endswith(",ce_gap_lo,ce_gap_hi,context_retention_lo,context_retention_hi")
    assert row.startswith("heldout,40,1.500000,")
    assert row.endswith(",0.100000,0.200000,0.700000,0.900000")
