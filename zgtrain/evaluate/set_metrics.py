"""Per evaluation set: each model's scores, then the set's figures and intervals (the gates judge them:
zgtrain/evaluate/gates.py).

A model is scored on a set once (``score``): the NLL and top-1 token at every position,
in batches, and the NLL of each context target through a fresh window. ``figures`` turns
the teacher's, the untrained student's and the student's scores into the figures of
metrics/eval.json, each with the number of tokens (or targets) behind it. The gap is
computed from exactly the two CE values reported next to it.
"""

from __future__ import annotations

import torch

from zgdata.core.progress import progress
from zgdata.errors import ZgError
from zgtrain.evaluate.bootstrap import per_sequence, ratio_interval
from zgtrain.evaluate.metrics import context_targets, token_nll_top1, window_nll

__all__ = ["targets_for", "score", "figures"]


def targets_for(evalset, cfg) -> torch.Tensor:
    """The set's context-use targets (metrics.context_targets), refused before any model is scored when the set
    has no position at or past ``eval.context_min_pos``."""
    ids = evalset.ids
    fix = f"lower eval.context_min_pos below the set's rows, or give {evalset.name} longer rows (its seq_len)"
    if cfg.context_min_pos >= ids.shape[1]:
        raise ZgError(
            f"eval set {evalset.name} has rows of {ids.shape[1]} tokens, not more than eval.context_min_pos "
            f"{cfg.context_min_pos}: no context-use target",
            key="eval.context_min_pos",
            fix=fix,
        )
    targets = context_targets(
        len(ids),
        ids.shape[1],
        k=evalset.context_targets or cfg.context_targets,
        min_pos=cfg.context_min_pos,
        seed=cfg.seed,
        lengths=evalset.lengths,
    )
    if not len(targets):
        raise ZgError(
            f"eval set {evalset.name} has no row longer than eval.context_min_pos {cfg.context_min_pos} (its rows "
            f"are padded documents shorter than that): no context-use target",
            key="eval.context_min_pos",
            fix=fix,
        )
    return targets


def score(model, label: str, evalset, targets: torch.Tensor, cfg) -> dict:
    """One model on one set: {"nll": (N, T-1) float64, "top1": (N, T-1), "window": (k,) float64}."""
    ids = evalset.ids
    total = int(ids.numel()) + len(targets) * cfg.window
    with progress(f"evaluate {label} on {evalset.name}", total, unit="tok") as advance:
        nll, top1 = token_nll_top1(model, ids, evalset.batch_size or cfg.batch_size, advance=advance)
        win = window_nll(model, ids, targets, window=cfg.window, batch_size=cfg.batch_size, advance=advance)
    return {"nll": nll, "top1": top1, "window": win}


def _ce(nll: torch.Tensor, mask) -> float:
    return float(nll.mean()) if mask is None else float(nll[mask].mean())  # unmasked: every position is scored


def _context_use(sc: dict, targets: torch.Tensor) -> torch.Tensor:
    full = sc["nll"][targets[:, 0], targets[:, 1] - 1]  # target p predicted at p-1
    return sc["window"] - full  # (k,) per target


def figures(evalset, scores: dict, targets: torch.Tensor, cfg) -> dict:
    """The set's figures from the scores of "teacher", "untrained" and "student"."""
    mask = evalset.mask
    ce = {m: _ce(sc["nll"], mask) for m, sc in scores.items()}
    cu_each = {m: _context_use(sc, targets) for m, sc in scores.items()}
    cu = {m: float(v.mean()) for m, v in cu_each.items()}
    t, u, s = "teacher", "untrained", "student"
    ce_gap = ce[s] - ce[t]
    retention = cu[s] / cu[t] if cu[t] else float("nan")
    denom = ce[u] - ce[t]
    agree = scores[s]["top1"] == scores[t]["top1"]
    n, ce_tokens = len(evalset.ids), int(mask.sum()) if mask is not None else int(agree.numel())
    # bootstrap over sequences: both figures are ratios of per-sequence sums
    m = mask.double() if mask is not None else torch.ones_like(scores[s]["nll"])
    diff = ((scores[s]["nll"] - scores[t]["nll"]) * m).sum(1).numpy()
    seq = targets[:, 0].numpy()
    gap_ci = ratio_interval(diff, m.sum(1).numpy(), resamples=cfg.bootstrap, seed=cfg.seed)
    ret_ci = ratio_interval(
        per_sequence(cu_each[s].numpy(), seq, n),
        per_sequence(cu_each[t].numpy(), seq, n),
        resamples=cfg.bootstrap,
        seed=cfg.seed,
    )
    return {
        "teacher_ce": ce[t],
        "student_ce": ce[s],
        "untrained_ce": ce[u],
        "ce_gap": ce_gap,
        "ce_gap_ci95": {"lo": gap_ci["lo"], "hi": gap_ci["hi"]},
        "ce_recovered": (ce[u] - ce[s]) / denom if denom else float("nan"),
        "teacher_context_use": cu[t],
        "student_context_use": cu[s],
        "untrained_context_use": cu[u],
        "context_retention": retention,
        "context_retention_ci95": {"lo": ret_ci["lo"], "hi": ret_ci["hi"]},
        "top1_agreement": float(agree[mask].double().mean() if mask is not None else agree.double().mean()),
        "sequences": n,
        "ce_tokens": ce_tokens,
        "context_targets": int(len(targets)),
        "bootstrap_resamples": int(cfg.bootstrap),
    }
