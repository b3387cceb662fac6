"""eval.json's per-set figures from scores made by hand (zgtrain/evaluate/set_metrics.py ``figures``) and the
bootstrap's percentile interval (zgtrain/evaluate/bootstrap.py): signs, grouping and level, each recomputed here
from its definition, so a flipped sign, intervals resampled over the wrong unit or a 90% interval called 95% fail."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from zgtrain.evaluate.bootstrap import CHUNK, ratio_interval
from zgtrain.evaluate.set_metrics import figures
from zgtrain.evaluate.sets import EvalSet

N, T, K = 12, 9, 20  # sequences, tokens per sequence, context targets


def _replicates(num, den, *, resamples: int, seed: int) -> np.ndarray:
    """The documented scheme: default_rng(seed), CHUNK draws at a time of N sequences with replacement."""
    rng, n, out = np.random.default_rng(seed), len(num), []
    for start in range(0, resamples, CHUNK):
        counts = rng.multinomial(n, np.full(n, 1.0 / n), size=min(CHUNK, resamples - start)).astype(np.float64)
        out.append((counts @ num) / (counts @ den))
    return np.concatenate(out)


@pytest.mark.parametrize("level", [0.95, 0.8])
def test_the_interval_holds_its_level_of_the_replicates(level):
    g = np.random.default_rng(3)
    num, den = g.normal(1.0, 0.5, 40), g.uniform(0.5, 1.5, 40)
    got = ratio_interval(num, den, resamples=2000, seed=7, level=level)
    reps = _replicates(num, den, resamples=2000, seed=7)
    tail = 100 * (1 - level) / 2
    assert (got["lo"], got["hi"]) == tuple(np.percentile(reps, [tail, 100 - tail]))
    inside = float(np.mean((reps >= got["lo"]) & (reps <= got["hi"])))
    assert abs(inside - level) <= 0.002, inside
    assert got["lo"] < num.sum() / den.sum() < got["hi"] and got["level"] == level and got["resamples"] == 2000


def _scores(g: torch.Generator, *, full: float, window: float) -> dict:
    """NLLs around ``full`` at every position, and each context target's window NLL around ``window``."""
    nll = full + 0.3 * torch.rand(N, T - 1, generator=g, dtype=torch.float64)
    return {
        "nll": nll,
        "top1": torch.randint(0, 3, (N, T - 1), generator=g),
        "window": window + 0.3 * torch.rand(K, generator=g, dtype=torch.float64),
    }


def test_figures_from_hand_made_scores():
    """Context use is the window NLL minus the full-context NLL of the same target (positive: the model uses its
    context), retention the student's over the teacher's, its interval resampled over sequences, not targets."""
    g = torch.Generator().manual_seed(0)
    scores = {
        "teacher": _scores(g, full=2.0, window=3.0),
        "untrained": _scores(g, full=4.0, window=4.2),
        "student": _scores(g, full=2.5, window=3.1),
    }
    # targets (sequence, position), several per sequence, so grouping by sequence and by position differ
    targets = torch.stack([torch.randint(0, N, (K,), generator=g), torch.randint(2, T, (K,), generator=g)], 1)
    evalset = SimpleNamespace(ids=torch.zeros(N, T, dtype=torch.long), mask=None)
    cfg = SimpleNamespace(bootstrap=500, seed=11)
    f = figures(evalset, scores, targets, cfg)

    use = {}
    for m, sc in scores.items():
        per_target = [float(sc["window"][i] - sc["nll"][s, p - 1]) for i, (s, p) in enumerate(targets.tolist())]
        use[m] = per_target
        assert f[f"{m}_context_use"] == pytest.approx(np.mean(per_target), rel=1e-12, abs=0)
    assert f["teacher_context_use"] > 0.5 and f["student_context_use"] > 0.2
    assert f["context_retention"] == f["student_context_use"] / f["teacher_context_use"]

    by_seq = {m: np.zeros(N) for m in use}
    for m, per_target in use.items():
        for (s, _), v in zip(targets.tolist(), per_target):
            by_seq[m][s] += v
    ci = ratio_interval(by_seq["student"], by_seq["teacher"], resamples=500, seed=11)
    assert f["context_retention_ci95"] == pytest.approx({"lo": ci["lo"], "hi": ci["hi"]}, rel=1e-12, abs=0)

    ce = {m: float(sc["nll"].mean()) for m, sc in scores.items()}
    assert (
        f["teacher_ce"] == ce["teacher"] and f["student_ce"] == ce["student"] and f["untrained_ce"] == ce["untrained"]
    )
    assert f["ce_gap"] == ce["student"] - ce["teacher"] > 0
    assert f["ce_recovered"] == (ce["untrained"] - ce["student"]) / (ce["untrained"] - ce["teacher"])
    diff = (scores["student"]["nll"] - scores["teacher"]["nll"]).sum(1).numpy()
    gap = ratio_interval(diff, np.full(N, T - 1.0), resamples=500, seed=11)
    assert f["ce_gap_ci95"] == {"lo": gap["lo"], "hi": gap["hi"]} and gap["lo"] < f["ce_gap"] < gap["hi"]
    agree = (scores["student"]["top1"] == scores["teacher"]["top1"]).double().mean()
    assert f["top1_agreement"] == float(agree) and f["ce_tokens"] == N * (T - 1) and f["context_targets"] == K


