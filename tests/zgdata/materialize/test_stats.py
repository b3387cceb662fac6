"""Per-boundary summary statistics (zgdata/materialize/stats.py) as unit tests: parts combine to the stats of the
whole in any order, a token that overflowed is counted as non-finite, never summed, and the stats are their
definition's bits whatever the chunking."""

from __future__ import annotations

import contextlib
import os
from itertools import permutations

import numpy as np
import pytest
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


def _by_definition(x: torch.Tensor) -> dict:
    """The stats as their definition reads, on the whole batch at once: each token's RMS is the float32 square
    root of the mean of its float32 squares; absmax the largest finite absolute value; non-finite tokens counted."""
    rms = x.float().pow(2).mean(-1).sqrt().reshape(-1).numpy()
    keep = rms[np.isfinite(rms)]
    a = x.float().abs()
    a = a[torch.isfinite(a)]
    return {
        "rms_units": stats._units(np.ascontiguousarray(keep)),
        "tokens": int(keep.size),
        "absmax": float(a.max()) if a.numel() else 0.0,
        "nonfinite": int(rms.size - keep.size),
    }


def _batches():
    g = torch.Generator().manual_seed(11)
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        for shape in [
            (4, 512, 576),
            (2, 33, 4096),
            (3, 5, 7),
            (1, 1, 1),
            (2, 9, 100_000),
            (0, 4, 8),
            (2, 0, 8),
            (2, 3, 0),
        ]:
            for scale in (1e-30, 1e-3, 1.0, 1e4):
                x = (torch.randn(shape, generator=g) * scale).to(dtype)
                yield f"{dtype} {shape} {scale}", x
                yield f"{dtype} {shape} {scale} negative", -x.abs()
                yield f"{dtype} {shape} {scale} positive", x.abs()
        yield f"{dtype} +0", torch.zeros(2, 3, 4, dtype=dtype)
        yield f"{dtype} -0", -torch.zeros(2, 3, 4, dtype=dtype)
        for bad in (float("inf"), -float("inf"), float("nan")):
            x = torch.randn(2, 4, 8, generator=g).to(dtype)
            x[1, 2, 3] = bad
            x[0, 0, 0] = -6e4 if dtype == torch.float16 else -1e30  # the largest magnitude, negative and finite
            yield f"{dtype} {bad}", x
        yield f"{dtype} squares overflow", (torch.randn(2, 4, 8, generator=g) * 3e4).to(dtype)


@pytest.mark.parametrize("kernel", ["torchscript", "python"])
@pytest.mark.parametrize(
    "row_bytes, chunk_bytes", [(stats.ROW_BYTES, stats.CHUNK_BYTES), (0, 4 * 3 * 7), (0, 1)], ids=str
)
def test_stats_are_their_definitions_bits_in_chunks_of_any_size(monkeypatch, row_bytes, chunk_bytes, kernel):
    """``batch_stats`` squares and reduces the tokens in float32 chunks that stay in cache: on every dtype, width
    (none, too) and sign pattern (both zeros, inf, NaN, squares that overflow float32 while the values do not),
    with the default chunks (whole rows up to ``ROW_BYTES``, then ``CHUNK_BYTES``), with chunks of 84 bytes (3
    tokens at width 7, across rows with a remainder; 2 at the other widths) and of two tokens, the stats equal their
    definition's on the whole batch: through the chunk loop compiled by TorchScript (what runs here: it must
    compile with this torch) and through the same loop as Python (where TorchScript is gone)."""
    if kernel == "torchscript":
        if os.environ.get("PYTORCH_JIT") == "0":
            pytest.skip("PYTORCH_JIT=0 turns TorchScript off: the Python loop is the other case")
        assert isinstance(stats._kernel()[0], torch.jit.ScriptFunction)
    else:
        monkeypatch.setattr(stats, "_KERNEL", [(stats._rms_chunks, contextlib.nullcontext)])
    monkeypatch.setattr(stats, "ROW_BYTES", row_bytes)
    monkeypatch.setattr(stats, "CHUNK_BYTES", chunk_bytes)
    monkeypatch.setattr(stats._SCRATCH, "chunk", None, raising=False)
    for name, x in _batches():
        if row_bytes == 0 and x.numel() > 1 << 16:
            continue  # two tokens a chunk over a large batch is only slow
        assert stats.batch_stats(x) == _by_definition(x), name


