"""MixJudge.judge (zgtrain/search/judge.py) with the scoring stubbed: which model each figure of a try comes from."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from zgtrain.search.judge import MixJudge


def _scores(ce: float) -> dict:
    """A model's scores on a 2 x 6 set: every next-token NLL is ``ce``, every windowed NLL 1 nat worse (context
    use 1), every top-1 prediction token 0."""
    return {
        "nll": torch.full((2, 5), ce, dtype=torch.float64),
        "top1": torch.zeros(2, 5),
        "window": torch.full((2,), ce + 1.0, dtype=torch.float64),
    }


def test_the_untrained_reference_is_the_mix_at_its_initial_weights():
    """judge scores the trained mix and the same mix at its blocks' initial weights; CE recovered is
    (untrained - student) / (untrained - teacher). Teacher CE 1, trained mix 2, initial mix 3: untrained_ce is
    the initial model's 3 and ce_recovered (3 - 2) / (3 - 1) = 0.5 (scoring the trained mix as its own
    reference would give untrained_ce 2 and recovered 0)."""
    by_model = {"trained mix": _scores(2.0), "initial mix": _scores(3.0)}
    judge = MixJudge.__new__(MixJudge)  # the eval sets, targets and teacher scores set here, not loaded
    judge.cfg = SimpleNamespace(bootstrap=50, seed=0)
    judge.gates = SimpleNamespace(max_ce_gap=2.0, min_context_retention=0.5, sets=["held"])
    judge.sets = [SimpleNamespace(name="held", ids=torch.zeros(2, 6, dtype=torch.long), mask=None)]
    judge.targets = {"held": torch.tensor([[0, 3], [1, 4]])}
    judge.teacher = {"held": _scores(1.0)}
    judge._score = lambda model, label: {"held": by_model[model]}
    got = judge.judge("trained mix", "initial mix", "try 1")["sets"]["held"]
    assert got["teacher_ce"] == 1.0 and got["student_ce"] == 2.0
    assert got["untrained_ce"] == 3.0
    assert got["ce_recovered"] == pytest.approx(0.5, rel=1e-12)
