"""Per-boundary summary statistics (mean token RMS, absmax), exact and independent of order.

A boundary's ``mean_rms`` is the mean over its tokens of each token's RMS (computed in
float32 from the stored values), and ``absmax`` the largest stored absolute value. The sum
behind the mean is kept exactly, as an integer count of 2**-149 (the smallest float32
step): every float32 is a whole multiple of it. The stats therefore do not depend on how
the rows were grouped (commit groups, shards of a data-parallel run, a resume part way
through) nor on the order in which the parts are added, and the mean is rounded once at
the end. A float64 running sum would depend on all of these, so two correct runs of the
same data could disagree in the last bits.

A part's stats are a JSON-able dict (journals and shard results carry them):
``{"rms_units": int, "tokens": int, "absmax": float, "nonfinite": int}``. Non-finite
token RMS values (a teacher that overflows) are counted, not summed: they would make the
sum meaningless and their max would depend on order.

Under a quantized codec (zgdata/store/quant.py) a part also carries the reconstruction error:
``qerr``/``qsig``, per channel, the sums of (x - x')^2 and x^2 over its tokens. Each batch's float64 sums
(the same rows per batch however the run is split) are kept as whole multiples of 2**-60, so combining parts
is exact integer addition, in any order; ``summary`` reports the relative RMS error and the worst channel's.
"""

from __future__ import annotations

import contextlib
import os
import threading
import warnings

import numpy as np
import torch

__all__ = ["empty", "batch_stats", "error_stats", "combine", "summary"]

_ERR_EXP = 60  # error sums are kept in units of 2**-60

_UNIT_EXP = 149  # float32 values are whole multiples of 2**-149


def empty() -> dict:
    return {"rms_units": 0, "tokens": 0, "absmax": 0.0, "nonfinite": 0}


def _units(v: np.ndarray) -> int:
    """Exact sum of non-negative finite float32 values, in units of 2**-149."""
    bits = v.view(np.uint32).astype(np.int64)
    exp = (bits >> 23) & 0xFF
    mant = np.where(exp > 0, (bits & 0x7FFFFF) | 0x800000, bits & 0x7FFFFF)
    shift = np.maximum(exp, 1) - 1  # value = mant * 2**(max(exp, 1) - 150) = mant * 2**shift units
    if not len(v):
        return 0
    if len(v) < 2**28:  # each exponent's mantissa sum < 2**24 * 2**28 = 2**52: exact in bincount's float64
        sums = np.bincount(shift, weights=mant)  # one pass, no mask per exponent (its Python holds the GIL)
        return sum(int(sums[s]) << int(s) for s in np.flatnonzero(sums))
    total = 0
    for s in np.unique(shift):  # at most 254 exponents; each group's mantissa sum fits int64 (< 2**24 each)
        total += int(mant[shift == s].sum()) << int(s)
    return total


_SCRATCH = threading.local()

# Tokens are squared and reduced in float32 chunks that stay in a core's L2 cache: a whole row of one of SmolLM2's
# batches (512 x 576, 1.2 MB in float32), or CHUNK_BYTES of tokens where a row is larger than ROW_BYTES. A row of
# an 8B teacher (2,048 x 4,096) was a 32 MB float32 copy, written, squared and read again from memory: the encoding
# pool with raw rows of that shape ran at 1.36 GB/s on one thread, and at 1.82-1.86 in chunks of 1 MiB; at SmolLM2's
# rows, smaller chunks only cost more calls, each holding the GIL for some microseconds (bench/encode_pool.py
# --hidden, docs/results/write-path.md). Each token's RMS is reduced over its own channels only, so the chunking
# does not change a bit.
ROW_BYTES = 3 << 19
CHUNK_BYTES = 1 << 20


