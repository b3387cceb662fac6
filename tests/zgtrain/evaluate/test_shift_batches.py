"""Evaluate's boundary shift taken a batch of held-out rows at a time (zgtrain/evaluate/run.py ``_shift``): one block
and one batch on the device, so an 8B teacher's held-out set need not fit on a GPU whole. The figures do not depend
on the batch but for float64 rounding; in one batch they are eval.json's, which
tests/zgtrain/test_families.py::test_evaluate_runs_the_family_student_and_its_boundary_shift checks against the
shift's definition for every family."""

from __future__ import annotations

import json

import pytest

from tests.helpers.projects import project_of
from zgdata.layout import Layout


def test_the_shift_does_not_depend_on_the_rows_a_forward_holds(reproduced):
    from zgtrain.evaluate.run import _shift
    from zgtrain.evaluate.sets import heldout_set

    layout, project = Layout(reproduced), project_of(reproduced)
    _, rows = heldout_set(layout, project.eval.heldout_seqs)
    assert len(rows) >= 3 and len(rows) <= project.eval.batch_size

    def shift(batch):
        return _shift(project.partition, layout, rows, project.materialize, batch)

    whole = shift(len(rows))
    assert whole == json.loads((reproduced / "metrics" / "eval.json").read_text())["shift"]
    for batch in (1, 3):
        got = shift(batch)
        assert set(got) == set(whole) == {b.key for b in project.partition.blocks()}
        for key, figures in whole.items():
            assert got[key] == pytest.approx(figures, rel=1e-12), (batch, key)
