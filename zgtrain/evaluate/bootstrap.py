"""Seeded bootstrap intervals over whole sequences (pure numpy, deterministic).

Tokens of one sequence are not independent draws, so the unit resampled is the sequence:
each replicate draws N sequences with replacement and recomputes the figure from their
sums. Both figures evaluate reports intervals for are ratios of per-sequence sums:

- CE gap = sum over tokens of (student NLL - teacher NLL) / number of tokens;
- context retention = sum of the student's context use / sum of the teacher's (over the
  context targets, grouped by the sequence they lie in).

The replicates come from ``numpy.random.default_rng(seed)`` (PCG64, the same stream on every
platform), so the same inputs and seed give the same interval, bit for bit.
"""

from __future__ import annotations

import numpy as np

__all__ = ["ratio_interval", "per_sequence"]

CHUNK = 256  # replicates drawn at once: bounds memory at CHUNK x N counts


def per_sequence(values: np.ndarray, seq: np.ndarray, n: int) -> np.ndarray:
    """(n,) float64 sum of ``values`` per sequence index ``seq`` (0 where a sequence has none)."""
    return np.bincount(np.asarray(seq, dtype=np.int64), weights=np.asarray(values, dtype=np.float64), minlength=n)


def ratio_interval(num: np.ndarray, den: np.ndarray, *, resamples: int, seed: int, level: float = 0.95) -> dict:
    """Percentile interval of sum(num[idx]) / sum(den[idx]) over ``resamples`` draws of idx (N sequences, with
    replacement). Returns {"lo", "hi", "resamples", "level"}; lo = hi = NaN when no replicate is defined."""
    num, den = np.asarray(num, dtype=np.float64), np.asarray(den, dtype=np.float64)
    n = len(num)
    rng = np.random.default_rng(seed)
    reps = []
    for start in range(0, resamples, CHUNK):
        b = min(CHUNK, resamples - start)
        counts = rng.multinomial(n, np.full(n, 1.0 / n), size=b).astype(np.float64)  # (b, N) draws per sequence
        d = counts @ den
        with np.errstate(divide="ignore", invalid="ignore"):
            reps.append(np.where(d != 0, (counts @ num) / np.where(d != 0, d, 1.0), np.nan))
    r = np.concatenate(reps) if reps else np.empty(0)
    r = r[np.isfinite(r)]
    if len(r) == 0:
        return {"lo": float("nan"), "hi": float("nan"), "resamples": int(resamples), "level": level}
    tail = 100 * (1 - level) / 2
    lo, hi = np.percentile(r, [tail, 100 - tail])
    return {"lo": float(lo), "hi": float(hi), "resamples": int(resamples), "level": level}