def _chunk_tokens(seq_len: int, width: int) -> int:
    """Tokens a chunk holds: a row's if it fits ``ROW_BYTES``, else ``CHUNK_BYTES``' worth; at least two. torch
    reduces a tensor of two or more outputs over several threads by splitting the outputs, each summed by one
    thread, but a single output by splitting its own sum, in another order: a chunk of one token would give the
    calling thread (``writer_threads`` 0, torch's thread count) other bits than an encoding thread (one OpenMP
    thread) once the token's channels pass torch's grain of 32,768."""
    if 4 * seq_len * width <= ROW_BYTES:
        return max(2, seq_len)
    return max(2, CHUNK_BYTES // (4 * width))


def _chunk_buffer(tokens: int, width: int) -> torch.Tensor:
    """This thread's float32 buffer of ``tokens`` + 1 tokens of ``width`` channels, reused for every chunk of
    every batch of that shape.

    A fresh float32 copy per row (1.2 MB for SmolLM2's 512 x 576, 32 MB for an 8B teacher's 2048 x 4096) was a
    fresh allocation each time, which glibc gives back to the system and takes again, so its pages faulted in on
    every row: this VM writes fresh memory at 0.2-0.8 GB/s (bench/encode_pool.py, docs/results/write-path.md,
    fifth pass). The buffer lives as long as its thread: one per encoding thread, and one in the thread that
    captures when it takes stats itself (``writer_threads`` 0)."""
    buf = getattr(_SCRATCH, "chunk", None)
    if buf is None or buf.shape != (tokens + 1, width):
        buf = _SCRATCH.chunk = torch.empty(tokens + 1, width, dtype=torch.float32)
    return buf


def chunk_sizes(tokens: int, n: int) -> list[int]:
    """How ``token_rms`` splits ``tokens`` into chunks of ``n``: a last chunk that would hold one token joins the
    chunk before, so no chunk holds one unless ``tokens`` is 1."""
    sizes, left = [], tokens
    while left:
        m = left if left <= n + 1 else n
        sizes.append(m)
        left -= m
    return sizes


def _rms_chunks(
    flat: torch.Tensor, buf: torch.Tensor, out: torch.Tensor, sizes: list[int], peaks: torch.Tensor
) -> torch.Tensor:
    """Each token's RMS of the (N, C) ``flat`` into ``out``, in chunks of ``sizes`` tokens through the float32
    ``buf``: copied, squared in place, each chunk's largest square into ``peaks`` and the mean over the channels,
    then the square root. TorchScript-compatible: ``_kernel`` runs it as one call that holds no GIL (or as this
    Python function, the same ops)."""
    i = 0
    for k, m in enumerate(sizes):
        b = buf[:m].copy_(flat[i : i + m])
        b.mul_(b)
        torch.amax(b, out=peaks[k])
        torch.mean(b, -1, out=out[i : i + m])
        i += m
    return out.sqrt_()


_KERNEL: list = []  # [(the chunk loop as it runs here, the context it runs in)], set on first use
_KERNEL_LOCK = threading.Lock()


def _new_lock() -> None:  # a child forked while another thread compiled must not inherit a held lock
    global _KERNEL_LOCK
    _KERNEL_LOCK = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_new_lock)


def _kernel():
    """(``_rms_chunks`` compiled by TorchScript, or the Python function where TorchScript is not at hand; a
    function that returns the context to call it in).

    Eager, each of a chunk's torch calls (copy, square, mean) gives up the GIL and takes it again: with two threads on
    two cores a thread that ends its call waits for the other's, and thousands of 25-60 us calls a GB made
    ``token_rms`` on two threads 1.18-1.26x one thread's rate. The compiled loop is one call that runs the same
    ATen kernels in the same order with the GIL released: the same bits (tests/zgdata/materialize/test_stats.py
    runs both), two threads 1.87-2.01x; the encoding pool of raw rows on two threads 2.42-2.58 GB/s against
    2.07-2.13 (`python bench/encode_pool.py --arms eager,now` at 0a57c8f, before absmax came from the squares).
    It runs with the graph executor's optimizations off (``optimized_execution(False)``, a per-thread setting), so
    no pass fuses or reorders the ops. TorchScript is deprecated in torch 2.13 and needs this file's source; where
    it is gone, disabled (``PYTORCH_JIT=0``) or fails, the Python loop runs, outside any TorchScript context:
    slower on several threads, the same bits. The deprecation warning is silenced for the compile only (once a
    process, some 5 ms; ``catch_warnings`` is process-wide, so another thread's warning in that window is lost
    too)."""
    if not _KERNEL:
        with _KERNEL_LOCK:
            if not _KERNEL:
                try:
                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore", DeprecationWarning)  # a deliberate use, with a fallback
                        fn = torch.jit.script(_rms_chunks)
                    scripted = isinstance(fn, torch.jit.ScriptFunction)  # PYTORCH_JIT=0 returns the function
                    ctx = (lambda: torch.jit.optimized_execution(False)) if scripted else contextlib.nullcontext
                except Exception:  # noqa: BLE001 - no TorchScript here (removed, no source): the same ops eagerly
                    fn, ctx = _rms_chunks, contextlib.nullcontext
                _KERNEL.append((fn, ctx))
    return _KERNEL[0]


def token_rms(x: torch.Tensor) -> tuple[np.ndarray, float]:
    """(each token's RMS over its channels (the last dim) of a (B, T, C) ``x``, in float32; the largest float32
    square of a value of ``x``, NaN where there is none): copied to float32, squared in place, the largest square of
    each chunk, the mean over the channels and the square root (``_rms_chunks``, one GIL-free call where TorchScript
    is at hand); a float32 ``x`` is never changed. The chunks hold two tokens or more (``chunk_sizes``), and a lone
    token is reduced twice, as two: the bits do not depend on the calling thread's torch thread count (the former
    one-row-at-a-time code reduced each token of a seq_len-1 batch alone, so at 32,768 channels or more they
    did)."""
    if x.shape[-1] == 0:  # no channels: each token's mean is NaN, as torch's mean over nothing
        return np.full(int(np.prod(x.shape[:-1])), np.nan, dtype=np.float32), float("nan")
    flat = x.reshape(-1, x.shape[-1])
    if len(flat) == 1:
        rms, peak = token_rms(flat.expand(1, 2, -1))
        return rms[:1], peak
    out = torch.empty(flat.shape[0], dtype=torch.float32)
    n = _chunk_tokens(x.shape[-2], flat.shape[1])
    sizes = chunk_sizes(len(flat), n)
    peaks = torch.empty(len(sizes), dtype=torch.float32)
    buf, (kernel, context) = _chunk_buffer(n, flat.shape[1]), _kernel()
    with context():
        rms = kernel(flat, buf, out, sizes, peaks).numpy()
    return rms, float(peaks.max()) if sizes else float("nan")