def test_padded_targets_count_in_no_figure_of_a_pad_packed_set():
    """A pad-packed set (``lengths``): its mask keeps the targets before each row's length, and only those are
    scored. The student disagrees with the teacher, with huge NLLs, on padded targets only: its top-1 agreement
    is 1, ce_tokens counts the real targets and each CE is the mean over them."""
    g = torch.Generator().manual_seed(1)
    scores = {
        "teacher": _scores(g, full=2.0, window=3.0),
        "untrained": _scores(g, full=4.0, window=4.2),
        "student": _scores(g, full=2.5, window=3.1),
    }
    lengths = torch.tensor([T, 2, 5, T, 1, 7, 3, T, 4, 6, 8, 2])  # rows of 1..T real tokens (1: no target)
    real = torch.tensor([[p + 1 < n for p in range(T - 1)] for n in lengths.tolist()])  # target p + 1 is real
    assert 0 < int(real.sum()) < N * (T - 1)
    scores["student"]["top1"] = torch.where(real, scores["teacher"]["top1"], scores["teacher"]["top1"] + 1)
    scores["student"]["nll"][~real] = 1e6
    # K context targets (sequence, position), each before its row's length, as metrics.context_targets draws them
    real_pairs = [(s, p) for s, n in enumerate(lengths.tolist()) for p in range(2, n)]
    targets = torch.tensor([real_pairs[i] for i in torch.randperm(len(real_pairs), generator=g)[:K].tolist()])
    evalset = EvalSet(name="padded", ids=torch.zeros(N, T, dtype=torch.long), lengths=lengths, lineage={})
    assert torch.equal(evalset.mask, real)
    f = figures(evalset, scores, targets, SimpleNamespace(bootstrap=200, seed=11))

    assert f["top1_agreement"] == 1.0 and f["ce_tokens"] == int(real.sum()) == int(lengths.sum()) - N
    for m, sc in scores.items():
        kept = [v for v, r in zip(sc["nll"].flatten().tolist(), real.flatten().tolist()) if r]
        assert f[f"{m}_ce"] == pytest.approx(sum(kept) / len(kept), rel=1e-12, abs=0)
    assert f["student_ce"] < 3.0 and f["ce_gap"] == f["student_ce"] - f["teacher_ce"]


def test_replicates_with_a_zero_denominator_are_dropped_not_poisoning_the_interval():
    """num = [1, 1], den = [1, 0]: a replicate draws (c0, c1) copies with c0 + c1 = 2, so its ratio is 2 / c0.
    c0 = 0 (no copy of the only sequence with a denominator) is undefined and must be dropped; the defined replicates
    are 2 / 2 = 1 (c0 = 2) and 2 / 1 = 2 (c0 = 1), both frequent in 200 draws, so the 95% interval is [1, 2],
    finite, not NaN from the undefined ones."""
    got = ratio_interval(np.array([1.0, 1.0]), np.array([1.0, 0.0]), resamples=200, seed=0)
    assert (got["lo"], got["hi"]) == (1.0, 2.0)
    assert got["resamples"] == 200