def test_no_chunk_holds_a_lone_token():
    """torch reduces a single output over several threads in another order than one thread's, so a chunk of one
    token would make the stats depend on the calling thread's thread count: every split of 2..200 tokens into
    chunks of 2..9 (and the defaults' 9 chunks of 227 and a remainder of 5 for SmolLM2's 2,048 tokens) covers the
    tokens in order, holds at most one token over the chunk size, and never one token alone."""
    for tokens in range(2, 201):
        for n in range(2, 10):
            sizes = stats.chunk_sizes(tokens, n)
            assert sum(sizes) == tokens and all(2 <= m <= n + 1 for m in sizes), (tokens, n, sizes)
    assert stats.chunk_sizes(2048, 227) == [227] * 9 + [5] and stats.chunk_sizes(1, 2) == [1]


@pytest.mark.parametrize("gone", ["script fails", "torch.jit without TorchScript"])
def test_without_torchscript_the_python_loop_runs_and_gives_the_same_stats(monkeypatch, gone):
    """Where ``torch.jit.script`` fails (no source files to compile from), or TorchScript is gone from a later
    torch (no ``script``, no ``optimized_execution``), the chunk loop runs as Python, outside any TorchScript
    context: the same stats, bit for bit, as the compiled loop's."""
    g = torch.Generator().manual_seed(3)
    xs = [(torch.randn(shape, generator=g) * 3).to(torch.bfloat16) for shape in [(4, 64, 96), (1, 1, 50), (2, 7, 5)]]
    compiled = [stats.batch_stats(x) for x in xs]
    if os.environ.get("PYTORCH_JIT") != "0":
        assert isinstance(stats._kernel()[0], torch.jit.ScriptFunction)

    def no_script(fn):
        raise OSError("Can't get source for the function: TorchScript requires source access")

    monkeypatch.setattr(stats, "_KERNEL", [])
    if gone == "script fails":
        monkeypatch.setattr(torch.jit, "script", no_script)
    else:
        monkeypatch.delattr(torch.jit, "script")
        monkeypatch.delattr(torch.jit, "optimized_execution")
    assert [stats.batch_stats(x) for x in xs] == compiled
    assert stats._kernel()[0] is stats._rms_chunks


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=str)
def test_absmax_from_the_largest_square_is_the_largest_value_at_every_magnitude(dtype):
    """For bf16 and float16 the absmax is the root of the largest float32 square (``stats.EXACT_SQUARES``), exact
    where that square is a normal float32; below (a bf16 largest value under 2**-63, whose square may have lost
    bits or be 0) and for float32 it comes from the values. At every power of two from 2**-80 to 2**-60 (across
    ``SQUARE_MIN``'s edge, where squares turn subnormal and then 0) and every seventh up to 2**60, a largest value
    of eight significant bits (1.9921875 x 2**e, its square 16 bits) gives an absmax equal to it, either sign."""
    g = torch.Generator().manual_seed(9)
    base = torch.rand(2, 6, 40, generator=g) * 0.999
    lo, hi = (-24, 14) if dtype == torch.float16 else (-80, 60)
    for e in sorted({*range(max(lo, -80), -59), *range(lo, hi + 1, 7)}):
        for sign in (1.0, -1.0):
            x = (base * 2.0**e).to(dtype)
            x[1, 3, 17] = sign * 1.9921875 * 2.0**e  # the largest magnitude (rounded where float16 is subnormal)
            want = float(x.abs().max())
            assert want > 0 and stats.batch_stats(x)["absmax"] == want, (dtype, e, sign)