# A bf16 or float16 value's square is exact in float32 (8 or 11 significant bits, squared: 16 or 22 of float32's
# 24) wherever it is a normal float32: there, the square root of the largest square is the largest |value|, bit for
# bit (a correctly rounded root of an exact square; checked over every finite bf16 and float16 value). Below
# SQUARE_MIN a square may have lost bits (a bf16 under 2**-63): absmax is then taken from the values. float32
# batches (rare: the storage dtypes are 16-bit) keep torch.aminmax: their squares are rounded (the root of a rounded
# square still gives the value back, but zg does not lean on that).
EXACT_SQUARES = (torch.bfloat16, torch.float16)
SQUARE_MIN = 2.0**-126


def batch_stats(x: torch.Tensor) -> dict:
    """Stats of one (B, T, C) batch in its storage dtype.

    The tokens' RMS in float32 chunks that stay in cache (``token_rms``), and the absmax: the root of the largest
    square of a chunk, exact for bf16 and float16 (``EXACT_SQUARES``; no second pass over the batch), else by
    ``torch.aminmax`` in the storage dtype; so the stats are bit for bit their definition's
    (tests/zgdata/materialize/test_stats.py) and the one-row-at-a-time float32 copies' before the chunks."""
    x = x.cpu()
    rms, peak = token_rms(x)
    finite = np.isfinite(rms)
    if finite.all():  # a non-finite value makes its token's RMS non-finite, so every value here is finite
        if x.dtype in EXACT_SQUARES and peak >= SQUARE_MIN:  # every square finite (their means are), the largest exact
            absmax = float(np.sqrt(np.float32(peak)))
        else:
            lo, hi = torch.aminmax(x) if x.numel() else (0.0, 0.0)
            absmax = max(abs(float(lo)), abs(float(hi)))
    else:  # rare: drop the tokens that overflowed, and any non-finite value from absmax
        rms = rms[finite]
        a = x.float().abs()
        a = a[torch.isfinite(a)]
        absmax = float(a.max()) if a.numel() else 0.0
    return {
        "rms_units": _units(np.ascontiguousarray(rms, dtype=np.float32)),
        "tokens": int(rms.size),
        "absmax": absmax,
        "nonfinite": int(finite.size - rms.size),
    }


def error_stats(bits: np.ndarray, stored: np.ndarray) -> dict:
    """``qerr``/``qsig`` of one (B, T, C) batch: the teacher's bf16 bits and the stored ones."""
    from zgdata.store.quant import error_sums

    e, s = error_sums(bits, stored)
    return {"qerr": [int(v) for v in np.ldexp(e, _ERR_EXP)], "qsig": [int(v) for v in np.ldexp(s, _ERR_EXP)]}


def combine(a: dict, b: dict) -> dict:
    """Stats of two parts together (exact; commutative and associative)."""
    out = _combine(a, b)
    for k in ("qerr", "qsig"):
        if k in a or k in b:
            xa, xb = a.get(k) or [0] * len(b[k]), b.get(k) or [0] * len(a[k])
            out[k] = [int(u) + int(v) for u, v in zip(xa, xb)]
    return out


def _combine(a: dict, b: dict) -> dict:
    return {
        "rms_units": int(a["rms_units"]) + int(b["rms_units"]),
        "tokens": a["tokens"] + b["tokens"],
        "absmax": max(a["absmax"], b["absmax"]),
        "nonfinite": a.get("nonfinite", 0) + b.get("nonfinite", 0),
    }


def summary(s: dict) -> dict:
    """What the boundary's schema metadata records: mean_rms (rounded once) and absmax."""
    from fractions import Fraction

    mean = float(Fraction(int(s["rms_units"]), (1 << _UNIT_EXP) * max(s["tokens"], 1)))
    out = {"mean_rms": mean, "absmax": s["absmax"]}
    if s.get("nonfinite"):
        out["nonfinite_tokens"] = s["nonfinite"]
    if s.get("qsig"):
        out["quant_error"] = quant_error(s["qerr"], s["qsig"])
    return out


def quant_error(qerr: list, qsig: list) -> dict:
    """Relative RMS error of the boundary, and of its worst channel (channels that are all zero skipped)."""
    from fractions import Fraction

    rel = float(Fraction(sum(qerr), max(sum(qsig), 1))) ** 0.5
    ratios = [(Fraction(e, s), c) for c, (e, s) in enumerate(zip(qerr, qsig)) if s]
    worst, ch = max(ratios) if ratios else (Fraction(0), None)
    return {"rel_rms": rel, "worst_channel_rel_rms": float(worst) ** 0.5, "worst_channel": ch}
