"""Per-boundary summary statistics (zgdata/materialize/stats.py) as unit tests: parts combine to the stats of the
whole in any order, and a token that overflowed is counted as non-finite, never summed."""

from __future__ import annotations

from itertools import permutations

import torch

from zgdata.materialize import stats


def _token(magnitude: float) -> list[float]:
    """One token of 4 channels, each of |x| = magnitude: its RMS is the magnitude itself, exactly."""
    return [magnitude, -magnitude, magnitude, -magnitude]


def test_parts_combine_to_the_stats_of_the_whole_in_every_order():
    """``combine`` is commutative and associative: the parts of a boundary (commit groups, shards, a resume) give
    the stats of the whole batch whatever order they are added in, and its absmax is the largest part's (5, then
    1, is 5), never the last part's."""
    parts = [
        torch.tensor([[_token(5.0), _token(2.0)]], dtype=torch.bfloat16),  # absmax 5
        torch.tensor([[_token(1.0), _token(0.5)]], dtype=torch.bfloat16),  # absmax 1
        torch.tensor([[_token(3.0), _token(0.25)]], dtype=torch.bfloat16),  # absmax 3
    ]
    whole = stats.batch_stats(torch.cat(parts))
    assert whole["absmax"] == 5.0 and whole["tokens"] == 6 and whole["nonfinite"] == 0
    for order in permutations(range(3)):
        got = stats.empty()
        for i in order:
            got = stats.combine(got, stats.batch_stats(parts[i]))
        assert got == whole, order
    first, second = stats.batch_stats(parts[0]), stats.batch_stats(parts[1])
    assert stats.combine(first, second)["absmax"] == stats.combine(second, first)["absmax"] == 5.0


def test_a_token_that_overflowed_is_counted_and_left_out_of_the_mean_and_absmax():
    """A bf16 batch with one inf value: that token's RMS is not finite, so it is counted (``nonfinite``, and
    ``nonfinite_tokens`` in the summary), not summed; the other B*T-1 tokens make the mean, and absmax is the
    largest finite value."""
    x = torch.tensor(
        [[_token(1.0), _token(2.0), _token(3.0)], [_token(4.0), [float("inf"), 0.0, 0.0, 0.0], _token(5.0)]],
        dtype=torch.bfloat16,
    )
    s = stats.batch_stats(x)
    assert s["nonfinite"] == 1 and s["tokens"] == 2 * 3 - 1
    assert s["absmax"] == 5.0
    assert stats.summary(s) == {"mean_rms": (1 + 2 + 3 + 4 + 5) / 5, "absmax": 5.0, "nonfinite_tokens": 1}
    # and the count survives combining with a clean part
    clean = stats.batch_stats(torch.tensor([[_token(6.0)]], dtype=torch.bfloat16))
    assert stats.combine(s, clean)["nonfinite"] == stats.combine(clean, s)["nonfinite"] == 1
